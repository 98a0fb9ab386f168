/* Job files: plain `key = value` text, `#` comments, one key per line. */
#ifndef TUNEGRAPH_JOB_H
#define TUNEGRAPH_JOB_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* The longest `freeze` value, and the most patterns it may hold. */
#define TG_JOB_FREEZE_BYTES 2048
#define TG_JOB_FREEZE_MAX 64
/* The most ids key special_token_ids may list (MLM_MASK's special0..4). */
#define TG_JOB_SPECIAL_IDS_MAX 5

/* A training job, from a job file plus --set overrides. The compiler turns it into a
 * plan's train and run settings and the op parameters (the optimizer's live in the
 * SCHEDULE and ADAMW ops). */
typedef struct tg_job {
    char path[TG_PATH_MAX];      /* the job file, for messages */
    char model[TG_PATH_MAX];     /* model folder or preset name, as written */
    int32_t task;                /* tg_task */
    int32_t num_labels;          /* classify only */
    int32_t batch;
    int32_t seq;
    int32_t precision;           /* tg_precision */
    int32_t allow_tf32;          /* GPU fp32 only */
    int32_t attention;           /* tg_attention_mode */
    int32_t fuse_bias_grad;      /* bias gradients in the weight-gradient matmul (MATMUL bias_grad) */
    int32_t fuse_gelu;           /* tanh GELU inside the MLP's matmuls (MATMUL activation) */
    int32_t fuse_bn_relu6;       /* image models: each ReLU6 inside the batch norm before it (BATCHNORM relu6) */
    int32_t fuse_residual_layernorm; /* dropout + residual add + LayerNorm as RESIDUAL_LAYERNORM */
    int32_t fuse_qkv;            /* BERT/RoBERTa: query, key and value as one packed projection */
    int32_t data_parallel;       /* replicas training together (tg_plan_train.replicas) */
    int32_t zero_stage;          /* tg_plan_train.zero_stage */
    int32_t optimizer;           /* TG_OPTIMIZER_ADAMW or TG_OPTIMIZER_ADAN */
    float lr, beta1, beta2, eps, weight_decay;
    float beta3;                 /* Adan only */
    int32_t no_prox;             /* Adan only: weight decay before the step, not after */
    int32_t warmup_steps;
    int32_t lr_schedule;         /* TG_LR_LINEAR, TG_LR_COSINE or TG_LR_CONSTANT (plan/ops.h) */
    int32_t steps;               /* 0 when epochs is set instead */
    int32_t epochs;              /* 0 when steps is set instead */
    float grad_clip;             /* 0 disables clipping */
    uint64_t seed;
    int32_t pad_token_id;        /* -1: take the model config's */
    int32_t log_every;
    char train_data[TG_PATH_MAX];
    char eval_data[TG_PATH_MAX];  /* "" when none */
    /* Parameters to freeze: comma-separated glob patterns (fnmatch) over Hugging Face
     * parameter names, as written; "" freezes nothing (tg_job_freeze_patterns splits it). */
    char freeze[TG_JOB_FREEZE_BYTES];
    int32_t checkpoint_every;     /* steps between checkpoints; 0: none */
    int32_t keep_checkpoints;     /* the newest checkpoints kept; 0: all */
    char checkpoint_dir[TG_PATH_MAX]; /* "" when none */
    /* Sequence-length buckets (tg_plan_train.n_buckets/bucket_seq): ascending, the last
     * one seq; 1 bucket (seq) when the job names none. */
    int32_t n_buckets;
    int32_t bucket_seq[TG_MAX_BUCKETS];
    int32_t last_batch;           /* tg_last_batch */
    int32_t skip_nonfinite;       /* tg_plan_run.skip_nonfinite */
    int32_t max_skipped_steps;
    /* task = mlm: the masking probability, the [MASK] id and the special ids never masked
     * (mask_token_id -1 and n_special_ids -1: the architecture's defaults, resolved by the
     * compiler; special_ids past n_special_ids are -1). */
    float mlm_probability;
    int32_t mask_token_id;
    int32_t n_special_ids;
    int32_t special_ids[TG_JOB_SPECIAL_IDS_MAX];
    /* Micro-batches of `batch` rows per optimizer step (tg_plan_train.grad_accumulation). */
    int32_t grad_accumulation;
    /* precision = fp16: dynamic loss scaling as torch.amp.GradScaler (init_scale,
     * growth_factor, backoff_factor, growth_interval), powers of two. */
    float loss_scale_init, loss_scale_growth_factor, loss_scale_backoff;
    int32_t loss_scale_growth_interval;
    /* task = qa: the eval's post-processing (tg_plan_run.qa_n_best, qa_max_answer_length,
     * qa_null_threshold). */
    int32_t qa_n_best;
    int32_t qa_max_answer_length;
    float qa_null_threshold;
    /* 1: the gradients share the activation pool where the plan allows it
     * (tg_plan.grads_share_activations); 0: a pool of their own. */
    int32_t share_grad_memory;
    /* Forward results the backward computes again instead of keeping (TG_RECOMPUTE_*). */
    int32_t recompute;
    /* recompute = layers: how many transformer layers, from the first, the backward runs
     * again (0: every one). No job key sets it: recompute = auto chooses it for
     * memory_limit in the job copy it compiles, so it is not part of the fingerprint (which
     * is the job's as written). */
    int32_t recompute_layers;
    /* The optimizer's moment vectors' storage (TG_OPTIMIZER_STATE_*): fp32, or bf16 rounded
     * stochastically after each update (kernels/state_rounding.h). */
    int32_t optimizer_state;
    /* Data parallelism: the size of a gradient bucket summed beside the backward, in MiB
     * (PyTorch DDP's bucket_cap_mb; compiler/grad_buckets.c). */
    int32_t grad_bucket_mb;
    /* The most the plan may need on one GPU, as its memory estimate counts it (bytes; 0:
     * no limit). recompute = auto recomputes where that brings the plan under it. */
    uint64_t memory_limit;
    /* No job key: the memory the run's device has free (bytes; 0: unknown), which
     * recompute = auto plans for when the job sets no memory_limit (`run JOB` on CUDA
     * passes the GPU's free memory). Unlike memory_limit it refuses nothing (the memory
     * preflight does, with both numbers) and is not part of the fingerprint. */
    uint64_t memory_available;
    /* LoRA (PEFT's LoraConfig): lora_r > 0 freezes every base weight and adds the trainable
     * low-rank pair A [r, in], B [out, r] to each projection named in lora_targets
     * (comma-separated module names, "" for the family's default), the product scaled by
     * lora_alpha / lora_r, its input through dropout lora_dropout. */
    int32_t lora_r;
    float lora_alpha;
    float lora_dropout;
    char lora_targets[256];
    /* PEFT's modules_to_save beyond the task head: comma-separated module names, matched as
     * lora_targets are; every parameter of a matched module trains whole ("": none). */
    char lora_modules_to_save[256];
    /* The price of one GPU for an hour (currency-free; 0: unset), which the run turns into
     * its cost per 1M tokens (tg_plan_run.gpu_hour_price). */
    float gpu_hour_price;
    /* Image models (mobilenet_v2): the input's channels (1 or 3), its square size in pixels
     * and the width multiplier; 0: the model config's. Refused for the transformers. */
    int32_t image_channels;
    int32_t image_size;
    float width_mult;
    /* Image models: the normalisation per channel (image_channels values each; 0 counts:
     * 0.5 and 0.5 for every channel). */
    int32_t n_image_mean, n_image_std;
    float image_mean[3], image_std[3];
    /* Image models: augmentation of the training images on the device (IMAGE_INPUT):
     * torchvision's RandomCrop(image_size, padding) with this padding (0: none) and a
     * RandomHorizontalFlip(0.5) (1: on), seeded by the run's seed and the step. */
    int32_t random_crop_padding;
    int32_t random_horizontal_flip;
    int32_t key_line[80];         /* per tg_job_key: line that set it, 0 = default,
                                     -1 = --set override */
} tg_job;

/* tg_job.optimizer */
enum { TG_OPTIMIZER_ADAMW = 0, TG_OPTIMIZER_ADAN = 1, TG_OPTIMIZER_COUNT };

/* tg_job.lora_r: the largest rank; tg_job.lora_alpha: PEFT's default. */
#define TG_LORA_MAX_RANK 4096
#define TG_LORA_ALPHA_DEFAULT 8.0f
/* tg_job.image_size and width_mult: the largest values (image models). */
#define TG_IMAGE_MAX_SIZE 4096
#define TG_WIDTH_MULT_MAX 16.0f

/* tg_job.grad_bucket_mb: PyTorch DDP's default, and the most a bucket may be. */
#define TG_GRAD_BUCKET_MB_DEFAULT 25
#define TG_GRAD_BUCKET_MB_MAX 1024

/* tg_job.optimizer_state */
enum { TG_OPTIMIZER_STATE_FP32 = 0, TG_OPTIMIZER_STATE_BF16 = 1, TG_OPTIMIZER_STATE_COUNT };

/* tg_job.recompute: none, the MLP's GELU output (compiler/recompute.h), layers: each
 * transformer layer's forward again in the backward from the layer's input (and the GELU
 * outputs outside the layers), or auto: as little of these as memory_limit needs (none,
 * then gelu, then the fewest layers), else none. */
enum { TG_RECOMPUTE_NONE = 0, TG_RECOMPUTE_GELU = 1, TG_RECOMPUTE_AUTO = 2, TG_RECOMPUTE_LAYERS = 3, TG_RECOMPUTE_COUNT };

typedef enum tg_job_key {
    TG_JOB_MODEL = 0, TG_JOB_TASK, TG_JOB_NUM_LABELS, TG_JOB_BATCH, TG_JOB_SEQ,
    TG_JOB_PRECISION, TG_JOB_ALLOW_TF32, TG_JOB_OPTIMIZER, TG_JOB_LR, TG_JOB_BETA1,
    TG_JOB_BETA2, TG_JOB_EPS, TG_JOB_WEIGHT_DECAY, TG_JOB_WARMUP_STEPS, TG_JOB_STEPS,
    TG_JOB_EPOCHS, TG_JOB_GRAD_CLIP, TG_JOB_SEED, TG_JOB_PAD_TOKEN_ID, TG_JOB_LOG_EVERY,
    TG_JOB_TRAIN_DATA, TG_JOB_EVAL_DATA, TG_JOB_ATTENTION, TG_JOB_FUSE_BIAS_GRAD, TG_JOB_FUSE_GELU,
    TG_JOB_FUSE_RESIDUAL_LAYERNORM, TG_JOB_FUSE_QKV, TG_JOB_DATA_PARALLEL, TG_JOB_ZERO_STAGE,
    TG_JOB_FREEZE, TG_JOB_CHECKPOINT_EVERY, TG_JOB_KEEP_CHECKPOINTS, TG_JOB_CHECKPOINT_DIR, TG_JOB_SEQ_BUCKETS,
    TG_JOB_LAST_BATCH, TG_JOB_LR_SCHEDULE, TG_JOB_BETA3, TG_JOB_NO_PROX, TG_JOB_SKIP_NONFINITE,
    TG_JOB_MAX_SKIPPED_STEPS, TG_JOB_MLM_PROBABILITY, TG_JOB_MASK_TOKEN_ID, TG_JOB_SPECIAL_TOKEN_IDS,
    TG_JOB_GRAD_ACCUMULATION, TG_JOB_LOSS_SCALE_INIT, TG_JOB_LOSS_SCALE_GROWTH_FACTOR, TG_JOB_LOSS_SCALE_BACKOFF,
    TG_JOB_LOSS_SCALE_GROWTH_INTERVAL, TG_JOB_QA_N_BEST,
    TG_JOB_QA_MAX_ANSWER_LENGTH, TG_JOB_QA_NULL_THRESHOLD, TG_JOB_SHARE_GRAD_MEMORY, TG_JOB_RECOMPUTE, TG_JOB_MEMORY_LIMIT, TG_JOB_OPTIMIZER_STATE,
    TG_JOB_GRAD_BUCKET_MB, TG_JOB_LORA_R, TG_JOB_LORA_ALPHA, TG_JOB_LORA_DROPOUT, TG_JOB_LORA_TARGETS, TG_JOB_GPU_HOUR_PRICE,
    TG_JOB_IMAGE_CHANNELS, TG_JOB_IMAGE_SIZE, TG_JOB_WIDTH_MULT, TG_JOB_IMAGE_MEAN, TG_JOB_IMAGE_STD, TG_JOB_FUSE_BN_RELU6,
    TG_JOB_LORA_MODULES_TO_SAVE, TG_JOB_RANDOM_CROP_PADDING, TG_JOB_RANDOM_HORIZONTAL_FLIP,
    TG_JOB_KEY_COUNT
} tg_job_key;

const char *tg_job_key_name(int key);

/* Fills defaults: task classify, num_labels 2, batch 8, seq 128, fp32, adamw lr 5e-5,
 * betas 0.9/0.999, eps 1e-8, weight_decay 0.01, warmup 0, grad_clip 1.0, seed 42,
 * log_every 1, attention fused, fuse_bias_grad, fuse_gelu, fuse_residual_layernorm,
 * fuse_qkv and fuse_bn_relu6 true, data_parallel 1, checkpoint_every 0 (none), keep_checkpoints 3, one bucket
 * (seq), last_batch pad, grad_accumulation 1. model, train_data and steps/epochs have no default. */
void tg_job_defaults(tg_job *job);

/* Reads `path`, then applies each override ("key=value", from --set). Relative paths
 * in the file resolve against the file's folder; in overrides, against the current
 * directory. Errors name the file, line and key ("job.txt:7: key 'lr': ..."). */
int tg_job_load(const char *path, const char *const *overrides, int n_overrides,
                tg_job *job, tg_err *err);

/* Same, from job text already in memory: `name` stands for the file in messages, and
 * relative paths in the text resolve against base_dir (NULL or "": the current directory). */
int tg_job_parse_text(const char *text, const char *name, const char *base_dir,
                      const char *const *overrides, int n_overrides, tg_job *job, tg_err *err);

/* Applies overrides to an existing job (e.g. one read back from a plan). */
int tg_job_apply_overrides(tg_job *job, const char *const *overrides, int n_overrides, tg_err *err);

/* The job's freeze patterns, trimmed, in order, into patterns[0..max); returns their count
 * (the job parser has checked that they are non-empty, fit TG_NAME_MAX and number at most
 * TG_JOB_FREEZE_MAX). */
int tg_job_freeze_patterns(const tg_job *job, char patterns[][TG_NAME_MAX], int max);

/* "job.txt:7" / "--set" / "job.txt (default)", for messages about a key's value. */
const char *tg_job_where(const tg_job *job, int key, char *buf, int len);

/* The run settings of a job: what its plan leaves open. */
void tg_job_run_settings(const tg_job *job, tg_plan_run *run);

/* Applies `tunegraph run PLAN --set key=value` overrides to a plan's run settings, with
 * the job file's value parsers and rules: relative paths are taken as given (against the
 * current directory), and steps and epochs replace each other unless both are set here.
 * A key compiled into the plan is refused, naming it and `plan_name`, and so is
 * last_batch=wrap for a plan of n_buckets > 1 length buckets. */
int tg_job_apply_run_overrides(tg_plan_run *run, int n_buckets, const char *const *sets, int n,
                               const char *plan_name, tg_err *err);

#endif
