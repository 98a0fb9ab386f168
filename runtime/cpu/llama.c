/* CPU reference: Llama's RMSNORM, ROPE and SWIGLU and their backwards. Row sums and the
 * gamma gradient's column sums run in double, in a fixed order. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "kernels/rope.h"
#include "runtime/cpu/cpu_kernels.h"

/* ---- RMSNorm ------------------------------------------------------------------------- */

static void rmsnorm_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_rmsnorm_params *rp = &a->op->p.rmsnorm;
    const int64_t D = rp->d;
    const float *x = CF32(a->in[0]), *g = CF32(a->in[1]);
    float *y = F32(a->out[0]), *rstd = F32(a->out[1]);
    for (int64_t m = b; m < e; m++) {
        const float *xr = x + m * D;
        double ss = 0;
        for (int64_t d = 0; d < D; d++) ss += (double)xr[d] * xr[d];
        const float rs = (float)(1.0 / sqrt(ss / (double)D + (double)rp->eps));
        for (int64_t d = 0; d < D; d++) y[m * D + d] = g[d] * (xr[d] * rs); /* HF: weight * (x * rstd) */
        if (rstd) rstd[m] = rs;
    }
}
void tg_cpu_kernel_rmsnorm(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.rmsnorm.m, rmsnorm_rows, (void *)a);
}

/* dx = rstd * (dy*g - xhat * mean(dy*g*xhat)), xhat = x * rstd. */
static void rmsnorm_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const int64_t D = a->op->p.rmsnorm.d;
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]), *g = CF32(a->in[2]), *rstd = CF32(a->in[3]);
    float *dx = F32(a->out[0]);
    for (int64_t m = b; m < e; m++) {
        const float *dyr = dy + m * D, *xr = x + m * D;
        const float rs = rstd[m];
        double s = 0;
        for (int64_t d = 0; d < D; d++) s += (double)(dyr[d] * g[d]) * (double)(xr[d] * rs);
        const float mean = (float)(s / (double)D);
        for (int64_t d = 0; d < D; d++) dx[m * D + d] = rs * (dyr[d] * g[d] - (xr[d] * rs) * mean);
    }
}

/* dgamma += the column sums of dy * xhat: parallel over columns, rows in order. */
static void rmsnorm_bwd_cols(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_rmsnorm_params *rp = &a->op->p.rmsnorm;
    const int64_t M = rp->m, D = rp->d;
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]), *rstd = CF32(a->in[3]);
    float *dg = F32(a->out[1]);
    double *s = tg_calloc((size_t)(e - b), sizeof *s);
    if (!s) return tg_cpu_op_out_of_memory(a);
    for (int64_t m = 0; m < M; m++)
        for (int64_t d = b; d < e; d++) s[d - b] += (double)dy[m * D + d] * (double)(x[m * D + d] * rstd[m]);
    for (int64_t d = b; d < e; d++) dg[d] += (float)s[d - b];
    free(s);
}

void tg_cpu_kernel_rmsnorm_bwd(const tg_cpu_op_args *a) {
    const tg_rmsnorm_params *rp = &a->op->p.rmsnorm;
    if (a->out[0]) tg_parallel_for(a->threads, rp->m, rmsnorm_bwd_rows, (void *)a);
    if (a->out[1]) tg_parallel_for(a->threads, rp->d, rmsnorm_bwd_cols, (void *)a);
}

/* ---- rotary positions ------------------------------------------------------------------ */

/* One head of Dh at src, rotated (or rotated back) by position pos into dst. */
static void rotate_head(const tg_rope_params *p, const float *inv_freq, float pos, int inverse, const float *src,
                        float *dst) {
    const int64_t half = p->head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        const float angle = pos * inv_freq[i];
        tg_rope_rotate(src[i], src[i + half], cosf(angle), sinf(angle), inverse, &dst[i], &dst[i + half]);
    }
}

/* Where q, k and v of a row lie: one packed [N, (H + 2 Hkv) Dh] tensor (q | k | v per row),
 * or three tensors made apart (ROPE's in2 and in3; ROPE_BWD's out1 and out2). */
typedef struct rope_parts {
    float *base[3];
    int64_t stride[3];
} rope_parts;

static rope_parts parts_of(const tg_rope_params *p, void *first, void *k, void *v) {
    const int64_t H = p->h, Hkv = p->kv_heads, Dh = p->head_dim;
    if (k) return (rope_parts){{F32(first), F32(k), F32(v)}, {H * Dh, Hkv * Dh, Hkv * Dh}};
    const int64_t row = (H + 2 * Hkv) * Dh;
    return (rope_parts){{F32(first), F32(first) + H * Dh, F32(first) + (H + Hkv) * Dh}, {row, row, row}};
}

typedef struct rope_ctx {
    const tg_cpu_op_args *a;
    const float *inv_freq;
    rope_parts parts; /* the forward's inputs, or the backward's outputs */
} rope_ctx;

/* Forward rows: q and k rotated, k and v repeated to H heads. */
static void rope_rows(void *ctx, int64_t b, int64_t e) {
    const rope_ctx *c = ctx;
    const tg_rope_params *p = &c->a->op->p.rope;
    const int64_t H = p->h, G = p->h / p->kv_heads, Dh = p->head_dim;
    const rope_parts *x = &c->parts;
    const int32_t *pos = CI32(c->a->in[1]);
    float *y = F32(c->a->out[0]);
    for (int64_t r = b; r < e; r++) {
        const float *q = x->base[0] + r * x->stride[0], *k = x->base[1] + r * x->stride[1], *v = x->base[2] + r * x->stride[2];
        float *yr = y + r * 3 * H * Dh;
        for (int64_t h = 0; h < H; h++) {
            rotate_head(p, c->inv_freq, (float)pos[r], 0, q + h * Dh, yr + h * Dh);
            rotate_head(p, c->inv_freq, (float)pos[r], 0, k + (h / G) * Dh, yr + (H + h) * Dh);
            memcpy(yr + (2 * H + h) * Dh, v + (h / G) * Dh, sizeof(float) * (size_t)Dh);
        }
    }
}

/* Backward rows: each kv head's k and v gradients summed over its G heads in head order,
 * then q and k rotated back. */
static void rope_bwd_rows(void *ctx, int64_t b, int64_t e) {
    const rope_ctx *c = ctx;
    const tg_rope_params *p = &c->a->op->p.rope;
    const int64_t H = p->h, Hkv = p->kv_heads, G = H / Hkv, Dh = p->head_dim;
    const rope_parts *dx = &c->parts;
    const float *dy = CF32(c->a->in[0]);
    const int32_t *pos = CI32(c->a->in[1]);
    float *sum = tg_malloc(sizeof(float) * (size_t)Dh);
    if (!sum) return tg_cpu_op_out_of_memory(c->a);
    for (int64_t r = b; r < e; r++) {
        const float *dyr = dy + r * 3 * H * Dh;
        float *dq = dx->base[0] + r * dx->stride[0], *dk = dx->base[1] + r * dx->stride[1], *dv = dx->base[2] + r * dx->stride[2];
        for (int64_t h = 0; h < H; h++) rotate_head(p, c->inv_freq, (float)pos[r], 1, dyr + h * Dh, dq + h * Dh);
        for (int64_t kv = 0; kv < Hkv; kv++) {
            for (int part = 0; part < 2; part++) { /* k, then v */
                const float *src = dyr + ((1 + part) * H + kv * G) * Dh;
                for (int64_t d = 0; d < Dh; d++) sum[d] = src[d];
                for (int64_t j = 1; j < G; j++)
                    for (int64_t d = 0; d < Dh; d++) sum[d] += src[j * Dh + d];
                if (part) memcpy(dv + kv * Dh, sum, sizeof(float) * (size_t)Dh);
                else rotate_head(p, c->inv_freq, (float)pos[r], 1, sum, dk + kv * Dh);
            }
        }
    }
    free(sum);
}

static void rope_run(const tg_cpu_op_args *a, rope_parts parts, void (*rows)(void *, int64_t, int64_t)) {
    const tg_rope_params *p = &a->op->p.rope;
    float *inv_freq = tg_malloc(sizeof(float) * (size_t)(p->head_dim / 2));
    if (!inv_freq) return tg_cpu_op_out_of_memory(a);
    for (int64_t i = 0; i < p->head_dim / 2; i++) inv_freq[i] = tg_rope_inv_freq(p, i);
    rope_ctx c = {a, inv_freq, parts};
    tg_parallel_for(a->threads, p->n, rows, &c);
    free(inv_freq);
}

void tg_cpu_kernel_rope(const tg_cpu_op_args *a) {
    rope_run(a, parts_of(&a->op->p.rope, a->in[0], a->in[2], a->in[3]), rope_rows);
}
void tg_cpu_kernel_rope_bwd(const tg_cpu_op_args *a) {
    rope_run(a, parts_of(&a->op->p.rope, a->out[0], a->out[1], a->out[2]), rope_bwd_rows);
}

/* ---- SwiGLU ------------------------------------------------------------------------------ */

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* gate and up of row m: one [M, 2I] tensor (gate | up per row), or two [M, I] made apart. */
typedef struct glu_parts {
    float *gate, *up;
    int64_t stride;
} glu_parts;

static glu_parts glu_of(int64_t I, void *first, void *up) {
    return up ? (glu_parts){F32(first), F32(up), I} : (glu_parts){F32(first), F32(first) + I, 2 * I};
}

static void swiglu_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const int64_t I = a->op->p.swiglu.i;
    const glu_parts x = glu_of(I, a->in[0], a->in[1]);
    float *y = F32(a->out[0]);
    for (int64_t m = b; m < e; m++)
        for (int64_t i = 0; i < I; i++) {
            const float g = x.gate[m * x.stride + i], u = x.up[m * x.stride + i];
            y[m * I + i] = (g * sigmoid(g)) * u;
        }
}
void tg_cpu_kernel_swiglu(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.swiglu.m, swiglu_rows, (void *)a);
}

/* d(up) = dy silu(g); d(gate) = dy up sigmoid(g) (1 + g (1 - sigmoid(g))). */
static void swiglu_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const int64_t I = a->op->p.swiglu.i;
    const float *dy = CF32(a->in[0]);
    const glu_parts x = glu_of(I, a->in[1], a->in[2]), dx = glu_of(I, a->out[0], a->out[1]);
    for (int64_t m = b; m < e; m++)
        for (int64_t i = 0; i < I; i++) {
            const float g = x.gate[m * x.stride + i], u = x.up[m * x.stride + i], d = dy[m * I + i], s = sigmoid(g);
            dx.gate[m * dx.stride + i] = d * u * (s * (1.0f + g * (1.0f - s)));
            dx.up[m * dx.stride + i] = d * (g * s);
        }
}
void tg_cpu_kernel_swiglu_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.swiglu.m, swiglu_bwd_rows, (void *)a);
}
