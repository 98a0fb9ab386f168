/* `tunegraph sweep JOB --grid key=v1,v2 [--grid ...] -o DIR`: every point of the grid of job
 * keys compiled, those whose memory estimate does not fit the device's free memory refused
 * unrun, the rest trained for a fixed number of steps by `run` itself, and DIR/results.jsonl,
 * the ranked table DIR/results.txt (also printed) and the SVG plots of throughput and
 * memory against each swept key written (README.md: "Sweeps and artifacts"). */
#ifndef TUNEGRAPH_CLI_SWEEP_H
#define TUNEGRAPH_CLI_SWEEP_H

#include "cli/artifact.h"

/* argv: the arguments after "sweep"; run: `tunegraph run`'s entry point. The process's
 * exit status: 0, 1 when a point failed or the sweep could not be written, 2 on a usage
 * error. */
int cmd_sweep(int argc, char **argv, cli_command_fn run);

#endif
