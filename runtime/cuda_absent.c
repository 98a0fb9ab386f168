/* The CUDA side of a CPU-only build: the executor cannot open and there are no devices.
 * A GPU build links runtime/cuda/ in place of this file. */
#include "runtime/executor.h"

int tg_cuda_built(void) { return 0; }

int tg_cuda_device_count(void) { return 0; }

int tg_executor_open_cuda(tg_executor *ex, const tg_plan *plan, const tg_executor_options *opts, tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

int tg_cuda_comms_create(void **comms, int ranks, tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}

void tg_cuda_comms_destroy(void **comms, int ranks) {}

int tg_cuda_device_name(int device, char *name, size_t len) { return -1; }

int tg_cuda_memory_info(int device, uint64_t *free_bytes, uint64_t *total_bytes, tg_err *err) {
    return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`)");
}
