/* Reverse-mode autodiff over the forward schedule. */
#include "compiler/autodiff.h"
#include "compiler/compiler_alloc.h"
#include "compiler/backward_rules.h"

#include <stdlib.h>

int tg_autodiff(tg_graph *g, int loss) {
    if (g->failed) return -1;
    int n_forward = g->n_ops;
    g->grad = tg_compiler_malloc(sizeof *g->grad * (size_t)g->cap_tensors);
    g->needs_grad = tg_compiler_calloc((size_t)g->cap_tensors, 1);
    g->grad_holders = tg_compiler_calloc((size_t)g->cap_tensors, sizeof *g->grad_holders);
    if (!g->grad || !g->needs_grad || !g->grad_holders) return tg_graph_out_of_memory(g);
    for (int t = 0; t < g->n_tensors; t++) {
        g->grad[t] = -1;
        g->needs_grad[t] = (g->tensors[t].flags & TG_TENSOR_PARAM) != 0;
    }
    /* Forward dependence on trainable parameters, in schedule order (frozen parameters
     * need no gradient, so nothing below the lowest trainable one is differentiated). An
     * output depends on every input, except RESIDUAL_LAYERNORM's residual stream s = dropout(x)
     * + r and its row statistics, which do not depend on gamma and beta: a trainable LayerNorm
     * above frozen layers does not carry gradients down the residual stream. */
    for (int o = 0; o < n_forward; o++) {
        const tg_op *op = &g->ops[o];
        int any = 0;
        for (int s = 0; s < TG_OP_MAX_IN; s++) any |= op->in[s] >= 0 && g->needs_grad[op->in[s]];
        const int stream = op->kind == TG_OP_RESIDUAL_LAYERNORM && (g->needs_grad[op->in[0]] || g->needs_grad[op->in[1]]);
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (op->out[s] >= 0 && (op->kind == TG_OP_RESIDUAL_LAYERNORM && s > 0 ? stream : any))
                g->needs_grad[op->out[s]] = 1;
    }
    if (!g->needs_grad[loss]) return tg_graph_fail(g, "loss does not depend on any trainable parameter");
    if (tg_backward_index(g)) return -1;

    g->phase = TG_PHASE_BACKWARD;
    /* With grad_accumulation the optimizer phase clears the gradients after the update
     * instead (compiler/compile.c), so that the window's micro-steps add up. */
    if (!g->job || g->job->grad_accumulation <= 1) {
        tg_op_spec zero = tg_spec(TG_OP_ZERO);
        zero.out[0] = g->io.grads_all;
        tg_graph_op(g, &zero);
    }

    int seed = tg_ad_grad_like(g, loss);
    if (seed < 0) return -1; /* out of memory, already recorded */
    tg_op_spec fill = tg_spec(TG_OP_FILL);
    fill.out[0] = seed;
    fill.in[0] = g->io.loss_scale; /* fp16: the backward carries scale x the gradients; else -1 */
    /* The replicas' gradients are summed (TG_OP_ALL_REDUCE): the mean of their losses'
     * gradients, each loss a mean over its own batch (as PyTorch DDP). */
    fill.p.fill.value = g->job && g->job->data_parallel > 1 ? 1.0f / (float)g->job->data_parallel : 1.0f;
    tg_graph_op(g, &fill);
    g->grad[loss] = seed;
    g->grad_holders[seed]++;

    for (int o = n_forward - 1; o >= 0 && !g->failed; o--) {
        const tg_op *op = &g->ops[o];
        int has = 0;
        for (int s = 0; s < TG_OP_MAX_OUT; s++) has |= op->out[s] >= 0 && g->grad[op->out[s]] >= 0;
        if (!has) continue;
        tg_backward_rule rule = tg_backward_rule_of(op->kind);
        if (!rule) return tg_graph_fail(g, "op %s has no backward rule", tg_op_name(op->kind));
        rule(g, o);
    }
    return g->failed ? -1 : 0;
}
