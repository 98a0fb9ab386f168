/* Plan file round trip, refusal of damaged files, atomic writes, and `inspect`. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/inspect.h"
#include "plan/op_meta.h"
#include "plan/plan_codec.h"
#include "plan/plan_file.h"
#include "plan/validate.h"
#include "runtime/trainer.h"
#include "tests/harness.h"
#include "tests/libc_faults.h"

/* ---- a small consistent plan ------------------------------------------------- */

enum {
    T_WTE, T_CLS_B, T_IDS, T_LABELS, T_G_WTE, T_G_CLS_B, T_H, T_LOGITS, T_LOSS, T_DLOGITS,
    T_STEP, T_TOTAL, T_LR, T_GNORM, T_PARAMS_ALL, T_GRADS_ALL, T_M_ALL, T_V_ALL, T_DLOSS,
    N_T
};

static void set_tensor(tg_plan *p, int t, const char *name, int dtype, int pool, uint64_t off,
                       int flags, int ndim, int64_t d0, int64_t d1) {
    tg_tensor *x = &p->tensors[t];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = dtype;
    x->pool = pool;
    x->ndim = ndim;
    x->flags = flags;
    x->shape[0] = d0;
    x->shape[1] = ndim > 1 ? d1 : 0;
    x->offset = off;
    x->bytes = (uint64_t)tg_tensor_numel(x) * 4;
    x->grad = -1;
    x->master = -1;
    x->group = -1;
    x->first_use = x->last_use = -1;
}

static tg_op *add_op(tg_plan *p, int kind, int phase) {
    tg_op *op = &p->ops[p->n_ops++];
    op->kind = kind;
    op->phase = phase;
    for (int k = 0; k < TG_OP_MAX_IN; k++) op->in[k] = -1;
    for (int k = 0; k < TG_OP_MAX_OUT; k++) op->out[k] = -1;
    return op;
}

/* Tensors in every pool, ops in every phase, io and strings set, awkward floats
 * (-0.0, denormal, NaN) so the round trip must be bit exact. */
static void build_plan(tg_plan *p) {
    memset(p, 0, sizeof *p);
    tg_model_config *m = &p->model;
    snprintf(m->source, sizeof m->source, "%s", "models/bert-tiny");
    snprintf(m->weights, sizeof m->weights, "%s", "models/bert-tiny/model.safetensors");
    m->arch = TG_ARCH_BERT;
    m->vocab_size = 16;
    m->hidden = 8;
    m->layers = 1;
    m->heads = 2;
    m->intermediate = 32;
    m->max_positions = 64;
    m->type_vocab_size = 2;
    m->pad_token_id = 0;
    m->gelu = TG_GELU_ERF;
    m->layer_norm_eps = 1e-12f;
    m->initializer_range = 0.02f;
    m->hidden_dropout = 0.1f;
    m->attention_dropout = -0.0f;
    m->embedding_dropout = 1e-40f; /* denormal */
    m->classifier_dropout = 0.25f;

    snprintf(p->job_path, sizeof p->job_path, "%s", "/jobs/sst2.job");
    tg_plan_train *t = &p->train; /* no field at its default, so a lost field shows */
    t->task = TG_TASK_CLASSIFY;
    t->batch = 2;
    t->seq = 4;
    t->num_labels = 3;
    t->pad_id = 5;
    t->precision = TG_PREC_BF16;
    t->allow_tf32 = 1;
    t->replicas = 3;
    t->zero_stage = 1;
    t->attention = TG_ATTENTION_UNFUSED;
    t->n_buckets = 1;
    t->bucket_seq[0] = 4;
    t->grad_accumulation = 1; /* the only value beside replicas 3 (a lost field decodes as 0) */
    tg_plan_run *r = &p->run;
    snprintf(r->train_data, sizeof r->train_data, "%s", "/data/train.jsonl");
    snprintf(r->eval_data, sizeof r->eval_data, "%s", "/data/eval.jsonl");
    r->steps = 100;
    r->epochs = 0;
    r->log_every = 5;
    r->seed = 0xfedcba9876543210ull;
    r->checkpoint_every = 7;
    r->keep_checkpoints = 2;
    snprintf(r->checkpoint_dir, sizeof r->checkpoint_dir, "%s", "/runs/ckpt");
    r->last_batch = TG_LAST_BATCH_DROP;
    r->skip_nonfinite = 1, r->max_skipped_steps = 3;
    r->qa_n_best = 7, r->qa_max_answer_length = 11, r->qa_null_threshold = -1.5f;

    p->tensors = calloc(N_T, sizeof *p->tensors);
    p->ops = calloc(16, sizeof *p->ops);
    p->n_tensors = N_T;
    set_tensor(p, T_WTE, "bert.embeddings.word_embeddings.weight", TG_F32, TG_POOL_PARAMS, 0,
               TG_TENSOR_PARAM, 2, 16, 8);
    p->tensors[T_WTE].grad = T_G_WTE;
    p->tensors[T_WTE].init = TG_INIT_NORMAL;
    p->tensors[T_WTE].init_std = 0.02f;
    set_tensor(p, T_CLS_B, "classifier.bias", TG_F32, TG_POOL_PARAMS, 512,
               TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY, 1, 2, 0);
    p->tensors[T_CLS_B].grad = T_G_CLS_B;
    p->tensors[T_CLS_B].init = TG_INIT_ZEROS;
    p->tensors[T_CLS_B].master = 7;
    p->tensors[T_CLS_B].group = 9; /* encoded as given: the decoder checks only its range */
    uint32_t nan_bits = 0x7fc12345u; /* a NaN with a payload */
    memcpy(&p->tensors[T_CLS_B].init_std, &nan_bits, 4);
    set_tensor(p, T_IDS, "input_ids", TG_I32, TG_POOL_INPUTS, 0, TG_TENSOR_INPUT, 2, 2, 4);
    set_tensor(p, T_LABELS, "labels", TG_I32, TG_POOL_INPUTS, 256, TG_TENSOR_INPUT, 1, 2, 0);
    set_tensor(p, T_G_WTE, "grad:bert.embeddings.word_embeddings.weight", TG_F32,
               TG_POOL_GRADS, 0, TG_TENSOR_GRAD, 2, 16, 8);
    set_tensor(p, T_G_CLS_B, "grad:classifier.bias", TG_F32, TG_POOL_GRADS, 512,
               TG_TENSOR_GRAD, 1, 2, 0);
    set_tensor(p, T_H, "h", TG_F32, TG_POOL_ACTIVATIONS, 0, 0, 2, 8, 8);
    set_tensor(p, T_LOGITS, "logits", TG_F32, TG_POOL_ACTIVATIONS, 256, TG_TENSOR_OUTPUT, 2,
               2, 2);
    set_tensor(p, T_LOSS, "loss", TG_F32, TG_POOL_ACTIVATIONS, 512, TG_TENSOR_OUTPUT, 1, 1, 0);
    set_tensor(p, T_DLOGITS, "dlogits", TG_F32, TG_POOL_ACTIVATIONS, 0, 0, 2, 2, 2);
    set_tensor(p, T_STEP, "step", TG_F32, TG_POOL_OPTIM, 0, 0, 1, 1, 0);
    set_tensor(p, T_TOTAL, "total_steps", TG_F32, TG_POOL_OPTIM, 256, 0, 1, 1, 0);
    set_tensor(p, T_LR, "lr", TG_F32, TG_POOL_WORKSPACE, 0, 0, 1, 1, 0);
    set_tensor(p, T_GNORM, "grad_norm", TG_F32, TG_POOL_WORKSPACE, 256, 0, 1, 1, 0);
    set_tensor(p, T_PARAMS_ALL, "params_all", TG_F32, TG_POOL_PARAMS, 0, TG_TENSOR_VIEW, 1,
               192, 0);
    set_tensor(p, T_GRADS_ALL, "grads_all", TG_F32, TG_POOL_GRADS, 0, TG_TENSOR_VIEW, 1, 192,
               0);
    set_tensor(p, T_M_ALL, "m_all", TG_F32, TG_POOL_OPTIM, 512, TG_TENSOR_VIEW, 1, 192, 0);
    set_tensor(p, T_V_ALL, "v_all", TG_F32, TG_POOL_OPTIM, 1280, TG_TENSOR_VIEW, 1, 192, 0);
    set_tensor(p, T_DLOSS, "dloss", TG_F32, TG_POOL_WORKSPACE, 512, 0, 1, 1, 0);

    tg_op *op;
    p->phase_begin[TG_PHASE_FORWARD] = p->n_ops;
    op = add_op(p, TG_OP_EMBEDDING, TG_PHASE_FORWARD);
    op->in[0] = T_IDS, op->in[1] = T_WTE, op->out[0] = T_H;
    op->p.embedding = (tg_embedding_params){.n = 8, .vocab = 16, .dim = 8};
    op = add_op(p, TG_OP_MATMUL, TG_PHASE_FORWARD);
    op->in[0] = T_H, op->in[1] = T_WTE, op->in[2] = T_CLS_B, op->out[0] = T_LOGITS;
    op->p.matmul = (tg_matmul_params){.m = 2, .n = 2, .k = 8, .trans_a = 0, .trans_b = 1, .batch = 1, .alpha = 1.0f};
    op = add_op(p, TG_OP_CROSS_ENTROPY, TG_PHASE_FORWARD);
    op->in[0] = T_LOGITS, op->in[1] = T_LABELS, op->out[0] = T_LOSS;
    op->p.cross_entropy = (tg_cross_entropy_params){.n = 2, .c = 2};
    p->phase_begin[TG_PHASE_BACKWARD] = p->n_ops;
    op = add_op(p, TG_OP_FILL, TG_PHASE_BACKWARD);
    op->out[0] = T_DLOSS;
    op->p.fill.value = 1.0f;
    op = add_op(p, TG_OP_CROSS_ENTROPY_BWD, TG_PHASE_BACKWARD);
    op->in[0] = T_DLOSS, op->in[1] = T_LOGITS, op->in[2] = T_LABELS, op->out[0] = T_DLOGITS;
    op = add_op(p, TG_OP_BIAS_GRAD, TG_PHASE_BACKWARD);
    op->in[0] = T_DLOGITS, op->out[0] = T_G_CLS_B;
    op->p.bias_grad = (tg_bias_grad_params){.m = 2, .n = 2};
    op = add_op(p, TG_OP_EMBEDDING_BWD, TG_PHASE_BACKWARD);
    op->in[0] = T_IDS, op->in[1] = T_H, op->out[0] = T_G_WTE;
    op->p.embedding = (tg_embedding_params){.n = 8, .vocab = 16, .dim = 8};
    p->phase_begin[TG_PHASE_OPTIMIZER] = p->n_ops;
    op = add_op(p, TG_OP_SCHEDULE, TG_PHASE_OPTIMIZER);
    op->in[0] = T_STEP, op->in[1] = T_TOTAL, op->out[0] = T_LR, op->out[1] = T_STEP;
    op->p.schedule = (tg_schedule_params){.warmup = 10, .lr = 5e-5f};
    op = add_op(p, TG_OP_GRAD_NORM, TG_PHASE_OPTIMIZER);
    op->in[0] = T_GRADS_ALL, op->out[0] = T_GNORM;
    op = add_op(p, TG_OP_ADAMW, TG_PHASE_OPTIMIZER);
    op->in[0] = T_GRADS_ALL, op->in[1] = T_LR, op->in[2] = T_STEP, op->in[3] = T_GNORM;
    op->out[0] = T_PARAMS_ALL, op->out[1] = T_M_ALL, op->out[2] = T_V_ALL;
    op->p.adamw = (tg_adamw_params){.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .max_grad_norm = 1.0f};
    p->phase_begin[TG_PHASE_COUNT] = p->n_ops;

    /* Liveness from the schedule, as the compiler would record it. */
    for (int o = 0; o < p->n_ops; o++) {
        const tg_op *q = &p->ops[o];
        int32_t ts[TG_OP_MAX_IN + TG_OP_MAX_OUT];
        memcpy(ts, q->in, sizeof q->in);
        memcpy(ts + TG_OP_MAX_IN, q->out, sizeof q->out);
        for (int k = 0; k < TG_OP_MAX_IN + TG_OP_MAX_OUT; k++) {
            if (ts[k] < 0) continue;
            tg_tensor *x = &p->tensors[ts[k]];
            if (x->first_use < 0) x->first_use = o;
            x->last_use = o;
        }
    }

    p->pool_bytes[TG_POOL_PARAMS] = 768;
    p->pool_bytes[TG_POOL_GRADS] = 768;
    p->pool_bytes[TG_POOL_OPTIM] = 2048;
    p->pool_bytes[TG_POOL_ACTIVATIONS] = 768;
    p->pool_bytes[TG_POOL_INPUTS] = 512;
    p->pool_bytes[TG_POOL_WORKSPACE] = 768;
    for (int q = 0; q < TG_POOL_COUNT; q++) p->peak_bytes += p->pool_bytes[q];
    p->activation_live_peak = 528;
    p->flops_per_step = 1.5e9;
    p->bytes_per_step = 3.25e6;
    p->io = (tg_plan_io){
        .input_ids = T_IDS, .attention_mask = -1, .token_type_ids = -1, .position_ids = -1,
        .labels = T_LABELS, .logits = T_LOGITS, .loss = T_LOSS, .step = T_STEP,
        .total_steps = T_TOTAL, .lr = T_LR, .grad_norm = T_GNORM, .params_all = T_PARAMS_ALL,
        .grads_all = T_GRADS_ALL, .m_all = T_M_ALL, .v_all = T_V_ALL, .params_bf16_all = -1, .loss_norm = -1,
        .mlm_stream = -1};
    p->fingerprint = 0x0123456789abcdefull;
}

/* ---- field-for-field comparison ----------------------------------------------- */

#define D_INT(f)                                                                   \
    if (a->f != b->f) return snprintf(what, whatn, "%s", #f), 1
#define D_STR(f)                                                                   \
    if (strcmp(a->f, b->f)) return snprintf(what, whatn, "%s", #f), 1
#define D_BITS(f) /* floats compared bitwise: -0.0 and NaN payloads must survive */  \
    if (memcmp(&a->f, &b->f, sizeof a->f)) return snprintf(what, whatn, "%s", #f), 1

/* An op's parameters as the plan file sees them: each one's display name and bits, in
 * ops.def order. */
typedef struct param_bits {
    int n;
    const char *display[16];
    uint8_t bits[16][8];
    int size[16];
} param_bits;

static void add_bits(param_bits *pb, const char *display, const void *value, int size) {
    if (pb->n < 16) {
        pb->display[pb->n] = display, pb->size[pb->n] = size;
        memcpy(pb->bits[pb->n], value, (size_t)size);
    }
    pb->n++;
}
static void bits_i64(void *ctx, const char *display, int64_t *value) { add_bits(ctx, display, value, 8); }
static void bits_f32(void *ctx, const char *display, float *value) { add_bits(ctx, display, value, 4); }

static void params_bits(const tg_op *op, param_bits *pb) {
    tg_op_params p = op->p;
    memset(pb, 0, sizeof *pb);
    tg_param_visitor v = {pb, bits_i64, bits_f32};
    tg_op_params_visit(op->kind, &p, &v);
}

/* 0 when ops a and b (of one kind) have the same parameters bit for bit (-0.0 and NaN
 * payloads must survive); otherwise 1 with the first differing one named in `what`. */
static int params_diff(const tg_op *a, const tg_op *b, int o, char *what, size_t whatn) {
    param_bits pa, pb;
    params_bits(a, &pa);
    params_bits(b, &pb);
    if (pa.n != pb.n) return snprintf(what, whatn, "ops[%d].p: %d vs %d parameters", o, pa.n, pb.n), 1;
    for (int k = 0; k < pa.n && k < 16; k++)
        if (pa.size[k] != pb.size[k] || memcmp(pa.bits[k], pb.bits[k], (size_t)pa.size[k]))
            return snprintf(what, whatn, "ops[%d].p.%s", o, pa.display[k]), 1;
    return 0;
}

/* 0 when equal; otherwise 1 with the first differing field named in `what`. */
static int plan_diff(const tg_plan *a, const tg_plan *b, char *what, size_t whatn) {
    D_STR(model.source);
    D_STR(model.weights);
    D_INT(model.arch);
    D_INT(model.vocab_size);
    D_INT(model.hidden);
    D_INT(model.layers);
    D_INT(model.heads);
    D_INT(model.intermediate);
    D_INT(model.max_positions);
    D_INT(model.type_vocab_size);
    D_INT(model.pad_token_id);
    D_INT(model.gelu);
    D_BITS(model.layer_norm_eps);
    D_BITS(model.initializer_range);
    D_BITS(model.hidden_dropout);
    D_BITS(model.attention_dropout);
    D_BITS(model.embedding_dropout);
    D_BITS(model.classifier_dropout);

    D_STR(job_path);
    D_INT(train.task);
    D_INT(train.batch);
    D_INT(train.seq);
    D_INT(train.num_labels);
    D_INT(train.pad_id);
    D_INT(train.precision);
    D_INT(train.allow_tf32);
    D_INT(train.replicas);
    D_INT(train.zero_stage);
    D_INT(train.attention);
    D_INT(train.n_buckets);
    for (int k = 0; k < TG_MAX_BUCKETS; k++) D_INT(train.bucket_seq[k]);
    D_INT(run.last_batch);
    D_INT(run.skip_nonfinite);
    D_INT(run.max_skipped_steps);
    D_INT(run.qa_n_best);
    D_INT(run.qa_max_answer_length);
    D_BITS(run.qa_null_threshold);
    D_STR(run.train_data);
    D_STR(run.eval_data);
    D_INT(run.steps);
    D_INT(run.epochs);
    D_INT(run.log_every);
    D_INT(run.seed);
    D_INT(run.checkpoint_every);
    D_INT(run.keep_checkpoints);
    D_STR(run.checkpoint_dir);

    D_INT(n_tensors);
    for (int t = 0; t < a->n_tensors; t++) {
        D_STR(tensors[t].name);
        D_INT(tensors[t].dtype);
        D_INT(tensors[t].pool);
        D_INT(tensors[t].ndim);
        D_INT(tensors[t].flags);
        for (int d = 0; d < TG_MAX_DIMS; d++) D_INT(tensors[t].shape[d]);
        D_INT(tensors[t].offset);
        D_INT(tensors[t].bytes);
        D_INT(tensors[t].first_use);
        D_INT(tensors[t].last_use);
        D_INT(tensors[t].grad);
        D_INT(tensors[t].init);
        D_BITS(tensors[t].init_std);
        D_INT(tensors[t].master);
        D_INT(tensors[t].group);
    }
    D_INT(n_ops);
    for (int o = 0; o < a->n_ops; o++) {
        D_INT(ops[o].kind);
        D_INT(ops[o].phase);
        for (int k = 0; k < TG_OP_MAX_IN; k++) D_INT(ops[o].in[k]);
        for (int k = 0; k < TG_OP_MAX_OUT; k++) D_INT(ops[o].out[k]);
        if (params_diff(&a->ops[o], &b->ops[o], o, what, whatn)) return 1;
    }
    for (int p = 0; p <= TG_PHASE_COUNT; p++) D_INT(phase_begin[p]);
    for (int q = 0; q < TG_POOL_COUNT; q++) D_INT(pool_bytes[q]);
    D_INT(grads_share_activations);
    D_INT(peak_bytes);
    D_INT(activation_live_peak);
    D_BITS(flops_per_step);
    D_BITS(bytes_per_step);
    D_INT(io.input_ids);
    D_INT(io.attention_mask);
    D_INT(io.token_type_ids);
    D_INT(io.position_ids);
    D_INT(io.labels);
    D_INT(io.logits);
    D_INT(io.loss);
    D_INT(io.step);
    D_INT(io.total_steps);
    D_INT(io.lr);
    D_INT(io.grad_norm);
    D_INT(io.params_all);
    D_INT(io.grads_all);
    D_INT(io.m_all);
    D_INT(io.v_all);
    D_INT(io.params_bf16_all);
    D_INT(fingerprint);
    return 0;
}

/* The decoder up to its table checks: build_plan's ops carry every field and parameter but
 * are not consistent with their tensors (nor its layout sound), so the codec is tested
 * below tg_plan_validate_ops, which test_plan_file_refuses_* test on compiled plans. */
static int decode_tables(const uint8_t *bytes, size_t len, const char *name, tg_plan *back, tg_err *err) {
    return tg_plan_decode_checked(bytes, len, name, TG_PLAN_CHECK_TABLES, back, err);
}

/* Encodes p, then decodes the bytes; returns the decode's result. */
static int encode_decode(const tg_plan *p, tg_plan *back, tg_err *err) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (tg_plan_encode(p, &bytes, &len, err)) return -2;
    int rc = decode_tables(bytes, len, "plan.tgp", back, err);
    free(bytes);
    return rc;
}

static int has(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

/* ---- round trip ------------------------------------------------------------------ */

TG_TEST(test_plan_file_round_trip) {
    tg_plan p, back;
    build_plan(&p);
    p.ops[4].in[TG_OP_MAX_IN - 1] = T_LABELS; /* the last input slot is encoded too */
    p.ops[1].p.matmul.bias_grad = 2;
    p.ops[1].p.matmul.activation = TG_MATMUL_ACT_GELU_BWD; /* matmul's last integer parameter */
    p.ops[1].in[3] = T_H;                                  /* with the pre-activation it reads */
    tg_err err = {{0}};
    int rc = encode_decode(&p, &back, &err);
    REQUIRE(rc == 0, "round trip failed: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "decoded plan differs at %s", what);
    CHECK(back.ops[4].in[TG_OP_MAX_IN - 1] == T_LABELS && back.train.attention == TG_ATTENTION_UNFUSED,
          "input slot %d or the attention mode lost", TG_OP_MAX_IN - 1);
    CHECK(back.ops[1].p.matmul.bias_grad == 2, "matmul bias_grad lost");
    CHECK(back.tensors[T_CLS_B].group == 9 && back.tensors[T_WTE].group == -1, "packed group lost");
    CHECK(back.ops[1].p.matmul.activation == TG_MATMUL_ACT_GELU_BWD && back.ops[1].in[3] == T_H,
          "matmul activation or its in3 lost");
    tg_plan_free(&p);
    tg_plan_free(&back);
}

/* Every parameter of every kind through the plan file: each gets a value whose bits show a
 * lost, truncated or misplaced field (wide and negative integers; -0.0, a NaN payload, a
 * denormal, infinity and the largest float). */
typedef struct param_fill {
    int kind, j;
} param_fill;

static void fill_i64(void *ctx, const char *display, int64_t *value) {
    param_fill *f = ctx;
    int64_t v = (int64_t)(0x0123456789abcdefull ^ (uint64_t)f->kind << 40 ^ (uint64_t)f->j << 56);
    *value = f->j % 2 ? -v : v;
    f->j++;
}

static void fill_f32(void *ctx, const char *display, float *value) {
    param_fill *f = ctx;
    static const uint32_t bits[6] = {0x80000000u, 0x7fc12345u, 0x00000001u, 0xff800000u, 0x7f7fffffu, 0x40490fd0u};
    memcpy(value, &bits[(f->kind + f->j) % 6], 4);
    f->j++;
}

TG_TEST(test_plan_file_round_trip_every_op) {
    tg_plan p, back;
    build_plan(&p);
    tg_op *ops = realloc(p.ops, sizeof *ops * (size_t)(p.n_ops + TG_OP_COUNT));
    REQUIRE(ops, "out of memory");
    p.ops = ops;
    /* Each kind once more at the end of the optimizer phase, its slots unused. */
    int first = p.n_ops, params = 0;
    for (int k = 0; k < TG_OP_COUNT; k++) {
        tg_op *op = add_op(&p, k, TG_PHASE_OPTIMIZER);
        memset(&op->p, 0, sizeof op->p);
        param_fill f = {k, 0};
        tg_param_visitor v = {&f, fill_i64, fill_f32};
        tg_op_params_visit(k, &op->p, &v);
        params += f.j;
        /* The decoder refuses an activation it does not know (test_plan_file_inconsistent_tables). */
        if (k == TG_OP_MATMUL) op->p.matmul.activation = TG_MATMUL_ACT_NONE;
    }
    p.phase_begin[TG_PHASE_COUNT] = p.n_ops;
    tg_err err = {{0}};
    REQUIRE(encode_decode(&p, &back, &err) == 0, "round trip failed: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "decoded plan differs at %s", what);
    int seen = 0;
    for (int o = first; o < back.n_ops; o++) {
        param_bits pb;
        params_bits(&back.ops[o], &pb);
        seen += pb.n;
    }
    CHECK(params > 50 && seen == params, "%d parameters decoded of %d", seen, params);
    tg_plan_free(&p);
    tg_plan_free(&back);
}

TG_TEST(test_plan_file_diff_detects_changes) {
    /* The comparison itself must see a one-field change, or the round trip proves nothing. */
    tg_plan a, b;
    build_plan(&a);
    build_plan(&b);
    char what[128] = "";
    CHECK(plan_diff(&a, &b, what, sizeof what) == 0, "identical plans differ at %s", what);
    a.ops[1].p.matmul.alpha = b.ops[1].p.matmul.alpha = -0.0f;
    CHECK(plan_diff(&a, &b, what, sizeof what) == 0, "identical plans differ at %s", what);
    b.ops[1].p.matmul.alpha = 0.0f; /* equal as floats, different bits */
    CHECK(plan_diff(&a, &b, what, sizeof what) == 1 && has(what, "ops[1].p.alpha"),
          "-0.0 vs 0.0 not seen (got '%s')", what);
    b.ops[1].p.matmul.alpha = -0.0f;
    b.ops[7].p.schedule.warmup = 11;
    CHECK(plan_diff(&a, &b, what, sizeof what) == 1 && has(what, "ops[7].p.warmup"),
          "an integer parameter's change not seen (got '%s')", what);
    b.ops[7].p.schedule.warmup = a.ops[7].p.schedule.warmup;
    b.run.seed ^= 1ull << 63;
    CHECK(plan_diff(&a, &b, what, sizeof what) == 1 && has(what, "run.seed"),
          "seed change not seen (got '%s')", what);
    b.run.seed = a.run.seed;
    b.tensors[T_V_ALL].name[0] = 'w';
    CHECK(plan_diff(&a, &b, what, sizeof what) == 1 && has(what, "name"),
          "name change not seen (got '%s')", what);
    tg_plan_free(&a);
    tg_plan_free(&b);
}

TG_TEST(test_plan_file_deterministic) {
    tg_plan p;
    build_plan(&p);
    tg_err err;
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    REQUIRE(tg_plan_encode(&p, &a, &na, &err) == 0, "%s", err.msg);
    /* Garbage in string tails (after the NUL) must not reach the file. */
    memset(p.model.source + strlen(p.model.source) + 1, 'Z', 16);
    int rc = tg_plan_encode(&p, &b, &nb, &err);
    CHECK(rc == 0, "%s", err.msg);
    CHECK(na == nb && na > 40 && memcmp(a, b, na) == 0, "two encodings differ (%zu vs %zu bytes)",
          na, nb);
    CHECK(memcmp(a, "TGPLAN\0\0", 8) == 0, "magic not at the start");
    CHECK(a[8] == TG_PLAN_VERSION && a[9] == 0 && a[10] == 0 && a[11] == 0,
          "version not little-endian u32 at offset 8");
    uint64_t csize = 0;
    for (int i = 7; i >= 0; i--) csize = csize << 8 | a[24 + i];
    CHECK(csize + 40 == na, "header compressed size %llu, file %zu", (unsigned long long)csize,
          na);
    free(a);
    free(b);
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_empty_tables) {
    tg_plan p, back;
    memset(&p, 0, sizeof p);
    p.model.vocab_size = 1;
    p.train = (tg_plan_train){.batch = 1, .seq = 1, .num_labels = 2, .replicas = 1, .n_buckets = 1, .bucket_seq = {1},
                              .grad_accumulation = 1};
    p.run.steps = 1, p.run.log_every = 1, p.run.qa_n_best = 1, p.run.qa_max_answer_length = 1;
    p.io = (tg_plan_io){-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    tg_err err;
    REQUIRE(encode_decode(&p, &back, &err) == 0, "%s", err.msg);
    CHECK(back.n_ops == 0 && back.n_tensors == 0 && !back.ops && !back.tensors,
          "empty plan decoded with tables");
    tg_plan_free(&back);
}

/* A plan whose ops are all of one kind: a name table of one entry (none: test_plan_file_empty_tables). */
TG_TEST(test_plan_file_one_op_kind) {
    tg_plan p, back;
    build_plan(&p);
    for (int o = 0; o < p.n_ops; o++) {
        memset(&p.ops[o].p, 0, sizeof p.ops[o].p);
        p.ops[o].kind = TG_OP_FILL;
        p.ops[o].p.fill.value = (float)o + 0.5f;
    }
    tg_err err = {{0}};
    REQUIRE(encode_decode(&p, &back, &err) == 0, "one kind: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0 && back.n_ops == p.n_ops &&
              back.ops[p.n_ops - 1].kind == TG_OP_FILL && back.ops[p.n_ops - 1].p.fill.value == (float)p.n_ops - 0.5f,
          "one kind: decoded plan differs at %s", what);
    tg_plan_free(&back);
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_write_read) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/plan.tgp", dir);
    tg_plan p, back;
    build_plan(&p);
    tg_err err;
    REQUIRE(tg_plan_write(&p, path, &err) == 0, "write: %s", err.msg);
    CHECK(tg_test_count_files(dir) == 1, "write left %d files", tg_test_count_files(dir));
    /* Overwrite in place with a changed plan; the reader sees the new one. */
    p.run.steps = 12345;
    REQUIRE(tg_plan_write(&p, path, &err) == 0, "rewrite: %s", err.msg);
    CHECK(tg_test_count_files(dir) == 1, "rewrite left %d files", tg_test_count_files(dir));
    /* Read back as tg_plan_read does, decoded up to the table checks (decode_tables). */
    FILE *f = fopen(path, "rb");
    REQUIRE(f, "cannot open %s", path);
    uint8_t file[4096];
    const size_t len = fread(file, 1, sizeof file, f);
    fclose(f);
    REQUIRE(len > 40 && len < sizeof file, "read %zu bytes", len);
    REQUIRE(decode_tables(file, len, path, &back, &err) == 0, "read: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "read plan differs at %s", what);
    CHECK(back.run.steps == 12345, "old plan read back");
    tg_plan_free(&back);

    char missing[640];
    snprintf(missing, sizeof missing, "%s/none.tgp", dir);
    CHECK(tg_plan_read(missing, &back, &err) == -1 && has(err.msg, missing),
          "missing file: '%s'", err.msg);
    tg_plan_free(&p);
}

/* A file that grows while it is read: 64 bytes more appended after the first, short read. */
static char g_growing_path[600];
static void grow_file(int fd) {
    (void)fd;
    FILE *f = fopen(g_growing_path, "ab");
    if (!f) return;
    for (int i = 0; i < 64; i++) fputc(0x5a, f);
    fclose(f);
}

/* A file cut to 40 bytes (its header) after the first, short read. */
static void shrink_file(int fd) {
    (void)fd;
    if (truncate(g_growing_path, 40) != 0) g_growing_path[0] = 0;
}

/* tg_plan_read reads the size fstat gave, however read(2) splits it: a short first read
 * (then an interrupted one) is followed by reads of the rest, and bytes appended meanwhile
 * are not read (nor written past the buffer): the outcome is that of a plain read. */
TG_TEST(test_plan_file_read_short_counts) {
    snprintf(g_growing_path, sizeof g_growing_path, "%s/plan.tgp", tg_test_tmpdir());
    tg_plan p, back;
    build_plan(&p);
    tg_err err, plain_err;
    REQUIRE(tg_plan_write(&p, g_growing_path, &err) == 0, "write: %s", err.msg);
    /* (this small plan's tables decode; its shapes are not all consistent, which the
     * read reports the same way every time) */
    const int plain = tg_plan_read(g_growing_path, &back, &plain_err);
    CHECK(plain == -1 && strstr(plain_err.msg, "op 1 (matmul): in[0]: A != batch*M*K"), "plain read: %s", plain_err.msg);
    tg_plan_free(&back);
    for (size_t first = 1; first <= 33; first += 16) {
        REQUIRE(tg_plan_write(&p, g_growing_path, &err) == 0, "write: %s", err.msg);
        memset(&err, 0, sizeof err);
        tg_test_short_read(first, grow_file);
        const int rc = tg_plan_read(g_growing_path, &back, &err);
        tg_test_short_read(0, NULL);
        CHECK(rc == plain && (rc == 0 || !strcmp(err.msg, plain_err.msg)), "first read of %zu bytes: %d '%s'", first, rc,
              err.msg);
        if (rc == 0) {
            char what[128] = "";
            CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "first read of %zu bytes: plan differs at %s", first, what);
        }
        tg_plan_free(&back);
        /* An interrupted read after the short one is tried again. */
        REQUIRE(tg_plan_write(&p, g_growing_path, &err) == 0, "write: %s", err.msg);
        tg_test_short_read(first, NULL);
        tg_test_fail_read(1, EINTR);
        const int rc2 = tg_plan_read(g_growing_path, &back, &err);
        tg_test_short_read(0, NULL);
        tg_test_fail_read(0, 0);
        CHECK(rc2 == plain && (rc2 == 0 || !strcmp(err.msg, plain_err.msg)), "first read of %zu bytes, then EINTR: %d '%s'",
              first, rc2, err.msg);
        tg_plan_free(&back);
        /* Cut short meanwhile: what was read is decoded, and found truncated. */
        REQUIRE(tg_plan_write(&p, g_growing_path, &err) == 0, "write: %s", err.msg);
        tg_test_short_read(first, shrink_file);
        const int rc3 = tg_plan_read(g_growing_path, &back, &err);
        tg_test_short_read(0, NULL);
        CHECK(g_growing_path[0] && rc3 == -1 && strstr(err.msg, "/plan.tgp: truncated: header says 937 compressed bytes, file has 0"),
              "first read of %zu bytes, then the file cut: %d '%s'", first, rc3, err.msg);
        tg_plan_free(&back);
    }
    tg_plan_free(&p);
}

/* ---- damaged files --------------------------------------------------------------- */

TG_TEST(test_plan_file_truncated) {
    tg_plan p, back;
    build_plan(&p);
    tg_err err;
    uint8_t *bytes;
    size_t len;
    REQUIRE(tg_plan_encode(&p, &bytes, &len, &err) == 0, "%s", err.msg);
    size_t cuts[] = {0, 3, 8, 20, 39, 40, 41, len / 2, len - 1};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        memset(&err, 0, sizeof err);
        int rc = decode_tables(bytes, cuts[c], "plan.tgp", &back, &err);
        CHECK(rc == -1, "cut at %zu accepted", cuts[c]);
        CHECK(strncmp(err.msg, "plan.tgp: truncated", 19) == 0, "cut at %zu: '%s'", cuts[c],
              err.msg);
        CHECK(!back.ops && !back.tensors, "failed decode left tables");
    }
    /* Past the header the message gives both sizes. */
    char want[128];
    snprintf(want, sizeof want, "header says %zu compressed bytes, file has %zu", len - 40,
             len / 2 - 40);
    decode_tables(bytes, len / 2, "plan.tgp", &back, &err);
    CHECK(has(err.msg, want), "'%s' lacks '%s'", err.msg, want);

    /* The same through a file on disk. */
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/cut.tgp", dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot create %s", path);
    fwrite(bytes, 1, len - 5, f);
    fclose(f);
    CHECK(tg_plan_read(path, &back, &err) == -1 && has(err.msg, path) &&
              has(err.msg, "truncated"),
          "truncated file: '%s'", err.msg);
    free(bytes);
    tg_plan_free(&p);
}

/* Encodes the test plan, lets `patch` damage it, and returns the decode message. */
static int decode_patched(void (*patch)(uint8_t *, size_t), tg_err *err) {
    tg_plan p, back;
    build_plan(&p);
    uint8_t *bytes;
    size_t len;
    if (tg_plan_encode(&p, &bytes, &len, err)) return -2;
    patch(bytes, len);
    int rc = decode_tables(bytes, len, "plan.tgp", &back, err);
    free(bytes);
    tg_plan_free(&p);
    tg_plan_free(&back);
    return rc;
}

static void flip_payload(uint8_t *b, size_t len) { b[40 + (len - 40) / 2] ^= 0x10; }
static void flip_checksum(uint8_t *b, size_t len) { b[35] ^= 0x01; }
static void set_future_version(uint8_t *b, size_t len) { b[8] = TG_PLAN_VERSION + 1; }
static int g_old_version;
static void set_old_version(uint8_t *b, size_t len) { b[8] = (uint8_t)g_old_version; }
static void bad_magic(uint8_t *b, size_t len) { b[1] = 'X'; }
static void bad_usize(uint8_t *b, size_t len) { b[16] ^= 0x04; }

TG_TEST(test_plan_file_corrupt_payload) {
    tg_err err = {{0}};
    CHECK(decode_patched(flip_payload, &err) == -1, "flipped payload byte accepted");
    CHECK(has(err.msg, "plan.tgp: checksum mismatch (file corrupt)"), "'%s'", err.msg);
}

TG_TEST(test_plan_file_corrupt_checksum) {
    tg_err err = {{0}};
    CHECK(decode_patched(flip_checksum, &err) == -1, "flipped checksum byte accepted");
    CHECK(has(err.msg, "plan.tgp: checksum mismatch"), "'%s'", err.msg);
}

TG_TEST(test_plan_file_corrupt_size) {
    /* The uncompressed size sits outside the checksum; it is checked against the frame. */
    tg_err err = {{0}};
    CHECK(decode_patched(bad_usize, &err) == -1, "wrong payload size accepted");
    CHECK(has(err.msg, "plan.tgp: ") && has(err.msg, "corrupt"), "'%s'", err.msg);
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

TG_TEST(test_plan_file_impossible_size) {
    /* A 57-byte file whose header and zstd frame agree on an 8 GiB payload (one RLE block
     * and a correct checksum) is refused before the payload buffer is allocated. */
    uint8_t f[64] = {0}, *z = f + 40;
    uint64_t usize = 8ull << 30;
    memcpy(f, "TGPLAN\0\0", 8);
    put_le(f + 8, TG_PLAN_VERSION, 4);
    size_t n = 0;
    put_le(z, 0xFD2FB528u, 4), n += 4; /* zstd frame magic */
    z[n++] = 0xE0;                     /* single segment, 8-byte content size */
    put_le(z + n, usize, 8), n += 8;
    put_le(z + n, 1 | 1 << 1 | 131072u << 3, 3), n += 3; /* last block, RLE, 128 KiB */
    z[n++] = 0;
    put_le(f + 16, usize, 8);
    put_le(f + 24, n, 8);
    put_le(f + 32, XXH64(z, n, 0), 8);
    tg_plan back;
    tg_err err = {{0}};
    CHECK(tg_plan_decode(f, 40 + n, "plan.tgp", &back, &err) == -1, "8 GiB payload claim accepted");
    CHECK(has(err.msg, "plan.tgp: payload size 8589934592 is impossible (file corrupt)"), "'%s'", err.msg);
}

TG_TEST(test_plan_file_wrong_version) {
    tg_err err = {{0}};
    CHECK(decode_patched(set_future_version, &err) == -1, "version %d accepted", TG_PLAN_VERSION + 1);
    char want[128];
    snprintf(want, sizeof want,
             "plan.tgp: plan format version %d, this build reads version %d (recompile the job)",
             TG_PLAN_VERSION + 1, TG_PLAN_VERSION);
    CHECK(has(err.msg, want), "'%s'", err.msg);
    /* Every older format is refused: version 3 added the attention ops and 8 input slots,
     * version 4 the attention's keep bits (its backward's in4 was the step counter),
     * version 5 the matmul's fused bias gradient (bias_grad, out1) and the job's fuse_bias_grad,
     * version 6 the matmul's GELU epilogue (activation, out2 / in3), the residual LayerNorm ops
     * the tensors' packed group and the job's fuse_gelu, fuse_residual_layernorm and fuse_qkv,
     * version 7 parameter gradients without a ZERO of the whole buffer (first writers
     * overwrite: the LayerNorm backwards' overwrite), version 8 the job's data_parallel and
     * TG_OP_ALL_REDUCE, version 9 ZeRO-1 (the job's zero_stage, AdamW's zero_slice,
     * TG_OP_ALL_GATHER), version 10 the train and run settings in place of the whole job and
     * each op's typed parameters (only its set's fields, in plan/ops.def order) instead of
     * nine integer and six float slots, version 11 the parameter classes (frozen parameters
     * and buffers, their pools and flags), version 12 op kinds by name (the payload's table
     * of the kind names the plan uses; each op its index there) instead of enum numbers,
     * so that an op added to plan/ops.def no longer needs a new version; version 27 the
     * image models' channels-last (NHWC) activations, pixel_values [B, S, S, C], and their
     * pointwise convolutions as MATMULs (the same op names, another meaning); version 28
     * the batch norms' fused ReLU6 (BATCHNORM and BATCHNORM_BWD's relu6, the backward's in4). */
    CHECK(TG_PLAN_VERSION > 11, "plan version %d still reads version 11 plans", TG_PLAN_VERSION);
    for (g_old_version = 2; g_old_version < TG_PLAN_VERSION; g_old_version++) {
        snprintf(want, sizeof want, "plan.tgp: plan format version %d, this build reads version %d (recompile the job)",
                 g_old_version, TG_PLAN_VERSION);
        CHECK(decode_patched(set_old_version, &err) == -1 && has(err.msg, want), "a version %d plan: '%s'",
              g_old_version, err.msg);
    }
}

TG_TEST(test_plan_file_bad_magic) {
    tg_err err = {{0}};
    CHECK(decode_patched(bad_magic, &err) == -1, "bad magic accepted");
    CHECK(has(err.msg, "plan.tgp: not a tunegraph plan (bad magic)"), "'%s'", err.msg);
    /* A job file handed to the plan reader. */
    const char *text = "model = bert-tiny\n";
    tg_plan back;
    CHECK(tg_plan_decode((const uint8_t *)text, strlen(text), "job.txt", &back, &err) == -1 &&
              has(err.msg, "job.txt: not a tunegraph plan (bad magic)"),
          "'%s'", err.msg);
}

/* ---- inconsistent tables ------------------------------------------------------- */

typedef void (*plan_patch)(tg_plan *);
static void bad_input(tg_plan *p) { p->ops[1].in[1] = 9999; }
static void bad_output(tg_plan *p) { p->ops[8].out[0] = -2; }
static void bad_phase(tg_plan *p) { p->ops[3].phase = TG_PHASE_FORWARD; }
static void bad_phase_begin(tg_plan *p) { p->phase_begin[1] = 8; }
static void bad_phase_end(tg_plan *p) { p->phase_begin[TG_PHASE_COUNT] = 9; }
static void bad_offset(tg_plan *p) { p->tensors[T_V_ALL].offset = 1536; }
static void bad_pool(tg_plan *p) { p->tensors[T_H].pool = TG_POOL_COUNT; }
static void unknown_flag(tg_plan *p) { p->tensors[T_H].flags |= 1 << 11; }
static void frozen_in_params(tg_plan *p) { p->tensors[T_WTE].flags |= TG_TENSOR_FROZEN; }
static void frozen_outside_pool(tg_plan *p) { p->tensors[T_H].flags |= TG_TENSOR_FROZEN; }
static void buffer_pool_intruder(tg_plan *p) {
    p->tensors[T_H].pool = TG_POOL_BUFFERS;
    p->pool_bytes[TG_POOL_BUFFERS] = 1024;
}
static void persistent_activation(tg_plan *p) { p->tensors[T_H].flags |= TG_TENSOR_PERSISTENT; }
static void frozen_with_grad(tg_plan *p) {
    p->tensors[T_WTE].flags = TG_TENSOR_FROZEN; /* still has its gradient */
    p->tensors[T_WTE].pool = TG_POOL_FROZEN;
    p->pool_bytes[TG_POOL_FROZEN] = 1024;
}
static void bad_init(tg_plan *p) { p->tensors[T_H].init = 9; }
static void bad_dtype(tg_plan *p) { p->tensors[T_H].dtype = 5; }
static void bad_ndim(tg_plan *p) { p->tensors[T_H].ndim = 5; }
static void bad_bytes(tg_plan *p) { p->tensors[T_H].bytes -= 4; }
static void huge_shape(tg_plan *p) { p->tensors[T_H].shape[0] = (int64_t)1 << 62; }
static void bad_io(tg_plan *p) { p->io.loss = N_T; }
static void bad_grad(tg_plan *p) { p->tensors[T_WTE].grad = 100; }
static void bad_name(tg_plan *p) { memset(p->tensors[T_H].name, 'x', TG_NAME_MAX); }
static void bad_source(tg_plan *p) { memset(p->model.source, 'x', TG_PATH_MAX); }
static void bad_arch(tg_plan *p) { p->model.arch = TG_ARCH_COUNT; }
static void bad_kv_heads(tg_plan *p) {
    p->model.arch = TG_ARCH_LLAMA, p->model.heads = 4, p->model.kv_heads = 3, p->model.rope_type = TG_ROPE_DEFAULT;
}
static void bad_rope_type(tg_plan *p) {
    p->model.arch = TG_ARCH_LLAMA, p->model.heads = 4, p->model.kv_heads = 2, p->model.rope_type = TG_ROPE_NONE;
}
/* The other Llama model refusals: no kv heads (never divided by), no heads, a rope type
 * past the enum. */
static void zero_kv_heads(tg_plan *p) {
    p->model.arch = TG_ARCH_LLAMA, p->model.heads = 4, p->model.kv_heads = 0, p->model.rope_type = TG_ROPE_DEFAULT;
}
static void zero_heads(tg_plan *p) {
    p->model.arch = TG_ARCH_LLAMA, p->model.heads = 0, p->model.kv_heads = 2, p->model.rope_type = TG_ROPE_DEFAULT;
}
static void rope_type_past(tg_plan *p) {
    p->model.arch = TG_ARCH_LLAMA, p->model.heads = 4, p->model.kv_heads = 4, p->model.rope_type = TG_ROPE_TYPE_COUNT;
}
static void bad_last_input(tg_plan *p) { p->ops[1].in[TG_OP_MAX_IN - 1] = 9999; }
static void bad_attention(tg_plan *p) { p->train.attention = TG_ATTENTION_MODE_COUNT; }
static void bad_activation(tg_plan *p) { p->ops[1].p.matmul.activation = 3; }
static void activation_without_pre(tg_plan *p) { p->ops[1].p.matmul.activation = TG_MATMUL_ACT_GELU; }
static void bad_group(tg_plan *p) { p->tensors[T_WTE].group = N_T; }
static void bad_replicas(tg_plan *p) { p->train.replicas = 0; }
static void bad_task(tg_plan *p) { p->train.task = TG_TASK_COUNT; }
static void bad_batch(tg_plan *p) { p->train.batch = 0; }
static void bad_seq(tg_plan *p) { p->train.seq = -4; }
static void bad_num_labels(tg_plan *p) { p->train.num_labels = 0; }
static void bad_pad_id(tg_plan *p) { p->train.pad_id = 16; }
static void bad_precision(tg_plan *p) { p->train.precision = TG_PREC_COUNT; }
static void bad_allow_tf32(tg_plan *p) { p->train.allow_tf32 = 2; }
static void bad_zero_stage(tg_plan *p) { p->train.replicas = 1; }
static void bad_steps_and_epochs(tg_plan *p) { p->run.epochs = 2; }
static void no_steps_or_epochs(tg_plan *p) { p->run.steps = 0; }
static void bad_log_every(tg_plan *p) { p->run.log_every = 0; }
static void bad_train_data(tg_plan *p) { memset(p->run.train_data, 'x', TG_PATH_MAX); }
static void bad_job_path(tg_plan *p) { memset(p->job_path, 'x', TG_PATH_MAX); }

TG_TEST(test_plan_file_inconsistent_tables) {
    struct {
        plan_patch patch;
        const char *want;
    } cases[] = {
        {bad_input, "plan.tgp: op 1 (matmul) input 1 refers to tensor 9999 of 19"},
        {bad_output, "plan.tgp: op 8 (grad_norm) output 0 refers to tensor -2 of 19"},
        {bad_phase, "plan.tgp: op 3 (fill) has phase 0 but sits in the backward phase"},
        {bad_phase_begin, "plan.tgp: phase backward begins at op 8 but ends at op 7"},
        {bad_phase_end, "plan.tgp: phase table runs 0..9, expected 0..10"},
        {bad_offset, "plan.tgp: tensor 17 (v_all) at offset 1536 + 768 bytes runs past the "
                     "optim pool (2048 bytes)"},
        {bad_pool, "plan.tgp: tensor 6 (h) is in pool 9 of 9"},
        {unknown_flag, "plan.tgp: tensor 6 (h) has unknown flag bits 0x800"},
        {frozen_in_params, "plan.tgp: tensor 0 (bert.embeddings.word_embeddings.weight) in the params pool: it has "
                           "more than one of the flags param, frozen and buffer"},
        {frozen_outside_pool, "plan.tgp: tensor 6 (h) in the activations pool: a frozen parameter must be in the "
                              "frozen pool"},
        {buffer_pool_intruder, "plan.tgp: tensor 6 (h) in the buffers pool: the buffers pool holds buffers only"},
        {persistent_activation, "plan.tgp: tensor 6 (h) in the activations pool: only a buffer may be persistent"},
        {frozen_with_grad, "plan.tgp: tensor 0 (bert.embeddings.word_embeddings.weight) in the frozen pool: only a "
                           "trainable parameter has a gradient"},
        {bad_init, "plan.tgp: tensor 6 (h) has init rule 9 of 6"},
        {bad_dtype, "plan.tgp: tensor 6 (h) has dtype 5"},
        {bad_ndim, "plan.tgp: tensor 6 (h) has 5 dims"},
        {bad_bytes, "plan.tgp: tensor 6 (h) holds 252 bytes, but its shape and dtype make 256"},
        {huge_shape, "plan.tgp: tensor 6 (h) holds 256 bytes, but its shape and dtype make more than "},
        {bad_io, "plan.tgp: io loss refers to tensor 19 of 19"},
        {bad_grad, "plan.tgp: tensor 0 (bert.embeddings.word_embeddings.weight) gradient"},
        {bad_name, "plan.tgp: tensor 6 name is 96 bytes, its field holds at most 95"},
        {bad_source, "plan.tgp: model source is 512 bytes"},
        {bad_arch, "plan.tgp: model arch 5"},
        {bad_kv_heads, "plan.tgp: model kv_heads 3 does not divide heads 4"},
        {bad_rope_type, "plan.tgp: model rope_type 0 is not a known rope type"},
        {zero_kv_heads, "plan.tgp: model kv_heads 0 does not divide heads 4"},
        {zero_heads, "plan.tgp: model kv_heads 2 does not divide heads 0"},
        {rope_type_past, "plan.tgp: model rope_type 3 is not a known rope type"},
        {bad_last_input, "plan.tgp: op 1 (matmul) input 7 refers to tensor 9999 of 19"},
        {bad_attention, "plan.tgp: train attention mode 2 is not a known mode"},
        {bad_activation, "plan.tgp: op 1 (matmul) has activation=3 (0, 1 or 2 allowed)"},
        {activation_without_pre, "plan.tgp: op 1 (matmul) with activation=1 lacks its pre-activation (out2)"},
        {bad_group, "plan.tgp: tensor 0 (bert.embeddings.word_embeddings.weight) packed group refers to tensor 19 of 19"},
        {bad_replicas, "plan.tgp: train replicas 0 is not in [1, 64]"},
        {bad_task, "plan.tgp: train task 4 is not a known task"},
        {bad_batch, "plan.tgp: train batch 0 is not a positive row count"},
        {bad_seq, "plan.tgp: train seq -4 is not a positive length"},
        {bad_num_labels, "plan.tgp: train num_labels 0 is not 2 or more"},
        {bad_pad_id, "plan.tgp: train pad_id 16 is outside the model's vocabulary (vocab_size 16)"},
        {bad_precision, "plan.tgp: train precision 3 is not a known precision"},
        {bad_allow_tf32, "plan.tgp: train allow_tf32 2 is not a boolean"},
        {bad_zero_stage, "plan.tgp: train zero_stage 1 is not 0, or 1 with replicas >= 2"},
        {bad_steps_and_epochs, "plan.tgp: run steps 100 and epochs 2: exactly one must be positive"},
        {no_steps_or_epochs, "plan.tgp: run steps 0 and epochs 0: exactly one must be positive"},
        {bad_log_every, "plan.tgp: run log_every 0 is not a positive step count"},
        {bad_train_data, "plan.tgp: run train_data is 512 bytes, its field holds at most 511"},
        {bad_job_path, "plan.tgp: job path is 512 bytes"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_plan p, back;
        build_plan(&p);
        cases[c].patch(&p);
        tg_err err = {{0}};
        int rc = encode_decode(&p, &back, &err);
        CHECK(rc == -1, "case %zu accepted (rc %d): want '%s'", c, rc, cases[c].want);
        CHECK(has(err.msg, cases[c].want), "case %zu: '%s' lacks '%s'", c, err.msg,
              cases[c].want);
        CHECK(!back.ops && !back.tensors && back.n_ops == 0, "case %zu left tables", c);
        tg_plan_free(&p);
        tg_plan_free(&back);
    }
}

/* ---- train and run settings edited inside a sealed file ---------------------------- */

/* Where the train settings start in the test plan's payload: after the model config
 * (its two strings and 34 four-byte fields) and the job path. */
static size_t train_offset(const tg_plan *p) {
    return 4 + strlen(p->model.source) + 4 + strlen(p->model.weights) + 34 * 4 + 4 + strlen(p->job_path);
}

static void put32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* The decompressed payload of an encoded plan file (malloc'd), or NULL. */
static uint8_t *payload_of(const uint8_t *file, size_t len, size_t *usize) {
    *usize = ZSTD_getFrameContentSize(file + 40, len - 40);
    uint8_t *payload = malloc(*usize ? *usize : 1);
    if (payload && ZSTD_decompress(payload, *usize, file + 40, len - 40) != *usize) {
        free(payload);
        return NULL;
    }
    return payload;
}

/* Compresses `payload` and seals it under `file`'s magic, version and flags (sizes and
 * checksum recomputed), then decodes the result: only the decoder's own checks stand
 * between an edited payload and a plan. -2 if the sealing itself fails. */
static int reseal_decode(const uint8_t *file, const uint8_t *payload, size_t usize, tg_plan *back, tg_err *err) {
    size_t bound = ZSTD_compressBound(usize);
    uint8_t *sealed = malloc(40 + bound);
    int rc = -2;
    size_t csize = sealed ? ZSTD_compress(sealed + 40, bound, payload, usize, 3) : 0;
    if (sealed && !ZSTD_isError(csize)) {
        memcpy(sealed, file, 16); /* magic, version, flags */
        put64(sealed + 16, usize);
        put64(sealed + 24, csize);
        put64(sealed + 32, XXH64(sealed + 40, csize, 0));
        rc = decode_tables(sealed, 40 + csize, "plan.tgp", back, err);
    }
    free(sealed);
    return rc;
}

/* Encodes the test plan, writes `value` as the int32 at payload offset `at`, re-seals the
 * file and decodes it. */
static int decode_edited(size_t at, int32_t value, tg_plan *back, tg_err *err) {
    tg_plan p;
    build_plan(&p);
    uint8_t *file = NULL, *payload = NULL;
    size_t len = 0, usize = 0;
    int rc = -2;
    if (tg_plan_encode(&p, &file, &len, err) == 0 && (payload = payload_of(file, len, &usize)) && at + 4 <= usize) {
        put32(payload + at, (uint32_t)value);
        rc = reseal_decode(file, payload, usize, back, err);
    }
    free(payload);
    free(file);
    tg_plan_free(&p);
    return rc;
}

TG_TEST(test_plan_file_edited_train_field) {
    tg_plan p, back;
    build_plan(&p);
    const size_t train = train_offset(&p);
    tg_err err = {{0}};
    /* The edit path itself: the unchanged value (batch 2) re-sealed reads back whole. */
    REQUIRE(decode_edited(train + 4, p.train.batch, &back, &err) == 0, "re-sealed plan refused: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "re-sealed plan differs at %s", what);
    tg_plan_free(&back);
    struct {
        size_t at;
        int32_t value;
        const char *want;
    } cases[] = {
        {train + 4, 0, "plan.tgp: train batch 0 is not a positive row count"},
        {train + 16, -1, "plan.tgp: train pad_id -1 is outside the model's vocabulary (vocab_size 16)"},
        {train + 20, 7, "plan.tgp: train precision 7 is not a known precision"},
        {train + 28, TG_MAX_DATA_PARALLEL + 1, "plan.tgp: train replicas 65 is not in [1, 64]"},
        {train + 32, 2, "plan.tgp: train zero_stage 2 is not 0, or 1 with replicas >= 2"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(&err, 0, sizeof err);
        CHECK(decode_edited(cases[c].at, cases[c].value, &back, &err) == -1, "case %zu accepted: want '%s'", c,
              cases[c].want);
        CHECK(has(err.msg, cases[c].want), "case %zu: '%s' lacks '%s'", c, err.msg, cases[c].want);
        CHECK(!back.ops && !back.tensors, "case %zu left tables", c);
        tg_plan_free(&back);
    }
    tg_plan_free(&p);
}

/* ---- op kinds by name ------------------------------------------------------------- */

/* The payload's op kind name table: where it lies, and its names in table order. */
#define MAX_TABLE 128
typedef struct name_table {
    size_t at, end; /* payload bytes [at, end): the count, then each name as length + bytes */
    int n;
    char names[MAX_TABLE][80];
} name_table;

/* The kinds of p's ops in first-use order: what the table must list. */
static int first_use_kinds(const tg_plan *p, int *kinds) {
    int n = 0;
    for (int o = 0; o < p->n_ops; o++) {
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= kinds[j] == p->ops[o].kind;
        if (!seen) kinds[n++] = p->ops[o].kind;
    }
    return n;
}

/* Finds the table of p's encoding in `payload`: its count and first name, as p's first op
 * has it, right before the op count; 0, or -1 when it is not there. */
static int find_name_table(const tg_plan *p, const uint8_t *payload, size_t len, name_table *t) {
    int kinds[MAX_TABLE];
    const int n = first_use_kinds(p, kinds);
    uint8_t head[8 + 64];
    const char *first = tg_op_name(kinds[0]);
    put32(head, (uint32_t)n);
    put32(head + 4, (uint32_t)strlen(first));
    memcpy(head + 8, first, strlen(first));
    const uint8_t *at = memmem(payload, len, head, 8 + strlen(first));
    if (!at) return -1;
    t->at = (size_t)(at - payload);
    t->n = n;
    size_t pos = t->at + 4;
    for (int j = 0; j < n; j++) {
        uint32_t k = (uint32_t)payload[pos] | (uint32_t)payload[pos + 1] << 8 | (uint32_t)payload[pos + 2] << 16 |
                     (uint32_t)payload[pos + 3] << 24;
        if (k >= sizeof t->names[j] || pos + 4 + k > len) return -1;
        memcpy(t->names[j], payload + pos + 4, k);
        t->names[j][k] = 0;
        pos += 4 + k;
    }
    t->end = pos;
    return 0;
}

/* Encodes p, lets `edit` change the name table (names, count), writes the table back in
 * place of the original, re-seals and decodes. */
static int decode_with_names(const tg_plan *p, void (*edit)(name_table *), tg_plan *back, tg_err *err) {
    uint8_t *file = NULL, *payload = NULL, *edited = NULL;
    size_t len = 0, usize = 0;
    int rc = -2;
    name_table t;
    if (tg_plan_encode(p, &file, &len, err) || !(payload = payload_of(file, len, &usize)) ||
        find_name_table(p, payload, usize, &t) || !(edited = malloc(usize + MAX_TABLE * 68)))
        goto out;
    if (edit) edit(&t);
    size_t n = t.at;
    memcpy(edited, payload, t.at);
    put32(edited + n, (uint32_t)t.n), n += 4;
    for (int j = 0; j < t.n; j++) {
        const size_t k = strlen(t.names[j]);
        put32(edited + n, (uint32_t)k), n += 4;
        memcpy(edited + n, t.names[j], k), n += k;
    }
    memcpy(edited + n, payload + t.end, usize - t.end), n += usize - t.end;
    rc = reseal_decode(file, edited, n, back, err);
out:
    free(edited);
    free(payload);
    free(file);
    return rc;
}

/* build_plan's ops have kinds, in order: embedding, matmul, cross_entropy, fill,
 * cross_entropy_bwd, bias_grad, embedding_bwd, schedule, grad_norm, adamw; one op each, so
 * table entry j is op j's kind. */
static void swap_embeddings(name_table *t) {
    char tmp[sizeof t->names[0]];
    memcpy(tmp, t->names[0], sizeof tmp);
    memcpy(t->names[0], t->names[6], sizeof tmp);
    memcpy(t->names[6], tmp, sizeof tmp);
}
static void unknown_name(name_table *t) { snprintf(t->names[t->n - 1], sizeof t->names[0], "%s", "reglux"); }
static void repeated_name(name_table *t) { snprintf(t->names[1], sizeof t->names[1], "%s", t->names[0]); }
static void short_table(name_table *t) { t->n--; }
static void overlong_name(name_table *t) { memset(t->names[2], 'x', 64), t->names[2][64] = 0; }
static const char *g_rename;
static void rename_to_reglux(name_table *t) {
    for (int j = 0; j < t->n; j++)
        if (!strcmp(t->names[j], g_rename)) snprintf(t->names[j], sizeof t->names[j], "%s", "reglux");
}

TG_TEST(test_plan_file_op_kinds_by_name) {
    tg_plan p, back;
    build_plan(&p);
    tg_err err = {{0}};

    /* The table lists the kinds the plan uses in first-use order, by their ops.def names,
     * and an unchanged table written back reads back whole. */
    REQUIRE(decode_with_names(&p, NULL, &back, &err) == 0, "re-sealed plan refused: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "re-sealed plan differs at %s", what);
    tg_plan_free(&back);

    /* The decoder takes each op's kind from the name its index points at, not from a
     * number: EMBEDDING and EMBEDDING_BWD (one parameter set) exchanged in the table come
     * back exchanged, every other op as it was. */
    REQUIRE(decode_with_names(&p, swap_embeddings, &back, &err) == 0, "swapped names refused: %s", err.msg);
    CHECK(back.ops[0].kind == TG_OP_EMBEDDING_BWD && back.ops[6].kind == TG_OP_EMBEDDING,
          "swapped names decoded as kinds %d and %d", back.ops[0].kind, back.ops[6].kind);
    back.ops[0].kind = TG_OP_EMBEDDING, back.ops[6].kind = TG_OP_EMBEDDING_BWD;
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "swapped names changed %s", what);
    tg_plan_free(&back);

    struct {
        void (*edit)(name_table *);
        const char *want;
    } cases[] = {
        {unknown_name, "plan.tgp: op 9 is 'reglux', an op this build does not know (recompile the job)"},
        {repeated_name, "plan.tgp: op kind names 0 and 1 are both 'embedding' (file corrupt)"},
        {short_table, "plan.tgp: op 9 names op kind 9 of the 9 the plan lists (file corrupt)"},
        {overlong_name, "plan.tgp: op kind name 2 is 64 bytes, its field holds at most 63 (file corrupt)"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memset(&err, 0, sizeof err);
        CHECK(decode_with_names(&p, cases[c].edit, &back, &err) == -1, "case %zu accepted: want '%s'", c,
              cases[c].want);
        CHECK(has(err.msg, cases[c].want), "case %zu: '%s' lacks '%s'", c, err.msg, cases[c].want);
        CHECK(!back.ops && !back.tensors && back.n_ops == 0, "case %zu left tables", c);
        tg_plan_free(&back);
    }
    tg_plan_free(&p);
}

/* Every kind, appended in descending enum order: the table follows the plan's first uses,
 * not the enum, so the indices ops store say nothing of this build's numbering (as when
 * ops.def is reordered), and each kind still comes back as itself. An unknown name is
 * named with the first op that uses it. */
TG_TEST(test_plan_file_op_kinds_any_order) {
    tg_plan p, back;
    build_plan(&p);
    tg_op *ops = realloc(p.ops, sizeof *ops * (size_t)(p.n_ops + TG_OP_COUNT));
    REQUIRE(ops, "out of memory");
    p.ops = ops;
    const int first = p.n_ops;
    for (int k = TG_OP_COUNT - 1; k >= 0; k--) memset(&add_op(&p, k, TG_PHASE_OPTIMIZER)->p, 0, sizeof(tg_op_params));
    p.phase_begin[TG_PHASE_COUNT] = p.n_ops;
    tg_err err = {{0}};
    REQUIRE(encode_decode(&p, &back, &err) == 0, "round trip failed: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "decoded plan differs at %s", what);
    tg_plan_free(&back);

    uint8_t *file = NULL, *payload = NULL;
    size_t len = 0, usize = 0;
    name_table t;
    REQUIRE(tg_plan_encode(&p, &file, &len, &err) == 0, "%s", err.msg);
    payload = payload_of(file, len, &usize);
    REQUIRE(payload && find_name_table(&p, payload, usize, &t) == 0, "no op kind name table in the payload");
    int kinds[MAX_TABLE];
    const int n = first_use_kinds(&p, kinds);
    CHECK(t.n == n && n == TG_OP_COUNT, "%d names for %d kinds used, %d kinds", t.n, n, TG_OP_COUNT);
    for (int j = 0; j < t.n && j < n; j++)
        CHECK(!strcmp(t.names[j], tg_op_name(kinds[j])), "entry %d is '%s', first use order has '%s'", j,
              t.names[j], tg_op_name(kinds[j]));
    /* The kinds build_plan lacks follow its ten in descending order: the last entry is
     * kind 0's, first used by the last op. */
    CHECK(!strcmp(t.names[t.n - 1], tg_op_name(0)), "last entry '%s', want '%s'", t.names[t.n - 1], tg_op_name(0));
    free(payload);
    free(file);

    /* TANH (not in build_plan) renamed: refused at its first op. */
    char want[160];
    snprintf(want, sizeof want, "plan.tgp: op %d is 'reglux', an op this build does not know (recompile the job)",
             first + (TG_OP_COUNT - 1 - TG_OP_TANH));
    g_rename = tg_op_name(TG_OP_TANH);
    memset(&err, 0, sizeof err);
    CHECK(decode_with_names(&p, rename_to_reglux, &back, &err) == -1 && has(err.msg, want), "'%s' lacks '%s'",
          err.msg, want);
    tg_plan_free(&back);
    tg_plan_free(&p);
}

/* The encoder refuses a kind outside the enum: it has no name to store. */
TG_TEST(test_plan_file_encode_unknown_kind) {
    tg_plan p;
    build_plan(&p);
    uint8_t *bytes = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    char want[96];
    const int bad[] = {TG_OP_COUNT, -1};
    for (int i = 0; i < 2; i++) {
        p.ops[3].kind = bad[i];
        snprintf(want, sizeof want, "plan encode: op 3 has kind %d of %d", bad[i], TG_OP_COUNT);
        CHECK(tg_plan_encode(&p, &bytes, &len, &err) == -1 && !bytes && has(err.msg, want), "kind %d: '%s'", bad[i],
              err.msg);
    }
    tg_plan_free(&p);
}

/* ---- atomic write ------------------------------------------------------------------ */

TG_TEST(test_plan_file_write_missing_folder) {
    const char *dir = tg_test_tmpdir();
    char sub[600], path[700];
    snprintf(sub, sizeof sub, "%s", dir);
    snprintf(path, sizeof path, "%s/no/such/folder/plan.tgp", sub);
    tg_plan p;
    build_plan(&p);
    tg_err err = {{0}};
    CHECK(tg_plan_write(&p, path, &err) == -1, "write into a missing folder succeeded");
    CHECK(has(err.msg, path) && has(err.msg, "No such file"), "'%s'", err.msg);
    CHECK(tg_test_count_files(sub) == 0, "left %d files", tg_test_count_files(sub));
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_write_failure_removes_temp) {
    /* The temp file is written, then rename onto a non-empty folder fails: the temp
     * must go and the folder stays as it was. */
    const char *dir = tg_test_tmpdir();
    char sub[600], target[700], inner[800];
    snprintf(sub, sizeof sub, "%s", dir);
    snprintf(target, sizeof target, "%s/plan.tgp", sub);
    snprintf(inner, sizeof inner, "%s/keep", target);
    REQUIRE(mkdir(target, 0755) == 0, "mkdir %s", target);
    REQUIRE(tg_test_write_file(inner, "x") == 0, "write %s", inner);
    tg_plan p;
    build_plan(&p);
    tg_err err = {{0}};
    CHECK(tg_plan_write(&p, target, &err) == -1, "rename onto a folder succeeded");
    CHECK(has(err.msg, target) && has(err.msg, "rename"), "'%s'", err.msg);
    CHECK(tg_test_count_files(sub) == 1, "temp left behind: %d entries",
          tg_test_count_files(sub));
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_sniff) {
    const char *dir = tg_test_tmpdir();
    char plan[600], job[600], shorty[600], missing[600];
    snprintf(plan, sizeof plan, "%s/a.tgp", dir);
    snprintf(job, sizeof job, "%s/a.job", dir);
    snprintf(shorty, sizeof shorty, "%s/short", dir);
    snprintf(missing, sizeof missing, "%s/missing", dir);
    tg_plan p;
    build_plan(&p);
    tg_err err;
    REQUIRE(tg_plan_write(&p, plan, &err) == 0, "%s", err.msg);
    REQUIRE(tg_test_write_file(job, "model = bert-tiny\nsteps = 3\n") == 0, "job file");
    REQUIRE(tg_test_write_file(shorty, "TGPLAN") == 0, "short file");
    CHECK(tg_plan_file_sniff(plan) == 1, "plan not recognised");
    CHECK(tg_plan_file_sniff(job) == 0, "job file taken for a plan");
    CHECK(tg_plan_file_sniff(shorty) == 0, "6-byte file taken for a plan");
    CHECK(tg_plan_file_sniff(missing) == 0, "missing file taken for a plan");
    tg_plan_free(&p);
}

/* ---- inspect ------------------------------------------------------------------------ */

/* A JSON string's value, "" when absent, so a missing key fails the compare. */
static const char *jsv(const json_t *v) {
    const char *s = json_string_value(v);
    return s ? s : "";
}

static char *inspect_to_string(const tg_plan *p, int json, int *rc) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    tg_err err = {{0}};
    *rc = tg_plan_inspect(p, f, json, &err);
    fclose(f);
    return buf;
}

TG_TEST(test_inspect_text) {
    tg_plan p;
    build_plan(&p);
    int rc = -1;
    char *text = inspect_to_string(&p, 0, &rc);
    REQUIRE(text && rc == 0, "inspect failed");
    if (getenv("TG_SHOW_INSPECT")) fputs(text, stderr); /* to eyeball the layout */
    const char *want[] = {
        "== forward (3 ops) ==", "== backward (4 ops) ==", "== optimizer (3 ops) ==",
        "models/bert-tiny (bert)", "classify", "2 x 4", "bf16", "attention: unfused  data parallel: 3 replicas (ZeRO-1: optimizer state sharded)\n",
        "0123456789abcdef",
        "matmul", "logits[2,2] <- h, bert.embeddings.word_embeddings.weight, classifier.bias",
        "M=2 N=2 K=8 transA=0 transB=1 batch=1", "params", "grads", "optim", "activations",
        "inputs", "workspace", "peak: 5632 bytes", "activation live peak: 528 bytes",
        "1.500 GFLOP", "param,no_decay", "parameters: trainable 2 (",
        "run: steps 100  epochs 0  seed 18364758544493064720  last_batch: drop  skip_nonfinite: true (at most 3 in a "
        "row)\n"};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        CHECK(has(text, want[k]), "text lacks '%s'", want[k]);
    /* Phases appear in order. */
    const char *f = strstr(text, "== forward"), *b = strstr(text, "== backward"),
               *o = strstr(text, "== optimizer");
    CHECK(f && b && o && f < b && b < o, "phase headers out of order");
    free(text);
    tg_plan_free(&p);
}

TG_TEST(test_inspect_json) {
    tg_plan p;
    build_plan(&p);
    int rc = -1;
    char *text = inspect_to_string(&p, 1, &rc);
    REQUIRE(text && rc == 0, "inspect --json failed");
    if (getenv("TG_SHOW_INSPECT")) fputs(text, stderr);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    free(text);
    REQUIRE(root, "JSON does not parse: %s (line %d)", jerr.text, jerr.line);

    json_t *ops = json_object_get(root, "ops");
    REQUIRE(json_is_array(ops) && json_array_size(ops) == 10, "ops: want 10");
    json_t *mm = json_array_get(ops, 1);
    CHECK(!strcmp(jsv(json_object_get(mm, "op")), "matmul"), "op 1 name");
    CHECK(!strcmp(jsv(json_object_get(mm, "phase")), "forward"),
          "op 1 phase");
    json_t *ins = json_object_get(mm, "inputs");
    CHECK(json_array_size(ins) == 3 &&
              !strcmp(jsv(json_array_get(ins, 0)), "h"),
          "op 1 inputs");
    json_t *outs = json_object_get(json_array_get(ops, 9), "outputs");
    CHECK(json_array_size(outs) == 3 &&
              !strcmp(jsv(json_array_get(outs, 2)), "v_all"),
          "adamw outputs");
    CHECK(json_integer_value(json_object_get(json_object_get(mm, "params"), "K")) == 8,
          "matmul K");

    json_t *pools = json_object_get(root, "pools");
    CHECK(json_integer_value(json_object_get(pools, "optim")) == 2048, "optim pool");
    CHECK(json_integer_value(json_object_get(pools, "activations")) == 768, "activations");
    CHECK(json_object_size(pools) == TG_POOL_COUNT, "pool count");
    json_t *classes = json_object_get(root, "classes");
    CHECK(json_integer_value(json_object_get(json_object_get(classes, "trainable"), "count")) == 2 &&
              json_integer_value(json_object_get(json_object_get(classes, "frozen"), "count")) == 0 &&
              json_integer_value(json_object_get(json_object_get(classes, "buffers"), "bytes")) == 0,
          "classes");
    CHECK(json_integer_value(json_object_get(root, "peak_bytes")) == 5632, "peak_bytes");
    CHECK(json_integer_value(json_object_get(root, "n_ops")) == p.n_ops &&
              json_integer_value(json_object_get(root, "n_tensors")) == p.n_tensors && p.n_ops != p.n_tensors,
          "n_ops %lld (plan %d), n_tensors %lld (plan %d)", json_integer_value(json_object_get(root, "n_ops")),
          p.n_ops, json_integer_value(json_object_get(root, "n_tensors")), p.n_tensors);
    CHECK(json_integer_value(json_object_get(root, "activation_live_peak")) == 528,
          "activation_live_peak");
    json_t *flops = json_object_get(root, "flops_per_step");
    CHECK(json_is_real(flops) && json_real_value(flops) == 1.5e9, "flops_per_step");
    CHECK(json_real_value(json_object_get(root, "bytes_per_step")) == 3.25e6, "bytes_per_step");
    json_t *per = json_object_get(root, "ops_per_phase");
    CHECK(json_integer_value(json_object_get(per, "forward")) == 3 &&
              json_integer_value(json_object_get(per, "backward")) == 4 &&
              json_integer_value(json_object_get(per, "optimizer")) == 3,
          "ops_per_phase");
    CHECK(!strcmp(jsv(json_object_get(root, "fingerprint")),
                  "0123456789abcdef"),
          "fingerprint");
    CHECK(!strcmp(jsv(json_object_get(json_object_get(root, "model"), "arch")),
                  "bert"),
          "model arch");
    /* The model object: every field the plan's model has, and nothing else. */
    json_t *model = json_object_get(root, "model");
    CHECK(json_object_size(model) == 9 && !strcmp(jsv(json_object_get(model, "source")), "models/bert-tiny") &&
              !strcmp(jsv(json_object_get(model, "weights")), "models/bert-tiny/model.safetensors") &&
              json_integer_value(json_object_get(model, "vocab_size")) == 16 &&
              json_integer_value(json_object_get(model, "hidden")) == 8 &&
              json_integer_value(json_object_get(model, "layers")) == 1 &&
              json_integer_value(json_object_get(model, "heads")) == 2 &&
              json_integer_value(json_object_get(model, "intermediate")) == 32 &&
              json_integer_value(json_object_get(model, "max_positions")) == 64,
          "model object of %zu fields", json_object_size(model));
    CHECK(!strcmp(jsv(json_object_get(root, "attention")), "unfused"), "attention");
    CHECK(json_integer_value(json_object_get(root, "data_parallel")) == 3, "data_parallel");
    CHECK(json_integer_value(json_object_get(root, "batch")) == 2 &&
              json_integer_value(json_object_get(root, "seq")) == 4,
          "batch/seq");
    json_t *train = json_object_get(root, "train"), *run = json_object_get(root, "run");
    CHECK(!strcmp(jsv(json_object_get(train, "task")), "classify") &&
              json_integer_value(json_object_get(train, "batch")) == 2 &&
              json_integer_value(json_object_get(train, "seq")) == 4 &&
              json_integer_value(json_object_get(train, "num_labels")) == 3 &&
              json_integer_value(json_object_get(train, "pad_id")) == 5 &&
              !strcmp(jsv(json_object_get(train, "precision")), "bf16") &&
              json_is_true(json_object_get(train, "allow_tf32")) &&
              json_integer_value(json_object_get(train, "replicas")) == 3 &&
              json_integer_value(json_object_get(train, "zero_stage")) == 1 &&
              !strcmp(jsv(json_object_get(train, "attention")), "unfused"),
          "train object");
    /* The seed is past jansson's signed 64 bits, so it comes as its decimal text. */
    CHECK(!strcmp(jsv(json_object_get(run, "train_data")), "/data/train.jsonl") &&
              !strcmp(jsv(json_object_get(run, "eval_data")), "/data/eval.jsonl") &&
              json_integer_value(json_object_get(run, "steps")) == 100 &&
              json_integer_value(json_object_get(run, "epochs")) == 0 &&
              json_integer_value(json_object_get(run, "log_every")) == 5 &&
              !strcmp(jsv(json_object_get(run, "seed")), "18364758544493064720"),
          "run object");
    CHECK(!strcmp(jsv(json_object_get(root, "job_path")), "/jobs/sst2.job"), "job_path");
    /* No buckets: the plan is the one bucket, of its seq. */
    CHECK(!strcmp(jsv(json_object_get(run, "last_batch")), "drop"), "run last_batch");
    CHECK(json_is_true(json_object_get(run, "skip_nonfinite")) &&
              json_integer_value(json_object_get(run, "max_skipped_steps")) == 3,
          "run skip_nonfinite, max_skipped_steps");
    json_t *buckets = json_object_get(root, "buckets"), *seqs = json_object_get(train, "bucket_seq");
    CHECK(json_array_size(buckets) == 1 && json_integer_value(json_object_get(json_array_get(buckets, 0), "seq")) == 4 &&
              json_integer_value(json_object_get(json_array_get(buckets, 0), "n_ops")) == 10 &&
              json_integer_value(json_object_get(root, "pools_sized_by_bucket")) == 0,
          "buckets");
    CHECK(json_array_size(seqs) == 1 && json_integer_value(json_array_get(seqs, 0)) == 4, "train bucket_seq");

    json_t *tensors = json_object_get(root, "tensors");
    REQUIRE(json_array_size(tensors) == N_T, "tensor count");
    json_t *v = json_array_get(tensors, T_V_ALL);
    CHECK(!strcmp(jsv(json_object_get(v, "name")), "v_all") &&
              !strcmp(jsv(json_object_get(v, "pool")), "optim") &&
              json_integer_value(json_object_get(v, "offset")) == 1280 &&
              json_integer_value(json_object_get(v, "bytes")) == 768 &&
              json_integer_value(json_object_get(v, "first_use")) == 9,
          "tensor v_all fields");
    json_t *h = json_array_get(tensors, T_H);
    json_t *shape = json_object_get(h, "shape");
    CHECK(json_array_size(shape) == 2 && json_integer_value(json_array_get(shape, 0)) == 8,
          "tensor h shape");
    json_decref(root);
    tg_plan_free(&p);
}

/* ---- compiled plans edited and re-sealed: each op and the layout are checked ---------- */

#define TINY_BERT_JOB "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n"

static int compile_tiny_bert(tg_plan *plan, tg_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/job.txt", tg_test_tmpdir());
    if (tg_test_write_file(path, TINY_BERT_JOB)) return tg_fail(err, "cannot write %s", path);
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

/* Encodes (seals) p and decodes it with every check, as tg_plan_read does. */
static int decode_all(const tg_plan *p, tg_plan *back, tg_err *err) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (tg_plan_encode(p, &bytes, &len, err)) return -2;
    int rc = tg_plan_decode(bytes, len, "plan.tgp", back, err);
    free(bytes);
    return rc;
}

static int first_op_of(const tg_plan *p, int kind) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == kind) return o;
    return -1;
}

/* The compiled plan itself passes every check, through a file on disk too. */
TG_TEST(test_plan_file_compiled_plan_accepted) {
    tg_plan p, back;
    tg_err err = {{0}};
    REQUIRE(compile_tiny_bert(&p, &err) == 0, "%s", err.msg);
    REQUIRE(decode_all(&p, &back, &err) == 0, "compiled plan refused: %s", err.msg);
    char what[128] = "";
    CHECK(plan_diff(&p, &back, what, sizeof what) == 0, "decoded plan differs at %s", what);
    tg_plan_free(&back);
    char path[600];
    snprintf(path, sizeof path, "%s/tiny.tgp", tg_test_tmpdir());
    REQUIRE(tg_plan_write(&p, path, &err) == 0, "%s", err.msg);
    CHECK(tg_plan_read(path, &back, &err) == 0, "read: %s", err.msg);
    tg_plan_free(&back);
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_refuses_wrong_matmul_dim) {
    tg_plan p, back;
    tg_err err = {{0}};
    REQUIRE(compile_tiny_bert(&p, &err) == 0, "%s", err.msg);
    const int o = first_op_of(&p, TG_OP_MATMUL);
    REQUIRE(o >= 0, "no matmul in the plan");
    p.ops[o].p.matmul.k += 1; /* K no longer agrees with A's and B's element counts */
    char want[64];
    snprintf(want, sizeof want, "plan.tgp: op %d (matmul): ", o);
    CHECK(decode_all(&p, &back, &err) == -1, "a matmul with a wrong K accepted");
    printf("    %s\n", err.msg);
    CHECK(has(err.msg, want) && has(err.msg, "K"), "'%s' lacks '%s' and 'K'", err.msg, want);
    CHECK(!back.ops && !back.tensors, "failed decode left tables");
    /* The same edit is below the table checks: they accept it. */
    uint8_t *bytes = NULL;
    size_t len = 0;
    REQUIRE(tg_plan_encode(&p, &bytes, &len, &err) == 0, "%s", err.msg);
    CHECK(decode_tables(bytes, len, "plan.tgp", &back, &err) == 0, "tables refused: %s", err.msg);
    free(bytes);
    tg_plan_free(&back);
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_refuses_changed_input_dtype) {
    tg_plan p, back;
    tg_err err = {{0}};
    REQUIRE(compile_tiny_bert(&p, &err) == 0, "%s", err.msg);
    const int o = first_op_of(&p, TG_OP_EMBEDDING);
    REQUIRE(o >= 0 && p.ops[o].in[0] >= 0, "no embedding in the plan");
    tg_tensor *ids = &p.tensors[p.ops[o].in[0]];
    REQUIRE(ids->dtype == TG_I32, "embedding ids are dtype %d", ids->dtype);
    ids->dtype = TG_F32; /* the same bytes, so only the op's signature can tell */
    int first = -1; /* the first op that reads the ids is the one named */
    for (int q = 0; q < p.n_ops && first < 0; q++)
        for (int k = 0; k < TG_OP_MAX_IN; k++)
            if (p.ops[q].in[k] == p.ops[o].in[0]) first = q;
    char want[64];
    snprintf(want, sizeof want, "plan.tgp: op %d (%s): in[", first, tg_op_name(p.ops[first].kind));
    CHECK(decode_all(&p, &back, &err) == -1, "an f32 ids tensor accepted");
    printf("    %s\n", err.msg);
    CHECK(has(err.msg, want), "'%s' lacks '%s'", err.msg, want);
    tg_plan_free(&back);
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_refuses_overlapping_live_tensors) {
    tg_plan p, back;
    tg_err err = {{0}};
    REQUIRE(compile_tiny_bert(&p, &err) == 0, "%s", err.msg);
    /* Two activations live at one op, neither a view nor packed: the second moved onto the
     * first's offset (aligned, inside the pool) shares its bytes while both are live. */
    int x = -1, y = -1;
    for (int a = 0; a < p.n_tensors && y < 0; a++) {
        const tg_tensor *ta = &p.tensors[a];
        if (ta->pool != TG_POOL_ACTIVATIONS || ta->first_use < 0 || (ta->flags & TG_TENSOR_VIEW) || ta->group >= 0)
            continue;
        for (int b = a + 1; b < p.n_tensors && y < 0; b++) {
            const tg_tensor *tb = &p.tensors[b];
            if (tb->pool != TG_POOL_ACTIVATIONS || tb->first_use < 0 || (tb->flags & TG_TENSOR_VIEW) ||
                tb->group >= 0 || tb->offset == ta->offset)
                continue;
            if (tb->first_use <= ta->last_use && ta->first_use <= tb->last_use &&
                ta->offset + tb->bytes <= p.pool_bytes[TG_POOL_ACTIVATIONS])
                x = a, y = b;
        }
    }
    REQUIRE(y >= 0, "no two activations live at once");
    p.tensors[y].offset = p.tensors[x].offset;
    CHECK(decode_all(&p, &back, &err) == -1, "overlapping live tensors accepted");
    printf("    %s\n", err.msg);
    CHECK(has(err.msg, "plan.tgp: ") && has(err.msg, "overlap while both live") && has(err.msg, p.tensors[x].name) &&
              has(err.msg, p.tensors[y].name),
          "'%s' does not name %s and %s overlapping", err.msg, p.tensors[x].name, p.tensors[y].name);
    tg_plan_free(&back);
    tg_plan_free(&p);
}

/* ---- compiled plans edited and re-sealed: every class of edit is refused on load ------- */

static int compile_text(const char *text, tg_plan *plan, tg_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/job.txt", tg_test_tmpdir());
    if (tg_test_write_file(path, text)) return tg_fail(err, "cannot write %s", path);
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

static int first_tensor_where(const tg_plan *p, int (*pick)(const tg_plan *, const tg_tensor *)) {
    for (int t = 0; t < p->n_tensors; t++)
        if (pick(p, &p->tensors[t])) return t;
    return -1;
}

/* An edit of a compiled plan: it changes the plan and writes what the refusal must say. */
typedef void (*plan_edit)(tg_plan *p, char *want, size_t len);

static void edit_batch(tg_plan *p, char *want, size_t len) {
    p->train.batch = 3; /* the batch tensors stay [2, 8]: the batch filler would write past them */
    snprintf(want, len, "plan.tgp: io input_ids is tensor %d (input_ids) of shape [2, 8]; it must be [3, 8]",
             p->io.input_ids);
}
static void edit_seq(tg_plan *p, char *want, size_t len) {
    p->train.seq = p->train.bucket_seq[0] = 16; /* the one bucket follows seq */
    snprintf(want, len, "io input_ids is tensor %d (input_ids) of shape [2, 8]; it must be [2, 16]", p->io.input_ids);
}
static void edit_batch_zero(tg_plan *p, char *want, size_t len) {
    p->train.batch = 0;
    snprintf(want, len, "plan.tgp: train batch 0 is not a positive row count");
}
static void edit_log_every_zero(tg_plan *p, char *want, size_t len) {
    p->run.log_every = 0;
    snprintf(want, len, "plan.tgp: run log_every 0 is not a positive step count");
}
static void edit_steps_zero(tg_plan *p, char *want, size_t len) {
    p->run.steps = 0;
    snprintf(want, len, "plan.tgp: run steps 0 and epochs 0: exactly one must be positive");
}
static void edit_num_labels(tg_plan *p, char *want, size_t len) {
    p->train.num_labels = 3; /* the logits stay [2, 2] */
    snprintf(want, len, "io logits is tensor %d (classifier) of shape [2, 2]; it must be [2, 3]", p->io.logits);
}
static void edit_io_step(tg_plan *p, char *want, size_t len) {
    const int was = p->io.step;
    p->io.step = p->io.total_steps; /* an f32 scalar of the optim pool too */
    const int o = first_op_of(p, TG_OP_DROPOUT);
    snprintf(want, len, "plan.tgp: op %d (dropout): in[1] is the step counter, tensor %d (io step), not tensor %d", o,
             p->io.step, was);
}
static void edit_io_step_pool(tg_plan *p, char *want, size_t len) {
    p->io.step = p->io.lr;
    snprintf(want, len, "plan.tgp: io step is tensor %d (lr) in the workspace pool; it must be in the optim pool",
             p->io.lr);
}
static void edit_io_labels(tg_plan *p, char *want, size_t len) {
    p->io.labels = p->io.attention_mask;
    snprintf(want, len, "plan.tgp: io labels is tensor %d (attention_mask) of dtype f32; it must be i32",
             p->io.attention_mask);
}
static void edit_io_params_all(tg_plan *p, char *want, size_t len) {
    p->io.params_all = p->io.grads_all;
    snprintf(want, len, "plan.tgp: io params_all is tensor %d (grads.all) in the grads pool; it must be in the params pool",
             p->io.grads_all);
}
static int is_table(const tg_plan *p, const tg_tensor *x) { return x == &p->tensors[p->ops[0].in[1]]; }
static void edit_tensor_shape(tg_plan *p, char *want, size_t len) {
    tg_tensor *wte = &p->tensors[first_tensor_where(p, is_table)];
    wte->shape[0] -= 1; /* and its bytes with it, so only the op can tell */
    wte->bytes -= (uint64_t)wte->shape[1] * 4;
    snprintf(want, len, "plan.tgp: op 0 (embedding): in[1]: table != V*D");
}
static void edit_matmul_dim(tg_plan *p, char *want, size_t len) {
    const int o = first_op_of(p, TG_OP_MATMUL);
    p->ops[o].p.matmul.n += 1;
    snprintf(want, len, "plan.tgp: op %d (matmul): in[1]: B != batch*K*N", o);
}
static void edit_matmul_overflow(tg_plan *p, char *want, size_t len) {
    /* The fuzzed plan that overflowed the unchecked product (UBSan: 288230376151711745 * 768). */
    const int o = first_op_of(p, TG_OP_MATMUL);
    p->ops[o].p.matmul.batch = 288230376151711745;
    p->ops[o].p.matmul.k = 768;
    snprintf(want, len, "plan.tgp: op %d (matmul): batch*M*K overflows", o);
}
static void edit_negative_dim(tg_plan *p, char *want, size_t len) {
    p->ops[0].p.embedding.dim = -p->ops[0].p.embedding.dim;
    p->ops[0].p.embedding.vocab = -p->ops[0].p.embedding.vocab;
    snprintf(want, len, "plan.tgp: op 0 (embedding): V is negative");
}
static void edit_fill_step(tg_plan *p, char *want, size_t len) {
    const int o = first_op_of(p, TG_OP_FILL);
    p->ops[o].out[0] = p->io.step;
    /* Its lifetime covers the op, so the layout passes and the binding is what is refused. */
    p->tensors[p->io.step].first_use = 0;
    snprintf(want, len, "plan.tgp: op %d (fill): out[0] writes the step counter, which only the runtime and SCHEDULE sets",
             o);
}
static void edit_view_over_step(tg_plan *p, char *want, size_t len) {
    /* optim.v, a view (the layout check leaves views to overlap what they cover), moved up
     * one alignment step onto the step counter: AdamW would write the counter the dropouts
     * convert to an integer. */
    p->tensors[p->io.v_all].offset += TG_TENSOR_ALIGN;
    /* The forward now reads what the update writes, so the update is no longer deferrable
     * and shared gradients are not held at the step's start: the totals follow, so that
     * the check of the bindings is reached. */
    tg_grad_hold *holds = NULL;
    int n_holds = 0;
    if (p->grads_share_activations &&
        tg_grad_holds(p->tensors, p->n_tensors, p->ops, p->n_ops, p->phase_begin, p->pool_bytes[TG_POOL_GRADS], &holds,
                      &n_holds) == 0)
        (void)tg_plan_live_activation_peak(p->tensors, p->n_tensors, p->n_ops, holds, n_holds, &p->activation_live_peak);
    free(holds);
    snprintf(want, len, "plan.tgp: tensor %d (optim.v) shares bytes with io step (tensor %d)", p->io.v_all,
             p->io.step);
}
static void edit_adamw_state(tg_plan *p, char *want, size_t len) {
    const int o = first_op_of(p, TG_OP_ADAMW);
    p->ops[o].out[1] = p->io.v_all, p->ops[o].out[2] = p->io.m_all;
    snprintf(want, len, "plan.tgp: op %d (adamw): out[1] (io m_all) must be tensor %d, is tensor %d", o, p->io.m_all,
             p->io.v_all);
}
static void edit_pool_limit(tg_plan *p, char *want, size_t len) {
    p->pool_bytes[TG_POOL_WORKSPACE] = TG_POOL_MAX_BYTES + 1;
    snprintf(want, len, "plan.tgp: pool workspace holds 281474976710657 bytes, more than the 281474976710656");
}
static void edit_lifetime(tg_plan *p, char *want, size_t len) {
    tg_tensor *x = &p->tensors[p->io.loss];
    const int first = x->first_use;
    x->first_use = x->last_use, x->last_use = first - 1;
    snprintf(want, len, "(loss) has lifetime %d..%d (both -1, or first <= last)", x->first_use, x->last_use);
}
static void edit_peak(tg_plan *p, char *want, size_t len) {
    p->peak_bytes -= 4096; /* the preflight would trust a smaller footprint */
    snprintf(want, len, "plan.tgp: the plan says peak %llu bytes", (unsigned long long)p->peak_bytes);
}
static int is_param(const tg_plan *p, const tg_tensor *x) {
    return (x->flags & TG_TENSOR_PARAM) && !(x->flags & TG_TENSOR_VIEW);
}
static void edit_param_dtype(tg_plan *p, char *want, size_t len) {
    const int t = first_tensor_where(p, is_param);
    p->tensors[t].dtype = TG_BF16, p->tensors[t].bytes /= 2;
    p->train.precision = TG_PREC_BF16; /* a dtype of the plan's precision, in the wrong pool */
    snprintf(want, len, "plan.tgp: tensor %d (%s) in the params pool: a trainable parameter must be f32", t,
             p->tensors[t].name);
}
static void edit_half_dtype(tg_plan *p, char *want, size_t len) {
    const int t = p->io.logits;
    p->tensors[t].dtype = TG_F16, p->tensors[t].bytes /= 2;
    snprintf(want, len, "plan.tgp: tensor %d (%s) is f16 in a plan of precision fp32", t, p->tensors[t].name);
}
static void edit_replicas(tg_plan *p, char *want, size_t len) {
    p->train.replicas = 2; /* no gradient sums: each replica would train alone */
    snprintf(want, len, "plan.tgp: train replicas 2, but the plan sums no gradients over replicas (0 all_reduce)");
}

typedef struct edit_case {
    const char *what;
    plan_edit edit;
} edit_case;

/* Compiles `job`, then for each case edits a fresh copy of the plan, seals it (checksum
 * and all) and decodes it: the decoder must refuse it with the case's message. */
static void check_edits_refused(const char *job, const edit_case *cases, size_t n) {
    tg_plan p, back;
    tg_err err = {{0}};
    REQUIRE(compile_text(job, &p, &err) == 0, "%s", err.msg);
    REQUIRE(decode_all(&p, &back, &err) == 0, "the compiled plan refused: %s", err.msg);
    tg_plan_free(&back);
    for (size_t c = 0; c < n; c++) {
        tg_plan e;
        uint8_t *bytes = NULL;
        size_t len = 0;
        /* A fresh copy of the compiled plan for each edit, through the file format. */
        REQUIRE(tg_plan_encode(&p, &bytes, &len, &err) == 0, "%s", err.msg);
        REQUIRE(tg_plan_decode(bytes, len, "copy", &e, &err) == 0, "%s", err.msg);
        free(bytes);
        char want[256];
        cases[c].edit(&e, want, sizeof want);
        memset(&err, 0, sizeof err);
        CHECK(decode_all(&e, &back, &err) == -1, "%s: the edited plan accepted, want '%s'", cases[c].what, want);
        CHECK(has(err.msg, want), "%s: '%s' lacks '%s'", cases[c].what, err.msg, want);
        CHECK(!back.ops && !back.tensors, "%s: a refused decode left tables", cases[c].what);
        tg_plan_free(&back);
        tg_plan_free(&e);
    }
    tg_plan_free(&p);
}

TG_TEST(test_plan_file_refuses_edited_compiled_plan) {
    static const edit_case cases[] = {
        {"train batch", edit_batch},
        {"train seq", edit_seq},
        {"train batch 0", edit_batch_zero},
        {"run log_every 0", edit_log_every_zero},
        {"run steps 0", edit_steps_zero},
        {"train num_labels", edit_num_labels},
        {"io step", edit_io_step},
        {"io step in another pool", edit_io_step_pool},
        {"io labels", edit_io_labels},
        {"io params_all", edit_io_params_all},
        {"a tensor shape", edit_tensor_shape},
        {"a matmul dimension", edit_matmul_dim},
        {"a matmul product past int64", edit_matmul_overflow},
        {"negative dimensions", edit_negative_dim},
        {"an op writing the step counter", edit_fill_step},
        {"a view over the step counter", edit_view_over_step},
        {"adamw's state swapped", edit_adamw_state},
        {"a pool past the limit", edit_pool_limit},
        {"a lifetime backwards", edit_lifetime},
        {"the peak", edit_peak},
        {"a bf16 trainable parameter", edit_param_dtype},
        {"an f16 tensor in an fp32 plan", edit_half_dtype},
        {"train replicas", edit_replicas},
    };
    check_edits_refused(TINY_BERT_JOB, cases, sizeof cases / sizeof cases[0]);
}

/* LM plans: the labels are a row of next tokens per sequence, the logits a row per token. */
static void edit_lm_labels(tg_plan *p, char *want, size_t len) {
    tg_tensor *labels = &p->tensors[p->io.labels];
    labels->ndim = 1, labels->shape[0] *= labels->shape[1], labels->shape[1] = 0;
    snprintf(want, len, "plan.tgp: io labels is tensor %d (labels) of shape [16]; it must be [2, 8]", p->io.labels);
}
static void edit_lm_vocab(tg_plan *p, char *want, size_t len) {
    p->model.vocab_size = 4096; /* ids past the logits' columns */
    snprintf(want, len, "plan.tgp: io logits is tensor %d (lm_head) of 128 columns, fewer than the vocabulary (4096)",
             p->io.logits);
}

TG_TEST(test_plan_file_refuses_edited_lm_plan) {
    static const edit_case cases[] = {
        {"labels shape", edit_lm_labels},
        {"vocab size", edit_lm_vocab},
    };
    check_edits_refused("model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n",
                        cases, sizeof cases / sizeof cases[0]);
}

/* ZeRO-1 and bf16 plans: the optimizer's slices and the parameters' copies. */
static void edit_zero_stage(tg_plan *p, char *want, size_t len) {
    p->train.zero_stage = 0; /* the AdamW slice and the gathers stay */
    snprintf(want, len, "(adamw): zero_slice ");
}
static int is_copy(const tg_plan *p, const tg_tensor *x) {
    return (x->flags & TG_TENSOR_PARAM_COPY) && !(x->flags & TG_TENSOR_VIEW) && x->ndim == 2;
}
static int is_bias(const tg_plan *p, const tg_tensor *x) {
    return (x->flags & TG_TENSOR_PARAM) && !(x->flags & TG_TENSOR_VIEW) && x->ndim == 1;
}
static void edit_copy_master(tg_plan *p, char *want, size_t len) {
    const int t = first_tensor_where(p, is_copy);
    p->tensors[t].master = first_tensor_where(p, is_bias); /* fewer elements than the copy */
    snprintf(want, len, "plan.tgp: tensor %d (%s) is a parameter copy of tensor %d", t, p->tensors[t].name,
             p->tensors[t].master);
}

/* ZeRO-1's sums and norm read each replica's slice with the update's slice, or the norm
 * would count gradients no replica summed. */
static void edit_scatter_slice(tg_plan *p, char *want, size_t len) {
    tg_op *op = &p->ops[first_op_of(p, TG_OP_REDUCE_SCATTER)];
    op->p.reduce_scatter.slice *= 2;
    snprintf(want, len, "(reduce_scatter): slice %lld over pool %d, but the update's slices are %lld elements",
             (long long)op->p.reduce_scatter.slice, TG_POOL_GRADS, (long long)op->p.reduce_scatter.slice / 2);
}
static void edit_squares_slice(tg_plan *p, char *want, size_t len) {
    tg_op *op = &p->ops[first_op_of(p, TG_OP_GRAD_SQUARES)];
    const long long slice = (long long)op->p.squares.slice;
    op->p.squares.slice = 0;
    snprintf(want, len, "(grad_squares): slice 0, but the update's is %lld", slice);
}
static void edit_squares_unsummed(tg_plan *p, char *want, size_t len) {
    const int squares = p->ops[first_op_of(p, TG_OP_GRAD_SQUARES)].out[0];
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == TG_OP_ALL_REDUCE && p->ops[o].in[0] == squares) { /* cleared instead of summed */
            p->ops[o].kind = TG_OP_ZERO;
            p->ops[o].in[0] = -1;
        }
    snprintf(want, len, "op %d (norm_of_squares): in[0] is not the squares of a GRAD_SQUARES before it, summed over the "
                        "replicas (ALL_REDUCE) in between",
             first_op_of(p, TG_OP_NORM_OF_SQUARES));
}
static void edit_norm_of_gradients(tg_plan *p, char *want, size_t len) {
    const int o = first_op_of(p, TG_OP_NORM_OF_SQUARES);
    tg_op *op = &p->ops[o];
    op->kind = TG_OP_GRAD_NORM;
    op->in[0] = p->io.grads_all;
    op->p.count.n = tg_tensor_numel(&p->tensors[p->io.grads_all]);
    snprintf(want, len, "op %d (grad_norm): a ZeRO-1 plan's gradients are summed only over each replica's slice", o);
}

TG_TEST(test_plan_file_refuses_edited_zero_bf16_plan) {
    static const edit_case cases[] = {
        {"zero_stage", edit_zero_stage},
        {"a copy's master", edit_copy_master},
        {"a reduce-scatter's slice", edit_scatter_slice},
        {"the squares' slice", edit_squares_slice},
        {"the norm of the unsummed gradients", edit_norm_of_gradients},
        {"the norm of unsummed squares", edit_squares_unsummed},
    };
    check_edits_refused("model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nprecision = bf16\n"
                        "data_parallel = 2\nzero_stage = 1\n",
                        cases, sizeof cases / sizeof cases[0]);
}
