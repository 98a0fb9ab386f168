/* LoRA on Llama (job keys lora_r, lora_alpha, lora_dropout, lora_targets): the plan's
 * structure (base frozen, the adapters trainable, the targeted projections made apart),
 * the model it computes (equal to the base model while B is zero, and to the base model
 * with W + (alpha / r) B A merged in once B is not), its gradients against finite
 * differences, training that moves the adapters alone, and the refusals. Runs on the
 * device the suite tests (TG_TEST_DEVICE). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/compile.h"
#include "base/alloc.h"
#include "compiler/job.h"
#include "models/safetensors.h"
#include "runtime/hf_export.h"
#include "runtime/lora_export.h"
#include "runtime/trainer.h"
#include "tests/harness.h"
#include "tests/lora_fixtures.h"
#include "tests/train_record.h"

#define ALL_TARGETS "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
#define BASE_JOB "model = tiny-llama\nbatch = 2\nseq = 12\ntrain_data = x\nseed = 5\n"
#define LM_JOB BASE_JOB "task = lm\nsteps = 10\n"

static int compile_text(const char *text, tg_plan *p, tg_err *err) {
    tg_job job;
    return tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, err) || tg_compile(&job, p, err) ? -1 : 0;
}

static int count_kind(const tg_plan *p, int kind, int phase) {
    int n = 0;
    for (int o = 0; o < p->n_ops; o++) n += p->ops[o].kind == kind && (phase < 0 || p->ops[o].phase == phase);
    return n;
}

static int find_tensor(const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) return t;
    return -1;
}

TG_TEST(test_lora_plan_structure) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(LM_JOB "lora_r = 4\nlora_targets = " ALL_TARGETS "\n", &p, &err) == 0, "%s", err.msg);
    int trainable = 0, frozen = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (x->flags & TG_TENSOR_VIEW) continue;
        if (x->flags & TG_TENSOR_PARAM) {
            trainable++;
            CHECK(strstr(x->name, ".lora_A.weight") || strstr(x->name, ".lora_B.weight"), "%s is trainable", x->name);
        }
        frozen += (x->flags & TG_TENSOR_FROZEN) != 0;
    }
    /* 7 projections x 2 layers x (A, B); the 21 base tensors of tiny-llama frozen. */
    CHECK(trainable == 28 && frozen == 21, "%d trainable, %d frozen", trainable, frozen);
    int a = find_tensor(&p, "model.layers.1.mlp.down_proj.lora_A.weight"), b = find_tensor(&p, "model.layers.1.mlp.down_proj.lora_B.weight");
    REQUIRE(a >= 0 && b >= 0, "down_proj's adapters");
    CHECK(p.tensors[a].shape[0] == 4 && p.tensors[a].shape[1] == 96 && p.tensors[b].shape[0] == 64 &&
              p.tensors[b].shape[1] == 4 && p.tensors[a].init == TG_INIT_UNIFORM && p.tensors[b].init == TG_INIT_ZEROS &&
              fabsf(p.tensors[a].init_std - 1.0f / sqrtf(96.0f)) < 1e-7f,
          "A [%lld, %lld] init %d, B [%lld, %lld] init %d", (long long)p.tensors[a].shape[0], (long long)p.tensors[a].shape[1],
          p.tensors[a].init, (long long)p.tensors[b].shape[0], (long long)p.tensors[b].shape[1], p.tensors[b].init);
    /* q, k, v and gate, up made apart: the rotary and SwiGLU ops read them as such; the
     * frozen embedding has no backward. */
    for (int o = 0; o < p.n_ops; o++) {
        const tg_op *op = &p.ops[o];
        if (op->kind == TG_OP_ROPE) CHECK(op->in[2] >= 0 && op->in[3] >= 0, "op %d: rope reads a packed qkv", o);
        if (op->kind == TG_OP_SWIGLU) CHECK(op->in[1] >= 0, "op %d: swiglu reads a packed gate_up", o);
        if (op->kind == TG_OP_ROPE_BWD) CHECK(op->out[1] >= 0 && op->out[2] >= 0, "op %d: rope_bwd writes packed", o);
    }
    CHECK(count_kind(&p, TG_OP_EMBEDDING_BWD, -1) == 0, "the frozen embedding has a backward");
    /* The frozen RMSNorm weights take no gradient: their backwards write dx alone (no
     * column sums, no scratch dgamma). */
    int norm_bwd = 0;
    for (int o = 0; o < p.n_ops; o++)
        if (p.ops[o].kind == TG_OP_RMSNORM_BWD)
            norm_bwd++, CHECK(p.ops[o].out[0] >= 0 && p.ops[o].out[1] < 0, "op %d: rmsnorm_bwd writes a dgamma", o);
    for (int t = 0; t < p.n_tensors; t++)
        CHECK(!strstr(p.tensors[t].name, "layernorm.weight") || strncmp(p.tensors[t].name, "scratch.", 8),
              "%s is planned", p.tensors[t].name);
    CHECK(norm_bwd == 2 * 2, "%d rmsnorm_bwd ops (want 4: 2 layers x 2 and the final norm, less the first, over the frozen embedding)", norm_bwd);
    /* What the frozen base removed, against a full fine-tune: per layer the weight-gradient
     * products of q|k|v [128, 64], o [64, 64], gate|up [192, 64] and down [64, 96] (2 N out
     * in FLOPs each, N = 24 tokens), then the LM head's [128, 64] and the embedding's
     * backward (N x 64). */
    const double pruned = 2.0 * 24 * (2 * (128 * 64 + 64 * 64 + 192 * 64 + 64 * 96) + 128 * 64) + 24 * 64;
    CHECK(p.freeze_pruned_ops == 10 && p.freeze_pruned_flops == pruned, "pruned %d ops, %.0f FLOPs (want 10, %.0f)",
          p.freeze_pruned_ops, p.freeze_pruned_flops, pruned);
    /* Each adapter's product scaled by alpha / r (the default alpha 8 over r 4). */
    int scaled = 0;
    for (int o = 0; o < p.n_ops; o++)
        scaled += p.ops[o].kind == TG_OP_MATMUL && p.ops[o].phase == TG_PHASE_FORWARD && p.ops[o].p.matmul.alpha == 2.0f;
    CHECK(scaled == 14, "%d forward products scaled by 2", scaled);
    tg_plan_free(&p);

    /* The default targets (q_proj, v_proj, as PEFT's for Llama): the MLP stays packed. */
    REQUIRE(compile_text(LM_JOB "lora_r = 8\nlora_alpha = 16\n", &p, &err) == 0, "%s", err.msg);
    trainable = 0;
    for (int t = 0; t < p.n_tensors; t++) trainable += (p.tensors[t].flags & TG_TENSOR_PARAM) && !(p.tensors[t].flags & TG_TENSOR_VIEW);
    CHECK(trainable == 8 && find_tensor(&p, "model.layers.0.self_attn.v_proj.lora_B.weight") >= 0 &&
              find_tensor(&p, "model.layers.0.self_attn.k_proj.lora_A.weight") < 0 &&
              find_tensor(&p, "model.layers.0.mlp.gate_up_proj.weight") >= 0,
          "default targets: %d trainable", trainable);
    tg_plan_free(&p);

    /* Classification: the head trains beside the adapters. */
    REQUIRE(compile_text(BASE_JOB "task = classify\nsteps = 10\npad_token_id = 0\nlora_r = 2\n", &p, &err) == 0, "%s", err.msg);
    int score = find_tensor(&p, "score.weight");
    CHECK(score >= 0 && (p.tensors[score].flags & TG_TENSOR_PARAM), "score.weight is not trainable");
    tg_plan_free(&p);
}

TG_TEST(test_lora_refusals) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {LM_JOB "lora_r = 4\nlora_targets = q_proj, qproj\n",
         "job.txt:9: key 'lora_targets': 'qproj' is not a module LoRA adapts in the llama family (q_proj, k_proj, v_proj, "
         "o_proj, gate_proj, up_proj, down_proj)"},
        {LM_JOB "lora_r = 4\nlora_targets = query\n", "'query' is not a module LoRA adapts in the llama family"},
        {LM_JOB "lora_targets = q_proj,,v_proj\n",
         "job.txt:8: key 'lora_targets': 'q_proj,,v_proj' is not a comma-separated list of module names or paths' "
         "tails (such as q_proj,v_proj or mlp.c_proj)"},
        {LM_JOB "lora_targets = q-proj\n", "key 'lora_targets': 'q-proj' is not a comma-separated list"},
        {LM_JOB "lora_r = 4097\n", "job.txt:8: key 'lora_r'"},
        {LM_JOB "lora_alpha = 0\n", "job.txt:8: key 'lora_alpha'"},
        {LM_JOB "lora_dropout = 1\n", "job.txt:8: key 'lora_dropout'"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_plan p;
        tg_err err = {{0}};
        const int rc = compile_text(cases[k].text, &p, &err);
        if (rc == 0) tg_plan_free(&p);
        CHECK(rc != 0 && strstr(err.msg, cases[k].want), "case %zu: rc %d '%s', want '%s'", k, rc, err.msg, cases[k].want);
    }
}

/* While B is zero the adapted model is the base model; with random A and B it is the base
 * model with every targeted W replaced by W + (alpha / r) B A. */
TG_TEST(test_lora_equals_merged_weights) {
    tg_plan base, lora;
    tg_err err;
    REQUIRE(compile_text(LM_JOB, &base, &err) == 0, "%s", err.msg);
    REQUIRE(compile_text(LM_JOB "lora_r = 4\nlora_alpha = 6\nlora_targets = " ALL_TARGETS "\n", &lora, &err) == 0, "%s",
            err.msg);
    tg_trainer tb, tl;
    REQUIRE(tg_test_lora_open_fixed(&tb, &base, &err) == 0, "%s", err.msg);
    REQUIRE(tg_test_lora_open_fixed(&tl, &lora, &err) == 0, "%s", err.msg);
    const int64_t n = tg_tensor_numel(&base.tensors[base.io.logits]);
    float lb, ll;
    float *yb = forward_logits(&tb, &base, &lb, &err), *yl = yb ? forward_logits(&tl, &lora, &ll, &err) : NULL;
    REQUIRE(yb && yl, "%s", err.msg);
    double rel = tg_rel_err(yl, yb, n);
    CHECK(rel <= 1e-6 && fabsf(ll - lb) <= 1e-6f * fabsf(lb), "B = 0: logits %.3g apart, loss %.7g against %.7g", rel, ll, lb);
    free(yb), free(yl);

    /* Random adapters, merged into the base trainer's weights on the host (in double). */
    static const char *const modules[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const float scale = 6.0f / 4.0f;
    for (int l = 0; l < lora.model.layers; l++)
        for (int m = 0; m < 7; m++) {
            char name[160];
            snprintf(name, sizeof name, "model.layers.%d.%s.lora_A.weight", l, modules[m]);
            const int a = find_tensor(&lora, name);
            snprintf(name, sizeof name, "model.layers.%d.%s.lora_B.weight", l, modules[m]);
            const int b = find_tensor(&lora, name);
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, modules[m]);
            const int w = find_tensor(&base, name);
            REQUIRE(a >= 0 && b >= 0 && w >= 0, "%s's adapters", name);
            const int64_t out = base.tensors[w].shape[0], in = base.tensors[w].shape[1], r = 4;
            float *av = malloc(sizeof(float) * (size_t)(r * in)), *bv = malloc(sizeof(float) * (size_t)(out * r));
            float *wv = malloc(sizeof(float) * (size_t)(out * in));
            REQUIRE(av && bv && wv && tg_trainer_read_f32(&tl, a, av, &err) == 0 && tg_trainer_read_f32(&tb, w, wv, &err) == 0,
                    "%s", err.msg);
            random_fill(bv, out * r, 0.2f, (uint32_t)(l * 7 + m + 1));
            REQUIRE(tg_trainer_write(&tl, b, bv, &err) == 0, "%s", err.msg);
            for (int64_t i = 0; i < out; i++)
                for (int64_t j = 0; j < in; j++) {
                    double s = 0;
                    for (int64_t k = 0; k < r; k++) s += (double)bv[i * r + k] * av[k * in + j];
                    wv[i * in + j] = (float)(wv[i * in + j] + scale * s);
                }
            REQUIRE(tg_trainer_write(&tb, w, wv, &err) == 0, "%s", err.msg);
            free(av), free(bv), free(wv);
        }
    yb = forward_logits(&tb, &base, &lb, &err), yl = yb ? forward_logits(&tl, &lora, &ll, &err) : NULL;
    REQUIRE(yb && yl, "%s", err.msg);
    rel = tg_rel_err(yl, yb, n);
    CHECK(rel <= 2e-5 && fabsf(ll - lb) <= 2e-5f * fabsf(lb), "merged: logits %.3g apart, loss %.7g against %.7g", rel, ll,
          lb);
    free(yb), free(yl);
    tg_trainer_close(&tb), tg_trainer_close(&tl);
    tg_plan_free(&base), tg_plan_free(&lora);
}

/* The adapters' gradients against central differences of the loss (fp32, B made non-zero
 * so A's gradient is too). */
TG_TEST(test_lora_gradients_finite_differences) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(LM_JOB "lora_r = 2\nlora_targets = v_proj,up_proj,down_proj\n", &p, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    REQUIRE(tg_test_lora_open_fixed(&tr, &p, &err) == 0, "%s", err.msg);
    static const char *const names[] = {"model.layers.0.self_attn.v_proj.lora_B.weight", "model.layers.1.mlp.up_proj.lora_B.weight",
                                        "model.layers.0.mlp.down_proj.lora_B.weight"};
    for (size_t k = 0; k < 3; k++) { /* B non-zero */
        const int b = find_tensor(&p, names[k]);
        REQUIRE(b >= 0, "%s", names[k]);
        const int64_t n = tg_tensor_numel(&p.tensors[b]);
        float *v = malloc(sizeof(float) * (size_t)n);
        random_fill(v, n, 1.0f, (uint32_t)(k + 11));
        REQUIRE(tg_trainer_write(&tr, b, v, &err) == 0, "%s", err.msg);
        free(v);
    }
    static const char *const probe[] = {"model.layers.0.self_attn.v_proj.lora_A.weight", "model.layers.0.self_attn.v_proj.lora_B.weight",
                                        "model.layers.1.mlp.up_proj.lora_A.weight", "model.layers.0.mlp.down_proj.lora_B.weight"};
    enum { PROBES = sizeof probe / sizeof probe[0] };
    /* Every gradient read before any forward runs again: gradients share the activations'
     * pool (share_grad_memory). */
    float *grads[PROBES];
    REQUIRE(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_BACKWARD, 1, &err) == 0, "%s", err.msg);
    for (size_t k = 0; k < PROBES; k++) {
        const int t = find_tensor(&p, probe[k]);
        REQUIRE(t >= 0 && p.tensors[t].grad >= 0, "%s has no gradient", probe[k]);
        grads[k] = malloc(sizeof(float) * (size_t)tg_tensor_numel(&p.tensors[t]));
        REQUIRE(grads[k] && tg_trainer_read_f32(&tr, p.tensors[t].grad, grads[k], &err) == 0, "%s", err.msg);
    }
    for (size_t k = 0; k < PROBES; k++) {
        const int t = find_tensor(&p, probe[k]);
        const int64_t n = tg_tensor_numel(&p.tensors[t]);
        float *v = malloc(sizeof(float) * (size_t)n), *g = grads[k];
        REQUIRE(v && tg_trainer_read_f32(&tr, t, v, &err) == 0, "%s", err.msg);
        double worst = 0;
        for (int64_t i = 0; i < n; i += n / 5 + 1) {
            const float keep = v[i], h = 1e-2f;
            float up, down;
            v[i] = keep + h;
            REQUIRE(tg_trainer_write(&tr, t, v, &err) == 0 && tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0 &&
                        tg_trainer_read_f32(&tr, p.io.loss, &up, &err) == 0, "%s", err.msg);
            v[i] = keep - h;
            REQUIRE(tg_trainer_write(&tr, t, v, &err) == 0 && tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0 &&
                        tg_trainer_read_f32(&tr, p.io.loss, &down, &err) == 0, "%s", err.msg);
            v[i] = keep;
            REQUIRE(tg_trainer_write(&tr, t, v, &err) == 0, "%s", err.msg);
            const double numeric = ((double)up - down) / (2.0 * h), d = fabs(numeric - g[i]) / fmax(fabs(numeric), 1e-3);
            if (d > worst) worst = d;
        }
        CHECK(worst < 2e-2, "%s: gradient %.3g from central differences", probe[k], worst);
        free(v), free(g);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* Training moves the adapters and nothing else, and the loss falls. */
TG_TEST(test_lora_training_moves_adapters_only) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(BASE_JOB "task = lm\nlora_r = 4\nlr = 1e-2\nwarmup_steps = 0\nsteps = 30\nlora_targets = " ALL_TARGETS "\n", &p,
                         &err) == 0,
            "%s", err.msg);
    tg_trainer tr;
    REQUIRE(tg_test_lora_open_fixed(&tr, &p, &err) == 0, "%s", err.msg);
    const int frozen = find_tensor(&p, "model.layers.1.self_attn.o_proj.weight"), b = find_tensor(&p, "model.layers.1.self_attn.o_proj.lora_B.weight");
    REQUIRE(frozen >= 0 && b >= 0, "tensors");
    const int64_t nf = tg_tensor_numel(&p.tensors[frozen]), nb = tg_tensor_numel(&p.tensors[b]);
    float *f0 = malloc(sizeof(float) * (size_t)nf), *f1 = malloc(sizeof(float) * (size_t)nf), *b1 = malloc(sizeof(float) * (size_t)nb);
    REQUIRE(f0 && f1 && b1 && tg_trainer_read_f32(&tr, frozen, f0, &err) == 0, "%s", err.msg);
    float first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        tg_step_stats st;
        REQUIRE(tg_trainer_run_step(&tr, &st, &err) == 0, "%s", err.msg);
        if (s == 0) first = st.loss;
        last = st.loss;
    }
    REQUIRE(tg_trainer_read_f32(&tr, frozen, f1, &err) == 0 && tg_trainer_read_f32(&tr, b, b1, &err) == 0, "%s", err.msg);
    CHECK(!memcmp(f0, f1, sizeof(float) * (size_t)nf), "a frozen base weight changed");
    double moved = 0;
    for (int64_t i = 0; i < nb; i++) moved += fabs(b1[i]);
    CHECK(moved > 0, "B did not move");
    CHECK(last < 0.9f * first, "loss %.4f -> %.4f", first, last);
    free(f0), free(f1), free(b1);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* Export of a LoRA plan: model.safetensors holds W + (alpha / r) B A for every adapted
 * projection and no adapter, so the folder loads as a plain Llama that computes what the
 * adapted model does; adapter/adapter_config.json and adapter/adapter_model.safetensors hold
 * the adapters as PEFT saves them, and the folder itself has no adapter_config.json (with
 * one there, transformers with peft installed loads the folder as a base model plus the
 * adapter, and adds each adapter a second time to the merged weights). */
TG_TEST(test_lora_export_merged_and_adapter) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(LM_JOB "lora_r = 4\nlora_alpha = 6\nlora_dropout = 0.05\nlora_targets = q_proj,down_proj\n", &p,
                         &err) == 0,
            "%s", err.msg);
    tg_trainer tr;
    REQUIRE(tg_test_lora_open_fixed(&tr, &p, &err) == 0, "%s", err.msg);
    const int b = find_tensor(&p, "model.layers.0.self_attn.q_proj.lora_B.weight");
    const int a = find_tensor(&p, "model.layers.0.self_attn.q_proj.lora_A.weight");
    const int w = find_tensor(&p, "model.layers.0.self_attn.q_proj.weight");
    REQUIRE(a >= 0 && b >= 0 && w >= 0, "q_proj's adapters");
    const int64_t out = 64, in = 64, r = 4;
    float *av = malloc(sizeof(float) * (size_t)(r * in)), *bv = malloc(sizeof(float) * (size_t)(out * r));
    float *wv = malloc(sizeof(float) * (size_t)(out * in)), *got = malloc(sizeof(float) * (size_t)(out * in));
    REQUIRE(av && bv && wv && got, "out of memory");
    random_fill(bv, out * r, 0.3f, 77);
    REQUIRE(tg_trainer_write(&tr, b, bv, &err) == 0 && tg_trainer_read_f32(&tr, a, av, &err) == 0 &&
                tg_trainer_read_f32(&tr, w, wv, &err) == 0,
            "%s", err.msg);
    float loss;
    float *want_logits = forward_logits(&tr, &p, &loss, &err);
    REQUIRE(want_logits, "%s", err.msg);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/lora-export", tg_test_tmpdir());
    tg_hf_export_options o = {.out_dir = dir};
    REQUIRE(tg_trainer_export_hf(&tr, &o, &err) == 0, "%s", err.msg);

    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    CHECK(!tg_st_find(&st, "model.layers.0.self_attn.q_proj.lora_A.weight") &&
              !tg_st_find(&st, "model.layers.0.mlp.down_proj.lora_B.weight"),
          "model.safetensors holds adapters");
    const tg_st_entry *e = tg_st_find(&st, "model.layers.0.self_attn.q_proj.weight");
    REQUIRE(e && tg_st_read_f32(&st, e, got, out * in, &err) == 0, "q_proj.weight: %s", e ? err.msg : "missing");
    double worst = 0;
    for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < in; j++) {
            double s = 0;
            for (int64_t k = 0; k < r; k++) s += (double)bv[i * r + k] * av[k * in + j];
            const double want = wv[i * in + j] + 1.5 * s;
            if (fabs(got[i * in + j] - want) > worst) worst = fabs(got[i * in + j] - want);
        }
    CHECK(worst < 1e-6, "merged q_proj.weight %.3g from W + 1.5 B A", worst);
    tg_st_close(&st);

    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    CHECK(access(path, F_OK) != 0, "%s: the merged folder holds the adapter's config", path);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    CHECK(access(path, F_OK) != 0, "%s: the merged folder holds the adapter's weights", path);
    snprintf(path, sizeof path, "%s/" TG_HF_ADAPTER_DIR "/adapter_model.safetensors", dir);
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    e = tg_st_find(&st, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    REQUIRE(e && e->ndim == 2 && e->shape[0] == out && e->shape[1] == r && tg_st_read_f32(&st, e, got, out * r, &err) == 0,
            "adapter B");
    CHECK(!memcmp(got, bv, sizeof(float) * (size_t)(out * r)), "adapter B values differ");
    CHECK(tg_st_find(&st, "base_model.model.model.layers.1.mlp.down_proj.lora_A.weight") &&
              !tg_st_find(&st, "base_model.model.model.layers.0.self_attn.q_proj.weight") && st.n == 8,
          "adapter file: %d tensors", st.n);
    tg_st_close(&st);
    snprintf(path, sizeof path, "%s/" TG_HF_ADAPTER_DIR "/adapter_config.json", dir);
    json_error_t jerr;
    json_t *c = json_load_file(path, 0, &jerr);
    REQUIRE(c, "%s: %s", path, jerr.text);
    json_t *targets = json_object_get(c, "target_modules");
    CHECK(!strcmp(json_string_value(json_object_get(c, "peft_type")), "LORA") &&
              !strcmp(json_string_value(json_object_get(c, "task_type")), "CAUSAL_LM") &&
              json_integer_value(json_object_get(c, "r")) == 4 &&
              fabs(json_number_value(json_object_get(c, "lora_alpha")) - 6.0) < 1e-6 &&
              fabs(json_number_value(json_object_get(c, "lora_dropout")) - 0.05) < 1e-6 && json_array_size(targets) == 2 &&
              !strcmp(json_string_value(json_array_get(targets, 0)), "q_proj") &&
              !strcmp(json_string_value(json_array_get(targets, 1)), "down_proj") &&
              json_is_null(json_object_get(c, "modules_to_save")),
          "adapter_config.json fields");
    json_decref(c);

    /* The folder as a plain model computes the adapted model's logits. */
    char text[900];
    snprintf(text, sizeof text, "model = %s\nbatch = 2\nseq = 12\ntrain_data = x\nseed = 5\ntask = lm\nsteps = 10\n", dir);
    tg_plan merged;
    REQUIRE(compile_text(text, &merged, &err) == 0, "%s", err.msg);
    tg_trainer tm;
    REQUIRE(tg_test_lora_open_fixed(&tm, &merged, &err) == 0, "%s", err.msg);
    float loss_merged;
    float *logits = forward_logits(&tm, &merged, &loss_merged, &err);
    REQUIRE(logits, "%s", err.msg);
    const double rel = tg_rel_err(logits, want_logits, tg_tensor_numel(&p.tensors[p.io.logits]));
    CHECK(rel <= 2e-5, "the merged folder's logits %.3g from the adapted model's", rel);
    free(logits), free(want_logits), free(av), free(bv), free(wv), free(got);
    tg_trainer_close(&tm), tg_trainer_close(&tr);
    tg_plan_free(&merged), tg_plan_free(&p);
}

/* Every allocation of a LoRA export failed in turn: the export stops with a message saying
 * so and leaves no folder, or succeeds; then it succeeds with every file. */
TG_TEST(test_lora_export_allocation_failures) {
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(compile_text(BASE_JOB "task = classify\nsteps = 10\npad_token_id = 0\nlora_r = 2\nlora_targets = v_proj\n", &p,
                         &err) == 0,
            "%s", err.msg);
    tg_weights_image img;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 3);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/lora-oom", tg_test_tmpdir());
    const tg_hf_export_options o = {.out_dir = dir, .force = 1, .bf16 = 1};
    long failed = 0, k = 0;
    for (;; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_hf_export(&img, &o, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) break;
        failed++;
        CHECK(strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory"), "allocation %ld: '%s'", k,
              err.msg);
    }
    CHECK(failed > 10, "%ld allocations failed the export", failed);
    char path[700];
    static const char *const files[] = {"config.json", "model.safetensors", TG_HF_ADAPTER_DIR "/adapter_config.json",
                                        TG_HF_ADAPTER_DIR "/adapter_model.safetensors"};
    for (size_t f = 0; f < 4; f++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        CHECK(access(path, R_OK) == 0, "%s missing", path);
    }
    snprintf(path, sizeof path, "%s/" TG_HF_ADAPTER_DIR "/adapter_config.json", dir);
    json_error_t jerr;
    json_t *c = json_load_file(path, 0, &jerr);
    json_t *save = c ? json_object_get(c, "modules_to_save") : NULL;
    CHECK(c && !strcmp(json_string_value(json_object_get(c, "task_type")), "SEQ_CLS") && json_array_size(save) == 1 &&
              !strcmp(json_string_value(json_array_get(save, 0)), "score"),
          "classification adapter_config.json");
    json_decref(c);
    tg_safetensors st;
    snprintf(path, sizeof path, "%s/" TG_HF_ADAPTER_DIR "/adapter_model.safetensors", dir);
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    const tg_st_entry *e = tg_st_find(&st, "base_model.model.score.weight");
    CHECK(e && e->dtype == TG_ST_BF16 && st.n == 5, "the head in the adapter file, bf16 (%d tensors)", st.n);
    tg_st_close(&st);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* A plan whose adapter lacks its B, its base weight or its product (edited, or not a LoRA
 * plan this build makes) is not exported as one: the message names the adapter. */
TG_TEST(test_lora_pairs_refuse_incomplete_adapters) {
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(compile_text(LM_JOB "lora_r = 2\nlora_targets = o_proj\n", &p, &err) == 0, "%s", err.msg);
    tg_lora_pair *pairs = NULL;
    REQUIRE(tg_lora_pairs(&p, &pairs, &err) == 2 && pairs && pairs[0].scale == 4.0f, "two pairs, scale 8 / 2");
    free(pairs);
    const int b = find_tensor(&p, "model.layers.1.self_attn.o_proj.lora_B.weight");
    REQUIRE(b >= 0, "o_proj's B");
    snprintf(p.tensors[b].name, sizeof p.tensors[b].name, "model.layers.1.self_attn.o_proj.lora_C.weight");
    CHECK(tg_lora_pairs(&p, &pairs, &err) == -1 && !pairs &&
              !strcmp(err.msg, "model.layers.1.self_attn.o_proj.lora_A.weight: no matching base weight, lora_B and "
                               "product: not a LoRA plan this build exports"),
          "'%s'", err.msg);
    tg_plan_free(&p);
    /* No adapter at all: no pairs. */
    REQUIRE(compile_text(LM_JOB, &p, &err) == 0, "%s", err.msg);
    CHECK(tg_lora_pairs(&p, &pairs, &err) == 0 && !pairs, "pairs in a plan without LoRA");
    tg_plan_free(&p);
}
