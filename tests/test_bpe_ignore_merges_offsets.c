/* Byte-level BPE with ignore_merges (datasets/bpe.c): a word the vocabulary holds whole is
 * that one token, and its offsets are the word's bytes wherever the word starts in the
 * text (after a digit, after punctuation, a second time from the word cache), as Hugging
 * Face `tokenizers` gives them. A word longer than the word cache takes, of bytes that are
 * 2-byte characters at the byte level, is looked up whole too. A whole word of id 0 (as
 * GPT-2's "!") is that token like any other id. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* ID:START-END for each token. */
static void expect_offsets(tg_tokenizer *t, const char *text, const char *want) {
    tg_encoding e = {0};
    tg_err err = {{0}};
    if (CHECK(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, NULL, &e, &err) == 0, "encode '%s': %s", text,
              err.msg)) {
        char got[512] = "";
        size_t n = 0;
        for (int32_t i = 0; i < e.n && n + 40 < sizeof got; i++)
            n += (size_t)snprintf(got + n, sizeof got - n, "%s%d:%lld-%lld", i ? " " : "", e.ids[i], (long long)e.start[i],
                                  (long long)e.end[i]);
        CHECK(!strcmp(got, want), "'%s': got '%s', want '%s'", text, got, want);
    }
    tg_encoding_free(&e);
}

TG_TEST(test_bpe_ignore_merges_whole_word_offsets) {
    /* a b c, Ġ, ab, bc, abc; no id for digits or punctuation (each byte an <unk>). */
    const char *path = tg_test_write_quoted(
        tg_test_tmpdir(), "tokenizer.json",
        "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'ignore_merges': true, 'vocab': {'a': 0, "
        "'b': 1, 'c': 2, '\xc4\xa0': 3, 'ab': 4, 'bc': 5, '<unk>': 7, 'abc': 10}, 'merges': ['b c', 'a b']}, "
        "'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    expect_offsets(t, "abc", "10:0-3");
    expect_offsets(t, "1abc", "7:0-1 10:1-4");
    expect_offsets(t, "ab,abc", "4:0-2 7:2-3 10:3-6");
    /* the second "abc" comes from the word cache */
    expect_offsets(t, "abc12abc", "10:0-3 7:3-4 7:4-5 10:5-8");
    /* "ca" is not in the vocabulary whole: the merges, (b c) first */
    expect_offsets(t, "9cabc", "7:0-1 2:1-2 0:2-3 5:3-5");
    tg_tokenizer_free(t);
}

/* 300 x "\xc3\xa9" (600 bytes; at the byte level "\xc3\x83\xc2\xa9" each, 1200 bytes) is
 * token 11; at the start, after a digit and after punctuation. */
TG_TEST(test_bpe_ignore_merges_long_word_of_two_byte_characters) {
    enum { REPEAT = 300 };
    const size_t cap = REPEAT * 4 + 512;
    char *json = malloc(cap), *text = malloc(2 * REPEAT * 2 + 8);
    REQUIRE(json && text, "malloc");
    int n = snprintf(json, cap, "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'ignore_merges': "
                                "true, 'vocab': {'a': 0, '<unk>': 7, '");
    for (int i = 0; i < REPEAT; i++) memcpy(json + n + 4 * i, "\xc3\x83\xc2\xa9", 4);
    n += 4 * REPEAT;
    snprintf(json + n, cap - (size_t)n, "': 11}, 'merges': []}, 'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    free(json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    char word[2 * REPEAT + 1];
    for (int i = 0; i < REPEAT; i++) memcpy(word + 2 * i, "\xc3\xa9", 2);
    word[2 * REPEAT] = 0;
    snprintf(text, 2 * REPEAT * 2 + 8, "%s", word);
    expect_offsets(t, text, "11:0-600");
    snprintf(text, 2 * REPEAT * 2 + 8, "1%s,%s", word, word);
    expect_offsets(t, text, "7:0-1 11:1-601 7:601-602 11:602-1202");
    /* one character short: not in the vocabulary, and without merges each byte is an <unk> */
    snprintf(text, 2 * REPEAT * 2 + 8, "a%s", word + 2);
    tg_encoding e = {0};
    REQUIRE(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, NULL, &e, &err) == 0, "%s", err.msg);
    CHECK(e.n == 2 * REPEAT - 1 && e.ids[0] == 0 && e.ids[1] == 7 && e.ids[e.n - 1] == 7 && e.start[1] == 1 &&
              e.end[1] == 3 && e.start[e.n - 1] == 1 + 2 * (REPEAT - 2) && e.end[e.n - 1] == 2 * REPEAT - 1,
          "%d tokens", e.n);
    tg_encoding_free(&e);
    free(text);
    tg_tokenizer_free(t);
}

/* The whole-word lookup spells the word at the byte level in a buffer kept for the next
 * word: once a word has been encoded, the same or a shorter one allocates nothing
 * (base/alloc.h's tg_alloc_made), the word cache answering the second time. */
TG_TEST(test_bpe_ignore_merges_buffers_reused) {
    const char *path = tg_test_write_quoted(
        tg_test_tmpdir(), "tokenizer.json",
        "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'ignore_merges': true, 'vocab': {'a': 0, "
        "'b': 1, 'c': 2, '\xc4\xa0': 3, 'ab': 4, 'bc': 5, '<unk>': 7, 'abc': 10}, 'merges': ['b c', 'a b']}, "
        "'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    tg_encoding e = {0};
    static const char *const words[] = {"cabcabcabc", "cabcab", "abc"};
    for (int k = 0; k < 3; k++)
        REQUIRE(tg_tokenizer_encode(t, words[k], strlen(words[k]), NULL, 0, NULL, &e, &err) == 0, "%s", err.msg);
    tg_alloc_fail_after(-1);
    int ok = 1;
    for (int k = 0; k < 3; k++) ok &= tg_tokenizer_encode(t, words[k], strlen(words[k]), NULL, 0, NULL, &e, &err) == 0;
    const long made = tg_alloc_made();
    CHECK(ok, "%s", err.msg);
    CHECK(made == 0, "encoding words no longer than before made %ld allocations", made);
    /* (b c) ranks first: c a bc a bc a bc */
    CHECK(tg_tokenizer_encode(t, "cabcabcabc", 10, NULL, 0, NULL, &e, &err) == 0 && e.n == 7 && e.ids[0] == 2 &&
              e.ids[1] == 0 && e.ids[2] == 5 && e.ids[6] == 5 && e.start[6] == 8 && e.end[6] == 10,
          "%d tokens", e.n);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

/* A word held whole as id 0 is token 0, not its bytes: "ab" is 0 where the merges (none
 * here) would leave a b; "ba" is not held whole, so its bytes; a 2-byte character word
 * "\xc3\xa9" (at the byte level "\xc3\x83\xc2\xa9") held as id 0 is one token too. */
TG_TEST(test_bpe_ignore_merges_whole_word_of_id_zero) {
    const char *path = tg_test_write_quoted(
        tg_test_tmpdir(), "tokenizer.json",
        "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'ignore_merges': true, 'vocab': {'ab': 0, "
        "'a': 1, 'b': 2, '<unk>': 3, '\xc3\x83': 4, '\xc2\xa9': 5}, 'merges': []}, "
        "'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    expect_offsets(t, "ab", "0:0-2");
    expect_offsets(t, "ba", "2:0-1 1:1-2");
    expect_offsets(t, "ab,ab", "0:0-2 3:2-3 0:3-5");
    /* the second time from the word cache */
    expect_offsets(t, "1ab", "3:0-1 0:1-3");
    expect_offsets(t, "\xc3\xa9", "4:0-2 5:0-2");
    tg_tokenizer_free(t);
    /* the same word as id 0 whole */
    path = tg_test_write_quoted(
        tg_test_tmpdir(), "tokenizer.json",
        "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'ignore_merges': true, 'vocab': "
        "{'\xc3\x83\xc2\xa9': 0, '<unk>': 1, '\xc3\x83': 4, '\xc2\xa9': 5}, 'merges': []}, "
        "'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    expect_offsets(t, "\xc3\xa9", "0:0-2");
    tg_tokenizer_free(t);
}
