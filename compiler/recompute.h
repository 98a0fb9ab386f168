/* Recomputation: forward results the backward computes again instead of keeping them from
 * the forward to the backward (job key recompute), trading a pass over them for their
 * memory. */
#ifndef TUNEGRAPH_RECOMPUTE_H
#define TUNEGRAPH_RECOMPUTE_H

#include "compiler/graph.h"

/* recompute = gelu: each MLP's GELU output (the separate GELU op's, or a GELU-epilogue
 * MATMUL's out0) that the backward reads (the second projection's weight gradient) is
 * made again in the backward, by a GELU op on the pre-activation (which the GELU backward
 * keeps anyway) placed right before its first backward reader, which then read the copy;
 * the forward's output dies in the forward. The same op on the same input gives the same
 * values, so training is unchanged bit for bit. After autodiff and the precision pass.
 * Returns 0 or -1 (g->err). */
int tg_recompute(tg_graph *g);

#endif
