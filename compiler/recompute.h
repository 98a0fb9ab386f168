/* Recomputation: forward results the backward computes again instead of keeping them from
 * the forward to the backward (job key recompute), trading a pass over them for their
 * memory. */
#ifndef TUNEGRAPH_RECOMPUTE_H
#define TUNEGRAPH_RECOMPUTE_H

#include "compiler/graph.h"

/* recompute = gelu: each MLP's GELU output (the separate GELU op's, or a GELU-epilogue
 * MATMUL's out0) that the backward reads (the second projection's weight gradient) is
 * made again in the backward from the pre-activation, which the GELU backward keeps
 * anyway, and the backward's readers read the copy; the forward's output dies in the
 * forward. Where a GELU_BWD op reads that pre-activation, it writes the copy as its out2
 * (one more store in a pass that loads it already), and the reader moves to right after it
 * when it ran before; otherwise (the GELU epilogue's backward is a MATMUL's) a GELU op
 * makes the copy right before the first reader. GELU's expressions on the same input give
 * the same values, so a separate GELU trains bit for bit as before. After autodiff and
 * the precision pass, before the gradient writes are settled. Returns 0 or -1 (g->err). */
int tg_recompute(tg_graph *g);

#endif
