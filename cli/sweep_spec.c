/* `tunegraph sweep`'s --grid and --weights arguments and its weighted score
 * (cli/sweep_spec.h). */
#include "cli/sweep_spec.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

#define SWEEP_WEIGHT_MAX 1e6

static const char *const metric_names[SWEEP_METRICS] = {"throughput", "memory", "energy", "cost"};

const char *sweep_metric_name(int metric) {
    return metric >= 0 && metric < SWEEP_METRICS ? metric_names[metric] : "?";
}

void sweep_axis_free(sweep_axis *axis) {
    for (int v = 0; v < axis->n_values; v++) free(axis->values[v]);
    memset(axis, 0, sizeof *axis);
}

/* Refuses with the message and leaves *axis empty. */
static int grid_fail(sweep_axis *axis, tg_err *err, const char *spec, const char *why) {
    sweep_axis_free(axis);
    /* A spec past the message's room is cut: the reason matters more. */
    return tg_fail(err, "--grid '%.200s%s': %s", spec, strlen(spec) > 200 ? "..." : "", why);
}

int sweep_grid_parse(const char *spec, sweep_axis *axis, tg_err *err) {
    memset(axis, 0, sizeof *axis);
    const char *eq = strchr(spec, '=');
    if (!eq) return grid_fail(axis, err, spec, "no '=' (want key=v1,v2,...)");
    const size_t key_len = (size_t)(eq - spec);
    if (key_len == 0) return grid_fail(axis, err, spec, "no key before '='");
    if (key_len > SWEEP_KEY_MAX) return grid_fail(axis, err, spec, "the key is longer than 63 bytes");
    for (size_t i = 0; i < key_len; i++)
        if (!islower((unsigned char)spec[i]) && !isdigit((unsigned char)spec[i]) && spec[i] != '_')
            return grid_fail(axis, err, spec, "a job key is lower-case letters, digits and '_'");
    memcpy(axis->key, spec, key_len);
    const char *list = eq + 1;
    if (!*list) return grid_fail(axis, err, spec, "no values after '='");
    const char sep = strchr(list, '|') ? '|' : ',';
    for (const char *v = list;; v++) {
        const size_t len = strcspn(v, sep == '|' ? "|" : ",");
        char why[128];
        if (len == 0) {
            snprintf(why, sizeof why, "value %d is empty", axis->n_values + 1);
            return grid_fail(axis, err, spec, why);
        }
        if (len > SWEEP_VALUE_MAX) {
            snprintf(why, sizeof why, "value %d is longer than %d bytes", axis->n_values + 1, SWEEP_VALUE_MAX);
            return grid_fail(axis, err, spec, why);
        }
        for (size_t i = 0; i < len; i++)
            if (iscntrl((unsigned char)v[i])) {
                snprintf(why, sizeof why, "value %d holds a control character", axis->n_values + 1);
                return grid_fail(axis, err, spec, why);
            }
        if (axis->n_values == SWEEP_VALUES_MAX) {
            snprintf(why, sizeof why, "more than %d values", SWEEP_VALUES_MAX);
            return grid_fail(axis, err, spec, why);
        }
        for (int k = 0; k < axis->n_values; k++)
            if (strlen(axis->values[k]) == len && !memcmp(axis->values[k], v, len)) {
                snprintf(why, sizeof why, "value %d repeats value %d ('%.*s')", axis->n_values + 1, k + 1,
                         (int)(len > 40 ? 40 : len), v);
                return grid_fail(axis, err, spec, why);
            }
        char *copy = tg_strndup(v, len);
        if (!copy) return grid_fail(axis, err, spec, "out of memory");
        axis->values[axis->n_values++] = copy;
        v += len;
        if (!*v) break;
    }
    return 0;
}

void sweep_weights_default(sweep_weights *w) {
    for (int m = 0; m < SWEEP_METRICS; m++) w->w[m] = 1;
}

int sweep_weights_parse(const char *spec, sweep_weights *out, tg_err *err) {
    sweep_weights w = {{0}};
    int seen[SWEEP_METRICS] = {0};
    const char *shown = strlen(spec) > 200 ? "(too long to show)" : spec;
    if (!*spec) return tg_fail(err, "--weights '': empty (want throughput=W,memory=W,energy=W,cost=W)");
    for (const char *p = spec;;) {
        const size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        if (!eq)
            return tg_fail(err, "--weights '%s': '%.*s' is not name=W (want throughput=W,memory=W,energy=W,cost=W)",
                           shown, (int)(len > 60 ? 60 : len), p);
        const size_t name_len = (size_t)(eq - p);
        int m = 0;
        while (m < SWEEP_METRICS && (strlen(metric_names[m]) != name_len || memcmp(metric_names[m], p, name_len))) m++;
        if (m == SWEEP_METRICS)
            return tg_fail(err, "--weights '%s': unknown metric '%.*s' (throughput, memory, energy or cost)", shown,
                           (int)(name_len > 60 ? 60 : name_len), p);
        if (seen[m]) return tg_fail(err, "--weights '%s': '%s' given twice", shown, metric_names[m]);
        seen[m] = 1;
        char number[64];
        const size_t number_len = len - name_len - 1;
        char *end = NULL;
        double v = NAN;
        if (number_len > 0 && number_len < sizeof number && !isspace((unsigned char)eq[1])) {
            memcpy(number, eq + 1, number_len);
            number[number_len] = 0;
            errno = 0;
            v = strtod(number, &end);
            if (errno || *end) v = NAN;
        }
        if (!isfinite(v) || v < 0 || v > SWEEP_WEIGHT_MAX)
            return tg_fail(err, "--weights '%s': the weight of '%s' must be a number from 0 to 1e6, got '%.*s'", shown,
                           metric_names[m], (int)(number_len > 60 ? 60 : number_len), eq + 1);
        w.w[m] = v;
        p += len;
        if (!*p) break;
        p++;
        if (!*p) return tg_fail(err, "--weights '%s': nothing after the last ','", shown);
    }
    double sum = 0;
    for (int m = 0; m < SWEEP_METRICS; m++) sum += w.w[m];
    if (!(sum > 0)) return tg_fail(err, "--weights '%s': every weight is 0: give at least one above 0", shown);
    *out = w;
    return 0;
}

/* Whether a metric's value is there: finite and above 0 (a rate or size of 0 cannot be
 * normalised). */
static int metric_present(double v) { return isfinite(v) && v > 0; }

void sweep_score(const double (*metric)[SWEEP_METRICS], const int *ok, int n, const sweep_weights *w,
                 double *score, int used[SWEEP_METRICS]) {
    double best[SWEEP_METRICS];
    int any_ok = 0;
    for (int i = 0; i < n; i++) any_ok |= ok[i] != 0;
    for (int m = 0; m < SWEEP_METRICS; m++) {
        used[m] = any_ok && w->w[m] > 0;
        best[m] = NAN;
        for (int i = 0; i < n && used[m]; i++) {
            if (!ok[i]) continue;
            const double v = metric[i][m];
            if (!metric_present(v)) used[m] = 0;
            else if (isnan(best[m]) || (m == SWEEP_THROUGHPUT ? v > best[m] : v < best[m])) best[m] = v;
        }
    }
    double weight_sum = 0;
    for (int m = 0; m < SWEEP_METRICS; m++)
        if (used[m]) weight_sum += w->w[m];
    for (int i = 0; i < n; i++) {
        score[i] = NAN;
        if (!ok[i] || !(weight_sum > 0)) continue;
        double sum = 0;
        for (int m = 0; m < SWEEP_METRICS; m++) {
            if (!used[m]) continue;
            const double v = metric[i][m];
            sum += w->w[m] * (m == SWEEP_THROUGHPUT ? v / best[m] : best[m] / v);
        }
        score[i] = sum / weight_sum;
    }
}

int sweep_rank(const double *score, const int *ok, int n, int *order, int *rank) {
    int k = 0;
    /* Scored points by score, a stable insertion sort (n is at most SWEEP_POINTS_MAX). */
    for (int i = 0; i < n; i++) {
        if (!ok[i] || isnan(score[i])) continue;
        int j = k++;
        while (j > 0 && score[order[j - 1]] < score[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (int i = 0; i < n; i++)
        if (ok[i] && isnan(score[i])) order[k++] = i;
    const int n_ok = k;
    for (int i = 0; i < n; i++)
        if (!ok[i]) order[k++] = i;
    for (int i = 0; i < n; i++) rank[i] = 0;
    for (int j = 0; j < n_ok; j++) rank[order[j]] = j + 1;
    return n_ok;
}
