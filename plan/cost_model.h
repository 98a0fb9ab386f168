/* The cost model: a plan's step time predicted from the plan alone, op by op.
 *
 * Each op has FLOPs (plan/op_meta.h) and bytes moved (its tensors' sizes and dtypes, as
 * tg_cost_op_bytes counts them), and a time from a roofline of the device:
 *
 *   t = max(FLOPs / (peak_flops x eff_flops[g]), bytes / (bw x eff_bw[g])) + launch
 *
 * g the op's kernel group (plan/ops.def's group column), bw the device memory bandwidth
 * (the link between replicas for communication), launch a per-op latency. The efficiency
 * factors are calibrated per device by a measured sweep (`tunegraph calibrate`,
 * plan/cost_calibration.h); without one, stated defaults stand (uncalibrated).
 *
 * Matmuls reach less of the peak when small (matmul_flops_half) and attention's efficiency
 * follows its backend and the length of its rows (tg_cost_attention).
 *
 * A step is grad_accumulation x (forward + backward) + optimizer, each op with the launch
 * term of a captured graph (graph_launch_s). Where the device runs
 * them beside the compute (the CUDA executor), the backward's gradient sums run on their
 * own stream, each after the op it follows, and only what outlasts the backward counts
 * (exposed); and the deferred update (runtime/deferred_update.h) runs beside the next
 * forward, each forward op waiting for the parameters it reads. docs/COST_MODEL.md says
 * what the model ignores. */
#ifndef TUNEGRAPH_COST_MODEL_H
#define TUNEGRAPH_COST_MODEL_H

#include <stddef.h>
#include <stdio.h>

#include "base/error.h"
#include "plan/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TG_COST_KEY_MAX 32
#define TG_COST_NAME_MAX 128

/* The attention backends the CUDA executor chooses between (kernels/cudnn_attention.h):
 * its own fused kernels, or cuDNN's for 16-bit storage, head dim 64 or 128 and no
 * attention dropout. */
enum { TG_COST_ATTENTION_OWN = 0, TG_COST_ATTENTION_CUDNN = 1, TG_COST_ATTENTION_BACKENDS = 2 };

/* One attention backend's compute efficiency: eff_forward (eff_backward for ATTENTION_BWD)
 * x w / (w + work_half) of the peak, w = T x head_dim, the work of one query row (a fused
 * kernel's tiles fill its pipelines only on long rows), times causal_factor for a causal
 * op (whose masked tiles still cost part of a full tile). Its memory side is the
 * attention group's eff_bw. */
typedef struct tg_cost_attention {
    double eff_forward, eff_backward, work_half, causal_factor;
    int samples; /* ops calibrated with (0: the stated defaults) */
} tg_cost_attention;

/* A device the model predicts for: its peaks and its efficiency factors. */
typedef struct tg_cost_device {
    char key[TG_COST_KEY_MAX];   /* "cpu", or a GPU's key (plan/gpu_specs.h: "h100", "h200", ...) */
    char name[TG_COST_NAME_MAX]; /* the hardware the factors were measured on, or the key */
    int cpu;                     /* 1: the CPU executor (ops one after another, nothing beside) */
    double peak_flops;           /* FLOP/s of the plan's precision */
    double peak_bw;              /* device memory, B/s */
    double link_bw;              /* between replicas, B/s (the CPU: its memory) */
    double launch_s;             /* per op */
    double eff_flops[TG_GROUP_COUNT], eff_bw[TG_GROUP_COUNT];
    int calibrated;              /* 1: factors from a calibration; 0: the stated defaults */
    int threads;                 /* CPU: the executor threads calibrated with (0: unknown) */
    /* A matmul's compute efficiency is eff_flops x F / (F + matmul_flops_half), F its FLOPs:
     * a small product cannot fill the GPU's SMs with tiles (0: no shape term). */
    double matmul_flops_half;
    tg_cost_attention attention[TG_COST_ATTENTION_BACKENDS];
    int cudnn_attention; /* 1: eligible attention ops run through cuDNN (TUNEGRAPH_ATTENTION is not own) */
    /* The captured step: each op's launch term there (the launch gaps and timing events of
     * ops launched one by one are gone; the built-in descriptions: launch_s), and the share of the
     * deferred update's modelled hiding that the step sees (the update shares memory
     * bandwidth and SMs with the forward it runs beside). */
    double graph_launch_s, update_overlap;
} tg_cost_device;

/* What bounds an op's predicted time. */
enum { TG_COST_COMPUTE = 0, TG_COST_MEMORY = 1 };

/* One op's cost. */
typedef struct tg_cost_op {
    double flops;
    double bytes;
    double seconds; /* roofline + launch */
    int group;      /* tg_op_group */
    int bound;      /* TG_COST_COMPUTE or TG_COST_MEMORY */
} tg_cost_op;

typedef struct tg_cost_prediction {
    int n_ops;
    tg_cost_op *ops;                       /* per schedule op (malloc'd) */
    double group_s[TG_GROUP_COUNT];        /* ops' times per group, one execution each */
    double group_flops[TG_GROUP_COUNT], group_bytes[TG_GROUP_COUNT];
    int group_ops[TG_GROUP_COUNT];
    double phase_s[TG_PHASE_COUNT];        /* ops' times per phase, one after another */
    int micro_steps;                       /* forward and backward runs per step */
    double comm_s;                         /* the backward's gradient sums, per micro-step */
    double comm_exposed_s;                 /* of which not hidden by the backward */
    double update_s;                       /* the deferrable update op (0: none deferred) */
    double update_hidden_s;                /* of which the next forward hides */
    double serial_s;                       /* every op one after another (op-by-op profile) */
    double step_s;                         /* the predicted step */
} tg_cost_prediction;

/* Bytes op `o` of the plan reads and writes: each tensor slot's bytes once, with these
 * departures from tg_op_bytes: an embedding table (EMBEDDING's in1, EMBEDDING_BWD's out0)
 * counts the n rows touched; an output accumulated into (contract '+', MATMUL accumulate)
 * is read as well as written; an update op under ZeRO-1 touches its slice of each
 * parameter-sized tensor; a collective counts what crosses the link per replica (ring
 * all-reduce 2 (R-1)/R x the data, all-gather slices). */
double tg_cost_op_bytes(const tg_plan *plan, int o);
/* FLOPs of op `o` (tg_op_flops). */
double tg_cost_op_flops(const tg_plan *plan, int o);
/* What the op list's flops column names for `kind` ("none": the op moves data and does no
 * floating-point work; NULL outside the enum). */
const char *tg_cost_flops_formula(int kind);

/* The roofline time of one op of `flops` and `bytes` in group `group` on d. */
double tg_cost_seconds(const tg_cost_device *d, int group, double flops, double bytes, int *bound);

/* Whether the CUDA executor would run attention op `op` with storage `dtype` through cuDNN
 * on d: d->cudnn_attention and cuDNN's rule (kernels/cudnn_attention.h: 16-bit, head dim
 * 64 or 128, p == 0), restated here so that the plan library needs no kernels. */
int tg_cost_attention_backend(const tg_cost_device *d, const tg_op *op, int dtype);

/* The built-in description of device `key` ("cpu" or a key of plan/gpu_specs.h) for a plan
 * of `precision` (and allow_tf32): its datasheet peaks and the default factors
 * (uncalibrated). The CPU's peaks are stated guesses until calibrated. 0, or -1 with the
 * known keys in err. */
int tg_cost_device_builtin(const char *key, int precision, int allow_tf32, tg_cost_device *d, tg_err *err);

/* Predicts the plan's step on d into *out (free with tg_cost_prediction_free). 0, or -1
 * out of memory. */
int tg_cost_predict(const tg_plan *plan, const tg_cost_device *d, tg_cost_prediction *out, tg_err *err);
void tg_cost_prediction_free(tg_cost_prediction *p);

/* ---- calibration -------------------------------------------------------------------- */

/* What an op's time depends on beyond its group, FLOPs and bytes. */
enum { TG_COST_PLAIN = 0, TG_COST_ATTENTION_FORWARD = 1, TG_COST_ATTENTION_BACKWARD = 2 };

/* One op as the model times it (and, calibrating, its measured seconds). */
typedef struct tg_cost_sample {
    int group;
    double flops, bytes, seconds;
    int attention;     /* TG_COST_PLAIN, or which attention op */
    int backend;       /* attention: TG_COST_ATTENTION_OWN or _CUDNN */
    int causal;        /* attention: causal */
    double work;       /* attention: T x head_dim */
    int repeats;       /* calibrating: the identical ops it stands for, their mean time (0 or 1: one) */
} tg_cost_sample;

/* Op `o` of the plan as a sample on d (seconds 0). */
tg_cost_sample tg_cost_op_sample(const tg_plan *plan, int o, const tg_cost_device *d);
/* A sample's predicted time on d, launched alone (launch_s), and what bounds it. */
double tg_cost_sample_seconds(const tg_cost_device *d, const tg_cost_sample *s, int *bound);

/* Fits d's launch term and factors to the samples: launch is the 5th percentile of the
 * measured times (no op is faster than it); then, group by group, the pair (eff_flops,
 * eff_bw) minimising the sum over its ops of measured x ln(predicted / measured)^2 (a
 * log-space fit weighted by time, so the ops that make the step count most), searched on
 * a log grid from 1e-4 to 4 and refined, with a slight pull towards d's current factors
 * where the samples leave one undetermined (a group whose ops are all memory-bound says
 * nothing of its compute factor). With fit_peaks (the CPU, whose peaks are not on a
 * datasheet), d's peaks are first set to the best achieved: the largest FLOPs / time of
 * the matmul samples and bytes / time of all. samples_per_group[g] receives the group's
 * count (0: its factors left as they were). 0, or -1 when there are no samples. */
int tg_cost_fit(const tg_cost_sample *s, int n, int fit_peaks, tg_cost_device *d, int samples_per_group[TG_GROUP_COUNT],
                tg_err *err);
/* After tg_cost_fit on a GPU: graph_launch_s (0 to launch_s) and update_overlap (0 to 1)
 * minimising the sum over the plans of ln(predicted step / measured step)^2, the
 * plans' measured steps (seconds) taken from their captured graphs. 0, or -1 (err) out of
 * memory or without plans. */
int tg_cost_fit_step(const tg_plan *const *plans, const double *step_s, int n, tg_cost_device *d, tg_err *err);

/* Writes d's shape and step terms (matmul_flops_half, the attention backends, the
 * captured step's launch term and update overlap) as indented lines, where calibrated. */
void tg_cost_shape_terms_print(const tg_cost_device *d, FILE *out);

/* Writes the prediction as text (`inspect --predict`): the device and its factors, the
 * groups, the phases, the step with its overlaps, the `top` slowest ops and the predicted
 * peak memory (plan/memory_estimate.h). 0, or -1 when out cannot be written. */
int tg_cost_prediction_print(const tg_plan *plan, const tg_cost_device *d, const tg_cost_prediction *p, int top,
                             FILE *out);

#ifdef __cplusplus
}
#endif
#endif
