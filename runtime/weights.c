#include "runtime/weights.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/philox.h"
#include "models/safetensors.h"
#include "runtime/cpu/threadpool.h"

/* Initialisation streams use a step value no training step reaches. */
#define TG_INIT_STREAM_STEP UINT64_C(0xFFFFFFFFFFFFFFFF)

int tg_weights_image_alloc(const tg_plan *plan, tg_weights_image *img, tg_err *err) {
    memset(img, 0, sizeof *img);
    img->plan = plan;
    img->fixed_offset = malloc(sizeof *img->fixed_offset * (size_t)(plan->n_tensors ? plan->n_tensors : 1));
    img->params = calloc(1, plan->pool_bytes[TG_POOL_PARAMS] ? plan->pool_bytes[TG_POOL_PARAMS] : 1);
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
    img->fixed = calloc(1, img->fixed_bytes ? img->fixed_bytes : 1);
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

/* Normals for blocks [b, e) of 4 elements: one Philox call gives 4 uniforms, two
 * Box-Muller pairs. Element i depends only on (seed, name, i), not on the threading. */
static void init_normal_range(void *arg, int64_t b, int64_t e) {
    const init_job *j = arg;
    const tg_tensor *x = &j->img->plan->tensors[j->tensor];
    float *p = tg_weights_value(j->img, j->tensor);
    int64_t n = tg_tensor_numel(x);
    for (int64_t blk = b; blk < e; blk++) {
        float u[4];
        tg_philox_uniform4(j->seed, TG_INIT_STREAM_STEP, j->stream, (uint64_t)blk, u);
        for (int k = 0; k < 4; k += 2) {
            double r = sqrt(-2.0 * log(1.0 - (double)u[k])), a = 6.283185307179586 * u[k + 1];
            int64_t i = 4 * blk + k;
            if (i < n) p[i] = (float)(x->init_std * r * cos(a));
            if (i + 1 < n) p[i + 1] = (float)(x->init_std * r * sin(a));
        }
    }
}

void tg_weights_init(tg_weights_image *img, uint64_t seed) {
    const tg_plan *plan = img->plan;
    tg_threadpool *threads = tg_threadpool_create(0); /* NULL: runs inline */
    for (int t = 0; t < plan->n_tensors; t++) {
        const tg_tensor *x = &plan->tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        int64_t n = tg_tensor_numel(x);
        if (x->dtype == TG_I32) {
            int32_t *v = tg_weights_value(img, t);
            const int64_t row = x->ndim > 0 && x->shape[x->ndim - 1] > 0 ? x->shape[x->ndim - 1] : 1;
            for (int64_t i = 0; i < n; i++)
                v[i] = x->init == TG_INIT_ARANGE ? (int32_t)(i % row) : x->init == TG_INIT_ONES ? 1 : 0;
            continue;
        }
        float *p = tg_weights_value(img, t);
        if (x->init == TG_INIT_NORMAL) {
            init_job j = {img, seed, t, name_stream(x->name)};
            tg_parallel_for(threads, (n + 3) / 4, init_normal_range, &j);
        } else if (x->init == TG_INIT_ARANGE) {
            const int64_t row = x->ndim > 0 && x->shape[x->ndim - 1] > 0 ? x->shape[x->ndim - 1] : 1;
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

/* Candidate names of a parameter in HF checkpoints. */
static int name_candidates(const char *name, char out[6][TG_NAME_MAX]) {
    int n = 0;
    char bases[2][TG_NAME_MAX];
    int nb = 0;
    snprintf(bases[nb++], TG_NAME_MAX, "%s", name);
    static const char *const prefixes[] = {"bert.", "roberta.", "transformer."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i])))
            snprintf(bases[nb++], TG_NAME_MAX, "%s", name + strlen(prefixes[i]));
    for (int b = 0; b < nb; b++) {
        snprintf(out[n++], TG_NAME_MAX, "%s", bases[b]);
        size_t len = strlen(bases[b]);
        /* Older BERT checkpoints name LayerNorm parameters gamma and beta. */
        if (strstr(bases[b], "LayerNorm.")) {
            if (len > 7 && !strcmp(bases[b] + len - 7, ".weight"))
                snprintf(out[n++], TG_NAME_MAX, "%.*s.gamma", (int)(len - 7), bases[b]);
            else if (len > 5 && !strcmp(bases[b] + len - 5, ".bias"))
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

int tg_weights_load(tg_weights_image *img, const char *path, tg_weights_report *report, tg_err *err) {
    const tg_plan *plan = img->plan;
    memset(report, 0, sizeof *report);
    tg_safetensors st;
    if (tg_st_open(path, &st, err)) return -1;
    int rc = 0, params = 0;
    for (int t = 0; t < plan->n_tensors && !rc; t++) {
        const tg_tensor *x = &plan->tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        const int cls = tg_tensor_class_of(x);
        const int skip = cls == TG_CLASS_BUFFER && !(x->flags & TG_TENSOR_PERSISTENT);
        params += cls != TG_CLASS_BUFFER;
        char names[6][TG_NAME_MAX];
        int n = name_candidates(x->name, names);
        const tg_st_entry *e = NULL;
        for (int i = 0; i < n && !e; i++) e = tg_st_find(&st, names[i]);
        if (skip) { /* HF ignores a non-persistent buffer in a checkpoint (and expects none) */
            report->ignored += e != NULL;
            continue;
        }
        if (!e) {
            if (!report->missing++) snprintf(report->first_missing, TG_NAME_MAX, "%s", x->name);
            continue;
        }
        int same = e->ndim == x->ndim;
        for (int d = 0; same && d < x->ndim; d++) same = e->shape[d] == x->shape[d];
        if (!same) {
            char want[96], got[96];
            shape_text(want, sizeof want, x->ndim, x->shape);
            shape_text(got, sizeof got, e->ndim, e->shape);
            rc = tg_fail(err, "%s: tensor '%s' has shape %s but the model config needs %s for %s%s", path, e->name,
                         got, want, x->name,
                         strstr(x->name, "word_embeddings") || strstr(x->name, "wte") ? " (wrong vocabulary size?)"
                                                                                       : "");
            break;
        }
        void *dst = tg_weights_value(img, t);
        if (x->dtype == TG_I32 ? tg_st_read_i32(&st, e, dst, tg_tensor_numel(x), err)
                               : tg_st_read_f32_finite(&st, e, dst, tg_tensor_numel(x), err)) {
            rc = -1;
            break;
        }
        report->loaded++;
        report->trainable += cls == TG_CLASS_TRAINABLE;
        report->frozen += cls == TG_CLASS_FROZEN;
        report->buffers += cls == TG_CLASS_BUFFER;
    }
    /* Buffers alone (position_ids) do not make a checkpoint of this model. */
    if (!rc && report->trainable + report->frozen == 0)
        rc = tg_fail(err, "%s: holds none of the model's %d parameters (first: %s); is it a checkpoint of this model?",
                     path, params, report->first_missing);
    tg_st_close(&st);
    return rc;
}

int tg_weights_save(const tg_weights_image *img, const char *path, tg_err *err) {
    const tg_plan *plan = img->plan;
    tg_st_item *items = calloc((size_t)plan->n_tensors + 1, sizeof *items);
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
