/* The small helpers of base/: error messages (base/error.c), the allocation hook and its
 * counters (base/alloc.c), whole-file reads with a bound (base/text_file.c) and JSON with
 * repeated keys refused and named (base/json_strict.c). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/json_strict.h"
#include "base/text_file.h"
#include "tests/harness.h"

TG_TEST(test_base_error_messages) {
    tg_err err = {{0}};
    CHECK(tg_fail(&err, "%s: key '%s': %d", "job.txt", "batch", 7) == -1 && !strcmp(err.msg, "job.txt: key 'batch': 7"),
          "'%s'", err.msg);
    CHECK(tg_fail_context(&err, "line %d", 3) == -1 && !strcmp(err.msg, "line 3: job.txt: key 'batch': 7"), "'%s'",
          err.msg);
    CHECK(tg_fail(NULL, "nothing %d", 1) == -1 && tg_fail_context(NULL, "nowhere") == -1, "NULL err");
    /* A message longer than the buffer is cut, terminated. */
    char big[2000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = 0;
    tg_fail(&err, "%s", big);
    CHECK(strlen(err.msg) == sizeof err.msg - 1, "cut to %zu bytes", strlen(err.msg));
}

TG_TEST(test_base_alloc_hook) {
    tg_alloc_fail_after(-1);
    const long failed = tg_alloc_failures();
    /* Zero bytes still give a block to free. */
    void *p[6] = {tg_malloc(0), tg_calloc(0, 0), tg_realloc(NULL, 0), tg_aligned_alloc(64, 0), tg_strndup("abc", 2),
                  tg_strdup("")};
    CHECK(p[0] && p[1] && p[2] && p[3] && p[4] && p[5], "a zero-size allocation failed");
    CHECK(((uintptr_t)p[3] & 63) == 0 && !strcmp(p[4], "ab") && !strcmp(p[5], ""), "aligned or strings wrong");
    for (int i = 0; i < 6; i++) free(p[i]);
    char *s = NULL;
    CHECK(tg_asprintf(&s, "%d-%s", 4, "x") == 3 && s && !strcmp(s, "4-x"), "asprintf: %s", s ? s : "(null)");
    free(s);
    CHECK(tg_alloc_failures() == failed, "failures counted without any");
    /* Armed at 2: two succeed, every one after fails (each kind), and each is counted. */
    tg_alloc_fail_after(2);
    void *a = tg_malloc(8), *b = tg_calloc(2, 4);
    void *c = tg_malloc(8), *d = tg_calloc(1, 1), *e = tg_realloc(NULL, 8), *f = tg_aligned_alloc(64, 64);
    char *g = tg_strdup("x"), *h = tg_strndup("xy", 1);
    s = (char *)"unset";
    const int n = tg_asprintf(&s, "%d", 1);
    const long made = tg_alloc_made();
    const long since = tg_alloc_fail_after(-1);
    CHECK(a && b, "the first two failed");
    CHECK(!c && !d && !e && !f && !g && !h && n == -1 && s == NULL, "an allocation past the limit succeeded");
    CHECK(tg_alloc_failures() == failed + 7, "%ld failures counted, want 7", tg_alloc_failures() - failed);
    CHECK(made == 9 && since == 9, "%ld allocations made (%ld returned), want 9", made, since);
    CHECK(tg_alloc_made() == 0, "the count restarts at the next arming");
    free(a), free(b);
    /* realloc keeps the old block when it fails. */
    char *keep = tg_malloc(4);
    REQUIRE(keep, "alloc");
    memcpy(keep, "abc", 4);
    tg_alloc_fail_after(0);
    char *grown = tg_realloc(keep, 1 << 20);
    tg_alloc_fail_after(-1);
    CHECK(grown == NULL && !strcmp(keep, "abc"), "a failed realloc changed the block");
    free(keep);
}

TG_TEST(test_base_text_file_reads) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    tg_err err = {{0}};
    char *text = NULL;
    size_t len = 99;
    snprintf(path, sizeof path, "%s/empty", dir);
    REQUIRE(tg_test_write_file(path, "") == 0, "write");
    CHECK(tg_read_text_file(path, 100, "a config", &text, &len, &err) == 0 && text && text[0] == 0 && len == 0,
          "empty file: %s", err.msg);
    free(text);
    /* Exactly max bytes are read; one more is refused. */
    snprintf(path, sizeof path, "%s/ten", dir);
    REQUIRE(tg_test_write_file(path, "0123456789") == 0, "write");
    CHECK(tg_read_text_file(path, 10, "a config", &text, &len, &err) == 0 && len == 10 && !strcmp(text, "0123456789"),
          "10 of at most 10: %s", err.msg);
    free(text);
    char want[900];
    snprintf(want, sizeof want, "%s: more than 9 bytes: too big for a config", path);
    CHECK(tg_read_text_file(path, 9, "a config", &text, &len, &err) == -1 && strstr(err.msg, want), "10 of 9: %s",
          err.msg);
    /* A file past the first 16 KiB read, grown by doubling, and one read endlessly. */
    static char big[40000];
    memset(big, 'q', sizeof big - 1);
    snprintf(path, sizeof path, "%s/big", dir);
    REQUIRE(tg_test_write_file(path, big) == 0, "write");
    CHECK(tg_read_text_file(path, 1 << 20, "a config", &text, &len, &err) == 0 && len == sizeof big - 1 &&
              text[len] == 0 && text[len - 1] == 'q',
          "40 KB: %s", err.msg);
    free(text);
    CHECK(tg_read_text_file("/dev/zero", 50000, "an index", &text, &len, &err) == -1 &&
              strstr(err.msg, "/dev/zero: more than 50000 bytes: too big for an index"),
          "/dev/zero: %s", err.msg);
    snprintf(want, sizeof want, "%s/none: cannot open: No such file or directory", dir);
    snprintf(path, sizeof path, "%s/none", dir);
    CHECK(tg_read_text_file(path, 10, "x", &text, &len, &err) == -1 && strstr(err.msg, want), "missing: %s", err.msg);
    snprintf(want, sizeof want, "%s: cannot read: Is a directory", dir);
    CHECK(tg_read_text_file(dir, 10, "x", &text, &len, &err) == -1 && strstr(err.msg, want), "a folder: %s", err.msg);
    /* Out of memory for the buffer, and for the empty file's byte. */
    snprintf(path, sizeof path, "%s/ten", dir);
    tg_alloc_fail_after(0);
    int rc = tg_read_text_file(path, 100, "x", &text, &len, &err);
    tg_alloc_fail_after(-1);
    snprintf(want, sizeof want, "%s: out of memory", path);
    CHECK(rc == -1 && strstr(err.msg, want), "no memory: %s", err.msg);
    snprintf(path, sizeof path, "%s/empty", dir);
    /* An empty file too: the buffer is allocated before the file is known to be empty. */
    tg_alloc_fail_after(0);
    rc = tg_read_text_file(path, 100, "x", &text, &len, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && strstr(err.msg, ": out of memory"), "empty, no memory: %s", err.msg);
}

TG_TEST(test_base_json_repeated_keys) {
    const struct {
        const char *text;
        const char *key; /* the repeated key as named, or NULL: parsed */
    } cases[] = {
        {"{\"a\": 1, \"b\": 2}", NULL},
        {"{\"a\": 1, \"a\": 2}", "a"},
        {"{\"x\": {\"deep\": 1, \"deep\": 2}}", "deep"},
        {"{\"q\\\"uote\": 1, \"q\\\"uote\": 2}", "q\"uote"},
        {"{\"back\\\\\": 1, \"back\\\\\": 2}", "back\\"},
        {"{\"tab\\there\": 1, \"tab\\there\": 2}", "tab?here"},
        {"{\"del\x7f\": 1, \"del\x7f\": 2}", "del?"},
        {"{\"\\u00e9t\\u00e9\": 1, \"\\u00e9t\\u00e9\": 2}", "\xc3\xa9t\xc3\xa9"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_error_t jerr;
        char key[64] = "junk";
        json_t *root = tg_json_loadb_strict(cases[i].text, strlen(cases[i].text), 0, &jerr, key, sizeof key);
        if (!cases[i].key) {
            CHECK(root && key[0] == 0, "case %zu refused: %s", i, jerr.text);
        } else {
            CHECK(!root && json_error_code(&jerr) == json_error_duplicate_key && !strcmp(key, cases[i].key),
                  "case %zu: key '%s', want '%s' (%s)", i, key, cases[i].key, jerr.text);
        }
        json_decref(root);
    }
    /* Other errors name no key. */
    json_error_t jerr;
    char key[64] = "junk";
    CHECK(!tg_json_loadb_strict("{\"a\": }", 7, 0, &jerr, key, sizeof key) && key[0] == 0, "syntax: key '%s'", key);
    /* Out of memory while parsing is said so. */
    int oom = 0;
    for (long k = 0; k < 6; k++) {
        tg_alloc_fail_after(k);
        json_t *root = tg_json_loadb("{\"a\": [1, 2, {\"b\": \"c\"}]}", 25, 0, &jerr);
        tg_alloc_fail_after(-1);
        if (root) {
            json_decref(root);
            break;
        }
        oom++;
        CHECK(json_error_code(&jerr) == json_error_out_of_memory && !strcmp(jerr.text, "out of memory"),
              "allocation %ld: '%s'", k, jerr.text);
    }
    CHECK(oom > 0, "no allocation failed");
    /* Files too: missing, and out of memory. */
    CHECK(!tg_json_load_file("/nonexistent/x.json", 0, &jerr) && json_error_code(&jerr) != json_error_out_of_memory,
          "a missing file read as out of memory");
    char path[800];
    snprintf(path, sizeof path, "%s/x.json", tg_test_tmpdir());
    REQUIRE(tg_test_write_file(path, "{\"k\": [1, 2, 3]}") == 0, "write");
    tg_alloc_fail_after(0);
    json_t *root = tg_json_load_file(path, 0, &jerr);
    tg_alloc_fail_after(-1);
    CHECK(!root && json_error_code(&jerr) == json_error_out_of_memory, "file, no memory: '%s'", jerr.text);
    root = tg_json_load_file(path, 0, &jerr);
    CHECK(root && json_array_size(json_object_get(root, "k")) == 3, "file: %s", jerr.text);
    json_decref(root);
}
