/* The UTF-8 check of datasets/tokenizer.c (utf8_invalid_at): tg_tokenizer_encode refuses a
 * text or pair that is not well-formed UTF-8 (RFC 3629: each lead byte's second-byte range,
 * overlong forms, surrogates, code points past U+10FFFF, cut sequences) with the offset of
 * the first bad byte, and encodes every well-formed one, four-byte characters with the F4
 * lead (U+100000 .. U+10FFFF) included; a vocab.txt line that is not UTF-8 is refused with
 * its line number. The eight-bytes-at-a-time ASCII scan must report the same offsets. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

static const struct {
    const char *s;
    int64_t bad; /* the offset of the first bad byte, or -1 */
} k_cases[] = {
    {"", -1},
    {"plain ascii", -1},
    {"a\xc2\x80z", -1},               /* smallest two-byte */
    {"\xdf\xbf", -1},                 /* largest two-byte */
    {"ab\xc1\xbf", 2},                /* C0, C1: overlong leads */
    {"\xc0\x80", 0},
    {"\xdf\xbf\xc2", 2},              /* two-byte cut at the end */
    {"\xc2\x41", 0},                  /* second byte not a continuation */
    {"\xc2\xc2\x80", 0},
    {"\xe0\xa0\x80", -1},             /* smallest three-byte */
    {"x\xe0\x9f\xbf", 1},             /* E0: overlong below U+0800 */
    {"\xe1\x80\x80\xec\xbf\xbf", -1}, /* E1..EC */
    {"\xe1\x80\x41", 0},              /* third byte not a continuation */
    {"\xe1\x80\xc0", 0},
    {"\xe1\x80", 0},                  /* cut */
    {"\xed\x9f\xbf", -1},             /* U+D7FF */
    {"\xed\xa0\x80", 0},              /* surrogates */
    {"\xed\xbf\xbf", 0},
    {"\xee\x80\x80\xef\xbf\xbf", -1}, /* EE, EF up to U+FFFF */
    {"\xf0\x90\x80\x80", -1},         /* smallest four-byte */
    {"\xf0\x8f\xbf\xbf", 0},          /* F0: overlong below U+10000 */
    {"\xf1\x80\x80\x80\xf3\xbf\xbf\xbf", -1},
    {"\xf4\x80\x80\x80", -1},         /* U+100000 */
    {"\xf4\x8f\xbf\xbf", -1},         /* U+10FFFF */
    {"a\xf4\x8f\xbf\xbf" "b", -1},
    {"ok\xf4\x90\x80\x80", 2},        /* past U+10FFFF */
    {"\xf4\x8f\xbf", 0},              /* cut */
    {"\xf4\x8f\xbf\x41", 0},          /* fourth byte not a continuation */
    {"\xf5\x80\x80\x80", 0},          /* F5 and above: no lead */
    {"\xf8\x88\x80\x80\x80", 0},
    {"\xff", 0},
    {"\x80", 0},                      /* a continuation alone */
    {"\xe0\x7f\x80", 0},
    {"abcdefgh\xff", 8},              /* after one ASCII word */
    {"abcdefghijklmnop\xc3", 16},     /* after two */
    {"abcdefg\xc3\xa9hijklmno\xff", 17},
    {"abcdefg\xf4\x8f\xbf\xbfhijklmnopqrstu", -1},
    {"abcdefghijklmnopqrstuvw\x80", 23},
};

static tg_tokenizer *open_bytes_bpe(void) {
    char *vocab = tg_test_bpe_vocab_json("");
    char json[16384];
    /* written as it is: the vocabulary has the byte character ' as a key */
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": []}, \"pre_tokenizer\": "
                                "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}}",
             vocab);
    free(vocab);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", tg_test_tmpdir());
    if (!CHECK(tg_test_write_file(path, json) == 0, "write %s", path)) return NULL;
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open: %s", err.msg);
    return t;
}

TG_TEST(test_tokenizer_utf8_refusals_text_and_pair) {
    tg_tokenizer *t = open_bytes_bpe();
    REQUIRE(t, "no tokenizer");
    const tg_encode_options opt = {.add_special_tokens = 0};
    tg_encoding e = {0};
    for (size_t k = 0; k < sizeof k_cases / sizeof *k_cases; k++) {
        const char *s = k_cases[k].s;
        const size_t n = strlen(s);
        char want[96];
        for (int as_pair = 0; as_pair < 2; as_pair++) {
            tg_err err = {{0}};
            const int rc = as_pair ? tg_tokenizer_encode(t, "ok", 2, s, n, &opt, &e, &err)
                                   : tg_tokenizer_encode(t, s, n, NULL, 0, &opt, &e, &err);
            if (k_cases[k].bad < 0) {
                /* byte-level BPE without merges: one token per byte */
                CHECK(rc == 0 && e.n == (int32_t)n + (as_pair ? 2 : 0), "case %zu (%s): rc %d, %d tokens: %s", k,
                      as_pair ? "pair" : "text", rc, e.n, err.msg);
                continue;
            }
            snprintf(want, sizeof want, "%s: invalid UTF-8 at byte %lld", as_pair ? "pair" : "text",
                     (long long)k_cases[k].bad);
            CHECK(rc == -1 && !strcmp(err.msg, want), "case %zu: rc %d, '%s', want '%s'", k, rc, err.msg, want);
        }
    }
    /* the length bounds the check: a bad byte past it is not seen */
    tg_err err = {{0}};
    CHECK(tg_tokenizer_encode(t, "ab\xff", 2, NULL, 0, &opt, &e, &err) == 0 && e.n == 2, "len bound: %s", err.msg);
    /* the text is checked before the pair */
    CHECK(tg_tokenizer_encode(t, "\xff", 1, "\xfe", 1, &opt, &e, &err) == -1 &&
              !strcmp(err.msg, "text: invalid UTF-8 at byte 0"),
          "text first: '%s'", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_utf8_refusals_vocab_txt) {
    char path[600];
    snprintf(path, sizeof path, "%s/vocab.txt", tg_test_tmpdir());
    /* F4 leads are characters like any other: lines 5 and 6 */
    REQUIRE(tg_test_write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n\xf4\x8f\xbf\xbf\n\xf4\x80\x80\x80\nab\n") == 0,
            "write %s", path);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "open: %s", err.msg);
    CHECK(tg_tokenizer_token_id(t, "\xf4\x8f\xbf\xbf") == 4 && tg_tokenizer_token_id(t, "\xf4\x80\x80\x80") == 5 &&
              tg_tokenizer_token_id(t, "ab") == 6,
          "ids %d %d %d", tg_tokenizer_token_id(t, "\xf4\x8f\xbf\xbf"), tg_tokenizer_token_id(t, "\xf4\x80\x80\x80"),
          tg_tokenizer_token_id(t, "ab"));
    const tg_encode_options opt = {.add_special_tokens = 0};
    tg_encoding e = {0};
    /* BERT's clean_text drops U+100000 (private use, as HF's is_control) and keeps U+10FFFF
     * (unassigned): HF gives ids [6, 4] at characters (2, 4), (5, 6) */
    if (CHECK(tg_tokenizer_encode(t, "\xf4\x80\x80\x80 ab \xf4\x8f\xbf\xbf", 12, NULL, 0, &opt, &e, &err) == 0, "%s",
              err.msg))
        CHECK(e.n == 2 && e.ids[0] == 6 && e.start[0] == 5 && e.end[0] == 7 && e.ids[1] == 4 && e.start[1] == 8 &&
                  e.end[1] == 12,
              "%d tokens: %d %d", e.n, e.ids[0], e.ids[1]);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);

    static const struct {
        const char *text;
        int line;
    } bad[] = {
        {"[UNK]\nok\n\xf4\x90\x80\x80\n", 3},
        {"\xc0\x80\n[UNK]\n", 1},
        {"[UNK]\n\xed\xa0\x80", 2},
        {"[UNK]\nabcdefghijkl\xe1\x80\n", 2},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        REQUIRE(tg_test_write_file(path, bad[k].text) == 0, "write %s", path);
        t = NULL;
        memset(&err, 0, sizeof err);
        char want[700];
        snprintf(want, sizeof want, "%s:%d: invalid UTF-8", path, bad[k].line);
        CHECK(tg_tokenizer_open(path, &t, &err) == -1 && !t && !strcmp(err.msg, want), "case %zu: '%s', want '%s'",
              k, err.msg, want);
        tg_tokenizer_free(t);
    }
}
