/* NVTX ranges on the GPU build (runtime/nvtx.h): the build emits them, and a CUDA run with
 * them on (GEMM tuning pass and graph capture ranges included) trains, evaluates, writes
 * checkpoints, saves and profiles as without, popping every range it pushes. With no
 * profiler attached the ranges cost nothing; under `nsys profile` they show on the timeline. */
#include "runtime/nvtx.h"
#include "tests/harness.h"

int tg_test_nvtx_run(const char *device); /* tests/test_nvtx.c */

TG_TEST(test_gpu_nvtx_ranges_on_a_cuda_run) {
    REQUIRE(tg_nvtx_built() == 1, "the GPU build emits no NVTX ranges");
    tg_test_nvtx_run("cuda");
}
