#include "compiler/precision.h"
#include "plan/op_meta.h"
#include "compiler/compiler_alloc.h"
#include "compiler/grad_buckets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether slot s of op reads a parameter through its half copy: a matmul's operands and bias,
 * a convolution's weight (CONV2D's in1, CONV2D_BWD's in2), as PyTorch's autocast casts them.
 * A convolution's bias stays fp32 (the kernels read it as float, as they read a batch norm's
 * gamma and beta; MobileNetV2's convolutions have none), and its weight gradient is fp32 in
 * the grads pool like a matmul's. */
static int reads_half_copy(const tg_op *op, int s) {
    switch (op->kind) {
    case TG_OP_MATMUL: return s < 3;
    case TG_OP_CONV2D: return s == 1;
    case TG_OP_CONV2D_BWD: return s == 2;
    default: return 0;
    }
}

static void set_dtype(tg_graph *g, int t, int dtype) {
    tg_tensor *x = &g->tensors[t];
    x->dtype = dtype;
    x->bytes = (uint64_t)tg_tensor_numel(x) * (uint64_t)tg_dtype_size(dtype);
}

/* The storage unit a frozen tensor belongs to: a packed group's view for its members and
 * itself, the table itself for the table and its padded view. */
static int frozen_unit(const tg_graph *g, int t) {
    const tg_tensor *x = &g->tensors[t];
    if ((x->flags & TG_TENSOR_VIEW) && x->master >= 0 && g->tensors[x->master].group != t) t = x->master; /* GCOVR_EXCL_BR_LINE: a frozen view is a packed group's (master its first member) or the padded table's (master the table) */
    return g->tensors[t].group >= 0 ? g->tensors[t].group : t;
}

/* Frozen parameters in a bf16 plan are stored once, in the working precision. A unit (a
 * tensor with its views, or a packed group) that only matmuls (and convolutions, through
 * their weight slots: reads_half_copy) read becomes bf16 and they read it directly; one that
 * an op taking fp32 reads (LayerNorm, batch norm, embeddings) stays fp32. Where a matmul reads
 * such an fp32 unit too (GPT-2's wte, also the tied LM head), it gets a bf16 copy in the
 * frozen pool (TG_TENSOR_FROZEN | TG_TENSOR_PARAM_COPY, master the fp32 tensor; its views as
 * views of the copy), which the runtime fills once when it uploads the weights, and the
 * matmuls read the copy. Offsets come later (tg_plan_fixed_layout). */
static int frozen_storage(tg_graph *g, int half, const char *prefix) {
    const int n0 = g->n_tensors;
    char *by_matmul = tg_compiler_calloc((size_t)n0, 1), *by_other = tg_compiler_calloc((size_t)n0, 1);
    int *copy_of = tg_compiler_malloc(sizeof *copy_of * (size_t)n0);
    if (!by_matmul || !by_other || !copy_of) {
        free(by_matmul), free(by_other), free(copy_of);
        return tg_graph_out_of_memory(g);
    }
    for (int o = 0; o < g->n_ops; o++) {
        const tg_op *op = &g->ops[o];
        for (int s = 0; s < TG_OP_MAX_IN; s++) {
            const int t = op->in[s];
            if (t < 0 || g->tensors[t].pool != TG_POOL_FROZEN) continue;
            if (reads_half_copy(op, s)) by_matmul[frozen_unit(g, t)] = 1; /* GCOVR_EXCL_BR_LINE: a matmul's in[3] is its GELU pre-activation, an activation, never in the frozen pool */
            else by_other[frozen_unit(g, t)] = 1;
        }
    }
    for (int t = 0; t < n0; t++) {
        copy_of[t] = -1;
        const int u = g->tensors[t].pool == TG_POOL_FROZEN ? frozen_unit(g, t) : -1;
        if (u >= 0 && by_matmul[u] && !by_other[u]) set_dtype(g, t, half);
    }
    /* The copies: each mixed unit's table first, then its views over the copy. */
    for (int t = 0; t < n0 && !g->failed; t++) {
        const tg_tensor *x = &g->tensors[t];
        if (x->pool != TG_POOL_FROZEN || (x->flags & TG_TENSOR_VIEW) || x->group >= 0 || !by_matmul[t] || !by_other[t])
            continue;
        for (int v = t; v < n0; v++) { /* a failed copy breaks out */
            const tg_tensor *y = &g->tensors[v];
            if (v != t && !((y->flags & TG_TENSOR_VIEW) && y->pool == TG_POOL_FROZEN && y->master == t)) continue;
            char name[TG_NAME_MAX];
            snprintf(name, sizeof name, "%s.%s", prefix, y->name);
            int64_t shape[TG_MAX_DIMS];
            memcpy(shape, y->shape, sizeof shape);
            const int ndim = y->ndim, flags = y->flags;
            int c = tg_graph_tensor(g, name, half, TG_POOL_FROZEN, ndim, shape);
            if (c < 0) break;
            if (v == t) {
                g->tensors[c].flags |= TG_TENSOR_FROZEN | TG_TENSOR_PARAM_COPY;
                g->tensors[c].master = t;
            } else {
                g->tensors[c].flags |= flags & (TG_TENSOR_FROZEN | TG_TENSOR_VIEW | TG_TENSOR_TIED);
                g->tensors[c].master = copy_of[t];
            }
            copy_of[v] = c;
        }
    }
    for (int o = 0; o < g->n_ops && !g->failed; o++) {
        tg_op *op = &g->ops[o];
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (reads_half_copy(op, s) && op->in[s] >= 0 && op->in[s] < n0 && copy_of[op->in[s]] >= 0) /* GCOVR_EXCL_BR_LINE: the ops were all made before this pass: their operands are below n0 */
                op->in[s] = copy_of[op->in[s]];
    }
    free(by_matmul), free(by_other), free(copy_of);
    return g->failed ? -1 : 0;
}

int tg_apply_precision(tg_graph *g, int precision) {
    if (g->failed) return -1;
    if (precision == TG_PREC_FP32) return 0;
    if (precision != TG_PREC_BF16 && precision != TG_PREC_FP16)
        return tg_graph_fail(g, "precision %d has no storage rules", precision);
    /* fp16 follows bf16's rules with the other half-precision format (and the loss
     * scaling the optimizer pass added). */
    const int half = precision == TG_PREC_FP16 ? TG_F16 : TG_BF16;
    const char *prefix = precision == TG_PREC_FP16 ? "f16" : "bf16";

    /* Low-precision copies of the parameters, one contiguous buffer with the masters' layout. */
    int n0 = g->n_tensors;
    int *copy_of = tg_compiler_calloc((size_t)n0, sizeof *copy_of);
    if (!copy_of) return tg_graph_out_of_memory(g);
    for (int t = 0; t < n0; t++) {
        copy_of[t] = -1;
        if (!(g->tensors[t].flags & TG_TENSOR_PARAM)) continue;
        char name[TG_NAME_MAX];
        snprintf(name, sizeof name, "%s.%s", prefix, g->tensors[t].name);
        int64_t shape[TG_MAX_DIMS];
        memcpy(shape, g->tensors[t].shape, sizeof shape);
        int c = tg_graph_tensor(g, name, half, TG_POOL_PARAMS_BF16, g->tensors[t].ndim, shape);
        if (c < 0) break;
        g->tensors[c].flags |= TG_TENSOR_PARAM_COPY | (g->tensors[t].flags & TG_TENSOR_VIEW);
        g->tensors[c].master = t;
        g->tensors[c].offset = g->tensors[t].offset / 2; /* same element index */
        copy_of[t] = c;
    }
    /* The copies of a packed group's members form a group under the copy of its view. */
    for (int t = 0; t < n0 && !g->failed; t++)
        if (copy_of[t] >= 0 && g->tensors[t].group >= 0) g->tensors[copy_of[t]].group = copy_of[g->tensors[t].group];
    int64_t elems = g->failed ? 0 : tg_tensor_numel(&g->tensors[g->io.params_all]);
    g->io.params_bf16_all = tg_graph_tensor(g, precision == TG_PREC_FP16 ? "params_f16.all" : "params_bf16.all", half,
                                            TG_POOL_PARAMS_BF16, 1, &elems);
    if (g->failed) {
        free(copy_of);
        return -1;
    }
    g->tensors[g->io.params_bf16_all].flags |= TG_TENSOR_VIEW;
    if (frozen_storage(g, half, prefix)) {
        free(copy_of);
        return -1;
    }

    /* Which fp32 activations stay fp32. */
    char *keep = tg_compiler_calloc((size_t)g->n_tensors, 1);
    if (!keep) {
        free(copy_of);
        return tg_graph_out_of_memory(g);
    }
    for (int o = 0; o < g->n_ops; o++) {
        tg_op *op = &g->ops[o];
        /* Outputs whose slot is f32 whatever the plan's precision (signature S or s,
         * plan/ops.def): row statistics (LayerNorm's and RMSNorm's mean and rstd, the
         * attention's LSE and delta, the loss rows' log-sum-exp) and the parameter
         * gradients of frozen parameters, which are scratch activations. */
        const char *outs = tg_op_info_of(op->kind)->outputs;
        for (int s = 0; s < TG_OP_MAX_OUT && outs[s]; s++)
            if ((outs[s] == 'S' || outs[s] == 's') && op->out[s] >= 0) keep[op->out[s]] = 1;
        /* Matmuls and convolutions read the half copies (reads_half_copy); their weight
         * gradients stay fp32 (grads pool, or 's' slots). Batch norms read their gamma and
         * beta as fp32 masters (S slots) and keep their statistics fp32 (the stats output is
         * S, the running statistics are buffers); only their activations go half. */
        for (int s = 0; s < TG_OP_MAX_IN; s++)
            if (reads_half_copy(op, s) && op->in[s] >= 0 && op->in[s] < n0 && copy_of[op->in[s]] >= 0)
                op->in[s] = copy_of[op->in[s]];
        switch (op->kind) {
        case TG_OP_ATTN_SOFTMAX:
            keep[op->in[0]] = 1; /* scores: the product accumulates in fp32 and stays fp32 */
            break;
        case TG_OP_ADAMW:
        case TG_OP_ADAN:
            op->out[3] = g->io.params_bf16_all; /* refreshed in the same pass as the update */
            break;
        default:
            break;
        }
    }
    /* Only activations change dtype: an input tensor keeps the dtype the runtime writes it in.
     * An image model's network input is an activation (IMAGE_INPUT's output, from the u8
     * pixel_values), so it goes half here and the stem convolution reads it in the plan's
     * half type like every other convolution. */
    for (int t = 0; t < g->n_tensors; t++) {
        tg_tensor *x = &g->tensors[t];
        if (x->pool == TG_POOL_ACTIVATIONS && x->dtype == TG_F32 && !keep[t] && tg_tensor_numel(x) > 1)
            set_dtype(g, t, half);
    }
    free(keep);
    free(copy_of);
    /* ZeRO-1: each replica refreshed the copies of its own slice; share them too. */
    for (int o = 0; o < g->n_ops; o++)
        if (tg_op_is_update(g->ops[o].kind) && g->ops[o].p.adamw.zero_slice > 0)
            return tg_zero_gather(g, g->io.params_bf16_all,
                                  precision == TG_PREC_FP16 ? "params_f16.slices" : "params_bf16.slices");
    return 0;
}
