/* The CUDA executor: pools allocated once with cudaMalloc, the schedule launched op by op
 * on one stream or captured once into a CUDA graph and replayed. */
#ifndef TUNEGRAPH_CUDA_EXEC_H
#define TUNEGRAPH_CUDA_EXEC_H

#include <stdint.h>

#include "kernels/cuda_ops.h"
#include "tunegraph/error.h"
#include "tunegraph/plan.h"

typedef struct tg_cuda_exec {
    const tg_plan *plan;
    int device;
    uint8_t *pool[TG_POOL_COUNT];  /* device memory */
    tg_cuda_ctx ctx;
    tg_param_segment *segments_dev;
    void *graph_exec[2];           /* cudaGraphExec_t: [0] train step, [1] eval forward */
    void *step_graph;              /* cudaGraphExec_t of the pipelined train step */
    /* Step pipeline: the batch goes host (pinned) -> input_staging on copy_stream; the step
     * copies it into the inputs pool first, then signals inputs_consumed, so the next
     * upload can start while the rest of the step runs. */
    cudaStream_t copy_stream;
    uint8_t *input_staging;        /* device, inputs-pool sized */
    cudaEvent_t copy_done, inputs_consumed, step_done;
    /* Phase boundaries inside the step, GPU timer stamps written by kernel nodes into
     * mapped pinned memory: start, batch in place, end of forward, backward, optimizer. */
    unsigned long long *stamps_host;
    float *stats_host;             /* mapped pinned: loss, lr, grad norm of the last step */
    int device_graph;              /* the last captured graph was instantiated for device launch */
    int step_device_graph;         /* the step graph was */
    /* Host CPU seconds (this thread) inside the step calls, by part, when
     * TUNEGRAPH_HOST_TRACE is set: upload+events, graph launch, step_done record, wait,
     * read-back; printed to stderr when the executor is freed. */
    int gemm_tuned;                /* the GEMM tuning pass has run (before the first step) */
    int host_trace;
    double host_cpu_s[5];
    double host_launch_wall_s;
    int64_t host_steps;
} tg_cuda_exec;

/* Allocates pools (zeroed), the cuBLASLt handle and workspace, the AdamW segment table. */
int tg_cuda_exec_init(tg_cuda_exec *x, const tg_plan *plan, uint64_t seed, tg_err *err);
void tg_cuda_exec_free(tg_cuda_exec *x);

void *tg_cuda_tensor(const tg_cuda_exec *x, int tensor);

/* Launches ops [first, last) on the executor's stream (no capture). */
int tg_cuda_exec_range(tg_cuda_exec *x, int first, int last, int training, tg_err *err);
int tg_cuda_exec_phases(tg_cuda_exec *x, int first_phase, int last_phase, int training, tg_err *err);

/* Captures phases [first, last] into graph slot `slot` once; replays it after. */
int tg_cuda_exec_graph(tg_cuda_exec *x, int slot, int first_phase, int last_phase, int training, tg_err *err);

/* Starts a training step on a pinned host image of the inputs pool; with use_graph the
 * whole step (input copy, forward, backward, optimizer, stats read-back) is one graph. */
int tg_cuda_step_start(tg_cuda_exec *x, const void *inputs, int use_graph, tg_err *err);
/* Waits for it (blocking, no spinning); stats = {loss, lr, grad norm, then the GPU ms of
 * the phases: batch copy, forward, backward, optimizer}. */
int tg_cuda_step_wait(tg_cuda_exec *x, float stats[7], tg_err *err);

/* Times every op of the schedule (forward, backward, optimizer) on the current inputs,
 * launched one by one between events, averaged over `repeats` runs: op_ms[op index]. The
 * runs update the weights like training steps do. */
int tg_cuda_profile(tg_cuda_exec *x, int repeats, double *op_ms, tg_err *err);

/* Host <-> device copies of a whole tensor, synchronous (tests, weights, results). */
int tg_cuda_upload(tg_cuda_exec *x, int tensor, const void *host, tg_err *err);
int tg_cuda_download(tg_cuda_exec *x, int tensor, void *host, tg_err *err);
int tg_cuda_sync(tg_cuda_exec *x, tg_err *err);

/* Name and memory of device 0, for reports. */
int tg_cuda_device_name(char *buf, int len);

#endif
