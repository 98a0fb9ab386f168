/* Parameter gradients without clearing the whole gradient buffer every step. */
#ifndef TUNEGRAPH_GRAD_WRITES_H
#define TUNEGRAPH_GRAD_WRITES_H

#include "compiler/graph.h"

/* Rewrites the backward's ZERO of grads.all: the first op to write each gradient
 * overwrites it instead of adding to it where the op has that form (MATMUL accumulate = 0,
 * BIAS_GRAD overwrite = 1, the LayerNorm backwards' overwrite = 1), and ZERO ops over
 * views of the gradient buffer clear only what must still start at zero (ranges first
 * written by an op that can only add, such as an embedding table's scatter, and gradients
 * nothing writes). Bytes between gradients are never written and keep the executors'
 * zeroed allocation. Returns 0 or -1 (g->err). */
int tg_first_gradient_writes(tg_graph *g);

#endif
