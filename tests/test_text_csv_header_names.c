/* The header of a CSV/TSV file as datasets/text_csv.c reads it, word for word: a column
 * named twice (the name cut at 80 bytes in the message), a named column the header lacks
 * (the header's names listed, each cut at 40 bytes, the list ending before 512 bytes),
 * columns found by their whole name only, and rows taking the columns by index. */
#include <stdio.h>
#include <string.h>

#include "datasets/text_rows.h"
#include "tests/harness.h"

/* Reads buf as t.csv; "error: MESSAGE" or the rows as "text|pair|label;" ('-' for none). */
static const char *read_csv(const char *buf, const tg_text_columns *cols) {
    static char out[2048];
    tg_text_rows rows = {0};
    tg_err err = {{0}};
    if (tg_text_read_csv("t.csv", buf, strlen(buf), ',', cols, &rows, &err)) {
        snprintf(out, sizeof out, "error: %s", err.msg);
    } else {
        size_t at = 0;
        out[0] = 0;
        for (int64_t i = 0; i < rows.n && at + 64 < sizeof out; i++) {
            const tg_text_row *r = &rows.rows[i];
            at += (size_t)snprintf(out + at, sizeof out - at, "%s|%s|%s;", tg_text_rows_at(&rows, r->text),
                                   r->pair >= 0 ? tg_text_rows_at(&rows, r->pair) : "-",
                                   r->label >= 0 ? tg_text_rows_at(&rows, r->label) : "-");
        }
    }
    tg_text_rows_free(&rows);
    return out;
}

static void expect(const char *what, const char *buf, const tg_text_columns *cols, const char *want) {
    const char *got = read_csv(buf, cols);
    CHECK(!strcmp(got, want), "%s:\n got  '%s'\n want '%s'", what, got, want);
}

/* n copies of c */
static const char *run(char c, int n) {
    static char s[4][200];
    static int k;
    char *p = s[k++ % 4];
    memset(p, c, (size_t)n);
    p[n] = 0;
    return p;
}

TG_TEST(test_text_csv_header_names_twice) {
    const tg_text_columns cols = {.text = "text"};
    char buf[512], want[512];
    /* names of 80 and 81 bytes: the message shows at most 80 */
    for (int n = 79; n <= 82; n++) {
        snprintf(buf, sizeof buf, "text,%s,x,%s\nq,r,s,t\n", run('n', n), run('n', n));
        snprintf(want, sizeof want, "error: t.csv:1: the header names column '%s' twice (columns 2 and 4)",
                 run('n', n > 80 ? 80 : n));
        expect("long name twice", buf, &cols, want);
    }
    expect("the first pair found", "b,a,a,b\n", &cols, "error: t.csv:1: the header names column 'a' twice (columns 2 and 3)");
    expect("a prefix is another name", "text,te,tex\nq,r,s\n", &cols, "q|-|-;");
    expect("empty names twice", "text,,\n", &cols, "error: t.csv:1: the header names column '' twice (columns 2 and 3)");
    expect("on a later line", "\n\ntext,text\n", &cols, "error: t.csv:3: the header names column 'text' twice (columns 1 and 2)");
}

TG_TEST(test_text_csv_header_names_missing_columns) {
    char buf[1024], want[1024];
    /* each name cut at 40 bytes */
    const tg_text_columns cols = {.text = "body"};
    snprintf(buf, sizeof buf, "%s,%s,c\nx,y,z\n", run('a', 40), run('b', 41));
    snprintf(want, sizeof want,
             "error: t.csv: no column 'body' for the text (the header has '%s', '%s', 'c'; --text-column names another)",
             run('a', 40), run('b', 40));
    expect("names cut at 40", buf, &cols, want);
    /* 20 names of 40 bytes: the list stops once fewer than 8 bytes of 512 are left */
    size_t at = 0;
    for (int i = 0; i < 20; i++) at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%c%s", i ? "," : "", 'A' + i, run('x', 39));
    snprintf(buf + at, sizeof buf - at, "\n");
    const char *got = read_csv(buf, &cols);
    char names[600] = "";
    size_t n = 0;
    for (int i = 0; i < 20 && n + 8 < 512; i++) n += (size_t)snprintf(names + n, sizeof names - n, "%s'%c%s'", i ? ", " : "", 'A' + i, run('x', 39));
    names[511] = 0;
    snprintf(want, sizeof want, "error: t.csv: no column 'body' for the text (the header has %s; --text-column names another)", names);
    CHECK(!strcmp(got, want), "a long header:\n got  '%s'\n want '%s'", got, want);
    CHECK(strlen(names) == 511, "the names fill the buffer: %zu", strlen(names));

    /* where the list stops: 11 names of 40 bytes and one of 17 take 503 bytes, so 'c' still
     * goes in (503 + 8 < 512) and 'd' not; with one of 18 (504 bytes) neither */
    for (int last = 17; last <= 18; last++) {
        at = 0;
        size_t w = 0;
        char list[600];
        for (int i = 0; i < 11; i++) {
            at += (size_t)snprintf(buf + at, sizeof buf - at, "%c%s,", 'A' + i, run('x', 39));
            w += (size_t)snprintf(list + w, sizeof list - w, "%s'%c%s'", i ? ", " : "", 'A' + i, run('x', 39));
        }
        snprintf(buf + at, sizeof buf - at, "%s,c,d\n", run('y', last));
        w += (size_t)snprintf(list + w, sizeof list - w, ", '%s'%s", run('y', last), last == 17 ? ", 'c'" : "");
        CHECK(w == (last == 17 ? 508u : 504u), "list of %zu bytes", w);
        snprintf(want, sizeof want,
                 "error: t.csv: no column 'body' for the text (the header has %s; --text-column names another)", list);
        got = read_csv(buf, &cols);
        CHECK(!strcmp(got, want), "a name of %d last:\n got  '%s'\n want '%s'", last, got, want);
    }

    const tg_text_columns pair = {.text = "t", .pair = "h"};
    expect("no pair", "t,hh,H\nx,y,z\n", &pair, "error: t.csv: no column 'h' for the pair text (the header has 't', 'hh', 'H')");
    const tg_text_columns label = {.text = "t", .label = "lab", .label_required = 1};
    expect("no label", "t,la,labe\nx,y,z\n", &label,
           "error: t.csv: no column 'lab' for the label (the header has 't', 'la', 'labe')");
    const tg_text_columns optional = {.text = "t", .label = "lab"};
    expect("a label not required", "t,la\nx,y\n", &optional, "x|-|-;");
}

TG_TEST(test_text_csv_header_names_columns_by_index) {
    const tg_text_columns all = {.text = "t", .pair = "p", .label = "l"};
    expect("any order", "l,x,p,t\nL1,X,P1,T1\nL2,X,P2,T2\n", &all, "T1|P1|L1;T2|P2|L2;");
    expect("the last column", "x,t\na,b\n", &(tg_text_columns){.text = "t"}, "b|-|-;");
    expect("the first column", "t,x\na,b\n", &(tg_text_columns){.text = "t"}, "a|-|-;");
    expect("header only", "t,p,l\n", &all, "");
    expect("quoted names", "\"t\",\"p\",\"l\"\na,b,c\n", &all, "a|b|c;");
    expect("a row short", "t,p,l\na,b\n", &all,
           "error: t.csv:2: row has 2 fields, the header has 3 (a field holding a comma or a line break must be quoted)");
    expect("a row long", "t\na,b\n", &(tg_text_columns){.text = "t"},
           "error: t.csv:2: row has 2 fields, the header has 1 (a field holding a comma or a line break must be quoted)");
}
