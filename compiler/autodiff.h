/* Reverse-mode differentiation of the forward schedule: the driver that runs each forward
 * op's backward rule (compiler/backward_rules.h) in reverse schedule order, over the
 * gradient bookkeeping of compiler/grad_state.h. */
#ifndef TUNEGRAPH_AUTODIFF_H
#define TUNEGRAPH_AUTODIFF_H

#include "compiler/backward_rules.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"

/* Marks needs_grad, then appends the backward phase (gradient zeroing, loss seed, every
 * rule in reverse schedule order) for scalar `loss`. */
int tg_autodiff(tg_graph *g, int loss);

#endif
