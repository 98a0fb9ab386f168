/* BertNormalizer's offsets in datasets/wordpiece.c (normalize, strip_stage, flush_pending):
 * ASCII runs next to combining marks, marks reordered and dropped, decompositions into
 * several characters (U+1E09, Hangul, U+0130), CJK characters spaced out and control
 * characters cleaned, with accents stripped and lower-casing each on and off. Each token's
 * id and byte range, the last token's end included, are Hugging Face tokenizers 0.23's on
 * the same tokenizer.json. */
#include <stdio.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

#define VOCAB "'[UNK]': 0, 'a': 1, 'b': 2, 'c': 3, 'e': 4, 'x': 5, 'y': 6, 't': 7, 'cafe': 8, 'ete': 9, 'abc': 10, '##e': 11, " \
    "'##a': 12, '##b': 13, '##c': 14, '##y': 15, '##t': 16, '\xe4\xb8\xad': 17, '##x': 18, 'i': 19, '##i': 20, " \
    "'\xe1\x84\x80': 21, '##\xe1\x85\xa1': 22"

static tg_tokenizer *open_bert(int strip_accents, int lowercase) {
    char json[2000];
    snprintf(json, sizeof json,
             "{'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'continuing_subword_prefix': '##', "
             "'max_input_chars_per_word': 100, 'vocab': {" VOCAB "}}, "
             "'normalizer': {'type': 'BertNormalizer', 'clean_text': true, 'handle_chinese_chars': true, "
             "'strip_accents': %s, 'lowercase': %s}, 'pre_tokenizer': {'type': 'BertPreTokenizer'}}",
             strip_accents ? "true" : "false", lowercase ? "true" : "false");
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open %s: %s", json, err.msg);
    return t;
}

TG_TEST(test_wordpiece_normalizer_offsets_match_hf) {
    static const struct {
        int strip_accents, lowercase;
    } configs[] = {{1, 1}, {0, 1}, {1, 0}};
    /* ID:START-END for each token, no template; want[k] under configs[k] */
    static const struct {
        const char *text, *want[3];
    } cases[] = {
        {"Cafe\xcc\x81 x", {"8:0-4 5:7-8", "0:0-6 5:7-8", "0:0-4 5:7-8"}},
        {"e\xcc\x81\xcc\x81" "a", {"4:0-1 12:5-6", "0:0-6", "4:0-1 12:5-6"}},
        {"\xc3\x89t\xc3\xa9 ABC", {"9:0-5 10:6-9", "0:0-5 10:6-9", "0:0-5 0:6-9"}},
        {"x\xcc\x96\xcc\x81y", {"5:0-1 15:5-6", "0:0-6", "5:0-1 15:5-6"}},
        {"\xe1\xb8\x89" "a", {"3:0-3 12:3-4", "0:0-4", "3:0-3 12:3-4"}},
        {"ab\xcc\x81", {"1:0-1 13:1-2", "0:0-4", "1:0-1 13:1-2"}},
        {"a\x09" "b\x01" "c", {"1:0-1 2:2-3 14:4-5", "1:0-1 2:2-3 14:4-5", "1:0-1 2:2-3 14:4-5"}},
        {"a\xe4\xb8\xad" "b", {"1:0-1 17:1-4 2:4-5", "1:0-1 17:1-4 2:4-5", "1:0-1 17:1-4 2:4-5"}},
        {"\xc4\xb0x", {"19:0-2 18:2-3", "0:0-3", "0:0-3"}},
        {"\xea\xb0\x80" "a b", {"21:0-3 22:0-3 12:3-4 2:5-6", "0:0-4 2:5-6", "21:0-3 22:0-3 12:3-4 2:5-6"}},
        {"AB\xcc\x81\xcc\x96" "C", {"10:0-7", "0:0-7", "0:0-7"}},
    };
    for (size_t k = 0; k < sizeof configs / sizeof *configs; k++) {
        tg_tokenizer *t = open_bert(configs[k].strip_accents, configs[k].lowercase);
        if (!t) continue;
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            tg_encoding e = {0};
            tg_err err = {{0}};
            const tg_encode_options opt = {.add_special_tokens = 0};
            if (CHECK(tg_tokenizer_encode(t, cases[i].text, strlen(cases[i].text), NULL, 0, &opt, &e, &err) == 0,
                      "config %zu case %zu: %s", k, i, err.msg)) {
                char got[512] = "";
                size_t n = 0;
                for (int32_t j = 0; j < e.n && n + 40 < sizeof got; j++)
                    n += (size_t)snprintf(got + n, sizeof got - n, "%s%d:%lld-%lld", j ? " " : "", e.ids[j],
                                          (long long)e.start[j], (long long)e.end[j]);
                CHECK(!strcmp(got, cases[i].want[k]), "strip_accents %d lowercase %d, case %zu: got '%s', want '%s'",
                      configs[k].strip_accents, configs[k].lowercase, i, got, cases[i].want[k]);
            }
            tg_encoding_free(&e);
        }
        tg_tokenizer_free(t);
    }
}
