/* Reverse-mode differentiation of the forward schedule. Backward rules (op_table.c) use
 * these helpers to find output gradients and to deliver input gradients under the
 * gradient contract: parameter gradients accumulate (+=) into the grads pool;
 * activation gradients are written (=) into fresh tensors and summed with ADD when a
 * tensor feeds several ops, except where a matmul can accumulate into the sum. */
#ifndef TUNEGRAPH_AUTODIFF_H
#define TUNEGRAPH_AUTODIFF_H

#include "compiler/graph.h"

/* A spec with every tensor slot -1 and every parameter 0. */
tg_op_spec tg_spec(int kind);

/* Gradient of forward tensor t, or -1 when nothing downstream produced one. */
int tg_ad_grad_of(tg_graph *g, int t);
/* Where a contribution to t's gradient goes: the parameter's gradient (with *accumulate
 * = 1), a fresh activation tensor (*accumulate = 0), or -1 when t needs no gradient. */
int tg_ad_grad_dest(tg_graph *g, int t, int *accumulate);
/* Records dest (from tg_ad_grad_dest) as a contribution to t's gradient. */
void tg_ad_commit(tg_graph *g, int t, int dest);
/* Records an existing tensor as t's gradient contribution without a copy (ADD's rule). */
void tg_ad_pass(tg_graph *g, int t, int grad);
/* t's gradient so far, when the next contribution may be accumulated into it in place
 * (an op writing it with +=, e.g. MATMUL i[6]) instead of going through a fresh tensor and
 * an ADD: an activation-pool tensor that is not a parameter gradient nor a view, and no
 * other tensor's gradient (tg_ad_pass may have handed it to several). The ops emitted
 * before read it as it was, those after read the sum: emission order is schedule order,
 * and the planner's lifetimes cover the read-modify-write. -1 when there is none. */
int tg_ad_grad_accumulable(tg_graph *g, int t);
/* A new fp32 activation for a backward op's own output (not a gradient, e.g. a row
 * statistic), with the per-tensor autodiff state extended to it. -1 after failure. */
int tg_ad_activation(tg_graph *g, const char *name, int ndim, const int64_t *shape);

/* Marks needs_grad, then appends the backward phase (gradient zeroing, loss seed, every
 * rule in reverse schedule order) for scalar `loss`. */
int tg_autodiff(tg_graph *g, int loss);

#endif
