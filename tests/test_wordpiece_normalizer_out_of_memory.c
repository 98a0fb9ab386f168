/* BertNormalizer (datasets/wordpiece.c) when an allocation fails while the normalized text
 * grows past the room reserved for the input (CJK characters spaced, Hangul syllables
 * decomposed, U+0130 lower-cased to two characters): each allocation of an encode fails in
 * turn, alone, and the encode either fails with "out of memory normalizing N bytes" (or, for
 * the buffer of a "##" piece, "out of memory for a word of N bytes") or (an allocation it
 * could do without) gives every token; never fewer tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/tokenizer.h"
#include "tests/harness.h"

static tg_tokenizer *open_bert(int strip_accents) {
    char json[1200], path[700];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
             "\"max_input_chars_per_word\": 100000, \"vocab\": {\"[UNK]\": 0, \"i\": 1, \"\xe4\xb8\xad\": 2, "
             "\"\xe1\x84\x92\": 3, \"##\xe1\x85\xa1\": 4, \"##\xe1\x86\xab\": 5, \"##i\": 6, \"##\xe1\x84\x92\": 7}}, "
             "\"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true, "
             "\"strip_accents\": %s, \"lowercase\": true}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}",
             strip_accents ? "true" : "false");
    snprintf(path, sizeof path, "%s/tokenizer.json", tg_test_tmpdir());
    if (tg_test_write_file(path, json)) return NULL;
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    return t;
}

/* unit repeated `repeat` times; its tokens (ids) each time and their offsets in the unit */
typedef struct unit_case {
    int strip_accents;
    const char *unit;
    int repeat, n_ids;
    int word_bytes; /* the "##" piece's buffer first holds this many bytes (0: no such piece) */
    int32_t ids[4];
    int64_t start[4], end[4];
} unit_case;

static int tokens_match(const tg_encoding *e, const unit_case *c, int verbose) {
    const int64_t ul = (int64_t)strlen(c->unit);
    if (e->n != c->n_ids * c->repeat) {
        if (verbose) CHECK(0, "'%s' x %d: %d tokens, want %d", c->unit, c->repeat, e->n, c->n_ids * c->repeat);
        return 0;
    }
    for (int r = 0; r < c->repeat; r++)
        for (int j = 0; j < c->n_ids; j++) {
            const int k = r * c->n_ids + j;
            if (e->ids[k] != c->ids[j] || e->start[k] != ul * r + c->start[j] || e->end[k] != ul * r + c->end[j]) {
                if (verbose)
                    CHECK(0, "'%s' x %d: token %d is %d:%lld-%lld", c->unit, c->repeat, k, e->ids[k],
                          (long long)e->start[k], (long long)e->end[k]);
                return 0;
            }
        }
    return 1;
}

TG_TEST(test_wordpiece_normalizer_growth_out_of_memory) {
    const unit_case cases[] = {
        /* 中: 3 bytes in, " 中 " 5 out: 2400 in, 4000 out */
        {1, "\xe4\xb8\xad", 800, 1, 0, {2}, {0}, {3}},
        /* "한 ": 4 bytes in, its three jamo (9 bytes) and the space out: 2400 in, 6000 out */
        {1, "\xed\x95\x9c ", 600, 3, 7, {3, 4, 5}, {0, 0, 0}, {3, 3, 3}},
        /* "İİ " (U+0130), accents kept: 5 bytes in, "i" + U+0307 twice and the space (7 bytes)
         * out: 3000 in, 4200 out; U+0307 is no piece: each word one [UNK] */
        {0, "\xc4\xb0\xc4\xb0 ", 600, 1, 7, {0}, {0}, {4}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const size_t ul = strlen(cases[c].unit), len = ul * (size_t)cases[c].repeat;
        char *text = malloc(len + 1);
        REQUIRE(text, "malloc");
        for (int i = 0; i < cases[c].repeat; i++) memcpy(text + ul * (size_t)i, cases[c].unit, ul);
        text[len] = 0;
        char want[200];
        snprintf(want, sizeof want, "out of memory normalizing %zu bytes", len);
        char want_word[100];
        snprintf(want_word, sizeof want_word, "out of memory for a word of %d bytes", cases[c].word_bytes);
        int failed_encodes = 0, failed_words = 0, done = 0;
        for (long k = 0; k < 200 && !done; k++) {
            tg_tokenizer *t = open_bert(cases[c].strip_accents);
            if (!t) break;
            tg_encoding e = {0};
            tg_err err = {{0}};
            const tg_encode_options o = {.add_special_tokens = 0};
            const long failures = tg_alloc_failures();
            tg_alloc_fail_only(k);
            const int rc = tg_tokenizer_encode(t, text, len, NULL, 0, &o, &e, &err);
            tg_alloc_fail_after(-1);
            const int refused = tg_alloc_failures() != failures;
            if (rc == 0) {
                CHECK(tokens_match(&e, &cases[c], 1), "case %zu, allocation %ld failing", c, k);
                done = !refused;
            } else {
                CHECK(refused, "case %zu: encode failed with no allocation refused: %s", c, err.msg);
                failed_encodes += !strcmp(err.msg, want);
                failed_words += !strcmp(err.msg, want_word);
            }
            tg_encoding_free(&e);
            tg_tokenizer_free(t);
        }
        CHECK(done, "case %zu: the encode never succeeded", c);
        /* the growth of the normalized text, its start and its end offsets: each allocation
         * failing stops the normalizer */
        /* the buffer of "##" + the rest of a word (up to the longest entry), made once */
        CHECK(failed_words == (cases[c].word_bytes > 0), "case %zu: %d encodes failed with '%s'", c, failed_words, want_word);
        CHECK(failed_encodes >= 3, "case %zu: %d encodes failed with '%s'", c, failed_encodes, want);
        free(text);
    }
}
