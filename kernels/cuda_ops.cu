/* The CUDA executor's per-op dispatch: one launcher per op kind, tg_launch_<name>, in a
 * table generated from plan/ops.def (so it follows the enum whatever its order, and an op
 * without a launcher does not link). Launch errors are picked up with cudaGetLastError
 * right after each op, so a failure names its op. No launcher allocates or synchronises;
 * all work goes to ctx->stream (graph capturable).
 *
 * Before its launcher runs, every op's slot dtypes are checked against its row of
 * dtype_rules, so a launcher can pick its storage type from one slot and trust the
 * others (kernels/README.md has the same table). The rows name their kind and are placed
 * by it at compile time, where a missing or repeated kind fails a static assertion. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda_common.cuh"
#include "kernels/cudnn_attention.h"

/* ---- dtype rules ---------------------------------------------------------------------
 * One string per slot: a role letter, then the slot's name for messages. Only slots
 * with a device pointer are checked (optional inputs may be absent).
 *   T  the op's storage type: f32, bf16 or f16, the same in every T slot of the launch
 *   S  f32, or the storage type (attention scores: f32 in bf16 and fp16 plans)
 *   H  a 16-bit format (bf16 or f16: the parameters' copies)
 *   M  f32 or bf16 (the optimizer's moments, job key optimizer_state)
 *   F  f32     I  i32     U  u8 (stored pixels)     A  any dtype (ZERO)
 * MATMUL's row is empty: kernels/gemm.cu checks its own dtypes. */
struct dtype_rule {
    const char *in[TG_OP_MAX_IN];
    const char *out[TG_OP_MAX_OUT];
};

struct dtype_row {
    int kind;
    dtype_rule rule;
};

static constexpr dtype_row dtype_rows[] = {
    {TG_OP_ZERO, {{NULL}, {"Aout"}}},
    {TG_OP_FILL, {{"Fscale"}, {"Fout"}}},
    {TG_OP_EMBEDDING, {{"Iids", "Ftable"}, {"Tout"}}},
    {TG_OP_EMBEDDING_BWD, {{"Iids", "Tdout"}, {"Fdtable"}}},
    {TG_OP_ADD, {{"Ta", "Tb"}, {"Tout"}}},
    {TG_OP_MATMUL, {{NULL}, {NULL}}},
    {TG_OP_BIAS_GRAD, {{"Tdout"}, {"Fdbias"}}},
    {TG_OP_LAYERNORM, {{"Tx", "Fgamma", "Fbeta"}, {"Ty", "Fmean", "Frstd"}}},
    {TG_OP_LAYERNORM_BWD, {{"Tdy", "Tx", "Fgamma", "Fmean", "Frstd"}, {"Tdx", "Fdgamma", "Fdbeta"}}},
    {TG_OP_GELU, {{"Tx"}, {"Ty"}}},
    {TG_OP_GELU_BWD, {{"Tdy", "Tx"}, {"Tdx", "Fdbias", "Ty"}}},
    {TG_OP_TANH, {{"Tx"}, {"Ty"}}},
    {TG_OP_TANH_BWD, {{"Tdy", "Ty"}, {"Tdx"}}},
    {TG_OP_ATTN_SOFTMAX, {{"Sscores", "Fmask", "Fstep"}, {"Tprobs", "Tprobs_dropout"}}},
    {TG_OP_ATTN_SOFTMAX_BWD, {{"Tdprobs", "Tprobs", "Fstep"}, {"Tdscores"}}},
    {TG_OP_ATTENTION, {{"Tq", "Tk", "Tv", "Fmask", "Fstep"}, {"To", "Flse", "Ikeep_bits"}}},
    {TG_OP_ATTENTION_BWD,
     {{"Tdo", "To", "Flse", "Fmask", "Ikeep_bits", "Tq", "Tk", "Tv"}, {"Tdq", "Tdk", "Tdv", "Fdelta"}}},
    {TG_OP_DROPOUT, {{"Tx", "Fstep"}, {"Ty"}}},
    {TG_OP_MLM_MASK, {{"Iids", "Fmask", "Fstep", "Istream"}, {"Iids_out", "Ilabels"}}},
    {TG_OP_HEADS_SPLIT, {{"Tx"}, {"Tpart0", "Tpart1", "Tpart2"}}},
    {TG_OP_HEADS_MERGE, {{"Tpart0", "Tpart1", "Tpart2"}, {"Tx"}}},
    {TG_OP_SELECT_TOKEN, {{"Tx", "Iids"}, {"Tout"}}},
    {TG_OP_SELECT_TOKEN_BWD, {{"Tdout", "Iids"}, {"Tdx"}}},
    {TG_OP_CROSS_ENTROPY, {{"Tlogits", "Ilabels"}, {"Floss", "Flse"}}},
    {TG_OP_CROSS_ENTROPY_BWD, {{"Fdloss", "Tlogits", "Ilabels", NULL, "Flse"}, {"Tdlogits"}}},
    {TG_OP_SPAN_LOSS, {{"Tlogits", "Ipositions", "Fnorm"}, {"Floss"}}},
    {TG_OP_SPAN_LOSS_BWD, {{"Fdloss", "Tlogits", "Ipositions", "Fnorm"}, {"Tdlogits"}}},
    {TG_OP_SCHEDULE, {{"Fstep", "Ftotal_steps", "Fnorm"}, {"Flr", "Fstep_out"}}},
    {TG_OP_GRAD_NORM, {{"Fgrads", "Fscale"}, {"Fnorm"}}},
    {TG_OP_GRAD_SQUARES, {{"Fgrads"}, {"Fsquares"}}},
    {TG_OP_NORM_OF_SQUARES, {{"Fsquares", "Fscale"}, {"Fnorm"}}},
    {TG_OP_ADAMW, {{"Fgrads", "Flr", "Fstep", "Fnorm", "Fscale"}, {"Fparams", "Mm", "Mv", "Hparams_half"}}},
    {TG_OP_ADAN, {{"Fgrads", "Flr", "Fstep", "Fnorm", "Fscale"}, {"Fparams", "Mm_d", "Mv_gprev", "Hparams_half"}}},
    {TG_OP_LOSS_SCALE_UPDATE, {{"Fnorm", "Fscale", "Ftracker"}, {"Fscale_out", "Ftracker_out"}}},
    {TG_OP_RESIDUAL_LAYERNORM, {{"Tx", "Tr", "Fgamma", "Fbeta", "Fstep"}, {"Ty", "Ts", "Fmean", "Frstd"}}},
    {TG_OP_RESIDUAL_LAYERNORM_BWD,
     {{"Tdy", "Ts", "Fgamma", "Fmean", "Frstd", "Tds_extra", "Fstep"}, {"Tds", "Tdx", "Fdgamma", "Fdbeta"}}},
    {TG_OP_RMSNORM, {{"Tx", "Fgamma"}, {"Ty", "Frstd"}}},
    {TG_OP_RMSNORM_BWD, {{"Tdy", "Tx", "Fgamma", "Frstd"}, {"Tdx", "Fdgamma"}}},
    {TG_OP_ROPE, {{"Tx", "Ipositions", "Tk", "Tv"}, {"Ty"}}},
    {TG_OP_ROPE_BWD, {{"Tdy", "Ipositions"}, {"Tdx", "Tdk", "Tdv"}}},
    {TG_OP_SWIGLU, {{"Tgate_up", "Tup"}, {"Ty"}}},
    {TG_OP_SWIGLU_BWD, {{"Tdy", "Tgate_up", "Tup"}, {"Tdgate_up", "Tdup"}}},
    {TG_OP_ALL_REDUCE, {{"Fx"}, {"Fx"}}},
    {TG_OP_REDUCE_SCATTER, {{"Fx"}, {"Fx"}}},
    {TG_OP_CONV2D, {{"Tx", "Tweight", "Fbias"}, {"Ty"}}},
    {TG_OP_CONV2D_BWD, {{"Tdy", "Tx", "Tweight"}, {"Tdx", "Fdweight", "Fdbias"}}},
    {TG_OP_BATCHNORM, {{"Tx", "Fgamma", "Fbeta", "Frunning_mean", "Frunning_var"}, {"Ty", "Fstats", "Frunning_mean", "Frunning_var"}}},
    {TG_OP_BATCHNORM_BWD, {{"Tdy", "Tx", "Fgamma", "Fstats", "Ty"}, {"Tdx", "Fdgamma", "Fdbeta"}}},
    {TG_OP_RELU6, {{"Tx"}, {"Ty"}}},
    {TG_OP_RELU6_BWD, {{"Tdy", "Ty"}, {"Tdx"}}},
    {TG_OP_IMAGE_INPUT, {{"Upixels", "Fstep"}, {"Ty"}}},
    {TG_OP_GLOBAL_AVG_POOL, {{"Tx"}, {"Ty"}}},
    {TG_OP_GLOBAL_AVG_POOL_BWD, {{"Tdy"}, {"Tdx"}}},
    {TG_OP_ALL_GATHER, {{"Ax", "Asrc"}, {"Ax"}}}, /* f32, 16-bit, or i32 ids (the word embedding's gather); the shape rule makes in1 x's dtype */
};

/* The rows indexed by kind, and how many rows name each kind (must be 1). */
struct dtype_table {
    dtype_rule by_kind[TG_OP_COUNT];
    int rows[TG_OP_COUNT];
};
static constexpr dtype_table dtype_table_of_rows() {
    dtype_table t{};
    for (const dtype_row &r : dtype_rows) {
        t.by_kind[r.kind] = r.rule;
        t.rows[r.kind]++;
    }
    return t;
}
static constexpr dtype_table dtype_rules = dtype_table_of_rows();
static constexpr bool every_kind_has_one_row() {
    for (int k = 0; k < TG_OP_COUNT; k++)
        if (dtype_rules.rows[k] != 1) return false;
    return true;
}
static_assert(every_kind_has_one_row(), "every op needs exactly one dtype rule row");

static int dtype_ok(char role, int dt, int *T) {
    switch (role) {
    case 'T':
        if (*T < 0) *T = dt;
        return dt == *T && (dt == TG_F32 || tg_dtype_half(dt));
    case 'F': return dt == TG_F32;
    case 'I': return dt == TG_I32;
    case 'U': return dt == TG_U8;
    case 'H': return tg_dtype_half(dt);
    case 'M': return dt == TG_F32 || dt == TG_BF16;
    case 'A': return tg_dtype_size(dt) > 0;
    default: return 0;
    }
}

int tg_check_dtypes(const tg_cuda_op_args *a, tg_err *err) {
    const int kind = a->op->kind;
    if (kind < 0 || kind >= TG_OP_COUNT) return 0;
    const dtype_rule *r = &dtype_rules.by_kind[kind];
    int T = -1, ok = 1, checked = 0;
    /* T slots first (they fix the storage type), then the rest. */
    for (int pass = 0; pass < 2; pass++)
        for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
            const int is_in = s < TG_OP_MAX_IN, k = is_in ? s : s - TG_OP_MAX_IN;
            const char *rule = is_in ? r->in[k] : r->out[k];
            const void *ptr = is_in ? a->in[k] : a->out[k];
            if (!rule || !ptr || (rule[0] == 'T') != (pass == 0)) continue;
            const int dt = is_in ? a->in_dtype[k] : a->out_dtype[k];
            checked = 1;
            if (rule[0] == 'S') ok &= dt == TG_F32 || (dt == T && tg_dtype_half(dt));
            else ok &= dtype_ok(rule[0], dt, &T);
        }
    if (!checked || ok) return 0;
    char msg[512] = "unsupported dtypes";
    size_t len = strlen(msg);
    for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
        const int is_in = s < TG_OP_MAX_IN, k = is_in ? s : s - TG_OP_MAX_IN;
        const char *rule = is_in ? r->in[k] : r->out[k];
        const void *ptr = is_in ? a->in[k] : a->out[k];
        if (!rule || !ptr || len >= sizeof msg) continue;
        const int dt = is_in ? a->in_dtype[k] : a->out_dtype[k];
        const int w = snprintf(msg + len, sizeof msg - len, " %s=%s", rule + 1, tg_dtype_name(dt));
        if (w > 0) len += (size_t)w;
    }
    return tg_fail(err, "%s", msg);
}

static const tg_cuda_launcher table[] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) tg_launch_##name,
#include "plan/ops.def"
};
static_assert(sizeof table / sizeof table[0] == TG_OP_COUNT, "every op needs a CUDA launcher");

extern "C" int tg_cuda_op_run(const tg_cuda_op_args *a, tg_err *err) {
    const int kind = a->op->kind;
    if (kind < 0 || kind >= TG_OP_COUNT) return tg_fail(err, "op kind %d is not a known op", kind);
    if (tg_check_dtypes(a, err) || table[kind](a, err)) return tg_fail_context(err, "op %s (%d)", tg_op_name(kind), kind);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return tg_fail(err, "op %s (%d): %s: %s", tg_op_name(kind), kind, cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
}

/* Floats of ctx->reduce_scratch an op needs; formulas next to each op's launcher. */
extern "C" int64_t tg_cuda_op_scratch_floats(const tg_op *op, const int64_t *in_numel) {
    switch (op->kind) {
    case TG_OP_EMBEDDING_BWD: return tg_scratch_embedding_bwd(op);
    case TG_OP_LAYERNORM_BWD: return tg_scratch_layernorm_bwd(op->p.layernorm_bwd.m, op->p.layernorm_bwd.d);
    case TG_OP_RESIDUAL_LAYERNORM_BWD: /* the same column stages */
        return tg_scratch_layernorm_bwd(op->p.residual_layernorm_bwd.m, op->p.residual_layernorm_bwd.d);
    case TG_OP_BIAS_GRAD: return tg_scratch_bias_grad(op);
    case TG_OP_GELU_BWD: return tg_scratch_gelu_bwd(op);
    case TG_OP_RMSNORM_BWD: return tg_scratch_rmsnorm_bwd(op);
    case TG_OP_MATMUL: return tg_scratch_matmul(op);
    case TG_OP_CONV2D_BWD: return tg_scratch_conv2d_bwd(op);
    case TG_OP_BATCHNORM: return tg_scratch_batchnorm(op);
    case TG_OP_BATCHNORM_BWD: return tg_scratch_batchnorm_bwd(op);
    case TG_OP_CROSS_ENTROPY: return tg_scratch_cross_entropy(op);
    case TG_OP_CROSS_ENTROPY_BWD: return tg_scratch_cross_entropy_bwd(op);
    case TG_OP_GRAD_NORM: return tg_scratch_grad_norm(op, in_numel);
    case TG_OP_ATTENTION:
    case TG_OP_ATTENTION_BWD: return tg_cudnn_attention_scratch_floats(op);
    default: return 0;
    }
}
