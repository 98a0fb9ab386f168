/* The compiler's op table: shape rule, FLOPs, backward rule and gradient contract for
 * every op kind. */
#include "compiler/op_table.h"

#include <stdio.h>
#include <string.h>

#include "compiler/autodiff.h"

static int64_t numel(const tg_graph *g, int t) {
    return t < 0 ? -1 : tg_tensor_numel(&g->tensors[t]);
}

#define EXPECT(cond, msg) \
    do {                  \
        if (!(cond)) return msg; \
    } while (0)

/* ---- shape rules ------------------------------------------------------------------- */

static const char *shape_zero(const tg_graph *g, const tg_op *op) {
    EXPECT(op->out[0] >= 0, "needs an output");
    return NULL;
}

static const char *shape_embedding(const tg_graph *g, const tg_op *op) {
    int64_t n = op->i[0], v = op->i[1], d = op->i[2];
    EXPECT(g->tensors[op->in[0]].dtype == TG_I32, "ids must be i32");
    EXPECT(numel(g, op->in[0]) == n, "ids count != N");
    if (op->kind == TG_OP_EMBEDDING) {
        EXPECT(numel(g, op->in[1]) == v * d, "table != V*D");
        EXPECT(numel(g, op->out[0]) == n * d, "output != N*D");
    } else {
        EXPECT(numel(g, op->in[1]) == n * d, "dout != N*D");
        EXPECT(numel(g, op->out[0]) == v * d, "dtable != V*D");
    }
    return NULL;
}

static const char *shape_add(const tg_graph *g, const tg_op *op) {
    EXPECT(numel(g, op->in[0]) == op->i[0] && numel(g, op->in[1]) == op->i[0] &&
               numel(g, op->out[0]) == op->i[0],
           "operands differ in size");
    return NULL;
}

static const char *shape_matmul(const tg_graph *g, const tg_op *op) {
    int64_t m = op->i[0], n = op->i[1], k = op->i[2], b = op->i[5];
    EXPECT(m > 0 && n > 0 && k > 0 && b > 0, "non-positive dims");
    EXPECT(numel(g, op->in[0]) == b * m * k, "A != batch*M*K");
    EXPECT(numel(g, op->in[1]) == b * k * n, "B != batch*K*N");
    EXPECT(numel(g, op->out[0]) == b * m * n, "C != batch*M*N");
    EXPECT(op->in[2] < 0 || numel(g, op->in[2]) == n, "bias != N");
    /* The fused bias gradient: the sums over k of dC, which must be stored [K, M] as A or
     * [K, N] as B, so that it is the stored operand's column sums. */
    int64_t bg = op->i[7];
    EXPECT(bg >= 0 && bg <= 2, "bias gradient i[7] must be 0, 1 or 2");
    EXPECT((op->out[1] >= 0) == (bg != 0), "out1 present exactly when i[7] != 0");
    if (bg) {
        EXPECT(b == 1 && op->in[2] < 0, "a bias gradient needs batch 1 and no bias input");
        EXPECT(bg == 1 ? op->i[3] != 0 : op->i[4] == 0, "a bias gradient sums A stored [K,M] or B stored [K,N]");
        EXPECT(g->tensors[op->out[1]].dtype == TG_F32, "bias gradient must be f32");
        EXPECT(numel(g, op->out[1]) == (bg == 1 ? m : n), "bias gradient != M (i[7]=1) or N (i[7]=2)");
    }
    /* The activation epilogue: the pre-activation it writes (GELU) or reads (GELU backward)
     * is shaped like out0. */
    int64_t act = op->i[8];
    EXPECT(act >= TG_MATMUL_ACT_NONE && act <= TG_MATMUL_ACT_GELU_BWD, "activation i[8] must be 0, 1 or 2");
    EXPECT((op->out[2] >= 0) == (act == TG_MATMUL_ACT_GELU), "out2 present exactly when i[8] = 1");
    EXPECT((op->in[3] >= 0) == (act == TG_MATMUL_ACT_GELU_BWD), "in3 present exactly when i[8] = 2");
    if (act) {
        EXPECT(b == 1, "an activation epilogue needs batch 1");
        EXPECT(!op->i[6] && !bg, "an activation epilogue takes no accumulate (i[6]) and no bias gradient (i[7])");
        EXPECT(act == TG_MATMUL_ACT_GELU || op->in[2] < 0, "the GELU backward epilogue takes no bias");
        int pre = act == TG_MATMUL_ACT_GELU ? op->out[2] : op->in[3];
        EXPECT(numel(g, pre) == m * n, "pre-activation != M*N");
    }
    for (int s = 4; s < TG_OP_MAX_IN; s++) EXPECT(op->in[s] < 0, "unused inputs must be -1");
    EXPECT(op->out[3] < 0, "unused outputs must be -1");
    return NULL;
}

static const char *shape_bias_grad(const tg_graph *g, const tg_op *op) {
    EXPECT(numel(g, op->in[0]) == op->i[0] * op->i[1], "dout != M*N");
    EXPECT(numel(g, op->out[0]) == op->i[1], "dbias != N");
    return NULL;
}

static const char *shape_layernorm(const tg_graph *g, const tg_op *op) {
    int64_t m = op->i[0], d = op->i[1];
    int bwd = op->kind == TG_OP_LAYERNORM_BWD;
    int x = bwd ? op->in[1] : op->in[0], gamma = bwd ? op->in[2] : op->in[1];
    int mean = bwd ? op->in[3] : op->out[1], rstd = bwd ? op->in[4] : op->out[2];
    EXPECT(numel(g, x) == m * d, "x != M*D");
    EXPECT(numel(g, gamma) == d, "gamma != D");
    EXPECT(numel(g, mean) == m && numel(g, rstd) == m, "mean/rstd != M");
    EXPECT(numel(g, op->out[0]) == m * d, "y/dx != M*D");
    if (bwd) {
        EXPECT(numel(g, op->in[0]) == m * d, "dy != M*D");
        EXPECT(numel(g, op->out[1]) == d && numel(g, op->out[2]) == d, "dgamma/dbeta != D");
    } else {
        EXPECT(numel(g, op->in[2]) == d, "beta != D");
    }
    return NULL;
}

/* Both residual LayerNorm ops: [M,D] operands, fp32 row statistics, and the dropout's
 * step counter present whenever p > 0. */
static const char *shape_residual_layernorm(const tg_graph *g, const tg_op *op) {
    int64_t m = op->i[0], d = op->i[1];
    int bwd = op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD;
    EXPECT(m > 0 && d > 0, "non-positive dims");
    EXPECT(op->f[1] >= 0.0f && op->f[1] < 1.0f, "dropout p outside [0, 1)");
    int gamma = op->in[2], mean = bwd ? op->in[3] : op->out[2], rstd = bwd ? op->in[4] : op->out[3];
    int step = bwd ? op->in[6] : op->in[4];
    EXPECT(numel(g, gamma) == d, "gamma != D");
    EXPECT(numel(g, mean) == m && numel(g, rstd) == m, "mean/rstd != M");
    EXPECT(g->tensors[mean].dtype == TG_F32 && g->tensors[rstd].dtype == TG_F32, "mean/rstd must be f32");
    EXPECT(step < 0 || numel(g, step) == 1, "step counter is not a scalar");
    EXPECT(op->f[1] <= 0.0f || step >= 0, "dropout needs the step counter");
    EXPECT(numel(g, op->in[0]) == m * d && numel(g, op->in[1]) == m * d, bwd ? "dy/s != M*D" : "x/r != M*D");
    EXPECT(numel(g, op->out[0]) == m * d && numel(g, op->out[1]) == m * d, bwd ? "ds/dx != M*D" : "y/s != M*D");
    if (bwd) {
        EXPECT(op->in[5] < 0 || numel(g, op->in[5]) == m * d, "ds_extra != M*D");
        EXPECT(numel(g, op->out[2]) == d && numel(g, op->out[3]) == d, "dgamma/dbeta != D");
        EXPECT(op->in[7] < 0, "unused input 7 must be -1");
    } else {
        EXPECT(numel(g, op->in[3]) == d, "beta != D");
        for (int s = 5; s < TG_OP_MAX_IN; s++) EXPECT(op->in[s] < 0, "unused inputs must be -1");
    }
    return NULL;
}

/* Elementwise ops: every input and the output hold i[0] elements. */
static const char *shape_unary(const tg_graph *g, const tg_op *op) {
    for (int s = 0; s < TG_OP_MAX_IN && op->in[s] >= 0; s++)
        EXPECT(numel(g, op->in[s]) == op->i[0], "input size != i[0]");
    EXPECT(numel(g, op->out[0]) == op->i[0], "output size != i[0]");
    if (op->kind == TG_OP_GELU_BWD) {
        const int64_t n = op->i[2];
        EXPECT((op->out[1] >= 0) == (n > 0), "out1 (the bias gradient) present exactly when i[2] > 0");
        EXPECT(n <= 0 || (op->i[0] % n == 0 && numel(g, op->out[1]) == n), "bias gradient != i[2] columns of dx");
        EXPECT(n <= 0 || g->tensors[op->out[1]].dtype == TG_F32, "bias gradient must be fp32");
    } else {
        EXPECT(op->out[1] < 0, "one output");
    }
    return NULL;
}

static const char *shape_dropout(const tg_graph *g, const tg_op *op) {
    EXPECT(numel(g, op->in[0]) == op->i[0] && numel(g, op->out[0]) == op->i[0], "size != i[0]");
    EXPECT(numel(g, op->in[1]) == 1, "step counter is not a scalar");
    EXPECT(op->f[0] >= 0.0f && op->f[0] < 1.0f, "p outside [0, 1)");
    return NULL;
}

/* Both softmax ops; in2 (optional) is the dropout step counter, f[1] the dropout p. */
static const char *shape_softmax(const tg_graph *g, const tg_op *op) {
    int64_t b = op->i[0], h = op->i[1], t = op->i[2];
    EXPECT(numel(g, op->in[0]) == b * h * t * t && numel(g, op->out[0]) == b * h * t * t,
           "scores != B*H*T*T");
    if (op->kind == TG_OP_ATTN_SOFTMAX) {
        EXPECT(op->in[1] < 0 || numel(g, op->in[1]) == b * t, "mask != B*T");
        EXPECT(op->out[1] < 0 || numel(g, op->out[1]) == b * h * t * t, "dropped probs != B*H*T*T");
        EXPECT(op->out[1] < 0 || op->f[1] <= 0.0f || op->in[2] >= 0, "dropout needs the step counter");
    } else {
        EXPECT(numel(g, op->in[1]) == b * h * t * t, "probs != B*H*T*T");
    }
    EXPECT(op->in[2] < 0 || numel(g, op->in[2]) == 1, "step counter is not a scalar");
    EXPECT(op->f[1] >= 0.0f && op->f[1] < 1.0f, "dropout p outside [0, 1)");
    return NULL;
}

/* Both fused attention ops. q/k/v are [B*T, H*Dh] (or qkv [B*T, 3*H*Dh] when packed),
 * the key mask [B,T] optional. With dropout (p > 0) the forward reads the step counter and
 * writes the keep bits int32 [B,H,T,ceil(T/32)], which the backward reads in its place. */
static const char *shape_attention(const tg_graph *g, const tg_op *op) {
    int64_t b = op->i[0], h = op->i[1], t = op->i[2], dh = op->i[6];
    int packed = op->i[5] != 0, bwd = op->kind == TG_OP_ATTENTION_BWD;
    EXPECT(b > 0 && h > 0 && t > 0 && dh > 0, "non-positive dims");
    EXPECT(op->i[5] == 0 || op->i[5] == 1, "packed must be 0 or 1");
    int64_t rows = b * t, d = h * dh;
    /* Where q/k/v (or qkv) sit: forward in0..in2, backward in5..in7. */
    const int *qkv = bwd ? op->in + 5 : op->in;
    if (packed) {
        EXPECT(numel(g, qkv[0]) == rows * 3 * d, "qkv != B*T*3*H*Dh");
        EXPECT(qkv[1] < 0 && qkv[2] < 0, "packed attention takes one qkv input");
    } else {
        for (int s = 0; s < 3; s++) EXPECT(numel(g, qkv[s]) == rows * d, "q/k/v != B*T*H*Dh");
    }
    EXPECT(op->in[3] < 0 || numel(g, op->in[3]) == rows, "mask != B*T");
    EXPECT(op->f[1] >= 0.0f && op->f[1] < 1.0f, "dropout p outside [0, 1)");
    int drop = op->f[1] > 0.0f, bits = bwd ? op->in[4] : op->out[2];
    EXPECT((bits >= 0) == drop, "keep bits present exactly when p > 0");
    EXPECT(bits < 0 || (g->tensors[bits].dtype == TG_I32 && numel(g, bits) == b * h * t * ((t + 31) / 32)),
           "keep bits != B*H*T*ceil(T/32) (i32)");
    if (!bwd) {
        EXPECT(op->in[4] < 0 || numel(g, op->in[4]) == 1, "step counter is not a scalar");
        EXPECT(!drop || op->in[4] >= 0, "dropout needs the step counter");
        EXPECT(op->in[5] < 0 && op->in[6] < 0 && op->in[7] < 0, "unused inputs must be -1");
        EXPECT(numel(g, op->out[0]) == rows * d, "O != B*T*H*Dh");
        EXPECT(numel(g, op->out[1]) == b * h * t, "LSE != B*H*T");
        return NULL;
    }
    EXPECT(numel(g, op->in[0]) == rows * d && numel(g, op->in[1]) == rows * d, "dO/O != B*T*H*Dh");
    EXPECT(numel(g, op->in[2]) == b * h * t, "LSE != B*H*T");
    for (int s = 0; s < (packed ? 1 : 3); s++)
        EXPECT(numel(g, op->out[s]) == numel(g, qkv[s]), "dq/dk/dv differ from q/k/v in size");
    EXPECT(!packed || (op->out[1] < 0 && op->out[2] < 0), "packed attention has one input gradient");
    EXPECT(numel(g, op->out[3]) == b * h * t, "delta != B*H*T");
    return NULL;
}

static const char *shape_heads(const tg_graph *g, const tg_op *op) {
    int64_t b = op->i[0], t = op->i[1], h = op->i[2], dh = op->i[3], p = op->i[4];
    EXPECT(p >= 1 && p <= 3, "P must be 1..3");
    const int *parts = op->kind == TG_OP_HEADS_SPLIT ? op->out : op->in;
    int whole = op->kind == TG_OP_HEADS_SPLIT ? op->in[0] : op->out[0];
    EXPECT(numel(g, whole) == b * t * p * h * dh, "packed != B*T*P*H*Dh");
    for (int s = 0; s < p; s++) EXPECT(numel(g, parts[s]) == b * h * t * dh, "part != B*H*T*Dh");
    return NULL;
}

static const char *shape_select(const tg_graph *g, const tg_op *op) {
    int64_t b = op->i[0], t = op->i[1], d = op->i[2];
    int full = op->kind == TG_OP_SELECT_TOKEN ? op->in[0] : op->out[0];
    int rows = op->kind == TG_OP_SELECT_TOKEN ? op->out[0] : op->in[0];
    EXPECT(numel(g, full) == b * t * d, "x != B*T*D");
    EXPECT(numel(g, rows) == b * d, "rows != B*D");
    EXPECT(numel(g, op->in[1]) == b * t, "ids != B*T");
    return NULL;
}

static const char *shape_cross_entropy(const tg_graph *g, const tg_op *op) {
    int64_t n = op->i[0], c = op->i[1];
    int bwd = op->kind == TG_OP_CROSS_ENTROPY_BWD;
    int logits = bwd ? op->in[1] : op->in[0], labels = bwd ? op->in[2] : op->in[1];
    EXPECT(numel(g, logits) == n * c, "logits != N*C");
    EXPECT(numel(g, labels) == n && g->tensors[labels].dtype == TG_I32, "labels != N (i32)");
    EXPECT(numel(g, bwd ? op->out[0] : op->in[0]) == n * c || !bwd, "dlogits != N*C");
    EXPECT(numel(g, bwd ? op->in[0] : op->out[0]) == 1, "loss is not a scalar");
    return NULL;
}

static const char *shape_schedule(const tg_graph *g, const tg_op *op) {
    EXPECT(numel(g, op->in[0]) == 1 && numel(g, op->in[1]) == 1, "scalars expected");
    EXPECT(numel(g, op->out[0]) == 1 && op->out[1] == op->in[0], "lr scalar; step updated in place");
    return NULL;
}

static const char *shape_grad_norm(const tg_graph *g, const tg_op *op) {
    EXPECT(g->tensors[op->in[0]].flags & TG_TENSOR_VIEW, "input must be the grads view");
    EXPECT(numel(g, op->out[0]) == 1, "norm is a scalar");
    EXPECT(numel(g, op->in[0]) == op->i[0], "i[0] != gradient count");
    return NULL;
}

static const char *shape_all_reduce(const tg_graph *g, const tg_op *op) {
    EXPECT(op->in[0] >= 0 && op->in[0] == op->out[0], "works in place: in0 and out0 are one tensor");
    EXPECT(g->tensors[op->in[0]].dtype == TG_F32, "sums fp32 tensors");
    EXPECT(numel(g, op->in[0]) == op->i[0], "i[0] != element count");
    return NULL;
}

static const char *shape_all_gather(const tg_graph *g, const tg_op *op) {
    EXPECT(op->in[0] >= 0 && op->in[0] == op->out[0], "works in place: in0 and out0 are one tensor");
    EXPECT(g->tensors[op->in[0]].dtype == TG_F32 || g->tensors[op->in[0]].dtype == TG_BF16, "gathers fp32 or bf16");
    EXPECT(op->i[0] > 0 && g->job && numel(g, op->in[0]) == op->i[0] * g->job->data_parallel,
           "the tensor is not data_parallel slices of i[0] elements");
    return NULL;
}

static const char *shape_adamw(const tg_graph *g, const tg_op *op) {
    int64_t n = numel(g, op->in[0]), state = op->i[1] > 0 ? op->i[1] : n;
    EXPECT(numel(g, op->out[0]) == n && numel(g, op->out[1]) == state && numel(g, op->out[2]) == state,
           "params, grads, m and v views differ in size");
    EXPECT(op->i[1] == 0 || (g->job && op->i[1] * (int64_t)g->job->data_parallel >= n),
           "i[1]: the replicas' slices do not cover the parameters");
    EXPECT(n == op->i[0], "i[0] != parameter count");
    EXPECT(numel(g, op->in[1]) == 1 && numel(g, op->in[2]) == 1 && numel(g, op->in[3]) == 1,
           "lr, step and norm are scalars");
    return NULL;
}

/* ---- FLOPs ------------------------------------------------------------------------- */

static double flops_none(const tg_op *op) { return 0; }
static double flops_gelu(const tg_op *op);
/* The product, the bias add, the fused bias gradient's sums (BIAS_GRAD's count) and the
 * activation epilogue's (GELU's or GELU_BWD's count). */
static double flops_matmul(const tg_op *op) {
    double sums = op->i[7] == 1 ? (double)op->i[2] * op->i[0] : op->i[7] == 2 ? (double)op->i[2] * op->i[1] : 0;
    tg_op act = {.kind = TG_OP_GELU, .i = {op->i[0] * op->i[1] * op->i[5], TG_GELU_TANH}};
    return 2.0 * (double)op->i[0] * (double)op->i[1] * (double)op->i[2] * (double)op->i[5] +
           (op->in[2] >= 0 ? (double)op->i[0] * op->i[1] * op->i[5] : 0) + sums + (op->i[8] ? flops_gelu(&act) : 0);
}
static double flops_n(const tg_op *op) { return (double)op->i[0]; }
static double flops_embedding_bwd(const tg_op *op) { return (double)op->i[0] * op->i[2]; }
static double flops_bias_grad(const tg_op *op) { return (double)op->i[0] * op->i[1]; }
static double flops_layernorm(const tg_op *op) { return 8.0 * op->i[0] * op->i[1]; }
static double flops_layernorm_bwd(const tg_op *op) { return 12.0 * op->i[0] * op->i[1]; }
/* GELU_BWD's fused bias gradient (i[2]) adds BIAS_GRAD's count. */
static double flops_gelu(const tg_op *op) {
    return 10.0 * op->i[0] + (op->kind == TG_OP_GELU_BWD && op->i[2] > 0 ? (double)op->i[0] : 0);
}
/* LAYERNORM's or LAYERNORM_BWD's count, plus one per element for the residual add (the
 * backward's ds_extra) and one for the dropout's multiply: what the separate ops counted. */
static double flops_residual_layernorm(const tg_op *op) {
    int bwd = op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD;
    double per = (bwd ? 12.0 : 8.0) + (bwd ? op->in[5] >= 0 : 1) + (op->f[1] > 0.0f);
    return per * op->i[0] * op->i[1];
}
/* 5 per element, plus the fused dropout's multiply (what a DROPOUT op counted). */
static double flops_softmax(const tg_op *op) {
    int drop = op->f[1] > 0.0f && (op->kind == TG_OP_ATTN_SOFTMAX ? op->out[1] >= 0 : op->in[2] >= 0);
    return (5.0 + drop) * op->i[0] * op->i[1] * op->i[2] * op->i[2];
}
/* Useful work only: QK^T and PV are 2*T*T*Dh each per (b, h), half of it under a causal
 * mask; the backward recomputes the scores and forms dV, dP, dQ and dK: twice the forward. */
static double flops_attention(const tg_op *op) {
    double f = 4.0 * op->i[0] * op->i[1] * op->i[2] * op->i[2] * op->i[6];
    if (op->i[3]) f *= 0.5;
    return op->kind == TG_OP_ATTENTION_BWD ? 2.0 * f : f;
}
static double flops_cross_entropy(const tg_op *op) { return 4.0 * op->i[0] * op->i[1]; }
static double flops_grad_norm(const tg_op *op) { return 2.0 * op->i[0]; }
static double flops_adamw(const tg_op *op) { return 16.0 * op->i[0]; }
static double flops_all_reduce(const tg_op *op) { return (double)op->i[0]; }

/* ---- backward rules ---------------------------------------------------------------- */

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
    memcpy(s.i, op.i, sizeof s.i);
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
    int uses = 0;
    for (int o = 0; o < g->n_ops; o++)
        for (int s = 0; s < TG_OP_MAX_IN; s++) uses += g->ops[o].phase == TG_PHASE_FORWARD && g->ops[o].in[s] == t;
    return uses;
}

/* Whether the bias gradient of forward matmul `op` may be written by its dB product
 * (MATMUL i[7]) instead of a BIAS_GRAD: the job allows it, batch 1 (a fused sum covers
 * one batch), and the bias feeds no other forward op, so this is its gradient's only
 * contribution and writing it equals BIAS_GRAD's += into the gradient the backward's ZERO
 * cleared. The dB product always has dC in the summable layout: A stored [K,M] when the
 * weight is stored [N,K] (nn.Linear), B stored [K,N] when it is [K,N] (Conv1D). */
static int bias_grad_fusable(const tg_graph *g, const tg_op *op) {
    if (!g->job || !g->job->fuse_bias_grad || op->i[5] != 1) return 0;
    return forward_uses(g, op->in[2]) == 1;
}

/* The forward MATMUL with the GELU epilogue (i[8] = 1) whose activation (out0) is the A
 * operand of forward matmul `op`, when `op`'s dA product can apply the GELU backward
 * (i[8] = 2) itself: batch 1, and `op` reads the activation once and is its only reader,
 * so dA is the activation's whole gradient and dA * gelu'(pre) the pre-activation's.
 * -1 when not. */
static int gelu_producer_of_a(const tg_graph *g, const tg_op *op) {
    if (op->i[5] != 1 || forward_uses(g, op->in[0]) != 1) return -1;
    for (int o = 0; o < g->n_ops; o++) {
        const tg_op *p = &g->ops[o];
        if (p->phase == TG_PHASE_FORWARD && p->kind == TG_OP_MATMUL && p->i[8] == TG_MATMUL_ACT_GELU &&
            p->out[0] == op->in[0])
            return o;
    }
    return -1;
}

/* The gradient of forward matmul `op`'s product. With the GELU epilogue the product is the
 * pre-activation (out2): its gradient may already hold the consumer's fused dA * gelu'(pre)
 * (MATMUL i[8] = 2); a gradient of the activation (out0) from anywhere else goes through a
 * GELU_BWD on out2 and is added to it. */
static int product_grad(tg_graph *g, const tg_op *op) {
    if (op->i[8] != TG_MATMUL_ACT_GELU) return tg_ad_grad_of(g, op->out[0]);
    int d_act = tg_ad_grad_of(g, op->out[0]);
    if (d_act >= 0) {
        int acc, d_pre = tg_ad_grad_dest(g, op->out[2], &acc);
        if (d_pre < 0) return -1;
        tg_op_spec s = tg_spec(TG_OP_GELU_BWD);
        s.in[0] = d_act, s.in[1] = op->out[2], s.out[0] = d_pre;
        s.i[0] = tg_tensor_numel(&g->tensors[op->out[2]]), s.i[1] = TG_GELU_TANH;
        tg_graph_op(g, &s);
        tg_ad_commit(g, op->out[2], d_pre);
    }
    return tg_ad_grad_of(g, op->out[2]);
}

/* The GELU_BWD that alone writes dc, the gradient of forward matmul `op`'s product, when
 * it can also write the bias gradient (GELU_BWD out1) from the values it makes: batch 1,
 * a bias gradient that may be fused at all, no other writer of dc. -1 when not. */
static int gelu_bwd_writing(const tg_graph *g, const tg_op *op, int dc) {
    if (!bias_grad_fusable(g, op)) return -1;
    int writer = -1;
    for (int o = 0; o < g->n_ops; o++)
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (g->ops[o].out[s] == dc) {
                if (writer >= 0 || g->ops[o].kind != TG_OP_GELU_BWD || s != 0 || g->ops[o].out[1] >= 0) return -1;
                writer = o;
            }
    return writer;
}

static void bwd_matmul(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int64_t m = op.i[0], n = op.i[1], k = op.i[2], ta = op.i[3], tb = op.i[4], b = op.i[5];
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
            g->ops[gb].i[2] = n;
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
        if (!ta) { /* dA[M,K] = dC @ op(B)^T */
            s.in[0] = dc, s.in[1] = op.in[1];
            s.i[0] = m, s.i[1] = k, s.i[2] = n, s.i[3] = 0, s.i[4] = !tb;
        } else { /* A stored [K,M]: dA = op(B) @ dC^T */
            s.in[0] = op.in[1], s.in[1] = dc;
            s.i[0] = k, s.i[1] = m, s.i[2] = n, s.i[3] = tb, s.i[4] = 1;
        }
        s.i[5] = b, s.i[6] = acc, s.f[0] = op.f[0];
        s.out[0] = da;
        if (gelu >= 0) s.in[3] = a_target, s.i[8] = TG_MATMUL_ACT_GELU_BWD;
        tg_graph_op(g, &s);
        if (!into) tg_ad_commit(g, a_target, da);
    }
    int db = tg_ad_grad_dest(g, op.in[1], &acc);
    if (db >= 0) {
        tg_op_spec s = tg_spec(TG_OP_MATMUL);
        if (!tb) { /* dB[K,N] = op(A)^T @ dC */
            s.in[0] = op.in[0], s.in[1] = dc;
            s.i[0] = k, s.i[1] = n, s.i[2] = m, s.i[3] = !ta, s.i[4] = 0;
        } else { /* B stored [N,K]: dB = dC^T @ op(A) */
            s.in[0] = dc, s.in[1] = op.in[0];
            s.i[0] = n, s.i[1] = k, s.i[2] = m, s.i[3] = 1, s.i[4] = ta;
        }
        s.i[5] = b, s.i[6] = acc, s.f[0] = op.f[0];
        s.out[0] = db;
        if (dbias >= 0 && bias_grad_fusable(g, &op)) {
            s.out[1] = dbias;
            s.i[7] = tb ? 1 : 2; /* dC is A (stored [K=m, M=n]) or B (stored [K=m, N=n]) */
            dbias = -1;
        }
        tg_graph_op(g, &s);
        tg_ad_commit(g, op.in[1], db);
    }
    if (dbias >= 0) {
        tg_op_spec s = tg_spec(TG_OP_BIAS_GRAD);
        s.in[0] = dc, s.out[0] = dbias;
        s.i[0] = m * b, s.i[1] = n;
        tg_graph_op(g, &s);
    }
}

static void bwd_layernorm(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc_x, acc_g, acc_b;
    int dx = tg_ad_grad_dest(g, op.in[0], &acc_x);
    int dgamma = tg_ad_grad_dest(g, op.in[1], &acc_g);
    int dbeta = tg_ad_grad_dest(g, op.in[2], &acc_b);
    if (dx < 0 || acc_x || dgamma < 0 || !acc_g || dbeta < 0 || !acc_b) {
        tg_graph_fail(g, "layernorm %d needs an activation input and parameter gamma/beta", index);
        return;
    }
    tg_op_spec s = tg_spec(TG_OP_LAYERNORM_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.in[0], s.in[2] = op.in[1], s.in[3] = op.out[1], s.in[4] = op.out[2];
    s.out[0] = dx, s.out[1] = dgamma, s.out[2] = dbeta;
    memcpy(s.i, op.i, sizeof s.i);
    memcpy(s.f, op.f, sizeof s.f);
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dx);
}

/* One RESIDUAL_LAYERNORM_BWD: ds = the LayerNorm backward of dy plus the gradient s
 * already has (GPT-2: the next block's residual), passed on as the residual's gradient
 * without a copy; dx = ds through the forward's dropout mask. ds is a fresh tensor that is
 * no other tensor's gradient, so later contributions to r may accumulate into it. */
static void bwd_residual_layernorm(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int dy = tg_ad_grad_of(g, op.out[0]), ds_extra = tg_ad_grad_of(g, op.out[1]);
    if (dy < 0 || tg_ad_grad_of(g, op.out[2]) >= 0 || tg_ad_grad_of(g, op.out[3]) >= 0) {
        tg_graph_fail(g, "residual_layernorm %d: y must have a gradient and mean/rstd none", index);
        return;
    }
    int acc_x, acc_g, acc_b;
    int dx = tg_ad_grad_dest(g, op.in[0], &acc_x);
    int dgamma = tg_ad_grad_dest(g, op.in[2], &acc_g);
    int dbeta = tg_ad_grad_dest(g, op.in[3], &acc_b);
    if (dx < 0 || acc_x || dgamma < 0 || !acc_g || dbeta < 0 || !acc_b ||
        (g->tensors[op.in[1]].flags & TG_TENSOR_PARAM)) {
        tg_graph_fail(g, "residual_layernorm %d needs activations x and r and parameters gamma and beta", index);
        return;
    }
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
    memcpy(s.i, op.i, sizeof s.i);
    memcpy(s.f, op.f, sizeof s.f);
    tg_graph_op(g, &s);
    if (g->needs_grad[op.in[1]]) tg_ad_pass(g, op.in[1], ds);
    tg_ad_commit(g, op.in[0], dx);
}

/* Rules of the shape dx = f(dy, saved) for one activation input. */
static void bwd_pointwise(tg_graph *g, int index, int kind, int saved) {
    tg_op op = *fwd(g, index);
    int acc, dx = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dx < 0) return;
    if (acc) {
        tg_graph_fail(g, "%s of a parameter is not supported", tg_op_name(op.kind));
        return;
    }
    tg_op_spec s = tg_spec(kind);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = saved;
    s.out[0] = dx;
    memcpy(s.i, op.i, sizeof s.i);
    memcpy(s.f, op.f, sizeof s.f);
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dx);
}

static void bwd_gelu(tg_graph *g, int index) { bwd_pointwise(g, index, TG_OP_GELU_BWD, g->ops[index].in[0]); }
static void bwd_tanh(tg_graph *g, int index) { bwd_pointwise(g, index, TG_OP_TANH_BWD, g->ops[index].out[0]); }
/* The gradient flows from the dropped probabilities (out1) when the forward has them:
 * the backward op applies the same mask (step in2, key i[4], p f[1]) to it on the fly.
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
    memcpy(s.i, op.i, sizeof s.i);
    memcpy(s.f, op.f, sizeof s.f);
    if (d_dropped >= 0) {
        s.in[2] = op.in[2];
    } else { /* no mask to apply */
        s.i[4] = 0;
        s.f[1] = 0.0f;
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
    int parts = op.i[5] ? 1 : 3;
    tg_op_spec s = tg_spec(TG_OP_ATTENTION_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.out[0], s.in[2] = op.out[1], s.in[3] = op.in[3], s.in[4] = op.out[2];
    for (int p = 0; p < parts; p++) {
        int acc;
        s.in[5 + p] = op.in[p];
        s.out[p] = tg_ad_grad_dest(g, op.in[p], &acc);
        if (s.out[p] < 0 || acc) {
            tg_graph_fail(g, "attention %d: input %d must be an activation needing a gradient", index, p);
            return;
        }
    }
    /* Named after the LSE tensor: "<prefix>.lse" gives "<prefix>.delta". */
    char name[TG_NAME_MAX];
    const char *lse = g->tensors[op.out[1]].name, *dot = strrchr(lse, '.');
    snprintf(name, sizeof name, "%.*s.delta", dot ? (int)(dot - lse) : (int)strlen(lse), lse);
    int64_t shape[3] = {op.i[0], op.i[1], op.i[2]};
    s.out[3] = tg_ad_activation(g, name, 3, shape);
    memcpy(s.i, op.i, sizeof s.i);
    memcpy(s.f, op.f, sizeof s.f);
    tg_graph_op(g, &s);
    for (int p = 0; p < parts; p++) tg_ad_commit(g, op.in[p], s.out[p]);
}
/* Dropout's gradient is the same mask applied again: the same op, same key and step. */
static void bwd_dropout(tg_graph *g, int index) { bwd_pointwise(g, index, TG_OP_DROPOUT, g->ops[index].in[1]); }
static void bwd_select(tg_graph *g, int index) {
    bwd_pointwise(g, index, TG_OP_SELECT_TOKEN_BWD, g->ops[index].in[1]);
}

static void bwd_heads_split(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc, dx = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dx < 0) return;
    tg_op_spec s = tg_spec(TG_OP_HEADS_MERGE);
    for (int p = 0; p < op.i[4]; p++) {
        s.in[p] = tg_ad_grad_of(g, op.out[p]);
        if (s.in[p] < 0) {
            tg_graph_fail(g, "heads_split %d: part %d has no gradient", index, p);
            return;
        }
    }
    s.out[0] = dx;
    memcpy(s.i, op.i, sizeof s.i);
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dx);
}

static void bwd_heads_merge(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    tg_op_spec s = tg_spec(TG_OP_HEADS_SPLIT);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    int acc;
    for (int p = 0; p < op.i[4]; p++) {
        s.out[p] = tg_ad_grad_dest(g, op.in[p], &acc);
        if (s.out[p] < 0 || acc) {
            tg_graph_fail(g, "heads_merge %d: part %d must be an activation needing a gradient", index, p);
            return;
        }
    }
    memcpy(s.i, op.i, sizeof s.i);
    tg_graph_op(g, &s);
    for (int p = 0; p < op.i[4]; p++) tg_ad_commit(g, op.in[p], s.out[p]);
}

static void bwd_cross_entropy(tg_graph *g, int index) {
    tg_op op = *fwd(g, index);
    int acc, dlogits = tg_ad_grad_dest(g, op.in[0], &acc);
    if (dlogits < 0) return;
    tg_op_spec s = tg_spec(TG_OP_CROSS_ENTROPY_BWD);
    s.in[0] = tg_ad_grad_of(g, op.out[0]);
    s.in[1] = op.in[0], s.in[2] = op.in[1];
    s.out[0] = dlogits;
    memcpy(s.i, op.i, sizeof s.i);
    tg_graph_op(g, &s);
    tg_ad_commit(g, op.in[0], dlogits);
}

/* ---- the table --------------------------------------------------------------------- */

#define W TG_WRITE
#define A TG_ACCUMULATE
static const tg_op_row rows[TG_OP_COUNT] = {
    [TG_OP_ZERO] = {shape_zero, flops_none, NULL, {W}},
    [TG_OP_FILL] = {shape_zero, flops_none, NULL, {W}},
    [TG_OP_EMBEDDING] = {shape_embedding, flops_none, bwd_embedding, {W}},
    [TG_OP_EMBEDDING_BWD] = {shape_embedding, flops_embedding_bwd, NULL, {A}},
    [TG_OP_ADD] = {shape_add, flops_n, bwd_add, {W}},
    /* out0 += when i[6]; out1 (i[7]) is a bias gradient, written: its only contribution;
     * out2 (i[8] = 1) the pre-activation. */
    [TG_OP_MATMUL] = {shape_matmul, flops_matmul, bwd_matmul, {W, W, W}},
    [TG_OP_BIAS_GRAD] = {shape_bias_grad, flops_bias_grad, NULL, {A}},
    [TG_OP_LAYERNORM] = {shape_layernorm, flops_layernorm, bwd_layernorm, {W, W, W}},
    [TG_OP_LAYERNORM_BWD] = {shape_layernorm, flops_layernorm_bwd, NULL, {W, A, A}},
    [TG_OP_GELU] = {shape_unary, flops_gelu, bwd_gelu, {W}},
    /* out1 (i[2]) is a bias gradient, written: its only contribution. */
    [TG_OP_GELU_BWD] = {shape_unary, flops_gelu, NULL, {W, W}},
    [TG_OP_TANH] = {shape_unary, flops_gelu, bwd_tanh, {W}},
    [TG_OP_TANH_BWD] = {shape_unary, flops_n, NULL, {W}},
    [TG_OP_ATTN_SOFTMAX] = {shape_softmax, flops_softmax, bwd_softmax, {W, W}},
    [TG_OP_ATTN_SOFTMAX_BWD] = {shape_softmax, flops_softmax, NULL, {W}},
    [TG_OP_ATTENTION] = {shape_attention, flops_attention, bwd_attention, {W, W, W}},
    [TG_OP_ATTENTION_BWD] = {shape_attention, flops_attention, NULL, {W, W, W, W}},
    [TG_OP_DROPOUT] = {shape_dropout, flops_n, bwd_dropout, {W}},
    [TG_OP_HEADS_SPLIT] = {shape_heads, flops_none, bwd_heads_split, {W, W, W}},
    [TG_OP_HEADS_MERGE] = {shape_heads, flops_none, bwd_heads_merge, {W}},
    [TG_OP_SELECT_TOKEN] = {shape_select, flops_none, bwd_select, {W}},
    [TG_OP_SELECT_TOKEN_BWD] = {shape_select, flops_none, NULL, {W}},
    [TG_OP_CROSS_ENTROPY] = {shape_cross_entropy, flops_cross_entropy, bwd_cross_entropy, {W}},
    [TG_OP_CROSS_ENTROPY_BWD] = {shape_cross_entropy, flops_cross_entropy, NULL, {W}},
    [TG_OP_SCHEDULE] = {shape_schedule, flops_none, NULL, {W, W}},
    [TG_OP_GRAD_NORM] = {shape_grad_norm, flops_grad_norm, NULL, {W}},
    [TG_OP_ADAMW] = {shape_adamw, flops_adamw, NULL, {W, W, W}},
    [TG_OP_RESIDUAL_LAYERNORM] = {shape_residual_layernorm, flops_residual_layernorm, bwd_residual_layernorm,
                                  {W, W, W, W}},
    [TG_OP_RESIDUAL_LAYERNORM_BWD] = {shape_residual_layernorm, flops_residual_layernorm, NULL, {W, W, A, A}},
    [TG_OP_ALL_REDUCE] = {shape_all_reduce, flops_all_reduce, NULL, {W}},
    [TG_OP_ALL_GATHER] = {shape_all_gather, flops_none, NULL, {W}},
};
#undef W
#undef A
_Static_assert(sizeof rows / sizeof rows[0] == TG_OP_COUNT, "every op needs a row");

const tg_op_row *tg_op_row_of(int kind) { return &rows[kind]; }

double tg_op_bytes(const tg_tensor *tensors, const tg_op *op) {
    double bytes = 0;
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (op->in[s] >= 0) bytes += (double)tensors[op->in[s]].bytes;
    for (int s = 0; s < TG_OP_MAX_OUT; s++)
        if (op->out[s] >= 0 && (op->kind != TG_OP_SCHEDULE || s == 0)) bytes += (double)tensors[op->out[s]].bytes;
    return bytes;
}
