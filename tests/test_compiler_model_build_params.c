/* The parameters a compiled plan holds (compiler/model_build.c), tiny BERT and GPT-2: every
 * matrix (linear weights, embedding tables) takes weight decay and a normal init of the
 * config's initializer_range (GPT-2's c_proj weights scaled by 1 / sqrt(2 n_layer)); every
 * vector (biases, LayerNorm gamma and beta) takes none and starts at zero (gamma at one);
 * linear weights are [out, in] as nn.Linear stores them, GPT-2's Conv1D ones [in, out]; a
 * packed query, key and value view carries its members' decay flag. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

static int compile_preset(const char *preset, int task, int fuse_qkv, tg_model_config *cfg, tg_plan *p) {
    tg_err err;
    if (!CHECK(tg_model_config_load(preset, cfg, &err) == 0, "%s", err.msg)) return 0;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", preset);
    job.task = task, job.batch = 2, job.seq = 16, job.steps = 1, job.fuse_qkv = fuse_qkv;
    return CHECK(tg_compile_with_config(&job, cfg, p, &err) == 0, "%s: %s", preset, err.msg);
}

static const tg_tensor *find(const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) return &p->tensors[t];
    return NULL;
}

static int ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Every parameter of p (views aside) by the rules above; how many there were. */
static int check_params(const tg_plan *p, const tg_model_config *cfg, const char *what) {
    const int gpt2 = cfg->arch == TG_ARCH_GPT2;
    const float std = cfg->initializer_range, proj_std = std / sqrtf(2.0f * (float)cfg->layers);
    int n = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        n++;
        const int matrix = x->ndim == 2;
        CHECK(!!(x->flags & TG_TENSOR_NO_DECAY) == !matrix, "%s: %s %s weight decay", what, x->name,
              matrix ? "lacks" : "takes");
        if (matrix) {
            const float want = gpt2 && ends_with(x->name, ".c_proj.weight") ? proj_std : std;
            CHECK(x->init == TG_INIT_NORMAL && fabsf(x->init_std - want) <= 1e-7f, "%s: %s init %d std %g, want normal %g",
                  what, x->name, x->init, x->init_std, want);
        } else {
            const int gamma = gpt2 ? strstr(x->name, ".ln_") && ends_with(x->name, ".weight")
                                   : strstr(x->name, "LayerNorm.weight") != NULL;
            CHECK(x->init == (gamma ? TG_INIT_ONES : TG_INIT_ZEROS) && x->init_std == 0.0f, "%s: %s init %d std %g", what,
                  x->name, x->init, x->init_std);
        }
    }
    return n;
}

static void expect_shape(const tg_plan *p, const char *name, int64_t d0, int64_t d1) {
    const tg_tensor *x = find(p, name);
    CHECK(x && x->ndim == 2 && x->shape[0] == d0 && x->shape[1] == d1, "%s: [%lld, %lld], want [%lld, %lld]", name,
          x ? (long long)x->shape[0] : -1LL, x ? (long long)x->shape[1] : -1LL, (long long)d0, (long long)d1);
}

TG_TEST(test_compiler_model_build_param_decay_and_init) {
    for (int fuse = 0; fuse < 2; fuse++) {
        tg_model_config cfg;
        tg_plan p;
        if (!compile_preset("tiny-bert", TG_TASK_CLASSIFY, fuse, &cfg, &p)) return;
        const int D = cfg.hidden, I = cfg.intermediate;
        /* 5 embedding tensors, 16 per layer, the pooler's 2 and the classifier's 2. */
        const int n = check_params(&p, &cfg, fuse ? "bert, fused qkv" : "bert");
        CHECK(n == 5 + 16 * cfg.layers + 4, "bert: %d parameters", n);
        expect_shape(&p, "bert.encoder.layer.0.intermediate.dense.weight", I, D);
        expect_shape(&p, "bert.encoder.layer.0.output.dense.weight", D, I);
        expect_shape(&p, "classifier.weight", 2, D);
        const tg_tensor *qkv = find(&p, "bert.encoder.layer.1.attention.self.qkv.weight"),
                        *qkv_bias = find(&p, "bert.encoder.layer.1.attention.self.qkv.bias");
        if (fuse)
            CHECK(qkv && qkv_bias && !(qkv->flags & TG_TENSOR_NO_DECAY) && (qkv_bias->flags & TG_TENSOR_NO_DECAY) &&
                      (qkv->flags & TG_TENSOR_VIEW),
                  "the packed query, key and value: decay on the weight only");
        else
            CHECK(!qkv && !qkv_bias, "a packed view without fuse_qkv");
        tg_plan_free(&p);
    }
    tg_model_config cfg;
    tg_plan p;
    if (!compile_preset("tiny-gpt2", TG_TASK_LM, 1, &cfg, &p)) return;
    const int D = cfg.hidden, I = cfg.intermediate;
    /* wte, wpe, 12 per layer, ln_f's 2. */
    const int n = check_params(&p, &cfg, "gpt2");
    CHECK(n == 2 + 12 * cfg.layers + 2, "gpt2: %d parameters", n);
    expect_shape(&p, "transformer.h.0.attn.c_attn.weight", D, 3 * D);
    expect_shape(&p, "transformer.h.0.mlp.c_fc.weight", D, I);
    expect_shape(&p, "transformer.h.1.mlp.c_proj.weight", I, D);
    tg_plan_free(&p);
}
