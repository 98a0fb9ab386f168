/* BertNormalizer's clean_text in datasets/wordpiece.c, on both of its paths (a run of ASCII
 * done in place, and character by character once an accent is pending): tab, newline and
 * carriage return become spaces, other control characters (NUL, U+0001, VT, FF, U+001F,
 * DEL, U+0085), U+FFFD and format characters are dropped, U+00A0 is a space; without
 * clean_text each stays (whitespace still splits words). Against strip_accents and
 * lowercase on and off. Every expected encoding is what Hugging Face `tokenizers` 0.23
 * gives for the same file and text (its character offsets turned into bytes). */
#include <stdio.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* clean_text, strip_accents, lowercase of each column below */
static const int k_config[4][3] = {{1, 1, 1}, {1, 0, 0}, {0, 1, 0}, {0, 0, 1}};

static const struct {
    const char *text;
    size_t len;
    const char *want[4]; /* ID:START-END, no template */
} k_cases[] = {
        {"x\x09x", 3, {"4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3"}},
        {"x\x0ax", 3, {"4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3"}},
        {"x\x0dx", 3, {"4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3"}},
        {"x\x01x", 3, {"4:0-1 5:2-3", "4:0-1 5:2-3", "1:0-3", "1:0-3"}},
        {"x\x0bx", 3, {"4:0-1 5:2-3", "4:0-1 5:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3"}},
        {"x\x0cx", 3, {"4:0-1 5:2-3", "4:0-1 5:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3"}},
        {"x\x1fx", 3, {"4:0-1 5:2-3", "4:0-1 5:2-3", "1:0-3", "1:0-3"}},
        {"x\x7fx", 3, {"4:0-1 5:2-3", "4:0-1 5:2-3", "1:0-3", "1:0-3"}},
        {"x\x00x", 3, {"4:0-1 5:2-3", "4:0-1 5:2-3", "1:0-3", "1:0-3"}},
        {"x x", 3, {"4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3", "4:0-1 4:2-3"}},
        {"\xc3\xa9\x09x", 4, {"6:0-2 4:3-4", "1:0-2 4:3-4", "6:0-2 4:3-4", "1:0-2 4:3-4"}},
        {"\xc3\xa9\x0dx", 4, {"6:0-2 4:3-4", "1:0-2 4:3-4", "6:0-2 4:3-4", "1:0-2 4:3-4"}},
        {"\xc3\xa9\x0ax", 4, {"6:0-2 4:3-4", "1:0-2 4:3-4", "6:0-2 4:3-4", "1:0-2 4:3-4"}},
        {"\xc3\xa9\x01x", 4, {"6:0-2 5:3-4", "1:0-4", "1:0-4", "1:0-4"}},
        {"\xc3\xa9\x7fx", 4, {"6:0-2 5:3-4", "1:0-4", "1:0-4", "1:0-4"}},
        {"\xc3\xa9\x00x", 4, {"6:0-2 5:3-4", "1:0-4", "1:0-4", "1:0-4"}}, /* NUL while the accent is pending */
        {"x\xc2\x85x", 4, {"4:0-1 5:3-4", "4:0-1 5:3-4", "4:0-1 4:3-4", "4:0-1 4:3-4"}},
        {"x\xc2\xa0x", 4, {"4:0-1 4:3-4", "4:0-1 4:3-4", "4:0-1 4:3-4", "4:0-1 4:3-4"}},
        {"x\xef\xbf\xbdx", 5, {"4:0-1 5:4-5", "4:0-1 5:4-5", "1:0-5", "1:0-5"}},
        {"x\xe2\x80\x8bx", 5, {"4:0-1 5:4-5", "4:0-1 5:4-5", "1:0-5", "1:0-5"}},
        {"X\x0dX", 3, {"4:0-1 4:2-3", "8:0-1 8:2-3", "8:0-1 8:2-3", "4:0-1 4:2-3"}},
        {"\xc3\xa9\x0d\xc3\xa9", 5, {"6:0-2 6:3-5", "1:0-2 1:3-5", "6:0-2 6:3-5", "1:0-2 1:3-5"}},
};

static tg_tokenizer *open_bert(int clean_text, int strip_accents, int lowercase) {
    char json[1200];
    snprintf(json, sizeof json,
             "{'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'vocab': {'[PAD]': 0, '[UNK]': 1, '[CLS]': 2, "
             "'[SEP]': 3, 'x': 4, '##x': 5, 'e': 6, '##e': 7, 'X': 8}}, 'normalizer': {'type': 'BertNormalizer', "
             "'clean_text': %s, 'handle_chinese_chars': true, 'strip_accents': %s, 'lowercase': %s}, "
             "'pre_tokenizer': {'type': 'BertPreTokenizer'}}",
             clean_text ? "true" : "false", strip_accents ? "true" : "false", lowercase ? "true" : "false");
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    return t;
}

TG_TEST(test_wordpiece_clean_text_controls_and_spaces) {
    for (int c = 0; c < 4; c++) {
        tg_tokenizer *t = open_bert(k_config[c][0], k_config[c][1], k_config[c][2]);
        if (!t) continue;
        const tg_encode_options opt = {.add_special_tokens = 0};
        for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
            tg_encoding e = {0};
            tg_err err = {{0}};
            if (!CHECK(tg_tokenizer_encode(t, k_cases[i].text, k_cases[i].len, NULL, 0, &opt, &e, &err) == 0,
                       "config %d case %zu: %s", c, i, err.msg))
                continue;
            char got[256] = "";
            size_t n = 0;
            for (int32_t k = 0; k < e.n && n + 40 < sizeof got; k++)
                n += (size_t)snprintf(got + n, sizeof got - n, "%s%d:%lld-%lld", k ? " " : "", e.ids[k],
                                      (long long)e.start[k], (long long)e.end[k]);
            CHECK(!strcmp(got, k_cases[i].want[c]), "config %d (clean %d, strip %d, lower %d) case %zu: got '%s', want '%s'",
                  c, k_config[c][0], k_config[c][1], k_config[c][2], i, got, k_cases[i].want[c]);
            tg_encoding_free(&e);
        }
        tg_tokenizer_free(t);
    }
}
