/* The image model's ops have no CUDA kernels yet (kernels/conv.cu): the CUDA executor refuses
 * a mobilenet_v2 plan when it opens, naming the first such op, before it looks for a device
 * or allocates anything (so this runs on a machine without a GPU too); every other op kind
 * has a kernel. */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/cuda/cuda_exec.h"
#include "tests/harness.h"

TG_TEST(test_gpu_image_ops_refused_at_open) {
    static const int refused[] = {TG_OP_CONV2D, TG_OP_CONV2D_BWD, TG_OP_BATCHNORM, TG_OP_BATCHNORM_BWD,
                                  TG_OP_RELU6, TG_OP_RELU6_BWD, TG_OP_GLOBAL_AVG_POOL, TG_OP_GLOBAL_AVG_POOL_BWD};
    int n_refused = 0;
    for (int k = 0; k < TG_OP_COUNT; k++) {
        int listed = 0;
        for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) listed |= refused[i] == k;
        CHECK(tg_cuda_op_has_kernel(k) == !listed, "%s: has_kernel %d", tg_op_name(k), tg_cuda_op_has_kernel(k));
        n_refused += !tg_cuda_op_has_kernel(k);
    }
    CHECK(n_refused == 8 && !tg_cuda_op_has_kernel(-1) && !tg_cuda_op_has_kernel(TG_OP_COUNT), "%d kinds refused",
          n_refused);
    char msg[160];
    tg_cuda_op_refusal(TG_OP_GLOBAL_AVG_POOL_BWD, msg, sizeof msg);
    CHECK(!strcmp(msg, "op GLOBAL_AVG_POOL_BWD has no CUDA kernel yet (run the plan on the CPU: --device cpu)"), "%s",
          msg);

    tg_job job;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text("model = mobilenet_v2\nnum_labels = 3\nimage_size = 32\nwidth_mult = 0.25\nbatch = 2\n"
                              "steps = 1\ntrain_data = t\n",
                              "m.job", "", NULL, 0, &job, &err) == 0,
            "%s", err.msg);
    tg_plan p;
    REQUIRE(tg_compile(&job, &p, &err) == 0, "%s", err.msg);
    tg_cuda_exec x;
    CHECK(tg_cuda_exec_init_on(&x, &p, 1, 0, NULL, &err) == -1 &&
              !strcmp(err.msg, "op 0 of the plan: op CONV2D has no CUDA kernel yet (run the plan on the CPU: --device cpu)"),
          "%s", err.msg);
    tg_plan_free(&p);
}
