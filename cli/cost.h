/* The cost model on the command line (plan/cost_model.h): `tunegraph inspect PLAN|JOB
 * --predict`, `tunegraph calibrate`, and the predicted-against-measured table of
 * `run --profile`. */
#ifndef TUNEGRAPH_CLI_COST_H
#define TUNEGRAPH_CLI_COST_H

#include <stdio.h>

#include "base/error.h"
#include "plan/cost_model.h"
#include "plan/plan.h"

/* `tunegraph inspect PLAN|JOB --predict [--gpu KEY|cpu|auto] [--threads N] [--calibration FILE]
 * [--set key=value]...` (argv without "inspect"): the predicted step on stdout. */
int cmd_inspect_predict(int argc, char **argv);
/* Whether argv[0..argc) holds `--predict`: inspect hands such a command line to
 * cmd_inspect_predict. */
int cost_wants_predict(int argc, char **argv);

/* `tunegraph calibrate [--device cpu|cuda] [--threads N] [--repeats N] [-o FILE]`: a short
 * measured sweep of small plans, op by op, and the fitted factors written to the cache
 * (tg_cost_calibration_path) or FILE. */
int cmd_calibrate(int argc, char **argv);

/* The device the model predicts for: `which` is a GPU key, "cpu", or "auto"/NULL (the
 * detected GPU when the build has the CUDA executor and one is there, else the CPU),
 * with the calibration from `calibration` (a file that must parse) or else the cache's
 * file for the device, where there is one. threads: the CPU executor's (<= 0: one per
 * core). A cached file that cannot be used leaves the defaults, with why in note. */
int cost_device_resolve(const char *which, const tg_plan *plan, int threads, const char *calibration,
                        tg_cost_device *d, char *note, size_t note_len, tg_err *err);

/* After `run --profile`: the model's prediction for the plan on the device that ran it
 * (cuda: the detected GPU; cpu: `threads`), beside the profile's op times (op_ms, mean ms
 * per op) and the run's median step (step_ms; 0: unknown), per kernel group, per phase and
 * per step with the error in percent, on `out`, and as cost_model lines into metrics
 * when not NULL. A device the model has no description of is said and skipped. 0, or -1
 * when a metrics line was not written. */
int cost_report_profile(const tg_plan *plan, int cuda, int threads, const double *op_ms, double step_ms, FILE *out,
                        FILE *metrics);

#endif
