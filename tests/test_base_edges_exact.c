/* base/ helpers at their edges: a zero-size allocation is a block of one usable byte
 * (realloc to 0 included, which libc would free), tg_alloc_fail_after after a
 * tg_alloc_fail_only fails every later allocation again, tg_read_text_file takes a file of
 * exactly `max` bytes and reads one under 16 KiB in one allocation, and a repeated JSON
 * key shows each control character (0x01 to 0x1f) as '?'. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json_strict.h"
#include "base/text_file.h"
#include "tests/harness.h"

TG_TEST(test_base_zero_size_blocks_hold_a_byte) {
    tg_alloc_fail_after(-1);
    const long failed = tg_alloc_failures();
    char *p[6] = {tg_malloc(0), tg_calloc(0, 4), tg_calloc(4, 0), tg_realloc(NULL, 0), NULL, tg_aligned_alloc(32, 0)};
    char *grown = tg_malloc(16);
    REQUIRE(grown, "malloc");
    p[4] = tg_realloc(grown, 0); /* a block still, never freed into NULL */
    for (int i = 0; i < 6; i++) {
        CHECK(p[i] != NULL, "block %d is NULL", i);
        if (!p[i]) continue;
        if (i == 1 || i == 2) CHECK(p[i][0] == 0, "calloc block %d not zeroed", i);
        p[i][0] = (char)(0x41 + i); /* the one byte is the caller's (the sanitizer build checks) */
        CHECK(p[i][0] == 0x41 + i, "block %d", i);
    }
    CHECK(((uintptr_t)p[5] & 31) == 0, "aligned block at %p", (void *)p[5]);
    for (int i = 0; i < 6; i++) free(p[i]);
    CHECK(tg_alloc_failures() == failed, "%ld failures counted for zero sizes", tg_alloc_failures() - failed);
}

TG_TEST(test_base_fail_after_follows_fail_only) {
    tg_alloc_fail_only(0);
    void *first = tg_malloc(4);
    void *second = tg_malloc(4);
    CHECK(!first && second, "fail_only(0): %p %p", first, second);
    free(second);
    /* Armed again at 1: one succeeds, then every later one fails, not just the next. */
    tg_alloc_fail_after(1);
    void *a = tg_malloc(4), *b = tg_malloc(4), *c = tg_malloc(4), *d = tg_calloc(1, 1);
    const long made = tg_alloc_fail_after(-1);
    CHECK(a && !b && !c && !d && made == 4, "fail_after(1) after fail_only: %p %p %p %p, %ld made", a, b, c, d, made);
    free(a), free(b), free(c), free(d);
    /* And disarmed: all succeed. */
    void *e = tg_malloc(4), *f = tg_malloc(4);
    CHECK(e && f, "disarmed: %p %p", e, f);
    free(e), free(f);
}

/* Writes `n` bytes of 'a'..'z' to dir/name; the path into path. */
static int write_bytes(const char *name, size_t n, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", tg_test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (size_t i = 0; i < n; i++) fputc('a' + (int)(i % 26), f);
    return fclose(f);
}

TG_TEST(test_base_text_file_sizes_exact) {
    char path[800];
    tg_err err = {{0}};
    char *text = NULL;
    size_t len = 0;
    /* Exactly max bytes, max a buffer size (16384, then doubled): taken; one more refused. */
    static const size_t maxes[] = {16384, 32768};
    for (int i = 0; i < 2; i++) {
        REQUIRE(write_bytes("exact", maxes[i], path, sizeof path) == 0, "write");
        text = NULL;
        CHECK(tg_read_text_file(path, maxes[i], "a config", &text, &len, &err) == 0 && len == maxes[i] && text &&
                  text[len] == 0 && text[len - 1] == 'a' + (int)((len - 1) % 26),
              "%zu bytes of max %zu: %s", maxes[i], maxes[i], err.msg);
        free(text);
        REQUIRE(write_bytes("over", maxes[i] + 1, path, sizeof path) == 0, "write");
        char want[900];
        snprintf(want, sizeof want, "%s: more than %zu bytes: too big for a config", path, maxes[i]);
        CHECK(tg_read_text_file(path, maxes[i], "a config", &text, &len, &err) == -1 && !strcmp(err.msg, want),
              "%zu bytes of max %zu: '%s'", maxes[i] + 1, maxes[i], err.msg);
    }
    /* Under 16 KiB: one buffer; 16 KiB exactly: a second (to see the end). */
    static const struct {
        size_t bytes;
        long allocations;
    } sizes[] = {{0, 1}, {100, 1}, {16383, 1}, {16384, 2}, {16385, 2}, {32768, 3}};
    for (int i = 0; i < 6; i++) {
        REQUIRE(write_bytes("sized", sizes[i].bytes, path, sizeof path) == 0, "write");
        tg_alloc_fail_after(-1);
        text = NULL;
        const int rc = tg_read_text_file(path, 1 << 20, "x", &text, &len, &err);
        const long made = tg_alloc_fail_after(-1);
        CHECK(rc == 0 && len == sizes[i].bytes && made == sizes[i].allocations, "%zu bytes: rc %d, %ld allocations, want %ld",
              sizes[i].bytes, rc, made, sizes[i].allocations);
        free(text);
    }
}

TG_TEST(test_base_json_repeated_key_control_characters) {
    for (int ch = 1; ch <= 0x20; ch++) {
        char text[64], key[16] = "junk", want[8];
        snprintf(text, sizeof text, "{\"k\\u%04x\": 1, \"k\\u%04x\": 2}", ch, ch);
        snprintf(want, sizeof want, "k%c", ch < 0x20 ? '?' : ' ');
        json_error_t jerr;
        json_t *root = tg_json_loadb_strict(text, strlen(text), 0, &jerr, key, sizeof key);
        CHECK(!root && !strcmp(key, want), "character 0x%02x: key '%s', want '%s'", ch, key, want);
        json_decref(root);
    }
}
