/* The compiler's passes on small hand-built graphs: every pass stops at once on a graph
 * that already failed (keeping its first message), autodiff refusals (a loss that depends
 * on no trainable parameter, an op without a backward rule) and its data-parallel seed,
 * gradient bookkeeping edges, gradient buckets (none, covering the pool, out of memory),
 * ZeRO slices, layouts without parameters, an unused activation, and span sets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/autodiff.h"
#include "compiler/grad_buckets.h"
#include "compiler/grad_state.h"
#include "compiler/grad_writes.h"
#include "compiler/graph.h"
#include "compiler/memory_plan.h"
#include "compiler/span_set.h"
#include "tests/harness.h"

/* w (a trainable [4]), x (an input [4]), y = op(w, x) [4]; the params layout made. */
static int small_graph(tg_graph *g, tg_model_config *cfg, tg_job *job, tg_err *err, int kind, int *w, int *x, int *y) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->source, sizeof cfg->source, "hand-built");
    tg_graph_init(g, cfg, job, err);
    int64_t four[1] = {4};
    *x = tg_graph_tensor(g, "x", TG_F32, TG_POOL_INPUTS, 1, four);
    *w = tg_param(g, "w", 1, 4, 0, TG_INIT_ZEROS, 0);
    *y = tg_act(g, "y", 1, 4, 0, 0, 0);
    tg_op_spec s = tg_spec(kind);
    s.in[0] = *w, s.in[1] = *x, s.out[0] = *y, s.p.count.n = 4;
    tg_graph_op(g, &s);
    return tg_plan_param_layout(g);
}

/* y [2, k] = x [2, k] w [k, k]: a matmul, whose backward gives w's gradient. */
static int matmul_graph_k(tg_graph *g, tg_model_config *cfg, tg_job *job, tg_err *err, int64_t k, int *w, int *y) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->source, sizeof cfg->source, "hand-built");
    tg_graph_init(g, cfg, job, err);
    int64_t xs[2] = {2, k};
    int x = tg_graph_tensor(g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    *w = tg_param(g, "w", 2, k, k, TG_INIT_ZEROS, 0);
    *y = tg_act(g, "y", 2, 2, k, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = *w, s.out[0] = *y;
    s.p.matmul = (tg_matmul_params){.m = 2, .n = k, .k = k, .batch = 1, .alpha = 1.0f};
    tg_graph_op(g, &s);
    return tg_plan_param_layout(g);
}

static int matmul_graph(tg_graph *g, tg_model_config *cfg, tg_job *job, tg_err *err, int *w, int *y) {
    return matmul_graph_k(g, cfg, job, err, 4, w, y);
}

TG_TEST(test_compiler_passes_stop_on_a_failed_graph) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    job.data_parallel = 2;
    tg_err err = {{0}};
    tg_graph g;
    int w, x, y;
    REQUIRE(small_graph(&g, &cfg, &job, &err, TG_OP_ADD, &w, &x, &y) == 0, "%s", err.msg);
    tg_graph_fail(&g, "first");
    const char *want = "internal compiler error: first";
    int acc = 7, scratch = 7;
    int64_t shape[1] = {4};
    CHECK(tg_autodiff(&g, y) == -1, "autodiff");
    CHECK(tg_gradient_buckets(&g) == -1, "buckets");
    CHECK(tg_zero_gather(&g, w, "gather") == -1, "zero gather");
    CHECK(tg_first_gradient_writes(&g) == -1, "first writes");
    CHECK(tg_plan_param_layout(&g) == -1, "param layout");
    CHECK(tg_plan_fixed_layout(&g) == -1, "fixed layout");
    CHECK(tg_ad_grad_dest(&g, w, &acc) == -1 && tg_ad_grad_dest_or_scratch(&g, w, &acc, &scratch) == -1 &&
              tg_ad_grad_accumulable(&g, y) == -1 && tg_ad_activation(&g, "stat", 1, shape) == -1 &&
              tg_ad_grad_like(&g, y) == -1,
          "gradient bookkeeping");
    CHECK(!strcmp(err.msg, want), "the first message was replaced: '%s'", err.msg);
    CHECK(g.n_ops == 1, "%d ops on a failed graph", g.n_ops);
    tg_graph_free(&g);
}

TG_TEST(test_compiler_autodiff_refusals_and_seed) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    int w, x, y;
    /* The loss is the input itself: nothing trainable below it. */
    REQUIRE(small_graph(&g, &cfg, &job, &err, TG_OP_ADD, &w, &x, &y) == 0, "%s", err.msg);
    CHECK(tg_autodiff(&g, x) == -1 &&
              !strcmp(err.msg, "internal compiler error: loss does not depend on any trainable parameter"),
          "'%s'", err.msg);
    tg_graph_free(&g);
    /* A forward op whose kind has no backward rule. */
    REQUIRE(small_graph(&g, &cfg, &job, &err, TG_OP_TANH_BWD, &w, &x, &y) == 0, "%s", err.msg);
    CHECK(tg_autodiff(&g, y) == -1 && !strcmp(err.msg, "internal compiler error: op tanh_bwd has no backward rule"),
          "'%s'", err.msg);
    tg_graph_free(&g);
    /* Two replicas: the seed is 1/2 (the mean of the replicas' losses). */
    for (int dp = 1; dp <= 2; dp++) {
        job.data_parallel = dp;
        REQUIRE(matmul_graph(&g, &cfg, &job, &err, &w, &y) == 0, "%s", err.msg);
        REQUIRE(tg_autodiff(&g, y) == 0, "%s", err.msg);
        int fills = 0;
        for (int o = 0; o < g.n_ops; o++)
            if (g.ops[o].kind == TG_OP_FILL) {
                fills++;
                CHECK(g.ops[o].p.fill.value == (dp == 2 ? 0.5f : 1.0f), "dp %d: seed %g", dp, g.ops[o].p.fill.value);
            }
        CHECK(fills == 1 && g.ops[1].kind == TG_OP_ZERO && g.ops[1].phase == TG_PHASE_BACKWARD, "dp %d: %d fills", dp, fills);
        CHECK(g.grad[y] >= 0 && g.needs_grad[y] && g.needs_grad[w] && !g.needs_grad[0], "dp %d: gradients", dp);
        tg_graph_free(&g);
    }
}

TG_TEST(test_compiler_gradient_buckets_without_backward) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    int w, x, y;
    /* One replica, or no job: nothing to sum. */
    REQUIRE(small_graph(&g, &cfg, &job, &err, TG_OP_ADD, &w, &x, &y) == 0, "%s", err.msg);
    int ops = g.n_ops;
    CHECK(tg_gradient_buckets(&g) == 0 && g.n_ops == ops, "one replica");
    g.job = NULL;
    CHECK(tg_gradient_buckets(&g) == 0 && g.n_ops == ops, "no job");
    tg_graph_free(&g);
    /* Two replicas but no backward phase. */
    job.data_parallel = 2;
    REQUIRE(small_graph(&g, &cfg, &job, &err, TG_OP_ADD, &w, &x, &y) == 0, "%s", err.msg);
    CHECK(tg_gradient_buckets(&g) == -1 &&
              !strcmp(err.msg, "internal compiler error: data parallelism: no backward to sum gradients after"),
          "'%s'", err.msg);
    tg_graph_free(&g);
    /* Without a ZERO of the gradients there is nothing to narrow. */
    job.data_parallel = 1;
    REQUIRE(small_graph(&g, &cfg, &job, &err, TG_OP_ADD, &w, &x, &y) == 0, "%s", err.msg);
    ops = g.n_ops;
    CHECK(tg_first_gradient_writes(&g) == 0 && g.n_ops == ops, "no zero op");
    tg_graph_free(&g);
}

TG_TEST(test_compiler_span_set_merges) {
    tg_span_set s = {0};
    CHECK(tg_span_set_add(&s, 5, 5) == 0 && tg_span_set_add(&s, 9, 3) == 0 && s.n == 0 && s.v == NULL, "empty spans");
    const uint64_t adds[][2] = {{10, 20}, {30, 40}, {0, 5}, {20, 25}, {50, 60}, {26, 29}, {4, 12}, {70, 80},
                                {90, 95}, {100, 110}, {120, 130}, {140, 150}, {27, 55}};
    for (size_t i = 0; i < sizeof adds / sizeof *adds; i++) REQUIRE(tg_span_set_add(&s, adds[i][0], adds[i][1]) == 0, "add");
    const tg_span want[] = {{0, 25}, {26, 60}, {70, 80}, {90, 95}, {100, 110}, {120, 130}, {140, 150}};
    REQUIRE(s.n == 7, "%d spans", s.n);
    for (int i = 0; i < s.n; i++)
        CHECK(s.v[i].a == want[i].a && s.v[i].b == want[i].b, "span %d: [%llu, %llu)", i, (unsigned long long)s.v[i].a,
              (unsigned long long)s.v[i].b);
    CHECK(s.cap == 16, "cap %d", s.cap);
    tg_span_set_free(&s);
    CHECK(s.v == NULL && s.n == 0 && s.cap == 0, "freed");
    /* A set at the largest capacity it may double from refuses to grow, unchanged. */
    tg_span_set full = {NULL, INT32_MAX / 2 + 1, INT32_MAX / 2 + 1};
    CHECK(tg_span_set_add(&full, 1, 2) == -1 && full.n == INT32_MAX / 2 + 1 && full.v == NULL, "full set");
}

/* The gradient bookkeeping on its edges: no tensor, a tensor needing no gradient (a
 * scratch takes its output), a parameter (its gradient accumulates; commit leaves it), a
 * gradient that is not an accumulable activation, and a contribution of none. */
TG_TEST(test_compiler_gradient_bookkeeping_edges) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    int w, y;
    REQUIRE(matmul_graph(&g, &cfg, &job, &err, &w, &y) == 0, "%s", err.msg);
    REQUIRE(tg_autodiff(&g, y) == 0, "%s", err.msg);
    const int x = 0;
    int acc = 7, scratch = 7;
    CHECK(tg_ad_grad_dest(&g, -1, &acc) == -1 && acc == 0, "no tensor");
    CHECK(tg_ad_grad_dest_or_scratch(&g, -1, &acc, &scratch) == -1 && scratch == 0, "no tensor, no scratch");
    CHECK(tg_ad_grad_dest(&g, x, &acc) == -1 && acc == 0, "an input needs no gradient");
    int s = tg_ad_grad_dest_or_scratch(&g, x, &acc, &scratch);
    CHECK(s >= 0 && scratch == 1 && acc == 0 && !strcmp(g.tensors[s].name, "scratch.d.x") && g.tensors[s].shape[1] == 4 &&
              g.tensors[s].pool == TG_POOL_ACTIVATIONS,
          "scratch %d", s);
    CHECK(tg_ad_grad_dest(&g, w, &acc) == g.tensors[w].grad && acc == 1, "a parameter accumulates into its gradient");
    CHECK(tg_ad_grad_accumulable(&g, -1) == -1 && tg_ad_grad_accumulable(&g, w) == -1 && tg_ad_grad_accumulable(&g, x) == -1,
          "nothing to accumulate into");
    /* y's gradient is the seed, held once: accumulable. Given a parameter's gradient
     * instead (grads pool), it is not. */
    CHECK(tg_ad_grad_accumulable(&g, y) == g.grad[y], "the seed");
    const int seed = g.grad[y];
    g.grad[y] = g.tensors[w].grad;
    CHECK(tg_ad_grad_accumulable(&g, y) == -1, "a gradient in the grads pool");
    g.grad[y] = seed;
    g.tensors[seed].flags |= TG_TENSOR_VIEW;
    CHECK(tg_ad_grad_accumulable(&g, y) == -1, "a view");
    g.tensors[seed].flags &= ~TG_TENSOR_VIEW;
    /* Committing to a parameter changes nothing; passing no gradient records none. */
    const int ops = g.n_ops, holders = g.grad_holders[g.tensors[w].grad];
    tg_ad_commit(&g, w, g.tensors[w].grad);
    CHECK(g.n_ops == ops && g.grad_holders[g.tensors[w].grad] == holders && g.grad[w] == -1, "commit to a parameter");
    tg_ad_commit(&g, x, -1);
    tg_ad_pass(&g, x, -1);
    CHECK(g.grad[x] == -1 && g.n_ops == ops, "no contribution");
    /* A second contribution is summed with ADD into d.y. */
    int extra = tg_ad_grad_like(&g, y);
    tg_ad_pass(&g, y, extra);
    CHECK(g.n_ops == ops + 1 && g.ops[ops].kind == TG_OP_ADD && g.ops[ops].in[0] == seed && g.ops[ops].in[1] == extra &&
              g.grad[y] == g.ops[ops].out[0] && g.grad_holders[seed] == 0 && g.grad_holders[g.grad[y]] == 1,
          "summed");
    tg_graph_free(&g);
}

/* Two replicas with ZeRO-1: the gradients' REDUCE_SCATTER buckets (over the update's
 * slices) cover the whole grads pool, each right after a backward op; ZeRO's gather of the
 * parameters. */
TG_TEST(test_compiler_gradient_buckets_cover_the_pool) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    job.data_parallel = 2;
    job.zero_stage = 1;
    tg_err err = {{0}};
    tg_graph g;
    int w, y;
    REQUIRE(matmul_graph_k(&g, &cfg, &job, &err, 128, &w, &y) == 0, "%s", err.msg);
    REQUIRE(tg_autodiff(&g, y) == 0, "%s", err.msg);
    const int before = g.n_ops;
    REQUIRE(tg_gradient_buckets(&g) == 0, "%s", err.msg);
    const int64_t n = tg_tensor_numel(&g.tensors[g.io.grads_all]);
    int64_t covered = 0;
    int reduces = 0;
    const int64_t slice = tg_zero_slice(&job, n);
    for (int o = 0; o < g.n_ops; o++) {
        if (g.ops[o].kind != TG_OP_REDUCE_SCATTER) continue;
        reduces++;
        const tg_tensor *b = &g.tensors[g.ops[o].in[0]];
        const tg_reduce_scatter_params *p = &g.ops[o].p.reduce_scatter;
        covered += p->n;
        CHECK(b->pool == TG_POOL_GRADS && (b->flags & TG_TENSOR_VIEW) && b->offset % 256 == 0 &&
                  (uint64_t)p->n * 4 == b->bytes && (uint64_t)p->first * 4 == b->offset && p->slice == slice && slice > 0 &&
                  o > 0 && g.ops[o - 1].phase == TG_PHASE_BACKWARD,
              "bucket op %d", o);
    }
    CHECK(n >= 128 * 128 && covered == n && reduces >= 1 && g.n_ops == before + reduces, "%d buckets cover %lld of %lld",
          reduces, (long long)covered, (long long)n);
    /* ZeRO-1: the parameters gathered from the replicas' slices. */
    REQUIRE(tg_zero_gather(&g, g.io.params_all, "params.slices") == 0, "%s", err.msg);
    const tg_op *gather = &g.ops[g.n_ops - 1];
    CHECK(gather->kind == TG_OP_ALL_GATHER && gather->phase == TG_PHASE_OPTIMIZER &&
              gather->p.all_gather.slice == tg_zero_slice(&job, tg_tensor_numel(&g.tensors[g.io.params_all])) &&
              tg_tensor_numel(&g.tensors[gather->out[0]]) == 2 * gather->p.all_gather.slice,
          "gather");
    /* A name too long for the gather's view. */
    char name[200];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = 0;
    CHECK(tg_zero_gather(&g, g.io.params_all, name) == -1 && strstr(err.msg, "tensor name too long"), "'%s'", err.msg);
    tg_graph_free(&g);
}

TG_TEST(test_compiler_zero_slice_and_empty_layout) {
    tg_job job;
    tg_job_defaults(&job);
    CHECK(tg_zero_slice(NULL, 1000) == 0, "no job");
    job.data_parallel = 2, job.zero_stage = 0;
    CHECK(tg_zero_slice(&job, 1000) == 0, "zero_stage 0");
    job.data_parallel = 1, job.zero_stage = 1;
    CHECK(tg_zero_slice(&job, 1000) == 0, "one replica");
    const int64_t align = TG_NORM_BLOCK; /* GRAD_SQUARES' blocks */
    for (int dp = 2; dp <= 8; dp += 3)
        for (int64_t e = 1; e < 50000; e += 7777) {
            job.data_parallel = dp;
            const int64_t s = tg_zero_slice(&job, e), share = (e + dp - 1) / dp;
            CHECK(s % align == 0 && s >= share && s - share < align && s * dp >= e, "dp %d, %lld elements: slice %lld", dp,
                  (long long)e, (long long)s);
        }
    /* A graph without trainable parameters has no parameter layout. */
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, &cfg, &job, &err);
    tg_act(&g, "x", 1, 4, 0, 0, 0);
    CHECK(tg_plan_param_layout(&g) == -1 && !strcmp(err.msg, "internal compiler error: model has no trainable parameters"),
          "'%s'", err.msg);
    tg_graph_free(&g);
}

/* Each allocation of the gradient buckets failing in turn, the tensor table full so that
 * the first bucket's view must grow it. */
TG_TEST(test_compiler_gradient_buckets_out_of_memory) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    job.data_parallel = 2;
    int failures = 0, done = 0;
    for (long k = 0; k < 20 && !done; k++) {
        tg_err err = {{0}};
        tg_graph g;
        int w, y;
        REQUIRE(matmul_graph_k(&g, &cfg, &job, &err, 128, &w, &y) == 0 && tg_autodiff(&g, y) == 0, "%s", err.msg);
        while (g.n_tensors < g.cap_tensors) tg_act(&g, "pad", 1, 1, 0, 0, 0);
        tg_alloc_fail_after(k);
        int rc = tg_gradient_buckets(&g);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            done = 1;
        } else {
            failures++;
            CHECK(rc == -1 && strstr(err.msg, "out of memory compiling model 'hand-built'") == err.msg, "allocation %ld: '%s'",
                  k, err.msg);
            CHECK(g.failed, "allocation %ld: the graph is not failed", k);
        }
        tg_graph_free(&g);
    }
    CHECK(done && failures == 4, "%d allocations failed before one run went through", failures);
}

/* The memory planner refuses an activation that no op reads or writes. */
TG_TEST(test_compiler_memory_plan_unused_activation) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    int w, y;
    REQUIRE(matmul_graph(&g, &cfg, &job, &err, &w, &y) == 0, "%s", err.msg);
    tg_act(&g, "orphan", 1, 4, 0, 0, 0);
    REQUIRE(tg_autodiff(&g, y) == 0 && tg_plan_fixed_layout(&g) == 0, "%s", err.msg);
    int phase_begin[TG_PHASE_COUNT + 1];
    for (int p = 0, o = 0; p <= TG_PHASE_COUNT; p++) {
        while (o < g.n_ops && g.ops[o].phase < p) o++;
        phase_begin[p] = o;
    }
    uint64_t pools[TG_POOL_COUNT], peak = 0;
    int share = 0;
    CHECK(tg_plan_memory(&g, phase_begin, &share, pools, &peak) == -1 &&
              !strcmp(err.msg, "internal compiler error: activation orphan is never used"),
          "'%s'", err.msg);
    tg_graph_free(&g);
}

/* Fills the op table to its capacity with valid ADDs (of two fresh activations). */
static void fill_ops_to_capacity(tg_graph *g) {
    int a = tg_act(g, "pad.a", 1, 2, 0, 0, 0), b = tg_act(g, "pad.b", 1, 2, 0, 0, 0);
    while (g->n_ops < g->cap_ops) {
        tg_op_spec s = tg_spec(TG_OP_ADD);
        s.in[0] = a, s.in[1] = a, s.out[0] = b, s.p.count.n = 2;
        tg_graph_op(g, &s);
    }
}

/* The op table full: a bucket's ALL_REDUCE, or ZeRO's ALL_GATHER, cannot be appended. */
TG_TEST(test_compiler_collective_ops_out_of_memory) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    job.data_parallel = 2;
    job.zero_stage = 1;
    for (int which = 0; which < 2; which++) {
        tg_err err = {{0}};
        tg_graph g;
        int w, y;
        REQUIRE(matmul_graph_k(&g, &cfg, &job, &err, 128, &w, &y) == 0 && tg_autodiff(&g, y) == 0, "%s", err.msg);
        fill_ops_to_capacity(&g);
        REQUIRE(!g.failed && g.n_ops == g.cap_ops && g.n_tensors < g.cap_tensors, "setup: %s", err.msg);
        /* The buckets' own two arrays come first; then the op table's growth fails. */
        tg_alloc_fail_after(which ? 0 : 2);
        int rc = which ? tg_zero_gather(&g, g.io.params_all, "params.slices") : tg_gradient_buckets(&g);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory compiling model 'hand-built'") == err.msg, "which %d: '%s'", which,
              err.msg);
        tg_graph_free(&g);
    }
}

/* Each allocation of the parameter layout failing in turn, with the tensor table one to
 * five entries short of full: the gradient and each whole-pool view in turn must grow it. */
TG_TEST(test_compiler_param_layout_out_of_memory) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    int failures = 0;
    for (int room = 0; room < 5; room++) {
        int done = 0;
        for (long k = 0; k < 10 && !done; k++) {
            memset(&cfg, 0, sizeof cfg);
            snprintf(cfg.source, sizeof cfg.source, "hand-built");
            tg_err err = {{0}};
            tg_graph g;
            tg_graph_init(&g, &cfg, &job, &err);
            int w = tg_param(&g, "w", 1, 8, 0, TG_INIT_ZEROS, 0);
            while (g.n_tensors < 256 - 1 - room) tg_act(&g, "pad", 1, 1, 0, 0, 0);
            tg_alloc_fail_after(k);
            int rc = tg_plan_param_layout(&g);
            tg_alloc_fail_after(-1);
            if (rc == 0) {
                done = 1;
                CHECK(g.tensors[w].grad >= 0 && g.io.params_all >= 0 && g.io.v_all >= 0 &&
                          g.tensors[g.io.v_all].offset == g.tensors[g.io.m_all].bytes,
                      "room %d: layout", room);
            } else {
                failures++;
                CHECK(strstr(err.msg, "out of memory compiling model 'hand-built'") == err.msg, "room %d, allocation %ld: '%s'",
                      room, k, err.msg);
            }
            tg_graph_free(&g);
        }
        CHECK(done, "room %d: never laid out", room);
    }
    CHECK(failures >= 5, "%d failures", failures);
}

/* The first-gradient-writes pass on the matmul graph: the ZERO of the whole grads pool is
 * found past another ZERO and dropped, w's gradient being overwritten before an ADD reads
 * it; with the tensor table full, its allocations failing in turn fail cleanly. */
TG_TEST(test_compiler_first_gradient_writes_edges) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    tg_err err = {{0}};
    tg_graph g;
    int w, y;
    REQUIRE(matmul_graph(&g, &cfg, &job, &err, &w, &y) == 0, "%s", err.msg);
    int scratch = tg_act(&g, "scratch", 1, 2, 0, 0, 0), sum = tg_act(&g, "sum", 1, 2, 0, 0, 0);
    tg_op_spec z = tg_spec(TG_OP_ZERO);
    z.out[0] = scratch;
    REQUIRE(tg_graph_op(&g, &z) == 1, "%s", err.msg);
    REQUIRE(tg_autodiff(&g, y) == 0, "%s", err.msg);
    /* A backward op that reads w's gradient (a view of its first two elements). */
    int64_t two = 2;
    int gv = tg_graph_tensor(&g, "grad.w.head", TG_F32, TG_POOL_GRADS, 1, &two);
    g.tensors[gv].flags |= TG_TENSOR_VIEW;
    g.tensors[gv].offset = g.tensors[g.tensors[w].grad].offset;
    tg_op_spec add = tg_spec(TG_OP_ADD);
    add.in[0] = gv, add.in[1] = scratch, add.out[0] = sum, add.p.count.n = 2;
    REQUIRE(tg_graph_op(&g, &add) >= 0, "%s", err.msg);
    const int n_ops = g.n_ops;
    REQUIRE(tg_first_gradient_writes(&g) == 0, "%s", err.msg);
    int zeros_of_grads = 0, whole = 0;
    for (int o = 0; o < g.n_ops; o++) {
        const tg_op *op = &g.ops[o];
        if (op->kind != TG_OP_ZERO) continue;
        whole += op->out[0] == g.io.grads_all;
        zeros_of_grads += g.tensors[op->out[0]].pool == TG_POOL_GRADS;
    }
    /* The matmul's backward writes all of w's gradient before anything reads it: it
     * overwrites (accumulate off) and no ZERO of the grads pool is left. */
    int matmul_bwd = -1;
    for (int o = 0; o < g.n_ops; o++)
        if (g.ops[o].kind == TG_OP_MATMUL && g.ops[o].phase == TG_PHASE_BACKWARD && g.ops[o].out[0] == g.tensors[w].grad)
            matmul_bwd = o;
    CHECK(whole == 0 && zeros_of_grads == 0 && g.ops[1].kind == TG_OP_ZERO && g.ops[1].out[0] == scratch &&
              g.n_ops == n_ops - 1 && matmul_bwd >= 0 && !g.ops[matmul_bwd].p.matmul.accumulate,
          "whole %d, narrowed %d, %d ops (was %d), dW op %d", whole, zeros_of_grads, g.n_ops, n_ops, matmul_bwd);
    tg_graph_free(&g);
    /* Allocation failures in turn, the tensor table full. */
    int failures = 0, done = 0;
    for (long k = 0; k < 20 && !done; k++) {
        memset(&err, 0, sizeof err);
        REQUIRE(matmul_graph(&g, &cfg, &job, &err, &w, &y) == 0 && tg_autodiff(&g, y) == 0, "%s", err.msg);
        while (g.n_tensors < g.cap_tensors) tg_act(&g, "pad", 1, 1, 0, 0, 0);
        tg_alloc_fail_after(k);
        int rc = tg_first_gradient_writes(&g);
        tg_alloc_fail_after(-1);
        if (rc == 0) done = 1;
        else {
            failures++;
            CHECK(strstr(err.msg, "out of memory compiling model 'hand-built'") == err.msg, "allocation %ld: '%s'", k,
                  err.msg);
        }
        tg_graph_free(&g);
    }
    CHECK(done && failures >= 2, "%d failures, done %d", failures, done);
}

/* y = x w + b (twice: y = (x w + b) w), and parameters t (before w) and u (last) that no op
 * uses. */
static int biased_graph(tg_graph *g, tg_model_config *cfg, tg_job *job, tg_err *err, int twice, int *w, int *b, int *u,
                        int *y) {
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->source, sizeof cfg->source, "hand-built");
    tg_graph_init(g, cfg, job, err);
    int64_t xs[2] = {2, 4};
    int x = tg_graph_tensor(g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    tg_param(g, "t", 1, 4, 0, TG_INIT_ZEROS, 1);
    *w = tg_param(g, "w", 2, 4, 4, TG_INIT_ZEROS, 0);
    *b = tg_param(g, "b", 1, 4, 0, TG_INIT_ZEROS, 1);
    *u = tg_param(g, "u", 1, 4, 0, TG_INIT_ZEROS, 1);
    *y = tg_act(g, "y", 2, 2, 4, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = *w, s.in[2] = *b, s.out[0] = *y;
    s.p.matmul = (tg_matmul_params){.m = 2, .n = 4, .k = 4, .batch = 1, .alpha = 1.0f};
    tg_graph_op(g, &s);
    if (twice) {
        const int y1 = *y;
        *y = tg_act(g, "y2", 2, 2, 4, 0, 0);
        s = tg_spec(TG_OP_MATMUL);
        s.in[0] = y1, s.in[1] = *w, s.out[0] = *y;
        s.p.matmul = (tg_matmul_params){.m = 2, .n = 4, .k = 4, .batch = 1, .alpha = 1.0f};
        tg_graph_op(g, &s);
    }
    if (tg_plan_param_layout(g)) return -1;
    return tg_autodiff(g, *y);
}

/* Bias gradients fused into the weight-gradient matmul (its out1, always written) or in a
 * BIAS_GRAD op (overwriting when first, or already set to); w's gradient written by two
 * matmuls (the first overwrites, the second adds); the gradients of the parameters no op
 * uses are the ranges still cleared, close enough to be one ZERO of a view over both, and
 * that ZERO's view failing for want of memory fails the pass. */
TG_TEST(test_compiler_first_gradient_writes_bias_and_unused) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    for (int variant = 0; variant < 4; variant++) {
        job.fuse_bias_grad = variant == 0 || variant == 3;
        tg_err err = {{0}};
        tg_graph g;
        int w, b, u, y;
        REQUIRE(biased_graph(&g, &cfg, &job, &err, variant == 3, &w, &b, &u, &y) == 0, "%s", err.msg);
        int bias_op = -1;
        for (int o = 0; o < g.n_ops; o++)
            if (g.ops[o].kind == TG_OP_BIAS_GRAD) bias_op = o;
        CHECK((bias_op >= 0) == (variant == 1 || variant == 2), "variant %d: BIAS_GRAD op %d", variant, bias_op);
        if (variant == 2 && bias_op >= 0) g.ops[bias_op].p.bias_grad.overwrite = 1;
        REQUIRE(tg_first_gradient_writes(&g) == 0, "variant %d: %s", variant, err.msg);
        const tg_tensor *gu = &g.tensors[g.tensors[u].grad], *gt = &g.tensors[g.tensors[w - 1].grad]; /* t: made just before w */
        int zeros = 0, over_u = 0;
        for (int o = 0; o < g.n_ops; o++) {
            const tg_op *op = &g.ops[o];
            if (op->kind != TG_OP_ZERO || g.tensors[op->out[0]].pool != TG_POOL_GRADS) continue;
            const tg_tensor *z = &g.tensors[op->out[0]];
            zeros++;
            CHECK(op->out[0] != g.io.grads_all && (z->flags & TG_TENSOR_VIEW), "variant %d: the whole ZERO stayed", variant);
            over_u += z->offset <= gt->offset && z->offset + z->bytes >= gu->offset + gu->bytes;
        }
        CHECK(zeros == 1 && over_u == 1, "variant %d: %d ZEROs, %d over t's and u's gradients", variant, zeros, over_u);
        if (bias_op >= 0) CHECK(g.ops[bias_op].p.bias_grad.overwrite == 1, "variant %d: BIAS_GRAD adds", variant);
        int dw_over = 0, dw_add = 0;
        for (int o = 0; o < g.n_ops; o++)
            if (g.ops[o].kind == TG_OP_MATMUL && g.ops[o].out[0] == g.tensors[w].grad) {
                dw_over += !g.ops[o].p.matmul.accumulate;
                dw_add += g.ops[o].p.matmul.accumulate;
            }
        CHECK(dw_over == 1 && dw_add == (variant == 3), "variant %d: dW %d overwrite, %d add", variant, dw_over, dw_add);
        tg_graph_free(&g);
    }
    /* The narrowed ZERO's view cannot be added: the tensor table is full and cannot grow. */
    job.fuse_bias_grad = 1;
    int failures = 0, done = 0;
    for (long k = 0; k < 20 && !done; k++) {
        tg_err err = {{0}};
        tg_graph g;
        int w, b, u, y;
        REQUIRE(biased_graph(&g, &cfg, &job, &err, 0, &w, &b, &u, &y) == 0, "%s", err.msg);
        while (g.n_tensors < g.cap_tensors) tg_act(&g, "pad", 1, 1, 0, 0, 0);
        tg_alloc_fail_after(k);
        int rc = tg_first_gradient_writes(&g);
        tg_alloc_fail_after(-1);
        if (rc == 0) done = 1;
        else {
            failures++;
            CHECK(strstr(err.msg, "out of memory compiling model 'hand-built'") == err.msg && g.failed, "allocation %ld: '%s'",
                  k, err.msg);
        }
        tg_graph_free(&g);
    }
    CHECK(done && failures >= 3, "%d failures, done %d", failures, done);
}

/* Unused parameters t and u with a 4.3 MiB weight W between them: their gradients are
 * cleared by two ZEROs (more than ZERO_MERGE_BYTES apart, one launch each is cheaper than
 * clearing the gap); with the op table full, appending a ZERO fails cleanly. */
TG_TEST(test_compiler_first_gradient_writes_far_apart) {
    tg_model_config cfg;
    tg_job job;
    tg_job_defaults(&job);
    for (int full_ops = 0; full_ops < 2; full_ops++) {
        int done = 0, failures = 0;
        for (long k = full_ops ? 0 : -1; k < 20 && !done; k++) {
            memset(&cfg, 0, sizeof cfg);
            snprintf(cfg.source, sizeof cfg.source, "hand-built");
            tg_err err = {{0}};
            tg_graph g;
            tg_graph_init(&g, &cfg, &job, &err);
            int64_t xs[2] = {2, 1024};
            int x = tg_graph_tensor(&g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
            int t = tg_param(&g, "t", 1, 4, 0, TG_INIT_ZEROS, 1);
            int w = tg_param(&g, "W", 2, 1024, 1100, TG_INIT_ZEROS, 0);
            int u = tg_param(&g, "u", 1, 4, 0, TG_INIT_ZEROS, 1);
            int y = tg_act(&g, "y", 2, 2, 1100, 0, 0);
            tg_op_spec s = tg_spec(TG_OP_MATMUL);
            s.in[0] = x, s.in[1] = w, s.out[0] = y;
            s.p.matmul = (tg_matmul_params){.m = 2, .n = 1100, .k = 1024, .batch = 1, .alpha = 1.0f};
            tg_graph_op(&g, &s);
            REQUIRE(tg_plan_param_layout(&g) == 0 && tg_autodiff(&g, y) == 0, "%s", err.msg);
            if (full_ops) fill_ops_to_capacity(&g);
            if (k >= 0) tg_alloc_fail_after(k);
            int rc = tg_first_gradient_writes(&g);
            tg_alloc_fail_after(-1);
            if (rc != 0) {
                failures++;
                CHECK(strstr(err.msg, "out of memory compiling model 'hand-built'") == err.msg, "allocation %ld: '%s'", k,
                      err.msg);
                tg_graph_free(&g);
                continue;
            }
            done = 1;
            const tg_tensor *gt = &g.tensors[g.tensors[t].grad], *gu = &g.tensors[g.tensors[u].grad];
            int zeros = 0, over_t = 0, over_u = 0;
            for (int o = 0; o < g.n_ops; o++) {
                const tg_op *op = &g.ops[o];
                if (op->kind != TG_OP_ZERO) continue;
                const tg_tensor *z = &g.tensors[op->out[0]];
                zeros++;
                over_t += z->offset <= gt->offset && z->offset + z->bytes >= gt->offset + gt->bytes && z->bytes < (1u << 20);
                over_u += z->offset <= gu->offset && z->offset + z->bytes >= gu->offset + gu->bytes && z->bytes < (1u << 20);
            }
            CHECK(zeros == 2 && over_t == 1 && over_u == 1 && gu->offset - gt->offset > (4u << 20),
                  "%d ZEROs, over t %d, over u %d", zeros, over_t, over_u);
            tg_graph_free(&g);
        }
        CHECK(done && (full_ops ? failures >= 3 : failures == 0), "full_ops %d: %d failures, done %d", full_ops, failures,
              done);
    }
}
