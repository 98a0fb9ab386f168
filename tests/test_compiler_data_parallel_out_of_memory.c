/* Compiling a data-parallel job (gradient buckets and their sums, compiler/grad_buckets.c;
 * ZeRO-1 slices and gathers) with each allocation failing in turn: every failure ends the
 * compile with a message naming what ran out, never another refusal after it or a crash,
 * and nothing stays allocated (the sanitizer build's leak check). */
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "tests/harness.h"

static void fail_each_allocation(const char *what, const char *text) {
    tg_job job;
    tg_err err;
    REQUIRE(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0, "%s", err.msg);
    tg_plan plan;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s: %s", what, err.msg);
    tg_plan_free(&plan);
    const long total = tg_alloc_fail_after(-1);
    int clean = 0;
    for (long k = 0; k < total; k++) {
        tg_alloc_fail_only(k);
        const int rc = tg_compile(&job, &plan, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            tg_plan_free(&plan);
            CHECK(0, "%s: allocation %ld of %ld failed and the compile succeeded", what, k, total);
            continue;
        }
        clean += CHECK(strstr(err.msg, "out of memory") != NULL, "%s: allocation %ld of %ld: %s", what, k, total,
                       err.msg);
    }
    CHECK(total > 100 && clean == total, "%s: %d of %ld allocations failed cleanly", what, clean, total);
}

TG_TEST(test_compile_data_parallel_each_allocation_fails) {
    fail_each_allocation("2 replicas", "model = tiny-bert\nbatch = 4\nseq = 16\nsteps = 2\ndata_parallel = 2\n"
                                       "train_data = train.jsonl\n");
    fail_each_allocation("2 replicas, ZeRO-1", "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 16\nsteps = 2\n"
                                               "data_parallel = 2\nzero_stage = 1\ntrain_data = train.jsonl\n");
}
