/* `tunegraph plot` (cli/plot.c, cli/metrics_read.c, cli/svg_chart.c): the charts of a
 * metrics file holding every kind of line the run writes (a step that was not finite, the
 * gradient sums, profile lines, the summary) against the SVG files in tests/data/plot/
 * byte for byte (TG_TEST_WRITE_EXPECTED=1 rewrites them after a deliberate change); a long
 * run drawn as SVG_CHART_POINTS bins; and every refusal, naming the file, the line and the
 * field, with nothing written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "cli/metrics_read.h"
#include "cli/svg_chart.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

static const char *const charts[] = {"loss.svg", "throughput.svg", "phases.svg", "communication.svg",
                                     "kernel_groups.svg", "profile.svg"};

TG_TEST(test_cli_plot_charts) {
    const char *dir = tg_test_tmpdir();
    char line[1024];
    snprintf(line, sizeof line, "plot tests/data/plot/metrics.jsonl -o %s/charts", dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    const int write = getenv("TG_TEST_WRITE_EXPECTED") != NULL;
    for (size_t k = 0; k < sizeof charts / sizeof charts[0]; k++) {
        char got_path[900], want_path[200];
        snprintf(got_path, sizeof got_path, "%s/charts/%s", dir, charts[k]);
        snprintf(want_path, sizeof want_path, "tests/data/plot/%s", charts[k]);
        long got_len = 0, want_len = 0;
        char *got = tg_test_read_file(got_path, &got_len);
        if (!CHECK(got, "%s not written", got_path)) continue;
        CHECK(r.err && strstr(r.err, got_path), "'wrote %s' missing: %s", got_path, r.err ? r.err : "");
        if (write) {
            FILE *f = fopen(want_path, "wb");
            CHECK(f && fwrite(got, 1, (size_t)got_len, f) == (size_t)got_len && fclose(f) == 0, "cannot write %s", want_path);
        }
        char *want = tg_test_read_file(want_path, &want_len);
        CHECK(want && got_len == want_len && !memcmp(got, want, (size_t)got_len), "%s differs from %s", got_path, want_path);
        free(got), free(want);
    }
    tg_cli_run_free(&r);
}

/* A run longer than SVG_CHART_POINTS: one polyline point a bin; no comm or groups: those
 * charts are not written. */
TG_TEST(test_cli_plot_long_run_in_bins) {
    const char *dir = tg_test_tmpdir();
    char path[900], out[900], line[2048];
    snprintf(path, sizeof path, "%s/long.jsonl", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    for (int s = 1; s <= 2500; s++)
        fprintf(f,
                "{\"step\": %d, \"loss\": %g, \"lr\": 1e-4, \"step_ms\": 8.0, \"tokens_per_s\": 1000.0, \"batch_ms\": 0.0, "
                "\"forward_ms\": 3.0, \"backward_ms\": 4.0, \"optimizer_ms\": 1.0, \"seq\": 128}\n",
                s, 1.0 / s);
    fclose(f);
    snprintf(out, sizeof out, "%s/long", dir);
    snprintf(line, sizeof line, "plot %s -o %s", path, out);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(path, sizeof path, "%s/loss.svg", out);
    char *svg = tg_test_read_file(path, NULL);
    REQUIRE(svg, "%s", path);
    const char *pts = strstr(svg, "points=\"");
    int points = 0;
    for (const char *p = pts ? pts + 8 : NULL; p && *p && *p != '"'; p++) points += *p == ',';
    CHECK(points == SVG_CHART_POINTS, "%d points in the loss line, want %d", points, SVG_CHART_POINTS);
    free(svg);
    struct stat st;
    snprintf(path, sizeof path, "%s/communication.svg", out);
    CHECK(stat(path, &st) != 0, "a run without gradient sums has no communication chart");
    snprintf(path, sizeof path, "%s/kernel_groups.svg", out);
    CHECK(stat(path, &st) != 0, "a run without a profile has no kernel-group chart");
    snprintf(path, sizeof path, "%s/profile.svg", out);
    CHECK(stat(path, &st) != 0, "a run without a profile has no profile chart");
}

TG_TEST(test_cli_plot_refusals) {
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"", "m.jsonl: no step lines to plot"},
        {"{\"summary\": true}\n", "m.jsonl: no step lines to plot"},
        {"{\"summary\": true}\nnot json\n", "m.jsonl: line 2: not a JSON object: "},
        {"[1, 2]\n", "m.jsonl: line 1: not a JSON object"},
        {"{\"summary\": true}\n\n{\"summary\": true}\n", "m.jsonl: line 2: empty line"},
        {"{\"hello\": 1}\n", "m.jsonl: line 1: not a metrics line (no step, summary, event or profile key)"},
        {"{\"step\": 0, \"loss\": 1}\n", "m.jsonl: line 1: 'step' is not a step number (a whole number from 1)"},
        {"{\"step\": 1.5}\n", "m.jsonl: line 1: 'step' is not a step number"},
        {"{\"step\": 1, \"lr\": 1, \"step_ms\": 1, \"tokens_per_s\": 1, \"batch_ms\": 1, \"forward_ms\": 1, "
         "\"backward_ms\": 1, \"optimizer_ms\": 1}\n",
         "m.jsonl: line 1: step line without a number 'loss'"},
        {"{\"step\": 1, \"loss\": \"x\", \"lr\": 1, \"step_ms\": 1, \"tokens_per_s\": 1, \"batch_ms\": 1, "
         "\"forward_ms\": 1, \"backward_ms\": 1, \"optimizer_ms\": 1}\n",
         "m.jsonl: line 1: step line without a number 'loss'"},
        {"{\"step\": 2, \"loss\": 1, \"lr\": 1, \"step_ms\": 1, \"tokens_per_s\": 1, \"batch_ms\": 1, \"forward_ms\": 1, "
         "\"backward_ms\": 1, \"optimizer_ms\": 1}\n{\"step\": 2, \"loss\": 1, \"lr\": 1, \"step_ms\": 1, "
         "\"tokens_per_s\": 1, \"batch_ms\": 1, \"forward_ms\": 1, \"backward_ms\": 1, \"optimizer_ms\": 1}\n",
         "m.jsonl: line 2: step 2 after step 2 (steps must increase)"},
        {"{\"step\": 1, \"loss\": 1, \"lr\": 1, \"step_ms\": 1, \"tokens_per_s\": 1, \"batch_ms\": 1, \"forward_ms\": 1, "
         "\"backward_ms\": 1, \"optimizer_ms\": 1, \"exposed_comm_ms\": 1}\n",
         "m.jsonl: line 1: step line without a number 'comm_ms'"},
        {"{\"profile_group\": \"\", \"ms\": 1}\n",
         "m.jsonl: line 1: a profile_group line needs a group name (at most 63 bytes) and its ms"},
        {"{\"profile_group\": \"x\", \"ms\": -1}\n", "m.jsonl: line 1: a profile_group line needs a group name"},
        {"{\"profile_phase\": 3, \"ms\": 1}\n",
         "m.jsonl: line 1: a profile_phase line needs a phase name (at most 63 bytes) and its ms"},
        {"{\"profile_phase\": \"forward\"}\n", "m.jsonl: line 1: a profile_phase line needs a phase name"},
        {"{\"summary\": true, \"summary\": false}\n", "m.jsonl: line 1: not a JSON object: "},
    };
    const char *dir = tg_test_tmpdir();
    char path[900], out[900], line[2048];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    snprintf(out, sizeof out, "%s/refused", dir);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        FILE *f = fopen(path, "w");
        REQUIRE(f && fputs(bad[k].text, f) >= 0 && fclose(f) == 0, "%s", path);
        snprintf(line, sizeof line, "plot %s -o %s", path, out);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        char want[600];
        snprintf(want, sizeof want, "tunegraph plot: %s/%s", dir, bad[k].want);
        CHECK(r.status == 1 && r.err && strstr(r.err, want), "case %zu: exit %d: %s\nwant %s", k, r.status,
              r.err ? r.err : "", want);
        tg_cli_run_free(&r);
        struct stat st;
        CHECK(stat(out, &st) != 0, "case %zu: the folder was made", k);
    }
    /* More groups than a plot holds. */
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    for (int g = 0; g <= METRICS_GROUPS_MAX; g++) fprintf(f, "{\"profile_group\": \"g%d\", \"ms\": 1}\n", g);
    fclose(f);
    metrics_series s;
    tg_err err = {{0}};
    char *text = tg_test_read_file(path, NULL);
    REQUIRE(text, "%s", path);
    CHECK(metrics_read("m.jsonl", text, strlen(text), &s, &err) == -1 && strstr(err.msg, "line 17: more than 16 kernel groups"),
          "groups: %s", err.msg);
    free(text);
    f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    for (int g = 0; g <= METRICS_GROUPS_MAX; g++) fprintf(f, "{\"profile_phase\": \"p%d\", \"ms\": 1}\n", g);
    fclose(f);
    text = tg_test_read_file(path, NULL);
    REQUIRE(text, "%s", path);
    CHECK(metrics_read("m.jsonl", text, strlen(text), &s, &err) == -1 && strstr(err.msg, "line 17: more than 16 phases"),
          "phases: %s", err.msg);
    free(text);
    /* The command line. */
    static const struct {
        const char *args, *want;
    } usage[] = {
        {"plot", "tunegraph plot: no metrics file given"},
        {"plot m.jsonl", "tunegraph plot: no output folder given (-o DIR)"},
        {"plot m.jsonl -o", "tunegraph plot: -o needs a folder"},
        {"plot m.jsonl n.jsonl -o x", "tunegraph plot: one metrics file, got a second: 'n.jsonl'"},
        {"plot m.jsonl --svg -o x", "tunegraph plot: unknown option '--svg'"},
    };
    for (size_t k = 0; k < sizeof usage / sizeof usage[0]; k++) {
        tg_cli_run r = tg_test_cli_line(dir, usage[k].args, NULL);
        CHECK(r.status == 2 && r.err && strstr(r.err, usage[k].want) && strstr(r.err, "usage: tunegraph plot"),
              "'%s': exit %d: %s", usage[k].args, r.status, r.err ? r.err : "");
        tg_cli_run_free(&r);
    }
    /* A file that is not there; an output folder that is a file. */
    snprintf(line, sizeof line, "plot %s/none.jsonl -o %s", dir, out);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && r.err && strstr(r.err, "none.jsonl"), "missing file: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    /* The metrics file as one of the charts: refused before anything is written; a folder
     * whose parent is missing. */
    char charts_dir[900], as_chart[1000];
    snprintf(charts_dir, sizeof charts_dir, "%s/self", dir);
    mkdir(charts_dir, 0777);
    snprintf(as_chart, sizeof as_chart, "%s/loss.svg", charts_dir);
    FILE *m = fopen(as_chart, "w");
    REQUIRE(m, "%s", as_chart);
    char *metrics_text = tg_test_read_file("tests/data/plot/metrics.jsonl", NULL);
    REQUIRE(metrics_text && fputs(metrics_text, m) >= 0 && fclose(m) == 0, "%s", as_chart);
    snprintf(line, sizeof line, "plot %s -o %s", as_chart, charts_dir);
    r = tg_test_cli_line(dir, line, NULL);
    char *after = tg_test_read_file(as_chart, NULL);
    CHECK(r.status == 1 && r.err && strstr(r.err, "tunegraph plot: ") && strstr(r.err, "loss.svg") && after &&
              !strcmp(after, metrics_text),
          "the metrics file as a chart: exit %d: %s", r.status, r.err ? r.err : "");
    free(after), free(metrics_text);
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "plot tests/data/plot/metrics.jsonl -o %s/missing/charts", dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && r.err && strstr(r.err, "missing/charts: cannot create the folder: No such file or directory"),
          "a folder without its parent: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    snprintf(line, sizeof line, "plot tests/data/plot/metrics.jsonl -o %s", path);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && r.err && strstr(r.err, "tunegraph plot: ") && strstr(r.err, "m.jsonl/loss.svg"),
          "output folder is a file: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* The charts' text: XML's special characters escaped in names, a constant series and no
 * finite value still give an axis, allocation failures reported. */
TG_TEST(test_cli_plot_svg_edges) {
    const double x[3] = {1, 2, 3}, flat[3] = {2, 2, 2}, none[3] = {NAN, NAN, NAN};
    const chart_series s[] = {{"a<b & \"c\"", flat, "red", 0}, {"none", none, "blue", 1}};
    svg_buf b = {0};
    CHECK(svg_line_chart(&b, "t'", "x", x, 3, s, 2, "l", "r") == 0 && b.text, "line chart");
    CHECK(b.text && strstr(b.text, "a&lt;b &amp; &quot;c&quot;") && strstr(b.text, "t&apos;") &&
              strstr(b.text, ">1.8<") && strstr(b.text, ">2.2<"),
          "%s", b.text ? b.text : "");
    svg_buf_free(&b);
    tg_alloc_fail_after(0);
    const int rc = svg_line_chart(&b, "t", "x", x, 3, s, 1, "l", "r");
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && b.failed, "out of memory: rc %d", rc);
    svg_buf_free(&b);
    tg_alloc_fail_after(0);
    const int rc2 = svg_stacked_chart(&b, "t", "x", x, 3, s, 1, NULL, "y");
    tg_alloc_fail_after(-1);
    CHECK(rc2 == -1, "stacked, out of memory: rc %d", rc2);
    svg_buf_free(&b);
}
