/* The CUDA executor behind the executor interface. The train step (forward, backward,
 * optimizer) and the eval forward are each captured once into a CUDA graph and replayed;
 * anything else runs op by op on the stream. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec.h"
#include "runtime/executor.h"
#include "runtime/nvtx.h"

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

/* A start that first runs the bucket's GEMM tuning pass or captures its step graphs (both
 * inside tg_cuda_step_start) gets an NVTX range saying so, inside the trainer's launch range. */
static int cuda_step_start(void *impl, const void *const *batches, int steps, tg_err *err) {
    cuda_impl *c = impl;
    const tg_cuda_bucket *b = c->x.cur;
    const int tune = !b->gemm_tuned, capture = c->use_graphs && (!b->step_graph || (steps > 1 && !b->group_graph));
    if (tune || capture)
        tg_nvtx_push(tune && capture ? "GEMM tuning pass, graph capture" : tune ? "GEMM tuning pass" : "graph capture");
    const int rc = tg_cuda_step_start(&c->x, batches, steps, c->use_graphs, err);
    if (tune || capture) tg_nvtx_pop();
    return rc;
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
 * sets up on first use (an NCCL without NCCL_RUNTIME_CONNECT) happens outside a capture.
 * comms[k] runs on the GPU it was made for (replica threads: GPU k; a rank process: its
 * own). */
static int comms_warm_up(ncclComm_t *c, int ranks, tg_err *err) {
    float **buf = calloc((size_t)ranks, sizeof *buf);
    int *dev = calloc((size_t)ranks, sizeof *dev), world = 1;
    if (!buf || !dev) return free(buf), free(dev), tg_fail(err, "out of memory");
    const char *step = NULL;
    cudaError_t ce = cudaSuccess;
    ncclResult_t r = ncclSuccess;
    for (int k = 0; k < ranks && !step; k++)
        if ((r = ncclCommCuDevice(c[k], &dev[k])) != ncclSuccess || (r = ncclCommCount(c[k], &world)) != ncclSuccess)
            step = "ncclCommCuDevice/ncclCommCount";
        else if ((ce = cudaSetDevice(dev[k])) != cudaSuccess ||
                 (ce = cudaMalloc((void **)&buf[k], 2 * (size_t)world * sizeof(float))) != cudaSuccess ||
                 (ce = cudaMemset(buf[k], 0, 2 * (size_t)world * sizeof(float))) != cudaSuccess)
            step = "cudaMalloc of the warm-up buffer";
    if (!step && (r = ncclGroupStart()) != ncclSuccess) step = "ncclGroupStart";
    for (int k = 0; k < ranks && !step; k++)
        if ((r = ncclAllReduce(buf[k], buf[k], 1, ncclFloat, ncclSum, c[k], 0)) != ncclSuccess ||
            (r = ncclAllGather(buf[k] + world, buf[k], 1, ncclFloat, c[k], 0)) != ncclSuccess)
            step = "ncclAllReduce/ncclAllGather";
    if (!step && (r = ncclGroupEnd()) != ncclSuccess) step = "ncclGroupEnd";
    for (int k = 0; k < ranks; k++) {
        if (!buf[k]) continue;
        cudaSetDevice(dev[k]);
        if (!step && (ce = cudaDeviceSynchronize()) != cudaSuccess) step = "cudaDeviceSynchronize";
        cudaFree(buf[k]);
    }
    free(buf), free(dev);
    if (!step) return 0;
    return tg_fail(err, "warming up the NCCL communicators of %d GPUs: %s failed: %s", ranks, step,
                   r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(ce));
}

/* What NCCL must do on these machines whatever the launch: see tg_cuda_comms_create. */
static void nccl_settings(void) {
    /* NVLink SHARP (multicast) stays off unless the environment asks for it: on shared
     * hosts a fault there can take the GPUs out of service. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    /* NCCL otherwise connects peers at a communicator's first collective, and when that
     * is inside a step graph's capture the connection fails ("operation not permitted when
     * stream is capturing"): whenever no eager step ran first (GEMM tuning off, or every
     * algorithm already in the cache). Connect at init instead. */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    /* Every collective of a run is captured in the step graphs (the warm-up runs before
     * any graph and the GEMM tuning pass leaves the sums out), so NCCL need not order
     * captured against uncaptured launches. What it does for that puts external event
     * nodes into each graph: they keep the graph from device launch (the host then queues
     * every node, 116-210 us a step on an H100) and NCCL's guide reports such graphs
     * deadlocking when several GPUs' graphs are launched from one process, as the
     * replicas' threads do. */
    setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", 0);
}

int tg_cuda_comms_create(void **comms, int ranks, tg_err *err) {
    int count = tg_cuda_device_count();
    if (ranks > count)
        return tg_fail(err, "%d data-parallel replicas need %d GPUs, %d present", ranks, ranks, count);
    ncclComm_t *c = calloc((size_t)ranks, sizeof *c);
    if (!c) return tg_fail(err, "out of memory");
    nccl_settings();
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

/* The bootstrap address of a launched world: NCCL_COMM_ID where the launcher or the user
 * set it, else the master's address with the port after MASTER_PORT (torchrun's agent
 * holds MASTER_PORT itself). Every rank derives the same one, so no unique id needs to
 * travel between the processes; rank 0 hosts NCCL's bootstrap root there. */
static int bootstrap_address(const char *master_addr, int master_port, char *out, size_t cap, tg_err *err) {
    const char *set = getenv("NCCL_COMM_ID");
    if (set && *set) {
        snprintf(out, cap, "%s", set);
        return 0;
    }
    if (!master_addr || !*master_addr || master_port <= 0)
        return tg_fail(err, "the launcher gave no MASTER_ADDR and MASTER_PORT for NCCL's bootstrap: set them (or "
                            "NCCL_COMM_ID=host:port, the same on every rank)");
    if (master_port >= 65535)
        return tg_fail(err, "MASTER_PORT %d leaves no port after it for NCCL's bootstrap: set NCCL_COMM_ID=host:port",
                       master_port);
    snprintf(out, cap, "%s:%d", master_addr, master_port + 1);
    setenv("NCCL_COMM_ID", out, 1); /* what ncclGetUniqueId reads */
    return 0;
}

int tg_cuda_comm_create_rank(void **comm, int rank, int ranks, int gpu, const char *master_addr, int master_port,
                             tg_err *err) {
    *comm = NULL;
    const int count = tg_cuda_device_count();
    if (gpu < 0 || gpu >= count)
        return tg_fail(err, "rank %d of %d: GPU %d asked for, %d visible", rank, ranks, gpu, count);
    char where[320];
    if (bootstrap_address(master_addr, master_port, where, sizeof where, err)) return -1;
    nccl_settings();
    cudaError_t ce = cudaSetDevice(gpu);
    if (ce != cudaSuccess) return tg_fail(err, "rank %d: cudaSetDevice(%d) failed: %s", rank, gpu, cudaGetErrorString(ce));
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    ncclComm_t c = NULL;
    if (r == ncclSuccess) r = ncclCommInitRank(&c, ranks, id, rank);
    if (r != ncclSuccess)
        return tg_fail(err, "rank %d of %d (GPU %d): NCCL's bootstrap at %s (NCCL_COMM_ID) failed: %s (%s)", rank,
                       ranks, gpu, where, ncclGetErrorString(r), ncclGetLastError(c));
    if (comms_warm_up(&c, 1, err)) {
        ncclCommAbort(c);
        return -1;
    }
    *comm = c;
    return 0;
}

int tg_cuda_comm_all_gather_bytes(void *comm, const void *mine, void *all, size_t bytes, tg_err *err) {
    ncclComm_t c = comm;
    int dev = 0, ranks = 1;
    ncclResult_t r = ncclCommCuDevice(c, &dev);
    if (r == ncclSuccess) r = ncclCommCount(c, &ranks);
    if (r != ncclSuccess) return tg_fail(err, "reading the NCCL communicator's GPU: %s", ncclGetErrorString(r));
    uint8_t *buf = NULL;
    const char *step = NULL;
    cudaError_t ce = cudaSetDevice(dev);
    if (ce != cudaSuccess) step = "cudaSetDevice";
    else if ((ce = cudaMalloc((void **)&buf, bytes * (size_t)(ranks + 1))) != cudaSuccess) step = "cudaMalloc";
    else if ((ce = cudaMemcpy(buf + bytes * (size_t)ranks, mine, bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
        step = "cudaMemcpy to the GPU";
    else if ((r = ncclAllGather(buf + bytes * (size_t)ranks, buf, bytes, ncclUint8, c, 0)) != ncclSuccess)
        step = "ncclAllGather";
    else if ((ce = cudaStreamSynchronize(0)) != cudaSuccess) step = "cudaStreamSynchronize";
    else if ((ce = cudaMemcpy(all, buf, bytes * (size_t)ranks, cudaMemcpyDeviceToHost)) != cudaSuccess)
        step = "cudaMemcpy from the GPU";
    if (buf) cudaFree(buf);
    if (!step) return 0;
    return tg_fail(err, "gathering %zu bytes from every rank: %s failed: %s", bytes, step,
                   r != ncclSuccess ? ncclGetErrorString(r) : cudaGetErrorString(ce));
}

int tg_cuda_comm_device(void *comm) {
    int dev = 0;
    return comm && ncclCommCuDevice((ncclComm_t)comm, &dev) == ncclSuccess ? dev : -1;
}

int tg_cuda_comm_rank(void *comm) {
    int rank = 0;
    return comm && ncclCommUserRank((ncclComm_t)comm, &rank) == ncclSuccess ? rank : -1;
}

int tg_cuda_comm_ranks(void *comm) {
    int n = 0;
    return comm && ncclCommCount((ncclComm_t)comm, &n) == ncclSuccess ? n : -1;
}

void tg_cuda_comm_abort(void *comm) {
    if (comm) ncclCommAbort((ncclComm_t)comm);
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
    /* A replica runs on its communicator's GPU: GPU r for replica thread r, the rank's own
     * for a process of a launched world. */
    const int gpu = replicas > 1 ? tg_cuda_comm_device(opts->comm) : 0;
    if (gpu < 0) {
        free(c);
        return tg_fail(err, "replica %d: its NCCL communicator names no GPU", opts->rank);
    }
    if (tg_cuda_exec_init_on(&c->x, plan, opts->seed, gpu, replicas > 1 ? opts->comm : NULL, err)) {
        free(c);
        return -1;
    }
    c->use_graphs = opts->use_graphs;
    *ex = (tg_executor){plan, c->x.n_buckets > 1 ? &cuda_bucketed_vtbl : &cuda_vtbl, c, TG_DEVICE_CUDA};
    return 0;
}
