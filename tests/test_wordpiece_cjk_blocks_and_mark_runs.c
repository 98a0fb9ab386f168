/* BertNormalizer in datasets/wordpiece.c against Hugging Face tokenizers 0.23 on the same
 * tokenizer.json: the CJK blocks that get spaces around them, each block's first and last
 * code point and the ones beside it (HF's list, 0x2B920 included, 0x2B820 left out);
 * and, with accents stripped, words whose combining characters (U+1D165, a spacing mark
 * of class 216 that stays) pile up behind precomposed letters, so that the queue of
 * original ranges fills while part of it is handed out and moves down, more than once:
 * every token's byte range as HF gives it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"

static tg_tokenizer *open_bert(const char *vocab, int strip_accents, int lowercase) {
    char json[2000];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
             "\"max_input_chars_per_word\": 100, \"vocab\": {%s}}, "
             "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
             "\"strip_accents\": %s, \"lowercase\": %s}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}",
             vocab, strip_accents ? "true" : "false", lowercase ? "true" : "false");
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer.json", tg_test_tmpdir());
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    if (tg_test_write_file(path, json) == 0) CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open: %s", err.msg);
    return t;
}

/* "ID:START-END ..." of text, no special tokens. */
static void ranges(tg_tokenizer *t, const char *text, size_t len, char *got, size_t cap) {
    tg_encoding e = {0};
    tg_err err = {{0}};
    const tg_encode_options o = {.add_special_tokens = 0};
    got[0] = 0;
    if (tg_tokenizer_encode(t, text, len, NULL, 0, &o, &e, &err)) {
        snprintf(got, cap, "error: %s", err.msg);
    } else {
        size_t n = 0;
        for (int32_t j = 0; j < e.n && n + 40 < cap; j++)
            n += (size_t)snprintf(got + n, cap - n, "%s%d:%lld-%lld", j ? " " : "", e.ids[j], (long long)e.start[j],
                                  (long long)e.end[j]);
    }
    tg_encoding_free(&e);
}

static size_t put_utf8(char *s, unsigned cp) {
    if (cp < 0x80) return s[0] = (char)cp, 1;
    if (cp < 0x800) return s[0] = (char)(0xC0 | cp >> 6), s[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return s[0] = (char)(0xE0 | cp >> 12), s[1] = (char)(0x80 | (cp >> 6 & 63)), s[2] = (char)(0x80 | (cp & 63)), 3;
    s[0] = (char)(0xF0 | cp >> 18), s[1] = (char)(0x80 | (cp >> 12 & 63)), s[2] = (char)(0x80 | (cp >> 6 & 63));
    s[3] = (char)(0x80 | (cp & 63));
    return 4;
}

TG_TEST(test_wordpiece_cjk_block_edges_match_hf) {
    static const struct {
        unsigned cp;
        int spaced;
    } cases[] = {
        {0x4E00, 1},  {0x9FFF, 1},  {0x4DFF, 0},  {0xA000, 0},  {0x3400, 1},  {0x4DBF, 1},  {0x33FF, 0},
        {0x20000, 1}, {0x2A6DF, 1}, {0x1FFFF, 0}, {0x2A6E0, 0}, {0x2A700, 1}, {0x2B73F, 1}, {0x2A6FF, 0},
        {0x2B740, 1}, {0x2B741, 1}, {0x2B81F, 1}, {0x2B820, 0}, {0x2B91F, 0}, {0x2B920, 1}, {0x2CEAF, 1},
        {0x2CEB0, 0}, {0xF900, 1},  {0xFAFF, 1},  {0xFB00, 0},  {0x2F800, 1}, {0x2FA1F, 1}, {0x2F7FF, 0},
        {0x2FA20, 0},
    };
    tg_tokenizer *t = open_bert("\"[UNK]\": 0, \"a\": 1, \"b\": 2", 0, 0);
    REQUIRE(t, "no tokenizer");
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[8], got[256], want[64];
        size_t n = 0;
        text[n++] = 'a';
        const size_t k = put_utf8(text + n, cases[i].cp);
        n += k;
        text[n++] = 'b';
        /* spaced: a, the character (unknown), b; else one unknown word */
        if (cases[i].spaced) snprintf(want, sizeof want, "1:0-1 0:1-%zu 2:%zu-%zu", 1 + k, 1 + k, 2 + k);
        else snprintf(want, sizeof want, "0:0-%zu", 2 + k);
        ranges(t, text, n, got, sizeof got);
        CHECK(!strcmp(got, want), "U+%04X: got '%s', want '%s'", cases[i].cp, got, want);
    }
    tg_tokenizer_free(t);
}

typedef struct run {
    int skip;  /* bytes before the run (a space) */
    int id;    /* each token's id */
    int bytes; /* each token's bytes */
    int count;
} run;

static void runs_text(const run *r, int n, char *out, size_t cap) {
    size_t k = 0;
    int at = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        at += r[i].skip;
        for (int j = 0; j < r[i].count && k + 40 < cap; j++, at += r[i].bytes)
            k += (size_t)snprintf(out + k, cap - k, "%s%d:%d-%d", k ? " " : "", r[i].id, at, at + r[i].bytes);
    }
}

TG_TEST(test_wordpiece_mark_runs_fill_the_range_queue) {
    /* U+1D165 MUSICAL SYMBOL COMBINING STEM (Mc, class 216) and its continuation */
    tg_tokenizer *t = open_bert("\"[UNK]\": 0, \"a\": 1, \"b\": 2, \"e\": 3, \"##e\": 4, \"x\": 5, \"\xf0\x9d\x85\xa5\": 6, "
                                "\"##\xf0\x9d\x85\xa5\": 7",
                                1, 1);
    REQUIRE(t, "no tokenizer");
    static const struct {
        int e1, s1, e2, s2; /* e-acute, stem, then (after a space) again; then " x" */
        run want[9];
        int n_runs;
    } cases[] = {
        {10, 60, 0, 0, {{0, 3, 2, 1}, {0, 4, 2, 9}, {0, 7, 4, 60}, {1, 5, 1, 1}}, 4},
        {20, 70, 33, 40,
         {{0, 3, 2, 1}, {0, 4, 2, 19}, {0, 7, 4, 70}, {1, 3, 2, 1}, {0, 4, 2, 32}, {0, 7, 4, 40}, {1, 5, 1, 1}},
         7},
        {1, 99, 0, 0, {{0, 3, 2, 1}, {0, 7, 4, 99}, {1, 5, 1, 1}}, 3},
    };
    char *text = malloc(4096), *got = malloc(16384), *want = malloc(16384);
    REQUIRE(text && got && want, "malloc");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n = 0;
        for (int i = 0; i < cases[c].e1; i++) n += put_utf8(text + n, 0xE9);
        for (int i = 0; i < cases[c].s1; i++) n += put_utf8(text + n, 0x1D165);
        if (cases[c].e2) {
            text[n++] = ' ';
            for (int i = 0; i < cases[c].e2; i++) n += put_utf8(text + n, 0xE9);
            for (int i = 0; i < cases[c].s2; i++) n += put_utf8(text + n, 0x1D165);
        }
        text[n++] = ' ', text[n++] = 'x';
        runs_text(cases[c].want, cases[c].n_runs, want, 16384);
        ranges(t, text, n, got, 16384);
        CHECK(!strcmp(got, want), "case %zu: got '%.300s...', want '%.300s...'", c, got, want);
        /* the same text again: the queue starts empty each time */
        ranges(t, text, n, got, 16384);
        CHECK(!strcmp(got, want), "case %zu again: got '%.300s...'", c, got);
    }
    free(text), free(got), free(want);
    tg_tokenizer_free(t);
}
