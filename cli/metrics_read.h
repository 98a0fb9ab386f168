/* Reading back a metrics file of `tunegraph run --metrics` (cli/metrics.c writes it) for
 * `tunegraph plot`: the step lines' series and the profile's phases and kernel groups. Strict: every
 * line must be one of the kinds the writer writes, and a step line must carry its fields. */
#ifndef TUNEGRAPH_CLI_METRICS_READ_H
#define TUNEGRAPH_CLI_METRICS_READ_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define METRICS_GROUPS_MAX 16

/* The step lines in file order (steps strictly increasing); a value that was not finite
 * (written as null) is NaN, and comm_ms and exposed_comm_ms are NaN on steps without them. */
typedef struct metrics_series {
    int64_t n;
    int64_t *step;
    double *loss, *lr, *step_ms, *tokens_per_s;
    double *phase_ms[4]; /* batch, forward, backward, optimizer */
    double *comm_ms, *exposed_comm_ms; /* data parallelism on CUDA: the gradient sums */
    int has_comm;        /* some step carries comm_ms and exposed_comm_ms */
    /* The profile's kernel groups (profile_group lines), in file order. */
    int n_groups;
    char group[METRICS_GROUPS_MAX][64];
    double group_ms[METRICS_GROUPS_MAX];
    /* The profile's phases (profile_phase lines), in file order. */
    int n_phases;
    char phase[METRICS_GROUPS_MAX][64];
    double profile_phase_ms[METRICS_GROUPS_MAX];
} metrics_series;

/* Parses `len` bytes of a metrics file named `path` (for messages: "PATH: line N: ...").
 * 0, or -1 with the message and *out empty. */
int metrics_read(const char *path, const char *text, size_t len, metrics_series *out, tg_err *err);
void metrics_series_free(metrics_series *s);

#endif
