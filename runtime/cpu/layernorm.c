/* CPU reference: LAYERNORM, RESIDUAL_LAYERNORM (dropout, residual add and LayerNorm as one
 * op) and their backwards. Row statistics and column sums run in double. */
#include <stdlib.h>
#include "base/alloc.h"
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"

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
    const tg_layernorm_params *lp = &a->op->p.layernorm;
    int64_t D = lp->d;
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]), *mean = F32(a->out[1]), *rstd = F32(a->out[2]);
    for (int64_t m = b; m < e; m++)
        layernorm_row(x + m * D, CF32(a->in[1]), CF32(a->in[2]), D, lp->eps, y + m * D, mean ? mean + m : NULL,
                      rstd ? rstd + m : NULL);
}
void tg_cpu_kernel_layernorm(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.layernorm.m, layernorm_rows, (void *)a);
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
    int64_t D = a->op->p.layernorm_bwd.d;
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]), *mean = CF32(a->in[3]), *rstd = CF32(a->in[4]);
    for (int64_t m = b; m < e; m++)
        layernorm_bwd_row(dy + m * D, x + m * D, CF32(a->in[2]), mean[m], rstd[m], D, F32(a->out[0]) + m * D);
}

/* The column sums of a LayerNorm backward, over [M, D] dy and the normalised input x. */
typedef struct ln_cols_ctx {
    const float *dy, *x, *mean, *rstd;
    float *dgamma, *dbeta;
    int64_t M, D;
    int overwrite; /* = instead of += */
    const tg_cpu_op_args *a;
} ln_cols_ctx;

/* dgamma += sum_m dy*xhat, dbeta += sum_m dy (= with overwrite): parallel over columns,
 * rows in order. */
static void layernorm_bwd_cols(void *p, int64_t b, int64_t e) {
    const ln_cols_ctx *c = p;
    int64_t M = c->M, D = c->D;
    const float *dy = c->dy, *x = c->x, *mean = c->mean, *rstd = c->rstd;
    float *dg = c->dgamma, *db = c->dbeta;
    double *s = tg_calloc((size_t)(e - b) * 2, sizeof *s);
    if (!s) return tg_cpu_op_out_of_memory(c->a);
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

/* M, D and overwrite are the parameters of the calling kind (LAYERNORM_BWD or
 * RESIDUAL_LAYERNORM_BWD). */
static void layernorm_cols(const tg_cpu_op_args *a, int64_t M, int64_t D, int overwrite, const float *dy,
                           const float *x, const float *mean, const float *rstd, float *dgamma, float *dbeta) {
    ln_cols_ctx c = {dy, x, mean, rstd, dgamma, dbeta, M, D, overwrite, a};
    if (dgamma || dbeta) tg_parallel_for(a->threads, c.D, layernorm_bwd_cols, &c);
}

void tg_cpu_kernel_layernorm_bwd(const tg_cpu_op_args *a) {
    const tg_layernorm_bwd_params *lp = &a->op->p.layernorm_bwd;
    if (a->out[0]) tg_parallel_for(a->threads, lp->m, layernorm_bwd_rows, (void *)a);
    layernorm_cols(a, lp->m, lp->d, lp->overwrite != 0, CF32(a->in[0]), CF32(a->in[1]), CF32(a->in[3]),
                   CF32(a->in[4]), F32(a->out[1]), F32(a->out[2]));
}

/* ---- residual layernorm --------------------------------------------------------------
 * The op reads back s (forward) and ds (backward) as stored (round_as_stored), like the
 * separate ops it replaces. */

/* The dropout of RESIDUAL_LAYERNORM(_BWD) (probability p of the calling kind, the step
 * counter in slot `step_slot`): 1 when it applies (training, p > 0), with the step it
 * draws at. */
static int residual_dropout_on(const tg_cpu_op_args *a, float p, int step_slot, uint64_t *step) {
    *step = step_counter(CF32(a->in[step_slot]));
    return a->training && p > 0.0f;
}

static void residual_layernorm_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_residual_layernorm_params *rp = &a->op->p.residual_layernorm;
    int64_t D = rp->d;
    uint64_t step;
    int drop = residual_dropout_on(a, rp->p, 4, &step);
    const float *x = CF32(a->in[0]), *r = CF32(a->in[1]);
    float *y = F32(a->out[0]), *s = F32(a->out[1]), *mean = F32(a->out[2]), *rstd = F32(a->out[3]);
    for (int64_t m = b; m < e; m++) {
        const float *xr = x + m * D, *rr = r + m * D;
        float *sr = s + m * D;
        if (drop) tg_cpu_dropout_elements(a->seed, step, (uint32_t)rp->key, rp->p, m * D, D, xr, sr);
        else memcpy(sr, xr, sizeof(float) * (size_t)D);
        for (int64_t d = 0; d < D; d++) sr[d] = sr[d] + rr[d];
        round_as_stored(sr, D, a->out_dtype[1]);
        layernorm_row(sr, CF32(a->in[2]), CF32(a->in[3]), D, rp->eps, y + m * D, mean ? mean + m : NULL,
                      rstd ? rstd + m : NULL);
    }
}
void tg_cpu_kernel_residual_layernorm(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.residual_layernorm.m, residual_layernorm_rows, (void *)a);
}

static void residual_layernorm_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_residual_layernorm_bwd_params *rp = &a->op->p.residual_layernorm_bwd;
    int64_t D = rp->d;
    uint64_t step;
    int drop = residual_dropout_on(a, rp->p, 6, &step);
    const float *dy = CF32(a->in[0]), *s = CF32(a->in[1]), *mean = CF32(a->in[3]), *rstd = CF32(a->in[4]);
    const float *extra = CF32(a->in[5]);
    float *ds = F32(a->out[0]), *dx = F32(a->out[1]);
    for (int64_t m = b; m < e; m++) {
        float *dsr = ds + m * D;
        layernorm_bwd_row(dy + m * D, s + m * D, CF32(a->in[2]), mean[m], rstd[m], D, dsr);
        if (extra)
            for (int64_t d = 0; d < D; d++) dsr[d] = dsr[d] + extra[m * D + d];
        round_as_stored(dsr, D, a->out_dtype[0]);
        if (drop) tg_cpu_dropout_elements(a->seed, step, (uint32_t)rp->key, rp->p, m * D, D, dsr, dx + m * D);
        else memcpy(dx + m * D, dsr, sizeof(float) * (size_t)D);
    }
}
void tg_cpu_kernel_residual_layernorm_bwd(const tg_cpu_op_args *a) {
    const tg_residual_layernorm_bwd_params *rp = &a->op->p.residual_layernorm_bwd;
    tg_parallel_for(a->threads, rp->m, residual_layernorm_bwd_rows, (void *)a);
    layernorm_cols(a, rp->m, rp->d, rp->overwrite != 0, CF32(a->in[0]), CF32(a->in[1]), CF32(a->in[3]),
                   CF32(a->in[4]), F32(a->out[2]), F32(a->out[3]));
}
