/* Internal to the CUDA executor (runtime/cuda/): what its files share. cuda_exec.c opens
 * and closes the executor and copies tensors; cuda_gemm_cache_file.c keeps the GEMM
 * algorithm choices across runs; cuda_launch.c launches the schedule op by op and captures
 * phases into graphs; cuda_step.c enqueues and starts pipelined training steps;
 * cuda_step_wait.c waits for them; cuda_profile.c times ops one by one. */
#ifndef TUNEGRAPH_CUDA_EXEC_INTERNAL_H
#define TUNEGRAPH_CUDA_EXEC_INTERNAL_H

#include <cuda_runtime_api.h>

#include "base/clock.h"
#include "runtime/cuda/cuda_exec.h"

/* Waiting: sleep until a margin (at least WAIT_MARGIN_S, adapted) before the expected end,
 * then look every WAIT_POLL_S; the margin exceeds the interval, so a step ending when
 * expected is seen at most one interval late. The thread's timer slack is lowered
 * meanwhile so that the sleeps end on time. After WAIT_POLLS looks the interval doubles
 * (to at most WAIT_POLL_MAX_S) and the stream is asked every WAIT_QUERY_S, so a failed
 * step is reported instead of waited for; with nothing else queued, the stream's
 * blocking synchronisation takes over. */
#define WAIT_MARGIN_S 40e-6 /* covers the launch latency and the statistics kernel */
#define WAIT_POLL_S 12e-6
#define WAIT_POLLS 16
#define WAIT_POLL_MAX_S 1e-3
#define WAIT_QUERY_S 2e-3

/* -1, with err "<what> failed: <CUDA error name>: <its text>". */
int tg_cuda_fail(tg_err *err, const char *what, cudaError_t e);
/* Makes `device` the calling thread's current device, asking for blocking waits before
 * its context is created. */
int tg_cuda_select_device(int device, tg_err *err);

/* Returns -1 with err naming `what` and the CUDA error when `call` fails. */
#define CUDA_TRY(call, what)                                           \
    do {                                                               \
        cudaError_t e_ = (call);                                       \
        if (e_ != cudaSuccess) return tg_cuda_fail(err, what, e_);     \
    } while (0)

/* Element counts of op's input (and, with out_n, output) slots; 0 for unused slots. */
void tg_cuda_numels(const tg_plan *p, const tg_op *op, int64_t *in_n, int64_t *out_n);

/* ---- launching (cuda_launch.c) ------------------------------------------------------ */

/* The launch arguments of schedule op o, on the executor's context. */
void tg_cuda_op_args_of(tg_cuda_exec *x, int o, int training, tg_cuda_op_args *a);
/* The launch arguments of schedule op o (training) on another stream: *ctx is the
 * executor's context with that stream, and must live as long as *a is used. */
void tg_cuda_op_args_on(tg_cuda_exec *x, int o, cudaStream_t stream, tg_cuda_ctx *ctx, tg_cuda_op_args *a);
/* Launches ops [first, last) on the main stream as they are (no pending update applied). */
int tg_cuda_run_ops(tg_cuda_exec *x, int first, int last, int training, tg_err *err);
int tg_cuda_run_phases(tg_cuda_exec *x, int first_phase, int last_phase, int training, tg_err *err);
/* Parameter elements [first, end) of the plan's AdamW, on `stream`, gated by `gate`. */
int tg_cuda_run_update(tg_cuda_exec *x, cudaStream_t stream, int64_t first, int64_t end, const int *gate,
                       tg_err *err);
/* Captures what `body` enqueues on the main stream into an instantiated graph (for device
 * launch where the graph allows it: x->device_graph says which). */
int tg_cuda_capture(tg_cuda_exec *x, int (*body)(tg_cuda_exec *, void *, tg_err *), void *arg, void **exec_out,
                    tg_err *err);

/* ---- the GEMM algorithm cache file (cuda_gemm_cache_file.c) ------------------------- */

/* Imports the file's choices for this GPU and cuBLASLt, if there is one. */
void tg_cuda_gemm_cache_load(tg_cuda_exec *x);
/* Writes the cache when this run chose algorithms the file did not have. */
void tg_cuda_gemm_cache_save(tg_cuda_exec *x);

/* ---- the host trace (TUNEGRAPH_HOST_TRACE) ------------------------------------------- */

/* Adds the thread CPU time since *t0 to part k of the host trace and restarts *t0. */
static inline void tg_cuda_host_trace(tg_cuda_exec *x, int k, double *t0) {
    if (!x->host_trace) return;
    double t = tg_thread_cpu_s();
    x->host_cpu_s[k] += t - *t0;
    *t0 = t;
}

#endif
