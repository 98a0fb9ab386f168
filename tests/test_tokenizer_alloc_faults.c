/* Every heap allocation of opening a tokenizer and encoding with it failed in turn
 * (base/alloc.h's tg_alloc_fail_after): each failure must end in -1 and a message that says
 * "out of memory" and what for, never a crash or a success with a wrong encoding. The
 * files and texts are chosen so that every buffer grows: tokenizer.json and a folder's
 * settings files, vocabularies past their first table and text block, added tokens,
 * merges with long tokens, texts of thousands of bytes and long runs of combining marks,
 * words longer than the merge cache takes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

typedef struct attempt {
    const char *path;         /* what to open */
    const char *text, *pair;  /* what to encode then */
    const char *want;         /* the ids it must give, space-separated (a prefix when long) */
} attempt;

static int run_attempt(const attempt *a, tg_err *err, char *ids, size_t cap) {
    tg_tokenizer *t = NULL;
    if (tg_tokenizer_open(a->path, &t, err)) return -1;
    tg_encoding e = {0};
    const tg_encode_options o = {1, 0, 0};
    int rc = tg_tokenizer_encode(t, a->text, strlen(a->text), a->pair, a->pair ? strlen(a->pair) : 0, &o, &e, err);
    /* a second text, once the buffers have grown: they grow again */
    if (!rc) rc = tg_tokenizer_encode(t, a->text, strlen(a->text), a->text, strlen(a->text), &o, &e, err);
    if (!rc) {
        size_t n = 0;
        ids[0] = 0;
        for (int32_t i = 0; i < e.n && n + 16 < cap; i++) n += (size_t)snprintf(ids + n, cap - n, "%s%d", i ? " " : "", e.ids[i]);
    }
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
    return rc;
}

/* Counts the allocations of a successful attempt, then fails each in turn. */
static void fail_each(const char *what, const attempt *a) {
    static char ids[1 << 16];
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    const int ok = run_attempt(a, &err, ids, sizeof ids);
    const long total = tg_alloc_fail_after(-1);
    if (!CHECK(ok == 0, "%s: %s", what, err.msg)) return;
    CHECK(!strncmp(ids, a->want, strlen(a->want)), "%s: ids '%.200s', want '%.200s'", what, ids, a->want);
    int bad = 0;
    for (long k = 0; k < total && bad < 5; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = run_attempt(a, &err, ids, sizeof ids);
        tg_alloc_fail_after(-1);
        const int clean = rc == -1 && strstr(err.msg, "out of memory") && strlen(err.msg) > strlen("out of memory") + 4;
        bad += !clean;
        CHECK(clean, "%s: allocation %ld of %ld failing: rc %d, '%s'", what, k, total, rc, rc ? err.msg : "");
    }
    printf("  %s: %ld allocations failed in turn\n", what, total);
}

static const char *write_in(const char *dir, const char *name, const char *text) {
    static char path[8][700];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 700, "%s/%s", dir, name);
    if (tg_test_write_file(p, text)) abort();
    return p;
}

/* A growing string. */
typedef struct str {
    char *s;
    size_t n, cap;
} str;

static void put(str *b, const char *fmt, const char *arg) {
    const int n = snprintf(NULL, 0, fmt, arg);
    if (b->n + (size_t)n + 1 > b->cap) {
        b->cap = (b->n + (size_t)n + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) abort();
    }
    snprintf(b->s + b->n, (size_t)n + 1, fmt, arg);
    b->n += (size_t)n;
}

TG_TEST(test_tokenizer_alloc_faults_wordpiece_json) {
    /* 40 entries, one of them 600 bytes; 20 added tokens (past the first 16), normalized
     * and not */
    str j = {0};
    put(&j, "%s", "{\"model\": {\"type\": \"WordPiece\", \"max_input_chars_per_word\": 1000, \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, "
                  "\"[SEP]\": 3, \"a\": 4, \"##a\": 5, \"b\": 6, \"##");
    for (int i = 0; i < 598; i++) put(&j, "%s", "a");
    put(&j, "%s", "\": 7, \"##aa\": 8");
    char word[32];
    for (int i = 9; i < 40; i++) {
        snprintf(word, sizeof word, "w%d\": %d", i, i);
        put(&j, ", \"%s", word);
    }
    put(&j, "%s", "}}, \"normalizer\": {\"type\": \"BertNormalizer\"}, \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
                  " \"added_tokens\": [");
    for (int i = 0; i < 20; i++) {
        snprintf(word, sizeof word, "%d", 40 + i);
        put(&j, "{\"id\": %s, ", word);
        snprintf(word, sizeof word, "<t%d>", i);
        put(&j, "\"content\": \"%s\", ", word);
        put(&j, "\"normalized\": %s}", i % 2 ? "true" : "false");
        if (i < 19) put(&j, "%s", ", ");
    }
    put(&j, "%s", "], \"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", 2], \"sep\": [\"[SEP]\", 3]}}");
    const char *dir = tg_test_tmpdir();
    const char *path = write_in(dir, "tokenizer.json", j.s);
    free(j.s);

    /* the text: 300 x <t2> (more tokens than the first 256, all added), a word of b + 100
     * a's, one of b + 600 a's, <t1> (normalized) and <t2> inside words, 70 combining marks
     * after an x; the pair 300 x <t1> (found after normalizing), 2,000 CJK characters (the
     * spaces around them outgrow the normalized text's first buffer) and 3,000 words "w9" */
    str t = {0};
    for (int i = 0; i < 300; i++) put(&t, "%s", "<t2>");
    put(&t, "%s", "b");
    for (int i = 0; i < 100; i++) put(&t, "%s", "a");
    put(&t, "%s", " b");
    for (int i = 0; i < 600; i++) put(&t, "%s", "a");
    put(&t, "%s", " a<T1>a a<t2>a x");
    for (int i = 0; i < 70; i++) put(&t, "%s", "\xcc\x81");
    str p = {0};
    for (int i = 0; i < 300; i++) put(&p, "%s", "<t1>");
    for (int i = 0; i < 2000; i++) put(&p, "%s", "\xe4\xb8\xad");
    for (int i = 0; i < 3000; i++) put(&p, "%s", " w9");
    /* (the ids of the text as its own pair) [CLS] 300 x <t2>, b + 50 x ##aa, b ##a{598}
     * ##aa, a <t1> a, a <t2> a, x + marks unknown */
    str want = {0};
    put(&want, "%s", "2");
    for (int i = 0; i < 300; i++) put(&want, "%s", " 42");
    put(&want, "%s", " 6");
    for (int i = 0; i < 50; i++) put(&want, "%s", " 8");
    put(&want, "%s", " 6 7 8 4 41 4 4 42 4 1 3 42");
    const attempt a = {path, t.s, p.s, want.s};
    fail_each("WordPiece tokenizer.json", &a);
    free(t.s);
    free(p.s);
    free(want.s);
}

TG_TEST(test_tokenizer_alloc_faults_bpe_json) {
    /* byte-level BPE: 256 byte tokens, a 600-byte token merged from two of 300 (a merge over
     * the 512 bytes the stack holds), prefix space, ignore_merges, and added
     * tokens normalized and not */
    char *v = tg_test_bpe_vocab_json("");
    str j = {0};
    put(&j, "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": %s", v);
    free(v);
    j.n--; /* reopen the vocabulary object */
    char a300[301], a600[601];
    memset(a300, 'q', 300), a300[300] = 0;
    memset(a600, 'q', 600), a600[600] = 0;
    put(&j, ", \"%s\": 300", a300);
    put(&j, ", \"%s\": 301}, \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\"", a600);
    put(&j, ", \"%s ", a300);
    put(&j, "%s\"]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true},", a300);
    put(&j, "%s", " \"added_tokens\": [{\"id\": 265, \"content\": \"<|endoftext|>\", \"special\": true},"
                  " {\"id\": 302, \"content\": \"<n>\", \"special\": false, \"normalized\": true}]}");
    const char *dir = tg_test_tmpdir();
    const char *path = write_in(dir, "tokenizer.json", j.s);
    free(j.s);
    /* 300 x <n> (more tokens than the first 256, all added), hello after the prefix space (Ġ hello: no merge makes Ġhello), a 600-byte word of no merges (over the cache's 256 and
     * the 256 symbols first reserved), the added tokens */
    str t = {0};
    for (int i = 0; i < 300; i++) put(&t, "%s", "<n>");
    put(&t, "%s", "hello<n>x<|endoftext|>");
    for (int i = 0; i < 600; i++) put(&t, "%s", "z");
    const attempt a = {path, t.s, "hello", "302 302 302"};
    fail_each("BPE tokenizer.json", &a);
    free(t.s);
}

TG_TEST(test_tokenizer_alloc_faults_no_normalizer) {
    /* WordPiece without a normalizer: the text copied as it is */
    const char *dir = tg_test_tmpdir();
    const char *path = write_in(dir, "tokenizer.json",
                                "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"[UNK]\": 0, \"Hello\": 1, \"\xc3\xa9\": 2}},"
                                " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"}}");
    const attempt a = {path, "Hello \xc3\xa9 hello", NULL, "1 2 0 1 2 0"};
    fail_each("WordPiece without a normalizer", &a);
}

TG_TEST(test_tokenizer_alloc_faults_folders) {
    /* RoBERTa from a vocab.json + merges.txt folder with both settings files */
    const char *dir = tg_test_tmpdir();
    char *v = tg_test_bpe_vocab_json(", \"<s>\": 266, \"</s>\": 267, \"<pad>\": 268, \"<unk>\": 269, \"<mask>\": 270");
    write_in(dir, "vocab.json", v);
    free(v);
    write_in(dir, "merges.txt", tg_test_bpe_merges);
    write_in(dir, "tokenizer_config.json", "{\"tokenizer_class\": \"RobertaTokenizer\", \"add_prefix_space\": false}");
    write_in(dir, "config.json", "{\"model_type\": \"roberta\"}");
    const attempt r = {dir, "hello <mask> world", "hello", "266 259 270 264 267 267 259 270 264 267"};
    fail_each("RoBERTa folder", &r);

    /* a vocab.txt of 3,000 lines (over 65,536 bytes of entries) with tokenizer_config.json */
    const char *wdir = tg_test_tmpdir();
    str s = {0};
    put(&s, "%s", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
    char line[64];
    for (int i = 4; i < 3000; i++) {
        snprintf(line, sizeof line, "token%04d%s\n", i, "abcdefghijklmnopqrstuvwxyz");
        put(&s, "%s", line);
    }
    write_in(wdir, "vocab.txt", s.s);
    free(s.s);
    write_in(wdir, "tokenizer_config.json", "{\"do_lower_case\": false}");
    const attempt w = {wdir, "token2999abcdefghijklmnopqrstuvwxyz", NULL, "2 2999 3"};
    fail_each("vocab.txt folder", &w);
}

/* A vocab.txt past 1 MiB: the file's buffer grows past its first 1 MiB while it is read.
 * Each of the first allocations of opening it fails alone: the reads' own (the file is
 * read twice, to tell its kind and to load it: each time its first buffer, then the larger
 * one, which must not lose the first: the sanitizer build's leak check sees it) say
 * "PATH: out of memory". */
TG_TEST(test_tokenizer_alloc_faults_vocab_past_one_mib) {
    const char *dir = tg_test_tmpdir();
    str s = {0};
    put(&s, "%s", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
    char line[96];
    for (int i = 4; i < 20000; i++) {
        snprintf(line, sizeof line, "token%05d%s\n", i, "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz");
        put(&s, "%s", line);
    }
    REQUIRE(s.n > (1u << 20), "the file is %zu bytes", s.n);
    const char *path = write_in(dir, "vocab.txt", s.s);
    free(s.s);
    const attempt a = {path, "token19999abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz token00004", NULL,
                       "2 19999 1 3 19999 1 3"};
    static char ids[256];
    tg_err err = {{0}};
    REQUIRE(run_attempt(&a, &err, ids, sizeof ids) == 0, "%s", err.msg);
    CHECK(!strcmp(ids, a.want), "ids '%s', want '%s'", ids, a.want);
    char want[800];
    snprintf(want, sizeof want, "%s: out of memory", path);
    int reads = 0;
    for (long k = 0; k < 8; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = run_attempt(&a, &err, ids, sizeof ids);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory"), "allocation %ld failing: rc %d, '%s'", k, rc, err.msg);
        reads += rc == -1 && !strcmp(err.msg, want);
    }
    CHECK(reads == 4, "%d of the first 8 allocations failing stop a read, want 4", reads);
}

TG_TEST(test_tokenizer_alloc_faults_llama) {
    /* Llama 3's shape: a Split pattern taken into PCRE2's syntax (\s, \S and a class
     * growing as they are spelled out), its template, and a tokenizer_config.json beside
     * naming the bos, eos and pad tokens */
    char *v = tg_test_bpe_vocab_json(", \"12\": 266");
    str j = {0};
    put(&j, "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": %s, \"merges\": [\"h e\", \"1 2\"]},", v);
    free(v);
    put(&j, "%s",
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\":"
        " \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+"
        "[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", \"invert\": false},"
        " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
        " \"added_tokens\": [{\"id\": 300, \"content\": \"<|begin_of_text|>\", \"special\": true},"
        " {\"id\": 301, \"content\": \"<|end_of_text|>\", \"special\": true}],"
        " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\","
        " \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": {\"id\":"
        " \"<|begin_of_text|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\":"
        " \"<|begin_of_text|>\", \"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], \"special_tokens\":"
        " {\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": [300]}}}}");
    const char *dir = tg_test_tmpdir();
    write_in(dir, "tokenizer.json", j.s);
    free(j.s);
    write_in(dir, "tokenizer_config.json",
             "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": {\"content\": \"<|end_of_text|>\"}, \"pad_token\":"
             " \"<|end_of_text|>\", \"added_tokens_decoder\": {\"300\": {\"content\": \"<|begin_of_text|>\"}}}");
    /* " " apart from the number, which goes in threes: 12 (merged) 3, then 4 5 */
    const attempt a = {dir, "hello 12345\n\n  x<|end_of_text|>it's", "hello",
                       "300 259 32 266 51 52 53 10 10 32 32 120 301 105 116 39 115 300"};
    fail_each("Llama folder", &a);

    /* a Split pattern that leaves text between its matches: the words before and after
     * a match outgrow the first buffers */
    j = (str){0};
    v = tg_test_bpe_vocab_json("");
    put(&j, "{\"model\": {\"type\": \"BPE\", \"vocab\": %s, \"merges\": []}, \"pre_tokenizer\": {\"type\":", v);
    free(v);
    put(&j, "%s",
        " \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"x\"}, \"behavior\":"
        " \"Isolated\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}}");
    const char *gaps = tg_test_tmpdir();
    const char *path = write_in(gaps, "tokenizer.json", j.s);
    free(j.s);
    str t = {0};
    for (int i = 0; i < 300; i++) put(&t, "%s", "a");
    put(&t, "%s", "x");
    for (int i = 0; i < 600; i++) put(&t, "%s", "b");
    const attempt g = {path, t.s, NULL, "97 97 97"};
    fail_each("Split pattern with text between matches", &g);
    free(t.s);
}
