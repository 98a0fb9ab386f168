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

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

/* Random inputs with one padded row; positions as the dataset code makes them. */
static void fill_inputs(tg_trainer *tr, const tg_plan *p) {
    const tg_plan_io *io = &p->io;
    int B = p->job.batch, T = p->job.seq, V = p->model.vocab_size;
    int pad = tg_job_pad_id(&p->job, &p->model);
    int32_t *ids = tg_trainer_input(tr, io->input_ids), *pos = tg_trainer_input(tr, io->position_ids);
    int32_t *types = tg_trainer_input(tr, io->token_type_ids), *labels = tg_trainer_input(tr, io->labels);
    float *mask = tg_trainer_input(tr, io->attention_mask);
    for (int b = 0; b < B; b++) {
        int len = b == 1 ? T / 2 : T;
        int real = 0;
        for (int t = 0; t < T; t++) {
            int i = b * T + t, keep = t < len;
            ids[i] = keep ? (int32_t)(pad + 1 + rnd() % (uint32_t)(V - pad - 1)) : pad;
            mask[i] = keep ? 1.0f : 0.0f;
            real += keep;
            pos[i] = p->model.arch == TG_ARCH_ROBERTA ? (keep ? pad + real : pad) : t;
            if (types) types[i] = keep && p->model.type_vocab_size > 1 ? (int32_t)(rnd() % 2) : 0;
            if (p->job.task == TG_TASK_LM) labels[i] = t + 1 < len ? (int32_t)(rnd() % (uint32_t)V) : TG_IGNORE_INDEX;
        }
        if (p->job.task == TG_TASK_CLASSIFY) labels[b] = (int32_t)(rnd() % (uint32_t)p->job.num_labels);
    }
}

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
    rng_state = 0x9E3779B97F4A7C15ull;
    fill_inputs(&tr, &p);
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
            v[i] = (gn > 0 ? g[i] / gn : 0) + ((double)(rnd() % 2001) / 1000.0 - 1.0) / sqrt((double)n);
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

/* A vocabulary that is not a multiple of 64: the tied LM head reads a zero-padded view. */
TG_TEST(test_model_grad_tiny_gpt2_lm_padded_vocab) { gradcheck_model_vocab("tiny-gpt2", TG_TASK_LM, 0, 101); }
