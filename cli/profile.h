/* `tunegraph run --profile`: the step's time op by op. */
#ifndef TUNEGRAPH_CLI_PROFILE_H
#define TUNEGRAPH_CLI_PROFILE_H

#include <stdio.h>

#include "base/error.h"
#include "cli/metrics.h"
#include "runtime/trainer.h"

/* Steps the profile averages over (every replica takes them). */
#define PROFILE_REPEATS 5

/* Where the time of one step goes, op by op (launched singly, so each op's time is its
 * kernel time plus launch gaps that the captured graph mostly hides): totals by phase (and
 * the gradient sums the captured steps' backward did not hide), by kernel group and by op
 * kind, and the slowest ops on stderr, beside step_ms (the captured step's median; 0:
 * unknown); a line per phase, group, op kind and op in the metrics file when it is not
 * NULL, and the phases and groups as an SVG chart at svg_path when it is not NULL
 * (cli/plot.h). Runs PROFILE_REPEATS more steps, which move the weights. */
int report_profile(tg_trainer *tr, metrics_file *metrics, double step_ms, const char *svg_path, tg_err *err);

/* The gradient sums of the captured steps (data parallelism on CUDA), bucket by bucket in
 * the order the backward completes them, on stderr: bytes (the timeline's last entry
 * counts the buckets past it), mean begin and end in ms from the backward's end, and what
 * of each the backward did not hide; a line per bucket into metrics when it is not NULL.
 * Nothing where the timeline is empty. 0, or -1 when a metrics line was not written. */
int report_comm_timeline(const tg_plan *plan, const tg_comm_timeline *c, FILE *metrics);

#endif
