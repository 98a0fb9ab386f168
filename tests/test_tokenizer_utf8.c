/* datasets/utf8.c: the offset of the first byte that is not well-formed UTF-8 (RFC 3629:
 * each lead byte's second-byte range, overlong forms, surrogates, code points past
 * U+10FFFF, cut sequences), and code-point offsets as SQuAD's answer_start counts them. */
#include <string.h>

#include "datasets/utf8.h"
#include "tests/harness.h"

TG_TEST(test_tokenizer_utf8_invalid_at) {
    static const struct {
        const char *s;
        int64_t want;
    } cases[] = {
        {"", -1},
        {"plain ascii", -1},
        {"a\xc2\x80z", -1},               /* smallest two-byte */
        {"ab\xc1\xbf", 2},                /* C0, C1: overlong leads */
        {"\xdf\xbf\xc2", 2},              /* two-byte cut at the end */
        {"\xc2\x41", 0},                  /* second byte not a continuation */
        {"\xe0\xa0\x80", -1},             /* smallest three-byte */
        {"x\xe0\x9f\xbf", 1},             /* E0: second byte from A0 */
        {"\xe1\x80\x80\xec\xbf\xbf", -1}, /* E1..EC */
        {"\xe1\x80\x41", 0},              /* third byte not a continuation */
        {"\xe1\x80\xc0", 0},              /* nor this */
        {"\xed\x9f\xbf", -1},             /* U+D7FF */
        {"\xed\xa0\x80", 0},              /* ED: no surrogates */
        {"\xee\x80\x80\xef\xbf\xbf", -1}, /* EE, EF */
        {"\xf0\x90\x80\x80", -1},         /* smallest four-byte */
        {"\xf0\x8f\xbf\xbf", 0},          /* F0: second byte from 90 */
        {"\xf1\x80\x80\x80\xf3\xbf\xbf\xbf", -1},
        {"\xf4\x8f\xbf\xbf", -1},         /* U+10FFFF */
        {"ok\xf4\x90\x80\x80", 2},        /* past U+10FFFF */
        {"\xf5\x80\x80\x80", 0},          /* F5 and above: no lead */
        {"\x80", 0},                      /* a continuation alone */
        {"\xf0\x90\x80", 0},              /* cut */
        {"\xe0\x7f\x80", 0},              /* second byte below the range */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const int64_t got = tg_utf8_invalid_at(cases[k].s, strlen(cases[k].s));
        CHECK(got == cases[k].want, "case %zu: %lld, want %lld", k, (long long)got, (long long)cases[k].want);
    }
    /* n bounds the check: the bad byte past it is not seen */
    CHECK(tg_utf8_invalid_at("ab\xff", 2) == -1, "n is not the bound");
}

TG_TEST(test_tokenizer_utf8_byte_offset) {
    static const char s[] = "a\xc3\xa9\xe4\xb8\xad\xf0\x9d\x84\x9e"; /* a é 中 𝄞 */
    const size_t n = strlen(s);
    static const int64_t want[] = {0, 1, 3, 6, 10};
    for (int64_t c = 0; c <= 4; c++) {
        const int64_t got = tg_utf8_byte_offset(s, n, c);
        CHECK(got == want[c], "code point %lld at byte %lld, want %lld", (long long)c, (long long)got, (long long)want[c]);
    }
    CHECK(tg_utf8_byte_offset(s, n, 5) == -1, "past the end");
    CHECK(tg_utf8_byte_offset("", 0, 0) == 0 && tg_utf8_byte_offset("", 0, 1) == -1, "empty");
    /* an invalid byte counts as one code point, as a replacement character would */
    CHECK(tg_utf8_byte_offset("\xff\xc3\xa9x", 4, 2) == 3 && tg_utf8_byte_offset("\xff\xc3\xa9x", 4, 3) == 4,
          "invalid byte: %lld", (long long)tg_utf8_byte_offset("\xff\xc3\xa9x", 4, 2));
}
