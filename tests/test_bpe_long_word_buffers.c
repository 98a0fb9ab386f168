/* Byte-level BPE's per-word buffers (datasets/bpe.c) at their sizes: a word of 201 bytes
 * that no merge shortens gives 201 tokens, three numbers each (more than two a symbol
 * slot); with ignore_merges, a word whose byte-level form (2-byte characters) is longer than
 * the one before it took is looked up in a buffer grown to it. Each token's id
 * and offsets are checked; under ASan a buffer one size too small is an overflow. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* The tokens of text must be ids[i] over bytes [start[i], end[i]). */
static void expect_tokens(tg_tokenizer *t, const char *text, int32_t n, const int32_t *ids, const int64_t *start,
                          const int64_t *end) {
    tg_encoding e = {0};
    tg_err err = {{0}};
    if (CHECK(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, NULL, &e, &err) == 0, "encode: %s", err.msg)) {
        CHECK(e.n == n, "%d tokens, want %d", e.n, n);
        int bad = 0;
        for (int32_t i = 0; i < e.n && i < n && bad < 5; i++)
            if (e.ids[i] != ids[i] || e.start[i] != start[i] || e.end[i] != end[i])
                bad += !CHECK(0, "token %d: %d:%lld-%lld, want %d:%lld-%lld", i, e.ids[i], (long long)e.start[i],
                              (long long)e.end[i], ids[i], (long long)start[i], (long long)end[i]);
    }
    tg_encoding_free(&e);
}

static tg_tokenizer *open_json(const char *json) {
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(path && tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    return t;
}

enum { LONG = 201 };

TG_TEST(test_bpe_word_of_201_unmerged_bytes) {
    /* a, b, c and no merge: each byte of "abcabc..." is a token of its own */
    tg_tokenizer *t = open_json("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'vocab': {'a': 0, 'b': 1, 'c': 2, "
                                "'<unk>': 3, 'ab': 4}, 'merges': []}, "
                                "'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    REQUIRE(t, "open");
    char text[LONG + 1];
    int32_t ids[LONG];
    int64_t start[LONG], end[LONG];
    for (int i = 0; i < LONG; i++) {
        text[i] = (char)('a' + i % 3);
        ids[i] = i % 3, start[i] = i, end[i] = i + 1;
    }
    text[LONG] = 0;
    expect_tokens(t, text, LONG, ids, start, end);
    /* again, from the word cache or not */
    expect_tokens(t, text, LONG, ids, start, end);
    tg_tokenizer_free(t);

    /* with the merge (a b): 67 x [ab, c] */
    t = open_json("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'vocab': {'a': 0, 'b': 1, 'c': 2, '<unk>': 3, "
                  "'ab': 4}, 'merges': ['a b']}, 'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    REQUIRE(t, "open");
    int32_t n = 0;
    for (int i = 0; i < LONG; i += 3) {
        ids[n] = 4, start[n] = i, end[n] = i + 2, n++;
        ids[n] = 2, start[n] = i + 2, end[n] = i + 3, n++;
    }
    expect_tokens(t, text, n, ids, start, end);
    tg_tokenizer_free(t);
}

TG_TEST(test_bpe_ignore_merges_word_longer_than_the_lookup_buffer) {
    /* Ġ (the space byte), Ã (0xC3) and © (0xA9) at the byte level; "aa" whole */
    tg_tokenizer *t = open_json("{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'ignore_merges': "
                                "true, 'vocab': {'a': 0, '<unk>': 1, '\xc4\xa0': 2, '\xc3\x83': 3, '\xc2\xa9': 4, 'aa': 5}, "
                                "'merges': ['a a']}, 'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false}}");
    REQUIRE(t, "open");
    enum { A = 200, E = 140 }; /* "a" x 200 (400 bytes looked up), then " " + "é" x 140 (562 bytes) */
    char text[A + 1 + 2 * E + 1];
    memset(text, 'a', A);
    text[A] = ' ';
    for (int i = 0; i < E; i++) memcpy(text + A + 1 + 2 * i, "\xc3\xa9", 2);
    text[A + 1 + 2 * E] = 0;
    int32_t ids[A / 2 + 1 + 2 * E];
    int64_t start[A / 2 + 1 + 2 * E], end[A / 2 + 1 + 2 * E];
    int32_t n = 0;
    for (int i = 0; i < A; i += 2) ids[n] = 5, start[n] = i, end[n] = i + 2, n++;
    ids[n] = 2, start[n] = A, end[n] = A + 1, n++;
    /* a token of part of a character has the character's offsets, as HF gives them */
    for (int i = 0; i < 2 * E; i++) ids[n] = 3 + i % 2, start[n] = A + 1 + i / 2 * 2, end[n] = A + 3 + i / 2 * 2, n++;
    expect_tokens(t, text, n, ids, start, end);
    expect_tokens(t, text, n, ids, start, end);
    /* then short words: "aa" whole is token 5, "aaa" is not in the vocabulary (a a merges, then a) */
    expect_tokens(t, "aa aaa", 4, (const int32_t[]){5, 2, 5, 0}, (const int64_t[]){0, 2, 3, 5},
                  (const int64_t[]){2, 3, 5, 6});
    tg_tokenizer_free(t);
}
