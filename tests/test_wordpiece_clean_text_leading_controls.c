/* BertNormalizer's clean_text in datasets/wordpiece.c on text that begins with control
 * characters it drops (its run of ASCII done in place writes nothing, with nothing written
 * before it), on text that is nothing else, and on a dropped run between accented letters
 * and before a combining mark; whitespace beyond ASCII before accents and marks. Against clean_text, strip_accents and lowercase on and off;
 * every expected encoding is what Hugging Face `tokenizers` 0.23 gives for the same file and
 * text (its character offsets turned into bytes). Under ASan a read before the offsets
 * buffer fails here. */
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
    {"\x01x", 2, {"4:1-2", "4:1-2", "1:0-2", "1:0-2"}},
    {"\x01\x02", 2, {"", "", "1:0-2", "1:0-2"}},
    {"\x7f\xc3\xa9x", 4, {"6:1-3 5:3-4", "1:1-4", "1:0-4", "1:0-4"}},
    {"\x00\x01 x", 4, {"4:3-4", "4:3-4", "1:0-2 4:3-4", "1:0-2 4:3-4"}},
    {"\xc3\xa9\x01\x02\xc3\xa9", 6, {"6:0-2 7:4-6", "1:0-6", "1:0-6", "1:0-6"}},
    {"\x01\x0b\x1f\xcc\x81x", 6, {"4:5-6", "1:3-6", "1:0-1 1:2-6", "1:0-1 1:2-6"}},
    {"\x01\xc3\xa9\x01x", 5, {"6:1-3 5:4-5", "1:1-5", "1:0-5", "1:0-5"}},
    {"\x1f\x01X\x01", 4, {"4:2-3", "8:2-3", "1:0-4", "1:0-4"}},
    /* whitespace beyond ASCII (U+3000, U+2000 and U+2001 which NFD maps to U+2002 and U+2003,
     * U+1680, U+00A0), before accents and marks */
    {"x\xe3\x80\x80x", 5, {"4:0-1 4:4-5", "4:0-1 4:4-5", "4:0-1 4:4-5", "4:0-1 4:4-5"}},
    {"\xc3\xa9\xe2\x80\x80\xcc\x81x", 8, {"6:0-2 4:7-8", "1:0-2 1:5-8", "6:0-2 4:7-8", "1:0-2 1:5-8"}},
    {"\xe2\x80\x81x", 4, {"4:3-4", "4:3-4", "4:3-4", "4:3-4"}},
    {"x\xe1\x9a\x80\xc3\xa9", 6, {"4:0-1 6:4-6", "4:0-1 1:4-6", "4:0-1 6:4-6", "4:0-1 1:4-6"}},
    {"\xc2\xa0\xcc\x81X", 5, {"4:4-5", "1:2-5", "8:4-5", "1:2-5"}},
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

TG_TEST(test_wordpiece_clean_text_leading_dropped_controls) {
    for (int c = 0; c < 4; c++) {
        tg_tokenizer *t = open_bert(k_config[c][0], k_config[c][1], k_config[c][2]);
        if (!t) continue;
        const tg_encode_options opt = {.add_special_tokens = 0};
        for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++)
            for (int pass = 0; pass < 2; pass++) { /* the second with the buffers as the first left them */
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
                CHECK(!strcmp(got, k_cases[i].want[c]),
                      "config %d (clean %d, strip %d, lower %d) case %zu pass %d: got '%s', want '%s'", c, k_config[c][0],
                      k_config[c][1], k_config[c][2], i, pass, got, k_cases[i].want[c]);
                tg_encoding_free(&e);
            }
        tg_tokenizer_free(t);
    }
}
