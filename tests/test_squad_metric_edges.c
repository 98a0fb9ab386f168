/* The SQuAD metric (datasets/squad_metric.c) at the edges of each character class: every
 * end of Python's str.isspace() ranges and of string.punctuation's, characters just
 * outside them, the dotted capital I, articles next to punctuation; tokens that are
 * prefixes of one another in F1; golds that normalize to nothing beside one that does;
 * and a failed allocation leaving the output empty. Expected values from the official
 * script's normalize_answer (Python 3). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/squad_metric.h"
#include "tests/harness.h"

static void expect_normalized(const char *text, size_t len, const char *want, size_t want_len, const char *what) {
    char *got = NULL;
    size_t got_len = 12345;
    tg_err err = {{0}};
    if (!CHECK(tg_squad_normalize(text, len, &got, &got_len, &err) == 0, "%s: %s", what, err.msg)) return;
    CHECK(got_len == want_len && !memcmp(got, want, want_len) && got[got_len] == 0,
          "%s: normalizes to %zu bytes '%s', want '%s'", what, got_len, got, want);
    free(got);
}

TG_TEST(test_squad_normalize_space_and_punctuation_edges) {
    /* "x" C "y": C splits (a space), is dropped (punctuation) or stays. */
    static const struct {
        const char *c;
        int kind; /* 0 space, 1 punctuation, 2 kept */
    } cases[] = {
        {"\x08", 2}, {"\x09", 0}, {"\x0d", 0}, {"\x0e", 2}, {"\x1b", 2}, {"\x1c", 0}, {"\x1f", 0}, {" ", 0},
        {"!", 1}, {"/", 1}, {"0", 2}, {"9", 2}, {":", 1}, {"@", 1}, {"[", 1}, {"`", 1}, {"{", 1}, {"~", 1},
        {"\x7f", 2}, {"\xc2\x84", 2}, {"\xc2\x85", 0}, {"\xc2\xa0", 0}, {"\xc2\xa1", 2},
        {"\xe1\x9a\x80", 0},                   /* U+1680 */
        {"\xe1\xbf\xbf", 2},                   /* U+1FFF */
        {"\xe2\x80\x80", 0},                   /* U+2000 */
        {"\xe2\x80\x8a", 0},                   /* U+200A */
        {"\xe2\x80\x8b", 2},                   /* U+200B, zero width: no space */
        {"\xe2\x80\xa7", 2},                   /* U+2027 */
        {"\xe2\x80\xa8", 0},                   /* U+2028 */
        {"\xe2\x80\xa9", 0},                   /* U+2029 */
        {"\xe2\x80\xaf", 0},                   /* U+202F */
        {"\xe2\x81\x9f", 0},                   /* U+205F */
        {"\xe2\x81\xa0", 2},                   /* U+2060 */
        {"\xe3\x80\x80", 0},                   /* U+3000 */
        {"\xe3\x80\x81", 2},                   /* U+3001, CJK punctuation: not ASCII, kept */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[16], want[16];
        snprintf(text, sizeof text, "x%sy", cases[i].c);
        if (cases[i].kind == 0) snprintf(want, sizeof want, "x y");
        else if (cases[i].kind == 1) snprintf(want, sizeof want, "xy");
        else snprintf(want, sizeof want, "x%sy", cases[i].c);
        char what[32];
        snprintf(what, sizeof what, "case %zu", i);
        expect_normalized(text, strlen(text), want, strlen(want), what);
    }
}

TG_TEST(test_squad_normalize_articles_and_case) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"The cat", "cat"},
        {"THE AN A", ""},
        {"the.cat", "thecat"},       /* punctuation goes first: "thecat" is no article */
        {"the. cat", "cat"},
        {"an-the", "anthe"},
        {"don't", "dont"},
        {"a_the", "athe"},           /* '_' is punctuation too */
        {"  lots   of\tspace \n", "lots of space"},
        {"\xc4\xb0stanbul", "i\xcc\x87stanbul"}, /* U+0130 lowers to i and a combining dot */
        {"A\xc4\xb0", "ai\xcc\x87"},
        {"\xce\xa3\xce\xa3", "\xcf\x83\xcf\x82"}, /* capital sigma: final after a letter */
        {"\xc3\x89T\xc3\x89", "\xc3\xa9t\xc3\xa9"},
        {"", ""},
        {"a", ""},
        {"ab a b", "ab b"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_normalized(cases[i].text, strlen(cases[i].text), cases[i].want, strlen(cases[i].want), cases[i].text);
    /* Only len bytes count, and a NUL among them is kept. */
    expect_normalized("The cat sat", 7, "cat", 3, "cut short");
    expect_normalized("x\0y", 3, "x\0y", 3, "NUL");
}

static double score(const char *pred, const char *const *gold, int n, double *f1) {
    size_t lens[4];
    for (int i = 0; i < n; i++) lens[i] = strlen(gold[i]);
    double exact = -1;
    tg_err err = {{0}};
    *f1 = -1;
    CHECK(tg_squad_score(pred, strlen(pred), gold, lens, n, &exact, f1, &err) == 0, "%s", err.msg);
    return exact;
}

TG_TEST(test_squad_score_prefix_tokens_and_empty_golds) {
    double f1 = -1;
    /* Tokens that are prefixes of one another are different tokens: {ab, abc} vs {abc}. */
    const char *g1[] = {"abc"};
    CHECK(score("ab abc", g1, 1, &f1) == 0.0 && fabs(f1 - 2.0 / 3.0) < 1e-15, "prefix: f1 %.17g", f1);
    const char *g2[] = {"ab abc abcd b"};
    CHECK(score("abcd ab zz", g2, 1, &f1) == 0.0 && fabs(f1 - 2 * (2.0 / 3) * 0.5 / (2.0 / 3 + 0.5)) < 1e-15,
          "prefixes: f1 %.17g", f1);
    /* Sorted bags whichever side holds the larger tokens. */
    const char *g3[] = {"b a1 c"};
    CHECK(score("c b zz z", g3, 1, &f1) == 0.0 && fabs(f1 - 2 * 0.5 * (2.0 / 3) / (0.5 + 2.0 / 3)) < 1e-15,
          "bags: f1 %.17g", f1);
    /* A gold that normalizes to nothing is left out when another one has words. */
    const char *g4[] = {"the", "Cat!"};
    CHECK(score("cat", g4, 2, &f1) == 1.0 && f1 == 1.0, "f1 %g", f1);
    CHECK(score("", g4, 2, &f1) == 0.0 && f1 == 0.0, "empty pred: f1 %g", f1);
    /* Exact and F1 take their best gold each. */
    const char *g5[] = {"big red cat", "dog"};
    CHECK(score("red cat", g5, 2, &f1) == 0.0 && fabs(f1 - 0.8) < 1e-15, "f1 %.17g", f1);
    CHECK(score("dog", g5, 2, &f1) == 1.0 && f1 == 1.0, "f1 %g", f1);
}

TG_TEST(test_squad_normalize_failure_leaves_nothing) {
    for (long k = 0; k < 3; k++) {
        char sentinel = 0;
        char *out = &sentinel;
        size_t out_len = 99;
        tg_err err = {{0}};
        tg_alloc_fail_only(k);
        const int rc = tg_squad_normalize("The cat", 7, &out, &out_len, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && out == NULL && out_len == 0 &&
                  !strcmp(err.msg, "out of memory for the normalized form of a 7-byte answer"),
              "allocation %ld failed: rc %d, out %p, %zu bytes, '%s'", k, rc, (void *)out, out_len, err.msg);
    }
}
