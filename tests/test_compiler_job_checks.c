/* The compiler's checks of a job against its model (compiler/compile.c), table-driven with
 * the messages naming the key; every allocation of a bf16 compile with frozen parameters
 * and length buckets failed in turn (compiler/compile.c, precision.c); a model without
 * dropout (compiler/model_build.c). */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

static int job_of(const char *text, tg_job *job) {
    tg_err err = {{0}};
    return CHECK(tg_job_parse_text(text, "j.job", "", NULL, 0, job, &err) == 0, "job: %s", err.msg);
}

TG_TEST(test_compile_job_checks_table) {
    static const struct {
        const char *text;
        int num_labels; /* set past the job parser, which refuses below 2 */
        const char *want;
    } cases[] = {
        {"model = tiny-bert\ntask = lm\n", 0, "j.job:2: key 'task': task lm needs a decoder (gpt2 or llama family); model "
                                              "'tiny-bert' is bert"},
        {"model = tiny-bert\n", 1, "j.job (default): key 'num_labels': classify needs num_labels >= 2 (got 1)"},
        {"model = tiny-bert\nzero_stage = 1\nseq = 16\n", 0,
         "j.job:2: key 'zero_stage': zero_stage 1 shards the optimizer state over data-parallel replicas; it needs "
         "data_parallel >= 2 (got 1)"},
        {"model = tiny-bert\nseq = 100000\n", 0, "j.job:2: key 'seq': seq 100000 exceeds what model 'tiny-bert' can hold"},
        {"model = tiny-bert\nseq_buckets = 8, 100000\n", 0,
         "j.job:2: key 'seq_buckets': bucket length 100000 exceeds what model 'tiny-bert' can hold"},
        {"model = no-such-model\n", 0, "j.job:1: key 'model': "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512];
        snprintf(text, sizeof text, "%strain_data = t.jsonl\nsteps = 1\n", cases[i].text);
        tg_job job;
        if (!job_of(text, &job)) continue;
        if (cases[i].num_labels) job.num_labels = cases[i].num_labels;
        tg_plan plan;
        tg_err err = {{0}};
        int rc = tg_compile(&job, &plan, &err);
        CHECK(rc == -1 && strstr(err.msg, cases[i].want) == err.msg, "case %zu: '%s', want '%s'", i, err.msg,
              cases[i].want);
        if (rc == 0) tg_plan_free(&plan);
    }
}

TG_TEST(test_compile_bf16_buckets_allocation_failures) {
    const char *texts[] = {
        "model = tiny-bert\ntrain_data = t.jsonl\nsteps = 1\nbatch = 2\nprecision = bf16\n"
        "freeze = bert.embeddings.*\nseq_buckets = 8, 16\n",
        "model = tiny-gpt2\ntask = lm\ntrain_data = t.jsonl\nsteps = 1\nbatch = 2\nseq = 16\nprecision = bf16\n",
    };
    for (int t = 0; t < 2; t++) {
        tg_job job;
        if (!job_of(texts[t], &job)) return;
        tg_plan plan;
        tg_err err = {{0}};
        tg_alloc_fail_after(-1);
        REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
        const long total = tg_alloc_fail_after(-1);
        const int n_buckets = plan.train.n_buckets, n_tensors = plan.n_tensors;
        tg_plan_free(&plan);
        CHECK(n_buckets == (t == 0 ? 2 : 1) && total > 100, "job %d: %d buckets, %ld allocations", t, n_buckets,
              total);
        long clean = 0;
        for (long k = 0; k < total; k++) {
            tg_alloc_fail_after(k);
            int rc = tg_compile(&job, &plan, &err);
            tg_alloc_fail_after(-1);
            if (!CHECK(rc == -1, "job %d: allocation %ld of %ld failed, yet it compiled", t, k, total)) {
                tg_plan_free(&plan);
                break;
            }
            clean += CHECK(strstr(err.msg, "out of memory") != NULL, "job %d: allocation %ld: '%s'", t, k, err.msg);
        }
        CHECK(clean == total, "job %d: %ld of %ld failures reported running out of memory", t, clean, total);
        REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
        CHECK(plan.n_tensors == n_tensors, "the same plan after the failures");
        tg_plan_free(&plan);
    }
}

TG_TEST(test_compile_without_dropout) {
    /* A config with every dropout 0 builds no DROPOUT op: the fused residual LayerNorm
     * takes p 0 and no step, attention keeps no mask bits; unfused, the residual is a
     * plain ADD of the block's output. */
    tg_model_config cfg;
    tg_err err = {{0}};
    memset(&cfg, 0, sizeof cfg);
    REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
    cfg.hidden_dropout = cfg.attention_dropout = cfg.embedding_dropout = cfg.classifier_dropout = 0;
    for (int fused = 1; fused >= 0; fused--) {
        tg_job job;
        if (!job_of("model = tiny-bert\ntrain_data = t.jsonl\nsteps = 1\nbatch = 2\nseq = 16\n", &job)) return;
        job.fuse_residual_layernorm = fused;
        tg_plan plan;
        REQUIRE(tg_compile_with_config(&job, &cfg, &plan, &err) == 0, "%s", err.msg);
        int dropouts = 0, residual_ln = 0, masked_ln = 0, attention = 0, kept_bits = 0;
        for (int o = 0; o < plan.n_ops; o++) {
            const tg_op *op = &plan.ops[o];
            dropouts += op->kind == TG_OP_DROPOUT;
            if (op->kind == TG_OP_RESIDUAL_LAYERNORM) {
                residual_ln++;
                masked_ln += op->p.residual_layernorm.p != 0 || op->in[4] >= 0;
            }
            if (op->kind == TG_OP_ATTENTION) {
                attention++;
                kept_bits += op->out[2] >= 0 || op->p.attention.p != 0;
            }
        }
        CHECK(dropouts == 0 && masked_ln == 0 && kept_bits == 0, "fused %d: %d dropouts, %d masked LNs, %d kept bits",
              fused, dropouts, masked_ln, kept_bits);
        CHECK(residual_ln == (fused ? 2 * cfg.layers : 0) && attention == cfg.layers, "fused %d: %d residual LNs, %d "
              "attention ops", fused, residual_ln, attention);
        tg_plan_free(&plan);
    }
}
