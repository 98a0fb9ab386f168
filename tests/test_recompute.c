/* Recomputation (compiler/recompute.h, job key recompute) and the late gradient clears
 * (compiler/grad_writes.h): what BERT-base's plan holds and saves, and training unchanged
 * bit for bit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "base/version.h"
#include "compiler/fingerprint.h"
#include "compiler/graph.h"
#include "compiler/grad_state.h"
#include "compiler/job.h"
#include "compiler/recompute.h"
#include "models/model_config.h"
#include "plan/memory_estimate.h"
#include "plan/validate.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

static int compile_bert_base(int recompute, tg_plan *p) {
    tg_err err;
    return CHECK(tg_test_compile_bert_base_b32(1, recompute, 0, p, &err) == 0, "%s", err.msg);
}

static int ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* recompute = gelu on BERT-base B32 T128: each layer's GELU backward also writes the GELU
 * output again (out2), and the weight-gradient product that reads the copy runs right
 * after it; no backward op reads a forward GELU output, which dies in its layer's forward;
 * no separate GELU op in the backward; the plan checks pass and the planned peak falls by
 * most of the 12 x 24 MiB the outputs took. */
TG_TEST(test_recompute_gelu_bert_base) {
    tg_plan none, gelu;
    if (!compile_bert_base(TG_RECOMPUTE_NONE, &none)) return;
    if (!compile_bert_base(TG_RECOMPUTE_GELU, &gelu)) {
        tg_plan_free(&none);
        return;
    }
    const int b0 = gelu.phase_begin[TG_PHASE_BACKWARD], b1 = gelu.phase_begin[TG_PHASE_OPTIMIZER];
    int copies = 0;
    for (int o = b0; o < b1; o++) {
        const tg_op *op = &gelu.ops[o];
        CHECK(op->kind != TG_OP_GELU, "op %d: a separate GELU in the backward", o);
        if (op->kind != TG_OP_GELU_BWD) continue;
        if (!CHECK(op->out[2] >= 0, "op %d: a GELU backward without the copy", o)) continue;
        copies++;
        const tg_tensor *out = &gelu.tensors[op->out[2]];
        CHECK(ends_with(out->name, ".intermediate.gelu.recomputed") && out->last_use == o + 1 &&
                  gelu.ops[o + 1].kind == TG_OP_MATMUL &&
                  (gelu.ops[o + 1].in[0] == op->out[2] || gelu.ops[o + 1].in[1] == op->out[2]),
              "op %d: %s read next by %s (last use %d)", o, out->name, tg_op_name(gelu.ops[o + 1].kind), out->last_use);
    }
    CHECK(copies == 12, "%d GELU copies in the backward", copies);
    for (int t = 0; t < gelu.n_tensors; t++)
        if (!strncmp(gelu.tensors[t].name, "bert.", 5) && ends_with(gelu.tensors[t].name, ".intermediate.gelu"))
            CHECK(gelu.tensors[t].last_use < b0, "%s lives to op %d", gelu.tensors[t].name, gelu.tensors[t].last_use);
    CHECK(gelu.n_ops == none.n_ops, "%d ops against %d", gelu.n_ops, none.n_ops);
    const double saved = ((double)none.peak_bytes - (double)gelu.peak_bytes) / 1048576.0;
    printf("    planned peak %.1f -> %.1f MiB (recompute = gelu), %.2f -> %.2f GFLOP a step\n",
           none.peak_bytes / 1048576.0, gelu.peak_bytes / 1048576.0, none.flops_per_step / 1e9, gelu.flops_per_step / 1e9);
    CHECK(saved > 200, "recompute = gelu saves %.1f MiB", saved);
    tg_err err;
    CHECK(tg_plan_validate_ops(&gelu, "gelu", &err) == 0, "%s", err.msg);
    tg_plan_free(&none);
    tg_plan_free(&gelu);
}

/* Each gradient clear runs right before the first op that touches its span, after the
 * backward's start where the gradients' holds would otherwise begin: BERT-base's embedding
 * tables (cleared for their scatter) in the backward's last part. */
TG_TEST(test_gradient_clears_placed_late) {
    tg_plan p;
    if (!compile_bert_base(TG_RECOMPUTE_NONE, &p)) return;
    const int b0 = p.phase_begin[TG_PHASE_BACKWARD], b1 = p.phase_begin[TG_PHASE_OPTIMIZER];
    int zeros = 0;
    for (int z = 0; z < p.n_ops; z++) {
        if (p.ops[z].kind != TG_OP_ZERO || p.tensors[p.ops[z].out[0]].pool != TG_POOL_GRADS) continue;
        zeros++;
        const tg_tensor *span = &p.tensors[p.ops[z].out[0]];
        CHECK(z >= b0 && z < b1, "a gradient clear at op %d, outside the backward [%d, %d)", z, b0, b1);
        CHECK(z > b0 + (b1 - b0) * 3 / 4, "the embeddings' clear at op %d of the backward [%d, %d)", z, b0, b1);
        for (int o = b0; o < z; o++)
            for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
                const int t = s < TG_OP_MAX_IN ? p.ops[o].in[s] : p.ops[o].out[s - TG_OP_MAX_IN];
                if (t < 0 || p.tensors[t].pool != TG_POOL_GRADS) continue;
                const tg_tensor *x = &p.tensors[t];
                CHECK(!(x->offset < span->offset + span->bytes && span->offset < x->offset + x->bytes),
                      "op %d touches %s before its clear at op %d", o, x->name, z);
            }
    }
    CHECK(zeros == 1, "%d gradient clears", zeros);
    tg_plan_free(&p);
}

/* The CPU reference trains the same, bit for bit, with the GELU outputs kept or made
 * again: BERT's separate GELU (fp32, bf16; the copy from its GELU backward, and with the
 * bias gradients apart, fuse_bias_grad = false), and GPT-2's GELU epilogue (fp32, where
 * the pre-activation it keeps is the product itself; the copy from a GELU op). */
TG_TEST(test_recompute_gelu_trains_the_same) {
    const struct {
        const char *job, *precision;
    } cases[] = {{"examples/demo-classify.job", "precision=fp32"},
                 {"examples/demo-classify.job", "precision=bf16"},
                 {"examples/demo-classify.job", "fuse_bias_grad=false"},
                 {"examples/demo-lm.job", "precision=fp32"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        const char *kept[] = {cases[c].precision, "recompute=none"}, *again[] = {cases[c].precision, "recompute=gelu"};
        if (tg_test_train_cpu(cases[c].job, kept, 2, 6, &a, &na, NULL) &&
            tg_test_train_cpu(cases[c].job, again, 2, 6, &b, &nb, NULL))
            CHECK(na == nb && memcmp(a, b, na) == 0, "%s %s: parameters differ after 6 steps", cases[c].job,
                  cases[c].precision);
        free(a), free(b);
    }
    tg_job job;
    tg_err err;
    const char *bad[] = {"recompute=everything"};
    CHECK(tg_job_load("examples/demo-classify.job", bad, 1, &job, &err) == -1 && strstr(err.msg, "recompute") &&
              strstr(err.msg, "gelu"),
          "%s", err.msg);
}

/* The plan's estimate on one GPU, as memory_limit counts it. */
static uint64_t gpu_need(const tg_plan *p) {
    tg_memory_estimate est;
    tg_estimate_memory(p, TG_MEM_DEVICE_CUDA, &est);
    return est.total;
}

static int compile_limited(int recompute, uint64_t limit, tg_plan *p, tg_err *err) {
    return tg_test_compile_bert_base_b32(1, recompute, limit, p, err);
}

/* memory_limit and recompute = auto (the default): no limit, nothing recomputed; a limit
 * the plan passes without recomputing but not with, the GELU outputs made again (and the
 * plan's fingerprint still the job's); a limit gelu does not meet, layers recomputed; one
 * nothing meets, refused with both numbers (and, with recompute = none, what gelu and
 * layers would need). */
TG_TEST(test_recompute_auto_memory_limit) {
    tg_plan none, gelu, p;
    tg_err err;
    REQUIRE(compile_limited(TG_RECOMPUTE_NONE, 0, &none, &err) == 0, "%s", err.msg);
    REQUIRE(compile_limited(TG_RECOMPUTE_GELU, 0, &gelu, &err) == 0, "%s", err.msg);
    const uint64_t high = gpu_need(&none), low = gpu_need(&gelu);
    CHECK(low < high, "recompute = gelu needs %llu bytes, none %llu", (unsigned long long)low, (unsigned long long)high);
    if (CHECK(compile_limited(TG_RECOMPUTE_AUTO, 0, &p, &err) == 0, "%s", err.msg)) {
        CHECK(p.n_ops == none.n_ops && p.peak_bytes == none.peak_bytes, "auto without a limit recomputed");
        tg_plan_free(&p);
    }
    if (CHECK(compile_limited(TG_RECOMPUTE_AUTO, high, &p, &err) == 0, "%s", err.msg)) {
        CHECK(p.peak_bytes == none.peak_bytes, "auto under a limit it meets recomputed");
        tg_plan_free(&p);
    }
    if (CHECK(compile_limited(TG_RECOMPUTE_AUTO, (low + high) / 2, &p, &err) == 0, "%s", err.msg)) {
        CHECK(p.peak_bytes == gelu.peak_bytes && p.n_tensors == gelu.n_tensors, "auto did not recompute for the limit");
        /* The fingerprint is the job's as written (recompute = auto and the limit). */
        tg_model_config cfg;
        tg_job job;
        REQUIRE(tg_model_config_load("bert-base-uncased", &cfg, &err) == 0, "%s", err.msg);
        tg_job_defaults(&job);
        snprintf(job.model, sizeof job.model, "bert-base-uncased");
        job.task = TG_TASK_CLASSIFY, job.precision = TG_PREC_BF16, job.batch = 32, job.seq = 128, job.steps = 1;
        job.recompute = TG_RECOMPUTE_AUTO, job.memory_limit = (low + high) / 2;
        CHECK(p.fingerprint == tg_job_fingerprint(&cfg, &job, TG_VERSION_STRING),
              "the fingerprint is not the job's as written");
        tg_plan_free(&p);
    }
    /* Below gelu's need: layers (compiler/recompute.h; tests/test_recompute_layers.c), and
     * below every layer's, refused. */
    if (CHECK(compile_limited(TG_RECOMPUTE_AUTO, low - 1, &p, &err) == 0, "%s", err.msg)) {
        CHECK(gpu_need(&p) <= low - 1 && p.peak_bytes_without_recompute == none.peak_bytes,
              "auto below gelu's need: %llu bytes", (unsigned long long)gpu_need(&p));
        tg_plan_free(&p);
    }
    CHECK(compile_limited(TG_RECOMPUTE_AUTO, 1ull << 20, &p, &err) == -1 && strstr(err.msg, "key 'memory_limit'") &&
              strstr(err.msg, "more than the limit of") && strstr(err.msg, "CUDA context") &&
              strstr(err.msg, "with every layer recomputed"),
          "%s", err.msg);
    CHECK(compile_limited(TG_RECOMPUTE_NONE, (low + high) / 2, &p, &err) == -1 &&
              strstr(err.msg, "recompute = gelu would need") && strstr(err.msg, "recompute = layers"),
          "%s", err.msg);
    tg_plan_free(&none);
    tg_plan_free(&gelu);
}

/* memory_limit's sizes: binary units, a space allowed, decimals; nothing below a byte, no
 * sign, no other unit. */
TG_TEST(test_memory_limit_job_key) {
    const struct {
        const char *value;
        unsigned long long bytes; /* 0: refused */
        const char *message;
    } cases[] = {
        {"3GiB", 3ull << 30, NULL},     {"2.5 GiB", 5ull << 29, NULL},     {"1024", 1024, NULL},
        {"512 B", 512, NULL},           {"1.5KiB", 1536, NULL},            {"1TiB", 1ull << 40, NULL},
        {"0", 0, "out of range"},       {"-1GiB", 0, "is not a size"},     {"3 PiB", 0, "has no unit"},
        {"GiB", 0, "is not a size"},    {"2000TiB", 0, "out of range"},    {"3GB", 0, "has no unit"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char set[64];
        snprintf(set, sizeof set, "memory_limit=%s", cases[k].value);
        const char *sets[] = {set};
        tg_job job;
        tg_err err = {{0}};
        const int rc = tg_job_load("examples/demo-classify.job", sets, 1, &job, &err);
        if (cases[k].bytes)
            CHECK(rc == 0 && job.memory_limit == cases[k].bytes, "%s: rc %d, %llu bytes (%s)", cases[k].value, rc,
                  (unsigned long long)job.memory_limit, err.msg);
        else
            CHECK(rc == -1 && strstr(err.msg, "key 'memory_limit'") && strstr(err.msg, cases[k].message), "%s: %s",
                  cases[k].value, err.msg);
    }
}

/* A hand-built step for recompute.c's forms: forward GELU(h) -> g, and a backward of one
 * GELU_BWD(dg, h) -> dh and readers of g (ADDs), in the order `form` gives:
 *   0: the GELU backward, then the reader (the copy as its out2, nothing moves);
 *   1: the reader, then the GELU backward (the copy as its out2, the reader moved after it);
 *   2: the reader, a second reader, then the GELU backward (the second reader would read
 *      the copy before it is made: a GELU op before the first reader instead).
 * Indices into *t: h, g, dy, dg, dh, r1, r2. Returns tg_recompute's result. */
static int recompute_rig(tg_graph *g, tg_model_config *cfg, tg_job *job, tg_err *err, const char *g_name, int form,
                         int *t) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->source, sizeof cfg->source, "hand-built");
    tg_job_defaults(job);
    job->recompute = TG_RECOMPUTE_GELU;
    tg_graph_init(g, cfg, job, err);
    const char *names[7] = {"h", g_name, "dy", "dg", "dh", "r1", "r2"};
    for (int k = 0; k < 7; k++) t[k] = tg_act(g, names[k], 1, 4, 0, 0, 0);
    tg_op_spec gelu = tg_spec(TG_OP_GELU);
    gelu.in[0] = t[0], gelu.out[0] = t[1], gelu.p.gelu.n = 4, gelu.p.gelu.form = TG_GELU_ERF;
    tg_graph_op(g, &gelu);
    g->phase = TG_PHASE_BACKWARD;
    tg_op_spec bwd = tg_spec(TG_OP_GELU_BWD);
    bwd.in[0] = t[3], bwd.in[1] = t[0], bwd.out[0] = t[4], bwd.p.gelu_bwd.n = 4, bwd.p.gelu_bwd.form = TG_GELU_ERF;
    tg_op_spec r1 = tg_spec(TG_OP_ADD), r2 = tg_spec(TG_OP_ADD);
    r1.in[0] = t[1], r1.in[1] = t[2], r1.out[0] = t[5], r1.p.count.n = 4;
    r2.in[0] = t[1], r2.in[1] = t[3], r2.out[0] = t[6], r2.p.count.n = 4;
    if (form == 0) tg_graph_op(g, &bwd), tg_graph_op(g, &r1);
    if (form >= 1) tg_graph_op(g, &r1);
    if (form == 2) tg_graph_op(g, &r2);
    if (form >= 1) tg_graph_op(g, &bwd);
    if (!CHECK(!g->failed, "rig: %s", err->msg)) return -2;
    return tg_recompute(g);
}

TG_TEST(test_recompute_hand_built_forms) {
    tg_model_config cfg;
    tg_job job;
    tg_err err = {{0}};
    tg_graph g;
    int t[7];
    /* 0: the GELU backward already runs first: it writes the copy, the reader reads it. */
    REQUIRE(recompute_rig(&g, &cfg, &job, &err, "g", 0, t) == 0, "%s", err.msg);
    CHECK(g.n_ops == 3 && g.ops[1].kind == TG_OP_GELU_BWD && g.ops[1].out[2] >= 0 && g.ops[2].kind == TG_OP_ADD &&
              g.ops[2].in[0] == g.ops[1].out[2] && !strcmp(g.tensors[g.ops[1].out[2]].name, "g.recomputed"),
          "form 0: %d ops", g.n_ops);
    tg_graph_free(&g);
    /* 1: the reader moves to right after the GELU backward. */
    REQUIRE(recompute_rig(&g, &cfg, &job, &err, "g", 1, t) == 0, "%s", err.msg);
    CHECK(g.n_ops == 3 && g.ops[1].kind == TG_OP_GELU_BWD && g.ops[1].out[2] >= 0 && g.ops[2].kind == TG_OP_ADD &&
              g.ops[2].out[0] == t[5] && g.ops[2].in[0] == g.ops[1].out[2],
          "form 1: op 1 %s, op 2 %s", tg_op_name(g.ops[1].kind), tg_op_name(g.ops[2].kind));
    tg_graph_free(&g);
    /* 2: a second reader in between: a GELU op before the first reader, both read its copy,
     * the GELU backward writes none. */
    REQUIRE(recompute_rig(&g, &cfg, &job, &err, "g", 2, t) == 0, "%s", err.msg);
    CHECK(g.n_ops == 5 && g.ops[1].kind == TG_OP_GELU && g.ops[1].in[0] == t[0] && g.ops[2].out[0] == t[5] &&
              g.ops[3].out[0] == t[6] && g.ops[2].in[0] == g.ops[1].out[0] && g.ops[3].in[0] == g.ops[1].out[0] &&
              g.ops[4].kind == TG_OP_GELU_BWD && g.ops[4].out[2] < 0,
          "form 2: %d ops, op 1 %s, op 4 %s", g.n_ops, tg_op_name(g.ops[1].kind), tg_op_name(g.ops[4].kind));
    tg_graph_free(&g);
    /* A name with no room for ".recomputed": a clear compiler error. */
    char longest[TG_NAME_MAX];
    memset(longest, 'g', sizeof longest - 1);
    longest[sizeof longest - 1] = 0;
    CHECK(recompute_rig(&g, &cfg, &job, &err, longest, 1, t) == -1 && strstr(err.msg, "too long to name its recomputed copy"),
          "'%s'", err.msg);
    tg_graph_free(&g);
}
