/* The CUDA executor behind the executor interface. The train step (forward, backward,
 * optimizer) and the eval forward are each captured once into a CUDA graph and replayed;
 * anything else runs op by op on the stream. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/executor.h"

typedef struct cuda_impl {
    tg_cuda_exec x;
    int use_graphs;
} cuda_impl;

static int cuda_run(void *impl, int first, int last, int training, tg_err *err) {
    cuda_impl *c = impl;
    if (c->use_graphs && first == TG_PHASE_FORWARD && last == TG_PHASE_OPTIMIZER && training)
        return tg_cuda_exec_graph(&c->x, 0, first, last, 1, err);
    if (c->use_graphs && first == TG_PHASE_FORWARD && last == TG_PHASE_FORWARD && !training)
        return tg_cuda_exec_graph(&c->x, 1, first, last, 0, err);
    return tg_cuda_exec_phases(&c->x, first, last, training, err);
}

static int cuda_write(void *impl, int tensor, const void *host, tg_err *err) {
    return tg_cuda_upload(&((cuda_impl *)impl)->x, tensor, host, err);
}

static int cuda_read(void *impl, int tensor, void *host, tg_err *err) {
    return tg_cuda_download(&((cuda_impl *)impl)->x, tensor, host, err);
}

static void *cuda_host_alloc(void *impl, size_t bytes) {
    void *p = NULL;
    return cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped) == cudaSuccess ? memset(p, 0, bytes), p : NULL;
}

static void cuda_host_free(void *impl, void *p) { cudaFreeHost(p); }

static int cuda_step_start(void *impl, const void *const *batches, int steps, tg_err *err) {
    cuda_impl *c = impl;
    return tg_cuda_step_start(&c->x, batches, steps, c->use_graphs, err);
}

static int cuda_step_wait(void *impl, tg_step_result *result, tg_err *err) {
    return tg_cuda_step_wait(&((cuda_impl *)impl)->x, result, err);
}

static int cuda_profile(void *impl, int repeats, double *op_ms, tg_err *err) {
    return tg_cuda_profile(&((cuda_impl *)impl)->x, repeats, op_ms, err);
}

static int cuda_select_bucket(void *impl, int bucket, tg_err *err) {
    return tg_cuda_exec_select_bucket(&((cuda_impl *)impl)->x, bucket, err);
}

static void cuda_close(void *impl) {
    tg_cuda_exec_free(&((cuda_impl *)impl)->x);
    free(impl);
}

/* One eager all-reduce and all-gather on every communicator, so that whatever NCCL still
 * sets up on first use (an NCCL without NCCL_RUNTIME_CONNECT) happens outside a capture. */
static int comms_warm_up(ncclComm_t *c, int ranks, tg_err *err) {
    float **buf = calloc((size_t)ranks, sizeof *buf);
    if (!buf) return tg_fail(err, "out of memory");
    const char *step = NULL;
    cudaError_t ce = cudaSuccess;
    ncclResult_t r = ncclSuccess;
    for (int k = 0; k < ranks && !step; k++)
        if ((ce = cudaSetDevice(k)) != cudaSuccess || (ce = cudaMalloc((void **)&buf[k], 2 * ranks * sizeof(float))) != cudaSuccess ||
            (ce = cudaMemset(buf[k], 0, 2 * ranks * sizeof(float))) != cudaSuccess)
            step = "cudaMalloc of the warm-up buffer";
    if (!step && (r = ncclGroupStart()) != ncclSuccess) step = "ncclGroupStart";
    for (int k = 0; k < ranks && !step; k++)
        if ((r = ncclAllReduce(buf[k], buf[k], 1, ncclFloat, ncclSum, c[k], 0)) != ncclSuccess ||
            (r = ncclAllGather(buf[k] + k, buf[k], 1, ncclFloat, c[k], 0)) != ncclSuccess)
            step = "ncclAllReduce/ncclAllGather";
    if (!step && (r = ncclGroupEnd()) != ncclSuccess) step = "ncclGroupEnd";
    for (int k = 0; k < ranks; k++) {
        if (!buf[k]) continue;
        cudaSetDevice(k);
        if (!step && (ce = cudaDeviceSynchronize()) != cudaSuccess) step = "cudaDeviceSynchronize";
        cudaFree(buf[k]);
    }
    free(buf);
    if (!step) return 0;
    return tg_fail(err, "warming up the NCCL communicators of %d GPUs: %s failed: %s", ranks, step,
                   r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(ce));
}

int tg_cuda_comms_create(void **comms, int ranks, tg_err *err) {
    int count = tg_cuda_device_count();
    if (ranks > count)
        return tg_fail(err, "%d data-parallel replicas need %d GPUs, %d present", ranks, ranks, count);
    ncclComm_t *c = calloc((size_t)ranks, sizeof *c);
    if (!c) return tg_fail(err, "out of memory");
    /* NVLink SHARP (multicast) stays off unless the environment asks for it: on shared
     * hosts a fault there can take the GPUs out of service. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    /* NCCL otherwise connects peers at a communicator's first collective, and when that
     * is inside a step graph's capture the connection fails ("operation not permitted when
     * stream is capturing"): whenever no eager step ran first (GEMM tuning off, or every
     * algorithm already in the cache). Connect at init instead. */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    /* Every collective of a run is captured in the step graphs (the warm-up below runs
     * before any graph and the GEMM tuning pass leaves the sums out), so NCCL need not
     * order captured against uncaptured launches. What it does for that puts external
     * event nodes into each graph: they keep the graph from device launch (the host then
     * queues every node, 116-210 us a step on an H100) and NCCL's guide reports such graphs
     * deadlocking when several GPUs' graphs are launched from one process, as the replicas'
     * threads do. */
    setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", 0);
    ncclResult_t r = ncclCommInitAll(c, ranks, NULL); /* replica r on GPU r */
    if (r != ncclSuccess) {
        free(c);
        return tg_fail(err, "ncclCommInitAll for %d GPUs failed: %s (%s)", ranks, ncclGetErrorString(r),
                       ncclGetLastError(NULL));
    }
    if (comms_warm_up(c, ranks, err)) {
        for (int k = 0; k < ranks; k++) ncclCommDestroy(c[k]);
        free(c);
        return -1;
    }
    for (int k = 0; k < ranks; k++) comms[k] = c[k];
    free(c);
    return 0;
}

void tg_cuda_comms_destroy(void **comms, int ranks) {
    for (int k = 0; k < ranks; k++)
        if (comms[k]) ncclCommDestroy((ncclComm_t)comms[k]), comms[k] = NULL;
}

int tg_cuda_built(void) { return 1; }

int tg_cuda_device_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define CUDA_VTBL_FUNCTIONS                                                                                            \
    .name = "cuda", .run = cuda_run, .write = cuda_write, .read = cuda_read, .host_alloc = cuda_host_alloc,            \
    .host_free = cuda_host_free, .step_start = cuda_step_start, .step_wait = cuda_step_wait, .profile = cuda_profile, \
    .close = cuda_close, .select_bucket = cuda_select_bucket, .max_in_flight = TG_STEP_RING - 1,                       \
    .step_group = TG_CUDA_STEP_GROUP

static const tg_executor_vtbl cuda_vtbl = {CUDA_VTBL_FUNCTIONS, .lm_label_rows = 1};
/* Plans with length buckets: a step fetches the next batch before the host has selected
 * that batch's bucket, so it cannot know where the batch's labels lie; the host writes
 * them all (executor.h). */
static const tg_executor_vtbl cuda_bucketed_vtbl = {CUDA_VTBL_FUNCTIONS, .lm_label_rows = 0};

int tg_executor_open_cuda(tg_executor *ex, const tg_plan *plan, const tg_executor_options *opts, tg_err *err) {
    cuda_impl *c = calloc(1, sizeof *c);
    if (!c) return tg_fail(err, "out of memory");
    const int replicas = plan->train.replicas;
    if (tg_cuda_exec_init_on(&c->x, plan, opts->seed, replicas > 1 ? opts->rank : 0, replicas > 1 ? opts->comm : NULL,
                             err)) {
        free(c);
        return -1;
    }
    c->use_graphs = opts->use_graphs;
    *ex = (tg_executor){plan, c->x.n_buckets > 1 ? &cuda_bucketed_vtbl : &cuda_vtbl, c, TG_DEVICE_CUDA};
    return 0;
}
