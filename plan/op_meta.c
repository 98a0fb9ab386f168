/* Per-op knowledge generated from plan/ops.def: the op table (names, slot signatures,
 * gradient contracts), the parameter walk, and each op's shape rule and FLOPs. */
#include "plan/op_meta.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the table --------------------------------------------------------------------- */

/* Parameters per set: n_params_<set>. */
#define TG_I(field, display) +1
#define TG_F(field, display) +1
#define TG_PARAMS(set, fields) enum { n_params_##set = 0 fields };
#include "plan/ops.def"
#undef TG_I
#undef TG_F
enum { n_params_none = 0 };

static const tg_op_info infos[] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) \
    [TG_OP_##KIND] = {#name, inputs, outputs, contract, n_params_##set, TG_GROUP_##group},
#include "plan/ops.def"
};
_Static_assert(sizeof infos / sizeof infos[0] == TG_OP_COUNT, "every op kind needs a row");

const tg_op_info *tg_op_info_of(int kind) { return kind >= 0 && kind < TG_OP_COUNT ? &infos[kind] : NULL; }

int tg_op_kind_of_name(const char *name) {
    for (int k = 0; k < TG_OP_COUNT; k++)
        if (!strcmp(infos[k].name, name)) return k;
    return -1;
}

const char *tg_op_name(int kind) {
    const tg_op_info *info = tg_op_info_of(kind);
    return info ? info->name : "?";
}

int tg_op_group_of(int kind) {
    const tg_op_info *info = tg_op_info_of(kind);
    return info ? info->group : TG_GROUP_MEMORY;
}

const char *tg_op_group_name(int group) {
    static const char *const names[TG_GROUP_COUNT] = {
        [TG_GROUP_MATMUL] = "matmul",       [TG_GROUP_ATTENTION] = "attention", [TG_GROUP_NORM] = "norm and elementwise",
        [TG_GROUP_EMBEDDING] = "embedding", [TG_GROUP_LOSS] = "loss",           [TG_GROUP_OPTIMIZER] = "optimizer",
        [TG_GROUP_MEMORY] = "memory",       [TG_GROUP_COMM] = "communication"};
    return group >= 0 && group < TG_GROUP_COUNT ? names[group] : "?";
}

int tg_op_out_contract(int kind, int slot) {
    const tg_op_info *info = tg_op_info_of(kind);
    if (!info || slot < 0 || (size_t)slot >= strlen(info->contract)) return TG_WRITE;
    return info->contract[slot] == '+' ? TG_ACCUMULATE : TG_WRITE;
}

/* ---- parameters -------------------------------------------------------------------- */

/* visit_<set>: calls the visitor on each field of the set, in ops.def order. */
#define TG_I(field, display) v->i64(v->ctx, display, &p->field);
#define TG_F(field, display) v->f32(v->ctx, display, &p->field);
#define TG_PARAMS(set, fields)                                                  \
    static void visit_##set(tg_op_params *params, const tg_param_visitor *v) { \
        tg_##set##_params *p = &params->set;                                    \
        fields                                                                  \
    }
#include "plan/ops.def"
#undef TG_I
#undef TG_F
static void visit_none(tg_op_params *params, const tg_param_visitor *v) {}

typedef void (*visit_fn)(tg_op_params *params, const tg_param_visitor *v);
static const visit_fn visitors[] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) [TG_OP_##KIND] = visit_##set,
#include "plan/ops.def"
};
_Static_assert(sizeof visitors / sizeof visitors[0] == TG_OP_COUNT, "every op kind needs a parameter walk");

void tg_op_params_visit(int kind, tg_op_params *params, const tg_param_visitor *v) {
    if (kind >= 0 && kind < TG_OP_COUNT) visitors[kind](params, v);
}

/* ---- shape rules ------------------------------------------------------------------- */

/* Each rule checks element counts against the op's parameters (shape inference for the
 * builders, which compute the shapes, and a guard against their bugs) after the slot
 * signatures have held: required slots are present, every present slot has its dtype.
 * NULL when consistent, else what is wrong.
 *
 * The parameters come from a plan file too, which may hold anything: every dimension a
 * kernel loops over is checked not to be negative before it is used, and every product of
 * dimensions is computed with an overflow check (PRODUCT), so a rule never overflows and
 * a product past int64 is refused by name ("batch*M*K overflows"). */

static int64_t numel(const tg_op_check_ctx *c, int t) { return t < 0 ? -1 : tg_tensor_numel(&c->tensors[t]); }

#define EXPECT(cond, msg)        \
    do {                         \
        if (!(cond)) return msg; \
    } while (0)

/* A dimension parameter: kernels loop over it and size copies by it. */
#define NOT_NEGATIVE(v, name) EXPECT((v) >= 0, name " is negative")

/* *out = the product of f[0..n), all non-negative; -1 when it overflows int64. */
static int checked_product(int64_t *out, const int64_t *f, int n) {
    int64_t r = 1;
    for (int i = 0; i < n; i++)
        /* GCOVR_EXCL_BR_START: every rule refuses a negative factor before its PRODUCT */
        if (f[i] < 0 || __builtin_mul_overflow(r, f[i], &r)) return -1;
        /* GCOVR_EXCL_BR_STOP */
    *out = r;
    return 0;
}

/* Declares `var` = the product of the (non-negative) factors, or fails the rule with
 * "<what> overflows". */
#define PRODUCT(var, what, ...)                                                     \
    int64_t var;                                                                    \
    do {                                                                            \
        const int64_t factors_[] = {__VA_ARGS__};                                   \
        if (checked_product(&var, factors_, (int)(sizeof factors_ / sizeof factors_[0]))) \
            return what " overflows";                                               \
    } while (0)

/* ZERO: one output of any size; the signature says it all. */
static const char *check_fill(const tg_op_check_ctx *c, const tg_op *op) { return NULL; }

/* FILL: one output of any size, scaled by an optional scalar. */
static const char *check_fill_value(const tg_op_check_ctx *c, const tg_op *op) {
    EXPECT(op->in[0] < 0 || numel(c, op->in[0]) == 1, "in[0]: the scale is not a scalar");
    return NULL;
}

static const char *check_embedding(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_embedding_params *p = &op->p.embedding;
    NOT_NEGATIVE(p->n, "N");
    NOT_NEGATIVE(p->vocab, "V");
    NOT_NEGATIVE(p->dim, "D");
    PRODUCT(table, "V*D", p->vocab, p->dim);
    PRODUCT(rows, "N*D", p->n, p->dim);
    EXPECT(numel(c, op->in[0]) == p->n, "in[0]: ids count != N");
    if (op->kind == TG_OP_EMBEDDING) {
        EXPECT(numel(c, op->in[1]) == table, "in[1]: table != V*D");
        EXPECT(numel(c, op->out[0]) == rows, "out[0]: output != N*D");
    } else {
        EXPECT(numel(c, op->in[1]) == rows, "in[1]: dout != N*D");
        EXPECT(numel(c, op->out[0]) == table, "out[0]: dtable != V*D");
    }
    return NULL;
}

/* ADD, GELU, GELU_BWD, TANH, TANH_BWD, RELU6, RELU6_BWD: every input (one or two) and out0
 * hold n elements. */
static const char *check_elementwise(const tg_op_check_ctx *c, const tg_op *op) {
    const int64_t n = op->kind == TG_OP_GELU       ? op->p.gelu.n
                      : op->kind == TG_OP_GELU_BWD ? op->p.gelu_bwd.n
                                                   : op->p.count.n;
    NOT_NEGATIVE(n, "n");
    EXPECT(numel(c, op->in[0]) == n, "in[0]: size != n");
    EXPECT(op->in[1] < 0 || numel(c, op->in[1]) == n, "in[1]: size != n");
    EXPECT(numel(c, op->out[0]) == n, "out[0]: size != n");
    if (op->kind == TG_OP_GELU_BWD) {
        const int64_t cols = op->p.gelu_bwd.bias_cols;
        EXPECT((op->out[1] >= 0) == (cols > 0), "out[1]: the bias gradient is present exactly when bias_cols > 0");
        EXPECT(cols <= 0 || (n % cols == 0 && numel(c, op->out[1]) == cols),
               "out[1]: bias gradient != bias_cols columns of dx");
        EXPECT(op->out[2] < 0 || (numel(c, op->out[2]) == n && c->tensors[op->out[2]].dtype == c->tensors[op->out[0]].dtype),
               "out[2]: the recomputed GELU output != n elements of dx's dtype");
    }
    return NULL;
}

/* MLM_MASK: ids, mask, masked ids and labels of n elements; a scalar step counter; p in
 * (0, 1) and mask_id a token of the vocabulary (the special ids may be anything: -1 unused). */
static const char *check_mlm_mask(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_mlm_mask_params *p = &op->p.mlm_mask;
    NOT_NEGATIVE(p->n, "n");
    EXPECT(numel(c, op->in[0]) == p->n, "in[0]: ids != n");
    EXPECT(numel(c, op->in[1]) == p->n, "in[1]: mask != n");
    EXPECT(numel(c, op->in[2]) == 1, "in[2]: step counter is not a scalar");
    EXPECT(op->in[3] < 0 || numel(c, op->in[3]) == 4, "in[3]: the stream is not [4] (step, first element, seed)");
    EXPECT(numel(c, op->out[0]) == p->n, "out[0]: masked ids != n");
    EXPECT(numel(c, op->out[1]) == p->n, "out[1]: labels != n");
    EXPECT(p->vocab > 0 && p->vocab <= INT32_MAX, "V outside [1, 2^31)");
    EXPECT(p->mask_id >= 0 && p->mask_id < p->vocab, "mask_id outside [0, V)");
    EXPECT(p->p > 0.0f && p->p < 1.0f, "p outside (0, 1)");
    return NULL;
}

static const char *check_dropout(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_dropout_params *p = &op->p.dropout;
    NOT_NEGATIVE(p->n, "n");
    EXPECT(numel(c, op->in[0]) == p->n, "in[0]: size != n");
    EXPECT(numel(c, op->out[0]) == p->n, "out[0]: size != n");
    EXPECT(numel(c, op->in[1]) == 1, "in[1]: step counter is not a scalar");
    EXPECT(p->p >= 0.0f && p->p < 1.0f, "p outside [0, 1)");
    return NULL;
}

static const char *check_matmul(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_matmul_params *p = &op->p.matmul;
    const int64_t m = p->m, n = p->n, k = p->k, b = p->batch;
    EXPECT(m > 0 && n > 0 && k > 0 && b > 0, "non-positive dims");
    PRODUCT(a_size, "batch*M*K", b, m, k);
    PRODUCT(b_size, "batch*K*N", b, k, n);
    PRODUCT(c_size, "batch*M*N", b, m, n);
    EXPECT(numel(c, op->in[0]) == a_size, "in[0]: A != batch*M*K");
    EXPECT(numel(c, op->in[1]) == b_size, "in[1]: B != batch*K*N");
    EXPECT(numel(c, op->out[0]) == c_size, "out[0]: C != batch*M*N");
    EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == n, "in[2]: bias != N");
    /* The fused bias gradient: the sums over k of dC, which must be stored [K, M] as A or
     * [K, N] as B, so that it is the stored operand's column sums. */
    const int64_t bg = p->bias_grad;
    EXPECT(bg >= 0 && bg <= 2, "bias_grad must be 0, 1 or 2");
    EXPECT((op->out[1] >= 0) == (bg != 0), "out[1]: present exactly when bias_grad != 0");
    if (bg) {
        EXPECT(b == 1, "a bias gradient needs batch 1");
        EXPECT(op->in[2] < 0, "in[2]: a bias gradient takes no bias input");
        EXPECT(bg == 1 ? p->trans_a != 0 : p->trans_b == 0, "a bias gradient sums A stored [K,M] or B stored [K,N]");
        EXPECT(numel(c, op->out[1]) == (bg == 1 ? m : n), "out[1]: bias gradient != M (bias_grad=1) or N (bias_grad=2)");
    }
    /* The activation epilogue: the pre-activation it writes (GELU) or reads (GELU backward)
     * is shaped like out0. */
    const int64_t act = p->activation;
    EXPECT(act >= TG_MATMUL_ACT_NONE && act <= TG_MATMUL_ACT_GELU_BWD, "activation must be 0, 1 or 2");
    EXPECT((op->out[2] >= 0) == (act == TG_MATMUL_ACT_GELU), "out[2]: present exactly when activation = 1");
    EXPECT((op->in[3] >= 0) == (act == TG_MATMUL_ACT_GELU_BWD), "in[3]: present exactly when activation = 2");
    if (act) {
        EXPECT(b == 1, "an activation epilogue needs batch 1");
        EXPECT(!p->accumulate && !bg, "an activation epilogue takes no accumulate and no bias gradient");
        EXPECT(act == TG_MATMUL_ACT_GELU || op->in[2] < 0, "in[2]: the GELU backward epilogue takes no bias");
        if (act == TG_MATMUL_ACT_GELU) EXPECT(numel(c, op->out[2]) == c_size, "out[2]: pre-activation != M*N");
        else EXPECT(numel(c, op->in[3]) == c_size, "in[3]: pre-activation != M*N");
    }
    return NULL;
}

static const char *check_bias_grad(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_bias_grad_params *p = &op->p.bias_grad;
    NOT_NEGATIVE(p->m, "M");
    NOT_NEGATIVE(p->n, "N");
    PRODUCT(dout, "M*N", p->m, p->n);
    EXPECT(numel(c, op->in[0]) == dout, "in[0]: dout != M*N");
    EXPECT(numel(c, op->out[0]) == p->n, "out[0]: dbias != N");
    return NULL;
}

static const char *check_layernorm(const tg_op_check_ctx *c, const tg_op *op) {
    const int64_t m = op->p.layernorm.m, d = op->p.layernorm.d;
    NOT_NEGATIVE(m, "M");
    NOT_NEGATIVE(d, "D");
    PRODUCT(md, "M*D", m, d);
    EXPECT(numel(c, op->in[0]) == md, "in[0]: x != M*D");
    EXPECT(numel(c, op->in[1]) == d, "in[1]: gamma != D");
    EXPECT(numel(c, op->in[2]) == d, "in[2]: beta != D");
    EXPECT(numel(c, op->out[0]) == md, "out[0]: y != M*D");
    EXPECT(numel(c, op->out[1]) == m, "out[1]: mean != M");
    EXPECT(numel(c, op->out[2]) == m, "out[2]: rstd != M");
    return NULL;
}

static const char *check_layernorm_bwd(const tg_op_check_ctx *c, const tg_op *op) {
    const int64_t m = op->p.layernorm_bwd.m, d = op->p.layernorm_bwd.d;
    NOT_NEGATIVE(m, "M");
    NOT_NEGATIVE(d, "D");
    PRODUCT(md, "M*D", m, d);
    EXPECT(numel(c, op->in[0]) == md, "in[0]: dy != M*D");
    EXPECT(numel(c, op->in[1]) == md, "in[1]: x != M*D");
    EXPECT(numel(c, op->in[2]) == d, "in[2]: gamma != D");
    EXPECT(numel(c, op->in[3]) == m, "in[3]: mean != M");
    EXPECT(numel(c, op->in[4]) == m, "in[4]: rstd != M");
    EXPECT(numel(c, op->out[0]) == md, "out[0]: dx != M*D");
    EXPECT(numel(c, op->out[1]) == d, "out[1]: dgamma != D");
    EXPECT(numel(c, op->out[2]) == d, "out[2]: dbeta != D");
    return NULL;
}

/* CONV2D's and CONV2D_BWD's shape (the parameters both share): positive sizes, groups
 * dividing both channel counts, a kernel that fits the padded image; *oh and *ow the output
 * size, *xs, *ws and *ys the element counts of x, the weight and y. */
static const char *conv2d_shape(const tg_conv2d_params *p, int64_t *xs, int64_t *ws, int64_t *ys) {
    EXPECT(p->n > 0 && p->c_in > 0 && p->h > 0 && p->w > 0 && p->c_out > 0 && p->k > 0,
           "non-positive dims (N, C_in, H, W, C_out, K)");
    EXPECT(p->stride > 0, "stride is not positive");
    NOT_NEGATIVE(p->pad, "pad");
    EXPECT(p->groups > 0 && p->c_in % p->groups == 0 && p->c_out % p->groups == 0,
           "groups does not divide C_in and C_out");
    EXPECT(p->h <= INT32_MAX && p->w <= INT32_MAX && p->k <= INT32_MAX && p->pad <= INT32_MAX,
           "H, W, K or pad past 2^31");
    EXPECT(p->h + 2 * p->pad >= p->k && p->w + 2 * p->pad >= p->k, "K is larger than the padded image");
    const int64_t oh = (p->h + 2 * p->pad - p->k) / p->stride + 1, ow = (p->w + 2 * p->pad - p->k) / p->stride + 1;
    PRODUCT(x, "N*C_in*H*W", p->n, p->c_in, p->h, p->w);
    PRODUCT(wt, "C_out*(C_in/groups)*K*K", p->c_out, p->c_in / p->groups, p->k, p->k);
    PRODUCT(y, "N*C_out*OH*OW", p->n, p->c_out, oh, ow);
    *xs = x, *ws = wt, *ys = y;
    return NULL;
}

static const char *check_conv2d(const tg_op_check_ctx *c, const tg_op *op) {
    int64_t xs, ws, ys;
    const char *bad = conv2d_shape(&op->p.conv2d, &xs, &ws, &ys);
    if (bad) return bad;
    EXPECT(numel(c, op->in[0]) == xs, "in[0]: x != N*C_in*H*W");
    EXPECT(numel(c, op->in[1]) == ws, "in[1]: weight != C_out*(C_in/groups)*K*K");
    EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == op->p.conv2d.c_out, "in[2]: bias != C_out");
    EXPECT(numel(c, op->out[0]) == ys, "out[0]: y != N*C_out*OH*OW");
    return NULL;
}

static const char *check_conv2d_bwd(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_conv2d_bwd_params *b = &op->p.conv2d_bwd;
    const tg_conv2d_params p = {b->n, b->c_in, b->h, b->w, b->c_out, b->k, b->stride, b->pad, b->groups};
    int64_t xs, ws, ys;
    const char *bad = conv2d_shape(&p, &xs, &ws, &ys);
    if (bad) return bad;
    EXPECT(op->out[0] >= 0 || op->out[1] >= 0 || op->out[2] >= 0, "no output: dx, dweight and dbias are all absent");
    EXPECT(numel(c, op->in[0]) == ys, "in[0]: dy != N*C_out*OH*OW");
    EXPECT((op->out[1] < 0) || op->in[1] >= 0, "in[1]: dweight needs x");
    EXPECT((op->out[0] < 0) || op->in[2] >= 0, "in[2]: dx needs the weight");
    EXPECT(op->in[1] < 0 || numel(c, op->in[1]) == xs, "in[1]: x != N*C_in*H*W");
    EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == ws, "in[2]: weight != C_out*(C_in/groups)*K*K");
    EXPECT(op->out[0] < 0 || numel(c, op->out[0]) == xs, "out[0]: dx != N*C_in*H*W");
    EXPECT(op->out[1] < 0 || numel(c, op->out[1]) == ws, "out[1]: dweight != C_out*(C_in/groups)*K*K");
    EXPECT(op->out[2] < 0 || numel(c, op->out[2]) == b->c_out, "out[2]: dbias != C_out");
    return NULL;
}

/* BATCHNORM: x and y [N HW, C] (channels last; checked as the element count), gamma, beta
 * and the running statistics [C], stats [2, C]; the running statistics both or neither,
 * updated in place; eps positive, momentum in [0, 1]. */
static const char *check_batchnorm(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_batchnorm_params *p = &op->p.batchnorm;
    EXPECT(p->n > 0 && p->c > 0 && p->hw > 0, "non-positive dims (N, C, HW)");
    PRODUCT(x, "N*C*HW", p->n, p->c, p->hw);
    EXPECT(numel(c, op->in[0]) == x, "in[0]: x != N*C*HW");
    EXPECT(numel(c, op->in[1]) == p->c, "in[1]: gamma != C");
    EXPECT(numel(c, op->in[2]) == p->c, "in[2]: beta != C");
    EXPECT((op->in[3] >= 0) == (op->in[4] >= 0), "in[3], in[4]: the running mean and variance, both or neither");
    EXPECT(op->in[3] < 0 || numel(c, op->in[3]) == p->c, "in[3]: running mean != C");
    EXPECT(op->in[4] < 0 || numel(c, op->in[4]) == p->c, "in[4]: running variance != C");
    EXPECT(numel(c, op->out[0]) == x, "out[0]: y != N*C*HW");
    EXPECT(numel(c, op->out[1]) == 2 * p->c, "out[1]: stats != 2*C");
    EXPECT(op->out[2] == op->in[3], "out[2]: the running mean is updated in place: must be in[3]");
    EXPECT(op->out[3] == op->in[4], "out[3]: the running variance is updated in place: must be in[4]");
    EXPECT(p->eps > 0.0f && isfinite(p->eps), "eps: not finite and positive");
    EXPECT(p->momentum >= 0.0f && p->momentum <= 1.0f, "momentum outside [0, 1]");
    EXPECT(p->relu6 == 0 || p->relu6 == 1, "relu6: not 0 or 1");
    return NULL;
}

static const char *check_batchnorm_bwd(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_batchnorm_bwd_params *p = &op->p.batchnorm_bwd;
    EXPECT(p->n > 0 && p->c > 0 && p->hw > 0, "non-positive dims (N, C, HW)");
    PRODUCT(x, "N*C*HW", p->n, p->c, p->hw);
    EXPECT(numel(c, op->in[0]) == x, "in[0]: dy != N*C*HW");
    EXPECT(numel(c, op->in[1]) == x, "in[1]: x != N*C*HW");
    EXPECT(numel(c, op->in[2]) == p->c, "in[2]: gamma != C");
    EXPECT(numel(c, op->in[3]) == 2 * p->c, "in[3]: stats != 2*C");
    EXPECT(numel(c, op->out[0]) == x, "out[0]: dx != N*C*HW");
    EXPECT(op->out[1] < 0 || numel(c, op->out[1]) == p->c, "out[1]: dgamma != C");
    EXPECT(op->out[2] < 0 || numel(c, op->out[2]) == p->c, "out[2]: dbeta != C");
    EXPECT(p->eps > 0.0f && isfinite(p->eps), "eps: not finite and positive");
    EXPECT(p->relu6 == 0 || p->relu6 == 1, "relu6: not 0 or 1");
    EXPECT(p->relu6 ? op->in[4] >= 0 && numel(c, op->in[4]) == x : op->in[4] < 0,
           p->relu6 ? "in[4]: the forward's output != N*C*HW (relu6 needs it)" : "in[4]: set without relu6");
    return NULL;
}

/* GLOBAL_AVG_POOL and its backward: [N, HW, C] on one side, [N, C] on the other. */
/* IMAGE_INPUT: pixels [N, C, S, S] and x [N, S, S, C] (N*C*S*S elements each); C 1 to 3
 * with a finite mean and a positive finite std for each; the step counter with an
 * augmentation; the crop padding below the image size (torchvision's limit is the image
 * itself: a window past it would hold no pixel). */
static const char *check_image_input(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_image_input_params *p = &op->p.image_input;
    EXPECT(p->n > 0 && p->size > 0, "non-positive dims (N, S)");
    EXPECT(p->c >= 1 && p->c <= 3, "C outside [1, 3]");
    PRODUCT(e, "N*C*S*S", p->n, p->c, p->size, p->size);
    EXPECT(numel(c, op->in[0]) == e, "in[0]: pixels != N*C*S*S");
    EXPECT(numel(c, op->out[0]) == e, "out[0]: x != N*S*S*C");
    EXPECT(p->crop_pad >= 0 && p->crop_pad < p->size, "crop_pad outside [0, S)");
    EXPECT(p->flip == 0 || p->flip == 1, "flip is not 0 or 1");
    EXPECT(p->key >= 0 && p->key <= UINT32_MAX, "key outside [0, 2^32)");
    EXPECT((p->crop_pad == 0 && !p->flip) || (op->in[1] >= 0 && numel(c, op->in[1]) == 1),
           "in[1]: an augmentation needs the step counter (a scalar)");
    const float mean[3] = {p->mean0, p->mean1, p->mean2}, std[3] = {p->std0, p->std1, p->std2};
    for (int k = 0; k < p->c; k++) {
        EXPECT(isfinite(mean[k]), "a channel's mean is not finite");
        EXPECT(isfinite(std[k]) && std[k] > 0.0f, "a channel's std is not positive and finite");
    }
    return NULL;
}

static const char *check_avg_pool(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_avg_pool_params *p = &op->p.avg_pool;
    EXPECT(p->n > 0 && p->c > 0 && p->hw > 0, "non-positive dims (N, C, HW)");
    PRODUCT(x, "N*C*HW", p->n, p->c, p->hw);
    PRODUCT(y, "N*C", p->n, p->c);
    const int fwd = op->kind == TG_OP_GLOBAL_AVG_POOL;
    EXPECT(numel(c, op->in[0]) == (fwd ? x : y), fwd ? "in[0]: x != N*C*HW" : "in[0]: dy != N*C");
    EXPECT(numel(c, op->out[0]) == (fwd ? y : x), fwd ? "out[0]: y != N*C" : "out[0]: dx != N*C*HW");
    return NULL;
}

/* RMSNORM: x and y [M,D], gamma [D], rstd [M]. */
static const char *check_rmsnorm(const tg_op_check_ctx *c, const tg_op *op) {
    const int64_t m = op->p.rmsnorm.m, d = op->p.rmsnorm.d;
    NOT_NEGATIVE(m, "M");
    NOT_NEGATIVE(d, "D");
    PRODUCT(md, "M*D", m, d);
    EXPECT(numel(c, op->in[0]) == md, "in[0]: x != M*D");
    EXPECT(numel(c, op->in[1]) == d, "in[1]: gamma != D");
    EXPECT(numel(c, op->out[0]) == md, "out[0]: y != M*D");
    EXPECT(numel(c, op->out[1]) == m, "out[1]: rstd != M");
    return NULL;
}

static const char *check_rmsnorm_bwd(const tg_op_check_ctx *c, const tg_op *op) {
    const int64_t m = op->p.rmsnorm.m, d = op->p.rmsnorm.d;
    NOT_NEGATIVE(m, "M");
    NOT_NEGATIVE(d, "D");
    PRODUCT(md, "M*D", m, d);
    EXPECT(numel(c, op->in[0]) == md, "in[0]: dy != M*D");
    EXPECT(numel(c, op->in[1]) == md, "in[1]: x != M*D");
    EXPECT(numel(c, op->in[2]) == d, "in[2]: gamma != D");
    EXPECT(numel(c, op->in[3]) == m, "in[3]: rstd != M");
    EXPECT(numel(c, op->out[0]) == md, "out[0]: dx != M*D");
    EXPECT(op->out[1] < 0 || numel(c, op->out[1]) == d, "out[1]: dgamma != D");
    return NULL;
}

/* ROPE and ROPE_BWD: the packed projections [N, (H + 2 Hkv) Dh] on one side, the
 * attention's packed input [N, 3 H Dh] on the other, N position ids; Dh even, H a multiple
 * of Hkv, a known rope type with finite positive frequencies. */
static const char *check_rope(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_rope_params *p = &op->p.rope;
    NOT_NEGATIVE(p->n, "N");
    EXPECT(p->h >= 1 && p->kv_heads >= 1 && p->h % p->kv_heads == 0, "H must be a positive multiple of Hkv >= 1");
    EXPECT(p->head_dim >= 2 && p->head_dim % 2 == 0, "Dh must be even and positive");
    EXPECT(p->type == TG_ROPE_DEFAULT || p->type == TG_ROPE_LLAMA3, "rope is not a known rope type");
    EXPECT(isfinite(p->theta) && p->theta > 1.0f, "theta must be finite and above 1");
    if (p->type == TG_ROPE_LLAMA3) {
        EXPECT(isfinite(p->factor) && p->factor >= 1.0f, "factor must be finite and at least 1");
        EXPECT(isfinite(p->low_freq) && isfinite(p->high_freq) && p->low_freq > 0.0f && p->high_freq > p->low_freq,
               "low_freq and high_freq must be finite with 0 < low_freq < high_freq");
        EXPECT(p->original_max >= 1, "original_max must be positive");
    }
    /* Hkv divides H, so H + 2 Hkv <= 3H: with 3H checked, neither sum nor product of the
     * parameters is computed past int64. */
    PRODUCT(h3, "3H", 3, p->h);
    PRODUCT(packed, "N*(H+2Hkv)*Dh", p->n, p->h + 2 * p->kv_heads, p->head_dim);
    PRODUCT(expanded, "N*3H*Dh", p->n, h3, p->head_dim);
    PRODUCT(q, "N*H*Dh", p->n, p->h, p->head_dim);
    PRODUCT(kv, "N*Hkv*Dh", p->n, p->kv_heads, p->head_dim);
    const int fwd = op->kind == TG_OP_ROPE;
    const int *parts = fwd ? op->in : op->out; /* q (or q|k|v), then k and v when apart */
    const int k_slot = fwd ? 2 : 1, apart = parts[k_slot] >= 0;
    EXPECT((parts[k_slot + 1] >= 0) == apart, fwd ? "in[2] and in[3]: k and v come together or not at all"
                                                   : "out[1] and out[2]: dk and dv come together or not at all");
    EXPECT(numel(c, fwd ? op->out[0] : op->in[0]) == expanded, fwd ? "out[0]: != N*3H*Dh" : "in[0]: dout != N*3H*Dh");
    EXPECT(numel(c, op->in[1]) == p->n, "in[1]: position ids != N");
    if (!apart) {
        EXPECT(numel(c, parts[0]) == packed, fwd ? "in[0]: qkv != N*(H+2Hkv)*Dh" : "out[0]: dqkv != N*(H+2Hkv)*Dh");
        return NULL;
    }
    EXPECT(numel(c, parts[0]) == q, fwd ? "in[0]: q != N*H*Dh" : "out[0]: dq != N*H*Dh");
    EXPECT(numel(c, parts[k_slot]) == kv && numel(c, parts[k_slot + 1]) == kv,
           fwd ? "in[2], in[3]: k or v != N*Hkv*Dh" : "out[1], out[2]: dk or dv != N*Hkv*Dh");
    return NULL;
}

/* SWIGLU and SWIGLU_BWD: gate_up [M, 2I], the activation or its gradient [M, I]. */
static const char *check_swiglu(const tg_op_check_ctx *c, const tg_op *op) {
    const int64_t m = op->p.swiglu.m, i = op->p.swiglu.i;
    NOT_NEGATIVE(m, "M");
    NOT_NEGATIVE(i, "I");
    PRODUCT(mi, "M*I", m, i);
    PRODUCT(wide, "M*2I", m, i, 2);
    if (op->kind == TG_OP_SWIGLU) {
        const int apart = op->in[1] >= 0; /* gate and up made apart */
        EXPECT(numel(c, op->in[0]) == (apart ? mi : wide), apart ? "in[0]: gate != M*I" : "in[0]: gate_up != M*2I");
        EXPECT(!apart || numel(c, op->in[1]) == mi, "in[1]: up != M*I");
        EXPECT(numel(c, op->out[0]) == mi, "out[0]: != M*I");
    } else {
        const int apart = op->in[2] >= 0;
        EXPECT((op->out[1] >= 0) == apart, "out[1]: d up is present exactly when in[2] (up) is");
        EXPECT(numel(c, op->in[0]) == mi, "in[0]: dy != M*I");
        EXPECT(numel(c, op->in[1]) == (apart ? mi : wide), apart ? "in[1]: gate != M*I" : "in[1]: gate_up != M*2I");
        EXPECT(numel(c, op->out[0]) == (apart ? mi : wide), apart ? "out[0]: dgate != M*I" : "out[0]: dgate_up != M*2I");
        EXPECT(!apart || (numel(c, op->in[2]) == mi && numel(c, op->out[1]) == mi), "in[2], out[1]: up or d up != M*I");
    }
    return NULL;
}

/* Both residual LayerNorm ops: [M,D] operands, [M] row statistics, and the dropout's step
 * counter present whenever p > 0. */
static const char *check_residual_layernorm(const tg_op_check_ctx *c, const tg_op *op) {
    const int bwd = op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD;
    const int64_t m = bwd ? op->p.residual_layernorm_bwd.m : op->p.residual_layernorm.m;
    const int64_t d = bwd ? op->p.residual_layernorm_bwd.d : op->p.residual_layernorm.d;
    const float p = bwd ? op->p.residual_layernorm_bwd.p : op->p.residual_layernorm.p;
    EXPECT(m > 0 && d > 0, "non-positive dims");
    EXPECT(p >= 0.0f && p < 1.0f, "dropout p outside [0, 1)");
    PRODUCT(md, "M*D", m, d);
    EXPECT(numel(c, op->in[2]) == d, "in[2]: gamma != D");
    if (!bwd) {
        EXPECT(numel(c, op->in[0]) == md, "in[0]: x != M*D");
        EXPECT(numel(c, op->in[1]) == md, "in[1]: r != M*D");
        EXPECT(numel(c, op->in[3]) == d, "in[3]: beta != D");
        EXPECT(op->in[4] < 0 || numel(c, op->in[4]) == 1, "in[4]: step counter is not a scalar");
        EXPECT(p <= 0.0f || op->in[4] >= 0, "in[4]: dropout needs the step counter");
        EXPECT(numel(c, op->out[0]) == md, "out[0]: y != M*D");
        EXPECT(numel(c, op->out[1]) == md, "out[1]: s != M*D");
        EXPECT(numel(c, op->out[2]) == m, "out[2]: mean != M");
        EXPECT(numel(c, op->out[3]) == m, "out[3]: rstd != M");
        return NULL;
    }
    EXPECT(numel(c, op->in[0]) == md, "in[0]: dy != M*D");
    EXPECT(numel(c, op->in[1]) == md, "in[1]: s != M*D");
    EXPECT(numel(c, op->in[3]) == m, "in[3]: mean != M");
    EXPECT(numel(c, op->in[4]) == m, "in[4]: rstd != M");
    EXPECT(op->in[5] < 0 || numel(c, op->in[5]) == md, "in[5]: ds_extra != M*D");
    EXPECT(op->in[6] < 0 || numel(c, op->in[6]) == 1, "in[6]: step counter is not a scalar");
    EXPECT(p <= 0.0f || op->in[6] >= 0, "in[6]: dropout needs the step counter");
    EXPECT(numel(c, op->out[0]) == md, "out[0]: ds != M*D");
    EXPECT(numel(c, op->out[1]) == md, "out[1]: dx != M*D");
    EXPECT(numel(c, op->out[2]) == d, "out[2]: dgamma != D");
    EXPECT(numel(c, op->out[3]) == d, "out[3]: dbeta != D");
    return NULL;
}

/* in2 (optional) is the dropout step counter. */
static const char *check_softmax(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_softmax_params *p = &op->p.softmax;
    NOT_NEGATIVE(p->b, "B");
    NOT_NEGATIVE(p->h, "H");
    NOT_NEGATIVE(p->t, "T");
    PRODUCT(probs, "B*H*T*T", p->b, p->h, p->t, p->t);
    PRODUCT(mask, "B*T", p->b, p->t);
    EXPECT(numel(c, op->in[0]) == probs, "in[0]: scores != B*H*T*T");
    EXPECT(op->in[1] < 0 || numel(c, op->in[1]) == mask, "in[1]: mask != B*T");
    EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == 1, "in[2]: step counter is not a scalar");
    EXPECT(numel(c, op->out[0]) == probs, "out[0]: probs != B*H*T*T");
    EXPECT(op->out[1] < 0 || numel(c, op->out[1]) == probs, "out[1]: dropped probs != B*H*T*T");
    EXPECT(op->out[1] < 0 || p->p <= 0.0f || op->in[2] >= 0, "in[2]: dropout needs the step counter");
    EXPECT(p->p >= 0.0f && p->p < 1.0f, "dropout p outside [0, 1)");
    return NULL;
}

static const char *check_softmax_bwd(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_softmax_bwd_params *p = &op->p.softmax_bwd;
    NOT_NEGATIVE(p->b, "B");
    NOT_NEGATIVE(p->h, "H");
    NOT_NEGATIVE(p->t, "T");
    PRODUCT(probs, "B*H*T*T", p->b, p->h, p->t, p->t);
    EXPECT(numel(c, op->in[0]) == probs, "in[0]: dD != B*H*T*T");
    EXPECT(numel(c, op->in[1]) == probs, "in[1]: probs != B*H*T*T");
    EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == 1, "in[2]: step counter is not a scalar");
    EXPECT(numel(c, op->out[0]) == probs, "out[0]: dscores != B*H*T*T");
    EXPECT(p->p >= 0.0f && p->p < 1.0f, "dropout p outside [0, 1)");
    return NULL;
}

/* Both fused attention ops. q/k/v are [B*T, H*Dh] (or qkv [B*T, 3*H*Dh] when packed),
 * the key mask [B,T] optional. With dropout (p > 0) the forward reads the step counter and
 * writes the keep bits [B,H,T,ceil(T/32)], which the backward reads in its place. */
static const char *check_attention(const tg_op_check_ctx *c, const tg_op *op) {
    /* Where q/k/v (or qkv) sit: forward in0..in2, backward in5..in7; their gradients. */
    static const char *const qkv_size[2][3] = {
        {"in[0]: q != B*T*H*Dh", "in[1]: k != B*T*H*Dh", "in[2]: v != B*T*H*Dh"},
        {"in[5]: q != B*T*H*Dh", "in[6]: k != B*T*H*Dh", "in[7]: v != B*T*H*Dh"}};
    static const char *const grad_size[3] = {"out[0]: dq differs from q in size", "out[1]: dk differs from k in size",
                                             "out[2]: dv differs from v in size"};
    const tg_attention_params *p = &op->p.attention;
    const int64_t b = p->b, h = p->h, t = p->t, dh = p->head_dim;
    const int packed = p->packed != 0, bwd = op->kind == TG_OP_ATTENTION_BWD;
    EXPECT(b > 0 && h > 0 && t > 0 && dh > 0, "non-positive dims");
    EXPECT(p->packed == 0 || p->packed == 1, "packed must be 0 or 1");
    EXPECT(p->p >= 0.0f && p->p < 1.0f, "dropout p outside [0, 1)");
    PRODUCT(rows, "B*T", b, t);
    PRODUCT(d, "H*Dh", h, dh);
    PRODUCT(qkv_elems, "B*T*H*Dh", rows, d);
    PRODUCT(packed_elems, "B*T*3*H*Dh", qkv_elems, 3);
    PRODUCT(rows_per_head, "B*H*T", b, h, t); /* GCOVR_EXCL_BR_LINE: B*H*T <= B*T*H*Dh, which did not overflow */
    PRODUCT(bit_words, "B*H*T*ceil(T/32)", rows_per_head, t / 32 + (t % 32 != 0));
    const int32_t *qkv = bwd ? op->in + 5 : op->in;
    if (packed) {
        EXPECT(numel(c, qkv[0]) == packed_elems, bwd ? "in[5]: qkv != B*T*3*H*Dh" : "in[0]: qkv != B*T*3*H*Dh");
        EXPECT(qkv[1] < 0 && qkv[2] < 0, bwd ? "in[6], in[7]: packed attention takes one qkv input"
                                             : "in[1], in[2]: packed attention takes one qkv input");
    } else {
        for (int s = 0; s < 3; s++) EXPECT(numel(c, qkv[s]) == qkv_elems, qkv_size[bwd][s]);
    }
    EXPECT(op->in[3] < 0 || numel(c, op->in[3]) == rows, "in[3]: mask != B*T");
    const int drop = p->p > 0.0f, bits = bwd ? op->in[4] : op->out[2];
    EXPECT((bits >= 0) == drop, bwd ? "in[4]: keep bits present exactly when p > 0"
                                    : "out[2]: keep bits present exactly when p > 0");
    EXPECT(bits < 0 || numel(c, bits) == bit_words,
           bwd ? "in[4]: keep bits != B*H*T*ceil(T/32)" : "out[2]: keep bits != B*H*T*ceil(T/32)");
    if (!bwd) {
        EXPECT(op->in[4] < 0 || numel(c, op->in[4]) == 1, "in[4]: step counter is not a scalar");
        EXPECT(!drop || op->in[4] >= 0, "in[4]: dropout needs the step counter");
        EXPECT(numel(c, op->out[0]) == qkv_elems, "out[0]: O != B*T*H*Dh");
        EXPECT(numel(c, op->out[1]) == rows_per_head, "out[1]: LSE != B*H*T");
        return NULL;
    }
    EXPECT(numel(c, op->in[0]) == qkv_elems, "in[0]: dO != B*T*H*Dh");
    EXPECT(numel(c, op->in[1]) == qkv_elems, "in[1]: O != B*T*H*Dh");
    EXPECT(numel(c, op->in[2]) == rows_per_head, "in[2]: LSE != B*H*T");
    for (int s = 0; s < (packed ? 1 : 3); s++) EXPECT(numel(c, op->out[s]) == numel(c, qkv[s]), grad_size[s]);
    EXPECT(!packed || (op->out[1] < 0 && op->out[2] < 0), "out[1], out[2]: packed attention has one input gradient");
    EXPECT(numel(c, op->out[3]) == rows_per_head, "out[3]: delta != B*H*T");
    return NULL;
}

static const char *check_heads(const tg_op_check_ctx *c, const tg_op *op) {
    static const char *const part_size[2][3] = {
        {"in[0]: part != B*H*T*Dh", "in[1]: part != B*H*T*Dh", "in[2]: part != B*H*T*Dh"},
        {"out[0]: part != B*H*T*Dh", "out[1]: part != B*H*T*Dh", "out[2]: part != B*H*T*Dh"}};
    static const char *const part_unused[2][3] = {
        {"in[0]: a part past P", "in[1]: a part past P", "in[2]: a part past P"},
        {"out[0]: a part past P", "out[1]: a part past P", "out[2]: a part past P"}};
    const tg_heads_params *p = &op->p.heads;
    EXPECT(p->parts >= 1 && p->parts <= 3, "P must be 1..3");
    NOT_NEGATIVE(p->b, "B");
    NOT_NEGATIVE(p->t, "T");
    NOT_NEGATIVE(p->h, "H");
    NOT_NEGATIVE(p->head_dim, "Dh");
    PRODUCT(part, "B*H*T*Dh", p->b, p->h, p->t, p->head_dim);
    PRODUCT(whole, "B*T*P*H*Dh", part, p->parts);
    const int split = op->kind == TG_OP_HEADS_SPLIT;
    const int32_t *parts = split ? op->out : op->in;
    EXPECT(numel(c, split ? op->in[0] : op->out[0]) == whole,
           split ? "in[0]: packed != B*T*P*H*Dh" : "out[0]: packed != B*T*P*H*Dh");
    for (int s = 0; s < 3; s++)
        if (s < p->parts) EXPECT(numel(c, parts[s]) == part, part_size[split][s]);
        else EXPECT(parts[s] < 0, part_unused[split][s]);
    return NULL;
}

static const char *check_select(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_select_params *p = &op->p.select;
    NOT_NEGATIVE(p->b, "B");
    NOT_NEGATIVE(p->t, "T");
    NOT_NEGATIVE(p->d, "D");
    PRODUCT(tokens, "B*T*D", p->b, p->t, p->d);
    PRODUCT(rows, "B*D", p->b, p->d);
    PRODUCT(ids, "B*T", p->b, p->t); /* GCOVR_EXCL_BR_LINE: B*T is the first product of B*T*D, which did not overflow */
    if (op->kind == TG_OP_SELECT_TOKEN) {
        EXPECT(numel(c, op->in[0]) == tokens, "in[0]: x != B*T*D");
        EXPECT(numel(c, op->out[0]) == rows, "out[0]: rows != B*D");
    } else {
        EXPECT(numel(c, op->in[0]) == rows, "in[0]: dout != B*D");
        EXPECT(numel(c, op->out[0]) == tokens, "out[0]: dx != B*T*D");
    }
    EXPECT(numel(c, op->in[1]) == ids, "in[1]: ids != B*T");
    return NULL;
}

static const char *check_cross_entropy(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_cross_entropy_params *p = &op->p.cross_entropy;
    NOT_NEGATIVE(p->n, "N");
    NOT_NEGATIVE(p->c, "C");
    /* The classes are the first `classes` columns of a row of C (0: all of them). */
    EXPECT(p->classes >= 0 && p->classes <= p->c, "classes outside [0, C]");
    PRODUCT(logits, "N*C", p->n, p->c);
    PRODUCT(rows2, "N*2", p->n, 2);
    if (op->kind == TG_OP_CROSS_ENTROPY) {
        EXPECT(numel(c, op->in[0]) == logits, "in[0]: logits != N*C");
        EXPECT(numel(c, op->in[1]) == p->n, "in[1]: labels != N");
        EXPECT(numel(c, op->out[0]) == 1, "out[0]: loss is not a scalar");
        EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == 1, "in[2]: the normaliser is not a scalar");
        EXPECT(op->out[1] < 0 || numel(c, op->out[1]) == rows2, "out[1]: lse != N*2");
    } else {
        EXPECT(numel(c, op->in[0]) == 1, "in[0]: dloss is not a scalar");
        EXPECT(numel(c, op->in[1]) == logits, "in[1]: logits != N*C");
        EXPECT(numel(c, op->in[2]) == p->n, "in[2]: labels != N");
        EXPECT(numel(c, op->out[0]) == logits, "out[0]: dlogits != N*C");
        EXPECT(op->in[3] < 0 || numel(c, op->in[3]) == 1, "in[3]: the normaliser is not a scalar");
        EXPECT(op->in[4] < 0 || numel(c, op->in[4]) == rows2, "in[4]: lse != N*2");
    }
    return NULL;
}

static const char *check_span_loss(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_span_loss_params *p = &op->p.span_loss;
    NOT_NEGATIVE(p->b, "B");
    NOT_NEGATIVE(p->t, "T");
    PRODUCT(logits, "B*T*2", p->b, p->t, 2);
    PRODUCT(positions, "B*2", p->b, 2);
    if (op->kind == TG_OP_SPAN_LOSS) {
        EXPECT(numel(c, op->in[0]) == logits, "in[0]: logits != B*T*2");
        EXPECT(numel(c, op->in[1]) == positions, "in[1]: positions != B*2");
        EXPECT(numel(c, op->out[0]) == 1, "out[0]: loss is not a scalar");
        EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == 2, "in[2]: the normalisers are not [2] (start, end)");
    } else {
        EXPECT(numel(c, op->in[0]) == 1, "in[0]: dloss is not a scalar");
        EXPECT(numel(c, op->in[1]) == logits, "in[1]: logits != B*T*2");
        EXPECT(numel(c, op->in[2]) == positions, "in[2]: positions != B*2");
        EXPECT(numel(c, op->out[0]) == logits, "out[0]: dlogits != B*T*2");
        EXPECT(op->in[3] < 0 || numel(c, op->in[3]) == 2, "in[3]: the normalisers are not [2] (start, end)");
    }
    return NULL;
}

static const char *check_grad_squares(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_squares_params *p = &op->p.squares;
    EXPECT(c->tensors[op->in[0]].flags & TG_TENSOR_VIEW, "in[0]: must be the grads view");
    EXPECT(p->n > 0 && numel(c, op->in[0]) == p->n, "in[0]: n != gradient count");
    EXPECT(p->slice >= 0 && p->slice % TG_NORM_BLOCK == 0, "slice: not a multiple of the norm block");
    EXPECT(numel(c, op->out[0]) == (p->n + TG_NORM_BLOCK - 1) / TG_NORM_BLOCK, "out[0]: not one sum per norm block");
    return NULL;
}

static const char *check_norm_of_squares(const tg_op_check_ctx *c, const tg_op *op) {
    EXPECT(op->in[1] < 0 || numel(c, op->in[1]) == 1, "in[1]: the loss scale is not a scalar");
    EXPECT(numel(c, op->out[0]) == 1, "out[0]: norm is not a scalar");
    return NULL;
}

static const char *check_schedule(const tg_op_check_ctx *c, const tg_op *op) {
    EXPECT(numel(c, op->in[0]) == 1, "in[0]: step counter is not a scalar");
    EXPECT(numel(c, op->in[1]) == 1, "in[1]: total steps is not a scalar");
    EXPECT(op->in[2] < 0 || numel(c, op->in[2]) == 1, "in[2]: gradient norm is not a scalar");
    EXPECT(numel(c, op->out[0]) == 1, "out[0]: lr is not a scalar");
    EXPECT(op->out[1] == op->in[0], "out[1]: the step counter is updated in place: must be in[0]");
    NOT_NEGATIVE(op->p.schedule.warmup, "warmup");
    EXPECT(op->p.schedule.form >= 0 && op->p.schedule.form < TG_LR_SCHEDULE_COUNT,
           "schedule: not 0 (linear), 1 (cosine) or 2 (constant)");
    return NULL;
}

static const char *check_grad_norm(const tg_op_check_ctx *c, const tg_op *op) {
    EXPECT(c->tensors[op->in[0]].flags & TG_TENSOR_VIEW, "in[0]: must be the grads view");
    EXPECT(numel(c, op->in[0]) == op->p.count.n, "in[0]: n != gradient count");
    EXPECT(op->in[1] < 0 || numel(c, op->in[1]) == 1, "in[1]: the loss scale is not a scalar");
    EXPECT(numel(c, op->out[0]) == 1, "out[0]: norm is not a scalar");
    return NULL;
}

static const char *check_loss_scale_update(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_loss_scale_params *p = &op->p.loss_scale;
    EXPECT(numel(c, op->in[0]) == 1, "in[0]: grad norm is not a scalar");
    EXPECT(numel(c, op->in[1]) == 1, "in[1]: the loss scale is not a scalar");
    EXPECT(numel(c, op->in[2]) == 1, "in[2]: the growth tracker is not a scalar");
    EXPECT(op->out[0] == op->in[1], "out[0]: the scale is updated in place: must be in[1]");
    EXPECT(op->out[1] == op->in[2], "out[1]: the tracker is updated in place: must be in[2]");
    EXPECT(p->growth_interval >= 1, "growth_interval is not positive");
    EXPECT(p->growth_factor > 1.0f && isfinite(p->growth_factor), "growth_factor: not finite and above 1");
    EXPECT(p->backoff_factor > 0.0f && p->backoff_factor < 1.0f, "backoff_factor: not in (0, 1)");
    return NULL;
}

/* ADAMW and ADAN (the same slots and leading parameters); out1 and out2 hold `parts`
 * state vectors of zero_slice (or n) elements each. */
static const char *check_update(const tg_op_check_ctx *c, const tg_op *op, int parts) {
    const tg_adamw_params *p = &op->p.adamw;
    NOT_NEGATIVE(p->zero_slice, "zero_slice");
    const int64_t n = numel(c, op->in[0]), state = p->zero_slice > 0 ? p->zero_slice : n;
    EXPECT(n == p->n, "in[0]: n != parameter count");
    EXPECT(numel(c, op->in[1]) == 1, "in[1]: lr is not a scalar");
    EXPECT(numel(c, op->in[2]) == 1, "in[2]: step counter is not a scalar");
    EXPECT(numel(c, op->in[3]) == 1, "in[3]: grad norm is not a scalar");
    EXPECT(op->in[4] < 0 || numel(c, op->in[4]) == 1, "in[4]: the loss scale is not a scalar");
    EXPECT(numel(c, op->out[0]) == n, "out[0]: params differ from the grads in size");
    if (parts == 1) {
        EXPECT(numel(c, op->out[1]) == state, "out[1]: m != zero_slice (or n) elements");
        EXPECT(numel(c, op->out[2]) == state, "out[2]: v != zero_slice (or n) elements");
    } else {
        EXPECT(numel(c, op->out[1]) / 2 == state && numel(c, op->out[1]) % 2 == 0,
               "out[1]: m and d != 2 x zero_slice (or n) elements");
        EXPECT(numel(c, op->out[2]) / 2 == state && numel(c, op->out[2]) % 2 == 0,
               "out[2]: v and g_prev != 2 x zero_slice (or n) elements");
    }
    const int md = c->tensors[op->out[1]].dtype, vd = c->tensors[op->out[2]].dtype;
    EXPECT(md == vd && (md == TG_F32 || md == TG_BF16), "out[1], out[2]: the state is not all f32 or all bf16");
    /* The low-precision copies are refreshed element for element with the parameters. */
    EXPECT(op->out[3] < 0 || numel(c, op->out[3]) == n, "out[3]: parameter copies differ from the params in size");
    int64_t covered;
    EXPECT(p->zero_slice == 0 || __builtin_mul_overflow(p->zero_slice, (int64_t)c->replicas, &covered) ||
               covered >= n,
           "zero_slice: the replicas' slices do not cover the parameters");
    return NULL;
}

static const char *check_adamw(const tg_op_check_ctx *c, const tg_op *op) { return check_update(c, op, 1); }

static const char *check_adan(const tg_op_check_ctx *c, const tg_op *op) {
    EXPECT(op->p.adan.no_prox == 0 || op->p.adan.no_prox == 1, "no_prox: not 0 or 1");
    return check_update(c, op, 2);
}

static const char *check_all_reduce(const tg_op_check_ctx *c, const tg_op *op) {
    EXPECT(op->out[0] == op->in[0], "out[0]: works in place: must be in[0]");
    EXPECT(numel(c, op->in[0]) == op->p.count.n, "in[0]: n != element count");
    return NULL;
}

static const char *check_reduce_scatter(const tg_op_check_ctx *c, const tg_op *op) {
    const tg_reduce_scatter_params *p = &op->p.reduce_scatter;
    EXPECT(op->out[0] == op->in[0], "out[0]: works in place: must be in[0]");
    EXPECT(numel(c, op->in[0]) == p->n, "in[0]: n != element count");
    NOT_NEGATIVE(p->first, "first");
    EXPECT(p->slice > 0 && p->slice % TG_NORM_BLOCK == 0, "slice: not a positive multiple of the norm block");
    EXPECT(c->tensors[op->in[0]].offset == (uint64_t)p->first * 4, "first: not in[0]'s element offset");
    return NULL;
}

static const char *check_all_gather(const tg_op_check_ctx *c, const tg_op *op) {
    const int64_t slice = op->p.all_gather.slice;
    EXPECT(op->out[0] == op->in[0], "out[0]: works in place: must be in[0]");
    EXPECT(slice > 0, "slice is not positive");
    EXPECT(c->replicas >= 1, "the plan has no replicas");
    PRODUCT(gathered, "slice*replicas", slice, c->replicas);
    EXPECT(numel(c, op->in[0]) == gathered, "in[0]: not one slice of `slice` elements per replica");
    if (op->in[1] >= 0) {
        EXPECT(numel(c, op->in[1]) == slice, "in[1]: not `slice` elements");
        EXPECT(c->tensors[op->in[1]].dtype == c->tensors[op->in[0]].dtype, "in[1]: not of in[0]'s dtype");
    }
    return NULL;
}

typedef const char *(*check_fn)(const tg_op_check_ctx *c, const tg_op *op);
static const check_fn checks[] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) [TG_OP_##KIND] = check_##rule,
#include "plan/ops.def"
};
_Static_assert(sizeof checks / sizeof checks[0] == TG_OP_COUNT, "every op kind needs a shape rule");

/* ---- slot signatures --------------------------------------------------------------- */

/* The dtype class a signature character asks for, as printed; NULL: any. */
static const char *dtype_class(char sig) {
    switch (sig) {
    case 'F': case 'f': return "f32, bf16 or f16";
    case 'S': case 's': return "f32";
    case 'I': case 'i': return "i32";
    case 'U': return "u8";
    default: return NULL;
    }
}

static int dtype_fits(char sig, int dtype) {
    switch (sig) {
    case 'F': case 'f': return dtype == TG_F32 || dtype == TG_BF16 || dtype == TG_F16;
    case 'S': case 's': return dtype == TG_F32;
    case 'I': case 'i': return dtype == TG_I32;
    case 'U': return dtype == TG_U8;
    default: return dtype >= 0 && dtype < TG_DTYPE_COUNT;
    }
}

/* Checks slots[0..n) against the signature sig ("in" or "out" in messages). */
static int check_slots(const tg_op_check_ctx *c, const char *dir, const int32_t *slots, int n, const char *sig,
                       char *why, size_t why_len) {
    const size_t n_sig = strlen(sig);
    for (int s = 0; s < n; s++) {
        const char want = (size_t)s < n_sig ? sig[s] : '-';
        const int32_t t = slots[s];
        if (t < -1 || t >= c->n_tensors) {
            snprintf(why, why_len, "%s[%d] refers to tensor %d of %d", dir, s, t, c->n_tensors);
            return -1;
        }
        if (want == '-') {
            if (t >= 0) {
                snprintf(why, why_len, "%s[%d] is unused and must be -1, is tensor %d", dir, s, t);
                return -1;
            }
            continue;
        }
        if (t < 0) {
            if (want >= 'A' && want <= 'Z') { /* GCOVR_EXCL_BR_LINE: signatures hold letters and '-', none below 'A' */
                snprintf(why, why_len, "%s[%d] is required", dir, s);
                return -1;
            }
            continue;
        }
        const int dtype = c->tensors[t].dtype;
        if (!dtype_fits(want, dtype)) {
            const char *cls = dtype_class(want);
            snprintf(why, why_len, "%s[%d] must be %s, is %s", dir, s, cls ? cls : "a known dtype",
                     tg_dtype_name(dtype));
            return -1;
        }
    }
    return 0;
}

int tg_op_check(const tg_op_check_ctx *c, const tg_op *op, char *why, size_t why_len) {
    const tg_op_info *info = tg_op_info_of(op->kind);
    if (!info) {
        snprintf(why, why_len, "unknown op kind %d", op->kind);
        return -1;
    }
    if (check_slots(c, "in", op->in, TG_OP_MAX_IN, info->inputs, why, why_len) ||
        check_slots(c, "out", op->out, TG_OP_MAX_OUT, info->outputs, why, why_len))
        return -1;
    const char *bad = checks[op->kind](c, op);
    if (bad) {
        snprintf(why, why_len, "%s", bad);
        return -1;
    }
    return 0;
}

void tg_slice_part(int64_t n, int64_t first, int64_t slice, int replica, int64_t *lo, int64_t *len) {
    const int64_t a = slice * replica - first, b = a + slice;
    *lo = a < 0 ? 0 : a > n ? n : a;
    *len = (b < 0 ? 0 : b > n ? n : b) - *lo;
}

/* ---- FLOPs ------------------------------------------------------------------------- */

static double flops_none(const tg_op *op) { return 0; }
/* ADD, TANH_BWD, DROPOUT, ALL_REDUCE, RELU6, RELU6_BWD: one per element. */
static double flops_n(const tg_op *op) {
    return (double)(op->kind == TG_OP_DROPOUT ? op->p.dropout.n : op->p.count.n);
}
static double flops_gelu(const tg_op *op) { return 10.0 * op->p.gelu.n; }
static double flops_tanh(const tg_op *op) { return 10.0 * op->p.count.n; }
/* The fused bias gradient (bias_cols) adds BIAS_GRAD's count. */
static double flops_gelu_bwd(const tg_op *op) {
    const tg_gelu_bwd_params *p = &op->p.gelu_bwd;
    return 10.0 * p->n + (p->bias_cols > 0 ? (double)p->n : 0) + (op->out[2] >= 0 ? 10.0 * p->n : 0);
}
/* The product, the bias add, the fused bias gradient's sums (BIAS_GRAD's count) and the
 * activation epilogue's (GELU's or GELU_BWD's count). */
static double flops_matmul(const tg_op *op) {
    const tg_matmul_params *p = &op->p.matmul;
    double sums = p->bias_grad == 1 ? (double)p->k * p->m : p->bias_grad == 2 ? (double)p->k * p->n : 0;
    return 2.0 * (double)p->m * (double)p->n * (double)p->k * (double)p->batch +
           (op->in[2] >= 0 ? (double)p->m * p->n * p->batch : 0) + sums +
           (p->activation ? 10.0 * (double)p->m * p->n * p->batch : 0);
}
static double flops_embedding_bwd(const tg_op *op) { return (double)op->p.embedding.n * op->p.embedding.dim; }
static double flops_bias_grad(const tg_op *op) { return (double)op->p.bias_grad.m * op->p.bias_grad.n; }
static double flops_layernorm(const tg_op *op) { return 8.0 * op->p.layernorm.m * op->p.layernorm.d; }
static double flops_layernorm_bwd(const tg_op *op) { return 12.0 * op->p.layernorm_bwd.m * op->p.layernorm_bwd.d; }
/* The products of the convolution (two per multiply-add) and its bias add. */
static double flops_conv2d(const tg_op *op) {
    const tg_conv2d_params *p = &op->p.conv2d;
    const double oh = (double)((p->h + 2 * p->pad - p->k) / p->stride + 1), ow = (double)((p->w + 2 * p->pad - p->k) / p->stride + 1);
    const double outs = (double)p->n * (double)p->c_out * oh * ow;
    return 2.0 * outs * (double)(p->c_in / p->groups) * (double)p->k * (double)p->k + (op->in[2] >= 0 ? outs : 0);
}
/* The forward's product again for each of dx and dweight present, and dbias's sums. */
static double flops_conv2d_bwd(const tg_op *op) {
    const tg_conv2d_bwd_params *b = &op->p.conv2d_bwd;
    const tg_op fwd = {.kind = TG_OP_CONV2D,
                       .in = {-1, -1, -1, -1, -1, -1, -1, -1},
                       .p.conv2d = {b->n, b->c_in, b->h, b->w, b->c_out, b->k, b->stride, b->pad, b->groups}};
    const double oh = (double)((b->h + 2 * b->pad - b->k) / b->stride + 1), ow = (double)((b->w + 2 * b->pad - b->k) / b->stride + 1);
    const double product = flops_conv2d(&fwd);
    return product * ((op->out[0] >= 0) + (op->out[1] >= 0)) + (op->out[2] >= 0 ? (double)b->n * b->c_out * oh * ow : 0);
}
/* LAYERNORM's counts per element. */
static double flops_batchnorm(const tg_op *op) { return 8.0 * op->p.batchnorm.n * op->p.batchnorm.c * op->p.batchnorm.hw; }
static double flops_batchnorm_bwd(const tg_op *op) {
    return 12.0 * op->p.batchnorm_bwd.n * op->p.batchnorm_bwd.c * op->p.batchnorm_bwd.hw;
}
/* One per element of the pooled side's [N, HW, C]. */
/* A division, a subtraction and a division per element. */
static double flops_image_input(const tg_op *op) {
    const tg_image_input_params *p = &op->p.image_input;
    return 3.0 * p->n * p->c * p->size * p->size;
}
static double flops_avg_pool(const tg_op *op) { return (double)op->p.avg_pool.n * op->p.avg_pool.c * op->p.avg_pool.hw; }
static double flops_rmsnorm(const tg_op *op) { return 4.0 * op->p.rmsnorm.m * op->p.rmsnorm.d; }
static double flops_rmsnorm_bwd(const tg_op *op) { return 8.0 * op->p.rmsnorm.m * op->p.rmsnorm.d; }
/* Three per rotated element (two products and a sum); the copies count nothing. */
static double flops_rope(const tg_op *op) {
    const tg_rope_params *p = &op->p.rope;
    return 3.0 * (double)p->n * ((double)p->h + (double)p->kv_heads) * (double)p->head_dim;
}
/* silu(g) * u: the sigmoid as four, two products; the backward about twice that. */
static double flops_swiglu(const tg_op *op) { return 6.0 * op->p.swiglu.m * op->p.swiglu.i; }
static double flops_swiglu_bwd(const tg_op *op) { return 12.0 * op->p.swiglu.m * op->p.swiglu.i; }
/* LAYERNORM's or LAYERNORM_BWD's count, plus one per element for the residual add (the
 * backward's ds_extra) and one for the dropout's multiply: what the separate ops counted. */
static double flops_residual_layernorm(const tg_op *op) {
    const tg_residual_layernorm_params *p = &op->p.residual_layernorm;
    double per = 8.0 + 1 + (p->p > 0.0f);
    return per * p->m * p->d;
}
static double flops_residual_layernorm_bwd(const tg_op *op) {
    const tg_residual_layernorm_bwd_params *p = &op->p.residual_layernorm_bwd;
    double per = 12.0 + (op->in[5] >= 0) + (p->p > 0.0f);
    return per * p->m * p->d;
}
/* 5 per element, plus the fused dropout's multiply (what a DROPOUT op counted). */
static double flops_softmax(const tg_op *op) {
    const tg_softmax_params *p = &op->p.softmax;
    int drop = p->p > 0.0f && op->out[1] >= 0;
    return (5.0 + drop) * p->b * p->h * p->t * p->t;
}
static double flops_softmax_bwd(const tg_op *op) {
    const tg_softmax_bwd_params *p = &op->p.softmax_bwd;
    int drop = p->p > 0.0f && op->in[2] >= 0;
    return (5.0 + drop) * p->b * p->h * p->t * p->t;
}
/* Useful work only: QK^T and PV are 2*T*T*Dh each per (b, h), half of it under a causal
 * mask; the backward recomputes the scores and forms dV, dP, dQ and dK: twice the forward. */
static double flops_attention(const tg_op *op) {
    const tg_attention_params *p = &op->p.attention;
    double f = 4.0 * p->b * p->h * p->t * p->t * p->head_dim;
    return p->causal ? f * 0.5 : f;
}
static double flops_attention_bwd(const tg_op *op) { return 2.0 * flops_attention(op); }
static double flops_cross_entropy(const tg_op *op) { return 4.0 * op->p.cross_entropy.n * op->p.cross_entropy.c; }
static double flops_span_loss(const tg_op *op) { return 8.0 * op->p.span_loss.b * op->p.span_loss.t; }
static double flops_grad_norm(const tg_op *op) { return 2.0 * op->p.count.n; }
static double flops_grad_squares(const tg_op *op) { return 2.0 * op->p.squares.n; }
static double flops_reduce_scatter(const tg_op *op) { return (double)op->p.reduce_scatter.n; }
static double flops_adamw(const tg_op *op) { return 16.0 * op->p.adamw.n; }
static double flops_adan(const tg_op *op) { return 26.0 * op->p.adan.n; }

typedef double (*flops_fn)(const tg_op *op);
static const flops_fn flops_of[] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) [TG_OP_##KIND] = flops_##flops,
#include "plan/ops.def"
};
_Static_assert(sizeof flops_of / sizeof flops_of[0] == TG_OP_COUNT, "every op kind needs a FLOPs formula");

double tg_op_flops(const tg_op *op) { return op->kind >= 0 && op->kind < TG_OP_COUNT ? flops_of[op->kind](op) : 0; }

double tg_op_bytes(const tg_tensor *tensors, const tg_op *op) {
    double bytes = 0;
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (op->in[s] >= 0) bytes += (double)tensors[op->in[s]].bytes;
    /* SCHEDULE's out1 is its in0, the step counter updated in place: counted once. */
    for (int s = 0; s < TG_OP_MAX_OUT; s++)
        if (op->out[s] >= 0 && (op->kind != TG_OP_SCHEDULE || s == 0)) bytes += (double)tensors[op->out[s]].bytes;
    return bytes;
}
