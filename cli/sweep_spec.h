/* The parts of `tunegraph sweep` that need no run: its --grid and --weights arguments
 * and the weighted score that ranks the points (cli/sweep.c runs them). Kept apart so the
 * parsers can be fuzzed alone (tests/fuzz/fuzz_sweep_grid.c, fuzz_sweep_weights.c). */
#ifndef TUNEGRAPH_CLI_SWEEP_SPEC_H
#define TUNEGRAPH_CLI_SWEEP_SPEC_H

#include <stddef.h>

#include "base/error.h"

#define SWEEP_AXES_MAX 8      /* --grid arguments */
#define SWEEP_VALUES_MAX 64   /* values of one --grid */
#define SWEEP_POINTS_MAX 1024 /* the grid's product */
#define SWEEP_KEY_MAX 63      /* a key's longest, in bytes */
#define SWEEP_VALUE_MAX 255   /* a value's longest, in bytes */

/* One --grid argument: a job key and the values it takes, in the order given. */
typedef struct sweep_axis {
    char key[SWEEP_KEY_MAX + 1];
    int n_values;
    char *values[SWEEP_VALUES_MAX]; /* malloc'd */
} sweep_axis;

/* Parses "key=v1,v2,..." (values separated by '|' instead when the text after '=' holds a
 * '|', for values that hold commas: "seq_buckets=16,32|32,64"). The key is lower-case
 * letters, digits and '_'; values are non-empty, at most SWEEP_VALUE_MAX bytes, without
 * control characters, and distinct. 0, or -1 with a message naming the argument and
 * *axis empty. */
int sweep_grid_parse(const char *spec, sweep_axis *axis, tg_err *err);
void sweep_axis_free(sweep_axis *axis);

/* The metrics the score weighs: throughput (tokens/s) higher is better, the others lower. */
enum { SWEEP_THROUGHPUT = 0, SWEEP_MEMORY, SWEEP_ENERGY, SWEEP_COST, SWEEP_METRICS };
const char *sweep_metric_name(int metric);

typedef struct sweep_weights {
    double w[SWEEP_METRICS];
} sweep_weights;

/* Every weight 1: the weights without --weights. */
void sweep_weights_default(sweep_weights *w);
/* Parses "throughput=W,memory=W,energy=W,cost=W" (any subset, each name once; the names
 * not given weigh 0): each W a finite number from 0 to 1e6, at least one above 0. 0, or -1
 * with a message naming the argument and *w untouched. */
int sweep_weights_parse(const char *spec, sweep_weights *w, tg_err *err);

/* The score of each of the n points from its metrics (NaN or <= 0: absent), over the
 * points whose ok[i] is set: a metric counts when its weight is above 0 and every ok point
 * has it; each counted value is normalised to the best ok point's (throughput: value /
 * highest; the others: lowest / value, so 1 is the best and every normalised value lies
 * in (0, 1]), and the score is the weighted mean of the normalised values, sum(w * norm) /
 * sum(w). used[m] says which metrics counted. A point not ok, or every point when no
 * metric counts, scores NaN. */
void sweep_score(const double (*metric)[SWEEP_METRICS], const int *ok, int n, const sweep_weights *w,
                 double *score, int used[SWEEP_METRICS]);

/* The ranking: order[0..n) the point indices, scored points first by score (highest first),
 * then the ok points without a score, then the rest, each group in point order. rank[i]:
 * point i's place from 1 among the ok points, 0 for the others. Returns the ok count. */
int sweep_rank(const double *score, const int *ok, int n, int *order, int *rank);

#endif
