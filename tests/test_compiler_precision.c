/* Storage precision on hand-built graphs (compiler/precision.c): the bf16 copies of the
 * parameters, the refusal of a precision without storage rules, and a graph that failed
 * before. */
#include <string.h>

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

    if (!small_init(&h, "w")) return;
    CHECK(tg_apply_precision(&h.g, TG_PREC_FP16) == -1 &&
              !strcmp(h.err.msg, "internal compiler error: precision 2 has no storage rules"),
          "fp16: %s", h.err.msg);
    /* The graph has failed: a second call changes nothing. */
    CHECK(tg_apply_precision(&h.g, TG_PREC_BF16) == -1 &&
              !strcmp(h.err.msg, "internal compiler error: precision 2 has no storage rules"),
          "after a failure: %s", h.err.msg);
    tg_graph_free(&h.g);
}
