/* Data parallelism: the gradient sum in buckets, each as soon as its gradients are final. */
#ifndef TUNEGRAPH_GRAD_BUCKETS_H
#define TUNEGRAPH_GRAD_BUCKETS_H

#include "compiler/graph.h"

/* For a job with data_parallel > 1 and grad_accumulation > 1: one TG_OP_ALL_REDUCE of the
 * whole gradient buffer, first in the optimizer phase (the window's last micro-step
 * completes the gradients). Otherwise: one TG_OP_ALL_REDUCE per bucket of the gradient
 * buffer, placed in the backward right after the last op that writes any gradient in it,
 * so that an executor can sum a bucket while the backward goes on (buckets of about the
 * job's grad_bucket_mb, fewer on small models; the gradients below the last boundary,
 * final only when the backward ends, form the last). The buckets tile the buffer. Run
 * after every gradient writer is in place. Returns 0 or -1 (g->err). */
int tg_gradient_buckets(tg_graph *g);

/* Data parallelism, before tg_gradient_buckets: the embedding table whose gradient starts
 * the gradient buffer (BERT's and RoBERTa's word embeddings), when nothing but its
 * EMBEDDING_BWD writes that gradient (not tied to an output layer) and gathering the
 * rows moves fewer bytes than summing the table (replicas x rows x (dim + 1) elements
 * against twice the table): two ALL_GATHERs give every replica every replica's ids and
 * output gradient rows, in replica order, and the EMBEDDING_BWD scatters all of them, so
 * each replica computes the summed table gradient itself and the buckets leave it out
 * (g->grads_summed_from). Returns 0 or -1 (g->err). */
int tg_gather_embedding_grads(tg_graph *g);

/* ZeRO-1: appends the TG_OP_ALL_GATHER that shares every replica's updated slice
 * (tg_zero_slice) of the pool of the whole-pool view `all` (params.all or
 * params_bf16.all), over a new view `name` of data_parallel slices from offset 0.
 * Returns 0 or -1 (g->err). */
int tg_zero_gather(tg_graph *g, int all, const char *name);

#endif
