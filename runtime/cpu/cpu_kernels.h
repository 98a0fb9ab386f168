/* What the CPU reference kernels (the files of runtime/cpu/, one per op family) share: the
 * kernel of each op kind, the parallel loops, and the helpers that must give the same bits
 * in more than one kernel. Private to runtime/cpu/.
 * Reductions that cross threads (parameter gradients, norms, losses) are split so every
 * sum runs in a fixed order, making results independent of the thread count. */
#ifndef TUNEGRAPH_CPU_KERNELS_H
#define TUNEGRAPH_CPU_KERNELS_H

#include <math.h>
#include <stdint.h>

#include "base/bf16.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/threadpool.h"

#define F32(p) ((float *)(p))
#define CF32(p) ((const float *)(p))
#define CI32(p) ((const int32_t *)(p))

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The kernel of each op kind, tg_cpu_kernel_<name> (plan/ops.def), declared from the op
 * list so that a kind without a kernel fails to link; op_run.c indexes them by kind. */
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) \
    void tg_cpu_kernel_##name(const tg_cpu_op_args *a);
#include "plan/ops.def"

/* ---- parallel loops ------------------------------------------------------------------ */

/* Runs fn(a, begin, end) over [0, n) in blocks of a few thousand elements, in parallel:
 * the elementwise ops, memory bound, want large chunks (elementwise.c). */
typedef void (*tg_cpu_range_fn)(const tg_cpu_op_args *a, int64_t begin, int64_t end);
void tg_cpu_elementwise_parallel(const tg_cpu_op_args *a, int64_t n, tg_cpu_range_fn fn);

/* out[j] (+= when acc, else =) the sum over rows of x[r, j], x row-major [rows, cols], in
 * double, parallel over columns so each sum runs in row order (matmul.c): BIAS_GRAD,
 * MATMUL's and GELU_BWD's fused bias gradients, which sum the same values in the same
 * order and so give the same bits on a zeroed gradient. */
void tg_cpu_colsum(const tg_cpu_op_args *a, const float *x, float *out, int64_t rows, int64_t cols, int acc);

/* ---- shared numerics ----------------------------------------------------------------- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* The tanh GELU and its derivative, shared by GELU(_BWD) and MATMUL's GELU epilogues so
 * the fused and separate forms give the same bits. */
static inline float gelu_tanh(float v) { return 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_C * v * v * v))); }
static inline float gelu_tanh_grad(float v) {
    float t = tanhf(GELU_K * (v + GELU_C * v * v * v));
    float du = GELU_K * (1.0f + 3.0f * GELU_C * v * v);
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

/* The step a dropout draws at, from the optimizer's step counter (f32 [1], may be NULL). */
static inline uint64_t step_counter(const float *s) { return s && s[0] > 0 ? (uint64_t)s[0] : 0; }

/* DROPOUT of elements e0 .. e0+n-1 of a tensor (x and y point at element e0; they may
 * alias): y = x * (1 / (1 - p)) where the element's draw is >= p, else 0 (elementwise.c;
 * the residual LayerNorms and the attention softmax draw the same stream through it). */
void tg_cpu_dropout_elements(uint64_t seed, uint64_t step, uint32_t key, float p, int64_t e0, int64_t n,
                             const float *x, float *y);

/* v as an output slot of dtype `dtype` stores it: rounded to bf16 (nearest even) in bf16
 * slots, so a kernel that reads back what it wrote reads what is stored. */
static inline void round_as_stored(float *v, int64_t n, int dtype) {
    if (dtype != TG_BF16) return;
    for (int64_t i = 0; i < n; i++) v[i] = tg_f32_from_bf16(tg_bf16_from_f32(v[i]));
}

#endif
