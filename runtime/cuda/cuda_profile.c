/* Profiling on the CUDA executor: every op of the schedule timed alone between events. */
#include <stdlib.h>

#include "runtime/cuda/cuda_exec_internal.h"

int tg_cuda_profile(tg_cuda_exec *x, int repeats, double *op_ms, tg_err *err) {
    const tg_plan *p = x->plan;
    int first = p->phase_begin[TG_PHASE_FORWARD], last = p->phase_begin[TG_PHASE_COUNT];
    if (tg_cuda_finish_update(x, err)) return -1;
    cudaEvent_t *ev = calloc((size_t)(last - first + 1), sizeof *ev);
    if (!ev) return tg_fail(err, "out of memory");
    int rc = 0;
    for (int i = 0; i <= last - first && !rc; i++)
        if (cudaEventCreate(&ev[i]) != cudaSuccess) rc = tg_fail(err, "cudaEventCreate failed");
    for (int o = first; o < last; o++) op_ms[o] = 0;
    cudaError_t e;
    for (int r = 0; r < repeats && !rc; r++) {
        if ((e = cudaEventRecord(ev[0], x->ctx.stream)) != cudaSuccess) rc = tg_cuda_fail(err, "cudaEventRecord", e);
        for (int o = first; o < last && !rc; o++) {
            rc = tg_cuda_exec_range(x, o, o + 1, 1, err);
            if (!rc && (e = cudaEventRecord(ev[o - first + 1], x->ctx.stream)) != cudaSuccess)
                rc = tg_cuda_fail(err, "cudaEventRecord", e);
        }
        if (!rc && (e = cudaStreamSynchronize(x->ctx.stream)) != cudaSuccess) rc = tg_cuda_fail(err, "the profile run", e);
        for (int o = first; o < last && !rc; o++) {
            float ms = 0;
            if ((e = cudaEventElapsedTime(&ms, ev[o - first], ev[o - first + 1])) != cudaSuccess)
                rc = tg_cuda_fail(err, "cudaEventElapsedTime", e);
            op_ms[o] += ms / repeats;
        }
    }
    for (int i = 0; i <= last - first; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    free(ev);
    return rc;
}
