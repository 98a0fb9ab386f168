/* The gradient bookkeeping of reverse-mode differentiation, which the backward rules
 * (compiler/backward_rules.c) use to find output gradients and to deliver input gradients
 * under the gradient contract: parameter gradients accumulate (+=) into the grads pool;
 * activation gradients are written (=) into fresh tensors and summed with ADD when a
 * tensor feeds several ops, except where a matmul can accumulate into the sum. */
#ifndef TUNEGRAPH_GRAD_STATE_H
#define TUNEGRAPH_GRAD_STATE_H

#include "compiler/graph.h"

/* A spec with every tensor slot -1 and every parameter 0. */
tg_op_spec tg_spec(int kind);

/* Gradient of forward tensor t, or -1 when nothing downstream produced one. */
int tg_ad_grad_of(tg_graph *g, int t);
/* Where a contribution to t's gradient goes: the parameter's gradient (with *accumulate
 * = 1), a fresh activation tensor (*accumulate = 0), or -1 when t needs no gradient. */
int tg_ad_grad_dest(tg_graph *g, int t, int *accumulate);
/* For an op that writes several gradients in one pass (the LayerNorm backwards' dx, dgamma
 * and dbeta; the attention backward's dq, dk and dv): tg_ad_grad_dest's answer when t needs a
 * gradient, else a scratch activation shaped like t ("scratch.d.<t's name>", *scratch = 1)
 * that takes the output nothing reads: a frozen gamma's, an input's below the lowest
 * trainable parameter. Not t's gradient: never commit it. -1 only after failure. */
int tg_ad_grad_dest_or_scratch(tg_graph *g, int t, int *accumulate, int *scratch);
/* Records dest (from tg_ad_grad_dest) as a contribution to t's gradient. */
void tg_ad_commit(tg_graph *g, int t, int dest);
/* Records an existing tensor as t's gradient contribution without a copy (ADD's rule). */
void tg_ad_pass(tg_graph *g, int t, int grad);
/* t's gradient so far, when the next contribution may be accumulated into it in place
 * (an op writing it with +=, e.g. MATMUL accumulate) instead of going through a fresh
 * tensor and an ADD: an activation-pool tensor that is not a parameter gradient nor a
 * view, and no other tensor's gradient (tg_ad_pass may have handed it to several). The
 * ops emitted before read it as it was, those after read the sum: emission order is
 * schedule order, and the planner's lifetimes cover the read-modify-write. -1 when there
 * is none. */
int tg_ad_grad_accumulable(tg_graph *g, int t);
/* A new fp32 activation for a backward op's own output (not a gradient, e.g. a row
 * statistic), with the per-tensor autodiff state extended to it. -1 after failure. */
int tg_ad_activation(tg_graph *g, const char *name, int ndim, const int64_t *shape);
/* A fresh activation shaped like t and named "d.<t's name>": a tensor for t's gradient. */
int tg_ad_grad_like(tg_graph *g, int t);

#endif
