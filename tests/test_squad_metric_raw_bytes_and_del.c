/* tg_squad_normalize (datasets/squad_metric.c) with bytes that are not UTF-8 beside a
 * capital sigma, and with DEL. A raw byte is no letter: neither cased nor case-ignorable,
 * so a sigma after one is not final (σ) and a sigma before one is (ς); the byte itself stays.
 * DEL (U+007F, not in string.punctuation) is no word character: it ends an article. */
#include <stdlib.h>
#include <string.h>

#include "datasets/squad_metric.h"
#include "tests/harness.h"

static void expect(const char *text, const char *want, const char *what) {
    char *got = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    if (!CHECK(tg_squad_normalize(text, strlen(text), &got, &len, &err) == 0, "%s: %s", what, err.msg)) return;
    CHECK(len == strlen(want) && !memcmp(got, want, len), "%s: %zu bytes '%s', want '%s'", what, len, got, want);
    free(got);
}

TG_TEST(test_squad_normalize_sigma_beside_raw_bytes) {
    expect("\xff\xce\xa3", "\xff\xcf\x83", "raw byte, then capital sigma: not final");
    expect("A\xce\xa3\xff", "a\xcf\x82\xff", "A, capital sigma, raw byte: final");
    expect("\xc3\xa9\xce\xa3\xfe", "\xc3\xa9\xcf\x82\xfe", "e acute, capital sigma, raw byte: final");
}

TG_TEST(test_squad_normalize_del_ends_a_word) {
    expect("the\x7f" "end", "\x7f" "end", "the + DEL + end: 'the' is an article");
    expect("x\x7fy", "x\x7fy", "DEL inside a word stays");
    expect("a_b", "ab", "'_' is punctuation and goes first");
}
