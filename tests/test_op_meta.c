/* What plan/ops.def derives for every op kind (plan/op_meta.h): its row (name, slot
 * signatures, gradient contract), the check of an op against its tensors, FLOPs, and the
 * walk over its typed parameters. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "plan/op_meta.h"
#include "runtime/cpu/cpu_exec.h"
#include "tests/harness.h"

/* ---- every kind has a row ---------------------------------------------------------- */

/* Parameters a visitor saw: display names, addresses and kinds, in visiting order. */
enum { MAX_SEEN = 16 };
typedef struct seen_params {
    int n;
    const char *display[MAX_SEEN];
    void *addr[MAX_SEEN];
    int is_float[MAX_SEEN];
} seen_params;

static void see(seen_params *s, const char *display, void *addr, int is_float) {
    if (s->n < MAX_SEEN) s->display[s->n] = display, s->addr[s->n] = addr, s->is_float[s->n] = is_float;
    s->n++;
}
static void see_i64(void *ctx, const char *display, int64_t *value) { see(ctx, display, value, 0); }
static void see_f32(void *ctx, const char *display, float *value) { see(ctx, display, value, 1); }

static void visit_params(int kind, tg_op_params *p, seen_params *s) {
    memset(s, 0, sizeof *s);
    tg_param_visitor v = {s, see_i64, see_f32};
    tg_op_params_visit(kind, p, &v);
}

static int only_chars(const char *s, const char *allowed) { return strspn(s, allowed) == strlen(s); }

TG_TEST(test_op_meta_every_kind_has_a_row) {
    for (int k = 0; k < TG_OP_COUNT; k++) {
        const tg_op_info *info = tg_op_info_of(k);
        if (!CHECK(info && info->name && info->inputs && info->outputs && info->contract, "op kind %d has no row", k))
            continue;
        const char *name = info->name;
        CHECK(name[0] && strcmp(tg_op_name(k), "?") != 0 && !strcmp(tg_op_name(k), name),
              "op kind %d: row name '%s', tg_op_name '%s'", k, name, tg_op_name(k));
        for (int j = 0; j < k; j++)
            CHECK(!tg_op_info_of(j) || strcmp(tg_op_info_of(j)->name, name) != 0, "op kinds %d and %d are both '%s'", j,
                  k, name);
        CHECK(strlen(info->inputs) <= TG_OP_MAX_IN && strlen(info->outputs) <= TG_OP_MAX_OUT &&
                  only_chars(info->inputs, "FfSsIiUAa-") && only_chars(info->outputs, "FfSsIiUAa-"),
              "%s: slot signatures '%s' -> '%s'", name, info->inputs, info->outputs);
        CHECK(strlen(info->outputs) >= 1 && strlen(info->contract) == strlen(info->outputs) &&
                  only_chars(info->contract, "=+"),
              "%s: contract '%s' for outputs '%s'", name, info->contract, info->outputs);
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            int want = s < (int)strlen(info->contract) && info->contract[s] == '+' ? TG_ACCUMULATE : TG_WRITE;
            CHECK(tg_op_out_contract(k, s) == want, "%s: out[%d] contract %d, row says '%s'", name, s,
                  tg_op_out_contract(k, s), info->contract);
        }
        tg_op_params p;
        memset(&p, 0, sizeof p);
        seen_params seen;
        visit_params(k, &p, &seen);
        CHECK(seen.n == info->n_params, "%s: %d parameters visited, the row says %d", name, seen.n, info->n_params);
        CHECK(tg_cpu_op_has_kernel(k), "%s has no CPU reference kernel", name);
    }
    CHECK(!tg_op_info_of(-1) && !tg_op_info_of(TG_OP_COUNT), "kinds outside the enum have a row");
    CHECK(!strcmp(tg_op_name(TG_OP_ATTENTION), "attention") && !strcmp(tg_op_name(TG_OP_ATTENTION_BWD), "attention_bwd") &&
              !strcmp(tg_op_name(TG_OP_MATMUL), "matmul"),
          "op names");
    /* The gradient contract where it is not plain overwriting. */
    CHECK(tg_op_out_contract(TG_OP_EMBEDDING_BWD, 0) == TG_ACCUMULATE && tg_op_out_contract(TG_OP_BIAS_GRAD, 0) == TG_ACCUMULATE &&
              tg_op_out_contract(TG_OP_LAYERNORM_BWD, 0) == TG_WRITE &&
              tg_op_out_contract(TG_OP_LAYERNORM_BWD, 1) == TG_ACCUMULATE &&
              tg_op_out_contract(TG_OP_LAYERNORM_BWD, 2) == TG_ACCUMULATE &&
              tg_op_out_contract(TG_OP_RESIDUAL_LAYERNORM_BWD, 1) == TG_WRITE &&
              tg_op_out_contract(TG_OP_RESIDUAL_LAYERNORM_BWD, 3) == TG_ACCUMULATE,
          "accumulated outputs");
    for (int s = 0; s < TG_OP_MAX_OUT; s++)
        CHECK(tg_op_out_contract(TG_OP_MATMUL, s) == TG_WRITE && tg_op_out_contract(TG_OP_ADAMW, s) == TG_WRITE,
              "matmul or adamw out[%d] accumulates", s);
    CHECK(tg_cpu_op_has_kernel(TG_OP_COUNT) == 0 && tg_cpu_op_has_kernel(-1) == 0, "a kernel outside the enum");
}

/* ---- the parameter walk ------------------------------------------------------------ */

/* The fields of each set, in ops.def order, with the addresses they must have: the list
 * expanded here on its own, so a walk that skips, repeats or reorders a field shows. */
typedef struct want_param {
    const char *display;
    void *addr;
    int is_float;
} want_param;

static int want_none(tg_op_params *p, want_param *w) { return 0; }
#define TG_I(field, display) w[n++] = (want_param){display, &s->field, 0};
#define TG_F(field, display) w[n++] = (want_param){display, &s->field, 1};
#define TG_PARAMS(set, fields)                                                                                         \
    static int want_##set(tg_op_params *p, want_param *w) {                                                            \
        tg_##set##_params *s = &p->set;                                                                                \
        int n = 0;                                                                                                     \
        fields return n;                                                                                               \
    }
#include "plan/ops.def"
#undef TG_I
#undef TG_F

static int (*const want_of[TG_OP_COUNT])(tg_op_params *, want_param *) = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) [TG_OP_##KIND] = want_##set,
#include "plan/ops.def"
};

/* Every kind counts its profiled time in one group: the products in matmul, the collectives
 * in communication, the update and its bookkeeping in optimizer, and so on; outside the
 * enum, memory; each group has its own name. */
TG_TEST(test_op_meta_groups) {
    static const struct {
        int kind, group;
    } want[] = {{TG_OP_MATMUL, TG_GROUP_MATMUL},           {TG_OP_ATTENTION_BWD, TG_GROUP_ATTENTION},
                {TG_OP_ATTN_SOFTMAX, TG_GROUP_ATTENTION},  {TG_OP_RESIDUAL_LAYERNORM_BWD, TG_GROUP_NORM},
                {TG_OP_GELU, TG_GROUP_NORM},               {TG_OP_BIAS_GRAD, TG_GROUP_NORM},
                {TG_OP_EMBEDDING_BWD, TG_GROUP_EMBEDDING}, {TG_OP_CROSS_ENTROPY_BWD, TG_GROUP_LOSS},
                {TG_OP_SPAN_LOSS, TG_GROUP_LOSS},          {TG_OP_ADAMW, TG_GROUP_OPTIMIZER},
                {TG_OP_GRAD_NORM, TG_GROUP_OPTIMIZER},     {TG_OP_LOSS_SCALE_UPDATE, TG_GROUP_OPTIMIZER},
                {TG_OP_ZERO, TG_GROUP_MEMORY},             {TG_OP_SELECT_TOKEN, TG_GROUP_MEMORY},
                {TG_OP_ALL_REDUCE, TG_GROUP_COMM},         {TG_OP_ALL_GATHER, TG_GROUP_COMM}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        CHECK(tg_op_group_of(want[k].kind) == want[k].group, "%s: group %d, want %d", tg_op_name(want[k].kind),
              tg_op_group_of(want[k].kind), want[k].group);
    int used[TG_GROUP_COUNT] = {0};
    for (int k = 0; k < TG_OP_COUNT; k++) {
        const int g = tg_op_group_of(k);
        if (CHECK(g >= 0 && g < TG_GROUP_COUNT, "%s: group %d", tg_op_name(k), g)) used[g]++;
    }
    for (int g = 0; g < TG_GROUP_COUNT; g++) {
        CHECK(used[g] > 0 && strcmp(tg_op_group_name(g), "?"), "group %d (%s) has %d kinds", g, tg_op_group_name(g),
              used[g]);
        for (int h = 0; h < g; h++)
            CHECK(strcmp(tg_op_group_name(g), tg_op_group_name(h)), "groups %d and %d share a name", g, h);
    }
    CHECK(tg_op_group_of(-1) == TG_GROUP_MEMORY && tg_op_group_of(TG_OP_COUNT) == TG_GROUP_MEMORY &&
              !strcmp(tg_op_group_name(-1), "?") && !strcmp(tg_op_group_name(TG_GROUP_COUNT), "?"),
          "outside the enums");
}

TG_TEST(test_op_meta_params_visit) {
    for (int k = 0; k < TG_OP_COUNT; k++) {
        const char *name = tg_op_name(k);
        tg_op_params p;
        memset(&p, 0, sizeof p);
        want_param want[MAX_SEEN];
        int n = want_of[k](&p, want);
        seen_params seen;
        visit_params(k, &p, &seen);
        if (!CHECK(seen.n == n, "%s: %d parameters visited, its set has %d", name, seen.n, n)) continue;
        for (int j = 0; j < n; j++)
            CHECK(seen.addr[j] == want[j].addr && seen.is_float[j] == want[j].is_float &&
                      !strcmp(seen.display[j], want[j].display),
                  "%s: parameter %d visited as '%s' (%s), want '%s' (%s) at its field", name, j, seen.display[j],
                  seen.is_float[j] ? "float" : "int64", want[j].display, want[j].is_float ? "float" : "int64");
    }

    /* MATMUL's ten, spelled out, with values written through the visitor landing in the
     * typed fields. */
    static const char *const mm_names[10] = {"M", "N", "K", "transA", "transB", "batch", "accumulate", "bias_grad",
                                             "activation", "alpha"};
    tg_op_params p;
    memset(&p, 0, sizeof p);
    seen_params seen;
    visit_params(TG_OP_MATMUL, &p, &seen);
    REQUIRE(seen.n == 10, "matmul: %d parameters visited", seen.n);
    for (int j = 0; j < 10; j++) {
        CHECK(!strcmp(seen.display[j], mm_names[j]) && seen.is_float[j] == (j == 9), "matmul parameter %d is '%s'", j,
              seen.display[j]);
        if (seen.is_float[j])
            *(float *)seen.addr[j] = 0.5f;
        else
            *(int64_t *)seen.addr[j] = 100 + j;
    }
    const tg_matmul_params *mm = &p.matmul;
    CHECK(mm->m == 100 && mm->n == 101 && mm->k == 102 && mm->trans_a == 103 && mm->trans_b == 104 && mm->batch == 105 &&
              mm->accumulate == 106 && mm->bias_grad == 107 && mm->activation == 108 && mm->alpha == 0.5f,
          "matmul: values written through the visitor are not in their fields");
    /* A kind without parameters, and one outside the enum, visit nothing. */
    visit_params(TG_OP_ZERO, &p, &seen);
    CHECK(seen.n == 0, "zero: %d parameters visited", seen.n);
    visit_params(TG_OP_COUNT, &p, &seen);
    CHECK(seen.n == 0, "kind TG_OP_COUNT: %d parameters visited", seen.n);
}

/* ---- tg_op_check ------------------------------------------------------------------- */

enum { T_A, T_B, T_BIAS, T_C, T_IDS, T_IDS_BF16, T_TABLE, T_ROWS, T_BIAS4, T_C_BF16, T_BIAS_BF16, N_T };

static void set_tensor(tg_tensor *t, const char *name, int dtype, int64_t d0, int64_t d1) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->pool = TG_POOL_ACTIVATIONS;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->bytes = (uint64_t)(d0 * (d1 ? d1 : 1)) * (dtype == TG_BF16 ? 2 : 4);
    t->grad = t->master = t->group = -1;
    t->first_use = t->last_use = -1;
}

static void check_tensors(tg_tensor *t) {
    set_tensor(&t[T_A], "a", TG_F32, 4, 3);
    set_tensor(&t[T_B], "b", TG_F32, 3, 5);
    set_tensor(&t[T_BIAS], "bias", TG_F32, 5, 0);
    set_tensor(&t[T_C], "c", TG_F32, 4, 5);
    set_tensor(&t[T_IDS], "ids", TG_I32, 6, 0);
    set_tensor(&t[T_IDS_BF16], "ids_bf16", TG_BF16, 6, 0);
    set_tensor(&t[T_TABLE], "table", TG_F32, 10, 3);
    set_tensor(&t[T_ROWS], "rows", TG_F32, 6, 3);
    set_tensor(&t[T_BIAS4], "bias4", TG_F32, 4, 0);
    set_tensor(&t[T_C_BF16], "c_bf16", TG_BF16, 4, 5);
    set_tensor(&t[T_BIAS_BF16], "bias_bf16", TG_BF16, 5, 0);
}

/* C[4,5] = A[4,3] @ B[3,5] + bias[5]. */
static tg_op good_matmul(void) {
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.in[0] = T_A, op.in[1] = T_B, op.in[2] = T_BIAS, op.out[0] = T_C;
    op.p.matmul = (tg_matmul_params){.m = 4, .n = 5, .k = 3, .batch = 1, .alpha = 1.0f};
    return op;
}

/* 1 when tg_op_check refuses op and the reason names `slot` ("in[2]"). */
static int refused_naming(const tg_op_check_ctx *c, const tg_op *op, const char *slot, char *why, size_t why_len) {
    why[0] = 0;
    return tg_op_check(c, op, why, why_len) == -1 && why[0] && (!slot || strstr(why, slot));
}

TG_TEST(test_op_meta_check) {
    tg_tensor t[N_T];
    check_tensors(t);
    tg_op_check_ctx c = {.tensors = t, .n_tensors = N_T, .replicas = 1};
    char why[256];

    tg_op op = good_matmul();
    CHECK(tg_op_check(&c, &op, why, sizeof why) == 0, "a consistent matmul refused: %s", why);
    op.in[2] = -1; /* the bias is optional */
    CHECK(tg_op_check(&c, &op, why, sizeof why) == 0, "a matmul without bias refused: %s", why);
    op.out[0] = T_C_BF16; /* F: f32 or bf16 */
    CHECK(tg_op_check(&c, &op, why, sizeof why) == 0, "a matmul writing bf16 refused: %s", why);

    /* A missing required input. */
    op = good_matmul();
    op.in[1] = -1;
    CHECK(refused_naming(&c, &op, "in[1]", why, sizeof why), "matmul without B: '%s'", why);
    op = good_matmul();
    op.out[0] = -1;
    CHECK(refused_naming(&c, &op, "out[0]", why, sizeof why), "matmul without C: '%s'", why);
    /* A slot the signature leaves unused. */
    op = good_matmul();
    op.in[4] = T_A;
    CHECK(refused_naming(&c, &op, "in[4]", why, sizeof why), "matmul reading in[4]: '%s'", why);
    op = good_matmul();
    op.out[3] = T_C;
    CHECK(refused_naming(&c, &op, "out[3]", why, sizeof why), "matmul writing out[3]: '%s'", why);
    /* An index outside the table, past its end or below -1. */
    op = good_matmul();
    op.in[0] = N_T;
    CHECK(refused_naming(&c, &op, "in[0]", why, sizeof why), "matmul reading tensor %d of %d: '%s'", N_T, N_T, why);
    op = good_matmul();
    op.out[0] = -2;
    CHECK(refused_naming(&c, &op, "out[0]", why, sizeof why), "matmul writing tensor -2: '%s'", why);
    /* A shape rule: the bias must hold N elements. */
    op = good_matmul();
    op.in[2] = T_BIAS4;
    CHECK(refused_naming(&c, &op, "in[2]", why, sizeof why), "matmul with a bias of 4 for N = 5: '%s'", why);
    op = good_matmul();
    op.p.matmul.k = 4;
    CHECK(refused_naming(&c, &op, NULL, why, sizeof why), "matmul with K = 4 over A[4,3]: '%s'", why);

    /* Dtypes: ids are i32 (I), a bias gradient f32 (S). */
    op = tg_test_op(TG_OP_EMBEDDING);
    op.in[0] = T_IDS, op.in[1] = T_TABLE, op.out[0] = T_ROWS;
    op.p.embedding = (tg_embedding_params){.n = 6, .vocab = 10, .dim = 3, .padding_idx = -1};
    CHECK(tg_op_check(&c, &op, why, sizeof why) == 0, "a consistent embedding refused: %s", why);
    op.in[0] = T_IDS_BF16;
    CHECK(refused_naming(&c, &op, "in[0]", why, sizeof why), "embedding with bf16 ids: '%s'", why);
    op.in[0] = T_IDS;
    op.in[2] = T_BIAS;
    CHECK(refused_naming(&c, &op, "in[2]", why, sizeof why), "embedding reading in[2]: '%s'", why);
    op = tg_test_op(TG_OP_BIAS_GRAD);
    op.in[0] = T_C, op.out[0] = T_BIAS;
    op.p.bias_grad = (tg_bias_grad_params){.m = 4, .n = 5};
    CHECK(tg_op_check(&c, &op, why, sizeof why) == 0, "a consistent bias_grad refused: %s", why);
    op.out[0] = T_BIAS_BF16;
    CHECK(refused_naming(&c, &op, "out[0]", why, sizeof why), "bias_grad into bf16: '%s'", why);

    /* The replica count: ALL_GATHER's tensor is the replicas' slices. */
    op = tg_test_op(TG_OP_ALL_GATHER);
    op.in[0] = op.out[0] = T_C;
    op.p.all_gather.slice = 10;
    c.replicas = 2;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == 0, "all_gather of 2 slices of 10 refused: %s", why);
    c.replicas = 3;
    CHECK(refused_naming(&c, &op, NULL, why, sizeof why), "all_gather of 20 elements as 3 slices of 10: '%s'", why);
    c.replicas = 1;

    /* Kinds outside the enum. */
    op = good_matmul();
    op.kind = TG_OP_COUNT;
    CHECK(refused_naming(&c, &op, NULL, why, sizeof why), "kind TG_OP_COUNT accepted");
    op.kind = -1;
    CHECK(refused_naming(&c, &op, NULL, why, sizeof why), "kind -1 accepted");

    /* The reason fits the buffer it is given. */
    char small[16];
    memset(small, 'Z', sizeof small);
    op = good_matmul();
    op.in[1] = -1;
    CHECK(tg_op_check(&c, &op, small, 8) == -1 && memchr(small, 0, 8) && small[8] == 'Z' && small[15] == 'Z',
          "the reason overran an 8-byte buffer");
}

/* Parameters from a plan file may hold anything: a product of them that overflows int64
 * is refused by name (the rules compute it checked; under UBSan an unchecked one would
 * stop the suite), and so is a negative dimension whose products come out right. */
TG_TEST(test_op_meta_check_untrusted_params) {
    tg_tensor t[N_T];
    check_tensors(t);
    tg_op_check_ctx c = {.tensors = t, .n_tensors = N_T, .replicas = 1};
    char why[256];

    /* The fuzzed plan that overflowed batch*M*K: 288230376151711745 * 768 * ... */
    tg_op op = good_matmul();
    op.p.matmul.batch = 288230376151711745;
    op.p.matmul.k = 768;
    CHECK(refused_naming(&c, &op, "batch*M*K overflows", why, sizeof why), "matmul batch 2^58+1: '%s'", why);
    op = good_matmul();
    op.p.matmul.m = INT64_MAX, op.p.matmul.k = INT64_MAX;
    CHECK(refused_naming(&c, &op, "overflows", why, sizeof why), "matmul M = K = INT64_MAX: '%s'", why);
    op = good_matmul();
    op.p.matmul.activation = TG_MATMUL_ACT_GELU, op.out[2] = T_C;
    op.p.matmul.m = INT64_MAX / 2, op.p.matmul.n = INT64_MAX / 2;
    CHECK(refused_naming(&c, &op, "overflows", why, sizeof why), "matmul M*N past int64: '%s'", why);

    /* Two negative dimensions whose product is the table's size. */
    op = tg_test_op(TG_OP_EMBEDDING);
    op.in[0] = T_IDS, op.in[1] = T_TABLE, op.out[0] = T_ROWS;
    op.p.embedding = (tg_embedding_params){.n = 6, .vocab = -10, .dim = -3, .padding_idx = -1};
    CHECK(refused_naming(&c, &op, "V is negative", why, sizeof why), "embedding V = -10, D = -3: '%s'", why);
    op.p.embedding = (tg_embedding_params){.n = 6, .vocab = 10, .dim = 3, .padding_idx = -1};
    op.p.embedding.n = (int64_t)1 << 62, op.p.embedding.dim = 4;
    CHECK(refused_naming(&c, &op, "N*D overflows", why, sizeof why), "embedding N*D past int64: '%s'", why);

    /* Every rule with products, at INT64_MAX in each of its dimensions: refused, never
     * computed past int64. */
    static const int kinds[] = {TG_OP_BIAS_GRAD, TG_OP_LAYERNORM, TG_OP_LAYERNORM_BWD, TG_OP_ATTN_SOFTMAX,
                                TG_OP_ATTN_SOFTMAX_BWD, TG_OP_HEADS_SPLIT, TG_OP_HEADS_MERGE, TG_OP_SELECT_TOKEN,
                                TG_OP_SELECT_TOKEN_BWD, TG_OP_CROSS_ENTROPY, TG_OP_CROSS_ENTROPY_BWD,
                                TG_OP_RESIDUAL_LAYERNORM, TG_OP_ATTENTION, TG_OP_ATTENTION_BWD, TG_OP_SPAN_LOSS,
                                TG_OP_SPAN_LOSS_BWD, TG_OP_RMSNORM, TG_OP_RMSNORM_BWD, TG_OP_ROPE, TG_OP_ROPE_BWD,
                                TG_OP_SWIGLU, TG_OP_SWIGLU_BWD};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        op = tg_test_op(kinds[k]);
        const tg_op_info *info = tg_op_info_of(kinds[k]);
        /* Every slot its signature requires holds a tensor of the required dtype. */
        for (int s = 0; s < TG_OP_MAX_IN && info->inputs[s]; s++)
            if (info->inputs[s] >= 'A' && info->inputs[s] <= 'Z') op.in[s] = info->inputs[s] == 'I' ? T_IDS : T_C;
        for (int s = 0; s < TG_OP_MAX_OUT && info->outputs[s]; s++)
            if (info->outputs[s] >= 'A' && info->outputs[s] <= 'Z') op.out[s] = T_C;
        /* Each parameter set's integer fields, all at INT64_MAX. */
        int64_t all[sizeof op.p / sizeof(int64_t)];
        for (size_t w = 0; w < sizeof all / sizeof all[0]; w++) all[w] = INT64_MAX;
        memcpy(&op.p, all, sizeof all);
        if (kinds[k] == TG_OP_HEADS_SPLIT || kinds[k] == TG_OP_HEADS_MERGE) op.p.heads.parts = 1;
        if (kinds[k] == TG_OP_RESIDUAL_LAYERNORM) op.p.residual_layernorm.p = 0.0f;
        if (kinds[k] == TG_OP_ATTENTION || kinds[k] == TG_OP_ATTENTION_BWD) op.p.attention.packed = 0, op.p.attention.p = 0.0f;
        /* The rotary rule's conditions met (an even Dh, a known rope, theta above 1), so the
         * sizes H + 2 Hkv and 3H are what is left to refuse. */
        if (kinds[k] == TG_OP_ROPE || kinds[k] == TG_OP_ROPE_BWD)
            op.p.rope.head_dim = 2, op.p.rope.type = TG_ROPE_DEFAULT, op.p.rope.theta = 1e4f;
        CHECK(refused_naming(&c, &op, "overflows", why, sizeof why), "%s with every dimension INT64_MAX: '%s'",
              tg_op_name(kinds[k]), why);
    }

    /* The loss's classes lie inside a row of C. */
    op = tg_test_op(TG_OP_CROSS_ENTROPY);
    op.in[0] = T_C, op.in[1] = T_IDS, op.out[0] = T_BIAS4;
    op.p.cross_entropy = (tg_cross_entropy_params){.n = 4, .c = 5, .classes = 6};
    CHECK(refused_naming(&c, &op, "classes", why, sizeof why), "cross_entropy with 6 classes of 5 columns: '%s'", why);

    /* The span loss reads [B*T, 2] logits and [B, 2] positions (T_C holds 20, T_IDS 6). */
    op = tg_test_op(TG_OP_SPAN_LOSS);
    op.in[0] = T_C, op.in[1] = T_IDS, op.out[0] = T_BIAS4;
    op.p.span_loss = (tg_span_loss_params){.b = 2, .t = 5};
    CHECK(refused_naming(&c, &op, "in[1]: positions != B*2", why, sizeof why), "span_loss B 2 with 6 positions: '%s'",
          why);
    op.p.span_loss = (tg_span_loss_params){.b = 3, .t = 4};
    CHECK(refused_naming(&c, &op, "in[0]: logits != B*T*2", why, sizeof why), "span_loss B 3 T 4 over 20: '%s'", why);
    op.p.span_loss = (tg_span_loss_params){.b = -3, .t = 4};
    CHECK(refused_naming(&c, &op, "B is negative", why, sizeof why), "span_loss B -3: '%s'", why);

    /* The replicas' slices: slice * replicas past int64. */
    op = tg_test_op(TG_OP_ALL_GATHER);
    op.in[0] = op.out[0] = T_C;
    op.p.all_gather.slice = INT64_MAX / 2;
    c.replicas = 3;
    CHECK(refused_naming(&c, &op, "slice*replicas overflows", why, sizeof why), "all_gather slice 2^62 x 3: '%s'", why);
    c.replicas = 1;

    /* FLOPs of parameters no rule accepts are still computed without overflow. */
    op = good_matmul();
    op.p.matmul.m = op.p.matmul.n = op.p.matmul.batch = INT64_MAX;
    op.p.matmul.activation = TG_MATMUL_ACT_GELU;
    CHECK(tg_op_flops(&op) > 1e50, "matmul FLOPs at INT64_MAX: %g", tg_op_flops(&op));
}

/* ---- FLOPs ------------------------------------------------------------------------- */

/* The counts the compiler has always used (plans' flops_per_step depend on them). */
TG_TEST(test_op_meta_flops) {
    tg_op op = good_matmul(); /* 2*M*N*K + the bias add */
    CHECK(tg_op_flops(&op) == 2.0 * 4 * 5 * 3 + 4 * 5, "matmul with bias: %g", tg_op_flops(&op));
    op.in[2] = -1;
    op.p.matmul.batch = 3;
    CHECK(tg_op_flops(&op) == 2.0 * 4 * 5 * 3 * 3, "batched matmul: %g", tg_op_flops(&op));
    op.p.matmul.batch = 1;
    op.p.matmul.bias_grad = 1; /* + K*M sums */
    CHECK(tg_op_flops(&op) == 2.0 * 4 * 5 * 3 + 3 * 4, "matmul with bias_grad 1: %g", tg_op_flops(&op));
    op.p.matmul.bias_grad = 2; /* + K*N sums */
    CHECK(tg_op_flops(&op) == 2.0 * 4 * 5 * 3 + 3 * 5, "matmul with bias_grad 2: %g", tg_op_flops(&op));
    op.p.matmul.bias_grad = 0;
    op.p.matmul.activation = TG_MATMUL_ACT_GELU; /* + GELU's 10 per element */
    CHECK(tg_op_flops(&op) == 2.0 * 4 * 5 * 3 + 10.0 * 4 * 5, "matmul with GELU: %g", tg_op_flops(&op));

    op = tg_test_op(TG_OP_GELU_BWD);
    op.p.gelu_bwd = (tg_gelu_bwd_params){.n = 20, .form = TG_GELU_TANH, .bias_cols = 5};
    CHECK(tg_op_flops(&op) == 10.0 * 20 + 20, "gelu_bwd with its bias gradient: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_TANH);
    op.p.count.n = 7;
    CHECK(tg_op_flops(&op) == 70.0, "tanh: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_ADD);
    op.p.count.n = 7;
    CHECK(tg_op_flops(&op) == 7.0, "add: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_LAYERNORM_BWD);
    op.p.layernorm_bwd = (tg_layernorm_bwd_params){.m = 4, .d = 6, .overwrite = 1};
    CHECK(tg_op_flops(&op) == 12.0 * 24, "layernorm_bwd: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_RESIDUAL_LAYERNORM_BWD);
    op.in[5] = T_C; /* ds_extra: + 1 per element; p > 0: + 1 */
    op.p.residual_layernorm_bwd = (tg_residual_layernorm_bwd_params){.m = 4, .d = 6, .eps = 1e-5f, .p = 0.1f};
    CHECK(tg_op_flops(&op) == 14.0 * 24, "residual_layernorm_bwd: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_ATTN_SOFTMAX);
    op.out[1] = T_C; /* the dropped probabilities with p > 0: + 1 per element */
    op.p.softmax = (tg_softmax_params){.b = 2, .h = 3, .t = 4, .scale = 1.0f, .p = 0.1f};
    CHECK(tg_op_flops(&op) == 6.0 * 2 * 3 * 4 * 4, "attn_softmax with dropout: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_ATTENTION_BWD);
    op.p.attention = (tg_attention_params){.b = 2, .h = 3, .t = 4, .causal = 1, .head_dim = 8, .scale = 1.0f};
    CHECK(tg_op_flops(&op) == 2.0 * 0.5 * 4.0 * 2 * 3 * 4 * 4 * 8, "causal attention_bwd: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_ADAMW);
    op.p.adamw.n = 9;
    CHECK(tg_op_flops(&op) == 16.0 * 9, "adamw: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_HEADS_SPLIT);
    op.p.heads = (tg_heads_params){.b = 2, .t = 4, .h = 3, .head_dim = 8, .parts = 3};
    CHECK(tg_op_flops(&op) == 0.0, "heads_split: %g", tg_op_flops(&op));
    op = tg_test_op(TG_OP_SPAN_LOSS_BWD);
    op.p.span_loss = (tg_span_loss_params){.b = 3, .t = 5};
    CHECK(tg_op_flops(&op) == 8.0 * 15, "span_loss_bwd: %g", tg_op_flops(&op));

    /* A kind outside the enum (a corrupt plan's) has no formula: 0 FLOPs, no table read. */
    const int outside[] = {-1, INT32_MIN, TG_OP_COUNT, TG_OP_COUNT + 1, INT32_MAX};
    for (size_t k = 0; k < sizeof outside / sizeof outside[0]; k++) {
        op.kind = outside[k];
        CHECK(tg_op_flops(&op) == 0.0, "kind %d: %g FLOPs", outside[k], tg_op_flops(&op));
    }
}
