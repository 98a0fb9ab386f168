/* The plan payload: every tg_plan field written one by one, little-endian, so struct padding
 * never reaches the file and every compiler produces the same bytes for the same plan; and
 * read back, every count bounded by the payload, then checked by tg_plan_validate_tables and
 * tg_plan_validate_ops.
 *
 * Op kinds are stored by name: the payload lists the names of the kinds the plan uses
 * (plan/ops.def's, in first-use order) and each op stores its index into that list. The
 * decoder maps each name to this build's kind, so the enum's numbering never reaches the
 * file: an op added anywhere in ops.def leaves existing plans readable, and a plan that
 * uses an op this build lacks is refused by that op's name.
 *
 * A plan with length buckets (train.n_buckets > 1) is followed by its n_buckets - 1 bucket
 * plans, each as its own tensor and op tables, phase table, pools and totals: the rest of a
 * bucket plan is the plan's but for seq, so it is not written twice. The decoder checks
 * each bucket plan as a plan and against the plan (tg_plan_validate_buckets). */
#include "plan/plan_codec.h"
#include "base/alloc.h"

#include "plan/op_meta.h"
#include "plan/validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Far above any real model; keeps a hostile count from driving a huge malloc. */
#define MAX_COUNT (1 << 24)
/* The op kind name table: far more names than any build has kinds, each shorter than this. */
#define MAX_KIND_NAMES 4096
#define KIND_NAME_MAX 64
_Static_assert(TG_OP_COUNT <= MAX_KIND_NAMES, "the op kind name table must hold every kind");

/* A field added to plan.h must be added to the put_/get_ functions below (and
 * TG_PLAN_VERSION bumped); these trip on LP64 when a struct changes size. */
#if UINTPTR_MAX == 0xffffffffffffffffu
_Static_assert(sizeof(tg_tensor) == 192, "tg_tensor changed: update put_tensor/get_tensor");
_Static_assert(sizeof(tg_op) == 136, "tg_op changed: update put_op/get_op");
_Static_assert(sizeof(tg_model_config) == 1160, "tg_model_config changed: update put_model");
_Static_assert(sizeof(tg_plan_train) == 84, "tg_plan_train changed: update put_train/get_train");
_Static_assert(sizeof(tg_plan_run) == 1600, "tg_plan_run changed: update put_run/get_run");
_Static_assert(sizeof(tg_plan) == 3640, "tg_plan changed: update tg_plan_payload_encode/decode");
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
        uint8_t *p = tg_realloc(b->p, cap);
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
    put_i32(b, m->kv_heads);
    put_i32(b, m->tie_word_embeddings);
    put_i32(b, m->rope_type);
    put_i32(b, m->rope_original_max_positions);
    put_f32(b, m->rope_theta);
    put_f32(b, m->rope_factor);
    put_f32(b, m->rope_low_freq_factor);
    put_f32(b, m->rope_high_freq_factor);
    put_i32(b, m->image_channels);
    put_i32(b, m->image_size);
    put_f32(b, m->width_mult);
    put_f32(b, m->batch_norm_momentum);
    for (int c = 0; c < 3; c++) put_f32(b, m->image_mean[c]);
    for (int c = 0; c < 3; c++) put_f32(b, m->image_std[c]);
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
    put_i32(b, t->n_buckets);
    for (int k = 0; k < TG_MAX_BUCKETS; k++) put_i32(b, t->bucket_seq[k]);
    put_i32(b, t->grad_accumulation);
    put_f32(b, t->loss_scale_init);
}

static void put_run(wbuf *b, const tg_plan_run *r) {
    put_str(b, r->train_data, sizeof r->train_data);
    put_str(b, r->eval_data, sizeof r->eval_data);
    put_i32(b, r->steps);
    put_i32(b, r->epochs);
    put_i32(b, r->log_every);
    put_u64(b, r->seed);
    put_i32(b, r->checkpoint_every);
    put_i32(b, r->keep_checkpoints);
    put_str(b, r->checkpoint_dir, sizeof r->checkpoint_dir);
    put_i32(b, r->last_batch);
    put_i32(b, r->skip_nonfinite);
    put_i32(b, r->max_skipped_steps);
    put_i32(b, r->qa_n_best);
    put_i32(b, r->qa_max_answer_length);
    put_f32(b, r->qa_null_threshold);
    put_f32(b, r->gpu_hour_price);
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

/* `index`: the kind's place in the payload's op kind name table. */
static void put_op(wbuf *b, const tg_op *op, int32_t index) {
    put_i32(b, index);
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
                         io->grads_all, io->m_all, io->v_all, io->params_bf16_all, io->loss_norm,
                         io->loss_scale, io->loss_scale_growth,
                         io->mlm_stream, io->pixel_values};
    _Static_assert(sizeof v == sizeof(tg_plan_io), "put_io must list every io field");
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) put_i32(b, v[k]);
}

/* What a plan and each of its bucket plans hold of their own: the tensor and op tables,
 * the phase table, the pools and the totals. */
static void put_body(wbuf *b, const tg_plan *plan) {
    put_i32(b, plan->n_tensors);
    for (int t = 0; t < plan->n_tensors; t++) put_tensor(b, &plan->tensors[t]);
    /* The kinds' names in first-use order (index[kind]: its place, -1 while unused). */
    int32_t index[TG_OP_COUNT], n_names = 0;
    for (int k = 0; k < TG_OP_COUNT; k++) index[k] = -1;
    for (int o = 0; o < plan->n_ops; o++)
        if (index[plan->ops[o].kind] < 0) index[plan->ops[o].kind] = n_names++;
    put_i32(b, n_names);
    for (int32_t j = 0; j < n_names; j++)
        for (int k = 0; k < TG_OP_COUNT; k++)
            if (index[k] == j) put_str(b, tg_op_name(k), KIND_NAME_MAX);
    put_i32(b, plan->n_ops);
    for (int o = 0; o < plan->n_ops; o++) put_op(b, &plan->ops[o], index[plan->ops[o].kind]);
    for (int p = 0; p <= TG_PHASE_COUNT; p++) put_i32(b, plan->phase_begin[p]);
    for (int p = 0; p < TG_POOL_COUNT; p++) put_u64(b, plan->pool_bytes[p]);
    put_i32(b, plan->grads_share_activations);
    put_u64(b, plan->peak_bytes);
    put_u64(b, plan->activation_live_peak);
    put_f64(b, plan->flops_per_step);
    put_f64(b, plan->bytes_per_step);
    put_i32(b, plan->freeze_pruned_ops);
    put_f64(b, plan->freeze_pruned_flops);
}

/* The tables put_body writes must be there, and every op kind inside the enum. */
static int check_encodable(const tg_plan *plan, const char *what, tg_err *err) {
    if (plan->n_tensors < 0 || plan->n_ops < 0 || (plan->n_tensors && !plan->tensors) ||
        (plan->n_ops && !plan->ops))
        return tg_fail(err, "plan encode%s: bad table (n_tensors %d, n_ops %d)", what, plan->n_tensors,
                       plan->n_ops);
    for (int o = 0; o < plan->n_ops; o++)
        if (!tg_op_info_of(plan->ops[o].kind))
            return tg_fail(err, "plan encode%s: op %d has kind %d of %d", what, o, plan->ops[o].kind, TG_OP_COUNT);
    return 0;
}

int tg_plan_payload_encode(const tg_plan *plan, uint8_t **out, size_t *out_len, tg_err *err) {
    *out = NULL;
    *out_len = 0;
    if (check_encodable(plan, "", err)) return -1;
    /* The bucket plans follow the plan: n_buckets - 1 of them, all present. */
    const int n_bucket_plans = plan->train.n_buckets > 1 ? plan->train.n_buckets - 1 : 0;
    if (n_bucket_plans && (plan->train.n_buckets > TG_MAX_BUCKETS || !plan->buckets))
        return tg_fail(err, "plan encode: train n_buckets %d without its %d bucket plans", plan->train.n_buckets,
                       n_bucket_plans);
    for (int k = 0; k < n_bucket_plans; k++) {
        char what[48];
        snprintf(what, sizeof what, ", bucket %d", k);
        if (check_encodable(&plan->buckets[k], what, err)) return -1;
    }
    wbuf b = {0};
    put_model(&b, &plan->model);
    put_str(&b, plan->job_path, sizeof plan->job_path);
    put_train(&b, &plan->train);
    put_run(&b, &plan->run);
    put_body(&b, plan);
    put_io(&b, &plan->io);
    put_u64(&b, plan->fingerprint);
    put_u64(&b, plan->peak_bytes_without_recompute);
    /* A bucket plan's settings, io, fingerprint and recompute summary are the plan's (its
     * seq is bucket_seq[k]): only its own tables and totals are written. */
    for (int k = 0; k < n_bucket_plans; k++) put_body(&b, &plan->buckets[k]);
    if (b.oom) {
        free(b.p);
        return tg_fail(err, "plan encode: out of memory");
    }
    *out = b.p;
    *out_len = b.len;
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
    m->kv_heads = get_i32(r);
    m->tie_word_embeddings = get_i32(r);
    m->rope_type = get_i32(r);
    m->rope_original_max_positions = get_i32(r);
    m->rope_theta = get_f32(r);
    m->rope_factor = get_f32(r);
    m->rope_low_freq_factor = get_f32(r);
    m->rope_high_freq_factor = get_f32(r);
    m->image_channels = get_i32(r);
    m->image_size = get_i32(r);
    m->width_mult = get_f32(r);
    m->batch_norm_momentum = get_f32(r);
    for (int c = 0; c < 3; c++) m->image_mean[c] = get_f32(r);
    for (int c = 0; c < 3; c++) m->image_std[c] = get_f32(r);
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
    t->n_buckets = get_i32(r);
    for (int k = 0; k < TG_MAX_BUCKETS; k++) t->bucket_seq[k] = get_i32(r);
    t->grad_accumulation = get_i32(r);
    t->loss_scale_init = get_f32(r);
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
    run->checkpoint_every = get_i32(r);
    run->keep_checkpoints = get_i32(r);
    if (get_str(r, run->checkpoint_dir, sizeof run->checkpoint_dir, "run checkpoint_dir", name, err)) return -1;
    run->last_batch = get_i32(r);
    run->skip_nonfinite = get_i32(r);
    run->max_skipped_steps = get_i32(r);
    run->qa_n_best = get_i32(r);
    run->qa_max_answer_length = get_i32(r);
    run->qa_null_threshold = get_f32(r);
    run->gpu_hour_price = get_f32(r);
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

/* One entry of the payload's op kind name table: the name as stored, and this build's
 * kind of that name (-1: none). */
typedef struct kind_name {
    char name[KIND_NAME_MAX];
    int kind;
} kind_name;

/* Reads the op kind name table into *names (malloc'd, *n entries); refuses an impossible
 * count, an overlong or NUL-holding name, and a kind named twice. A name this build does
 * not know is refused only where an op uses it (get_op), which can say which op. */
static int get_kind_names(rbuf *r, kind_name **names, int32_t *n, const char *name, tg_err *err) {
    *names = NULL;
    *n = 0;
    r->section = "op kind names";
    const int32_t count = get_i32(r);
    if (r->failed) return 0;
    if (count < 0 || count > MAX_KIND_NAMES || (size_t)count > (r->len - r->pos) / 4)
        return tg_fail(err, "%s: op kind name count %d is impossible (at most %d, file corrupt)", name, count,
                       MAX_KIND_NAMES);
    if (count == 0) return 0;
    kind_name *t = tg_calloc((size_t)count, sizeof *t);
    if (!t) return tg_fail(err, "%s: out of memory for %d op kind names", name, count);
    *names = t;
    for (int32_t j = 0; j < count && !r->failed; j++) {
        char what[48];
        snprintf(what, sizeof what, "op kind name %d", j);
        if (get_str(r, t[j].name, sizeof t[j].name, what, name, err)) return -1;
        t[j].kind = tg_op_kind_of_name(t[j].name);
        for (int32_t i = 0; i < j && t[j].kind >= 0; i++)
            if (t[i].kind == t[j].kind)
                return tg_fail(err, "%s: op kind names %d and %d are both '%s' (file corrupt)", name, i, j,
                               t[j].name);
        *n = j + 1;
    }
    return 0;
}

static void get_param_i64(void *r, const char *display, int64_t *value) { *value = get_i64(r); }
static void get_param_f32(void *r, const char *display, float *value) { *value = get_f32(r); }

/* Op `index`, its kind through the name table; -1 (with the message) for an index outside
 * the table or a name this build does not know, whose parameters cannot be known (nor the
 * rest read). */
static int get_op(rbuf *r, tg_op *op, int index, const kind_name *names, int32_t n_names, const char *name,
                  tg_err *err) {
    memset(op, 0, sizeof *op);
    const int32_t entry = get_i32(r);
    op->phase = get_i32(r);
    for (int k = 0; k < TG_OP_MAX_IN; k++) op->in[k] = get_i32(r);
    for (int k = 0; k < TG_OP_MAX_OUT; k++) op->out[k] = get_i32(r);
    if (r->failed) return 0; /* reported by the caller as a truncation */
    if (entry < 0 || entry >= n_names)
        return tg_fail(err, "%s: op %d names op kind %d of the %d the plan lists (file corrupt)", name, index,
                       entry, n_names);
    if (names[entry].kind < 0)
        return tg_fail(err, "%s: op %d is '%s', an op this build does not know (recompile the job)", name, index,
                       names[entry].name);
    op->kind = names[entry].kind;
    tg_op_params_visit(op->kind, &op->p, &(const tg_param_visitor){r, get_param_i64, get_param_f32});
    return 0;
}

static void get_io(rbuf *r, tg_plan_io *io) {
    int32_t *v[] = {&io->input_ids, &io->attention_mask, &io->token_type_ids,
                    &io->position_ids, &io->labels, &io->logits, &io->loss, &io->step,
                    &io->total_steps, &io->lr, &io->grad_norm, &io->params_all,
                    &io->grads_all, &io->m_all, &io->v_all, &io->params_bf16_all, &io->loss_norm,
                    &io->loss_scale, &io->loss_scale_growth,
                    &io->mlm_stream, &io->pixel_values};
    _Static_assert(sizeof v / sizeof v[0] == sizeof(tg_plan_io) / sizeof(int32_t),
                   "get_io must list every io field");
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++) *v[k] = get_i32(r);
}

/* What put_body wrote, into p (its tables calloc'd there); `name` starts the messages. */
static int get_body(rbuf *r, tg_plan *p, const char *name, tg_err *err) {
    const size_t len = r->len;
    r->section = "tensor table";
    int32_t nt = get_i32(r);
    if (!r->failed && (nt < 0 || nt > MAX_COUNT || (size_t)nt > (len - r->pos) / TENSOR_MIN_BYTES))
        return tg_fail(err, "%s: tensor count %d is impossible for a %zu-byte payload", name, nt, len);
    if (!r->failed && nt > 0) {
        p->tensors = tg_calloc((size_t)nt, sizeof *p->tensors);
        if (!p->tensors) return tg_fail(err, "%s: out of memory for %d tensors", name, nt);
        p->n_tensors = nt;
        for (int t = 0; t < nt && !r->failed; t++)
            if (get_tensor(r, &p->tensors[t], t, name, err)) return -1;
    }

    kind_name *names;
    int32_t n_names;
    if (get_kind_names(r, &names, &n_names, name, err)) {
        free(names);
        return -1;
    }
    r->section = "op table";
    int32_t no = get_i32(r);
    int rc = 0;
    if (!r->failed && (no < 0 || no > MAX_COUNT || (size_t)no > (len - r->pos) / OP_MIN_BYTES))
        rc = tg_fail(err, "%s: op count %d is impossible for a %zu-byte payload", name, no, len);
    else if (!r->failed && no > 0) {
        p->ops = tg_calloc((size_t)no, sizeof *p->ops);
        if (!p->ops) rc = tg_fail(err, "%s: out of memory for %d ops", name, no);
        else p->n_ops = no;
        for (int o = 0; o < no && !r->failed && !rc; o++) rc = get_op(r, &p->ops[o], o, names, n_names, name, err);
    }
    free(names);
    if (rc) return -1;

    r->section = "plan totals";
    for (int ph = 0; ph <= TG_PHASE_COUNT; ph++) p->phase_begin[ph] = get_i32(r);
    for (int q = 0; q < TG_POOL_COUNT; q++) p->pool_bytes[q] = get_u64(r);
    p->grads_share_activations = get_i32(r);
    p->peak_bytes = get_u64(r);
    p->activation_live_peak = get_u64(r);
    p->flops_per_step = get_f64(r);
    p->bytes_per_step = get_f64(r);
    p->freeze_pruned_ops = get_i32(r);
    p->freeze_pruned_flops = get_f64(r);
    return 0;
}

/* The tables, then (TG_PLAN_CHECK_ALL) the ops and layout, of one plan. */
static int check_plan(const tg_plan *p, const char *name, tg_plan_checks checks, tg_err *err) {
    if (tg_plan_validate_tables(p, name, err)) return -1;
    return checks == TG_PLAN_CHECK_TABLES ? 0 : tg_plan_validate_ops(p, name, err);
}

int tg_plan_payload_decode(const uint8_t *buf, size_t len, const char *name, tg_plan_checks checks, tg_plan *p,
                           tg_err *err) {
    /* Every field is the payload's or zero: an uninitialised plan's bucket pointer would
     * otherwise survive a one-bucket payload and be taken for bucket plans. */
    memset(p, 0, sizeof *p);
    rbuf r = {buf, len, 0, "", NULL};
    if (get_model(&r, &p->model, name, err)) return -1;
    r.section = "job path";
    if (get_str(&r, p->job_path, sizeof p->job_path, "job path", name, err)) return -1;
    get_train(&r, &p->train);
    /* The bucket count says how many bucket plans follow: bounded before anything is read
     * or allocated for them. */
    if (!r.failed && (p->train.n_buckets < 1 || p->train.n_buckets > TG_MAX_BUCKETS))
        return tg_fail(err, "%s: train n_buckets %d is not in [1, %d] (file corrupt)", name, p->train.n_buckets,
                       TG_MAX_BUCKETS);
    if (get_run(&r, &p->run, name, err)) return -1;
    if (get_body(&r, p, name, err)) return -1;
    r.section = "io table";
    get_io(&r, &p->io);
    r.section = "fingerprint";
    p->fingerprint = get_u64(&r);
    r.section = "recompute summary";
    p->peak_bytes_without_recompute = get_u64(&r);

    /* Each bucket plan: its own tables and totals; the rest is the plan's, but for seq. */
    const int n_bucket_plans = !r.failed && p->train.n_buckets > 1 ? p->train.n_buckets - 1 : 0;
    int failed_bucket = -1; /* the bucket plan the payload ends in */
    if (n_bucket_plans) {
        p->buckets = tg_calloc((size_t)n_bucket_plans, sizeof *p->buckets);
        if (!p->buckets) return tg_fail(err, "%s: out of memory for %d bucket plans", name, n_bucket_plans);
    }
    for (int k = 0; k < n_bucket_plans && !r.failed; k++) {
        tg_plan *b = &p->buckets[k];
        b->model = p->model;
        memcpy(b->job_path, p->job_path, sizeof b->job_path);
        b->train = p->train;
        b->train.seq = p->train.bucket_seq[k];
        b->run = p->run;
        b->io = p->io;
        b->fingerprint = p->fingerprint;
        b->peak_bytes_without_recompute = p->peak_bytes_without_recompute;
        char bname[TG_PATH_MAX + 64];
        snprintf(bname, sizeof bname, "%s: bucket %d (seq %d)", name, k, b->train.seq);
        if (get_body(&r, b, bname, err)) return -1;
        if (r.failed) failed_bucket = k;
    }

    if (r.failed && failed_bucket >= 0)
        return tg_fail(err, "%s: payload ends inside bucket %d's %s (file corrupt)", name, failed_bucket, r.failed);
    if (r.failed)
        return tg_fail(err, "%s: payload ends inside the %s (file corrupt)", name, r.failed);
    if (r.pos != len)
        return tg_fail(err, "%s: %zu unexpected bytes after the plan payload (file corrupt)",
                       name, len - r.pos);
    /* The plan, then what its bucket plans must share with it (compared field by field,
     * no index followed), then each bucket plan as a plan. */
    if (check_plan(p, name, checks, err) || tg_plan_validate_buckets(p, name, err)) return -1;
    for (int k = 0; k < n_bucket_plans; k++) {
        char bname[TG_PATH_MAX + 64];
        snprintf(bname, sizeof bname, "%s: bucket %d (seq %d)", name, k, p->buckets[k].train.seq);
        if (check_plan(&p->buckets[k], bname, checks, err)) return -1;
    }
    return 0;
}
