/* The Adan optimizer (job key optimizer = adan, the ADAN op): the CPU reference against a
 * float64 Python implementation of the paper's update (tests/golden/adan_reference.py,
 * tests/golden/data/adan_reference.json) over several steps, alone, on 3 threads and as
 * two ZeRO-1 replicas' slices; the job keys and their optimizer defaults; the compiled
 * plan (op, state size, checks); and training through the public library. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "include/tunegraph.h"
#include "plan/op_meta.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/cpu/threadpool.h"
#include "tests/harness.h"

#define GOLDEN "tests/golden/data/adan_reference.json"
#define NE 40 /* the reference's parameter elements */

static void read_vec(json_t *a, float *out) {
    for (int i = 0; i < NE; i++) out[i] = (float)json_number_value(json_array_get(a, (size_t)i));
}

/* |got - want| over the vector, relative to |want| (L2), and the largest element error
 * relative to max(|want_i|, 1e-3): float32 against float64. */
static int close_vec(const float *got, const float *want, const char *what, const char *name, int step) {
    const double rel = tg_rel_err(got, want, NE);
    double worst = 0;
    int at = 0;
    for (int i = 0; i < NE; i++) {
        const double e = fabs((double)got[i] - want[i]) / fmax(fabs(want[i]), 1e-3);
        if (e > worst || isnan(got[i])) worst = isnan(got[i]) ? INFINITY : e, at = i;
    }
    return CHECK(rel <= 1e-5 && worst <= 1e-4, "%s, step %d: %s relative error %.3g, element %d off by %.3g (%.9g, want %.9g)",
                 name, step, what, rel, at, worst, got[at], want[at]);
}

/* The plan's tensor table for one reference case: its parameters, and a whole-pool view
 * (which the update skips). */
static int case_tensors(json_t *c, tg_tensor *tt) {
    json_t *ts = json_object_get(c, "tensors");
    const int n = (int)json_array_size(ts);
    memset(tt, 0, sizeof(tg_tensor) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) {
        json_t *x = json_array_get(ts, (size_t)i);
        const int64_t first = json_integer_value(json_array_get(x, 0)), count = json_integer_value(json_array_get(x, 1));
        tt[i].ndim = 1, tt[i].shape[0] = count, tt[i].dtype = TG_F32, tt[i].offset = (uint64_t)first * 4;
        tt[i].bytes = (uint64_t)count * 4;
        tt[i].flags = TG_TENSOR_PARAM | (json_integer_value(json_array_get(x, 2)) ? 0 : TG_TENSOR_NO_DECAY);
    }
    tt[n].ndim = 1, tt[n].shape[0] = NE, tt[n].dtype = TG_F32, tt[n].bytes = NE * 4;
    tt[n].flags = TG_TENSOR_PARAM | TG_TENSOR_VIEW;
    return n + 1;
}

/* Runs every step of a case on replicas of `slice` elements (0: one, all elements), each
 * replica with its own state, and compares after each step. */
static void run_case(json_t *c, int slice, tg_threadpool *tp) {
    const char *name = json_string_value(json_object_get(c, "name"));
    tg_tensor tt[8];
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = case_tensors(c, tt), plan.tensors = tt;
    tg_op op = tg_test_op(TG_OP_ADAN);
    op.p.adan = (tg_adan_params){.n = NE,
                                 .zero_slice = slice,
                                 .beta1 = (float)json_number_value(json_object_get(c, "beta1")),
                                 .beta2 = (float)json_number_value(json_object_get(c, "beta2")),
                                 .eps = (float)json_number_value(json_object_get(c, "eps")),
                                 .weight_decay = (float)json_number_value(json_object_get(c, "weight_decay")),
                                 .max_grad_norm = (float)json_number_value(json_object_get(c, "max_grad_norm")),
                                 .beta3 = (float)json_number_value(json_object_get(c, "beta3")),
                                 .no_prox = json_integer_value(json_object_get(c, "no_prox"))};
    const int replicas = slice ? (NE + slice - 1) / slice : 1, S = slice ? slice : NE;
    float p[NE], copy[NE], state[2][2][2 * NE]; /* [replica][out1/out2][2 S] */
    read_vec(json_object_get(c, "params"), p);
    memset(state, 0, sizeof state);
    json_t *steps = json_object_get(c, "steps");
    size_t k;
    json_t *st;
    json_array_foreach(steps, k, st) {
        float g[NE], want[5][NE], lr = (float)json_number_value(json_object_get(st, "lr"));
        float t = (float)json_integer_value(json_object_get(st, "t")), norm = (float)json_number_value(json_object_get(st, "norm"));
        read_vec(json_object_get(st, "grads"), g);
        const char *keys[5] = {"params", "m", "d", "v", "g_prev"};
        for (int v = 0; v < 5; v++) read_vec(json_object_get(st, keys[v]), want[v]);
        for (int i = 0; i < NE; i++) copy[i] = -7.0f;
        for (int r = 0; r < replicas; r++) {
            atomic_int oom = 0;
            tg_cpu_op_args a = {.op = &op, .in = {g, &lr, &t, &norm}, .out = {p, state[r][0], state[r][1], copy},
                                .plan = &plan, .threads = tp, .rank = r, .out_of_memory = &oom};
            tg_cpu_op_run(&a);
            CHECK(!oom, "out of memory");
        }
        /* The replicas' state slices, back in element order. */
        float got[4][NE];
        for (int i = 0; i < NE; i++) {
            const int r = i / S, j = i % S;
            got[0][i] = state[r][0][j], got[1][i] = state[r][0][S + j];
            got[2][i] = state[r][1][j], got[3][i] = state[r][1][S + j];
        }
        char what[96];
        snprintf(what, sizeof what, "%s (slice %d, %s)", name, slice, tp ? "3 threads" : "1 thread");
        const int step = (int)k + 1;
        close_vec(p, want[0], "params", what, step);
        for (int v = 0; v < 4; v++) close_vec(got[v], want[v + 1], keys[v + 1], what, step);
        int copies = 1;
        for (int i = 0; i < NE; i++) {
            int member = 0;
            for (int x = 0; x < plan.n_tensors - 1; x++)
                member |= i * 4 >= (int)tt[x].offset && i * 4 < (int)(tt[x].offset + tt[x].bytes);
            copies &= member ? copy[i] == p[i] : copy[i] == -7.0f && p[i] == want[0][i];
        }
        CHECK(copies, "%s step %d: the copies are not the updated parameters, or a gap changed", what, step);
    }
}

TG_TEST(test_adan_matches_python_reference) {
    json_error_t jerr;
    json_t *root = json_load_file(GOLDEN, 0, &jerr);
    REQUIRE(root, "%s: %s (line %d)", GOLDEN, jerr.text, jerr.line);
    json_t *cases = json_object_get(root, "cases");
    REQUIRE(json_array_size(cases) == 3, "%s: 3 cases", GOLDEN);
    tg_threadpool *tp = tg_threadpool_create(3);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        run_case(c, 0, NULL);
        run_case(c, 0, tp);
        run_case(c, 24, NULL); /* two replicas: elements [0, 24) and [24, 40) */
    }
    tg_threadpool_destroy(tp);
    json_decref(root);
}

/* The first step takes the previous gradient as the gradient: d stays 0 and v sees g^2. */
TG_TEST(test_adan_first_step_has_no_difference) {
    tg_tensor t = {.ndim = 1, .shape = {4}, .dtype = TG_F32, .bytes = 16, .flags = TG_TENSOR_PARAM};
    tg_plan plan = {.n_tensors = 1, .tensors = &t};
    tg_op op = tg_test_op(TG_OP_ADAN);
    op.p.adan = (tg_adan_params){.n = 4, .beta1 = 0.98f, .beta2 = 0.92f, .beta3 = 0.99f, .eps = 1e-8f};
    float p[4] = {1, 2, 3, 4}, g[4] = {0.5f, -1, 2, 0}, md[8], vg[8], lr = 0.1f, step = 1, norm = 0;
    for (int i = 0; i < 8; i++) md[i] = 0, vg[i] = 99.0f; /* a stale previous gradient: ignored at t = 1 */
    for (int i = 0; i < 4; i++) vg[i] = 0;
    tg_cpu_op_args a = {.op = &op, .in = {g, &lr, &step, &norm}, .out = {p, md, vg}, .plan = &plan};
    tg_cpu_op_run(&a);
    for (int i = 0; i < 4; i++) {
        const float m = g[i] * (1.0f - 0.98f), v = g[i] * g[i] * (1.0f - 0.99f);
        CHECK(md[i] == m && md[4 + i] == 0.0f && vg[i] == v && vg[4 + i] == g[i],
              "element %d: m %.9g d %.9g v %.9g g_prev %.9g (want %.9g 0 %.9g %.9g)", i, md[i], md[4 + i], vg[i],
              vg[4 + i], m, v, g[i]);
    }
    CHECK(p[3] == 4.0f && p[0] < 1.0f && p[1] > 2.0f, "p %g %g %g %g", p[0], p[1], p[2], p[3]);
}

/* Job keys: adan's default betas, beta3 and no_prox; both refused with adamw. */
TG_TEST(test_adan_job_keys) {
    static tg_job job;
    tg_err err;
    const char *base = "model = tiny-bert\nsteps = 2\ntrain_data = t.jsonl\n";
    const char *adan[] = {"optimizer=adan"};
    REQUIRE(tg_job_parse_text(base, "j.job", NULL, adan, 1, &job, &err) == 0, "%s", err.msg);
    CHECK(job.optimizer == TG_OPTIMIZER_ADAN && job.beta1 == 0.98f && job.beta2 == 0.92f && job.beta3 == 0.99f &&
              job.no_prox == 0,
          "adan defaults: %g %g %g %d", job.beta1, job.beta2, job.beta3, job.no_prox);
    const char *given[] = {"optimizer=adan", "beta1=0.9", "beta3=0.999", "no_prox=true"};
    REQUIRE(tg_job_parse_text(base, "j.job", NULL, given, 4, &job, &err) == 0, "%s", err.msg);
    CHECK(job.beta1 == 0.9f && job.beta2 == 0.92f && job.beta3 == 0.999f && job.no_prox == 1, "given: %g %g %g %d",
          job.beta1, job.beta2, job.beta3, job.no_prox);
    REQUIRE(tg_job_parse_text(base, "j.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    CHECK(job.optimizer == TG_OPTIMIZER_ADAMW && job.beta1 == 0.9f && job.beta2 == 0.999f, "adamw defaults: %g %g",
          job.beta1, job.beta2);
    /* Back to adamw on the command line: AdamW's defaults again. */
    const char *back[] = {"optimizer=adamw"};
    REQUIRE(tg_job_parse_text("model = tiny-bert\nsteps = 2\ntrain_data = t.jsonl\noptimizer = adan\n", "j.job", NULL,
                              back, 1, &job, &err) == 0,
            "%s", err.msg);
    CHECK(job.beta1 == 0.9f && job.beta2 == 0.999f, "back to adamw: %g %g", job.beta1, job.beta2);
    CHECK(tg_job_parse_text("model = tiny-bert\nsteps = 2\ntrain_data = t.jsonl\nbeta3 = 0.9\n", "j.job", NULL, NULL, 0,
                            &job, &err) == -1 &&
              !strcmp(err.msg, "j.job:4: key 'beta3': only meaningful for optimizer = adan (optimizer is adamw, j.job "
                               "(default))"),
          "%s", err.msg);
    const char *np[] = {"no_prox=1"};
    CHECK(tg_job_parse_text(base, "j.job", NULL, np, 1, &job, &err) == -1 &&
              !strcmp(err.msg, "--set: key 'no_prox': only meaningful for optimizer = adan (optimizer is adamw, j.job "
                               "(default))"),
          "%s", err.msg);
    const char *bad[] = {"optimizer=adan", "beta3=1"};
    CHECK(tg_job_parse_text(base, "j.job", NULL, bad, 2, &job, &err) == -1 &&
              strstr(err.msg, "key 'beta3': 1 is out of range (must be in [0, 1))"),
          "%s", err.msg);
}

/* The compiled plan: one ADAN op with the job's values, state of four vectors (twice
 * AdamW's optimizer pool), and the op check's refusals. */
TG_TEST(test_adan_plan) {
    tg_plan plans[2];
    tg_err err;
    for (int k = 0; k < 2; k++) {
        static tg_job job;
        const char *sets[] = {k ? "optimizer=adan" : "optimizer=adamw", "beta3=0.995", "no_prox=true"};
        REQUIRE(tg_job_parse_text("model = tiny-bert\nsteps = 2\nseq = 16\ntrain_data = t.jsonl\n", "j.job", NULL, sets, k ? 3 : 1,
                                  &job, &err) == 0,
                "%s", err.msg);
        REQUIRE(tg_compile(&job, &plans[k], &err) == 0, "%s", err.msg);
    }
    const tg_plan *p = &plans[1];
    const tg_op *last = &p->ops[p->n_ops - 1];
    REQUIRE(last->kind == TG_OP_ADAN, "the last op is %s", tg_op_name(last->kind));
    const int64_t n = last->p.adan.n;
    CHECK(n == plans[0].ops[plans[0].n_ops - 1].p.adamw.n && last->p.adan.beta1 == 0.98f &&
              last->p.adan.beta2 == 0.92f && last->p.adan.beta3 == 0.995f && last->p.adan.no_prox == 1 &&
              last->p.adan.weight_decay == 0.01f && last->p.adan.max_grad_norm == 1.0f,
          "adan params");
    CHECK(tg_tensor_numel(&p->tensors[p->io.m_all]) == 2 * n && tg_tensor_numel(&p->tensors[p->io.v_all]) == 2 * n,
          "state views %lld %lld for %lld parameters", (long long)tg_tensor_numel(&p->tensors[p->io.m_all]),
          (long long)tg_tensor_numel(&p->tensors[p->io.v_all]), (long long)n);
    CHECK(p->pool_bytes[TG_POOL_OPTIM] - plans[0].pool_bytes[TG_POOL_OPTIM] == (uint64_t)(2 * n * 4),
          "optim pool %llu, adamw's %llu",
          (unsigned long long)p->pool_bytes[TG_POOL_OPTIM], (unsigned long long)plans[0].pool_bytes[TG_POOL_OPTIM]);
    tg_op_check_ctx c = {.tensors = p->tensors, .n_tensors = p->n_tensors, .replicas = 1};
    char why[200];
    CHECK(tg_op_check(&c, last, why, sizeof why) == 0, "%s", why);
    tg_op bad = *last;
    bad.out[1] = plans[0].io.m_all; /* an index past AdamW's m: any tensor of n elements */
    for (int t = 0; t < p->n_tensors; t++)
        if (tg_tensor_numel(&p->tensors[t]) == n && p->tensors[t].dtype == TG_F32) bad.out[1] = t;
    CHECK(tg_op_check(&c, &bad, why, sizeof why) == -1 && strstr(why, "out[1]: m and d != 2 x zero_slice (or n)"), "%s",
          why);
    bad = *last;
    bad.p.adan.no_prox = 2;
    CHECK(tg_op_check(&c, &bad, why, sizeof why) == -1 && strstr(why, "no_prox: not 0 or 1"), "%s", why);
    tg_plan_free(&plans[0]), tg_plan_free(&plans[1]);
}

typedef struct losses {
    int n;
    double loss[70];
} losses;

static void note_loss(void *ctx, const tunegraph_step_metrics *m) {
    losses *l = ctx;
    if (l->n < 70) l->loss[l->n++] = m->loss;
}

/* Training the example job (examples/demo-classify.job) with Adan through the public library on the CPU learns it
 * (at 1e-2: Adan's heavier averaging of the gradient wants a larger rate than AdamW's
 * 1e-3 there), from a plan saved and loaded again (the loaded-plan checks pass). */
TG_TEST(test_adan_trains) {
    tunegraph_plan *plan = NULL;
    const char *sets[] = {"steps=70", "lr=1e-2", "optimizer=adan", "lr_schedule=constant"};
    REQUIRE(tunegraph_compile_file("examples/demo-classify.job", sets, 4, &plan) == 0, "%s", tunegraph_last_error());
    char path[600];
    snprintf(path, sizeof path, "%s/adan.tgp", tg_test_tmpdir());
    REQUIRE(tunegraph_plan_save(plan, path) == 0, "%s", tunegraph_last_error());
    tunegraph_plan_free(plan);
    REQUIRE(tunegraph_plan_load(path, &plan) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    REQUIRE(tunegraph_trainer_open(plan, &o, &tr) == 0, "%s", tunegraph_last_error());
    tunegraph_plan_free(plan);
    losses l = {0};
    CHECK(tunegraph_trainer_train(tr, note_loss, &l) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    REQUIRE(l.n == 70, "%d steps", l.n);
    double first = 0, last = 0;
    for (int i = 0; i < 10; i++) first += l.loss[i] / 10, last += l.loss[60 + i] / 10;
    for (int i = 0; i < 70; i++) CHECK(isfinite(l.loss[i]), "step %d loss %g", i + 1, l.loss[i]);
    CHECK(last < first - 0.3, "mean loss of the first 10 steps %.4f, of the last 10 %.4f", first, last);
}

/* The refusal of Adan's keys with AdamW names a job file with a long path in full. */
TG_TEST(test_adan_keys_refused_with_long_job_path) {
    static tg_job job;
    tg_err err;
    char name[400];
    memset(name, 0, sizeof name);
    for (int i = 0; i < 300; i++) name[i] = i % 10 == 9 ? '/' : 'd';
    strcat(name, "j.job");
    CHECK(tg_job_parse_text("model = tiny-bert\nsteps = 2\ntrain_data = t.jsonl\nno_prox = true\n", name, NULL, NULL,
                            0, &job, &err) == -1,
          "accepted");
    char want[800];
    snprintf(want, sizeof want, "%s:4: key 'no_prox': only meaningful for optimizer = adan (optimizer is adamw, %s (default))",
             name, name);
    CHECK(!strcmp(err.msg, want), "%s", err.msg);
}
