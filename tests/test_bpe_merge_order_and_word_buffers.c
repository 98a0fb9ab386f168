/* Byte-level BPE words (datasets/bpe.c) against a plain reference: random merge tables
 * over the letters a-h and random words, where the merge heap must give the lowest rank
 * first and the leftmost among equal ranks, every token's bytes included; the word cache
 * serving a word seen before (one entry, however often it comes); and each of the six
 * arrays a longer word grows failing alone: "out of memory for a word of N bytes" and the
 * next encode as it would have been. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/tokenizer.h"
#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"

#define MAX_TOKENS 96
#define MAX_MERGES 80
#define TOKEN_MAX 10

typedef struct table {
    char token[MAX_TOKENS][TOKEN_MAX + 1]; /* id -> text */
    int n_tokens;
    int left[MAX_MERGES], right[MAX_MERGES], made[MAX_MERGES]; /* rank -> ids */
    int n_merges;
} table;

static int token_id(const table *tb, const char *s, size_t n) {
    for (int i = 0; i < tb->n_tokens; i++)
        if (strlen(tb->token[i]) == n && !memcmp(tb->token[i], s, n)) return i;
    return -1;
}

/* Letters a-h, then merges of two random tokens whose joined text is new (so each merge
 * makes its own token). */
static void random_table(table *tb, uint64_t *rng) {
    memset(tb, 0, sizeof *tb);
    for (int c = 0; c < 8; c++) tb->token[c][0] = (char)('a' + c);
    tb->n_tokens = 8;
    for (int tries = 0; tries < 2000 && tb->n_merges < MAX_MERGES && tb->n_tokens < MAX_TOKENS; tries++) {
        const int x = (int)(tg_test_rand(rng) % (uint64_t)tb->n_tokens), y = (int)(tg_test_rand(rng) % (uint64_t)tb->n_tokens);
        const size_t lx = strlen(tb->token[x]), ly = strlen(tb->token[y]);
        if (lx + ly > TOKEN_MAX) continue;
        char z[2 * TOKEN_MAX + 1];
        memcpy(z, tb->token[x], lx), memcpy(z + lx, tb->token[y], ly), z[lx + ly] = 0;
        if (token_id(tb, z, lx + ly) >= 0) continue;
        memcpy(tb->token[tb->n_tokens], z, lx + ly + 1);
        tb->left[tb->n_merges] = x, tb->right[tb->n_merges] = y, tb->made[tb->n_merges] = tb->n_tokens;
        tb->n_tokens++, tb->n_merges++;
    }
}

static tg_tokenizer *open_table(const table *tb, int n) {
    char *json = malloc(16384);
    if (!json) return NULL;
    int k = snprintf(json, 16384, "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
    for (int i = 0; i < tb->n_tokens; i++) k += snprintf(json + k, 16384 - (size_t)k, "%s\"%s\": %d", i ? ", " : "", tb->token[i], i);
    k += snprintf(json + k, 16384 - (size_t)k, "}, \"merges\": [");
    for (int r = 0; r < tb->n_merges; r++)
        k += snprintf(json + k, 16384 - (size_t)k, "%s\"%s %s\"", r ? ", " : "", tb->token[tb->left[r]], tb->token[tb->right[r]]);
    snprintf(json + k, 16384 - (size_t)k, "]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false}}");
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer-%d.json", tg_test_tmpdir(), n);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    if (tg_test_write_file(path, json) == 0) CHECK(tg_tokenizer_open(path, &t, &err) == 0, "table %d: %s", n, err.msg);
    free(json);
    return t;
}

/* The reference: merge the adjacent pair of lowest rank, the leftmost of equals, until
 * no pair is a merge. Fills ids and byte spans; returns the count. */
static int reference_bpe(const table *tb, const char *w, int n, int *ids, int *start, int *end) {
    int m = n;
    for (int i = 0; i < n; i++) ids[i] = w[i] - 'a', start[i] = i, end[i] = i + 1;
    for (;;) {
        int best = -1, best_rank = MAX_MERGES;
        for (int i = 0; i + 1 < m; i++)
            for (int r = 0; r < best_rank && r < tb->n_merges; r++)
                if (tb->left[r] == ids[i] && tb->right[r] == ids[i + 1]) best = i, best_rank = r;
        if (best < 0) return m;
        ids[best] = tb->made[best_rank];
        end[best] = end[best + 1];
        memmove(ids + best + 1, ids + best + 2, sizeof *ids * (size_t)(m - best - 2));
        memmove(start + best + 1, start + best + 2, sizeof *start * (size_t)(m - best - 2));
        memmove(end + best + 1, end + best + 2, sizeof *end * (size_t)(m - best - 2));
        m--;
    }
}

TG_TEST(test_bpe_merge_order_matches_reference) {
    uint64_t rng = 0x5eed0b9e;
    int bad = 0, words = 0, merged = 0;
    for (int n = 0; n < 12 && bad < 5; n++) {
        table tb;
        random_table(&tb, &rng);
        tg_tokenizer *t = open_table(&tb, n);
        if (!t) break;
        for (int k = 0; k < 120 && bad < 5; k++) {
            /* half the words are runs of tokens (so long merges apply), half random letters */
            char w[64];
            int len = 0;
            const int target = 2 + (int)(tg_test_rand(&rng) % 40);
            while (len < target) {
                const char *piece = k % 2 ? tb.token[tg_test_rand(&rng) % (uint64_t)tb.n_tokens]
                                          : tb.token[tg_test_rand(&rng) % 8];
                const int pl = (int)strlen(piece);
                if (len + pl > 60) break;
                memcpy(w + len, piece, (size_t)pl), len += pl;
            }
            w[len] = 0;
            int ids[64], start[64], end[64];
            const int m = reference_bpe(&tb, w, len, ids, start, end);
            merged += m < len;
            tg_encoding e = {0};
            tg_err err = {{0}};
            const tg_encode_options o = {0, 0, 0};
            if (!CHECK(tg_tokenizer_encode(t, w, (size_t)len, NULL, 0, &o, &e, &err) == 0, "'%s': %s", w, err.msg)) {
                bad++;
                continue;
            }
            int same = e.n == m;
            for (int i = 0; same && i < m; i++) same = e.ids[i] == ids[i] && e.start[i] == start[i] && e.end[i] == end[i];
            if (!same) {
                char got[512] = "", want[512] = "";
                for (int i = 0, g = 0; i < e.n && g < 480; i++)
                    g += snprintf(got + g, sizeof got - (size_t)g, " %d:%lld-%lld", e.ids[i], (long long)e.start[i],
                                  (long long)e.end[i]);
                for (int i = 0, g = 0; i < m && g < 480; i++) g += snprintf(want + g, sizeof want - (size_t)g, " %d:%d-%d", ids[i], start[i], end[i]);
                bad += !CHECK(0, "table %d, word '%s': got%s, want%s", n, w, got, want);
            }
            words++;
            tg_encoding_free(&e);
        }
        tg_tokenizer_free(t);
    }
    CHECK(words == 12 * 120 && merged > words / 2, "%d words compared, %d of them merged", words, merged);
}

/* The tokenizer of letters a-h, no merges. */
static tg_tokenizer *letters(void) {
    table tb;
    memset(&tb, 0, sizeof tb);
    for (int c = 0; c < 8; c++) tb.token[c][0] = (char)('a' + c);
    tb.n_tokens = 8;
    return open_table(&tb, 100);
}

static int encode_letters(tg_tokenizer *t, const char *w, tg_err *err) {
    tg_encoding e = {0};
    const tg_encode_options o = {0, 0, 0};
    int rc = tg_tokenizer_encode(t, w, strlen(w), NULL, 0, &o, &e, err);
    if (!rc) {
        const size_t n = strlen(w);
        rc = e.n == (int32_t)n ? 0 : -2;
        for (size_t i = 0; !rc && i < n; i++) rc = e.ids[i] == w[i] - 'a' && e.start[i] == (int64_t)i && e.end[i] == (int64_t)i + 1 ? 0 : -2;
    }
    tg_encoding_free(&e);
    return rc;
}

/* A word seen before is served from the cache: however often it comes it takes one entry,
 * and another word a second. */
TG_TEST(test_bpe_word_cache_serves_a_word_again) {
    tg_tokenizer *t = letters();
    REQUIRE(t, "no tokenizer");
    tg_err err = {{0}};
    CHECK(t->bpe.cache_n == 0, "%d cached before any word", t->bpe.cache_n);
    for (int i = 0; i < 5; i++) {
        CHECK(encode_letters(t, "abcabc", &err) == 0, "try %d: %s", i, err.msg);
        CHECK(t->bpe.cache_n == 1, "try %d: %d words cached", i, t->bpe.cache_n);
    }
    const size_t arena = t->bpe.cache_arena_len;
    CHECK(encode_letters(t, "hgf", &err) == 0 && t->bpe.cache_n == 2 && t->bpe.cache_arena_len > arena, "another: %d",
          t->bpe.cache_n);
    for (int i = 0; i < 3; i++)
        CHECK(encode_letters(t, "abcabc", &err) == 0 && encode_letters(t, "hgf", &err) == 0 && t->bpe.cache_n == 2,
              "both again: %d", t->bpe.cache_n);
    tg_tokenizer_free(t);
}

/* A word of 300 letters after a short one: the six symbol arrays grow from 256 to 512,
 * each failing alone in turn. */
TG_TEST(test_bpe_word_buffers_each_failing_alone) {
    char w[301];
    for (int i = 0; i < 300; i++) w[i] = (char)('a' + (i * 7 + i / 8) % 8);
    w[300] = 0;
    tg_err err = {{0}};
    tg_tokenizer *t = letters();
    REQUIRE(t, "no tokenizer");
    REQUIRE(encode_letters(t, "abc", &err) == 0 && t->bpe.sym_cap == 256, "%s (cap %lld)", err.msg, (long long)t->bpe.sym_cap);
    tg_alloc_fail_after(-1);
    REQUIRE(encode_letters(t, w, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    CHECK(t->bpe.sym_cap == 512, "cap %lld", (long long)t->bpe.sym_cap);
    tg_tokenizer_free(t);
    int word_failures = 0, first = -1;
    for (long k = 0; k < total; k++) {
        t = letters();
        if (!t) break;
        memset(&err, 0, sizeof err);
        REQUIRE(encode_letters(t, "abc", &err) == 0, "%s", err.msg);
        tg_alloc_fail_only(k);
        const int rc = encode_letters(t, w, &err);
        tg_alloc_fail_after(-1);
        if (rc == -1 && !strcmp(err.msg, "out of memory for a word of 301 bytes")) {
            word_failures++;
            if (first < 0) first = (int)k;
            CHECK(t->bpe.sym_cap == 256 && k == first + word_failures - 1, "allocation %ld: cap %lld", k,
                  (long long)t->bpe.sym_cap);
        } else {
            CHECK(rc == 0 || (rc == -1 && strstr(err.msg, "out of memory")), "allocation %ld: rc %d '%s'", k, rc, err.msg);
        }
        /* then, with memory, the word as it is */
        CHECK(encode_letters(t, w, &err) == 0 && t->bpe.sym_cap == 512, "allocation %ld, again: %s", k, err.msg);
        CHECK(encode_letters(t, "hgfedcba", &err) == 0, "allocation %ld, a short word: %s", k, err.msg);
        tg_tokenizer_free(t);
    }
    CHECK(word_failures == 6, "%d of %ld allocations refused the word's arrays", word_failures, total);
}
