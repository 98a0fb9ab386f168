/* Edge cases of the CPU reference's optimizer kernels (runtime/cpu/optimizer.c): the
 * learning-rate schedule without its step output, GRAD_NORM over a view the plan does not
 * have (or without a plan: a norm of 0), ADAMW without a plan or without parameters
 * (nothing moves), and ADAMW's clipping left off when no norm is given. */
#include <math.h>
#include <string.h>

#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

TG_TEST(test_cpu_lr_schedule_without_step_output) {
    tg_op op = tg_test_op(TG_OP_SCHEDULE);
    op.p.schedule.warmup = 4, op.p.schedule.lr = 0.5f;
    float step = 2, total = 10, lr = -1;
    tg_cpu_op_args a = {.op = &op, .in = {&step, &total}, .out = {&lr}};
    tg_cpu_op_run(&a);
    CHECK(lr == 0.25f && step == 2, "warmup: lr %g (want 0.25), step %g (want 2: no output)", lr, step);
    a.out[1] = &step; /* the counter, incremented in place */
    step = 7;
    tg_cpu_op_run(&a);
    CHECK(fabsf(lr - 0.5f * 3.0f / 6.0f) < 1e-7f && step == 8, "decay: lr %g, step %g", lr, step);
}

TG_TEST(test_cpu_grad_norm_views) {
    float g[3] = {3, 4, 12}, norm = -1;
    tg_tensor t[1];
    memset(t, 0, sizeof t);
    t[0].ndim = 1, t[0].shape[0] = 3, t[0].dtype = TG_F32;
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = 1, plan.tensors = t;
    tg_op op = tg_test_op(TG_OP_GRAD_NORM);
    op.in[0] = 0;
    tg_cpu_op_args a = {.op = &op, .in = {g}, .out = {&norm}, .plan = &plan};
    tg_cpu_op_run(&a);
    CHECK(norm == 13, "norm %g, want 13", norm);
    /* A view the plan does not hold, or no plan: nothing to sum. */
    const int bad[2] = {-1, 1};
    for (int k = 0; k < 2; k++) {
        op.in[0] = bad[k], norm = -1;
        tg_cpu_op_run(&a);
        CHECK(norm == 0, "view %d: norm %g, want 0", bad[k], norm);
    }
    op.in[0] = 0, a.plan = NULL, norm = -1;
    tg_cpu_op_run(&a);
    CHECK(norm == 0, "no plan: norm %g", norm);
}

TG_TEST(test_cpu_adamw_without_plan_or_parameters) {
    float g[2] = {1, -1}, p[2] = {5, 6}, m[2] = {0}, v[2] = {0}, lr = 0.1f, t = 1;
    tg_op op = tg_test_op(TG_OP_ADAMW);
    op.p.adamw.beta1 = 0.9f, op.p.adamw.beta2 = 0.999f, op.p.adamw.eps = 1e-8f, op.p.adamw.max_grad_norm = 1.0f;
    tg_cpu_op_args a = {.op = &op, .in = {g, &lr, &t}, .out = {p, m, v}};
    tg_cpu_op_run(&a); /* no plan: nothing to walk */
    CHECK(p[0] == 5 && p[1] == 6 && m[0] == 0 && v[1] == 0, "moved without a plan: %g %g", p[0], p[1]);
    /* A plan whose only tensor is no parameter: no segment, nothing moves. */
    tg_tensor tt[1];
    memset(tt, 0, sizeof tt);
    tt[0].ndim = 1, tt[0].shape[0] = 2, tt[0].bytes = 8;
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = 1, plan.tensors = tt;
    a.plan = &plan;
    tg_cpu_op_run(&a);
    CHECK(p[0] == 5 && p[1] == 6 && m[0] == 0, "moved without parameters: %g %g", p[0], p[1]);
    /* As a parameter, with no norm given (in3): unclipped, one AdamW step of lr. */
    tt[0].flags = TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY;
    tg_cpu_op_run(&a);
    CHECK(fabsf(p[0] - 4.9f) < 1e-5f && fabsf(p[1] - 6.1f) < 1e-5f, "step: %.7g %.7g, want 4.9 6.1", p[0], p[1]);
}
