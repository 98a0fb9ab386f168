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

/* Host <-> device copies of a whole tensor, synchronous (tests, weights, results). */
int tg_cuda_upload(tg_cuda_exec *x, int tensor, const void *host, tg_err *err);
int tg_cuda_download(tg_cuda_exec *x, int tensor, void *host, tg_err *err);
int tg_cuda_sync(tg_cuda_exec *x, tg_err *err);

/* Name and memory of device 0, for reports. */
int tg_cuda_device_name(char *buf, int len);

#endif
