/* Gradients that share the activation pool: when their bytes are held (plan/grad_hold.h). */
#include "plan/grad_hold.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

static int overlaps(const tg_tensor *a, const tg_tensor *b) {
    return a->pool == b->pool && a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
}

/* Whether tensor t overlaps any input (writes 0) or output (writes 1) of op. */
static int touches(const tg_tensor *tensors, const tg_op *op, int t, int writes) {
    const int n = writes ? TG_OP_MAX_OUT : TG_OP_MAX_IN;
    const int32_t *slots = writes ? op->out : op->in;
    for (int s = 0; s < n; s++)
        if (slots[s] >= 0 && overlaps(&tensors[t], &tensors[slots[s]])) return 1;
    return 0;
}

static int64_t round_up4(int64_t v) { return (v + 3) / 4 * 4; }

/* The parameter elements [0, end) that cover bytes [0, byte_end) of a parameter-shaped
 * buffer of `size`-byte elements, whole vectors, at most n. */
static int64_t elements_to(uint64_t byte_end, int size, int64_t n) {
    int64_t end = round_up4((int64_t)((byte_end + (uint64_t)size - 1) / (uint64_t)size));
    return end > n ? n : end;
}

int tg_update_read_prefix(const tg_tensor *tensors, const tg_op *ops, int n_ops, int f0, int f1,
                          uint64_t shared_grad_bytes, int64_t *need) {
    const int last = n_ops - 1;
    if (last < 0 || !tg_op_is_update(ops[last].kind)) return 0;
    for (int o = 0; o < last; o++)
        if (tg_op_is_update(ops[o].kind)) return 0;
    const tg_op *update = &ops[last];
    const int64_t n = update->p.adamw.n;
    if (n <= 0) return 0;
    int64_t prefix = 0;
    for (int o = f0; o < f1; o++) {
        const tg_op *op = &ops[o];
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            const int t = op->out[s];
            if (t < 0) continue;
            if (touches(tensors, update, t, 0) || touches(tensors, update, t, 1)) return 0;
            const tg_tensor *x = &tensors[t];
            /* An activation over the shared gradients: after their update has read them. */
            if (shared_grad_bytes && x->pool == TG_POOL_ACTIVATIONS && x->offset < shared_grad_bytes) {
                const uint64_t end = x->offset + x->bytes < shared_grad_bytes ? x->offset + x->bytes : shared_grad_bytes;
                const int64_t e = elements_to(end, 4, n);
                if (e > prefix) prefix = e;
            }
        }
        for (int s = 0; s < TG_OP_MAX_IN; s++) {
            const int t = op->in[s];
            if (t < 0 || !touches(tensors, update, t, 1)) continue;
            const tg_tensor *x = &tensors[t];
            if (x->pool != TG_POOL_PARAMS && x->pool != TG_POOL_PARAMS_BF16) return 0;
            const int64_t e = elements_to(x->offset + x->bytes, tg_dtype_size(x->dtype), n);
            if (e > prefix) prefix = e;
        }
        need[o - f0] = prefix;
    }
    return 1;
}

int tg_grad_hold_meets(const tg_grad_hold *h, int first, int last) {
    if (!(last < h->from || h->to < first)) return 1;
    return h->wrap_to >= 0 && first <= h->wrap_to;
}

typedef struct span_ref {
    uint64_t a, b;
    int32_t tensor;
} span_ref;

static int by_start(const void *x, const void *y) {
    const span_ref *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    return (p->tensor > q->tensor) - (p->tensor < q->tensor);
}

/* The next unmarked span at or after i (n: none), with path halving. */
static int next_unmarked(int *next, int i) {
    while (next[i] != i) {
        next[i] = next[next[i]];
        i = next[i];
    }
    return i;
}

int tg_grad_holds(const tg_tensor *tensors, int n_tensors, const tg_op *ops, int n_ops, const int32_t *phase_begin,
                  uint64_t grad_pool_bytes, tg_grad_hold **out, int *n_out) {
    *out = NULL, *n_out = 0;
    const int f0 = phase_begin[TG_PHASE_FORWARD], f1 = phase_begin[TG_PHASE_FORWARD + 1];
    int n = 0;
    span_ref *g = tg_malloc(sizeof *g * ((size_t)n_tensors + 1));
    int *next = tg_malloc(sizeof *next * ((size_t)n_tensors + 2));
    int32_t *from = tg_malloc(sizeof *from * ((size_t)n_tensors + 1));
    int64_t *need = tg_malloc(sizeof *need * ((size_t)(f1 > f0 ? f1 - f0 : 0) + 1));
    /* Every gradient and at most one stretch of padding before each, and one after. */
    tg_grad_hold *h = tg_malloc(sizeof *h * (2 * (size_t)n_tensors + 2));
    if (!g || !next || !from || !need || !h) {
        free(g), free(next), free(from), free(need), free(h);
        return -1;
    }
    for (int t = 0; t < n_tensors; t++) {
        const tg_tensor *x = &tensors[t];
        if (x->pool != TG_POOL_GRADS || (x->flags & TG_TENSOR_VIEW)) continue;
        const uint64_t a = x->offset < grad_pool_bytes ? x->offset : grad_pool_bytes;
        const uint64_t b = x->bytes < grad_pool_bytes - a ? a + x->bytes : grad_pool_bytes;
        g[n++] = (span_ref){a, b, t};
    }
    qsort(g, (size_t)n, sizeof *g, by_start);
    /* First touch: the schedule in order, each op's gradient-pool operands marking the
     * gradients they overlap that no earlier op did. */
    for (int i = 0; i <= n; i++) next[i] = i;
    for (int i = 0; i < n; i++) from[i] = -1;
    for (int o = 0; o < n_ops; o++)
        for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
            const int t = s < TG_OP_MAX_IN ? ops[o].in[s] : ops[o].out[s - TG_OP_MAX_IN];
            if (t < 0 || t >= n_tensors || tensors[t].pool != TG_POOL_GRADS) continue;
            const uint64_t a = tensors[t].offset, b = a + tensors[t].bytes;
            /* The first span ending past a: spans start in order and do not overlap (the
             * plan checks refuse any that do), so their ends are in order too. */
            int lo = 0, hi = n;
            while (lo < hi) {
                const int mid = lo + (hi - lo) / 2;
                if (g[mid].b <= a) lo = mid + 1;
                else hi = mid;
            }
            for (int i = next_unmarked(next, lo); i < n && g[i].a < b; i = next_unmarked(next, i)) {
                if (g[i].b > a) from[i] = o;
                next[i] = i + 1;
            }
        }
    const int deferrable = f1 > f0 && tg_update_read_prefix(tensors, ops, n_ops, f0, f1, 0, need);
    const int64_t count = deferrable ? ops[n_ops - 1].p.adamw.n : 0;
    int k = 0;
    uint64_t cursor = 0;
    for (int i = 0; i < n; i++) {
        if (g[i].a > cursor) h[k++] = (tg_grad_hold){cursor, g[i].a, 0, n_ops - 1, -1, -1};
        int32_t wrap = -1;
        if (deferrable) {
            const int64_t end = elements_to(g[i].b, 4, count);
            /* need never decreases: the first forward op that has waited for them. */
            int lo = 0, hi = f1 - f0;
            while (lo < hi) {
                const int mid = lo + (hi - lo) / 2;
                if (need[mid] >= end) hi = mid;
                else lo = mid + 1;
            }
            wrap = lo < f1 - f0 ? f0 + lo : f1 - 1;
        }
        /* Never touched: held all the time. */
        const tg_grad_hold one = {g[i].a, g[i].b, from[i] >= 0 ? from[i] : 0, n_ops - 1, from[i] >= 0 ? wrap : -1,
                                  g[i].tensor};
        tg_grad_hold *last = k ? &h[k - 1] : NULL;
        if (last && last->tensor >= 0 && last->b == one.a && last->b - last->a < TG_GRAD_HOLD_MIN_BYTES) {
            /* Joined to the hold before it, which is still small: held whenever either is. */
            last->b = one.b;
            if (one.from < last->from) last->from = one.from;
            if (one.wrap_to > last->wrap_to) last->wrap_to = one.wrap_to;
        } else {
            h[k++] = one;
        }
        if (g[i].b > cursor) cursor = g[i].b;
    }
    if (cursor < grad_pool_bytes) h[k++] = (tg_grad_hold){cursor, grad_pool_bytes, 0, n_ops - 1, -1, -1};
    free(g), free(next), free(from), free(need);
    *out = h, *n_out = k;
    return 0;
}
