/* `tunegraph compare A B`: the headline metrics of two runs or two sweeps side by side,
 * each an artifact folder (its files checked against its manifest first), a run's metrics
 * file or a sweep's results.jsonl: median step time, tokens/s, measured and planned peak
 * memory, final loss, and energy, cost and MFU where either has them, with B - A and
 * (B - A) / A; sweeps point by point, matched by their settings. For artifacts, whether the
 * job file, the plan file and the plan's fingerprint match. */
#ifndef TUNEGRAPH_CLI_COMPARE_H
#define TUNEGRAPH_CLI_COMPARE_H

/* argv: the arguments after "compare". The process's exit status (2: a usage error). */
int cmd_compare(int argc, char **argv);

#endif
