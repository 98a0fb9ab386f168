#include "runtime/weights.h"
#include "runtime/lora_export.h"
#include "base/alloc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.h"
#include "base/bf16.h"
#include "models/hf_checkpoint.h"
#include "models/safetensors.h"
#include "runtime/cpu/threadpool.h"

/* Initialisation streams use a step value no training step reaches. */
#define TG_INIT_STREAM_STEP UINT64_C(0xFFFFFFFFFFFFFFFF)

int tg_weights_image_alloc(const tg_plan *plan, tg_weights_image *img, tg_err *err) {
    memset(img, 0, sizeof *img);
    img->plan = plan;
    img->fixed_offset = tg_malloc(sizeof *img->fixed_offset * ((size_t)plan->n_tensors + 1)); /* + 1: never 0 bytes */
    img->params = tg_calloc(1, plan->pool_bytes[TG_POOL_PARAMS] + 1);
    if (!img->fixed_offset || !img->params) {
        tg_weights_image_free(img);
        return tg_fail(err, "out of memory for the weights");
    }
    for (int t = 0; t < plan->n_tensors; t++) {
        const tg_tensor *x = &plan->tensors[t];
        img->fixed_offset[t] = UINT64_MAX;
        const int cls = tg_tensor_class_of(x);
        if (!tg_tensor_is_value(x) || cls == TG_CLASS_TRAINABLE) continue;
        img->fixed_offset[t] = img->fixed_bytes;
        img->fixed_bytes += (uint64_t)tg_tensor_numel(x) * 4; /* fp32 or int32 */
    }
    img->fixed = tg_calloc(1, img->fixed_bytes ? img->fixed_bytes : 1);
    if (!img->fixed) {
        tg_weights_image_free(img);
        return tg_fail(err, "out of memory for the weights");
    }
    return 0;
}

void tg_weights_image_free(tg_weights_image *img) {
    free(img->params);
    free(img->fixed);
    free(img->fixed_offset);
    memset(img, 0, sizeof *img);
}

void *tg_weights_value(const tg_weights_image *img, int t) {
    const tg_tensor *x = &img->plan->tensors[t];
    if (!tg_tensor_is_value(x)) return NULL;
    if (tg_tensor_class_of(x) == TG_CLASS_TRAINABLE) return img->params ? img->params + x->offset / sizeof(float) : NULL;
    return img->fixed + img->fixed_offset[t];
}

/* Padding index of the embedding that uses table t, or -1. */
static int padding_row_of(const tg_plan *plan, int t) {
    for (int o = plan->phase_begin[TG_PHASE_FORWARD]; o < plan->phase_begin[TG_PHASE_BACKWARD]; o++) {
        const tg_op *op = &plan->ops[o];
        if (op->kind == TG_OP_EMBEDDING && op->in[1] == t) return (int)op->p.embedding.padding_idx;
    }
    return -1;
}

typedef struct init_job {
    const tg_weights_image *img;
    uint64_t seed;
    int tensor;
    uint32_t stream; /* Philox stream key: a hash of the parameter's name */
} init_job;

/* FNV-1a of a parameter name: the initial values of a parameter depend on its name, not
 * on its position in the plan, so plans that differ only in how they compute (fused or
 * unfused attention, bias gradients, precision) start from the same weights. */
static uint32_t name_stream(const char *name) {
    uint32_t h = 2166136261u;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 16777619u;
    return h;
}

/* Random values for blocks [b, e) of 4 elements, one Philox call a block: normals of
 * std init_std (two Box-Muller pairs), or for TG_INIT_UNIFORM uniforms in
 * [-init_std, init_std). Element i depends only on (seed, name, i), not on the threading. */
static void init_random_range(void *arg, int64_t b, int64_t e) {
    const init_job *j = arg;
    const tg_tensor *x = &j->img->plan->tensors[j->tensor];
    float *p = tg_weights_value(j->img, j->tensor);
    const int64_t n = tg_tensor_numel(x);
    const int uniform = x->init == TG_INIT_UNIFORM;
    for (int64_t blk = b; blk < e; blk++) {
        float u[4];
        tg_philox_uniform4(j->seed, TG_INIT_STREAM_STEP, j->stream, (uint64_t)blk, u);
        for (int k = 0; k < 4; k += 2) {
            const int64_t i = 4 * blk + k;
            double v0, v1;
            if (uniform) {
                v0 = x->init_std * (2.0 * u[k] - 1.0), v1 = x->init_std * (2.0 * u[k + 1] - 1.0);
            } else {
                const double r = sqrt(-2.0 * log(1.0 - (double)u[k])), a = 6.283185307179586 * u[k + 1];
                v0 = x->init_std * r * cos(a), v1 = x->init_std * r * sin(a);
            }
            if (i < n) p[i] = (float)v0;
            if (i + 1 < n) p[i + 1] = (float)v1;
        }
    }
}

/* The length arange counts along: the last dimension (a scalar counts one). A tensor with
 * a last dimension of 0 has no elements to fill. */
static int64_t arange_row(const tg_tensor *x) { return x->ndim ? x->shape[x->ndim - 1] : 1; }

void tg_weights_init(tg_weights_image *img, uint64_t seed) {
    const tg_plan *plan = img->plan;
    tg_threadpool *threads = tg_threadpool_create(0); /* NULL: runs inline */
    for (int t = 0; t < plan->n_tensors; t++) {
        const tg_tensor *x = &plan->tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        int64_t n = tg_tensor_numel(x);
        if (x->dtype == TG_I32) {
            int32_t *v = tg_weights_value(img, t);
            const int64_t row = arange_row(x);
            for (int64_t i = 0; i < n; i++)
                v[i] = x->init == TG_INIT_ARANGE ? (int32_t)(i % row) : x->init == TG_INIT_ONES ? 1 : 0;
            continue;
        }
        float *p = tg_weights_value(img, t);
        if (x->init == TG_INIT_NORMAL || x->init == TG_INIT_UNIFORM) {
            init_job j = {img, seed, t, name_stream(x->name)};
            tg_parallel_for(threads, (n + 3) / 4, init_random_range, &j);
        } else if (x->init == TG_INIT_ARANGE) {
            const int64_t row = arange_row(x);
            for (int64_t i = 0; i < n; i++) p[i] = (float)(i % row);
        } else {
            float v = x->init == TG_INIT_ONES ? 1.0f : 0.0f;
            for (int64_t i = 0; i < n; i++) p[i] = v;
        }
        int pad = padding_row_of(plan, t);
        if (pad >= 0 && x->ndim == 2 && pad < x->shape[0]) memset(p + pad * x->shape[1], 0, sizeof(float) * x->shape[1]);
    }
    tg_threadpool_destroy(threads);
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* Candidate names of a parameter in HF checkpoints. */
static int name_candidates(const char *name, char out[6][TG_NAME_MAX]) {
    int n = 0;
    char bases[2][TG_NAME_MAX];
    int nb = 0;
    snprintf(bases[nb++], TG_NAME_MAX, "%s", name);
    static const char *const prefixes[] = {"bert.", "roberta.", "transformer.", "model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i])))
            snprintf(bases[nb++], TG_NAME_MAX, "%s", name + strlen(prefixes[i]));
    for (int b = 0; b < nb; b++) {
        snprintf(out[n++], TG_NAME_MAX, "%s", bases[b]);
        size_t len = strlen(bases[b]);
        /* Older BERT checkpoints name LayerNorm parameters gamma and beta. */
        if (strstr(bases[b], "LayerNorm.")) {
            if (ends_with(bases[b], ".weight"))
                snprintf(out[n++], TG_NAME_MAX, "%.*s.gamma", (int)(len - 7), bases[b]);
            else if (ends_with(bases[b], ".bias"))
                snprintf(out[n++], TG_NAME_MAX, "%.*s.beta", (int)(len - 5), bases[b]);
        }
    }
    return n;
}

static void shape_text(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

void tg_weights_report_free(tg_weights_report *r) {
    for (int i = 0; r->missing_names && i < r->missing; i++) free(r->missing_names[i]);
    for (int i = 0; r->unexpected_names && i < r->unexpected; i++) free(r->unexpected_names[i]);
    free(r->missing_names);
    free(r->unexpected_names);
    r->missing_names = r->unexpected_names = NULL;
}

/* Appends a copy of name to the list of *n names (grown in powers of two). */
static int push_name(char ***list, int *n, const char *name) {
    if ((*n & (*n - 1)) == 0) { /* 0, 1, 2, 4, ...: full */
        char **grown = tg_realloc(*list, sizeof **list * (size_t)(*n ? 2 * *n : 1));
        if (!grown) return -1;
        *list = grown;
    }
    if (!((*list)[*n] = tg_strdup(name))) return -1;
    (*n)++;
    return 0;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Checkpoint tensors HF drops without reporting them as unexpected: position_ids of
 * models that have such a buffer (it became non-persistent), and GPT-2's causal-mask
 * buffers (GPT2PreTrainedModel._keys_to_ignore_on_load_unexpected); for torchvision's
 * mobilenet_v2, the batch normalisations' num_batches_tracked. */
static int hf_ignores(const tg_plan *plan, const char *name) {
    if (!strcmp(name, "position_ids") || ends_with(name, ".position_ids"))
        for (int t = 0; t < plan->n_tensors; t++)
            if ((plan->tensors[t].flags & TG_TENSOR_BUFFER) && ends_with(plan->tensors[t].name, "position_ids"))
                return 1;
    /* torchvision's BatchNorm2d count of batches seen (int64), which only a normalisation
     * without a momentum reads; the plan's have one (tg_model_config.batch_norm_momentum). */
    if (plan->model.arch == TG_ARCH_MOBILENET_V2) return ends_with(name, ".num_batches_tracked");
    if (plan->model.arch == TG_ARCH_GPT2)
        return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias") ||
               ends_with(name, ".crossattention.bias") || ends_with(name, ".crossattention.masked_bias");
    return 0;
}

/* The masked-LM heads' decoder bias is tied to the head's bias (HF _tied_weights_keys), so
 * a checkpoint may hold it under either name, or both. */
static const char *tied_bias_alias(const char *name) {
    if (!strcmp(name, "cls.predictions.bias")) return "cls.predictions.decoder.bias";
    if (!strcmp(name, "lm_head.bias")) return "lm_head.decoder.bias";
    return NULL;
}

/* The checkpoint tensor a value tensor loads from (its candidate names in order), or NULL. */
static const tg_hf_checkpoint_tensor *find_tensor(const tg_hf_checkpoint *ck, const tg_tensor *x) {
    char names[6][TG_NAME_MAX];
    int n = name_candidates(x->name, names);
    const tg_hf_checkpoint_tensor *e = NULL;
    for (int i = 0; i < n && !e; i++) e = tg_hf_checkpoint_find(ck, names[i]);
    const char *alias = tied_bias_alias(x->name);
    if (!e && alias) e = tg_hf_checkpoint_find(ck, alias);
    return e;
}

/* Loads value tensor x (index t) from checkpoint tensor e. */
static int load_tensor(tg_weights_image *img, int t, const tg_hf_checkpoint *ck, const tg_hf_checkpoint_tensor *e,
                       tg_err *err) {
    const tg_tensor *x = &img->plan->tensors[t];
    const tg_safetensors *file = tg_hf_checkpoint_file(ck, e);
    const tg_st_entry *st = e->entry;
    int same = st->ndim == x->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = st->shape[d] == x->shape[d];
    if (!same) {
        char want[96], got[96];
        shape_text(want, sizeof want, x->ndim, x->shape);
        shape_text(got, sizeof got, st->ndim, st->shape);
        return tg_fail(err, "%s: tensor '%s' has shape %s but the model config needs %s for %s%s", file->path,
                       st->name, got, want, x->name,
                       strstr(x->name, "word_embeddings") || strstr(x->name, "wte") ? " (wrong vocabulary size?)" : "");
    }
    void *dst = tg_weights_value(img, t);
    return x->dtype == TG_I32 ? tg_st_read_i32(file, st, dst, tg_tensor_numel(x), err)
                              : tg_st_read_f32_finite(file, st, dst, tg_tensor_numel(x), err);
}

int tg_weights_load(tg_weights_image *img, const char *path, tg_weights_report *report, tg_err *err) {
    const tg_plan *plan = img->plan;
    memset(report, 0, sizeof *report);
    tg_hf_checkpoint ck;
    if (tg_hf_checkpoint_open(path, &ck, err)) return -1;
    report->files = ck.n_files;
    uint8_t *used = tg_calloc((size_t)ck.n + 1, 1); /* per checkpoint tensor */
    int rc = used ? 0 : tg_fail(err, "%s: out of memory", path), params = 0;
    for (int t = 0; t < plan->n_tensors && !rc; t++) {
        const tg_tensor *x = &plan->tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        const int cls = tg_tensor_class_of(x);
        params += cls != TG_CLASS_BUFFER;
        const tg_hf_checkpoint_tensor *e = find_tensor(&ck, x);
        if (e) used[e - ck.tensors] = 1;
        if (x->flags & TG_TENSOR_TIED) { /* GPT2LMHeadModel's lm_head.weight, the MLM decoders: this table */
            static const char *const decoders[] = {"lm_head.weight", "cls.predictions.decoder.weight",
                                                   "lm_head.decoder.weight"};
            for (size_t k = 0; k < sizeof decoders / sizeof decoders[0]; k++) {
                const tg_hf_checkpoint_tensor *head = tg_hf_checkpoint_find(&ck, decoders[k]);
                if (head) used[head - ck.tensors] = 1;
            }
        }
        const char *alias = tied_bias_alias(x->name);
        const tg_hf_checkpoint_tensor *tied = alias ? tg_hf_checkpoint_find(&ck, alias) : NULL;
        if (tied) used[tied - ck.tensors] = 1;
        if (cls == TG_CLASS_BUFFER && !(x->flags & TG_TENSOR_PERSISTENT)) {
            /* HF ignores a non-persistent buffer in a checkpoint (and expects none) */
            report->ignored += e != NULL;
            continue;
        }
        if (!e) {
            if (!report->missing) snprintf(report->first_missing, TG_NAME_MAX, "%s", x->name);
            if (push_name(&report->missing_names, &report->missing, x->name)) rc = tg_fail(err, "out of memory listing missing weights");
            continue;
        }
        if (load_tensor(img, t, &ck, e, err)) {
            rc = -1;
            break;
        }
        report->loaded++;
        report->trainable += cls == TG_CLASS_TRAINABLE;
        report->frozen += cls == TG_CLASS_FROZEN;
        report->buffers += cls == TG_CLASS_BUFFER;
    }
    for (int k = 0; k < ck.n && !rc; k++) {
        if (used[k]) continue;
        const char *name = ck.tensors[k].entry->name;
        if (hf_ignores(plan, name)) report->ignored++;
        else if (push_name(&report->unexpected_names, &report->unexpected, name)) rc = tg_fail(err, "out of memory listing unexpected weights");
    }
    if (!rc && report->missing > 1) qsort(report->missing_names, (size_t)report->missing, sizeof(char *), cmp_name);
    if (!rc && report->unexpected > 1)
        qsort(report->unexpected_names, (size_t)report->unexpected, sizeof(char *), cmp_name);
    /* Buffers alone (position_ids) do not make a checkpoint of this model. */
    if (!rc && report->trainable + report->frozen == 0)
        rc = tg_fail(err, "%s: holds none of the model's %d parameters (first: %s); is it a checkpoint of this model?",
                     path, params, report->first_missing);
    free(used);
    tg_hf_checkpoint_close(&ck);
    return rc;
}

/* Text grown as it is appended to; after a failed allocation every append does nothing
 * and `failed` says so. */
typedef struct text_buf {
    char *s;
    size_t len, cap;
    int failed;
} text_buf;

static void append(text_buf *b, const char *s) {
    if (b->failed) return;
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        size_t want = (b->len + n + 1) * 2;
        char *grown = tg_realloc(b->s, want);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->s = grown, b->cap = want;
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

/* "['a', 'b']": Python's repr of a list of plain strings. */
static void append_list(text_buf *b, char *const *names, int n) {
    append(b, "[");
    for (int i = 0; i < n; i++) {
        append(b, i ? ", '" : "'");
        append(b, names[i]);
        append(b, "'");
    }
    append(b, "]");
}

char *tg_weights_report_text(const tg_weights_report *r, const char *model_class, const char *checkpoint) {
    text_buf b = {tg_malloc(256), 0, 256, 0};
    if (!b.s) return NULL;
    b.s[0] = 0;
    if (r->unexpected) {
        append(&b, "Some weights of the model checkpoint at ");
        append(&b, checkpoint);
        append(&b, " were not used when initializing ");
        append(&b, model_class);
        append(&b, ": ");
        append_list(&b, r->unexpected_names, r->unexpected);
        append(&b, "\n");
    }
    if (r->missing) {
        append(&b, "Some weights of ");
        append(&b, model_class);
        append(&b, " were not initialized from the model checkpoint at ");
        append(&b, checkpoint);
        append(&b, " and are newly initialized: ");
        append_list(&b, r->missing_names, r->missing);
        append(&b, "\n");
    }
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

int tg_weights_save(const tg_weights_image *img, const char *path, tg_err *err) {
    const tg_plan *plan = img->plan;
    tg_st_item *items = tg_calloc((size_t)plan->n_tensors + 1, sizeof *items);
    if (!items) return tg_fail(err, "%s: out of memory", path);
    int n = 0;
    for (int t = 0; t < plan->n_tensors; t++) {
        const tg_tensor *x = &plan->tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        /* HF saves parameters and persistent buffers, never the others. */
        if (tg_tensor_class_of(x) == TG_CLASS_BUFFER && !(x->flags & TG_TENSOR_PERSISTENT)) continue;
        items[n++] = (tg_st_item){x->name, x->dtype == TG_I32 ? TG_ST_I32 : TG_ST_F32, x->ndim, x->shape,
                                  tg_weights_value(img, t)};
    }
    int rc = tg_st_write(path, items, n, err);
    free(items);
    return rc;
}

/* The LoRA pair whose base weight is tensor t, or NULL; *adapter: t is a pair's A or B. */
static const tg_lora_pair *pair_of(const tg_lora_pair *pairs, int n, int t, int *adapter) {
    *adapter = 0;
    for (int k = 0; k < n; k++) {
        if (pairs[k].base == t) return &pairs[k];
        if (pairs[k].a == t || pairs[k].b == t) *adapter = 1;
    }
    return NULL;
}

int tg_weights_save_hf(const tg_weights_image *img, const char *path, int bf16, tg_err *err) {
    const tg_plan *plan = img->plan;
    tg_st_item *items = tg_calloc((size_t)plan->n_tensors + 1, sizeof *items);
    void **converted = tg_calloc((size_t)plan->n_tensors + 1, sizeof *converted);
    int rc = items && converted ? 0 : tg_fail(err, "%s: out of memory", path), n = 0;
    /* LoRA: the adapters merged into their base weights, and left out themselves. */
    tg_lora_pair *pairs = NULL;
    const int n_pairs = rc ? 0 : tg_lora_pairs(plan, &pairs, err);
    if (n_pairs < 0) rc = -1;
    for (int t = 0; t < plan->n_tensors && !rc; t++) {
        const tg_tensor *x = &plan->tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        if (tg_tensor_class_of(x) == TG_CLASS_BUFFER && !(x->flags & TG_TENSOR_PERSISTENT)) continue;
        int adapter;
        const tg_lora_pair *pair = pair_of(pairs, n_pairs, t, &adapter);
        if (adapter) continue;
        const int64_t numel = tg_tensor_numel(x);
        const void *values = tg_weights_value(img, t);
        if (pair) {
            float *merged = tg_lora_merged(img, pair);
            if (!merged) {
                rc = tg_fail(err, "%s: out of memory", path);
                break;
            }
            values = converted[n] = merged;
        }
        int dtype = TG_ST_F32;
        if (x->dtype == TG_I32) { /* PyTorch's index buffers are int64 */
            int64_t *wide = tg_malloc(sizeof *wide * ((size_t)numel + 1)); /* + 1: never 0 bytes */
            if (!wide) {
                rc = tg_fail(err, "%s: out of memory", path);
                break;
            }
            for (int64_t i = 0; i < numel; i++) wide[i] = ((const int32_t *)values)[i];
            values = converted[n] = wide, dtype = TG_ST_I64;
        } else if (bf16) {
            uint16_t *low = tg_malloc(sizeof *low * ((size_t)numel + 1));
            if (!low) {
                rc = tg_fail(err, "%s: out of memory", path);
                break;
            }
            tg_bf16_narrow(low, values, numel);
            free(converted[n]); /* a merged weight, narrowed */
            values = converted[n] = low, dtype = TG_ST_BF16;
        }
        items[n++] = (tg_st_item){x->name, dtype, x->ndim, x->shape, values};
    }
    static const char *const metadata[] = {"format", "pt"};
    if (!rc) rc = tg_st_write_with_metadata(path, items, n, metadata, 1, err);
    for (int i = 0; converted && i <= n; i++) free(converted[i]);
    free(converted);
    free(items);
    free(pairs);
    return rc ? -1 : 0;
}
