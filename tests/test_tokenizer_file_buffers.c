/* Buffers of datasets/tokenizer.c at their limits: read_file grows its buffer (1 MiB, then
 * doubling) while fewer than 65536 + 1 bytes are free, so a vocab.txt of 1 MiB - 65536 bytes
 * takes one reallocation more than one a byte shorter, and the same count again at the next
 * step (2 MiB - 65536); the vocabulary map rehashes past 512 entries; and a token list
 * refuses to grow past INT32_MAX / 2 tokens, with its count in the message. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "datasets/tokenizer.h"
#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"

#define WORDS 600

/* vocab.txt of exactly `size` bytes: [PAD], [UNK], [CLS], [SEP], w0 .. w599, one a line, then "tail"
 * and spaces (the loader trims them) up to the size, with no newline at the end. */
static const char *write_vocab(const char *dir, size_t size) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *f = fopen(path, "wb");
    if (!CHECK(f != NULL, "cannot write %s", path)) return NULL;
    size_t n = (size_t)fprintf(f, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
    for (int i = 0; i < WORDS; i++) n += (size_t)fprintf(f, "w%d\n", i);
    n += (size_t)fprintf(f, "tail");
    for (; n < size; n++) fputc(' ', f);
    CHECK(fclose(f) == 0, "closing %s", path);
    return path;
}

/* Opens a folder holding a vocab.txt of `size` bytes (read once; a file path is read twice,
 * once to tell JSON from vocab.txt); returns the allocations the open made, or -1. */
static long open_counting(const char *dir, size_t size) {
    const char *path = write_vocab(dir, size);
    if (!path) return -1;
    tg_tokenizer *tok = NULL;
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    const int rc = tg_tokenizer_open(dir, &tok, &err);
    const long made = tg_alloc_made();
    if (!CHECK(rc == 0, "%zu-byte vocab.txt: %s", size, err.msg)) return -1;
    CHECK(tg_tokenizer_vocab_size(tok) == WORDS + 5, "%zu bytes: %d entries", size, tg_tokenizer_vocab_size(tok));
    CHECK(tg_tokenizer_token_id(tok, "tail") == WORDS + 4, "%zu bytes: 'tail' is %d", size, tg_tokenizer_token_id(tok, "tail"));
    CHECK(tg_tokenizer_token_id(tok, "w599") == WORDS + 3, "%zu bytes: 'w599' is %d", size, tg_tokenizer_token_id(tok, "w599"));
    CHECK(tg_tokenizer_token_id(tok, "w0") == 4, "%zu bytes: 'w0' is %d", size, tg_tokenizer_token_id(tok, "w0"));
    tg_tokenizer_free(tok);
    return made;
}

TG_TEST(test_tokenizer_read_file_grows_below_65537_free_bytes) {
    const char *dir = tg_test_tmpdir();
    const size_t mib = (size_t)1 << 20;
    const long below = open_counting(dir, mib - 65536 - 1);
    const long at = open_counting(dir, mib - 65536);
    const long above = open_counting(dir, mib - 65536 + 1);
    const long full = open_counting(dir, mib - 1);
    CHECK(below > 0 && at == below + 1 && above == at && full == at,
          "allocations opening 1 MiB - 65537, - 65536, - 65535, - 1 bytes: %ld %ld %ld %ld", below, at, above, full);
    const long below2 = open_counting(dir, 2 * mib - 65536 - 1);
    const long at2 = open_counting(dir, 2 * mib - 65536);
    CHECK(below2 == at && at2 == below2 + 1, "allocations opening 2 MiB - 65537 and - 65536 bytes: %ld %ld (1 MiB: %ld)",
          below2, at2, at);
}

TG_TEST(test_tokenizer_token_list_refuses_past_half_int32) {
    tok_list l = {0};
    tg_err err = {{0}};
    CHECK(tok_list_reserve(&l, (int64_t)INT32_MAX / 2 + 1, &err) == -1, "2^30 tokens were reserved");
    CHECK(strcmp(err.msg, "more than 1073741823 tokens in one text") == 0, "message: %s", err.msg);
    CHECK(l.ids == NULL && l.cap == 0 && l.n == 0, "a refused list changed: cap %d", l.cap);
    /* counted with the tokens already there: a list of 1000 (room for 1024) refuses what
     * would take it one past the limit, and takes what fits its room without allocating */
    REQUIRE(tok_list_reserve(&l, 1000, &err) == 0, "%s", err.msg);
    for (int32_t i = 0; i < 1000; i++) tok_list_push(&l, i, i, i + 1, 0);
    tg_err err2 = {{0}};
    CHECK(tok_list_reserve(&l, (int64_t)INT32_MAX / 2 - 1000 + 1, &err2) == -1, "the limit counts the tokens in the list");
    CHECK(strcmp(err2.msg, "more than 1073741823 tokens in one text") == 0, "message: %s", err2.msg);
    tg_alloc_fail_after(0);
    const int fits = tok_list_reserve(&l, l.cap - l.n, &err);
    tg_alloc_fail_after(-1);
    CHECK(fits == 0 && l.cap == 1024 && l.n == 1000, "reserving the room left: rc %d, cap %d", fits, l.cap);
    CHECK(l.ids[999] == 999 && l.start[999] == 999 && l.end[999] == 1000, "the tokens in the list changed");
    tok_list_free(&l);
}

/* Descriptors open in this process (the first 1024). */
static int open_descriptors(void) {
    int n = 0;
    char path[64], target[8];
    for (int fd = 0; fd < 1024; fd++) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        n += readlink(path, target, sizeof target) >= 0;
    }
    return n;
}

/* Reading a tokenizer's files leaves no descriptor open: a vocab.txt folder, a file read
 * twice (to tell JSON from vocab.txt), and a refused one. */
TG_TEST(test_tokenizer_read_file_closes_its_descriptors) {
    const char *dir = tg_test_tmpdir();
    const char *path = write_vocab(dir, 4096);
    REQUIRE(path, "vocab");
    const int before = open_descriptors();
    REQUIRE(before > 0, "/proc/self/fd");
    for (int k = 0; k < 3; k++) {
        tg_tokenizer *tok = NULL;
        tg_err err = {{0}};
        const int rc = tg_tokenizer_open(k == 1 ? path : k == 0 ? dir : "/nonexistent/tokenizer.json", &tok, &err);
        CHECK(k == 2 ? rc == -1 : rc == 0, "open %d: %s", k, err.msg);
        if (tok) tg_tokenizer_free(tok);
    }
    CHECK(open_descriptors() == before, "%d descriptors open after the reads, %d before", open_descriptors(), before);
}
