/* Autodiff on hand-built graphs at its edges: a forward op whose output is tensor 0 (the
 * first in the table) is differentiated like any other, and the gradient bookkeeping of a
 * graph that already failed makes no scratch. */
#include <stdio.h>
#include <string.h>

#include "compiler/autodiff.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/memory_plan.h"
#include "tests/harness.h"

/* y [2, 4] = x [2, 4] w [4, 4], with y made first: tensor 0. */
static int output_first_graph(tg_graph *g, tg_model_config *cfg, tg_job *job, tg_err *err, int *w, int *y) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->source, sizeof cfg->source, "hand-built");
    tg_graph_init(g, cfg, job, err);
    *y = tg_act(g, "y", 2, 2, 4, 0, 0);
    int64_t xs[2] = {2, 4};
    int x = tg_graph_tensor(g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    *w = tg_param(g, "w", 2, 4, 4, TG_INIT_ZEROS, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = *w, s.out[0] = *y;
    s.p.matmul = (tg_matmul_params){.m = 2, .n = 4, .k = 4, .batch = 1, .alpha = 1.0f};
    tg_graph_op(g, &s);
    return tg_plan_param_layout(g);
}

TG_TEST(test_autodiff_differentiates_the_op_making_tensor_0) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    int w, y;
    REQUIRE(output_first_graph(&g, &cfg, &job, &err, &w, &y) == 0, "%s", err.msg);
    REQUIRE(y == 0, "y is tensor %d", y);
    REQUIRE(tg_autodiff(&g, y) == 0, "%s", err.msg);
    /* The backward: ZERO the gradients, FILL the seed, then the matmul's weight gradient
     * dW = x^T dY into w's gradient (x needs none). */
    REQUIRE(g.n_ops == 4, "%d ops", g.n_ops);
    CHECK(g.ops[1].kind == TG_OP_ZERO && g.ops[2].kind == TG_OP_FILL, "ops 1, 2: %s, %s", tg_op_name(g.ops[1].kind),
          tg_op_name(g.ops[2].kind));
    const tg_op *dw = &g.ops[3];
    CHECK(dw->kind == TG_OP_MATMUL && dw->out[0] == g.tensors[w].grad && dw->in[1] == g.ops[2].out[0] &&
              dw->p.matmul.m == 4 && dw->p.matmul.n == 4 && dw->p.matmul.k == 2 && dw->p.matmul.trans_a == 1,
          "op 3: %s into %d (w's gradient %d), m %lld n %lld k %lld trans_a %d", tg_op_name(dw->kind), dw->out[0],
          g.tensors[w].grad, (long long)dw->p.matmul.m, (long long)dw->p.matmul.n, (long long)dw->p.matmul.k,
          (int)dw->p.matmul.trans_a);
    tg_graph_free(&g);
}

TG_TEST(test_grad_dest_or_scratch_on_a_failed_graph) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    int w, y;
    REQUIRE(output_first_graph(&g, &cfg, &job, &err, &w, &y) == 0, "%s", err.msg);
    const int n_tensors = g.n_tensors;
    tg_graph_fail(&g, "first");
    int acc = 7, scratch = 7;
    /* x (tensor 1) needs no gradient: a sound graph would give it a scratch. */
    const int d = tg_ad_grad_dest_or_scratch(&g, 1, &acc, &scratch);
    CHECK(d == -1 && scratch == 0, "failed graph: %d, scratch %d", d, scratch);
    CHECK(g.n_tensors == n_tensors && !strcmp(err.msg, "internal compiler error: first"), "%d tensors, '%s'",
          g.n_tensors, err.msg);
    tg_graph_free(&g);
}

/* A residual LayerNorm whose branch x needs no gradient (made from a frozen weight) and whose
 * residual r does: the residual stream s it writes carries r's gradient, so it needs one. */
TG_TEST(test_autodiff_residual_stream_from_the_residual_alone) {
    const int64_t N = 4, D = 8;
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.source, sizeof cfg.source, "hand-built");
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.freeze, sizeof job.freeze, "frozen.*");
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, &cfg, &job, &err);
    int64_t xs[2] = {N, D};
    const int in = tg_graph_tensor(&g, "in", TG_F32, TG_POOL_INPUTS, 2, xs);
    const int wf = tg_param(&g, "frozen.w", 2, D, D, TG_INIT_NORMAL, 0), w = tg_param(&g, "w", 2, D, D, TG_INIT_NORMAL, 0);
    const int gamma = tg_param(&g, "g", 1, D, 0, TG_INIT_ONES, 1), beta = tg_param(&g, "b", 1, D, 0, TG_INIT_ZEROS, 1);
    const int x = tg_act(&g, "x", 2, N, D, 0, 0), r = tg_act(&g, "r", 2, N, D, 0, 0);
    const int y = tg_act(&g, "y", 2, N, D, 0, 0), sum = tg_act(&g, "s", 2, N, D, 0, 0);
    const int mean = tg_act(&g, "mean", 1, N, 0, 0, 0), rstd = tg_act(&g, "rstd", 1, N, 0, 0, 0);
    const int products[2][3] = {{wf, x}, {w, r}};
    for (int k = 0; k < 2; k++) {
        tg_op_spec s = tg_spec(TG_OP_MATMUL);
        s.in[0] = in, s.in[1] = products[k][0], s.out[0] = products[k][1];
        s.p.matmul = (tg_matmul_params){.m = N, .n = D, .k = D, .batch = 1, .alpha = 1.0f};
        tg_graph_op(&g, &s);
    }
    tg_op_spec s = tg_spec(TG_OP_RESIDUAL_LAYERNORM);
    s.in[0] = x, s.in[1] = r, s.in[2] = gamma, s.in[3] = beta;
    s.out[0] = y, s.out[1] = sum, s.out[2] = mean, s.out[3] = rstd;
    s.p.residual_layernorm = (tg_residual_layernorm_params){.m = N, .d = D, .eps = 1e-5f};
    tg_graph_op(&g, &s);
    REQUIRE(!g.failed && (g.tensors[wf].flags & TG_TENSOR_FROZEN) && tg_plan_param_layout(&g) == 0, "%s", err.msg);
    REQUIRE(tg_autodiff(&g, y) == 0, "%s", err.msg);
    CHECK(!g.needs_grad[x] && g.needs_grad[r] && g.needs_grad[sum] && g.needs_grad[y],
          "needs a gradient: x %d, r %d, s %d, y %d", g.needs_grad[x], g.needs_grad[r], g.needs_grad[sum], g.needs_grad[y]);
    tg_graph_free(&g);
}
