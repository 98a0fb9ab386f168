/* The metrics file of `tunegraph run --metrics`: one JSON object per line, one line per
 * step, per profiled op kind and op, and a summary line at the end; a run that fails ends
 * it with an error line instead. */
#ifndef TUNEGRAPH_CLI_METRICS_H
#define TUNEGRAPH_CLI_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "plan/plan.h"
#include "runtime/nvml_energy.h"
#include "runtime/trainer.h"

/* What the summary line reports about a finished run. */
typedef struct metrics_summary {
    int32_t steps;
    int32_t skipped_steps; /* steps not applied: their gradient norm was not finite */
    double first_loss, final_loss;
    double train_s, warmup_s;
    int64_t tokens;              /* every replica's, over the whole run */
    /* Of the token slots the steps computed (batch x each step's seq), the share that was
     * padding: replica 0's, standing for each. */
    double padding_fraction;
    double batch_wait_s;         /* the training loop's waits for batches not yet filled */
    double median_step_ms;
    double host_cpu_us;          /* the whole process per step after the first, driver included */
    double loop_cpu_us;          /* the training loop thread's */
    double driver_cpu_us;        /* the CUDA driver's event thread's */
    const char *device;          /* "cpu" or "cuda" */
    int replicas;
    /* Data parallelism on CUDA: medians over the steps after the first of the gradient
     * sums' busy ms and of the ms of them after the backward; comm_ms <= 0: not measured. */
    double comm_ms, comm_exposed_ms;
    /* On a GPU whose dense peak is known (runtime/gpu_peak.h): its name, the plan's FLOPs a
     * step over the median step in TFLOP/s, and that over the peak; mfu <= 0: unknown. */
    const char *gpu;
    double model_tflops, mfu;
    /* The GPUs' energy over the training steps (runtime/nvml_energy.h); energy_measured 0:
     * not measured, the energy keys left out. */
    int energy_measured;
    tg_energy_use energy;
    /* cost_per_1m_tokens from the job's gpu_hour_price; NaN (or 0) when unset. */
    double cost_per_1m_tokens;
    const tg_memory_use *mem;
    const tg_eval_stats *eval;   /* NULL when the run did not evaluate */
} metrics_summary;

/* The step line, kept from step to step (metrics_write_step updates it in place). */
typedef struct metrics_step_line metrics_step_line;
metrics_step_line *metrics_step_line_new(void); /* NULL when out of memory */
void metrics_step_line_free(metrics_step_line *w);

/* The file itself: written under a temporary name beside its own (base/atomic_file.h) and
 * renamed into place when the run ends, well or not. Any thread may end it (a failing
 * data-parallel replica), so lines are written with its lock held. */
typedef struct metrics_file metrics_file;
/* Creates the temporary file; err reads "PATH: cannot create the metrics file: reason". */
int metrics_file_open(metrics_file **m, const char *path, tg_err *err);
/* Takes the lock and gives the stream to write lines to; NULL (the lock taken all the
 * same) once the file has ended. */
FILE *metrics_file_lock(metrics_file *m);
void metrics_file_unlock(metrics_file *m);
/* Ends the file: with `error`, first an error line (metrics_write_error); then renames it
 * into place. Once ended, later calls do nothing and return 0. 0, or -1 with err set (the
 * error line or the rename failed). */
int metrics_file_end(metrics_file *m, const char *error, int replica, tg_err *err);
/* Frees the file; one that has not ended is dropped (its temporary file removed). */
void metrics_file_free(metrics_file *m);

/* Each writes one line to `f`: 0, or -1 when it could not be built or written. */
int metrics_write_step(metrics_step_line *w, FILE *f, const tg_step_stats *s, double tokens_per_s);
/* The eval fields are null with "<key>_error" beside them when the eval counted nothing
 * (metrics_eval_nothing_counted) or a value is not finite. */
int metrics_write_summary(FILE *f, const metrics_summary *s);
/* Why an eval measured nothing ("no tokens to count in eval_data"), or NULL when it counted
 * rows or tokens. */
const char *metrics_eval_nothing_counted(const tg_eval_stats *ev);
/* The last line of a run that failed: {"event": "error", "message": ...}, with "replica":
 * the failing replica's index when `replica` >= 0 (data-parallel runs). */
int metrics_write_error(FILE *f, const char *message, int replica);
/* One op kind's profiled time: its name, how many ops of it the plan runs, their sum. */
int metrics_write_profile_kind(FILE *f, const char *op_name, int count, double ms);
/* A kernel group's profiled time (tg_op_group_name). */
int metrics_write_profile_group(FILE *f, const char *group, double ms);
/* A phase's profiled time: "forward", "backward", "optimizer", or "communication exposed"
 * (the gradient sums past the backward's end, data parallelism on CUDA). */
int metrics_write_profile_phase(FILE *f, const char *phase, double ms);
/* {"profile_graph": WHAT, "ms": ...}: the traced captured steps' ms a step of WHAT (a kernel
 * group's name, "other", "busy", "device step", "communication hidden", "communication
 * exposed"). */
int metrics_write_profile_graph(FILE *f, const char *what, double ms);
/* Op `o` of the plan's profiled time, with its output tensor and, for a matmul, its shape. */
int metrics_write_profile_op(FILE *f, const tg_plan *plan, int o, double ms);
/* Gradient bucket j's sum in the captured steps (data parallelism on CUDA): its bytes, its
 * mean begin and end in ms from the backward's end, and the ms of it after that end. */
int metrics_write_profile_comm(FILE *f, int j, int64_t bytes, double begin_ms, double end_ms);
/* The cost model beside the profile (cli/cost.h): {"cost_model": kind ("group", "phase" or
 * "step"), "name", "device", "calibrated", "predicted_ms", "measured_ms", "error_pct"}. */
int metrics_write_cost_model(FILE *f, const char *kind, const char *name, const char *device, int calibrated,
                             double predicted_ms, double measured_ms);

#endif
