/* The CUDA side of a CPU-only build: the executor cannot open and there are no devices.
 * A GPU build links runtime/cuda/ in place of this file. */
#include "runtime/executor.h"
#include "runtime/kernel_trace.h"

int tg_cuda_built(void) { return 0; }

int tg_cuda_device_count(void) { return 0; }

int tg_executor_open_cuda(tg_executor *ex, const tg_plan *plan, const tg_executor_options *opts, tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

int tg_cuda_comms_create(void **comms, int ranks, tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

void tg_cuda_comms_destroy(void **comms, int ranks) {}

int tg_cuda_comm_create_rank(void **comm, int rank, int ranks, int gpu, const char *master_addr, int master_port,
                             tg_err *err) {
    *comm = NULL;
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

int tg_cuda_comm_all_gather_bytes(void *comm, const void *mine, void *all, size_t bytes, tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

int tg_cuda_comm_device(void *comm) { return -1; }

int tg_cuda_comm_rank(void *comm) { return -1; }
int tg_cuda_comm_ranks(void *comm) { return -1; }

void tg_cuda_comm_abort(void *comm) {}

int tg_cuda_device_name(int device, char *name, size_t len) { return -1; }

int tg_cuda_memory_info(int device, uint64_t *free_bytes, uint64_t *total_bytes, tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

int tg_kernel_trace_start(tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

int tg_kernel_trace_stop(tg_kernel_span **spans, int64_t *n, tg_err *err) {
    *spans = NULL, *n = 0;
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

int tg_kernel_trace_unnamed(const char **names, int cap) { return 0; }
int tg_kernel_trace_by_name(const char **names, uint64_t *ns, int64_t *count, int cap) { return 0; }
