/* `tunegraph run`, `inspect` and `compile` (cli/main.c) when what they write cannot be
 * written: the metrics file on a full device (a step's line, the summary line, the profile,
 * and the failed run's metrics that cannot be put in place), the metrics file's stream that
 * cannot be opened, inspect's standard output on a full device, compile's standard output
 * closed, and the run's last allocations (the metrics' step line, the checkpoint, the
 * profile's op times) failed one at a time. Each case asserts the exit status and what
 * stderr says. The CLI runs in this process (tests/test_cli_metrics.c compiles it in). */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/executor.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/libc_faults.h"


#define DEMO "examples/demo-classify.job"

static int has(const char *text, const char *what) { return text && strstr(text, what); }

/* A plan of the demo with small batches, compiled into dir/p.tgp. */
static void compile_plan(const char *dir) {
    char line[1024];
    snprintf(line, sizeof line, "compile " DEMO " -o %s/p.tgp --set batch=4 --set seq=16 --set steps=1", dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "%s: %d %s", line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* The metrics on a full device: 30 steps' lines overflow the stream's buffer, so a step's
 * line cannot be written; the loop stops there (no closing lines), and the failed run's
 * metrics cannot be put in place either, which the run says too. */
TG_TEST(test_cli_main_metrics_on_a_full_device) {
    if (tg_cuda_built()) return;
    const char *dir = tg_test_tmpdir();
    compile_plan(dir);
    char line[1024];
    snprintf(line, sizeof line, "run %s/p.tgp --set steps=30 --metrics /dev/full", dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 &&
              has(r.err, "\ntunegraph: /dev/full: cannot write a line of the metrics file\n"
                         "tunegraph: /dev/full: cannot write the metrics file (write: No space left on device)\n") &&
              !has(r.err, "\ntrained ") && !has(r.err, "\nstep 30/30 "),
          "%s: %d %s", line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* --profile writes a line per op kind and per op into the metrics: on a full device the
 * profile fails the run after the training, and the metrics cannot be put in place. */
TG_TEST(test_cli_main_profile_on_a_full_device) {
    if (tg_cuda_built()) return;
    const char *dir = tg_test_tmpdir();
    compile_plan(dir);
    char line[1024];
    snprintf(line, sizeof line, "run %s/p.tgp --set steps=2 --profile --metrics /dev/full", dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 &&
              has(r.err, "\ntunegraph: cannot write the profile to the metrics file\n"
                         "tunegraph: /dev/full: cannot write the metrics file (write: No space left on device)\n") &&
              has(r.err, "profile (ops launched one by one, mean of ") && !has(r.err, "\ntrained "),
          "%s: %d %s", line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* The metrics file's stream cannot be opened (fdopen fails): exit 1 naming the file, no
 * training, and no metrics file left behind. */
TG_TEST(test_cli_main_metrics_stream_fails) {
    if (tg_cuda_built()) return;
    const char *dir = tg_test_tmpdir();
    compile_plan(dir);
    char line[1024], metrics[800];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(line, sizeof line, "run %s/p.tgp --metrics %s", dir, metrics);
    tg_test_fail_fdopen(1);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    tg_test_fail_fdopen(0);
    char want[900];
    snprintf(want, sizeof want, "tunegraph: %s: out of memory\n", metrics);
    struct stat st;
    CHECK(r.status == 1 && r.err && !strcmp(r.err, want), "%s: %d '%s'", line, r.status, r.err ? r.err : "");
    CHECK(stat(metrics, &st) != 0, "%s was left behind", metrics);
    tg_cli_run_free(&r);
}

/* inspect's output on a full device: exit 1, "cannot write the output". */
TG_TEST(test_cli_main_inspect_to_a_full_device) {
    if (tg_cuda_built()) return;
    const char *dir = tg_test_tmpdir();
    compile_plan(dir);
    char line[1024];
    snprintf(line, sizeof line, "inspect %s/p.tgp", dir);
    tg_cli_run r = tg_test_cli_line(dir, line, "/dev/full");
    CHECK(r.status == 1 && r.err && !strcmp(r.err, "tunegraph: inspect: cannot write the output\n"), "%s: %d '%s'",
          line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* compile with standard output closed: its plan is not standard output's file (fstat
 * fails), so the compiled line goes to standard output (lost), never to stderr, and the
 * plan is written. */
TG_TEST(test_cli_main_compile_with_stdout_closed) {
    if (tg_cuda_built()) return;
    const char *dir = tg_test_tmpdir();
    char line[1024], plan[800];
    snprintf(plan, sizeof plan, "%s/q.tgp", dir);
    snprintf(line, sizeof line, "compile " DEMO " -o %s --set steps=1", plan);
    tg_cli_run r = tg_test_cli_line(dir, line, "-");
    struct stat st;
    CHECK(r.status == 0 && r.err && !strcmp(r.err, ""), "%s: %d '%s'", line, r.status, r.err ? r.err : "");
    CHECK(stat(plan, &st) == 0 && st.st_size > 0, "%s: no plan", line);
    tg_cli_run_free(&r);
}

/* The checkpoint folder's `latest` is a folder: the first checkpoint's pointer cannot
 * replace it, so the run stops at that step with exit 1 and the metrics end with the error. */
TG_TEST(test_cli_main_checkpoint_pointer_fails) {
    if (tg_cuda_built()) return;
    const char *dir = tg_test_tmpdir();
    compile_plan(dir);
    char line[1024], latest[800], metrics[800];
    snprintf(latest, sizeof latest, "%s/ck/latest", dir);
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(line, sizeof line, "%s/ck", dir);
    REQUIRE(mkdir(line, 0755) == 0 && mkdir(latest, 0755) == 0, "%s", latest);
    snprintf(line, sizeof line, "run %s/p.tgp --set steps=2 --set checkpoint_every=1 --checkpoint-dir %s/ck --metrics %s",
             dir, dir, metrics);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    char want[1200];
    snprintf(want, sizeof want, "\ntunegraph: %s: cannot write the checkpoint pointer (rename: Is a directory)\n", latest);
    CHECK(r.status == 1 && has(r.err, want) && !has(r.err, "\ntrained ") && !has(r.err, "\ncheckpoint "), "%s: %d %s",
          line, r.status, r.err ? r.err : "");
    char *m = tg_test_read_file(metrics, NULL);
    snprintf(want, sizeof want, "{\"event\": \"error\", \"message\": \"%s: cannot write the checkpoint pointer", latest);
    CHECK(has(m, want) && has(m, "\"step\": 1,") && !has(m, "\"step\": 2,"), "metrics: %s", m ? m : "(none)");
    free(m);
    tg_cli_run_free(&r);
}

/* The smallest allocation count k for which the run of `line` (failing every allocation
 * after the first k of this thread) gets as far as saying `marker` on stderr; k is then the
 * index of the first allocation after that point. `total` runs to the end. */
static long allocations_before(const char *dir, const char *line, const char *marker, long total) {
    long lo = 0, hi = total; /* says it at hi, not below lo */
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        tg_alloc_fail_after(mid);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        tg_alloc_fail_after(-1);
        if (has(r.err, marker)) hi = mid;
        else lo = mid + 1;
        tg_cli_run_free(&r);
    }
    return lo;
}

/* The first allocations after the trainer is open (the step times, then the metrics' step
 * line), after the last step (the evaluation's) and after the evaluation (the summary line's) failed one at a time: exit 1 with the
 * out-of-memory message, and the metrics end with it. */
TG_TEST(test_cli_main_run_out_of_memory) {
    if (tg_cuda_built()) return;
    const char *dir = tg_test_tmpdir();
    compile_plan(dir);
    char line[1024], metrics[800];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(line, sizeof line, "run %s/p.tgp --set steps=1 --metrics %s", dir, metrics);
    tg_alloc_fail_after(-1);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(r.status == 0, "%s: %d %s", line, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    const long ready = allocations_before(dir, line, "\ntunegraph: ready in ", total);
    char plain[1024]; /* without metrics: the first allocation after the last step is the evaluation's */
    snprintf(plain, sizeof plain, "run %s/p.tgp --set steps=1", dir);
    tg_alloc_fail_after(-1);
    r = tg_test_cli_line(dir, plain, NULL);
    const long plain_total = tg_alloc_fail_after(-1);
    tg_cli_run_free(&r);
    const long stepped = allocations_before(dir, plain, "\nstep 1/1 loss ", plain_total);
    tg_alloc_fail_only(stepped);
    r = tg_test_cli_line(dir, plain, NULL);
    tg_alloc_fail_after(-1);
    CHECK(r.status == 1 && has(r.err, "\nstep 1/1 loss ") &&
              has(r.err, " ETA 0:00:00\ntunegraph: out of memory for the eval logits\n") && !has(r.err, "\ntrained "),
          "%s, allocation %ld of %ld: %d %s", plain, stepped, plain_total, r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    /* The first allocation once the evaluation is done: the summary line's. */
    const long evaluated = allocations_before(dir, line, "\ntrained 1 steps in ", total);
    remove(metrics);
    tg_alloc_fail_only(evaluated);
    r = tg_test_cli_line(dir, line, NULL);
    tg_alloc_fail_after(-1);
    char want[1000];
    snprintf(want, sizeof want, "\ntunegraph: %s: cannot write the summary line of the metrics file\n", metrics);
    CHECK(r.status == 1 && has(r.err, want) && has(r.err, "\ntrained 1 steps in ") &&
              has(r.err, "\neval on 400 examples: loss "),
          "%s, allocation %ld of %ld: %d %s", line, evaluated, total, r.status, r.err ? r.err : "");
    char *m = tg_test_read_file(metrics, NULL);
    CHECK(has(m, "\"step\": 1,") && has(m, "{\"event\": \"error\", \"message\": \"") && has(m, "cannot write the summary line"),
          "metrics: %s", m ? m : "(none)");
    free(m);
    tg_cli_run_free(&r);
    for (long k = ready; k <= ready + 1; k++) { /* the step times, the metrics' step line */
        remove(metrics);
        tg_alloc_fail_only(k);
        r = tg_test_cli_line(dir, line, NULL);
        tg_alloc_fail_after(-1);
        CHECK(r.status == 1 && has(r.err, " s)\ntunegraph: out of memory\n") && !has(r.err, "\nstep 1/1 ") &&
                  !has(r.err, "\ntrained "),
              "%s, allocation %ld of %ld: %d %s", line, k, total, r.status, r.err ? r.err : "");
        char *m = tg_test_read_file(metrics, NULL);
        CHECK(has(m, "{\"event\": \"error\", \"message\": \"out of memory\"}"), "metrics: %s", m ? m : "(none)");
        free(m);
        tg_cli_run_free(&r);
    }
}

/* Starts the CLI binary with argv (stderr into err_path, checkpoint writes stalled at step
 * `stall`); its pid. */
static pid_t start_cli(char **argv, const char *err_path, const char *stall) {
    char cli[PATH_MAX];
    if (!realpath(tg_test_cli(), cli)) snprintf(cli, sizeof cli, "%s", tg_test_cli());
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        const int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(127);
        dup2(fd, 2);
        setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", stall, 1);
        execv(cli, argv);
        _exit(127);
    }
    return pid;
}

/* SIGTERM while the step-2 checkpoint is written, the metrics on a full device: the run
 * says it was interrupted, then that the metrics (ended with that message) cannot be put
 * in place, and ends by the signal. */
TG_TEST(test_cli_main_interrupted_metrics_on_a_full_device) {
    const char *dir = tg_test_tmpdir();
    char ck[800], err_path[800];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    char *argv[] = {"tunegraph", "run", DEMO, "--device", "cpu", "--set", "steps=4", "--set", "checkpoint_every=2",
                    "--checkpoint-dir", ck, "--metrics", "/dev/full", NULL};
    const pid_t pid = start_cli(argv, err_path, "2");
    REQUIRE(pid > 0, "fork");
    int stalled = 0, status = 0, ended = 0;
    for (int i = 0; i < 12000 && !stalled && !ended; i++) {
        char *text = tg_test_read_file(err_path, NULL);
        stalled = text && strstr(text, "stalled part-written") != NULL;
        free(text);
        ended = !stalled && waitpid(pid, &status, WNOHANG) == pid;
        if (!stalled && !ended) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    kill(pid, stalled ? SIGTERM : SIGKILL);
    if (!ended) waitpid(pid, &status, 0);
    char *said = tg_test_read_file(err_path, NULL);
    REQUIRE(stalled, "the run did not stall at the step-2 checkpoint: %s", said ? said : "");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %#x", status);
    char want[1200];
    snprintf(want, sizeof want,
             " (resume with --resume %s)\ntunegraph: /dev/full: cannot write the metrics file (write: No space left on "
             "device)\n",
             ck);
    const char *said_end = said ? strstr(said, want) : NULL;
    CHECK(said_end && strstr(said, "\ntunegraph: interrupted by SIGTERM after step ") && !strstr(said, "\ntrained "),
          "stderr lacks '%s': %s", want, said ? said : "");
    free(said);
}
