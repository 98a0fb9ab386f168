/* tg_gradient_buckets (compiler/grad_buckets.c) against a reference on random hand-built
 * graphs of two replicas: gradients of random sizes at random places of the gradient pool
 * (tensor 0 of the graph among them), created in shuffled order, written by random backward
 * ops in random order (some writing only an activation, one the whole buffer). The
 * reference finds, for each backward op, from where up the gradients are final once it has
 * run, cuts a bucket there when it is 256-byte aligned and at least a bucket's size
 * (n / 8, at least 1024 floats, at most 25 MiB) below the last cut, and the rest after the
 * last op. The pass must give exactly its ALL_REDUCE ops: where, over which view, named
 * after the cut. */
#include <stdio.h>
#include <string.h>

#include "compiler/grad_buckets.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

enum { MAX_GRADS = 8, MAX_OPS = 12 };

static uint64_t next_random(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

typedef struct rig {
    tg_model_config cfg;
    tg_job job;
    tg_err err;
    tg_graph g;
} rig;

/* One graph: gradient k of numel[k] floats at float at[k] (created in the order perm), a
 * buffer of n floats; backward op o (1..n_bwd) writes gradient writes[o - 1], or only an
 * activation when that is n_grads. 0 when it differs from the reference. */
static int run_case(int trial, int n_grads, const int64_t *numel, const int64_t *at, const int *perm, int64_t n,
                    int n_bwd, const int *writes) {
    rig s;
    memset(&s, 0, sizeof s);
    snprintf(s.cfg.source, sizeof s.cfg.source, "hand-built");
    tg_job_defaults(&s.job);
    s.job.data_parallel = 2;
    tg_graph_init(&s.g, &s.cfg, &s.job, &s.err);
    tg_graph *g = &s.g;
    int grad[MAX_GRADS], input[MAX_GRADS];
    for (int i = 0; i < n_grads; i++) {
        const int k = perm[i];
        char name[32];
        snprintf(name, sizeof name, "grad.%d", k);
        grad[k] = tg_graph_tensor(g, name, TG_F32, TG_POOL_GRADS, 1, &numel[k]);
        if (grad[k] >= 0) g->tensors[grad[k]].flags |= TG_TENSOR_GRAD, g->tensors[grad[k]].offset = 4 * (uint64_t)at[k];
    }
    for (int k = 0; k < n_grads; k++) {
        char name[32];
        snprintf(name, sizeof name, "x.%d", k);
        input[k] = tg_graph_tensor(g, name, TG_F32, TG_POOL_INPUTS, 1, &numel[k]);
    }
    const int64_t one = 1;
    const int all = tg_graph_tensor(g, "grads.all", TG_F32, TG_POOL_GRADS, 1, &n);
    const int y = tg_graph_tensor(g, "y", TG_F32, TG_POOL_ACTIVATIONS, 1, &one);
    const int x1 = tg_graph_tensor(g, "x1", TG_F32, TG_POOL_INPUTS, 1, &one);
    if (!CHECK(!g->failed, "trial %d: %s", trial, s.err.msg)) {
        tg_graph_free(g);
        return 0;
    }
    g->io.grads_all = all;
    /* A forward op, then the backward: its first op clears the whole buffer. */
    tg_op_spec op = tg_spec(TG_OP_ADD);
    op.in[0] = op.in[1] = x1, op.out[0] = y, op.p.count.n = 1;
    tg_graph_op(g, &op);
    g->phase = TG_PHASE_BACKWARD;
    op = tg_spec(TG_OP_ZERO);
    op.out[0] = all;
    tg_graph_op(g, &op);
    int64_t write_end[MAX_OPS + 1] = {0}; /* per backward op: the highest gradient float it writes, exclusive */
    for (int o = 1; o <= n_bwd; o++) {
        const int c = writes[o - 1];
        op = tg_spec(TG_OP_ADD);
        if (c == n_grads) { /* an activation only */
            op.in[0] = op.in[1] = x1, op.out[0] = y, op.p.count.n = 1;
        } else {
            op.in[0] = op.in[1] = input[c], op.out[0] = grad[c], op.p.count.n = numel[c];
            write_end[o] = at[c] + numel[c];
        }
        tg_graph_op(g, &op);
    }
    g->phase = TG_PHASE_OPTIMIZER;
    op = tg_spec(TG_OP_ADD);
    op.in[0] = op.in[1] = x1, op.out[0] = y, op.p.count.n = 1;
    tg_graph_op(g, &op);
    if (!CHECK(!g->failed, "trial %d: %s", trial, s.err.msg)) {
        tg_graph_free(g);
        return 0;
    }
    /* The reference: backward ops 0 (the ZERO) .. n_bwd. */
    const int nb = n_bwd + 1;
    int64_t final_from[MAX_OPS + 1], cut[MAX_OPS + 1], later = 0;
    for (int k = nb - 1; k >= 0; k--) {
        final_from[k] = later;
        if (write_end[k] > later) later = write_end[k];
    }
    int64_t bucket = n / 8 > 1024 ? n / 8 : 1024;
    if (bucket > (int64_t)(25u << 20) / 4) bucket = (int64_t)(25u << 20) / 4;
    int64_t upper = n;
    for (int k = 0; k < nb; k++) {
        int64_t lo = k == nb - 1 ? 0 : (final_from[k] + 63) / 64 * 64;
        cut[k] = -1;
        if (lo < upper && (upper - lo >= bucket || k == nb - 1)) cut[k] = lo, upper = lo;
    }
    const int before = g->n_ops;
    if (!CHECK(tg_gradient_buckets(g) == 0, "trial %d: %s", trial, s.err.msg)) {
        tg_graph_free(g);
        return 0;
    }
    /* forward op, then each backward op followed by its bucket's ALL_REDUCE, then the optimizer op */
    int o = 0, ok = CHECK(g->ops[o++].phase == TG_PHASE_FORWARD, "trial %d: the forward op moved", trial);
    int64_t top = n;
    int added = 0;
    for (int k = 0; ok && k < nb; k++) {
        const tg_op *b = &g->ops[o++];
        ok = CHECK(b->kind == (k ? TG_OP_ADD : TG_OP_ZERO) && b->phase == TG_PHASE_BACKWARD,
                   "trial %d: op %d is %s", trial, o - 1, tg_op_name(b->kind));
        if (!ok || cut[k] < 0) continue;
        const tg_op *r = &g->ops[o++];
        const tg_tensor *t = r->out[0] >= 0 ? &g->tensors[r->out[0]] : NULL;
        char name[48];
        snprintf(name, sizeof name, "grads.bucket.%lld", (long long)(cut[k] / 64));
        ok = CHECK(r->kind == TG_OP_ALL_REDUCE && r->phase == TG_PHASE_BACKWARD && t && r->in[0] == r->out[0] &&
                       r->p.count.n == top - cut[k] && !strcmp(t->name, name) && t->pool == TG_POOL_GRADS &&
                       (t->flags & TG_TENSOR_VIEW) && t->offset == 4 * (uint64_t)cut[k] &&
                       tg_tensor_numel(t) == top - cut[k],
                   "trial %d: after backward op %d: %s of %lld at %llu ('%s'), want %s of %lld at %lld", trial, k,
                   tg_op_name(r->kind), (long long)r->p.count.n, t ? (unsigned long long)t->offset : 0ULL,
                   t ? t->name : "", name, (long long)(top - cut[k]), (long long)(4 * cut[k]));
        top = cut[k], added++;
    }
    ok = ok && CHECK(top == 0 && g->n_ops == before + added && g->ops[o].phase == TG_PHASE_OPTIMIZER,
                     "trial %d: buckets end at %lld, %d ops added of %d", trial, (long long)top, added,
                     g->n_ops - before);
    tg_graph_free(g);
    return ok;
}

TG_TEST(test_compiler_grad_buckets_reference_random_graphs) {
    uint64_t rnd = 1127;
    for (int trial = 0; trial < 400; trial++) {
        /* Gradients in the pool in order, each 1..3 x a random size (4 Mi floats every
         * fourth trial, past the 25 MiB cap), some gaps, not always aligned. */
        const int n_grads = 1 + (int)(next_random(&rnd) % MAX_GRADS);
        const int64_t unit = trial % 4 == 3 ? (int64_t)1 << 22 : 1 + (int64_t)(next_random(&rnd) % 700);
        int64_t numel[MAX_GRADS], at[MAX_GRADS], end = 0;
        for (int k = 0; k < n_grads; k++) {
            end += (int64_t)(next_random(&rnd) % 3) * 17;
            numel[k] = unit * (1 + (int64_t)(next_random(&rnd) % 3));
            at[k] = end, end += numel[k];
        }
        int perm[MAX_GRADS], writes[MAX_OPS];
        for (int k = 0; k < n_grads; k++) perm[k] = k;
        for (int k = n_grads - 1; k > 0; k--) {
            int j = (int)(next_random(&rnd) % (uint64_t)(k + 1)), t = perm[k];
            perm[k] = perm[j], perm[j] = t;
        }
        const int64_t n = end + (int64_t)(next_random(&rnd) % 100);
        const int n_bwd = 1 + (int)(next_random(&rnd) % MAX_OPS);
        for (int o = 0; o < n_bwd; o++) writes[o] = (int)(next_random(&rnd) % (uint64_t)(n_grads + 1));
        if (!run_case(trial, n_grads, numel, at, perm, n, n_bwd, writes)) return;
    }
}

/* The edges of a bucket: eight gradients of 1024 floats (n 8192: n / 8 is the 1024 floor)
 * written top down, each cut exactly one bucket below the last; a cut 1023 floats below
 * the top of a 2047-float buffer, one short of a bucket, is not made. */
TG_TEST(test_compiler_grad_buckets_reference_bucket_edges) {
    const int perm[MAX_GRADS] = {3, 0, 6, 1, 7, 2, 5, 4};
    int64_t numel[MAX_GRADS], at[MAX_GRADS];
    int writes[MAX_OPS];
    for (int k = 0; k < 8; k++) numel[k] = 1024, at[k] = 1024 * k, writes[k] = 7 - k;
    run_case(1000, 8, numel, at, perm, 8192, 8, writes);
    numel[0] = 1024, at[0] = 0, numel[1] = 1023, at[1] = 1024;
    const int two[2] = {1, 0}, order[2] = {1, 0};
    run_case(1001, 2, numel, at, two, 2047, 2, order);
}
