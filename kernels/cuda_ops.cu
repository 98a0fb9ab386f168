/* The CUDA executor's per-op dispatch: one launcher per op kind, in enum order (C++ has
 * no designated array initialisers, so the rows are positional, each commented with its
 * kind, and the count is statically asserted against TG_OP_COUNT). Launch errors are
 * picked up with cudaGetLastError right after each op, so a failure names its op. No
 * launcher allocates or synchronises; all work goes to ctx->stream (graph capturable). */
#include "kernels/cuda_common.cuh"

static const tg_cuda_launcher table[] = {
    tg_launch_zero,              /* TG_OP_ZERO */
    tg_launch_fill,              /* TG_OP_FILL */
    tg_launch_embedding,         /* TG_OP_EMBEDDING */
    tg_launch_embedding_bwd,     /* TG_OP_EMBEDDING_BWD */
    tg_launch_add,               /* TG_OP_ADD */
    tg_cuda_matmul,              /* TG_OP_MATMUL (kernels/gemm.cu) */
    tg_launch_bias_grad,         /* TG_OP_BIAS_GRAD */
    tg_launch_layernorm,         /* TG_OP_LAYERNORM */
    tg_launch_layernorm_bwd,     /* TG_OP_LAYERNORM_BWD */
    tg_launch_gelu,              /* TG_OP_GELU */
    tg_launch_gelu_bwd,          /* TG_OP_GELU_BWD */
    tg_launch_tanh,              /* TG_OP_TANH */
    tg_launch_tanh_bwd,          /* TG_OP_TANH_BWD */
    tg_launch_attn_softmax,      /* TG_OP_ATTN_SOFTMAX */
    tg_launch_attn_softmax_bwd,  /* TG_OP_ATTN_SOFTMAX_BWD */
    tg_launch_dropout,           /* TG_OP_DROPOUT */
    tg_launch_heads_split,       /* TG_OP_HEADS_SPLIT */
    tg_launch_heads_merge,       /* TG_OP_HEADS_MERGE */
    tg_launch_select_token,      /* TG_OP_SELECT_TOKEN */
    tg_launch_select_token_bwd,  /* TG_OP_SELECT_TOKEN_BWD */
    tg_launch_cross_entropy,     /* TG_OP_CROSS_ENTROPY */
    tg_launch_cross_entropy_bwd, /* TG_OP_CROSS_ENTROPY_BWD */
    tg_launch_schedule,          /* TG_OP_SCHEDULE */
    tg_launch_grad_norm,         /* TG_OP_GRAD_NORM */
    tg_launch_adamw,             /* TG_OP_ADAMW */
};
static_assert(sizeof table / sizeof table[0] == TG_OP_COUNT, "every op needs a CUDA launcher");
/* Spot checks that the positional rows line up with the enum. */
static_assert(TG_OP_MATMUL == 5 && TG_OP_DROPOUT == 15 && TG_OP_ADAMW == 24, "table rows out of enum order");

extern "C" int tg_cuda_op_run(const tg_cuda_op_args *a, tg_err *err) {
    const int kind = a->op->kind;
    if (kind < 0 || kind >= TG_OP_COUNT) return tg_fail(err, "op kind %d is not a known op", kind);
    if (table[kind](a, err)) return tg_fail_context(err, "op %s (%d)", tg_op_name(kind), kind);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return tg_fail(err, "op %s (%d): %s: %s", tg_op_name(kind), kind, cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
}

/* Floats of ctx->reduce_scratch an op needs; formulas next to each op's launcher. */
extern "C" int64_t tg_cuda_op_scratch_floats(const tg_op *op, const int64_t *in_numel) {
    switch (op->kind) {
    case TG_OP_EMBEDDING_BWD: return tg_scratch_embedding_bwd(op);
    case TG_OP_LAYERNORM_BWD: return tg_scratch_layernorm_bwd(op);
    case TG_OP_BIAS_GRAD: return tg_scratch_bias_grad(op);
    case TG_OP_CROSS_ENTROPY: return tg_scratch_cross_entropy(op);
    case TG_OP_CROSS_ENTROPY_BWD: return tg_scratch_cross_entropy_bwd(op);
    case TG_OP_GRAD_NORM: return tg_scratch_grad_norm(op, in_numel);
    default: return 0;
    }
}
