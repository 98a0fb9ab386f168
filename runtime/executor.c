/* The CPU executor behind the executor interface, and the dispatch to the CUDA one. */
#include "runtime/executor.h"
#include "base/alloc.h"
#include "base/clock.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_exec.h"
#include "runtime/cpu/threadpool.h"

/* The CPU runs a step at once; step_wait hands over the result it left. The executor comes
 * first, so impl is also a tg_cpu_exec *. x.plan is the selected bucket's plan; root the
 * plan the executor was opened for. The CPU reference keeps no scratch of its own beside
 * the pools (which every bucket shares), so a bucket is only the plan it runs. */
typedef struct cpu_impl {
    tg_cpu_exec x;
    tg_step_result last;
    const tg_plan *root;
} cpu_impl;


static int cpu_run(void *impl, int first, int last, int training, tg_err *err) {
    tg_cpu_exec *x = impl;
    x->training = training;
    return tg_cpu_exec_phases(x, first, last, err);
}

static int cpu_write(void *impl, int tensor, const void *host, tg_err *err) {
    tg_cpu_exec *x = impl;
    memcpy(tg_cpu_tensor(x, tensor), host, x->plan->tensors[tensor].bytes);
    return 0;
}

static int cpu_read(void *impl, int tensor, void *host, tg_err *err) {
    tg_cpu_exec *x = impl;
    memcpy(host, tg_cpu_tensor(x, tensor), x->plan->tensors[tensor].bytes);
    return 0;
}

static void *cpu_host_alloc(void *impl, size_t bytes) { return tg_calloc(1, bytes ? bytes : 1); }
static void cpu_host_free(void *impl, void *p) { free(p); }

static int cpu_step_start(void *impl, const void *const *batches, int steps, tg_err *err) {
    cpu_impl *c = impl;
    const tg_plan *p = c->x.plan;
    const size_t bytes = p->pool_bytes[TG_POOL_INPUTS];
    const int micro = tg_executor_micro_steps(p);
    if (steps != 1) return tg_fail(err, "the CPU executor runs one step per start, asked for %d", steps);
    /* phase ms: batch in place, forward, backward (summed over the micro-steps), optimizer */
    double ms[4] = {0, 0, 0, 0};
    const uint64_t seed = c->x.seed;
    float loss = 0.0f; /* the micro-steps' losses, added in order as the CUDA executor adds them */
    c->x.training = 1;
    for (int i = 0; i < micro; i++) {
        double t0 = tg_wall_ms();
        if (bytes) memcpy(c->x.pool[TG_POOL_INPUTS], (const uint8_t *)batches[0] + (size_t)i * bytes, bytes);
        double t1 = tg_wall_ms();
        ms[0] += t1 - t0;
        c->x.seed = tg_micro_step_seed(seed, i);
        int rc = tg_cpu_exec_phases(&c->x, TG_PHASE_FORWARD, TG_PHASE_FORWARD, err);
        double t2 = tg_wall_ms();
        if (!rc) rc = tg_cpu_exec_phases(&c->x, TG_PHASE_BACKWARD, TG_PHASE_BACKWARD, err);
        c->x.seed = seed;
        if (rc) return -1;
        loss += *(float *)tg_cpu_tensor(&c->x, p->io.loss);
        ms[1] += t2 - t1;
        ms[2] += tg_wall_ms() - t2;
    }
    double t3 = tg_wall_ms();
    if (tg_cpu_exec_phases(&c->x, TG_PHASE_OPTIMIZER, TG_PHASE_OPTIMIZER, err)) return -1;
    ms[3] = tg_wall_ms() - t3;
    tg_step_result *r = &c->last;
    r->loss = loss;
    r->lr = *(float *)tg_cpu_tensor(&c->x, p->io.lr);
    r->grad_norm = *(float *)tg_cpu_tensor(&c->x, p->io.grad_norm);
    r->loss_scale = p->io.loss_scale >= 0 ? *(float *)tg_cpu_tensor(&c->x, p->io.loss_scale) : 0.0f;
    for (int k = 0; k < 4; k++) r->phase_ms[k] = (float)ms[k];
    r->period_ms = -1.0f;
    r->comm_buckets = 0; /* the replicas' sums run inside the phases, untimed */
    return 0;
}

static int cpu_step_wait(void *impl, tg_step_result *result, tg_err *err) {
    *result = ((cpu_impl *)impl)->last;
    return 0;
}

static int cpu_profile(void *impl, int repeats, double *op_ms, tg_err *err) {
    cpu_impl *c = impl;
    const tg_plan *p = c->x.plan;
    c->x.training = 1;
    for (int o = 0; o < p->n_ops; o++) op_ms[o] = 0;
    for (int r = 0; r < repeats; r++)
        for (int o = 0; o < p->n_ops; o++) {
            double t0 = tg_wall_ms();
            if (tg_cpu_exec_range(&c->x, o, o + 1, err)) return -1;
            op_ms[o] += (tg_wall_ms() - t0) / repeats;
        }
    return 0;
}

int tg_executor_cpu_threads(const tg_executor *ex) {
    return ex->device == TG_DEVICE_CPU && ex->impl ? tg_threadpool_size(((const cpu_impl *)ex->impl)->x.threads) : 0;
}

static int cpu_select_bucket(void *impl, int bucket, tg_err *err) {
    cpu_impl *c = impl;
    if (tg_executor_check_bucket(c->root, bucket, err)) return -1;
    c->x.plan = tg_plan_bucket(c->root, bucket);
    return 0;
}

static void cpu_close(void *impl) {
    tg_cpu_exec_free(impl);
    free(impl);
}

static const tg_executor_vtbl cpu_vtbl = {
    .name = "cpu",
    .run = cpu_run,
    .write = cpu_write,
    .read = cpu_read,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .step_start = cpu_step_start,
    .step_wait = cpu_step_wait,
    .profile = cpu_profile,
    .close = cpu_close,
    .select_bucket = cpu_select_bucket,
    .max_in_flight = 1,
    .step_group = 1,
    .lm_label_rows = 0,
};

int tg_executor_bucket_count(const tg_plan *plan) { return plan->train.n_buckets > 1 ? plan->train.n_buckets : 1; }

int tg_executor_check_bucket(const tg_plan *plan, int bucket, tg_err *err) {
    const int n = tg_executor_bucket_count(plan);
    if (bucket < 0 || bucket >= n)
        return tg_fail(err, "length bucket %d asked for: the plan has %d (0 .. %d)%s", bucket, n, n - 1,
                       n == 1 ? ", it was compiled without seq_buckets" : "");
    return 0;
}

/* What the executors rely on in a plan's buckets (plan.h): one bucket plan for each length
 * but the last, each with the plan's tensor and op counts and pool sizes. */
static int check_bucket_plans(const tg_plan *plan, tg_err *err) {
    const int n = plan->train.n_buckets;
    if (n <= 1) return 0;
    if (n > TG_MAX_BUCKETS)
        return tg_fail(err, "the plan has %d length buckets, more than the %d a plan may hold", n, TG_MAX_BUCKETS);
    if (!plan->buckets)
        return tg_fail(err, "the plan names %d length buckets but holds no bucket plans", n);
    for (int k = 0; k + 1 < n; k++) {
        const tg_plan *b = &plan->buckets[k];
        if (b->n_tensors != plan->n_tensors || b->n_ops != plan->n_ops)
            return tg_fail(err, "length bucket %d (seq %d) has %d tensors and %d ops, the plan %d and %d", k,
                           b->train.seq, b->n_tensors, b->n_ops, plan->n_tensors, plan->n_ops);
        for (int p = 0; p < TG_POOL_COUNT; p++)
            if (b->pool_bytes[p] != plan->pool_bytes[p])
                return tg_fail(err, "length bucket %d (seq %d): its %s pool is %llu bytes, the plan's %llu (one set "
                                    "of pools serves every bucket)",
                               k, b->train.seq, tg_pool_name(p), (unsigned long long)b->pool_bytes[p],
                               (unsigned long long)plan->pool_bytes[p]);
    }
    return 0;
}

tg_device tg_default_device(void) { return tg_cuda_device_count() > 0 ? TG_DEVICE_CUDA : TG_DEVICE_CPU; }

int tg_device_parse(const char *name) {
    if (!strcmp(name, "cpu")) return TG_DEVICE_CPU;
    if (!strcmp(name, "cuda")) return TG_DEVICE_CUDA;
    return -1;
}

int tg_executor_open(tg_executor *ex, const tg_plan *plan, const tg_executor_options *opts, tg_err *err) {
    memset(ex, 0, sizeof *ex);
    const int replicas = plan->train.replicas;
    if (replicas > 1 && (!opts->comm || opts->rank < 0 || opts->rank >= replicas))
        return tg_fail(err, "the plan trains %d data-parallel replicas: the executor needs a communicator and a rank "
                            "in [0, %d) (rank %d%s)",
                       replicas, replicas, opts->rank, opts->comm ? "" : ", no communicator");
    if (check_bucket_plans(plan, err)) return -1;
    if (opts->device == TG_DEVICE_CUDA) {
        if (!tg_cuda_built()) /* GCOVR_EXCL_BR_LINE: 0 in a CPU build; a GPU build opens CUDA below */
            return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`), use --device cpu");
        return tg_executor_open_cuda(ex, plan, opts, err);
    }
    cpu_impl *c = tg_calloc(1, sizeof *c);
    if (!c) return tg_fail(err, "out of memory opening the CPU executor");
    if (tg_cpu_exec_init(&c->x, plan, opts->threads, err)) {
        free(c);
        return -1;
    }
    c->x.seed = opts->seed;
    c->root = plan; /* the last bucket, where the executor opens */
    if (replicas > 1) {
        c->x.comm = opts->comm;
        c->x.rank = opts->rank;
        if (tg_cpu_comm_group_ranks(c->x.comm) != replicas) {
            int n = tg_cpu_comm_group_ranks(c->x.comm);
            tg_cpu_exec_free(&c->x);
            free(c);
            return tg_fail(err, "the plan trains %d data-parallel replicas, the communicator joins %d", replicas, n);
        }
    }
    *ex = (tg_executor){plan, &cpu_vtbl, c, TG_DEVICE_CPU};
    return 0;
}

void tg_executor_close(tg_executor *ex) {
    if (ex->vt) ex->vt->close(ex->impl);
    memset(ex, 0, sizeof *ex);
}
