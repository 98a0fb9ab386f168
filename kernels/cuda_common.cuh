/* Internal to the CUDA kernels (the kernels/ .cu files): the launcher declarations the dispatch
 * table in kernels/cuda_ops.cu points at, the per-op scratch sizes, and small device
 * helpers shared by several op families.
 *
 * Numerics: the CPU reference (runtime/cpu_ops.c) is built without FMA contraction, so
 * kernels that mirror its float expressions use the explicit __f*_rn intrinsics (which
 * nvcc never contracts) to reproduce its roundings; where the CPU accumulates in double,
 * so do we. Reductions use fixed partitions and fixed-order trees (never atomics on
 * floats), so every result is bitwise reproducible run to run. */
#ifndef TUNEGRAPH_CUDA_COMMON_CUH
#define TUNEGRAPH_CUDA_COMMON_CUH

#include <stdint.h>

#include <cuda_runtime.h>

#include "kernels/cuda_ops.h"

/* ---- launchers (one per op kind, all: 0, or -1 with err) --------------------------- */

typedef int (*tg_cuda_launcher)(const tg_cuda_op_args *a, tg_err *err);

/* elementwise.cu */
int tg_launch_zero(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_fill(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_add(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_gelu(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_gelu_bwd(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_tanh(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_tanh_bwd(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_dropout(const tg_cuda_op_args *a, tg_err *err);
/* embedding.cu */
int tg_launch_embedding(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_embedding_bwd(const tg_cuda_op_args *a, tg_err *err);
int64_t tg_scratch_embedding_bwd(const tg_op *op);
/* layernorm.cu */
int tg_launch_layernorm(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_layernorm_bwd(const tg_cuda_op_args *a, tg_err *err);
int64_t tg_scratch_layernorm_bwd(const tg_op *op);
/* attention.cu */
int tg_launch_attn_softmax(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_attn_softmax_bwd(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_heads_split(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_heads_merge(const tg_cuda_op_args *a, tg_err *err);
/* loss.cu */
int tg_launch_select_token(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_select_token_bwd(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_cross_entropy(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_cross_entropy_bwd(const tg_cuda_op_args *a, tg_err *err);
int64_t tg_scratch_cross_entropy(const tg_op *op);
int64_t tg_scratch_cross_entropy_bwd(const tg_op *op);
/* optimizer.cu */
int tg_launch_schedule(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_grad_norm(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_bias_grad(const tg_cuda_op_args *a, tg_err *err);
int tg_launch_adamw(const tg_cuda_op_args *a, tg_err *err);
int64_t tg_scratch_grad_norm(const tg_op *op, const int64_t *in_numel);
int64_t tg_scratch_bias_grad(const tg_op *op);

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

/* Sum over a block of BS threads (multiple of 32) in a fixed tree; the result is
 * returned to every thread. smem holds 32 doubles. Ends synchronised, so smem can be
 * reused right after. */
template <int BS>
static __device__ __forceinline__ double block_sum_d(double v, double *smem) {
    static_assert(BS % 32 == 0 && BS <= 1024, "block size");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_d(v);
    if (BS == 32) return v;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    double r = lane < BS / 32 ? smem[lane] : 0.0;
    r = warp_sum_d(r);
    __syncthreads();
    return r;
}

template <int BS>
static __device__ __forceinline__ int block_sum_i(int v, int *smem) {
    static_assert(BS % 32 == 0 && BS <= 1024, "block size");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_i(v);
    if (BS == 32) return v;
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    int r = lane < BS / 32 ? smem[lane] : 0;
    r = warp_sum_i(r);
    __syncthreads();
    return r;
}

#endif
