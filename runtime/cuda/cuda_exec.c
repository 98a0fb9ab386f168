/* The CUDA executor: binds a plan's pools on the device and runs its schedule. */
#include "runtime/cuda/cuda_exec.h"

#include <errno.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>

#include "base/atomic_file.h"
#include "base/clock.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEMM_WORKSPACE_BYTES (32u << 20)

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

static int cuda_fail(tg_err *err, const char *what, cudaError_t e) {
    return tg_fail(err, "%s failed: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CUDA_TRY(call, what)                         \
    do {                                             \
        cudaError_t e_ = (call);                     \
        if (e_ != cudaSuccess) return cuda_fail(err, what, e_); \
    } while (0)

int tg_cuda_device_name(char *buf, int len) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return -1;
    snprintf(buf, (size_t)len, "%s", prop.name);
    return 0;
}

void *tg_cuda_tensor(const tg_cuda_exec *x, int tensor) {
    if (tensor < 0) return NULL;
    const tg_tensor *t = &x->plan->tensors[tensor];
    return x->pool[t->pool] ? x->pool[t->pool] + t->offset : NULL;
}

/* The GEMM algorithm cache file for the model of GPU `device` and this cuBLASLt version, in
 * $TUNEGRAPH_CACHE_DIR,
 * else $XDG_CACHE_HOME/tunegraph, else ~/.cache/tunegraph; 0 when there is no such folder
 * to use. */
static int gemm_cache_path(int device, char *path, size_t len) {
    char dir[600] = "";
    const char *env = getenv("TUNEGRAPH_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && env[0]) snprintf(dir, sizeof dir, "%s", env);
    else if (xdg && xdg[0]) snprintf(dir, sizeof dir, "%s/tunegraph", xdg);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%s/.cache/tunegraph", home);
    else return 0;
    char gpu[256] = "gpu";
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) snprintf(gpu, sizeof gpu, "%s", prop.name);
    for (char *c = gpu; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) *c = '-';
    snprintf(path, len, "%s/gemm-%s-cublasLt%zu.bin", dir, gpu, cublasLtGetVersion());
    return 1;
}

static void gemm_cache_load(tg_cuda_exec *x) {
    char path[1024];
    if (!gemm_cache_path(x->device, path, sizeof path)) return;
    FILE *f = fopen(path, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = n > 0 ? malloc((size_t)n) : NULL;
    /* A damaged or foreign file is ignored: the algorithms are chosen again and rewritten. */
    if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) tg_gemm_cache_import(x->ctx.gemm_cache, buf, (size_t)n);
    free(buf);
    fclose(f);
}

/* Writes the cache when this run chose algorithms the file did not have. */
static void gemm_cache_save(tg_cuda_exec *x) {
    char path[1024];
    if (!x->ctx.gemm_cache || !tg_gemm_cache_new_entries(x->ctx.gemm_cache) ||
        !gemm_cache_path(x->device, path, sizeof path))
        return;
    for (char *c = path + 1; *c; c++) /* mkdir -p of the folder */
        if (*c == '/') {
            *c = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) return;
            *c = '/';
        }
    void *bytes;
    size_t len;
    if (tg_gemm_cache_export(x->ctx.gemm_cache, &bytes, &len)) return;
    tg_chunk chunk = {bytes, len};
    tg_err err;
    if (tg_write_file_atomic(path, &chunk, 1, "GEMM algorithm cache", &err))
        fprintf(stderr, "tunegraph: warning: %s\n", err.msg); /* a cache: the run itself succeeded */
    free(bytes);
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
    if (e != cudaSuccess) return cuda_fail(err, "upload of the AdamW segment table", e);
    x->ctx.segments = x->segments_dev;
    x->ctx.n_segments = n;
    return 0;
}

static void numels(const tg_plan *p, const tg_op *op, int64_t *in_n, int64_t *out_n) {
    for (int s = 0; s < TG_OP_MAX_IN; s++) in_n[s] = op->in[s] >= 0 ? tg_tensor_numel(&p->tensors[op->in[s]]) : 0;
    if (out_n)
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            out_n[s] = op->out[s] >= 0 ? tg_tensor_numel(&p->tensors[op->out[s]]) : 0;
}

/* Plans the deferred update and creates its stream, flag and events; leaves it off where
 * the plan does not allow it or TUNEGRAPH_DEFERRED_UPDATE=0. */
static int deferred_update_init(tg_cuda_exec *x, tg_err *err) {
    const char *env = getenv("TUNEGRAPH_DEFERRED_UPDATE");
    if (env && !strcmp(env, "0")) return 0;
    const tg_plan *p = x->plan;
    /* The parameter count: the plan's AdamW is its last op where the update can be deferred
     * (tg_deferred_update_plan refuses every other plan). */
    const tg_op *last = p->n_ops ? &p->ops[p->n_ops - 1] : NULL;
    const int64_t n = last && last->kind == TG_OP_ADAMW ? last->p.adamw.n : 0;
    /* Chunks of at least 2M elements (a few microseconds of update each), fewer on small
     * models: at most about 16. */
    int64_t min_chunk = n / 16 > 4096 ? n / 16 : 4096;
    if (min_chunk > (1 << 21)) min_chunk = 1 << 21;
    int rc = tg_deferred_update_plan(p, min_chunk, &x->defer, err);
    if (rc <= 0) return rc;
    cudaError_t e;
    CUDA_TRY(cudaStreamCreateWithFlags(&x->update_stream, cudaStreamNonBlocking), "cudaStreamCreate (deferred update)");
    CUDA_TRY(cudaMalloc((void **)&x->update_due, sizeof *x->update_due), "cudaMalloc of the update flag");
    CUDA_TRY(cudaMemset(x->update_due, 0, sizeof *x->update_due), "cudaMemset of the update flag");
    CUDA_TRY(cudaEventCreateWithFlags(&x->update_fork, cudaEventDisableTiming), "cudaEventCreate");
    x->chunk_done = calloc((size_t)x->defer.n_chunks, sizeof *x->chunk_done);
    if (!x->chunk_done) return tg_fail(err, "out of memory");
    for (int k = 0; k < x->defer.n_chunks; k++)
        if ((e = cudaEventCreateWithFlags(&x->chunk_done[k], cudaEventDisableTiming)) != cudaSuccess)
            return cuda_fail(err, "cudaEventCreate (update chunk)", e);
    x->defer_on = 1;
    return 0;
}

int tg_cuda_exec_init(tg_cuda_exec *x, const tg_plan *plan, uint64_t seed, tg_err *err) {
    return tg_cuda_exec_init_on(x, plan, seed, 0, NULL, err);
}

/* Where an LM plan's batch images hold ids, mask and labels (rows 0 for other plans). */
static tg_lm_label_rows lm_label_rows(const tg_plan *p) {
    tg_lm_label_rows r = {0};
    const tg_plan_io *io = &p->io;
    if (p->job.task != TG_TASK_LM || io->labels < 0 || io->input_ids < 0 || io->attention_mask < 0) return r;
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

int tg_cuda_exec_init_on(tg_cuda_exec *x, const tg_plan *plan, uint64_t seed, int device, void *nccl_comm,
                         tg_err *err) {
    memset(x, 0, sizeof *x);
    x->plan = plan;
    x->device = device;
    x->wait_margin_s = WAIT_MARGIN_S;
    x->label_rows = lm_label_rows(plan);
    /* The trainer leaves an LM batch's labels to the step: a plan whose labels cannot be
     * derived would train on whatever the rows held. */
    if (plan->job.task == TG_TASK_LM && !x->label_rows.rows)
        return tg_fail(err, "LM plan: its input_ids, attention_mask and labels are not the [batch, seq] int32, float "
                            "and int32 inputs the step derives labels from");
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return tg_fail(err, "no CUDA device: %s", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (device < 0 || device >= count)
        return tg_fail(err, "CUDA device %d requested, %d present", device, count);
    if ((e = cudaSetDevice(device)) != cudaSuccess) return cuda_fail(err, "cudaSetDevice", e);
    /* Waiting for a step sleeps instead of spinning: the host CPU per step stays small. A
     * context made earlier with other flags keeps them, which is harmless. */
    (void)cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    (void)cudaGetLastError();
    for (int p = 0; p < TG_POOL_COUNT; p++) {
        if (!plan->pool_bytes[p]) continue;
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc of pool %s (%llu bytes)", tg_pool_name(p),
                 (unsigned long long)plan->pool_bytes[p]);
        e = cudaMalloc((void **)&x->pool[p], plan->pool_bytes[p]);
        if (e == cudaSuccess) e = cudaMemset(x->pool[p], 0, plan->pool_bytes[p]);
        if (e != cudaSuccess) {
            cuda_fail(err, what, e);
            tg_cuda_exec_free(x);
            return -1;
        }
    }
    tg_cuda_ctx *c = &x->ctx;
    c->seed = seed;
    c->nccl_comm = nccl_comm;
    c->rank = nccl_comm ? device : 0; /* replica r runs on GPU r */
    x->host_trace = getenv("TUNEGRAPH_HOST_TRACE") != NULL;
    c->allow_tf32 = plan->job.allow_tf32;
    c->gemm_workspace_bytes = GEMM_WORKSPACE_BYTES;
    int64_t scratch = 1024;
    for (int o = 0; o < plan->n_ops; o++) {
        int64_t in_n[TG_OP_MAX_IN];
        numels(plan, &plan->ops[o], in_n, NULL);
        int64_t need = tg_cuda_op_scratch_floats(&plan->ops[o], in_n);
        if (need > scratch) scratch = need;
    }
    c->reduce_scratch_floats = (size_t)scratch;
    cublasLtHandle_t lt = NULL;
    int rc = 0;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = cuda_fail(err, "cudaStreamCreate", e);
    else if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
        rc = tg_fail(err, "cublasLtCreate failed");
    else if ((c->cublaslt = lt, e = cudaMalloc(&c->gemm_workspace, c->gemm_workspace_bytes)) != cudaSuccess)
        rc = cuda_fail(err, "cudaMalloc of the cuBLASLt workspace", e);
    else if ((e = cudaMalloc((void **)&c->reduce_scratch, c->reduce_scratch_floats * sizeof(float))) != cudaSuccess)
        rc = cuda_fail(err, "cudaMalloc of the reduction scratch", e);
    else if (tg_gemm_cache_create(&c->gemm_cache, err) || build_segments(x, err))
        rc = -1;
    else if ((e = cudaStreamCreateWithFlags(&x->side_stream, cudaStreamNonBlocking)) != cudaSuccess)
        rc = cuda_fail(err, "cudaStreamCreate (batch fetch branch)", e);
    else if (deferred_update_init(x, err))
        rc = -1;
    else if (nccl_comm && plan->job.data_parallel > 1 &&
             ((e = cudaStreamCreateWithFlags(&x->comm_stream, cudaStreamNonBlocking)) != cudaSuccess ||
              (e = cudaEventCreateWithFlags(&x->comm_fork, cudaEventDisableTiming)) != cudaSuccess ||
              (e = cudaEventCreateWithFlags(&x->comm_done, cudaEventDisableTiming)) != cudaSuccess))
        rc = cuda_fail(err, "creating the gradient-sum stream and events", e);
    else if ((e = cudaEventCreateWithFlags(&x->fork, cudaEventDisableTiming)) != cudaSuccess ||
             (e = cudaEventCreateWithFlags(&x->join, cudaEventDisableTiming)) != cudaSuccess)
        rc = cuda_fail(err, "cudaEventCreate", e);
    else if ((x->staging_stride = (plan->pool_bytes[TG_POOL_INPUTS] + 255) / 256 * 256,
              e = cudaMalloc((void **)&x->staging, 2 * x->staging_stride + 256)) != cudaSuccess)
        rc = cuda_fail(err, "cudaMalloc of the batch staging slots", e);
    else if ((e = cudaMalloc((void **)&x->seq_dev, sizeof *x->seq_dev)) != cudaSuccess ||
             (e = cudaMemset(x->seq_dev, 0, sizeof *x->seq_dev)) != cudaSuccess)
        rc = cuda_fail(err, "cudaMalloc of the step counter", e);
    else if ((e = cudaHostAlloc((void **)&x->ctrl, sizeof *x->ctrl, cudaHostAllocMapped)) != cudaSuccess ||
             (e = cudaHostAlloc((void **)&x->report, sizeof *x->report, cudaHostAllocMapped)) != cudaSuccess)
        rc = cuda_fail(err, "cudaHostAlloc of the step control block and report", e);
    else {
        memset(x->ctrl, 0, sizeof *x->ctrl);
        memset(x->report, 0, sizeof *x->report);
        /* The fetch kernel reads host images through their own addresses (unified addressing). */
        struct cudaDeviceProp prop;
        if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
            rc = cuda_fail(err, "cudaGetDeviceProperties", e);
        else if (!prop.unifiedAddressing)
            rc = tg_fail(err, "CUDA device %d (%s) lacks unified addressing", device, prop.name);
    }
    if (rc) tg_cuda_exec_free(x);
    else gemm_cache_load(x);
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
    gemm_cache_save(x);
    for (int s = 0; s < 2; s++)
        if (x->graph_exec[s]) cudaGraphExecDestroy((cudaGraphExec_t)x->graph_exec[s]);
    if (x->step_graph) cudaGraphExecDestroy((cudaGraphExec_t)x->step_graph);
    if (x->group_graph) cudaGraphExecDestroy((cudaGraphExec_t)x->group_graph);
    if (x->fork) cudaEventDestroy(x->fork);
    if (x->join) cudaEventDestroy(x->join);
    if (x->side_stream) cudaStreamDestroy(x->side_stream);
    for (int k = 0; x->chunk_done && k < x->defer.n_chunks; k++)
        if (x->chunk_done[k]) cudaEventDestroy(x->chunk_done[k]);
    free(x->chunk_done);
    if (x->update_fork) cudaEventDestroy(x->update_fork);
    if (x->update_stream) cudaStreamDestroy(x->update_stream);
    if (x->comm_fork) cudaEventDestroy(x->comm_fork);
    if (x->comm_done) cudaEventDestroy(x->comm_done);
    if (x->comm_stream) cudaStreamDestroy(x->comm_stream);
    cudaFree(x->update_due);
    tg_deferred_update_free(&x->defer);
    cudaFreeHost(x->ctrl);
    cudaFreeHost(x->report);
    cudaFree(x->staging);
    cudaFree(x->seq_dev);
    for (int p = 0; p < TG_POOL_COUNT; p++) cudaFree(x->pool[p]);
    cudaFree(x->segments_dev);
    cudaFree(x->ctx.gemm_workspace);
    cudaFree(x->ctx.reduce_scratch);
    if (x->ctx.cublaslt) cublasLtDestroy((cublasLtHandle_t)x->ctx.cublaslt);
    tg_gemm_cache_destroy(x->ctx.gemm_cache);
    if (x->ctx.stream) cudaStreamDestroy(x->ctx.stream);
    memset(x, 0, sizeof *x);
}

/* The launch arguments of schedule op o, on the executor's context. */
static void op_args(tg_cuda_exec *x, int o, int training, tg_cuda_op_args *a) {
    const tg_plan *p = x->plan;
    memset(a, 0, sizeof *a);
    a->op = &p->ops[o];
    a->ctx = &x->ctx;
    a->training = training;
    numels(p, a->op, a->in_numel, a->out_numel);
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
static int run_ops(tg_cuda_exec *x, int first, int last, int training, tg_err *err) {
    const tg_plan *p = x->plan;
    if (first < 0 || last > p->n_ops || first > last) return tg_fail(err, "op range [%d, %d) out of bounds", first, last);
    for (int o = first; o < last; o++) {
        tg_cuda_op_args a;
        op_args(x, o, training, &a);
        if (tg_cuda_op_run(&a, err)) return tg_fail_context(err, "schedule op %d", o);
    }
    return 0;
}

static int run_phases(tg_cuda_exec *x, int first_phase, int last_phase, int training, tg_err *err) {
    return run_ops(x, x->plan->phase_begin[first_phase], x->plan->phase_begin[last_phase + 1], training, err);
}

/* The launch arguments of schedule op o (training) on another stream: *ctx is the
 * executor's context with that stream, and must live as long as *a is used. */
static void op_args_on(tg_cuda_exec *x, int o, cudaStream_t stream, tg_cuda_ctx *ctx, tg_cuda_op_args *a) {
    op_args(x, o, 1, a);
    *ctx = x->ctx;
    ctx->stream = stream;
    a->ctx = ctx;
}

/* Parameter elements [first, end) of the plan's AdamW, on `stream`, gated by `gate`. */
static int run_update(tg_cuda_exec *x, cudaStream_t stream, int64_t first, int64_t end, const int *gate, tg_err *err) {
    tg_cuda_op_args a;
    tg_cuda_ctx ctx;
    op_args_on(x, x->defer.adamw_op, stream, &ctx, &a);
    if (tg_cuda_adamw_range(&a, first, end, gate, err))
        return tg_fail_context(err, "deferred AdamW over parameters [%lld, %lld)", (long long)first, (long long)end);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return tg_fail(err, "deferred AdamW over parameters [%lld, %lld): launch failed: %s", (long long)first,
                       (long long)end, cudaGetErrorString(e));
    return 0;
}

int tg_cuda_finish_update(tg_cuda_exec *x, tg_err *err) {
    if (!x->update_pending) return 0;
    if (run_update(x, x->ctx.stream, 0, x->defer.begin[x->defer.n_chunks], x->update_due, err)) return -1;
    CUDA_TRY(cudaMemsetAsync(x->update_due, 0, sizeof *x->update_due, x->ctx.stream), "clearing the update flag");
    x->update_pending = 0;
    return 0;
}

int tg_cuda_exec_range(tg_cuda_exec *x, int first, int last, int training, tg_err *err) {
    if (tg_cuda_finish_update(x, err)) return -1;
    return run_ops(x, first, last, training, err);
}

int tg_cuda_exec_phases(tg_cuda_exec *x, int first_phase, int last_phase, int training, tg_err *err) {
    return tg_cuda_exec_range(x, x->plan->phase_begin[first_phase], x->plan->phase_begin[last_phase + 1], training, err);
}

/* Captures what `body` enqueues on the main stream into an instantiated graph. */
static int capture(tg_cuda_exec *x, int (*body)(tg_cuda_exec *, void *, tg_err *), void *arg, void **exec_out,
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
    if (e != cudaSuccess) return cuda_fail(err, "cudaStreamEndCapture", e);
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
    if (e != cudaSuccess) return cuda_fail(err, "cudaGraphInstantiate", e);
    *exec_out = exec;
    return 0;
}

typedef struct phases_args {
    int first, last, training;
} phases_args;

static int enqueue_phases(tg_cuda_exec *x, void *arg, tg_err *err) {
    const phases_args *a = arg;
    return run_phases(x, a->first, a->last, a->training, err);
}

int tg_cuda_exec_graph(tg_cuda_exec *x, int slot, int first_phase, int last_phase, int training, tg_err *err) {
    if (slot < 0 || slot > 1) return tg_fail(err, "graph slot %d", slot);
    if (tg_cuda_finish_update(x, err)) return -1;
    if (!x->graph_exec[slot]) {
        phases_args args = {first_phase, last_phase, training};
        if (capture(x, enqueue_phases, &args, &x->graph_exec[slot], err)) return -1;
    }
    CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)x->graph_exec[slot], x->ctx.stream), "cudaGraphLaunch");
    return 0;
}

/* Phase marker k: the GPU's timer into the mapped step report, by a one-thread kernel (a
 * kernel node in the graph: event nodes would keep the graph from device launch). */
static int mark(tg_cuda_exec *x, int k, tg_err *err) {
    if (tg_cuda_stamp(x->report, k, x->seq_dev, x->ctx.stream))
        return cuda_fail(err, "phase marker", cudaGetLastError());
    return 0;
}

/* The previous step's update (when one is due) in chunks on the update stream, and this
 * step's forward on the main stream, each op after the chunks holding the parameters it
 * reads; the backward, which overwrites the gradients, after all of them. */
static int enqueue_forward_beside_update(tg_cuda_exec *x, tg_err *err) {
    const tg_deferred_update *u = &x->defer;
    cudaStream_t s = x->ctx.stream;
    CUDA_TRY(cudaEventRecord(x->update_fork, s), "record the update branch's fork");
    CUDA_TRY(cudaStreamWaitEvent(x->update_stream, x->update_fork, 0), "fork of the update branch");
    for (int k = 0; k < u->n_chunks; k++) {
        if (run_update(x, x->update_stream, u->begin[k], u->begin[k + 1], x->update_due, err)) return -1;
        /* The update is applied: its gate closes with the last chunk (this step's end opens
         * it again), so a step that fails after this point never has it applied twice. */
        if (k == u->n_chunks - 1 && tg_cuda_set_flag(x->update_due, 0, x->update_stream))
            return cuda_fail(err, "closing the update gate", cudaGetLastError());
        CUDA_TRY(cudaEventRecord(x->chunk_done[k], x->update_stream), "record an update chunk's end");
    }
    const int f0 = x->plan->phase_begin[TG_PHASE_FORWARD];
    int done = 0;
    for (int j = 0; j < u->n_forward; j++) {
        if (u->chunks_before[j] > done) {
            done = u->chunks_before[j];
            CUDA_TRY(cudaStreamWaitEvent(s, x->chunk_done[done - 1], 0), "wait for an update chunk");
        }
        if (run_ops(x, f0 + j, f0 + j + 1, 1, err)) return -1;
    }
    if (done < u->n_chunks) CUDA_TRY(cudaStreamWaitEvent(s, x->chunk_done[u->n_chunks - 1], 0), "join of the update");
    return 0;
}

/* The backward and the optimizer phase, less the AdamW when it is deferred; with
 * replicas, each gradient bucket's sum on the communication stream beside the backward. */
static int enqueue_backward_and_optimizer(tg_cuda_exec *x, tg_err *err) {
    const tg_plan *p = x->plan;
    const int end = x->defer_on ? x->defer.adamw_op : p->n_ops;
    const int b0 = p->phase_begin[TG_PHASE_BACKWARD], b1 = p->phase_begin[TG_PHASE_OPTIMIZER];
    int summing = 0;
    for (int o = b0; o < b1; o++) {
        if (!x->comm_stream || p->ops[o].kind != TG_OP_ALL_REDUCE) {
            if (run_ops(x, o, o + 1, 1, err)) return -1;
            continue;
        }
        tg_cuda_op_args a;
        tg_cuda_ctx ctx;
        op_args_on(x, o, x->comm_stream, &ctx, &a);
        CUDA_TRY(cudaEventRecord(x->comm_fork, x->ctx.stream), "record a gradient sum's fork");
        CUDA_TRY(cudaStreamWaitEvent(x->comm_stream, x->comm_fork, 0), "fork of a gradient sum");
        if (tg_cuda_op_run(&a, err)) return tg_fail_context(err, "schedule op %d", o);
        CUDA_TRY(cudaEventRecord(x->comm_done, x->comm_stream), "record a gradient sum's end");
        summing = 1;
    }
    if (mark(x, 2 + TG_PHASE_BACKWARD, err)) return -1;
    if (summing) CUDA_TRY(cudaStreamWaitEvent(x->ctx.stream, x->comm_done, 0), "join of the gradient sums");
    if (run_ops(x, b1, end, 1, err)) return -1;
    return mark(x, 2 + TG_PHASE_OPTIMIZER, err);
}

/* The device work of one step, on the main stream: take the staged batch, fetch the next
 * one on a branch beside the schedule, run the schedule, publish the statistics. Captured
 * once when graphs are on (the fork and join events then become graph edges). */
static int enqueue_step(tg_cuda_exec *x, tg_err *err) {
    const tg_plan *p = x->plan;
    cudaStream_t s = x->ctx.stream;
    size_t bytes = p->pool_bytes[TG_POOL_INPUTS];
    if (mark(x, 0, err)) return -1;
    if (bytes && tg_cuda_take_batch(x->staging, x->staging_stride, x->pool[TG_POOL_INPUTS], bytes, x->seq_dev, s))
        return cuda_fail(err, "taking the staged batch", cudaGetLastError());
    if (mark(x, 1, err)) return -1;
    if (bytes) {
        CUDA_TRY(cudaEventRecord(x->fork, s), "record the fetch branch's fork");
        CUDA_TRY(cudaStreamWaitEvent(x->side_stream, x->fork, 0), "fork of the fetch branch");
        if (tg_cuda_fetch_batch(x->ctrl, x->staging, x->staging_stride, bytes, x->seq_dev, x->label_rows,
                                x->side_stream))
            return cuda_fail(err, "fetching the next batch", cudaGetLastError());
        CUDA_TRY(cudaEventRecord(x->join, x->side_stream), "record the fetch branch's join");
    }
    if ((x->defer_on ? enqueue_forward_beside_update(x, err) : run_phases(x, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, err)) ||
        mark(x, 2 + TG_PHASE_FORWARD, err) || enqueue_backward_and_optimizer(x, err))
        return -1;
    if (bytes) CUDA_TRY(cudaStreamWaitEvent(s, x->join, 0), "join of the fetch branch");
    if (tg_cuda_step_end(tg_cuda_tensor(x, p->io.loss), tg_cuda_tensor(x, p->io.lr), tg_cuda_tensor(x, p->io.grad_norm),
                         x->report, x->seq_dev, x->defer_on ? x->update_due : NULL, s))
        return cuda_fail(err, "publishing the step statistics", cudaGetLastError());
    return 0;
}

/* `*(int *)steps` steps in a row, for capture. */
static int enqueue_captured_steps(tg_cuda_exec *x, void *steps, tg_err *err) {
    for (int k = 0; k < *(int *)steps; k++)
        if (enqueue_step(x, err)) return -1;
    return 0;
}


/* Adds the thread CPU time since *t0 to part k of the host trace and restarts *t0. */
static void host_trace(tg_cuda_exec *x, int k, double *t0) {
    if (!x->host_trace) return;
    double t = tg_thread_cpu_s();
    x->host_cpu_s[k] += t - *t0;
    *t0 = t;
}

/* Before the first step: one forward and backward, uncaptured, in which every GEMM shape
 * missing from the cache times cuBLASLt's candidates and keeps the fastest (the cache
 * file keeps the choice for later runs). Training state is untouched: forward and backward
 * write only activations and gradients, which the real step recomputes (the backward
 * starts by zeroing the gradients). TUNEGRAPH_GEMM_TUNE=0 keeps the heuristic's picks;
 * TUNEGRAPH_GEMM_TUNE=log prints what each shape's timing found. */
static int gemm_tune_pass(tg_cuda_exec *x, tg_err *err) {
    const char *env = getenv("TUNEGRAPH_GEMM_TUNE");
    if (env && !strcmp(env, "0")) return 0;
    x->ctx.gemm_tune = env && !strcmp(env, "log") ? 2 : 1; /* log: one line per shape on stderr */
    int rc = tg_cuda_exec_phases(x, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, err);
    x->ctx.gemm_tune = 0;
    if (rc) return tg_fail_context(err, "in the GEMM tuning pass");
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
    if (e != cudaSuccess) return cuda_fail(err, "cudaPointerGetAttributes of the next batch", e);
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
    const int group = steps > 1 && (!x->group_steps || x->group_steps == steps);
    if (group && !x->group_graph) {
        if (capture(x, enqueue_captured_steps, &steps, &x->group_graph, err)) return -1;
        x->group_steps = steps;
    }
    if (!x->step_graph) {
        int one = 1;
        if (capture(x, enqueue_captured_steps, &one, &x->step_graph, err)) return -1;
        x->step_device_graph = x->device_graph;
    }
    *exec = group ? x->group_graph : x->step_graph, *launches = group ? 1 : steps;
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
    if (!x->gemm_tuned) {
        x->gemm_tuned = 1;
        if (gemm_tune_pass(x, err)) return -1;
    }
    double t0 = x->host_trace ? tg_thread_cpu_s() : 0;
    /* A batch the previous step did not fetch is uploaded into this step's slot first, in
     * stream order after the steps before it. */
    if (bytes && (!x->staged || x->staged != batches[0])) {
        uint8_t *slot = x->staging + (size_t)(x->steps_started & 1) * x->staging_stride;
        CUDA_TRY(cudaMemcpyAsync(slot, batches[0], bytes, cudaMemcpyHostToDevice, x->ctx.stream), "upload of the batch");
        if (tg_cuda_derive_label_rows(slot, x->label_rows, x->ctx.stream))
            return cuda_fail(err, "deriving the uploaded batch's labels", cudaGetLastError());
    }
    /* Read by the steps' fetch kernels; the steps that read these entries last have ended,
     * being TG_STEP_RING steps back. */
    for (int j = 0; j < steps; j++) {
        if (batches[j + 1] && check_host_image(x, batches[j + 1], err)) return -1;
        ((volatile tg_step_ctrl *)x->ctrl)->next_batch[(x->steps_started + j) % TG_STEP_RING] = batches[j + 1];
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    host_trace(x, 0, &t0);
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
    host_trace(x, 1, &t0);
    return 0;
}

static void sleep_until_s(double t) {
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}


/* The wall-clock time step `target` should end: from the end of the last finished step
 * (its GPU stamp on the wall clock), each later step takes one step's GPU time, starting
 * no earlier than its launch. 0 when there is nothing to judge by yet. */
static double expected_end_s(tg_cuda_exec *x, long long target) {
    if (x->step_gpu_s <= 0 || !x->clock_offset_set) return 0;
    long long finished = (long long)x->report->done - 1; /* its record is intact: not yet waited for, or the last */
    unsigned long long stamp = x->last_end_stamp;
    if (finished >= x->steps_waited) stamp = x->report->step[finished % TG_STEP_RING].stamps[4];
    else finished = x->steps_waited - 1;
    double end = (double)stamp / 1e9 + x->clock_offset_s;
    for (long long k = finished + 1; k <= target; k++) {
        double launch = x->launch_s[k % TG_STEP_RING];
        end = (end > launch ? end : launch) + x->step_gpu_s;
    }
    return end;
}

/* A sample of the wall clock against the GPU timer, from the step that ended last: seen
 * now, it ended at or before now, so the least sample is the closest. */
static void sample_clock_offset(tg_cuda_exec *x) {
    long long finished = (long long)x->report->done - 1;
    if (finished < x->steps_waited) return;
    double sample = tg_wall_s() - (double)x->report->step[finished % TG_STEP_RING].stamps[4] / 1e9;
    if (!x->clock_offset_set || sample < x->clock_offset_s) x->clock_offset_s = sample, x->clock_offset_set = 1;
}

static int wait_for_report(tg_cuda_exec *x, unsigned long long want, long long target, tg_err *err) {
    volatile const unsigned long long *done = &x->report->done;
    if (*done >= want) return 0;
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), rc = 0, slept = 0, polls = 0;
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    double now = tg_wall_s(), queried = now, interval = WAIT_POLL_S, wake_at = expected_end_s(x, target);
    if (wake_at - x->wait_margin_s > now + WAIT_POLL_S)
        sleep_until_s(wake_at - x->wait_margin_s), x->host_wakeups++, slept = 1;
    /* The sleep overshot when the step it aimed at had already ended at the first look. */
    const int overshot = slept && *done >= (unsigned long long)target + 1;
    for (; *done < want; polls++) {
        if (polls >= WAIT_POLLS) {
            if (x->steps_started - x->steps_waited == 1) {
                cudaError_t e = cudaStreamSynchronize(x->ctx.stream);
                if (e != cudaSuccess) rc = cuda_fail(err, "the training step", e);
                break;
            }
            interval = interval * 2 < WAIT_POLL_MAX_S ? interval * 2 : WAIT_POLL_MAX_S;
        }
        now = tg_wall_s();
        sleep_until_s(now + interval);
        x->host_wakeups++;
        if (*done >= want || now - queried < WAIT_QUERY_S) continue;
        queried = now;
        cudaError_t e = cudaStreamQuery(x->ctx.stream);
        if (e != cudaErrorNotReady && e != cudaSuccess) {
            rc = cuda_fail(err, "the training step", e);
            break;
        }
        if (e == cudaSuccess) break; /* everything queued has run: checked below */
    }
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
    if (!rc && *done < want)
        return tg_fail(err, "the training step ended without publishing its statistics (step %llu, report says %llu)",
                       want, *done);
    /* A clock sample from every wait; the margin widens when the sleep overshot and
     * narrows when it took many looks, so the wake-up tracks the estimate's error. */
    sample_clock_offset(x);
    if (overshot) x->wait_margin_s = x->wait_margin_s * 2 < 1e-3 ? x->wait_margin_s * 2 : 1e-3;
    else if (polls > 4) x->wait_margin_s = x->wait_margin_s / 2 > WAIT_MARGIN_S ? x->wait_margin_s / 2 : WAIT_MARGIN_S;
    return rc;
}

int tg_cuda_step_wait(tg_cuda_exec *x, float stats[8], tg_err *err) {
    long long pending = x->steps_started - x->steps_waited;
    if (pending <= 0) return tg_fail(err, "no training step is in flight");
    double t0 = x->host_trace ? tg_thread_cpu_s() : 0;
    /* With several steps queued, sleep until all but the last should have ended. */
    long long target = x->steps_waited + (pending > 1 ? pending - 2 : 0);
    if (wait_for_report(x, (unsigned long long)x->steps_waited + 1, target, err)) return -1;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    host_trace(x, 2, &t0);
    const volatile tg_step_record *r = &x->report->step[x->steps_waited % TG_STEP_RING];
    stats[0] = r->loss, stats[1] = r->lr, stats[2] = r->grad_norm;
    for (int k = 0; k < 4; k++) stats[3 + k] = (float)((double)(r->stamps[k + 1] - r->stamps[k]) / 1e6);
    stats[7] = x->last_end_stamp ? (float)((double)(r->stamps[4] - x->last_end_stamp) / 1e6) : -1.0f;
    /* Later waits judge by the GPU's own duration of this step, not by when the host
     * happened to look: a late look would otherwise make every later sleep longer. */
    x->step_gpu_s = (double)(r->stamps[4] - r->stamps[0]) / 1e9;
    x->last_end_stamp = r->stamps[4];
    x->steps_waited++;
    host_trace(x, 3, &t0);
    /* The first step captures the graph: left out of the trace. */
    if (++x->host_steps == 1)
        memset(x->host_cpu_s, 0, sizeof x->host_cpu_s), x->host_launch_wall_s = 0, x->host_wakeups = 0;
    return 0;
}

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
    for (int r = 0; r < repeats && !rc; r++) {
        cudaEventRecord(ev[0], x->ctx.stream);
        for (int o = first; o < last && !rc; o++) {
            rc = tg_cuda_exec_range(x, o, o + 1, 1, err);
            cudaEventRecord(ev[o - first + 1], x->ctx.stream);
        }
        if (!rc && cudaStreamSynchronize(x->ctx.stream) != cudaSuccess) rc = tg_fail(err, "profile run failed");
        for (int o = first; o < last && !rc; o++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, ev[o - first], ev[o - first + 1]);
            op_ms[o] += ms / repeats;
        }
    }
    for (int i = 0; i <= last - first; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    free(ev);
    return rc;
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
