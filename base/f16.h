/* IEEE binary16 (fp16) <-> fp32 on the host, with the rounding the GPU's __float2half_rn
 * uses: round to nearest, ties to even, subnormals kept, values past the largest finite
 * half (65504) rounding to infinity. The infinities are what dynamic loss scaling sees. */
#ifndef TUNEGRAPH_F16_H
#define TUNEGRAPH_F16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t tg_f16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN stays quiet */
    if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 65536 (or inf): infinity */
    if (a >= 0x38800000u) {
        /* Normal half: rebias the exponent (127 -> 15), round the 13 dropped bits; a carry
         * out of the mantissa steps the exponent, up to infinity past 65504. */
        const uint32_t r = a - 0x38000000u;
        return (uint16_t)(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a < 0x33000000u) return sign; /* below half the smallest subnormal (2^-25): zero */
    /* Subnormal half: value = m * 2^-24, m = the float's full mantissa shifted right. */
    const uint32_t exp = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp; /* 14 .. 24 */
    const uint32_t half_bit = 1u << (shift - 1), rest = mant & ((1u << shift) - 1u);
    uint32_t m = mant >> shift;
    if (rest > half_bit || (rest == half_bit && (m & 1u))) m++;
    return (uint16_t)(sign | m);
}

static inline float tg_f32_from_f16(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        /* Subnormal: normalise the mantissa into a float's implicit bit. */
        uint32_t e = 113u, m = mant;
        while (!(m & 0x400u)) m <<= 1, e--;
        bits = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline void tg_f16_narrow(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tg_f16_from_f32(src[i]);
}

static inline void tg_f16_widen(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = tg_f32_from_f16(src[i]);
}

#endif
