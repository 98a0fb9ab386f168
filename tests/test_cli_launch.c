/* One process per rank (cli/launch.c; linked into the suite with the other CLI sources by
 * test_cli_metrics.c): the ranks' identities compared, the GPU a rank takes, --nproc taken
 * out of the command line, and the supervisor of `run --nproc`: the environment each rank
 * gets, and a rank that fails, is killed, or will not stop ending every rank, played by
 * shell scripts in place of tunegraph. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "cli/launch.h"
#include "models/safetensors.h"
#include "runtime/comm.h"
#include "runtime/executor.h"
#include "tests/harness.h"

static void fill(rank_identity *all, int world) {
    for (int r = 0; r < world; r++) {
        memset(&all[r], 0, sizeof all[r]);
        all[r].plan_fingerprint = 0x1234abcd5678ef00ULL, all[r].data_hash = 0xfeedULL, all[r].world = world,
        all[r].examples = 100;
    }
}

/* Every field that differs is named with its rank, the first field only for each rank, and
 * ranks that agree are left out. */
TG_TEST(test_launch_rank_identities) {
    rank_identity all[4];
    tg_err err = {{0}};
    fill(all, 4);
    CHECK(rank_identities_agree(all, 4, &err) == 0, "equal identities refused: %s", err.msg);
    CHECK(rank_identities_agree(all, 1, &err) == 0, "a world of one refused: %s", err.msg);
    all[2].plan_fingerprint = 0x1ULL;
    CHECK(rank_identities_agree(all, 4, &err) == -1 &&
              !strcmp(err.msg, "1 of 4 ranks do not run rank 0's job (rank 2: plan fingerprint 0000000000000001, rank "
                               "0's 1234abcd5678ef00): every rank needs the same job, model, data and tunegraph"),
          "%s", err.msg);
    all[1].data_hash = 0xbeefULL, all[3].examples = 99, all[3].world = 3;
    CHECK(rank_identities_agree(all, 4, &err) == -1 &&
              strstr(err.msg, "3 of 4 ranks do not run rank 0's job (rank 1: training data xxh64 000000000000beef, "
                              "rank 0's 000000000000feed; rank 2: plan fingerprint") &&
              strstr(err.msg, "; rank 3: world size 3, rank 0's 4)"),
          "%s", err.msg);
    fill(all, 4);
    all[3].examples = 7;
    CHECK(rank_identities_agree(all, 4, &err) == -1 && strstr(err.msg, "rank 3: 7 training examples, rank 0's 100"),
          "%s", err.msg);
    /* Many differing ranks: the list is cut, the count stays whole. */
    rank_identity many[64];
    fill(many, 64);
    for (int r = 1; r < 64; r++) many[r].data_hash = (uint64_t)r;
    CHECK(rank_identities_agree(many, 64, &err) == -1 && !strncmp(err.msg, "63 of 64 ranks", 14), "%s", err.msg);
}

TG_TEST(test_launch_rank_gpu) {
    tg_rank_env env = {.launcher = TG_LAUNCHER_TORCHRUN, .rank = 5, .world_size = 8, .local_rank = 1, .local_size = 4};
    tg_err err = {{0}};
    int gpu = -1;
    CHECK(rank_gpu(&env, 4, &gpu, &err) == 0 && gpu == 1, "local rank 1 of 4 GPUs: GPU %d", gpu);
    CHECK(rank_gpu(&env, 1, &gpu, &err) == 0 && gpu == 0, "one GPU visible: GPU %d", gpu);
    env.local_rank = 3;
    CHECK(rank_gpu(&env, 2, &gpu, &err) == -1 &&
              !strcmp(err.msg, "rank 5 of 8: local rank 3 but 2 GPUs visible on this machine (one process per GPU)"),
          "%s", err.msg);
    CHECK(rank_gpu(&env, 0, &gpu, &err) == -1 && !strcmp(err.msg, "rank 5 of 8: no GPU visible"), "%s", err.msg);
}

TG_TEST(test_launch_argv_without_nproc) {
    char *argv[] = {"job.job", "--nproc", "2", "--set", "steps=3", "--nproc", "4", "--metrics", "m.jsonl", NULL};
    char **out = launch_argv_without_nproc(9, argv);
    REQUIRE(out != NULL, "out of memory");
    const char *want[] = {"job.job", "--set", "steps=3", "--metrics", "m.jsonl", NULL};
    int same = 1;
    for (int k = 0; k < 6; k++) same &= (want[k] == NULL) ? out[k] == NULL : out[k] && !strcmp(out[k], want[k]);
    CHECK(same, "argv without --nproc: %s %s %s ...", out[0], out[1], out[2]);
    free(out);
    CHECK(launch_free_port() > 0, "no free loopback port");
}

/* The supervisor runs `sh -c SCRIPT` as every rank; its stderr goes to a file. */
static int supervise(const char *dir, const char *script, int nproc, double grace_s, double *took_s, char **said) {
    char *argv[] = {"sh", "-c", (char *)script, NULL};
    char path[600];
    snprintf(path, sizeof path, "%s/launch-err.txt", dir);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *f = fopen(path, "w");
    if (saved < 0 || !f) return -1;
    dup2(fileno(f), STDERR_FILENO);
    fclose(f);
    const double t0 = tg_wall_s();
    int rc = launch_ranks("/bin/sh", argv, nproc, grace_s);
    *took_s = tg_wall_s() - t0;
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    *said = tg_test_read_file(path, NULL);
    return rc;
}

/* Each rank's environment is the torchrun-style one runtime/launch_env.c reads, with one
 * bootstrap address for all; a world that ends well ends with 0. */
TG_TEST(test_launch_ranks_environment) {
    char script[1200], dir[512];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir()); /* the harness's buffer is reused */
    snprintf(script, sizeof script,
             "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $NCCL_COMM_ID\" > "
             "%s/rank-$RANK.txt",
             dir);
    double took;
    char *said = NULL;
    CHECK(supervise(dir, script, 3, 5, &took, &said) == 0, "a world that ended well: %s", said ? said : "");
    free(said);
    char first_addr[128] = "";
    for (int r = 0; r < 3; r++) {
        char path[700];
        snprintf(path, sizeof path, "%s/rank-%d.txt", dir, r);
        char *text = tg_test_read_file(path, NULL);
        int rank = -1, world = 0, local = -1, local_size = 0, port = 0;
        char addr[64] = "", comm_id[128] = "";
        const int got = text ? sscanf(text, "%d %d %d %d %63s %d %127s", &rank, &world, &local, &local_size, addr,
                                      &port, comm_id)
                             : 0;
        char want_id[128];
        snprintf(want_id, sizeof want_id, "127.0.0.1:%d", port);
        CHECK(got == 7 && rank == r && world == 3 && local == r && local_size == 3 && !strcmp(addr, "127.0.0.1") &&
                  port > 0 && !strcmp(comm_id, want_id),
              "rank %d's environment: %s", r, text ? text : "(none)");
        if (r == 0) snprintf(first_addr, sizeof first_addr, "%s", comm_id);
        else CHECK(!strcmp(comm_id, first_addr), "rank %d's bootstrap %s, rank 0's %s", r, comm_id, first_addr);
        free(text);
    }
}

/* A rank that fails, or is killed, stops the others at once (a stopped one too: it is
 * continued to take its SIGTERM), and the message names it and its cause; a rank that
 * ignores SIGTERM is killed after the grace. */
TG_TEST(test_launch_ranks_fault) {
    static const struct {
        const char *script;
        double grace_s, at_most_s;
        const char *says;
    } cases[] = {
        {"[ $RANK = 1 ] && { sleep 0.2; exit 3; }; exec sleep 30", 10, 5, "tunegraph: rank 1 of 3 (pid"},
        {"[ $RANK = 2 ] && { sleep 0.2; kill -KILL $$; }; exec sleep 30", 10, 5, "was killed by signal 9 (Killed)"},
        {"[ $RANK = 0 ] && { sleep 0.2; exit 1; }; trap '' TERM; exec sleep 30", 0.5, 5,
         "still running 0.5 s after the stop: killed"},
        {"[ $RANK = 1 ] && { sleep 0.2; exit 1; }; [ $RANK = 2 ] && kill -STOP $$; exec sleep 30", 10, 2,
         "tunegraph: rank 1 of 3 (pid"},
    };
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double took;
        char *said = NULL;
        const int rc = supervise(dir, cases[k].script, 3, cases[k].grace_s, &took, &said);
        CHECK(rc == 1 && took < cases[k].at_most_s && said && strstr(said, cases[k].says),
              "case %zu: status %d after %.2f s (at most %.1f), stderr lacks '%s': %s", k, rc, took,
              cases[k].at_most_s, cases[k].says, said ? said : "(none)");
        if (k == 0)
            CHECK(said && strstr(said, "exited with status 3; stopping the other ranks"), "case 0: %s", said ? said : "");
        free(said);
    }
}

/* ---- the CLI's ranks, as processes ------------------------------------------------------ */

/* Runs the suite's CLI as a process with `args`, its stdout and stderr into `log`; its exit
 * status (-1: could not run). */
/* CPU ranks start under mpirun as tests/test_comm_mpi.c starts its own: through shared
 * memory alone (no network in a container), and an ASan build's ranks leave Open MPI's own
 * leaks aside (tests/lsan-mpi.supp). */
#define MPI_TEST_ENV                                                                                                   \
    "LSAN_OPTIONS=suppressions=tests/lsan-mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0 "                      \
    "OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 "

static int cli_process(const char *args, const char *log) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, MPI_TEST_ENV "%s %s > %s 2>&1", tg_test_cli(), args, log);
    const int st = system(cmd);
    return st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

/* The step lines' "loss" and "grad_norm" fields of a metrics file, in order, as written
 * (%.9g: the float itself), joined with spaces into out. 0, or -1. */
static int step_numbers(const char *path, char *out, size_t cap) {
    char *text = tg_test_read_file(path, NULL);
    if (!text) return -1;
    size_t used = 0;
    out[0] = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "{\"step\": ", 9)) continue;
        const char *loss = strstr(line, "\"loss\": "), *norm = strstr(line, "\"grad_norm\": ");
        if (!loss || !norm) continue;
        int n = snprintf(out + used, cap - used, "%.*s %.*s ", (int)strcspn(loss + 8, ","), loss + 8,
                         (int)strcspn(norm + 13, ","), norm + 13);
        if (n < 0 || (size_t)n >= cap - used) break;
        used += (size_t)n;
    }
    free(text);
    return used ? 0 : -1;
}

/* Whether two files hold the same bytes. */
static int same_bytes(const char *a, const char *b) {
    long na = 0, nb = 0;
    char *x = tg_test_read_file(a, &na), *y = tg_test_read_file(b, &nb);
    const int same = x && y && na == nb && !memcmp(x, y, (size_t)na);
    free(x), free(y);
    return same;
}

/* `run --nproc N` trains as N replica threads do, bit for bit: every step's loss and
 * gradient norm, and the weights saved by rank 0. */
static void ranks_match_threads(const char *device, int n) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    const char *common = "examples/demo-classify.job --set steps=6 --set batch=4 --set seq=16 --set warmup_steps=1";
    char args[2048], log[700], threads[2048], procs[2048];
    snprintf(args, sizeof args, "run %s --device %s --set data_parallel=%d --metrics %s/threads.jsonl --save "
             "%s/threads.safetensors", common, device, n, dir, dir);
    snprintf(log, sizeof log, "%s/threads.log", dir);
    char *said;
    if (!CHECK(cli_process(args, log) == 0, "%s: %s", args, (said = tg_test_read_file(log, NULL)) ? said : "")) {
        free(said);
        return;
    }
    snprintf(args, sizeof args, "run %s --device %s --nproc %d --metrics %s/procs.jsonl --save %s/procs.safetensors",
             common, device, n, dir, dir);
    snprintf(log, sizeof log, "%s/procs.log", dir);
    if (!CHECK(cli_process(args, log) == 0, "%s: %s", args, (said = tg_test_read_file(log, NULL)) ? said : "")) {
        free(said);
        return;
    }
    said = tg_test_read_file(log, NULL);
    CHECK(said && strstr(said, "replicas (a process each)"), "%s --nproc %d: %s", device, n, said ? said : "");
    free(said);
    char path[700];
    snprintf(path, sizeof path, "%s/threads.jsonl", dir);
    const int read_threads = step_numbers(path, threads, sizeof threads);
    snprintf(path, sizeof path, "%s/procs.jsonl", dir);
    const int read_procs = step_numbers(path, procs, sizeof procs);
    CHECK(!read_threads && !read_procs && !strcmp(threads, procs), "%s, %d ranks: losses and gradient norms\n  threads: "
          "%s\n  processes: %s", device, n, threads, procs);
    char a[700], b[700];
    snprintf(a, sizeof a, "%s/threads.safetensors", dir);
    snprintf(b, sizeof b, "%s/procs.safetensors", dir);
    CHECK(same_bytes(a, b), "%s, %d ranks: the saved weights differ from the threads'", device, n);
}

TG_TEST(test_cli_nproc_matches_threads) {
    if (tg_test_device()) {
        if (tg_cuda_device_count() < 2) {
            printf("  (skipped: one process per GPU needs 2 GPUs, %d here)\n", tg_cuda_device_count());
            return;
        }
        /* cuBLASLt's algorithms as its heuristic picks them: the timing pass may choose
         * others from one run to the next, which round differently. */
        setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
        ranks_match_threads("cuda", 2);
        if (tg_cuda_device_count() >= 4) ranks_match_threads("cuda", 4);
        unsetenv("TUNEGRAPH_GEMM_TUNE");
        return;
    }
    if (!tg_cpu_comm_mpi_built()) {
        printf("  (skipped: this build has no MPI)\n");
        return;
    }
    ranks_match_threads("cpu", 2);
    ranks_match_threads("cpu", 4);
}

/* A /proc file (whose size stat does not give): its bytes, NUL-terminated, into a malloc'd
 * buffer; NULL when it cannot be read. */
static char *read_proc_file(const char *path, long *len) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    for (ssize_t got; buf && (got = read(fd, buf + n, cap - n)) > 0;) {
        n += (size_t)got;
        if (n == cap) {
            char *more = realloc(buf, 2 * cap + 1);
            if (!more) free(buf);
            buf = more, cap *= 2;
        }
    }
    close(fd);
    if (buf) buf[n] = 0, *len = (long)n;
    return buf;
}

/* The processes whose environment holds `mark` and, if rank >= 0, OMPI_COMM_WORLD_RANK=rank:
 * the first one's pid (0: none), and how many there are. */
static pid_t marked_process(const char *mark, int rank, int *count) {
    DIR *d = opendir("/proc");
    pid_t found = 0;
    *count = 0;
    if (!d) return 0;
    char want_rank[64];
    snprintf(want_rank, sizeof want_rank, "OMPI_COMM_WORLD_RANK=%d", rank);
    for (struct dirent *e; (e = readdir(d));) {
        const int pid = atoi(e->d_name);
        if (pid <= 0) continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/environ", pid);
        long n = 0;
        char *env = read_proc_file(path, &n);
        int has_mark = 0, has_rank = rank < 0;
        for (long at = 0; env && at < n; at += (long)strlen(env + at) + 1) {
            has_mark |= !strcmp(env + at, mark);
            has_rank |= !strcmp(env + at, want_rank);
        }
        free(env);
        if (has_mark && has_rank) {
            if (!found) found = pid;
            (*count)++;
        }
    }
    closedir(d);
    return found;
}

/* The suite's CLI started as a process with `args` (after the program's name) and
 * `mark` in its environment (which its ranks inherit), TUNEGRAPH_STEP_TIMEOUT_S=timeout_s
 * and MPI as MPI_TEST_ENV sets it, its stdout and stderr into `log`: its pid, or -1. */
static pid_t start_marked(char *mark, const char *timeout_s, const char *log, char *const args[]) {
    fflush(stdout);
    fflush(stderr);
    const pid_t run = fork();
    if (run == 0) {
        putenv(mark);
        setenv("TUNEGRAPH_STEP_TIMEOUT_S", timeout_s, 1);
        setenv("LSAN_OPTIONS", "suppressions=tests/lsan-mpi.supp:print_suppressions=0:fast_unwind_on_malloc=0", 1);
        setenv("OMPI_MCA_btl", "self,vader", 1), setenv("OMPI_MCA_pml", "ob1", 1);
        const int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, STDOUT_FILENO), dup2(fd, STDERR_FILENO), close(fd);
        char *argv[40] = {(char *)tg_test_cli()};
        for (int k = 0; args[k] && k < 38; k++) argv[k + 1] = args[k];
        execv(tg_test_cli(), argv);
        _exit(127);
    }
    return run;
}

/* Waits up to limit_s for `run` to end (killing it past that): its wait status into
 * *status, the seconds it took from t0 (-1 when it had to be killed). */
static double wait_ended(pid_t run, double t0, double limit_s, int *status) {
    double took = -1;
    for (;;) {
        const pid_t done = waitpid(run, status, WNOHANG);
        took = tg_wall_s() - t0;
        if (done == run) return took;
        if (took > limit_s) break;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    kill(run, SIGKILL);
    waitpid(run, status, 0);
    return -1;
}

/* How many processes marked `mark` are left, half a second on; they are killed (nothing may
 * outlive the test). */
static int left_running(const char *mark) {
    nanosleep(&(struct timespec){0, 500 * 1000 * 1000}, NULL);
    int count = 0, n;
    marked_process(mark, -1, &count);
    for (pid_t p; count && (p = marked_process(mark, -1, &n));) kill(p, SIGKILL), waitpid(p, NULL, WNOHANG);
    return count;
}

/* A run of 2 CPU ranks under mpirun (`run --nproc 2 --device cpu`) whose rank 1 is killed
 * (SIGKILL) or stopped (SIGSTOP) mid-run ends, every rank with it, within `at_most_s`, with
 * a message; the time to exit is printed. */
static void rank_fault(int sig, const char *timeout_s, double at_most_s, const char *says) {
    char dir[512], log[700], mark[64];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    snprintf(log, sizeof log, "%s/fault.log", dir);
    snprintf(mark, sizeof mark, "TG_TEST_FAULT_MARK=%d-%d", (int)getpid(), sig);
    char *args[] = {"run", "examples/demo-classify.job", "--set", "steps=1000000", "--set", "batch=4", "--set",
                    "seq=16", "--set", "log_every=100", "--device", "cpu", "--nproc", "2", NULL};
    const pid_t run = start_marked(mark, timeout_s, log, args);
    REQUIRE(run >= 0, "fork");
    /* Rank 1 up and training: its process, then a second for its steps. */
    pid_t victim = 0;
    int count = 0;
    for (int k = 0; k < 400 && !victim; k++) {
        victim = marked_process(mark, 1, &count);
        if (!victim) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    nanosleep(&(struct timespec){1, 500 * 1000 * 1000}, NULL);
    int status = -1;
    double took = -1;
    if (CHECK(victim > 0, "rank 1 never started (%s)", log)) {
        kill(victim, sig);
        took = wait_ended(run, tg_wall_s(), 120, &status);
    } else {
        wait_ended(run, tg_wall_s(), 0, &status);
    }
    count = left_running(mark);
    char *said = tg_test_read_file(log, NULL);
    printf("  (2 CPU ranks, SIG%s to rank 1: every rank ended %.2f s after it)\n", sig == SIGKILL ? "KILL" : "STOP", took);
    CHECK(took >= 0 && took < at_most_s && WIFEXITED(status) && WEXITSTATUS(status) != 0 && count == 0,
          "SIG%d to rank 1: exit %d after %.2f s (at most %.0f), %d processes left", sig,
          WIFEXITED(status) ? WEXITSTATUS(status) : -1, took, at_most_s, count);
    CHECK(said && strstr(said, says), "the run's output lacks '%s': %s", says, said ? said : "(none)");
    free(said);
}

TG_TEST(test_cli_nproc_cpu_rank_faults) {
    if (tg_test_device() || !tg_cpu_comm_mpi_built()) {
        printf("  (skipped: %s)\n", tg_test_device() ? "the CPU ranks' test" : "this build has no MPI");
        return;
    }
    rank_fault(SIGKILL, "60", 30, "mpirun");
    rank_fault(SIGSTOP, "2", 30, "rank(s) 1");
}

/* ZeRO-1's checkpoints from rank processes: every rank's optimizer slice gathered into rank
 * 0's file, which is the replica threads' file byte for byte; rank processes resumed from
 * its first checkpoint end where the uninterrupted run ended (weights and last checkpoint
 * byte for byte). */
static void zero_checkpoints_match_threads(const char *device) {
    char dir[512], args[2048], log[700], a[700], b[700];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    const char *common = "examples/demo-classify.job --set steps=4 --set batch=4 --set seq=16 --set warmup_steps=1 "
                         "--set zero_stage=1 --set checkpoint_every=2";
    static const char *const runs[3] = {"--set data_parallel=2 --checkpoint-dir %s/threads --save %s/threads.st",
                                        "--nproc 2 --checkpoint-dir %s/procs --save %s/procs.st",
                                        "--nproc 2 --resume %s/resumed --save %s/resumed.st"};
    for (int k = 0; k < 3; k++) {
        if (k == 2) { /* the processes' first checkpoint alone, in a folder of its own */
            char cmd[1600];
            snprintf(cmd, sizeof cmd, "mkdir -p %s/resumed && cp %s/procs/step-000002.tgckpt %s/resumed/", dir, dir, dir);
            REQUIRE(system(cmd) == 0, "%s", cmd);
        }
        char extra[1200];
        snprintf(extra, sizeof extra, runs[k], dir, dir);
        snprintf(args, sizeof args, "run %s --device %s %s", common, device, extra);
        snprintf(log, sizeof log, "%s/run%d.log", dir, k);
        char *said = NULL;
        if (!CHECK(cli_process(args, log) == 0, "%s: %s", args, (said = tg_test_read_file(log, NULL)) ? said : "")) {
            free(said);
            return;
        }
    }
    static const char *const same[][2] = {{"threads/step-000002.tgckpt", "procs/step-000002.tgckpt"},
                                          {"threads/step-000004.tgckpt", "procs/step-000004.tgckpt"},
                                          {"threads.st", "procs.st"},
                                          {"threads/step-000004.tgckpt", "resumed/step-000004.tgckpt"},
                                          {"threads.st", "resumed.st"}};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        snprintf(a, sizeof a, "%s/%s", dir, same[k][0]);
        snprintf(b, sizeof b, "%s/%s", dir, same[k][1]);
        CHECK(same_bytes(a, b), "%s: %s and %s differ", device, same[k][0], same[k][1]);
    }
}

TG_TEST(test_cli_nproc_zero_checkpoints) {
    if (tg_test_device()) {
        if (tg_cuda_device_count() < 2) {
            printf("  (skipped: one process per GPU needs 2 GPUs, %d here)\n", tg_cuda_device_count());
            return;
        }
        setenv("TUNEGRAPH_GEMM_TUNE", "0", 1); /* as in test_cli_nproc_matches_threads */
        zero_checkpoints_match_threads("cuda");
        unsetenv("TUNEGRAPH_GEMM_TUNE");
        return;
    }
    if (!tg_cpu_comm_mpi_built()) {
        printf("  (skipped: this build has no MPI)\n");
        return;
    }
    zero_checkpoints_match_threads("cpu");
}

/* This program's file: resolved, or a message naming the link and the cause. */
TG_TEST(test_launch_self_path) {
    tg_err err = {{0}};
    char *exe = launch_self_path("/proc/self/exe", &err);
    CHECK(exe && exe[0] == '/', "this program's file: %s", exe ? exe : err.msg);
    free(exe);
    char link[700];
    snprintf(link, sizeof link, "%s/gone/exe", tg_test_tmpdir());
    CHECK(launch_self_path(link, &err) == NULL, "a link that leads nowhere resolved");
    char want[900];
    snprintf(want, sizeof want, "cannot find this program's file (%s): No such file or directory", link);
    CHECK(!strcmp(err.msg, want), "message: %s", err.msg);
}

/* A SIGTERM to the supervisor goes to every rank, which may take its time to stop (past
 * the grace, which is for failures) and end by it: no failure is reported, and the
 * supervisor's status is the signal's. */
TG_TEST(test_launch_ranks_pass_on_a_stop) {
    char script[1200], dir[512];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    /* Rank 1 signals the supervisor once every rank has its trap set (a rank that has not
     * yet would die by the signal unrecorded). */
    snprintf(script, sizeof script,
             "trap 'kill $!; sleep 0.5; echo stopped > %s/stopped-$RANK; trap - TERM; kill -TERM $$' TERM; "
             "touch %s/ready-$RANK; sleep 30 & "
             "if [ $RANK = 1 ]; then while [ ! -e %s/ready-0 ] || [ ! -e %s/ready-2 ]; do sleep 0.01; done; "
             "kill -TERM $PPID; fi; wait",
             dir, dir, dir, dir);
    double took;
    char *said = NULL;
    const int rc = supervise(dir, script, 3, 0.1, &took, &said);
    CHECK(rc == 128 + SIGTERM && launch_stopped_by() == SIGTERM && took < 10, "status %d (stopped by %d) after %.2f s: %s",
          rc, launch_stopped_by(), took, said ? said : "");
    CHECK(said && !strstr(said, "stopping the other ranks") && !strstr(said, "killed"), "the supervisor said: %s",
          said ? said : "(none)");
    for (int r = 0; r < 3; r++) {
        char path[700];
        snprintf(path, sizeof path, "%s/stopped-%d", dir, r);
        char *text = tg_test_read_file(path, NULL);
        CHECK(text && !strcmp(text, "stopped\n"), "rank %d did not stop as asked", r);
        free(text);
    }
    free(said);
}

/* How many of the files dir/prefix-0 .. prefix-(n-1) exist, once all do or timeout_s has
 * passed. */
static int rank_files(const char *dir, const char *prefix, int n, double timeout_s) {
    const double t0 = tg_wall_s();
    for (;;) {
        int found = 0;
        for (int r = 0; r < n; r++) {
            char path[700];
            snprintf(path, sizeof path, "%s/%s-%d", dir, prefix, r);
            found += access(path, F_OK) == 0;
        }
        if (found == n || tg_wall_s() - t0 > timeout_s) return found;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
}

/* The ranks run in process groups of their own (a signal to the supervisor's group, as
 * timeout(1) or the terminal sends, reaches them once, through the supervisor, where twice
 * would stop them without their checkpoint), and end when the supervisor dies: a
 * supervisor killed by SIGKILL leaves no rank running. */
TG_TEST(test_launch_ranks_own_group_and_end_with_the_supervisor) {
    char script[1200], dir[512];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    snprintf(script, sizeof script,
             "trap 'kill $!; echo ended > %s/ended-$RANK; exit 0' TERM; "
             "awk '{print $5}' /proc/$$/stat > %s/group-$RANK.tmp && mv %s/group-$RANK.tmp %s/group-$RANK; "
             "sleep 30 & wait",
             dir, dir, dir, dir);
    const pid_t sup = fork();
    if (sup == 0) {
        char *argv[] = {"sh", "-c", script, NULL};
        _exit(launch_ranks("/bin/sh", argv, 2, 5.0));
    }
    REQUIRE(sup > 0, "fork: %s", strerror(errno));
    rank_files(dir, "group", 2, 5.0);
    for (int r = 0; r < 2; r++) {
        char path[700];
        snprintf(path, sizeof path, "%s/group-%d", dir, r);
        char *text = tg_test_read_file(path, NULL);
        const long group = text ? atol(text) : -1;
        CHECK(group > 0 && group != (long)getpgrp() && group != (long)sup, "rank %d's process group %ld (the supervisor's %ld)",
              r, group, (long)getpgid(sup));
        free(text);
    }
    kill(sup, SIGKILL);
    waitpid(sup, NULL, 0);
    const double t0 = tg_wall_s();
    const int ended = rank_files(dir, "ended", 2, 10.0);
    CHECK(ended == 2, "%d of 2 ranks ended after their supervisor was killed (%.1f s)", ended, tg_wall_s() - t0);
}

/* mpirun's stand-in: a SIGTERM or SIGINT to the supervisor reaches it as SIGUSR1 or SIGUSR2
 * (signals mpirun forwards to the ranks); its own exit status is the supervisor's. (mpirun
 * not on PATH: tests/test_cli_main_errors.c.) */
TG_TEST(test_launch_mpirun_passes_signals_on) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    static const struct {
        int sig;
        const char *got;
    } cases[] = {{SIGTERM, "USR1"}, {SIGINT, "USR2"}};
    for (int k = 0; k < 2; k++) {
        char script[1200];
        snprintf(script, sizeof script,
                 "trap 'kill $!; echo USR1 > %s/got; exit 0' USR1; trap 'kill $!; echo USR2 > %s/got; exit 0' USR2; "
                 "sleep 30 & "
                 "kill -%s $PPID; wait",
                 dir, dir, cases[k].sig == SIGTERM ? "TERM" : "INT");
        char *argv[] = {"sh", "-c", script, NULL};
        const int rc = launch_mpirun(argv, 2);
        char path[700];
        snprintf(path, sizeof path, "%s/got", dir);
        char *text = tg_test_read_file(path, NULL);
        CHECK(rc == 128 + cases[k].sig && launch_stopped_by() == cases[k].sig && text && !strncmp(text, cases[k].got, 4),
              "signal %d: status %d, the stand-in got %s", cases[k].sig, rc, text ? text : "nothing");
        free(text);
        remove(path);
    }
    char *argv[] = {"sh", "-c", "exit 3", NULL};
    CHECK(launch_mpirun(argv, 2) == 3 && launch_stopped_by() == 0, "a stand-in's own status");
}

/* The folder's one checkpoint file: its step (-1: none, -2: more than one). */
static int only_checkpoint(const char *folder) {
    DIR *d = opendir(folder);
    int step = -1;
    for (struct dirent *e; d && (e = readdir(d));) {
        int s = -1;
        if (sscanf(e->d_name, "step-%d.tgckpt", &s) != 1) continue;
        step = step == -1 ? s : -2;
    }
    if (d) closedir(d);
    return step;
}

/* How many times `what` occurs in `text`. */
static int occurrences(const char *text, const char *what) {
    int n = 0;
    for (const char *at = text; at && (at = strstr(at, what)); at += strlen(what)) n++;
    return n;
}

/* `run --nproc 2 --device cpu` (ZeRO-1) whose supervisor gets SIGTERM mid-run: every rank
 * stops at one step, rank 0 alone writes the one checkpoint there (every rank's optimizer
 * slice gathered into it) and says so, every process ends, the supervisor by the signal;
 * ranks resumed from that checkpoint end with the uninterrupted run's weights, byte for
 * byte. */
TG_TEST(test_cli_nproc_cpu_stop_by_signal) {
    if (tg_test_device() || !tg_cpu_comm_mpi_built()) {
        printf("  (skipped: %s)\n", tg_test_device() ? "the CPU ranks' test" : "this build has no MPI");
        return;
    }
    enum { STEPS = 600 };
    char dir[512], log[700], args[2048], mark[64], steps[32], ck[700], full[700], resumed[700];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    snprintf(steps, sizeof steps, "steps=%d", STEPS);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(full, sizeof full, "%s/full.st", dir);
    snprintf(resumed, sizeof resumed, "%s/resumed.st", dir);
    const char *common = "examples/demo-classify.job --set batch=4 --set seq=16 --set warmup_steps=1 --set zero_stage=1 "
                         "--set log_every=1 --device cpu --nproc 2";
    snprintf(args, sizeof args, "run %s --set %s --save %s", common, steps, full);
    snprintf(log, sizeof log, "%s/full.log", dir);
    char *said = NULL;
    if (!CHECK(cli_process(args, log) == 0, "%s: %s", args, (said = tg_test_read_file(log, NULL)) ? said : "")) {
        free(said);
        return;
    }
    /* Stopped once rank 0 has taken 5 steps. */
    snprintf(log, sizeof log, "%s/stopped.log", dir);
    snprintf(mark, sizeof mark, "TG_TEST_STOP_MARK=%d", (int)getpid());
    char *run_args[] = {"run", "examples/demo-classify.job", "--set", "batch=4", "--set", "seq=16", "--set",
                        "warmup_steps=1", "--set", "zero_stage=1", "--set", "log_every=1", "--device", "cpu",
                        "--nproc", "2", "--set", steps, "--checkpoint-dir", ck, NULL};
    const pid_t run = start_marked(mark, "60", log, run_args);
    REQUIRE(run >= 0, "fork");
    char want[64];
    snprintf(want, sizeof want, "step 5/%d", STEPS);
    int up = 0;
    for (int k = 0; k < 1200 && !up; k++) {
        char *text = tg_test_read_file(log, NULL);
        up = text && strstr(text, want);
        free(text);
        if (!up) nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    int status = -1;
    double took = -1;
    if (CHECK(up, "rank 0 never took 5 steps (%s)", log)) {
        kill(run, SIGTERM);
        took = wait_ended(run, tg_wall_s(), 120, &status);
    } else {
        wait_ended(run, tg_wall_s(), 0, &status);
    }
    const int left = left_running(mark);
    said = tg_test_read_file(log, NULL);
    const int step = only_checkpoint(ck);
    printf("  (2 CPU ranks, SIGTERM to the supervisor: stopped at step %d of %d, ended %.2f s after it)\n", step, STEPS,
           took);
    CHECK(took >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM && left == 0,
          "the supervisor ended %s %d after %.2f s, %d processes left: %s", WIFSIGNALED(status) ? "by signal" : "with",
          WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), took, left, said ? said : "");
    CHECK(step >= 5 && step < STEPS, "the checkpoint folder holds step %d (-1: none, -2: more than one)", step);
    char line[1600];
    snprintf(line, sizeof line,
             "tunegraph: interrupted by SIGTERM after step %d of %d; checkpoint %s/step-%06d.tgckpt (resume with "
             "--resume %s)\n",
             step, STEPS, ck, step, ck);
    CHECK(said && occurrences(said, "tunegraph: interrupted by") == 1 && strstr(said, line) &&
              strstr(said, "tunegraph: SIGTERM: the 2 ranks stopped and have ended\n"),
          "the output lacks rank 0's one line '%s' or the supervisor's: %s", line, said ? said : "(none)");
    free(said);
    if (step < 0) return;
    snprintf(args, sizeof args, "run %s --set %s --resume %s --save %s", common, steps, ck, resumed);
    snprintf(log, sizeof log, "%s/resumed.log", dir);
    if (!CHECK(cli_process(args, log) == 0, "%s: %s", args, (said = tg_test_read_file(log, NULL)) ? said : "")) {
        free(said);
        return;
    }
    CHECK(same_bytes(full, resumed), "resumed from step %d, the ranks end with other weights than the uninterrupted "
          "run's", step);
}

/* The weights of two safetensors files, every tensor of `a` with `b`'s of its name, as one
 * vector: tg_rel_err's relative difference (INFINITY when they do not pair up). */
static double weights_rel_err(const char *a, const char *b) {
    tg_safetensors x, y;
    tg_err err;
    if (!CHECK(tg_st_open(a, &x, &err) == 0, "%s", err.msg)) return INFINITY;
    if (!CHECK(tg_st_open(b, &y, &err) == 0, "%s", err.msg)) {
        tg_st_close(&x);
        return INFINITY;
    }
    int64_t n = 0;
    for (int k = 0; k < x.n; k++) n += tg_st_numel(&x.entries[k]);
    float *u = malloc((size_t)(n ? n : 1) * sizeof *u), *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    int paired = x.n == y.n && u && v;
    int64_t at = 0;
    for (int k = 0; k < x.n && paired; k++) {
        const tg_st_entry *e = &x.entries[k], *f = NULL;
        for (int j = 0; j < y.n && !f; j++)
            if (!strcmp(y.entries[j].name, e->name)) f = &y.entries[j];
        const int64_t m = tg_st_numel(e);
        paired = f && tg_st_numel(f) == m && tg_st_read_f32(&x, e, u + at, m, &err) == 0 &&
                 tg_st_read_f32(&y, f, v + at, m, &err) == 0;
        at += m;
    }
    const double rel = paired ? tg_rel_err(u, v, n) : INFINITY;
    free(u), free(v);
    tg_st_close(&x), tg_st_close(&y);
    return rel;
}

/* tiny-bert without dropout: each replica draws its own masks, one trainer others. */
static const char no_dropout_bert[] =
    "{\"architectures\": [\"BertForMaskedLM\"], \"attention_probs_dropout_prob\": 0.0, \"hidden_act\": \"gelu\", "
    "\"hidden_dropout_prob\": 0.0, \"hidden_size\": 32, \"initializer_range\": 0.02, \"intermediate_size\": 64, "
    "\"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 64, \"model_type\": \"bert\", \"num_attention_heads\": 4, "
    "\"num_hidden_layers\": 2, \"pad_token_id\": 0, \"type_vocab_size\": 2, \"vocab_size\": 128}";

/* `run --nproc 2 --device cpu` (MPI) of `batch` rows a rank trains as one process on the
 * whole batch of 2 x batch rows does, within the threads' tolerance against one trainer
 * (tests/test_data_parallel.c: 1e-5 relative over the parameters on the CPU). */
TG_TEST(test_cli_nproc_matches_one_process_on_the_whole_batch) {
    if (tg_test_device() || !tg_cpu_comm_mpi_built()) {
        printf("  (skipped: %s)\n", tg_test_device() ? "the CPU ranks' test" : "this build has no MPI");
        return;
    }
    char dir[4096], model[4200], path[4300], args[9000], log[4300], procs[4300], one[4300];
    REQUIRE(realpath(tg_test_tmpdir(), dir), "the test's folder"); /* PATH_MAX bytes */
    snprintf(model, sizeof model, "%s/tiny-bert-no-dropout", dir);
    snprintf(path, sizeof path, "%s/config.json", model);
    REQUIRE(mkdir(model, 0755) == 0 && tg_test_write_file(path, no_dropout_bert) == 0, "%s", path);
    snprintf(procs, sizeof procs, "%s/procs.st", dir);
    snprintf(one, sizeof one, "%s/one.st", dir);
    static const char *const runs[2] = {"--set batch=2 --nproc 2 --save %s", "--set batch=4 --save %s"};
    for (int k = 0; k < 2; k++) {
        char extra[4400];
        snprintf(extra, sizeof extra, runs[k], k ? one : procs);
        snprintf(args, sizeof args,
                 "run examples/demo-classify.job --set model=%s --set steps=6 --set seq=16 --set warmup_steps=1 "
                 "--device cpu %s",
                 model, extra);
        snprintf(log, sizeof log, "%s/run%d.log", dir, k);
        char *said = NULL;
        if (!CHECK(cli_process(args, log) == 0, "%s: %s", args, (said = tg_test_read_file(log, NULL)) ? said : "")) {
            free(said);
            return;
        }
    }
    const double rel = weights_rel_err(procs, one);
    CHECK(rel <= 1e-5, "2 ranks of 2 rows against one process of 4: parameters differ by %.3g (relative)", rel);
    printf("  (2 CPU ranks against one process on the whole batch: %.3g relative)\n", rel);
}
