/* Fused attention through cuDNN 9's graph API, an optional backend of ATTENTION and
 * ATTENTION_BWD beside the own kernels (flash_attention_*.cu).
 *
 * cuDNN is loaded at run time (dlopen), never linked: TUNEGRAPH_CUDNN names the library
 * (default libcudnn.so.9 on the loader's path) and TUNEGRAPH_ATTENTION picks the backend:
 * `auto` (the default: cuDNN where it loads and takes the op, else the own kernels),
 * `own`, or `cudnn` (an op cuDNN should take and cannot is an error). cuDNN takes an op
 * with 16-bit storage, head dim 64 or 128 and no attention dropout (p == 0); everything
 * else runs the own kernels. A causal op's key mask is left out: a step's mask is ones then
 * zeros, so causality already hides the padding from every real row, and only padding
 * rows (which no loss or real row reads) change. Any other key mask enters as an additive
 * bias made from it at each launch (0 kept, a large finite negative masked): a row with no
 * kept key averages V where ATTENTION gives 0 (only padding rows, whose gradients are 0,
 * have none). Its results are ATTENTION's to the op's
 * tolerances (the same LSE, the natural log of the row's sum), not bit for bit, and its
 * backward sums dQ with atomics: runs are not bitwise reproducible with it
 * (TUNEGRAPH_ATTENTION=own is).
 *
 * Workspace: the backward's fp32 dQ accumulator and the key mask's bias live in the
 * reduction scratch (tg_cudnn_attention_scratch_floats, counted by the memory estimate), and cuDNN's own
 * workspace in the cuBLASLt workspace (ops on one stream run one at a time); an engine
 * that needs more than that is passed over. Execution plans are built while the executor
 * opens (tg_cudnn_attention_prepare), never inside a graph capture. */
#ifndef TUNEGRAPH_CUDNN_ATTENTION_H
#define TUNEGRAPH_CUDNN_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tg_cudnn_attention tg_cudnn_attention;

/* Opens the backend per TUNEGRAPH_ATTENTION and TUNEGRAPH_CUDNN: *out is NULL with the
 * reason in `why` when it is off or cuDNN does not load (not an error under `auto`).
 * Returns -1 (err) only when `cudnn` was asked for and cannot be had, or cuDNN loads and
 * fails to start. */
int tg_cudnn_attention_open(tg_cudnn_attention **out, char *why, size_t why_len, tg_err *err);
void tg_cudnn_attention_close(tg_cudnn_attention *dnn);

/* Whether an op's parameters and storage type let cuDNN take it (the shape rule above). */
int tg_cudnn_attention_eligible(const tg_op *op, int dtype);

/* Builds the execution plan of ATTENTION or ATTENTION_BWD op `op` with storage `dtype`
 * when eligible, keeping it for the op's launches: 1 cuDNN takes the op, 0 it does not
 * (ineligible, or no engine of cuDNN's supports it: the own kernels run it), -1 on error
 * (err; also when TUNEGRAPH_ATTENTION=cudnn and no engine takes an eligible op). */
int tg_cudnn_attention_prepare(tg_cudnn_attention *dnn, const tg_op *op, int dtype, size_t workspace_limit,
                               tg_err *err);

/* Runs the op through its prepared plan on a->ctx->stream: 1 done, 0 not taken (the
 * caller runs the own kernel), -1 on error (err). */
int tg_cudnn_attention_run(const tg_cuda_op_args *a, int backward, tg_err *err);

/* Floats of reduction scratch an ATTENTION or ATTENTION_BWD op needs when cuDNN may take
 * it: a non-causal op's key mask's 16-bit bias (room for B T T values), then the backward's fp32 dQ
 * accumulator (B H T Dh, T rounded up to 128) (plan/memory_estimate.c mirrors this). 0
 * otherwise. */
int64_t tg_cudnn_attention_scratch_floats(const tg_op *op);

/* How many prepared ops cuDNN takes. */
int tg_cudnn_attention_taken(const tg_cudnn_attention *dnn);

/* For logs: "cuDNN 9.x.y for n of m attention ops" once ops are prepared. */
void tg_cudnn_attention_describe(const tg_cudnn_attention *dnn, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
