/* Byte-level BPE with add_prefix_space (datasets/bpe.c, tok_bpe_encode): the text is
 * encoded as if a space stood before it (Hugging Face tokenizers 0.23 gives the same tokens and offsets), in a buffer the tokenizer keeps and grows only
 * for a longer text; offsets stay those of the text, the prefix space alone covering the
 * first character. Once a tokenizer has encoded a text, encoding it or any shorter one
 * again allocates nothing (the buffers, the merge cache and the encoding are reused):
 * counted with base/alloc.h's tg_alloc_made. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

#define VOCAB                                                                                                          \
    "'vocab': {'a': 0, 'b': 1, 'c': 2, '\xc4\xa0': 3, 'ab': 4, 'bc': 5, '\xc4\xa0" "a': 6, '<unk>': 7, '\xc4\xa0"      \
    "b': 8, '\xc3\x83': 9, '\xc2\xa9': 10}"
#define MERGES "'merges': [['a', 'b'], ['b', 'c'], ['\xc4\xa0', 'a'], ['\xc4\xa0', 'b']]"

static tg_tokenizer *open_prefixed(int add_prefix_space) {
    char json[1000];
    snprintf(json, sizeof json,
             "{'model': {'type': 'BPE', 'unk_token': '<unk>', " VOCAB ", " MERGES "}, 'pre_tokenizer': {'type': "
             "'ByteLevel', 'add_prefix_space': %s}}",
             add_prefix_space ? "true" : "false");
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open: %s", err.msg);
    return t;
}

static int encode_as(tg_tokenizer *t, tg_encoding *e, const char *text, const char *want) {
    tg_err err = {{0}};
    const tg_encode_options opt = {.add_special_tokens = 0};
    if (!CHECK(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, &opt, e, &err) == 0, "'%s': %s", text, err.msg))
        return 0;
    char got[1024] = "";
    size_t n = 0;
    for (int32_t k = 0; k < e->n && n + 40 < sizeof got; k++)
        n += (size_t)snprintf(got + n, sizeof got - n, "%s%d:%lld-%lld", k ? " " : "", e->ids[k], (long long)e->start[k],
                              (long long)e->end[k]);
    return CHECK(!strcmp(got, want), "'%s': got '%s', want '%s'", text, got, want);
}

TG_TEST(test_bpe_prefix_space_buffers_offsets) {
    tg_tokenizer *t = open_prefixed(1);
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    encode_as(t, &e, "ab", "3:0-1 4:0-2");
    encode_as(t, &e, "bc", "3:0-1 5:0-2");
    encode_as(t, &e, "c", "3:0-1 2:0-1");
    encode_as(t, &e, " ab", "3:0-1 4:1-3");  /* a text starting with a space gets none */
    encode_as(t, &e, "ab bc", "3:0-1 4:0-2 3:2-3 5:3-5");
    encode_as(t, &e, "\xc3\xa9", "3:0-2 9:0-2 10:0-2"); /* the prefix space alone covers the whole character */
    encode_as(t, &e, "", "");
    tg_encoding_free(&e);
    tg_tokenizer_free(t);

    t = open_prefixed(0);
    REQUIRE(t, "no tokenizer");
    encode_as(t, &e, "ab", "4:0-2");
    encode_as(t, &e, "ab bc", "4:0-2 3:2-3 5:3-5");
    encode_as(t, &e, "\xc3\xa9", "9:0-2 10:0-2");
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_bpe_prefix_space_buffers_reused) {
    tg_tokenizer *t = open_prefixed(1);
    REQUIRE(t, "no tokenizer");
    tg_encoding e = {0};
    /* a long text first: every buffer takes its size */
    static char longer[4096], shorter[64];
    size_t n = 0;
    while (n + 6 < sizeof longer) n += (size_t)snprintf(longer + n, sizeof longer - n, "ab bc ");
    snprintf(shorter, sizeof shorter, "bc ab");
    tg_err err = {{0}};
    const tg_encode_options opt = {.add_special_tokens = 0};
    REQUIRE(tg_tokenizer_encode(t, longer, strlen(longer), NULL, 0, &opt, &e, &err) == 0, "%s", err.msg);
    const int32_t long_n = e.n;
    REQUIRE(tg_tokenizer_encode(t, shorter, strlen(shorter), NULL, 0, &opt, &e, &err) == 0, "%s", err.msg);

    tg_alloc_fail_after(-1);
    int ok = tg_tokenizer_encode(t, longer, strlen(longer), NULL, 0, &opt, &e, &err) == 0 && e.n == long_n;
    ok = ok && encode_as(t, &e, shorter, "3:0-1 5:0-2 3:2-3 4:3-5");
    ok = ok && encode_as(t, &e, "ab", "3:0-1 4:0-2");
    ok = ok && tg_tokenizer_encode(t, longer + 6, strlen(longer) - 6, NULL, 0, &opt, &e, &err) == 0 && e.n > 0 && e.n < long_n;
    const long made = tg_alloc_made();
    CHECK(ok, "encodings: %s", err.msg);
    CHECK(made == 0, "encoding a text no longer than one before made %ld allocations", made);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}
