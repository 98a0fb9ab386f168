/* LAYERNORM and LAYERNORM_BWD.
 *
 * One warp per row (rows are a few KB, so the repeated passes hit L1): the row
 * statistics are accumulated in double exactly like the CPU (two passes: mean, then the
 * biased variance around it; rstd = 1/sqrt(var + eps) in double, rounded to float), and
 * the per-element expressions use non-contracting float ops in the CPU's order, so y and
 * dx match the oracle to a rounding or two. Warp sums use a fixed butterfly.
 *
 * dgamma/dbeta (+=) are column sums over rows, made deterministic with two stages
 * instead of float atomics: stage 1 gives each block a fixed tile of 32 columns x 128
 * rows and writes one double partial per (row chunk, column) to scratch; stage 2 adds
 * the partials of each column in chunk order and does the += into dgamma/dbeta. */
#include "kernels/cuda_common.cuh"

#define LN_THREADS 256     /* 8 rows (warps) per block */
#define COL_ROWS 128       /* rows per stage-1 chunk */
#define COL_TY 8           /* row lanes per stage-1 block (block = 32 x 8) */

int64_t tg_scratch_layernorm_bwd(const tg_op *op) {
    int64_t M = op->i[0], D = op->i[1];
    if (M <= 0 || D <= 0) return 0;
    return 4 * ((M + COL_ROWS - 1) / COL_ROWS) * D; /* 2 doubles per (chunk, column) */
}

template <int W>
struct ln_vec;
template <>
struct ln_vec<4> {
    static __device__ __forceinline__ void load(const float *p, int64_t i, float (&v)[4]) {
        float4 t = reinterpret_cast<const float4 *>(p)[i];
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    }
    static __device__ __forceinline__ void store(float *p, int64_t i, const float (&v)[4]) {
        reinterpret_cast<float4 *>(p)[i] = make_float4(v[0], v[1], v[2], v[3]);
    }
};
template <>
struct ln_vec<1> {
    static __device__ __forceinline__ void load(const float *p, int64_t i, float (&v)[1]) { v[0] = p[i]; }
    static __device__ __forceinline__ void store(float *p, int64_t i, const float (&v)[1]) { p[i] = v[0]; }
};

/* W = 4: D % 4 == 0 and all row pointers 16-byte aligned; the lane covers float4 k. */
template <int W>
__global__ void __launch_bounds__(LN_THREADS)
ln_fwd_kernel(const float *__restrict__ x, const float *__restrict__ gamma, const float *__restrict__ beta,
              float *__restrict__ y, float *__restrict__ mean_out, float *__restrict__ rstd_out, int64_t M, int64_t D,
              float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const int64_t DW = D / W;
    const float *xr = x + row * D;
    double s = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W];
        ln_vec<W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) s += (double)v[j];
    }
    const double mu = warp_sum_d(s) / (double)D;
    double ss = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W];
        ln_vec<W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) {
            double d = (double)v[j] - mu;
            ss = __dadd_rn(ss, __dmul_rn(d, d));
        }
    }
    ss = warp_sum_d(ss);
    const float mean = (float)mu, rstd = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    float *yr = y + row * D;
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W], g[W], b[W];
        ln_vec<W>::load(xr, k, v);
        if (gamma) ln_vec<W>::load(gamma, k, g);
        if (beta) ln_vec<W>::load(beta, k, b);
#pragma unroll
        for (int j = 0; j < W; j++)
            v[j] = fadd(fmul(fmul(fsub(v[j], mean), rstd), gamma ? g[j] : 1.0f), beta ? b[j] : 0.0f);
        ln_vec<W>::store(yr, k, v);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mean;
        if (rstd_out) rstd_out[row] = rstd;
    }
}

/* dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)), one warp per row. */
template <int W>
__global__ void __launch_bounds__(LN_THREADS)
ln_bwd_dx_kernel(const float *__restrict__ dy, const float *__restrict__ x, const float *__restrict__ gamma,
                 const float *__restrict__ mean, const float *__restrict__ rstd, float *__restrict__ dx, int64_t M,
                 int64_t D) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const int64_t DW = D / W;
    const float *dyr = dy + row * D, *xr = x + row * D;
    const float mu = mean[row], rs = rstd[row];
    double s1 = 0, s2 = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float d[W], v[W], g[W];
        ln_vec<W>::load(dyr, k, d);
        ln_vec<W>::load(xr, k, v);
        if (gamma) ln_vec<W>::load(gamma, k, g);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float dg = fmul(d[j], gamma ? g[j] : 1.0f);
            s1 += (double)dg;
            s2 += (double)fmul(dg, fmul(fsub(v[j], mu), rs));
        }
    }
    const float m1 = (float)(warp_sum_d(s1) / (double)D), m2 = (float)(warp_sum_d(s2) / (double)D);
    float *dxr = dx + row * D;
    for (int64_t k = lane; k < DW; k += 32) {
        float d[W], v[W], g[W];
        ln_vec<W>::load(dyr, k, d);
        ln_vec<W>::load(xr, k, v);
        if (gamma) ln_vec<W>::load(gamma, k, g);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float xhat = fmul(fsub(v[j], mu), rs);
            d[j] = fmul(rs, fsub(fsub(fmul(d[j], gamma ? g[j] : 1.0f), m1), fmul(xhat, m2)));
        }
        ln_vec<W>::store(dxr, k, d);
    }
}

/* Stage 1: block (32, 8) owns columns [32*bx, +32) and rows [128*by, +128); partials
 * [chunk][D] of sum dy*xhat (pg) and sum dy (pb). */
__global__ void __launch_bounds__(32 * COL_TY)
ln_bwd_cols_kernel(const float *__restrict__ dy, const float *__restrict__ x, const float *__restrict__ mean,
                   const float *__restrict__ rstd, double *__restrict__ pg, double *__restrict__ pb, int64_t M,
                   int64_t D) {
    __shared__ double sg[COL_TY][32], sb[COL_TY][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * 32 + tx;
    const int64_t r0 = (int64_t)blockIdx.y * COL_ROWS, r1 = min(r0 + COL_ROWS, M);
    double g = 0, b = 0;
    if (c < D) {
        for (int64_t r = r0 + ty; r < r1; r += COL_TY) {
            float d = dy[r * D + c];
            g += (double)fmul(d, fmul(fsub(x[r * D + c], mean[r]), rstd[r]));
            b += (double)d;
        }
    }
    sg[ty][tx] = g;
    sb[ty][tx] = b;
    __syncthreads();
    if (ty == 0 && c < D) {
        for (int k = 1; k < COL_TY; k++) g += sg[k][tx], b += sb[k][tx];
        pg[blockIdx.y * D + c] = g;
        pb[blockIdx.y * D + c] = b;
    }
}

/* Stage 2: one thread per column adds the chunk partials in order. */
__global__ void __launch_bounds__(256)
ln_bwd_cols_final(const double *__restrict__ pg, const double *__restrict__ pb, float *__restrict__ dgamma,
                  float *__restrict__ dbeta, int64_t chunks, int64_t D) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D) return;
    double g = 0, b = 0;
    for (int64_t k = 0; k < chunks; k++) g += pg[k * D + c], b += pb[k * D + c];
    if (dgamma) dgamma[c] += (float)g;
    if (dbeta) dbeta[c] += (float)b;
}

int tg_launch_layernorm(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t M = a->op->i[0], D = a->op->i[1];
    if (M <= 0 || D <= 0) return 0;
    const float *x = (const float *)a->in[0], *g = (const float *)a->in[1], *b = (const float *)a->in[2];
    float *y = (float *)a->out[0], *mu = (float *)a->out[1], *rs = (float *)a->out[2];
    const unsigned blocks = (unsigned)((M * 32 + LN_THREADS - 1) / LN_THREADS);
    const int vec = D % 4 == 0 && tg_aligned16(x) && tg_aligned16(g) && tg_aligned16(b) && tg_aligned16(y);
    if (vec)
        ln_fwd_kernel<4><<<blocks, LN_THREADS, 0, a->ctx->stream>>>(x, g, b, y, mu, rs, M, D, a->op->f[0]);
    else
        ln_fwd_kernel<1><<<blocks, LN_THREADS, 0, a->ctx->stream>>>(x, g, b, y, mu, rs, M, D, a->op->f[0]);
    return 0;
}

int tg_launch_layernorm_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t M = a->op->i[0], D = a->op->i[1];
    if (M <= 0 || D <= 0) return 0;
    const float *dy = (const float *)a->in[0], *x = (const float *)a->in[1], *g = (const float *)a->in[2];
    const float *mu = (const float *)a->in[3], *rs = (const float *)a->in[4];
    float *dx = (float *)a->out[0], *dg = (float *)a->out[1], *db = (float *)a->out[2];
    cudaStream_t st = a->ctx->stream;
    if (dx) {
        const unsigned blocks = (unsigned)((M * 32 + LN_THREADS - 1) / LN_THREADS);
        const int vec = D % 4 == 0 && tg_aligned16(dy) && tg_aligned16(x) && tg_aligned16(g) && tg_aligned16(dx);
        if (vec)
            ln_bwd_dx_kernel<4><<<blocks, LN_THREADS, 0, st>>>(dy, x, g, mu, rs, dx, M, D);
        else
            ln_bwd_dx_kernel<1><<<blocks, LN_THREADS, 0, st>>>(dy, x, g, mu, rs, dx, M, D);
    }
    if (dg || db) {
        if (tg_scratch_check(a, tg_scratch_layernorm_bwd(a->op), err)) return -1;
        const int64_t chunks = (M + COL_ROWS - 1) / COL_ROWS;
        if (chunks > 65535) return tg_fail(err, "%lld rows exceed the column-sum grid", (long long)M);
        double *pg = (double *)a->ctx->reduce_scratch, *pb = pg + chunks * D;
        ln_bwd_cols_kernel<<<dim3((unsigned)((D + 31) / 32), (unsigned)chunks), dim3(32, COL_TY), 0, st>>>(
            dy, x, mu, rs, pg, pb, M, D);
        ln_bwd_cols_final<<<(unsigned)((D + 255) / 256), 256, 0, st>>>(pg, pb, dg, db, chunks, D);
    }
    return 0;
}
