/* tg_first_gradient_writes (compiler/grad_writes.c) against a float-by-float reference on
 * random hand-built graphs: gradients of 4 floats laid out in runs of three touching ones,
 * the runs exactly 4 MiB apart (not merged), 4 MiB less 4 bytes (merged) and 8 MiB, and
 * created in shuffled order; random ADD and BIAS_GRAD ops reading and writing them. The reference tracks per
 * float whether it is written and whether it must be cleared; the pass must give exactly
 * its ZERO spans (in offset order, runs less than 4 MiB apart merged) and exactly its
 * choice of which BIAS_GRAD overwrites. */
#include <stdio.h>
#include <string.h>

#include "compiler/grad_state.h"
#include "compiler/grad_writes.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

enum { N_GRADS = 12, RUN = 3, FLOATS = 4 };
#define MERGE_BYTES ((uint64_t)4 << 20)
#define RUN_BYTES ((uint64_t)RUN * FLOATS * 4)
/* Where each run starts: gaps of exactly MERGE_BYTES, MERGE_BYTES - 4 and 2 * MERGE_BYTES. */
static const uint64_t k_run_start[N_GRADS / RUN] = {
    0, RUN_BYTES + MERGE_BYTES, 2 * RUN_BYTES + 2 * MERGE_BYTES - 4, 3 * RUN_BYTES + 4 * MERGE_BYTES - 4};

static uint64_t next_random(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

typedef struct span {
    uint64_t a, b;
} span;

typedef struct reference {
    uint64_t offset[N_GRADS];
    unsigned char written[N_GRADS][FLOATS], zero[N_GRADS][FLOATS];
} reference;

/* Marks tensor k's floats not yet written as to clear. */
static void ref_clear(reference *r, int k) {
    for (int i = 0; i < FLOATS; i++)
        if (!r->written[k][i]) r->zero[k][i] = 1;
}

static int ref_any_written(const reference *r, int k) {
    int any = 0;
    for (int i = 0; i < FLOATS; i++) any |= r->written[k][i];
    return any;
}

/* The reference's spans: the floats to clear in offset order, runs merged as the pass does. */
static int ref_spans(const reference *r, span *out) {
    int order[N_GRADS], n = 0;
    for (int k = 0; k < N_GRADS; k++) order[k] = k;
    for (int i = 1; i < N_GRADS; i++)
        for (int j = i; j > 0 && r->offset[order[j]] < r->offset[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    for (int i = 0; i < N_GRADS; i++) {
        const int k = order[i];
        for (int f = 0; f < FLOATS; f++) {
            if (!r->zero[k][f]) continue;
            const uint64_t a = r->offset[k] + 4 * (uint64_t)f, b = a + 4;
            if (n && out[n - 1].b == a) out[n - 1].b = b;           /* the same run */
            else if (n && a - out[n - 1].b < MERGE_BYTES) out[n - 1].b = b; /* merged over the gap */
            else out[n++] = (span){a, b};
        }
    }
    return n;
}

typedef struct rig {
    tg_model_config cfg;
    tg_job job;
    tg_err err;
    tg_graph g;
    int grad[N_GRADS]; /* tensor of gradient k */
    int all, x, y;
} rig;

static int rig_init(rig *s, reference *r, uint64_t *rnd) {
    memset(s, 0, sizeof *s);
    memset(r, 0, sizeof *r);
    snprintf(s->cfg.source, sizeof s->cfg.source, "hand-built");
    tg_job_defaults(&s->job);
    tg_graph_init(&s->g, &s->cfg, &s->job, &s->err);
    int perm[N_GRADS];
    for (int k = 0; k < N_GRADS; k++) perm[k] = k;
    for (int k = N_GRADS - 1; k > 0; k--) {
        int j = (int)(next_random(rnd) % (uint64_t)(k + 1)), t = perm[k];
        perm[k] = perm[j], perm[j] = t;
    }
    int64_t four[1] = {FLOATS};
    for (int i = 0; i < N_GRADS; i++) { /* created in shuffled order */
        const int k = perm[i];
        char name[32];
        snprintf(name, sizeof name, "grad.%d", k);
        s->grad[k] = tg_graph_tensor(&s->g, name, TG_F32, TG_POOL_GRADS, 1, four);
        if (s->grad[k] < 0) break;
        r->offset[k] = k_run_start[k / RUN] + (uint64_t)(k % RUN) * 4 * FLOATS;
        s->g.tensors[s->grad[k]].flags |= TG_TENSOR_GRAD;
        s->g.tensors[s->grad[k]].offset = r->offset[k];
    }
    int64_t all_n[1] = {(int64_t)((r->offset[N_GRADS - 1] + 4 * FLOATS) / 4)};
    s->all = tg_graph_tensor(&s->g, "grads.all", TG_F32, TG_POOL_GRADS, 1, all_n);
    s->x = tg_graph_tensor(&s->g, "x", TG_F32, TG_POOL_INPUTS, 1, four);
    s->y = tg_graph_tensor(&s->g, "y", TG_F32, TG_POOL_ACTIVATIONS, 1, four);
    if (!CHECK(!s->g.failed, "setup: %s", s->err.msg)) return 0;
    s->g.tensors[s->all].offset = 0;
    s->g.io.grads_all = s->all;
    tg_op_spec z = tg_spec(TG_OP_ZERO);
    z.out[0] = s->all;
    return CHECK(tg_graph_op(&s->g, &z) == 0, "zero: %s", s->err.msg);
}

/* Any of the gradients, x or y, as an operand; -k - 1 names gradient k in the reference. */
static int pick(rig *s, uint64_t *rnd, int *which) {
    int c = (int)(next_random(rnd) % (N_GRADS + 2));
    *which = c < N_GRADS ? c : -1;
    return c < N_GRADS ? s->grad[c] : c == N_GRADS ? s->x : s->y;
}

TG_TEST(test_compiler_grad_writes_reference_random_graphs) {
    uint64_t rnd = 20261126;
    for (int trial = 0; trial < 300; trial++) {
        rig s;
        reference r;
        if (!rig_init(&s, &r, &rnd)) {
            tg_graph_free(&s.g);
            return;
        }
        const int n_ops = 1 + (int)(next_random(&rnd) % 14);
        int want_overwrite[16] = {0}, kind[16];
        for (int o = 0; o < n_ops; o++) {
            int ia, ib, out;
            int a = pick(&s, &rnd, &ia), b = pick(&s, &rnd, &ib);
            const int bias = next_random(&rnd) % 2;
            do out = (int)(next_random(&rnd) % (N_GRADS + 1)); /* a gradient, or y */
            while (out < N_GRADS && (out == ia || out == ib));
            const int t_out = out < N_GRADS ? s.grad[out] : s.y;
            /* The reference: gradients read first are cleared where unwritten. */
            if (ia >= 0) ref_clear(&r, ia);
            if (!bias && ib >= 0) ref_clear(&r, ib);
            tg_op_spec op = tg_spec(bias ? TG_OP_BIAS_GRAD : TG_OP_ADD);
            op.in[0] = a, op.out[0] = t_out;
            if (bias) {
                op.p.bias_grad.m = 1, op.p.bias_grad.n = FLOATS;
                /* += into a gradient nothing has written overwrites instead; so does one into
                 * an activation (a scratch sum nobody else adds to). */
                want_overwrite[o] = out == N_GRADS || !ref_any_written(&r, out);
                if (out < N_GRADS && !want_overwrite[o]) ref_clear(&r, out);
            } else {
                op.in[1] = b, op.p.count.n = FLOATS;
            }
            if (out < N_GRADS) memset(r.written[out], 1, FLOATS);
            kind[o] = op.kind;
            REQUIRE(tg_graph_op(&s.g, &op) == o + 1, "trial %d op %d: %s", trial, o, s.err.msg);
        }
        for (int k = 0; k < N_GRADS; k++) ref_clear(&r, k); /* nothing writes them: they stay zero */
        span want[N_GRADS * FLOATS];
        const int n_spans = ref_spans(&r, want);
        REQUIRE(tg_first_gradient_writes(&s.g) == 0, "trial %d: %s", trial, s.err.msg);
        int ok = CHECK(s.g.n_ops == n_spans + n_ops, "trial %d: %d ops, want %d ZERO and %d others", trial, s.g.n_ops,
                       n_spans, n_ops);
        /* Each ZERO right before the first other op touching its span (where the old one
         * was, op 0, when none does); the other ops in their order. */
        int zeros_seen = 0, others_seen = 0;
        for (int i = 0; ok && i < s.g.n_ops; i++) {
            const tg_op *op = &s.g.ops[i];
            if (op->kind != TG_OP_ZERO) {
                ok = CHECK(others_seen < n_ops && op->kind == kind[others_seen] &&
                               (op->kind != TG_OP_BIAS_GRAD || op->p.bias_grad.overwrite == want_overwrite[others_seen]),
                           "trial %d: op %d is %s overwrite %lld, want %s overwrite %d", trial, others_seen,
                           tg_op_name(op->kind), (long long)op->p.bias_grad.overwrite, tg_op_name(kind[others_seen]),
                           others_seen < n_ops ? want_overwrite[others_seen] : -1);
                others_seen++;
                continue;
            }
            const tg_tensor *t = op->out[0] >= 0 ? &s.g.tensors[op->out[0]] : NULL;
            int k = -1;
            if (t) sscanf(t->name, "grads.zero.%d", &k);
            ok = CHECK(t && k >= 0 && k < n_spans && t->offset == want[k].a && t->bytes == want[k].b - want[k].a &&
                           (t->flags & TG_TENSOR_VIEW) && op->phase == s.g.phase,
                       "trial %d: zero %s over [%llu, %llu), want [%llu, %llu) of the %d spans", trial,
                       t ? t->name : "?", t ? (unsigned long long)t->offset : 0ULL,
                       t ? (unsigned long long)(t->offset + t->bytes) : 0ULL,
                       k >= 0 && k < n_spans ? (unsigned long long)want[k].a : 0ULL,
                       k >= 0 && k < n_spans ? (unsigned long long)want[k].b : 0ULL, n_spans);
            if (!ok) break;
            zeros_seen++;
            /* The first other op after it that touches its span, and none before it. */
            int first_touch = -1;
            for (int j = 0; j < s.g.n_ops && first_touch < 0; j++) {
                const tg_op *q = &s.g.ops[j];
                if (q->kind == TG_OP_ZERO) continue;
                for (int sl = 0; sl < TG_OP_MAX_IN + TG_OP_MAX_OUT && first_touch < 0; sl++) {
                    const int u = sl < TG_OP_MAX_IN ? q->in[sl] : q->out[sl - TG_OP_MAX_IN];
                    if (u < 0 || s.g.tensors[u].pool != TG_POOL_GRADS) continue;
                    const tg_tensor *x = &s.g.tensors[u];
                    if (x->offset < t->offset + t->bytes && t->offset < x->offset + x->bytes) first_touch = j;
                }
            }
            int next_other = i + 1;
            while (next_other < s.g.n_ops && s.g.ops[next_other].kind == TG_OP_ZERO) next_other++;
            ok = CHECK(first_touch < 0 ? i < n_spans : next_other == first_touch,
                       "trial %d: %s at op %d, its span first touched at op %d", trial, t->name, i, first_touch);
        }
        ok = ok && CHECK(zeros_seen == n_spans && others_seen == n_ops, "trial %d: %d zeros and %d others", trial,
                         zeros_seen, others_seen);
        tg_graph_free(&s.g);
        if (!ok) return;
    }
}

/* Four touching gradients, the last (highest) one never written: one ZERO over exactly it. */
TG_TEST(test_compiler_grad_writes_reference_last_of_touching_run) {
    tg_model_config cfg;
    tg_job job;
    tg_err err = {{0}};
    tg_graph g;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.source, sizeof cfg.source, "hand-built");
    tg_job_defaults(&job);
    tg_graph_init(&g, &cfg, &job, &err);
    int64_t four[1] = {4}, sixteen[1] = {16};
    int grad[4];
    for (int k = 0; k < 4; k++) {
        char name[16];
        snprintf(name, sizeof name, "g%d", k);
        grad[k] = tg_graph_tensor(&g, name, TG_F32, TG_POOL_GRADS, 1, four);
        if (grad[k] >= 0) g.tensors[grad[k]].flags |= TG_TENSOR_GRAD, g.tensors[grad[k]].offset = 16 * (uint64_t)k;
    }
    int all = tg_graph_tensor(&g, "grads.all", TG_F32, TG_POOL_GRADS, 1, sixteen);
    int x = tg_graph_tensor(&g, "x", TG_F32, TG_POOL_INPUTS, 1, four);
    REQUIRE(!g.failed, "%s", err.msg);
    g.io.grads_all = all;
    tg_op_spec z = tg_spec(TG_OP_ZERO);
    z.out[0] = all;
    tg_graph_op(&g, &z);
    for (int k = 0; k < 3; k++) {
        tg_op_spec a = tg_spec(TG_OP_ADD);
        a.in[0] = a.in[1] = x, a.out[0] = grad[k], a.p.count.n = 4;
        tg_graph_op(&g, &a);
    }
    REQUIRE(!g.failed && tg_first_gradient_writes(&g) == 0, "%s", err.msg);
    const tg_tensor *t = g.ops[0].out[0] >= 0 ? &g.tensors[g.ops[0].out[0]] : NULL;
    CHECK(g.n_ops == 4 && g.ops[0].kind == TG_OP_ZERO && t && t->offset == 48 && t->shape[0] == 4 &&
              !strcmp(t->name, "grads.zero.0"),
          "%d ops, the first %s over [%llu, +%lld floats)", g.n_ops, tg_op_name(g.ops[0].kind),
          t ? (unsigned long long)t->offset : 0ULL, t ? (long long)t->shape[0] : 0LL);
    for (int k = 1; k < g.n_ops; k++) CHECK(g.ops[k].kind == TG_OP_ADD, "op %d is %s", k, tg_op_name(g.ops[k].kind));
    tg_graph_free(&g);
}
