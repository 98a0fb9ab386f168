/* Communicators: how the data-parallel replicas of one job exchange gradients.
 *
 * A job with data_parallel = N runs N replicas (ranks 0..N-1) of the same plan, each on
 * its own batch; TG_OP_ALL_REDUCE sums a tensor over them in place, so every replica
 * applies the same update and the replicas stay equal. The CPU reference's communicator
 * joins N executors in one process (one thread each) through shared memory and adds the
 * ranks' buffers in rank order, so its sums are deterministic and the same on every
 * rank. The CUDA executor uses NCCL (runtime/cuda/). */
#ifndef TUNEGRAPH_COMM_H
#define TUNEGRAPH_COMM_H

#include <stdint.h>

#include "base/error.h"

/* N CPU ranks in one process. Every rank must call each collective, in the same order. */
typedef struct tg_cpu_comm_group tg_cpu_comm_group;

int tg_cpu_comm_group_create(tg_cpu_comm_group **g, int ranks, tg_err *err);
void tg_cpu_comm_group_destroy(tg_cpu_comm_group *g);
int tg_cpu_comm_group_ranks(const tg_cpu_comm_group *g);

/* buf[0..n) = the sum over ranks of each rank's buf, added in rank order (rank 0's
 * value, plus rank 1's, ...), on every rank. Blocks until every rank has called it.
 * 0, or -1 on every rank (every buf as it was) when any rank had no memory for its sum. */
int tg_cpu_all_reduce_sum(tg_cpu_comm_group *g, int rank, float *buf, int64_t n);

/* buf holds ranks slices of `slice` elements of elem_size bytes; every rank's slice r
 * becomes rank r's (in place), on every rank. Blocks until every rank has called it. */
void tg_cpu_all_gather(tg_cpu_comm_group *g, int rank, void *buf, int64_t slice, size_t elem_size);

#endif
