/* Independent checks of a finished plan, from its tensor table and schedule alone: what the
 * compiler's planner promised, verified without trusting its bookkeeping. */
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
