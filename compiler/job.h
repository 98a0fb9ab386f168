/* Job files: plain `key = value` text, `#` comments, one key per line. */
#ifndef TUNEGRAPH_JOB_H
#define TUNEGRAPH_JOB_H

#include "base/error.h"
#include "plan/plan.h"

typedef enum tg_job_key {
    TG_JOB_MODEL = 0, TG_JOB_TASK, TG_JOB_NUM_LABELS, TG_JOB_BATCH, TG_JOB_SEQ,
    TG_JOB_PRECISION, TG_JOB_ALLOW_TF32, TG_JOB_OPTIMIZER, TG_JOB_LR, TG_JOB_BETA1,
    TG_JOB_BETA2, TG_JOB_EPS, TG_JOB_WEIGHT_DECAY, TG_JOB_WARMUP_STEPS, TG_JOB_STEPS,
    TG_JOB_EPOCHS, TG_JOB_GRAD_CLIP, TG_JOB_SEED, TG_JOB_PAD_TOKEN_ID, TG_JOB_LOG_EVERY,
    TG_JOB_TRAIN_DATA, TG_JOB_EVAL_DATA, TG_JOB_ATTENTION, TG_JOB_FUSE_BIAS_GRAD, TG_JOB_FUSE_GELU,
    TG_JOB_FUSE_RESIDUAL_LAYERNORM, TG_JOB_FUSE_QKV, TG_JOB_DATA_PARALLEL, TG_JOB_ZERO_STAGE,
    TG_JOB_KEY_COUNT
} tg_job_key;

const char *tg_job_key_name(int key);

/* Fills defaults: task classify, num_labels 2, batch 8, seq 128, fp32, adamw lr 5e-5,
 * betas 0.9/0.999, eps 1e-8, weight_decay 0.01, warmup 0, grad_clip 1.0, seed 42,
 * log_every 1, attention fused, fuse_bias_grad, fuse_gelu, fuse_residual_layernorm and
 * fuse_qkv true, data_parallel 1. model, train_data and steps/epochs have no default. */
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

/* Whether a "key=value" setting names a key a compiled plan leaves to the run
 * (train_data, eval_data, steps, epochs, seed, log_every). */
int tg_job_is_run_key(const char *setting);

/* "job.txt:7" / "--set" / "job.txt (default)", for messages about a key's value. */
const char *tg_job_where(const tg_job *job, int key, char *buf, int len);

#endif
