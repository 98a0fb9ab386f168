/* The CUDA executor's per-op entry point. Every op kind has one launcher in the table in
 * kernels/cuda_ops.cu (statically asserted against TG_OP_COUNT); each launches on the
 * given stream, never allocates and never synchronises, so a whole schedule can be
 * captured into one CUDA graph. Device numerics follow runtime/cpu/, the oracle. */
#ifndef TUNEGRAPH_CUDA_OPS_H
#define TUNEGRAPH_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "base/error.h"
#include "plan/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One parameter segment of the contiguous params/grads/m/v buffers (device table for
 * the multi-tensor AdamW). */
typedef struct tg_param_segment {
    int64_t offset;   /* in elements */
    int64_t numel;
    int32_t decay;    /* 0 for TG_TENSOR_NO_DECAY */
    int32_t pad;
} tg_param_segment;

typedef struct tg_gemm_cache tg_gemm_cache;

/* State shared by all launches of one executor; owned by runtime/cuda/cuda_exec.c. */
typedef struct tg_cuda_ctx {
    cudaStream_t stream;
    void *cublaslt;                 /* cublasLtHandle_t */
    void *gemm_workspace;           /* device memory for cuBLASLt */
    size_t gemm_workspace_bytes;
    tg_gemm_cache *gemm_cache;      /* algorithm per GEMM shape, chosen once at load */
    int allow_tf32;
    const tg_param_segment *segments; /* device array for ADAMW */
    int32_t n_segments;
    float *reduce_scratch;          /* device scratch for block partial sums */
    size_t reduce_scratch_floats;
    uint64_t seed;                  /* dropout stream seed */
    /* Set by the executor for one untimed, uncaptured pass whose results are discarded:
     * a GEMM shape not yet in the cache times cuBLASLt's top candidates (and, for a fused
     * bias gradient, the epilogue against the plain product plus the column sums; a GELU
     * epilogue's form is never timed, see kernels/gemm.cu) and caches the fastest.
     * Otherwise the heuristic's first choice is taken. */
    int gemm_tune;
    void *nccl_comm;                /* ncclComm_t joining the data-parallel replicas, or NULL */
    void *cudnn;                    /* tg_cudnn_attention (kernels/cudnn_attention.h), or NULL: the own attention kernels */
    int rank;                       /* this replica's (0 for one): its ZeRO-1 slice */
    int ranks;                      /* the replicas on nccl_comm (1 without one): a replica alone holds every slice */
} tg_cuda_ctx;

typedef struct tg_cuda_op_args {
    const tg_op *op;
    void *in[TG_OP_MAX_IN];           /* device pointers, NULL for unused slots */
    void *out[TG_OP_MAX_OUT];
    int64_t in_numel[TG_OP_MAX_IN];
    int64_t out_numel[TG_OP_MAX_OUT];
    int8_t in_dtype[TG_OP_MAX_IN];    /* tg_dtype of each slot; TG_F32 where unused */
    int8_t out_dtype[TG_OP_MAX_OUT];
    int training;                     /* 0: dropout is the identity */
    tg_cuda_ctx *ctx;
} tg_cuda_op_args;

/* Launches one op. Returns 0, or -1 with err naming the op and the CUDA/cuBLASLt error. */
int tg_cuda_op_run(const tg_cuda_op_args *a, tg_err *err);

/* Floats of ctx->reduce_scratch an op needs (deterministic multi-block reductions write
 * fixed-order partials there); the executor sizes the scratch as the maximum. */
int64_t tg_cuda_op_scratch_floats(const tg_op *op, const int64_t *in_numel);

/* Step bookkeeping as kernel nodes (kernels/step_io.cu), so a captured step holds only
 * kernel nodes and can be instantiated for device launch. Each returns 0, or -1 when the
 * launch failed (cudaGetLastError says why).
 *
 * The batch pipeline: two device staging slots of `stride` bytes each. Step number
 * *seq (a device counter of finished steps) takes its batch from slot seq & 1 into the
 * inputs pool (take_batch) and, on a branch beside the forward, copies the next batch
 * from pinned host memory into slot (seq + 1) & 1 (fetch_batch, reading the host pointer
 * the host left in ctrl->next_batch[seq % TG_STEP_RING], nothing when it is NULL).
 * Phase stamps and statistics go to report->step[seq % TG_STEP_RING] in mapped host
 * memory; step_end then publishes report->done = seq + 1 and advances *seq. Up to
 * TG_STEP_RING steps may be queued before the host reads the oldest one's record. */
#define TG_STEP_RING 16

typedef struct tg_step_ctrl {
    const void *next_batch[TG_STEP_RING]; /* pinned host image of the step after, or NULL */
} tg_step_ctrl;

/* Data parallelism: stamps[TG_STAMP_COMM + 2 j] and [TG_STAMP_COMM + 2 j + 1] are the
 * begin and end of gradient bucket j's sum on the communication stream; buckets from
 * TG_COMM_STAMP_MAX - 1 on share the last pair (the begin of the first of them, the end of
 * the last). */
#define TG_COMM_STAMP_MAX 32
#define TG_STAMP_COMM 5

typedef struct tg_step_record {
    float loss, lr, grad_norm;
    float loss_scale; /* fp16 plans: the dynamic loss scale after the step; 0 in others */
    /* GPU timer: start, batch in place, end of forward, backward, optimizer; then the
     * gradient buckets' sums */
    unsigned long long stamps[TG_STAMP_COMM + 2 * TG_COMM_STAMP_MAX];
} tg_step_record;

typedef struct tg_step_report {
    tg_step_record step[TG_STEP_RING];
    unsigned long long done; /* steps finished: the record of step n (from 0) is complete once done > n */
} tg_step_report;

int tg_cuda_stamp(tg_step_report *report, int k, const long long *seq, cudaStream_t s);
int tg_cuda_take_batch(const uint8_t *staging, size_t stride, uint8_t *inputs, size_t bytes, const long long *seq,
                       cudaStream_t s);
/* Where an LM batch's ids, mask (float) and labels sit in an image of the inputs pool, so
 * that the labels of rows marked TG_LABELS_FROM_IDS (plan/ops.h) are derived on the
 * device; rows = 0: the plan has none to derive. */
typedef struct tg_lm_label_rows {
    size_t ids, mask, labels; /* byte offsets in the image */
    int rows, seq;
} tg_lm_label_rows;

/* Also derives the marked label rows of the batch it fetched. */
int tg_cuda_fetch_batch(const tg_step_ctrl *ctrl, uint8_t *staging, size_t stride, size_t bytes, const long long *seq,
                        tg_lm_label_rows label_rows, cudaStream_t s);
/* Derives the marked label rows of a batch image in device memory (one uploaded, not
 * fetched). */
int tg_cuda_derive_label_rows(uint8_t *image, tg_lm_label_rows label_rows, cudaStream_t s);
/* grad_accumulation: *sum = *loss for a window's first micro-step (first 1), else *sum +=
 * *loss, in float, in the micro-steps' order (the CPU executor adds them alike). */
int tg_cuda_loss_window(const float *loss, float *sum, int first, cudaStream_t s);
/* *flag = value, as a kernel node (the deferred update's gate, cleared once its chunks ran). */
int tg_cuda_set_flag(int *flag, int value, cudaStream_t s);
/* update_due (device, or NULL): set to 1, marking this step's deferred update as due.
 * loss_scale (device, or NULL: the record says 0): fp16 plans' io.loss_scale, read after
 * the step's LOSS_SCALE_UPDATE. */
int tg_cuda_step_end(const float *loss, const float *lr, const float *norm, const float *loss_scale,
                     tg_step_report *report, long long *seq, int *update_due, cudaStream_t s);

/* TG_OP_ADAMW (kernels/optimizer.cu) over parameter elements [first, end) only (first a
 * multiple of 4), on a->ctx->stream; with `gate` (device), the launch does nothing while
 * *gate is 0. The executor's deferred update (runtime/deferred_update.h) runs a step's
 * update this way, in chunks beside the next step's forward. */
int tg_cuda_adamw_range(const tg_cuda_op_args *a, int64_t first, int64_t end, const int *gate, tg_err *err);
/* The same for TG_OP_ADAN. */
int tg_cuda_adan_range(const tg_cuda_op_args *a, int64_t first, int64_t end, const int *gate, tg_err *err);

/* GEMM (kernels/gemm.cu): TG_OP_MATMUL's row-major batched C = alpha op(A) op(B) (+ bias)
 * (+ C) runs through cuBLASLt with fp32 compute (TF32 only when allowed), its algorithm per
 * shape from this cache. */
int tg_gemm_cache_create(tg_gemm_cache **cache, tg_err *err);
void tg_gemm_cache_destroy(tg_gemm_cache *cache);
/* The cache as bytes (malloc'd), for a file keyed by GPU and cuBLASLt version, and back.
 * Imported algorithms are checked with cublasLtMatmulAlgoCheck before their first use;
 * one that no longer fits is chosen again. */
int tg_gemm_cache_export(const tg_gemm_cache *cache, void **bytes, size_t *len);
int tg_gemm_cache_import(tg_gemm_cache *cache, const void *bytes, size_t len);
/* Entries chosen in this process (not imported); entries imported. */
int tg_gemm_cache_new_entries(const tg_gemm_cache *cache);
int tg_gemm_cache_imported(const tg_gemm_cache *cache);
/* Entries for MATMUL's GELU epilogue act (tg_matmul_params.activation): run as the
 * cuBLASLt epilogue (fallback 0) or as the plain product plus the GELU kernel (fallback 1). */
int tg_gemm_cache_act_entries(const tg_gemm_cache *cache, int act, int fallback);

#ifdef __cplusplus
}
#endif
#endif
