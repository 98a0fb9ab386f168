/* The plan file: 40-byte header + zstd payload. The payload is written field by field,
 * little-endian, so struct padding never reaches the file and every compiler produces
 * the same bytes for the same plan. */
#include "plan/plan_file.h"

#include "base/atomic_file.h"
#include "plan/op_meta.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header-only xxHash: no shared library needed where plans are run. */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

static const uint8_t k_magic[8] = {'T', 'G', 'P', 'L', 'A', 'N', 0, 0};
#define HEADER_BYTES 40
#define ZSTD_LEVEL 3
/* Far above any real model; keeps a hostile count from driving a huge malloc. */
#define MAX_COUNT (1 << 24)

/* A field added to plan.h must be added to the put_/get_ functions below (and
 * TG_PLAN_VERSION bumped); these trip on LP64 when a struct changes size. */
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(tg_tensor) == 192, "tg_tensor changed: update put_tensor/get_tensor");
_Static_assert(sizeof(tg_op) == 136, "tg_op changed: update put_op/get_op");
_Static_assert(sizeof(tg_model_config) == 1088, "tg_model_config changed: update put_model");
_Static_assert(sizeof(tg_plan_train) == 40, "tg_plan_train changed: update put_train/get_train");
_Static_assert(sizeof(tg_plan_run) == 1048, "tg_plan_run changed: update put_run/get_run");
_Static_assert(sizeof(tg_plan) == 2904, "tg_plan changed: update tg_plan_encode/decode");
#endif

/* ---- encoding ---------------------------------------------------------------- */

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    int oom;
} wbuf;

static void put_bytes(wbuf *b, const void *src, size_t n) {
    if (b->oom) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u32(wbuf *b, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    put_bytes(b, x, 4);
}

static void put_u64(wbuf *b, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    put_bytes(b, x, 8);
}

static void put_i32(wbuf *b, int32_t v) { put_u32(b, (uint32_t)v); }
static void put_i64(wbuf *b, int64_t v) { put_u64(b, (uint64_t)v); }

static void put_f32(wbuf *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(b, u);
}

static void put_f64(wbuf *b, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    put_u64(b, u);
}

/* A fixed char field as length + bytes; a field without a NUL is written at full size
 * and refused by the decoder, so the encoder stays total. */
static void put_str(wbuf *b, const char *s, size_t field) {
    size_t n = strnlen(s, field);
    put_u32(b, (uint32_t)n);
    put_bytes(b, s, n);
}

static void put_model(wbuf *b, const tg_model_config *m) {
    put_str(b, m->source, sizeof m->source);
    put_str(b, m->weights, sizeof m->weights);
    put_i32(b, m->arch);
    put_i32(b, m->vocab_size);
    put_i32(b, m->hidden);
    put_i32(b, m->layers);
    put_i32(b, m->heads);
    put_i32(b, m->intermediate);
    put_i32(b, m->max_positions);
    put_i32(b, m->type_vocab_size);
    put_i32(b, m->pad_token_id);
    put_i32(b, m->gelu);
    put_f32(b, m->layer_norm_eps);
    put_f32(b, m->initializer_range);
    put_f32(b, m->hidden_dropout);
    put_f32(b, m->attention_dropout);
    put_f32(b, m->embedding_dropout);
    put_f32(b, m->classifier_dropout);
}

static void put_train(wbuf *b, const tg_plan_train *t) {
    put_i32(b, t->task);
    put_i32(b, t->batch);
    put_i32(b, t->seq);
    put_i32(b, t->num_labels);
    put_i32(b, t->pad_id);
    put_i32(b, t->precision);
    put_i32(b, t->allow_tf32);
    put_i32(b, t->replicas);
    put_i32(b, t->zero_stage);
    put_i32(b, t->attention);
}

static void put_run(wbuf *b, const tg_plan_run *r) {
    put_str(b, r->train_data, sizeof r->train_data);
    put_str(b, r->eval_data, sizeof r->eval_data);
    put_i32(b, r->steps);
    put_i32(b, r->epochs);
    put_i32(b, r->log_every);
    put_u64(b, r->seed);
}

static void put_tensor(wbuf *b, const tg_tensor *t) {
    put_str(b, t->name, sizeof t->name);
    put_i32(b, t->dtype);
    put_i32(b, t->pool);
    put_i32(b, t->ndim);
    put_i32(b, t->flags);
    for (int d = 0; d < TG_MAX_DIMS; d++) put_i64(b, t->shape[d]);
    put_u64(b, t->offset);
    put_u64(b, t->bytes);
    put_i32(b, t->first_use);
    put_i32(b, t->last_use);
    put_i32(b, t->grad);
    put_i32(b, t->init);
    put_f32(b, t->init_std);
    put_i32(b, t->master);
    put_i32(b, t->group);
}
/* Encoded sizes, used to bound counts against the payload before allocating. */
#define TENSOR_MIN_BYTES (4 + 4 * 4 + 8 * TG_MAX_DIMS + 8 + 8 + 4 * 4 + 4 + 4 + 4)
/* An op without parameters; each parameter adds 8 (int) or 4 (float) bytes. */
#define OP_MIN_BYTES (4 + 4 + 4 * TG_OP_MAX_IN + 4 * TG_OP_MAX_OUT)

/* An op's parameters are the fields of its kind's set, in plan/ops.def order. */
static void put_param_i64(void *b, const char *display, int64_t *value) { put_i64(b, *value); }
static void put_param_f32(void *b, const char *display, float *value) { put_f32(b, *value); }

static void put_op(wbuf *b, const tg_op *op) {
    put_i32(b, op->kind);
    put_i32(b, op->phase);
    for (int k = 0; k < TG_OP_MAX_IN; k++) put_i32(b, op->in[k]);
    for (int k = 0; k < TG_OP_MAX_OUT; k++) put_i32(b, op->out[k]);
    tg_op_params params = op->p;
    tg_op_params_visit(op->kind, &params, &(const tg_param_visitor){b, put_param_i64, put_param_f32});
}

static void put_io(wbuf *b, const tg_plan_io *io) {
    const int32_t v[] = {io->input_ids, io->attention_mask, io->token_type_ids,
                         io->position_ids, io->labels, io->logits, io->loss, io->step,
                         io->total_steps, io->lr, io->grad_norm, io->params_all,
                         io->grads_all, io->m_all, io->v_all, io->params_bf16_all};
    _Static_assert(sizeof v == sizeof(tg_plan_io), "put_io must list every io field");
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) put_i32(b, v[k]);
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int tg_plan_encode(const tg_plan *plan, uint8_t **out, size_t *out_len, tg_err *err) {
    *out = NULL;
    *out_len = 0;
    if (plan->n_tensors < 0 || plan->n_ops < 0 || (plan->n_tensors && !plan->tensors) ||
        (plan->n_ops && !plan->ops))
        return tg_fail(err, "plan encode: bad table (n_tensors %d, n_ops %d)",
                       plan->n_tensors, plan->n_ops);
    wbuf b = {0};
    put_model(&b, &plan->model);
    put_str(&b, plan->job_path, sizeof plan->job_path);
    put_train(&b, &plan->train);
    put_run(&b, &plan->run);
    put_i32(&b, plan->n_tensors);
    for (int t = 0; t < plan->n_tensors; t++) put_tensor(&b, &plan->tensors[t]);
    put_i32(&b, plan->n_ops);
    for (int o = 0; o < plan->n_ops; o++) put_op(&b, &plan->ops[o]);
    for (int p = 0; p <= TG_PHASE_COUNT; p++) put_i32(&b, plan->phase_begin[p]);
    for (int p = 0; p < TG_POOL_COUNT; p++) put_u64(&b, plan->pool_bytes[p]);
    put_u64(&b, plan->peak_bytes);
    put_u64(&b, plan->activation_live_peak);
    put_f64(&b, plan->flops_per_step);
    put_f64(&b, plan->bytes_per_step);
    put_io(&b, &plan->io);
    put_u64(&b, plan->fingerprint);
    if (b.oom) {
        free(b.p);
        return tg_fail(err, "plan encode: out of memory");
    }

    size_t bound = ZSTD_compressBound(b.len);
    uint8_t *file = malloc(HEADER_BYTES + bound);
    if (!file) {
        free(b.p);
        return tg_fail(err, "plan encode: out of memory");
    }
    size_t csize = ZSTD_compress(file + HEADER_BYTES, bound, b.p, b.len, ZSTD_LEVEL);
    if (ZSTD_isError(csize)) {
        free(b.p);
        free(file);
        return tg_fail(err, "plan encode: zstd: %s", ZSTD_getErrorName(csize));
    }
    memcpy(file, k_magic, 8);
    put_le32(file + 8, TG_PLAN_VERSION);
    put_le32(file + 12, 0);
    put_le64(file + 16, b.len);
    put_le64(file + 24, csize);
    put_le64(file + 32, XXH64(file + HEADER_BYTES, csize, 0));
    free(b.p);
    *out = file;
    *out_len = HEADER_BYTES + csize;
    return 0;
}

/* ---- decoding ---------------------------------------------------------------- */

typedef struct rbuf {
    const uint8_t *p;
    size_t len, pos;
    const char *section; /* what is being read, for the message */
    const char *failed;  /* the section of the first short read */
} rbuf;

static int take(rbuf *r, size_t n) {
    if (r->failed) return 0;
    if (n > r->len - r->pos) {
        r->failed = r->section;
        return 0;
    }
    return 1;
}

static uint32_t get_u32(rbuf *r) {
    if (!take(r, 4)) return 0;
    uint32_t v = get_le32(r->p + r->pos);
    r->pos += 4;
    return v;
}
static uint64_t get_u64(rbuf *r) {
    if (!take(r, 8)) return 0;
    uint64_t v = get_le64(r->p + r->pos);
    r->pos += 8;
    return v;
}
static int32_t get_i32(rbuf *r) { return (int32_t)get_u32(r); }
static int64_t get_i64(rbuf *r) { return (int64_t)get_u64(r); }
static float get_f32(rbuf *r) {
    uint32_t u = get_u32(r);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double get_f64(rbuf *r) {
    uint64_t u = get_u64(r);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* Returns 0, or -1 (with the message) when the string does not fit its field with
 * its NUL. */
static int get_str(rbuf *r, char *dst, size_t field, const char *what, const char *name,
                   tg_err *err) {
    memset(dst, 0, field);
    uint32_t n = get_u32(r);
    if (r->failed) return 0; /* reported by the caller as a truncation */
    if (n >= field)
        return tg_fail(err, "%s: %s is %u bytes, its field holds at most %zu (file corrupt)",
                       name, what, n, field - 1);
    if (!take(r, n)) return 0;
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    if (memchr(dst, 0, n))
        return tg_fail(err, "%s: %s contains a NUL byte (file corrupt)", name, what);
    return 0;
}

static int get_model(rbuf *r, tg_model_config *m, const char *name, tg_err *err) {
    r->section = "model config";
    if (get_str(r, m->source, sizeof m->source, "model source", name, err) ||
        get_str(r, m->weights, sizeof m->weights, "model weights path", name, err))
        return -1;
    m->arch = get_i32(r);
    m->vocab_size = get_i32(r);
    m->hidden = get_i32(r);
    m->layers = get_i32(r);
    m->heads = get_i32(r);
    m->intermediate = get_i32(r);
    m->max_positions = get_i32(r);
    m->type_vocab_size = get_i32(r);
    m->pad_token_id = get_i32(r);
    m->gelu = get_i32(r);
    m->layer_norm_eps = get_f32(r);
    m->initializer_range = get_f32(r);
    m->hidden_dropout = get_f32(r);
    m->attention_dropout = get_f32(r);
    m->embedding_dropout = get_f32(r);
    m->classifier_dropout = get_f32(r);
    return 0;
}

static void get_train(rbuf *r, tg_plan_train *t) {
    r->section = "train settings";
    t->task = get_i32(r);
    t->batch = get_i32(r);
    t->seq = get_i32(r);
    t->num_labels = get_i32(r);
    t->pad_id = get_i32(r);
    t->precision = get_i32(r);
    t->allow_tf32 = get_i32(r);
    t->replicas = get_i32(r);
    t->zero_stage = get_i32(r);
    t->attention = get_i32(r);
}

static int get_run(rbuf *r, tg_plan_run *run, const char *name, tg_err *err) {
    r->section = "run settings";
    if (get_str(r, run->train_data, sizeof run->train_data, "run train_data", name, err) ||
        get_str(r, run->eval_data, sizeof run->eval_data, "run eval_data", name, err))
        return -1;
    run->steps = get_i32(r);
    run->epochs = get_i32(r);
    run->log_every = get_i32(r);
    run->seed = get_u64(r);
    return 0;
}

static int get_tensor(rbuf *r, tg_tensor *t, int index, const char *name, tg_err *err) {
    char what[48];
    snprintf(what, sizeof what, "tensor %d name", index);
    if (get_str(r, t->name, sizeof t->name, what, name, err)) return -1;
    t->dtype = get_i32(r);
    t->pool = get_i32(r);
    t->ndim = get_i32(r);
    t->flags = get_i32(r);
    for (int d = 0; d < TG_MAX_DIMS; d++) t->shape[d] = get_i64(r);
    t->offset = get_u64(r);
    t->bytes = get_u64(r);
    t->first_use = get_i32(r);
    t->last_use = get_i32(r);
    t->grad = get_i32(r);
    t->init = get_i32(r);
    t->init_std = get_f32(r);
    t->master = get_i32(r);
    t->group = get_i32(r);
    return 0;
}

static void get_param_i64(void *r, const char *display, int64_t *value) { *value = get_i64(r); }
static void get_param_f32(void *r, const char *display, float *value) { *value = get_f32(r); }

/* -1 for a kind outside the enum, whose parameters cannot be known (nor the rest read). */
static int get_op(rbuf *r, tg_op *op) {
    memset(op, 0, sizeof *op);
    op->kind = get_i32(r);
    op->phase = get_i32(r);
    for (int k = 0; k < TG_OP_MAX_IN; k++) op->in[k] = get_i32(r);
    for (int k = 0; k < TG_OP_MAX_OUT; k++) op->out[k] = get_i32(r);
    if (!r->failed && !tg_op_info_of(op->kind)) return -1;
    tg_op_params_visit(op->kind, &op->p, &(const tg_param_visitor){r, get_param_i64, get_param_f32});
    return 0;
}

static void get_io(rbuf *r, tg_plan_io *io) {
    int32_t *v[] = {&io->input_ids, &io->attention_mask, &io->token_type_ids,
                    &io->position_ids, &io->labels, &io->logits, &io->loss, &io->step,
                    &io->total_steps, &io->lr, &io->grad_norm, &io->params_all,
                    &io->grads_all, &io->m_all, &io->v_all, &io->params_bf16_all};
    _Static_assert(sizeof v / sizeof v[0] == sizeof(tg_plan_io) / sizeof(int32_t),
                   "get_io must list every io field");
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) *v[k] = get_i32(r);
}

/* What is wrong with a tensor's class flags and pool, or NULL: a tensor has at most one
 * class; trainable parameters live in the params pool, frozen ones in the frozen pool,
 * buffers in the buffers pool, and those pools hold nothing else (the params pool's
 * whole-pool views excepted); only buffers may be persistent, and only trainable parameters
 * have gradients. */
static const char *tensor_class_error(const tg_tensor *x) {
    const int param = (x->flags & TG_TENSOR_PARAM) != 0, frozen = (x->flags & TG_TENSOR_FROZEN) != 0,
              buffer = (x->flags & TG_TENSOR_BUFFER) != 0;
    if (param + frozen + buffer > 1) return "it has more than one of the flags param, frozen and buffer";
    if (param && x->pool != TG_POOL_PARAMS) return "a trainable parameter must be in the params pool";
    if (frozen && x->pool != TG_POOL_FROZEN) return "a frozen parameter must be in the frozen pool";
    if (buffer && x->pool != TG_POOL_BUFFERS) return "a buffer must be in the buffers pool";
    if (x->pool == TG_POOL_FROZEN && !frozen) return "the frozen pool holds frozen parameters only";
    if (x->pool == TG_POOL_BUFFERS && !buffer) return "the buffers pool holds buffers only";
    if (x->pool == TG_POOL_PARAMS && !param && !(x->flags & TG_TENSOR_VIEW))
        return "the params pool holds trainable parameters (and views of the pool) only";
    if ((x->flags & TG_TENSOR_PERSISTENT) && !buffer) return "only a buffer may be persistent";
    if ((frozen || buffer) && x->grad != -1) return "only a trainable parameter has a gradient";
    return NULL;
}

/* The checks every executor relies on, so a damaged or hand-edited plan is refused
 * here instead of indexing out of bounds later. */
static int validate(const tg_plan *p, const char *name, tg_err *err) {
    const tg_model_config *m = &p->model;
    const tg_plan_train *t = &p->train;
    const tg_plan_run *r = &p->run;
    if (m->arch < 0 || m->arch >= TG_ARCH_COUNT)
        return tg_fail(err, "%s: model arch %d is not a known architecture", name, m->arch);
    if (t->task < 0 || t->task >= TG_TASK_COUNT)
        return tg_fail(err, "%s: train task %d is not a known task", name, t->task);
    if (t->batch < 1)
        return tg_fail(err, "%s: train batch %d is not a positive row count", name, t->batch);
    if (t->seq < 1)
        return tg_fail(err, "%s: train seq %d is not a positive length", name, t->seq);
    if (t->num_labels < 1)
        return tg_fail(err, "%s: train num_labels %d is not a positive count", name, t->num_labels);
    if (t->pad_id < 0 || t->pad_id >= m->vocab_size)
        return tg_fail(err, "%s: train pad_id %d is outside the model's vocabulary (vocab_size %d)", name,
                       t->pad_id, m->vocab_size);
    if (t->precision < 0 || t->precision >= TG_PREC_COUNT)
        return tg_fail(err, "%s: train precision %d is not a known precision", name, t->precision);
    if (t->allow_tf32 != 0 && t->allow_tf32 != 1)
        return tg_fail(err, "%s: train allow_tf32 %d is not a boolean", name, t->allow_tf32);
    if (t->replicas < 1 || t->replicas > TG_MAX_DATA_PARALLEL)
        return tg_fail(err, "%s: train replicas %d is not in [1, %d]", name, t->replicas, TG_MAX_DATA_PARALLEL);
    if (t->zero_stage < 0 || t->zero_stage > 1 || (t->zero_stage && t->replicas < 2))
        return tg_fail(err, "%s: train zero_stage %d is not 0, or 1 with replicas >= 2", name, t->zero_stage);
    if (t->attention < 0 || t->attention >= TG_ATTENTION_MODE_COUNT)
        return tg_fail(err, "%s: train attention mode %d is not a known mode", name, t->attention);
    if (r->steps < 0 || r->epochs < 0 || (r->steps > 0) == (r->epochs > 0))
        return tg_fail(err, "%s: run steps %d and epochs %d: exactly one must be positive", name, r->steps,
                       r->epochs);
    if (r->log_every < 1)
        return tg_fail(err, "%s: run log_every %d is not a positive step count", name, r->log_every);

    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->dtype < 0 || x->dtype >= TG_DTYPE_COUNT)
            return tg_fail(err, "%s: tensor %d (%s) has dtype %d", name, t, x->name, x->dtype);
        if (x->ndim < 0 || x->ndim > TG_MAX_DIMS)
            return tg_fail(err, "%s: tensor %d (%s) has %d dims (0..%d allowed)", name, t,
                           x->name, x->ndim, TG_MAX_DIMS);
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] < 0)
                return tg_fail(err, "%s: tensor %d (%s) dim %d is %lld", name, t, x->name, d,
                               (long long)x->shape[d]);
        if (x->pool < 0 || x->pool >= TG_POOL_COUNT)
            return tg_fail(err, "%s: tensor %d (%s) is in pool %d of %d", name, t, x->name,
                           x->pool, TG_POOL_COUNT);
        uint64_t cap = p->pool_bytes[x->pool];
        if (x->offset > cap || x->bytes > cap - x->offset)
            return tg_fail(err,
                           "%s: tensor %d (%s) at offset %llu + %llu bytes runs past the "
                           "%s pool (%llu bytes)",
                           name, t, x->name, (unsigned long long)x->offset,
                           (unsigned long long)x->bytes, tg_pool_name(x->pool),
                           (unsigned long long)cap);
        if (x->flags & ~TG_TENSOR_FLAGS_ALL)
            return tg_fail(err, "%s: tensor %d (%s) has unknown flag bits 0x%x (file corrupt or from a newer build)",
                           name, t, x->name, (unsigned)(x->flags & ~TG_TENSOR_FLAGS_ALL));
        const char *class_error = tensor_class_error(x);
        if (class_error)
            return tg_fail(err, "%s: tensor %d (%s) in the %s pool: %s", name, t, x->name, tg_pool_name(x->pool),
                           class_error);
        if (x->init < 0 || x->init >= TG_INIT_COUNT)
            return tg_fail(err, "%s: tensor %d (%s) has init rule %d of %d", name, t, x->name, x->init,
                           TG_INIT_COUNT);
        if (x->grad < -1 || x->grad >= p->n_tensors)
            return tg_fail(err, "%s: tensor %d (%s) gradient refers to tensor %d of %d", name,
                           t, x->name, x->grad, p->n_tensors);
        if (x->master < -1 || x->master >= p->n_tensors)
            return tg_fail(err, "%s: tensor %d (%s) master copy refers to tensor %d of %d", name,
                           t, x->name, x->master, p->n_tensors);
        if (x->group < -1 || x->group >= p->n_tensors)
            return tg_fail(err, "%s: tensor %d (%s) packed group refers to tensor %d of %d", name,
                           t, x->name, x->group, p->n_tensors);
        if (x->first_use < -1 || x->first_use >= p->n_ops || x->last_use < -1 ||
            x->last_use >= p->n_ops)
            return tg_fail(err, "%s: tensor %d (%s) uses ops %d..%d of %d", name, t, x->name,
                           x->first_use, x->last_use, p->n_ops);
    }

    if (p->phase_begin[0] != 0 || p->phase_begin[TG_PHASE_COUNT] != p->n_ops)
        return tg_fail(err, "%s: phase table runs %d..%d, expected 0..%d (n_ops)", name,
                       p->phase_begin[0], p->phase_begin[TG_PHASE_COUNT], p->n_ops);
    for (int ph = 0; ph < TG_PHASE_COUNT; ph++)
        if (p->phase_begin[ph + 1] < p->phase_begin[ph])
            return tg_fail(err, "%s: phase %s begins at op %d but ends at op %d", name,
                           tg_phase_name(ph), p->phase_begin[ph], p->phase_begin[ph + 1]);

    for (int o = 0, ph = 0; o < p->n_ops; o++) {
        const tg_op *op = &p->ops[o];
        if (op->kind < 0 || op->kind >= TG_OP_COUNT)
            return tg_fail(err, "%s: op %d has kind %d of %d", name, o, op->kind, TG_OP_COUNT);
        while (o >= p->phase_begin[ph + 1]) ph++;
        if (op->phase != ph)
            return tg_fail(err, "%s: op %d (%s) has phase %d but sits in the %s phase", name,
                           o, tg_op_name(op->kind), op->phase, tg_phase_name(ph));
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (op->in[k] < -1 || op->in[k] >= p->n_tensors)
                return tg_fail(err, "%s: op %d (%s) input %d refers to tensor %d of %d", name,
                               o, tg_op_name(op->kind), k, op->in[k], p->n_tensors);
        for (int k = 0; k < TG_OP_MAX_OUT; k++)
            if (op->out[k] < -1 || op->out[k] >= p->n_tensors)
                return tg_fail(err, "%s: op %d (%s) output %d refers to tensor %d of %d", name,
                               o, tg_op_name(op->kind), k, op->out[k], p->n_tensors);
        /* The activation epilogue and its pre-activation: written (out2) or read (in3). */
        if (op->kind == TG_OP_MATMUL) {
            int64_t act = op->p.matmul.activation;
            if (act < TG_MATMUL_ACT_NONE || act > TG_MATMUL_ACT_GELU_BWD)
                return tg_fail(err, "%s: op %d (matmul) has activation=%lld (0, 1 or 2 allowed)", name,
                               o, (long long)act);
            if ((act == TG_MATMUL_ACT_GELU && op->out[2] < 0) || (act == TG_MATMUL_ACT_GELU_BWD && op->in[3] < 0))
                return tg_fail(err, "%s: op %d (matmul) with activation=%lld lacks its pre-activation "
                               "(%s)", name, o, (long long)act, act == TG_MATMUL_ACT_GELU ? "out2" : "in3");
        }
    }

    static const char *const io_names[] = {
        "input_ids", "attention_mask", "token_type_ids", "position_ids", "labels",
        "logits", "loss", "step", "total_steps", "lr", "grad_norm", "params_all",
        "grads_all", "m_all", "v_all", "params_bf16_all"};
    int32_t iov[sizeof io_names / sizeof io_names[0]];
    _Static_assert(sizeof iov == sizeof(tg_plan_io), "io names");
    memcpy(iov, &p->io, sizeof iov); /* tg_plan_io is all int32, in this order */
    for (size_t k = 0; k < sizeof io_names / sizeof io_names[0]; k++)
        if (iov[k] < -1 || iov[k] >= p->n_tensors)
            return tg_fail(err, "%s: io %s refers to tensor %d of %d", name, io_names[k],
                           iov[k], p->n_tensors);
    return 0;
}

static int decode_payload(const uint8_t *buf, size_t len, const char *name, tg_plan *p,
                          tg_err *err) {
    rbuf r = {buf, len, 0, "", NULL};
    if (get_model(&r, &p->model, name, err)) return -1;
    r.section = "job path";
    if (get_str(&r, p->job_path, sizeof p->job_path, "job path", name, err)) return -1;
    get_train(&r, &p->train);
    if (get_run(&r, &p->run, name, err)) return -1;

    r.section = "tensor table";
    int32_t nt = get_i32(&r);
    if (!r.failed && (nt < 0 || nt > MAX_COUNT || (size_t)nt > (len - r.pos) / TENSOR_MIN_BYTES))
        return tg_fail(err, "%s: tensor count %d is impossible for a %zu-byte payload", name,
                       nt, len);
    if (!r.failed && nt > 0) {
        p->tensors = calloc((size_t)nt, sizeof *p->tensors);
        if (!p->tensors) return tg_fail(err, "%s: out of memory for %d tensors", name, nt);
        p->n_tensors = nt;
        for (int t = 0; t < nt && !r.failed; t++)
            if (get_tensor(&r, &p->tensors[t], t, name, err)) return -1;
    }

    r.section = "op table";
    int32_t no = get_i32(&r);
    if (!r.failed && (no < 0 || no > MAX_COUNT || (size_t)no > (len - r.pos) / OP_MIN_BYTES))
        return tg_fail(err, "%s: op count %d is impossible for a %zu-byte payload", name, no,
                       len);
    if (!r.failed && no > 0) {
        p->ops = calloc((size_t)no, sizeof *p->ops);
        if (!p->ops) return tg_fail(err, "%s: out of memory for %d ops", name, no);
        p->n_ops = no;
        for (int o = 0; o < no && !r.failed; o++)
            if (get_op(&r, &p->ops[o]))
                return tg_fail(err, "%s: op %d has kind %d of %d", name, o, p->ops[o].kind, TG_OP_COUNT);
    }

    r.section = "plan totals";
    for (int ph = 0; ph <= TG_PHASE_COUNT; ph++) p->phase_begin[ph] = get_i32(&r);
    for (int q = 0; q < TG_POOL_COUNT; q++) p->pool_bytes[q] = get_u64(&r);
    p->peak_bytes = get_u64(&r);
    p->activation_live_peak = get_u64(&r);
    p->flops_per_step = get_f64(&r);
    p->bytes_per_step = get_f64(&r);
    r.section = "io table";
    get_io(&r, &p->io);
    r.section = "fingerprint";
    p->fingerprint = get_u64(&r);

    if (r.failed)
        return tg_fail(err, "%s: payload ends inside the %s (file corrupt)", name, r.failed);
    if (r.pos != len)
        return tg_fail(err, "%s: %zu unexpected bytes after the plan payload (file corrupt)",
                       name, len - r.pos);
    return validate(p, name, err);
}

int tg_plan_decode(const uint8_t *bytes, size_t len, const char *name, tg_plan *plan,
                   tg_err *err) {
    memset(plan, 0, sizeof *plan);
    if (!name) name = "plan";
    /* Magic before length, so a short non-plan file is called what it is. */
    if (len > 0 && memcmp(bytes, k_magic, len < 8 ? len : 8) != 0)
        return tg_fail(err, "%s: not a tunegraph plan (bad magic)", name);
    if (len < HEADER_BYTES)
        return tg_fail(err, "%s: truncated: file has %zu bytes, the plan header alone is %d",
                       name, len, HEADER_BYTES);
    uint32_t version = get_le32(bytes + 8);
    if (version != TG_PLAN_VERSION)
        return tg_fail(err, "%s: plan format version %u, this build reads version %d "
                            "(recompile the job)",
                       name, version, TG_PLAN_VERSION);
    uint32_t flags = get_le32(bytes + 12);
    if (flags != 0)
        return tg_fail(err, "%s: unknown header flags 0x%x (file corrupt or from a newer build)",
                       name, flags);
    uint64_t usize = get_le64(bytes + 16);
    uint64_t csize = get_le64(bytes + 24);
    uint64_t sum = get_le64(bytes + 32);
    size_t have = len - HEADER_BYTES;
    if (csize > have)
        return tg_fail(err, "%s: truncated: header says %llu compressed bytes, file has %zu",
                       name, (unsigned long long)csize, have);
    if (csize < have)
        return tg_fail(err, "%s: %zu unexpected bytes after the %llu-byte payload (file corrupt)",
                       name, have - (size_t)csize, (unsigned long long)csize);
    const uint8_t *payload = bytes + HEADER_BYTES;
    if (XXH64(payload, (size_t)csize, 0) != sum)
        return tg_fail(err, "%s: checksum mismatch (file corrupt)", name);
    /* The header's size is outside the checksum; the frame's own size is inside it. */
    unsigned long long fsize = ZSTD_getFrameContentSize(payload, (size_t)csize);
    if (fsize == ZSTD_CONTENTSIZE_ERROR || fsize == ZSTD_CONTENTSIZE_UNKNOWN || fsize != usize)
        return tg_fail(err, "%s: header says %llu payload bytes, the compressed frame does not "
                            "agree (file corrupt)",
                       name, (unsigned long long)usize);
    /* A zstd block yields at most 128 KiB from at least 4 bytes (an RLE block), so no frame
     * expands more than 32768-fold: a larger size is a damaged or hostile frame header and
     * must not drive the allocation below. */
    if (usize > SIZE_MAX / 2 || usize == 0 || usize / 32768 > csize)
        return tg_fail(err, "%s: payload size %llu is impossible (file corrupt)", name,
                       (unsigned long long)usize);
    uint8_t *buf = malloc((size_t)usize);
    if (!buf)
        return tg_fail(err, "%s: out of memory for a %llu-byte payload", name,
                       (unsigned long long)usize);
    size_t got = ZSTD_decompress(buf, (size_t)usize, payload, (size_t)csize);
    if (ZSTD_isError(got) || got != usize) {
        free(buf);
        return tg_fail(err, "%s: payload does not decompress: %s (file corrupt)", name,
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
    }
    int rc = decode_payload(buf, (size_t)usize, name, plan, err);
    free(buf);
    if (rc) {
        tg_plan_free(plan);
        memset(plan, 0, sizeof *plan);
    }
    return rc;
}

/* ---- files ------------------------------------------------------------------- */

int tg_plan_write(const tg_plan *plan, const char *path, tg_err *err) {
    uint8_t *bytes;
    size_t len;
    if (tg_plan_encode(plan, &bytes, &len, err)) return tg_fail_context(err, "%s", path);
    tg_chunk chunk = {bytes, len};
    int rc = tg_write_file_atomic(path, &chunk, 1, "plan file", err);
    free(bytes);
    return rc;
}

int tg_plan_read(const char *path, tg_plan *plan, tg_err *err) {
    memset(plan, 0, sizeof *plan);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return tg_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tg_fail(err, "%s: not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        return tg_fail(err, "%s: out of memory for %zu bytes", path, len);
    }
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return tg_fail(err, "%s: read failed: %s", path, strerror(e));
        }
        if (n == 0) break; /* shrank under us: decode what is there, it will say truncated */
        got += (size_t)n;
    }
    close(fd);
    int rc = tg_plan_decode(buf, got, path, plan, err);
    free(buf);
    return rc;
}

int tg_plan_file_sniff(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    uint8_t head[8];
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    return n == (ssize_t)sizeof head && memcmp(head, k_magic, sizeof head) == 0;
}
