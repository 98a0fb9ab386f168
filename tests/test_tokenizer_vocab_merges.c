/* The tokenizer's vocabulary map and merge table on their own and through the files that
 * fill them: duplicates (a later id wins, the id left behind maps to nothing), growth past
 * the first tables, vocab.txt's trimmed line ends and its line limit, merges.txt's, the
 * merge heap's stale entries (HF's result for the same merges, checked with
 * `tokenizers` 0.23), 676 merges, the merge cache's byte bound, and how a path is read
 * (a folder with a trailing slash, a tokenizer.json that is a folder, an unreadable file). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/tokenizer.h"
#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

static const char *write_in(const char *dir, const char *name, const char *text) {
    static char path[4][700];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 700, "%s/%s", dir, name);
    if (tg_test_write_file(p, text)) abort();
    return p;
}

static tg_tokenizer *open_ok(const char *path) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open %s: %s", path, err.msg);
    return t;
}

static void expect_open_error(const char *path, const char *want) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == -1 && t == NULL, "%s opened", path);
    CHECK(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
}

/* The ids of text, space-separated, and with offsets when offsets is set. */
static void expect_ids(tg_tokenizer *t, const char *text, int offsets, const char *want) {
    if (!t) return;
    tg_encoding e = {0};
    tg_err err = {{0}};
    const tg_encode_options o = {0, 0, 0};
    if (CHECK(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, &o, &e, &err) == 0, "encode '%.40s': %s", text, err.msg)) {
        char got[1024] = "";
        for (int32_t i = 0; i < e.n && strlen(got) < 990; i++) {
            if (offsets)
                snprintf(got + strlen(got), 40, "%s%d:%lld-%lld", i ? " " : "", e.ids[i], (long long)e.start[i],
                         (long long)e.end[i]);
            else snprintf(got + strlen(got), 16, "%s%d", i ? " " : "", e.ids[i]);
        }
        CHECK(!strcmp(got, want), "'%.40s': got '%s', want '%s'", text, got, want);
    }
    tg_encoding_free(&e);
}

TG_TEST(test_tokenizer_vocab_map) {
    tg_err err = {{0}};
    tok_vocab v = {0};
    /* empty: nothing found, no ids */
    CHECK(tok_vocab_get(&v, "a", 1) == -1, "empty vocabulary found 'a'");
    CHECK(tok_vocab_token(&v, 0, NULL) == NULL, "an id before the ids are indexed");
    CHECK(tok_vocab_index_ids(&v, &err) == 0 && v.n_ids == 0 && tok_vocab_token(&v, 0, NULL) == NULL, "empty index: %s",
          err.msg);
    /* a duplicate with a smaller id takes it; the id it left keeps no entry */
    REQUIRE(tok_vocab_put(&v, "a", 1, 5, &err) == 0 && tok_vocab_put(&v, "bb", 2, 2, &err) == 0 &&
                tok_vocab_put(&v, "a", 1, 1, &err) == 0,
            "put: %s", err.msg);
    CHECK(v.n == 2 && v.n_ids == 6 && v.max_len == 2, "%d entries, %d ids, longest %u", v.n, v.n_ids, v.max_len);
    CHECK(tok_vocab_get(&v, "a", 1) == 1 && tok_vocab_get(&v, "bb", 2) == 2 && tok_vocab_get(&v, "b", 1) == -1, "get");
    REQUIRE(tok_vocab_index_ids(&v, &err) == 0, "%s", err.msg);
    uint32_t len = 0;
    const char *s = tok_vocab_token(&v, 2, &len);
    CHECK(s && !strcmp(s, "bb") && len == 2, "id 2: '%s' (%u bytes)", s ? s : "(none)", len);
    CHECK(!tok_vocab_token(&v, 5, NULL) && !tok_vocab_token(&v, 0, NULL) && !tok_vocab_token(&v, -1, NULL) &&
              !tok_vocab_token(&v, 6, NULL) && !strcmp(tok_vocab_token(&v, 1, NULL), "a"),
          "ids 5, 0, -1, 6 have no entry; 1 is 'a'");
    /* 3,000 entries of 40 bytes: the hash, the entry table and the text all grow */
    char key[64];
    for (int i = 0; i < 3000; i++) {
        const int n = snprintf(key, sizeof key, "entry-%04d-abcdefghijklmnopqrstuvwxyz0123", i);
        if (!CHECK(tok_vocab_put(&v, key, (size_t)n, 10 + i, &err) == 0, "put %d: %s", i, err.msg)) break;
    }
    int wrong = 0;
    for (int i = 0; i < 3000; i++) {
        const int n = snprintf(key, sizeof key, "entry-%04d-abcdefghijklmnopqrstuvwxyz0123", i);
        wrong += tok_vocab_get(&v, key, (size_t)n) != 10 + i;
    }
    CHECK(wrong == 0 && v.n == 3002 && v.text_len > 65536 && tok_vocab_get(&v, "a", 1) == 1, "%d of 3,000 wrong", wrong);
    tok_vocab_free(&v);
    CHECK(v.n == 0 && !v.entries && !v.text, "freed");
}

TG_TEST(test_tokenizer_vocab_txt_lines) {
    const char *dir = tg_test_tmpdir();
    /* a line again: the later id; line ends trimmed of Unicode whitespace (U+2029, U+0085,
     * tab); a blank line is the empty token; no '\n' after the last line */
    const char *path = write_in(dir, "vocab.txt",
                                "[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello \t\nx\xe2\x80\xa9\ny\xc2\x85\n \n[UNK]\nworld");
    tg_tokenizer *t = open_ok(path);
    REQUIRE(t, "no tokenizer");
    CHECK(tg_tokenizer_token_id(t, "hello") == 4 && tg_tokenizer_token_id(t, "x") == 5 &&
              tg_tokenizer_token_id(t, "y") == 6 && tg_tokenizer_token_id(t, "") == 7 &&
              tg_tokenizer_token_id(t, "world") == 9,
          "trimmed lines' ids");
    CHECK(tg_tokenizer_token_id(t, "[UNK]") == 8 && tg_tokenizer_special_ids(t).unk == 8 && tg_tokenizer_vocab_size(t) == 10,
          "[UNK] is line 9: %d", tg_tokenizer_token_id(t, "[UNK]"));
    expect_ids(t, "hello x zz", 0, "4 5 8");
    tg_tokenizer_free(t);

    expect_open_error(write_in(dir, "nosep.txt", "[CLS]\nx\n"), "nosep.txt: no [CLS] or [SEP] in the vocabulary");

    /* tokenizer_config.json: lower-casing without accent stripping or CJK spacing */
    const char *hdir = tg_test_tmpdir();
    write_in(hdir, "vocab.txt", "[UNK]\n[CLS]\n[SEP]\ncaf\xc3\xa9\ncafe\nx\n\xe4\xb8\xad\n");
    write_in(hdir, "tokenizer_config.json",
             "{\"do_lower_case\": true, \"strip_accents\": false, \"tokenize_chinese_chars\": false, "
             "\"add_prefix_space\": null}");
    t = open_ok(hdir);
    expect_ids(t, "CAF\xc3\x89 x\xe4\xb8\xad x \xe4\xb8\xad", 0, "3 0 5 6");
    tg_tokenizer_free(t);
    write_in(hdir, "tokenizer_config.json", "{\"do_lower_case\": true, \"strip_accents\": true}");
    t = open_ok(hdir);
    expect_ids(t, "CAF\xc3\x89 x\xe4\xb8\xad", 0, "4 5 6");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_vocab_line_limits) {
    /* 4,194,305 lines: one past the ids the reader takes */
    const char *dir = tg_test_tmpdir();
    const size_t n = (1u << 22) + 1;
    char *lines = malloc(n + 32);
    REQUIRE(lines, "out of memory");
    memcpy(lines, "[CLS]\n[SEP]\n", 12);
    memset(lines + 12, '\n', n - 2);
    lines[n + 10] = 0;
    const char *path = write_in(dir, "vocab.txt", lines);
    expect_open_error(path, "vocab.txt: more than 4194304 lines");
    free(lines);
}

TG_TEST(test_tokenizer_merges_line_limit) {
    /* merges.txt of 4,194,305 merges ("a b" again and again) */
    const char *bdir = tg_test_tmpdir();
    write_in(bdir, "vocab.json", "{\"a\": 0, \"b\": 1, \"ab\": 2}");
    const size_t m = (1u << 22) + 1;
    char *merges = malloc(m * 4 + 1);
    REQUIRE(merges, "out of memory");
    for (size_t i = 0; i < m; i++) memcpy(merges + 4 * i, "a b\n", 4);
    merges[m * 4] = 0;
    write_in(bdir, "merges.txt", merges);
    free(merges);
    expect_open_error(bdir, "merges.txt: more than 4194304 merges");
}

TG_TEST(test_tokenizer_json_merges_limit) {
    /* tokenizer.json's model.merges of 4,194,305 merges ("a b" again and again) */
    static const char head[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [",
                      tail[] = "]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}";
    const size_t m = (1u << 22) + 1, each = sizeof "\"a b\"," - 1;
    char *json = malloc(sizeof head + m * each + sizeof tail);
    REQUIRE(json, "out of memory");
    memcpy(json, head, sizeof head - 1);
    char *at = json + sizeof head - 1;
    for (size_t i = 0; i < m; i++, at += each) memcpy(at, "\"a b\",", each);
    memcpy(at - 1, tail, sizeof tail); /* over the last comma */
    const char *path = write_in(tg_test_tmpdir(), "tokenizer.json", json);
    free(json);
    expect_open_error(path, "tokenizer.json: model.merges: more than 4194304 merges");
}

/* BPE in byte-level JSON: the vocabulary of letters a-d, with the merges given. */
static tg_tokenizer *letters_bpe(const char *merges) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"bc\": 4, \"cd\": 5, "
             "\"abc\": 6, \"ab\": 7}, \"merges\": %s}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", "
             "\"add_prefix_space\": false}}",
             merges);
    return open_ok(write_in(tg_test_tmpdir(), "tokenizer.json", json));
}

TG_TEST(test_tokenizer_merge_heap_stale_entries) {
    /* (b c) first, then (a bc), then (a b): in "abc" the a-b entry outlives its pair, as a
     * is merged to the end of the word; HF gives abc */
    tg_tokenizer *t = letters_bpe("[[\"b\", \"c\"], [\"a\", \"bc\"], [\"a\", \"b\"], [\"c\", \"d\"]]");
    expect_ids(t, "abc", 1, "6:0-3");
    expect_ids(t, "bcd", 1, "4:0-2 3:2-3");
    expect_ids(t, "abcd", 1, "6:0-3 3:3-4");
    expect_ids(t, "ab", 1, "7:0-2");
    tg_tokenizer_free(t);
    /* (c d) first: in "bcd" the b-c entry is stale (b cd is no merge) */
    t = letters_bpe("[[\"c\", \"d\"], [\"b\", \"c\"], [\"a\", \"bc\"], [\"a\", \"b\"]]");
    expect_ids(t, "abc", 1, "6:0-3");
    expect_ids(t, "bcd", 1, "1:0-1 5:1-3");
    expect_ids(t, "abcd", 1, "7:0-2 5:2-4");
    tg_tokenizer_free(t);
    /* (b c), (a b), (a bc): in "abc" the a-b entry pops while its pair is a-bc, whose merge
     * is another: stale, and abc comes of (a bc) */
    t = letters_bpe("[[\"b\", \"c\"], [\"a\", \"b\"], [\"a\", \"bc\"]]");
    expect_ids(t, "abc", 1, "6:0-3");
    expect_ids(t, "abcd", 1, "6:0-3 3:3-4");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_merge_table_growth) {
    /* every pair of letters merged, in order: 676 merges in a vocab.json + merges.txt
     * folder (merges.txt without a last '\n'); the ids HF gives for the same files */
    const char *dir = tg_test_tmpdir();
    char *vocab = malloc(16384), *merges = malloc(8192);
    REQUIRE(vocab && merges, "out of memory");
    size_t nv = (size_t)snprintf(vocab, 16384, "{"), nm = 0;
    for (int c = 0; c < 26; c++) nv += (size_t)snprintf(vocab + nv, 16384 - nv, "%s\"%c\": %d", c ? ", " : "", 'a' + c, c);
    for (int x = 0; x < 26; x++)
        for (int y = 0; y < 26; y++) {
            nv += (size_t)snprintf(vocab + nv, 16384 - nv, ", \"%c%c\": %d", 'a' + x, 'a' + y, 26 + 26 * x + y);
            nm += (size_t)snprintf(merges + nm, 8192 - nm, "%s%c %c", nm ? "\n" : "", 'a' + x, 'a' + y);
        }
    snprintf(vocab + nv, 16384 - nv, "}");
    write_in(dir, "vocab.json", vocab);
    write_in(dir, "merges.txt", merges);
    free(vocab);
    free(merges);
    tg_tokenizer *t = open_ok(dir);
    REQUIRE(t, "no tokenizer");
    CHECK(t->bpe.n_merges == 676 && t->bpe.merges_mask + 1 >= 2 * 676, "%d merges in %u slots", t->bpe.n_merges,
          t->bpe.merges_mask + 1);
    expect_ids(t, "hello", 0, "7 141 326");
    expect_ids(t, "zyzzyva", 0, "25 675 700 572");
    expect_ids(t, "abcdefghijklmnopqrstuvwxyz", 0, "27 81 135 189 243 297 351 405 459 513 567 621 675");
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_merge_cache_bytes) {
    /* 1,400 distinct words of 256 letters that no merge joins: each cached word takes
     * 256 + 256 x 12 bytes, so the 4 MiB arena fills (and is emptied) before the
     * 16,384-word bound; every word still gives its 256 letters */
    const char *dir = tg_test_tmpdir();
    char *v = tg_test_bpe_vocab_json("");
    write_in(dir, "vocab.json", v);
    free(v);
    write_in(dir, "merges.txt", tg_test_bpe_merges);
    tg_tokenizer *t = open_ok(dir);
    REQUIRE(t, "no tokenizer");
    static const char letters[] = "abcfgijkmnpqstuvxyz"; /* no h, e, l, o, r, d, w: nothing merges */
    char word[257];
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    tg_encoding e = {0};
    tg_err err = {{0}};
    int bad = 0, max_n = 0;
    for (int i = 0; i < 1400 && !bad; i++) {
        for (int k = 0; k < 256; k++) word[k] = letters[tg_test_rand(&rng) % 19];
        word[256] = 0;
        if (tg_tokenizer_encode(t, word, 256, NULL, 0, NULL, &e, &err)) {
            bad = CHECK(0, "word %d: %s", i, err.msg);
            break;
        }
        bad = !CHECK(e.n == 256 && e.ids[0] == (unsigned char)word[0] && e.ids[255] == (unsigned char)word[255] &&
                         e.start[255] == 255,
                     "word %d: %d tokens", i, e.n);
        if (t->bpe.cache_n > max_n) max_n = t->bpe.cache_n;
    }
    CHECK(t->bpe.cache_arena_len <= 4u << 20 && max_n < 1400 && max_n > 1000 && t->bpe.cache_n < max_n,
          "cache: %d words at most, %d now, %zu bytes", max_n, t->bpe.cache_n, t->bpe.cache_arena_len);
    /* a cached word again: the same tokens */
    CHECK(tg_tokenizer_encode(t, word, 256, NULL, 0, NULL, &e, &err) == 0 && e.n == 256 &&
              e.ids[0] == (unsigned char)word[0],
          "cached word: %s", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_paths) {
    /* a folder named with a trailing '/' holding tokenizer.json (with leading whitespace) */
    const char *dir = tg_test_tmpdir();
    write_in(dir, "tokenizer.json",
             " \t\r\n{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"[UNK]\": 0, \"hello\": 1}},"
             " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}");
    char slash[700];
    snprintf(slash, sizeof slash, "%s/", dir);
    tg_tokenizer *t = open_ok(slash);
    expect_ids(t, "hello hi", 0, "1 0");
    tg_tokenizer_free(t);

    /* a tokenizer.json that is a folder is passed over for the vocab.txt beside it */
    const char *wdir = tg_test_tmpdir();
    char sub[700];
    snprintf(sub, sizeof sub, "%s/tokenizer.json", wdir);
    REQUIRE(mkdir(sub, 0755) == 0, "mkdir %s", sub);
    write_in(wdir, "vocab.txt", "[UNK]\n[CLS]\n[SEP]\nhello\n");
    t = open_ok(wdir);
    if (t) CHECK(tg_tokenizer_family_of(t) == TG_TOKENIZER_WORDPIECE && tg_tokenizer_token_id(t, "hello") == 3, "vocab.txt");
    tg_tokenizer_free(t);

    /* a vocab.json opened as a file takes the merges.txt and settings beside it */
    const char *bdir = tg_test_tmpdir();
    char *v = tg_test_bpe_vocab_json("");
    const char *vj = write_in(bdir, "vocab.json", v);
    free(v);
    write_in(bdir, "merges.txt", tg_test_bpe_merges);
    t = open_ok(vj);
    expect_ids(t, "hello world", 0, "259 264");
    tg_tokenizer_free(t);
    write_in(bdir, "tokenizer_config.json", "{\"add_prefix_space\": 1}");
    expect_open_error(vj, "tokenizer_config.json: add_prefix_space is not true or false");

    /* a path without a folder: the working folder's settings */
    const char *rdir = tg_test_tmpdir();
    write_in(rdir, "vocab.txt", "[UNK]\n[CLS]\n[SEP]\nHello\n");
    write_in(rdir, "tokenizer_config.json", "{\"do_lower_case\": false}");
    char cwd[4096];
    REQUIRE(getcwd(cwd, sizeof cwd) && chdir(rdir) == 0, "chdir %s", rdir);
    t = open_ok("vocab.txt");
    REQUIRE(chdir(cwd) == 0, "chdir back to %s", cwd);
    expect_ids(t, "Hello hello", 0, "3 0");
    tg_tokenizer_free(t);

    /* a model without a vocabulary */
    expect_open_error(write_in(rdir, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"merges\": []}}"),
                      "tokenizer.json: model.vocab is not an object of token: id");

    /* a folder with vocab.json but no merges.txt */
    const char *jdir = tg_test_tmpdir();
    write_in(jdir, "vocab.json", "{\"a\": 0}");
    expect_open_error(jdir, "no tokenizer.json, vocab.txt, vocab.json + merges.txt or encoder.json + vocab.bpe");

    /* a file that opens but cannot be read */
    expect_open_error("/proc/self/mem", "/proc/self/mem: read failed");
}
