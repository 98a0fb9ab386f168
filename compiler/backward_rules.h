/* The backward rule of each differentiable op kind: given forward op `index`, it emits
 * the ops that deliver the gradients of the op's inputs from those of its outputs
 * (compiler/grad_state.h). */
#ifndef TUNEGRAPH_BACKWARD_RULES_H
#define TUNEGRAPH_BACKWARD_RULES_H

#include "compiler/graph.h"

typedef void (*tg_backward_rule)(tg_graph *g, int index);
/* The rule of op kind `kind`; NULL for kinds without a gradient (backward and optimizer
 * ops, collectives) and for kinds outside the enum. */
tg_backward_rule tg_backward_rule_of(int kind);
/* Builds the forward indexes the rules read (graph.h); call once the forward schedule is
 * complete, before any rule. -1 (graph failed) when out of memory. */
int tg_backward_index(tg_graph *g);

#endif
