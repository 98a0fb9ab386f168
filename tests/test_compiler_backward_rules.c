/* Backward rules (compiler/backward_rules.c) on hand-built graphs: the refusals with the
 * op or tensor they name (a parameter added, embedded, normalised, softmaxed or merged
 * directly; a bias, gamma or table that is no parameter; a split part without a gradient),
 * the dA product of a matmul whose A is stored transposed, the bias gradient's fusion, and
 * the rule table's bounds. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/autodiff.h"
#include "compiler/backward_rules.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "models/model_config.h"
#include "tests/harness.h"

typedef struct hand_graph {
    tg_model_config cfg;
    tg_job job;
    tg_graph g;
    tg_err err;
} hand_graph;

static int hand_init(hand_graph *h) {
    memset(h, 0, sizeof *h);
    if (!CHECK(tg_model_config_load("tiny-gpt2", &h->cfg, &h->err) == 0, "%s", h->err.msg)) return 0;
    tg_job_defaults(&h->job);
    tg_graph_init(&h->g, &h->cfg, &h->job, &h->err);
    return 1;
}

static int matmul(tg_graph *g, int a, int b, int bias, int out, int64_t m, int64_t n, int64_t k, int trans_a) {
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = a, s.in[1] = b, s.in[2] = bias, s.out[0] = out;
    s.p.matmul = (tg_matmul_params){.m = m, .n = n, .k = k, .batch = 1, .trans_a = trans_a, .alpha = 1.0f};
    return tg_graph_op(g, &s);
}

static int add(tg_graph *g, int a, int b, int out, int64_t n) {
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = a, s.in[1] = b, s.out[0] = out, s.p.count.n = n;
    return tg_graph_op(g, &s);
}

/* Cross-entropy over logits [n, c]; returns the loss tensor. */
static int loss_of(tg_graph *g, int logits, int64_t n, int64_t c) {
    int64_t ls[1] = {n};
    int labels = tg_graph_tensor(g, "labels", TG_I32, TG_POOL_INPUTS, 1, ls);
    g->io.labels = labels;
    int loss = tg_act(g, "loss", 1, 1, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_CROSS_ENTROPY);
    s.in[0] = logits, s.in[1] = labels, s.out[0] = loss, s.p.cross_entropy.n = n, s.p.cross_entropy.c = c;
    tg_graph_op(g, &s);
    return loss;
}

TG_TEST(test_backward_rules_refusals) {
    const int64_t N = 4, D = 8, C = 5;
    /* A parameter added to an activation directly. */
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {N, C};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int w = tg_param(&h.g, "w.direct", 2, N, C, TG_INIT_NORMAL, 0);
    int logits = tg_act(&h.g, "logits", 2, N, C, 0, 0);
    add(&h.g, w, x, logits, N * C);
    int loss = loss_of(&h.g, logits, N, C);
    REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0, "%s", h.err.msg);
    CHECK(tg_autodiff(&h.g, loss) != 0 && !strcmp(h.err.msg, "internal compiler error: add of parameter w.direct directly is not supported"),
          "add: %s", h.err.msg);
    tg_graph_free(&h.g);

    /* A matmul bias made by other ops from parameters: its gradient has no parameter to
     * accumulate into. */
    if (!hand_init(&h)) return;
    int64_t xd[2] = {N, D};
    x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xd);
    int w1 = tg_param(&h.g, "w1", 2, D, C, TG_INIT_NORMAL, 0);
    int p1 = tg_param(&h.g, "p1", 1, C, 0, TG_INIT_ZEROS, 1), p2 = tg_param(&h.g, "p2", 1, C, 0, TG_INIT_ZEROS, 1);
    int bias = tg_act(&h.g, "made.bias", 1, C, 0, 0, 0);
    add(&h.g, p1, p2, bias, C);
    logits = tg_act(&h.g, "logits", 2, N, C, 0, 0);
    matmul(&h.g, x, w1, bias, logits, N, C, D, 0);
    loss = loss_of(&h.g, logits, N, C);
    REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0, "%s", h.err.msg);
    CHECK(tg_autodiff(&h.g, loss) != 0 && !strcmp(h.err.msg, "internal compiler error: matmul bias made.bias is not a parameter"), "bias: %s",
          h.err.msg);
    tg_graph_free(&h.g);
}

TG_TEST(test_backward_rules_pointwise_and_layernorm_refusals) {
    const int64_t N = 4, C = 5;
    /* GELU and tanh straight on a parameter. */
    for (int kind = 0; kind < 2; kind++) {
        hand_graph h;
        if (!hand_init(&h)) return;
        int w = tg_param(&h.g, "w", 2, N, C, TG_INIT_NORMAL, 0);
        int logits = tg_act(&h.g, "logits", 2, N, C, 0, 0);
        tg_op_spec s = tg_spec(kind ? TG_OP_TANH : TG_OP_GELU);
        s.in[0] = w, s.out[0] = logits;
        if (kind) s.p.count.n = N * C;
        else s.p.gelu.n = N * C, s.p.gelu.form = TG_GELU_TANH;
        tg_graph_op(&h.g, &s);
        int loss = loss_of(&h.g, logits, N, C);
        REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0, "%s", h.err.msg);
        const char *want = kind ? "internal compiler error: tanh of a parameter is not supported"
                                : "internal compiler error: gelu of a parameter is not supported";
        CHECK(tg_autodiff(&h.g, loss) != 0 && !strcmp(h.err.msg, want), "%s", h.err.msg);
        tg_graph_free(&h.g);
    }
    /* A LayerNorm whose gamma is an activation made from parameters. */
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {N, C};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int p1 = tg_param(&h.g, "p1", 1, C, 0, TG_INIT_ONES, 1), p2 = tg_param(&h.g, "p2", 1, C, 0, TG_INIT_ZEROS, 1);
    int beta = tg_param(&h.g, "beta", 1, C, 0, TG_INIT_ZEROS, 1);
    int gamma = tg_act(&h.g, "made.gamma", 1, C, 0, 0, 0);
    add(&h.g, p1, p2, gamma, C);
    int y = tg_act(&h.g, "y", 2, N, C, 0, 0), mean = tg_act(&h.g, "mean", 1, N, 0, 0, 0),
        rstd = tg_act(&h.g, "rstd", 1, N, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_LAYERNORM);
    s.in[0] = x, s.in[1] = gamma, s.in[2] = beta, s.out[0] = y, s.out[1] = mean, s.out[2] = rstd;
    s.p.layernorm.m = N, s.p.layernorm.d = C, s.p.layernorm.eps = 1e-5f;
    tg_graph_op(&h.g, &s);
    int loss = loss_of(&h.g, y, N, C);
    REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0, "%s", h.err.msg);
    CHECK(tg_autodiff(&h.g, loss) != 0 &&
              !strcmp(h.err.msg, "internal compiler error: layernorm 1 needs an activation input and parameter "
                                 "gamma/beta"),
          "%s", h.err.msg);
    tg_graph_free(&h.g);
}

/* Each graph's autodiff must fail with exactly `want`. */
static void expect_autodiff_fails(hand_graph *h, int loss, const char *want) {
    if (CHECK(!h->g.failed && tg_plan_param_layout(&h->g) == 0, "%s", h->err.msg))
        CHECK(tg_autodiff(&h->g, loss) != 0 && !strcmp(h->err.msg, want), "'%s', want '%s'", h->err.msg, want);
    tg_graph_free(&h->g);
}

TG_TEST(test_backward_rules_more_refusals) {
    const int64_t N = 4, D = 6, V = 10, T = 4;
    hand_graph h;
    /* An embedding table made by other ops. */
    if (!hand_init(&h)) return;
    int64_t n1[1] = {N};
    int ids = tg_graph_tensor(&h.g, "ids", TG_I32, TG_POOL_INPUTS, 1, n1);
    int p1 = tg_param(&h.g, "p1", 2, V, D, TG_INIT_NORMAL, 0), p2 = tg_param(&h.g, "p2", 2, V, D, TG_INIT_NORMAL, 0);
    int table = tg_act(&h.g, "made.table", 2, V, D, 0, 0), rows = tg_act(&h.g, "rows", 2, N, D, 0, 0);
    add(&h.g, p1, p2, table, V * D);
    tg_op_spec s = tg_spec(TG_OP_EMBEDDING);
    s.in[0] = ids, s.in[1] = table, s.out[0] = rows;
    s.p.embedding = (tg_embedding_params){.n = N, .vocab = V, .dim = D, .padding_idx = -1};
    tg_graph_op(&h.g, &s);
    expect_autodiff_fails(&h, loss_of(&h.g, rows, N, D),
                          "internal compiler error: embedding table made.table is not a parameter");

    /* Softmax straight on a parameter; softmax whose probabilities and dropped
     * probabilities both have gradients. */
    for (int both = 0; both < 2; both++) {
        if (!hand_init(&h)) return;
        int scores;
        if (both) {
            int64_t xs[2] = {T, D};
            int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
            int w = tg_param(&h.g, "w", 2, D, T, TG_INIT_NORMAL, 0);
            scores = tg_act(&h.g, "scores", 4, 1, 1, T, T);
            matmul(&h.g, x, w, -1, scores, T, T, D, 0);
        } else {
            scores = tg_param(&h.g, "scores", 2, T, T, TG_INIT_NORMAL, 0);
        }
        int probs = tg_act(&h.g, "probs", 4, 1, 1, T, T), dropped = both ? tg_act(&h.g, "dropped", 4, 1, 1, T, T) : -1;
        s = tg_spec(TG_OP_ATTN_SOFTMAX);
        s.in[0] = scores, s.out[0] = probs, s.out[1] = dropped;
        s.p.softmax = (tg_softmax_params){.b = 1, .h = 1, .t = T, .scale = 1.0f};
        tg_graph_op(&h.g, &s);
        int logits = probs;
        if (both) {
            logits = tg_act(&h.g, "sum", 2, T, T, 0, 0);
            add(&h.g, probs, dropped, logits, T * T);
        }
        expect_autodiff_fails(&h, loss_of(&h.g, logits, T, T),
                              both ? "internal compiler error: attn_softmax 1: both the probabilities and the dropped "
                                     "probabilities have gradients"
                                   : "internal compiler error: attn_softmax of a parameter is not supported");
    }

    /* A LayerNorm of a parameter. */
    if (!hand_init(&h)) return;
    int x = tg_param(&h.g, "x.param", 2, N, D, TG_INIT_NORMAL, 0);
    int gamma = tg_param(&h.g, "g", 1, D, 0, TG_INIT_ONES, 1), beta = tg_param(&h.g, "b", 1, D, 0, TG_INIT_ZEROS, 1);
    int y = tg_act(&h.g, "y", 2, N, D, 0, 0), mean = tg_act(&h.g, "mean", 1, N, 0, 0, 0),
        rstd = tg_act(&h.g, "rstd", 1, N, 0, 0, 0);
    s = tg_spec(TG_OP_LAYERNORM);
    s.in[0] = x, s.in[1] = gamma, s.in[2] = beta, s.out[0] = y, s.out[1] = mean, s.out[2] = rstd;
    s.p.layernorm.m = N, s.p.layernorm.d = D, s.p.layernorm.eps = 1e-5f;
    tg_graph_op(&h.g, &s);
    expect_autodiff_fails(&h, loss_of(&h.g, y, N, D),
                          "internal compiler error: layernorm 0 needs an activation input and parameter gamma/beta");

    /* A residual LayerNorm whose residual is a parameter. */
    if (!hand_init(&h)) return;
    int64_t xs[2] = {N, D};
    int in = tg_graph_tensor(&h.g, "in", TG_F32, TG_POOL_INPUTS, 2, xs);
    int w = tg_param(&h.g, "w", 2, D, D, TG_INIT_NORMAL, 0);
    x = tg_act(&h.g, "x", 2, N, D, 0, 0);
    matmul(&h.g, in, w, -1, x, N, D, D, 0);
    int r = tg_param(&h.g, "r.param", 2, N, D, TG_INIT_NORMAL, 0);
    gamma = tg_param(&h.g, "g", 1, D, 0, TG_INIT_ONES, 1), beta = tg_param(&h.g, "b", 1, D, 0, TG_INIT_ZEROS, 1);
    y = tg_act(&h.g, "y", 2, N, D, 0, 0);
    int sum = tg_act(&h.g, "s", 2, N, D, 0, 0);
    mean = tg_act(&h.g, "mean", 1, N, 0, 0, 0), rstd = tg_act(&h.g, "rstd", 1, N, 0, 0, 0);
    s = tg_spec(TG_OP_RESIDUAL_LAYERNORM);
    s.in[0] = x, s.in[1] = r, s.in[2] = gamma, s.in[3] = beta;
    s.out[0] = y, s.out[1] = sum, s.out[2] = mean, s.out[3] = rstd;
    s.p.residual_layernorm = (tg_residual_layernorm_params){.m = N, .d = D, .eps = 1e-5f};
    tg_graph_op(&h.g, &s);
    expect_autodiff_fails(&h, loss_of(&h.g, y, N, D),
                          "internal compiler error: residual_layernorm 1 needs activations x and r and parameters "
                          "gamma and beta");

    /* A residual LayerNorm whose gamma is made from parameters, or whose x is a parameter. */
    for (int made_x = 0; made_x < 2; made_x++) {
        if (!hand_init(&h)) return;
        in = tg_graph_tensor(&h.g, "in", TG_F32, TG_POOL_INPUTS, 2, xs);
        w = tg_param(&h.g, "w", 2, D, D, TG_INIT_NORMAL, 0);
        int w2 = tg_param(&h.g, "w2", 2, D, D, TG_INIT_NORMAL, 0);
        x = made_x ? tg_param(&h.g, "x.param", 2, N, D, TG_INIT_NORMAL, 0) : tg_act(&h.g, "x", 2, N, D, 0, 0);
        r = tg_act(&h.g, "r", 2, N, D, 0, 0);
        if (!made_x) matmul(&h.g, in, w, -1, x, N, D, D, 0);
        matmul(&h.g, in, w2, -1, r, N, D, D, 0);
        int p1 = tg_param(&h.g, "p1", 1, D, 0, TG_INIT_ONES, 1), p2 = tg_param(&h.g, "p2", 1, D, 0, TG_INIT_ZEROS, 1);
        if (made_x) {
            gamma = tg_param(&h.g, "g", 1, D, 0, TG_INIT_ONES, 1);
        } else {
            gamma = tg_act(&h.g, "made.gamma", 1, D, 0, 0, 0);
            add(&h.g, p1, p2, gamma, D);
        }
        beta = tg_param(&h.g, "b", 1, D, 0, TG_INIT_ZEROS, 1);
        y = tg_act(&h.g, "y", 2, N, D, 0, 0), sum = tg_act(&h.g, "s", 2, N, D, 0, 0);
        mean = tg_act(&h.g, "mean", 1, N, 0, 0, 0), rstd = tg_act(&h.g, "rstd", 1, N, 0, 0, 0);
        s = tg_spec(TG_OP_RESIDUAL_LAYERNORM);
        s.in[0] = x, s.in[1] = r, s.in[2] = gamma, s.in[3] = beta;
        s.out[0] = y, s.out[1] = sum, s.out[2] = mean, s.out[3] = rstd;
        s.p.residual_layernorm = (tg_residual_layernorm_params){.m = N, .d = D, .eps = 1e-5f};
        tg_graph_op(&h.g, &s);
        expect_autodiff_fails(&h, loss_of(&h.g, y, N, D),
                              made_x ? "internal compiler error: residual_layernorm 1 needs activations x and r and "
                                       "parameters gamma and beta"
                                     : "internal compiler error: residual_layernorm 3 needs activations x and r and "
                                       "parameters gamma and beta");
    }

    /* Heads: a merged part that is a parameter; a split part without a gradient. */
    const int64_t B = 1, H = 2, Dh = 3;
    if (!hand_init(&h)) return;
    int part = tg_param(&h.g, "part.param", 2, B * H * T, Dh, TG_INIT_NORMAL, 0);
    int merged = tg_act(&h.g, "merged", 2, B * T, H * Dh, 0, 0);
    s = tg_spec(TG_OP_HEADS_MERGE);
    s.in[0] = part, s.out[0] = merged;
    s.p.heads = (tg_heads_params){.b = B, .t = T, .h = H, .head_dim = Dh, .parts = 1};
    tg_graph_op(&h.g, &s);
    expect_autodiff_fails(&h, loss_of(&h.g, merged, B * T, H * Dh),
                          "internal compiler error: heads_merge 0: part 0 must be an activation needing a gradient");
    if (!hand_init(&h)) return;
    int64_t ins[2] = {B * T, D};
    in = tg_graph_tensor(&h.g, "in", TG_F32, TG_POOL_INPUTS, 2, ins);
    w = tg_param(&h.g, "w", 2, D, 2 * H * Dh, TG_INIT_NORMAL, 0);
    int packed = tg_act(&h.g, "packed", 2, B * T, 2 * H * Dh, 0, 0);
    matmul(&h.g, in, w, -1, packed, B * T, 2 * H * Dh, D, 0);
    int q = tg_act(&h.g, "q", 4, B, H, T, Dh), k = tg_act(&h.g, "k", 4, B, H, T, Dh);
    s = tg_spec(TG_OP_HEADS_SPLIT);
    s.in[0] = packed, s.out[0] = q, s.out[1] = k;
    s.p.heads = (tg_heads_params){.b = B, .t = T, .h = H, .head_dim = Dh, .parts = 2};
    tg_graph_op(&h.g, &s);
    expect_autodiff_fails(&h, loss_of(&h.g, q, B * H * T, Dh),
                          "internal compiler error: heads_split 1: part 1 has no gradient");
}

/* Fused attention over q = x Wq, v = x Wv and k (a parameter, or an input that needs no
 * gradient); the loss from its output, or from its log-sum-exp. */
static int attention_graph(hand_graph *h, int k_is_param, int loss_from_lse, const char *lse_name) {
    const int64_t B = 1, T = 4, H = 2, Dh = 3, E = 5, D = H * Dh;
    if (!hand_init(h)) return -1;
    int64_t xs[2] = {B * T, E}, ks[2] = {B * T, D};
    int x = tg_graph_tensor(&h->g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int wq = tg_param(&h->g, "wq", 2, E, D, TG_INIT_NORMAL, 0), wv = tg_param(&h->g, "wv", 2, E, D, TG_INIT_NORMAL, 0);
    int q = tg_act(&h->g, "q", 2, B * T, D, 0, 0), v = tg_act(&h->g, "v", 2, B * T, D, 0, 0);
    matmul(&h->g, x, wq, -1, q, B * T, D, E, 0);
    matmul(&h->g, x, wv, -1, v, B * T, D, E, 0);
    int k = k_is_param ? tg_param(&h->g, "k.param", 2, B * T, D, TG_INIT_NORMAL, 0)
                       : tg_graph_tensor(&h->g, "k.input", TG_F32, TG_POOL_INPUTS, 2, ks);
    int out = tg_act(&h->g, "o", 2, B * T, D, 0, 0);
    int64_t ls[3] = {B, H, T};
    int lse = tg_graph_tensor(&h->g, lse_name, TG_F32, TG_POOL_ACTIVATIONS, 3, ls);
    tg_op_spec s = tg_spec(TG_OP_ATTENTION);
    s.in[0] = q, s.in[1] = k, s.in[2] = v, s.out[0] = out, s.out[1] = lse;
    s.p.attention = (tg_attention_params){.b = B, .h = H, .t = T, .head_dim = Dh, .scale = 0.5f};
    tg_graph_op(&h->g, &s);
    return loss_from_lse ? loss_of(&h->g, lse, B * H, T) : loss_of(&h->g, out, B * T, D);
}

TG_TEST(test_backward_rules_attention) {
    hand_graph h;
    int loss = attention_graph(&h, 1, 0, "a.lse");
    if (loss < 0) return;
    expect_autodiff_fails(&h, loss, "internal compiler error: attention 2: input 1 must be an activation");
    loss = attention_graph(&h, 0, 1, "a.lse");
    if (loss < 0) return;
    expect_autodiff_fails(&h, loss,
                          "internal compiler error: attention 2: the log-sum-exp or the keep bits have a gradient");
    /* k needs no gradient: dk goes to scratch; the row term is named after the LSE, which
     * here has no prefix. */
    for (int named = 0; named < 2; named++) {
        loss = attention_graph(&h, 0, 0, named ? "layer.0.lse" : "lse");
        if (loss < 0) return;
        REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0 && tg_autodiff(&h.g, loss) == 0, "%s", h.err.msg);
        int found = 0;
        for (int o = 0; o < h.g.n_ops; o++) {
            const tg_op *op = &h.g.ops[o];
            if (op->kind != TG_OP_ATTENTION_BWD) continue;
            found++;
            const char *delta = h.g.tensors[op->out[3]].name;
            CHECK(!strcmp(delta, named ? "layer.0.delta" : "lse.delta"), "delta named %s", delta);
            CHECK(op->out[1] >= 0 && h.g.needs_grad[op->in[6]] == 0, "dk written to scratch");
        }
        CHECK(found == 1, "%d attention backwards", found);
        tg_graph_free(&h.g);
    }
}

TG_TEST(test_backward_rules_residual_layernorm_statistics) {
    /* A loss read from the residual LayerNorm's mean alone, or from y and its mean or rstd
     * (rstd [1, N] @ y [N, D]): the statistics take no gradient. */
    const int64_t N = 4, D = 6;
    for (int variant = 0; variant < 3; variant++) {
        hand_graph h;
        if (!hand_init(&h)) return;
        int64_t xs[2] = {N, D};
        int in = tg_graph_tensor(&h.g, "in", TG_F32, TG_POOL_INPUTS, 2, xs);
        int w1 = tg_param(&h.g, "w1", 2, D, D, TG_INIT_NORMAL, 0), w2 = tg_param(&h.g, "w2", 2, D, D, TG_INIT_NORMAL, 0);
        int x = tg_act(&h.g, "x", 2, N, D, 0, 0), r = tg_act(&h.g, "r", 2, N, D, 0, 0);
        matmul(&h.g, in, w1, -1, x, N, D, D, 0);
        matmul(&h.g, in, w2, -1, r, N, D, D, 0);
        int gamma = tg_param(&h.g, "g", 1, D, 0, TG_INIT_ONES, 1), beta = tg_param(&h.g, "b", 1, D, 0, TG_INIT_ZEROS, 1);
        int y = tg_act(&h.g, "y", 2, N, D, 0, 0), sum = tg_act(&h.g, "s", 2, N, D, 0, 0);
        int mean = tg_act(&h.g, "mean", 2, 1, N, 0, 0), rstd = tg_act(&h.g, "rstd", 2, 1, N, 0, 0);
        tg_op_spec s = tg_spec(TG_OP_RESIDUAL_LAYERNORM);
        s.in[0] = x, s.in[1] = r, s.in[2] = gamma, s.in[3] = beta;
        s.out[0] = y, s.out[1] = sum, s.out[2] = mean, s.out[3] = rstd;
        s.p.residual_layernorm = (tg_residual_layernorm_params){.m = N, .d = D, .eps = 1e-5f};
        tg_graph_op(&h.g, &s);
        int logits = mean, rows = 1, cols = (int)N;
        if (variant) {
            logits = tg_act(&h.g, "logits", 2, 1, D, 0, 0), cols = (int)D;
            matmul(&h.g, variant == 1 ? mean : rstd, y, -1, logits, 1, D, N, 0);
        }
        expect_autodiff_fails(&h, loss_of(&h.g, logits, rows, cols),
                              "internal compiler error: residual_layernorm 2: y must have a gradient and mean/rstd none");
    }
}

/* A residual LayerNorm whose x, r, gamma and beta all need no gradient, its y one all the
 * same (through its step counter, here a parameter): none of dx, dgamma and dbeta is
 * needed, so the rule emits nothing and the autodiff goes on. */
TG_TEST(test_backward_rules_residual_layernorm_nothing_needed) {
    const int64_t N = 4, D = 6;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {N, D}, ds[1] = {D};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int r = tg_graph_tensor(&h.g, "r", TG_F32, TG_POOL_INPUTS, 2, xs);
    int gamma = tg_graph_tensor(&h.g, "g", TG_F32, TG_POOL_INPUTS, 1, ds);
    int beta = tg_graph_tensor(&h.g, "b", TG_F32, TG_POOL_INPUTS, 1, ds);
    int counter = tg_param(&h.g, "counter", 1, 1, 0, TG_INIT_ZEROS, 1);
    int y = tg_act(&h.g, "y", 2, N, D, 0, 0), sum = tg_act(&h.g, "s", 2, N, D, 0, 0);
    int mean = tg_act(&h.g, "mean", 1, N, 0, 0, 0), rstd = tg_act(&h.g, "rstd", 1, N, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_RESIDUAL_LAYERNORM);
    s.in[0] = x, s.in[1] = r, s.in[2] = gamma, s.in[3] = beta, s.in[4] = counter;
    s.out[0] = y, s.out[1] = sum, s.out[2] = mean, s.out[3] = rstd;
    s.p.residual_layernorm = (tg_residual_layernorm_params){.m = N, .d = D, .eps = 1e-5f};
    tg_graph_op(&h.g, &s);
    int loss = loss_of(&h.g, y, N, D);
    REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0, "%s", h.err.msg);
    const int forward = h.g.n_ops;
    CHECK(tg_autodiff(&h.g, loss) == 0 && !h.g.failed, "autodiff: %s", h.err.msg);
    int residual_bwd = 0, cross_entropy_bwd = 0;
    for (int o = forward; o < h.g.n_ops; o++) {
        residual_bwd += h.g.ops[o].kind == TG_OP_RESIDUAL_LAYERNORM_BWD;
        cross_entropy_bwd += h.g.ops[o].kind == TG_OP_CROSS_ENTROPY_BWD;
    }
    CHECK(residual_bwd == 0 && cross_entropy_bwd == 1, "%d residual LayerNorm backwards, %d loss backwards",
          residual_bwd, cross_entropy_bwd);
    tg_graph_free(&h.g);
}

/* y = LayerNorm(x; gamma, beta) feeding logits = y W, where x, gamma and beta are each an
 * input (no gradient), a parameter, or an activation made from parameters ("made"). */
enum { LN_INPUT, LN_PARAM, LN_MADE };

static int layernorm_graph(hand_graph *h, int x_kind, int gamma_kind, int beta_kind) {
    const int64_t N = 4, D = 6, C = 3;
    if (!hand_init(h)) return -1;
    const int kinds[3] = {x_kind, gamma_kind, beta_kind};
    const char *names[3] = {"x", "gamma", "beta"};
    int t[3];
    for (int i = 0; i < 3; i++) {
        char name[32];
        int64_t shape[2] = {i ? D : N, D};
        const int ndim = i ? 1 : 2;
        if (i) shape[0] = D;
        snprintf(name, sizeof name, "%s.%d", names[i], kinds[i]);
        if (kinds[i] == LN_INPUT) t[i] = tg_graph_tensor(&h->g, name, TG_F32, TG_POOL_INPUTS, ndim, shape);
        else if (kinds[i] == LN_PARAM) t[i] = tg_param(&h->g, name, ndim, shape[0], ndim > 1 ? D : 0, TG_INIT_ONES, 1);
        else { /* u [rows, 2] @ m [2, D], rows N for x and 1 for gamma and beta */
            char pu[40], pm[40];
            snprintf(pu, sizeof pu, "%s.u", name), snprintf(pm, sizeof pm, "%s.m", name);
            const int64_t rows = ndim > 1 ? N : 1, us[2] = {rows, 2};
            int u = tg_graph_tensor(&h->g, pu, TG_F32, TG_POOL_INPUTS, 2, us);
            int m = tg_param(&h->g, pm, 2, 2, D, TG_INIT_NORMAL, 0);
            t[i] = tg_act(&h->g, name, ndim, ndim > 1 ? N : D, ndim > 1 ? D : 0, 0, 0);
            matmul(&h->g, u, m, -1, t[i], rows, D, 2, 0);
        }
    }
    int y = tg_act(&h->g, "y", 2, N, D, 0, 0), mean = tg_act(&h->g, "mean", 1, N, 0, 0, 0),
        rstd = tg_act(&h->g, "rstd", 1, N, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_LAYERNORM);
    s.in[0] = t[0], s.in[1] = t[1], s.in[2] = t[2], s.out[0] = y, s.out[1] = mean, s.out[2] = rstd;
    s.p.layernorm.m = N, s.p.layernorm.d = D, s.p.layernorm.eps = 1e-5f;
    tg_graph_op(&h->g, &s);
    int w = tg_param(&h->g, "w", 2, D, C, TG_INIT_NORMAL, 0), logits = tg_act(&h->g, "logits", 2, N, C, 0, 0);
    matmul(&h->g, y, w, -1, logits, N, C, D, 0);
    return loss_of(&h->g, logits, N, C);
}

TG_TEST(test_backward_rules_layernorm_inputs) {
    static const struct {
        int x, gamma, beta;
        const char *want; /* NULL: differentiated; the LAYERNORM_BWD count follows */
        int bwd_ops, dx_scratch;
    } cases[] = {
        {LN_INPUT, LN_INPUT, LN_INPUT, NULL, 0, 0},  /* nothing to differentiate: no backward op */
        {LN_INPUT, LN_PARAM, LN_PARAM, NULL, 1, 1},  /* dx to scratch */
        {LN_MADE, LN_PARAM, LN_PARAM, NULL, 1, 0},
        {LN_MADE, LN_INPUT, LN_PARAM, NULL, 1, 0},   /* dgamma to scratch */
        {LN_INPUT, LN_INPUT, LN_PARAM, NULL, 1, 1},  /* only beta: dx and dgamma to scratch */
        {LN_INPUT, LN_PARAM, LN_INPUT, NULL, 1, 1},  /* only gamma: dx and dbeta to scratch */
        {LN_MADE, LN_INPUT, LN_INPUT, NULL, 1, 0},   /* only x: the sums to scratch */
        {LN_MADE, LN_PARAM, LN_MADE, "internal compiler error: layernorm 2 needs an activation input and parameter "
                                     "gamma/beta", 0, 0},
        {LN_MADE, LN_MADE, LN_PARAM, "internal compiler error: layernorm 2 needs an activation input and parameter "
                                     "gamma/beta", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        hand_graph h;
        int loss = layernorm_graph(&h, cases[i].x, cases[i].gamma, cases[i].beta);
        if (loss < 0) return;
        if (cases[i].want) {
            expect_autodiff_fails(&h, loss, cases[i].want);
            continue;
        }
        REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0 && tg_autodiff(&h.g, loss) == 0, "case %zu: %s", i,
                h.err.msg);
        int bwd = 0, scratch_dx = 0;
        for (int o = 0; o < h.g.n_ops; o++) {
            const tg_op *op = &h.g.ops[o];
            if (op->kind != TG_OP_LAYERNORM_BWD) continue;
            bwd++;
            scratch_dx += !h.g.needs_grad[op->in[1]];
        }
        CHECK(bwd == cases[i].bwd_ops && scratch_dx == cases[i].dx_scratch, "case %zu: %d LAYERNORM_BWD, %d dx to scratch",
              i, bwd, scratch_dx);
        tg_graph_free(&h.g);
    }
}

TG_TEST(test_backward_rules_transposed_a) {
    /* h = x W1 [N, F]; logits = h^T W2 [F, C] (A stored [K, M] = [N, F]): h's gradient is
     * W2 @ dC^T, a MATMUL reading W2 first with trans_b, M = N, N = F, K = C. */
    const int64_t N = 4, D = 8, F = 6, C = 5;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {N, D};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int w1 = tg_param(&h.g, "w1", 2, D, F, TG_INIT_NORMAL, 0), w2 = tg_param(&h.g, "w2", 2, N, C, TG_INIT_NORMAL, 0);
    int hid = tg_act(&h.g, "h", 2, N, F, 0, 0), logits = tg_act(&h.g, "logits", 2, F, C, 0, 0);
    matmul(&h.g, x, w1, -1, hid, N, F, D, 0);
    matmul(&h.g, hid, w2, -1, logits, F, C, N, 1);
    int loss = loss_of(&h.g, logits, F, C);
    REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0 && tg_autodiff(&h.g, loss) == 0, "%s", h.err.msg);
    int found = 0;
    for (int o = 0; o < h.g.n_ops; o++) {
        const tg_op *op = &h.g.ops[o];
        if (op->kind != TG_OP_MATMUL || op->phase == TG_PHASE_FORWARD || op->in[0] != w2) continue;
        const tg_matmul_params *m = &op->p.matmul;
        found++;
        CHECK(m->trans_a == 0 && m->trans_b == 1 && m->m == N && m->n == F && m->k == C && m->accumulate == 0,
              "dA of the transposed product: trans %d %d, m %lld n %lld k %lld", (int)m->trans_a, (int)m->trans_b,
              (long long)m->m, (long long)m->n, (long long)m->k);
    }
    CHECK(found == 1, "%d backward matmuls read w2 first", found);
    tg_graph_free(&h.g);
}

TG_TEST(test_backward_rules_bias_gradient_fusion) {
    /* logits = x W + b: with fuse_bias_grad the weight-gradient MATMUL also writes db
     * (bias_grad 2: dC is its B operand); without it, or without a job (a hand-built
     * graph), a BIAS_GRAD op does. */
    const int64_t N = 4, D = 8, C = 5;
    for (int mode = 0; mode < 3; mode++) {
        hand_graph h;
        if (!hand_init(&h)) return;
        if (mode == 1) h.job.fuse_bias_grad = 0;
        if (mode == 2) h.g.job = NULL;
        int64_t xs[2] = {N, D};
        int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
        int w = tg_param(&h.g, "w", 2, D, C, TG_INIT_NORMAL, 0), b = tg_param(&h.g, "b", 1, C, 0, TG_INIT_ZEROS, 1);
        int logits = tg_act(&h.g, "logits", 2, N, C, 0, 0);
        matmul(&h.g, x, w, b, logits, N, C, D, 0);
        int loss = loss_of(&h.g, logits, N, C);
        REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0 && tg_autodiff(&h.g, loss) == 0, "mode %d: %s", mode,
                h.err.msg);
        int bias_ops = 0, fused = 0;
        for (int o = 0; o < h.g.n_ops; o++) {
            const tg_op *op = &h.g.ops[o];
            bias_ops += op->kind == TG_OP_BIAS_GRAD;
            fused += op->kind == TG_OP_MATMUL && op->p.matmul.bias_grad == 2 && op->out[1] >= 0;
        }
        CHECK(mode == 0 ? bias_ops == 0 && fused == 1 : bias_ops == 1 && fused == 0, "mode %d: %d BIAS_GRAD, %d fused",
              mode, bias_ops, fused);
        tg_graph_free(&h.g);
    }
}

TG_TEST(test_backward_rules_batched_bias_gradient) {
    /* A batched matmul (2 x [M, K] @ [K, N], B a batched parameter) with a bias: the bias
     * gradient sums all 2 x M rows of dC in a BIAS_GRAD op, never fused. */
    const int64_t Bt = 2, M = 3, K = 4, N = 5;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {Bt * M, K};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int w = tg_param(&h.g, "w", 2, Bt * K, N, TG_INIT_NORMAL, 0), b = tg_param(&h.g, "b", 1, N, 0, TG_INIT_ZEROS, 1);
    int logits = tg_act(&h.g, "logits", 2, Bt * M, N, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = w, s.in[2] = b, s.out[0] = logits;
    s.p.matmul = (tg_matmul_params){.m = M, .n = N, .k = K, .batch = Bt, .alpha = 1.0f};
    tg_graph_op(&h.g, &s);
    int loss = loss_of(&h.g, logits, Bt * M, N);
    REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0 && tg_autodiff(&h.g, loss) == 0, "%s", h.err.msg);
    int bias_ops = 0, fused = 0;
    for (int o = 0; o < h.g.n_ops; o++) {
        const tg_op *op = &h.g.ops[o];
        if (op->kind == TG_OP_BIAS_GRAD)
            bias_ops++, CHECK(op->p.bias_grad.m == Bt * M && op->p.bias_grad.n == N, "bias_grad over %lld x %lld",
                              (long long)op->p.bias_grad.m, (long long)op->p.bias_grad.n);
        fused += op->kind == TG_OP_MATMUL && op->p.matmul.bias_grad != 0;
    }
    CHECK(bias_ops == 1 && fused == 0, "%d BIAS_GRAD, %d fused", bias_ops, fused);
    tg_graph_free(&h.g);
}

TG_TEST(test_backward_rules_table_bounds) {
    CHECK(tg_backward_rule_of(-1) == NULL && tg_backward_rule_of(TG_OP_COUNT) == NULL, "kinds outside the table");
    CHECK(tg_backward_rule_of(TG_OP_MATMUL) != NULL && tg_backward_rule_of(TG_OP_ADD) != NULL, "matmul and add rules");
}

/* Every rule's allocations failing: each graph is built with its tensor table `free_slots`
 * short of full (so that the backward's first, second, ... new tensor grows it), then
 * differentiated with every allocation from the k-th on failing. The compile stops with the
 * out-of-memory message (never a rule's own refusal after it), or succeeds. The graphs: an
 * embedding of a parameter, a LayerNorm whose x and gamma (or x and beta) need no gradient
 * (scratch), a
 * matmul with the GELU epilogue whose activation two matmuls read (its GELU_BWD and the
 * pre-activation's gradient), and an embedding of a table made by an ADD (refused when
 * nothing fails). */
static int oom_graph(hand_graph *h, int variant, int free_slots) {
    const int64_t N = 4, V = 10, D = 6, F = 8, C = 3;
    if (!hand_init(h)) return -1;
    int64_t n1[1] = {N}, xs[2] = {N, D};
    int ids = tg_graph_tensor(&h->g, "ids", TG_I32, TG_POOL_INPUTS, 1, n1);
    int rows = tg_act(&h->g, "rows", 2, N, D, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_EMBEDDING);
    s.in[0] = ids, s.out[0] = rows;
    s.p.embedding = (tg_embedding_params){.n = N, .vocab = V, .dim = D, .padding_idx = -1};
    if (variant == 1) {
        int p1 = tg_param(&h->g, "p1", 2, V, D, TG_INIT_NORMAL, 0), p2 = tg_param(&h->g, "p2", 2, V, D, TG_INIT_NORMAL, 0);
        s.in[1] = tg_act(&h->g, "made.table", 2, V, D, 0, 0);
        add(&h->g, p1, p2, s.in[1], V * D);
    } else {
        s.in[1] = tg_param(&h->g, "table", 2, V, D, TG_INIT_NORMAL, 0);
    }
    tg_graph_op(&h->g, &s);
    int x = rows;
    if (variant != 1) { /* LayerNorm of an input with gamma (variant 0) or beta (2) an input: to scratch */
        x = tg_graph_tensor(&h->g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
        int64_t ds[1] = {D};
        int gamma = variant ? tg_param(&h->g, "gamma", 1, D, 0, TG_INIT_ONES, 1)
                            : tg_graph_tensor(&h->g, "gamma", TG_F32, TG_POOL_INPUTS, 1, ds);
        int beta = variant ? tg_graph_tensor(&h->g, "beta", TG_F32, TG_POOL_INPUTS, 1, ds)
                           : tg_param(&h->g, "beta", 1, D, 0, TG_INIT_ZEROS, 1);
        int y = tg_act(&h->g, "y", 2, N, D, 0, 0), mean = tg_act(&h->g, "mean", 1, N, 0, 0, 0),
            rstd = tg_act(&h->g, "rstd", 1, N, 0, 0, 0);
        s = tg_spec(TG_OP_LAYERNORM);
        s.in[0] = x, s.in[1] = gamma, s.in[2] = beta, s.out[0] = y, s.out[1] = mean, s.out[2] = rstd;
        s.p.layernorm.m = N, s.p.layernorm.d = D, s.p.layernorm.eps = 1e-5f;
        tg_graph_op(&h->g, &s);
        int both = tg_act(&h->g, "both", 2, N, D, 0, 0);
        add(&h->g, y, rows, both, N * D);
        x = both;
    }
    /* act = gelu(x W1 + b1) (pre-activation kept), read by two matmuls. */
    int w1 = tg_param(&h->g, "w1", 2, D, F, TG_INIT_NORMAL, 0), b1 = tg_param(&h->g, "b1", 1, F, 0, TG_INIT_ZEROS, 1);
    int act = tg_act(&h->g, "act", 2, N, F, 0, 0), pre = tg_act(&h->g, "pre", 2, N, F, 0, 0);
    s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = w1, s.in[2] = b1, s.out[0] = act, s.out[2] = pre;
    s.p.matmul = (tg_matmul_params){.m = N, .n = F, .k = D, .batch = 1, .alpha = 1.0f,
                                    .activation = TG_MATMUL_ACT_GELU};
    tg_graph_op(&h->g, &s);
    int w2 = tg_param(&h->g, "w2", 2, F, C, TG_INIT_NORMAL, 0), w3 = tg_param(&h->g, "w3", 2, F, C, TG_INIT_NORMAL, 0);
    int l2 = tg_act(&h->g, "l2", 2, N, C, 0, 0), l3 = tg_act(&h->g, "l3", 2, N, C, 0, 0);
    int logits = tg_act(&h->g, "logits", 2, N, C, 0, 0);
    matmul(&h->g, act, w2, -1, l2, N, C, F, 0);
    matmul(&h->g, act, w3, -1, l3, N, C, F, 0);
    add(&h->g, l2, l3, logits, N * C);
    int loss = loss_of(&h->g, logits, N, C);
    if (!CHECK(!h->g.failed && tg_plan_param_layout(&h->g) == 0, "%s", h->err.msg)) return -1;
    char name[32];
    for (int i = 0; h->g.n_tensors < h->g.cap_tensors - free_slots; i++) {
        snprintf(name, sizeof name, "filler%d", i);
        if (!CHECK(tg_act(&h->g, name, 1, 2, 0, 0, 0) >= 0, "%s", h->err.msg)) return -1;
    }
    return loss;
}

TG_TEST(test_backward_rules_out_of_memory_in_each_rule) {
    static const char *const oom = "out of memory compiling model 'tiny-gpt2' (at ";
    for (int variant = 0; variant < 3; variant++) {
        int refused = 0, done = 0, ops_when_done = -1;
        for (int free_slots = 0; free_slots < 24; free_slots++)
            for (int k = 0; k < 40; k++) {
                hand_graph h;
                int loss = oom_graph(&h, variant, free_slots);
                if (loss < 0) {
                    tg_graph_free(&h.g);
                    return;
                }
                tg_alloc_fail_after(k);
                const int rc = tg_autodiff(&h.g, loss);
                tg_alloc_fail_after(-1);
                if (rc == 0) {
                    CHECK(variant != 1, "variant %d succeeded", variant);
                    CHECK(ops_when_done < 0 || ops_when_done == h.g.n_ops, "%d ops, before %d", h.g.n_ops,
                          ops_when_done);
                    ops_when_done = h.g.n_ops, done++;
                } else if (strncmp(h.err.msg, oom, strlen(oom)) == 0) {
                    refused++;
                } else {
                    CHECK(variant == 1 && !strcmp(h.err.msg, "internal compiler error: embedding table made.table is not a "
                                                        "parameter"),
                          "variant %d, %d free, k %d: '%s'", variant, free_slots, k, h.err.msg);
                }
                tg_graph_free(&h.g);
            }
        CHECK(refused > 24 && (variant == 1 || done > 24), "variant %d: %d out of memory, %d done", variant, refused, done);
    }
}

/* Attention with dropout differentiated from its keep bits (the loss given as them): the
 * keep bits, like the log-sum-exp, take no gradient, and the attention refuses one. */
TG_TEST(test_backward_rules_attention_keep_bits_gradient) {
    const int64_t B = 1, T = 4, H = 2, Dh = 3, E = 5, D = H * Dh;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {B * T, E}, one[1] = {1};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int w = tg_param(&h.g, "w", 2, E, D, TG_INIT_NORMAL, 0);
    int q = tg_act(&h.g, "q", 2, B * T, D, 0, 0);
    matmul(&h.g, x, w, -1, q, B * T, D, E, 0);
    int step = tg_graph_tensor(&h.g, "step", TG_F32, TG_POOL_OPTIM, 1, one);
    int out = tg_act(&h.g, "o", 2, B * T, D, 0, 0);
    int64_t ls[3] = {B, H, T}, bs[4] = {B, H, T, 1};
    int lse = tg_graph_tensor(&h.g, "lse", TG_F32, TG_POOL_ACTIVATIONS, 3, ls);
    int bits = tg_graph_tensor(&h.g, "bits", TG_I32, TG_POOL_ACTIVATIONS, 4, bs);
    tg_op_spec s = tg_spec(TG_OP_ATTENTION);
    s.in[0] = s.in[1] = s.in[2] = q, s.in[4] = step, s.out[0] = out, s.out[1] = lse, s.out[2] = bits;
    s.p.attention = (tg_attention_params){.b = B, .h = H, .t = T, .head_dim = Dh, .scale = 0.5f, .p = 0.1f};
    tg_graph_op(&h.g, &s);
    expect_autodiff_fails(&h, bits, "internal compiler error: attention 1: the log-sum-exp or the keep bits have a gradient");
}

/* Two forward matmuls with the GELU epilogue making the same activation: the index names the
 * first as its producer (the one whose pre-activation the backward may fold in). */
TG_TEST(test_backward_rules_gelu_producer_is_the_first) {
    const int64_t N = 2, D = 4;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {N, D};
    const int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    const int w = tg_param(&h.g, "w", 2, D, D, TG_INIT_NORMAL, 0);
    const int y = tg_act(&h.g, "y", 2, N, D, 0, 0);
    const int pre[2] = {tg_act(&h.g, "pre.0", 2, N, D, 0, 0), tg_act(&h.g, "pre.1", 2, N, D, 0, 0)};
    int ops[2];
    for (int k = 0; k < 2; k++) {
        tg_op_spec s = tg_spec(TG_OP_MATMUL);
        s.in[0] = x, s.in[1] = w, s.out[0] = y, s.out[2] = pre[k];
        s.p.matmul = (tg_matmul_params){.m = N, .n = D, .k = D, .batch = 1, .alpha = 1.0f,
                                        .activation = TG_MATMUL_ACT_GELU};
        ops[k] = tg_graph_op(&h.g, &s);
    }
    REQUIRE(!h.g.failed && ops[0] == 0 && ops[1] == 1, "%s", h.err.msg);
    REQUIRE(tg_backward_index(&h.g) == 0, "%s", h.err.msg);
    CHECK(h.g.gelu_producer[y] == 0 && h.g.gelu_producer[pre[0]] == -1 && h.g.gelu_producer[x] == -1,
          "gelu producer of y %d, of pre.0 %d, of x %d", h.g.gelu_producer[y], h.g.gelu_producer[pre[0]],
          h.g.gelu_producer[x]);
    tg_graph_free(&h.g);
}

/* y = x W + b read by two matmuls: their dA products both write dy (the second adds onto
 * it), so no single op makes dy and could sum the bias gradient as it goes (a GELU_BWD
 * would). The bias gradient is summed by the dW product instead (its out[1]), which reads dy
 * after both writers. */
TG_TEST(test_backward_rules_bias_grad_of_a_product_with_two_writers) {
    const int64_t N = 2, D = 4;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {N, D};
    const int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    const int w = tg_param(&h.g, "w", 2, D, D, TG_INIT_NORMAL, 0), b = tg_param(&h.g, "b", 1, D, 0, TG_INIT_ZEROS, 1);
    const int w1 = tg_param(&h.g, "w1", 2, D, D, TG_INIT_NORMAL, 0), w2 = tg_param(&h.g, "w2", 2, D, D, TG_INIT_NORMAL, 0);
    const int y = tg_act(&h.g, "y", 2, N, D, 0, 0), z1 = tg_act(&h.g, "z1", 2, N, D, 0, 0);
    const int z2 = tg_act(&h.g, "z2", 2, N, D, 0, 0), z = tg_act(&h.g, "z", 2, N, D, 0, 0);
    matmul(&h.g, x, w, b, y, N, D, D, 0);
    matmul(&h.g, y, w1, -1, z1, N, D, D, 0);
    matmul(&h.g, y, w2, -1, z2, N, D, D, 0);
    add(&h.g, z1, z2, z, N * D);
    const int loss = loss_of(&h.g, z, N, D);
    REQUIRE(!h.g.failed && tg_plan_param_layout(&h.g) == 0 && tg_autodiff(&h.g, loss) == 0, "%s", h.err.msg);
    const int dy = h.g.grad[y], db = h.g.tensors[b].grad, dw = h.g.tensors[w].grad;
    int writers = 0, last_writer = -1, bias_at = -1, bias_writers = 0, gelu_bwds = 0;
    for (int o = 0; o < h.g.n_ops; o++) {
        const tg_op *op = &h.g.ops[o];
        if (op->phase != TG_PHASE_BACKWARD) continue;
        if (op->kind == TG_OP_MATMUL && op->out[0] == dy) writers++, last_writer = o;
        for (int k = 0; k < TG_OP_MAX_OUT; k++) bias_writers += op->out[k] == db;
        if (op->kind == TG_OP_MATMUL && op->out[0] == dw && op->out[1] == db && (op->in[0] == dy || op->in[1] == dy))
            bias_at = o;
        gelu_bwds += op->kind == TG_OP_GELU_BWD;
    }
    CHECK(dy >= 0 && db >= 0 && writers == 2 && bias_writers == 1 && bias_at > last_writer && gelu_bwds == 0,
          "dy %d: %d matmul writers (last op %d); b's gradient written by %d ops, the dW product (op %d); %d GELU_BWD",
          dy, writers, last_writer, bias_writers, bias_at, gelu_bwds);
    tg_graph_free(&h.g);
}
