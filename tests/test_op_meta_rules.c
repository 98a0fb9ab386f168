/* Every shape rule of plan/op_meta.c, condition by condition: for each op kind a consistent
 * op that must pass, and a table of ops each breaking one condition (a dimension, a slot's
 * element count, a parameter, a product past int64) with the exact reason tg_op_check must
 * give. Then the slot signatures' dtype classes, the FLOPs of every formula against the
 * documented counts, and the bytes an op moves. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The cases override the macros' default parameters field by field, on purpose. */
#pragma GCC diagnostic ignored "-Woverride-init"

#include "plan/op_meta.h"
#include "tests/harness.h"

/* A slot of a case: 0 absent, > 0 a tensor of that many elements, Z0 one of none. */
#define Z0 (-2)
/* A case's replicas: 0 means 1, NO_REPLICAS means 0. */
#define NO_REPLICAS (-1)

typedef struct rule_case {
    const char *what;
    int kind;
    tg_op_params p;
    int64_t in[TG_OP_MAX_IN];
    int64_t out[TG_OP_MAX_OUT];
    int alias_out[TG_OP_MAX_OUT]; /* k > 0: out[s] is the tensor of in[k - 1] */
    int in0_view;                 /* in[0] carries TG_TENSOR_VIEW */
    int replicas;
    const char *want; /* the exact reason, or NULL: accepted */
    unsigned any_size; /* accepted cases: bit s (in) or TG_OP_MAX_IN + s (out): a slot of any size */
} rule_case;

enum { MAX_CASE_TENSORS = TG_OP_MAX_IN + TG_OP_MAX_OUT };

/* A one-dimensional tensor of n elements (the rules read element counts only). */
static int32_t add_tensor(tg_tensor *t, int32_t *n_t, int64_t n, int dtype) {
    tg_tensor *x = &t[*n_t];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "t%d", *n_t);
    x->dtype = dtype;
    x->ndim = 1;
    x->shape[0] = n;
    x->bytes = (uint64_t)n * (uint64_t)tg_dtype_size(dtype);
    x->grad = x->master = x->group = x->first_use = x->last_use = -1;
    return (*n_t)++;
}

/* The dtype a slot's signature character asks for (A: f32). */
static int dtype_for(const char *sig, int s) {
    const char c = s < (int)strlen(sig) ? sig[s] : '-';
    return c == 'I' || c == 'i' ? TG_I32 : c == 'U' ? TG_U8 : TG_F32;
}

/* Builds the case's op and tensor table, runs tg_op_check; 1 when the outcome is the
 * case's (accepted, or refused with exactly its reason). */
/* zero_slot >= 0 (an input slot s, or TG_OP_MAX_IN + an output slot) moves that slot's
 * tensor to index 0 of the table, trading places with the one there: tensor 0 is a tensor
 * like any other, and no outcome may depend on where a tensor sits. */
static int run_case(const rule_case *rc, int zero_slot, char *why, size_t why_len) {
    tg_tensor t[MAX_CASE_TENSORS];
    int32_t n_t = 0;
    tg_op op = tg_test_op(rc->kind);
    op.p = rc->p;
    const tg_op_info *info = tg_op_info_of(rc->kind);
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (rc->in[s]) op.in[s] = add_tensor(t, &n_t, rc->in[s] == Z0 ? 0 : rc->in[s], dtype_for(info->inputs, s));
    for (int s = 0; s < TG_OP_MAX_OUT; s++) {
        if (rc->alias_out[s]) op.out[s] = op.in[rc->alias_out[s] - 1];
        else if (rc->out[s])
            op.out[s] = add_tensor(t, &n_t, rc->out[s] == Z0 ? 0 : rc->out[s], dtype_for(info->outputs, s));
    }
    if (rc->in0_view) t[op.in[0]].flags |= TG_TENSOR_VIEW;
    const int32_t z = zero_slot < 0 ? 0 : zero_slot < TG_OP_MAX_IN ? op.in[zero_slot] : op.out[zero_slot - TG_OP_MAX_IN];
    if (z > 0) {
        const tg_tensor keep = t[0];
        t[0] = t[z], t[z] = keep;
        for (int s = 0; s < TG_OP_MAX_IN; s++) op.in[s] = op.in[s] == z ? 0 : op.in[s] == 0 ? z : op.in[s];
        for (int s = 0; s < TG_OP_MAX_OUT; s++) op.out[s] = op.out[s] == z ? 0 : op.out[s] == 0 ? z : op.out[s];
    }
    const tg_op_check_ctx c = {t, n_t, rc->replicas == NO_REPLICAS ? 0 : rc->replicas ? rc->replicas : 1};
    why[0] = 0;
    const int got = tg_op_check(&c, &op, why, why_len);
    return rc->want ? got == -1 && !strcmp(why, rc->want) : got == 0;
}

/* An accepted case with one present slot one element larger or smaller: refused, the
 * reason naming that slot ("in[s]" or "out[s]"), unless the case lets it be of any size. */
static void check_slot_sizes_exact(const rule_case *rc) {
    for (int zs = 0; zs < TG_OP_MAX_IN + TG_OP_MAX_OUT; zs++) {
        const int is_in = zs < TG_OP_MAX_IN, s = is_in ? zs : zs - TG_OP_MAX_IN;
        const int64_t n = is_in ? rc->in[s] : rc->out[s];
        if (!n || (!is_in && rc->alias_out[s]) || (rc->any_size >> zs & 1)) continue;
        const int64_t n_el = n == Z0 ? 0 : n;
        for (int delta = -1; delta <= 1; delta += 2) {
            if (n_el + delta < 0) continue;
            rule_case off = *rc;
            int64_t *slot = is_in ? &off.in[s] : &off.out[s];
            *slot = n_el + delta == 0 ? Z0 : n_el + delta;
            char why[256], prefix[16];
            snprintf(prefix, sizeof prefix, "%s[%d]", is_in ? "in" : "out", s);
            off.want = "(refused)";
            run_case(&off, -1, why, sizeof why);
            CHECK(strstr(why, prefix) != NULL, "%s %s with %s of %lld elements: got '%s', want a reason naming %s",
                  tg_op_name(rc->kind), rc->what, prefix, (long long)(n_el + delta), why[0] ? why : "(accepted)", prefix);
        }
    }
}

static void run_cases(const rule_case *cases, size_t n) {
    for (size_t k = 0; k < n; k++) {
        char why[256];
        const int ok = run_case(&cases[k], -1, why, sizeof why);
        if (ok && !cases[k].want) check_slot_sizes_exact(&cases[k]);
        CHECK(ok, "%s %s: got '%s', want %s%s%s", tg_op_name(cases[k].kind),
              cases[k].what, why[0] ? why : "(accepted)", cases[k].want ? "'" : "", cases[k].want ? cases[k].want : "accepted",
              cases[k].want ? "'" : "");
        /* The same outcome with each present slot's tensor at index 0. */
        for (int zs = 0; ok && zs < TG_OP_MAX_IN + TG_OP_MAX_OUT; zs++) {
            const int present = zs < TG_OP_MAX_IN ? cases[k].in[zs] != 0
                                                  : cases[k].out[zs - TG_OP_MAX_IN] || cases[k].alias_out[zs - TG_OP_MAX_IN];
            if (!present) continue;
            CHECK(run_case(&cases[k], zs, why, sizeof why), "%s %s with %s[%d] as tensor 0: got '%s', want %s",
                  tg_op_name(cases[k].kind), cases[k].what, zs < TG_OP_MAX_IN ? "in" : "out",
                  zs < TG_OP_MAX_IN ? zs : zs - TG_OP_MAX_IN, why[0] ? why : "(accepted)",
                  cases[k].want ? cases[k].want : "accepted");
        }
    }
}

#define N_CASES(a) (sizeof(a) / sizeof((a)[0]))
#define BIG ((int64_t)1 << 40)

/* ---- embeddings, elementwise, dropout ------------------------------------------------ */

#define EMB(...) .kind = TG_OP_EMBEDDING, .p = {.embedding = {__VA_ARGS__}}
#define EMB_BWD(...) .kind = TG_OP_EMBEDDING_BWD, .p = {.embedding = {__VA_ARGS__}}

TG_TEST(test_op_meta_rules_embedding) {
    static const rule_case cases[] = {
        {"consistent", EMB(.n = 6, .vocab = 10, .dim = 3, .padding_idx = -1), {6, 30}, {18}},
        {"N < 0", EMB(.n = -1, .vocab = 10, .dim = 3), {6, 30}, {18}, .want = "N is negative"},
        {"V < 0", EMB(.n = 6, .vocab = -1, .dim = 3), {6, 30}, {18}, .want = "V is negative"},
        {"D < 0", EMB(.n = 6, .vocab = 10, .dim = -1), {6, 30}, {18}, .want = "D is negative"},
        {"V*D", EMB(.n = 6, .vocab = INT64_MAX, .dim = 2), {6, 30}, {18}, .want = "V*D overflows"},
        {"N*D", EMB(.n = (int64_t)1 << 62, .vocab = 1, .dim = 4), {6, 4}, {18}, .want = "N*D overflows"},
        {"ids", EMB(.n = 6, .vocab = 10, .dim = 3), {5, 30}, {18}, .want = "in[0]: ids count != N"},
        {"table", EMB(.n = 6, .vocab = 10, .dim = 3), {6, 29}, {18}, .want = "in[1]: table != V*D"},
        {"output", EMB(.n = 6, .vocab = 10, .dim = 3), {6, 30}, {17}, .want = "out[0]: output != N*D"},
        {"zero rows", EMB(.n = 0, .vocab = 10, .dim = 3), {Z0, 30}, {Z0}},
        {"consistent", EMB_BWD(.n = 6, .vocab = 10, .dim = 3), {6, 18}, {30}},
        {"dout", EMB_BWD(.n = 6, .vocab = 10, .dim = 3), {6, 30}, {30}, .want = "in[1]: dout != N*D"},
        {"dtable", EMB_BWD(.n = 6, .vocab = 10, .dim = 3), {6, 18}, {18}, .want = "out[0]: dtable != V*D"},
        {"ids", EMB_BWD(.n = 6, .vocab = 10, .dim = 3), {7, 18}, {30}, .want = "in[0]: ids count != N"},
    };
    run_cases(cases, N_CASES(cases));
}

#define COUNT(K, N) .kind = TG_OP_##K, .p = {.count = {.n = N}}
#define GELU_BWD(...) .kind = TG_OP_GELU_BWD, .p = {.gelu_bwd = {__VA_ARGS__}}

TG_TEST(test_op_meta_rules_elementwise) {
    static const rule_case cases[] = {
        {"consistent", COUNT(ADD, 5), {5, 5}, {5}},
        {"no elements", COUNT(ADD, 0), {Z0, Z0}, {Z0}},
        {"n < 0", COUNT(ADD, -1), {5, 5}, {5}, .want = "n is negative"},
        {"a", COUNT(ADD, 5), {4, 5}, {5}, .want = "in[0]: size != n"},
        {"b", COUNT(ADD, 5), {5, 4}, {5}, .want = "in[1]: size != n"},
        {"out", COUNT(ADD, 5), {5, 5}, {6}, .want = "out[0]: size != n"},
        {"consistent", COUNT(TANH, 5), {5}, {5}},
        {"out", COUNT(TANH, 5), {5}, {4}, .want = "out[0]: size != n"},
        {"consistent", COUNT(TANH_BWD, 5), {5, 5}, {5}},
        {"y", COUNT(TANH_BWD, 5), {5, 6}, {5}, .want = "in[1]: size != n"},
        /* GELU reads its own set's n, GELU_BWD its own. */
        {"consistent", .kind = TG_OP_GELU, .p = {.gelu = {.n = 5, .form = TG_GELU_TANH}}, {5}, {5}},
        {"x", .kind = TG_OP_GELU, .p = {.gelu = {.n = 4}}, {5}, {5}, .want = "in[0]: size != n"},
        {"consistent", GELU_BWD(.n = 6), {6, 6}, {6}},
        {"dy", GELU_BWD(.n = 6), {5, 6}, {6}, .want = "in[0]: size != n"},
        {"bias gradient", GELU_BWD(.n = 6, .bias_cols = 3), {6, 6}, {6, 3}},
        {"bias_cols without out1", GELU_BWD(.n = 6, .bias_cols = 3), {6, 6}, {6},
         .want = "out[1]: the bias gradient is present exactly when bias_cols > 0"},
        {"out1 without bias_cols", GELU_BWD(.n = 6, .bias_cols = 0), {6, 6}, {6, 3},
         .want = "out[1]: the bias gradient is present exactly when bias_cols > 0"},
        {"negative bias_cols, no out1", GELU_BWD(.n = 6, .bias_cols = -1), {6, 6}, {6}},
        {"bias_cols not dividing n", GELU_BWD(.n = 6, .bias_cols = 4), {6, 6}, {6, 4},
         .want = "out[1]: bias gradient != bias_cols columns of dx"},
        {"out1 size", GELU_BWD(.n = 6, .bias_cols = 3), {6, 6}, {6, 2},
         .want = "out[1]: bias gradient != bias_cols columns of dx"},
        {"one column", GELU_BWD(.n = 6, .bias_cols = 1), {6, 6}, {6, 1}},
    };
    run_cases(cases, N_CASES(cases));
}

#define DROP(...) .kind = TG_OP_DROPOUT, .p = {.dropout = {__VA_ARGS__}}

TG_TEST(test_op_meta_rules_dropout) {
    static const rule_case cases[] = {
        {"consistent", DROP(.n = 5, .key = 3, .p = 0.1f), {5, 1}, {5}},
        {"p = 0", DROP(.n = 5, .p = 0.0f), {5, 1}, {5}},
        {"n < 0", DROP(.n = -1, .p = 0.1f), {5, 1}, {5}, .want = "n is negative"},
        {"x", DROP(.n = 5, .p = 0.1f), {4, 1}, {5}, .want = "in[0]: size != n"},
        {"y", DROP(.n = 5, .p = 0.1f), {5, 1}, {4}, .want = "out[0]: size != n"},
        {"counter", DROP(.n = 5, .p = 0.1f), {5, 2}, {5}, .want = "in[1]: step counter is not a scalar"},
        {"p < 0", DROP(.n = 5, .p = -0.1f), {5, 1}, {5}, .want = "p outside [0, 1)"},
        {"p = 1", DROP(.n = 5, .p = 1.0f), {5, 1}, {5}, .want = "p outside [0, 1)"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- matmul ------------------------------------------------------------------------- */

/* C[4,5] = A[4,3] @ B[3,5]: A 12, B 15, C 20, bias 5. */
#define MM(...) .kind = TG_OP_MATMUL, .p = {.matmul = {.m = 4, .n = 5, .k = 3, .batch = 1, .alpha = 1.0f, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_matmul) {
    static const rule_case cases[] = {
        {"consistent", MM(), {12, 15, 5}, {20}},
        {"M = 0", MM(.m = 0), {12, 15}, {20}, .want = "non-positive dims"},
        {"N = 0", MM(.n = 0), {12, 15}, {20}, .want = "non-positive dims"},
        {"K = 0", MM(.k = 0), {12, 15}, {20}, .want = "non-positive dims"},
        {"batch = 0", MM(.batch = 0), {12, 15}, {20}, .want = "non-positive dims"},
        {"batch*M*K", MM(.batch = INT64_MAX / 2, .m = 3), {12, 15}, {20}, .want = "batch*M*K overflows"},
        {"batch*K*N", MM(.m = 1, .k = BIG, .n = BIG), {12, 15}, {20}, .want = "batch*K*N overflows"},
        {"batch*M*N", MM(.m = BIG, .n = BIG, .k = 1), {12, 15}, {20}, .want = "batch*M*N overflows"},
        {"A", MM(), {11, 15}, {20}, .want = "in[0]: A != batch*M*K"},
        {"B", MM(), {12, 14}, {20}, .want = "in[1]: B != batch*K*N"},
        {"C", MM(), {12, 15}, {19}, .want = "out[0]: C != batch*M*N"},
        {"bias", MM(), {12, 15, 4}, {20}, .want = "in[2]: bias != N"},
        {"batched", MM(.batch = 3), {36, 45}, {60}},
        /* The fused bias gradient. */
        {"bias_grad 3", MM(.bias_grad = 3), {12, 15}, {20, 4}, .want = "bias_grad must be 0, 1 or 2"},
        {"bias_grad -1", MM(.bias_grad = -1), {12, 15}, {20, 4}, .want = "bias_grad must be 0, 1 or 2"},
        {"bias_grad without out1", MM(.bias_grad = 1, .trans_a = 1), {12, 15}, {20},
         .want = "out[1]: present exactly when bias_grad != 0"},
        {"out1 without bias_grad", MM(), {12, 15}, {20, 4}, .want = "out[1]: present exactly when bias_grad != 0"},
        {"bias_grad 1", MM(.bias_grad = 1, .trans_a = 1), {12, 15}, {20, 4}},
        {"bias_grad 2", MM(.bias_grad = 2), {12, 15}, {20, 5}},
        {"bias_grad batched", MM(.bias_grad = 1, .trans_a = 1, .batch = 2), {24, 30}, {40, 4},
         .want = "a bias gradient needs batch 1"},
        {"bias_grad with a bias", MM(.bias_grad = 1, .trans_a = 1), {12, 15, 5}, {20, 4},
         .want = "in[2]: a bias gradient takes no bias input"},
        {"bias_grad 1 of A [M,K]", MM(.bias_grad = 1), {12, 15}, {20, 4},
         .want = "a bias gradient sums A stored [K,M] or B stored [K,N]"},
        {"bias_grad 2 of B [N,K]", MM(.bias_grad = 2, .trans_b = 1), {12, 15}, {20, 5},
         .want = "a bias gradient sums A stored [K,M] or B stored [K,N]"},
        {"bias_grad 1 of N", MM(.bias_grad = 1, .trans_a = 1), {12, 15}, {20, 5},
         .want = "out[1]: bias gradient != M (bias_grad=1) or N (bias_grad=2)"},
        {"bias_grad 2 of M", MM(.bias_grad = 2), {12, 15}, {20, 4},
         .want = "out[1]: bias gradient != M (bias_grad=1) or N (bias_grad=2)"},
        /* The activation epilogue. */
        {"activation 3", MM(.activation = 3), {12, 15}, {20}, .want = "activation must be 0, 1 or 2"},
        {"activation -1", MM(.activation = -1), {12, 15}, {20}, .want = "activation must be 0, 1 or 2"},
        {"GELU without out2", MM(.activation = 1), {12, 15}, {20}, .want = "out[2]: present exactly when activation = 1"},
        {"out2 without GELU", MM(), {12, 15}, {20, 0, 20}, .want = "out[2]: present exactly when activation = 1"},
        {"GELU backward without in3", MM(.activation = 2), {12, 15}, {20},
         .want = "in[3]: present exactly when activation = 2"},
        {"in3 without GELU backward", MM(), {12, 15, 0, 20}, {20}, .want = "in[3]: present exactly when activation = 2"},
        {"GELU", MM(.activation = 1), {12, 15, 5}, {20, 0, 20}},
        {"GELU backward", MM(.activation = 2), {12, 15, 0, 20}, {20}},
        {"GELU batched", MM(.activation = 1, .batch = 2), {24, 30}, {40, 0, 40},
         .want = "an activation epilogue needs batch 1"},
        {"GELU accumulating", MM(.activation = 1, .accumulate = 1), {12, 15}, {20, 0, 20},
         .want = "an activation epilogue takes no accumulate and no bias gradient"},
        {"GELU with bias_grad", MM(.activation = 1, .bias_grad = 2), {12, 15}, {20, 5, 20},
         .want = "an activation epilogue takes no accumulate and no bias gradient"},
        {"GELU backward with a bias", MM(.activation = 2), {12, 15, 5, 20}, {20},
         .want = "in[2]: the GELU backward epilogue takes no bias"},
        {"GELU pre-activation", MM(.activation = 1), {12, 15}, {20, 0, 19}, .want = "out[2]: pre-activation != M*N"},
        {"GELU backward pre-activation", MM(.activation = 2), {12, 15, 0, 19}, {20},
         .want = "in[3]: pre-activation != M*N"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- bias gradient and LayerNorms ---------------------------------------------------- */

#define BG(M, N) .kind = TG_OP_BIAS_GRAD, .p = {.bias_grad = {.m = M, .n = N}}
#define LN(M, D) .kind = TG_OP_LAYERNORM, .p = {.layernorm = {.m = M, .d = D, .eps = 1e-5f}}
#define LNB(M, D) .kind = TG_OP_LAYERNORM_BWD, .p = {.layernorm_bwd = {.m = M, .d = D}}

TG_TEST(test_op_meta_rules_bias_grad_layernorm) {
    static const rule_case cases[] = {
        {"consistent", BG(4, 5), {20}, {5}},
        {"M < 0", BG(-1, 5), {20}, {5}, .want = "M is negative"},
        {"N < 0", BG(4, -1), {20}, {5}, .want = "N is negative"},
        {"M*N", BG(INT64_MAX, 2), {20}, {5}, .want = "M*N overflows"},
        {"dout", BG(4, 5), {19}, {5}, .want = "in[0]: dout != M*N"},
        {"dbias", BG(4, 5), {20}, {4}, .want = "out[0]: dbias != N"},

        /* x [4,3]: x and y 12, gamma and beta 3, mean and rstd 4. */
        {"consistent", LN(4, 3), {12, 3, 3}, {12, 4, 4}},
        {"M < 0", LN(-1, 3), {12, 3, 3}, {12, 4, 4}, .want = "M is negative"},
        {"D < 0", LN(4, -1), {12, 3, 3}, {12, 4, 4}, .want = "D is negative"},
        {"M*D", LN(INT64_MAX, 3), {12, 3, 3}, {12, 4, 4}, .want = "M*D overflows"},
        {"x", LN(4, 3), {13, 3, 3}, {12, 4, 4}, .want = "in[0]: x != M*D"},
        {"gamma", LN(4, 3), {12, 4, 3}, {12, 4, 4}, .want = "in[1]: gamma != D"},
        {"beta", LN(4, 3), {12, 3, 4}, {12, 4, 4}, .want = "in[2]: beta != D"},
        {"y", LN(4, 3), {12, 3, 3}, {13, 4, 4}, .want = "out[0]: y != M*D"},
        {"mean", LN(4, 3), {12, 3, 3}, {12, 3, 4}, .want = "out[1]: mean != M"},
        {"rstd", LN(4, 3), {12, 3, 3}, {12, 4, 3}, .want = "out[2]: rstd != M"},

        {"consistent", LNB(4, 3), {12, 12, 3, 4, 4}, {12, 3, 3}},
        {"M < 0", LNB(-1, 3), {12, 12, 3, 4, 4}, {12, 3, 3}, .want = "M is negative"},
        {"D < 0", LNB(4, -1), {12, 12, 3, 4, 4}, {12, 3, 3}, .want = "D is negative"},
        {"M*D", LNB(3, INT64_MAX), {12, 12, 3, 4, 4}, {12, 3, 3}, .want = "M*D overflows"},
        {"dy", LNB(4, 3), {11, 12, 3, 4, 4}, {12, 3, 3}, .want = "in[0]: dy != M*D"},
        {"x", LNB(4, 3), {12, 11, 3, 4, 4}, {12, 3, 3}, .want = "in[1]: x != M*D"},
        {"gamma", LNB(4, 3), {12, 12, 4, 4, 4}, {12, 3, 3}, .want = "in[2]: gamma != D"},
        {"mean", LNB(4, 3), {12, 12, 3, 3, 4}, {12, 3, 3}, .want = "in[3]: mean != M"},
        {"rstd", LNB(4, 3), {12, 12, 3, 4, 3}, {12, 3, 3}, .want = "in[4]: rstd != M"},
        {"dx", LNB(4, 3), {12, 12, 3, 4, 4}, {11, 3, 3}, .want = "out[0]: dx != M*D"},
        {"dgamma", LNB(4, 3), {12, 12, 3, 4, 4}, {12, 4, 3}, .want = "out[1]: dgamma != D"},
        {"dbeta", LNB(4, 3), {12, 12, 3, 4, 4}, {12, 3, 4}, .want = "out[2]: dbeta != D"},
    };
    run_cases(cases, N_CASES(cases));
}

#define RLN(...) .kind = TG_OP_RESIDUAL_LAYERNORM, .p = {.residual_layernorm = {.m = 4, .d = 3, .eps = 1e-5f, __VA_ARGS__}}
#define RLNB(...) \
    .kind = TG_OP_RESIDUAL_LAYERNORM_BWD, .p = {.residual_layernorm_bwd = {.m = 4, .d = 3, .eps = 1e-5f, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_residual_layernorm) {
    static const rule_case cases[] = {
        /* x, r [4,3]; gamma, beta 3; step counter; -> y, s 12, mean, rstd 4. */
        {"consistent", RLN(.p = 0.0f), {12, 12, 3, 3}, {12, 12, 4, 4}},
        {"with dropout", RLN(.p = 0.1f), {12, 12, 3, 3, 1}, {12, 12, 4, 4}},
        {"counter without dropout", RLN(.p = 0.0f), {12, 12, 3, 3, 1}, {12, 12, 4, 4}},
        {"M = 0", RLN(.m = 0), {12, 12, 3, 3}, {12, 12, 4, 4}, .want = "non-positive dims"},
        {"D = 0", RLN(.d = 0), {12, 12, 3, 3}, {12, 12, 4, 4}, .want = "non-positive dims"},
        {"p < 0", RLN(.p = -0.5f), {12, 12, 3, 3}, {12, 12, 4, 4}, .want = "dropout p outside [0, 1)"},
        {"p = 1", RLN(.p = 1.0f), {12, 12, 3, 3, 1}, {12, 12, 4, 4}, .want = "dropout p outside [0, 1)"},
        {"M*D", RLN(.m = INT64_MAX, .d = 2), {12, 12, 3, 3}, {12, 12, 4, 4}, .want = "M*D overflows"},
        {"gamma", RLN(), {12, 12, 2, 3}, {12, 12, 4, 4}, .want = "in[2]: gamma != D"},
        {"x", RLN(), {11, 12, 3, 3}, {12, 12, 4, 4}, .want = "in[0]: x != M*D"},
        {"r", RLN(), {12, 11, 3, 3}, {12, 12, 4, 4}, .want = "in[1]: r != M*D"},
        {"beta", RLN(), {12, 12, 3, 2}, {12, 12, 4, 4}, .want = "in[3]: beta != D"},
        {"counter", RLN(.p = 0.1f), {12, 12, 3, 3, 2}, {12, 12, 4, 4}, .want = "in[4]: step counter is not a scalar"},
        {"dropout without counter", RLN(.p = 0.1f), {12, 12, 3, 3}, {12, 12, 4, 4},
         .want = "in[4]: dropout needs the step counter"},
        {"y", RLN(), {12, 12, 3, 3}, {11, 12, 4, 4}, .want = "out[0]: y != M*D"},
        {"s", RLN(), {12, 12, 3, 3}, {12, 11, 4, 4}, .want = "out[1]: s != M*D"},
        {"mean", RLN(), {12, 12, 3, 3}, {12, 12, 3, 4}, .want = "out[2]: mean != M"},
        {"rstd", RLN(), {12, 12, 3, 3}, {12, 12, 4, 3}, .want = "out[3]: rstd != M"},

        /* dy, s 12; gamma 3; mean, rstd 4; ds_extra 12; counter -> ds, dx 12, dgamma, dbeta 3. */
        {"consistent", RLNB(.p = 0.0f), {12, 12, 3, 4, 4}, {12, 12, 3, 3}},
        {"with ds_extra and dropout", RLNB(.p = 0.1f), {12, 12, 3, 4, 4, 12, 1}, {12, 12, 3, 3}},
        {"M = 0", RLNB(.m = 0), {12, 12, 3, 4, 4}, {12, 12, 3, 3}, .want = "non-positive dims"},
        {"p = 1", RLNB(.p = 1.0f), {12, 12, 3, 4, 4, 0, 1}, {12, 12, 3, 3}, .want = "dropout p outside [0, 1)"},
        {"gamma", RLNB(), {12, 12, 4, 4, 4}, {12, 12, 3, 3}, .want = "in[2]: gamma != D"},
        {"dy", RLNB(), {11, 12, 3, 4, 4}, {12, 12, 3, 3}, .want = "in[0]: dy != M*D"},
        {"s", RLNB(), {12, 11, 3, 4, 4}, {12, 12, 3, 3}, .want = "in[1]: s != M*D"},
        {"mean", RLNB(), {12, 12, 3, 3, 4}, {12, 12, 3, 3}, .want = "in[3]: mean != M"},
        {"rstd", RLNB(), {12, 12, 3, 4, 3}, {12, 12, 3, 3}, .want = "in[4]: rstd != M"},
        {"ds_extra", RLNB(), {12, 12, 3, 4, 4, 11}, {12, 12, 3, 3}, .want = "in[5]: ds_extra != M*D"},
        {"counter", RLNB(.p = 0.1f), {12, 12, 3, 4, 4, 0, 2}, {12, 12, 3, 3},
         .want = "in[6]: step counter is not a scalar"},
        {"dropout without counter", RLNB(.p = 0.1f), {12, 12, 3, 4, 4}, {12, 12, 3, 3},
         .want = "in[6]: dropout needs the step counter"},
        {"ds", RLNB(), {12, 12, 3, 4, 4}, {11, 12, 3, 3}, .want = "out[0]: ds != M*D"},
        {"dx", RLNB(), {12, 12, 3, 4, 4}, {12, 11, 3, 3}, .want = "out[1]: dx != M*D"},
        {"dgamma", RLNB(), {12, 12, 3, 4, 4}, {12, 12, 2, 3}, .want = "out[2]: dgamma != D"},
        {"dbeta", RLNB(), {12, 12, 3, 4, 4}, {12, 12, 3, 2}, .want = "out[3]: dbeta != D"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- softmax ------------------------------------------------------------------------ */

/* B 2, H 3, T 4: scores and probs 96, mask 8. */
#define SM(...) .kind = TG_OP_ATTN_SOFTMAX, .p = {.softmax = {.b = 2, .h = 3, .t = 4, .scale = 0.5f, __VA_ARGS__}}
#define SMB(...) .kind = TG_OP_ATTN_SOFTMAX_BWD, .p = {.softmax_bwd = {.b = 2, .h = 3, .t = 4, .scale = 0.5f, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_softmax) {
    static const rule_case cases[] = {
        {"consistent", SM(), {96}, {96}},
        {"with mask, dropout and counter", SM(.p = 0.1f), {96, 8, 1}, {96, 96}},
        {"dropped probs with p = 0, no counter", SM(.p = 0.0f), {96}, {96, 96}},
        {"p > 0 without dropped probs or counter", SM(.p = 0.1f), {96}, {96}},
        {"B < 0", SM(.b = -1), {96}, {96}, .want = "B is negative"},
        {"H < 0", SM(.h = -1), {96}, {96}, .want = "H is negative"},
        {"T < 0", SM(.t = -1), {96}, {96}, .want = "T is negative"},
        {"B*H*T*T", SM(.b = INT64_MAX), {96}, {96}, .want = "B*H*T*T overflows"},
        {"B*T", SM(.b = BIG, .h = 0, .t = BIG), {96}, {96}, .want = "B*T overflows"},
        {"scores", SM(), {95}, {96}, .want = "in[0]: scores != B*H*T*T"},
        {"mask", SM(), {96, 7}, {96}, .want = "in[1]: mask != B*T"},
        {"counter", SM(), {96, 8, 2}, {96}, .want = "in[2]: step counter is not a scalar"},
        {"probs", SM(), {96}, {95}, .want = "out[0]: probs != B*H*T*T"},
        {"dropped probs", SM(), {96}, {96, 95}, .want = "out[1]: dropped probs != B*H*T*T"},
        {"dropout without counter", SM(.p = 0.1f), {96}, {96, 96}, .want = "in[2]: dropout needs the step counter"},
        {"p < 0", SM(.p = -0.1f), {96}, {96}, .want = "dropout p outside [0, 1)"},
        {"p = 1", SM(.p = 1.0f), {96, 0, 1}, {96, 96}, .want = "dropout p outside [0, 1)"},

        {"consistent", SMB(), {96, 96}, {96}},
        {"with counter", SMB(.p = 0.1f), {96, 96, 1}, {96}},
        {"B < 0", SMB(.b = -1), {96, 96}, {96}, .want = "B is negative"},
        {"H < 0", SMB(.h = -1), {96, 96}, {96}, .want = "H is negative"},
        {"T < 0", SMB(.t = -1), {96, 96}, {96}, .want = "T is negative"},
        {"B*H*T*T", SMB(.t = INT64_MAX), {96, 96}, {96}, .want = "B*H*T*T overflows"},
        {"dD", SMB(), {95, 96}, {96}, .want = "in[0]: dD != B*H*T*T"},
        {"probs", SMB(), {96, 95}, {96}, .want = "in[1]: probs != B*H*T*T"},
        {"counter", SMB(), {96, 96, 2}, {96}, .want = "in[2]: step counter is not a scalar"},
        {"dscores", SMB(), {96, 96}, {95}, .want = "out[0]: dscores != B*H*T*T"},
        {"p < 0", SMB(.p = -0.1f), {96, 96}, {96}, .want = "dropout p outside [0, 1)"},
        {"p = 1", SMB(.p = 1.0f), {96, 96}, {96}, .want = "dropout p outside [0, 1)"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- Llama: RMSNorm, rotary positions, SwiGLU ------------------------------------------ */

/* x [4,3]: x, y, dy, dx 12; gamma, dgamma 3; rstd 4. */
#define RMS(...) .kind = TG_OP_RMSNORM, .p = {.rmsnorm = {.m = 4, .d = 3, .eps = 1e-5f, __VA_ARGS__}}
#define RMSB(...) .kind = TG_OP_RMSNORM_BWD, .p = {.rmsnorm = {.m = 4, .d = 3, .eps = 1e-5f, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_rmsnorm) {
    static const rule_case cases[] = {
        {"consistent", RMS(), {12, 3}, {12, 4}},
        {"no rows", RMS(.m = 0), {Z0, 3}, {Z0, Z0}},
        {"M < 0", RMS(.m = -1), {12, 3}, {12, 4}, .want = "M is negative"},
        {"D < 0", RMS(.d = -1), {12, 3}, {12, 4}, .want = "D is negative"},
        {"M*D", RMS(.m = INT64_MAX), {12, 3}, {12, 4}, .want = "M*D overflows"},
        {"x", RMS(), {13, 3}, {12, 4}, .want = "in[0]: x != M*D"},
        {"gamma", RMS(), {12, 4}, {12, 4}, .want = "in[1]: gamma != D"},
        {"y", RMS(), {12, 3}, {11, 4}, .want = "out[0]: y != M*D"},
        {"rstd", RMS(), {12, 3}, {12, 3}, .want = "out[1]: rstd != M"},

        {"consistent", RMSB(), {12, 12, 3, 4}, {12, 3}},
        {"M < 0", RMSB(.m = -1), {12, 12, 3, 4}, {12, 3}, .want = "M is negative"},
        {"D < 0", RMSB(.d = -1), {12, 12, 3, 4}, {12, 3}, .want = "D is negative"},
        {"M*D", RMSB(.d = INT64_MAX), {12, 12, 3, 4}, {12, 3}, .want = "M*D overflows"},
        {"dy", RMSB(), {11, 12, 3, 4}, {12, 3}, .want = "in[0]: dy != M*D"},
        {"x", RMSB(), {12, 13, 3, 4}, {12, 3}, .want = "in[1]: x != M*D"},
        {"gamma", RMSB(), {12, 12, 2, 4}, {12, 3}, .want = "in[2]: gamma != D"},
        {"rstd", RMSB(), {12, 12, 3, 5}, {12, 3}, .want = "in[3]: rstd != M"},
        {"dx", RMSB(), {12, 12, 3, 4}, {13, 3}, .want = "out[0]: dx != M*D"},
        {"dgamma", RMSB(), {12, 12, 3, 4}, {12, 4}, .want = "out[1]: dgamma != D"},
        {"frozen gamma: no dgamma", RMSB(), {12, 12, 3, 4}, {12, 0}},
    };
    run_cases(cases, N_CASES(cases));
}

/* N 2, H 4, Hkv 2, Dh 4: the packed projections 2 x (4 + 4) x 4 = 64, the attention's input
 * 2 x 12 x 4 = 96, 2 position ids; llama3 with factor 8, low 1, high 4, original 32. */
#define ROPE_P(...) {.rope = {.n = 2, .h = 4, .kv_heads = 2, .head_dim = 4, .type = TG_ROPE_DEFAULT, .theta = 10000.0f, __VA_ARGS__}}
#define L3 .type = TG_ROPE_LLAMA3, .factor = 8.0f, .low_freq = 1.0f, .high_freq = 4.0f, .original_max = 32
#define ROPE(...) .kind = TG_OP_ROPE, .p = ROPE_P(__VA_ARGS__)
#define ROPEB(...) .kind = TG_OP_ROPE_BWD, .p = ROPE_P(__VA_ARGS__)
#define HKV "H must be a positive multiple of Hkv >= 1"
#define DH "Dh must be even and positive"
#define THETA "theta must be finite and above 1"
#define FACTOR "factor must be finite and at least 1"
#define FREQS "low_freq and high_freq must be finite with 0 < low_freq < high_freq"

TG_TEST(test_op_meta_rules_rope) {
    static const rule_case cases[] = {
        {"consistent", ROPE(), {64, 2}, {96}},
        {"llama3", ROPE(L3), {64, 2}, {96}},
        {"llama3 factor 1, original 1", ROPE(L3, .factor = 1.0f, .original_max = 1), {64, 2}, {96}},
        {"Hkv = H", ROPE(.kv_heads = 4), {96, 2}, {96}},
        {"Hkv 1", ROPE(.kv_heads = 1), {48, 2}, {96}},
        {"Dh 2", ROPE(.head_dim = 2), {32, 2}, {48}},
        {"no rows", ROPE(.n = 0), {Z0, Z0}, {Z0}},
        /* the default rule reads no llama3 field */
        {"default with llama3 fields out of range", ROPE(.factor = 0.5f, .low_freq = 5, .high_freq = NAN), {64, 2}, {96}},
        {"N < 0", ROPE(.n = -1), {64, 2}, {96}, .want = "N is negative"},
        {"H 0", ROPE(.h = 0), {64, 2}, {96}, .want = HKV},
        {"H < 0", ROPE(.h = -4, .kv_heads = -2), {64, 2}, {96}, .want = HKV},
        {"Hkv 0", ROPE(.kv_heads = 0), {64, 2}, {96}, .want = HKV},
        {"Hkv < 0", ROPE(.kv_heads = -1), {64, 2}, {96}, .want = HKV},
        {"H not a multiple of Hkv", ROPE(.kv_heads = 3), {64, 2}, {96}, .want = HKV},
        {"Hkv above H", ROPE(.h = 2, .kv_heads = 4), {64, 2}, {96}, .want = HKV},
        {"Dh odd", ROPE(.head_dim = 5), {64, 2}, {96}, .want = DH},
        {"Dh 1", ROPE(.head_dim = 1), {64, 2}, {96}, .want = DH},
        {"Dh 0", ROPE(.head_dim = 0), {64, 2}, {96}, .want = DH},
        {"Dh < 0", ROPE(.head_dim = -2), {64, 2}, {96}, .want = DH},
        {"rope none", ROPE(.type = TG_ROPE_NONE), {64, 2}, {96}, .want = "rope is not a known rope type"},
        {"rope past the enum", ROPE(.type = TG_ROPE_TYPE_COUNT), {64, 2}, {96}, .want = "rope is not a known rope type"},
        {"rope < 0", ROPE(.type = -1), {64, 2}, {96}, .want = "rope is not a known rope type"},
        {"theta 1", ROPE(.theta = 1.0f), {64, 2}, {96}, .want = THETA},
        {"theta 0.5", ROPE(.theta = 0.5f), {64, 2}, {96}, .want = THETA},
        {"theta < 0", ROPE(.theta = -10000.0f), {64, 2}, {96}, .want = THETA},
        {"theta NaN", ROPE(.theta = NAN), {64, 2}, {96}, .want = THETA},
        {"theta inf", ROPE(.theta = INFINITY), {64, 2}, {96}, .want = THETA},
        {"llama3 theta 1", ROPE(L3, .theta = 1.0f), {64, 2}, {96}, .want = THETA},
        {"factor < 1", ROPE(L3, .factor = 0.5f), {64, 2}, {96}, .want = FACTOR},
        {"factor 0", ROPE(L3, .factor = 0.0f), {64, 2}, {96}, .want = FACTOR},
        {"factor NaN", ROPE(L3, .factor = NAN), {64, 2}, {96}, .want = FACTOR},
        {"factor inf", ROPE(L3, .factor = INFINITY), {64, 2}, {96}, .want = FACTOR},
        {"low_freq 0", ROPE(L3, .low_freq = 0.0f), {64, 2}, {96}, .want = FREQS},
        {"low_freq < 0", ROPE(L3, .low_freq = -1.0f), {64, 2}, {96}, .want = FREQS},
        {"low_freq = high_freq", ROPE(L3, .low_freq = 4.0f), {64, 2}, {96}, .want = FREQS},
        {"low_freq > high_freq", ROPE(L3, .low_freq = 4.0f, .high_freq = 1.0f), {64, 2}, {96}, .want = FREQS},
        {"low_freq NaN", ROPE(L3, .low_freq = NAN), {64, 2}, {96}, .want = FREQS},
        {"high_freq NaN", ROPE(L3, .high_freq = NAN), {64, 2}, {96}, .want = FREQS},
        {"high_freq inf", ROPE(L3, .high_freq = INFINITY), {64, 2}, {96}, .want = FREQS},
        {"low_freq inf", ROPE(L3, .low_freq = INFINITY, .high_freq = INFINITY), {64, 2}, {96}, .want = FREQS},
        {"original_max 0", ROPE(L3, .original_max = 0), {64, 2}, {96}, .want = "original_max must be positive"},
        {"original_max < 0", ROPE(L3, .original_max = -8192), {64, 2}, {96}, .want = "original_max must be positive"},
        /* products past int64, the sums inside them included: never computed unchecked */
        {"N*(H+2Hkv)*Dh", ROPE(.n = INT64_MAX / 8), {64, 2}, {96}, .want = "N*(H+2Hkv)*Dh overflows"},
        {"N*3H*Dh", ROPE(.n = 1, .h = (int64_t)1 << 61, .kv_heads = 1, .head_dim = 2), {64, 2}, {96},
         .want = "N*3H*Dh overflows"},
        {"3H", ROPE(.n = 1, .h = INT64_MAX / 3 + 1, .kv_heads = 1, .head_dim = 2), {64, 2}, {96},
         .want = "3H overflows"},
        {"H+2Hkv", ROPE(.n = 1, .h = INT64_MAX - 1, .kv_heads = INT64_MAX / 2, .head_dim = 2), {64, 2}, {96},
         .want = "3H overflows"},
        {"H+2 with Hkv 1, no rows", ROPE(.n = 0, .h = INT64_MAX, .kv_heads = 1, .head_dim = 2), {Z0, Z0}, {Z0},
         .want = "3H overflows"},
        {"3H at its limit", ROPE(.n = 0, .h = INT64_MAX / 3, .kv_heads = 1, .head_dim = 2), {Z0, Z0}, {Z0}},
        {"qkv", ROPE(), {65, 2}, {96}, .want = "in[0]: qkv != N*(H+2Hkv)*Dh"},
        {"qkv as the expanded size", ROPE(), {96, 2}, {96}, .want = "in[0]: qkv != N*(H+2Hkv)*Dh"},
        {"positions", ROPE(), {64, 3}, {96}, .want = "in[1]: position ids != N"},
        {"out", ROPE(), {64, 2}, {64}, .want = "out[0]: != N*3H*Dh"},

        {"consistent", ROPEB(), {96, 2}, {64}},
        {"llama3", ROPEB(L3), {96, 2}, {64}},
        {"Hkv 1", ROPEB(.kv_heads = 1), {96, 2}, {48}},
        {"Hkv 0", ROPEB(.kv_heads = 0), {96, 2}, {64}, .want = HKV},
        {"Dh odd", ROPEB(.head_dim = 3), {96, 2}, {64}, .want = DH},
        {"unknown rope", ROPEB(.type = 7), {96, 2}, {64}, .want = "rope is not a known rope type"},
        {"theta NaN", ROPEB(.theta = NAN), {96, 2}, {64}, .want = THETA},
        {"factor < 1", ROPEB(L3, .factor = 0.99f), {96, 2}, {64}, .want = FACTOR},
        {"low_freq >= high_freq", ROPEB(L3, .low_freq = 4.0f), {96, 2}, {64}, .want = FREQS},
        {"original_max 0", ROPEB(L3, .original_max = 0), {96, 2}, {64}, .want = "original_max must be positive"},
        {"dout", ROPEB(), {64, 2}, {64}, .want = "in[0]: dout != N*3H*Dh"},
        {"positions", ROPEB(), {96, 1}, {64}, .want = "in[1]: position ids != N"},
        {"dqkv", ROPEB(), {96, 2}, {96}, .want = "out[0]: dqkv != N*(H+2Hkv)*Dh"},
    };
    run_cases(cases, N_CASES(cases));
}

/* M 3, I 4: gate_up 24, the activation and its gradient 12. */
#define SWI(M, I) .kind = TG_OP_SWIGLU, .p = {.swiglu = {.m = M, .i = I}}
#define SWIB(M, I) .kind = TG_OP_SWIGLU_BWD, .p = {.swiglu = {.m = M, .i = I}}

TG_TEST(test_op_meta_rules_swiglu) {
    static const rule_case cases[] = {
        {"consistent", SWI(3, 4), {24}, {12}},
        {"no rows", SWI(0, 4), {Z0}, {Z0}},
        {"M < 0", SWI(-1, 4), {24}, {12}, .want = "M is negative"},
        {"I < 0", SWI(3, -1), {24}, {12}, .want = "I is negative"},
        {"M*I", SWI(INT64_MAX, 2), {24}, {12}, .want = "M*I overflows"},
        {"M*2I", SWI(INT64_MAX / 2 + 1, 1), {24}, {12}, .want = "M*2I overflows"},
        {"gate_up", SWI(3, 4), {23}, {12}, .want = "in[0]: gate_up != M*2I"},
        {"gate_up as M*I", SWI(3, 4), {12}, {12}, .want = "in[0]: gate_up != M*2I"},
        {"out", SWI(3, 4), {24}, {24}, .want = "out[0]: != M*I"},

        {"consistent", SWIB(3, 4), {12, 24}, {24}},
        {"M < 0", SWIB(-3, 4), {12, 24}, {24}, .want = "M is negative"},
        {"I < 0", SWIB(3, -4), {12, 24}, {24}, .want = "I is negative"},
        {"M*2I", SWIB(1, INT64_MAX / 2 + 1), {12, 24}, {24}, .want = "M*2I overflows"},
        {"dy", SWIB(3, 4), {24, 24}, {24}, .want = "in[0]: dy != M*I"},
        {"gate_up", SWIB(3, 4), {12, 12}, {24}, .want = "in[1]: gate_up != M*2I"},
        {"dgate_up", SWIB(3, 4), {12, 24}, {12}, .want = "out[0]: dgate_up != M*2I"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- fused attention ------------------------------------------------------------------ */

/* B 2, H 3, T 4, Dh 5: q, k, v, O 120 (packed qkv 360), mask 8, LSE and delta 24, keep bits
 * 2*3*4*ceil(4/32) = 24 words. */
#define ATT(...) .kind = TG_OP_ATTENTION, .p = {.attention = {.b = 2, .h = 3, .t = 4, .head_dim = 5, .scale = 0.5f, __VA_ARGS__}}
#define ATB(...) \
    .kind = TG_OP_ATTENTION_BWD, .p = {.attention = {.b = 2, .h = 3, .t = 4, .head_dim = 5, .scale = 0.5f, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_attention) {
    static const rule_case cases[] = {
        {"consistent", ATT(), {120, 120, 120}, {120, 24}},
        {"with mask and dropout", ATT(.p = 0.1f, .causal = 1), {120, 120, 120, 8, 1}, {120, 24, 24}},
        {"packed", ATT(.packed = 1), {360}, {120, 24}},
        /* ceil(T/32) words per row: T 33 takes 2, T 64 takes 2, T 32 one. */
        {"T 33", ATT(.b = 1, .h = 1, .t = 33, .head_dim = 1, .p = 0.1f), {33, 33, 33, 0, 1}, {33, 33, 66}},
        {"T 64", ATT(.b = 1, .h = 1, .t = 64, .head_dim = 1, .p = 0.1f), {64, 64, 64, 0, 1}, {64, 64, 128}},
        {"T 32", ATT(.b = 1, .h = 1, .t = 32, .head_dim = 1, .p = 0.1f), {32, 32, 32, 0, 1}, {32, 32, 32}},
        {"T 33, one word per row", ATT(.b = 1, .h = 1, .t = 33, .head_dim = 1, .p = 0.1f), {33, 33, 33, 0, 1},
         {33, 33, 33}, .want = "out[2]: keep bits != B*H*T*ceil(T/32)"},
        {"B = 0", ATT(.b = 0), {120, 120, 120}, {120, 24}, .want = "non-positive dims"},
        {"H = 0", ATT(.h = 0), {120, 120, 120}, {120, 24}, .want = "non-positive dims"},
        {"T = 0", ATT(.t = 0), {120, 120, 120}, {120, 24}, .want = "non-positive dims"},
        {"Dh = 0", ATT(.head_dim = 0), {120, 120, 120}, {120, 24}, .want = "non-positive dims"},
        {"packed 2", ATT(.packed = 2), {360}, {120, 24}, .want = "packed must be 0 or 1"},
        {"p < 0", ATT(.p = -0.1f), {120, 120, 120}, {120, 24}, .want = "dropout p outside [0, 1)"},
        {"p = 1", ATT(.p = 1.0f), {120, 120, 120, 0, 1}, {120, 24, 24}, .want = "dropout p outside [0, 1)"},
        {"B*T", ATT(.b = BIG, .t = BIG), {120, 120, 120}, {120, 24}, .want = "B*T overflows"},
        {"H*Dh", ATT(.h = BIG, .head_dim = BIG), {120, 120, 120}, {120, 24}, .want = "H*Dh overflows"},
        {"B*T*H*Dh", ATT(.b = 1 << 20, .t = 1 << 20, .h = 1 << 20, .head_dim = 16), {120, 120, 120}, {120, 24},
         .want = "B*T*H*Dh overflows"},
        {"B*T*3*H*Dh", ATT(.b = (int64_t)1 << 31, .t = 1, .h = (int64_t)1 << 31, .head_dim = 1), {120, 120, 120},
         {120, 24}, .want = "B*T*3*H*Dh overflows"},
        {"B*H*T*ceil(T/32)", ATT(.b = 1, .h = 1, .t = (int64_t)1 << 35, .head_dim = 1), {120, 120, 120}, {120, 24},
         .want = "B*H*T*ceil(T/32) overflows"},
        {"q", ATT(), {119, 120, 120}, {120, 24}, .want = "in[0]: q != B*T*H*Dh"},
        {"k", ATT(), {120, 119, 120}, {120, 24}, .want = "in[1]: k != B*T*H*Dh"},
        {"v", ATT(), {120, 120, 119}, {120, 24}, .want = "in[2]: v != B*T*H*Dh"},
        {"packed qkv", ATT(.packed = 1), {120}, {120, 24}, .want = "in[0]: qkv != B*T*3*H*Dh"},
        {"packed with k", ATT(.packed = 1), {360, 120}, {120, 24},
         .want = "in[1], in[2]: packed attention takes one qkv input"},
        {"packed with v", ATT(.packed = 1), {360, 0, 120}, {120, 24},
         .want = "in[1], in[2]: packed attention takes one qkv input"},
        {"mask", ATT(), {120, 120, 120, 7}, {120, 24}, .want = "in[3]: mask != B*T"},
        {"dropout without keep bits", ATT(.p = 0.1f), {120, 120, 120, 0, 1}, {120, 24},
         .want = "out[2]: keep bits present exactly when p > 0"},
        {"keep bits without dropout", ATT(), {120, 120, 120}, {120, 24, 24},
         .want = "out[2]: keep bits present exactly when p > 0"},
        {"keep bits", ATT(.p = 0.1f), {120, 120, 120, 0, 1}, {120, 24, 23},
         .want = "out[2]: keep bits != B*H*T*ceil(T/32)"},
        {"counter", ATT(), {120, 120, 120, 0, 2}, {120, 24}, .want = "in[4]: step counter is not a scalar"},
        {"dropout without counter", ATT(.p = 0.1f), {120, 120, 120}, {120, 24, 24},
         .want = "in[4]: dropout needs the step counter"},
        {"O", ATT(), {120, 120, 120}, {119, 24}, .want = "out[0]: O != B*T*H*Dh"},
        {"LSE", ATT(), {120, 120, 120}, {120, 23}, .want = "out[1]: LSE != B*H*T"},
        {"q too large", ATT(), {121, 120, 120}, {120, 24}, .want = "in[0]: q != B*T*H*Dh"},
        {"mask too large", ATT(), {120, 120, 120, 9}, {120, 24}, .want = "in[3]: mask != B*T"},
        {"O too large", ATT(), {120, 120, 120}, {121, 24}, .want = "out[0]: O != B*T*H*Dh"},
        {"LSE too large", ATT(), {120, 120, 120}, {120, 25}, .want = "out[1]: LSE != B*H*T"},
        {"packed qkv too large", ATT(.packed = 1), {361}, {120, 24}, .want = "in[0]: qkv != B*T*3*H*Dh"},

        /* dO, O 120; LSE 24; mask; keep bits; q, k, v -> dq, dk, dv, delta. */
        {"consistent", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 24}},
        {"with mask and dropout", ATB(.p = 0.1f), {120, 120, 24, 8, 24, 120, 120, 120}, {120, 120, 120, 24}},
        {"packed", ATB(.packed = 1), {120, 120, 24, 0, 0, 360}, {360, 0, 0, 24}},
        {"q", ATB(), {120, 120, 24, 0, 0, 119, 120, 120}, {120, 120, 120, 24}, .want = "in[5]: q != B*T*H*Dh"},
        {"k", ATB(), {120, 120, 24, 0, 0, 120, 119, 120}, {120, 120, 120, 24}, .want = "in[6]: k != B*T*H*Dh"},
        {"v", ATB(), {120, 120, 24, 0, 0, 120, 120, 119}, {120, 120, 120, 24}, .want = "in[7]: v != B*T*H*Dh"},
        {"packed qkv", ATB(.packed = 1), {120, 120, 24, 0, 0, 120}, {120, 0, 0, 24},
         .want = "in[5]: qkv != B*T*3*H*Dh"},
        {"packed with k", ATB(.packed = 1), {120, 120, 24, 0, 0, 360, 120}, {360, 0, 0, 24},
         .want = "in[6], in[7]: packed attention takes one qkv input"},
        {"dropout without keep bits", ATB(.p = 0.1f), {120, 120, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 24},
         .want = "in[4]: keep bits present exactly when p > 0"},
        {"keep bits", ATB(.p = 0.1f), {120, 120, 24, 0, 23, 120, 120, 120}, {120, 120, 120, 24},
         .want = "in[4]: keep bits != B*H*T*ceil(T/32)"},
        {"dO", ATB(), {119, 120, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 24}, .want = "in[0]: dO != B*T*H*Dh"},
        {"O", ATB(), {120, 119, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 24}, .want = "in[1]: O != B*T*H*Dh"},
        /* Sizes must match exactly: one element too many is refused as one too few is. */
        {"dO too large", ATB(), {121, 120, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 24}, .want = "in[0]: dO != B*T*H*Dh"},
        {"O too large", ATB(), {120, 121, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 24}, .want = "in[1]: O != B*T*H*Dh"},
        {"LSE too large", ATB(), {120, 120, 25, 0, 0, 120, 120, 120}, {120, 120, 120, 24}, .want = "in[2]: LSE != B*H*T"},
        {"q too large", ATB(), {120, 120, 24, 0, 0, 121, 120, 120}, {120, 120, 120, 24}, .want = "in[5]: q != B*T*H*Dh"},
        {"keep bits too many", ATB(.p = 0.1f), {120, 120, 24, 0, 25, 120, 120, 120}, {120, 120, 120, 24},
         .want = "in[4]: keep bits != B*H*T*ceil(T/32)"},
        {"dq too large", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {121, 120, 120, 24},
         .want = "out[0]: dq differs from q in size"},
        {"delta too large", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 25}, .want = "out[3]: delta != B*H*T"},
        {"LSE", ATB(), {120, 120, 23, 0, 0, 120, 120, 120}, {120, 120, 120, 24}, .want = "in[2]: LSE != B*H*T"},
        {"dq", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {119, 120, 120, 24},
         .want = "out[0]: dq differs from q in size"},
        {"dk", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {120, 119, 120, 24},
         .want = "out[1]: dk differs from k in size"},
        {"dv", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {120, 120, 119, 24},
         .want = "out[2]: dv differs from v in size"},
        {"packed dqkv", ATB(.packed = 1), {120, 120, 24, 0, 0, 360}, {120, 0, 0, 24},
         .want = "out[0]: dq differs from q in size"},
        {"packed with dk", ATB(.packed = 1), {120, 120, 24, 0, 0, 360}, {360, 120, 0, 24},
         .want = "out[1], out[2]: packed attention has one input gradient"},
        {"packed with dv", ATB(.packed = 1), {120, 120, 24, 0, 0, 360}, {360, 0, 120, 24},
         .want = "out[1], out[2]: packed attention has one input gradient"},
        {"no dk", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {120, 0, 120, 24},
         .want = "out[1]: dk differs from k in size"},
        {"delta", ATB(), {120, 120, 24, 0, 0, 120, 120, 120}, {120, 120, 120, 23}, .want = "out[3]: delta != B*H*T"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- heads, select, losses ------------------------------------------------------------ */

/* B 2, T 3, H 4, Dh 5: a part 120, the packed tensor 120 * P. */
#define HS(P, ...) .kind = TG_OP_HEADS_SPLIT, .p = {.heads = {.b = 2, .t = 3, .h = 4, .head_dim = 5, .parts = P, __VA_ARGS__}}
#define HM(P, ...) .kind = TG_OP_HEADS_MERGE, .p = {.heads = {.b = 2, .t = 3, .h = 4, .head_dim = 5, .parts = P, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_heads) {
    static const rule_case cases[] = {
        {"3 parts", HS(3), {360}, {120, 120, 120}},
        {"1 part", HS(1), {120}, {120}},
        {"P 0", HS(0), {120}, {120}, .want = "P must be 1..3"},
        {"P 4", HS(4), {480}, {120, 120, 120}, .want = "P must be 1..3"},
        {"B < 0", HS(1, .b = -1), {120}, {120}, .want = "B is negative"},
        {"T < 0", HS(1, .t = -1), {120}, {120}, .want = "T is negative"},
        {"H < 0", HS(1, .h = -1), {120}, {120}, .want = "H is negative"},
        {"Dh < 0", HS(1, .head_dim = -1), {120}, {120}, .want = "Dh is negative"},
        {"B*H*T*Dh", HS(1, .b = INT64_MAX, .h = 2), {120}, {120}, .want = "B*H*T*Dh overflows"},
        {"B*T*P*H*Dh", HS(3, .b = (int64_t)1 << 31, .h = (int64_t)1 << 31, .t = 1, .head_dim = 1), {360},
         {120, 120, 120}, .want = "B*T*P*H*Dh overflows"},
        {"packed", HS(2), {360}, {120, 120}, .want = "in[0]: packed != B*T*P*H*Dh"},
        {"part 0", HS(2), {240}, {119, 120}, .want = "out[0]: part != B*H*T*Dh"},
        {"part 1", HS(2), {240}, {120, 119}, .want = "out[1]: part != B*H*T*Dh"},
        {"part 2", HS(3), {360}, {120, 120, 119}, .want = "out[2]: part != B*H*T*Dh"},
        {"a part past P", HS(1), {120}, {120, 120}, .want = "out[1]: a part past P"},
        {"a third part past P", HS(2), {240}, {120, 120, 120}, .want = "out[2]: a part past P"},

        {"1 part", HM(1), {120}, {120}},
        {"3 parts", HM(3), {120, 120, 120}, {360}},
        {"packed", HM(2), {120, 120}, {360}, .want = "out[0]: packed != B*T*P*H*Dh"},
        {"part 0", HM(1), {121}, {120}, .want = "in[0]: part != B*H*T*Dh"},
        {"part 2", HM(3), {120, 120, 121}, {360}, .want = "in[2]: part != B*H*T*Dh"},
        {"a part past P", HM(2), {120, 120, 120}, {240}, .want = "in[2]: a part past P"},
        {"a second part past P", HM(1), {120, 120}, {120}, .want = "in[1]: a part past P"},
    };
    run_cases(cases, N_CASES(cases));
}

/* B 2, T 3, D 4: x 24, rows 8, ids 6. */
#define SEL(...) .kind = TG_OP_SELECT_TOKEN, .p = {.select = {.b = 2, .t = 3, .d = 4, __VA_ARGS__}}
#define SELB(...) .kind = TG_OP_SELECT_TOKEN_BWD, .p = {.select = {.b = 2, .t = 3, .d = 4, __VA_ARGS__}}
#define CE(...) .kind = TG_OP_CROSS_ENTROPY, .p = {.cross_entropy = {.n = 4, .c = 5, __VA_ARGS__}}
#define CEB(...) .kind = TG_OP_CROSS_ENTROPY_BWD, .p = {.cross_entropy = {.n = 4, .c = 5, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_select_cross_entropy) {
    static const rule_case cases[] = {
        {"consistent", SEL(.mode = TG_SELECT_LAST_NON_PAD), {24, 6}, {8}},
        {"B < 0", SEL(.b = -1), {24, 6}, {8}, .want = "B is negative"},
        {"T < 0", SEL(.t = -1), {24, 6}, {8}, .want = "T is negative"},
        {"D < 0", SEL(.d = -1), {24, 6}, {8}, .want = "D is negative"},
        {"B*T*D", SEL(.b = INT64_MAX), {24, 6}, {8}, .want = "B*T*D overflows"},
        {"B*D", SEL(.b = BIG, .t = 0, .d = BIG), {24, 6}, {8}, .want = "B*D overflows"},
        {"x", SEL(), {23, 6}, {8}, .want = "in[0]: x != B*T*D"},
        {"rows", SEL(), {24, 6}, {7}, .want = "out[0]: rows != B*D"},
        {"ids", SEL(), {24, 5}, {8}, .want = "in[1]: ids != B*T"},
        {"consistent", SELB(), {8, 6}, {24}},
        {"dout", SELB(), {24, 6}, {24}, .want = "in[0]: dout != B*D"},
        {"dx", SELB(), {8, 6}, {8}, .want = "out[0]: dx != B*T*D"},
        {"ids", SELB(), {8, 7}, {24}, .want = "in[1]: ids != B*T"},

        {"consistent", CE(), {20, 4}, {1}},
        {"every column a class", CE(.classes = 5), {20, 4}, {1}},
        {"N < 0", CE(.n = -1), {20, 4}, {1}, .want = "N is negative"},
        {"C < 0", CE(.c = -1), {20, 4}, {1}, .want = "C is negative"},
        {"classes < 0", CE(.classes = -1), {20, 4}, {1}, .want = "classes outside [0, C]"},
        {"classes > C", CE(.classes = 6), {20, 4}, {1}, .want = "classes outside [0, C]"},
        {"N*C", CE(.n = INT64_MAX, .c = 2), {20, 4}, {1}, .want = "N*C overflows"},
        {"logits", CE(), {19, 4}, {1}, .want = "in[0]: logits != N*C"},
        {"labels", CE(), {20, 3}, {1}, .want = "in[1]: labels != N"},
        {"loss", CE(), {20, 4}, {2}, .want = "out[0]: loss is not a scalar"},
        {"consistent", CEB(), {1, 20, 4}, {20}},
        {"dloss", CEB(), {2, 20, 4}, {20}, .want = "in[0]: dloss is not a scalar"},
        {"logits", CEB(), {1, 19, 4}, {20}, .want = "in[1]: logits != N*C"},
        {"labels", CEB(), {1, 20, 5}, {20}, .want = "in[2]: labels != N"},
        {"dlogits", CEB(), {1, 20, 4}, {21}, .want = "out[0]: dlogits != N*C"},
        /* The optional normaliser (the window's count of counted labels): one element. */
        {"with a normaliser", CE(), {20, 4, 1}, {1}},
        {"normaliser", CE(), {20, 4, 2}, {1}, .want = "in[2]: the normaliser is not a scalar"},
        {"no-element normaliser", CE(), {20, 4, Z0}, {1}, .want = "in[2]: the normaliser is not a scalar"},
        {"with a normaliser", CEB(), {1, 20, 4, 1}, {20}},
        {"normaliser", CEB(), {1, 20, 4, 2}, {20}, .want = "in[3]: the normaliser is not a scalar"},
        {"no-element normaliser", CEB(), {1, 20, 4, Z0}, {20}, .want = "in[3]: the normaliser is not a scalar"},
        {"N < 0", CEB(.n = -1), {1, 20, 4}, {20}, .want = "N is negative"},
        {"C < 0", CEB(.c = -1), {1, 20, 4}, {20}, .want = "C is negative"},
        {"classes > C", CEB(.classes = 6), {1, 20, 4}, {20}, .want = "classes outside [0, C]"},
        {"N*C", CEB(.n = INT64_MAX, .c = 2), {1, 20, 4}, {20}, .want = "N*C overflows"},
        {"no rows", CE(.n = 0), {Z0, Z0}, {1}},
        /* The forward's row lse (hi, lo per row) and the backward reading it. */
        {"with the rows' lse", CE(), {20, 4}, {1, 8}},
        {"lse", CE(), {20, 4}, {1, 9}, .want = "out[1]: lse != N*2"},
        {"N*2", CE(.n = INT64_MAX, .c = 1), {20, 4}, {1}, .want = "N*2 overflows"},
        {"reading the rows' lse", CEB(), {1, 20, 4, 0, 8}, {20}},
        {"lse read", CEB(), {1, 20, 4, 0, 7}, {20}, .want = "in[4]: lse != N*2"},
    };
    run_cases(cases, N_CASES(cases));
}

#define MLM(...) .kind = TG_OP_MLM_MASK, .p = {.mlm_mask = {.n = 6, .vocab = 10, .mask_id = 3, .p = 0.15f, __VA_ARGS__}}

/* n 6: ids, mask, masked ids and labels of 6; a step counter; mask_id in [0, V); p in (0, 1). */
TG_TEST(test_op_meta_rules_mlm_mask) {
    static const rule_case cases[] = {
        {"consistent", MLM(), {6, 6, 1}, {6, 6}},
        {"mask_id 0", MLM(.mask_id = 0), {6, 6, 1}, {6, 6}},
        {"mask_id V - 1", MLM(.mask_id = 9), {6, 6, 1}, {6, 6}},
        {"mask_id -1", MLM(.mask_id = -1), {6, 6, 1}, {6, 6}, .want = "mask_id outside [0, V)"},
        {"mask_id V", MLM(.mask_id = 10), {6, 6, 1}, {6, 6}, .want = "mask_id outside [0, V)"},
        {"V 1", MLM(.vocab = 1, .mask_id = 0), {6, 6, 1}, {6, 6}},
        {"V 0", MLM(.vocab = 0, .mask_id = 0), {6, 6, 1}, {6, 6}, .want = "V outside [1, 2^31)"},
        {"V 2^31", MLM(.vocab = (int64_t)INT32_MAX + 1), {6, 6, 1}, {6, 6}, .want = "V outside [1, 2^31)"},
        {"V 2^31 - 1", MLM(.vocab = INT32_MAX), {6, 6, 1}, {6, 6}},
        {"p 0", MLM(.p = 0.0f), {6, 6, 1}, {6, 6}, .want = "p outside (0, 1)"},
        {"p 1", MLM(.p = 1.0f), {6, 6, 1}, {6, 6}, .want = "p outside (0, 1)"},
        {"p < 0", MLM(.p = -0.5f), {6, 6, 1}, {6, 6}, .want = "p outside (0, 1)"},
        {"n < 0", MLM(.n = -1), {6, 6, 1}, {6, 6}, .want = "n is negative"},
        {"no elements", MLM(.n = 0), {Z0, Z0, 1}, {Z0, Z0}},
        {"ids", MLM(), {5, 6, 1}, {6, 6}, .want = "in[0]: ids != n"},
        {"mask", MLM(), {6, 7, 1}, {6, 6}, .want = "in[1]: mask != n"},
        {"counter", MLM(), {6, 6, 2}, {6, 6}, .want = "in[2]: step counter is not a scalar"},
        {"masked ids", MLM(), {6, 6, 1}, {7, 6}, .want = "out[0]: masked ids != n"},
        {"labels", MLM(), {6, 6, 1}, {6, 5}, .want = "out[1]: labels != n"},
        /* The optional stream (step, first element, seed) of a streamed mask. */
        {"with a stream", MLM(), {6, 6, 1, 4}, {6, 6}},
        {"stream of 3", MLM(), {6, 6, 1, 3}, {6, 6}, .want = "in[3]: the stream is not [4] (step, first element, seed)"},
    };
    run_cases(cases, N_CASES(cases));
}

#define SPAN(...) .kind = TG_OP_SPAN_LOSS, .p = {.span_loss = {.b = 2, .t = 5, __VA_ARGS__}}
#define SPANB(...) .kind = TG_OP_SPAN_LOSS_BWD, .p = {.span_loss = {.b = 2, .t = 5, __VA_ARGS__}}

/* B 2, T 5: logits B*T*2 = 20, positions B*2 = 4 (a start and an end per row). */
TG_TEST(test_op_meta_rules_span_loss) {
    static const rule_case cases[] = {
        {"consistent", SPAN(), {20, 4}, {1}},
        {"B < 0", SPAN(.b = -1), {20, 4}, {1}, .want = "B is negative"},
        {"T < 0", SPAN(.t = -1), {20, 4}, {1}, .want = "T is negative"},
        {"B*T*2", SPAN(.b = INT64_MAX / 4, .t = 4), {20, 4}, {1}, .want = "B*T*2 overflows"},
        /* T 0: no logits, so only B*2 can overflow. */
        {"B*2", SPAN(.b = (int64_t)1 << 62, .t = 0), {20, 4}, {1}, .want = "B*2 overflows"},
        {"logits", SPAN(), {21, 4}, {1}, .want = "in[0]: logits != B*T*2"},
        {"positions", SPAN(), {20, 5}, {1}, .want = "in[1]: positions != B*2"},
        {"loss", SPAN(), {20, 4}, {2}, .want = "out[0]: loss is not a scalar"},
        {"no rows", SPAN(.b = 0), {Z0, Z0}, {1}},
        /* The optional normalisers (start, end) of an accumulated loss. */
        {"with normalisers", SPAN(), {20, 4, 2}, {1}},
        {"normalisers of 1", SPAN(), {20, 4, 1}, {1}, .want = "in[2]: the normalisers are not [2] (start, end)"},

        {"consistent", SPANB(), {1, 20, 4}, {20}},
        {"B < 0", SPANB(.b = -1), {1, 20, 4}, {20}, .want = "B is negative"},
        {"T < 0", SPANB(.t = -1), {1, 20, 4}, {20}, .want = "T is negative"},
        {"B*2", SPANB(.b = (int64_t)1 << 62, .t = 0), {1, 20, 4}, {20}, .want = "B*2 overflows"},
        {"dloss", SPANB(), {2, 20, 4}, {20}, .want = "in[0]: dloss is not a scalar"},
        {"logits", SPANB(), {1, 19, 4}, {20}, .want = "in[1]: logits != B*T*2"},
        {"positions", SPANB(), {1, 20, 3}, {20}, .want = "in[2]: positions != B*2"},
        {"dlogits", SPANB(), {1, 20, 4}, {21}, .want = "out[0]: dlogits != B*T*2"},
        {"with normalisers", SPANB(), {1, 20, 4, 2}, {20}},
        {"normalisers of 3", SPANB(), {1, 20, 4, 3}, {20}, .want = "in[3]: the normalisers are not [2] (start, end)"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- the optimizer and the collectives ------------------------------------------------ */

#define SCHED .kind = TG_OP_SCHEDULE, .p = {.schedule = {.warmup = 2, .lr = 1e-3f}}
#define ADAMW(...) .kind = TG_OP_ADAMW, .p = {.adamw = {.n = 10, .beta1 = 0.9f, .beta2 = 0.999f, __VA_ARGS__}}
#define ADAN(...) .kind = TG_OP_ADAN, .p = {.adan = {.n = 10, .beta1 = 0.9f, .beta2 = 0.999f, __VA_ARGS__}}

TG_TEST(test_op_meta_rules_optimizer) {
    static const rule_case cases[] = {
        {"consistent", SCHED, {1, 1}, {1}, {0, 1}},
        {"step counter", SCHED, {2, 1}, {1}, {0, 1}, .want = "in[0]: step counter is not a scalar"},
        {"total steps", SCHED, {1, 2}, {1}, {0, 1}, .want = "in[1]: total steps is not a scalar"},
        {"lr", SCHED, {1, 1}, {2}, {0, 1}, .want = "out[0]: lr is not a scalar"},
        {"a second counter", SCHED, {1, 1}, {1, 1}, .want = "out[1]: the step counter is updated in place: must be in[0]"},
        {"with a gradient norm", SCHED, {1, 1, 1}, {1}, {0, 1}},
        {"gradient norm of 2", SCHED, {1, 1, 2}, {1}, {0, 1}, .want = "in[2]: gradient norm is not a scalar"},

        {"consistent", COUNT(GRAD_NORM, 10), {10}, {1}, .in0_view = 1},
        {"not a view", COUNT(GRAD_NORM, 10), {10}, {1}, .want = "in[0]: must be the grads view"},
        {"count", COUNT(GRAD_NORM, 10), {9}, {1}, .in0_view = 1, .want = "in[0]: n != gradient count"},
        {"norm", COUNT(GRAD_NORM, 10), {10}, {2}, .in0_view = 1, .want = "out[0]: norm is not a scalar"},
        {"with a loss scale", COUNT(GRAD_NORM, 10), {10, 1}, {1}, .in0_view = 1},
        {"loss scale of 2", COUNT(GRAD_NORM, 10), {10, 2}, {1}, .in0_view = 1, .want = "in[1]: the loss scale is not a scalar"},

        /* ZeRO-1's norm from the shards: a sum of squares per block of TG_NORM_BLOCK, then
         * the norm of any number of such sums. */
        {"consistent", .kind = TG_OP_GRAD_SQUARES, .p = {.squares = {.n = 10}}, {10}, {1}, .in0_view = 1},
        {"a slice of two blocks", .kind = TG_OP_GRAD_SQUARES, .p = {.squares = {.n = 3 * TG_NORM_BLOCK + 1, .slice = 2 * TG_NORM_BLOCK}},
         {3 * TG_NORM_BLOCK + 1}, {4}, .in0_view = 1},
        {"not a view", .kind = TG_OP_GRAD_SQUARES, .p = {.squares = {.n = 10}}, {10}, {1},
         .want = "in[0]: must be the grads view"},
        {"n 0", .kind = TG_OP_GRAD_SQUARES, .p = {.squares = {.n = 0}}, {Z0}, {1}, .in0_view = 1,
         .want = "in[0]: n != gradient count"},
        {"slice not whole blocks", .kind = TG_OP_GRAD_SQUARES, .p = {.squares = {.n = 10, .slice = 5}}, {10}, {1},
         .in0_view = 1, .want = "slice: not a multiple of the norm block"},
        {"negative slice", .kind = TG_OP_GRAD_SQUARES, .p = {.squares = {.n = 10, .slice = -TG_NORM_BLOCK}}, {10}, {1},
         .in0_view = 1, .want = "slice: not a multiple of the norm block"},
        {"blocks", .kind = TG_OP_GRAD_SQUARES, .p = {.squares = {.n = TG_NORM_BLOCK + 1}}, {TG_NORM_BLOCK + 1}, {1},
         .in0_view = 1, .want = "out[0]: not one sum per norm block"},
        {"consistent", .kind = TG_OP_NORM_OF_SQUARES, .in = {7}, .out = {1}, .any_size = 1u},
        {"with a loss scale", .kind = TG_OP_NORM_OF_SQUARES, .in = {7, 1}, .out = {1}, .any_size = 1u},
        {"loss scale of 2", .kind = TG_OP_NORM_OF_SQUARES, .in = {7, 2}, .out = {1},
         .want = "in[1]: the loss scale is not a scalar"},
        {"norm of 2", .kind = TG_OP_NORM_OF_SQUARES, .in = {7}, .out = {2}, .want = "out[0]: norm is not a scalar"},

        {"consistent", ADAMW(), {10, 1, 1, 1}, {10, 10, 10}},
        {"with bf16 copies", ADAMW(), {10, 1, 1, 1}, {10, 10, 10, 10}},
        {"zero_slice < 0", ADAMW(.zero_slice = -1), {10, 1, 1, 1}, {10, 10, 10}, .want = "zero_slice is negative"},
        {"n", ADAMW(), {9, 1, 1, 1}, {9, 10, 10}, .want = "in[0]: n != parameter count"},
        {"lr", ADAMW(), {10, 2, 1, 1}, {10, 10, 10}, .want = "in[1]: lr is not a scalar"},
        {"step counter", ADAMW(), {10, 1, 2, 1}, {10, 10, 10}, .want = "in[2]: step counter is not a scalar"},
        {"grad norm", ADAMW(), {10, 1, 1, 2}, {10, 10, 10}, .want = "in[3]: grad norm is not a scalar"},
        {"with a loss scale", ADAMW(), {10, 1, 1, 1, 1}, {10, 10, 10}},
        {"loss scale of 2", ADAMW(), {10, 1, 1, 1, 2}, {10, 10, 10}, .want = "in[4]: the loss scale is not a scalar"},
        {"params", ADAMW(), {10, 1, 1, 1}, {9, 10, 10}, .want = "out[0]: params differ from the grads in size"},
        {"m", ADAMW(), {10, 1, 1, 1}, {10, 9, 10}, .want = "out[1]: m != zero_slice (or n) elements"},
        {"v", ADAMW(), {10, 1, 1, 1}, {10, 10, 9}, .want = "out[2]: v != zero_slice (or n) elements"},
        {"copies", ADAMW(), {10, 1, 1, 1}, {10, 10, 10, 9},
         .want = "out[3]: parameter copies differ from the params in size"},
        /* ZeRO-1: each replica's state is its slice; the slices cover the parameters. */
        {"slices of 5 for 2 replicas", ADAMW(.zero_slice = 5), {10, 1, 1, 1}, {10, 5, 5}, .replicas = 2},
        {"slices of 4 for 3 replicas", ADAMW(.zero_slice = 4), {10, 1, 1, 1}, {10, 4, 4}, .replicas = 3},
        {"m of the slice", ADAMW(.zero_slice = 5), {10, 1, 1, 1}, {10, 10, 5}, .replicas = 2,
         .want = "out[1]: m != zero_slice (or n) elements"},
        {"slices of 4 for 2 replicas", ADAMW(.zero_slice = 4), {10, 1, 1, 1}, {10, 4, 4}, .replicas = 2,
         .want = "zero_slice: the replicas' slices do not cover the parameters"},
        {"slices past int64", ADAMW(.zero_slice = (int64_t)1 << 62), {10, 1, 1, 1},
         {10, (int64_t)1 << 62, (int64_t)1 << 62}, .replicas = 4},
        /* The smallest slice: one element per replica, the state of one element. */
        {"slices of 1 for 10 replicas", ADAMW(.zero_slice = 1), {10, 1, 1, 1}, {10, 1, 1}, .replicas = 10},
        {"whole state with slices of 1", ADAMW(.zero_slice = 1), {10, 1, 1, 1}, {10, 10, 10}, .replicas = 10,
         .want = "out[1]: m != zero_slice (or n) elements"},
        {"slices of 1 for 9 replicas", ADAMW(.zero_slice = 1), {10, 1, 1, 1}, {10, 1, 1}, .replicas = 9,
         .want = "zero_slice: the replicas' slices do not cover the parameters"},
        /* ADAN: two state vectors of the slice (or n) per slot. */
        {"adan", ADAN(), {10, 1, 1, 1}, {10, 20, 20}},
        {"adan slices of 1", ADAN(.zero_slice = 1), {10, 1, 1, 1}, {10, 2, 2}, .replicas = 10},
        {"adan whole state with slices of 1", ADAN(.zero_slice = 1), {10, 1, 1, 1}, {10, 20, 20}, .replicas = 10,
         .want = "out[1]: m and d != 2 x zero_slice (or n) elements"},
        {"adan m and d odd", ADAN(), {10, 1, 1, 1}, {10, 21, 20}, .want = "out[1]: m and d != 2 x zero_slice (or n) elements"},
        {"adan v and g_prev", ADAN(), {10, 1, 1, 1}, {10, 20, 22},
         .want = "out[2]: v and g_prev != 2 x zero_slice (or n) elements"},
        {"adan v and g_prev odd", ADAN(), {10, 1, 1, 1}, {10, 20, 21},
         .want = "out[2]: v and g_prev != 2 x zero_slice (or n) elements"},
        {"adan no_prox 2", ADAN(.no_prox = 2), {10, 1, 1, 1}, {10, 20, 20}, .want = "no_prox: not 0 or 1"},

        {"consistent", COUNT(ALL_REDUCE, 10), {10}, .alias_out = {1}},
        {"out of place", COUNT(ALL_REDUCE, 10), {10}, {10}, .want = "out[0]: works in place: must be in[0]"},
        {"count", COUNT(ALL_REDUCE, 10), {9}, .alias_out = {1}, .want = "in[0]: n != element count"},

        /* ZeRO-1's reduce-scatter: in place, a view of the gradients from element `first` (its
         * offset), over the update's slices (whole norm blocks). */
        {"consistent", .kind = TG_OP_REDUCE_SCATTER, .p = {.reduce_scatter = {.n = 10, .slice = TG_NORM_BLOCK}}, {10},
         .alias_out = {1}},
        {"out of place", .kind = TG_OP_REDUCE_SCATTER, .p = {.reduce_scatter = {.n = 10, .slice = TG_NORM_BLOCK}}, {10},
         {10}, .want = "out[0]: works in place: must be in[0]"},
        {"count", .kind = TG_OP_REDUCE_SCATTER, .p = {.reduce_scatter = {.n = 10, .slice = TG_NORM_BLOCK}}, {9},
         .alias_out = {1}, .want = "in[0]: n != element count"},
        {"first < 0", .kind = TG_OP_REDUCE_SCATTER, .p = {.reduce_scatter = {.n = 10, .first = -1, .slice = TG_NORM_BLOCK}},
         {10}, .alias_out = {1}, .want = "first is negative"},
        {"first past its offset", .kind = TG_OP_REDUCE_SCATTER,
         .p = {.reduce_scatter = {.n = 10, .first = 64, .slice = TG_NORM_BLOCK}}, {10}, .alias_out = {1},
         .want = "first: not in[0]'s element offset"},
        {"slice 0", .kind = TG_OP_REDUCE_SCATTER, .p = {.reduce_scatter = {.n = 10}}, {10}, .alias_out = {1},
         .want = "slice: not a positive multiple of the norm block"},
        {"slice not whole blocks", .kind = TG_OP_REDUCE_SCATTER, .p = {.reduce_scatter = {.n = 10, .slice = 100}}, {10},
         .alias_out = {1}, .want = "slice: not a positive multiple of the norm block"},

        {"consistent", .kind = TG_OP_ALL_GATHER, .p = {.all_gather = {.slice = 5}}, {10}, .alias_out = {1}, .replicas = 2},
        {"one replica", .kind = TG_OP_ALL_GATHER, .p = {.all_gather = {.slice = 10}}, {10}, .alias_out = {1}},
        {"out of place", .kind = TG_OP_ALL_GATHER, .p = {.all_gather = {.slice = 5}}, {10}, {10}, .replicas = 2,
         .want = "out[0]: works in place: must be in[0]"},
        {"slice 0", .kind = TG_OP_ALL_GATHER, .p = {.all_gather = {.slice = 0}}, {10}, .alias_out = {1},
         .want = "slice is not positive"},
        {"no replicas", .kind = TG_OP_ALL_GATHER, .p = {.all_gather = {.slice = 5}}, {10}, .alias_out = {1},
         .replicas = NO_REPLICAS, .want = "the plan has no replicas"},
        {"3 slices of 5 in 10", .kind = TG_OP_ALL_GATHER, .p = {.all_gather = {.slice = 5}}, {10}, .alias_out = {1},
         .replicas = 3, .want = "in[0]: not one slice of `slice` elements per replica"},

        {"zero, any dtype", .kind = TG_OP_ZERO, .out = {7}, .any_size = 1u << TG_OP_MAX_IN},
        {"fill", .kind = TG_OP_FILL, .p = {.fill = {.value = 2.0f}}, .out = {3}, .any_size = 1u << TG_OP_MAX_IN},
        {"fill scaled", .kind = TG_OP_FILL, .p = {.fill = {.value = 2.0f}}, {1}, {3}, .any_size = 1u << TG_OP_MAX_IN},
        {"fill scaled by 2 elements", .kind = TG_OP_FILL, .p = {.fill = {.value = 2.0f}}, {2}, {3},
         .want = "in[0]: the scale is not a scalar"},
    };
    run_cases(cases, N_CASES(cases));
}

/* ---- slot signatures: each dtype class ------------------------------------------------- */

TG_TEST(test_op_meta_rules_slot_dtypes) {
    tg_tensor t[9];
    int32_t n_t = 0;
    const int32_t f32_12 = add_tensor(t, &n_t, 12, TG_F32), f32_15 = add_tensor(t, &n_t, 15, TG_F32),
                  f32_20 = add_tensor(t, &n_t, 20, TG_F32), i32_12 = add_tensor(t, &n_t, 12, TG_I32),
                  bf16_4 = add_tensor(t, &n_t, 4, TG_BF16), i32_5 = add_tensor(t, &n_t, 5, TG_I32),
                  bad_7 = add_tensor(t, &n_t, 7, TG_F32);
    t[bad_7].dtype = TG_DTYPE_COUNT; /* a dtype no build has */
    const int32_t neg_7 = add_tensor(t, &n_t, 7, TG_F32);
    t[neg_7].dtype = -1;
    const tg_op_check_ctx c = {t, n_t, 1};
    char why[160];

    tg_op mm = tg_test_op(TG_OP_MATMUL);
    mm.p.matmul = (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 1, .alpha = 1.0f};
    mm.in[0] = f32_12, mm.in[1] = f32_15, mm.out[0] = f32_20;
    REQUIRE(tg_op_check(&c, &mm, why, sizeof why) == 0, "the base matmul refused: %s", why);
    struct {
        const char *what;
        tg_op op;
        const char *want;
    } cases[8];
    int n = 0;
    /* F: f32, bf16 or f16, required. */
    cases[n].what = "F", cases[n].op = mm, cases[n].op.in[0] = i32_12, cases[n++].want = "in[0] must be f32, bf16 or f16, is i32";
    /* f: f32, bf16 or f16, optional. */
    cases[n].what = "f", cases[n].op = mm, cases[n].op.in[2] = i32_5, cases[n++].want = "in[2] must be f32, bf16 or f16, is i32";
    /* s: f32, optional (the bias gradient). */
    cases[n].what = "s", cases[n].op = mm, cases[n].op.out[1] = bf16_4, cases[n].op.p.matmul.bias_grad = 1,
    cases[n].op.p.matmul.trans_a = 1, cases[n++].want = "out[1] must be f32, is bf16";
    /* S: f32, required (a LayerNorm's gamma). */
    tg_op ln = tg_test_op(TG_OP_LAYERNORM);
    ln.p.layernorm = (tg_layernorm_params){.m = 1, .d = 4};
    ln.in[0] = bf16_4, ln.in[1] = bf16_4, ln.in[2] = bf16_4, ln.out[0] = bf16_4, ln.out[1] = f32_12, ln.out[2] = f32_12;
    cases[n].what = "S", cases[n].op = ln, cases[n++].want = "in[1] must be f32, is bf16";
    /* I: i32, required (embedding ids). */
    tg_op emb = tg_test_op(TG_OP_EMBEDDING);
    emb.in[0] = f32_12, emb.in[1] = f32_12, emb.out[0] = f32_12;
    cases[n].what = "I", cases[n].op = emb, cases[n++].want = "in[0] must be i32, is f32";
    /* i: i32, optional (attention's keep bits). */
    tg_op att = tg_test_op(TG_OP_ATTENTION);
    att.in[0] = att.in[1] = att.in[2] = f32_12, att.out[0] = att.out[1] = f32_12, att.out[2] = f32_12;
    cases[n].what = "i", cases[n].op = att, cases[n++].want = "out[2] must be i32, is f32";
    /* A: any known dtype. */
    tg_op zero = tg_test_op(TG_OP_ZERO);
    zero.out[0] = bad_7;
    cases[n].what = "A", cases[n].op = zero, cases[n++].want = "out[0] must be a known dtype, is ?";
    for (int k = 0; k < n; k++) {
        why[0] = 0;
        CHECK(tg_op_check(&c, &cases[k].op, why, sizeof why) == -1 && !strcmp(why, cases[k].want),
              "slot class %s: '%s', want '%s'", cases[k].what, why, cases[k].want);
    }
    zero.out[0] = neg_7;
    CHECK(tg_op_check(&c, &zero, why, sizeof why) == -1 && !strcmp(why, "out[0] must be a known dtype, is ?"),
          "zero of dtype -1: '%s'", why);
    /* A: every known dtype, i32 and bf16 included. */
    zero.out[0] = i32_12;
    CHECK(tg_op_check(&c, &zero, why, sizeof why) == 0, "zero of an i32 tensor refused: %s", why);
    zero.out[0] = bf16_4;
    CHECK(tg_op_check(&c, &zero, why, sizeof why) == 0, "zero of a bf16 tensor refused: %s", why);
    /* The exact slot messages. */
    tg_op op = mm;
    op.in[1] = -1;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, "in[1] is required"), "'%s'", why);
    op = mm;
    op.in[5] = f32_12;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, "in[5] is unused and must be -1, is tensor 0"),
          "'%s'", why);
    op = mm;
    op.out[0] = n_t;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, "out[0] refers to tensor 8 of 8"), "'%s'", why);
    op = mm;
    op.out[0] = n_t + 1; /* past the table, not only its end */
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, "out[0] refers to tensor 9 of 8"), "'%s'", why);
    op = mm;
    op.in[0] = INT32_MAX;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, "in[0] refers to tensor 2147483647 of 8"), "'%s'",
          why);
    op = mm;
    op.in[3] = -2;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, "in[3] refers to tensor -2 of 8"), "'%s'", why);
    char want[32];
    snprintf(want, sizeof want, "unknown op kind %d", TG_OP_COUNT);
    op.kind = TG_OP_COUNT;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, want), "'%s', want '%s'", why, want);
    op.kind = -1;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && !strcmp(why, "unknown op kind -1"), "'%s'", why);
}

/* ---- names and contracts ---------------------------------------------------------------- */

static void count_i64(void *ctx, const char *display, int64_t *value) { ++*(int *)ctx; }
static void count_f32(void *ctx, const char *display, float *value) { ++*(int *)ctx; }

TG_TEST(test_op_meta_rules_names) {
    for (int k = 0; k < TG_OP_COUNT; k++)
        CHECK(tg_op_kind_of_name(tg_op_name(k)) == k, "'%s' maps to kind %d, not %d", tg_op_name(k),
              tg_op_kind_of_name(tg_op_name(k)), k);
    CHECK(tg_op_kind_of_name("geglu") == -1 && tg_op_kind_of_name("") == -1 && tg_op_kind_of_name("Matmul") == -1,
          "an unknown name maps to a kind");
    /* The parameter walk: MATMUL's ten, none for a kind outside the enum. */
    int seen = 0;
    tg_op_params params;
    memset(&params, 0, sizeof params);
    const tg_param_visitor v = {&seen, count_i64, count_f32};
    tg_op_params_visit(TG_OP_MATMUL, &params, &v);
    CHECK(seen == 10, "matmul: %d parameters visited", seen);
    seen = 0;
    tg_op_params_visit(-1, &params, &v);
    tg_op_params_visit(TG_OP_COUNT, &params, &v);
    CHECK(seen == 0, "kinds -1 and TG_OP_COUNT: %d parameters visited", seen);
    CHECK(!strcmp(tg_op_name(-1), "?") && !strcmp(tg_op_name(TG_OP_COUNT), "?"), "names outside the enum");
    CHECK(tg_op_out_contract(TG_OP_EMBEDDING_BWD, -1) == TG_WRITE &&
              tg_op_out_contract(TG_OP_EMBEDDING_BWD, 1) == TG_WRITE &&
              tg_op_out_contract(TG_OP_EMBEDDING_BWD, 0) == TG_ACCUMULATE && tg_op_out_contract(-1, 0) == TG_WRITE &&
              tg_op_out_contract(TG_OP_COUNT, 0) == TG_WRITE,
          "contracts of slots and kinds outside the rows");
}

/* ---- FLOPs -------------------------------------------------------------------------- */

/* ---- the convolutional image model: conv2d, batchnorm, relu6, global average pooling --- */

/* N 2, C_in 4, 5x5, C_out 6, K 3, stride 2, pad 1, groups 2: a 3x3 output; x 200, the
 * weight 6 x 2 x 9 = 108, y 2 x 6 x 9 = 108, the bias 6. */
#define CONV_P(...) {.conv2d = {.n = 2, .c_in = 4, .h = 5, .w = 5, .c_out = 6, .k = 3, .stride = 2, .pad = 1, .groups = 2, __VA_ARGS__}}
#define CONVB_P(...) {.conv2d_bwd = {.n = 2, .c_in = 4, .h = 5, .w = 5, .c_out = 6, .k = 3, .stride = 2, .pad = 1, .groups = 2, __VA_ARGS__}}
#define CONV(...) .kind = TG_OP_CONV2D, .p = CONV_P(__VA_ARGS__)
#define CONVB(...) .kind = TG_OP_CONV2D_BWD, .p = CONVB_P(__VA_ARGS__)
#define CONV_DIMS "non-positive dims (N, C_in, H, W, C_out, K)"
/* N 2, C 3, HW 4: x 24, the channel vectors 3, stats 6. */
#define BN(...) .kind = TG_OP_BATCHNORM, .p = {.batchnorm = {.n = 2, .c = 3, .hw = 4, .eps = 1e-5f, .momentum = 0.1f, __VA_ARGS__}}
#define BNB(...) .kind = TG_OP_BATCHNORM_BWD, .p = {.batchnorm_bwd = {.n = 2, .c = 3, .hw = 4, .eps = 1e-5f, __VA_ARGS__}}
#define POOL(...) .kind = TG_OP_GLOBAL_AVG_POOL, .p = {.avg_pool = {.n = 2, .c = 3, .hw = 4, __VA_ARGS__}}
#define POOLB(...) .kind = TG_OP_GLOBAL_AVG_POOL_BWD, .p = {.avg_pool = {.n = 2, .c = 3, .hw = 4, __VA_ARGS__}}
#define BN_DIMS "non-positive dims (N, C, HW)"

TG_TEST(test_op_meta_rules_conv2d) {
    static const rule_case cases[] = {
        {"consistent", CONV(), {200, 108, 6}, {108}},
        {"no bias", CONV(), {200, 108}, {108}},
        {"depthwise", CONV(.c_in = 4, .c_out = 4, .groups = 4), {200, 36}, {72}},
        {"pointwise", CONV(.k = 1, .stride = 1, .pad = 0, .groups = 1, .c_out = 3), {200, 12}, {150}},
        {"N 0", CONV(.n = 0), {Z0, 108}, {Z0}, .want = CONV_DIMS},
        {"K 0", CONV(.k = 0), {200, Z0}, {108}, .want = CONV_DIMS},
        {"stride 0", CONV(.stride = 0), {200, 108}, {108}, .want = "stride is not positive"},
        {"pad < 0", CONV(.pad = -1), {200, 108}, {108}, .want = "pad is negative"},
        {"groups 0", CONV(.groups = 0), {200, 108}, {108}, .want = "groups does not divide C_in and C_out"},
        {"groups 3", CONV(.groups = 3), {200, 108}, {108}, .want = "groups does not divide C_in and C_out"},
        {"groups 4 of 6 outputs", CONV(.groups = 4), {200, 54}, {108}, .want = "groups does not divide C_in and C_out"},
        {"K past the padded image", CONV(.k = 8), {200, 768}, {24}, .want = "K is larger than the padded image"},
        {"H past 2^31", CONV(.h = (int64_t)1 << 31), {200, 108}, {108}, .want = "H, W, K or pad past 2^31"},
        {"pad past 2^31", CONV(.pad = (int64_t)1 << 31), {200, 108}, {108}, .want = "H, W, K or pad past 2^31"},
        {"x past int64", CONV(.n = BIG, .c_in = BIG, .groups = 1), {200, 108}, {108}, .want = "N*C_in*H*W overflows"},
        {"weight past int64", CONV(.c_out = BIG * 4, .k = 1, .groups = 1, .pad = 0, .c_in = BIG), {200, 108}, {108},
         .want = "C_out*(C_in/groups)*K*K overflows"},
        {"y past int64", CONV(.n = BIG, .c_in = 1, .c_out = BIG, .groups = 1), {200, 108}, {108},
         .want = "N*C_out*OH*OW overflows"},

        {"consistent", CONVB(), {108, 200, 108}, {200, 108, 6}},
        {"dx alone", CONVB(), {108, 0, 108}, {200}},
        {"dweight alone", CONVB(), {108, 200}, {0, 108}},
        {"dbias alone", CONVB(), {108}, {0, 0, 6}},
        {"no output", CONVB(), {108, 200, 108}, {0}, .want = "no output: dx, dweight and dbias are all absent"},
        {"dweight without x", CONVB(), {108, 0, 108}, {200, 108}, .want = "in[1]: dweight needs x"},
        {"dx without the weight", CONVB(), {108, 200}, {200, 108}, .want = "in[2]: dx needs the weight"},
        {"stride 0", CONVB(.stride = 0), {108, 200, 108}, {200, 108, 6}, .want = "stride is not positive"},
        {"C_out 0", CONVB(.c_out = 0), {Z0, 200, Z0}, {200, Z0, Z0}, .want = CONV_DIMS},
    };
    run_cases(cases, N_CASES(cases));
}

TG_TEST(test_op_meta_rules_batchnorm) {
    static const rule_case cases[] = {
        {"consistent", BN(), {24, 3, 3, 3, 3}, {24, 6}, .alias_out = {0, 0, 4, 5}},
        {"no running statistics", BN(), {24, 3, 3}, {24, 6}},
        {"running mean alone", BN(), {24, 3, 3, 3}, {24, 6}, .alias_out = {0, 0, 4},
         .want = "in[3], in[4]: the running mean and variance, both or neither"},
        {"running mean not in place", BN(), {24, 3, 3, 3, 3}, {24, 6, 3}, .alias_out = {0, 0, 0, 5},
         .want = "out[2]: the running mean is updated in place: must be in[3]"},
        {"running variance not updated", BN(), {24, 3, 3, 3, 3}, {24, 6}, .alias_out = {0, 0, 4},
         .want = "out[3]: the running variance is updated in place: must be in[4]"},
        {"C 0", BN(.c = 0), {Z0, Z0, Z0}, {Z0, Z0}, .want = BN_DIMS},
        {"x past int64", BN(.n = BIG, .hw = BIG), {24, 3, 3}, {24, 6}, .want = "N*C*HW overflows"},
        {"eps 0", BN(.eps = 0.0f), {24, 3, 3}, {24, 6}, .want = "eps: not finite and positive"},
        {"eps inf", BN(.eps = INFINITY), {24, 3, 3}, {24, 6}, .want = "eps: not finite and positive"},
        {"momentum < 0", BN(.momentum = -0.1f), {24, 3, 3}, {24, 6}, .want = "momentum outside [0, 1]"},
        {"momentum > 1", BN(.momentum = 1.5f), {24, 3, 3}, {24, 6}, .want = "momentum outside [0, 1]"},
        {"momentum NaN", BN(.momentum = NAN), {24, 3, 3}, {24, 6}, .want = "momentum outside [0, 1]"},
        {"relu6", BN(.relu6 = 1), {24, 3, 3}, {24, 6}},
        {"relu6 2", BN(.relu6 = 2), {24, 3, 3}, {24, 6}, .want = "relu6: not 0 or 1"},

        {"consistent", BNB(), {24, 24, 3, 6}, {24, 3, 3}},
        {"no dgamma and dbeta", BNB(), {24, 24, 3, 6}, {24}},
        {"HW 0", BNB(.hw = 0), {Z0, Z0, 3, 6}, {Z0}, .want = BN_DIMS},
        {"x past int64", BNB(.c = BIG, .hw = BIG), {24, 24, 3, 6}, {24}, .want = "N*C*HW overflows"},
        {"eps NaN", BNB(.eps = NAN), {24, 24, 3, 6}, {24}, .want = "eps: not finite and positive"},
        {"relu6 with y", BNB(.relu6 = 1), {24, 24, 3, 6, 24}, {24, 3, 3}},
        {"relu6 without y", BNB(.relu6 = 1), {24, 24, 3, 6}, {24},
         .want = "in[4]: the forward's output != N*C*HW (relu6 needs it)"},
        {"relu6, y of another size", BNB(.relu6 = 1), {24, 24, 3, 6, 12}, {24},
         .want = "in[4]: the forward's output != N*C*HW (relu6 needs it)"},
        {"y without relu6", BNB(), {24, 24, 3, 6, 24}, {24}, .want = "in[4]: set without relu6"},
        {"relu6 -1", BNB(.relu6 = -1), {24, 24, 3, 6, 24}, {24}, .want = "relu6: not 0 or 1"},
    };
    run_cases(cases, N_CASES(cases));
}

TG_TEST(test_op_meta_rules_relu6_avg_pool) {
    static const rule_case cases[] = {
        {"consistent", .kind = TG_OP_RELU6, .p = {.count = {.n = 5}}, {5}, {5}},
        {"n < 0", .kind = TG_OP_RELU6, .p = {.count = {.n = -1}}, {5}, {5}, .want = "n is negative"},
        {"consistent", .kind = TG_OP_RELU6_BWD, .p = {.count = {.n = 5}}, {5, 5}, {5}},
        {"consistent", POOL(), {24}, {6}},
        {"N 0", POOL(.n = 0), {Z0}, {Z0}, .want = BN_DIMS},
        {"past int64", POOL(.c = BIG, .hw = BIG), {24}, {6}, .want = "N*C*HW overflows"},
        {"N*C past int64", POOL(.n = BIG, .c = BIG, .hw = 1), {24}, {6}, .want = "N*C*HW overflows"},
        {"consistent", POOLB(), {6}, {24}},
        {"HW 0", POOLB(.hw = 0), {6}, {Z0}, .want = BN_DIMS},
    };
    run_cases(cases, N_CASES(cases));
}

typedef struct flops_case {
    const char *what;
    tg_op op;
    double want;
} flops_case;

static tg_op with_slots(int kind, int in2, int in5, int out1) {
    tg_op op = tg_test_op(kind);
    op.in[2] = in2, op.in[5] = in5, op.out[1] = out1;
    return op;
}

TG_TEST(test_op_meta_rules_flops) {
    flops_case c[80];
    int n = 0;
#define FC(WHAT, OP, SET, WANT, ...)        \
    do {                                    \
        c[n].what = WHAT;                   \
        c[n].op = OP;                       \
        c[n].op.p.SET = __VA_ARGS__;        \
        c[n++].want = WANT;                 \
    } while (0)
    const tg_op none = tg_test_op(TG_OP_ZERO);
    FC("zero", none, count, 0.0, (tg_count_params){.n = 99});
    FC("fill", tg_test_op(TG_OP_FILL), fill, 0.0, (tg_fill_params){.value = 3.0f});
    FC("embedding", tg_test_op(TG_OP_EMBEDDING), embedding, 0.0, (tg_embedding_params){.n = 6, .vocab = 10, .dim = 3});
    FC("embedding_bwd: N*D", tg_test_op(TG_OP_EMBEDDING_BWD), embedding, 18.0,
       (tg_embedding_params){.n = 6, .vocab = 10, .dim = 3});
    FC("add: n", tg_test_op(TG_OP_ADD), count, 7.0, (tg_count_params){.n = 7});
    FC("tanh_bwd: n", tg_test_op(TG_OP_TANH_BWD), count, 9.0, (tg_count_params){.n = 9});
    FC("all_reduce: n", tg_test_op(TG_OP_ALL_REDUCE), count, 11.0, (tg_count_params){.n = 11});
    FC("dropout: its n", tg_test_op(TG_OP_DROPOUT), dropout, 13.0, (tg_dropout_params){.n = 13, .key = 99, .p = 0.5f});
    FC("gelu: 10n", tg_test_op(TG_OP_GELU), gelu, 50.0, (tg_gelu_params){.n = 5, .form = 1});
    FC("tanh: 10n", tg_test_op(TG_OP_TANH), count, 60.0, (tg_count_params){.n = 6});
    FC("gelu_bwd: 10n", tg_test_op(TG_OP_GELU_BWD), gelu_bwd, 60.0, (tg_gelu_bwd_params){.n = 6, .bias_cols = 0});
    FC("gelu_bwd with bias gradient: 11n", tg_test_op(TG_OP_GELU_BWD), gelu_bwd, 66.0,
       (tg_gelu_bwd_params){.n = 6, .bias_cols = 3});
    FC("matmul: 2MNK", tg_test_op(TG_OP_MATMUL), matmul, 120.0,
       (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 1});
    FC("matmul batched with bias: 2MNKb + MNb", with_slots(TG_OP_MATMUL, 0, -1, -1), matmul, 2.0 * 4 * 5 * 3 * 2 + 40,
       (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 2});
    FC("matmul bias_grad 1: + KM", tg_test_op(TG_OP_MATMUL), matmul, 120.0 + 12,
       (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 1, .bias_grad = 1});
    FC("matmul bias_grad 2: + KN", tg_test_op(TG_OP_MATMUL), matmul, 120.0 + 15,
       (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 1, .bias_grad = 2});
    FC("matmul bias_grad 3: no sums", tg_test_op(TG_OP_MATMUL), matmul, 120.0,
       (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 1, .bias_grad = 3});
    FC("matmul GELU backward: + 10MN", tg_test_op(TG_OP_MATMUL), matmul, 120.0 + 200,
       (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 1, .activation = 2});
    FC("bias_grad: MN", tg_test_op(TG_OP_BIAS_GRAD), bias_grad, 20.0, (tg_bias_grad_params){.m = 4, .n = 5});
    FC("layernorm: 8MD", tg_test_op(TG_OP_LAYERNORM), layernorm, 96.0, (tg_layernorm_params){.m = 4, .d = 3});
    FC("layernorm_bwd: 12MD", tg_test_op(TG_OP_LAYERNORM_BWD), layernorm_bwd, 144.0,
       (tg_layernorm_bwd_params){.m = 4, .d = 3});
    FC("residual_layernorm: 9MD", tg_test_op(TG_OP_RESIDUAL_LAYERNORM), residual_layernorm, 108.0,
       (tg_residual_layernorm_params){.m = 4, .d = 3});
    FC("residual_layernorm with dropout: 10MD", tg_test_op(TG_OP_RESIDUAL_LAYERNORM), residual_layernorm, 120.0,
       (tg_residual_layernorm_params){.m = 4, .d = 3, .p = 0.1f});
    FC("residual_layernorm_bwd: 12MD", tg_test_op(TG_OP_RESIDUAL_LAYERNORM_BWD), residual_layernorm_bwd, 144.0,
       (tg_residual_layernorm_bwd_params){.m = 4, .d = 3});
    FC("residual_layernorm_bwd with ds_extra: 13MD", with_slots(TG_OP_RESIDUAL_LAYERNORM_BWD, -1, 0, -1),
       residual_layernorm_bwd, 156.0, (tg_residual_layernorm_bwd_params){.m = 4, .d = 3});
    FC("residual_layernorm_bwd with dropout: 13MD", tg_test_op(TG_OP_RESIDUAL_LAYERNORM_BWD), residual_layernorm_bwd,
       156.0, (tg_residual_layernorm_bwd_params){.m = 4, .d = 3, .p = 0.1f});
    FC("rmsnorm: 4MD", tg_test_op(TG_OP_RMSNORM), rmsnorm, 48.0, (tg_rmsnorm_params){.m = 4, .d = 3, .eps = 1e-5f});
    FC("rmsnorm_bwd: 8MD", tg_test_op(TG_OP_RMSNORM_BWD), rmsnorm, 96.0, (tg_rmsnorm_params){.m = 4, .d = 3});
    FC("rope: 3N(H+Hkv)Dh", tg_test_op(TG_OP_ROPE), rope, 3.0 * 5 * (8 + 2) * 16,
       (tg_rope_params){.n = 5, .h = 8, .kv_heads = 2, .head_dim = 16, .type = TG_ROPE_DEFAULT, .theta = 1e4f});
    FC("rope_bwd: 3N(H+Hkv)Dh", tg_test_op(TG_OP_ROPE_BWD), rope, 3.0 * 5 * (8 + 8) * 16,
       (tg_rope_params){.n = 5, .h = 8, .kv_heads = 8, .head_dim = 16, .type = TG_ROPE_LLAMA3, .theta = 1e4f});
    FC("rope past int64: counted in double", tg_test_op(TG_OP_ROPE), rope, 3.0 * ((double)INT64_MAX + INT64_MAX),
       (tg_rope_params){.n = 1, .h = INT64_MAX, .kv_heads = INT64_MAX, .head_dim = 1});
    FC("swiglu: 6MI", tg_test_op(TG_OP_SWIGLU), swiglu, 72.0, (tg_swiglu_params){.m = 3, .i = 4});
    FC("swiglu_bwd: 12MI", tg_test_op(TG_OP_SWIGLU_BWD), swiglu, 144.0, (tg_swiglu_params){.m = 3, .i = 4});
    FC("attn_softmax: 5BHTT", tg_test_op(TG_OP_ATTN_SOFTMAX), softmax, 5.0 * 96,
       (tg_softmax_params){.b = 2, .h = 3, .t = 4});
    FC("attn_softmax p > 0 without dropped probs: 5BHTT", tg_test_op(TG_OP_ATTN_SOFTMAX), softmax, 5.0 * 96,
       (tg_softmax_params){.b = 2, .h = 3, .t = 4, .p = 0.1f});
    FC("attn_softmax dropped probs with p = 0: 5BHTT", with_slots(TG_OP_ATTN_SOFTMAX, -1, -1, 0), softmax, 5.0 * 96,
       (tg_softmax_params){.b = 2, .h = 3, .t = 4});
    FC("attn_softmax_bwd: 5BHTT", tg_test_op(TG_OP_ATTN_SOFTMAX_BWD), softmax_bwd, 5.0 * 96,
       (tg_softmax_bwd_params){.b = 2, .h = 3, .t = 4, .p = 0.1f});
    FC("attn_softmax_bwd with dropout: 6BHTT", with_slots(TG_OP_ATTN_SOFTMAX_BWD, 0, -1, -1), softmax_bwd, 6.0 * 96,
       (tg_softmax_bwd_params){.b = 2, .h = 3, .t = 4, .p = 0.1f});
    FC("attn_softmax_bwd counter with p = 0: 5BHTT", with_slots(TG_OP_ATTN_SOFTMAX_BWD, 0, -1, -1), softmax_bwd,
       5.0 * 96, (tg_softmax_bwd_params){.b = 2, .h = 3, .t = 4});
    FC("attention: 4BHTTDh", tg_test_op(TG_OP_ATTENTION), attention, 4.0 * 96 * 5,
       (tg_attention_params){.b = 2, .h = 3, .t = 4, .head_dim = 5});
    FC("causal attention: 2BHTTDh", tg_test_op(TG_OP_ATTENTION), attention, 2.0 * 96 * 5,
       (tg_attention_params){.b = 2, .h = 3, .t = 4, .head_dim = 5, .causal = 1});
    FC("attention_bwd: 8BHTTDh", tg_test_op(TG_OP_ATTENTION_BWD), attention, 8.0 * 96 * 5,
       (tg_attention_params){.b = 2, .h = 3, .t = 4, .head_dim = 5});
    FC("heads_merge", tg_test_op(TG_OP_HEADS_MERGE), heads, 0.0, (tg_heads_params){.b = 2, .t = 3, .h = 4, .head_dim = 5, .parts = 3});
    FC("select_token", tg_test_op(TG_OP_SELECT_TOKEN), select, 0.0, (tg_select_params){.b = 2, .t = 3, .d = 4});
    FC("select_token_bwd", tg_test_op(TG_OP_SELECT_TOKEN_BWD), select, 0.0, (tg_select_params){.b = 2, .t = 3, .d = 4});
    FC("cross_entropy: 4NC", tg_test_op(TG_OP_CROSS_ENTROPY), cross_entropy, 80.0,
       (tg_cross_entropy_params){.n = 4, .c = 5});
    FC("cross_entropy_bwd: 4NC", tg_test_op(TG_OP_CROSS_ENTROPY_BWD), cross_entropy, 80.0,
       (tg_cross_entropy_params){.n = 4, .c = 5, .classes = 3});
    FC("schedule", tg_test_op(TG_OP_SCHEDULE), schedule, 0.0, (tg_schedule_params){.warmup = 5, .lr = 1.0f});
    FC("grad_norm: 2n", tg_test_op(TG_OP_GRAD_NORM), count, 20.0, (tg_count_params){.n = 10});
    FC("grad_squares: 2n", tg_test_op(TG_OP_GRAD_SQUARES), squares, 20.0, (tg_squares_params){.n = 10, .slice = 4096});
    FC("reduce_scatter: n", tg_test_op(TG_OP_REDUCE_SCATTER), reduce_scatter, 10.0,
       (tg_reduce_scatter_params){.n = 10, .slice = 4096});
    FC("adamw: 16n", tg_test_op(TG_OP_ADAMW), adamw, 160.0, (tg_adamw_params){.n = 10, .zero_slice = 5});
    FC("all_gather", tg_test_op(TG_OP_ALL_GATHER), all_gather, 0.0, (tg_all_gather_params){.slice = 5});
    tg_op conv = tg_test_op(TG_OP_CONV2D), conv_bias = tg_test_op(TG_OP_CONV2D);
    conv_bias.in[2] = 0;
    /* N 2, C_in 4, 5x5, C_out 6, K 3, stride 2, pad 1, groups 2: 2*6*3*3 = 108 outputs of
     * 2 x 9 products each. */
    const tg_conv2d_params cp = {.n = 2, .c_in = 4, .h = 5, .w = 5, .c_out = 6, .k = 3, .stride = 2, .pad = 1, .groups = 2};
    FC("conv2d: 2 x outputs x C_in/groups x K^2", conv, conv2d, 2.0 * 108 * 18, cp);
    FC("conv2d with bias: + outputs", conv_bias, conv2d, 2.0 * 108 * 18 + 108, cp);
    tg_op cb_all = tg_test_op(TG_OP_CONV2D_BWD), cb_dx = tg_test_op(TG_OP_CONV2D_BWD), cb_db = tg_test_op(TG_OP_CONV2D_BWD);
    cb_all.out[0] = 0, cb_all.out[1] = 1, cb_all.out[2] = 2, cb_dx.out[0] = 0, cb_db.out[2] = 0;
    const tg_conv2d_bwd_params cbp = {2, 4, 5, 5, 6, 3, 2, 1, 2, 0};
    FC("conv2d_bwd dx, dweight, dbias: two products + outputs", cb_all, conv2d_bwd, 4.0 * 108 * 18 + 108, cbp);
    FC("conv2d_bwd dx alone: one product", cb_dx, conv2d_bwd, 2.0 * 108 * 18, cbp);
    FC("conv2d_bwd dbias alone: the outputs", cb_db, conv2d_bwd, 108.0, cbp);
    FC("batchnorm: 8NCHW", tg_test_op(TG_OP_BATCHNORM), batchnorm, 192.0, (tg_batchnorm_params){.n = 2, .c = 3, .hw = 4});
    FC("batchnorm_bwd: 12NCHW", tg_test_op(TG_OP_BATCHNORM_BWD), batchnorm_bwd, 288.0,
       (tg_batchnorm_bwd_params){.n = 2, .c = 3, .hw = 4});
    FC("relu6: n", tg_test_op(TG_OP_RELU6), count, 7.0, (tg_count_params){.n = 7});
    FC("relu6_bwd: n", tg_test_op(TG_OP_RELU6_BWD), count, 7.0, (tg_count_params){.n = 7});
    FC("global_avg_pool: NCHW", tg_test_op(TG_OP_GLOBAL_AVG_POOL), avg_pool, 24.0, (tg_avg_pool_params){2, 3, 4});
    FC("global_avg_pool_bwd: NCHW", tg_test_op(TG_OP_GLOBAL_AVG_POOL_BWD), avg_pool, 24.0, (tg_avg_pool_params){2, 3, 4});
#undef FC
    for (int k = 0; k < n; k++)
        CHECK(tg_op_flops(&c[k].op) == c[k].want, "%s: %g, want %g", c[k].what, tg_op_flops(&c[k].op), c[k].want);
    tg_op bad = tg_test_op(TG_OP_ADD);
    bad.p.count.n = 5;
    bad.kind = -1;
    CHECK(tg_op_flops(&bad) == 0.0, "kind -1: %g FLOPs", tg_op_flops(&bad));
    bad.kind = TG_OP_COUNT;
    CHECK(tg_op_flops(&bad) == 0.0, "kind TG_OP_COUNT: %g FLOPs", tg_op_flops(&bad));
}

/* ---- bytes ------------------------------------------------------------------------------ */

TG_TEST(test_op_meta_rules_bytes) {
    tg_tensor t[8];
    int32_t n_t = 0;
    const int32_t step = add_tensor(t, &n_t, 1, TG_F32), total = add_tensor(t, &n_t, 1, TG_F32),
                  lr = add_tensor(t, &n_t, 1, TG_F32), a = add_tensor(t, &n_t, 12, TG_BF16),
                  b = add_tensor(t, &n_t, 15, TG_F32), c = add_tensor(t, &n_t, 20, TG_F32),
                  bias = add_tensor(t, &n_t, 5, TG_F32), sums = add_tensor(t, &n_t, 4, TG_F32);
    /* SCHEDULE reads the counter and the total and writes lr and the counter in place:
     * the counter's bytes once. */
    tg_op s = tg_test_op(TG_OP_SCHEDULE);
    s.in[0] = step, s.in[1] = total, s.out[0] = lr, s.out[1] = step;
    CHECK(tg_op_bytes(t, &s) == 12.0, "schedule moves %g bytes, want 12", tg_op_bytes(t, &s));
    /* Every slot of another kind counts, out[1] too: A bf16 24 + B 60 + bias 20 + C 80 + sums 16. */
    tg_op mm = tg_test_op(TG_OP_MATMUL);
    mm.in[0] = a, mm.in[1] = b, mm.in[2] = bias, mm.out[0] = c, mm.out[1] = sums;
    CHECK(tg_op_bytes(t, &mm) == 24.0 + 60 + 20 + 80 + 16, "matmul moves %g bytes, want 200", tg_op_bytes(t, &mm));
    /* A tensor read in the last input slot and written in the last output slot. */
    tg_op last = tg_test_op(TG_OP_ATTENTION_BWD);
    last.in[7] = b, last.out[3] = c;
    CHECK(tg_op_bytes(t, &last) == 140.0, "in[7] and out[3] move %g bytes, want 140", tg_op_bytes(t, &last));
    CHECK(tg_op_bytes(t, &(tg_op){.kind = TG_OP_ZERO, .in = {-1, -1, -1, -1, -1, -1, -1, -1}, .out = {-1, -1, -1, -1}}) ==
              0.0,
          "an op without tensors moves bytes");
}
