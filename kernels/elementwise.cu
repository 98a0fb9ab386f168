/* Elementwise ops: ZERO, FILL, ADD, GELU(_BWD), TANH(_BWD), RELU6(_BWD), DROPOUT. GELU_BWD with a bias
 * gradient (bias_cols) runs as the column-sum stripes of column_sums.cuh instead.
 *
 * Memory bound, so one generic grid-stride kernel moves 16 bytes per access when every
 * pointer is 16-byte aligned (tensors are 256-byte aligned): 4 floats, or 8 bf16 in bf16
 * plans (computed in float, rounded on store), and finishes the tail with scalars. Each
 * thread issues EW_UNROLL such loads per input before computing, and the grid is sized
 * so a [4096 x 768] bf16 tensor is one wave (384 blocks x 256 threads x 4 vectors).
 * ZERO clears out_numel elements of out0's dtype; FILL is fp32 only. Each element is read and written by one thread in one iteration, so outputs
 * may alias inputs (in-place dropout / accumulation). The formulas are the CPU's,
 * written with non-contracting intrinsics so the roundings match (transcendentals are
 * CUDA's, within 2 ulp of glibc's). Dropout draws its mask from the same counter-based
 * Philox stream as the CPU: Philox block g covers elements 4g..4g+3, which is exactly
 * one float4, and the step is read from device memory inside the kernel so a captured
 * graph sees each replay's step. */
#include "kernels/column_sums.cuh"
#include "kernels/philox.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f
#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT_2PI 0.3989422804014327f

#define EW_THREADS 256
#define EW_UNROLL 4            /* 16-byte vectors per input per thread in flight together */
#define EW_MAX_BLOCKS (132 * 8) /* H100: 132 SMs; any grid gives the same results */

/* ---- functors: one element, CPU formulas ------------------------------------------ */

struct add_fn {
    __device__ float operator()(float a, float b) const { return fadd(a, b); }
};

struct gelu_erf_fn {
    __device__ float operator()(float x, float) const {
        return fmul(fmul(0.5f, x), fadd(1.0f, erff(fmul(x, SQRT1_2))));
    }
};

struct gelu_tanh_fn {
    __device__ float operator()(float v, float) const {
        float inner = fadd(v, fmul(fmul(fmul(GELU_C, v), v), v));
        return fmul(fmul(0.5f, v), fadd(1.0f, tanhf(fmul(GELU_K, inner))));
    }
};

/* a = dy, b = x */
struct gelu_erf_bwd_fn {
    __device__ float operator()(float dy, float v) const {
        float cdf = fmul(0.5f, fadd(1.0f, erff(fmul(v, SQRT1_2))));
        float pdf = fmul(fmul(v, INV_SQRT_2PI), expf(fmul(fmul(-0.5f, v), v)));
        return fmul(dy, fadd(cdf, pdf));
    }
};

struct gelu_tanh_bwd_fn {
    __device__ float operator()(float dy, float v) const {
        float t = tanhf(fmul(GELU_K, fadd(v, fmul(fmul(fmul(GELU_C, v), v), v))));
        float du = fmul(GELU_K, fadd(1.0f, fmul(fmul(fmul(3.0f, GELU_C), v), v)));
        float d = fadd(fmul(0.5f, fadd(1.0f, t)), fmul(fmul(fmul(0.5f, v), fsub(1.0f, fmul(t, t))), du));
        return fmul(dy, d);
    }
};

struct tanh_fn {
    __device__ float operator()(float x, float) const { return tanhf(x); }
};

/* a = dy, b = y */
struct tanh_bwd_fn {
    __device__ float operator()(float dy, float y) const { return fmul(dy, fsub(1.0f, fmul(y, y))); }
};

/* min(max(x, 0), 6), a NaN kept (the CPU's comparisons). */
struct relu6_fn {
    __device__ float operator()(float x, float) const { return x < 0.0f ? 0.0f : x > 6.0f ? 6.0f : x; }
};

/* a = dy, b = y: dy where 0 < y < 6. */
struct relu6_bwd_fn {
    __device__ float operator()(float dy, float y) const { return y > 0.0f && y < 6.0f ? dy : 0.0f; }
};

/* ---- kernels ----------------------------------------------------------------------- */

/* One 16-byte access as raw bits (float4: 4 floats; uint4: 8 bf16 or half), widened to float
 * with exactly tg_vec's conversions, so loads can be issued before any arithmetic. */
template <class T, int W>
struct ew_pack;
template <>
struct ew_pack<float, 4> {
    typedef float4 raw;
    static __device__ __forceinline__ raw ld(const float *p, int64_t k) { return reinterpret_cast<const float4 *>(p)[k]; }
    static __device__ __forceinline__ void unpack(const raw &t, float (&v)[4]) {
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    }
};
template <class T>
struct ew_pack16 {
    typedef uint4 raw;
    static __device__ __forceinline__ raw ld(const T *p, int64_t k) { return reinterpret_cast<const uint4 *>(p)[k]; }
    static __device__ __forceinline__ void unpack(const raw &t, float (&v)[8]) {
        typedef tg_h16<T> H;
        v[0] = H::lo(t.x), v[1] = H::hi(t.x), v[2] = H::lo(t.y), v[3] = H::hi(t.y);
        v[4] = H::lo(t.z), v[5] = H::hi(t.z), v[6] = H::lo(t.w), v[7] = H::hi(t.w);
    }
};
template <>
struct ew_pack<tg_bf16, 8> : ew_pack16<tg_bf16> {};
template <>
struct ew_pack<tg_f16, 8> : ew_pack16<tg_f16> {};

/* y = f(a, b) over n elements of storage type T (float, bf16 or half; computed in float);
 * b may be NULL (unary ops get 0). vec: all pointers 16-byte aligned, so elements
 * [0, W*(n/W)) move W at a time (float: W = 4, a float4; 16-bit: W = 8, 16 bytes).
 * Each thread first loads EW_UNROLL vectors of a (and b) at i, i + stride, ... (all
 * loads in flight together), then computes and stores them; leftover vectors go one at
 * a time, then the scalar tail. Every element is still loaded and stored by one thread,
 * load before store, so y may alias a or b. */
template <class T, int W, class F>
__global__ void __launch_bounds__(EW_THREADS)
ew_kernel(const T *__restrict__ a, const T *__restrict__ b, T *__restrict__ y, int64_t n, int vec, F f) {
    typedef ew_pack<T, W> P;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t nw = vec ? n / W : 0;
    int64_t i = tid;
    for (; i + (EW_UNROLL - 1) * stride < nw; i += EW_UNROLL * stride) {
        typename P::raw ra[EW_UNROLL], rb[EW_UNROLL];
#pragma unroll
        for (int u = 0; u < EW_UNROLL; u++) {
            ra[u] = P::ld(a, i + u * stride);
            if (b) rb[u] = P::ld(b, i + u * stride);
        }
#pragma unroll
        for (int u = 0; u < EW_UNROLL; u++) {
            float va[W], vb[W], r[W];
            P::unpack(ra[u], va);
            if (b)
                P::unpack(rb[u], vb);
            else
#pragma unroll
                for (int j = 0; j < W; j++) vb[j] = 0.0f;
#pragma unroll
            for (int j = 0; j < W; j++) r[j] = f(va[j], vb[j]);
            tg_vec<T, W>::store(y, i + u * stride, r);
        }
    }
    for (; i < nw; i += stride) {
        float va[W], vb[W], r[W];
        P::unpack(P::ld(a, i), va);
        if (b)
            P::unpack(P::ld(b, i), vb);
        else
#pragma unroll
            for (int j = 0; j < W; j++) vb[j] = 0.0f;
#pragma unroll
        for (int j = 0; j < W; j++) r[j] = f(va[j], vb[j]);
        tg_vec<T, W>::store(y, i, r);
    }
    for (int64_t k = nw * W + tid; k < n; k += stride) tg_st(y, k, f(tg_ld(a, k), b ? tg_ld(b, k) : 0.0f));
}

/* y = value (x *scale when scale is given: the loss scale of fp16 plans, read on the device). */
__global__ void __launch_bounds__(EW_THREADS)
fill_kernel(float *__restrict__ y, int64_t n, int vec, float value, const float *__restrict__ scale) {
    const float v = scale ? __fmul_rn(value, scale[0]) : value;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n4 = vec ? n / 4 : 0;
    for (int64_t i = tid; i < n4; i += stride) reinterpret_cast<float4 *>(y)[i] = make_float4(v, v, v, v);
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) y[i] = v;
}

/* One thread per 4 elements (a float4, or 8 bytes of bf16 when vec), half of one of
 * dropout's Philox blocks (kernels/philox.h). The mask does not depend on T; the kept
 * value is fmul(x, scale) in float, then stored. */
template <class T>
__global__ void __launch_bounds__(EW_THREADS)
dropout_kernel(const T *__restrict__ x, const float *__restrict__ step_ptr, T *__restrict__ y, int64_t n, int vec,
               uint64_t seed, uint32_t key, float p, float scale) {
    const uint64_t step = tg_dropout_step(step_ptr);
    const int64_t groups = (n + 3) / 4;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        float u[4];
        tg_dropout_uniform4(seed, step, key, (uint64_t)g, u);
        const int64_t e = g * 4;
        if (vec && e + 4 <= n) {
            float v[4];
            tg_vec<T, 4>::load(x, g, v);
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = u[j] >= p ? fmul(v[j], scale) : 0.0f;
            tg_vec<T, 4>::store(y, g, v);
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (e + j < n) tg_st(y, e + j, u[j] >= p ? fmul(tg_ld(x, e + j), scale) : 0.0f);
        }
    }
}

/* ---- launchers ------------------------------------------------------------------- */

template <class T, int W, class F>
static void launch_ew_t(const tg_cuda_op_args *a, int64_t n, const void *in0, const void *in1, F f) {
    const T *x = (const T *)in0, *b = (const T *)in1;
    T *y = (T *)a->out[0];
    const int vec = tg_aligned16(x) && tg_aligned16(b) && tg_aligned16(y);
    /* Enough blocks that each thread gets EW_UNROLL vectors (or scalars), capped at a few
     * resident blocks per SM (the grid-stride loops take the rest). */
    const int64_t items = vec ? n / W : n, per_block = (int64_t)EW_THREADS * EW_UNROLL;
    int64_t blocks = (items + per_block - 1) / per_block;
    blocks = blocks < 1 ? 1 : blocks > EW_MAX_BLOCKS ? EW_MAX_BLOCKS : blocks;
    ew_kernel<T, W, F><<<(unsigned)blocks, EW_THREADS, 0, a->ctx->stream>>>(x, b, y, n, vec, f);
}

/* Storage type from out0 (tg_check_dtypes made every T slot agree); n elements, from the
 * caller, which knows its kind's parameter set. */
template <class F>
static int launch_ew(const tg_cuda_op_args *a, int64_t n, const void *in0, const void *in1, F f) {
    if (n <= 0) return 0;
    if (a->out_dtype[0] == TG_BF16)
        launch_ew_t<tg_bf16, 8>(a, n, in0, in1, f);
    else if (a->out_dtype[0] == TG_F16)
        launch_ew_t<tg_f16, 8>(a, n, in0, in1, f);
    else
        launch_ew_t<float, 4>(a, n, in0, in1, f);
    return 0;
}

int tg_launch_zero(const tg_cuda_op_args *a, tg_err *err) {
    if (!a->out[0] || a->out_numel[0] <= 0) return 0;
    const int size = tg_dtype_size(a->out_dtype[0]);
    if (size <= 0) return tg_fail(err, "unsupported dtype out=%s", tg_dtype_name(a->out_dtype[0]));
    cudaError_t e = cudaMemsetAsync(a->out[0], 0, (size_t)a->out_numel[0] * (size_t)size, a->ctx->stream);
    if (e != cudaSuccess) return tg_fail(err, "cudaMemsetAsync: %s", cudaGetErrorString(e));
    return 0;
}

int tg_launch_fill(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t n = a->out_numel[0];
    if (!a->out[0] || n <= 0) return 0;
    float *y = (float *)a->out[0];
    const int vec = tg_aligned16(y);
    fill_kernel<<<tg_blocks(vec ? n / 4 + 4 : n, EW_THREADS), EW_THREADS, 0, a->ctx->stream>>>(
        y, n, vec, a->op->p.fill.value, (const float *)a->in[0]);
    return 0;
}

int tg_launch_add(const tg_cuda_op_args *a, tg_err *err) {
    return launch_ew(a, a->op->p.count.n, a->in[0], a->in[1], add_fn());
}

int tg_launch_relu6(const tg_cuda_op_args *a, tg_err *err) {
    return launch_ew(a, a->op->p.count.n, a->in[0], NULL, relu6_fn());
}

int tg_launch_relu6_bwd(const tg_cuda_op_args *a, tg_err *err) {
    return launch_ew(a, a->op->p.count.n, a->in[0], a->in[1], relu6_bwd_fn());
}

int tg_launch_gelu(const tg_cuda_op_args *a, tg_err *err) {
    const tg_gelu_params *g = &a->op->p.gelu;
    if (g->form == TG_GELU_TANH) return launch_ew(a, g->n, a->in[0], NULL, gelu_tanh_fn());
    return launch_ew(a, g->n, a->in[0], NULL, gelu_erf_fn());
}

/* GELU_BWD with its bias gradient (bias_cols columns): the column-sum stripes compute dx as
 * they go, store it, and sum it as stored, so dx is read once instead of twice; with out2,
 * they also store gelu(x) (G, GELU's own expressions) from the x they have loaded. */
template <class T, int W, class F, class G>
struct gelu_bwd_cols {
    const T *dy, *x;
    T *dx, *y;
    int64_t N;
    F f;
    G g;
    __device__ __forceinline__ void operator()(int64_t r, int64_t k, float (&v)[W]) const {
        float d[W], xv[W];
        tg_vec<T, W>::load(dy + r * N, k, d);
        tg_vec<T, W>::load(x + r * N, k, xv);
        if (y) {
            float gv[W];
#pragma unroll
            for (int j = 0; j < W; j++) gv[j] = g(xv[j], 0.0f);
            tg_vec<T, W>::store(y + r * N, k, gv);
        }
#pragma unroll
        for (int j = 0; j < W; j++) v[j] = f(d[j], xv[j]);
        tg_vec<T, W>::store(dx + r * N, k, v);
#pragma unroll
        for (int j = 0; j < W; j++) v[j] = tg_stored<T>::of(v[j]);
    }
};

int64_t tg_scratch_gelu_bwd(const tg_op *op) {
    const tg_gelu_bwd_params *g = &op->p.gelu_bwd;
    return g->bias_cols > 0 ? tg_col_sum_scratch(g->n / g->bias_cols, g->bias_cols) : 0;
}

template <class T, class F, class G>
static int gelu_bwd_with_bias(const tg_cuda_op_args *a, F f, G g, tg_err *err) {
    const int64_t N = a->op->p.gelu_bwd.bias_cols, M = a->op->p.gelu_bwd.n / N;
    const T *dy = (const T *)a->in[0], *x = (const T *)a->in[1];
    T *dx = (T *)a->out[0], *y = (T *)a->out[2];
    double *partial = (double *)a->ctx->reduce_scratch;
    float *db = (float *)a->out[1];
    cudaStream_t st = a->ctx->stream;
    constexpr int W = sizeof(T) == 2 ? 8 : 4; /* 16 bytes */
    if (N % W == 0 && tg_aligned16(dy) && tg_aligned16(x) && tg_aligned16(dx) && tg_aligned16(y))
        return col_sums<W>(gelu_bwd_cols<T, W, F, G>{dy, x, dx, y, N, f, g}, M, N, partial, db, 1, st, err);
    return col_sums<1>(gelu_bwd_cols<T, 1, F, G>{dy, x, dx, y, N, f, g}, M, N, partial, db, 1, st, err);
}

int tg_launch_gelu_bwd(const tg_cuda_op_args *a, tg_err *err) {
    const tg_gelu_bwd_params *g = &a->op->p.gelu_bwd;
    const int tanh_form = g->form == TG_GELU_TANH;
    if (g->bias_cols > 0 && a->out[1]) {
        if (g->n % g->bias_cols) return tg_fail(err, "gelu_bwd: %lld elements are not rows of %lld",
                                                (long long)g->n, (long long)g->bias_cols);
        if (tg_scratch_check(a, tg_scratch_gelu_bwd(a->op), err)) return -1;
        if (a->out_dtype[0] == TG_BF16)
            return tanh_form ? gelu_bwd_with_bias<tg_bf16>(a, gelu_tanh_bwd_fn(), gelu_tanh_fn(), err)
                             : gelu_bwd_with_bias<tg_bf16>(a, gelu_erf_bwd_fn(), gelu_erf_fn(), err);
        if (a->out_dtype[0] == TG_F16)
            return tanh_form ? gelu_bwd_with_bias<tg_f16>(a, gelu_tanh_bwd_fn(), gelu_tanh_fn(), err)
                             : gelu_bwd_with_bias<tg_f16>(a, gelu_erf_bwd_fn(), gelu_erf_fn(), err);
        return tanh_form ? gelu_bwd_with_bias<float>(a, gelu_tanh_bwd_fn(), gelu_tanh_fn(), err)
                         : gelu_bwd_with_bias<float>(a, gelu_erf_bwd_fn(), gelu_erf_fn(), err);
    }
    /* Without the bias columns, out2 (the recomputed GELU output) is GELU's own launch on x. */
    if (a->out[2]) {
        tg_cuda_op_args ga = *a;
        ga.out[0] = a->out[2], ga.out_dtype[0] = a->out_dtype[2];
        if (tanh_form ? launch_ew(&ga, g->n, a->in[1], NULL, gelu_tanh_fn()) : launch_ew(&ga, g->n, a->in[1], NULL, gelu_erf_fn()))
            return -1;
    }
    if (tanh_form) return launch_ew(a, g->n, a->in[0], a->in[1], gelu_tanh_bwd_fn());
    return launch_ew(a, g->n, a->in[0], a->in[1], gelu_erf_bwd_fn());
}

int tg_launch_tanh(const tg_cuda_op_args *a, tg_err *err) {
    return launch_ew(a, a->op->p.count.n, a->in[0], NULL, tanh_fn());
}

int tg_launch_tanh_bwd(const tg_cuda_op_args *a, tg_err *err) {
    return launch_ew(a, a->op->p.count.n, a->in[0], a->in[1], tanh_bwd_fn());
}

/* vec: 4-element accesses (a float4, or 8 bytes of a 16-bit type). */
template <class T>
static void launch_dropout(const tg_cuda_op_args *a, const float *step, int64_t n, float p, float scale,
                           unsigned blocks) {
    const T *x = (const T *)a->in[0];
    T *y = (T *)a->out[0];
    const int vec = tg_aligned(x, 4 * sizeof(T)) && tg_aligned(y, 4 * sizeof(T));
    dropout_kernel<T><<<blocks, EW_THREADS, 0, a->ctx->stream>>>(x, step, y, n, vec, a->ctx->seed,
                                                                (uint32_t)a->op->p.dropout.key, p, scale);
}

int tg_launch_dropout(const tg_cuda_op_args *a, tg_err *err) {
    const tg_dropout_params *dp = &a->op->p.dropout;
    const int64_t n = dp->n;
    if (n <= 0) return 0;
    const float p = dp->p;
    const int dt = a->out_dtype[0];
    if (!a->training || p <= 0.0f) { /* identity */
        if (a->out[0] == a->in[0]) return 0;
        const size_t bytes = (size_t)n * (size_t)tg_storage_bytes(dt);
        cudaError_t e = cudaMemcpyAsync(a->out[0], a->in[0], bytes, cudaMemcpyDeviceToDevice, a->ctx->stream);
        if (e != cudaSuccess) return tg_fail(err, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
        return 0;
    }
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; /* the CPU's expression */
    const float *step = (const float *)a->in[1];
    const unsigned blocks = tg_blocks((n + 3) / 4, EW_THREADS);
    if (dt == TG_BF16)
        launch_dropout<tg_bf16>(a, step, n, p, scale, blocks);
    else if (dt == TG_F16)
        launch_dropout<tg_f16>(a, step, n, p, scale, blocks);
    else
        launch_dropout<float>(a, step, n, p, scale, blocks);
    return 0;
}
