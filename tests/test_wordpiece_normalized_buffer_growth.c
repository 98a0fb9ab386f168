/* BertNormalizer's output buffer in datasets/wordpiece.c grows while it writes: CJK
 * characters come out with a space on each side, so the normalized text (and its per-byte
 * offsets) outgrows the room reserved for the input's length, at 4096 bytes, from a run of
 * CJK alone, from ASCII between them and from accented letters whose accents go. Each
 * token's id and byte range as Hugging Face tokenizers 0.23 gives them (each CJK character
 * its own token). Under AddressSanitizer a write past the buffer fails here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"

TG_TEST(test_wordpiece_normalized_buffer_outgrows_the_input) {
    char json[1000], path[700];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\", "
             "\"max_input_chars_per_word\": 100, \"vocab\": {\"[UNK]\": 0, \"a\": 1, \"b\": 2, \"\xe4\xb8\xad\": 17, "
             "\"##a\": 12}}, \"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, "
             "\"handle_chinese_chars\": true, \"strip_accents\": true, \"lowercase\": true}, "
             "\"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}");
    snprintf(path, sizeof path, "%s/tokenizer.json", tg_test_tmpdir());
    REQUIRE(tg_test_write_file(path, json) == 0, "write");
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(path, &t, &err) == 0, "%s", err.msg);
    /* each unit repeated: its bytes, and the tokens it gives (id, bytes) before the CJK one */
    static const struct {
        const char *unit;
        int repeat, lead_id, lead_bytes;
    } cases[] = {
        {"\xe4\xb8\xad", 900, -1, 0}, /* 2700 bytes in, 4500 out */
        {"a\xe4\xb8\xad", 700, 1, 1},   /* 2800 in, 4200 out */
        {"\xc3\x89\xe4\xb8\xad", 700, 0, 2}, /* E-acute: e, unknown; 3500 in, 4200 out */
        {"\xe4\xb8\xad", 1500, -1, 0}, /* 4500 in, 7500 out: past a buffer of 8192 reserved first */
        {"\xe4\xb8\xad", 2800, -1, 0}, /* 8400 in, 14000 out */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const size_t ul = strlen(cases[c].unit);
        char *text = malloc(ul * (size_t)cases[c].repeat + 1);
        REQUIRE(text, "malloc");
        for (int i = 0; i < cases[c].repeat; i++) memcpy(text + ul * (size_t)i, cases[c].unit, ul);
        for (int pass = 0; pass < 2; pass++) { /* the second with the buffers grown */
            tg_encoding e = {0};
            const tg_encode_options o = {.add_special_tokens = 0};
            if (!CHECK(tg_tokenizer_encode(t, text, ul * (size_t)cases[c].repeat, NULL, 0, &o, &e, &err) == 0,
                       "case %zu: %s", c, err.msg))
                continue;
            const int per = cases[c].lead_id >= 0 ? 2 : 1;
            int bad = e.n != per * cases[c].repeat;
            for (int i = 0; !bad && i < cases[c].repeat; i++) {
                const int64_t at = (int64_t)ul * i;
                int k = per * i;
                if (per == 2) {
                    bad |= e.ids[k] != cases[c].lead_id || e.start[k] != at || e.end[k] != at + cases[c].lead_bytes;
                    k++;
                }
                bad |= e.ids[k] != 17 || e.start[k] != at + cases[c].lead_bytes || e.end[k] != at + (int64_t)ul;
                if (bad)
                    CHECK(0, "case %zu pass %d: token %d is %d:%lld-%lld", c, pass, k, e.ids[k], (long long)e.start[k],
                          (long long)e.end[k]);
            }
            CHECK(!bad, "case %zu pass %d: %d tokens", c, pass, e.n);
            tg_encoding_free(&e);
        }
        free(text);
    }
    tg_tokenizer_free(t);
}
