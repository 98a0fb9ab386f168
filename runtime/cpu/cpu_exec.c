/* The CPU reference executor: owns the pools and walks the schedule, handing each op
 * its buffers (resolved from the tensor table) and running its kernel (runtime/cpu/). */
#include "runtime/comm.h"
#include "runtime/cpu/cpu_exec.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/cpu/threadpool.h"

int tg_cpu_exec_init(tg_cpu_exec *x, const tg_plan *plan, int threads, tg_err *err) {
    memset(x, 0, sizeof *x);
    x->plan = plan;
    x->seed = plan->run.seed;
    x->training = 1;
    for (int p = 0; p < TG_POOL_COUNT; p++) {
        uint64_t bytes = plan->pool_bytes[p];
        if (bytes == 0 || !tg_pool_allocated(plan, p)) continue;
        /* aligned_alloc wants a multiple of 64; past SIZE_MAX - 63 there is none (and
         * rounding up would wrap to a tiny pool). */
        const size_t padded = bytes <= SIZE_MAX - 63 ? (size_t)((bytes + 63) / 64 * 64) : 0;
        x->pool[p] = padded ? tg_aligned_alloc(64, padded) : NULL;
        if (!x->pool[p]) {
            tg_cpu_exec_free(x);
            return tg_fail(err, "cpu executor: cannot allocate %llu bytes for the %s pool",
                           (unsigned long long)bytes, tg_pool_name(p));
        }
        memset(x->pool[p], 0, padded);
    }
    if (!tg_pool_allocated(plan, TG_POOL_GRADS)) x->pool[TG_POOL_GRADS] = x->pool[TG_POOL_ACTIVATIONS];
    const long failed_before = tg_alloc_failures();
    x->threads = tg_threadpool_create(threads);
    if (!x->threads) {
        tg_cpu_exec_free(x);
        if (tg_alloc_failures() != failed_before)
            return tg_fail(err, "cpu executor: out of memory starting %d worker threads", threads);
        return tg_fail(err, "cpu executor: cannot start %d worker threads", threads);
    }
    return 0;
}

void tg_cpu_exec_free(tg_cpu_exec *x) {
    if (!x) return;
    for (int p = 0; p < TG_POOL_COUNT; p++)
        if (!(p == TG_POOL_GRADS && x->pool[p] == x->pool[TG_POOL_ACTIVATIONS])) free(x->pool[p]);
    tg_threadpool_destroy(x->threads);
    memset(x, 0, sizeof *x);
}

void *tg_cpu_tensor(const tg_cpu_exec *x, int tensor) {
    if (!x->plan || tensor < 0 || tensor >= x->plan->n_tensors) return NULL;
    const tg_tensor *t = &x->plan->tensors[tensor];
    if (t->pool < 0 || t->pool >= TG_POOL_COUNT || !x->pool[t->pool]) return NULL;
    return x->pool[t->pool] + t->offset;
}

/* Resolves one slot: -1 is an absent operand; anything else must lie inside its pool. */
static int bind_slot(const tg_cpu_exec *x, int op_index, const char *dir, int slot, int tensor,
                     void **ptr, int64_t *numel, tg_err *err) {
    const tg_plan *plan = x->plan;
    *ptr = NULL;
    *numel = 0;
    if (tensor == -1) return 0;
    if (tensor < 0 || tensor >= plan->n_tensors)
        return tg_fail(err, "op %d (%s): %s[%d] names tensor %d, outside the table of %d",
                       op_index, tg_op_name(plan->ops[op_index].kind), dir, slot, tensor,
                       plan->n_tensors);
    const tg_tensor *t = &plan->tensors[tensor];
    if (t->pool < 0 || t->pool >= TG_POOL_COUNT || t->offset > plan->pool_bytes[t->pool] ||
        t->bytes > plan->pool_bytes[t->pool] - t->offset || (!x->pool[t->pool] && t->bytes))
        return tg_fail(err, "op %d (%s): tensor '%s' (%llu bytes at %llu) lies outside the %s pool",
                       op_index, tg_op_name(plan->ops[op_index].kind), t->name,
                       (unsigned long long)t->bytes, (unsigned long long)t->offset,
                       tg_pool_name(t->pool));
    *ptr = x->pool[t->pool] ? x->pool[t->pool] + t->offset : NULL; /* empty pool: no storage */
    *numel = tg_tensor_numel(t);
    return 0;
}

int tg_cpu_exec_range(tg_cpu_exec *x, int first, int last, tg_err *err) {
    const tg_plan *plan = x->plan;
    if (first < 0 || last > plan->n_ops || first > last)
        return tg_fail(err, "cpu executor: op range [%d, %d) outside the schedule of %d ops",
                       first, last, plan->n_ops);
    for (int k = first; k < last; k++) {
        const tg_op *op = &plan->ops[k];
        if (op->kind < 0 || op->kind >= TG_OP_COUNT)
            return tg_fail(err, "op %d: unknown op kind %d", k, op->kind);
        atomic_int out_of_memory = 0;
        tg_cpu_op_args a = {.op = op, .seed = x->seed, .training = x->training, .plan = plan,
                            .threads = x->threads, .comm = x->comm, .rank = x->rank,
                            .out_of_memory = &out_of_memory};
        for (int s = 0; s < TG_OP_MAX_IN; s++) {
            if (bind_slot(x, k, "in", s, op->in[s], &a.in[s], &a.in_numel[s], err)) return -1;
            a.in_dtype[s] = (int8_t)(op->in[s] >= 0 ? plan->tensors[op->in[s]].dtype : TG_F32);
        }
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            if (bind_slot(x, k, "out", s, op->out[s], &a.out[s], &a.out_numel[s], err)) return -1;
            a.out_dtype[s] = (int8_t)(op->out[s] >= 0 ? plan->tensors[op->out[s]].dtype : TG_F32);
        }
        if (tg_cpu_op_run_any(&a) || atomic_load(&out_of_memory)) {
            /* A collective of ranks under MPI fails for its own reasons (a rank gone, sizes
             * that disagree), which its group keeps. */
            const char *why = x->comm ? tg_cpu_comm_group_error(x->comm) : NULL;
            if (why && *why) return tg_fail(err, "op %d (%s): %s", k, tg_op_name(op->kind), why);
            return tg_fail(err, "op %d (%s): out of memory for its scratch buffers", k, tg_op_name(op->kind));
        }
    }
    return 0;
}

int tg_cpu_exec_phases(tg_cpu_exec *x, int first_phase, int last_phase, tg_err *err) {
    if (first_phase < 0 || last_phase >= TG_PHASE_COUNT || first_phase > last_phase)
        return tg_fail(err, "cpu executor: phase range [%d, %d] is not within 0..%d",
                       first_phase, last_phase, TG_PHASE_COUNT - 1);
    return tg_cpu_exec_range(x, x->plan->phase_begin[first_phase],
                             x->plan->phase_begin[last_phase + 1], err);
}
