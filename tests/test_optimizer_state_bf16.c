/* optimizer_state = bf16: the stochastic rounding (kernels/state_rounding.h), AdamW's and
 * Adan's CPU updates with bf16 moments against the f32 update rounded by hand, the second
 * moment's decay that rounding to nearest would stall, the compiled layout (half the
 * optimizer pool), the plan check's refusal of mixed state, and training beside f32 state. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "kernels/adan_update.h"
#include "kernels/state_rounding.h"
#include "plan/op_meta.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

TG_TEST(test_bf16_round_stochastic_values) {
    /* 1 + 2^-10 lies an eighth of the way from 1 to the next bf16 value, 1 + 2^-7: of the
     * 65536 draws, exactly 8192 round it up, so the mean of the results is x exactly. */
    const float x = 1.0f + 0x1p-10f, lo = 1.0f, hi = 1.0f + 0x1p-7f;
    int up = 0, other = 0;
    double sum = 0;
    for (uint32_t r = 0; r < 65536; r++) {
        const float y = tg_bf16_round_stochastic(x, r);
        up += y == hi;
        other += y != hi && y != lo;
        sum += y;
    }
    CHECK(up == 8192 && other == 0, "%d of 65536 draws round up (want 8192), %d land elsewhere", up, other);
    CHECK(sum / 65536.0 == (double)x, "mean %.12g, want %.12g", sum / 65536.0, (double)x);
    /* Negative values round in magnitude alike; the high 16 bits of a draw play no part. */
    CHECK(tg_bf16_round_stochastic(-x, 0xffffu) == -hi && tg_bf16_round_stochastic(-x, 0xffff0000u) == -lo,
          "negative: %.9g %.9g", tg_bf16_round_stochastic(-x, 0xffffu), tg_bf16_round_stochastic(-x, 0xffff0000u));
    /* A bf16 value stays itself under every draw; so do infinities and zeros. */
    const float exact[] = {lo, hi, -3.5f, 0.0f, -0.0f, INFINITY, -INFINITY, 0x1p-133f};
    for (size_t k = 0; k < sizeof exact / sizeof *exact; k++)
        for (uint32_t r = 0; r < 65536; r += 4093)
            CHECK(tg_test_f32_bits(tg_bf16_round_stochastic(exact[k], r)) == tg_test_f32_bits(exact[k]), "%g with draw %u moved to %g",
                  exact[k], r, tg_bf16_round_stochastic(exact[k], r));
    /* A NaN whose payload sits in the low 16 bits stays a NaN (cut alone, it would be an
     * infinity); the largest finite floats may round up to infinity, as a bf16 step. */
    const float nan_low = tg_test_f32_of_bits(0x7f800001u);
    CHECK(isnan(tg_bf16_round_stochastic(nan_low, 0)) && isnan(tg_bf16_round_stochastic(nan_low, 0xffffu)),
          "a NaN became %g", tg_bf16_round_stochastic(nan_low, 0));
    CHECK(isinf(tg_bf16_round_stochastic(tg_test_f32_of_bits(0x7f7fffffu), 1)) &&
              tg_test_f32_bits(tg_bf16_round_stochastic(tg_test_f32_of_bits(0x7f7fffffu), 0)) == 0x7f7f0000u,
          "FLT_MAX rounds to %g / %g", tg_bf16_round_stochastic(tg_test_f32_of_bits(0x7f7fffffu), 1),
          tg_bf16_round_stochastic(tg_test_f32_of_bits(0x7f7fffffu), 0));
}

/* A plan table of one decayed parameter of n elements at element 0. */
static void one_param_plan(tg_plan *plan, tg_tensor *t, int64_t n) {
    memset(t, 0, sizeof *t);
    t->ndim = 1, t->shape[0] = n, t->dtype = TG_F32, t->bytes = (uint64_t)n * 4, t->flags = TG_TENSOR_PARAM;
    memset(plan, 0, sizeof *plan);
    plan->n_tensors = 1, plan->tensors = t;
}

/* One update op on the CPU through the executor's widening path, m and v stored as bf16
 * (parts state vectors each: AdamW 1, Adan 2), step t. */
static void run_update(int kind, tg_plan *plan, int64_t n, float *g, float *p, uint16_t *m, uint16_t *v, float lr,
                       float t, uint64_t seed, float beta1, float beta2) {
    const int parts = kind == TG_OP_ADAN ? 2 : 1;
    tg_op op = tg_test_op(kind);
    op.p.adamw.n = n, op.p.adamw.beta1 = beta1, op.p.adamw.beta2 = beta2, op.p.adamw.eps = 1e-8f;
    op.p.adamw.weight_decay = 0.01f;
    if (kind == TG_OP_ADAN) op.p.adan.beta3 = 0.99f;
    float norm = 1.0f;
    tg_cpu_op_args a = {.op = &op, .in = {g, &lr, &t, &norm}, .out = {p, m, v}, .plan = plan, .seed = seed};
    a.in_numel[0] = a.out_numel[0] = n;
    a.in_numel[1] = a.in_numel[2] = a.in_numel[3] = 1;
    a.out_numel[1] = a.out_numel[2] = n * parts;
    a.out_dtype[1] = a.out_dtype[2] = TG_BF16;
    CHECK(tg_cpu_op_run_any(&a) == 0, "the update could not widen its state");
}

/* AdamW: the f32 update of the widened moments (the parameters from the unrounded ones),
 * then each moment rounded with its element's draw: low 16 bits for m, high for v. */
TG_TEST(test_cpu_adamw_bf16_state_is_the_f32_update_rounded) {
    enum { N = 37 };
    const uint64_t seed = 0x5eedull;
    const float lr = 1e-3f, t = 5.0f, b1 = 0.9f, b2 = 0.999f;
    tg_tensor tt;
    tg_plan plan;
    one_param_plan(&plan, &tt, N);
    float g[N], p[N], wm[N], wv[N], wp[N];
    uint16_t m[N], v[N];
    tg_test_fill_uniform(g, N, 1, -1.0f, 1.0f);
    tg_test_fill_uniform(p, N, 2, -1.0f, 1.0f);
    tg_test_fill_uniform(wm, N, 3, -0.1f, 0.1f);
    tg_test_fill_uniform(wv, N, 4, 0.0f, 0.01f);
    tg_bf16_narrow(m, wm, N), tg_bf16_narrow(v, wv, N);
    const double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    const float step_size = (float)(lr / bc1), sqrt_bc2 = (float)sqrt(bc2), dec = lr * 0.01f;
    for (int i = 0; i < N; i++) {
        const float mi0 = tg_f32_from_bf16(m[i]), vi0 = tg_f32_from_bf16(v[i]);
        const float pi = p[i] - dec * p[i];
        const float mi = b1 * mi0 + (1.0f - b1) * g[i], vi = b2 * vi0 + (1.0f - b2) * g[i] * g[i];
        wp[i] = pi - step_size * mi / (sqrtf(vi) / sqrt_bc2 + 1e-8f);
        uint32_t w[4];
        tg_state_round_words(seed, 5, TG_STATE_ROUND_KEY, (uint64_t)i >> 2, w);
        wm[i] = tg_bf16_round_stochastic(mi, w[i & 3]);
        wv[i] = tg_bf16_round_stochastic(vi, w[i & 3] >> 16);
    }
    run_update(TG_OP_ADAMW, &plan, N, g, p, m, v, lr, t, seed, b1, b2);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if ((p[i] != wp[i] || tg_f32_from_bf16(m[i]) != wm[i] || tg_f32_from_bf16(v[i]) != wv[i]) && bad++ < 3)
            CHECK(0, "element %d: p %.9g m %.9g v %.9g, want %.9g %.9g %.9g", i, p[i], tg_f32_from_bf16(m[i]),
                  tg_f32_from_bf16(v[i]), wp[i], wm[i], wv[i]);
    CHECK(!bad, "%d of %d elements differ", bad, N);
}

/* Adan: its four vectors rounded, m and d from one stream's word, v and g_prev from the
 * other's; the parameters from the unrounded values. */
TG_TEST(test_cpu_adan_bf16_state_is_the_f32_update_rounded) {
    enum { N = 21 };
    const uint64_t seed = 77;
    const float lr = 2e-3f, t = 3.0f, b1 = 0.98f, b2 = 0.92f;
    tg_tensor tt;
    tg_plan plan;
    one_param_plan(&plan, &tt, N);
    float g[N], p[N], wp[N], s0[4][N], want[4][N];
    uint16_t md[2 * N], vg[2 * N];
    tg_test_fill_uniform(g, N, 5, -1.0f, 1.0f);
    tg_test_fill_uniform(p, N, 6, -1.0f, 1.0f);
    for (int k = 0; k < 4; k++) tg_test_fill_uniform(s0[k], N, 7 + (uint64_t)k, k == 2 ? 0.0f : -0.1f, 0.1f);
    tg_bf16_narrow(md, s0[0], N), tg_bf16_narrow(md + N, s0[1], N);
    tg_bf16_narrow(vg, s0[2], N), tg_bf16_narrow(vg + N, s0[3], N);
    const tg_adan_step st = tg_adan_step_of(lr, t, 1.0f, 0.0f, b1, b2, 0.99f, 1e-8f, 0);
    for (int i = 0; i < N; i++) {
        float pi = p[i], m = tg_f32_from_bf16(md[i]), d = tg_f32_from_bf16(md[N + i]);
        float v = tg_f32_from_bf16(vg[i]), gp = tg_f32_from_bf16(vg[N + i]);
        tg_adan_element(&st, lr * 0.01f, g[i], &pi, &m, &d, &v, &gp);
        wp[i] = pi;
        uint32_t w1[4], w2[4];
        tg_state_round_words(seed, 3, TG_STATE_ROUND_KEY, (uint64_t)i >> 2, w1);
        tg_state_round_words(seed, 3, TG_STATE_ROUND_KEY2, (uint64_t)i >> 2, w2);
        want[0][i] = tg_bf16_round_stochastic(m, w1[i & 3]), want[1][i] = tg_bf16_round_stochastic(d, w1[i & 3] >> 16);
        want[2][i] = tg_bf16_round_stochastic(v, w2[i & 3]), want[3][i] = tg_bf16_round_stochastic(gp, w2[i & 3] >> 16);
    }
    run_update(TG_OP_ADAN, &plan, N, g, p, md, vg, lr, t, seed, b1, b2);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const float got[4] = {tg_f32_from_bf16(md[i]), tg_f32_from_bf16(md[N + i]), tg_f32_from_bf16(vg[i]),
                              tg_f32_from_bf16(vg[N + i])};
        int same = p[i] == wp[i];
        for (int k = 0; k < 4; k++) same &= got[k] == want[k][i];
        if (!same && bad++ < 3)
            CHECK(0, "element %d: p %.9g (want %.9g), m d v g_prev %g %g %g %g (want %g %g %g %g)", i, p[i], wp[i],
                  got[0], got[1], got[2], got[3], want[0][i], want[1][i], want[2][i], want[3][i]);
    }
    CHECK(!bad, "%d of %d elements differ", bad, N);
}

/* Why the rounding is stochastic: after one large gradient, v decays by beta2 = 0.999 a
 * step under zero gradients. A decay step moves v by 2^-10 of itself, under half a bf16
 * step, so rounding to nearest keeps v where it is forever; the stochastic rounding's mean
 * follows 0.999^k (here over 4096 elements for 700 steps: 0.4963 of the start). */
TG_TEST(test_cpu_bf16_second_moment_decays) {
    enum { N = 4096, STEPS = 700 };
    tg_tensor tt;
    tg_plan plan;
    one_param_plan(&plan, &tt, N);
    float *g = calloc(N, sizeof *g), *p = calloc(N, sizeof *p);
    uint16_t *m = calloc(N, sizeof *m), *v = calloc(N, sizeof *v);
    REQUIRE(g && p && m && v, "memory");
    for (int i = 0; i < N; i++) v[i] = tg_bf16_from_f32(1.0f);
    for (int s = 1; s <= STEPS; s++) run_update(TG_OP_ADAMW, &plan, N, g, p, m, v, 0.0f, (float)s, 9, 0.9f, 0.999f);
    double mean = 0;
    for (int i = 0; i < N; i++) mean += tg_f32_from_bf16(v[i]);
    mean /= N;
    const double want = pow(0.999f, STEPS);
    CHECK(fabs(mean / want - 1.0) < 0.02, "mean v %.5f after %d steps, want %.5f (rounding to nearest stays at 1)",
          mean, STEPS, want);
    /* Rounding to nearest, for contrast: the same decay step leaves 1.0 unchanged. */
    CHECK(tg_f32_from_bf16(tg_bf16_from_f32(0.999f * 1.0f)) == 1.0f, "0.999 rounds to %g in bf16",
          tg_f32_from_bf16(tg_bf16_from_f32(0.999f)));
    free(g), free(p), free(m), free(v);
}

static int compile_with(const char *const *sets, int n, tg_plan *plan) {
    tg_job job;
    tg_err err;
    const int ok = CHECK(tg_job_load("examples/demo-classify.job", sets, n, &job, &err) == 0, "%s", err.msg) &&
                   CHECK(tg_compile(&job, plan, &err) == 0, "%s", err.msg);
    return ok;
}

/* The moments are bf16 views of half the bytes, so the optimizer pool is half as large
 * (AdamW and Adan, one replica and ZeRO-1's slices), and the plan's estimate falls with it. */
TG_TEST(test_compile_bf16_state_halves_the_optimizer_pool) {
    static const char *const variants[3][4] = {
        {"optimizer=adamw", NULL}, {"optimizer=adan", NULL}, {"optimizer=adamw", "data_parallel=2", "zero_stage=1", NULL}};
    for (int k = 0; k < 3; k++) {
        const char *f32[5] = {0}, *b16[5] = {0};
        int n = 0;
        for (; variants[k][n]; n++) f32[n] = b16[n] = variants[k][n];
        f32[n] = "optimizer_state=fp32", b16[n] = "optimizer_state=bf16";
        const char *what = variants[k][n - 1];
        tg_plan a, b;
        if (!compile_with(f32, n + 1, &a)) return;
        if (!compile_with(b16, n + 1, &b)) {
            tg_plan_free(&a);
            return;
        }
        const tg_tensor *am = &a.tensors[a.io.m_all], *bm = &b.tensors[b.io.m_all], *bv = &b.tensors[b.io.v_all];
        CHECK(am->dtype == TG_F32 && bm->dtype == TG_BF16 && bv->dtype == TG_BF16, "%s: m/v dtypes %s, %s / %s", what,
              tg_dtype_name(am->dtype), tg_dtype_name(bm->dtype), tg_dtype_name(bv->dtype));
        CHECK(tg_tensor_numel(am) == tg_tensor_numel(bm) && bm->bytes * 2 == am->bytes, "%s: m is %llu bytes, f32 %llu",
              what, (unsigned long long)bm->bytes, (unsigned long long)am->bytes);
        CHECK(bv->offset == bm->bytes && b.pool_bytes[TG_POOL_OPTIM] < a.pool_bytes[TG_POOL_OPTIM] &&
                  a.pool_bytes[TG_POOL_OPTIM] - b.pool_bytes[TG_POOL_OPTIM] == am->bytes,
              "%s: v at %llu; optim pool %llu bytes, f32 %llu", what, (unsigned long long)bv->offset,
              (unsigned long long)b.pool_bytes[TG_POOL_OPTIM], (unsigned long long)a.pool_bytes[TG_POOL_OPTIM]);
        CHECK(b.peak_bytes < a.peak_bytes, "%s: peak %llu, f32 %llu", what, (unsigned long long)b.peak_bytes,
              (unsigned long long)a.peak_bytes);
        tg_plan_free(&a), tg_plan_free(&b);
    }
}

/* The op check (which the plan decoder runs on untrusted plans) takes f32 or bf16 moments,
 * both alike, for AdamW and Adan, and refuses mixed ones and fp16 ones. */
TG_TEST(test_op_check_update_state_dtypes) {
    const struct {
        int kind, m, v;
        const char *want; /* NULL: accepted */
    } cases[] = {
        {TG_OP_ADAMW, TG_F32, TG_F32, NULL},
        {TG_OP_ADAMW, TG_BF16, TG_BF16, NULL},
        {TG_OP_ADAN, TG_BF16, TG_BF16, NULL},
        {TG_OP_ADAMW, TG_BF16, TG_F32, "out[1], out[2]: the state is not all f32 or all bf16"},
        {TG_OP_ADAMW, TG_F32, TG_BF16, "out[1], out[2]: the state is not all f32 or all bf16"},
        {TG_OP_ADAN, TG_F16, TG_F16, "out[1], out[2]: the state is not all f32 or all bf16"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const int64_t n = 10, parts = cases[k].kind == TG_OP_ADAN ? 2 : 1;
        const int64_t numel[7] = {n, 1, 1, 1, n, n * parts, n * parts};
        const int dtype[7] = {TG_F32, TG_F32, TG_F32, TG_F32, TG_F32, cases[k].m, cases[k].v};
        tg_tensor t[7];
        memset(t, 0, sizeof t);
        for (int i = 0; i < 7; i++) {
            snprintf(t[i].name, sizeof t[i].name, "t%d", i);
            t[i].ndim = 1, t[i].shape[0] = numel[i], t[i].dtype = dtype[i];
            t[i].bytes = (uint64_t)numel[i] * (uint64_t)tg_dtype_size(dtype[i]);
        }
        tg_op op = tg_test_op(cases[k].kind);
        op.p.adamw.n = n, op.p.adamw.beta1 = 0.9f, op.p.adamw.beta2 = 0.999f;
        for (int s = 0; s < 4; s++) op.in[s] = s;
        for (int s = 0; s < 3; s++) op.out[s] = 4 + s;
        const tg_op_check_ctx c = {.tensors = t, .n_tensors = 7, .replicas = 1};
        char why[256] = "";
        const int rc = tg_op_check(&c, &op, why, sizeof why);
        if (cases[k].want)
            CHECK(rc == -1 && !strcmp(why, cases[k].want), "%s m %s v %s: '%s'", tg_op_name(cases[k].kind),
                  tg_dtype_name(cases[k].m), tg_dtype_name(cases[k].v), why);
        else
            CHECK(rc == 0, "%s m %s v %s refused: %s", tg_op_name(cases[k].kind), tg_dtype_name(cases[k].m),
                  tg_dtype_name(cases[k].v), why);
    }
}

/* Training with bf16 moments follows f32 moments closely on the demo job: the CPU
 * reference's losses within 2% step by step over 20 steps, and the runs are not the same
 * run (the state really is rounded). */
TG_TEST(test_bf16_state_trains_beside_f32_state) {
    enum { STEPS = 20 };
    const char *f32[1] = {"optimizer_state=fp32"}, *b16[1] = {"optimizer_state=bf16"};
    float *pa = NULL, *pb = NULL;
    size_t na = 0, nb = 0;
    if (tg_test_train_cpu("examples/demo-classify.job", f32, 1, STEPS, &pa, &na, NULL) &&
        tg_test_train_cpu("examples/demo-classify.job", b16, 1, STEPS, &pb, &nb, NULL) &&
        CHECK(na == nb, "parameter pools of %zu and %zu bytes", na, nb)) {
        const int64_t n = (int64_t)(na / 4);
        double diff = 0, norm = 0;
        for (int64_t i = 0; i < n; i++) diff += (double)(pa[i] - pb[i]) * (pa[i] - pb[i]), norm += (double)pa[i] * pa[i];
        const double rel = sqrt(diff / norm);
        CHECK(rel > 0 && rel < 1e-3, "parameters after %d steps differ by %.3g (relative norm)", STEPS, rel);
    }
    free(pa), free(pb);
}
