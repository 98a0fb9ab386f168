/* The dense peaks behind MFU (runtime/gpu_peak.c): by the CUDA device name, the more
 * specific name first (an H100 PCIe is not an SXM H100), by the plan's precision (bf16 and
 * fp16 alike; fp32 as TF32 or not), and none for a GPU the table lacks. */
#include <string.h>

#include "plan/plan.h"
#include "runtime/gpu_peak.h"
#include "tests/harness.h"

TG_TEST(test_gpu_peak_by_name_and_precision) {
    static const struct {
        const char *name;
        int precision, tf32;
        double want;
    } cases[] = {
        {"NVIDIA H100 80GB HBM3", TG_PREC_BF16, 0, 989.4}, {"NVIDIA H100 80GB HBM3", TG_PREC_FP16, 0, 989.4},
        {"NVIDIA H100 80GB HBM3", TG_PREC_FP32, 1, 494.7}, {"NVIDIA H100 80GB HBM3", TG_PREC_FP32, 0, 66.9},
        {"NVIDIA H100 PCIe", TG_PREC_BF16, 0, 756.0},      {"NVIDIA H100 NVL", TG_PREC_BF16, 0, 835.0},
        {"NVIDIA H200", TG_PREC_BF16, 0, 989.4},           {"NVIDIA A100-SXM4-80GB", TG_PREC_BF16, 0, 312.0},
        {"NVIDIA GeForce RTX 4090", TG_PREC_BF16, 0, 0},   {"", TG_PREC_BF16, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const double got = tg_gpu_dense_peak_tflops(cases[k].name, cases[k].precision, cases[k].tf32);
        CHECK(got == cases[k].want, "'%s' precision %d tf32 %d: %g, want %g", cases[k].name, cases[k].precision,
              cases[k].tf32, got, cases[k].want);
    }
    CHECK(tg_gpu_dense_peak_tflops(NULL, TG_PREC_BF16, 0) == 0, "no name");
}
