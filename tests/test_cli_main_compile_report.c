/* `tunegraph compile`'s line (cli/main.c cmd_compile), word for word against the plan it
 * wrote as `inspect --json` reads it: ops, tensors, planned peak in MiB, GFLOP per step,
 * then the compile time; on standard output, or on stderr when the plan itself goes to
 * standard output (-o /dev/stdout), which then holds the same bytes as the plan file. In
 * this process (tests/cli_in_process.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job"

/* "compiled JOB -> PATH: ..." up to " (" from the plan's own numbers, in want. */
static int want_line(const char *dir, const char *plan_path, const char *shown_path, char *want, size_t cap) {
    char line[2048];
    snprintf(line, sizeof line, "inspect %s --json", plan_path);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    json_t *o = r.status == 0 && r.out ? json_loads(r.out, 0, NULL) : NULL;
    tg_cli_run_free(&r);
    if (!o) return 0;
    snprintf(want, cap, "compiled " DEMO " -> %s: %d ops, %d tensors, planned peak %.1f MiB, %.2f GFLOP/step (", shown_path,
             (int)json_integer_value(json_object_get(o, "n_ops")), (int)json_integer_value(json_object_get(o, "n_tensors")),
             json_number_value(json_object_get(o, "peak_bytes")) / 1048576.0,
             json_number_value(json_object_get(o, "flops_per_step")) / 1e9);
    json_decref(o);
    return 1;
}

/* Whether `text` is want followed by a whole number of milliseconds, " ms)\n" and nothing else. */
static int is_line(const char *text, const char *want) {
    if (!text || strncmp(text, want, strlen(want))) return 0;
    const char *p = text + strlen(want);
    const char *digits = p;
    while (*p >= '0' && *p <= '9') p++;
    return p > digits && !strcmp(p, " ms)\n");
}

TG_TEST(test_cli_main_compile_report_line) {
    const char *dir = tg_test_tmpdir();
    char line[2048], plan[800], want[1024];
    snprintf(plan, sizeof plan, "%s/p.tgp", dir);
    snprintf(line, sizeof line, "compile " DEMO " -o %s --set batch=8 --set seq=32", plan);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "compile: %s", r.err ? r.err : "");
    if (CHECK(want_line(dir, plan, plan, want, sizeof want), "inspect %s", plan))
        CHECK(is_line(r.out, want) && r.err && !r.err[0], "stdout '%s' (want '%s...'), stderr '%s'", r.out ? r.out : "",
              want, r.err ? r.err : "");
    tg_cli_run_free(&r);

    /* the plan onto standard output: the line on stderr, the plan's bytes on stdout */
    char out_path[800];
    snprintf(out_path, sizeof out_path, "%s/stdout.tgp", dir);
    snprintf(line, sizeof line, "compile " DEMO " -o /dev/stdout --set batch=8 --set seq=32");
    r = tg_test_cli_line(dir, line, out_path);
    REQUIRE(r.status == 0, "compile to stdout: %s", r.err ? r.err : "");
    if (CHECK(want_line(dir, out_path, "/dev/stdout", want, sizeof want), "inspect %s", out_path))
        CHECK(is_line(r.err, want), "stderr '%s', want '%s...'", r.err ? r.err : "", want);
    tg_cli_run_free(&r);
    long a = 0, b = 0;
    char *file = tg_test_read_file(plan, &a), *piped = tg_test_read_file(out_path, &b);
    CHECK(file && piped && a == b && a > 0 && !memcmp(file, piped, (size_t)a), "the plan on stdout (%ld bytes) is not the file's (%ld)",
          b, a);
    free(file);
    free(piped);
}
