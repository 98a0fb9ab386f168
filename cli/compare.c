/* `tunegraph compare A B` (cli/compare.h). */
#include "cli/compare.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/json_strict.h"
#include "base/text_file.h"
#include "cli/artifact.h"
#include "cli/usage.h"

#define COMPARE_MAX_BYTES (1ull << 32)

static const char compare_usage[] = "usage: tunegraph compare A B   (each a run or sweep artifact folder, a metrics "
                                    "file or a sweep's results.jsonl)\n";

/* The headline metrics: the summary line's (or a sweep point's) key and its label. */
static const struct {
    const char *key, *label;
} compare_metrics[] = {
    {"median_step_ms", "median step (ms)"},   {"tokens_per_s", "tokens/s"},
    {"measured_peak_bytes", "measured peak (bytes)"}, {"planned_peak_bytes", "planned peak (bytes)"},
    {"final_loss", "final loss"},             {"joules_per_step", "energy (J/step)"},
    {"joules_per_1k_tokens", "energy (J/1k tokens)"}, {"cost_per_1m_tokens", "cost (per 1M tokens)"},
    {"mfu", "model FLOP utilisation"},
};

typedef struct compare_side {
    const char *path;
    int artifact;           /* a folder with a manifest */
    artifact_manifest m;
    int sweep;              /* results of a sweep (else a run's metrics) */
    json_t *summary;        /* a run: its summary line */
    json_t *points;         /* a sweep: its results lines, an array */
} compare_side;

static void side_free(compare_side *s) {
    artifact_manifest_free(&s->m);
    json_decref(s->summary);
    json_decref(s->points);
    s->summary = s->points = NULL;
}

/* Reads the lines of a metrics file or a sweep's results.jsonl into side s. */
static int side_read_lines(compare_side *s, const char *path, tg_err *err) {
    char *text;
    size_t len;
    if (tg_read_text_file(path, COMPARE_MAX_BYTES, "metrics or results file", &text, &len, err)) return -1;
    char *error = NULL;
    int rc = 0, line_no = 0, points = 0, steps = 0;
    s->points = json_array();
    if (!s->points) rc = tg_fail(err, "out of memory");
    for (char *line = text; *line && !rc;) {
        const size_t n = strcspn(line, "\n");
        json_error_t jerr;
        line_no++;
        json_t *o = tg_json_loadb(line, n, 0, &jerr);
        line += n + (line[n] == '\n');
        if (!json_is_object(o)) {
            rc = tg_fail(err, "%s: line %d: not a JSON object%s%s", path, line_no, o ? "" : ": ", o ? "" : jerr.text);
        } else if (json_is_object(json_object_get(o, "settings"))) {
            points++;
            if (json_array_append(s->points, o)) rc = tg_fail(err, "out of memory");
        } else if (json_is_true(json_object_get(o, "summary"))) {
            json_decref(s->summary);
            s->summary = json_incref(o);
        } else if (json_is_integer(json_object_get(o, "step"))) {
            steps++;
        } else if (json_is_string(json_object_get(o, "message")) && !error) {
            error = tg_strdup(json_string_value(json_object_get(o, "message")));
        }
        json_decref(o);
    }
    free(text);
    if (!rc && points && (steps || s->summary))
        rc = tg_fail(err, "%s: holds both sweep results and a run's metrics lines", path);
    else if (!rc && points) s->sweep = 1;
    else if (!rc && !s->summary)
        rc = tg_fail(err, "%s: no summary line: %s%s", path, error ? "the run failed: " : "the run did not finish",
                     error ? error : "");
    free(error);
    return rc;
}

static int side_open(compare_side *s, const char *path, tg_err *err) {
    memset(s, 0, sizeof *s);
    s->path = path;
    struct stat st;
    if (stat(path, &st)) return tg_fail(err, "%s: no such file or folder", path);
    if (!S_ISDIR(st.st_mode)) return side_read_lines(s, path, err);
    s->artifact = 1;
    if (artifact_verify(path, &s->m, err)) return -1;
    const int sweep = !strcmp(s->m.command, "sweep");
    const char *name = sweep ? "results.jsonl" : "metrics.jsonl";
    if (!artifact_manifest_find(&s->m, name))
        return tg_fail(err, "%s: the artifact has no %s (its manifest lists it absent)", path, name);
    char *file;
    if (tg_asprintf(&file, "%s/%s", path, name) < 0) return tg_fail(err, "out of memory");
    const int rc = side_read_lines(s, file, err);
    free(file);
    return rc;
}

static void print_number(double v) {
    if (isnan(v)) printf(" %16s", "absent");
    else printf(" %16.10g", v);
}

/* One metric's row: both values, B - A and (B - A) / A. */
static void print_row(const char *label, json_t *a, json_t *b) {
    const double x = json_is_number(a) ? json_number_value(a) : NAN, y = json_is_number(b) ? json_number_value(b) : NAN;
    printf("  %-24s", label);
    print_number(x);
    print_number(y);
    if (isnan(x) || isnan(y)) {
        printf("\n");
        return;
    }
    printf(" %+16.10g", y - x);
    if (x != 0) printf(" %+11.2f%%\n", (y - x) / fabs(x) * 100);
    else printf(" %12s\n", "-");
}

/* The headline metrics present in either object. */
static void print_metrics(json_t *a, json_t *b) {
    printf("  %-24s %16s %16s %16s %12s\n", "metric", "A", "B", "B - A", "(B - A) / A");
    for (size_t k = 0; k < sizeof compare_metrics / sizeof compare_metrics[0]; k++) {
        json_t *x = json_object_get(a, compare_metrics[k].key), *y = json_object_get(b, compare_metrics[k].key);
        if (json_is_number(x) || json_is_number(y)) print_row(compare_metrics[k].label, x, y);
    }
}

static void print_hash_line(const char *what, const compare_side *a, const compare_side *b, const char *ha,
                            const char *hb) {
    printf("%-18s", what);
    if (!a->artifact || !b->artifact) printf("not recorded (%s is not an artifact)\n", !a->artifact ? "A" : "B");
    else if (!ha[0] || !hb[0]) printf("not recorded in %s\n", !ha[0] && !hb[0] ? "either" : !ha[0] ? "A" : "B");
    else if (!strcmp(ha, hb)) printf("same (%s)\n", ha);
    else printf("different (A %s, B %s)\n", ha, hb);
}

/* A sweep point's settings as "key=value ...". */
static void print_settings(json_t *point) {
    const char *key;
    json_t *v;
    int first = 1;
    json_object_foreach(json_object_get(point, "settings"), key, v) {
        printf("%s%s=%s", first ? "" : " ", key, json_is_string(v) ? json_string_value(v) : "?");
        first = 0;
    }
}

static void print_point_state(const char *side, json_t *p) {
    json_t *reason = json_object_get(p, "reason");
    printf("    %s: %s%s%s\n", side, json_string_value(json_object_get(p, "status")) ? json_string_value(json_object_get(p, "status")) : "?",
           json_is_string(reason) ? ": " : "", json_is_string(reason) ? json_string_value(reason) : "");
}

/* Sweeps: points matched by their settings. */
static void compare_sweeps(const compare_side *a, const compare_side *b) {
    size_t i;
    json_t *p;
    json_array_foreach(a->points, i, p) {
        json_t *match = NULL, *q;
        size_t j;
        json_array_foreach(b->points, j, q) if (json_equal(json_object_get(p, "settings"), json_object_get(q, "settings"))) match = q;
        printf("point ");
        print_settings(p);
        if (!match) {
            printf(": only in A\n");
            continue;
        }
        printf(":\n");
        const char *sa = json_string_value(json_object_get(p, "status")), *sb = json_string_value(json_object_get(match, "status"));
        if (!sa || !sb || strcmp(sa, "ok") || strcmp(sb, "ok")) {
            print_point_state("A", p);
            print_point_state("B", match);
            continue;
        }
        print_metrics(p, match);
    }
    json_array_foreach(b->points, i, p) {
        json_t *q;
        size_t j;
        int found = 0;
        json_array_foreach(a->points, j, q) found |= json_equal(json_object_get(p, "settings"), json_object_get(q, "settings"));
        if (found) continue;
        printf("point ");
        print_settings(p);
        printf(": only in B\n");
    }
}

static void describe_side(const char *name, const compare_side *s) {
    printf("%s: %s (", name, s->path);
    if (s->artifact) printf("%s artifact: %d files match its manifest", s->m.command, s->m.n_files);
    else printf("%s", s->sweep ? "sweep results" : "metrics file");
    if (s->artifact && s->m.n_absent) printf("; %d parts recorded absent", s->m.n_absent);
    printf(")\n");
}

int cmd_compare(int argc, char **argv) {
    const char *paths[2];
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("compare", compare_usage, "unknown option %s", argv[i]);
        if (n == 2) return cli_usage_error("compare", compare_usage, "unexpected argument %s (compare takes two)", argv[i]);
        paths[n++] = argv[i];
    }
    if (n < 2) return cli_usage_error("compare", compare_usage, "%s", "give two artifacts or metrics files, A and B");
    compare_side a, b;
    memset(&b, 0, sizeof b);
    tg_err err = {{0}};
    int rc = side_open(&a, paths[0], &err);
    if (!rc) rc = side_open(&b, paths[1], &err);
    if (!rc && a.sweep != b.sweep)
        rc = tg_fail(&err, "%s is %s, %s is %s: compare two runs or two sweeps", a.path, a.sweep ? "a sweep" : "a run",
                     b.path, b.sweep ? "a sweep" : "a run");
    if (!rc) {
        describe_side("A", &a);
        describe_side("B", &b);
        if (a.sweep) compare_sweeps(&a, &b);
        else print_metrics(a.summary, b.summary);
        print_hash_line("job file:", &a, &b, a.m.job_xxh64, b.m.job_xxh64);
        print_hash_line("plan file:", &a, &b, a.m.plan_xxh64, b.m.plan_xxh64);
        print_hash_line("plan fingerprint:", &a, &b, a.m.plan_fingerprint, b.m.plan_fingerprint);
    }
    side_free(&b);
    side_free(&a);
    if (rc) fprintf(stderr, "tunegraph compare: %s\n", err.msg);
    return rc ? 1 : 0;
}
