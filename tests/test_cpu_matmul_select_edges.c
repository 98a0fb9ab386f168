/* Edge cases of MATMUL and SELECT_TOKEN on the CPU reference: an empty product (M or N of
 * 0 or below) writes nothing (not even a fused bias gradient) and allocates nothing; a
 * fused bias gradient without its output is skipped, the product still made; the last
 * non-pad token without ids to look at is token 0, with ids the last real one. */
#include <string.h>

#include "base/alloc.h"

#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

TG_TEST(test_cpu_matmul_empty_and_bias_grad_without_output) {
    const float A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8};
    float C[4];
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.p.matmul.m = 2, op.p.matmul.n = 2, op.p.matmul.k = 2, op.p.matmul.batch = 1, op.p.matmul.alpha = 1;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B}, .out = {C}};
    /* M or N of 0 or below (a plan the reader did not check): nothing written. */
    const int empty[][2] = {{0, 2}, {2, 0}, {-1, 2}, {2, -1}, {2, -9}, {-64, -64}};
    for (int k = 0; k < (int)(sizeof empty / sizeof *empty); k++) {
        op.p.matmul.m = empty[k][0], op.p.matmul.n = empty[k][1];
        for (int i = 0; i < 4; i++) C[i] = -1;
        tg_cpu_op_run(&a);
        CHECK(C[0] == -1 && C[3] == -1, "M %d N %d wrote %g", empty[k][0], empty[k][1], C[0]);
        /* Nor a fused bias gradient of A's or B's columns, and no memory is asked for. */
        for (int bg = 1; bg <= 2; bg++) {
            float db[2] = {-1, -1};
            atomic_int oom = 0;
            op.p.matmul.bias_grad = bg;
            a.out[1] = db, a.out_of_memory = &oom;
            tg_alloc_fail_after(0);
            tg_cpu_op_run(&a);
            const long asked = tg_alloc_fail_after(-1);
            CHECK(db[0] == -1 && db[1] == -1 && C[0] == -1 && asked == 0 && !oom,
                  "M %d N %d bias_grad %d: wrote %g %g, asked for memory %ld times", empty[k][0], empty[k][1], bg,
                  db[0], db[1], asked);
        }
        op.p.matmul.bias_grad = 0;
        a.out[1] = NULL, a.out_of_memory = NULL;
    }
    op.p.matmul.m = 2, op.p.matmul.n = 2;
    /* A bias gradient asked for (of A's or B's columns) but no output for it: the product alone. */
    for (int bg = 1; bg <= 2; bg++) {
        op.p.matmul.bias_grad = bg;
        memset(C, 0, sizeof C);
        tg_cpu_op_run(&a);
        CHECK(C[0] == 19 && C[1] == 22 && C[2] == 43 && C[3] == 50, "bias_grad %d: %g %g %g %g", bg, C[0], C[1], C[2],
              C[3]);
    }
}

/* batch 0 or below is one product (as batch 1), not none. */
TG_TEST(test_cpu_matmul_batch_below_one_is_one) {
    const float A[4] = {1, 2, 3, 4}, B[4] = {5, 6, 7, 8};
    const int64_t batches[] = {0, -1, -7, 1};
    for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
        float C[8];
        for (int k = 0; k < 8; k++) C[k] = -1;
        tg_op op = tg_test_op(TG_OP_MATMUL);
        op.p.matmul.m = 2, op.p.matmul.n = 2, op.p.matmul.k = 2, op.p.matmul.batch = batches[i], op.p.matmul.alpha = 1;
        atomic_int oom = 0;
        tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B}, .out = {C}, .out_of_memory = &oom};
        tg_cpu_op_run(&a);
        CHECK(!oom && C[0] == 19 && C[1] == 22 && C[2] == 43 && C[3] == 50 && C[4] == -1 && C[7] == -1,
              "batch %lld: oom %d, %g %g %g %g (%g)", (long long)batches[i], (int)oom, C[0], C[1], C[2], C[3], C[4]);
    }
}

TG_TEST(test_cpu_select_last_non_pad_token) {
    enum { B = 2, T = 3, D = 2 };
    float x[B * T * D], y[B * D];
    for (int i = 0; i < B * T * D; i++) x[i] = (float)i;
    const int32_t ids[B * T] = {7, 8, 0, 9, 0, 0}; /* pad 0: rows end at tokens 1 and 0 */
    tg_op op = tg_test_op(TG_OP_SELECT_TOKEN);
    op.p.select.b = B, op.p.select.t = T, op.p.select.d = D, op.p.select.mode = TG_SELECT_LAST_NON_PAD;
    op.p.select.pad_id = 0;
    tg_cpu_op_args a = {.op = &op, .in = {x, (void *)ids}, .out = {y}};
    tg_cpu_op_run(&a);
    CHECK(y[0] == 2 && y[1] == 3 && y[2] == 6 && y[3] == 7, "last non-pad: %g %g %g %g", y[0], y[1], y[2], y[3]);
    /* Without ids: token 0 of each row. */
    a.in[1] = NULL;
    tg_cpu_op_run(&a);
    CHECK(y[0] == 0 && y[1] == 1 && y[2] == 6 && y[3] == 7, "no ids: %g %g %g %g", y[0], y[1], y[2], y[3]);
}
