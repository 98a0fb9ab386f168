/* Steps with a non-finite gradient (job keys skip_nonfinite, max_skipped_steps): the update
 * ops write nothing and SCHEDULE does not count the step when the norm is NaN or infinite;
 * a trainer step with an infinite weight is skipped with the weights, the optimizer state
 * and the step counter as they were, and the next good step is applied; the CLI stops
 * after more than max_skipped_steps in a row, or at the first with skip_nonfinite = false,
 * and reports skipped steps in the metrics. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/trainer.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

TG_TEST(test_skip_nonfinite_ops) {
    tg_tensor t = {.ndim = 1, .shape = {6}, .dtype = TG_F32, .bytes = 24, .flags = TG_TENSOR_PARAM};
    tg_plan plan = {.n_tensors = 1, .tensors = &t};
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int kind = 0; kind < 2; kind++)
        for (int b = 0; b < 3; b++) {
            tg_op op = tg_test_op(kind ? TG_OP_ADAN : TG_OP_ADAMW);
            op.p.adan = (tg_adan_params){.n = 6, .beta1 = 0.9f, .beta2 = 0.9f, .beta3 = 0.99f, .eps = 1e-8f,
                                         .weight_decay = 0.1f, .max_grad_norm = 1.0f};
            float g[6] = {1, 2, 3, 4, 5, 6}, p[6], m[12], v[12], copy[6], lr = 0.1f, step = 3, norm = bad[b];
            for (int i = 0; i < 12; i++) m[i] = 0.5f * i, v[i] = 0.25f * i;
            for (int i = 0; i < 6; i++) p[i] = (float)i, copy[i] = -1;
            float p0[6], m0[12], v0[12];
            memcpy(p0, p, sizeof p), memcpy(m0, m, sizeof m), memcpy(v0, v, sizeof v);
            tg_cpu_op_args a = {.op = &op, .in = {g, &lr, &step, &norm}, .out = {p, m, v, copy}, .plan = &plan};
            tg_cpu_op_run(&a);
            CHECK(!memcmp(p, p0, sizeof p) && !memcmp(m, m0, sizeof m) && !memcmp(v, v0, sizeof v) && copy[0] == -1,
                  "%s with norm %g wrote", tg_op_name(op.kind), norm);
            norm = 2.0f; /* a finite norm: the update happens */
            tg_cpu_op_run(&a);
            CHECK(memcmp(p, p0, sizeof p) && copy[5] == p[5], "%s with a finite norm did not update", tg_op_name(op.kind));
        }
    /* SCHEDULE counts a step only when the norm it reads is finite, or when it reads none. */
    const struct {
        int with_norm;
        float norm, next;
    } cases[] = {{1, NAN, 4}, {1, INFINITY, 4}, {1, 1e30f, 5}, {1, 0, 5}, {0, NAN, 5}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_op op = tg_test_op(TG_OP_SCHEDULE);
        op.p.schedule.lr = 1.0f, op.p.schedule.warmup = 8;
        float counter = 4, total = 10, norm = cases[k].norm, lr = -1;
        tg_cpu_op_args a = {.op = &op, .in = {&counter, &total, cases[k].with_norm ? &norm : NULL},
                            .out = {&lr, &counter}};
        tg_cpu_op_run(&a);
        CHECK(counter == cases[k].next && lr == 0.5f, "case %zu: counter %g (want %g), lr %g", k, counter,
              cases[k].next, lr);
    }
}

/* A tiny-bert trainer on the CPU. */
static int open_trainer(tg_trainer *tr, tg_plan *plan, const char *const *sets, int n, tg_err *err) {
    tg_job job;
    if (tg_job_load("examples/demo-classify.job", sets, n, &job, err) || tg_compile(&job, plan, err)) return -1;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    return tg_trainer_open(tr, plan, &o, err);
}

static float *read_all(tg_trainer *tr, int tensor) {
    const int64_t n = tg_tensor_numel(&tr->plan->tensors[tensor]);
    float *x = malloc(sizeof *x * (size_t)n);
    tg_err err;
    if (x && tg_trainer_read_f32(tr, tensor, x, &err)) free(x), x = NULL;
    return x;
}

TG_TEST(test_skip_nonfinite_trainer_step) {
    for (int adan = 0; adan < 2; adan++) {
        const char *sets[] = {"steps=6", "batch=4", "seq=16", adan ? "optimizer=adan" : "optimizer=adamw"};
        tg_plan plan;
        tg_trainer tr;
        tg_err err;
        REQUIRE(open_trainer(&tr, &plan, sets, 4, &err) == 0, "%s", err.msg);
        const tg_plan_io *io = &plan.io;
        tg_step_stats s;
        REQUIRE(tg_trainer_step(&tr, &s, &err) == 0 && !s.skipped, "%s", err.msg);
        /* An infinite weight: the loss and every gradient go non-finite. */
        const int64_t n = tg_tensor_numel(&plan.tensors[io->params_all]);
        float *p = read_all(&tr, io->params_all);
        REQUIRE(p, "read");
        const float kept = p[n / 2];
        p[n / 2] = INFINITY;
        REQUIRE(tg_trainer_write(&tr, io->params_all, p, &err) == 0, "%s", err.msg);
        float *m0 = read_all(&tr, io->m_all), *v0 = read_all(&tr, io->v_all), step0 = -1, step1 = -1;
        REQUIRE(m0 && v0 && tg_trainer_read_f32(&tr, io->step, &step0, &err) == 0, "read");
        int rc = tg_trainer_step(&tr, &s, &err);
        CHECK(rc == 0 && s.skipped && !isfinite(s.grad_norm) && s.step == 2 && tr.skipped_steps == 1 &&
                  tr.skipped_in_row == 1,
              "%s: rc %d skipped %d norm %g step %d (%s)", sets[3], rc, s.skipped, s.grad_norm, s.step,
              rc ? err.msg : "");
        float *p1 = read_all(&tr, io->params_all), *m1 = read_all(&tr, io->m_all), *v1 = read_all(&tr, io->v_all);
        REQUIRE(p1 && m1 && v1 && tg_trainer_read_f32(&tr, io->step, &step1, &err) == 0, "read");
        const int64_t state = tg_tensor_numel(&plan.tensors[io->m_all]);
        CHECK(!memcmp(p1, p, sizeof *p * (size_t)n) && !memcmp(m1, m0, sizeof *m0 * (size_t)state) &&
                  !memcmp(v1, v0, sizeof *v0 * (size_t)state) && step1 == step0,
              "%s: the skipped step changed the weights, the state or the counter (%g -> %g)", sets[3], step0, step1);
        /* Put the weight back: the next step is applied and counted. */
        p[n / 2] = kept;
        REQUIRE(tg_trainer_write(&tr, io->params_all, p, &err) == 0, "%s", err.msg);
        rc = tg_trainer_step(&tr, &s, &err);
        float step2 = -1;
        tg_trainer_read_f32(&tr, io->step, &step2, &err);
        float *p2 = read_all(&tr, io->params_all);
        CHECK(rc == 0 && !s.skipped && isfinite(s.loss) && tr.skipped_in_row == 0 && tr.skipped_steps == 1 &&
                  step2 == step0 + 1 && p2 && memcmp(p2, p, sizeof *p * (size_t)n),
              "%s: the step after: rc %d skipped %d counter %g", sets[3], rc, s.skipped, step2);
        free(p), free(p1), free(p2), free(m0), free(m1), free(v0), free(v1);
        tg_trainer_close(&tr);
        tg_plan_free(&plan);
    }
}

static int count_skipped_lines(const char *path, int *lines) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[4096];
    int skipped = 0;
    *lines = 0;
    while (fgets(buf, sizeof buf, f)) {
        json_t *o = json_loads(buf, 0, NULL);
        if (o && json_object_get(o, "step")) {
            ++*lines;
            skipped += json_is_true(json_object_get(o, "skipped"));
        }
        json_decref(o);
    }
    fclose(f);
    return skipped;
}

/* lr = 1e30: the first step is applied and wrecks the weights, every later one is skipped. */
TG_TEST(test_skip_nonfinite_cli_runs) {
    const char *dir = tg_test_tmpdir();
    char line[1600], metrics[600];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    /* Within the limit: the run ends, 3 of 4 steps skipped. */
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --device cpu --set steps=4 --set batch=4 --set seq=16 --set lr=1e30 --set warmup_steps=0 "
             "--set max_skipped_steps=3 --metrics %s",
             metrics);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    int lines = 0;
    CHECK(r.status == 0 && count_skipped_lines(metrics, &lines) == 3 && lines == 4, "status %d, %d lines: %s",
          r.status, lines, r.err ? r.err : "");
    json_t *root = NULL;
    {
        FILE *f = fopen(metrics, "r");
        char buf[8192];
        while (f && fgets(buf, sizeof buf, f)) {
            json_t *o = json_loads(buf, 0, NULL);
            if (o && json_is_true(json_object_get(o, "summary"))) json_decref(root), root = o;
            else json_decref(o);
        }
        if (f) fclose(f);
    }
    CHECK(root && json_integer_value(json_object_get(root, "skipped_steps")) == 3, "summary skipped_steps");
    json_decref(root);
    tg_cli_run_free(&r);
    /* One more than the limit in a row: stops with the count. */
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --device cpu --set steps=6 --set batch=4 --set seq=16 --set lr=1e30 --set warmup_steps=0 "
             "--set max_skipped_steps=2 --metrics %s",
             metrics);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && r.err &&
              strstr(r.err, "step 4: 3 steps in a row had a non-finite gradient norm and were skipped "
                            "(max_skipped_steps = 2); the weights are those from before them"),
          "status %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    /* skip_nonfinite = false: stops at the first, nothing applied. */
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --device cpu --set steps=6 --set batch=4 --set seq=16 --set lr=1e30 --set warmup_steps=0 "
             "--set skip_nonfinite=false --metrics %s",
             metrics);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && r.err && strstr(r.err, "step 2: the gradient norm is ") &&
              strstr(r.err, "diverged; the step was not applied, and skip_nonfinite = false stops here"),
          "status %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* The keys: defaults, values, and run keys a compiled plan takes. */
TG_TEST(test_skip_nonfinite_job_keys) {
    static tg_job job;
    tg_err err;
    const char *base = "model = tiny-bert\nsteps = 2\ntrain_data = t.jsonl\n";
    REQUIRE(tg_job_parse_text(base, "j.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    CHECK(job.skip_nonfinite == 1 && job.max_skipped_steps == 10, "defaults %d %d", job.skip_nonfinite,
          job.max_skipped_steps);
    const char *sets[] = {"skip_nonfinite=false", "max_skipped_steps=0"};
    REQUIRE(tg_job_parse_text(base, "j.job", NULL, sets, 2, &job, &err) == 0, "%s", err.msg);
    CHECK(job.skip_nonfinite == 0 && job.max_skipped_steps == 0, "set %d %d", job.skip_nonfinite,
          job.max_skipped_steps);
    const char *bad[] = {"max_skipped_steps=-1"};
    CHECK(tg_job_parse_text(base, "j.job", NULL, bad, 1, &job, &err) == -1 && strstr(err.msg, "max_skipped_steps"),
          "%s", err.msg);
    tg_plan_run run;
    memset(&run, 0, sizeof run);
    run.steps = 5, run.log_every = 1, run.max_skipped_steps = 10, run.skip_nonfinite = 1;
    const char *on_plan[] = {"skip_nonfinite=0", "max_skipped_steps=4"};
    REQUIRE(tg_job_apply_run_overrides(&run, 1, on_plan, 2, "p.tgp", &err) == 0, "%s", err.msg);
    CHECK(run.skip_nonfinite == 0 && run.max_skipped_steps == 4 && run.steps == 5, "run %d %d %d", run.skip_nonfinite,
          run.max_skipped_steps, run.steps);
}
