/* Learning-rate schedules (job key lr_schedule, SCHEDULE's form): the CPU reference
 * against the rates Hugging Face's get_{linear,cosine,constant}_schedule_with_warmup give
 * (tests/golden/data/lr_schedules.json, from tests/golden/lr_schedules.py), the job key,
 * the plan check, and a run's per-step rates through the public library. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/job.h"
#include "include/tunegraph.h"
#include "kernels/lr_schedule.h"
#include "plan/op_meta.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

#define GOLDEN "tests/golden/data/lr_schedules.json"

static int form_of(const char *name) {
    for (int f = 0; f < TG_LR_SCHEDULE_COUNT; f++)
        if (!strcmp(name, tg_lr_schedule_name(f))) return f;
    return -1;
}

/* SCHEDULE on the CPU after `step` completed updates: the rate, and the counter it leaves. */
static float cpu_rate(int form, float peak, int warmup, float step, float total, float *next) {
    tg_op op = tg_test_op(TG_OP_SCHEDULE);
    op.p.schedule.warmup = warmup, op.p.schedule.lr = peak, op.p.schedule.form = form;
    float counter = step, lr = NAN;
    *next = NAN;
    tg_cpu_op_args a = {.op = &op, .in = {&counter, &total}, .out = {&lr, &counter}};
    tg_cpu_op_run(&a);
    *next = counter;
    return lr;
}

/* Each HF rate, as float32, within float32 rounding: the plan holds the peak rate as a
 * float, HF as a double, so the two products may round one ulp apart. */
TG_TEST(test_lr_schedule_matches_hf_schedules) {
    json_error_t jerr;
    json_t *root = json_load_file(GOLDEN, 0, &jerr);
    REQUIRE(root, "%s: %s (line %d)", GOLDEN, jerr.text, jerr.line);
    json_t *cases = json_object_get(root, "cases");
    REQUIRE(json_is_array(cases) && json_array_size(cases) == 21, "%s: want 21 cases", GOLDEN);
    int seen[TG_LR_SCHEDULE_COUNT] = {0}, rates = 0, warm_zero = 0, past_end = 0;
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *name = json_string_value(json_object_get(c, "schedule"));
        const int form = name ? form_of(name) : -1;
        const double peak = json_number_value(json_object_get(c, "lr"));
        const int warmup = (int)json_integer_value(json_object_get(c, "warmup"));
        const int total = (int)json_integer_value(json_object_get(c, "total"));
        json_t *want = json_object_get(c, "rates");
        REQUIRE(form >= 0 && json_is_array(want) && (int)json_array_size(want) == total + 3, "case %zu", i);
        seen[form]++;
        for (int k = 0; k < total + 3; k++) {
            const double hf = json_number_value(json_array_get(want, (size_t)k));
            float next;
            const float got = cpu_rate(form, (float)peak, warmup, (float)k, (float)total, &next);
            CHECK(fabs(got - hf) <= 1.2e-7 * fabs(hf) && next == (float)(k + 1),
                  "%s lr %g warmup %d total %d, after %d updates: %.9g, HF %.9g (counter %g)", name, peak, warmup,
                  total, k, got, hf, next);
            rates++;
            warm_zero += k == 0 && warmup > 0 && got == 0.0f;
            past_end += k > total && form == TG_LR_LINEAR && got == 0.0f;
        }
    }
    for (int f = 0; f < TG_LR_SCHEDULE_COUNT; f++) CHECK(seen[f] == 7, "%d %s cases", seen[f], tg_lr_schedule_name(f));
    CHECK(rates == 21 * 3 + 3 * (10 + 17 + 100 + 7 + 1 + 13 + 1000), "%d rates", rates);
    CHECK(warm_zero == 15 && past_end == 14, "%d warm-ups from 0, %d rates past the end at 0", warm_zero, past_end);
    json_decref(root);
}

/* The shapes' defining points, exactly: the cosine's half-way point is half the rate, its
 * end 0, and past the end it climbs again as HF's does (its cosine only stops below 0;
 * a run never goes there); constant stays at the peak; an unknown form is the linear one
 * (the plan check refuses it first). */
TG_TEST(test_lr_schedule_shape_points) {
    float next;
    CHECK(cpu_rate(TG_LR_COSINE, 1.0f, 2, 7, 12, &next) == 0.5f, "cosine half way");
    CHECK(cpu_rate(TG_LR_COSINE, 1.0f, 2, 2, 12, &next) == 1.0f, "cosine at the warm-up's end");
    CHECK(cpu_rate(TG_LR_COSINE, 1.0f, 2, 1, 12, &next) == 0.5f, "cosine inside the warm-up");
    CHECK(cpu_rate(TG_LR_COSINE, 1.0f, 2, 12, 12, &next) == 0.0f, "cosine at the end");
    CHECK(cpu_rate(TG_LR_COSINE, 1.0f, 0, 18, 12, &next) == 0.5f, "cosine past the end");
    CHECK(cpu_rate(TG_LR_COSINE, 1.0f, 0, 3, 12, &next) == (float)(0.5 * (1 + cos(M_PI * 0.25))), "cosine quarter");
    CHECK(cpu_rate(TG_LR_CONSTANT, 0.25f, 4, 2, 12, &next) == 0.125f, "constant inside the warm-up");
    CHECK(cpu_rate(TG_LR_CONSTANT, 0.25f, 4, 4, 12, &next) == 0.25f, "constant after it");
    CHECK(cpu_rate(TG_LR_CONSTANT, 0.25f, 0, 50, 12, &next) == 0.25f, "constant past the end");
    CHECK(cpu_rate(TG_LR_LINEAR, 1.0f, 2, 7, 12, &next) == 0.5f, "linear half way");
    CHECK(cpu_rate(TG_LR_LINEAR, 1.0f, 2, 14, 12, &next) == 0.0f, "linear past the end");
    CHECK(tg_lr_multiplier(7, 7, 12, 2) == 0.5, "an unknown form");
    CHECK(!strcmp(tg_lr_schedule_name(TG_LR_LINEAR), "linear") && !strcmp(tg_lr_schedule_name(TG_LR_COSINE), "cosine") &&
              !strcmp(tg_lr_schedule_name(TG_LR_CONSTANT), "constant") && !strcmp(tg_lr_schedule_name(3), "?") &&
              !strcmp(tg_lr_schedule_name(-1), "?"),
          "names");
}

/* The job key: each name, the default, and a clear error for anything else. */
TG_TEST(test_lr_schedule_job_key) {
    static tg_job job;
    tg_err err;
    tg_job_defaults(&job);
    CHECK(job.lr_schedule == TG_LR_LINEAR, "default %d", job.lr_schedule);
    const char *names[] = {"linear", "cosine", "constant"};
    for (int f = 0; f < 3; f++) {
        char set[40];
        snprintf(set, sizeof set, "lr_schedule=%s", names[f]);
        const char *sets[] = {set};
        tg_job_defaults(&job);
        REQUIRE(tg_job_parse_text("model = tiny-bert\nsteps = 2\ntrain_data = t.jsonl\n", "j.job", NULL, sets, 1,
                                  &job, &err) == 0,
                "%s", err.msg);
        CHECK(job.lr_schedule == f && job.key_line[TG_JOB_LR_SCHEDULE] == -1, "%s: form %d", names[f],
              job.lr_schedule);
    }
    CHECK(tg_job_parse_text("model = tiny-bert\nsteps = 2\nlr_schedule = cosine_with_restarts\n", "j.job", NULL, NULL,
                            0, &job, &err) == -1 &&
              strstr(err.msg, "j.job:3: key 'lr_schedule': 'cosine_with_restarts'") &&
              strstr(err.msg, "linear") && strstr(err.msg, "cosine") && strstr(err.msg, "constant"),
          "%s", err.msg);
}

/* The plan check refuses a form past the list and a negative warm-up. */
TG_TEST(test_lr_schedule_plan_check) {
    tg_tensor t[2] = {{.dtype = TG_F32, .ndim = 1, .shape = {1}}, {.dtype = TG_F32, .ndim = 1, .shape = {1}}};
    tg_op_check_ctx c = {.tensors = t, .n_tensors = 2};
    tg_op op = tg_test_op(TG_OP_SCHEDULE);
    op.in[0] = 0, op.in[1] = 1, op.out[0] = 1, op.out[1] = 0;
    char why[200];
    for (int form = -1; form <= TG_LR_SCHEDULE_COUNT; form++) {
        op.p.schedule.form = form;
        why[0] = 0;
        const int rc = tg_op_check(&c, &op, why, sizeof why);
        const int ok = form >= 0 && form < TG_LR_SCHEDULE_COUNT;
        CHECK(ok ? rc == 0 : rc == -1 && strstr(why, "schedule: not 0 (linear), 1 (cosine) or 2 (constant)"),
              "form %d: %d %s", form, rc, why);
    }
    op.p.schedule.form = 0, op.p.schedule.warmup = -1;
    CHECK(tg_op_check(&c, &op, why, sizeof why) == -1 && strstr(why, "warmup"), "warmup -1: %s", why);
}

typedef struct seen_rates {
    int n;
    double lr[8];
} seen_rates;

static void note_rate(void *ctx, const tunegraph_step_metrics *m) {
    seen_rates *s = ctx;
    if (s->n < 8) s->lr[s->n++] = m->lr;
}

/* A compiled job's steps use the cosine rates, through the public library on the CPU. */
TG_TEST(test_lr_schedule_cosine_run) {
    tunegraph_plan *plan = NULL;
    const char *sets[] = {"steps=6", "batch=2", "seq=16", "lr=1e-3", "warmup_steps=2", "lr_schedule=cosine"};
    REQUIRE(tunegraph_compile_text("model = tiny-bert\ntrain_data = data/sentiment-train.jsonl\n", "examples/", sets, 6,
                                   &plan) == 0,
            "%s", tunegraph_last_error());
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    REQUIRE(tunegraph_trainer_open(plan, &o, &tr) == 0, "%s", tunegraph_last_error());
    tunegraph_plan_free(plan);
    seen_rates s = {0};
    CHECK(tunegraph_trainer_train(tr, note_rate, &s) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    REQUIRE(s.n == 6, "%d steps", s.n);
    for (int k = 0; k < 6; k++) {
        const float want = (float)((double)1e-3f * (k < 2 ? k / 2.0 : 0.5 * (1 + cos(M_PI * (k - 2) / 4.0))));
        CHECK((float)s.lr[k] == want, "step %d: lr %.9g, want %.9g", k + 1, s.lr[k], want);
    }
}
