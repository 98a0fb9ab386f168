/* Backward rules: one per differentiable op kind, emitting the gradient ops of a forward
 * op through the gradient bookkeeping of compiler/grad_state.h. */
#include "compiler/backward_rules.h"
#include "compiler/compiler_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/grad_state.h"

static const tg_op *fwd(tg_graph *g, int index) { return &g->ops[index]; }

static void bwd_embedding(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc, dst = tg_ad_grad_dest(g, op.in[1], &acc);
    if (dst < 0) return;
    if (!acc) {
        tg_graph_fail(g, "embedding table %s is not a parameter", g->tensors[op.in[1]].name);
        return;
    }
    tg_op_spec s = tg_spec(TG_OP_EMBEDDING_BWD);
    s.in[0] = op.in[0];
    s.in[1] = tg_ad_grad_of(g, op.out[0]);
    s.out[0] = dst;
    s.p.embedding = op.p.embedding;
    tg_graph_op(g, &s);
}

static void bwd_add(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int dy = tg_ad_grad_of(g, op.out[0]);
    for (int s = 0; s < 2; s++) {
        if (!g->needs_grad[op.in[s]]) continue;
        if (g->tensors[op.in[s]].flags & TG_TENSOR_PARAM) {
            tg_graph_fail(g, "add of parameter %s directly is not supported", g->tensors[op.in[s]].name);
            return;
        }
        tg_ad_pass(g, op.in[s], dy); /* dy is each input's gradient as it is: no copy */
    }
}

/* Forward ops reading tensor t, counted per input slot. */
static int forward_uses(const tg_graph *g, int t) {
    /* GCOVR_EXCL_BR_START: t is an operand of a forward matmul, made before the index */
    return t >= 0 && t < g->n_indexed_tensors ? g->forward_reads[t] : 0;
    /* GCOVR_EXCL_BR_STOP */
}

int tg_backward_index(tg_graph *g) {
    const int n = g->n_tensors;
    free(g->forward_reads), free(g->gelu_producer), free(g->writes), free(g->last_write);
    g->writes = g->last_write = NULL;
    g->writes_cap = g->ops_indexed = 0;
    g->forward_reads = tg_compiler_calloc((size_t)n + 1, sizeof *g->forward_reads);
    g->gelu_producer = tg_compiler_malloc(sizeof *g->gelu_producer * ((size_t)n + 1));
    if (!g->forward_reads || !g->gelu_producer) return tg_graph_out_of_memory(g);
    g->n_indexed_tensors = n;
    for (int t = 0; t < n; t++) g->gelu_producer[t] = -1;
    for (int o = 0; o < g->n_ops; o++) {
        const tg_op *p = &g->ops[o];
        if (p->phase != TG_PHASE_FORWARD) continue; /* GCOVR_EXCL_BR_LINE: indexed before the first backward op */
        /* tg_graph_op checked each slot names a tensor of the graph (all below n), and a
         * matmul's out0 is required. */
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (p->in[s] >= 0) g->forward_reads[p->in[s]]++;
        if (p->kind == TG_OP_MATMUL && p->p.matmul.activation == TG_MATMUL_ACT_GELU && g->gelu_producer[p->out[0]] < 0)
            g->gelu_producer[p->out[0]] = o;
    }
    return 0;
}

/* Brings the writer counts up to the ops appended since the last call. -1 when out of memory. */
static int index_writes(tg_graph *g) {
    if (g->writes_cap < g->n_tensors) {
        int cap = g->cap_tensors > g->n_tensors ? g->cap_tensors : g->n_tensors;
        int *w = tg_compiler_realloc(g->writes, sizeof *w * (size_t)cap);
        if (!w) return tg_graph_out_of_memory(g);
        g->writes = w;
        int *l = tg_compiler_realloc(g->last_write, sizeof *l * (size_t)cap);
        if (!l) return tg_graph_out_of_memory(g);
        g->last_write = l;
        memset(g->writes + g->writes_cap, 0, sizeof *w * (size_t)(cap - g->writes_cap));
        g->writes_cap = cap;
    }
    for (; g->ops_indexed < g->n_ops; g->ops_indexed++)
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            int t = g->ops[g->ops_indexed].out[s];
            if (t < 0) continue;
            g->writes[t]++;
            g->last_write[t] = g->ops_indexed * TG_OP_MAX_OUT + s;
        }
    return 0;
}

/* Whether the bias gradient of forward matmul `op` may be written by its dB product
 * (MATMUL bias_grad) instead of a BIAS_GRAD: the job allows it, batch 1 (a fused sum covers
 * one batch), and the bias feeds no other forward op, so this is its gradient's only
 * contribution and writing it equals BIAS_GRAD's += into the gradient the backward's ZERO
 * cleared. The dB product always has dC in the summable layout: A stored [K,M] when the
 * weight is stored [N,K] (nn.Linear), B stored [K,N] when it is [K,N] (Conv1D). */
static int bias_grad_fusable(const tg_graph *g, const tg_op *op) {
    /* Accumulated micro-steps add into the gradients: a fused bias sum would overwrite. */
    if (!g->job || !g->job->fuse_bias_grad || g->job->grad_accumulation > 1 || op->p.matmul.batch != 1) return 0;
    return forward_uses(g, op->in[2]) == 1;
}

/* The forward MATMUL with the GELU epilogue (activation 1) whose activation (out0) is the A
 * operand of forward matmul `op`, when `op`'s dA product can apply the GELU backward
 * (activation 2) itself: batch 1, and `op` reads the activation once and is its only reader,
 * so dA is the activation's whole gradient and dA * gelu'(pre) the pre-activation's.
 * -1 when not. */
static int gelu_producer_of_a(const tg_graph *g, const tg_op *op) {
    if (op->p.matmul.batch != 1 || forward_uses(g, op->in[0]) != 1) return -1;
    const int a = op->in[0];
    /* GCOVR_EXCL_BR_START: a is an operand of a forward matmul, made before the index */
    return a >= 0 && a < g->n_indexed_tensors ? g->gelu_producer[a] : -1;
    /* GCOVR_EXCL_BR_STOP */
}

/* The gradient of forward matmul `op`'s product. With the GELU epilogue the product is the
 * pre-activation (out2): its gradient may already hold the consumer's fused dA * gelu'(pre)
 * (MATMUL activation 2); a gradient of the activation (out0) from anywhere else goes through a
 * GELU_BWD on out2 and is added to it. */
static int product_grad(tg_graph *g, const tg_op *op) {
    if (op->p.matmul.activation != TG_MATMUL_ACT_GELU) return tg_ad_grad_of(g, op->out[0]);
    int d_act = tg_ad_grad_of(g, op->out[0]);
    if (d_act >= 0) {
        int acc, d_pre = tg_ad_grad_dest(g, op->out[2], &acc);
        if (d_pre < 0) return -1;
        tg_op_spec s = tg_spec(TG_OP_GELU_BWD);
        s.in[0] = d_act, s.in[1] = op->out[2], s.out[0] = d_pre;
        s.p.gelu_bwd.n = tg_tensor_numel(&g->tensors[op->out[2]]), s.p.gelu_bwd.form = TG_GELU_TANH;
        tg_graph_op(g, &s);
        tg_ad_commit(g, op->out[2], d_pre);
    }
    return tg_ad_grad_of(g, op->out[2]);
}

/* The GELU_BWD that alone writes dc, the gradient of forward matmul `op`'s product, when
 * it can also write the bias gradient (GELU_BWD out1) from the values it makes: batch 1,
 * a bias gradient that may be fused at all, no other writer of dc. -1 when not. */
static int gelu_bwd_writing(tg_graph *g, const tg_op *op, int dc) {
    if (!bias_grad_fusable(g, op) || index_writes(g) || g->writes[dc] != 1) return -1; /* dc: a tensor (bwd_matmul) */
    const int o = g->last_write[dc] / TG_OP_MAX_OUT, s = g->last_write[dc] % TG_OP_MAX_OUT;
    /* GCOVR_EXCL_BR_START: a GELU_BWD writes a product's gradient as its dx (slot 0), and its
     * bias slot only here, for the one matmul whose product gradient that is */
    return g->ops[o].kind == TG_OP_GELU_BWD && s == 0 && g->ops[o].out[1] < 0 ? o : -1;
    /* GCOVR_EXCL_BR_STOP */
}

static void bwd_matmul(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    const tg_matmul_params mm = op.p.matmul;
    int64_t m = mm.m, n = mm.n, k = mm.k, ta = mm.trans_a, tb = mm.trans_b, b = mm.batch;
    int dc = product_grad(g, &op);
    if (dc < 0) {
        tg_graph_fail(g, "matmul %d: its product has no gradient", index);
        return;
    }
    int acc;
    int dbias = -1, acc_bias = 0;
    if (op.in[2] >= 0) {
        dbias = tg_ad_grad_dest(g, op.in[2], &acc_bias);
        if (dbias >= 0 && !acc_bias) {
            tg_graph_fail(g, "matmul bias %s is not a parameter", g->tensors[op.in[2]].name);
            return;
        }
        /* Summed by the GELU backward that makes dc, while dc is in its registers. */
        int gb = dbias >= 0 && b == 1 ? gelu_bwd_writing(g, &op, dc) : -1;
        if (gb >= 0) {
            g->ops[gb].out[1] = dbias;
            g->writes[dbias]++, g->last_write[dbias] = gb * TG_OP_MAX_OUT + 1; /* gb is indexed */
            g->ops[gb].p.gelu_bwd.bias_cols = n;
            dbias = -1;
        }
    }
    /* dA with the producer's GELU backward applied: the pre-activation's gradient. Else dA
     * adds into A's gradient when it already has one that may be updated in place,
     * instead of a fresh tensor and an ADD. */
    int gelu = g->needs_grad[op.in[0]] ? gelu_producer_of_a(g, &op) : -1;
    int a_target = gelu >= 0 ? g->ops[gelu].out[2] : op.in[0];
    int da = gelu < 0 ? tg_ad_grad_accumulable(g, op.in[0]) : -1, into = da >= 0;
    if (into) acc = 1;
    else da = tg_ad_grad_dest(g, a_target, &acc);
    if (da >= 0) {
        tg_op_spec s = tg_spec(TG_OP_MATMUL);
        tg_matmul_params *d = &s.p.matmul;
        if (!ta) { /* dA[M,K] = dC @ op(B)^T */
            s.in[0] = dc, s.in[1] = op.in[1];
            d->m = m, d->n = k, d->k = n, d->trans_a = 0, d->trans_b = !tb;
        } else { /* A stored [K,M]: dA = op(B) @ dC^T */
            s.in[0] = op.in[1], s.in[1] = dc;
            d->m = k, d->n = m, d->k = n, d->trans_a = tb, d->trans_b = 1;
        }
        d->batch = b, d->accumulate = acc, d->alpha = mm.alpha;
        s.out[0] = da;
        if (gelu >= 0) s.in[3] = a_target, d->activation = TG_MATMUL_ACT_GELU_BWD;
        tg_graph_op(g, &s);
        if (!into) tg_ad_commit(g, a_target, da);
    }
    int db = tg_ad_grad_dest(g, op.in[1], &acc);
    if (db >= 0) {
        tg_op_spec s = tg_spec(TG_OP_MATMUL);
        tg_matmul_params *d = &s.p.matmul;
        if (!tb) { /* dB[K,N] = op(A)^T @ dC */
            s.in[0] = op.in[0], s.in[1] = dc;
            d->m = k, d->n = n, d->k = m, d->trans_a = !ta, d->trans_b = 0;
        } else { /* B stored [N,K]: dB = dC^T @ op(A) */
            s.in[0] = dc, s.in[1] = op.in[0];
            d->m = n, d->n = k, d->k = m, d->trans_a = 1, d->trans_b = ta;
        }
        d->batch = b, d->accumulate = acc, d->alpha = mm.alpha;
        s.out[0] = db;
        if (dbias >= 0 && bias_grad_fusable(g, &op)) {
            s.out[1] = dbias;
            d->bias_grad = tb ? 1 : 2; /* dC is A (stored [K=m, M=n]) or B (stored [K=m, N=n]) */
            dbias = -1;
        }
        tg_graph_op(g, &s);
        tg_ad_commit(g, op.in[1], db);
    }
    if (dbias >= 0) {
        tg_op_spec s = tg_spec(TG_OP_BIAS_GRAD);
        s.in[0] = dc, s.out[0] = dbias;
        s.p.bias_grad.m = m * b, s.p.bias_grad.n = n;
        tg_graph_op(g, &s);
    }
}

/* The LayerNorm backwards compute dx, dgamma and dbeta in one pass. Where gamma or beta is
 * frozen, or x needs no gradient (below the lowest trainable parameter), that output goes to
 * a scratch activation nothing reads (tg_ad_grad_dest_or_scratch): the kernels compute the
 * sums in the same pass as dx, so pruning them needs kernel changes. Nothing is emitted
 * when none of the three is needed. */
static int layernorm_outputs(tg_graph *g, int x, int gamma, int beta, int needed, int *dx, int *dgamma, int *dbeta,
                             int *dx_scratch) {
    /* GCOVR_EXCL_BR_START: a rule runs where an output has a gradient, so an input needs one */
    if (!needed && !g->needs_grad[x] && !g->needs_grad[gamma] && !g->needs_grad[beta]) return 0;
    /* GCOVR_EXCL_BR_STOP */
    int acc_x, acc_g, acc_b, sg, sb;
    *dx = tg_ad_grad_dest_or_scratch(g, x, &acc_x, dx_scratch);
    *dgamma = tg_ad_grad_dest_or_scratch(g, gamma, &acc_g, &sg);
    *dbeta = tg_ad_grad_dest_or_scratch(g, beta, &acc_b, &sb);
    if (*dx < 0 || *dgamma < 0 || *dbeta < 0 || acc_x || !(acc_g || sg) || !(acc_b || sb)) return -1;
    return 1;
}

static void bwd_layernorm(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int dx, dgamma, dbeta, dx_scratch;
    int rc = layernorm_outputs(g, op.in[0], op.in[1], op.in[2], 0, &dx, &dgamma, &dbeta, &dx_scratch);
    if (rc < 0) tg_graph_fail(g, "layernorm %d needs an activation input and parameter gamma/beta", index);
    if (rc <= 0) return;
    tg_op_spec s = tg_spec(TG_OP_LAYERNORM_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.in[0], s.in[2] = op.in[1], s.in[3] = op.out[1], s.in[4] = op.out[2];
    s.out[0] = dx, s.out[1] = dgamma, s.out[2] = dbeta;
    s.p.layernorm_bwd.m = op.p.layernorm.m, s.p.layernorm_bwd.d = op.p.layernorm.d;
    tg_graph_op(g, &s);
    if (!dx_scratch) tg_ad_commit(g, op.in[0], dx);
}

/* One RMSNORM_BWD writes dx and dgamma; an x that needs no gradient writes scratch, as for
 * the LayerNorms, and a frozen gamma (LoRA's base) no dgamma at all: the op then skips the
 * column sums, a second pass over dy and x. */
static void bwd_rmsnorm(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc_x, acc_g = 0, dx_scratch;
    int dx = tg_ad_grad_dest_or_scratch(g, op.in[0], &acc_x, &dx_scratch);
    const int frozen = op.in[1] >= 0 && !g->needs_grad[op.in[1]];
    int dgamma = frozen ? -1 : tg_ad_grad_dest(g, op.in[1], &acc_g);
    if (dx < 0 || acc_x || (!frozen && (dgamma < 0 || !acc_g))) {
        tg_graph_fail(g, "rmsnorm %d needs an activation input and a parameter gamma", index);
        return;
    }
    tg_op_spec s = tg_spec(TG_OP_RMSNORM_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.in[0], s.in[2] = op.in[1], s.in[3] = op.out[1];
    s.out[0] = dx, s.out[1] = dgamma;
    s.p.rmsnorm = op.p.rmsnorm;
    tg_graph_op(g, &s);
    if (!dx_scratch) tg_ad_commit(g, op.in[0], dx);
}

/* One RESIDUAL_LAYERNORM_BWD: ds = the LayerNorm backward of dy plus the gradient s
 * already has (GPT-2: the next block's residual), passed on as the residual's gradient
 * without a copy; dx = ds through the forward's dropout mask. ds is a fresh tensor that is
 * no other tensor's gradient, so later contributions to r may accumulate into it. Frozen
 * gamma/beta and an x that needs no gradient write scratch (layernorm_outputs). */
static void bwd_residual_layernorm(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int dy = tg_ad_grad_of(g, op.out[0]), ds_extra = tg_ad_grad_of(g, op.out[1]);
    if (dy < 0 || tg_ad_grad_of(g, op.out[2]) >= 0 || tg_ad_grad_of(g, op.out[3]) >= 0) {
        tg_graph_fail(g, "residual_layernorm %d: y must have a gradient and mean/rstd none", index);
        return;
    }
    if (g->tensors[op.in[1]].flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN)) {
        tg_graph_fail(g, "residual_layernorm %d needs activations x and r and parameters gamma and beta", index);
        return;
    }
    int dx, dgamma, dbeta, dx_scratch;
    /* The residual's gradient (ds) needs the LayerNorm backward even where x, gamma and beta
     * need none. */
    int rc = layernorm_outputs(g, op.in[0], op.in[2], op.in[3], g->needs_grad[op.in[1]], &dx, &dgamma, &dbeta,
                               &dx_scratch);
    if (rc < 0) tg_graph_fail(g, "residual_layernorm %d needs activations x and r and parameters gamma and beta", index);
    if (rc <= 0) return;
    char name[TG_NAME_MAX];
    const tg_tensor *s_t = &g->tensors[op.out[1]];
    snprintf(name, sizeof name, "d.%s", s_t->name);
    int64_t shape[TG_MAX_DIMS];
    memcpy(shape, s_t->shape, sizeof shape);
    int ds = tg_ad_activation(g, name, s_t->ndim, shape);
    if (ds < 0) return;
    tg_op_spec s = tg_spec(TG_OP_RESIDUAL_LAYERNORM_BWD);
    s.in[0] = dy, s.in[1] = op.out[1], s.in[2] = op.in[2], s.in[3] = op.out[2], s.in[4] = op.out[3];
    s.in[5] = ds_extra, s.in[6] = op.in[4];
    s.out[0] = ds, s.out[1] = dx, s.out[2] = dgamma, s.out[3] = dbeta;
    const tg_residual_layernorm_params *f = &op.p.residual_layernorm;
    tg_residual_layernorm_bwd_params *r = &s.p.residual_layernorm_bwd;
    r->m = f->m, r->d = f->d, r->key = f->key, r->eps = f->eps, r->p = f->p;
    tg_graph_op(g, &s);
    if (g->needs_grad[op.in[1]]) tg_ad_pass(g, op.in[1], ds);
    if (!dx_scratch) tg_ad_commit(g, op.in[0], dx);
}

/* Rules of the shape dx = f(dy, saved) for one activation input: s is the backward op
 * with its parameters and in1 (the saved tensor) set; this sets dy and dx. */
static void bwd_pointwise(tg_graph *g, int index, tg_op_spec *s) {
    tg_op op = *fwd(g, index);
    int acc, dx = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dx < 0) return;
    if (acc) {
        tg_graph_fail(g, "%s of a parameter is not supported", tg_op_name(op.kind));
        return;
    }
    s->in[0] = tg_ad_grad_of(g, op.out[0]);
    s->out[0] = dx;
    tg_graph_op(g, s);
    tg_ad_commit(g, op.in[0], dx);
}

static void bwd_gelu(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_GELU_BWD);
    s.in[1] = op->in[0];
    s.p.gelu_bwd.n = op->p.gelu.n, s.p.gelu_bwd.form = op->p.gelu.form;
    bwd_pointwise(g, index, &s);
}
static void bwd_tanh(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_TANH_BWD);
    s.in[1] = op->out[0];
    s.p.count = op->p.count;
    bwd_pointwise(g, index, &s);
}
/* The gradient flows from the dropped probabilities (out1) when the forward has them:
 * the backward op applies the same mask (step in2, key, p) to it on the fly.
 * Without out1 (or when only P has a gradient) it is the plain softmax backward. */
static void bwd_softmax(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int d_probs = tg_ad_grad_of(g, op.out[0]), d_dropped = tg_ad_grad_of(g, op.out[1]);
    if (d_probs >= 0 && d_dropped >= 0) {
        tg_graph_fail(g, "attn_softmax %d: both the probabilities and the dropped probabilities have gradients",
                      index);
        return;
    }
    int acc, dx = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dx < 0) return;
    if (acc) {
        tg_graph_fail(g, "%s of a parameter is not supported", tg_op_name(op.kind));
        return;
    }
    tg_op_spec s = tg_spec(TG_OP_ATTN_SOFTMAX_BWD);
    s.in[0] = d_dropped >= 0 ? d_dropped : d_probs;
    s.in[1] = op.out[0];
    s.out[0] = dx;
    const tg_softmax_params *f = &op.p.softmax;
    tg_softmax_bwd_params *b = &s.p.softmax_bwd;
    b->b = f->b, b->h = f->h, b->t = f->t, b->scale = f->scale;
    if (d_dropped >= 0) { /* else no mask to apply: key and p stay 0 */
        s.in[2] = op.in[2];
        b->key = f->key, b->p = f->p;
    }
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dx);
}
/* One ATTENTION_BWD for the whole op: the gradients of q, k and v (or of packed qkv),
 * plus the row term delta it writes for its own use. It reads the forward's keep bits
 * (not the step counter), so it never draws the dropout mask again. LSE and the bits have
 * no gradient. */
static void bwd_attention(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    if (tg_ad_grad_of(g, op.out[1]) >= 0 || tg_ad_grad_of(g, op.out[2]) >= 0) {
        tg_graph_fail(g, "attention %d: the log-sum-exp or the keep bits have a gradient", index);
        return;
    }
    int parts = op.p.attention.packed ? 1 : 3;
    tg_op_spec s = tg_spec(TG_OP_ATTENTION_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.out[0], s.in[2] = op.out[1], s.in[3] = op.in[3], s.in[4] = op.out[2];
    /* One op writes dq, dk and dv: an input that needs no gradient (a projection whose
     * parameters are frozen, below the lowest trainable one) takes its output in scratch. */
    int scratch[3] = {0, 0, 0};
    for (int p = 0; p < parts; p++) {
        int acc;
        s.in[5 + p] = op.in[p];
        s.out[p] = tg_ad_grad_dest_or_scratch(g, op.in[p], &acc, &scratch[p]);
        if (s.out[p] < 0 || acc) {
            tg_graph_fail(g, "attention %d: input %d must be an activation", index, p);
            return;
        }
    }
    /* Named after the LSE tensor: "<prefix>.lse" gives "<prefix>.delta". */
    char name[TG_NAME_MAX];
    const char *lse = g->tensors[op.out[1]].name, *dot = strrchr(lse, '.');
    snprintf(name, sizeof name, "%.*s.delta", dot ? (int)(dot - lse) : (int)strlen(lse), lse);
    int64_t shape[3] = {op.p.attention.b, op.p.attention.h, op.p.attention.t};
    s.out[3] = tg_ad_activation(g, name, 3, shape);
    s.p.attention = op.p.attention;
    tg_graph_op(g, &s);
    for (int p = 0; p < parts; p++)
        if (!scratch[p]) tg_ad_commit(g, op.in[p], s.out[p]);
}
/* Dropout's gradient is the same mask applied again: the same op, same key and step. */
static void bwd_dropout(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_DROPOUT);
    s.in[1] = op->in[1];
    s.p.dropout = op->p.dropout;
    bwd_pointwise(g, index, &s);
}
/* CONV2D_BWD writes what is needed of dx (an activation's gradient), dweight and dbias
 * (parameter gradients, added into); the image's own gradient is never formed, nor a frozen
 * weight's. */
static void bwd_conv2d(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc_x = 0, acc_w = 1, acc_b = 1;
    const int dx = tg_ad_grad_dest(g, op.in[0], &acc_x), dw = tg_ad_grad_dest(g, op.in[1], &acc_w);
    const int db = op.in[2] >= 0 ? tg_ad_grad_dest(g, op.in[2], &acc_b) : -1;
    if ((dx >= 0 && acc_x) || (dw >= 0 && !acc_w) || (db >= 0 && !acc_b)) {
        tg_graph_fail(g, "conv2d %d needs an activation input and parameter weight and bias", index);
        return;
    }
    if (dx < 0 && dw < 0 && db < 0) return;
    tg_op_spec s = tg_spec(TG_OP_CONV2D_BWD);
    const tg_conv2d_params *p = &op.p.conv2d;
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = dw >= 0 ? op.in[0] : -1;
    s.in[2] = dx >= 0 ? op.in[1] : -1;
    s.out[0] = dx, s.out[1] = dw, s.out[2] = db;
    s.p.conv2d_bwd = (tg_conv2d_bwd_params){p->n, p->c_in, p->h, p->w, p->c_out, p->k, p->stride, p->pad, p->groups, 0};
    tg_graph_op(g, &s);
    if (dx >= 0) tg_ad_commit(g, op.in[0], dx);
    if (dw >= 0) tg_ad_commit(g, op.in[1], dw);
    if (db >= 0) tg_ad_commit(g, op.in[2], db);
}

/* BATCHNORM_BWD (training mode: the batch's statistics, out1 of the forward) writes dx and,
 * where gamma and beta train, their gradients; an x that needs no gradient writes scratch.
 * A fused ReLU6 (relu6) hands the backward the forward's output, which masks dy.
 * The running statistics (out2, out3) take no gradient. */
static void bwd_batchnorm(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc_x, acc_g = 1, acc_b = 1, dx_scratch;
    const int dx = tg_ad_grad_dest_or_scratch(g, op.in[0], &acc_x, &dx_scratch);
    const int dgamma = tg_ad_grad_dest(g, op.in[1], &acc_g), dbeta = tg_ad_grad_dest(g, op.in[2], &acc_b);
    if (dx < 0 || acc_x || (dgamma >= 0 && !acc_g) || (dbeta >= 0 && !acc_b)) {
        tg_graph_fail(g, "batchnorm %d needs an activation input and parameter gamma and beta", index);
        return;
    }
    tg_op_spec s = tg_spec(TG_OP_BATCHNORM_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.in[0], s.in[2] = op.in[1], s.in[3] = op.out[1];
    if (op.p.batchnorm.relu6) s.in[4] = op.out[0]; /* the ReLU6's output masks dy */
    s.out[0] = dx, s.out[1] = dgamma, s.out[2] = dbeta;
    s.p.batchnorm_bwd = (tg_batchnorm_bwd_params){.n = op.p.batchnorm.n, .c = op.p.batchnorm.c,
                                                  .hw = op.p.batchnorm.hw, .eps = op.p.batchnorm.eps,
                                                  .relu6 = op.p.batchnorm.relu6};
    tg_graph_op(g, &s);
    if (!dx_scratch) tg_ad_commit(g, op.in[0], dx);
    if (dgamma >= 0) tg_ad_commit(g, op.in[1], dgamma);
    if (dbeta >= 0) tg_ad_commit(g, op.in[2], dbeta);
}

static void bwd_relu6(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_RELU6_BWD);
    s.in[1] = op->out[0];
    s.p.count = op->p.count;
    bwd_pointwise(g, index, &s);
}

static void bwd_global_avg_pool(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_GLOBAL_AVG_POOL_BWD);
    s.p.avg_pool = op->p.avg_pool;
    bwd_pointwise(g, index, &s);
}

/* One backward op writes the gradients of every activation input of a forward op whose
 * inputs `slots` (n of them) are activations: each input's gradient, or scratch for an
 * input that needs none (a projection of frozen weights, as for the fused attention).
 * s has its parameters and other inputs set; dy goes to in0, the gradients to out0.. */
static void bwd_parts(tg_graph *g, int index, tg_op_spec *s, const int *slots, int n) {
    tg_op op = *fwd(g, index);
    int scratch[3] = {0, 0, 0};
    s->in[0] = tg_ad_grad_of(g, op.out[0]);
    for (int k = 0; k < n; k++) {
        int acc;
        s->out[k] = tg_ad_grad_dest_or_scratch(g, op.in[slots[k]], &acc, &scratch[k]);
        if (s->out[k] < 0 || acc) {
            tg_graph_fail(g, "%s %d: input %d must be an activation", tg_op_name(op.kind), index, slots[k]);
            return;
        }
    }
    tg_graph_op(g, s);
    for (int k = 0; k < n; k++)
        if (!scratch[k]) tg_ad_commit(g, op.in[slots[k]], s->out[k]);
}
/* ROPE_BWD: dqkv, or dq, dk and dv when the projections were made apart. */
static void bwd_rope(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_ROPE_BWD);
    s.in[1] = op->in[1];
    s.p.rope = op->p.rope;
    static const int packed[1] = {0}, apart[3] = {0, 2, 3};
    if (op->in[2] >= 0) bwd_parts(g, index, &s, apart, 3);
    else bwd_parts(g, index, &s, packed, 1);
}
/* SWIGLU_BWD: d gate_up, or d gate and d up when the projections were made apart. */
static void bwd_swiglu(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_SWIGLU_BWD);
    s.in[1] = op->in[0], s.in[2] = op->in[1];
    s.p.swiglu = op->p.swiglu;
    static const int slots[2] = {0, 1};
    bwd_parts(g, index, &s, slots, op->in[1] >= 0 ? 2 : 1);
}
static void bwd_select(tg_graph *g, int index) {
    const tg_op *op = fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_SELECT_TOKEN_BWD);
    s.in[1] = op->in[1];
    s.p.select = op->p.select;
    bwd_pointwise(g, index, &s);
}

static void bwd_heads_split(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc, dx = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dx < 0) return;
    tg_op_spec s = tg_spec(TG_OP_HEADS_MERGE);
    for (int p = 0; p < op.p.heads.parts; p++) {
        s.in[p] = tg_ad_grad_of(g, op.out[p]);
        if (s.in[p] < 0) {
            tg_graph_fail(g, "heads_split %d: part %d has no gradient", index, p);
            return;
        }
    }
    s.out[0] = dx;
    s.p.heads = op.p.heads;
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dx);
}

static void bwd_heads_merge(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_HEADS_SPLIT);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    int acc;
    for (int p = 0; p < op.p.heads.parts; p++) {
        s.out[p] = tg_ad_grad_dest(g, op.in[p], &acc);
        if (s.out[p] < 0 || acc) {
            tg_graph_fail(g, "heads_merge %d: part %d must be an activation needing a gradient", index, p);
            return;
        }
    }
    s.p.heads = op.p.heads;
    tg_graph_op(g, &s);
    for (int p = 0; p < op.p.heads.parts; p++) tg_ad_commit(g, op.in[p], s.out[p]);
}

static void bwd_cross_entropy(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc, dlogits = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dlogits < 0) return;
    tg_op_spec s = tg_spec(TG_OP_CROSS_ENTROPY_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.in[0], s.in[2] = op.in[1], s.in[3] = op.in[2], s.in[4] = op.out[1];
    s.out[0] = dlogits;
    s.p.cross_entropy = op.p.cross_entropy;
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dlogits);
}

static void bwd_span_loss(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc, dlogits = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dlogits < 0) return;
    tg_op_spec s = tg_spec(TG_OP_SPAN_LOSS_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.in[0], s.in[2] = op.in[1], s.in[3] = op.in[2];
    s.out[0] = dlogits;
    s.p.span_loss = op.p.span_loss;
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dlogits);
}

/* ---- the table --------------------------------------------------------------------- */

/* Every op kind names its rule here, NULL where it has no gradient: the table below is
 * generated from plan/ops.def, so a new kind does not compile without its line. */
#define BACKWARD_ZERO NULL
#define BACKWARD_FILL NULL
#define BACKWARD_EMBEDDING bwd_embedding
#define BACKWARD_EMBEDDING_BWD NULL
#define BACKWARD_ADD bwd_add
#define BACKWARD_GELU bwd_gelu
#define BACKWARD_GELU_BWD NULL
#define BACKWARD_TANH bwd_tanh
#define BACKWARD_TANH_BWD NULL
#define BACKWARD_DROPOUT bwd_dropout
#define BACKWARD_MLM_MASK NULL /* ids and labels: nothing to differentiate */
#define BACKWARD_IMAGE_INPUT NULL /* the stored pixels: nothing to differentiate */
#define BACKWARD_MATMUL bwd_matmul
#define BACKWARD_BIAS_GRAD NULL
#define BACKWARD_LAYERNORM bwd_layernorm
#define BACKWARD_LAYERNORM_BWD NULL
#define BACKWARD_RESIDUAL_LAYERNORM bwd_residual_layernorm
#define BACKWARD_RESIDUAL_LAYERNORM_BWD NULL
#define BACKWARD_RMSNORM bwd_rmsnorm
#define BACKWARD_RMSNORM_BWD NULL
#define BACKWARD_ROPE bwd_rope
#define BACKWARD_ROPE_BWD NULL
#define BACKWARD_SWIGLU bwd_swiglu
#define BACKWARD_SWIGLU_BWD NULL
#define BACKWARD_ATTN_SOFTMAX bwd_softmax
#define BACKWARD_ATTN_SOFTMAX_BWD NULL
#define BACKWARD_ATTENTION bwd_attention
#define BACKWARD_ATTENTION_BWD NULL
#define BACKWARD_HEADS_SPLIT bwd_heads_split
#define BACKWARD_HEADS_MERGE bwd_heads_merge
#define BACKWARD_CONV2D bwd_conv2d
#define BACKWARD_CONV2D_BWD NULL
#define BACKWARD_BATCHNORM bwd_batchnorm
#define BACKWARD_BATCHNORM_BWD NULL
#define BACKWARD_RELU6 bwd_relu6
#define BACKWARD_RELU6_BWD NULL
#define BACKWARD_GLOBAL_AVG_POOL bwd_global_avg_pool
#define BACKWARD_GLOBAL_AVG_POOL_BWD NULL
#define BACKWARD_SELECT_TOKEN bwd_select
#define BACKWARD_SELECT_TOKEN_BWD NULL
#define BACKWARD_CROSS_ENTROPY bwd_cross_entropy
#define BACKWARD_CROSS_ENTROPY_BWD NULL
#define BACKWARD_SPAN_LOSS bwd_span_loss
#define BACKWARD_SPAN_LOSS_BWD NULL
#define BACKWARD_SCHEDULE NULL
#define BACKWARD_GRAD_NORM NULL
#define BACKWARD_GRAD_SQUARES NULL
#define BACKWARD_NORM_OF_SQUARES NULL
#define BACKWARD_ADAMW NULL
#define BACKWARD_ADAN NULL
#define BACKWARD_LOSS_SCALE_UPDATE NULL
#define BACKWARD_ALL_REDUCE NULL
#define BACKWARD_REDUCE_SCATTER NULL
#define BACKWARD_ALL_GATHER NULL

static const tg_backward_rule rules[] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) [TG_OP_##KIND] = BACKWARD_##KIND,
#include "plan/ops.def"
};
_Static_assert(sizeof rules / sizeof rules[0] == TG_OP_COUNT, "every op kind needs a backward rule or NULL");

tg_backward_rule tg_backward_rule_of(int kind) { return kind >= 0 && kind < TG_OP_COUNT ? rules[kind] : NULL; }
