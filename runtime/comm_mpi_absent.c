/* The MPI side of a build without MPI (the Makefile picks this file when pkg-config finds
 * no ompi-c, or with MPI=0): no MPI group can be opened, so the collectives are never
 * reached. */
#include "runtime/comm_mpi.h"

int tg_comm_mpi_built(void) { return 0; }

int tg_comm_mpi_open(tg_comm_mpi **m, int rank, int ranks, double timeout_s, tg_err *err) {
    *m = NULL;
    return tg_fail(err, "rank %d of %d: " TG_COMM_MPI_ABSENT, rank, ranks);
}

void tg_comm_mpi_close(tg_comm_mpi *m) {}

int tg_comm_mpi_all_reduce_sum(tg_comm_mpi *m, int rank, float *buf, int64_t n) { return -1; }

int tg_comm_mpi_reduce_scatter_sum(tg_comm_mpi *m, int rank, float *buf, int64_t n, int64_t first, int64_t slice) {
    return -1;
}

int tg_comm_mpi_all_gather(tg_comm_mpi *m, int rank, void *buf, int64_t slice, size_t elem_size) { return -1; }

const char *tg_comm_mpi_error(const tg_comm_mpi *m) { return TG_COMM_MPI_ABSENT; }
