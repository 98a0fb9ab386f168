/* LoRA's job key lora_modules_to_save (PEFT's LoraConfig modules_to_save beyond the task
 * head): its parse and refusals, the plan's classes (the named modules' parameters
 * trainable with gradients, nothing else of the base), training that moves them and no
 * other base weight, and the export (adapter_model.safetensors and adapter_config.json as
 * PEFT saves modules_to_save, the merged weights with the trained values). BERT, GPT-2 and
 * Llama tiny presets. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "runtime/hf_export.h"
#include "runtime/trainer.h"
#include "tests/harness.h"
#include "tests/lora_fixtures.h"

#define BERT_CLS "model = tiny-bert\ntask = classify\nnum_labels = 3\nbatch = 2\nseq = 12\ntrain_data = x\nseed = 5\n"
#define GPT2_LM "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 12\ntrain_data = x\nseed = 5\n"
#define LLAMA_LM "model = tiny-llama\ntask = lm\nbatch = 2\nseq = 12\ntrain_data = x\nseed = 5\n"

/* tie: 1 compiles against the model's config with tie_word_embeddings set (tiny-llama's is
 * not). */
static int compile_text(const char *text, int tie, tg_plan *p, tg_err *err) {
    tg_job job;
    if (tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, err)) return -1;
    if (!tie) return tg_compile(&job, p, err);
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (tg_model_config_load(job.model, &cfg, err)) return -1;
    cfg.tie_word_embeddings = 1;
    return tg_compile_with_config(&job, &cfg, p, err);
}

static int find_tensor(const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) return t;
    return -1;
}

static int is_adapter(const char *name) { return strstr(name, ".lora_A.weight") || strstr(name, ".lora_B.weight"); }

/* Whether `name` is one of the comma-separated names of `list`. */
static int listed(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *s = list; (s = strstr(s, name)); s += n)
        if ((s == list || s[-1] == ',') && (s[n] == ',' || !s[n])) return 1;
    return 0;
}

TG_TEST(test_lora_modules_to_save_refusals) {
    static const struct {
        const char *text, *want;
        int tie;
    } cases[] = {
        {GPT2_LM "steps = 2\nlora_modules_to_save = ln_f\n",
         "job.txt:8: key 'lora_modules_to_save': only meaningful with lora_r > 0 (without LoRA every module trains whole "
         "already)", 0},
        {GPT2_LM "steps = 2\nlora_r = 0\nlora_modules_to_save = ln_f\n",
         "job.txt:9: key 'lora_modules_to_save': only meaningful with lora_r > 0 (without LoRA every module trains whole "
         "already)", 0},
        {GPT2_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = ln_f,,wte\n",
         "job.txt:9: key 'lora_modules_to_save': 'ln_f,,wte' is not a comma-separated list of module names or paths' "
         "tails (such as q_proj,v_proj or mlp.c_proj)", 0},
        {GPT2_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = ln_f, ln_g\n",
         "job.txt:9: key 'lora_modules_to_save': 'ln_g' names no module of the model (its modules are such as "
         "transformer.h.0.ln_1)", 0},
        {GPT2_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = h.7.ln_1\n",
         "job.txt:9: key 'lora_modules_to_save': 'h.7.ln_1' names no module of the model (its modules are such as "
         "transformer.h.0.ln_1)", 0},
        {LLAMA_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = nrom\n",
         "job.txt:9: key 'lora_modules_to_save': 'nrom' names no module of the model (its modules are such as "
         "model.norm)", 0},
        /* The tied LM head and the embeddings it reads: PEFT would keep a saved copy apart. */
        {GPT2_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = lm_head\n",
         "job.txt:9: key 'lora_modules_to_save': 'lm_head' names lm_head, which holds the LM head's decoder, tied to "
         "transformer.wte: PEFT would keep a saved copy apart from the embeddings; with LoRA the tied head and table "
         "stay frozen", 0},
        {GPT2_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = ln_f,wte\n",
         "job.txt:9: key 'lora_modules_to_save': 'wte' names transformer.wte, which holds transformer.wte, tied to the "
         "LM head (lm_head): PEFT would keep a saved copy apart from the head, which would read the untrained table; "
         "with LoRA the tied head and table stay frozen", 0},
        {LLAMA_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = lm_head\n",
         "job.txt:9: key 'lora_modules_to_save': 'lm_head' names lm_head, which holds the LM head's decoder, tied to "
         "model.embed_tokens: PEFT would keep a saved copy apart from the embeddings; with LoRA the tied head and "
         "table stay frozen", 1},
        {LLAMA_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = embed_tokens\n",
         "job.txt:9: key 'lora_modules_to_save': 'embed_tokens' names model.embed_tokens, which holds "
         "model.embed_tokens, tied to the LM head (lm_head): PEFT would keep a saved copy apart from the head, which "
         "would read the untrained table; with LoRA the tied head and table stay frozen", 1},
        {"model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\nlora_r = 2\n"
         "lora_modules_to_save = predictions\n",
         "job.txt:8: key 'lora_modules_to_save': 'predictions' names cls.predictions, which holds the LM head's "
         "decoder, tied to bert.embeddings.word_embeddings: PEFT would keep a saved copy apart from the embeddings; "
         "with LoRA the tied head and table stay frozen", 0},
        {"model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 12\ntrain_data = x\nsteps = 2\nlora_r = 2\n"
         "lora_modules_to_save = embeddings\n",
         "job.txt:8: key 'lora_modules_to_save': 'embeddings' names bert.embeddings, which holds "
         "bert.embeddings.word_embeddings, tied to the LM head (cls.predictions.decoder): PEFT would keep a saved copy "
         "apart from the head, which would read the untrained table; with LoRA the tied head and table stay frozen", 0},
        /* A module adapted and saved whole. */
        {LLAMA_LM "steps = 2\nlora_r = 2\nlora_targets = q_proj\nlora_modules_to_save = self_attn\n",
         "job.txt:10: key 'lora_modules_to_save': names model.layers.0.self_attn.q_proj (or a module holding it), which "
         "lora_targets adapts: a module trains through its adapter or whole, not both", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_plan p;
        tg_err err = {{0}};
        const int rc = compile_text(cases[i].text, cases[i].tie, &p, &err);
        CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "case %zu: rc %d\n  got  '%s'\n  want '%s'", i, rc, err.msg,
              cases[i].want);
        if (rc == 0) tg_plan_free(&p);
    }
}

/* The plan of `text`: every parameter listed in `whole` trainable with a gradient, and
 * every other trainable parameter an adapter or a name starting with `head` (NULL: none);
 * the count of trainable base parameters returned through *n_whole. */
static void check_classes(const char *what, const char *text, int tie, const char *whole, const char *head, int n_whole) {
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(compile_text(text, tie, &p, &err) == 0, "%s: %s", what, err.msg);
    int n = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (x->flags & TG_TENSOR_VIEW || !(x->flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN))) continue;
        const int want = listed(whole, x->name);
        if (want) {
            n++;
            CHECK((x->flags & TG_TENSOR_PARAM) && !(x->flags & TG_TENSOR_FROZEN) && x->grad >= 0 &&
                      tg_tensor_class_of(x) == TG_CLASS_TRAINABLE,
                  "%s: %s is not trainable with a gradient", what, x->name);
        } else if (x->flags & TG_TENSOR_PARAM) {
            CHECK(is_adapter(x->name) || (head && !strncmp(x->name, head, strlen(head))), "%s: %s is trainable", what,
                  x->name);
        }
    }
    CHECK(n == n_whole, "%s: %d of the %d listed parameters", what, n, n_whole);
    tg_plan_free(&p);
}

TG_TEST(test_lora_modules_to_save_plan_classes) {
    /* BERT: "LayerNorm" is every LayerNorm of the model (embeddings' and each layer's two);
     * the classifier trains whole as before, the pooler stays frozen. */
    check_classes("bert LayerNorm", BERT_CLS "steps = 2\nlora_r = 2\nlora_modules_to_save = LayerNorm\n", 0,
                  "bert.embeddings.LayerNorm.weight,bert.embeddings.LayerNorm.bias,"
                  "bert.encoder.layer.0.attention.output.LayerNorm.weight,bert.encoder.layer.0.attention.output.LayerNorm.bias,"
                  "bert.encoder.layer.0.output.LayerNorm.weight,bert.encoder.layer.0.output.LayerNorm.bias,"
                  "bert.encoder.layer.1.attention.output.LayerNorm.weight,bert.encoder.layer.1.attention.output.LayerNorm.bias,"
                  "bert.encoder.layer.1.output.LayerNorm.weight,bert.encoder.layer.1.output.LayerNorm.bias",
                  "classifier.", 10);
    /* A module holding others: the pooler whole, and the embeddings' tables and LayerNorm. */
    check_classes("bert pooler, embeddings", BERT_CLS "steps = 2\nlora_r = 2\nlora_modules_to_save = pooler,embeddings\n",
                  0,
                  "bert.pooler.dense.weight,bert.pooler.dense.bias,bert.embeddings.word_embeddings.weight,"
                  "bert.embeddings.position_embeddings.weight,bert.embeddings.token_type_embeddings.weight,"
                  "bert.embeddings.LayerNorm.weight,bert.embeddings.LayerNorm.bias",
                  "classifier.", 7);
    /* BERT's packed q, k and v (fuse_qkv): one of them whole makes them apart. */
    check_classes("bert key", BERT_CLS "steps = 2\nlora_r = 2\nlora_modules_to_save = layer.1.attention.self.key\n", 0,
                  "bert.encoder.layer.1.attention.self.key.weight,bert.encoder.layer.1.attention.self.key.bias",
                  "classifier.", 2);
    /* GPT-2: ln_f, and the position table (the token table, tied to the LM head, is refused). */
    check_classes("gpt2 ln_f, wpe", GPT2_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = ln_f,wpe\n", 0,
                  "transformer.ln_f.weight,transformer.ln_f.bias,transformer.wpe.weight", NULL, 3);
    check_classes("gpt2 classify score", "model = tiny-gpt2\ntask = classify\nnum_labels = 2\nbatch = 2\nseq = 12\n"
                                         "train_data = x\nsteps = 2\nlora_r = 2\nlora_modules_to_save = score,h.1.ln_2\n",
                  0, "score.weight,transformer.h.1.ln_2.weight,transformer.h.1.ln_2.bias", NULL, 3);
    /* Llama: "norm" is model.norm alone (the layers' are input_layernorm and
     * post_attention_layernorm); the untied lm_head; q_proj makes q, k and v apart. */
    check_classes("llama norm, lm_head", LLAMA_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = norm,lm_head\n", 0,
                  "model.norm.weight,lm_head.weight", NULL, 2);
    check_classes("llama q_proj, up_proj", LLAMA_LM "steps = 2\nlora_r = 2\nlora_targets = v_proj\n"
                                           "lora_modules_to_save = q_proj,layers.1.mlp.up_proj\n",
                  0, "model.layers.0.self_attn.q_proj.weight,model.layers.1.self_attn.q_proj.weight,"
                     "model.layers.1.mlp.up_proj.weight",
                  NULL, 3);
    check_classes("llama untied embed_tokens", LLAMA_LM "steps = 2\nlora_r = 2\nlora_modules_to_save = embed_tokens\n", 0,
                  "model.embed_tokens.weight", NULL, 1);
}


static json_t *load_json(const char *dir, const char *file) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_error_t jerr;
    return json_load_file(path, 0, &jerr);
}

/* Ten steps of `text`: the `moving` tensors change, every other base parameter (frozen)
 * does not; then the export: adapter_model.safetensors holds each moving tensor under
 * base_model.model.<name> with its trained values, adapter_config.json's modules_to_save
 * is `save`, and model.safetensors holds the trained
 * values too. */
static void check_training_and_export(const char *what, const char *text, int tie, const char *const *moving,
                                      int n_moving, const char *save) {
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(compile_text(text, tie, &p, &err) == 0, "%s: %s", what, err.msg);
    tg_trainer tr;
    REQUIRE(tg_test_lora_open_fixed(&tr, &p, &err) == 0, "%s: %s", what, err.msg);
    float **before = calloc((size_t)p.n_tensors, sizeof *before);
    REQUIRE(before, "out of memory");
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!(x->flags & TG_TENSOR_VIEW) && (x->flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN)) && !is_adapter(x->name))
            REQUIRE((before[t] = tg_test_lora_read(&tr, &p, t, &err)), "%s", err.msg);
    }
    for (int s = 0; s < 10; s++) {
        tg_step_stats st;
        REQUIRE(tg_trainer_run_step(&tr, &st, &err) == 0, "%s: %s", what, err.msg);
    }
    int moved = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        if (!before[t]) continue;
        float *after = tg_test_lora_read(&tr, &p, t, &err);
        REQUIRE(after, "%s", err.msg);
        int want = 0;
        for (int k = 0; k < n_moving; k++) want |= !strcmp(moving[k], p.tensors[t].name);
        const int changed = memcmp(before[t], after, sizeof(float) * (size_t)tg_tensor_numel(&p.tensors[t])) != 0;
        CHECK(changed == want, "%s: %s %s", what, p.tensors[t].name, want ? "did not move" : "moved");
        moved += changed && want;
        free(before[t]);
        before[t] = after; /* the trained values, for the export */
    }
    CHECK(moved == n_moving, "%s: %d of %d moved", what, moved, n_moving);

    char dir[600];
    snprintf(dir, sizeof dir, "%s/lora-modules-to-save", tg_test_tmpdir());
    tg_hf_export_options o = {.out_dir = dir, .force = 1};
    REQUIRE(tg_trainer_export_hf(&tr, &o, &err) == 0, "%s: %s", what, err.msg);
    const char *files[2] = {TG_HF_ADAPTER_DIR "/adapter_model.safetensors", "model.safetensors"};
    for (int f = 0; f < 2; f++) {
        char path[700], name[300];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        tg_safetensors st;
        REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
        for (int k = 0; k < n_moving; k++) {
            const int t = find_tensor(&p, moving[k]);
            const int64_t n = tg_tensor_numel(&p.tensors[t]);
            snprintf(name, sizeof name, "%s%s", f ? "" : "base_model.model.", moving[k]);
            const tg_st_entry *e = tg_st_find(&st, name);
            float *got = malloc(sizeof(float) * (size_t)n);
            REQUIRE(got, "out of memory");
            CHECK(e && tg_st_read_f32(&st, e, got, n, &err) == 0 && !memcmp(got, before[t], sizeof(float) * (size_t)n),
                  "%s: %s in %s missing or not the trained values", what, name, files[f]);
            free(got);
        }
        tg_st_close(&st);
    }
    json_t *c = load_json(dir, TG_HF_ADAPTER_DIR "/adapter_config.json");
    REQUIRE(c, "%s: adapter_config.json", what);
    json_t *s = json_object_get(c, "modules_to_save");
    char buf[400] = "";
    for (size_t i = 0; i < json_array_size(s); i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? "," : "", json_string_value(json_array_get(s, i)));
    CHECK(!strcmp(buf, save), "%s: modules_to_save %s, want %s", what, buf, save);
    CHECK(!json_object_get(c, "ensure_weight_tying"), "%s: ensure_weight_tying set", what);
    json_decref(c);
    for (int t = 0; t < p.n_tensors; t++) free(before[t]);
    free(before);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

TG_TEST(test_lora_modules_to_save_training_and_export) {
    static const char *const gpt2[] = {"transformer.ln_f.weight", "transformer.ln_f.bias", "transformer.wpe.weight"};
    check_training_and_export("gpt2 ln_f, wpe", GPT2_LM "steps = 10\nlr = 1e-2\nlora_r = 2\nlora_modules_to_save = ln_f,wpe\n",
                              0, gpt2, 3, "transformer.wpe,transformer.ln_f");
    static const char *const gpt2_ln[] = {"transformer.ln_f.weight", "transformer.ln_f.bias"};
    check_training_and_export("gpt2 ln_f", GPT2_LM "steps = 10\nlr = 1e-2\nlora_r = 2\nlora_modules_to_save = ln_f\n", 0,
                              gpt2_ln, 2, "transformer.ln_f");
    static const char *const llama[] = {"model.norm.weight", "lm_head.weight"};
    check_training_and_export("llama norm, lm_head",
                              LLAMA_LM "steps = 10\nlr = 1e-2\nlora_r = 2\nlora_modules_to_save = norm,lm_head\n", 0, llama,
                              2, "model.norm,lm_head");
    static const char *const bert[] = {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight",
                                       "classifier.bias"};
    check_training_and_export("bert pooler", BERT_CLS "steps = 10\nlr = 1e-2\nlora_r = 2\nlora_modules_to_save = pooler\n",
                              0, bert, 4, "bert.pooler.dense,classifier");
}
