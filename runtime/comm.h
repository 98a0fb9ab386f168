/* Communicators: how the data-parallel replicas of one job exchange gradients.
 *
 * A job with data_parallel = N runs N replicas (ranks 0..N-1) of the same plan, each on
 * its own batch; TG_OP_ALL_REDUCE sums a tensor over them in place, so every replica
 * applies the same update and the replicas stay equal. The CPU reference's communicator
 * joins N executors in one process (one thread each) through shared memory and adds the
 * ranks' buffers in rank order, so its sums are deterministic and the same on every
 * rank. With one process per rank, a group made by tg_cpu_comm_group_create_mpi joins
 * the processes of an MPI job instead (runtime/comm_mpi.c), with the same sums bit for bit.
 * The CUDA executor uses NCCL (runtime/cuda/). */
#ifndef TUNEGRAPH_COMM_H
#define TUNEGRAPH_COMM_H

#include <stdint.h>

#include "base/error.h"

/* N CPU ranks in one process (threads), or this process's rank of an MPI job. Every rank
 * must call each collective, in the same order, with the same sizes. */
typedef struct tg_cpu_comm_group tg_cpu_comm_group;

int tg_cpu_comm_group_create(tg_cpu_comm_group **g, int ranks, tg_err *err);
/* One rank of an MPI world (this process): MPI is initialised here if it is not yet
 * (MPI_Init_thread, MPI_THREAD_SERIALIZED: the collectives may run on another thread than
 * the one that created the group, one call at a time), and the world's rank and size must
 * equal `rank` and `ranks` (what the launcher's environment said), else refused naming
 * both. timeout_s (> 0): the watchdog; a collective (or the group's creation) not complete
 * after timeout_s seconds prints on stderr which ranks it waited for and aborts the whole
 * MPI job (MPI_Abort; while MPI starts, which waits for every rank, the process exits and
 * mpirun ends the rest), so that no rank is left waiting. A build without MPI refuses,
 * saying so. Not again after the last MPI group was destroyed (MPI cannot restart). */
int tg_cpu_comm_group_create_mpi(tg_cpu_comm_group **g, int rank, int ranks, double timeout_s, tg_err *err);
/* Whether this build has MPI (tg_cpu_comm_group_create_mpi can succeed). */
int tg_cpu_comm_mpi_built(void);
/* Frees the group; the last MPI group finalizes MPI when this module initialised it. */
void tg_cpu_comm_group_destroy(tg_cpu_comm_group *g);
int tg_cpu_comm_group_ranks(const tg_cpu_comm_group *g);
/* Why an MPI group's last collective failed, naming the rank ("" when none did, and for a
 * group of threads, whose only failure is out of memory). The message is also printed on
 * stderr; the executor names it as the failing op's reason (runtime/cpu/cpu_exec.c). */
const char *tg_cpu_comm_group_error(const tg_cpu_comm_group *g);

/* buf[0..n) = the sum over ranks of each rank's buf, added in rank order (rank 0's
 * value, plus rank 1's, ...), on every rank. Blocks until every rank has called it.
 * 0, or -1 on every rank (every buf as it was) when any rank had no memory for its sum.
 * An MPI group also fails (-1, tg_cpu_comm_group_error says why) on an MPI error, on a
 * `rank` other than this process's, and from then on; buf is then undefined. */
int tg_cpu_all_reduce_sum(tg_cpu_comm_group *g, int rank, float *buf, int64_t n);

/* ZeRO-1's reduce-scatter (plan/ops.def REDUCE_SCATTER): buf[0..n) views a buffer from its
 * element `first`; on each rank, the elements of its slice of that buffer (rank r's:
 * [r * slice, (r + 1) * slice), tg_slice_part) become the sum over ranks in rank order, as
 * tg_cpu_all_reduce_sum leaves them, and the others keep this rank's values. Blocks until
 * every rank has called it. 0, or -1 as tg_cpu_all_reduce_sum fails on an MPI group
 * (threads never fail: each rank adds its part in place). */
int tg_cpu_reduce_scatter_sum(tg_cpu_comm_group *g, int rank, float *buf, int64_t n, int64_t first, int64_t slice);

/* buf holds ranks slices of `slice` elements of elem_size bytes; every rank's slice r
 * becomes rank r's (in place), on every rank. Blocks until every rank has called it.
 * 0, or -1 as tg_cpu_all_reduce_sum fails on an MPI group (threads never fail). */
int tg_cpu_all_gather(tg_cpu_comm_group *g, int rank, void *buf, int64_t slice, size_t elem_size);

#endif
