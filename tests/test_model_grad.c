/* Whole-model gradient checks: the backward schedule autodiff generates for tiny BERT,
 * RoBERTa and GPT-2 (dropout on) against central finite differences of the loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* Loss of the forward pass (dropout on, same masks) at the given parameters. */
static double loss_at(tg_trainer *tr, const tg_plan *p, const float *params) {
    tg_err err;
    float loss;
    if (tg_trainer_write(tr, p->io.params_all, params, &err) ||
        tg_trainer_run(tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) || tg_trainer_read(tr, p->io.loss, &loss, &err))
        return NAN;
    return loss;
}

static void gradcheck_model_vocab(const char *preset, int task, int num_labels, int vocab);
static void gradcheck_model(const char *preset, int task, int num_labels) { gradcheck_model_vocab(preset, task, num_labels, 0); }

static void gradcheck_model_vocab(const char *preset, int task, int num_labels, int vocab) {
    tg_model_config cfg;
    tg_err err;
    memset(&cfg, 0, sizeof cfg);
    REQUIRE(tg_model_config_load(preset, &cfg, &err) == 0, "%s", err.msg);
    /* Larger init than the default so every path carries a gradient well above noise. */
    cfg.initializer_range = 0.2f;
    if (vocab) cfg.vocab_size = vocab;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", preset);
    job.task = task, job.num_labels = num_labels, job.batch = 3, job.seq = 8, job.steps = 1, job.seed = 11;
    job.pad_token_id = cfg.pad_token_id >= 0 ? -1 : 0;
    tg_plan p;
    REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
    int dropouts = 0;
    for (int o = 0; o < p.n_ops; o++) dropouts += p.ops[o].kind == TG_OP_DROPOUT;
    CHECK(dropouts > 0, "%s: the check should run with dropout on", preset);
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 2, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    tg_test_fill_random_inputs(&tr, &p, &rng);
    /* Gradients at the current point; dropout masks depend only on (seed, step, key). */
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, &err) == 0, "%s", err.msg);
    size_t pbytes = p.pool_bytes[TG_POOL_PARAMS];
    float *grads = malloc(pbytes), *saved = malloc(pbytes), *params = malloc(pbytes);
    REQUIRE(tg_trainer_read(&tr, p.io.grads_all, grads, &err) == 0 && tg_trainer_read(&tr, p.io.params_all, saved, &err) == 0,
            "%s", err.msg);
    memcpy(params, saved, pbytes);

    int checked = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        int64_t n = tg_tensor_numel(x);
        const float *g = grads + x->offset / 4;
        /* Direction: half along the analytic gradient, half random, unit length. */
        double *v = malloc(sizeof(double) * (size_t)n), gn = 0, vn = 0, analytic = 0;
        for (int64_t i = 0; i < n; i++) gn += (double)g[i] * g[i];
        gn = sqrt(gn);
        for (int64_t i = 0; i < n; i++) {
            v[i] = (gn > 0 ? g[i] / gn : 0) + ((double)(tg_test_rand(&rng) % 2001) / 1000.0 - 1.0) / sqrt((double)n);
            vn += v[i] * v[i];
        }
        vn = sqrt(vn);
        for (int64_t i = 0; i < n; i++) analytic += g[i] * (v[i] /= vn);
        const double eps = 1e-2;
        float *w = params + x->offset / 4;
        for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[x->offset / 4 + i] + eps * v[i]);
        double up = loss_at(&tr, &p, params);
        for (int64_t i = 0; i < n; i++) w[i] = (float)(saved[x->offset / 4 + i] - eps * v[i]);
        double down = loss_at(&tr, &p, params);
        memcpy(w, saved + x->offset / 4, sizeof(float) * (size_t)n);
        double fd = (up - down) / (2 * eps);
        CHECK(fabs(fd - analytic) <= 2e-2 * fabs(analytic) + 2e-4, "%s: %s: finite difference %.6g, backward %.6g",
              preset, x->name, fd, analytic);
        checked++;
        free(v);
    }
    CHECK(checked > 10, "%s: only %d parameters checked", preset, checked);
    free(grads), free(saved), free(params);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

TG_TEST(test_model_grad_tiny_bert) { gradcheck_model("tiny-bert", TG_TASK_CLASSIFY, 3); }
TG_TEST(test_model_grad_tiny_roberta) { gradcheck_model("tiny-roberta", TG_TASK_CLASSIFY, 2); }
TG_TEST(test_model_grad_tiny_gpt2_lm) { gradcheck_model("tiny-gpt2", TG_TASK_LM, 0); }
TG_TEST(test_model_grad_tiny_gpt2_classify) { gradcheck_model("tiny-gpt2", TG_TASK_CLASSIFY, 2); }
/* The masked-LM heads, the decoder tied to the word embeddings (the masks, like dropout's,
 * depend only on the seed and the step). */
TG_TEST(test_model_grad_tiny_bert_mlm) { gradcheck_model("tiny-bert", TG_TASK_MLM, 0); }
TG_TEST(test_model_grad_tiny_roberta_mlm) { gradcheck_model("tiny-roberta", TG_TASK_MLM, 0); }

/* A vocabulary that is not a multiple of 64: the tied LM head reads a zero-padded view. */
TG_TEST(test_model_grad_tiny_gpt2_lm_padded_vocab) { gradcheck_model_vocab("tiny-gpt2", TG_TASK_LM, 0, 101); }

/* ---- fused vs unfused attention ------------------------------------------------------ */

static int count_kind(const tg_plan *p, int kind) {
    int n = 0;
    for (int o = 0; o < p->n_ops; o++) n += p->ops[o].kind == kind;
    return n;
}

/* ||a - b|| <= 1e-5 ||b||, or within `floor` (absolute) for a gradient that is zero in exact
 * arithmetic: softmax ignores a shift shared by all keys, so the attention key biases get
 * only rounding noise, which differs between any two correct orders of summation. */
static int grads_match(const float *a, const float *b, int64_t n, double floor, double *rel) {
    double diff = tg_l2_diff(a, b, n), norm = 0;
    for (int64_t i = 0; i < n; i++) norm += (double)b[i] * b[i];
    norm = sqrt(norm);
    *rel = diff / fmax(norm, 1e-30);
    return diff <= 1e-5 * norm || diff <= floor;
}

/* The job and config both pair tests compile twice: a preset with dropout on, larger
 * initial weights (attention far from uniform), 3 sequences of 7 tokens. */
static int pair_job(const char *preset, int task, int num_labels, tg_model_config *cfg, tg_job *job) {
    tg_err err;
    memset(cfg, 0, sizeof *cfg);
    if (!CHECK(tg_model_config_load(preset, cfg, &err) == 0, "%s", err.msg)) return -1;
    if (!CHECK(cfg->attention_dropout > 0 && cfg->hidden_dropout > 0, "%s should have dropout on", preset)) return -1;
    cfg->initializer_range = 0.2f;
    tg_job_defaults(job);
    snprintf(job->model, sizeof job->model, "%s", preset);
    job->task = task, job->num_labels = num_labels, job->batch = 3, job->seq = 7, job->steps = 2, job->seed = 5;
    job->pad_token_id = cfg->pad_token_id >= 0 ? -1 : 0;
    return 0;
}

/* `steps` CPU training steps of each of two plans with one parameter layout, from the same
 * weights (plan 0's, written into plan 1) and the same batch: each step's statistics
 * (st[step * 2 + m]), and after the last step the whole gradient buffers (grads[m]) and,
 * when `weights` is not NULL, the weights (weights[m]); all pool-sized, allocated here. */
static int train_pair(tg_plan plans[2], int steps, tg_step_stats *st, float *grads[2], float *weights[2]) {
    tg_err err;
    tg_trainer tr[2];
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    size_t pbytes = plans[0].pool_bytes[TG_POOL_PARAMS];
    float *start = malloc(pbytes);
    grads[0] = malloc(pbytes), grads[1] = malloc(pbytes);
    if (weights) weights[0] = malloc(pbytes), weights[1] = malloc(pbytes);
    int rc = start && grads[0] && grads[1] && (!weights || (weights[0] && weights[1])) ? 0 : -1;
    for (int m = 0; m < 2 && !rc; m++) {
        if (!CHECK(tg_trainer_open(&tr[m], &plans[m], &o, &err) == 0, "%s", err.msg)) {
            rc = -1;
            break;
        }
        uint64_t rng = 0x5DEECE66Dull; /* the same batch in both */
        tg_test_fill_random_inputs(&tr[m], &plans[m], &rng);
        rc = m == 0 ? tg_trainer_read(&tr[0], plans[0].io.params_all, start, &err)
                    : tg_trainer_write(&tr[1], plans[1].io.params_all, start, &err);
        for (int s = 0; s < steps && !rc; s++) rc = tg_trainer_run_step(&tr[m], &st[s * 2 + m], &err);
        if (!rc) rc = tg_trainer_read(&tr[m], plans[m].io.grads_all, grads[m], &err);
        if (!rc && weights) rc = tg_trainer_read(&tr[m], plans[m].io.params_all, weights[m], &err);
        CHECK(rc == 0, "%s", err.msg);
        tg_trainer_close(&tr[m]);
    }
    free(start);
    return rc;
}

/* `steps` CPU training steps of each of two plans of one model, their parameters matched by
 * name, from the same weights
 * (plan 0's, written into plan 1 parameter by parameter, so the layouts may differ) and
 * the same batches: the last step's statistics, the whole gradient of the first step (from
 * the same weights in both) and, when params is not NULL, the parameters after the last
 * step (grads[m], params[m]: plan m's pool, allocated here). */
static int train_pair_by_name(tg_plan plans[2], int steps, tg_step_stats st[2], float *grads[2], float *params[2]) {
    tg_err err;
    tg_trainer tr[2];
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    float *weights[2] = {NULL, NULL};
    int rc = 0;
    for (int m = 0; m < 2; m++) {
        size_t pbytes = plans[m].pool_bytes[TG_POOL_PARAMS];
        weights[m] = malloc(pbytes), grads[m] = malloc(pbytes);
        if (params) params[m] = malloc(pbytes);
        if (!weights[m] || !grads[m] || (params && !params[m])) rc = -1;
    }
    for (int m = 0; m < 2 && !rc; m++) {
        if (!CHECK(tg_trainer_open(&tr[m], &plans[m], &o, &err) == 0, "%s", err.msg)) {
            rc = -1;
            break;
        }
        rc = tg_trainer_read(&tr[m], plans[m].io.params_all, weights[m], &err);
        for (int t = 0; m == 1 && !rc && t < plans[1].n_tensors; t++) {
            const tg_tensor *x = &plans[1].tensors[t];
            if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
            int u = tg_test_tensor_named(&plans[0], x->name);
            if (!CHECK(u >= 0 && plans[0].tensors[u].bytes == x->bytes, "%s is not a parameter of both plans", x->name))
                rc = -1;
            else
                memcpy((char *)weights[1] + x->offset, (char *)weights[0] + plans[0].tensors[u].offset, x->bytes);
        }
        if (!rc && m == 1) rc = tg_trainer_write(&tr[1], plans[1].io.params_all, weights[1], &err);
        for (int s = 0; s < steps && !rc; s++) {
            uint64_t rng = 0x5DEECE66Dull + (uint64_t)s; /* the same batches in both */
            tg_test_fill_random_inputs(&tr[m], &plans[m], &rng);
            rc = tg_trainer_run_step(&tr[m], &st[m], &err);
            if (!rc && s == 0) rc = tg_trainer_read(&tr[m], plans[m].io.grads_all, grads[m], &err);
        }
        if (!rc && params) rc = tg_trainer_read(&tr[m], plans[m].io.params_all, params[m], &err);
        CHECK(rc == 0, "%s", err.msg);
        tg_trainer_close(&tr[m]);
    }
    free(weights[0]), free(weights[1]);
    return rc;
}

/* One training step of each plan: st[m] and grads[m] as train_pair's. */
static int step_pair(tg_plan plans[2], tg_step_stats st[2], float *grads[2]) {
    return train_pair(plans, 1, st, grads, NULL);
}

/* One training step (dropout on) of the fused and the unfused plan of one job, from the
 * same weights and batch: the same function with the same dropout masks (the fused
 * backward's read from the forward's keep bits), so the loss, the gradient norm and every
 * parameter gradient agree to 1e-5. */
static void fused_matches_unfused(const char *preset, int task, int num_labels) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    if (pair_job(preset, task, num_labels, &cfg, &job)) return;
    tg_plan plans[2];
    const int modes[2] = {TG_ATTENTION_FUSED, TG_ATTENTION_UNFUSED};
    for (int m = 0; m < 2; m++) {
        job.attention = modes[m];
        REQUIRE(tg_compile_with_config(&job, &cfg, &plans[m], &err) == 0, "%s", err.msg);
    }
    const tg_plan *f = &plans[0], *u = &plans[1];
    CHECK(count_kind(f, TG_OP_ATTENTION) == cfg.layers && count_kind(f, TG_OP_ATTN_SOFTMAX) == 0 &&
              count_kind(u, TG_OP_ATTENTION) == 0 && count_kind(u, TG_OP_ATTN_SOFTMAX) == cfg.layers,
          "%s: the plans do not differ in their attention", preset);
    /* Each fused backward reads its forward's int32 keep bits. */
    int bits_read = 0;
    for (int b = 0; b < f->n_ops; b++) {
        if (f->ops[b].kind != TG_OP_ATTENTION_BWD) continue;
        for (int a = 0; a < b; a++)
            bits_read += f->ops[a].kind == TG_OP_ATTENTION && f->ops[a].out[0] == f->ops[b].in[1] &&
                         f->ops[a].out[2] >= 0 && f->ops[a].out[2] == f->ops[b].in[4] &&
                         f->tensors[f->ops[a].out[2]].dtype == TG_I32;
    }
    CHECK(bits_read == cfg.layers, "%s: %d of %d attention backwards read their forward's keep bits", preset,
          bits_read, cfg.layers);
    /* The same parameters at the same offsets, so one weight image fits both. */
    REQUIRE(f->pool_bytes[TG_POOL_PARAMS] == u->pool_bytes[TG_POOL_PARAMS], "%s: parameter pools differ", preset);
    int params = 0, layout_ok = 1;
    for (int t = 0; t < f->n_tensors; t++) {
        const tg_tensor *x = &f->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        params++;
        int found = 0;
        for (int v = 0; v < u->n_tensors; v++)
            found |= !strcmp(u->tensors[v].name, x->name) && u->tensors[v].offset == x->offset &&
                     u->tensors[v].bytes == x->bytes && (u->tensors[v].flags & TG_TENSOR_PARAM);
        layout_ok &= found;
    }
    REQUIRE(layout_ok && params > 10, "%s: parameter layouts differ", preset);

    size_t pbytes = f->pool_bytes[TG_POOL_PARAMS];
    float *grads[2] = {NULL, NULL};
    tg_step_stats st[2];
    if (step_pair(plans, st, grads)) {
        for (int m = 0; m < 2; m++) free(grads[m]), tg_plan_free(&plans[m]);
        return;
    }
    CHECK(isfinite(st[0].loss) && fabs(st[0].loss - st[1].loss) <= 1e-5 * fabs(st[1].loss),
          "%s: loss fused %.9g, unfused %.9g", preset, st[0].loss, st[1].loss);
    CHECK(fabs(st[0].grad_norm - st[1].grad_norm) <= 1e-5 * st[1].grad_norm && st[1].grad_norm > 0,
          "%s: gradient norm fused %.9g, unfused %.9g", preset, st[0].grad_norm, st[1].grad_norm);
    /* The whole gradient, then each parameter's; noise-level floor: 1e-7 of the whole norm. */
    int64_t n_all = (int64_t)(pbytes / 4);
    double rel_all = 0;
    CHECK(grads_match(grads[0], grads[1], n_all, 0.0, &rel_all), "%s: gradients differ by %.3g relative", preset,
          rel_all);
    double floor = 1e-7 * st[1].grad_norm;
    int floored = 0;
    for (int t = 0; t < f->n_tensors; t++) {
        const tg_tensor *x = &f->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        double rel;
        const float *a = grads[0] + x->offset / 4, *b = grads[1] + x->offset / 4;
        int ok = grads_match(a, b, tg_tensor_numel(x), floor, &rel);
        CHECK(ok, "%s: %s: gradient differs by %.3g relative", preset, x->name, rel);
        floored += ok && rel > 1e-5;
    }
    /* Only the key biases may need the floor. */
    CHECK(floored <= cfg.layers, "%s: %d parameters matched only within the noise floor", preset, floored);
    for (int m = 0; m < 2; m++) tg_plan_free(&plans[m]);
    free(grads[0]), free(grads[1]);
}

TG_TEST(test_model_fused_attention_tiny_bert) { fused_matches_unfused("tiny-bert", TG_TASK_CLASSIFY, 3); }
TG_TEST(test_model_fused_attention_tiny_gpt2_lm) { fused_matches_unfused("tiny-gpt2", TG_TASK_LM, 0); }

/* ---- fused vs separate bias gradients ------------------------------------------------ */

/* One training step (dropout on) with the bias gradients fused into the weight-gradient
 * matmuls (the default) and with separate BIAS_GRAD ops (`fuse_bias_grad = false`), from
 * the same weights and batch. Both sum dC in the same order into a zeroed gradient, so
 * the loss and every parameter gradient agree to 1e-6 (on the CPU, bit for bit). */
static void fused_bias_grad_matches(const char *preset, int task, int num_labels, int precision) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    if (pair_job(preset, task, num_labels, &cfg, &job)) return;
    job.precision = precision;
    tg_plan plans[2];
    for (int m = 0; m < 2; m++) {
        job.fuse_bias_grad = m == 0;
        REQUIRE(tg_compile_with_config(&job, &cfg, &plans[m], &err) == 0, "%s", err.msg);
    }
    const tg_plan *f = &plans[0], *u = &plans[1];
    int fused = 0;
    for (int o = 0; o < f->n_ops; o++)
        fused += (f->ops[o].kind == TG_OP_MATMUL && f->ops[o].p.matmul.bias_grad != 0) ||
                 (f->ops[o].kind == TG_OP_GELU_BWD && f->ops[o].out[1] >= 0);
    CHECK(count_kind(f, TG_OP_BIAS_GRAD) == 0 && fused > 0 && count_kind(u, TG_OP_BIAS_GRAD) == fused,
          "%s: %d fused bias gradients, bias_grad ops %d and %d", preset, fused, count_kind(f, TG_OP_BIAS_GRAD),
          count_kind(u, TG_OP_BIAS_GRAD));
    REQUIRE(f->pool_bytes[TG_POOL_PARAMS] == u->pool_bytes[TG_POOL_PARAMS], "%s: parameter pools differ", preset);

    float *grads[2] = {NULL, NULL};
    tg_step_stats st[2];
    if (step_pair(plans, st, grads)) {
        for (int m = 0; m < 2; m++) free(grads[m]), tg_plan_free(&plans[m]);
        return;
    }
    CHECK(isfinite(st[0].loss) && fabs(st[0].loss - st[1].loss) <= 1e-6 * fabs(st[1].loss),
          "%s: loss fused %.9g, separate %.9g", preset, st[0].loss, st[1].loss);
    CHECK(fabs(st[0].grad_norm - st[1].grad_norm) <= 1e-6 * st[1].grad_norm && st[1].grad_norm > 0,
          "%s: gradient norm fused %.9g, separate %.9g", preset, st[0].grad_norm, st[1].grad_norm);
    int biases = 0;
    for (int t = 0; t < f->n_tensors; t++) {
        const tg_tensor *x = &f->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        const float *a = grads[0] + x->offset / 4, *b = grads[1] + x->offset / 4;
        int64_t n = tg_tensor_numel(x);
        double diff = tg_l2_diff(a, b, n), norm = 0;
        for (int64_t i = 0; i < n; i++) norm += (double)b[i] * b[i];
        norm = sqrt(norm);
        CHECK(diff <= 1e-6 * norm, "%s: %s: gradient differs by %.3g relative", preset, x->name,
              diff / fmax(norm, 1e-30));
        biases += strstr(x->name, ".bias") && norm > 0;
    }
    CHECK(biases >= fused, "%s: only %d bias gradients are nonzero", preset, biases);
    for (int m = 0; m < 2; m++) tg_plan_free(&plans[m]);
    free(grads[0]), free(grads[1]);
}

TG_TEST(test_model_fused_bias_grad_tiny_bert) {
    fused_bias_grad_matches("tiny-bert", TG_TASK_CLASSIFY, 3, TG_PREC_FP32);
    fused_bias_grad_matches("tiny-bert", TG_TASK_CLASSIFY, 3, TG_PREC_BF16);
}
TG_TEST(test_model_fused_bias_grad_tiny_gpt2) {
    fused_bias_grad_matches("tiny-gpt2", TG_TASK_LM, 0, TG_PREC_FP32);
    fused_bias_grad_matches("tiny-gpt2", TG_TASK_CLASSIFY, 2, TG_PREC_FP32);
}

/* ---- GELU in the matmuls vs separate GELU ops ----------------------------------------- */

/* One training step (dropout on) with the MLP's tanh GELU as matmul epilogues (fuse_gelu,
 * the default: MATMUL activation 1 in the forward, 2 for the consumer's dA) and with
 * separate GELU / GELU_BWD ops, from the same weights and batch. In fp32 the epilogues
 * evaluate the separate ops' expressions on the same floats, so the loss and every
 * gradient agree bit for bit; in bf16 the fused forms skip one rounding of the product to
 * bf16, so they agree to bf16 precision. tanh_bert: a BERT-style model given the tanh GELU. */
static void fused_gelu_matches(const char *preset, int task, int num_labels, int precision, int tanh_bert) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    if (pair_job(preset, task, num_labels, &cfg, &job)) return;
    if (tanh_bert) cfg.gelu = TG_GELU_TANH;
    job.precision = precision;
    tg_plan plans[2];
    for (int m = 0; m < 2; m++) {
        job.fuse_gelu = m == 0;
        REQUIRE(tg_compile_with_config(&job, &cfg, &plans[m], &err) == 0, "%s", err.msg);
    }
    const tg_plan *f = &plans[0], *u = &plans[1];
    int fwd = 0, bwd = 0;
    for (int o = 0; o < f->n_ops; o++) {
        fwd += f->ops[o].kind == TG_OP_MATMUL && f->ops[o].p.matmul.activation == TG_MATMUL_ACT_GELU;
        bwd += f->ops[o].kind == TG_OP_MATMUL && f->ops[o].p.matmul.activation == TG_MATMUL_ACT_GELU_BWD;
    }
    CHECK(fwd == cfg.layers && bwd == cfg.layers && count_kind(f, TG_OP_GELU) == 0 &&
              count_kind(f, TG_OP_GELU_BWD) == 0 && count_kind(u, TG_OP_GELU) == cfg.layers &&
              count_kind(u, TG_OP_GELU_BWD) == cfg.layers,
          "%s: %d/%d fused gelu matmuls; gelu ops %d and %d", preset, fwd, bwd, count_kind(f, TG_OP_GELU),
          count_kind(u, TG_OP_GELU));
    REQUIRE(f->pool_bytes[TG_POOL_PARAMS] == u->pool_bytes[TG_POOL_PARAMS], "%s: parameter pools differ", preset);

    float *grads[2] = {NULL, NULL};
    tg_step_stats st[2];
    if (step_pair(plans, st, grads)) {
        for (int m = 0; m < 2; m++) free(grads[m]), tg_plan_free(&plans[m]);
        return;
    }
    size_t pbytes = f->pool_bytes[TG_POOL_PARAMS];
    if (precision == TG_PREC_FP32) {
        CHECK(isfinite(st[0].loss) && st[0].loss == st[1].loss && st[0].grad_norm == st[1].grad_norm,
              "%s: loss fused %.9g, separate %.9g; gradient norm %.9g, %.9g", preset, st[0].loss, st[1].loss,
              st[0].grad_norm, st[1].grad_norm);
        CHECK(memcmp(grads[0], grads[1], pbytes) == 0, "%s: gradients differ by %.3g relative", preset,
              tg_rel_err(grads[0], grads[1], (int64_t)(pbytes / 4)));
    } else {
        double rel = tg_rel_err(grads[0], grads[1], (int64_t)(pbytes / 4));
        CHECK(isfinite(st[0].loss) && fabs(st[0].loss - st[1].loss) <= 1e-2 * fabs(st[1].loss),
              "%s bf16: loss fused %.9g, separate %.9g", preset, st[0].loss, st[1].loss);
        CHECK(rel <= 5e-2 && st[0].grad_norm > 0, "%s bf16: gradients differ by %.3g relative", preset, rel);
    }
    for (int m = 0; m < 2; m++) tg_plan_free(&plans[m]);
    free(grads[0]), free(grads[1]);
}

TG_TEST(test_model_fused_gelu_tiny_gpt2) {
    fused_gelu_matches("tiny-gpt2", TG_TASK_LM, 0, TG_PREC_FP32, 0);
    fused_gelu_matches("tiny-gpt2", TG_TASK_CLASSIFY, 2, TG_PREC_FP32, 0);
    fused_gelu_matches("tiny-gpt2", TG_TASK_LM, 0, TG_PREC_BF16, 0);
}
TG_TEST(test_model_fused_gelu_tanh_bert) { fused_gelu_matches("tiny-bert", TG_TASK_CLASSIFY, 3, TG_PREC_FP32, 1); }

/* ---- fused vs separate residual LayerNorm --------------------------------------------- */

/* Three training steps (hidden dropout on) with the residual add, its dropout and the
 * LayerNorm after it as RESIDUAL_LAYERNORM ops (the default) and as separate DROPOUT, ADD
 * and LAYERNORM ops (`fuse_residual_layernorm = false`), from the same weights and batch.
 * The fused ops compute the same float expressions in the same order, and the gradient
 * sums that autodiff forms with matmul accumulation instead of ADD ops add the same
 * contributions in the same order, so on the CPU every loss, the gradients and the
 * weights after the last step are equal bit for bit. */
static void fused_residual_layernorm_matches(const char *preset, int task, int num_labels) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    if (pair_job(preset, task, num_labels, &cfg, &job)) return;
    job.steps = 3;
    tg_plan plans[2];
    for (int m = 0; m < 2; m++) {
        job.fuse_residual_layernorm = m == 0;
        REQUIRE(tg_compile_with_config(&job, &cfg, &plans[m], &err) == 0, "%s", err.msg);
    }
    const tg_plan *f = &plans[0], *u = &plans[1];
    /* Two per layer: attention and FFN outputs (BERT, RoBERTa), or the two residual adds
     * of each block, which carry ln_2, the next ln_1 and ln_f (GPT-2). */
    int L = cfg.layers, fused = count_kind(f, TG_OP_RESIDUAL_LAYERNORM);
    CHECK(fused == 2 * L && count_kind(f, TG_OP_RESIDUAL_LAYERNORM_BWD) == 2 * L &&
              count_kind(u, TG_OP_RESIDUAL_LAYERNORM) == 0,
          "%s: %d fused ops (want %d), unfused plan has %d", preset, fused, 2 * L,
          count_kind(u, TG_OP_RESIDUAL_LAYERNORM));
    CHECK(count_kind(u, TG_OP_DROPOUT) - count_kind(f, TG_OP_DROPOUT) == 4 * L &&
              count_kind(u, TG_OP_LAYERNORM) - count_kind(f, TG_OP_LAYERNORM) == 2 * L,
          "%s: dropout %d vs %d, layernorm %d vs %d", preset, count_kind(f, TG_OP_DROPOUT),
          count_kind(u, TG_OP_DROPOUT), count_kind(f, TG_OP_LAYERNORM), count_kind(u, TG_OP_LAYERNORM));
    REQUIRE(f->pool_bytes[TG_POOL_PARAMS] == u->pool_bytes[TG_POOL_PARAMS], "%s: parameter pools differ", preset);
    for (int t = 0; t < f->n_tensors; t++) {
        const tg_tensor *x = &f->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        int found = 0;
        for (int v = 0; v < u->n_tensors && !found; v++)
            found = !strcmp(u->tensors[v].name, x->name) && u->tensors[v].offset == x->offset;
        CHECK(found, "%s: parameter %s is not at the same offset in both plans", preset, x->name);
    }

    size_t pbytes = f->pool_bytes[TG_POOL_PARAMS];
    float *grads[2] = {NULL, NULL}, *weights[2] = {NULL, NULL};
    tg_step_stats st[3 * 2];
    if (train_pair(plans, 3, st, grads, weights) == 0) {
        for (int s = 0; s < 3; s++)
            CHECK(isfinite(st[2 * s].loss) && st[2 * s].loss == st[2 * s + 1].loss &&
                      st[2 * s].grad_norm == st[2 * s + 1].grad_norm,
                  "%s: step %d: loss fused %.9g, separate %.9g; gradient norm %.9g vs %.9g", preset, s + 1,
                  st[2 * s].loss, st[2 * s + 1].loss, st[2 * s].grad_norm, st[2 * s + 1].grad_norm);
        CHECK(!memcmp(grads[0], grads[1], pbytes), "%s: gradients differ (%.3g L2)", preset,
              tg_l2_diff(grads[0], grads[1], (int64_t)(pbytes / 4)));
        CHECK(!memcmp(weights[0], weights[1], pbytes), "%s: weights after 3 steps differ (%.3g L2)", preset,
              tg_l2_diff(weights[0], weights[1], (int64_t)(pbytes / 4)));
    }
    for (int m = 0; m < 2; m++) free(grads[m]), free(weights[m]), tg_plan_free(&plans[m]);
}

TG_TEST(test_model_fused_residual_layernorm_tiny_bert) {
    fused_residual_layernorm_matches("tiny-bert", TG_TASK_CLASSIFY, 3);
}
TG_TEST(test_model_fused_residual_layernorm_tiny_roberta) {
    fused_residual_layernorm_matches("tiny-roberta", TG_TASK_CLASSIFY, 2);
}
TG_TEST(test_model_fused_residual_layernorm_tiny_gpt2) {
    fused_residual_layernorm_matches("tiny-gpt2", TG_TASK_LM, 0);
    fused_residual_layernorm_matches("tiny-gpt2", TG_TASK_CLASSIFY, 2);
}

/* ---- packed vs separate query, key and value projections ----------------------------- */

/* Three training steps (dropout on) of BERT or RoBERTa with query, key and value as one
 * packed product (`fuse_qkv`, the default) and as three (`fuse_qkv = false`), from the
 * same weights and batches. The packed plan's parameters keep their names and shapes. The
 * forward products are the same sums; the input gradient sums q, k and v's contributions
 * in one product instead of three products and two adds, which changes only rounding. So
 * the third step's loss, the first step's whole gradient and the whole weights after the
 * three updates agree to 1e-6, and each parameter's gradient and weights to 1e-5 (AdamW's
 * m / sqrt(v) magnifies the relative error of small gradient elements). The key biases' gradient is zero in exact
 * arithmetic: rounding noise, below a floor, whose updates are left out
 * (tg_rel_err_after_update). */
static void packed_qkv_matches(const char *preset, int num_labels, int attention) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    if (pair_job(preset, TG_TASK_CLASSIFY, num_labels, &cfg, &job)) return;
    job.attention = attention, job.steps = 3;
    tg_plan plans[2];
    for (int m = 0; m < 2; m++) {
        job.fuse_qkv = m == 0;
        REQUIRE(tg_compile_with_config(&job, &cfg, &plans[m], &err) == 0, "%s", err.msg);
    }
    const tg_plan *f = &plans[0], *u = &plans[1];
    int L = cfg.layers, mm[2] = {0, 0}, packed_views = 0;
    for (int m = 0; m < 2; m++)
        for (int o = 0; o < plans[m].n_ops; o++) mm[m] += plans[m].ops[o].kind == TG_OP_MATMUL;
    /* Per layer 2 forward and 4 backward products fewer. */
    CHECK(mm[1] - mm[0] == 6 * L, "%s: %d matmuls packed, %d separate", preset, mm[0], mm[1]);
    for (int t = 0; t < f->n_tensors; t++)
        packed_views += (f->tensors[t].flags & TG_TENSOR_PARAM) && (f->tensors[t].flags & TG_TENSOR_VIEW);
    CHECK(packed_views == 2 * L, "%s: %d packed parameter views", preset, packed_views);

    float *grads[2] = {NULL, NULL}, *params[2] = {NULL, NULL};
    tg_step_stats st[2];
    if (train_pair_by_name(plans, 3, st, grads, params) == 0) {
        CHECK(isfinite(st[0].loss) && fabs(st[0].loss - st[1].loss) <= 1e-6 * fabs(st[1].loss),
              "%s: step 3 loss packed %.9g, separate %.9g", preset, st[0].loss, st[1].loss);
        CHECK(fabs(st[0].grad_norm - st[1].grad_norm) <= 1e-6 * st[1].grad_norm && st[1].grad_norm > 0,
              "%s: step 3 gradient norm packed %.9g, separate %.9g", preset, st[0].grad_norm, st[1].grad_norm);
        double grad_max = 0, grad_norm = 0;
        for (int64_t i = 0; i < (int64_t)(u->pool_bytes[TG_POOL_GRADS] / 4); i++)
            grad_max = fmax(grad_max, fabs(grads[1][i])), grad_norm += (double)grads[1][i] * grads[1][i];
        /* Noise floors: a parameter's whole gradient (as fused_matches_unfused), an element. */
        double floor = 1e-7 * sqrt(grad_norm), elem_floor = 1e-7 * grad_max;
        double sq[4] = {0, 0, 0, 0}; /* gradient diff, norm; weight diff, norm */
        int compared = 0, floored = 0;
        int64_t left_out = 0, n_params = 0;
        for (int t = 0; t < u->n_tensors; t++) {
            const tg_tensor *y = &u->tensors[t];
            if (!(y->flags & TG_TENSOR_PARAM) || (y->flags & TG_TENSOR_VIEW)) continue;
            int k = tg_test_tensor_named(f, y->name);
            if (!CHECK(k >= 0 && f->tensors[k].bytes == y->bytes, "%s: %s is missing from the packed plan", preset,
                       y->name))
                continue;
            const tg_tensor *x = &f->tensors[k];
            int64_t n = tg_tensor_numel(y);
            n_params += n;
            const float *ga = grads[0] + x->offset / 4, *gb = grads[1] + y->offset / 4;
            const float *pa = params[0] + x->offset / 4, *pb = params[1] + y->offset / 4;
            double diff = tg_l2_diff(ga, gb, n), norm = 0, wnorm = 0;
            for (int64_t i = 0; i < n; i++) norm += (double)gb[i] * gb[i], wnorm += (double)pb[i] * pb[i];
            sq[0] += diff * diff, sq[1] += norm, sq[3] += wnorm;
            norm = sqrt(norm);
            CHECK(diff <= 1e-5 * norm || diff <= floor, "%s: %s: gradient differs by %.3g relative", preset, y->name,
                  diff / fmax(norm, 1e-30));
            floored += diff > 1e-5 * norm;
            double rel = tg_rel_err_after_update(pa, pb, ga, gb, n, elem_floor, &left_out);
            CHECK(rel <= 1e-5, "%s: %s: weights differ by %.3g relative after 3 steps", preset, y->name, rel);
            sq[2] += rel * rel * wnorm;
            compared++;
        }
        double grel = sqrt(sq[0] / sq[1]), wrel = sqrt(sq[2] / sq[3]);
        CHECK(grel <= 1e-6 && wrel <= 1e-6, "%s: the whole gradient differs by %.3g, the weights by %.3g relative",
              preset, grel, wrel);
        CHECK(compared > 10 && floored <= L, "%s: %d parameters compared, %d only within the noise floor", preset,
              compared, floored);
        CHECK(left_out <= (int64_t)L * cfg.hidden + n_params / 1000, "%s: %lld elements with noise-level gradients",
              preset, (long long)left_out);
    }
    for (int m = 0; m < 2; m++) free(grads[m]), free(params[m]), tg_plan_free(&plans[m]);
}

TG_TEST(test_model_packed_qkv_tiny_bert) {
    packed_qkv_matches("tiny-bert", 3, TG_ATTENTION_FUSED);
    packed_qkv_matches("tiny-bert", 3, TG_ATTENTION_UNFUSED);
}
TG_TEST(test_model_packed_qkv_tiny_roberta) {
    packed_qkv_matches("tiny-roberta", 2, TG_ATTENTION_FUSED);
    packed_qkv_matches("tiny-roberta", 2, TG_ATTENTION_UNFUSED);
}
