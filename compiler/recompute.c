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

/* ---- layers ------------------------------------------------------------------------ */

/* Whether forward op `op`, copied into the backward with the same parameters and the same
 * inputs, writes the same values: a pure function of its inputs and parameters (a dropout
 * mask is one of the run's seed, the step counter it reads and its key, a parameter), with
 * every output a plain activation it overwrites (no loss, no logits, nothing the runtime
 * reads, no accumulation). */
static int recomputable(const tg_graph *g, const tg_op *op) {
    switch (op->kind) {
    case TG_OP_ADD: case TG_OP_GELU: case TG_OP_TANH: case TG_OP_DROPOUT: case TG_OP_EMBEDDING:
    case TG_OP_LAYERNORM: case TG_OP_RESIDUAL_LAYERNORM: case TG_OP_RMSNORM: case TG_OP_ROPE: case TG_OP_SWIGLU:
    case TG_OP_ATTN_SOFTMAX: case TG_OP_ATTENTION: case TG_OP_HEADS_SPLIT: case TG_OP_HEADS_MERGE:
    case TG_OP_SELECT_TOKEN:
        break;
    case TG_OP_MATMUL:
        if (op->p.matmul.accumulate || op->p.matmul.bias_grad) return 0;
        break;
    default:
        return 0;
    }
    for (int k = 0; k < TG_OP_MAX_OUT; k++) {
        const int t = op->out[k];
        if (t < 0) continue;
        if (t >= g->n_tensors || g->tensors[t].pool != TG_POOL_ACTIVATIONS || g->tensors[t].flags ||
            t == g->io.loss || t == g->io.logits)
            return 0;
    }
    return 1;
}

/* recompute = layers: the forward ops of each of the first n_layers transformer layers
 * (0: all), a layer being a run of consecutive forward ops of one tg_op_layer, form a
 * segment. A tensor a segment's op writes is kept (the backward reads the forward's) when a
 * forward op outside the segment reads it (the residual stream the next layer reads), when
 * its writer is not recomputable, or when any other op writes it too; the others are the
 * segment's intermediates. The ops whose intermediates the backward reads, and the ops
 * those read intermediates of, are copied, in forward order, right before the first
 * backward op that reads one of the copies: each copy reads the copies where the original
 * read intermediates and the originals elsewhere (the kept tensors, parameters, inputs,
 * the step counter), and writes fresh tensors named "<original>.recomputed"; every backward
 * reader of an intermediate reads its copy. The intermediates then die in the forward. A
 * segment one of whose copies would read a tensor something writes between the segment's
 * start and the copies is left as it is. Returns 0 or -1 (g->err). */
static int recompute_layers(tg_graph *g, int n_layers) {
    const int n0 = g->n_ops, nt = g->n_tensors;
    int b0 = n0;
    for (int o = 0; o < n0; o++)
        if (g->ops[o].phase != TG_PHASE_FORWARD) {
            b0 = o;
            break;
        }
    /* Per tensor: its first writer, its writers, the first backward op reading it, the
     * segment stamp of the copies' outside inputs, its copy; flags kept, read by the
     * backward, read by a copy. Per op: its segment, whether it is copied. Per segment:
     * its layer, first op, insertion point, copies [begin, end), the next segment inserted
     * at the same point, whether it is left as it is. */
    int *producer = tg_compiler_malloc(sizeof(int) * ((size_t)nt + 1));
    int *writes = tg_compiler_calloc((size_t)nt + 1, sizeof(int));
    int *first_bwd = tg_compiler_malloc(sizeof(int) * ((size_t)nt + 1));
    int *stamp = tg_compiler_malloc(sizeof(int) * ((size_t)nt + 1));
    int *copy_of = tg_compiler_malloc(sizeof(int) * ((size_t)nt + 1));
    char *kept = tg_compiler_calloc((size_t)nt + 1, 1), *bwd_read = tg_compiler_calloc((size_t)nt + 1, 1);
    char *copy_read = tg_compiler_calloc((size_t)nt + 1, 1);
    int *seg = tg_compiler_malloc(sizeof(int) * ((size_t)n0 + 1));
    char *needed = tg_compiler_calloc((size_t)n0 + 1, 1);
    int *head = tg_compiler_malloc(sizeof(int) * ((size_t)n0 + 1));
    /* At most one segment per forward op. */
    int *seg_layer = tg_compiler_malloc(sizeof(int) * ((size_t)b0 + 1));
    int *seg_begin = tg_compiler_malloc(sizeof(int) * ((size_t)b0 + 1));
    int *seg_at = tg_compiler_malloc(sizeof(int) * ((size_t)b0 + 1));
    int *seg_copies = tg_compiler_malloc(sizeof(int) * ((size_t)b0 + 1));
    int *seg_copies_end = tg_compiler_malloc(sizeof(int) * ((size_t)b0 + 1));
    int *seg_next = tg_compiler_malloc(sizeof(int) * ((size_t)b0 + 1));
    char *unsafe = tg_compiler_calloc((size_t)b0 + 1, 1);
    tg_op *ops = NULL;
    int rc = -1;
    if (!producer || !writes || !first_bwd || !stamp || !copy_of || !kept || !bwd_read || !copy_read || !seg ||
        !needed || !head || !seg_layer || !seg_begin || !seg_at || !seg_copies || !seg_copies_end || !seg_next ||
        !unsafe) {
        tg_graph_out_of_memory(g);
        goto out;
    }
    for (int t = 0; t < nt; t++) producer[t] = first_bwd[t] = stamp[t] = copy_of[t] = -1;
    for (int o = 0; o < n0; o++) {
        head[o] = -1;
        for (int k = 0; k < TG_OP_MAX_OUT; k++) {
            const int t = g->ops[o].out[k];
            if (t < 0 || t >= nt) continue;
            writes[t]++;
            if (producer[t] < 0) producer[t] = o;
        }
    }
    /* The segments: runs of forward ops of one selected layer. */
    int n_seg = 0;
    for (int o = 0; o < b0; o++) {
        const int l = tg_op_layer(g->tensors, nt, &g->ops[o]);
        seg[o] = -1;
        if (l < 0 || (n_layers > 0 && l >= n_layers)) continue;
        if (o > 0 && seg[o - 1] >= 0 && seg_layer[seg[o - 1]] == l) {
            seg[o] = seg[o - 1];
            continue;
        }
        seg[o] = n_seg;
        seg_layer[n_seg] = l, seg_begin[n_seg] = o, seg_at[n_seg] = INT32_MAX, seg_copies[n_seg] = -1;
        seg_copies_end[n_seg] = -1, seg_next[n_seg] = -1;
        n_seg++;
    }
    for (int o = b0; o < n0; o++) seg[o] = -1;
    if (!n_seg) {
        rc = 0;
        goto out;
    }
    /* Kept tensors. */
    for (int o = 0; o < b0; o++) {
        const tg_op *op = &g->ops[o];
        if (seg[o] >= 0) {
            const int pure = recomputable(g, op);
            for (int k = 0; k < TG_OP_MAX_OUT; k++)
                if (op->out[k] >= 0 && op->out[k] < nt && (!pure || writes[op->out[k]] != 1)) kept[op->out[k]] = 1;
        }
        for (int k = 0; k < TG_OP_MAX_IN; k++) {
            const int t = op->in[k];
            if (t < 0 || t >= nt) continue;
            const int w = producer[t];
            if (w >= 0 && w < b0 && seg[w] >= 0 && seg[w] != seg[o]) kept[t] = 1;
        }
    }
    for (int o = n0 - 1; o >= b0; o--)
        for (int k = 0; k < TG_OP_MAX_IN; k++) {
            const int t = g->ops[o].in[k];
            if (t >= 0 && t < nt) bwd_read[t] = 1, first_bwd[t] = o;
        }
    /* The ops to copy, from the last back: those writing an intermediate the backward or a
     * later copy reads. */
    for (int o = b0 - 1; o >= 0; o--) {
        if (seg[o] < 0) continue;
        const tg_op *op = &g->ops[o];
        for (int k = 0; k < TG_OP_MAX_OUT && !needed[o]; k++) {
            const int t = op->out[k];
            needed[o] = t >= 0 && t < nt && !kept[t] && (bwd_read[t] || copy_read[t]);
        }
        if (!needed[o]) continue;
        for (int k = 0; k < TG_OP_MAX_IN; k++) {
            const int t = op->in[k];
            if (t >= 0 && t < nt && !kept[t] && producer[t] >= 0 && seg[producer[t]] == seg[o]) copy_read[t] = 1;
        }
        for (int k = 0; k < TG_OP_MAX_OUT; k++) {
            const int t = op->out[k];
            if (t >= 0 && t < nt && !kept[t] && bwd_read[t] && first_bwd[t] < seg_at[seg[o]]) seg_at[seg[o]] = first_bwd[t];
        }
    }
    /* A segment whose copies would read a tensor that something writes between the
     * segment's start and the copies is left as it is. */
    for (int s = 0; s < n_seg; s++) {
        if (seg_at[s] == INT32_MAX) {
            unsafe[s] = 1; /* nothing to copy */
            continue;
        }
        for (int o = seg_begin[s]; o < b0 && seg[o] == s; o++)
            for (int k = 0; needed[o] && k < TG_OP_MAX_IN; k++) {
                const int t = g->ops[o].in[k];
                if (t >= 0 && t < nt && (kept[t] || producer[t] < 0 || seg[producer[t]] != s)) stamp[t] = s;
            }
        for (int w = seg_begin[s]; w < seg_at[s] && !unsafe[s]; w++)
            for (int k = 0; k < TG_OP_MAX_OUT; k++) {
                const int t = g->ops[w].out[k];
                if (t >= 0 && t < nt && stamp[t] == s && !(producer[t] == w && writes[t] == 1)) unsafe[s] = 1;
            }
    }
    /* The copies, segment by segment in forward order, appended to the backward. */
    const int phase = g->phase;
    g->phase = TG_PHASE_BACKWARD;
    for (int s = 0; s < n_seg && !g->failed; s++) {
        if (unsafe[s]) continue;
        seg_copies[s] = g->n_ops;
        for (int o = seg_begin[s]; o < b0 && seg[o] == s && !g->failed; o++) {
            if (!needed[o]) continue;
            tg_op_spec spec = tg_spec(g->ops[o].kind);
            spec.p = g->ops[o].p;
            for (int k = 0; k < TG_OP_MAX_IN; k++) {
                const int t = g->ops[o].in[k];
                spec.in[k] = t >= 0 && t < nt && copy_of[t] >= 0 ? copy_of[t] : t;
            }
            for (int k = 0; k < TG_OP_MAX_OUT && !g->failed; k++) {
                const int t = g->ops[o].out[k];
                if (t < 0) continue;
                char name[TG_NAME_MAX];
                if (snprintf(name, sizeof name, "%s.recomputed", g->tensors[t].name) >= (int)sizeof name) {
                    tg_graph_fail(g, "tensor name %s too long to name its recomputed copy", g->tensors[t].name);
                    break;
                }
                const tg_tensor *x = &g->tensors[t];
                const int c = tg_graph_tensor(g, name, x->dtype, x->pool, x->ndim, x->shape);
                spec.out[k] = c;
                /* A kept output is read as the forward wrote it: the copy's goes unread. */
                if (c >= 0 && !kept[t]) copy_of[t] = c;
            }
            if (!g->failed) tg_graph_op(g, &spec);
        }
        seg_copies_end[s] = g->n_ops;
    }
    g->phase = phase;
    if (g->failed) goto out;
    /* Every backward reader of an intermediate reads its copy. */
    for (int o = b0; o < n0; o++)
        for (int k = 0; k < TG_OP_MAX_IN; k++) {
            const int t = g->ops[o].in[k];
            if (t >= 0 && t < nt && copy_of[t] >= 0) g->ops[o].in[k] = copy_of[t];
        }
    /* The schedule again: each segment's copies right before its insertion point, the
     * segments meeting at one point in forward order. */
    for (int s = n_seg - 1; s >= 0; s--)
        if (!unsafe[s]) seg_next[s] = head[seg_at[s]], head[seg_at[s]] = s;
    const int total = g->n_ops;
    ops = tg_compiler_malloc(sizeof *ops * ((size_t)total + 1));
    if (!ops) {
        tg_graph_out_of_memory(g);
        goto out;
    }
    int w = 0;
    for (int o = 0; o < n0; o++) {
        for (int s = head[o]; s >= 0; s = seg_next[s])
            for (int c = seg_copies[s]; c < seg_copies_end[s]; c++) ops[w++] = g->ops[c];
        ops[w++] = g->ops[o];
    }
    if (w != total) { /* GCOVR_EXCL_BR_LINE: every copy has its segment's insertion point, an op below n0 */
        tg_graph_fail(g, "recompute placed %d of %d ops", w, total);
        goto out;
    }
    memcpy(g->ops, ops, sizeof *ops * (size_t)total);
    rc = 0;
out:
    free(producer), free(writes), free(first_bwd), free(stamp), free(copy_of), free(kept), free(bwd_read);
    free(copy_read), free(seg), free(needed), free(head), free(seg_layer), free(seg_begin), free(seg_at);
    free(seg_copies), free(seg_copies_end), free(seg_next), free(unsafe), free(ops);
    return rc;
}

/* ---- GELU outputs ------------------------------------------------------------------ */

static int recompute_gelu(tg_graph *g) {
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

int tg_recompute(tg_graph *g) {
    if (g->failed) return -1;
    if (!g->job) return 0;
    const int mode = g->job->recompute;
    if (mode == TG_RECOMPUTE_LAYERS && recompute_layers(g, g->job->recompute_layers)) return -1;
    return mode == TG_RECOMPUTE_GELU || mode == TG_RECOMPUTE_LAYERS ? recompute_gelu(g) : 0;
}
