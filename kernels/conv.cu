/* The convolutional image model's convolution and pooling ops on channels-last images
 * (plan/ops.def): CONV2D and CONV2D_BWD for the convolutions the model builders keep as
 * convolutions (the stem's full 3x3 and the depthwise 3x3; pointwise 1x1 ones are MATMULs),
 * GLOBAL_AVG_POOL and its backward.
 *
 * Direct kernels, a thread per output element with the channel innermost, so a warp's
 * loads of x, dy and y are contiguous: the forward and dx sum their products in float in
 * the CPU's order ((c, u, v) and (o, u, v)) with non-contracting intrinsics, so they match
 * the reference bit for bit in fp32. The weight and bias gradients are sums over every
 * output position: stage 1 gives each (channel tile, chunk of positions) block a double
 * partial per weight element (8 row lanes added in lane order through shared memory),
 * stage 2 adds the chunks in chunk order, so results are reproducible run to run. */
#include "kernels/cuda_common.cuh"

/* ---- shapes ----------------------------------------------------------------------------- */

/* One convolution's sizes in index type I: int where every tensor of the op has fewer
 * than 2^31 elements (the usual case: 32-bit division is several times cheaper than
 * 64-bit, and these kernels divide per element), else int64_t. */
template <class I>
struct conv_shape {
    I n, c_in, h, w, c_out, k, stride, pad, groups;
    I oh, ow, cin_g, cout_g;
};

static conv_shape<int64_t> conv_shape_of(int64_t n, int64_t c_in, int64_t h, int64_t w, int64_t c_out, int64_t k,
                                         int64_t stride, int64_t pad, int64_t groups) {
    conv_shape<int64_t> s = {n, c_in, h, w, c_out, k, stride, pad, groups, 0, 0, 0, 0};
    s.oh = (h + 2 * pad - k) / stride + 1;
    s.ow = (w + 2 * pad - k) / stride + 1;
    s.cin_g = c_in / groups;
    s.cout_g = c_out / groups;
    return s;
}

static conv_shape<int64_t> bwd_shape(const tg_op *op) {
    const tg_conv2d_bwd_params *p = &op->p.conv2d_bwd;
    return conv_shape_of(p->n, p->c_in, p->h, p->w, p->c_out, p->k, p->stride, p->pad, p->groups);
}

/* Every tensor of the convolution has fewer than 2^31 - 2^22 elements, so every index and a
 * grid-stride loop's next index (at most TG_MAX_BLOCKS x 256 on) fit an int. */
static int conv_fits_int(const conv_shape<int64_t> &s) {
    const int64_t most = (int64_t)INT32_MAX - (1 << 22);
    return s.n * s.h * s.w * s.c_in < most && s.n * s.oh * s.ow * s.c_out < most &&
           s.c_out * s.cin_g * s.k * s.k < most;
}

static conv_shape<int> conv_shape_int(const conv_shape<int64_t> &s) {
    conv_shape<int> r = {(int)s.n,  (int)s.c_in, (int)s.h,  (int)s.w,  (int)s.c_out, (int)s.k,    (int)s.stride,
                         (int)s.pad, (int)s.groups, (int)s.oh, (int)s.ow, (int)s.cin_g, (int)s.cout_g};
    return r;
}

/* A depthwise convolution (a channel per group) whose channel rows take W-wide accesses. */
template <class T>
static int depthwise_width(const conv_shape<int64_t> &s, const void *p0, const void *p1) {
    if (s.cin_g != 1 || s.cout_g != 1) return 0;
    return s.c_in % 4 == 0 && tg_aligned(p0, 4 * sizeof(T)) && tg_aligned(p1, 4 * sizeof(T)) ? 4 : 1;
}

#define CONV_THREADS 256

/* ---- forward and dx ------------------------------------------------------------------------ */

/* y[b,i,j,o]: products in (c, u, v) order, positions outside the image skipped, bias last. */
template <class T, class I>
__global__ void __launch_bounds__(CONV_THREADS)
conv2d_fwd_kernel(const T *__restrict__ x, const T *__restrict__ wt, const float *__restrict__ bias,
                  T *__restrict__ y, conv_shape<I> s) {
    const I total = s.n * s.oh * s.ow * s.c_out, kk = s.k * s.k;
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x) {
        const I o = idx % s.c_out, pos = idx / s.c_out;
        const I j = pos % s.ow, q = pos / s.ow, i = q % s.oh, b = q / s.oh;
        const I c0 = (o / s.cout_g) * s.cin_g;
        const T *wo = wt + o * s.cin_g * kk;
        float acc = 0.0f;
        for (I c = 0; c < s.cin_g; c++)
            for (I u = 0; u < s.k; u++) {
                const I iy = i * s.stride - s.pad + u;
                if (iy < 0 || iy >= s.h) continue;
                const T *xr = x + ((b * s.h + iy) * s.w) * s.c_in + c0 + c;
                for (I v = 0; v < s.k; v++) {
                    const I ix = j * s.stride - s.pad + v;
                    if (ix < 0 || ix >= s.w) continue;
                    acc = fadd(acc, fmul(tg_ld(wo, (c * s.k + u) * s.k + v), tg_ld(xr, ix * s.c_in)));
                }
            }
        if (bias) acc = fadd(acc, bias[o]);
        tg_st(y, idx, acc);
    }
}

/* Depthwise filters staged in shared memory as [k k][C] floats (W adjacent channels' weights
 * of one tap in one access), where they fit in DW_STAGE_BYTES; else read from the weight. */
#define DW_STAGE_BYTES (48 * 1024)

template <class T, class I, bool STAGED>
static __device__ __forceinline__ void depthwise_stage(const T *__restrict__ wt, float *wsm, I C, I kk) {
    if constexpr (STAGED) {
        for (I t = threadIdx.x; t < kk * C; t += blockDim.x) {
            const I c = t % C, e = t / C;
            wsm[t] = tg_ld(wt, c * kk + e);
        }
        __syncthreads();
    }
}

/* The W weights of channels [cg W, cg W + W) at tap e. */
template <class T, class I, int W, bool STAGED>
static __device__ __forceinline__ void depthwise_taps(const T *__restrict__ wt, const float *wsm, I C, I kk, I cg, I e,
                                                      float (&wv)[W]) {
    if constexpr (STAGED && W == 4) {
        const float4 t = reinterpret_cast<const float4 *>(wsm + e * C)[cg];
        wv[0] = t.x, wv[1] = t.y, wv[2] = t.z, wv[3] = t.w;
    } else if constexpr (STAGED) {
#pragma unroll
        for (int q = 0; q < W; q++) wv[q] = wsm[e * C + cg * W + q];
    } else {
#pragma unroll
        for (int q = 0; q < W; q++) wv[q] = tg_ld(wt, (cg * W + q) * kk + e);
    }
}

/* Depthwise: a thread per W adjacent channels of one output position (W-wide loads of x and
 * stores of y); each channel's products in (u, v) order, as the general kernel's. */
template <class T, class I, int W, bool STAGED>
__global__ void __launch_bounds__(CONV_THREADS)
depthwise_fwd_kernel(const T *__restrict__ x, const T *__restrict__ wt, const float *__restrict__ bias,
                     T *__restrict__ y, conv_shape<I> s) {
    extern __shared__ float wsm[];
    const I C = s.c_out, cw = C / W, total = s.n * s.oh * s.ow * cw, kk = s.k * s.k;
    depthwise_stage<T, I, STAGED>(wt, wsm, C, kk);
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (I)gridDim.x * blockDim.x) {
        const I cg = t % cw, pos = t / cw;
        const I j = pos % s.ow, q = pos / s.ow, i = q % s.oh, b = q / s.oh;
        float acc[W];
#pragma unroll
        for (int e = 0; e < W; e++) acc[e] = 0.0f;
        for (I u = 0; u < s.k; u++) {
            const I iy = i * s.stride - s.pad + u;
            if (iy < 0 || iy >= s.h) continue;
            for (I v = 0; v < s.k; v++) {
                const I ix = j * s.stride - s.pad + v;
                if (ix < 0 || ix >= s.w) continue;
                float xv[W], wv[W];
                tg_vec<T, W>::load(x + ((b * s.h + iy) * s.w + ix) * C, cg, xv);
                depthwise_taps<T, I, W, STAGED>(wt, wsm, C, kk, cg, u * s.k + v, wv);
#pragma unroll
                for (int e = 0; e < W; e++) acc[e] = fadd(acc[e], fmul(wv[e], xv[e]));
            }
        }
        if (bias)
#pragma unroll
            for (int e = 0; e < W; e++) acc[e] = fadd(acc[e], bias[cg * W + e]);
        tg_vec<T, W>::store(y, t, acc);
    }
}

/* dx[b,y,x,ci]: w[o,c,u,v] dy[b,i,j,o] over the group's o, then (u, v), where i stride - pad
 * + u = y and j stride - pad + v = x. */
template <class T, class I>
__global__ void __launch_bounds__(CONV_THREADS)
conv2d_dx_kernel(const T *__restrict__ dy, const T *__restrict__ wt, T *__restrict__ dx, conv_shape<I> s) {
    const I total = s.n * s.h * s.w * s.c_in, kk = s.k * s.k;
    for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (I)gridDim.x * blockDim.x) {
        const I ci = idx % s.c_in, pos = idx / s.c_in;
        const I px = pos % s.w, q = pos / s.w, py = q % s.h, b = q / s.h;
        const I g = ci / s.cin_g, c = ci % s.cin_g;
        float acc = 0.0f;
        for (I oo = 0; oo < s.cout_g; oo++) {
            const I o = g * s.cout_g + oo;
            const T *wo = wt + (o * s.cin_g + c) * kk;
            for (I u = 0; u < s.k; u++) {
                const I ty = py + s.pad - u;
                if (ty < 0 || ty % s.stride) continue;
                const I i = ty / s.stride;
                if (i >= s.oh) continue;
                for (I v = 0; v < s.k; v++) {
                    const I tx = px + s.pad - v;
                    if (tx < 0 || tx % s.stride) continue;
                    const I j = tx / s.stride;
                    if (j >= s.ow) continue;
                    acc = fadd(acc, fmul(tg_ld(wo, u * s.k + v), tg_ld(dy, ((b * s.oh + i) * s.ow + j) * s.c_out + o)));
                }
            }
        }
        tg_st(dx, idx, acc);
    }
}

/* Depthwise dx: a thread per W adjacent channels of one input position, (u, v) order. */
template <class T, class I, int W, bool STAGED>
__global__ void __launch_bounds__(CONV_THREADS)
depthwise_dx_kernel(const T *__restrict__ dy, const T *__restrict__ wt, T *__restrict__ dx, conv_shape<I> s) {
    extern __shared__ float wsm[];
    const I C = s.c_in, cw = C / W, total = s.n * s.h * s.w * cw, kk = s.k * s.k;
    depthwise_stage<T, I, STAGED>(wt, wsm, C, kk);
    for (I t = (I)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (I)gridDim.x * blockDim.x) {
        const I cg = t % cw, pos = t / cw;
        const I px = pos % s.w, q = pos / s.w, py = q % s.h, b = q / s.h;
        float acc[W];
#pragma unroll
        for (int e = 0; e < W; e++) acc[e] = 0.0f;
        for (I u = 0; u < s.k; u++) {
            const I ty = py + s.pad - u;
            if (ty < 0 || ty % s.stride) continue;
            const I i = ty / s.stride;
            if (i >= s.oh) continue;
            for (I v = 0; v < s.k; v++) {
                const I tx = px + s.pad - v;
                if (tx < 0 || tx % s.stride) continue;
                const I j = tx / s.stride;
                if (j >= s.ow) continue;
                float g[W], wv[W];
                tg_vec<T, W>::load(dy + ((b * s.oh + i) * s.ow + j) * C, cg, g);
                depthwise_taps<T, I, W, STAGED>(wt, wsm, C, kk, cg, u * s.k + v, wv);
#pragma unroll
                for (int e = 0; e < W; e++) acc[e] = fadd(acc[e], fmul(wv[e], g[e]));
            }
        }
        tg_vec<T, W>::store(dx, t, acc);
    }
}

/* ---- 3x3 depthwise, row tiles ---------------------------------------------------------------
 * The depthwise convolutions of MobileNetV2 (k 3, pad 1, stride 1 or 2) as a thread per
 * W adjacent channels (16-byte accesses: 4 floats, 8 16-bit values) of DW3_XT adjacent
 * positions of one row: each loaded column of the input (forward, weight gradient) or of
 * dy (dx) serves every position of the run that reads it, so a run of 4 loads 6 (stride 1)
 * or 9 (stride 2) columns a filter row instead of 12, and the index arithmetic is paid once
 * a run. The filters sit in registers (from the staged [k k][C] copy). Each position's
 * products are still added in (u, v) order, skipping those outside the image, so the values
 * are the general kernels' bit for bit. */
#define DW3_XT 4

template <class T>
struct dw3_width {
    static constexpr int value = 16 / (int)sizeof(T);
};

/* The thread's W channels' 9 taps from the staged filters. */
template <int W>
static __device__ __forceinline__ void dw3_filters(const float *wsm, int C, int cg, float (&wr)[9][W]) {
#pragma unroll
    for (int e = 0; e < 9; e++)
#pragma unroll
        for (int q = 0; q < W; q++) wr[e][q] = wsm[e * C + cg * W + q];
}

/* One input row's columns for the run of outputs from x0: each in-image column S x0 - 1 + c
 * is loaded once (c rising), then handed to f(o, v, xv) for every output o of the run that
 * reads it through tap v (so each output meets its taps v rising). */
template <class T, int W, int S, class F>
static __device__ __forceinline__ void dw3_row_columns(const T *row, int x0, int width, int C, int cg, F &&f) {
#pragma unroll
    for (int c = 0; c < S * (DW3_XT - 1) + 3; c++) {
        const int ix = S * x0 - 1 + c;
        if (ix < 0 || ix >= width) continue;
        float xv[W];
        tg_vec<T, W>::load(row + ix * C, cg, xv);
#pragma unroll
        for (int o = 0; o < DW3_XT; o++) {
            const int v = c - S * o;
            if (v >= 0 && v <= 2) f(o, v, xv);
        }
    }
}

template <class T, int W, int S>
__global__ void __launch_bounds__(CONV_THREADS)
dw3_fwd_kernel(const T *__restrict__ x, const T *__restrict__ wt, T *__restrict__ y, conv_shape<int> s) {
    extern __shared__ float wsm[];
    const int C = s.c_out, cw = C / W, runs = (s.ow + DW3_XT - 1) / DW3_XT;
    const int total = s.n * s.oh * runs * cw;
    depthwise_stage<T, int, true>(wt, wsm, C, 9);
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const int cg = t % cw, r = t / cw, xr = r % runs, q = r / runs, i = q % s.oh, b = q / s.oh;
        const int x0 = xr * DW3_XT;
        float wr[9][W];
        dw3_filters<W>(wsm, C, cg, wr);
        float acc[DW3_XT][W];
#pragma unroll
        for (int o = 0; o < DW3_XT; o++)
#pragma unroll
            for (int e = 0; e < W; e++) acc[o][e] = 0.0f;
#pragma unroll
        for (int u = 0; u < 3; u++) {
            const int iy = i * S - 1 + u;
            if (iy < 0 || iy >= s.h) continue;
            const T *row = x + (b * s.h + iy) * s.w * C;
            dw3_row_columns<T, W, S>(row, x0, s.w, C, cg, [&](int o, int v, const float(&xv)[W]) {
#pragma unroll
                for (int e = 0; e < W; e++) acc[o][e] = fadd(acc[o][e], fmul(wr[u * 3 + v][e], xv[e]));
            });
        }
        T *yr = y + ((b * s.oh + i) * s.ow + x0) * C;
#pragma unroll
        for (int o = 0; o < DW3_XT; o++)
            if (x0 + o < s.ow) tg_vec<T, W>::store(yr + o * C, cg, acc[o]);
    }
}

/* dx at input positions x0 .. x0 + DW3_XT - 1 of row py (x0 a multiple of S): position o
 * takes dy column j = (x0 + o + 1 - v) / S where that divides; columns are loaded from the
 * highest down, so each position meets its taps v rising. */
template <class T, int W, int S>
__global__ void __launch_bounds__(CONV_THREADS)
dw3_dx_kernel(const T *__restrict__ dy, const T *__restrict__ wt, T *__restrict__ dx, conv_shape<int> s) {
    extern __shared__ float wsm[];
    static_assert(DW3_XT % S == 0, "a run starts at a multiple of the stride");
    const int C = s.c_in, cw = C / W, runs = (s.w + DW3_XT - 1) / DW3_XT;
    const int total = s.n * s.h * runs * cw;
    depthwise_stage<T, int, true>(wt, wsm, C, 9);
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const int cg = t % cw, r = t / cw, xr = r % runs, q = r / runs, py = q % s.h, b = q / s.h;
        const int x0 = xr * DW3_XT, j0 = x0 / S;
        float wr[9][W];
        dw3_filters<W>(wsm, C, cg, wr);
        float acc[DW3_XT][W];
#pragma unroll
        for (int o = 0; o < DW3_XT; o++)
#pragma unroll
            for (int e = 0; e < W; e++) acc[o][e] = 0.0f;
#pragma unroll
        for (int u = 0; u < 3; u++) {
            const int ty = py + 1 - u;
            if (ty < 0 || ty % S) continue;
            const int i = ty / S;
            if (i >= s.oh) continue;
            const T *row = dy + (b * s.oh + i) * s.ow * C;
#pragma unroll
            for (int cj = DW3_XT / S; cj >= -1; cj--) {
                const int j = j0 + cj;
                if (j < 0 || j >= s.ow) continue;
                float g[W];
                tg_vec<T, W>::load(row + j * C, cg, g);
#pragma unroll
                for (int o = 0; o < DW3_XT; o++) {
                    const int v = o + 1 - S * cj;
                    if (v < 0 || v > 2) continue;
#pragma unroll
                    for (int e = 0; e < W; e++) acc[o][e] = fadd(acc[o][e], fmul(wr[u * 3 + v][e], g[e]));
                }
            }
        }
        T *dr = dx + ((b * s.h + py) * s.w + x0) * C;
#pragma unroll
        for (int o = 0; o < DW3_XT; o++)
            if (x0 + o < s.w) tg_vec<T, W>::store(dr + o * C, cg, acc[o]);
    }
}

/* A full convolution with few input channels (the stem): a thread per W adjacent output
 * channels of one position, the filters staged in shared memory as [c_in k k][c_out]
 * floats; each output's products in (c, u, v) order, the bias last, as conv2d_fwd_kernel. */
#define FULL_STAGE_BYTES (16 * 1024)
template <class T, int W>
__global__ void __launch_bounds__(CONV_THREADS)
conv2d_fwd_vec_kernel(const T *__restrict__ x, const T *__restrict__ wt, const float *__restrict__ bias,
                      T *__restrict__ y, conv_shape<int> s) {
    extern __shared__ float fsm[];
    const int E = s.c_in * s.k * s.k, C = s.c_out, cw = C / W, total = s.n * s.oh * s.ow * cw;
    for (int t = threadIdx.x; t < E * C; t += blockDim.x) fsm[t] = tg_ld(wt, (t % C) * E + t / C);
    __syncthreads();
    for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
        const int cg = t % cw, pos = t / cw;
        const int j = pos % s.ow, q = pos / s.ow, i = q % s.oh, b = q / s.oh;
        float acc[W];
#pragma unroll
        for (int e = 0; e < W; e++) acc[e] = 0.0f;
        for (int c = 0; c < s.c_in; c++)
            for (int u = 0; u < s.k; u++) {
                const int iy = i * s.stride - s.pad + u;
                if (iy < 0 || iy >= s.h) continue;
                const T *xr = x + (b * s.h + iy) * s.w * s.c_in + c;
                for (int v = 0; v < s.k; v++) {
                    const int ix = j * s.stride - s.pad + v;
                    if (ix < 0 || ix >= s.w) continue;
                    const float xv = tg_ld(xr, ix * s.c_in);
                    const float *wf = fsm + ((c * s.k + u) * s.k + v) * C + cg * W;
#pragma unroll
                    for (int e = 0; e < W; e++) acc[e] = fadd(acc[e], fmul(wf[e], xv));
                }
            }
        if (bias)
#pragma unroll
            for (int e = 0; e < W; e++) acc[e] = fadd(acc[e], bias[cg * W + e]);
        tg_vec<T, W>::store(y, t, acc);
    }
}

/* ---- weight and bias gradients ------------------------------------------------------------ */

#define WG_TX 32   /* output channels per block */
#define WG_TY 8    /* row lanes per block */
#define WG_ELEMS 9 /* weight elements per thread (a 3x3 filter's) */
#define WG_BLOCKS 1056 /* stage-1 blocks aimed at (8 per SM of an H100) */

/* The stage-1 partition of one backward: weight elements E = cin_g k k per output channel,
 * zt = blocks over them (WG_ELEMS each; one more slot, the bias, on the first), and the
 * chunks of output positions. A function of the op alone, so the scratch formula and the
 * launch agree. */
typedef struct wgrad_grid {
    int64_t positions, elems, zt, tiles, chunks, rows; /* rows: positions per chunk */
} wgrad_grid;

static wgrad_grid wgrad_grid_of(const conv_shape<int64_t> *s) {
    wgrad_grid g;
    g.positions = s->n * s->oh * s->ow;
    g.elems = s->cin_g * s->k * s->k;
    g.zt = (g.elems + WG_ELEMS - 1) / WG_ELEMS;
    if (g.zt < 1) g.zt = 1;
    g.tiles = (s->c_out + WG_TX - 1) / WG_TX;
    int64_t chunks = (WG_BLOCKS + g.tiles * g.zt - 1) / (g.tiles * g.zt);
    const int64_t most = (g.positions + 4 * WG_TY - 1) / (4 * WG_TY); /* at least 4 rows a lane */
    if (chunks > most) chunks = most;
    if (chunks < 1) chunks = 1;
    g.rows = (g.positions + chunks - 1) / chunks;
    g.chunks = (g.positions + g.rows - 1) / g.rows;
    return g;
}

/* partial[(chunk * c_out + o) * (E + 1) + e]: e < E the weight element e = (c, u, v), E the
 * bias. A lane walks its chunk's positions (b, i, j) in steps of WG_TY, carrying j and i
 * instead of dividing at each. */
template <class T, class I>
__global__ void __launch_bounds__(WG_TX *WG_TY)
conv2d_wgrad_partial_kernel(const T *__restrict__ dy, const T *__restrict__ x, double *__restrict__ partial,
                            conv_shape<I> s, wgrad_grid gr, int want_w, int want_b) {
    __shared__ double sp[WG_TY][WG_ELEMS + 1][WG_TX];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const I o = (I)blockIdx.x * WG_TX + tx;
    const int64_t chunk = blockIdx.y;
    const I e0 = (I)blockIdx.z * WG_ELEMS;
    const int with_bias = want_b && blockIdx.z == 0;
    const I ne = want_w ? min((I)WG_ELEMS, (I)gr.elems - e0) : 0;
    double acc[WG_ELEMS + 1];
#pragma unroll
    for (int e = 0; e <= WG_ELEMS; e++) acc[e] = 0.0;
    if (o < s.c_out) {
        const I c0 = (o / s.cout_g) * s.cin_g, kk = s.k * s.k;
        /* This thread's weight elements as (row, column, channel) offsets, decoded once. */
        I eu[WG_ELEMS], ev[WG_ELEMS], ec[WG_ELEMS];
#pragma unroll
        for (int e = 0; e < WG_ELEMS; e++) {
            const I el = e0 + (e < ne ? e : 0);
            ec[e] = c0 + el / kk, eu[e] = (el / s.k) % s.k, ev[e] = el % s.k;
        }
        const I p0 = (I)(chunk * gr.rows) + ty, p1 = (I)min(gr.positions, (chunk + 1) * gr.rows);
        I j = p0 % s.ow, q = p0 / s.ow, i = q % s.oh, b = q / s.oh;
        for (I p = p0; p < p1; p += WG_TY) {
            const double g = (double)tg_ld(dy, p * s.c_out + o);
            if (with_bias) acc[WG_ELEMS] += g;
            const I y0 = i * s.stride - s.pad, x0 = j * s.stride - s.pad;
            const T *xb = x + b * s.h * s.w * s.c_in;
#pragma unroll
            for (int e = 0; e < WG_ELEMS; e++) {
                if (e >= ne) break;
                const I iy = y0 + eu[e], ix = x0 + ev[e];
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                acc[e] += g * (double)tg_ld(xb, (iy * s.w + ix) * s.c_in + ec[e]);
            }
            /* the next position, WG_TY on (WG_TY may pass several rows of a narrow map) */
            j += WG_TY;
            while (j >= s.ow) {
                j -= s.ow;
                if (++i == s.oh) i = 0, b++;
            }
        }
    }
#pragma unroll
    for (int e = 0; e <= WG_ELEMS; e++) sp[ty][e][tx] = acc[e];
    __syncthreads();
    if (ty == 0 && o < s.c_out) {
        double *dst = partial + (chunk * s.c_out + o) * (gr.elems + 1);
        for (I e = 0; e < ne; e++) {
            double t = sp[0][e][tx];
            for (int l = 1; l < WG_TY; l++) t += sp[l][e][tx];
            dst[e0 + e] = t;
        }
        if (with_bias) {
            double t = sp[0][WG_ELEMS][tx];
            for (int l = 1; l < WG_TY; l++) t += sp[l][WG_ELEMS][tx];
            dst[gr.elems] = t;
        }
    }
}

/* Depthwise weight and bias gradients (a channel per group, k <= 3): the general kernel's
 * partials, from a thread per DW_W adjacent channels (W-wide loads of dy and x) and one
 * filter row u = blockIdx.z (its k taps; the bias with row 0), so a block covers WG_TX DW_W
 * channels; the lanes' partials are added in lane order one weight element at a time
 * through shared memory. */
#define DW_W 4
template <class T, class I>
__global__ void __launch_bounds__(WG_TX *WG_TY)
depthwise_wgrad_partial_kernel(const T *__restrict__ dy, const T *__restrict__ x, double *__restrict__ partial,
                               conv_shape<I> s, wgrad_grid gr, int want_w, int want_b) {
    __shared__ double sp[WG_TY][WG_TX * DW_W];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const I C = s.c_out, cg = (I)blockIdx.x * WG_TX + tx, u = blockIdx.z;
    const int with_bias = want_b && u == 0;
    const int64_t chunk = blockIdx.y;
    double acc[4][DW_W]; /* taps v = 0 .. k - 1 of row u, then the bias */
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
        for (int q = 0; q < DW_W; q++) acc[e][q] = 0.0;
    if (cg * DW_W < C) {
        const I p0 = (I)(chunk * gr.rows) + ty, p1 = (I)min(gr.positions, (chunk + 1) * gr.rows);
        I j = p0 % s.ow, q0 = p0 / s.ow, i = q0 % s.oh, b = q0 / s.oh;
        for (I p = p0; p < p1; p += WG_TY) {
            float g[DW_W];
            tg_vec<T, DW_W>::load(dy + p * C, cg, g);
            if (with_bias)
#pragma unroll
                for (int q = 0; q < DW_W; q++) acc[3][q] += (double)g[q];
            const I iy = i * s.stride - s.pad + u, x0 = j * s.stride - s.pad;
            if (want_w && iy >= 0 && iy < s.h) {
                const T *xr = x + (b * s.h + iy) * s.w * C;
#pragma unroll
                for (int v = 0; v < 3; v++) {
                    const I ix = x0 + v;
                    if (v >= s.k || ix < 0 || ix >= s.w) continue;
                    float xv[DW_W];
                    tg_vec<T, DW_W>::load(xr + ix * C, cg, xv);
#pragma unroll
                    for (int q = 0; q < DW_W; q++) acc[v][q] += (double)g[q] * (double)xv[q];
                }
            }
            j += WG_TY;
            while (j >= s.ow) {
                j -= s.ow;
                if (++i == s.oh) i = 0, b++;
            }
        }
    }
    /* lane sums, one weight element (then the bias) at a time */
    for (int e = 0; e < 4; e++) {
        const int is_bias = e == 3;
        if ((is_bias && !with_bias) || (!is_bias && (!want_w || e >= s.k))) continue;
#pragma unroll
        for (int q = 0; q < DW_W; q++) sp[ty][tx * DW_W + q] = acc[e][q];
        __syncthreads();
        if (ty == 0 && cg * DW_W < C)
#pragma unroll
            for (int q = 0; q < DW_W; q++) {
                double t = sp[0][tx * DW_W + q];
                for (int l = 1; l < WG_TY; l++) t += sp[l][tx * DW_W + q];
                partial[(chunk * C + cg * DW_W + q) * (gr.elems + 1) + (is_bias ? gr.elems : u * s.k + e)] = t;
            }
        __syncthreads();
    }
}

/* The 3x3 depthwise weight and bias gradients from row runs (see dw3_fwd_kernel): a thread
 * per DW_W adjacent channels and one filter row u (its 3 taps; the bias with
 * row 0), lane ty of a block taking the chunk's runs (b, i, x0) ty, ty + WG_TY, ...: dy at
 * the run's DW3_XT positions, the row's input columns once each; a tap's products over the
 * run (at most DW3_XT) are added in float, then into the tap's double. The general
 * kernel's partials (chunks of `per` runs), lanes added in lane order. */
template <class T, int S>
__global__ void __launch_bounds__(WG_TX *WG_TY)
dw3_wgrad_partial_kernel(const T *__restrict__ dy, const T *__restrict__ x, double *__restrict__ partial,
                         conv_shape<int> s, int per, int want_w, int want_b) {
    __shared__ double sp[WG_TY][WG_TX * DW_W];
    /* the three filter rows of a channel tile are neighbouring blocks, so they run together
     * and read the same dy and input rows through L2 */
    const int tx = threadIdx.x, ty = threadIdx.y, u = blockIdx.x % 3;
    const int C = s.c_out, cg = blockIdx.x / 3 * WG_TX + tx, runs = (s.ow + DW3_XT - 1) / DW3_XT;
    const int with_bias = want_b && u == 0;
    const int64_t chunk = blockIdx.y;
    const int all = s.n * s.oh * runs;
    double acc[4][DW_W]; /* the row's 3 taps, then the bias */
#pragma unroll
    for (int e = 0; e < 4; e++)
#pragma unroll
        for (int q = 0; q < DW_W; q++) acc[e][q] = 0.0;
    if (cg * DW_W < C) {
        const int r1 = (int)min((int64_t)all, (chunk + 1) * per);
        for (int r = (int)(chunk * per) + ty; r < r1; r += WG_TY) {
            const int xr = r % runs, q = r / runs, i = q % s.oh, b = q / s.oh, x0 = xr * DW3_XT;
            const int n_here = min(DW3_XT, s.ow - x0);
            float g[DW3_XT][DW_W];
            const T *dyr = dy + ((b * s.oh + i) * s.ow + x0) * C;
#pragma unroll
            for (int o = 0; o < DW3_XT; o++) {
                if (o < n_here) {
                    tg_vec<T, DW_W>::load(dyr + o * C, cg, g[o]);
                } else {
#pragma unroll
                    for (int e = 0; e < DW_W; e++) g[o][e] = 0.0f;
                }
            }
            if (with_bias)
#pragma unroll
                for (int o = 0; o < DW3_XT; o++)
#pragma unroll
                    for (int e = 0; e < DW_W; e++) acc[3][e] += (double)g[o][e];
            const int iy = i * S - 1 + u;
            if (!want_w || iy < 0 || iy >= s.h) continue;
            const T *row = x + (b * s.h + iy) * s.w * C;
            float part[3][DW_W];
#pragma unroll
            for (int v = 0; v < 3; v++)
#pragma unroll
                for (int e = 0; e < DW_W; e++) part[v][e] = 0.0f;
            dw3_row_columns<T, DW_W, S>(row, x0, s.w, C, cg, [&](int o, int v, const float(&xv)[DW_W]) {
#pragma unroll
                for (int e = 0; e < DW_W; e++) part[v][e] = fadd(part[v][e], fmul(g[o][e], xv[e]));
            });
#pragma unroll
            for (int v = 0; v < 3; v++)
#pragma unroll
                for (int e = 0; e < DW_W; e++) acc[v][e] += (double)part[v][e];
        }
    }
    /* lane sums, one weight element (then the bias) at a time */
#pragma unroll
    for (int el = 0; el < 4; el++) {
        const int is_bias = el == 3;
        if ((is_bias && !with_bias) || (!is_bias && !want_w)) continue;
#pragma unroll
        for (int q = 0; q < DW_W; q++) sp[ty][tx * DW_W + q] = acc[el][q];
        __syncthreads();
        if (ty == 0 && cg * DW_W < C)
#pragma unroll
            for (int q = 0; q < DW_W; q++) {
                double t = sp[0][tx * DW_W + q];
                for (int l = 1; l < WG_TY; l++) t += sp[l][tx * DW_W + q];
                partial[(chunk * C + cg * DW_W + q) * 10 + (is_bias ? 9 : u * 3 + el)] = t;
            }
        __syncthreads();
    }
}

/* A block per WG_TX (o, e) pairs, WG_TY lanes: lane l adds chunks l, l + WG_TY, ... in
 * order, lane 0 the lane sums in lane order; into dw or db. */
__global__ void __launch_bounds__(WG_TX *WG_TY)
conv2d_wgrad_final_kernel(const double *__restrict__ partial, float *__restrict__ dw, float *__restrict__ db,
                          int64_t c_out, wgrad_grid gr, int overwrite) {
    __shared__ double sp[WG_TY][WG_TX];
    const int64_t stride = gr.elems + 1, t = (int64_t)blockIdx.x * WG_TX + threadIdx.x;
    const int ty = threadIdx.y;
    double sum = 0.0;
    if (t < c_out * stride) /* unrolled: several chunks' loads in flight, the adds in order */
#pragma unroll 8
        for (int64_t c = ty; c < gr.chunks; c += WG_TY) sum += partial[c * c_out * stride + t];
    sp[ty][threadIdx.x] = sum;
    __syncthreads();
    if (ty != 0 || t >= c_out * stride) return;
    for (int l = 1; l < WG_TY; l++) sum += sp[l][threadIdx.x];
    const int64_t o = t / stride, e = t % stride;
    float *dst = e < gr.elems ? (dw ? dw + o * gr.elems + e : NULL) : (db ? db + o : NULL);
    if (dst) tg_grad_store(dst, (float)sum, overwrite);
}

extern "C" int64_t tg_scratch_conv2d_bwd(const tg_op *op) {
    const tg_conv2d_bwd_params *p = &op->p.conv2d_bwd;
    if (p->k <= 0 || p->stride <= 0 || p->groups <= 0) return 0;
    const conv_shape<int64_t> s = bwd_shape(op);
    const wgrad_grid g = wgrad_grid_of(&s);
    return 2 * g.chunks * s.c_out * (g.elems + 1); /* doubles, as floats */
}

/* ---- launchers ------------------------------------------------------------------------------ */

/* The row-run depthwise kernels' case: a channel per group, 3 x 3, pad 1, stride 1 or 2,
 * int indices, rows of whole 16-byte vectors (also DW_W-wide: W is a multiple of it). */
template <class T>
static int dw3_fits(const conv_shape<int64_t> &s, const void *p0, const void *p1) {
    constexpr int W = dw3_width<T>::value;
    return s.cin_g == 1 && s.cout_g == 1 && s.k == 3 && s.pad == 1 && (s.stride == 1 || s.stride == 2) &&
           conv_fits_int(s) && s.c_in % W == 0 && tg_aligned(p0, 16) && tg_aligned(p1, 16);
}

/* A full convolution (groups 1) whose filters fit FULL_STAGE_BYTES and whose output rows
 * take 16-byte stores. */
template <class T>
static int full_vec_fits(const conv_shape<int64_t> &s, const void *y) {
    constexpr int W = dw3_width<T>::value;
    return s.groups == 1 && conv_fits_int(s) && s.c_out % W == 0 && tg_aligned(y, 16) &&
           s.c_in * s.k * s.k * s.c_out * (int64_t)sizeof(float) <= FULL_STAGE_BYTES;
}


/* Storage type T of a launch: every T slot agrees (tg_check_dtypes). */
template <template <class> class L>
static int by_dtype(int dtype, const tg_cuda_op_args *a, tg_err *err) {
    if (dtype == TG_BF16) return L<tg_bf16>::run(a, err);
    if (dtype == TG_F16) return L<tg_f16>::run(a, err);
    return L<float>::run(a, err);
}

template <class T, class I>
static void conv2d_forward(const tg_cuda_op_args *a, const conv_shape<int64_t> &s64, conv_shape<I> s) {
    const T *x = (const T *)a->in[0], *w = (const T *)a->in[1];
    const float *bias = (const float *)a->in[2];
    T *y = (T *)a->out[0];
    cudaStream_t st = a->ctx->stream;
    const int dw = depthwise_width<T>(s64, x, y);
    const int64_t positions = s64.n * s64.oh * s64.ow;
    const size_t stage = (size_t)(s64.k * s64.k * s64.c_out) * sizeof(float);
    const int staged = stage <= DW_STAGE_BYTES;
    constexpr int W = dw3_width<T>::value;
    const int64_t runs = s64.n * s64.oh * ((s64.ow + DW3_XT - 1) / DW3_XT) * (s64.c_out / W);
    if (dw3_fits<T>(s64, x, y) && staged) {
        if (s64.stride == 1)
            dw3_fwd_kernel<T, W, 1><<<tg_blocks(runs, CONV_THREADS), CONV_THREADS, stage, st>>>(x, w, y, conv_shape_int(s64));
        else
            dw3_fwd_kernel<T, W, 2><<<tg_blocks(runs, CONV_THREADS), CONV_THREADS, stage, st>>>(x, w, y, conv_shape_int(s64));
    } else if (full_vec_fits<T>(s64, y)) {
        const size_t fstage = (size_t)(s64.c_in * s64.k * s64.k * s64.c_out) * sizeof(float);
        conv2d_fwd_vec_kernel<T, W><<<tg_blocks(positions * s64.c_out / W, CONV_THREADS), CONV_THREADS, fstage, st>>>(
            x, w, bias, y, conv_shape_int(s64));
    } else if (dw == 4 && staged)
        depthwise_fwd_kernel<T, I, 4, true><<<tg_blocks(positions * s64.c_out / 4, CONV_THREADS), CONV_THREADS, stage, st>>>(
            x, w, bias, y, s);
    else if (dw == 4)
        depthwise_fwd_kernel<T, I, 4, false><<<tg_blocks(positions * s64.c_out / 4, CONV_THREADS), CONV_THREADS, 0, st>>>(
            x, w, bias, y, s);
    else if (dw == 1)
        depthwise_fwd_kernel<T, I, 1, false><<<tg_blocks(positions * s64.c_out, CONV_THREADS), CONV_THREADS, 0, st>>>(
            x, w, bias, y, s);
    else
        conv2d_fwd_kernel<T, I><<<tg_blocks(positions * s64.c_out, CONV_THREADS), CONV_THREADS, 0, st>>>(x, w, bias,
                                                                                                          y, s);
}

template <class T, class I>
static void conv2d_backward_data(const tg_cuda_op_args *a, const conv_shape<int64_t> &s64, conv_shape<I> s) {
    const T *dy = (const T *)a->in[0], *w = (const T *)a->in[2];
    T *dx = (T *)a->out[0];
    cudaStream_t st = a->ctx->stream;
    const int dw = depthwise_width<T>(s64, dy, dx);
    const int64_t elems = s64.n * s64.h * s64.w * s64.c_in;
    const size_t stage = (size_t)(s64.k * s64.k * s64.c_in) * sizeof(float);
    constexpr int W = dw3_width<T>::value;
    const int64_t runs = s64.n * s64.h * ((s64.w + DW3_XT - 1) / DW3_XT) * (s64.c_in / W);
    if (dw3_fits<T>(s64, dy, dx) && stage <= DW_STAGE_BYTES) {
        if (s64.stride == 1)
            dw3_dx_kernel<T, W, 1><<<tg_blocks(runs, CONV_THREADS), CONV_THREADS, stage, st>>>(dy, w, dx, conv_shape_int(s64));
        else
            dw3_dx_kernel<T, W, 2><<<tg_blocks(runs, CONV_THREADS), CONV_THREADS, stage, st>>>(dy, w, dx, conv_shape_int(s64));
    } else if (dw == 4 && stage <= DW_STAGE_BYTES)
        depthwise_dx_kernel<T, I, 4, true><<<tg_blocks(elems / 4, CONV_THREADS), CONV_THREADS, stage, st>>>(dy, w, dx, s);
    else if (dw == 4)
        depthwise_dx_kernel<T, I, 4, false><<<tg_blocks(elems / 4, CONV_THREADS), CONV_THREADS, 0, st>>>(dy, w, dx, s);
    else if (dw == 1)
        depthwise_dx_kernel<T, I, 1, false><<<tg_blocks(elems, CONV_THREADS), CONV_THREADS, 0, st>>>(dy, w, dx, s);
    else
        conv2d_dx_kernel<T, I><<<tg_blocks(elems, CONV_THREADS), CONV_THREADS, 0, st>>>(dy, w, dx, s);
}

template <class T>
struct conv2d_fwd_launch {
    static int run(const tg_cuda_op_args *a, tg_err *err) {
        const tg_conv2d_params *p = &a->op->p.conv2d;
        const conv_shape<int64_t> s = conv_shape_of(p->n, p->c_in, p->h, p->w, p->c_out, p->k, p->stride, p->pad, p->groups);
        if (s.n * s.oh * s.ow * s.c_out <= 0) return 0;
        if (conv_fits_int(s))
            conv2d_forward<T, int>(a, s, conv_shape_int(s));
        else
            conv2d_forward<T, int64_t>(a, s, s);
        (void)err;
        return 0;
    }
};

template <class T>
struct conv2d_bwd_launch {
    static int run(const tg_cuda_op_args *a, tg_err *err) {
        const conv_shape<int64_t> s = bwd_shape(a->op);
        const int small = conv_fits_int(s);
        cudaStream_t st = a->ctx->stream;
        if (a->out[0]) {
            if (!a->in[2]) return tg_fail(err, "conv2d_bwd: dx needs the weight (in2)");
            if (s.n * s.h * s.w * s.c_in > 0) {
                if (small)
                    conv2d_backward_data<T, int>(a, s, conv_shape_int(s));
                else
                    conv2d_backward_data<T, int64_t>(a, s, s);
            }
        }
        float *dw = (float *)a->out[1], *db = (float *)a->out[2];
        if (!dw && !db) return 0;
        if (dw && !a->in[1]) return tg_fail(err, "conv2d_bwd: dweight needs the forward's input (in1)");
        const wgrad_grid g = wgrad_grid_of(&s);
        if (g.positions <= 0 || s.c_out <= 0) return 0;
        if (tg_scratch_check(a, tg_scratch_conv2d_bwd(a->op), err)) return -1;
        if (g.tiles > 65535 * 1024LL || g.chunks > 65535 || g.zt > 65535)
            return tg_fail(err, "conv2d_bwd: weight-gradient grid %lld x %lld x %lld exceeds CUDA's", (long long)g.tiles,
                           (long long)g.chunks, (long long)g.zt);
        double *partial = (double *)a->ctx->reduce_scratch;
        const dim3 grid((unsigned)g.tiles, (unsigned)g.chunks, dw ? (unsigned)g.zt : 1u), block(WG_TX, WG_TY);
        const T *dy = (const T *)a->in[0], *x = (const T *)a->in[1];
        if (dw3_fits<T>(s, dy, x) && s.c_out % DW_W == 0) {
            /* chunks of `per` row runs: at most the general grid's chunks (its scratch) */
            const int64_t all = s.n * s.oh * ((s.ow + DW3_XT - 1) / DW3_XT);
            const int64_t per = (all + g.chunks - 1) / g.chunks;
            wgrad_grid g3 = g;
            g3.chunks = (all + per - 1) / per;
            const dim3 grid3((unsigned)((s.c_out / DW_W + WG_TX - 1) / WG_TX * 3), (unsigned)g3.chunks);
            if (s.stride == 1)
                dw3_wgrad_partial_kernel<T, 1><<<grid3, block, 0, st>>>(dy, x, partial, conv_shape_int(s), (int)per,
                                                                        dw != NULL, db != NULL);
            else
                dw3_wgrad_partial_kernel<T, 2><<<grid3, block, 0, st>>>(dy, x, partial, conv_shape_int(s), (int)per,
                                                                        dw != NULL, db != NULL);
            const int64_t finals = s.c_out * (g3.elems + 1);
            conv2d_wgrad_final_kernel<<<(unsigned)((finals + WG_TX - 1) / WG_TX), dim3(WG_TX, WG_TY), 0, st>>>(
                partial, dw, db, s.c_out, g3, a->op->p.conv2d_bwd.overwrite != 0);
            return 0;
        }
        if (small && s.cin_g == 1 && s.cout_g == 1 && s.k <= 3 && s.c_out % DW_W == 0 && tg_aligned(dy, DW_W * sizeof(T)) &&
            tg_aligned(x, DW_W * sizeof(T)))
            depthwise_wgrad_partial_kernel<T, int>
                <<<dim3((unsigned)((s.c_out / DW_W + WG_TX - 1) / WG_TX), (unsigned)g.chunks, (unsigned)s.k), block, 0, st>>>(
                    dy, x, partial, conv_shape_int(s), g, dw != NULL, db != NULL);
        else if (small)
            conv2d_wgrad_partial_kernel<T, int><<<grid, block, 0, st>>>(dy, x, partial, conv_shape_int(s), g, dw != NULL,
                                                                        db != NULL);
        else
            conv2d_wgrad_partial_kernel<T, int64_t><<<grid, block, 0, st>>>(dy, x, partial, s, g, dw != NULL, db != NULL);
        const int64_t finals = s.c_out * (g.elems + 1);
        conv2d_wgrad_final_kernel<<<(unsigned)((finals + WG_TX - 1) / WG_TX), dim3(WG_TX, WG_TY), 0, st>>>(
            partial, dw, db, s.c_out, g, a->op->p.conv2d_bwd.overwrite != 0);
        return 0;
    }
};

int tg_launch_conv2d(const tg_cuda_op_args *a, tg_err *err) { return by_dtype<conv2d_fwd_launch>(a->out_dtype[0], a, err); }

int tg_launch_conv2d_bwd(const tg_cuda_op_args *a, tg_err *err) {
    return by_dtype<conv2d_bwd_launch>(a->in_dtype[0], a, err);
}

/* ---- global average pooling ------------------------------------------------------------------ */

/* A thread per (b, c): the channel's hw values in double, then the mean rounded to float. */
template <class T>
__global__ void __launch_bounds__(CONV_THREADS)
avg_pool_kernel(const T *__restrict__ x, T *__restrict__ y, int64_t n, int64_t c, int64_t hw) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n * c; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = t / c, ch = t % c;
        const T *xb = x + b * hw * c + ch;
        double s = 0.0;
        for (int64_t p = 0; p < hw; p++) s += (double)tg_ld(xb, p * c);
        tg_st(y, t, (float)(s / (double)hw));
    }
}

/* dx[b, p, c] = dy[b, c] / hw (the CPU's float division). */
template <class T>
__global__ void __launch_bounds__(CONV_THREADS)
avg_pool_bwd_kernel(const T *__restrict__ dy, T *__restrict__ dx, int64_t n, int64_t c, int64_t hw) {
    const float inv_n = (float)hw;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n * hw * c;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t ch = t % c, b = t / (hw * c);
        tg_st(dx, t, __fdiv_rn(tg_ld(dy, b * c + ch), inv_n));
    }
}

template <class T>
struct avg_pool_launch {
    static int run(const tg_cuda_op_args *a, tg_err *err) {
        const tg_avg_pool_params *p = &a->op->p.avg_pool;
        if (p->n * p->c <= 0) return 0;
        avg_pool_kernel<T><<<tg_blocks(p->n * p->c, CONV_THREADS), CONV_THREADS, 0, a->ctx->stream>>>(
            (const T *)a->in[0], (T *)a->out[0], p->n, p->c, p->hw);
        (void)err;
        return 0;
    }
};

template <class T>
struct avg_pool_bwd_launch {
    static int run(const tg_cuda_op_args *a, tg_err *err) {
        const tg_avg_pool_params *p = &a->op->p.avg_pool;
        const int64_t total = p->n * p->hw * p->c;
        if (total <= 0) return 0;
        avg_pool_bwd_kernel<T><<<tg_blocks(total, CONV_THREADS), CONV_THREADS, 0, a->ctx->stream>>>(
            (const T *)a->in[0], (T *)a->out[0], p->n, p->c, p->hw);
        (void)err;
        return 0;
    }
};

int tg_launch_global_avg_pool(const tg_cuda_op_args *a, tg_err *err) {
    return by_dtype<avg_pool_launch>(a->out_dtype[0], a, err);
}

int tg_launch_global_avg_pool_bwd(const tg_cuda_op_args *a, tg_err *err) {
    return by_dtype<avg_pool_bwd_launch>(a->out_dtype[0], a, err);
}
