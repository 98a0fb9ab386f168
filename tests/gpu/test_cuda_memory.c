/* Memory on the GPU: the estimate's reduction scratch bound covers what the kernels ask
 * for, the measured peak of a short run stays near the planned one, and a plan that
 * cannot fit is refused by the preflight before the executor allocates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "kernels/cuda_ops.h"
#include "models/model_config.h"
#include "plan/memory_estimate.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* The scratch the kernels of schedule op o ask for (the executor allocates the largest). */
static int64_t kernel_scratch_floats(const tg_plan *p, int o) {
    int64_t in_n[TG_OP_MAX_IN];
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        in_n[s] = p->ops[o].in[s] >= 0 ? tg_tensor_numel(&p->tensors[p->ops[o].in[s]]) : 0;
    return tg_cuda_op_scratch_floats(&p->ops[o], in_n);
}

typedef struct sized_job {
    const char *preset;
    int task, batch, seq, precision, fuse_bias_grad, attention;
} sized_job;

/* Every op's scratch is within its bound, for plans of each model (MobileNetV2 too, in
 * fp32, bf16 and fp16), both attentions, fused and separate bias gradients, small and large
 * batches (including an embedding backward over more than one sort tile, and token-type
 * tables that take column sums). Needs no GPU: the formulas are host functions. */
TG_TEST(test_gpu_scratch_bound_covers_kernels) {
    static const sized_job jobs[] = {
        {"tiny-bert", TG_TASK_CLASSIFY, 4, 24, TG_PREC_FP32, 1, TG_ATTENTION_FUSED},
        {"tiny-bert", TG_TASK_CLASSIFY, 64, 64, TG_PREC_BF16, 0, TG_ATTENTION_UNFUSED},
        {"tiny-roberta", TG_TASK_CLASSIFY, 8, 32, TG_PREC_FP32, 1, TG_ATTENTION_FUSED},
        {"tiny-gpt2", TG_TASK_LM, 16, 64, TG_PREC_FP32, 1, TG_ATTENTION_FUSED},
        {"tiny-gpt2", TG_TASK_LM, 2, 8, TG_PREC_BF16, 0, TG_ATTENTION_UNFUSED},
        {"bert-base-uncased", TG_TASK_CLASSIFY, 32, 128, TG_PREC_BF16, 1, TG_ATTENTION_FUSED},
        {"bert-base-uncased", TG_TASK_CLASSIFY, 1, 3, TG_PREC_FP32, 0, TG_ATTENTION_FUSED},
        {"bert-base-uncased", TG_TASK_CLASSIFY, 64, 128, TG_PREC_FP32, 1, TG_ATTENTION_FUSED}, /* 8192 tokens: two tiles */
        {"gpt2", TG_TASK_LM, 16, 1024, TG_PREC_BF16, 1, TG_ATTENTION_FUSED},
        /* 224-pixel images: batch norms over 64 x 112 x 112 rows, convolutions' weight
         * gradients over as many positions; and one image */
        {"mobilenet_v2", TG_TASK_CLASSIFY, 64, 1, TG_PREC_FP32, 1, TG_ATTENTION_FUSED},
        {"mobilenet_v2", TG_TASK_CLASSIFY, 1, 1, TG_PREC_FP32, 1, TG_ATTENTION_FUSED},
        /* the same in bf16 and fp16 (half activations: the kernels' scratch is the same) */
        {"mobilenet_v2", TG_TASK_CLASSIFY, 64, 1, TG_PREC_BF16, 1, TG_ATTENTION_FUSED},
        {"mobilenet_v2", TG_TASK_CLASSIFY, 3, 1, TG_PREC_FP16, 1, TG_ATTENTION_FUSED},
    };
    for (size_t k = 0; k < sizeof jobs / sizeof jobs[0]; k++) {
        const sized_job *j = &jobs[k];
        tg_model_config cfg;
        tg_err err;
        if (!CHECK(tg_model_config_load(j->preset, &cfg, &err) == 0, "%s", err.msg)) continue;
        tg_job job;
        tg_job_defaults(&job);
        snprintf(job.model, sizeof job.model, "%s", j->preset);
        job.task = j->task, job.batch = j->batch, job.seq = j->seq, job.steps = 1, job.precision = j->precision;
        job.fuse_bias_grad = j->fuse_bias_grad, job.attention = j->attention;
        tg_plan p;
        if (!CHECK(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s: %s", j->preset, err.msg)) continue;
        const uint64_t bound = tg_reduce_scratch_bound_floats(&p);
        int64_t kernels = TG_MEM_REDUCE_SCRATCH_MIN_FLOATS;
        for (int o = 0; o < p.n_ops; o++) {
            const int64_t need = kernel_scratch_floats(&p, o);
            if (need > kernels) kernels = need;
            CHECK((uint64_t)need <= tg_op_scratch_bound_floats(&p, o), "%s %dx%d: op %d (%s) asks %lld floats, bound %llu",
                  j->preset, j->batch, j->seq, o, tg_op_name(p.ops[o].kind), (long long)need,
                  (unsigned long long)tg_op_scratch_bound_floats(&p, o));
        }
        printf("    %s %dx%d: kernels ask %lld floats, bound %llu\n", j->preset, j->batch, j->seq, (long long)kernels,
               (unsigned long long)bound);
        CHECK((uint64_t)kernels <= bound, "%s %dx%d: kernels ask %lld floats of scratch, bound %llu", j->preset,
              j->batch, j->seq, (long long)kernels, (unsigned long long)bound);
        tg_plan_free(&p);
    }
}

/* A few steps of the demo job: the executor's scratch is within the bound, and the
 * measured peak (device memory taken after the context existed) is at least the pools and
 * exceeds them by no more than the estimate's other parts, the context aside (cuBLASLt
 * workspace, scratch, staging, kernels), plus 64 MiB for what the driver rounds up. */
TG_TEST(test_gpu_measured_peak_near_plan) {
    tg_err err;
    tg_job job;
    tg_plan plan;
    tg_trainer tr;
    const char *sets[] = {"steps=6"};
    if (!CHECK(tg_job_load("examples/demo-classify.job", sets, 1, &job, &err) == 0, "%s", err.msg)) return;
    if (!CHECK(tg_compile(&job, &plan, &err) == 0, "%s", err.msg)) return;
    tg_trainer_options o = {.device = TG_DEVICE_CUDA, .load_data = 1, .max_in_flight = 4};
    if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return;
    }
    int ok = 1;
    for (int s = 0; ok && s < tr.total_steps; s++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
    }
    const tg_cuda_exec *x = (const tg_cuda_exec *)tr.ex.impl; /* cuda_impl starts with its tg_cuda_exec */
    CHECK(x->ctx.reduce_scratch_floats <= tg_reduce_scratch_bound_floats(&plan), "scratch %zu floats, bound %llu",
          x->ctx.reduce_scratch_floats, (unsigned long long)tg_reduce_scratch_bound_floats(&plan));
    CHECK(x->ctx.gemm_workspace_bytes == TG_MEM_GEMM_WORKSPACE_BYTES, "cuBLASLt workspace %zu bytes",
          (size_t)x->ctx.gemm_workspace_bytes);
    tg_memory_use use;
    tg_trainer_memory(&tr, &use);
    tg_memory_estimate est;
    tg_estimate_memory(&plan, TG_MEM_DEVICE_CUDA, &est);
    const int64_t others = (int64_t)(est.total - est.part[TG_MEM_POOLS] - est.part[TG_MEM_CUDA_CONTEXT]);
    const int64_t slack = 64ll << 20;
    printf("    planned %.1f MiB, measured %.1f MiB, bound %.1f MiB above the plan\n", use.planned / 1048576.0,
           use.measured / 1048576.0, (others + slack) / 1048576.0);
    CHECK(use.planned == plan.peak_bytes && use.estimated == est.total, "planned %llu, estimated %llu",
          (unsigned long long)use.planned, (unsigned long long)use.estimated);
    CHECK(use.measured >= (int64_t)use.planned, "measured %lld bytes, less than the %llu planned",
          (long long)use.measured, (unsigned long long)use.planned);
    CHECK(use.measured - (int64_t)use.planned <= others + slack, "measured %lld bytes: %lld above the plan, bound %lld",
          (long long)use.measured, (long long)(use.measured - (int64_t)use.planned), (long long)(others + slack));
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

/* A plan claiming 2^50 bytes of activations is refused on the GPU with both numbers,
 * before the executor exists (nothing of it is ever allocated). */
TG_TEST(test_gpu_preflight_refuses) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    p.pool_bytes[TG_POOL_ACTIVATIONS] = 1ull << 50;
    p.peak_bytes = tg_plan_pools_bytes(&p);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CUDA, .load_data = 0};
    tg_err err = {{0}};
    CHECK(tg_trainer_open(&tr, &p, &o, &err) == -1 && tr.ex.vt == NULL, "a plan of 2^50 bytes opened");
    printf("    %s\n", err.msg);
    CHECK(strstr(err.msg, "not enough memory for this plan: needs 1048576.") && strstr(err.msg, " free on GPU 0. ") &&
              strstr(err.msg, "cuBLASLt workspace 32.0 MiB") && strstr(err.msg, "CUDA context is in place already"),
          "message: %s", err.msg);
    tg_plan_free(&p);
}
