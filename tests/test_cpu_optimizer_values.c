/* The CPU reference's optimizer kernels (runtime/cpu/optimizer.c) against the same
 * expressions written out: GRAD_NORM over several 65536-element blocks and a partial one
 * (sums per block, in block order), ADAMW over parameters with gaps between them, a skipped
 * view and a non-parameter, decay and no decay, clipping, the low-precision copies and a
 * ZeRO-1 slice; and SCHEDULE at the ends of warmup and decay. Alone and on 3 threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/threadpool.h"
#include "tests/harness.h"

#define BLOCK 65536

TG_TEST(test_cpu_grad_norm_blocks) {
    const int64_t n = 2 * BLOCK + 1000;
    float *g = malloc(sizeof *g * (size_t)n);
    REQUIRE(g, "memory");
    tg_test_fill_uniform(g, n, 77, -1.0f, 1.0f);
    double want = 0;
    for (int64_t b0 = 0; b0 < n; b0 += BLOCK) {
        double s = 0;
        for (int64_t i = b0; i < n && i < b0 + BLOCK; i++) s += (double)g[i] * g[i];
        want += s;
    }
    tg_tensor t;
    memset(&t, 0, sizeof t);
    t.ndim = 1, t.shape[0] = n, t.dtype = TG_F32, t.bytes = (uint64_t)n * 4;
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = 1, plan.tensors = &t;
    tg_threadpool *tp = tg_threadpool_create(3);
    for (int threaded = 0; threaded < 2; threaded++) {
        tg_op op = tg_test_op(TG_OP_GRAD_NORM);
        op.in[0] = 0;
        float norm = -1;
        atomic_int oom = 0;
        tg_cpu_op_args a = {.op = &op, .in = {g}, .out = {&norm}, .plan = &plan, .threads = threaded ? tp : NULL,
                            .out_of_memory = &oom};
        tg_cpu_op_run(&a);
        CHECK(norm == (float)sqrt(want) && !oom, "threads %d: norm %.9g, want %.9g", threaded, norm, (float)sqrt(want));
    }
    tg_threadpool_destroy(tp);
    free(g);
}

enum { NP = 20 };

typedef struct adam_setup {
    float beta1, beta2, eps, wd, lr, t, norm, max_norm;
} adam_setup;

/* One AdamW step of element i (state k), as the kernel writes it. */
static void adam_ref(const adam_setup *s, float clip, int decay, const float *g, float *p, float *m, float *v, int64_t i,
                     int64_t k) {
    const double bc1 = 1.0 - pow(s->beta1, s->t), bc2 = 1.0 - pow(s->beta2, s->t);
    const float step_size = (float)(s->lr / bc1), sqrt_bc2 = (float)sqrt(bc2);
    const float dec = decay ? s->lr * s->wd : 0.0f;
    float gi = g[i] * clip;
    float pi = p[i] - dec * p[i];
    float mi = s->beta1 * m[k] + (1.0f - s->beta1) * gi;
    float vi = s->beta2 * v[k] + (1.0f - s->beta2) * gi * gi;
    m[k] = mi, v[k] = vi;
    p[i] = pi - step_size * mi / (sqrtf(vi) / sqrt_bc2 + s->eps);
}

static int close_to(float got, float want) { return fabsf(got - want) <= 1e-6f * fmaxf(1.0f, fabsf(want)); }

TG_TEST(test_cpu_adamw_segments_clip_copies_and_slice) {
    /* Tensors: p1 elements [0,5) decayed; p2 [8,14) not decayed; a whole-pool view and a
     * frozen tensor over the same bytes (neither updated); p3 [16,19) decayed. Elements
     * 5..7, 14, 15 and 19 belong to no parameter. */
    tg_tensor tt[5];
    memset(tt, 0, sizeof tt);
    const struct {
        uint64_t first;
        int64_t n;
        unsigned flags;
    } spec[5] = {{0, 5, TG_TENSOR_PARAM},
                 {8, 6, TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY},
                 {0, NP, TG_TENSOR_PARAM | TG_TENSOR_VIEW},
                 {0, NP, TG_TENSOR_FROZEN},
                 {16, 3, TG_TENSOR_PARAM}};
    for (int i = 0; i < 5; i++) {
        tt[i].ndim = 1, tt[i].shape[0] = spec[i].n, tt[i].dtype = TG_F32, tt[i].offset = spec[i].first * 4;
        tt[i].bytes = (uint64_t)spec[i].n * 4, tt[i].flags = spec[i].flags;
    }
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = 5, plan.tensors = tt;
    const adam_setup s = {0.9f, 0.99f, 0.01f, 0.1f, 0.05f, 3.0f, 2.5f, 1.0f};
    const float clip = (float)fmin(1.0, (double)s.max_norm / (s.norm + 1e-6));
    tg_threadpool *tp = tg_threadpool_create(3);
    for (int threaded = 0; threaded < 2; threaded++)
        for (int sliced = 0; sliced < 2; sliced++) {
            /* ZeRO-1: replica 1 of slices of 8 updates elements [8, 16); its state starts there. */
            const int64_t lo = sliced ? 8 : 0, hi = sliced ? 16 : NP;
            float g[NP], p[NP], m[NP], v[NP], copy[NP], wp[NP], wm[NP], wv[NP];
            tg_test_fill_uniform(g, NP, 5, -2.0f, 2.0f);
            tg_test_fill_uniform(p, NP, 6, -1.0f, 1.0f);
            tg_test_fill_uniform(m, NP, 7, -0.1f, 0.1f);
            tg_test_fill_uniform(v, NP, 8, 0.0f, 0.2f);
            for (int i = 0; i < NP; i++) copy[i] = -7.0f;
            memcpy(wp, p, sizeof p), memcpy(wm, m, sizeof m), memcpy(wv, v, sizeof v);
            for (int i = 0; i < 5; i++) {
                if (spec[i].flags != TG_TENSOR_PARAM && spec[i].flags != (TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY)) continue;
                for (int64_t e = (int64_t)spec[i].first; e < (int64_t)spec[i].first + spec[i].n; e++)
                    if (e >= lo && e < hi)
                        adam_ref(&s, clip, !(spec[i].flags & TG_TENSOR_NO_DECAY), g, wp, wm, wv, e, e - lo);
            }
            tg_op op = tg_test_op(TG_OP_ADAMW);
            op.p.adamw.beta1 = s.beta1, op.p.adamw.beta2 = s.beta2, op.p.adamw.eps = s.eps;
            op.p.adamw.weight_decay = s.wd, op.p.adamw.max_grad_norm = s.max_norm;
            op.p.adamw.zero_slice = sliced ? 8 : 0;
            float lr = s.lr, t = s.t, norm = s.norm;
            atomic_int oom = 0;
            tg_cpu_op_args a = {.op = &op, .in = {g, &lr, &t, &norm}, .out = {p, m, v, copy}, .plan = &plan,
                                .threads = threaded ? tp : NULL, .rank = sliced, .out_of_memory = &oom};
            tg_cpu_op_run(&a);
            int bad = 0;
            for (int64_t i = 0; i < NP; i++) {
                const int updated = i >= lo && i < hi && ((i < 5) || (i >= 8 && i < 14) || (i >= 16 && i < 19));
                const int ok = updated ? close_to(p[i], wp[i]) && copy[i] == p[i] : p[i] == wp[i] && copy[i] == -7.0f;
                if (!ok && bad++ < 3)
                    CHECK(0, "threads %d slice %d: element %lld is %.9g (copy %.9g), want %.9g", threaded, sliced,
                          (long long)i, p[i], copy[i], wp[i]);
            }
            for (int64_t k = 0; k < NP; k++)
                if (!(close_to(m[k], wm[k]) && close_to(v[k], wv[k])) && bad++ < 6)
                    CHECK(0, "threads %d slice %d: state %lld m %.9g v %.9g, want %.9g %.9g", threaded, sliced,
                          (long long)k, m[k], v[k], wm[k], wv[k]);
            CHECK(!bad && !oom, "threads %d slice %d: %d elements wrong", threaded, sliced, bad);
        }
    /* No clipping where the norm is under the limit: the gradient as it is. */
    {
        float g[NP], p[NP], m[NP] = {0}, v[NP] = {0}, wp[NP], wm[NP] = {0}, wv[NP] = {0};
        tg_test_fill_uniform(g, NP, 9, -2.0f, 2.0f);
        tg_test_fill_uniform(p, NP, 10, -1.0f, 1.0f);
        memcpy(wp, p, sizeof p);
        adam_setup u = s;
        u.norm = 0.5f;
        for (int64_t e = 0; e < 5; e++) adam_ref(&u, 1.0f, 1, g, wp, wm, wv, e, e);
        tg_op op = tg_test_op(TG_OP_ADAMW);
        op.p.adamw.beta1 = u.beta1, op.p.adamw.beta2 = u.beta2, op.p.adamw.eps = u.eps;
        op.p.adamw.weight_decay = u.wd, op.p.adamw.max_grad_norm = u.max_norm;
        float lr = u.lr, t = u.t, norm = u.norm;
        plan.n_tensors = 1;
        tg_cpu_op_args a = {.op = &op, .in = {g, &lr, &t, &norm}, .out = {p, m, v}, .plan = &plan};
        tg_cpu_op_run(&a);
        int ok = 1;
        for (int i = 0; i < NP; i++) ok &= i < 5 ? close_to(p[i], wp[i]) : p[i] == wp[i];
        CHECK(ok, "norm under the limit: p[0] %.9g, want %.9g", p[0], wp[0]);
    }
    tg_threadpool_destroy(tp);
}

TG_TEST(test_cpu_lr_schedule_ends) {
    const struct {
        int warmup;
        float step, total, lr;
    } cases[] = {
        {0, 0, 10, 0.5f},         /* no warmup: the full rate at step 0 */
        {0, 5, 10, 0.25f},        /* halfway down */
        {4, 0, 10, 0.0f},         /* warmup starts at 0 */
        {4, 1, 10, 0.125f},       /* a quarter of the way up */
        {4, 4, 10, 0.5f},         /* warmup's end: the full rate */
        {4, 10, 10, 0.0f},        /* the last step */
        {4, 12, 10, 0.0f},        /* past the end: 0, never negative */
        {4, 4, 4, 0.0f},          /* warmup as long as the run */
        {1, 0, 1, 0.0f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_op op = tg_test_op(TG_OP_SCHEDULE);
        op.p.schedule.warmup = cases[i].warmup, op.p.schedule.lr = 0.5f;
        float step = cases[i].step, total = cases[i].total, lr = -1, next = -1;
        tg_cpu_op_args a = {.op = &op, .in = {&step, &total}, .out = {&lr, &next}};
        tg_cpu_op_run(&a);
        CHECK(lr == cases[i].lr && next == cases[i].step + 1, "warmup %d step %g of %g: lr %.9g (want %g), next %g",
              cases[i].warmup, cases[i].step, cases[i].total, lr, cases[i].lr, next);
    }
}
