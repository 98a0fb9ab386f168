/* `tunegraph plot METRICS.jsonl -o DIR`: the charts of a run's metrics file as SVG files. */
#ifndef TUNEGRAPH_CLI_PLOT_H
#define TUNEGRAPH_CLI_PLOT_H

/* argv: the arguments after "plot". Returns the process's exit status. */
int cmd_plot(int argc, char **argv);

#endif
