/* Elementwise ops: ZERO, FILL, ADD, GELU(_BWD), TANH(_BWD), DROPOUT.
 *
 * Memory bound, so one generic grid-stride kernel moves float4s when every pointer is
 * 16-byte aligned (tensors are 256-byte aligned) and finishes the numel % 4 tail with
 * scalars. Each element is read and written by one thread in one iteration, so outputs
 * may alias inputs (in-place dropout / accumulation). The formulas are the CPU's,
 * written with non-contracting intrinsics so the roundings match (transcendentals are
 * CUDA's, within 2 ulp of glibc's). Dropout draws its mask from the same counter-based
 * Philox stream as the CPU: Philox block g covers elements 4g..4g+3, which is exactly
 * one float4, and the step is read from device memory inside the kernel so a captured
 * graph sees each replay's step. */
#include "kernels/cuda_common.cuh"
#include "kernels/philox.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f
#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT_2PI 0.3989422804014327f

#define EW_THREADS 256

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

/* ---- kernels ----------------------------------------------------------------------- */

/* y = f(a, b) over n elements; b may be NULL (unary ops get 0). vec: all pointers
 * 16-byte aligned, so elements [0, 4*(n/4)) move as float4. */
template <class F>
__global__ void __launch_bounds__(EW_THREADS)
ew_kernel(const float *__restrict__ a, const float *__restrict__ b, float *__restrict__ y, int64_t n, int vec, F f) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n4 = vec ? n / 4 : 0;
    for (int64_t i = tid; i < n4; i += stride) {
        float4 va = reinterpret_cast<const float4 *>(a)[i];
        float4 vb = b ? reinterpret_cast<const float4 *>(b)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        float4 r;
        r.x = f(va.x, vb.x);
        r.y = f(va.y, vb.y);
        r.z = f(va.z, vb.z);
        r.w = f(va.w, vb.w);
        reinterpret_cast<float4 *>(y)[i] = r;
    }
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) y[i] = f(a[i], b ? b[i] : 0.0f);
}

__global__ void __launch_bounds__(EW_THREADS) fill_kernel(float *__restrict__ y, int64_t n, int vec, float v) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t n4 = vec ? n / 4 : 0;
    for (int64_t i = tid; i < n4; i += stride) reinterpret_cast<float4 *>(y)[i] = make_float4(v, v, v, v);
    for (int64_t i = n4 * 4 + tid; i < n; i += stride) y[i] = v;
}

/* One thread per Philox block (4 elements). */
__global__ void __launch_bounds__(EW_THREADS)
dropout_kernel(const float *__restrict__ x, const float *__restrict__ step_ptr, float *__restrict__ y, int64_t n,
               int vec, uint64_t seed, uint32_t key, float p, float scale) {
    const float s = step_ptr ? step_ptr[0] : 0.0f;
    const uint64_t step = s > 0.0f ? (uint64_t)s : 0;
    const int64_t groups = (n + 3) / 4;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += stride) {
        float u[4];
        tg_philox_uniform4(seed, step, key, (uint64_t)g, u);
        const int64_t e = g * 4;
        if (vec && e + 4 <= n) {
            float4 v = reinterpret_cast<const float4 *>(x)[g];
            v.x = u[0] >= p ? fmul(v.x, scale) : 0.0f;
            v.y = u[1] >= p ? fmul(v.y, scale) : 0.0f;
            v.z = u[2] >= p ? fmul(v.z, scale) : 0.0f;
            v.w = u[3] >= p ? fmul(v.w, scale) : 0.0f;
            reinterpret_cast<float4 *>(y)[g] = v;
        } else {
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (e + j < n) y[e + j] = u[j] >= p ? fmul(x[e + j], scale) : 0.0f;
        }
    }
}

/* ---- launchers ------------------------------------------------------------------- */

template <class F>
static int launch_ew(const tg_cuda_op_args *a, const void *in0, const void *in1, F f) {
    const int64_t n = a->op->i[0];
    if (n <= 0) return 0;
    const float *x = (const float *)in0, *b = (const float *)in1;
    float *y = (float *)a->out[0];
    const int vec = tg_aligned16(x) && tg_aligned16(b) && tg_aligned16(y);
    const int64_t items = vec ? n / 4 + (n & 3) : n;
    ew_kernel<F><<<tg_blocks(items, EW_THREADS), EW_THREADS, 0, a->ctx->stream>>>(x, b, y, n, vec, f);
    return 0;
}

int tg_launch_zero(const tg_cuda_op_args *a, tg_err *err) {
    if (!a->out[0] || a->out_numel[0] <= 0) return 0;
    cudaError_t e = cudaMemsetAsync(a->out[0], 0, (size_t)a->out_numel[0] * 4, a->ctx->stream);
    if (e != cudaSuccess) return tg_fail(err, "cudaMemsetAsync: %s", cudaGetErrorString(e));
    return 0;
}

int tg_launch_fill(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t n = a->out_numel[0];
    if (!a->out[0] || n <= 0) return 0;
    float *y = (float *)a->out[0];
    const int vec = tg_aligned16(y);
    fill_kernel<<<tg_blocks(vec ? n / 4 + 4 : n, EW_THREADS), EW_THREADS, 0, a->ctx->stream>>>(y, n, vec, a->op->f[0]);
    return 0;
}

int tg_launch_add(const tg_cuda_op_args *a, tg_err *err) { return launch_ew(a, a->in[0], a->in[1], add_fn()); }

int tg_launch_gelu(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->i[1] == TG_GELU_TANH) return launch_ew(a, a->in[0], NULL, gelu_tanh_fn());
    return launch_ew(a, a->in[0], NULL, gelu_erf_fn());
}

int tg_launch_gelu_bwd(const tg_cuda_op_args *a, tg_err *err) {
    if (a->op->i[1] == TG_GELU_TANH) return launch_ew(a, a->in[0], a->in[1], gelu_tanh_bwd_fn());
    return launch_ew(a, a->in[0], a->in[1], gelu_erf_bwd_fn());
}

int tg_launch_tanh(const tg_cuda_op_args *a, tg_err *err) { return launch_ew(a, a->in[0], NULL, tanh_fn()); }

int tg_launch_tanh_bwd(const tg_cuda_op_args *a, tg_err *err) {
    return launch_ew(a, a->in[0], a->in[1], tanh_bwd_fn());
}

int tg_launch_dropout(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t n = a->op->i[0];
    if (n <= 0) return 0;
    const float p = a->op->f[0];
    if (!a->training || p <= 0.0f) { /* identity */
        if (a->out[0] == a->in[0]) return 0;
        cudaError_t e = cudaMemcpyAsync(a->out[0], a->in[0], (size_t)n * 4, cudaMemcpyDeviceToDevice, a->ctx->stream);
        if (e != cudaSuccess) return tg_fail(err, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
        return 0;
    }
    const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; /* the CPU's expression */
    const float *x = (const float *)a->in[0];
    float *y = (float *)a->out[0];
    const int vec = tg_aligned16(x) && tg_aligned16(y);
    dropout_kernel<<<tg_blocks((n + 3) / 4, EW_THREADS), EW_THREADS, 0, a->ctx->stream>>>(
        x, (const float *)a->in[1], y, n, vec, a->ctx->seed, (uint32_t)a->op->i[1], p, scale);
    return 0;
}
