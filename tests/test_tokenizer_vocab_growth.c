/* The tokenizer's vocabulary map (datasets/tokenizer.c, tok_vocab_put) as it grows: the
 * hash slots from 1024, the entries from 1024 and the text from 64 KiB, each doubling
 * exactly when the next entry needs one more (1024 entries of 63 bytes and their NULs fill
 * the text to its last byte; an empty entry after them needs its NUL's byte), with the
 * allocations that takes counted; each of those allocations failing alone, with its
 * message and the map as before; an entry too long to hold. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"

static int put_entry(tok_vocab *v, int i, tg_err *err) {
    char key[64];
    snprintf(key, sizeof key, "%04d-%058d", i, i); /* 63 bytes */
    return tok_vocab_put(v, key, 63, 100 + i, err);
}

static int all_there(const tok_vocab *v, int n) {
    char key[64];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%04d-%058d", i, i);
        if (tok_vocab_get(v, key, 63) != 100 + i) return 0;
    }
    return 1;
}

/* 1024 entries: the text exactly full. */
static int fill(tok_vocab *v, tg_err *err) {
    memset(v, 0, sizeof *v);
    for (int i = 0; i < 1024; i++)
        if (put_entry(v, i, err)) return -1;
    return 0;
}

TG_TEST(test_tokenizer_vocab_growth_exact) {
    tok_vocab v;
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    memset(&v, 0, sizeof v);
    REQUIRE(put_entry(&v, 0, &err) == 0, "%s", err.msg);
    long made = tg_alloc_fail_after(-1);
    CHECK(made == 3 && v.mask == 1023 && v.cap == 1024 && v.text_cap == 65536 && v.text_len == 64 && v.n == 1 &&
              v.n_ids == 101 && v.max_len == 63,
          "first entry: %ld allocations, %u slots, %d entries, %zu of %zu text bytes", made, v.mask + 1, v.cap,
          v.text_len, v.text_cap);
    for (int i = 1; i < 1024; i++)
        if (!CHECK(put_entry(&v, i, &err) == 0, "entry %d: %s", i, err.msg)) break;
    made = tg_alloc_fail_after(-1);
    /* the slots doubled once, at the 513th entry (more than half full) */
    CHECK(made == 1 && v.mask == 2047 && v.cap == 1024 && v.text_cap == 65536 && v.text_len == 65536 && v.n == 1024,
          "1024 entries: %ld allocations, %u slots, %d entries, %zu of %zu text bytes", made, v.mask + 1, v.cap,
          v.text_len, v.text_cap);
    /* the empty entry: its NUL needs byte 65537; 1025 entries need twice the table and slots */
    CHECK(tok_vocab_put(&v, "", 0, 7, &err) == 0, "%s", err.msg);
    made = tg_alloc_fail_after(-1);
    CHECK(made == 3 && v.mask == 4095 && v.cap == 2048 && v.text_cap == 131072 && v.text_len == 65537 && v.n == 1025,
          "1025 entries: %ld allocations, %u slots, %d entries, %zu of %zu text bytes", made, v.mask + 1, v.cap,
          v.text_len, v.text_cap);
    CHECK(all_there(&v, 1024) && tok_vocab_get(&v, "", 0) == 7 && v.text[65536] == 0 && v.text[65535] == 0 &&
              v.text[65534] == '3',
          "entries lost");
    /* a duplicate takes no room; a smaller text grows nothing */
    CHECK(tok_vocab_put(&v, "", 0, 8, &err) == 0 && tok_vocab_put(&v, "x", 1, 9, &err) == 0, "%s", err.msg);
    made = tg_alloc_fail_after(-1);
    CHECK(made == 0 && v.n == 1026 && v.text_len == 65539 && tok_vocab_get(&v, "", 0) == 8 && v.n_ids == 1124,
          "%ld allocations, %d entries, %zu text bytes", made, v.n, v.text_len);
    REQUIRE(tok_vocab_index_ids(&v, &err) == 0, "%s", err.msg);
    uint32_t len = 99;
    const char *s = tok_vocab_token(&v, 1123, &len);
    CHECK(s && len == 63 && !strncmp(s, "1023-", 5) && !strcmp(tok_vocab_token(&v, 8, &len), "") && len == 0 &&
              !tok_vocab_token(&v, 7, NULL),
          "ids back to text");
    tok_vocab_free(&v);
    CHECK(!v.text && !v.entries && !v.slots && !v.by_id && v.text_cap == 0 && v.n == 0, "freed");
}

/* The 1025th entry's three allocations (slots, entries, text), each failing alone. */
TG_TEST(test_tokenizer_vocab_growth_each_failing) {
    static const char *const want[3] = {"out of memory for a vocabulary of 1024 entries",
                                        "out of memory for a vocabulary of 1024 entries",
                                        "out of memory for the vocabulary text"};
    for (long k = 0; k < 3; k++) {
        tok_vocab v;
        tg_err err = {{0}};
        REQUIRE(fill(&v, &err) == 0, "%s", err.msg);
        tg_alloc_fail_only(k);
        const int rc = tok_vocab_put(&v, "", 0, 7, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && !strcmp(err.msg, want[k]), "allocation %ld: rc %d '%s'", k, rc, err.msg);
        CHECK(v.n == 1024 && v.text_len == 65536 && tok_vocab_get(&v, "", 0) == -1 && all_there(&v, 1024),
              "allocation %ld: the map changed", k);
        CHECK(v.text_cap == 65536 || k < 2, "allocation %ld: text %zu", k, v.text_cap);
        CHECK(tok_vocab_put(&v, "", 0, 7, &err) == 0 && tok_vocab_get(&v, "", 0) == 7 && v.text_cap == 131072 &&
                  v.cap == 2048 && v.mask == 4095,
              "allocation %ld, again: %s", k, err.msg);
        tok_vocab_free(&v);
    }
    tok_vocab v = {0};
    tg_err err = {{0}};
    CHECK(tok_vocab_put(&v, "x", (size_t)UINT32_MAX / 2 + 1, 0, &err) == -1 &&
              !strcmp(err.msg, "a vocabulary entry of 2147483648 bytes") && v.n == 0 && !v.text,
          "'%s'", err.msg);
    tok_vocab_free(&v);
}
