#include "compiler/grad_writes.h"
#include "compiler/grad_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A cudaMemset launch costs about what clearing 4 MB does. */
#define ZERO_MERGE_BYTES (4u << 20)

/* Byte ranges [a, b) of the gradient pool, sorted and merged. */
typedef struct span {
    uint64_t a, b;
} span;

typedef struct span_set {
    span *v;
    int n, cap;
} span_set;

/* The first span ending at or after a (after a when `past`): the spans are disjoint and
 * sorted, so their ends rise, and a binary search keeps the pass over the ops linear in
 * them instead of scanning the set from its start. */
static int first_ending_at(const span_set *s, uint64_t a, int past) {
    int lo = 0, hi = s->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->v[mid].b < a || (past && s->v[mid].b == a)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static int set_add(span_set *s, uint64_t a, uint64_t b) {
    if (a >= b) return 0;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        span *v = realloc(s->v, sizeof *v * (size_t)cap);
        if (!v) return -1;
        s->v = v, s->cap = cap;
    }
    int i = first_ending_at(s, a, 0); /* first span that touches or follows [a, b) */
    int j = i;
    while (j < s->n && s->v[j].a <= b) { /* spans merged into the new one */
        if (s->v[j].a < a) a = s->v[j].a;
        if (s->v[j].b > b) b = s->v[j].b;
        j++;
    }
    memmove(s->v + i + 1, s->v + j, sizeof *s->v * (size_t)(s->n - j));
    s->v[i] = (span){a, b};
    s->n += 1 - (j - i);
    return 0;
}

/* Bytes of [a, b) that s covers. */
static uint64_t set_covered(const span_set *s, uint64_t a, uint64_t b) {
    uint64_t c = 0;
    for (int i = first_ending_at(s, a, 1); i < s->n && s->v[i].a < b; i++) {
        uint64_t lo = s->v[i].a > a ? s->v[i].a : a, hi = s->v[i].b < b ? s->v[i].b : b;
        if (lo < hi) c += hi - lo;
    }
    return c;
}

/* Adds the parts of [a, b) that `have` does not cover to `out`. */
static int set_add_gaps(const span_set *have, uint64_t a, uint64_t b, span_set *out) {
    uint64_t cur = a;
    for (int i = first_ending_at(have, a, 1); i < have->n && cur < b; i++) {
        if (have->v[i].b <= cur) continue;
        if (have->v[i].a >= b) break;
        if (have->v[i].a > cur && set_add(out, cur, have->v[i].a)) return -1;
        if (have->v[i].b > cur) cur = have->v[i].b;
    }
    return cur < b ? set_add(out, cur, b) : 0;
}

static int is_grad(const tg_graph *g, int t) {
    return t >= 0 && t != g->io.grads_all && g->tensors[t].pool == TG_POOL_GRADS;
}

/* The gradient outputs an op can overwrite instead of adding to, as one decision: MATMUL's
 * out0 (accumulate), BIAS_GRAD's out0, or both LayerNorm parameter gradients (overwrite);
 * 0 if none. Fills slots. */
static int overwritable_slots(const tg_op *op, int slots[2]) {
    if (op->kind == TG_OP_MATMUL && op->p.matmul.accumulate) {
        slots[0] = 0;
        return 1;
    }
    if (op->kind == TG_OP_BIAS_GRAD && !op->p.bias_grad.overwrite) {
        slots[0] = 0;
        return 1;
    }
    if (op->kind == TG_OP_LAYERNORM_BWD && !op->p.layernorm_bwd.overwrite) {
        slots[0] = 1, slots[1] = 2;
        return 2;
    }
    if (op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD && !op->p.residual_layernorm_bwd.overwrite) {
        slots[0] = 2, slots[1] = 3;
        return 2;
    }
    return 0;
}

static void set_overwrite(tg_op *op) {
    if (op->kind == TG_OP_MATMUL) op->p.matmul.accumulate = 0;
    else if (op->kind == TG_OP_BIAS_GRAD) op->p.bias_grad.overwrite = 1;
    else if (op->kind == TG_OP_LAYERNORM_BWD) op->p.layernorm_bwd.overwrite = 1;
    else op->p.residual_layernorm_bwd.overwrite = 1;
}

/* Outputs an op always overwrites: anything but the (+=) gradient outputs. */
static int always_overwrites(const tg_op *op, int slot) {
    switch (op->kind) {
    case TG_OP_MATMUL: return slot == 1 || !op->p.matmul.accumulate; /* the fused bias gradient is written */
    case TG_OP_EMBEDDING_BWD: return 0;
    case TG_OP_BIAS_GRAD: return op->p.bias_grad.overwrite != 0;
    case TG_OP_LAYERNORM_BWD: return slot == 0 || op->p.layernorm_bwd.overwrite;
    case TG_OP_RESIDUAL_LAYERNORM_BWD: return slot < 2 || op->p.residual_layernorm_bwd.overwrite;
    default: return 1;
    }
}

int tg_first_gradient_writes(tg_graph *g) {
    if (g->failed) return -1;
    int zero_op = -1;
    for (int o = 0; o < g->n_ops && zero_op < 0; o++)
        if (g->ops[o].kind == TG_OP_ZERO && g->ops[o].out[0] == g->io.grads_all) zero_op = o;
    if (zero_op < 0) return 0;
    span_set written = {0}, zero = {0};
    int rc = 0;
    for (int o = zero_op + 1; o < g->n_ops && !rc; o++) {
        tg_op *op = &g->ops[o];
        /* A gradient read before it is complete (none is, in the models built here) must
         * hold zeros where nothing has written it yet. */
        for (int s = 0; s < TG_OP_MAX_IN && !rc; s++) {
            const int t = op->in[s];
            if (is_grad(g, t))
                rc = set_add_gaps(&written, g->tensors[t].offset, g->tensors[t].offset + g->tensors[t].bytes, &zero);
        }
        int slots[2], n = overwritable_slots(op, slots), fresh = n > 0;
        for (int k = 0; k < n; k++) {
            const int t = op->out[slots[k]];
            /* A LayerNorm backward's scratch dgamma/dbeta (frozen parameters) is nobody's
             * sum: overwriting it is what it wants. */
            if (t >= 0 && op->kind != TG_OP_MATMUL && g->tensors[t].pool == TG_POOL_ACTIVATIONS) continue;
            if (t >= 0 && (!is_grad(g, t) || set_covered(&written, g->tensors[t].offset,
                                                         g->tensors[t].offset + g->tensors[t].bytes)))
                fresh = 0;
        }
        if (fresh) set_overwrite(op);
        for (int s = 0; s < TG_OP_MAX_OUT && !rc; s++) {
            const int t = op->out[s];
            if (!is_grad(g, t)) continue;
            const uint64_t a = g->tensors[t].offset, b = a + g->tensors[t].bytes;
            if (!always_overwrites(op, s)) rc = set_add_gaps(&written, a, b, &zero); /* adds onto zeros */
            if (!rc) rc = set_add(&written, a, b);
        }
    }
    /* Gradients nothing writes stay zero. */
    for (int t = 0; t < g->n_tensors && !rc; t++)
        if (is_grad(g, t) && (g->tensors[t].flags & TG_TENSOR_GRAD))
            rc = set_add_gaps(&written, g->tensors[t].offset, g->tensors[t].offset + g->tensors[t].bytes, &zero);
    /* Spans closer than ZERO_MERGE_BYTES become one: clearing bytes that are overwritten
     * later is harmless (every ZERO runs before the first gradient write) and costs less
     * than another launch. */
    int m = 0;
    for (int k = 0; k < zero.n; k++) {
        if (m && zero.v[k].a - zero.v[m - 1].b < ZERO_MERGE_BYTES) zero.v[m - 1].b = zero.v[k].b;
        else zero.v[m++] = zero.v[k];
    }
    zero.n = m;
    /* One ZERO per span, in place of the ZERO of the whole buffer. */
    const int first_new = g->n_ops, phase = g->phase;
    g->phase = g->ops[zero_op].phase;
    for (int k = 0; k < zero.n && !rc && !g->failed; k++) {
        char name[TG_NAME_MAX];
        snprintf(name, sizeof name, "grads.zero.%d", k);
        const int64_t n = (int64_t)((zero.v[k].b - zero.v[k].a) / 4);
        const int t = tg_graph_tensor(g, name, TG_F32, TG_POOL_GRADS, 1, &n);
        if (t < 0) break;
        g->tensors[t].flags |= TG_TENSOR_VIEW;
        g->tensors[t].offset = zero.v[k].a;
        tg_op_spec z = tg_spec(TG_OP_ZERO);
        z.out[0] = t;
        tg_graph_op(g, &z);
    }
    g->phase = phase;
    free(written.v);
    free(zero.v);
    if (rc) return tg_graph_fail(g, "out of memory");
    if (g->failed) return -1;
    /* Move the new ops (the tail) to where the old ZERO was, which goes. */
    const int added = g->n_ops - first_new;
    tg_op *moved = malloc(sizeof *moved * (size_t)(added ? added : 1));
    if (!moved) return tg_graph_fail(g, "out of memory");
    memcpy(moved, g->ops + first_new, sizeof *moved * (size_t)added);
    memmove(g->ops + zero_op + added, g->ops + zero_op + 1, sizeof *g->ops * (size_t)(first_new - zero_op - 1));
    memcpy(g->ops + zero_op, moved, sizeof *moved * (size_t)added);
    g->n_ops = first_new - 1 + added;
    free(moved);
    return 0;
}
