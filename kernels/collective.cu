/* ALL_REDUCE: the data-parallel replicas' sum of a tensor, in place; REDUCE_SCATTER (ZeRO-1):
 * the sums of each replica's slice to that replica; ALL_GATHER (ZeRO-1): every replica's
 * slice of a tensor to every replica, in place; through NCCL on the op's stream (captured
 * into the step graph like any kernel launch). */
#include <nccl.h>

#include "kernels/cuda_common.cuh"
#include "plan/op_meta.h"

int tg_launch_all_reduce(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t n = a->op->p.count.n;
    if (n <= 0) return 0;
    if (!a->ctx->nccl_comm) return 0; /* one replica: the sum over one is the tensor */
    /* The GEMM tuning pass's gradients are thrown away, and every collective of a run
     * stays inside the step graphs (runtime/cuda/executor_cuda.c says why). */
    if (a->ctx->gemm_tune) return 0;
    float *x = (float *)a->out[0];
    ncclResult_t r = ncclAllReduce(x, x, (size_t)n, ncclFloat, ncclSum, (ncclComm_t)a->ctx->nccl_comm, a->ctx->stream);
    if (r != ncclSuccess)
        return tg_fail(err, "ncclAllReduce of %lld floats failed: %s (%s)", (long long)n, ncclGetErrorString(r),
                       ncclGetLastError((ncclComm_t)a->ctx->nccl_comm));
    return 0;
}

/* One ncclReduce per replica whose slice the view meets, rooted at that replica, in one NCCL
 * group: each replica receives the sums of its own part (in place; NCCL leaves the others'
 * parts of a non-root's buffer untouched, as the op says). */
int tg_launch_reduce_scatter(const tg_cuda_op_args *a, tg_err *err) {
    const tg_reduce_scatter_params *p = &a->op->p.reduce_scatter;
    if (p->n <= 0 || !a->ctx->nccl_comm || a->ctx->gemm_tune) return 0; /* as ALL_REDUCE's */
    ncclComm_t comm = (ncclComm_t)a->ctx->nccl_comm;
    float *x = (float *)a->out[0];
    ncclResult_t r = ncclGroupStart();
    for (int k = 0; k < a->ctx->ranks && r == ncclSuccess; k++) {
        int64_t lo, len;
        tg_slice_part(p->n, p->first, p->slice, k, &lo, &len);
        if (len > 0) r = ncclReduce(x + lo, x + lo, (size_t)len, ncclFloat, ncclSum, k, comm, a->ctx->stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess) r = end;
    if (r != ncclSuccess)
        return tg_fail(err, "ncclReduce of the slices of %lld floats (from element %lld, slices of %lld) failed: %s (%s)",
                       (long long)p->n, (long long)p->first, (long long)p->slice, ncclGetErrorString(r),
                       ncclGetLastError(comm));
    return 0;
}

/* A gather from in1 without the other replicas (the GEMM tuning pass): this replica's slice
 * in place and zeros elsewhere, which are valid ids and rows for what reads the result. */
static int gather_alone(const tg_cuda_op_args *a, size_t bytes, tg_err *err) {
    uint8_t *x = (uint8_t *)a->out[0];
    const size_t total = (size_t)a->out_numel[0] * (size_t)tg_storage_bytes(a->out_dtype[0]);
    cudaError_t e = cudaMemsetAsync(x, 0, total, a->ctx->stream);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(x + (size_t)a->ctx->rank * bytes, a->in[1], bytes, cudaMemcpyDeviceToDevice, a->ctx->stream);
    if (e != cudaSuccess) return tg_fail(err, "gathering a slice without the other replicas failed: %s", cudaGetErrorString(e));
    return 0;
}

int tg_launch_all_gather(const tg_cuda_op_args *a, tg_err *err) {
    const int64_t slice = a->op->p.all_gather.slice;
    const int dt = a->out_dtype[0];
    const size_t bytes = (size_t)slice * (size_t)tg_storage_bytes(dt);
    if (slice <= 0) return 0;
    if (!a->ctx->nccl_comm || a->ctx->gemm_tune) /* one replica holds every slice */
        return a->in[1] ? gather_alone(a, bytes, err) : 0;
    if (dt != TG_F32 && dt != TG_BF16 && dt != TG_F16 && dt != TG_I32)
        return tg_fail(err, "all_gather of %s elements: NCCL is given f32, bf16, f16 or i32 only", tg_dtype_name(dt));
    const ncclDataType_t type = dt == TG_BF16 ? ncclBfloat16 : dt == TG_F16 ? ncclHalf : dt == TG_I32 ? ncclInt32 : ncclFloat;
    uint8_t *x = (uint8_t *)a->out[0];
    if (a->in[1]) { /* each replica's in1 into its slice of out0 */
        ncclResult_t r = ncclAllGather(a->in[1], x, (size_t)slice, type, (ncclComm_t)a->ctx->nccl_comm, a->ctx->stream);
        if (r != ncclSuccess)
            return tg_fail(err, "ncclAllGather of %lld-element slices failed: %s (%s)", (long long)slice,
                           ncclGetErrorString(r), ncclGetLastError((ncclComm_t)a->ctx->nccl_comm));
        return 0;
    }
    /* In place: each replica sends its own slice of the buffer it receives into. */
    ncclResult_t r = ncclAllGather(x + (size_t)a->ctx->rank * bytes, x, (size_t)slice, type,
                                   (ncclComm_t)a->ctx->nccl_comm, a->ctx->stream);
    if (r != ncclSuccess)
        return tg_fail(err, "ncclAllGather of %lld-element slices failed: %s (%s)", (long long)slice,
                       ncclGetErrorString(r), ncclGetLastError((ncclComm_t)a->ctx->nccl_comm));
    return 0;
}
