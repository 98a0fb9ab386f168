/* ALL_REDUCE: the data-parallel replicas' sum of a tensor, in place, through NCCL on the
 * op's stream (captured into the step graph like any kernel launch). */
#include <nccl.h>

#include "kernels/cuda_common.cuh"

int tg_launch_all_reduce(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t n = a->op->i[0];
    if (n <= 0) return 0;
    if (!a->ctx->nccl_comm) return 0; /* one replica: the sum over one is the tensor */
    float *x = (float *)a->out[0];
    ncclResult_t r = ncclAllReduce(x, x, (size_t)n, ncclFloat, ncclSum, (ncclComm_t)a->ctx->nccl_comm, a->ctx->stream);
    if (r != ncclSuccess)
        return tg_fail(err, "ncclAllReduce of %lld floats failed: %s (%s)", (long long)n, ncclGetErrorString(r),
                       ncclGetLastError((ncclComm_t)a->ctx->nccl_comm));
    return 0;
}
