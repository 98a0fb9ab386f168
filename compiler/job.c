/* Job files: `key = value` lines parsed into a tg_job, then --set overrides, then the
 * cross-key checks. Every message says where the offending value came from. */
#include "compiler/job.h"
#include "base/alloc.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each key's name, and whether a compiled plan leaves it to the run (tg_plan_run): the
 * rest shape what the plan computes, so changing them means recompiling. */
static const struct job_key {
    const char *name;
    int run;
} k_keys[TG_JOB_KEY_COUNT] = {
    [TG_JOB_MODEL] = {"model", 0},
    [TG_JOB_TASK] = {"task", 0},
    [TG_JOB_NUM_LABELS] = {"num_labels", 0},
    [TG_JOB_BATCH] = {"batch", 0},
    [TG_JOB_SEQ] = {"seq", 0},
    [TG_JOB_PRECISION] = {"precision", 0},
    [TG_JOB_ALLOW_TF32] = {"allow_tf32", 0},
    [TG_JOB_OPTIMIZER] = {"optimizer", 0},
    [TG_JOB_LR] = {"lr", 0},
    [TG_JOB_BETA1] = {"beta1", 0},
    [TG_JOB_BETA2] = {"beta2", 0},
    [TG_JOB_EPS] = {"eps", 0},
    [TG_JOB_WEIGHT_DECAY] = {"weight_decay", 0},
    [TG_JOB_WARMUP_STEPS] = {"warmup_steps", 0},
    [TG_JOB_STEPS] = {"steps", 1},
    [TG_JOB_EPOCHS] = {"epochs", 1},
    [TG_JOB_GRAD_CLIP] = {"grad_clip", 0},
    [TG_JOB_SEED] = {"seed", 1},
    [TG_JOB_PAD_TOKEN_ID] = {"pad_token_id", 0},
    [TG_JOB_LOG_EVERY] = {"log_every", 1},
    [TG_JOB_TRAIN_DATA] = {"train_data", 1},
    [TG_JOB_EVAL_DATA] = {"eval_data", 1},
    [TG_JOB_ATTENTION] = {"attention", 0},
    [TG_JOB_FUSE_BIAS_GRAD] = {"fuse_bias_grad", 0},
    [TG_JOB_FUSE_GELU] = {"fuse_gelu", 0},
    [TG_JOB_FUSE_RESIDUAL_LAYERNORM] = {"fuse_residual_layernorm", 0},
    [TG_JOB_FUSE_QKV] = {"fuse_qkv", 0},
    [TG_JOB_DATA_PARALLEL] = {"data_parallel", 0},
    [TG_JOB_ZERO_STAGE] = {"zero_stage", 0},
    [TG_JOB_FREEZE] = {"freeze", 0},
    [TG_JOB_CHECKPOINT_EVERY] = {"checkpoint_every", 1},
    [TG_JOB_KEEP_CHECKPOINTS] = {"keep_checkpoints", 1},
    [TG_JOB_CHECKPOINT_DIR] = {"checkpoint_dir", 1},
    [TG_JOB_SEQ_BUCKETS] = {"seq_buckets", 0},
    [TG_JOB_LAST_BATCH] = {"last_batch", 1},
    [TG_JOB_LR_SCHEDULE] = {"lr_schedule", 0},
    [TG_JOB_BETA3] = {"beta3", 0},
    [TG_JOB_NO_PROX] = {"no_prox", 0},
    [TG_JOB_SKIP_NONFINITE] = {"skip_nonfinite", 1},
    [TG_JOB_MAX_SKIPPED_STEPS] = {"max_skipped_steps", 1},
    [TG_JOB_MLM_PROBABILITY] = {"mlm_probability", 0},
    [TG_JOB_MASK_TOKEN_ID] = {"mask_token_id", 0},
    [TG_JOB_SPECIAL_TOKEN_IDS] = {"special_token_ids", 0},
    [TG_JOB_GRAD_ACCUMULATION] = {"grad_accumulation", 0},
    [TG_JOB_LOSS_SCALE_INIT] = {"loss_scale_init", 0},
    [TG_JOB_LOSS_SCALE_GROWTH_FACTOR] = {"loss_scale_growth_factor", 0},
    [TG_JOB_LOSS_SCALE_BACKOFF] = {"loss_scale_backoff", 0},
    [TG_JOB_LOSS_SCALE_GROWTH_INTERVAL] = {"loss_scale_growth_interval", 0},
    [TG_JOB_QA_N_BEST] = {"qa_n_best", 1},
    [TG_JOB_QA_MAX_ANSWER_LENGTH] = {"qa_max_answer_length", 1},
    [TG_JOB_QA_NULL_THRESHOLD] = {"qa_null_threshold", 1},
    [TG_JOB_SHARE_GRAD_MEMORY] = {"share_grad_memory", 0},
    [TG_JOB_RECOMPUTE] = {"recompute", 0},
    [TG_JOB_MEMORY_LIMIT] = {"memory_limit", 0},
    [TG_JOB_OPTIMIZER_STATE] = {"optimizer_state", 0},
    [TG_JOB_GRAD_BUCKET_MB] = {"grad_bucket_mb", 0},
    [TG_JOB_LORA_R] = {"lora_r", 0},
    [TG_JOB_LORA_ALPHA] = {"lora_alpha", 0},
    [TG_JOB_LORA_DROPOUT] = {"lora_dropout", 0},
    [TG_JOB_LORA_TARGETS] = {"lora_targets", 0},
    [TG_JOB_GPU_HOUR_PRICE] = {"gpu_hour_price", 1},
    [TG_JOB_IMAGE_CHANNELS] = {"image_channels", 0},
    [TG_JOB_IMAGE_SIZE] = {"image_size", 0},
    [TG_JOB_WIDTH_MULT] = {"width_mult", 0},
    [TG_JOB_IMAGE_MEAN] = {"image_mean", 0},
    [TG_JOB_IMAGE_STD] = {"image_std", 0},
    [TG_JOB_FUSE_BN_RELU6] = {"fuse_bn_relu6", 0},
    [TG_JOB_LORA_MODULES_TO_SAVE] = {"lora_modules_to_save", 0},
    [TG_JOB_RANDOM_CROP_PADDING] = {"random_crop_padding", 0},
    [TG_JOB_RANDOM_HORIZONTAL_FLIP] = {"random_horizontal_flip", 0},
};

_Static_assert(TG_JOB_KEY_COUNT <= (int)(sizeof(((tg_job *)0)->key_line) / sizeof(int32_t)),
               "tg_job.key_line too small for the job keys");

const char *tg_job_key_name(int key) {
    return key >= 0 && key < TG_JOB_KEY_COUNT ? k_keys[key].name : "?";
}

void tg_job_defaults(tg_job *job) {
    memset(job, 0, sizeof *job);
    job->task = TG_TASK_CLASSIFY;
    job->num_labels = 2;
    job->batch = 8;
    job->seq = 128;
    job->precision = TG_PREC_FP32;
    job->allow_tf32 = 0;
    job->lr = 5e-5f;
    job->beta1 = 0.9f;
    job->beta2 = 0.999f;
    job->beta3 = 0.99f;
    job->eps = 1e-8f;
    job->weight_decay = 0.01f;
    job->warmup_steps = 0;
    job->grad_clip = 1.0f;
    job->seed = 42;
    job->pad_token_id = -1;
    job->log_every = 1;
    job->attention = TG_ATTENTION_FUSED;
    job->fuse_bias_grad = 1;
    job->fuse_gelu = 1;
    job->fuse_bn_relu6 = 1;
    job->fuse_residual_layernorm = 1;
    job->fuse_qkv = 1;
    job->data_parallel = 1;
    job->keep_checkpoints = 3;
    job->n_buckets = 1;
    job->bucket_seq[0] = job->seq;
    job->last_batch = TG_LAST_BATCH_PAD;
    job->skip_nonfinite = 1;
    job->max_skipped_steps = 10;
    job->mlm_probability = 0.15f;
    job->mask_token_id = -1;
    job->n_special_ids = -1;
    for (int i = 0; i < TG_JOB_SPECIAL_IDS_MAX; i++) job->special_ids[i] = -1;
    job->grad_accumulation = 1;
    job->share_grad_memory = 1;
    job->recompute = TG_RECOMPUTE_AUTO;
    job->loss_scale_init = 65536.0f;
    job->loss_scale_growth_factor = 2.0f;
    job->loss_scale_backoff = 0.5f;
    job->loss_scale_growth_interval = 2000;
    job->qa_n_best = 20; /* run_qa's n_best_size, max_answer_length, null_score_diff_threshold */
    job->qa_max_answer_length = 30;
    job->qa_null_threshold = 0.0f;
    job->grad_bucket_mb = TG_GRAD_BUCKET_MB_DEFAULT;
    job->lora_alpha = TG_LORA_ALPHA_DEFAULT;
}

const char *tg_job_where(const tg_job *job, int key, char *buf, int len) {
    int line = key >= 0 && key < TG_JOB_KEY_COUNT ? job->key_line[key] : 0;
    if (line > 0)
        snprintf(buf, (size_t)len, "%s:%d", job->path, line);
    else if (line < 0)
        snprintf(buf, (size_t)len, "--set");
    else
        snprintf(buf, (size_t)len, "%s (default)", job->path);
    return buf;
}

/* ---- helpers ---- */

static int edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 64 || nb > 64) return 99; /* GCOVR_EXCL_BR_LINE: b is a key name, all shorter */
    int prev[65], cur[65];
    for (size_t j = 0; j <= nb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (nb + 1));
    }
    return prev[nb];
}

static int find_key(const char *name) {
    for (int k = 0; k < TG_JOB_KEY_COUNT; k++)
        if (strcmp(name, k_keys[k].name) == 0) return k;
    return -1;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

/* Where a value came from, formatted once as the message prefix. */
typedef struct origin {
    char prefix[TG_PATH_MAX + 320];
    int line;        /* > 0 file line, -1 --set */
    const char *dir; /* job file's folder prefix ("a/b/") for relative paths; NULL for --set */
} origin;

/* -1: not an integer; -2: an integer outside lo..hi (also one too large for long long,
 * which strtoll reports as ERANGE: it is still a number, only out of range). */
static int parse_int(const char *v, long long lo, long long hi, long long *out) {
    if (!*v) return -1;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || isspace((unsigned char)*v)) return -1; /* v is not empty: *end == 0 means digits were read */
    if (errno == ERANGE || x < lo || x > hi) return -2;
    *out = x;
    return 0;
}

/* An integer key whose valid values are lo..hi; `note` (or NULL) says what they mean. */
static int set_int_range(int32_t *dst, const char *v, long long lo, long long hi, const char *note,
                         const origin *o, const char *key, tg_err *err) {
    long long x;
    int rc = parse_int(v, lo, hi, &x);
    if (rc == -1) return tg_fail(err, "%skey '%s': '%s' is not an integer", o->prefix, key, v);
    if (rc == -2)
        return tg_fail(err, "%skey '%s': %s is out of range (must be %lld..%lld%s%s)", o->prefix, key, v, lo,
                       hi, note ? "; " : "", note ? note : "");
    *dst = (int32_t)x;
    return 0;
}

static int set_int(int32_t *dst, const char *v, long long lo, const origin *o, const char *key,
                   tg_err *err) {
    return set_int_range(dst, v, lo, INT32_MAX, NULL, o, key, err);
}

/* lo/hi bounds; *_open says the bound itself is excluded. */
static int set_float(float *dst, const char *v, double lo, int lo_open, double hi, int hi_open,
                     const origin *o, const char *key, tg_err *err);

/* image_mean, image_std: 1 to 3 numbers split by commas, one per channel (a mean in
 * [-16, 16], a std in (0, 16]). */
static int set_channel_floats(float *dst, int32_t *n, const char *v, int std, const origin *o, const char *key,
                              tg_err *err) {
    char buf[256];
    if (snprintf(buf, sizeof buf, "%s", v) >= (int)sizeof buf)
        return tg_fail(err, "%skey '%s': too long for 1 to 3 numbers", o->prefix, key);
    int count = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ') t++;
        for (char *e = t + strlen(t); e > t && e[-1] == ' ';) *--e = 0;
        if (count == 3) return tg_fail(err, "%skey '%s': more than 3 values (one per channel)", o->prefix, key);
        if (set_float(&dst[count], t, std ? 0 : -16, std, 16, 0, o, key, err)) return -1;
        count++;
    }
    if (!count) return tg_fail(err, "%skey '%s': needs 1 to 3 numbers (one per channel)", o->prefix, key);
    *n = count;
    return 0;
}

static int set_float(float *dst, const char *v, double lo, int lo_open, double hi, int hi_open,
                     const origin *o, const char *key, tg_err *err) {
    char *end;
    errno = 0;
    double x = *v && !isspace((unsigned char)*v) ? strtod(v, &end) : NAN;
    if (isnan(x) || *end)
        return tg_fail(err, "%skey '%s': '%s' is not a number", o->prefix, key, v);
    int underflow = errno == ERANGE && fabs(x) < 1;
    if (!underflow && (!isfinite(x) || !isfinite((float)x)))
        return tg_fail(err, "%skey '%s': %s is not a finite 32-bit float (largest %g)", o->prefix, key, v,
                       (double)FLT_MAX);
    float f = (float)x;
    /* A nonzero value written as such must stay a normal float: stored as 0 or as a
     * denormal it is not the value the job asked for. */
    if (underflow || (x != 0 && fabsf(f) < FLT_MIN))
        return tg_fail(err, "%skey '%s': %s is too small for a 32-bit float (smallest nonzero %g)", o->prefix, key,
                       v, (double)FLT_MIN);
    /* The bounds hold for the value as stored: 0.999999999 is below 1 but rounds to it. */
    double fx = f;
    int x_out = (lo_open ? x <= lo : x < lo) || (hi_open ? x >= hi : x > hi);
    if (x_out || (lo_open ? fx <= lo : fx < lo) || (hi_open ? fx >= hi : fx > hi)) { /* GCOVR_EXCL_BR_LINE: each bound (0, 2^-24, 2^-16, 2, 0.5, 2^16, 2^64, 1, inf) is a float and rounding is monotone, so a value inside a closed bound stays inside it; one above 0 rounds to a positive float or was refused as too small */
        char range[96], rounded[64] = "";
        if (isinf(hi))
            snprintf(range, sizeof range, "%s %g", lo_open ? ">" : ">=", lo);
        else
            snprintf(range, sizeof range, "in %c%g, %g%c", lo_open ? '(' : '[', lo, hi,
                     hi_open ? ')' : ']');
        if (!x_out) snprintf(rounded, sizeof rounded, " as a 32-bit float (it rounds to %.9g)", fx);
        return tg_fail(err, "%skey '%s': %s is out of range%s (must be %s)", o->prefix, key, v, rounded, range);
    }
    *dst = f;
    return 0;
}

/* A float key that must be a power of two in [lo, hi] (the loss scale's: scaling by one is
 * exact). */
static int set_power_of_two(float *dst, const char *v, double lo, double hi, const origin *o, const char *key,
                            tg_err *err) {
    float f;
    if (set_float(&f, v, lo, 0, hi, 0, o, key, err)) return -1;
    int e;
    if (frexpf(f, &e) != 0.5f)
        return tg_fail(err, "%skey '%s': %s is not a power of two (such as %g or %g)", o->prefix, key, v,
                       (double)ldexpf(0.5f, e), (double)ldexpf(0.5f, e + 1));
    *dst = f;
    return 0;
}

static int set_enum(int32_t *dst, const char *v, const char *const *names, int n, const origin *o,
                    const char *key, tg_err *err) {
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) {
            *dst = i;
            return 0;
        }
    char list[128] = "";
    for (int i = 0; i < n; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, names[i], sizeof list - strlen(list) - 1);
    }
    return tg_fail(err, "%skey '%s': '%s' is not one of %s", o->prefix, key, v, list);
}

/* A size in bytes: a number >= 1 with an optional binary unit (B, KiB, MiB, GiB, TiB),
 * at most 2^50 bytes once multiplied out (whole bytes, rounded down). */
static int set_size(uint64_t *dst, const char *v, const origin *o, const char *key, tg_err *err) {
    static const struct {
        const char *name;
        double bytes;
    } units[] = {{"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
    char *end;
    errno = 0;
    const double x = *v && !isspace((unsigned char)*v) && *v != '-' && *v != '+' ? strtod(v, &end) : NAN;
    if (isnan(x) || end == v)
        return tg_fail(err, "%skey '%s': '%s' is not a size (a number with B, KiB, MiB, GiB or TiB)", o->prefix, key, v);
    const char *unit = end;
    while (*unit == ' ') unit++;
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
        if (strcmp(unit, units[k].name) || (unit != end && !*unit)) continue;
        const double bytes = x * units[k].bytes;
        if (!isfinite(bytes) || bytes < 1 || bytes > 1125899906842624.0)
            return tg_fail(err, "%skey '%s': %s is out of range (1 byte to 1024 TiB)", o->prefix, key, v);
        *dst = (uint64_t)bytes;
        return 0;
    }
    return tg_fail(err, "%skey '%s': '%s' has no unit it knows (B, KiB, MiB, GiB, TiB)", o->prefix, key, v);
}

static int set_bool(int32_t *dst, const char *v, const origin *o, const char *key, tg_err *err) {
    if (!strcasecmp(v, "true") || !strcmp(v, "1"))
        *dst = 1;
    else if (!strcasecmp(v, "false") || !strcmp(v, "0"))
        *dst = 0;
    else
        return tg_fail(err, "%skey '%s': '%s' is not a boolean (true, false, 1, 0)", o->prefix, key, v);
    return 0;
}

static int set_path(char *dst, const char *v, const origin *o, int resolve, const char *key,
                    tg_err *err) {
    if (!*v) return tg_fail(err, "%skey '%s': value is empty", o->prefix, key);
    int n;
    /* File values are relative to the job file, so a job runs the same from any cwd. */
    if (resolve && o->dir && o->dir[0] && v[0] != '/')
        n = snprintf(dst, TG_PATH_MAX, "%s%s", o->dir, v);
    else
        n = snprintf(dst, TG_PATH_MAX, "%s", v);
    if (n >= TG_PATH_MAX)
        return tg_fail(err, "%skey '%s': path is too long (limit %d bytes)", o->prefix, key,
                       TG_PATH_MAX - 1);
    return 0;
}

/* `lora_targets` and `lora_modules_to_save` (into dst, of cap bytes): comma-separated
 * module names or dotted paths' tails (parts of letters, digits and '_' joined by single
 * dots: `c_proj`, `mlp.c_proj`, `h.0.mlp.c_proj`), each non-empty after trimming, at most
 * 64; which exist is the model's to say (compiler/model_build.c). */
static int set_module_names(char *dst, size_t cap, const char *v, const origin *o, const char *key, tg_err *err) {
    if (strlen(v) >= cap)
        return tg_fail(err, "%skey '%s': value is too long (limit %zu bytes)", o->prefix, key, cap - 1);
    int names = 0;
    for (const char *p = v; *p;) {
        while (*p == ' ' || *p == '\t') p++;
        const char *start = p;
        int part = 0, ok = 1;
        while (*p && (isalnum((unsigned char)*p) || *p == '_' || *p == '.')) {
            if (*p == '.') ok &= part > 0, part = 0;
            else part++;
            p++;
        }
        const char *end = p;
        while (*p == ' ' || *p == '\t') p++;
        if (end == start || !ok || !part || (*p && *p != ','))
            return tg_fail(err,
                           "%skey '%s': '%s' is not a comma-separated list of module names or paths' tails (such as "
                           "q_proj,v_proj or mlp.c_proj)",
                           o->prefix, key, v);
        if (++names > 64) return tg_fail(err, "%skey '%s': more than 64 names", o->prefix, key);
        if (*p) p++;
    }
    snprintf(dst, cap, "%s", v);
    return 0;
}

/* `freeze`: comma-separated glob patterns, each non-empty after trimming and short enough
 * to be a parameter name; the value is kept as written. */
static int set_freeze(tg_job *job, const char *v, const origin *o, const char *key, tg_err *err) {
    if (strlen(v) >= sizeof job->freeze)
        return tg_fail(err, "%skey '%s': value is too long (limit %zu bytes)", o->prefix, key, sizeof job->freeze - 1);
    int n = 0;
    for (const char *p = v;; n++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && isspace((unsigned char)*p)) p++, len--;
        while (len && isspace((unsigned char)p[len - 1])) len--;
        if (!len && (comma || n > 0))
            return tg_fail(err, "%skey '%s': empty pattern in '%s' (patterns are separated by commas)", o->prefix,
                           key, v);
        if (len >= TG_NAME_MAX)
            return tg_fail(err, "%skey '%s': pattern '%.*s' is longer than a parameter name can be (%d bytes)",
                           o->prefix, key, (int)len, p, TG_NAME_MAX - 1);
        if (n >= TG_JOB_FREEZE_MAX)
            return tg_fail(err, "%skey '%s': more than %d patterns", o->prefix, key, TG_JOB_FREEZE_MAX);
        if (!comma) break;
        p = comma + 1;
    }
    snprintf(job->freeze, sizeof job->freeze, "%s", v);
    return 0;
}

int tg_job_freeze_patterns(const tg_job *job, char patterns[][TG_NAME_MAX], int max) {
    int n = 0;
    for (const char *p = job->freeze; *p && n < max;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && isspace((unsigned char)*p)) p++, len--;
        while (len && isspace((unsigned char)p[len - 1])) len--;
        if (len && len < TG_NAME_MAX) snprintf(patterns[n++], TG_NAME_MAX, "%.*s", (int)len, p);
        if (!comma) break;
        p = comma + 1;
    }
    return n;
}

/* `seq_buckets`: 2..TG_MAX_BUCKETS comma-separated lengths, each a positive integer, in
 * strictly ascending order (the last is the plan's seq: see resolve_buckets). */
static int set_seq_buckets(tg_job *job, const char *v, const origin *o, const char *key, tg_err *err) {
    int32_t seq[TG_MAX_BUCKETS];
    int n = 0;
    for (const char *p = v;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && isspace((unsigned char)*p)) p++, len--;
        while (len && isspace((unsigned char)p[len - 1])) len--;
        if (!len)
            return tg_fail(err, "%skey '%s': empty length in '%s' (lengths are separated by commas, as in 64,128,256)",
                           o->prefix, key, v);
        if (n == TG_MAX_BUCKETS)
            return tg_fail(err, "%skey '%s': more than %d buckets in '%s'", o->prefix, key, TG_MAX_BUCKETS, v);
        char item[32];
        long long x = 0;
        int bad = len >= sizeof item;
        if (!bad) {
            memcpy(item, p, len);
            item[len] = 0;
            bad = parse_int(item, 1, INT32_MAX, &x) != 0;
        }
        if (bad)
            return tg_fail(err, "%skey '%s': '%.*s' is not a positive integer length (must be 1..%d)", o->prefix, key,
                           (int)len, p, INT32_MAX);
        if (n > 0 && x <= seq[n - 1])
            return tg_fail(err, "%skey '%s': %lld follows %d; the lengths must be strictly ascending", o->prefix, key,
                           x, seq[n - 1]);
        seq[n++] = (int32_t)x;
        if (!comma) break;
        p = comma + 1;
    }
    if (n < 2)
        return tg_fail(err, "%skey '%s': '%s' names one length; give 2 to %d (one length is key 'seq')", o->prefix,
                       key, v, TG_MAX_BUCKETS);
    memset(job->bucket_seq, 0, sizeof job->bucket_seq);
    memcpy(job->bucket_seq, seq, sizeof seq[0] * (size_t)n);
    job->n_buckets = n;
    return 0;
}

/* `special_token_ids`: up to TG_JOB_SPECIAL_IDS_MAX comma-separated ids (>= 0), the
 * tokenizer's special tokens besides [MASK], which task = mlm never masks; "none" for
 * none. */
static int set_special_ids(tg_job *job, const char *v, const origin *o, const char *key, tg_err *err) {
    int32_t ids[TG_JOB_SPECIAL_IDS_MAX];
    int n = 0;
    for (const char *p = v; strcmp(v, "none") != 0;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && isspace((unsigned char)*p)) p++, len--;
        while (len && isspace((unsigned char)p[len - 1])) len--;
        if (n == TG_JOB_SPECIAL_IDS_MAX)
            return tg_fail(err, "%skey '%s': more than %d ids in '%s'", o->prefix, key, TG_JOB_SPECIAL_IDS_MAX, v);
        char item[32];
        long long x = 0;
        int bad = !len || len >= sizeof item;
        if (!bad) {
            memcpy(item, p, len);
            item[len] = 0;
            bad = parse_int(item, 0, INT32_MAX, &x) != 0;
        }
        if (bad)
            return tg_fail(err, "%skey '%s': '%.*s' is not a token id (ids are separated by commas, as in 0,100,101,102; "
                                "or none)",
                           o->prefix, key, (int)len, p);
        ids[n++] = (int32_t)x;
        if (!comma) break;
        p = comma + 1;
    }
    for (int i = 0; i < TG_JOB_SPECIAL_IDS_MAX; i++) job->special_ids[i] = i < n ? ids[i] : -1;
    job->n_special_ids = n;
    return 0;
}

static int set_value(tg_job *job, int key, const char *v, const origin *o, tg_err *err) {
    static const char *const tasks[TG_TASK_COUNT] = {"classify", "lm", "mlm", "qa"};
    static const char *const precisions[] = {"fp32", "bf16", "fp16"};
    static const char *const attention_modes[] = {"fused", "unfused"};
    static const char *const recompute_modes[TG_RECOMPUTE_COUNT] = {"none", "gelu", "auto", "layers"};
    static const char *const last_batches[TG_LAST_BATCH_COUNT] = {"pad", "drop", "wrap"};
    static const char *const lr_schedules[TG_LR_SCHEDULE_COUNT] = {"linear", "cosine", "constant"};
    static const char *const optimizers[TG_OPTIMIZER_COUNT] = {"adamw", "adan"};
    static const char *const state_dtypes[TG_OPTIMIZER_STATE_COUNT] = {"fp32", "bf16"};
    const char *name = k_keys[key].name;
    int rc = 0;
    switch ((tg_job_key)key) { /* GCOVR_EXCL_BR_LINE: key indexes k_keys, found by name, so TG_JOB_KEY_COUNT (a case for -Wswitch) and values past it never come */
    case TG_JOB_MODEL:
        rc = set_path(job->model, v, o, strchr(v, '/') != NULL, name, err);
        break;
    case TG_JOB_TASK: rc = set_enum(&job->task, v, tasks, TG_TASK_COUNT, o, name, err); break;
    /* Classification needs two classes at least (the compiler refuses fewer). */
    case TG_JOB_NUM_LABELS: rc = set_int(&job->num_labels, v, 2, o, name, err); break;
    case TG_JOB_BATCH: rc = set_int(&job->batch, v, 1, o, name, err); break;
    case TG_JOB_SEQ: rc = set_int(&job->seq, v, 1, o, name, err); break;
    case TG_JOB_PRECISION: rc = set_enum(&job->precision, v, precisions, 3, o, name, err); break;
    case TG_JOB_ALLOW_TF32: rc = set_bool(&job->allow_tf32, v, o, name, err); break;
    case TG_JOB_OPTIMIZER: rc = set_enum(&job->optimizer, v, optimizers, TG_OPTIMIZER_COUNT, o, name, err); break;
    case TG_JOB_LR: rc = set_float(&job->lr, v, 0, 1, INFINITY, 0, o, name, err); break;
    case TG_JOB_BETA1: rc = set_float(&job->beta1, v, 0, 0, 1, 1, o, name, err); break;
    case TG_JOB_BETA2: rc = set_float(&job->beta2, v, 0, 0, 1, 1, o, name, err); break;
    case TG_JOB_BETA3: rc = set_float(&job->beta3, v, 0, 0, 1, 1, o, name, err); break;
    case TG_JOB_NO_PROX: rc = set_bool(&job->no_prox, v, o, name, err); break;
    case TG_JOB_LOSS_SCALE_INIT: rc = set_power_of_two(&job->loss_scale_init, v, 0x1p-24, 0x1p64, o, name, err); break;
    case TG_JOB_LOSS_SCALE_GROWTH_FACTOR:
        rc = set_power_of_two(&job->loss_scale_growth_factor, v, 2.0, 0x1p16, o, name, err);
        break;
    case TG_JOB_LOSS_SCALE_BACKOFF: rc = set_power_of_two(&job->loss_scale_backoff, v, 0x1p-16, 0.5, o, name, err); break;
    case TG_JOB_LOSS_SCALE_GROWTH_INTERVAL:
        rc = set_int_range(&job->loss_scale_growth_interval, v, 1, 1 << 24, "steps", o, name, err);
        break;
    case TG_JOB_SKIP_NONFINITE: rc = set_bool(&job->skip_nonfinite, v, o, name, err); break;
    case TG_JOB_MAX_SKIPPED_STEPS:
        rc = set_int_range(&job->max_skipped_steps, v, 0, INT32_MAX, "steps in a row", o, name, err);
        break;
    case TG_JOB_GRAD_ACCUMULATION:
        rc = set_int_range(&job->grad_accumulation, v, 1, TG_MAX_GRAD_ACCUMULATION, "micro-batches per optimizer step",
                           o, name, err);
        break;
    /* Each window's n_best starts by n_best ends are candidates: bounded so that they fit. */
    case TG_JOB_QA_N_BEST:
        rc = set_int_range(&job->qa_n_best, v, 1, TG_QA_MAX_N_BEST, "answer candidates kept", o, name, err);
        break;
    case TG_JOB_QA_MAX_ANSWER_LENGTH:
        rc = set_int_range(&job->qa_max_answer_length, v, 1, INT32_MAX, "tokens", o, name, err);
        break;
    case TG_JOB_QA_NULL_THRESHOLD:
        rc = set_float(&job->qa_null_threshold, v, -INFINITY, 0, INFINITY, 0, o, name, err);
        break;
    case TG_JOB_EPS: rc = set_float(&job->eps, v, 0, 1, INFINITY, 0, o, name, err); break;
    case TG_JOB_WEIGHT_DECAY:
        rc = set_float(&job->weight_decay, v, 0, 0, INFINITY, 0, o, name, err);
        break;
    case TG_JOB_WARMUP_STEPS: rc = set_int(&job->warmup_steps, v, 0, o, name, err); break;
    case TG_JOB_STEPS: rc = set_int(&job->steps, v, 1, o, name, err); break;
    case TG_JOB_EPOCHS: rc = set_int(&job->epochs, v, 1, o, name, err); break;
    case TG_JOB_GRAD_CLIP: rc = set_float(&job->grad_clip, v, 0, 0, INFINITY, 0, o, name, err); break;
    case TG_JOB_SEED: {
        char *end;
        errno = 0;
        unsigned long long x = isdigit((unsigned char)v[0]) ? strtoull(v, &end, 10) : 0;
        if (!isdigit((unsigned char)v[0]) || *end)
            rc = tg_fail(err, "%skey '%s': '%s' is not a non-negative integer", o->prefix, name, v);
        else if (errno == ERANGE)
            rc = tg_fail(err, "%skey '%s': %s is out of range (must be 0..2^64-1)", o->prefix, name, v);
        else
            job->seed = (uint64_t)x;
        break;
    }
    case TG_JOB_PAD_TOKEN_ID: rc = set_int(&job->pad_token_id, v, 0, o, name, err); break;
    case TG_JOB_LOG_EVERY: rc = set_int(&job->log_every, v, 1, o, name, err); break;
    case TG_JOB_TRAIN_DATA: rc = set_path(job->train_data, v, o, 1, name, err); break;
    case TG_JOB_EVAL_DATA: rc = set_path(job->eval_data, v, o, 1, name, err); break;
    case TG_JOB_ATTENTION: rc = set_enum(&job->attention, v, attention_modes, 2, o, name, err); break;
    case TG_JOB_FUSE_BIAS_GRAD: rc = set_bool(&job->fuse_bias_grad, v, o, name, err); break;
    case TG_JOB_FUSE_GELU: rc = set_bool(&job->fuse_gelu, v, o, name, err); break;
    case TG_JOB_FUSE_BN_RELU6: rc = set_bool(&job->fuse_bn_relu6, v, o, name, err); break;
    case TG_JOB_FUSE_RESIDUAL_LAYERNORM: rc = set_bool(&job->fuse_residual_layernorm, v, o, name, err); break;
    case TG_JOB_FUSE_QKV: rc = set_bool(&job->fuse_qkv, v, o, name, err); break;
    case TG_JOB_SHARE_GRAD_MEMORY: rc = set_bool(&job->share_grad_memory, v, o, name, err); break;
    case TG_JOB_RECOMPUTE: rc = set_enum(&job->recompute, v, recompute_modes, TG_RECOMPUTE_COUNT, o, name, err); break;
    case TG_JOB_MEMORY_LIMIT: rc = set_size(&job->memory_limit, v, o, name, err); break;
    case TG_JOB_OPTIMIZER_STATE:
        rc = set_enum(&job->optimizer_state, v, state_dtypes, TG_OPTIMIZER_STATE_COUNT, o, name, err);
        break;
    case TG_JOB_DATA_PARALLEL:
        rc = set_int_range(&job->data_parallel, v, 1, TG_MAX_DATA_PARALLEL, "replicas", o, name, err);
        break;
    case TG_JOB_GRAD_BUCKET_MB:
        rc = set_int_range(&job->grad_bucket_mb, v, 1, TG_GRAD_BUCKET_MB_MAX, "MiB a gradient bucket", o, name, err);
        break;
    case TG_JOB_ZERO_STAGE:
        rc = set_int_range(&job->zero_stage, v, 0, 1, "0: none, 1: the optimizer state sharded", o, name, err);
        break;
    case TG_JOB_FREEZE: rc = set_freeze(job, v, o, name, err); break;
    case TG_JOB_LORA_R: rc = set_int_range(&job->lora_r, v, 0, TG_LORA_MAX_RANK, "the rank; 0: no LoRA", o, name, err); break;
    case TG_JOB_LORA_ALPHA: rc = set_float(&job->lora_alpha, v, 0, 1, INFINITY, 0, o, name, err); break;
    case TG_JOB_LORA_DROPOUT: rc = set_float(&job->lora_dropout, v, 0, 0, 1, 1, o, name, err); break;
    case TG_JOB_GPU_HOUR_PRICE:
        /* The bound catches a price written in the wrong unit (per GPU second, or cents). */
        rc = set_float(&job->gpu_hour_price, v, 0, 0, TG_GPU_HOUR_PRICE_MAX, 0, o, name, err);
        break;
    case TG_JOB_LORA_TARGETS:
        rc = set_module_names(job->lora_targets, sizeof job->lora_targets, v, o, name, err);
        break;
    case TG_JOB_LORA_MODULES_TO_SAVE:
        rc = set_module_names(job->lora_modules_to_save, sizeof job->lora_modules_to_save, v, o, name, err);
        break;
    case TG_JOB_IMAGE_CHANNELS:
        rc = set_int_range(&job->image_channels, v, 1, 3, "1: grey, 3: RGB", o, name, err);
        if (!rc && job->image_channels == 2)
            rc = tg_fail(err, "%skey '%s': 2 is not an image's channel count (1: grey, 3: RGB)", o->prefix, name);
        break;
    case TG_JOB_IMAGE_SIZE:
        rc = set_int_range(&job->image_size, v, 1, TG_IMAGE_MAX_SIZE, "pixels, square images", o, name, err);
        break;
    case TG_JOB_WIDTH_MULT: rc = set_float(&job->width_mult, v, 0, 1, TG_WIDTH_MULT_MAX, 0, o, name, err); break;
    case TG_JOB_IMAGE_MEAN: rc = set_channel_floats(job->image_mean, &job->n_image_mean, v, 0, o, name, err); break;
    case TG_JOB_IMAGE_STD: rc = set_channel_floats(job->image_std, &job->n_image_std, v, 1, o, name, err); break;
    case TG_JOB_RANDOM_CROP_PADDING:
        rc = set_int_range(&job->random_crop_padding, v, 0, TG_IMAGE_MAX_SIZE - 1, "pixels on each side; 0: no crop",
                           o, name, err);
        break;
    case TG_JOB_RANDOM_HORIZONTAL_FLIP: rc = set_bool(&job->random_horizontal_flip, v, o, name, err); break;
    case TG_JOB_CHECKPOINT_EVERY:
        rc = set_int_range(&job->checkpoint_every, v, 0, INT32_MAX, "steps; 0: none", o, name, err);
        break;
    case TG_JOB_KEEP_CHECKPOINTS:
        rc = set_int_range(&job->keep_checkpoints, v, 0, INT32_MAX, "0: every one", o, name, err);
        break;
    case TG_JOB_CHECKPOINT_DIR: rc = set_path(job->checkpoint_dir, v, o, 1, name, err); break;
    case TG_JOB_SEQ_BUCKETS: rc = set_seq_buckets(job, v, o, name, err); break;
    case TG_JOB_LAST_BATCH: rc = set_enum(&job->last_batch, v, last_batches, TG_LAST_BATCH_COUNT, o, name, err); break;
    case TG_JOB_LR_SCHEDULE:
        rc = set_enum(&job->lr_schedule, v, lr_schedules, TG_LR_SCHEDULE_COUNT, o, name, err);
        break;
    case TG_JOB_MLM_PROBABILITY: rc = set_float(&job->mlm_probability, v, 0, 1, 1, 1, o, name, err); break;
    case TG_JOB_MASK_TOKEN_ID: rc = set_int(&job->mask_token_id, v, 0, o, name, err); break;
    case TG_JOB_SPECIAL_TOKEN_IDS: rc = set_special_ids(job, v, o, name, err); break;
    case TG_JOB_KEY_COUNT: break;
    }
    if (rc == 0) job->key_line[key] = o->line;
    return rc;
}

/* Strips one pair of double quotes; outside quotes, `#` after whitespace starts a comment.
 * Returns the value in place, or NULL with a message for an unterminated quote. */
static char *unquote(char *v, const origin *o, const char *key, tg_err *err) {
    v = trim(v);
    if (v[0] == '"') {
        char *close = strchr(v + 1, '"');
        if (!close) {
            tg_fail(err, "%skey '%s': unterminated quoted value", o->prefix, key);
            return NULL;
        }
        char *rest = trim(close + 1);
        if (*rest && *rest != '#') {
            tg_fail(err, "%skey '%s': unexpected text after the quoted value: '%s'", o->prefix,
                    key, rest);
            return NULL;
        }
        *close = 0;
        return v + 1;
    }
    for (char *p = v; *p; p++)
        if (*p == '#' && (p == v || isspace((unsigned char)p[-1]))) {
            *p = 0;
            break;
        }
    return trim(v);
}

static void unknown_key(const char *key, const origin *o, tg_err *err) {
    int best = -1, best_d = 3;
    for (int k = 0; k < TG_JOB_KEY_COUNT; k++) {
        int d = edit_distance(key, k_keys[k].name);
        if (d < best_d) best_d = d, best = k;
    }
    if (best >= 0)
        tg_fail(err, "%skey '%s': unknown key (did you mean '%s'?)", o->prefix, key, k_keys[best].name);
    else
        tg_fail(err, "%skey '%s': unknown key", o->prefix, key);
}

/* ---- the file ---- */

/* A line ends at \n, \r\n or a lone \r (files from old Mac editors); returns the first
 * byte of the line end, or the terminating NUL. */
static char *line_end(char *s) { return s + strcspn(s, "\r\n"); }

/* Past the line end at `e` (which is not the terminating NUL). */
static char *next_line(char *e) { return e + (e[0] == '\r' && e[1] == '\n' ? 2 : 1); }

/* The offset of the first byte that is not part of well-formed UTF-8 (no overlong forms,
 * no surrogates, nothing past U+10FFFF), or -1 when all `n` bytes are. */
static long utf8_invalid_at(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len;
        unsigned lo = 0x80, hi = 0xBF; /* the second byte's range */
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF)
            len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else
            return (long)i;
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return (long)i;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) return (long)i;
        i += len;
    }
    return -1;
}

/* `text` as job lines; `name` prefixes messages, `dir` ("a/b/", "/" or "") is where
 * relative paths resolve. */
static int parse_text(const char *text, const char *name, const char *dir, tg_job *job, tg_err *err) {
    char *copy = tg_strdup(text);
    if (!copy) return tg_fail(err, "%s: out of memory", name);
    int lineno = 0, rc = 0;
    origin o;
    o.dir = dir;
    for (char *line = copy, *next; line; line = next) {
        char *end = line_end(line);
        next = *end ? next_line(end) : NULL;
        *end = 0;
        lineno++;
        o.line = lineno;
        snprintf(o.prefix, sizeof o.prefix, "%s:%d: ", name, lineno);
        long bad = utf8_invalid_at((const unsigned char *)line, (size_t)(end - line));
        if (bad >= 0) {
            rc = tg_fail(err, "%sinvalid UTF-8 (byte 0x%02X at column %ld)", o.prefix, (unsigned char)line[bad],
                         bad + 1);
            break;
        }
        char *s = line;
        if (lineno == 1 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB &&
            (unsigned char)s[2] == 0xBF)
            s += 3; /* UTF-8 byte-order mark from some editors */
        s = trim(s);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = tg_fail(err, "%sexpected 'key = value', got '%s' (missing '=')", o.prefix, s);
            break;
        }
        *eq = 0;
        char *key = trim(s);
        if (!*key) {
            rc = tg_fail(err, "%smissing key before '='", o.prefix);
            break;
        }
        int k = find_key(key);
        if (k < 0) {
            unknown_key(key, &o, err);
            rc = -1;
            break;
        }
        if (job->key_line[k] > 0) {
            rc = tg_fail(err, "%skey '%s': duplicate key (first set on line %d)", o.prefix, key,
                         job->key_line[k]);
            break;
        }
        char *v = unquote(eq + 1, &o, key, err);
        if (!v || set_value(job, k, v, &o, err) != 0) {
            rc = -1;
            break;
        }
    }
    free(copy);
    return rc;
}

/* The whole file as one NUL-terminated string (malloc'd). */
static char *read_file(const char *path, tg_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) {
        tg_fail(err, "%s: cannot open job file: %s", path, strerror(errno));
        return NULL;
    }
    size_t len = 0, cap = 4096;
    char *text = tg_malloc(cap);
    while (text) {
        len += fread(text + len, 1, cap - len - 1, f);
        if (len < cap - 1) break;
        char *grown = tg_realloc(text, cap *= 2);
        if (!grown) free(text);
        text = grown;
    }
    if (!text) tg_fail(err, "%s: out of memory", path);
    else if (ferror(f)) {
        tg_fail(err, "%s: read error: %s", path, strerror(errno));
        free(text);
        text = NULL;
    } else {
        text[len] = 0;
        /* A NUL would end the text early and hide the rest of the line and file. */
        const char *nul = memchr(text, 0, len);
        if (nul) {
            int line = 1;
            char *start = text;
            for (char *e = line_end(text); *e; e = line_end(start)) start = next_line(e), line++;
            tg_fail(err, "%s:%d: NUL byte at column %ld (a job file is text)", path, line, (long)(nul - start) + 1);
            free(text);
            text = NULL;
        }
    }
    fclose(f);
    return text;
}

/* ---- overrides and the cross-key checks ---- */

/* seq and seq_buckets together: the plan's seq is the last bucket, so a job that gives
 * both must agree, and one that gives only the buckets gets seq from them; a job without
 * buckets has the one, seq. */
static int resolve_buckets(tg_job *job, tg_err *err) {
    char w1[TG_PATH_MAX + 32], w2[TG_PATH_MAX + 32];
    if (!job->key_line[TG_JOB_SEQ_BUCKETS]) {
        memset(job->bucket_seq, 0, sizeof job->bucket_seq);
        job->n_buckets = 1;
        job->bucket_seq[0] = job->seq;
        return 0;
    }
    const int32_t last = job->bucket_seq[job->n_buckets - 1];
    if (!job->key_line[TG_JOB_SEQ])
        job->seq = last;
    else if (job->seq != last)
        return tg_fail(err, "%s: key 'seq': %d differs from the last of seq_buckets (%d, %s); the plan's seq is its "
                            "largest bucket (give the same, or leave seq out)",
                       tg_job_where(job, TG_JOB_SEQ, w1, sizeof w1), job->seq, last,
                       tg_job_where(job, TG_JOB_SEQ_BUCKETS, w2, sizeof w2));
    if (job->last_batch == TG_LAST_BATCH_WRAP)
        return tg_fail(err, "%s: key 'last_batch': wrap is not allowed with seq_buckets (%s): batches are formed per "
                            "bucket, so none completes from the next epoch (use pad or drop)",
                       tg_job_where(job, TG_JOB_LAST_BATCH, w1, sizeof w1),
                       tg_job_where(job, TG_JOB_SEQ_BUCKETS, w2, sizeof w2));
    return 0;
}

/* The betas a job leaves out are its optimizer's defaults: AdamW's 0.9 and 0.999, Adan's
 * reference 0.98, 0.92 and 0.99; beta3 and no_prox are Adan's alone. */
static int resolve_optimizer(tg_job *job, tg_err *err) {
    char w1[TG_PATH_MAX + 32], w2[TG_PATH_MAX + 32];
    const int adan = job->optimizer == TG_OPTIMIZER_ADAN;
    if (!job->key_line[TG_JOB_BETA1]) job->beta1 = adan ? 0.98f : 0.9f;
    if (!job->key_line[TG_JOB_BETA2]) job->beta2 = adan ? 0.92f : 0.999f;
    if (adan) return 0;
    for (int key = TG_JOB_BETA3; key <= TG_JOB_NO_PROX; key++)
        if (job->key_line[key])
            return tg_fail(err, "%s: key '%s': only meaningful for optimizer = adan (optimizer is adamw, %s)",
                           tg_job_where(job, key, w1, sizeof w1), tg_job_key_name(key),
                           tg_job_where(job, TG_JOB_OPTIMIZER, w2, sizeof w2));
    return 0;
}

static int validate(const tg_job *job, tg_err *err) {
    char w1[TG_PATH_MAX + 32], w2[TG_PATH_MAX + 32];
    if (!job->key_line[TG_JOB_MODEL]) /* a value that was set is not empty (set_path) */
        return tg_fail(err, "%s: key 'model' is required (a model folder or preset name)", job->path);
    if (!job->key_line[TG_JOB_TRAIN_DATA])
        return tg_fail(err, "%s: key 'train_data' is required (a .jsonl file)", job->path);
    if (job->steps > 0 && job->epochs > 0)
        return tg_fail(err, "%s: keys 'steps' (%s) and 'epochs' (%s) are both set; give exactly one",
                       job->path, tg_job_where(job, TG_JOB_STEPS, w1, sizeof w1),
                       tg_job_where(job, TG_JOB_EPOCHS, w2, sizeof w2));
    if (job->steps <= 0 && job->epochs <= 0)
        return tg_fail(err, "%s: one of keys 'steps' or 'epochs' is required", job->path);
    if (job->task != TG_TASK_CLASSIFY && job->key_line[TG_JOB_NUM_LABELS] != 0)
        return tg_fail(err, "%s: key 'num_labels': only meaningful for task = classify (task is %s)",
                       tg_job_where(job, TG_JOB_NUM_LABELS, w1, sizeof w1), tg_task_name(job->task));
    for (int key = TG_JOB_MLM_PROBABILITY; key <= TG_JOB_SPECIAL_TOKEN_IDS; key++)
        if (job->task != TG_TASK_MLM && job->key_line[key] != 0)
            return tg_fail(err, "%s: key '%s': only meaningful for task = mlm (task is %s)",
                           tg_job_where(job, key, w1, sizeof w1), tg_job_key_name(key), tg_task_name(job->task));
    for (int key = TG_JOB_LOSS_SCALE_INIT; key <= TG_JOB_LOSS_SCALE_GROWTH_INTERVAL; key++)
        if (job->precision != TG_PREC_FP16 && job->key_line[key] != 0)
            return tg_fail(err, "%s: key '%s': only meaningful for precision = fp16 (precision is %s)",
                           tg_job_where(job, key, w1, sizeof w1), tg_job_key_name(key),
                           tg_precision_name(job->precision));
    /* Modules train whole beside adapters only: without LoRA every module trains whole. */
    if (job->lora_modules_to_save[0] && job->lora_r <= 0)
        return tg_fail(err, "%s: key 'lora_modules_to_save': only meaningful with lora_r > 0 (without LoRA every "
                            "module trains whole already)",
                       tg_job_where(job, TG_JOB_LORA_MODULES_TO_SAVE, w1, sizeof w1));
    return 0;
}

/* One --set "key=value": fills its origin (the message prefix) and returns the key, with
 * *value pointing into *copy (the caller frees *copy, also on failure); -1 with the
 * message when it is not a known key=value. */
static int parse_set(const char *set, origin *o, char **copy, char **value, tg_err *err) {
    o->line = -1;
    o->dir = NULL; /* relative paths stay relative to the current directory */
    snprintf(o->prefix, sizeof o->prefix, "--set %.300s: ", set);
    *copy = tg_strdup(set);
    if (!*copy) return tg_fail(err, "%sout of memory", o->prefix);
    long bad = utf8_invalid_at((const unsigned char *)set, strlen(set));
    if (bad >= 0)
        return tg_fail(err, "%sinvalid UTF-8 (byte 0x%02X at column %ld)", o->prefix, (unsigned char)set[bad],
                       bad + 1);
    char *eq = strchr(*copy, '=');
    if (!eq) return tg_fail(err, "%sexpected key=value (missing '=')", o->prefix);
    *eq = 0;
    char *key = trim(*copy);
    if (!*key) return tg_fail(err, "%smissing key before '='", o->prefix);
    int k = find_key(key);
    if (k < 0) {
        unknown_key(key, o, err);
        return -1;
    }
    *value = unquote(eq + 1, o, key, err);
    return *value ? k : -1;
}

int tg_job_apply_overrides(tg_job *job, const char *const *overrides, int n_overrides,
                           tg_err *err) {
    for (int i = 0; i < n_overrides; i++) {
        origin o;
        char *copy = NULL, *v = NULL;
        int k = parse_set(overrides[i], &o, &copy, &v, err);
        int rc = k < 0 ? -1 : set_value(job, k, v, &o, err);
        /* steps and epochs are alternatives: choosing one on the command line replaces
         * the other rather than conflicting with the file. */
        if (rc == 0 && k == TG_JOB_STEPS && job->key_line[TG_JOB_EPOCHS] >= 0)
            job->epochs = 0, job->key_line[TG_JOB_EPOCHS] = 0;
        if (rc == 0 && k == TG_JOB_EPOCHS && job->key_line[TG_JOB_STEPS] >= 0)
            job->steps = 0, job->key_line[TG_JOB_STEPS] = 0;
        free(copy);
        if (rc) return rc;
    }
    if (resolve_buckets(job, err) || resolve_optimizer(job, err)) return -1;
    return validate(job, err);
}

void tg_job_run_settings(const tg_job *job, tg_plan_run *run) {
    memset(run, 0, sizeof *run);
    memcpy(run->train_data, job->train_data, sizeof run->train_data);
    memcpy(run->eval_data, job->eval_data, sizeof run->eval_data);
    run->steps = job->steps;
    run->epochs = job->epochs;
    run->log_every = job->log_every;
    run->seed = job->seed;
    run->checkpoint_every = job->checkpoint_every;
    run->keep_checkpoints = job->keep_checkpoints;
    memcpy(run->checkpoint_dir, job->checkpoint_dir, sizeof run->checkpoint_dir);
    run->last_batch = job->last_batch;
    run->skip_nonfinite = job->skip_nonfinite;
    run->max_skipped_steps = job->max_skipped_steps;
    run->qa_n_best = job->qa_n_best;
    run->qa_max_answer_length = job->qa_max_answer_length;
    run->qa_null_threshold = job->qa_null_threshold;
    run->gpu_hour_price = job->gpu_hour_price;
}

int tg_job_apply_run_overrides(tg_plan_run *run, int n_buckets, const char *const *sets, int n,
                               const char *plan_name, tg_err *err) {
    /* The run keys go through a job holding the plan's run settings, so they are parsed
     * and checked exactly as in a job file. */
    tg_job job;
    tg_job_defaults(&job);
    memcpy(job.train_data, run->train_data, sizeof job.train_data);
    memcpy(job.eval_data, run->eval_data, sizeof job.eval_data);
    job.steps = run->steps, job.epochs = run->epochs, job.log_every = run->log_every, job.seed = run->seed;
    job.checkpoint_every = run->checkpoint_every, job.keep_checkpoints = run->keep_checkpoints;
    memcpy(job.checkpoint_dir, run->checkpoint_dir, sizeof job.checkpoint_dir);
    job.last_batch = run->last_batch;
    job.skip_nonfinite = run->skip_nonfinite, job.max_skipped_steps = run->max_skipped_steps;
    job.qa_n_best = run->qa_n_best, job.qa_max_answer_length = run->qa_max_answer_length;
    job.qa_null_threshold = run->qa_null_threshold;
    job.gpu_hour_price = run->gpu_hour_price;
    snprintf(job.path, sizeof job.path, "%s", plan_name);
    for (int i = 0; i < n; i++) {
        origin o;
        char *copy = NULL, *v = NULL;
        int k = parse_set(sets[i], &o, &copy, &v, err);
        int rc = k < 0 ? -1 : 0;
        if (rc == 0 && !k_keys[k].run) {
            char list[256] = "";
            for (int r = 0; r < TG_JOB_KEY_COUNT; r++)
                if (k_keys[r].run) {
                    strncat(list, list[0] ? ", " : "", sizeof list - strlen(list) - 1);
                    strncat(list, k_keys[r].name, sizeof list - strlen(list) - 1);
                }
            rc = tg_fail(err, "--set %.300s: this key is compiled into %s; recompile the job to change it "
                              "(a plan takes %s)",
                         sets[i], plan_name, list);
        }
        if (rc == 0) rc = set_value(&job, k, v, &o, err);
        /* steps and epochs replace each other, unless both are given here. */
        if (rc == 0 && k == TG_JOB_STEPS && job.key_line[TG_JOB_EPOCHS] >= 0) job.epochs = 0;
        if (rc == 0 && k == TG_JOB_EPOCHS && job.key_line[TG_JOB_STEPS] >= 0) job.steps = 0;
        free(copy);
        if (rc) return rc;
    }
    if (job.key_line[TG_JOB_STEPS] < 0 && job.key_line[TG_JOB_EPOCHS] < 0)
        return tg_fail(err, "%s: keys 'steps' (--set) and 'epochs' (--set) are both set; give exactly one",
                       plan_name);
    if (job.key_line[TG_JOB_LAST_BATCH] < 0 && job.last_batch == TG_LAST_BATCH_WRAP && n_buckets > 1)
        return tg_fail(err, "--set last_batch=wrap: %s has %d length buckets (seq_buckets), and wrap is not allowed "
                            "with buckets (use pad or drop)",
                       plan_name, n_buckets);
    tg_job_run_settings(&job, run);
    return 0;
}

int tg_job_parse_text(const char *text, const char *name, const char *base_dir,
                      const char *const *overrides, int n_overrides, tg_job *job, tg_err *err) {
    tg_job_defaults(job);
    if (snprintf(job->path, sizeof job->path, "%s", name) >= (int)sizeof job->path)
        return tg_fail(err, "%s: job name is too long", name);
    /* The folder as a prefix with its trailing slash ("a/b/", "/", or "" for the cwd). */
    char dir[TG_PATH_MAX];
    size_t n = base_dir ? strlen(base_dir) : 0;
    if (snprintf(dir, sizeof dir, "%s%s", n ? base_dir : "", n && base_dir[n - 1] != '/' ? "/" : "") >=
        (int)sizeof dir)
        return tg_fail(err, "%s: base folder %s is too long", name, base_dir);
    if (parse_text(text, name, dir, job, err) != 0) return -1;
    return tg_job_apply_overrides(job, overrides, n_overrides, err);
}

int tg_job_load(const char *path, const char *const *overrides, int n_overrides, tg_job *job,
                tg_err *err) {
    if (strlen(path) >= sizeof job->path) return tg_fail(err, "%s: job file path is too long", path);
    char dir[TG_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = 0;
    else
        dir[0] = 0;
    char *text = read_file(path, err);
    if (!text) return -1;
    int rc = tg_job_parse_text(text, path, dir, overrides, n_overrides, job, err);
    free(text);
    return rc;
}
