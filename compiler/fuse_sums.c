/* Sums folded into matrix products (compiler/fuse_sums.h). */
#include "compiler/fuse_sums.h"
#include "compiler/compiler_alloc.h"

#include <stdlib.h>
#include <string.h>

#include "plan/op_meta.h"

_Thread_local int tg_fuse_sums_off;

/* Flags that give a tensor a role past a plain intermediate. */
#define ROLE_FLAGS                                                                                                  \
    (TG_TENSOR_PARAM | TG_TENSOR_GRAD | TG_TENSOR_INPUT | TG_TENSOR_OUTPUT | TG_TENSOR_VIEW | TG_TENSOR_TIED |      \
     TG_TENSOR_PARAM_COPY | TG_TENSOR_FROZEN | TG_TENSOR_BUFFER)

typedef struct fold_state {
    tg_graph *g;
    char *gone;    /* per op: removed (the ADDs) or moved away (the products' old places) */
    char *dead;    /* per tensor: no op refers to it any more */
    char *io_role; /* per tensor: bound in g->io */
} fold_state;

static int reads(const tg_op *op, int t) {
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (op->in[s] == t) return 1;
    return 0;
}

static int writes(const tg_op *op, int t) {
    for (int s = 0; s < TG_OP_MAX_OUT; s++)
        if (op->out[s] == t) return 1;
    return 0;
}

/* An activation with no other role: the fold may drop or rename it. */
static int plain(const fold_state *f, int t) {
    const tg_tensor *x = &f->g->tensors[t];
    return x->pool == TG_POOL_ACTIVATIONS && !(x->flags & ROLE_FLAGS) && !f->io_role[t];
}

static int same_layout(const tg_tensor *x, const tg_tensor *y) {
    if (x->dtype != y->dtype || x->ndim != y->ndim) return 0;
    for (int d = 0; d < x->ndim; d++)
        if (x->shape[d] != y->shape[d]) return 0;
    return 1;
}

/* Whether writing tensor w may change what reading tensor r reads: the same tensor, or
 * one pool where either is a view or the pool holds views over its tensors (every pool but
 * the activations', whose tensors are apart while both live). */
static int may_alias(const tg_graph *g, int w, int r) {
    if (w == r) return 1;
    const tg_tensor *x = &g->tensors[w], *y = &g->tensors[r];
    if (x->pool != y->pool) return 0;
    return x->pool != TG_POOL_ACTIVATIONS || ((x->flags | y->flags) & TG_TENSOR_VIEW);
}

/* Folds ADD ops[j] into the product writing its input `which`; 1 when it did. */
static int fold(fold_state *f, int j, int which) {
    tg_graph *g = f->g;
    const tg_op *add = &g->ops[j];
    const int m = add->in[which], a = add->in[1 - which], z = add->out[0];
    if (a == m || a == z || m == z || !plain(f, a) || !plain(f, m) || !plain(f, z)) return 0;
    if (!same_layout(&g->tensors[a], &g->tensors[m]) || !same_layout(&g->tensors[z], &g->tensors[m])) return 0;
    int w = -1, writers = 0;
    for (int o = 0; o < g->n_ops; o++) {
        if (f->gone[o] || o == j) continue;
        const tg_op *op = &g->ops[o];
        if (reads(op, m)) return 0;
        if (writes(op, m)) writers++, w = o;
        /* Before the ADD nothing refers to z (the renamed a takes its place); after it,
         * a is never referred to again, so it may hold the sum. */
        if (o < j && (reads(op, z) || writes(op, z))) return 0;
        if (o > j && (reads(op, a) || writes(op, a))) return 0;
    }
    if (writers != 1 || w > j) return 0;
    const tg_op *mm = &g->ops[w];
    const tg_matmul_params *p = &mm->p.matmul;
    if (mm->kind != TG_OP_MATMUL || mm->phase != add->phase || mm->out[0] != m || p->accumulate || p->bias_grad ||
        p->activation || mm->in[2] >= 0 || mm->in[3] >= 0 || mm->out[1] >= 0 || mm->out[2] >= 0)
        return 0;
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (mm->in[s] >= 0 && (mm->in[s] == a || mm->in[s] == m || mm->in[s] == z)) return 0;
    /* Moved to the ADD's place, the product must read what it read at its own. */
    for (int o = w + 1; o < j; o++) {
        if (f->gone[o]) continue;
        for (int k = 0; k < TG_OP_MAX_OUT; k++) {
            const int t = g->ops[o].out[k];
            if (t < 0) continue;
            for (int s = 0; s < TG_OP_MAX_IN; s++)
                if (mm->in[s] >= 0 && may_alias(g, t, mm->in[s])) return 0;
        }
    }
    tg_op moved = *mm;
    moved.out[0] = z;
    moved.p.matmul.accumulate = 1;
    const tg_op_check_ctx ctx = {g->tensors, g->n_tensors, g->job ? g->job->data_parallel : 1};
    char why[256];
    if (tg_op_check(&ctx, &moved, why, sizeof why)) /* GCOVR_EXCL_BR_LINE: z has m's dtype and shape (checked above) */
        return tg_graph_fail(g, "folding sum %d into product %d: %s", j, w, why), 0;
    f->gone[w] = 1;
    g->ops[j] = moved;
    for (int o = 0; o < j; o++) {
        if (f->gone[o]) continue;
        tg_op *op = &g->ops[o];
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (op->in[s] == a) op->in[s] = z;
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (op->out[s] == a) op->out[s] = z;
    }
    f->dead[a] = f->dead[m] = 1;
    return 1;
}

/* The FLOPs of the last op before ops[j] writing tensor t: a product's, else 0. */
static double writer_flops(const fold_state *f, int j, int t) {
    for (int o = j - 1; o >= 0; o--)
        if (!f->gone[o] && writes(&f->g->ops[o], t))
            return f->g->ops[o].kind == TG_OP_MATMUL ? tg_op_flops(&f->g->ops[o]) : 0.0;
    return 0.0;
}

static int32_t remapped(const int *map, int32_t t) { return t < 0 ? t : map[t]; }

/* Closes up the op table (the folded ADDs and the products' old places) and the tensor
 * table (the tensors no op refers to any more), renumbering every tensor reference. */
static int close_up(fold_state *f) {
    tg_graph *g = f->g;
    int n = 0;
    for (int o = 0; o < g->n_ops; o++)
        if (!f->gone[o]) g->ops[n++] = g->ops[o];
    g->n_ops = n;
    int *map = tg_compiler_malloc(sizeof *map * ((size_t)g->n_tensors + 1));
    if (!map) return tg_graph_out_of_memory(g);
    n = 0;
    for (int t = 0; t < g->n_tensors; t++) map[t] = f->dead[t] ? -1 : n++;
    int stray = -1; /* an op still referring to a dropped tensor (none can) */
    for (int o = 0; o < g->n_ops; o++) {
        tg_op *op = &g->ops[o];
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (op->in[s] >= 0 && f->dead[op->in[s]]) stray = o;
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (op->out[s] >= 0 && f->dead[op->out[s]]) stray = o;
        for (int s = 0; s < TG_OP_MAX_IN; s++) op->in[s] = remapped(map, op->in[s]);
        for (int s = 0; s < TG_OP_MAX_OUT; s++) op->out[s] = remapped(map, op->out[s]);
    }
    if (stray >= 0) { /* GCOVR_EXCL_BR_LINE: fold renames or drops every reference to what it drops */
        free(map);
        return tg_graph_fail(g, "op %d refers to a tensor the sum folding dropped", stray);
    }
    int32_t io[sizeof g->io / sizeof(int32_t)]; /* tg_plan_io is all int32 */
    memcpy(io, &g->io, sizeof io);
    for (size_t i = 0; i < sizeof io / sizeof io[0]; i++) io[i] = remapped(map, io[i]);
    memcpy(&g->io, io, sizeof io);
    for (int t = 0; t < g->n_tensors; t++) {
        if (f->dead[t]) continue;
        tg_tensor x = g->tensors[t];
        x.grad = remapped(map, x.grad), x.master = remapped(map, x.master), x.group = remapped(map, x.group);
        g->tensors[map[t]] = x;
    }
    g->n_tensors = n;
    free(map);
    /* Autodiff's per-tensor state and the backward rules' indexes number tensors and ops
     * that moved (and cover only the tensors of their time): dropped, as nothing after
     * autodiff reads them. */
    free(g->grad), free(g->needs_grad), free(g->grad_holders);
    free(g->forward_reads), free(g->gelu_producer), free(g->writes), free(g->last_write);
    g->grad = g->grad_holders = NULL, g->needs_grad = NULL;
    g->forward_reads = g->gelu_producer = g->writes = g->last_write = NULL;
    g->n_indexed_tensors = g->writes_cap = g->ops_indexed = 0;
    return 0;
}

int tg_fuse_matmul_sums(tg_graph *g) {
    if (g->failed) return -1;
    if (tg_fuse_sums_off) return 0;
    fold_state f = {g, NULL, NULL, NULL};
    f.gone = tg_compiler_calloc((size_t)g->n_ops + 1, 1);
    f.dead = tg_compiler_calloc((size_t)g->n_tensors + 1, 1);
    f.io_role = tg_compiler_calloc((size_t)g->n_tensors + 1, 1);
    int rc = -1;
    if (!f.gone || !f.dead || !f.io_role) {
        tg_graph_out_of_memory(g);
        goto out;
    }
    int32_t io[sizeof g->io / sizeof(int32_t)];
    memcpy(io, &g->io, sizeof io);
    for (size_t i = 0; i < sizeof io / sizeof io[0]; i++)
        if (io[i] >= 0 && io[i] < g->n_tensors) f.io_role[io[i]] = 1;
    int folded = 0;
    for (int j = 0; j < g->n_ops && !g->failed; j++) {
        if (g->ops[j].kind != TG_OP_ADD) continue;
        const tg_op *add = &g->ops[j];
        const int first = writer_flops(&f, j, add->in[0]) > writer_flops(&f, j, add->in[1]) ? 0 : 1;
        for (int k = 0; k < 2; k++)
            if (fold(&f, j, k ? 1 - first : first)) {
                folded++;
                break;
            }
    }
    if (g->failed) goto out;
    rc = folded ? close_up(&f) : 0;
out:
    free(f.gone), free(f.dead), free(f.io_role);
    return rc;
}
