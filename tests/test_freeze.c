/* Parameter classes: the job key `freeze` (its errors), frozen parameters in the plan
 * (their pool, no gradient or optimizer state, the backward pruned below the lowest
 * trainable parameter), training with a freeze against the unfrozen plan, checkpoints of
 * frozen runs, and the buffers Hugging Face checkpoints hold. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/bf16.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "plan/inspect.h"
#include "plan/op_meta.h"
#include "plan/plan_codec.h"
#include "plan/plan_file.h"
#include "plan/validate.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* Compiles a job given as text, written to a file so that messages carry its lines. */
static int compile_text(const char *text, tg_plan *plan, tg_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/job.txt", tg_test_tmpdir());
    if (tg_test_write_file(path, text)) return tg_fail(err, "cannot write %s", path);
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

static int count_kind(const tg_plan *p, int kind) {
    int n = 0;
    for (int o = 0; o < p->n_ops; o++) n += p->ops[o].kind == kind;
    return n;
}

static int count_class(const tg_plan *p, int cls) {
    int n = 0;
    for (int t = 0; t < p->n_tensors; t++) n += tg_tensor_is_value(&p->tensors[t]) && tg_tensor_class_of(&p->tensors[t]) == cls;
    return n;
}

#define TINY_BERT "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n"

TG_TEST(test_freeze_unknown_pattern) {
    tg_plan p;
    tg_err err;
    CHECK(compile_text(TINY_BERT "freeze = bert.embeddings.*, bert.encoder.layer.7.*\n", &p, &err) != 0,
          "a pattern matching nothing was accepted");
    CHECK(strstr(err.msg, "job.txt:6: key 'freeze'") && strstr(err.msg, "'bert.encoder.layer.7.*'") &&
              !strstr(err.msg, "'bert.embeddings.*'") && strstr(err.msg, "no parameter"),
          "message: %s", err.msg);
    CHECK(compile_text(TINY_BERT "freeze = bert.embeddings.*,, classifier.*\n", &p, &err) != 0 &&
              strstr(err.msg, "job.txt:6: key 'freeze': empty pattern"),
          "message: %s", err.msg);
    /* Buffers are not parameters: a pattern naming only a buffer matches nothing. */
    CHECK(compile_text(TINY_BERT "freeze = bert.embeddings.position_ids\n", &p, &err) != 0 &&
              strstr(err.msg, "no parameter"),
          "message: %s", err.msg);
}

TG_TEST(test_freeze_splits_packed_group) {
    tg_plan p;
    tg_err err;
    CHECK(compile_text(TINY_BERT "freeze = bert.encoder.layer.0.attention.self.query.*\n", &p, &err) != 0,
          "a freeze splitting the packed qkv group was accepted");
    CHECK(strstr(err.msg, "job.txt:6: key 'freeze'") && strstr(err.msg, "attention.self.query.weight") &&
              strstr(err.msg, "attention.self.key.weight") && strstr(err.msg, "fuse_qkv = false"),
          "message: %s", err.msg);
    /* With three separate products, or all three frozen, it compiles. */
    REQUIRE(compile_text(TINY_BERT "fuse_qkv = false\nfreeze = bert.encoder.layer.0.attention.self.query.*\n", &p,
                         &err) == 0,
            "%s", err.msg);
    CHECK(count_class(&p, TG_CLASS_FROZEN) == 2, "%d frozen", count_class(&p, TG_CLASS_FROZEN));
    tg_plan_free(&p);
    REQUIRE(compile_text(TINY_BERT "freeze = bert.encoder.layer.0.attention.self.*\n", &p, &err) == 0, "%s", err.msg);
    int v = tg_test_tensor_named(&p, "bert.encoder.layer.0.attention.self.qkv.weight");
    CHECK(v >= 0 && tg_tensor_class_of(&p.tensors[v]) == TG_CLASS_FROZEN && p.tensors[v].pool == TG_POOL_FROZEN &&
              (p.tensors[v].flags & TG_TENSOR_VIEW),
          "the packed view does not take its members' class");
    tg_plan_free(&p);
}

TG_TEST(test_freeze_everything) {
    tg_plan p;
    tg_err err;
    CHECK(compile_text(TINY_BERT "freeze = *\n", &p, &err) != 0, "freezing everything was accepted");
    CHECK(strstr(err.msg, "job.txt:6: key 'freeze'") && strstr(err.msg, "nothing to train"), "message: %s", err.msg);
}

/* Frozen tensors are in the frozen pool, without gradient or AdamW state; the params pool
 * (and the gradient and optimizer pools with it) shrinks by at least their bytes. */
TG_TEST(test_freeze_pools) {
    tg_plan full, fz;
    tg_err err;
    REQUIRE(compile_text(TINY_BERT, &full, &err) == 0, "%s", err.msg);
    REQUIRE(compile_text(TINY_BERT "freeze = bert.embeddings.*, bert.encoder.layer.0.*\n", &fz, &err) == 0, "%s",
            err.msg);
    uint64_t frozen_bytes = 0;
    int frozen = 0;
    for (int t = 0; t < fz.n_tensors; t++) {
        const tg_tensor *x = &fz.tensors[t];
        if (tg_tensor_class_of(x) != TG_CLASS_FROZEN) continue;
        CHECK(x->pool == TG_POOL_FROZEN && x->grad == -1 && !(x->flags & (TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY)),
              "%s: pool %s, gradient %d", x->name, tg_pool_name(x->pool), x->grad);
        char grad_name[TG_NAME_MAX + 8];
        snprintf(grad_name, sizeof grad_name, "grad.%s", x->name);
        CHECK(tg_test_tensor_named(&fz, grad_name) < 0, "%s has a gradient tensor", x->name);
        if (!tg_tensor_is_value(x)) continue;
        frozen++;
        frozen_bytes += x->bytes;
    }
    /* 3 tables and a LayerNorm, and layer 0's 16 parameters. */
    CHECK(frozen == 5 + 16 && count_class(&fz, TG_CLASS_TRAINABLE) + frozen == count_class(&full, TG_CLASS_TRAINABLE),
          "%d frozen of %d", frozen, count_class(&full, TG_CLASS_TRAINABLE));
    CHECK(full.pool_bytes[TG_POOL_PARAMS] - fz.pool_bytes[TG_POOL_PARAMS] >= frozen_bytes &&
              fz.pool_bytes[TG_POOL_FROZEN] >= frozen_bytes && full.pool_bytes[TG_POOL_FROZEN] == 0,
          "params %llu -> %llu, frozen pool %llu, frozen tensors %llu bytes",
          (unsigned long long)full.pool_bytes[TG_POOL_PARAMS], (unsigned long long)fz.pool_bytes[TG_POOL_PARAMS],
          (unsigned long long)fz.pool_bytes[TG_POOL_FROZEN], (unsigned long long)frozen_bytes);
    CHECK(fz.pool_bytes[TG_POOL_GRADS] == fz.pool_bytes[TG_POOL_PARAMS] &&
              fz.tensors[fz.io.m_all].bytes == fz.pool_bytes[TG_POOL_PARAMS] &&
              fz.tensors[fz.io.v_all].bytes == fz.pool_bytes[TG_POOL_PARAMS],
          "gradients and AdamW state do not cover exactly the trainable parameters");
    for (int o = 0; o < fz.n_ops; o++)
        if (fz.ops[o].kind == TG_OP_ADAMW)
            CHECK(fz.ops[o].p.adamw.n * 4 == (int64_t)fz.pool_bytes[TG_POOL_PARAMS], "adamw updates %lld elements",
                  (long long)fz.ops[o].p.adamw.n);
    /* The buffers of the embeddings, in both. */
    CHECK(count_class(&fz, TG_CLASS_BUFFER) == 2 && count_class(&full, TG_CLASS_BUFFER) == 2 &&
              fz.pool_bytes[TG_POOL_BUFFERS] > 0,
          "buffers: %d", count_class(&fz, TG_CLASS_BUFFER));
    printf("    tiny-bert (2 x 8): unfrozen %d ops (%d backward), params %llu, peak %llu bytes; embeddings and layer 0 "
           "frozen: %d ops (%d backward), params %llu, frozen %llu, peak %llu bytes\n",
           full.n_ops, full.phase_begin[2] - full.phase_begin[1], (unsigned long long)full.pool_bytes[TG_POOL_PARAMS],
           (unsigned long long)full.peak_bytes, fz.n_ops, fz.phase_begin[2] - fz.phase_begin[1],
           (unsigned long long)fz.pool_bytes[TG_POOL_PARAMS], (unsigned long long)fz.pool_bytes[TG_POOL_FROZEN],
           (unsigned long long)fz.peak_bytes);
    CHECK(fz.peak_bytes < full.peak_bytes, "the frozen plan is not smaller");
    /* The memory checker accepts its layout, and the plan file keeps the classes. */
    tg_memory_report mr;
    CHECK(tg_plan_check_memory(&fz, &mr, &err) == 0 && mr.peak_bytes == fz.peak_bytes, "memory check: %s", err.msg);
    uint8_t *bytes = NULL;
    size_t len = 0;
    tg_plan back;
    REQUIRE(tg_plan_encode(&fz, &bytes, &len, &err) == 0, "%s", err.msg);
    CHECK(tg_plan_decode(bytes, len, "frozen.tgp", &back, &err) == 0, "%s", err.msg);
    CHECK(back.n_tensors == fz.n_tensors && count_class(&back, TG_CLASS_FROZEN) == frozen &&
              back.pool_bytes[TG_POOL_FROZEN] == fz.pool_bytes[TG_POOL_FROZEN],
          "the classes do not survive the plan file");
    free(bytes);
    tg_plan_free(&back);
    tg_plan_free(&full);
    tg_plan_free(&fz);
}

TG_TEST(test_freeze_embeddings_no_embedding_bwd) {
    tg_plan full, fz;
    tg_err err;
    REQUIRE(compile_text(TINY_BERT, &full, &err) == 0, "%s", err.msg);
    REQUIRE(compile_text(TINY_BERT "freeze = bert.embeddings.*\n", &fz, &err) == 0, "%s", err.msg);
    CHECK(count_kind(&full, TG_OP_EMBEDDING_BWD) == 3 && count_kind(&fz, TG_OP_EMBEDDING_BWD) == 0,
          "embedding backwards: %d unfrozen, %d frozen", count_kind(&full, TG_OP_EMBEDDING_BWD),
          count_kind(&fz, TG_OP_EMBEDDING_BWD));
    /* The embeddings' LayerNorm is frozen and its input needs no gradient: no backward for it. */
    CHECK(count_kind(&fz, TG_OP_LAYERNORM_BWD) == 0, "%d layernorm backwards", count_kind(&fz, TG_OP_LAYERNORM_BWD));
    tg_plan_free(&full);
    tg_plan_free(&fz);
}

/* Backward ops reading only layer-0 tensors (besides the batch and the step counter). */
static int layer0_only_backward_ops(const tg_plan *p) {
    int n = 0;
    for (int o = p->phase_begin[TG_PHASE_BACKWARD]; o < p->phase_begin[TG_PHASE_BACKWARD + 1]; o++) {
        int layer0 = 0, other = 0;
        for (int s = 0; s < TG_OP_MAX_IN; s++) {
            const int t = p->ops[o].in[s];
            if (t < 0 || p->tensors[t].pool == TG_POOL_INPUTS || p->tensors[t].pool == TG_POOL_OPTIM) continue;
            if (strstr(p->tensors[t].name, "encoder.layer.0.")) layer0++;
            else other++;
        }
        n += layer0 > 0 && other == 0;
    }
    return n;
}

TG_TEST(test_freeze_prunes_below_lowest_trainable) {
    tg_plan full, fz;
    tg_err err;
    REQUIRE(compile_text(TINY_BERT, &full, &err) == 0, "%s", err.msg);
    REQUIRE(compile_text(TINY_BERT "freeze = bert.embeddings.*, bert.encoder.layer.0.*\n", &fz, &err) == 0, "%s",
            err.msg);
    int a = layer0_only_backward_ops(&full), b = layer0_only_backward_ops(&fz);
    CHECK(a > 5 && b == 0, "backward ops reading only layer-0 tensors: %d unfrozen, %d frozen", a, b);
    /* Nothing in the backward writes a layer-0 tensor either. */
    int writes = 0;
    for (int o = fz.phase_begin[TG_PHASE_BACKWARD]; o < fz.phase_begin[TG_PHASE_BACKWARD + 1]; o++)
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            writes += fz.ops[o].out[s] >= 0 && strstr(fz.tensors[fz.ops[o].out[s]].name, "encoder.layer.0.") != NULL;
    CHECK(writes == 0, "%d backward outputs are layer-0 tensors", writes);
    tg_plan_free(&full);
    tg_plan_free(&fz);
}

/* ---- training with a freeze ---------------------------------------------------------- */

/* One step (dropout on) of a plan with a freeze and of the unfrozen plan, from the same
 * seeded weights (initialisation is by name, whatever the class) and batch: the same loss
 * and bit for bit the same gradient of every trainable parameter. Then two more steps of
 * the frozen plan: its frozen tensors (and their bf16 copies) keep their initial values bit
 * for bit. */
static void freeze_trains_alike(const char *preset, int task, int precision, int vocab, const char *freeze,
                                int expect_copies) {
    tg_model_config cfg;
    tg_err err;
    memset(&cfg, 0, sizeof cfg);
    REQUIRE(tg_model_config_load(preset, &cfg, &err) == 0, "%s", err.msg);
    REQUIRE(cfg.hidden_dropout > 0 && cfg.attention_dropout > 0, "%s should have dropout on", preset);
    cfg.initializer_range = 0.2f;
    if (vocab) cfg.vocab_size = vocab;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", preset);
    job.task = task, job.num_labels = task == TG_TASK_CLASSIFY ? 3 : 2, job.batch = 3, job.seq = 7, job.steps = 3;
    job.seed = 5, job.precision = precision;
    job.pad_token_id = cfg.pad_token_id >= 0 ? -1 : 0;
    tg_plan plans[2];
    REQUIRE(tg_compile_with_config(&job, &cfg, &plans[0], &err) == 0, "%s", err.msg);
    snprintf(job.freeze, sizeof job.freeze, "%s", freeze);
    if (!CHECK(tg_compile_with_config(&job, &cfg, &plans[1], &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plans[0]);
        return;
    }
    const tg_plan *full = &plans[0], *fz = &plans[1];
    int copies = 0, bf16_frozen = 0;
    for (int t = 0; t < fz->n_tensors; t++) {
        copies += (fz->tensors[t].flags & TG_TENSOR_FROZEN) && (fz->tensors[t].flags & TG_TENSOR_PARAM_COPY);
        bf16_frozen += tg_tensor_is_value(&fz->tensors[t]) && tg_tensor_class_of(&fz->tensors[t]) == TG_CLASS_FROZEN &&
                       fz->tensors[t].dtype == TG_BF16;
    }
    CHECK(copies == expect_copies, "%s: %d bf16 copies of frozen tables, expected %d", preset, copies, expect_copies);
    CHECK((precision == TG_PREC_BF16) == (bf16_frozen > 0), "%s: %d frozen tensors stored bf16", preset, bf16_frozen);

    tg_trainer tr[2];
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    tg_step_stats st[2];
    float *grads[2] = {NULL, NULL};
    int opened = 0, rc = 0;
    for (int m = 0; m < 2 && !rc; m++) {
        if (!CHECK(tg_trainer_open(&tr[m], &plans[m], &o, &err) == 0, "%s", err.msg)) {
            rc = -1;
            break;
        }
        opened++;
        uint64_t rng = 0x5DEECE66Dull;
        tg_test_fill_random_inputs(&tr[m], &plans[m], &rng);
        grads[m] = malloc(plans[m].pool_bytes[TG_POOL_GRADS]);
        rc = !grads[m] || tg_trainer_run_step(&tr[m], &st[m], &err) ||
             tg_trainer_read(&tr[m], plans[m].io.grads_all, grads[m], &err);
        CHECK(rc == 0, "%s", err.msg);
    }
    if (!rc) {
        CHECK(st[0].loss == st[1].loss && isfinite(st[0].loss), "%s: loss unfrozen %.9g, frozen %.9g", preset,
              st[0].loss, st[1].loss);
        int compared = 0;
        for (int t = 0; t < fz->n_tensors; t++) {
            const tg_tensor *x = &fz->tensors[t];
            if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) != TG_CLASS_TRAINABLE) continue;
            int u = tg_test_tensor_named(full, x->name);
            if (!CHECK(u >= 0, "%s not in the unfrozen plan", x->name)) continue;
            CHECK(memcmp((char *)grads[1] + x->offset, (char *)grads[0] + full->tensors[u].offset, x->bytes) == 0,
                  "%s: gradient of %s differs from the unfrozen plan's", preset, x->name);
            compared++;
        }
        CHECK(compared > 5, "%s: %d gradients compared", preset, compared);
        /* Two more steps, then every frozen tensor as it was uploaded. */
        for (int s = 0; s < 2 && !rc; s++) {
            uint64_t rng = 0x1234567ull + (uint64_t)s;
            tg_test_fill_random_inputs(&tr[1], fz, &rng);
            rc = tg_trainer_run_step(&tr[1], &st[1], &err);
            CHECK(rc == 0, "%s", err.msg);
        }
        int checked = 0;
        for (int t = 0; t < fz->n_tensors && !rc; t++) {
            const tg_tensor *x = &fz->tensors[t];
            if (tg_tensor_class_of(x) != TG_CLASS_FROZEN || (x->flags & TG_TENSOR_VIEW)) continue;
            const float *init = tg_weights_value(&tr[1].values, x->flags & TG_TENSOR_PARAM_COPY ? x->master : t);
            void *now = malloc(x->bytes), *want = malloc(x->bytes);
            REQUIRE(now && want && init, "out of memory");
            if (x->dtype == TG_BF16) tg_bf16_narrow(want, init, tg_tensor_numel(x));
            else memcpy(want, init, x->bytes);
            CHECK(tg_trainer_read(&tr[1], t, now, &err) == 0 && memcmp(now, want, x->bytes) == 0,
                  "%s: frozen %s changed in training", preset, x->name);
            checked++;
            free(now), free(want);
        }
        CHECK(checked > 5, "%s: %d frozen tensors checked", preset, checked);
    }
    for (int m = 0; m < opened; m++) tg_trainer_close(&tr[m]);
    for (int m = 0; m < 2; m++) free(grads[m]), tg_plan_free(&plans[m]);
}

TG_TEST(test_freeze_trains_alike_tiny_bert) {
    freeze_trains_alike("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 0, "bert.embeddings.*, bert.encoder.layer.0.*", 0);
}
TG_TEST(test_freeze_trains_alike_tiny_bert_bf16) {
    freeze_trains_alike("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 0, "bert.embeddings.*, bert.encoder.layer.0.*", 0);
}
/* The tied table frozen: in bf16 the LM head reads a bf16 copy of it, padded to 128 rows. */
TG_TEST(test_freeze_trains_alike_tiny_gpt2_lm) {
    freeze_trains_alike("tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, 101, "transformer.wte.*, transformer.wpe.*, transformer.h.0.*",
                        0);
}
TG_TEST(test_freeze_trains_alike_tiny_gpt2_lm_bf16) {
    freeze_trains_alike("tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 101, "transformer.wte.*, transformer.wpe.*, transformer.h.0.*",
                        1);
}
/* Layer 1 frozen above a trainable layer 0: gradients flow through frozen layers. */
TG_TEST(test_freeze_trains_alike_tiny_gpt2_lm_middle) {
    freeze_trains_alike("tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 0, "transformer.h.1.*, transformer.ln_f.*", 0);
}

/* ---- checkpoints and buffers ---------------------------------------------------------- */

/* A model folder in the test's directory: tiny-bert's config.json (and no weights yet). */
static const char *tiny_bert_folder(void) {
    const char *dir = tg_test_tmpdir();
    char src[600], dst[600], cmd[1400];
    snprintf(src, sizeof src, "%s/tiny-bert/config.json", tg_presets_dir());
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    return system(cmd) == 0 ? dir : NULL;
}

/* Compiles tiny BERT from `model` (a preset or folder) with the freeze and precision given,
 * and opens a CPU trainer on it (loading the folder's weights). */
static int open_tiny_bert(const char *model, const char *freeze, int precision, tg_plan *p, tg_trainer *tr,
                          tg_err *err) {
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (tg_model_config_load(model, &cfg, err)) return -1;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", model);
    snprintf(job.freeze, sizeof job.freeze, "%s", freeze);
    job.batch = 2, job.seq = 8, job.steps = 2, job.seed = 9, job.precision = precision;
    if (tg_compile_with_config(&job, &cfg, p, err)) return -1;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 0};
    int rc = tg_trainer_open(tr, p, &o, err);
    if (rc) tg_plan_free(p);
    return rc;
}

/* A bf16 run with embeddings and layer 0 frozen, saved after a step: the checkpoint holds
 * every parameter under its HF name, the frozen ones with the fp32 values they started
 * from, and no non-persistent buffer; it loads back into an unfrozen plan. */
TG_TEST(test_freeze_checkpoint_loads_unfrozen) {
    tg_plan p, q;
    tg_trainer tr, tr2;
    tg_err err;
    REQUIRE(open_tiny_bert("tiny-bert", "bert.embeddings.*, bert.encoder.layer.0.*", TG_PREC_BF16, &p, &tr, &err) == 0,
            "%s", err.msg);
    uint64_t rng = 77;
    tg_test_fill_random_inputs(&tr, &p, &rng);
    tg_step_stats st;
    REQUIRE(tg_trainer_run_step(&tr, &st, &err) == 0, "%s", err.msg);
    const char *dir = tiny_bert_folder();
    REQUIRE(dir, "cannot make the model folder");
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(tg_trainer_save(&tr, path, &err) == 0, "%s", err.msg);

    tg_safetensors sf;
    REQUIRE(tg_st_open(path, &sf, &err) == 0, "%s", err.msg);
    int params = count_class(&p, TG_CLASS_TRAINABLE) + count_class(&p, TG_CLASS_FROZEN);
    CHECK(sf.n == params && tg_st_find(&sf, "bert.embeddings.word_embeddings.weight") &&
              tg_st_find(&sf, "bert.encoder.layer.0.attention.self.query.weight") &&
              !tg_st_find(&sf, "bert.embeddings.position_ids") && !tg_st_find(&sf, "bert.embeddings.token_type_ids"),
          "the checkpoint holds %d tensors for %d parameters", sf.n, params);
    tg_st_close(&sf);

    REQUIRE(open_tiny_bert(dir, "", TG_PREC_FP32, &q, &tr2, &err) == 0, "%s", err.msg);
    CHECK(tr2.weights.loaded == params && tr2.weights.trainable == params && tr2.weights.frozen == 0 &&
              tr2.weights.missing == 0 && tr2.weights.ignored == 0,
          "loaded %d (trainable %d), missing %d, ignored %d", tr2.weights.loaded, tr2.weights.trainable,
          tr2.weights.missing, tr2.weights.ignored);
    float *now = malloc(q.pool_bytes[TG_POOL_PARAMS]);
    REQUIRE(now && tg_trainer_read(&tr2, q.io.params_all, now, &err) == 0, "%s", err.msg);
    int same = 0, frozen = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) != TG_CLASS_FROZEN) continue;
        frozen++;
        int u = tg_test_tensor_named(&q, x->name);
        same += u >= 0 && !memcmp(tg_weights_value(&tr.values, t), (char *)now + q.tensors[u].offset, q.tensors[u].bytes);
    }
    CHECK(frozen == 21 && same == frozen, "%d of %d frozen parameters load back with their fp32 values", same, frozen);
    free(now);
    tg_trainer_close(&tr2);
    tg_plan_free(&q);
    tg_trainer_close(&tr);
    tg_plan_free(&p);
}

/* Writes a safetensors file by hand: the int64 position_ids HF checkpoints hold (values
 * `ids`, 64 of them), beside a zero word-embedding table when with_table. */
static int write_position_ids_checkpoint(const char *path, const int64_t *ids, int with_table) {
    static const char ids_entry[] =
        "\"bert.embeddings.position_ids\":{\"dtype\":\"I64\",\"shape\":[1,64],\"data_offsets\":[0,512]}";
    static const char table_entry[] =
        "\"bert.embeddings.word_embeddings.weight\":{\"dtype\":\"F32\",\"shape\":[128,32],\"data_offsets\":[512,16896]}";
    char header[512];
    snprintf(header, sizeof header, "{%s%s%s}", ids_entry, with_table ? "," : "", with_table ? table_entry : "");
    const size_t n = strlen(header), hlen = (n + 7) / 8 * 8; /* padded with spaces to 8 bytes */
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(len, 1, 8, f) == 8 && fwrite(header, 1, n, f) == n;
    for (size_t i = n; i < hlen && ok; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fwrite(ids, 8, 64, f) == 64;
    static const float table[128 * 32];
    if (with_table) ok = ok && fwrite(table, 4, 128 * 32, f) == 128 * 32;
    return fclose(f) == 0 && ok ? 0 : -1;
}

TG_TEST(test_buffers_int64_position_ids) {
    const char *dir = tiny_bert_folder();
    REQUIRE(dir, "cannot make the model folder");
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int64_t ids[64];
    for (int i = 0; i < 64; i++) ids[i] = 63 - i;
    REQUIRE(write_position_ids_checkpoint(path, ids, 1) == 0, "cannot write %s", path);
    tg_plan p;
    tg_trainer tr;
    tg_err err;
    /* Non-persistent, as in transformers: recognised, ignored, the buffer keeps its arange. */
    REQUIRE(open_tiny_bert(dir, "", TG_PREC_FP32, &p, &tr, &err) == 0, "%s", err.msg);
    CHECK(tr.weights.ignored == 1 && tr.weights.loaded == 1 && tr.weights.buffers == 0,
          "ignored %d, loaded %d, buffers %d", tr.weights.ignored, tr.weights.loaded, tr.weights.buffers);
    int pos = tg_test_tensor_named(&p, "bert.embeddings.position_ids");
    REQUIRE(pos >= 0 && p.tensors[pos].pool == TG_POOL_BUFFERS && p.tensors[pos].dtype == TG_I32, "no position_ids buffer");
    int32_t got[64];
    REQUIRE(tg_trainer_read(&tr, pos, got, &err) == 0, "%s", err.msg);
    CHECK(got[0] == 0 && got[63] == 63, "position_ids hold %d .. %d", got[0], got[63]);
    tg_trainer_close(&tr);

    /* A persistent int32 buffer takes the checkpoint's int64 values, range-checked. */
    p.tensors[pos].flags |= TG_TENSOR_PERSISTENT;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    CHECK(tr.weights.buffers == 1 && tr.weights.ignored == 0, "buffers %d, ignored %d", tr.weights.buffers,
          tr.weights.ignored);
    REQUIRE(tg_trainer_read(&tr, pos, got, &err) == 0, "%s", err.msg);
    CHECK(got[0] == 63 && got[63] == 0, "position_ids hold %d .. %d", got[0], got[63]);
    tg_trainer_close(&tr);
    ids[5] = (int64_t)1 << 40;
    REQUIRE(write_position_ids_checkpoint(path, ids, 1) == 0, "cannot write %s", path);
    CHECK(tg_trainer_open(&tr, &p, &o, &err) != 0 && strstr(err.msg, "position_ids") && strstr(err.msg, "int32"),
          "message: %s", err.msg);

    /* A file with a buffer and no parameter is no checkpoint of this model. */
    ids[5] = 58;
    REQUIRE(write_position_ids_checkpoint(path, ids, 0) == 0, "cannot write %s", path);
    const int rc = tg_trainer_open(&tr, &p, &o, &err);
    if (rc == 0) tg_trainer_close(&tr);
    CHECK(rc != 0 && strstr(err.msg, "holds none of the model's"), "a checkpoint of one buffer was accepted (%s)",
          rc ? err.msg : "opened");
    tg_plan_free(&p);
}

/* inspect counts the classes and flags the tensors of each. */
TG_TEST(test_freeze_inspect) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text(TINY_BERT "freeze = bert.embeddings.*, bert.encoder.layer.0.*\n", &p, &err) == 0, "%s",
            err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    int rc = tg_plan_inspect(&p, f, 0, &err);
    fclose(f);
    REQUIRE(rc == 0 && text, "%s", err.msg);
    char line[160];
    snprintf(line, sizeof line, "parameters: trainable 20 (%llu bytes), frozen 21 (%llu bytes), buffers 2 (%llu bytes)\n",
             (unsigned long long)p.pool_bytes[TG_POOL_PARAMS], (unsigned long long)p.pool_bytes[TG_POOL_FROZEN],
             (unsigned long long)p.pool_bytes[TG_POOL_BUFFERS]);
    CHECK(strstr(text, line), "text lacks '%s'", line);
    CHECK(strstr(text, "bert.embeddings.LayerNorm.weight") && strstr(text, "  frozen\n") && strstr(text, "  buffer\n") &&
              strstr(text, "view,frozen"),
          "the flags column lacks frozen, buffer or frozen views");
    free(text);
    tg_plan_free(&p);
}

static double phase_flops(const tg_plan *p, int phase) {
    double f = 0;
    for (int o = p->phase_begin[phase]; o < p->phase_begin[phase + 1]; o++) f += tg_op_flops(&p->ops[o]);
    return f;
}

/* What freeze pruned is the backward of the same job without freeze, less the plan's: ops
 * and FLOPs, recorded in the plan, kept by the file, printed by inspect; 0 without freeze,
 * and a plan claiming a negative or non-finite amount is refused. */
TG_TEST(test_freeze_pruned_backward_measured) {
    tg_plan open, frozen;
    tg_err err;
    REQUIRE(compile_text(TINY_BERT, &open, &err) == 0, "%s", err.msg);
    REQUIRE(compile_text(TINY_BERT "freeze = bert.embeddings.*, bert.encoder.layer.0.*\n", &frozen, &err) == 0, "%s",
            err.msg);
    CHECK(open.freeze_pruned_ops == 0 && open.freeze_pruned_flops == 0, "no freeze: %d ops, %g FLOPs",
          open.freeze_pruned_ops, open.freeze_pruned_flops);
    const int ops_open = open.phase_begin[TG_PHASE_OPTIMIZER] - open.phase_begin[TG_PHASE_BACKWARD];
    const int ops_frozen = frozen.phase_begin[TG_PHASE_OPTIMIZER] - frozen.phase_begin[TG_PHASE_BACKWARD];
    const double flops = phase_flops(&open, TG_PHASE_BACKWARD) - phase_flops(&frozen, TG_PHASE_BACKWARD);
    CHECK(ops_frozen < ops_open && frozen.freeze_pruned_ops == ops_open - ops_frozen, "pruned %d ops, want %d - %d",
          frozen.freeze_pruned_ops, ops_open, ops_frozen);
    CHECK(flops > 0 && frozen.freeze_pruned_flops == flops, "pruned %.17g FLOPs, want %.17g", frozen.freeze_pruned_flops,
          flops);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    int rc = tg_plan_inspect(&frozen, f, 0, &err);
    fclose(f);
    char line[256];
    snprintf(line, sizeof line,
             "\nfreeze pruned: %d backward ops, %.6g FLOPs (%.3f GFLOP) per step, beside no gradient and no optimizer "
             "state for the 21 frozen parameters\n",
             ops_open - ops_frozen, flops, flops / 1e9);
    CHECK(rc == 0 && text && strstr(text, line), "inspect lacks '%s'", line);
    free(text);
    text = NULL;
    f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    rc = tg_plan_inspect(&open, f, 0, &err);
    fclose(f);
    CHECK(rc == 0 && text && !strstr(text, "freeze pruned"), "a plan without freeze prints a freeze line");
    free(text);

    uint8_t *payload = NULL;
    size_t n = 0;
    REQUIRE(tg_plan_payload_encode(&frozen, &payload, &n, &err) == 0, "%s", err.msg);
    tg_plan back;
    REQUIRE(tg_plan_payload_decode(payload, n, "p", TG_PLAN_CHECK_ALL, &back, &err) == 0, "%s", err.msg);
    CHECK(back.freeze_pruned_ops == frozen.freeze_pruned_ops && back.freeze_pruned_flops == frozen.freeze_pruned_flops,
          "the file kept %d ops, %g FLOPs", back.freeze_pruned_ops, back.freeze_pruned_flops);
    tg_plan_free(&back);
    free(payload);

    const double bad_flops[] = {-1.0, NAN, INFINITY};
    for (int k = 0; k < 4; k++) {
        tg_plan edited = frozen;
        if (k < 3) edited.freeze_pruned_flops = bad_flops[k];
        else edited.freeze_pruned_ops = -1;
        rc = tg_plan_validate_tables(&edited, "p", &err);
        CHECK(rc == -1 && strstr(err.msg, "p: freeze pruned ") && strstr(err.msg, "(both must be >= 0 and finite)"),
              "case %d: rc %d, '%s'", k, rc, err.msg);
    }
    tg_plan_free(&open);
    tg_plan_free(&frozen);
}

/* Each allocation of a freeze job's compile, the second compile without freeze among
 * them, failing alone: the compile fails, saying it ran out of memory, and leaks nothing
 * (make test-asan). */
TG_TEST(test_freeze_pruning_out_of_memory) {
    char path[512];
    snprintf(path, sizeof path, "%s/job.txt", tg_test_tmpdir());
    REQUIRE(tg_test_write_file(path, TINY_BERT "freeze = bert.embeddings.*\n") == 0, "cannot write %s", path);
    tg_job job;
    tg_err err;
    REQUIRE(tg_job_load(path, NULL, 0, &job, &err) == 0, "%s", err.msg);
    tg_plan p;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_compile(&job, &p, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    tg_plan_free(&p);
    int failed = 0;
    for (long k = 0; k < total; k++) {
        tg_alloc_fail_only(k);
        const int rc = tg_compile(&job, &p, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            tg_plan_free(&p);
            continue;
        }
        failed++;
        CHECK(strstr(err.msg, "out of memory"), "allocation %ld of %ld: '%s'", k, total, err.msg);
    }
    CHECK(failed > 0 && failed == total, "%d of %ld failing allocations failed the compile", failed, total);
}
