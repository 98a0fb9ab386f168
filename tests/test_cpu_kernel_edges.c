/* Edge cases of small CPU reference kernels: EMBEDDING reads ids outside the vocabulary
 * as zero rows; ZERO without an output does nothing; DROPOUT in eval or at p = 0 copies
 * (or, in place, leaves) its input, and at p = 1 drops everything; ALL_GATHER without a
 * communicator leaves the tensor as it is. */
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

TG_TEST(test_cpu_embedding_out_of_range_ids) {
    enum { V = 3, D = 2 };
    const float table[V * D] = {1, 2, 3, 4, 5, 6};
    const int32_t ids[5] = {2, -1, 0, V, 1};
    float y[5 * D];
    memset(y, 0x7f, sizeof y);
    tg_op op = tg_test_op(TG_OP_EMBEDDING);
    op.p.embedding.n = 5, op.p.embedding.vocab = V, op.p.embedding.dim = D;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)ids, (void *)table}, .out = {y}};
    tg_cpu_op_run(&a);
    const float want[5 * D] = {5, 6, 0, 0, 1, 2, 0, 0, 3, 4};
    for (int i = 0; i < 5 * D; i++) CHECK(y[i] == want[i], "y[%d] = %g, want %g", i, y[i], want[i]);
}

TG_TEST(test_cpu_zero_dropout_gather_edges) {
    tg_op zero = tg_test_op(TG_OP_ZERO);
    tg_cpu_op_args z = {.op = &zero, .out_numel = {4}};
    tg_cpu_op_run(&z); /* no output: nothing to clear, nothing touched */
    float v[4] = {1, 2, 3, 4};
    z.out[0] = v;
    tg_cpu_op_run(&z);
    CHECK(v[0] == 0 && v[3] == 0, "zero: %g %g", v[0], v[3]);

    enum { N = 8 };
    float x[N], y[N], step = 3;
    for (int i = 0; i < N; i++) x[i] = (float)(i + 1);
    tg_op drop = tg_test_op(TG_OP_DROPOUT);
    drop.p.dropout.n = N, drop.p.dropout.p = 0.5f, drop.p.dropout.key = 7;
    /* Eval: a copy. */
    memset(y, 0, sizeof y);
    tg_cpu_op_args d = {.op = &drop, .in = {x, &step}, .out = {y}, .training = 0, .seed = 9};
    tg_cpu_op_run(&d);
    CHECK(!memcmp(x, y, sizeof x), "eval dropout is not a copy");
    /* In place in eval: the input stays. */
    d.out[0] = x;
    tg_cpu_op_run(&d);
    CHECK(x[0] == 1 && x[N - 1] == N, "in-place eval dropout changed x");
    /* Training at p = 0: a copy too. */
    drop.p.dropout.p = 0;
    d.out[0] = y, d.training = 1;
    memset(y, 0, sizeof y);
    tg_cpu_op_run(&d);
    CHECK(!memcmp(x, y, sizeof x), "p = 0 is not a copy");
    /* p = 1: every element dropped (no scale of infinity). */
    drop.p.dropout.p = 1;
    tg_cpu_op_run(&d);
    for (int i = 0; i < N; i++) CHECK(y[i] == 0, "p = 1 kept element %d: %g", i, y[i]);
    /* p = 0.5: kept elements doubled, the others 0. */
    drop.p.dropout.p = 0.5f;
    tg_cpu_op_run(&d);
    int kept = 0;
    for (int i = 0; i < N; i++) {
        CHECK(y[i] == 0 || y[i] == 2 * x[i], "element %d: %g from %g", i, y[i], x[i]);
        kept += y[i] != 0;
    }
    CHECK(kept > 0 && kept < N, "%d of %d kept at p = 0.5", kept, N);

    /* ALL_GATHER with one replica (no communicator): the tensor as it is. */
    uint16_t g[4] = {1, 2, 3, 4};
    tg_op gather = tg_test_op(TG_OP_ALL_GATHER);
    gather.p.all_gather.slice = 2;
    tg_cpu_op_args ga = {.op = &gather, .out = {g}, .out_numel = {4}, .out_dtype = {TG_BF16}};
    CHECK(tg_cpu_op_run_any(&ga) == 0 && g[0] == 1 && g[3] == 4, "gather without replicas: %u %u", g[0], g[3]);
}
