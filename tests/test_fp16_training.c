/* precision = fp16 with dynamic loss scaling: the plan (fp16 activations and weight copies,
 * the scale and its tracker as optimizer state, the scaled loss seed, the unscaled norm and
 * update, LOSS_SCALE_UPDATE after the update), the update rule as torch.amp.GradScaler's,
 * training on the CPU reference close to fp32, an overflowing step skipped with every
 * weight and state bit unchanged and the scale backed off, the job keys, and the
 * checkpointed scale. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/op_meta.h"
#include "plan/validate.h"
#include "runtime/cpu/cpu_kernels.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* GradScaler.update: growth after growth_interval finite steps in a row, backoff and a
 * fresh count on an overflow (inf or NaN), the tracker counting in between. */
TG_TEST(test_fp16_loss_scale_update_rule) {
    tg_op op = tg_test_op(TG_OP_LOSS_SCALE_UPDATE);
    op.p.loss_scale = (tg_loss_scale_params){.growth_factor = 2.0f, .backoff_factor = 0.5f, .growth_interval = 3};
    float scale = 1024.0f, tracker = 0.0f;
    const float norms[] = {1.0f, 2.0f, 0.5f, 3.0f, INFINITY, 1.0f, NAN, 1.0f, 1.0f, 1.0f, -INFINITY};
    const float want_scale[] = {1024, 1024, 2048, 2048, 1024, 1024, 512, 512, 512, 1024, 512};
    const float want_tracker[] = {1, 2, 0, 1, 0, 1, 0, 1, 2, 0, 0};
    for (size_t k = 0; k < sizeof norms / sizeof norms[0]; k++) {
        float norm = norms[k];
        tg_cpu_op_args a = {.op = &op, .in = {&norm, &scale, &tracker}, .out = {&scale, &tracker}};
        tg_cpu_op_run(&a);
        CHECK(scale == want_scale[k] && tracker == want_tracker[k], "step %zu (norm %g): scale %g tracker %g, want %g %g",
              k, norms[k], scale, tracker, want_scale[k], want_tracker[k]);
    }
    /* growth_interval 1 grows at every finite step. */
    op.p.loss_scale.growth_interval = 1;
    scale = 8.0f, tracker = 0.0f;
    float norm = 1.0f;
    tg_cpu_op_args a = {.op = &op, .in = {&norm, &scale, &tracker}, .out = {&scale, &tracker}};
    tg_cpu_op_run(&a);
    tg_cpu_op_run(&a);
    CHECK(scale == 32.0f && tracker == 0.0f, "interval 1: scale %g tracker %g", scale, tracker);
}

/* FILL scales its value by its optional input; GRAD_NORM divides by its; the update ops
 * take 1 / scale as the gradients' factor: the same update as unscaled gradients. */
TG_TEST(test_fp16_scaled_ops) {
    tg_op fill = tg_test_op(TG_OP_FILL);
    fill.p.fill.value = 0.25f;
    float y[3] = {0}, scale = 4096.0f;
    tg_cpu_op_args a = {.op = &fill, .in = {&scale}, .out = {y}, .out_numel = {3}};
    tg_cpu_op_run(&a);
    CHECK(y[0] == 1024.0f && y[2] == 1024.0f, "FILL with a scale: %g", y[0]);
    a.in[0] = NULL;
    tg_cpu_op_run(&a);
    CHECK(y[1] == 0.25f, "FILL without: %g", y[1]);

    tg_tensor t = {.ndim = 1, .shape = {6}, .dtype = TG_F32, .bytes = 24, .flags = TG_TENSOR_PARAM | TG_TENSOR_VIEW};
    tg_tensor p_t = {.ndim = 1, .shape = {6}, .dtype = TG_F32, .bytes = 24, .flags = TG_TENSOR_PARAM};
    tg_plan plan = {.n_tensors = 1, .tensors = &t};
    tg_op gn = tg_test_op(TG_OP_GRAD_NORM);
    gn.in[0] = 0;
    gn.p.count.n = 6;
    float g[6] = {3, 4, 0, 0, 12, 0}, norm = -1;
    for (int i = 0; i < 6; i++) g[i] *= scale;
    tg_cpu_op_args an = {.op = &gn, .in = {g, &scale}, .out = {&norm}, .plan = &plan};
    tg_cpu_op_run(&an);
    CHECK(norm == 13.0f, "GRAD_NORM unscaled: %g", norm);

    plan.tensors = &p_t;
    for (int kind = 0; kind < 2; kind++) {
        tg_op op = tg_test_op(kind ? TG_OP_ADAN : TG_OP_ADAMW);
        op.p.adan = (tg_adan_params){.n = 6, .beta1 = 0.9f, .beta2 = 0.99f, .beta3 = 0.99f, .eps = 1e-8f,
                                     .weight_decay = 0.1f, .max_grad_norm = 1.0f};
        float pa[6], pb[6], ma[12] = {0}, mb[12] = {0}, va[12] = {0}, vb[12] = {0}, lr = 0.01f, step = 1;
        float unscaled[6] = {3, 4, 0, 0, 12, 0}, n13 = 13.0f;
        for (int i = 0; i < 6; i++) pa[i] = pb[i] = 0.1f * (float)i;
        tg_cpu_op_args ua = {.op = &op, .in = {g, &lr, &step, &n13, &scale}, .out = {pa, ma, va}, .plan = &plan};
        tg_cpu_op_args ub = {.op = &op, .in = {unscaled, &lr, &step, &n13}, .out = {pb, mb, vb}, .plan = &plan};
        tg_cpu_op_run(&ua);
        tg_cpu_op_run(&ub);
        CHECK(!memcmp(pa, pb, sizeof pa) && !memcmp(ma, mb, sizeof ma) && !memcmp(va, vb, sizeof va),
              "%s: scaled gradients with the scale differ from unscaled ones (p[4] %a vs %a)", tg_op_name(op.kind),
              pa[4], pb[4]);
    }
}

static int validate(const tg_plan *p, tg_err *err) {
    return tg_plan_validate_tables(p, "p", err) || tg_plan_validate_ops(p, "p", err) ? -1 : 0;
}

static int compile_job(const char *const *sets, int n, tg_plan *plan, tg_err *err) {
    tg_job job;
    return tg_job_load("examples/demo-classify.job", sets, n, &job, err) || tg_compile(&job, plan, err) ? -1 : 0;
}

TG_TEST(test_fp16_plan) {
    const char *sets[] = {"steps=4", "batch=4", "seq=16", "precision=fp16", "loss_scale_init=1024",
                          "loss_scale_growth_interval=7"};
    tg_plan plan;
    tg_err err;
    REQUIRE(compile_job(sets, 6, &plan, &err) == 0, "%s", err.msg);
    const tg_plan_io *io = &plan.io;
    int f16 = 0, bf16 = 0, updates = 0, last_update = -1, scale_op = -1;
    for (int t = 0; t < plan.n_tensors; t++) f16 += plan.tensors[t].dtype == TG_F16, bf16 += plan.tensors[t].dtype == TG_BF16;
    CHECK(f16 > 10 && bf16 == 0, "%d f16 and %d bf16 tensors", f16, bf16);
    REQUIRE(io->loss_scale >= 0 && io->loss_scale_growth >= 0 && io->params_bf16_all >= 0, "io roles");
    CHECK(!strcmp(plan.tensors[io->loss_scale].name, "optim.loss_scale") &&
              plan.tensors[io->loss_scale].pool == TG_POOL_OPTIM &&
              !strcmp(plan.tensors[io->params_bf16_all].name, "params_f16.all") &&
              plan.tensors[io->params_bf16_all].dtype == TG_F16,
          "names and pools: %s %s", plan.tensors[io->loss_scale].name, plan.tensors[io->params_bf16_all].name);
    CHECK(plan.train.loss_scale_init == 1024.0f, "loss_scale_init %g", plan.train.loss_scale_init);
    for (int o = 0; o < plan.n_ops; o++) {
        const tg_op *op = &plan.ops[o];
        if (op->kind == TG_OP_FILL) CHECK(op->in[0] == io->loss_scale, "FILL reads %d", op->in[0]);
        if (op->kind == TG_OP_GRAD_NORM) CHECK(op->in[1] == io->loss_scale, "GRAD_NORM reads %d", op->in[1]);
        if (tg_op_is_update(op->kind)) updates++, last_update = o, CHECK(op->in[4] == io->loss_scale, "update in4");
        if (op->kind == TG_OP_LOSS_SCALE_UPDATE) {
            scale_op = o;
            CHECK(op->p.loss_scale.growth_interval == 7 && op->p.loss_scale.growth_factor == 2.0f &&
                      op->p.loss_scale.backoff_factor == 0.5f && op->in[0] == io->grad_norm &&
                      op->out[0] == io->loss_scale && op->out[1] == io->loss_scale_growth,
                  "LOSS_SCALE_UPDATE params and slots");
        }
    }
    CHECK(updates == 1 && scale_op > last_update, "update at %d, scale update at %d", last_update, scale_op);
    CHECK(validate(&plan, &err) == 0, "%s", err.msg);
    /* The contract refuses a half dtype that is not the plan's precision, and a scale
     * that is not a power of two. */
    plan.train.loss_scale_init = 1000.0f;
    CHECK(validate(&plan, &err) == -1 &&
              strstr(err.msg, "train loss_scale_init 1000 is not a positive power of two (fp16 plans)"),
          "%s", err.msg);
    plan.train.loss_scale_init = 1024.0f;
    plan.train.precision = TG_PREC_BF16;
    CHECK(validate(&plan, &err) == -1 && strstr(err.msg, "train loss_scale_init 1024 is not 0"), "%s",
          err.msg);
    plan.train.loss_scale_init = 0.0f;
    CHECK(validate(&plan, &err) == -1 && strstr(err.msg, "is f16 in a plan of precision bf16"), "%s",
          err.msg);
    tg_plan_free(&plan);
}

TG_TEST(test_fp16_job_keys) {
    const struct {
        const char *set, *want;
    } bad[] = {
        {"loss_scale_init=1000", "key 'loss_scale_init': 1000 is not a power of two (such as 512 or 1024)"},
        {"loss_scale_init=0", "key 'loss_scale_init': 0 is out of range"},
        {"loss_scale_growth_factor=1", "key 'loss_scale_growth_factor': 1 is out of range (must be in [2, 65536])"},
        {"loss_scale_growth_factor=3", "key 'loss_scale_growth_factor': 3 is not a power of two (such as 2 or 4)"},
        {"loss_scale_backoff=0.75", "key 'loss_scale_backoff': 0.75 is out of range"},
        {"loss_scale_backoff=0.3", "key 'loss_scale_backoff': 0.3 is not a power of two (such as 0.25 or 0.5)"},
        {"loss_scale_growth_interval=0", "key 'loss_scale_growth_interval': 0 is out of range (must be 1..16777216"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const char *sets[] = {"precision=fp16", bad[k].set};
        tg_job job;
        tg_err err;
        CHECK(tg_job_load("examples/demo-classify.job", sets, 2, &job, &err) == -1 && strstr(err.msg, bad[k].want),
              "%s: %s", bad[k].set, err.msg);
    }
    const char *sets[] = {"loss_scale_backoff=0.25"};
    tg_job job;
    tg_err err;
    CHECK(tg_job_load("examples/demo-classify.job", sets, 1, &job, &err) == -1 &&
              strstr(err.msg, "key 'loss_scale_backoff': only meaningful for precision = fp16 (precision is fp32"),
          "%s", err.msg);
    const char *good[] = {"precision=fp16", "loss_scale_backoff=0.25", "loss_scale_init=0.5",
                          "loss_scale_growth_factor=4", "loss_scale_growth_interval=100"};
    REQUIRE(tg_job_load("examples/demo-classify.job", good, 5, &job, &err) == 0, "%s", err.msg);
    CHECK(job.loss_scale_backoff == 0.25f && job.loss_scale_init == 0.5f && job.loss_scale_growth_factor == 4.0f &&
              job.loss_scale_growth_interval == 100,
          "values");
    tg_job_defaults(&job);
    CHECK(job.loss_scale_init == 65536.0f && job.loss_scale_growth_factor == 2.0f && job.loss_scale_backoff == 0.5f &&
              job.loss_scale_growth_interval == 2000,
          "GradScaler's defaults");
}

static int open_trainer(tg_trainer *tr, tg_plan *plan, const char *const *sets, int n, tg_err *err) {
    if (compile_job(sets, n, plan, err)) return -1;
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

/* The fp16 run follows the fp32 one: the same data and initialisation, losses within what
 * half-precision activations allow; the scale grows every growth_interval steps. */
TG_TEST(test_fp16_trains_like_fp32) {
    float loss[2][6];
    for (int fp16 = 0; fp16 < 2; fp16++) {
        const char *sets[] = {"steps=6", "batch=4", "seq=16", "lr=1e-3", "warmup_steps=0",
                              fp16 ? "precision=fp16" : "precision=fp32", "loss_scale_growth_interval=2",
                              "loss_scale_init=16"};
        tg_plan plan;
        tg_trainer tr;
        tg_err err;
        REQUIRE(open_trainer(&tr, &plan, sets, fp16 ? 8 : 6, &err) == 0, "%s", err.msg);
        for (int s = 0; s < 6; s++) {
            tg_step_stats st;
            REQUIRE(tg_trainer_step(&tr, &st, &err) == 0 && !st.skipped, "step %d: %s", s, err.msg);
            loss[fp16][s] = st.loss;
            const float want_scale = fp16 ? 16.0f * (float)(1 << ((s + 1) / 2)) : 0.0f;
            CHECK(st.loss_scale == want_scale, "%s step %d: scale %g, want %g", sets[5], s + 1, st.loss_scale, want_scale);
        }
        tg_trainer_close(&tr);
        tg_plan_free(&plan);
    }
    for (int s = 0; s < 6; s++)
        CHECK(fabsf(loss[1][s] - loss[0][s]) <= 2e-2f * fabsf(loss[0][s]), "step %d: fp16 loss %g, fp32 %g", s + 1,
              loss[1][s], loss[0][s]);
}

/* A scale so large that the fp16 gradients overflow: the step is skipped with every weight,
 * state and counter bit as before, the scale halves, and training goes on once the scale
 * fits (skips while the scale is above 1 do not count toward max_skipped_steps). */
TG_TEST(test_fp16_overflow_skips_and_backs_off) {
    const char *sets[] = {"steps=60", "batch=4", "seq=16", "precision=fp16", "loss_scale_init=0x1p40",
                          "max_skipped_steps=0", "warmup_steps=0"};
    tg_plan plan;
    tg_trainer tr;
    tg_err err;
    REQUIRE(open_trainer(&tr, &plan, sets, 7, &err) == 0, "%s", err.msg);
    const tg_plan_io *io = &plan.io;
    float *p0 = read_all(&tr, io->params_all), *c0 = read_all(&tr, io->params_bf16_all), *m0 = read_all(&tr, io->m_all),
          *v0 = read_all(&tr, io->v_all), step0 = -1;
    REQUIRE(p0 && c0 && m0 && v0 && tg_trainer_read_f32(&tr, io->step, &step0, &err) == 0, "read");
    tg_step_stats st;
    REQUIRE(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
    CHECK(st.skipped && !isfinite(st.grad_norm) && isfinite(st.loss) && st.loss_scale == 0x1p39f,
          "first step: skipped %d norm %g loss %g scale %a", st.skipped, st.grad_norm, st.loss, st.loss_scale);
    float *p1 = read_all(&tr, io->params_all), *c1 = read_all(&tr, io->params_bf16_all), *m1 = read_all(&tr, io->m_all),
          *v1 = read_all(&tr, io->v_all), step1 = -1;
    REQUIRE(p1 && c1 && m1 && v1 && tg_trainer_read_f32(&tr, io->step, &step1, &err) == 0, "read");
    const size_t np = sizeof(float) * (size_t)tg_tensor_numel(&plan.tensors[io->params_all]);
    const size_t ns = sizeof(float) * (size_t)tg_tensor_numel(&plan.tensors[io->m_all]);
    CHECK(!memcmp(p0, p1, np) && !memcmp(c0, c1, np) && !memcmp(m0, m1, ns) && !memcmp(v0, v1, ns) && step0 == step1,
          "the overflowing step changed the weights, their fp16 copies, the state or the counter");
    /* Backing off: the first applied step comes once the scale fits fp16's range. */
    int applied = 0, skipped = 1;
    float scale_at_apply = 0;
    while (!applied && tr.steps_done < 60) {
        REQUIRE(tg_trainer_step(&tr, &st, &err) == 0, "step %d: %s", tr.steps_done, err.msg);
        if (st.skipped) skipped++;
        else applied = 1, scale_at_apply = st.loss_scale;
    }
    CHECK(applied && skipped > 10 && skipped < 40 && scale_at_apply == ldexpf(1.0f, 40 - skipped),
          "applied %d after %d skips at scale %a", applied, skipped, scale_at_apply);
    float *p2 = read_all(&tr, io->params_all);
    CHECK(p2 && memcmp(p0, p2, np), "the applied step changed nothing");
    free(p0), free(p1), free(p2), free(c0), free(c1), free(m0), free(m1), free(v0), free(v1);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

/* The CUDA executor takes fp16 plans: a build with CUDA and a GPU opens one; a build
 * without CUDA refuses it only as it refuses every plan (no CUDA executor), never for its
 * precision. */
TG_TEST(test_fp16_cuda_not_refused) {
    const char *sets[] = {"steps=2", "batch=4", "seq=16", "precision=fp16"};
    tg_plan plan;
    tg_err err;
    REQUIRE(compile_job(sets, 4, &plan, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CUDA, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    const int rc = tg_trainer_open(&tr, &plan, &o, &err);
    if (tg_cuda_built() && tg_cuda_device_count() > 0) {
        CHECK(rc == 0, "%s", err.msg);
        if (rc == 0) tg_trainer_close(&tr);
    } else {
        CHECK(rc == -1 && !strstr(err.msg, "fp16") &&
                  (tg_cuda_built() || strstr(err.msg, "this build has no CUDA executor")),
              "%s", err.msg);
    }
    tg_plan_free(&plan);
}

/* LOSS_SCALE_UPDATE's rule: scalars, in place, and factors that keep the scale a power of
 * two moving the right way; every refusal by name. */
TG_TEST(test_fp16_loss_scale_update_rule_checks) {
    tg_tensor t[4];
    memset(t, 0, sizeof t);
    for (int i = 0; i < 4; i++) t[i] = (tg_tensor){.ndim = 1, .shape = {i == 3 ? 2 : 1}, .dtype = TG_F32, .bytes = i == 3 ? 8 : 4};
    const tg_op_check_ctx ctx = {t, 4, 1};
    static const struct {
        int in[3], out[2];
        float growth, backoff;
        int64_t interval;
        const char *want;
    } cases[] = {
        {{0, 1, 2}, {1, 2}, 2.0f, 0.5f, 2000, NULL},
        {{0, 1, 2}, {1, 2}, 2.0f, 0.5f, 1, NULL},
        {{0, 1, 2}, {1, 2}, 2.0f, 0.5f, 0, "growth_interval is not positive"},
        {{0, 1, 2}, {1, 2}, 2.0f, 0.5f, -3, "growth_interval is not positive"},
        {{0, 1, 2}, {1, 2}, 1.0f, 0.5f, 10, "growth_factor: not finite and above 1"},
        {{0, 1, 2}, {1, 2}, INFINITY, 0.5f, 10, "growth_factor: not finite and above 1"},
        {{0, 1, 2}, {1, 2}, 2.0f, 1.0f, 10, "backoff_factor: not in (0, 1)"},
        {{0, 1, 2}, {1, 2}, 2.0f, 0.0f, 10, "backoff_factor: not in (0, 1)"},
        {{3, 1, 2}, {1, 2}, 2.0f, 0.5f, 10, "in[0]: grad norm is not a scalar"},
        {{0, 3, 2}, {3, 2}, 2.0f, 0.5f, 10, "in[1]: the loss scale is not a scalar"},
        {{0, 1, 3}, {1, 3}, 2.0f, 0.5f, 10, "in[2]: the growth tracker is not a scalar"},
        {{0, 1, 2}, {0, 2}, 2.0f, 0.5f, 10, "out[0]: the scale is updated in place: must be in[1]"},
        {{0, 1, 2}, {1, 0}, 2.0f, 0.5f, 10, "out[1]: the tracker is updated in place: must be in[2]"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_op op = tg_test_op(TG_OP_LOSS_SCALE_UPDATE);
        for (int s = 0; s < 3; s++) op.in[s] = cases[k].in[s];
        for (int s = 0; s < 2; s++) op.out[s] = cases[k].out[s];
        op.p.loss_scale = (tg_loss_scale_params){.growth_factor = cases[k].growth, .backoff_factor = cases[k].backoff,
                                                 .growth_interval = cases[k].interval};
        char why[160] = "";
        const int rc = tg_op_check(&ctx, &op, why, sizeof why);
        if (cases[k].want)
            CHECK(rc != 0 && strstr(why, cases[k].want), "case %zu: rc %d '%s', want '%s'", k, rc, why, cases[k].want);
        else
            CHECK(rc == 0, "case %zu refused: %s", k, why);
    }
}

/* skip_nonfinite = false stops at a diverged step; an fp16 overflow at a scale of 1 or
 * more is loss scaling at work: skipped, reported, and the run goes on. */
TG_TEST(test_fp16_overflow_does_not_stop_a_strict_run) {
    const char *sets[] = {"steps=4", "batch=4", "seq=16", "precision=fp16", "loss_scale_init=0x1p40",
                          "skip_nonfinite=false"};
    tg_plan plan;
    tg_trainer tr;
    tg_err err;
    REQUIRE(open_trainer(&tr, &plan, sets, 6, &err) == 0, "%s", err.msg);
    for (int s = 0; s < 3; s++) {
        tg_step_stats st;
        const int rc = tg_trainer_step(&tr, &st, &err);
        CHECK(rc == 0 && st.skipped && st.loss_scale == ldexpf(1.0f, 39 - s) && tr.skipped_steps == s + 1,
              "step %d: rc %d skipped %d scale %a (%s)", s + 1, rc, st.skipped, st.loss_scale, rc ? err.msg : "");
    }
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}
