/* tg_gradient_buckets (compiler/grad_buckets.c) on hand-built data-parallel graphs: a
 * backward op writing two gradients in falling offset order completes both (its highest
 * end counts, not its last slot's); under grad_accumulation a graph without optimizer ops
 * gets its one sum at the end; and the sum's op failing to be added (out of memory) is a
 * clean refusal. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/grad_buckets.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "models/model_config.h"
#include "tests/harness.h"

enum { D = 2048 };

typedef struct dp_graph {
    tg_model_config cfg;
    tg_job job;
    tg_err err;
    tg_graph g;
    int beta, gamma, x, y, mean, rstd, dy, dx, scratch;
} dp_graph;

/* beta [D] before gamma [D], so grad.beta lies below grad.gamma; y = LayerNorm(x) forward. */
static int dp_init(dp_graph *h, int accumulation) {
    memset(h, 0, sizeof *h);
    snprintf(h->cfg.source, sizeof h->cfg.source, "hand-built");
    tg_job_defaults(&h->job);
    h->job.data_parallel = 2, h->job.grad_accumulation = accumulation;
    tg_graph_init(&h->g, &h->cfg, &h->job, &h->err);
    tg_graph *g = &h->g;
    h->beta = tg_param(g, "beta", 1, D, 0, TG_INIT_ZEROS, 1);
    h->gamma = tg_param(g, "gamma", 1, D, 0, TG_INIT_ONES, 1);
    int64_t row[2] = {1, D};
    h->x = tg_graph_tensor(g, "x", TG_F32, TG_POOL_INPUTS, 2, row);
    h->y = tg_act(g, "y", 2, 1, D, 0, 0), h->dy = tg_act(g, "dy", 2, 1, D, 0, 0), h->dx = tg_act(g, "dx", 2, 1, D, 0, 0);
    h->mean = tg_act(g, "mean", 1, 1, 0, 0, 0), h->rstd = tg_act(g, "rstd", 1, 1, 0, 0, 0);
    h->scratch = tg_act(g, "scratch", 1, 1, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_LAYERNORM);
    s.in[0] = h->x, s.in[1] = h->gamma, s.in[2] = h->beta, s.out[0] = h->y, s.out[1] = h->mean, s.out[2] = h->rstd;
    s.p.layernorm.m = 1, s.p.layernorm.d = D, s.p.layernorm.eps = 1e-5f;
    tg_graph_op(g, &s);
    return CHECK(!g->failed && tg_plan_param_layout(g) == 0 &&
                     g->tensors[g->tensors[h->beta].grad].offset < g->tensors[g->tensors[h->gamma].grad].offset,
                 "setup: %s", h->err.msg);
}

static void zero_op(tg_graph *g, int t) {
    tg_op_spec z = tg_spec(TG_OP_ZERO);
    z.out[0] = t;
    tg_graph_op(g, &z);
}

/* The backward: a ZERO of a scratch tensor, then the LayerNorm backward writing dgamma
 * (out1, the higher) and dbeta (out2, the lower). */
static void backward(dp_graph *h) {
    tg_graph *g = &h->g;
    g->phase = TG_PHASE_BACKWARD;
    zero_op(g, h->scratch);
    tg_op_spec s = tg_spec(TG_OP_LAYERNORM_BWD);
    s.in[0] = h->dy, s.in[1] = h->x, s.in[2] = h->gamma, s.in[3] = h->mean, s.in[4] = h->rstd;
    s.out[0] = h->dx, s.out[1] = g->tensors[h->gamma].grad, s.out[2] = g->tensors[h->beta].grad;
    s.p.layernorm_bwd.m = 1, s.p.layernorm_bwd.d = D;
    tg_graph_op(g, &s);
}

/* Nothing below the LayerNorm backward's highest end is final before it: one bucket, the
 * whole buffer, summed right after it (none after the ZERO, where the lower gradient's end
 * alone would leave D floats above it to sum). */
TG_TEST(test_grad_buckets_op_writing_gradients_in_falling_order) {
    dp_graph h;
    if (!dp_init(&h, 1)) return;
    backward(&h);
    tg_graph *g = &h.g;
    REQUIRE(!g->failed && tg_gradient_buckets(g) == 0, "%s", h.err.msg);
    const int64_t n = tg_tensor_numel(&g->tensors[g->io.grads_all]);
    int sums = 0, at = -1;
    for (int o = 0; o < g->n_ops; o++)
        if (g->ops[o].kind == TG_OP_ALL_REDUCE) sums++, at = o;
    REQUIRE(sums == 1 && at == g->n_ops - 1 && g->ops[at - 1].kind == TG_OP_LAYERNORM_BWD, "%d sums, the last at op %d of %d",
            sums, at, g->n_ops);
    const tg_tensor *b = &g->tensors[g->ops[at].in[0]];
    CHECK(b->offset == 0 && tg_tensor_numel(b) == n && g->ops[at].p.count.n == n && n >= 2 * D,
          "the bucket %s at %llu of %lld floats (grads %lld)", b->name, (unsigned long long)b->offset,
          (long long)tg_tensor_numel(b), (long long)n);
    tg_graph_free(g);
}

/* grad_accumulation: the sum of the whole buffer opens the optimizer phase; with no
 * optimizer op it is the last op. */
TG_TEST(test_grad_buckets_accumulated_sum_without_optimizer_ops) {
    dp_graph h;
    if (!dp_init(&h, 2)) return;
    backward(&h);
    tg_graph *g = &h.g;
    const int before = g->n_ops;
    REQUIRE(!g->failed && tg_gradient_buckets(g) == 0, "%s", h.err.msg);
    const tg_op *last = &g->ops[g->n_ops - 1];
    CHECK(g->n_ops == before + 1 && last->kind == TG_OP_ALL_REDUCE && last->phase == TG_PHASE_OPTIMIZER &&
              last->in[0] == g->io.grads_all && last->out[0] == g->io.grads_all &&
              last->p.count.n == tg_tensor_numel(&g->tensors[g->io.grads_all]),
          "%d ops (from %d), the last %s in phase %d", g->n_ops, before, tg_op_name(last->kind), last->phase);
    tg_graph_free(g);
}

/* The op table full (256 ops) and its growth failing as the sum is added. */
TG_TEST(test_grad_buckets_accumulated_sum_out_of_memory) {
    dp_graph h;
    if (!dp_init(&h, 2)) return;
    backward(&h);
    tg_graph *g = &h.g;
    while (!g->failed && g->n_ops < 256) zero_op(g, h.scratch);
    REQUIRE(!g->failed && g->n_ops == 256, "%d ops: %s", g->n_ops, h.err.msg);
    char want[160];
    snprintf(want, sizeof want, "out of memory compiling model 'hand-built' (at %d tensors and 256 ops)", g->n_tensors);
    tg_alloc_fail_only(0);
    const int rc = tg_gradient_buckets(g);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(h.err.msg, want) && g->n_ops == 256, "rc %d, '%s', %d ops; want '%s'", rc, h.err.msg,
          g->n_ops, want);
    tg_graph_free(g);
}
