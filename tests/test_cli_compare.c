/* `tunegraph compare A B` (cli/compare.c), in process: two metrics files with known
 * summaries give the exact differences; two run artifacts give their hashes' agreement (a
 * copy matches itself, another batch size changes the plan but not the job); a changed file
 * in an artifact is refused; sweeps are compared point by point; and the refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* Writes a metrics file: one step line and a summary with the given numbers. */
static void write_metrics(const char *path, double step_ms, double tokens_per_s, long peak, double loss,
                          const char *extra) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"step\": 1, \"loss\": 0.7, \"lr\": 0.001, \"grad_norm\": 1.0, \"step_ms\": %g, \"tokens_per_s\": %g, "
             "\"batch_ms\": 0, \"forward_ms\": 1, \"backward_ms\": 1, \"optimizer_ms\": 1, \"seq\": 16}\n"
             "{\"summary\": true, \"steps\": 1, \"final_loss\": %g, \"tokens_per_s\": %g, \"median_step_ms\": %g, "
             "\"planned_peak_bytes\": 1000, \"measured_peak_bytes\": %ld%s}\n",
             step_ms, tokens_per_s, loss, tokens_per_s, step_ms, peak, extra);
    CHECK(tg_test_write_file(path, text) == 0, "cannot write %s", path);
}

/* The line of `out` that starts with `start` (after its indent), or NULL. */
static const char *row(const char *out, const char *start) {
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        while (*l == ' ') l++;
        if (!strncmp(l, start, strlen(start))) return l;
    }
    return NULL;
}

/* A row's words after its label, as numbers and text: "10 8 -2 -20.00%". */
static int row_is(const char *out, const char *label, const char *want) {
    const char *l = row(out, label);
    if (!l) return 0;
    l += strlen(label);
    char got[256];
    int n = 0;
    for (; *l && *l != '\n' && n < 255; l++)
        if (*l != ' ' || (n && got[n - 1] != ' ')) got[n++] = *l;
    while (n && got[n - 1] == ' ') n--;
    got[n] = 0;
    const char *start = got[0] == ' ' ? got + 1 : got;
    return !strcmp(start, want);
}

TG_TEST(test_cli_compare_metrics_files) {
    const char *dir = tg_test_tmpdir();
    char a[900], b[900], line[2048];
    snprintf(a, sizeof a, "%s/a.jsonl", dir);
    snprintf(b, sizeof b, "%s/b.jsonl", dir);
    write_metrics(a, 10, 1000, 4096, 0.5, "");
    write_metrics(b, 8, 1250, 4096, 0.25, ", \"joules_per_step\": 2.5");
    snprintf(line, sizeof line, "compare %s %s", a, b);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    const char *out = r.out ? r.out : "";
    CHECK(strstr(out, "(metrics file)"), "sides not described: %s", out);
    CHECK(row_is(out, "median step (ms)", "10 8 -2 -20.00%"), "step row: %s", out);
    CHECK(row_is(out, "tokens/s", "1000 1250 +250 +25.00%"), "tokens row: %s", out);
    CHECK(row_is(out, "measured peak (bytes)", "4096 4096 +0 +0.00%"), "peak row: %s", out);
    CHECK(row_is(out, "planned peak (bytes)", "1000 1000 +0 +0.00%"), "planned row: %s", out);
    CHECK(row_is(out, "final loss", "0.5 0.25 -0.25 -50.00%"), "loss row: %s", out);
    CHECK(row_is(out, "energy (J/step)", "absent 2.5"), "energy row: %s", out);
    CHECK(!row(out, "model FLOP utilisation"), "a metric in neither file is shown: %s", out);
    CHECK(row_is(out, "job file:", "not recorded (A is not an artifact)") &&
              row_is(out, "plan fingerprint:", "not recorded (A is not an artifact)"),
          "hash rows: %s", out);
    tg_cli_run_free(&r);
}

/* Two run artifacts: one copied (everything the same), one of another batch size (the same
 * job file, another plan); then a file of the copy changed. */
TG_TEST(test_cli_compare_run_artifacts) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[1200];
    for (int k = 0; k < 2; k++) {
        snprintf(line, sizeof line,
                 "run examples/demo-classify.job --set steps=2 --set batch=%d --set seq=16 --threads 1 --artifact %s/%c",
                 k ? 2 : 4, dir, 'a' + k);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        REQUIRE(r.status == 0, "run %d: %s", k, r.err ? r.err : "");
        tg_cli_run_free(&r);
    }
    snprintf(line, sizeof line, "cp -r %s/a %s/copy", dir, dir);
    REQUIRE(system(line) == 0, "%s", line);
    snprintf(line, sizeof line, "compare %s/a %s/copy", dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    const char *out = r.out ? r.out : "";
    CHECK(strstr(out, "(run artifact: ") && strstr(out, " files match its manifest)"), "sides: %s", out);
    const char *step = row(out, "median step (ms)");
    CHECK(step && strstr(step, "+0 ") && strstr(step, "+0.00%"), "a copy differs: %s", out);
    CHECK(row(out, "job file:") && strstr(row(out, "job file:"), "same (") && strstr(row(out, "plan file:"), "same (") &&
              strstr(row(out, "plan fingerprint:"), "same ("),
          "hashes of a copy: %s", out);
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "compare %s/a %s/b", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    out = r.out ? r.out : "";
    CHECK(strstr(row(out, "job file:"), "same (") && strstr(row(out, "plan file:"), "different (A ") &&
              strstr(row(out, "plan fingerprint:"), "different (A "),
          "hashes of batch 4 and 2: %s", out);
    /* Half the batch plans a smaller peak: B - A is negative. */
    const char *planned = row(out, "planned peak (bytes)");
    CHECK(planned && strstr(planned, " -"), "planned peak row: %s", out);
    tg_cli_run_free(&r);
    /* A file changed after the artifact was written is named. */
    snprintf(path, sizeof path, "%s/copy/metrics.jsonl", dir);
    FILE *f = fopen(path, "a");
    REQUIRE(f && fputs("\n", f) >= 0 && fclose(f) == 0, "%s", path);
    snprintf(line, sizeof line, "compare %s/a %s/copy", dir, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && strstr(r.err, "copy/metrics.jsonl: ") &&
              strstr(r.err, "the artifact's manifest says") && strstr(r.err, "the file changed after the artifact was written"),
          "exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_compare_sweep_results) {
    const char *dir = tg_test_tmpdir();
    char a[900], b[900], line[2048];
    snprintf(a, sizeof a, "%s/a.jsonl", dir);
    snprintf(b, sizeof b, "%s/b.jsonl", dir);
    REQUIRE(tg_test_write_file(a, "{\"point\": 1, \"settings\": {\"batch\": \"2\"}, \"status\": \"ok\", \"median_step_ms\": 4, "
                                  "\"tokens_per_s\": 100}\n"
                                  "{\"point\": 2, \"settings\": {\"batch\": \"4\"}, \"status\": \"ok\", \"median_step_ms\": 5, "
                                  "\"tokens_per_s\": 160}\n"
                                  "{\"point\": 3, \"settings\": {\"batch\": \"8\"}, \"status\": \"ok\", \"median_step_ms\": 9, "
                                  "\"tokens_per_s\": 170}\n") == 0,
            "%s", a);
    REQUIRE(tg_test_write_file(b, "{\"point\": 1, \"settings\": {\"batch\": \"4\"}, \"status\": \"ok\", \"median_step_ms\": 4, "
                                  "\"tokens_per_s\": 200}\n"
                                  "{\"point\": 2, \"settings\": {\"batch\": \"2\"}, \"status\": \"refused\", \"reason\": "
                                  "\"needs 9 GiB\"}\n"
                                  "{\"point\": 3, \"settings\": {\"batch\": \"16\"}, \"status\": \"ok\", \"median_step_ms\": "
                                  "9, \"tokens_per_s\": 170}\n") == 0,
            "%s", b);
    snprintf(line, sizeof line, "compare %s %s", a, b);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    const char *out = r.out ? r.out : "";
    const char *p4 = strstr(out, "point batch=4:");
    CHECK(strstr(out, "(sweep results)") && p4 && row_is(p4, "tokens/s", "160 200 +40 +25.00%"), "batch 4: %s", out);
    CHECK(strstr(out, "point batch=2:\n    A: ok\n    B: refused: needs 9 GiB\n"), "batch 2: %s", out);
    CHECK(strstr(out, "point batch=8: only in A\n") && strstr(out, "point batch=16: only in B\n"), "unmatched: %s", out);
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_compare_refusals) {
    const char *dir = tg_test_tmpdir();
    char run_file[900], sweep_file[900], failed[900], line[3000];
    snprintf(run_file, sizeof run_file, "%s/run.jsonl", dir);
    snprintf(sweep_file, sizeof sweep_file, "%s/sweep.jsonl", dir);
    snprintf(failed, sizeof failed, "%s/failed.jsonl", dir);
    write_metrics(run_file, 1, 1, 1, 1, "");
    REQUIRE(tg_test_write_file(sweep_file, "{\"point\": 1, \"settings\": {\"batch\": \"2\"}, \"status\": \"ok\"}\n") == 0, "w");
    REQUIRE(tg_test_write_file(failed, "{\"step\": 1, \"loss\": 1}\n{\"event\": \"error\", \"message\": \"out of data\"}\n") == 0,
            "w");
    tg_cli_run r = tg_test_cli_line(dir, "compare only-one", NULL);
    CHECK(r.status == 2 && strstr(r.err, "tunegraph compare: give two artifacts or metrics files, A and B"), "%s", r.err);
    tg_cli_run_free(&r);
    r = tg_test_cli_line(dir, "compare a b c", NULL);
    CHECK(r.status == 2 && strstr(r.err, "unexpected argument c (compare takes two)"), "%s", r.err);
    tg_cli_run_free(&r);
    r = tg_test_cli_line(dir, "compare --json a b", NULL);
    CHECK(r.status == 2 && strstr(r.err, "unknown option --json"), "%s", r.err);
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "compare %s %s/missing", run_file, dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && strstr(r.err, "missing: no such file or folder"), "%s", r.err);
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "compare %s %s", run_file, sweep_file);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && strstr(r.err, "is a run,") && strstr(r.err, "is a sweep: compare two runs or two sweeps"), "%s",
          r.err);
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "compare %s %s", failed, run_file);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && strstr(r.err, "failed.jsonl: no summary line: the run failed: out of data"), "%s", r.err);
    tg_cli_run_free(&r);
    /* A folder without a manifest is not an artifact. */
    snprintf(line, sizeof line, "compare %s %s", dir, run_file);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && strstr(r.err, "/manifest.json: cannot"), "%s", r.err);
    tg_cli_run_free(&r);
}

/* A compare of two metrics files whose allocations fail from the k-th on, for each k in
 * turn: the command either gets past them or ends with exit 1, one line saying it ran out
 * of memory, and nothing on stdout (the comparison is printed only once both sides are
 * read). From the k-th on, not the k-th alone: with one allocation of its parser failed and
 * the next ones granted, jansson 2.14 crashed inside json_loadb (a write out of bounds). */
TG_TEST(test_cli_compare_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    char a[900], b[900], line[2048];
    snprintf(a, sizeof a, "%s/a.jsonl", dir);
    snprintf(b, sizeof b, "%s/b.jsonl", dir);
    write_metrics(a, 10, 1000, 4096, 0.5, "");
    write_metrics(b, 8, 1250, 4096, 0.25, "");
    snprintf(line, sizeof line, "compare %s %s", a, b);
    int failures = 0;
    for (long k = 0; k < 200; k++) {
        tg_alloc_fail_after(k);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        tg_alloc_fail_after(-1);
        if (r.status != 0) {
            failures++;
            const int one_line = r.err && strchr(r.err, '\n') == r.err + strlen(r.err) - 1;
            CHECK(r.status == 1 && one_line && strstr(r.err, "tunegraph compare: ") && strstr(r.err, "out of memory") &&
                      r.out && !r.out[0],
                  "allocation %ld failed: exit %d, stdout '%s', stderr '%s'", k, r.status, r.out ? r.out : "(none)",
                  r.err ? r.err : "(none)");
        } else {
            CHECK(r.out && strstr(r.out, "median step (ms)"), "allocation %ld passed over without the table", k);
        }
        tg_cli_run_free(&r);
    }
    CHECK(failures > 5, "only %d allocations of compare could fail", failures);
}
