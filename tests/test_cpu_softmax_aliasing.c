/* ATTN_SOFTMAX and its backward when outputs alias inputs, as the memory planner may place
 * them: the forward's dropped copy D on P itself (no dropout: D is P), and the backward's
 * dS on P with dropout (dP is then formed in scratch memory first). Each must give bitwise
 * what the separate buffers give; the backward's scratch allocation failing is reported
 * as out of memory, with nothing computed. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

enum { B = 2, H = 2, T = 5, N = B * H * T * T };
static const float SCALE = 0.4f, P_DROP = 0.3f, STEP = 4;
static const uint64_t SEED = 21;
static const int64_t KEY = 5;

static void fill(float *x, int n, unsigned salt) {
    for (int i = 0; i < n; i++) x[i] = (float)sin(0.37 * i + salt) * 2.0f;
}

static void forward(const float *s, const float *mask, float *P, float *D, int training) {
    tg_op op = tg_test_op(TG_OP_ATTN_SOFTMAX);
    op.p.softmax = (tg_softmax_params){.b = B, .h = H, .t = T, .causal = 1, .key = KEY, .scale = SCALE, .p = P_DROP};
    float step = STEP;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)s, (void *)mask, &step}, .out = {P, D}, .seed = SEED,
                        .training = training};
    tg_cpu_op_run(&a);
}

static int backward(const float *dD, const float *P, float *ds) {
    tg_op op = tg_test_op(TG_OP_ATTN_SOFTMAX_BWD);
    op.p.softmax_bwd = (tg_softmax_bwd_params){.b = B, .h = H, .t = T, .key = KEY, .scale = SCALE, .p = P_DROP};
    float step = STEP;
    atomic_int oom = 0;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)dD, (void *)P, &step}, .out = {ds}, .seed = SEED, .training = 1,
                        .out_of_memory = &oom};
    tg_cpu_op_run(&a);
    return atomic_load(&oom);
}

TG_TEST(test_cpu_softmax_forward_copy_onto_itself) {
    float s[N], mask[B * T], P[N], D[N], PD[N];
    fill(s, N, 1);
    for (int i = 0; i < B * T; i++) mask[i] = i % T == 3 ? 0.0f : 1.0f; /* one padded key per row */
    memset(D, 0xff, sizeof D);                                          /* NaN: every element must be written */
    forward(s, mask, P, D, 0); /* eval: no dropout, D a copy of P */
    CHECK(!memcmp(P, D, sizeof P), "eval: D is not P's copy");
    for (int i = 0; i < N; i++) CHECK(!isnan(P[i]), "P[%d] is NaN", i);
    forward(s, mask, PD, PD, 0); /* D on P itself */
    CHECK(!memcmp(P, PD, sizeof P), "D on P: the probabilities differ from separate buffers'");
    /* With dropout in training, D differs from P where elements were dropped or scaled. */
    forward(s, mask, P, D, 1);
    int dropped = 0;
    for (int i = 0; i < N; i++) {
        if (D[i] == 0.0f && P[i] != 0.0f) dropped++;
        else CHECK(fabsf(D[i] - P[i] / (1.0f - P_DROP)) <= 1e-6f * fabsf(D[i]), "D[%d] %g, P %g", i, D[i], P[i]);
    }
    CHECK(dropped > 0 && dropped < N / 2, "%d of %d dropped at p = %g", dropped, N, P_DROP);
}

TG_TEST(test_cpu_softmax_backward_onto_probabilities) {
    float s[N], P[N], D[N], dD[N], ds[N], onto[N];
    fill(s, N, 2);
    fill(dD, N, 3);
    forward(s, NULL, P, D, 1);
    memset(ds, 0xff, sizeof ds);
    CHECK(backward(dD, P, ds) == 0, "separate buffers: out of memory reported");
    for (int i = 0; i < N; i++) CHECK(!isnan(ds[i]), "dS[%d] is NaN", i);
    memcpy(onto, P, sizeof P);
    CHECK(backward(dD, onto, onto) == 0, "dS on P: out of memory reported");
    CHECK(!memcmp(ds, onto, sizeof ds), "dS on P differs from separate buffers'");
    /* dS on dD (the other aliasing the planner may choose) gives the same too. */
    float on_dD[N];
    memcpy(on_dD, dD, sizeof dD);
    CHECK(backward(on_dD, P, on_dD) == 0, "dS on dD: out of memory reported");
    CHECK(!memcmp(ds, on_dD, sizeof ds), "dS on dD differs from separate buffers'");

    /* The scratch row for dP cannot be had: out of memory, and P is left as it was. */
    memcpy(onto, P, sizeof P);
    tg_alloc_fail_after(0);
    const int oom = backward(dD, onto, onto);
    tg_alloc_fail_after(-1);
    CHECK(oom == 1, "a failed scratch allocation was not reported");
    CHECK(!memcmp(onto, P, sizeof P), "a failed backward wrote its output");
}
