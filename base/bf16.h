/* bf16 <-> fp32 on the host, with the rounding the GPU's __float2bfloat16_rn uses. */
#ifndef TUNEGRAPH_BF16_H
#define TUNEGRAPH_BF16_H

#include <stdint.h>
#include <string.h>

/* Round to nearest, ties to even; NaN stays a (quiet) NaN. */
static inline uint16_t tg_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float tg_f32_from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void tg_bf16_narrow(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tg_bf16_from_f32(src[i]);
}

static inline void tg_bf16_widen(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tg_f32_from_bf16(src[i]);
}

#endif
