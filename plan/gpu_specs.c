#include "plan/gpu_specs.h"

#include <string.h>

#include "plan/plan.h"

/* Matched in order, so the more specific names come first. Links: NVLink 4 (SXM: 900 GB/s
 * both ways), the NVL pair's bridge (600), PCIe Gen5 x16 (64) and Gen4 x16 (32). */
static const tg_gpu_spec specs[] = {
    {"H100 PCIe", "h100-pcie", 756.0, 378.0, 51.0, 2000.0, 64.0},
    {"H100 NVL", "h100-nvl", 835.0, 418.0, 60.0, 3900.0, 300.0},
    {"H100", "h100", 989.4, 494.7, 66.9, 3350.0, 450.0}, /* SXM5 (HBM3) */
    {"GH200", "gh200", 989.4, 494.7, 66.9, 4000.0, 450.0},
    {"H200", "h200", 989.4, 494.7, 66.9, 4800.0, 450.0},
    {"A100", "a100", 312.0, 156.0, 19.5, 2039.0, 300.0}, /* SXM4 80 GB */
    {"L40S", "l40s", 362.1, 183.0, 91.6, 864.0, 32.0},
};

const tg_gpu_spec *tg_gpu_spec_by_name(const char *name) {
    if (!name) return NULL;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
        if (strstr(name, specs[k].match)) return &specs[k];
    return NULL;
}

const tg_gpu_spec *tg_gpu_spec_by_key(const char *key) {
    for (size_t k = 0; key && k < sizeof specs / sizeof specs[0]; k++)
        if (!strcmp(key, specs[k].key)) return &specs[k];
    return NULL;
}

const tg_gpu_spec *tg_gpu_spec_at(int k) {
    return k >= 0 && (size_t)k < sizeof specs / sizeof specs[0] ? &specs[k] : NULL;
}

double tg_gpu_spec_peak_tflops(const tg_gpu_spec *s, int precision, int allow_tf32) {
    return precision == TG_PREC_FP32 ? (allow_tf32 ? s->tf32 : s->fp32) : s->half;
}
