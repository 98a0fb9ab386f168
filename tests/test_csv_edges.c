/* The CSV reader at its edges (datasets/csv.c): inputs held in buffers of their exact size
 * (no terminating NUL: the sanitizer build sees a read past the end); a byte-order mark with
 * nothing after it; a carriage return as the last byte; an empty quoted field, which points
 * at an empty string; the bytes a message shows as themselves (printable ASCII, space and
 * '~' included) and those it shows by code (DEL, control bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/csv.h"
#include "tests/harness.h"

/* All rows of text[0..len), copied into a buffer of exactly len bytes, as "[a|b][c]" (a
 * field with no pointer shows as "<NULL>"), or "error: MESSAGE". */
static const char *rows_of(const char *text, size_t len) {
    static char out[1024];
    char *buf = malloc(len ? len : 1);
    if (!buf) return "out of memory";
    memcpy(buf, text, len);
    tg_csv c;
    tg_err err = {{0}};
    tg_csv_init(&c, "t.csv", buf, len, ',');
    size_t at = 0;
    out[0] = 0;
    int got;
    while ((got = tg_csv_next(&c, &err)) == 1) {
        at += (size_t)snprintf(out + at, sizeof out - at, "[");
        for (int32_t i = 0; i < c.n_fields; i++) {
            const tg_csv_field *f = &c.fields[i];
            if (f->p) at += (size_t)snprintf(out + at, sizeof out - at, "%s%.*s", i ? "|" : "", (int)f->len, f->p);
            else at += (size_t)snprintf(out + at, sizeof out - at, "%s<NULL>", i ? "|" : "");
        }
        at += (size_t)snprintf(out + at, sizeof out - at, "]");
    }
    if (got < 0) snprintf(out, sizeof out, "error: %s", err.msg);
    tg_csv_free(&c);
    free(buf);
    return out;
}

TG_TEST(test_csv_edges_exact_buffers) {
    static const struct {
        const char *in;
        const char *want;
    } cases[] = {
        {"\xEF\xBB\xBF", ""},                   /* the mark alone: no rows */
        {"\xEF\xBB\xBF\n", ""},
        {"\xEF\xBB\xBF" "a", "[a]"},
        {"\xEF\xBB\xBF\xEF\xBB\xBF", "[\xEF\xBB\xBF]"}, /* only the first is skipped */
        {"\r", "[\r]"},                         /* a CR not followed by LF is a byte of the field */
        {"a,b\r", "[a|b\r]"},
        {"a,b\r\n", "[a|b]"},
        {"\"a\"\r", "error: t.csv:1:4: unexpected byte 0x0d after the closing quote"},
        {"\"a\"\r\n\"\"", "[a][]"},
        {"\"\"", "[]"},
        {"\"\",\"\"", "[|]"},
        {"a,", "[a|]"},
        {",", "[|]"},
        {"\"a\" ", "error: t.csv:1:4: unexpected ' ' after the closing quote of a field (a quote inside a quoted field is "
                   "written as two quotes)"},
        {"\"a\"~", "error: t.csv:1:4: unexpected '~' after the closing quote"},
        {"\"a\"!", "error: t.csv:1:4: unexpected '!' after the closing quote"},
        {"\"a\"\x7F", "error: t.csv:1:4: unexpected byte 0x7f after the closing quote"},
        {"\"a\"\x1F", "error: t.csv:1:4: unexpected byte 0x1f after the closing quote"},
        {"\"a\"\xFF", "error: t.csv:1:4: unexpected byte 0xff after the closing quote"},
        {"x\n\"a\"b", "error: t.csv:2:4: unexpected 'b' after the closing quote"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *got = rows_of(cases[i].in, strlen(cases[i].in));
        const int is_error = !strncmp(cases[i].want, "error: ", 7);
        CHECK(is_error ? strstr(got, cases[i].want) == got : !strcmp(got, cases[i].want), "case %zu: got '%s', want '%s'",
              i, got, cases[i].want);
    }
}

/* An empty quoted field before any other quoted one: its pointer is an empty string, not
 * NULL (nothing was copied into the scratch buffer yet), and so for every empty quoted
 * field of the row. */
TG_TEST(test_csv_edges_empty_quoted_field_points_at_empty_string) {
    static const char text[] = "\"\",b,\"\"\n";
    tg_csv c;
    tg_err err = {{0}};
    tg_csv_init(&c, "t.csv", text, strlen(text), ',');
    REQUIRE(tg_csv_next(&c, &err) == 1, "%s", err.msg);
    CHECK(c.n_fields == 3, "%d fields", c.n_fields);
    for (int32_t i = 0; i < c.n_fields; i += 2)
        CHECK(c.fields[i].p && c.fields[i].len == 0 && c.fields[i].p[0] == 0, "field %d: %p, %zu bytes", i,
              (const void *)c.fields[i].p, c.fields[i].len);
    CHECK(tg_csv_next(&c, &err) == 0, "one row");
    tg_csv_free(&c);
}
