/* The convolutional image model's ops on the CPU reference (runtime/cpu/conv.c,
 * batchnorm.c, elementwise.c) on channels-last images (NHWC, plan/ops.def), each against
 * values worked by hand and against an implementation written here in double:
 *
 * - CONV2D: hand-computed outputs (a 2x2 difference kernel with a bias, a 3x3 box of stride
 *   2 with padding, a depthwise pair); random shapes (full, grouped, depthwise, pointwise,
 *   strided, unpadded) against a double convolution, the same bits on 1 and 3 threads;
 *   CONV2D_BWD's dx, dweight and dbias against central differences of the double forward,
 *   accumulating (+=) and overwriting, and each output alone; a full and a depthwise
 *   convolution of stride 2 bit for bit against the direct NHWC sums in ops.def's orders;
 * - BATCHNORM: a channel worked by hand (mean, biased variance, PyTorch's running update
 *   with the unbiased variance), eval mode with and without the running statistics;
 *   random shapes against a double forward; BATCHNORM_BWD by central differences;
 * - RELU6 at and around its kinks (NaN kept), RELU6_BWD by central differences away from
 *   them and zero at them;
 * - GLOBAL_AVG_POOL by hand and its backward by central differences. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/threadpool.h"
#include "tests/harness.h"
#include "tests/op_fixtures.h"

static int same(const float *a, const float *b, int64_t n) { return !memcmp(a, b, sizeof(float) * (size_t)n); }

/* Largest |got - want| / max(1, |want|) over n elements; +inf for NaN. */
static double worst_rel(const float *got, const double *want, int64_t n) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]) / fmax(1.0, fabs(want[i]));
        if (!(e <= w)) w = isnan(e) ? INFINITY : e;
    }
    return w;
}

static double *dalloc(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!p) abort();
    return p;
}

static double *widen(const float *x, int64_t n) {
    double *d = dalloc(n);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* ---- convolution ---------------------------------------------------------------------- */

typedef struct conv_shape {
    int64_t n, c_in, h, w, c_out, k, stride, pad, groups;
} conv_shape;

static int64_t conv_oh(const conv_shape *s) { return (s->h + 2 * s->pad - s->k) / s->stride + 1; }
static int64_t conv_ow(const conv_shape *s) { return (s->w + 2 * s->pad - s->k) / s->stride + 1; }
static int64_t conv_xs(const conv_shape *s) { return s->n * s->c_in * s->h * s->w; }
static int64_t conv_ws(const conv_shape *s) { return s->c_out * (s->c_in / s->groups) * s->k * s->k; }
static int64_t conv_ys(const conv_shape *s) { return s->n * s->c_out * conv_oh(s) * conv_ow(s); }

static void run_conv(const conv_shape *s, const float *x, const float *w, const float *b, float *y,
                     tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_CONV2D);
    op.p.conv2d = (tg_conv2d_params){s->n, s->c_in, s->h, s->w, s->c_out, s->k, s->stride, s->pad, s->groups};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x, (void *)w, (void *)b}, .out = {y}, .threads = tp};
    tg_cpu_op_run(&a);
}

static void run_conv_bwd(const conv_shape *s, int overwrite, const float *dy, const float *x, const float *w,
                         float *dx, float *dw, float *db, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_CONV2D_BWD);
    op.p.conv2d_bwd = (tg_conv2d_bwd_params){s->n,      s->c_in, s->h,     s->w,      s->c_out,
                                             s->k,      s->stride, s->pad, s->groups, overwrite};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)dy, (void *)x, (void *)w}, .out = {dx, dw, db}, .threads = tp};
    tg_cpu_op_run(&a);
}

/* Element (img, row, col, channel) of an NHWC image of `rows` x `cols` pixels, `ch` channels. */
static int64_t nhwc(int64_t img, int64_t row, int64_t col, int64_t c, int64_t rows, int64_t cols, int64_t ch) {
    return ((img * rows + row) * cols + col) * ch + c;
}

/* Weight element (o, c, u, v) of torch's [c_out, c_in / groups, k, k]. */
static int64_t wat(const conv_shape *s, int64_t o, int64_t c, int64_t u, int64_t v) {
    return ((o * (s->c_in / s->groups) + c) * s->k + u) * s->k + v;
}

/* torch.nn.functional.conv2d in double, straight from the definition, channels last. */
static void conv_ref(const conv_shape *s, const double *x, const double *w, const double *b, double *y) {
    const int64_t oh = conv_oh(s), ow = conv_ow(s), cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
    for (int64_t img = 0; img < s->n; img++)
        for (int64_t o = 0; o < s->c_out; o++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = b ? b[o] : 0.0;
                    const int64_t g = o / cout_g;
                    for (int64_t c = 0; c < cin_g; c++)
                        for (int64_t u = 0; u < s->k; u++)
                            for (int64_t v = 0; v < s->k; v++) {
                                const int64_t iy = i * s->stride - s->pad + u, ix = j * s->stride - s->pad + v;
                                if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                                acc += w[wat(s, o, c, u, v)] * x[nhwc(img, iy, ix, g * cin_g + c, s->h, s->w, s->c_in)];
                            }
                    y[nhwc(img, i, j, o, oh, ow, s->c_out)] = acc;
                }
}

/* By hand: x = 1..9 as one 3x3 image. The kernel [[1, 0], [0, -1]] gives x[i][j] - x[i+1][j+1]
 * = -4 everywhere, plus the bias 0.5; a 3x3 box of ones with stride 2 and padding 1 sums
 * the 2x2 corners (12, 16, 24, 28); a depthwise pair (groups 2) scales each channel by its
 * own 1x1 weight, the channels interleaved pixel by pixel (NHWC). */
TG_TEST(test_op_conv2d_hand_values) {
    const float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const float diff[4] = {1, 0, 0, -1}, bias = 0.5f;
    float y[4];
    const conv_shape s1 = {1, 1, 3, 3, 1, 2, 1, 0, 1};
    run_conv(&s1, x, diff, &bias, y, NULL);
    for (int i = 0; i < 4; i++) CHECK(y[i] == -3.5f, "difference kernel: y[%d] = %g, want -3.5", i, y[i]);
    const conv_shape s2 = {1, 1, 3, 3, 1, 3, 2, 1, 1};
    float box[9];
    for (int i = 0; i < 9; i++) box[i] = 1.0f;
    run_conv(&s2, x, box, NULL, y, NULL);
    const float want2[4] = {12, 16, 24, 28};
    for (int i = 0; i < 4; i++) CHECK(y[i] == want2[i], "box, stride 2, pad 1: y[%d] = %g, want %g", i, y[i], want2[i]);
    /* Two channels [1, 2 | 3, 4] of a 1x2 image, stored pixel by pixel (1, 3 | 2, 4);
     * depthwise weights 10 and -1. */
    const float x3[4] = {1, 3, 2, 4}, w3[2] = {10, -1};
    const conv_shape s3 = {1, 2, 1, 2, 2, 1, 1, 0, 2};
    run_conv(&s3, x3, w3, NULL, y, NULL);
    const float want3[4] = {10, -3, 20, -4};
    for (int i = 0; i < 4; i++) CHECK(y[i] == want3[i], "depthwise: y[%d] = %g, want %g", i, y[i], want3[i]);
}

/* Shapes of MobileNetV2's convolutions and the corners around them. */
static const conv_shape conv_shapes[] = {
    {2, 3, 7, 6, 4, 3, 2, 1, 1},  /* the stem: full 3x3, stride 2, padded */
    {2, 6, 5, 5, 6, 3, 1, 1, 6},  /* depthwise, stride 1 */
    {3, 4, 6, 7, 4, 3, 2, 1, 4},  /* depthwise, stride 2 */
    {2, 5, 4, 3, 7, 1, 1, 0, 1},  /* pointwise */
    {2, 6, 5, 4, 4, 3, 1, 1, 2},  /* grouped: 3 in and 2 out channels a group */
    {1, 2, 6, 5, 3, 3, 2, 0, 1},  /* unpadded, stride 2 over odd sizes */
    {1, 2, 4, 4, 2, 2, 3, 1, 1},  /* stride past the kernel */
};

TG_TEST(test_op_conv2d_forward) {
    for (size_t c = 0; c < sizeof conv_shapes / sizeof conv_shapes[0]; c++) {
        const conv_shape *s = &conv_shapes[c];
        const int64_t xs = conv_xs(s), ws = conv_ws(s), ys = conv_ys(s);
        float *x = frand(xs, 100 + c, -2, 2), *w = frand(ws, 200 + c, -1, 1), *b = frand(s->c_out, 300 + c, -1, 1);
        float *y = fconst(ys, NAN), *y1 = fconst(ys, NAN), *y0 = fconst(ys, NAN);
        double *xd = widen(x, xs), *wd = widen(w, ws), *bd = widen(b, s->c_out), *yd = dalloc(ys), *y0d = dalloc(ys);
        conv_ref(s, xd, wd, bd, yd);
        conv_ref(s, xd, wd, NULL, y0d);
        run_conv(s, x, w, b, y, pool3());
        run_conv(s, x, w, b, y1, NULL);
        run_conv(s, x, w, NULL, y0, pool3());
        CHECK(worst_rel(y, yd, ys) < 1e-5, "shape %zu: y vs double %g", c, worst_rel(y, yd, ys));
        CHECK(worst_rel(y0, y0d, ys) < 1e-5, "shape %zu without bias: y vs double %g", c, worst_rel(y0, y0d, ys));
        CHECK(same(y, y1, ys), "shape %zu: 1 and 3 threads differ", c);
        free(x), free(w), free(b), free(y), free(y1), free(y0), free(xd), free(wd), free(bd), free(yd), free(y0d);
    }
}

/* L = sum(r * conv(x, w, b)) of the double forward, and its central differences. */
typedef struct conv_fd {
    const conv_shape *s;
    double *x, *w, *b;
    const double *r;
} conv_fd;

static double conv_loss(const conv_fd *c) {
    const int64_t ys = conv_ys(c->s);
    double *y = dalloc(ys), l = 0;
    conv_ref(c->s, c->x, c->w, c->b, y);
    for (int64_t i = 0; i < ys; i++) l += c->r[i] * y[i];
    free(y);
    return l;
}

static double conv_fd_at(conv_fd *c, double *v) {
    const double v0 = *v, h = 1e-3;
    *v = v0 + h;
    const double lp = conv_loss(c);
    *v = v0 - h;
    const double lm = conv_loss(c);
    *v = v0;
    return (lp - lm) / (2 * h);
}

TG_TEST(test_op_conv2d_bwd_finite_differences) {
    for (size_t c = 0; c < sizeof conv_shapes / sizeof conv_shapes[0]; c++) {
        const conv_shape *s = &conv_shapes[c];
        const int64_t xs = conv_xs(s), ws = conv_ws(s), ys = conv_ys(s), co = s->c_out;
        float *x = frand(xs, 400 + c, -2, 2), *w = frand(ws, 500 + c, -1, 1), *b = frand(co, 600 + c, -1, 1);
        float *dy = frand(ys, 700 + c, -1, 1);
        double *r = widen(dy, ys), *gx = dalloc(xs), *gw = dalloc(ws), *gb = dalloc(co);
        conv_fd fd = {s, widen(x, xs), widen(w, ws), widen(b, co), r};
        for (int64_t i = 0; i < xs; i++) gx[i] = conv_fd_at(&fd, &fd.x[i]);
        for (int64_t i = 0; i < ws; i++) gw[i] = conv_fd_at(&fd, &fd.w[i]);
        for (int64_t i = 0; i < co; i++) gb[i] = conv_fd_at(&fd, &fd.b[i]);
        /* Accumulating: dweight and dbias start at 1 and gain the gradient; dx is written. */
        float *dx = fconst(xs, NAN), *dw = fconst(ws, 1.0f), *db = fconst(co, 1.0f);
        run_conv_bwd(s, 0, dy, x, w, dx, dw, db, pool3());
        double *gw1 = dalloc(ws), *gb1 = dalloc(co);
        for (int64_t i = 0; i < ws; i++) gw1[i] = gw[i] + 1.0;
        for (int64_t i = 0; i < co; i++) gb1[i] = gb[i] + 1.0;
        CHECK(worst_rel(dx, gx, xs) < 1e-5, "shape %zu: dx vs finite differences %g", c, worst_rel(dx, gx, xs));
        CHECK(worst_rel(dw, gw1, ws) < 1e-5, "shape %zu: dweight (+=) %g", c, worst_rel(dw, gw1, ws));
        CHECK(worst_rel(db, gb1, co) < 1e-5, "shape %zu: dbias (+=) %g", c, worst_rel(db, gb1, co));
        /* Overwriting, on 1 thread: the gradient itself, whatever the buffers held. */
        float *dx1 = fconst(xs, NAN), *dw1 = fconst(ws, NAN), *db1 = fconst(co, NAN);
        run_conv_bwd(s, 1, dy, x, w, dx1, dw1, db1, NULL);
        CHECK(worst_rel(dw1, gw, ws) < 1e-5 && worst_rel(db1, gb, co) < 1e-5, "shape %zu: overwrite %g %g", c,
              worst_rel(dw1, gw, ws), worst_rel(db1, gb, co));
        CHECK(same(dx, dx1, xs), "shape %zu: dx on 1 and 3 threads differs", c);
        /* Each output alone: dx without x, the weight's gradients without the weight. */
        float *dx2 = fconst(xs, NAN), *dw2 = fconst(ws, NAN), *db2 = fconst(co, NAN);
        run_conv_bwd(s, 1, dy, NULL, w, dx2, NULL, NULL, pool3());
        run_conv_bwd(s, 1, dy, x, NULL, NULL, dw2, NULL, pool3());
        run_conv_bwd(s, 1, dy, NULL, NULL, NULL, NULL, db2, pool3());
        CHECK(same(dx, dx2, xs) && same(dw1, dw2, ws) && same(db1, db2, co), "shape %zu: outputs alone differ", c);
        free(x), free(w), free(b), free(dy), free(r), free(gx), free(gw), free(gb), free(fd.x), free(fd.w), free(fd.b);
        free(dx), free(dw), free(db), free(gw1), free(gb1), free(dx1), free(dw1), free(db1), free(dx2), free(dw2);
        free(db2);
    }
}

/* The layout and the summation orders themselves: a full 3x3 convolution and a depthwise
 * one, both of stride 2 and padding 1 over odd and even sizes, against ops.def's formulas
 * written out directly on NHWC indices: y in float over (c, u, v) then the bias, dx in float
 * over (o, u, v) gathered from the outputs reading each input pixel, dweight and dbias in
 * double over (img, i, j). The kernel must give the same bits, on 1 thread and on 3. */
TG_TEST(test_op_conv2d_nhwc_direct) {
    static const conv_shape shapes[] = {
        {2, 3, 5, 6, 4, 3, 2, 1, 1}, /* full: 3 -> 4 channels */
        {2, 4, 5, 4, 4, 3, 2, 1, 4}, /* depthwise */
    };
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const conv_shape *s = &shapes[c];
        const int64_t oh = conv_oh(s), ow = conv_ow(s), cin_g = s->c_in / s->groups, cout_g = s->c_out / s->groups;
        const int64_t xs = conv_xs(s), ws = conv_ws(s), ys = conv_ys(s);
        float *x = frand(xs, 800 + c, -2, 2), *w = frand(ws, 810 + c, -1, 1), *b = frand(s->c_out, 820 + c, -1, 1);
        float *dy = frand(ys, 830 + c, -1, 1);
        float *want_y = fconst(ys, NAN), *want_dx = fconst(xs, NAN), *want_dw = fconst(ws, NAN);
        float *want_db = fconst(s->c_out, NAN);
        for (int64_t img = 0; img < s->n; img++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++)
                    for (int64_t o = 0; o < s->c_out; o++) {
                        const int64_t g = o / cout_g;
                        float acc = 0;
                        for (int64_t ci = 0; ci < cin_g; ci++)
                            for (int64_t u = 0; u < s->k; u++)
                                for (int64_t v = 0; v < s->k; v++) {
                                    const int64_t iy = i * s->stride - s->pad + u, ix = j * s->stride - s->pad + v;
                                    if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                                    acc += w[wat(s, o, ci, u, v)] * x[nhwc(img, iy, ix, g * cin_g + ci, s->h, s->w, s->c_in)];
                                }
                        want_y[nhwc(img, i, j, o, oh, ow, s->c_out)] = acc + b[o];
                    }
        for (int64_t img = 0; img < s->n; img++)
            for (int64_t yy = 0; yy < s->h; yy++)
                for (int64_t xx = 0; xx < s->w; xx++)
                    for (int64_t chan = 0; chan < s->c_in; chan++) {
                        const int64_t g = chan / cin_g, ci = chan % cin_g;
                        float acc = 0;
                        for (int64_t o = g * cout_g; o < (g + 1) * cout_g; o++)
                            for (int64_t u = 0; u < s->k; u++)
                                for (int64_t v = 0; v < s->k; v++) {
                                    const int64_t ti = yy + s->pad - u, tj = xx + s->pad - v; /* i stride, j stride */
                                    if (ti < 0 || tj < 0 || ti % s->stride || tj % s->stride) continue;
                                    const int64_t i = ti / s->stride, j = tj / s->stride;
                                    if (i >= oh || j >= ow) continue;
                                    acc += w[wat(s, o, ci, u, v)] * dy[nhwc(img, i, j, o, oh, ow, s->c_out)];
                                }
                        want_dx[nhwc(img, yy, xx, chan, s->h, s->w, s->c_in)] = acc;
                    }
        for (int64_t o = 0; o < s->c_out; o++) {
            const int64_t g = o / cout_g;
            double sb = 0;
            for (int64_t img = 0; img < s->n; img++)
                for (int64_t i = 0; i < oh; i++)
                    for (int64_t j = 0; j < ow; j++) sb += dy[nhwc(img, i, j, o, oh, ow, s->c_out)];
            want_db[o] = (float)sb;
            for (int64_t ci = 0; ci < cin_g; ci++)
                for (int64_t u = 0; u < s->k; u++)
                    for (int64_t v = 0; v < s->k; v++) {
                        double sw = 0;
                        for (int64_t img = 0; img < s->n; img++)
                            for (int64_t i = 0; i < oh; i++)
                                for (int64_t j = 0; j < ow; j++) {
                                    const int64_t iy = i * s->stride - s->pad + u, ix = j * s->stride - s->pad + v;
                                    if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                                    sw += (double)dy[nhwc(img, i, j, o, oh, ow, s->c_out)] *
                                          x[nhwc(img, iy, ix, g * cin_g + ci, s->h, s->w, s->c_in)];
                                }
                        want_dw[wat(s, o, ci, u, v)] = (float)sw;
                    }
        }
        for (int threads = 0; threads < 2; threads++) {
            tg_threadpool *tp = threads ? pool3() : NULL;
            float *y = fconst(ys, NAN), *dx = fconst(xs, NAN), *dw = fconst(ws, NAN), *db = fconst(s->c_out, NAN);
            run_conv(s, x, w, b, y, tp);
            run_conv_bwd(s, 1, dy, x, w, dx, dw, db, tp);
            CHECK(same(y, want_y, ys), "shape %zu, %s: y differs from the direct NHWC sums", c, threads ? "3 threads" : "1");
            CHECK(same(dx, want_dx, xs), "shape %zu, %s: dx differs from the direct NHWC sums", c,
                  threads ? "3 threads" : "1");
            CHECK(same(dw, want_dw, ws) && same(db, want_db, s->c_out),
                  "shape %zu, %s: dweight or dbias differs from the direct NHWC sums", c, threads ? "3 threads" : "1");
            free(y), free(dx), free(dw), free(db);
        }
        free(x), free(w), free(b), free(dy), free(want_y), free(want_dx), free(want_dw), free(want_db);
    }
}

/* ---- batch normalisation ----------------------------------------------------------------- */

static void run_bn(int64_t n, int64_t c, int64_t hw, float eps, float momentum, int training, const float *x,
                   const float *g, const float *b, float *rm, float *rv, float *y, float *stats, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_BATCHNORM);
    op.p.batchnorm = (tg_batchnorm_params){.n = n, .c = c, .hw = hw, .eps = eps, .momentum = momentum};
    tg_cpu_op_args a = {.op = &op,
                        .in = {(void *)x, (void *)g, (void *)b, rm, rv},
                        .out = {y, stats, rm, rv},
                        .threads = tp,
                        .training = training};
    tg_cpu_op_run(&a);
}

static void run_bn_bwd(int64_t n, int64_t c, int64_t hw, float eps, int overwrite, const float *dy, const float *x,
                       const float *g, const float *stats, float *dx, float *dg, float *db, tg_threadpool *tp) {
    tg_op op = tg_test_op(TG_OP_BATCHNORM_BWD);
    op.p.batchnorm_bwd = (tg_batchnorm_bwd_params){.n = n, .c = c, .hw = hw, .eps = eps, .overwrite = overwrite};
    tg_cpu_op_args a = {.op = &op,
                        .in = {(void *)dy, (void *)x, (void *)g, (void *)stats},
                        .out = {dx, dg, db},
                        .threads = tp,
                        .training = 1};
    tg_cpu_op_run(&a);
}

/* One channel of 2 images x 2 positions holding 1, 2 (image 0) and 3, 4 (image 1), and a
 * second channel of 10, 10, 10, 10 (channels last: the rows of [n hw, c] are 1 10, 2 10,
 * 3 10, 4 10): mean 2.5 and biased variance 1.25; momentum 0.1 moves the running mean
 * 0 -> 0.25 and the running variance 1 -> 0.9 + 0.1 * 5/3 (the unbiased 1.25 * 4/3). The
 * constant channel normalises to beta. */
TG_TEST(test_op_batchnorm_hand_values) {
    const float x[8] = {1, 10, 2, 10, 3, 10, 4, 10}, g[2] = {2, 1}, b[2] = {0.5f, -1};
    float rm[2] = {0, 0}, rv[2] = {1, 1}, y[8], stats[4];
    run_bn(2, 2, 2, 1e-5f, 0.1f, 1, x, g, b, rm, rv, y, stats, NULL);
    CHECK(stats[0] == 2.5f && stats[1] == 10.0f && stats[2] == 1.25f && stats[3] == 0.0f, "stats %g %g | %g %g",
          stats[0], stats[1], stats[2], stats[3]);
    const double rs = 1.0 / sqrt(1.25 + 1e-5);
    const double want[8] = {2 * -1.5 * rs + 0.5, -1, 2 * -0.5 * rs + 0.5, -1, 2 * 0.5 * rs + 0.5, -1,
                            2 * 1.5 * rs + 0.5, -1};
    CHECK(worst_rel(y, want, 8) < 1e-6, "y vs hand values: %g", worst_rel(y, want, 8));
    CHECK(fabsf(rm[0] - 0.25f) < 1e-7f && fabsf(rm[1] - 1.0f) < 1e-6f, "running mean %.9g %.9g, want 0.25 1", rm[0],
          rm[1]);
    CHECK(fabsf(rv[0] - (0.9f + 0.1f * 5.0f / 3.0f)) < 1e-6f && fabsf(rv[1] - 0.9f) < 1e-7f,
          "running variance %.9g %.9g, want %.9g 0.9", rv[0], rv[1], 0.9f + 0.1f * 5.0f / 3.0f);
    /* Eval mode: the running statistics normalise and stay as they are. */
    float rm2[2] = {1, 2}, rv2[2] = {4, 0.25f};
    run_bn(2, 2, 2, 1e-5f, 0.1f, 0, x, g, b, rm2, rv2, y, stats, NULL);
    const double r0 = 1.0 / sqrt(4 + 1e-5), r1 = 1.0 / sqrt(0.25 + 1e-5);
    const double want_eval[8] = {0.5, 8 * r1 - 1, 2 * r0 + 0.5, 8 * r1 - 1, 4 * r0 + 0.5, 8 * r1 - 1, 6 * r0 + 0.5,
                                 8 * r1 - 1};
    CHECK(worst_rel(y, want_eval, 8) < 1e-6, "eval y vs hand values: %g", worst_rel(y, want_eval, 8));
    CHECK(rm2[0] == 1 && rm2[1] == 2 && rv2[0] == 4 && rv2[1] == 0.25f, "eval changed the running statistics");
    CHECK(stats[0] == 1 && stats[1] == 2 && stats[2] == 4 && stats[3] == 0.25f, "eval stats are not the running ones");
    /* Eval without running statistics: the batch's, as in training. */
    float y_train[8], y_eval[8];
    run_bn(2, 2, 2, 1e-5f, 0.1f, 1, x, g, b, NULL, NULL, y_train, stats, NULL);
    run_bn(2, 2, 2, 1e-5f, 0.1f, 0, x, g, b, NULL, NULL, y_eval, stats, NULL);
    CHECK(same(y_train, y_eval, 8), "eval without running statistics differs from training");
    /* One element a channel: the unbiased variance is the biased one (0). */
    float one = 3, g1 = 1, b1 = 0, rm1 = 0, rv1 = 1, y1, st1[2];
    run_bn(1, 1, 1, 1e-5f, 0.5f, 1, &one, &g1, &b1, &rm1, &rv1, &y1, st1, NULL);
    CHECK(y1 == 0 && rm1 == 1.5f && rv1 == 0.5f, "one element: y %g, running %g %g", y1, rm1, rv1);
}

/* The training-mode forward in double over channels-last x [n hw, c]: y and the
 * per-channel mean and biased variance. */
static void bn_ref(int64_t n, int64_t c, int64_t hw, double eps, const double *x, const double *g, const double *b,
                   double *y, double *mean, double *var) {
    const int64_t m = n * hw;
    for (int64_t ch = 0; ch < c; ch++) {
        double s = 0, ss = 0;
        for (int64_t r = 0; r < m; r++) s += x[r * c + ch];
        const double mu = s / (double)m;
        for (int64_t r = 0; r < m; r++) ss += (x[r * c + ch] - mu) * (x[r * c + ch] - mu);
        const double v = ss / (double)m, rs = 1.0 / sqrt(v + eps);
        if (mean) mean[ch] = mu;
        if (var) var[ch] = v;
        for (int64_t r = 0; r < m; r++) y[r * c + ch] = (x[r * c + ch] - mu) * rs * g[ch] + b[ch];
    }
}

TG_TEST(test_op_batchnorm_forward) {
    const int64_t N = 3, C = 5, HW = 7, X = N * C * HW;
    float *x = frand(X, 31, -3, 2), *g = frand(C, 32, 0.5f, 1.5f), *b = frand(C, 33, -1, 1);
    float *rm = frand(C, 34, -1, 1), *rv = frand(C, 35, 0.5f, 2), *rm0 = malloc(sizeof(float) * C),
          *rv0 = malloc(sizeof(float) * C);
    if (!rm0 || !rv0) abort();
    memcpy(rm0, rm, sizeof(float) * C), memcpy(rv0, rv, sizeof(float) * C);
    float *y = fconst(X, NAN), *y1 = fconst(X, NAN), *st = fconst(2 * C, NAN), *st1 = fconst(2 * C, NAN);
    double *xd = widen(x, X), *gd = widen(g, C), *bd = widen(b, C), *yd = dalloc(X), *md = dalloc(C), *vd = dalloc(C);
    bn_ref(N, C, HW, 1e-5, xd, gd, bd, yd, md, vd);
    run_bn(N, C, HW, 1e-5f, 0.1f, 1, x, g, b, rm, rv, y, st, pool3());
    CHECK(worst_rel(y, yd, X) < 2e-6, "y vs double %g", worst_rel(y, yd, X));
    CHECK(worst_rel(st, md, C) < 1e-6 && worst_rel(st + C, vd, C) < 1e-6, "stats vs double %g %g", worst_rel(st, md, C),
          worst_rel(st + C, vd, C));
    double *rmw = dalloc(C), *rvw = dalloc(C);
    for (int64_t ch = 0; ch < C; ch++) {
        rmw[ch] = 0.9 * rm0[ch] + 0.1 * md[ch];
        rvw[ch] = 0.9 * rv0[ch] + 0.1 * vd[ch] * (double)(N * HW) / (double)(N * HW - 1);
    }
    CHECK(worst_rel(rm, rmw, C) < 1e-6 && worst_rel(rv, rvw, C) < 1e-6, "running statistics %g %g",
          worst_rel(rm, rmw, C), worst_rel(rv, rvw, C));
    float *rm1 = malloc(sizeof(float) * C), *rv1 = malloc(sizeof(float) * C);
    if (!rm1 || !rv1) abort();
    memcpy(rm1, rm0, sizeof(float) * C), memcpy(rv1, rv0, sizeof(float) * C);
    run_bn(N, C, HW, 1e-5f, 0.1f, 1, x, g, b, rm1, rv1, y1, st1, NULL);
    CHECK(same(y, y1, X) && same(st, st1, 2 * C) && same(rm, rm1, C) && same(rv, rv1, C), "1 and 3 threads differ");
    free(x), free(g), free(b), free(rm), free(rv), free(rm0), free(rv0), free(y), free(y1), free(st), free(st1);
    free(xd), free(gd), free(bd), free(yd), free(md), free(vd), free(rmw), free(rvw), free(rm1), free(rv1);
}

typedef struct bn_fd {
    int64_t n, c, hw;
    double *x, *g, *b;
    const double *r;
} bn_fd;

static double bn_loss(const bn_fd *f) {
    const int64_t X = f->n * f->c * f->hw;
    double *y = dalloc(X), l = 0;
    bn_ref(f->n, f->c, f->hw, 1e-5, f->x, f->g, f->b, y, NULL, NULL);
    for (int64_t i = 0; i < X; i++) l += f->r[i] * y[i];
    free(y);
    return l;
}

static double bn_fd_at(bn_fd *f, double *v) {
    const double v0 = *v, h = 1e-5;
    *v = v0 + h;
    const double lp = bn_loss(f);
    *v = v0 - h;
    const double lm = bn_loss(f);
    *v = v0;
    return (lp - lm) / (2 * h);
}

/* dx, dgamma and dbeta against central differences of the training forward (whose
 * statistics move with x), accumulating and overwriting. */
TG_TEST(test_op_batchnorm_bwd_finite_differences) {
    const int64_t N = 2, C = 3, HW = 5, X = N * C * HW;
    float *x = frand(X, 41, -2, 2), *g = frand(C, 42, 0.5f, 1.5f), *b = frand(C, 43, -1, 1), *dy = frand(X, 44, -1, 1);
    float *y = fconst(X, NAN), *st = fconst(2 * C, NAN);
    run_bn(N, C, HW, 1e-5f, 0.1f, 1, x, g, b, NULL, NULL, y, st, NULL);
    bn_fd f = {N, C, HW, widen(x, X), widen(g, C), widen(b, C), widen(dy, X)};
    double *gx = dalloc(X), *gg = dalloc(C), *gb = dalloc(C), *gg1 = dalloc(C), *gb1 = dalloc(C);
    for (int64_t i = 0; i < X; i++) gx[i] = bn_fd_at(&f, &f.x[i]);
    for (int64_t i = 0; i < C; i++) gg[i] = bn_fd_at(&f, &f.g[i]), gg1[i] = gg[i] - 0.5;
    for (int64_t i = 0; i < C; i++) gb[i] = bn_fd_at(&f, &f.b[i]), gb1[i] = gb[i] - 0.5;
    float *dx = fconst(X, NAN), *dg = fconst(C, -0.5f), *db = fconst(C, -0.5f);
    run_bn_bwd(N, C, HW, 1e-5f, 0, dy, x, g, st, dx, dg, db, pool3());
    CHECK(worst_rel(dx, gx, X) < 1e-4, "dx vs finite differences %g", worst_rel(dx, gx, X));
    CHECK(worst_rel(dg, gg1, C) < 1e-4 && worst_rel(db, gb1, C) < 1e-4, "dgamma, dbeta (+=) %g %g",
          worst_rel(dg, gg1, C), worst_rel(db, gb1, C));
    float *dx1 = fconst(X, NAN), *dg1 = fconst(C, NAN), *db1 = fconst(C, NAN);
    run_bn_bwd(N, C, HW, 1e-5f, 1, dy, x, g, st, dx1, dg1, db1, NULL);
    CHECK(worst_rel(dg1, gg, C) < 1e-4 && worst_rel(db1, gb, C) < 1e-4, "overwrite %g %g", worst_rel(dg1, gg, C),
          worst_rel(db1, gb, C));
    CHECK(same(dx, dx1, X), "dx on 1 and 3 threads differs");
    float *dx2 = fconst(X, NAN);
    run_bn_bwd(N, C, HW, 1e-5f, 1, dy, x, g, st, dx2, NULL, NULL, pool3());
    CHECK(same(dx, dx2, X), "dx without dgamma and dbeta differs");
    free(x), free(g), free(b), free(dy), free(y), free(st), free(f.x), free(f.g), free(f.b), free((void *)f.r);
    free(gx), free(gg), free(gb), free(gg1), free(gb1), free(dx), free(dg), free(db), free(dx1), free(dg1), free(db1);
    free(dx2);
}

/* ---- relu6 and global average pooling ------------------------------------------------------ */

static void run_unary(int kind, int64_t n, const float *x, const float *x2, float *y);

/* BATCHNORM with relu6 against BATCHNORM then RELU6, and BATCHNORM_BWD with relu6 (dy masked
 * by the fused op's output) against RELU6_BWD then BATCHNORM_BWD: bit for bit, forward and
 * backward, training and eval, on values spread across both kinks (gammas 2 to 4 and betas
 * -2 to 8 clamp between an eighth and seven eighths of the outputs). */
TG_TEST(test_op_batchnorm_relu6_fused_matches_separate) {
    enum { N = 3, C = 5, HW = 7, M = N * C * HW };
    float *x = frand(M, 41, -2.0f, 2.0f), *dy = frand(M, 42, -1.0f, 1.0f), *g = frand(C, 43, 2.0f, 4.0f),
          *b = frand(C, 44, -2.0f, 8.0f);
    x[0] = x[C] = 0.0f; /* two equal values of channel 0 */
    for (int training = 0; training < 2; training++) {
        float rm[2][C], rv[2][C], stats[2][2 * C];
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < C; c++) rm[k][c] = 0.1f * (float)c, rv[k][c] = 1.0f + 0.2f * (float)c;
        float *bn = falloc(M), *sep = falloc(M), *fused = falloc(M);
        tg_op op = tg_test_op(TG_OP_BATCHNORM);
        op.p.batchnorm = (tg_batchnorm_params){.n = N, .c = C, .hw = HW, .eps = 1e-5f, .momentum = 0.1f, .relu6 = 1};
        tg_cpu_op_args a = {.op = &op,
                            .in = {x, g, b, rm[0], rv[0]},
                            .out = {fused, stats[0], rm[0], rv[0]},
                            .threads = pool3(),
                            .training = training};
        tg_cpu_op_run(&a);
        run_bn(N, C, HW, 1e-5f, 0.1f, training, x, g, b, rm[1], rv[1], bn, stats[1], pool3());
        run_unary(TG_OP_RELU6, M, bn, NULL, sep);
        int clamped = 0;
        for (int i = 0; i < M; i++) clamped += sep[i] == 0.0f || sep[i] == 6.0f;
        CHECK(clamped > M / 8 && clamped < M - M / 8, "training %d: %d of %d outputs clamped", training, clamped, M);
        CHECK(same(fused, sep, M) && same(stats[0], stats[1], 2 * C) && same(rm[0], rm[1], C) && same(rv[0], rv[1], C),
              "training %d: the fused forward differs from BATCHNORM then RELU6", training);
        if (training) {
            float *dz = falloc(M), *dx[2] = {falloc(M), falloc(M)}, dg[2][C], db[2][C];
            run_unary(TG_OP_RELU6_BWD, M, dy, sep, dz);
            run_bn_bwd(N, C, HW, 1e-5f, 1, dz, x, g, stats[1], dx[1], dg[1], db[1], pool3());
            tg_op bop = tg_test_op(TG_OP_BATCHNORM_BWD);
            bop.p.batchnorm_bwd = (tg_batchnorm_bwd_params){.n = N, .c = C, .hw = HW, .eps = 1e-5f, .overwrite = 1, .relu6 = 1};
            tg_cpu_op_args ba = {.op = &bop,
                                 .in = {dy, x, g, stats[0], fused},
                                 .out = {dx[0], dg[0], db[0]},
                                 .threads = pool3(),
                                 .training = 1};
            tg_cpu_op_run(&ba);
            CHECK(same(dx[0], dx[1], M) && same(dg[0], dg[1], C) && same(db[0], db[1], C),
                  "the fused backward differs from RELU6_BWD then BATCHNORM_BWD");
            free(dz), free(dx[0]), free(dx[1]);
        }
        free(bn), free(sep), free(fused);
    }
    free(x), free(dy), free(g), free(b);
}

static void run_unary(int kind, int64_t n, const float *x, const float *x2, float *y) {
    tg_op op = tg_test_op(kind);
    op.p.count.n = n;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x, (void *)x2}, .out = {y}, .threads = pool3()};
    tg_cpu_op_run(&a);
}

TG_TEST(test_op_relu6_values_and_grad) {
    const float x[8] = {-2, -0.0f, 0, 0.5f, 5.999f, 6, 7.5f, NAN};
    const float want[8] = {0, 0, 0, 0.5f, 5.999f, 6, 6};
    float y[8], dx[8];
    run_unary(TG_OP_RELU6, 8, x, NULL, y);
    for (int i = 0; i < 7; i++) CHECK(y[i] == want[i], "relu6(%g) = %g, want %g", x[i], y[i], want[i]);
    CHECK(isnan(y[7]), "relu6(NaN) = %g, want NaN", y[7]);
    /* The gradient passes strictly inside (0, 6) and is 0 at the kinks, as torch's. */
    const float dy[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    run_unary(TG_OP_RELU6_BWD, 8, dy, y, dx);
    const float want_dx[8] = {0, 0, 0, 4, 5, 0, 0, 0};
    for (int i = 0; i < 8; i++) CHECK(dx[i] == want_dx[i], "relu6_bwd at %g: %g, want %g", x[i], dx[i], want_dx[i]);
    /* Away from the kinks, central differences of sum(r * relu6(x)). */
    const int64_t n = 40000;
    float *xs = frand(n, 51, -3, 9), *r = frand(n, 52, -1, 1), *ys = fconst(n, NAN), *g = fconst(n, NAN);
    run_unary(TG_OP_RELU6, n, xs, NULL, ys);
    run_unary(TG_OP_RELU6_BWD, n, r, ys, g);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double v = xs[i], h = 1e-3;
        if (fabs(v) < 2 * h || fabs(v - 6) < 2 * h) continue;
        const double up = fmin(fmax(v + h, 0), 6), dn = fmin(fmax(v - h, 0), 6);
        bad += fabs(g[i] - r[i] * (up - dn) / (2 * h)) > 1e-6;
    }
    CHECK(bad == 0, "%d gradients differ from central differences", bad);
    free(xs), free(r), free(ys), free(g);
}

static void run_pool(int kind, int64_t n, int64_t c, int64_t hw, const float *x, float *y) {
    tg_op op = tg_test_op(kind);
    op.p.avg_pool = (tg_avg_pool_params){.n = n, .c = c, .hw = hw};
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x}, .out = {y}, .threads = pool3()};
    tg_cpu_op_run(&a);
}

TG_TEST(test_op_global_avg_pool) {
    /* 2 images x 3 positions x 2 channels (channel 0 holding 1, 2, 3 and channel 1 4, 5, 6
     * in image 0; -3, 0, 0 and 0.5 thrice in image 1): the means 2, 5 | -1, 0.5. */
    const float x[12] = {1, 4, 2, 5, 3, 6, -3, 0.5f, 0, 0.5f, 0, 0.5f};
    float y[4];
    run_pool(TG_OP_GLOBAL_AVG_POOL, 2, 2, 3, x, y);
    const float want[4] = {2, 5, -1, 0.5f};
    for (int i = 0; i < 4; i++) CHECK(y[i] == want[i], "mean %d: %g, want %g", i, y[i], want[i]);
    /* The backward spreads dy / hw; the forward is linear, so central differences of
     * sum(r * pool(x)) are r / hw exactly up to rounding. */
    const int64_t N = 3, C = 4, HW = 9;
    float *xs = frand(N * C * HW, 61, -2, 2), *r = frand(N * C, 62, -1, 1), *dx = fconst(N * C * HW, NAN);
    run_pool(TG_OP_GLOBAL_AVG_POOL_BWD, N, C, HW, r, dx);
    float *yp = fconst(N * C, NAN), *ym = fconst(N * C, NAN);
    double worst = 0;
    for (int64_t i = 0; i < N * C * HW; i += 5) {
        const float v0 = xs[i], h = 0.25f;
        xs[i] = v0 + h;
        run_pool(TG_OP_GLOBAL_AVG_POOL, N, C, HW, xs, yp);
        xs[i] = v0 - h;
        run_pool(TG_OP_GLOBAL_AVG_POOL, N, C, HW, xs, ym);
        xs[i] = v0;
        double lp = 0, lm = 0;
        for (int64_t k = 0; k < N * C; k++) lp += (double)r[k] * yp[k], lm += (double)r[k] * ym[k];
        worst = fmax(worst, fabs((lp - lm) / (2 * h) - dx[i]));
    }
    CHECK(worst < 1e-5, "dx vs central differences: %g", worst);
    free(xs), free(r), free(dx), free(yp), free(ym);
}
