/* Storage precision on hand-built graphs (compiler/precision.c): the bf16 copies of the
 * parameters, the refusal of a precision without storage rules, a graph that failed
 * before, and the copies' tensor table failing to grow. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "compiler/precision.h"
#include "models/model_config.h"
#include "tests/harness.h"

typedef struct small_graph {
    tg_model_config cfg;
    tg_job job;
    tg_graph g;
    tg_err err;
    int w, x;
} small_graph;

/* One parameter named `name` [4, 8] and an input. */
static int small_init(small_graph *h, const char *name) {
    memset(h, 0, sizeof *h);
    if (!CHECK(tg_model_config_load("tiny-bert", &h->cfg, &h->err) == 0, "%s", h->err.msg)) return 0;
    tg_job_defaults(&h->job);
    tg_graph_init(&h->g, &h->cfg, &h->job, &h->err);
    int64_t xs[2] = {4, 8};
    h->x = tg_graph_tensor(&h->g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    h->w = tg_param(&h->g, name, 2, 4, 8, TG_INIT_NORMAL, 0);
    return CHECK(!h->g.failed && tg_plan_param_layout(&h->g) == 0, "%s", h->err.msg);
}

static int tensor_named(const tg_graph *g, const char *name) {
    for (int t = 0; t < g->n_tensors; t++)
        if (!strcmp(g->tensors[t].name, name)) return t;
    return -1;
}

TG_TEST(test_precision_parameter_copies_and_refusals) {
    small_graph h;
    if (!small_init(&h, "w")) return;
    CHECK(tg_apply_precision(&h.g, TG_PREC_FP32) == 0 && tensor_named(&h.g, "bf16.w") < 0, "fp32 makes no copies");
    REQUIRE(tg_apply_precision(&h.g, TG_PREC_BF16) == 0, "%s", h.err.msg);
    int c = tensor_named(&h.g, "bf16.w");
    CHECK(c >= 0 && h.g.tensors[c].dtype == TG_BF16 && h.g.tensors[c].master == h.w &&
              h.g.tensors[c].pool == TG_POOL_PARAMS_BF16 && h.g.io.params_bf16_all >= 0,
          "the bf16 copy of w: %d", c);
    tg_graph_free(&h.g);

    /* fp16: the same rules with half copies, named after the format. */
    if (!small_init(&h, "w")) return;
    REQUIRE(tg_apply_precision(&h.g, TG_PREC_FP16) == 0, "%s", h.err.msg);
    c = tensor_named(&h.g, "f16.w");
    CHECK(c >= 0 && h.g.tensors[c].dtype == TG_F16 && h.g.tensors[c].master == h.w &&
              h.g.tensors[c].pool == TG_POOL_PARAMS_BF16 && tensor_named(&h.g, "bf16.w") < 0 &&
              !strcmp(h.g.tensors[h.g.io.params_bf16_all].name, "params_f16.all") &&
              h.g.tensors[h.g.io.params_bf16_all].dtype == TG_F16,
          "the fp16 copy of w: %d", c);
    tg_graph_free(&h.g);

    if (!small_init(&h, "w")) return;
    CHECK(tg_apply_precision(&h.g, TG_PREC_COUNT) == -1 &&
              !strcmp(h.err.msg, "internal compiler error: precision 3 has no storage rules"),
          "an unknown precision: %s", h.err.msg);
    /* The graph has failed: a second call changes nothing. */
    CHECK(tg_apply_precision(&h.g, TG_PREC_BF16) == -1 &&
              !strcmp(h.err.msg, "internal compiler error: precision 3 has no storage rules"),
          "after a failure: %s", h.err.msg);
    tg_graph_free(&h.g);
}

TG_TEST(test_precision_copy_out_of_memory) {
    /* The tensor table full to its capacity, so the first bf16 copy grows it; that growth
     * failing fails the pass with the graph's out-of-memory message. */
    small_graph h;
    if (!small_init(&h, "w")) return;
    char name[32];
    for (int i = 0; h.g.n_tensors < h.g.cap_tensors; i++) {
        snprintf(name, sizeof name, "filler%d", i);
        REQUIRE(tg_act(&h.g, name, 1, 2, 0, 0, 0) >= 0, "%s", h.err.msg);
    }
    const int n = h.g.n_tensors;
    tg_alloc_fail_after(1); /* the pass's own table of copies, then the growth */
    int rc = tg_apply_precision(&h.g, TG_PREC_BF16);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && strstr(h.err.msg, "out of memory") && h.g.n_tensors == n, "rc %d, %d tensors: %s", rc,
          h.g.n_tensors, h.err.msg);
    tg_graph_free(&h.g);
}

TG_TEST(test_precision_frozen_copy_out_of_memory) {
    /* A frozen table read by an embedding (fp32) and by a matmul gets a bf16 copy in the
     * frozen pool; with the tensor table full when that copy is made, its growth failing
     * fails the pass. Tensors made before it: the copy of w and params_bf16.all. */
    const int64_t N = 4, V = 10, D = 6;
    for (int fail = 0; fail < 2; fail++) {
        small_graph h;
        memset(&h, 0, sizeof h);
        REQUIRE(tg_model_config_load("tiny-bert", &h.cfg, &h.err) == 0, "%s", h.err.msg);
        tg_job_defaults(&h.job);
        snprintf(h.job.freeze, sizeof h.job.freeze, "tab");
        tg_graph_init(&h.g, &h.cfg, &h.job, &h.err);
        int64_t ids_shape[1] = {N}, xs[2] = {N, V};
        int ids = tg_graph_tensor(&h.g, "ids", TG_I32, TG_POOL_INPUTS, 1, ids_shape);
        int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
        int tab = tg_param(&h.g, "tab", 2, V, D, TG_INIT_NORMAL, 0);
        tg_param(&h.g, "w", 2, D, D, TG_INIT_NORMAL, 0); /* trainable: its copy comes first */
        int rows = tg_act(&h.g, "rows", 2, N, D, 0, 0), prod = tg_act(&h.g, "prod", 2, N, D, 0, 0);
        tg_op_spec s = tg_spec(TG_OP_EMBEDDING);
        s.in[0] = ids, s.in[1] = tab, s.out[0] = rows;
        s.p.embedding = (tg_embedding_params){.n = N, .vocab = V, .dim = D, .padding_idx = -1};
        tg_graph_op(&h.g, &s);
        s = tg_spec(TG_OP_MATMUL);
        s.in[0] = x, s.in[1] = tab, s.out[0] = prod;
        s.p.matmul = (tg_matmul_params){.m = N, .n = D, .k = V, .batch = 1, .alpha = 1.0f};
        tg_graph_op(&h.g, &s);
        REQUIRE(!h.g.failed && h.g.tensors[tab].pool == TG_POOL_FROZEN && tg_plan_param_layout(&h.g) == 0, "%s",
                h.err.msg);
        char name[32];
        for (int i = 0; h.g.n_tensors < h.g.cap_tensors - 2; i++) {
            snprintf(name, sizeof name, "filler%d", i);
            REQUIRE(tg_act(&h.g, name, 1, 2, 0, 0, 0) >= 0, "%s", h.err.msg);
        }
        /* The pass's table of parameter copies and frozen storage's three tables succeed. */
        if (fail) tg_alloc_fail_after(4);
        int rc = tg_apply_precision(&h.g, TG_PREC_BF16);
        tg_alloc_fail_after(-1);
        int copy = tensor_named(&h.g, "bf16.tab");
        if (fail) {
            CHECK(rc == -1 && strstr(h.err.msg, "out of memory") && copy < 0, "rc %d: %s", rc, h.err.msg);
        } else {
            CHECK(rc == 0 && copy >= 0 && h.g.tensors[copy].dtype == TG_BF16 && h.g.tensors[copy].master == tab &&
                      h.g.ops[1].in[1] == copy && h.g.ops[0].in[1] == tab,
                  "rc %d: the matmul reads the copy %d, the embedding the table: %s", rc, copy, h.err.msg);
        }
        tg_graph_free(&h.g);
    }
}

/* Frozen storage in a bf16 plan, every tensor's dtype after the pass: the first tensor a
 * frozen table that only a matmul reads (stored bf16, no copy), two frozen tables that an
 * embedding and a matmul read (each kept fp32 with a bf16 copy the matmul reads), and the
 * tensors that are not frozen: the int32 ids and fp32 input as they were, the trainable
 * weight fp32 with its copy in the bf16 parameter pool, the activations bf16. */
TG_TEST(test_precision_frozen_tables_and_the_rest) {
    const int64_t N = 4, V = 10, D = 6;
    small_graph h;
    memset(&h, 0, sizeof h);
    REQUIRE(tg_model_config_load("tiny-bert", &h.cfg, &h.err) == 0, "%s", h.err.msg);
    tg_job_defaults(&h.job);
    snprintf(h.job.freeze, sizeof h.job.freeze, "tab*");
    tg_graph_init(&h.g, &h.cfg, &h.job, &h.err);
    int64_t ids_shape[1] = {N}, xs[2] = {N, V};
    const int mm_only = tg_param(&h.g, "tab_mm", 2, V, D, TG_INIT_NORMAL, 0);
    const int ids = tg_graph_tensor(&h.g, "ids", TG_I32, TG_POOL_INPUTS, 1, ids_shape);
    const int x = tg_graph_tensor(&h.g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    const int tab[2] = {tg_param(&h.g, "tab_a", 2, V, D, TG_INIT_NORMAL, 0),
                        tg_param(&h.g, "tab_b", 2, V, D, TG_INIT_NORMAL, 0)};
    const int w = tg_param(&h.g, "w", 2, D, D, TG_INIT_NORMAL, 0);
    const int rows[2] = {tg_act(&h.g, "rows_a", 2, N, D, 0, 0), tg_act(&h.g, "rows_b", 2, N, D, 0, 0)};
    const int prod[2] = {tg_act(&h.g, "prod_a", 2, N, D, 0, 0), tg_act(&h.g, "prod_b", 2, N, D, 0, 0)};
    const int prod_mm = tg_act(&h.g, "prod_mm", 2, N, D, 0, 0), prod_w = tg_act(&h.g, "prod_w", 2, N, D, 0, 0);
    REQUIRE(mm_only == 0 && !h.g.failed, "tab_mm is tensor %d: %s", mm_only, h.err.msg);
    for (int i = 0; i < 2; i++) {
        tg_op_spec s = tg_spec(TG_OP_EMBEDDING); /* ops 0 and 2 */
        s.in[0] = ids, s.in[1] = tab[i], s.out[0] = rows[i];
        s.p.embedding = (tg_embedding_params){.n = N, .vocab = V, .dim = D, .padding_idx = -1};
        tg_graph_op(&h.g, &s);
        s = tg_spec(TG_OP_MATMUL); /* ops 1 and 3 */
        s.in[0] = x, s.in[1] = tab[i], s.out[0] = prod[i];
        s.p.matmul = (tg_matmul_params){.m = N, .n = D, .k = V, .batch = 1, .alpha = 1.0f};
        tg_graph_op(&h.g, &s);
    }
    tg_op_spec s = tg_spec(TG_OP_MATMUL); /* op 4 */
    s.in[0] = x, s.in[1] = mm_only, s.out[0] = prod_mm;
    s.p.matmul = (tg_matmul_params){.m = N, .n = D, .k = V, .batch = 1, .alpha = 1.0f};
    tg_graph_op(&h.g, &s);
    s.in[0] = rows[0], s.in[1] = w, s.out[0] = prod_w; /* op 5 */
    s.p.matmul = (tg_matmul_params){.m = N, .n = D, .k = D, .batch = 1, .alpha = 1.0f};
    tg_graph_op(&h.g, &s);
    REQUIRE(!h.g.failed && h.g.n_ops == 6 && tg_plan_param_layout(&h.g) == 0, "%s", h.err.msg);
    const int n0 = h.g.n_tensors;
    REQUIRE(tg_apply_precision(&h.g, TG_PREC_BF16) == 0, "%s", h.err.msg);

    const struct {
        int t, dtype, pool;
        uint64_t bytes;
    } want[] = {
        {mm_only, TG_BF16, TG_POOL_FROZEN, (uint64_t)(V * D * 2)},
        {ids, TG_I32, TG_POOL_INPUTS, (uint64_t)(N * 4)},
        {x, TG_F32, TG_POOL_INPUTS, (uint64_t)(N * V * 4)},
        {tab[0], TG_F32, TG_POOL_FROZEN, (uint64_t)(V * D * 4)},
        {tab[1], TG_F32, TG_POOL_FROZEN, (uint64_t)(V * D * 4)},
        {w, TG_F32, TG_POOL_PARAMS, (uint64_t)(D * D * 4)},
        {rows[0], TG_BF16, TG_POOL_ACTIVATIONS, (uint64_t)(N * D * 2)},
        {rows[1], TG_BF16, TG_POOL_ACTIVATIONS, (uint64_t)(N * D * 2)},
        {prod[0], TG_BF16, TG_POOL_ACTIVATIONS, (uint64_t)(N * D * 2)},
        {prod[1], TG_BF16, TG_POOL_ACTIVATIONS, (uint64_t)(N * D * 2)},
        {prod_mm, TG_BF16, TG_POOL_ACTIVATIONS, (uint64_t)(N * D * 2)},
        {prod_w, TG_BF16, TG_POOL_ACTIVATIONS, (uint64_t)(N * D * 2)},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const tg_tensor *t = &h.g.tensors[want[i].t];
        CHECK(t->dtype == want[i].dtype && t->pool == want[i].pool && t->bytes == want[i].bytes,
              "%s: dtype %d pool %d bytes %llu, expected %d %d %llu", t->name, t->dtype, t->pool,
              (unsigned long long)t->bytes, want[i].dtype, want[i].pool, (unsigned long long)want[i].bytes);
    }
    /* The tensors the pass added, in order: the trainable weight's copy, the copies' view,
     * then the two mixed tables' copies. */
    const char *added[] = {"bf16.w", "params_bf16.all", "bf16.tab_a", "bf16.tab_b"};
    REQUIRE(h.g.n_tensors == n0 + 4, "%d tensors added, expected 4", h.g.n_tensors - n0);
    for (int i = 0; i < 4; i++)
        CHECK(!strcmp(h.g.tensors[n0 + i].name, added[i]) && h.g.tensors[n0 + i].dtype == TG_BF16,
              "tensor %d is %s, expected %s", n0 + i, h.g.tensors[n0 + i].name, added[i]);
    CHECK(h.g.tensors[n0].master == w && h.g.tensors[n0].pool == TG_POOL_PARAMS_BF16, "the copy of w");
    for (int i = 0; i < 2; i++) {
        const tg_tensor *c = &h.g.tensors[n0 + 2 + i];
        CHECK(c->master == tab[i] && c->pool == TG_POOL_FROZEN &&
                  c->flags == (TG_TENSOR_FROZEN | TG_TENSOR_PARAM_COPY) && c->bytes == (uint64_t)(V * D * 2),
              "%s: master %d pool %d flags %#x", c->name, c->master, c->pool, (unsigned)c->flags);
        /* The embedding reads the fp32 table, the matmul its copy. */
        CHECK(h.g.ops[2 * i].in[1] == tab[i] && h.g.ops[2 * i + 1].in[1] == n0 + 2 + i, "ops of %s read %d and %d",
              c->name, h.g.ops[2 * i].in[1], h.g.ops[2 * i + 1].in[1]);
    }
    CHECK(h.g.ops[4].in[1] == mm_only && h.g.ops[5].in[1] == n0 && h.g.ops[5].in[0] == rows[0],
          "the matmuls read %d and %d", h.g.ops[4].in[1], h.g.ops[5].in[1]);
    tg_graph_free(&h.g);
}

/* The activations a bf16 plan keeps fp32, checked over whole compiled plans: the row
 * statistics (LayerNorm's mean and rstd, fused attention's LSE and its backward's delta),
 * the unfused attention's scores, and the scratch gradients of frozen LayerNorm parameters;
 * every other fp32 activation of more than one element is stored bf16. The jobs freeze
 * LayerNorm parameters so that the backward ops write scratch, and cover both LayerNorm
 * forms and both attention modes. */
static int kept_slot(const tg_op *op, int t) {
    switch (op->kind) {
    case TG_OP_LAYERNORM: return t == op->out[1] || t == op->out[2];
    case TG_OP_RESIDUAL_LAYERNORM: return t == op->out[2] || t == op->out[3];
    case TG_OP_ATTN_SOFTMAX: return t == op->in[0];
    case TG_OP_ATTENTION: return t == op->out[1];
    case TG_OP_LAYERNORM_BWD: return t == op->out[1] || t == op->out[2];
    case TG_OP_RESIDUAL_LAYERNORM_BWD: return t == op->out[2] || t == op->out[3];
    case TG_OP_ATTENTION_BWD: return t == op->out[3];
    case TG_OP_CROSS_ENTROPY: return t == op->out[1];
    default: return 0;
    }
}

TG_TEST(test_precision_kept_activations_of_compiled_plans) {
    static const struct {
        const char *extra;
        int kinds[4]; /* op kinds whose kept outputs must appear in activations */
    } jobs[] = {
        {"freeze = *LayerNorm*\n",
         {TG_OP_LAYERNORM, TG_OP_RESIDUAL_LAYERNORM_BWD, TG_OP_ATTENTION, TG_OP_ATTENTION_BWD}},
        {"freeze = *LayerNorm.weight\nattention = unfused\nfuse_residual_layernorm = false\n",
         {TG_OP_LAYERNORM, TG_OP_LAYERNORM_BWD, TG_OP_ATTN_SOFTMAX, TG_OP_LAYERNORM}},
        {"freeze = *LayerNorm.bias\n", {TG_OP_RESIDUAL_LAYERNORM, TG_OP_RESIDUAL_LAYERNORM_BWD, TG_OP_LAYERNORM_BWD,
                                        TG_OP_ATTENTION}},
    };
    for (size_t j = 0; j < sizeof jobs / sizeof *jobs; j++) {
        char text[512];
        snprintf(text, sizeof text, "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n"
                                    "precision = bf16\n%s", jobs[j].extra);
        tg_job job;
        tg_plan p;
        tg_err err = {{0}};
        REQUIRE(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0,
                "job %zu: %s", j, err.msg);
        int kept_by_kind[4] = {0}, bf16 = 0;
        for (int t = 0; t < p.n_tensors; t++) {
            const tg_tensor *x = &p.tensors[t];
            if (x->pool != TG_POOL_ACTIVATIONS || x->dtype == TG_I32) continue;
            int kept = 0;
            for (int o = 0; o < p.n_ops; o++)
                if (kept_slot(&p.ops[o], t)) {
                    kept = 1;
                    for (int k = 0; k < 4; k++) kept_by_kind[k] += p.ops[o].kind == jobs[j].kinds[k];
                }
            const int want = kept || tg_tensor_numel(x) <= 1 ? TG_F32 : TG_BF16;
            bf16 += want == TG_BF16;
            CHECK(x->dtype == want, "job %zu: activation %s is %s, want %s", j, x->name, tg_dtype_name(x->dtype),
                  tg_dtype_name(want));
        }
        CHECK(bf16 > 10, "job %zu: %d bf16 activations", j, bf16);
        for (int k = 0; k < 4; k++)
            CHECK(kept_by_kind[k] > 0, "job %zu: no fp32 activation kept for %s", j, tg_op_name(jobs[j].kinds[k]));
        tg_plan_free(&p);
    }
}
