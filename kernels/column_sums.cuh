/* Deterministic column sums of a [M, N] row-major tensor, in two stages, shared by
 * BIAS_GRAD (kernels/optimizer.cu), the GELU backward that also writes its bias gradient
 * (kernels/elementwise.cu), the embedding backward (kernels/embedding.cu), and (stage 2,
 * for its own stage 1) the LayerNorm backward's dgamma and dbeta (kernels/layernorm.cu).
 *
 * Stage 1: block (256 threads) owns the COL_STRIPE columns [64*bx, +64) and the rows
 * [128*by, +128). A row of the stripe is VPR = 64/W vectors of W elements (bf16: 8 x
 * 16 bytes = one 128-byte line), so thread t takes vector t % VPR of rows
 * r0 + t / VPR, + RG, ... (RG = 256 / VPR row groups), all independent, and adds each
 * element into its own double. The values come from a row functor (L), which may also
 * compute and store them (the GELU backward): load(r, k, v) fills v with vector k of row
 * r as the sums should see it. The RG row-group partials of each column are added in
 * row-group order from shared memory and written to partial[chunk][column].
 * Stage 2: block (32, 8) owns 32 columns; lane ty adds chunks ty, ty + 8, ... in order,
 * then the 8 lane sums are added in lane order and the result += into out (= with
 * overwrite). W > 1 needs N % W == 0 and rows aligned to the access. */
#ifndef TUNEGRAPH_COLUMN_SUMS_CUH
#define TUNEGRAPH_COLUMN_SUMS_CUH

#include "kernels/cuda_common.cuh"

#define COL_ROWS 128    /* rows per stage-1 chunk (the scratch formula depends on it) */
#define COL_STRIPE 64   /* columns per stage-1 block */
#define COL_THREADS 256 /* stage-1 block size */
#define COL_TY 8        /* chunk lanes per stage-2 block (block = 32 x 8) */

/* Floats of scratch the double partials of an [M, N] column sum take. */
static inline int64_t tg_col_sum_scratch(int64_t M, int64_t N) {
    return M > 0 && N > 0 ? 2 * ((M + COL_ROWS - 1) / COL_ROWS) * N : 0;
}

/* The plain row functor: vector k of row r of x. */
template <class T, int W>
struct col_read {
    const T *x;
    int64_t N;
    __device__ __forceinline__ void operator()(int64_t r, int64_t k, float (&v)[W]) const {
        tg_vec<T, W>::load(x + r * N, k, v);
    }
};

template <int W, class L>
__global__ void __launch_bounds__(COL_THREADS)
col_stripe_kernel(L load, double *__restrict__ partial, int64_t M, int64_t N) {
    constexpr int VPR = COL_STRIPE / W, RG = COL_THREADS / VPR;
    static_assert(COL_STRIPE % W == 0 && COL_THREADS % VPR == 0 && COL_ROWS % RG == 0, "stripe shape");
    __shared__ double sp[RG][COL_STRIPE];
    const int vx = threadIdx.x % VPR, ry = threadIdx.x / VPR;
    const int64_t c0 = (int64_t)blockIdx.x * COL_STRIPE + vx * W;
    const int64_t chunks = (M + COL_ROWS - 1) / COL_ROWS;
    /* Chunks beyond the grid's y extent (65535) come round again. */
    for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
        const int64_t r0 = chunk * COL_ROWS, r1 = min(r0 + COL_ROWS, M);
        double s[W];
#pragma unroll
        for (int j = 0; j < W; j++) s[j] = 0.0;
        if (c0 < N) {
#pragma unroll 4
            for (int64_t r = r0 + ry; r < r1; r += RG) {
                float v[W];
                load(r, c0 / W, v);
#pragma unroll
                for (int j = 0; j < W; j++) s[j] += (double)v[j];
            }
        }
#pragma unroll
        for (int j = 0; j < W; j++) sp[ry][vx * W + j] = s[j];
        __syncthreads();
        if (threadIdx.x < COL_STRIPE) {
            const int64_t c = (int64_t)blockIdx.x * COL_STRIPE + threadIdx.x;
            if (c < N) {
                double t = sp[0][threadIdx.x];
#pragma unroll
                for (int k = 1; k < RG; k++) t += sp[k][threadIdx.x];
                partial[chunk * N + c] = t;
            }
        }
        __syncthreads(); /* sp is written again by the next chunk */
    }
}

/* Stage 2 of one column set, or of two sharing the grid (partial2 and out2; the
 * LayerNorm backward's dgamma and dbeta), each summed as described above; a NULL out is
 * left unwritten. */
static __global__ void __launch_bounds__(32 * COL_TY)
col_final_kernel(const double *__restrict__ partial, float *__restrict__ out, const double *__restrict__ partial2,
                 float *__restrict__ out2, int64_t chunks, int64_t N, int overwrite) {
    __shared__ double sp[2][COL_TY][32];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = (int64_t)blockIdx.x * 32 + tx;
    double s = 0, s2 = 0;
    if (c < N)
        for (int64_t k = ty; k < chunks; k += COL_TY) {
            s += partial[k * N + c];
            if (partial2) s2 += partial2[k * N + c];
        }
    sp[0][ty][tx] = s;
    sp[1][ty][tx] = s2;
    __syncthreads();
    if (ty == 0 && c < N) {
        for (int k = 1; k < COL_TY; k++) s += sp[0][k][tx], s2 += sp[1][k][tx];
        if (out) tg_grad_store(out + c, (float)s, overwrite);
        if (partial2 && out2) tg_grad_store(out2 + c, (float)s2, overwrite);
    }
}

/* Both stages over the rows the functor gives: W is the vector width it was built for. */
template <int W, class L>
static int col_sums(L load, int64_t M, int64_t N, double *partial, float *out, int overwrite, cudaStream_t st,
                    tg_err *err) {
    const int64_t chunks = (M + COL_ROWS - 1) / COL_ROWS, stripes = (N + COL_STRIPE - 1) / COL_STRIPE;
    if (stripes > INT32_MAX) return tg_fail(err, "%lld columns exceed the column-sum grid", (long long)N);
    const unsigned grid_y = (unsigned)(chunks < 65535 ? chunks : 65535);
    col_stripe_kernel<W, L><<<dim3((unsigned)stripes, grid_y), COL_THREADS, 0, st>>>(load, partial, M, N);
    col_final_kernel<<<(unsigned)((N + 31) / 32), dim3(32, COL_TY), 0, st>>>(partial, out, NULL, NULL, chunks, N,
                                                                             overwrite);
    return 0;
}

#endif
