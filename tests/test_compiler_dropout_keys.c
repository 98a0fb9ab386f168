/* Dropout stream keys in compiled plans: every op that draws a mask (dropout, the residual
 * LayerNorm's, attention's; p > 0) has its own key,
 * numbered in schedule order from 0, and an op that draws nothing (p = 0) has key 0, so a
 * plan's contents (and its fingerprint-free structure) do not depend on unused counters. */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

static int64_t key_of(const tg_op *op, float *p) {
    switch (op->kind) {
    case TG_OP_DROPOUT: *p = op->p.dropout.p; return op->p.dropout.key;
    case TG_OP_RESIDUAL_LAYERNORM: *p = op->p.residual_layernorm.p; return op->p.residual_layernorm.key;
    case TG_OP_ATTN_SOFTMAX: *p = op->p.softmax.p; return op->p.softmax.key;
    case TG_OP_ATTENTION: *p = op->p.attention.p; return op->p.attention.key;
    default: return -2;
    }
}

static void check_keys(const char *what, float dropout, int fused) {
    tg_job job;
    tg_err err;
    char text[300];
    snprintf(text, sizeof text, "model = tiny-bert\nbatch = 2\nseq = 16\nsteps = 2\ntrain_data = t.jsonl\n"
                                "fuse_residual_layernorm = %s\n",
             fused ? "true" : "false");
    REQUIRE(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0, "%s", err.msg);
    tg_model_config cfg;
    REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
    cfg.hidden_dropout = cfg.embedding_dropout = cfg.attention_dropout = dropout;
    tg_plan plan;
    REQUIRE(tg_compile_with_config(&job, &cfg, &plan, &err) == 0, "%s", err.msg);
    int64_t next = 0;
    int zero_p = 0, drawing = 0;
    for (int o = 0; o < plan.n_ops && plan.ops[o].phase == TG_PHASE_FORWARD; o++) {
        float p = 0;
        const int64_t key = key_of(&plan.ops[o], &p);
        if (key == -2) continue;
        if (p > 0) {
            CHECK(key == next, "%s: op %d (%s) draws with key %lld, want %lld", what, o, tg_op_name(plan.ops[o].kind),
                  (long long)key, (long long)next);
            next = key + 1, drawing++;
        } else {
            CHECK(key == 0, "%s: op %d (%s) with p = 0 has key %lld", what, o, tg_op_name(plan.ops[o].kind),
                  (long long)key);
            zero_p++;
        }
    }
    CHECK(dropout > 0 ? drawing > 0 : zero_p > 0, "%s: %d ops drawing, %d with p = 0", what, drawing, zero_p);
    tg_plan_free(&plan);
}

TG_TEST(test_compiler_dropout_keys) {
    check_keys("no hidden dropout, fused residual LayerNorm", 0.0f, 1);
    check_keys("no hidden dropout, separate ops", 0.0f, 0);
    check_keys("hidden dropout 0.1, fused", 0.1f, 1);
}
