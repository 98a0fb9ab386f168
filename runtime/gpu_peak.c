#include "runtime/gpu_peak.h"

#include "plan/gpu_specs.h"

double tg_gpu_dense_peak_tflops(const char *name, int precision, int allow_tf32) {
    const tg_gpu_spec *s = tg_gpu_spec_by_name(name);
    return s ? tg_gpu_spec_peak_tflops(s, precision, allow_tf32) : 0;
}
