/* The deferred update's chunks and waits (runtime/deferred_update.c), on compiled plans. */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/deferred_update.h"
#include "tests/harness.h"

/* Element range [*a, *b) of a tensor in the parameter pools. */
static void param_elements(const tg_tensor *t, int64_t *a, int64_t *b) {
    const int64_t size = t->dtype == TG_BF16 ? 2 : 4;
    *a = (int64_t)t->offset / size;
    *b = (int64_t)(t->offset + t->bytes + (uint64_t)size - 1) / size;
}

/* Every forward op waits for the chunks holding every parameter element it reads, and
 * the chunks tile the parameters in vector-aligned pieces of at least min_chunk. */
static void check_chunks(const tg_plan *p, const tg_deferred_update *u, int64_t min_chunk, const char *what) {
    const int64_t n = p->ops[p->n_ops - 1].p.adamw.n;
    CHECK(u->adamw_op == p->n_ops - 1 && tg_op_is_update(p->ops[u->adamw_op].kind), "%s: update op %d", what,
          u->adamw_op);
    CHECK(u->n_chunks >= 1 && u->begin[0] == 0 && u->begin[u->n_chunks] == n, "%s: chunks [%lld, %lld) of %lld", what,
          (long long)u->begin[0], (long long)u->begin[u->n_chunks], (long long)n);
    for (int k = 0; k < u->n_chunks; k++) {
        CHECK(u->begin[k + 1] > u->begin[k] && u->begin[k] % 4 == 0, "%s: chunk %d starts at %lld, ends at %lld", what,
              k, (long long)u->begin[k], (long long)u->begin[k + 1]);
        if (k + 1 < u->n_chunks)
            CHECK(u->begin[k + 1] - u->begin[k] >= min_chunk, "%s: chunk %d has %lld elements", what, k,
                  (long long)(u->begin[k + 1] - u->begin[k]));
    }
    const int f0 = p->phase_begin[TG_PHASE_FORWARD];
    CHECK(u->n_forward == p->phase_begin[TG_PHASE_FORWARD + 1] - f0, "%s: %d forward ops", what, u->n_forward);
    int reads = 0;
    for (int j = 0; j < u->n_forward; j++) {
        if (j > 0) CHECK(u->chunks_before[j] >= u->chunks_before[j - 1], "%s: op %d waits for fewer chunks", what, f0 + j);
        const int c = u->chunks_before[j];
        CHECK(c >= 0 && c <= u->n_chunks, "%s: op %d waits for %d chunks", what, f0 + j, c);
        const tg_op *op = &p->ops[f0 + j];
        for (int s = 0; s < TG_OP_MAX_IN; s++) {
            if (op->in[s] < 0) continue;
            const tg_tensor *t = &p->tensors[op->in[s]];
            if (t->pool != TG_POOL_PARAMS && t->pool != TG_POOL_PARAMS_BF16) continue;
            int64_t a, b;
            param_elements(t, &a, &b);
            reads++;
            CHECK(c > 0 && b <= u->begin[c], "%s: op %d reads %s [%lld, %lld) but waits only for [0, %lld)", what,
                  f0 + j, t->name, (long long)a, (long long)b, (long long)(c > 0 ? u->begin[c] : 0));
        }
        /* A forward op never writes what the update touches. */
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (op->out[s] >= 0) {
                const int pool = p->tensors[op->out[s]].pool;
                CHECK(pool != TG_POOL_PARAMS && pool != TG_POOL_PARAMS_BF16 && pool != TG_POOL_OPTIM &&
                          pool != TG_POOL_GRADS,
                      "%s: forward op %d writes pool %d", what, f0 + j, pool);
            }
    }
    CHECK(reads > 0, "%s: no forward op reads a parameter", what);
}

TG_TEST(test_deferred_update_chunks) {
    static const struct {
        const char *preset;
        int task, precision, min_layers_apart;
    } cases[] = {
        {"bert-base-uncased", TG_TASK_CLASSIFY, TG_PREC_BF16, 1},
        {"bert-base-uncased", TG_TASK_CLASSIFY, TG_PREC_FP32, 1},
        {"gpt2", TG_TASK_LM, TG_PREC_BF16, 1},
        {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 0},
        {"tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_plan p;
        if (!tg_test_compile_preset(cases[c].preset, cases[c].task, cases[c].precision, 1, &p)) continue;
        char what[96];
        snprintf(what, sizeof what, "%s %s", cases[c].preset, cases[c].precision == TG_PREC_BF16 ? "bf16" : "fp32");
        const int64_t n = p.ops[p.n_ops - 1].p.adamw.n;
        const int64_t mins[2] = {1 << 21, n / 16 > 4 ? n / 16 : 4};
        for (int m = 0; m < 2; m++) {
            tg_deferred_update u;
            tg_err err;
            int rc = tg_deferred_update_plan(&p, mins[m], &u, &err);
            if (!CHECK(rc == 1, "%s: plan gives %d (%s)", what, rc, rc < 0 ? err.msg : "not deferrable")) continue;
            check_chunks(&p, &u, mins[m], what);
            /* The forward's first op (the embedding lookup) does not wait for the whole update:
             * the layers' chunks come later (where chunks are small enough for several). */
            CHECK(n < 8 * mins[m] || (u.n_chunks >= 4 && u.chunks_before[0] < u.n_chunks), "%s: %d chunks, the first op waits for %d", what,
                  u.n_chunks, u.chunks_before[0]);
            if (cases[c].min_layers_apart && m == 0)
                CHECK(u.n_chunks >= p.model.layers, "%s: %d chunks for %d layers", what, u.n_chunks, p.model.layers);
            tg_deferred_update_free(&u);
        }
        /* A chunk as large as the whole update: one chunk, which the first reader waits for. */
        tg_deferred_update u;
        tg_err err;
        if (CHECK(tg_deferred_update_plan(&p, n, &u, &err) == 1, "%s: whole-update chunk", what)) {
            CHECK(u.n_chunks == 1 && u.chunks_before[0] <= 1, "%s: %d chunks with min_chunk = n", what, u.n_chunks);
            check_chunks(&p, &u, n, what);
            tg_deferred_update_free(&u);
        }
        tg_plan_free(&p);
    }
}

/* Adan's update is deferred the same way (its chunks are parameter ranges too). */
TG_TEST(test_deferred_update_adan) {
    tg_job job;
    tg_err err;
    tg_plan p;
    const char *sets[] = {"optimizer=adan"};
    REQUIRE(tg_job_parse_text("model = tiny-bert\nbatch = 2\nseq = 16\nsteps = 2\ntrain_data = t.jsonl\n", "j.job", NULL,
                              sets, 1, &job, &err) == 0 &&
                tg_compile(&job, &p, &err) == 0,
            "%s", err.msg);
    REQUIRE(p.ops[p.n_ops - 1].kind == TG_OP_ADAN, "last op %s", tg_op_name(p.ops[p.n_ops - 1].kind));
    const int64_t n = p.ops[p.n_ops - 1].p.adan.n;
    tg_deferred_update u;
    if (CHECK(tg_deferred_update_plan(&p, n / 8, &u, &err) == 1, "adan: not deferred")) {
        check_chunks(&p, &u, n / 8, "tiny-bert adan");
        CHECK(u.n_chunks >= 2, "%d chunks", u.n_chunks);
        tg_deferred_update_free(&u);
    }
    tg_plan_free(&p);
}

/* A plan whose last op is not the update (or has two) is not deferred; one whose forward
 * writes the optimizer state is not either. */
TG_TEST(test_deferred_update_refuses) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_deferred_update u;
    tg_err err;
    tg_op saved = p.ops[p.n_ops - 1];
    p.ops[p.n_ops - 1].kind = TG_OP_SCHEDULE;
    CHECK(tg_deferred_update_plan(&p, 4, &u, &err) == 0 && u.n_chunks == 0, "a plan without a final AdamW deferred");
    p.ops[p.n_ops - 1] = saved;
    /* The first forward op writing into the first moment. */
    const int f0 = p.phase_begin[TG_PHASE_FORWARD];
    int32_t out0 = p.ops[f0].out[0];
    p.ops[f0].out[0] = saved.out[1];
    CHECK(tg_deferred_update_plan(&p, 4, &u, &err) == 0, "a forward writing AdamW's m deferred");
    p.ops[f0].out[0] = out0;
    CHECK(tg_deferred_update_plan(&p, 4, &u, &err) == 1, "tiny-bert not deferred");
    tg_deferred_update_free(&u);
    tg_plan_free(&p);
}
