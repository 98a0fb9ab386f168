/* The readers under `data convert` and the JSONL dataset loader, table-driven: the CSV/TSV
 * parser's rows and refusals (file:line:column), the CSV/TSV, JSONL and plain-text row
 * readers (file:line and column or field), folder trees, label sets, pre-tokenized JSON
 * Lines (file:line and field), and each reader's allocations failed in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "datasets/csv.h"
#include "datasets/dataset.h"
#include "datasets/labels.h"
#include "datasets/text_rows.h"
#include "plan/ops.h"
#include "tests/harness.h"

/* ---- the CSV parser ------------------------------------------------------------------- */

/* All rows of buf as "[a|b][c]", or "error: MESSAGE". */
static const char *csv_rows(const char *buf, size_t len, char delim) {
    static char out[4096];
    tg_csv c;
    tg_err err = {{0}};
    tg_csv_init(&c, "t.csv", buf, len, delim);
    size_t at = 0;
    out[0] = 0;
    int got;
    while ((got = tg_csv_next(&c, &err)) == 1) {
        at += (size_t)snprintf(out + at, sizeof out - at, "[");
        for (int32_t i = 0; i < c.n_fields; i++)
            at += (size_t)snprintf(out + at, sizeof out - at, "%s%.*s", i ? "|" : "", (int)c.fields[i].len,
                                   c.fields[i].p);
        at += (size_t)snprintf(out + at, sizeof out - at, "]");
    }
    if (got < 0) snprintf(out, sizeof out, "error: %s", err.msg);
    tg_csv_free(&c);
    return out;
}

TG_TEST(test_csv_rows_and_refusals) {
    static const struct {
        const char *in;
        char delim;
        const char *want;
    } cases[] = {
        {"a,b\n", ',', "[a|b]"},
        {"\xEF\xBB\xBF" "a,b", ',', "[a|b]"},
        {"\xEF\xBB", ',', "[\xEF\xBB]"},
        {"\n\r\na,b\r\n\nc,d", ',', "[a|b][c|d]"},
        {"a,b\r", ',', "[a|b\r]"},
        {"a\rb,c\n", ',', "[a\rb|c]"},
        {"\"x\"\"y\",z\n", ',', "[x\"y|z]"},
        {"\"a,\nb\",c", ',', "[a,\nb|c]"},
        {"a,\"b\"", ',', "[a|b]"},
        {"\"\",x", ',', "[|x]"},
        {"\"\"", ',', "[]"},
        {"a,", ',', "[a|]"},
        {"\"a\"\r\nb", ',', "[a][b]"},
        {"a\tb,c\n", '\t', "[a|b,c]"},
        {"", ',', ""},
        {"\n\n", ',', ""},
        {"a\n\"bc", ',', "error: t.csv:2:1: unterminated quoted field (the quote opened here is never closed)"},
        {"\"a\"\"", ',', "error: t.csv:1:1: unterminated quoted field"},
        {"x,\"a\"b,c", ',', "error: t.csv:1:6: unexpected 'b' after the closing quote of a field (a quote inside a "
                            "quoted field is written as two quotes)"},
        {"\"a\"\x01", ',', "error: t.csv:1:4: unexpected byte 0x01 after the closing quote"},
        {"\"a\"\xC3\xA9", ',', "error: t.csv:1:4: unexpected byte 0xc3 after the closing quote"},
        {"\"a\nb\"x", ',', "error: t.csv:2:3: unexpected 'x' after the closing quote"},
        {"ok\nab\"c", ',', "error: t.csv:2:3: stray quote in an unquoted field (quote the whole field and write the "
                           "quote twice)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *got = csv_rows(cases[i].in, strlen(cases[i].in), cases[i].delim);
        const int is_error = !strncmp(cases[i].want, "error: ", 7);
        CHECK(is_error ? strstr(got, cases[i].want) == got : !strcmp(got, cases[i].want), "case %zu: got '%s', want '%s'", i, got, cases[i].want);
    }
    /* 20 fields grow the field table past 16; a 300-byte quoted field grows the scratch
     * buffer past 256. */
    char buf[1024] = "";
    for (int i = 0; i < 20; i++) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%d", i ? "," : "", i);
    strcat(buf, ",\"");
    for (int i = 0; i < 300; i++) strcat(buf, "q");
    strcat(buf, "\"\n");
    tg_csv c;
    tg_err err = {{0}};
    tg_csv_init(&c, "t.csv", buf, strlen(buf), ',');
    REQUIRE(tg_csv_next(&c, &err) == 1, "%s", err.msg);
    CHECK(c.n_fields == 21 && c.fields[19].len == 2 && !memcmp(c.fields[19].p, "19", 2) && c.fields[20].len == 300 &&
              c.fields[20].p[299] == 'q',
          "%d fields", c.n_fields);
    CHECK(tg_csv_next(&c, &err) == 0, "one row");
    tg_csv_free(&c);
}

TG_TEST(test_csv_field_limit) {
    /* 2^20 fields fill the table; one more is refused with the row's line. */
    const size_t n = (1u << 20) + 1;
    char *buf = malloc(2 * n + 8);
    REQUIRE(buf, "malloc");
    memcpy(buf, "h\n", 2);
    for (size_t i = 0; i < n; i++) buf[2 + 2 * i] = 'x', buf[3 + 2 * i] = ',';
    buf[2 + 2 * n - 1] = '\n';
    tg_csv c;
    tg_err err = {{0}};
    tg_csv_init(&c, "t.csv", buf, 2 * n + 1, ',');
    CHECK(tg_csv_next(&c, &err) == 1, "header");
    CHECK(tg_csv_next(&c, &err) == -1 && !strcmp(err.msg, "t.csv:2: more than 1048576 fields in a row"), "limit: %s",
          err.msg);
    tg_csv_free(&c);
    free(buf);
}

/* Fails each allocation of `fn` in turn; every failure must be an error saying it ran out of
 * memory. Returns the number of allocations of a successful run. */
typedef int (*reader_fn)(const void *ctx, tg_err *err);

static long fail_each(const char *what, reader_fn fn, const void *ctx) {
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    if (!CHECK(fn(ctx, &err) == 0, "%s: %s", what, err.msg)) return 0;
    const long total = tg_alloc_fail_after(-1);
    for (long k = 0; k < total; k++) {
        tg_alloc_fail_after(k);
        int rc = fn(ctx, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory"), "%s: allocation %ld of %ld: rc %d, '%s'", what, k, total, rc,
              rc ? err.msg : "");
    }
    return total;
}

static int csv_all(const void *ctx, tg_err *err) {
    const char *buf = ctx;
    tg_csv c;
    tg_csv_init(&c, "t.csv", buf, strlen(buf), ',');
    int got;
    while ((got = tg_csv_next(&c, err)) == 1) {}
    tg_csv_free(&c);
    return got;
}

TG_TEST(test_csv_allocation_failures) {
    /* Sixteen fields then a trailing delimiter: the seventeenth, empty, field grows the
     * table; a quoted field grows the scratch buffer. */
    long n = fail_each("csv", csv_all, "\"q\",b\n1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,");
    CHECK(n >= 4, "%ld allocations", n);
    n = fail_each("csv quoted", csv_all, "a,\"b\"\n");
    CHECK(n >= 3, "%ld allocations", n);
}

/* ---- rows from CSV, TSV, JSONL and text ----------------------------------------------- */

/* The rows as "text|pair|label;" ("-" for an absent pair or label), or "error: MESSAGE". */
static const char *rows_text(const tg_text_rows *r, int rc, const tg_err *err) {
    static char out[4096];
    if (rc) {
        snprintf(out, sizeof out, "error: %s", err->msg);
        return out;
    }
    size_t at = 0;
    out[0] = 0;
    for (int64_t i = 0; i < r->n && at < sizeof out; i++) {
        const tg_text_row *w = &r->rows[i];
        at += (size_t)snprintf(out + at, sizeof out - at, "%s|%s|%s;", tg_text_rows_at(r, w->text),
                               w->pair >= 0 ? tg_text_rows_at(r, w->pair) : "-",
                               w->label >= 0 ? tg_text_rows_at(r, w->label) : "-");
    }
    return out;
}

typedef struct reader_case {
    const char *in;
    int kind; /* 0 csv, 1 tsv, 2 ';'-separated, 3 jsonl, 4 text */
    const char *text, *pair, *label;
    int label_required, skip;
    const char *want;
} reader_case;

static int read_one(const reader_case *k, tg_text_rows *rows, tg_err *err) {
    const tg_text_columns cols = {.text = k->text ? k->text : "text",
                                  .pair = k->pair,
                                  .label = k->label,
                                  .label_required = k->label_required,
                                  .skip_invalid = k->skip};
    const size_t len = strlen(k->in);
    const char *name = k->kind == 3 ? "t.jsonl" : k->kind == 4 ? "t.txt" : "t.csv";
    switch (k->kind) {
    case 0: return tg_text_read_csv(name, k->in, len, ',', &cols, rows, err);
    case 1: return tg_text_read_csv(name, k->in, len, '\t', &cols, rows, err);
    case 2: return tg_text_read_csv(name, k->in, len, ';', &cols, rows, err);
    case 3: return tg_text_read_jsonl(name, k->in, len, &cols, rows, err);
    default: return tg_text_read_lines(name, k->in, len, k->skip, rows, err);
    }
}

TG_TEST(test_text_readers_table) {
    static const reader_case cases[] = {
        /* CSV and TSV */
        {"text,label\nab,x\ncd,y\n", 0, .label = "label", .want = "ab|-|x;cd|-|y;"},
        {"text,other\nab,x\n", 0, .label = "label", .want = "ab|-|-;"},
        {"p,h,l\n\"a, b\",c,z\n", 0, .text = "p", .pair = "h", .label = "l", .want = "a, b|c|z;"},
        {"text\tlabel\nab\tx\n", 1, .label = "label", .want = "ab|-|x;"},
        {"", 0, .want = "error: t.csv: empty file (a header row naming the columns comes first)"},
        {"\r\n\n", 0, .want = "error: t.csv: empty file"},
        {"\"text", 0, .want = "error: t.csv:1:1: unterminated quoted field"},
        {"text,label,text\n", 0, .want = "error: t.csv:1: the header names column 'text' twice (columns 1 and 3)"},
        {"a,b\n", 0, .want = "error: t.csv: no column 'text' for the text (the header has 'a', 'b'; --text-column "
                             "names another)"},
        {"text\nx\n", 0, .pair = "hyp", .want = "error: t.csv: no column 'hyp' for the pair text (the header has 'text')"},
        {"text\nx\n", 0, .label = "lab", .label_required = 1,
         .want = "error: t.csv: no column 'lab' for the label (the header has 'text')"},
        {"text,label\na\n", 0, .label = "label",
         .want = "error: t.csv:2: row has 1 field, the header has 2 (a field holding a comma or a line break must be "
                 "quoted)"},
        {"text\tlabel\na\tb\tc\n", 1, .want = "error: t.csv:2: row has 3 fields, the header has 2 (a field holding a tab"},
        {"text;label\na;b;c\n", 2, .want = "error: t.csv:2: row has 3 fields, the header has 2 (a field holding the "
                                           "delimiter"},
        {"text,label\n\"x\ny\",\"b\nc\"\nz,\"\"\n", 0, .label = "label",
         .want = "error: t.csv:5: the label ('label') is empty"},
        {"text,label\nab,\"x\"\"\n\"\n", 0, .label = "label", .want = "ab|-|x\"\n;"},
        {"text,label\nab,\xff\n", 0, .label = "label",
         .want = "error: t.csv:2: column 'label' is not valid UTF-8 (byte 0xff at offset 0 of the field; re-encode the "
                 "file as UTF-8)"},
        {"text,label\nab,\xff\n", 0, .label = "label", .skip = 1,
         .want = "error: t.csv:2: column 'label' is not valid UTF-8 (byte 0xff at offset 0 of the field; re-encode the "
                 "file as UTF-8)"},
        {"text,hyp\nab,c\xff\n", 0, .pair = "hyp",
         .want = "error: t.csv:2: column 'hyp' is not valid UTF-8 (byte 0xff at offset 1 of the field; re-encode the file "
                 "as UTF-8, or pass --skip-invalid to leave such rows out)"},
        {"text,hyp\nab,c\xff\nd,e\n", 0, .pair = "hyp", .skip = 1, .want = "d|e|-;"},
        {"text,hyp\na\xfe,c\nd,e\n", 0, .pair = "hyp", .skip = 1, .want = "d|e|-;"},
        /* JSONL */
        {"{\"text\": \"a\", \"label\": \"x\"}\n \t\r\n\n{\"text\": \"b\", \"label\": 7}", 3, .label = "label",
         .want = "a|-|x;b|-|7;"},
        {"{\"text\": \"a\", \"label\": -12}\n", 3, .label = "label", .want = "a|-|-12;"},
        {"{\"text\": \"a\", \"label\": \"x\"}\n", 3, .want = "a|-|-;"},
        {"{\"text\": \"a\", \"hyp\": \"b\"}\n", 3, .pair = "hyp", .label = "label", .want = "a|b|-;"},
        {"{\"text\": \"a\"}\n{\"text\": 5}\n", 3, .want = "error: t.jsonl:2: \"text\" (the text) must be a string"},
        {"{\"body\": \"a\"}\n", 3, .want = "error: t.jsonl:1: no \"text\" field for the text"},
        {"{\"text\": \"a\"}\n", 3, .pair = "hyp", .want = "error: t.jsonl:1: no \"hyp\" field for the pair text"},
        {"{\"text\": \"a\", \"hyp\": []}\n", 3, .pair = "hyp",
         .want = "error: t.jsonl:1: \"hyp\" (the pair text) must be a string"},
        {"{\"text\": \"a\"}\n", 3, .label = "label", .label_required = 1,
         .want = "error: t.jsonl:1: no \"label\" field for the label"},
        {"{\"text\": \"a\", \"label\": 1.5}\n", 3, .label = "label",
         .want = "error: t.jsonl:1: \"label\" (the label) must be a string or an integer"},
        {"{\"text\": \"a\", \"label\": \"\"}\n", 3, .label = "label", .want = "error: t.jsonl:1: the label ('label') is empty"},
        {"[\"a\"]\n", 3, .want = "error: t.jsonl:1: expected a JSON object like {\"text\": \"...\"}"},
        {"{\"text\": \"a\", \"text\": \"b\"}\n", 3, .want = "error: t.jsonl:1: invalid JSON: "},
        {"{\"text\": \"a\"\n", 3, .want = "error: t.jsonl:1: invalid JSON: "},
        {"{\"text\": \"a\"}\n{\"text\": \"\xff\"}\n", 3,
         .want = "error: t.jsonl:2: not valid UTF-8 (byte 0xff at column 11; re-encode the file as UTF-8, or pass "
                 "--skip-invalid to leave such lines out)"},
        {"{\"text\": \"\xff\"}\n{\"text\": \"b\"}", 3, .skip = 1, .want = "b|-|-;"},
        /* plain text */
        {"\xEF\xBB\xBF" "ab\r\n \t\f\v\r\n\ncd", 4, .want = "ab|-|-;cd|-|-;"},
        {"ab", 4, .want = "ab|-|-;"},
        {"abc\n", 4, .want = "abc|-|-;"},
        {"\r", 4, .want = ""},
        {"ok\n\xc3\x28\n", 4, .want = "error: t.txt:2: column 'text' is not valid UTF-8 (byte 0xc3 at offset 0"},
        {"ok\n\xc3\x28\n", 4, .skip = 1, .want = "ok|-|-;"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_text_rows rows = {0};
        tg_err err = {{0}};
        int rc = read_one(&cases[i], &rows, &err);
        const char *got = rows_text(&rows, rc, &err);
        const int is_error = !strncmp(cases[i].want, "error: ", 7);
        CHECK(is_error ? strstr(got, cases[i].want) == got : !strcmp(got, cases[i].want), "case %zu: got '%s', want '%s'",
              i, got, cases[i].want);
        tg_text_rows_free(&rows);
    }
    /* A label holding a NUL byte. */
    {
        tg_text_rows nul = {0};
        tg_err e = {{0}};
        const tg_text_columns cols = {.text = "text", .label = "label"};
        const char in[] = "text,label\nab,x\0y\n";
        CHECK(tg_text_read_csv("t.csv", in, sizeof in - 1, ',', &cols, &nul, &e) == -1 &&
                  !strcmp(e.msg, "t.csv:2: the label ('label') holds a NUL byte"),
              "NUL: %s", e.msg);
        tg_text_rows_free(&nul);
    }
    /* The skipped rows are counted. */
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    REQUIRE(read_one(&cases[19], &rows, &err) == 0, "%s", err.msg);
    CHECK(rows.skipped_invalid == 1 && rows.n == 1, "skipped %lld", (long long)rows.skipped_invalid);
    tg_text_rows_free(&rows);
}

TG_TEST(test_text_rows_header_names_and_growth) {
    /* A header of many long names: each is cut at 40 bytes, the list at the buffer's end. */
    char buf[4096] = "";
    for (int i = 0; i < 30; i++) {
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%scolumn_%02d_", i ? "," : "", i);
        for (int k = 0; k < 40; k++) strcat(buf, "x");
    }
    strcat(buf, "\n");
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    const tg_text_columns cols = {.text = "text", .label = "label"};
    REQUIRE(tg_text_read_csv("t.csv", buf, strlen(buf), ',', &cols, &rows, &err) == -1, "accepted");
    CHECK(strstr(err.msg, "the header has 'column_00_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx', 'column_01_") != NULL &&
              strstr(err.msg, "column_29") == NULL,
          "names: %s", err.msg);
    tg_text_rows_free(&rows);
    /* A name longer than 80 bytes twice is shown cut. */
    char dup[512], want[256];
    char name[101];
    memset(name, 'n', 100);
    name[100] = 0;
    snprintf(dup, sizeof dup, "%s,%s\n", name, name);
    snprintf(want, sizeof want, "t.csv:1: the header names column '%.80s' twice (columns 1 and 2)", name);
    CHECK(tg_text_read_csv("t.csv", dup, strlen(dup), ',', &cols, &rows, &err) == -1 && !strcmp(err.msg, want),
          "dup: %s", err.msg);
    tg_text_rows_free(&rows);

    /* 1100 rows, 70 000 bytes of text and 9 sources grow every table past its first size. */
    for (int s = 0; s < 9; s++) {
        char name2[32];
        int32_t index;
        snprintf(name2, sizeof name2, "src%d", s);
        REQUIRE(tg_text_rows_source(&rows, name2, &index, &err) == 0 && index == s, "%s", err.msg);
    }
    char text[64];
    memset(text, 't', 63);
    text[63] = 0;
    for (int i = 0; i < 1100; i++)
        REQUIRE(tg_text_rows_add(&rows, i % 9, i + 1, text, 63, i % 2 ? "p" : NULL, 1, i % 3 ? NULL : "l", 1, &err) == 0,
                "%s", err.msg);
    CHECK(rows.n == 1100 && rows.cap == 2048 && rows.cap_bytes == 131072 && rows.cap_sources == 16 &&
              rows.rows[1099].pair >= 0 && rows.rows[1098].pair < 0 && rows.rows[1098].label >= 0 &&
              rows.rows[1099].label < 0,
          "n %lld cap %lld bytes %lld sources %d", (long long)rows.n, (long long)rows.cap, (long long)rows.cap_bytes,
          rows.cap_sources);
    char where[64];
    tg_text_rows_where(&rows, &rows.rows[10], where, sizeof where);
    CHECK(!strcmp(where, "src1:11"), "where %s", where);
    const tg_text_row whole = {.source = 2, .line = 0}, outside = {.source = 9, .line = 3}, neg = {.source = -1};
    tg_text_rows_where(&rows, &whole, where, sizeof where);
    CHECK(!strcmp(where, "src2"), "a whole file: %s", where);
    tg_text_rows_where(&rows, &outside, where, sizeof where);
    CHECK(!strcmp(where, "input:3"), "no such source: %s", where);
    tg_text_rows_where(&rows, &neg, where, sizeof where);
    CHECK(!strcmp(where, "input"), "source -1: %s", where);
    tg_text_rows_free(&rows);
    CHECK(rows.n == 0 && rows.bytes == NULL && rows.sources == NULL, "freed");
}

static int read_csv_case(const void *ctx, tg_err *err) {
    tg_text_rows rows = {0};
    const tg_text_columns cols = {.text = "text", .pair = "hyp", .label = "label"};
    const char *buf = ctx;
    int rc = tg_text_read_csv("t.csv", buf, strlen(buf), ',', &cols, &rows, err);
    tg_text_rows_free(&rows);
    return rc;
}

static int read_jsonl_case(const void *ctx, tg_err *err) {
    tg_text_rows rows = {0};
    const tg_text_columns cols = {.text = "text", .label = "label"};
    const char *buf = ctx;
    int rc = tg_text_read_jsonl("t.jsonl", buf, strlen(buf), &cols, &rows, err);
    tg_text_rows_free(&rows);
    return rc;
}

static int read_lines_case(const void *ctx, tg_err *err) {
    tg_text_rows rows = {0};
    const char *buf = ctx;
    int rc = tg_text_read_lines("t.txt", buf, strlen(buf), 0, &rows, err);
    tg_text_rows_free(&rows);
    return rc;
}

TG_TEST(test_text_readers_allocation_failures) {
    CHECK(fail_each("csv rows", read_csv_case, "text,hyp,label\n\"a\",b,x\nc,d,y\n") >= 5, "csv allocations");
    CHECK(fail_each("jsonl rows", read_jsonl_case, "{\"text\": \"a\", \"label\": 3}\n{\"text\": \"b\"}\n") >= 5,
          "jsonl allocations");
    CHECK(fail_each("text rows", read_lines_case, "a\nb\n") >= 3, "text allocations");
}

/* ---- folder trees --------------------------------------------------------------------- */

static void put(const char *dir, const char *rel, const char *text) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    if (text) tg_test_write_file(p, text);
    else mkdir(p, 0755);
}

static const char *tree_rows(const char *root, int skip, tg_text_rows *rows, tg_err *err) {
    static char out[2048];
    memset(rows, 0, sizeof *rows);
    int rc = tg_text_read_folders(root, skip, rows, err);
    snprintf(out, sizeof out, "%s", rows_text(rows, rc, err));
    return out;
}

TG_TEST(test_text_folders_trees) {
    char root[700], p[900];
    snprintf(root, sizeof root, "%s/tree", tg_test_tmpdir());
    mkdir(root, 0755);
    put(root, "b", NULL);
    put(root, "a", NULL);
    put(root, ".hidden", NULL);
    put(root, "loose.txt", "a file directly under the root is left out");
    put(root, "b/2.txt", "two");
    put(root, "b/1.txt", "one");
    put(root, "b/.swp", "hidden");
    put(root, "b/sub", NULL);
    put(root, "a/x.txt", "ex");
    tg_text_rows rows;
    tg_err err = {{0}};
    /* Sorted by bytes; a trailing slash on the root changes nothing. */
    snprintf(p, sizeof p, "%s//", root);
    const char *got = tree_rows(p, 0, &rows, &err);
    CHECK(!strcmp(got, "ex|-|a;one|-|b;two|-|b;"), "rows: %s", got);
    char where[1024];
    tg_text_rows_where(&rows, &rows.rows[1], where, sizeof where);
    snprintf(p, sizeof p, "%s/b/1.txt", root);
    CHECK(!strcmp(where, p), "where %s", where);
    tg_text_rows_free(&rows);
    /* A file that is not UTF-8: refused, or counted and left out. */
    put(root, "b/3.txt", "ok\xc0\xaf");
    got = tree_rows(root, 0, &rows, &err);
    snprintf(p, sizeof p, "error: %s/b/3.txt: not valid UTF-8 (byte 0xc0 at offset 2; re-encode", root);
    CHECK(strstr(got, p) == got, "bad file: %s", got);
    tg_text_rows_free(&rows);
    got = tree_rows(root, 1, &rows, &err);
    CHECK(!strcmp(got, "ex|-|a;one|-|b;two|-|b;") && rows.skipped_invalid == 1, "skipped: %s", got);
    tg_text_rows_free(&rows);
    /* A label folder whose name is not UTF-8. */
    put(root, "c\xff", NULL);
    got = tree_rows(root, 1, &rows, &err);
    snprintf(p, sizeof p, "error: %s/c\xff: the folder's name is not UTF-8, so it cannot name a label", root);
    CHECK(!strcmp(got, p), "bad name: %s", got);
    tg_text_rows_free(&rows);
    snprintf(p, sizeof p, "%s/c\xff", root);
    rmdir(p);
    /* A dangling link cannot be looked at. */
    snprintf(p, sizeof p, "%s/b/dangling", root);
    REQUIRE(symlink("/nonexistent/target", p) == 0, "symlink");
    got = tree_rows(root, 1, &rows, &err);
    CHECK(strstr(got, "/b/dangling: No such file or directory") != NULL, "dangling: %s", got);
    tg_text_rows_free(&rows);
    unlink(p);
    /* An unreadable file. */
    snprintf(p, sizeof p, "%s/b/0.txt", root);
    tg_test_write_file(p, "x");
    chmod(p, 0);
    if (access(p, R_OK) != 0) { /* not when the tests run as root */
        got = tree_rows(root, 1, &rows, &err);
        CHECK(strstr(got, "/b/0.txt: cannot open: Permission denied") != NULL, "unreadable: %s", got);
        tg_text_rows_free(&rows);
    }
    unlink(p);
    /* No root, an empty root, a root path too long. */
    snprintf(p, sizeof p, "%s/none", root);
    got = tree_rows(p, 0, &rows, &err);
    CHECK(strstr(got, "/none: cannot open the folder: No such file or directory") != NULL, "no root: %s", got);
    snprintf(p, sizeof p, "%s/empty", tg_test_tmpdir());
    mkdir(p, 0755);
    got = tree_rows(p, 0, &rows, &err);
    CHECK(strstr(got, "/empty: no label folders (the layout is ") != NULL, "empty: %s", got);
    char *longp = malloc(5000);
    REQUIRE(longp, "malloc");
    memset(longp, 'd', 4999);
    longp[4999] = 0;
    longp[0] = '/'; /* an absolute path of 4999 bytes: refused before any folder is read */
    CHECK(tg_text_read_folders(longp, 0, &rows, &err) == -1 && !strncmp(err.msg, "/ddd", 4) && rows.n_sources == 0,
          "long: %.40s", err.msg);
    free(longp);
}

/* Appends "/" and n letters 's' to path. */
static void append_segment(char *path, size_t n) {
    size_t at = strlen(path);
    path[at++] = '/';
    memset(path + at, 's', n);
    path[at + n] = 0;
}

TG_TEST(test_text_folders_long_paths) {
    /* A root nested ~3900 bytes deep: the label folder's path is 4096 bytes or more. */
    char root[4200];
    snprintf(root, sizeof root, "%s", tg_test_tmpdir());
    while (strlen(root) + 201 <= 3700) {
        append_segment(root, 200);
        REQUIRE(mkdir(root, 0755) == 0, "mkdir at %zu", strlen(root));
    }
    /* A last folder brings the root to 3870 bytes. */
    append_segment(root, 3870 - strlen(root) - 1);
    REQUIRE(strlen(root) == 3870 && mkdir(root, 0755) == 0, "mkdir at %zu", strlen(root));
    char label[300], p[4400];
    size_t need = 4096 - strlen(root) + 10;
    memset(label, 'L', need);
    label[need] = 0;
    /* Made relative to the root's descriptor: the absolute path is too long for mkdir. */
    int root_fd = open(root, O_RDONLY | O_DIRECTORY);
    REQUIRE(root_fd >= 0, "open the root");
    REQUIRE(mkdirat(root_fd, label, 0755) == 0, "mkdir label of %zu bytes", strlen(label));
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    /* The message (ROOT/LABEL: path too long) is cut at tg_err's 1024 bytes, inside ROOT. */
    CHECK(tg_text_read_folders(root, 0, &rows, &err) == -1 && !strncmp(err.msg, root, 1023) && rows.n == 0 &&
              rows.n_sources == 0,
          "long label folder: %.60s", err.msg);
    tg_text_rows_free(&rows);
    /* A short label folder, but a file name that takes its path past 4096 bytes. */
    REQUIRE(unlinkat(root_fd, label, AT_REMOVEDIR) == 0, "rmdir label");
    snprintf(p, sizeof p, "%s/x", root);
    REQUIRE(mkdir(p, 0755) == 0, "mkdir x");
    char file[300];
    need = 4096 - strlen(p) + 10;
    memset(file, 'F', need);
    file[need] = 0;
    int x_fd = open(p, O_RDONLY | O_DIRECTORY);
    int fd = x_fd >= 0 ? openat(x_fd, file, O_WRONLY | O_CREAT | O_TRUNC, 0644) : -1;
    REQUIRE(fd >= 0 && write(fd, "x", 1) == 1, "write the long-named file");
    close(fd);
    CHECK(tg_text_read_folders(root, 0, &rows, &err) == -1 && !strncmp(err.msg, root, 1023) && rows.n == 0 &&
              rows.n_sources == 0,
          "long file name: %.60s", err.msg);
    tg_text_rows_free(&rows);
    unlinkat(x_fd, file, 0);
    close(x_fd);
    close(root_fd);
}

typedef struct tree_ctx {
    const char *root;
} tree_ctx;

static int read_tree_case(const void *ctx, tg_err *err) {
    tg_text_rows rows = {0};
    int rc = tg_text_read_folders(((const tree_ctx *)ctx)->root, 0, &rows, err);
    tg_text_rows_free(&rows);
    return rc;
}

TG_TEST(test_text_folders_allocation_failures) {
    char root[700];
    snprintf(root, sizeof root, "%s/tree", tg_test_tmpdir());
    mkdir(root, 0755);
    /* 70 files in one folder grow the name list past 64. */
    put(root, "a", NULL);
    for (int i = 0; i < 70; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "a/%02d.txt", i);
        put(root, rel, "x");
    }
    put(root, "b", NULL);
    put(root, "b/1.txt", "y");
    tree_ctx t = {root};
    CHECK(fail_each("folders", read_tree_case, &t) > 70, "folder allocations");
}

/* ---- label sets ----------------------------------------------------------------------- */

static const char *set_names(const tg_label_set *ls) {
    static char out[512];
    size_t at = 0;
    out[0] = 0;
    for (int32_t i = 0; i < ls->n; i++) at += (size_t)snprintf(out + at, sizeof out - at, "%s%s", i ? "," : "", ls->names[i]);
    return out;
}

TG_TEST(test_labels_lists_and_collections) {
    static const struct {
        const char *list, *want;
    } lists[] = {
        {" a , b\t,c", "a,b,c"},
        {"x", "x"},
        {"a,,b", "error: --labels: name 2 of 'a,,b' is empty"},
        {" \t, a", "error: --labels: name 1 of ' \t, a' is empty"},
        {"a,", "error: --labels: name 2 of 'a,' is empty"},
        {"a,b, a", "error: --labels: 'a' is listed twice"},
    };
    for (size_t i = 0; i < sizeof lists / sizeof *lists; i++) {
        tg_label_set ls;
        tg_err err = {{0}};
        int rc = tg_labels_parse_list(lists[i].list, &ls, &err);
        char got[600];
        snprintf(got, sizeof got, "%s%s", rc ? "error: " : "", rc ? err.msg : set_names(&ls));
        CHECK(!strcmp(got, lists[i].want), "list %zu: '%s', want '%s'", i, got, lists[i].want);
        tg_labels_free(&ls);
    }
    /* 2^20 + 1 names. */
    size_t n = (1u << 20) + 1;
    char *many = malloc(2 * n);
    REQUIRE(many, "malloc");
    for (size_t i = 0; i < n; i++) many[2 * i] = 'x', many[2 * i + 1] = ',';
    many[2 * n - 1] = 0;
    tg_label_set ls;
    tg_err err = {{0}};
    CHECK(tg_labels_parse_list(many, &ls, &err) == -1 && !strcmp(err.msg, "--labels: more than 1048576 names"), "%s",
          err.msg);
    free(many);

    /* Collected labels: by value when all are whole numbers, else by bytes; lookups. */
    static const struct {
        const char *labels, *want;
    } sets[] = {
        {"10 2 -3 2 0", "-3,0,2,10"},
        {"10 2 a", "10,2,a"},
        {"-0 1", "-0,1"},
        {"007 1", "007,1"},
        {"- 1", "-,1"},
        {"1234567890123456789 1", "1,1234567890123456789"},
        {"123456789012345678 1", "1,123456789012345678"},
        {"1x 2", "1x,2"},
        {"b - a", "-,a,b"},
    };
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++) {
        tg_text_rows rows = {0};
        char copy[128];
        snprintf(copy, sizeof copy, "%s", sets[i].labels);
        /* One row without a label among them is passed over. */
        REQUIRE(tg_text_rows_add(&rows, 0, 1, "t", 1, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
        for (char *tok = strtok(copy, " "); tok; tok = strtok(NULL, " "))
            REQUIRE(tg_text_rows_add(&rows, 0, 1, "t", 1, NULL, 0, tok, strlen(tok), &err) == 0, "%s", err.msg);
        REQUIRE(tg_labels_collect(&rows, &ls, &err) == 0, "%s", err.msg);
        CHECK(!strcmp(set_names(&ls), sets[i].want), "set %zu: '%s', want '%s'", i, set_names(&ls), sets[i].want);
        for (int32_t k = 0; k < ls.n; k++)
            CHECK(tg_labels_find(&ls, ls.names[k], strlen(ls.names[k])) == k, "set %zu: find %s", i, ls.names[k]);
        CHECK(tg_labels_find(&ls, "zz", 2) == -1 && tg_labels_find(&ls, "", 0) == -1 && tg_labels_find(&ls, "+", 1) == -1,
              "set %zu: names not in it", i);
        tg_labels_free(&ls);
        tg_text_rows_free(&rows);
    }
    /* Rows without labels make an empty set. */
    tg_text_rows rows = {0};
    REQUIRE(tg_text_rows_add(&rows, 0, 1, "t", 1, NULL, 0, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(tg_labels_collect(&rows, &ls, &err) == 0 && ls.n == 0 && ls.names == NULL, "no labels: %d", ls.n);
    tg_labels_free(&ls);
    tg_text_rows_free(&rows);
}

TG_TEST(test_labels_too_many_distinct) {
    /* 2^20 + 1 distinct labels are refused (a label column that is not one). */
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    const int n = (1 << 20) + 1;
    char name[16];
    for (int i = 0; i < n; i++) {
        int len = snprintf(name, sizeof name, "l%d", i);
        REQUIRE(tg_text_rows_add(&rows, 0, i + 1, "", 0, NULL, 0, name, (size_t)len, &err) == 0, "%s", err.msg);
    }
    tg_label_set ls;
    CHECK(tg_labels_collect(&rows, &ls, &err) == -1 &&
              !strcmp(err.msg, "1048577 distinct labels, more than 1048576 (is the label column the right one?)"),
          "%s", err.msg);
    tg_text_rows_free(&rows);
}

typedef struct label_ctx {
    const char *list;
    const tg_text_rows *rows;
} label_ctx;

static int labels_case(const void *ctx, tg_err *err) {
    const label_ctx *c = ctx;
    tg_label_set ls;
    int rc = c->list ? tg_labels_parse_list(c->list, &ls, err) : tg_labels_collect(c->rows, &ls, err);
    if (!rc) tg_labels_free(&ls);
    return rc;
}

TG_TEST(test_labels_allocation_failures) {
    label_ctx a = {"a,b,c", NULL};
    CHECK(fail_each("label list", labels_case, &a) == 7, "list allocations");
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    REQUIRE(tg_text_rows_add(&rows, 0, 1, "t", 1, NULL, 0, "x", 1, &err) == 0 &&
                tg_text_rows_add(&rows, 0, 2, "t", 1, NULL, 0, "y", 1, &err) == 0,
            "%s", err.msg);
    label_ctx b = {NULL, &rows};
    CHECK(fail_each("label collection", labels_case, &b) == 6, "collection allocations");
    tg_text_rows_free(&rows);
}

/* ---- pre-tokenized JSON Lines ----------------------------------------------------------- */

TG_TEST(test_jsonl_dataset_refusals) {
    static const tg_data_rules classify = {TG_TASK_CLASSIFY, 3, 100, 2, 0, 0};
    static const tg_data_rules no_types = {TG_TASK_CLASSIFY, 3, 100, 0, 0, 0};
    static const tg_data_rules lm_any_vocab = {TG_TASK_LM, 0, 0, 0, 0, 0};
    static const struct {
        const char *text;
        const tg_data_rules *rules;
        const char *want; /* after "PATH:" */
    } cases[] = {
        {"{\"input_ids\": [1, \"a\"], \"label\": 0}\n", &classify, "1: input_ids[1] is not an integer"},
        {"{\"input_ids\": [1, 100], \"label\": 0}\n", &classify,
         "1: input_ids[1] = 100 is outside the vocabulary (vocab_size 100; wrong vocab?"},
        {"{\"input_ids\": [-1]}\n", &lm_any_vocab, "1: input_ids[0] = -1 is outside the vocabulary (vocab_size 0;"},
        {"[1, 2]\n", &classify, "1: expected a JSON object like {\"input_ids\": [...]}"},
        {"{\"label\": 0}\n", &classify, "1: missing \"input_ids\" (pre-tokenized ids are required)"},
        {"{\"input_ids\": 5, \"label\": 0}\n", &classify, "1: input_ids must be an array of integers"},
        {"{\"input_ids\": [], \"label\": 0}\n", &classify, "1: input_ids is empty"},
        {"{\"input_ids\": [1], \"token_type_ids\": 1, \"label\": 0}\n", &classify,
         "1: token_type_ids must be an array of integers"},
        {"{\"input_ids\": [1], \"token_type_ids\": [0, 1], \"label\": 0}\n", &classify,
         "1: token_type_ids has 2 entries but input_ids has 1"},
        {"{\"input_ids\": [1], \"token_type_ids\": [2], \"label\": 0}\n", &classify,
         "1: token_type_ids[0] = 2 is outside type_vocab_size 2"},
        {"{\"input_ids\": [1], \"token_type_ids\": [1], \"label\": 0}\n", &no_types,
         "1: token_type_ids[0] = 1 but the model has no token types (only 0 is allowed)"},
        {"{\"input_ids\": [1]}\n", &classify, "1: missing \"label\" (task classify needs an integer label per line)"},
        {"{\"input_ids\": [1], \"label\": \"0\"}\n", &classify, "1: label must be an integer"},
        {"{\"input_ids\": [1], \"label\": 3}\n", &classify, "1: label 3 is out of range for num_labels 3"},
        {"{\"input_ids\": [1], \"label\": -1}\n", &classify, "1: label -1 is out of range for num_labels 3"},
        {"{\"input_ids\": [1], \"input_ids\": [2], \"label\": 0}\n", &classify,
         "1: key \"input_ids\" appears twice in one object (column"},
        {"{\"input_ids\": [1], \"label\": 0}\n \t\r\n{\"input_ids\": [1]", &classify, "3: invalid JSON: "},
        {" \t\r\n", &classify, " no examples"},
    };
    char path[700];
    snprintf(path, sizeof path, "%s/d.jsonl", tg_test_tmpdir());
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        REQUIRE(tg_test_write_file(path, cases[i].text) == 0, "write");
        tg_dataset ds;
        tg_err err = {{0}};
        char want[900];
        snprintf(want, sizeof want, "%s:%s", path, cases[i].want);
        CHECK(tg_dataset_load(path, cases[i].rules, &ds, &err) == -1 && strstr(err.msg, want) == err.msg,
              "case %zu: '%s', want '%s'", i, err.msg, want);
    }
    /* Accepted: null and all-zero token types are none; any vocabulary when it is unknown. */
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [5, 6], \"token_type_ids\": null}\n"
                                     "{\"input_ids\": [99999], \"token_type_ids\": [0]}\n") == 0,
            "write");
    tg_dataset ds;
    tg_err err = {{0}};
    REQUIRE(tg_dataset_load(path, &lm_any_vocab, &ds, &err) == 0, "%s", err.msg);
    CHECK(ds.n == 2 && ds.n_tokens == 3 && !ds.examples[0].token_type_ids && !ds.examples[1].token_type_ids &&
              ds.examples[1].input_ids[0] == 99999 && ds.examples[0].label == TG_IGNORE_INDEX,
          "%d examples, %lld tokens", ds.n, (long long)ds.n_tokens);
    tg_dataset_free(&ds);
    CHECK(ds.n == 0 && ds.examples == NULL, "freed");
    tg_dataset_free(&ds); /* again: nothing to free */
    tg_dataset_free(NULL);
    /* A folder, a path too long, a missing file. */
    CHECK(tg_dataset_load("/proc/self/mem", &classify, &ds, &err) == -1 &&
              !strcmp(err.msg, "/proc/self/mem: read error: Input/output error"),
          "unreadable: %s", err.msg);
    char longp[700];
    memset(longp, 'p', 600);
    longp[600] = 0;
    CHECK(tg_dataset_load(longp, &classify, &ds, &err) == -1 && strstr(err.msg, ": dataset path is too long"),
          "long: %s", err.msg);
    CHECK(tg_dataset_load("no-such.jsonl", &classify, &ds, &err) == -1 &&
              !strcmp(err.msg, "no-such.jsonl: cannot open dataset: No such file or directory"),
          "missing: %s", err.msg);
}
