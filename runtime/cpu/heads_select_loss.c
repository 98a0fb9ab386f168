/* CPU reference: the attention heads' layout (HEADS_SPLIT, HEADS_MERGE), the sequence
 * classifier's token (SELECT_TOKEN and its backward) and the loss (CROSS_ENTROPY and its
 * backward). */
#include <stdlib.h>
#include "base/alloc.h"
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"

/* ---- heads split / merge ----------------------------------------------------------- */

/* Copies between x [B*T, P*H*Dh] and part p [B,H,T,Dh]; to_heads picks the direction. */
static void heads_copy(const tg_cpu_op_args *a, int to_heads) {
    const tg_heads_params *hp = &a->op->p.heads;
    int64_t B = hp->b, T = hp->t, H = hp->h, Dh = hp->head_dim;
    int64_t P = hp->parts < 1 ? 1 : hp->parts;
    int64_t W = P * H * Dh;
    float *x = F32(to_heads ? a->in[0] : a->out[0]);
    for (int64_t part = 0; part < P; part++) {
        float *heads = F32(to_heads ? a->out[part] : a->in[part]);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++) {
                    float *xr = x + (b * T + t) * W + part * H * Dh + h * Dh;
                    float *hr = heads + ((b * H + h) * T + t) * Dh;
                    if (to_heads)
                        memcpy(hr, xr, (size_t)Dh * 4);
                    else
                        memcpy(xr, hr, (size_t)Dh * 4);
                }
    }
}
void tg_cpu_kernel_heads_split(const tg_cpu_op_args *a) { heads_copy(a, 1); }
void tg_cpu_kernel_heads_merge(const tg_cpu_op_args *a) { heads_copy(a, 0); }

/* ---- select token ------------------------------------------------------------------ */

static int64_t selected_token(const tg_cpu_op_args *a, int64_t b) {
    const tg_select_params *sp = &a->op->p.select;
    int64_t T = sp->t;
    if (sp->mode != TG_SELECT_LAST_NON_PAD || !a->in[1]) return 0;
    const int32_t *ids = CI32(a->in[1]) + b * T;
    for (int64_t t = T - 1; t >= 0; t--)
        if (ids[t] != sp->pad_id) return t;
    return 0;
}

void tg_cpu_kernel_select_token(const tg_cpu_op_args *a) {
    const tg_select_params *sp = &a->op->p.select;
    int64_t B = sp->b, T = sp->t, D = sp->d;
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    for (int64_t b = 0; b < B; b++)
        memcpy(y + b * D, x + (b * T + selected_token(a, b)) * D, (size_t)D * 4);
}

void tg_cpu_kernel_select_token_bwd(const tg_cpu_op_args *a) {
    const tg_select_params *sp = &a->op->p.select;
    int64_t B = sp->b, T = sp->t, D = sp->d;
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
    float *lse;        /* forward: out1, or NULL; backward: in4, or NULL (ops.def) */
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

/* Classes that count: `classes` when set (a row padded to c for aligned GEMMs), else c. */
static int64_t ce_classes(const tg_op *op) {
    const tg_cross_entropy_params *cp = &op->p.cross_entropy;
    return cp->classes > 0 ? cp->classes : cp->c;
}

static void ce_fwd_rows(void *p, int64_t b, int64_t e) {
    ce_ctx *c = p;
    int64_t C = c->a->op->p.cross_entropy.c, V = ce_classes(c->a->op);
    for (int64_t n = b; n < e; n++) {
        int32_t l = c->labels[n];
        const float *x = c->logits + n * C;
        const double lse = ce_counted(l, V) ? ce_logsumexp(x, V) : 0.0;
        c->row_loss[n] = ce_counted(l, V) ? lse - x[l] : 0.0;
        if (c->lse) {
            const float hi = (float)lse;
            c->lse[2 * n] = hi, c->lse[2 * n + 1] = (float)(lse - (double)hi);
        }
    }
}

static void ce_bwd_rows(void *p, int64_t b, int64_t e) {
    ce_ctx *c = p;
    int64_t C = c->a->op->p.cross_entropy.c, V = ce_classes(c->a->op);
    for (int64_t n = b; n < e; n++) {
        int32_t l = c->labels[n];
        const float *x = c->logits + n * C;
        float *d = c->dlogits + n * C;
        memset(d + V, 0, (size_t)(C - V) * 4); /* padding columns */
        if (!ce_counted(l, V) || c->coef == 0.0f) {
            memset(d, 0, (size_t)V * 4);
            continue;
        }
        const double lse = c->lse ? (double)c->lse[2 * n] + (double)c->lse[2 * n + 1] : ce_logsumexp(x, V);
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

/* The divisor of the summed loss: the optional normaliser where it is positive (the
 * window's count under grad_accumulation, plan/ops.def), else the rows that count. */
static double ce_divisor(const tg_cpu_op_args *a, int slot, const int32_t *labels, int64_t N) {
    if (a->in[slot]) {
        const float norm = CF32(a->in[slot])[0];
        if (norm > 0.0f) return (double)norm;
    }
    return (double)ce_n_valid(labels, N, ce_classes(a->op));
}

void tg_cpu_kernel_cross_entropy(const tg_cpu_op_args *a) {
    int64_t N = a->op->p.cross_entropy.n;
    ce_ctx c = {.a = a, .logits = CF32(a->in[0]), .labels = CI32(a->in[1]), .lse = a->out[1] ? F32(a->out[1]) : NULL};
    c.row_loss = tg_malloc((size_t)(N > 0 ? N : 1) * sizeof *c.row_loss);
    if (!c.row_loss) return tg_cpu_op_out_of_memory(a);
    tg_parallel_for(a->threads, N, ce_fwd_rows, &c);
    double sum = 0; /* summed in row order: deterministic */
    for (int64_t n = 0; n < N; n++) sum += c.row_loss[n];
    const double valid = ce_divisor(a, 2, c.labels, N);
    F32(a->out[0])[0] = valid > 0 ? (float)(sum / valid) : 0.0f;
    free(c.row_loss);
}

void tg_cpu_kernel_cross_entropy_bwd(const tg_cpu_op_args *a) {
    int64_t N = a->op->p.cross_entropy.n;
    ce_ctx c = {.a = a, .logits = CF32(a->in[1]), .labels = CI32(a->in[2]),
                .lse = a->in[4] ? (float *)a->in[4] : NULL, .dlogits = F32(a->out[0])};
    const double valid = ce_divisor(a, 3, c.labels, N);
    c.coef = valid > 0 ? (float)((double)CF32(a->in[0])[0] / valid) : 0.0f;
    tg_parallel_for(a->threads, N, ce_bwd_rows, &c);
}

/* ---- span loss (question answering) ------------------------------------------------ */

/* The position a row's side trains on, or -1 when ignored: HF clamps to [0, T] and
 * ignores T. */
static int64_t span_target(int32_t pos, int64_t T) {
    if (pos < 0) return 0;
    return pos < T ? pos : -1;
}

/* Counted rows of one side (0 start, 1 end). */
static int64_t span_counted(const int32_t *pos, int64_t B, int64_t T, int side) {
    int64_t n = 0;
    for (int64_t b = 0; b < B; b++) n += span_target(pos[2 * b + side], T) >= 0;
    return n;
}

/* The divisor of one side's summed loss: the optional normaliser's entry where it is
 * positive (the window's count under grad_accumulation, plan/ops.def), else the side's
 * counted rows. */
static double span_divisor(const tg_cpu_op_args *a, int slot, const int32_t *pos, int64_t B, int64_t T, int side) {
    if (a->in[slot]) {
        const float norm = CF32(a->in[slot])[side];
        if (norm > 0.0f) return (double)norm;
    }
    return (double)span_counted(pos, B, T, side);
}

/* log(sum_t exp(x[2t] - max)) + max over one side's column (stride 2), in double. */
static double span_logsumexp(const float *x, int64_t T) {
    float mx = -INFINITY;
    for (int64_t t = 0; t < T; t++) mx = fmaxf(mx, x[2 * t]);
    double s = 0;
    for (int64_t t = 0; t < T; t++) s += exp((double)x[2 * t] - mx);
    return log(s) + mx;
}

void tg_cpu_kernel_span_loss(const tg_cpu_op_args *a) {
    const int64_t B = a->op->p.span_loss.b, T = a->op->p.span_loss.t;
    const float *logits = CF32(a->in[0]);
    const int32_t *pos = CI32(a->in[1]);
    double loss = 0;
    for (int side = 0; side < 2; side++) {
        double sum = 0; /* row order: deterministic */
        for (int64_t b = 0; b < B; b++) {
            const int64_t p = span_target(pos[2 * b + side], T);
            const float *x = logits + b * T * 2 + side;
            if (p >= 0) sum += span_logsumexp(x, T) - x[2 * p];
        }
        const double n = span_divisor(a, 2, pos, B, T, side);
        if (n > 0) loss += sum / n;
    }
    F32(a->out[0])[0] = (float)(loss / 2);
}

void tg_cpu_kernel_span_loss_bwd(const tg_cpu_op_args *a) {
    const int64_t B = a->op->p.span_loss.b, T = a->op->p.span_loss.t;
    const float *logits = CF32(a->in[1]);
    const int32_t *pos = CI32(a->in[2]);
    float *d = F32(a->out[0]);
    for (int side = 0; side < 2; side++) {
        const double n = span_divisor(a, 3, pos, B, T, side);
        const float coef = n > 0 ? (float)((double)CF32(a->in[0])[0] / 2.0 / n) : 0.0f;
        for (int64_t b = 0; b < B; b++) {
            const int64_t p = span_target(pos[2 * b + side], T);
            const float *x = logits + b * T * 2 + side;
            float *dx = d + b * T * 2 + side;
            if (p < 0 || coef == 0.0f) {
                for (int64_t t = 0; t < T; t++) dx[2 * t] = 0.0f;
                continue;
            }
            const double lse = span_logsumexp(x, T);
            for (int64_t t = 0; t < T; t++) dx[2 * t] = (float)(coef * (exp((double)x[2 * t] - lse) - (t == p ? 1.0 : 0.0)));
        }
    }
}
