/* base/json_strict.c names a repeated key in the caller's buffer: cut to the buffer's
 * size, and never a byte past it, however small the buffer is. */
#include <jansson.h>
#include <string.h>

#include "base/json_strict.h"
#include "tests/harness.h"

TG_TEST(test_base_json_strict_repeated_key_stays_in_its_buffer) {
    static const char text[] = "{\"abcdef\": 1, \"abcdef\": 2}";
    /* cap: the bytes the call may write; past them the buffer holds '#', which must stay. */
    const struct {
        size_t cap;
        const char *key;
    } cases[] = {{1, ""}, {2, "a"}, {3, "ab"}, {6, "abcde"}, {7, "abcdef"}, {8, "abcdef"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[16];
        memset(buf, '#', sizeof buf);
        json_error_t jerr;
        json_t *root = tg_json_loadb_strict(text, strlen(text), 0, &jerr, buf, cases[i].cap);
        CHECK(!root && json_error_code(&jerr) == json_error_duplicate_key, "cap %zu: refused as a repeated key (%s)",
              cases[i].cap, jerr.text);
        CHECK(!strcmp(buf, cases[i].key), "cap %zu: key '%s', want '%s'", cases[i].cap, buf, cases[i].key);
        size_t untouched = 0;
        for (size_t b = cases[i].cap; b < sizeof buf; b++) untouched += buf[b] == '#';
        CHECK(untouched == sizeof buf - cases[i].cap, "cap %zu: %zu bytes past the buffer written", cases[i].cap,
              sizeof buf - cases[i].cap - untouched);
        json_decref(root);
    }
}
