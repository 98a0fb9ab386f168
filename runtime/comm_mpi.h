/* The MPI side of the CPU communicator (runtime/comm.h), for runtime/comm.c alone: one
 * process per rank. runtime/comm_mpi.c implements it over MPI; a build without MPI links
 * runtime/comm_mpi_absent.c in its place, which refuses to open. */
#ifndef TUNEGRAPH_COMM_MPI_H
#define TUNEGRAPH_COMM_MPI_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct tg_comm_mpi tg_comm_mpi;

int tg_comm_mpi_built(void);
int tg_comm_mpi_open(tg_comm_mpi **m, int rank, int ranks, double timeout_s, tg_err *err);
void tg_comm_mpi_close(tg_comm_mpi *m);
/* As tg_cpu_all_reduce_sum and tg_cpu_all_gather, `rank` being this process's. */
int tg_comm_mpi_all_reduce_sum(tg_comm_mpi *m, int rank, float *buf, int64_t n);
int tg_comm_mpi_all_gather(tg_comm_mpi *m, int rank, void *buf, int64_t slice, size_t elem_size);
/* As tg_cpu_reduce_scatter_sum. */
int tg_comm_mpi_reduce_scatter_sum(tg_comm_mpi *m, int rank, float *buf, int64_t n, int64_t first, int64_t slice);

const char *tg_comm_mpi_error(const tg_comm_mpi *m);

/* The message of a build without MPI, for the stub and its test. */
#define TG_COMM_MPI_ABSENT "this build of tunegraph has no MPI, which one process per rank needs: install libopenmpi-dev and rebuild"

#endif
