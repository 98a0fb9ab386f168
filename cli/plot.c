/* `tunegraph plot`: reads a metrics file (cli/metrics_read.c) and writes, each atomically,
 * DIR/loss.svg (loss and learning rate by step), DIR/throughput.svg (tokens/s),
 * DIR/phases.svg (the step's phases stacked, the step period over them), and where the
 * file has them DIR/communication.svg (data parallelism: the gradient sums' busy and
 * exposed ms), DIR/kernel_groups.svg (the --profile's time by kernel group) and
 * DIR/profile.svg (the --profile's time by phase and by kernel group). */
#include "cli/plot.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/atomic_file.h"
#include "base/output_paths.h"
#include "base/text_file.h"
#include "cli/metrics_read.h"
#include "cli/svg_chart.h"
#include "cli/usage.h"

#define METRICS_MAX_BYTES (1ull << 32)

static const char plot_usage[] = "usage: tunegraph plot METRICS.jsonl -o DIR\n";

/* What plot_charts may write into DIR. */
static const char *const charts[] = {"loss.svg", "throughput.svg", "phases.svg", "communication.svg",
                                     "kernel_groups.svg", "profile.svg"};

/* Writes the chart in b to `path` (atomically), then frees b. */
static int write_chart_at(const char *path, svg_buf *b, int built, tg_err *err) {
    const int rc = !built ? tg_fail(err, "out of memory drawing %s", path)
                          : tg_write_file_atomic(path, &(tg_chunk){b->text, b->len}, 1, "chart", err);
    if (!rc) fprintf(stderr, "wrote %s\n", path);
    svg_buf_free(b);
    return rc;
}

/* Writes the chart in b to DIR/name, then frees b. */
static int write_chart(const char *dir, const char *name, svg_buf *b, int built, tg_err *err) {
    char *path = NULL;
    int rc = tg_asprintf(&path, "%s/%s", dir, name) < 0 ? tg_fail(err, "out of memory") : 0;
    if (!rc) rc = write_chart_at(path, b, built, err);
    else svg_buf_free(b);
    free(path);
    return rc;
}

int plot_write_profile(const char *path, const char *const *phases, const double *phase_ms, int n_phases,
                       const char *const *groups, const double *group_ms, int n_groups, tg_err *err) {
    const chart_bars sections[] = {{"by phase", phases, phase_ms, n_phases, "#f28e2b"},
                                   {"by kernel group", groups, group_ms, n_groups, "#4e79a7"}};
    svg_buf b = {0};
    const int built = svg_bar_sections(&b, "Where a step's time goes (ops launched one by one)", sections, 2,
                                       "ms per step") == 0;
    return write_chart_at(path, &b, built, err);
}

static int plot_charts(const char *dir, const metrics_series *s, tg_err *err) {
    double *x = tg_malloc((size_t)s->n * sizeof *x);
    if (!x) return tg_fail(err, "out of memory");
    for (int64_t i = 0; i < s->n; i++) x[i] = (double)s->step[i];
    svg_buf b = {0};
    const chart_series loss[] = {{"loss", s->loss, "#4e79a7", 0}, {"learning rate", s->lr, "#e15759", 1}};
    int rc = write_chart(dir, "loss.svg", &b,
                         svg_line_chart(&b, "Training loss and learning rate", "step", x, s->n, loss, 2, "loss",
                                        "learning rate") == 0,
                         err);
    const chart_series tokens[] = {{"tokens/s", s->tokens_per_s, "#59a14f", 0}};
    if (!rc)
        rc = write_chart(dir, "throughput.svg", &b,
                         svg_line_chart(&b, "Throughput", "step", x, s->n, tokens, 1, "tokens/s", "") == 0, err);
    const chart_series phases[] = {{"batch", s->phase_ms[0], "#bab0ac", 0},
                                   {"forward", s->phase_ms[1], "#4e79a7", 0},
                                   {"backward", s->phase_ms[2], "#f28e2b", 0},
                                   {"optimizer", s->phase_ms[3], "#59a14f", 0}};
    const chart_series period = {"step", s->step_ms, "#222222", 0};
    if (!rc)
        rc = write_chart(dir, "phases.svg", &b,
                         svg_stacked_chart(&b, "Phases of each step", "step", x, s->n, phases, 4, &period, "ms") == 0,
                         err);
    const chart_series comm[] = {{"gradient sums", s->comm_ms, "#76b7b2", 0},
                                 {"after the backward", s->exposed_comm_ms, "#e15759", 0}};
    if (!rc && s->has_comm)
        rc = write_chart(dir, "communication.svg", &b,
                         svg_line_chart(&b, "Gradient sums between replicas", "step", x, s->n, comm, 2, "ms", "") == 0,
                         err);
    if (!rc && s->n_groups) {
        const char *names[METRICS_GROUPS_MAX];
        for (int g = 0; g < s->n_groups; g++) names[g] = s->group[g];
        rc = write_chart(dir, "kernel_groups.svg", &b,
                         svg_bar_chart(&b, "Time by kernel group (ops launched one by one)", names, s->group_ms,
                                       s->n_groups, "ms per step") == 0,
                         err);
    }
    if (!rc && (s->n_groups || s->n_phases)) {
        const char *groups[METRICS_GROUPS_MAX], *phases[METRICS_GROUPS_MAX];
        for (int g = 0; g < s->n_groups; g++) groups[g] = s->group[g];
        for (int g = 0; g < s->n_phases; g++) phases[g] = s->phase[g];
        char *path = NULL;
        rc = tg_asprintf(&path, "%s/profile.svg", dir) < 0
                 ? tg_fail(err, "out of memory")
                 : plot_write_profile(path, phases, s->profile_phase_ms, s->n_phases, groups, s->group_ms, s->n_groups,
                                      err);
        free(path);
    }
    free(x);
    return rc;
}

/* Every chart's path in DIR, refused where one is the metrics file or cannot be written. */
static int check_charts(const char *dir, const char *input, tg_err *err) {
    enum { N = sizeof charts / sizeof charts[0] };
    char *paths[N] = {0};
    tg_named_path outs[N];
    int rc = 0;
    for (int k = 0; k < N && !rc; k++) {
        if (tg_asprintf(&paths[k], "%s/%s", dir, charts[k]) < 0) rc = tg_fail(err, "out of memory");
        outs[k] = (tg_named_path){paths[k], "chart"};
    }
    const tg_named_path in = {input, "metrics file"};
    if (!rc) rc = tg_outputs_check(outs, N, &in, 1, err);
    for (int k = 0; k < N; k++) free(paths[k]);
    return rc;
}

int cmd_plot(int argc, char **argv) {
    const char *input = NULL, *dir = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o")) {
            if (i + 1 >= argc) return cli_usage_error("plot", plot_usage, "%s needs a folder", "-o");
            dir = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("plot", plot_usage, "unknown option '%s'", argv[i]);
        } else if (input) {
            return cli_usage_error("plot", plot_usage, "one metrics file, got a second: '%s'", argv[i]);
        } else {
            input = argv[i];
        }
    }
    if (!input) return cli_usage_error("plot", plot_usage, "%s", "no metrics file given");
    if (!dir) return cli_usage_error("plot", plot_usage, "%s", "no output folder given (-o DIR)");
    tg_err err = {{0}};
    char *text = NULL;
    size_t len = 0;
    metrics_series s;
    int rc = tg_read_text_file(input, METRICS_MAX_BYTES, "metrics file", &text, &len, &err);
    if (!rc) rc = metrics_read(input, text, len, &s, &err);
    free(text);
    if (!rc) {
        if (mkdir(dir, 0777) && errno != EEXIST)
            rc = tg_fail(&err, "%s: cannot create the folder: %s", dir, strerror(errno));
        else rc = check_charts(dir, input, &err) ? -1 : plot_charts(dir, &s, &err);
        metrics_series_free(&s);
    }
    if (rc) fprintf(stderr, "tunegraph plot: %s\n", err.msg);
    return rc ? 1 : 0;
}
