/* The pools of a plan with length buckets (compiler/compile.c): every pool as large as the
 * largest bucket needs it. Placement by liveness is not monotone in the length: tiny-bert
 * at batch 1 needs more activation bytes at seq 21 than at seq 22, so with buckets 21 and 22
 * the shorter bucket sets the activations pool, for the plan and its bucket plan alike. */
#include <stdio.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "tests/harness.h"

static int compile_text(const char *text, tg_plan *plan) {
    tg_job job;
    tg_err err = {{0}};
    return CHECK(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0 && tg_compile(&job, plan, &err) == 0,
                 "%s", err.msg);
}

/* Gradients apart, as a bucketed plan keeps them, so that one-bucket plans compare. */
#define JOB "model = tiny-bert\nbatch = 1\nsteps = 1\ntrain_data = x\nshare_grad_memory = false\n"

TG_TEST(test_compiler_bucket_pools_shorter_bucket_sets_a_pool) {
    tg_plan p21, p22, both;
    if (!compile_text(JOB "seq = 21\n", &p21)) return;
    if (!compile_text(JOB "seq = 22\n", &p22)) {
        tg_plan_free(&p21);
        return;
    }
    const uint64_t a21 = p21.pool_bytes[TG_POOL_ACTIVATIONS], a22 = p22.pool_bytes[TG_POOL_ACTIVATIONS];
    tg_plan_free(&p21);
    tg_plan_free(&p22);
    REQUIRE(a21 > a22, "activations: seq 21 %llu bytes, seq 22 %llu", (unsigned long long)a21, (unsigned long long)a22);
    if (!compile_text(JOB "seq_buckets = 21, 22\n", &both)) return;
    uint64_t sum = 0;
    for (int q = 0; q < TG_POOL_COUNT; q++) sum += both.pool_bytes[q];
    CHECK(both.train.n_buckets == 2 && both.buckets && both.pool_bytes[TG_POOL_ACTIVATIONS] == a21 &&
              both.buckets[0].pool_bytes[TG_POOL_ACTIVATIONS] == a21 && both.peak_bytes == sum &&
              both.buckets[0].peak_bytes == sum,
          "activations: plan %llu, bucket %llu, want %llu; peak %llu of %llu",
          (unsigned long long)both.pool_bytes[TG_POOL_ACTIVATIONS],
          both.buckets ? (unsigned long long)both.buckets[0].pool_bytes[TG_POOL_ACTIVATIONS] : 0ull,
          (unsigned long long)a21, (unsigned long long)both.peak_bytes, (unsigned long long)sum);
    tg_plan_free(&both);
}
