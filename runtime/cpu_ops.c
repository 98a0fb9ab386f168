/* The CPU fp32 reference implementation of every op (semantics: plan/ops.h).
 * Reductions that cross threads (parameter gradients, norms, losses) are split so every
 * sum runs in a fixed order, making results independent of the thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.h"
#include "base/bf16.h"
#include "runtime/cpu_exec.h"
#include "runtime/threadpool.h"

typedef void (*tg_cpu_op_fn)(const tg_cpu_op_args *a);

#define F32(p) ((float *)(p))
#define CF32(p) ((const float *)(p))
#define CI32(p) ((const int32_t *)(p))

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- fill ------------------------------------------------------------------------ */

static void op_zero(const tg_cpu_op_args *a) {
    if (a->out[0]) memset(a->out[0], 0, (size_t)a->out_numel[0] * 4);
}

static void op_fill(const tg_cpu_op_args *a) {
    float *y = F32(a->out[0]), v = a->op->f[0];
    for (int64_t i = 0; i < a->out_numel[0]; i++) y[i] = v;
}

/* ---- elementwise (parallel in large chunks: they are memory bound) ------------------ */

typedef struct ew_ctx {
    const tg_cpu_op_args *a;
    void (*fn)(const tg_cpu_op_args *a, int64_t b, int64_t e);
} ew_ctx;

#define EW_BLOCK 16384

static void ew_range(void *p, int64_t b, int64_t e) {
    ew_ctx *c = p;
    c->fn(c->a, b * EW_BLOCK, e * EW_BLOCK);
}

/* Runs fn over [0, n) in blocks of EW_BLOCK elements (fn clamps the end to n). */
static void ew_parallel(const tg_cpu_op_args *a, int64_t n,
                        void (*fn)(const tg_cpu_op_args *, int64_t, int64_t)) {
    ew_ctx c = {a, fn};
    tg_parallel_for(a->threads, (n + EW_BLOCK - 1) / EW_BLOCK, ew_range, &c);
}

static void add_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    e = min64(e, a->op->i[0]);
    const float *x = CF32(a->in[0]), *y = CF32(a->in[1]);
    float *o = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) o[i] = x[i] + y[i];
}
static void op_add(const tg_cpu_op_args *a) { ew_parallel(a, a->op->i[0], add_range); }

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* The tanh GELU and its derivative, shared by GELU(_BWD) and MATMUL's GELU epilogues so
 * the fused and separate forms give the same bits. */
static inline float gelu_tanh(float v) { return 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_C * v * v * v))); }
static inline float gelu_tanh_grad(float v) {
    float t = tanhf(GELU_K * (v + GELU_C * v * v * v));
    float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

static void gelu_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    e = min64(e, a->op->i[0]);
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    if (a->op->i[1] == TG_GELU_TANH) {
        for (int64_t i = b; i < e; i++) y[i] = gelu_tanh(x[i]);
    } else {
        for (int64_t i = b; i < e; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
    }
}
static void op_gelu(const tg_cpu_op_args *a) { ew_parallel(a, a->op->i[0], gelu_range); }

static void gelu_bwd_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    e = min64(e, a->op->i[0]);
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]);
    float *dx = F32(a->out[0]);
    if (a->op->i[1] == TG_GELU_TANH) {
        for (int64_t i = b; i < e; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
    } else {
        const float inv_sqrt_2pi = 0.3989422804014327f;
        for (int64_t i = b; i < e; i++) {
            float v = x[i];
            float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
            dx[i] = dy[i] * (cdf + v * inv_sqrt_2pi * expf(-0.5f * v * v));
        }
    }
}
static void colsum(const tg_cpu_op_args *a, const float *x, float *out, int64_t rows, int64_t cols, int acc);

/* out1 (i[2] columns): the bias gradient, summed over dx as stored, so a bf16 dx is
 * rounded first (the executor's narrowing afterwards leaves it as it is). */
static void op_gelu_bwd(const tg_cpu_op_args *a) {
    ew_parallel(a, a->op->i[0], gelu_bwd_range);
    const int64_t cols = a->op->i[2];
    if (cols <= 0 || !a->out[1]) return;
    float *dx = F32(a->out[0]);
    if (a->out_dtype[0] == TG_BF16)
        for (int64_t i = 0; i < a->op->i[0]; i++) dx[i] = tg_f32_from_bf16(tg_bf16_from_f32(dx[i]));
    colsum(a, dx, F32(a->out[1]), a->op->i[0] / cols, cols, 0);
}

static void tanh_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    e = min64(e, a->op->i[0]);
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) y[i] = tanhf(x[i]);
}
static void op_tanh(const tg_cpu_op_args *a) { ew_parallel(a, a->op->i[0], tanh_range); }

static void tanh_bwd_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    e = min64(e, a->op->i[0]);
    const float *dy = CF32(a->in[0]), *y = CF32(a->in[1]);
    float *dx = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}
static void op_tanh_bwd(const tg_cpu_op_args *a) { ew_parallel(a, a->op->i[0], tanh_bwd_range); }

static uint64_t dropout_step(const tg_cpu_op_args *a) {
    const float *s = CF32(a->in[1]);
    return s && s[0] > 0 ? (uint64_t)s[0] : 0;
}

/* DROPOUT of elements e0 .. e0+n-1 of a tensor (x and y point at element e0; they may
 * alias): y = x * (1 / (1 - p)) where the element's draw is >= p, else 0. One Philox call
 * serves four consecutive elements. */
static void dropout_elements(uint64_t seed, uint64_t step, uint32_t key, float p, int64_t e0, int64_t n,
                             const float *x, float *y) {
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    float u[4];
    for (int64_t i = 0; i < n; i++) {
        uint64_t e = (uint64_t)(e0 + i);
        if (i == 0 || (e & 3) == 0) tg_philox_uniform4(seed, step, key, e >> 2, u);
        y[i] = u[e & 3] >= p ? x[i] * scale : 0.0f;
    }
}

static void dropout_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    e = min64(e, a->op->i[0]);
    dropout_elements(a->seed, dropout_step(a), (uint32_t)a->op->i[1], a->op->f[0], b, e - b, CF32(a->in[0]) + b,
                     F32(a->out[0]) + b);
}

static void op_dropout(const tg_cpu_op_args *a) {
    int64_t n = a->op->i[0];
    if (!a->training || a->op->f[0] <= 0.0f) {
        if (a->out[0] != a->in[0]) memmove(a->out[0], a->in[0], (size_t)n * 4);
        return;
    }
    ew_parallel(a, n, dropout_range);
}

/* ---- embedding --------------------------------------------------------------------- */

static void op_embedding(const tg_cpu_op_args *a) {
    int64_t N = a->op->i[0], V = a->op->i[1], D = a->op->i[2];
    const int32_t *ids = CI32(a->in[0]);
    const float *table = CF32(a->in[1]);
    float *y = F32(a->out[0]);
    for (int64_t n = 0; n < N; n++) {
        int32_t id = ids[n];
        if (id >= 0 && id < V) /* out-of-range ids read as a zero row instead of faulting */
            memcpy(y + n * D, table + (int64_t)id * D, (size_t)D * 4);
        else
            memset(y + n * D, 0, (size_t)D * 4);
    }
}

/* Each chunk owns a range of table rows and scans the ids in order, so every row's sum
 * has a fixed order whatever the thread count. */
static void embedding_bwd_range(void *p, int64_t vb, int64_t ve) {
    const tg_cpu_op_args *a = p;
    int64_t N = a->op->i[0], D = a->op->i[2], pad = a->op->i[3];
    const int32_t *ids = CI32(a->in[0]);
    const float *dy = CF32(a->in[1]);
    float *dt = F32(a->out[0]);
    for (int64_t n = 0; n < N; n++) {
        int64_t id = ids[n];
        if (id < vb || id >= ve || id == pad) continue; /* nn.Embedding(padding_idx) */
        float *row = dt + id * D;
        const float *g = dy + n * D;
        for (int64_t d = 0; d < D; d++) row[d] += g[d];
    }
}
static void op_embedding_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->i[1], embedding_bwd_range, (void *)a);
}

/* ---- matmul -------------------------------------------------------------------------
 * A small packed GEMM: op(B) of each batch is packed into panels of NR columns laid out
 * [K][NR] and op(A) into panels of MR rows laid out [K][MR], so the MR x NR micro-kernel
 * streams both contiguously and keeps the tile in registers. Work items are (batch, block
 * of MC rows); each output element is one k-ordered sum, identical for any thread count. */

typedef float v4f __attribute__((vector_size(16)));

#define MR 4
#define NR 8
#define MC 64

typedef struct mm_ctx {
    const tg_cpu_op_args *a;
    int64_t M, N, K, batch;
    int ta, tb, acc;
    int act;            /* i[8]: TG_MATMUL_ACT_* */
    float alpha;
    int64_t n_panels;   /* ceil(N / NR) */
    int64_t row_blocks; /* ceil(M / MC) */
    float *bp;          /* packed op(B): batch x n_panels x [K][NR] */
} mm_ctx;

static void mm_pack_b(void *p, int64_t b, int64_t e) {
    mm_ctx *c = p;
    const float *B = CF32(c->a->in[1]);
    int64_t N = c->N, K = c->K;
    for (int64_t it = b; it < e; it++) {
        int64_t bt = it / c->n_panels, jp = it % c->n_panels;
        const float *Bb = B + bt * K * N;
        float *dst = c->bp + it * K * NR;
        int64_t j0 = jp * NR, nj = min64(NR, N - j0);
        for (int64_t k = 0; k < K; k++) {
            for (int64_t j = 0; j < nj; j++)
                dst[k * NR + j] = c->tb ? Bb[(j0 + j) * K + k] : Bb[k * N + j0 + j];
            for (int64_t j = nj; j < NR; j++) dst[k * NR + j] = 0.0f;
        }
    }
}

static void mm_kernel(const float *ap, const float *bp, int64_t K, v4f acc[MR][NR / 4]) {
    for (int r = 0; r < MR; r++)
        for (int q = 0; q < NR / 4; q++) acc[r][q] = (v4f){0, 0, 0, 0};
    for (int64_t k = 0; k < K; k++) {
        const v4f *bk = (const v4f *)(bp + k * NR);
        const float *ak = ap + k * MR;
        for (int r = 0; r < MR; r++)
            for (int q = 0; q < NR / 4; q++) acc[r][q] += ak[r] * bk[q];
    }
}

static void mm_rows(void *p, int64_t b, int64_t e) {
    mm_ctx *c = p;
    const float *A = CF32(c->a->in[0]), *bias = CF32(c->a->in[2]);
    const float *pre_in = CF32(c->a->in[3]);
    float *C = F32(c->a->out[0]), *pre_out = F32(c->a->out[2]);
    int64_t M = c->M, N = c->N, K = c->K;
    float *ap = aligned_alloc(64, (size_t)MC * (size_t)(K > 0 ? K : 1) * 4);
    if (!ap) abort(); /* the executor has no error path inside an op */
    for (int64_t it = b; it < e; it++) {
        int64_t bt = it / c->row_blocks, i0 = (it % c->row_blocks) * MC;
        int64_t mi = min64(MC, M - i0);
        const float *Ab = A + bt * M * K;
        float *Cb = C + bt * M * N;
        /* Pack rows [i0, i0+mi) of op(A), zero-padding the last panel. */
        int64_t panels = (mi + MR - 1) / MR;
        for (int64_t ip = 0; ip < panels; ip++) {
            float *dst = ap + ip * K * MR;
            for (int64_t k = 0; k < K; k++)
                for (int r = 0; r < MR; r++) {
                    int64_t i = i0 + ip * MR + r;
                    dst[k * MR + r] = i >= i0 + mi ? 0.0f : c->ta ? Ab[k * M + i] : Ab[i * K + k];
                }
        }
        const float *bpb = c->bp + bt * c->n_panels * K * NR;
        for (int64_t jp = 0; jp < c->n_panels; jp++) {
            int64_t j0 = jp * NR, nj = min64(NR, N - j0);
            for (int64_t ip = 0; ip < panels; ip++) {
                v4f acc[MR][NR / 4];
                mm_kernel(ap + ip * K * MR, bpb + jp * K * NR, K, acc);
                for (int r = 0; r < MR; r++) {
                    int64_t i = i0 + ip * MR + r;
                    if (i >= i0 + mi) break;
                    float *crow = Cb + i * N + j0;
                    float t[NR];
                    memcpy(t, acc[r], sizeof t);
                    for (int64_t j = 0; j < nj; j++) {
                        float v = c->alpha * t[j];
                        if (bias) v += bias[j0 + j];
                        /* The epilogues (batch 1, no accumulate): GELU, keeping the
                         * pre-activation, or the GELU backward at the saved one. */
                        int64_t at = bt * M * N + i * N + j0 + j;
                        if (c->act == TG_MATMUL_ACT_GELU) pre_out[at] = v, v = gelu_tanh(v);
                        else if (c->act == TG_MATMUL_ACT_GELU_BWD) v = v * gelu_tanh_grad(pre_in[at]);
                        crow[j] = c->acc ? crow[j] + v : v;
                    }
                }
            }
        }
    }
    free(ap);
}

/* Column sums of a row-major [rows, cols] matrix in double, parallel over columns so each
 * sum runs in row order: BIAS_GRAD (+=) and MATMUL's fused bias gradient (=), which sum
 * the same dC in the same order and so give the same bits on a zeroed gradient. */
typedef struct colsum_ctx {
    const float *x;
    float *out;
    int64_t rows, cols;
    int acc;
} colsum_ctx;

static void colsum_range(void *p, int64_t b, int64_t e) {
    const colsum_ctx *c = p;
    double *s = calloc((size_t)(e - b), sizeof *s);
    if (!s) abort();
    for (int64_t r = 0; r < c->rows; r++)
        for (int64_t j = b; j < e; j++) s[j - b] += c->x[r * c->cols + j];
    for (int64_t j = b; j < e; j++) c->out[j] = c->acc ? c->out[j] + (float)s[j - b] : (float)s[j - b];
    free(s);
}

static void colsum(const tg_cpu_op_args *a, const float *x, float *out, int64_t rows, int64_t cols, int acc) {
    colsum_ctx c = {x, out, rows, cols, acc};
    tg_parallel_for(a->threads, cols, colsum_range, &c);
}

static void op_matmul(const tg_cpu_op_args *a) {
    const tg_op *op = a->op;
    mm_ctx c = {.a = a, .M = op->i[0], .N = op->i[1], .K = op->i[2], .ta = op->i[3] != 0,
                .tb = op->i[4] != 0, .batch = op->i[5] > 0 ? op->i[5] : 1, .acc = op->i[6] != 0,
                .act = (int)op->i[8], .alpha = op->f[0]};
    /* An epilogue without its pre-activation buffer (a plan the reader let through) would
     * write or read through NULL. */
    if ((c.act == TG_MATMUL_ACT_GELU && !a->out[2]) || (c.act == TG_MATMUL_ACT_GELU_BWD && !a->in[3])) abort();
    if (c.M <= 0 || c.N <= 0) return;
    c.n_panels = (c.N + NR - 1) / NR;
    c.row_blocks = (c.M + MC - 1) / MC;
    size_t bp_floats = (size_t)(c.batch * c.n_panels * NR) * (size_t)(c.K > 0 ? c.K : 1);
    c.bp = aligned_alloc(64, (bp_floats * 4 + 63) / 64 * 64);
    if (!c.bp) abort();
    tg_parallel_for(a->threads, c.batch * c.n_panels, mm_pack_b, &c);
    tg_parallel_for(a->threads, c.batch * c.row_blocks, mm_rows, &c);
    free(c.bp);
    /* The fused bias gradient: column sums of the stored A [K,M] or B [K,N] (batch 1). */
    if (op->i[7] == 1 && a->out[1]) colsum(a, CF32(a->in[0]), F32(a->out[1]), c.K, c.M, 0);
    if (op->i[7] == 2 && a->out[1]) colsum(a, CF32(a->in[1]), F32(a->out[1]), c.K, c.N, 0);
}

static void op_bias_grad(const tg_cpu_op_args *a) {
    colsum(a, CF32(a->in[0]), F32(a->out[0]), a->op->i[0], a->op->i[1], !a->op->i[2]);
}

/* ---- layernorm ---------------------------------------------------------------------- */

/* One row: y = (x - mean) * rstd * g + b with the statistics in double (two passes). */
static void layernorm_row(const float *xr, const float *g, const float *bt, int64_t D, float eps, float *yr,
                          float *mean_out, float *rstd_out) {
    double s = 0, ss = 0;
    for (int64_t d = 0; d < D; d++) s += xr[d];
    double mu = s / (double)D;
    for (int64_t d = 0; d < D; d++) ss += (xr[d] - mu) * (xr[d] - mu);
    float mean = (float)mu, rstd = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    for (int64_t d = 0; d < D; d++) {
        float v = (xr[d] - mean) * rstd;
        yr[d] = v * (g ? g[d] : 1.0f) + (bt ? bt[d] : 0.0f);
    }
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
}

static void layernorm_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    int64_t D = a->op->i[1];
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]), *mean = F32(a->out[1]), *rstd = F32(a->out[2]);
    for (int64_t m = b; m < e; m++)
        layernorm_row(x + m * D, CF32(a->in[1]), CF32(a->in[2]), D, a->op->f[0], y + m * D, mean ? mean + m : NULL,
                      rstd ? rstd + m : NULL);
}
static void op_layernorm(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->i[0], layernorm_rows, (void *)a);
}

/* One row: dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)). */
static void layernorm_bwd_row(const float *dyr, const float *xr, const float *g, float mu, float rs, int64_t D,
                              float *dxr) {
    double s1 = 0, s2 = 0;
    for (int64_t d = 0; d < D; d++) {
        float dg = dyr[d] * (g ? g[d] : 1.0f);
        s1 += dg;
        s2 += dg * ((xr[d] - mu) * rs);
    }
    float m1 = (float)(s1 / (double)D), m2 = (float)(s2 / (double)D);
    for (int64_t d = 0; d < D; d++) {
        float xhat = (xr[d] - mu) * rs;
        dxr[d] = rs * (dyr[d] * (g ? g[d] : 1.0f) - m1 - xhat * m2);
    }
}

static void layernorm_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    int64_t D = a->op->i[1];
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]), *mean = CF32(a->in[3]), *rstd = CF32(a->in[4]);
    for (int64_t m = b; m < e; m++)
        layernorm_bwd_row(dy + m * D, x + m * D, CF32(a->in[2]), mean[m], rstd[m], D, F32(a->out[0]) + m * D);
}

/* The column sums of a LayerNorm backward, over [M, D] dy and the normalised input x. */
typedef struct ln_cols_ctx {
    const float *dy, *x, *mean, *rstd;
    float *dgamma, *dbeta;
    int64_t M, D;
    int overwrite; /* i[3]: = instead of += */
} ln_cols_ctx;

/* dgamma += sum_m dy*xhat, dbeta += sum_m dy (= with i[3]): parallel over columns, rows in
 * order. */
static void layernorm_bwd_cols(void *p, int64_t b, int64_t e) {
    const ln_cols_ctx *c = p;
    int64_t M = c->M, D = c->D;
    const float *dy = c->dy, *x = c->x, *mean = c->mean, *rstd = c->rstd;
    float *dg = c->dgamma, *db = c->dbeta;
    double *s = calloc((size_t)(e - b) * 2, sizeof *s);
    if (!s) abort();
    double *sg = s, *sb = s + (e - b);
    for (int64_t m = 0; m < M; m++) {
        const float *dyr = dy + m * D, *xr = x + m * D;
        float mu = mean[m], rs = rstd[m];
        for (int64_t d = b; d < e; d++) {
            sg[d - b] += dyr[d] * ((xr[d] - mu) * rs);
            sb[d - b] += dyr[d];
        }
    }
    for (int64_t d = b; d < e; d++) {
        if (dg) dg[d] = (c->overwrite ? 0.0f : dg[d]) + (float)sg[d - b];
        if (db) db[d] = (c->overwrite ? 0.0f : db[d]) + (float)sb[d - b];
    }
    free(s);
}

static void layernorm_cols(const tg_cpu_op_args *a, const float *dy, const float *x, const float *mean,
                           const float *rstd, float *dgamma, float *dbeta) {
    ln_cols_ctx c = {dy, x, mean, rstd, dgamma, dbeta, a->op->i[0], a->op->i[1], a->op->i[3] != 0};
    if (dgamma || dbeta) tg_parallel_for(a->threads, c.D, layernorm_bwd_cols, &c);
}

static void op_layernorm_bwd(const tg_cpu_op_args *a) {
    if (a->out[0]) tg_parallel_for(a->threads, a->op->i[0], layernorm_bwd_rows, (void *)a);
    layernorm_cols(a, CF32(a->in[0]), CF32(a->in[1]), CF32(a->in[3]), CF32(a->in[4]), F32(a->out[1]),
                   F32(a->out[2]));
}

/* ---- residual layernorm -------------------------------------------------------------- */

/* v as an output slot of dtype `dtype` stores it: rounded to bf16 in bf16 slots. The op
 * reads back s (forward) and ds (backward) as stored, like the separate ops it replaces. */
static void round_as_stored(float *v, int64_t n, int dtype) {
    if (dtype != TG_BF16) return;
    for (int64_t i = 0; i < n; i++) v[i] = tg_f32_from_bf16(tg_bf16_from_f32(v[i]));
}

/* The dropout of RESIDUAL_LAYERNORM(_BWD) (f[1] = p, i[2] = key, the step counter in
 * slot `step_slot`): 1 when it applies (training, p > 0), with the step it draws at. */
static int residual_dropout_on(const tg_cpu_op_args *a, int step_slot, uint64_t *step) {
    const float *s = CF32(a->in[step_slot]);
    *step = s && s[0] > 0 ? (uint64_t)s[0] : 0;
    return a->training && a->op->f[1] > 0.0f;
}

static void residual_layernorm_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    int64_t D = a->op->i[1];
    uint64_t step;
    int drop = residual_dropout_on(a, 4, &step);
    const float *x = CF32(a->in[0]), *r = CF32(a->in[1]);
    float *y = F32(a->out[0]), *s = F32(a->out[1]), *mean = F32(a->out[2]), *rstd = F32(a->out[3]);
    for (int64_t m = b; m < e; m++) {
        const float *xr = x + m * D, *rr = r + m * D;
        float *sr = s + m * D;
        if (drop) dropout_elements(a->seed, step, (uint32_t)a->op->i[2], a->op->f[1], m * D, D, xr, sr);
        else memcpy(sr, xr, sizeof(float) * (size_t)D);
        for (int64_t d = 0; d < D; d++) sr[d] = sr[d] + rr[d];
        round_as_stored(sr, D, a->out_dtype[1]);
        layernorm_row(sr, CF32(a->in[2]), CF32(a->in[3]), D, a->op->f[0], y + m * D, mean ? mean + m : NULL,
                      rstd ? rstd + m : NULL);
    }
}
static void op_residual_layernorm(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->i[0], residual_layernorm_rows, (void *)a);
}

static void residual_layernorm_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    int64_t D = a->op->i[1];
    uint64_t step;
    int drop = residual_dropout_on(a, 6, &step);
    const float *dy = CF32(a->in[0]), *s = CF32(a->in[1]), *mean = CF32(a->in[3]), *rstd = CF32(a->in[4]);
    const float *extra = CF32(a->in[5]);
    float *ds = F32(a->out[0]), *dx = F32(a->out[1]);
    for (int64_t m = b; m < e; m++) {
        float *dsr = ds + m * D;
        layernorm_bwd_row(dy + m * D, s + m * D, CF32(a->in[2]), mean[m], rstd[m], D, dsr);
        if (extra)
            for (int64_t d = 0; d < D; d++) dsr[d] = dsr[d] + extra[m * D + d];
        round_as_stored(dsr, D, a->out_dtype[0]);
        if (drop) dropout_elements(a->seed, step, (uint32_t)a->op->i[2], a->op->f[1], m * D, D, dsr, dx + m * D);
        else memcpy(dx + m * D, dsr, sizeof(float) * (size_t)D);
    }
}
static void op_residual_layernorm_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->i[0], residual_layernorm_bwd_rows, (void *)a);
    layernorm_cols(a, CF32(a->in[0]), CF32(a->in[1]), CF32(a->in[3]), CF32(a->in[4]), F32(a->out[2]),
                   F32(a->out[3]));
}

/* ---- attention softmax ------------------------------------------------------------- */

/* The fused attention dropout (f[1] = p, i[4] = key, in2 = step): 1 when the op applies
 * it, with its scale, the DROPOUT op's 1/(1-p). */
static int softmax_dropout_on(const tg_cpu_op_args *a, float *scale) {
    float p = a->op->f[1];
    *scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    return a->training && p > 0.0f && a->in[2] != NULL;
}

static uint64_t softmax_dropout_step(const tg_cpu_op_args *a) {
    const float *s = CF32(a->in[2]);
    return s && s[0] > 0 ? (uint64_t)s[0] : 0;
}

/* x * keep / (1 - p) for elements [e0, e0 + n) of the stream, exactly as DROPOUT (the
 * Philox block of 4 is drawn once per group). x and y may alias. */
static void softmax_dropout_row(const tg_cpu_op_args *a, uint64_t step, float scale, int64_t e0,
                                const float *x, float *y, int64_t n) {
    float p = a->op->f[1];
    uint32_t key = (uint32_t)a->op->i[4];
    float u[4];
    uint64_t block = UINT64_MAX;
    for (int64_t k = 0; k < n; k++) {
        uint64_t e = (uint64_t)(e0 + k);
        if (e >> 2 != block) tg_philox_uniform4(a->seed, step, key, block = e >> 2, u);
        y[k] = u[e & 3] >= p ? x[k] * scale : 0.0f;
    }
}

static void attn_softmax_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    int64_t H = a->op->i[1], T = a->op->i[2];
    int causal = a->op->i[3] != 0;
    float scale = a->op->f[0];
    const float *s = CF32(a->in[0]), *mask = CF32(a->in[1]);
    float *P = F32(a->out[0]), *D = F32(a->out[1]);
    float dscale;
    int drop = D && softmax_dropout_on(a, &dscale);
    uint64_t step = drop ? softmax_dropout_step(a) : 0;
    for (int64_t row = b; row < e; row++) {
        int64_t q = row % T, bi = row / (T * H);
        const float *sr = s + row * T, *mr = mask ? mask + bi * T : NULL;
        float *pr = P + row * T;
        int64_t kend = causal ? q + 1 : T;
        float mx = -INFINITY;
        for (int64_t k = 0; k < kend; k++)
            if (!mr || mr[k] != 0.0f) mx = fmaxf(mx, scale * sr[k]);
        if (mx == -INFINITY) { /* no kept key */
            memset(pr, 0, (size_t)T * 4);
        } else {
            double sum = 0;
            for (int64_t k = 0; k < T; k++) {
                float v = 0.0f;
                if (k < kend && (!mr || mr[k] != 0.0f)) v = expf(scale * sr[k] - mx);
                pr[k] = v;
                sum += v;
            }
            float inv = (float)(1.0 / sum);
            for (int64_t k = 0; k < T; k++) pr[k] *= inv;
        }
        if (!D) continue;
        if (drop)
            softmax_dropout_row(a, step, dscale, row * T, pr, D + row * T, T);
        else if (D + row * T != pr)
            memmove(D + row * T, pr, (size_t)T * 4);
    }
}
static void op_attn_softmax(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->i[0] * a->op->i[1] * a->op->i[2], attn_softmax_rows,
                    (void *)a);
}

/* With dropout, dP = dD * keep / (1 - p) is formed in the output row first (an output
 * aliasing dD is fine: each element is read before it is written), then turned into dS. */
static void attn_softmax_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    int64_t T = a->op->i[2];
    float scale = a->op->f[0];
    const float *dD = CF32(a->in[0]), *P = CF32(a->in[1]);
    float *ds = F32(a->out[0]);
    float dscale;
    int drop = softmax_dropout_on(a, &dscale);
    uint64_t step = drop ? softmax_dropout_step(a) : 0;
    for (int64_t row = b; row < e; row++) {
        const float *dpr = dD + row * T, *pr = P + row * T;
        float *dsr = ds + row * T;
        if (drop && dsr != pr) {
            softmax_dropout_row(a, step, dscale, row * T, dpr, dsr, T);
            dpr = dsr;
        }
        float *tmp = NULL;
        if (drop && dsr == pr) { /* output aliases P: keep dP apart */
            tmp = malloc((size_t)T * 4);
            if (!tmp) abort();
            softmax_dropout_row(a, step, dscale, row * T, dpr, tmp, T);
            dpr = tmp;
        }
        double dot = 0;
        for (int64_t k = 0; k < T; k++) dot += dpr[k] * pr[k];
        float fd = (float)dot;
        for (int64_t k = 0; k < T; k++) dsr[k] = scale * pr[k] * (dpr[k] - fd);
        free(tmp);
    }
}
static void op_attn_softmax_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->i[0] * a->op->i[1] * a->op->i[2], attn_softmax_bwd_rows,
                    (void *)a);
}

/* ---- fused attention ----------------------------------------------------------------
 * One work item per (batch, head): it owns that head's columns of every output, so items
 * never share an element and each sum keeps one order whatever the thread count. Dot
 * products and sums run in double, as in the softmax above; the scores, probabilities and
 * dropout factors are the same float expressions in the forward and the backward. K (and V
 * in the backward) of the item are first copied, widened and transposed to [Dh][T], so the
 * dot products of one query with all keys run as T independent sums (each still in d
 * order, the same value as one dot product at a time). The forward draws the dropout mask
 * and stores it as keep bits; the backward reads those bits instead of drawing again. */

typedef struct attn_ctx {
    const tg_cpu_op_args *a;
    int64_t B, H, T, Dh, ld;  /* ld: row stride of q, k and v (H*Dh, or 3*H*Dh packed) */
    const float *q, *k, *v;   /* row 0, head 0 of each */
    const float *mask;        /* [B,T], or NULL */
    float scale, p, keep_scale;
    int causal, drop;         /* drop: the forward draws the mask */
    uint64_t step;
    int64_t words;            /* keep-bit words per row: ceil(T/32) */
    int32_t *bits_out;        /* forward out2, or NULL */
    const int32_t *bits_in;   /* backward in4, or NULL */
} attn_ctx;

/* qkv_slot: the input slot of q (or qkv): 0 in the forward, 5 in the backward. */
static void attn_ctx_init(attn_ctx *c, const tg_cpu_op_args *a, int qkv_slot) {
    const tg_op *op = a->op;
    memset(c, 0, sizeof *c);
    c->a = a;
    c->B = op->i[0], c->H = op->i[1], c->T = op->i[2], c->Dh = op->i[6];
    int64_t D = c->H * c->Dh;
    c->q = CF32(a->in[qkv_slot]);
    if (op->i[5]) { /* packed: Q, K and V are column blocks of one row */
        c->ld = 3 * D;
        c->k = c->q + D;
        c->v = c->q + 2 * D;
    } else {
        c->ld = D;
        c->k = CF32(a->in[qkv_slot + 1]);
        c->v = CF32(a->in[qkv_slot + 2]);
    }
    c->mask = CF32(a->in[3]);
    c->causal = op->i[3] != 0;
    c->scale = op->f[0];
    c->p = op->f[1];
    c->keep_scale = c->p < 1.0f ? 1.0f / (1.0f - c->p) : 0.0f;
    c->words = (c->T + 31) / 32;
    if (qkv_slot) { /* backward: in4 is the forward's keep bits */
        c->bits_in = CI32(a->in[4]);
        return;
    }
    c->bits_out = (int32_t *)a->out[2];
    /* As ATTN_SOFTMAX: dropout in training only, and only with the step counter. */
    c->drop = a->training && c->p > 0.0f && a->in[4] != NULL;
    const float *step = CF32(a->in[4]);
    c->step = c->drop && step[0] > 0 ? (uint64_t)step[0] : 0;
}

static double dot_f64(const float *x, const float *y, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * y[i];
    return s;
}

/* Keys [0, kend) of query q; kept[k] says which take part (mask != 0). Returns how many. */
static int64_t attn_kept_keys(const attn_ctx *c, int64_t b, int64_t q, char *kept, int64_t *kend) {
    *kend = c->causal ? q + 1 : c->T;
    const float *m = c->mask ? c->mask + b * c->T : NULL;
    int64_t n = 0;
    for (int64_t k = 0; k < *kend; k++) n += kept[k] = !m || m[k] != 0.0f;
    return n;
}

/* The dropout factor of each key of row ((b*H + h)*T + q): 1/(1-p) kept, 0 dropped, and 1
 * without dropout, so D = P * factor is exactly ATTN_SOFTMAX's dropped probability. The
 * forward draws it; the backward reads it from the forward's bits. */
static void attn_keep_factors(const attn_ctx *c, int64_t bh, int64_t q, int64_t kend, float *factor) {
    if (c->bits_in) {
        const uint32_t *row = (const uint32_t *)c->bits_in + (bh * c->T + q) * c->words;
        for (int64_t k = 0; k < kend; k++) factor[k] = (row[k >> 5] >> (k & 31)) & 1u ? c->keep_scale : 0.0f;
        return;
    }
    if (!c->drop) {
        for (int64_t k = 0; k < kend; k++) factor[k] = 1.0f;
        return;
    }
    uint32_t key = (uint32_t)c->a->op->i[4];
    uint64_t e0 = (uint64_t)((bh * c->T + q) * c->T), block = UINT64_MAX;
    float u[4];
    for (int64_t k = 0; k < kend; k++) {
        uint64_t e = e0 + (uint64_t)k;
        if (e >> 2 != block) tg_philox_uniform4(c->a->seed, c->step, key, block = e >> 2, u);
        factor[k] = u[e & 3] >= c->p ? c->keep_scale : 0.0f;
    }
}

/* Row ((b*H + h)*T + q) of the keep bits: bit k set iff key k takes part (kept[k], k < kend)
 * and is not dropped (factor[k] != 0; the factor is never 0 otherwise, as p < 1). Every
 * word is written, so bits past kend and past T are 0. */
static void attn_write_bits(const attn_ctx *c, int64_t bh, int64_t q, int64_t kend, const char *kept,
                            const float *factor) {
    uint32_t *row = (uint32_t *)c->bits_out + (bh * c->T + q) * c->words;
    memset(row, 0, sizeof *row * (size_t)c->words);
    for (int64_t k = 0; k < kend; k++)
        if (kept[k] && factor[k] != 0.0f) row[k >> 5] |= 1u << (k & 31);
}

/* xt[d*T + t] = x[t*ld + d]: T rows of Dh values, widened and transposed. */
static void attn_transpose(const attn_ctx *c, const float *x, double *xt) {
    for (int64_t t = 0; t < c->T; t++)
        for (int64_t d = 0; d < c->Dh; d++) xt[d * c->T + t] = x[t * c->ld + d];
}

/* Two doubles at a time (unaligned): each lane is the scalar expression, so the results
 * are those of the plain loops, written out because -O2 does not vectorize them. */
typedef double v2d __attribute__((vector_size(16)));

/* y[i] += a * x[i] in double, i < n. */
static void axpy_f64(double *y, double a, const double *x, int64_t n) {
    v2d av = {a, a};
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        v2d yv, xv;
        memcpy(&yv, y + i, sizeof yv);
        memcpy(&xv, x + i, sizeof xv);
        yv += av * xv;
        memcpy(y + i, &yv, sizeof yv);
    }
    for (; i < n; i++) y[i] += a * x[i];
}

/* y[i] += a * x[i] for a float x, widened. */
static void axpy_f64_f32(double *y, double a, const float *x, int64_t n) {
    v2d av = {a, a};
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        v2d yv, xv = {x[i], x[i + 1]};
        memcpy(&yv, y + i, sizeof yv);
        yv += av * xv;
        memcpy(y + i, &yv, sizeof yv);
    }
    for (; i < n; i++) y[i] += a * x[i];
}

/* dots[k] = x . row k, for k < kend, from the transposed rows. */
static void attn_dots(const attn_ctx *c, const float *x, const double *rows_t, int64_t kend, double *dots) {
    for (int64_t k = 0; k < kend; k++) dots[k] = 0;
    for (int64_t d = 0; d < c->Dh; d++) axpy_f64(dots, x[d], rows_t + d * c->T, kend);
}

/* Per-chunk scratch: one row's scores, kept flags, dropout factors and double dot
 * products; Dh doubles for a row's output; K (and V) of a head transposed; and, in the
 * backward, T*Dh doubles each for dK and dV. */
typedef struct attn_scratch {
    float *s, *factor;
    char *kept;
    double *dots, *acc, *kt, *vt, *dk, *dv;
} attn_scratch;

static void attn_scratch_alloc(attn_scratch *w, const attn_ctx *c, int backward) {
    size_t T = (size_t)c->T, Dh = (size_t)c->Dh, td = T * Dh * sizeof(double);
    w->s = malloc(T * sizeof *w->s);
    w->factor = malloc(T * sizeof *w->factor);
    w->kept = malloc(T);
    w->dots = malloc(T * sizeof *w->dots);
    w->acc = malloc(Dh * sizeof *w->acc);
    w->kt = malloc(td);
    w->vt = backward ? malloc(td) : NULL;
    w->dk = backward ? malloc(td) : NULL;
    w->dv = backward ? malloc(td) : NULL;
    if (!w->s || !w->factor || !w->kept || !w->dots || !w->acc || !w->kt || (backward && (!w->vt || !w->dk || !w->dv)))
        abort();
}

static void attn_scratch_free(attn_scratch *w) {
    free(w->s), free(w->factor), free(w->kept), free(w->dots), free(w->acc);
    free(w->kt), free(w->vt), free(w->dk), free(w->dv);
}

/* Scores s[k] = scale * q.k of the kept keys (w->dots holds the q.k); returns their max,
 * -inf when none is kept. */
static float attn_scores(const attn_ctx *c, const float *qrow, attn_scratch *w, int64_t kend) {
    attn_dots(c, qrow, w->kt, kend, w->dots);
    float mx = -INFINITY;
    for (int64_t k = 0; k < kend; k++) {
        if (!w->kept[k]) continue;
        w->s[k] = c->scale * (float)w->dots[k];
        mx = fmaxf(mx, w->s[k]);
    }
    return mx;
}

static void attention_heads(void *p, int64_t b0, int64_t e0) {
    const attn_ctx *c = p;
    const tg_cpu_op_args *a = c->a;
    int64_t H = c->H, T = c->T, Dh = c->Dh, D = H * Dh;
    float *O = F32(a->out[0]), *LSE = F32(a->out[1]);
    attn_scratch w;
    attn_scratch_alloc(&w, c, 0);
    for (int64_t bh = b0; bh < e0; bh++) {
        int64_t b = bh / H, h = bh % H, head = b * T * c->ld + h * Dh;
        const float *qh = c->q + head, *vh = c->v + head;
        attn_transpose(c, c->k + head, w.kt);
        for (int64_t q = 0; q < T; q++) {
            float *orow = O + (b * T + q) * D + h * Dh;
            int64_t kend;
            float mx = -INFINITY;
            if (attn_kept_keys(c, b, q, w.kept, &kend)) mx = attn_scores(c, qh + q * c->ld, &w, kend);
            attn_keep_factors(c, bh, q, kend, w.factor);
            if (c->bits_out) attn_write_bits(c, bh, q, kend, w.kept, w.factor);
            if (mx == -INFINITY) { /* no kept key */
                memset(orow, 0, (size_t)Dh * 4);
                LSE[bh * T + q] = 0.0f;
                continue;
            }
            double sum = 0;
            for (int64_t k = 0; k < kend; k++)
                if (w.kept[k]) sum += expf(w.s[k] - mx);
            float lse = (float)((double)mx + log(sum));
            LSE[bh * T + q] = lse;
            for (int64_t d = 0; d < Dh; d++) w.acc[d] = 0;
            for (int64_t k = 0; k < kend; k++) {
                if (!w.kept[k]) continue;
                float dropped = expf(w.s[k] - lse) * w.factor[k];
                if (dropped == 0.0f) continue;
                axpy_f64_f32(w.acc, dropped, vh + k * c->ld, Dh);
            }
            for (int64_t d = 0; d < Dh; d++) orow[d] = (float)w.acc[d];
        }
    }
    attn_scratch_free(&w);
}

static void op_attention(const tg_cpu_op_args *a) {
    attn_ctx c;
    attn_ctx_init(&c, a, 0);
    tg_parallel_for(a->threads, c.B * c.H, attention_heads, &c);
}

/* dq/dk/dv (or the blocks of dqkv) of one (batch, head), rows of stride c->ld. */
static void attention_bwd_heads(void *p, int64_t b0, int64_t e0) {
    const attn_ctx *c = p;
    const tg_cpu_op_args *a = c->a;
    int64_t H = c->H, T = c->T, Dh = c->Dh, D = H * Dh;
    const float *dO = CF32(a->in[0]), *O = CF32(a->in[1]), *LSE = CF32(a->in[2]);
    float *dq = F32(a->out[0]), *dk, *dv, *delta_out = F32(a->out[3]);
    if (a->op->i[5]) {
        dk = dq + D, dv = dq + 2 * D;
    } else {
        dk = F32(a->out[1]), dv = F32(a->out[2]);
    }
    attn_scratch w;
    attn_scratch_alloc(&w, c, 1);
    for (int64_t bh = b0; bh < e0; bh++) {
        int64_t b = bh / H, h = bh % H, head = b * T * c->ld + h * Dh;
        const float *qh = c->q + head, *kh = c->k + head;
        attn_transpose(c, kh, w.kt);
        attn_transpose(c, c->v + head, w.vt);
        memset(w.dk, 0, sizeof *w.dk * (size_t)(T * Dh));
        memset(w.dv, 0, sizeof *w.dv * (size_t)(T * Dh));
        for (int64_t q = 0; q < T; q++) {
            const float *dorow = dO + (b * T + q) * D + h * Dh, *qrow = qh + q * c->ld;
            float delta = (float)dot_f64(dorow, O + (b * T + q) * D + h * Dh, Dh);
            delta_out[bh * T + q] = delta;
            for (int64_t d = 0; d < Dh; d++) w.acc[d] = 0;
            int64_t kend;
            if (attn_kept_keys(c, b, q, w.kept, &kend)) {
                float lse = LSE[bh * T + q];
                attn_scores(c, qrow, &w, kend);
                attn_keep_factors(c, bh, q, kend, w.factor);
                attn_dots(c, dorow, w.vt, kend, w.dots); /* dD_k = dO . V_k */
                for (int64_t k = 0; k < kend; k++) {
                    if (!w.kept[k]) continue;
                    const float *krow = kh + k * c->ld;
                    float P = expf(w.s[k] - lse);
                    float dS = c->scale * P * ((float)w.dots[k] * w.factor[k] - delta);
                    float dropped = P * w.factor[k];
                    axpy_f64_f32(w.acc, dS, krow, Dh);
                    axpy_f64_f32(w.dk + k * Dh, dS, qrow, Dh);
                    axpy_f64_f32(w.dv + k * Dh, dropped, dorow, Dh);
                }
            }
            float *dqrow = dq + (b * T + q) * c->ld + h * Dh;
            for (int64_t d = 0; d < Dh; d++) dqrow[d] = (float)w.acc[d];
        }
        for (int64_t k = 0; k < T; k++) {
            float *dkrow = dk + (b * T + k) * c->ld + h * Dh, *dvrow = dv + (b * T + k) * c->ld + h * Dh;
            for (int64_t d = 0; d < Dh; d++) {
                dkrow[d] = (float)w.dk[k * Dh + d];
                dvrow[d] = (float)w.dv[k * Dh + d];
            }
        }
    }
    attn_scratch_free(&w);
}

static void op_attention_bwd(const tg_cpu_op_args *a) {
    attn_ctx c;
    attn_ctx_init(&c, a, 5);
    tg_parallel_for(a->threads, c.B * c.H, attention_bwd_heads, &c);
}

/* ---- heads split / merge ----------------------------------------------------------- */

/* Copies between x [B*T, P*H*Dh] and part p [B,H,T,Dh]; to_heads picks the direction. */
static void heads_copy(const tg_cpu_op_args *a, int to_heads) {
    int64_t B = a->op->i[0], T = a->op->i[1], H = a->op->i[2], Dh = a->op->i[3];
    int64_t P = a->op->i[4] < 1 ? 1 : a->op->i[4];
    int64_t W = P * H * Dh;
    float *x = F32(to_heads ? a->in[0] : a->out[0]);
    for (int64_t part = 0; part < P; part++) {
        float *hp = F32(to_heads ? a->out[part] : a->in[part]);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++) {
                    float *xr = x + (b * T + t) * W + part * H * Dh + h * Dh;
                    float *hr = hp + ((b * H + h) * T + t) * Dh;
                    if (to_heads)
                        memcpy(hr, xr, (size_t)Dh * 4);
                    else
                        memcpy(xr, hr, (size_t)Dh * 4);
                }
    }
}
static void op_heads_split(const tg_cpu_op_args *a) { heads_copy(a, 1); }
static void op_heads_merge(const tg_cpu_op_args *a) { heads_copy(a, 0); }

/* ---- select token ------------------------------------------------------------------ */

static int64_t selected_token(const tg_cpu_op_args *a, int64_t b) {
    int64_t T = a->op->i[1];
    if (a->op->i[3] != TG_SELECT_LAST_NON_PAD || !a->in[1]) return 0;
    const int32_t *ids = CI32(a->in[1]) + b * T;
    for (int64_t t = T - 1; t >= 0; t--)
        if (ids[t] != a->op->i[4]) return t;
    return 0;
}

static void op_select_token(const tg_cpu_op_args *a) {
    int64_t B = a->op->i[0], T = a->op->i[1], D = a->op->i[2];
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    for (int64_t b = 0; b < B; b++)
        memcpy(y + b * D, x + (b * T + selected_token(a, b)) * D, (size_t)D * 4);
}

static void op_select_token_bwd(const tg_cpu_op_args *a) {
    int64_t B = a->op->i[0], T = a->op->i[1], D = a->op->i[2];
    const float *dy = CF32(a->in[0]);
    float *dx = F32(a->out[0]);
    memset(dx, 0, (size_t)(B * T * D) * 4);
    for (int64_t b = 0; b < B; b++)
        memcpy(dx + (b * T + selected_token(a, b)) * D, dy + b * D, (size_t)D * 4);
}

/* ---- cross entropy ----------------------------------------------------------------- */

/* Labels outside [0, C) other than -100 cannot be reported from inside an op; they are
 * treated like ignored rows rather than read out of bounds. */
static int ce_counted(int32_t label, int64_t C) { return label >= 0 && label < C; }

typedef struct ce_ctx {
    const tg_cpu_op_args *a;
    const float *logits;
    const int32_t *labels;
    double *row_loss;  /* forward */
    float coef;        /* backward: dloss / n_valid */
    float *dlogits;    /* backward */
} ce_ctx;

/* log(sum_c exp(x_c - max)) + max, in double. */
static double ce_logsumexp(const float *x, int64_t C) {
    float mx = -INFINITY;
    for (int64_t c = 0; c < C; c++) mx = fmaxf(mx, x[c]);
    double s = 0;
    for (int64_t c = 0; c < C; c++) s += exp((double)x[c] - mx);
    return log(s) + mx;
}

/* Classes that count: i[2] when set (a row padded to i[1] for aligned GEMMs), else i[1]. */
static int64_t ce_classes(const tg_op *op) { return op->i[2] > 0 ? op->i[2] : op->i[1]; }

static void ce_fwd_rows(void *p, int64_t b, int64_t e) {
    ce_ctx *c = p;
    int64_t C = c->a->op->i[1], V = ce_classes(c->a->op);
    for (int64_t n = b; n < e; n++) {
        int32_t l = c->labels[n];
        const float *x = c->logits + n * C;
        c->row_loss[n] = ce_counted(l, V) ? ce_logsumexp(x, V) - x[l] : 0.0;
    }
}

static void ce_bwd_rows(void *p, int64_t b, int64_t e) {
    ce_ctx *c = p;
    int64_t C = c->a->op->i[1], V = ce_classes(c->a->op);
    for (int64_t n = b; n < e; n++) {
        int32_t l = c->labels[n];
        const float *x = c->logits + n * C;
        float *d = c->dlogits + n * C;
        memset(d + V, 0, (size_t)(C - V) * 4); /* padding columns */
        if (!ce_counted(l, V) || c->coef == 0.0f) {
            memset(d, 0, (size_t)V * 4);
            continue;
        }
        double lse = ce_logsumexp(x, V);
        for (int64_t k = 0; k < V; k++) {
            double sm = exp((double)x[k] - lse) - (k == l ? 1.0 : 0.0);
            d[k] = (float)(c->coef * sm);
        }
    }
}

static int64_t ce_n_valid(const int32_t *labels, int64_t N, int64_t C) {
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++) n += ce_counted(labels[i], C);
    return n;
}

static void op_cross_entropy(const tg_cpu_op_args *a) {
    int64_t N = a->op->i[0];
    ce_ctx c = {.a = a, .logits = CF32(a->in[0]), .labels = CI32(a->in[1])};
    c.row_loss = malloc((size_t)(N > 0 ? N : 1) * sizeof *c.row_loss);
    if (!c.row_loss) abort();
    tg_parallel_for(a->threads, N, ce_fwd_rows, &c);
    double sum = 0; /* summed in row order: deterministic */
    for (int64_t n = 0; n < N; n++) sum += c.row_loss[n];
    int64_t valid = ce_n_valid(c.labels, N, ce_classes(a->op));
    F32(a->out[0])[0] = valid ? (float)(sum / (double)valid) : 0.0f;
    free(c.row_loss);
}

static void op_cross_entropy_bwd(const tg_cpu_op_args *a) {
    int64_t N = a->op->i[0];
    ce_ctx c = {.a = a, .logits = CF32(a->in[1]), .labels = CI32(a->in[2]),
                .dlogits = F32(a->out[0])};
    int64_t valid = ce_n_valid(c.labels, N, ce_classes(a->op));
    c.coef = valid ? (float)((double)CF32(a->in[0])[0] / (double)valid) : 0.0f;
    tg_parallel_for(a->threads, N, ce_bwd_rows, &c);
}

/* ---- optimizer --------------------------------------------------------------------- */

static void op_schedule(const tg_cpu_op_args *a) {
    double s = CF32(a->in[0])[0], total = CF32(a->in[1])[0]; /* read before out1 aliases in0 */
    double warmup = (double)a->op->i[0];
    double frac = s < warmup ? s / fmax(1.0, warmup)
                             : fmax(0.0, (total - s) / fmax(1.0, total - warmup));
    F32(a->out[0])[0] = (float)(a->op->f[0] * frac);
    if (a->out[1]) F32(a->out[1])[0] = (float)(s + 1.0);
}

/* Element count of an op's whole-pool view, from the plan's tensor table. */
static int64_t view_numel(const tg_cpu_op_args *a, int slot) {
    int t = a->op->in[slot];
    if (!a->plan || t < 0 || t >= a->plan->n_tensors) return 0;
    return tg_tensor_numel(&a->plan->tensors[t]);
}

#define NORM_BLOCK 65536

typedef struct norm_ctx {
    const float *g;
    int64_t n;
    double *partial; /* one per block, summed in block order */
} norm_ctx;

static void norm_blocks(void *p, int64_t b, int64_t e) {
    norm_ctx *c = p;
    for (int64_t blk = b; blk < e; blk++) {
        int64_t i0 = blk * NORM_BLOCK, i1 = min64(c->n, i0 + NORM_BLOCK);
        double s = 0;
        for (int64_t i = i0; i < i1; i++) s += (double)c->g[i] * c->g[i];
        c->partial[blk] = s;
    }
}

/* One replica (no communicator): the sum over one is the tensor itself. */
static void op_all_gather(const tg_cpu_op_args *a) {
    /* Run on the stored values, bf16 ones too (runtime/cpu_bf16.c). */
    if (a->comm)
        tg_cpu_all_gather(a->comm, a->rank, a->out[0], a->op->i[0], a->out_dtype[0] == TG_BF16 ? 2 : sizeof(float));
}

static void op_all_reduce(const tg_cpu_op_args *a) {
    if (a->comm) tg_cpu_all_reduce_sum(a->comm, a->rank, F32(a->out[0]), a->op->i[0]);
}

static void op_grad_norm(const tg_cpu_op_args *a) {
    norm_ctx c = {.g = CF32(a->in[0]), .n = view_numel(a, 0)};
    int64_t blocks = (c.n + NORM_BLOCK - 1) / NORM_BLOCK;
    c.partial = calloc((size_t)(blocks > 0 ? blocks : 1), sizeof *c.partial);
    if (!c.partial) abort();
    tg_parallel_for(a->threads, blocks, norm_blocks, &c);
    double s = 0;
    for (int64_t i = 0; i < blocks; i++) s += c.partial[i];
    F32(a->out[0])[0] = (float)sqrt(s);
    free(c.partial);
}

typedef struct adamw_seg {
    int64_t first; /* element index into the pools */
    int64_t start; /* prefix sum of the segment sizes before this one */
    int64_t n;
    int decay;
} adamw_seg;

typedef struct adamw_ctx {
    const adamw_seg *seg;
    int n_seg;
    const float *g;
    float *p, *m, *v;
    float *copy; /* out3: the low-precision parameter copies (widened by the caller), or NULL */
    int64_t state_first; /* the parameter element m[0] and v[0] belong to (ZeRO-1's slice) */
    float clip, lr, b1, b2, eps, wd, step_size, sqrt_bc2;
} adamw_ctx;

static void adamw_range(void *pv, int64_t b, int64_t e) {
    const adamw_ctx *c = pv;
    int lo = 0, hi = c->n_seg - 1; /* last segment with start <= b */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->seg[mid].start <= b) lo = mid; else hi = mid - 1;
    }
    for (int s = lo; s < c->n_seg && c->seg[s].start < e; s++) {
        const adamw_seg *sg = &c->seg[s];
        int64_t j0 = b > sg->start ? b - sg->start : 0, j1 = min64(sg->n, e - sg->start);
        float decay = sg->decay ? c->lr * c->wd : 0.0f;
        for (int64_t j = j0; j < j1; j++) {
            int64_t i = sg->first + j, k = i - c->state_first;
            float g = c->g[i] * c->clip;
            float p = c->p[i] - decay * c->p[i];
            float m = c->b1 * c->m[k] + (1.0f - c->b1) * g;
            float v = c->b2 * c->v[k] + (1.0f - c->b2) * g * g;
            c->m[k] = m;
            c->v[k] = v;
            c->p[i] = p - c->step_size * m / (sqrtf(v) / c->sqrt_bc2 + c->eps);
            if (c->copy) c->copy[i] = c->p[i];
        }
    }
}

static void op_adamw(const tg_cpu_op_args *a) {
    const tg_plan *plan = a->plan;
    if (!plan) return; /* the executor always passes the plan */
    const float *f = a->op->f;
    adamw_ctx c = {.g = CF32(a->in[0]), .p = F32(a->out[0]), .m = F32(a->out[1]),
                   .v = F32(a->out[2]), .copy = a->out[3] ? F32(a->out[3]) : NULL,
                   .lr = CF32(a->in[1])[0], .b1 = f[0], .b2 = f[1],
                   .eps = f[2], .wd = f[3], .clip = 1.0f};
    if (f[4] > 0.0f && a->in[3]) {
        double norm = CF32(a->in[3])[0];
        c.clip = (float)fmin(1.0, (double)f[4] / (norm + 1e-6));
    }
    double t = CF32(a->in[2])[0];
    double bc1 = 1.0 - pow(f[0], t), bc2 = 1.0 - pow(f[1], t);
    c.step_size = (float)(c.lr / bc1);
    c.sqrt_bc2 = (float)sqrt(bc2);

    adamw_seg *seg = malloc((size_t)(plan->n_tensors > 0 ? plan->n_tensors : 1) * sizeof *seg);
    if (!seg) abort();
    /* ZeRO-1: only this replica's slice of the elements, whose state starts at m[0]. */
    const int64_t slice = a->op->i[1];
    const int64_t lo = slice > 0 ? (int64_t)a->rank * slice : 0, hi = slice > 0 ? lo + slice : INT64_MAX;
    c.state_first = lo;
    int64_t total = 0;
    for (int i = 0; i < plan->n_tensors; i++) {
        const tg_tensor *tt = &plan->tensors[i];
        /* Whole-pool views would update every parameter a second time. */
        if (!(tt->flags & TG_TENSOR_PARAM) || (tt->flags & TG_TENSOR_VIEW)) continue;
        int64_t first = (int64_t)(tt->offset / 4), end = first + tg_tensor_numel(tt);
        if (first < lo) first = lo;
        if (end > hi) end = hi;
        if (end <= first) continue;
        seg[c.n_seg++] = (adamw_seg){first, total, end - first, !(tt->flags & TG_TENSOR_NO_DECAY)};
        total += end - first;
    }
    c.seg = seg;
    if (c.n_seg) tg_parallel_for(a->threads, total, adamw_range, &c);
    free(seg);
}

/* ---- dispatch ---------------------------------------------------------------------- */

static const tg_cpu_op_fn cpu_ops[TG_OP_COUNT] = {
    [TG_OP_ZERO] = op_zero,
    [TG_OP_FILL] = op_fill,
    [TG_OP_EMBEDDING] = op_embedding,
    [TG_OP_EMBEDDING_BWD] = op_embedding_bwd,
    [TG_OP_ADD] = op_add,
    [TG_OP_MATMUL] = op_matmul,
    [TG_OP_BIAS_GRAD] = op_bias_grad,
    [TG_OP_LAYERNORM] = op_layernorm,
    [TG_OP_LAYERNORM_BWD] = op_layernorm_bwd,
    [TG_OP_GELU] = op_gelu,
    [TG_OP_GELU_BWD] = op_gelu_bwd,
    [TG_OP_TANH] = op_tanh,
    [TG_OP_TANH_BWD] = op_tanh_bwd,
    [TG_OP_ATTN_SOFTMAX] = op_attn_softmax,
    [TG_OP_ATTN_SOFTMAX_BWD] = op_attn_softmax_bwd,
    [TG_OP_ATTENTION] = op_attention,
    [TG_OP_ATTENTION_BWD] = op_attention_bwd,
    [TG_OP_DROPOUT] = op_dropout,
    [TG_OP_HEADS_SPLIT] = op_heads_split,
    [TG_OP_HEADS_MERGE] = op_heads_merge,
    [TG_OP_SELECT_TOKEN] = op_select_token,
    [TG_OP_SELECT_TOKEN_BWD] = op_select_token_bwd,
    [TG_OP_CROSS_ENTROPY] = op_cross_entropy,
    [TG_OP_CROSS_ENTROPY_BWD] = op_cross_entropy_bwd,
    [TG_OP_SCHEDULE] = op_schedule,
    [TG_OP_GRAD_NORM] = op_grad_norm,
    [TG_OP_ADAMW] = op_adamw,
    [TG_OP_RESIDUAL_LAYERNORM] = op_residual_layernorm,
    [TG_OP_RESIDUAL_LAYERNORM_BWD] = op_residual_layernorm_bwd,
    [TG_OP_ALL_REDUCE] = op_all_reduce,
    [TG_OP_ALL_GATHER] = op_all_gather,
};
_Static_assert(sizeof cpu_ops / sizeof cpu_ops[0] == TG_OP_COUNT, "every op needs a CPU kernel");

int tg_cpu_op_has_kernel(int kind) { return kind >= 0 && kind < TG_OP_COUNT && cpu_ops[kind] != NULL; }

void tg_cpu_op_run(const tg_cpu_op_args *a) {
    /* The executor validates kinds; direct callers with a bad kind get nothing run. */
    if (a->op->kind >= 0 && a->op->kind < TG_OP_COUNT && cpu_ops[a->op->kind]) cpu_ops[a->op->kind](a);
}
