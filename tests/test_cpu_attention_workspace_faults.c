/* The fused ATTENTION op and its backward on the CPU reference (runtime/cpu/attention.c)
 * with each allocation of the per-row workspace failing alone: the op reports out of memory
 * (tg_cpu_op_args.out_of_memory) rather than computing with a missing buffer, and with none
 * failing it leaves the flag clear. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

enum { B = 1, H = 2, T = 5, DH = 4, D = H * DH, W = (T + 31) / 32 };

/* Runs the op with allocation `fail` failing alone (-1: none); 1 when it said out of memory. */
static int run_failing(tg_cpu_op_args *a, long fail, long *made) {
    atomic_int oom = 0;
    a->out_of_memory = &oom;
    if (fail >= 0) tg_alloc_fail_only(fail);
    else tg_alloc_fail_after(-1);
    tg_cpu_op_run(a);
    *made = tg_alloc_fail_after(-1);
    a->out_of_memory = NULL;
    return atomic_load(&oom);
}

TG_TEST(test_cpu_attention_workspace_allocation_failures) {
    float x[3][B * T * D], mask[B * T], step = 3.0f, O[B * T * D], LSE[B * H * T], dO[B * T * D], dx[3][B * T * D],
        delta[B * H * T];
    int32_t bits[B * H * T * W];
    for (int s = 0; s < 3; s++) tg_test_fill_uniform(x[s], B * T * D, 10 + (uint64_t)s, -1.0f, 1.0f);
    tg_test_fill_uniform(dO, B * T * D, 20, -1.0f, 1.0f);
    for (int k = 0; k < B * T; k++) mask[k] = 1.0f;
    tg_op op = tg_test_op(TG_OP_ATTENTION);
    op.p.attention = (tg_attention_params){.b = B, .h = H, .t = T, .causal = 1, .key = 2, .head_dim = DH,
                                           .scale = 0.5f, .p = 0.25f};
    tg_op bop = op;
    bop.kind = TG_OP_ATTENTION_BWD;
    tg_cpu_op_args fa = {.op = &op, .in = {x[0], x[1], x[2], mask, &step}, .out = {O, LSE, bits}, .seed = 7,
                         .training = 1};
    tg_cpu_op_args ba = {.op = &bop, .in = {dO, O, LSE, mask, bits, x[0], x[1], x[2]},
                         .out = {dx[0], dx[1], dx[2], delta}, .seed = 7, .training = 1};
    tg_cpu_op_args *ops[2] = {&fa, &ba};
    const char *names[2] = {"forward", "backward"};
    /* The forward's workspace takes six buffers, the backward's nine. */
    const long want_made[2] = {6, 9};
    for (int i = 0; i < 2; i++) {
        long total;
        REQUIRE(!run_failing(ops[i], -1, &total), "%s: out of memory with no allocation failing", names[i]);
        CHECK(total == want_made[i], "%s: %ld allocations, expected %ld", names[i], total, want_made[i]);
        for (long k = 0; k < total; k++) {
            long made;
            CHECK(run_failing(ops[i], k, &made), "%s: allocation %ld of %ld failing alone: no out of memory", names[i], k,
                  total);
        }
        /* And whole again afterwards. */
        CHECK(!run_failing(ops[i], -1, &total), "%s: out of memory after the failures", names[i]);
    }
    float O2[B * T * D];
    memcpy(O2, O, sizeof O2);
    long made;
    run_failing(&fa, -1, &made);
    CHECK(!memcmp(O, O2, sizeof O2), "the forward's output changed between runs");
}
