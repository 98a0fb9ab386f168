#include "compiler/size_check.h"

#include <stdio.h>
#include <string.h>

#include "base/checked.h"
#include "compiler/limits.h"
#include "compiler/model_build.h"

/* The config's fields as its config.json spells them for the model's family. */
enum { F_VOCAB, F_HIDDEN, F_LAYERS, F_HEADS, F_INTERMEDIATE, F_POSITIONS, F_TYPES, F_COUNT };

static const char *field_name(const tg_model_config *cfg, int f) {
    static const char *const encoder[F_COUNT] = {"vocab_size", "hidden_size", "num_hidden_layers",
                                                 "num_attention_heads", "intermediate_size",
                                                 "max_position_embeddings", "type_vocab_size"};
    static const char *const gpt2[F_COUNT] = {"vocab_size", "n_embd", "n_layer", "n_head", "n_inner", "n_positions",
                                              "type_vocab_size"};
    return (cfg->arch == TG_ARCH_GPT2 ? gpt2 : encoder)[f];
}

static int64_t field_value(const tg_model_config *cfg, int f) {
    switch (f) {
    case F_VOCAB: return cfg->vocab_size;
    case F_HIDDEN: return cfg->hidden;
    case F_LAYERS: return cfg->layers;
    case F_HEADS: return cfg->heads;
    case F_INTERMEDIATE: return cfg->intermediate;
    case F_POSITIONS: return cfg->max_positions;
    default: return cfg->type_vocab_size;
    }
}

void tg_format_bytes(uint64_t bytes, char *buf, size_t len) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, u++; /* GCOVR_EXCL_BR_LINE: 2^64 bytes is 16 EiB, so u stops at 5 */
    snprintf(buf, len, "%.1f %s", v, units[u]);
}

/* A job error about `key`: "<where>: key '<key>': <msg>". */
static int size_error(const tg_job *job, int key, tg_err *err, const char *msg) {
    char where[TG_PATH_MAX + 32];
    return tg_fail(err, "%s: key '%s': %s", tg_job_where(job, key, where, sizeof where), tg_job_key_name(key), msg);
}

static int config_error(const tg_job *job, const tg_model_config *cfg, tg_err *err, const char *msg) {
    char full[900];
    snprintf(full, sizeof full, "model '%s': %s", cfg->source, msg);
    return size_error(job, TG_JOB_MODEL, err, full);
}

/* One factor of a tensor's element count: a field (or a value derived from fields) and
 * its name as the message shows it (NULL for a constant). */
typedef struct factor {
    const char *name;
    int64_t value;
} factor;

/* The tensor `what`, of elem_bytes-byte elements and the product of the factors, must fit
 * one pool; refused under `key` naming the factors (model: the config's fields, with the
 * model's name). */
static int check_tensor(const tg_job *job, const tg_model_config *cfg, tg_err *err, int key, const char *what,
                        int elem_bytes, const factor *f, int n) {
    uint64_t elements = 1, bytes = 0;
    int overflow = 0;
    for (int i = 0; i < n; i++)
        if (f[i].value < 1) return 0; /* not a size: refused by the check of that field */
    for (int i = 0; i < n; i++) overflow |= tg_mul_u64(elements, (uint64_t)f[i].value, &elements) != 0;
    overflow |= tg_mul_u64(elements, (uint64_t)elem_bytes, &bytes) != 0;
    if (!overflow && bytes <= TG_MAX_POOL_BYTES) return 0;
    char msg[900], product[400] = "", size[32], limit[32];
    for (int i = 0; i < n; i++) {
        size_t at = strlen(product);
        snprintf(product + at, sizeof product - at, "%s%s%s%lld", i ? " x " : "", f[i].name ? f[i].name : "",
                 f[i].name ? " " : "", (long long)f[i].value);
    }
    tg_format_bytes(TG_MAX_POOL_BYTES, limit, sizeof limit);
    if (overflow) snprintf(size, sizeof size, "more than 2^64 bytes");
    else tg_format_bytes(bytes, size, sizeof size);
    snprintf(msg, sizeof msg, "%s makes %s of %s (%d-byte elements), more than the %s one memory pool may hold",
             product, what, size, elem_bytes, limit);
    return key == TG_JOB_MODEL ? config_error(job, cfg, err, msg) : size_error(job, key, err, msg);
}

int tg_check_sizes(const tg_job *job, const tg_model_config *cfg, tg_err *err) {
    char msg[700];
    /* Image models: the config's and the job keys' sizes are bounded where they are read;
     * each tensor the builder makes is checked against a pool's limit as it is added. */
    if (cfg->arch == TG_ARCH_MOBILENET_V2)
        return job->batch < 1 ? size_error(job, TG_JOB_BATCH, err, "batch must be at least 1") : 0;
    const int no_types = cfg->arch == TG_ARCH_GPT2 || cfg->arch == TG_ARCH_LLAMA;
    const int llama = cfg->arch == TG_ARCH_LLAMA; /* rotary positions: no position table */
    /* Dimensions: each positive (GPT-2 and Llama have no token types), heads dividing the width. */
    for (int f = 0; f < F_COUNT; f++) {
        if (f == F_TYPES && no_types) continue;
        if (field_value(cfg, f) >= 1) continue;
        snprintf(msg, sizeof msg, "%s %lld is not a positive count", field_name(cfg, f), (long long)field_value(cfg, f));
        return config_error(job, cfg, err, msg);
    }
    if (cfg->hidden % cfg->heads != 0) {
        snprintf(msg, sizeof msg, "%s %d is not divisible by %s %d", field_name(cfg, F_HIDDEN), cfg->hidden,
                 field_name(cfg, F_HEADS), cfg->heads);
        return config_error(job, cfg, err, msg);
    }
    if (cfg->layers > TG_MAX_LAYERS) {
        snprintf(msg, sizeof msg, "%s %d is more than the %d layers a plan may have", field_name(cfg, F_LAYERS),
                 cfg->layers, TG_MAX_LAYERS);
        return config_error(job, cfg, err, msg);
    }
    if (job->batch < 1) return size_error(job, TG_JOB_BATCH, err, "batch must be at least 1");
    if (job->seq < 1) return size_error(job, TG_JOB_SEQ, err, "seq must be at least 1");

    /* The largest tensors each family builds (fp32; bf16 plans store some in half). */
    const factor B = {"batch", job->batch}, T = {"seq", job->seq}, D = {field_name(cfg, F_HIDDEN), cfg->hidden},
                 D3 = {NULL, 3}, two = {NULL, 2}, H = {field_name(cfg, F_HEADS), cfg->heads},
                 I = {field_name(cfg, F_INTERMEDIATE), cfg->intermediate},
                 V = {field_name(cfg, F_VOCAB), cfg->vocab_size},
                 Vp = {"vocab_size rounded up to 64", ((int64_t)cfg->vocab_size + 63) / 64 * 64},
                 P = {field_name(cfg, F_POSITIONS), cfg->max_positions},
                 TV = {field_name(cfg, F_TYPES), cfg->type_vocab_size}, L = {"num_labels", job->num_labels},
                 T32 = {"seq/32", ((int64_t)job->seq + 31) / 32};
    const int lm = job->task == TG_TASK_LM;
    const struct {
        int when, key, elem_bytes;
        const char *what;
        factor f[4];
        int n;
    } tensors[] = {
        {1, TG_JOB_MODEL, 4, "the token embedding table", {lm ? Vp : V, D}, 2},
        {!llama, TG_JOB_MODEL, 4, "the position embedding table", {P, D}, 2},
        {!no_types, TG_JOB_MODEL, 4, "the token type embedding table", {TV, D}, 2},
        {1, TG_JOB_MODEL, 4, "the query, key and value weights of a layer", {D3, D, D}, 3},
        {1, TG_JOB_MODEL, 4, "an MLP weight", {I, D}, 2},
        {1, TG_JOB_BATCH, 4, "a layer's query, key and value", {B, T, D3, D}, 4},
        {1, TG_JOB_BATCH, 4, "a layer's MLP activation", {B, T, I}, 3},
        {llama, TG_JOB_BATCH, 4, "a layer's gate and up projections", {B, T, two, I}, 4},
        {llama, TG_JOB_MODEL, 4, "the gate and up weights of a layer", {two, I, D}, 3},
        {!tg_fused_attention(job, cfg), TG_JOB_BATCH, 4, "a layer's attention scores", {B, H, T, T}, 4},
        {tg_fused_attention(job, cfg) && cfg->attention_dropout > 0, TG_JOB_BATCH, 4,
         "a layer's attention dropout mask bits", {B, H, T, T32}, 4},
        {lm, TG_JOB_BATCH, 4, "the logits", {B, T, Vp}, 3},
        {job->task == TG_TASK_MLM, TG_JOB_BATCH, 4, "the logits", {B, T, V}, 3},
        {!lm, TG_JOB_NUM_LABELS, 4, "the classifier weight", {L, D}, 2},
    };
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
        if (tensors[i].when && check_tensor(job, cfg, err, tensors[i].key, tensors[i].what, tensors[i].elem_bytes,
                                            tensors[i].f, tensors[i].n))
            return -1;
    return 0;
}

int tg_pool_size_key(int pool) {
    switch (pool) {
    case TG_POOL_ACTIVATIONS:
    case TG_POOL_INPUTS:
    case TG_POOL_WORKSPACE: return TG_JOB_BATCH;
    default: return TG_JOB_MODEL;
    }
}

void tg_describe_pool_size(const tg_job *job, const tg_model_config *cfg, int pool, char *buf, size_t len) {
    if (!cfg) {
        snprintf(buf, len, "the graph");
        return;
    }
    char model[TG_PATH_MAX + 200];
    if (cfg->arch == TG_ARCH_MOBILENET_V2) {
        snprintf(model, sizeof model, "model '%s' (%s, width_mult %g, %d channels of %d x %d pixels)", cfg->source,
                 tg_arch_name(cfg->arch), (double)cfg->width_mult, cfg->image_channels, cfg->image_size,
                 cfg->image_size);
        if (job && tg_pool_size_key(pool) == TG_JOB_BATCH) snprintf(buf, len, "batch %d with %s", job->batch, model);
        else snprintf(buf, len, "%s", model);
        return;
    }
    snprintf(model, sizeof model, "model '%s' (%s %d, %s %d, %s %d, %s %d)", cfg->source, field_name(cfg, F_LAYERS),
             cfg->layers, field_name(cfg, F_HIDDEN), cfg->hidden, field_name(cfg, F_INTERMEDIATE), cfg->intermediate,
             field_name(cfg, F_VOCAB), cfg->vocab_size);
    if (job && tg_pool_size_key(pool) == TG_JOB_BATCH)
        snprintf(buf, len, "batch %d x seq %d with %s", job->batch, job->seq, model);
    else snprintf(buf, len, "%s", model);
}
