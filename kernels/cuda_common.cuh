/* Internal to the CUDA kernels (the kernels/ .cu files): the launcher declarations the dispatch
 * table in kernels/cuda_ops.cu points at, the per-op scratch sizes, and small device
 * helpers shared by several op families.
 *
 * Numerics: the CPU reference (runtime/cpu/) is built without FMA contraction, so
 * kernels that mirror its float expressions use the explicit __f*_rn intrinsics (which
 * nvcc never contracts) to reproduce its roundings; where the CPU accumulates in double,
 * so do we. Reductions use fixed partitions and fixed-order trees (never atomics on
 * floats), so every result is bitwise reproducible run to run.
 *
 * Storage types: a kernel's activation slots hold float, bf16 (__nv_bfloat16) or IEEE half
 * (__half, fp16 plans), "T", chosen per launch from the slot dtypes, which tg_cuda_op_run
 * checks against the op's dtype rules (kernels/README.md) before any launcher runs. 16-bit
 * values are widened to float on load (exact), every computation is the fp32 kernel's,
 * and results are narrowed with __float2bfloat16_rn / __float2half_rn on store, which is
 * what the CPU reference does
 * (runtime/cpu/op_run.c). tg_vec<T, W> moves W elements as one access. */
#ifndef TUNEGRAPH_CUDA_COMMON_CUH
#define TUNEGRAPH_CUDA_COMMON_CUH

#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda_ops.h"

/* ---- launchers (one per op kind, all: 0, or -1 with err) --------------------------- */

typedef int (*tg_cuda_launcher)(const tg_cuda_op_args *a, tg_err *err);

/* tg_launch_<name> for every row of plan/ops.def, defined in its family's .cu file
 * (elementwise, embedding, layernorm, attention, flash_attention_fwd/bwd, loss, collective,
 * optimizer, gemm). */
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) \
    int tg_launch_##name(const tg_cuda_op_args *a, tg_err *err);
#include "plan/ops.def"

/* ---- scratch sizes (floats), for tg_cuda_op_scratch_floats -------------------------- */

/* elementwise.cu */
int64_t tg_scratch_gelu_bwd(const tg_op *op);
/* RMSNORM_BWD: the dgamma column sums' double partials (kernels/llama.cu). */
int64_t tg_scratch_rmsnorm_bwd(const tg_op *op);
/* embedding.cu */
int64_t tg_scratch_embedding_bwd(const tg_op *op);
/* layernorm.cu: both backwards' scratch (the same column stages), from the op's M and D. */
int64_t tg_scratch_layernorm_bwd(int64_t M, int64_t D);
/* loss.cu */
int64_t tg_scratch_cross_entropy(const tg_op *op);
int64_t tg_scratch_cross_entropy_bwd(const tg_op *op);
/* optimizer.cu */
int64_t tg_scratch_grad_norm(const tg_op *op, const int64_t *in_numel);
int64_t tg_scratch_bias_grad(const tg_op *op);
/* gemm.cu: the scratch of a MATMUL with a fused bias gradient (its column-sum fallback). */
extern "C" int64_t tg_scratch_matmul(const tg_op *op);
/* conv.cu: CONV2D_BWD's weight and bias gradient partials; batchnorm.cu: the channel sums'
 * partials and table. */
extern "C" int64_t tg_scratch_conv2d_bwd(const tg_op *op);
extern "C" int64_t tg_scratch_batchnorm(const tg_op *op);
extern "C" int64_t tg_scratch_batchnorm_bwd(const tg_op *op);

/* ---- host helpers ----------------------------------------------------------------- */

/* Grid-stride loops never need more blocks than this (132 SMs x 16 resident blocks). */
#define TG_MAX_BLOCKS 2112

static inline unsigned tg_blocks(int64_t work_items, int threads) {
    int64_t b = (work_items + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > TG_MAX_BLOCKS) b = TG_MAX_BLOCKS;
    return (unsigned)b;
}

static inline int tg_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
static inline int tg_aligned8(const void *p) { return ((uintptr_t)p & 7u) == 0; }
/* p is aligned to `bytes` (a power of two). */
static inline int tg_aligned(const void *p, unsigned bytes) { return ((uintptr_t)p & (uintptr_t)(bytes - 1)) == 0; }

/* Checks the slot dtypes of one launch against the op's rules (kernels/cuda_ops.cu);
 * 0, or -1 with err "unsupported dtypes <slot>=<dtype> ...". */
int tg_check_dtypes(const tg_cuda_op_args *a, tg_err *err);

/* Checks that ctx->reduce_scratch holds `floats` floats (8-byte aligned for doubles). */
static inline int tg_scratch_check(const tg_cuda_op_args *a, int64_t floats, tg_err *err) {
    if (floats <= 0) return 0;
    if (!a->ctx->reduce_scratch || (int64_t)a->ctx->reduce_scratch_floats < floats)
        return tg_fail(err, "reduce scratch holds %lld floats, the op needs %lld",
                       (long long)a->ctx->reduce_scratch_floats, (long long)floats);
    if (((uintptr_t)a->ctx->reduce_scratch & 15u) != 0) return tg_fail(err, "reduce scratch is not 16-byte aligned");
    return 0;
}

/* ---- device helpers --------------------------------------------------------------- */

/* The dropout stream's step: the optimizer's step counter, read on the device so that a
 * captured graph sees each replay's value (0 when absent or not yet positive). */
static __device__ __forceinline__ uint64_t tg_dropout_step(const float *step_ptr) {
    const float s = step_ptr ? step_ptr[0] : 0.0f;
    return s > 0.0f ? (uint64_t)s : 0;
}

/* A parameter gradient's sum v into *p: += by default, = for the op that writes it first
 * (compiler/grad_writes.c). */
static __device__ __forceinline__ void tg_grad_store(float *p, float v, int overwrite) {
    *p = (overwrite ? 0.0f : *p) + v;
}

typedef __nv_bfloat16 tg_bf16;
typedef __half tg_f16;

/* The two 16-bit storage dtypes (bf16 and fp16 plans' activations and parameter copies). */
static inline int tg_dtype_half(int dtype) { return dtype == TG_BF16 || dtype == TG_F16; }
/* Bytes of one element of a float or 16-bit storage slot. */
static inline int tg_storage_bytes(int dtype) { return tg_dtype_half(dtype) ? 2 : 4; }

/* Element i of a float, bf16 or half array as float (exact), and the store back (round
 * to nearest even, as the CPU's tg_bf16_from_f32 / tg_f16_from_f32; half: past 65504 to
 * infinity, subnormals kept). */
static __device__ __forceinline__ float tg_ld(const float *p, int64_t i) { return p[i]; }
static __device__ __forceinline__ float tg_ld(const tg_bf16 *p, int64_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ float tg_ld(const tg_f16 *p, int64_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ void tg_st(float *p, int64_t i, float v) { p[i] = v; }
static __device__ __forceinline__ void tg_st(tg_bf16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
static __device__ __forceinline__ void tg_st(tg_f16 *p, int64_t i, float v) { p[i] = __float2half_rn(v); }

/* Two bf16 in one 32-bit word (element j in the low half, j+1 in the high half). */
static __device__ __forceinline__ float tg_bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
static __device__ __forceinline__ float tg_bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
static __device__ __forceinline__ uint32_t tg_bf16_pack(float lo, float hi) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
/* The same for two halves. */
static __device__ __forceinline__ float tg_f16_lo(uint32_t w) {
    return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
}
static __device__ __forceinline__ float tg_f16_hi(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }
static __device__ __forceinline__ uint32_t tg_f16_pack(float lo, float hi) {
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | ((uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16);
}

/* Pairs of a 16-bit storage type T in 32-bit words, by type, so code written once for
 * both formats unpacks and packs with the functions above. */
template <class T>
struct tg_h16;
template <>
struct tg_h16<tg_bf16> {
    static __device__ __forceinline__ float lo(uint32_t w) { return tg_bf16_lo(w); }
    static __device__ __forceinline__ float hi(uint32_t w) { return tg_bf16_hi(w); }
    static __device__ __forceinline__ uint32_t pack(float l, float h) { return tg_bf16_pack(l, h); }
    static __device__ __forceinline__ tg_bf16 from(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct tg_h16<tg_f16> {
    static __device__ __forceinline__ float lo(uint32_t w) { return tg_f16_lo(w); }
    static __device__ __forceinline__ float hi(uint32_t w) { return tg_f16_hi(w); }
    static __device__ __forceinline__ uint32_t pack(float l, float h) { return tg_f16_pack(l, h); }
    static __device__ __forceinline__ tg_f16 from(float v) { return __float2half_rn(v); }
};

/* What a T slot stores of v, read back as float: v itself, or v rounded to bf16 / half. */
template <class T>
struct tg_stored {
    static __device__ __forceinline__ float of(float v) { return v; }
};
template <>
struct tg_stored<tg_bf16> {
    static __device__ __forceinline__ float of(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
};
template <>
struct tg_stored<tg_f16> {
    static __device__ __forceinline__ float of(float v) { return __half2float(__float2half_rn(v)); }
};

/* W consecutive elements at vector index k (elements [k*W, k*W + W)) as one access:
 * float x4 = float4 (16 bytes), 16-bit x4 = uint2 (8 bytes), 16-bit x8 = uint4 (16 bytes);
 * the pointer must be aligned to the access. */
template <class T, int W>
struct tg_vec;
template <>
struct tg_vec<float, 1> {
    static __device__ __forceinline__ void load(const float *p, int64_t k, float (&v)[1]) { v[0] = p[k]; }
    static __device__ __forceinline__ void store(float *p, int64_t k, const float (&v)[1]) { p[k] = v[0]; }
};
template <>
struct tg_vec<float, 4> {
    static __device__ __forceinline__ void load(const float *p, int64_t k, float (&v)[4]) {
        float4 t = reinterpret_cast<const float4 *>(p)[k];
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    }
    static __device__ __forceinline__ void store(float *p, int64_t k, const float (&v)[4]) {
        reinterpret_cast<float4 *>(p)[k] = make_float4(v[0], v[1], v[2], v[3]);
    }
};
/* The 16-bit formats share one definition (tg_h16 converts). */
template <class T, int W>
struct tg_vec16;
template <class T>
struct tg_vec16<T, 1> {
    static __device__ __forceinline__ void load(const T *p, int64_t k, float (&v)[1]) { v[0] = tg_ld(p, k); }
    static __device__ __forceinline__ void store(T *p, int64_t k, const float (&v)[1]) { tg_st(p, k, v[0]); }
};
template <class T>
struct tg_vec16<T, 4> {
    static __device__ __forceinline__ void load(const T *p, int64_t k, float (&v)[4]) {
        uint2 t = reinterpret_cast<const uint2 *>(p)[k];
        v[0] = tg_h16<T>::lo(t.x), v[1] = tg_h16<T>::hi(t.x), v[2] = tg_h16<T>::lo(t.y), v[3] = tg_h16<T>::hi(t.y);
    }
    static __device__ __forceinline__ void store(T *p, int64_t k, const float (&v)[4]) {
        reinterpret_cast<uint2 *>(p)[k] = make_uint2(tg_h16<T>::pack(v[0], v[1]), tg_h16<T>::pack(v[2], v[3]));
    }
};
template <class T>
struct tg_vec16<T, 8> {
    static __device__ __forceinline__ void load(const T *p, int64_t k, float (&v)[8]) {
        uint4 t = reinterpret_cast<const uint4 *>(p)[k];
        v[0] = tg_h16<T>::lo(t.x), v[1] = tg_h16<T>::hi(t.x), v[2] = tg_h16<T>::lo(t.y), v[3] = tg_h16<T>::hi(t.y);
        v[4] = tg_h16<T>::lo(t.z), v[5] = tg_h16<T>::hi(t.z), v[6] = tg_h16<T>::lo(t.w), v[7] = tg_h16<T>::hi(t.w);
    }
    static __device__ __forceinline__ void store(T *p, int64_t k, const float (&v)[8]) {
        reinterpret_cast<uint4 *>(p)[k] = make_uint4(tg_h16<T>::pack(v[0], v[1]), tg_h16<T>::pack(v[2], v[3]),
                                                     tg_h16<T>::pack(v[4], v[5]), tg_h16<T>::pack(v[6], v[7]));
    }
};
template <int W>
struct tg_vec<tg_bf16, W> : tg_vec16<tg_bf16, W> {};
template <int W>
struct tg_vec<tg_f16, W> : tg_vec16<tg_f16, W> {};

/* Float arithmetic exactly as the CPU's (no FMA contraction). */
static __device__ __forceinline__ float fmul(float a, float b) { return __fmul_rn(a, b); }
static __device__ __forceinline__ float fadd(float a, float b) { return __fadd_rn(a, b); }
static __device__ __forceinline__ float fsub(float a, float b) { return __fsub_rn(a, b); }

static __device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v; /* every lane holds the same value: + is commutative bit for bit */
}

static __device__ __forceinline__ float warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

static __device__ __forceinline__ int warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* op over a block of BS threads (multiple of 32) in a fixed tree (the warp's xor
 * shuffles, then warp 0 over the warps' results, `identity` past them); the result is
 * returned to every thread. smem holds 32 values. Ends synchronised, so smem can be reused
 * right after. */
template <int BS, class V, class Warp>
static __device__ __forceinline__ V block_reduce(V v, V *smem, V identity, Warp warp_op) {
    static_assert(BS % 32 == 0 && BS <= 1024, "block size");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_op(v);
    if (BS == 32) return v;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    V r = lane < BS / 32 ? smem[lane] : identity;
    r = warp_op(r);
    __syncthreads();
    return r;
}

template <int BS>
static __device__ __forceinline__ double block_sum_d(double v, double *smem) {
    return block_reduce<BS>(v, smem, 0.0, warp_sum_d);
}

template <int BS>
static __device__ __forceinline__ int block_sum_i(int v, int *smem) {
    return block_reduce<BS>(v, smem, 0, warp_sum_i);
}

template <int BS>
static __device__ __forceinline__ float block_max_f(float v, float *smem) {
    return block_reduce<BS>(v, smem, -INFINITY, warp_max_f);
}

#endif
