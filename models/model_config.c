#include "models/model_config.h"
#include "base/alloc.h"

#include "base/text_file.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json_strict.h"
#include "models/hf_checkpoint.h"

#ifndef TG_PRESETS_DIR
#define TG_PRESETS_DIR "models/presets"
#endif

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The first of the preset folders' usual places relative to `file`'s folder: a build
 * tree's build/ or build/gpu/, or an installed bin/ or lib/ next to share/. */
static int presets_beside(const char *file, char *out, size_t cap) {
    static const char *const rel[] = {"../models/presets", "../../models/presets", "../share/tunegraph/presets"};
    const char *slash = strrchr(file, '/');
    /* The callers pass absolute paths (dladdr's, checked; /proc/self/exe's). */
    if (!slash) return 0; /* GCOVR_EXCL_BR_LINE: see above */
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        snprintf(out, cap, "%.*s/%s", (int)(slash - file), file, rel[i]);
        if (is_dir(out)) return 1;
    }
    return 0;
}

static char found_presets[1024];

static void find_presets(void) {
    Dl_info self;
    char exe[900];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0; /* GCOVR_EXCL_BR_LINE: readlink of /proc/self/exe fails only where /proc is not mounted */
    /* A relative name is the main program's argv[0]: /proc/self/exe says it better. */
    int ok = dladdr((void *)tg_presets_dir, &self) && self.dli_fname && self.dli_fname[0] == '/' && /* GCOVR_EXCL_BR_LINE: dladdr of a function of this program finds its object, whose name it gives */
             presets_beside(self.dli_fname, found_presets, sizeof found_presets);
    if (!ok && n > 0) ok = presets_beside(exe, found_presets, sizeof found_presets); /* GCOVR_EXCL_BR_LINE: n > 0: readlink of /proc/self/exe fails only where /proc is not mounted */
    if (!ok)
        snprintf(found_presets, sizeof found_presets, "%s", is_dir(TG_PRESETS_DIR) ? TG_PRESETS_DIR : "models/presets"); /* GCOVR_EXCL_BR_LINE: TG_PRESETS_DIR is the source tree's presets folder, which the suite runs beside */
}

/* $TUNEGRAPH_PRESETS, else the folder beside the code that runs this (libtunegraph.so
 * when linked as one, else the executable; so an installed library or CLI uses the
 * presets installed with it, and a moved or copied tree still finds its own), else the
 * source tree's folder as built. Searched once, whichever thread asks first. */
const char *tg_presets_dir(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    const char *env = getenv("TUNEGRAPH_PRESETS");
    if (env && env[0]) return env;
    pthread_once(&once, find_presets);
    return found_presets;
}

/* ---- typed field readers: each error names the file and the field ---- */

typedef struct reader {
    const char *path;
    json_t *root;
    tg_err *err;
    /* The object's own field name and a dot ("rope_scaling.") where root is an object
     * inside the file's, so messages name the field as the file nests it; NULL at the top. */
    const char *prefix;
} reader;

#define PFX(r) ((r)->prefix ? (r)->prefix : "")

/* A required integer field in [min, max]. */
static int get_int(reader *r, const char *key, int64_t min, int32_t max, int32_t *out) {
    json_t *v = json_object_get(r->root, key);
    if (!v) return tg_fail(r->err, "%s: field '%s%s': missing", r->path, PFX(r), key);
    const char *what = min > 0 ? "a positive integer" : "a non-negative integer";
    /* json_typeof, not json_is_*: v is not NULL here (the macros test for NULL again). */
    if (json_typeof(v) != JSON_INTEGER || json_integer_value(v) < min)
        return tg_fail(r->err, "%s: field '%s%s': expected %s", r->path, PFX(r), key, what);
    if (json_integer_value(v) > max)
        return tg_fail(r->err, "%s: field '%s%s': %lld is past the limit of %d", r->path, PFX(r), key,
                       (long long)json_integer_value(v), max);
    *out = (int32_t)json_integer_value(v);
    return 0;
}

/* Like get_int, but JSON null (as HF writes for "unset") also gives null_value. */
static int get_int_or_null(reader *r, const char *key, int32_t null_value, int64_t min, int32_t max, int32_t *out) {
    json_t *v = json_object_get(r->root, key);
    if (!v || json_typeof(v) == JSON_NULL) {
        *out = null_value;
        return 0;
    }
    return get_int(r, key, min, max, out);
}

/* Number field in [lo, hi] (hi_open: hi excluded); absent -> def. */
static int get_float(reader *r, const char *key, double def, double lo, double hi, int hi_open, float *out) {
    json_t *v = json_object_get(r->root, key);
    if (!v) {
        *out = (float)def;
        return 0;
    }
    if (json_typeof(v) != JSON_INTEGER && json_typeof(v) != JSON_REAL)
        return tg_fail(r->err, "%s: field '%s%s': expected a number", r->path, PFX(r), key);
    double d = json_number_value(v);
    if (!(d >= lo) || d > hi || (hi_open && d >= hi))
        return tg_fail(r->err, "%s: field '%s%s': %g is out of range [%g, %g%c", r->path, PFX(r), key, d, lo, hi,
                       hi_open ? ')' : ']');
    *out = (float)d;
    return 0;
}

/* String field; absent -> def. */
static int get_string(reader *r, const char *key, const char *def, const char **out) {
    json_t *v = json_object_get(r->root, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (json_typeof(v) != JSON_STRING)
        return tg_fail(r->err, "%s: field '%s%s': expected a string", r->path, PFX(r), key);
    *out = json_string_value(v);
    return 0;
}

/* A boolean switch selecting behaviour we do not implement: only `unsupported_value` is refused. */
static int reject_bool(reader *r, const char *key, int unsupported_value) {
    json_t *v = json_object_get(r->root, key);
    if (!v) return 0;
    if (json_typeof(v) != JSON_TRUE && json_typeof(v) != JSON_FALSE)
        return tg_fail(r->err, "%s: field '%s': expected true or false", r->path, key);
    if ((json_typeof(v) == JSON_TRUE) == unsupported_value)
        return tg_fail(r->err, "%s: field '%s': %s is not supported", r->path, key,
                       unsupported_value ? "true" : "false");
    return 0;
}

static int parse_gelu(reader *r, const char *key, const char *name, int32_t *out) {
    if (strcmp(name, "gelu") == 0) *out = TG_GELU_ERF;
    else if (strcmp(name, "gelu_new") == 0 || strcmp(name, "gelu_pytorch_tanh") == 0) *out = TG_GELU_TANH;
    else
        return tg_fail(r->err,
                       "%s: field '%s': unsupported activation '%s' (supported: gelu, gelu_new, gelu_pytorch_tanh)",
                       r->path, key, name);
    return 0;
}

static int check_heads(reader *r, const char *hidden_key, const char *heads_key, const tg_model_config *c) {
    if (c->hidden % c->heads != 0)
        return tg_fail(r->err, "%s: field '%s': %s %d is not divisible by %s %d", r->path, heads_key, hidden_key,
                       c->hidden, heads_key, c->heads);
    return 0;
}

static int check_pad(reader *r, const char *key, const tg_model_config *c) {
    if (c->pad_token_id >= c->vocab_size)
        return tg_fail(r->err, "%s: field '%s': %d is not below vocab_size %d", r->path, key, c->pad_token_id,
                       c->vocab_size);
    return 0;
}

/* The config's names for the sizes that messages about the sizes name. */
typedef struct size_fields {
    const char *vocab, *hidden, *layers, *positions;
} size_fields;

static const size_fields k_bert_fields = {"vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings"};
static const size_fields k_gpt2_fields = {"vocab_size", "n_embd", "n_layer", "n_positions"};

/* The field limits keep every size below 2^23 (3 x hidden included) and every weight
 * checked here within 2^34 elements, with at most 4096 layers: the products and sums below
 * stay under 2^51 and cannot overflow int64. */
_Static_assert(TG_MODEL_MAX_VOCAB <= (1 << 22) && TG_MODEL_MAX_POSITIONS <= (1 << 20) &&
                   TG_MODEL_MAX_INTERMEDIATE <= (1 << 18) && TG_MODEL_MAX_HIDDEN <= (1 << 16) &&
                   TG_MODEL_MAX_TYPE_VOCAB <= (1 << 10) && TG_MODEL_MAX_LAYERS <= (1 << 12) &&
                   TG_MODEL_MAX_TENSOR_ELEMENTS <= (INT64_C(1) << 34),
               "check_sizes' products and sums would need overflow checks");
/* The token type embeddings, the attention projections (fused or not) and the feed-forward
 * projections are within the per-weight limit whatever the sizes: only the token and
 * position embeddings can pass it. */
_Static_assert((int64_t)TG_MODEL_MAX_TYPE_VOCAB * TG_MODEL_MAX_HIDDEN <= TG_MODEL_MAX_TENSOR_ELEMENTS &&
                   3 * (int64_t)TG_MODEL_MAX_HIDDEN * TG_MODEL_MAX_HIDDEN <= TG_MODEL_MAX_TENSOR_ELEMENTS &&
                   (int64_t)TG_MODEL_MAX_INTERMEDIATE * TG_MODEL_MAX_HIDDEN <= TG_MODEL_MAX_TENSOR_ELEMENTS,
               "check_sizes must check these weights against the per-weight limit");

/* a x b elements of one weight (`what`), refused naming `field` (the one named a) past
 * TG_MODEL_MAX_TENSOR_ELEMENTS. */
static int weight_numel(reader *r, const char *what, const char *field, int64_t a, const char *b_name, int64_t b,
                        int64_t *out) {
    *out = a * b;
    if (*out > TG_MODEL_MAX_TENSOR_ELEMENTS)
        return tg_fail(r->err,
                       "%s: field '%s': %s of %lld x %s %lld elements is past the limit of %lld elements per weight",
                       r->path, field, what, (long long)a, b_name, (long long)b,
                       (long long)TG_MODEL_MAX_TENSOR_ELEMENTS);
    return 0;
}

/* The weights the sizes imply, each within TG_MODEL_MAX_TENSOR_ELEMENTS, and the whole
 * model's parameters within TG_MODEL_MAX_PARAMS (no overflow: see the assertion above).
 * The count leaves out the task head (num_labels comes with the job), which is no bigger
 * than a layer. */
static int check_sizes(reader *r, const tg_model_config *c, const size_fields *f) {
    const int64_t h = c->hidden;
    int64_t words, positions;
    /* Llama has rotary positions: no position table. */
    const int64_t position_rows = c->arch == TG_ARCH_LLAMA ? 0 : c->max_positions;
    if (weight_numel(r, "the token embeddings", f->vocab, c->vocab_size, f->hidden, h, &words) ||
        weight_numel(r, "the position embeddings", f->positions, position_rows, f->hidden, h, &positions))
        return -1;
    /* Within the limit (the assertion above). */
    const int64_t types = (int64_t)c->type_vocab_size * h, square = h * h, fused = 3 * h * h,
                  wide = (int64_t)c->intermediate * h;
    /* Per layer: query, key, value and output projections with biases, two feed-forward
     * projections with biases, two LayerNorms. Llama: no biases, the key and value
     * projections of kv_heads heads, three MLP projections (gate, up, down) and two
     * RMSNorms; the embeddings and the final RMSNorm (the LM head, tied or not, is a task
     * head). kv_heads divides heads, which divides hidden: the kv width is at most h. */
    const int64_t kv = c->arch == TG_ARCH_LLAMA ? (int64_t)c->kv_heads * (h / c->heads) * h : 0;
    const int64_t layer = c->arch == TG_ARCH_LLAMA ? 2 * square + 2 * kv + 3 * wide + 2 * h
                                                   : fused + square + 2 * wide + 9 * h + c->intermediate;
    const int64_t embed = c->arch == TG_ARCH_LLAMA ? words + h
                                                   : words + positions + types + square + 5 * h; /* with the pooler or final LayerNorm */
    const int64_t total = layer * c->layers + embed;
    if (total > TG_MODEL_MAX_PARAMS)
        return tg_fail(r->err,
                       "%s: field '%s': %d layers of %lld parameters, with %lld more in the embeddings, make %lld "
                       "parameters, past the limit of %lld",
                       r->path, f->layers, c->layers, (long long)layer, (long long)embed, (long long)total,
                       (long long)TG_MODEL_MAX_PARAMS);
    return 0;
}

/* BERT and RoBERTa share the field names (RobertaConfig subclasses BertConfig). */
static int parse_bert(reader *r, tg_model_config *c, int roberta) {
    const char *act = NULL, *pos = NULL;
    float hidden_drop = 0;
    if (get_int(r, "vocab_size", 1, TG_MODEL_MAX_VOCAB, &c->vocab_size) ||
        get_int(r, "hidden_size", 1, TG_MODEL_MAX_HIDDEN, &c->hidden) ||
        get_int(r, "num_hidden_layers", 1, TG_MODEL_MAX_LAYERS, &c->layers) ||
        get_int(r, "num_attention_heads", 1, TG_MODEL_MAX_HEADS, &c->heads) ||
        get_int(r, "intermediate_size", 1, TG_MODEL_MAX_INTERMEDIATE, &c->intermediate) ||
        get_int(r, "max_position_embeddings", 1, TG_MODEL_MAX_POSITIONS, &c->max_positions) ||
        get_int(r, "type_vocab_size", 1, TG_MODEL_MAX_TYPE_VOCAB, &c->type_vocab_size) ||
        get_int_or_null(r, "pad_token_id", -1, 0, INT32_MAX, &c->pad_token_id) ||
        get_float(r, "layer_norm_eps", 1e-12, 1e-30, 1, 0, &c->layer_norm_eps) ||
        get_float(r, "initializer_range", 0.02, 0, 10, 0, &c->initializer_range) ||
        get_float(r, "hidden_dropout_prob", 0.1, 0, 1, 1, &hidden_drop) ||
        get_float(r, "attention_probs_dropout_prob", 0.1, 0, 1, 1, &c->attention_dropout) ||
        get_string(r, "hidden_act", "gelu", &act) || get_string(r, "position_embedding_type", "absolute", &pos))
        return -1;
    /* HF omits pad_token_id rarely; its defaults are 0 (BERT) and 1 (RoBERTa). */
    if (!json_object_get(r->root, "pad_token_id")) c->pad_token_id = roberta ? 1 : 0;
    c->hidden_dropout = hidden_drop;
    c->embedding_dropout = hidden_drop;
    json_t *cd = json_object_get(r->root, "classifier_dropout");
    if (!cd || json_typeof(cd) == JSON_NULL) c->classifier_dropout = hidden_drop;
    else if (get_float(r, "classifier_dropout", 0, 0, 1, 1, &c->classifier_dropout)) return -1;
    if (parse_gelu(r, "hidden_act", act, &c->gelu)) return -1;
    if (strcmp(pos, "absolute") != 0)
        return tg_fail(r->err, "%s: field 'position_embedding_type': '%s' is not supported (only 'absolute')",
                       r->path, pos);
    if (check_heads(r, "hidden_size", "num_attention_heads", c) || check_pad(r, "pad_token_id", c) ||
        check_sizes(r, c, &k_bert_fields))
        return -1;
    /* RoBERTa positions start at pad_token_id + 1, so the table must reach past that. */
    if (roberta && c->max_positions <= c->pad_token_id + 1)
        return tg_fail(r->err,
                       "%s: field 'max_position_embeddings': %d leaves no positions after the padding offset "
                       "(pad_token_id %d + 1)",
                       r->path, c->max_positions, c->pad_token_id);
    return 0;
}

static int parse_gpt2(reader *r, tg_model_config *c) {
    const char *act = NULL;
    if (get_int(r, "vocab_size", 1, TG_MODEL_MAX_VOCAB, &c->vocab_size) ||
        get_int(r, "n_embd", 1, TG_MODEL_MAX_HIDDEN, &c->hidden) ||
        get_int(r, "n_layer", 1, TG_MODEL_MAX_LAYERS, &c->layers) ||
        get_int(r, "n_head", 1, TG_MODEL_MAX_HEADS, &c->heads) ||
        get_int(r, "n_positions", 1, TG_MODEL_MAX_POSITIONS, &c->max_positions) ||
        get_int_or_null(r, "n_inner", 0, 1, TG_MODEL_MAX_INTERMEDIATE, &c->intermediate) ||
        get_int_or_null(r, "pad_token_id", -1, 0, INT32_MAX, &c->pad_token_id) ||
        get_string(r, "activation_function", "gelu_new", &act) ||
        get_float(r, "layer_norm_epsilon", 1e-5, 1e-30, 1, 0, &c->layer_norm_eps) ||
        get_float(r, "initializer_range", 0.02, 0, 10, 0, &c->initializer_range) ||
        get_float(r, "resid_pdrop", 0.1, 0, 1, 1, &c->hidden_dropout) ||
        get_float(r, "attn_pdrop", 0.1, 0, 1, 1, &c->attention_dropout) ||
        get_float(r, "embd_pdrop", 0.1, 0, 1, 1, &c->embedding_dropout) ||
        parse_gelu(r, "activation_function", act, &c->gelu) ||
        reject_bool(r, "scale_attn_by_inverse_layer_idx", 1) || reject_bool(r, "reorder_and_upcast_attn", 1) ||
        reject_bool(r, "scale_attn_weights", 0) || reject_bool(r, "add_cross_attention", 1))
        return -1;
    /* n_inner null: 4 x n_embd, within TG_MODEL_MAX_INTERMEDIATE as n_embd is within its limit. */
    if (c->intermediate == 0) c->intermediate = 4 * c->hidden;
    c->type_vocab_size = 0;
    c->classifier_dropout = 0;
    if (check_heads(r, "n_embd", "n_head", c) || check_pad(r, "pad_token_id", c) || check_sizes(r, c, &k_gpt2_fields))
        return -1;
    return 0;
}

/* rope_theta of reader r (the file's top level, or the rope object): above 1, as ROPE's
 * shape rule requires of the float (theta 1 makes every frequency 1). */
static int get_rope_theta(reader *r, tg_model_config *c) {
    if (get_float(r, "rope_theta", 10000.0, 1.0, 1e12, 0, &c->rope_theta)) return -1;
    if (!(c->rope_theta > 1.0f))
        return tg_fail(r->err, "%s: field '%srope_theta': %g is not above 1", r->path, PFX(r), c->rope_theta);
    return 0;
}

/* The Llama rotary embedding: transformers 5's `rope_parameters` object, or the older
 * `rope_theta` with `rope_scaling` (null, or an object) that Llama 3 folders carry. The
 * rope types are "default" and "llama3"; others (linear, dynamic, yarn...) are refused.
 * Messages name a field of the object with the object's name ("rope_scaling.factor"). */
static int parse_rope(reader *r, tg_model_config *c) {
    json_t *params = json_object_get(r->root, "rope_parameters");
    const char *field = "rope_parameters";
    json_t *scaling = params;
    if (!params || json_typeof(params) == JSON_NULL) {
        field = "rope_scaling";
        scaling = json_object_get(r->root, "rope_scaling");
        params = NULL;
        if (get_rope_theta(r, c)) return -1;
    }
    c->rope_type = TG_ROPE_DEFAULT;
    if (!scaling || json_typeof(scaling) == JSON_NULL) return 0;
    if (json_typeof(scaling) != JSON_OBJECT) return tg_fail(r->err, "%s: field '%s': expected an object or null", r->path, field);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", field);
    reader sub = {r->path, scaling, r->err, prefix};
    const char *type = NULL;
    /* HF reads "type" where "rope_type" is absent (older configs). */
    const char *type_key = json_object_get(scaling, "rope_type") ? "rope_type" : "type";
    if (get_string(&sub, type_key, "default", &type)) return -1;
    if (params && get_rope_theta(&sub, c)) return -1;
    if (!strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return tg_fail(r->err, "%s: field '%s%s': '%s' is not supported (supported: default, llama3)", r->path, prefix,
                       type_key, type);
    c->rope_type = TG_ROPE_LLAMA3;
    if (get_float(&sub, "factor", 8.0, 1.0, 1e6, 0, &c->rope_factor) ||
        get_float(&sub, "low_freq_factor", 1.0, 1e-6, 1e6, 0, &c->rope_low_freq_factor) ||
        get_float(&sub, "high_freq_factor", 4.0, 1e-6, 1e6, 0, &c->rope_high_freq_factor) ||
        get_int(&sub, "original_max_position_embeddings", 1, TG_MODEL_MAX_POSITIONS, &c->rope_original_max_positions))
        return -1;
    if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return tg_fail(r->err, "%s: field '%shigh_freq_factor': %g is not above low_freq_factor %g", r->path, prefix,
                       c->rope_high_freq_factor, c->rope_low_freq_factor);
    return 0;
}

/* A boolean field; absent -> def. */
static int get_bool(reader *r, const char *key, int def, int32_t *out) {
    json_t *v = json_object_get(r->root, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (json_typeof(v) != JSON_TRUE && json_typeof(v) != JSON_FALSE)
        return tg_fail(r->err, "%s: field '%s': expected true or false", r->path, key);
    *out = json_typeof(v) == JSON_TRUE;
    return 0;
}

/* LlamaConfig: RMSNorm, rotary positions, grouped-query attention, SwiGLU, no biases. */
static int parse_llama(reader *r, tg_model_config *c) {
    const char *act = NULL;
    int32_t head_dim = 0, tp = 1;
    if (get_int(r, "vocab_size", 1, TG_MODEL_MAX_VOCAB, &c->vocab_size) ||
        get_int(r, "hidden_size", 1, TG_MODEL_MAX_HIDDEN, &c->hidden) ||
        get_int(r, "num_hidden_layers", 1, TG_MODEL_MAX_LAYERS, &c->layers) ||
        get_int(r, "num_attention_heads", 1, TG_MODEL_MAX_HEADS, &c->heads) ||
        get_int_or_null(r, "num_key_value_heads", 0, 1, TG_MODEL_MAX_HEADS, &c->kv_heads) ||
        get_int_or_null(r, "head_dim", 0, 1, TG_MODEL_MAX_HIDDEN, &head_dim) ||
        get_int(r, "intermediate_size", 1, TG_MODEL_MAX_INTERMEDIATE, &c->intermediate) ||
        get_int(r, "max_position_embeddings", 1, TG_MODEL_MAX_POSITIONS, &c->max_positions) ||
        get_int_or_null(r, "pad_token_id", -1, 0, INT32_MAX, &c->pad_token_id) ||
        get_int_or_null(r, "pretraining_tp", 1, 1, INT32_MAX, &tp) ||
        get_float(r, "rms_norm_eps", 1e-6, 1e-30, 1, 0, &c->layer_norm_eps) ||
        get_float(r, "initializer_range", 0.02, 0, 10, 0, &c->initializer_range) ||
        get_float(r, "attention_dropout", 0.0, 0, 1, 1, &c->attention_dropout) ||
        get_string(r, "hidden_act", "silu", &act) || get_bool(r, "tie_word_embeddings", 0, &c->tie_word_embeddings) ||
        reject_bool(r, "attention_bias", 1) || reject_bool(r, "mlp_bias", 1) || parse_rope(r, c))
        return -1;
    /* transformers' ACT2FN maps "swish" to the same SiLU. */
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return tg_fail(r->err, "%s: field 'hidden_act': '%s' is not supported (Llama's MLP takes silu, or swish)",
                       r->path, act);
    if (tp != 1)
        return tg_fail(r->err, "%s: field 'pretraining_tp': %d is not supported (only 1)", r->path, tp);
    if (c->kv_heads == 0) c->kv_heads = c->heads;
    if (c->heads % c->kv_heads)
        return tg_fail(r->err, "%s: field 'num_key_value_heads': num_attention_heads %d is not a multiple of %d", r->path,
                       c->heads, c->kv_heads);
    if (check_heads(r, "hidden_size", "num_attention_heads", c)) return -1;
    if (head_dim && head_dim != c->hidden / c->heads)
        return tg_fail(r->err, "%s: field 'head_dim': %d is not hidden_size / num_attention_heads = %d (not supported)",
                       r->path, head_dim, c->hidden / c->heads);
    c->type_vocab_size = 0;
    c->gelu = TG_GELU_ERF; /* unused: the MLP is SwiGLU */
    if (check_pad(r, "pad_token_id", c) || check_sizes(r, c, &k_bert_fields)) return -1;
    return 0;
}

/* torchvision's mobilenet_v2 (tunegraph's own config: torchvision models have none):
 * image_channels, image_size and width_mult (each the default of the job keys of the same
 * names), classifier_dropout, batch_norm_eps and batch_norm_momentum, with torchvision's
 * defaults (3, 224, 1.0, 0.2, 1e-5, 0.1). Hugging Face's MobileNetV2 (TensorFlow padding,
 * other names) has the same model_type and is refused by its tf_padding field. */
static int parse_mobilenet_v2(reader *r, tg_model_config *c) {
    if (json_object_get(r->root, "tf_padding"))
        return tg_fail(r->err,
                       "%s: field 'tf_padding': a Hugging Face MobileNetV2 config; tunegraph builds torchvision's "
                       "mobilenet_v2 (its parameter names, PyTorch padding), whose config has no such field",
                       r->path);
    if (get_int_or_null(r, "image_channels", 3, 1, 3, &c->image_channels) ||
        get_int_or_null(r, "image_size", 224, 1, 4096, &c->image_size) ||
        get_float(r, "width_mult", 1.0, 1.0 / 1024, 16, 0, &c->width_mult) ||
        get_float(r, "classifier_dropout", 0.2, 0, 1, 1, &c->classifier_dropout) ||
        get_float(r, "batch_norm_eps", 1e-5, 1e-30, 1, 0, &c->layer_norm_eps) ||
        get_float(r, "batch_norm_momentum", 0.1, 0, 1, 0, &c->batch_norm_momentum))
        return -1;
    if (c->image_channels == 2)
        return tg_fail(r->err, "%s: field 'image_channels': 2 is not an image's channel count (1: grey, 3: RGB)",
                       r->path);
    c->pad_token_id = -1;
    c->gelu = TG_GELU_ERF; /* unused: the activations are ReLU6 */
    return 0;
}

/* The whole file; at most TG_MODEL_CONFIG_MAX_BYTES are read, so a huge file or an endless
 * one (a FIFO, /dev/zero) is refused promptly. */
static int read_config(const char *path, char **text, size_t *len, tg_err *err) {
    return tg_read_text_file(path, TG_MODEL_CONFIG_MAX_BYTES, "a config.json", text, len, err);
}

int tg_model_config_parse(const char *path, tg_model_config *cfg, tg_err *err) {
    memset(cfg, 0, sizeof *cfg);
    char *text = NULL;
    size_t len = 0;
    if (read_config(path, &text, &len, err)) return -1;
    json_error_t jerr;
    char dup[128];
    json_t *root = tg_json_loadb_strict(text, len, 0, &jerr, dup, sizeof dup);
    free(text);
    if (!root) {
        if (tg_json_out_of_memory(&jerr)) return tg_fail(err, "%s: out of memory parsing the JSON", path);
        if (dup[0])
            return tg_fail(err, "%s: key '%s' appears twice in one object (line %d, column %d)", path, dup, jerr.line,
                           jerr.column);
        return tg_fail(err, "%s: invalid JSON at line %d, column %d: %s", path, jerr.line, jerr.column, jerr.text);
    }
    reader r = {path, root, err, NULL};
    int rc;
    const char *type = NULL;
    if (json_typeof(root) != JSON_OBJECT) {
        rc = tg_fail(err, "%s: expected a JSON object at the top level", path);
    } else if (!json_object_get(root, "model_type")) {
        rc = tg_fail(err, "%s: field 'model_type': missing", path);
    } else if (get_string(&r, "model_type", NULL, &type)) {
        rc = -1;
    } else if (strcmp(type, "bert") == 0) {
        cfg->arch = TG_ARCH_BERT;
        rc = parse_bert(&r, cfg, 0);
    } else if (strcmp(type, "roberta") == 0) {
        cfg->arch = TG_ARCH_ROBERTA;
        rc = parse_bert(&r, cfg, 1);
    } else if (strcmp(type, "gpt2") == 0) {
        cfg->arch = TG_ARCH_GPT2;
        rc = parse_gpt2(&r, cfg);
    } else if (strcmp(type, "llama") == 0) {
        cfg->arch = TG_ARCH_LLAMA;
        rc = parse_llama(&r, cfg);
    } else if (strcmp(type, "mobilenet_v2") == 0) {
        cfg->arch = TG_ARCH_MOBILENET_V2;
        rc = parse_mobilenet_v2(&r, cfg);
    } else {
        rc = tg_fail(err,
                     "%s: field 'model_type': unsupported model type '%s' (supported: bert, roberta, gpt2, llama, "
                     "mobilenet_v2)",
                     path, type);
    }
    /* The encoders and GPT-2 attend with every head's own keys and values; GPT-2's LM
     * head reads its token embeddings. */
    if (!rc && cfg->arch != TG_ARCH_LLAMA && cfg->arch != TG_ARCH_MOBILENET_V2) {
        cfg->kv_heads = cfg->heads;
        cfg->tie_word_embeddings = cfg->arch == TG_ARCH_GPT2;
    }
    json_decref(root);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* "a, b, c": the preset folders that hold a config.json, sorted. */
static void list_presets(char *buf, size_t cap) {
    buf[0] = 0;
    const char *dir = tg_presets_dir();
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(buf, cap, "none: cannot open %s", dir);
        return;
    }
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s/config.json", dir, e->d_name);
        if (is_file(p) && (names[n] = tg_strdup(e->d_name))) n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", names[i]);
        free(names[i]);
    }
    if (n == 0) snprintf(buf, cap, "none in %s", dir);
}

/* What `path` holds: 0 nothing at all, 1 a regular file this process can read, else -1
 * with an error naming it: something is there (a dangling link, a folder, a FIFO, a file
 * without read permission) that the user meant as the file but that cannot be read. */
static int probe_file(const char *path, tg_err *err) {
    struct stat lsb, sb;
    if (lstat(path, &lsb) != 0) {
        if (errno == ENOENT) return 0;
        return tg_fail(err, "%s: cannot look at it: %s", path, strerror(errno));
    }
    if (stat(path, &sb) != 0)
        return tg_fail(err, "%s: a symbolic link to nothing readable: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) {
        const char *kind = S_ISDIR(sb.st_mode)    ? "a folder"
                           : S_ISFIFO(sb.st_mode) ? "a FIFO"
                           : S_ISSOCK(sb.st_mode) ? "a socket"
                           : S_ISCHR(sb.st_mode)  ? "a character device"
                                                  : "a block device"; /* stat follows links: no other type is left */
        return tg_fail(err, "%s: is %s, not a regular file", path, kind);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_fail(err, "%s: cannot be read: %s", path, strerror(errno));
    close(fd);
    return 1;
}

int tg_model_config_load(const char *source, tg_model_config *cfg, tg_err *err) {
    memset(cfg, 0, sizeof *cfg);
    if (!source || !source[0]) return tg_fail(err, "model: empty model name");
    if (strlen(source) >= TG_PATH_MAX) return tg_fail(err, "model '%.64s...': name too long", source);

    char folder[TG_PATH_MAX + 512], config[TG_PATH_MAX + 600];
    folder[0] = 0;
    int found = 0;
    if (!strchr(source, '/')) {
        snprintf(folder, sizeof folder, "%s/%s", tg_presets_dir(), source);
        snprintf(config, sizeof config, "%s/config.json", folder);
        if ((found = probe_file(config, err)) < 0) return tg_fail_context(err, "model '%s'", source);
        if (!found) folder[0] = 0;
    }
    if (!folder[0]) {
        snprintf(folder, sizeof folder, "%s", source);
        size_t n = strlen(folder);
        while (n > 1 && folder[n - 1] == '/') folder[--n] = 0; /* avoid "dir//config.json" */
        snprintf(config, sizeof config, "%s/config.json", folder);
        if ((found = probe_file(config, err)) < 0) return tg_fail_context(err, "model '%s'", source);
        if (!found) {
            char presets[700];
            list_presets(presets, sizeof presets);
            return tg_fail(err, "model '%s': no preset of that name and no folder %s/config.json (presets: %s)",
                           source, folder, presets);
        }
    }
    if (tg_model_config_parse(config, cfg, err) != 0) return -1;

    /* model.safetensors, else a sharded checkpoint's index (Hugging Face looks in that
     * order). Absent: random initial weights. Present but unreadable: an error, never a
     * silent random start. */
    char weights[TG_PATH_MAX + 600];
    int have_weights = 0;
    static const char *const weight_files[] = {TG_HF_CHECKPOINT_FILE, TG_HF_CHECKPOINT_INDEX_FILE};
    for (size_t i = 0; i < sizeof weight_files / sizeof weight_files[0] && !have_weights; i++) {
        snprintf(weights, sizeof weights, "%s/%s", folder, weight_files[i]);
        if (strlen(weights) >= TG_PATH_MAX) return tg_fail(err, "model '%s': path %s is too long", source, weights);
        have_weights = probe_file(weights, err);
        if (have_weights < 0) return tg_fail_context(err, "model '%s'", source);
    }
    snprintf(cfg->source, sizeof cfg->source, "%s", source);
    snprintf(cfg->weights, sizeof cfg->weights, "%s", have_weights ? weights : "");
    return 0;
}

/* An integer field of the config, -1 when absent, null, negative or not an integer. */
static int32_t id_field(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= INT32_MAX
               ? (int32_t)json_integer_value(v)
               : -1;
}

void tg_model_config_special_ids(const char *source, int32_t *bos, int32_t *eos) {
    *bos = *eos = -1;
    char path[TG_PATH_MAX + 600];
    snprintf(path, sizeof path, "%s/%s/config.json", tg_presets_dir(), source);
    if (strchr(source, '/') || !is_file(path)) {
        size_t n = strlen(source);
        while (n > 1 && source[n - 1] == '/') n--;
        snprintf(path, sizeof path, "%.*s/config.json", (int)n, source);
    }
    char *text;
    size_t len;
    tg_err ignored;
    if (read_config(path, &text, &len, &ignored)) return;
    json_error_t jerr;
    char dup[8];
    json_t *root = tg_json_loadb_strict(text, len, 0, &jerr, dup, sizeof dup);
    free(text);
    if (json_is_object(root)) *bos = id_field(root, "bos_token_id"), *eos = id_field(root, "eos_token_id");
    json_decref(root);
}
