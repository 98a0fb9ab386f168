/* Running an op with bf16 slots on the CPU reference (runtime/cpu/op_run.c): inputs and
 * outputs widened to fp32, an output that is also an input sharing its widened copy, an
 * fp32 output beside bf16 ones, results rounded back; each widening allocation failing
 * leaves every output as it was; kinds outside the enum run nothing. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bf16.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

enum { N = 5 };

static void fill_bf16(uint16_t *x, const float *v) {
    for (int i = 0; i < N; i++) x[i] = tg_bf16_from_f32(v[i]);
}

TG_TEST(test_cpu_op_run_bf16_widens_and_rounds) {
    static const float xv[N] = {1.5f, -2.0f, 0.25f, 100.0f, 3.0f}, yv[N] = {0.5f, 4.0f, -0.25f, 1.0f, -3.0f};
    uint16_t x[N], y[N], out[N];
    tg_op op = tg_test_op(TG_OP_ADD);
    op.p.count.n = N;
    /* out = x + y, all three bf16 and apart. */
    fill_bf16(x, xv), fill_bf16(y, yv);
    memset(out, 0xff, sizeof out);
    tg_cpu_op_args a = {.op = &op, .in = {x, y}, .out = {out}, .in_numel = {N, N}, .out_numel = {N},
                        .in_dtype = {TG_BF16, TG_BF16}, .out_dtype = {TG_BF16}};
    REQUIRE(tg_cpu_op_run_any(&a) == 0, "run");
    for (int i = 0; i < N; i++)
        CHECK(out[i] == tg_bf16_from_f32(xv[i] + yv[i]), "element %d: %g, want %g", i, tg_f32_from_bf16(out[i]),
              xv[i] + yv[i]);
    /* In place: out is x, which shares x's widened copy. */
    a.out[0] = x;
    REQUIRE(tg_cpu_op_run_any(&a) == 0, "run in place");
    for (int i = 0; i < N; i++)
        CHECK(x[i] == tg_bf16_from_f32(xv[i] + yv[i]), "in place, element %d: %g", i, tg_f32_from_bf16(x[i]));
    /* A bf16 input into an fp32 output: only the input is widened. */
    float wide_out[N];
    fill_bf16(x, xv);
    float yf[N];
    memcpy(yf, yv, sizeof yf);
    tg_cpu_op_args m = {.op = &op, .in = {x, yf}, .out = {wide_out}, .in_numel = {N, N}, .out_numel = {N},
                        .in_dtype = {TG_BF16, TG_F32}, .out_dtype = {TG_F32}};
    REQUIRE(tg_cpu_op_run_any(&m) == 0, "mixed");
    for (int i = 0; i < N; i++)
        CHECK(wide_out[i] == tg_f32_from_bf16(x[i]) + yv[i], "mixed, element %d: %g", i, wide_out[i]);
    /* fp32 alone: run as it is. */
    float xf[N], of[N];
    memcpy(xf, xv, sizeof xf);
    tg_cpu_op_args f = {.op = &op, .in = {xf, yf}, .out = {of}, .in_numel = {N, N}, .out_numel = {N}};
    REQUIRE(tg_cpu_op_run_any(&f) == 0, "fp32");
    for (int i = 0; i < N; i++) CHECK(of[i] == xv[i] + yv[i], "fp32, element %d: %g", i, of[i]);
}

TG_TEST(test_cpu_op_run_bf16_out_of_memory) {
    static const float xv[N] = {1, 2, 3, 4, 5}, yv[N] = {10, 20, 30, 40, 50};
    uint16_t x[N], y[N], out[N];
    tg_op op = tg_test_op(TG_OP_ADD);
    op.p.count.n = N;
    /* Three widened copies (x, y, out): each failing in turn, nothing is written. */
    for (long k = 0; k <= 3; k++) {
        fill_bf16(x, xv), fill_bf16(y, yv);
        memset(out, 0x5a, sizeof out);
        tg_cpu_op_args a = {.op = &op, .in = {x, y}, .out = {out}, .in_numel = {N, N}, .out_numel = {N},
                            .in_dtype = {TG_BF16, TG_BF16}, .out_dtype = {TG_BF16}};
        tg_alloc_fail_after(k);
        const int rc = tg_cpu_op_run_any(&a);
        tg_alloc_fail_after(-1);
        if (k == 3) {
            CHECK(rc == 0 && out[4] == tg_bf16_from_f32(55), "with all three copies: rc %d", rc);
            break;
        }
        int untouched = 1;
        for (int i = 0; i < N; i++) untouched &= out[i] == 0x5a5a;
        CHECK(rc == -1 && untouched, "copy %ld failing: rc %d, output %s", k, rc, untouched ? "as it was" : "written");
    }
    /* In place there are only two copies: the second failing stops it. */
    fill_bf16(x, xv), fill_bf16(y, yv);
    tg_cpu_op_args a = {.op = &op, .in = {x, y}, .out = {x}, .in_numel = {N, N}, .out_numel = {N},
                        .in_dtype = {TG_BF16, TG_BF16}, .out_dtype = {TG_BF16}};
    tg_alloc_fail_after(1);
    int rc = tg_cpu_op_run_any(&a);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && x[0] == tg_bf16_from_f32(1), "in place, y's copy failing: rc %d, x[0] %g", rc,
          tg_f32_from_bf16(x[0]));
    tg_alloc_fail_after(2);
    rc = tg_cpu_op_run_any(&a);
    tg_alloc_fail_after(-1);
    CHECK(rc == 0 && x[0] == tg_bf16_from_f32(11), "in place with two copies: rc %d, x[0] %g", rc,
          tg_f32_from_bf16(x[0]));
}

TG_TEST(test_cpu_op_run_unknown_kinds) {
    float v[2] = {7, 8};
    tg_op op = tg_test_op(TG_OP_FILL);
    op.p.fill.value = 1;
    tg_cpu_op_args a = {.op = &op, .out = {v}, .out_numel = {2}};
    const int kinds[2] = {-1, TG_OP_COUNT};
    for (int k = 0; k < 2; k++) {
        const int kind = kinds[k];
        op.kind = kind;
        CHECK(tg_cpu_op_has_kernel(kind) == 0, "kind %d has a kernel", kind);
        tg_cpu_op_run(&a);
        CHECK(v[0] == 7 && v[1] == 8, "kind %d ran something", kind);
    }
    op.kind = TG_OP_FILL;
    tg_cpu_op_run(&a);
    CHECK(v[0] == 1 && v[1] == 1, "fill: %g %g", v[0], v[1]);
}

/* Only bf16 slots are widened and rounded: a slot whose dtype lies past the enum is handed
 * to the kernel as it is, beside a bf16 input, and keeps the kernel's fp32 result. */
TG_TEST(test_cpu_op_run_bf16_only_bf16_slots_rounded) {
    static const float xv[N] = {1.5f, -2.0f, 0.25f, 100.0f, 3.0f}, yv[N] = {0.125f, 4.0f, -0.25f, 1.0f, -3.0f};
    uint16_t x[N];
    fill_bf16(x, xv);
    float yf[N], out[N];
    memcpy(yf, yv, sizeof yf);
    tg_op op = tg_test_op(TG_OP_ADD);
    op.p.count.n = N;
    const int odd[] = {TG_DTYPE_COUNT, TG_DTYPE_COUNT + 1, 99};
    for (size_t k = 0; k < sizeof odd / sizeof *odd; k++) {
        memset(out, 0, sizeof out);
        tg_cpu_op_args a = {.op = &op, .in = {x, yf}, .out = {out}, .in_numel = {N, N}, .out_numel = {N},
                            .in_dtype = {TG_BF16, TG_F32}, .out_dtype = {odd[k]}};
        REQUIRE(tg_cpu_op_run_any(&a) == 0, "dtype %d: run", odd[k]);
        for (int i = 0; i < N; i++)
            CHECK(out[i] == xv[i] + yv[i], "dtype %d, element %d: %g, want %g", odd[k], i, out[i], xv[i] + yv[i]);
    }
}
