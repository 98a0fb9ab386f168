/* `tunegraph plot METRICS.jsonl -o DIR`: the charts of a run's metrics file as SVG files. */
#ifndef TUNEGRAPH_CLI_PLOT_H
#define TUNEGRAPH_CLI_PLOT_H

#include "base/error.h"

/* argv: the arguments after "plot". Returns the process's exit status. */
int cmd_plot(int argc, char **argv);

/* The profile's breakdown of a step as an SVG file at `path` (atomically; "wrote PATH" on
 * stderr): ms by phase, then ms by kernel group, in the order given. 0, or -1 with err. */
int plot_write_profile(const char *path, const char *const *phases, const double *phase_ms, int n_phases,
                       const char *const *groups, const double *group_ms, int n_groups, tg_err *err);

#endif
