/* Every allocation of a small bf16 run with a frozen layer (kept in bf16, its fp32
 * values on the host) failing in turn (base/alloc.h's hook): open with
 * train and eval sets, a step, an eval and a checkpoint; then a restore into a fresh
 * trainer; then a save's first. Each failure must stop the call it hits with -1 and a
 * message saying it ran out of memory, with nothing leaked or crashed; once allocation k is
 * past the run's last, the run completes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "base/alloc.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* The run, stopping at the first failure: 0 when it completed, else -1 and the stage; the
 * checkpoint it took, in *ck. */
static int whole_run(const tg_plan *plan, tg_checkpoint *ck, const char **stage, tg_err *err) {
    tg_trainer a;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    tg_checkpoint_init(ck);
    *stage = "open";
    if (tg_trainer_open(&a, plan, &o, err)) return -1;
    int rc = 0;
    tg_step_stats s;
    tg_eval_stats e;
    if (!rc) *stage = "step", rc = tg_trainer_step(&a, &s, err);
    if (!rc) *stage = "eval", rc = tg_trainer_eval(&a, &e, err);
    if (!rc) *stage = "checkpoint", rc = tg_trainer_checkpoint(&a, ck, 1, err);
    tg_trainer_close(&a);
    return rc ? -1 : 0;
}

static void fail_each(const char *precision) {
    const char *dir = tg_test_tmpdir();
    char path[800], text[600];
    snprintf(path, sizeof path, "%s/rows.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n"
                                     "{\"input_ids\": [10, 11, 12, 13], \"label\": 1}\n") == 0,
            "write %s", path);
    snprintf(path, sizeof path, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = classify\nbatch = 2\nseq = 8\nsteps = 2\nprecision = %s\n"
             "freeze = bert.encoder.layer.0.*\ntrain_data = rows.jsonl\neval_data = rows.jsonl\n",
             precision);
    REQUIRE(tg_test_write_file(path, text) == 0, "write %s", path);
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file(path, NULL, 0, &plan, &err) == 0, "%s", err.msg);
    const char *stage = "none";
    tg_checkpoint ck;
    REQUIRE(whole_run(&plan, &ck, &stage, &err) == 0, "%s: %s: %s", precision, stage, err.msg);
    int failed = 0, completed_at = -1;
    enum { STAGES = 5 };
    int stages[STAGES] = {0};
    static const char *const names[STAGES] = {"open", "step", "eval", "checkpoint", "restore"};
    for (long k = 0; k < 20000; k++) {
        memset(&err, 0, sizeof err);
        tg_checkpoint_free(&ck);
        tg_alloc_fail_after(k);
        const int rc = whole_run(&plan, &ck, &stage, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            completed_at = (int)k;
            break;
        }
        failed++;
        for (int i = 0; i < STAGES; i++) stages[i] += !strcmp(stage, names[i]);
        /* Out of memory, in one wording or another, and naming what for. */
        if (!CHECK(strstr(err.msg, "out of memory") || strstr(err.msg, "cannot allocate"),
                   "%s: allocation %ld failing in %s: '%s'", precision, k, stage, err.msg))
            break;
    }
    CHECK(completed_at > 0, "%s: the run never completed with allocations failing (%d failures)", precision, failed);
    /* The restore into a fresh trainer, each of its allocations failing in turn. */
    tg_trainer b;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    for (long k = 0; completed_at > 0 && k < 1000; k++) {
        REQUIRE(tg_trainer_open(&b, &plan, &o, &err) == 0, "%s", err.msg);
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_trainer_restore(&b, &ck, "ck", &err);
        tg_alloc_fail_after(-1);
        const int done = b.steps_done;
        tg_trainer_close(&b);
        if (rc == 0) {
            CHECK(done == 1 && k > 0, "%s: restored with %ld allocations, at step %d", precision, k, done);
            break;
        }
        stages[4]++;
        if (!CHECK(strstr(err.msg, "out of memory"), "%s: restore, allocation %ld failing: '%s'", precision, k, err.msg))
            break;
    }
    for (int i = 0; i < STAGES; i++) CHECK(stages[i] > 0, "%s: no allocation of the %s failed", precision, names[i]);
    /* A save's first allocation: the host image of the parameters. */
    REQUIRE(tg_trainer_open(&b, &plan, &o, &err) == 0, "%s", err.msg);
    char saved[800];
    snprintf(saved, sizeof saved, "%s/saved.safetensors", dir);
    tg_alloc_fail_after(0);
    const int rc = tg_trainer_save(&b, saved, &err);
    tg_alloc_fail_after(-1);
    char want[160];
    snprintf(want, sizeof want, "out of memory for the host image of the parameters (%llu bytes)",
             (unsigned long long)plan.pool_bytes[TG_POOL_PARAMS]);
    CHECK(rc == -1 && strstr(err.msg, want), "%s: save: '%s'", precision, err.msg);
    tg_trainer_close(&b);
    printf("  %s: %d allocations, each failing in turn: %d clean errors\n", precision, completed_at, failed);
    tg_checkpoint_free(&ck);
    tg_plan_free(&plan);
}

/* bf16: the plan's paths of fp32 ones and its own (the parameters' bf16 copies). */
TG_TEST(test_trainer_alloc_faults_bf16) { fail_each("bf16"); }

/* tg_trainer_open with each of its allocations failing alone (the later ones succeed
 * again): the open stops there with -1 and an out-of-memory message rather than going on
 * without what it lacked (a staging buffer, an index array); where it does without (the
 * initialisation's thread pool runs inline), the trainer steps. */
TG_TEST(test_trainer_alloc_faults_open_one_at_a_time) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/rows.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n") ==
                0,
            "write %s", path);
    snprintf(path, sizeof path, "%s/job.job", dir);
    REQUIRE(tg_test_write_file(path, "model = tiny-bert\ntask = classify\nbatch = 2\nseq = 8\nsteps = 2\n"
                                     "train_data = rows.jsonl\neval_data = rows.jsonl\n") == 0,
            "write %s", path);
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file(path, NULL, 0, &plan, &err) == 0, "%s", err.msg);
    tg_trainer t;
    const tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    tg_alloc_fail_after(-1);
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    tg_trainer_close(&t);
    REQUIRE(total > 10, "%ld allocations", total);
    int tolerated = 0;
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_trainer_open(&t, &plan, &o, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) { /* a failure the open does without (the initialisation's thread pool) */
            tolerated++;
            tg_step_stats s;
            CHECK(tg_trainer_step(&t, &s, &err) == 0 && s.step == 1 && isfinite(s.loss),
                  "allocation %ld failing alone, then a step: %s", k, err.msg);
            tg_trainer_close(&t);
            continue;
        }
        if (!CHECK(strstr(err.msg, "out of memory") || strstr(err.msg, "cannot allocate"),
                   "allocation %ld of %ld failing alone: '%s'", k, total, err.msg))
            break;
    }
    printf("  tg_trainer_open: %ld allocations, %d failing alone done without\n", total, tolerated);
    tg_plan_free(&plan);
}
