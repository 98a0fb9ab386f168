/* base/bf16.h: a NaN converts to a quiet NaN of the same sign that keeps the payload's top
 * bits (as __float2bfloat16_rn does) instead of being rounded, which could carry a
 * signalling NaN's low payload into the exponent and make it infinity. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/bf16.h"
#include "tests/harness.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TG_TEST(test_bf16_from_f32_nan_stays_quiet_nan) {
    const struct {
        uint32_t in;
        uint16_t want;
    } cases[] = {
        {0x7fc00000u, 0x7fc0}, /* the quiet NaN */
        {0xffc00000u, 0xffc0}, /* negative */
        {0x7f800001u, 0x7fc0}, /* signalling, payload below bit 16 only: rounding would give infinity */
        {0x7fa00000u, 0x7fe0}, /* signalling with a high payload bit: kept, made quiet */
        {0x7fffffffu, 0x7fff}, /* all ones: rounding would carry past the exponent */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint16_t got = tg_bf16_from_f32(from_bits(cases[i].in));
        CHECK(got == cases[i].want, "%08x -> %04x, want %04x", cases[i].in, got, cases[i].want);
        CHECK(isnan(tg_f32_from_bf16(got)), "%08x: back to fp32 is a NaN", cases[i].in);
    }
    /* Infinity is no NaN: it rounds to itself. */
    CHECK(tg_bf16_from_f32(INFINITY) == 0x7f80, "inf -> %04x", tg_bf16_from_f32(INFINITY));
}
