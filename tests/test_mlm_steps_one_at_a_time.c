/* mlm trained a step at a time (tg_trainer_next_batch + tg_trainer_run_step, each batch
 * uploaded before its step) as through the step ring (tg_trainer_step): each step's batch
 * carries its own step number in its masking stream (io.mlm_stream), so both ways mask
 * alike and train to the same weights bit for bit, with and without grad_accumulation,
 * across an epoch's short last window. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

enum { MAX_STEPS = 8 };

typedef struct mlm_run {
    float loss[MAX_STEPS];
    uint32_t stream_step[MAX_STEPS]; /* one at a time: the step number each staged batch carries */
    float *params;
    int64_t n;
} mlm_run;

static int compile_mlm(int batch, int accum, int steps, tg_plan *p) {
    char b[32], a[32], s[32];
    snprintf(b, sizeof b, "batch=%d", batch);
    snprintf(a, sizeof a, "grad_accumulation=%d", accum);
    snprintf(s, sizeof s, "steps=%d", steps);
    const char *sets[] = {b, a, s, "seq=24"}; /* short rows: a quick CPU step */
    tg_job job;
    tg_err err;
    if (!CHECK(tg_job_load("examples/demo-mlm.job", sets, 4, &job, &err) == 0, "%s", err.msg)) return 0;
    return CHECK(tg_compile(&job, p, &err) == 0, "%s", err.msg);
}

/* `steps` steps, through the ring or (one_at_a_time) each batch staged, then run. */
static int train(const tg_plan *p, int steps, int one_at_a_time, mlm_run *r) {
    memset(r, 0, sizeof *r);
    tg_trainer tr;
    tg_err err;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1};
    if (!CHECK(tg_trainer_open(&tr, p, &o, &err) == 0, "%s", err.msg)) return 0;
    int ok = 1;
    for (int s = 0; ok && s < steps; s++) {
        tg_step_stats st;
        if (one_at_a_time) {
            tg_trainer_next_batch(&tr);
            const uint32_t *stream = (const uint32_t *)(tr.staging[tr.cur] + p->tensors[p->io.mlm_stream].offset);
            r->stream_step[s] = stream[0];
        }
        ok = CHECK((one_at_a_time ? tg_trainer_run_step(&tr, &st, &err) : tg_trainer_step(&tr, &st, &err)) == 0,
                   "step %d: %s", s + 1, err.msg);
        r->loss[s] = st.loss;
    }
    r->n = tg_tensor_numel(&p->tensors[p->io.params_all]);
    r->params = ok ? malloc(sizeof(float) * (size_t)r->n) : NULL;
    if (r->params && !CHECK(tg_trainer_read_f32(&tr, p->io.params_all, r->params, &err) == 0, "%s", err.msg)) {
        free(r->params);
        r->params = NULL;
    }
    tg_trainer_close(&tr);
    return r->params != NULL;
}

static void one_at_a_time_matches_ring(int batch, int accum, int steps) {
    tg_plan p;
    if (!compile_mlm(batch, accum, steps, &p)) return;
    mlm_run ring = {0}, single = {0};
    if (train(&p, steps, 0, &ring) && train(&p, steps, 1, &single)) {
        for (int s = 0; s < steps; s++) {
            CHECK(single.stream_step[s] == (uint32_t)s, "accum %d: the batch of step %d carries step %u in its stream",
                  accum, s + 1, single.stream_step[s]);
            CHECK(!memcmp(&single.loss[s], &ring.loss[s], sizeof(float)),
                  "accum %d: step %d's loss %.9g one at a time, %.9g through the ring", accum, s + 1, single.loss[s],
                  ring.loss[s]);
        }
        int64_t differ = 0;
        for (int64_t i = 0; i < ring.n; i++) differ += memcmp(&single.params[i], &ring.params[i], sizeof(float)) != 0;
        CHECK(differ == 0, "accum %d: %lld of %lld parameters differ after %d steps", accum, (long long)differ,
              (long long)ring.n, steps);
    }
    free(ring.params), free(single.params);
    tg_plan_free(&p);
}

TG_TEST(test_mlm_steps_one_at_a_time_match_the_ring) { one_at_a_time_matches_ring(16, 1, 3); }

/* 1000 examples in batches of 100 and windows of 3: an epoch's windows take 3, 3, 3 and 1
 * batches, so the fourth step is the short window and the fifth starts the next epoch. */
TG_TEST(test_mlm_steps_one_at_a_time_match_the_ring_in_windows) { one_at_a_time_matches_ring(100, 3, 5); }
