/* Independent checks of a finished plan, from its tensor table and schedule alone: the memory
 * checker (what the compiler's planner promised, verified without trusting its bookkeeping),
 * and the table consistency checks the plan decoder runs on what it read. */
#include "plan/validate.h"

#include <stdlib.h>
#include <string.h>

uint64_t tg_plan_live_activation_peak(const tg_tensor *tensors, int n_tensors, int n_ops) {
    /* Sweep over op indices with +bytes at first use and -bytes after last use. */
    int64_t *delta = calloc((size_t)n_ops + 1, sizeof *delta);
    if (!delta) return 0;
    for (int t = 0; t < n_tensors; t++) {
        const tg_tensor *x = &tensors[t];
        if (x->pool != TG_POOL_ACTIVATIONS || x->first_use < 0) continue;
        delta[x->first_use] += (int64_t)x->bytes;
        delta[x->last_use + 1] -= (int64_t)x->bytes;
    }
    int64_t live = 0, peak = 0;
    for (int o = 0; o < n_ops; o++) {
        live += delta[o];
        if (live > peak) peak = live;
    }
    free(delta);
    return (uint64_t)peak;
}

static const tg_tensor *c_sort_tensors;
static int by_pool_offset(const void *a, const void *b) {
    const tg_tensor *x = &c_sort_tensors[*(const int *)a], *y = &c_sort_tensors[*(const int *)b];
    if (x->pool != y->pool) return x->pool - y->pool;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

int tg_plan_check_memory(const tg_plan *p, tg_memory_report *r, tg_err *err) {
    memset(r, 0, sizeof *r);
    for (int o = 0; o < p->n_ops; o++) {
        const tg_op *op = &p->ops[o];
        for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
            int t = s < TG_OP_MAX_IN ? op->in[s] : op->out[s - TG_OP_MAX_IN];
            if (t < 0) continue;
            const tg_tensor *x = &p->tensors[t];
            if (o < x->first_use || o > x->last_use)
                return tg_fail(err, "op %d (%s) uses tensor %s outside its lifetime [%d, %d]", o,
                               tg_op_name(op->kind), x->name, x->first_use, x->last_use);
        }
    }
    int *order = malloc(sizeof *order * (size_t)p->n_tensors);
    uint64_t *member_bytes = calloc((size_t)p->n_tensors + 1, sizeof *member_bytes);
    if (!order || !member_bytes) {
        free(order), free(member_bytes);
        return tg_fail(err, "out of memory");
    }
    int n = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        /* A packed group member need not be aligned: it follows the member before it, and
         * the group's view, which the ops read, is aligned. */
        const char *bad = NULL;
        if (x->group >= 0) {
            const tg_tensor *v = &p->tensors[x->group];
            if (!(v->flags & TG_TENSOR_VIEW) || v->pool != x->pool || v->dtype != x->dtype ||
                (x->flags & TG_TENSOR_VIEW) || x->pool == TG_POOL_ACTIVATIONS)
                bad = "its group is not a view of its pool and dtype, or it is not a whole-step tensor";
            else if (x->offset < v->offset || x->offset + x->bytes > v->offset + v->bytes)
                bad = "it lies outside its group's view";
            else
                member_bytes[x->group] += x->bytes;
        } else if (x->offset % TG_TENSOR_ALIGN) {
            free(order), free(member_bytes);
            return tg_fail(err, "tensor %s offset %llu is not %d-byte aligned", x->name,
                           (unsigned long long)x->offset, TG_TENSOR_ALIGN);
        }
        if (bad) {
            free(order), free(member_bytes);
            return tg_fail(err, "tensor %s at offset %llu, packed in %s: %s", x->name,
                           (unsigned long long)x->offset, p->tensors[x->group].name, bad);
        }
        if (x->offset + x->bytes > r->pool_extent[x->pool]) r->pool_extent[x->pool] = x->offset + x->bytes;
        if (!(x->flags & TG_TENSOR_VIEW)) order[n++] = t;
    }
    /* Members inside the view that do not overlap (checked below) and add up to its size
     * tile it exactly: the view reads the members and nothing else. */
    for (int t = 0; t < p->n_tensors; t++)
        if (member_bytes[t] && member_bytes[t] != p->tensors[t].bytes) {
            uint64_t covered = member_bytes[t];
            free(order), free(member_bytes);
            return tg_fail(err, "packed view %s holds %llu bytes but its members %llu", p->tensors[t].name,
                           (unsigned long long)p->tensors[t].bytes, (unsigned long long)covered);
        }
    free(member_bytes);
    c_sort_tensors = p->tensors;
    qsort(order, (size_t)n, sizeof *order, by_pool_offset);
    for (int i = 0; i < n; i++) {
        const tg_tensor *x = &p->tensors[order[i]];
        /* Pools other than activations hold tensors for the whole step. */
        int x_whole = x->pool != TG_POOL_ACTIVATIONS;
        for (int j = i + 1; j < n; j++) {
            const tg_tensor *y = &p->tensors[order[j]];
            if (y->pool != x->pool || y->offset >= x->offset + x->bytes) break;
            int overlap_in_time = x_whole || !(x->last_use < y->first_use || y->last_use < x->first_use);
            if (overlap_in_time) {
                free(order);
                return tg_fail(err,
                               "tensors %s [%llu, %llu) and %s [%llu, %llu) of pool %s overlap while both live "
                               "(ops %d..%d and %d..%d)",
                               x->name, (unsigned long long)x->offset, (unsigned long long)(x->offset + x->bytes),
                               y->name, (unsigned long long)y->offset, (unsigned long long)(y->offset + y->bytes),
                               tg_pool_name(x->pool), x->first_use, x->last_use, y->first_use, y->last_use);
            }
        }
    }
    free(order);
    for (int pool = 0; pool < TG_POOL_COUNT; pool++) {
        if (r->pool_extent[pool] > p->pool_bytes[pool])
            return tg_fail(err, "pool %s: tensors reach %llu bytes but the pool has %llu", tg_pool_name(pool),
                           (unsigned long long)r->pool_extent[pool], (unsigned long long)p->pool_bytes[pool]);
        r->peak_bytes += r->pool_extent[pool];
    }
    r->activation_live_peak = tg_plan_live_activation_peak(p->tensors, p->n_tensors, p->n_ops);
    return 0;
}

/* ---- table consistency (run by the plan decoder) ------------------------------ */

/* What is wrong with a tensor's class flags and pool, or NULL: a tensor has at most one
 * class; trainable parameters live in the params pool, frozen ones in the frozen pool,
 * buffers in the buffers pool, and those pools hold nothing else (the params pool's
 * whole-pool views excepted); only buffers may be persistent, and only trainable parameters
 * have gradients. */
static const char *tensor_class_error(const tg_tensor *x) {
    const int param = (x->flags & TG_TENSOR_PARAM) != 0, frozen = (x->flags & TG_TENSOR_FROZEN) != 0,
              buffer = (x->flags & TG_TENSOR_BUFFER) != 0;
    if (param + frozen + buffer > 1) return "it has more than one of the flags param, frozen and buffer";
    if (param && x->pool != TG_POOL_PARAMS) return "a trainable parameter must be in the params pool";
    if (frozen && x->pool != TG_POOL_FROZEN) return "a frozen parameter must be in the frozen pool";
    if (buffer && x->pool != TG_POOL_BUFFERS) return "a buffer must be in the buffers pool";
    if (x->pool == TG_POOL_FROZEN && !frozen) return "the frozen pool holds frozen parameters only";
    if (x->pool == TG_POOL_BUFFERS && !buffer) return "the buffers pool holds buffers only";
    if (x->pool == TG_POOL_PARAMS && !param && !(x->flags & TG_TENSOR_VIEW))
        return "the params pool holds trainable parameters (and views of the pool) only";
    if ((x->flags & TG_TENSOR_PERSISTENT) && !buffer) return "only a buffer may be persistent";
    if ((frozen || buffer) && x->grad != -1) return "only a trainable parameter has a gradient";
    return NULL;
}

int tg_plan_validate_tables(const tg_plan *p, const char *name, tg_err *err) {
    const tg_model_config *m = &p->model;
    const tg_plan_train *t = &p->train;
    const tg_plan_run *r = &p->run;
    if (m->arch < 0 || m->arch >= TG_ARCH_COUNT)
        return tg_fail(err, "%s: model arch %d is not a known architecture", name, m->arch);
    if (t->task < 0 || t->task >= TG_TASK_COUNT)
        return tg_fail(err, "%s: train task %d is not a known task", name, t->task);
    if (t->batch < 1)
        return tg_fail(err, "%s: train batch %d is not a positive row count", name, t->batch);
    if (t->seq < 1)
        return tg_fail(err, "%s: train seq %d is not a positive length", name, t->seq);
    if (t->num_labels < 1)
        return tg_fail(err, "%s: train num_labels %d is not a positive count", name, t->num_labels);
    if (t->pad_id < 0 || t->pad_id >= m->vocab_size)
        return tg_fail(err, "%s: train pad_id %d is outside the model's vocabulary (vocab_size %d)", name,
                       t->pad_id, m->vocab_size);
    if (t->precision < 0 || t->precision >= TG_PREC_COUNT)
        return tg_fail(err, "%s: train precision %d is not a known precision", name, t->precision);
    if (t->allow_tf32 != 0 && t->allow_tf32 != 1)
        return tg_fail(err, "%s: train allow_tf32 %d is not a boolean", name, t->allow_tf32);
    if (t->replicas < 1 || t->replicas > TG_MAX_DATA_PARALLEL)
        return tg_fail(err, "%s: train replicas %d is not in [1, %d]", name, t->replicas, TG_MAX_DATA_PARALLEL);
    if (t->zero_stage < 0 || t->zero_stage > 1 || (t->zero_stage && t->replicas < 2))
        return tg_fail(err, "%s: train zero_stage %d is not 0, or 1 with replicas >= 2", name, t->zero_stage);
    if (t->attention < 0 || t->attention >= TG_ATTENTION_MODE_COUNT)
        return tg_fail(err, "%s: train attention mode %d is not a known mode", name, t->attention);
    if (r->steps < 0 || r->epochs < 0 || (r->steps > 0) == (r->epochs > 0))
        return tg_fail(err, "%s: run steps %d and epochs %d: exactly one must be positive", name, r->steps,
                       r->epochs);
    if (r->log_every < 1)
        return tg_fail(err, "%s: run log_every %d is not a positive step count", name, r->log_every);
    if (r->checkpoint_every < 0 || r->keep_checkpoints < 0)
        return tg_fail(err, "%s: run checkpoint_every %d and keep_checkpoints %d: neither may be negative", name,
                       r->checkpoint_every, r->keep_checkpoints);

    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->dtype < 0 || x->dtype >= TG_DTYPE_COUNT)
            return tg_fail(err, "%s: tensor %d (%s) has dtype %d", name, t, x->name, x->dtype);
        if (x->ndim < 0 || x->ndim > TG_MAX_DIMS)
            return tg_fail(err, "%s: tensor %d (%s) has %d dims (0..%d allowed)", name, t,
                           x->name, x->ndim, TG_MAX_DIMS);
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] < 0)
                return tg_fail(err, "%s: tensor %d (%s) dim %d is %lld", name, t, x->name, d,
                               (long long)x->shape[d]);
        /* The byte size is what every copy of the tensor moves: it must be its elements'. */
        uint64_t elements = 1, bytes = 0;
        int overflow = 0;
        for (int d = 0; d < x->ndim; d++) overflow |= __builtin_mul_overflow(elements, (uint64_t)x->shape[d], &elements);
        overflow |= __builtin_mul_overflow(elements, (uint64_t)tg_dtype_size(x->dtype), &bytes);
        if (overflow || bytes != x->bytes)
            return tg_fail(err, "%s: tensor %d (%s) holds %llu bytes, but its shape and dtype make %s%llu", name, t,
                           x->name, (unsigned long long)x->bytes, overflow ? "more than " : "",
                           (unsigned long long)(overflow ? UINT64_MAX : bytes));
        if (x->pool < 0 || x->pool >= TG_POOL_COUNT)
            return tg_fail(err, "%s: tensor %d (%s) is in pool %d of %d", name, t, x->name,
                           x->pool, TG_POOL_COUNT);
        uint64_t cap = p->pool_bytes[x->pool];
        if (x->offset > cap || x->bytes > cap - x->offset)
            return tg_fail(err,
                           "%s: tensor %d (%s) at offset %llu + %llu bytes runs past the "
                           "%s pool (%llu bytes)",
                           name, t, x->name, (unsigned long long)x->offset,
                           (unsigned long long)x->bytes, tg_pool_name(x->pool),
                           (unsigned long long)cap);
        if (x->flags & ~TG_TENSOR_FLAGS_ALL)
            return tg_fail(err, "%s: tensor %d (%s) has unknown flag bits 0x%x (file corrupt or from a newer build)",
                           name, t, x->name, (unsigned)(x->flags & ~TG_TENSOR_FLAGS_ALL));
        const char *class_error = tensor_class_error(x);
        if (class_error)
            return tg_fail(err, "%s: tensor %d (%s) in the %s pool: %s", name, t, x->name, tg_pool_name(x->pool),
                           class_error);
        if (x->init < 0 || x->init >= TG_INIT_COUNT)
            return tg_fail(err, "%s: tensor %d (%s) has init rule %d of %d", name, t, x->name, x->init,
                           TG_INIT_COUNT);
        if (x->grad < -1 || x->grad >= p->n_tensors)
            return tg_fail(err, "%s: tensor %d (%s) gradient refers to tensor %d of %d", name,
                           t, x->name, x->grad, p->n_tensors);
        if (x->master < -1 || x->master >= p->n_tensors)
            return tg_fail(err, "%s: tensor %d (%s) master copy refers to tensor %d of %d", name,
                           t, x->name, x->master, p->n_tensors);
        if (x->group < -1 || x->group >= p->n_tensors)
            return tg_fail(err, "%s: tensor %d (%s) packed group refers to tensor %d of %d", name,
                           t, x->name, x->group, p->n_tensors);
        if (x->first_use < -1 || x->first_use >= p->n_ops || x->last_use < -1 ||
            x->last_use >= p->n_ops)
            return tg_fail(err, "%s: tensor %d (%s) uses ops %d..%d of %d", name, t, x->name,
                           x->first_use, x->last_use, p->n_ops);
    }

    if (p->phase_begin[0] != 0 || p->phase_begin[TG_PHASE_COUNT] != p->n_ops)
        return tg_fail(err, "%s: phase table runs %d..%d, expected 0..%d (n_ops)", name,
                       p->phase_begin[0], p->phase_begin[TG_PHASE_COUNT], p->n_ops);
    for (int ph = 0; ph < TG_PHASE_COUNT; ph++)
        if (p->phase_begin[ph + 1] < p->phase_begin[ph])
            return tg_fail(err, "%s: phase %s begins at op %d but ends at op %d", name,
                           tg_phase_name(ph), p->phase_begin[ph], p->phase_begin[ph + 1]);

    for (int o = 0, ph = 0; o < p->n_ops; o++) {
        const tg_op *op = &p->ops[o];
        if (op->kind < 0 || op->kind >= TG_OP_COUNT)
            return tg_fail(err, "%s: op %d has kind %d of %d", name, o, op->kind, TG_OP_COUNT);
        while (o >= p->phase_begin[ph + 1]) ph++;
        if (op->phase != ph)
            return tg_fail(err, "%s: op %d (%s) has phase %d but sits in the %s phase", name,
                           o, tg_op_name(op->kind), op->phase, tg_phase_name(ph));
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (op->in[k] < -1 || op->in[k] >= p->n_tensors)
                return tg_fail(err, "%s: op %d (%s) input %d refers to tensor %d of %d", name,
                               o, tg_op_name(op->kind), k, op->in[k], p->n_tensors);
        for (int k = 0; k < TG_OP_MAX_OUT; k++)
            if (op->out[k] < -1 || op->out[k] >= p->n_tensors)
                return tg_fail(err, "%s: op %d (%s) output %d refers to tensor %d of %d", name,
                               o, tg_op_name(op->kind), k, op->out[k], p->n_tensors);
        /* The activation epilogue and its pre-activation: written (out2) or read (in3). */
        if (op->kind == TG_OP_MATMUL) {
            int64_t act = op->p.matmul.activation;
            if (act < TG_MATMUL_ACT_NONE || act > TG_MATMUL_ACT_GELU_BWD)
                return tg_fail(err, "%s: op %d (matmul) has activation=%lld (0, 1 or 2 allowed)", name,
                               o, (long long)act);
            if ((act == TG_MATMUL_ACT_GELU && op->out[2] < 0) || (act == TG_MATMUL_ACT_GELU_BWD && op->in[3] < 0))
                return tg_fail(err, "%s: op %d (matmul) with activation=%lld lacks its pre-activation "
                               "(%s)", name, o, (long long)act, act == TG_MATMUL_ACT_GELU ? "out2" : "in3");
        }
    }

    static const char *const io_names[] = {
        "input_ids", "attention_mask", "token_type_ids", "position_ids", "labels",
        "logits", "loss", "step", "total_steps", "lr", "grad_norm", "params_all",
        "grads_all", "m_all", "v_all", "params_bf16_all"};
    int32_t iov[sizeof io_names / sizeof io_names[0]];
    _Static_assert(sizeof iov == sizeof(tg_plan_io), "io names");
    memcpy(iov, &p->io, sizeof iov); /* tg_plan_io is all int32, in this order */
    for (size_t k = 0; k < sizeof io_names / sizeof io_names[0]; k++)
        if (iov[k] < -1 || iov[k] >= p->n_tensors)
            return tg_fail(err, "%s: io %s refers to tensor %d of %d", name, io_names[k],
                           iov[k], p->n_tensors);
    return 0;
}
