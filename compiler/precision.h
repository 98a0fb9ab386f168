/* Storage precision of a differentiated graph. fp32 plans are left as built. bf16 plans
 * follow mixed-precision training: fp32 master weights, gradients and optimizer state;
 * bf16 copies of the weights (refreshed by AdamW) feeding every matmul; bf16 activations
 * and activation gradients, except LayerNorm statistics, attention scores (the softmax
 * reads them in fp32) and scalars (the loss), which stay fp32. */
#ifndef TUNEGRAPH_PRECISION_H
#define TUNEGRAPH_PRECISION_H

#include "compiler/graph.h"

/* Runs after autodiff and the optimizer pass, before memory planning. */
int tg_apply_precision(tg_graph *g, int precision);

#endif
