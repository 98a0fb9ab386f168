/* Op-level tests of the CPU reference (runtime/cpu/), its executor and thread pool.
 *
 * Gradients are checked against central finite differences of L = sum(r * forward(x)) for
 * a random projection r, with the forward run in fp32 and L accumulated in double. With
 * eps = 1e-2 the truncation error is ~eps^2 * f''' / 6 ~ 1e-5, and fp32 rounding noise in
 * L (~1e-6 for these sizes) divided by 2*eps adds ~1e-4 at worst; the largest error
 * observed over all checks is 3e-5. The bound |fd - g| <= 1e-3 * max(1, |g|) keeps a
 * 30x margin over that, while a real mistake (a wrong sign, scale, index or missing term)
 * gives errors of order 1e-2 or more (a 3% error is shown to be rejected). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.h"
#include "base/bf16.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/threadpool.h"
#include "tests/harness.h"
#include "tests/op_fixtures.h"

#define GRAD_EPS 1e-2
#define GRAD_TOL 1e-3

/* ---- helpers ------------------------------------------------------------------------ */



static int64_t count_nan(const float *x, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += isnan(x[i]) != 0;
    return c;
}

static double dot(const float *r, const float *y, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)r[i] * y[i];
    return s;
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* L(ctx) reruns the forward with the current inputs and returns sum(r * y). */
typedef double (*loss_fn)(void *ctx);

/* Largest |fd - g| / max(1, |g|) over about 48 sampled elements of x; *gnorm gets the
 * analytic gradient's sampled L1 norm. */
static double fd_error(loss_fn L, void *ctx, float *x, int64_t n, const float *g, double *gnorm,
                       int64_t *worst) {
    int64_t stride = n > 48 ? n / 48 : 1;
    double max_err = 0;
    *gnorm = 0;
    *worst = -1;
    for (int64_t i = stride / 2; i < n; i += stride) {
        float x0 = x[i];
        float xp = (float)(x0 + GRAD_EPS), xm = (float)(x0 - GRAD_EPS);
        x[i] = xp;
        double lp = L(ctx);
        x[i] = xm;
        double lm = L(ctx);
        x[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double err = fabs(fd - g[i]) / fmax(1.0, fabs(g[i]));
        if (!(err <= max_err)) { /* also catches NaN */
            max_err = err;
            *worst = i;
        }
        *gnorm += fabs(g[i]);
    }
    return max_err;
}

static void grad_check(const char *what, loss_fn L, void *ctx, float *x, int64_t n,
                       const float *g) {
    double gnorm;
    int64_t worst;
    double err = fd_error(L, ctx, x, n, g, &gnorm, &worst);
    CHECK(err <= GRAD_TOL, "%s: finite-difference mismatch %.3g at element %lld (analytic %g)",
          what, err, (long long)worst, worst >= 0 ? g[worst] : 0.0);
    CHECK(gnorm > 0, "%s: the analytic gradient is zero on every sampled element", what);
}

/* ---- thread pool, Philox ------------------------------------------------------------- */

typedef struct visit_ctx {
    int *count;
    tg_threadpool *nested;
} visit_ctx;

static void visit(void *p, int64_t b, int64_t e) {
    visit_ctx *c = p;
    for (int64_t i = b; i < e; i++) c->count[i]++;
}

static void visit_nested(void *p, int64_t b, int64_t e) {
    visit_ctx *c = p;
    /* A parallel_for from inside a chunk must run (inline) rather than deadlock. */
    visit_ctx inner = {c->count + b, NULL};
    tg_parallel_for(c->nested, e - b, visit, &inner);
}

TG_TEST(test_op_threadpool) {
    tg_threadpool *tp1 = tg_threadpool_create(1), *tp4 = tg_threadpool_create(4);
    REQUIRE(tp1 && tp4, "pool creation failed");
    CHECK(tg_threadpool_size(tp4) == 4 && tg_threadpool_size(tp1) == 1 &&
              tg_threadpool_size(NULL) == 1,
          "pool sizes %d %d", tg_threadpool_size(tp4), tg_threadpool_size(tp1));
    tg_threadpool *pools[3] = {NULL, tp1, tp4};
    const int64_t sizes[] = {0, 1, 2, 3, 5, 1001};
    int count[1001];
    for (int p = 0; p < 3; p++)
        for (int s = 0; s < 6; s++)
            for (int rep = 0; rep < 20; rep++) {
                memset(count, 0, sizeof count);
                visit_ctx c = {count, NULL};
                tg_parallel_for(pools[p], sizes[s], visit, &c);
                int bad = 0;
                for (int64_t i = 0; i < 1001; i++) bad += count[i] != (i < sizes[s]);
                CHECK(!bad, "pool %d n=%lld: %d indices not visited exactly once", p,
                      (long long)sizes[s], bad);
            }
    memset(count, 0, sizeof count);
    visit_ctx c = {count, tp4};
    tg_parallel_for(tp4, 1001, visit_nested, &c);
    int bad = 0;
    for (int i = 0; i < 1001; i++) bad += count[i] != 1;
    CHECK(!bad, "nested parallel_for: %d indices not visited exactly once", bad);
    tg_threadpool_destroy(tp1);
    tg_threadpool_destroy(tp4);
}

TG_TEST(test_op_philox) {
    /* Random123's published known-answer vectors for Philox4x32-10. */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t out[4];
        tg_philox4x32_10(kat[v], kat[v] + 4, out);
        CHECK(!memcmp(out, kat[v] + 6, sizeof out), "KAT %d: got %08x %08x %08x %08x", v,
              out[0], out[1], out[2], out[3]);
    }
    double sum = 0;
    int out_of_range = 0, lane_mismatch = 0;
    for (uint64_t e = 0; e < 100000; e++) {
        float u = tg_philox_uniform(42, 3, 7, e);
        out_of_range += !(u >= 0.0f && u < 1.0f);
        sum += u;
        float u4[4];
        tg_philox_uniform4(42, 3, 7, e / 4, u4);
        lane_mismatch += u4[e % 4] != u;
    }
    CHECK(!out_of_range, "%d values outside [0,1)", out_of_range);
    CHECK(!lane_mismatch, "%d elements differ between uniform and uniform4", lane_mismatch);
    CHECK(fabs(sum / 100000 - 0.5) < 0.005, "mean %g, expected 0.5", sum / 100000);
    CHECK(tg_philox_uniform(42, 3, 7, 5) != tg_philox_uniform(43, 3, 7, 5) &&
              tg_philox_uniform(42, 3, 7, 5) != tg_philox_uniform(42, 3, 7, 6),
          "seed or element does not change the value");
}

/* Dropout's draws (kernels/philox.h): element e is half e & 1 of word (e >> 1) & 3 of
 * Philox block e >> 3, a multiple of 2^-16 in [0, 1); uniform4 hands out the same values;
 * the mean is 1/2. */
TG_TEST(test_op_dropout_uniforms) {
    double sum = 0;
    int bad = 0;
    for (uint64_t e = 0; e < 100000; e++) {
        uint32_t w[4];
        tg_philox_block(42, 3, 7, e >> 3, w);
        const uint32_t k = (w[(e >> 1) & 3] >> (16 * (e & 1))) & 0xffffu;
        const float u = tg_dropout_uniform(42, 3, 7, e);
        float u4[4];
        tg_dropout_uniform4(42, 3, 7, e / 4, u4);
        bad += u != (float)k / 65536.0f || u4[e % 4] != u || tg_dropout_bits16(w, e) != k;
        sum += u;
    }
    CHECK(!bad, "%d elements differ from the layout", bad);
    CHECK(fabs(sum / 100000 - 0.5) < 0.005, "mean %g, expected 0.5", sum / 100000);
}

/* The kernels' integer keep test (16 bits >= threshold) agrees with uniform >= p for the
 * integers around each threshold, at dropout rates the jobs use and at awkward ones. */
TG_TEST(test_op_dropout_keep_threshold) {
    const float ps[] = {0.0f, 0.1f, 0.15f, 0.2f, 0.3f, 0.5f, 0.9f, 1.0f / 3.0f, 0x1p-16f, 0x1.8p-16f,
                        0x1p-24f, 1.0f - 0x1p-16f, 0.99999994f};
    int bad = 0;
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        const uint32_t t = tg_dropout_keep_threshold(ps[i]);
        const int64_t centre = (int64_t)((double)ps[i] * 65536.0);
        for (int64_t n = centre - 3; n <= centre + 3; n++) {
            if (n < 0 || n >= (1 << 16)) continue;
            const float u = (float)(uint32_t)n * (1.0f / 65536.0f); /* tg_dropout_uniform's value */
            if ((u >= ps[i]) != ((uint32_t)n >= t)) {
                bad++;
                fprintf(stderr, "    p %a n %lld: float test %d, threshold %u\n", ps[i], (long long)n, u >= ps[i], t);
            }
        }
    }
    CHECK(tg_dropout_keep_threshold(0.1f) == 6554u, "p 0.1: threshold %u, expected 6554",
          tg_dropout_keep_threshold(0.1f));
    CHECK(tg_dropout_keep_threshold(0.5f) == 32768u, "p 0.5: threshold %u, expected 2^15",
          tg_dropout_keep_threshold(0.5f));
    CHECK(!bad, "%d disagreements", bad);
}

/* ---- fill, add ------------------------------------------------------------------------ */

TG_TEST(test_op_zero_fill) {
    float buf[11];
    for (int i = 0; i < 11; i++) buf[i] = NAN;
    buf[10] = 7.0f; /* guard past the output */
    tg_op op = tg_test_op(TG_OP_ZERO);
    tg_cpu_op_args a = {.op = &op, .out = {buf}, .out_numel = {10}};
    tg_cpu_op_run(&a);
    int bad = 0;
    for (int i = 0; i < 10; i++) bad += buf[i] != 0.0f;
    CHECK(!bad && buf[10] == 7.0f, "zero: %d wrong elements, guard %g", bad, buf[10]);
    op = tg_test_op(TG_OP_FILL);
    op.p.fill.value = -1.25f;
    tg_cpu_op_run(&a);
    bad = 0;
    for (int i = 0; i < 10; i++) bad += buf[i] != -1.25f;
    CHECK(!bad && buf[10] == 7.0f, "fill: %d wrong elements, guard %g", bad, buf[10]);
}

typedef struct add_ctx {
    float *a, *b, *y, *r;
    int64_t n;
} add_ctx;

static double add_loss(void *p) {
    add_ctx *c = p;
    tg_op op = tg_test_op(TG_OP_ADD);
    op.p.count.n = c->n;
    tg_cpu_op_args a = {.op = &op, .in = {c->a, c->b}, .out = {c->y}};
    tg_cpu_op_run(&a);
    return dot(c->r, c->y, c->n);
}

TG_TEST(test_op_add_grad) {
    int64_t n = 40000; /* several parallel blocks */
    add_ctx c = {frand(n, 1, -1, 1), frand(n, 2, -1, 1), fconst(n, NAN), frand(n, 3, -1, 1), n};
    tg_op op = tg_test_op(TG_OP_ADD);
    op.p.count.n = n;
    tg_cpu_op_args a = {.op = &op, .in = {c.a, c.b}, .out = {c.y}, .threads = pool3()};
    tg_cpu_op_run(&a);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += c.y[i] != c.a[i] + c.b[i];
    CHECK(!bad, "%d sums wrong or unwritten", bad);
    /* The backward of ADD passes dy = r to both operands. */
    grad_check("add d/da", add_loss, &c, c.a, 64, c.r);
    grad_check("add d/db", add_loss, &c, c.b, 64, c.r);
    free(c.a), free(c.b), free(c.y), free(c.r);
}

/* ---- matmul -------------------------------------------------------------------------- */

typedef struct mm_case {
    int64_t M, N, K, batch;
    int ta, tb, acc;
    float alpha;
} mm_case;

static void run_matmul(const mm_case *m, const float *A, const float *B, const float *bias,
                       float *C, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.p.matmul = (tg_matmul_params){.m = m->M, .n = m->N, .k = m->K, .trans_a = m->ta, .trans_b = m->tb,
                                     .batch = m->batch, .accumulate = m->acc, .alpha = m->alpha};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B, (void *)bias}, .out = {C},
                        .threads = tp};
    tg_cpu_op_run(&a);
}

/* The definition, in double: C[b] = alpha op(A[b]) op(B[b]) + bias (+ C[b]). */
static void naive_matmul(const mm_case *m, const float *A, const float *B, const float *bias,
                         float *C) {
    int64_t M = m->M, N = m->N, K = m->K;
    for (int64_t b = 0; b < m->batch; b++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) {
                    double av = m->ta ? A[b * M * K + k * M + i] : A[b * M * K + i * K + k];
                    double bv = m->tb ? B[b * K * N + j * K + k] : B[b * K * N + k * N + j];
                    s += av * bv;
                }
                float *c = &C[b * M * N + i * N + j];
                double v = m->alpha * s + (bias ? bias[j] : 0.0);
                *c = (float)(m->acc ? *c + v : v);
            }
}

TG_TEST(test_op_matmul_naive) {
    const int64_t shapes[3][4] = {{37, 29, 53, 3}, {1, 7, 5, 1}, {130, 70, 300, 1}};
    for (int s = 0; s < 3; s++)
        for (int combo = 0; combo < 16; combo++) {
            mm_case m = {shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3],
                         combo & 1, (combo >> 1) & 1, (combo >> 2) & 1, 0.75f};
            int with_bias = (combo >> 3) & 1;
            int64_t nA = m.batch * m.M * m.K, nB = m.batch * m.K * m.N, nC = m.batch * m.M * m.N;
            float *A = frand(nA, 10 + combo, -1, 1), *B = frand(nB, 20 + combo, -1, 1);
            float *bias = with_bias ? frand(m.N, 30, -1, 1) : NULL;
            float *C = m.acc ? frand(nC, 40, -1, 1) : fconst(nC, NAN);
            float *Cp = falloc(nC), *ref = falloc(nC);
            memcpy(Cp, C, (size_t)nC * 4);
            memcpy(ref, C, (size_t)nC * 4);
            run_matmul(&m, A, B, bias, C, NULL);
            run_matmul(&m, A, B, bias, Cp, pool3());
            naive_matmul(&m, A, B, bias, ref);
            double err = tg_rel_err(C, ref, nC);
            CHECK(err < 1e-5, "M=%lld N=%lld K=%lld batch=%lld ta=%d tb=%d acc=%d bias=%d: "
                              "rel err %.3g vs naive",
                  (long long)m.M, (long long)m.N, (long long)m.K, (long long)m.batch, m.ta,
                  m.tb, m.acc, with_bias, err);
            CHECK(!memcmp(C, Cp, (size_t)nC * 4), "ta=%d tb=%d: threaded result differs", m.ta,
                  m.tb);
            free(A), free(B), free(bias), free(C), free(Cp), free(ref);
        }
}

typedef struct mmg_ctx {
    mm_case m;
    float *A, *B, *bias, *C, *r;
} mmg_ctx;

static double matmul_loss(void *p) {
    mmg_ctx *c = p;
    run_matmul(&c->m, c->A, c->B, c->bias, c->C, NULL);
    return dot(c->r, c->C, c->m.batch * c->m.M * c->m.N);
}

TG_TEST(test_op_matmul_grad) {
    for (int combo = 0; combo < 4; combo++) {
        int ta = combo & 1, tb = combo >> 1;
        mmg_ctx c = {.m = {5, 7, 6, 2, ta, tb, 0, 0.5f}};
        int64_t M = 5, N = 7, K = 6, batch = 2;
        c.A = frand(batch * M * K, 1 + combo, -1, 1);
        c.B = frand(batch * K * N, 5 + combo, -1, 1);
        c.bias = frand(N, 9, -1, 1);
        c.C = falloc(batch * M * N);
        c.r = frand(batch * M * N, 11, -1, 1);
        float *dA = fconst(batch * M * K, NAN), *dB = fconst(batch * K * N, NAN);
        float *dbias = fconst(N, 0.0f);
        /* dop(A) = alpha dC op(B)^T and dop(B) = alpha op(A)^T dC, written as MATMULs on
         * the stored layouts. */
        mm_case ga = ta ? (mm_case){K, M, N, batch, tb, 1, 0, 0.5f}
                        : (mm_case){M, K, N, batch, 0, !tb, 0, 0.5f};
        if (ta)
            run_matmul(&ga, c.B, c.r, NULL, dA, pool3());
        else
            run_matmul(&ga, c.r, c.B, NULL, dA, pool3());
        mm_case gb = tb ? (mm_case){N, K, M, batch, 1, ta, 0, 0.5f}
                        : (mm_case){K, N, M, batch, !ta, 0, 0, 0.5f};
        if (tb)
            run_matmul(&gb, c.r, c.A, NULL, dB, pool3());
        else
            run_matmul(&gb, c.A, c.r, NULL, dB, pool3());
        tg_op bg = tg_test_op(TG_OP_BIAS_GRAD);
        bg.p.bias_grad.m = batch * M, bg.p.bias_grad.n = N;
        tg_cpu_op_args a = {.op = &bg, .in = {c.r}, .out = {dbias}, .threads = pool3()};
        tg_cpu_op_run(&a);
        char what[64];
        snprintf(what, sizeof what, "matmul ta=%d tb=%d dA", ta, tb);
        grad_check(what, matmul_loss, &c, c.A, batch * M * K, dA);
        snprintf(what, sizeof what, "matmul ta=%d tb=%d dB", ta, tb);
        grad_check(what, matmul_loss, &c, c.B, batch * K * N, dB);
        snprintf(what, sizeof what, "matmul ta=%d tb=%d dbias (bias_grad)", ta, tb);
        grad_check(what, matmul_loss, &c, c.bias, N, dbias);
        if (combo == 0) {
            /* Control: the checker must reject a gradient that is off by 3%. */
            double gnorm;
            int64_t worst;
            for (int64_t i = 0; i < batch * M * K; i++) dA[i] *= 1.03f;
            double err = fd_error(matmul_loss, &c, c.A, batch * M * K, dA, &gnorm, &worst);
            CHECK(err > GRAD_TOL, "the gradient check accepted a gradient off by 3%% (%.3g)", err);
        }
        free(c.A), free(c.B), free(c.bias), free(c.C), free(c.r), free(dA), free(dB), free(dbias);
    }
}

TG_TEST(test_op_bias_grad_accumulates) {
    int64_t M = 300, N = 13;
    float *dy = frand(M * N, 3, -1, 1), *db = frand(N, 4, -1, 1), *db0 = falloc(N);
    memcpy(db0, db, (size_t)N * 4);
    tg_op op = tg_test_op(TG_OP_BIAS_GRAD);
    op.p.bias_grad.m = M, op.p.bias_grad.n = N;
    tg_cpu_op_args a = {.op = &op, .in = {dy}, .out = {db}, .threads = pool3()};
    tg_cpu_op_run(&a);
    double worst = 0;
    for (int64_t j = 0; j < N; j++) {
        double s = db0[j];
        for (int64_t m = 0; m < M; m++) s += dy[m * N + j];
        worst = fmax(worst, fabs(s - db[j]));
    }
    CHECK(worst < 1e-4, "bias_grad += column sums: max error %g", worst);
    free(dy), free(db), free(db0);
}

/* MATMUL's fused bias gradient (bias_grad) against BIAS_GRAD on the same dC: dW = dC^T X with
 * dC as A stored [K,M] (bias_grad = 1, nn.Linear) and dW = X^T dC with dC as B stored [K,N]
 * (bias_grad = 2, Conv1D). The same sums in the same order, so the same bits as BIAS_GRAD into
 * a zeroed gradient; out1 is overwritten (it starts as NaN) and out0 is the plain product. */
TG_TEST(test_op_matmul_fused_bias_grad) {
    const int64_t shapes[3][2] = {{300, 13}, {7, 1}, {130, 70}}; /* rows of dC (K), its width */
    for (int s = 0; s < 3; s++)
        for (int which = 1; which <= 2; which++)
            for (int threaded = 0; threaded < 2; threaded++) {
                int64_t rows = shapes[s][0], width = shapes[s][1], other = 9;
                /* bias_grad = 1: M = width, N = other; 2: M = other, N = width; K = rows. */
                mm_case m = which == 1 ? (mm_case){width, other, rows, 1, 1, 0, 0, 0.5f}
                                       : (mm_case){other, width, rows, 1, 1, 0, 0, 0.5f};
                float *dc = frand(rows * width, 50 + s, -1, 1), *x = frand(rows * other, 60 + s, -1, 1);
                const float *A = which == 1 ? dc : x, *B = which == 1 ? x : dc;
                int64_t nC = m.M * m.N;
                float *C = fconst(nC, NAN), *ref = fconst(nC, NAN);
                float *db = fconst(width, NAN), *db_ref = fconst(width, 0.0f);
                tg_threadpool *tp = threaded ? pool3() : NULL;
                tg_op op = tg_test_op(TG_OP_MATMUL);
                op.p.matmul = (tg_matmul_params){.m = m.M, .n = m.N, .k = m.K, .trans_a = m.ta, .trans_b = m.tb,
                                                 .batch = 1, .bias_grad = which, .alpha = m.alpha};
                tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B}, .out = {C, db}, .threads = tp};
                tg_cpu_op_run(&a);
                run_matmul(&m, A, B, NULL, ref, tp);
                tg_op bg = tg_test_op(TG_OP_BIAS_GRAD);
                bg.p.bias_grad.m = rows, bg.p.bias_grad.n = width;
                tg_cpu_op_args ba = {.op = &bg, .in = {dc}, .out = {db_ref}, .threads = tp};
                tg_cpu_op_run(&ba);
                CHECK(!memcmp(C, ref, (size_t)nC * 4), "bias_grad=%d %lldx%lld threads=%d: the product changed", which,
                      (long long)rows, (long long)width, threaded);
                CHECK(!memcmp(db, db_ref, (size_t)width * 4) && !count_nan(db, width),
                      "bias_grad=%d %lldx%lld threads=%d: bias gradient differs from bias_grad by %.3g", which,
                      (long long)rows, (long long)width, threaded, max_abs_diff(db, db_ref, width));
                /* Overwritten, not accumulated: a second run gives the same values. */
                tg_cpu_op_run(&a);
                CHECK(!memcmp(db, db_ref, (size_t)width * 4), "bias_grad=%d: the bias gradient accumulated", which);
                free(dc), free(x), free(C), free(ref), free(db), free(db_ref);
            }
}

/* MATMUL's GELU epilogues (activation) against the separate ops on the same inputs, bit for
 * bit: activation = 1 is MATMUL (+ bias) then GELU (tanh), its out2 the plain product; 2 is
 * MATMUL then GELU_BWD at the saved pre-activation in3. Outputs start as NaN. */
static void run_matmul_act(const mm_case *m, int act, const float *A, const float *B, const float *bias,
                           const float *pre_in, float *C, float *pre_out, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.p.matmul = (tg_matmul_params){.m = m->M, .n = m->N, .k = m->K, .trans_a = m->ta, .trans_b = m->tb,
                                     .batch = 1, .activation = act, .alpha = m->alpha};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B, (void *)bias, (void *)pre_in},
                        .out = {C, NULL, pre_out}, .threads = tp};
    tg_cpu_op_run(&a);
}

static void run_gelu_op(int kind, int64_t n, const float *in0, const float *in1, float *out) {
    tg_op op = tg_test_op(kind);
    if (kind == TG_OP_GELU)
        op.p.gelu = (tg_gelu_params){.n = n, .form = TG_GELU_TANH};
    else
        op.p.gelu_bwd = (tg_gelu_bwd_params){.n = n, .form = TG_GELU_TANH};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)in0, (void *)in1}, .out = {out}, .threads = pool3()};
    tg_cpu_op_run(&a);
}

TG_TEST(test_op_matmul_gelu_epilogue) {
    const int64_t shapes[3][3] = {{37, 29, 53}, {1, 7, 5}, {130, 70, 300}};
    for (int s = 0; s < 3; s++)
        for (int combo = 0; combo < 8; combo++)
            for (int threaded = 0; threaded < 2; threaded++) {
                mm_case m = {shapes[s][0], shapes[s][1], shapes[s][2], 1, combo & 1, (combo >> 1) & 1, 0, 0.75f};
                int with_bias = (combo >> 2) & 1;
                int64_t nA = m.M * m.K, nB = m.K * m.N, nC = m.M * m.N;
                tg_threadpool *tp = threaded ? pool3() : NULL;
                float *A = frand(nA, 70 + combo, -2, 2), *B = frand(nB, 80 + combo, -2, 2);
                float *bias = with_bias ? frand(m.N, 90, -1, 1) : NULL;
                /* Forward: gelu(product + bias), and the product + bias kept. */
                float *act = fconst(nC, NAN), *pre = fconst(nC, NAN), *ref_pre = fconst(nC, NAN), *ref = fconst(nC, NAN);
                run_matmul_act(&m, TG_MATMUL_ACT_GELU, A, B, bias, NULL, act, pre, tp);
                run_matmul(&m, A, B, bias, ref_pre, tp);
                run_gelu_op(TG_OP_GELU, nC, ref_pre, NULL, ref);
                CHECK(!memcmp(pre, ref_pre, (size_t)nC * 4) && !memcmp(act, ref, (size_t)nC * 4),
                      "gelu epilogue M=%lld N=%lld K=%lld ta=%d tb=%d bias=%d threads=%d: differs from matmul + gelu "
                      "by %.3g (pre-activation %.3g)",
                      (long long)m.M, (long long)m.N, (long long)m.K, m.ta, m.tb, with_bias, threaded,
                      max_abs_diff(act, ref, nC), max_abs_diff(pre, ref_pre, nC));
                /* Backward: product * gelu'(saved), against matmul then gelu_bwd. */
                float *saved = frand(nC, 100 + combo, -4, 4), *dx = fconst(nC, NAN), *prod = fconst(nC, NAN);
                float *dx_ref = fconst(nC, NAN);
                run_matmul_act(&m, TG_MATMUL_ACT_GELU_BWD, A, B, NULL, saved, dx, NULL, tp);
                run_matmul(&m, A, B, NULL, prod, tp);
                run_gelu_op(TG_OP_GELU_BWD, nC, prod, saved, dx_ref);
                CHECK(!memcmp(dx, dx_ref, (size_t)nC * 4), "gelu backward epilogue M=%lld ta=%d tb=%d threads=%d: "
                      "differs from matmul + gelu_bwd by %.3g", (long long)m.M, m.ta, m.tb, threaded,
                      max_abs_diff(dx, dx_ref, nC));
                free(A), free(B), free(bias), free(act), free(pre), free(ref_pre), free(ref);
                free(saved), free(dx), free(prod), free(dx_ref);
            }
}

/* A GPT-2 MLP as the compiler emits it with fuse_gelu: h = gelu(X W1 + b1) (activation 1,
 * keeping pre), y = h W2; L = sum(r * y). Its backward: dPre = (r W2^T) * gelu'(pre) as one
 * matmul (activation 2), then dX = dPre W1^T, dW1 = X^T dPre, db1 = column sums of dPre; each
 * against finite differences of the fused forward. */
typedef struct mlp_ctx {
    int64_t N, D, F;
    float *X, *W1, *b1, *W2, *pre, *h, *y, *r;
} mlp_ctx;

static double mlp_loss(void *p) {
    mlp_ctx *c = p;
    mm_case fc = {c->N, c->F, c->D, 1, 0, 0, 0, 1.0f}, proj = {c->N, c->D, c->F, 1, 0, 0, 0, 1.0f};
    run_matmul_act(&fc, TG_MATMUL_ACT_GELU, c->X, c->W1, c->b1, NULL, c->h, c->pre, NULL);
    run_matmul(&proj, c->h, c->W2, NULL, c->y, NULL);
    return dot(c->r, c->y, c->N * c->D);
}

TG_TEST(test_op_matmul_gelu_epilogue_grad) {
    mlp_ctx c = {.N = 6, .D = 5, .F = 12};
    int64_t N = c.N, D = c.D, F = c.F;
    c.X = frand(N * D, 1, -1, 1), c.W1 = frand(D * F, 2, -1, 1), c.b1 = frand(F, 3, -0.5f, 0.5f);
    c.W2 = frand(F * D, 4, -1, 1), c.r = frand(N * D, 5, -1, 1);
    c.pre = falloc(N * F), c.h = falloc(N * F), c.y = falloc(N * D);
    mlp_loss(&c);
    float *dpre = fconst(N * F, NAN), *dX = fconst(N * D, NAN), *dW1 = fconst(D * F, NAN), *db1 = fconst(F, 0.0f);
    mm_case dh = {N, F, D, 1, 0, 1, 0, 1.0f}; /* dPre[N,F] = r[N,D] @ W2[F,D]^T, then * gelu'(pre) */
    run_matmul_act(&dh, TG_MATMUL_ACT_GELU_BWD, c.r, c.W2, NULL, c.pre, dpre, NULL, pool3());
    mm_case dx = {N, D, F, 1, 0, 1, 0, 1.0f}, dw = {D, F, N, 1, 1, 0, 0, 1.0f};
    run_matmul(&dx, dpre, c.W1, NULL, dX, pool3());
    run_matmul(&dw, c.X, dpre, NULL, dW1, pool3());
    tg_op bg = tg_test_op(TG_OP_BIAS_GRAD);
    bg.p.bias_grad.m = N, bg.p.bias_grad.n = F;
    tg_cpu_op_args a = {.op = &bg, .in = {dpre}, .out = {db1}, .threads = pool3()};
    tg_cpu_op_run(&a);
    grad_check("gelu epilogue mlp dX", mlp_loss, &c, c.X, N * D, dX);
    grad_check("gelu epilogue mlp dW1", mlp_loss, &c, c.W1, D * F, dW1);
    grad_check("gelu epilogue mlp db1", mlp_loss, &c, c.b1, F, db1);
    free(c.X), free(c.W1), free(c.b1), free(c.W2), free(c.r), free(c.pre), free(c.h), free(c.y);
    free(dpre), free(dX), free(dW1), free(db1);
}

/* ---- embedding ------------------------------------------------------------------------- */

typedef struct emb_ctx {
    int32_t *ids;
    float *table, *y, *r;
    int64_t N, V, D;
} emb_ctx;

static double emb_loss(void *p) {
    emb_ctx *c = p;
    tg_op op = tg_test_op(TG_OP_EMBEDDING);
    op.p.embedding = (tg_embedding_params){.n = c->N, .vocab = c->V, .dim = c->D};
    tg_cpu_op_args a = {.op = &op, .in = {c->ids, c->table}, .out = {c->y}};
    tg_cpu_op_run(&a);
    return dot(c->r, c->y, c->N * c->D);
}

TG_TEST(test_op_embedding_grad) {
    int32_t ids[9] = {1, 3, 1, 0, 4, 1, 3, 2, 1}; /* row 1 four times, row 5 never */
    emb_ctx c = {ids, frand(6 * 4, 1, -1, 1), fconst(9 * 4, NAN), frand(9 * 4, 2, -1, 1), 9, 6, 4};
    emb_loss(&c);
    int bad = 0;
    for (int n = 0; n < 9; n++)
        for (int d = 0; d < 4; d++) bad += c.y[n * 4 + d] != c.table[ids[n] * 4 + d];
    CHECK(!bad, "embedding: %d wrong elements", bad);

    /* dtable starts non-zero: the op accumulates. */
    float *pre = frand(6 * 4, 3, -1, 1), *dt = falloc(6 * 4), *dt1 = falloc(6 * 4);
    memcpy(dt, pre, sizeof(float) * 24);
    memcpy(dt1, pre, sizeof(float) * 24);
    tg_op op = tg_test_op(TG_OP_EMBEDDING_BWD);
    op.p.embedding = (tg_embedding_params){.n = 9, .vocab = 6, .dim = 4, .padding_idx = -1}; /* no padding index */
    tg_cpu_op_args a = {.op = &op, .in = {ids, c.r}, .out = {dt}, .threads = pool3()};
    tg_cpu_op_run(&a);
    a.out[0] = dt1;
    a.threads = NULL;
    tg_cpu_op_run(&a);
    CHECK(!memcmp(dt, dt1, sizeof(float) * 24), "threaded embedding_bwd differs from inline");
    /* Sequential reference in index order, in float: must match bit for bit. */
    float ref[24];
    memcpy(ref, pre, sizeof ref);
    for (int n = 0; n < 9; n++)
        for (int d = 0; d < 4; d++) ref[ids[n] * 4 + d] += c.r[n * 4 + d];
    CHECK(!memcmp(ref, dt, sizeof ref), "embedding_bwd is not the index-ordered sum");
    float g[24];
    for (int i = 0; i < 24; i++) g[i] = dt[i] - pre[i];
    CHECK(g[5 * 4] == 0.0f && g[5 * 4 + 3] == 0.0f, "unused row got a gradient");
    grad_check("embedding d/dtable", emb_loss, &c, c.table, 24, g);

    /* With padding index 1 (nn.Embedding(padding_idx=1)) row 1 keeps its value; the
     * other rows get exactly the same sums as before. */
    float *dp = falloc(6 * 4);
    memcpy(dp, pre, sizeof(float) * 24);
    op.p.embedding.padding_idx = 1;
    a.out[0] = dp;
    tg_cpu_op_run(&a);
    CHECK(!memcmp(dp + 4, pre + 4, sizeof(float) * 4), "padding row received a gradient");
    CHECK(!memcmp(dp, dt, sizeof(float) * 4) && !memcmp(dp + 8, dt + 8, sizeof(float) * 16),
          "padding index changed other rows");
    free(dp);
    free(c.table), free(c.y), free(c.r), free(pre), free(dt), free(dt1);
}

/* ---- layernorm ------------------------------------------------------------------------- */

typedef struct ln_ctx {
    float *x, *g, *b, *y, *mean, *rstd, *r;
    int64_t M, D;
} ln_ctx;

static void ln_forward(ln_ctx *c, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_LAYERNORM);
    op.p.layernorm = (tg_layernorm_params){.m = c->M, .d = c->D, .eps = 1e-5f};
    tg_cpu_op_args a = {.op = &op, .in = {c->x, c->g, c->b}, .out = {c->y, c->mean, c->rstd},
                        .threads = tp};
    tg_cpu_op_run(&a);
}

static double ln_loss(void *p) {
    ln_ctx *c = p;
    ln_forward(c, NULL);
    return dot(c->r, c->y, c->M * c->D);
}

TG_TEST(test_op_layernorm_grad) {
    int64_t M = 5, D = 12;
    ln_ctx c = {frand(M * D, 1, -2, 2), frand(D, 2, 0.5f, 1.5f), frand(D, 3, -0.5f, 0.5f),
                fconst(M * D, NAN), fconst(M, NAN), fconst(M, NAN), frand(M * D, 4, -1, 1), M, D};
    ln_forward(&c, pool3());
    double worst = 0;
    for (int64_t m = 0; m < M; m++) {
        double mu = 0, var = 0;
        for (int64_t d = 0; d < D; d++) mu += c.x[m * D + d];
        mu /= D;
        for (int64_t d = 0; d < D; d++) var += pow(c.x[m * D + d] - mu, 2);
        double rstd = 1.0 / sqrt(var / D + 1e-5); /* biased variance, as torch */
        worst = fmax(worst, fabs(c.mean[m] - mu) + fabs(c.rstd[m] - rstd) / rstd);
        for (int64_t d = 0; d < D; d++) {
            double y = (c.x[m * D + d] - mu) * rstd * c.g[d] + c.b[d];
            worst = fmax(worst, fabs(c.y[m * D + d] - y));
        }
    }
    CHECK(worst < 1e-5, "layernorm forward vs double reference: max error %g", worst);

    float *dx = fconst(M * D, NAN), *dg = fconst(D, 0.25f), *db = fconst(D, 0.25f);
    tg_op op = tg_test_op(TG_OP_LAYERNORM_BWD);
    op.p.layernorm_bwd.m = M, op.p.layernorm_bwd.d = D;
    tg_cpu_op_args a = {.op = &op, .in = {c.r, c.x, c.g, c.mean, c.rstd}, .out = {dx, dg, db},
                        .threads = pool3()};
    tg_cpu_op_run(&a);
    CHECK(count_nan(dx, M * D) == 0, "dx not fully written");
    for (int64_t d = 0; d < D; d++) dg[d] -= 0.25f, db[d] -= 0.25f; /* they accumulated */
    grad_check("layernorm dx", ln_loss, &c, c.x, M * D, dx);
    grad_check("layernorm dgamma (+=)", ln_loss, &c, c.g, D, dg);
    grad_check("layernorm dbeta (+=)", ln_loss, &c, c.b, D, db);
    free(c.x), free(c.g), free(c.b), free(c.y), free(c.mean), free(c.rstd), free(c.r);
    free(dx), free(dg), free(db);
}

/* ---- gelu, tanh ------------------------------------------------------------------------ */

typedef struct unary_ctx {
    int kind, mode;
    float *x, *y, *r;
    int64_t n;
} unary_ctx;

static double unary_loss(void *p) {
    unary_ctx *c = p;
    tg_op op = tg_test_op(c->kind);
    if (c->kind == TG_OP_GELU)
        op.p.gelu = (tg_gelu_params){.n = c->n, .form = c->mode};
    else
        op.p.count.n = c->n;
    tg_cpu_op_args a = {.op = &op, .in = {c->x}, .out = {c->y}};
    tg_cpu_op_run(&a);
    return dot(c->r, c->y, c->n);
}

TG_TEST(test_op_gelu_grad) {
    /* gelu(1) and gelu(-1) = gelu(1) - 1 for each form, from Python's math module. */
    const double expect[2][2] = {{0.8413447460685429, -0.15865525393145707},
                                 {0.8411919906082768, -0.15880800939172324}};
    for (int mode = 0; mode < 2; mode++) {
        float pts[2] = {1.0f, -1.0f}, out[2];
        tg_op op = tg_test_op(TG_OP_GELU);
        op.p.gelu = (tg_gelu_params){.n = 2, .form = mode};
        tg_cpu_op_args a = {.op = &op, .in = {pts}, .out = {out}};
        tg_cpu_op_run(&a);
        CHECK(fabs(out[0] - expect[mode][0]) < 1e-6 && fabs(out[1] - expect[mode][1]) < 1e-6,
              "gelu mode %d: gelu(1)=%.9g gelu(-1)=%.9g", mode, out[0], out[1]);

        int64_t n = 200;
        unary_ctx c = {TG_OP_GELU, mode, frand(n, 5 + mode, -4, 4), falloc(n), frand(n, 7, -1, 1), n};
        float *dx = fconst(n, NAN);
        tg_op bop = tg_test_op(TG_OP_GELU_BWD);
        bop.p.gelu_bwd = (tg_gelu_bwd_params){.n = n, .form = mode};
        tg_cpu_op_args b = {.op = &bop, .in = {c.r, c.x}, .out = {dx}, .threads = pool3()};
        tg_cpu_op_run(&b);
        grad_check(mode ? "gelu tanh" : "gelu erf", unary_loss, &c, c.x, n, dx);
        free(c.x), free(c.y), free(c.r), free(dx);
    }
}

TG_TEST(test_op_tanh_grad) {
    int64_t n = 150;
    unary_ctx c = {TG_OP_TANH, 0, frand(n, 8, -3, 3), fconst(n, NAN), frand(n, 9, -1, 1), n};
    unary_loss(&c);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(c.y[i] - tanh(c.x[i])));
    CHECK(worst < 1e-6, "tanh forward error %g", worst);
    float *dx = fconst(n, NAN);
    tg_op op = tg_test_op(TG_OP_TANH_BWD);
    op.p.count.n = n;
    tg_cpu_op_args a = {.op = &op, .in = {c.r, c.y}, .out = {dx}};
    tg_cpu_op_run(&a);
    grad_check("tanh", unary_loss, &c, c.x, n, dx);
    free(c.x), free(c.y), free(c.r), free(dx);
}

/* ---- attention softmax -------------------------------------------------------------------- */

typedef struct sm_ctx {
    float *s, *mask, *P, *r;
    int64_t B, H, T;
    int causal;
    float scale;
} sm_ctx;

static void sm_forward(sm_ctx *c, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_ATTN_SOFTMAX);
    op.p.softmax = (tg_softmax_params){.b = c->B, .h = c->H, .t = c->T, .causal = c->causal, .scale = c->scale};
    tg_cpu_op_args a = {.op = &op, .in = {c->s, c->mask}, .out = {c->P}, .threads = tp};
    tg_cpu_op_run(&a);
}

static double sm_loss(void *p) {
    sm_ctx *c = p;
    sm_forward(c, NULL);
    return dot(c->r, c->P, c->B * c->H * c->T * c->T);
}

TG_TEST(test_op_attn_softmax_grad) {
    enum { B = 2, H = 2, T = 5 };
    /* Batch 1 masks key 0, so with causal masking its query 0 keeps no key at all. */
    float mask[B * T] = {1, 1, 0, 1, 1, 0, 1, 1, 1, 0};
    for (int causal = 0; causal < 2; causal++) {
        int64_t n = B * H * T * T;
        sm_ctx c = {frand(n, 20 + causal, -3, 3), mask, fconst(n, NAN), frand(n, 22, -1, 1),
                    B, H, T, causal, 0.35f};
        sm_forward(&c, pool3());
        double worst = 0;
        int bad_zero = 0;
        for (int64_t row = 0; row < B * H * T; row++) {
            int64_t q = row % T, b = row / (H * T);
            double mx = -INFINITY, sum = 0;
            for (int k = 0; k < T; k++)
                if (mask[b * T + k] != 0 && (!causal || k <= q))
                    mx = fmax(mx, 0.35 * c.s[row * T + k]);
            for (int k = 0; k < T; k++)
                if (mask[b * T + k] != 0 && (!causal || k <= q))
                    sum += exp(0.35 * c.s[row * T + k] - mx);
            for (int k = 0; k < T; k++) {
                float p = c.P[row * T + k];
                if (mask[b * T + k] == 0 || (causal && k > q) || mx == -INFINITY) {
                    bad_zero += p != 0.0f; /* exactly zero, also for rows with no key */
                } else {
                    worst = fmax(worst, fabs(p - exp(0.35 * c.s[row * T + k] - mx) / sum));
                }
            }
        }
        CHECK(!bad_zero, "causal=%d: %d masked probabilities are not exactly 0", causal, bad_zero);
        CHECK(worst < 1e-6, "causal=%d: softmax vs double reference: %g", causal, worst);
        if (causal) {
            int64_t row = (1 * H + 0) * T + 0; /* batch 1, head 0, query 0 */
            CHECK(c.P[row * T + 1] == 0.0f, "a row with no kept key must be zeros");
        }
        float *ds = fconst(n, NAN);
        tg_op op = tg_test_op(TG_OP_ATTN_SOFTMAX_BWD);
        op.p.softmax_bwd = (tg_softmax_bwd_params){.b = B, .h = H, .t = T, .scale = 0.35f};
        tg_cpu_op_args a = {.op = &op, .in = {c.r, c.P}, .out = {ds}, .threads = pool3()};
        tg_cpu_op_run(&a);
        grad_check(causal ? "attn softmax causal" : "attn softmax", sm_loss, &c, c.s, n, ds);
        free(c.s), free(c.P), free(c.r), free(ds);
    }
}

/* ---- dropout ----------------------------------------------------------------------------- */

typedef struct drop_ctx {
    float *x, *y, *r, step;
    int64_t n;
    float p;
    uint64_t seed;
    int key, training;
} drop_ctx;

static void run_dropout(const drop_ctx *c, const float *x, float *y, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_DROPOUT);
    op.p.dropout = (tg_dropout_params){.n = c->n, .key = c->key, .p = c->p};
    float step = c->step;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x, &step}, .out = {y}, .seed = c->seed,
                        .training = c->training, .threads = tp};
    tg_cpu_op_run(&a);
}

static double drop_loss(void *p) {
    drop_ctx *c = p;
    run_dropout(c, c->x, c->y, NULL);
    return dot(c->r, c->y, c->n);
}

TG_TEST(test_op_dropout_grad) {
    int64_t n = 64;
    drop_ctx c = {frand(n, 30, -1, 1), fconst(n, NAN), frand(n, 31, -1, 1), 7.0f, n, 0.3f,
                  1234, 5, 1};
    run_dropout(&c, c.x, c.y, NULL);
    int bad = 0, dropped = 0;
    for (int64_t i = 0; i < n; i++) {
        int keep = tg_dropout_uniform(1234, 7, 5, (uint64_t)i) >= 0.3f;
        dropped += !keep;
        bad += keep ? fabsf(c.y[i] - c.x[i] / 0.7f) > 1e-6f : c.y[i] != 0.0f;
    }
    CHECK(!bad, "%d elements disagree with keep = philox >= p, y = x/(1-p)", bad);
    CHECK(dropped > 0 && dropped < n, "degenerate mask: %d of %lld dropped", dropped, (long long)n);
    /* The backward is the same op (same seed, step, key) applied to the gradient. */
    float *dx = fconst(n, NAN);
    run_dropout(&c, c.r, dx, pool3());
    grad_check("dropout", drop_loss, &c, c.x, n, dx);
    free(c.x), free(c.y), free(c.r), free(dx);
}

TG_TEST(test_op_dropout_determinism) {
    int64_t n = 100000;
    drop_ctx c = {.x = frand(n, 40, 0.5f, 1.5f), .step = 3.0f, .n = n, .p = 0.25f, .seed = 99,
                  .key = 2, .training = 1};
    float *y1 = falloc(n), *y2 = falloc(n), *y3 = falloc(n);
    run_dropout(&c, c.x, y1, NULL);
    run_dropout(&c, c.x, y2, pool3());
    CHECK(!memcmp(y1, y2, (size_t)n * 4), "same seed/step/key gave a different mask");
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) kept += y1[i] != 0.0f;
    CHECK(fabs((double)kept / n - 0.75) < 0.01, "keep fraction %g, expected 0.75",
          (double)kept / n);

    struct { const char *what; float step; uint64_t seed; int key; } variants[3] = {
        {"step", 4.0f, 99, 2}, {"seed", 3.0f, 100, 2}, {"key", 3.0f, 99, 3}};
    for (int v = 0; v < 3; v++) {
        drop_ctx d = c;
        d.step = variants[v].step, d.seed = variants[v].seed, d.key = variants[v].key;
        run_dropout(&d, c.x, y3, pool3());
        int64_t differ = 0;
        for (int64_t i = 0; i < n; i++) differ += (y1[i] != 0.0f) != (y3[i] != 0.0f);
        /* Independent masks differ on 2p(1-p) = 37.5% of elements. */
        CHECK(fabs((double)differ / n - 0.375) < 0.02, "changing the %s: masks differ on %g",
              variants[v].what, (double)differ / n);
    }

    memcpy(y3, c.x, (size_t)n * 4);
    run_dropout(&c, y3, y3, pool3()); /* in place */
    CHECK(!memcmp(y1, y3, (size_t)n * 4), "in-place dropout differs");

    drop_ctx e = c;
    e.training = 0;
    run_dropout(&e, c.x, y3, pool3());
    CHECK(!memcmp(y3, c.x, (size_t)n * 4), "eval-mode dropout is not the identity");
    e.training = 1, e.p = 0.0f;
    run_dropout(&e, c.x, y3, pool3());
    CHECK(!memcmp(y3, c.x, (size_t)n * 4), "p = 0 dropout is not the identity");
    free(c.x), free(y1), free(y2), free(y3);
}

/* ---- residual layernorm ------------------------------------------------------------------ */

/* [M, D] with D = 13: rows start inside Philox blocks of four, so each row draws its mask
 * from the middle of the stream, as one DROPOUT over the whole tensor does. The loss is
 * sum(ry * y) + sum(rs * s): rs is the gradient s gets from its other readers (ds_extra),
 * NULL when s has none. */
typedef struct rln_ctx {
    float *x, *r, *g, *b;
    float *y, *s, *mean, *rstd;
    float *ry, *rs;
    int64_t M, D;
    float p, step;
    int training;
} rln_ctx;

#define RLN_SEED 4321u
#define RLN_KEY 6

static tg_op rln_op(const rln_ctx *c, int kind) {
    tg_op op = tg_test_op(kind);
    if (kind == TG_OP_RESIDUAL_LAYERNORM)
        op.p.residual_layernorm = (tg_residual_layernorm_params){.m = c->M, .d = c->D, .key = RLN_KEY, .eps = 1e-5f,
                                                                 .p = c->p};
    else
        op.p.residual_layernorm_bwd =
            (tg_residual_layernorm_bwd_params){.m = c->M, .d = c->D, .key = RLN_KEY, .eps = 1e-5f, .p = c->p};
    return op;
}

static void rln_forward(rln_ctx *c, tg_threadpool *tp) {
    tg_op op = rln_op(c, TG_OP_RESIDUAL_LAYERNORM);
    tg_cpu_op_args a = {.op = &op, .in = {c->x, c->r, c->g, c->b, &c->step}, .out = {c->y, c->s, c->mean, c->rstd},
                        .seed = RLN_SEED, .training = c->training, .threads = tp};
    tg_cpu_op_run(&a);
}

/* ds, dx and dgamma/dbeta (+=) for dy = ry and ds_extra = rs. */
static void rln_backward(rln_ctx *c, float *ds, float *dx, float *dg, float *db, tg_threadpool *tp) {
    tg_op op = rln_op(c, TG_OP_RESIDUAL_LAYERNORM_BWD);
    tg_cpu_op_args a = {.op = &op, .in = {c->ry, c->s, c->g, c->mean, c->rstd, c->rs, &c->step},
                        .out = {ds, dx, dg, db}, .seed = RLN_SEED, .training = c->training, .threads = tp};
    tg_cpu_op_run(&a);
}

static double rln_loss(void *p) {
    rln_ctx *c = p;
    rln_forward(c, NULL);
    double l = dot(c->ry, c->y, c->M * c->D);
    return c->rs ? l + dot(c->rs, c->s, c->M * c->D) : l;
}

static rln_ctx rln_make(int64_t M, int64_t D, float p, int training, int extra, uint64_t seed) {
    int64_t n = M * D;
    rln_ctx c = {frand(n, seed, -2, 2), frand(n, seed + 1, -1, 1), frand(D, seed + 2, 0.5f, 1.5f),
                 frand(D, seed + 3, -0.5f, 0.5f), fconst(n, NAN), fconst(n, NAN), fconst(M, NAN), fconst(M, NAN),
                 frand(n, seed + 4, -1, 1), extra ? frand(n, seed + 5, -1, 1) : NULL, M, D, p, 9.0f, training};
    return c;
}

static void rln_free(rln_ctx *c) {
    free(c->x), free(c->r), free(c->g), free(c->b), free(c->y), free(c->s), free(c->mean), free(c->rstd);
    free(c->ry), free(c->rs);
}

/* The backward against finite differences of the forward, dropout on (training) and off
 * (p = 0, and eval mode), with and without a gradient of s from other readers. */
TG_TEST(test_op_residual_layernorm_grad) {
    static const struct {
        const char *what;
        float p;
        int training, extra;
    } cases[] = {{"dropout, ds_extra", 0.3f, 1, 1},
                 {"dropout, no ds_extra", 0.3f, 1, 0},
                 {"p = 0, ds_extra", 0.0f, 1, 1},
                 {"eval, ds_extra", 0.3f, 0, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t M = 5, D = 13, n = M * D;
        rln_ctx c = rln_make(M, D, cases[k].p, cases[k].training, cases[k].extra, 50 + 10 * k);
        rln_forward(&c, pool3());
        CHECK(count_nan(c.y, n) + count_nan(c.s, n) + count_nan(c.mean, M) + count_nan(c.rstd, M) == 0,
              "%s: forward outputs not fully written", cases[k].what);
        float *ds = fconst(n, NAN), *dx = fconst(n, NAN), *dg = fconst(D, 0.25f), *db = fconst(D, 0.25f);
        rln_backward(&c, ds, dx, dg, db, pool3());
        CHECK(count_nan(ds, n) + count_nan(dx, n) == 0, "%s: ds/dx not fully written", cases[k].what);
        for (int64_t d = 0; d < D; d++) dg[d] -= 0.25f, db[d] -= 0.25f; /* they accumulated */
        int dropped = 0;
        for (int64_t i = 0; i < n; i++) dropped += dx[i] == 0.0f && ds[i] != 0.0f;
        int want_drop = cases[k].p > 0 && cases[k].training;
        CHECK(want_drop ? dropped > 0 && dropped < n : dropped == 0, "%s: %d of %lld elements dropped", cases[k].what,
              dropped, (long long)n);
        char what[96];
        snprintf(what, sizeof what, "residual layernorm (%s) dx", cases[k].what);
        grad_check(what, rln_loss, &c, c.x, n, dx);
        snprintf(what, sizeof what, "residual layernorm (%s) dr = ds", cases[k].what);
        grad_check(what, rln_loss, &c, c.r, n, ds);
        snprintf(what, sizeof what, "residual layernorm (%s) dgamma (+=)", cases[k].what);
        grad_check(what, rln_loss, &c, c.g, D, dg);
        snprintf(what, sizeof what, "residual layernorm (%s) dbeta (+=)", cases[k].what);
        grad_check(what, rln_loss, &c, c.b, D, db);
        free(ds), free(dx), free(dg), free(db);
        rln_free(&c);
    }
}

/* The fused ops compute exactly what DROPOUT, ADD and LAYERNORM (forward) and
 * LAYERNORM_BWD, ADD and DROPOUT (backward) compute, bit for bit, in training and eval
 * mode and on any thread count. */
TG_TEST(test_op_residual_layernorm_matches_separate_ops) {
    for (int training = 0; training < 2; training++) {
        int64_t M = 6, D = 13, n = M * D;
        rln_ctx c = rln_make(M, D, 0.3f, training, 1, 90);
        rln_forward(&c, pool3());
        float *ds = fconst(n, NAN), *dx = fconst(n, NAN), *dg = frand(D, 97, -1, 1), *db = frand(D, 98, -1, 1);
        float *dg2 = falloc(D), *db2 = falloc(D);
        memcpy(dg2, dg, sizeof(float) * (size_t)D), memcpy(db2, db, sizeof(float) * (size_t)D);
        rln_backward(&c, ds, dx, dg, db, pool3());

        /* Separate ops: d = DROPOUT(x), s = d + r, y = LAYERNORM(s). */
        drop_ctx dc = {.step = c.step, .n = n, .p = c.p, .seed = RLN_SEED, .key = RLN_KEY, .training = training};
        float *d = falloc(n), *s = falloc(n), *y = falloc(n), *mean = falloc(M), *rstd = falloc(M);
        run_dropout(&dc, c.x, d, NULL);
        tg_op add = tg_test_op(TG_OP_ADD);
        add.p.count.n = n;
        tg_cpu_op_args aa = {.op = &add, .in = {d, c.r}, .out = {s}};
        tg_cpu_op_run(&aa);
        ln_ctx lc = {s, c.g, c.b, y, mean, rstd, NULL, M, D};
        ln_forward(&lc, NULL);
        CHECK(!memcmp(c.s, s, sizeof(float) * (size_t)n) && !memcmp(c.y, y, sizeof(float) * (size_t)n) &&
                  !memcmp(c.mean, mean, sizeof(float) * (size_t)M) && !memcmp(c.rstd, rstd, sizeof(float) * (size_t)M),
              "training %d: the forward differs from dropout + add + layernorm", training);

        /* dln = LAYERNORM_BWD(dy), ds = ds_extra + dln (autodiff's ADD order), dx = DROPOUT(ds). */
        float *dln = falloc(n), *ds2 = falloc(n), *dx2 = falloc(n);
        tg_op lb = tg_test_op(TG_OP_LAYERNORM_BWD);
        lb.p.layernorm_bwd.m = M, lb.p.layernorm_bwd.d = D;
        tg_cpu_op_args la = {.op = &lb, .in = {c.ry, s, c.g, mean, rstd}, .out = {dln, dg2, db2}};
        tg_cpu_op_run(&la);
        tg_cpu_op_args ab = {.op = &add, .in = {c.rs, dln}, .out = {ds2}};
        tg_cpu_op_run(&ab);
        run_dropout(&dc, ds2, dx2, NULL);
        CHECK(!memcmp(ds, ds2, sizeof(float) * (size_t)n) && !memcmp(dx, dx2, sizeof(float) * (size_t)n),
              "training %d: ds/dx differ from layernorm_bwd + add + dropout", training);
        CHECK(!memcmp(dg, dg2, sizeof(float) * (size_t)D) && !memcmp(db, db2, sizeof(float) * (size_t)D),
              "training %d: dgamma/dbeta differ from layernorm_bwd's", training);

        /* One thread gives the same bits. */
        float *y1 = falloc(n), *ds1 = falloc(n);
        memcpy(y1, c.y, sizeof(float) * (size_t)n), memcpy(ds1, ds, sizeof(float) * (size_t)n);
        rln_forward(&c, NULL);
        rln_backward(&c, ds, dx, dg, db, NULL);
        CHECK(!memcmp(y1, c.y, sizeof(float) * (size_t)n) && !memcmp(ds1, ds, sizeof(float) * (size_t)n),
              "training %d: results depend on the thread count", training);
        free(y1), free(ds1), free(dln), free(ds2), free(dx2), free(d), free(s), free(y), free(mean), free(rstd);
        free(ds), free(dx), free(dg), free(db), free(dg2), free(db2);
        rln_free(&c);
    }
}

/* In a bf16 plan the op normalises s as stored (rounded to bf16), as a LAYERNORM reading
 * the stored s of a separate ADD does, and dx is the dropout of ds as stored. */
TG_TEST(test_op_residual_layernorm_bf16_reads_stored_sum) {
    int64_t M = 4, D = 16, n = M * D;
    rln_ctx c = rln_make(M, D, 0.25f, 1, 1, 120);
    uint16_t *xb = malloc(2 * (size_t)n), *rb = malloc(2 * (size_t)n), *yb = malloc(2 * (size_t)n);
    uint16_t *sb = malloc(2 * (size_t)n);
    REQUIRE(xb && rb && yb && sb, "out of memory");
    tg_bf16_narrow(xb, c.x, n), tg_bf16_narrow(rb, c.r, n);
    tg_op op = rln_op(&c, TG_OP_RESIDUAL_LAYERNORM);
    tg_cpu_op_args a = {.op = &op, .in = {xb, rb, c.g, c.b, &c.step}, .out = {yb, sb, c.mean, c.rstd},
                        .in_numel = {n, n, D, D, 1}, .out_numel = {n, n, M, M},
                        .in_dtype = {TG_BF16, TG_BF16, TG_F32, TG_F32, TG_F32},
                        .out_dtype = {TG_BF16, TG_BF16, TG_F32, TG_F32}, .seed = RLN_SEED, .training = 1};
    REQUIRE(tg_cpu_op_run_any(&a) == 0, "out of memory");
    float *s = falloc(n), *y = falloc(n), *mean = falloc(M), *rstd = falloc(M);
    tg_bf16_widen(s, sb, n);
    ln_ctx lc = {s, c.g, c.b, y, mean, rstd, NULL, M, D};
    ln_forward(&lc, NULL);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) bad += tg_bf16_from_f32(y[i]) != yb[i];
    CHECK(!bad && !memcmp(mean, c.mean, sizeof(float) * (size_t)M) && !memcmp(rstd, c.rstd, sizeof(float) * (size_t)M),
          "%d elements of y (or the statistics) are not the layernorm of the stored s", bad);
    free(xb), free(rb), free(yb), free(sb), free(s), free(y), free(mean), free(rstd);
    rln_free(&c);
}

/* ---- attention softmax with fused dropout ---------------------------------------------- */

/* T = 7 is not a multiple of 4, so Philox blocks straddle rows. */
enum { SMD_B = 2, SMD_H = 3, SMD_T = 7 };
#define SMD_N ((int64_t)SMD_B * SMD_H * SMD_T * SMD_T)
#define SMD_SCALE 0.4f
#define SMD_P 0.3f
#define SMD_SEED 4321u
#define SMD_KEY 6
#define SMD_STEP 9.0f

typedef struct smd_ctx {
    float *s, *mask, *P, *D, *r;
    int causal, training;
    float p;
} smd_ctx;

/* The fused forward: P always, D when c->D is set. */
static void smd_forward(smd_ctx *c, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_ATTN_SOFTMAX);
    op.p.softmax = (tg_softmax_params){.b = SMD_B, .h = SMD_H, .t = SMD_T, .causal = c->causal, .key = SMD_KEY,
                                       .scale = SMD_SCALE, .p = c->p};
    float step = SMD_STEP;
    tg_cpu_op_args a = {.op = &op, .in = {c->s, c->mask, &step}, .out = {c->P, c->D}, .seed = SMD_SEED,
                        .training = c->training, .threads = tp};
    tg_cpu_op_run(&a);
}

/* The fused backward: dscores from dD (dropout applied when with_step). */
static void smd_backward(const smd_ctx *c, const float *dD, float *ds, int with_step, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_ATTN_SOFTMAX_BWD);
    op.p.softmax_bwd =
        (tg_softmax_bwd_params){.b = SMD_B, .h = SMD_H, .t = SMD_T, .key = SMD_KEY, .scale = SMD_SCALE, .p = c->p};
    float step = SMD_STEP;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)dD, c->P, with_step ? &step : NULL}, .out = {ds},
                        .seed = SMD_SEED, .training = c->training, .threads = tp};
    tg_cpu_op_run(&a);
}

/* The DROPOUT op the fused one replaces, with the same stream. */
static void smd_dropout(const float *x, float *y, float p, int training) {
    tg_op op = tg_test_op(TG_OP_DROPOUT);
    op.p.dropout = (tg_dropout_params){.n = SMD_N, .key = SMD_KEY, .p = p};
    float step = SMD_STEP;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x, &step}, .out = {y}, .seed = SMD_SEED,
                        .training = training, .threads = pool3()};
    tg_cpu_op_run(&a);
}

static double smd_loss(void *p) {
    smd_ctx *c = p;
    smd_forward(c, NULL);
    return dot(c->r, c->D, SMD_N);
}

static float smd_mask[SMD_B * SMD_T] = {1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1};

TG_TEST(test_op_attn_softmax_dropout_fused) {
    const int64_t n = SMD_N;
    for (int causal = 0; causal < 2; causal++) {
        smd_ctx c = {frand(n, 60 + causal, -3, 3), smd_mask, fconst(n, NAN), fconst(n, NAN), NULL, causal, 1,
                     SMD_P};
        smd_forward(&c, pool3());
        /* P is the plain softmax, bit for bit. */
        smd_ctx plain = c;
        plain.P = fconst(n, NAN), plain.D = NULL, plain.p = 0.0f;
        smd_forward(&plain, NULL);
        CHECK(!memcmp(plain.P, c.P, (size_t)n * 4), "causal=%d: P differs from the softmax without dropout", causal);
        CHECK(count_nan(c.D, n) == 0, "causal=%d: %lld dropped probs unwritten", causal, (long long)count_nan(c.D, n));
        /* D is the DROPOUT op applied to P, bit for bit, and the mask is not degenerate. */
        float *ref = fconst(n, NAN);
        smd_dropout(c.P, ref, SMD_P, 1);
        CHECK(!memcmp(ref, c.D, (size_t)n * 4), "causal=%d: D differs from DROPOUT(P)", causal);
        int64_t dropped = 0, positive = 0;
        for (int64_t i = 0; i < n; i++) {
            positive += c.P[i] > 0.0f;
            dropped += c.P[i] > 0.0f && c.D[i] == 0.0f;
            int keep = tg_dropout_uniform(SMD_SEED, (uint64_t)SMD_STEP, SMD_KEY, (uint64_t)i) >= SMD_P;
            if (keep && c.D[i] != c.P[i] * (1.0f / (1.0f - SMD_P))) {
                CHECK(0, "causal=%d: element %lld kept but D %g != P/(1-p)", causal, (long long)i, c.D[i]);
                break;
            }
        }
        CHECK(dropped > 0 && dropped < positive, "causal=%d: degenerate mask, %lld of %lld dropped", causal,
              (long long)dropped, (long long)positive);
        /* Thread count does not matter. */
        float *D1 = c.D;
        c.D = fconst(n, NAN);
        smd_forward(&c, NULL);
        CHECK(!memcmp(D1, c.D, (size_t)n * 4), "causal=%d: D depends on the thread count", causal);
        /* Eval mode and p = 0: D = P. */
        smd_ctx e = c;
        e.training = 0;
        smd_forward(&e, pool3());
        CHECK(!memcmp(e.D, e.P, (size_t)n * 4), "causal=%d: eval-mode D != P", causal);
        e.training = 1, e.p = 0.0f;
        memset(e.D, 0xff, (size_t)n * 4);
        smd_forward(&e, pool3());
        CHECK(!memcmp(e.D, e.P, (size_t)n * 4), "causal=%d: p = 0 D != P", causal);
        free(c.s), free(c.P), free(c.D), free(D1), free(plain.P), free(ref);
    }
}

TG_TEST(test_op_attn_softmax_dropout_grad) {
    const int64_t n = SMD_N;
    for (int causal = 0; causal < 2; causal++) {
        smd_ctx c = {frand(n, 70 + causal, -3, 3), smd_mask, fconst(n, NAN), fconst(n, NAN), frand(n, 72, -1, 1),
                     causal, 1, SMD_P};
        smd_forward(&c, pool3());
        float *ds = fconst(n, NAN);
        smd_backward(&c, c.r, ds, 1, pool3());
        /* Finite differences of L = sum(r * D) through the fused forward (the mask does not
         * depend on the scores). */
        grad_check(causal ? "fused softmax dropout causal" : "fused softmax dropout", smd_loss, &c, c.s, n, ds);
        /* The unfused composition: DROPOUT on the gradient, then the plain softmax backward. */
        float *dP = fconst(n, NAN), *ds_ref = fconst(n, NAN);
        smd_dropout(c.r, dP, SMD_P, 1);
        smd_ctx plain = c;
        plain.p = 0.0f;
        smd_backward(&plain, dP, ds_ref, 0, pool3());
        double diff = max_abs_diff(ds, ds_ref, n);
        CHECK(diff <= 1e-6, "causal=%d: fused vs unfused backward differ by %g", causal, diff);
        /* In place on dD gives the same. */
        float *inplace = falloc(n);
        memcpy(inplace, c.r, (size_t)n * 4);
        smd_backward(&c, inplace, inplace, 1, NULL);
        CHECK(!memcmp(inplace, ds, (size_t)n * 4), "causal=%d: in-place backward differs", causal);
        /* Without the step counter, with p = 0 or in eval mode: the plain backward. */
        float *ds0 = fconst(n, NAN), *ds1 = fconst(n, NAN);
        smd_backward(&plain, c.r, ds0, 0, NULL);
        smd_backward(&c, c.r, ds1, 0, NULL);
        CHECK(!memcmp(ds0, ds1, (size_t)n * 4), "causal=%d: no step counter should mean no mask", causal);
        smd_backward(&plain, c.r, ds1, 1, NULL);
        CHECK(!memcmp(ds0, ds1, (size_t)n * 4), "causal=%d: p = 0 should mean no mask", causal);
        smd_ctx e = c;
        e.training = 0;
        smd_backward(&e, c.r, ds1, 1, NULL);
        CHECK(!memcmp(ds0, ds1, (size_t)n * 4), "causal=%d: eval mode should mean no mask", causal);
        free(c.s), free(c.P), free(c.D), free(c.r), free(ds), free(dP), free(ds_ref), free(inplace), free(ds0),
            free(ds1);
    }
}

/* ---- fused attention ---------------------------------------------------------------------- */

#define FA_SEED 2718u
#define FA_KEY 4
#define FA_STEP 11.0f

typedef struct fa_case {
    const char *name;
    int64_t B, H, T, Dh;
    int packed, causal;
    float p;           /* attention dropout */
    const float *mask; /* [B,T], or NULL */
} fa_case;

typedef struct fa_ctx {
    fa_case c;
    int training;
    float *x[3];   /* q, k, v; only x[0] (qkv) when packed */
    float *O, *LSE, *r;
    int32_t *bits; /* keep bits [B,H,T,W], written by the forward and read by the backward when p > 0 */
} fa_ctx;

static int64_t fa_rows(const fa_case *c) { return c->B * c->T; }
static int64_t fa_words(const fa_case *c) { return (c->T + 31) / 32; }
static int64_t fa_bits_numel(const fa_case *c) { return c->B * c->H * c->T * fa_words(c); }
static int64_t fa_width(const fa_case *c) { return c->H * c->Dh; }
/* Elements of input x[s]. */
static int64_t fa_in_numel(const fa_case *c) { return fa_rows(c) * fa_width(c) * (c->packed ? 3 : 1); }
static int fa_parts(const fa_case *c) { return c->packed ? 1 : 3; }

static tg_op fa_op(const fa_case *c, int kind) {
    tg_op op = tg_test_op(kind);
    op.p.attention = (tg_attention_params){.b = c->B, .h = c->H, .t = c->T, .causal = c->causal, .key = FA_KEY,
                                           .packed = c->packed, .head_dim = c->Dh,
                                           .scale = 1.0f / sqrtf((float)c->Dh), .p = c->p};
    return op;
}

static void fa_forward(fa_ctx *c, tg_threadpool *tp) {
    tg_op op = fa_op(&c->c, TG_OP_ATTENTION);
    float step = FA_STEP;
    tg_cpu_op_args a = {.op = &op, .in = {c->x[0], c->x[1], c->x[2], (void *)c->c.mask, c->c.p > 0 ? &step : NULL},
                        .out = {c->O, c->LSE, c->c.p > 0 ? c->bits : NULL}, .seed = FA_SEED,
                        .training = c->training, .threads = tp};
    tg_cpu_op_run(&a);
}

/* dx[s] are the gradients of x[s]; delta [B,H,T]. The mask comes from the forward's bits. */
static void fa_backward(const fa_ctx *c, const float *dO, float *const *dx, float *delta, tg_threadpool *tp) {
    tg_op op = fa_op(&c->c, TG_OP_ATTENTION_BWD);
    tg_cpu_op_args a = {.op = &op,
                        .in = {(void *)dO, c->O, c->LSE, (void *)c->c.mask, c->c.p > 0 ? c->bits : NULL, c->x[0],
                               c->x[1], c->x[2]},
                        .out = {dx[0], dx[1], dx[2], delta}, .seed = FA_SEED, .training = c->training, .threads = tp};
    tg_cpu_op_run(&a);
}

static double fa_loss(void *p) {
    fa_ctx *c = p;
    fa_forward(c, NULL);
    return dot(c->r, c->O, fa_rows(&c->c) * fa_width(&c->c));
}

static void fa_init(fa_ctx *c, const fa_case *fc, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->c = *fc;
    c->training = 1;
    for (int s = 0; s < fa_parts(fc); s++) c->x[s] = frand(fa_in_numel(fc), seed + (uint64_t)s, -1, 1);
    c->O = fconst(fa_rows(fc) * fa_width(fc), NAN);
    c->LSE = fconst(fc->B * fc->H * fc->T, NAN);
    c->r = frand(fa_rows(fc) * fa_width(fc), seed + 7, -1, 1);
    /* A pattern the forward must overwrite, words past T included. */
    c->bits = malloc(sizeof *c->bits * (size_t)fa_bits_numel(fc));
    if (!c->bits) abort();
    memset(c->bits, 0xA5, sizeof *c->bits * (size_t)fa_bits_numel(fc));
}

static void fa_free(fa_ctx *c) {
    for (int s = 0; s < 3; s++) free(c->x[s]);
    free(c->O), free(c->LSE), free(c->r), free(c->bits);
}

/* Whether key k takes part in query q of sequence b: in range, not masked, not in the future. */
static int fa_visible(const fa_case *fc, int64_t b, int64_t q, int64_t k) {
    return k < fc->T && (!fc->mask || fc->mask[b * fc->T + k] != 0) && (!fc->causal || k <= q);
}

/* Checks every bit of c->bits (bits past T included) against the visibility rule and, when
 * `drawn`, the Philox draw of element ((b*H + h)*T + q)*T + k. Returns the number of set bits,
 * or -1 after a failed check. */
static int64_t fa_check_bits(const fa_ctx *c, int drawn, const char *what) {
    const fa_case *fc = &c->c;
    int64_t T = fc->T, W = fa_words(fc), set = 0, bad = 0;
    for (int64_t b = 0; b < fc->B; b++)
        for (int64_t h = 0; h < fc->H; h++)
            for (int64_t q = 0; q < T; q++)
                for (int64_t k = 0; k < 32 * W; k++) {
                    int want = fa_visible(fc, b, q, k);
                    if (want && drawn) {
                        uint64_t e = (uint64_t)(((b * fc->H + h) * T + q) * T + k);
                        want = tg_dropout_uniform(FA_SEED, (uint64_t)FA_STEP, FA_KEY, e) >= fc->p;
                    }
                    uint32_t word = (uint32_t)c->bits[((b * fc->H + h) * T + q) * W + k / 32];
                    int got = (word >> (k % 32)) & 1u;
                    if (got != want && bad++ < 3)
                        CHECK(0, "%s: bit (b %lld, h %lld, q %lld, k %lld) is %d, expected %d", what, (long long)b,
                              (long long)h, (long long)q, (long long)k, got, want);
                    set += got;
                }
    return bad ? -1 : set;
}

/* Element d of head h of row (b, t) of Q (part 0), K (1) or V (2). */
static double fa_at(const fa_ctx *c, int part, int64_t b, int64_t t, int64_t h, int64_t d) {
    int64_t D = fa_width(&c->c);
    if (c->c.packed) return c->x[0][(b * c->c.T + t) * 3 * D + part * D + h * c->c.Dh + d];
    return c->x[part][(b * c->c.T + t) * D + h * c->c.Dh + d];
}

/* The definition in double, with the mask drawn element by element from Philox:
 * O [B*T, D] and LSE [B,H,T] (0 for rows without a kept key). */
static void fa_reference(const fa_ctx *c, double *O, double *LSE) {
    const fa_case *fc = &c->c;
    int64_t T = fc->T, H = fc->H, Dh = fc->Dh, D = fa_width(fc);
    double scale = 1.0f / sqrtf((float)Dh);
    double *s = malloc(sizeof(double) * (size_t)T);
    for (int64_t b = 0; b < fc->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t q = 0; q < T; q++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t k = 0; k < T; k++) {
                    int kept = (!fc->mask || fc->mask[b * T + k] != 0) && (!fc->causal || k <= q);
                    s[k] = -INFINITY;
                    if (!kept) continue;
                    double dq = 0;
                    for (int64_t d = 0; d < Dh; d++) dq += fa_at(c, 0, b, q, h, d) * fa_at(c, 1, b, k, h, d);
                    s[k] = scale * dq;
                    mx = fmax(mx, s[k]);
                }
                double *orow = O + (b * T + q) * D + h * Dh;
                for (int64_t d = 0; d < Dh; d++) orow[d] = 0;
                if (mx == -INFINITY) {
                    LSE[(b * H + h) * T + q] = 0;
                    continue;
                }
                for (int64_t k = 0; k < T; k++)
                    if (s[k] != -INFINITY) sum += exp(s[k] - mx);
                LSE[(b * H + h) * T + q] = mx + log(sum);
                for (int64_t k = 0; k < T; k++) {
                    if (s[k] == -INFINITY) continue;
                    double P = exp(s[k] - mx) / sum;
                    if (c->training && fc->p > 0) {
                        uint64_t e = (uint64_t)(((b * H + h) * T + q) * T + k);
                        P = tg_dropout_uniform(FA_SEED, (uint64_t)FA_STEP, FA_KEY, e) >= fc->p ? P / (1.0 - fc->p) : 0;
                    }
                    for (int64_t d = 0; d < Dh; d++) orow[d] += P * fa_at(c, 2, b, k, h, d);
                }
            }
    free(s);
}

/* The unfused ops the builder emits without fused attention (heads split, QK^T, softmax
 * with its fused dropout, PV, heads merge), run on the same inputs: O [B*T, D]. */
static void fa_unfused(const fa_ctx *c, float *O) {
    const fa_case *fc = &c->c;
    int64_t B = fc->B, H = fc->H, T = fc->T, Dh = fc->Dh, part = B * H * T * Dh, sq = B * H * T * T;
    float *heads[3], *scores = falloc(sq), *probs = falloc(sq), *dropped = falloc(sq), *ctx = falloc(part);
    for (int s = 0; s < 3; s++) heads[s] = falloc(part);
    for (int s = 0; s < fa_parts(fc); s++) {
        tg_op op = tg_test_op(TG_OP_HEADS_SPLIT);
        op.p.heads = (tg_heads_params){.b = B, .t = T, .h = H, .head_dim = Dh, .parts = fc->packed ? 3 : 1};
        tg_cpu_op_args a = {.op = &op, .in = {c->x[s]}};
        if (fc->packed)
            for (int q = 0; q < 3; q++) a.out[q] = heads[q];
        else
            a.out[0] = heads[s];
        tg_cpu_op_run(&a);
    }
    mm_case qk = {T, T, Dh, B * H, 0, 1, 0, 1.0f}, pv = {T, Dh, T, B * H, 0, 0, 0, 1.0f};
    run_matmul(&qk, heads[0], heads[1], NULL, scores, pool3());
    tg_op sm = tg_test_op(TG_OP_ATTN_SOFTMAX);
    sm.p.softmax = (tg_softmax_params){.b = B, .h = H, .t = T, .causal = fc->causal, .key = FA_KEY,
                                       .scale = 1.0f / sqrtf((float)Dh), .p = fc->p};
    float step = FA_STEP;
    tg_cpu_op_args a = {.op = &sm, .in = {scores, (void *)fc->mask, &step}, .out = {probs, dropped},
                        .seed = FA_SEED, .training = c->training, .threads = pool3()};
    tg_cpu_op_run(&a);
    run_matmul(&pv, dropped, heads[2], NULL, ctx, pool3());
    tg_op merge = tg_test_op(TG_OP_HEADS_MERGE);
    merge.p.heads = (tg_heads_params){.b = B, .t = T, .h = H, .head_dim = Dh, .parts = 1};
    tg_cpu_op_args m = {.op = &merge, .in = {ctx}, .out = {O}};
    tg_cpu_op_run(&m);
    for (int s = 0; s < 3; s++) free(heads[s]);
    free(scores), free(probs), free(dropped), free(ctx);
}

/* T = 5 and 8 (Philox blocks of 4 straddle rows or not), Dh = 8 and 16, every form. Batch 1
 * of the T = 5 mask drops key 0, so under the causal mask its query 0 keeps no key. */
static const float fa_mask5[2 * 5] = {1, 1, 0, 1, 1, 0, 1, 1, 1, 0};
static const float fa_mask8[2 * 8] = {1, 1, 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0};
static const fa_case fa_cases[] = {
    {"unpacked T=5 Dh=8 masked", 2, 2, 5, 8, 0, 0, 0.0f, fa_mask5},
    {"unpacked causal T=8 Dh=16 masked dropout", 2, 2, 8, 16, 0, 1, 0.3f, fa_mask8},
    {"packed causal T=5 Dh=8 dropout", 2, 3, 5, 8, 1, 1, 0.25f, NULL},
    {"packed T=8 Dh=16 masked", 2, 2, 8, 16, 1, 0, 0.0f, fa_mask8},
    {"unpacked T=8 Dh=8 dropout", 2, 2, 8, 8, 0, 0, 0.2f, NULL},
    {"packed causal T=5 Dh=16 masked dropout", 2, 2, 5, 16, 1, 1, 0.3f, fa_mask5},
    {"unpacked causal T=5 Dh=8 masked", 2, 3, 5, 8, 0, 1, 0.0f, fa_mask5},
};

TG_TEST(test_op_attention_forward) {
    for (size_t i = 0; i < sizeof fa_cases / sizeof fa_cases[0]; i++) {
        const fa_case *fc = &fa_cases[i];
        fa_ctx c;
        fa_init(&c, fc, 100 + 10 * i);
        int64_t n = fa_rows(fc) * fa_width(fc), nl = fc->B * fc->H * fc->T;
        fa_forward(&c, pool3());
        CHECK(count_nan(c.O, n) == 0 && count_nan(c.LSE, nl) == 0, "%s: O or LSE unwritten", fc->name);
        double *refO = malloc(sizeof(double) * (size_t)n), *refL = malloc(sizeof(double) * (size_t)nl);
        fa_reference(&c, refO, refL);
        double num = 0, den = 0, lse_err = 0;
        for (int64_t k = 0; k < n; k++) num += pow(c.O[k] - refO[k], 2), den += refO[k] * refO[k];
        for (int64_t k = 0; k < nl; k++) lse_err = fmax(lse_err, fabs(c.LSE[k] - refL[k]) / fmax(1.0, fabs(refL[k])));
        CHECK(sqrt(num) <= 1e-5 * sqrt(den) && den > 0, "%s: O vs double reference: rel err %.3g", fc->name,
              sqrt(num / den));
        CHECK(lse_err <= 1e-6, "%s: LSE vs double reference: %.3g", fc->name, lse_err);

        /* The unfused ops on the same inputs: the same function and the same mask. */
        float *unfused = fconst(n, NAN);
        fa_unfused(&c, unfused);
        double rel = tg_rel_err(c.O, unfused, n);
        CHECK(rel <= 1e-5, "%s: fused vs unfused ops: rel err %.3g", fc->name, rel);

        /* With dropout, the keep bits are the drawn mask on the visible keys. */
        int64_t nb = fa_bits_numel(fc);
        if (fc->p > 0) CHECK(fa_check_bits(&c, 1, fc->name) > 0, "%s: no keep bit set", fc->name);

        /* Thread count does not matter. */
        float *O1 = falloc(n), *L1 = falloc(nl);
        int32_t *bits1 = malloc(sizeof *bits1 * (size_t)nb);
        memcpy(O1, c.O, (size_t)n * 4), memcpy(L1, c.LSE, (size_t)nl * 4), memcpy(bits1, c.bits, (size_t)nb * 4);
        fa_forward(&c, NULL);
        CHECK(!memcmp(O1, c.O, (size_t)n * 4) && !memcmp(L1, c.LSE, (size_t)nl * 4) &&
                  (fc->p == 0 || !memcmp(bits1, c.bits, (size_t)nb * 4)),
              "%s: result depends on the thread count", fc->name);

        if (fc->p > 0) {
            /* The mask is real: without it the output moves, and eval mode is p = 0. */
            fa_ctx e = c;
            e.O = fconst(n, NAN);
            e.training = 0;
            fa_forward(&e, pool3());
            CHECK(tg_rel_err(O1, e.O, n) > 1e-2, "%s: dropout changed nothing (%.3g)", fc->name,
                  tg_rel_err(O1, e.O, n));
            CHECK(fa_check_bits(&e, 0, fc->name) > 0, "%s: eval mode does not write the visible keys' bits", fc->name);
            float *O0 = fconst(n, NAN);
            free(e.O);
            e.O = O0;
            e.training = 1, e.c.p = 0.0f;
            fa_forward(&e, pool3());
            e.O = fconst(n, NAN);
            e.training = 0, e.c.p = fc->p;
            fa_forward(&e, NULL);
            CHECK(!memcmp(O0, e.O, (size_t)n * 4), "%s: eval mode differs from p = 0", fc->name);
            free(O0), free(e.O);
        }
        free(refO), free(refL), free(unfused), free(O1), free(L1), free(bits1);
        fa_free(&c);
    }
}

TG_TEST(test_op_attention_grad) {
    static const char *const part_names[3] = {"dq", "dk", "dv"};
    for (size_t i = 0; i < sizeof fa_cases / sizeof fa_cases[0]; i++) {
        const fa_case *fc = &fa_cases[i];
        fa_ctx c;
        fa_init(&c, fc, 200 + 10 * i);
        int64_t nin = fa_in_numel(fc), nl = fc->B * fc->H * fc->T;
        fa_forward(&c, pool3());
        float *dx[3] = {NULL, NULL, NULL}, *dx1[3] = {NULL, NULL, NULL};
        for (int s = 0; s < fa_parts(fc); s++) dx[s] = fconst(nin, NAN), dx1[s] = fconst(nin, NAN);
        float *delta = fconst(nl, NAN), *delta1 = fconst(nl, NAN);
        fa_backward(&c, c.r, dx, delta, pool3());
        for (int s = 0; s < fa_parts(fc); s++)
            CHECK(count_nan(dx[s], nin) == 0, "%s: input gradient %d not fully written", fc->name, s);
        /* delta = rowwise dO . O per head. */
        double worst = 0;
        for (int64_t b = 0; b < fc->B; b++)
            for (int64_t h = 0; h < fc->H; h++)
                for (int64_t q = 0; q < fc->T; q++) {
                    int64_t off = (b * fc->T + q) * fa_width(fc) + h * fc->Dh;
                    double want = dot(c.r + off, c.O + off, fc->Dh);
                    worst = fmax(worst, fabs(delta[(b * fc->H + h) * fc->T + q] - want));
                }
        CHECK(worst <= 1e-6, "%s: delta differs from sum dO * O by %.3g", fc->name, worst);
        for (int s = 0; s < fa_parts(fc); s++) {
            char what[128];
            snprintf(what, sizeof what, "attention %s: %s", fc->name, fc->packed ? "dqkv" : part_names[s]);
            grad_check(what, fa_loss, &c, c.x[s], nin, dx[s]);
        }
        /* Thread count does not matter. */
        fa_forward(&c, NULL);
        fa_backward(&c, c.r, dx1, delta1, NULL);
        int same = !memcmp(delta, delta1, (size_t)nl * 4);
        for (int s = 0; s < fa_parts(fc); s++) same &= !memcmp(dx[s], dx1[s], (size_t)nin * 4);
        CHECK(same, "%s: backward depends on the thread count", fc->name);
        for (int s = 0; s < 3; s++) free(dx[s]), free(dx1[s]);
        free(delta), free(delta1);
        fa_free(&c);
    }
}

/* A sequence whose keys are all masked (and, causal, query 0 of a sequence whose key 0 is
 * masked) keeps no key: O = 0, LSE = 0, zero gradients, and no NaN anywhere. */
TG_TEST(test_op_attention_no_kept_key) {
    static const float mask[2 * 6] = {0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0};
    for (int form = 0; form < 4; form++) {
        fa_case fc = {"no kept key", 2, 2, 6, 8, form & 1, form >> 1, form & 1 ? 0.3f : 0.0f, mask};
        fa_ctx c;
        fa_init(&c, &fc, 300 + form);
        int64_t D = fa_width(&fc), W = fc.packed ? 3 * D : D, T = fc.T, nin = fa_in_numel(&fc);
        int64_t n = fa_rows(&fc) * D, nl = fc.B * fc.H * T;
        fa_forward(&c, pool3());
        float *dx[3] = {NULL, NULL, NULL}, *delta = fconst(nl, NAN);
        for (int s = 0; s < fa_parts(&fc); s++) dx[s] = fconst(nin, NAN);
        fa_backward(&c, c.r, dx, delta, pool3());
        int64_t nan = count_nan(c.O, n) + count_nan(c.LSE, nl) + count_nan(delta, nl);
        for (int s = 0; s < fa_parts(&fc); s++) nan += count_nan(dx[s], nin);
        CHECK(nan == 0, "form %d: %lld NaN in outputs or gradients", form, (long long)nan);
        /* Batch 1 keeps nothing: every row of its O, LSE, delta and input gradients is 0. */
        int nonzero = 0;
        for (int64_t k = T * D; k < 2 * T * D; k++) nonzero += c.O[k] != 0.0f;
        for (int64_t k = fc.H * T; k < 2 * fc.H * T; k++) nonzero += c.LSE[k] != 0.0f || delta[k] != 0.0f;
        for (int s = 0; s < fa_parts(&fc); s++)
            for (int64_t k = T * W; k < 2 * T * W; k++) nonzero += dx[s][k] != 0.0f;
        if (fc.p > 0) /* every bit of batch 1 is 0 */
            for (int64_t k = fc.H * T; k < 2 * fc.H * T; k++) nonzero += c.bits[k] != 0;
        CHECK(!nonzero, "form %d: %d nonzero values for the fully masked sequence", form, nonzero);
        if (fc.p > 0) CHECK(fa_check_bits(&c, 1, "no kept key") > 0, "form %d: no keep bit set", form);
        /* Batch 0 is alive, and under the causal mask its query 0 (key 0 masked) is not. */
        double live = 0;
        for (int64_t k = D; k < T * D; k++) live += fabs(c.O[k]);
        CHECK(live > 0, "form %d: the unmasked sequence has a zero output", form);
        if (fc.causal) {
            int row0 = 0;
            for (int64_t h = 0; h < fc.H; h++) row0 += c.LSE[h * T] != 0.0f;
            for (int64_t d = 0; d < D; d++) row0 += c.O[d] != 0.0f;
            for (int s = 0; s < fa_parts(&fc); s++)
                for (int64_t d = 0; d < D; d++) row0 += dx[s][d] != 0.0f; /* dq of query 0 */
            CHECK(!row0, "form %d: query 0 keeps no key but has %d nonzero values", form, row0);
        }
        for (int s = 0; s < 3; s++) free(dx[s]);
        free(delta);
        fa_free(&c);
    }
}

/* Key mask [2,T] with a gap pattern, the last key of sequence 1 masked. */
static float *fa_gappy_mask(int64_t T) {
    float *m = falloc(2 * T);
    for (int64_t b = 0; b < 2; b++)
        for (int64_t k = 0; k < T; k++) m[b * T + k] = (k * 7 + b * 3) % 5 != 0;
    m[2 * T - 1] = 0;
    return m;
}

static int64_t fa_visible_pairs(const fa_case *fc) {
    int64_t n = 0;
    for (int64_t b = 0; b < fc->B; b++)
        for (int64_t q = 0; q < fc->T; q++)
            for (int64_t k = 0; k < fc->T; k++) n += fa_visible(fc, b, q, k);
    return n * fc->H;
}

/* The keep bits with T = 37 (a partial last word) and 64 (two full words): each bit is the
 * Philox draw on a visible key and 0 elsewhere, the mask ATTN_SOFTMAX applies on the same
 * stream, and the backward's only source of the mask. */
TG_TEST(test_op_attention_keep_bits) {
    static const struct {
        int64_t T;
        int packed, causal;
    } cases[] = {{37, 0, 1}, {64, 0, 1}, {37, 1, 0}, {64, 1, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t T = cases[i].T;
        float *mask = fa_gappy_mask(T);
        char name[64];
        snprintf(name, sizeof name, "keep bits T=%lld packed=%d causal=%d", (long long)T, cases[i].packed,
                 cases[i].causal);
        fa_case fc = {name, 2, 2, T, 8, cases[i].packed, cases[i].causal, 0.3f, mask};
        fa_ctx c;
        fa_init(&c, &fc, 400 + i);
        fa_forward(&c, pool3());
        int64_t set = fa_check_bits(&c, 1, name), visible = fa_visible_pairs(&fc);
        CHECK(set > 0.6 * visible && set < 0.8 * visible, "%s: %lld of %lld visible pairs kept at p = 0.3", name,
              (long long)set, (long long)visible);

        /* The unfused softmax on zero scores (every visible key has P > 0) drops exactly the
         * pairs whose bit is 0. */
        int64_t B = fc.B, H = fc.H, W = fa_words(&fc), sq = B * H * T * T;
        float *scores = fconst(sq, 0.0f), *probs = falloc(sq), *dropped = falloc(sq);
        tg_op sm = tg_test_op(TG_OP_ATTN_SOFTMAX);
        sm.p.softmax =
            (tg_softmax_params){.b = B, .h = H, .t = T, .causal = fc.causal, .key = FA_KEY, .scale = 1.0f, .p = fc.p};
        float step = FA_STEP;
        tg_cpu_op_args a = {.op = &sm, .in = {scores, mask, &step}, .out = {probs, dropped}, .seed = FA_SEED,
                            .training = 1, .threads = pool3()};
        tg_cpu_op_run(&a);
        int64_t differ = 0;
        for (int64_t row = 0; row < B * H * T; row++)
            for (int64_t k = 0; k < T; k++)
                differ += (((uint32_t)c.bits[row * W + k / 32] >> (k % 32)) & 1u) != (dropped[row * T + k] != 0.0f);
        CHECK(differ == 0, "%s: %lld bits differ from the unfused softmax's mask", name, (long long)differ);

        /* The backward reads the mask from the bits: with every bit cleared, no probability
         * survives dropout and dV is exactly 0; with the forward's bits it is not. */
        int64_t nin = fa_in_numel(&fc), D = fa_width(&fc), ld = fc.packed ? 3 * D : D, v0 = fc.packed ? 2 * D : 0;
        const float *dv_of[2];
        float *dx[2][3] = {{NULL, NULL, NULL}, {NULL, NULL, NULL}}, *delta = fconst(B * H * T, NAN);
        for (int run = 0; run < 2; run++) {
            for (int s = 0; s < fa_parts(&fc); s++) dx[run][s] = fconst(nin, NAN);
            if (run == 1) memset(c.bits, 0, sizeof *c.bits * (size_t)fa_bits_numel(&fc));
            fa_backward(&c, c.r, dx[run], delta, pool3());
            dv_of[run] = fc.packed ? dx[run][0] : dx[run][2];
        }
        double dv_kept = 0, dv_cleared = 0;
        for (int64_t r = 0; r < fa_rows(&fc); r++)
            for (int64_t d = 0; d < D; d++) {
                dv_kept += fabs(dv_of[0][r * ld + v0 + d]);
                dv_cleared += fabs(dv_of[1][r * ld + v0 + d]);
            }
        CHECK(dv_kept > 0 && dv_cleared == 0, "%s: |dV| %.3g with the forward's bits, %.3g with none set", name,
              dv_kept, dv_cleared);
        for (int run = 0; run < 2; run++)
            for (int s = 0; s < 3; s++) free(dx[run][s]);
        free(delta), free(scores), free(probs), free(dropped), free(mask);
        fa_free(&c);
    }
}

/* Without a draw (eval mode, or no step counter) the forward still writes every word of the
 * bits: exactly the visible keys, so the backward's factor is 1/(1-p) on each. */
TG_TEST(test_op_attention_keep_bits_eval) {
    for (int form = 0; form < 2; form++) {
        int64_t T = form ? 64 : 37;
        float *mask = fa_gappy_mask(T);
        fa_case fc = {form ? "eval T=64" : "eval T=37", 2, 3, T, 8, form, 1, 0.25f, mask};
        int64_t visible = fa_visible_pairs(&fc);
        fa_ctx c;
        fa_init(&c, &fc, 500 + form);
        c.training = 0;
        fa_forward(&c, pool3());
        int64_t set = fa_check_bits(&c, 0, fc.name);
        CHECK(set == visible && visible > 0, "%s: %lld bits set for %lld visible pairs", fc.name, (long long)set,
              (long long)visible);

        /* Training without the step counter draws nothing either. */
        memset(c.bits, 0xA5, sizeof *c.bits * (size_t)fa_bits_numel(&fc));
        tg_op op = fa_op(&fc, TG_OP_ATTENTION);
        tg_cpu_op_args a = {.op = &op, .in = {c.x[0], c.x[1], c.x[2], mask, NULL}, .out = {c.O, c.LSE, c.bits},
                            .seed = FA_SEED, .training = 1, .threads = pool3()};
        tg_cpu_op_run(&a);
        set = fa_check_bits(&c, 0, fc.name);
        CHECK(set == visible, "%s without a step: %lld bits set for %lld visible pairs", fc.name, (long long)set,
              (long long)visible);
        free(mask);
        fa_free(&c);
    }
}

/* ---- heads split / merge ---------------------------------------------------------------- */

typedef struct heads_ctx {
    int64_t B, T, H, Dh, P;
    float *x, *h[3], *r[3], *rx; /* rx: projection for merge's output */
} heads_ctx;

static void run_heads(const heads_ctx *c, int kind, float *x, float *const *h) {
    tg_op op = tg_test_op(kind);
    op.p.heads = (tg_heads_params){.b = c->B, .t = c->T, .h = c->H, .head_dim = c->Dh, .parts = c->P};
    tg_cpu_op_args a = {.op = &op};
    for (int p = 0; p < c->P; p++) {
        if (kind == TG_OP_HEADS_SPLIT) a.out[p] = h[p]; else a.in[p] = h[p];
    }
    if (kind == TG_OP_HEADS_SPLIT) a.in[0] = x; else a.out[0] = x;
    tg_cpu_op_run(&a);
}

static double split_loss(void *p) {
    heads_ctx *c = p;
    run_heads(c, TG_OP_HEADS_SPLIT, c->x, c->h);
    double s = 0;
    int64_t part = c->B * c->H * c->T * c->Dh;
    for (int q = 0; q < c->P; q++) s += dot(c->r[q], c->h[q], part);
    return s;
}

static double merge_loss(void *p) {
    heads_ctx *c = p;
    float *y = falloc(c->B * c->T * c->P * c->H * c->Dh);
    run_heads(c, TG_OP_HEADS_MERGE, y, c->h);
    double s = dot(c->rx, y, c->B * c->T * c->P * c->H * c->Dh);
    free(y);
    return s;
}

TG_TEST(test_op_heads_grad) {
    for (int P = 1; P <= 3; P += 2) {
        heads_ctx c = {.B = 2, .T = 3, .H = 2, .Dh = 4, .P = P};
        int64_t part = c.B * c.H * c.T * c.Dh, W = P * c.H * c.Dh, nx = c.B * c.T * W;
        c.x = frand(nx, 50, -1, 1);
        c.rx = frand(nx, 51, -1, 1);
        for (int q = 0; q < P; q++) {
            c.h[q] = fconst(part, NAN);
            c.r[q] = frand(part, 52 + q, -1, 1);
        }
        split_loss(&c);
        int bad = 0;
        for (int q = 0; q < P; q++)
            for (int64_t b = 0; b < c.B; b++)
                for (int64_t h = 0; h < c.H; h++)
                    for (int64_t t = 0; t < c.T; t++)
                        for (int64_t d = 0; d < c.Dh; d++)
                            bad += c.h[q][((b * c.H + h) * c.T + t) * c.Dh + d] !=
                                   c.x[(b * c.T + t) * W + q * c.H * c.Dh + h * c.Dh + d];
        CHECK(!bad, "P=%d: %d split elements misplaced or unwritten", P, bad);
        float *y = fconst(nx, NAN);
        run_heads(&c, TG_OP_HEADS_MERGE, y, c.h);
        CHECK(!memcmp(y, c.x, (size_t)nx * 4), "P=%d: merge(split(x)) != x", P);

        /* d split / dx = merge(r); d merge / dh = split(rx). */
        float *gx = fconst(nx, NAN), *gh[3] = {0};
        run_heads(&c, TG_OP_HEADS_MERGE, gx, c.r);
        for (int q = 0; q < P; q++) gh[q] = falloc(part);
        run_heads(&c, TG_OP_HEADS_SPLIT, c.rx, gh);
        grad_check(P == 1 ? "heads_split P=1" : "heads_split P=3", split_loss, &c, c.x, nx, gx);
        for (int q = 0; q < P; q++)
            grad_check(P == 1 ? "heads_merge P=1" : "heads_merge P=3", merge_loss, &c, c.h[q],
                       part, gh[q]);
        free(c.x), free(c.rx), free(y), free(gx);
        for (int q = 0; q < P; q++) free(c.h[q]), free(c.r[q]), free(gh[q]);
    }
}

/* ---- select token --------------------------------------------------------------------------- */

typedef struct sel_ctx {
    int64_t B, T, D;
    int mode;
    int32_t *ids;
    float *x, *y, *r;
} sel_ctx;

static double sel_loss(void *p) {
    sel_ctx *c = p;
    tg_op op = tg_test_op(TG_OP_SELECT_TOKEN);
    op.p.select = (tg_select_params){.b = c->B, .t = c->T, .d = c->D, .mode = c->mode, .pad_id = 0};
    tg_cpu_op_args a = {.op = &op, .in = {c->x, c->ids}, .out = {c->y}};
    tg_cpu_op_run(&a);
    return dot(c->r, c->y, c->B * c->D);
}

TG_TEST(test_op_select_token_grad) {
    enum { B = 3, T = 4, D = 5 };
    /* pad id 0: row 0 has a pad in the middle (last non-pad is t=2), row 1 none (t=3),
     * row 2 is all pad (t=0). */
    int32_t ids[B * T] = {5, 0, 7, 0, 5, 6, 7, 8, 0, 0, 0, 0};
    const int64_t expect[2][B] = {{0, 0, 0}, {2, 3, 0}};
    for (int mode = 0; mode < 2; mode++) {
        sel_ctx c = {B, T, D, mode, ids, frand(B * T * D, 60, -1, 1), fconst(B * D, NAN),
                     frand(B * D, 61, -1, 1)};
        sel_loss(&c);
        int bad = 0;
        for (int b = 0; b < B; b++)
            bad += memcmp(c.y + b * D, c.x + (b * T + expect[mode][b]) * D, D * 4) != 0;
        CHECK(!bad, "mode %d: %d rows selected the wrong token", mode, bad);
        float *dx = fconst(B * T * D, NAN);
        tg_op op = tg_test_op(TG_OP_SELECT_TOKEN_BWD);
        op.p.select = (tg_select_params){.b = B, .t = T, .d = D, .mode = mode, .pad_id = 0};
        tg_cpu_op_args a = {.op = &op, .in = {c.r, ids}, .out = {dx}};
        tg_cpu_op_run(&a);
        int wrong = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < D; d++) {
                    float want = t == expect[mode][b] ? c.r[b * D + d] : 0.0f;
                    wrong += dx[(b * T + t) * D + d] != want; /* NaN poison counts too */
                }
        CHECK(!wrong, "mode %d: %d backward elements wrong (unselected rows must be 0)", mode,
              wrong);
        grad_check(mode ? "select last non-pad" : "select first", sel_loss, &c, c.x, B * T * D, dx);
        free(c.x), free(c.y), free(c.r), free(dx);
    }
}

/* ---- cross entropy ------------------------------------------------------------------------ */

typedef struct ce_ctx {
    int64_t N, C;
    float *logits;
    int32_t *labels;
    float dloss;
} ce_ctx;

static float run_ce(const ce_ctx *c, tg_threadpool *tp) {
    float loss = NAN;
    tg_op op = tg_test_op(TG_OP_CROSS_ENTROPY);
    op.p.cross_entropy = (tg_cross_entropy_params){.n = c->N, .c = c->C};
    tg_cpu_op_args a = {.op = &op, .in = {c->logits, c->labels}, .out = {&loss}, .threads = tp};
    tg_cpu_op_run(&a);
    return loss;
}

static double ce_loss(void *p) {
    ce_ctx *c = p;
    return (double)c->dloss * run_ce(c, NULL);
}

static double ce_reference(const ce_ctx *c) {
    double sum = 0;
    int valid = 0;
    for (int64_t n = 0; n < c->N; n++) {
        if (c->labels[n] == TG_IGNORE_INDEX) continue;
        const float *x = c->logits + n * c->C;
        double mx = -INFINITY, s = 0;
        for (int64_t k = 0; k < c->C; k++) mx = fmax(mx, x[k]);
        for (int64_t k = 0; k < c->C; k++) s += exp(x[k] - mx);
        sum += log(s) + mx - x[c->labels[n]];
        valid++;
    }
    return valid ? sum / valid : 0.0;
}

/* The forward's row lse (out1, hi + lo) is the loss's double lse to 48 bits, 0, 0 on
 * ignored rows; the backward reading it (in4) gives the gradient of the backward that
 * computes lse itself, to within a float's last bit; padded classes (classes < C) too. */
TG_TEST(test_op_cross_entropy_saved_lse) {
    enum { N = 5, C = 40, V = 37 };
    int32_t labels[N] = {3, TG_IGNORE_INDEX, 36, 0, 20};
    float *x = frand(N * C, 71, -4, 4), lse[2 * N], dloss = 0.7f;
    for (int i = 0; i < 2 * N; i++) lse[i] = NAN;
    float loss = NAN;
    tg_op op = tg_test_op(TG_OP_CROSS_ENTROPY);
    op.p.cross_entropy = (tg_cross_entropy_params){.n = N, .c = C, .classes = V};
    tg_cpu_op_args a = {.op = &op, .in = {x, labels}, .out = {&loss, lse}, .threads = pool3()};
    tg_cpu_op_run(&a);
    for (int n = 0; n < N; n++) {
        double mx = -INFINITY, s = 0;
        for (int k = 0; k < V; k++) mx = fmax(mx, x[n * C + k]);
        for (int k = 0; k < V; k++) s += exp(x[n * C + k] - mx);
        const double want = labels[n] == TG_IGNORE_INDEX ? 0.0 : log(s) + mx, got = (double)lse[2 * n] + lse[2 * n + 1];
        CHECK(fabs(got - want) <= 1e-13 * fmax(1.0, fabs(want)) && (float)want == lse[2 * n],
              "row %d: lse %.17g (hi %.9g lo %.9g), want %.17g", n, got, lse[2 * n], lse[2 * n + 1], want);
    }
    float *with = fconst(N * C, NAN), *without = fconst(N * C, NAN);
    tg_op bop = tg_test_op(TG_OP_CROSS_ENTROPY_BWD);
    bop.p.cross_entropy = op.p.cross_entropy;
    tg_cpu_op_args b = {.op = &bop, .in = {&dloss, x, labels, NULL, lse}, .out = {with}, .threads = pool3()};
    tg_cpu_op_run(&b);
    b.in[4] = NULL, b.out[0] = without;
    tg_cpu_op_run(&b);
    int bad = 0;
    for (int i = 0; i < N * C; i++) bad += !(fabsf(with[i] - without[i]) <= 1.2e-7f * fabsf(without[i]));
    CHECK(!bad, "%d gradient entries differ by more than a float's last bit", bad);
    free(x), free(with), free(without);
}

TG_TEST(test_op_cross_entropy_grad) {
    int32_t labels[6] = {3, TG_IGNORE_INDEX, 0, 6, TG_IGNORE_INDEX, 2};
    ce_ctx c = {6, 7, frand(6 * 7, 70, -3, 3), labels, 1.3f};
    float loss = run_ce(&c, pool3());
    CHECK(fabs(loss - ce_reference(&c)) < 1e-6, "loss %.9g vs reference %.9g", loss,
          ce_reference(&c));

    float *dl = fconst(6 * 7, NAN);
    tg_op op = tg_test_op(TG_OP_CROSS_ENTROPY_BWD);
    op.p.cross_entropy = (tg_cross_entropy_params){.n = 6, .c = 7};
    tg_cpu_op_args a = {.op = &op, .in = {&c.dloss, c.logits, labels}, .out = {dl},
                        .threads = pool3()};
    tg_cpu_op_run(&a);
    int bad = 0;
    for (int k = 0; k < 7; k++) bad += dl[1 * 7 + k] != 0.0f || dl[4 * 7 + k] != 0.0f;
    CHECK(!bad, "ignored rows must get exactly 0 gradient (%d not)", bad);
    grad_check("cross entropy", ce_loss, &c, c.logits, 6 * 7, dl);

    /* Large logits must not overflow (log-softmax is shifted by the row max). */
    for (int i = 0; i < 7; i++) c.logits[i] += 1000.0f;
    loss = run_ce(&c, NULL);
    CHECK(isfinite(loss) && fabs(loss - ce_reference(&c)) < 1e-4, "large logits: loss %g vs %g",
          loss, ce_reference(&c));

    int32_t none[6] = {-100, -100, -100, -100, -100, -100};
    c.labels = none;
    a.in[2] = none;
    for (int i = 0; i < 42; i++) dl[i] = NAN;
    tg_cpu_op_run(&a);
    float zeros[42] = {0};
    CHECK(run_ce(&c, NULL) == 0.0f && max_abs_diff(dl, zeros, 42) == 0.0,
          "all rows ignored: loss must be 0 and gradients 0");
    free(c.logits), free(dl);
}

/* ---- span loss (question answering) -------------------------------------------------------- */

typedef struct span_ctx {
    int64_t B, T;
    float *logits; /* [B*T, 2] */
    int32_t *pos;  /* [B, 2] */
    float dloss;
} span_ctx;

static float run_span(const span_ctx *c, tg_threadpool *tp) {
    float loss = NAN;
    tg_op op = tg_test_op(TG_OP_SPAN_LOSS);
    op.p.span_loss = (tg_span_loss_params){.b = c->B, .t = c->T};
    tg_cpu_op_args a = {.op = &op, .in = {c->logits, c->pos}, .out = {&loss}, .threads = tp};
    tg_cpu_op_run(&a);
    return loss;
}

static double span_loss_fd(void *p) {
    span_ctx *c = p;
    return (double)c->dloss * run_span(c, NULL);
}

/* HF's loss written out: positions clamped to [0, T], T ignored; each side a mean of
 * -log softmax over its counted rows; the two averaged. */
static double span_reference(const span_ctx *c) {
    double total = 0;
    for (int side = 0; side < 2; side++) {
        double sum = 0;
        int n = 0;
        for (int64_t b = 0; b < c->B; b++) {
            int64_t p = c->pos[2 * b + side];
            p = p < 0 ? 0 : p > c->T ? c->T : p;
            if (p == c->T) continue;
            double mx = -INFINITY, s = 0;
            for (int64_t t = 0; t < c->T; t++) mx = fmax(mx, c->logits[(b * c->T + t) * 2 + side]);
            for (int64_t t = 0; t < c->T; t++) s += exp(c->logits[(b * c->T + t) * 2 + side] - mx);
            sum += log(s) + mx - c->logits[(b * c->T + p) * 2 + side];
            n++;
        }
        if (n) total += sum / n;
    }
    return total / 2;
}

TG_TEST(test_op_span_loss_grad) {
    /* Row 0 answers at 3..5; row 1 is unanswerable (0, 0: [CLS]); row 2's start is past T
     * (ignored) and its end negative (clamped to 0); row 3's end is exactly T (ignored);
     * row 4 is a batch's padding row (TG_SPAN_NONE on both sides). */
    int32_t pos[10] = {3, 5, 0, 0, 9, -4, 2, 7, TG_SPAN_NONE, TG_SPAN_NONE};
    span_ctx c = {5, 7, frand(5 * 7 * 2, 71, -3, 3), pos, 0.7f};
    float loss = run_span(&c, pool3());
    CHECK(fabs(loss - span_reference(&c)) < 1e-6, "loss %.9g vs reference %.9g", loss, span_reference(&c));

    float *dl = fconst(5 * 7 * 2, NAN);
    tg_op op = tg_test_op(TG_OP_SPAN_LOSS_BWD);
    op.p.span_loss = (tg_span_loss_params){.b = 5, .t = 7};
    tg_cpu_op_args a = {.op = &op, .in = {&c.dloss, c.logits, pos}, .out = {dl}, .threads = pool3()};
    tg_cpu_op_run(&a);
    int bad = 0;
    for (int t = 0; t < 7; t++)
        bad += dl[(2 * 7 + t) * 2] != 0.0f || dl[(3 * 7 + t) * 2 + 1] != 0.0f || dl[(4 * 7 + t) * 2] != 0.0f ||
               dl[(4 * 7 + t) * 2 + 1] != 0.0f;
    CHECK(!bad, "ignored sides must get exactly 0 gradient (%d not)", bad);
    /* Each counted side's gradient sums to 0 over its positions (softmax - onehot). */
    double row = 0;
    for (int t = 0; t < 7; t++) row += dl[(2 * 7 + t) * 2 + 1];
    CHECK(fabs(row) < 1e-6, "row 2's end gradient sums to %g", row);
    grad_check("span loss", span_loss_fd, &c, c.logits, 5 * 7 * 2, dl);

    /* One side with no counted row adds 0: the start side alone here, halved. */
    int32_t ends_only[10] = {7, 1, 7, 2, 99, 0, 7, 6, 7, 3};
    c.pos = ends_only;
    CHECK(fabs(run_span(&c, NULL) - span_reference(&c)) < 1e-6, "no counted start: %.9g vs %.9g", run_span(&c, NULL),
          span_reference(&c));
    /* Nothing counted: loss 0 and gradients 0. */
    int32_t none[10] = {7, 7, 8, 9, TG_SPAN_NONE, 7, 7, 70, 7, 7};
    c.pos = none;
    a.in[2] = none;
    for (int i = 0; i < 70; i++) dl[i] = NAN;
    tg_cpu_op_run(&a);
    float zeros[70] = {0};
    CHECK(run_span(&c, NULL) == 0.0f && max_abs_diff(dl, zeros, 70) == 0.0,
          "every position ignored: loss must be 0 and gradients 0");
    free(c.logits), free(dl);
}

/* ---- optimizer ops ------------------------------------------------------------------------- */

static void run_schedule(float base, int warmup, float *step, float total, float *lr) {
    tg_op op = tg_test_op(TG_OP_SCHEDULE);
    op.p.schedule = (tg_schedule_params){.warmup = warmup, .lr = base};
    tg_cpu_op_args a = {.op = &op, .in = {step, &total}, .out = {lr, step}}; /* aliased */
    tg_cpu_op_run(&a);
}

TG_TEST(test_op_schedule) {
    /* base 1e-3, warmup 4, total 10: HF get_linear_schedule_with_warmup. */
    const float steps[] = {0, 1, 2, 4, 7, 9, 10, 12};
    const double factor[] = {0, 0.25, 0.5, 1.0, 0.5, 1.0 / 6, 0, 0};
    for (int i = 0; i < 8; i++) {
        float step = steps[i], lr = NAN;
        run_schedule(1e-3f, 4, &step, 10, &lr);
        CHECK(fabs(lr - 1e-3 * factor[i]) <= 1e-9, "step %g: lr %.9g, expected %.9g", steps[i],
              lr, 1e-3 * factor[i]);
        CHECK(step == steps[i] + 1, "step %g: counter became %g", steps[i], step);
    }
    float step = 0, lr = NAN;
    run_schedule(2e-5f, 0, &step, 8, &lr);
    CHECK(fabs(lr - 2e-5) <= 1e-12, "no warmup: lr at step 0 is %g, expected the base", lr);
    step = 3, lr = NAN;
    run_schedule(2e-5f, 0, &step, 8, &lr);
    CHECK(fabs(lr - 2e-5 * 5 / 8) <= 1e-12, "no warmup: lr at step 3 is %g", lr);
}

/* A plan holding just a tensor table: the pool views and a few parameters, as the
 * optimizer ops read it. */
typedef struct mini_plan {
    tg_plan plan;
    tg_tensor t[5];
} mini_plan;

enum { PARAM_POOL_FLOATS = 200 };

static void mini_plan_init(mini_plan *mp) {
    memset(mp, 0, sizeof *mp);
    /* w [3] decays, b [2] does not, w2 [2,2] decays; offsets 256-byte aligned. */
    const struct { const char *name; int flags; int64_t n; uint64_t off; } p[3] = {
        {"w", TG_TENSOR_PARAM, 3, 0},
        {"b", TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY, 2, 256},
        {"w2", TG_TENSOR_PARAM, 4, 512}};
    for (int i = 0; i < 3; i++) {
        tg_tensor *t = &mp->t[i];
        snprintf(t->name, sizeof t->name, "%s", p[i].name);
        t->pool = TG_POOL_PARAMS, t->flags = p[i].flags, t->ndim = 1, t->shape[0] = p[i].n;
        t->offset = p[i].off, t->bytes = (uint64_t)p[i].n * 4;
    }
    mp->t[2].ndim = 2, mp->t[2].shape[0] = 2, mp->t[2].shape[1] = 2;
    /* Whole-pool views: grads (what GRAD_NORM reads) and params (flagged PARAM too, to
     * check that views are not updated twice). */
    for (int i = 3; i < 5; i++) {
        tg_tensor *t = &mp->t[i];
        t->pool = i == 3 ? TG_POOL_GRADS : TG_POOL_PARAMS;
        t->flags = TG_TENSOR_VIEW | (i == 4 ? TG_TENSOR_PARAM : 0);
        t->ndim = 1, t->shape[0] = PARAM_POOL_FLOATS, t->bytes = PARAM_POOL_FLOATS * 4;
    }
    mp->plan.n_tensors = 5;
    mp->plan.tensors = mp->t;
}

TG_TEST(test_op_grad_norm) {
    mini_plan mp;
    mini_plan_init(&mp);
    float g[PARAM_POOL_FLOATS];
    tg_test_fill_uniform(g, PARAM_POOL_FLOATS, 80, -1, 1);
    tg_op op = tg_test_op(TG_OP_GRAD_NORM);
    op.in[0] = 3;
    float norm = NAN;
    tg_cpu_op_args a = {.op = &op, .in = {g}, .out = {&norm}, .plan = &mp.plan};
    tg_cpu_op_run(&a);
    double s = 0;
    for (int i = 0; i < PARAM_POOL_FLOATS; i++) s += (double)g[i] * g[i];
    CHECK(fabs(norm - sqrt(s)) <= 1e-6 * sqrt(s), "norm %.9g, expected %.9g", norm, sqrt(s));

    /* A view larger than one reduction block, threaded vs inline: identical bits. */
    int64_t n = 200003;
    float *big = frand(n, 81, -1, 1), n1 = NAN, n2 = NAN;
    mp.t[3].shape[0] = n;
    a.in[0] = big, a.out[0] = &n1;
    tg_cpu_op_run(&a);
    a.out[0] = &n2, a.threads = pool3();
    tg_cpu_op_run(&a);
    s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)big[i] * big[i];
    CHECK(fabs(n1 - sqrt(s)) <= 1e-6 * sqrt(s), "large norm %.9g, expected %.9g", n1, sqrt(s));
    CHECK(n1 == n2, "threaded norm %.9g differs from inline %.9g", n2, n1);
    free(big);
}

/* torch.optim.AdamW, one element, in double. */
static void adamw_ref(double *p, double *m, double *v, double g, double lr, double t, int decay,
                      double b1, double b2, double eps, double wd) {
    if (decay) *p -= lr * wd * *p;
    *m = b1 * *m + (1 - b1) * g;
    *v = b2 * *v + (1 - b2) * g * g;
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    *p -= lr / bc1 * *m / (sqrt(*v) / sqrt(bc2) + eps);
}

TG_TEST(test_op_adamw) {
    mini_plan mp;
    mini_plan_init(&mp);
    const float b1 = 0.9f, b2 = 0.999f, eps = 1e-6f, wd = 0.1f, max_norm = 1.0f;
    float P[PARAM_POOL_FLOATS], G[PARAM_POOL_FLOATS], Mo[PARAM_POOL_FLOATS], Vo[PARAM_POOL_FLOATS];
    tg_test_fill_uniform(P, PARAM_POOL_FLOATS, 90, -1, 1); /* padding included: must stay */
    float P0[PARAM_POOL_FLOATS];
    memcpy(P0, P, sizeof P);
    memset(Mo, 0, sizeof Mo), memset(Vo, 0, sizeof Vo);
    const int idx[9] = {0, 1, 2, 64, 65, 128, 129, 130, 131};
    const int decay[9] = {1, 1, 1, 0, 0, 1, 1, 1, 1};
    double rp[9], rm[9] = {0}, rv[9] = {0};
    for (int k = 0; k < 9; k++) rp[k] = P[idx[k]];

    tg_op op = tg_test_op(TG_OP_ADAMW);
    op.p.adamw = (tg_adamw_params){.beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd, .max_grad_norm = max_norm};
    tg_op nop = tg_test_op(TG_OP_GRAD_NORM);
    nop.in[0] = 3;
    /* Step 1: gradients of norm ~3, clipped to 1. Step 2: small gradients, not clipped. */
    const float lrs[2] = {1e-2f, 5e-3f};
    const float gscale[2] = {2.0f, 0.05f};
    int clipped[2];
    for (int s = 0; s < 2; s++) {
        memset(G, 0, sizeof G);
        float tmp[9];
        tg_test_fill_uniform(tmp, 9, 91 + s, -gscale[s], gscale[s]);
        for (int k = 0; k < 9; k++) G[idx[k]] = tmp[k];
        float Gcopy[PARAM_POOL_FLOATS];
        memcpy(Gcopy, G, sizeof G);
        float norm = NAN, lr = lrs[s], t = (float)(s + 1);
        tg_cpu_op_args na = {.op = &nop, .in = {G}, .out = {&norm}, .plan = &mp.plan};
        tg_cpu_op_run(&na);
        tg_cpu_op_args a = {.op = &op, .in = {G, &lr, &t, &norm}, .out = {P, Mo, Vo},
                            .plan = &mp.plan, .threads = s ? pool3() : NULL};
        tg_cpu_op_run(&a);
        CHECK(!memcmp(G, Gcopy, sizeof G), "step %d: adamw modified the gradients", s + 1);
        double clip = fmin(1.0, max_norm / ((double)norm + 1e-6));
        clipped[s] = clip < 1.0;
        for (int k = 0; k < 9; k++)
            adamw_ref(&rp[k], &rm[k], &rv[k], G[idx[k]] * clip, lr, t, decay[k], b1, b2, eps, wd);
        double worst = 0;
        for (int k = 0; k < 9; k++) {
            int i = idx[k];
            worst = fmax(worst, fabs(P[i] - rp[k]) + fabs(Mo[i] - rm[k]) + fabs(Vo[i] - rv[k]));
        }
        CHECK(worst < 1e-6, "step %d: params/m/v differ from the AdamW reference by %g", s + 1,
              worst);
    }
    CHECK(clipped[0] && !clipped[1], "the test data should clip step 1 only");
    int touched = 0;
    for (int i = 0; i < PARAM_POOL_FLOATS; i++) {
        int is_param = 0;
        for (int k = 0; k < 9; k++) is_param |= idx[k] == i;
        if (!is_param) touched += P[i] != P0[i] || Mo[i] != 0.0f || Vo[i] != 0.0f;
    }
    CHECK(!touched, "%d padding elements between parameters were modified", touched);
}

/* ---- executor ------------------------------------------------------------------------------ */

TG_TEST(test_op_exec) {
    tg_tensor t[3];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 3; i++) {
        snprintf(t[i].name, sizeof t[i].name, "t%d", i);
        t[i].pool = TG_POOL_ACTIVATIONS, t[i].ndim = 1, t[i].shape[0] = 5;
        t[i].offset = (uint64_t)i * 256, t[i].bytes = 20;
    }
    tg_op ops[3] = {tg_test_op(TG_OP_FILL), tg_test_op(TG_OP_FILL), tg_test_op(TG_OP_ADD)};
    ops[0].out[0] = 0, ops[0].p.fill.value = 2.0f;
    ops[1].out[0] = 1, ops[1].p.fill.value = 3.5f;
    ops[2].in[0] = 0, ops[2].in[1] = 1, ops[2].out[0] = 2, ops[2].p.count.n = 5;
    ops[2].phase = TG_PHASE_BACKWARD;
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = 3, plan.tensors = t, plan.n_ops = 3, plan.ops = ops;
    plan.phase_begin[0] = 0, plan.phase_begin[1] = 2, plan.phase_begin[2] = 3;
    plan.phase_begin[3] = 3;
    plan.pool_bytes[TG_POOL_ACTIVATIONS] = 532;
    plan.run.seed = 77;

    tg_cpu_exec x;
    tg_err err = {{0}};
    REQUIRE(tg_cpu_exec_init(&x, &plan, 2, &err) == 0, "init: %s", err.msg);
    CHECK(x.seed == 77 && x.training == 1, "seed %llu training %d", (unsigned long long)x.seed,
          x.training);
    CHECK(x.pool[TG_POOL_PARAMS] == NULL, "an empty pool should have no storage");
    float *c = tg_cpu_tensor(&x, 2);
    CHECK((uint8_t *)c == x.pool[TG_POOL_ACTIVATIONS] + 512 &&
              ((uintptr_t)x.pool[TG_POOL_ACTIVATIONS] & 63) == 0,
          "tensor address or pool alignment wrong");
    CHECK(tg_cpu_tensor(&x, 3) == NULL, "out-of-table tensor must give NULL");
    CHECK(c[0] == 0.0f && c[4] == 0.0f, "pools must start zero-filled");
    REQUIRE(tg_cpu_exec_phases(&x, TG_PHASE_FORWARD, TG_PHASE_FORWARD, &err) == 0, "%s", err.msg);
    CHECK(c[0] == 0.0f, "the forward phase ran a backward op");
    REQUIRE(tg_cpu_exec_phases(&x, TG_PHASE_BACKWARD, TG_PHASE_OPTIMIZER, &err) == 0, "%s",
            err.msg);
    int bad = 0;
    for (int i = 0; i < 5; i++) bad += c[i] != 5.5f;
    CHECK(!bad, "add through the executor: %d elements wrong", bad);

    CHECK(tg_cpu_exec_phases(&x, 2, 1, &err) == -1, "a reversed phase range must fail");
    CHECK(tg_cpu_exec_range(&x, 0, 4, &err) == -1, "a range past the schedule must fail");
    ops[2].kind = TG_OP_COUNT;
    CHECK(tg_cpu_exec_range(&x, 2, 3, &err) == -1 && strstr(err.msg, "kind"),
          "an unknown kind must fail: '%s'", err.msg);
    ops[2].kind = TG_OP_ADD;
    ops[2].in[1] = 9;
    CHECK(tg_cpu_exec_range(&x, 2, 3, &err) == -1 && strstr(err.msg, "tensor 9"),
          "an out-of-table tensor must fail: '%s'", err.msg);
    ops[2].in[1] = 1;
    t[1].offset = 768; /* past the pool's end */
    CHECK(tg_cpu_exec_range(&x, 2, 3, &err) == -1 && strstr(err.msg, "outside"),
          "a tensor outside its pool must fail: '%s'", err.msg);
    tg_cpu_exec_free(&x);
}
