/* LAYERNORM, LAYERNORM_BWD, RESIDUAL_LAYERNORM and RESIDUAL_LAYERNORM_BWD.
 *
 * One warp per row (rows are a few KB, so the repeated passes hit L1): the row
 * statistics are accumulated in double exactly like the CPU (two passes: mean, then the
 * biased variance around it; rstd = 1/sqrt(var + eps) in double, rounded to float), and
 * the per-element expressions use non-contracting float ops in the CPU's order, so y and
 * dx match the oracle to a rounding or two. Warp sums use a fixed butterfly.
 *
 * dgamma/dbeta (+=, or = when overwrite says the op is their first writer) are column sums over rows, made deterministic with two stages
 * instead of float atomics (the scheme of BIAS_GRAD): stage 1 gives each 256-thread
 * block a fixed stripe of 64 columns x 128 rows, read as coalesced 16-byte vectors,
 * accumulated per thread in double, combined across the block's row groups in a fixed
 * order, and writes one double partial per (row chunk, column) to scratch; stage 2 adds
 * the partials of each column in a fixed order and does the += into dgamma/dbeta.
 *
 * The residual ops are the same row kernels with the hidden dropout and the residual add
 * folded in (one warp per row, one kernel per direction for the rows): the forward forms
 * s = dropout(x) + r as it reads x and r, stores it, and normalises the stored values (the
 * lane re-reads only the vectors it wrote, so the repeated passes stay in L1); the backward
 * forms ds = LayerNorm backward + ds_extra, stores it, and stores dx = its dropout. The
 * mask is the DROPOUT kernel's: dropout's 16-bit draws (kernels/philox.h) for elements e of the
 * flat [M, D] index, and the kept value fmul(v, 1 / (1 - p)). dgamma/dbeta run the two
 * column stages below over dy and s.
 *
 * Where D % 8 (bf16; fp32: 4) == 0, D <= FC_MAX_D and the rows are 16-byte aligned, the
 * backward sums dgamma/dbeta inside the row kernel instead (fc_bwd_kernel: a fixed grid,
 * per-warp column sums in shared memory, one float partial per block), so dy and the
 * normalised input are read once; the column kernels remain for the other shapes.
 *
 * x, y, dy and dx are T (float, or bf16 / half in bf16 / fp16 plans: widened on load, rounded on
 * store; LAYERNORM uses 8-byte accesses of 4 bf16, LAYERNORM_BWD and the residual ops
 * 16-byte accesses of 8 when D % 8 == 0); gamma, beta, mean, rstd, dgamma, dbeta are
 * always fp32. */
#include "kernels/column_sums.cuh"
#include "kernels/philox.h"

#define LN_THREADS 256     /* 8 rows (warps) per block */
#define FC_GRID 512        /* blocks of the fused-column backward: at most this many partials */
#define FC_MAX_D 2048      /* its widest row: 2 * 8 * D floats of shared memory */

int64_t tg_scratch_layernorm_bwd(int64_t M, int64_t D) {
    if (M <= 0 || D <= 0) return 0;
    const int64_t cols = 4 * ((M + COL_ROWS - 1) / COL_ROWS) * D; /* 2 doubles per (chunk, column) */
    const int64_t groups = (M + LN_THREADS / 32 - 1) / (LN_THREADS / 32), blocks = groups < FC_GRID ? groups : FC_GRID;
    const int64_t rows = 2 * blocks * D; /* the fused-column backward: 2 floats per (block, column) */
    return cols > rows ? cols : rows;
}

/* W = 4: D % 4 == 0 and all row pointers aligned to 4 elements; the lane covers
 * elements [4k, 4k+4). x and y are T (float or bf16), gamma/beta/mean/rstd fp32. */
/* W fp32 elements at vector index k (elements [k*W, k*W + W)): tg_vec's float accesses,
 * and for W = 8 two float4s (gamma in the bf16 dx kernel's 16-byte path). */
template <int W>
static __device__ __forceinline__ void ln_ldf(const float *p, int64_t k, float (&v)[W]) {
    tg_vec<float, W>::load(p, k, v);
}
template <>
__device__ __forceinline__ void ln_ldf<8>(const float *p, int64_t k, float (&v)[8]) {
    const float4 a = reinterpret_cast<const float4 *>(p)[2 * k], b = reinterpret_cast<const float4 *>(p)[2 * k + 1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

/* The rest of a LayerNorm forward row once its mean is known: the biased variance around
 * it in double (the CPU's order), then y = (v - mean) * rstd * gamma + beta from the row
 * xr (which this lane may just have written), and the row's mean and rstd. */
template <int W, class T>
__device__ __forceinline__ void ln_fwd_finish_row(const T *xr, double mu, const float *gamma, const float *beta, T *yr,
                                                  float *mean_out, float *rstd_out, int64_t row, int64_t D, float eps,
                                                  int lane) {
    const int64_t DW = D / W;
    double ss = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W];
        tg_vec<T, W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) {
            double d = (double)v[j] - mu;
            ss = __dadd_rn(ss, __dmul_rn(d, d));
        }
    }
    ss = warp_sum_d(ss);
    const float mean = (float)mu, rstd = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W], g[W], b[W];
        tg_vec<T, W>::load(xr, k, v);
        if (gamma) ln_ldf<W>(gamma, k, g);
        if (beta) ln_ldf<W>(beta, k, b);
#pragma unroll
        for (int j = 0; j < W; j++)
            v[j] = fadd(fmul(fmul(fsub(v[j], mean), rstd), gamma ? g[j] : 1.0f), beta ? b[j] : 0.0f);
        tg_vec<T, W>::store(yr, k, v);
    }
    if (lane == 0) {
        if (mean_out) mean_out[row] = mean;
        if (rstd_out) rstd_out[row] = rstd;
    }
}

template <int W, class T>
__global__ void __launch_bounds__(LN_THREADS)
ln_fwd_kernel(const T *__restrict__ x, const float *__restrict__ gamma, const float *__restrict__ beta,
              T *__restrict__ y, float *__restrict__ mean_out, float *__restrict__ rstd_out, int64_t M, int64_t D,
              float eps) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const int64_t DW = D / W;
    const T *xr = x + row * D;
    double s = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W];
        tg_vec<T, W>::load(xr, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) s += (double)v[j];
    }
    ln_fwd_finish_row<W, T>(xr, warp_sum_d(s) / (double)D, gamma, beta, y + row * D, mean_out, rstd_out, row, D,
                            eps, lane);
}

/* The two row means of the LayerNorm backward, mean(dy*g) and mean(dy*g*xhat), summed by
 * the warp in double in the CPU's order (both backward row kernels). */
template <int W, class T>
__device__ __forceinline__ void ln_bwd_row_means(const T *dyr, const T *xr, const float *gamma, float mu, float rs,
                                                 int64_t D, int lane, float &m1, float &m2) {
    double s1 = 0, s2 = 0;
    for (int64_t k = lane; k < D / W; k += 32) {
        float d[W], v[W], g[W];
        tg_vec<T, W>::load(dyr, k, d);
        tg_vec<T, W>::load(xr, k, v);
        if (gamma) ln_ldf<W>(gamma, k, g);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float dg = fmul(d[j], gamma ? g[j] : 1.0f);
            s1 += (double)dg;
            s2 += (double)fmul(dg, fmul(fsub(v[j], mu), rs));
        }
    }
    m1 = (float)(warp_sum_d(s1) / (double)D), m2 = (float)(warp_sum_d(s2) / (double)D);
}

/* dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)), one warp per row. W = 8
 * (bf16 only: 16-byte accesses) needs D % 8 == 0 and 16-byte aligned dy, x, dx, gamma. */
template <int W, class T>
__global__ void __launch_bounds__(LN_THREADS)
ln_bwd_dx_kernel(const T *__restrict__ dy, const T *__restrict__ x, const float *__restrict__ gamma,
                 const float *__restrict__ mean, const float *__restrict__ rstd, T *__restrict__ dx, int64_t M,
                 int64_t D) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const int64_t DW = D / W;
    const T *dyr = dy + row * D, *xr = x + row * D;
    const float mu = mean[row], rs = rstd[row];
    float m1, m2;
    ln_bwd_row_means<W, T>(dyr, xr, gamma, mu, rs, D, lane, m1, m2);
    T *dxr = dx + row * D;
    for (int64_t k = lane; k < DW; k += 32) {
        float d[W], v[W], g[W];
        tg_vec<T, W>::load(dyr, k, d);
        tg_vec<T, W>::load(xr, k, v);
        if (gamma) ln_ldf<W>(gamma, k, g);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float xhat = fmul(fsub(v[j], mu), rs);
            d[j] = fmul(rs, fsub(fsub(fmul(d[j], gamma ? g[j] : 1.0f), m1), fmul(xhat, m2)));
        }
        tg_vec<T, W>::store(dxr, k, d);
    }
}

/* Stage 1 (BIAS_GRAD's striped scheme, kernels/optimizer.cu): a 256-thread block owns
 * the columns [64*bx, +64) and the rows [128*by, +128). A stripe row is VPR = 64/W
 * vectors of W elements (bf16: 8 x 16 bytes, one 128-byte line), so thread t reads
 * vector t % VPR of rows r0 + t / VPR, + RG, ... (RG = 256 / VPR row groups) of dy and
 * x, and adds dy*xhat and dy into its own doubles; the row-group partials of each column
 * are added in row-group order from shared memory and written as partials
 * [chunk][D] of sum dy*xhat (pg) and sum dy (pb). W > 1 needs D % W == 0 and dy, x
 * aligned to the access. */
template <class T, int W>
__global__ void __launch_bounds__(COL_THREADS)
ln_bwd_cols_kernel(const T *__restrict__ dy, const T *__restrict__ x, const float *__restrict__ mean,
                   const float *__restrict__ rstd, double *__restrict__ pg, double *__restrict__ pb, int64_t M,
                   int64_t D) {
    constexpr int VPR = COL_STRIPE / W, RG = COL_THREADS / VPR;
    static_assert(COL_STRIPE % W == 0 && COL_THREADS % VPR == 0 && COL_ROWS % RG == 0, "stripe shape");
    __shared__ double sg[RG][COL_STRIPE], sb[RG][COL_STRIPE];
    const int vx = threadIdx.x % VPR, ry = threadIdx.x / VPR;
    const int64_t c0 = (int64_t)blockIdx.x * COL_STRIPE + vx * W;
    const int64_t r0 = (int64_t)blockIdx.y * COL_ROWS, r1 = min(r0 + COL_ROWS, M);
    double g[W], b[W];
#pragma unroll
    for (int j = 0; j < W; j++) g[j] = 0.0, b[j] = 0.0;
    if (c0 < D) {
#pragma unroll 2
        for (int64_t r = r0 + ry; r < r1; r += RG) {
            float d[W], v[W];
            tg_vec<T, W>::load(dy + r * D, c0 / W, d);
            tg_vec<T, W>::load(x + r * D, c0 / W, v);
            const float mu = mean[r], rs = rstd[r];
#pragma unroll
            for (int j = 0; j < W; j++) {
                g[j] += (double)fmul(d[j], fmul(fsub(v[j], mu), rs));
                b[j] += (double)d[j];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < W; j++) sg[ry][vx * W + j] = g[j], sb[ry][vx * W + j] = b[j];
    __syncthreads();
    if (threadIdx.x < COL_STRIPE) {
        const int64_t c = (int64_t)blockIdx.x * COL_STRIPE + threadIdx.x;
        if (c < D) {
            double tg = sg[0][threadIdx.x], tb = sb[0][threadIdx.x];
#pragma unroll
            for (int k = 1; k < RG; k++) tg += sg[k][threadIdx.x], tb += sb[k][threadIdx.x];
            pg[(int64_t)blockIdx.y * D + c] = tg;
            pb[(int64_t)blockIdx.y * D + c] = tb;
        }
    }
}

/* The 16-byte width for T: 8 for the 16-bit types; float never takes that branch (its
 * float4 path is W = 4), so its W is 4 to avoid instantiating a float x 8 access. */
template <class T>
struct LN_W8 {
    static constexpr int W = sizeof(T) == 2 ? 8 : 4;
};

/* ---- residual layernorm ---------------------------------------------------------------- */

/* The residual ops normalise s, and form dx from ds, as stored (tg_stored; the CPU
 * reference does the same), so the backward sees the s the forward normalised. */
/* The dropout draws of elements [e, e + W) of the flat [M, D] index (kernels/philox.h,
 * dropout's draws): a Philox block per 8 elements when W is a multiple of 8 (then e is
 * too), half of one per 4 when W is 4 (e a multiple of 4), else one element at a time.
 * The same values as the DROPOUT kernel's for those elements. */
template <int W>
static __device__ __forceinline__ void rln_draws(uint64_t seed, uint64_t step, uint32_t key, uint64_t e,
                                                 float (&u)[W]) {
    if constexpr (W % 8 == 0) {
#pragma unroll
        for (int b = 0; b < W / 8; b++) {
            uint32_t w[4];
            tg_philox_block(seed, step, key, (e >> 3) + (uint64_t)b, w);
#pragma unroll
            for (int j = 0; j < 8; j++) u[8 * b + j] = (float)tg_dropout_bits16(w, (uint64_t)j) * (1.0f / 65536.0f);
        }
    } else if constexpr (W == 4) {
        tg_dropout_uniform4(seed, step, key, e >> 2, u);
    } else {
#pragma unroll
        for (int j = 0; j < W; j++) u[j] = tg_dropout_uniform(seed, step, key, e + (uint64_t)j);
    }
}

/* The dropout's parameters for one launch: on in training with p > 0; the step is read on
 * the device so a captured graph sees each replay's counter (as the DROPOUT kernel). */
struct rln_dropout {
    int on;
    uint64_t seed;
    uint32_t key;
    float p, scale;
};

/* v = dropout(v) for elements [e, e + W) of the flat [M, D] index: the DROPOUT kernel's
 * mask and kept value fmul(v, 1 / (1 - p)). */
template <int W>
static __device__ __forceinline__ void rln_apply(const rln_dropout &drop, uint64_t step, uint64_t e, float (&v)[W]) {
    float u[W];
    rln_draws<W>(drop.seed, step, drop.key, e, u);
#pragma unroll
    for (int j = 0; j < W; j++) v[j] = u[j] >= drop.p ? fmul(v[j], drop.scale) : 0.0f;
}

/* s = dropout(x) + r (stored, then read back as stored), y = LayerNorm(s); one warp per
 * row. W = 8 (bf16 only) needs D % 8 == 0 and 16-byte aligned x, r, y, s, gamma, beta;
 * W = 4 needs D % 4 == 0 and x, r, y, s aligned to 4 elements, gamma/beta to 16 bytes. */
template <int W, class T>
__global__ void __launch_bounds__(LN_THREADS)
rln_fwd_kernel(const T *__restrict__ x, const T *__restrict__ r, const float *__restrict__ gamma,
               const float *__restrict__ beta, const float *__restrict__ step_ptr, T *__restrict__ y, T *s,
               float *__restrict__ mean_out, float *__restrict__ rstd_out, int64_t M, int64_t D, float eps,
               rln_dropout drop) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const uint64_t step = drop.on ? tg_dropout_step(step_ptr) : 0;
    const int64_t DW = D / W;
    const T *xr = x + row * D, *rr = r + row * D;
    T *sr = s + row * D;
    double sum = 0;
    for (int64_t k = lane; k < DW; k += 32) {
        float v[W], res[W];
        tg_vec<T, W>::load(xr, k, v);
        tg_vec<T, W>::load(rr, k, res);
        if (drop.on) rln_apply<W>(drop, step, (uint64_t)(row * D + k * W), v);
#pragma unroll
        for (int j = 0; j < W; j++) {
            v[j] = tg_stored<T>::of(fadd(v[j], res[j]));
            sum += (double)v[j];
        }
        tg_vec<T, W>::store(sr, k, v);
    }
    /* The rest reads back this lane's own stores of s. */
    ln_fwd_finish_row<W, T>(sr, warp_sum_d(sum) / (double)D, gamma, beta, y + row * D, mean_out, rstd_out, row, D,
                            eps, lane);
}

/* ds = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)) (+ ds_extra), stored; dx = the
 * dropout of ds as stored. One warp per row; W as the forward (ds_extra, when present,
 * aligned like dy). */
template <int W, class T>
__global__ void __launch_bounds__(LN_THREADS)
rln_bwd_kernel(const T *__restrict__ dy, const T *__restrict__ s, const float *__restrict__ gamma,
               const float *__restrict__ mean, const float *__restrict__ rstd, const T *__restrict__ extra,
               const float *__restrict__ step_ptr, T *__restrict__ ds, T *__restrict__ dx, int64_t M, int64_t D,
               rln_dropout drop) {
    const int lane = threadIdx.x & 31;
    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (row >= M) return;
    const uint64_t step = drop.on ? tg_dropout_step(step_ptr) : 0;
    const int64_t DW = D / W;
    const T *dyr = dy + row * D, *sr = s + row * D;
    const float mu = mean[row], rs = rstd[row];
    float m1, m2;
    ln_bwd_row_means<W, T>(dyr, sr, gamma, mu, rs, D, lane, m1, m2);
    const T *er = extra ? extra + row * D : NULL;
    T *dsr = ds + row * D, *dxr = dx + row * D;
    for (int64_t k = lane; k < DW; k += 32) {
        float d[W], v[W], g[W], e[W];
        tg_vec<T, W>::load(dyr, k, d);
        tg_vec<T, W>::load(sr, k, v);
        if (gamma) ln_ldf<W>(gamma, k, g);
        if (er) tg_vec<T, W>::load(er, k, e);
#pragma unroll
        for (int j = 0; j < W; j++) {
            float xhat = fmul(fsub(v[j], mu), rs);
            float t = fmul(rs, fsub(fsub(fmul(d[j], gamma ? g[j] : 1.0f), m1), fmul(xhat, m2)));
            d[j] = tg_stored<T>::of(er ? fadd(t, e[j]) : t);
        }
        tg_vec<T, W>::store(dsr, k, d);
        if (drop.on) rln_apply<W>(drop, step, (uint64_t)(row * D + k * W), d);
        tg_vec<T, W>::store(dxr, k, d);
    }
}

/* key and p from the caller: the forward's and the backward's parameter sets both hold them. */
static rln_dropout rln_dropout_of(const tg_cuda_op_args *a, int64_t key, float p) {
    rln_dropout d;
    d.on = a->training && p > 0.0f;
    d.seed = a->ctx->seed;
    d.key = (uint32_t)key;
    d.p = p;
    d.scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; /* the CPU's expression */
    return d;
}

/* ---- backward with fused column sums ------------------------------------------------ */

/* W floats at vector index k of a shared row, as float4s (W = 4 or 8). */
template <int W>
static __device__ __forceinline__ void fc_ld(const float *p, int64_t k, float (&v)[W]) {
#pragma unroll
    for (int q = 0; q < W / 4; q++) {
        const float4 t = reinterpret_cast<const float4 *>(p)[k * (W / 4) + q];
        v[4 * q] = t.x, v[4 * q + 1] = t.y, v[4 * q + 2] = t.z, v[4 * q + 3] = t.w;
    }
}
template <int W>
static __device__ __forceinline__ void fc_st(float *p, int64_t k, const float (&v)[W]) {
#pragma unroll
    for (int q = 0; q < W / 4; q++)
        reinterpret_cast<float4 *>(p)[k * (W / 4) + q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

/* The row kernels' backward (one warp per row, the second pass re-reading its row from
 * L1) over a fixed grid of FC_GRID blocks of 8 warps: block b takes the row groups
 * b, b + FC_GRID, ... of 8 rows (one per warp), so there are at most FC_GRID partials
 * whatever M is, and a fixed grid keeps the sums independent of the GPU. Each warp adds
 * its rows' dy*xhat and dy, in row order, into its own smem rows sg[warp][D] and
 * sb[warp][D] (float; 2 * 8 * D floats), and the block writes their sums, added in warp
 * order, as partials pg/pb[b][D]; fc_final adds those in block order in double and does
 * the += into dgamma/dbeta. dy and the normalised input are read once (the column kernel
 * read them again).
 *
 * o = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)) (+ extra) is stored, as stored,
 * to ds when set and, through the dropout, to dx when set (no dropout unless drop.on):
 * the plain LAYERNORM_BWD passes its dx as ds. W: the 16-byte access of T, with D % W ==
 * 0 and every pointer 16-byte aligned. */
template <int W, class T>
__global__ void __launch_bounds__(LN_THREADS, 4) /* 4 blocks per SM: the whole grid in one wave on an H100 */
fc_bwd_kernel(const T *__restrict__ dy, const T *__restrict__ x, const float *__restrict__ gamma,
              const float *__restrict__ mean, const float *__restrict__ rstd, const T *__restrict__ extra,
              const float *__restrict__ step_ptr, T *__restrict__ ds, T *__restrict__ dx, float *__restrict__ pg,
              float *__restrict__ pb, int64_t M, int64_t D, rln_dropout drop) {
    extern __shared__ float fc_smem[];
    constexpr int WARPS = LN_THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t DW = D / W;
    const uint64_t step = drop.on ? tg_dropout_step(step_ptr) : 0;
    float *sg = fc_smem + (int64_t)warp * D, *sb = fc_smem + (int64_t)(WARPS + warp) * D;
    for (int64_t k = lane; k < DW; k += 32) {
        const float z[W] = {};
        fc_st<W>(sg, k, z);
        fc_st<W>(sb, k, z);
    }
    for (int64_t group = blockIdx.x; group * WARPS < M; group += gridDim.x) {
        const int64_t row = group * WARPS + warp;
        if (row >= M) break;
        const T *dyr = dy + row * D, *xr = x + row * D;
        const float mu = mean[row], rs = rstd[row];
        float m1, m2;
        ln_bwd_row_means<W, T>(dyr, xr, gamma, mu, rs, D, lane, m1, m2);
        for (int64_t k = lane; k < DW; k += 32) {
            float d[W], v[W], g[W], e[W], o[W], ag[W], ab[W];
            tg_vec<T, W>::load(dyr, k, d);
            tg_vec<T, W>::load(xr, k, v);
            if (gamma) ln_ldf<W>(gamma, k, g);
            if (extra) tg_vec<T, W>::load(extra + row * D, k, e);
            fc_ld<W>(sg, k, ag);
            fc_ld<W>(sb, k, ab);
#pragma unroll
            for (int j = 0; j < W; j++) {
                const float xhat = fmul(fsub(v[j], mu), rs);
                const float t = fmul(rs, fsub(fsub(fmul(d[j], gamma ? g[j] : 1.0f), m1), fmul(xhat, m2)));
                o[j] = tg_stored<T>::of(extra ? fadd(t, e[j]) : t);
                ag[j] = fadd(ag[j], fmul(d[j], xhat));
                ab[j] = fadd(ab[j], d[j]);
            }
            fc_st<W>(sg, k, ag);
            fc_st<W>(sb, k, ab);
            if (ds) tg_vec<T, W>::store(ds + row * D, k, o);
            if (dx) {
                if (drop.on) rln_apply<W>(drop, step, (uint64_t)(row * D + k * W), o);
                tg_vec<T, W>::store(dx + row * D, k, o);
            }
        }
    }
    __syncthreads();
    for (int64_t c = threadIdx.x; c < D; c += LN_THREADS) {
        float tg = fc_smem[c], tb = fc_smem[WARPS * D + c];
#pragma unroll
        for (int w = 1; w < WARPS; w++) tg = fadd(tg, fc_smem[w * D + c]), tb = fadd(tb, fc_smem[(WARPS + w) * D + c]);
        pg[(int64_t)blockIdx.x * D + c] = tg;
        pb[(int64_t)blockIdx.x * D + c] = tb;
    }
}

/* dgamma/dbeta += the column sums of `chunks` float partials: block (8, 128) owns 8
 * columns; lane ty adds chunks ty, ty + 128, ... in order (in double), then the 128 lane
 * sums meet in a fixed tree (deterministic). D / 8 blocks of 1024 threads, so the few MB
 * of partials are read by many SMs at once. */
#define FC_FINAL_TY 128
__global__ void __launch_bounds__(8 * FC_FINAL_TY)
fc_final_kernel(const float *__restrict__ pg, const float *__restrict__ pb, float *__restrict__ dgamma,
                float *__restrict__ dbeta, int64_t chunks, int64_t D, int overwrite) {
    __shared__ double sg[FC_FINAL_TY][8], sb[FC_FINAL_TY][8];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * 8 + tx;
    double g = 0, b = 0;
    if (c < D)
        for (int64_t k = ty; k < chunks; k += FC_FINAL_TY) g += (double)pg[k * D + c], b += (double)pb[k * D + c];
    sg[ty][tx] = g;
    sb[ty][tx] = b;
    __syncthreads();
    for (int s = FC_FINAL_TY / 2; s > 0; s >>= 1) {
        if (ty < s) sg[ty][tx] += sg[ty + s][tx], sb[ty][tx] += sb[ty + s][tx];
        __syncthreads();
    }
    if (ty == 0 && c < D) {
        if (dgamma) tg_grad_store(dgamma + c, (float)sg[0][tx], overwrite);
        if (dbeta) tg_grad_store(dbeta + c, (float)sb[0][tx], overwrite);
    }
}

/* The fused-column backward and its final sums when D and every pointer allow it (with
 * dgamma or dbeta to compute); 1 if it ran, 0 if the caller must take the row and column
 * kernels, -1 on error. overwrite: the caller's op writes dgamma and dbeta first. */
template <class T>
static int fc_bwd(const tg_cuda_op_args *a, const T *dy, const T *x, const float *g, const float *mu,
                  const float *rs, const T *extra, const float *step, T *ds, T *dx, float *dg, float *db, int64_t M,
                  int64_t D, int overwrite, rln_dropout drop, tg_err *err) {
    constexpr int W = LN_W8<T>::W; /* 16 bytes */
    if ((!dg && !db) || D % W || D > FC_MAX_D || !tg_aligned16(dy) || !tg_aligned16(x) || !tg_aligned16(g) ||
        !tg_aligned16(extra) || !tg_aligned16(ds) || !tg_aligned16(dx))
        return 0;
    const int64_t groups = (M + LN_THREADS / 32 - 1) / (LN_THREADS / 32);
    const int64_t blocks = groups < FC_GRID ? groups : FC_GRID;
    if (tg_scratch_check(a, tg_scratch_layernorm_bwd(M, D), err)) return -1;
    float *pg = a->ctx->reduce_scratch, *pb = pg + blocks * D;
    const size_t smem = 2 * (size_t)(LN_THREADS / 32) * (size_t)D * sizeof(float);
    cudaStream_t st = a->ctx->stream;
    if (smem > 48 * 1024) {
        const cudaError_t e =
            cudaFuncSetAttribute(fc_bwd_kernel<W, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return tg_fail(err, "layernorm backward: %zu bytes of shared memory refused: %s", smem,
                           cudaGetErrorString(e));
    }
    fc_bwd_kernel<W, T><<<(unsigned)blocks, LN_THREADS, smem, st>>>(dy, x, g, mu, rs, extra, step, ds, dx, pg, pb, M, D,
                                                                    drop);
    fc_final_kernel<<<(unsigned)((D + 7) / 8), dim3(8, FC_FINAL_TY), 0, st>>>(pg, pb, dg, db, blocks, D, overwrite);
    return 1;
}

/* ---- plain layernorm launchers ------------------------------------------------------ */

template <class T>
static void launch_ln_fwd(const tg_cuda_op_args *a, int64_t M, int64_t D) {
    const T *x = (const T *)a->in[0];
    const float *g = (const float *)a->in[1], *b = (const float *)a->in[2];
    T *y = (T *)a->out[0];
    float *mu = (float *)a->out[1], *rs = (float *)a->out[2];
    const unsigned blocks = (unsigned)((M * 32 + LN_THREADS - 1) / LN_THREADS);
    const unsigned va = 4 * sizeof(T);
    const int vec = D % 4 == 0 && tg_aligned(x, va) && tg_aligned16(g) && tg_aligned16(b) && tg_aligned(y, va);
    const float eps = a->op->p.layernorm.eps;
    if (vec)
        ln_fwd_kernel<4, T><<<blocks, LN_THREADS, 0, a->ctx->stream>>>(x, g, b, y, mu, rs, M, D, eps);
    else
        ln_fwd_kernel<1, T><<<blocks, LN_THREADS, 0, a->ctx->stream>>>(x, g, b, y, mu, rs, M, D, eps);
}

int tg_launch_layernorm(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t M = a->op->p.layernorm.m, D = a->op->p.layernorm.d;
    if (M <= 0 || D <= 0) return 0;
    if (a->in_dtype[0] == TG_BF16)
        launch_ln_fwd<tg_bf16>(a, M, D);
    else if (a->in_dtype[0] == TG_F16)
        launch_ln_fwd<tg_f16>(a, M, D);
    else
        launch_ln_fwd<float>(a, M, D);
    return 0;
}

/* dgamma += sum dy*xhat, dbeta += sum dy over the rows of dy and x (both stages); = with
 * overwrite (the caller's op writes them first). */
template <class T>
static int launch_ln_cols(const tg_cuda_op_args *a, const T *dy, const T *x, const float *mu, const float *rs,
                          float *dg, float *db, int64_t M, int64_t D, int overwrite, tg_err *err) {
    if (!dg && !db) return 0;
    if (tg_scratch_check(a, tg_scratch_layernorm_bwd(M, D), err)) return -1;
    const int64_t chunks = (M + COL_ROWS - 1) / COL_ROWS, stripes = (D + COL_STRIPE - 1) / COL_STRIPE;
    if (chunks > 65535) return tg_fail(err, "%lld rows exceed the column-sum grid", (long long)M);
    if (stripes > INT32_MAX) return tg_fail(err, "%lld columns exceed the column-sum grid", (long long)D);
    double *pg = (double *)a->ctx->reduce_scratch, *pb = pg + chunks * D;
    const dim3 grid((unsigned)stripes, (unsigned)chunks);
    const unsigned va = 4 * sizeof(T);
    cudaStream_t st = a->ctx->stream;
    if (sizeof(T) == 2 && D % 8 == 0 && tg_aligned16(dy) && tg_aligned16(x))
        ln_bwd_cols_kernel<T, LN_W8<T>::W><<<grid, COL_THREADS, 0, st>>>(dy, x, mu, rs, pg, pb, M, D);
    else if (D % 4 == 0 && tg_aligned(dy, va) && tg_aligned(x, va))
        ln_bwd_cols_kernel<T, 4><<<grid, COL_THREADS, 0, st>>>(dy, x, mu, rs, pg, pb, M, D);
    else
        ln_bwd_cols_kernel<T, 1><<<grid, COL_THREADS, 0, st>>>(dy, x, mu, rs, pg, pb, M, D);
    col_final_kernel<<<(unsigned)((D + 31) / 32), dim3(32, COL_TY), 0, st>>>(pg, dg, pb, db, chunks, D,
                                                                             overwrite);
    return 0;
}

template <class T>
static int launch_ln_bwd(const tg_cuda_op_args *a, int64_t M, int64_t D, tg_err *err) {
    const T *dy = (const T *)a->in[0], *x = (const T *)a->in[1];
    const float *g = (const float *)a->in[2], *mu = (const float *)a->in[3], *rs = (const float *)a->in[4];
    T *dx = (T *)a->out[0];
    float *dg = (float *)a->out[1], *db = (float *)a->out[2];
    const rln_dropout off = {};
    const int overwrite = a->op->p.layernorm_bwd.overwrite != 0;
    const int fc = fc_bwd<T>(a, dy, x, g, mu, rs, NULL, NULL, dx, NULL, dg, db, M, D, overwrite, off, err);
    if (fc) return fc < 0 ? -1 : 0;
    cudaStream_t st = a->ctx->stream;
    if (dx) {
        const unsigned blocks = (unsigned)((M * 32 + LN_THREADS - 1) / LN_THREADS);
        const unsigned va = 4 * sizeof(T);
        const int vec = D % 4 == 0 && tg_aligned(dy, va) && tg_aligned(x, va) && tg_aligned16(g) && tg_aligned(dx, va);
        const int vec8 = sizeof(T) == 2 && D % 8 == 0 && tg_aligned16(dy) && tg_aligned16(x) && tg_aligned16(g) &&
                         tg_aligned16(dx);
        if (vec8)
            ln_bwd_dx_kernel<LN_W8<T>::W, T><<<blocks, LN_THREADS, 0, st>>>(dy, x, g, mu, rs, dx, M, D);
        else if (vec)
            ln_bwd_dx_kernel<4, T><<<blocks, LN_THREADS, 0, st>>>(dy, x, g, mu, rs, dx, M, D);
        else
            ln_bwd_dx_kernel<1, T><<<blocks, LN_THREADS, 0, st>>>(dy, x, g, mu, rs, dx, M, D);
    }
    return launch_ln_cols<T>(a, dy, x, mu, rs, dg, db, M, D, overwrite, err);
}

int tg_launch_layernorm_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t M = a->op->p.layernorm_bwd.m, D = a->op->p.layernorm_bwd.d;
    if (M <= 0 || D <= 0) return 0;
    if (a->in_dtype[0] == TG_BF16) return launch_ln_bwd<tg_bf16>(a, M, D, err);
    if (a->in_dtype[0] == TG_F16) return launch_ln_bwd<tg_f16>(a, M, D, err);
    return launch_ln_bwd<float>(a, M, D, err);
}

/* ---- residual layernorm launchers --------------------------------------------------- */

template <class T>
static int launch_rln_fwd(const tg_cuda_op_args *a, int64_t M, int64_t D, tg_err *err) {
    const T *x = (const T *)a->in[0], *r = (const T *)a->in[1];
    const float *g = (const float *)a->in[2], *b = (const float *)a->in[3], *step = (const float *)a->in[4];
    T *y = (T *)a->out[0], *s = (T *)a->out[1];
    float *mu = (float *)a->out[2], *rs = (float *)a->out[3];
    if (!x || !r || !y || !s) return tg_fail(err, "residual_layernorm needs x, r, y and s");
    const tg_residual_layernorm_params *rp = &a->op->p.residual_layernorm;
    const rln_dropout drop = rln_dropout_of(a, rp->key, rp->p);
    const float eps = rp->eps;
    const unsigned blocks = (unsigned)((M * 32 + LN_THREADS - 1) / LN_THREADS);
    const unsigned va = 4 * sizeof(T);
    cudaStream_t st = a->ctx->stream;
    const int vec8 = sizeof(T) == 2 && D % 8 == 0 && tg_aligned16(x) && tg_aligned16(r) && tg_aligned16(y) &&
                     tg_aligned16(s) && tg_aligned16(g) && tg_aligned16(b);
    const int vec = D % 4 == 0 && tg_aligned(x, va) && tg_aligned(r, va) && tg_aligned(y, va) && tg_aligned(s, va) &&
                    tg_aligned16(g) && tg_aligned16(b);
    if (vec8)
        rln_fwd_kernel<LN_W8<T>::W, T><<<blocks, LN_THREADS, 0, st>>>(x, r, g, b, step, y, s, mu, rs, M, D, eps, drop);
    else if (vec)
        rln_fwd_kernel<4, T><<<blocks, LN_THREADS, 0, st>>>(x, r, g, b, step, y, s, mu, rs, M, D, eps, drop);
    else
        rln_fwd_kernel<1, T><<<blocks, LN_THREADS, 0, st>>>(x, r, g, b, step, y, s, mu, rs, M, D, eps, drop);
    return 0;
}

int tg_launch_residual_layernorm(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t M = a->op->p.residual_layernorm.m, D = a->op->p.residual_layernorm.d;
    if (M <= 0 || D <= 0) return 0;
    if (a->in_dtype[0] == TG_BF16) return launch_rln_fwd<tg_bf16>(a, M, D, err);
    if (a->in_dtype[0] == TG_F16) return launch_rln_fwd<tg_f16>(a, M, D, err);
    return launch_rln_fwd<float>(a, M, D, err);
}

template <class T>
static int launch_rln_bwd(const tg_cuda_op_args *a, int64_t M, int64_t D, tg_err *err) {
    const T *dy = (const T *)a->in[0], *s = (const T *)a->in[1], *extra = (const T *)a->in[5];
    const float *g = (const float *)a->in[2], *mu = (const float *)a->in[3], *rs = (const float *)a->in[4];
    const float *step = (const float *)a->in[6];
    T *ds = (T *)a->out[0], *dx = (T *)a->out[1];
    float *dg = (float *)a->out[2], *db = (float *)a->out[3];
    if (!dy || !s || !mu || !rs || !ds || !dx) return tg_fail(err, "residual_layernorm_bwd needs dy, s, mean, rstd, ds and dx");
    const tg_residual_layernorm_bwd_params *rp = &a->op->p.residual_layernorm_bwd;
    const rln_dropout drop = rln_dropout_of(a, rp->key, rp->p);
    const int overwrite = rp->overwrite != 0;
    const int fc = fc_bwd<T>(a, dy, s, g, mu, rs, extra, step, ds, dx, dg, db, M, D, overwrite, drop, err);
    if (fc) return fc < 0 ? -1 : 0;
    const unsigned blocks = (unsigned)((M * 32 + LN_THREADS - 1) / LN_THREADS);
    const unsigned va = 4 * sizeof(T);
    cudaStream_t st = a->ctx->stream;
    const int vec8 = sizeof(T) == 2 && D % 8 == 0 && tg_aligned16(dy) && tg_aligned16(s) && tg_aligned16(extra) &&
                     tg_aligned16(ds) && tg_aligned16(dx) && tg_aligned16(g);
    const int vec = D % 4 == 0 && tg_aligned(dy, va) && tg_aligned(s, va) && tg_aligned(extra, va) &&
                    tg_aligned(ds, va) && tg_aligned(dx, va) && tg_aligned16(g);
    if (vec8)
        rln_bwd_kernel<LN_W8<T>::W, T><<<blocks, LN_THREADS, 0, st>>>(dy, s, g, mu, rs, extra, step, ds, dx, M, D, drop);
    else if (vec)
        rln_bwd_kernel<4, T><<<blocks, LN_THREADS, 0, st>>>(dy, s, g, mu, rs, extra, step, ds, dx, M, D, drop);
    else
        rln_bwd_kernel<1, T><<<blocks, LN_THREADS, 0, st>>>(dy, s, g, mu, rs, extra, step, ds, dx, M, D, drop);
    return launch_ln_cols<T>(a, dy, s, mu, rs, dg, db, M, D, overwrite, err);
}

int tg_launch_residual_layernorm_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t M = a->op->p.residual_layernorm_bwd.m, D = a->op->p.residual_layernorm_bwd.d;
    if (M <= 0 || D <= 0) return 0;
    if (a->in_dtype[0] == TG_BF16) return launch_rln_bwd<tg_bf16>(a, M, D, err);
    if (a->in_dtype[0] == TG_F16) return launch_rln_bwd<tg_f16>(a, M, D, err);
    return launch_rln_bwd<float>(a, M, D, err);
}
