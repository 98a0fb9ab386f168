/* NVTX ranges on the GPU build (runtime/nvtx.h): the build emits them, and a CUDA run with
 * them on (GEMM tuning pass and graph capture ranges included) trains, evaluates, writes
 * checkpoints, saves and profiles as without, popping every range it pushes. With no
 * profiler attached the ranges cost nothing; under `nsys profile` they show on the timeline. */
#include "runtime/nvtx.h"
#include "tests/harness.h"

int tg_test_nvtx_run(const char *device, long *pushed_out); /* tests/test_nvtx.c */

/* On CUDA the ops launched one by one (the GEMM tuning pass, the graph capture, the
 * profile's 5 op-by-op steps) each push a range inside their phase's: the demo plan's 71
 * ops in 5 profile steps alone push 355. */
TG_TEST(test_gpu_nvtx_ranges_on_a_cuda_run) {
    REQUIRE(tg_nvtx_built() == 1, "the GPU build emits no NVTX ranges");
    long pushed = 0;
    if (tg_test_nvtx_run("cuda", &pushed)) CHECK(pushed > 355, "%ld ranges pushed: no ranges per op", pushed);
}
