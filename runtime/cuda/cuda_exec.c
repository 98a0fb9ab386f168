/* The CUDA executor's state: opening it (pools, streams, cuBLASLt, the AdamW segment table,
 * the deferred update's stream and events, the batch staging and the step report, the LM
 * label rows) and closing it, tensor addresses, and synchronous host <-> device copies.
 * Running the schedule is in cuda_launch.c, training steps in cuda_step.c and
 * cuda_step_wait.c. */
#include <cublasLt.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cudnn_attention.h"
#include "plan/memory_estimate.h"
#include "runtime/cuda/cuda_exec_internal.h"
#include "runtime/executor.h"
#include "runtime/step_timeout.h"


int tg_cuda_fail(tg_err *err, const char *what, cudaError_t e) {
    return tg_fail(err, "%s failed: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int tg_cuda_select_device(int device, tg_err *err) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return tg_cuda_fail(err, "cudaSetDevice", e);
    /* Waiting for a step sleeps instead of spinning, so the host CPU per step stays small.
     * The flag takes effect only while the device's context does not exist yet, so every
     * first use of a device (the memory preflight's query too) comes through here. */
    (void)cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    (void)cudaGetLastError();
    return 0;
}

void *tg_cuda_tensor(const tg_cuda_exec *x, int tensor) {
    if (tensor < 0) return NULL;
    const tg_tensor *t = &x->plan->tensors[tensor];
    return x->pool[t->pool] ? x->pool[t->pool] + t->offset : NULL;
}

static int by_segment_offset(const void *a, const void *b) {
    const tg_param_segment *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int build_segments(tg_cuda_exec *x, tg_err *err) {
    const tg_plan *p = x->plan;
    int n = 0;
    /* Views alias parameters that have their own segment (AdamW updates each once). */
    for (int t = 0; t < p->n_tensors; t++)
        n += (p->tensors[t].flags & TG_TENSOR_PARAM) && !(p->tensors[t].flags & TG_TENSOR_VIEW);
    tg_param_segment *host = calloc((size_t)n, sizeof *host);
    if (!host) return tg_fail(err, "out of memory");
    n = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x2 = &p->tensors[t];
        if (!(x2->flags & TG_TENSOR_PARAM) || (x2->flags & TG_TENSOR_VIEW)) continue;
        host[n].offset = (int64_t)(x2->offset / sizeof(float));
        host[n].numel = tg_tensor_numel(x2);
        host[n].decay = !(x2->flags & TG_TENSOR_NO_DECAY);
        n++;
    }
    /* The kernel finds segments by binary search over offsets; packed groups place their
     * members out of tensor order (query, key, value weights, then their biases). */
    qsort(host, (size_t)n, sizeof *host, by_segment_offset);
    cudaError_t e = cudaMalloc((void **)&x->segments_dev, sizeof *host * (size_t)n);
    if (e == cudaSuccess) e = cudaMemcpy(x->segments_dev, host, sizeof *host * (size_t)n, cudaMemcpyHostToDevice);
    free(host);
    if (e != cudaSuccess) return tg_cuda_fail(err, "upload of the AdamW segment table", e);
    x->ctx.segments = x->segments_dev;
    x->ctx.n_segments = n;
    return 0;
}

void tg_cuda_numels(const tg_plan *p, const tg_op *op, int64_t *in_n, int64_t *out_n) {
    for (int s = 0; s < TG_OP_MAX_IN; s++) in_n[s] = op->in[s] >= 0 ? tg_tensor_numel(&p->tensors[op->in[s]]) : 0;
    if (out_n)
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            out_n[s] = op->out[s] >= 0 ? tg_tensor_numel(&p->tensors[op->out[s]]) : 0;
}

/* The stream of the gradient sums, and the count of a step's sums, for their stamps. At
 * the default priority: at the highest (the graphs instantiated to keep node priorities)
 * BERT's two-GPU step took the same time (docs/perf-notes.md). */
/* TUNEGRAPH_STEP_TIMEOUT_S (runtime/step_timeout.h). */
static int read_step_timeout(tg_cuda_exec *x, tg_err *err) {
    return tg_step_timeout_s(&x->step_timeout_s, err);
}

static cudaError_t create_comm_stream(tg_cuda_exec *x) {
    const tg_plan *p = x->plan;
    for (int o = p->phase_begin[TG_PHASE_BACKWARD]; o < p->phase_begin[TG_PHASE_OPTIMIZER]; o++)
        x->comm_buckets += tg_op_is_sum(p->ops[o].kind);
    return cudaStreamCreateWithFlags(&x->comm_stream, cudaStreamNonBlocking);
}

/* Plans the deferred update of every bucket and creates its stream, flag and events
 * (chunk events for the bucket with the most chunks); leaves it off where a bucket's plan
 * does not allow it or TUNEGRAPH_DEFERRED_UPDATE=0. */
static int deferred_update_init(tg_cuda_exec *x, tg_err *err) {
    const char *env = getenv("TUNEGRAPH_DEFERRED_UPDATE");
    if (env && !strcmp(env, "0")) return 0;
    const tg_plan *p = x->plan;
    /* fp16 plans: off. The update unscales with this step's loss scale and LOSS_SCALE_UPDATE
     * moves the scale after it; deferred beside the next forward, the update would run
     * after LOSS_SCALE_UPDATE (which stays in the step) and unscale with the moved scale.
     * tg_deferred_update_plan refuses such plans anyway (the update is not the last op);
     * this says why. */
    if (p->train.precision == TG_PREC_FP16) return 0;
    /* The parameter count (every bucket's): the plan's AdamW is its last op where the update
     * can be deferred (tg_deferred_update_plan refuses every other plan). */
    const tg_op *last = p->n_ops ? &p->ops[p->n_ops - 1] : NULL;
    const int64_t n = last && tg_op_is_update(last->kind) ? last->p.adamw.n : 0;
    /* Chunks of at least 2M elements (a few microseconds of update each), fewer on small
     * models: at most about 16. */
    int64_t min_chunk = n / 16 > 4096 ? n / 16 : 4096;
    if (min_chunk > (1 << 21)) min_chunk = 1 << 21;
    int chunks = 0;
    for (int k = 0; k < x->n_buckets; k++) {
        tg_cuda_bucket *b = &x->bucket[k];
        int rc = tg_deferred_update_plan(b->plan, min_chunk, &b->defer, err);
        if (rc < 0) return x->n_buckets > 1 ? tg_fail_context(err, "length bucket %d (seq %d)", k, b->plan->train.seq) : -1;
        if (rc == 0) { /* the buckets share one update: all defer it or none */
            for (int j = 0; j < k; j++) tg_deferred_update_free(&x->bucket[j].defer);
            return 0;
        }
        if (b->defer.n_chunks > chunks) chunks = b->defer.n_chunks;
    }
    cudaError_t e;
    CUDA_TRY(cudaStreamCreateWithFlags(&x->update_stream, cudaStreamNonBlocking), "cudaStreamCreate (deferred update)");
    CUDA_TRY(cudaMalloc((void **)&x->update_due, sizeof *x->update_due), "cudaMalloc of the update flag");
    CUDA_TRY(cudaMemset(x->update_due, 0, sizeof *x->update_due), "cudaMemset of the update flag");
    CUDA_TRY(cudaEventCreateWithFlags(&x->update_fork, cudaEventDisableTiming), "cudaEventCreate");
    x->chunk_done = calloc((size_t)chunks, sizeof *x->chunk_done);
    if (!x->chunk_done) return tg_fail(err, "out of memory");
    x->n_chunk_events = chunks;
    for (int k = 0; k < chunks; k++)
        if ((e = cudaEventCreateWithFlags(&x->chunk_done[k], cudaEventDisableTiming)) != cudaSuccess)
            return tg_cuda_fail(err, "cudaEventCreate (update chunk)", e);
    x->defer_on = 1;
    return 0;
}

/* Where an LM plan's batch images hold ids, mask and labels (rows 0 for other plans). */
static tg_lm_label_rows lm_label_rows(const tg_plan *p) {
    tg_lm_label_rows r = {0};
    const tg_plan_io *io = &p->io;
    if (p->train.task != TG_TASK_LM || io->labels < 0 || io->input_ids < 0 || io->attention_mask < 0) return r;
    const tg_tensor *ids = &p->tensors[io->input_ids], *mask = &p->tensors[io->attention_mask],
                    *labels = &p->tensors[io->labels];
    if (ids->pool != TG_POOL_INPUTS || mask->pool != TG_POOL_INPUTS || labels->pool != TG_POOL_INPUTS ||
        ids->dtype != TG_I32 || mask->dtype != TG_F32 || labels->dtype != TG_I32 || labels->ndim != 2 ||
        tg_tensor_numel(ids) != tg_tensor_numel(labels) || tg_tensor_numel(mask) != tg_tensor_numel(labels))
        return r;
    r.ids = (size_t)ids->offset, r.mask = (size_t)mask->offset, r.labels = (size_t)labels->offset;
    r.rows = (int)labels->shape[0], r.seq = (int)labels->shape[1];
    return r;
}

/* The plan's buckets, the executor on the last (the plan itself). */
static int buckets_init(tg_cuda_exec *x, const tg_plan *plan, tg_err *err) {
    x->n_buckets = tg_executor_bucket_count(plan);
    if (x->n_buckets > TG_MAX_BUCKETS || (x->n_buckets > 1 && !plan->buckets))
        return tg_fail(err, "the plan names %d length buckets: at most %d, each with its bucket plan", x->n_buckets,
                       TG_MAX_BUCKETS);
    for (int k = 0; k < x->n_buckets; k++) {
        tg_cuda_bucket *b = &x->bucket[k];
        b->plan = tg_plan_bucket(plan, k);
        /* With several buckets the host writes every label (executor.h's lm_label_rows). */
        if (x->n_buckets > 1) continue;
        b->label_rows = lm_label_rows(b->plan);
        /* The trainer leaves an LM batch's labels to the step: a plan whose labels cannot
         * be derived would train on whatever the rows held. */
        if (b->plan->train.task == TG_TASK_LM && !b->label_rows.rows)
            return tg_fail(err, "LM plan: its input_ids, attention_mask and labels are not the [batch, seq] int32, "
                                "float and int32 inputs the step derives labels from");
    }
    x->cur = &x->bucket[x->n_buckets - 1];
    x->plan = x->cur->plan;
    return 0;
}

int tg_cuda_exec_select_bucket(tg_cuda_exec *x, int bucket, tg_err *err) {
    if (tg_executor_check_bucket(x->bucket[x->n_buckets - 1].plan, bucket, err)) return -1;
    x->cur = &x->bucket[bucket];
    x->plan = x->cur->plan;
    return 0;
}

/* The attention backend (kernels/cudnn_attention.h): cuDNN where it loads, with an
 * execution plan built now for every attention op it takes (never inside a capture);
 * the rest run the own kernels. A line on stderr says when cuDNN runs any. */
static int attention_backend_open(tg_cuda_exec *x, tg_err *err) {
    char why[256];
    tg_cudnn_attention *dnn = NULL;
    if (tg_cudnn_attention_open(&dnn, why, sizeof why, err)) return -1;
    if (!dnn) return 0;
    x->ctx.cudnn = dnn;
    for (int k = 0; k < x->n_buckets; k++) {
        const tg_plan *b = x->bucket[k].plan;
        for (int o = 0; o < b->n_ops; o++) {
            const tg_op *op = &b->ops[o];
            if (op->kind != TG_OP_ATTENTION && op->kind != TG_OP_ATTENTION_BWD) continue;
            const int q = op->in[op->kind == TG_OP_ATTENTION ? 0 : 5];
            if (tg_cudnn_attention_prepare(dnn, op, q >= 0 ? b->tensors[q].dtype : TG_F32,
                                           x->ctx.gemm_workspace_bytes, err) < 0)
                return tg_fail_context(err, "op %d (%s) of the plan", o, tg_op_name(op->kind));
        }
    }
    char line[160];
    tg_cudnn_attention_describe(dnn, line, sizeof line);
    if (tg_cudnn_attention_taken(dnn)) fprintf(stderr, "tunegraph: attention: %s\n", line);
    return 0;
}

int tg_cuda_exec_init_on(tg_cuda_exec *x, const tg_plan *plan, uint64_t seed, int device, void *nccl_comm,
                         tg_err *err) {
    memset(x, 0, sizeof *x);
    x->device = device;
    x->wait_margin_s = WAIT_MARGIN_S;
    if (buckets_init(x, plan, err)) {
        memset(x, 0, sizeof *x);
        return -1;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return tg_fail(err, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (device < 0 || device >= count)
        return tg_fail(err, "CUDA device %d requested, %d present", device, count);
    if (tg_cuda_select_device(device, err)) return -1;
    for (int p = 0; p < TG_POOL_COUNT; p++) {
        if (!plan->pool_bytes[p] || !tg_pool_allocated(plan, p)) continue;
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc of pool %s (%llu bytes)", tg_pool_name(p),
                 (unsigned long long)plan->pool_bytes[p]);
        e = cudaMalloc((void **)&x->pool[p], plan->pool_bytes[p]);
        if (e == cudaSuccess) e = cudaMemset(x->pool[p], 0, plan->pool_bytes[p]);
        if (e != cudaSuccess) {
            tg_cuda_fail(err, what, e);
            tg_cuda_exec_free(x);
            return -1;
        }
    }
    if (!tg_pool_allocated(plan, TG_POOL_GRADS)) x->pool[TG_POOL_GRADS] = x->pool[TG_POOL_ACTIVATIONS];
    tg_cuda_ctx *c = &x->ctx;
    c->seed = seed;
    c->nccl_comm = nccl_comm;
    c->rank = nccl_comm ? tg_cuda_comm_rank(nccl_comm) : 0; /* its ZeRO-1 slice and gathered rows */
    c->ranks = nccl_comm ? tg_cuda_comm_ranks(nccl_comm) : 1;
    x->host_trace = getenv("TUNEGRAPH_HOST_TRACE") != NULL;
    c->allow_tf32 = plan->train.allow_tf32;
    c->gemm_workspace_bytes = TG_MEM_GEMM_WORKSPACE_BYTES; /* what the memory estimate counts */
    /* The reduction scratch serves every bucket's ops: sized for the largest need. */
    int64_t scratch = TG_MEM_REDUCE_SCRATCH_MIN_FLOATS;
    for (int k = 0; k < x->n_buckets; k++) {
        const tg_plan *b = x->bucket[k].plan;
        for (int o = 0; o < b->n_ops; o++) {
            int64_t in_n[TG_OP_MAX_IN];
            tg_cuda_numels(b, &b->ops[o], in_n, NULL);
            int64_t need = tg_cuda_op_scratch_floats(&b->ops[o], in_n);
            if (need > scratch) scratch = need;
        }
    }
    c->reduce_scratch_floats = (size_t)scratch;
    cublasLtHandle_t lt = NULL;
    int rc = 0;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaStreamCreate", e);
    else if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
        rc = tg_fail(err, "cublasLtCreate failed");
    else if ((c->cublaslt = lt, e = cudaMalloc(&c->gemm_workspace, c->gemm_workspace_bytes)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaMalloc of the cuBLASLt workspace", e);
    else if ((e = cudaMalloc((void **)&c->reduce_scratch, c->reduce_scratch_floats * sizeof(float))) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaMalloc of the reduction scratch", e);
    else if (tg_gemm_cache_create(&c->gemm_cache, err) || build_segments(x, err))
        rc = -1;
    else if ((e = cudaStreamCreateWithFlags(&x->side_stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaStreamCreate (batch fetch branch)", e);
    else if (deferred_update_init(x, err))
        rc = -1;
    else if (read_step_timeout(x, err))
        rc = -1;
    else if (attention_backend_open(x, err))
        rc = -1;
    else if (nccl_comm && plan->train.replicas > 1 &&
             ((e = create_comm_stream(x)) != cudaSuccess ||
              (e = cudaEventCreateWithFlags(&x->comm_fork, cudaEventDisableTiming)) != cudaSuccess ||
              (e = cudaEventCreateWithFlags(&x->comm_done, cudaEventDisableTiming)) != cudaSuccess))
        rc = tg_cuda_fail(err, "creating the gradient-sum stream and events", e);
    else if ((e = cudaEventCreateWithFlags(&x->fork, cudaEventDisableTiming)) != cudaSuccess ||
             (e = cudaEventCreateWithFlags(&x->join, cudaEventDisableTiming)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaEventCreate", e);
    else if ((x->micro_steps = tg_executor_micro_steps(plan),
              x->staging_stride = ((size_t)x->micro_steps * plan->pool_bytes[TG_POOL_INPUTS] + TG_MEM_STAGING_ALIGN - 1) /
                                  TG_MEM_STAGING_ALIGN * TG_MEM_STAGING_ALIGN,
              e = cudaMalloc((void **)&x->staging, TG_MEM_STAGING_SLOTS * x->staging_stride + TG_MEM_STAGING_ALIGN)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaMalloc of the batch staging slots", e);
    else if ((e = cudaMalloc((void **)&x->seq_dev, sizeof *x->seq_dev)) != cudaSuccess ||
             (e = cudaMemset(x->seq_dev, 0, sizeof *x->seq_dev)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaMalloc of the step counter", e);
    else if (x->micro_steps > 1 && (e = cudaMalloc((void **)&x->loss_window, sizeof *x->loss_window)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaMalloc of the window's loss", e);
    else if ((e = cudaHostAlloc((void **)&x->ctrl, sizeof *x->ctrl, cudaHostAllocMapped)) != cudaSuccess ||
             (e = cudaHostAlloc((void **)&x->report, sizeof *x->report, cudaHostAllocMapped)) != cudaSuccess)
        rc = tg_cuda_fail(err, "cudaHostAlloc of the step control block and report", e);
    else {
        memset(x->ctrl, 0, sizeof *x->ctrl);
        memset(x->report, 0, sizeof *x->report);
        /* The fetch kernel reads host images through their own addresses (unified addressing). */
        struct cudaDeviceProp prop;
        if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
            rc = tg_cuda_fail(err, "cudaGetDeviceProperties", e);
        else if (!prop.unifiedAddressing)
            rc = tg_fail(err, "CUDA device %d (%s) lacks unified addressing", device, prop.name);
    }
    if (rc) tg_cuda_exec_free(x);
    else tg_cuda_gemm_cache_load(x);
    return rc;
}

void tg_cuda_exec_free(tg_cuda_exec *x) {
    if (x->host_trace && x->host_steps > 1) {
        const double n = (double)(x->host_steps - 1) / 1e6;
        fprintf(stderr,
                "host trace (thread CPU us per step, %lld steps after the first): batch hand-over %.1f, graph launch "
                "%.1f (wall %.1f; %s graph), wait %.1f (%.1f wake-ups), read-back %.1f\n",
                (long long)(x->host_steps - 1), x->host_cpu_s[0] / n, x->host_cpu_s[1] / n, x->host_launch_wall_s / n,
                x->step_device_graph ? "device-launch" : "host-launch", x->host_cpu_s[2] / n,
                (double)x->host_wakeups / (double)(x->host_steps - 1), x->host_cpu_s[3] / n);
    }
    tg_cuda_gemm_cache_save(x);
    for (int k = 0; k < x->n_buckets; k++) {
        tg_cuda_bucket *b = &x->bucket[k];
        for (int s = 0; s < 2; s++)
            if (b->graph_exec[s]) cudaGraphExecDestroy((cudaGraphExec_t)b->graph_exec[s]);
        if (b->step_graph) cudaGraphExecDestroy((cudaGraphExec_t)b->step_graph);
        if (b->group_graph) cudaGraphExecDestroy((cudaGraphExec_t)b->group_graph);
        tg_deferred_update_free(&b->defer);
    }
    if (x->fork) cudaEventDestroy(x->fork);
    if (x->join) cudaEventDestroy(x->join);
    if (x->side_stream) cudaStreamDestroy(x->side_stream);
    for (int k = 0; x->chunk_done && k < x->n_chunk_events; k++)
        if (x->chunk_done[k]) cudaEventDestroy(x->chunk_done[k]);
    free(x->chunk_done);
    if (x->update_fork) cudaEventDestroy(x->update_fork);
    if (x->update_stream) cudaStreamDestroy(x->update_stream);
    if (x->comm_fork) cudaEventDestroy(x->comm_fork);
    if (x->comm_done) cudaEventDestroy(x->comm_done);
    if (x->comm_stream) cudaStreamDestroy(x->comm_stream);
    cudaFree(x->update_due);
    cudaFreeHost(x->ctrl);
    cudaFreeHost(x->report);
    cudaFree(x->staging);
    cudaFree(x->loss_window);
    cudaFree(x->seq_dev);
    for (int p = 0; p < TG_POOL_COUNT; p++)
        if (!(p == TG_POOL_GRADS && x->pool[p] == x->pool[TG_POOL_ACTIVATIONS])) cudaFree(x->pool[p]);
    cudaFree(x->segments_dev);
    cudaFree(x->ctx.gemm_workspace);
    cudaFree(x->ctx.reduce_scratch);
    tg_cudnn_attention_close((tg_cudnn_attention *)x->ctx.cudnn);
    x->ctx.cudnn = NULL;
    if (x->ctx.cublaslt) cublasLtDestroy((cublasLtHandle_t)x->ctx.cublaslt);
    tg_gemm_cache_destroy(x->ctx.gemm_cache);
    if (x->ctx.stream) cudaStreamDestroy(x->ctx.stream);
    memset(x, 0, sizeof *x);
}

int tg_cuda_upload(tg_cuda_exec *x, int tensor, const void *host, tg_err *err) {
    const tg_tensor *t = &x->plan->tensors[tensor];
    if (tg_cuda_finish_update(x, err)) return -1;
    /* On the executor's stream: the legacy stream does not order with a non-blocking one. */
    CUDA_TRY(cudaMemcpyAsync(tg_cuda_tensor(x, tensor), host, t->bytes, cudaMemcpyHostToDevice, x->ctx.stream),
             "upload");
    CUDA_TRY(cudaStreamSynchronize(x->ctx.stream), "cudaStreamSynchronize after upload");
    return 0;
}

int tg_cuda_download(tg_cuda_exec *x, int tensor, void *host, tg_err *err) {
    const tg_tensor *t = &x->plan->tensors[tensor];
    if (tg_cuda_finish_update(x, err)) return -1;
    CUDA_TRY(cudaMemcpyAsync(host, tg_cuda_tensor(x, tensor), t->bytes, cudaMemcpyDeviceToHost, x->ctx.stream),
             "download");
    CUDA_TRY(cudaStreamSynchronize(x->ctx.stream), "cudaStreamSynchronize after download");
    return 0;
}

int tg_cuda_sync(tg_cuda_exec *x, tg_err *err) {
    CUDA_TRY(cudaStreamSynchronize(x->ctx.stream), "cudaStreamSynchronize");
    return 0;
}
