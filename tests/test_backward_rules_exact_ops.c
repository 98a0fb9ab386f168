/* Backward rules (compiler/backward_rules.c) on hand-built graphs the model builder never
 * makes, each backward op compared whole (kind, outputs, inputs, every parameter): heads
 * split into three parts and merged back (a merge of several parts), and a GELU-epilogue
 * matmul whose activation two matmuls read (its GELU_BWD adding the bias gradient), below
 * a LayerNorm whose gamma is an input (its dgamma to scratch). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compiler/autodiff.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "models/model_config.h"
#include "plan/op_meta.h"
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

typedef struct text {
    char s[4096];
    size_t n;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->s + t->n, sizeof t->s - t->n, fmt, ap);
    va_end(ap);
    if (k > 0) t->n += (size_t)k < sizeof t->s - t->n ? (size_t)k : sizeof t->s - 1 - t->n;
}
static void put_i64(void *ctx, const char *display, int64_t *v) { put(ctx, " %s=%lld", display, (long long)*v); }
static void put_f32(void *ctx, const char *display, float *v) { put(ctx, " %s=%g", display, (double)*v); }

/* "kind outs <- ins | params", one op a line, from op `from` on. */
static void render(const tg_graph *g, int from, text *t) {
    t->n = 0, t->s[0] = 0;
    for (int o = from; o < g->n_ops; o++) {
        const tg_op *op = &g->ops[o];
        put(t, "%s", tg_op_name(op->kind));
        const char *sep = " ";
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (op->out[s] >= 0) put(t, "%s%d:%s", sep, s, g->tensors[op->out[s]].name), sep = ", ";
        put(t, " <-");
        sep = " ";
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (op->in[s] >= 0) put(t, "%s%d:%s", sep, s, g->tensors[op->in[s]].name), sep = ", ";
        put(t, " |");
        tg_op_params params = op->p;
        tg_op_params_visit(op->kind, &params, &(const tg_param_visitor){t, put_i64, put_f32});
        put(t, "\n");
    }
}

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

static void expect_backward(hand_graph *h, int loss, const char *want) {
    if (!CHECK(!h->g.failed && tg_plan_param_layout(&h->g) == 0, "%s", h->err.msg)) return;
    const int forward = h->g.n_ops;
    if (!CHECK(tg_autodiff(&h->g, loss) == 0, "autodiff: %s", h->err.msg)) return;
    static text got;
    render(&h->g, forward, &got);
    size_t at = 0;
    while (got.s[at] && got.s[at] == want[at]) at++;
    CHECK(got.s[at] == want[at], "differs at byte %zu:\n%s\nwant\n%s", at, got.s, want);
}

TG_TEST(test_backward_rules_exact_heads_three_parts) {
    const int64_t B = 1, T = 4, H = 2, Dh = 3, E = 5, P = 3;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t xs[2] = {B * T, E};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int w = tg_param(&h.g, "w", 2, E, P * H * Dh, TG_INIT_NORMAL, 0);
    int packed = tg_act(&h.g, "packed", 2, B * T, P * H * Dh, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = w, s.out[0] = packed;
    s.p.matmul = (tg_matmul_params){.m = B * T, .n = P * H * Dh, .k = E, .batch = 1, .alpha = 1.0f};
    tg_graph_op(&h.g, &s);
    int part[3];
    const char *names[3] = {"q", "k", "v"};
    for (int p = 0; p < 3; p++) part[p] = tg_act(&h.g, names[p], 4, B, H, T, Dh);
    s = tg_spec(TG_OP_HEADS_SPLIT);
    s.in[0] = packed;
    for (int p = 0; p < 3; p++) s.out[p] = part[p];
    s.p.heads = (tg_heads_params){.b = B, .t = T, .h = H, .head_dim = Dh, .parts = P};
    tg_graph_op(&h.g, &s);
    int merged = tg_act(&h.g, "merged", 2, B * T, P * H * Dh, 0, 0);
    s = tg_spec(TG_OP_HEADS_MERGE);
    for (int p = 0; p < 3; p++) s.in[p] = part[p];
    s.out[0] = merged;
    s.p.heads = (tg_heads_params){.b = B, .t = T, .h = H, .head_dim = Dh, .parts = P};
    tg_graph_op(&h.g, &s);
    int loss = loss_of(&h.g, merged, B * T, P * H * Dh);
    expect_backward(&h, loss,
                    "zero 0:grads.all <- |\n"
                    "fill 0:d.loss <- | value=1\n"
                    "cross_entropy_bwd 0:d.merged <- 0:d.loss, 1:merged, 2:labels | N=4 C=18 classes=0\n"
                    "heads_split 0:d.q, 1:d.k, 2:d.v <- 0:d.merged | B=1 T=4 H=2 Dh=3 P=3\n"
                    "heads_merge 0:d.packed <- 0:d.q, 1:d.k, 2:d.v | B=1 T=4 H=2 Dh=3 P=3\n"
                    "matmul 0:grad.w <- 0:x, 1:d.packed | M=5 N=18 K=4 transA=1 transB=0 batch=1 accumulate=1 "
                    "bias_grad=0 activation=0 alpha=1\n");
    tg_graph_free(&h.g);
}

/* x = LayerNorm(e; gamma an input, beta a parameter) + e, e a table row; act = gelu(x W1 + b1)
 * read by two matmuls: the LayerNorm backward writes dgamma to scratch, and the GELU_BWD of
 * the activation's summed gradient writes the pre-activation's gradient and b1's. */
TG_TEST(test_backward_rules_exact_gelu_shared_activation) {
    const int64_t N = 4, V = 10, D = 6, F = 8, C = 3;
    hand_graph h;
    if (!hand_init(&h)) return;
    int64_t n1[1] = {N}, ds[1] = {D};
    int ids = tg_graph_tensor(&h.g, "ids", TG_I32, TG_POOL_INPUTS, 1, n1);
    int table = tg_param(&h.g, "table", 2, V, D, TG_INIT_NORMAL, 0);
    int rows = tg_act(&h.g, "rows", 2, N, D, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_EMBEDDING);
    s.in[0] = ids, s.in[1] = table, s.out[0] = rows;
    s.p.embedding = (tg_embedding_params){.n = N, .vocab = V, .dim = D, .padding_idx = -1};
    tg_graph_op(&h.g, &s);
    int gamma = tg_graph_tensor(&h.g, "gamma", TG_F32, TG_POOL_INPUTS, 1, ds);
    int beta = tg_param(&h.g, "beta", 1, D, 0, TG_INIT_ZEROS, 1);
    int y = tg_act(&h.g, "y", 2, N, D, 0, 0), mean = tg_act(&h.g, "mean", 1, N, 0, 0, 0),
        rstd = tg_act(&h.g, "rstd", 1, N, 0, 0, 0);
    s = tg_spec(TG_OP_LAYERNORM);
    s.in[0] = rows, s.in[1] = gamma, s.in[2] = beta, s.out[0] = y, s.out[1] = mean, s.out[2] = rstd;
    s.p.layernorm.m = N, s.p.layernorm.d = D, s.p.layernorm.eps = 1e-5f;
    tg_graph_op(&h.g, &s);
    int x = tg_act(&h.g, "x", 2, N, D, 0, 0);
    s = tg_spec(TG_OP_ADD);
    s.in[0] = y, s.in[1] = rows, s.out[0] = x, s.p.count.n = N * D;
    tg_graph_op(&h.g, &s);
    int w1 = tg_param(&h.g, "w1", 2, D, F, TG_INIT_NORMAL, 0), b1 = tg_param(&h.g, "b1", 1, F, 0, TG_INIT_ZEROS, 1);
    int act = tg_act(&h.g, "act", 2, N, F, 0, 0), pre = tg_act(&h.g, "pre", 2, N, F, 0, 0);
    s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = w1, s.in[2] = b1, s.out[0] = act, s.out[2] = pre;
    s.p.matmul =
        (tg_matmul_params){.m = N, .n = F, .k = D, .batch = 1, .alpha = 1.0f, .activation = TG_MATMUL_ACT_GELU};
    tg_graph_op(&h.g, &s);
    int w2 = tg_param(&h.g, "w2", 2, F, C, TG_INIT_NORMAL, 0), w3 = tg_param(&h.g, "w3", 2, C, F, TG_INIT_NORMAL, 0);
    int l2 = tg_act(&h.g, "l2", 2, N, C, 0, 0), l3 = tg_act(&h.g, "l3", 2, N, C, 0, 0);
    s = tg_spec(TG_OP_MATMUL);
    s.in[0] = act, s.in[1] = w2, s.out[0] = l2;
    s.p.matmul = (tg_matmul_params){.m = N, .n = C, .k = F, .batch = 1, .alpha = 1.0f};
    tg_graph_op(&h.g, &s);
    s.in[1] = w3, s.out[0] = l3, s.p.matmul.trans_b = 1, s.p.matmul.alpha = 0.5f; /* w3 stored [C, F] */
    tg_graph_op(&h.g, &s);
    int logits = tg_act(&h.g, "logits", 2, N, C, 0, 0);
    s = tg_spec(TG_OP_ADD);
    s.in[0] = l2, s.in[1] = l3, s.out[0] = logits, s.p.count.n = N * C;
    tg_graph_op(&h.g, &s);
    int loss = loss_of(&h.g, logits, N, C);
    /* l3's dA first (a fresh d.act), l2's adds into it; the activation's gradient
     * then goes through one GELU_BWD; ADD hands d.x to y and rows, so the LayerNorm's dx
     * is a second contribution to rows, summed before the table's backward. */
    expect_backward(&h, loss,
                    "zero 0:grads.all <- |\n"
                    "fill 0:d.loss <- | value=1\n"
                    "cross_entropy_bwd 0:d.logits <- 0:d.loss, 1:logits, 2:labels | N=4 C=3 classes=0\n"
                    "matmul 0:d.act <- 0:d.logits, 1:w3 | M=4 N=8 K=3 transA=0 transB=0 batch=1 accumulate=0 bias_grad=0 activation=0 alpha=0.5\n"
                    "matmul 0:grad.w3 <- 0:d.logits, 1:act | M=3 N=8 K=4 transA=1 transB=0 batch=1 accumulate=1 bias_grad=0 activation=0 alpha=0.5\n"
                    "matmul 0:d.act <- 0:d.logits, 1:w2 | M=4 N=8 K=3 transA=0 transB=1 batch=1 accumulate=1 bias_grad=0 activation=0 alpha=1\n"
                    "matmul 0:grad.w2 <- 0:act, 1:d.logits | M=8 N=3 K=4 transA=1 transB=0 batch=1 accumulate=1 bias_grad=0 activation=0 alpha=1\n"
                    "gelu_bwd 0:d.pre, 1:grad.b1 <- 0:d.act, 1:pre | n=32 tanh_approx=1 bias_cols=8\n"
                    "matmul 0:d.x <- 0:d.pre, 1:w1 | M=4 N=6 K=8 transA=0 transB=1 batch=1 accumulate=0 bias_grad=0 activation=0 alpha=1\n"
                    "matmul 0:grad.w1 <- 0:x, 1:d.pre | M=6 N=8 K=4 transA=1 transB=0 batch=1 accumulate=1 bias_grad=0 activation=0 alpha=1\n"
                    "layernorm_bwd 0:d.rows, 1:scratch.d.gamma, 2:grad.beta <- 0:d.x, 1:rows, 2:gamma, 3:mean, 4:rstd | M=4 D=6 overwrite=0\n"
                    "add 0:d.rows <- 0:d.x, 1:d.rows | n=24\n"
                    "embedding_bwd 0:grad.table <- 0:ids, 1:d.rows | N=4 V=10 D=6 padding_idx=-1\n");
    tg_graph_free(&h.g);
}

/* logits = x W + b where b is tensor 0 of the graph and read by this matmul alone: its
 * gradient is fused into the weight-gradient matmul (bias_grad 2), no BIAS_GRAD. */
TG_TEST(test_backward_rules_exact_bias_is_tensor_zero) {
    const int64_t N = 4, D = 6, C = 3;
    hand_graph h;
    if (!hand_init(&h)) return;
    int b = tg_param(&h.g, "b", 1, C, 0, TG_INIT_ZEROS, 1);
    int64_t xs[2] = {N, D};
    int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int w = tg_param(&h.g, "w", 2, D, C, TG_INIT_NORMAL, 0);
    int logits = tg_act(&h.g, "logits", 2, N, C, 0, 0);
    REQUIRE(b == 0, "b is tensor %d", b);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = w, s.in[2] = b, s.out[0] = logits;
    s.p.matmul = (tg_matmul_params){.m = N, .n = C, .k = D, .batch = 1, .alpha = 1.0f};
    tg_graph_op(&h.g, &s);
    int loss = loss_of(&h.g, logits, N, C);
    expect_backward(&h, loss,
                    "zero 0:grads.all <- |\n"
                    "fill 0:d.loss <- | value=1\n"
                    "cross_entropy_bwd 0:d.logits <- 0:d.loss, 1:logits, 2:labels | N=4 C=3 classes=0\n"
                    "matmul 0:grad.w, 1:grad.b <- 0:x, 1:d.logits | M=6 N=3 K=4 transA=1 transB=0 batch=1 "
                    "accumulate=1 bias_grad=2 activation=0 alpha=1\n");
    tg_graph_free(&h.g);
}
