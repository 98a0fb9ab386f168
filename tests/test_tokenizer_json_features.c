/* tokenizer.json settings on small hand-made files, each encoding checked token for token
 * (ids and byte offsets) against what Hugging Face `tokenizers` 0.23 gives for the same
 * file and text: added tokens' single_word, lstrip, rstrip and normalized flags; WordPiece
 * without a normalizer and BertNormalizer's switches; BertProcessing, RobertaProcessing,
 * TemplateProcessing and Sequence post-processors; byte-level BPE's unk_token, fuse_unk,
 * ignore_merges, add_prefix_space and a pair merged twice. Then the folder hints that
 * choose GPT-2 or RoBERTa, the special ids each family reports, and the encoder's
 * argument checks. The JSON is written with ' for ". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"


/* Writes text into dir/name as it is (a generated vocabulary holds ' itself). */
static const char *write_plain(const char *dir, const char *name, const char *text) {
    static char path[4][700];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 700, "%s/%s", dir, name);
    if (tg_test_write_file(p, text)) abort();
    return p;
}

static tg_tokenizer *open_json(const char *json) {
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open %s: %s", json, err.msg);
    return t;
}

/* The encoding as `tunegraph tokenize --offsets` writes it: ID:START-END, ID:- for
 * template tokens. */
static void format_encoding(const tg_encoding *e, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int32_t i = 0; i < e->n && n + 40 < cap; i++) {
        if (e->sequence[i] < 0) n += (size_t)snprintf(out + n, cap - n, "%s%d:-", i ? " " : "", e->ids[i]);
        else
            n += (size_t)snprintf(out + n, cap - n, "%s%d:%lld-%lld", i ? " " : "", e->ids[i], (long long)e->start[i],
                                  (long long)e->end[i]);
    }
}

/* Encodes text (and pair, when not NULL) and compares with want in the format above. */
static void expect_tokens(tg_tokenizer *t, const char *text, const char *pair, const char *want) {
    if (!t) return;
    tg_encoding e = {0};
    tg_err err = {{0}};
    if (CHECK(tg_tokenizer_encode(t, text, strlen(text), pair, pair ? strlen(pair) : 0, NULL, &e, &err) == 0,
              "encode '%s': %s", text, err.msg)) {
        char got[1024];
        format_encoding(&e, got, sizeof got);
        CHECK(!strcmp(got, want), "'%s': got '%s', want '%s'", text, got, want);
    }
    tg_encoding_free(&e);
}

/* Only the ids, space-separated. */
static void expect_ids(tg_tokenizer *t, const char *text, const char *want) {
    if (!t) return;
    tg_encoding e = {0};
    tg_err err = {{0}};
    if (CHECK(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, NULL, &e, &err) == 0, "encode '%s': %s", text, err.msg)) {
        char got[512] = "";
        for (int32_t i = 0; i < e.n && strlen(got) < 480; i++) snprintf(got + strlen(got), 16, "%s%d", i ? " " : "", e.ids[i]);
        CHECK(!strcmp(got, want), "'%s': ids '%s', want '%s'", text, got, want);
    }
    tg_encoding_free(&e);
}

static void expect_special(tg_tokenizer *t, tg_tokenizer_family family, tg_special_ids want) {
    if (!t) return;
    CHECK(tg_tokenizer_family_of(t) == family, "family %d, want %d", tg_tokenizer_family_of(t), family);
    const tg_special_ids s = tg_tokenizer_special_ids(t);
    CHECK(s.cls == want.cls && s.sep == want.sep && s.pad == want.pad && s.unk == want.unk && s.mask == want.mask &&
              s.bos == want.bos && s.eos == want.eos,
          "special ids cls %d sep %d pad %d unk %d mask %d bos %d eos %d", s.cls, s.sep, s.pad, s.unk, s.mask, s.bos,
          s.eos);
}

/* ---- WordPiece ----------------------------------------------------------------------- */

/* No normalizer; <x> single_word, [M] lstrip + rstrip, foo normalized; BertProcessing. */
static const char wp_added[] =
    "{'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'vocab': {'[PAD]': 0, '[UNK]': 1, '[CLS]': 2, '[SEP]': 3,"
    " 'Hello': 4, 'hello': 5, 'world': 6, '##s': 7, '!': 8, '\xc3\xa9': 9}}, 'normalizer': null,"
    " 'pre_tokenizer': {'type': 'BertPreTokenizer'},"
    " 'added_tokens': [{'id': 10, 'content': '<x>', 'single_word': true, 'special': false, 'normalized': false},"
    " {'id': 11, 'content': '[M]', 'lstrip': true, 'rstrip': true, 'special': true},"
    " {'id': 12, 'content': 'foo', 'special': false, 'normalized': true}],"
    " 'post_processor': {'type': 'BertProcessing', 'cls': ['[CLS]', 2], 'sep': ['[SEP]', 3]}}";

TG_TEST(test_tokenizer_json_wordpiece_added_tokens) {
    tg_tokenizer *t = open_json(wp_added);
    REQUIRE(t, "no tokenizer");
    expect_special(t, TG_TOKENIZER_WORDPIECE, (tg_special_ids){2, 3, 0, 1, -1, -1, -1});
    CHECK(tg_tokenizer_vocab_size(t) == 13, "vocab size %d", tg_tokenizer_vocab_size(t));
    CHECK(tg_tokenizer_token_id(t, "foo") == 12 && !strcmp(tg_tokenizer_id_to_token(t, 11), "[M]") &&
              !strcmp(tg_tokenizer_id_to_token(t, 9), "\xc3\xa9") && !tg_tokenizer_id_to_token(t, -1) &&
              !tg_tokenizer_id_to_token(t, 13),
          "token <-> id");
    /* no normalizer: case kept, é a character of its own bytes */
    expect_tokens(t, "Hello worlds!", NULL, "2:- 4:0-5 6:6-11 7:11-12 8:12-13 3:-");
    /* single_word: only between non-word characters (letters, digits, '_', ZWNJ are word) */
    expect_tokens(t, "a<x>b <x> x<x>", NULL,
                  "2:- 1:0-1 1:1-2 1:2-3 1:3-4 1:4-5 10:6-9 1:10-11 1:11-12 1:12-13 1:13-14 3:-");
    expect_tokens(t, "<x>\xc3\xa9<x>", NULL, "2:- 1:0-1 1:1-2 1:2-3 9:3-5 1:5-6 1:6-7 1:7-8 3:-");
    expect_tokens(t, "\xc3\xa9<x>_<x>", NULL, "2:- 9:0-2 1:2-3 1:3-4 1:4-5 1:5-6 1:6-7 1:7-8 1:8-9 3:-");
    expect_tokens(t, ",<x>,", NULL, "2:- 1:0-1 10:1-4 1:4-5 3:-");
    expect_tokens(t, "<x>", NULL, "2:- 10:0-3 3:-");
    expect_tokens(t, "1<x> Z<x> _<x>", NULL,
                  "2:- 1:0-1 1:1-2 1:2-3 1:3-4 1:5-6 1:6-7 1:7-8 1:8-9 1:10-11 1:11-12 1:12-13 1:13-14 3:-");
    expect_tokens(t, "\xe2\x80\x8c<x> \xc2\xab<x>\xc2\xbb", NULL, "2:- 1:0-3 1:3-4 1:4-5 1:5-6 1:7-9 10:9-12 1:12-14 3:-");
    /* lstrip / rstrip take the whitespace beside [M] (U+2028 and U+0085 too) */
    expect_tokens(t, "hello  [M]  world", NULL, "2:- 5:0-5 11:5-12 6:12-17 3:-");
    expect_tokens(t, "\xe2\x80\xa8[M]\xc2\x85 hello", NULL, "2:- 11:0-9 5:9-14 3:-");
    /* a normalized added token matches inside words, in the text and the pair */
    expect_tokens(t, "worldfoo!foo", NULL, "2:- 6:0-5 12:5-8 8:8-9 12:9-12 3:-");
    expect_tokens(t, "Hello", "foo world", "2:- 4:0-5 3:- 12:0-3 6:4-9 3:-");
    /* more neighbours of the added tokens: a control character, the text's end, ZWJ,
     * digits and '~', '_' after */
    expect_tokens(t, "\x01[M]", NULL, "2:- 1:0-1 11:1-4 3:-");
    expect_tokens(t, "hello [M]", NULL, "2:- 5:0-5 11:5-9 3:-");
    expect_tokens(t, "\xe2\x80\x8d<x>", NULL, "2:- 1:0-3 1:3-4 1:4-5 1:5-6 3:-");
    expect_tokens(t, "9<x> ~<x>", NULL, "2:- 1:0-1 1:1-2 1:2-3 1:3-4 1:5-6 10:6-9 3:-");
    expect_tokens(t, "<x>_", NULL, "2:- 1:0-1 1:1-2 1:2-3 1:3-4 3:-");
    /* the ends of the ASCII word ranges: 0 and 9, a and z, A and Z */
    expect_tokens(t, "0<x> <x>0", NULL, "2:- 1:0-1 1:1-2 1:2-3 1:3-4 1:5-6 1:6-7 1:7-8 1:8-9 3:-");
    expect_tokens(t, "z<x> A<x> <x>9", NULL,
                  "2:- 1:0-1 1:1-2 1:2-3 1:3-4 1:5-6 1:6-7 1:7-8 1:8-9 1:10-11 1:11-12 1:12-13 1:13-14 3:-");
    expect_tokens(t, "/<x>: @<x>[ `<x>{", NULL, "2:- 1:0-1 10:1-4 1:4-5 1:6-7 10:7-10 1:10-11 1:12-13 10:13-16 1:16-17 3:-");
    /* a word longer than the longest entry, cut inside a character: é, then no ##é */
    expect_tokens(t, "\xc3\xa9\xc3\xa9\xc3\xa9", NULL, "2:- 1:0-6 3:-");
    tg_tokenizer_free(t);
}

static tg_tokenizer *open_normalizer(const char *normalizer);

/* BertNormalizer's per-character path (after an accent, ASCII goes through it too):
 * controls dropped, tab / CR / newline as spaces, CJK blocks, punctuation beyond ASCII.
 * The vocab.txt as BertWordPieceTokenizer (lowercase) loads it. */
TG_TEST(test_tokenizer_json_bert_character_classes) {
    const char *dir = tg_test_tmpdir();
    const char *path = write_plain(dir, "vocab.txt",
                                   "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\nun\n##aff\n##able\na\n##a\n"
                                   "\xe4\xb8\xad\ncafe\n.\n##s\nx\nx\xf0\x9d\x85\xa5\xe3\x80\xae\nabc\n\xc3\xa9\n");
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    tg_encoding e0 = {0};
    expect_tokens(t, "\xc3\xa9\t\x01x", NULL, "2:- 1:0-2 18:4-5 3:-");
    expect_tokens(t, "\xc3\xa9\x7f\xc3\xa9\rz\xc3\xa9" "a", NULL, "2:- 1:0-5 1:6-10 3:-");
    expect_tokens(t, "\xc3\xa9\n\xc3\xa9", NULL, "2:- 1:0-2 1:3-5 3:-");
    expect_tokens(t, "\xc3\xa9 \xc2\xa9 \xc2\xab", NULL, "2:- 1:0-2 1:3-5 1:6-8 3:-");
    expect_tokens(t, "\xc3\xa9\xc3\xa9\xc3\xa9 abc\xc3\xa9", NULL, "2:- 1:0-6 1:7-12 3:-");
    /* each CJK block a word of its own; the characters just outside them are not */
    expect_tokens(t,
                  "\xc3\xa9\xe3\x90\x80\xe4\xb8\x80\xea\x80\x80\xf0\xa0\x80\x80\xf0\xaa\x9b\xa0\xf0\xaa\x9c\x80"
                  "\xf0\xab\x9d\x80\xf0\xab\xa4\xa0\xf0\xac\xba\xb0\xef\xa4\x80\xef\xac\x80\xf0\xaf\xa0\x80"
                  "\xf0\xaf\xa8\xa0\xe3\x8f\xbf\xe9\xbf\xbf",
                  NULL,
                  "2:- 1:0-2 1:2-5 1:5-8 1:8-11 1:11-15 1:15-19 1:19-23 1:23-27 1:27-31 1:31-35 1:35-38 1:38-41 1:41-45 "
                  "1:45-52 1:52-55 3:-");
    /* an overlong three-byte form is invalid */
    CHECK(tg_tokenizer_encode(t, "ab\xe0\x80\xaf", 5, NULL, 0, NULL, &e0, &err) == -1 &&
              strstr(err.msg, "text: invalid UTF-8 at byte 2"),
          "overlong: %s", err.msg);
    tg_encoding_free(&e0);
    /* a private-use character (U+E000) is a control character: dropped */
    expect_tokens(t, "x\xee\x80\x80x", NULL, "2:- 1:0-5 3:-");
    /* 70 added tokens written in the text: more splits than the first 64 */
    char seps[400] = "";
    for (int i = 0; i < 70; i++) strcat(seps, "[SEP]");
    tg_encoding e = {0};
    CHECK(tg_tokenizer_encode(t, seps, strlen(seps), NULL, 0, NULL, &e, &err) == 0 && e.n == 72 && e.ids[1] == 3 &&
              e.ids[70] == 3 && e.start[70] == 345 && e.special[70] == 0,
          "70 [SEP]: %d tokens (%s)", e.n, err.msg);
    const tg_encode_options neg = {1, -1, 0};
    CHECK(tg_tokenizer_encode(t, "x", 1, NULL, 0, &neg, &e, &err) == -1 &&
              strstr(err.msg, "max_len -1 and pad_to 0 must not be negative"),
          "max_len -1: %s", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
    /* without text cleaning, Unicode spaces reach the pre-tokenizer (U+3000, U+2003) */
    t = open_normalizer("{'type': 'BertNormalizer', 'clean_text': false, 'handle_chinese_chars': false,"
                        " 'strip_accents': true, 'lowercase': false}");
    expect_tokens(t, "x\xe3\x80\x80x\xe2\x80\x83\xc2\xabx", NULL, "2:- 8:0-1 8:4-5 1:8-10 8:10-11 3:-");
    tg_tokenizer_free(t);
}

static const char wp_vocab_keys[] =
    "'vocab': {'[PAD]': 0, '[UNK]': 1, '[CLS]': 2, '[SEP]': 3, 'Cafe': 4, 'cafe': 5, 'caf\xc3\xa9': 6,"
    " '\xe4\xb8\xad': 7, 'x': 8, '##\xe4\xb8\xad': 9, '\xc4\xb0': 10, 'i\xcc\x87': 11, '\xc3\x89': 12, '##x': 13}";
#define WP_TEMPLATE                                                                                                    \
    "'post_processor': {'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': '[CLS]', 'type_id': 0}},"     \
    " {'Sequence': {'id': 'A', 'type_id': 0}}, {'SpecialToken': {'id': '[SEP]', 'type_id': 0}}],"                      \
    " 'pair': [{'Sequence': {'id': 'A', 'type_id': 0}}, {'SpecialToken': {'id': '[SEP]', 'type_id': 0}},"              \
    " {'Sequence': {'id': 'B', 'type_id': 1}}], 'special_tokens': {'[CLS]': {'id': '[CLS]', 'ids': [2]},"            \
    " '[SEP]': {'id': '[SEP]', 'ids': [3]}}}"

static tg_tokenizer *open_normalizer(const char *normalizer) {
    char json[2000];
    snprintf(json, sizeof json,
             "{'model': {'type': 'WordPiece', %s}, 'normalizer': %s, 'pre_tokenizer': {'type': 'BertPreTokenizer'}, "
             WP_TEMPLATE "}",
             wp_vocab_keys, normalizer);
    return open_json(json);
}

TG_TEST(test_tokenizer_json_bert_normalizer_switches) {
    /* no text cleaning, no CJK spacing, accents stripped, case kept */
    tg_tokenizer *t = open_normalizer("{'type': 'BertNormalizer', 'clean_text': false, 'handle_chinese_chars': false,"
                                      " 'strip_accents': true, 'lowercase': false}");
    expect_tokens(t, "Caf\xc3\xa9 CAFE", NULL, "2:- 4:0-5 1:6-10 3:-");
    expect_tokens(t, "x\xe4\xb8\xadx\x01", NULL, "2:- 1:0-6 3:-");
    expect_tokens(t, "caf\xc3\xa9\t\xc4\xb0 \xc3\x89", NULL, "2:- 5:0-5 1:6-8 1:9-11 3:-");
    expect_tokens(t, "\xc4\xb0x", NULL, "2:- 1:0-3 3:-");
    /* the pair template has no [CLS]: the special ids keep the vocabulary's */
    expect_special(t, TG_TOKENIZER_WORDPIECE, (tg_special_ids){2, 3, 0, 1, -1, -1, -1});
    CHECK(!t || (tg_tokenizer_added_count(t, 0) == 2 && tg_tokenizer_added_count(t, 1) == 1), "added counts");
    tg_tokenizer_free(t);
    /* lower-casing (U+0130 to i + U+0307) without accent stripping */
    t = open_normalizer("{'type': 'BertNormalizer', 'clean_text': true, 'handle_chinese_chars': true,"
                        " 'strip_accents': false, 'lowercase': true}");
    expect_tokens(t, "Caf\xc3\xa9 CAFE", NULL, "2:- 6:0-5 5:6-10 3:-");
    expect_tokens(t, "x\xe4\xb8\xadx\x01", NULL, "2:- 8:0-1 7:1-4 8:4-5 3:-");
    expect_tokens(t, "caf\xc3\xa9\t\xc4\xb0 \xc3\x89", NULL, "2:- 6:0-5 11:6-8 1:9-11 3:-");
    expect_tokens(t, "\xc4\xb0x", NULL, "2:- 11:0-2 13:2-3 3:-");
    expect_tokens(t, "Caf\xc3\xa9", "x", "6:0-5 3:- 8:0-1");
    tg_tokenizer_free(t);
    /* strip_accents null follows lowercase (false here) */
    t = open_normalizer("{'type': 'BertNormalizer', 'strip_accents': null, 'lowercase': false}");
    expect_tokens(t, "Caf\xc3\xa9 CAFE", NULL, "2:- 1:0-5 1:6-10 3:-");
    expect_tokens(t, "caf\xc3\xa9\t\xc4\xb0 \xc3\x89", NULL, "2:- 6:0-5 10:6-8 12:9-11 3:-");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_json_wordpiece_without_unk) {
    /* an unk_token the vocabulary lacks: a word it cannot spell is an error */
    tg_tokenizer *t = open_json("{'model': {'type': 'WordPiece', 'unk_token': '[NOPE]', 'continuing_subword_prefix': '@@',"
                                " 'max_input_chars_per_word': 4, 'vocab': {'[CLS]': 0, '[SEP]': 1, 'ab': 2, '@@c': 3}},"
                                " 'pre_tokenizer': {'type': 'BertPreTokenizer'}}");
    REQUIRE(t, "no tokenizer");
    expect_special(t, TG_TOKENIZER_WORDPIECE, (tg_special_ids){0, 1, -1, -1, -1, -1, -1});
    CHECK(tg_tokenizer_added_count(t, 0) == 0 && tg_tokenizer_added_count(t, 1) == 0, "no template: no tokens added");
    expect_tokens(t, "abc ab", "ab", "2:0-2 3:2-3 2:4-6 2:0-2");
    tg_encoding e = {0};
    tg_err err = {{0}};
    CHECK(tg_tokenizer_encode(t, "ab abd", 6, NULL, 0, NULL, &e, &err) == -1 &&
              strstr(err.msg, "the vocabulary has no unk token '[NOPE]' for a word it cannot spell"),
          "unspellable word: %s", err.msg);
    /* 5 characters is past max_input_chars_per_word 4 */
    CHECK(tg_tokenizer_encode(t, "abcab", 5, NULL, 0, NULL, &e, &err) == -1 && strstr(err.msg, "no unk token"),
          "long word: %s", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

/* ---- byte-level BPE ------------------------------------------------------------------ */

/* a b c, the byte-level space, merges (a b) (b c) (Ġ a) and (a b) again: the later rank
 * counts, so "abc" is a + bc. x and y have no id. */
#define BPE_VOCAB                                                                                                      \
    "'vocab': {'a': 0, 'b': 1, 'c': 2, '\xc4\xa0': 3, 'ab': 4, 'bc': 5, '\xc4\xa0" "a': 6, '<unk>': 7, '<s>': 8,"     \
    " '</s>': 9, 'abc': 10, '<pad>': 11, '<mask>': 12}"
#define BPE_MERGES "'merges': [['a', 'b'], ['b', 'c'], ['\xc4\xa0', 'a'], ['a', 'b']]"
#define BYTE_LEVEL "'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}"

TG_TEST(test_tokenizer_json_bpe_unk_and_merges) {
    /* unk_token with fuse_unk: a run of bytes without ids is one <unk> */
    tg_tokenizer *t = open_json("{'model': {'type': 'BPE', 'dropout': null, 'unk_token': '<unk>', 'fuse_unk': true, "
                                "'continuing_subword_prefix': null, 'end_of_word_suffix': '', " BPE_VOCAB ", " BPE_MERGES
                                "}, " BYTE_LEVEL ", 'post_processor': null}");
    REQUIRE(t, "no tokenizer");
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, 7, -1, -1, -1});
    CHECK(tg_tokenizer_vocab_size(t) == 13, "vocab size %d", tg_tokenizer_vocab_size(t));
    expect_tokens(t, "abc", NULL, "0:0-1 5:1-3");
    expect_tokens(t, "xyab", NULL, "7:0-2 4:2-4");
    expect_tokens(t, "a xy b", NULL, "0:0-1 3:1-2 7:2-4 3:4-5 1:5-6");
    expect_tokens(t, "abab cab", NULL, "4:0-2 4:2-4 3:4-5 2:5-6 4:6-8");
    expect_tokens(t, "  a", NULL, "3:0-1 6:1-3");
    expect_tokens(t, "", NULL, "");
    tg_tokenizer_free(t);

    /* the same merges as "a b" strings; dropout 0 is no dropout */
    t = open_json("{'model': {'type': 'BPE', 'dropout': 0, 'unk_token': '<unk>', 'fuse_unk': true, " BPE_VOCAB
                  ", 'merges': ['a b', 'b c', '\xc4\xa0 a', 'a b']}, " BYTE_LEVEL "}");
    expect_tokens(t, "abc", NULL, "0:0-1 5:1-3");
    expect_tokens(t, "xyab", NULL, "7:0-2 4:2-4");
    tg_tokenizer_free(t);

    /* without fuse_unk each byte is an <unk>; ignore_merges: a word the vocabulary has whole
     * is that token, and here (b c) ranks before (a b) */
    t = open_json("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'ignore_merges': true, " BPE_VOCAB
                  ", 'merges': ['b c', 'a b']}, " BYTE_LEVEL "}");
    expect_tokens(t, "abc", NULL, "10:0-3");
    expect_tokens(t, "xyab", NULL, "7:0-1 7:1-2 4:2-4");
    expect_tokens(t, "a xy b", NULL, "0:0-1 3:1-2 7:2-3 7:3-4 3:4-5 1:5-6");
    expect_tokens(t, "abab cab", NULL, "4:0-2 4:2-4 3:4-5 2:5-6 4:6-8");
    tg_tokenizer_free(t);

    /* the prefix space without offset trimming: alone, it covers the first character */
    t = open_json("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': true, " BPE_VOCAB ", " BPE_MERGES "},"
                  " 'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': true}}");
    expect_tokens(t, "bc", NULL, "3:0-1 5:0-2");
    expect_tokens(t, "abc", NULL, "6:0-1 5:1-3");
    expect_tokens(t, "\xc3\xa9", NULL, "3:0-2 7:0-2");
    tg_tokenizer_free(t);

    /* no unk_token: bytes without an id are dropped (the ids as HF's) */
    t = open_json("{'model': {'type': 'BPE', " BPE_VOCAB ", " BPE_MERGES "}, " BYTE_LEVEL "}");
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, -1, -1, -1, -1});
    expect_ids(t, "xyab", "4");
    expect_ids(t, "a xy b", "0 3 3 1");
    expect_tokens(t, "xy", NULL, ""); /* a word of such bytes only is no token */
    expect_tokens(t, "ab!", NULL, "4:0-2");
    expect_tokens(t, "abab cab", NULL, "4:0-2 4:2-4 3:4-5 2:5-6 4:6-8");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_json_bpe_roberta_processing) {
    /* add_prefix_space, <mask> taking the whitespace on both sides, <s> and </s>
     * normalized, RobertaProcessing trimming offsets */
    tg_tokenizer *t = open_json(
        "{'model': {'type': 'BPE', " BPE_VOCAB ", " BPE_MERGES "}, 'pre_tokenizer': {'type': 'ByteLevel',"
        " 'add_prefix_space': true, 'use_regex': true}, 'added_tokens': [{'id': 12, 'content': '<mask>', 'lstrip': true,"
        " 'rstrip': true, 'normalized': false, 'special': true}, {'id': 8, 'content': '<s>', 'normalized': true,"
        " 'special': true}, {'id': 9, 'content': '</s>', 'normalized': true, 'special': true}],"
        " 'post_processor': {'type': 'RobertaProcessing', 'sep': ['</s>', 9], 'cls': ['<s>', 8], 'trim_offsets': true,"
        " 'add_prefix_space': true}}");
    REQUIRE(t, "no tokenizer");
    expect_special(t, TG_TOKENIZER_BPE_ROBERTA, (tg_special_ids){8, 9, 11, 7, 12, 8, 9});
    CHECK(tg_tokenizer_added_count(t, 0) == 2 && tg_tokenizer_added_count(t, 1) == 4, "RoBERTa adds 2 and 4");
    expect_tokens(t, "abc", NULL, "8:- 6:0-1 5:1-3 9:-");
    expect_tokens(t, "a xy b", NULL, "8:- 6:0-1 3:2-2 3:5-5 1:5-6 9:-");
    expect_tokens(t, "abab cab", NULL, "8:- 6:0-1 1:1-2 4:2-4 3:5-5 2:5-6 4:6-8 9:-");
    expect_tokens(t, "  a", NULL, "8:- 3:0-0 6:2-3 9:-");
    expect_tokens(t, "", NULL, "8:- 9:-");
    expect_tokens(t, "abc", "ab", "8:- 6:0-1 5:1-3 9:- 9:- 6:0-1 1:1-2 9:-");
    expect_tokens(t, "abc\xe2\x80\xa8<mask>\xc2\x85 ab", NULL, "8:- 6:0-1 5:1-3 12:6-12 6:16-16 1:16-17 9:-");
    expect_ids(t, "xyab", "8 6 1 9");
    /* <s> written in the text matches it (normalized added tokens match the raw text) */
    expect_ids(t, "ab<s>ab", "8 6 1 8 6 1 9");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_json_bpe_roberta_right_strip) {
    /* no prefix space; <mask> takes the whitespace after it only; a fused unk_token; and a
     * merge of two spaces: offsets trimmed of leading and trailing spaces */
    tg_tokenizer *t = open_json(
        "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': true, 'vocab': {'a': 0, 'b': 1, 'c': 2, '\xc4\xa0': 3,"
        " 'ab': 4, 'bc': 5,"
        " '\xc4\xa0" "a': 6, '<unk>': 7, '<s>': 8, '</s>': 9, 'abc': 10, '<pad>': 11, '<mask>': 12, '\xc4\xa0\xc4\xa0': 13},"
        " 'merges': [['a', 'b'], ['b', 'c'], ['\xc4\xa0', 'a'], ['a', 'b'], ['\xc4\xa0', '\xc4\xa0']]}, " BYTE_LEVEL ","
        " 'added_tokens': [{'id': 12, 'content': '<mask>', 'lstrip': false, 'rstrip': true, 'normalized': false,"
        " 'special': true}], 'post_processor': {'type': 'RobertaProcessing', 'sep': ['</s>', 9], 'cls': ['<s>', 8],"
        " 'trim_offsets': true, 'add_prefix_space': false}}");
    REQUIRE(t, "no tokenizer");
    expect_special(t, TG_TOKENIZER_BPE_ROBERTA, (tg_special_ids){8, 9, 11, 7, 12, 8, 9});
    expect_tokens(t, "ab<mask> ab", NULL, "8:- 4:0-2 12:2-8 4:9-11 9:-");
    expect_tokens(t, " ab", NULL, "8:- 6:1-2 1:2-3 9:-");
    expect_tokens(t, "a   b", NULL, "8:- 0:0-1 13:3-3 3:4-4 1:4-5 9:-");
    expect_tokens(t, "abc <mask>  c", NULL, "8:- 0:0-1 5:1-3 3:4-4 12:4-10 2:12-13 9:-");
    expect_tokens(t, "  a", NULL, "8:- 3:1-1 6:2-3 9:-");
    expect_tokens(t, "xy a", NULL, "8:- 7:0-2 6:3-4 9:-");
    tg_tokenizer_free(t);
    /* the same with RobertaProcessing's add_prefix_space: a first token of two spaces is
     * trimmed of both */
    t = open_json(
        "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': true, 'vocab': {'a': 0, 'b': 1, 'c': 2, '\xc4\xa0': 3,"
        " 'ab': 4, 'bc': 5, '\xc4\xa0" "a': 6, '<unk>': 7, '<s>': 8, '</s>': 9, 'abc': 10, '<pad>': 11, '<mask>': 12,"
        " '\xc4\xa0\xc4\xa0': 13}, 'merges': [['a', 'b'], ['b', 'c'], ['\xc4\xa0', 'a'], ['a', 'b'], ['\xc4\xa0',"
        " '\xc4\xa0']]}, " BYTE_LEVEL ", 'post_processor': {'type': 'RobertaProcessing', 'sep': ['</s>', 9], 'cls': ['<s>',"
        " 8], 'trim_offsets': true, 'add_prefix_space': true}}");
    expect_tokens(t, "   b", NULL, "8:- 13:2-2 3:3-3 1:3-4 9:-");
    expect_tokens(t, "  a", NULL, "8:- 3:0-0 6:2-3 9:-");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_json_bpe_template_sequence) {
    /* Sequence [ByteLevel, TemplateProcessing]: a template adding <s> ... </s> to a BPE
     * model whose vocabulary has <s> is RoBERTa's family */
    tg_tokenizer *t = open_json(
        "{'model': {'type': 'BPE', " BPE_VOCAB ", " BPE_MERGES "}, " BYTE_LEVEL ", 'post_processor': {'type': 'Sequence',"
        " 'processors': [{'type': 'ByteLevel', 'add_prefix_space': false, 'trim_offsets': false},"
        " {'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': '<s>', 'type_id': 0}}, {'Sequence': {'id':"
        " 'A', 'type_id': 0}}, {'SpecialToken': {'id': '</s>', 'type_id': 0}}], 'pair': [{'SpecialToken': {'id': '<s>',"
        " 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}}, {'SpecialToken': {'id': '</s>', 'type_id': 0}},"
        " {'Sequence': {'id': 'B', 'type_id': 1}}, {'SpecialToken': {'id': '</s>', 'type_id': 1}}], 'special_tokens':"
        " {'<s>': {'id': '<s>', 'ids': [8]}, '</s>': {'id': '</s>', 'ids': [9]}}}]}}");
    REQUIRE(t, "no tokenizer");
    /* no added tokens: pad, unk and mask are the vocabulary's */
    expect_special(t, TG_TOKENIZER_BPE_ROBERTA, (tg_special_ids){8, 9, 11, 7, 12, 8, 9});
    expect_tokens(t, "abc", NULL, "8:- 0:0-1 5:1-3 9:-");
    expect_tokens(t, "  a", NULL, "8:- 3:0-1 6:1-3 9:-");
    expect_tokens(t, "abc", "ab", "8:- 0:0-1 5:1-3 9:- 4:0-2 9:-");
    tg_tokenizer_free(t);

    /* the same template on a vocabulary without <s>: GPT-2's family, the template's ids kept */
    t = open_json("{'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1, 'E': 2}, 'merges': []}, " BYTE_LEVEL
                  ", 'post_processor': {'type': 'TemplateProcessing', 'single': [{'Sequence': {'id': 'A', 'type_id':"
                  " 0}}, {'SpecialToken': {'id': 'E', 'type_id': 0}}], 'pair': [{'Sequence': {'id': 'A', 'type_id':"
                  " 0}}, {'Sequence': {'id': 'B', 'type_id': 0}}, {'SpecialToken': {'id': 'E', 'type_id': 0}}],"
                  " 'special_tokens': {'E': {'id': 'E', 'ids': [2, 2]}}}}");
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, -1, -1, -1, -1});
    expect_tokens(t, "ab", NULL, "0:0-1 1:1-2 2:- 2:-");
    expect_tokens(t, "a", "b", "0:0-1 1:0-1 2:- 2:-");
    tg_tokenizer_free(t);

    /* a template with no special tokens on a vocabulary with <s>: still GPT-2's */
    t = open_json("{'model': {'type': 'BPE', " BPE_VOCAB ", " BPE_MERGES "}, " BYTE_LEVEL
                  ", 'post_processor': {'type': 'TemplateProcessing', 'single': [{'Sequence': {'id': 'A', 'type_id':"
                  " 0}}], 'pair': [{'Sequence': {'id': 'A', 'type_id': 0}}, {'Sequence': {'id': 'B', 'type_id': 1}}],"
                  " 'special_tokens': {}}}");
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, -1, -1, -1, -1});
    expect_tokens(t, "abc", "ab", "0:0-1 5:1-3 4:0-2");
    tg_tokenizer_free(t);

    /* BertProcessing on BPE: the template without RoBERTa's family or trimming */
    t = open_json("{'model': {'type': 'BPE', " BPE_VOCAB ", " BPE_MERGES "}, " BYTE_LEVEL
                  ", 'post_processor': {'type': 'BertProcessing', 'cls': ['<s>', 8], 'sep': ['</s>', 9]}}");
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, -1, -1, -1, -1});
    expect_tokens(t, "abc", "ab", "8:- 0:0-1 5:1-3 9:- 4:0-2 9:-");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_json_template_ids) {
    /* a template whose pair ends in a special token of two ids, one of them past the
     * vocabulary: the vocabulary size covers it, and [SEP] stays the vocabulary's */
    tg_tokenizer *t = open_json(
        "{'model': {'type': 'WordPiece', 'unk_token': 5, 'vocab': {'[UNK]': 0, '[CLS]': 1, '[SEP]': 2, 'a': 3}},"
        " 'pre_tokenizer': {'type': 'BertPreTokenizer'}, 'added_tokens': null, 'post_processor': {'type':"
        " 'TemplateProcessing', 'single': [{'SpecialToken': {'id': '[CLS]', 'type_id': 0}}, {'Sequence': {'id': 'A',"
        " 'type_id': 0}}], 'pair': [{'SpecialToken': {'id': '[CLS]', 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id':"
        " 0}}, {'Sequence': {'id': 'B', 'type_id': 1}}, {'SpecialToken': {'id': 'E', 'type_id': 1}}], 'special_tokens':"
        " {'[CLS]': {'id': '[CLS]', 'ids': [1]}, 'E': {'id': 'E', 'ids': [2, 50]}}}}");
    REQUIRE(t, "no tokenizer");
    CHECK(tg_tokenizer_vocab_size(t) == 51, "vocab size %d", tg_tokenizer_vocab_size(t));
    /* unk_token not a string: [UNK] */
    expect_special(t, TG_TOKENIZER_WORDPIECE, (tg_special_ids){1, 2, -1, 0, -1, -1, -1});
    expect_tokens(t, "a b", "a", "1:- 3:0-1 0:2-3 3:0-1 2:- 50:-");
    tg_tokenizer_free(t);

    /* a pair template that ends in B, or starts with a token of two ids: the vocabulary's
     * [CLS] and [SEP] stay the special ids */
    static const char *const pairs[] = {
        "[{'SpecialToken': {'id': '[CLS]', 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}}, {'SpecialToken':"
        " {'id': '[SEP]', 'type_id': 0}}, {'Sequence': {'id': 'B', 'type_id': 1}}]",
        "[{'SpecialToken': {'id': 'E', 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}}, {'Sequence': {'id': 'B',"
        " 'type_id': 1}}, {'SpecialToken': {'id': '[CLS]', 'type_id': 1}}]",
    };
    static const char *const want[] = {"1:- 3:0-1 2:- 3:0-1", "2:- 50:- 3:0-1 3:0-1 1:-"};
    for (int k = 0; k < 2; k++) {
        char json[2000];
        snprintf(json, sizeof json,
                 "{'model': {'type': 'WordPiece', 'vocab': {'[UNK]': 0, '[CLS]': 1, '[SEP]': 2, 'a': 3}}, 'pre_tokenizer':"
                 " {'type': 'BertPreTokenizer'}, 'post_processor': {'type': 'TemplateProcessing', 'single': [{'Sequence':"
                 " {'id': 'A', 'type_id': 0}}], 'pair': %s, 'special_tokens': {'[CLS]': {'id': '[CLS]', 'ids': [1]},"
                 " '[SEP]': {'id': '[SEP]', 'ids': [2]}, 'E': {'id': 'E', 'ids': [2, 50]}}}}",
                 pairs[k]);
        t = open_json(json);
        expect_special(t, TG_TOKENIZER_WORDPIECE, (tg_special_ids){1, 2, -1, 0, -1, -1, -1});
        expect_tokens(t, "a", "a", want[k]);
        tg_tokenizer_free(t);
    }

    /* RobertaProcessing naming ids of its own: they are RoBERTa's cls / bos and sep / eos,
     * not the vocabulary's <s> and </s> */
    t = open_json("{'model': {'type': 'BPE', " BPE_VOCAB ", " BPE_MERGES "}, " BYTE_LEVEL ", 'post_processor': {'type':"
                  " 'RobertaProcessing', 'cls': ['<cls>', 40], 'sep': ['<sep>', 41]}}");
    expect_special(t, TG_TOKENIZER_BPE_ROBERTA, (tg_special_ids){40, 41, 11, 7, 12, 40, 41});
    CHECK(!t || tg_tokenizer_vocab_size(t) == 42, "vocab size %d", t ? tg_tokenizer_vocab_size(t) : -1);
    expect_tokens(t, "ab", "c", "40:- 4:0-2 41:- 41:- 2:0-1 41:-");
    tg_tokenizer_free(t);

    /* the same content added twice: the later entry replaces the earlier */
    t = open_json("{'model': {'type': 'WordPiece', 'vocab': {'[UNK]': 0, 'a': 1}}, 'pre_tokenizer': {'type':"
                  " 'BertPreTokenizer'}, 'added_tokens': [{'id': 7, 'content': '<x>'}, {'id': 8, 'content': 'y'},"
                  " {'id': 9, 'content': '<x>'}]}");
    REQUIRE(t, "no tokenizer");
    CHECK(tg_tokenizer_token_id(t, "<x>") == 9 && tg_tokenizer_token_id(t, "y") == 8 && tg_tokenizer_vocab_size(t) == 10,
          "<x> is %d", tg_tokenizer_token_id(t, "<x>"));
    expect_tokens(t, "a<x>y", NULL, "1:0-1 9:1-4 8:4-5");
    tg_tokenizer_free(t);
}

/* The settings a tokenizer.json may leave out take HF's defaults: BertNormalizer cleans,
 * spaces CJK and lower-cases; an added token is normalized unless special; ByteLevel adds
 * the prefix space and trims offsets; BPE does not fuse unks. The ids are HF's for the
 * same files with the defaults written out. */
TG_TEST(test_tokenizer_json_defaults) {
    tg_tokenizer *t = open_json("{'model': {'type': 'WordPiece', 'vocab': {'[UNK]': 0, 'foo': 1, 'x': 2, '[X]': 3,"
                                " '\xe4\xb8\xad': 4}}, 'normalizer': {'type': 'BertNormalizer'}, 'pre_tokenizer': {'type':"
                                " 'BertPreTokenizer'}, 'added_tokens': [{'id': 5, 'content': 'bar'}, {'id': 6, 'content':"
                                " '[Y]', 'special': true}]}");
    expect_tokens(t, "FOO \x01X\xe4\xb8\xad" "BAR [Y] [y]", NULL, "1:0-3 2:5-6 4:6-9 5:9-12 6:13-16 0:17-18 0:18-19 0:19-20");
    tg_tokenizer_free(t);
    t = open_json("{'model': {'type': 'BPE', 'unk_token': '<unk>', " BPE_VOCAB ", " BPE_MERGES "}, 'pre_tokenizer':"
                  " {'type': 'ByteLevel'}, 'post_processor': {'type': 'ByteLevel'}}");
    expect_tokens(t, "abc", NULL, "6:0-1 5:1-3");
    expect_tokens(t, "xyab", NULL, "3:0-0 7:0-1 7:1-2 4:2-4");
    expect_tokens(t, "a xy b", NULL, "6:0-1 3:2-2 7:2-3 7:3-4 3:5-5 1:5-6");
    expect_tokens(t, "  a", NULL, "3:0-0 6:2-3");
    tg_tokenizer_free(t);
    /* WordPiece's continuing_subword_prefix null is "##" */
    t = open_json("{'model': {'type': 'WordPiece', 'continuing_subword_prefix': null, 'vocab': {'[UNK]': 0, 'ab': 1,"
                  " '##c': 2, 'c': 3}}, 'pre_tokenizer': {'type': 'BertPreTokenizer'}}");
    expect_tokens(t, "abc c", NULL, "1:0-2 2:2-3 3:4-5");
    tg_tokenizer_free(t);
}

/* ByteLevel's offset trimming on <unk> tokens spelled with byte-level spaces (HF's
 * process_offsets): a token that starts at byte 0 counts as the first, whatever its index,
 * so its one leading space is the prefix space and stays; trailing spaces past the end
 * offset leave it as it is. */
TG_TEST(test_tokenizer_json_trim_offsets_unk_spaces) {
    /* both bytes of Ã© lack ids: two <unk>s, each covering the whole character */
    static const char lead[] = "{'model': {'type': 'BPE', 'unk_token': '\xc4\xa0u', 'fuse_unk': false, 'vocab': {'a': 0,"
                               " '\xc4\xa0u': 1}, 'merges': []}, " BYTE_LEVEL ", 'post_processor': {'type': 'ByteLevel',"
                               " 'trim_offsets': true, 'add_prefix_space': %s}}";
    char json[512];
    snprintf(json, sizeof json, lead, "true");
    tg_tokenizer *t = open_json(json);
    expect_tokens(t, "\xc3\xa9", NULL, "1:0-2 1:0-2");
    expect_tokens(t, "a\xc3\xa9", NULL, "0:0-1 1:2-3 1:2-3");
    tg_tokenizer_free(t);
    snprintf(json, sizeof json, lead, "false");
    t = open_json(json);
    expect_tokens(t, "\xc3\xa9", NULL, "1:1-2 1:1-2");
    tg_tokenizer_free(t);
    /* an <unk> spelled with two trailing spaces over one byte: at byte 0 its end (1) is below
     * the two and stays; at byte 1 the end comes back to the start */
    t = open_json("{'model': {'type': 'BPE', 'unk_token': 'u\xc4\xa0\xc4\xa0', 'vocab': {'a': 0, 'u\xc4\xa0\xc4\xa0': 1},"
                  " 'merges': []}, " BYTE_LEVEL ", 'post_processor': {'type': 'ByteLevel'}}");
    expect_tokens(t, "x", NULL, "1:0-1");
    expect_tokens(t, "ax", NULL, "0:0-1 1:1-1");
    tg_tokenizer_free(t);
}

/* ---- folders: GPT-2 or RoBERTa by the hints ----------------------------------------- */

static tg_tokenizer *open_path(const char *path) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open %s: %s", path, err.msg);
    return t;
}

TG_TEST(test_tokenizer_json_folder_hints) {
    char *rv = tg_test_bpe_vocab_json(", \"<s>\": 266, \"</s>\": 267");
    char *gv = tg_test_bpe_vocab_json("");
    char *sv = tg_test_bpe_vocab_json(", \"<s>\": 266");
    static const struct {
        int roberta_vocab;
        const char *config, *tokenizer_config;
        tg_tokenizer_family want;
    } cases[] = {
        {1, NULL, NULL, TG_TOKENIZER_BPE_ROBERTA},
        {0, NULL, NULL, TG_TOKENIZER_BPE_GPT2},
        {1, "{'model_type': 'gpt2'}", NULL, TG_TOKENIZER_BPE_GPT2},
        {1, NULL, "{'tokenizer_class': 'GPT2TokenizerFast'}", TG_TOKENIZER_BPE_GPT2},
        {1, NULL, "{'tokenizer_class': 'RobertaTokenizer'}", TG_TOKENIZER_BPE_ROBERTA},
        {1, "{'model_type': 'roberta'}", "{'tokenizer_class': 7}", TG_TOKENIZER_BPE_ROBERTA},
        {1, "{'model_type': 3}", "{'tokenizer_class': 'BartTokenizer'}", TG_TOKENIZER_BPE_ROBERTA},
        {2, NULL, NULL, TG_TOKENIZER_BPE_GPT2}, /* <s> without </s> */
        {1, "{'hidden_size': 8}", NULL, TG_TOKENIZER_BPE_ROBERTA}, /* a config.json without model_type */
        {0, "{'hidden_size': 8}", NULL, TG_TOKENIZER_BPE_GPT2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const char *dir = tg_test_tmpdir();
        char sub[700];
        snprintf(sub, sizeof sub, "%s/case%zu", dir, k);
        char cmd[800];
        snprintf(cmd, sizeof cmd, "mkdir -p %s", sub);
        REQUIRE(system(cmd) == 0, "mkdir");
        write_plain(sub, "vocab.json", cases[k].roberta_vocab == 1 ? rv : cases[k].roberta_vocab ? sv : gv);
        tg_test_write_quoted(sub, "merges.txt", tg_test_bpe_merges);
        if (cases[k].config) tg_test_write_quoted(sub, "config.json", cases[k].config);
        if (cases[k].tokenizer_config) tg_test_write_quoted(sub, "tokenizer_config.json", cases[k].tokenizer_config);
        tg_tokenizer *t = open_path(sub);
        if (!t) continue;
        CHECK(tg_tokenizer_family_of(t) == cases[k].want, "case %zu: family %d, want %d", k, tg_tokenizer_family_of(t),
              cases[k].want);
        /* RoBERTa: <s> a </s>; GPT-2: nothing added */
        expect_ids(t, "hello", cases[k].want == TG_TOKENIZER_BPE_ROBERTA ? "266 259 267" : "259");
        tg_tokenizer_free(t);
    }

    /* GPT-2's own names: encoder.json + vocab.bpe in a folder, and a vocab.json opened as a
     * file with vocab.bpe beside it; add_prefix_space from tokenizer_config.json */
    const char *dir = tg_test_tmpdir();
    write_plain(dir, "encoder.json", gv);
    tg_test_write_quoted(dir, "vocab.bpe", tg_test_bpe_merges);
    tg_tokenizer *t = open_path(dir);
    expect_tokens(t, "hello world", NULL, "259:0-5 264:5-11");
    tg_tokenizer_free(t);
    tg_test_write_quoted(dir, "tokenizer_config.json", "{'add_prefix_space': true}");
    const char *vj = write_plain(dir, "vocab.json", gv);
    t = open_path(vj);
    /* " world" as one token: the prefix space is the first character's */
    expect_tokens(t, "world", NULL, "264:0-5");
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, 265, -1, 265, 265});
    tg_tokenizer_free(t);

    /* RoBERTa by its config, but </s> missing; a vocab.json file whose merges fail */
    const char *edir = tg_test_tmpdir();
    write_plain(edir, "vocab.json", sv);
    tg_test_write_quoted(edir, "merges.txt", tg_test_bpe_merges);
    tg_test_write_quoted(edir, "config.json", "{'model_type': 'roberta'}");
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(edir, &t, &err) == -1 && strstr(err.msg, "a RoBERTa vocabulary without <s> or </s>"),
          "<s> without </s>: %s", err.msg);
    tg_test_write_quoted(edir, "merges.txt", "h zz\n");
    char vj2[700];
    snprintf(vj2, sizeof vj2, "%s/vocab.json", edir);
    CHECK(tg_tokenizer_open(vj2, &t, &err) == -1 && strstr(err.msg, "merges.txt: merge 1: 'zz' is not in the vocabulary"),
          "bad merges beside a vocab.json: %s", err.msg);
    free(rv);
    free(gv);
    free(sv);
}

/* ---- the encoder's arguments --------------------------------------------------------- */

TG_TEST(test_tokenizer_json_encode_arguments) {
    tg_tokenizer *t = open_json(wp_added);
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    tg_err err = {{0}};
    CHECK(tg_tokenizer_encode(t, NULL, 3, NULL, 0, NULL, &e, &err) == -1 && strstr(err.msg, "no text"), "NULL text: %s",
          err.msg);
    CHECK(tg_tokenizer_encode(t, NULL, 0, NULL, 0, NULL, &e, &err) == 0 && e.n == 2 && e.ids[0] == 2 && e.ids[1] == 3,
          "NULL empty text: %d tokens", e.n);
    /* lengths past INT32_MAX / 2 are refused before any byte is read */
    CHECK(tg_tokenizer_encode(t, "x", (size_t)1 << 30, NULL, 0, NULL, &e, &err) == -1 &&
              strstr(err.msg, "text of 1073741824 bytes is longer than this reader takes"),
          "long text: %s", err.msg);
    CHECK(tg_tokenizer_encode(t, "x", 1, "y", (size_t)1 << 30, NULL, &e, &err) == -1 &&
              strstr(err.msg, "pair of 1073741824 bytes is longer"),
          "long pair: %s", err.msg);
    /* a pair given as an empty string is a pair */
    CHECK(tg_tokenizer_encode(t, "", 0, "", 0, NULL, &e, &err) == 0 && e.n == 3, "empty pair: %d tokens", e.n);
    /* max_len exactly the template: no text left */
    const tg_encode_options o = {1, 2, 0};
    CHECK(tg_tokenizer_encode(t, "Hello world", 11, NULL, 0, &o, &e, &err) == 0 && e.n == 2 && e.n_real == 2,
          "max_len 2: %d tokens", e.n);
    tg_encoding_free(&e);
    tg_encoding_free(NULL);
    tg_tokenizer_free(t);
    tg_tokenizer_free(NULL);
    CHECK(tg_tokenizer_token_id(NULL, "a") == -1 && !tg_tokenizer_id_to_token(NULL, 0) &&
              tg_tokenizer_added_count(NULL, 1) == 0,
          "NULL tokenizer");

    /* GPT-2 has no pad token: padding is refused */
    const char *dir = tg_test_tmpdir();
    char *v = tg_test_bpe_vocab_json("");
    write_plain(dir, "vocab.json", v);
    free(v);
    tg_test_write_quoted(dir, "merges.txt", tg_test_bpe_merges);
    t = open_path(dir);
    REQUIRE(t, "no GPT-2 tokenizer");
    CHECK(tg_tokenizer_token_id(t, NULL) == -1, "NULL token");
    const tg_encode_options pad = {1, 0, 4};
    CHECK(tg_tokenizer_encode(t, "hello", 5, NULL, 0, &pad, &e, &err) == -1 &&
              strstr(err.msg, "padding asked for, but the tokenizer has no pad token"),
          "GPT-2 padding: %s", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}
