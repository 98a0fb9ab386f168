/* `tunegraph run`'s progress lines (cli/main.c), each number against the metrics file's
 * step line of the same step: off a terminal "step K/N loss L lr R T tok/s ETA h:mm:ss"
 * every log_every steps and at the last, on a terminal the same redrawn in place (\r) after
 * every step; the ETA is the time left at the pace so far (a short run's is under a minute
 * at every step, 0:00:00 at the last). With TUNEGRAPH_HOST_TRACE the loop trace counts the
 * CPU time the loop spends on the metrics and progress lines (never 0 with both written).
 * The summary's median step is the middle one of the steps after the first, its losses the
 * first and last steps'. In this process, on the CPU executor. */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

int tunegraph_cli_main(int argc, char **argv);

#define DEMO "examples/demo-classify.job"
#define STEPS 5

/* The metrics file's step lines, by step (1..STEPS); 0 when one is missing. */
static int read_step_lines(const char *path, json_t *lines[STEPS + 1]) {
    for (int k = 0; k <= STEPS; k++) lines[k] = NULL;
    char *text = tg_test_read_file(path, NULL);
    if (!text) return 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *step = json_object_get(o, "step");
        const json_int_t k = json_is_integer(step) ? json_integer_value(step) : -1;
        if (!json_object_get(o, "summary") && json_object_get(o, "loss") && k >= 1 && k <= STEPS && !lines[k]) lines[k] = o;
        else json_decref(o);
    }
    free(text);
    for (int k = 1; k <= STEPS; k++)
        if (!lines[k]) return 0;
    return 1;
}

static double num(json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

/* The start of step k's progress line from its metrics (sep: "  " on a terminal, " " off
 * one), up to and including "ETA ". */
static void want_head(json_t *m, int k, const char *sep, char *buf, size_t cap) {
    snprintf(buf, cap, "step %d/%d%sloss %.4f%slr %.2e%s%.0f tok/s%sETA ", k, STEPS, sep, num(m, "loss"), sep,
             num(m, "lr"), sep, num(m, "tokens_per_s"), sep);
}

/* "h:mm:ss" at p, its seconds (-1 when malformed); *used its length. */
static long hms_at(const char *p, int *used) {
    int h, m, s;
    *used = 0;
    if (sscanf(p, "%d:%2d:%2d%n", &h, &m, &s, used) != 3 || m > 59 || s > 59 || p[*used - 3] != ':') return -1;
    return h * 3600L + m * 60L + s;
}

TG_TEST(test_cli_main_progress_lines_off_a_terminal) {
    const char *dir = tg_test_tmpdir();
    char line[1024], metrics[700];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    /* log_every 3: step 3 (a multiple) and step 5 (the last) print, steps 1, 2 and 4 do not */
    snprintf(line, sizeof line,
             "run " DEMO " --device cpu --set steps=5 --set batch=4 --set seq=16 --set log_every=3 --metrics %s", metrics);
    setenv("TUNEGRAPH_HOST_TRACE", "1", 1);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    unsetenv("TUNEGRAPH_HOST_TRACE");
    REQUIRE(r.status == 0 && r.err, "run: exit %d: %s", r.status, r.err ? r.err : "");
    json_t *m[STEPS + 1];
    if (CHECK(read_step_lines(metrics, m), "the step lines of %s", metrics)) {
        CHECK(!strstr(r.err, "step 1/5") && !strstr(r.err, "step 2/5") && !strstr(r.err, "step 4/5"),
              "steps 1, 2 or 4 printed with log_every 3: %s", r.err);
        for (int k = 3; k <= STEPS; k += 2) {
            char head[256];
            want_head(m[k], k, " ", head, sizeof head);
            const char *p = strstr(r.err, head);
            int used = 0;
            const long eta = p ? hms_at(p + strlen(head), &used) : -1;
            CHECK(p && (p == r.err || p[-1] == '\n') && p[strlen(head) + (size_t)used] == '\n' && eta >= 0 &&
                      (k < STEPS ? eta < 60 : eta == 0),
                  "step %d: want '%s' and an ETA (%ld s) in: %s", k, head, eta, r.err);
        }
    }
    /* The summary: the median step time of the steps after the first, the first and last losses, the steps taken. */
    json_t *summary = NULL;
    char *all = tg_test_read_file(metrics, NULL);
    const char *last = all ? strstr(all, "{\"summary\": true") : NULL;
    if (last) summary = json_loads(last, JSON_DISABLE_EOF_CHECK, NULL);
    free(all);
    if (CHECK(summary && m[STEPS], "the summary of %s", metrics)) {
        /* the four after the first in order: the median taken is the upper middle one */
        double t[STEPS - 1];
        for (int k = 2; k <= STEPS; k++) t[k - 2] = num(m[k], "step_ms");
        for (int i = 1; i < STEPS - 1; i++)
            for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
                const double x = t[j];
                t[j] = t[j - 1], t[j - 1] = x;
            }
        const double mid = t[2];
        char want_median[32], got_median[32], want_first[32], got_first[32], want_last[32], got_last[32];
        snprintf(want_median, sizeof want_median, "%.4f", mid);
        snprintf(got_median, sizeof got_median, "%.4f", num(summary, "median_step_ms"));
        snprintf(want_first, sizeof want_first, "%.6g", num(m[1], "loss"));
        snprintf(got_first, sizeof got_first, "%.6g", num(summary, "first_loss"));
        snprintf(want_last, sizeof want_last, "%.6g", num(m[STEPS], "loss"));
        snprintf(got_last, sizeof got_last, "%.6g", num(summary, "final_loss"));
        CHECK(!strcmp(want_median, got_median) && !strcmp(want_first, got_first) && !strcmp(want_last, got_last) &&
                  json_integer_value(json_object_get(summary, "steps")) == STEPS,
              "summary: median %s (want %s of %g %g %g %g), first loss %s (want %s), final %s (want %s)", got_median,
              want_median, t[0], t[1], t[2], t[3], got_first, want_first, got_last, want_last);
    }
    json_decref(summary);
    for (int k = 1; k <= STEPS; k++) json_decref(m[k]);
    /* The loop trace: the loop thread's CPU time per step after the first, in the step and
     * on the metrics and progress lines, both taken. */
    const char *trace = strstr(r.err, "\nloop trace (thread CPU us per step after the first): in tg_trainer_step ");
    double in_step = -1, fills = -1, rest = -1;
    CHECK(trace && sscanf(trace, "\nloop trace (thread CPU us per step after the first): in tg_trainer_step %lf (batch "
                                 "fills %lf), metrics and progress %lf\n",
                          &in_step, &fills, &rest) == 3 &&
              in_step > 0 && fills >= 0 && rest > 0,
          "loop trace: step %g, fills %g, metrics and progress %g: %s", in_step, fills, rest, r.err);
    tg_cli_run_free(&r);
}

/* Runs tunegraph_cli_main on `line` with stderr on a terminal (a pty); its status, and
 * what the terminal received in *text (malloc'd). */
static int run_on_terminal(const char *dir, const char *line, char **text) {
    *text = NULL;
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) return -1;
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    if (slave < 0) return -1;
    char words[4096], *argv[64];
    int argc = 0;
    argv[argc++] = "tunegraph";
    snprintf(words, sizeof words, "%s", line);
    for (char *w = strtok(words, " "); w && argc < 63; w = strtok(NULL, " ")) argv[argc++] = w;
    argv[argc] = NULL;
    (void)dir;
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(slave, STDERR_FILENO);
    int status = tunegraph_cli_main(argc, argv);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(slave);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    fcntl(master, F_SETFL, O_NONBLOCK);
    for (ssize_t n; buf && len + 1 < cap && (n = read(master, buf + len, cap - len - 1)) > 0;) len += (size_t)n;
    if (buf) buf[len] = 0;
    close(master);
    *text = buf;
    return status;
}

TG_TEST(test_cli_main_progress_lines_on_a_terminal) {
    const char *dir = tg_test_tmpdir();
    char line[1024], metrics[700];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    /* log_every does not thin a terminal's line: every step redraws it */
    snprintf(line, sizeof line,
             "run " DEMO " --device cpu --set steps=5 --set batch=4 --set seq=16 --set log_every=100 --metrics %s", metrics);
    char *text = NULL;
    const int status = run_on_terminal(dir, line, &text);
    REQUIRE(status == 0 && text, "run: exit %d: %s", status, text ? text : "");
    json_t *m[STEPS + 1];
    if (CHECK(read_step_lines(metrics, m), "the step lines of %s", metrics)) {
        for (int k = 1; k <= STEPS; k++) {
            char head[256];
            head[0] = '\r';
            want_head(m[k], k, "  ", head + 1, sizeof head - 1);
            const char *p = strstr(text, head);
            int used = 0;
            const long eta = p ? hms_at(p + strlen(head), &used) : -1;
            CHECK(p && !strncmp(p + strlen(head) + used, "   ", 3) && eta >= 0 && (k < STEPS ? eta < 60 : eta == 0),
                  "step %d: want '%s' and an ETA (%ld s) in: %s", k, head + 1, eta, text);
        }
        /* the line ends before the closing report, which starts on a line of its own */
        CHECK(strstr(text, " tok/s  ETA 0:00:00   \r\ntrained 5 steps in "), "after the last step: %s", text);
    }
    for (int k = 1; k <= STEPS; k++) json_decref(m[k]);
    free(text);
}

/* Off a terminal a checkpoint's line sits between the step lines, on a line of its own
 * right after the step it saves (no blank line before it): "checkpoint PATH (S s)". */
TG_TEST(test_cli_main_progress_lines_checkpoint_line) {
    const char *dir = tg_test_tmpdir();
    char line[1024];
    snprintf(line, sizeof line,
             "run " DEMO " --device cpu --set steps=3 --set batch=4 --set seq=16 --set log_every=1 --checkpoint-dir %s/ck "
             "--set checkpoint_every=2",
             dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "run: exit %d: %s", r.status, r.err ? r.err : "");
    char head[900];
    snprintf(head, sizeof head, " ETA 0:00:00\ncheckpoint %s/ck/step-000002.tgckpt (", dir);
    const char *at = strstr(r.err, head);
    double s = -1;
    int used = 0;
    if (at && sscanf(at + strlen(head), "%lf s)\n%n", &s, &used) != 1) used = 0;
    const char *after = at ? at + strlen(head) + used : NULL;
    CHECK(at && used > 0 && s >= 0 && after[-1] == '\n' && !strncmp(after, "step 3/3 loss ", 14) &&
              !strstr(r.err, "\n\ncheckpoint") && !strstr(r.err, "step-000003"),
          "the checkpoint line: %s", r.err);
    /* the step it follows is step 2's */
    const char *two = strstr(r.err, "\nstep 2/3 loss ");
    CHECK(two && at && two < at && !memchr(two + 1, '\n', (size_t)(at + 12 - (two + 1))), "order: %s", r.err);
    tg_cli_run_free(&r);
}
