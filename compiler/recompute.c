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

static int slot_of(const int32_t *slots, int n, int t) {
    for (int s = 0; s < n; s++)
        if (slots[s] == t) return 1;
    return 0;
}

/* Whether op w can run right after op b instead of where it is (w < b): nothing in
 * (w, b] reads what w writes or writes what w reads or writes, nor reads `out` (which
 * would then read the copy before b makes it). */
static int movable_after(const tg_graph *g, int w, int b, int out) {
    const tg_op *m = &g->ops[w];
    for (int o = w + 1; o <= b; o++) {
        const tg_op *op = &g->ops[o];
        if (slot_of(op->in, TG_OP_MAX_IN, out)) return 0;
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            const int t = m->out[s];
            if (t >= 0 && (slot_of(op->in, TG_OP_MAX_IN, t) || slot_of(op->out, TG_OP_MAX_OUT, t))) return 0;
        }
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (m->in[s] >= 0 && slot_of(op->out, TG_OP_MAX_OUT, m->in[s])) return 0;
    }
    return 1;
}

int tg_recompute(tg_graph *g) {
    if (g->failed) return -1;
    if (!g->job || g->job->recompute != TG_RECOMPUTE_GELU) return 0;
    const int n0 = g->n_ops, nt = g->n_tensors;
    int b0 = n0;
    for (int o = 0; o < n0; o++)
        if (g->ops[o].phase != TG_PHASE_FORWARD) {
            b0 = o;
            break;
        }
    /* Per tensor: the first backward op reading it, the GELU_BWD reading it as its x, and
     * its recomputed copy (-1: none). Per op: the new op to run right before it, and the
     * op moved to run right after it (-1: none; at most one each: one GELU per reader). */
    int *first_reader = tg_compiler_malloc(sizeof *first_reader * ((size_t)nt + 1));
    int *bwd_of = tg_compiler_malloc(sizeof *bwd_of * ((size_t)nt + 1));
    int *copy_of = tg_compiler_malloc(sizeof *copy_of * ((size_t)nt + 1));
    int *new_before = tg_compiler_malloc(sizeof *new_before * ((size_t)n0 + 1));
    int *moved_after = tg_compiler_malloc(sizeof *moved_after * ((size_t)n0 + 1));
    char *moved = tg_compiler_calloc((size_t)n0 + 1, 1);
    if (!first_reader || !bwd_of || !copy_of || !new_before || !moved_after || !moved) {
        free(first_reader), free(bwd_of), free(copy_of), free(new_before), free(moved_after), free(moved);
        return tg_graph_out_of_memory(g);
    }
    for (int t = 0; t < nt; t++) first_reader[t] = bwd_of[t] = copy_of[t] = -1;
    for (int o = 0; o < n0; o++) new_before[o] = moved_after[o] = -1;
    for (int o = n0 - 1; o >= b0; o--) {
        const tg_op *op = &g->ops[o];
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (op->in[k] >= 0 && op->in[k] < nt) first_reader[op->in[k]] = o;
        if (op->kind == TG_OP_GELU_BWD && op->in[1] >= 0 && op->in[1] < nt && op->out[2] < 0) bwd_of[op->in[1]] = o;
    }
    const int phase = g->phase;
    g->phase = TG_PHASE_BACKWARD;
    for (int f = 0; f < b0 && !g->failed; f++) {
        int out, pre, form;
        if (!gelu_of(&g->ops[f], &out, &pre, &form) || out < 0 || out >= nt || pre < 0 || pre >= nt ||
            first_reader[out] < 0 || copy_of[out] >= 0)
            continue;
        const int w = first_reader[out], b = bwd_of[pre];
        /* The GELU backward on the same pre-activation writes the copy as it goes, when the
         * reader runs after it or can be moved there; else a GELU op before the reader. */
        const int fused = b >= 0 && g->ops[b].p.gelu_bwd.form == form && new_before[w] < 0 && !moved[w] &&
                          (b < w || (moved_after[b] < 0 && movable_after(g, w, b, out)));
        if (!fused && new_before[w] >= 0) continue;
        char name[TG_NAME_MAX];
        if (snprintf(name, sizeof name, "%s.recomputed", g->tensors[out].name) >= (int)sizeof name) {
            tg_graph_fail(g, "tensor name %s too long to name its recomputed copy", g->tensors[out].name);
            break;
        }
        int64_t shape[TG_MAX_DIMS];
        memcpy(shape, g->tensors[out].shape, sizeof shape);
        const int copy = tg_graph_tensor(g, name, g->tensors[out].dtype, TG_POOL_ACTIVATIONS, g->tensors[out].ndim, shape);
        if (copy < 0) break;
        if (fused) {
            g->ops[b].out[2] = copy;
            if (b > w) moved_after[b] = w, moved[w] = 1;
        } else {
            tg_op_spec s = tg_spec(TG_OP_GELU);
            s.in[0] = pre, s.out[0] = copy;
            s.p.gelu.n = tg_tensor_numel(&g->tensors[copy]), s.p.gelu.form = form;
            const int op = tg_graph_op(g, &s);
            if (op < 0) break;
            new_before[w] = op;
        }
        copy_of[out] = copy;
    }
    g->phase = phase;
    /* Every backward reader reads the copy. */
    for (int o = b0; o < n0 && !g->failed; o++)
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (g->ops[o].in[k] >= 0 && g->ops[o].in[k] < nt && copy_of[g->ops[o].in[k]] >= 0)
                g->ops[o].in[k] = copy_of[g->ops[o].in[k]];
    free(first_reader), free(bwd_of), free(copy_of);
    /* The schedule again: each new op right before its reader, each moved reader right
     * after the GELU backward that makes its copy. */
    const int total = g->n_ops;
    tg_op *ops = g->failed ? NULL : tg_compiler_malloc(sizeof *ops * ((size_t)total + 1));
    if (ops) {
        int w = 0;
        for (int o = 0; o < n0; o++) {
            if (new_before[o] >= 0) ops[w++] = g->ops[new_before[o]];
            if (!moved[o]) ops[w++] = g->ops[o];
            if (moved_after[o] >= 0) ops[w++] = g->ops[moved_after[o]];
        }
        memcpy(g->ops, ops, sizeof *ops * (size_t)total);
    } else if (!g->failed) {
        tg_graph_out_of_memory(g);
    }
    free(ops), free(new_before), free(moved_after), free(moved);
    return g->failed ? -1 : 0;
}
