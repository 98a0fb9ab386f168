/* The CPU executor behind the executor interface, and the dispatch to the CUDA one. */
#include "runtime/executor.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/cpu_exec.h"

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

static void cpu_close(void *impl) {
    tg_cpu_exec_free(impl);
    free(impl);
}

static const tg_executor_vtbl cpu_vtbl = {"cpu", cpu_run, cpu_write, cpu_read, cpu_close};

int tg_cuda_built(void) { return tg_executor_open_cuda != NULL; }

tg_device tg_default_device(void) {
    return tg_cuda_built() && tg_cuda_device_count && tg_cuda_device_count() > 0 ? TG_DEVICE_CUDA : TG_DEVICE_CPU;
}

int tg_device_parse(const char *name) {
    if (!strcmp(name, "cpu")) return TG_DEVICE_CPU;
    if (!strcmp(name, "cuda")) return TG_DEVICE_CUDA;
    return -1;
}

int tg_executor_open(tg_executor *ex, const tg_plan *plan, const tg_executor_options *opts, tg_err *err) {
    memset(ex, 0, sizeof *ex);
    if (opts->device == TG_DEVICE_CUDA) {
        if (!tg_cuda_built())
            return tg_fail(err, "this build has no CUDA executor (build it with `make gpu`), use --device cpu");
        return tg_executor_open_cuda(ex, plan, opts, err);
    }
    tg_cpu_exec *x = calloc(1, sizeof *x);
    if (!x) return tg_fail(err, "out of memory");
    if (tg_cpu_exec_init(x, plan, opts->threads, err)) {
        free(x);
        return -1;
    }
    x->seed = opts->seed;
    *ex = (tg_executor){plan, &cpu_vtbl, x, TG_DEVICE_CPU};
    return 0;
}

void tg_executor_close(tg_executor *ex) {
    if (ex->vt) ex->vt->close(ex->impl);
    memset(ex, 0, sizeof *ex);
}
