/* The deferred update of ZeRO-1 plans (runtime/deferred_update.c): the update followed by
 * the gathers of its slices is deferred, the gathers recorded; each chunk's parts, the one
 * each replica updates and the broadcasts that share it from their owners; each way a
 * schedule after the update is refused; the least chunk an executor asks for. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/cost_model.h"
#include "plan/inspect.h"
#include "runtime/deferred_update.h"
#include "tests/harness.h"

/* The demo classification job with `replicas` replicas, ZeRO-1 (zero 1) or not, in fp32,
 * bf16 or fp16. */
static int compile_zero(int replicas, int zero, const char *precision, tg_plan *p) {
    char r[32], prec[32];
    snprintf(r, sizeof r, "data_parallel=%d", replicas);
    snprintf(prec, sizeof prec, "precision=%s", precision);
    const char *sets[] = {r, prec, "batch=2", "steps=3", zero ? "zero_stage=1" : "zero_stage=0"};
    tg_job job;
    tg_err err = {{0}};
    if (!CHECK(tg_job_load("examples/demo-classify.job", sets, 5, &job, &err) == 0, "%s", err.msg)) return 0;
    return CHECK(tg_compile(&job, p, &err) == 0, "%s", err.msg);
}

/* The chunk parts of a ZeRO-1 plan's deferred update, each checked against the slices:
 * what each replica updates of chunk k is the chunk's part inside its slice, the replicas'
 * parts tile the chunk in rank order, and the broadcasts of chunk k share exactly its
 * elements (the last chunk's up to the gathers' end), each from the owner of its slice. */
static int check_parts(const tg_deferred_update *u, int64_t n, const char *what) {
    const int64_t slice = u->zero_slice;
    int straddling = 0; /* chunks shared by more than one owner */
    int64_t shared_to = 0; /* the broadcasts of chunks 0 .. k-1 covered [0, shared_to) */
    for (int k = 0; k < u->n_chunks; k++) {
        int64_t at = u->begin[k];
        for (int r = 0; r < u->replicas; r++) {
            int64_t lo, hi;
            tg_deferred_update_own(u, k, r, &lo, &hi);
            if (lo == hi) continue;
            CHECK(lo == at && hi > lo && hi <= u->begin[k + 1] && lo >= r * slice && hi <= (r + 1) * slice,
                  "%s: chunk %d [%lld, %lld), replica %d updates [%lld, %lld) (slice [%lld, %lld))", what, k,
                  (long long)u->begin[k], (long long)u->begin[k + 1], r, (long long)lo, (long long)hi,
                  (long long)(r * slice), (long long)((r + 1) * slice));
            at = hi;
        }
        CHECK(at == u->begin[k + 1], "%s: the replicas update chunk %d up to %lld of %lld", what, k, (long long)at,
              (long long)u->begin[k + 1]);
        tg_deferred_share s[8];
        const int m = tg_deferred_update_share(u, k, s);
        const int64_t end = k == u->n_chunks - 1 ? u->gather_end : u->begin[k + 1];
        CHECK(m >= 1 && m <= u->replicas, "%s: chunk %d shared by %d broadcasts", what, k, m);
        straddling += m > 1;
        for (int i = 0; i < m; i++) {
            CHECK(s[i].lo == shared_to && s[i].hi > s[i].lo && s[i].lo >= s[i].owner * slice &&
                      s[i].hi <= (s[i].owner + 1) * slice && (i == 0 || s[i].owner > s[i - 1].owner),
                  "%s: chunk %d broadcast %d: [%lld, %lld) from %d, after %lld", what, k, i, (long long)s[i].lo,
                  (long long)s[i].hi, s[i].owner, (long long)shared_to);
            /* What the owner updated of the chunk is what it sends, less the padding past n. */
            int64_t lo, hi;
            tg_deferred_update_own(u, k, s[i].owner, &lo, &hi);
            const int64_t sent_to = s[i].hi < n ? s[i].hi : n;
            CHECK(sent_to > s[i].lo ? lo == s[i].lo && hi == sent_to : lo == hi,
                  "%s: chunk %d: owner %d updates [%lld, %lld) and sends [%lld, %lld)", what, k, s[i].owner,
                  (long long)lo, (long long)hi, (long long)s[i].lo, (long long)s[i].hi);
            shared_to = s[i].hi;
        }
        CHECK(shared_to == end, "%s: chunk %d shared up to %lld, its end %lld", what, k, (long long)shared_to,
              (long long)end);
    }
    CHECK(shared_to == u->gather_end && u->gather_end == slice * u->replicas && u->gather_end >= n,
          "%s: shared [0, %lld) of %lld slices' %lld", what, (long long)shared_to, (long long)u->replicas,
          (long long)u->gather_end);
    return straddling;
}

/* ZeRO-1 plans (fp32 and bf16, 2 and 3 replicas, the last slice short): deferred, with the
 * update and its gathers recorded, and the chunks and waits those of the same schedule
 * without its gathers and slices (a plain update of the same elements). */
TG_TEST(test_deferred_update_zero_plan) {
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (int replicas = 2; replicas <= 3; replicas++) {
            char what[64];
            snprintf(what, sizeof what, "%s, %d replicas", bf16 ? "bf16" : "fp32", replicas);
            tg_plan z;
            if (!compile_zero(replicas, 1, bf16 ? "bf16" : "fp32", &z)) return;
            int update = -1;
            for (int o = 0; o < z.n_ops; o++)
                if (tg_op_is_update(z.ops[o].kind)) update = o;
            REQUIRE(update >= 0 && update == z.n_ops - 2 - bf16, "%s: the update at op %d of %d", what, update, z.n_ops);
            const tg_adamw_params *a = &z.ops[update].p.adamw;
            for (int64_t min_chunk = 4; min_chunk <= 1 << 16; min_chunk *= 64) {
                tg_deferred_update u, plain;
                tg_err err = {{0}};
                REQUIRE(tg_deferred_update_plan(&z, min_chunk, &u, &err) == 1, "%s: not deferred (%s)", what, err.msg);
                CHECK(u.adamw_op == update && u.zero_slice == a->zero_slice && u.replicas == replicas &&
                          u.n_gathers == 1 + bf16 && u.gather_end == a->zero_slice * replicas,
                      "%s: update %d, slice %lld, %d replicas, %d gathers to %lld", what, u.adamw_op,
                      (long long)u.zero_slice, u.replicas, u.n_gathers, (long long)u.gather_end);
                for (int g = 0; g < u.n_gathers; g++) {
                    const tg_op *op = &z.ops[u.gather_op[g]];
                    const int pool = z.tensors[op->in[0]].pool;
                    CHECK(u.gather_op[g] == update + 1 + g && op->kind == TG_OP_ALL_GATHER &&
                              (pool == TG_POOL_PARAMS || pool == TG_POOL_PARAMS_BF16),
                          "%s: gather %d at op %d (%s) over pool %d", what, g, u.gather_op[g], tg_op_name(op->kind), pool);
                }
                CHECK(u.n_chunks >= (min_chunk == 4 ? 2 : 1) && u.begin[u.n_chunks] == a->n, "%s: %d chunks to %lld of %lld",
                      what, u.n_chunks, (long long)u.begin[u.n_chunks], (long long)a->n);
                /* Some chunk lies across a slice bound, shared by two owners. */
                const int straddling = check_parts(&u, a->n, what);
                CHECK(straddling >= 1, "%s, min chunk %lld: none of %d chunks across slices", what, (long long)min_chunk,
                      u.n_chunks);
                /* The same schedule ending at the update, unsliced: the same chunks and waits. */
                tg_plan cut = z;
                tg_op *ops = tg_malloc(sizeof *ops * (size_t)(update + 1));
                REQUIRE(ops, "out of memory");
                memcpy(ops, z.ops, sizeof *ops * (size_t)(update + 1));
                ops[update].p.adamw.zero_slice = 0;
                cut.ops = ops, cut.n_ops = update + 1;
                REQUIRE(tg_deferred_update_plan(&cut, min_chunk, &plain, &err) == 1, "%s: unsliced not deferred", what);
                CHECK(plain.zero_slice == 0 && plain.n_gathers == 0 && plain.n_chunks == u.n_chunks &&
                          plain.n_forward == u.n_forward,
                      "%s: unsliced %d chunks, sliced %d", what, plain.n_chunks, u.n_chunks);
                int same = plain.n_chunks == u.n_chunks && plain.n_forward == u.n_forward;
                for (int k = 0; same && k <= u.n_chunks; k++) same = plain.begin[k] == u.begin[k];
                for (int j = 0; same && j < u.n_forward; j++) same = plain.chunks_before[j] == u.chunks_before[j];
                CHECK(same, "%s: the sliced chunks or waits differ from the unsliced ones", what);
                /* Unsliced, every replica updates the whole chunk and nothing is shared. */
                for (int k = 0; k < plain.n_chunks; k++) {
                    int64_t lo, hi;
                    tg_deferred_share s[4];
                    tg_deferred_update_own(&plain, k, replicas - 1, &lo, &hi);
                    CHECK(lo == plain.begin[k] && hi == plain.begin[k + 1] && tg_deferred_update_share(&plain, k, s) == 0,
                          "%s: unsliced chunk %d: [%lld, %lld) updated", what, k, (long long)lo, (long long)hi);
                }
                free(ops);
                tg_deferred_update_free(&plain);
                tg_deferred_update_free(&u);
                CHECK(u.n_gathers == 0 && u.zero_slice == 0 && u.begin == NULL, "%s: free leaves *u zeroed", what);
            }
            tg_plan_free(&z);
        }
}

/* Runs the planner on p expecting 0 (not deferred) with *u zeroed, or 1. */
static void expect(const tg_plan *p, int want, const char *what) {
    tg_deferred_update u;
    tg_err err = {{0}};
    memset(&u, 0x5a, sizeof u);
    const int rc = tg_deferred_update_plan(p, 4, &u, &err);
    CHECK(rc == want, "%s: returned %d, expected %d (%s)", what, rc, want, err.msg);
    if (rc == 0)
        CHECK(u.n_chunks == 0 && u.begin == NULL && u.n_gathers == 0 && u.zero_slice == 0 && u.replicas == 0 &&
                  u.gather_end == 0 && u.gather_op[0] == 0,
              "%s: *u not zeroed", what);
    if (rc == 1) tg_deferred_update_free(&u);
}

/* Schedules after a ZeRO-1 update that are not deferred: no gathers, the copies' gather
 * missing, a gather of other slices, from a source tensor, over another pool or not from
 * the pool's start, one pool gathered twice, a third gather, another op among them, a plan
 * of one replica; gathers after an unsliced update; and an fp16 plan, whose loss-scale
 * update follows the parameters' gather. */
TG_TEST(test_deferred_update_zero_refused) {
    tg_plan z;
    if (!compile_zero(2, 1, "bf16", &z)) return;
    const int n_ops = z.n_ops, update = n_ops - 3;
    REQUIRE(tg_op_is_update(z.ops[update].kind), "bf16 ZeRO-1: op %d is %s", update, tg_op_name(z.ops[update].kind));
    expect(&z, 1, "as compiled");
    tg_op *g0 = &z.ops[update + 1], *g1 = &z.ops[update + 2];
    REQUIRE(g0->kind == TG_OP_ALL_GATHER && g1->kind == TG_OP_ALL_GATHER &&
                z.tensors[g0->in[0]].pool == TG_POOL_PARAMS && z.tensors[g1->in[0]].pool == TG_POOL_PARAMS_BF16,
            "the gathers of the parameters, then of their copies");
    z.n_ops = update + 1;
    expect(&z, 0, "no gathers after a sliced update");
    z.n_ops = update + 2;
    expect(&z, 0, "the bf16 copies not gathered");
    z.n_ops = n_ops;

    const tg_op saved = *g0;
    g0->p.all_gather.slice += TG_NORM_BLOCK;
    expect(&z, 0, "a gather of other slices");
    *g0 = saved;
    g0->in[1] = z.io.params_all;
    expect(&z, 0, "a gather from a source tensor");
    *g0 = saved;
    g0->out[0] = z.io.params_all;
    expect(&z, 0, "a gather into another tensor");
    *g0 = saved;
    g0->in[0] = g0->out[0] = z.io.grads_all;
    expect(&z, 0, "a gather of the gradients");
    *g0 = saved;
    g0->in[0] = g0->out[0] = -1;
    expect(&z, 0, "a gather of no tensor");
    *g0 = saved;
    g0->in[0] = g0->out[0] = g1->in[0];
    expect(&z, 0, "the copies gathered twice");
    *g0 = saved;
    g0->kind = TG_OP_ZERO;
    expect(&z, 0, "another op between the update and a gather");
    *g0 = saved;
    tg_tensor *t = &z.tensors[g0->in[0]];
    const uint64_t offset = t->offset;
    t->offset = 512;
    expect(&z, 0, "a gather not from the pool's start");
    t->offset = offset;

    /* A third gather: the schedule with the copies' gather twice. */
    tg_op *three = tg_malloc(sizeof *three * (size_t)(n_ops + 1));
    REQUIRE(three, "out of memory");
    memcpy(three, z.ops, sizeof *three * (size_t)n_ops);
    three[n_ops] = *g1;
    tg_plan more = z;
    more.ops = three, more.n_ops = n_ops + 1;
    expect(&more, 0, "three gathers");
    free(three);

    z.train.replicas = 1;
    expect(&z, 0, "a ZeRO-1 update of one replica");
    z.train.replicas = 2;
    const int64_t slice = z.ops[update].p.adamw.zero_slice;
    z.ops[update].p.adamw.zero_slice = 0;
    expect(&z, 0, "gathers after an unsliced update");
    z.ops[update].p.adamw.zero_slice = slice;
    const int64_t n = z.ops[update].p.adamw.n;
    z.ops[update].p.adamw.n = 2 * slice + 4;
    expect(&z, 0, "an update of more elements than the slices hold");
    z.ops[update].p.adamw.n = n;
    expect(&z, 1, "restored");
    tg_plan_free(&z);

    tg_plan h;
    if (!compile_zero(2, 1, "fp16", &h)) return;
    int updates = 0, scale = 0;
    for (int o = 0; o < h.n_ops; o++) {
        if (tg_op_is_update(h.ops[o].kind)) updates = o;
        if (h.ops[o].kind == TG_OP_LOSS_SCALE_UPDATE) scale = o;
    }
    CHECK(h.ops[h.n_ops - 1].kind == TG_OP_ALL_GATHER && scale > updates, "fp16: loss scale update at %d, update at %d",
          scale, updates);
    expect(&h, 0, "fp16 ZeRO-1");
    tg_plan_free(&h);
}

/* Each of the planner's allocations failing on a ZeRO-1 plan: -1, naming what was being
 * planned, *u left zeroed (no gathers recorded either). */
TG_TEST(test_deferred_update_zero_out_of_memory) {
    tg_plan z;
    if (!compile_zero(2, 1, "fp32", &z)) return;
    tg_deferred_update u;
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(tg_deferred_update_plan(&z, 4, &u, &err) == 1, "%s", err.msg);
    const long made = tg_alloc_fail_after(-1);
    tg_deferred_update_free(&u);
    CHECK(made == 3, "%ld allocations, expected 3", made);
    for (long k = 0; k < made; k++) {
        memset(&err, 0, sizeof err);
        memset(&u, 0x5a, sizeof u);
        tg_alloc_fail_after(k);
        const int rc = tg_deferred_update_plan(&z, 4, &u, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory planning the deferred optimizer update"),
              "allocation %ld failing: rc %d, '%s'", k, rc, err.msg);
        CHECK(u.begin == NULL && u.chunks_before == NULL && u.n_gathers == 0 && u.zero_slice == 0,
              "allocation %ld failing: *u not zeroed", k);
    }
    tg_plan_free(&z);
}

/* The least chunk: n / 16 between 4096 and 2M elements. */
TG_TEST(test_deferred_update_min_chunk) {
    static const int64_t cases[][2] = {{0, 4096},          {4096, 4096},         {16 * 4096, 4096},
                                       {16 * 4097, 4097},  {110000000, 1 << 21}, {16 * (1 << 21), 1 << 21},
                                       {16 * 100000, 100000}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        CHECK(tg_deferred_update_min_chunk(cases[c][0]) == cases[c][1], "n %lld: %lld, expected %lld",
              (long long)cases[c][0], (long long)tg_deferred_update_min_chunk(cases[c][0]), (long long)cases[c][1]);
}

/* `inspect` names the deferred update and its gathers of a ZeRO-1 plan (bf16: the
 * parameters' and the copies'), and says nothing of it for an fp16 one or plain replicas. */
TG_TEST(test_deferred_update_zero_inspect) {
    static const struct {
        int zero;
        const char *precision, *want; /* want: NULL for no line */
    } cases[] = {{1, "bf16", "ZeRO-1 deferred update (CUDA): adamw (op %d) and the gathers (ops %d, %d) run beside"},
                 {1, "fp32", "ZeRO-1 deferred update (CUDA): adamw (op %d) and the gathers (op %d) run beside"},
                 {1, "fp16", NULL},
                 {0, "bf16", NULL}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_plan p;
        if (!compile_zero(2, cases[c].zero, cases[c].precision, &p)) return;
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        tg_err err = {{0}};
        REQUIRE(f, "open_memstream");
        CHECK(tg_plan_inspect(&p, f, 0, &err) == 0, "%s", err.msg);
        fclose(f);
        char want[160] = "ZeRO-1 deferred update";
        if (cases[c].want) {
            const int update = p.n_ops - (strcmp(cases[c].precision, "bf16") ? 2 : 3);
            snprintf(want, sizeof want, cases[c].want, update, update + 1, update + 2);
        }
        const char *at = text ? strstr(text, want) : NULL;
        CHECK(cases[c].want ? at != NULL && strstr(at, "each forward op waits for the chunks it reads\n") : at == NULL,
              "%s, ZeRO %d: '%s' %s", cases[c].precision, cases[c].zero, want, cases[c].want ? "missing" : "printed");
        free(text);
        tg_plan_free(&p);
    }
}

/* The cost model on a GPU: a ZeRO-1 plan's update and its gathers beside the next forward
 * (update_s their ops' time together, part of it hidden), on the CPU none of it. */
TG_TEST(test_deferred_update_zero_cost) {
    tg_plan z;
    if (!compile_zero(2, 1, "bf16", &z)) return;
    const int update = z.n_ops - 3;
    REQUIRE(tg_op_is_update(z.ops[update].kind), "op %d is %s", update, tg_op_name(z.ops[update].kind));
    tg_cost_device d;
    tg_err err = {{0}};
    REQUIRE(tg_cost_device_builtin("h100", z.train.precision, 0, &d, &err) == 0, "%s", err.msg);
    tg_cost_prediction pr;
    REQUIRE(tg_cost_predict(&z, &d, &pr, &err) == 0, "%s", err.msg);
    const double u = pr.ops[update].seconds + pr.ops[update + 1].seconds + pr.ops[update + 2].seconds;
    CHECK(pr.update_s > pr.ops[update].seconds && fabs(pr.update_s - u) <= 1e-12 * u, "update %g, its ops %g",
          pr.update_s, u);
    CHECK(pr.update_hidden_s > 0 && pr.update_hidden_s <= u, "hidden %g of %g", pr.update_hidden_s, u);
    tg_cost_prediction_free(&pr);
    d.cpu = 1;
    REQUIRE(tg_cost_predict(&z, &d, &pr, &err) == 0, "%s", err.msg);
    CHECK(pr.update_s == 0 && pr.step_s == pr.serial_s, "CPU: update %g", pr.update_s);
    tg_cost_prediction_free(&pr);
    tg_plan_free(&z);
}
