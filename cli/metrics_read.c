#include "cli/metrics_read.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

void metrics_series_free(metrics_series *s) {
    free(s->step), free(s->loss), free(s->lr), free(s->step_ms), free(s->tokens_per_s), free(s->comm_ms), free(s->exposed_comm_ms);
    for (int k = 0; k < 4; k++) free(s->phase_ms[k]);
    memset(s, 0, sizeof *s);
}

/* Room for one more step in every series; -1 when out of memory. */
static int series_grow(metrics_series *s, int64_t *cap) {
    if (s->n < *cap) return 0;
    const int64_t want = *cap ? *cap * 2 : 256;
    double **reals[] = {&s->loss,        &s->lr,          &s->step_ms,     &s->tokens_per_s,   &s->phase_ms[0],
                        &s->phase_ms[1], &s->phase_ms[2], &s->phase_ms[3], &s->comm_ms,
                        &s->exposed_comm_ms};
    for (size_t k = 0; k < sizeof reals / sizeof reals[0]; k++) {
        double *p = tg_realloc(*reals[k], (size_t)want * sizeof **reals[k]);
        if (!p) return -1;
        *reals[k] = p;
    }
    int64_t *steps = tg_realloc(s->step, (size_t)want * sizeof *steps);
    if (!steps) return -1;
    s->step = steps;
    *cap = want;
    return 0;
}

/* A step line's number field: a JSON number, or null (a value that was not finite). */
static int series_real(json_t *o, const char *key, double *v, const char *path, int64_t line, tg_err *err) {
    json_t *x = json_object_get(o, key);
    if (json_is_null(x)) {
        *v = NAN;
        return 0;
    }
    if (!json_is_number(x)) return tg_fail(err, "%s: line %lld: step line without a number '%s'", path, (long long)line, key);
    *v = json_number_value(x);
    return 0;
}

static const char *const series_step_keys[] = {"loss",     "lr",         "step_ms",     "tokens_per_s",
                                        "batch_ms", "forward_ms", "backward_ms", "optimizer_ms"};

static int series_read_step(json_t *o, metrics_series *s, int64_t *cap, const char *path, int64_t line, tg_err *err) {
    json_t *step = json_object_get(o, "step");
    if (!json_is_integer(step) || json_integer_value(step) < 1)
        return tg_fail(err, "%s: line %lld: 'step' is not a step number (a whole number from 1)", path, (long long)line);
    const int64_t k = json_integer_value(step);
    if (s->n && k <= s->step[s->n - 1])
        return tg_fail(err, "%s: line %lld: step %lld after step %lld (steps must increase)", path, (long long)line,
                       (long long)k, (long long)s->step[s->n - 1]);
    if (series_grow(s, cap)) return tg_fail(err, "%s: out of memory at line %lld", path, (long long)line);
    double v[8];
    for (int j = 0; j < 8; j++)
        if (series_real(o, series_step_keys[j], &v[j], path, line, err)) return -1;
    double comm = NAN, exposed = NAN;
    if (json_object_get(o, "comm_ms") || json_object_get(o, "exposed_comm_ms")) {
        if (series_real(o, "comm_ms", &comm, path, line, err) || series_real(o, "exposed_comm_ms", &exposed, path, line, err))
            return -1;
        s->has_comm = 1;
    }
    const int64_t i = s->n++;
    s->step[i] = k, s->loss[i] = v[0], s->lr[i] = v[1], s->step_ms[i] = v[2], s->tokens_per_s[i] = v[3];
    for (int p = 0; p < 4; p++) s->phase_ms[p][i] = v[4 + p];
    s->comm_ms[i] = comm, s->exposed_comm_ms[i] = exposed;
    return 0;
}

/* A profile_group or profile_phase line (`key`) into names[*n], ms[*n]. */
static int series_read_named_ms(json_t *o, const char *key, const char *what, char (*names)[64], double *ms_out, int *n,
                                const char *path, int64_t line, tg_err *err) {
    const char *name = json_string_value(json_object_get(o, key));
    json_t *ms = json_object_get(o, "ms");
    if (!name || !*name || strlen(name) >= sizeof names[0] || !json_is_number(ms) || !(json_number_value(ms) >= 0))
        return tg_fail(err, "%s: line %lld: a %s line needs a %s name (at most 63 bytes) and its ms", path,
                       (long long)line, key, what);
    if (*n == METRICS_GROUPS_MAX)
        return tg_fail(err, "%s: line %lld: more than %d %ss", path, (long long)line, METRICS_GROUPS_MAX,
                       !strcmp(what, "group") ? "kernel group" : what);
    snprintf(names[*n], sizeof names[0], "%s", name);
    ms_out[(*n)++] = json_number_value(ms);
    return 0;
}

/* One line: 0 when read (or one of the kinds a plot does not use), -1 with a message. */
static int series_read_line(const char *p, size_t n, metrics_series *s, int64_t *cap, const char *path, int64_t line,
                     tg_err *err) {
    json_error_t je;
    json_t *o = json_loadb(p, n, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return tg_fail(err, "%s: line %lld: not a JSON object%s%s", path, (long long)line, o ? "" : ": ",
                       o ? "" : je.text);
    }
    int rc = 0;
    if (json_object_get(o, "profile_group"))
        rc = series_read_named_ms(o, "profile_group", "group", s->group, s->group_ms, &s->n_groups, path, line, err);
    else if (json_object_get(o, "profile_phase"))
        rc = series_read_named_ms(o, "profile_phase", "phase", s->phase, s->profile_phase_ms, &s->n_phases, path, line,
                                  err);
    else if (json_object_get(o, "step")) rc = series_read_step(o, s, cap, path, line, err);
    else if (!json_object_get(o, "summary") && !json_object_get(o, "event") && !json_object_get(o, "profile_op") &&
             !json_object_get(o, "profile_op_index") && !json_object_get(o, "profile_comm_bucket") &&
             !json_object_get(o, "cost_model"))
        rc = tg_fail(err, "%s: line %lld: not a metrics line (no step, summary, event or profile key)", path,
                     (long long)line);
    json_decref(o);
    return rc;
}

int metrics_read(const char *path, const char *text, size_t len, metrics_series *out, tg_err *err) {
    memset(out, 0, sizeof *out);
    int64_t cap = 0, line = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        const size_t end = nl ? (size_t)(nl - text) : len;
        line++;
        if (end == at || series_read_line(text + at, end - at, out, &cap, path, line, err)) {
            if (end == at) tg_fail(err, "%s: line %lld: empty line", path, (long long)line);
            metrics_series_free(out);
            return -1;
        }
        at = end + 1;
    }
    if (out->n == 0) {
        metrics_series_free(out);
        return tg_fail(err, "%s: no step lines to plot", path);
    }
    return 0;
}
