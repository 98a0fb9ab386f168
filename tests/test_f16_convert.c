/* base/f16.h against the compiler's own IEEE binary16 (_Float16, round to nearest even):
 * every half widens to the same float, every float of a dense sweep (and every tie between
 * two neighbouring halves) narrows to the same half, NaN stays NaN. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/f16.h"
#include "tests/harness.h"

static uint16_t bits_of(_Float16 h) {
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

static int is_nan_half(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }

TG_TEST(test_f16_widen_every_half) {
    int bad = 0;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        _Float16 x;
        const uint16_t b = (uint16_t)h;
        memcpy(&x, &b, 2);
        const float want = (float)x, got = tg_f32_from_f16(b);
        const int same = isnan(want) ? isnan(got) != 0 : memcmp(&want, &got, 4) == 0;
        if (!same && bad++ < 5) CHECK(0, "half 0x%04x: widened %a, want %a", h, got, want);
        /* Every half (NaN aside) comes back from its float unchanged. */
        if (!isnan(want) && tg_f16_from_f32(got) != b && bad++ < 5)
            CHECK(0, "half 0x%04x: round trip gives 0x%04x", h, tg_f16_from_f32(got));
    }
    CHECK(bad == 0, "%d halves differ", bad);
}

TG_TEST(test_f16_narrow_matches_float16) {
    int bad = 0;
    long checked = 0;
    /* A dense sweep of the float bit patterns (both signs, every exponent). */
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) {
        const float f = tg_test_f32_of_bits((uint32_t)u);
        const uint16_t want = bits_of((_Float16)f), got = tg_f16_from_f32(f);
        const int same = isnan(f) ? is_nan_half(got) : got == want;
        checked++;
        if (!same && bad++ < 5) CHECK(0, "float %a (0x%08llx): narrowed 0x%04x, want 0x%04x", f, (unsigned long long)u, got, want);
    }
    /* Every tie and its two neighbours: between each pair of adjacent finite halves, and
     * between the largest finite half and the infinity it rounds to past 65520. */
    for (uint32_t h = 0; h < 0x7bffu; h++) {
        const double lo = tg_f32_from_f16((uint16_t)h), hi = tg_f32_from_f16((uint16_t)(h + 1));
        const float mid = (float)((lo + hi) / 2); /* exact: one bit more than a half holds */
        uint32_t m;
        memcpy(&m, &mid, 4);
        for (int d = -1; d <= 1; d++)
            for (int sign = 0; sign < 2; sign++) {
                const float f = tg_test_f32_of_bits((m + (uint32_t)d) | (sign ? 0x80000000u : 0));
                const uint16_t want = bits_of((_Float16)f), got = tg_f16_from_f32(f);
                checked++;
                if (got != want && bad++ < 5) CHECK(0, "near tie %a: narrowed 0x%04x, want 0x%04x", f, got, want);
            }
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, 1e9f, INFINITY, -INFINITY, 0x1p-24f, 0x1p-25f,
                           0x1.000002p-25f, 0x1p-26f, 0x1p-14f, 0x1.ffcp-15f, 0x1.ff8p-15f, -0.0f};
    const uint16_t want_edges[] = {0x7bff, 0x7bff, 0x7c00, 0x7c00, 0x7c00, 0xfc00, 0x0001, 0x0000,
                                   0x0001, 0x0000, 0x0400, 0x0400, 0x03ff, 0x8000};
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++)
        CHECK(tg_f16_from_f32(edges[k]) == want_edges[k], "%a: 0x%04x, want 0x%04x", edges[k],
              tg_f16_from_f32(edges[k]), want_edges[k]);
    /* NaN stays a quiet NaN of the same sign. */
    CHECK(tg_f16_from_f32(NAN) == 0x7e00 && tg_f16_from_f32(-NAN) == 0xfe00 && is_nan_half(tg_f16_from_f32(tg_test_f32_of_bits(0x7f800001u))),
          "NaN: 0x%04x 0x%04x", tg_f16_from_f32(NAN), tg_f16_from_f32(-NAN));
    CHECK(bad == 0 && checked > 1000000, "%d of %ld floats differ", bad, checked);
    float wide[3];
    const uint16_t halves[3] = {0x3c00, 0xc000, 0x0001};
    tg_f16_widen(wide, halves, 3);
    uint16_t back[3];
    tg_f16_narrow(back, wide, 3);
    CHECK(wide[0] == 1.0f && wide[1] == -2.0f && wide[2] == 0x1p-24f && !memcmp(back, halves, sizeof back),
          "arrays: %g %g %a", wide[0], wide[1], wide[2]);
}
