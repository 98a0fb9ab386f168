/* `tunegraph sweep` (cli/sweep.h). Every point is compiled before any runs, so a point that
 * cannot compile or cannot fit is reported without spending a run on the rest; each
 * runnable point then goes through `run` with --metrics into DIR/points/NNNN/, and its
 * step lines give the numbers: the median step time and the tokens per second of the steps
 * after the warm-up ones. */
#include "cli/sweep.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/front.h"
#include "base/alloc.h"
#include "base/atomic_file.h"
#include "base/clock.h"
#include "base/json_strict.h"
#include "base/text_file.h"
#include "cli/progress.h"
#include "cli/svg_chart.h"
#include "cli/sweep_spec.h"
#include "cli/usage.h"
#include "plan/memory_estimate.h"
#include "runtime/executor.h"
#include "runtime/preflight.h"

#define SWEEP_SETS_MAX 64          /* run's --set limit: fixed sets, one per axis and steps */
#define SWEEP_STEPS_DEFAULT 20
#define SWEEP_WARMUP_DEFAULT 2
#define SWEEP_METRICS_MAX_BYTES (1ull << 32)
#define SWEEP_SERIES_MAX 8         /* lines in one plot */

static const char sweep_usage[] =
    "usage: tunegraph sweep JOB --grid key=v1,v2,... [--grid key=...]... -o DIR\n"
    "                [--weights throughput=W,memory=W,energy=W,cost=W] [--steps N] [--warmup N]\n"
    "                [--device cpu|cuda] [--threads N] [--set key=value]... [--artifact DIR]\n";

enum { POINT_OK = 0, POINT_REFUSED, POINT_FAILED };
static const char *const point_status_names[] = {"ok", "refused", "failed"};

typedef struct sweep_point {
    int value[SWEEP_AXES_MAX]; /* each axis' value index */
    int status;
    char *reason;              /* refused or failed: why (malloc'd) */
    int compiled;
    double planned_peak, estimate;   /* bytes: the plan's pools, its memory estimate on the device */
    double median_step_ms, tokens_per_s, first_loss, final_loss, measured_peak;
    double joules_per_1k_tokens, cost_per_1m_tokens; /* NaN: not in the run's summary */
    int timed_steps;
} sweep_point;

typedef struct sweep_run {
    const char *job, *out_dir, *artifact_dir, *device_arg, *threads_arg;
    sweep_axis axes[SWEEP_AXES_MAX];
    int n_axes;
    const char *sets[SWEEP_SETS_MAX];
    int n_sets;
    sweep_weights weights;
    int steps, warmup;
    tg_device device;
    sweep_point *points;
    int n_points;
    uint64_t free_bytes;
    int free_known;
    char free_source[64];
} sweep_run;

static int sweep_usage_error(const char *fmt, const char *arg) { return cli_usage_error("sweep", sweep_usage, fmt, arg); }

/* A whole number from lo to hi, all of `text`: 0, or -1. */
static int sweep_whole(const char *text, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    const long v = text[0] >= '0' && text[0] <= '9' ? strtol(text, &end, 10) : -1;
    if (v < 0 || errno || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int sweep_parse_args(int argc, char **argv, sweep_run *s) {
    int have_weights = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const int value_option = !strcmp(a, "--grid") || !strcmp(a, "--weights") || !strcmp(a, "--steps") ||
                                 !strcmp(a, "--warmup") || !strcmp(a, "--device") || !strcmp(a, "--threads") ||
                                 !strcmp(a, "--set") || !strcmp(a, "-o") || !strcmp(a, "--artifact");
        if (value_option && i + 1 >= argc) return sweep_usage_error("%s needs a value", a);
        const char *v = value_option ? argv[++i] : NULL;
        tg_err err;
        int n;
        if (!strcmp(a, "--grid")) {
            if (s->n_axes == SWEEP_AXES_MAX) return sweep_usage_error("more than %s --grid arguments", "8");
            if (sweep_grid_parse(v, &s->axes[s->n_axes], &err)) return sweep_usage_error("%s", err.msg);
            s->n_axes++;
        } else if (!strcmp(a, "--weights")) {
            if (have_weights) return sweep_usage_error("%s given twice", a);
            if (sweep_weights_parse(v, &s->weights, &err)) return sweep_usage_error("%s", err.msg);
            have_weights = 1;
        } else if (!strcmp(a, "--steps")) {
            if (sweep_whole(v, 1, 1000000, &n)) return sweep_usage_error("--steps needs a whole number from 1 to 1000000, got '%s'", v);
            s->steps = n;
        } else if (!strcmp(a, "--warmup")) {
            if (sweep_whole(v, 0, 1000, &n)) return sweep_usage_error("--warmup needs a whole number from 0 to 1000, got '%s'", v);
            s->warmup = n;
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) return sweep_usage_error("--device must be cpu or cuda, got '%s'", v);
            s->device_arg = v;
        } else if (!strcmp(a, "--threads")) {
            if (sweep_whole(v, 0, 1024, &n)) return sweep_usage_error("--threads needs a whole number from 0 to 1024, got '%s'", v);
            s->threads_arg = v;
        } else if (!strcmp(a, "--set")) {
            if (!strchr(v, '=')) return sweep_usage_error("--set needs key=value, got '%s'", v);
            if (s->n_sets == SWEEP_SETS_MAX) return sweep_usage_error("too many --set options (%s)", "64 at most");
            s->sets[s->n_sets++] = v;
        } else if (!strcmp(a, "-o")) {
            s->out_dir = v;
        } else if (!strcmp(a, "--artifact")) {
            s->artifact_dir = v;
        } else if (a[0] == '-' && a[1]) {
            return sweep_usage_error("unknown option %s", a);
        } else if (s->job) {
            return sweep_usage_error("unexpected argument %s (one job file)", a);
        } else {
            s->job = a;
        }
    }
    if (!s->job) return sweep_usage_error("%s", "missing job file");
    if (!s->n_axes) return sweep_usage_error("%s", "give at least one --grid key=v1,v2,...");
    if (!s->out_dir) return sweep_usage_error("%s", "no output folder given (-o DIR)");
    return 0;
}

/* The key of a "key=value" --set. */
static int set_names_key(const char *set, const char *key) {
    const size_t n = strlen(key);
    return !strncmp(set, key, n) && set[n] == '=';
}

/* Grid keys must be job keys, each swept once, not fixed by --set, and not steps or
 * epochs, which the sweep sets; all before anything is compiled or run. */
static int sweep_check_keys(sweep_run *s) {
    char msg[512];
    for (int a = 0; a < s->n_axes; a++) {
        const char *key = s->axes[a].key;
        if (!tg_front_job_key_known(key)) {
            snprintf(msg, sizeof msg, "--grid %s=...: '%s' is not a job key (README.md lists them)", key, key);
            return sweep_usage_error("%s", msg);
        }
        if (!strcmp(key, "steps") || !strcmp(key, "epochs")) {
            snprintf(msg, sizeof msg, "--grid %s=...: the sweep sets the steps itself (--steps N, --warmup N)", key);
            return sweep_usage_error("%s", msg);
        }
        for (int b = 0; b < a; b++)
            if (!strcmp(s->axes[b].key, key)) {
                snprintf(msg, sizeof msg, "--grid %s=...: key '%s' is swept by an earlier --grid", key, key);
                return sweep_usage_error("%s", msg);
            }
        for (int k = 0; k < s->n_sets; k++)
            if (set_names_key(s->sets[k], key)) {
                snprintf(msg, sizeof msg, "--grid %s=...: key '%s' is also fixed by --set %.200s", key, key, s->sets[k]);
                return sweep_usage_error("%s", msg);
            }
    }
    for (int k = 0; k < s->n_sets; k++)
        if (set_names_key(s->sets[k], "steps") || set_names_key(s->sets[k], "epochs"))
            return sweep_usage_error("--set %s: the sweep sets the steps itself (--steps N, --warmup N)", s->sets[k]);
    if (s->n_sets + s->n_axes + 1 > SWEEP_SETS_MAX)
        return sweep_usage_error("too many --set and --grid keys together (%s)", "63 at most");
    long long points = 1;
    for (int a = 0; a < s->n_axes; a++) points *= s->axes[a].n_values;
    if (points > SWEEP_POINTS_MAX) {
        snprintf(msg, sizeof msg, "the grid has %lld points, more than %d", points, SWEEP_POINTS_MAX);
        return sweep_usage_error("%s", msg);
    }
    s->n_points = (int)points;
    return 0;
}

/* "key=value key=value" of point p (malloc'd), or NULL when out of memory. */
static char *point_label(const sweep_run *s, const sweep_point *p, const char *sep) {
    char *out = tg_strdup("");
    for (int a = 0; a < s->n_axes && out; a++) {
        char *next;
        if (tg_asprintf(&next, "%s%s%s=%s", out, a ? sep : "", s->axes[a].key, s->axes[a].values[p->value[a]]) < 0)
            next = NULL;
        free(out);
        out = next;
    }
    return out;
}

/* The overrides of point p: the fixed --set ones, the point's, and the steps. sets[]
 * points into `owned`, which the caller frees (n_owned strings). */
static int point_sets(const sweep_run *s, const sweep_point *p, const char **sets, char **owned, int *n_owned) {
    int n = 0;
    *n_owned = 0;
    for (int k = 0; k < s->n_sets; k++) sets[n++] = s->sets[k];
    for (int a = 0; a <= s->n_axes; a++) {
        char *set;
        const int rc = a < s->n_axes ? tg_asprintf(&set, "%s=%s", s->axes[a].key, s->axes[a].values[p->value[a]])
                                     : tg_asprintf(&set, "steps=%d", s->warmup + s->steps);
        if (rc < 0) return -1;
        owned[(*n_owned)++] = set;
        sets[n++] = set;
    }
    return n;
}

static void free_owned(char **owned, int n) {
    for (int k = 0; k < n; k++) free(owned[k]);
}

static int point_fail(sweep_point *p, int status, const char *why) {
    p->status = status;
    free(p->reason);
    p->reason = tg_strdup(why);
    return p->reason ? 0 : -1;
}

/* Compiles point p and refuses it when its memory estimate does not fit. -1: out of memory. */
static int point_compile(sweep_run *s, sweep_point *p) {
    const char *sets[SWEEP_SETS_MAX];
    char *owned[SWEEP_AXES_MAX + 1];
    int n_owned;
    const int n = point_sets(s, p, sets, owned, &n_owned);
    if (n < 0) {
        free_owned(owned, n_owned);
        return -1;
    }
    tg_plan plan;
    tg_err err = {{0}};
    int rc = 0;
    /* As run compiles on a GPU: recompute = auto plans for the memory the GPU has free. */
    const uint64_t available = s->device == TG_DEVICE_CUDA && s->free_known ? s->free_bytes : 0;
    if (tg_front_compile_file_for(s->job, sets, n, available, &plan, &err)) {
        rc = point_fail(p, POINT_FAILED, err.msg);
    } else {
        p->compiled = 1;
        tg_memory_estimate est;
        tg_estimate_memory(&plan, s->device, &est);
        p->planned_peak = (double)plan.peak_bytes;
        /* As the preflight compares: on CUDA the context exists when free memory is read. */
        const uint64_t needs = est.total - (s->device == TG_DEVICE_CUDA ? est.part[TG_MEM_CUDA_CONTEXT] : 0);
        p->estimate = (double)needs;
        if (s->free_known && needs > s->free_bytes) {
            char need_s[32], free_s[32], why[256];
            snprintf(why, sizeof why, "needs %s, %s %s", tg_mem_format_bytes(needs, need_s, sizeof need_s),
                     tg_mem_format_bytes(s->free_bytes, free_s, sizeof free_s), s->free_source);
            rc = point_fail(p, POINT_REFUSED, why);
        }
        tg_plan_free(&plan);
    }
    free_owned(owned, n_owned);
    return rc;
}

static int cmp_ms(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double summary_number(json_t *summary, const char *key) {
    json_t *v = json_object_get(summary, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* The point's numbers from its metrics file: the step lines after the warm-up, the
 * summary's peaks (and energy and cost when the run measured them), or the error line. */
static int point_read_metrics(const sweep_run *s, sweep_point *p, const char *path, int status) {
    char *text = NULL;
    size_t len = 0;
    tg_err err;
    if (tg_read_text_file(path, SWEEP_METRICS_MAX_BYTES, "metrics file", &text, &len, &err)) {
        char why[1100];
        snprintf(why, sizeof why, "run exited with status %d, no metrics: %s", status, err.msg);
        return point_fail(p, POINT_FAILED, why);
    }
    double *ms = tg_calloc((size_t)s->steps + 1, sizeof *ms);
    double seconds = 0, tokens = 0;
    int steps_seen = 0, timed = 0, rc = 0;
    json_t *summary = NULL;
    char *error = NULL;
    for (char *line = text; *line && ms && !rc;) {
        const size_t n = strcspn(line, "\n");
        json_error_t jerr;
        json_t *o = tg_json_loadb(line, n, 0, &jerr);
        line += n + (line[n] == '\n');
        if (!o) continue;
        json_t *step = json_object_get(o, "step");
        if (json_is_integer(step)) {
            const double step_ms = summary_number(o, "step_ms"), tok_s = summary_number(o, "tokens_per_s");
            const double loss = summary_number(o, "loss");
            if (steps_seen++ == 0) p->first_loss = loss;
            p->final_loss = loss;
            if (steps_seen > s->warmup && timed < s->steps && isfinite(step_ms) && isfinite(tok_s)) {
                ms[timed++] = step_ms;
                seconds += step_ms / 1e3;
                tokens += tok_s * step_ms / 1e3; /* the step's tokens: tokens_per_s is tokens / step time */
            }
        } else if (json_is_true(json_object_get(o, "summary"))) {
            json_decref(summary);
            summary = json_incref(o);
        } else if (json_is_string(json_object_get(o, "message")) && !error) {
            error = tg_strdup(json_string_value(json_object_get(o, "message")));
        }
        json_decref(o);
    }
    free(text);
    if (!ms) rc = -1;
    else if (status != 0 || !summary) {
        char why[1100];
        if (error) snprintf(why, sizeof why, "%s", error);
        else snprintf(why, sizeof why, "run exited with status %d (its messages are above)", status);
        rc = point_fail(p, POINT_FAILED, why);
    } else if (timed == 0) {
        rc = point_fail(p, POINT_FAILED, "no step after the warm-up steps had a finite time");
    } else {
        qsort(ms, (size_t)timed, sizeof *ms, cmp_ms);
        p->timed_steps = timed;
        p->median_step_ms = timed % 2 ? ms[timed / 2] : (ms[timed / 2 - 1] + ms[timed / 2]) / 2;
        p->tokens_per_s = seconds > 0 ? tokens / seconds : NAN;
        p->measured_peak = summary_number(summary, "measured_peak_bytes");
        p->joules_per_1k_tokens = summary_number(summary, "joules_per_1k_tokens");
        p->cost_per_1m_tokens = summary_number(summary, "cost_per_1m_tokens");
        p->status = POINT_OK;
    }
    json_decref(summary);
    free(error);
    free(ms);
    return rc;
}

/* DIR/points/NNNN/metrics.jsonl of point i (malloc'd), its folder made; NULL on failure. */
static char *point_metrics_path(const sweep_run *s, int i, tg_err *err) {
    char *folder = NULL, *path = NULL;
    if (tg_asprintf(&folder, "%s/points/%04d", s->out_dir, i + 1) < 0) {
        tg_fail(err, "out of memory");
        return NULL;
    }
    if (mkdir(folder, 0777) && errno != EEXIST) tg_fail(err, "%s: cannot create the folder: %s", folder, strerror(errno));
    else if (tg_asprintf(&path, "%s/metrics.jsonl", folder) < 0) tg_fail(err, "out of memory"), path = NULL;
    free(folder);
    return path;
}

/* Runs point i through `run`. -1: the sweep cannot go on (err set). */
static int point_run(sweep_run *s, int i, cli_command_fn run, tg_err *err) {
    sweep_point *p = &s->points[i];
    const char *sets[SWEEP_SETS_MAX];
    char *owned[SWEEP_AXES_MAX + 1];
    int n_owned;
    const int n_sets = point_sets(s, p, sets, owned, &n_owned);
    char *metrics = n_sets < 0 ? NULL : point_metrics_path(s, i, err);
    char *label = point_label(s, p, " ");
    char **argv = tg_calloc(2 * SWEEP_SETS_MAX + 10, sizeof *argv);
    int rc = 0;
    if (n_sets < 0 || !label || !argv) rc = tg_fail(err, "out of memory");
    else if (!metrics) rc = -1;
    if (!rc) {
        int argc = 0;
        argv[argc++] = (char *)s->job;
        for (int k = 0; k < n_sets; k++) argv[argc++] = "--set", argv[argc++] = (char *)sets[k];
        argv[argc++] = "--metrics", argv[argc++] = metrics;
        if (s->device_arg) argv[argc++] = "--device", argv[argc++] = (char *)s->device_arg;
        if (s->threads_arg) argv[argc++] = "--threads", argv[argc++] = (char *)s->threads_arg;
        fprintf(stderr, "sweep: point %d of %d (%s): %d steps, the first %d not timed\n", i + 1, s->n_points, label,
                s->warmup + s->steps, s->warmup);
        const int status = run(argc, argv);
        if (point_read_metrics(s, p, metrics, status)) rc = tg_fail(err, "out of memory");
    }
    free(argv), free(label), free(metrics);
    free_owned(owned, n_owned > 0 ? n_owned : 0);
    return rc;
}

/* The progress line of point i once it has run, on stderr: its settings, its numbers (or
 * why it failed), the runs done of those to take, the time since the first began and the
 * time the rest should take at the mean so far. A plain line each point, on a terminal too:
 * the point's run prints its own step lines between them. */
static void point_progress(const sweep_run *s, int i, int runs_done, int runs, double elapsed_s) {
    const sweep_point *p = &s->points[i];
    char *label = point_label(s, p, " ");
    char elapsed[32], eta[32] = "-";
    cli_format_hms(elapsed_s, elapsed, sizeof elapsed);
    if (runs_done > 0) cli_format_hms(elapsed_s / runs_done * (runs - runs_done), eta, sizeof eta);
    fprintf(stderr, "sweep: point %d of %d (%s) %s", i + 1, s->n_points, label ? label : "", point_status_names[p->status]);
    if (p->status == POINT_OK) {
        char peak[32];
        fprintf(stderr, ": %.3f ms a step, %.1f tokens/s, final loss %.4f, planned peak %s", p->median_step_ms,
                p->tokens_per_s, p->final_loss, tg_mem_format_bytes((uint64_t)p->planned_peak, peak, sizeof peak));
    } else {
        fprintf(stderr, ": %s", p->reason ? p->reason : "");
    }
    fprintf(stderr, "; %d of %d runs done in %s, ETA %s\n", runs_done, runs, elapsed, eta);
    free(label);
}

/* ---- results ------------------------------------------------------------------------ */

/* A real rounded through `fmt` (as the metrics file writes them), or null when absent. */
static json_t *rounded(double v, const char *fmt) {
    if (!isfinite(v)) return json_null();
    char text[64];
    snprintf(text, sizeof text, fmt, v);
    return json_real(strtod(text, NULL));
}

static json_t *point_json(const sweep_run *s, int i, double score, int rank, int *failed) {
    const sweep_point *p = &s->points[i];
    json_t *o = json_object(), *settings = json_object();
    if (!o || !settings) {
        json_decref(o), json_decref(settings);
        *failed = 1;
        return NULL;
    }
    tg_json_put(o, "point", json_integer(i + 1), failed);
    for (int a = 0; a < s->n_axes; a++)
        tg_json_put(settings, s->axes[a].key, json_string(s->axes[a].values[p->value[a]]), failed);
    tg_json_put(o, "settings", settings, failed);
    tg_json_put(o, "status", json_string(point_status_names[p->status]), failed);
    if (p->reason) tg_json_put(o, "reason", json_string(p->reason), failed);
    if (p->compiled) {
        tg_json_put(o, "planned_peak_bytes", json_integer((json_int_t)p->planned_peak), failed);
        tg_json_put(o, "memory_estimate_bytes", json_integer((json_int_t)p->estimate), failed);
    }
    if (p->status == POINT_REFUSED && s->free_known)
        tg_json_put(o, "free_bytes", json_integer((json_int_t)s->free_bytes), failed);
    if (p->status == POINT_OK) {
        char metrics[64];
        snprintf(metrics, sizeof metrics, "points/%04d/metrics.jsonl", i + 1);
        tg_json_put(o, "rank", json_integer(rank), failed);
        tg_json_put(o, "score", rounded(score, "%.6f"), failed);
        tg_json_put(o, "steps", json_integer(s->warmup + s->steps), failed);
        tg_json_put(o, "timed_steps", json_integer(p->timed_steps), failed);
        tg_json_put(o, "median_step_ms", rounded(p->median_step_ms, "%.4f"), failed);
        tg_json_put(o, "tokens_per_s", rounded(p->tokens_per_s, "%.1f"), failed);
        tg_json_put(o, "measured_peak_bytes",
                    isfinite(p->measured_peak) ? json_integer((json_int_t)p->measured_peak) : json_null(), failed);
        tg_json_put(o, "first_loss", rounded(p->first_loss, "%.6g"), failed);
        tg_json_put(o, "final_loss", rounded(p->final_loss, "%.6g"), failed);
        if (isfinite(p->joules_per_1k_tokens))
            tg_json_put(o, "joules_per_1k_tokens", rounded(p->joules_per_1k_tokens, "%.6g"), failed);
        if (isfinite(p->cost_per_1m_tokens))
            tg_json_put(o, "cost_per_1m_tokens", rounded(p->cost_per_1m_tokens, "%.6g"), failed);
        tg_json_put(o, "metrics", json_string(metrics), failed);
    }
    return o;
}

static void put_bytes(FILE *f, double bytes, int width) {
    char text[32] = "-";
    if (isfinite(bytes) && bytes >= 0) tg_mem_format_bytes((uint64_t)bytes, text, sizeof text);
    fprintf(f, " %*s", width, text);
}

/* The ranked table and the score's formula. */
static void write_table(FILE *f, const sweep_run *s, const int *order, const int *rank, const double *score,
                        const int used[SWEEP_METRICS]) {
    int width[SWEEP_AXES_MAX], counts[3] = {0};
    for (int i = 0; i < s->n_points; i++) counts[s->points[i].status]++;
    fprintf(f, "sweep of %s on %s: %d points (%d ran, %d refused, %d failed); %d timed steps after %d warm-up steps a point\n",
            s->job, s->device == TG_DEVICE_CUDA ? "cuda" : "cpu", s->n_points, counts[POINT_OK], counts[POINT_REFUSED],
            counts[POINT_FAILED], s->steps, s->warmup);
    fprintf(f, "%4s", "rank");
    for (int a = 0; a < s->n_axes; a++) {
        width[a] = (int)strlen(s->axes[a].key);
        for (int v = 0; v < s->axes[a].n_values; v++)
            if ((int)strlen(s->axes[a].values[v]) > width[a]) width[a] = (int)strlen(s->axes[a].values[v]);
        fprintf(f, "  %-*s", width[a], s->axes[a].key);
    }
    fprintf(f, "  %-7s %10s %12s %12s %13s %10s %7s\n", "status", "step ms", "tokens/s", "planned peak",
            "measured peak", "final loss", "score");
    for (int j = 0; j < s->n_points; j++) {
        const int i = order[j];
        const sweep_point *p = &s->points[i];
        if (rank[i]) fprintf(f, "%4d", rank[i]);
        else fprintf(f, "%4s", "-");
        for (int a = 0; a < s->n_axes; a++) fprintf(f, "  %-*s", width[a], s->axes[a].values[p->value[a]]);
        fprintf(f, "  %-7s", point_status_names[p->status]);
        if (p->status == POINT_OK) {
            fprintf(f, " %10.3f %12.1f", p->median_step_ms, p->tokens_per_s);
            put_bytes(f, p->planned_peak, 12);
            put_bytes(f, p->measured_peak, 13);
            fprintf(f, " %10.4f", p->final_loss);
            if (isfinite(score[i])) fprintf(f, " %7.3f\n", score[i]);
            else fprintf(f, " %7s\n", "-");
        } else {
            if (p->compiled) {
                fprintf(f, " %10s %12s", "-", "-");
                put_bytes(f, p->planned_peak, 12);
                fputc(' ', f);
            }
            fprintf(f, " %s\n", p->reason ? p->reason : "");
        }
    }
    static const char *const what[SWEEP_METRICS] = {"tokens/s / the best tokens/s", "the best planned peak / planned peak",
                                                    "the best joules per 1k tokens / joules per 1k tokens",
                                                    "the best cost per 1M tokens / cost per 1M tokens"};
    fprintf(f, "score = sum(weight * normalised) / sum(weight) over the ok points, 1 the best;");
    int any = 0;
    for (int m = 0; m < SWEEP_METRICS; m++)
        if (used[m]) fprintf(f, "%s %s %g: %s", any++ ? "," : "", sweep_metric_name(m), s->weights.w[m], what[m]);
    if (!any) fprintf(f, " no metric with a weight above 0 is on every ok point: no score");
    fprintf(f, "\n");
    int left = 0;
    for (int m = 0; m < SWEEP_METRICS; m++)
        if (!used[m]) fprintf(f, "%s%s", left++ ? ", " : "left out (weight 0, or not measured on every ok point): ", sweep_metric_name(m));
    if (left) fprintf(f, "\n");
}

/* Writes DIR/name and the artifact's copy of it. */
static int sweep_output(const sweep_run *s, artifact *art, const char *name, const char *data, size_t len, tg_err *err) {
    char *path;
    if (tg_asprintf(&path, "%s/%s", s->out_dir, name) < 0) return tg_fail(err, "out of memory");
    int rc = tg_write_file_atomic(path, &(tg_chunk){data, len}, 1, "sweep result", err);
    free(path);
    if (!rc && art) rc = artifact_write(art, name, data, len, err);
    return rc;
}

/* Whether every value of axis a reads as a distinct finite number. */
static int axis_numeric(const sweep_axis *axis, double *x) {
    for (int v = 0; v < axis->n_values; v++) {
        char *end;
        errno = 0;
        x[v] = strtod(axis->values[v], &end);
        if (errno || *end || !isfinite(x[v]) || end == axis->values[v]) return 0;
        for (int w = 0; w < v; w++)
            if (x[w] == x[v]) return 0;
    }
    return 1;
}

/* The plots of `metric` (0: tokens/s of the ok points; 1: planned peak in MiB of every
 * compiled point) against axis a: one line per combination of the other keys' values
 * (SWEEP_SERIES_MAX at most), the values in increasing order (numbers) or as given
 * (positions 1..n, named in the axis label). */
static int plot_axis(const sweep_run *s, artifact *art, int a, int metric, tg_err *err) {
    static const char *const colors[SWEEP_SERIES_MAX] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                         "#59a14f", "#edc948", "#b07aa1", "#ff9da7"};
    const sweep_axis *axis = &s->axes[a];
    const int nv = axis->n_values;
    const int combos = s->n_points / nv;
    const int n_series = combos < SWEEP_SERIES_MAX ? combos : SWEEP_SERIES_MAX;
    double x[SWEEP_VALUES_MAX], xs[SWEEP_VALUES_MAX];
    int order[SWEEP_VALUES_MAX];
    const int numeric = axis_numeric(axis, x);
    for (int v = 0; v < nv; v++) order[v] = v, x[v] = numeric ? x[v] : v + 1;
    for (int v = 1; v < nv; v++) /* values by x, increasing */
        for (int w = v; w > 0 && x[order[w]] < x[order[w - 1]]; w--) {
            const int t = order[w];
            order[w] = order[w - 1], order[w - 1] = t;
        }
    for (int v = 0; v < nv; v++) xs[v] = x[order[v]];
    double *y = tg_calloc((size_t)(n_series * nv), sizeof *y);
    char **names = tg_calloc((size_t)n_series, sizeof *names);
    chart_series series[SWEEP_SERIES_MAX];
    char x_label[512], title[256], file[128];
    int rc = y && names ? 0 : tg_fail(err, "out of memory");
    /* Series k holds the points whose other keys take their k-th combination (mixed radix). */
    for (int i = 0; i < s->n_points && !rc; i++) {
        const sweep_point *p = &s->points[i];
        int key = 0; /* the point's combination of the other axes, mixed radix */
        for (int b = 0; b < s->n_axes; b++)
            if (b != a) key = key * s->axes[b].n_values + p->value[b];
        if (key >= n_series) continue;
        int pos = 0;
        while (order[pos] != p->value[a]) pos++;
        const int shown = metric == 0 ? p->status == POINT_OK : p->compiled;
        y[key * nv + pos] = !shown ? NAN : metric == 0 ? p->tokens_per_s : p->planned_peak / 1048576.0;
        if (!names[key]) {
            char *label = NULL;
            for (int b = 0; b < s->n_axes && !rc; b++) {
                if (b == a) continue;
                char *next;
                if (tg_asprintf(&next, "%s%s%s=%s", label ? label : "", label ? " " : "", s->axes[b].key,
                                s->axes[b].values[p->value[b]]) < 0)
                    rc = tg_fail(err, "out of memory");
                else free(label), label = next;
            }
            names[key] = label ? label : tg_strdup("all points");
            if (!names[key] && !rc) rc = tg_fail(err, "out of memory");
        }
    }
    if (!rc) {
        int used = snprintf(x_label, sizeof x_label, "%s", axis->key);
        for (int v = 0; !numeric && v < nv && used < (int)sizeof x_label; v++)
            used += snprintf(x_label + used, sizeof x_label - (size_t)used, "%s%d = %s", v ? ", " : " (", v + 1,
                             axis->values[v]);
        if (!numeric && used < (int)sizeof x_label) snprintf(x_label + used, sizeof x_label - (size_t)used, ")");
        for (int k = 0; k < n_series; k++) series[k] = (chart_series){names[k], y + k * nv, colors[k], 0};
        snprintf(title, sizeof title, "%s by %s%s", metric == 0 ? "Throughput" : "Planned peak memory", axis->key,
                 combos > n_series ? " (the first 8 combinations of the other keys)" : "");
        snprintf(file, sizeof file, "plots/%s_vs_%s.svg", metric == 0 ? "throughput" : "memory", axis->key);
        svg_buf b = {0};
        if (svg_line_chart(&b, title, x_label, xs, nv, series, n_series, metric == 0 ? "tokens/s" : "MiB", ""))
            rc = tg_fail(err, "out of memory drawing %s", file);
        else rc = sweep_output(s, art, file, b.text, b.len, err);
        svg_buf_free(&b);
    }
    for (int k = 0; names && k < n_series; k++) free(names[k]);
    free(names), free(y);
    return rc;
}

static int sweep_write_results(sweep_run *s, artifact *art, tg_err *err) {
    const int n = s->n_points;
    double (*metric)[SWEEP_METRICS] = tg_calloc((size_t)n, sizeof *metric);
    double *score = tg_calloc((size_t)n, sizeof *score);
    int *ok = tg_calloc((size_t)n, sizeof *ok), *order = tg_calloc((size_t)n, sizeof *order);
    int *rank = tg_calloc((size_t)n, sizeof *rank);
    char *jsonl = NULL, *table = NULL;
    size_t jsonl_len = 0, table_len = 0;
    int rc = metric && score && ok && order && rank ? 0 : tg_fail(err, "out of memory");
    int used[SWEEP_METRICS];
    if (!rc) {
        for (int i = 0; i < n; i++) {
            const sweep_point *p = &s->points[i];
            ok[i] = p->status == POINT_OK;
            metric[i][SWEEP_THROUGHPUT] = p->tokens_per_s;
            metric[i][SWEEP_MEMORY] = p->planned_peak;
            metric[i][SWEEP_ENERGY] = p->joules_per_1k_tokens;
            metric[i][SWEEP_COST] = p->cost_per_1m_tokens;
        }
        sweep_score((const double (*)[SWEEP_METRICS])metric, ok, n, &s->weights, score, used);
        sweep_rank(score, ok, n, order, rank);
        FILE *f = open_memstream(&jsonl, &jsonl_len);
        int failed = !f;
        for (int i = 0; i < n && !failed; i++) {
            json_t *o = point_json(s, i, score[i], rank[i], &failed);
            if (o && (json_dumpf(o, f, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) || fputc('\n', f) == EOF))
                failed = 1;
            json_decref(o);
        }
        if (f && fclose(f)) failed = 1;
        FILE *t = failed ? NULL : open_memstream(&table, &table_len);
        if (t) {
            write_table(t, s, order, rank, score, used);
            if (fclose(t)) failed = 1;
        }
        if (failed || !t) rc = tg_fail(err, "out of memory writing the results");
    }
    if (!rc) rc = sweep_output(s, art, "results.jsonl", jsonl, jsonl_len, err);
    if (!rc) rc = sweep_output(s, art, "results.txt", table, table_len, err);
    if (!rc) fwrite(table, 1, table_len, stdout);
    int any_ok = 0, any_compiled = 0;
    for (int i = 0; i < n; i++) any_ok |= s->points[i].status == POINT_OK, any_compiled |= s->points[i].compiled;
    char *plots = NULL;
    if (!rc && (tg_asprintf(&plots, "%s/plots", s->out_dir) < 0 || (mkdir(plots, 0777) && errno != EEXIST)))
        rc = plots ? tg_fail(err, "%s: cannot create the folder: %s", plots, strerror(errno)) : tg_fail(err, "out of memory");
    free(plots);
    for (int a = 0; a < s->n_axes && !rc; a++) {
        if (any_ok) rc = plot_axis(s, art, a, 0, err);
        if (!rc && any_compiled) rc = plot_axis(s, art, a, 1, err);
    }
    free(metric), free(score), free(ok), free(order), free(rank), free(jsonl), free(table);
    return rc;
}

/* The artifact's job, environment, per-point plans and metrics (the results and plots
 * went in as they were written). */
static int sweep_artifact(sweep_run *s, artifact *art, tg_err *err) {
    int rc = artifact_job(art, s->job, err);
    if (!rc) rc = artifact_environment(art, s->device == TG_DEVICE_CUDA ? "cuda" : "cpu", err);
    for (int i = 0; i < s->n_points && !rc; i++) {
        sweep_point *p = &s->points[i];
        char prefix[64], name[96];
        snprintf(prefix, sizeof prefix, "points/%04d/", i + 1);
        if (p->compiled) {
            const char *sets[SWEEP_SETS_MAX];
            char *owned[SWEEP_AXES_MAX + 1];
            int n_owned;
            const int n = point_sets(s, p, sets, owned, &n_owned);
            tg_plan plan;
            const uint64_t available = s->device == TG_DEVICE_CUDA && s->free_known ? s->free_bytes : 0;
            if (n < 0) rc = tg_fail(err, "out of memory");
            else if (tg_front_compile_file_for(s->job, sets, n, available, &plan, err) == 0) {
                rc = artifact_plan(art, prefix, s->job, sets, n, &plan, err);
                tg_plan_free(&plan);
            } else {
                rc = -1;
            }
            free_owned(owned, n_owned);
        }
        if (!rc && (p->status == POINT_OK || p->status == POINT_FAILED)) {
            char *path;
            struct stat st;
            if (tg_asprintf(&path, "%s/points/%04d/metrics.jsonl", s->out_dir, i + 1) < 0) rc = tg_fail(err, "out of memory");
            else {
                snprintf(name, sizeof name, "%smetrics.jsonl", prefix);
                if (stat(path, &st) == 0) rc = artifact_copy(art, name, path, "metrics file", err);
                free(path);
            }
        }
    }
    return rc;
}

static void sweep_free(sweep_run *s) {
    for (int a = 0; a < s->n_axes; a++) sweep_axis_free(&s->axes[a]);
    for (int i = 0; s->points && i < s->n_points; i++) free(s->points[i].reason);
    free(s->points);
}

int cmd_sweep(int argc, char **argv, cli_command_fn run) {
    sweep_run s;
    memset(&s, 0, sizeof s);
    s.steps = SWEEP_STEPS_DEFAULT, s.warmup = SWEEP_WARMUP_DEFAULT;
    sweep_weights_default(&s.weights);
    int rc = sweep_parse_args(argc, argv, &s);
    if (!rc) rc = sweep_check_keys(&s);
    if (rc) {
        sweep_free(&s);
        return rc;
    }
    tg_err err = {{0}};
    s.device = s.device_arg ? (tg_device)tg_device_parse(s.device_arg) : tg_default_device();
    artifact *art = NULL;
    char *points_dir = NULL;
    s.points = tg_calloc((size_t)s.n_points, sizeof *s.points);
    if (!s.points || tg_asprintf(&points_dir, "%s/points", s.out_dir) < 0) rc = tg_fail(&err, "out of memory");
    else if ((rc = artifact_make_folders(s.out_dir)))
        rc = tg_fail(&err, "%s: cannot create the sweep folder (-o): %s", s.out_dir, strerror(rc));
    else if (mkdir(points_dir, 0777) && errno != EEXIST)
        rc = tg_fail(&err, "%s: cannot create the folder: %s", points_dir, strerror(errno));
    free(points_dir);
    if (!rc && s.artifact_dir) {
        char *a = realpath(s.artifact_dir, NULL), *o = realpath(s.out_dir, NULL);
        if (a && o && !strcmp(a, o)) rc = tg_fail(&err, "--artifact %s is the sweep folder (-o): give each its own", s.artifact_dir);
        free(a), free(o);
        if (!rc) rc = artifact_open(&art, s.artifact_dir, "sweep", &err);
    }
    if (!rc) {
        tg_err free_err;
        s.free_known = tg_device_free_memory(s.device, 0, &s.free_bytes, s.free_source, sizeof s.free_source, &free_err) == 0;
        if (!s.free_known) fprintf(stderr, "sweep: free memory unknown (%s): no point is refused before its run\n", free_err.msg);
    }
    /* Every point compiled (and checked against free memory) before any runs. */
    for (int i = 0; i < s.n_points && !rc; i++) {
        int rest = i;
        for (int a = s.n_axes - 1; a >= 0; a--) s.points[i].value[a] = rest % s.axes[a].n_values, rest /= s.axes[a].n_values;
        s.points[i].measured_peak = s.points[i].median_step_ms = s.points[i].tokens_per_s = NAN;
        s.points[i].first_loss = s.points[i].final_loss = NAN;
        s.points[i].joules_per_1k_tokens = s.points[i].cost_per_1m_tokens = NAN;
        s.points[i].planned_peak = s.points[i].estimate = NAN;
        if (point_compile(&s, &s.points[i])) rc = tg_fail(&err, "out of memory");
    }
    int runs = 0, runs_done = 0;
    for (int i = 0; i < s.n_points; i++) runs += s.points[i].status == POINT_OK;
    const double runs_start = tg_wall_s();
    for (int i = 0; i < s.n_points && !rc; i++) {
        sweep_point *p = &s.points[i];
        if (p->status != POINT_OK) {
            char *label = point_label(&s, p, " ");
            fprintf(stderr, "sweep: point %d of %d (%s) %s: %s\n", i + 1, s.n_points, label ? label : "",
                    point_status_names[p->status], p->reason);
            free(label);
            continue;
        }
        rc = point_run(&s, i, run, &err);
        if (!rc) point_progress(&s, i, ++runs_done, runs, tg_wall_s() - runs_start);
    }
    if (!rc) rc = sweep_write_results(&s, art, &err);
    if (!rc && art) rc = sweep_artifact(&s, art, &err);
    if (!rc && art) {
        rc = artifact_close(art, &err);
        art = NULL;
        if (!rc) fprintf(stderr, "artifact %s (manifest.json lists its files)\n", s.artifact_dir);
    }
    artifact_free(art);
    int any_failed = 0;
    for (int i = 0; i < s.n_points && s.points; i++) any_failed |= s.points[i].status == POINT_FAILED;
    if (rc) fprintf(stderr, "tunegraph sweep: %s\n", err.msg);
    else fprintf(stderr, "sweep: results in %s/results.jsonl and %s/results.txt, plots in %s/plots\n", s.out_dir,
                 s.out_dir, s.out_dir);
    sweep_free(&s);
    return rc || any_failed ? 1 : 0;
}
