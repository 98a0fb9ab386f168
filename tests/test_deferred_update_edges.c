/* The deferred update's plan (runtime/deferred_update.c) on edited plans: each reason a
 * plan is not deferred, parameter reads past the update's count, and allocation failures. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/deferred_update.h"
#include "tests/harness.h"

/* Runs the planner on p, expecting `want` (0 or 1), and for 0 a zeroed *u. */
static void expect_plan(const tg_plan *p, int want, const char *what) {
    tg_deferred_update u;
    tg_err err = {{0}};
    memset(&u, 0x5a, sizeof u);
    const int rc = tg_deferred_update_plan(p, 4, &u, &err);
    CHECK(rc == want, "%s: returned %d, expected %d (%s)", what, rc, want, err.msg);
    if (want == 0)
        CHECK(u.n_chunks == 0 && u.begin == NULL && u.chunks_before == NULL && u.adamw_op == 0, "%s: *u not zeroed",
              what);
    if (rc == 1) tg_deferred_update_free(&u);
}

/* Plans that are not deferred: no ops, an AdamW before the last op, an empty update, a
 * forward op writing the bf16-copy output the update alone writes or the gradients it
 * reads, or reading its moment m (optimizer state, not a parameter). */
TG_TEST(test_deferred_update_not_deferred) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 1, &p)) return;
    const int last = p.n_ops - 1, f0 = p.phase_begin[TG_PHASE_FORWARD];
    tg_op *adam = &p.ops[last];
    REQUIRE(adam->kind == TG_OP_ADAMW && adam->out[3] >= 0, "bf16 tiny-bert: last op %d, out3 %d", adam->kind,
            adam->out[3]);
    expect_plan(&p, 1, "bf16 tiny-bert as compiled");

    const int n_ops = p.n_ops;
    p.n_ops = 0;
    expect_plan(&p, 0, "no ops");
    p.n_ops = n_ops;

    const int kind0 = p.ops[0].kind;
    p.ops[0].kind = TG_OP_ADAMW;
    expect_plan(&p, 0, "two AdamW ops");
    p.ops[0].kind = kind0;

    const int64_t n = adam->p.adamw.n;
    adam->p.adamw.n = 0;
    expect_plan(&p, 0, "an update of 0 elements");
    adam->p.adamw.n = n;

    /* out3 (the bf16 copies) is written by the update and read by no input slot of it. */
    const int32_t out0 = p.ops[f0].out[0];
    p.ops[f0].out[0] = adam->out[3];
    expect_plan(&p, 0, "a forward op writing the bf16 copies");
    p.ops[f0].out[0] = out0;

    /* in0 (the gradients) is read by the update. */
    p.ops[f0].out[0] = adam->in[0];
    expect_plan(&p, 0, "a forward op writing the gradients");
    p.ops[f0].out[0] = out0;

    const int32_t in0 = p.ops[f0].in[0];
    p.ops[f0].in[0] = adam->out[1];
    expect_plan(&p, 0, "a forward op reading AdamW's m");
    p.ops[f0].in[0] = in0;
    expect_plan(&p, 1, "bf16 tiny-bert restored");
    tg_plan_free(&p);
}

/* An update over fewer elements than the forward reads: every wait is clamped to the
 * update's count, and the chunks end there. */
TG_TEST(test_deferred_update_reads_past_count) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_op *adam = &p.ops[p.n_ops - 1];
    REQUIRE(adam->kind == TG_OP_ADAMW && adam->p.adamw.n > 64, "tiny-bert's update");
    adam->p.adamw.n = 64;
    tg_deferred_update u;
    tg_err err;
    REQUIRE(tg_deferred_update_plan(&p, 16, &u, &err) == 1, "not deferred: %s", err.msg);
    CHECK(u.begin[0] == 0 && u.begin[u.n_chunks] == 64, "chunks [%lld, %lld), expected [0, 64)",
          (long long)u.begin[0], (long long)u.begin[u.n_chunks]);
    for (int k = 0; k < u.n_chunks; k++)
        CHECK(u.begin[k + 1] > u.begin[k] && u.begin[k + 1] <= 64, "chunk %d: [%lld, %lld)", k, (long long)u.begin[k],
              (long long)u.begin[k + 1]);
    /* The last forward op reads past element 64 of a parameter pool, so it waits for all. */
    CHECK(u.chunks_before[u.n_forward - 1] == u.n_chunks, "the last forward op waits for %d of %d chunks",
          u.chunks_before[u.n_forward - 1], u.n_chunks);
    tg_deferred_update_free(&u);
    CHECK(u.begin == NULL && u.chunks_before == NULL && u.n_chunks == 0, "free leaves *u zeroed");
    tg_plan_free(&p);
}

/* Each of the planner's three allocations failing: -1, naming what was being planned, and
 * *u left without memory. */
TG_TEST(test_deferred_update_out_of_memory) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_deferred_update u;
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(tg_deferred_update_plan(&p, 4, &u, &err) == 1, "%s", err.msg);
    const long made = tg_alloc_fail_after(-1);
    tg_deferred_update_free(&u);
    CHECK(made == 3, "%ld allocations, expected 3", made);
    for (long k = 0; k < made; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_deferred_update_plan(&p, 4, &u, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory planning the deferred optimizer update"),
              "allocation %ld failing: rc %d, '%s'", k, rc, err.msg);
        CHECK(u.begin == NULL && u.chunks_before == NULL, "allocation %ld failing: memory left in *u", k);
    }
    tg_plan_free(&p);
}

/* A forward that does not start at op 0 (its first op counted before it): the plan is the
 * one of the same schedule with that op taken away, index for index. */
TG_TEST(test_deferred_update_forward_after_op_0) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 1, &p)) return;
    REQUIRE(p.phase_begin[TG_PHASE_FORWARD] == 0 && p.phase_begin[TG_PHASE_FORWARD + 1] > 8, "forward [%d, %d)",
            p.phase_begin[TG_PHASE_FORWARD], p.phase_begin[TG_PHASE_FORWARD + 1]);
    tg_plan shifted = p; /* op 0 taken away: forward [0, f1 - 1) */
    shifted.ops = p.ops + 1;
    shifted.n_ops = p.n_ops - 1;
    for (int ph = 1; ph <= TG_PHASE_COUNT; ph++) shifted.phase_begin[ph] = p.phase_begin[ph] - 1;
    tg_plan late = p; /* op 0 before the forward: forward [1, f1) */
    late.phase_begin[TG_PHASE_FORWARD] = 1;
    for (int64_t min_chunk = 4; min_chunk <= 4096; min_chunk *= 32) {
        tg_deferred_update want, got;
        tg_err err = {{0}};
        REQUIRE(tg_deferred_update_plan(&shifted, min_chunk, &want, &err) == 1, "shifted: %s", err.msg);
        REQUIRE(tg_deferred_update_plan(&late, min_chunk, &got, &err) == 1, "late: %s", err.msg);
        CHECK(got.adamw_op == p.n_ops - 1 && want.adamw_op == p.n_ops - 2, "AdamW at %d and %d", got.adamw_op,
              want.adamw_op);
        CHECK(got.n_forward == want.n_forward && got.n_forward == p.phase_begin[TG_PHASE_FORWARD + 1] - 1,
              "min %lld: %d forward ops, expected %d", (long long)min_chunk, got.n_forward, want.n_forward);
        CHECK(got.n_chunks == want.n_chunks && want.n_chunks > (min_chunk == 4 ? 1 : 0), "min %lld: %d chunks, expected %d",
              (long long)min_chunk, got.n_chunks, want.n_chunks);
        for (int k = 0; k <= want.n_chunks && k <= got.n_chunks; k++)
            CHECK(got.begin[k] == want.begin[k], "min %lld: begin[%d] = %lld, expected %lld", (long long)min_chunk, k,
                  (long long)got.begin[k], (long long)want.begin[k]);
        int same = got.n_forward == want.n_forward;
        for (int j = 0; same && j < want.n_forward; j++) same = got.chunks_before[j] == want.chunks_before[j];
        CHECK(same, "min %lld: the forward ops wait for other chunks", (long long)min_chunk);
        tg_deferred_update_free(&want);
        tg_deferred_update_free(&got);
    }
    tg_plan_free(&p);
}
