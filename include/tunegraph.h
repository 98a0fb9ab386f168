/* tunegraph: compile a fine-tuning job ahead of time into a static plan, then train it.
 *
 * The whole public API of libtunegraph. A job is `key = value` text naming a model (a
 * Hugging Face config folder or a built-in preset), the task, the training data and the
 * optimizer (README.md lists the keys). Compiling it yields a plan: the schedule of ops,
 * the tensor table and memory pools at fixed offsets. A trainer runs a plan on the CPU
 * reference executor or, in a GPU build, on CUDA.
 *
 *     tunegraph_plan *plan;
 *     tunegraph_trainer *tr;
 *     if (tunegraph_compile_file("job.txt", NULL, 0, &plan) ||
 *         tunegraph_trainer_open(plan, NULL, &tr))
 *         fprintf(stderr, "%s\n", tunegraph_last_error());
 *
 * Conventions:
 * - Every call that can fail returns 0 on success and -1 on failure; then
 *   tunegraph_last_error() says why, naming the file, line and key or field at fault.
 * - Handles are opaque; each has one function that frees it (NULL is accepted there).
 * - Structs the caller allocates start with `size_t struct_size`, which the caller sets
 *   to sizeof the struct as its header declares it. Later versions only append fields:
 *   the library reads or fills just the bytes struct_size covers, so a program built
 *   against an older header keeps working with a newer library.
 * - A handle may be used from one thread at a time; different handles are independent.
 * - TUNEGRAPH_API_VERSION changes when a release breaks source or binary compatibility
 *   (it is also the shared library's soname number).
 */
#ifndef TUNEGRAPH_H
#define TUNEGRAPH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TUNEGRAPH_VERSION_MAJOR 0
#define TUNEGRAPH_VERSION_MINOR 2
#define TUNEGRAPH_VERSION_PATCH 0
#define TUNEGRAPH_API_VERSION 1

#if defined(__GNUC__) || defined(__clang__)
#define TUNEGRAPH_API __attribute__((visibility("default")))
#else
#define TUNEGRAPH_API
#endif

/* "0.2.0": the version of the library the program runs against (the macros above give
 * the one it was compiled against). */
TUNEGRAPH_API const char *tunegraph_version(void);

/* The message of the calling thread's last failed call ("" before any failure). It
 * stays valid until the thread's next failing call. */
TUNEGRAPH_API const char *tunegraph_last_error(void);

/* ---- plans ------------------------------------------------------------------------ */

typedef struct tunegraph_plan tunegraph_plan;

/* Compiles the job file at job_path. overrides are `key=value` strings applied after the
 * file (like the CLI's --set); relative paths in the file resolve against the file's
 * folder, those in overrides against the current directory. n_overrides may be 0 with
 * overrides NULL. On success *plan is a new plan for tunegraph_plan_free. */
TUNEGRAPH_API int tunegraph_compile_file(const char *job_path, const char *const *overrides, int n_overrides,
                                         tunegraph_plan **plan);

/* Same, from job text in memory; relative paths in it resolve against base_dir (NULL or
 * "": the current directory). Messages call the text "<job text>". */
TUNEGRAPH_API int tunegraph_compile_text(const char *job_text, const char *base_dir, const char *const *overrides,
                                         int n_overrides, tunegraph_plan **plan);

/* Reads a plan file written by tunegraph_plan_save or `tunegraph compile`. */
TUNEGRAPH_API int tunegraph_plan_load(const char *path, tunegraph_plan **plan);

/* Writes the plan file atomically: a reader sees the old file or the whole new one. A
 * symlink at path is followed and its target replaced; a FIFO or device is written
 * directly. Refused, naming both files, when path is a file the plan reads (its model's
 * config.json or weights, its training or eval data), and when its folder is missing or
 * not writable or path is a folder. */
TUNEGRAPH_API int tunegraph_plan_save(const tunegraph_plan *plan, const char *path);

typedef enum tunegraph_format { TUNEGRAPH_FORMAT_TEXT = 0, TUNEGRAPH_FORMAT_JSON = 1 } tunegraph_format;

/* Writes the plan to out as readable text or as one JSON object (`tunegraph inspect`). */
TUNEGRAPH_API int tunegraph_plan_inspect(const tunegraph_plan *plan, FILE *out, tunegraph_format format);

typedef struct tunegraph_plan_summary {
    size_t struct_size;           /* set by the caller: sizeof(tunegraph_plan_summary) */
    int64_t ops;                  /* ops in the schedule (forward, backward, optimizer) */
    int64_t tensors;
    uint64_t planned_peak_bytes;  /* every memory pool together: the planned footprint */
    double flops_per_step;
    int64_t batch;                /* examples per step, per replica */
    int64_t seq;                  /* tokens per example */
    int64_t replicas;             /* data-parallel replicas (1: none) */
    int64_t total_steps;          /* from `steps`; -1 when the job gives `epochs`, whose
                                     step count depends on the training data */
} tunegraph_plan_summary;

TUNEGRAPH_API int tunegraph_plan_summarize(const tunegraph_plan *plan, tunegraph_plan_summary *summary);

/* Changes one of the keys a compiled plan leaves to the run, as "key=value": train_data,
 * eval_data, steps, epochs, seed, log_every, checkpoint_every, keep_checkpoints,
 * checkpoint_dir (relative paths resolve against the current directory). Any other key is compiled into the plan and refused: recompile the job
 * with an override instead. Trainers already open keep what they started with. */
TUNEGRAPH_API int tunegraph_plan_set(tunegraph_plan *plan, const char *setting);

TUNEGRAPH_API void tunegraph_plan_free(tunegraph_plan *plan);

/* ---- trainers --------------------------------------------------------------------- */

typedef struct tunegraph_trainer tunegraph_trainer;

typedef enum tunegraph_device {
    TUNEGRAPH_DEVICE_AUTO = 0,  /* CUDA when the build has it and a GPU is present, else the CPU */
    TUNEGRAPH_DEVICE_CPU = 1,   /* the fp32 reference executor */
    TUNEGRAPH_DEVICE_CUDA = 2   /* fails in a build without the CUDA executor */
} tunegraph_device;

typedef struct tunegraph_trainer_options {
    size_t struct_size;         /* set by the caller: sizeof(tunegraph_trainer_options) */
    tunegraph_device device;
    int threads;                /* CPU worker threads; 0: one per core */
    /* Training steps queued ahead of the one whose metrics come back (1: one at a time;
     * 0: the default, 14), so a GPU never waits for the host. */
    int max_in_flight;
    /* On 64-bit targets 4 bytes of tail padding follow. A field appended later must not
     * fit in them: sizeof would not change, and the library could not tell an older
     * caller (whose padding may hold anything) from a newer one. Append 8-byte fields. */
} tunegraph_trainer_options;

typedef struct tunegraph_step_metrics {
    size_t struct_size;         /* set by the caller: sizeof(tunegraph_step_metrics) */
    int64_t step;               /* 1-based index of the step */
    double loss;
    double lr;                  /* the learning rate the step used */
    double grad_norm;           /* the global gradient norm, before clipping */
    double step_ms;
    int64_t tokens;             /* real (unpadded) tokens in the step's batch */
    int64_t skipped;            /* 1: the gradient norm was not finite and nothing was updated (job key
                                   skip_nonfinite) */
    double loss_scale;          /* precision fp16: the dynamic loss scale after the step; 0 otherwise */
} tunegraph_step_metrics;

typedef struct tunegraph_eval_metrics {
    size_t struct_size;         /* set by the caller: sizeof(tunegraph_eval_metrics) */
    int64_t examples;
    int64_t counted;            /* rows (classify), tokens (lm) or masked tokens (mlm) the loss
                                   averages over; 0: nothing to count (loss NaN, has_accuracy
                                   and has_perplexity 0) */
    double loss;
    int has_accuracy;           /* classify */
    double accuracy;
    int has_perplexity;         /* lm, mlm */
    double perplexity;
    double macro_f1;            /* classify (has_accuracy): F1 averaged over the classes among the
                                   labels or predictions, as scikit-learn's f1_score(average="macro") */
    /* qa (has_squad): the official SQuAD v2 scores in percent over the eval set's questions,
     * each question's answer picked from its windows' start and end logits as Hugging Face's
     * run_qa post-processing does (n_best 20, max_answer_len 30, null threshold 0). */
    int has_squad;
    int64_t questions;
    double exact, f1;
    int64_t has_ans_total;      /* questions with an answer */
    double has_ans_exact, has_ans_f1;
    int64_t no_ans_total;       /* unanswerable questions */
    double no_ans_exact, no_ans_f1;
} tunegraph_eval_metrics;

/* Opens a trainer for the plan (options NULL: the defaults): allocates the memory pools
 * on the device, initialises the parameters (the job's seed, then the model folder's
 * model.safetensors where there is one) and loads the datasets. The trainer keeps its own
 * copy of the plan, which may be freed or changed afterwards. Plans with
 * data_parallel > 1 run with the `tunegraph` command line, not through this call. */
TUNEGRAPH_API int tunegraph_trainer_open(const tunegraph_plan *plan, const tunegraph_trainer_options *options,
                                         tunegraph_trainer **trainer);

/* The schedule's length: `steps`, or epochs x batches per epoch. */
TUNEGRAPH_API int tunegraph_trainer_total_steps(const tunegraph_trainer *trainer, int64_t *total_steps);

/* Takes the next training step and fills metrics (NULL: not wanted). Fails once every
 * step of the schedule has been taken. When the job sets checkpoint_every (and
 * checkpoint_dir), a step whose number is a multiple of it also writes a checkpoint there
 * (tunegraph_trainer_save_checkpoint), and so does tunegraph_trainer_train. */
TUNEGRAPH_API int tunegraph_trainer_step(tunegraph_trainer *trainer, tunegraph_step_metrics *metrics);

typedef void (*tunegraph_step_callback)(void *ctx, const tunegraph_step_metrics *metrics);

/* Takes every remaining step of the schedule, calling on_step (if not NULL) after each
 * with ctx and that step's metrics (valid during the call). The library fills that struct,
 * so its struct_size is the library's: fields past it (a newer header's) are not there. */
TUNEGRAPH_API int tunegraph_trainer_train(tunegraph_trainer *trainer, tunegraph_step_callback on_step, void *ctx);

/* Forward passes (dropout off) over the job's eval_data; fails when the job has none. */
TUNEGRAPH_API int tunegraph_trainer_evaluate(tunegraph_trainer *trainer, tunegraph_eval_metrics *metrics);

/* Writes the current parameters as safetensors under their Hugging Face names, atomically
 * and with the refusals of tunegraph_plan_save (never over a file the run reads). */
TUNEGRAPH_API int tunegraph_trainer_save_weights(tunegraph_trainer *trainer, const char *path);

typedef struct tunegraph_export_options {
    size_t struct_size;         /* set by the caller: sizeof(tunegraph_export_options) */
    /* A tokenizer file Hugging Face loads by name (tokenizer.json, tokenizer_config.json,
     * special_tokens_map.json, added_tokens.json, vocab.txt, vocab.json, merges.txt) or a
     * folder holding some of them; NULL: those in the model's folder, if any. */
    const char *tokenizer;
    const char *const *labels;  /* classification: num_labels class names; NULL: LABEL_0, LABEL_1, ... */
    int64_t n_labels;
    int64_t force;              /* nonzero: replace an out_dir that is not empty */
    int64_t bf16;               /* nonzero: store the weights in bf16 (rounded to nearest even), not fp32 */
} tunegraph_export_options;

/* Writes the current parameters as a Hugging Face model folder that transformers'
 * from_pretrained loads (AutoModelForSequenceClassification, AutoModelForCausalLM for
 * an LM, AutoModelForMaskedLM for a masked LM): config.json with the model, its task head (architectures, num_labels, id2label,
 * label2id, pad_token_id), model.safetensors under Hugging Face's names, and the tokenizer
 * files. The folder is written under a temporary name beside out_dir and renamed into
 * place whole; an out_dir that exists must be an empty folder unless options->force, and
 * may not hold a file the plan reads. options NULL: the defaults. */
TUNEGRAPH_API int tunegraph_trainer_export_hf(tunegraph_trainer *trainer, const char *out_dir,
                                              const tunegraph_export_options *options);

/* What loading the model folder's weights found, as Hugging Face words it: a line listing
 * the checkpoint's tensors the model did not use, and one listing the parameters it lacked
 * (newly initialized, such as a new classification head), each sorted. "" when every
 * tensor matched or the model has no weights. Valid until the trainer is closed. */
TUNEGRAPH_API const char *tunegraph_trainer_weights_report(const tunegraph_trainer *trainer);

/* ---- checkpoints ------------------------------------------------------------------ */

/* A checkpoint holds the whole training state after a step: every parameter and buffer,
 * the optimizer state, the step, and where the dropout streams and the data sampler are. A
 * trainer resumed from one takes the remaining steps with the same losses and parameters,
 * bit for bit, as the run it was written by would have. */

/* Writes a checkpoint into the folder dir (NULL: the job's checkpoint_dir), created if
 * missing, as dir/step-NNNNNN.tgckpt, atomically, then dir/latest naming it; then only the
 * job's keep_checkpoints newest checkpoints stay. It holds the state after every step
 * started so far: steps queued ahead (max_in_flight) finish first, and the checkpoint is
 * of the last of them (its name says which); their metrics still come, in order, from the
 * next tunegraph_trainer_step calls. Refused when the folder holds a checkpoint of a later
 * step (another run's). */
TUNEGRAPH_API int tunegraph_trainer_save_checkpoint(tunegraph_trainer *trainer, const char *dir);

/* Continues from a checkpoint before the first step: path is a checkpoint file, or a folder
 * (the checkpoint its `latest` file names, else its highest-numbered one). Refused, naming
 * the file and what differs, for a checkpoint of another job or plan (model, task, shapes,
 * precision, optimizer and schedule settings, seed, steps, training data, the plan's
 * tensors and ops) and for a damaged file (naming the field). */
TUNEGRAPH_API int tunegraph_trainer_resume(tunegraph_trainer *trainer, const char *path);

/* The steps taken so far: a resumed trainer starts at its checkpoint's step. */
TUNEGRAPH_API int tunegraph_trainer_steps_done(const tunegraph_trainer *trainer, int64_t *steps);

TUNEGRAPH_API void tunegraph_trainer_close(tunegraph_trainer *trainer);

#ifdef __cplusplus
}
#endif
#endif
