/* The tokenizers on small hand-made vocabularies (no network): WordPiece's normalizer,
 * [UNK] and the max-chars-per-word rule, added tokens written in the text, templates,
 * truncation longest-first to exact lengths, padding, byte offsets, invalid UTF-8
 * refused with its offset; byte-level BPE's merges, offsets inside multi-byte
 * characters, RoBERTa's template and <mask>, the merge cache past its bound; the files'
 * errors; and `tunegraph tokenize`. Agreement with Hugging Face on real tokenizer files
 * is tests/test_tokenizer_agreement.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "datasets/tokenizer.h"
#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* ---- fixtures ------------------------------------------------------------------------ */

static const char bert_vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\nun\n##aff\n##able\na\n##a\n"
                                 "\xe4\xb8\xad\ncafe\n.\n##s\nx\n"
                                 "x\xf0\x9d\x85\xa5\xe3\x80\xae\n"; /* x U+1D165 U+302E: two spacing marks in canonical order */
enum { PAD = 0, UNK = 1, CLS = 2, SEP = 3, MASK = 4, HELLO = 5, WORLD = 6, COMMA = 7, BANG = 8, UN = 9, AFF = 10,
       ABLE = 11, A = 12, HASH_A = 13, ZHONG = 14, CAFE = 15, X = 18, X_MARKS = 19 };

static const char *write_in(const char *dir, const char *name, const char *text) {
    static char path[4][600];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 600, "%s/%s", dir, name);
    if (tg_test_write_file(p, text)) abort();
    return p;
}

static tg_tokenizer *open_ok(const char *path) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    if (!CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open %s: %s", path, err.msg)) return NULL;
    return t;
}

static tg_tokenizer *bert(void) {
    const char *dir = tg_test_tmpdir();
    return open_ok(write_in(dir, "vocab.txt", bert_vocab));
}

/* Encodes; 1 when it succeeded and the ids are want[0..n). */
static int encodes_to(tg_tokenizer *t, const char *text, const char *pair, const tg_encode_options *o, tg_encoding *e,
                      const int32_t *want, int32_t n) {
    tg_err err = {{0}};
    if (!CHECK(tg_tokenizer_encode(t, text, strlen(text), pair, pair ? strlen(pair) : 0, o, e, &err) == 0,
               "encode '%s': %s", text, err.msg))
        return 0;
    int same = e->n == n;
    for (int32_t i = 0; same && i < n; i++) same = e->ids[i] == want[i];
    if (!same) {
        char got[512] = "";
        for (int32_t i = 0; i < e->n && strlen(got) < 480; i++) snprintf(got + strlen(got), 16, " %d", e->ids[i]);
        CHECK(0, "'%s': got%s (%d ids, want %d)", text, got, e->n, n);
    }
    return same;
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (int32_t)(sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

static int offsets_are(const tg_encoding *e, int32_t i, int64_t start, int64_t end) {
    return CHECK(e->start[i] == start && e->end[i] == end, "token %d offsets %lld-%lld, want %lld-%lld", i,
                 (long long)e->start[i], (long long)e->end[i], (long long)start, (long long)end);
}

static void expect_encode_error(tg_tokenizer *t, const char *text, size_t len, const char *pair, size_t pair_len,
                                const tg_encode_options *o, const char *want) {
    tg_encoding e = {0};
    tg_err err = {{0}};
    CHECK(tg_tokenizer_encode(t, text, len, pair, pair_len, o, &e, &err) == -1, "'%s' was accepted", text);
    CHECK(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    tg_encoding_free(&e);
}

enum { HELLO_B = 259, SP_WORLD = 264, EOT = 265, BOS = 266, EOS = 267, RPAD = 268, RUNK = 269, RMASK = 270 };
static const char roberta_extra[] = ", \"<s>\": 266, \"</s>\": 267, \"<pad>\": 268, \"<unk>\": 269, \"<mask>\": 270";

static tg_tokenizer *gpt2(void) {
    const char *dir = tg_test_tmpdir();
    char *v = tg_test_bpe_vocab_json("");
    write_in(dir, "vocab.json", v);
    write_in(dir, "merges.txt", tg_test_bpe_merges);
    free(v);
    return open_ok(dir);
}

static tg_tokenizer *roberta(void) {
    const char *dir = tg_test_tmpdir();
    char *v = tg_test_bpe_vocab_json(roberta_extra);
    write_in(dir, "vocab.json", v);
    write_in(dir, "merges.txt", tg_test_bpe_merges);
    write_in(dir, "config.json", "{\"model_type\": \"roberta\"}");
    free(v);
    return open_ok(dir);
}

/* ---- WordPiece ----------------------------------------------------------------------- */

TG_TEST(test_tokenizer_wordpiece_basic) {
    tg_tokenizer *t = bert();
    REQUIRE(t, "no tokenizer");
    CHECK(tg_tokenizer_family_of(t) == TG_TOKENIZER_WORDPIECE, "family %d", tg_tokenizer_family_of(t));
    CHECK(tg_tokenizer_vocab_size(t) == 20, "vocab size %d", tg_tokenizer_vocab_size(t));
    const tg_special_ids s = tg_tokenizer_special_ids(t);
    CHECK(s.cls == CLS && s.sep == SEP && s.pad == PAD && s.unk == UNK && s.mask == MASK && s.bos == -1 && s.eos == -1,
          "special ids %d %d %d %d %d %d %d", s.cls, s.sep, s.pad, s.unk, s.mask, s.bos, s.eos);
    CHECK(tg_tokenizer_token_id(t, "##aff") == AFF && tg_tokenizer_token_id(t, "nope") == -1, "token ids");
    CHECK(!strcmp(tg_tokenizer_id_to_token(t, AFF), "##aff") && !tg_tokenizer_id_to_token(t, 99), "id to token");
    CHECK(tg_tokenizer_added_count(t, 0) == 2 && tg_tokenizer_added_count(t, 1) == 3, "added counts");
    tg_encoding e = {0};
    if (encodes_to(t, "Hello, World!", NULL, NULL, &e, IDS(CLS, HELLO, COMMA, WORLD, BANG, SEP))) {
        offsets_are(&e, 0, -1, -1);
        offsets_are(&e, 1, 0, 5);
        offsets_are(&e, 2, 5, 6);
        offsets_are(&e, 3, 7, 12);
        offsets_are(&e, 4, 12, 13);
        CHECK(e.special[0] == 1 && e.special[1] == 0 && e.special[5] == 1, "special mask");
        CHECK(e.sequence[0] == -1 && e.sequence[1] == 0 && e.sequence[5] == -1, "sequence ids");
        CHECK(e.n_real == 6, "n_real %d", e.n_real);
    }
    if (encodes_to(t, "unaffable", NULL, NULL, &e, IDS(CLS, UN, AFF, ABLE, SEP))) {
        offsets_are(&e, 1, 0, 2);
        offsets_are(&e, 2, 2, 5);
        offsets_are(&e, 3, 5, 9);
    }
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_wordpiece_normalizer) {
    tg_tokenizer *t = bert();
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    /* accents stripped (precomposed and combining), lower-cased; offsets in the original
     * (a dropped combining mark is in no token's span, as in HF) */
    if (encodes_to(t, "CAF\xc3\x89 cafe\xcc\x81.", NULL, NULL, &e, IDS(CLS, CAFE, CAFE, 16, SEP))) {
        offsets_are(&e, 1, 0, 5);
        offsets_are(&e, 2, 6, 10);
        offsets_are(&e, 3, 12, 13);
    }
    /* NFD puts combining marks in canonical order (U+1D165, class 216, before U+302E, class
     * 224) before the nonspacing ones (U+0301) are dropped; past 32 marks the run is sorted
     * at its end */
    encodes_to(t, "x\xe3\x80\xae\xf0\x9d\x85\xa5", NULL, NULL, &e, IDS(CLS, X_MARKS, SEP));
    char marks[200] = "x\xe3\x80\xae";
    for (int i = 0; i < 40; i++) strcat(marks, "\xcc\x81");
    strcat(marks, "\xf0\x9d\x85\xa5");
    /* HF's offsets through reordering are positional: the token's last character is the
     * third to come out, so it ends where the third that went in (the first U+0301) ends */
    if (encodes_to(t, marks, NULL, NULL, &e, IDS(CLS, X_MARKS, SEP))) offsets_are(&e, 1, 0, 6);
    /* CJK characters are words of their own */
    if (encodes_to(t, "x\xe4\xb8\xadx", NULL, NULL, &e, IDS(CLS, X, ZHONG, X, SEP))) {
        offsets_are(&e, 2, 1, 4);
        offsets_are(&e, 3, 4, 5);
    }
    /* control and format characters vanish; tabs, newlines and NBSP separate */
    encodes_to(t, "hel\x01lo\tworld\xc2\xa0hello\xe2\x80\x8b!", NULL, NULL, &e, IDS(CLS, HELLO, WORLD, HELLO, BANG, SEP));
    /* NUL is a character too, and cleaned away */
    tg_err err = {{0}};
    CHECK(tg_tokenizer_encode(t, "hel\0lo", 6, NULL, 0, NULL, &e, &err) == 0 && e.n == 3 && e.ids[1] == HELLO,
          "NUL inside a word: %s", err.msg);
    /* empty, whitespace and control-only texts: the template alone */
    encodes_to(t, "", NULL, NULL, &e, IDS(CLS, SEP));
    encodes_to(t, "  \t \r\n \xe3\x80\x80 ", NULL, NULL, &e, IDS(CLS, SEP));
    encodes_to(t, "\x01\x7f\xef\xbf\xbd", NULL, NULL, &e, IDS(CLS, SEP));
    tg_encoding_free(&e);
    tg_tokenizer_free(t);

    /* do_lower_case false in the folder's tokenizer_config.json: case and accents kept */
    const char *dir = tg_test_tmpdir();
    write_in(dir, "vocab.txt", bert_vocab);
    write_in(dir, "tokenizer_config.json", "{\"do_lower_case\": false}");
    tg_tokenizer *cased = open_ok(dir);
    tg_tokenizer *uncased = bert();
    if (cased && uncased) {
        encodes_to(cased, "Hello hello", NULL, NULL, &e, IDS(CLS, UNK, HELLO, SEP));
        CHECK(tg_tokenizer_identity(cased) != tg_tokenizer_identity(uncased), "cased and uncased share an identity");
        tg_tokenizer *again = bert();
        if (again) CHECK(tg_tokenizer_identity(again) == tg_tokenizer_identity(uncased), "identity is not stable");
        tg_tokenizer_free(again);
    }
    tg_encoding_free(&e);
    tg_tokenizer_free(cased);
    tg_tokenizer_free(uncased);
}

TG_TEST(test_tokenizer_wordpiece_unk_and_max_chars) {
    tg_tokenizer *t = bert();
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    /* a word with a piece the vocabulary lacks is one [UNK] over the whole word */
    if (encodes_to(t, "hello unaffz world", NULL, NULL, &e, IDS(CLS, HELLO, UNK, WORLD, SEP))) offsets_are(&e, 2, 6, 12);
    char word[160];
    memset(word, 'a', 100);
    word[100] = 0;
    tg_err err = {{0}};
    /* 100 characters: a, then 99 x ##a; 101: [UNK] */
    CHECK(tg_tokenizer_encode(t, word, 100, NULL, 0, NULL, &e, &err) == 0 && e.n == 102 && e.ids[1] == A &&
              e.ids[2] == HASH_A && e.ids[100] == HASH_A,
          "100 characters: %d tokens", e.n);
    memset(word, 'a', 101);
    word[101] = 0;
    if (encodes_to(t, word, NULL, NULL, &e, IDS(CLS, UNK, SEP))) offsets_are(&e, 1, 0, 101);
    /* characters, not bytes: 100 two-byte characters that strip to 'a' still fit */
    char accented[256] = "";
    for (int i = 0; i < 100; i++) strcat(accented, "\xc3\xa0");
    CHECK(tg_tokenizer_encode(t, accented, strlen(accented), NULL, 0, NULL, &e, &err) == 0 && e.n == 102 && e.ids[1] == A,
          "100 accented characters: %d tokens", e.n);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_added_tokens_in_text) {
    tg_tokenizer *t = bert();
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    if (encodes_to(t, "hello [SEP]world[MASK]", NULL, NULL, &e, IDS(CLS, HELLO, SEP, WORLD, MASK, SEP))) {
        offsets_are(&e, 2, 6, 11);
        CHECK(e.special[2] == 0 && e.sequence[2] == 0, "a [SEP] written in the text is text");
    }
    /* matched on the raw text: a lower-cased [sep] is punctuation and a word */
    encodes_to(t, "[sep]", NULL, NULL, &e, IDS(CLS, UNK, UNK, UNK, SEP));
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_invalid_utf8_refused) {
    tg_tokenizer *t = bert();
    REQUIRE(t, "no tokenizer");
    expect_encode_error(t, "ab\xff" "cd", 5, NULL, 0, NULL, "text: invalid UTF-8 at byte 2");
    expect_encode_error(t, "ok", 2, "x\xe2\x82", 3, NULL, "pair: invalid UTF-8 at byte 1");
    expect_encode_error(t, "\xc0\xaf", 2, NULL, 0, NULL, "at byte 0");          /* overlong */
    expect_encode_error(t, "abcdefghi\xed\xa0\x80", 12, NULL, 0, NULL, "at byte 9"); /* surrogate */
    expect_encode_error(t, "\xf4\x90\x80\x80", 4, NULL, 0, NULL, "at byte 0");  /* past U+10FFFF */
    expect_encode_error(t, "abc\x80", 4, NULL, 0, NULL, "at byte 3");           /* stray continuation */
    tg_tokenizer *g = gpt2();
    if (g) expect_encode_error(g, "hello \xe9t\xe9", 9, NULL, 0, NULL, "text: invalid UTF-8 at byte 6");
    tg_tokenizer_free(g);
    tg_tokenizer_free(t);
}

/* A text of n words "a". */
static char *words(int n) {
    char *s = malloc((size_t)n * 2 + 1);
    for (int i = 0; i < n; i++) s[2 * i] = 'a', s[2 * i + 1] = ' ';
    s[n ? 2 * n - 1 : 0] = 0;
    return s;
}

/* The lengths truncation leaves: first text, pair, and the whole encoding. */
static void expect_truncated(tg_tokenizer *t, int n1, int n2, int max_len, int want1, int want2) {
    char *a = words(n1), *b = n2 >= 0 ? words(n2) : NULL;
    tg_encode_options o = {1, max_len, 0};
    tg_encoding e = {0};
    tg_err err = {{0}};
    if (CHECK(tg_tokenizer_encode(t, a, strlen(a), b, b ? strlen(b) : 0, &o, &e, &err) == 0, "%s", err.msg)) {
        int got1 = 0, got2 = 0;
        for (int32_t i = 0; i < e.n; i++) got1 += e.sequence[i] == 0, got2 += e.sequence[i] == 1;
        const int added = b ? 3 : 2;
        CHECK(got1 == want1 && got2 == want2 && e.n == want1 + want2 + added,
              "(%d, %d) to %d: kept (%d, %d) of %d tokens, want (%d, %d)", n1, n2, max_len, got1, got2, e.n, want1, want2);
        if (b && e.n == want1 + want2 + 3) {
            CHECK(e.ids[0] == CLS && e.ids[want1 + 1] == SEP && e.ids[e.n - 1] == SEP, "template around truncated texts");
            CHECK(e.type_ids[want1 + 1] == 0 && e.type_ids[want1 + 2] == 1 && e.type_ids[e.n - 1] == 1, "type ids");
        }
    }
    tg_encoding_free(&e);
    free(a);
    free(b);
}

TG_TEST(test_tokenizer_truncation_longest_first) {
    tg_tokenizer *t = bert();
    REQUIRE(t, "no tokenizer");
    /* HF's longest-first over max_len minus the 3 (pair) or 2 special tokens */
    expect_truncated(t, 10, 3, 10, 4, 3);   /* only the longer one is cut */
    expect_truncated(t, 3, 10, 10, 3, 4);
    expect_truncated(t, 10, 10, 10, 3, 4);  /* both: the budget halved, the odd one to the second */
    expect_truncated(t, 10, 10, 11, 4, 4);
    expect_truncated(t, 2, 20, 11, 2, 6);
    expect_truncated(t, 20, 1, 8, 4, 1);
    expect_truncated(t, 5, 5, 13, 5, 5);    /* fits: nothing cut */
    expect_truncated(t, 5, 5, 3, 0, 0);     /* room for the specials alone */
    expect_truncated(t, 20, -1, 8, 6, 0);   /* one text */
    expect_truncated(t, 0, -1, 8, 0, 0);
    tg_encode_options o = {1, 2, 0};
    expect_encode_error(t, "a", 1, "a", 1, &o, "max_len 2 is shorter than the 3 special tokens");
    /* without special tokens the whole max_len is the texts' */
    o = (tg_encode_options){0, 5, 0};
    tg_encoding e = {0};
    char *a = words(10);
    encodes_to(t, a, "a a a", &o, &e, IDS(A, A, A, A, A));
    free(a);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_padding) {
    tg_tokenizer *t = bert();
    REQUIRE(t, "no tokenizer");
    tg_encode_options o = {1, 0, 8};
    tg_encoding e = {0};
    if (encodes_to(t, "hello", "world", &o, &e, IDS(CLS, HELLO, SEP, WORLD, SEP, PAD, PAD, PAD))) {
        CHECK(e.n_real == 5 && e.n == 8, "n_real %d n %d", e.n_real, e.n);
        for (int32_t i = 5; i < 8; i++)
            CHECK(e.special[i] == 1 && e.type_ids[i] == 0 && e.sequence[i] == -1 && e.start[i] == -1 && e.end[i] == -1,
                  "pad %d", i);
        CHECK(e.type_ids[3] == 1 && e.type_ids[4] == 1 && e.type_ids[2] == 0, "pair type ids");
        offsets_are(&e, 3, 0, 5); /* offsets into the pair */
    }
    /* longer than pad_to: left as it is; truncation then padding */
    o = (tg_encode_options){1, 0, 2};
    encodes_to(t, "hello world", NULL, &o, &e, IDS(CLS, HELLO, WORLD, SEP));
    o = (tg_encode_options){1, 3, 6};
    encodes_to(t, "hello world", NULL, &o, &e, IDS(CLS, HELLO, SEP, PAD, PAD, PAD));
    o = (tg_encode_options){1, 0, -1};
    expect_encode_error(t, "a", 1, NULL, 0, &o, "must not be negative");
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

/* ---- byte-level BPE ------------------------------------------------------------------ */

TG_TEST(test_tokenizer_bpe_gpt2) {
    tg_tokenizer *t = gpt2();
    REQUIRE(t, "no tokenizer");
    CHECK(tg_tokenizer_family_of(t) == TG_TOKENIZER_BPE_GPT2, "family %d", tg_tokenizer_family_of(t));
    const tg_special_ids s = tg_tokenizer_special_ids(t);
    CHECK(s.bos == EOT && s.eos == EOT && s.cls == -1 && s.pad == -1, "special ids");
    CHECK(tg_tokenizer_added_count(t, 0) == 0 && tg_tokenizer_added_count(t, 1) == 0, "GPT-2 adds no tokens");
    tg_encoding e = {0};
    if (encodes_to(t, "hello world", NULL, NULL, &e, IDS(HELLO_B, SP_WORLD))) {
        offsets_are(&e, 0, 0, 5);
        offsets_are(&e, 1, 5, 11);
    }
    /* "hel" "lo": merges by rank (l l before he ll) */
    encodes_to(t, "hel lo", NULL, NULL, &e, IDS(256, 'l', ' ', 'l', 'o'));
    encodes_to(t, "", NULL, NULL, &e, NULL, 0);
    /* spaces: a run before a word leaves its last space to the word */
    encodes_to(t, "   ", NULL, NULL, &e, IDS(' ', ' ', ' '));
    if (encodes_to(t, "a  world", NULL, NULL, &e, IDS('a', ' ', SP_WORLD))) offsets_are(&e, 2, 2, 8);
    /* a two-byte character: two byte tokens, each covering the whole character */
    if (encodes_to(t, "\xc3\xa9x", NULL, NULL, &e, IDS(0xC3, 0xA9, 'x'))) {
        offsets_are(&e, 0, 0, 2);
        offsets_are(&e, 1, 0, 2);
        offsets_are(&e, 2, 2, 3);
    }
    /* <|endoftext|> in the text is that token; pairs: type 0 then 1 */
    encodes_to(t, "hello<|endoftext|>", NULL, NULL, &e, IDS(HELLO_B, EOT));
    if (encodes_to(t, "hello", " world", NULL, &e, IDS(HELLO_B, SP_WORLD)))
        CHECK(e.type_ids[0] == 0 && e.type_ids[1] == 1 && e.sequence[1] == 1, "pair types");
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_bpe_roberta_template) {
    tg_tokenizer *t = roberta();
    REQUIRE(t, "no tokenizer");
    CHECK(tg_tokenizer_family_of(t) == TG_TOKENIZER_BPE_ROBERTA, "family %d", tg_tokenizer_family_of(t));
    const tg_special_ids s = tg_tokenizer_special_ids(t);
    CHECK(s.cls == BOS && s.bos == BOS && s.sep == EOS && s.eos == EOS && s.pad == RPAD && s.unk == RUNK &&
              s.mask == RMASK,
          "special ids %d %d %d %d %d", s.cls, s.sep, s.pad, s.unk, s.mask);
    tg_encoding e = {0};
    encodes_to(t, "hello world", NULL, NULL, &e, IDS(BOS, HELLO_B, SP_WORLD, EOS));
    if (encodes_to(t, "hello", "world", NULL, &e, IDS(BOS, HELLO_B, EOS, EOS, 'w', 261, 263, EOS))) {
        for (int32_t i = 0; i < e.n; i++) CHECK(e.type_ids[i] == 0, "RoBERTa type id %d at %d", e.type_ids[i], i);
        CHECK(e.sequence[4] == 1 && e.sequence[3] == -1, "sequence ids");
        offsets_are(&e, 4, 0, 1);
    }
    /* <mask> takes the spaces before it (lstrip); the offsets leave them out, as HF's */
    if (encodes_to(t, "hello   <mask>", NULL, NULL, &e, IDS(BOS, HELLO_B, RMASK, EOS))) offsets_are(&e, 2, 8, 14);
    /* " world" trimmed: the leading space is not in the token's offsets */
    if (encodes_to(t, "hello world", NULL, NULL, &e, IDS(BOS, HELLO_B, SP_WORLD, EOS))) offsets_are(&e, 2, 6, 11);
    tg_encode_options o = {1, 6, 0};
    encodes_to(t, "hello world", "hello world", &o, &e, IDS(BOS, HELLO_B, EOS, EOS, HELLO_B, EOS));
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_bpe_cache_bound) {
    tg_tokenizer *t = gpt2();
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    tg_err err = {{0}};
    /* 40,000 distinct words empty the cache (16,384 words) twice; results stay the same */
    char text[64];
    for (int i = 0; i < 40000; i++) {
        int n = snprintf(text, sizeof text, "hello w%dorld%c", i, 'a' + i % 26);
        if (tg_tokenizer_encode(t, text, (size_t)n, NULL, 0, NULL, &e, &err)) break;
        if (i % 9999 == 0) CHECK(e.n >= 3 && e.ids[0] == HELLO_B, "word %d: first id %d", i, e.n ? e.ids[0] : -1);
    }
    CHECK(!err.msg[0], "%s", err.msg);
    CHECK(t->bpe.cache_n <= 1 << 14 && t->bpe.cache_arena_len <= 4u << 20, "cache %d words, %zu bytes", t->bpe.cache_n,
          t->bpe.cache_arena_len);
    encodes_to(t, "hello world", NULL, NULL, &e, IDS(HELLO_B, SP_WORLD));
    /* a long word (not cached) of repeated merges */
    char long_word[1001];
    for (int i = 0; i < 1000; i++) long_word[i] = "hello"[i % 5];
    long_word[1000] = 0;
    CHECK(tg_tokenizer_encode(t, long_word, 1000, NULL, 0, NULL, &e, &err) == 0 && e.n == 200 && e.ids[0] == HELLO_B &&
              e.ids[199] == HELLO_B && e.start[199] == 995,
          "1,000-byte word: %d tokens", e.n);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

/* ---- files and their errors ------------------------------------------------------------ */

static void expect_open_error(const char *path, const char *want) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == -1 && t == NULL, "%s opened", path);
    CHECK(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
}

TG_TEST(test_tokenizer_file_errors) {
    const char *dir = tg_test_tmpdir();
    expect_open_error(dir, "no tokenizer.json, vocab.txt, vocab.json + merges.txt");
    char missing[700];
    snprintf(missing, sizeof missing, "%s/nope.txt", dir);
    expect_open_error(missing, "nope.txt: cannot open");
    expect_open_error(write_in(dir, "empty.txt", ""), "empty vocabulary");
    expect_open_error(write_in(dir, "nocls.txt", "[UNK]\nhello\n"), "no [CLS] or [SEP]");
    expect_open_error(write_in(dir, "bad.txt", "[CLS]\n[SEP]\nab\xff\n"), "bad.txt:3: invalid UTF-8");
    expect_open_error(write_in(dir, "dup.json", "{\"model\": {\"type\": \"WordPiece\"}, \"model\": {}}"), "duplicate");
    expect_open_error(write_in(dir, "trunc.json", "{\"model\": {\"type\": \"Word"), "trunc.json:1:");
    expect_open_error(write_in(dir, "uni.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}"),
                      "model type 'Unigram' is not supported");
    expect_open_error(write_in(dir, "ids.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": -1}}}"),
                      "'a' has no id");
    expect_open_error(write_in(dir, "pre.json",
                               "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": "
                               "{\"type\": \"Whitespace\"}}"),
                      "pre_tokenizer 'Whitespace' is not supported");
    expect_open_error(write_in(dir, "merge.json",
                               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]},"
                               " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}"),
                      "merges: merge 1: 'ab' is not in the vocabulary");
    expect_open_error(write_in(dir, "tmpl.json",
                               "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": "
                               "\"BertPreTokenizer\"}, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                               "[{\"SpecialToken\": {\"id\": \"[X]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", "
                               "\"type_id\": 0}}], \"pair\": [], \"special_tokens\": {}}}"),
                      "special token '[X]' has no ids");
    /* vocab.json + merges.txt: a merges line that is not two tokens */
    const char *bdir = tg_test_tmpdir();
    char *v = tg_test_bpe_vocab_json("");
    write_in(bdir, "vocab.json", v);
    free(v);
    write_in(bdir, "merges.txt", "#version: 0.2\nh e\nl l x\n");
    expect_open_error(bdir, "merges.txt:3: not two tokens");
    write_in(bdir, "merges.txt", "#version: 0.2\nh zz\n");
    expect_open_error(bdir, "merge 1: 'zz' is not in the vocabulary");
}

TG_TEST(test_tokenizer_json_wordpiece) {
    /* a tokenizer.json as HF writes it, with a template whose pair has type 1 */
    const char *dir = tg_test_tmpdir();
    const char *path = write_in(
        dir, "tokenizer.json",
        "{\"version\": \"1.0\", \"truncation\": {\"max_length\": 3}, \"padding\": null,"
        " \"added_tokens\": [{\"id\": 2, \"content\": \"[CLS]\", \"single_word\": false, \"lstrip\": false, \"rstrip\": "
        "false, \"normalized\": false, \"special\": true}, {\"id\": 3, \"content\": \"[SEP]\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}],"
        " \"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true,"
        " \"strip_accents\": null, \"lowercase\": true},"
        " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
        " \"post_processor\": {\"type\": \"TemplateProcessing\","
        " \"single\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
        " {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}],"
        " \"pair\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
        " {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}},"
        " {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 1}}],"
        " \"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [2], \"tokens\": [\"[CLS]\"]},"
        " \"[SEP]\": {\"id\": \"[SEP]\", \"ids\": [3], \"tokens\": [\"[SEP]\"]}}},"
        " \"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true},"
        " \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\","
        " \"max_input_chars_per_word\": 5, \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3, \"hello\": 4,"
        " \"world\": 5, \"hell\": 6, \"##o\": 7}}}");
    tg_tokenizer *t = open_ok(path);
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    /* the file's own truncation (3) is not applied; max_input_chars_per_word 5 is */
    if (encodes_to(t, "hello world", "helloo", NULL, &e, IDS(2, 4, 5, 3, 1, 3)))
        CHECK(e.type_ids[4] == 1 && e.type_ids[5] == 1 && e.type_ids[3] == 0, "template type ids");
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

/* ---- the CLI ------------------------------------------------------------------------- */

static int run_tokenize(const char *dir, const char *args, const char *input) {
    char in[700], cmd[2400];
    snprintf(in, sizeof in, "%s/stdin.txt", dir);
    if (tg_test_write_file(in, input)) return -1;
    snprintf(cmd, sizeof cmd, "%s tokenize %s <%s >%s/stdout.txt 2>%s/stderr.txt", tg_test_cli(), args, in, dir, dir);
    const int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void expect_file(const char *dir, const char *name, const char *want, int exact) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *got = tg_test_read_file(path, NULL);
    CHECK(got && (exact ? !strcmp(got, want) : strstr(got, want) != NULL), "%s: '%s', want %s'%s'", name,
          got ? got : "(none)", exact ? "" : "one holding ", want);
    free(got);
}

TG_TEST(test_tokenizer_cli) {
    const char *dir = tg_test_tmpdir();
    char args[1200];
    const char *vocab = write_in(dir, "vocab.txt", bert_vocab);
    snprintf(args, sizeof args, "--tokenizer %s", vocab);
    /* one line out per line in, the last without '\n' too; empty lines the template */
    CHECK(run_tokenize(dir, args, "Hello, world!\n\nunaffable") == 0, "tokenize failed");
    expect_file(dir, "stdout.txt", "2 5 7 6 8 3\n2 3\n2 9 10 11 3\n", 1);
    snprintf(args, sizeof args, "--tokenizer %s --pair --max-len 6", vocab);
    CHECK(run_tokenize(dir, args, "hello world world\tworld hello\n") == 0, "tokenize --pair failed");
    expect_file(dir, "stdout.txt", "2 5 6 3 6 3\n", 1);
    snprintf(args, sizeof args, "--tokenizer %s --no-special --offsets", vocab);
    CHECK(run_tokenize(dir, args, "hello wor\xc3\xa0ld\n") == 0, "tokenize --offsets failed");
    expect_file(dir, "stdout.txt", "5:0-5 1:6-13\n", 1);
    snprintf(args, sizeof args, "--tokenizer %s --pair", vocab);
    CHECK(run_tokenize(dir, args, "a\tb\nno tab here\n") == 1, "a line without TAB was accepted");
    expect_file(dir, "stderr.txt", "stdin:2: no TAB between text and pair", 0);
    snprintf(args, sizeof args, "--tokenizer %s", vocab);
    CHECK(run_tokenize(dir, args, "fine\nbad \xff byte\n") == 1, "invalid UTF-8 was accepted");
    expect_file(dir, "stderr.txt", "stdin:2: text: invalid UTF-8 at byte 4", 0);
    CHECK(run_tokenize(dir, "--pair", "") == 2, "no --tokenizer: not a usage error");
    expect_file(dir, "stderr.txt", "--tokenizer PATH is required", 0);
    CHECK(run_tokenize(dir, "--tokenizer /nonexistent/x", "") == 1, "a missing tokenizer was accepted");
    snprintf(args, sizeof args, "--tokenizer %s --max-len 0", vocab);
    CHECK(run_tokenize(dir, args, "") == 2, "--max-len 0 accepted");
}
