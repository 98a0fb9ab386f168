/* A training session over a plan: binds pools, weights and data once, then steps.
 * This is the library's run API; the CLI is a thin layer over it. */
#ifndef TUNEGRAPH_TRAINER_H
#define TUNEGRAPH_TRAINER_H

#include <stdint.h>

#include "datasets/batch_sampler.h"
#include "datasets/dataset.h"
#include "datasets/squad_eval.h"
#include "runtime/batch_loader.h"
#include "runtime/checkpoint.h"
#include "runtime/executor.h"
#include "runtime/hf_export.h"
#include "runtime/kernel_groups.h"
#include "runtime/preflight.h"
#include "runtime/weights.h"
#include "base/error.h"
#include "plan/plan.h"

/* Asked by tg_trainer_step before it starts `steps` more training steps, `launched` having
 * been started: how many of them may start (0..steps). Once it allows fewer, the trainer
 * starts no step past launched + that many. Data-parallel replicas use it to agree on a
 * step to stop at (each reserves the steps it starts, so the one asked first after a stop
 * request can pick a step none has passed). */
typedef int64_t (*tg_launch_gate)(void *ctx, int64_t launched, int64_t steps);

typedef struct tg_trainer_options {
    tg_device device;       /* TG_DEVICE_CPU (the reference) or TG_DEVICE_CUDA */
    int threads;            /* CPU threads; <= 0: one per core */
    int load_data;          /* 0: no datasets (the caller fills the input tensors itself) */
    int no_graphs;          /* CUDA: launch op by op instead of replaying captured graphs */
    /* tg_trainer_step keeps up to this many steps in flight (<= 1: one at a time; capped
     * by the executor, and never past total_steps), so the GPU never waits for the host
     * and the host wakes once for several steps. Each call still hands out one step's
     * statistics, in order; anything else (eval, reads, save) first waits for the steps in
     * flight, whose statistics are then dropped. */
    int max_in_flight;
    int host_trace;         /* add up the thread CPU time spent filling batches (fill_cpu_s) */
    /* Fill training batches on the calling thread between steps instead of on the
     * background loader thread (runtime/batch_loader.h) that fills them ahead. */
    int no_loader_thread;
    /* tg_trainer_step starts this many steps at once where it can (0: what the executor
     * does best, 1 with length buckets; 1: one per start); at most half of max_in_flight. */
    int step_group;
    /* Plans with data_parallel = N > 1: this replica's rank and the communicator joining
     * the N replicas (tg_executor_options). Replica r trains on rows [r*batch, (r+1)*batch)
     * of each global batch of N*batch examples, so the N replicas together see what one
     * trainer with batch N*batch would, in the same order; the update is the mean of the
     * replicas' gradients, each of its own batch's mean loss (the whole batch's mean when
     * the replicas count as many loss terms, as in classification). */
    int rank;
    void *comm;
    /* A checkpoint (safetensors file or sharded index) to load in place of the model
     * folder's weights; NULL: the model folder's. */
    const char *weights;
    int eval_only;          /* with load_data: the eval set alone (no training data, no steps) */
    tg_launch_gate launch_gate; /* NULL: none */
    void *gate_ctx;
    /* > 0: tg_trainer_step also starts no step past the next multiple of it, so that no
     * step is in flight there (rank processes agree there on whether to stop: cli/main.c). */
    int32_t drain_every;
} tg_trainer_options;

typedef struct tg_step_stats {
    int32_t step;           /* 1-based index of the step just taken */
    float loss;
    float lr;               /* learning rate this step used */
    float grad_norm;        /* before clipping */
    double step_ms;
    float phase_ms[4];      /* batch in place, forward, backward, optimizer (GPU time on CUDA) */
    int64_t tokens;         /* real tokens in the batch */
    int32_t seq;            /* the step's sequence length: its bucket's (train.seq without buckets) */
    int64_t slots;          /* token slots the step computed: batch x seq (tokens + padding) */
    int32_t skipped;        /* 1: the gradient norm was not finite and nothing was updated */
    float loss_scale;       /* fp16 plans: the dynamic loss scale after the step; 0 in others */
    /* Data parallelism on CUDA: ms the gradient sums ran (each bucket's begin to end,
     * added up) and ms of them after the backward's end, which the step waited for; -1
     * where not measured. */
    float comm_ms, comm_exposed_ms;
} tg_step_stats;

/* Data parallelism on CUDA: each gradient bucket's sum, its begin and end in ms from the
 * backward's end, added up over the steps after the first (means: divide by steps). */
typedef struct tg_comm_timeline {
    int buckets; /* entries (tg_step_result's comm_buckets); 0: none measured */
    int64_t steps;
    double begin_ms[TG_COMM_TIMELINE_MAX], end_ms[TG_COMM_TIMELINE_MAX];
} tg_comm_timeline;

/* A step's gradient sums (r's comm_buckets entries): *busy_ms their ms added up and
 * *exposed_ms the ms of the last after the backward's end (-1 each where r has none); from
 * step 2 on, also added into c. */
void tg_comm_timeline_add(tg_comm_timeline *c, const tg_step_result *r, int32_t step, float *busy_ms,
                          float *exposed_ms);

/* counted 0 (an LM eval set whose examples are all one token long, so no token has a
 * next one to predict; a classification eval with no rows): nothing was measured, and
 * loss, accuracy (classify) and perplexity (lm) are NaN rather than 0, 0 and 1. */
typedef struct tg_eval_stats {
    int32_t examples;
    int64_t counted;        /* rows (classify) or tokens (lm) the loss averages over */
    double loss;
    double accuracy;        /* classify; -1 for lm */
    double macro_f1;        /* classify: F1 averaged over the classes that occur among the labels or
                               the predictions (scikit-learn's f1_score, average="macro"); -1 for lm */
    double perplexity;      /* lm; -1 for classify */
    /* qa (questions > 0): the official SQuAD v2 scores in percent, over the questions of the
     * eval windows (datasets/squad_eval.h), from each question's answer as Hugging Face's
     * run_qa post-processing picks it (n_best 20, max_answer_len 30, null threshold 0; the
     * null answer competes when the set has an unanswerable question). */
    int64_t questions;
    double exact, f1;
    int64_t has_ans_total, no_ans_total;
    double has_ans_exact, has_ans_f1, no_ans_exact, no_ans_f1;
} tg_eval_stats;

#define TG_TRAINER_STAGING_MAX 16

typedef struct tg_trainer {
    const tg_plan *plan;
    tg_executor ex;
    /* Host images of the inputs pool (pinned on CUDA), a ring of max_in_flight + 2: batch
     * j of the run (from 0) sits in staging[j % n_staging]. A step is handed its own batch
     * and the one after (which the CUDA step fetches while it runs); the host fills the
     * one after that meanwhile. staging[cur] is the batch of the next step to start. */
    uint8_t *staging[TG_TRAINER_STAGING_MAX];
    int64_t staging_tokens[TG_TRAINER_STAGING_MAX]; /* real tokens of each buffer's batch */
    int32_t staging_fixed[TG_TRAINER_STAGING_MAX];  /* tg_batch.fixed_parts_written of each */
    /* Each buffer's LM label rows are marked for the step to derive (tg_batch.mark_label_rows). */
    int32_t staging_marked[TG_TRAINER_STAGING_MAX];
    int32_t *staging_rows;  /* tg_batch.row_len of each buffer: n_staging x batch */
    /* The sampler's epoch and position before each buffer's batch was drawn: the data
     * position a checkpoint records for the step that takes it. */
    int32_t staging_epoch[TG_TRAINER_STAGING_MAX];
    int32_t staging_pos[TG_TRAINER_STAGING_MAX];
    /* The length bucket each buffer's batch is laid out for (tg_plan_bucket): its input
     * tensors sit where that bucket's plan places them. */
    int32_t staging_bucket[TG_TRAINER_STAGING_MAX];
    int n_staging;
    int cur;
    /* The buffer the last start handed the executor as the batch after its last step (the
     * executor fetched it and will not upload it again), or -1. */
    int handed;
    int max_in_flight;      /* steps started before the oldest is waited for */
    int step_group;         /* steps started together where max_in_flight and total_steps allow */
    int64_t launched;       /* steps started */
    int64_t returned;       /* steps whose statistics were handed out */
    int64_t filled;         /* training batches filled (while the loader runs: its count) */
    /* The background filler of training batches (NULL: the stepping thread fills them).
     * Batch j may be filled once batch j - n_staging + 1 is no step's: below returned +
     * n_staging - 1, which keeps one buffer free for eval and the caller's own batches. */
    tg_batch_loader *loader;
    int loader_running;     /* resumed by a step call, not parked since */
    double batch_wait_s;    /* time tg_trainer_step waited for batches not yet filled */
    int bucket;             /* the bucket the executor has selected */
    /* tg_trainer_step starts no step past this count (-1: no such limit; see
     * tg_trainer_hold and tg_launch_gate), nor past the next multiple of checkpoint_every
     * (the plan's) above `returned`, so that a checkpoint is taken with no step in flight. */
    int64_t stop_at;
    int32_t checkpoint_every;
    int32_t drain_every;    /* tg_trainer_options' */
    tg_launch_gate gate;
    void *gate_ctx;
    uint64_t train_hash;        /* of the training examples, once computed (train_hashed) */
    int train_hashed;
    int host_trace;
    double fill_cpu_s;      /* with host_trace: thread CPU seconds spent filling batches */
    tg_dataset train, eval;
    int has_train, has_eval;
    tg_squad_eval squad;        /* qa: the eval set's questions and offsets */
    int has_squad;
    tg_batch_sampler sampler;
    tg_batch_shape shape;
    int32_t total_steps;
    int32_t steps_done;
    int32_t skipped_in_row;  /* the latest steps skipped one after another (run skip_nonfinite) */
    tg_comm_timeline comm;  /* the gradient sums' timeline (data parallelism on CUDA) */
    int32_t skipped_steps;   /* steps skipped in this trainer's life */
    int32_t *batch_idx;         /* this replica's examples of the step */
    int32_t *global_idx;        /* the whole global batch's (every replica's rows) */
    int rank, replicas;
    int32_t *type_scratch;      /* where batches put token types a plan has no input for */
    tg_weights_report weights;  /* what was loaded from the model folder (or options.weights) */
    char weights_path[TG_PATH_MAX]; /* the checkpoint it came from, "" when none */
    /* Host values of the frozen parameters and buffers (kept for saving: a bf16 frozen
     * tensor's fp32 values are nowhere else); its params image only while opening and saving. */
    tg_weights_image values;
    int weights_loaded;
    double open_ms[3];          /* time to open: executor and pools, weights, datasets */
    tg_memory_probe memory;     /* the measured peak, from the preflight's reading on */
    /* mlm plans, while tg_trainer_eval_logits calls on_batch: the batch's ids as the eval
     * masked them and its labels (-100 off the masked positions), [batch, seq]; else NULL. */
    const int32_t *eval_masked_ids, *eval_masked_labels;
} tg_trainer;

/* The run's memory on its device, planned and measured. */
typedef struct tg_memory_use {
    uint64_t planned;   /* the plan's pools (plan->peak_bytes) */
    uint64_t estimated; /* what the preflight expects the run to need (plan/memory_estimate.h) */
    /* The peak measured so far (runtime/preflight.h): on CUDA, device memory taken beyond
     * what was in use once the context existed (pools, workspace, scratch, staging,
     * kernels), from free memory read after the first step and now; on the CPU, the
     * growth of the process's resident set since the trainer began opening. -1 where it
     * cannot be measured. */
    int64_t measured;
} tg_memory_use;

/* Checks first that the plan fits the device's free memory (runtime/preflight.h; skipped
 * with TUNEGRAPH_PREFLIGHT=0), then allocates the pools, initialises parameters (random with the run's seed, then the
 * model folder's model.safetensors where there is one), loads the datasets, and sets the
 * schedule's total steps (steps, or epochs x global batches per epoch). */
int tg_trainer_open(tg_trainer *t, const tg_plan *plan, const tg_trainer_options *opts, tg_err *err);
void tg_trainer_close(tg_trainer *t);

/* With grad_accumulation = N (plan train), a step is a window of N micro-batches: each
 * staging buffer holds N images of the inputs pool, the next training batch below is the
 * whole window, a step's statistics (loss, tokens, slots) are the window's, and steps,
 * epochs and checkpoints count windows (an epoch's last one takes the batches left).
 * tg_trainer_input and tg_trainer_run reach the window's first micro-batch. */

/* A step's own time on the device: its phases, from its first stamp to its last (on the
 * CPU, the time its ops took); step_ms is instead the time since the step before it ended,
 * which for a step taken alone also holds the host's turn between the two. */
double tg_step_device_ms(const tg_step_stats *s);

/* Runs `steps` training steps one at a time on the staged batch (tg_trainer_run_step) with
 * the GPU's kernels traced (runtime/kernel_trace.h), and sums the trace into *out; *step_ms
 * is the steps' mean device time. These steps move the weights. CUDA, one replica only
 * (replicas' steps run together); 0, or -1 with err saying why not. */
int tg_trainer_trace_kernels(tg_trainer *t, int steps, tg_kernel_trace_summary *out, double *step_ms, tg_err *err);

/* Fills the input staging from the next training batch (dropping any filled ahead). */
void tg_trainer_next_batch(tg_trainer *t);
/* Uploads the input staging, runs forward, backward and optimizer, reads the stats. */
int tg_trainer_run_step(tg_trainer *t, tg_step_stats *stats, tg_err *err);
/* Uploads the input staging and runs phases [first, last] (tests, eval). */
int tg_trainer_run(tg_trainer *t, int first_phase, int last_phase, int training, tg_err *err);
/* next_batch + run_step. */
int tg_trainer_step(tg_trainer *t, tg_step_stats *stats, tg_err *err);

/* Forward passes (dropout off) over the whole eval set. */
int tg_trainer_eval(tg_trainer *t, tg_eval_stats *stats, tg_err *err);

/* Called by tg_trainer_eval_logits after each eval batch with the logits of its `rows` real
 * examples (eval examples first .. first + rows - 1), as the plan's logits tensor holds
 * them widened to fp32: classify [batch, num_labels]; lm [batch * seq, columns], columns
 * being the vocabulary padded as the plan pads it (the first vocab_size count). */
typedef int (*tg_eval_logits_fn)(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err);
/* tg_trainer_eval that also hands each batch's logits to on_batch. */
int tg_trainer_eval_logits(tg_trainer *t, tg_eval_stats *stats, tg_eval_logits_fn on_batch, void *ctx, tg_err *err);

/* Times each op of one training step on the current batch (op_ms[op index], mean of
 * `repeats` runs launched op by op). It trains as it measures: the weights move. */
int tg_trainer_profile(tg_trainer *t, int repeats, double *op_ms, tg_err *err);

/* xxh64 of the training examples as the batches read them (each one's ids, token types,
 * label and prompt): what a checkpoint and the ranks of a launched world compare. */
uint64_t tg_trainer_data_hash(tg_trainer *t);

/* The planned and measured peak memory of the run so far (reads the device's memory now;
 * the steps in flight keep running). */
void tg_trainer_memory(tg_trainer *t, tg_memory_use *use);

/* Writes the current parameters as HF-named safetensors. */
int tg_trainer_save(tg_trainer *t, const char *path, tg_err *err);
/* Writes the current parameters as a Hugging Face model folder (runtime/hf_export.h). */
int tg_trainer_export_hf(tg_trainer *t, const tg_hf_export_options *options, tg_err *err);

/* Stops (hold 1) or allows again (hold 0) the start of new steps by tg_trainer_step: the
 * steps in flight still hand out their statistics, after which tg_trainer_step fails while
 * held. A caller about to checkpoint holds the trainer and takes the steps in flight. */
void tg_trainer_hold(tg_trainer *t, int hold);

/* The training state after the steps taken so far, into ck (initialised here; the caller
 * frees it): with `whole`, everything runtime/checkpoint.h lists (this replica's optimizer
 * slice among it); without, only this replica's own part (its ZeRO-1 slice of m and v, none
 * without ZeRO-1), for replica 0 to add to its own with tg_checkpoint_take_tensors. Refused
 * while steps are in flight (tg_trainer_hold, then take them). */
int tg_trainer_checkpoint(tg_trainer *t, tg_checkpoint *ck, int whole, tg_err *err);
/* Puts a freshly opened trainer (no step taken) in the state ck holds, as this replica:
 * refused, naming `name` and what differs, when ck is of another job or plan
 * (tg_checkpoint_check_identity), or lacks, or has a wrong shape for, anything the plan
 * needs. The next step is then ck's step + 1, on the batch and dropout masks an
 * uninterrupted run would have had. */
int tg_trainer_restore(tg_trainer *t, const tg_checkpoint *ck, const char *name, tg_err *err);

/* Host staging of an input tensor (ids, masks, positions, labels) of the batch the next
 * step takes, for the caller to read or write; waits first for the steps in flight (one
 * may be fetching it), dropping their statistics. */
void *tg_trainer_input(tg_trainer *t, int tensor);
/* Copies any tensor between the executor and host memory. */
int tg_trainer_read(tg_trainer *t, int tensor, void *host, tg_err *err);
int tg_trainer_write(tg_trainer *t, int tensor, const void *host, tg_err *err);
/* Reads a float tensor of any storage precision, widened to fp32 (numel floats). */
int tg_trainer_read_f32(tg_trainer *t, int tensor, float *host, tg_err *err);

#endif
