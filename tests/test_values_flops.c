/* The FLOP and byte counts of every op of compiled tiny plans, against formulas written
 * here from the tensors' shapes (not from the ops' parameters, which plan/op_meta.c reads):
 * the numbers `inspect`, the metrics and the roofline reports print. */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/op_meta.h"
#include "tests/harness.h"

static double numel(const tg_plan *p, int t) { return t >= 0 ? (double)tg_tensor_numel(&p->tensors[t]) : 0; }

/* The last dimension of tensor t as stored. */
static double last_dim(const tg_plan *p, int t) {
    const tg_tensor *x = &p->tensors[t];
    return (double)x->shape[x->ndim - 1];
}

/* The FLOPs of op o by the documented formula, from its tensors' element counts; -1 for a
 * kind this table does not know (a new kind needs its formula here). */
static double expected_flops(const tg_plan *p, const tg_op *op) {
    const int *in = op->in, *out = op->out;
    switch (op->kind) {
    case TG_OP_ZERO:
    case TG_OP_FILL:
    case TG_OP_EMBEDDING:
    case TG_OP_HEADS_SPLIT:
    case TG_OP_HEADS_MERGE:
    case TG_OP_SELECT_TOKEN:
    case TG_OP_SELECT_TOKEN_BWD:
    case TG_OP_SCHEDULE:
    case TG_OP_ALL_GATHER:
    case TG_OP_NORM_OF_SQUARES:
        return 0;
    case TG_OP_EMBEDDING_BWD: /* one add per gathered element of dout */
        return numel(p, in[1]);
    case TG_OP_ADD:
    case TG_OP_TANH_BWD:
    case TG_OP_DROPOUT:
    case TG_OP_ALL_REDUCE:
    case TG_OP_REDUCE_SCATTER:
        return numel(p, out[0]);
    case TG_OP_GELU:
    case TG_OP_TANH:
        return 10 * numel(p, out[0]);
    case TG_OP_GELU_BWD: /* + the fused bias gradient's column sums */
        return 10 * numel(p, out[0]) + (out[1] >= 0 ? numel(p, out[0]) : 0);
    case TG_OP_MATMUL: {
        /* out0 is batch x [M, N] with N its last dimension, in0 batch x M x K elements. */
        double mn_batch = numel(p, out[0]), n = last_dim(p, out[0]), k = numel(p, in[0]) * n / mn_batch;
        return 2 * mn_batch * k + (in[2] >= 0 ? mn_batch : 0) + (out[1] >= 0 ? numel(p, out[1]) * k : 0) +
               (out[2] >= 0 || in[3] >= 0 ? 10 * mn_batch : 0);
    }
    case TG_OP_BIAS_GRAD:
        return numel(p, in[0]);
    case TG_OP_LAYERNORM:
        return 8 * numel(p, in[0]);
    case TG_OP_LAYERNORM_BWD:
        return 12 * numel(p, in[0]);
    case TG_OP_RESIDUAL_LAYERNORM:
        return (9 + (op->p.residual_layernorm.p > 0)) * numel(p, in[0]);
    case TG_OP_RESIDUAL_LAYERNORM_BWD:
        return (12 + (in[5] >= 0) + (op->p.residual_layernorm_bwd.p > 0)) * numel(p, in[0]);
    case TG_OP_ATTN_SOFTMAX: /* in0 the [b,h,t,t] scores */
        return (5 + (op->p.softmax.p > 0 && out[1] >= 0)) * numel(p, in[0]);
    case TG_OP_ATTN_SOFTMAX_BWD:
        return (5 + (op->p.softmax_bwd.p > 0 && in[2] >= 0)) * numel(p, in[0]);
    case TG_OP_ATTENTION:
    case TG_OP_ATTENTION_BWD: {
        /* QK^T and PV: 2 * T * Dh each per (b, head, query), half under GPT-2's causal mask;
         * O is out0 of the forward, in1 of the backward, [b*t, h*Dh]; the backward is twice. */
        double o = numel(p, op->kind == TG_OP_ATTENTION ? out[0] : in[1]), t = p->train.seq;
        double f = 4 * o * t * (p->model.arch == TG_ARCH_GPT2 ? 0.5 : 1);
        return op->kind == TG_OP_ATTENTION ? f : 2 * f;
    }
    case TG_OP_CROSS_ENTROPY:
        return 4 * numel(p, in[0]);
    case TG_OP_CROSS_ENTROPY_BWD:
        return 4 * numel(p, in[1]);
    case TG_OP_GRAD_NORM: /* a multiply and an add per gradient element */
    case TG_OP_GRAD_SQUARES:
        return 2 * numel(p, in[0]);
    case TG_OP_ADAMW: /* 16 per parameter element */
        return 16 * numel(p, out[0]);
    }
    return -1;
}

/* Every tensor an op reads or writes, once per slot, as stored (SCHEDULE's out1 is its in0,
 * updated in place: counted once). */
static double expected_bytes(const tg_plan *p, const tg_op *op) {
    double b = 0;
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (op->in[s] >= 0) b += numel(p, op->in[s]) * tg_dtype_size(p->tensors[op->in[s]].dtype);
    for (int s = 0; s < TG_OP_MAX_OUT; s++)
        if (op->out[s] >= 0 && !(op->kind == TG_OP_SCHEDULE && s == 1))
            b += numel(p, op->out[s]) * tg_dtype_size(p->tensors[op->out[s]].dtype);
    return b;
}

typedef struct variant {
    const char *preset;
    int task, precision, fused, replicas, zero;
} variant;

static int compile_variant(const variant *v, tg_plan *p) {
    tg_model_config cfg;
    tg_err err;
    if (!CHECK(tg_model_config_load(v->preset, &cfg, &err) == 0, "%s", err.msg)) return 0;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", v->preset);
    job.task = v->task, job.precision = v->precision, job.batch = 3, job.seq = 16, job.steps = 1;
    job.data_parallel = v->replicas, job.zero_stage = v->zero;
    if (!v->fused) {
        job.attention = TG_ATTENTION_UNFUSED;
        job.fuse_bias_grad = job.fuse_gelu = job.fuse_residual_layernorm = job.fuse_qkv = 0;
    }
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s: %s", v->preset, err.msg);
}

TG_TEST(test_values_flops_and_bytes_per_op) {
    static const variant variants[] = {
        {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, 1, 0}, {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 0, 1, 0},
        {"tiny-roberta", TG_TASK_CLASSIFY, TG_PREC_FP32, 0, 1, 0}, {"tiny-roberta", TG_TASK_CLASSIFY, TG_PREC_BF16, 1, 1, 0},
        {"tiny-gpt2", TG_TASK_CLASSIFY, TG_PREC_FP32, 0, 1, 0}, {"tiny-gpt2", TG_TASK_CLASSIFY, TG_PREC_BF16, 1, 1, 0},
        {"tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, 1, 1, 0},       {"tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 0, 1, 0},
        {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, 2, 0}, {"tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 1, 2, 1},
    };
    int seen[TG_OP_COUNT] = {0};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const variant *va = &variants[v];
        tg_plan p;
        if (!compile_variant(va, &p)) continue;
        double flops = 0, bytes = 0;
        int bad = 0;
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            double want = expected_flops(&p, op), got = tg_op_flops(op);
            double want_b = expected_bytes(&p, op), got_b = tg_op_bytes(p.tensors, op);
            seen[op->kind]++;
            if (bad < 5 && !CHECK(want == got, "%s %s %s x%d: op %d %s: %.0f FLOPs, formula %.0f", va->preset,
                                  tg_task_name(va->task), tg_precision_name(va->precision), va->replicas, o,
                                  tg_op_name(op->kind), got, want))
                bad++;
            if (bad < 5 && !CHECK(want_b == got_b, "%s %s %s x%d: op %d %s: %.0f bytes, formula %.0f", va->preset,
                                  tg_task_name(va->task), tg_precision_name(va->precision), va->replicas, o,
                                  tg_op_name(op->kind), got_b, want_b))
                bad++;
            flops += want, bytes += want_b;
        }
        CHECK(p.flops_per_step == flops && p.bytes_per_step == bytes, "%s: plan per step %.0f FLOPs %.0f bytes, ops sum %.0f %.0f",
              va->preset, p.flops_per_step, p.bytes_per_step, flops, bytes);
        tg_plan_free(&p);
    }
    /* Every kind the tiny models' plans use came through a formula above. */
    static const int used[] = {TG_OP_ZERO, TG_OP_FILL, TG_OP_EMBEDDING, TG_OP_EMBEDDING_BWD, TG_OP_ADD, TG_OP_GELU, TG_OP_TANH, TG_OP_TANH_BWD, TG_OP_DROPOUT,
                               TG_OP_GELU_BWD, TG_OP_MATMUL, TG_OP_BIAS_GRAD, TG_OP_LAYERNORM, TG_OP_LAYERNORM_BWD,
                               TG_OP_RESIDUAL_LAYERNORM, TG_OP_RESIDUAL_LAYERNORM_BWD, TG_OP_ATTN_SOFTMAX,
                               TG_OP_ATTN_SOFTMAX_BWD, TG_OP_ATTENTION, TG_OP_ATTENTION_BWD, TG_OP_HEADS_SPLIT,
                               TG_OP_HEADS_MERGE, TG_OP_SELECT_TOKEN, TG_OP_SELECT_TOKEN_BWD, TG_OP_CROSS_ENTROPY, TG_OP_CROSS_ENTROPY_BWD, TG_OP_SCHEDULE,
                               TG_OP_GRAD_NORM, TG_OP_ADAMW, TG_OP_ALL_REDUCE, TG_OP_ALL_GATHER,
                               TG_OP_REDUCE_SCATTER, TG_OP_GRAD_SQUARES, TG_OP_NORM_OF_SQUARES};
    for (size_t i = 0; i < sizeof used / sizeof used[0]; i++)
        CHECK(seen[used[i]] > 0, "no plan used %s", tg_op_name(used[i]));
    for (int k = 0; k < TG_OP_COUNT; k++)
        if (seen[k]) printf("    %-24s %4d ops\n", tg_op_name(k), seen[k]);
}

/* The elementwise kinds on hand-built ops too, with a bf16 output: the byte count follows
 * each tensor's dtype. */
TG_TEST(test_values_flops_elementwise_dtypes) {
    tg_tensor t[3];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 3; i++) t[i].ndim = 2, t[i].shape[0] = 6, t[i].shape[1] = 7, t[i].dtype = TG_F32, t[i].bytes = 168;
    t[2].dtype = TG_BF16, t[2].bytes = 84;
    tg_plan p;
    memset(&p, 0, sizeof p);
    p.tensors = t, p.n_tensors = 3;
    int kinds[] = {TG_OP_TANH, TG_OP_TANH_BWD, TG_OP_DROPOUT, TG_OP_GELU, TG_OP_ADD};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        tg_op op = tg_test_op(kinds[i]);
        op.in[0] = 0, op.out[0] = 2;
        if (kinds[i] != TG_OP_TANH && kinds[i] != TG_OP_GELU) op.in[1] = 1;
        if (kinds[i] == TG_OP_DROPOUT) op.p.dropout.n = 42, op.p.dropout.p = 0.1f;
        else if (kinds[i] == TG_OP_GELU) op.p.gelu.n = 42;
        else op.p.count.n = 42;
        CHECK(tg_op_flops(&op) == expected_flops(&p, &op), "%s: %.0f FLOPs, formula %.0f", tg_op_name(kinds[i]),
              tg_op_flops(&op), expected_flops(&p, &op));
        CHECK(tg_op_bytes(t, &op) == expected_bytes(&p, &op), "%s: %.0f bytes, formula %.0f", tg_op_name(kinds[i]),
              tg_op_bytes(t, &op), expected_bytes(&p, &op));
    }
}
