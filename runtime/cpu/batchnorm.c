/* CPU reference: BATCHNORM (training and eval, with PyTorch's running statistics) and its
 * training-mode backward (plan/ops.def). Channels run in parallel; each channel's sums over
 * its n * hw elements run in double in (image, position) order, so results do not depend
 * on the thread count. */
#include "runtime/cpu/cpu_kernels.h"

static void batchnorm_channels(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_batchnorm_params *bp = &a->op->p.batchnorm;
    const int64_t N = bp->n, C = bp->c, HW = bp->hw, m = N * HW;
    const float *x = CF32(a->in[0]), *gamma = CF32(a->in[1]), *beta = CF32(a->in[2]);
    const float *run_mean_in = CF32(a->in[3]), *run_var_in = CF32(a->in[4]);
    float *y = F32(a->out[0]), *stats = F32(a->out[1]), *run_mean = F32(a->out[2]), *run_var = F32(a->out[3]);
    const int use_running = !a->training && run_mean_in && run_var_in;
    for (int64_t ch = b; ch < e; ch++) {
        float mean, var;
        if (use_running) {
            mean = run_mean_in[ch], var = run_var_in[ch];
        } else {
            double s = 0, ss = 0;
            for (int64_t img = 0; img < N; img++)
                for (int64_t t = 0; t < HW; t++) s += x[(img * C + ch) * HW + t];
            const double mu = s / (double)m;
            for (int64_t img = 0; img < N; img++)
                for (int64_t t = 0; t < HW; t++) {
                    const double dv = x[(img * C + ch) * HW + t] - mu;
                    ss += dv * dv;
                }
            mean = (float)mu, var = (float)(ss / (double)m);
            if (a->training && run_mean && run_var) {
                const float mo = bp->momentum;
                const float unbiased = m > 1 ? (float)(ss / (double)(m - 1)) : var;
                run_mean[ch] = (1.0f - mo) * run_mean[ch] + mo * mean;
                run_var[ch] = (1.0f - mo) * run_var[ch] + mo * unbiased;
            }
        }
        stats[ch] = mean, stats[C + ch] = var;
        const float rstd = (float)(1.0 / sqrt((double)var + (double)bp->eps));
        const float scale = rstd * gamma[ch], shift = beta[ch];
        for (int64_t img = 0; img < N; img++) {
            const float *xr = x + (img * C + ch) * HW;
            float *yr = y + (img * C + ch) * HW;
            for (int64_t t = 0; t < HW; t++) yr[t] = (xr[t] - mean) * scale + shift;
        }
    }
}

void tg_cpu_kernel_batchnorm(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.batchnorm.c, batchnorm_channels, (void *)a);
}

static void batchnorm_bwd_channels(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const tg_batchnorm_bwd_params *bp = &a->op->p.batchnorm_bwd;
    const int64_t N = bp->n, C = bp->c, HW = bp->hw, m = N * HW;
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]), *gamma = CF32(a->in[2]), *stats = CF32(a->in[3]);
    float *dx = F32(a->out[0]), *dgamma = F32(a->out[1]), *dbeta = F32(a->out[2]);
    for (int64_t ch = b; ch < e; ch++) {
        const float mean = stats[ch], rstd = (float)(1.0 / sqrt((double)stats[C + ch] + (double)bp->eps));
        double sdy = 0, sdyx = 0;
        for (int64_t img = 0; img < N; img++)
            for (int64_t t = 0; t < HW; t++) {
                const int64_t i = (img * C + ch) * HW + t;
                sdy += dy[i];
                sdyx += (double)dy[i] * ((x[i] - mean) * rstd);
            }
        const float mdy = (float)(sdy / (double)m), mdyx = (float)(sdyx / (double)m), scale = gamma[ch] * rstd;
        for (int64_t img = 0; img < N; img++)
            for (int64_t t = 0; t < HW; t++) {
                const int64_t i = (img * C + ch) * HW + t;
                const float xhat = (x[i] - mean) * rstd;
                dx[i] = scale * (dy[i] - mdy - xhat * mdyx);
            }
        if (dgamma) dgamma[ch] = (bp->overwrite ? 0.0f : dgamma[ch]) + (float)sdyx;
        if (dbeta) dbeta[ch] = (bp->overwrite ? 0.0f : dbeta[ch]) + (float)sdy;
    }
}

void tg_cpu_kernel_batchnorm_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.batchnorm_bwd.c, batchnorm_bwd_channels, (void *)a);
}
