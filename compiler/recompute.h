/* Recomputation: forward results the backward computes again instead of keeping them from
 * the forward to the backward (job key recompute), trading a pass over them for their
 * memory. */
#ifndef TUNEGRAPH_RECOMPUTE_H
#define TUNEGRAPH_RECOMPUTE_H

#include "compiler/graph.h"

/* recompute = layers (job->recompute_layers: the first that many layers, 0 all): each
 * transformer layer's forward ops (a run of forward ops whose outputs name one layer,
 * tg_op_layer) run again in the backward, right before the first backward op that reads
 * what they make, into fresh tensors ("<name>.recomputed") that the layer's backward reads
 * instead of the forward's. Only what the backward needs is copied: the ops making the
 * intermediates it reads and the ops those depend on within the layer. What a later
 * forward op reads (the residual stream entering the next layer) is kept, and so is the
 * output of anything that is not a pure function of its inputs (losses, the masking op,
 * accumulating products) or that another op writes too; the copies read those as the
 * forward wrote them. Dropout copies keep their stream key and read the same step counter,
 * so they draw the forward's masks, and the copies compute exactly what the forward did:
 * training is bit for bit unchanged. The forward's intermediates die inside the forward,
 * which the memory planner's liveness turns into the saving. The GELU outputs outside the
 * recomputed layers are then made again as recompute = gelu does.
 *
 * recompute = gelu: each MLP's GELU output (the separate GELU op's, or a GELU-epilogue
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
