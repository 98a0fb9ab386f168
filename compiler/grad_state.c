/* Per-tensor gradient state during autodiff: which tensor holds each gradient so far, and
 * where the next contribution goes. */
#include "compiler/grad_state.h"
#include "compiler/compiler_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tg_op_spec tg_spec(int kind) {
    tg_op_spec s;
    memset(&s, 0, sizeof s);
    s.kind = kind;
    for (int i = 0; i < TG_OP_MAX_IN; i++) s.in[i] = -1;
    for (int i = 0; i < TG_OP_MAX_OUT; i++) s.out[i] = -1;
    return s;
}

int tg_ad_grad_of(tg_graph *g, int t) { return t < 0 ? -1 : g->grad[t]; }

int tg_ad_activation(tg_graph *g, const char *name, int ndim, const int64_t *shape) {
    int d = tg_graph_tensor(g, name, TG_F32, TG_POOL_ACTIVATIONS, ndim, shape);
    if (d < 0) return -1;
    /* The new tensor extends the per-tensor arrays. Each is stored as soon as it moves: a
     * successful realloc has freed the old block. */
    int *grad = tg_compiler_realloc(g->grad, sizeof *grad * (size_t)g->cap_tensors);
    if (!grad) return tg_graph_out_of_memory(g);
    g->grad = grad;
    char *needs = tg_compiler_realloc(g->needs_grad, (size_t)g->cap_tensors);
    if (!needs) return tg_graph_out_of_memory(g);
    g->needs_grad = needs;
    int *holders = tg_compiler_realloc(g->grad_holders, sizeof *holders * (size_t)g->cap_tensors);
    if (!holders) return tg_graph_out_of_memory(g);
    g->grad_holders = holders;
    g->grad_holders[d] = 0;
    g->grad[d] = -1;
    g->needs_grad[d] = 0;
    return d;
}

int tg_ad_grad_like(tg_graph *g, int t) {
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "d.%s", g->tensors[t].name);
    const tg_tensor *src = &g->tensors[t];
    return tg_ad_activation(g, name, src->ndim, src->shape);
}

int tg_ad_grad_dest(tg_graph *g, int t, int *accumulate) {
    *accumulate = 0;
    if (t < 0 || g->failed || !g->needs_grad[t]) return -1;
    if (g->tensors[t].flags & TG_TENSOR_PARAM) {
        *accumulate = 1;
        return g->tensors[t].grad;
    }
    return tg_ad_grad_like(g, t);
}

int tg_ad_grad_dest_or_scratch(tg_graph *g, int t, int *accumulate, int *scratch) {
    *scratch = 0;
    int d = tg_ad_grad_dest(g, t, accumulate);
    if (d >= 0 || g->failed || t < 0) return d;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "scratch.d.%s", g->tensors[t].name);
    const tg_tensor *src = &g->tensors[t];
    int64_t shape[TG_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    *scratch = 1;
    return tg_ad_activation(g, name, src->ndim, shape);
}

void tg_ad_pass(tg_graph *g, int t, int grad) {
    if (g->failed) return;
    if (g->grad[t] < 0) {
        g->grad[t] = grad;
        if (grad >= 0) g->grad_holders[grad]++;
        return;
    }
    /* A second consumer: the gradient is the sum of the contributions. */
    int sum = tg_ad_grad_like(g, t);
    if (sum < 0) return;
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = g->grad[t], s.in[1] = grad, s.out[0] = sum;
    s.p.count.n = tg_tensor_numel(&g->tensors[t]);
    tg_graph_op(g, &s);
    g->grad_holders[g->grad[t]]--, g->grad_holders[sum]++;
    g->grad[t] = sum;
}

int tg_ad_grad_accumulable(tg_graph *g, int t) {
    if (t < 0 || g->failed || !g->needs_grad[t] || (g->tensors[t].flags & TG_TENSOR_PARAM)) return -1;
    int sum = g->grad[t];
    if (sum < 0) return -1;
    const tg_tensor *x = &g->tensors[sum];
    if (x->pool != TG_POOL_ACTIVATIONS || (x->flags & (TG_TENSOR_PARAM | TG_TENSOR_GRAD | TG_TENSOR_VIEW))) return -1;
    /* ADD's rule hands one tensor to both inputs: updating it would change the other's. */
    return g->grad_holders[sum] > 1 ? -1 : sum; /* t holds it; any other holder forbids */
}

void tg_ad_commit(tg_graph *g, int t, int dest) {
    if (dest < 0 || (g->tensors[t].flags & TG_TENSOR_PARAM)) return;
    tg_ad_pass(g, t, dest);
}
