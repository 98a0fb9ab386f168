/* CPU reference: ATTENTION (scores, softmax, attention dropout and the PV product in one
 * op) and its backward. */
#include <stdlib.h>
#include "base/alloc.h"
#include <string.h>

#include "kernels/philox.h"
#include "runtime/cpu/cpu_kernels.h"

/* ---- fused attention ----------------------------------------------------------------
 * One work item per (batch, head): it owns that head's columns of every output, so items
 * never share an element and each sum keeps one order whatever the thread count. Dot
 * products and sums run in double, as in the softmax (softmax.c); the scores, probabilities and
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
    const tg_attention_params *ap = &a->op->p.attention; /* the forward's and the backward's */
    memset(c, 0, sizeof *c);
    c->a = a;
    c->B = ap->b, c->H = ap->h, c->T = ap->t, c->Dh = ap->head_dim;
    int64_t D = c->H * c->Dh;
    c->q = CF32(a->in[qkv_slot]);
    if (ap->packed) { /* packed: Q, K and V are column blocks of one row */
        c->ld = 3 * D;
        c->k = c->q + D;
        c->v = c->q + 2 * D;
    } else {
        c->ld = D;
        c->k = CF32(a->in[qkv_slot + 1]);
        c->v = CF32(a->in[qkv_slot + 2]);
    }
    c->mask = CF32(a->in[3]);
    c->causal = ap->causal != 0;
    c->scale = ap->scale;
    c->p = ap->p;
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
    uint32_t key = (uint32_t)c->a->op->p.attention.key;
    uint64_t e0 = (uint64_t)((bh * c->T + q) * c->T), block = UINT64_MAX;
    uint32_t w[4] = {0}; /* drawn at k = 0 (block starts past every index) */
    for (int64_t k = 0; k < kend; k++) {
        uint64_t e = e0 + (uint64_t)k;
        if (e >> 3 != block) tg_philox_block(c->a->seed, c->step, key, block = e >> 3, w);
        factor[k] = (float)tg_dropout_bits16(w, e) * (1.0f / 65536.0f) >= c->p ? c->keep_scale : 0.0f;
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

/* 0, or -1 (every buffer freed, the op told) when out of memory. */
static int attn_scratch_alloc(attn_scratch *w, const attn_ctx *c, int backward) {
    size_t T = (size_t)c->T, Dh = (size_t)c->Dh, td = T * Dh * sizeof(double);
    w->s = tg_malloc(T * sizeof *w->s);
    w->factor = tg_malloc(T * sizeof *w->factor);
    w->kept = tg_malloc(T);
    w->dots = tg_malloc(T * sizeof *w->dots);
    w->acc = tg_malloc(Dh * sizeof *w->acc);
    w->kt = tg_malloc(td);
    w->vt = backward ? tg_malloc(td) : NULL;
    w->dk = backward ? tg_malloc(td) : NULL;
    w->dv = backward ? tg_malloc(td) : NULL;
    if (!w->s || !w->factor || !w->kept || !w->dots || !w->acc || !w->kt || (backward && (!w->vt || !w->dk || !w->dv))) {
        free(w->s), free(w->factor), free(w->kept), free(w->dots), free(w->acc);
        free(w->kt), free(w->vt), free(w->dk), free(w->dv);
        tg_cpu_op_out_of_memory(c->a);
        return -1;
    }
    return 0;
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
    if (attn_scratch_alloc(&w, c, 0)) return;
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

void tg_cpu_kernel_attention(const tg_cpu_op_args *a) {
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
    if (a->op->p.attention.packed) {
        dk = dq + D, dv = dq + 2 * D;
    } else {
        dk = F32(a->out[1]), dv = F32(a->out[2]);
    }
    attn_scratch w;
    if (attn_scratch_alloc(&w, c, 1)) return;
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

void tg_cpu_kernel_attention_bwd(const tg_cpu_op_args *a) {
    attn_ctx c;
    attn_ctx_init(&c, a, 5);
    tg_parallel_for(a->threads, c.B * c.H, attention_bwd_heads, &c);
}
