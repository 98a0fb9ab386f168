/* CPU reference: BATCHNORM (training and eval, with PyTorch's running statistics) and its
 * training-mode backward (plan/ops.def), over channels-last x viewed as [m, c], m = n * hw.
 * Channels run in parallel, a contiguous run of them a thread: each run walks the m rows in
 * order with a double accumulator per channel, so every channel's sums run in row order
 * whatever the thread count, and the innermost loops run over contiguous channels. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/cpu/cpu_kernels.h"

/* A run of channels' double sums and float factors. */
typedef struct bn_scratch {
    double *s, *ss;
    float *mean, *scale, *shift, *mdy, *mdyx; /* mdy, mdyx: the backward's means of the sums */
} bn_scratch;

static int bn_scratch_alloc(bn_scratch *w, int64_t n) {
    const size_t k = (size_t)(n > 0 ? n : 1);
    w->s = tg_malloc(k * sizeof *w->s);
    w->ss = tg_malloc(k * sizeof *w->ss);
    w->mean = tg_malloc(k * sizeof *w->mean);
    w->scale = tg_malloc(k * sizeof *w->scale);
    w->shift = tg_malloc(k * sizeof *w->shift);
    w->mdy = tg_malloc(k * sizeof *w->mdy);
    w->mdyx = tg_malloc(k * sizeof *w->mdyx);
    return w->s && w->ss && w->mean && w->scale && w->shift && w->mdy && w->mdyx ? 0 : -1;
}

static void bn_scratch_free(bn_scratch *w) {
    free(w->s), free(w->ss), free(w->mean), free(w->scale), free(w->shift), free(w->mdy), free(w->mdyx);
}

/* Channels [b, e): their statistics (the batch's or the running ones), then y. */
static void batchnorm_channels(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_batchnorm_params *bp = &a->op->p.batchnorm;
    const int64_t C = bp->c, m = bp->n * bp->hw, nc = e - b;
    const float *x = CF32(a->in[0]), *gamma = CF32(a->in[1]), *beta = CF32(a->in[2]);
    const float *run_mean_in = CF32(a->in[3]), *run_var_in = CF32(a->in[4]);
    float *y = F32(a->out[0]), *stats = F32(a->out[1]), *run_mean = F32(a->out[2]), *run_var = F32(a->out[3]);
    const int use_running = !a->training && run_mean_in && run_var_in;
    bn_scratch w;
    if (bn_scratch_alloc(&w, nc)) {
        bn_scratch_free(&w);
        return tg_cpu_op_out_of_memory(a);
    }
    if (!use_running) {
        /* The mean first, then the squared deviations from it, each in row order. */
        memset(w.s, 0, sizeof(double) * (size_t)nc);
        memset(w.ss, 0, sizeof(double) * (size_t)nc);
        for (int64_t r = 0; r < m; r++) {
            const float *xr = x + r * C + b;
            for (int64_t k = 0; k < nc; k++) w.s[k] += xr[k];
        }
        for (int64_t k = 0; k < nc; k++) w.s[k] /= (double)m; /* now the mean, in double */
        for (int64_t r = 0; r < m; r++) {
            const float *xr = x + r * C + b;
            for (int64_t k = 0; k < nc; k++) {
                const double dv = xr[k] - w.s[k];
                w.ss[k] += dv * dv;
            }
        }
    }
    for (int64_t k = 0; k < nc; k++) {
        const int64_t ch = b + k;
        float mean, var;
        if (use_running) {
            mean = run_mean_in[ch], var = run_var_in[ch];
        } else {
            mean = (float)w.s[k], var = (float)(w.ss[k] / (double)m);
            if (a->training && run_mean && run_var) {
                const float mo = bp->momentum;
                const float unbiased = m > 1 ? (float)(w.ss[k] / (double)(m - 1)) : var;
                run_mean[ch] = (1.0f - mo) * run_mean[ch] + mo * mean;
                run_var[ch] = (1.0f - mo) * run_var[ch] + mo * unbiased;
            }
        }
        stats[ch] = mean, stats[C + ch] = var;
        const float rstd = (float)(1.0 / sqrt((double)var + (double)bp->eps));
        w.mean[k] = mean, w.scale[k] = rstd * gamma[ch], w.shift[k] = beta[ch];
    }
    for (int64_t r = 0; r < m; r++) {
        const float *xr = x + r * C + b;
        float *yr = y + r * C + b;
        for (int64_t k = 0; k < nc; k++) yr[k] = (xr[k] - w.mean[k]) * w.scale[k] + w.shift[k];
        if (bp->relu6) /* RELU6's comparisons (a NaN stays NaN) */
            for (int64_t k = 0; k < nc; k++) yr[k] = yr[k] < 0.0f ? 0.0f : yr[k] > 6.0f ? 6.0f : yr[k];
    }
    bn_scratch_free(&w);
}

void tg_cpu_kernel_batchnorm(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.batchnorm.c, batchnorm_channels, (void *)a);
}

/* dy, or 0 where the forward's ReLU6 output (y, with relu6) is not in (0, 6): RELU6_BWD's rule. */
static inline float bn_dy(const float *dyr, const float *yr, int64_t k) {
    return !yr || (yr[k] > 0.0f && yr[k] < 6.0f) ? dyr[k] : 0.0f;
}

/* Channels [b, e): the sums of dy and dy * xhat in row order, then dx. */
static void batchnorm_bwd_channels(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_batchnorm_bwd_params *bp = &a->op->p.batchnorm_bwd;
    const int64_t C = bp->c, m = bp->n * bp->hw, nc = e - b;
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]), *gamma = CF32(a->in[2]), *stats = CF32(a->in[3]);
    const float *y = bp->relu6 ? CF32(a->in[4]) : NULL;
    float *dx = F32(a->out[0]), *dgamma = F32(a->out[1]), *dbeta = F32(a->out[2]);
    bn_scratch w; /* s: the sums of dy, ss: of dy xhat; scale: rstd, shift: gamma rstd */
    if (bn_scratch_alloc(&w, nc)) {
        bn_scratch_free(&w);
        return tg_cpu_op_out_of_memory(a);
    }
    for (int64_t k = 0; k < nc; k++) {
        w.mean[k] = stats[b + k];
        w.scale[k] = (float)(1.0 / sqrt((double)stats[C + b + k] + (double)bp->eps));
    }
    memset(w.s, 0, sizeof(double) * (size_t)nc);
    memset(w.ss, 0, sizeof(double) * (size_t)nc);
    for (int64_t r = 0; r < m; r++) {
        const float *dyr = dy + r * C + b, *xr = x + r * C + b, *yr = y ? y + r * C + b : NULL;
        for (int64_t k = 0; k < nc; k++) {
            const float g = bn_dy(dyr, yr, k);
            w.s[k] += g;
            w.ss[k] += (double)g * ((xr[k] - w.mean[k]) * w.scale[k]);
        }
    }
    for (int64_t k = 0; k < nc; k++) {
        const int64_t ch = b + k;
        const double sdy = w.s[k], sdyx = w.ss[k];
        if (dgamma) dgamma[ch] = (bp->overwrite ? 0.0f : dgamma[ch]) + (float)sdyx;
        if (dbeta) dbeta[ch] = (bp->overwrite ? 0.0f : dbeta[ch]) + (float)sdy;
        w.shift[k] = gamma[ch] * w.scale[k];
        w.mdy[k] = (float)(sdy / (double)m), w.mdyx[k] = (float)(sdyx / (double)m);
    }
    for (int64_t r = 0; r < m; r++) {
        const float *dyr = dy + r * C + b, *xr = x + r * C + b, *yr = y ? y + r * C + b : NULL;
        float *dxr = dx + r * C + b;
        for (int64_t k = 0; k < nc; k++) {
            const float xhat = (xr[k] - w.mean[k]) * w.scale[k];
            dxr[k] = w.shift[k] * (bn_dy(dyr, yr, k) - w.mdy[k] - xhat * w.mdyx[k]);
        }
    }
    bn_scratch_free(&w);
}

void tg_cpu_kernel_batchnorm_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.batchnorm_bwd.c, batchnorm_bwd_channels, (void *)a);
}
