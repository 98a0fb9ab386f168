/* Names and sizes shared by every reader of a plan. */
#include "plan/plan.h"

#include <stdlib.h>

void tg_plan_free(tg_plan *plan) {
    if (!plan) return;
    free(plan->tensors);
    free(plan->ops);
    plan->tensors = NULL;
    plan->ops = NULL;
    plan->n_tensors = plan->n_ops = 0;
}

static const char *const pool_names[TG_POOL_COUNT] = {
    "params", "grads", "optim", "activations", "inputs", "workspace", "params_bf16",
};
_Static_assert(sizeof pool_names / sizeof pool_names[0] == TG_POOL_COUNT, "pool names");

static const char *const phase_names[TG_PHASE_COUNT] = {"forward", "backward", "optimizer"};
static const char *const dtype_names[TG_DTYPE_COUNT] = {"f32", "i32", "bf16"};
static const int dtype_sizes[TG_DTYPE_COUNT] = {4, 4, 2};
static const char *const arch_names[TG_ARCH_COUNT] = {"bert", "roberta", "gpt2"};
static const char *const task_names[TG_TASK_COUNT] = {"classify", "lm"};
static const char *const precision_names[TG_PREC_COUNT] = {"fp32", "bf16", "fp16"};
static const char *const attention_mode_names[TG_ATTENTION_MODE_COUNT] = {"fused", "unfused"};

#define NAME_OR_UNKNOWN(table, count, v) ((v) >= 0 && (v) < (count) ? table[v] : "?")

const char *tg_pool_name(int pool) { return NAME_OR_UNKNOWN(pool_names, TG_POOL_COUNT, pool); }
const char *tg_phase_name(int phase) { return NAME_OR_UNKNOWN(phase_names, TG_PHASE_COUNT, phase); }
const char *tg_dtype_name(int dtype) { return NAME_OR_UNKNOWN(dtype_names, TG_DTYPE_COUNT, dtype); }
const char *tg_arch_name(int arch) { return NAME_OR_UNKNOWN(arch_names, TG_ARCH_COUNT, arch); }
const char *tg_task_name(int task) { return NAME_OR_UNKNOWN(task_names, TG_TASK_COUNT, task); }
const char *tg_precision_name(int p) { return NAME_OR_UNKNOWN(precision_names, TG_PREC_COUNT, p); }
const char *tg_attention_mode_name(int mode) {
    return NAME_OR_UNKNOWN(attention_mode_names, TG_ATTENTION_MODE_COUNT, mode);
}
int tg_dtype_size(int dtype) { return dtype >= 0 && dtype < TG_DTYPE_COUNT ? dtype_sizes[dtype] : 0; }

int64_t tg_tensor_numel(const tg_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

static const char *const op_names[TG_OP_COUNT] = {
    [TG_OP_ZERO] = "zero",
    [TG_OP_FILL] = "fill",
    [TG_OP_EMBEDDING] = "embedding",
    [TG_OP_EMBEDDING_BWD] = "embedding_bwd",
    [TG_OP_ADD] = "add",
    [TG_OP_MATMUL] = "matmul",
    [TG_OP_BIAS_GRAD] = "bias_grad",
    [TG_OP_LAYERNORM] = "layernorm",
    [TG_OP_LAYERNORM_BWD] = "layernorm_bwd",
    [TG_OP_GELU] = "gelu",
    [TG_OP_GELU_BWD] = "gelu_bwd",
    [TG_OP_TANH] = "tanh",
    [TG_OP_TANH_BWD] = "tanh_bwd",
    [TG_OP_ATTN_SOFTMAX] = "attn_softmax",
    [TG_OP_ATTN_SOFTMAX_BWD] = "attn_softmax_bwd",
    [TG_OP_ATTENTION] = "attention",
    [TG_OP_ATTENTION_BWD] = "attention_bwd",
    [TG_OP_DROPOUT] = "dropout",
    [TG_OP_HEADS_SPLIT] = "heads_split",
    [TG_OP_HEADS_MERGE] = "heads_merge",
    [TG_OP_SELECT_TOKEN] = "select_token",
    [TG_OP_SELECT_TOKEN_BWD] = "select_token_bwd",
    [TG_OP_CROSS_ENTROPY] = "cross_entropy",
    [TG_OP_CROSS_ENTROPY_BWD] = "cross_entropy_bwd",
    [TG_OP_SCHEDULE] = "schedule",
    [TG_OP_GRAD_NORM] = "grad_norm",
    [TG_OP_ADAMW] = "adamw",
    [TG_OP_RESIDUAL_LAYERNORM] = "residual_layernorm",
    [TG_OP_RESIDUAL_LAYERNORM_BWD] = "residual_layernorm_bwd",
    [TG_OP_ALL_REDUCE] = "all_reduce",
    [TG_OP_ALL_GATHER] = "all_gather",
};
_Static_assert(sizeof op_names / sizeof op_names[0] == TG_OP_COUNT, "every op needs a name");

const char *tg_op_name(int kind) { return NAME_OR_UNKNOWN(op_names, TG_OP_COUNT, kind); }
