/* Device memory as the CUDA runtime reports it, for the memory preflight and the measured
 * peak (runtime/preflight.c). */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "runtime/cuda/cuda_exec_internal.h"

int tg_cuda_memory_info(int device, uint64_t *free_bytes, uint64_t *total_bytes, tg_err *err) {
    /* The query creates the device's context: it must come with the executor's flags. */
    if (tg_cuda_select_device(device, err)) return -1;
    size_t free_b = 0, total_b = 0;
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tg_fail(err, "cannot read the free memory of GPU %d: %s: %s", device, cudaGetErrorName(e),
                       cudaGetErrorString(e));
    }
    *free_bytes = free_b, *total_bytes = total_b;
    return 0;
}

int tg_cuda_device_name(int device, char *name, size_t len) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    snprintf(name, len, "%s", prop.name);
    return 0;
}
