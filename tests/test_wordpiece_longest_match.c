/* WordPiece's greedy longest match in datasets/wordpiece.c (wordpiece_word): the longest
 * vocabulary entry from the left of a word, then the continuing prefix ("##" or the
 * model's continuing_subword_prefix) and the longest entry from where it ended; a word
 * with a piece that has no entry, or longer than max_input_chars_per_word characters, is
 * the unk token alone, and without one in the vocabulary the word is refused. Entries with
 * id 0 match like any other. Offsets are bytes of the text; no normalizer, so each
 * character stands for its own bytes. Expected tokens follow Hugging Face's WordPiece
 * model (tokenizers 0.23) on the same vocabularies. */
#include <stdio.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* 'ab' holds id 0: a match of id 0 ends the search like any other id */
#define WP_VOCAB                                                                                                       \
    "'ab': 0, '[UNK]': 1, 'a': 2, '##b': 3, '##bc': 4, 'c': 5, '##c': 6, '\xc3\xa9': 7, '##\xc3\xa9': 8, 'abcd': 9, " \
    "'##a': 10"

static tg_tokenizer *open_wordpiece(const char *model_extra, const char *vocab) {
    char json[2000];
    snprintf(json, sizeof json,
             "{'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'vocab': {%s}%s}, "
             "'pre_tokenizer': {'type': 'BertPreTokenizer'}}",
             vocab, model_extra);
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open %s: %s", json, err.msg);
    return t;
}

/* ID:START-END for each token, no template */
static void expect(tg_tokenizer *t, const char *what, const char *text, const char *want) {
    tg_encoding e = {0};
    tg_err err = {{0}};
    const tg_encode_options opt = {.add_special_tokens = 0};
    if (CHECK(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, &opt, &e, &err) == 0, "%s '%s': %s", what, text,
              err.msg)) {
        char got[512] = "";
        size_t n = 0;
        for (int32_t k = 0; k < e.n && n + 40 < sizeof got; k++)
            n += (size_t)snprintf(got + n, sizeof got - n, "%s%d:%lld-%lld", k ? " " : "", e.ids[k],
                                  (long long)e.start[k], (long long)e.end[k]);
        CHECK(!strcmp(got, want), "%s '%s': got '%s', want '%s'", what, text, got, want);
    }
    tg_encoding_free(&e);
}

TG_TEST(test_wordpiece_longest_match_pieces) {
    tg_tokenizer *t = open_wordpiece("", WP_VOCAB);
    REQUIRE(t, "no tokenizer");
    expect(t, "id 0 whole", "ab", "0:0-2");
    expect(t, "id 0 then ##c", "abc", "0:0-2 6:2-3");
    expect(t, "longest continuation", "abbc", "0:0-2 4:2-4");
    expect(t, "whole word entry", "abcd", "9:0-4");
    expect(t, "one character", "a", "2:0-1");
    expect(t, "##a after c", "ca", "5:0-1 10:1-2");
    expect(t, "a piece with no entry", "cd", "1:0-2");
    expect(t, "##b after c", "cb", "5:0-1 3:1-2");
    expect(t, "first piece with no entry", "b", "1:0-1");
    expect(t, "no entry after a match", "abd", "1:0-3");
    expect(t, "two words", "ab c", "0:0-2 5:3-4");
    expect(t, "punctuation splits", "ab,a", "0:0-2 1:2-3 2:3-4");
    expect(t, "two-byte characters", "a\xc3\xa9\xc3\xa9", "2:0-1 8:1-3 8:3-5");
    expect(t, "two-byte first", "\xc3\xa9" "c", "7:0-2 6:2-3");
    expect(t, "a longer word than any entry", "ababab", "0:0-2 10:2-3 3:3-4 10:4-5 3:5-6");
    expect(t, "longer than the longest entry, spelled", "abcbcbc", "0:0-2 6:2-3 4:3-5 4:5-7");
    expect(t, "empty", "", "");
    tg_tokenizer_free(t);
}

TG_TEST(test_wordpiece_longest_match_limits_and_prefix) {
    /* max_input_chars_per_word counts characters, not bytes: 3 allows 'a' + two 'é' */
    tg_tokenizer *t = open_wordpiece(", 'max_input_chars_per_word': 3", WP_VOCAB);
    REQUIRE(t, "no tokenizer");
    expect(t, "three characters", "abc", "0:0-2 6:2-3");
    expect(t, "three characters of five bytes", "a\xc3\xa9\xc3\xa9", "2:0-1 8:1-3 8:3-5");
    expect(t, "four characters", "abbc", "1:0-4");
    expect(t, "the limit per word", "abbc ab", "1:0-4 0:5-7");
    tg_tokenizer_free(t);

    t = open_wordpiece(", 'max_input_chars_per_word': 0", WP_VOCAB);
    REQUIRE(t, "no tokenizer");
    expect(t, "limit 0", "a", "1:0-1");
    tg_tokenizer_free(t);

    /* another continuing prefix: '##' entries are then whole-word entries only */
    t = open_wordpiece(", 'continuing_subword_prefix': '@@'",
                       "'ab': 0, '[UNK]': 1, 'a': 2, '@@b': 3, '##b': 4, '@@bc': 5, 'c': 6");
    REQUIRE(t, "no tokenizer");
    expect(t, "no @@c", "abc", "1:0-3");
    expect(t, "@@ continuation", "abbc", "0:0-2 5:2-4");
    expect(t, "@@b", "ab", "0:0-2");
    expect(t, "a then @@b", "abb", "0:0-2 3:2-3");
    tg_tokenizer_free(t);

    /* an empty prefix: pieces after the first are plain entries */
    t = open_wordpiece(", 'continuing_subword_prefix': ''", "'[UNK]': 0, 'ab': 1, 'c': 2, 'a': 3");
    REQUIRE(t, "no tokenizer");
    expect(t, "empty prefix", "abcab", "1:0-2 2:2-3 1:3-5");
    expect(t, "unk id 0", "abd", "0:0-3");
    tg_tokenizer_free(t);
}

TG_TEST(test_wordpiece_longest_match_no_unk) {
    /* the unk token named but not in the vocabulary: a word it cannot spell is refused */
    tg_tokenizer *t = open_wordpiece("", "'ab': 0, 'a': 1, '##b': 2");
    REQUIRE(t, "no tokenizer");
    expect(t, "spelled", "ab a", "0:0-2 1:3-4");
    tg_encoding e = {0};
    tg_err err = {{0}};
    const tg_encode_options opt = {.add_special_tokens = 0};
    CHECK(tg_tokenizer_encode(t, "ab x", 4, NULL, 0, &opt, &e, &err) == -1 &&
              !strcmp(err.msg, "the vocabulary has no unk token '[UNK]' for a word it cannot spell"),
          "no unk: '%s'", err.msg);
    /* a punctuation character is a word of its own, refused the same way */
    CHECK(tg_tokenizer_encode(t, "ab!", 3, NULL, 0, &opt, &e, &err) == -1 &&
              !strcmp(err.msg, "the vocabulary has no unk token '[UNK]' for a word it cannot spell"),
          "no unk for '!': '%s'", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

/* BertPreTokenizer's classes of the ASCII bytes: whitespace ends a word and is dropped,
 * each punctuation character (HF's is_punctuation: ! to /, : to @, [ to `, { to ~) is a
 * word of its own, letters and digits are inside words. "x" + c + "x" for every printable
 * byte and the ASCII whitespace. */
TG_TEST(test_wordpiece_longest_match_ascii_classes) {
    tg_tokenizer *t = open_wordpiece("", "'[UNK]': 0, 'x': 1, '##x': 2");
    REQUIRE(t, "no tokenizer");
    for (int c = 0x09; c <= 0x7E; c++) {
        if (c > 0x0D && c < 0x20) continue;
        const char text[4] = {'x', (char)c, 'x', 0};
        const int space = c <= 0x20;
        const int punct = (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                          (c >= 0x7B && c <= 0x7E);
        char what[32];
        snprintf(what, sizeof what, "byte 0x%02x", c);
        expect(t, what, text, space ? "1:0-1 1:2-3" : punct ? "1:0-1 0:1-2 1:2-3" : c == 'x' ? "1:0-1 2:1-2 2:2-3" : "0:0-3");
    }
    tg_tokenizer_free(t);
}

/* Characters of 2, 3 and 4 bytes (continuation bytes with odd and even low bits): the
 * longest entry (6 bytes here) cuts a word inside a character, and the search steps back
 * to the character's first byte; a shorter match steps back a whole character at a time.
 * U+65E5 is e6 97 a5, U+672C e6 9c ac, U+1F600 f0 9f 98 80, U+00F1 c3 b1. */
TG_TEST(test_wordpiece_longest_match_multibyte_characters) {
    tg_tokenizer *t = open_wordpiece("", "'[UNK]': 0, '\xe6\x97\xa5': 1, '##\xe6\x97\xa5': 2, '\xe6\x97\xa5\xe6\x9c\xac': 3, "
                                         "'##\xe6\x9c\xac': 4, '\xf0\x9f\x98\x80': 5, '##\xf0\x9f\x98\x80': 6, 'a': 7, "
                                         "'##\xc3\xb1': 8");
    REQUIRE(t, "no tokenizer");
    expect(t, "two 3-byte characters whole", "\xe6\x97\xa5\xe6\x9c\xac", "3:0-6");
    expect(t, "cut at a character", "\xe6\x97\xa5\xe6\x9c\xac\xe6\x97\xa5", "3:0-6 2:6-9");
    expect(t, "a whole character back", "\xe6\x97\xa5\xe6\x97\xa5\xe6\x9c\xac", "1:0-3 2:3-6 4:6-9");
    expect(t, "cut inside a 4-byte character", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", "5:0-4 6:4-8");
    expect(t, "cut inside, then the prefix", "\xe6\x97\xa5\xf0\x9f\x98\x80\xe6\x9c\xac", "1:0-3 6:3-7 4:7-10");
    expect(t, "2-byte continuation", "a\xc3\xb1", "7:0-1 8:1-3");
    expect(t, "3-byte continuation", "a\xe6\x97\xa5", "7:0-1 2:1-4");
    expect(t, "no entry for the character alone", "\xe6\x9c\xac", "0:0-3");
    expect(t, "no entry after a 4-byte character", "\xf0\x9f\x98\x80\xc3\xb1" "a", "0:0-7");
    tg_tokenizer_free(t);
}
