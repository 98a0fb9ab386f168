/* ZeRO-1's update deferred beside the next forward (runtime/deferred_update.h) on two GPUs,
 * replicas in threads joined by NCCL: each replica updates its slice's part of each chunk
 * and the chunk is broadcast from its owners before the forward reads it. It trains bit
 * for bit as the same plan with the update and its gathers in the step
 * (TUNEGRAPH_DEFERRED_UPDATE=0): losses, parameters and their bf16 copies, with one step
 * in flight or four, and with the pending update settled on every replica in the middle of
 * the run (tg_trainer_settle, then a read of the parameters) before training on. It also
 * trains as plain replicas (the same parameters and losses), and both replicas end with
 * the same parameters. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

enum { STEPS = 6, REPLICAS = 2 };

/* The demo classification job on REPLICAS replicas of 2 rows, dropout off (as in
 * tests/test_data_parallel.c), ZeRO-1 or not. */
static int compile_job(int zero, int bf16, tg_plan *p) {
    tg_err err;
    tg_job job;
    char steps[32];
    snprintf(steps, sizeof steps, "steps=%d", STEPS);
    const char *sets[] = {steps, "batch=2", "data_parallel=2", zero ? "zero_stage=1" : "zero_stage=0",
                          bf16 ? "precision=bf16" : "precision=fp32"};
    if (!CHECK(tg_job_load("examples/demo-classify.job", sets, 5, &job, &err) == 0, "%s", err.msg)) return 0;
    tg_model_config cfg;
    if (!CHECK(tg_model_config_load(job.model, &cfg, &err) == 0, "%s", err.msg)) return 0;
    cfg.hidden_dropout = cfg.attention_dropout = cfg.embedding_dropout = cfg.classifier_dropout = 0;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s", err.msg);
}

typedef struct replica {
    const tg_plan *plan;
    void *comm;
    int rank, depth, settle_at; /* settle_at > 0: settle and read the parameters after that step */
    int ok, deferred, chunks;
    float loss[STEPS];
    uint8_t *params, *copies; /* the params pool, and the bf16 copies' pool (bf16 plans) */
    char msg[512];
} replica;

static void *run_replica(void *arg) {
    replica *r = arg;
    tg_err err = {{0}};
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CUDA, .threads = 1, .load_data = 1, .rank = r->rank, .comm = r->comm,
                            .max_in_flight = r->depth};
    if (tg_trainer_open(&tr, r->plan, &o, &err)) {
        snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg);
        return NULL;
    }
    const tg_cuda_exec *x = tr.ex.impl; /* the CUDA executor's first member */
    r->deferred = x->defer_on, r->chunks = x->cur->defer.n_chunks;
    const tg_plan *p = r->plan;
    const size_t bytes = p->pool_bytes[TG_POOL_PARAMS], copy_bytes = p->pool_bytes[TG_POOL_PARAMS_BF16];
    int ok = 1;
    for (int s = 0; s < STEPS && ok; s++) {
        tg_step_stats st;
        ok = tg_trainer_step(&tr, &st, &err) == 0;
        if (ok) r->loss[s] = st.loss;
        if (ok && s + 1 == r->settle_at) { /* every replica here, then each reads on its own */
            uint8_t *mid = malloc(bytes);
            ok = mid && tg_trainer_settle(&tr, &err) == 0 && tg_trainer_read(&tr, p->io.params_all, mid, &err) == 0;
            free(mid);
        }
    }
    ok = ok && tg_trainer_settle(&tr, &err) == 0;
    r->params = ok ? malloc(bytes) : NULL;
    ok = ok && r->params && tg_trainer_read(&tr, p->io.params_all, r->params, &err) == 0;
    if (ok && p->io.params_bf16_all >= 0) {
        r->copies = malloc(copy_bytes);
        ok = r->copies && tg_trainer_read(&tr, p->io.params_bf16_all, r->copies, &err) == 0;
    }
    if (!ok) snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg[0] ? err.msg : "out of memory");
    r->ok = ok;
    tg_trainer_close(&tr);
    return NULL;
}

/* One run of the plan on REPLICAS GPUs; `deferred` 0 opens the executors with
 * TUNEGRAPH_DEFERRED_UPDATE=0 (read when they open, set around the threads). */
static int run_replicas(const tg_plan *plan, int deferred, int depth, int settle_at, replica *r) {
    void *comms[REPLICAS] = {NULL};
    tg_err err;
    if (!CHECK(tg_cuda_comms_create(comms, REPLICAS, &err) == 0, "%s", err.msg)) return 0;
    if (!deferred) setenv("TUNEGRAPH_DEFERRED_UPDATE", "0", 1);
    pthread_t th[REPLICAS];
    int started = 0;
    for (; started < REPLICAS; started++) {
        r[started] = (replica){.plan = plan, .comm = comms[started], .rank = started, .depth = depth, .settle_at = settle_at};
        if (!CHECK(pthread_create(&th[started], NULL, run_replica, &r[started]) == 0, "pthread_create")) break;
    }
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    unsetenv("TUNEGRAPH_DEFERRED_UPDATE");
    tg_cuda_comms_destroy(comms, REPLICAS);
    int ok = started == REPLICAS;
    for (int k = 0; k < started; k++) ok &= CHECK(r[k].ok, "%s", r[k].msg);
    return ok;
}

static void replicas_free(replica *r) {
    for (int k = 0; k < REPLICAS; k++) free(r[k].params), free(r[k].copies);
}

/* Run `got` against run `want` of the same plan: the same losses, parameters and copies on
 * every replica. */
static void check_same(const tg_plan *p, const replica *got, const replica *want, const char *what) {
    for (int k = 0; k < REPLICAS; k++) {
        CHECK(!memcmp(got[k].loss, want[k].loss, sizeof got[k].loss), "%s: replica %d's losses differ (step %d: %g vs %g)",
              what, k, STEPS, got[k].loss[STEPS - 1], want[k].loss[STEPS - 1]);
        CHECK(!memcmp(got[k].params, want[k].params, p->pool_bytes[TG_POOL_PARAMS]), "%s: replica %d's parameters differ",
              what, k);
        if (p->io.params_bf16_all >= 0)
            CHECK(!memcmp(got[k].copies, want[k].copies, p->pool_bytes[TG_POOL_PARAMS_BF16]),
                  "%s: replica %d's bf16 copies differ", what, k);
    }
}

static void zero_deferred_matches(int bf16) {
    if (tg_cuda_device_count() < REPLICAS) {
        printf("    not run: %d replicas need %d GPUs, %d here\n", REPLICAS, REPLICAS, tg_cuda_device_count());
        return;
    }
    const char *prec = bf16 ? "bf16" : "fp32";
    /* The runs must pick the same GEMM algorithms to agree bit for bit (the heuristic's pick
     * depends on the shapes only; timed tuning may differ from run to run). */
    const char *tune = getenv("TUNEGRAPH_GEMM_TUNE");
    char *tune_saved = tune ? strdup(tune) : NULL;
    setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
    tg_plan zero, plain;
    replica in_step[REPLICAS] = {{0}}, deferred[REPLICAS] = {{0}}, queued[REPLICAS] = {{0}}, unsliced[REPLICAS] = {{0}};
    if (!compile_job(1, bf16, &zero)) goto restore;
    if (run_replicas(&zero, 0, 1, 0, in_step) && run_replicas(&zero, 1, 1, 0, deferred) &&
        run_replicas(&zero, 1, 4, 3, queued)) {
        char what[96];
        for (int k = 0; k < REPLICAS; k++)
            CHECK(!in_step[k].deferred && deferred[k].deferred && queued[k].deferred && deferred[k].chunks >= 2,
                  "%s replica %d: deferred %d / %d / %d, %d chunks", prec, k, in_step[k].deferred, deferred[k].deferred,
                  queued[k].deferred, deferred[k].chunks);
        snprintf(what, sizeof what, "%s ZeRO-1 deferred, one step in flight", prec);
        check_same(&zero, deferred, in_step, what);
        snprintf(what, sizeof what, "%s ZeRO-1 deferred, 4 in flight, settled after step 3", prec);
        check_same(&zero, queued, in_step, what);
        /* The gathers reached every replica: the same parameters and copies on both. */
        CHECK(!memcmp(deferred[0].params, deferred[1].params, zero.pool_bytes[TG_POOL_PARAMS]) &&
                  (!bf16 || !memcmp(deferred[0].copies, deferred[1].copies, zero.pool_bytes[TG_POOL_PARAMS_BF16])),
              "%s ZeRO-1 deferred: the replicas' parameters differ", prec);
        if (compile_job(0, bf16, &plain)) {
            if (run_replicas(&plain, 1, 1, 0, unsliced)) {
                const size_t n = plain.tensors[plain.io.params_all].bytes; /* ZeRO only pads the pool past it */
                for (int k = 0; k < REPLICAS; k++)
                    CHECK(!memcmp(deferred[k].params, unsliced[k].params, n) &&
                              !memcmp(deferred[k].loss, unsliced[k].loss, sizeof deferred[k].loss),
                          "%s replica %d: ZeRO-1 deferred differs from plain replicas", prec, k);
            }
            tg_plan_free(&plain);
        }
    }
    replicas_free(in_step), replicas_free(deferred), replicas_free(queued), replicas_free(unsliced);
    tg_plan_free(&zero);
restore:
    if (tune_saved) setenv("TUNEGRAPH_GEMM_TUNE", tune_saved, 1);
    else unsetenv("TUNEGRAPH_GEMM_TUNE");
    free(tune_saved);
}

TG_TEST(test_gpu_zero_deferred_update_fp32) { zero_deferred_matches(0); }
TG_TEST(test_gpu_zero_deferred_update_bf16) { zero_deferred_matches(1); }
