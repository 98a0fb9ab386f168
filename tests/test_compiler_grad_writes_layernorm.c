/* tg_first_gradient_writes (compiler/grad_writes.c) on LayerNorm backward ops of
 * hand-built graphs: the first to write a LayerNorm's dgamma and dbeta overwrites them, a
 * second writer of the same gradients adds onto them, and an op already set to overwrite
 * is left so. A LayerNorm over a parameter writes that parameter's gradient as its dx (or
 * ds), which it always overwrites, so that gradient needs no ZERO. */
#include <stdio.h>
#include <string.h>

#include "compiler/grad_state.h"
#include "compiler/grad_writes.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

/* Tensors: gradients dgamma [4] at 0, dbeta [4] at 16, dx [1, 4] at 32, grads.all [12];
 * dy, x, gamma, mean, rstd and an activation dr. Op 0: the ZERO of grads.all. */
typedef struct ln_graph {
    tg_model_config cfg;
    tg_job job;
    tg_err err;
    tg_graph g;
} ln_graph;

enum { DGAMMA, DBETA, DX, ALL, DY, X, GAMMA, MEAN, RSTD, DR };

static int ln_init(ln_graph *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->cfg.source, sizeof s->cfg.source, "hand-built");
    tg_job_defaults(&s->job);
    tg_graph_init(&s->g, &s->cfg, &s->job, &s->err);
    tg_graph *g = &s->g;
    int64_t four[1] = {4}, row[2] = {1, 4}, twelve[1] = {12}, one[1] = {1};
    const struct {
        const char *name;
        int pool, ndim;
        const int64_t *shape;
    } t[] = {
        {"grad.gamma", TG_POOL_GRADS, 1, four}, {"grad.beta", TG_POOL_GRADS, 1, four},
        {"grad.x", TG_POOL_GRADS, 2, row},     {"grads.all", TG_POOL_GRADS, 1, twelve},
        {"dy", TG_POOL_ACTIVATIONS, 2, row},   {"x", TG_POOL_INPUTS, 2, row},
        {"gamma", TG_POOL_INPUTS, 1, four},    {"mean", TG_POOL_ACTIVATIONS, 1, one},
        {"rstd", TG_POOL_ACTIVATIONS, 1, one}, {"dr", TG_POOL_ACTIVATIONS, 2, row},
    };
    for (int k = 0; k < (int)(sizeof t / sizeof t[0]); k++)
        if (!CHECK(tg_graph_tensor(g, t[k].name, TG_F32, t[k].pool, t[k].ndim, t[k].shape) == k, "tensor %d: %s", k,
                   s->err.msg))
            return 0;
    for (int k = DGAMMA; k <= DX; k++) g->tensors[k].flags |= TG_TENSOR_GRAD, g->tensors[k].offset = 16 * (uint64_t)k;
    g->io.grads_all = ALL;
    tg_op_spec z = tg_spec(TG_OP_ZERO);
    z.out[0] = ALL;
    return CHECK(tg_graph_op(g, &z) == 0, "zero: %s", s->err.msg);
}

static void ln_bwd(ln_graph *s, int overwrite) {
    tg_op_spec o = tg_spec(TG_OP_LAYERNORM_BWD);
    o.in[0] = DY, o.in[1] = X, o.in[2] = GAMMA, o.in[3] = MEAN, o.in[4] = RSTD;
    o.out[0] = DX, o.out[1] = DGAMMA, o.out[2] = DBETA;
    o.p.layernorm_bwd.m = 1, o.p.layernorm_bwd.d = 4, o.p.layernorm_bwd.overwrite = overwrite;
    tg_graph_op(&s->g, &o);
}

/* ds (out0) is the parameter's gradient, dx (out1) an activation. */
static void rln_bwd(ln_graph *s, int overwrite) {
    tg_op_spec o = tg_spec(TG_OP_RESIDUAL_LAYERNORM_BWD);
    o.in[0] = DY, o.in[1] = X, o.in[2] = GAMMA, o.in[3] = MEAN, o.in[4] = RSTD;
    o.out[0] = DX, o.out[1] = DR, o.out[2] = DGAMMA, o.out[3] = DBETA;
    tg_residual_layernorm_bwd_params *p = &o.p.residual_layernorm_bwd;
    p->m = 1, p->d = 4, p->eps = 1e-5f, p->overwrite = overwrite;
    tg_graph_op(&s->g, &o);
}

static int64_t overwrite_of(const tg_op *op) {
    return op->kind == TG_OP_LAYERNORM_BWD ? op->p.layernorm_bwd.overwrite : op->p.residual_layernorm_bwd.overwrite;
}

TG_TEST(test_compiler_grad_writes_layernorm_writers) {
    for (int residual = 0; residual < 2; residual++) {
        ln_graph s;
        if (!ln_init(&s)) return;
        void (*op)(ln_graph *, int) = residual ? rln_bwd : ln_bwd;
        op(&s, 0); /* the first writer: overwrites */
        op(&s, 0); /* a second writer: adds */
        op(&s, 1); /* set to overwrite already: stays */
        REQUIRE(!s.g.failed, "%s", s.err.msg);
        REQUIRE(tg_first_gradient_writes(&s.g) == 0, "%s", s.err.msg);
        /* Every gradient is written whole by the first op before anything reads it: no ZERO. */
        if (!CHECK(s.g.n_ops == 3, "%s: %d ops, want the 3 backward ops (no ZERO)", residual ? "residual" : "plain",
                   s.g.n_ops))
            continue;
        const int want[3] = {1, 0, 1};
        for (int k = 0; k < 3; k++)
            CHECK(overwrite_of(&s.g.ops[k]) == want[k], "%s op %d: overwrite %lld, want %d",
                  tg_op_name(s.g.ops[k].kind), k, (long long)overwrite_of(&s.g.ops[k]), want[k]);
        tg_graph_free(&s.g);
    }
}
