#include "compiler/grad_writes.h"
#include "compiler/grad_state.h"
#include "compiler/compiler_alloc.h"
#include "compiler/span_set.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A cudaMemset launch costs about what clearing 4 MB does. */
#define ZERO_MERGE_BYTES (4u << 20)

static int is_grad(const tg_graph *g, int t) {
    return t >= 0 && t != g->io.grads_all && g->tensors[t].pool == TG_POOL_GRADS;
}

/* The gradient outputs an op can overwrite instead of adding to, as one decision: MATMUL's
 * out0 (accumulate), BIAS_GRAD's out0, or both parameter gradients of a LayerNorm, batch
 * norm or convolution backward (overwrite); 0 if none. Fills slots. */
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
    /* The convolution's dweight and dbias, the batch norm's dgamma and dbeta (each may be absent). */
    if ((op->kind == TG_OP_CONV2D_BWD && !op->p.conv2d_bwd.overwrite) ||
        (op->kind == TG_OP_BATCHNORM_BWD && !op->p.batchnorm_bwd.overwrite)) {
        slots[0] = 1, slots[1] = 2;
        return 2;
    }
    return 0;
}

static void set_overwrite(tg_op *op) {
    if (op->kind == TG_OP_MATMUL) op->p.matmul.accumulate = 0;
    else if (op->kind == TG_OP_BIAS_GRAD) op->p.bias_grad.overwrite = 1;
    else if (op->kind == TG_OP_LAYERNORM_BWD) op->p.layernorm_bwd.overwrite = 1;
    else if (op->kind == TG_OP_CONV2D_BWD) op->p.conv2d_bwd.overwrite = 1;
    else if (op->kind == TG_OP_BATCHNORM_BWD) op->p.batchnorm_bwd.overwrite = 1;
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
    case TG_OP_RMSNORM_BWD: return slot == 0; /* dgamma is added into: a ZERO clears it first */
    case TG_OP_CONV2D_BWD: return slot == 0 || op->p.conv2d_bwd.overwrite;
    case TG_OP_BATCHNORM_BWD: return slot == 0 || op->p.batchnorm_bwd.overwrite;
    default: return 1;
    }
}

/* The gradient pool cut at every gradient tensor's start and end into cells: every range
 * the pass asks about is a run of whole cells. A cell's two marks, written and to clear,
 * only ever turn on, so two next-cell forests (union-find with path halving) skip the
 * written cells (`unwritten`) and the cells written or to clear (`open`): each cell is
 * marked at most once and the pass stays near linear in the ops, whatever order the
 * gradients are written in. A Fenwick tree counts the written cells, for whether a range
 * holds any. */
typedef struct cells {
    uint64_t *edge; /* m + 1 sorted distinct offsets: cell k is [edge[k], edge[k + 1]) */
    int m;
    int *unwritten, *open; /* next-cell forests over 0..m (m: none left) */
    int *written;          /* Fenwick tree of written cells, 1-based */
    char *zero;            /* per cell: to clear first */
} cells;

static int by_offset(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void cells_free(cells *c) {
    free(c->edge), free(c->unwritten), free(c->open), free(c->written), free(c->zero);
}

/* The cells of every gradient tensor's range. -1 when out of memory. */
static int cells_init(cells *c, const tg_graph *g) {
    memset(c, 0, sizeof *c);
    int n = 0;
    for (int t = 0; t < g->n_tensors; t++) n += is_grad(g, t);
    c->edge = tg_compiler_malloc(sizeof *c->edge * (2 * (size_t)n + 1));
    if (!c->edge) return -1;
    int e = 0;
    for (int t = 0; t < g->n_tensors; t++)
        if (is_grad(g, t)) c->edge[e++] = g->tensors[t].offset, c->edge[e++] = g->tensors[t].offset + g->tensors[t].bytes;
    qsort(c->edge, (size_t)e, sizeof *c->edge, by_offset);
    int distinct = 0;
    for (int i = 0; i < e; i++)
        if (!distinct || c->edge[i] != c->edge[distinct - 1]) c->edge[distinct++] = c->edge[i];
    c->m = distinct > 0 ? distinct - 1 : 0;
    c->unwritten = tg_compiler_malloc(sizeof *c->unwritten * ((size_t)c->m + 1));
    c->open = tg_compiler_malloc(sizeof *c->open * ((size_t)c->m + 1));
    c->written = tg_compiler_calloc((size_t)c->m + 1, sizeof *c->written);
    c->zero = tg_compiler_calloc((size_t)c->m + 1, 1);
    if (!c->unwritten || !c->open || !c->written || !c->zero) return -1;
    for (int k = 0; k <= c->m; k++) c->unwritten[k] = c->open[k] = k;
    return 0;
}

/* The cell starting at offset x (an edge). */
static int cell_at(const cells *c, uint64_t x) {
    int lo = 0, hi = c->m;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (c->edge[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The first cell at or after k still in forest f (m when none). */
static int next_cell(int *f, int k) {
    while (f[k] != k) {
        f[k] = f[f[k]];
        k = f[k];
    }
    return k;
}

/* Written cells before cell k. */
static int written_before(const cells *c, int k) {
    int n = 0;
    for (; k > 0; k -= k & -k) n += c->written[k];
    return n;
}

/* Whether any byte of tensor t's range is written. */
static int any_written(const cells *c, const tg_tensor *t) {
    return written_before(c, cell_at(c, t->offset + t->bytes)) > written_before(c, cell_at(c, t->offset));
}

/* Marks the cells of tensor t's range not yet written as to clear. */
static void clear_unwritten(cells *c, const tg_tensor *t) {
    const int end = cell_at(c, t->offset + t->bytes);
    for (int k = next_cell(c->open, cell_at(c, t->offset)); k < end; k = next_cell(c->open, k + 1)) {
        c->zero[k] = 1;
        c->open[k] = k + 1;
    }
}

/* Marks the cells of tensor t's range written. */
static void mark_written(cells *c, const tg_tensor *t) {
    const int end = cell_at(c, t->offset + t->bytes);
    for (int k = next_cell(c->unwritten, cell_at(c, t->offset)); k < end; k = next_cell(c->unwritten, k + 1)) {
        c->unwritten[k] = c->open[k] = k + 1;
        for (int i = k + 1; i <= c->m; i += i & -i) c->written[i]++;
    }
}

int tg_first_gradient_writes(tg_graph *g) {
    if (g->failed) return -1;
    int zero_op = -1;
    for (int o = 0; o < g->n_ops && zero_op < 0; o++)
        if (g->ops[o].kind == TG_OP_ZERO && g->ops[o].out[0] == g->io.grads_all) zero_op = o;
    if (zero_op < 0) return 0;
    cells c;
    if (cells_init(&c, g)) {
        cells_free(&c);
        return tg_graph_out_of_memory(g);
    }
    for (int o = zero_op + 1; o < g->n_ops; o++) {
        tg_op *op = &g->ops[o];
        /* A gradient read before it is complete (none is, in the models built here) must
         * hold zeros where nothing has written it yet. */
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (is_grad(g, op->in[s])) clear_unwritten(&c, &g->tensors[op->in[s]]);
        int slots[2], n = overwritable_slots(op, slots), fresh = n > 0;
        for (int k = 0; k < n; k++) {
            const int t = op->out[slots[k]];
            /* A LayerNorm backward's scratch dgamma/dbeta (frozen parameters) is nobody's
             * sum: overwriting it is what it wants. */
            if (t >= 0 && op->kind != TG_OP_MATMUL && g->tensors[t].pool == TG_POOL_ACTIVATIONS) continue; /* t < 0: an absent output (a convolution without a bias, a frozen weight), nothing to overwrite */
            if (t >= 0 && (!is_grad(g, t) || any_written(&c, &g->tensors[t]))) fresh = 0;
        }
        if (fresh) set_overwrite(op);
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            const int t = op->out[s];
            if (!is_grad(g, t)) continue;
            if (!always_overwrites(op, s)) clear_unwritten(&c, &g->tensors[t]); /* adds onto zeros */
            mark_written(&c, &g->tensors[t]);
        }
    }
    /* Gradients nothing writes stay zero. */
    for (int t = 0; t < g->n_tensors; t++)
        if (is_grad(g, t) && (g->tensors[t].flags & TG_TENSOR_GRAD)) clear_unwritten(&c, &g->tensors[t]);
    /* The runs of cells to clear, as byte ranges in offset order; ranges closer than
     * ZERO_MERGE_BYTES become one: clearing bytes that are overwritten later is harmless
     * (every ZERO runs before the first gradient write) and costs less than another launch. */
    tg_span *zero = tg_compiler_malloc(sizeof *zero * ((size_t)c.m + 1));
    if (!zero) {
        cells_free(&c);
        return tg_graph_out_of_memory(g);
    }
    int n_zero = 0;
    for (int k = 0; k < c.m;) {
        if (!c.zero[k]) {
            k++;
            continue;
        }
        const uint64_t a = c.edge[k];
        while (k < c.m && c.zero[k]) k++;
        if (n_zero && a - zero[n_zero - 1].b < ZERO_MERGE_BYTES) zero[n_zero - 1].b = c.edge[k];
        else zero[n_zero++] = (tg_span){a, c.edge[k]};
    }
    cells_free(&c);
    /* One ZERO per span, in place of the ZERO of the whole buffer. */
    const int first_new = g->n_ops, phase = g->phase;
    g->phase = g->ops[zero_op].phase;
    for (int k = 0; k < n_zero && !g->failed; k++) {
        char name[TG_NAME_MAX];
        snprintf(name, sizeof name, "grads.zero.%d", k);
        const int64_t n = (int64_t)((zero[k].b - zero[k].a) / 4);
        const int t = tg_graph_tensor(g, name, TG_F32, TG_POOL_GRADS, 1, &n);
        if (t < 0) break;
        g->tensors[t].flags |= TG_TENSOR_VIEW;
        g->tensors[t].offset = zero[k].a;
        tg_op_spec z = tg_spec(TG_OP_ZERO);
        z.out[0] = t;
        tg_graph_op(g, &z);
    }
    g->phase = phase;
    if (g->failed) {
        free(zero);
        return -1;
    }
    /* Each new ZERO goes right before the first op after the old one that touches any
     * gradient byte of its span (a write must find it cleared, and a merged-in byte that
     * some op overwrites must not be cleared after that write); the old ZERO goes. Later
     * is better: with the gradients in the activation pool, a span is held only from its
     * ZERO on (plan/grad_hold.h), and the embedding tables, cleared for their scatter at
     * the backward's end, need not be held beside the whole backward. */
    const int added = g->n_ops - first_new;
    int *at = tg_compiler_malloc(sizeof *at * (size_t)(added ? added : 1));
    tg_op *ops = tg_compiler_malloc(sizeof *ops * (size_t)(first_new - 1 + added + 1));
    if (!at || !ops) {
        free(at), free(ops), free(zero);
        return tg_graph_out_of_memory(g);
    }
    for (int k = 0; k < added; k++) at[k] = -1;
    for (int o = zero_op + 1; o < first_new; o++)
        for (int sl = 0; sl < TG_OP_MAX_IN + TG_OP_MAX_OUT; sl++) {
            const int t = sl < TG_OP_MAX_IN ? g->ops[o].in[sl] : g->ops[o].out[sl - TG_OP_MAX_IN];
            if (t < 0 || g->tensors[t].pool != TG_POOL_GRADS) continue;
            const uint64_t a = g->tensors[t].offset, b = a + g->tensors[t].bytes;
            for (int k = 0; k < added; k++) /* a few spans (merged runs of cleared cells) */
                if (at[k] < 0 && zero[k].a < b && a < zero[k].b) at[k] = o;
        }
    for (int k = 0; k < added; k++)
        if (at[k] < 0) at[k] = zero_op; /* nothing touches it (the update reads every gradient): where it was */
    int w = 0;
    for (int o = 0; o < first_new; o++) {
        for (int k = 0; k < added; k++)
            if (at[k] == o) ops[w++] = g->ops[first_new + k];
        if (o != zero_op) ops[w++] = g->ops[o];
    }
    memcpy(g->ops, ops, sizeof *ops * (size_t)w);
    g->n_ops = w;
    free(at), free(ops), free(zero);
    return 0;
}
