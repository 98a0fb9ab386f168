/* LoRA on the BERT, RoBERTa and GPT-2 families (tests/test_lora.c has Llama's): the modules
 * PEFT's names target in each (BERT's "dense" takes the pooler's and the masked-LM head's
 * dense too; GPT-2's c_attn is one pair of out 3 x hidden over the Conv1D), the plan's
 * structure (base frozen, adapters and the head PEFT keeps as modules_to_save trainable),
 * the model it computes against the base model with W + (alpha / r) B A merged in ((B A)^T
 * for GPT-2's [in, out] weights), its gradients against finite differences, training that
 * moves the adapters and the head alone, and the export: the merged model.safetensors that
 * loads as a plain model, adapter_config.json and adapter_model.safetensors as PEFT saves
 * them. Runs on the device the suite tests (TG_TEST_DEVICE). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "runtime/hf_export.h"
#include "runtime/lora_export.h"
#include "runtime/trainer.h"
#include "tests/harness.h"
#include "tests/lora_fixtures.h"
#include "tests/train_record.h"

#define BERT_CLS_BASE "model = tiny-bert\ntask = classify\nnum_labels = 3\nbatch = 2\nseq = 12\ntrain_data = x\nseed = 5\n"
#define GPT2_LM_BASE "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 12\ntrain_data = x\nseed = 5\n"
#define BERT_CLS BERT_CLS_BASE "steps = 10\n"
#define GPT2_LM GPT2_LM_BASE "steps = 10\n"
#define BERT_ALL "lora_targets = query,key,value,dense\n"
#define GPT2_ALL "lora_targets = c_attn,c_proj,c_fc\n"

/* The job compiled; with no_dropout, against its model's config with every dropout 0, so
 * that forwards repeat exactly. */
static int compile_text(const char *text, int no_dropout, tg_plan *p, tg_err *err) {
    tg_job job;
    if (tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, err)) return -1;
    if (!no_dropout) return tg_compile(&job, p, err);
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (tg_model_config_load(job.model, &cfg, err)) return -1;
    cfg.hidden_dropout = cfg.embedding_dropout = cfg.attention_dropout = cfg.classifier_dropout = 0.0f;
    return tg_compile_with_config(&job, &cfg, p, err);
}

static int find_tensor(const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) return t;
    return -1;
}

static int is_adapter(const char *name) { return strstr(name, ".lora_A.weight") || strstr(name, ".lora_B.weight"); }

/* The trainable parameters (no views), each of which must be an adapter or start with
 * `head` (NULL: none may); the count, or -1 after a CHECK failed. */
static int count_trainable(const tg_plan *p, const char *head, int *frozen) {
    int n = 0, bad = 0;
    *frozen = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->flags & TG_TENSOR_VIEW) continue;
        *frozen += (x->flags & TG_TENSOR_FROZEN) != 0;
        if (!(x->flags & TG_TENSOR_PARAM)) continue;
        n++;
        const int ok = is_adapter(x->name) || (head && !strncmp(x->name, head, strlen(head)));
        bad += !CHECK(ok, "%s is trainable", x->name);
    }
    return bad ? -1 : n;
}

static int flags_of(const tg_plan *p, const char *name) {
    const int t = find_tensor(p, name);
    return t < 0 ? -1 : (int)p->tensors[t].flags;
}

/* The shapes of a pair: A [r, in] (uniform +-1/sqrt(in)), B [out, r] (zeros). */
static int pair_is(const tg_plan *p, const char *module, int64_t r, int64_t in, int64_t out) {
    char name[200];
    snprintf(name, sizeof name, "%s.lora_A.weight", module);
    const int a = find_tensor(p, name);
    snprintf(name, sizeof name, "%s.lora_B.weight", module);
    const int b = find_tensor(p, name);
    if (a < 0 || b < 0) return 0;
    const tg_tensor *x = &p->tensors[a], *y = &p->tensors[b];
    return x->shape[0] == r && x->shape[1] == in && y->shape[0] == out && y->shape[1] == r && x->init == TG_INIT_UNIFORM &&
           fabsf(x->init_std - 1.0f / sqrtf((float)in)) < 1e-7f && y->init == TG_INIT_ZEROS &&
           (x->flags & TG_TENSOR_PARAM) && (y->flags & TG_TENSOR_PARAM);
}

static int count_ops(const tg_plan *p, int kind, int phase) {
    int n = 0;
    for (int o = 0; o < p->n_ops; o++) n += p->ops[o].kind == kind && (phase < 0 || p->ops[o].phase == phase);
    return n;
}

/* The forward matmuls with the GELU epilogue. */
static int gelu_epilogues(const tg_plan *p) {
    int n = 0;
    for (int o = 0; o < p->n_ops; o++)
        n += p->ops[o].kind == TG_OP_MATMUL && p->ops[o].phase == TG_PHASE_FORWARD &&
             p->ops[o].p.matmul.activation == TG_MATMUL_ACT_GELU;
    return n;
}

TG_TEST(test_lora_bert_plan_structure) {
    tg_plan p;
    tg_err err;
    int frozen;
    /* Every module BERT's names reach: q, k, v, the three dense of each layer and the pooler's. */
    REQUIRE(compile_text(BERT_CLS "lora_r = 4\n" BERT_ALL, 0, &p, &err) == 0, "%s", err.msg);
    /* 2 layers x 6 modules and the pooler, (A, B) each, and the classifier's weight and bias;
     * the 39 tensors of tiny-bert's classifier model but those two frozen, its pooler too. */
    int n = count_trainable(&p, "classifier.", &frozen);
    CHECK(n == 2 * (2 * 6 + 1) + 2 && frozen == 39, "%d trainable, %d frozen", n, frozen);
    CHECK(pair_is(&p, "bert.encoder.layer.0.attention.self.key", 4, 32, 32) &&
              pair_is(&p, "bert.encoder.layer.1.attention.output.dense", 4, 32, 32) &&
              pair_is(&p, "bert.encoder.layer.0.intermediate.dense", 4, 32, 64) &&
              pair_is(&p, "bert.encoder.layer.1.output.dense", 4, 64, 32) && pair_is(&p, "bert.pooler.dense", 4, 32, 32),
          "adapter shapes");
    CHECK(flags_of(&p, "classifier.weight") & TG_TENSOR_PARAM && flags_of(&p, "classifier.bias") & TG_TENSOR_PARAM &&
              flags_of(&p, "bert.pooler.dense.weight") & TG_TENSOR_FROZEN &&
              flags_of(&p, "bert.encoder.layer.0.attention.self.query.bias") & TG_TENSOR_FROZEN &&
              flags_of(&p, "bert.embeddings.LayerNorm.weight") & TG_TENSOR_FROZEN,
          "classifier trainable, pooler and the base frozen");
    /* q, k and v made apart (the attention reads three inputs), the intermediate GELU an op
     * after the adapter's sum, the frozen embeddings without a backward. */
    CHECK(find_tensor(&p, "bert.encoder.layer.0.attention.self.qkv.weight") < 0, "q, k and v packed");
    for (int o = 0; o < p.n_ops; o++)
        if (p.ops[o].kind == TG_OP_ATTENTION) CHECK(!p.ops[o].p.attention.packed && p.ops[o].in[2] >= 0, "packed attention");
    CHECK(count_ops(&p, TG_OP_GELU, TG_PHASE_FORWARD) == 2, "the intermediate GELUs");
    CHECK(count_ops(&p, TG_OP_EMBEDDING_BWD, -1) == 0, "a frozen embedding has a backward");
    CHECK(p.freeze_pruned_ops > 0 && p.freeze_pruned_flops > 0, "pruned %d ops", p.freeze_pruned_ops);
    /* 13 adapted modules, each product scaled by the default alpha 8 over r 4. */
    int scaled = 0;
    for (int o = 0; o < p.n_ops; o++)
        scaled += p.ops[o].kind == TG_OP_MATMUL && p.ops[o].phase == TG_PHASE_FORWARD && p.ops[o].p.matmul.alpha == 2.0f;
    CHECK(scaled == 13, "%d products scaled by 2", scaled);
    tg_plan_free(&p);

    /* PEFT's default for BERT: query and value; key and the pooler without adapters. */
    REQUIRE(compile_text(BERT_CLS "lora_r = 2\n", 0, &p, &err) == 0, "%s", err.msg);
    n = count_trainable(&p, "classifier.", &frozen);
    CHECK(n == 2 * 2 * 2 + 2 && pair_is(&p, "bert.encoder.layer.1.attention.self.value", 2, 32, 32) &&
              find_tensor(&p, "bert.encoder.layer.0.attention.self.key.lora_A.weight") < 0 &&
              find_tensor(&p, "bert.pooler.dense.lora_A.weight") < 0,
          "default targets: %d trainable", n);
    tg_plan_free(&p);

    /* dense alone: q, k and v stay packed (fuse_qkv), the pooler is adapted. */
    REQUIRE(compile_text(BERT_CLS "lora_r = 2\nlora_targets = dense\n", 0, &p, &err) == 0, "%s", err.msg);
    CHECK(find_tensor(&p, "bert.encoder.layer.0.attention.self.qkv.weight") >= 0 &&
              find_tensor(&p, "bert.encoder.layer.0.attention.self.query.lora_A.weight") < 0 &&
              pair_is(&p, "bert.pooler.dense", 2, 32, 32),
          "dense: q, k and v packed, the pooler adapted");
    tg_plan_free(&p);
    /* value alone: q, k and v apart. */
    REQUIRE(compile_text(BERT_CLS "lora_r = 2\nlora_targets = value\n", 0, &p, &err) == 0, "%s", err.msg);
    CHECK(find_tensor(&p, "bert.encoder.layer.0.attention.self.qkv.weight") < 0 &&
              find_tensor(&p, "bert.encoder.layer.0.attention.self.query.weight") >= 0,
          "value targeted: q, k and v apart");
    tg_plan_free(&p);

    /* Masked LM: no head trains (PEFT has no modules_to_save for it); "dense" reaches the
     * head's transform dense. Question answering: qa_outputs trains whole. */
    REQUIRE(compile_text("model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\nlora_r = 2\n"
                         "lora_targets = dense\n",
                         0, &p, &err) == 0,
            "%s", err.msg);
    n = count_trainable(&p, NULL, &frozen);
    CHECK(n == 2 * (2 * 3 + 1) && pair_is(&p, "cls.predictions.transform.dense", 2, 32, 32) &&
              flags_of(&p, "cls.predictions.bias") & TG_TENSOR_FROZEN &&
              flags_of(&p, "cls.predictions.transform.LayerNorm.weight") & TG_TENSOR_FROZEN,
          "mlm: %d trainable", n);
    tg_plan_free(&p);
    REQUIRE(compile_text("model = tiny-bert\ntask = qa\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\nlora_r = 2\n", 0, &p,
                         &err) == 0,
            "%s", err.msg);
    n = count_trainable(&p, "qa_outputs.", &frozen);
    CHECK(n == 2 * 2 * 2 + 2 && flags_of(&p, "qa_outputs.weight") & TG_TENSOR_PARAM, "qa: %d trainable", n);
    tg_plan_free(&p);

    /* RoBERTa: the classification head (classifier.dense, classifier.out_proj) is
     * modules_to_save, which "dense" does not reach; the encoder's dense are adapted. */
    REQUIRE(compile_text("model = tiny-roberta\ntask = classify\nnum_labels = 2\nbatch = 2\nseq = 12\ntrain_data = x\n"
                         "steps = 2\nlora_r = 2\nlora_targets = dense\n",
                         0, &p, &err) == 0,
            "%s", err.msg);
    n = count_trainable(&p, "classifier.", &frozen);
    CHECK(n == 2 * 2 * 3 + 4 && find_tensor(&p, "classifier.dense.lora_A.weight") < 0 &&
              pair_is(&p, "roberta.encoder.layer.0.intermediate.dense", 2, 32, 64) &&
              flags_of(&p, "classifier.dense.weight") & TG_TENSOR_PARAM &&
              flags_of(&p, "classifier.out_proj.bias") & TG_TENSOR_PARAM,
          "roberta: %d trainable", n);
    tg_plan_free(&p);
}

TG_TEST(test_lora_gpt2_plan_structure) {
    tg_plan p;
    tg_err err;
    int frozen;
    REQUIRE(compile_text(GPT2_LM "lora_r = 4\n" GPT2_ALL, 0, &p, &err) == 0, "%s", err.msg);
    /* c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj of 2 layers; all 28 tensors of tiny-gpt2
     * frozen, the tied embedding too. */
    int n = count_trainable(&p, NULL, &frozen);
    CHECK(n == 2 * 4 * 2 && frozen == 28, "%d trainable, %d frozen", n, frozen);
    /* A [r, in] and B [out, r] as nn.Linear's, though the base weights are Conv1D's [in, out]. */
    const int w = find_tensor(&p, "transformer.h.0.attn.c_attn.weight");
    CHECK(w >= 0 && p.tensors[w].shape[0] == 32 && p.tensors[w].shape[1] == 96 && (p.tensors[w].flags & TG_TENSOR_FROZEN),
          "c_attn.weight");
    CHECK(pair_is(&p, "transformer.h.0.attn.c_attn", 4, 32, 96) && pair_is(&p, "transformer.h.1.attn.c_proj", 4, 32, 32) &&
              pair_is(&p, "transformer.h.0.mlp.c_fc", 4, 32, 128) && pair_is(&p, "transformer.h.1.mlp.c_proj", 4, 128, 32),
          "adapter shapes");
    CHECK(flags_of(&p, "transformer.wte.weight") & TG_TENSOR_FROZEN && count_ops(&p, TG_OP_EMBEDDING_BWD, -1) == 0,
          "the tied embedding trains");
    CHECK(gelu_epilogues(&p) == 0 && p.freeze_pruned_ops > 0, "c_fc's GELU fused; pruned %d", p.freeze_pruned_ops);
    tg_plan_free(&p);

    /* PEFT's default for GPT-2: c_attn alone. */
    REQUIRE(compile_text(GPT2_LM "lora_r = 2\n", 0, &p, &err) == 0, "%s", err.msg);
    n = count_trainable(&p, NULL, &frozen);
    CHECK(n == 4 && pair_is(&p, "transformer.h.1.attn.c_attn", 2, 32, 96) &&
              find_tensor(&p, "transformer.h.0.attn.c_proj.lora_A.weight") < 0 && gelu_epilogues(&p) == 2,
          "default targets: %d trainable", n);
    tg_plan_free(&p);

    /* Paths' tails as PEFT matches them: `mlp.c_proj` leaves attn.c_proj alone; `h.0.mlp.c_fc`
     * adapts layer 0's only. */
    REQUIRE(compile_text(GPT2_LM "lora_r = 2\nlora_targets = mlp.c_proj, h.0.mlp.c_fc\n", 0, &p, &err) == 0, "%s",
            err.msg);
    n = count_trainable(&p, NULL, &frozen);
    CHECK(n == 2 * 2 + 2 && pair_is(&p, "transformer.h.0.mlp.c_proj", 2, 128, 32) &&
              pair_is(&p, "transformer.h.1.mlp.c_proj", 2, 128, 32) && pair_is(&p, "transformer.h.0.mlp.c_fc", 2, 32, 128) &&
              find_tensor(&p, "transformer.h.1.mlp.c_fc.lora_A.weight") < 0 &&
              find_tensor(&p, "transformer.h.0.attn.c_proj.lora_A.weight") < 0 &&
              find_tensor(&p, "transformer.h.1.attn.c_proj.lora_A.weight") < 0,
          "dotted targets: %d trainable", n);
    tg_plan_free(&p);

    /* Classification: score trains whole. */
    REQUIRE(compile_text("model = tiny-gpt2\ntask = classify\nnum_labels = 2\nbatch = 2\nseq = 12\ntrain_data = x\n"
                         "steps = 2\nlora_r = 2\n",
                         0, &p, &err) == 0,
            "%s", err.msg);
    n = count_trainable(&p, "score.", &frozen);
    CHECK(n == 5 && flags_of(&p, "score.weight") & TG_TENSOR_PARAM, "classify: %d trainable", n);
    tg_plan_free(&p);
}

TG_TEST(test_lora_families_refuse_unknown_targets) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {BERT_CLS "lora_r = 4\nlora_targets = query,q_proj\n",
         "job.txt:10: key 'lora_targets': 'q_proj' is not a module LoRA adapts in the bert family (query, key, value, "
         "dense)"},
        {BERT_CLS "lora_r = 4\nlora_targets = classifier\n", "'classifier' is not a module LoRA adapts in the bert family"},
        {"model = tiny-roberta\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nlora_r = 4\nlora_targets = pooler\n",
         "job.txt:7: key 'lora_targets': 'pooler' is not a module LoRA adapts in the roberta family (query, key, value, "
         "dense)"},
        {GPT2_LM "lora_r = 4\nlora_targets = c_attn,query\n",
         "job.txt:9: key 'lora_targets': 'query' is not a module LoRA adapts in the gpt2 family (c_attn, c_proj, c_fc)"},
        {GPT2_LM "lora_r = 4\nlora_targets = q_proj\n", "'q_proj' is not a module LoRA adapts in the gpt2 family"},
        /* A path's tail: its last part must be such a module, and it must name one. */
        {GPT2_LM "lora_r = 4\nlora_targets = mlp.query\n", "'mlp.query' is not a module LoRA adapts in the gpt2 family"},
        {GPT2_LM "lora_r = 4\nlora_targets = c_attn,mlp.c_attn\n",
         "job.txt:9: key 'lora_targets': 'mlp.c_attn' names no module of the model (its modules are such as "
         "transformer.h.0.attn.c_attn)"},
        {GPT2_LM "lora_r = 4\nlora_targets = h.2.mlp.c_fc\n", "'h.2.mlp.c_fc' names no module of the model"},
        {GPT2_LM "lora_r = 4\nlora_targets = mlp..c_proj\n",
         "job.txt:9: key 'lora_targets': 'mlp..c_proj' is not a comma-separated list of module names or paths' tails"},
        {GPT2_LM "lora_r = 4\nlora_targets = c_attn,.c_proj\n", "is not a comma-separated list of module names"},
        {GPT2_LM "lora_r = 4\nlora_targets = c_proj.\n", "is not a comma-separated list of module names"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_plan p;
        tg_err err = {{0}};
        const int rc = compile_text(cases[k].text, 0, &p, &err);
        if (rc == 0) tg_plan_free(&p);
        CHECK(rc != 0 && strstr(err.msg, cases[k].want), "case %zu: rc %d '%s', want '%s'", k, rc, err.msg, cases[k].want);
    }
    /* Without lora_r the targets are not read. */
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(GPT2_LM "lora_targets = query\n", 0, &p, &err) == 0, "%s", err.msg);
    tg_plan_free(&p);
}


/* W + scale B A into w (the base weight [out, in], or [in, out] with conv1d), in double. */
static void merge(float *w, const float *a, const float *b, int64_t out, int64_t in, int64_t r, double scale, int conv1d) {
    for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < in; j++) {
            double s = 0;
            for (int64_t k = 0; k < r; k++) s += (double)b[i * r + k] * a[k * in + j];
            float *at = conv1d ? &w[j * out + i] : &w[i * in + j];
            *at = (float)(*at + scale * s);
        }
}

/* While B is zero the adapted model is the base model; with random B it is the base model
 * with every adapted W replaced by W + (alpha / r) B A (its transpose for GPT-2's Conv1D). */
static void check_equals_merged(const char *what, const char *base_job, const char *lora_keys, double scale, int conv1d) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", base_job, lora_keys);
    tg_plan base, lora;
    tg_err err;
    REQUIRE(compile_text(base_job, 1, &base, &err) == 0, "%s: %s", what, err.msg);
    REQUIRE(compile_text(text, 1, &lora, &err) == 0, "%s: %s", what, err.msg);
    tg_trainer tb, tl;
    REQUIRE(tg_test_lora_open_fixed(&tb, &base, &err) == 0 && tg_test_lora_open_fixed(&tl, &lora, &err) == 0, "%s: %s", what, err.msg);
    const int64_t n = tg_tensor_numel(&base.tensors[base.io.logits]);
    float lb, ll;
    float *yb = forward_logits(&tb, &base, &lb, &err), *yl = yb ? forward_logits(&tl, &lora, &ll, &err) : NULL;
    REQUIRE(yb && yl, "%s: %s", what, err.msg);
    double rel = tg_rel_err(yl, yb, n);
    CHECK(rel <= 1e-6 && fabsf(ll - lb) <= 1e-6f * fabsf(lb), "%s, B = 0: logits %.3g apart, loss %.7g against %.7g", what,
          rel, ll, lb);
    float *y0 = yb; /* the base model's logits */
    free(yl);

    int pairs = 0;
    for (int a = 0; a < lora.n_tensors; a++) {
        const char *name = lora.tensors[a].name;
        const char *tail = strstr(name, ".lora_A.weight");
        if (!tail || tail[strlen(".lora_A.weight")] || (lora.tensors[a].flags & TG_TENSOR_VIEW)) continue;
        char other[200];
        snprintf(other, sizeof other, "%.*s.lora_B.weight", (int)(tail - name), name);
        const int b = find_tensor(&lora, other);
        snprintf(other, sizeof other, "%.*s.weight", (int)(tail - name), name);
        const int w = find_tensor(&base, other);
        REQUIRE(b >= 0 && w >= 0, "%s: %s's B and base weight", what, name);
        const int64_t r = lora.tensors[a].shape[0], in = lora.tensors[a].shape[1], out = lora.tensors[b].shape[0];
        CHECK(tg_tensor_numel(&base.tensors[w]) == in * out &&
                  base.tensors[w].shape[conv1d ? 0 : 1] == in,
              "%s: %s's layout", what, other);
        float *av = tg_test_lora_read(&tl, &lora, a, &err), *wv = av ? tg_test_lora_read(&tb, &base, w, &err) : NULL;
        float *bv = malloc(sizeof(float) * (size_t)(out * r));
        REQUIRE(av && wv && bv, "%s: %s", what, err.msg);
        random_fill(bv, out * r, 0.2f, (uint32_t)(a + 1));
        merge(wv, av, bv, out, in, r, scale, conv1d);
        REQUIRE(tg_trainer_write(&tl, b, bv, &err) == 0 && tg_trainer_write(&tb, w, wv, &err) == 0, "%s", err.msg);
        free(av), free(bv), free(wv);
        pairs++;
    }
    CHECK(pairs >= 8, "%s: %d pairs", what, pairs);
    yb = forward_logits(&tb, &base, &lb, &err), yl = yb ? forward_logits(&tl, &lora, &ll, &err) : NULL;
    REQUIRE(yb && yl, "%s: %s", what, err.msg);
    rel = tg_rel_err(yl, yb, n);
    const double moved = tg_rel_err(yl, y0, n);
    CHECK(rel <= 2e-5 && fabsf(ll - lb) <= 2e-5f * fabsf(lb), "%s, merged: logits %.3g apart, loss %.7g against %.7g", what,
          rel, ll, lb);
    CHECK(moved > 1e-3, "%s: the adapters moved the logits by %.3g only", what, moved);
    free(y0), free(yb), free(yl);
    tg_trainer_close(&tb), tg_trainer_close(&tl);
    tg_plan_free(&base), tg_plan_free(&lora);
}

TG_TEST(test_lora_families_equal_merged_weights) {
    check_equals_merged("bert classify", BERT_CLS, "lora_r = 4\nlora_alpha = 6\n" BERT_ALL, 1.5, 0);
    check_equals_merged("bert classify, fuse_qkv off", BERT_CLS "fuse_qkv = false\nfuse_gelu = false\n",
                        "lora_r = 2\nlora_alpha = 3\nlora_targets = key,dense\n", 1.5, 0);
    check_equals_merged("roberta classify", "model = tiny-roberta\ntask = classify\nnum_labels = 2\nbatch = 2\nseq = 12\n"
                                            "train_data = x\nsteps = 2\n",
                        "lora_r = 4\n" BERT_ALL, 2.0, 0);
    check_equals_merged("gpt2 lm", GPT2_LM, "lora_r = 4\nlora_alpha = 6\n" GPT2_ALL, 1.5, 1);
    check_equals_merged("gpt2 lm unfused attention", GPT2_LM "attention = unfused\n", "lora_r = 2\n" GPT2_ALL, 4.0, 1);
}

/* The adapters' (and the head's) gradients against central differences of the loss (fp32,
 * no dropout, B made non-zero so A's gradient is too). */
static void check_gradients(const char *what, const char *text, const char *const *nonzero, int n_nonzero,
                            const char *const *probe, int n_probe) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(text, 1, &p, &err) == 0, "%s: %s", what, err.msg);
    tg_trainer tr;
    REQUIRE(tg_test_lora_open_fixed(&tr, &p, &err) == 0, "%s: %s", what, err.msg);
    for (int k = 0; k < n_nonzero; k++) {
        const int b = find_tensor(&p, nonzero[k]);
        REQUIRE(b >= 0, "%s: %s", what, nonzero[k]);
        const int64_t n = tg_tensor_numel(&p.tensors[b]);
        float *v = malloc(sizeof(float) * (size_t)n);
        REQUIRE(v, "out of memory");
        random_fill(v, n, 1.0f, (uint32_t)(k + 11));
        REQUIRE(tg_trainer_write(&tr, b, v, &err) == 0, "%s", err.msg);
        free(v);
    }
    /* Every gradient read before any forward runs again (gradients may share the
     * activations' pool). */
    float *grads[8];
    REQUIRE(n_probe <= 8, "too many probes");
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, &err) == 0, "%s", err.msg);
    for (int k = 0; k < n_probe; k++) {
        const int t = find_tensor(&p, probe[k]);
        REQUIRE(t >= 0 && p.tensors[t].grad >= 0, "%s: %s has no gradient", what, probe[k]);
        grads[k] = tg_test_lora_read(&tr, &p, p.tensors[t].grad, &err);
        REQUIRE(grads[k], "%s", err.msg);
    }
    for (int k = 0; k < n_probe; k++) {
        const int t = find_tensor(&p, probe[k]);
        const int64_t n = tg_tensor_numel(&p.tensors[t]);
        float *v = tg_test_lora_read(&tr, &p, t, &err), *g = grads[k];
        REQUIRE(v, "%s", err.msg);
        double worst = 0, largest = 0;
        for (int64_t i = 0; i < n; i += n / 6 + 1) {
            const float keep = v[i], h = 1e-2f;
            float up, down;
            v[i] = keep + h;
            REQUIRE(tg_trainer_write(&tr, t, v, &err) == 0 && tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0 &&
                        tg_trainer_read_f32(&tr, p.io.loss, &up, &err) == 0,
                    "%s", err.msg);
            v[i] = keep - h;
            REQUIRE(tg_trainer_write(&tr, t, v, &err) == 0 && tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0 &&
                        tg_trainer_read_f32(&tr, p.io.loss, &down, &err) == 0,
                    "%s", err.msg);
            v[i] = keep;
            REQUIRE(tg_trainer_write(&tr, t, v, &err) == 0, "%s", err.msg);
            const double numeric = ((double)up - down) / (2.0 * h), d = fabs(numeric - g[i]) / fmax(fabs(numeric), 1e-3);
            if (d > worst) worst = d;
            if (fabs(numeric) > largest) largest = fabs(numeric);
        }
        CHECK(worst < 2e-2, "%s: %s: gradient %.3g from central differences", what, probe[k], worst);
        CHECK(largest > 1e-4, "%s: %s: the probed gradients are all about zero (%.3g)", what, probe[k], largest);
        free(v), free(g);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

TG_TEST(test_lora_families_gradients_finite_differences) {
    static const char *const bert_b[] = {"bert.encoder.layer.0.attention.self.value.lora_B.weight",
                                         "bert.encoder.layer.1.intermediate.dense.lora_B.weight",
                                         "bert.pooler.dense.lora_B.weight"};
    static const char *const bert_probe[] = {"bert.encoder.layer.0.attention.self.value.lora_A.weight",
                                             "bert.encoder.layer.0.attention.self.value.lora_B.weight",
                                             "bert.encoder.layer.1.intermediate.dense.lora_A.weight",
                                             "bert.pooler.dense.lora_A.weight",
                                             "bert.pooler.dense.lora_B.weight",
                                             "classifier.weight"};
    check_gradients("bert classify", BERT_CLS "lora_r = 2\nlora_targets = value,dense\n", bert_b, 3, bert_probe, 6);
    static const char *const gpt2_b[] = {"transformer.h.0.attn.c_attn.lora_B.weight", "transformer.h.1.mlp.c_fc.lora_B.weight",
                                         "transformer.h.0.mlp.c_proj.lora_B.weight"};
    static const char *const gpt2_probe[] = {"transformer.h.0.attn.c_attn.lora_A.weight", "transformer.h.0.attn.c_attn.lora_B.weight",
                                             "transformer.h.1.mlp.c_fc.lora_A.weight", "transformer.h.0.mlp.c_proj.lora_B.weight",
                                             "transformer.h.1.attn.c_proj.lora_B.weight"};
    check_gradients("gpt2 lm", GPT2_LM "lora_r = 2\n" GPT2_ALL, gpt2_b, 3, gpt2_probe, 5);
}

/* Training moves the adapters (and a classification head) and nothing else, and the loss
 * falls below `ratio` of the first step's. */
static void check_training(const char *what, const char *text, const char *const *fixed, int n_fixed,
                           const char *const *moving, int n_moving, float ratio) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(text, 0, &p, &err) == 0, "%s: %s", what, err.msg);
    tg_trainer tr;
    REQUIRE(tg_test_lora_open_fixed(&tr, &p, &err) == 0, "%s: %s", what, err.msg);
    float *before[8];
    REQUIRE(n_fixed + n_moving <= 8, "too many tensors");
    for (int k = 0; k < n_fixed + n_moving; k++) {
        const char *name = k < n_fixed ? fixed[k] : moving[k - n_fixed];
        const int t = find_tensor(&p, name);
        REQUIRE(t >= 0, "%s: %s", what, name);
        before[k] = tg_test_lora_read(&tr, &p, t, &err);
        REQUIRE(before[k], "%s", err.msg);
    }
    float first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        tg_step_stats st;
        REQUIRE(tg_trainer_run_step(&tr, &st, &err) == 0, "%s: %s", what, err.msg);
        if (s == 0) first = st.loss;
        last = st.loss;
    }
    for (int k = 0; k < n_fixed + n_moving; k++) {
        const char *name = k < n_fixed ? fixed[k] : moving[k - n_fixed];
        const int t = find_tensor(&p, name);
        float *after = tg_test_lora_read(&tr, &p, t, &err);
        REQUIRE(after, "%s", err.msg);
        const size_t bytes = sizeof(float) * (size_t)tg_tensor_numel(&p.tensors[t]);
        if (k < n_fixed) CHECK(!memcmp(before[k], after, bytes), "%s: frozen %s changed", what, name);
        else CHECK(memcmp(before[k], after, bytes), "%s: %s did not move", what, name);
        free(before[k]), free(after);
    }
    CHECK(last < ratio * first, "%s: loss %.4f -> %.4f", what, first, last);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

TG_TEST(test_lora_families_training_moves_adapters_only) {
    static const char *const bert_fixed[] = {"bert.encoder.layer.0.attention.self.query.weight",
                                             "bert.encoder.layer.1.output.dense.bias", "bert.pooler.dense.weight",
                                             "bert.embeddings.word_embeddings.weight"};
    static const char *const bert_moving[] = {"bert.encoder.layer.1.attention.self.value.lora_B.weight",
                                              "classifier.weight", "classifier.bias"};
    check_training("bert classify", BERT_CLS_BASE "lora_r = 4\nlr = 1e-2\nwarmup_steps = 0\nsteps = 30\n", bert_fixed, 4,
                   bert_moving, 3, 0.9f);
    static const char *const gpt2_fixed[] = {"transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_proj.bias",
                                             "transformer.wte.weight", "transformer.ln_f.weight"};
    static const char *const gpt2_moving[] = {"transformer.h.0.attn.c_attn.lora_B.weight",
                                              "transformer.h.1.mlp.c_fc.lora_A.weight"};
    /* Next tokens of random ids through a frozen random model and its frozen tied head:
     * the adapters alone lower the loss more slowly. */
    check_training("gpt2 lm", GPT2_LM_BASE "lora_r = 4\nlr = 1e-2\nwarmup_steps = 0\nsteps = 30\n" GPT2_ALL, gpt2_fixed, 4,
                   gpt2_moving, 2, 0.95f);
}

static json_t *load_json(const char *dir, const char *file) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_error_t jerr;
    return json_load_file(path, 0, &jerr);
}

/* The strings of a JSON array, comma-joined ("" for none, "null" for null). */
static const char *joined(json_t *array, char *buf, size_t cap) {
    buf[0] = 0;
    if (json_is_null(array)) return "null";
    for (size_t i = 0; i < json_array_size(array); i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", i ? "," : "", json_string_value(json_array_get(array, i)));
    return buf;
}

/* Export of a LoRA plan of `text` with B random: model.safetensors holds `module`.weight
 * merged (W + scale B A, (B A)^T for conv1d) and no adapter, and loads as a plain model
 * that computes the adapted model's logits; adapter_config.json has the fields PEFT writes
 * (task, targets, modules_to_save, fan_in_fan_out); adapter_model.safetensors holds the
 * adapters and the head under base_model.model. */
static void check_export(const char *what, const char *model_job, const char *lora_keys, const char *module, int conv1d,
                         double scale, const char *task_type, const char *targets, const char *save, int tensors) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", model_job, lora_keys);
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(text, 1, &p, &err) == 0, "%s: %s", what, err.msg);
    tg_trainer tr;
    REQUIRE(tg_test_lora_open_fixed(&tr, &p, &err) == 0, "%s: %s", what, err.msg);
    for (int t = 0; t < p.n_tensors; t++) /* every B random */
        if (strstr(p.tensors[t].name, ".lora_B.weight") && (p.tensors[t].flags & TG_TENSOR_PARAM)) {
            const int64_t n = tg_tensor_numel(&p.tensors[t]);
            float *v = malloc(sizeof(float) * (size_t)n);
            REQUIRE(v, "out of memory");
            random_fill(v, n, 0.3f, (uint32_t)(t + 5));
            REQUIRE(tg_trainer_write(&tr, t, v, &err) == 0, "%s", err.msg);
            free(v);
        }
    char name[200];
    snprintf(name, sizeof name, "%s.lora_A.weight", module);
    const int a = find_tensor(&p, name);
    snprintf(name, sizeof name, "%s.lora_B.weight", module);
    const int b = find_tensor(&p, name);
    snprintf(name, sizeof name, "%s.weight", module);
    const int w = find_tensor(&p, name);
    REQUIRE(a >= 0 && b >= 0 && w >= 0, "%s: %s's adapters", what, module);
    const int64_t r = p.tensors[a].shape[0], in = p.tensors[a].shape[1], out = p.tensors[b].shape[0];
    float *av = tg_test_lora_read(&tr, &p, a, &err), *bv = av ? tg_test_lora_read(&tr, &p, b, &err) : NULL;
    float *wv = bv ? tg_test_lora_read(&tr, &p, w, &err) : NULL, *got = malloc(sizeof(float) * (size_t)(out * in));
    REQUIRE(av && bv && wv && got, "%s: %s", what, err.msg);
    float *want_w = malloc(sizeof(float) * (size_t)(out * in));
    REQUIRE(want_w, "out of memory");
    memcpy(want_w, wv, sizeof(float) * (size_t)(out * in));
    merge(want_w, av, bv, out, in, r, scale, conv1d);
    float loss;
    float *want_logits = forward_logits(&tr, &p, &loss, &err);
    REQUIRE(want_logits, "%s", err.msg);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/lora-family-export", tg_test_tmpdir());
    tg_hf_export_options o = {.out_dir = dir, .force = 1};
    REQUIRE(tg_trainer_export_hf(&tr, &o, &err) == 0, "%s: %s", what, err.msg);

    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    int adapters = 0;
    for (int i = 0; i < st.n; i++) adapters += is_adapter(st.entries[i].name) != 0;
    CHECK(adapters == 0, "%s: model.safetensors holds %d adapters", what, adapters);
    const tg_st_entry *e = tg_st_find(&st, name);
    REQUIRE(e && e->ndim == 2 && e->shape[0] == p.tensors[w].shape[0] && e->shape[1] == p.tensors[w].shape[1] &&
                tg_st_read_f32(&st, e, got, out * in, &err) == 0,
            "%s: %s in model.safetensors", what, name);
    double worst = 0, delta = 0;
    for (int64_t i = 0; i < out * in; i++) {
        worst = fmax(worst, fabs(got[i] - want_w[i]));
        delta = fmax(delta, fabs(want_w[i] - wv[i]));
    }
    CHECK(worst < 1e-6 && delta > 1e-3, "%s: merged %s %.3g from W + %g (B A)%s (the merge moves it by %.3g)", what, name,
          worst, scale, conv1d ? "^T" : "", delta);
    tg_st_close(&st);

    snprintf(path, sizeof path, "%s/" TG_HF_ADAPTER_DIR "/adapter_model.safetensors", dir);
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", module);
    e = tg_st_find(&st, name);
    REQUIRE(e && e->ndim == 2 && e->shape[0] == out && e->shape[1] == r && tg_st_read_f32(&st, e, got, out * r, &err) == 0,
            "%s: %s", what, name);
    CHECK(!memcmp(got, bv, sizeof(float) * (size_t)(out * r)), "%s: adapter B values differ", what);
    snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", module);
    e = tg_st_find(&st, name);
    CHECK(e && e->shape[0] == r && e->shape[1] == in, "%s: %s", what, name);
    CHECK(st.n == tensors, "%s: adapter file: %d tensors, want %d", what, st.n, tensors);
    for (int t = 0; t < p.n_tensors; t++) /* the head, whole */
        if (tg_lora_head_param(&p, t)) {
            char head[200];
            snprintf(head, sizeof head, "base_model.model.%s", p.tensors[t].name);
            CHECK(!strncmp(p.tensors[t].name, save, strlen(save)) && tg_st_find(&st, head), "%s: %s missing", what, head);
        }
    tg_st_close(&st);

    json_t *c = load_json(dir, TG_HF_ADAPTER_DIR "/adapter_config.json");
    REQUIRE(c, "%s: adapter_config.json", what);
    char t_buf[200], s_buf[200];
    json_t *tt = json_object_get(c, "task_type");
    const char *task = json_is_null(tt) ? "null" : json_string_value(tt);
    CHECK(task && !strcmp(task, task_type), "%s: task_type %s, want %s", what, task ? task : "?", task_type);
    CHECK(!strcmp(joined(json_object_get(c, "target_modules"), t_buf, sizeof t_buf), targets), "%s: target_modules %s, want %s",
          what, t_buf, targets);
    CHECK(!strcmp(joined(json_object_get(c, "modules_to_save"), s_buf, sizeof s_buf), save), "%s: modules_to_save %s, want %s",
          what, json_is_null(json_object_get(c, "modules_to_save")) ? "null" : s_buf, save);
    CHECK(json_is_boolean(json_object_get(c, "fan_in_fan_out")) &&
              json_boolean_value(json_object_get(c, "fan_in_fan_out")) == conv1d,
          "%s: fan_in_fan_out", what);
    CHECK(!strcmp(json_string_value(json_object_get(c, "peft_type")), "LORA") &&
              !strcmp(json_string_value(json_object_get(c, "bias")), "none") &&
              !strcmp(json_string_value(json_object_get(c, "base_model_name_or_path")), p.model.source) &&
              json_integer_value(json_object_get(c, "r")) == r &&
              fabs(json_number_value(json_object_get(c, "lora_alpha")) - scale * (double)r) < 1e-5,
          "%s: adapter_config.json fields", what);
    json_decref(c);

    /* The folder as a plain model computes the adapted model's logits. */
    const char *model_line = strchr(model_job, '\n') + 1;
    snprintf(text, sizeof text, "model = %s\n%s", dir, model_line);
    tg_plan merged;
    REQUIRE(compile_text(text, 1, &merged, &err) == 0, "%s: %s", what, err.msg);
    CHECK(find_tensor(&merged, name) < 0, "%s: the reloaded plan has adapters", what);
    tg_trainer tm;
    REQUIRE(tg_test_lora_open_fixed(&tm, &merged, &err) == 0, "%s: %s", what, err.msg);
    float loss_merged;
    float *logits = forward_logits(&tm, &merged, &loss_merged, &err);
    REQUIRE(logits, "%s", err.msg);
    const double rel = tg_rel_err(logits, want_logits, tg_tensor_numel(&p.tensors[p.io.logits]));
    CHECK(rel <= 2e-5, "%s: the merged folder's logits %.3g from the adapted model's", what, rel);
    free(logits), free(want_logits), free(av), free(bv), free(wv), free(got), free(want_w);
    tg_trainer_close(&tm), tg_trainer_close(&tr);
    tg_plan_free(&merged), tg_plan_free(&p);
}

TG_TEST(test_lora_families_export) {
    /* BERT classification, default targets: 2 layers x (query, value) x (A, B), and the
     * classifier's weight and bias. */
    check_export("bert classify", BERT_CLS, "lora_r = 4\nlora_alpha = 6\n", "bert.encoder.layer.1.attention.self.value", 0,
                 1.5, "SEQ_CLS", "query,value", "classifier", 2 * 2 * 2 + 2);
    /* BERT's pooler, adapted through "dense". */
    check_export("bert pooler", BERT_CLS, "lora_r = 2\nlora_targets = dense\n", "bert.pooler.dense", 0, 4.0, "SEQ_CLS",
                 "dense", "classifier", 2 * (2 * 3 + 1) + 2);
    /* GPT-2's Conv1D weights [in, out]: c_attn's merged as W + scale (B A)^T. */
    check_export("gpt2 lm", GPT2_LM, "lora_r = 4\nlora_alpha = 6\nlora_targets = c_attn,c_proj\n",
                 "transformer.h.0.attn.c_attn", 1, 1.5, "CAUSAL_LM", "c_attn,c_proj", "null", 2 * 3 * 2);
    check_export("gpt2 mlp", GPT2_LM, "lora_r = 2\nlora_targets = c_fc,c_proj\n", "transformer.h.1.mlp.c_proj", 1, 4.0,
                 "CAUSAL_LM", "c_proj,c_fc", "null", 2 * 3 * 2);
    /* Only the MLP's c_proj: PEFT is given the adapted modules' paths, not "c_proj" (which
     * would adapt attn.c_proj too); c_fc, adapted everywhere, by its name. */
    check_export("gpt2 dotted", GPT2_LM, "lora_r = 2\nlora_targets = mlp.c_proj,c_fc\n", "transformer.h.1.mlp.c_proj", 1,
                 4.0, "CAUSAL_LM", "c_fc,transformer.h.0.mlp.c_proj,transformer.h.1.mlp.c_proj", "null", 2 * 2 * 2);
    check_export("gpt2 classify",
                 "model = tiny-gpt2\ntask = classify\nnum_labels = 2\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\n",
                 "lora_r = 2\n", "transformer.h.1.attn.c_attn", 1, 4.0, "SEQ_CLS", "c_attn", "score", 2 * 2 + 1);
    /* RoBERTa's head trains whole: classifier.dense and classifier.out_proj. */
    check_export("roberta classify",
                 "model = tiny-roberta\ntask = classify\nnum_labels = 2\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\n",
                 "lora_r = 2\n", "roberta.encoder.layer.0.attention.self.query", 0, 4.0, "SEQ_CLS", "query,value",
                 "classifier", 2 * 2 * 2 + 4);
}

/* Question answering and masked LM: PEFT's QUESTION_ANS (qa_outputs saved whole) and no
 * task type (nothing saved whole). */
TG_TEST(test_lora_families_export_qa_and_mlm) {
    static const struct {
        const char *job, *task, *save;
        int tensors;
    } cases[] = {
        {"model = tiny-bert\ntask = qa\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\nlora_r = 2\n", "QUESTION_ANS",
         "qa_outputs", 2 * 2 * 2 + 2},
        {"model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\nlora_r = 2\n", "null", "null",
         2 * 2 * 2},
    };
    for (size_t k = 0; k < 2; k++) {
        tg_plan p;
        tg_err err = {{0}};
        REQUIRE(compile_text(cases[k].job, 0, &p, &err) == 0, "%s", err.msg);
        tg_weights_image img;
        REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
        tg_weights_init(&img, 3);
        char dir[600];
        snprintf(dir, sizeof dir, "%s/lora-%s", tg_test_tmpdir(), cases[k].task);
        const tg_hf_export_options o = {.out_dir = dir, .force = 1};
        REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
        json_t *c = load_json(dir, TG_HF_ADAPTER_DIR "/adapter_config.json");
        REQUIRE(c, "%s: adapter_config.json", cases[k].task);
        json_t *tt = json_object_get(c, "task_type");
        char buf[200];
        CHECK(!strcmp(json_is_null(tt) ? "null" : json_string_value(tt), cases[k].task) &&
                  !strcmp(joined(json_object_get(c, "modules_to_save"), buf, sizeof buf), cases[k].save) &&
                  !strcmp(joined(json_object_get(c, "target_modules"), buf, sizeof buf), "query,value"),
              "%s: adapter_config.json", cases[k].task);
        json_decref(c);
        char path[700];
        snprintf(path, sizeof path, "%s/" TG_HF_ADAPTER_DIR "/adapter_model.safetensors", dir);
        tg_safetensors st;
        REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
        CHECK(st.n == cases[k].tensors && (k == 1 || tg_st_find(&st, "base_model.model.qa_outputs.bias")),
              "%s: %d tensors", cases[k].task, st.n);
        tg_st_close(&st);
        tg_weights_image_free(&img);
        tg_plan_free(&p);
    }
}
