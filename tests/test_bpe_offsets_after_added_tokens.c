/* Byte-level BPE offsets in a piece of text that starts after an added token (so not at
 * byte 0): a token that is part of a character (each byte of a CJK character its own token)
 * covers the whole character, found in the text from where the piece starts. Every
 * expected encoding is what Hugging Face `tokenizers` 0.23 gives for the same file and text
 * (its character offsets turned into bytes). */
#include <stdio.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

TG_TEST(test_bpe_offsets_of_pieces_after_an_added_token) {
    /* a, <unk>, Ġ, Ã, ©, Ã©, x, ä, ¸, Ń (the bytes of U+4E2D at the byte level), <s> */
    const char *path = tg_test_write_quoted(
        tg_test_tmpdir(), "tokenizer.json",
        "{'model': {'type': 'BPE', 'unk_token': '<unk>', 'fuse_unk': false, 'vocab': {'a': 0, '<unk>': 1, "
        "'\xc4\xa0': 2, '\xc3\x83': 3, '\xc2\xa9': 4, '\xc3\x83\xc2\xa9': 5, 'x': 6, '\xc3\xa4': 7, '\xc2\xb8': 8, "
        "'\xc5\x83': 9, '<s>': 10}, 'merges': ['\xc3\x83 \xc2\xa9']}, 'pre_tokenizer': {'type': 'ByteLevel', "
        "'add_prefix_space': false, 'trim_offsets': false, 'use_regex': true}, 'added_tokens': [{'id': 10, "
        "'content': '<s>', 'single_word': false, 'lstrip': false, 'rstrip': false, 'special': true, "
        "'normalized': false}]}");
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(path && tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"a<s>\xc3\xa9", "0:0-1 10:1-4 5:4-6"},
        {"xx<s> \xc3\xa9" "a", "6:0-1 6:1-2 10:2-5 2:5-6 5:6-8 0:8-9"},
        {"<s>\xe4\xb8\xad<s>\xc3\xa9\xc3\xa9", "10:0-3 7:3-6 8:3-6 9:3-6 10:6-9 5:9-11 5:11-13"},
        {"aaa<s>x \xe4\xb8\xad", "0:0-1 0:1-2 0:2-3 10:3-6 6:6-7 2:7-8 7:8-11 8:8-11 9:8-11"},
        {"\xe4\xb8\xad<s>\xe4\xb8\xad\xe4\xb8\xad", "7:0-3 8:0-3 9:0-3 10:3-6 7:6-9 8:6-9 9:6-9 7:9-12 8:9-12 9:9-12"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_encoding e = {0};
        const tg_encode_options o = {.add_special_tokens = 0};
        if (!CHECK(tg_tokenizer_encode(t, cases[i].text, strlen(cases[i].text), NULL, 0, &o, &e, &err) == 0,
                   "case %zu: %s", i, err.msg))
            continue;
        char got[512] = "";
        size_t n = 0;
        for (int32_t k = 0; k < e.n && n + 40 < sizeof got; k++)
            n += (size_t)snprintf(got + n, sizeof got - n, "%s%d:%lld-%lld", k ? " " : "", e.ids[k],
                                  (long long)e.start[k], (long long)e.end[k]);
        CHECK(!strcmp(got, cases[i].want), "case %zu: got '%s', want '%s'", i, got, cases[i].want);
        tg_encoding_free(&e);
    }
    tg_tokenizer_free(t);
}
