#include "tests/text_fixtures.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"

const char tg_test_squad_v2[] =
    "{\"version\": \"v2.0\", \"data\": [{\"title\": \"T\", \"paragraphs\": [{\"context\": \"Caf\\u00e9 Paris opened in "
    "1901.\", \"qas\": [{\"id\": \"q1\", \"question\": \"When?\", \"answers\": [{\"text\": \"1901\", "
    "\"answer_start\": 21}], \"is_impossible\": false}, {\"id\": \"q2\", \"question\": \"Who?\", \"answers\": [], "
    "\"plausible_answers\": [{\"text\": \"Paris\", \"answer_start\": 5}], \"is_impossible\": true}]}]}, "
    "{\"paragraphs\": [{\"context\": \"x\", \"qas\": [{\"id\": 7, \"question\": \"q\", \"answers\": [{\"text\": \"x\", "
    "\"answer_start\": 0}]}]}]}]}";

const char tg_test_bpe_merges[] =
    "#version: 0.2\nh e\nl l\nhe ll\nhell o\n\xc4\xa0 w\no r\n\xc4\xa0w or\nl d\n\xc4\xa0wor ld\n";

char *tg_test_bpe_vocab_json(const char *extra) {
    size_t cap = 65536, n = 0;
    char *s = malloc(cap);
    if (!s) abort();
    n += (size_t)snprintf(s + n, cap - n, "{");
    for (int b = 0; b < 256; b++) {
        char u[5] = {0};
        tok_utf8_put(tok_byte_char((uint8_t)b), u);
        const char *esc = u[0] == '"' ? "\\\"" : u[0] == '\\' ? "\\\\" : u;
        n += (size_t)snprintf(s + n, cap - n, "%s\"%s\": %d", b ? ", " : "", esc, b);
    }
    static const char *const merged[] = {"he",  "ll",           "hell", "hello",         "\xc4\xa0w",
                                         "or", "\xc4\xa0wor", "ld",   "\xc4\xa0world"};
    for (int k = 0; k < 9; k++) n += (size_t)snprintf(s + n, cap - n, ", \"%s\": %d", merged[k], 256 + k);
    snprintf(s + n, cap - n, ", \"<|endoftext|>\": 265%s}", extra);
    return s;
}

const char *tg_test_write_quoted(const char *dir, const char *name, const char *text) {
    static char path[4][700];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 700, "%s/%s", dir, name);
    char *s = malloc(strlen(text) + 1);
    if (!s) abort();
    for (size_t i = 0;; i++) {
        s[i] = text[i] == '\'' ? '"' : text[i];
        if (!text[i]) break;
    }
    if (tg_test_write_file(p, s)) abort();
    free(s);
    return p;
}
