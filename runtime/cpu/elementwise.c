/* CPU reference: ZERO, FILL, the elementwise ops (ADD, GELU, TANH, RELU6 and their backwards)
 * and DROPOUT. The elementwise ops run in parallel in large blocks: they are memory bound. */
#include <string.h>

#include "kernels/philox.h"
#include "runtime/cpu/cpu_kernels.h"

void tg_cpu_kernel_zero(const tg_cpu_op_args *a) {
    if (a->out[0]) memset(a->out[0], 0, (size_t)a->out_numel[0] * 4);
}

void tg_cpu_kernel_fill(const tg_cpu_op_args *a) {
    float *y = F32(a->out[0]), v = a->op->p.fill.value * (a->in[0] ? CF32(a->in[0])[0] : 1.0f);
    for (int64_t i = 0; i < a->out_numel[0]; i++) y[i] = v;
}

/* ---- the parallel loop ------------------------------------------------------------- */

typedef struct ew_ctx {
    const tg_cpu_op_args *a;
    int64_t n;
    tg_cpu_range_fn fn;
} ew_ctx;

#define EW_BLOCK 16384

static void ew_range(void *p, int64_t b, int64_t e) {
    ew_ctx *c = p;
    c->fn(c->a, b * EW_BLOCK, min64(e * EW_BLOCK, c->n));
}

void tg_cpu_elementwise_parallel(const tg_cpu_op_args *a, int64_t n, tg_cpu_range_fn fn) {
    ew_ctx c = {a, n, fn};
    tg_parallel_for(a->threads, (n + EW_BLOCK - 1) / EW_BLOCK, ew_range, &c);
}

/* ---- add, gelu, tanh --------------------------------------------------------------- */

static void add_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const float *x = CF32(a->in[0]), *y = CF32(a->in[1]);
    float *o = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) o[i] = x[i] + y[i];
}
void tg_cpu_kernel_add(const tg_cpu_op_args *a) { tg_cpu_elementwise_parallel(a, a->op->p.count.n, add_range); }

static float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2)); }

static void gelu_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    if (a->op->p.gelu.form == TG_GELU_TANH) {
        for (int64_t i = b; i < e; i++) y[i] = gelu_tanh(x[i]);
    } else {
        for (int64_t i = b; i < e; i++) y[i] = gelu_erf(x[i]);
    }
}
void tg_cpu_kernel_gelu(const tg_cpu_op_args *a) { tg_cpu_elementwise_parallel(a, a->op->p.gelu.n, gelu_range); }

/* out2 (optional): gelu(x) again, by GELU's own expressions, so the copy equals the
 * forward's output. */
static void gelu_bwd_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const float *dy = CF32(a->in[0]), *x = CF32(a->in[1]);
    float *dx = F32(a->out[0]), *y = a->out[2] ? F32(a->out[2]) : NULL;
    if (a->op->p.gelu_bwd.form == TG_GELU_TANH) {
        for (int64_t i = b; i < e; i++) dx[i] = dy[i] * gelu_tanh_grad(x[i]);
        for (int64_t i = b; y && i < e; i++) y[i] = gelu_tanh(x[i]);
    } else {
        const float inv_sqrt_2pi = 0.3989422804014327f;
        for (int64_t i = b; i < e; i++) {
            float v = x[i];
            float cdf = 0.5f * (1.0f + erff(v * (float)M_SQRT1_2));
            dx[i] = dy[i] * (cdf + v * inv_sqrt_2pi * expf(-0.5f * v * v));
        }
        for (int64_t i = b; y && i < e; i++) y[i] = gelu_erf(x[i]);
    }
}

/* out1 (bias_cols columns): the bias gradient, summed over dx as stored, so a bf16 dx is
 * rounded first (the executor's narrowing afterwards leaves it as it is). */
void tg_cpu_kernel_gelu_bwd(const tg_cpu_op_args *a) {
    const tg_gelu_bwd_params *gp = &a->op->p.gelu_bwd;
    tg_cpu_elementwise_parallel(a, gp->n, gelu_bwd_range);
    const int64_t cols = gp->bias_cols;
    if (cols <= 0 || !a->out[1]) return;
    float *dx = F32(a->out[0]);
    round_as_stored(dx, gp->n, a->out_dtype[0]);
    tg_cpu_colsum(a, dx, F32(a->out[1]), gp->n / cols, cols, 0);
}

static void tanh_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) y[i] = tanhf(x[i]);
}
void tg_cpu_kernel_tanh(const tg_cpu_op_args *a) { tg_cpu_elementwise_parallel(a, a->op->p.count.n, tanh_range); }

static void tanh_bwd_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const float *dy = CF32(a->in[0]), *y = CF32(a->in[1]);
    float *dx = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}
void tg_cpu_kernel_tanh_bwd(const tg_cpu_op_args *a) {
    tg_cpu_elementwise_parallel(a, a->op->p.count.n, tanh_bwd_range);
}

/* ---- relu6 ------------------------------------------------------------------------- */

/* Clamped to [0, 6]; a NaN stays NaN, as torch's. */
static void relu6_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) y[i] = x[i] < 0.0f ? 0.0f : x[i] > 6.0f ? 6.0f : x[i];
}
void tg_cpu_kernel_relu6(const tg_cpu_op_args *a) { tg_cpu_elementwise_parallel(a, a->op->p.count.n, relu6_range); }

static void relu6_bwd_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const float *dy = CF32(a->in[0]), *y = CF32(a->in[1]);
    float *dx = F32(a->out[0]);
    for (int64_t i = b; i < e; i++) dx[i] = y[i] > 0.0f && y[i] < 6.0f ? dy[i] : 0.0f;
}
void tg_cpu_kernel_relu6_bwd(const tg_cpu_op_args *a) {
    tg_cpu_elementwise_parallel(a, a->op->p.count.n, relu6_bwd_range);
}

/* ---- dropout ----------------------------------------------------------------------- */

/* One Philox call serves eight consecutive elements (kernels/philox.h, dropout's draws). */
void tg_cpu_dropout_elements(uint64_t seed, uint64_t step, uint32_t key, float p, int64_t e0, int64_t n,
                             const float *x, float *y) {
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    uint32_t w[4] = {0}; /* drawn at i = 0 */
    for (int64_t i = 0; i < n; i++) {
        uint64_t e = (uint64_t)(e0 + i);
        if (i == 0 || (e & 7) == 0) tg_philox_block(seed, step, key, e >> 3, w);
        y[i] = (float)tg_dropout_bits16(w, e) * (1.0f / 65536.0f) >= p ? x[i] * scale : 0.0f;
    }
}

static void dropout_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const tg_dropout_params *dp = &a->op->p.dropout;
    tg_cpu_dropout_elements(a->seed, step_counter(CF32(a->in[1])), (uint32_t)dp->key, dp->p, b, e - b,
                            CF32(a->in[0]) + b, F32(a->out[0]) + b);
}

void tg_cpu_kernel_dropout(const tg_cpu_op_args *a) {
    const tg_dropout_params *dp = &a->op->p.dropout;
    if (!a->training || dp->p <= 0.0f) {
        if (a->out[0] != a->in[0]) memmove(a->out[0], a->in[0], (size_t)dp->n * 4);
        return;
    }
    tg_cpu_elementwise_parallel(a, dp->n, dropout_range);
}
