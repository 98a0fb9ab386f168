/* The whole-step pools' layout (compiler/memory_plan.c) on a hand-built graph, offset by
 * offset: parameters in tensor order, each block's end rounded to twice the tensor
 * alignment; a packed group's members back to back where its first member is reached; room
 * for a table's wider view; views at their master's offset; the gradients in the same
 * layout; AdamW's m and v whole or as a ZeRO-1 slice; the frozen and buffer pools laid out
 * alike; and a pool past its limit refused with the sizes named. */
#include <stdio.h>
#include <string.h>

#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/limits.h"
#include "compiler/memory_plan.h"
#include "models/model_config.h"
#include "tests/harness.h"

typedef struct layout_graph {
    tg_model_config cfg;
    tg_job job;
    tg_graph g;
    tg_err err;
    int a, m1, m2, pk, b, wide, f1, f2, buf;
} layout_graph;

static int build(layout_graph *h, int zero) {
    memset(h, 0, sizeof *h);
    if (!CHECK(tg_model_config_load("tiny-bert", &h->cfg, &h->err) == 0, "%s", h->err.msg)) return 0;
    tg_job_defaults(&h->job);
    snprintf(h->job.freeze, sizeof h->job.freeze, "f*");
    if (zero) h->job.zero_stage = 1, h->job.data_parallel = 2;
    tg_graph_init(&h->g, &h->cfg, &h->job, &h->err);
    tg_graph *g = &h->g;
    h->f1 = tg_param(g, "f1", 1, 3, 0, TG_INIT_ZEROS, 0);
    h->a = tg_param(g, "a", 1, 3, 0, TG_INIT_ZEROS, 0);
    h->m1 = tg_param(g, "m1", 2, 2, 5, TG_INIT_ZEROS, 0);
    h->buf = tg_buffer(g, "buf", TG_F32, 1, 5, 0, TG_INIT_ZEROS, 1);
    h->m2 = tg_param(g, "m2", 1, 7, 0, TG_INIT_ZEROS, 0);
    h->f2 = tg_param(g, "f2", 1, 70, 0, TG_INIT_ZEROS, 0);
    h->b = tg_param(g, "b", 1, 100, 0, TG_INIT_ZEROS, 0);
    const int members[2] = {h->m1, h->m2};
    h->pk = tg_param_pack(g, "pk", members, 2, 1, 17, 0);
    /* A wider view of b (a padded table): 120 elements over b's 100. */
    const int64_t wide_shape[1] = {120};
    h->wide = tg_graph_tensor(g, "b.wide", TG_F32, TG_POOL_PARAMS, 1, wide_shape);
    if (h->wide >= 0) g->tensors[h->wide].flags |= TG_TENSOR_VIEW, g->tensors[h->wide].master = h->b;
    return CHECK(!g->failed && tg_plan_param_layout(g) == 0 && tg_plan_fixed_layout(g) == 0, "%s", h->err.msg);
}

static int named(const tg_graph *g, const char *name) {
    for (int t = 0; t < g->n_tensors; t++)
        if (!strcmp(g->tensors[t].name, name)) return t;
    return -1;
}

static void expect_at(const tg_graph *g, int t, int pool, uint64_t offset, uint64_t bytes) {
    if (!CHECK(t >= 0 && t < g->n_tensors, "tensor %d missing", t)) return;
    const tg_tensor *x = &g->tensors[t];
    CHECK(x->pool == pool && x->offset == offset && x->bytes == bytes, "%s: pool %d offset %llu bytes %llu, expected %d %llu %llu",
          x->name, x->pool, (unsigned long long)x->offset, (unsigned long long)x->bytes, pool, (unsigned long long)offset,
          (unsigned long long)bytes);
}

TG_TEST(test_memory_plan_whole_step_pools) {
    for (int zero = 0; zero < 2; zero++) {
        layout_graph h;
        if (!build(&h, zero)) return;
        const tg_graph *g = &h.g;
        /* a [0, 12) -> 512; m1 [512, 552) and m2 [552, 580) -> 1024; b [1024, 1424) with
         * room for its 480-byte view -> 1536. */
        expect_at(g, h.a, TG_POOL_PARAMS, 0, 12);
        expect_at(g, h.m1, TG_POOL_PARAMS, 512, 40);
        expect_at(g, h.m2, TG_POOL_PARAMS, 552, 28);
        expect_at(g, h.pk, TG_POOL_PARAMS, 512, 68);
        expect_at(g, h.b, TG_POOL_PARAMS, 1024, 400);
        expect_at(g, h.wide, TG_POOL_PARAMS, 1024, 480);
        expect_at(g, g->io.params_all, TG_POOL_PARAMS, 0, 1536);
        expect_at(g, g->io.grads_all, TG_POOL_GRADS, 0, 1536);
        const char *grads[] = {"grad.a", "grad.m1", "grad.m2", "grad.pk", "grad.b"};
        const int params[] = {h.a, h.m1, h.m2, h.pk, h.b};
        for (int i = 0; i < 5; i++) {
            const int d = named(g, grads[i]);
            expect_at(g, d, TG_POOL_GRADS, g->tensors[params[i]].offset, g->tensors[params[i]].bytes);
            CHECK(d >= 0 && g->tensors[params[i]].grad == d, "%s is not the gradient of %s", grads[i],
                  g->tensors[params[i]].name);
        }
        CHECK(named(g, "grad.b.wide") < 0 && named(g, "grad.f1") < 0 && named(g, "grad.buf") < 0,
              "gradients of a non-parameter view, a frozen parameter or a buffer");
        const int gm1 = named(g, "grad.m1"), gm2 = named(g, "grad.m2"), gpk = named(g, "grad.pk");
        CHECK(gm1 >= 0 && gm2 >= 0 && gpk >= 0 && g->tensors[gm1].group == gpk && g->tensors[gm2].group == gpk &&
                  (g->tensors[gpk].flags & TG_TENSOR_VIEW),
              "the packed gradients' group");
        /* 384 elements; ZeRO-1 over 2: slices of 192 rounded up to whole norm blocks. */
        const uint64_t state = zero ? TG_NORM_BLOCK * 4 : 1536;
        expect_at(g, g->io.m_all, TG_POOL_OPTIM, 0, state);
        expect_at(g, g->io.v_all, TG_POOL_OPTIM, state, state);
        /* Frozen: f1 [0, 12) -> 512, f2 [512, 792). Buffers: buf at 0. */
        expect_at(g, h.f1, TG_POOL_FROZEN, 0, 12);
        expect_at(g, h.f2, TG_POOL_FROZEN, 512, 280);
        expect_at(g, h.buf, TG_POOL_BUFFERS, 0, 20);
        tg_graph_free(&h.g);
    }
}

TG_TEST(test_memory_plan_zero_slice) {
    tg_job job;
    tg_job_defaults(&job);
    CHECK(tg_zero_slice(NULL, 1000) == 0 && tg_zero_slice(&job, 1000) == 0, "no ZeRO: no slice");
    job.zero_stage = 1, job.data_parallel = 1;
    CHECK(tg_zero_slice(&job, 1000) == 0, "one replica: no slice");
    job.data_parallel = 3;
    /* ceil(n / 3) up to whole norm blocks (GRAD_SQUARES' shards): 30000 -> 10000 -> 12288;
     * 3 blocks of 3 -> 1 block; one element more -> 2. */
    const int64_t b = TG_NORM_BLOCK;
    CHECK(tg_zero_slice(&job, 30000) == 3 * b && tg_zero_slice(&job, 3 * b) == b && tg_zero_slice(&job, 3 * b + 1) == 2 * b,
          "slices %lld %lld %lld", (long long)tg_zero_slice(&job, 30000), (long long)tg_zero_slice(&job, 3 * b),
          (long long)tg_zero_slice(&job, 3 * b + 1));
}

/* Two parameters of 9 TiB each: each fits one pool, both do not. */
TG_TEST(test_memory_plan_params_pool_too_large) {
    layout_graph h;
    memset(&h, 0, sizeof h);
    REQUIRE(tg_model_config_load("tiny-bert", &h.cfg, &h.err) == 0, "%s", h.err.msg);
    tg_job_defaults(&h.job);
    tg_graph_init(&h.g, &h.cfg, &h.job, &h.err);
    const int64_t n = (int64_t)(9ull << 40) / 4;
    tg_param(&h.g, "big1", 1, n, 0, TG_INIT_ZEROS, 0);
    tg_param(&h.g, "big2", 1, n, 0, TG_INIT_ZEROS, 0);
    REQUIRE(!h.g.failed, "%s", h.err.msg);
    CHECK(tg_plan_param_layout(&h.g) == -1 && strstr(h.err.msg, "the params pool needs at least 18") &&
              strstr(h.err.msg, "one pool may hold"),
          "'%s'", h.err.msg);
    tg_graph_free(&h.g);
}

/* A packed view must cover exactly the bytes of its members in its pool: a view edited to
 * be longer than its members, or a member moved to another pool, is refused by name (the
 * layout would otherwise hand the view bytes that are not its members'). For the frozen
 * pool alike, through the fixed layout. */
TG_TEST(test_memory_plan_packed_view_must_cover_members) {
    for (int edit = 0; edit < 3; edit++) {
        layout_graph h;
        memset(&h, 0, sizeof h);
        REQUIRE(tg_model_config_load("tiny-bert", &h.cfg, &h.err) == 0, "%s", h.err.msg);
        tg_job_defaults(&h.job);
        snprintf(h.job.freeze, sizeof h.job.freeze, "f*");
        tg_graph_init(&h.g, &h.cfg, &h.job, &h.err);
        tg_graph *g = &h.g;
        const int frozen = edit == 2;
        h.a = tg_param(g, frozen ? "fa" : "a", 1, 3, 0, TG_INIT_ZEROS, 0);
        h.m1 = tg_param(g, frozen ? "fm1" : "m1", 2, 2, 5, TG_INIT_ZEROS, 0);
        h.m2 = tg_param(g, frozen ? "fm2" : "m2", 1, 7, 0, TG_INIT_ZEROS, 0);
        if (frozen) tg_param(g, "trained", 1, 4, 0, TG_INIT_ZEROS, 0);
        const int members[2] = {h.m1, h.m2};
        h.pk = tg_param_pack(g, frozen ? "fpk" : "pk", members, 2, 1, 17, 0);
        REQUIRE(!g->failed && h.pk >= 0, "%s", h.err.msg);
        if (edit == 0) g->tensors[h.pk].bytes += 4;            /* longer than its members */
        else if (edit == 1) g->tensors[h.m2].pool = TG_POOL_FROZEN; /* a member elsewhere */
        else g->tensors[h.pk].bytes -= 4;                      /* frozen, shorter than its members */
        const int rc = frozen ? (tg_plan_param_layout(g) == 0 ? tg_plan_fixed_layout(g) : -2) : tg_plan_param_layout(g);
        const char *want = frozen ? "internal compiler error: packed view fpk does not cover its members"
                                  : "internal compiler error: packed view pk does not cover its members";
        CHECK(rc == -1 && !strcmp(h.err.msg, want), "edit %d: rc %d, '%s'", edit, rc, h.err.msg);
        tg_graph_free(&h.g);
    }
}
