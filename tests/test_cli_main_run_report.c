/* What `tunegraph run` reports as it ends (cli/main.c): the progress lines' ETA as
 * h:mm:ss, the closing summary on stderr and in the metrics (host and loop-thread CPU per
 * step after the first, 0 for a one-step run; the peak memory measured, planned and
 * estimated; the host traces of TUNEGRAPH_HOST_TRACE only with steps after the first), and
 * the ends by a signal: a stop requested while the finished run saves its weights (the run
 * completes, then ends by the signal), and the interruption message of a checkpoint folder
 * with a long path, whole on stderr and in the metrics. The runs take the CPU executor
 * (--device cpu) whatever the suite's device. */
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plan/memory_estimate.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"

int tunegraph_cli_main(int argc, char **argv);
void cli_format_hms(double s, char *buf, size_t len);

#define DEMO "examples/demo-classify.job"

/* Runs tunegraph_cli_main on the words of `line` (split at spaces) with stderr captured
 * into dir/cli-err.txt; its status, and stderr in *said (malloc'd). */
static int cli(const char *dir, const char *line, char **said) {
    char words[4096], *argv[64];
    int argc = 0;
    argv[argc++] = "tunegraph";
    snprintf(words, sizeof words, "%s", line);
    for (char *w = strtok(words, " "); w && argc < 63; w = strtok(NULL, " ")) argv[argc++] = w;
    argv[argc] = NULL;
    char err_path[700];
    snprintf(err_path, sizeof err_path, "%s/cli-err.txt", dir);
    fflush(stderr);
    const int saved_err = dup(STDERR_FILENO);
    const int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    *said = NULL;
    if (saved_err < 0 || fe < 0) return -1;
    dup2(fe, STDERR_FILENO);
    close(fe);
    const int status = tunegraph_cli_main(argc, argv);
    fflush(stderr);
    dup2(saved_err, STDERR_FILENO);
    close(saved_err);
    *said = tg_test_read_file(err_path, NULL);
    return status;
}

/* The last line of a metrics file as an object (NULL when unreadable). */
static json_t *last_metrics_line(const char *path) {
    char *text = tg_test_read_file(path, NULL);
    if (!text) return NULL;
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = 0;
    const char *line = strrchr(text, '\n');
    json_t *o = json_loads(line ? line + 1 : text, 0, NULL);
    free(text);
    return o;
}

static double number(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : -12345;
}

/* The "step K/N ..." line of stderr, copied into line (0 when absent). */
static int step_line(const char *said, int k, int n, char *line, size_t cap) {
    char head[64];
    snprintf(head, sizeof head, "step %d/%d ", k, n);
    for (const char *p = said; p && (p = strstr(p, head)); p++) {
        if (p != said && p[-1] != '\n') continue;
        const char *end = strchr(p, '\n');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        snprintf(line, cap, "%.*s", (int)len, p);
        return 1;
    }
    return 0;
}

/* Whether the line ends with "ETA h:mm:ss" (minutes and seconds below 60); *seconds. */
static int eta_of(const char *line, long *seconds) {
    const char *p = strstr(line, " ETA ");
    int h, m, s, used = 0;
    if (!p || sscanf(p + 5, "%d:%d:%d%n", &h, &m, &s, &used) != 3 || p[5 + used] != 0) return 0;
    *seconds = h * 3600L + m * 60L + s;
    return h >= 0 && m >= 0 && m < 60 && s >= 0 && s < 60 && p[5 + used - 3] == ':' && p[5 + used - 6] == ':';
}

/* The summary's memory line from the summary's numbers (the same measurement). */
static void memory_line(json_t *summary, char *out, size_t cap) {
    char measured[32], planned[32], estimate[32];
    tg_mem_format_bytes((uint64_t)number(summary, "measured_peak_bytes"), measured, sizeof measured);
    tg_mem_format_bytes((uint64_t)number(summary, "planned_peak_bytes"), planned, sizeof planned);
    tg_mem_format_bytes((uint64_t)number(summary, "memory_estimate_bytes"), estimate, sizeof estimate);
    snprintf(out, cap, "\npeak memory on the CPU: measured %s (resident set growth), planned %s (the pools; estimate %s)\n",
             measured, planned, estimate);
}

static int near(double got, double want, double tolerance) { return fabs(got - want) <= tolerance; }

/* The closing lines of stderr against the metrics' summary of the same run (each number
 * within the two roundings): steps, time, losses, tokens/s, median step, CPU per step;
 * padding and batch waits; the evaluation. */
static void check_closing_lines(const char *said, json_t *s, int steps) {
    const char *p = strstr(said, "\ntrained ");
    int n = -1, used = 0;
    double train_s, first, last, tps, median, host, loop, driver = 0;
    /* A CUDA build adds the driver's event thread where it used any CPU. */
    int besides = 0;
    if (p && sscanf(p, "\ntrained %d steps in %lf s: loss %lf -> %lf, %lf tokens/s, median step %lf ms, host CPU %lf "
                       "us/step (training loop thread %lf us%n",
                    &n, &train_s, &first, &last, &tps, &median, &host, &loop, &used) == 8 && used > 0) {
        const char *rest = p + used;
        if (sscanf(rest, "; besides, the CUDA driver's event thread %lf us)\n%n", &driver, &besides) == 1 && besides)
            used += besides;
        else if (!strncmp(rest, ")\n", 2))
            used += 2;
        else
            used = 0;
    } else {
        used = 0;
    }
    CHECK(used > 0 && near(driver, number(s, "driver_thread_cpu_us_per_step"), 0.56) &&
              n == steps && near(train_s, number(s, "train_s"), 0.051) && near(first, number(s, "first_loss"), 6e-5) &&
              near(last, number(s, "final_loss"), 6e-5) && near(tps, number(s, "tokens_per_s"), 0.56) &&
              near(median, number(s, "median_step_ms"), 6e-4) && near(host, number(s, "host_cpu_own_us_per_step"), 0.56) &&
              near(loop, number(s, "loop_cpu_us_per_step"), 0.56),
          "the trained line against the summary: %s", said);
    p = p ? strstr(p, "\nbatches: ") : NULL;
    double pad, wait_ms, share;
    used = 0;
    CHECK(p && sscanf(p, "\nbatches: %lf%% of the token slots padding, waited for %lf ms (%lf%% of the training time)\n%n",
                      &pad, &wait_ms, &share, &used) == 3 && used > 0 &&
              near(pad, 100 * number(s, "padding_fraction"), 0.056) &&
              near(wait_ms, 1e3 * number(s, "batch_wait_s"), 0.101) &&
              near(share, 100 * number(s, "batch_wait_share"), 0.0056),
          "the batches line against the summary: %s", said);
    p = p ? strstr(p, "\neval on ") : NULL;
    double loss, accuracy;
    used = 0;
    CHECK(p && sscanf(p, "\neval on %d examples: loss %lf, accuracy %lf\n%n", &n, &loss, &accuracy, &used) == 3 && used > 0 &&
              n == number(s, "eval_examples") && n == 400 && near(loss, number(s, "eval_loss"), 6e-5) &&
              near(accuracy, number(s, "eval_accuracy"), 6e-5),
          "the eval line against the summary: %s", said);
}

/* The "ready" line: the time from the start to the first step, and its parts (executor and
 * pools, weights, data) in seconds, each at most the whole (to the 0.01 s printed). */
static void check_ready_line(const char *said) {
    const char *p = strstr(said, "\ntunegraph: ready in ");
    double total = -1, parts[3] = {-1, -1, -1};
    int used = 0;
    if (p && sscanf(p, "\ntunegraph: ready in %lf s (executor and pools %lf s, weights %lf s, data %lf s)\n%n", &total,
                    &parts[0], &parts[1], &parts[2], &used) != 4)
        used = 0;
    CHECK(used > 0 && total >= 0 && parts[0] >= 0 && parts[1] >= 0 && parts[2] >= 0 &&
              parts[0] + parts[1] + parts[2] <= total + 0.03,
          "the ready line: total %g, parts %g %g %g: %s", total, parts[0], parts[1], parts[2], said);
}

/* One step: nothing after the first to take CPU time per step from (0, never a division
 * by zero, and no host traces though asked for); the last step's ETA is 0:00:00; the memory
 * measured on the CPU is shown, as the metrics have it. */
TG_TEST(test_cli_main_run_report_one_step) {
    const char *dir = tg_test_tmpdir();
    char line[1024], *said;
    snprintf(line, sizeof line, "run " DEMO " --device cpu --set steps=1 --set log_every=1 --metrics %s/m.jsonl", dir);
    setenv("TUNEGRAPH_HOST_TRACE", "1", 1);
    const int status = cli(dir, line, &said);
    unsetenv("TUNEGRAPH_HOST_TRACE");
    REQUIRE(status == 0 && said, "run: status %d: %s", status, said ? said : "");
    /* The opening line: one length, so no buckets named. */
    static const char opening[] =
        "tunegraph: bert classify on cpu: 2000 examples, batch 16 x seq 48, 1 steps (125 per epoch, last batch: pad)\n";
    CHECK(!strncmp(said, opening, strlen(opening)), "the opening line: %s", said);
    char step[512];
    long eta = -1;
    CHECK(step_line(said, 1, 1, step, sizeof step) && eta_of(step, &eta) && eta == 0 &&
              strstr(step, " ETA 0:00:00") && !strstr(said, "step 2/"),
          "the step line: %s", said);
    CHECK(strstr(said, ", host CPU 0 us/step (training loop thread 0 us)\n"), "the CPU per step of one step: %s", said);
    CHECK(!strstr(said, "loop trace") && !strstr(said, "thread trace"), "host traces of a one-step run: %s", said);
    check_ready_line(said);
    snprintf(line, sizeof line, "%s/m.jsonl", dir);
    json_t *summary = last_metrics_line(line);
    if (CHECK(summary && json_is_true(json_object_get(summary, "summary")), "no summary line in %s", line)) {
        CHECK(number(summary, "host_cpu_us_per_step") == 0 && number(summary, "host_cpu_own_us_per_step") == 0 &&
                  number(summary, "loop_cpu_us_per_step") == 0 && number(summary, "driver_thread_cpu_us_per_step") == 0,
              "CPU per step: host %g, own %g, loop %g, driver %g", number(summary, "host_cpu_us_per_step"),
              number(summary, "host_cpu_own_us_per_step"), number(summary, "loop_cpu_us_per_step"),
              number(summary, "driver_thread_cpu_us_per_step"));
        CHECK(json_is_integer(json_object_get(summary, "measured_peak_bytes")) &&
                  number(summary, "measured_peak_bytes") >= 0 && number(summary, "planned_peak_bytes") > 0,
              "measured %g, planned %g", number(summary, "measured_peak_bytes"), number(summary, "planned_peak_bytes"));
        char want[256];
        memory_line(summary, want, sizeof want);
        CHECK(strstr(said, want), "the memory line: want '%s' in: %s", want, said);
        json_decref(summary);
    }
    free(said);
}

/* Three steps with TUNEGRAPH_HOST_TRACE: every step line's ETA as h:mm:ss, the last 0:00:00;
 * the loop and thread traces of the steps after the first; the process's CPU per step
 * measured; the closing lines as the metrics' summary has them. */
TG_TEST(test_cli_main_run_report_host_trace) {
    const char *dir = tg_test_tmpdir();
    char line[1024], *said;
    snprintf(line, sizeof line, "run " DEMO " --device cpu --set steps=3 --set log_every=1 --metrics %s/m.jsonl", dir);
    setenv("TUNEGRAPH_HOST_TRACE", "1", 1);
    const int status = cli(dir, line, &said);
    unsetenv("TUNEGRAPH_HOST_TRACE");
    REQUIRE(status == 0 && said, "run: status %d: %s", status, said ? said : "");
    for (int k = 1; k <= 3; k++) {
        char step[512];
        long eta = -1;
        CHECK(step_line(said, k, 3, step, sizeof step) && eta_of(step, &eta) && (k < 3 || eta == 0),
              "step %d: ETA %ld: %s", k, eta, said);
    }
    CHECK(strstr(said, "\nloop trace (thread CPU us per step after the first): in tg_trainer_step ") &&
              strstr(said, "\nthread trace (CPU us per step after the first, by thread): "),
          "the host traces: %s", said);
    snprintf(line, sizeof line, "%s/m.jsonl", dir);
    json_t *summary = last_metrics_line(line);
    if (CHECK(summary && json_is_true(json_object_get(summary, "summary")), "no summary line in %s", line)) {
        check_closing_lines(said, summary, 3);
        CHECK(number(summary, "steps") == 3 && number(summary, "host_cpu_us_per_step") > 0 &&
                  number(summary, "loop_cpu_us_per_step") >= 0,
              "CPU per step: host %g, loop %g", number(summary, "host_cpu_us_per_step"),
              number(summary, "loop_cpu_us_per_step"));
        /* The loop trace's time in tg_trainer_step is part of the loop thread's CPU after
         * the first step (the same clock, the same steps), never more (to the 0.1 us printed). */
        const char *in_step = strstr(said, "in tg_trainer_step ");
        double traced = -1;
        if (in_step && sscanf(in_step, "in tg_trainer_step %lf", &traced) != 1) traced = -1;
        CHECK(traced >= 0 && traced <= number(summary, "loop_cpu_us_per_step") + 0.1,
              "in tg_trainer_step %g us per step after the first, the loop thread %g: %.80s", traced,
              number(summary, "loop_cpu_us_per_step"), in_step ? in_step : "(no loop trace)");
        json_decref(summary);
    }
    free(said);
}

/* The progress lines' ETA: h:mm:ss rounded to the nearest second, minutes and seconds
 * two digits, the hours as many as it takes; cut to the buffer. */
TG_TEST(test_cli_main_run_report_hms) {
    static const struct {
        double s;
        const char *want;
    } cases[] = {{0, "0:00:00"},        {0.49, "0:00:00"},     {0.5, "0:00:01"},      {9, "0:00:09"},
                 {59.49, "0:00:59"},    {59.5, "0:01:00"},     {61, "0:01:01"},       {600, "0:10:00"},
                 {3599, "0:59:59"},     {3599.5, "1:00:00"},   {3600, "1:00:00"},     {3661, "1:01:01"},
                 {7322, "2:02:02"},     {35999, "9:59:59"},    {36000, "10:00:00"},   {86399.7, "24:00:00"},
                 {360425, "100:07:05"}, {1e7, "2777:46:40"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[32];
        memset(buf, '#', sizeof buf);
        cli_format_hms(cases[i].s, buf, sizeof buf);
        CHECK(!strcmp(buf, cases[i].want), "%g s: '%s', want '%s'", cases[i].s, buf, cases[i].want);
    }
    char small[5];
    cli_format_hms(3661, small, sizeof small);
    CHECK(!strcmp(small, "1:01"), "cut to 5 bytes: '%s'", small);
}

/* Starts the CLI binary with argv (stderr into err_path); its pid. */
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
        if (stall) setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", stall, 1);
        setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
        execv(cli, argv);
        _exit(127);
    }
    return pid;
}

/* Waits for the process to end, killing it after 2 minutes; its status. */
static int wait_end(pid_t pid) {
    int status = 0;
    for (int i = 0; i < 12000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

/* A run that writes checkpoints gets SIGTERM once its training is over, while it writes
 * its weights (--save into a FIFO: the signal comes once the first bytes are there): the
 * save and the report complete, then the process ends by the signal, not with status 0. */
TG_TEST(test_cli_main_run_stop_after_the_last_step) {
    const char *dir = tg_test_tmpdir();
    char fifo[700], ck[700], err_path[700];
    snprintf(fifo, sizeof fifo, "%s/weights.fifo", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    REQUIRE(mkfifo(fifo, 0644) == 0, "mkfifo");
    const int rd = open(fifo, O_RDONLY | O_NONBLOCK); /* no writer yet: poll sees nothing until one writes */
    REQUIRE(rd >= 0, "open the FIFO");
    char *argv[] = {"tunegraph", "run", DEMO, "--device", "cpu", "--set", "steps=2", "--checkpoint-dir", ck, "--save",
                    fifo, NULL};
    const pid_t pid = start_cli(argv, err_path, NULL);
    REQUIRE(pid > 0, "fork");
    int writing = 0, status = 0, ended = 0;
    for (int i = 0; i < 12000 && !writing && !ended; i++) {
        struct pollfd p = {rd, POLLIN, 0};
        writing = poll(&p, 1, 10) == 1 && (p.revents & POLLIN);
        ended = !writing && waitpid(pid, &status, WNOHANG) == pid;
    }
    if (writing) kill(pid, SIGTERM);
    else if (!ended) kill(pid, SIGKILL);
    long bytes = 0;
    if (writing) {
        fcntl(rd, F_SETFL, fcntl(rd, F_GETFL) & ~O_NONBLOCK);
        char buf[65536];
        for (ssize_t got; (got = read(rd, buf, sizeof buf)) > 0;) bytes += got;
    }
    close(rd);
    if (!ended) status = wait_end(pid);
    char *said = tg_test_read_file(err_path, NULL);
    REQUIRE(writing, "the run never wrote its weights: status %#x: %s", status, said ? said : "");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %#x, want death by SIGTERM: %s", status,
          said ? said : "");
    char saved[800];
    snprintf(saved, sizeof saved, "\nsaved %s\n", fifo);
    CHECK(said && strstr(said, "\ntrained 2 steps in ") && strstr(said, saved) &&
              strstr(said, "stopping after the steps in flight to write a checkpoint") && !strstr(said, "interrupted by"),
          "stderr: %s", said ? said : "");
    CHECK(bytes > 100000, "%ld bytes of weights", bytes);
    free(said);
}

/* Runs the CLI (argv) with its step-2 checkpoint's write stalled, sends `sig` once it says
 * so (SIGKILL if it ended first or never stalled), and gives its exit status and stderr
 * (err_path); 1 when it stalled. */
static int signal_during_checkpoint(char **argv, const char *err_path, int sig, int *status, char **said) {
    const pid_t pid = start_cli(argv, err_path, "2");
    *status = 0, *said = NULL;
    if (!CHECK(pid > 0, "fork")) return 0;
    int stalled = 0, ended = 0;
    for (int i = 0; i < 12000 && !stalled && !ended; i++) {
        char *text = tg_test_read_file(err_path, NULL);
        stalled = text && strstr(text, "stalled part-written") != NULL;
        free(text);
        ended = !stalled && waitpid(pid, status, WNOHANG) == pid;
        if (!stalled && !ended) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    kill(pid, stalled ? sig : SIGKILL);
    if (!ended) *status = wait_end(pid);
    *said = tg_test_read_file(err_path, NULL);
    return stalled;
}

/* SIGTERM while the step-2 checkpoint is written into a folder whose path is long (two
 * 150-byte names): the message names the checkpoint and the folder to resume from in full,
 * on stderr and as the metrics' last line. */
TG_TEST(test_cli_main_run_interrupted_long_folder) {
    const char *dir = tg_test_tmpdir();
    char ck[900], err_path[700], metrics[700];
    snprintf(ck, sizeof ck, "%s/%0150d", dir, 0);
    REQUIRE(mkdir(ck, 0755) == 0, "mkdir %s", ck);
    snprintf(ck + strlen(ck), sizeof ck - strlen(ck), "/%0150d", 1);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    char *argv[] = {"tunegraph", "run", DEMO, "--device", "cpu", "--set", "steps=4", "--set", "checkpoint_every=2",
                    "--checkpoint-dir", ck, "--metrics", metrics, NULL};
    int status;
    char *said;
    const int stalled = signal_during_checkpoint(argv, err_path, SIGTERM, &status, &said);
    REQUIRE(stalled, "the run did not stall at the step-2 checkpoint: %s", said ? said : "");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %#x", status);
    char *path = NULL;
    tg_err err;
    tg_checkpoint read;
    if (CHECK(tg_checkpoint_locate(ck, &path, &err) == 0 && tg_checkpoint_read(path, &read, &err) == 0, "%s",
              err.msg)) {
        char want[2400];
        snprintf(want, sizeof want, "interrupted by SIGTERM after step %d of 4; checkpoint %s (resume with --resume %s)",
                 read.state.step, path, ck);
        char line[2500];
        snprintf(line, sizeof line, "\ntunegraph: %s\n", want);
        CHECK(said && strstr(said, line), "stderr lacks '%s': %s", want, said ? said : "");
        json_t *last = last_metrics_line(metrics);
        const char *message = json_string_value(json_object_get(last, "message"));
        CHECK(message && !strcmp(message, want), "the metrics' message '%s', want '%s'", message ? message : "(none)",
              want);
        json_decref(last);
        tg_checkpoint_free(&read);
    }
    free(path);
    free(said);
}

/* A run resumed from its last step's checkpoint takes no step: it reports 0 steps, no
 * tokens (0 per second, however short the time), no padding, no step time and no CPU per
 * step, losses it never measured as nan (null in the metrics), then evaluates as any run. */
TG_TEST(test_cli_main_run_report_no_step_left) {
    const char *dir = tg_test_tmpdir();
    char line[2048], *said;
    snprintf(line, sizeof line,
             "run " DEMO " --device cpu --set steps=2 --set batch=4 --set seq=16 --set checkpoint_every=2 "
             "--checkpoint-dir %s/ck",
             dir);
    int status = cli(dir, line, &said);
    REQUIRE(status == 0, "the first run: status %d: %s", status, said ? said : "");
    free(said);
    snprintf(line, sizeof line, "run " DEMO " --device cpu --set steps=2 --set batch=4 --set seq=16 --resume %s/ck "
                                "--metrics %s/m.jsonl",
             dir, dir);
    status = cli(dir, line, &said);
    REQUIRE(status == 0 && said, "the resumed run: status %d: %s", status, said ? said : "");
    CHECK(strstr(said, "at step 2 of 2\n") && !strstr(said, "\nstep "), "a step taken: %s", said);
    check_ready_line(said);
    CHECK(strstr(said, "\ntrained 0 steps in ") &&
              strstr(said, " s: loss nan -> nan, 0 tokens/s, median step 0.000 ms, host CPU 0 us/step (training loop "
                           "thread 0 us)\nbatches: 0.0% of the token slots padding, waited for "),
          "the closing lines of no step: %s", said);
    snprintf(line, sizeof line, "%s/m.jsonl", dir);
    json_t *s = last_metrics_line(line);
    if (CHECK(s && json_is_true(json_object_get(s, "summary")), "no summary line in %s", line)) {
        CHECK(number(s, "steps") == 2 && number(s, "skipped_steps") == 0 && number(s, "tokens_per_s") == 0 &&
                  number(s, "padding_fraction") == 0 && number(s, "median_step_ms") == 0 &&
                  number(s, "host_cpu_us_per_step") == 0 && number(s, "loop_cpu_us_per_step") == 0 &&
                  json_is_null(json_object_get(s, "first_loss")) && json_is_null(json_object_get(s, "final_loss")) &&
                  number(s, "eval_examples") == 400,
              "summary: steps %g, tokens/s %g, padding %g, median %g, host %g, loop %g", number(s, "steps"),
              number(s, "tokens_per_s"), number(s, "padding_fraction"), number(s, "median_step_ms"),
              number(s, "host_cpu_us_per_step"), number(s, "loop_cpu_us_per_step"));
        json_decref(s);
    }
    free(said);
}

/* SIGINT while the step-2 checkpoint is written, with no metrics file: the run ends by
 * SIGINT, its message names the signal, the checkpoint and the folder to resume from. */
TG_TEST(test_cli_main_run_interrupted_by_sigint) {
    const char *dir = tg_test_tmpdir();
    char ck[700], err_path[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    char *argv[] = {"tunegraph", "run", DEMO, "--device", "cpu", "--set", "steps=4", "--set", "checkpoint_every=2",
                    "--checkpoint-dir", ck, NULL};
    int status;
    char *said;
    const int stalled = signal_during_checkpoint(argv, err_path, SIGINT, &status, &said);
    REQUIRE(stalled, "the run did not stall at the step-2 checkpoint: %s", said ? said : "");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT, "status %#x", status);
    char *path = NULL;
    tg_err err;
    tg_checkpoint read;
    if (CHECK(tg_checkpoint_locate(ck, &path, &err) == 0 && tg_checkpoint_read(path, &read, &err) == 0, "%s",
              err.msg)) {
        char line[2400];
        snprintf(line, sizeof line,
                 "\ntunegraph: interrupted by SIGINT after step %d of 4; checkpoint %s (resume with --resume %s)\n",
                 read.state.step, path, ck);
        CHECK(said && strstr(said, line), "stderr lacks '%s': %s", line, said ? said : "");
        tg_checkpoint_free(&read);
    }
    free(path);
    free(said);
}

/* A data-parallel run with --profile stopped by SIGTERM while the step-2 checkpoint is
 * written: it ends by the signal after the steps in flight, naming the checkpoint there, and
 * profiles nothing (profiling would take more steps). */
TG_TEST(test_cli_main_run_interrupted_profile_replicas) {
    const char *dir = tg_test_tmpdir();
    char ck[700], err_path[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    char *argv[] = {"tunegraph", "run", DEMO, "--device", "cpu", "--set", "steps=4", "--set", "checkpoint_every=2",
                    "--set", "data_parallel=2", "--profile", "--checkpoint-dir", ck, NULL};
    int status;
    char *said;
    const int stalled = signal_during_checkpoint(argv, err_path, SIGTERM, &status, &said);
    REQUIRE(stalled, "the run did not stall at the step-2 checkpoint: %s", said ? said : "");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %#x: %s", status, said ? said : "");
    /* the stop comes after the steps in flight (2 or 3), checkpointed there */
    char *path = NULL;
    tg_err err;
    tg_checkpoint read;
    if (CHECK(tg_checkpoint_locate(ck, &path, &err) == 0 && tg_checkpoint_read(path, &read, &err) == 0, "%s",
              err.msg)) {
        char want[2400];
        snprintf(want, sizeof want,
                 "\ntunegraph: interrupted by SIGTERM after step %d of 4; checkpoint %s (resume with --resume %s)\n",
                 read.state.step, path, ck);
        CHECK(read.state.step >= 2 && read.state.step < 4 && said && strstr(said, want) && !strstr(said, "profile ("),
              "stderr lacks '%s' or profiles: %s", want, said ? said : "");
        tg_checkpoint_free(&read);
    }
    free(path);
    free(said);
}
