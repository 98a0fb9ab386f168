/* Llama plans (compiler/model_build.c: build_llama): tiny-llama's LM and classification
 * plans with their ops and parameters, tied and untied heads, the parameter counts of the
 * Llama 3 presets against the published models', the jobs a Llama refuses, what inspect
 * shows, and a CPU training run that lowers the loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/inspect.h"
#include "plan/op_meta.h"
#include "runtime/trainer.h"
#include "tests/compile_faults.h"
#include "tests/harness.h"

/* Compiles a job given as text, written to dir/name.job so messages carry its lines. */
static int compile_job(const char *name, const char *text, tg_plan *plan, tg_err *err, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s.job", tg_test_tmpdir(), name);
    if (tg_test_write_file(path, text)) return tg_fail(err, "cannot write %s", path);
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

/* Parameters the model owns: packed views left out, each packed part counted once. */
static int64_t param_count(const tg_plan *p) {
    int64_t n = 0;
    for (int t = 0; t < p->n_tensors; t++)
        if ((p->tensors[t].flags & TG_TENSOR_PARAM) && !(p->tensors[t].flags & TG_TENSOR_VIEW))
            n += tg_tensor_numel(&p->tensors[t]);
    return n;
}

static void count_kinds(const tg_plan *p, int *k) {
    memset(k, 0, sizeof(int) * TG_OP_COUNT);
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind >= 0 && p->ops[o].kind < TG_OP_COUNT) k[p->ops[o].kind]++;
}

/* The tensor's shape is [a, b] (b < 0: one dimension). */
static int shaped(const tg_plan *p, const char *name, int64_t a, int64_t b) {
    const int t = tg_test_tensor_named(p, name);
    if (t < 0) return 0;
    const tg_tensor *x = &p->tensors[t];
    return b < 0 ? x->ndim == 1 && x->shape[0] == a : x->ndim == 2 && x->shape[0] == a && x->shape[1] == b;
}

#define JOB_TAIL "batch = 2\nseq = 16\nsteps = 1\ntrain_data = x.jsonl\n"

/* tiny-llama (2 layers, hidden 64, 4 heads over 2 kv heads of 16, intermediate 96, vocab
 * 128, untied): per layer q 64x64, k and v 32x64, o 64x64, gate, up and down 96x64, two
 * RMSNorms of 64: 30848 parameters; the embeddings 8192, the final norm 64, lm_head 8192. */
TG_TEST(test_compile_llama_lm_plan) {
    tg_plan p;
    tg_err err = {{0}};
    char path[600];
    REQUIRE(compile_job("lm", "model = tiny-llama\ntask = lm\n" JOB_TAIL, &p, &err, path, sizeof path) == 0, "%s",
            err.msg);
    CHECK(p.model.arch == TG_ARCH_LLAMA && p.model.kv_heads == 2 && p.model.rope_type == TG_ROPE_LLAMA3 &&
              p.model.tie_word_embeddings == 0,
          "plan's model: arch %d kv %d rope %d", p.model.arch, p.model.kv_heads, p.model.rope_type);
    CHECK(param_count(&p) == 8192 + 2 * 30848 + 64 + 8192, "parameters %lld", (long long)param_count(&p));
    int k[TG_OP_COUNT];
    count_kinds(&p, k);
    /* Two RMSNorms a layer and the final one; a rotary embedding and a SwiGLU a layer; a
     * backward for each; no LayerNorm, GELU, bias or position table. */
    CHECK(k[TG_OP_RMSNORM] == 5 && k[TG_OP_RMSNORM_BWD] == 5 && k[TG_OP_ROPE] == 2 && k[TG_OP_ROPE_BWD] == 2 &&
              k[TG_OP_SWIGLU] == 2 && k[TG_OP_SWIGLU_BWD] == 2 && k[TG_OP_ATTENTION] == 2 &&
              k[TG_OP_LAYERNORM] == 0 && k[TG_OP_RESIDUAL_LAYERNORM] == 0 && k[TG_OP_GELU] == 0 &&
              k[TG_OP_BIAS_GRAD] == 0,
          "kinds: rmsnorm %d/%d rope %d/%d swiglu %d/%d attention %d layernorm %d gelu %d", k[TG_OP_RMSNORM],
          k[TG_OP_RMSNORM_BWD], k[TG_OP_ROPE], k[TG_OP_ROPE_BWD], k[TG_OP_SWIGLU], k[TG_OP_SWIGLU_BWD],
          k[TG_OP_ATTENTION], k[TG_OP_LAYERNORM], k[TG_OP_GELU]);
    /* HF's names and shapes; q/k/v and gate/up packed; no token types, no position table. */
    CHECK(shaped(&p, "model.embed_tokens.weight", 128, 64) && shaped(&p, "model.layers.0.self_attn.q_proj.weight", 64, 64) &&
              shaped(&p, "model.layers.0.self_attn.k_proj.weight", 32, 64) &&
              shaped(&p, "model.layers.1.self_attn.v_proj.weight", 32, 64) &&
              shaped(&p, "model.layers.1.self_attn.o_proj.weight", 64, 64) &&
              shaped(&p, "model.layers.0.self_attn.qkv_proj.weight", 128, 64) &&
              shaped(&p, "model.layers.0.mlp.gate_proj.weight", 96, 64) &&
              shaped(&p, "model.layers.0.mlp.up_proj.weight", 96, 64) &&
              shaped(&p, "model.layers.0.mlp.gate_up_proj.weight", 192, 64) &&
              shaped(&p, "model.layers.1.mlp.down_proj.weight", 64, 96) &&
              shaped(&p, "model.layers.0.input_layernorm.weight", 64, -1) &&
              shaped(&p, "model.layers.1.post_attention_layernorm.weight", 64, -1) &&
              shaped(&p, "model.norm.weight", 64, -1) && shaped(&p, "lm_head.weight", 128, 64) &&
              shaped(&p, "model.layers.0.self_attn.qkv_rotary", 32, 192),
          "Llama tensors");
    CHECK(tg_test_tensor_named(&p, "token_type_ids") < 0 && p.io.token_type_ids < 0 &&
              tg_test_tensor_named(&p, "model.embed_positions.weight") < 0 &&
              !(p.tensors[tg_test_tensor_named(&p, "model.embed_tokens.weight")].flags & TG_TENSOR_TIED),
          "token types, a position table or a tied table in an untied Llama");
    /* The rotary op carries the config's rule; attention is causal over the packed input. */
    for (int o = 0; o < p.n_ops; o++) {
        const tg_op *op = &p.ops[o];
        if (op->kind == TG_OP_ROPE || op->kind == TG_OP_ROPE_BWD) {
            const tg_rope_params *r = &op->p.rope;
            CHECK(r->n == 32 && r->h == 4 && r->kv_heads == 2 && r->head_dim == 16 && r->type == TG_ROPE_LLAMA3 &&
                      r->theta == 10000.0f && r->factor == 8.0f && r->low_freq == 1.0f && r->high_freq == 4.0f &&
                      r->original_max == 32 && op->in[1] == p.io.position_ids,
                  "op %d: rope N %lld H %lld Hkv %lld Dh %lld", o, (long long)r->n, (long long)r->h,
                  (long long)r->kv_heads, (long long)r->head_dim);
        }
        if (op->kind == TG_OP_ATTENTION)
            CHECK(op->p.attention.causal == 1 && op->p.attention.packed == 1 && op->p.attention.head_dim == 16,
                  "op %d: attention causal %lld packed %lld", o, (long long)op->p.attention.causal,
                  (long long)op->p.attention.packed);
        if (op->kind == TG_OP_RMSNORM) CHECK(op->p.rmsnorm.eps == 1e-5f && op->p.rmsnorm.d == 64, "op %d: rmsnorm", o);
    }
    /* inspect shows the ops and their rotary settings. */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f, "open_memstream");
    CHECK(tg_plan_inspect(&p, f, 0, &err) == 0, "inspect: %s", err.msg);
    fclose(f);
    static const char *const want[] = {
        "model: tiny-llama (llama)\n",
        " rmsnorm            model.layers.0.input_layernorm[32,64], model.layers.0.input_layernorm.rstd[32] <- ",
        " rope               model.layers.0.self_attn.qkv_rotary[32,192] <- model.layers.0.self_attn.qkv_proj, "
        "position_ids | N=32 H=4 Hkv=2 Dh=16 rope=2 theta=10000 factor=8 low_freq=1 high_freq=4 original_max=32\n",
        " swiglu             model.layers.1.mlp.act[32,96] <- model.layers.1.mlp.gate_up_proj | M=32 I=96\n",
        " rope_bwd           d.model.layers.0.self_attn.qkv_proj[32,128] <- d.model.layers.0.self_attn.qkv_rotary, "
        "position_ids | N=32 H=4 Hkv=2 Dh=16",
        " rmsnorm_bwd        d.model.layers.1.mlp_residual[32,64], grad.model.norm.weight[64] <- ",
        " swiglu_bwd         d.model.layers.0.mlp.gate_up_proj[32,192] <- d.model.layers.0.mlp.act, "
        "model.layers.0.mlp.gate_up_proj | M=32 I=96\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(buf && strstr(buf, want[i]), "inspect lacks '%s'", want[i]);
    free(buf);
    tg_plan_free(&p);
}

/* Classification pools the last non-padding token into a bias-free score [labels, 64], no
 * lm_head; unfused attention splits the rotary output's packed heads. */
TG_TEST(test_compile_llama_classify_plans) {
    static const char *const forms[] = {"", "attention = unfused\n", "precision = bf16\n"};
    for (int f = 0; f < 3; f++) {
        char text[512], path[600];
        snprintf(text, sizeof text, "model = tiny-llama\ntask = classify\nnum_labels = 3\npad_token_id = 0\n%s" JOB_TAIL,
                 forms[f]);
        tg_plan p;
        tg_err err = {{0}};
        if (!CHECK(compile_job("classify", text, &p, &err, path, sizeof path) == 0, "form %d: %s", f, err.msg)) continue;
        CHECK(param_count(&p) == 8192 + 2 * 30848 + 64 + 3 * 64, "form %d: parameters %lld", f,
              (long long)param_count(&p));
        CHECK(shaped(&p, "score.weight", 3, 64) && tg_test_tensor_named(&p, "score.bias") < 0 &&
                  tg_test_tensor_named(&p, "lm_head.weight") < 0,
              "form %d: the score head", f);
        int k[TG_OP_COUNT];
        count_kinds(&p, k);
        CHECK(k[TG_OP_SELECT_TOKEN] == 1 && k[TG_OP_ROPE] == 2 && k[TG_OP_SWIGLU] == 2 && k[TG_OP_RMSNORM] == 5,
              "form %d: select %d rope %d", f, k[TG_OP_SELECT_TOKEN], k[TG_OP_ROPE]);
        /* Unfused, each layer's forward splits the rotary output into q, k and v once. */
        int fwd_split = 0;
        for (int o = 0; o < p.n_ops; o++)
            fwd_split += p.ops[o].kind == TG_OP_HEADS_SPLIT && p.ops[o].phase == TG_PHASE_FORWARD &&
                         p.ops[o].p.heads.parts == 3 && p.ops[o].p.heads.head_dim == 16;
        if (f == 1)
            CHECK(k[TG_OP_ATTENTION] == 0 && k[TG_OP_ATTN_SOFTMAX] == 2 && fwd_split == 2,
                  "unfused: attention %d softmax %d forward splits %d", k[TG_OP_ATTENTION], k[TG_OP_ATTN_SOFTMAX],
                  fwd_split);
        else
            CHECK(k[TG_OP_ATTENTION] == 2 && k[TG_OP_ATTN_SOFTMAX] == 0, "fused: attention %d", k[TG_OP_ATTENTION]);
        tg_plan_free(&p);
    }
}

/* dir/name/config.json: tiny-llama's config with `edit`'s members (a JSON object) in place
 * of its own; the folder's path into folder. */
static int llama_folder(const char *name, const char *edit, char *folder, size_t cap) {
    char src[1100], path[1200];
    snprintf(src, sizeof src, "%s/tiny-llama/config.json", tg_presets_dir());
    json_error_t e;
    json_t *root = json_load_file(src, 0, &e), *set = json_loads(edit, 0, &e);
    int rc = -1;
    if (root && set && !json_object_update(root, set)) {
        snprintf(folder, cap, "%s/%s", tg_test_tmpdir(), name);
        mkdir(folder, 0755);
        snprintf(path, sizeof path, "%s/config.json", folder);
        rc = json_dump_file(root, path, JSON_INDENT(2));
    }
    json_decref(root), json_decref(set);
    return rc;
}

/* Tied heads (tie_word_embeddings true): the LM head reads the token embeddings, no
 * lm_head.weight; a vocabulary not a multiple of 64 reads them through a padded view. */
TG_TEST(test_compile_llama_tied_heads) {
    static const struct {
        const char *edit;
        int64_t vocab, padded;
    } cases[] = {{"{\"tie_word_embeddings\": true}", 128, 128},
                 {"{\"tie_word_embeddings\": true, \"vocab_size\": 100}", 100, 128}};
    for (int c = 0; c < 2; c++) {
        char folder[700], name[32], text[1200], path[600];
        snprintf(name, sizeof name, "tied%d", c);
        if (!CHECK(llama_folder(name, cases[c].edit, folder, sizeof folder) == 0, "case %d: cannot write", c)) continue;
        snprintf(text, sizeof text, "model = %s\ntask = lm\n" JOB_TAIL, folder);
        tg_plan p;
        tg_err err = {{0}};
        if (!CHECK(compile_job(name, text, &p, &err, path, sizeof path) == 0, "case %d: %s", c, err.msg)) continue;
        const int table = tg_test_tensor_named(&p, "model.embed_tokens.weight"),
                  padded = tg_test_tensor_named(&p, "model.embed_tokens.weight.padded");
        CHECK(p.model.tie_word_embeddings == 1 && table >= 0 && (p.tensors[table].flags & TG_TENSOR_TIED) &&
                  tg_test_tensor_named(&p, "lm_head.weight") < 0,
              "case %d: the head is not the tied table", c);
        CHECK(param_count(&p) == cases[c].vocab * 64 + 2 * 30848 + 64, "case %d: parameters %lld", c,
              (long long)param_count(&p));
        if (cases[c].padded != cases[c].vocab)
            CHECK(padded >= 0 && (p.tensors[padded].flags & TG_TENSOR_VIEW) && p.tensors[padded].master == table &&
                      shaped(&p, "model.embed_tokens.weight.padded", cases[c].padded, 64) &&
                      shaped(&p, "lm_head", 32, cases[c].padded),
                  "case %d: the padded view", c);
        else
            CHECK(padded < 0 && shaped(&p, "lm_head", 32, 128), "case %d: a padded view of a table of 128 rows", c);
        tg_plan_free(&p);
    }
}

/* The presets' parameters are the published models': Meta-Llama-3-8B 8,030,261,248 (untied
 * lm_head), Llama-3.2-1B 1,235,814,400 (tied). */
TG_TEST(test_compile_llama_preset_sizes) {
    static const struct {
        const char *preset;
        int64_t params;
    } cases[] = {{"llama-3-8b", 8030261248}, {"llama-3.2-1b", 1235814400}};
    for (int c = 0; c < 2; c++) {
        tg_plan p;
        if (!tg_test_compile_sized(cases[c].preset, TG_TASK_LM, 1, 16, 1, TG_PREC_BF16, &p)) continue;
        CHECK(param_count(&p) == cases[c].params, "%s: %lld parameters, want %lld", cases[c].preset,
              (long long)param_count(&p), (long long)cases[c].params);
        tg_plan_free(&p);
    }
}

/* The jobs a Llama refuses: the encoders' tasks, classification without a padding id, a
 * sequence past max_position_embeddings. */
TG_TEST(test_compile_llama_refused_jobs) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"model = tiny-llama\ntask = mlm\n", ":2: key 'task': task mlm needs an encoder (bert or roberta family); model "
                                             "'tiny-llama' is llama"},
        {"model = tiny-llama\ntask = qa\n", ":2: key 'task': task qa needs an encoder (bert or roberta family); model "
                                            "'tiny-llama' is llama"},
        {"model = tiny-llama\ntask = classify\n",
         " (default): key 'pad_token_id': classification with model 'tiny-llama' pools at the last non-padding token, "
         "so it needs a padding id: set pad_token_id in the job (the config has none)"},
        {"model = tiny-llama\n", " (default): key 'pad_token_id': classification with model 'tiny-llama' pools at the "
                                 "last non-padding token"},
        {"model = tiny-llama\ntask = lm\nseq = 129\n",
         ":3: key 'seq': seq 129 exceeds what model 'tiny-llama' can hold (max_position_embeddings 128)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512], path[600], want[1200];
        snprintf(text, sizeof text, "%sbatch = 2\nsteps = 1\ntrain_data = x.jsonl\n", cases[i].text);
        tg_plan p;
        tg_err err = {{0}};
        const int rc = compile_job("refused", text, &p, &err, path, sizeof path);
        snprintf(want, sizeof want, "%s%s", path, cases[i].want);
        CHECK(rc == -1 && !strncmp(err.msg, want, strlen(want)), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg,
              want);
        if (rc == 0) tg_plan_free(&p);
    }
    /* The padding id from the job makes the classification job compile; seq 128 fits. */
    char path[600];
    tg_plan p;
    tg_err err = {{0}};
    CHECK(compile_job("ok", "model = tiny-llama\npad_token_id = 0\nseq = 128\nbatch = 1\nsteps = 1\ntrain_data = x.jsonl\n",
                      &p, &err, path, sizeof path) == 0,
          "classify with pad_token_id, seq 128: %s", err.msg);
    tg_plan_free(&p);
}

/* 30 steps of tiny-llama on the CPU over arithmetic progressions: the loss starts near
 * ln 128 and falls. */
TG_TEST(test_compile_llama_cpu_training_lowers_the_loss) {
    const char *dir = tg_test_tmpdir();
    char data[600], job_path[600];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    FILE *f = fopen(data, "w");
    REQUIRE(f, "cannot write %s", data);
    for (int r = 0; r < 64; r++) {
        const int start = 4 + (r * 7) % 100, step = 1 + r % 3;
        fputs("{\"input_ids\": [", f);
        for (int t = 0; t < 32; t++) fprintf(f, "%s%d", t ? ", " : "", 4 + (start + t * step) % 120);
        fputs("]}\n", f);
    }
    fclose(f);
    snprintf(job_path, sizeof job_path, "%s/train.job", dir);
    REQUIRE(tg_test_write_file(job_path, "model = tiny-llama\ntask = lm\nbatch = 8\nseq = 32\nsteps = 30\nlr = 3e-3\n"
                                         "warmup_steps = 0\nseed = 7\ntrain_data = train.jsonl\n") == 0,
            "write job");
    tg_err err = {{0}};
    tg_job job;
    tg_plan plan;
    REQUIRE(tg_job_load(job_path, NULL, 0, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .load_data = 1};
    if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return;
    }
    float loss[30];
    int steps = 0, finite = 1;
    for (; steps < 30; steps++) {
        tg_step_stats st;
        if (!CHECK(tg_trainer_step(&tr, &st, &err) == 0, "step %d: %s", steps + 1, err.msg)) break;
        loss[steps] = st.loss;
        finite &= isfinite(st.loss) && !st.skipped;
    }
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
    REQUIRE(steps == 30 && finite, "%d steps, finite %d", steps, finite);
    double first = 0, last = 0;
    for (int s = 0; s < 5; s++) first += loss[s] / 5, last += loss[25 + s] / 5;
    printf("    tiny-llama lm on the CPU: loss %.4f -> %.4f over 30 steps\n", first, last);
    CHECK(fabs(loss[0] - log(128.0)) < 0.3, "initial loss %.4f, want near ln 128 = %.4f", loss[0], log(128.0));
    CHECK(last < first - 1.0, "the loss did not fall: %.4f -> %.4f", first, last);
}

/* Every allocation of a Llama compile failed in turn: out of memory each time, never a
 * success or another refusal (the builder's early returns after a failed tensor). */
TG_TEST(test_compile_llama_each_allocation_fails) {
    tg_test_compile_each_allocation_fails("llama lm", "model = tiny-llama\ntask = lm\n" JOB_TAIL);
    tg_test_compile_each_allocation_fails("llama classify, unfused",
                                          "model = tiny-llama\npad_token_id = 0\nattention = unfused\n" JOB_TAIL);
    char folder[700], job[1200];
    REQUIRE(llama_folder("oom-tied", "{\"tie_word_embeddings\": true, \"vocab_size\": 100}", folder, sizeof folder) == 0,
            "cannot write the model folder");
    snprintf(job, sizeof job, "model = %s\ntask = lm\nprecision = bf16\n" JOB_TAIL, folder);
    tg_test_compile_each_allocation_fails("llama lm, tied and padded, bf16", job);
}

/* A frozen RMSNorm weight (its backward writes dgamma to scratch) or frozen token
 * embeddings (the first RMSNorm's backward writes its dx to scratch; both frozen, nothing
 * needs that backward and it is left out): 3 CPU steps change every trainable parameter
 * watched and none of the frozen ones. */
TG_TEST(test_compile_llama_frozen_norm_and_embeddings) {
    static const struct {
        const char *freeze;
        int frozen_emb, frozen_norm, first_norm_bwd, embedding_bwd;
    } cases[] = {
        {"model.layers.0.input_layernorm.*", 0, 1, 1, 1},
        {"model.embed_tokens.*", 1, 0, 1, 0},
        {"model.embed_tokens.*, model.layers.0.input_layernorm.*", 1, 1, 0, 0},
    };
    const char *dir = tg_test_tmpdir();
    char data[600], job_path[600], text[1000];
    snprintf(data, sizeof data, "%s/frozen.jsonl", dir);
    FILE *f = fopen(data, "w");
    REQUIRE(f, "cannot write %s", data);
    for (int r = 0; r < 8; r++) {
        fputs("{\"input_ids\": [", f);
        for (int t = 0; t < 16; t++) fprintf(f, "%s%d", t ? ", " : "", 3 + (r * 5 + t * 3) % 120);
        fputs("]}\n", f);
    }
    fclose(f);
    for (int c = 0; c < 3; c++) {
        snprintf(job_path, sizeof job_path, "%s/frozen%d.job", dir, c);
        snprintf(text, sizeof text,
                 "model = tiny-llama\ntask = lm\nbatch = 2\nseq = 16\nsteps = 3\nlr = 1e-2\nfreeze = %s\n"
                 "train_data = frozen.jsonl\n",
                 cases[c].freeze);
        REQUIRE(tg_test_write_file(job_path, text) == 0, "write job");
        tg_err err = {{0}};
        tg_job job;
        tg_plan plan;
        REQUIRE(tg_job_load(job_path, NULL, 0, &job, &err) == 0, "%s", err.msg);
        if (!CHECK(tg_compile(&job, &plan, &err) == 0, "case %d: %s", c, err.msg)) continue;
        const int emb = tg_test_tensor_named(&plan, "model.embed_tokens.weight"),
                  norm0 = tg_test_tensor_named(&plan, "model.layers.0.input_layernorm.weight"),
                  norm1 = tg_test_tensor_named(&plan, "model.layers.1.input_layernorm.weight"),
                  q0 = tg_test_tensor_named(&plan, "model.layers.0.self_attn.q_proj.weight");
        REQUIRE(emb >= 0 && norm0 >= 0 && norm1 >= 0 && q0 >= 0, "tensors");
        CHECK(!!(plan.tensors[emb].flags & TG_TENSOR_FROZEN) == cases[c].frozen_emb &&
                  !!(plan.tensors[norm0].flags & TG_TENSOR_FROZEN) == cases[c].frozen_norm &&
                  !(plan.tensors[norm1].flags & TG_TENSOR_FROZEN) && !(plan.tensors[q0].flags & TG_TENSOR_FROZEN),
              "case %d: frozen flags", c);
        int first_norm_bwd = 0, embedding_bwd = 0;
        for (int o = 0; o < plan.n_ops; o++) {
            const tg_op *op = &plan.ops[o];
            embedding_bwd += op->kind == TG_OP_EMBEDDING_BWD;
            if (op->kind == TG_OP_RMSNORM_BWD && op->in[2] == norm0) {
                first_norm_bwd++;
                /* A frozen gamma takes no dgamma at all (no column sums, no scratch). */
                if (cases[c].frozen_norm)
                    CHECK(op->out[1] < 0, "case %d: op %d writes a dgamma for a frozen gamma", c, o);
                else
                    CHECK(op->out[1] >= 0 && plan.tensors[op->out[1]].pool == TG_POOL_GRADS,
                          "case %d: op %d writes dgamma outside the gradients", c, o);
            }
        }
        CHECK(first_norm_bwd == cases[c].first_norm_bwd && embedding_bwd == cases[c].embedding_bwd,
              "case %d: first rmsnorm_bwd %d, embedding_bwd %d", c, first_norm_bwd, embedding_bwd);
        tg_trainer tr;
        tg_trainer_options o = {.device = TG_DEVICE_CPU, .load_data = 1};
        if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
            tg_plan_free(&plan);
            continue;
        }
        const int watch[4] = {emb, norm0, norm1, q0};
        const int frozen[4] = {cases[c].frozen_emb, cases[c].frozen_norm, 0, 0};
        float *before[4] = {0}, *after[4] = {0};
        int ok = 1;
        for (int w = 0; w < 4; w++) {
            const size_t n = (size_t)tg_tensor_numel(&plan.tensors[watch[w]]);
            before[w] = malloc(n * 4), after[w] = malloc(n * 4);
            ok &= before[w] && after[w] && tg_trainer_read(&tr, watch[w], before[w], &err) == 0;
        }
        for (int s = 0; ok && s < 3; s++) {
            tg_step_stats st;
            ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0 && isfinite(st.loss), "case %d step %d: %s", c, s + 1,
                       err.msg);
        }
        for (int w = 0; ok && w < 4; w++) ok &= tg_trainer_read(&tr, watch[w], after[w], &err) == 0;
        if (CHECK(ok, "case %d: %s", c, err.msg))
            for (int w = 0; w < 4; w++) {
                const size_t bytes = (size_t)tg_tensor_numel(&plan.tensors[watch[w]]) * 4;
                CHECK((memcmp(before[w], after[w], bytes) == 0) == frozen[w], "case %d: %s %s", c,
                      plan.tensors[watch[w]].name, frozen[w] ? "changed while frozen" : "did not train");
            }
        for (int w = 0; w < 4; w++) free(before[w]), free(after[w]);
        tg_trainer_close(&tr);
        tg_plan_free(&plan);
    }
}
