/* SCHEDULE on the GPU against the CPU reference, for every form (kernels/lr_schedule.h),
 * at every step of short runs with and without a warm-up and past their end: the same
 * double expressions, so the same float rate (the cosine within one float ulp, as the
 * device's cos may round its last double bit otherwise), and the counter advanced. */
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda_ops.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

TG_TEST(test_gpu_lr_schedule_forms) {
    static const struct {
        int warmup, total;
    } runs[] = {{0, 10}, {3, 17}, {7, 7}, {1, 1}, {10, 100}};
    cudaStream_t st;
    REQUIRE(cudaStreamCreate(&st) == cudaSuccess, "cudaStreamCreate");
    float *d;
    REQUIRE(cudaMalloc((void **)&d, 3 * sizeof(float)) == cudaSuccess, "cudaMalloc");
    tg_cuda_ctx ctx = {.stream = st};
    int checked = 0;
    for (int form = 0; form < TG_LR_SCHEDULE_COUNT; form++)
        for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
            for (int k = 0; k <= runs[r].total + 2; k++) {
                tg_op op = tg_test_op(TG_OP_SCHEDULE);
                op.p.schedule = (tg_schedule_params){.warmup = runs[r].warmup, .lr = 3e-4f, .form = form};
                float counter = (float)k, total = (float)runs[r].total, want = NAN;
                tg_cpu_op_args c = {.op = &op, .in = {&counter, &total}, .out = {&want, &counter}};
                tg_cpu_op_run(&c);
                const float host[3] = {(float)k, (float)runs[r].total, NAN}; /* step, total, lr poisoned */
                cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice);
                tg_cuda_op_args g = {.op = &op, .in = {d, d + 1}, .out = {d + 2, d}, .in_numel = {1, 1},
                                     .out_numel = {1, 1}, .in_dtype = {TG_F32, TG_F32},
                                     .out_dtype = {TG_F32, TG_F32}, .training = 1, .ctx = &ctx};
                tg_err err;
                REQUIRE(tg_cuda_op_run(&g, &err) == 0, "%s", err.msg);
                REQUIRE(cudaStreamSynchronize(st) == cudaSuccess, "%s", cudaGetErrorString(cudaGetLastError()));
                float got[3];
                cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost);
                const float ulp = nextafterf(fabsf(want), INFINITY) - fabsf(want);
                const int same = form == TG_LR_COSINE ? fabsf(got[2] - want) <= ulp : got[2] == want;
                CHECK(same && got[0] == (float)(k + 1) && got[1] == (float)runs[r].total,
                      "%s warmup %d total %d after %d updates: GPU %.9g, CPU %.9g, counter %g",
                      tg_lr_schedule_name(form), runs[r].warmup, runs[r].total, k, got[2], want, got[0]);
                checked++;
            }
    CHECK(checked == 3 * (13 + 20 + 10 + 4 + 103), "%d rates", checked);
    cudaFree(d);
    cudaStreamDestroy(st);
}
