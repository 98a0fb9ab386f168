/* Recomputation in the backward (compiler/recompute.h). */
#include "compiler/recompute.h"
#include "compiler/compiler_alloc.h"
#include "compiler/grad_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The GELU output forward op f makes and the pre-activation it comes from, with its form;
 * 0 when f makes none. */
static int gelu_of(const tg_op *f, int *out, int *pre, int *form) {
    if (f->kind == TG_OP_GELU) {
        *out = f->out[0], *pre = f->in[0], *form = (int)f->p.gelu.form;
        return 1;
    }
    if (f->kind == TG_OP_MATMUL && f->p.matmul.activation == TG_MATMUL_ACT_GELU) {
        *out = f->out[0], *pre = f->out[2], *form = TG_GELU_TANH; /* the epilogue's form */
        return 1;
    }
    return 0;
}

int tg_recompute(tg_graph *g) {
    if (g->failed) return -1;
    if (!g->job || g->job->recompute != TG_RECOMPUTE_GELU) return 0;
    const int n0 = g->n_ops;
    int b0 = n0;
    for (int o = 0; o < n0; o++)
        if (g->ops[o].phase != TG_PHASE_FORWARD) {
            b0 = o;
            break;
        }
    /* first_reader[t]: the first backward op reading tensor t (-1: none); copy_of[t]: the
     * recomputed copy of t (-1: none). before[k]: the op the k-th new op goes before. */
    const int nt = g->n_tensors;
    int *first_reader = tg_compiler_malloc(sizeof *first_reader * ((size_t)nt + 1));
    int *copy_of = tg_compiler_malloc(sizeof *copy_of * ((size_t)nt + 1));
    int *before = tg_compiler_malloc(sizeof *before * ((size_t)n0 + 1));
    if (!first_reader || !copy_of || !before) {
        free(first_reader), free(copy_of), free(before);
        return tg_graph_out_of_memory(g);
    }
    for (int t = 0; t < nt; t++) first_reader[t] = copy_of[t] = -1;
    for (int o = n0 - 1; o >= b0; o--)
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (g->ops[o].in[k] >= 0 && g->ops[o].in[k] < nt) first_reader[g->ops[o].in[k]] = o;
    const int phase = g->phase;
    g->phase = TG_PHASE_BACKWARD;
    int added = 0;
    for (int f = 0; f < b0 && !g->failed; f++) {
        int out, pre, form;
        if (!gelu_of(&g->ops[f], &out, &pre, &form) || out < 0 || out >= nt || pre < 0 || first_reader[out] < 0 ||
            copy_of[out] >= 0)
            continue;
        const tg_tensor *x = &g->tensors[out];
        char name[TG_NAME_MAX];
        if (snprintf(name, sizeof name, "%s.recomputed", x->name) >= (int)sizeof name) {
            tg_graph_fail(g, "tensor name %s too long to name its recomputed copy", x->name);
            break;
        }
        int64_t shape[TG_MAX_DIMS];
        memcpy(shape, x->shape, sizeof shape);
        const int copy = tg_graph_tensor(g, name, x->dtype, TG_POOL_ACTIVATIONS, x->ndim, shape);
        if (copy < 0) break;
        tg_op_spec s = tg_spec(TG_OP_GELU);
        s.in[0] = pre, s.out[0] = copy;
        s.p.gelu.n = tg_tensor_numel(&g->tensors[copy]), s.p.gelu.form = form;
        if (tg_graph_op(g, &s) < 0) break;
        before[added++] = first_reader[out];
        copy_of[out] = copy;
    }
    /* Every backward reader reads the copy. */
    for (int o = b0; o < n0 && !g->failed; o++)
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (g->ops[o].in[k] >= 0 && g->ops[o].in[k] < nt && copy_of[g->ops[o].in[k]] >= 0)
                g->ops[o].in[k] = copy_of[g->ops[o].in[k]];
    free(first_reader), free(copy_of);
    g->phase = phase;
    if (g->failed) {
        free(before);
        return -1;
    }
    /* The schedule again, each new op right before its first reader. The new ops were made
     * in forward order, which is the reverse of their readers' order in the backward. */
    const int total = g->n_ops;
    tg_op *ops = tg_compiler_malloc(sizeof *ops * ((size_t)total + 1));
    if (!ops) {
        free(before);
        return tg_graph_out_of_memory(g);
    }
    /* New ops by the op they precede: a count per op, then their places. */
    int *start = tg_compiler_calloc((size_t)n0 + 2, sizeof *start), *order = tg_compiler_malloc(sizeof *order * ((size_t)added + 1));
    if (!start || !order) {
        free(ops), free(before), free(start), free(order);
        return tg_graph_out_of_memory(g);
    }
    for (int k = 0; k < added; k++) start[before[k] + 1]++;
    for (int o = 0; o < n0; o++) start[o + 1] += start[o];
    for (int k = 0; k < added; k++) order[start[before[k]]++] = k;
    for (int o = n0; o > 0; o--) start[o] = start[o - 1];
    start[0] = 0;
    int w = 0;
    for (int o = 0; o < n0; o++) {
        for (int i = start[o]; i < start[o + 1]; i++) ops[w++] = g->ops[n0 + order[i]];
        ops[w++] = g->ops[o];
    }
    free(start), free(order);
    memcpy(g->ops, ops, sizeof *ops * (size_t)total);
    free(ops), free(before);
    return 0;
}
