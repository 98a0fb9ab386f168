/* Running the CUDA executor's schedule: each op's launch arguments, op ranges and phases
 * on the main stream (after any deferred update still pending), the deferred update's
 * AdamW launches, and phases captured once into a CUDA graph and replayed. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec_internal.h"
#include "runtime/nvtx.h"

/* The launch arguments of schedule op o, on the executor's context. */
void tg_cuda_op_args_of(tg_cuda_exec *x, int o, int training, tg_cuda_op_args *a) {
    const tg_plan *p = x->plan;
    memset(a, 0, sizeof *a);
    a->op = &p->ops[o];
    a->ctx = &x->ctx;
    a->training = training;
    tg_cuda_numels(p, a->op, a->in_numel, a->out_numel);
    for (int s = 0; s < TG_OP_MAX_IN; s++) {
        a->in[s] = tg_cuda_tensor(x, a->op->in[s]);
        a->in_dtype[s] = (int8_t)(a->op->in[s] >= 0 ? p->tensors[a->op->in[s]].dtype : TG_F32);
    }
    for (int s = 0; s < TG_OP_MAX_OUT; s++) {
        a->out[s] = tg_cuda_tensor(x, a->op->out[s]);
        a->out_dtype[s] = (int8_t)(a->op->out[s] >= 0 ? p->tensors[a->op->out[s]].dtype : TG_F32);
    }
}

/* Launches ops [first, last) on the main stream as they are (no pending update applied). */
/* Each op launched from here sits in an NVTX range named as the plan names it ("op 12
 * matmul bert.encoder.layer.0.attention.self.qkv"), inside its phase's range, so a
 * profiler's timeline of the GEMM tuning pass, the graph capture and the profile's op-by-op
 * steps reads like the plan (a replayed graph's kernels sit under their step's range). */
int tg_cuda_run_ops(tg_cuda_exec *x, int first, int last, int training, tg_err *err) {
    const tg_plan *p = x->plan;
    if (first < 0 || last > p->n_ops || first > last) return tg_fail(err, "op range [%d, %d) out of bounds", first, last);
    int phase = -1, rc = 0;
    for (int o = first; o < last && !rc; o++) {
        const tg_op *op = &p->ops[o];
        if (op->phase != phase) {
            if (phase >= 0) tg_nvtx_pop();
            phase = op->phase;
            tg_nvtx_push(tg_phase_name(phase));
        }
        const int out = op->out[0] >= 0 ? op->out[0] : op->in[0];
        tg_nvtx_pushf("op %d %s %s", o, tg_op_name(op->kind), out >= 0 ? p->tensors[out].name : "");
        tg_cuda_op_args a;
        tg_cuda_op_args_of(x, o, training, &a);
        if (tg_cuda_op_run(&a, err)) rc = tg_fail_context(err, "schedule op %d", o);
        tg_nvtx_pop();
    }
    if (phase >= 0) tg_nvtx_pop();
    return rc;
}

int tg_cuda_run_phases(tg_cuda_exec *x, int first_phase, int last_phase, int training, tg_err *err) {
    return tg_cuda_run_ops(x, x->plan->phase_begin[first_phase], x->plan->phase_begin[last_phase + 1], training, err);
}

/* The launch arguments of schedule op o (training) on another stream: *ctx is the
 * executor's context with that stream, and must live as long as *a is used. */
void tg_cuda_op_args_on(tg_cuda_exec *x, int o, cudaStream_t stream, tg_cuda_ctx *ctx, tg_cuda_op_args *a) {
    tg_cuda_op_args_of(x, o, 1, a);
    *ctx = x->ctx;
    ctx->stream = stream;
    a->ctx = ctx;
}

/* Parameter elements [first, end) of the plan's update (AdamW or Adan), on `stream`, gated by `gate`. */
int tg_cuda_run_update(tg_cuda_exec *x, cudaStream_t stream, int64_t first, int64_t end, const int *gate,
                       tg_err *err) {
    tg_cuda_op_args a;
    tg_cuda_ctx ctx;
    tg_cuda_op_args_on(x, x->cur->defer.adamw_op, stream, &ctx, &a);
    const char *op = tg_op_name(a.op->kind);
    if ((a.op->kind == TG_OP_ADAN ? tg_cuda_adan_range : tg_cuda_adamw_range)(&a, first, end, gate, err))
        return tg_fail_context(err, "deferred %s over parameters [%lld, %lld)", op, (long long)first, (long long)end);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return tg_fail(err, "deferred %s over parameters [%lld, %lld): launch failed: %s", op, (long long)first,
                       (long long)end, cudaGetErrorString(e));
    return 0;
}

int tg_cuda_finish_update(tg_cuda_exec *x, tg_err *err) {
    if (!x->update_pending) return 0;
    /* The pending update may be another bucket's step's: the selected bucket's AdamW is the
     * same op on the same tensors. */
    const tg_deferred_update *u = &x->cur->defer;
    if (tg_cuda_run_update(x, x->ctx.stream, 0, u->begin[u->n_chunks], x->update_due, err)) return -1;
    CUDA_TRY(cudaMemsetAsync(x->update_due, 0, sizeof *x->update_due, x->ctx.stream), "clearing the update flag");
    x->update_pending = 0;
    return 0;
}

int tg_cuda_exec_range(tg_cuda_exec *x, int first, int last, int training, tg_err *err) {
    if (tg_cuda_finish_update(x, err)) return -1;
    return tg_cuda_run_ops(x, first, last, training, err);
}

int tg_cuda_exec_phases(tg_cuda_exec *x, int first_phase, int last_phase, int training, tg_err *err) {
    return tg_cuda_exec_range(x, x->plan->phase_begin[first_phase], x->plan->phase_begin[last_phase + 1], training, err);
}

/* Captures what `body` enqueues on the main stream into an instantiated graph. */
int tg_cuda_capture(tg_cuda_exec *x, int (*body)(tg_cuda_exec *, void *, tg_err *), void *arg, void **exec_out,
                   tg_err *err) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CUDA_TRY(cudaStreamBeginCapture(x->ctx.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    int rc = body(x, arg, err);
    cudaError_t e = cudaStreamEndCapture(x->ctx.stream, &graph);
    if (rc) {
        if (graph) cudaGraphDestroy(graph);
        return tg_fail_context(err, "while capturing the step graph");
    }
    if (e != cudaSuccess) return tg_cuda_fail(err, "cudaStreamEndCapture", e);
    /* Instantiated for device launch where the graph allows it (kernel and memcpy nodes
     * only) and uploaded once: its launch is then one command for the whole graph, where
     * a plain graph's launch queues every node from the host. Otherwise a plain graph. */
    x->device_graph = 0;
    if (!getenv("TUNEGRAPH_HOST_GRAPH") &&
        cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagDeviceLaunch) == cudaSuccess &&
        cudaGraphUpload(exec, x->ctx.stream) == cudaSuccess) {
        x->device_graph = 1;
    } else {
        if (exec) cudaGraphExecDestroy(exec), exec = NULL;
        (void)cudaGetLastError();
        e = cudaGraphInstantiate(&exec, graph, 0);
    }
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return tg_cuda_fail(err, "cudaGraphInstantiate", e);
    *exec_out = exec;
    return 0;
}

typedef struct phases_args {
    int first, last, training;
} phases_args;

static int enqueue_phases(tg_cuda_exec *x, void *arg, tg_err *err) {
    const phases_args *a = arg;
    return tg_cuda_run_phases(x, a->first, a->last, a->training, err);
}

int tg_cuda_exec_graph(tg_cuda_exec *x, int slot, int first_phase, int last_phase, int training, tg_err *err) {
    if (slot < 0 || slot > 1) return tg_fail(err, "graph slot %d", slot);
    if (tg_cuda_finish_update(x, err)) return -1;
    void **exec = &x->cur->graph_exec[slot];
    if (!*exec) {
        phases_args args = {first_phase, last_phase, training};
        if (tg_cuda_capture(x, enqueue_phases, &args, exec, err)) return -1;
    }
    CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)*exec, x->ctx.stream), "cudaGraphLaunch");
    return 0;
}
