/* The gradient bookkeeping (compiler/grad_state.c) called directly on a differentiated
 * graph: where each kind of tensor's contribution goes, scratch outputs and their names, a
 * second contribution summed by an ADD, what may be accumulated in place, and nothing at all
 * done once the graph has failed. */
#include <stdio.h>
#include <string.h>

#include "compiler/autodiff.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "models/model_config.h"
#include "tests/harness.h"

typedef struct small {
    tg_model_config cfg;
    tg_job job;
    tg_graph g;
    tg_err err;
    int x, w, y, loss;
} small;

/* y = x w (x an input, w a parameter), loss on y; differentiated. */
static int small_graph(small *s) {
    memset(s, 0, sizeof *s);
    if (!CHECK(tg_model_config_load("tiny-gpt2", &s->cfg, &s->err) == 0, "%s", s->err.msg)) return 0;
    tg_job_defaults(&s->job);
    tg_graph_init(&s->g, &s->cfg, &s->job, &s->err);
    int64_t xs[2] = {4, 6}, ls[1] = {4};
    s->x = tg_graph_tensor(&s->g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    s->w = tg_param(&s->g, "w", 2, 6, 3, TG_INIT_NORMAL, 0);
    s->y = tg_act(&s->g, "y", 2, 4, 3, 0, 0);
    tg_op_spec op = tg_spec(TG_OP_MATMUL);
    op.in[0] = s->x, op.in[1] = s->w, op.out[0] = s->y;
    op.p.matmul = (tg_matmul_params){.m = 4, .n = 3, .k = 6, .batch = 1, .alpha = 1.0f};
    tg_graph_op(&s->g, &op);
    int labels = tg_graph_tensor(&s->g, "labels", TG_I32, TG_POOL_INPUTS, 1, ls);
    s->g.io.labels = labels;
    s->loss = tg_act(&s->g, "loss", 1, 1, 0, 0, 0);
    op = tg_spec(TG_OP_CROSS_ENTROPY);
    op.in[0] = s->y, op.in[1] = labels, op.out[0] = s->loss, op.p.cross_entropy.n = 4, op.p.cross_entropy.c = 3;
    tg_graph_op(&s->g, &op);
    return CHECK(!s->g.failed && tg_plan_param_layout(&s->g) == 0 && tg_autodiff(&s->g, s->loss) == 0, "%s",
                 s->err.msg);
}

TG_TEST(test_compiler_grad_state_spec_and_destinations) {
    tg_op_spec s = tg_spec(TG_OP_ADD);
    int blank = s.kind == TG_OP_ADD;
    for (int i = 0; i < TG_OP_MAX_IN; i++) blank &= s.in[i] == -1;
    for (int i = 0; i < TG_OP_MAX_OUT; i++) blank &= s.out[i] == -1;
    const tg_op_params zero = {0};
    CHECK(blank && !memcmp(&s.p, &zero, sizeof zero), "tg_spec: every slot -1, every parameter 0");

    small sg;
    if (!small_graph(&sg)) {
        tg_graph_free(&sg.g);
        return;
    }
    tg_graph *g = &sg.g;
    CHECK(tg_ad_grad_of(g, -1) == -1 && tg_ad_grad_of(g, sg.x) == -1 && tg_ad_grad_of(g, sg.loss) >= 0,
          "gradients of nothing, of the input, of the loss");
    int acc = 7;
    CHECK(tg_ad_grad_dest(g, sg.w, &acc) == g->tensors[sg.w].grad && acc == 1, "a parameter accumulates");
    acc = 7;
    CHECK(tg_ad_grad_dest(g, sg.x, &acc) == -1 && acc == 0, "an input needs no gradient");
    acc = 7;
    CHECK(tg_ad_grad_dest(g, -1, &acc) == -1 && acc == 0, "no tensor");
    const int n0 = g->n_tensors;
    acc = 7;
    int d = tg_ad_grad_dest(g, sg.y, &acc);
    CHECK(d == n0 && acc == 0 && !strcmp(g->tensors[d].name, "d.y") && g->tensors[d].pool == TG_POOL_ACTIVATIONS &&
              g->tensors[d].ndim == 2 && g->tensors[d].shape[0] == 4 && g->tensors[d].shape[1] == 3 &&
              g->grad[d] == -1 && g->needs_grad[d] == 0 && g->grad_holders[d] == 0,
          "an activation's contribution: a fresh d.y [4,3], got %d '%s'", d, d >= 0 ? g->tensors[d].name : "");
    int scratch = 7;
    acc = 7;
    int sx = tg_ad_grad_dest_or_scratch(g, sg.x, &acc, &scratch);
    CHECK(sx == n0 + 1 && scratch == 1 && acc == 0 && !strcmp(g->tensors[sx].name, "scratch.d.x") &&
              g->tensors[sx].shape[0] == 4 && g->tensors[sx].shape[1] == 6,
          "the input's output to scratch.d.x [4,6]: %d '%s'", sx, sx >= 0 ? g->tensors[sx].name : "");
    scratch = 7;
    CHECK(tg_ad_grad_dest_or_scratch(g, sg.w, &acc, &scratch) == g->tensors[sg.w].grad && scratch == 0 && acc == 1,
          "a parameter's own gradient, no scratch");
    scratch = 7;
    CHECK(tg_ad_grad_dest_or_scratch(g, -1, &acc, &scratch) == -1 && scratch == 0, "no tensor, no scratch");
    tg_graph_free(g);
}

TG_TEST(test_compiler_grad_state_contributions) {
    small sg;
    if (!small_graph(&sg)) {
        tg_graph_free(&sg.g);
        return;
    }
    tg_graph *g = &sg.g;
    int64_t shape[2] = {4, 3};
    int t = tg_ad_activation(g, "t", 2, shape), a = tg_ad_activation(g, "a", 2, shape);
    int b = tg_ad_activation(g, "b", 2, shape);
    REQUIRE(t >= 0 && a >= 0 && b >= 0, "%s", g->err->msg);
    g->needs_grad[t] = 1;
    CHECK(tg_ad_grad_accumulable(g, t) == -1, "no gradient yet: nothing to accumulate into");
    /* The first contribution is held as it is. */
    const int ops0 = g->n_ops;
    tg_ad_pass(g, t, a);
    CHECK(g->grad[t] == a && g->grad_holders[a] == 1 && g->n_ops == ops0, "first: grad %d, holders %d", g->grad[t],
          g->grad_holders[a]);
    CHECK(tg_ad_grad_accumulable(g, t) == a, "a, held by t alone, may take += ");
    /* A tensor handed to two gradients may not. */
    int u = tg_ad_activation(g, "u", 2, shape);
    g->needs_grad[u] = 1;
    tg_ad_pass(g, u, a);
    CHECK(g->grad_holders[a] == 2 && tg_ad_grad_accumulable(g, t) == -1, "shared: holders %d", g->grad_holders[a]);
    /* The second: an ADD into a fresh d.t, which t alone holds. */
    const int n0 = g->n_tensors;
    tg_ad_pass(g, t, b);
    REQUIRE(g->n_ops == ops0 + 1 && g->n_tensors == n0 + 1, "%d ops, %d tensors", g->n_ops - ops0, g->n_tensors - n0);
    const tg_op *add = &g->ops[ops0];
    CHECK(add->kind == TG_OP_ADD && add->in[0] == a && add->in[1] == b && add->out[0] == n0 && add->p.count.n == 12 &&
              add->phase == TG_PHASE_BACKWARD,
          "ADD %d %d -> %d of %lld", add->in[0], add->in[1], add->out[0], (long long)add->p.count.n);
    CHECK(g->grad[t] == n0 && !strcmp(g->tensors[n0].name, "d.t") && g->grad_holders[n0] == 1 &&
              g->grad_holders[a] == 1 && g->grad_holders[b] == 0,
          "sum %d '%s', holders sum %d a %d b %d", g->grad[t], g->tensors[n0].name, g->grad_holders[n0],
          g->grad_holders[a], g->grad_holders[b]);
    CHECK(tg_ad_grad_accumulable(g, t) == n0, "the sum may take +=");
    /* Never into a parameter, an input without a gradient, a gradient-pool tensor, a view. */
    CHECK(tg_ad_grad_accumulable(g, sg.w) == -1 && tg_ad_grad_accumulable(g, sg.x) == -1 &&
              tg_ad_grad_accumulable(g, -1) == -1,
          "parameter, input, none");
    int v = tg_ad_activation(g, "v", 2, shape);
    g->needs_grad[v] = 1;
    tg_ad_pass(g, v, g->tensors[sg.w].grad);
    CHECK(tg_ad_grad_accumulable(g, v) == -1, "a parameter's gradient tensor");
    int view = tg_ad_activation(g, "view", 2, shape), vt = tg_ad_activation(g, "vt", 2, shape);
    g->tensors[view].flags |= TG_TENSOR_VIEW;
    g->needs_grad[vt] = 1;
    tg_ad_pass(g, vt, view);
    CHECK(tg_ad_grad_accumulable(g, vt) == -1, "a view");
    /* Commit: a parameter's contribution is already in its gradient; -1 is no contribution. */
    const int grad_w = g->grad[sg.w], ops1 = g->n_ops;
    tg_ad_commit(g, sg.w, a);
    int c = tg_ad_activation(g, "c", 2, shape);
    tg_ad_commit(g, c, -1);
    CHECK(g->grad[sg.w] == grad_w && g->grad[c] == -1 && g->n_ops == ops1, "commits that record nothing");
    tg_ad_commit(g, c, b);
    CHECK(g->grad[c] == b && g->grad_holders[b] == 1, "commit of an activation's contribution");
    /* A failed graph records nothing more, not even a first contribution. */
    int f = tg_ad_activation(g, "f", 2, shape);
    const int grad_y = g->grad[sg.y];
    tg_graph_fail(g, "stop");
    const int n1 = g->n_tensors, ops2 = g->n_ops;
    int e = tg_ad_activation(g, "e", 2, shape);
    CHECK(e == -1 && g->n_tensors == n1, "no activation after failure");
    tg_ad_pass(g, sg.y, a);
    tg_ad_pass(g, f, a);
    tg_ad_pass(g, t, a);
    tg_ad_commit(g, c, a);
    int acc = 7, scratch = 7;
    CHECK(g->grad[sg.y] == grad_y && g->grad[f] == -1 && g->grad[t] == n0 && g->grad[c] == b && g->grad_holders[a] == 1 &&
              g->n_tensors == n1 && g->n_ops == ops2,
          "after failure: grad y %d, f %d, t %d, c %d, holders a %d, %d tensors, %d ops", g->grad[sg.y], g->grad[f], g->grad[t],
          g->grad[c], g->grad_holders[a], g->n_tensors - n1, g->n_ops - ops2);
    CHECK(tg_ad_grad_dest(g, sg.w, &acc) == -1 && tg_ad_grad_dest_or_scratch(g, sg.x, &acc, &scratch) == -1 &&
              tg_ad_grad_accumulable(g, t) == -1 && g->n_tensors == n1,
          "no destination after failure");
    CHECK(!strcmp(g->err->msg, "internal compiler error: stop"), "%s", g->err->msg);
    tg_graph_free(g);
}
