/* The plan's two half-precision storage dtypes (TG_BF16, TG_F16) to and from fp32 on the
 * host, by dtype: the rounding each GPU conversion uses (base/bf16.h, base/f16.h). */
#ifndef TUNEGRAPH_HALF_CONVERT_H
#define TUNEGRAPH_HALF_CONVERT_H

#include "base/bf16.h"
#include "base/f16.h"
#include "plan/plan.h"

static inline int tg_dtype_is_half(int dtype) { return dtype == TG_BF16 || dtype == TG_F16; }

static inline void tg_half_narrow(int dtype, uint16_t *dst, const float *src, int64_t n) {
    if (dtype == TG_F16) tg_f16_narrow(dst, src, n);
    else tg_bf16_narrow(dst, src, n);
}

static inline void tg_half_widen(int dtype, float *dst, const uint16_t *src, int64_t n) {
    if (dtype == TG_F16) tg_f16_widen(dst, src, n);
    else tg_bf16_widen(dst, src, n);
}

#endif
