/* The step-scoped pools (compiler/memory_plan.c, tg_plan_memory) on hand-built graphs:
 * activations of one size placed in order of first use (not of creation), an output kept
 * live to the end of the forward phase, and activations or inputs that together pass the
 * pool limit refused with the pool and the size named. */
#include <stdio.h>
#include <string.h>

#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "models/model_config.h"
#include "tests/harness.h"

typedef struct small_graph {
    tg_model_config cfg;
    tg_job job;
    tg_err err;
    tg_graph g;
} small_graph;

/* One parameter, laid out, so that the whole-step pools exist. */
static int setup(small_graph *h) {
    memset(h, 0, sizeof *h);
    if (!CHECK(tg_model_config_load("tiny-bert", &h->cfg, &h->err) == 0, "%s", h->err.msg)) return 0;
    tg_job_defaults(&h->job);
    tg_graph_init(&h->g, &h->cfg, &h->job, &h->err);
    tg_param(&h->g, "w", 1, 4, 0, TG_INIT_ZEROS, 0);
    return CHECK(!h->g.failed && tg_plan_param_layout(&h->g) == 0 && tg_plan_fixed_layout(&h->g) == 0, "%s",
                 h->err.msg);
}

static void zero_op(tg_graph *g, int out) {
    tg_op_spec s = tg_spec(TG_OP_ZERO);
    s.out[0] = out;
    tg_graph_op(g, &s);
}

/* All ops forward: the backward and optimizer phases are empty. */
static int plan_memory(tg_graph *g, uint64_t pools[TG_POOL_COUNT]) {
    int phase_begin[TG_PHASE_COUNT + 1];
    phase_begin[0] = 0;
    for (int p = 1; p <= TG_PHASE_COUNT; p++) phase_begin[p] = g->n_ops;
    uint64_t peak = 0;
    int share = 0;
    return tg_plan_memory(g, phase_begin, &share, pools, &peak);
}

/* o (an output, 16 bytes) made by op 0; b, then a, then c = a + b, each 256 bytes, with a
 * made before b in the table. Largest first, then by first use: b at 0, a at 256, c at 512;
 * o, live to op 3 (the end of the forward phase) though last written at op 0, after them. */
TG_TEST(test_memory_plan_same_size_by_first_use) {
    small_graph h;
    if (!setup(&h)) return;
    tg_graph *g = &h.g;
    const int o = tg_act(g, "o", 1, 4, 0, 0, 0), a = tg_act(g, "a", 1, 64, 0, 0, 0), b = tg_act(g, "b", 1, 64, 0, 0, 0),
              c = tg_act(g, "c", 1, 64, 0, 0, 0);
    REQUIRE(!g->failed, "%s", h.err.msg);
    g->tensors[o].flags |= TG_TENSOR_OUTPUT;
    zero_op(g, o);
    zero_op(g, b);
    zero_op(g, a);
    tg_op_spec add = tg_spec(TG_OP_ADD);
    add.in[0] = a, add.in[1] = b, add.out[0] = c, add.p.count.n = 64;
    tg_graph_op(g, &add);
    uint64_t pools[TG_POOL_COUNT];
    REQUIRE(!g->failed && plan_memory(g, pools) == 0, "%s", h.err.msg);
    const tg_tensor *t = g->tensors;
    CHECK(t[b].offset == 0 && t[a].offset == 256 && t[c].offset == 512 && t[o].offset == 768,
          "offsets: b %llu, a %llu, c %llu, o %llu", (unsigned long long)t[b].offset, (unsigned long long)t[a].offset,
          (unsigned long long)t[c].offset, (unsigned long long)t[o].offset);
    CHECK(t[o].first_use == 0 && t[o].last_use == 3 && t[a].first_use == 2 && t[b].first_use == 1,
          "lifetimes: o [%d, %d], a from %d, b from %d", t[o].first_use, t[o].last_use, t[a].first_use, t[b].first_use);
    CHECK(pools[TG_POOL_ACTIVATIONS] == 784, "activations pool %llu bytes", (unsigned long long)pools[TG_POOL_ACTIVATIONS]);
    tg_graph_free(g);
}

/* Two activations of 9 TiB live together: the second starts at 9 TiB and ends past 16. */
TG_TEST(test_memory_plan_activations_past_the_pool) {
    small_graph h;
    if (!setup(&h)) return;
    tg_graph *g = &h.g;
    const int64_t n = (int64_t)(9ull << 40) / 4;
    const int x = tg_act(g, "x", 1, n, 0, 0, 0), y = tg_act(g, "y", 1, n, 0, 0, 0);
    zero_op(g, x);
    zero_op(g, y);
    zero_op(g, x); /* x stays live across y */
    uint64_t pools[TG_POOL_COUNT];
    REQUIRE(!g->failed, "%s", h.err.msg);
    CHECK(plan_memory(g, pools) == -1 && strstr(h.err.msg, "the activations pool needs at least 18.0 TiB, more than the "
                                                           "16.0 TiB one pool may hold"),
          "'%s'", h.err.msg);
    tg_graph_free(g);
}

/* Two inputs of 9 TiB: the inputs pool is laid out in creation order, the second past 16 TiB. */
TG_TEST(test_memory_plan_inputs_past_the_pool) {
    small_graph h;
    if (!setup(&h)) return;
    tg_graph *g = &h.g;
    const int64_t shape[1] = {(int64_t)(9ull << 40) / 4};
    tg_graph_tensor(g, "in1", TG_F32, TG_POOL_INPUTS, 1, shape);
    tg_graph_tensor(g, "in2", TG_F32, TG_POOL_INPUTS, 1, shape);
    uint64_t pools[TG_POOL_COUNT];
    REQUIRE(!g->failed, "%s", h.err.msg);
    CHECK(plan_memory(g, pools) == -1 && strstr(h.err.msg, "the inputs pool needs at least 18.0 TiB, more than the "
                                                           "16.0 TiB one pool may hold"),
          "'%s'", h.err.msg);
    tg_graph_free(g);
}
