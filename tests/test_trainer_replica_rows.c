/* The rows each data-parallel replica trains on (runtime/trainer.c, fill_buffer): replica r
 * keeps rows [r * batch, (r + 1) * batch) of the global batch, fewer in a short last batch,
 * and none when the short batch ends before its rows begin. Two replicas of 2 rows each on
 * the CPU communicator, 5 examples: the second global batch holds one row, replica 0's. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "api/front.h"
#include "runtime/comm.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

enum { REPLICAS = 2, STEPS = 4 };

typedef struct replica {
    const tg_plan *plan;
    void *comm;
    int rank, ok;
    tg_step_stats stats[STEPS];
    char msg[512];
} replica;

static void *run_replica(void *arg) {
    replica *r = arg;
    tg_err err = {{0}};
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .rank = r->rank, .comm = r->comm,
                            .no_loader_thread = r->rank == 1};
    if (tg_trainer_open(&tr, r->plan, &o, &err)) {
        snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg);
        return NULL;
    }
    int ok = 1;
    for (int s = 0; s < STEPS && ok; s++) ok = tg_trainer_step(&tr, &r->stats[s], &err) == 0;
    if (!ok) snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg);
    r->ok = ok;
    tg_trainer_close(&tr);
    return NULL;
}

TG_TEST(test_trainer_replica_without_rows_of_a_short_batch) {
    const char *dir = tg_test_tmpdir();
    char path[800], text[400];
    /* Five examples of 3, 2, 4, 1 and 2 tokens: 12 in all. */
    snprintf(path, sizeof path, "%s/rows.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n"
                                     "{\"input_ids\": [10, 11, 12, 13], \"label\": 1}\n{\"input_ids\": [14], \"label\": 0}\n"
                                     "{\"input_ids\": [15, 16], \"label\": 1}\n") == 0,
            "rows");
    snprintf(path, sizeof path, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = classify\nbatch = 2\nseq = 8\nsteps = %d\ndata_parallel = %d\n"
             "train_data = rows.jsonl\nlast_batch = pad\n",
             STEPS, REPLICAS);
    REQUIRE(tg_test_write_file(path, text) == 0, "job");
    tg_plan plan;
    tg_err err;
    REQUIRE(tg_front_compile_file(path, NULL, 0, &plan, &err) == 0, "%s", err.msg);
    tg_cpu_comm_group *group = NULL;
    REQUIRE(tg_cpu_comm_group_create(&group, REPLICAS, &err) == 0, "%s", err.msg);
    replica r[REPLICAS];
    pthread_t th[REPLICAS];
    int started = 0;
    for (; started < REPLICAS; started++) {
        r[started] = (replica){.plan = &plan, .comm = group, .rank = started};
        if (!CHECK(pthread_create(&th[started], NULL, run_replica, &r[started]) == 0, "pthread_create")) break;
    }
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    tg_cpu_comm_group_destroy(group);
    if (started == REPLICAS && CHECK(r[0].ok && r[1].ok, "%s %s", r[0].msg, r[1].msg)) {
        /* Steps 1 and 3 take 4 rows, 2 each; steps 2 and 4 one row, replica 0's. Each epoch
         * covers the 12 tokens once. */
        for (int e = 0; e < 2; e++) {
            const tg_step_stats *full0 = &r[0].stats[2 * e], *full1 = &r[1].stats[2 * e];
            const tg_step_stats *short0 = &r[0].stats[2 * e + 1], *short1 = &r[1].stats[2 * e + 1];
            CHECK(full0->tokens > 0 && full1->tokens > 0 && short0->tokens > 0 && short1->tokens == 0,
                  "epoch %d: tokens %lld + %lld, then %lld + %lld", e + 1, (long long)full0->tokens,
                  (long long)full1->tokens, (long long)short0->tokens, (long long)short1->tokens);
            CHECK(full0->tokens + full1->tokens + short0->tokens == 12, "epoch %d: %lld tokens, expected 12", e + 1,
                  (long long)(full0->tokens + full1->tokens + short0->tokens));
            /* Each replica's loss is its own rows' mean: none, 0. */
            CHECK(isfinite(short0->loss) && short0->loss > 0 && short1->loss == 0.0f,
                  "epoch %d: short-batch losses %g and %g", e + 1, short0->loss, short1->loss);
        }
    }
    tg_plan_free(&plan);
}
