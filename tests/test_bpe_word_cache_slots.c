/* The byte-level BPE word cache (datasets/bpe.c) is an open-addressing table: every word
 * it holds is found from its hash's slot by probing, before an empty slot, the first word
 * (entry 0) included. Checked after each of many distinct words, over the cache's fills and
 * restarts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* The entry whose probe sequence from its hash reaches it; -1 when none is missing. */
static int32_t missing_entry(const tok_bpe *b) {
    for (int32_t e = 0; e < b->cache_n; e++) {
        uint32_t i = (uint32_t)b->cache[e].hash & b->cache_mask;
        while (b->cache_slots[i] >= 0 && b->cache_slots[i] != e) i = (i + 1) & b->cache_mask;
        if (b->cache_slots[i] != e) return e;
    }
    return -1;
}

TG_TEST(test_bpe_word_cache_finds_every_word) {
    const char *dir = tg_test_tmpdir();
    char vp[700], mp[700];
    snprintf(vp, sizeof vp, "%s/vocab.json", dir);
    snprintf(mp, sizeof mp, "%s/merges.txt", dir);
    char *vj = tg_test_bpe_vocab_json("");
    REQUIRE(vj && tg_test_write_file(vp, vj) == 0 && tg_test_write_file(mp, tg_test_bpe_merges) == 0, "fixture");
    free(vj);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_tokenizer_open(dir, &t, &err) == 0, "%s", err.msg);
    const tg_encode_options o = {.add_special_tokens = 0};
    int32_t bad = -1, bad_word = -1, restarts = 0, last_n = 0;
    for (int32_t k = 0; k < 40000 && bad < 0; k++) {
        char word[32];
        const int n = snprintf(word, sizeof word, " w%dx", k);
        tg_encoding e = {0};
        if (!CHECK(tg_tokenizer_encode(t, word, (size_t)n, NULL, 0, &o, &e, &err) == 0, "%s: %s", word, err.msg)) break;
        tg_encoding_free(&e);
        restarts += t->bpe.cache_n < last_n;
        last_n = t->bpe.cache_n;
        bad = missing_entry(&t->bpe);
        if (bad >= 0) bad_word = k;
    }
    CHECK(bad < 0, "after word %d: cached entry %d is not found from its slot", bad_word, bad);
    CHECK(restarts >= 2, "the cache restarted %d times", restarts);
    tg_tokenizer_free(t);
}
