/* One rank of the MPI communicator's checks (runtime/comm_mpi.c), started by
 * tests/test_comm_mpi.c under `mpirun -np N`; it takes its rank from the launcher's
 * environment as the CLI does (runtime/launch_env.h). Modes:
 *
 *   check            sums of rank-dependent random floats, bit for bit against the sum in
 *                    rank order and against the threads' communicator on the same data;
 *                    gathers of bytes, halves and floats; a long run of collectives; a rank
 *                    out of memory; the refusals. Prints "rank R: ok (N checks)".
 *   stall OP RANK S  rank RANK never comes to OP (sum, gather or join: the group's creation)
 *                    and sleeps instead; the others' watchdog (timeout S seconds) aborts.
 *   mismatch         rank 0 sums 10 floats, the others 20: the ranks that notice fail.
 *   exec_mismatch    the same through the CPU executor's ALL_REDUCE op, whose error names
 *                    the group's reason: "rank R: exec: MESSAGE".
 *   bench REPS N...  the sum of N floats, REPS times, against rank 0 gathering every buffer,
 *                    summing in rank order and broadcasting; medians in ms, from rank 0.
 *
 * Exit status 0 when every check held, 1 otherwise (the watchdog's abort: MPI_Abort's). */
#include <math.h>
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
#include "runtime/comm.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/launch_env.h"

static int me, ranks, failures, checks;

__attribute__((format(printf, 2, 3))) static int check(int ok, const char *fmt, ...) {
    checks++;
    if (ok) return 1;
    failures++;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rank %d: FAIL: ", me);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 0;
}

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Rank r's element i of case c: a sign, 24 random bits and an exponent from 2^-12 to
 * 2^12, so that adding in another order rounds otherwise; now and then -0 or a subnormal. */
static float value(uint64_t c, int r, int64_t i) {
    const uint64_t h = mix(mix(mix(c) ^ (uint64_t)r) ^ (uint64_t)i);
    if ((h & 1023) == 0) return -0.0f;
    if ((h & 1023) == 1) return ldexpf(1.0f, -140);
    const float mant = (float)((h >> 8) & 0xffffff) / (float)(1 << 24);
    const float v = ldexpf(0.5f + mant, (int)((h >> 40) % 25) - 12);
    return (h >> 63) ? -v : v;
}

static void fill(float *x, int64_t n, uint64_t c, int r) {
    for (int64_t i = 0; i < n; i++) x[i] = value(c, r, i);
}

/* The sum as the threads' communicator defines it: rank 0's value, plus rank 1's, ... */
static void ordered_sum(float *out, int64_t n, uint64_t c, int reverse) {
    for (int64_t i = 0; i < n; i++) {
        float s = value(c, reverse ? ranks - 1 : 0, i);
        for (int k = 1; k < ranks; k++) s += value(c, reverse ? ranks - 1 - k : k, i);
        out[i] = s;
    }
}

/* The same data through the threads' communicator (runtime/comm.c), `ranks` threads. */
typedef struct thread_rank {
    tg_cpu_comm_group *g;
    int rank, rc;
    float *v;
    int64_t n;
} thread_rank;

static void *thread_main(void *arg) {
    thread_rank *t = arg;
    t->rc = tg_cpu_all_reduce_sum(t->g, t->rank, t->v, t->n);
    return NULL;
}

static int threads_sum(float *out, int64_t n, uint64_t c) {
    tg_cpu_comm_group *g;
    tg_err err;
    if (!check(tg_cpu_comm_group_create(&g, ranks, &err) == 0, "threads' group: %s", err.msg)) return -1;
    thread_rank t[64];
    pthread_t th[64];
    int rc = 0;
    for (int r = 0; r < ranks; r++) {
        t[r] = (thread_rank){g, r, -1, malloc((size_t)(n ? n : 1) * sizeof(float)), n};
        fill(t[r].v, n, c, r);
    }
    for (int r = 0; r < ranks; r++) pthread_create(&th[r], NULL, thread_main, &t[r]);
    for (int r = 0; r < ranks; r++) pthread_join(th[r], NULL), rc |= t[r].rc;
    memcpy(out, t[0].v, (size_t)n * sizeof(float));
    for (int r = 0; r < ranks; r++) free(t[r].v);
    tg_cpu_comm_group_destroy(g);
    return rc;
}

static int64_t first_difference(const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) return i;
    return -1;
}

/* One sum of n floats of case c, checked bit for bit; against the threads' too when asked. */
static void check_sum(tg_cpu_comm_group *g, int64_t n, uint64_t c, int with_threads) {
    const size_t bytes = (size_t)(n ? n : 1) * sizeof(float);
    float *x = malloc(bytes), *want = malloc(bytes), *other = malloc(bytes);
    fill(x, n, c, me);
    const int rc = tg_cpu_all_reduce_sum(g, me, x, n);
    check(rc == 0, "sum of %lld floats returned %d: %s", (long long)n, rc, tg_cpu_comm_group_error(g));
    ordered_sum(want, n, c, 0);
    int64_t at = first_difference(x, want, n);
    check(at < 0, "sum of %lld floats: element %lld is %a, the sum in rank order %a", (long long)n, (long long)at,
          at < 0 ? 0 : x[at], at < 0 ? 0 : want[at]);
    if (with_threads && threads_sum(other, n, c) == 0) {
        at = first_difference(x, other, n);
        check(at < 0, "sum of %lld floats: element %lld is %a, the threads' %a", (long long)n, (long long)at,
              at < 0 ? 0 : x[at], at < 0 ? 0 : other[at]);
    }
    /* The data must tell the orders apart, or the checks above prove nothing (with two
     * ranks there is one order: a float sum of two commutes). */
    if (ranks > 2 && n >= 1000) {
        ordered_sum(other, n, c, 1);
        check(first_difference(want, other, n) >= 0, "sum of %lld floats: the reverse order gives the same sums",
              (long long)n);
    }
    free(x), free(want), free(other);
}

/* ZeRO-1's reduce-scatter of n floats viewed from element `first` of slices of `slice`:
 * this rank's part holds the sum in rank order, bit for bit; every other element its own
 * value, untouched. */
static void check_reduce_scatter(tg_cpu_comm_group *g, int64_t n, int64_t first, int64_t slice, uint64_t c) {
    const size_t bytes = (size_t)(n ? n : 1) * sizeof(float);
    float *x = malloc(bytes), *want = malloc(bytes);
    fill(x, n, c, me);
    const int rc = tg_cpu_reduce_scatter_sum(g, me, x, n, first, slice);
    check(rc == 0, "reduce-scatter of %lld floats returned %d: %s", (long long)n, rc, tg_cpu_comm_group_error(g));
    ordered_sum(want, n, c, 0);
    int64_t lo, len;
    tg_slice_part(n, first, slice, me, &lo, &len);
    for (int64_t i = 0; i < n; i++) {
        const float w = i >= lo && i < lo + len ? want[i] : value(c, me, i);
        if (!check(!memcmp(&x[i], &w, sizeof w), "reduce-scatter of %lld floats from %lld, slices %lld: element %lld is "
                                                   "%a, want %a (part [%lld, %lld))",
                   (long long)n, (long long)first, (long long)slice, (long long)i, x[i], w, (long long)lo,
                   (long long)(lo + len)))
            break;
    }
    free(x), free(want);
}

/* A gather of `slice` elements of `elem` bytes per rank: rank r's bytes are r * 37 + k. */
static void check_gather(tg_cpu_comm_group *g, int64_t slice, size_t elem) {
    const size_t part = (size_t)(slice > 0 ? slice : 0) * elem, all = part * (size_t)ranks;
    unsigned char *b = malloc(all ? all : 1);
    for (size_t k = 0; k < all; k++) b[k] = k / part == (size_t)me ? (unsigned char)(me * 37 + k) : 0xEE;
    const int rc = tg_cpu_all_gather(g, me, b, slice, elem);
    check(rc == 0, "gather of %lld x %zu bytes returned %d: %s", (long long)slice, elem, rc, tg_cpu_comm_group_error(g));
    for (size_t k = 0; k < all; k++)
        if (!check(b[k] == (unsigned char)((k / part) * 37 + k), "gather of %lld x %zu bytes: byte %zu is %u, want %u",
                   (long long)slice, elem, k, b[k], (unsigned)(unsigned char)((k / part) * 37 + k)))
            break;
    free(b);
}

/* Every rank out of memory in turn: all fail together, every buffer as it was, the group
 * still whole. */
static void check_out_of_memory(void) {
    for (int failing = 0; failing < ranks && ranks > 1; failing++) {
        tg_cpu_comm_group *g;
        tg_err err;
        if (!check(tg_cpu_comm_group_create_mpi(&g, me, ranks, 30, &err) == 0, "second group: %s", err.msg)) return;
        float x[1000], was[1000];
        fill(x, 1000, 77, me);
        memcpy(was, x, sizeof x);
        if (me == failing) tg_alloc_fail_after(0);
        const int rc = tg_cpu_all_reduce_sum(g, me, x, 1000);
        tg_alloc_fail_after(-1);
        char want[64];
        snprintf(want, sizeof want, "out of memory on rank(s) %d", failing);
        check(rc == -1 && strstr(tg_cpu_comm_group_error(g), want), "rank %d without memory: returned %d (%s)", failing,
              rc, tg_cpu_comm_group_error(g));
        check(!memcmp(x, was, sizeof x), "rank %d without memory: the buffer changed", failing);
        check_sum(g, 1000, 78, 0);
        /* What it holds now needs no allocation: a failing one changes nothing. */
        if (me == failing) tg_alloc_fail_after(0);
        check_sum(g, 999, 79, 0);
        /* A longer sum needs more: refused on every rank again. */
        fill(x, 1000, 80, me);
        float y[2000] = {0};
        memcpy(y, x, sizeof x);
        const int again = tg_cpu_all_reduce_sum(g, me, y, 2000);
        tg_alloc_fail_after(-1);
        check(again == -1 && strstr(tg_cpu_comm_group_error(g), want), "2000 floats, rank %d without memory: %d (%s)",
              failing, again, tg_cpu_comm_group_error(g));
        check_sum(g, 2000, 81, 0);
        tg_cpu_comm_group_destroy(g);
    }
}

static void check_refusals(tg_cpu_comm_group *g) {
    tg_cpu_comm_group *other = (tg_cpu_comm_group *)&other;
    tg_err err = {{0}};
    char want[160];
    /* The launcher's rank or size other than MPI's: refused naming both. */
    const int wrong = (me + 1) % (ranks + 1);
    check(tg_cpu_comm_group_create_mpi(&other, wrong, ranks + 1, 30, &err) == -1 && other == NULL,
          "rank %d of %d accepted", wrong, ranks + 1);
    snprintf(want, sizeof want, "rank %d of %d (the launcher's environment) is rank %d of %d in the MPI job", wrong,
             ranks + 1, me, ranks);
    check(strstr(err.msg, want) != NULL, "wrong rank: '%s', want '%s'", err.msg, want);
    check(tg_cpu_comm_group_create_mpi(&other, me, ranks, 0, &err) == -1 &&
              strstr(err.msg, "timeout must be a number of seconds above 0, got 0"),
          "timeout 0: %s", err.msg);
    check(tg_cpu_comm_group_create_mpi(&other, ranks, ranks, 1, &err) == -1 &&
              strstr(err.msg, "needs a rank from 0 to the ranks less one"),
          "rank %d of %d: %s", ranks, ranks, err.msg);
    /* A collective called as another rank than this process's fails here, sending nothing. */
    float x[4] = {1, 2, 3, 4};
    snprintf(want, sizeof want, "rank %d: a collective was called as rank %d, but this process is rank %d of %d", me,
             me + 1, me, ranks);
    check(tg_cpu_all_reduce_sum(g, me + 1, x, 4) == -1 && strstr(tg_cpu_comm_group_error(g), want),
          "sum as another rank: %s", tg_cpu_comm_group_error(g));
    check(tg_cpu_all_gather(g, me + 1, x, 1, sizeof *x) == -1 && strstr(tg_cpu_comm_group_error(g), want),
          "gather as another rank: %s", tg_cpu_comm_group_error(g));
    check(x[0] == 1 && x[3] == 4, "a refused collective changed the buffer");
    check(tg_cpu_comm_group_ranks(g) == ranks, "the group counts %d ranks", tg_cpu_comm_group_ranks(g));
    check(tg_cpu_comm_mpi_built() == 1, "an MPI build says it has no MPI");
}

static int mode_check(void) {
    tg_cpu_comm_group *g;
    tg_err err;
    if (!check(tg_cpu_comm_group_create_mpi(&g, me, ranks, 30, &err) == 0, "%s", err.msg)) return 1;
    const double began = tg_wall_s();
    /* Sizes around the rank count (0, fewer than the ranks, not divisible by them), larger
     * ones with parts of unequal length, one past a million. */
    static const int64_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 31, 1000, 1001, 4099, 65537, 300007, 1000003};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) check_sum(g, sizes[k], 100 + k, sizes[k] <= 300007);
    check(!strcmp(tg_cpu_comm_group_error(g), ""), "after sums that worked, the error reads '%s'",
          tg_cpu_comm_group_error(g));
    /* Views inside one slice, across several, past the last; slices of one element. */
    static const int64_t scatters[][3] = {{0, 0, 5}, {10, 0, 4}, {10, 3, 4}, {1000, 2500, 700}, {4099, 0, 1025}, {7, 1, 1}, {300007, 17, 77777}};
    for (size_t k = 0; k < sizeof scatters / sizeof *scatters; k++)
        check_reduce_scatter(g, scatters[k][0], scatters[k][1], scatters[k][2], 500 + k);
    static const int64_t slices[] = {0, 1, 3, 1000};
    for (size_t k = 0; k < 4; k++) check_gather(g, slices[k], 1);
    check_gather(g, 5, 2);
    for (size_t k = 1; k < 4; k++) check_gather(g, slices[k] + 6, sizeof(float));
    /* Many in a row, of sizes every rank draws alike, sums and gathers mixed. */
    uint64_t s = 12345;
    for (int k = 0; k < 300; k++) {
        s = mix(s);
        if (s & 1) check_sum(g, (int64_t)(s >> 40) % 3000, 1000 + k, 0);
        else check_gather(g, (int64_t)(s >> 40) % 50, 1 + (s >> 8) % 4);
    }
    check_refusals(g);
    check_out_of_memory();
    tg_cpu_comm_group_destroy(g);
    /* The last group finalized MPI, which cannot start again. */
    check(tg_cpu_comm_group_create_mpi(&g, me, ranks, 30, &err) == -1 &&
              strstr(err.msg, "MPI was finalized in this process"),
          "a group after MPI_Finalize: %s", err.msg);
    printf("rank %d: %s (%d checks, %.2f s)\n", me, failures ? "FAILED" : "ok", checks, tg_wall_s() - began);
    return failures != 0;
}

/* MPI started here rather than by the group, for the modes whose short timeout is meant for
 * the collectives: starting MPI waits for every rank, which takes seconds under a sanitizer
 * on a busy host. The group then leaves MPI_Finalize to us. */
static void start_mpi(void) {
    int provided;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
}

static int mode_stall(const char *op, int stalled, double timeout_s) {
    tg_cpu_comm_group *g;
    tg_err err;
    if (!strcmp(op, "join") && me == stalled) sleep(60);
    if (strcmp(op, "join")) start_mpi();
    if (tg_cpu_comm_group_create_mpi(&g, me, ranks, timeout_s, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    float x[64] = {0};
    /* One collective that works, then the one the stalled rank never comes to. */
    int rc = tg_cpu_all_reduce_sum(g, me, x, 64);
    if (me == stalled) sleep(60);
    else if (!strcmp(op, "sum")) rc |= tg_cpu_all_reduce_sum(g, me, x, 64);
    else rc |= tg_cpu_all_gather(g, me, x, 64 / ranks, sizeof(float));
    printf("rank %d: the collectives returned %d\n", me, rc);
    tg_cpu_comm_group_destroy(g);
    if (strcmp(op, "join")) MPI_Finalize();
    return 1; /* not reached by a rank whose watchdog works */
}

/* MPI started here (start_mpi) and a group of every rank with a 10 s watchdog; NULL (said
 * on stderr) when it cannot be made. */
static tg_cpu_comm_group *started_group(void) {
    tg_cpu_comm_group *g;
    tg_err err;
    start_mpi();
    if (!tg_cpu_comm_group_create_mpi(&g, me, ranks, 10, &err)) return g;
    fprintf(stderr, "%s\n", err.msg);
    return NULL;
}

static int mode_mismatch(void) {
    tg_cpu_comm_group *g = started_group();
    if (!g) return 1;
    float x[20] = {0};
    const int rc = tg_cpu_all_reduce_sum(g, me, x, me == 0 ? 10 : 20);
    /* A broken group stays broken: the next collective fails at once, saying the same. */
    if (rc) {
        char first[1024];
        snprintf(first, sizeof first, "%s", tg_cpu_comm_group_error(g));
        const int again = tg_cpu_all_gather(g, me, x, 1, sizeof *x);
        check(again == -1 && !strcmp(first, tg_cpu_comm_group_error(g)), "after the error: %d, '%s'", again,
              tg_cpu_comm_group_error(g));
    }
    printf("rank %d: the sum returned %d\n", me, rc);
    fflush(stdout);
    tg_cpu_comm_group_destroy(g);
    MPI_Finalize();
    return rc != 0 || failures;
}

/* The same disagreement through the CPU executor: a plan of one ALL_REDUCE op over a tensor
 * of 20 floats, rank 0 summing 10 of them. The op fails naming its group's reason, which
 * each rank prints as "rank R: exec: MESSAGE". */
static int mode_exec_mismatch(void) {
    tg_cpu_comm_group *g = started_group();
    if (!g) return 1;
    tg_err err;
    tg_tensor t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "grads");
    t.pool = TG_POOL_ACTIVATIONS, t.ndim = 1, t.shape[0] = 20, t.bytes = 80;
    tg_op op;
    memset(&op, 0, sizeof op);
    op.kind = TG_OP_ALL_REDUCE;
    memset(op.in, 0xff, sizeof op.in), memset(op.out, 0xff, sizeof op.out); /* -1: absent */
    op.in[0] = op.out[0] = 0, op.p.count.n = me == 0 ? 10 : 20;
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = 1, plan.tensors = &t, plan.n_ops = 1, plan.ops = &op;
    plan.pool_bytes[TG_POOL_ACTIVATIONS] = 80;
    plan.train.replicas = ranks;
    tg_cpu_exec x;
    int rc = tg_cpu_exec_init(&x, &plan, 1, &err);
    if (!rc) {
        x.comm = g, x.rank = me;
        rc = tg_cpu_exec_range(&x, 0, 1, &err);
        tg_cpu_exec_free(&x);
    }
    printf("rank %d: exec: %s\n", me, rc ? err.msg : "ok");
    fflush(stdout);
    tg_cpu_comm_group_destroy(g);
    MPI_Finalize();
    return rc != 0;
}

/* The alternative to runtime/comm_mpi.c's parts: rank 0 receives every buffer, adds them in
 * rank order and broadcasts the sum (a plain Waitall: no watchdog, the best case for it). */
static void gather_sum_bcast(float *buf, float *scratch, int64_t n) {
    MPI_Request req[64];
    int k = 0;
    if (me == 0) {
        for (int r = 1; r < ranks; r++) MPI_Irecv(scratch + (r - 1) * n, (int)n, MPI_FLOAT, r, 9, MPI_COMM_WORLD, &req[k++]);
        MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
        for (int r = 1; r < ranks; r++) {
            const float *x = scratch + (r - 1) * n;
            for (int64_t i = 0; i < n; i++) buf[i] += x[i];
        }
    } else {
        MPI_Send(buf, (int)n, MPI_FLOAT, 0, 9, MPI_COMM_WORLD);
    }
    MPI_Bcast(buf, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int mode_bench(int reps, int argc, char **argv) {
    tg_cpu_comm_group *g;
    tg_err err;
    if (tg_cpu_comm_group_create_mpi(&g, me, ranks, 120, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (me == 0) printf("%10s %6s %12s %14s %14s\n", "floats", "ranks", "parts ms", "gather+bcast", "MPI_Allreduce");
    for (int a = 0; a < argc; a++) {
        const int64_t n = (int64_t)atof(argv[a]);
        float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
        float *scratch = me == 0 ? malloc((size_t)n * (size_t)(ranks - 1) * sizeof(float)) : NULL;
        double t[3][64];
        for (int rep = 0; rep < reps + 1; rep++) /* the first, which allocates, not counted */
            for (int way = 0; way < 3; way++) {
                fill(x, n, 5 + (uint64_t)rep, me);
                MPI_Barrier(MPI_COMM_WORLD);
                const double t0 = tg_wall_s();
                if (way == 0) tg_cpu_all_reduce_sum(g, me, x, n);
                else if (way == 1) gather_sum_bcast(x, scratch, n);
                else MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                double dt = tg_wall_s() - t0, worst = 0;
                MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); /* the slowest rank's */
                if (rep) t[way][rep - 1] = worst * 1e3;
                if (way == 0) memcpy(y, x, (size_t)n * sizeof(float));
                if (way == 1 && rep && first_difference(x, y, n) >= 0) fprintf(stderr, "rank %d: the two sums differ\n", me);
            }
        for (int way = 0; way < 3; way++) qsort(t[way], (size_t)reps, sizeof(double), by_value);
        if (me == 0)
            printf("%10lld %6d %12.3f %14.3f %14.3f\n", (long long)n, ranks, t[0][reps / 2], t[1][reps / 2], t[2][reps / 2]);
        free(x), free(y), free(scratch);
    }
    tg_cpu_comm_group_destroy(g);
    return 0;
}

int main(int argc, char **argv) {
    tg_rank_env env;
    tg_err err;
    if (tg_rank_env_read(&env, NULL, NULL, &err)) {
        fprintf(stderr, "mpi_comm_check: %s\n", err.msg);
        return 1;
    }
    me = env.rank, ranks = env.world_size;
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "check") && argc == 2) return mode_check();
    if (!strcmp(mode, "stall") && argc == 5) return mode_stall(argv[2], atoi(argv[3]), atof(argv[4]));
    if (!strcmp(mode, "mismatch") && argc == 2) return mode_mismatch();
    if (!strcmp(mode, "exec_mismatch") && argc == 2) return mode_exec_mismatch();
    if (!strcmp(mode, "bench") && argc >= 4 && atoi(argv[2]) >= 1 && atoi(argv[2]) <= 64 && ranks <= 64)
        return mode_bench(atoi(argv[2]), argc - 3, argv + 3);
    fprintf(stderr, "usage: mpi_comm_check check | stall sum|gather|join RANK TIMEOUT_S | mismatch | exec_mismatch | bench REPS N...\n");
    return 2;
}
