/* datasets/text_rows.c, the store every text reader fills: rows whose texts, pairs and
 * labels live NUL-terminated in one arena, the source file names, where-strings
 * ("file:line", "file" for line 0, "input" for an unknown source), tg_text_fields_add's
 * checks (text and pair UTF-8, skippable; label empty, holding NUL, not UTF-8) with
 * their exact messages, growth past the first 1024 rows and 65536 bytes, and each of its
 * allocations failing (base/alloc.h's tg_alloc_fail_only): a failed one leaves the rows
 * as they were and says what it was for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/text_rows.h"
#include "tests/harness.h"

static int row_is(const tg_text_rows *r, int64_t i, const char *text, const char *pair, const char *label,
                  int32_t source, int64_t line) {
    if (i >= r->n) return 0;
    const tg_text_row *w = &r->rows[i];
    if (w->source != source || w->line != line) return 0;
    if (w->text_len != (int64_t)strlen(text) || strcmp(tg_text_rows_at(r, w->text), text)) return 0;
    if (pair ? w->pair < 0 || w->pair_len != (int64_t)strlen(pair) || strcmp(tg_text_rows_at(r, w->pair), pair)
             : w->pair != -1 || w->pair_len != 0)
        return 0;
    if (label ? w->label < 0 || w->label_len != (int64_t)strlen(label) || strcmp(tg_text_rows_at(r, w->label), label)
              : w->label != -1 || w->label_len != 0)
        return 0;
    return 1;
}

TG_TEST(test_datasets_text_rows_store_arena_and_where) {
    tg_text_rows r = {0};
    tg_err err = {{0}};
    int32_t a = -1, b = -1;
    REQUIRE(tg_text_rows_source(&r, "a.csv", &a, &err) == 0 && tg_text_rows_source(&r, "b.jsonl", &b, &err) == 0,
            "%s", err.msg);
    CHECK(a == 0 && b == 1 && r.n_sources == 2 && !strcmp(r.sources[0], "a.csv") && !strcmp(r.sources[1], "b.jsonl"),
          "sources %d %d", a, b);
    /* lengths, not NUL, end each piece: "xyz" of length 2 is "xy" */
    REQUIRE(tg_text_rows_add(&r, a, 2, "xyz", 2, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
    REQUIRE(tg_text_rows_add(&r, b, 7, "hello", 5, "world", 5, "pos", 3, &err) == 0, "%s", err.msg);
    REQUIRE(tg_text_rows_add(&r, b, 0, "", 0, "", 0, "n", 1, &err) == 0, "%s", err.msg);
    CHECK(r.n == 3 && r.cap == 1024, "n %lld cap %lld", (long long)r.n, (long long)r.cap);
    CHECK(row_is(&r, 0, "xy", NULL, NULL, 0, 2), "row 0");
    CHECK(row_is(&r, 1, "hello", "world", "pos", 1, 7), "row 1");
    CHECK(row_is(&r, 2, "", "", "n", 1, 0), "row 2");
    /* the arena: xy\0 hello\0 world\0 pos\0 \0 \0 n\0 */
    CHECK(r.n_bytes == 3 + 6 + 6 + 4 + 1 + 1 + 2 && r.cap_bytes == 65536, "arena %lld of %lld", (long long)r.n_bytes,
          (long long)r.cap_bytes);
    CHECK(r.rows[0].text == 0 && r.rows[1].text == 3 && r.rows[1].pair == 9 && r.rows[1].label == 15 &&
              r.rows[2].text == 19 && r.rows[2].pair == 20 && r.rows[2].label == 21,
          "offsets");
    char where[64];
    tg_text_rows_where(&r, &r.rows[0], where, sizeof where);
    CHECK(!strcmp(where, "a.csv:2"), "where '%s'", where);
    tg_text_rows_where(&r, &r.rows[2], where, sizeof where);
    CHECK(!strcmp(where, "b.jsonl"), "line 0: '%s'", where);
    const tg_text_row unknown = {.source = 2, .line = 5}, negative = {.source = -1, .line = 0};
    tg_text_rows_where(&r, &unknown, where, sizeof where);
    CHECK(!strcmp(where, "input:5"), "unknown source: '%s'", where);
    tg_text_rows_where(&r, &negative, where, sizeof where);
    CHECK(!strcmp(where, "input"), "no source: '%s'", where);
    tg_text_rows_where(&r, &r.rows[1], where, 6);
    CHECK(!strcmp(where, "b.jso"), "cut short: '%s'", where);
    tg_text_rows_free(&r);
    CHECK(!r.rows && !r.bytes && !r.sources && r.n == 0 && r.cap == 0 && r.n_bytes == 0 && r.n_sources == 0,
          "free clears");
}

TG_TEST(test_datasets_text_rows_store_growth) {
    tg_text_rows r = {0};
    tg_err err = {{0}};
    int32_t s = -1;
    /* 40 sources: their table grows past its first block */
    char name[32];
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "f%d.txt", i);
        REQUIRE(tg_text_rows_source(&r, name, &s, &err) == 0 && s == i, "source %d: %s", i, err.msg);
    }
    CHECK(!strcmp(r.sources[39], "f39.txt") && !strcmp(r.sources[0], "f0.txt"), "sources kept");
    /* 3000 rows of 100 bytes: rows past 1024 and 2048, bytes past 65536 and 131072 */
    char text[101];
    for (int64_t i = 0; i < 3000; i++) {
        memset(text, 'a' + (int)(i % 26), 100);
        snprintf(text, sizeof text, "%06lld", (long long)i);
        text[6] = '-';
        REQUIRE(tg_text_rows_add(&r, (int32_t)(i % 40), i + 1, text, 100, NULL, 0, NULL, 0, &err) == 0, "row %lld: %s",
                (long long)i, err.msg);
    }
    CHECK(r.n == 3000 && r.cap == 4096, "n %lld cap %lld", (long long)r.n, (long long)r.cap);
    CHECK(r.n_bytes == 3000 * 101 && r.cap_bytes == 524288, "bytes %lld cap %lld", (long long)r.n_bytes,
          (long long)r.cap_bytes);
    int bad = 0;
    for (int64_t i = 0; i < 3000 && bad < 3; i++) {
        const tg_text_row *w = &r.rows[i];
        const char *t = tg_text_rows_at(&r, w->text);
        char head[8];
        snprintf(head, sizeof head, "%06lld", (long long)i);
        const int ok = w->text == i * 101 && w->text_len == 100 && !memcmp(t, head, 6) && t[6] == '-' &&
                       t[99] == 'a' + (int)(i % 26) && t[100] == 0 && w->source == (int32_t)(i % 40) && w->line == i + 1;
        bad += !CHECK(ok, "row %lld", (long long)i);
    }
    /* one text larger than the arena doubles to fit */
    char *big = malloc(300000);
    REQUIRE(big, "malloc");
    memset(big, 'z', 300000);
    REQUIRE(tg_text_rows_add(&r, 0, 0, big, 300000, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(r.cap_bytes == 1048576 && r.rows[3000].text == 3000 * 101 && tg_text_rows_at(&r, r.rows[3000].text)[299999] == 'z',
          "big: cap %lld", (long long)r.cap_bytes);
    free(big);
    tg_text_rows_free(&r);
}

/* The arena's edges: a text that fills it to the last byte (its NUL included) stays in
 * 65536 bytes; the next piece, empty, needs one byte more and doubles it; a source name
 * holding '%' is printed as it is, with a line and without. */
TG_TEST(test_datasets_text_rows_store_exact_fit_and_percent_names) {
    tg_text_rows r = {0};
    tg_err err = {{0}};
    char *text = malloc(65535);
    REQUIRE(text, "malloc");
    memset(text, 'q', 65535);
    int32_t s = -1;
    REQUIRE(tg_text_rows_source(&r, "100%s-%d%%.csv", &s, &err) == 0 && s == 0, "%s", err.msg);
    REQUIRE(tg_text_rows_add(&r, s, 0, text, 65535, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(r.n_bytes == 65536 && r.cap_bytes == 65536, "full arena: %lld of %lld", (long long)r.n_bytes,
          (long long)r.cap_bytes);
    REQUIRE(tg_text_rows_add(&r, s, 3, "", 0, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(r.n_bytes == 65537 && r.cap_bytes == 131072 && r.rows[1].text == 65536 && r.bytes[65536] == 0 &&
              r.bytes[65534] == 'q' && r.bytes[65535] == 0,
          "one byte more: %lld of %lld", (long long)r.n_bytes, (long long)r.cap_bytes);
    /* 131072 - 65537 = 65535 bytes left: a text of 65534 fills it exactly, one of 1 more doubles */
    REQUIRE(tg_text_rows_add(&r, s, 4, text, 65534, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(r.n_bytes == 131072 && r.cap_bytes == 131072, "full again: %lld of %lld", (long long)r.n_bytes,
          (long long)r.cap_bytes);
    REQUIRE(tg_text_rows_add(&r, s, 5, "x", 1, "", 0, "L", 1, &err) == 0, "%s", err.msg);
    CHECK(r.n_bytes == 131072 + 2 + 1 + 2 && r.cap_bytes == 262144 && !strcmp(tg_text_rows_at(&r, r.rows[3].label), "L"),
          "doubled again: %lld of %lld", (long long)r.n_bytes, (long long)r.cap_bytes);
    char where[64];
    tg_text_rows_where(&r, &r.rows[0], where, sizeof where);
    CHECK(!strcmp(where, "100%s-%d%%.csv"), "line 0: '%s'", where);
    tg_text_rows_where(&r, &r.rows[1], where, sizeof where);
    CHECK(!strcmp(where, "100%s-%d%%.csv:3"), "line 3: '%s'", where);
    tg_text_rows_where(&r, &r.rows[0], where, 5);
    CHECK(!strcmp(where, "100%"), "cut short: '%s'", where);
    free(text);
    tg_text_rows_free(&r);
}

/* Each allocation of adding a source and then a row failing in turn: -1, the message,
 * and the rows as before; the next try succeeds. */
TG_TEST(test_datasets_text_rows_store_out_of_memory) {
    static const char *const want[] = {
        "out of memory adding input file in.csv",  /* the sources table */
        "out of memory adding input file in.csv",  /* the name's copy */
        "out of memory for 1024 rows",             /* the rows table */
        "out of memory for 65536 bytes of text",   /* the arena, for the text */
    };
    for (long k = 0; k < 4; k++) {
        tg_text_rows r = {0};
        tg_err err = {{0}};
        int32_t s = -1;
        tg_alloc_fail_only(k);
        int rc = tg_text_rows_source(&r, "in.csv", &s, &err);
        if (!rc) rc = tg_text_rows_add(&r, s, 1, "text", 4, NULL, 0, NULL, 0, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && !strcmp(err.msg, want[k]), "allocation %ld: rc %d, '%s', want '%s'", k, rc, err.msg, want[k]);
        CHECK(r.n == 0, "allocation %ld: %lld rows", k, (long long)r.n);
        if (k >= 2) CHECK(r.n_sources == 1 && s == 0, "allocation %ld: the source stays", k);
        if (k == 2) CHECK(!r.rows && r.cap == 0 && !r.bytes, "the failed rows table is not taken");
        if (k == 3) CHECK(r.rows && r.cap == 1024 && !r.bytes && r.cap_bytes == 0 && r.n_bytes == 0,
                          "the failed arena is not taken");
        if (k < 2) CHECK(r.n_sources == 0, "allocation %ld: %d sources", k, r.n_sources);
        /* the shortage passed: the same calls succeed */
        memset(&err, 0, sizeof err);
        rc = k < 2 ? tg_text_rows_source(&r, "in.csv", &s, &err) : 0;
        if (!rc) rc = tg_text_rows_add(&r, s, 1, "text", 4, NULL, 0, NULL, 0, &err);
        CHECK(rc == 0 && r.n == 1 && row_is(&r, 0, "text", NULL, NULL, 0, 1), "allocation %ld: retry: %s", k, err.msg);
        tg_text_rows_free(&r);
    }
    /* a pair and a label each put into the arena, which grows for them */
    tg_text_rows r = {0};
    tg_err err = {{0}};
    int32_t s = -1;
    REQUIRE(tg_text_rows_source(&r, "in.csv", &s, &err) == 0 && tg_text_rows_add(&r, s, 1, "x", 1, NULL, 0, NULL, 0, &err) == 0,
            "%s", err.msg);
    char *big = malloc(70000);
    REQUIRE(big, "malloc");
    memset(big, 'p', 70000);
    tg_alloc_fail_only(0);
    int rc = tg_text_rows_add(&r, s, 2, "t", 1, big, 70000, "l", 1, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, "out of memory for 131072 bytes of text") && r.n == 1 && r.cap_bytes == 65536,
          "pair: rc %d '%s'", rc, err.msg);
    tg_text_rows_free(&r);
    REQUIRE(tg_text_rows_source(&r, "in.csv", &s, &err) == 0 && tg_text_rows_add(&r, s, 1, "x", 1, NULL, 0, NULL, 0, &err) == 0,
            "%s", err.msg);
    tg_alloc_fail_only(0);
    rc = tg_text_rows_add(&r, s, 2, "t", 1, "p", 1, big, 70000, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, "out of memory for 131072 bytes of text") && r.n == 1, "label: rc %d '%s'", rc,
          err.msg);
    free(big);
    tg_text_rows_free(&r);
}

TG_TEST(test_datasets_text_rows_store_fields_checks) {
    tg_text_rows r = {0};
    tg_err err = {{0}};
    int32_t s = -1;
    REQUIRE(tg_text_rows_source(&r, "d.csv", &s, &err) == 0, "%s", err.msg);
    const tg_text_columns cols = {.text = "sentence", .pair = "second", .label = "tag"};
    const tg_text_columns skip = {.text = "sentence", .pair = "second", .label = "tag", .skip_invalid = 1};
    static const struct {
        tg_text_fields f;
        int skip;
        const char *want; /* the message, or NULL: added (or skipped, when skip) */
    } cases[] = {
        {{.text = "ok", .text_len = 2}, 0, NULL},
        {{.text = "ok", .text_len = 2, .pair = "p", .pair_len = 1, .label = "L", .label_len = 1}, 0, NULL},
        {{.text = "a\xff", .text_len = 2}, 0,
         "d.csv:4: column 'sentence' is not valid UTF-8 (byte 0xff at offset 1 of the field; re-encode the file as "
         "UTF-8, or pass --skip-invalid to leave such rows out)"},
        {{.text = "a", .text_len = 1, .pair = "\xc3(", .pair_len = 2}, 0,
         "d.csv:4: column 'second' is not valid UTF-8 (byte 0xc3 at offset 0 of the field; re-encode the file as "
         "UTF-8, or pass --skip-invalid to leave such rows out)"},
        {{.text = "a", .text_len = 1, .label = "", .label_len = 0}, 0, "d.csv:4: the label ('tag') is empty"},
        {{.text = "a", .text_len = 1, .label = "x\0y", .label_len = 3}, 0, "d.csv:4: the label ('tag') holds a NUL byte"},
        {{.text = "a", .text_len = 1, .label = "ab\xed\xa0\x80", .label_len = 5}, 0,
         "d.csv:4: column 'tag' is not valid UTF-8 (byte 0xed at offset 2 of the field; re-encode the file as UTF-8)"},
        /* skipping leaves out bad text and pair, not a bad label */
        {{.text = "a\xff", .text_len = 2}, 1, NULL},
        {{.text = "a", .text_len = 1, .pair = "\x80", .pair_len = 1}, 1, NULL},
        {{.text = "a", .text_len = 1, .label = "\xff", .label_len = 1}, 1,
         "d.csv:4: column 'tag' is not valid UTF-8 (byte 0xff at offset 0 of the field; re-encode the file as UTF-8)"},
        {{.text = "a", .text_len = 1, .label = "", .label_len = 0}, 1, "d.csv:4: the label ('tag') is empty"},
        /* the length bounds the check */
        {{.text = "ab\xff", .text_len = 2}, 0, NULL},
    };
    int64_t added = 0, skipped = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        memset(&err, 0, sizeof err);
        const int rc = tg_text_fields_add(&r, s, 4, &cases[k].f, cases[k].skip ? &skip : &cols, &err);
        if (cases[k].want) {
            CHECK(rc == -1 && !strcmp(err.msg, cases[k].want), "case %zu: rc %d '%s', want '%s'", k, rc, err.msg,
                  cases[k].want);
        } else {
            const int is_skip = cases[k].skip;
            added += !is_skip;
            skipped += is_skip;
            CHECK(rc == 0, "case %zu: %s", k, err.msg);
        }
        CHECK(r.n == added && r.skipped_invalid == skipped, "case %zu: %lld rows, %lld skipped", k, (long long)r.n,
              (long long)r.skipped_invalid);
    }
    CHECK(row_is(&r, 0, "ok", NULL, NULL, 0, 4) && row_is(&r, 1, "ok", "p", "L", 0, 4) && row_is(&r, 2, "ab", NULL, NULL, 0, 4),
          "rows added");
    tg_text_rows_free(&r);
}
