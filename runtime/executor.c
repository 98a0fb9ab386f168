/* The CPU executor behind the executor interface, and the dispatch to the CUDA one. */
#include "runtime/executor.h"
#include "base/clock.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/cpu_exec.h"

/* The CPU runs a step at once; step_wait hands over the result it left. The executor comes
 * first, so impl is also a tg_cpu_exec *. */
typedef struct cpu_impl {
    tg_cpu_exec x;
    tg_step_result last;
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

static void *cpu_host_alloc(void *impl, size_t bytes) { return calloc(1, bytes ? bytes : 1); }
static void cpu_host_free(void *impl, void *p) { free(p); }

static int cpu_step_start(void *impl, const void *const *batches, int steps, tg_err *err) {
    cpu_impl *c = impl;
    const tg_plan *p = c->x.plan;
    const void *inputs = batches[0];
    if (steps != 1) return tg_fail(err, "the CPU executor runs one step per start, asked for %d", steps);
    double marks[5];
    marks[0] = tg_wall_ms();
    if (p->pool_bytes[TG_POOL_INPUTS]) memcpy(c->x.pool[TG_POOL_INPUTS], inputs, p->pool_bytes[TG_POOL_INPUTS]);
    marks[1] = tg_wall_ms();
    c->x.training = 1;
    for (int ph = TG_PHASE_FORWARD; ph <= TG_PHASE_OPTIMIZER; ph++) {
        if (tg_cpu_exec_phases(&c->x, ph, ph, err)) return -1;
        marks[2 + ph] = tg_wall_ms();
    }
    tg_step_result *r = &c->last;
    r->loss = *(float *)tg_cpu_tensor(&c->x, p->io.loss);
    r->lr = *(float *)tg_cpu_tensor(&c->x, p->io.lr);
    r->grad_norm = *(float *)tg_cpu_tensor(&c->x, p->io.grad_norm);
    for (int k = 0; k < 4; k++) r->phase_ms[k] = (float)(marks[k + 1] - marks[k]);
    r->period_ms = -1.0f;
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

static void cpu_close(void *impl) {
    tg_cpu_exec_free(impl);
    free(impl);
}

static const tg_executor_vtbl cpu_vtbl = {"cpu",          cpu_run,        cpu_write,     cpu_read,    cpu_host_alloc,
                                          cpu_host_free, cpu_step_start, cpu_step_wait, cpu_profile, cpu_close, NULL, 1, 1, 0};

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
    if (opts->device == TG_DEVICE_CUDA) {
        if (!tg_cuda_built())
            return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`), use --device cpu");
        return tg_executor_open_cuda(ex, plan, opts, err);
    }
    cpu_impl *c = calloc(1, sizeof *c);
    if (!c) return tg_fail(err, "out of memory");
    if (tg_cpu_exec_init(&c->x, plan, opts->threads, err)) {
        free(c);
        return -1;
    }
    c->x.seed = opts->seed;
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
