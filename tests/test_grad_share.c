/* Gradients that share the activation pool (plan/grad_hold.h): what BERT-base saves, the
 * plan checks that refuse an activation over a held gradient, the deferred update that
 * still runs beside the next forward, and training bit for bit as with a pool of their
 * own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/grad_hold.h"
#include "plan/validate.h"
#include "runtime/deferred_update.h"
#include "runtime/trainer.h"
#include "base/alloc.h"
#include "tests/harness.h"

static int compile_bert_base(int share, tg_plan *p) {
    tg_err err;
    return CHECK(tg_test_compile_bert_base_b32(share, TG_RECOMPUTE_AUTO, 0, p, &err) == 0, "%s", err.msg);
}

/* BERT-base B32 T128 bf16: the gradients (418 MiB) cost the plan well under half of that
 * shared, its totals count them once, and the plan passes its own checks. */
TG_TEST(test_shared_gradients_bert_base_totals) {
    tg_plan own, shared;
    if (!compile_bert_base(0, &own)) return;
    if (!compile_bert_base(1, &shared)) {
        tg_plan_free(&own);
        return;
    }
    const uint64_t grads = own.pool_bytes[TG_POOL_GRADS];
    CHECK(!own.grads_share_activations && shared.grads_share_activations, "flags %d %d", own.grads_share_activations,
          shared.grads_share_activations);
    CHECK(shared.pool_bytes[TG_POOL_GRADS] == grads && grads == own.pool_bytes[TG_POOL_PARAMS], "gradient pools");
    CHECK(shared.pool_bytes[TG_POOL_ACTIVATIONS] >= grads, "the activation pool is smaller than the gradients");
    uint64_t sum_own = 0, sum_shared = 0;
    for (int q = 0; q < TG_POOL_COUNT; q++) {
        sum_own += own.pool_bytes[q];
        sum_shared += q == TG_POOL_GRADS ? 0 : shared.pool_bytes[q];
    }
    CHECK(own.peak_bytes == sum_own && shared.peak_bytes == sum_shared, "peaks %llu %llu against pools %llu %llu",
          (unsigned long long)own.peak_bytes, (unsigned long long)shared.peak_bytes, (unsigned long long)sum_own,
          (unsigned long long)sum_shared);
    const double saved = (double)(own.peak_bytes - shared.peak_bytes);
    printf("    planned peak %.1f -> %.1f MiB: %.1f of the gradients' %.1f MiB saved (live bound %.1f -> %.1f MiB)\n",
           own.peak_bytes / 1048576.0, shared.peak_bytes / 1048576.0, saved / 1048576.0, grads / 1048576.0,
           own.activation_live_peak / 1048576.0, shared.activation_live_peak / 1048576.0);
    CHECK(saved > 0.6 * (double)grads, "only %.0f of %llu gradient bytes saved", saved, (unsigned long long)grads);
    /* The live bound counts the held gradients beside the activations. */
    CHECK(shared.activation_live_peak > own.activation_live_peak &&
              shared.activation_live_peak <= shared.pool_bytes[TG_POOL_ACTIVATIONS],
          "live bounds %llu / %llu, pool %llu", (unsigned long long)own.activation_live_peak,
          (unsigned long long)shared.activation_live_peak, (unsigned long long)shared.pool_bytes[TG_POOL_ACTIVATIONS]);
    tg_err err;
    CHECK(tg_plan_validate_tables(&shared, "shared", &err) == 0 && tg_plan_validate_ops(&shared, "shared", &err) == 0,
          "%s", err.msg);
    tg_plan_free(&own);
    tg_plan_free(&shared);
}

/* The holds of BERT-base: every gradient held from its first backward write to the end,
 * and from the step's start up to a forward op (the update deferred beside the forward
 * reads it until then); the embedding tables' gradients are freed by the forward's first
 * ops, the top layer's late. */
TG_TEST(test_shared_gradient_holds) {
    tg_plan p;
    if (!compile_bert_base(1, &p)) return;
    tg_grad_hold *h = NULL;
    int n = 0;
    REQUIRE(tg_grad_holds(p.tensors, p.n_tensors, p.ops, p.n_ops, p.phase_begin, p.pool_bytes[TG_POOL_GRADS], &h, &n) ==
                0,
            "out of memory");
    const int f1 = p.phase_begin[TG_PHASE_BACKWARD], b1 = p.phase_begin[TG_PHASE_OPTIMIZER];
    const int word_t = tg_test_tensor_named(&p, "grad.bert.embeddings.word_embeddings.weight"),
              top_t = tg_test_tensor_named(&p, "grad.bert.encoder.layer.11.output.dense.weight");
    REQUIRE(word_t >= 0 && top_t >= 0, "gradients not found");
    int grads = 0, word = -1, top = -1;
    uint64_t covered = 0;
    for (int i = 0; i < n; i++) {
        covered += h[i].b - h[i].a;
        CHECK(i == 0 || h[i].a == h[i - 1].b, "hold %d does not follow the one before", i);
        if (h[i].tensor < 0) continue;
        grads++;
        const char *name = p.tensors[h[i].tensor].name;
        CHECK(h[i].from >= f1 && h[i].from < b1 && h[i].to == p.n_ops - 1, "%s held %d..%d", name, h[i].from, h[i].to);
        CHECK(h[i].wrap_to >= 0 && h[i].wrap_to < f1, "%s held at the start through op %d", name, h[i].wrap_to);
        /* Small gradients join the hold after them; large ones stand alone. */
        CHECK(h[i].b - h[i].a >= TG_GRAD_HOLD_MIN_BYTES || i + 1 == n || h[i + 1].tensor < 0, "%s: a small hold alone",
              name);
        if (h[i].a <= p.tensors[word_t].offset && p.tensors[word_t].offset < h[i].b) word = h[i].wrap_to;
        if (h[i].a <= p.tensors[top_t].offset && p.tensors[top_t].offset < h[i].b) top = h[i].wrap_to;
    }
    CHECK(covered == p.pool_bytes[TG_POOL_GRADS], "holds cover %llu of %llu bytes", (unsigned long long)covered,
          (unsigned long long)p.pool_bytes[TG_POOL_GRADS]);
    CHECK(grads >= 12 * 4 && grads < 201, "%d holds for the 201 gradients", grads);
    CHECK(word >= 0 && word < 8 && top > f1 / 2, "word embeddings freed after op %d, layer 11 after op %d (forward: %d ops)",
          word, top, f1);
    free(h);
    tg_plan_free(&p);
}

/* The index of a tensor by name, REQUIRE'd present. */
static int named(const tg_plan *p, const char *name) {
    const int t = tg_test_tensor_named(p, name);
    if (!CHECK(t >= 0, "no tensor %s", name)) return -1;
    return t;
}

/* An offset inside gradient g where activation a would meet no other activation: the
 * first aligned one, or UINT64_MAX. */
static uint64_t spot_in_gradient(const tg_plan *p, int a, int g) {
    const tg_tensor *x = &p->tensors[a], *gr = &p->tensors[g];
    for (uint64_t off = gr->offset; off + x->bytes <= gr->offset + gr->bytes; off += TG_TENSOR_ALIGN) {
        int clear = 1;
        for (int t = 0; t < p->n_tensors && clear; t++) {
            const tg_tensor *y = &p->tensors[t];
            if (t == a || y->pool != TG_POOL_ACTIVATIONS || (y->flags & TG_TENSOR_VIEW)) continue;
            clear = !(y->offset < off + x->bytes && off < y->offset + y->bytes &&
                      !(y->last_use < x->first_use || x->last_use < y->first_use));
        }
        if (clear) return off;
    }
    return UINT64_MAX;
}

/* An activation moved onto a gradient's bytes while that gradient is held is refused,
 * naming both: one of the first layer's backward (meets the hold from the top layer's
 * backward on) and one of its forward (meets the hold for the deferred update). */
TG_TEST(test_shared_gradients_refuse_overlap) {
    tg_plan p;
    if (!compile_bert_base(1, &p)) return;
    const int g = named(&p, "grad.bert.encoder.layer.11.intermediate.dense.weight");
    const char *moved[] = {"d.bert.encoder.layer.0.attention.output.dense", "bert.encoder.layer.0.attention.output.dense"};
    const char *held[] = {"ops 0..", "ops 0.."};
    for (int k = 0; k < 2 && g >= 0; k++) {
        const int a = named(&p, moved[k]);
        if (a < 0) continue;
        const uint64_t keep = p.tensors[a].offset, spot = spot_in_gradient(&p, a, g);
        if (!CHECK(spot != UINT64_MAX, "no room for %s in %s", moved[k], p.tensors[g].name)) continue;
        p.tensors[a].offset = spot;
        tg_memory_report r;
        tg_err err = {{0}};
        CHECK(tg_plan_check_memory(&p, &r, &err) == -1 && strstr(err.msg, moved[k]) &&
                  strstr(err.msg, "and grad.bert.encoder.layer.11.") && strstr(err.msg, "of the gradients it shares the pool with") &&
                  strstr(err.msg, held[k]),
              "%s over a held gradient: %s", moved[k], err.msg);
        p.tensors[a].offset = keep;
    }
    tg_memory_report r;
    tg_err err;
    CHECK(tg_plan_check_memory(&p, &r, &err) == 0, "restored: %s", err.msg);
    /* Sharing needs no accumulation window, and a pool that holds them. */
    p.train.grad_accumulation = 2;
    CHECK(tg_plan_validate_tables(&p, "p", &err) == -1 && strstr(err.msg, "share the activation pool") &&
              strstr(err.msg, "grad_accumulation 2"),
          "%s", err.msg);
    p.train.grad_accumulation = 1;
    p.pool_bytes[TG_POOL_ACTIVATIONS] = p.pool_bytes[TG_POOL_GRADS] - 256;
    CHECK(tg_plan_validate_tables(&p, "p", &err) == -1 && strstr(err.msg, "shares an activation pool of"), "%s",
          err.msg);
    p.grads_share_activations = 2;
    CHECK(tg_plan_validate_tables(&p, "p", &err) == -1 && strstr(err.msg, "is not 0 or 1"), "%s", err.msg);
    tg_plan_free(&p);
}

/* The deferred update still plans for a shared plan, and the forward's writes over the
 * gradients wait for nothing the parameter reads do not already wait for: the compiler
 * placed them after the update has read what they overwrite. */
TG_TEST(test_shared_gradients_deferred_update) {
    tg_plan p;
    if (!compile_bert_base(1, &p)) return;
    const int f0 = p.phase_begin[TG_PHASE_FORWARD], f1 = p.phase_begin[TG_PHASE_BACKWARD];
    int64_t *reads = calloc((size_t)(f1 - f0), sizeof *reads), *writes = calloc((size_t)(f1 - f0), sizeof *writes);
    REQUIRE(reads && writes, "out of memory");
    CHECK(tg_update_read_prefix(p.tensors, p.ops, p.n_ops, f0, f1, 0, reads) == 1 &&
              tg_update_read_prefix(p.tensors, p.ops, p.n_ops, f0, f1, p.pool_bytes[TG_POOL_GRADS], writes) == 1,
          "the update cannot be deferred");
    CHECK(memcmp(reads, writes, sizeof *reads * (size_t)(f1 - f0)) == 0, "forward writes over the gradients wait longer");
    /* Moved over a gradient the forward reads late, a first-layer activation makes the
     * executor wait for that gradient's update before writing it. */
    const int a = named(&p, "bert.encoder.layer.0.output.dense"), g = named(&p, "grad.bert.encoder.layer.11.output.dense.weight");
    if (a >= 0 && g >= 0) {
        p.tensors[a].offset = p.tensors[g].offset;
        REQUIRE(tg_update_read_prefix(p.tensors, p.ops, p.n_ops, f0, f1, p.pool_bytes[TG_POOL_GRADS], writes) == 1,
                "the moved plan cannot be deferred");
        const int j = p.tensors[a].first_use - f0;
        CHECK(writes[j] >= (int64_t)((p.tensors[g].offset + p.tensors[a].bytes) / 4) && writes[j] > reads[j],
              "op %d waits for %lld elements (reads %lld)", j, (long long)writes[j], (long long)reads[j]);
    }
    tg_deferred_update u;
    tg_err err;
    CHECK(tg_deferred_update_plan(&p, 1 << 21, &u, &err) == 1 && u.n_chunks >= 2, "not deferred");
    tg_deferred_update_free(&u);
    free(reads), free(writes);
    tg_plan_free(&p);
}

/* The CPU reference trains the same, bit for bit, with the gradients shared or not. */
TG_TEST(test_shared_gradients_train_as_own_pool) {
    float *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int sa = -1, sb = -1;
    const char *shared[] = {"precision=bf16"}, *own[] = {"precision=bf16", "share_grad_memory=false"};
    if (tg_test_train_cpu("examples/demo-classify.job", shared, 1, 6, &a, &na, &sa) &&
        tg_test_train_cpu("examples/demo-classify.job", own, 2, 6, &b, &nb, &sb)) {
        CHECK(sa == 1 && sb == 0, "sharing %d and %d", sa, sb);
        CHECK(na == nb && memcmp(a, b, na) == 0, "parameters differ after 6 steps");
    }
    free(a), free(b);
}

/* The plan checks of a shared plan, each of their allocations failing in turn: a clear
 * message naming what ran out, never a crash or a pass. */
TG_TEST(test_shared_gradients_check_allocation_failures) {
    tg_plan p;
    if (!compile_bert_base(1, &p)) return;
    int failures = 0, k = 0;
    for (;; k++) {
        tg_memory_report r;
        tg_err err = {{0}};
        tg_alloc_fail_after(k);
        const int rc = tg_plan_check_memory(&p, &r, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) break;
        failures++;
        CHECK(strstr(err.msg, "out of memory"), "allocation %d failed: '%s'", k, err.msg);
        if (!CHECK(k < 64, "still failing after 64 allocations")) break;
    }
    CHECK(failures >= 4, "only %d allocations failed in turn", failures);
    tg_plan_free(&p);
}

/* Length buckets share the gradients too: every bucket plan at the same offsets, each
 * placing its activations around its own holds; a bucket that says otherwise is refused;
 * and training over buckets (the deferred update of one bucket's step beside another's
 * forward) is bit for bit that with a pool of their own. */
TG_TEST(test_shared_gradients_length_buckets) {
    tg_job job;
    tg_plan p;
    tg_err err;
    const char *sets[] = {"seq_buckets=16,32,48", "precision=bf16"};
    REQUIRE(tg_job_load("examples/demo-classify.job", sets, 2, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0,
            "%s", err.msg);
    CHECK(p.train.n_buckets == 3 && p.grads_share_activations, "%d buckets, sharing %d", p.train.n_buckets,
          p.grads_share_activations);
    for (int k = 0; k + 1 < p.train.n_buckets; k++) {
        const tg_plan *b = &p.buckets[k];
        CHECK(b->grads_share_activations && b->pool_bytes[TG_POOL_ACTIVATIONS] == p.pool_bytes[TG_POOL_ACTIVATIONS] &&
                  b->peak_bytes == p.peak_bytes,
              "bucket %d: sharing %d, activations %llu, peak %llu", k, b->grads_share_activations,
              (unsigned long long)b->pool_bytes[TG_POOL_ACTIVATIONS], (unsigned long long)b->peak_bytes);
        tg_memory_report r;
        CHECK(tg_plan_check_memory(b, &r, &err) == 0, "bucket %d: %s", k, err.msg);
    }
    CHECK(tg_plan_validate_buckets(&p, "p", &err) == 0, "%s", err.msg);
    p.buckets[0].grads_share_activations = 0;
    CHECK(tg_plan_validate_buckets(&p, "p", &err) == -1 && strstr(err.msg, "gradient sharing"), "%s", err.msg);
    p.buckets[0].grads_share_activations = 1;
    tg_plan_free(&p);

    float *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int sa = -1, sb = -1;
    const char *own[] = {"seq_buckets=16,32,48", "precision=bf16", "share_grad_memory=false"};
    if (tg_test_train_cpu("examples/demo-classify.job", sets, 2, 8, &a, &na, &sa) &&
        tg_test_train_cpu("examples/demo-classify.job", own, 3, 8, &b, &nb, &sb)) {
        CHECK(sa == 1 && sb == 0, "sharing %d and %d", sa, sb);
        CHECK(na == nb && memcmp(a, b, na) == 0, "parameters differ after 8 steps over length buckets");
    }
    free(a), free(b);
}

/* A gradient pool cut by more than 64 stretches of padding (a tiny model whose tensors
 * are not multiples of the 512-byte alignment, many layers deep) stays apart: the
 * padding, held for the whole step, would leave only small pieces to place activations
 * in. The same model two layers deep shares. */
TG_TEST(test_shared_gradients_refused_for_fragmented_pools) {
    const int depths[2] = {2, 60};
    for (int k = 0; k < 2; k++) {
        tg_model_config cfg;
        tg_err err;
        REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
        cfg.layers = depths[k];
        tg_job job;
        tg_job_defaults(&job);
        snprintf(job.model, sizeof job.model, "tiny-bert");
        job.batch = 2, job.seq = 16, job.steps = 1;
        tg_plan p;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        tg_grad_hold *h = NULL;
        int n = 0, padding = 0;
        REQUIRE(tg_grad_holds(p.tensors, p.n_tensors, p.ops, p.n_ops, p.phase_begin, p.pool_bytes[TG_POOL_GRADS], &h, &n) == 0,
                "out of memory");
        for (int i = 0; i < n; i++) padding += h[i].tensor < 0;
        free(h);
        CHECK(p.grads_share_activations == (padding <= 64), "%d layers: %d stretches of padding, sharing %d", depths[k],
              padding, p.grads_share_activations);
        CHECK(k == 0 ? p.grads_share_activations : !p.grads_share_activations, "%d layers: sharing %d (%d stretches)",
              depths[k], p.grads_share_activations, padding);
        tg_plan_free(&p);
    }
}
