/* Llama's ops on the CPU reference (runtime/cpu/llama.c) and the rotary inverse frequencies
 * (kernels/rope.h), each against an implementation written here in double:
 *
 * - RMSNORM against hand-computed rows and a double forward; RMSNORM_BWD's dx and dgamma
 *   (added into what the buffer holds) against central differences of that double forward;
 * - ROPE against a straightforward rotary embedding (HF's rotate_half: y[i] = x[i] cos -
 *   x[i + Dh/2] sin, y[i + Dh/2] = x[i + Dh/2] cos + x[i] sin; output head j reads kv head
 *   j / (H / Hkv)) for H = 4 with Hkv 4, 2 and 1, rope default and llama3; ROPE_BWD as its
 *   exact adjoint (<ROPE(x), dy> = <x, ROPE_BWD(dy)>);
 * - SWIGLU against known values and a double forward, SWIGLU_BWD by central differences;
 * - tg_rope_inv_freq against the llama3 rule in double where short, medium and long
 *   wavelengths all occur;
 *
 * and each kernel's optional outputs and scratch allocations. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/rope.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/threadpool.h"
#include "tests/harness.h"
#include "tests/op_fixtures.h"



static int same(const float *a, const float *b, int64_t n) { return !memcmp(a, b, sizeof(float) * (size_t)n); }

/* Largest |got - want| / max(1, |want|) over n elements; +inf for NaN. */
static double worst_rel(const float *got, const double *want, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

/* ---- RMSNorm ------------------------------------------------------------------------- */

static void run_rmsnorm(int64_t M, int64_t D, float eps, const float *x, const float *g, float *y, float *rstd,
                        tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_RMSNORM);
    op.p.rmsnorm = (tg_rmsnorm_params){.m = M, .d = D, .eps = eps};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x, (void *)g}, .out = {y, rstd}, .threads = tp};
    tg_cpu_op_run(&a);
}

/* RMSNORM_BWD; returns the out-of-memory flag. */
static int run_rmsnorm_bwd(int64_t M, int64_t D, const float *dy, const float *x, const float *g, const float *rstd,
                           float *dx, float *dg, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_RMSNORM_BWD);
    op.p.rmsnorm = (tg_rmsnorm_params){.m = M, .d = D, .eps = 1e-5f};
    atomic_int oom = 0;
    tg_cpu_op_args a = {.op = &op,
                        .in = {(void *)dy, (void *)x, (void *)g, (void *)rstd},
                        .out = {dx, dg},
                        .threads = tp,
                        .out_of_memory = &oom};
    tg_cpu_op_run(&a);
    return atomic_load(&oom);
}

/* HF's LlamaRMSNorm in double: y = g * x / sqrt(mean(x^2) + eps). */
static void rmsnorm_ref(int64_t M, int64_t D, double eps, const double *x, const double *g, double *y, double *rstd) {
    for (int64_t m = 0; m < M; m++) {
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += x[m * D + d] * x[m * D + d];
        const double rs = 1.0 / sqrt(ss / (double)D + eps);
        if (rstd) rstd[m] = rs;
        for (int64_t d = 0; d < D; d++) y[m * D + d] = g[d] * x[m * D + d] * rs;
    }
}

/* Rows worked by hand (eps 0 or 0.25): [3, -4, 0, 0] has mean square 6.25, rstd 0.4;
 * [1, 1, 1, 1] rstd 1; [0, 0, 0, 0] with eps 0.25 rstd 2 and y 0; [2, 2, 2, 2] rstd 0.5. */
TG_TEST(test_op_rmsnorm_hand_values) {
    const float x[3 * 4] = {3, -4, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, g[4] = {1, 0.5f, 2, -1};
    float y[12], rstd[3];
    run_rmsnorm(3, 4, 0.0f, x, g, y, rstd, NULL);
    const float want_y[12] = {1.2f, -0.8f, 0, 0, 1, 0.5f, 2, -1, 1, 0.5f, 2, -1};
    const float want_rstd[3] = {0.4f, 1, 0.5f};
    for (int i = 0; i < 12; i++) CHECK(fabsf(y[i] - want_y[i]) < 1e-6f, "y[%d] %.9g, want %g", i, y[i], want_y[i]);
    for (int m = 0; m < 3; m++)
        CHECK(fabsf(rstd[m] - want_rstd[m]) < 1e-7f, "rstd[%d] %.9g, want %g", m, rstd[m], want_rstd[m]);
    /* eps inside the root: a zero row with eps 0.25 has rstd 1 / sqrt(0.25) = 2. */
    const float zero[2] = {0, 0}, ones[2] = {1, 1};
    float y0[2] = {NAN, NAN}, r0 = NAN;
    run_rmsnorm(1, 2, 0.25f, zero, ones, y0, &r0, NULL);
    CHECK(r0 == 2.0f && y0[0] == 0.0f && y0[1] == 0.0f, "zero row, eps 0.25: rstd %g, y %g %g", r0, y0[0], y0[1]);
    /* [3, 4] with eps 0.25: mean square 12.5 + 0.25 = 12.75. */
    const float x2[2] = {3, 4};
    run_rmsnorm(1, 2, 0.25f, x2, ones, y0, &r0, NULL);
    const double rs = 1.0 / sqrt(12.75);
    CHECK(fabs(r0 - rs) < 1e-7 && fabs(y0[0] - 3 * rs) < 1e-6 && fabs(y0[1] - 4 * rs) < 1e-6,
          "[3, 4] eps 0.25: rstd %.9g (%.9g), y %.9g %.9g", r0, rs, y0[0], y0[1]);
}

/* Random rows against the double forward; the same bits on 1 and 3 threads and without the
 * rstd output (optional to the kernel). */
TG_TEST(test_op_rmsnorm_forward) {
    const int64_t M = 7, D = 24;
    float *x = frand(M * D, 21, -2, 2), *g = frand(D, 22, 0.5f, 1.5f);
    float *y = fconst(M * D, NAN), *rstd = fconst(M, NAN), *y1 = fconst(M * D, NAN), *y2 = fconst(M * D, NAN);
    float *r1 = fconst(M, NAN);
    double xd[7 * 24], gd[24], yd[7 * 24], rd[7];
    for (int64_t i = 0; i < M * D; i++) xd[i] = x[i];
    for (int64_t d = 0; d < D; d++) gd[d] = g[d];
    rmsnorm_ref(M, D, 1e-5, xd, gd, yd, rd);
    run_rmsnorm(M, D, 1e-5f, x, g, y, rstd, pool3());
    CHECK(worst_rel(y, yd, M * D) < 2e-6, "y vs double: %g", worst_rel(y, yd, M * D));
    CHECK(worst_rel(rstd, rd, M) < 2e-6, "rstd vs double: %g", worst_rel(rstd, rd, M));
    run_rmsnorm(M, D, 1e-5f, x, g, y1, r1, NULL);
    CHECK(same(y, y1, M * D) && same(rstd, r1, M), "1 and 3 threads differ");
    run_rmsnorm(M, D, 1e-5f, x, g, y2, NULL, pool3());
    CHECK(same(y, y2, M * D), "y changed without the rstd output");
    free(x), free(g), free(y), free(rstd), free(y1), free(y2), free(r1);
}

typedef struct rms_fd {
    int64_t M, D;
    double *x, *g;
    const double *r;
} rms_fd;

/* L = sum(r * y) of the double forward. */
static double rms_loss(const rms_fd *c) {
    double *y = malloc(sizeof(double) * (size_t)(c->M * c->D));
    if (!y) abort();
    rmsnorm_ref(c->M, c->D, 1e-5, c->x, c->g, y, NULL);
    double s = 0;
    for (int64_t i = 0; i < c->M * c->D; i++) s += c->r[i] * y[i];
    free(y);
    return s;
}

/* Central difference of rms_loss in *v (an element of x or g), step 1e-6 in double. */
static double rms_fd_at(rms_fd *c, double *v) {
    const double v0 = *v, h = 1e-6;
    *v = v0 + h;
    const double lp = rms_loss(c);
    *v = v0 - h;
    const double lm = rms_loss(c);
    *v = v0;
    return (lp - lm) / (2 * h);
}

/* dx and dgamma against central differences of the double forward (every element); dgamma
 * is added into the values the buffer holds. */
TG_TEST(test_op_rmsnorm_bwd_finite_differences) {
    enum { M = 5, D = 12 };
    float *x = frand(M * D, 31, -2, 2), *g = frand(D, 32, 0.5f, 1.5f), *dy = frand(M * D, 33, -1, 1);
    float y[M * D], rstd[M], dx[M * D], dg[D], dx1[M * D], dg1[D];
    run_rmsnorm(M, D, 1e-5f, x, g, y, rstd, NULL);
    memset(dg1, 0, sizeof dg1);
    const float start[D] = {-1, -0.75f, -0.5f, -0.25f, 0, 0.25f, 0.5f, 0.75f, 1, 1.25f, 1.5f, 1.75f};
    memcpy(dg, start, sizeof dg);
    CHECK(!run_rmsnorm_bwd(M, D, dy, x, g, rstd, dx, dg, pool3()), "out of memory");
    double xd[M * D], gd[D], rd[M * D];
    for (int i = 0; i < M * D; i++) xd[i] = x[i], rd[i] = dy[i];
    for (int d = 0; d < D; d++) gd[d] = g[d];
    rms_fd c = {M, D, xd, gd, rd};
    double worst_x = 0, worst_g = 0, norm_x = 0, norm_g = 0;
    for (int i = 0; i < M * D; i++) {
        const double fd = rms_fd_at(&c, &xd[i]);
        worst_x = fmax(worst_x, fabs(dx[i] - fd) / fmax(1.0, fabs(fd)));
        norm_x += fabs(fd);
    }
    for (int d = 0; d < D; d++) {
        const double fd = rms_fd_at(&c, &gd[d]);
        worst_g = fmax(worst_g, fabs((dg[d] - start[d]) - fd) / fmax(1.0, fabs(fd)));
        norm_g += fabs(fd);
    }
    CHECK(worst_x < 1e-5 && norm_x > 1, "dx vs finite differences: %g (|fd| %g)", worst_x, norm_x);
    CHECK(worst_g < 1e-5 && norm_g > 1, "dgamma (added) vs finite differences: %g (|fd| %g)", worst_g, norm_g);
    /* 1 thread: the same bits; a zeroed dgamma gets the sums alone. */
    CHECK(!run_rmsnorm_bwd(M, D, dy, x, g, rstd, dx1, dg1, NULL), "out of memory");
    int added = 1;
    for (int d = 0; d < D; d++) added &= dg1[d] + start[d] == dg[d];
    CHECK(same(dx, dx1, M * D) && added, "1 and 3 threads differ, or dgamma is not start + sums");
    free(x), free(g), free(dy);
}

/* Each output alone (both are optional to the kernel), and the column sums' scratch failing. */
TG_TEST(test_op_rmsnorm_bwd_outputs_alone) {
    enum { M = 3, D = 5 };
    float *x = frand(M * D, 41, -2, 2), *g = frand(D, 42, 0.5f, 1.5f), *dy = frand(M * D, 43, -1, 1);
    float y[M * D], rstd[M], dx[M * D], dg[D] = {0}, dx2[M * D], dg2[D] = {0};
    run_rmsnorm(M, D, 1e-5f, x, g, y, rstd, NULL);
    CHECK(!run_rmsnorm_bwd(M, D, dy, x, g, rstd, dx, dg, NULL), "out of memory");
    CHECK(!run_rmsnorm_bwd(M, D, dy, x, g, rstd, dx2, NULL, NULL), "out of memory");
    CHECK(same(dx, dx2, M * D), "dx changed without dgamma");
    CHECK(!run_rmsnorm_bwd(M, D, dy, x, g, rstd, NULL, dg2, NULL), "out of memory");
    CHECK(same(dg, dg2, D), "dgamma changed without dx");
    /* dgamma is the column sums of dy * x * rstd. */
    for (int d = 0; d < D; d++) {
        double s = 0;
        for (int m = 0; m < M; m++) s += (double)dy[m * D + d] * x[m * D + d] * rstd[m];
        CHECK(fabs(dg[d] - s) < 1e-6, "column %d: %g, want %g", d, dg[d], s);
    }
    /* No scratch for the sums: flagged, dgamma untouched. */
    for (int d = 0; d < D; d++) dg2[d] = 5;
    tg_alloc_fail_after(0);
    const int oom = run_rmsnorm_bwd(M, D, dy, x, g, rstd, NULL, dg2, NULL);
    tg_alloc_fail_after(-1);
    CHECK(oom && dg2[0] == 5 && dg2[D - 1] == 5, "no scratch: flag %d, dgamma[0] %g", oom, dg2[0]);
    free(x), free(g), free(dy);
}

/* ---- rotary positions ----------------------------------------------------------------- */

/* Llama 3.1's rule in double: HF's _compute_llama3_parameters. */
static double inv_freq_ref(const tg_rope_params *p, int64_t i) {
    const double inv = 1.0 / pow((double)p->theta, (double)(2 * i) / (double)p->head_dim);
    if (p->type != TG_ROPE_LLAMA3) return inv;
    const double low_wavelen = p->original_max / (double)p->low_freq, high_wavelen = p->original_max / (double)p->high_freq;
    const double wavelen = 2 * M_PI / inv;
    if (wavelen < high_wavelen) return inv;                   /* short: kept */
    if (wavelen > low_wavelen) return inv / (double)p->factor; /* long: divided by factor */
    const double smooth = (p->original_max / wavelen - p->low_freq) / ((double)p->high_freq - p->low_freq);
    return (1 - smooth) * inv / p->factor + smooth * inv;     /* medium: blended */
}

/* 0 short, 1 medium, 2 long (llama3's three bands of wavelength). */
static int band_of(const tg_rope_params *p, int64_t i) {
    const double wavelen = 2 * M_PI * pow((double)p->theta, (double)(2 * i) / (double)p->head_dim);
    return wavelen < p->original_max / (double)p->high_freq ? 0 : wavelen > p->original_max / (double)p->low_freq ? 2 : 1;
}

/* Llama 3.1 8B's rule (theta 500000, Dh 128, factor 8, low 1, high 4, original 8192) and a
 * small one (theta 10000, Dh 16, factor 8, original 32, as tiny-llama): every band holds
 * frequencies, none near a band's edge; the default rule is 1 / theta^(2i / Dh). */
TG_TEST(test_op_rope_inv_freq) {
    const tg_rope_params cases[] = {
        {.head_dim = 128, .type = TG_ROPE_LLAMA3, .theta = 500000, .factor = 8, .low_freq = 1, .high_freq = 4,
         .original_max = 8192},
        {.head_dim = 16, .type = TG_ROPE_LLAMA3, .theta = 10000, .factor = 8, .low_freq = 1, .high_freq = 4,
         .original_max = 32},
        {.head_dim = 64, .type = TG_ROPE_LLAMA3, .theta = 500000, .factor = 32, .low_freq = 1, .high_freq = 4,
         .original_max = 8192},
        {.head_dim = 128, .type = TG_ROPE_DEFAULT, .theta = 500000, .factor = 8, .low_freq = 1, .high_freq = 4,
         .original_max = 8192},
        {.head_dim = 16, .type = TG_ROPE_DEFAULT, .theta = 10000},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const tg_rope_params *p = &cases[k];
        int bands[3] = {0}, near_edge = 0;
        double worst = 0;
        for (int64_t i = 0; i < p->head_dim / 2; i++) {
            const double want = inv_freq_ref(p, i), got = tg_rope_inv_freq(p, i);
            worst = fmax(worst, fabs(got - want) / want);
            bands[band_of(p, i)]++;
            const double wavelen = 2 * M_PI * pow((double)p->theta, (double)(2 * i) / (double)p->head_dim);
            const double edges[2] = {p->original_max / (double)p->high_freq, p->original_max / (double)p->low_freq};
            for (int e = 0; e < 2 && p->type == TG_ROPE_LLAMA3; e++) near_edge += fabs(wavelen / edges[e] - 1) < 1e-3;
        }
        CHECK(worst < 2e-6, "case %zu: inverse frequencies %g from the double rule", k, worst);
        if (p->type == TG_ROPE_LLAMA3)
            CHECK(bands[0] > 0 && bands[1] > 0 && bands[2] > 0 && !near_edge,
                  "case %zu: bands short %d medium %d long %d, %d near an edge", k, bands[0], bands[1], bands[2],
                  near_edge);
    }
    /* The bands by hand for the small case: wavelengths 2 pi 10000^(i/8) are 6.3 (< 32/4,
     * kept), 19.9 (between 8 and 32: blended) and 62.8 onwards (> 32: divided by 8), inverse
     * frequencies 1, 10000^-1/8 blended, 0.1 / 8. */
    const tg_rope_params *s = &cases[1];
    const double w1 = 2 * M_PI * pow(10000.0, 1.0 / 8), smooth = (32 / w1 - 1) / 3, i1 = pow(10000.0, -1.0 / 8);
    CHECK(tg_rope_inv_freq(s, 0) == 1.0f, "short band: %.9g, want 1", tg_rope_inv_freq(s, 0));
    CHECK(fabs(tg_rope_inv_freq(s, 1) - ((1 - smooth) * i1 / 8 + smooth * i1)) < 1e-7, "medium band: %.9g",
          tg_rope_inv_freq(s, 1));
    CHECK(fabs(tg_rope_inv_freq(s, 2) - 0.1 / 8) < 1e-9, "long band: %.9g, want %g", tg_rope_inv_freq(s, 2), 0.1 / 8);
}

typedef struct rope_case {
    int64_t n, h, kv, dh;
    int type;
} rope_case;

static tg_rope_params rope_params(const rope_case *c) {
    tg_rope_params p = {.n = c->n, .h = c->h, .kv_heads = c->kv, .head_dim = c->dh, .type = c->type, .theta = 10000};
    if (c->type == TG_ROPE_LLAMA3) p.factor = 8, p.low_freq = 1, p.high_freq = 4, p.original_max = 32;
    return p;
}

static int64_t rope_in_row(const rope_case *c) { return (c->h + 2 * c->kv) * c->dh; }
static int64_t rope_out_row(const rope_case *c) { return 3 * c->h * c->dh; }

/* ROPE (inverse 0) or ROPE_BWD (1); returns the out-of-memory flag. */
static int run_rope(const rope_case *c, int inverse, const float *in, const int32_t *pos, float *out,
                    tg_threadpool *tp) {
    tg_op op = tg_test_op(inverse ? TG_OP_ROPE_BWD : TG_OP_ROPE);
    op.p.rope = rope_params(c);
    atomic_int oom = 0;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)in, (void *)pos}, .out = {out}, .threads = tp, .out_of_memory = &oom};
    tg_cpu_op_run(&a);
    return atomic_load(&oom);
}

/* The rotary embedding written out: q heads rotated, k heads rotated and repeated, v heads
 * repeated, output head j reading kv head j / (H / Hkv). */
static void rope_ref(const rope_case *c, const float *x, const int32_t *pos, double *y) {
    const tg_rope_params p = rope_params(c);
    const int64_t H = c->h, Dh = c->dh, half = Dh / 2, G = c->h / c->kv;
    for (int64_t r = 0; r < c->n; r++) {
        const float *q = x + r * rope_in_row(c), *k = q + H * Dh, *v = k + c->kv * Dh;
        double *yr = y + r * rope_out_row(c);
        for (int64_t j = 0; j < H; j++) {
            const float *src[3] = {q + j * Dh, k + (j / G) * Dh, v + (j / G) * Dh};
            for (int part = 0; part < 3; part++) {
                double *dst = yr + (part * H + j) * Dh;
                for (int64_t i = 0; i < half; i++) {
                    const double angle = pos[r] * inv_freq_ref(&p, i), cs = cos(angle), sn = sin(angle);
                    const double a = src[part][i], b = src[part][i + half];
                    if (part == 2) {
                        dst[i] = a, dst[i + half] = b;
                    } else {
                        dst[i] = a * cs - b * sn;
                        dst[i + half] = b * cs + a * sn;
                    }
                }
            }
        }
    }
}

static const rope_case k_rope_cases[] = {
    {6, 4, 2, 16, TG_ROPE_DEFAULT}, {6, 4, 2, 16, TG_ROPE_LLAMA3}, {6, 4, 1, 16, TG_ROPE_DEFAULT},
    {6, 4, 1, 16, TG_ROPE_LLAMA3},  {6, 4, 4, 16, TG_ROPE_DEFAULT}, {6, 4, 4, 16, TG_ROPE_LLAMA3},
    {5, 4, 2, 2, TG_ROPE_LLAMA3},
};
/* Positions of different sizes, repeated and out of order, as packed rows have them. */
static const int32_t k_positions[6] = {0, 1, 7, 31, 3, 100};

TG_TEST(test_op_rope_forward) {
    for (size_t k = 0; k < sizeof k_rope_cases / sizeof k_rope_cases[0]; k++) {
        const rope_case *c = &k_rope_cases[k];
        const int64_t nin = c->n * rope_in_row(c), nout = c->n * rope_out_row(c);
        float *x = frand(nin, 50 + k, -1, 1), *y = fconst(nout, NAN), *y1 = fconst(nout, NAN);
        double *want = malloc(sizeof(double) * (size_t)nout);
        REQUIRE(want, "malloc");
        rope_ref(c, x, k_positions, want);
        CHECK(!run_rope(c, 0, x, k_positions, y, pool3()), "out of memory");
        /* The angles are pos x inv_freq in float, as HF's: within a few float ulps of 100 rad. */
        const double err = worst_rel(y, want, nout);
        CHECK(err < 2e-5, "H %lld Hkv %lld Dh %lld %s: ROPE vs the double rotation: %g", (long long)c->h,
              (long long)c->kv, (long long)c->dh, c->type == TG_ROPE_LLAMA3 ? "llama3" : "default", err);
        /* Position 0 leaves q and k as they are; v is copied exactly everywhere. */
        int exact = 1;
        for (int64_t j = 0; j < c->h; j++)
            exact &= same(y + j * c->dh, x + j * c->dh, c->dh) &&
                     same(y + (c->h + j) * c->dh, x + (c->h + j / (c->h / c->kv)) * c->dh, c->dh);
        for (int64_t r = 0; r < c->n; r++)
            for (int64_t j = 0; j < c->h; j++)
                exact &= same(y + r * rope_out_row(c) + (2 * c->h + j) * c->dh,
                              x + r * rope_in_row(c) + (c->h + c->kv + j / (c->h / c->kv)) * c->dh, c->dh);
        CHECK(exact, "case %zu: position 0 or the v copies are not exact", k);
        CHECK(!run_rope(c, 0, x, k_positions, y1, NULL), "out of memory");
        CHECK(same(y, y1, nout), "case %zu: 1 and 3 threads differ", k);
        free(x), free(y), free(y1), free(want);
    }
}

/* ROPE_BWD is ROPE's transpose: <ROPE(x), dy> = <x, ROPE_BWD(dy)> for random x and dy, the
 * kv heads' gradients summed over the query heads that read them. */
TG_TEST(test_op_rope_bwd_adjoint) {
    for (size_t k = 0; k < sizeof k_rope_cases / sizeof k_rope_cases[0]; k++) {
        const rope_case *c = &k_rope_cases[k];
        const int64_t nin = c->n * rope_in_row(c), nout = c->n * rope_out_row(c);
        for (int trial = 0; trial < 3; trial++) {
            float *x = frand(nin, 60 + 7 * k + trial, -1, 1), *dy = frand(nout, 90 + 7 * k + trial, -1, 1);
            float *y = fconst(nout, NAN), *dx = fconst(nin, NAN), *dx1 = fconst(nin, NAN);
            CHECK(!run_rope(c, 0, x, k_positions, y, NULL), "out of memory");
            CHECK(!run_rope(c, 1, dy, k_positions, dx, pool3()), "out of memory");
            double lhs = 0, rhs = 0, scale = 0;
            for (int64_t i = 0; i < nout; i++) lhs += (double)y[i] * dy[i], scale += fabs((double)y[i] * dy[i]);
            for (int64_t i = 0; i < nin; i++) rhs += (double)x[i] * dx[i];
            CHECK(fabs(lhs - rhs) <= 1e-6 * scale && scale > 1, "case %zu trial %d: <ROPE(x), dy> %.9g, <x, ROPE_BWD(dy)> %.9g",
                  k, trial, lhs, rhs);
            CHECK(!run_rope(c, 1, dy, k_positions, dx1, NULL), "out of memory");
            CHECK(same(dx, dx1, nin), "case %zu: ROPE_BWD differs on 1 and 3 threads", k);
            /* Each element of dx is the adjoint applied to one basis vector: dx[i] =
             * <ROPE(e_i), dy>, checked on a few elements of every part (q, k, v). */
            float *e = fconst(nin, 0), *ye = fconst(nout, NAN);
            const int64_t probe[] = {0, c->dh / 2, c->h * c->dh + 1, (c->h + c->kv) * c->dh + c->dh - 1,
                                     (c->n - 1) * rope_in_row(c) + c->h * c->dh};
            for (size_t pi = 0; pi < sizeof probe / sizeof probe[0]; pi++) {
                e[probe[pi]] = 1;
                run_rope(c, 0, e, k_positions, ye, NULL);
                e[probe[pi]] = 0;
                double want = 0;
                for (int64_t i = 0; i < nout; i++) want += (double)ye[i] * dy[i];
                CHECK(fabs(dx[probe[pi]] - want) < 1e-5, "case %zu: dx[%lld] %.9g, <ROPE(e), dy> %.9g", k,
                      (long long)probe[pi], dx[probe[pi]], want);
            }
            free(e), free(ye);
            free(x), free(dy), free(y), free(dx), free(dx1);
        }
    }
}

/* The inverse frequencies' buffer failing (both kinds) and the backward's per-range sum
 * failing: flagged, the output left alone. */
TG_TEST(test_op_rope_scratch_failures) {
    const rope_case *c = &k_rope_cases[0];
    const int64_t nin = c->n * rope_in_row(c), nout = c->n * rope_out_row(c);
    float *x = frand(nin, 70, -1, 1), *dy = frand(nout, 71, -1, 1), *y = fconst(nout, 7), *dx = fconst(nin, 7);
    const struct {
        int inverse;
        long succeed;
    } cases[] = {{0, 0}, {1, 0}, {1, 1}};
    for (int k = 0; k < 3; k++) {
        float *out = cases[k].inverse ? dx : y;
        const int64_t n = cases[k].inverse ? nin : nout;
        tg_alloc_fail_after(cases[k].succeed);
        const int oom = run_rope(c, cases[k].inverse, cases[k].inverse ? dy : x, k_positions, out, NULL);
        tg_alloc_fail_after(-1);
        int untouched = 1;
        for (int64_t i = 0; i < n; i++) untouched &= out[i] == 7.0f;
        CHECK(oom && untouched, "%s with allocation %ld failing: flag %d, output untouched %d",
              cases[k].inverse ? "rope_bwd" : "rope", cases[k].succeed, oom, untouched);
    }
    /* With the allocations there, nothing is flagged. */
    CHECK(!run_rope(c, 1, dy, k_positions, dx, NULL) && dx[0] != 7.0f, "rope_bwd with its scratch");
    free(x), free(dy), free(y), free(dx);
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

static void run_swiglu(int kind, int64_t M, int64_t I, const float *in0, const float *in1, float *out, tg_threadpool *tp) {
    tg_op op = tg_test_op(kind);
    op.p.swiglu = (tg_swiglu_params){.m = M, .i = I};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)in0, (void *)in1}, .out = {out}, .threads = tp};
    tg_cpu_op_run(&a);
}

static double silu(double g) { return g / (1 + exp(-g)); }

/* Rows [gate | up] of I = 3: silu(1) * 2, silu(-2) * 0.5, silu(0) * 9 = 0, then silu(4) * -1,
 * silu(0.25) * 3, silu(-6) * 1, with silu(x) = x / (1 + e^-x) (values from Python's math
 * module). */
TG_TEST(test_op_swiglu_forward) {
    const float gu[2 * 6] = {1, -2, 0, 2, 0.5f, 9, 4, 0.25f, -6, -1, 3, 1};
    float y[6];
    run_swiglu(TG_OP_SWIGLU, 2, 3, gu, NULL, y, NULL);
    const double want[6] = {1.4621171572600098, -0.11920292202211755, 0.0,
                            -3.928055160151634, 0.4216323756643485, -0.014835738939808647};
    for (int i = 0; i < 6; i++) CHECK(fabs(y[i] - want[i]) < 2e-7 * fmax(1, fabs(want[i])), "y[%d] %.9g, want %.9g", i, y[i], want[i]);
    /* Random rows against the double formula; 1 and 3 threads the same. */
    const int64_t M = 9, I = 13;
    float *x = frand(M * 2 * I, 81, -6, 6), *yr = fconst(M * I, NAN), *y1 = fconst(M * I, NAN);
    double *ref = malloc(sizeof(double) * (size_t)(M * I));
    REQUIRE(ref, "malloc");
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < I; i++) ref[m * I + i] = silu(x[m * 2 * I + i]) * x[m * 2 * I + I + i];
    run_swiglu(TG_OP_SWIGLU, M, I, x, NULL, yr, pool3());
    CHECK(worst_rel(yr, ref, M * I) < 1e-6, "SWIGLU vs double: %g", worst_rel(yr, ref, M * I));
    run_swiglu(TG_OP_SWIGLU, M, I, x, NULL, y1, NULL);
    CHECK(same(yr, y1, M * I), "1 and 3 threads differ");
    free(x), free(yr), free(y1), free(ref);
}

/* dgate_up against central differences (double, step 1e-6) of L = sum(dy * silu(g) * u). */
TG_TEST(test_op_swiglu_bwd_finite_differences) {
    const int64_t M = 6, I = 11;
    float *gu = frand(M * 2 * I, 91, -5, 5), *dy = frand(M * I, 92, -1, 1);
    float *dgu = fconst(M * 2 * I, NAN), *dgu1 = fconst(M * 2 * I, NAN);
    run_swiglu(TG_OP_SWIGLU_BWD, M, I, dy, gu, dgu, pool3());
    double worst = 0, norm_g = 0, norm_u = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < I; i++) {
            const double g = gu[m * 2 * I + i], u = gu[m * 2 * I + I + i], d = dy[m * I + i], h = 1e-6;
            /* Only this element's term of L depends on g and u. */
            const double fd_g = d * (silu(g + h) - silu(g - h)) * u / (2 * h);
            const double fd_u = d * silu(g) * ((u + h) - (u - h)) / (2 * h);
            worst = fmax(worst, fabs(dgu[m * 2 * I + i] - fd_g) / fmax(1, fabs(fd_g)));
            worst = fmax(worst, fabs(dgu[m * 2 * I + I + i] - fd_u) / fmax(1, fabs(fd_u)));
            norm_g += fabs(fd_g), norm_u += fabs(fd_u);
        }
    CHECK(worst < 1e-5 && norm_g > 1 && norm_u > 1, "dgate_up vs finite differences: %g (|fd| gate %g, up %g)", worst,
          norm_g, norm_u);
    run_swiglu(TG_OP_SWIGLU_BWD, M, I, dy, gu, dgu1, NULL);
    CHECK(same(dgu, dgu1, M * 2 * I), "1 and 3 threads differ");
    free(gu), free(dy), free(dgu), free(dgu1);
}
