#include "runtime/gpu_peak.h"

#include <string.h>

#include "plan/plan.h"

/* Matched in order, so the more specific names come first. */
static const struct {
    const char *name;               /* a part of the CUDA device name */
    double half, tf32, fp32;        /* bf16/fp16, TF32 and FP32 dense TFLOP/s */
} peaks[] = {
    {"H100 PCIe", 756.0, 378.0, 51.0},
    {"H100 NVL", 835.0, 418.0, 60.0},
    {"H100", 989.4, 494.7, 66.9}, /* SXM5 (HBM3) */
    {"H200", 989.4, 494.7, 66.9},
    {"GH200", 989.4, 494.7, 66.9},
    {"A100", 312.0, 156.0, 19.5},
    {"L40S", 362.1, 183.0, 91.6},
};

double tg_gpu_dense_peak_tflops(const char *name, int precision, int allow_tf32) {
    if (!name) return 0;
    for (size_t k = 0; k < sizeof peaks / sizeof peaks[0]; k++)
        if (strstr(name, peaks[k].name))
            return precision == TG_PREC_FP32 ? (allow_tf32 ? peaks[k].tf32 : peaks[k].fp32) : peaks[k].half;
    return 0;
}
