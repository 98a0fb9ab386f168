/* CPU reference: CONV2D and its backward, GLOBAL_AVG_POOL and its backward (channels-last
 * images, NHWC: plan/ops.def). Every output element sums its terms in one fixed order
 * whatever the thread count: the forward and dx by pixel rows in float, in the order
 * ops.def states; the weight and bias gradients by (weight tap, output channel) in double.
 * The innermost loops run over a pixel's contiguous channels, reading the weight from a
 * copy transposed so that its channel index is the contiguous one too. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/cpu/cpu_kernels.h"

/* The sizes of one convolution, from CONV2D's or CONV2D_BWD's parameters. */
typedef struct conv_dims {
    int64_t n, c_in, h, w, c_out, k, stride, pad, groups;
    int64_t oh, ow, cin_g, cout_g; /* output size; channels per group */
} conv_dims;

static conv_dims conv_dims_of(int64_t n, int64_t c_in, int64_t h, int64_t w, int64_t c_out, int64_t k,
                              int64_t stride, int64_t pad, int64_t groups) {
    conv_dims d = {n, c_in, h, w, c_out, k, stride, pad, groups, 0, 0, 0, 0};
    d.oh = (h + 2 * pad - k) / stride + 1;
    d.ow = (w + 2 * pad - k) / stride + 1;
    d.cin_g = c_in / groups;
    d.cout_g = c_out / groups;
    return d;
}

/* The output index i (row or column) that reads input index y through tap u, or -1 when
 * none does: y = i * stride - pad + u. */
static int64_t reader_of(const conv_dims *d, int64_t y, int64_t u, int64_t out_size) {
    const int64_t t = y + d->pad - u;
    if (t < 0 || t % d->stride) return -1;
    return t / d->stride < out_size ? t / d->stride : -1;
}

typedef struct conv_ctx {
    conv_dims d;
    const float *x, *wt, *bias, *dy;
    const float *wt_t; /* the weight transposed for the pass (conv_weight_by_out, _by_in) */
    float *y, *dx, *dw, *db;
    int overwrite;
    const tg_cpu_op_args *a;
} conv_ctx;

/* ---- forward ------------------------------------------------------------------------- */

/* The weight as [c_in/groups, k, k, c_out]: tap (c, u, v)'s weights of every output
 * channel contiguous. */
static float *conv_weight_by_out(const conv_dims *d, const float *w) {
    const int64_t taps = d->cin_g * d->k * d->k;
    float *t = tg_malloc(sizeof(float) * (size_t)(taps * d->c_out > 0 ? taps * d->c_out : 1));
    if (!t) return NULL;
    for (int64_t o = 0; o < d->c_out; o++)
        for (int64_t q = 0; q < taps; q++) t[q * d->c_out + o] = w[o * taps + q];
    return t;
}

/* Output pixel rows [b, e) of the n * oh: each pixel's c_out outputs accumulated in place
 * over (c, u, v), all channels at once, the bias added last. */
static void conv_fwd_rows(void *p, int64_t b, int64_t e) {
    const conv_ctx *c = p;
    const conv_dims *d = &c->d;
    const int64_t C = d->c_out, cin_g = d->cin_g, cout_g = d->cout_g;
    for (int64_t r = b; r < e; r++) {
        const int64_t img = r / d->oh, i = r % d->oh;
        for (int64_t j = 0; j < d->ow; j++) {
            float *acc = c->y + (r * d->ow + j) * C;
            memset(acc, 0, sizeof(float) * (size_t)C);
            for (int64_t ci = 0; ci < cin_g; ci++)
                for (int64_t u = 0; u < d->k; u++) {
                    const int64_t iy = i * d->stride - d->pad + u;
                    if (iy < 0 || iy >= d->h) continue;
                    for (int64_t v = 0; v < d->k; v++) {
                        const int64_t ix = j * d->stride - d->pad + v;
                        if (ix < 0 || ix >= d->w) continue;
                        const float *xp = c->x + ((img * d->h + iy) * d->w + ix) * d->c_in;
                        const float *wp = c->wt_t + ((ci * d->k + u) * d->k + v) * C;
                        if (d->groups == 1) {
                            const float xv = xp[ci];
                            for (int64_t o = 0; o < C; o++) acc[o] += wp[o] * xv;
                        } else if (cin_g == 1 && cout_g == 1) { /* depthwise: channel o reads channel o */
                            for (int64_t o = 0; o < C; o++) acc[o] += wp[o] * xp[o];
                        } else {
                            for (int64_t o = 0; o < C; o++) acc[o] += wp[o] * xp[o / cout_g * cin_g + ci];
                        }
                    }
                }
            if (c->bias)
                for (int64_t o = 0; o < C; o++) acc[o] += c->bias[o];
        }
    }
}

void tg_cpu_kernel_conv2d(const tg_cpu_op_args *a) {
    const tg_conv2d_params *p = &a->op->p.conv2d;
    conv_ctx c = {.d = conv_dims_of(p->n, p->c_in, p->h, p->w, p->c_out, p->k, p->stride, p->pad, p->groups),
                  .x = CF32(a->in[0]),
                  .wt = CF32(a->in[1]),
                  .bias = CF32(a->in[2]),
                  .y = F32(a->out[0]),
                  .a = a};
    float *wt_t = conv_weight_by_out(&c.d, c.wt);
    if (!wt_t) return tg_cpu_op_out_of_memory(a);
    c.wt_t = wt_t;
    tg_parallel_for(a->threads, c.d.n * c.d.oh, conv_fwd_rows, &c);
    free(wt_t);
}

/* ---- backward ------------------------------------------------------------------------ */

/* The weight as [c_out/groups, k, k, c_in]: for the o-th output channel of each group and
 * tap (u, v), the weight reading each input channel, contiguous over the input channels. */
static float *conv_weight_by_in(const conv_dims *d, const float *w) {
    const int64_t kk = d->k * d->k, n = d->cout_g * kk * d->c_in;
    float *t = tg_malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!t) return NULL;
    for (int64_t oo = 0; oo < d->cout_g; oo++)
        for (int64_t uv = 0; uv < kk; uv++)
            for (int64_t chan = 0; chan < d->c_in; chan++) {
                const int64_t g = chan / d->cin_g, ci = chan % d->cin_g, o = g * d->cout_g + oo;
                t[(oo * kk + uv) * d->c_in + chan] = w[(o * d->cin_g + ci) * kk + uv];
            }
    return t;
}

/* Input-gradient pixel rows [b, e) of the n * h: each pixel's c_in values accumulated in
 * place over the group's output channels o, then (u, v), from the output pixels that
 * read it. */
static void conv_bwd_data_rows(void *p, int64_t b, int64_t e) {
    const conv_ctx *c = p;
    const conv_dims *d = &c->d;
    const int64_t C = d->c_in, cin_g = d->cin_g, cout_g = d->cout_g;
    for (int64_t r = b; r < e; r++) {
        const int64_t img = r / d->h, y = r % d->h;
        for (int64_t x = 0; x < d->w; x++) {
            float *acc = c->dx + (r * d->w + x) * C;
            memset(acc, 0, sizeof(float) * (size_t)C);
            for (int64_t oo = 0; oo < cout_g; oo++)
                for (int64_t u = 0; u < d->k; u++) {
                    const int64_t i = reader_of(d, y, u, d->oh);
                    if (i < 0) continue;
                    for (int64_t v = 0; v < d->k; v++) {
                        const int64_t j = reader_of(d, x, v, d->ow);
                        if (j < 0) continue;
                        const float *dyp = c->dy + ((img * d->oh + i) * d->ow + j) * d->c_out;
                        const float *wp = c->wt_t + ((oo * d->k + u) * d->k + v) * C;
                        if (d->groups == 1) {
                            const float dv = dyp[oo];
                            for (int64_t ch = 0; ch < C; ch++) acc[ch] += wp[ch] * dv;
                        } else if (cin_g == 1 && cout_g == 1) { /* depthwise */
                            for (int64_t ch = 0; ch < C; ch++) acc[ch] += wp[ch] * dyp[ch];
                        } else {
                            for (int64_t ch = 0; ch < C; ch++) acc[ch] += wp[ch] * dyp[ch / cin_g * cout_g + oo];
                        }
                    }
                }
        }
    }
}

/* Weight gradients over the flat index q = tap * c_out + o, tap = (c, u, v), of [b, e):
 * each run of one tap sums dy * x over the output pixels (img, i, j) in order, in double,
 * for its output channels at once. */
static void conv_bwd_filter_range(void *p, int64_t b, int64_t e) {
    const conv_ctx *c = p;
    const conv_dims *d = &c->d;
    const int64_t C = d->c_out, cin_g = d->cin_g, cout_g = d->cout_g, kk = d->k * d->k;
    double *s = tg_malloc(sizeof(double) * (size_t)(C > 0 ? C : 1));
    if (!s) return tg_cpu_op_out_of_memory(c->a);
    for (int64_t q = b; q < e;) {
        const int64_t tap = q / C, o0 = q % C, o1 = min64(C, o0 + (e - q)), n_o = o1 - o0;
        const int64_t ci = tap / kk, u = tap % kk / d->k, v = tap % d->k;
        memset(s, 0, sizeof(double) * (size_t)n_o);
        for (int64_t img = 0; img < d->n; img++)
            for (int64_t i = 0; i < d->oh; i++) {
                const int64_t iy = i * d->stride - d->pad + u;
                if (iy < 0 || iy >= d->h) continue;
                for (int64_t j = 0; j < d->ow; j++) {
                    const int64_t ix = j * d->stride - d->pad + v;
                    if (ix < 0 || ix >= d->w) continue;
                    const float *dyp = c->dy + ((img * d->oh + i) * d->ow + j) * C + o0;
                    const float *xp = c->x + ((img * d->h + iy) * d->w + ix) * d->c_in;
                    if (d->groups == 1) {
                        const double xv = xp[ci];
                        for (int64_t t = 0; t < n_o; t++) s[t] += (double)dyp[t] * xv;
                    } else if (cin_g == 1 && cout_g == 1) {
                        for (int64_t t = 0; t < n_o; t++) s[t] += (double)dyp[t] * xp[o0 + t];
                    } else {
                        for (int64_t t = 0; t < n_o; t++) s[t] += (double)dyp[t] * xp[(o0 + t) / cout_g * cin_g + ci];
                    }
                }
            }
        for (int64_t t = 0; t < n_o; t++) {
            float *dwv = c->dw + (o0 + t) * cin_g * kk + tap;
            *dwv = (c->overwrite ? 0.0f : *dwv) + (float)s[t];
        }
        q += n_o;
    }
    free(s);
}

void tg_cpu_kernel_conv2d_bwd(const tg_cpu_op_args *a) {
    const tg_conv2d_bwd_params *p = &a->op->p.conv2d_bwd;
    conv_ctx c = {.d = conv_dims_of(p->n, p->c_in, p->h, p->w, p->c_out, p->k, p->stride, p->pad, p->groups),
                  .dy = CF32(a->in[0]),
                  .x = CF32(a->in[1]),
                  .wt = CF32(a->in[2]),
                  .dx = F32(a->out[0]),
                  .dw = F32(a->out[1]),
                  .db = F32(a->out[2]),
                  .overwrite = p->overwrite != 0,
                  .a = a};
    if (c.dx) {
        float *wt_t = conv_weight_by_in(&c.d, c.wt);
        if (!wt_t) return tg_cpu_op_out_of_memory(a);
        c.wt_t = wt_t;
        tg_parallel_for(a->threads, c.d.n * c.d.h, conv_bwd_data_rows, &c);
        free(wt_t);
    }
    if (c.dw) tg_parallel_for(a->threads, c.d.cin_g * c.d.k * c.d.k * c.d.c_out, conv_bwd_filter_range, &c);
    /* dbias: the column sums of dy as [n oh ow, c_out], in double in (img, i, j) order. */
    if (c.db) tg_cpu_colsum(a, c.dy, c.db, c.d.n * c.d.oh * c.d.ow, c.d.c_out, !c.overwrite);
}

/* ---- global average pooling ------------------------------------------------------------ */

/* Outputs [b, e) of the flat n * c: each run within one image sums its channels' hw values
 * in position order, in double. */
static void avg_pool_range(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const int64_t C = a->op->p.avg_pool.c, hw = a->op->p.avg_pool.hw;
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    double *s = tg_malloc(sizeof(double) * (size_t)(C > 0 ? C : 1));
    if (!s) return tg_cpu_op_out_of_memory(a);
    for (int64_t q = b; q < e;) {
        const int64_t img = q / C, c0 = q % C, n_c = min64(C, c0 + (e - q)) - c0;
        memset(s, 0, sizeof(double) * (size_t)n_c);
        for (int64_t t = 0; t < hw; t++) {
            const float *xr = x + (img * hw + t) * C + c0;
            for (int64_t k = 0; k < n_c; k++) s[k] += xr[k];
        }
        for (int64_t k = 0; k < n_c; k++) y[q + k] = (float)(s[k] / (double)hw);
        q += n_c;
    }
    free(s);
}
void tg_cpu_kernel_global_avg_pool(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.avg_pool.n * a->op->p.avg_pool.c, avg_pool_range, (void *)a);
}

/* Positions [b, e) of the n * hw: every channel's dy / hw. */
static void avg_pool_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const int64_t C = a->op->p.avg_pool.c, hw = a->op->p.avg_pool.hw;
    const float *dy = CF32(a->in[0]);
    float *dx = F32(a->out[0]);
    for (int64_t r = b; r < e; r++) {
        const float *dyr = dy + r / hw * C;
        float *dxr = dx + r * C;
        for (int64_t k = 0; k < C; k++) dxr[k] = dyr[k] / (float)hw;
    }
}
void tg_cpu_kernel_global_avg_pool_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.avg_pool.n * a->op->p.avg_pool.hw, avg_pool_bwd_rows, (void *)a);
}
