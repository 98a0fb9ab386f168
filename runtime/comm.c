#include "runtime/comm.h"
#include "base/alloc.h"
#include "plan/op_meta.h"
#include "runtime/comm_mpi.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct tg_cpu_comm_group {
    int ranks;
    pthread_barrier_t barrier;
    float **bufs;    /* each rank's buffer during a collective */
    float **sums;    /* each rank's private result */
    int64_t *cap;    /* floats allocated in sums[r] */
    tg_comm_mpi *mpi; /* an MPI group (this process's rank): none of the above is used */
};

int tg_cpu_comm_group_create(tg_cpu_comm_group **out, int ranks, tg_err *err) {
    *out = NULL;
    if (ranks < 1) return tg_fail(err, "a communicator needs at least one rank (got %d)", ranks);
    tg_cpu_comm_group *g = tg_calloc(1, sizeof *g);
    if (!g) return tg_fail(err, "out of memory for a communicator of %d ranks", ranks);
    g->ranks = ranks;
    g->bufs = tg_calloc((size_t)ranks, sizeof *g->bufs);
    g->sums = tg_calloc((size_t)ranks, sizeof *g->sums);
    g->cap = tg_calloc((size_t)ranks, sizeof *g->cap);
    if (!g->bufs || !g->sums || !g->cap) {
        free(g->bufs), free(g->sums), free(g->cap), free(g);
        return tg_fail(err, "out of memory for a communicator of %d ranks", ranks);
    }
    /* glibc refuses only a count of 0 or past INT_MAX, which an int >= 1 never is. */
    if (pthread_barrier_init(&g->barrier, NULL, (unsigned)ranks)) { /* GCOVR_EXCL_BR_LINE: ranks in [1, INT_MAX] */
        free(g->bufs), free(g->sums), free(g->cap), free(g);
        return tg_fail(err, "cannot create a communicator for %d ranks", ranks);
    }
    *out = g;
    return 0;
}

int tg_cpu_comm_group_create_mpi(tg_cpu_comm_group **out, int rank, int ranks, double timeout_s, tg_err *err) {
    *out = NULL;
    tg_cpu_comm_group *g = tg_calloc(1, sizeof *g);
    if (!g) return tg_fail(err, "rank %d: out of memory for a communicator of %d ranks", rank, ranks);
    if (tg_comm_mpi_open(&g->mpi, rank, ranks, timeout_s, err)) {
        free(g);
        return -1;
    }
    g->ranks = ranks;
    *out = g;
    return 0;
}

int tg_cpu_comm_mpi_built(void) { return tg_comm_mpi_built(); }

const char *tg_cpu_comm_group_error(const tg_cpu_comm_group *g) { return g && g->mpi ? tg_comm_mpi_error(g->mpi) : ""; }

void tg_cpu_comm_group_destroy(tg_cpu_comm_group *g) {
    if (!g) return;
    if (g->mpi) {
        tg_comm_mpi_close(g->mpi);
        free(g);
        return;
    }
    pthread_barrier_destroy(&g->barrier);
    for (int r = 0; r < g->ranks; r++) free(g->sums[r]);
    free(g->bufs), free(g->sums), free(g->cap), free(g);
}

int tg_cpu_comm_group_ranks(const tg_cpu_comm_group *g) { return g ? g->ranks : 1; }

int tg_cpu_all_gather(tg_cpu_comm_group *g, int rank, void *buf, int64_t slice, size_t elem_size) {
    if (g && g->mpi) return tg_comm_mpi_all_gather(g->mpi, rank, buf, slice, elem_size);
    if (!g || g->ranks == 1 || slice <= 0) return 0;
    g->bufs[rank] = buf;
    pthread_barrier_wait(&g->barrier); /* every buffer published */
    /* Each rank writes only the others' slices of its own buffer and reads only their
     * owners' slices of theirs, which nobody writes during the gather. */
    const size_t bytes = (size_t)slice * elem_size;
    for (int r = 0; r < g->ranks; r++)
        if (r != rank) memcpy((uint8_t *)buf + (size_t)r * bytes, (const uint8_t *)g->bufs[r] + (size_t)r * bytes, bytes);
    pthread_barrier_wait(&g->barrier); /* every rank has read every buffer */
    return 0;
}

int tg_cpu_all_reduce_sum(tg_cpu_comm_group *g, int rank, float *buf, int64_t n) {
    if (g && g->mpi) return tg_comm_mpi_all_reduce_sum(g->mpi, rank, buf, n);
    if (!g || g->ranks == 1 || n <= 0) return 0;
    if (g->cap[rank] < n) {
        free(g->sums[rank]);
        g->sums[rank] = tg_malloc((size_t)n * sizeof(float));
        g->cap[rank] = g->sums[rank] ? n : 0;
    }
    /* A rank without room for its sum publishes no buffer: every rank sees that after the
     * first barrier and fails with it, after the second, so that none is left waiting in a
     * later collective the others never reach. */
    g->bufs[rank] = g->sums[rank] ? buf : NULL;
    pthread_barrier_wait(&g->barrier); /* every buffer published */
    int ready = 1;
    for (int r = 0; r < g->ranks; r++) ready &= g->bufs[r] != NULL;
    float *sum = g->sums[rank];
    if (ready) {
        memcpy(sum, g->bufs[0], (size_t)n * sizeof(float));
        for (int r = 1; r < g->ranks; r++) {
            const float *x = g->bufs[r];
            for (int64_t i = 0; i < n; i++) sum[i] += x[i];
        }
    }
    pthread_barrier_wait(&g->barrier); /* every rank has read every buffer */
    if (!ready) return -1;
    memcpy(buf, sum, (size_t)n * sizeof(float));
    return 0;
}

int tg_cpu_reduce_scatter_sum(tg_cpu_comm_group *g, int rank, float *buf, int64_t n, int64_t first, int64_t slice) {
    if (g && g->mpi) return tg_comm_mpi_reduce_scatter_sum(g->mpi, rank, buf, n, first, slice);
    if (!g || g->ranks == 1 || n <= 0) return 0;
    g->bufs[rank] = buf;
    pthread_barrier_wait(&g->barrier); /* every buffer published */
    /* Each rank writes only its own part of its own buffer, which no other rank reads:
     * every element is read from every buffer before it is written, in rank order. */
    int64_t lo, len;
    tg_slice_part(n, first, slice, rank, &lo, &len);
    for (int64_t i = lo; i < lo + len; i++) {
        float acc = g->bufs[0][i];
        for (int r = 1; r < g->ranks; r++) acc += g->bufs[r][i];
        buf[i] = acc;
    }
    pthread_barrier_wait(&g->barrier); /* every rank has read every buffer */
    return 0;
}
