/* Independent checks of a finished plan, from its tensor table and schedule alone: the memory
 * checker (what the compiler's planner promised, verified without trusting its bookkeeping),
 * and the table consistency checks the plan decoder runs on what it read. */
#include "plan/validate.h"
#include "base/alloc.h"

#include <math.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/grad_hold.h"
#include "plan/op_meta.h"

int tg_plan_live_activation_peak(const tg_tensor *tensors, int n_tensors, int n_ops, const tg_grad_hold *holds,
                                 int n_holds, uint64_t *peak_out) {
    /* Sweep over op indices with +bytes at first use and -bytes after last use. */
    int64_t *delta = tg_calloc((size_t)n_ops + 1, sizeof *delta);
    if (!delta) return -1;
    for (int t = 0; t < n_tensors; t++) {
        const tg_tensor *x = &tensors[t];
        /* Lifetimes outside the schedule are the table checks' to refuse, never indices here. */
        if (x->pool != TG_POOL_ACTIVATIONS || x->first_use < 0 || x->last_use < x->first_use || x->last_use >= n_ops)
            continue;
        delta[x->first_use] += (int64_t)x->bytes;
        delta[x->last_use + 1] -= (int64_t)x->bytes;
    }
    for (int i = 0; i < n_holds; i++) {
        const tg_grad_hold *h = &holds[i];
        const int64_t bytes = (int64_t)(h->b - h->a);
        if (h->from < 0 || h->to < h->from || h->to >= n_ops || h->wrap_to >= n_ops) continue; /* holds are made in range */
        const int from = h->wrap_to + 1 >= h->from ? 0 : h->from; /* the two spans as one where they meet */
        delta[from] += bytes, delta[h->to + 1] -= bytes;
        if (h->wrap_to >= 0 && from > 0) delta[0] += bytes, delta[h->wrap_to + 1] -= bytes;
    }
    int64_t live = 0, peak = 0;
    for (int o = 0; o < n_ops; o++) {
        live += delta[o];
        if (live > peak) peak = live;
    }
    free(delta);
    *peak_out = (uint64_t)peak;
    return 0;
}

/* A tensor's place in its pool, the sort key of the overlap check. The key travels with
 * the index, so the comparison needs no global (tg_plan_check_memory is called from any
 * thread: every plan load runs it). */
typedef struct placed {
    int32_t pool;
    int32_t tensor;
    uint64_t offset;
} placed;

static int by_pool_offset(const void *a, const void *b) {
    const placed *x = a, *y = b;
    if (x->pool != y->pool) return x->pool < y->pool ? -1 : 1;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->tensor > y->tensor) - (x->tensor < y->tensor);
}

/* Gradients in the activation pool: no activation shares bytes with a gradient (or the
 * padding between them) while both are held (plan/grad_hold.h). */
static int check_shared_grads(const tg_plan *p, const tg_grad_hold *h, int n, tg_err *err) {
    int rc = 0;
    for (int t = 0; t < p->n_tensors && !rc; t++) {
        const tg_tensor *y = &p->tensors[t];
        if (y->pool != TG_POOL_ACTIVATIONS || (y->flags & TG_TENSOR_VIEW) || !y->bytes) continue;
        /* The first hold ending past y's start (holds are in offset order, apart). */
        int lo = 0, hi = n;
        while (lo < hi) {
            const int mid = lo + (hi - lo) / 2;
            if (h[mid].b <= y->offset) lo = mid + 1;
            else hi = mid;
        }
        for (int i = lo; i < n && h[i].a < y->offset + y->bytes && !rc; i++) {
            if (!tg_grad_hold_meets(&h[i], y->first_use, y->last_use)) continue;
            char held[64];
            if (h[i].wrap_to >= 0) snprintf(held, sizeof held, "ops 0..%d and %d..%d", h[i].wrap_to, h[i].from, h[i].to);
            else snprintf(held, sizeof held, "ops %d..%d", h[i].from, h[i].to);
            rc = tg_fail(err,
                         "activation %s [%llu, %llu) (ops %d..%d) and %s [%llu, %llu) of the gradients it shares the "
                         "pool with (held %s) overlap",
                         y->name, (unsigned long long)y->offset, (unsigned long long)(y->offset + y->bytes),
                         y->first_use, y->last_use, h[i].tensor >= 0 ? p->tensors[h[i].tensor].name : "the padding",
                         (unsigned long long)h[i].a, (unsigned long long)h[i].b, held);
        }
    }
    return rc;
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
    placed *order = tg_malloc(sizeof *order * (size_t)(p->n_tensors ? p->n_tensors : 1));
    uint64_t *member_bytes = tg_calloc((size_t)p->n_tensors + 1, sizeof *member_bytes);
    if (!order || !member_bytes) {
        free(order), free(member_bytes);
        return tg_fail(err, "out of memory checking the memory layout of %d tensors", p->n_tensors);
    }
    int n = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        /* A packed group member need not be 256-byte aligned: it follows the member before
         * it, and the group's view, which the ops read, is aligned. Its elements are. */
        const char *bad = NULL;
        if (x->group >= 0) {
            const tg_tensor *v = &p->tensors[x->group];
            if (!(v->flags & TG_TENSOR_VIEW) || v->pool != x->pool || v->dtype != x->dtype ||
                (x->flags & TG_TENSOR_VIEW) || x->pool == TG_POOL_ACTIVATIONS)
                bad = "its group is not a view of its pool and dtype, or it is not a whole-step tensor";
            else if (x->offset < v->offset || x->offset + x->bytes > v->offset + v->bytes)
                bad = "it lies outside its group's view";
            else if (x->offset % (uint64_t)tg_dtype_size(x->dtype))
                bad = "its offset is not a multiple of its element size";
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
        if (!(x->flags & TG_TENSOR_VIEW)) order[n++] = (placed){x->pool, t, x->offset};
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
    qsort(order, (size_t)n, sizeof *order, by_pool_offset);
    for (int i = 0; i < n; i++) {
        const tg_tensor *x = &p->tensors[order[i].tensor];
        /* Pools other than activations hold tensors for the whole step. */
        int x_whole = x->pool != TG_POOL_ACTIVATIONS;
        for (int j = i + 1; j < n; j++) {
            const tg_tensor *y = &p->tensors[order[j].tensor];
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
        if (!(pool == TG_POOL_GRADS && p->grads_share_activations)) r->peak_bytes += r->pool_extent[pool];
    }
    tg_grad_hold *holds = NULL;
    int n_holds = 0;
    if (p->grads_share_activations && tg_grad_holds(p->tensors, p->n_tensors, p->ops, p->n_ops, p->phase_begin,
                                                    p->pool_bytes[TG_POOL_GRADS], &holds, &n_holds))
        return tg_fail(err, "out of memory checking the gradients shared with the activation pool");
    int rc = p->grads_share_activations ? check_shared_grads(p, holds, n_holds, err) : 0;
    if (!rc && tg_plan_live_activation_peak(p->tensors, p->n_tensors, p->n_ops, holds, n_holds, &r->activation_live_peak))
        rc = tg_fail(err, "out of memory computing the activation live peak over %d ops", p->n_ops);
    free(holds);
    return rc;
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
    if (param && x->dtype != TG_F32) return "a trainable parameter must be f32 (the params pool holds fp32 masters)";
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
    /* A Llama export writes these into config.json: kv heads dividing the heads, a known
     * rope type (the ops carry their own, checked by their shape rules). */
    if (m->arch == TG_ARCH_LLAMA && (m->kv_heads < 1 || m->heads < 1 || m->heads % m->kv_heads))
        return tg_fail(err, "%s: model kv_heads %d does not divide heads %d", name, m->kv_heads, m->heads);
    if (m->arch == TG_ARCH_LLAMA && (m->rope_type < TG_ROPE_DEFAULT || m->rope_type >= TG_ROPE_TYPE_COUNT))
        return tg_fail(err, "%s: model rope_type %d is not a known rope type", name, m->rope_type);
    /* An image model's export writes these into config.json, and its batches are images of
     * this size. */
    if (m->arch == TG_ARCH_MOBILENET_V2 &&
        (m->image_channels < 1 || m->image_size < 1 || !(m->width_mult > 0.0f) || !isfinite(m->width_mult)))
        return tg_fail(err, "%s: model image_channels %d, image_size %d or width_mult %g is not positive", name,
                       m->image_channels, m->image_size, (double)m->width_mult);
    if (t->task < 0 || t->task >= TG_TASK_COUNT)
        return tg_fail(err, "%s: train task %d is not a known task", name, t->task);
    if (t->batch < 1)
        return tg_fail(err, "%s: train batch %d is not a positive row count", name, t->batch);
    if (t->seq < 1)
        return tg_fail(err, "%s: train seq %d is not a positive length", name, t->seq);
    /* A classifier has two classes or more; an LM plan carries no class count. */
    if (t->task == TG_TASK_CLASSIFY ? t->num_labels < 2 : t->num_labels < 0)
        return tg_fail(err, "%s: train num_labels %d is not %s", name, t->num_labels,
                       t->task == TG_TASK_CLASSIFY ? "2 or more" : "0 or more");
    /* Image models have no tokens, and no padding id (0). */
    if (m->arch == TG_ARCH_MOBILENET_V2 ? t->pad_id != 0 : t->pad_id < 0 || t->pad_id >= m->vocab_size)
        return tg_fail(err, "%s: train pad_id %d is outside the model's vocabulary (vocab_size %d)", name,
                       t->pad_id, m->vocab_size);
    /* RoBERTa numbers positions from pad_id + 1 (datasets/batch.c): they must stay int32. */
    if ((int64_t)t->pad_id + t->seq > INT32_MAX)
        return tg_fail(err, "%s: train pad_id %d + seq %d passes the largest position id (%d)", name, t->pad_id,
                       t->seq, INT32_MAX);
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
    /* The buckets: 1..TG_MAX_BUCKETS lengths, positive and strictly ascending, the unused
     * entries 0, seq one of them (a bucket plan's; the plan's is the last, which
     * tg_plan_validate_buckets checks). */
    if (t->n_buckets < 1 || t->n_buckets > TG_MAX_BUCKETS)
        return tg_fail(err, "%s: train n_buckets %d is not in [1, %d]", name, t->n_buckets, TG_MAX_BUCKETS);
    int seq_is_bucket = 0;
    for (int k = 0; k < TG_MAX_BUCKETS; k++) {
        const int32_t b = t->bucket_seq[k];
        if (k >= t->n_buckets ? b != 0 : b < 1 || (k > 0 && b <= t->bucket_seq[k - 1]))
            return tg_fail(err, "%s: train bucket_seq[%d] is %d; the %d bucket lengths must be positive and strictly "
                                "ascending (the entries past them 0)",
                           name, k, b, t->n_buckets);
        seq_is_bucket |= k < t->n_buckets && b == t->seq;
    }
    if (!seq_is_bucket)
        return tg_fail(err, "%s: train seq %d is none of the %d bucket lengths (bucket_seq)", name, t->seq,
                       t->n_buckets);
    if (t->grad_accumulation < 1 || t->grad_accumulation > TG_MAX_GRAD_ACCUMULATION)
        return tg_fail(err, "%s: train grad_accumulation %d is not in [1, %d]", name, t->grad_accumulation,
                       TG_MAX_GRAD_ACCUMULATION);
    /* A power of two (GradScaler's default 65536 is one): scaling the seed, unscaling the
     * gradients and backing off are then exact. */
    const int fp16 = t->precision == TG_PREC_FP16;
    int scale_exp = 0;
    if (fp16 ? !(isfinite(t->loss_scale_init) && t->loss_scale_init > 0.0f &&
                 frexpf(t->loss_scale_init, &scale_exp) == 0.5f)
             : t->loss_scale_init != 0.0f)
        return tg_fail(err, "%s: train loss_scale_init %g is not %s", name, (double)t->loss_scale_init,
                       fp16 ? "a positive power of two (fp16 plans)" : "0 (only fp16 plans scale the loss)");
    if (t->grad_accumulation > 1 && t->n_buckets > 1)
        return tg_fail(err, "%s: train grad_accumulation %d with n_buckets %d: accumulation runs without length "
                            "buckets",
                       name, t->grad_accumulation, t->n_buckets);
    if (r->last_batch < 0 || r->last_batch >= TG_LAST_BATCH_COUNT)
        return tg_fail(err, "%s: run last_batch %d is not pad, drop or wrap", name, r->last_batch);
    if (r->skip_nonfinite != 0 && r->skip_nonfinite != 1)
        return tg_fail(err, "%s: run skip_nonfinite %d is not 0 or 1", name, r->skip_nonfinite);
    if (r->max_skipped_steps < 0)
        return tg_fail(err, "%s: run max_skipped_steps %d is negative", name, r->max_skipped_steps);
    if (r->qa_n_best < 1 || r->qa_n_best > TG_QA_MAX_N_BEST)
        return tg_fail(err, "%s: run qa_n_best %d is not in [1, %d]", name, r->qa_n_best, TG_QA_MAX_N_BEST);
    if (r->qa_max_answer_length < 1)
        return tg_fail(err, "%s: run qa_max_answer_length %d is below 1", name, r->qa_max_answer_length);
    if (!isfinite(r->qa_null_threshold))
        return tg_fail(err, "%s: run qa_null_threshold %g is not finite", name, (double)r->qa_null_threshold);
    if (!(r->gpu_hour_price >= 0 && r->gpu_hour_price <= TG_GPU_HOUR_PRICE_MAX))
        return tg_fail(err, "%s: run gpu_hour_price %g is not in [0, %g]", name, (double)r->gpu_hour_price,
                       TG_GPU_HOUR_PRICE_MAX);
    if (r->last_batch == TG_LAST_BATCH_WRAP && t->n_buckets > 1)
        return tg_fail(err, "%s: run last_batch is wrap, which is not allowed with length buckets (n_buckets %d)", name,
                       t->n_buckets);
    if (r->steps < 0 || r->epochs < 0 || (r->steps > 0) == (r->epochs > 0))
        return tg_fail(err, "%s: run steps %d and epochs %d: exactly one must be positive", name, r->steps,
                       r->epochs);
    if (r->log_every < 1)
        return tg_fail(err, "%s: run log_every %d is not a positive step count", name, r->log_every);
    if (r->checkpoint_every < 0 || r->keep_checkpoints < 0)
        return tg_fail(err, "%s: run checkpoint_every %d and keep_checkpoints %d: neither may be negative", name,
                       r->checkpoint_every, r->keep_checkpoints);

    /* Every sum of pool sizes, offsets and byte counts below stays far inside uint64 and
     * int64 (nine pools of at most 2^48 bytes). */
    for (int q = 0; q < TG_POOL_COUNT; q++)
        if (p->pool_bytes[q] > TG_POOL_MAX_BYTES)
            return tg_fail(err, "%s: pool %s holds %llu bytes, more than the %llu a plan may have", name,
                           tg_pool_name(q), (unsigned long long)p->pool_bytes[q],
                           (unsigned long long)TG_POOL_MAX_BYTES);
    if (p->grads_share_activations != 0 && p->grads_share_activations != 1)
        return tg_fail(err, "%s: grads_share_activations %d is not 0 or 1", name, p->grads_share_activations);
    /* Shared gradients hold one step's values: an accumulation window needs them across
     * micro-steps. (Length buckets share them: each bucket's plan holds them by its own
     * schedule, at the same offsets, and the executor's waits follow the running bucket's.) */
    if (p->grads_share_activations && p->train.grad_accumulation > 1)
        return tg_fail(err, "%s: the gradients share the activation pool in a plan with grad_accumulation %d "
                            "(sharing needs 1)",
                       name, p->train.grad_accumulation);
    if (p->grads_share_activations && p->pool_bytes[TG_POOL_GRADS] > p->pool_bytes[TG_POOL_ACTIVATIONS])
        return tg_fail(err, "%s: the gradient pool (%llu bytes) shares an activation pool of %llu bytes", name,
                       (unsigned long long)p->pool_bytes[TG_POOL_GRADS],
                       (unsigned long long)p->pool_bytes[TG_POOL_ACTIVATIONS]);

    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->dtype < 0 || x->dtype >= TG_DTYPE_COUNT)
            return tg_fail(err, "%s: tensor %d (%s) has dtype %d", name, t, x->name, x->dtype);
        /* The executors keep one low precision per plan: its half dtype is the precision's. */
        if ((x->dtype == TG_BF16 && p->train.precision != TG_PREC_BF16) ||
            (x->dtype == TG_F16 && p->train.precision != TG_PREC_FP16))
            return tg_fail(err, "%s: tensor %d (%s) is %s in a plan of precision %s", name, t, x->name,
                           tg_dtype_name(x->dtype), tg_precision_name(p->train.precision));
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
        if ((x->first_use < 0) != (x->last_use < 0) || x->first_use > x->last_use)
            return tg_fail(err, "%s: tensor %d (%s) has lifetime %d..%d (both -1, or first <= last)", name, t,
                           x->name, x->first_use, x->last_use);
    }

    if (p->phase_begin[0] != 0 || p->phase_begin[TG_PHASE_COUNT] != p->n_ops)
        return tg_fail(err, "%s: phase table runs %d..%d, expected 0..%d (n_ops)", name,
                       p->phase_begin[0], p->phase_begin[TG_PHASE_COUNT], p->n_ops);
    for (int ph = 0; ph < TG_PHASE_COUNT; ph++)
        if (p->phase_begin[ph + 1] < p->phase_begin[ph])
            return tg_fail(err, "%s: phase %s begins at op %d but ends at op %d", name,
                           tg_phase_name(ph), p->phase_begin[ph], p->phase_begin[ph + 1]);

    /* The freeze summary is printed, never executed, but a plan is untrusted input. */
    if (p->freeze_pruned_ops < 0 || !(p->freeze_pruned_flops >= 0 && p->freeze_pruned_flops <= 1e30))
        return tg_fail(err, "%s: freeze pruned %d ops and %g FLOPs (both must be >= 0 and finite)", name,
                       p->freeze_pruned_ops, p->freeze_pruned_flops);

    /* So is the recompute summary: a sum of pools, each at most TG_POOL_MAX_BYTES. */
    if (p->peak_bytes_without_recompute > TG_POOL_COUNT * TG_POOL_MAX_BYTES)
        return tg_fail(err, "%s: peak without recompute %llu bytes is more than %d pools may hold", name,
                       (unsigned long long)p->peak_bytes_without_recompute, TG_POOL_COUNT);

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
        "grads_all", "m_all", "v_all", "params_bf16_all", "loss_norm", "loss_scale", "loss_scale_growth",
        "mlm_stream", "pixel_values"};
    int32_t iov[sizeof io_names / sizeof io_names[0]];
    _Static_assert(sizeof iov == sizeof(tg_plan_io), "io names");
    memcpy(iov, &p->io, sizeof iov); /* tg_plan_io is all int32, in this order */
    for (size_t k = 0; k < sizeof io_names / sizeof io_names[0]; k++)
        if (iov[k] < -1 || iov[k] >= p->n_tensors)
            return tg_fail(err, "%s: io %s refers to tensor %d of %d", name, io_names[k],
                           iov[k], p->n_tensors);
    return 0;
}

/* ---- what the runtime binds (run by the plan decoder after the ops) ------------- */

/* What one io binding must be for the runtime to write or read it as it does: its pool
 * (-1: any), its dtypes (a bit per tg_dtype) and its shape (ndim 0: one element, of any
 * dims; dims -1: any size). */
typedef struct io_rule {
    const char *field; /* tg_plan_io's field, as messages name it */
    int32_t tensor;
    int required;
    int pool;
    unsigned dtypes;
    int ndim;
    int64_t dims[2];
    const char *why; /* what the runtime does with it, for the message */
} io_rule;

#define DT(d) (1u << (d))

static void shape_text(const tg_tensor *x, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "[");
    /* GCOVR_EXCL_BR_START: ndim <= TG_MAX_DIMS (the tables' check), and four int64 dims fit the 96-byte buffer */
    for (int d = 0; d < x->ndim && d < TG_MAX_DIMS && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)x->shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
    /* GCOVR_EXCL_BR_STOP */
}

static int check_io_rule(const tg_plan *p, const io_rule *r, const char *name, tg_err *err) {
    if (r->tensor < 0) {
        if (r->required) return tg_fail(err, "%s: io %s is required (%s)", name, r->field, r->why);
        return 0;
    }
    const tg_tensor *x = &p->tensors[r->tensor];
    if (r->pool >= 0 && x->pool != r->pool)
        return tg_fail(err, "%s: io %s is tensor %d (%s) in the %s pool; it must be in the %s pool (%s)", name,
                       r->field, r->tensor, x->name, tg_pool_name(x->pool), tg_pool_name(r->pool), r->why);
    if (!(r->dtypes & DT(x->dtype))) {
        char want[48] = "";
        int left = 0; /* "f32", "f32 or bf16", "f32, bf16 or f16" */
        for (int d = 0; d < TG_DTYPE_COUNT; d++) left += (r->dtypes & DT(d)) != 0;
        for (int d = 0; d < TG_DTYPE_COUNT; d++)
            if (r->dtypes & DT(d))
                snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s",
                         !want[0] ? "" : --left == 1 ? " or " : ", ", tg_dtype_name(d));
        return tg_fail(err, "%s: io %s is tensor %d (%s) of dtype %s; it must be %s (%s)", name, r->field, r->tensor,
                       x->name, tg_dtype_name(x->dtype), want, r->why);
    }
    int ok = r->ndim == 0 ? tg_tensor_numel(x) == 1 : x->ndim == r->ndim;
    for (int d = 0; ok && d < r->ndim; d++) ok = r->dims[d] < 0 || x->shape[d] == r->dims[d];
    if (!ok) {
        char have[96], want[64] = "one element";
        shape_text(x, have, sizeof have);
        if (r->ndim == 1) snprintf(want, sizeof want, "[%lld]", (long long)r->dims[0]);
        if (r->ndim == 2 && r->dims[1] >= 0)
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)r->dims[0], (long long)r->dims[1]);
        if (r->ndim == 2 && r->dims[1] < 0) snprintf(want, sizeof want, "[%lld, any]", (long long)r->dims[0]);
        return tg_fail(err, "%s: io %s is tensor %d (%s) of shape %s; it must be %s (%s)", name, r->field, r->tensor,
                       x->name, have, want, r->why);
    }
    return 0;
}

/* A view the runtime copies a pool's contents through (weights in and out, the bf16
 * copies filled from the parameters): it starts the pool. */
static int check_pool_start(const tg_plan *p, const char *field, int32_t t, const char *name, tg_err *err) {
    const tg_tensor *x = &p->tensors[t];
    if (x->offset != 0)
        return tg_fail(err, "%s: io %s is tensor %d (%s) at offset %llu; it must start the %s pool", name, field, t,
                       x->name, (unsigned long long)x->offset, tg_pool_name(x->pool));
    return 0;
}

/* The io table against the train settings: every tensor the runtime writes (the batch,
 * the step counters, the weights) or reads (loss, lr, grad norm, logits, the pools) is
 * where, of the dtype and of the shape it writes or reads. */
static int check_io(const tg_plan *p, const char *name, tg_err *err) {
    const tg_plan_io *io = &p->io;
    const int fp16 = p->train.precision == TG_PREC_FP16;
    /* lm and mlm: labels and logits per token (mlm's labels input is unused: its masking
     * op makes them); qa: two answer positions per row, two logits per token. */
    const int64_t B = p->train.batch, T = p->train.seq;
    const int64_t lm = p->train.task == TG_TASK_LM || p->train.task == TG_TASK_MLM;
    const int qa = p->train.task == TG_TASK_QA;
    /* Image models take images in place of token ids, masks and positions. */
    const int image = p->model.arch == TG_ARCH_MOBILENET_V2, text = !image;
    const io_rule rules[] = {
        {"input_ids", io->input_ids, text, TG_POOL_INPUTS, DT(TG_I32), 2, {B, T}, "the batch's token ids, train batch x seq"},
        {"attention_mask", io->attention_mask, text, TG_POOL_INPUTS, DT(TG_F32), 2, {B, T},
         "the batch's mask, train batch x seq"},
        {"token_type_ids", io->token_type_ids, 0, TG_POOL_INPUTS, DT(TG_I32), 2, {B, T},
         "the batch's token types, train batch x seq"},
        {"position_ids", io->position_ids, text, TG_POOL_INPUTS, DT(TG_I32), 2, {B, T},
         "the batch's positions, train batch x seq"},
        {"labels", io->labels, 1, TG_POOL_INPUTS, DT(TG_I32), lm || qa ? 2 : 1, {B, lm ? T : qa ? 2 : -1},
         lm   ? "the batch's next tokens, train batch x seq"
         : qa ? "the batch's answer start and end, train batch x 2"
              : "the batch's labels, one per row"},
        {"logits", io->logits, 1, -1, DT(TG_F32) | DT(TG_BF16) | DT(TG_F16), 2,
         {lm || qa ? B * T : B, lm ? -1 : qa ? 2 : p->train.num_labels},
         lm   ? "a row of scores per token"
         : qa ? "a start and an end score per token"
              : "a row of num_labels scores per row of the batch"},
        {"loss", io->loss, 1, -1, DT(TG_F32), 0, {0}, "the step's loss, read after each step"},
        {"step", io->step, 1, TG_POOL_OPTIM, DT(TG_F32), 0, {0}, "the step counter the runtime sets"},
        {"total_steps", io->total_steps, 1, TG_POOL_OPTIM, DT(TG_F32), 0, {0}, "the step count the runtime sets"},
        {"lr", io->lr, 1, -1, DT(TG_F32), 0, {0}, "the learning rate, read after each step"},
        {"grad_norm", io->grad_norm, 1, -1, DT(TG_F32), 0, {0}, "the gradient norm, read after each step"},
        {"params_all", io->params_all, 1, TG_POOL_PARAMS, DT(TG_F32), 1, {-1}, "the parameters, loaded and saved"},
        {"grads_all", io->grads_all, 1, TG_POOL_GRADS, DT(TG_F32), 1, {-1}, "the gradients AdamW reads"},
        {"m_all", io->m_all, 1, TG_POOL_OPTIM, DT(TG_F32) | DT(TG_BF16), 1, {-1}, "AdamW's first moments"},
        {"v_all", io->v_all, 1, TG_POOL_OPTIM, DT(TG_F32) | DT(TG_BF16), 1, {-1}, "AdamW's second moments"},
        {"params_bf16_all", io->params_bf16_all, 0, TG_POOL_PARAMS_BF16, DT(TG_BF16) | DT(TG_F16), 1, {-1},
         "the low-precision (bf16 or fp16) copies of the parameters, filled from them"},
        {"loss_norm", io->loss_norm, p->train.grad_accumulation > 1, TG_POOL_INPUTS, DT(TG_F32), qa ? 1 : 0,
         {qa ? 2 : 0},
         qa ? "the window's counts of counted answer starts and ends, written with each batch under grad_accumulation"
            : "the window's count of counted labels, written with each batch under grad_accumulation"},
        {"loss_scale", io->loss_scale, fp16, TG_POOL_OPTIM, DT(TG_F32), 0, {0},
         "the dynamic loss scale of fp16 plans, state the runtime starts and checkpoints"},
        {"loss_scale_growth", io->loss_scale_growth, fp16, TG_POOL_OPTIM, DT(TG_F32), 0, {0},
         "the loss scale's growth tracker of fp16 plans"},
        {"mlm_stream", io->mlm_stream, p->train.task == TG_TASK_MLM, TG_POOL_INPUTS, DT(TG_I32), 1, {4},
         "the masking stream of each batch (step, first element, seed), written by the host"},
    };
    for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++)
        if (check_io_rule(p, &rules[k], name, err)) return -1;
    if (text && io->pixel_values >= 0)
        return tg_fail(err, "%s: io pixel_values is tensor %d (%s), but model %s takes token ids (it is for image "
                            "models alone)",
                       name, io->pixel_values, p->tensors[io->pixel_values].name, tg_arch_name(p->model.arch));
    if (image && (io->input_ids >= 0 || io->attention_mask >= 0 || io->token_type_ids >= 0 || io->position_ids >= 0))
        return tg_fail(err, "%s: model %s takes images: io input_ids, attention_mask, token_type_ids and position_ids "
                            "must be -1",
                       name, tg_arch_name(p->model.arch));
    if (image) {
        if (io->pixel_values < 0)
            return tg_fail(err, "%s: io pixel_values is required (the batch's images, model %s)", name,
                           tg_arch_name(p->model.arch));
        const tg_tensor *x = &p->tensors[io->pixel_values];
        if (x->pool != TG_POOL_INPUTS || x->dtype != TG_U8)
            return tg_fail(err, "%s: io pixel_values is tensor %d (%s), %s in the %s pool; it must be u8 in the inputs "
                                "pool (the batch's images as stored)",
                           name, io->pixel_values, x->name, tg_dtype_name(x->dtype), tg_pool_name(x->pool));
        const int64_t S = p->model.image_size;
        if (x->ndim != 4 || x->shape[0] != B || x->shape[1] != p->model.image_channels || x->shape[2] != S ||
            x->shape[3] != S) {
            char have[96];
            shape_text(x, have, sizeof have);
            return tg_fail(err, "%s: io pixel_values is tensor %d (%s) of shape %s; it must be [%lld, %d, %lld, %lld] "
                                "(train batch x model image_channels x image_size x image_size, planes as stored)",
                           name, io->pixel_values, x->name, have, (long long)B, p->model.image_channels, (long long)S,
                           (long long)S);
        }
    }
    if (!fp16 && (io->loss_scale >= 0 || io->loss_scale_growth >= 0))
        return tg_fail(err, "%s: io loss_scale is tensor %d and loss_scale_growth tensor %d, but the plan's precision "
                            "is %s (only fp16 plans scale the loss)",
                       name, io->loss_scale, io->loss_scale_growth, tg_precision_name(p->train.precision));
    if (io->mlm_stream >= 0 && p->train.task != TG_TASK_MLM)
        return tg_fail(err, "%s: io mlm_stream is tensor %d (%s), but the task is %s (it is for mlm alone)", name,
                       io->mlm_stream, p->tensors[io->mlm_stream].name, tg_task_name(p->train.task));
    if (io->loss_norm >= 0 && p->train.grad_accumulation <= 1)
        return tg_fail(err, "%s: io loss_norm is tensor %d (%s), but train grad_accumulation is %d (it is for "
                            "grad_accumulation > 1 alone)",
                       name, io->loss_norm, p->tensors[io->loss_norm].name, p->train.grad_accumulation);
    if (lm && p->tensors[io->logits].shape[1] < p->model.vocab_size)
        return tg_fail(err, "%s: io logits is tensor %d (%s) of %lld columns, fewer than the vocabulary (%d)", name,
                       io->logits, p->tensors[io->logits].name, (long long)p->tensors[io->logits].shape[1],
                       p->model.vocab_size);
    /* The step counter and the total steps are the runtime's: the dropouts draw their masks
     * at the counter (converted to an integer), so no other tensor, a view included, may
     * reach their bytes. */
    const int32_t counters[] = {io->step, io->total_steps};
    for (int k = 0; k < 2; k++) {
        const tg_tensor *c = &p->tensors[counters[k]];
        const char *field = k ? "total_steps" : "step";
        if (c->flags & TG_TENSOR_VIEW)
            return tg_fail(err, "%s: io %s is tensor %d (%s), a view; it must be a tensor of its own", name, field,
                           counters[k], c->name);
        for (int t = 0; t < p->n_tensors; t++) {
            const tg_tensor *x = &p->tensors[t];
            if (t != counters[k] && x->pool == c->pool && x->bytes && x->offset < c->offset + c->bytes &&
                c->offset < x->offset + x->bytes)
                return tg_fail(err, "%s: tensor %d (%s) shares bytes with io %s (tensor %d)", name, t, x->name, field,
                               counters[k]);
        }
    }
    /* The parameters as one view, element i of which AdamW updates from gradient i (and
     * writes into bf16 copy i): the gradients and the copies line up with it, and every
     * trainable parameter lies inside it. */
    if (check_pool_start(p, "params_all", io->params_all, name, err)) return -1;
    const int64_t n = tg_tensor_numel(&p->tensors[io->params_all]);
    const int32_t same_count[] = {io->grads_all, io->params_bf16_all};
    const char *const same_name[] = {"grads_all", "params_bf16_all"};
    for (int k = 0; k < 2; k++) {
        const int32_t t = same_count[k];
        if (t < 0) continue;
        if (check_pool_start(p, same_name[k], t, name, err)) return -1;
        if (tg_tensor_numel(&p->tensors[t]) != n)
            return tg_fail(err, "%s: io %s is tensor %d (%s) of %lld elements; the parameters have %lld", name,
                           same_name[k], t, p->tensors[t].name, (long long)tg_tensor_numel(&p->tensors[t]),
                           (long long)n);
    }
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if ((x->flags & TG_TENSOR_PARAM) && x->offset + x->bytes > p->tensors[io->params_all].bytes)
            return tg_fail(err, "%s: tensor %d (%s) at offset %llu + %llu bytes lies outside io params_all (%lld "
                                "elements)",
                           name, t, x->name, (unsigned long long)x->offset, (unsigned long long)x->bytes,
                           (long long)n);
    }
    /* The runtime fills the bf16 pool from the parameters' values, two bytes for four. */
    if (p->pool_bytes[TG_POOL_PARAMS_BF16] > p->pool_bytes[TG_POOL_PARAMS] / 2)
        return tg_fail(err, "%s: pool params_bf16 holds %llu bytes, more than half the params pool (%llu)", name,
                       (unsigned long long)p->pool_bytes[TG_POOL_PARAMS_BF16],
                       (unsigned long long)p->pool_bytes[TG_POOL_PARAMS]);
    return 0;
}

/* The slot through which an op of `kind` reads the optimizer's step counter (plan/ops.def:
 * the dropouts draw their masks at it, SCHEDULE and ADAMW count with it), or -1. */
static int step_counter_slot(int kind) {
    switch (kind) {
    case TG_OP_DROPOUT: return 1;
    case TG_OP_RESIDUAL_LAYERNORM: return 4;
    case TG_OP_RESIDUAL_LAYERNORM_BWD: return 6;
    case TG_OP_ATTN_SOFTMAX:
    case TG_OP_ATTN_SOFTMAX_BWD: return 2;
    case TG_OP_ATTENTION: return 4;
    case TG_OP_SCHEDULE: return 0;
    case TG_OP_ADAMW:
    case TG_OP_ADAN: return 2;
    default: return -1;
    }
}

/* A slot of an op and the io tensor it must hold. */
typedef struct binding {
    int32_t slot, want;
    const char *what;
} binding;

/* ZeRO-1's sums: a replica's gradients are summed only over its own slice (REDUCE_SCATTER),
 * so every op that reads the gradients must read that slice alone, with the update's slice:
 * the update (zero_slice), the reduce-scatters and the blocks of squares; the norm then
 * comes from the squares summed over the replicas, never from GRAD_NORM of the gradients,
 * and a plan without ZeRO-1 has no reduce-scatter (its update reads every gradient). */
static int check_zero_sums(const tg_plan *p, const char *name, tg_err *err) {
    int64_t slice = 0;
    for (int o = 0; o < p->n_ops; o++)
        if (tg_op_is_update(p->ops[o].kind)) slice = p->ops[o].p.adamw.zero_slice;
    int squares = -1, summed = 0;
    for (int o = 0; o < p->n_ops; o++) {
        const tg_op *op = &p->ops[o];
        const char *kind = tg_op_name(op->kind);
        if (op->kind == TG_OP_REDUCE_SCATTER &&
            (op->p.reduce_scatter.slice != slice || p->tensors[op->in[0]].pool != TG_POOL_GRADS))
            return tg_fail(err, "%s: op %d (%s): slice %lld over pool %d, but the update's slices are %lld elements of "
                                "the gradients (0: no ZeRO-1, no reduce-scatter)",
                           name, o, kind, (long long)op->p.reduce_scatter.slice, p->tensors[op->in[0]].pool,
                           (long long)slice);
        if (op->kind == TG_OP_GRAD_SQUARES) {
            if (op->p.squares.slice != slice)
                return tg_fail(err, "%s: op %d (%s): slice %lld, but the update's is %lld", name, o, kind,
                               (long long)op->p.squares.slice, (long long)slice);
            squares = op->out[0], summed = 0;
        }
        if (op->kind == TG_OP_ALL_REDUCE && squares >= 0 && op->in[0] == squares) summed = 1;
        if (op->kind == TG_OP_NORM_OF_SQUARES && (op->in[0] != squares || (slice > 0 && !summed)))
            return tg_fail(err, "%s: op %d (%s): in[0] is not the squares of a GRAD_SQUARES before it%s", name, o, kind,
                           slice > 0 ? ", summed over the replicas (ALL_REDUCE) in between" : "");
        if (op->kind == TG_OP_GRAD_NORM && slice > 0)
            return tg_fail(err, "%s: op %d (%s): a ZeRO-1 plan's gradients are summed only over each replica's slice: "
                                "the norm must come from GRAD_SQUARES",
                           name, o, kind);
    }
    return 0;
}

/* The optimizer's state and scalars are the io tensors the runtime sets and reads: each op
 * reads its step counter at io.step; SCHEDULE counts io.step against io.total_steps into
 * io.lr, GRAD_NORM measures io.grads_all into io.grad_norm, ADAMW updates io.params_all,
 * io.m_all and io.v_all (and io.params_bf16_all) from them; no other op writes the step
 * counter or the total steps, which the runtime sets. */
static int check_optimizer_bindings(const tg_plan *p, const char *name, tg_err *err) {
    const tg_plan_io *io = &p->io;
    int sums = 0, gathers = 0;
    for (int o = 0; o < p->n_ops; o++) {
        sums += p->ops[o].kind == TG_OP_ALL_REDUCE;
        gathers += p->ops[o].kind == TG_OP_ALL_GATHER && p->ops[o].in[1] < 0; /* ZeRO-1's: in place */
        const tg_op *op = &p->ops[o];
        const char *kind = tg_op_name(op->kind);
        const int step = step_counter_slot(op->kind);
        if (step >= 0 && op->in[step] >= 0 && op->in[step] != io->step)
            return tg_fail(err, "%s: op %d (%s): in[%d] is the step counter, tensor %d (io step), not tensor %d", name,
                           o, kind, step, io->step, op->in[step]);
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            const int32_t t = op->out[s];
            if (t >= 0 && (t == io->total_steps || (t == io->step && !(op->kind == TG_OP_SCHEDULE && s == 1))))
                return tg_fail(err, "%s: op %d (%s): out[%d] writes %s, which only the runtime%s sets", name, o, kind,
                               s, t == io->step ? "the step counter" : "the total steps",
                               t == io->step ? " and SCHEDULE" : "");
        }
        binding want[8];
        int n_want = 0;
        if (op->kind == TG_OP_SCHEDULE) {
            want[n_want++] = (binding){op->in[1], io->total_steps, "in[1] (io total_steps)"};
            if (op->in[2] >= 0) want[n_want++] = (binding){op->in[2], io->grad_norm, "in[2] (io grad_norm)"};
            want[n_want++] = (binding){op->out[0], io->lr, "out[0] (io lr)"};
        } else if (op->kind == TG_OP_GRAD_NORM || op->kind == TG_OP_GRAD_SQUARES) {
            want[n_want++] = (binding){op->in[0], io->grads_all, "in[0] (io grads_all)"};
            if (op->kind == TG_OP_GRAD_NORM) want[n_want++] = (binding){op->out[0], io->grad_norm, "out[0] (io grad_norm)"};
        } else if (op->kind == TG_OP_NORM_OF_SQUARES) {
            want[n_want++] = (binding){op->out[0], io->grad_norm, "out[0] (io grad_norm)"};
        } else if (tg_op_is_update(op->kind)) {
            want[n_want++] = (binding){op->in[0], io->grads_all, "in[0] (io grads_all)"};
            want[n_want++] = (binding){op->in[1], io->lr, "in[1] (io lr)"};
            want[n_want++] = (binding){op->in[3], io->grad_norm, "in[3] (io grad_norm)"};
            want[n_want++] = (binding){op->out[0], io->params_all, "out[0] (io params_all)"};
            want[n_want++] = (binding){op->out[1], io->m_all, "out[1] (io m_all)"};
            want[n_want++] = (binding){op->out[2], io->v_all, "out[2] (io v_all)"};
            want[n_want++] = (binding){op->out[3], io->params_bf16_all, "out[3] (io params_bf16_all)"};
            if ((op->p.adamw.zero_slice > 0) != (p->train.zero_stage == 1))
                return tg_fail(err, "%s: op %d (%s): zero_slice %lld, but train zero_stage is %d (a slice exactly "
                                    "with ZeRO-1)",
                               name, o, kind, (long long)op->p.adamw.zero_slice, p->train.zero_stage);
        }
        for (int k = 0; k < n_want; k++)
            if (want[k].slot != want[k].want)
                return tg_fail(err, "%s: op %d (%s): %s must be tensor %d, is tensor %d", name, o, kind, want[k].what,
                               want[k].want, want[k].slot);
    }
    if (check_zero_sums(p, name, err)) return -1;
    /* Replicas train as one only through their gradient sums (and, with ZeRO-1, the
     * gathers of what each updated). */
    if ((p->train.replicas > 1) != (sums > 0))
        return tg_fail(err, "%s: train replicas %d, but the plan sums %s gradients over replicas (%d all_reduce)", name,
                       p->train.replicas, sums ? "its" : "no", sums);
    if ((p->train.zero_stage == 1) != (gathers > 0))
        return tg_fail(err, "%s: train zero_stage %d, but the plan has %d all_gather", name, p->train.zero_stage,
                       gathers);
    return 0;
}

/* The parameter copies: a low-precision copy (TG_TENSOR_PARAM_COPY) is filled element for
 * element from its master, so the master is a parameter or buffer of as many elements,
 * a view exactly when the copy is one. */
static int check_copies(const tg_plan *p, const char *name, tg_err *err) {
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM_COPY)) continue;
        const tg_tensor *m = x->master >= 0 ? &p->tensors[x->master] : NULL;
        if (!m || (m->flags & TG_TENSOR_PARAM_COPY) || tg_tensor_class_of(m) == TG_CLASS_NONE ||
            tg_tensor_numel(m) != tg_tensor_numel(x) || !(m->flags & TG_TENSOR_VIEW) != !(x->flags & TG_TENSOR_VIEW))
            return tg_fail(err, "%s: tensor %d (%s) is a parameter copy of tensor %d%s%s, which is not a parameter or "
                                "buffer of its elements",
                           name, t, x->name, x->master, m ? " " : "", m ? m->name : "");
    }
    return 0;
}

int tg_plan_validate_ops(const tg_plan *p, const char *name, tg_err *err) {
    /* The same check the compiler runs on every op it emits: slots and dtypes by the op's
     * signature, then its shape rule, so no kernel reads or writes past a tensor. */
    const tg_op_check_ctx ctx = {p->tensors, p->n_tensors, p->train.replicas};
    for (int o = 0; o < p->n_ops; o++) {
        char why[160];
        if (tg_op_check(&ctx, &p->ops[o], why, sizeof why))
            return tg_fail(err, "%s: op %d (%s): %s", name, o, tg_op_name(p->ops[o].kind), why);
    }
    /* Then the layout: lifetimes, alignment, no two live tensors sharing bytes; the totals
     * the preflight and inspect report are the layout's. */
    tg_memory_report report;
    if (tg_plan_check_memory(p, &report, err)) return tg_fail_context(err, "%s", name);
    const uint64_t pools = tg_plan_pools_bytes(p);
    if (pools != p->peak_bytes || report.activation_live_peak != p->activation_live_peak)
        return tg_fail(err, "%s: the plan says peak %llu bytes (live activations %llu), its pools and layout make "
                            "%llu (%llu)",
                       name, (unsigned long long)p->peak_bytes, (unsigned long long)p->activation_live_peak,
                       (unsigned long long)pools, (unsigned long long)report.activation_live_peak);
    /* Then what the runtime binds by role. */
    if (check_io(p, name, err) || check_optimizer_bindings(p, name, err) || check_copies(p, name, err)) return -1;
    return 0;
}

/* ---- length buckets ------------------------------------------------------------- */

/* Whether two tensors agree on what a bucket plan must keep: name, dtype, pool, flags and
 * the links between tensors (gradient, master, packed group) and the initial values;
 * outside the activation and input pools also rank, shape, bytes and offset. NULL, or the
 * field that differs. */
static const char *tensor_difference(const tg_tensor *x, const tg_tensor *y) {
    if (strcmp(x->name, y->name)) return "name";
    if (x->dtype != y->dtype) return "dtype";
    if (x->pool != y->pool) return "pool";
    if (x->flags != y->flags) return "flags";
    if (x->grad != y->grad) return "gradient";
    if (x->master != y->master) return "master";
    if (x->group != y->group) return "packed group";
    if (x->init != y->init || memcmp(&x->init_std, &y->init_std, sizeof x->init_std)) return "initialisation";
    if (x->pool == TG_POOL_ACTIVATIONS || x->pool == TG_POOL_INPUTS) return NULL;
    if (x->ndim != y->ndim || memcmp(x->shape, y->shape, sizeof x->shape) || x->bytes != y->bytes) return "shape";
    if (x->offset != y->offset) return "offset";
    return NULL;
}

/* Field by field: tg_plan_run has padding before its seed. */
static int run_equal(const tg_plan_run *a, const tg_plan_run *b) {
    return !strcmp(a->train_data, b->train_data) && !strcmp(a->eval_data, b->eval_data) && a->steps == b->steps &&
           a->epochs == b->epochs && a->log_every == b->log_every && a->seed == b->seed &&
           a->checkpoint_every == b->checkpoint_every && a->keep_checkpoints == b->keep_checkpoints &&
           !strcmp(a->checkpoint_dir, b->checkpoint_dir) && a->last_batch == b->last_batch &&
           a->skip_nonfinite == b->skip_nonfinite && a->max_skipped_steps == b->max_skipped_steps &&
           a->qa_n_best == b->qa_n_best && a->qa_max_answer_length == b->qa_max_answer_length &&
           !memcmp(&a->qa_null_threshold, &b->qa_null_threshold, sizeof a->qa_null_threshold) &&
           !memcmp(&a->gpu_hour_price, &b->gpu_hour_price, sizeof a->gpu_hour_price);
}

/* The strings up to their NULs, the numbers (int32 and float, no padding) bit for bit. */
static int model_equal(const tg_model_config *a, const tg_model_config *b) {
    const size_t numbers = offsetof(tg_model_config, arch);
    return !strcmp(a->source, b->source) && !strcmp(a->weights, b->weights) &&
           !memcmp((const char *)a + numbers, (const char *)b + numbers, sizeof *a - numbers);
}

int tg_plan_validate_buckets(const tg_plan *p, const char *name, tg_err *err) {
    const tg_plan_train *t = &p->train;
    const int n = t->n_buckets;
    if (n < 1 || n > TG_MAX_BUCKETS)
        return tg_fail(err, "%s: train n_buckets %d is not in [1, %d]", name, n, TG_MAX_BUCKETS);
    if (t->bucket_seq[n - 1] != t->seq)
        return tg_fail(err, "%s: train seq %d is not the last bucket length (bucket_seq[%d] = %d)", name, t->seq,
                       n - 1, t->bucket_seq[n - 1]);
    if ((n > 1) != (p->buckets != NULL))
        return tg_fail(err, "%s: train n_buckets %d, but the plan %s bucket plans", name, n,
                       p->buckets ? "has" : "lacks its");
    for (int k = 0; k + 1 < n; k++) {
        const tg_plan *b = &p->buckets[k];
        char where[TG_PATH_MAX + 64];
        snprintf(where, sizeof where, "%s: bucket %d (seq %d)", name, k, t->bucket_seq[k]);
        tg_plan_train want = *t;
        want.seq = t->bucket_seq[k];
        const char *what = memcmp(&b->train, &want, sizeof want)                  ? "train settings"
                           : !run_equal(&b->run, &p->run)                         ? "run settings"
                           : !model_equal(&b->model, &p->model)                   ? "model config"
                           : memcmp(&b->io, &p->io, sizeof b->io)                 ? "io table"
                           : strcmp(b->job_path, p->job_path)                      ? "job path"
                           : b->fingerprint != p->fingerprint                     ? "fingerprint"
                           : b->peak_bytes_without_recompute != p->peak_bytes_without_recompute ? "recompute summary"
                           : b->grads_share_activations != p->grads_share_activations ? "gradient sharing"
                           : b->buckets                                           ? "bucket plans"
                                                                                  : NULL;
        if (what)
            return tg_fail(err, "%s: its %s differ from the plan's (a bucket plan has the plan's, but for train seq)",
                           where, what);
        if (b->n_tensors != p->n_tensors || b->n_ops != p->n_ops)
            return tg_fail(err, "%s: %d tensors and %d ops, the plan %d and %d (a bucket plan has the plan's, index "
                                "for index)",
                           where, b->n_tensors, b->n_ops, p->n_tensors, p->n_ops);
        for (int i = 0; i < p->n_tensors; i++) {
            const tg_tensor *x = &b->tensors[i], *y = &p->tensors[i];
            const char *diff = tensor_difference(x, y);
            if (diff)
                return tg_fail(err, "%s: tensor %d (%s, %s pool) differs from the plan's tensor %d (%s) in its %s "
                                    "(only activations and inputs follow seq)",
                               where, i, x->name, tg_pool_name(x->pool), i, y->name, diff);
        }
        for (int o = 0; o < p->n_ops; o++) {
            const tg_op *x = &b->ops[o], *y = &p->ops[o];
            if (x->kind != y->kind || x->phase != y->phase || memcmp(x->in, y->in, sizeof x->in) ||
                memcmp(x->out, y->out, sizeof x->out))
                return tg_fail(err, "%s: op %d (%s) differs from the plan's op %d (%s) in its kind, phase or tensors",
                               where, o, tg_op_name(x->kind), o, tg_op_name(y->kind));
        }
        for (int q = 0; q < TG_POOL_COUNT; q++)
            if (b->pool_bytes[q] != p->pool_bytes[q])
                return tg_fail(err, "%s: pool %s holds %llu bytes, the plan's %llu (one set of pools serves every "
                                    "bucket)",
                               where, tg_pool_name(q), (unsigned long long)b->pool_bytes[q],
                               (unsigned long long)p->pool_bytes[q]);
    }
    return 0;
}
