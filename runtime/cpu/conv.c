/* CPU reference: CONV2D and its backward, GLOBAL_AVG_POOL and its backward (NCHW images,
 * plan/ops.def). Every output element sums its terms in one fixed order whatever the
 * thread count: the forward and dx by planes in float, in the order ops.def states; the
 * weight and bias gradients by output channel, in double. */
#include <string.h>

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

/* The output columns j whose input column j * stride - pad + v lies inside [0, w): [*j0, *j1). */
static void valid_cols(const conv_dims *d, int64_t v, int64_t *j0, int64_t *j1) {
    const int64_t off = v - d->pad; /* input column = j * stride + off */
    int64_t lo = off >= 0 ? 0 : (-off + d->stride - 1) / d->stride;
    int64_t hi = d->w - off <= 0 ? 0 : (d->w - off + d->stride - 1) / d->stride;
    if (hi > d->ow) hi = d->ow;
    *j0 = lo;
    *j1 = hi > lo ? hi : lo;
}

typedef struct conv_ctx {
    conv_dims d;
    const float *x, *wt, *bias, *dy;
    float *y, *dx, *dw, *db;
    int overwrite;
} conv_ctx;

/* ---- forward ------------------------------------------------------------------------- */

/* Output planes [b, e) of the n * c_out: each accumulated in place over (c, u, v), the bias
 * added last. */
static void conv_fwd_planes(void *p, int64_t b, int64_t e) {
    const conv_ctx *c = p;
    const conv_dims *d = &c->d;
    const int64_t plane = d->oh * d->ow;
    for (int64_t q = b; q < e; q++) {
        const int64_t img = q / d->c_out, o = q % d->c_out, g = o / d->cout_g;
        float *yp = c->y + q * plane;
        memset(yp, 0, sizeof(float) * (size_t)plane);
        for (int64_t ci = 0; ci < d->cin_g; ci++) {
            const float *xp = c->x + (img * d->c_in + g * d->cin_g + ci) * d->h * d->w;
            const float *wp = c->wt + (o * d->cin_g + ci) * d->k * d->k;
            for (int64_t u = 0; u < d->k; u++)
                for (int64_t v = 0; v < d->k; v++) {
                    const float wv = wp[u * d->k + v];
                    int64_t j0, j1;
                    valid_cols(d, v, &j0, &j1);
                    for (int64_t i = 0; i < d->oh; i++) {
                        const int64_t iy = i * d->stride - d->pad + u;
                        if (iy < 0 || iy >= d->h) continue;
                        const float *xr = xp + iy * d->w;
                        float *yr = yp + i * d->ow;
                        for (int64_t j = j0; j < j1; j++) yr[j] += wv * xr[j * d->stride + v - d->pad];
                    }
                }
        }
        if (c->bias)
            for (int64_t t = 0; t < plane; t++) yp[t] += c->bias[o];
    }
}

void tg_cpu_kernel_conv2d(const tg_cpu_op_args *a) {
    const tg_conv2d_params *p = &a->op->p.conv2d;
    conv_ctx c = {.d = conv_dims_of(p->n, p->c_in, p->h, p->w, p->c_out, p->k, p->stride, p->pad, p->groups),
                  .x = CF32(a->in[0]),
                  .wt = CF32(a->in[1]),
                  .bias = CF32(a->in[2]),
                  .y = F32(a->out[0])};
    tg_parallel_for(a->threads, c.d.n * c.d.c_out, conv_fwd_planes, &c);
}

/* ---- backward ------------------------------------------------------------------------ */

/* Input-gradient planes [b, e) of the n * c_in: each accumulated in place over the group's
 * output channels o, then (u, v), then the output positions (i, j) reading it. */
static void conv_bwd_data_planes(void *p, int64_t b, int64_t e) {
    const conv_ctx *c = p;
    const conv_dims *d = &c->d;
    const int64_t plane = d->h * d->w, oplane = d->oh * d->ow;
    for (int64_t q = b; q < e; q++) {
        const int64_t img = q / d->c_in, chan = q % d->c_in, g = chan / d->cin_g, ci = chan % d->cin_g;
        float *xp = c->dx + q * plane;
        memset(xp, 0, sizeof(float) * (size_t)plane);
        for (int64_t oo = 0; oo < d->cout_g; oo++) {
            const int64_t o = g * d->cout_g + oo;
            const float *dyp = c->dy + (img * d->c_out + o) * oplane;
            const float *wp = c->wt + (o * d->cin_g + ci) * d->k * d->k;
            for (int64_t u = 0; u < d->k; u++)
                for (int64_t v = 0; v < d->k; v++) {
                    const float wv = wp[u * d->k + v];
                    int64_t j0, j1;
                    valid_cols(d, v, &j0, &j1);
                    for (int64_t i = 0; i < d->oh; i++) {
                        const int64_t iy = i * d->stride - d->pad + u;
                        if (iy < 0 || iy >= d->h) continue;
                        float *xr = xp + iy * d->w;
                        const float *dyr = dyp + i * d->ow;
                        for (int64_t j = j0; j < j1; j++) xr[j * d->stride + v - d->pad] += wv * dyr[j];
                    }
                }
        }
    }
}

/* Weight and bias gradients of output channels [b, e): each weight element's sum over
 * (img, i, j) in double. */
static void conv_bwd_filter_channels(void *p, int64_t b, int64_t e) {
    const conv_ctx *c = p;
    const conv_dims *d = &c->d;
    const int64_t oplane = d->oh * d->ow;
    for (int64_t o = b; o < e; o++) {
        const int64_t g = o / d->cout_g;
        if (c->dw)
            for (int64_t ci = 0; ci < d->cin_g; ci++)
                for (int64_t u = 0; u < d->k; u++)
                    for (int64_t v = 0; v < d->k; v++) {
                        int64_t j0, j1;
                        valid_cols(d, v, &j0, &j1);
                        double s = 0;
                        for (int64_t img = 0; img < d->n; img++) {
                            const float *xp = c->x + (img * d->c_in + g * d->cin_g + ci) * d->h * d->w;
                            const float *dyp = c->dy + (img * d->c_out + o) * oplane;
                            for (int64_t i = 0; i < d->oh; i++) {
                                const int64_t iy = i * d->stride - d->pad + u;
                                if (iy < 0 || iy >= d->h) continue;
                                const float *xr = xp + iy * d->w;
                                const float *dyr = dyp + i * d->ow;
                                for (int64_t j = j0; j < j1; j++) s += (double)dyr[j] * xr[j * d->stride + v - d->pad];
                            }
                        }
                        float *dwv = c->dw + ((o * d->cin_g + ci) * d->k + u) * d->k + v;
                        *dwv = (c->overwrite ? 0.0f : *dwv) + (float)s;
                    }
        if (c->db) {
            double s = 0;
            for (int64_t img = 0; img < d->n; img++) {
                const float *dyp = c->dy + (img * d->c_out + o) * oplane;
                for (int64_t t = 0; t < oplane; t++) s += dyp[t];
            }
            c->db[o] = (c->overwrite ? 0.0f : c->db[o]) + (float)s;
        }
    }
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
                  .overwrite = p->overwrite != 0};
    if (c.dx) tg_parallel_for(a->threads, c.d.n * c.d.c_in, conv_bwd_data_planes, &c);
    if (c.dw || c.db) tg_parallel_for(a->threads, c.d.c_out, conv_bwd_filter_channels, &c);
}

/* ---- global average pooling ------------------------------------------------------------ */

static void avg_pool_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const int64_t hw = a->op->p.avg_pool.hw;
    const float *x = CF32(a->in[0]);
    float *y = F32(a->out[0]);
    for (int64_t r = b; r < e; r++) {
        double s = 0;
        for (int64_t t = 0; t < hw; t++) s += x[r * hw + t];
        y[r] = (float)(s / (double)hw);
    }
}
void tg_cpu_kernel_global_avg_pool(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.avg_pool.n * a->op->p.avg_pool.c, avg_pool_rows, (void *)a);
}

static void avg_pool_bwd_rows(void *p, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = p;
    const int64_t hw = a->op->p.avg_pool.hw;
    const float *dy = CF32(a->in[0]);
    float *dx = F32(a->out[0]);
    for (int64_t r = b; r < e; r++) {
        const float v = dy[r] / (float)hw;
        for (int64_t t = 0; t < hw; t++) dx[r * hw + t] = v;
    }
}
void tg_cpu_kernel_global_avg_pool_bwd(const tg_cpu_op_args *a) {
    tg_parallel_for(a->threads, a->op->p.avg_pool.n * a->op->p.avg_pool.c, avg_pool_bwd_rows, (void *)a);
}
