/* Per-layer recomputation (job key recompute = layers, compiler/recompute.h) and its choice
 * by recompute = auto under memory_limit: the backward runs each layer's forward again
 * into copies its ops read, so the CPU reference trains bit for bit as without (losses,
 * gradient norms, every step's gradients, the weights and the optimizer state) on every
 * family and form, dropout included; the planned peak falls; the plan file's checks accept
 * the plans; auto takes none, gelu or the fewest layers that meet the limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/inspect.h"
#include "plan/memory_estimate.h"
#include "plan/plan_file.h"
#include "plan/validate.h"
#include "runtime/trainer.h"
#include "tests/harness.h"
#include "tests/train_record.h"

/* The GPU estimate memory_limit bounds. */
static uint64_t gpu_need(const tg_plan *p) {
    tg_memory_estimate est;
    tg_estimate_memory(p, TG_MEM_DEVICE_CUDA, &est);
    return est.total;
}

static int compile_job(const char *job_path, const char *const *sets, int n_sets, tg_plan *p) {
    memset(p, 0, sizeof *p);
    tg_err err;
    tg_job job;
    if (!CHECK(tg_job_load(job_path, sets, n_sets, &job, &err) == 0, "%s: %s", job_path, err.msg)) return 0;
    return CHECK(tg_compile(&job, p, &err) == 0, "%s: %s", job_path, err.msg);
}

/* Backward ops writing a layer copy (not the GELU backward's out2). */
static int recomputed_ops(const tg_plan *p) {
    int n = 0;
    for (int o = p->phase_begin[TG_PHASE_BACKWARD]; o < p->phase_begin[TG_PHASE_OPTIMIZER]; o++)
        n += p->ops[o].kind != TG_OP_GELU_BWD && tg_name_is_recomputed(p->tensors[p->ops[o].out[0]].name);
    return n;
}

/* The job trained `steps` steps with recompute = none and = layers: the same bytes; the
 * layers plan recomputes, needs less and passes the file checks. */
static void check_same_training(const char *job_path, const char *const *sets, int n_sets, int steps) {
    char what[256] = "";
    snprintf(what, sizeof what, "%s", job_path);
    for (int i = 0; i < n_sets; i++) snprintf(what + strlen(what), sizeof what - strlen(what), " %s", sets[i]);
    const char *all[16];
    if (!CHECK(n_sets < 15, "too many sets")) return;
    for (int i = 0; i < n_sets; i++) all[i] = sets[i];
    tg_plan none, layers;
    all[n_sets] = "recompute=none";
    if (!compile_job(job_path, all, n_sets + 1, &none)) return;
    all[n_sets] = "recompute=layers";
    if (!compile_job(job_path, all, n_sets + 1, &layers)) {
        tg_plan_free(&none);
        return;
    }
    CHECK(recomputed_ops(&none) == 0 && none.peak_bytes_without_recompute == 0, "%s: recompute = none recomputes",
          what);
    CHECK(recomputed_ops(&layers) > 0, "%s: recompute = layers recomputes nothing", what);
    CHECK(layers.peak_bytes < none.peak_bytes && layers.peak_bytes_without_recompute == none.peak_bytes,
          "%s: planned peak %llu with layers recomputed, %llu without (recorded %llu)", what,
          (unsigned long long)layers.peak_bytes, (unsigned long long)none.peak_bytes,
          (unsigned long long)layers.peak_bytes_without_recompute);
    CHECK(layers.activation_live_peak < none.activation_live_peak, "%s: live activations %llu against %llu", what,
          (unsigned long long)layers.activation_live_peak, (unsigned long long)none.activation_live_peak);
    CHECK(layers.flops_per_step > none.flops_per_step, "%s: no FLOPs added", what);
    check_file_round_trip(&layers, what);
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (train_record(&none, steps, &a, &na) && train_record(&layers, steps, &b, &nb)) {
        size_t at = 0;
        while (at < na && at < nb && a[at] == b[at]) at++;
        CHECK(na == nb && at == na, "%s: the runs differ at byte %zu of %zu (losses, gradients, weights, state)", what,
              at, na);
    }
    free(a), free(b);
    tg_plan_free(&none);
    tg_plan_free(&layers);
}

/* BERT (classification with hidden and attention dropout 0.1; masked LM, whose head's GELU
 * and masking op stay outside the layers; bf16), GPT-2 (LM with dropout 0.1: the GELU
 * epilogue and residual LayerNorms; unfused attention with its softmax dropout and
 * separate ops; gradient accumulation), Llama (LM; LoRA on every projection with adapter
 * dropout; classification). */
TG_TEST(test_recompute_layers_trains_the_same) {
    const char *bert[] = {"steps=4"};
    check_same_training("examples/demo-classify.job", bert, 1, 3);
    const char *bert_unfused[] = {"attention=unfused", "fuse_qkv=false", "fuse_residual_layernorm=false",
                                  "fuse_bias_grad=false"};
    check_same_training("examples/demo-classify.job", bert_unfused, 4, 2);
    const char *mlm[] = {"batch=8"};
    check_same_training("examples/demo-mlm.job", mlm, 1, 2);
    const char *bf16[] = {"precision=bf16"};
    check_same_training("examples/demo-classify.job", bf16, 1, 2);
    const char *gpt2[] = {"batch=8"};
    check_same_training("examples/demo-lm.job", gpt2, 1, 3);
    const char *gpt2_unfused[] = {"batch=8", "attention=unfused", "fuse_gelu=false", "fuse_residual_layernorm=false"};
    check_same_training("examples/demo-lm.job", gpt2_unfused, 4, 2);
    const char *gpt2_accumulation[] = {"batch=4", "grad_accumulation=2"};
    check_same_training("examples/demo-lm.job", gpt2_accumulation, 2, 2);
    const char *gpt2_buckets[] = {"batch=8", "seq_buckets=24,48"};
    check_same_training("examples/demo-lm.job", gpt2_buckets, 2, 3);
    const char *bert_frozen[] = {"freeze=bert.embeddings.*,bert.encoder.layer.0.attention.*"};
    check_same_training("examples/demo-classify.job", bert_frozen, 1, 2);
    const char *llama[] = {"model=tiny-llama", "batch=8"};
    check_same_training("examples/demo-lm.job", llama, 2, 3);
    const char *lora[] = {"model=tiny-llama", "batch=8", "lora_r=4", "lora_dropout=0.1",
                          "lora_targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"};
    check_same_training("examples/demo-lm.job", lora, 5, 3);
    const char *llama_classify[] = {"model=tiny-llama", "batch=8", "pad_token_id=0"};
    check_same_training("examples/demo-classify.job", llama_classify, 3, 2);
}

/* Plans the CPU run above does not cover, through the file checks: data parallelism with
 * ZeRO-1, fp16 with its loss scale, question answering on RoBERTa, length buckets with
 * LoRA on Llama, and the benchmark jobs. */
TG_TEST(test_recompute_layers_other_plans) {
    static const struct {
        const char *job;
        const char *sets[6];
    } cases[] = {
        {"examples/demo-classify.job", {"data_parallel=2", "zero_stage=1", "recompute=layers"}},
        {"examples/demo-lm.job", {"precision=fp16", "recompute=layers"}},
        {"bench/jobs/bert-base-qa-b32-t384.job",
         {"model=tiny-roberta", "seq=32", "batch=2", "precision=fp32", "recompute=layers", "train_data=t.jsonl"}},
        {"examples/demo-lm.job", {"model=tiny-llama", "lora_r=2", "seq_buckets=16,48", "recompute=layers"}},
        {"bench/jobs/llama-3-8b-lora-b1-t4096.job", {"recompute=layers", "train_data=t.jsonl"}},
        {"bench/jobs/bert-base-qa-b32-t384.job", {"recompute=layers", "train_data=t.jsonl"}},
        {"bench/jobs/gpt2-lm-b16-t1024.job", {"recompute=layers", "train_data=t.jsonl"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = 0;
        while (n < 6 && cases[c].sets[n]) n++;
        tg_plan p;
        if (!compile_job(cases[c].job, cases[c].sets, n, &p)) continue;
        CHECK(recomputed_ops(&p) > 0 && p.peak_bytes < p.peak_bytes_without_recompute, "%s %s: %d ops, %llu against %llu",
              cases[c].job, cases[c].sets[0], recomputed_ops(&p), (unsigned long long)p.peak_bytes,
              (unsigned long long)p.peak_bytes_without_recompute);
        check_file_round_trip(&p, cases[c].job);
        tg_plan_free(&p);
    }
}

/* What the layers plan holds: every layer's copies in the backward, each layer's before the
 * first backward op of that layer that reads them; no backward op reads a forward
 * intermediate of a recomputed layer, only what enters or leaves it; dropout copies with the
 * forward's keys; the forward's intermediates dead by the end of the forward. */
TG_TEST(test_recompute_layers_plan_structure) {
    const char *sets[] = {"recompute=layers"};
    tg_plan p;
    if (!compile_job("examples/demo-lm.job", sets, 1, &p)) return;
    const int f1 = p.phase_begin[TG_PHASE_BACKWARD], b1 = p.phase_begin[TG_PHASE_OPTIMIZER];
    int layer_seen[2] = {0, 0}, keys = 0;
    for (int o = f1; o < b1; o++) {
        const tg_op *op = &p.ops[o];
        if (!tg_name_is_recomputed(p.tensors[op->out[0]].name) || op->kind == TG_OP_GELU_BWD) continue;
        const int l = tg_op_layer(p.tensors, p.n_tensors, op);
        if (!CHECK(l == 0 || l == 1, "op %d: a copy of layer %d", o, l)) continue;
        layer_seen[l]++;
        /* The forward op it copies: same kind and parameters, the output named without the suffix. */
        char name[TG_NAME_MAX];
        snprintf(name, sizeof name, "%s", p.tensors[op->out[0]].name);
        name[strlen(name) - strlen(".recomputed")] = 0;
        int orig = -1;
        for (int f = 0; f < f1; f++)
            if (!strcmp(p.tensors[p.ops[f].out[0]].name, name)) orig = f;
        if (CHECK(orig >= 0, "op %d: no forward op writes %s", o, name))
            CHECK(p.ops[orig].kind == op->kind && !memcmp(&p.ops[orig].p, &op->p, sizeof op->p),
                  "op %d differs from forward op %d", o, orig);
        keys += op->kind == TG_OP_ATTENTION || op->kind == TG_OP_RESIDUAL_LAYERNORM || op->kind == TG_OP_DROPOUT;
    }
    CHECK(layer_seen[0] > 0 && layer_seen[1] > 0 && keys > 0, "copies of layers 0 and 1: %d, %d (%d drawing masks)",
          layer_seen[0], layer_seen[1], keys);
    /* Forward tensors of a layer that live into the backward: only what the next layer or the
     * head reads. */
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (x->pool != TG_POOL_ACTIVATIONS || x->first_use < 0 || x->first_use >= f1 || x->last_use < f1) continue;
        int writer = -1;
        for (int f = 0; f < f1 && writer < 0; f++)
            for (int k = 0; k < TG_OP_MAX_OUT; k++)
                if (p.ops[f].out[k] == t) writer = f;
        const int layer = writer >= 0 ? tg_op_layer(p.tensors, p.n_tensors, &p.ops[writer]) : -1;
        if (layer < 0) continue;
        int read_later = 0;
        for (int f = 0; f < f1; f++)
            for (int k = 0; k < TG_OP_MAX_IN; k++)
                if (p.ops[f].in[k] == t && tg_op_layer(p.tensors, p.n_tensors, &p.ops[f]) != layer) read_later = 1;
        CHECK(read_later, "%s lives into the backward (ops %d..%d) but only its layer reads it", x->name, x->first_use,
              x->last_use);
    }
    tg_plan_free(&p);
}

static int compile_limited(const char *job_path, const char *model, int recompute, uint64_t limit, tg_plan *p,
                           tg_err *err) {
    char set_model[64], set_limit[64];
    snprintf(set_model, sizeof set_model, "model=%s", model);
    snprintf(set_limit, sizeof set_limit, "memory_limit=%llu", (unsigned long long)limit);
    const char *modes[] = {"none", "gelu", "auto", "layers"};
    char set_mode[32];
    snprintf(set_mode, sizeof set_mode, "recompute=%s", modes[recompute]);
    const char *sets[] = {set_model, set_mode, set_limit};
    tg_job job;
    if (tg_job_load(job_path, sets, limit ? 3 : 2, &job, err)) return -1;
    return tg_compile(&job, p, err);
}

/* recompute = auto: none where the limit allows it, gelu where that is enough, layers where
 * only they meet the limit, refused below what every layer recomputed needs; recompute =
 * layers under a limit it cannot meet is refused too. */
TG_TEST(test_recompute_layers_auto_choice) {
    static const struct {
        const char *job, *model;
        int has_gelu;
    } cases[] = {{"examples/demo-classify.job", "tiny-bert", 1}, {"examples/demo-lm.job", "tiny-gpt2", 1},
                 {"examples/demo-lm.job", "tiny-llama", 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_plan none, gelu, layers, p;
        tg_err err;
        const char *m = cases[c].model;
        REQUIRE(compile_limited(cases[c].job, m, TG_RECOMPUTE_NONE, 0, &none, &err) == 0, "%s", err.msg);
        REQUIRE(compile_limited(cases[c].job, m, TG_RECOMPUTE_GELU, 0, &gelu, &err) == 0, "%s", err.msg);
        REQUIRE(compile_limited(cases[c].job, m, TG_RECOMPUTE_LAYERS, 0, &layers, &err) == 0, "%s", err.msg);
        const uint64_t high = gpu_need(&none), mid = gpu_need(&gelu), low = gpu_need(&layers);
        CHECK(low < mid && mid <= high && (mid < high) == cases[c].has_gelu, "%s: layers %llu, gelu %llu, none %llu", m,
              (unsigned long long)low, (unsigned long long)mid, (unsigned long long)high);
        /* Above the need without recomputing, and at it: none. */
        const uint64_t above[] = {high + 1, high};
        for (int k = 0; k < 2; k++)
            if (CHECK(compile_limited(cases[c].job, m, TG_RECOMPUTE_AUTO, above[k], &p, &err) == 0, "%s", err.msg)) {
                CHECK(p.n_ops == none.n_ops && p.peak_bytes == none.peak_bytes && recomputed_ops(&p) == 0 &&
                          p.peak_bytes_without_recompute == 0,
                      "%s: auto under a limit it meets recomputed", m);
                tg_plan_free(&p);
            }
        /* Between gelu and none: gelu (the GELU outputs only). */
        if (cases[c].has_gelu &&
            CHECK(compile_limited(cases[c].job, m, TG_RECOMPUTE_AUTO, (mid + high) / 2, &p, &err) == 0, "%s", err.msg)) {
            CHECK(p.peak_bytes == gelu.peak_bytes && p.n_ops == gelu.n_ops && p.peak_bytes_without_recompute == none.peak_bytes,
                  "%s: auto did not take gelu", m);
            tg_plan_free(&p);
        }
        /* Between layers and gelu: layers, as few as meet the limit. */
        if (CHECK(compile_limited(cases[c].job, m, TG_RECOMPUTE_AUTO, (low + mid) / 2, &p, &err) == 0, "%s", err.msg)) {
            CHECK(recomputed_ops(&p) > 0 && gpu_need(&p) <= (low + mid) / 2 && p.peak_bytes_without_recompute == none.peak_bytes,
                  "%s: auto did not recompute layers (needs %llu, limit %llu)", m, (unsigned long long)gpu_need(&p),
                  (unsigned long long)((low + mid) / 2));
            check_file_round_trip(&p, m);
            tg_plan_free(&p);
        }
        /* At the need of every layer recomputed: the plan of every layer. */
        if (CHECK(compile_limited(cases[c].job, m, TG_RECOMPUTE_AUTO, low, &p, &err) == 0, "%s", err.msg)) {
            CHECK(gpu_need(&p) <= low && recomputed_ops(&p) == recomputed_ops(&layers), "%s: auto at the layers' need", m);
            tg_plan_free(&p);
        }
        /* Below: refused, naming what every layer recomputed needs. */
        CHECK(compile_limited(cases[c].job, m, TG_RECOMPUTE_AUTO, low - 1, &p, &err) == -1 &&
                  strstr(err.msg, "key 'memory_limit'") && strstr(err.msg, "with every layer recomputed") &&
                  strstr(err.msg, "more than the limit of"),
              "%s: %s", m, err.msg);
        CHECK(compile_limited(cases[c].job, m, TG_RECOMPUTE_LAYERS, low - 1, &p, &err) == -1 &&
                  strstr(err.msg, "more than the limit of") && !strstr(err.msg, "would need"),
              "%s: %s", m, err.msg);
        /* recompute = none over the limit: what layers would need. */
        CHECK(compile_limited(cases[c].job, m, TG_RECOMPUTE_NONE, low, &p, &err) == -1 &&
                  strstr(err.msg, "recompute = layers"),
              "%s: %s", m, err.msg);
        tg_plan_free(&none), tg_plan_free(&gelu), tg_plan_free(&layers);
    }
}

/* The Llama-3-8B LoRA benchmark job (bench/jobs, T4096) and its model's config: 1, or 0
 * after a failed CHECK. */
static int load_8b_lora_job(tg_model_config *cfg, tg_job *job) {
    tg_err err;
    const char *sets[] = {"train_data=t.jsonl"};
    return CHECK(tg_model_config_load("llama-3-8b", cfg, &err) == 0, "%s", err.msg) &&
           CHECK(tg_job_load("bench/jobs/llama-3-8b-lora-b1-t4096.job", sets, 1, job, &err) == 0, "%s", err.msg);
}

/* Llama-3-8B with LoRA at 4,096 tokens (the benchmark job's shape): recompute = auto under
 * a limit between the two needs recomputes the fewest layers from the first: one layer
 * fewer would not meet it. */
TG_TEST(test_recompute_layers_fewest_for_the_limit) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    if (!load_8b_lora_job(&cfg, &job)) return;
    job.memory_limit = 30ull << 30;
    tg_plan p;
    REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
    int layers[64] = {0}, n = 0;
    for (int o = p.phase_begin[TG_PHASE_BACKWARD]; o < p.phase_begin[TG_PHASE_OPTIMIZER]; o++) {
        if (!tg_name_is_recomputed(p.tensors[p.ops[o].out[0]].name)) continue;
        const int l = tg_op_layer(p.tensors, p.n_tensors, &p.ops[o]);
        if (l >= 0 && l < 64 && !layers[l]) layers[l] = 1, n++;
    }
    CHECK(n > 0 && n < cfg.layers && gpu_need(&p) <= job.memory_limit, "%d layers recomputed, needs %llu", n,
          (unsigned long long)gpu_need(&p));
    for (int l = 0; l < n; l++) CHECK(layers[l], "layer %d of the first %d not recomputed", l, n);
    printf("    Llama-3-8B LoRA T4096 under 30 GiB: %d of %d layers recomputed, %.1f GiB (%.1f without)\n", n, cfg.layers,
           gpu_need(&p) / 1073741824.0,
           (gpu_need(&p) - p.peak_bytes + p.peak_bytes_without_recompute) / 1073741824.0);
    /* One layer fewer does not meet the limit. */
    tg_job fewer = job;
    fewer.recompute = TG_RECOMPUTE_LAYERS, fewer.recompute_layers = n - 1, fewer.memory_limit = 0;
    tg_plan q;
    if (n > 1 && CHECK(tg_compile_with_config(&fewer, &cfg, &q, &err) == 0, "%s", err.msg)) {
        CHECK(gpu_need(&q) > job.memory_limit, "%d layers already meet the limit", n - 1);
        tg_plan_free(&q);
    }
    tg_plan_free(&p);
}

/* The device's free memory (memory_available, what `run JOB` on CUDA passes): recompute =
 * auto without a memory_limit plans for it as for a limit, the same layers as memory_limit
 * at that size; it refuses nothing (a plan past it compiles with every layer recomputed,
 * left to the preflight), leaves the fingerprint the job's, and an explicit memory_limit
 * wins over it. */
TG_TEST(test_recompute_layers_for_free_memory) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    if (!load_8b_lora_job(&cfg, &job)) return;
    REQUIRE(job.recompute == TG_RECOMPUTE_AUTO && job.memory_limit == 0, "the benchmark job sets recompute or a limit");
    tg_plan free_fit, limit_fit, none, tiny, both;
    tg_job j = job;
    REQUIRE(tg_compile_with_config(&j, &cfg, &none, &err) == 0, "%s", err.msg);
    j.memory_available = 30ull << 30;
    REQUIRE(tg_compile_with_config(&j, &cfg, &free_fit, &err) == 0, "%s", err.msg);
    j.memory_available = 0, j.memory_limit = 30ull << 30;
    REQUIRE(tg_compile_with_config(&j, &cfg, &limit_fit, &err) == 0, "%s", err.msg);
    CHECK(recomputed_ops(&none) == 0 && recomputed_ops(&free_fit) > 0 &&
              recomputed_ops(&free_fit) == recomputed_ops(&limit_fit) && free_fit.peak_bytes == limit_fit.peak_bytes &&
              gpu_need(&free_fit) <= (30ull << 30) && free_fit.peak_bytes_without_recompute == none.peak_bytes,
          "30 GiB free: %d ops recomputed (%d under the limit), needs %llu", recomputed_ops(&free_fit),
          recomputed_ops(&limit_fit), (unsigned long long)gpu_need(&free_fit));
    CHECK(free_fit.fingerprint == none.fingerprint, "the free memory changed the fingerprint");
    /* Less free than every layer recomputed needs: compiled so, not refused. */
    j.memory_limit = 0, j.memory_available = 1ull << 30;
    if (CHECK(tg_compile_with_config(&j, &cfg, &tiny, &err) == 0, "1 GiB free refused: %s", err.msg)) {
        CHECK(recomputed_ops(&tiny) > recomputed_ops(&free_fit) && gpu_need(&tiny) > (1ull << 30),
              "1 GiB free: %d ops recomputed", recomputed_ops(&tiny));
        tg_plan_free(&tiny);
    }
    /* memory_limit first: 60 GiB allowed, 1 GiB free: nothing recomputed. */
    j.memory_limit = 60ull << 30;
    if (CHECK(tg_compile_with_config(&j, &cfg, &both, &err) == 0, "%s", err.msg)) {
        CHECK(recomputed_ops(&both) == 0, "the free memory won over memory_limit: %d ops recomputed", recomputed_ops(&both));
        tg_plan_free(&both);
    }
    tg_plan_free(&none), tg_plan_free(&free_fit), tg_plan_free(&limit_fit);
}

/* inspect says what is recomputed and the peak without. */
TG_TEST(test_recompute_layers_inspect) {
    const char *sets[] = {"recompute=layers"};
    tg_plan p;
    if (!compile_job("examples/demo-classify.job", sets, 1, &p)) return;
    char *text = NULL;
    size_t len = 0;
    tg_err err;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    CHECK(tg_plan_inspect(&p, f, 0, &err) == 0, "%s", err.msg);
    fclose(f);
    CHECK(text && strstr(text, "recompute: layers 0-1 (2 of 2) run again in the backward: ") &&
              strstr(text, "without recomputing") && strstr(text, "memory estimate, GPU without recomputing: "),
          "%s", text ? text : "");
    free(text), text = NULL;
    f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    CHECK(tg_plan_inspect(&p, f, 1, &err) == 0, "%s", err.msg);
    fclose(f);
    CHECK(text && strstr(text, "\"recompute\": {") && strstr(text, "\"layers\": [") &&
              strstr(text, "\"peak_bytes_without\": "),
          "%s", text ? text : "");
    free(text);
    tg_plan_free(&p);
}

/* The recompute summary is untrusted input like the rest of a plan file: past what the
 * pools may hold it is refused by name; a bucket plan carrying another than its plan's is
 * refused by the bucket check. */
TG_TEST(test_recompute_layers_summary_checked) {
    const char *sets[] = {"recompute=layers", "seq_buckets=24,48"};
    tg_plan p;
    if (!compile_job("examples/demo-lm.job", sets, 2, &p)) return;
    REQUIRE(p.buckets && p.buckets[0].peak_bytes_without_recompute == p.peak_bytes_without_recompute &&
                p.peak_bytes_without_recompute > p.peak_bytes,
            "the bucket plan's summary");
    const uint64_t kept = p.peak_bytes_without_recompute;
    tg_err err;
    p.buckets[0].peak_bytes_without_recompute = kept + 1;
    CHECK(tg_plan_validate_buckets(&p, "plan.tgp", &err) == -1 && strstr(err.msg, "recompute summary"), "%s", err.msg);
    p.buckets[0].peak_bytes_without_recompute = kept;
    p.peak_bytes_without_recompute = TG_POOL_COUNT * TG_POOL_MAX_BYTES + 1;
    uint8_t *bytes = NULL;
    size_t len = 0;
    tg_plan back;
    if (CHECK(tg_plan_encode(&p, &bytes, &len, &err) == 0, "%s", err.msg))
        CHECK(tg_plan_decode(bytes, len, "plan.tgp", &back, &err) == -1 &&
                  strstr(err.msg, "plan.tgp: peak without recompute") && strstr(err.msg, "pools may hold"),
              "%s", err.msg);
    free(bytes);
    p.peak_bytes_without_recompute = kept;
    tg_plan_free(&p);
}
