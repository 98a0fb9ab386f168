/* The CPU communicator's refusals and out-of-memory handling (runtime/comm.c): a group
 * that cannot be created says why; an all-reduce on a rank with no memory for its sum
 * fails on every rank together, leaving every buffer as it was and the group usable (no
 * rank aborts, none is left waiting in a barrier); the ALL_REDUCE kernel turns that into
 * the op's out-of-memory (runtime/cpu/collectives.c); degenerate calls change nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/comm.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

enum { RANKS = 3, N = 6 };

typedef struct reduce_rank {
    tg_cpu_comm_group *g;
    int rank;
    long fail_after; /* this rank's allocation hook for the call (-1: none) */
    int64_t n;
    float v[N];
    int rc;
    int via_kernel;  /* through tg_cpu_kernel_all_reduce, with an out-of-memory flag */
    atomic_int oom;
} reduce_rank;

static void *reduce_main(void *arg) {
    reduce_rank *a = arg;
    tg_alloc_fail_after(a->fail_after);
    if (a->via_kernel) {
        tg_op op = tg_test_op(TG_OP_ALL_REDUCE);
        op.p.count.n = a->n;
        tg_cpu_op_args args = {.op = &op, .comm = a->g, .rank = a->rank, .out_of_memory = &a->oom};
        args.out[0] = a->v;
        tg_cpu_kernel_all_reduce(&args);
        a->rc = atomic_load(&a->oom) ? -1 : 0;
    } else {
        a->rc = tg_cpu_all_reduce_sum(a->g, a->rank, a->v, a->n);
    }
    tg_alloc_fail_after(-1);
    return NULL;
}

/* Runs one all-reduce of n floats over the ranks, rank r holding (r + 1) * 10^i at i,
 * rank `failing` (or none: -1) with its allocations failing after `succeed`. */
static void reduce_all(tg_cpu_comm_group *g, reduce_rank *a, int64_t n, int failing, long succeed, int via_kernel) {
    pthread_t th[RANKS];
    for (int r = 0; r < RANKS; r++) {
        a[r].g = g, a[r].rank = r, a[r].n = n, a[r].rc = 99, a[r].via_kernel = via_kernel;
        a[r].fail_after = r == failing ? succeed : -1;
        atomic_store(&a[r].oom, 0);
        float p = 1;
        for (int i = 0; i < N; i++, p *= 10) a[r].v[i] = (float)(r + 1) * p;
    }
    for (int r = 0; r < RANKS; r++) pthread_create(&th[r], NULL, reduce_main, &a[r]);
    for (int r = 0; r < RANKS; r++) pthread_join(th[r], NULL);
}

/* Each rank's buffer: the sums 6 * 10^i below n, its own values from n on. */
static void check_sums(const reduce_rank *a, int64_t n, const char *what) {
    for (int r = 0; r < RANKS; r++) {
        CHECK(a[r].rc == 0, "%s: rank %d returned %d", what, r, a[r].rc);
        float p = 1;
        for (int i = 0; i < N; i++, p *= 10) {
            const float want = i < n ? 6 * p : (float)(r + 1) * p;
            CHECK(a[r].v[i] == want, "%s: rank %d element %d is %g, want %g", what, r, i, a[r].v[i], want);
        }
    }
}

static void check_untouched(const reduce_rank *a, const char *what) {
    for (int r = 0; r < RANKS; r++) {
        CHECK(a[r].rc == -1, "%s: rank %d returned %d, want -1 on every rank", what, r, a[r].rc);
        float p = 1;
        for (int i = 0; i < N; i++, p *= 10)
            CHECK(a[r].v[i] == (float)(r + 1) * p, "%s: rank %d element %d is %g, want its own %g", what, r, i,
                  a[r].v[i], (float)(r + 1) * p);
    }
}

TG_TEST(test_comm_all_reduce_out_of_memory) {
    tg_cpu_comm_group *g = NULL;
    tg_err err;
    reduce_rank a[RANKS];
    /* Each rank in turn without memory for its first sum (a fresh group each time, where
     * no rank holds a buffer yet): all fail, none changes. */
    static const char *const what[RANKS] = {"rank 0 out of memory", "rank 1 out of memory", "rank 2 out of memory"};
    for (int failing = 0; failing < RANKS; failing++) {
        tg_cpu_comm_group_destroy(g);
        REQUIRE(tg_cpu_comm_group_create(&g, RANKS, &err) == 0, "%s", err.msg);
        reduce_all(g, a, 4, failing, 0, 0);
        check_untouched(a, what[failing]);
    }
    /* The group is still whole: the same call with memory sums on every rank. */
    reduce_all(g, a, 4, -1, -1, 0);
    check_sums(a, 4, "after the failures");
    /* Sums that fit what each rank holds allocate nothing: a failing hook changes nothing. */
    reduce_all(g, a, 4, 1, 0, 0);
    check_sums(a, 4, "4 again, rank 1 unable to allocate");
    reduce_all(g, a, 3, 2, 0, 0);
    check_sums(a, 3, "3 of the 4 held, rank 2 unable to allocate");
    /* A longer sum needs a new buffer: refused where it cannot have one. */
    reduce_all(g, a, 5, 0, 0, 0);
    check_untouched(a, "5 past the 4 held, rank 0 unable to allocate");
    reduce_all(g, a, N, -1, -1, 0);
    check_sums(a, N, "all 6");
    tg_cpu_comm_group_destroy(g);
}

TG_TEST(test_comm_all_reduce_kernel_out_of_memory) {
    tg_cpu_comm_group *g;
    tg_err err;
    REQUIRE(tg_cpu_comm_group_create(&g, RANKS, &err) == 0, "%s", err.msg);
    reduce_rank a[RANKS];
    reduce_all(g, a, 5, 1, 0, 1);
    check_untouched(a, "kernel, rank 1 out of memory"); /* rc -1: the op's flag set on every rank */
    reduce_all(g, a, 5, -1, -1, 1);
    check_sums(a, 5, "kernel with memory");
    tg_cpu_comm_group_destroy(g);
    /* Without a communicator (one replica) the sum over one is the tensor itself. */
    float v[2] = {3, 4};
    tg_op op = tg_test_op(TG_OP_ALL_REDUCE);
    op.p.count.n = 2;
    atomic_int oom = 0;
    tg_cpu_op_args args = {.op = &op, .out_of_memory = &oom};
    args.out[0] = v;
    tg_cpu_kernel_all_reduce(&args);
    CHECK(v[0] == 3 && v[1] == 4 && atomic_load(&oom) == 0, "one replica: %g %g, flag %d", v[0], v[1],
          atomic_load(&oom));
}

TG_TEST(test_comm_group_refusals) {
    tg_cpu_comm_group *g = (tg_cpu_comm_group *)&g; /* anything but NULL: create clears it */
    tg_err err = {{0}};
    CHECK(tg_cpu_comm_group_create(&g, 0, &err) == -1 && g == NULL, "0 ranks accepted");
    CHECK(strstr(err.msg, "needs at least one rank (got 0)") != NULL, "message: %s", err.msg);
    CHECK(tg_cpu_comm_group_create(&g, -3, &err) == -1 && strstr(err.msg, "(got -3)"), "-3 ranks: %s", err.msg);
    /* Each of the group's four allocations failing in turn. */
    int failures = 0;
    for (long k = 0;; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_cpu_comm_group_create(&g, 2, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            CHECK(k == 4, "created with only %ld allocations", k);
            CHECK(tg_cpu_comm_group_ranks(g) == 2, "ranks: %d", tg_cpu_comm_group_ranks(g));
            tg_cpu_comm_group_destroy(g);
            break;
        }
        failures++;
        CHECK(g == NULL, "allocation %ld failing: a group came back", k);
        CHECK(strstr(err.msg, "out of memory for a communicator of 2 ranks") != NULL, "allocation %ld: %s", k,
              err.msg);
        if (k > 8) break;
    }
    CHECK(failures == 4, "%d allocations failed cleanly, want 4", failures);
    CHECK(tg_cpu_comm_group_ranks(NULL) == 1, "no group counts one rank");
    tg_cpu_comm_group_destroy(NULL);
}

TG_TEST(test_comm_degenerate_calls_change_nothing) {
    float v[3] = {1, 2, 3};
    uint16_t s[4] = {7, 8, 9, 10};
    /* No group, one rank, or nothing to move: the buffers stay, nothing blocks. */
    CHECK(tg_cpu_all_reduce_sum(NULL, 0, v, 3) == 0, "no group");
    CHECK(tg_cpu_all_gather(NULL, 0, s, 2, sizeof *s) == 0, "gather, no group");
    tg_cpu_comm_group *one, *two;
    tg_err err;
    REQUIRE(tg_cpu_comm_group_create(&one, 1, &err) == 0, "%s", err.msg);
    REQUIRE(tg_cpu_comm_group_create(&two, 2, &err) == 0, "%s", err.msg);
    CHECK(tg_cpu_all_reduce_sum(one, 0, v, 3) == 0, "one rank");
    CHECK(tg_cpu_all_gather(one, 0, s, 2, sizeof *s) == 0, "gather, one rank");
    /* With two ranks, an empty call returns at once (the other rank never calls). */
    CHECK(tg_cpu_all_reduce_sum(two, 0, v, 0) == 0 && tg_cpu_all_reduce_sum(two, 0, v, -1) == 0, "n <= 0");
    CHECK(tg_cpu_all_gather(two, 0, s, 0, sizeof *s) == 0 && tg_cpu_all_gather(two, 0, s, -2, sizeof *s) == 0,
          "gather, slice <= 0");
    CHECK(v[0] == 1 && v[1] == 2 && v[2] == 3, "values changed: %g %g %g", v[0], v[1], v[2]);
    CHECK(s[0] == 7 && s[1] == 8 && s[2] == 9 && s[3] == 10, "slices changed: %u %u %u %u", s[0], s[1], s[2], s[3]);
    tg_cpu_comm_group_destroy(one);
    tg_cpu_comm_group_destroy(two);
}
