/* The ZERO ops tg_first_gradient_writes (compiler/grad_writes.c) puts in place of the ZERO
 * of the whole gradient buffer, on hand-built graphs whose first tensor is itself a
 * gradient: a gradient nothing writes is cleared, one read before it is written is cleared,
 * one an op overwrites is not, and neighbouring ranges become one ZERO. */
#include <stdio.h>
#include <string.h>

#include "compiler/grad_state.h"
#include "compiler/grad_writes.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

/* Tensors 0 and 1: gradients a [4] at byte 0 and b [4] at byte 16; 2: grads.all [8] at 0;
 * 3: an input x [4]; 4: an activation y [4]. Op 0: the ZERO of grads.all. */
typedef struct two_grads {
    tg_model_config cfg;
    tg_job job;
    tg_err err;
    tg_graph g;
} two_grads;

enum { GA, GB, ALL, X, Y };

static int two_grads_init(two_grads *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->cfg.source, sizeof s->cfg.source, "hand-built");
    tg_job_defaults(&s->job);
    tg_graph_init(&s->g, &s->cfg, &s->job, &s->err);
    int64_t four[1] = {4}, eight[1] = {8};
    int ga = tg_graph_tensor(&s->g, "grad.a", TG_F32, TG_POOL_GRADS, 1, four);
    int gb = tg_graph_tensor(&s->g, "grad.b", TG_F32, TG_POOL_GRADS, 1, four);
    int all = tg_graph_tensor(&s->g, "grads.all", TG_F32, TG_POOL_GRADS, 1, eight);
    int x = tg_graph_tensor(&s->g, "x", TG_F32, TG_POOL_INPUTS, 1, four);
    int y = tg_graph_tensor(&s->g, "y", TG_F32, TG_POOL_ACTIVATIONS, 1, four);
    if (!CHECK(!s->g.failed && ga == GA && gb == GB && all == ALL && x == X && y == Y, "setup: %s", s->err.msg))
        return 0;
    s->g.tensors[GA].flags |= TG_TENSOR_GRAD, s->g.tensors[GA].offset = 0;
    s->g.tensors[GB].flags |= TG_TENSOR_GRAD, s->g.tensors[GB].offset = 16;
    s->g.tensors[ALL].offset = 0;
    s->g.io.grads_all = ALL;
    tg_op_spec z = tg_spec(TG_OP_ZERO);
    z.out[0] = ALL;
    return CHECK(tg_graph_op(&s->g, &z) == 0, "zero: %s", s->err.msg);
}

static void add(two_grads *s, int a, int b, int out) {
    tg_op_spec o = tg_spec(TG_OP_ADD);
    o.in[0] = a, o.in[1] = b, o.out[0] = out, o.p.count.n = 4;
    tg_graph_op(&s->g, &o);
}

/* The graph after the pass: zeros ZERO ops first, each over [offset, offset + 4 * numel)
 * of a gradient-pool view named grads.zero.<k>, then the ADDs, in order. */
static void expect_zeros(two_grads *s, const char *what, int zeros, const uint64_t *offset, const int64_t *numel,
                         int adds) {
    tg_graph *g = &s->g;
    if (!CHECK(tg_first_gradient_writes(g) == 0, "%s: %s", what, s->err.msg)) return;
    if (!CHECK(g->n_ops == zeros + adds, "%s: %d ops, want %d ZERO and %d ADD", what, g->n_ops, zeros, adds)) return;
    for (int k = 0; k < zeros; k++) {
        const tg_op *op = &g->ops[k];
        if (!CHECK(op->kind == TG_OP_ZERO && op->out[0] >= 0, "%s: op %d is %s", what, k, tg_op_name(op->kind))) continue;
        const tg_tensor *t = &g->tensors[op->out[0]];
        char name[32];
        snprintf(name, sizeof name, "grads.zero.%d", k);
        CHECK(!strcmp(t->name, name) && t->pool == TG_POOL_GRADS && (t->flags & TG_TENSOR_VIEW) && t->ndim == 1 &&
                  t->offset == offset[k] && t->shape[0] == numel[k] && t->bytes == 4 * (uint64_t)numel[k],
              "%s: zero %d is %s at %llu, %lld floats", what, k, t->name, (unsigned long long)t->offset,
              (long long)t->shape[0]);
    }
    for (int k = zeros; k < g->n_ops; k++) CHECK(g->ops[k].kind == TG_OP_ADD, "%s: op %d is %s", what, k, tg_op_name(g->ops[k].kind));
}

TG_TEST(test_compiler_grad_writes_zero_spans) {
    two_grads s;
    /* Nothing writes a or b: both cleared, as one ZERO of the 8 floats. */
    if (!two_grads_init(&s)) return;
    expect_zeros(&s, "nothing written", 1, (const uint64_t[]){0}, (const int64_t[]){8}, 0);
    tg_graph_free(&s.g);

    /* b is overwritten by an ADD: only a (the first tensor of the graph) is cleared. */
    if (!two_grads_init(&s)) return;
    add(&s, X, X, GB);
    expect_zeros(&s, "b written", 1, (const uint64_t[]){0}, (const int64_t[]){4}, 1);
    tg_graph_free(&s.g);

    /* a is overwritten: only b is cleared. */
    if (!two_grads_init(&s)) return;
    add(&s, X, X, GA);
    expect_zeros(&s, "a written", 1, (const uint64_t[]){16}, (const int64_t[]){4}, 1);
    tg_graph_free(&s.g);

    /* Both overwritten: no ZERO at all; the old ZERO goes. */
    if (!two_grads_init(&s)) return;
    add(&s, X, X, GA);
    add(&s, X, X, GB);
    expect_zeros(&s, "both written", 0, NULL, NULL, 2);
    tg_graph_free(&s.g);

    /* a read before anything writes it, then written: it must start at zero all the same;
     * b written first, then read, is not cleared. */
    if (!two_grads_init(&s)) return;
    add(&s, GA, X, Y);
    add(&s, X, X, GA);
    add(&s, X, X, GB);
    add(&s, GB, X, Y);
    expect_zeros(&s, "a read first", 1, (const uint64_t[]){0}, (const int64_t[]){4}, 4);
    tg_graph_free(&s.g);
}

/* The op's index in the graph, or -1. */
static int bias_grad_into(two_grads *s, int out) {
    tg_op_spec o = tg_spec(TG_OP_BIAS_GRAD);
    o.in[0] = X, o.out[0] = out, o.p.bias_grad.m = 1, o.p.bias_grad.n = 4;
    return tg_graph_op(&s->g, &o);
}

/* Two BIAS_GRAD ops summing into a (tensor 0 of the graph), then one into b: the first of
 * a's and b's overwrites (nothing was written there), a's second adds onto the first; no
 * ZERO is left. */
TG_TEST(test_compiler_grad_writes_overwrite_first_writer_of_tensor_zero) {
    two_grads s;
    if (!two_grads_init(&s)) return;
    REQUIRE(bias_grad_into(&s, GA) == 1 && bias_grad_into(&s, GA) == 2 && bias_grad_into(&s, GB) == 3, "ops: %s",
            s.err.msg);
    REQUIRE(tg_first_gradient_writes(&s.g) == 0, "%s", s.err.msg);
    REQUIRE(s.g.n_ops == 3, "%d ops, want the 3 BIAS_GRAD (no ZERO)", s.g.n_ops);
    const int want_overwrite[3] = {1, 0, 1};
    for (int k = 0; k < 3; k++)
        CHECK(s.g.ops[k].kind == TG_OP_BIAS_GRAD && s.g.ops[k].p.bias_grad.overwrite == want_overwrite[k],
              "op %d: %s overwrite %lld, want %d", k, tg_op_name(s.g.ops[k].kind),
              (long long)s.g.ops[k].p.bias_grad.overwrite, want_overwrite[k]);
    tg_graph_free(&s.g);
}
