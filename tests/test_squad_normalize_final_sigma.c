/* Python's final-sigma rule in tg_squad_normalize (datasets/squad_metric.c), which the
 * official script's s.lower() applies: a capital sigma lowers to the final form when a
 * cased letter comes before it and none after it, case-ignorable characters (Unicode's
 * Case_Ignorable: apostrophes, full stops, colons, diaereses, marks, modifiers, format
 * characters) skipped on either side. Cased takes in Other_Lowercase and Other_Uppercase
 * beyond the letter categories: the ordinal indicators U+00AA and U+00BA, the Roman
 * numerals, circled and squared letters. Each code point of the ranges below goes between
 * "Α" and "Σ" and between "ΑΣ" and "Β"; the runs say, from Python 3.11's str.lower()
 * (tests/squad_reference.py's normalize_answer), whether the character is cased or
 * case-ignorable: then the first sigma is final and the second is not, and the other way
 * round for every other character. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/squad_metric.h"
#include "tests/harness.h"

static const struct {
    uint32_t first, last;
    int cased_or_ignorable;
} k_runs[] = {
        {0x0020, 0x0026, 0},
        {0x0027, 0x0027, 1},
        {0x0028, 0x002D, 0},
        {0x002E, 0x002E, 1},
        {0x002F, 0x0039, 0},
        {0x003A, 0x003A, 1},
        {0x003B, 0x0040, 0},
        {0x0041, 0x005A, 1},
        {0x005B, 0x005D, 0},
        {0x005E, 0x005E, 1},
        {0x005F, 0x005F, 0},
        {0x0060, 0x007A, 1},
        {0x007B, 0x00A7, 0},
        {0x00A8, 0x00A8, 1},
        {0x00A9, 0x00A9, 0},
        {0x00AA, 0x00AA, 1},
        {0x00AB, 0x00AC, 0},
        {0x00AD, 0x00AD, 1},
        {0x00AE, 0x00AE, 0},
        {0x00AF, 0x00AF, 1},
        {0x00B0, 0x00B3, 0},
        {0x00B4, 0x00B5, 1},
        {0x00B6, 0x00B6, 0},
        {0x00B7, 0x00B8, 1},
        {0x00B9, 0x00B9, 0},
        {0x00BA, 0x00BA, 1},
        {0x00BB, 0x00BF, 0},
        {0x00C0, 0x00D6, 1},
        {0x00D7, 0x00D7, 0},
        {0x00D8, 0x00F6, 1},
        {0x00F7, 0x00F7, 0},
        {0x00F8, 0x01BA, 1},
        {0x01BB, 0x01BB, 0},
        {0x01BC, 0x01BF, 1},
        {0x01C0, 0x01C3, 0},
        {0x01C4, 0x0293, 1},
        {0x0294, 0x0294, 0},
        {0x0295, 0x02FF, 1},
        {0x0370, 0x0377, 1},
        {0x0378, 0x0379, 0},
        {0x037A, 0x037D, 1},
        {0x037E, 0x037E, 0},
        {0x037F, 0x037F, 1},
        {0x0380, 0x0383, 0},
        {0x0384, 0x038A, 1},
        {0x038B, 0x038B, 0},
        {0x038C, 0x038C, 1},
        {0x038D, 0x038D, 0},
        {0x038E, 0x03A1, 1},
        {0x03A2, 0x03A2, 0},
        {0x03A3, 0x03F5, 1},
        {0x03F6, 0x03F6, 0},
        {0x03F7, 0x03FF, 1},
        {0x05F0, 0x05F3, 0},
        {0x05F4, 0x05F4, 1},
        {0x05F5, 0x05F5, 0},
        {0x2010, 0x2017, 0},
        {0x2018, 0x2019, 1},
        {0x201A, 0x2023, 0},
        {0x2024, 0x2024, 1},
        {0x2025, 0x2026, 0},
        {0x2027, 0x2027, 1},
        {0x2028, 0x2029, 0},
        {0x202A, 0x202E, 1},
        {0x202F, 0x202F, 0},
        {0x2150, 0x215F, 0},
        {0x2160, 0x217F, 1},
        {0x2180, 0x2182, 0},
        {0x2183, 0x2184, 1},
        {0x2185, 0x218F, 0},
        {0x24A0, 0x24B5, 0},
        {0x24B6, 0x24E9, 1},
        {0x24EA, 0x24FF, 0},
        {0xFE10, 0xFE12, 0},
        {0xFE13, 0xFE13, 1},
        {0xFE14, 0xFE1F, 0},
        {0xFE50, 0xFE51, 0},
        {0xFE52, 0xFE52, 1},
        {0xFE53, 0xFE54, 0},
        {0xFE55, 0xFE55, 1},
        {0xFE56, 0xFE56, 0},
        {0xFF00, 0xFF06, 0},
        {0xFF07, 0xFF07, 1},
        {0xFF08, 0xFF0D, 0},
        {0xFF0E, 0xFF0E, 1},
        {0xFF0F, 0xFF19, 0},
        {0xFF1A, 0xFF1A, 1},
        {0xFF1B, 0xFF20, 0},
        {0x1F120, 0x1F12F, 0},
        {0x1F130, 0x1F149, 1},
        {0x1F14A, 0x1F14F, 0},
        {0x1F150, 0x1F169, 1},
        {0x1F16A, 0x1F16F, 0},
        {0x1F170, 0x1F189, 1},
        {0x1F18A, 0x1F18F, 0},
};

static size_t put_utf8(uint32_t cp, char *o) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 0x3F)), o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

#define ALPHA "\xce\x91"
#define BETA "\xce\x92"
#define SIGMA "\xce\xa3"
#define LOWER_ALPHA "\xce\xb1"
#define LOWER_SIGMA "\xcf\x83"
#define FINAL_SIGMA "\xcf\x82"

/* The normalized form of prefix + cp + suffix. */
static char *normalize_around(const char *prefix, uint32_t cp, const char *suffix, size_t *len) {
    char text[16];
    size_t n = strlen(prefix);
    memcpy(text, prefix, n);
    n += put_utf8(cp, text + n);
    memcpy(text + n, suffix, strlen(suffix));
    n += strlen(suffix);
    char *out = NULL;
    tg_err err = {{0}};
    if (!CHECK(tg_squad_normalize(text, n, &out, len, &err) == 0, "U+%04X: %s", cp, err.msg)) return NULL;
    return out;
}

TG_TEST(test_squad_normalize_final_sigma_beside_each_character) {
    int checked = 0;
    for (size_t r = 0; r < sizeof k_runs / sizeof *k_runs; r++) {
        for (uint32_t cp = k_runs[r].first; cp <= k_runs[r].last; cp++) {
            const int skip_or_stop = k_runs[r].cased_or_ignorable;
            size_t len = 0;
            char *got = normalize_around(ALPHA, cp, SIGMA, &len);
            if (got) {
                CHECK(len >= 2 && !memcmp(got + len - 2, skip_or_stop ? FINAL_SIGMA : LOWER_SIGMA, 2),
                      "U+%04X before a closing sigma: '%s', want it %s", cp, got, skip_or_stop ? "final" : "not final");
                free(got);
            }
            got = normalize_around(ALPHA SIGMA, cp, BETA, &len);
            if (got) {
                CHECK(len >= 4 && !memcmp(got, skip_or_stop ? LOWER_ALPHA LOWER_SIGMA : LOWER_ALPHA FINAL_SIGMA, 4),
                      "U+%04X after a sigma: '%s', want it %s", cp, got, skip_or_stop ? "not final" : "final");
                free(got);
            }
            checked++;
        }
    }
    CHECK(checked == 0x2E0 + 0x90 + 6 + 0x20 + 0x40 + 0x60 + 0x10 + 7 + 0x21 + 0x70, "%d characters checked", checked);
}

/* Whole normalized forms around U+00A8 DIAERESIS (a modifier symbol, case-ignorable, kept:
 * string.punctuation is ASCII only) and U+00A1 INVERTED EXCLAMATION MARK (punctuation,
 * neither cased nor case-ignorable, kept too). */
TG_TEST(test_squad_normalize_final_sigma_diaeresis_and_inverted_exclamation) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {ALPHA "\xc2\xa8" SIGMA, LOWER_ALPHA "\xc2\xa8" FINAL_SIGMA},
        {ALPHA SIGMA "\xc2\xa8" BETA, LOWER_ALPHA LOWER_SIGMA "\xc2\xa8\xce\xb2"},
        {ALPHA "\xc2\xa1" SIGMA, LOWER_ALPHA "\xc2\xa1" LOWER_SIGMA},
        {ALPHA SIGMA "\xc2\xa1" BETA, LOWER_ALPHA FINAL_SIGMA "\xc2\xa1\xce\xb2"},
        {"The " ALPHA SIGMA "\xc2\xa8\xc2\xa8 " SIGMA "! a", LOWER_ALPHA FINAL_SIGMA "\xc2\xa8\xc2\xa8 " LOWER_SIGMA},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *got = NULL;
        size_t len = 0;
        tg_err err = {{0}};
        if (!CHECK(tg_squad_normalize(cases[i].text, strlen(cases[i].text), &got, &len, &err) == 0, "%s", err.msg)) continue;
        CHECK(len == strlen(cases[i].want) && !memcmp(got, cases[i].want, len), "case %zu: '%s', want '%s'", i, got,
              cases[i].want);
        free(got);
    }
}
