/* CSV and TSV files to text rows: the header row names the columns, each later row gives
 * one text row. A row with another number of fields than the header is an error, as are
 * duplicate column names and a named column the header lacks. */
#include <stdio.h>
#include <string.h>

#include "datasets/csv.h"
#include "datasets/text_rows.h"

/* The index of the header column `name`, or -1. */
static int32_t column_index(const tg_csv *c, const char *name) {
    size_t n = strlen(name);
    for (int32_t i = 0; i < c->n_fields; i++)
        if (c->fields[i].len == n && !memcmp(c->fields[i].p, name, n)) return i;
    return -1;
}

/* The header's names, quoted and comma-separated, for "no column X (the header has ...)". */
static void header_names(const tg_csv *c, char *buf, size_t n) {
    size_t at = 0;
    buf[0] = 0;
    for (int32_t i = 0; i < c->n_fields && at + 8 < n; i++) {
        /* A name cut short by the end of buf moves `at` past it, which ends the loop. */
        at += (size_t)snprintf(buf + at, n - at, "%s'%.*s'", i ? ", " : "",
                               (int)(c->fields[i].len > 40 ? 40 : c->fields[i].len), c->fields[i].p);
    }
}

int tg_text_read_csv(const char *name, const char *buf, size_t len, char delim, const tg_text_columns *cols,
                     tg_text_rows *rows, tg_err *err) {
    tg_csv c;
    tg_csv_init(&c, name, buf, len, delim);
    int32_t source;
    int rc = tg_text_rows_source(rows, name, &source, err);
    if (!rc) {
        rc = tg_csv_next(&c, err);
        if (rc == 0) rc = tg_fail(err, "%s: empty file (a header row naming the columns comes first)", name);
        else if (rc == 1) rc = 0;
    }
    int32_t n_cols = 0, text_col = -1, pair_col = -1, label_col = -1;
    char names[512];
    if (!rc) {
        n_cols = c.n_fields;
        header_names(&c, names, sizeof names);
        for (int32_t i = 0; i < n_cols && !rc; i++)
            for (int32_t j = 0; j < i && !rc; j++)
                if (c.fields[i].len == c.fields[j].len && !memcmp(c.fields[i].p, c.fields[j].p, c.fields[i].len))
                    rc = tg_fail(err, "%s:%lld: the header names column '%.*s' twice (columns %d and %d)", name,
                                 (long long)c.row_line, (int)(c.fields[i].len > 80 ? 80 : c.fields[i].len),
                                 c.fields[i].p, j + 1, i + 1);
    }
    if (!rc) {
        text_col = column_index(&c, cols->text);
        if (text_col < 0)
            rc = tg_fail(err, "%s: no column '%s' for the text (the header has %s; --text-column names another)",
                         name, cols->text, names);
    }
    if (!rc && cols->pair && (pair_col = column_index(&c, cols->pair)) < 0)
        rc = tg_fail(err, "%s: no column '%s' for the pair text (the header has %s)", name, cols->pair, names);
    if (!rc && cols->label) {
        label_col = column_index(&c, cols->label);
        if (label_col < 0 && cols->label_required)
            rc = tg_fail(err, "%s: no column '%s' for the label (the header has %s)", name, cols->label, names);
    }
    while (!rc) {
        int got = tg_csv_next(&c, err);
        if (got <= 0) {
            rc = got;
            break;
        }
        if (c.n_fields != n_cols) {
            rc = tg_fail(err, "%s:%lld: row has %d field%s, the header has %d (a field holding %s or a line break "
                              "must be quoted)",
                         name, (long long)c.row_line, c.n_fields, c.n_fields == 1 ? "" : "s", n_cols,
                         delim == '\t' ? "a tab" : delim == ',' ? "a comma" : "the delimiter");
            break;
        }
        const tg_csv_field *t = &c.fields[text_col];
        const tg_csv_field *p = pair_col >= 0 ? &c.fields[pair_col] : NULL;
        const tg_csv_field *l = label_col >= 0 ? &c.fields[label_col] : NULL;
        tg_text_fields f = {.text = t->p, .text_len = t->len, .pair = p ? p->p : NULL, .pair_len = p ? p->len : 0,
                            .label = l ? l->p : NULL, .label_len = l ? l->len : 0};
        rc = tg_text_fields_add(rows, source, c.row_line, &f, cols, err);
    }
    tg_csv_free(&c);
    return rc < 0 ? -1 : 0;
}
