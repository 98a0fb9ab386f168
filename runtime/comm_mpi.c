/* The CPU communicator across processes (runtime/comm.h's MPI group): this process is one
 * rank of an MPI job, and the collectives go through point-to-point messages on a duplicate
 * of MPI_COMM_WORLD that returns its errors instead of aborting.
 *
 * The sum must equal the threads' one bit for bit: element i is ((b0 + b1) + b2) + ... in
 * float, in rank order. MPI_Allreduce does not promise that association (not even with a
 * non-commutative op), so the sum is written out: a reduce-scatter by parts (rank r
 * receives part r of every rank's buffer and adds them in rank order), then every rank
 * sends its summed part to every other.
 *
 * Nothing waits blindly: every transfer is nonblocking and polled (MPI_Testsome, with naps
 * that grow while nothing arrives) until it is done or timeout_s has passed; then the rank
 * names the ranks whose messages never came and aborts the job, so none is left running. */
#include "runtime/comm_mpi.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "plan/op_meta.h"

/* One tag per kind of message: a fast rank's next collective cannot match this one's. */
enum { TAG_READY = 1, TAG_SCATTER, TAG_GATHER, TAG_SLICES };

/* An MPI count is an int: a message past INT_MAX bytes goes as whole blocks of this many
 * bytes (one derived type) plus a tail of the rest. */
#define BLOCK_BYTES ((size_t)1 << 20)

/* The wait: polled without a pause this long (a collective whose ranks arrive together
 * ends within it), then with naps from NAP_MIN_NS growing by half up to NAP_MAX_NS, back to
 * the shortest whenever a message completes (a large transfer moves only while polled). */
#define SPIN_S 100e-6
#define NAP_MIN_NS 50000L
#define NAP_MAX_NS 2000000L

/* Sums are added in blocks of this many floats, held in a stack buffer: every rank's part
 * of a block is read while it is in cache. */
enum { SUM_BLOCK = 2048 };

typedef struct transfer {
    int peer, recv;
    MPI_Datatype type;
    int count; /* of type: what a receive must bring */
} transfer;

struct tg_comm_mpi {
    MPI_Comm comm;       /* MPI_COMM_WORLD duplicated, with MPI_ERRORS_RETURN */
    MPI_Datatype block;  /* BLOCK_BYTES bytes */
    int rank, ranks;
    double timeout_s;
    double began;        /* when the collective under way started: the watchdog's clock */
    /* One collective's messages: at most two (blocks, tail) to and from each other rank. */
    MPI_Request *req;
    transfer *xfer;
    int *index;
    MPI_Status *status;
    const float **src;   /* each rank's part of the sum */
    int64_t *part_lo, *part_len; /* the collective's parts: rank r sums [part_lo[r], + part_len[r]) */
    int *ready;          /* each rank's answer: has it room for the sum's scratch? */
    int ready_mine;
    float *scratch;      /* the other ranks' parts, (ranks - 1) x part */
    int64_t cap;         /* floats in scratch */
    int64_t agreed;      /* floats of scratch every rank is known to hold: the same on all */
    int broken;          /* an MPI error: every later collective fails */
    char error[768];
};

/* MPI is per process: how many groups are open, and whether this module started MPI (the
 * last group to close finalizes it then). */
static int live_groups, initialised_here;

int tg_comm_mpi_built(void) { return 1; }

const char *tg_comm_mpi_error(const tg_comm_mpi *m) { return m->error; }

/* Keeps the message (prefixed by the rank), prints it on stderr, returns -1. */
__attribute__((format(printf, 2, 3))) static int failed(tg_comm_mpi *m, const char *fmt, ...) {
    int k = snprintf(m->error, sizeof m->error, "rank %d: ", m->rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->error + k, sizeof m->error - (size_t)k, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", m->error);
    fflush(stderr);
    return -1;
}

static const char *mpi_text(int rc, char *s) {
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, MPI_MAX_ERROR_STRING, "MPI error %d", rc);
    return s;
}

/* Drops requests [0, n) still pending (after an error: nothing will wait for them). */
static void drop_pending(tg_comm_mpi *m, int n) {
    for (int k = 0; k < n; k++)
        if (m->req[k] != MPI_REQUEST_NULL) {
            if (m->xfer[k].recv) MPI_Cancel(&m->req[k]);
            MPI_Request_free(&m->req[k]);
        }
}

/* An MPI call of a collective failed: the group is unusable from now on (its messages are
 * out of step with the other ranks'). */
static int mpi_failed(tg_comm_mpi *m, int n, const char *what, const char *call, int peer, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    drop_pending(m, n);
    m->broken = 1;
    return failed(m, "%s: %s with rank %d failed: %s", what, call, peer, mpi_text(rc, s));
}

/* Posts a send or receive of `bytes` bytes with rank `peer` as requests from *n on. */
static int post(tg_comm_mpi *m, int *n, int recv, void *p, size_t bytes, int peer, int tag, const char *what) {
    const size_t blocks = bytes > INT_MAX ? bytes / BLOCK_BYTES : 0, tail = bytes - blocks * BLOCK_BYTES;
    if (blocks > INT_MAX) {
        drop_pending(m, *n);
        m->broken = 1;
        return failed(m, "%s: %zu bytes for rank %d is more than one message can carry", what, bytes, peer);
    }
    for (int part = 0; part < 2; part++) {
        const int count = (int)(part ? tail : blocks);
        if (!count) continue;
        MPI_Datatype type = part ? MPI_BYTE : m->block;
        void *at = (uint8_t *)p + (part ? blocks * BLOCK_BYTES : 0);
        const int rc = recv ? MPI_Irecv(at, count, type, peer, tag, m->comm, &m->req[*n])
                            : MPI_Isend(at, count, type, peer, tag, m->comm, &m->req[*n]);
        if (rc != MPI_SUCCESS) return mpi_failed(m, *n, what, recv ? "MPI_Irecv" : "MPI_Isend", peer, rc);
        m->xfer[(*n)++] = (transfer){peer, recv, type, count};
    }
    return 0;
}

/* Appends ", r" (or "r" first) to the list out[0..*len) of room `size`. */
static void add_rank(char *out, size_t size, size_t *len, size_t first, int r) {
    if (*len < size) *len += (size_t)snprintf(out + *len, size - *len, "%s%d", *len > first ? ", " : "", r);
}

/* Whom requests [0, n) still wait for: "rank(s) ..." of their receives' senders, else (all
 * received) of their sends' receivers; "the other ranks" when no rank is known (the group's
 * creation). */
static void pending_ranks(const tg_comm_mpi *m, int n, char *out, size_t size) {
    size_t len = (size_t)snprintf(out, size, "rank(s) ");
    const size_t first = len;
    for (int recv = 1; recv >= 0 && len == first; recv--)
        for (int r = 0; r < m->ranks; r++) {
            int waits = 0;
            for (int k = 0; k < n; k++) waits |= m->req[k] != MPI_REQUEST_NULL && m->xfer[k].recv == recv && m->xfer[k].peer == r;
            if (waits) add_rank(out, size, &len, first, r);
        }
    if (len == first) snprintf(out, size, "the other ranks");
}

/* The watchdog's end: the rank says what it waited for, and the whole job stops. */
__attribute__((noreturn)) static void give_up(tg_comm_mpi *m, int n, const char *what, double waited) {
    char who[256];
    pending_ranks(m, n, who, sizeof who);
    failed(m, "%s has waited %.1f s for %s (TUNEGRAPH_STEP_TIMEOUT_S): a rank stopped or died; aborting", what,
           waited, who);
    MPI_Abort(MPI_COMM_WORLD, 1);
    abort(); /* MPI_Abort does not return */
}

/* Waits for requests [0, n) under the watchdog, whose clock started with the collective;
 * checks that each receive brought what was posted for (a rank that disagrees on a size
 * sends another length). */
static int wait_all(tg_comm_mpi *m, int n, const char *what) {
    const double spin_until = tg_wall_s() + SPIN_S;
    long nap = NAP_MIN_NS;
    for (int left = n; left > 0;) {
        int done = 0;
        const int rc = MPI_Testsome(n, m->req, &done, m->index, m->status);
        if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) return mpi_failed(m, n, what, "MPI_Testsome", -1, rc);
        if (done == MPI_UNDEFINED) break;
        for (int i = 0; i < done; i++) {
            const transfer *t = &m->xfer[m->index[i]];
            const int error = rc == MPI_ERR_IN_STATUS ? m->status[i].MPI_ERROR : MPI_SUCCESS;
            int class = MPI_SUCCESS;
            if (error != MPI_SUCCESS && MPI_Error_class(error, &class) == MPI_SUCCESS && class == MPI_ERR_TRUNCATE)
                return mpi_failed(m, n, what, "a receive (longer than due: the ranks disagree on the size)", t->peer, error);
            if (error != MPI_SUCCESS) return mpi_failed(m, n, what, t->recv ? "a receive" : "a send", t->peer, error);
            int got = t->count;
            if (t->recv && (MPI_Get_count(&m->status[i], t->type, &got) != MPI_SUCCESS || got != t->count)) {
                drop_pending(m, n);
                m->broken = 1;
                return failed(m, "%s: rank %d sent %d %s where %d were due: the ranks disagree on the size", what,
                              t->peer, got, t->type == MPI_BYTE ? "bytes" : "blocks", t->count);
            }
        }
        left -= done;
        if (done) {
            nap = NAP_MIN_NS;
            continue;
        }
        const double now = tg_wall_s();
        if (now - m->began > m->timeout_s) give_up(m, n, what, now - m->began);
        if (now < spin_until) continue;
        nanosleep(&(struct timespec){0, nap}, NULL);
        nap = nap + nap / 2 < NAP_MAX_NS ? nap + nap / 2 : NAP_MAX_NS;
    }
    return 0;
}

/* A collective's common checks: the caller's rank, a broken group. */
static int start(tg_comm_mpi *m, int rank) {
    if (m->broken) return -1; /* the error that broke it stays */
    m->error[0] = 0;
    m->began = tg_wall_s();
    if (rank != m->rank)
        return failed(m, "a collective was called as rank %d, but this process is rank %d of %d", rank, m->rank,
                      m->ranks);
    return 0;
}

/* Every rank must hold `need` floats of scratch before any sends: those that could
 * allocate say so to all the others, and all fail together (buffers untouched) when any
 * could not, so that none is left waiting for a sum another gave up. Only a sum larger than
 * every earlier one asks; `agreed` then grows the same way on every rank. */
static int agree_scratch(tg_comm_mpi *m, int64_t need, int64_t n) {
    if (m->cap < need) {
        float *s = (uint64_t)need <= SIZE_MAX / sizeof(float) ? tg_malloc((size_t)need * sizeof(float)) : NULL;
        if (s) free(m->scratch), m->scratch = s, m->cap = need;
    }
    m->ready_mine = m->cap >= need;
    int nreq = 0;
    for (int r = 0; r < m->ranks; r++)
        if (r != m->rank && post(m, &nreq, 1, &m->ready[r], sizeof(int), r, TAG_READY, "the gradient sum")) return -1;
    for (int r = 0; r < m->ranks; r++)
        if (r != m->rank && post(m, &nreq, 0, &m->ready_mine, sizeof(int), r, TAG_READY, "the gradient sum"))
            return -1;
    if (wait_all(m, nreq, "the gradient sum")) return -1;
    m->ready[m->rank] = m->ready_mine;
    char who[256] = "";
    size_t len = 0;
    for (int r = 0; r < m->ranks; r++)
        if (!m->ready[r]) add_rank(who, sizeof who, &len, 0, r);
    if (!len) {
        m->agreed = need;
        return 0;
    }
    return failed(m, "the gradient sum of %lld floats needs %lld floats of scratch on every rank: out of memory on rank(s) %s",
                  (long long)n, (long long)need, who);
}

/* out[i] for i in [0, len) = the ranks' parts src[0..ranks) added in rank order; out may
 * be one of them (a block is read whole before it is written). */
static void sum_in_rank_order(float *out, const float *const *src, int ranks, int64_t len) {
    float acc[SUM_BLOCK];
    for (int64_t i = 0; i < len; i += SUM_BLOCK) {
        const int64_t b = len - i < SUM_BLOCK ? len - i : SUM_BLOCK;
        memcpy(acc, src[0] + i, (size_t)b * sizeof(float));
        for (int r = 1; r < ranks; r++) {
            const float *x = src[r] + i;
            for (int64_t j = 0; j < b; j++) acc[j] += x[j];
        }
        memcpy(out + i, acc, (size_t)b * sizeof(float));
    }
}

/* The reduce-scatter by parts (m->part_lo, m->part_len, which every rank computed alike):
 * rank r receives part r of every other rank's buf and adds them in rank order into its
 * own buf's part r; the other elements of buf stay as they were. */
static int reduce_parts(tg_comm_mpi *m, float *buf, int64_t n, const char *what) {
    const int ranks = m->ranks, me = m->rank;
    int64_t longest = 0;
    for (int r = 0; r < ranks; r++) longest = m->part_len[r] > longest ? m->part_len[r] : longest;
    const int64_t need = (ranks - 1) * longest;
    if (need > m->agreed && agree_scratch(m, need, n)) return -1;
    const size_t mine = (size_t)m->part_len[me] * sizeof(float);
    int nreq = 0;
    for (int r = 0; r < ranks; r++) {
        if (r == me) continue;
        m->src[r] = m->scratch + (r < me ? r : r - 1) * longest;
        if (post(m, &nreq, 1, (void *)m->src[r], mine, r, TAG_SCATTER, what)) return -1;
    }
    for (int r = 0; r < ranks; r++)
        if (r != me && post(m, &nreq, 0, buf + m->part_lo[r], (size_t)m->part_len[r] * sizeof(float), r, TAG_SCATTER, what))
            return -1;
    if (wait_all(m, nreq, what)) return -1;
    m->src[me] = buf + m->part_lo[me];
    sum_in_rank_order(buf + m->part_lo[me], m->src, ranks, m->part_len[me]);
    return 0;
}

/* Which algorithm: this reduce-scatter by parts and all-gather, or rank 0 gathering every
 * buffer, adding them in rank order and broadcasting the sum (the other way to keep the
 * order). Measured 2026-11-27 on a quiet shared 2-core x86 host, Open MPI 4.1 over shared
 * memory (vader), 4 ranks oversubscribing the 2 cores; ms of the slowest rank, median of
 * 41 / 11 / 5 runs (tests/mpi/mpi_comm_check.c bench; MPI_Allreduce, whose order is its
 * own, for scale):
 *     floats  ranks   parts  gather+bcast  MPI_Allreduce
 *      1e3      2     0.003     0.003         0.002
 *      1e6      2     3.0       3.9           2.1
 *      3e7      2    67        115            96
 *      1e3      4     0.027     0.023         0.021
 *      1e6      4     5.9      10.9           4.9
 *      3e7      4   155        331           307
 * The parts win wherever the time is worth having (gradient buckets are megabytes): each
 * rank adds 1/ranks of the sum and sends 2 (ranks - 1)/ranks of its buffer, where rank 0
 * alone adds it all and sends the whole sum to every rank. At a thousand floats on 4 ranks
 * the gather is 4 us faster, not worth a second path. */
int tg_comm_mpi_all_reduce_sum(tg_comm_mpi *m, int rank, float *buf, int64_t n) {
    if (start(m, rank)) return -1;
    const int ranks = m->ranks, me = m->rank;
    if (ranks == 1 || n <= 0) return 0;
    /* Parts of n / ranks floats, the first n % ranks one longer. */
    for (int r = 0; r < ranks; r++) {
        m->part_lo[r] = n / ranks * r + (r < n % ranks ? r : n % ranks);
        m->part_len[r] = n / ranks + (r < n % ranks);
    }
    const char *what = "the gradient sum";
    if (reduce_parts(m, buf, n, what)) return -1;
    int nreq = 0;
    for (int r = 0; r < ranks; r++)
        if (r != me && post(m, &nreq, 1, buf + m->part_lo[r], (size_t)m->part_len[r] * sizeof(float), r, TAG_GATHER, what))
            return -1;
    for (int r = 0; r < ranks; r++)
        if (r != me && post(m, &nreq, 0, buf + m->part_lo[me], (size_t)m->part_len[me] * sizeof(float), r, TAG_GATHER, what))
            return -1;
    return wait_all(m, nreq, what);
}

int tg_comm_mpi_reduce_scatter_sum(tg_comm_mpi *m, int rank, float *buf, int64_t n, int64_t first, int64_t slice) {
    if (start(m, rank)) return -1;
    if (m->ranks == 1 || n <= 0) return 0;
    for (int r = 0; r < m->ranks; r++) tg_slice_part(n, first, slice, r, &m->part_lo[r], &m->part_len[r]);
    return reduce_parts(m, buf, n, "the gradient sum of the slices");
}

int tg_comm_mpi_all_gather(tg_comm_mpi *m, int rank, void *buf, int64_t slice, size_t elem_size) {
    if (start(m, rank)) return -1;
    const int ranks = m->ranks, me = m->rank;
    if (ranks == 1 || slice <= 0 || !elem_size) return 0;
    const char *what = "the gather of slices";
    if ((uint64_t)slice > SIZE_MAX / elem_size / (size_t)ranks)
        return failed(m, "%s: %lld slices of %lld elements of %zu bytes overflow the address space", what,
                      (long long)ranks, (long long)slice, elem_size);
    const size_t bytes = (size_t)slice * elem_size;
    uint8_t *p = buf;
    int nreq = 0;
    for (int r = 0; r < ranks; r++)
        if (r != me && post(m, &nreq, 1, p + (size_t)r * bytes, bytes, r, TAG_SLICES, what)) return -1;
    for (int r = 0; r < ranks; r++)
        if (r != me && post(m, &nreq, 0, p + (size_t)me * bytes, bytes, r, TAG_SLICES, what)) return -1;
    return wait_all(m, nreq, what);
}

/* Finalizes MPI when this module started it and no group is left. */
static void release_mpi(void) {
    if (live_groups || !initialised_here) return;
    initialised_here = 0;
    MPI_Finalize();
}

static void free_group(tg_comm_mpi *m) {
    free(m->req), free(m->xfer), free(m->index), free(m->status), free(m->src), free(m->ready), free(m->scratch);
    free(m->part_lo), free(m->part_len);
    free(m);
}

/* MPI_Init_thread waits for every rank of the job (Open MPI exchanges their addresses
 * there), where no request can be polled: a thread gives it timeout_s, then says so and
 * ends the process (MPI_Abort needs MPI up), and mpirun ends the others. */
typedef struct init_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rank;
    double timeout_s;
} init_watch;

static void *watch_init(void *arg) {
    init_watch *w = arg;
    const double began = tg_wall_s();
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    const double whole = w->timeout_s < 1e15 ? (double)(long long)w->timeout_s : 1e15; /* past that: never */
    until.tv_sec += (time_t)whole;
    until.tv_nsec += w->timeout_s < 1e15 ? (long)((w->timeout_s - whole) * 1e9) : 0;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&w->mu);
    while (!w->done && pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT) {}
    const int done = w->done;
    pthread_mutex_unlock(&w->mu);
    if (done) return NULL;
    fprintf(stderr, "rank %d: starting MPI has waited %.1f s for the other ranks (TUNEGRAPH_STEP_TIMEOUT_S): a rank "
                    "stopped or died; aborting\n", w->rank, tg_wall_s() - began);
    fflush(stderr);
    _exit(1);
}

/* MPI_Init_thread under the watch (without it where no thread can start). */
static int init_mpi(int rank, double timeout_s) {
    init_watch w = {.rank = rank, .timeout_s = timeout_s};
    pthread_condattr_t attr;
    pthread_t th;
    pthread_mutex_init(&w.mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &attr);
    pthread_condattr_destroy(&attr);
    const int watched = pthread_create(&th, NULL, watch_init, &w) == 0;
    int provided = 0;
    /* SERIALIZED: the group may be created on one thread and used on another. A failure
     * here aborts (MPI_COMM_WORLD's errors are fatal until then). */
    const int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (watched) {
        pthread_mutex_lock(&w.mu);
        w.done = 1;
        pthread_cond_signal(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(th, NULL);
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return rc;
}

int tg_comm_mpi_open(tg_comm_mpi **out, int rank, int ranks, double timeout_s, tg_err *err) {
    *out = NULL;
    if (ranks < 1 || rank < 0 || rank >= ranks)
        return tg_fail(err, "rank %d of %d: an MPI communicator needs a rank from 0 to the ranks less one", rank, ranks);
    if (!(timeout_s > 0))
        return tg_fail(err, "rank %d of %d: the collectives' timeout must be a number of seconds above 0, got %g", rank,
                       ranks, timeout_s);
    int up = 0, down = 0;
    MPI_Finalized(&down);
    if (down)
        return tg_fail(err, "rank %d of %d: MPI was finalized in this process (its last MPI group was destroyed) and "
                       "cannot start again", rank, ranks);
    MPI_Initialized(&up);
    if (!up) {
        if (init_mpi(rank, timeout_s) != MPI_SUCCESS)                                /* GCOVR_EXCL_BR_LINE */
            return tg_fail(err, "rank %d of %d: MPI_Init_thread failed", rank, ranks); /* GCOVR_EXCL_LINE */
        initialised_here = 1;
    }
    int world_rank = -1, world_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (world_rank != rank || world_size != ranks) {
        release_mpi();
        return tg_fail(err,
                       "rank %d of %d (the launcher's environment) is rank %d of %d in the MPI job (MPI_COMM_WORLD): "
                       "they must agree; start one process per rank with mpirun -np %d",
                       rank, ranks, world_rank, world_size, ranks);
    }
    tg_comm_mpi *m = tg_calloc(1, sizeof *m);
    const int max_req = 4 * ranks;
    if (m) {
        m->req = tg_calloc((size_t)max_req, sizeof *m->req);
        m->xfer = tg_calloc((size_t)max_req, sizeof *m->xfer);
        m->index = tg_calloc((size_t)max_req, sizeof *m->index);
        m->status = tg_calloc((size_t)max_req, sizeof *m->status);
        m->src = tg_calloc((size_t)ranks, sizeof *m->src);
        m->ready = tg_calloc((size_t)ranks, sizeof *m->ready);
        m->part_lo = tg_calloc((size_t)ranks, sizeof *m->part_lo);
        m->part_len = tg_calloc((size_t)ranks, sizeof *m->part_len);
    }
    if (!m || !m->req || !m->xfer || !m->index || !m->status || !m->src || !m->ready || !m->part_lo || !m->part_len) {
        if (m) free_group(m);
        release_mpi();
        return tg_fail(err, "rank %d of %d: out of memory for an MPI communicator", rank, ranks);
    }
    m->rank = rank, m->ranks = ranks, m->timeout_s = timeout_s;
    m->comm = MPI_COMM_NULL;
    for (int k = 0; k < max_req; k++) m->req[k] = MPI_REQUEST_NULL;
    /* Nonblocking, so that the watchdog covers a rank that never comes. */
    m->xfer[0] = (transfer){.peer = -1};
    m->began = tg_wall_s();
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &m->comm, &m->req[0]);
    /* MPI_COMM_WORLD's errors abort until the duplicate returns them: these rarely fail. */
    if (rc == MPI_SUCCESS && wait_all(m, 1, "joining the MPI group")) rc = MPI_ERR_OTHER; /* GCOVR_EXCL_BR_LINE */
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous((int)BLOCK_BYTES, MPI_BYTE, &m->block);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&m->block);
    if (rc != MPI_SUCCESS) { /* GCOVR_EXCL_START */
        char s[MPI_MAX_ERROR_STRING];
        tg_fail(err, "rank %d of %d: cannot create the MPI communicator: %s", rank, ranks,
                m->error[0] ? m->error : mpi_text(rc, s));
        if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
        free_group(m);
        release_mpi();
        return -1;
    } /* GCOVR_EXCL_STOP */
    live_groups++;
    *out = m;
    return 0;
}

void tg_comm_mpi_close(tg_comm_mpi *m) {
    if (!m) return;
    MPI_Type_free(&m->block);
    MPI_Comm_free(&m->comm);
    free_group(m);
    live_groups--;
    release_mpi();
}
