/* The metrics file's failures (cli/metrics.c): a line that cannot be built (a message
 * that is not UTF-8, an allocation that fails) or written (a stream into /dev/full), a
 * file that cannot be begun or put in place; and the lines' rarer shapes (no eval, no
 * measured peak, an op without tensors). The CLI's functions come from the copy that
 * tests/test_cli_metrics.c compiles in. */
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "cli/metrics.h"
#include "cli/profile.h"
#include "runtime/executor.h"
#include "tests/harness.h"
#include "tests/libc_faults.h"

/* A stream into /dev/full without a buffer: every write fails at once. */
static FILE *full_stream(void) {
    FILE *f = fopen("/dev/full", "w");
    if (f) setvbuf(f, NULL, _IONBF, 0);
    return f;
}

/* What `write` puts in a memory stream, without its newline (malloc'd), and its rc. */
#define WRITTEN(call, text, rc)                                    \
    do {                                                           \
        size_t len_ = 0;                                           \
        FILE *f = open_memstream(&(text), &len_);                  \
        REQUIRE(f, "open_memstream");                              \
        (rc) = (call);                                             \
        fclose(f);                                                 \
        if ((text) && len_ && (text)[len_ - 1] == '\n') (text)[len_ - 1] = 0; \
    } while (0)

TG_TEST(test_cli_metrics_failures_writes) {
    FILE *full = full_stream();
    REQUIRE(full, "/dev/full");
    char *text = NULL;
    int rc = 0;
    /* A message that is not UTF-8 cannot be a JSON string: the line is refused whole. */
    WRITTEN(metrics_write_error(f, "bad \xff byte", -1), text, rc);
    CHECK(rc == -1 && text && !text[0], "non-UTF-8 message: rc %d, wrote '%s'", rc, text ? text : "");
    free(text);
    text = NULL;
    WRITTEN(metrics_write_error(f, "step 3 failed", 2), text, rc);
    CHECK(rc == 0 && text && !strcmp(text, "{\"event\": \"error\", \"message\": \"step 3 failed\", \"replica\": 2}"),
          "error line: %d '%s'", rc, text ? text : "");
    free(text);
    CHECK(metrics_write_error(full, "x", -1) == -1, "an error line into /dev/full succeeded");
    CHECK(metrics_write_profile_kind(full, "matmul", 3, 1.5) == -1, "a profile line into /dev/full succeeded");

    metrics_step_line *w = metrics_step_line_new();
    REQUIRE(w, "metrics_step_line_new");
    tg_step_stats s = {0};
    s.step = 7, s.loss = 0.5f, s.lr = 1e-3f, s.grad_norm = 2, s.step_ms = 10, s.seq = 16;
    CHECK(metrics_write_step(w, full, &s, 100) == -1, "a step line into /dev/full succeeded");
    text = NULL;
    WRITTEN(metrics_write_step(w, f, &s, 100), text, rc);
    CHECK(rc == 0 && text && !strncmp(text, "{\"step\": 7, \"loss\": 0.5, \"lr\": 0.00100000005, ", 44) &&
              strstr(text, "\"seq\": 16}"),
          "step line: %d '%s'", rc, text ? text : "");
    free(text);
    /* The line cannot be dumped when jansson's allocations fail. */
    text = NULL;
    tg_alloc_fail_after(0);
    WRITTEN(metrics_write_step(w, f, &s, 100), text, rc);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && text && !text[0], "a step line dumped without memory: %d '%s'", rc, text ? text : "");
    free(text);
    metrics_step_line_free(w);
    metrics_step_line_free(NULL);
    fclose(full);
}

/* Each allocation of a step line failed in turn (jansson's go through the same hook):
 * NULL, never a half-built line; then one that writes. */
TG_TEST(test_cli_metrics_failures_step_line_memory) {
    int failures = 0;
    metrics_step_line *w = NULL;
    for (long k = 0; k < 1000; k++) {
        tg_alloc_fail_after(k);
        w = metrics_step_line_new();
        tg_alloc_fail_after(-1);
        if (w) break;
        failures++;
    }
    CHECK(w && failures >= 13, "%d allocations failed before a step line was made", failures);
    tg_step_stats s = {0};
    s.step = 1, s.loss = 1, s.step_ms = 1, s.seq = 8;
    char *text = NULL;
    int rc = -1;
    WRITTEN(metrics_write_step(w, f, &s, 5), text, rc);
    CHECK(rc == 0 && text && !strncmp(text, "{\"step\": 1, \"loss\": 1.0, ", 25), "after the faults: '%s'",
          text ? text : "");
    free(text);
    metrics_step_line_free(w);
}

TG_TEST(test_cli_metrics_failures_summary_shapes) {
    tg_memory_use mem = {0};
    mem.planned = 1000, mem.estimated = 2000, mem.measured = -1;
    metrics_summary s = {.steps = 2, .first_loss = 1, .final_loss = 0.5, .train_s = 0, .tokens = 10,
                         .device = "cpu", .replicas = 1, .mem = &mem, .eval = NULL};
    char *text = NULL;
    int rc = -1;
    WRITTEN(metrics_write_summary(f, &s), text, rc);
    /* No training time: tokens/s is not finite and the wait share is 0; no measured peak, no eval. */
    CHECK(rc == 0 && text && strstr(text, "\"tokens_per_s\": null, \"tokens_per_s_error\": \"not finite\"") &&
              strstr(text, "\"batch_wait_share\": 0.0") &&
              strstr(text, "\"measured_peak_bytes\": null, \"measured_peak_bytes_error\": \"not measurable here\"") &&
              !strstr(text, "eval_"),
          "summary: %d '%s'", rc, text ? text : "");
    free(text);
    FILE *full = full_stream();
    REQUIRE(full, "/dev/full");
    CHECK(metrics_write_summary(full, &s) == -1, "a summary into /dev/full succeeded");
    fclose(full);
}

/* An op whose output and first input are both absent names no tensor; a matmul timed at 0
 * ms has 0 TFLOPS, not a division by zero. */
TG_TEST(test_cli_metrics_failures_profile_op_shapes) {
    tg_op ops[2] = {tg_test_op(TG_OP_MATMUL), tg_test_op(TG_OP_MATMUL)};
    ops[1].p.matmul.m = 2, ops[1].p.matmul.n = 3, ops[1].p.matmul.k = 4, ops[1].p.matmul.batch = 1;
    tg_plan p;
    memset(&p, 0, sizeof p);
    p.ops = ops;
    p.n_ops = 2;
    char *text = NULL;
    int rc = -1;
    WRITTEN(metrics_write_profile_op(f, &p, 1, 0.0), text, rc);
    CHECK(rc == 0 && text && strstr(text, "\"profile_op_index\": 1, \"op\": \"matmul\", \"tensor\": \"\", \"ms\": 0.0") &&
              strstr(text, "\"M\": 2, \"N\": 3, \"K\": 4, \"batch\": 1") && strstr(text, "\"tflops\": 0.0}"),
          "profile op: %d '%s'", rc, text ? text : "");
    free(text);
    FILE *full = full_stream();
    REQUIRE(full, "/dev/full");
    CHECK(metrics_write_profile_op(full, &p, 0, 1.0) == -1, "a profile op line into /dev/full succeeded");
    fclose(full);
}

/* The entries of dir, "." and ".." left out. */
static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

TG_TEST(test_cli_metrics_failures_file) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    tg_err err = {{0}};
    metrics_file *m = (metrics_file *)1;
    snprintf(path, sizeof path, "%s/no/such/m.jsonl", dir);
    CHECK(metrics_file_open(&m, path, &err) == -1 && m == NULL && strstr(err.msg, "no/such/m.jsonl"),
          "a file in a missing folder: '%s'", err.msg);
    /* Out of memory for the file's state or its path. */
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    for (long k = 0; k < 2; k++) {
        tg_alloc_fail_after(k);
        int rc = metrics_file_open(&m, path, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && m == NULL && strstr(err.msg, "m.jsonl: out of memory"), "allocation %ld: %d '%s'", k, rc,
              err.msg);
    }
    /* No stream for the file (fdopen out of memory): refused, the state and its path
     * released (the leak check of the sanitizer build sees a path left behind), and no
     * file or temporary file left. */
    tg_test_fail_fdopen(1);
    m = (metrics_file *)1;
    const int rc_stream = metrics_file_open(&m, path, &err);
    tg_test_fail_fdopen(0);
    char want[900];
    snprintf(want, sizeof want, "%s: out of memory", path);
    CHECK(rc_stream == -1 && m == NULL && !strcmp(err.msg, want), "no stream: %d '%s'", rc_stream, err.msg);
    CHECK(access(path, F_OK) != 0 && dir_entries(dir) == 0, "no stream: %d files left", dir_entries(dir));
    /* An error line that cannot be built: the lines so far still go into place. */
    REQUIRE(metrics_file_open(&m, path, &err) == 0, "%s", err.msg);
    FILE *f = metrics_file_lock(m);
    REQUIRE(f, "no stream");
    fputs("{\"step\": 1}\n", f);
    metrics_file_unlock(m);
    CHECK(metrics_file_end(m, "bad \xff", -1, &err) == -1 &&
              strstr(err.msg, "m.jsonl: cannot add the error line to the metrics file"),
          "end: '%s'", err.msg);
    CHECK(metrics_file_lock(m) == NULL, "an ended file still gives its stream");
    metrics_file_unlock(m);
    CHECK(metrics_file_end(m, "again", -1, &err) == 0, "a second end did something");
    metrics_file_free(m);
    char *text = tg_test_read_file(path, NULL);
    CHECK(text && !strcmp(text, "{\"step\": 1}\n"), "file: '%s'", text ? text : "(none)");
    free(text);

    /* A file never ended is dropped: the target stays as it was. */
    REQUIRE(metrics_file_open(&m, path, &err) == 0, "%s", err.msg);
    f = metrics_file_lock(m);
    fputs("{\"step\": 2}\n", f);
    metrics_file_unlock(m);
    metrics_file_free(m);
    metrics_file_free(NULL);
    text = tg_test_read_file(path, NULL);
    CHECK(text && !strcmp(text, "{\"step\": 1}\n"), "a dropped file replaced the target: '%s'", text ? text : "(none)");
    free(text);

    /* Put in place on /dev/full: the commit fails, with or without a place for the message. */
    for (int with_err = 0; with_err < 2; with_err++) {
        REQUIRE(metrics_file_open(&m, "/dev/full", &err) == 0, "%s", err.msg);
        f = metrics_file_lock(m);
        fputs("{\"step\": 1}\n", f);
        metrics_file_unlock(m);
        memset(&err, 0, sizeof err);
        CHECK(metrics_file_end(m, NULL, -1, with_err ? &err : NULL) == -1, "a commit into /dev/full succeeded");
        CHECK(!with_err || strstr(err.msg, "/dev/full: cannot write the metrics file"), "commit: '%s'", err.msg);
        metrics_file_free(m);
    }
}

/* The --profile report (cli/profile.c) on a trainer of its own: with no captured step to
 * compare with, out of memory for the op times, and into a metrics stream that cannot be
 * written. */
TG_TEST(test_cli_metrics_failures_profile_report) {
    tg_plan plan;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan), "compile");
    tg_trainer tr;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = tg_test_device(), .load_data = 0, .threads = 1};
    REQUIRE(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg);
    /* stderr into a file, to read the report back. */
    char path[800];
    snprintf(path, sizeof path, "%s/stderr.txt", tg_test_tmpdir());
    fflush(stderr);
    int saved = dup(STDERR_FILENO), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(saved >= 0 && fd >= 0, "%s", path);
    dup2(fd, STDERR_FILENO);
    close(fd);
    int rc_plain = report_profile(&tr, NULL, 0, NULL, &err);
    fflush(stderr);
    tg_alloc_fail_after(0);
    tg_err oom = {{0}}, oom_later = {{0}};
    int rc_oom = report_profile(&tr, NULL, 1.0, NULL, &oom);
    tg_alloc_fail_after(1); /* the op times, then the profile's own */
    int rc_oom_later = report_profile(&tr, NULL, 1.0, NULL, &oom_later);
    tg_alloc_fail_after(-1);
    metrics_file *m = NULL;
    tg_err werr = {{0}};
    int rc_write = -2;
    if (metrics_file_open(&m, "/dev/full", &werr) == 0) {
        FILE *f = metrics_file_lock(m);
        setvbuf(f, NULL, _IONBF, 0);
        metrics_file_unlock(m);
        rc_write = report_profile(&tr, m, 2.0, NULL, &werr);
        metrics_file_free(m);
    }
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char *text = tg_test_read_file(path, NULL);
    CHECK(rc_plain == 0, "profile: %s", err.msg);
    CHECK(text && strstr(text, "profile (ops launched one by one, mean of 5 steps): ") &&
              strstr(text, "\n  forward ") && strstr(text, "  slowest ops:\n"),
          "report: %s", text ? text : "(none)");
    /* The first report had no captured step; the third had one of 2 ms. */
    const char *first = text ? strstr(text, "profile (") : NULL;
    const char *second = first ? strstr(first + 1, "profile (") : NULL;
    CHECK(first && (!second || !memmem(first, (size_t)(second - first), "captured step", 13)),
          "a report with no captured step names one: %s", text ? text : "");
    CHECK(text && strstr(text, "; the captured step took 2.000 ms"), "report with a 2 ms step: %s", text ? text : "");
    /* The first report's kernel groups: each group of the plan's ops once, their shares
     * adding up to the whole. */
    const char *groups = first ? strstr(first, "\n  by kernel group:") : NULL;
    const char *groups_end = groups ? strchr(groups + 1, '\n') : NULL;
    int plan_groups = 0, plan_has[TG_GROUP_COUNT] = {0};
    for (int o = 0; o < plan.n_ops; o++) plan_groups += plan_has[tg_op_group_of(plan.ops[o].kind)]++ == 0;
    double share_sum = 0;
    int listed = 0;
    for (const char *g = groups ? strstr(groups, " ms (") : NULL; g && g < groups_end; g = strstr(g + 1, " ms (")) {
        double share = 0;
        if (sscanf(g, " ms (%lf%%)", &share) == 1) share_sum += share, listed++;
    }
    for (int g = 0; g < TG_GROUP_COUNT && groups_end; g++)
        if (plan_has[g])
            CHECK(memmem(groups, (size_t)(groups_end - groups), tg_op_group_name(g), strlen(tg_op_group_name(g))),
                  "group %s missing: %.300s", tg_op_group_name(g), groups);
    CHECK(groups_end && listed == plan_groups && fabs(share_sum - 100.0) < 0.5, "%d groups listed of %d, shares %g: %s",
          listed, plan_groups, share_sum, groups ? groups : "(none)");
    /* The first report's table of op kinds: each kind of the plan once, with its count of
     * ops, slowest first; then the slowest ops, 8 of them. */
    int plan_kinds = 0, plan_count[TG_OP_COUNT] = {0};
    for (int o = 0; o < plan.n_ops; o++) plan_kinds += plan_count[plan.ops[o].kind]++ == 0;
    const char *row = first ? strstr(first, "share\n") : NULL;
    int rows = 0, seen[TG_OP_COUNT] = {0};
    double last_ms = 1e300;
    for (row = row ? row + 6 : NULL; row && !strncmp(row, "  ", 2) && strncmp(row, "  slowest ops:\n", 15); rows++) {
        char name[64];
        int count = -1;
        double kind_ms = -1;
        int k = -1;
        if (sscanf(row, "%63s %d %lf", name, &count, &kind_ms) == 3)
            for (int i = 0; i < TG_OP_COUNT; i++)
                if (!strcmp(tg_op_name(i), name)) k = i;
        CHECK(k >= 0 && !seen[k] && count == plan_count[k] && kind_ms <= last_ms, "kind row %d: '%.60s'", rows, row);
        if (k >= 0) seen[k] = 1;
        last_ms = kind_ms;
        row = strchr(row, '\n');
        row = row ? row + 1 : NULL;
    }
    CHECK(rows == plan_kinds && row && !strncmp(row, "  slowest ops:\n", 15), "%d kind rows for %d kinds: %s", rows,
          plan_kinds, text ? text : "");
    int slowest = 0;
    for (const char *r = row ? row + 15 : NULL; r && !strncmp(r, "    ", 4); r = strchr(r, '\n') ? strchr(r, '\n') + 1 : NULL)
        slowest++;
    CHECK(slowest == (plan.n_ops < 8 ? plan.n_ops : 8), "%d slowest ops listed", slowest);
    CHECK(rc_oom == -1 && !strcmp(oom.msg, "out of memory for the profile's op times"), "no memory: %d '%s'", rc_oom,
          oom.msg);
    /* (The CPU build's count of allocations: a CUDA build's report allocates otherwise.) */
    CHECK(tg_cuda_built() || (rc_oom_later == -1 && oom_later.msg[0] && strcmp(oom_later.msg, oom.msg)),
          "no memory after the op times: %d '%s'", rc_oom_later, oom_later.msg);
    CHECK(rc_write == -1 && !strcmp(werr.msg, "cannot write the profile to the metrics file"), "into /dev/full: %d '%s'",
          rc_write, werr.msg);
    free(text);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}
