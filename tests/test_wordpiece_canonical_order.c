/* BertNormalizer with accents stripped (datasets/wordpiece.c) decomposes and puts the
 * combining characters that stay in canonical order, a stable sort on their class, as NFD
 * does: spacing marks U+1D16D (class 226) and U+1D165 (class 216) after a letter come out
 * 216 first, marks of one class in the order they came. */
#include <stdio.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"

#define DOT "\xF0\x9D\x85\xAD"  /* U+1D16D, class 226 */
#define STEM "\xF0\x9D\x85\xA5" /* U+1D165, class 216 */

static tg_tokenizer *open_bert(const char *vocab) {
    char json[2000];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
             "\"max_input_chars_per_word\": 100, \"vocab\": {%s}}, "
             "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
             "\"strip_accents\": true, \"lowercase\": false}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}",
             vocab);
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer.json", tg_test_tmpdir());
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    if (tg_test_write_file(path, json) == 0) CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open: %s", err.msg);
    return t;
}

/* "ID:START-END ..." of text, no special tokens. */
static void ranges(tg_tokenizer *t, const char *text, char *got, size_t cap) {
    tg_encoding e = {0};
    tg_err err = {{0}};
    const tg_encode_options o = {.add_special_tokens = 0};
    got[0] = 0;
    if (tg_tokenizer_encode(t, text, strlen(text), NULL, 0, &o, &e, &err)) {
        snprintf(got, cap, "error: %s", err.msg);
    } else {
        size_t n = 0;
        for (int32_t j = 0; j < e.n && n + 40 < cap; j++)
            n += (size_t)snprintf(got + n, cap - n, "%s%d:%lld-%lld", j ? " " : "", e.ids[j], (long long)e.start[j],
                                  (long long)e.end[j]);
    }
    tg_encoding_free(&e);
}

TG_TEST(test_wordpiece_marks_in_canonical_order) {
    tg_tokenizer *t = open_bert("\"[UNK]\": 0, \"a" STEM DOT "\": 1, \"a" DOT STEM "\": 2, "
                                "\"b" STEM STEM STEM DOT DOT DOT "\": 3, \"c" STEM DOT DOT "\": 4");
    REQUIRE(t, "tokenizer");
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"a" DOT STEM, "1:0-9"},                          /* swapped into order */
        {"a" STEM DOT, "1:0-9"},                          /* already in order */
        {"b" DOT STEM DOT STEM DOT STEM, "3:0-25"},      /* each 216 moves before every 226 */
        {"c" DOT DOT STEM, "4:0-13"},                     /* moves past two */
        {"x a" DOT STEM " c" DOT STEM DOT, "0:0-1 1:2-11 4:12-25"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char got[400];
        ranges(t, cases[i].text, got, sizeof got);
        CHECK(!strcmp(got, cases[i].want), "case %zu: %s, want %s", i, got, cases[i].want);
    }
    tg_tokenizer_free(t);
}
