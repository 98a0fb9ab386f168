/* The data-parallel watchdog of the CUDA executor's step wait: a replica whose step has not
 * ended within TUNEGRAPH_STEP_TIMEOUT_S gives up with a message naming itself (here replica
 * 1 opens half a second late, so replica 0's first step waits for it past a 0.2 s timeout),
 * and the variable is read strictly. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/executor.h"
#include "tests/harness.h"

typedef struct replica {
    const tg_plan *plan;
    void *comm;
    int rank;
    double delay_s;
    int ok;
    char msg[512];
} replica;

/* One training step on zeroed inputs (valid ids and labels) after `delay_s`. */
static void *run_replica(void *arg) {
    replica *r = arg;
    struct timespec d = {(time_t)r->delay_s, (long)((r->delay_s - (double)(time_t)r->delay_s) * 1e9)};
    nanosleep(&d, NULL);
    tg_executor ex;
    tg_err err = {{0}};
    const tg_executor_options o = {.device = TG_DEVICE_CUDA, .use_graphs = 1, .seed = 7, .rank = r->rank, .comm = r->comm};
    if (tg_executor_open(&ex, r->plan, &o, &err)) {
        snprintf(r->msg, sizeof r->msg, "open: %s", err.msg);
        return NULL;
    }
    void *image = ex.vt->host_alloc(ex.impl, r->plan->pool_bytes[TG_POOL_INPUTS]);
    const void *batches[2] = {image, NULL};
    tg_step_result res;
    r->ok = image && ex.vt->step_start(ex.impl, batches, 1, &err) == 0 && ex.vt->step_wait(ex.impl, &res, &err) == 0;
    if (!r->ok) snprintf(r->msg, sizeof r->msg, "%s", image ? err.msg : "no host image");
    /* The host image is freed after the close, which waits for the step to end whether the
     * wait gave up or not; the close clears ex, so its free function (which, on CUDA, does
     * not read the executor) is kept first. */
    void (*host_free)(void *, void *) = ex.vt->host_free;
    tg_executor_close(&ex);
    if (image) host_free(NULL, image);
    return NULL;
}

TG_TEST(test_gpu_step_timeout_setting) {
    tg_plan p;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p), "compile");
    static const char *bad[] = {"abc", "0", "-1", "", "5s", "2e9", "nan"};
    const tg_executor_options o = {.device = TG_DEVICE_CUDA, .use_graphs = 1, .seed = 1};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        setenv("TUNEGRAPH_STEP_TIMEOUT_S", bad[k], 1);
        tg_executor ex;
        tg_err err = {{0}};
        const int rc = tg_executor_open(&ex, &p, &o, &err);
        if (rc == 0) tg_executor_close(&ex);
        CHECK(rc != 0 && strstr(err.msg, "TUNEGRAPH_STEP_TIMEOUT_S must be a number of seconds above 0") &&
                  strstr(err.msg, bad[k]),
              "'%s': rc %d, '%s'", bad[k], rc, err.msg);
    }
    setenv("TUNEGRAPH_STEP_TIMEOUT_S", "0.5", 1);
    tg_executor ex;
    tg_err err = {{0}};
    CHECK(tg_executor_open(&ex, &p, &o, &err) == 0, "0.5: %s", err.msg);
    tg_executor_close(&ex);
    unsetenv("TUNEGRAPH_STEP_TIMEOUT_S");
    tg_plan_free(&p);
}

TG_TEST(test_gpu_data_parallel_watchdog) {
    if (tg_cuda_device_count() < 2) {
        printf("    2 replicas not run: %d GPU(s)\n", tg_cuda_device_count());
        return;
    }
    tg_plan p;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 2, &p), "compile");
    void *comms[2] = {NULL, NULL};
    tg_err err;
    REQUIRE(tg_cuda_comms_create(comms, 2, &err) == 0, "%s", err.msg);
    setenv("TUNEGRAPH_STEP_TIMEOUT_S", "0.2", 1);
    replica r[2] = {{.plan = &p, .comm = comms[0], .rank = 0, .delay_s = 0},
                    {.plan = &p, .comm = comms[1], .rank = 1, .delay_s = 0.5}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) REQUIRE(pthread_create(&th[k], NULL, run_replica, &r[k]) == 0, "pthread_create");
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    unsetenv("TUNEGRAPH_STEP_TIMEOUT_S");
    tg_cuda_comms_destroy(comms, 2);
    CHECK(!r[0].ok && strstr(r[0].msg, "replica 0 (GPU 0): step 1 has not ended after 0.") &&
              strstr(r[0].msg, " s (TUNEGRAPH_STEP_TIMEOUT_S): another replica stopped"),
          "replica 0: ok %d, '%s'", r[0].ok, r[0].msg);
    CHECK(r[1].ok, "replica 1, late but in time for the step replica 0 left queued: '%s'", r[1].msg);
    tg_plan_free(&p);
}
