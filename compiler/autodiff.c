/* Reverse-mode autodiff over the forward schedule. */
#include "compiler/autodiff.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/op_table.h"

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
    /* The new tensor extends the per-tensor arrays. */
    int *grad = realloc(g->grad, sizeof *grad * (size_t)g->cap_tensors);
    char *needs = realloc(g->needs_grad, (size_t)g->cap_tensors);
    if (!grad || !needs) return tg_graph_fail(g, "out of memory");
    g->grad = grad;
    g->needs_grad = needs;
    g->grad[d] = -1;
    g->needs_grad[d] = 0;
    return d;
}

static int grad_tensor_like(tg_graph *g, int t) {
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
    return grad_tensor_like(g, t);
}

void tg_ad_pass(tg_graph *g, int t, int grad) {
    if (g->failed) return;
    if (g->grad[t] < 0) {
        g->grad[t] = grad;
        return;
    }
    /* A second consumer: the gradient is the sum of the contributions. */
    int sum = grad_tensor_like(g, t);
    if (sum < 0) return;
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = g->grad[t], s.in[1] = grad, s.out[0] = sum;
    s.i[0] = tg_tensor_numel(&g->tensors[t]);
    tg_graph_op(g, &s);
    g->grad[t] = sum;
}

int tg_ad_grad_accumulable(tg_graph *g, int t) {
    if (t < 0 || g->failed || !g->needs_grad[t] || (g->tensors[t].flags & TG_TENSOR_PARAM)) return -1;
    int sum = g->grad[t];
    if (sum < 0) return -1;
    const tg_tensor *x = &g->tensors[sum];
    if (x->pool != TG_POOL_ACTIVATIONS || (x->flags & (TG_TENSOR_PARAM | TG_TENSOR_GRAD | TG_TENSOR_VIEW))) return -1;
    /* ADD's rule hands one tensor to both inputs: updating it would change the other's. */
    for (int u = 0; u < g->n_tensors; u++)
        if (u != t && g->grad[u] == sum) return -1;
    return sum;
}

void tg_ad_commit(tg_graph *g, int t, int dest) {
    if (dest < 0 || (g->tensors[t].flags & TG_TENSOR_PARAM)) return;
    tg_ad_pass(g, t, dest);
}

int tg_autodiff(tg_graph *g, int loss) {
    if (g->failed) return -1;
    int n_forward = g->n_ops;
    g->grad = malloc(sizeof *g->grad * (size_t)g->cap_tensors);
    g->needs_grad = calloc((size_t)g->cap_tensors, 1);
    if (!g->grad || !g->needs_grad) return tg_graph_fail(g, "out of memory");
    for (int t = 0; t < g->n_tensors; t++) {
        g->grad[t] = -1;
        g->needs_grad[t] = (g->tensors[t].flags & TG_TENSOR_PARAM) != 0;
    }
    /* Forward dependence on parameters, in schedule order. */
    for (int o = 0; o < n_forward; o++) {
        const tg_op *op = &g->ops[o];
        int any = 0;
        for (int s = 0; s < TG_OP_MAX_IN; s++) any |= op->in[s] >= 0 && g->needs_grad[op->in[s]];
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (op->out[s] >= 0 && any) g->needs_grad[op->out[s]] = 1;
    }
    if (!g->needs_grad[loss]) return tg_graph_fail(g, "loss does not depend on any parameter");

    g->phase = TG_PHASE_BACKWARD;
    tg_op_spec zero = tg_spec(TG_OP_ZERO);
    zero.out[0] = g->io.grads_all;
    tg_graph_op(g, &zero);

    int seed = grad_tensor_like(g, loss);
    tg_op_spec fill = tg_spec(TG_OP_FILL);
    fill.out[0] = seed;
    /* The replicas' gradients are summed (TG_OP_ALL_REDUCE): the mean of their losses'
     * gradients, each loss a mean over its own batch (as PyTorch DDP). */
    fill.f[0] = g->job && g->job->data_parallel > 1 ? 1.0f / (float)g->job->data_parallel : 1.0f;
    tg_graph_op(g, &fill);
    g->grad[loss] = seed;

    for (int o = n_forward - 1; o >= 0 && !g->failed; o--) {
        const tg_op *op = &g->ops[o];
        int has = 0;
        for (int s = 0; s < TG_OP_MAX_OUT; s++) has |= op->out[s] >= 0 && g->grad[op->out[s]] >= 0;
        if (!has) continue;
        const tg_op_row *row = tg_op_row_of(op->kind);
        if (!row->backward) return tg_graph_fail(g, "op %s has no backward rule", tg_op_name(op->kind));
        row->backward(g, o);
    }
    return g->failed ? -1 : 0;
}
