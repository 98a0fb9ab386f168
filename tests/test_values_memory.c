/* The memory planner's invariants on compiled plans (compiler/memory_plan.c), and the
 * independent overlap checker (plan/validate.c) finding planted overlaps at both ends of
 * its table. */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/validate.h"
#include "tests/harness.h"

/* Each pool ends where its furthest-reaching tensor ends (views included: the parameter
 * pools' whole-pool views and ZeRO-1's padded slices); the parameter layouts end on a
 * multiple of twice the alignment (so that the bf16 copies, at half the offsets, stay
 * aligned); every other offset is aligned. */
static void check_pools(const tg_plan *p, const char *what) {
    uint64_t end[TG_POOL_COUNT] = {0};
    for (int t = 0; t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (x->offset + x->bytes > end[x->pool]) end[x->pool] = x->offset + x->bytes;
        if (x->group < 0)
            CHECK(x->offset % TG_TENSOR_ALIGN == 0, "%s: %s at offset %llu", what, x->name,
                  (unsigned long long)x->offset);
    }
    uint64_t sum = 0;
    for (int q = 0; q < TG_POOL_COUNT; q++) {
        CHECK(p->pool_bytes[q] == end[q], "%s: pool %s holds %llu bytes, its tensors end at %llu", what,
              tg_pool_name(q), (unsigned long long)p->pool_bytes[q], (unsigned long long)end[q]);
        sum += tg_pool_allocated(p, q) ? p->pool_bytes[q] : 0; /* shared gradients: inside the activations */
    }
    CHECK(p->peak_bytes == sum, "%s: peak %llu bytes, the pools add up to %llu", what,
          (unsigned long long)p->peak_bytes, (unsigned long long)sum);
    const tg_tensor *all = &p->tensors[p->io.params_all], *grads = &p->tensors[p->io.grads_all];
    CHECK(all->offset == 0 && all->bytes == p->pool_bytes[TG_POOL_PARAMS] && all->bytes % (2 * TG_TENSOR_ALIGN) == 0,
          "%s: params_all [%llu, +%llu) in a pool of %llu", what, (unsigned long long)all->offset,
          (unsigned long long)all->bytes, (unsigned long long)p->pool_bytes[TG_POOL_PARAMS]);
    CHECK(grads->offset == 0 && grads->bytes == all->bytes, "%s: grads_all %llu bytes, params_all %llu", what,
          (unsigned long long)grads->bytes, (unsigned long long)all->bytes);
    /* The activations pool is no larger than its tensors would need placed end to end. */
    uint64_t stacked = 0;
    for (int t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].pool == TG_POOL_ACTIVATIONS && !(p->tensors[t].flags & TG_TENSOR_VIEW))
            stacked += (p->tensors[t].bytes + TG_TENSOR_ALIGN - 1) / TG_TENSOR_ALIGN * TG_TENSOR_ALIGN;
    CHECK(p->pool_bytes[TG_POOL_ACTIVATIONS] >= p->activation_live_peak &&
              p->pool_bytes[TG_POOL_ACTIVATIONS] <= stacked,
          "%s: activations pool %llu, live peak %llu, all stacked %llu", what,
          (unsigned long long)p->pool_bytes[TG_POOL_ACTIVATIONS], (unsigned long long)p->activation_live_peak,
          (unsigned long long)stacked);
    tg_memory_report r;
    tg_err err = {{0}};
    if (CHECK(tg_plan_check_memory(p, &r, &err) == 0, "%s: %s", what, err.msg)) {
        for (int q = 0; q < TG_POOL_COUNT; q++)
            CHECK(r.pool_extent[q] == end[q], "%s: checker's extent of %s %llu, want %llu", what, tg_pool_name(q),
                  (unsigned long long)r.pool_extent[q], (unsigned long long)end[q]);
        CHECK(r.peak_bytes == sum && r.activation_live_peak == p->activation_live_peak, "%s: checker peak %llu live %llu",
              what, (unsigned long long)r.peak_bytes, (unsigned long long)r.activation_live_peak);
    }
}

TG_TEST(test_values_memory_pool_sizes) {
    static const struct { const char *preset; int task, precision, replicas; } cases[] = {
        {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1}, {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 1},
        {"tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, 1},       {"tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 2},
        {"tiny-roberta", TG_TASK_CLASSIFY, TG_PREC_FP32, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tg_plan p;
        char what[128];
        snprintf(what, sizeof what, "%s %s %s x%d", cases[i].preset, tg_task_name(cases[i].task),
                 tg_precision_name(cases[i].precision), cases[i].replicas);
        if (!tg_test_compile_preset(cases[i].preset, cases[i].task, cases[i].precision, cases[i].replicas, &p)) continue;
        check_pools(&p, what);
        tg_plan_free(&p);
    }
}

/* A hand-made table of activations, placed without overlap, for the checker alone. */
enum { N_ACT = 6 };

static void table(tg_plan *p, tg_tensor *t) {
    memset(p, 0, sizeof *p);
    memset(t, 0, sizeof(tg_tensor) * N_ACT);
    for (int i = 0; i < N_ACT; i++) {
        snprintf(t[i].name, sizeof t[i].name, "act%d", i);
        t[i].dtype = TG_F32, t[i].pool = TG_POOL_ACTIVATIONS, t[i].ndim = 1, t[i].shape[0] = 64;
        t[i].bytes = 256, t[i].offset = 256u * (uint64_t)i, t[i].first_use = 0, t[i].last_use = 0;
        t[i].grad = t[i].master = t[i].group = -1;
    }
    p->tensors = t, p->n_tensors = N_ACT, p->n_ops = 0;
    p->pool_bytes[TG_POOL_ACTIVATIONS] = 256u * N_ACT;
}

static void expect_overlap(tg_plan *p, const char *a, const char *b, const char *what) {
    tg_memory_report r;
    tg_err err = {{0}};
    if (CHECK(tg_plan_check_memory(p, &r, &err) == -1, "%s: overlap not found", what))
        CHECK(strstr(err.msg, "overlap while both live") && strstr(err.msg, a) && strstr(err.msg, b),
              "%s: '%s' does not name %s and %s", what, err.msg, a, b);
}

TG_TEST(test_values_memory_overlap_at_table_ends) {
    tg_plan p;
    tg_tensor t[N_ACT];
    tg_memory_report r;
    tg_err err = {{0}};
    table(&p, t);
    CHECK(tg_plan_check_memory(&p, &r, &err) == 0, "the clean table: %s", err.msg);
    CHECK(r.pool_extent[TG_POOL_ACTIVATIONS] == 256u * N_ACT, "extent %llu",
          (unsigned long long)r.pool_extent[TG_POOL_ACTIVATIONS]);
    /* The first two entries share a byte. */
    t[1].offset = 0;
    t[0].bytes = 4; /* [0, 4) and [0, 256) */
    expect_overlap(&p, "act0", "act1", "first index");
    /* The last two: the last one starts inside the one before it. */
    table(&p, t);
    t[N_ACT - 2].bytes = 260, t[N_ACT - 2].shape[0] = 65;
    p.pool_bytes[TG_POOL_ACTIVATIONS] = 256u * N_ACT + 4;
    expect_overlap(&p, "act4", "act5", "last index");
    /* The first and the last entry of the table, all others elsewhere: act5 moved to 0. */
    table(&p, t);
    t[N_ACT - 1].offset = 0;
    expect_overlap(&p, "act0", "act5", "first and last index");
    /* The same bytes at disjoint lifetimes are reuse, not overlap; adjacent ones share none. */
    table(&p, t);
    t[N_ACT - 1].offset = 0, t[N_ACT - 1].first_use = t[N_ACT - 1].last_use = 1;
    p.n_ops = 0;
    CHECK(tg_plan_check_memory(&p, &r, &err) == 0, "reuse at another time refused: %s", err.msg);
    /* An overlap in a whole-step pool counts whatever the lifetimes. */
    table(&p, t);
    for (int i = 0; i < N_ACT; i++) t[i].pool = TG_POOL_WORKSPACE;
    p.pool_bytes[TG_POOL_ACTIVATIONS] = 0, p.pool_bytes[TG_POOL_WORKSPACE] = 256u * N_ACT;
    t[N_ACT - 1].offset = 256u * (N_ACT - 2), t[N_ACT - 1].first_use = t[N_ACT - 1].last_use = 1;
    expect_overlap(&p, "act4", "act5", "workspace, last index");
    /* A tensor past its pool's end. */
    table(&p, t);
    p.pool_bytes[TG_POOL_ACTIVATIONS] = 256u * N_ACT - 1;
    CHECK(tg_plan_check_memory(&p, &r, &err) == -1 && strstr(err.msg, "tensors reach 1536 bytes but the pool has 1535"),
          "a pool one byte short: %s", err.msg);
}

/* In a compiled plan: the checker finds an overlap planted between the first tensor of the
 * params pool and its last one, and between the activations placed first and last. */
TG_TEST(test_values_memory_overlap_in_compiled_plan) {
    tg_plan p;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p), "compile");
    int first = -1, last = -1, lo = -1, hi = -1;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (x->flags & TG_TENSOR_VIEW || x->group >= 0) continue;
        if (x->pool == TG_POOL_PARAMS) {
            if (first < 0 || x->offset < p.tensors[first].offset) first = t;
            if (last < 0 || x->offset > p.tensors[last].offset) last = t;
        }
        if (x->pool == TG_POOL_ACTIVATIONS) {
            if (lo < 0 || x->offset < p.tensors[lo].offset) lo = t;
            if (hi < 0 || x->offset >= p.tensors[hi].offset) hi = t;
        }
    }
    REQUIRE(first >= 0 && last > 0 && first != last && lo >= 0 && hi >= 0 && lo != hi, "no tensors to move");
    uint64_t saved = p.tensors[last].offset;
    p.tensors[last].offset = p.tensors[first].offset;
    expect_overlap(&p, p.tensors[first].name, p.tensors[last].name, "params pool, first and last");
    p.tensors[last].offset = saved;
    /* The highest activation moved onto the lowest, its lifetime widened to the schedule. */
    tg_tensor keep = p.tensors[hi];
    p.tensors[hi].offset = p.tensors[lo].offset;
    if (p.tensors[hi].first_use > p.tensors[lo].first_use) p.tensors[hi].first_use = p.tensors[lo].first_use;
    if (p.tensors[hi].last_use < p.tensors[lo].last_use) p.tensors[hi].last_use = p.tensors[lo].last_use;
    expect_overlap(&p, p.tensors[lo].name, p.tensors[hi].name, "activations, lowest and highest");
    p.tensors[hi] = keep;
    tg_memory_report r;
    tg_err err = {{0}};
    CHECK(tg_plan_check_memory(&p, &r, &err) == 0, "restored plan: %s", err.msg);
    tg_plan_free(&p);
}
