/* The CPU communicator over MPI (runtime/comm_mpi.c), one process per rank: the program
 * tests/mpi/mpi_comm_check.c, built beside run_tests, runs under mpirun and checks each rank's
 * sums bit for bit against the sum in rank order and the threads' communicator; a rank that
 * never comes to a collective makes the others name it and end the job within seconds; ranks
 * that disagree on a size fail saying so. A build without MPI skips those (no mpirun to
 * start) and refuses to create an MPI group, saying what to install; the stub that refuses
 * is checked in every build, compiled in here under other names. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "runtime/comm.h"
#include "tests/harness.h"

#define tg_comm_mpi_built absent_built
#define tg_comm_mpi_open absent_open
#define tg_comm_mpi_close absent_close
#define tg_comm_mpi_all_reduce_sum absent_all_reduce_sum
#define tg_comm_mpi_all_gather absent_all_gather
#define tg_comm_mpi_reduce_scatter_sum absent_reduce_scatter_sum
#define tg_comm_mpi_error absent_error
#include "runtime/comm_mpi_absent.c"

/* mpirun as the suite starts it: ranks may outnumber the cores, root is allowed (CI), the
 * ranks meet through shared memory alone (no network in a container), and an ASan build's
 * ranks leave Open MPI's own leaks aside (tests/lsan-mpi.supp). Open MPI is built without
 * frame pointers and unloads its components in MPI_Finalize: only the slow unwinder's
 * stacks reach the libraries that stay loaded, which the suppressions name. */
static int mpirun(int np, const char *args, char *out, size_t cap, double *seconds) {
    char exe[PATH_MAX];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (!CHECK(len > 0, "cannot read /proc/self/exe")) return -1;
    exe[len] = 0;
    *strrchr(exe, '/') = 0;
    char cwd[PATH_MAX], cmd[3 * PATH_MAX];
    if (!CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd")) return -1;
    snprintf(cmd, sizeof cmd,
             "LSAN_OPTIONS=suppressions=%s/tests/lsan-mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0 "
             "OMPI_MCA_btl=self,vader "
             "OMPI_MCA_pml=ob1 timeout 120 mpirun -np %d --oversubscribe --allow-run-as-root --bind-to none "
             "%s/tests/mpi_comm_check %s 2>&1",
             cwd, np, exe, args);
    const double began = tg_wall_s();
    FILE *p = popen(cmd, "r");
    if (!CHECK(p != NULL, "cannot run %s", cmd)) return -1;
    size_t n = 0;
    for (size_t got; n + 1 < cap && (got = fread(out + n, 1, cap - 1 - n, p)) > 0;) n += got;
    out[n] = 0;
    char rest[4096];
    while (fread(rest, 1, sizeof rest, p) > 0) {}
    const int status = pclose(p);
    *seconds = tg_wall_s() - began;
    /* A sanitizer's report fails the run whatever the exit status was meant to be. */
    CHECK(!strstr(out, "Sanitizer") && !strstr(out, "runtime error:"), "mpirun -np %d %s: a sanitizer report:\n%s", np,
          args, out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Whether the MPI tests can run: in a build with MPI, mpirun and the program must be there. */
static int mpi_ready(void) {
    if (!tg_cpu_comm_mpi_built()) {
        printf("  (skipped: no mpirun: this build has no MPI)\n");
        return 0;
    }
    return CHECK(system("command -v mpirun >/dev/null 2>&1") == 0,
                 "this build has MPI but mpirun is not on PATH (install openmpi-bin)");
}

static char g_out[1 << 16];

TG_TEST(test_comm_mpi_sums_match_threads) {
    if (!mpi_ready()) return;
    for (int np = 1; np <= 4; np++) {
        double s;
        const int rc = mpirun(np, "check", g_out, sizeof g_out, &s);
        int ok = 0;
        for (int r = 0; r < np; r++) {
            char want[32];
            snprintf(want, sizeof want, "rank %d: ok (", r);
            ok += strstr(g_out, want) != NULL;
        }
        CHECK(rc == 0 && ok == np, "%d ranks: exit %d, %d of them ok:\n%s", np, rc, ok, g_out);
        printf("  %d ranks: %.1f s\n", np, s);
    }
}

/* One rank stalls where the others need it: they name it and the job ends, every rank
 * (the stalled one too: mpirun ends it) gone within seconds of the timeout. */
static void check_stall(int np, const char *op, int stalled, const char *what) {
    char args[64], want[160];
    snprintf(args, sizeof args, "stall %s %d 1.5", op, stalled);
    double s;
    const int rc = mpirun(np, args, g_out, sizeof g_out, &s);
    if (stalled == 0 || !strcmp(op, "join"))
        snprintf(want, sizeof want, "%s has waited 1.", what);
    else
        snprintf(want, sizeof want, "rank 0: %s has waited 1.", what);
    const char *at = strstr(g_out, want);
    CHECK(rc != 0 && at, "%d ranks, rank %d stalled in %s: exit %d, no '%s' in:\n%s", np, stalled, op, rc, want, g_out);
    if (strcmp(op, "join")) {
        snprintf(want, sizeof want, "for rank(s) %d (TUNEGRAPH_STEP_TIMEOUT_S): a rank stopped or died; aborting",
                 stalled);
    } else {
        snprintf(want, sizeof want, "for the other ranks (TUNEGRAPH_STEP_TIMEOUT_S): a rank stopped or died; aborting");
    }
    CHECK(at && strstr(at, want), "%d ranks, rank %d stalled in %s: no '%s' in:\n%s", np, stalled, op, want, g_out);
    CHECK(!strstr(g_out, "the collectives returned"), "%d ranks, %s: a rank went on past the stalled one:\n%s", np, op,
          g_out);
    CHECK(s < 15, "%d ranks, rank %d stalled in %s: mpirun returned after %.1f s", np, stalled, op, s);
    printf("  %d ranks, rank %d stalled in %s, timeout 1.5 s: every rank gone after %.1f s\n", np, stalled, op, s);
}

TG_TEST(test_comm_mpi_watchdog_names_the_missing_rank) {
    if (!mpi_ready()) return;
    check_stall(2, "sum", 1, "the gradient sum");
    check_stall(4, "gather", 2, "the gather of slices");
    check_stall(3, "sum", 0, "the gradient sum");
    /* A rank that never starts MPI: the others wait in MPI_Init_thread, under a thread. */
    check_stall(2, "join", 1, "starting MPI");
    /* mpirun has returned; a rank it killed may take a moment to be gone, not seconds. */
    int left = 1;
    for (int k = 0; k < 50 && left; k++) {
        left = system("pgrep -f 'tests/mpi_comm_check [s]tall' >/dev/null 2>&1") == 0;
        if (left) usleep(100000);
    }
    CHECK(!left, "a rank of the stalled jobs is still running 5 s after mpirun returned");
}

TG_TEST(test_comm_mpi_ranks_disagreeing_on_a_size_fail) {
    if (!mpi_ready()) return;
    double s;
    const int rc = mpirun(3, "mismatch", g_out, sizeof g_out, &s);
    /* Rank 0 (10 floats) is sent more than it expects (by rank 1 or 2, whichever comes
     * first), ranks 1 and 2 (20) less. */
    const char *at = strstr(g_out, "rank 0: the gradient sum: a receive (longer than due: the ranks disagree on the size) "
                                   "with rank ");
    CHECK(rc != 0 && at && strstr(at, "failed: MPI_ERR_TRUNCATE"), "exit %d:\n%s", rc, g_out);
    CHECK(strstr(g_out, "rank 1: the gradient sum: rank 0 sent 12 bytes where 28 were due: the ranks disagree on the size") &&
              strstr(g_out, "rank 2: the gradient sum: rank 0 sent 12 bytes where 24 were due"),
          "exit %d:\n%s", rc, g_out);
    CHECK(!strstr(g_out, "FAIL"), "%s", g_out);
    CHECK(s < 15, "mpirun returned after %.1f s", s);
}

/* The CPU executor's op whose collective fails under MPI names the group's reason (rank 1
 * and 2 were sent less than due), not out of memory (runtime/cpu/cpu_exec.c). */
TG_TEST(test_comm_mpi_executor_names_the_reason) {
    if (!mpi_ready()) return;
    double s;
    const int rc = mpirun(3, "exec_mismatch", g_out, sizeof g_out, &s);
    CHECK(rc != 0 &&
              strstr(g_out, "rank 1: exec: op 0 (all_reduce): rank 1: the gradient sum: rank 0 sent 12 bytes where 28 "
                            "were due: the ranks disagree on the size\n") &&
              strstr(g_out, "rank 2: exec: op 0 (all_reduce): rank 2: the gradient sum: rank 0 sent 12 bytes where 24 "
                            "were due: the ranks disagree on the size\n") &&
              !strstr(g_out, "out of memory"),
          "exit %d:\n%s", rc, g_out);
    CHECK(s < 15, "mpirun returned after %.1f s", s);
}

TG_TEST(test_comm_mpi_absent_refuses) {
    /* The stub of a build without MPI, whichever this build is. */
    tg_comm_mpi *m = (tg_comm_mpi *)&m;
    tg_err err = {{0}};
    CHECK(absent_open(&m, 1, 4, 60, &err) == -1 && m == NULL, "the stub opened");
    CHECK(!strcmp(err.msg, "rank 1 of 4: this build of tunegraph has no MPI, which one process per rank needs: install "
                           "libopenmpi-dev and rebuild"),
          "message: %s", err.msg);
    float x[2] = {1, 2};
    CHECK(absent_built() == 0 && absent_all_reduce_sum(NULL, 0, x, 2) == -1 && absent_all_gather(NULL, 0, x, 1, 4) == -1 &&
              absent_reduce_scatter_sum(NULL, 0, x, 2, 0, 4096) == -1 &&
              !strcmp(absent_error(NULL), TG_COMM_MPI_ABSENT) && x[0] == 1 && x[1] == 2,
          "the stub's collectives");
    absent_close(NULL);
    /* This build's own: a build without MPI refuses through the public function. */
    if (tg_cpu_comm_mpi_built()) return;
    tg_cpu_comm_group *g = (tg_cpu_comm_group *)&g;
    CHECK(tg_cpu_comm_group_create_mpi(&g, 0, 2, 60, &err) == -1 && g == NULL, "created without MPI");
    CHECK(strstr(err.msg, "rank 0 of 2: this build of tunegraph has no MPI") && strstr(err.msg, "libopenmpi-dev"),
          "message: %s", err.msg);
    CHECK(!strcmp(tg_cpu_comm_group_error(NULL), ""), "no group's error");
}
