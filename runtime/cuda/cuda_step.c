/* The CUDA executor's training steps: the device work of one step (the staged batch taken,
 * the next one fetched beside the forward, the previous step's deferred update in chunks
 * beside the forward, the gradient sums beside the backward, phase stamps and the step's
 * statistics), captured into the one-step and the group graphs, and started behind the
 * steps in flight. Waiting for them is cuda_step_wait.c. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda/cuda_exec_internal.h"

/* Phase marker k: the GPU's timer into the mapped step report, by a one-thread kernel (a
 * kernel node in the graph: event nodes would keep the graph from device launch). */
static int mark(tg_cuda_exec *x, int k, tg_err *err) {
    if (tg_cuda_stamp(x->report, k, x->seq_dev, x->ctx.stream))
        return tg_cuda_fail(err, "phase marker", cudaGetLastError());
    return 0;
}

/* The previous step's update (when one is due) in chunks on the update stream, and this
 * step's forward on the main stream, each op after the chunks holding the parameters it
 * reads; the backward, which overwrites the gradients, after all of them. */
static int enqueue_forward_beside_update(tg_cuda_exec *x, tg_err *err) {
    const tg_deferred_update *u = &x->cur->defer;
    cudaStream_t s = x->ctx.stream;
    CUDA_TRY(cudaEventRecord(x->update_fork, s), "record the update branch's fork");
    CUDA_TRY(cudaStreamWaitEvent(x->update_stream, x->update_fork, 0), "fork of the update branch");
    for (int k = 0; k < u->n_chunks; k++) {
        if (tg_cuda_run_update(x, x->update_stream, u->begin[k], u->begin[k + 1], x->update_due, err)) return -1;
        /* The update is applied: its gate closes with the last chunk (this step's end opens
         * it again), so a step that fails after this point never has it applied twice. */
        if (k == u->n_chunks - 1 && tg_cuda_set_flag(x->update_due, 0, x->update_stream))
            return tg_cuda_fail(err, "closing the update gate", cudaGetLastError());
        CUDA_TRY(cudaEventRecord(x->chunk_done[k], x->update_stream), "record an update chunk's end");
    }
    const int f0 = x->plan->phase_begin[TG_PHASE_FORWARD];
    int done = 0;
    for (int j = 0; j < u->n_forward; j++) {
        if (u->chunks_before[j] > done) {
            done = u->chunks_before[j];
            CUDA_TRY(cudaStreamWaitEvent(s, x->chunk_done[done - 1], 0), "wait for an update chunk");
        }
        if (tg_cuda_run_ops(x, f0 + j, f0 + j + 1, 1, err)) return -1;
    }
    if (done < u->n_chunks) CUDA_TRY(cudaStreamWaitEvent(s, x->chunk_done[u->n_chunks - 1], 0), "join of the update");
    return 0;
}

/* The backward and the optimizer phase, less the AdamW when it is deferred; with
 * replicas, each gradient bucket's sum on the communication stream beside the backward.
 * A gather in the backward (an embedding's rows, tg_gather_embedding_grads) runs there too,
 * in order with the sums (the replicas' collectives on one communicator must not run
 * side by side on two streams), and the backward waits for it. */
static int enqueue_backward_and_optimizer(tg_cuda_exec *x, tg_err *err) {
    const tg_plan *p = x->plan;
    const int end = x->defer_on ? x->cur->defer.adamw_op : p->n_ops;
    const int b0 = p->phase_begin[TG_PHASE_BACKWARD], b1 = p->phase_begin[TG_PHASE_OPTIMIZER];
    int summing = 0, bucket = 0;
    for (int o = b0; o < b1; o++) {
        const int kind = p->ops[o].kind;
        if (x->comm_stream && kind == TG_OP_ALL_GATHER) {
            tg_cuda_op_args a;
            tg_cuda_ctx ctx;
            tg_cuda_op_args_on(x, o, x->comm_stream, &ctx, &a);
            CUDA_TRY(cudaEventRecord(x->comm_fork, x->ctx.stream), "record a gather's fork");
            CUDA_TRY(cudaStreamWaitEvent(x->comm_stream, x->comm_fork, 0), "fork of a gather");
            if (tg_cuda_op_run(&a, err)) return tg_fail_context(err, "schedule op %d", o);
            CUDA_TRY(cudaEventRecord(x->comm_done, x->comm_stream), "record a gather's end");
            CUDA_TRY(cudaStreamWaitEvent(x->ctx.stream, x->comm_done, 0), "join of a gather");
            continue;
        }
        if (!x->comm_stream || !tg_op_is_sum(kind)) {
            if (tg_cuda_run_ops(x, o, o + 1, 1, err)) return -1;
            continue;
        }
        tg_cuda_op_args a;
        tg_cuda_ctx ctx;
        tg_cuda_op_args_on(x, o, x->comm_stream, &ctx, &a);
        CUDA_TRY(cudaEventRecord(x->comm_fork, x->ctx.stream), "record a gradient sum's fork");
        CUDA_TRY(cudaStreamWaitEvent(x->comm_stream, x->comm_fork, 0), "fork of a gradient sum");
        /* The sum's begin and end stamps: the begin runs once the bucket is complete and
         * the sum before it has ended, so the stamps show when each sum could start and
         * what of it the backward did not hide (kernels/cuda_ops.h). */
        const int slot = bucket < TG_COMM_STAMP_MAX ? bucket : TG_COMM_STAMP_MAX - 1;
        if (bucket == slot && tg_cuda_stamp(x->report, TG_STAMP_COMM + 2 * slot, x->seq_dev, x->comm_stream))
            return tg_cuda_fail(err, "a gradient sum's begin stamp", cudaGetLastError());
        if (tg_cuda_op_run(&a, err)) return tg_fail_context(err, "schedule op %d", o);
        if ((bucket < TG_COMM_STAMP_MAX - 1 || bucket == x->comm_buckets - 1) &&
            tg_cuda_stamp(x->report, TG_STAMP_COMM + 2 * slot + 1, x->seq_dev, x->comm_stream))
            return tg_cuda_fail(err, "a gradient sum's end stamp", cudaGetLastError());
        CUDA_TRY(cudaEventRecord(x->comm_done, x->comm_stream), "record a gradient sum's end");
        summing = 1, bucket++;
    }
    if (mark(x, 2 + TG_PHASE_BACKWARD, err)) return -1;
    if (summing) CUDA_TRY(cudaStreamWaitEvent(x->ctx.stream, x->comm_done, 0), "join of the gradient sums");
    if (tg_cuda_run_ops(x, b1, end, 1, err)) return -1;
    return mark(x, 2 + TG_PHASE_OPTIMIZER, err);
}

/* One micro-step of a step with grad_accumulation (micro 1 .. micro_steps - 1; the
 * first is the step's own forward): micro-batch `micro` of the slot into the inputs pool,
 * its forward and backward (which add into the gradients), its loss into the window's,
 * each with its own dropout stream (runtime/executor.h); baked into the captured graph. */
static int enqueue_micro_step(tg_cuda_exec *x, int micro, tg_err *err) {
    const tg_plan *p = x->plan;
    cudaStream_t s = x->ctx.stream;
    const size_t bytes = p->pool_bytes[TG_POOL_INPUTS];
    if (bytes && tg_cuda_take_batch(x->staging + (size_t)micro * bytes, x->staging_stride, x->pool[TG_POOL_INPUTS],
                                    bytes, x->seq_dev, s))
        return tg_cuda_fail(err, "taking a micro-batch of the staged window", cudaGetLastError());
    const uint64_t seed = x->ctx.seed;
    x->ctx.seed = tg_micro_step_seed(seed, micro);
    int rc = tg_cuda_run_phases(x, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, err);
    x->ctx.seed = seed;
    if (rc) return -1;
    if (tg_cuda_loss_window(tg_cuda_tensor(x, p->io.loss), x->loss_window, 0, s))
        return tg_cuda_fail(err, "adding up the window's loss", cudaGetLastError());
    return 0;
}

/* The device work of one step, on the main stream: take the staged batch, fetch the next
 * one on a branch beside the schedule, run the schedule, publish the statistics. Captured
 * once when graphs are on (the fork and join events then become graph edges). With
 * grad_accumulation the staged batch is a window: its first micro-batch runs the forward
 * (the fetch beside it), the others forward and backward after the first's backward, and
 * the optimizer phase follows the last (marks: forward ends after the first forward,
 * backward after the last backward). */
static int enqueue_step(tg_cuda_exec *x, tg_err *err) {
    const tg_plan *p = x->plan;
    cudaStream_t s = x->ctx.stream;
    size_t bytes = p->pool_bytes[TG_POOL_INPUTS];
    const int micro = x->micro_steps > 1 ? x->micro_steps : 1;
    if (mark(x, 0, err)) return -1;
    if (bytes && tg_cuda_take_batch(x->staging, x->staging_stride, x->pool[TG_POOL_INPUTS], bytes, x->seq_dev, s))
        return tg_cuda_fail(err, "taking the staged batch", cudaGetLastError());
    if (mark(x, 1, err)) return -1;
    if (bytes) {
        CUDA_TRY(cudaEventRecord(x->fork, s), "record the fetch branch's fork");
        CUDA_TRY(cudaStreamWaitEvent(x->side_stream, x->fork, 0), "fork of the fetch branch");
        if (tg_cuda_fetch_batch(x->ctrl, x->staging, x->staging_stride, (size_t)micro * bytes, x->seq_dev,
                                x->cur->label_rows, x->side_stream))
            return tg_cuda_fail(err, "fetching the next batch", cudaGetLastError());
        CUDA_TRY(cudaEventRecord(x->join, x->side_stream), "record the fetch branch's join");
    }
    if ((x->defer_on ? enqueue_forward_beside_update(x, err)
                     : tg_cuda_run_phases(x, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, err)) ||
        mark(x, 2 + TG_PHASE_FORWARD, err))
        return -1;
    if (micro > 1) {
        /* The first micro-step's backward, then the rest of the window (the deferred update is
         * off for these plans: their optimizer phase ends by clearing the gradients). */
        if (tg_cuda_run_phases(x, TG_PHASE_BACKWARD, TG_PHASE_BACKWARD, 1, err)) return -1;
        if (tg_cuda_loss_window(tg_cuda_tensor(x, p->io.loss), x->loss_window, 1, s))
            return tg_cuda_fail(err, "adding up the window's loss", cudaGetLastError());
        for (int m = 1; m < micro; m++)
            if (enqueue_micro_step(x, m, err)) return -1;
        if (mark(x, 2 + TG_PHASE_BACKWARD, err) ||
            tg_cuda_run_ops(x, p->phase_begin[TG_PHASE_OPTIMIZER], p->n_ops, 1, err) ||
            mark(x, 2 + TG_PHASE_OPTIMIZER, err))
            return -1;
    } else if (enqueue_backward_and_optimizer(x, err))
        return -1;
    if (bytes) CUDA_TRY(cudaStreamWaitEvent(s, x->join, 0), "join of the fetch branch");
    const float *loss = micro > 1 ? x->loss_window : tg_cuda_tensor(x, p->io.loss);
    const float *scale = p->io.loss_scale >= 0 ? tg_cuda_tensor(x, p->io.loss_scale) : NULL;
    if (tg_cuda_step_end(loss, tg_cuda_tensor(x, p->io.lr), tg_cuda_tensor(x, p->io.grad_norm), scale, x->report,
                         x->seq_dev, x->defer_on ? x->update_due : NULL, s))
        return tg_cuda_fail(err, "publishing the step statistics", cudaGetLastError());
    return 0;
}

/* `*(int *)steps` steps in a row, for capture. */
static int enqueue_captured_steps(tg_cuda_exec *x, void *steps, tg_err *err) {
    for (int k = 0; k < *(int *)steps; k++)
        if (enqueue_step(x, err)) return -1;
    return 0;
}

/* Before a bucket's first step: one forward and backward, uncaptured, in which every GEMM shape
 * missing from the cache times cuBLASLt's candidates and keeps the fastest (the cache
 * file keeps the choice for later runs). Training state is untouched: forward and backward
 * write only activations and gradients, which the real step recomputes (batch norms leave
 * their running statistics as they are while ctx.gemm_tune is set; the backward
 * starts by zeroing the gradients; with grad_accumulation, which adds to them, they are
 * cleared after the pass). TUNEGRAPH_GEMM_TUNE=0 keeps the heuristic's picks;
 * TUNEGRAPH_GEMM_TUNE=log prints what each shape's timing found. */
static int gemm_tune_pass(tg_cuda_exec *x, tg_err *err) {
    const char *env = getenv("TUNEGRAPH_GEMM_TUNE");
    if (env && !strcmp(env, "0")) return 0;
    /* With buckets, the inputs pool may hold a batch laid out for another bucket (a step in
     * flight, or the last one): the pass reads zeros instead, which are valid ids, positions
     * and labels in every layout. The next step takes its own batch from the staging. */
    const size_t inputs = x->plan->pool_bytes[TG_POOL_INPUTS];
    if (x->n_buckets > 1 && inputs)
        CUDA_TRY(cudaMemsetAsync(x->pool[TG_POOL_INPUTS], 0, inputs, x->ctx.stream),
                 "clearing the inputs pool for the GEMM tuning pass");
    x->ctx.gemm_tune = env && !strcmp(env, "log") ? 2 : 1; /* log: one line per shape on stderr */
    int rc = tg_cuda_exec_phases(x, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, err);
    x->ctx.gemm_tune = 0;
    if (rc) return tg_fail_context(err, "in the GEMM tuning pass");
    /* With grad_accumulation the backward adds into the gradients, which the pass leaves
     * behind: the first window must start from zeros. */
    if (x->micro_steps > 1 && x->plan->pool_bytes[TG_POOL_GRADS])
        CUDA_TRY(cudaMemsetAsync(x->pool[TG_POOL_GRADS], 0, x->plan->pool_bytes[TG_POOL_GRADS], x->ctx.stream),
                 "clearing the gradients after the GEMM tuning pass");
    CUDA_TRY(cudaStreamSynchronize(x->ctx.stream), "the GEMM tuning pass");
    return 0;
}

/* The fetch kernel reads `next` through its own address, which only page-locked host
 * memory allows: checked once per buffer. */
static int check_host_image(tg_cuda_exec *x, const void *p, tg_err *err) {
    for (int k = 0; k < TG_STEP_RING; k++)
        if (x->checked_images[k] == p) return 0;
    struct cudaPointerAttributes attr;
    cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) return tg_cuda_fail(err, "cudaPointerGetAttributes of the next batch", e);
    if (attr.type != cudaMemoryTypeHost || attr.devicePointer != p)
        return tg_fail(err, "the next batch's host image is not page-locked memory mapped at its own address "
                            "(allocate it with the executor's host_alloc)");
    x->checked_images[x->n_checked++ % TG_STEP_RING] = p;
    return 0;
}

/* The graph for a start of `steps` steps: the group graph where it holds that many (or
 * none has been captured and steps > 1), else the one-step graph, to be launched `steps`
 * times. Captured on first use, the group graph before the one-step graph (captured
 * second, the group graph ran 0.14 ms slower per BERT step), and the one-step graph with
 * the first group, so that a run's last few steps never wait for a capture. */
static int step_graph_for(tg_cuda_exec *x, int steps, void **exec, int *launches, tg_err *err) {
    tg_cuda_bucket *b = x->cur;
    const int group = steps > 1 && (!b->group_steps || b->group_steps == steps);
    if (group && !b->group_graph) {
        if (tg_cuda_capture(x, enqueue_captured_steps, &steps, &b->group_graph, err)) return -1;
        b->group_steps = steps;
    }
    if (!b->step_graph) {
        int one = 1;
        if (tg_cuda_capture(x, enqueue_captured_steps, &one, &b->step_graph, err)) return -1;
        x->step_device_graph = x->device_graph;
    }
    *exec = group ? b->group_graph : b->step_graph, *launches = group ? 1 : steps;
    return 0;
}

int tg_cuda_step_start(tg_cuda_exec *x, const void *const *batches, int steps, int use_graph, tg_err *err) {
    size_t bytes = x->plan->pool_bytes[TG_POOL_INPUTS];
    long long pending = x->steps_started - x->steps_waited;
    if (steps < 1) return tg_fail(err, "a start of %d training steps", steps);
    if (pending + steps > TG_STEP_RING - 1)
        return tg_fail(err, "%lld training steps are in flight and %d more asked for, past the %d the step ring allows",
                       pending, steps, TG_STEP_RING - 1);
    for (int j = 1; j < steps; j++)
        if (!batches[j]) return tg_fail(err, "step %d of a start of %d has no batch", j + 1, steps);
    if (!x->cur->gemm_tuned) {
        x->cur->gemm_tuned = 1;
        if (gemm_tune_pass(x, err)) return -1;
    }
    double t0 = x->host_trace ? tg_thread_cpu_s() : 0;
    /* A batch the previous step did not fetch is uploaded into this step's slot first, in
     * stream order after the steps before it. */
    if (bytes && (!x->staged || x->staged != batches[0])) {
        uint8_t *slot = x->staging + (size_t)(x->steps_started & 1) * x->staging_stride;
        /* A window of micro-batches with grad_accumulation. */
        const size_t image = (size_t)(x->micro_steps > 1 ? x->micro_steps : 1) * bytes;
        CUDA_TRY(cudaMemcpyAsync(slot, batches[0], image, cudaMemcpyHostToDevice, x->ctx.stream), "upload of the batch");
        if (tg_cuda_derive_label_rows(slot, x->cur->label_rows, x->ctx.stream))
            return tg_cuda_fail(err, "deriving the uploaded batch's labels", cudaGetLastError());
    }
    /* Read by the steps' fetch kernels; the steps that read these entries last have ended,
     * being TG_STEP_RING steps back. */
    for (int j = 0; j < steps; j++) {
        if (batches[j + 1] && check_host_image(x, batches[j + 1], err)) return -1;
        ((volatile tg_step_ctrl *)x->ctrl)->next_batch[(x->steps_started + j) % TG_STEP_RING] = batches[j + 1];
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    tg_cuda_host_trace(x, 0, &t0);
    if (!use_graph) {
        for (int j = 0; j < steps; j++)
            if (enqueue_step(x, err)) return -1;
    } else {
        void *exec;
        int launches;
        if (step_graph_for(x, steps, &exec, &launches, err)) return -1;
        double w0 = x->host_trace ? tg_wall_s() : 0;
        for (int j = 0; j < launches; j++)
            CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)exec, x->ctx.stream), "cudaGraphLaunch");
        if (x->host_trace) x->host_launch_wall_s += tg_wall_s() - w0;
    }
    const double now = tg_wall_s();
    for (int j = 0; j < steps; j++) x->launch_s[(x->steps_started + j) % TG_STEP_RING] = now;
    x->steps_started += steps;
    x->update_pending = x->defer_on;
    x->staged = batches[steps];
    tg_cuda_host_trace(x, 1, &t0);
    return 0;
}
