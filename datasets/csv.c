/* An RFC 4180 reader over a buffer. Quoted fields are copied into a scratch buffer with
 * their doubled quotes undone; unquoted ones point into the input. While a row is read a
 * quoted field is known by its scratch offset, since the scratch buffer may move as it
 * grows; its pointer is set when the row ends. */
#include "datasets/csv.h"
#include "base/alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FIELDS (1 << 20)

void tg_csv_init(tg_csv *c, const char *name, const char *buf, size_t len, char delim) {
    memset(c, 0, sizeof *c);
    c->name = name;
    c->buf = buf;
    c->len = len;
    c->delim = delim;
    c->line = 1;
    if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3)) c->pos = c->line_start = 3;
}

void tg_csv_free(tg_csv *c) {
    free(c->fields);
    free(c->scratch_at);
    free(c->scratch);
    memset(c, 0, sizeof *c);
}

static long long column(const tg_csv *c, size_t at) { return (long long)(at - c->line_start) + 1; }

/* A byte as a message shows it: printable ASCII as itself, else its code. */
static const char *shown(char ch, char *buf, size_t n) {
    unsigned char u = (unsigned char)ch;
    if (u >= 0x20 && u < 0x7F) snprintf(buf, n, "'%c'", ch);
    else snprintf(buf, n, "byte 0x%02x", u);
    return buf;
}

static int add_field(tg_csv *c, const char *p, size_t len, size_t scratch_at, tg_err *err) {
    if (c->n_fields == c->cap_fields) {
        if (c->cap_fields >= MAX_FIELDS)
            return tg_fail(err, "%s:%lld: more than %d fields in a row", c->name, (long long)c->row_line,
                           MAX_FIELDS);
        int32_t cap = c->cap_fields ? 2 * c->cap_fields : 16;
        tg_csv_field *f = tg_realloc(c->fields, (size_t)cap * sizeof *f);
        if (f) c->fields = f;
        size_t *q = tg_realloc(c->scratch_at, (size_t)cap * sizeof *q);
        if (q) c->scratch_at = q;
        if (!f || !q) return tg_fail(err, "%s: out of memory", c->name);
        c->cap_fields = cap;
    }
    c->fields[c->n_fields] = (tg_csv_field){p, len};
    c->scratch_at[c->n_fields++] = scratch_at;
    return 0;
}

static int scratch_put(tg_csv *c, const char *p, size_t n, tg_err *err) {
    if (c->scratch_len + n > c->scratch_cap) {
        size_t cap = c->scratch_cap ? c->scratch_cap : 256;
        while (cap < c->scratch_len + n) cap *= 2;
        char *s = tg_realloc(c->scratch, cap);
        if (!s) return tg_fail(err, "%s: out of memory", c->name);
        c->scratch = s;
        c->scratch_cap = cap;
    }
    if (n) memcpy(c->scratch + c->scratch_len, p, n);
    c->scratch_len += n;
    return 0;
}

/* Whether pos is at a row end (LF or CRLF); *skip is its length. */
static int at_row_end(const tg_csv *c, size_t pos, size_t *skip) {
    if (pos < c->len && c->buf[pos] == '\n') return *skip = 1, 1;
    if (pos + 1 < c->len && c->buf[pos] == '\r' && c->buf[pos + 1] == '\n') return *skip = 2, 1;
    return 0;
}

static void new_line(tg_csv *c, size_t next) {
    c->line++;
    c->line_start = next;
}

/* The quoted field whose opening quote is at c->pos, appended to scratch; pos ends after
 * the closing quote. */
static int quoted_field(tg_csv *c, size_t *at, size_t *n, tg_err *err) {
    const long long open_line = (long long)c->line, open_col = column(c, c->pos);
    *at = c->scratch_len;
    size_t i = c->pos + 1, run = i; /* run: the first byte not yet copied */
    for (;;) {
        if (i >= c->len)
            return tg_fail(err, "%s:%lld:%lld: unterminated quoted field (the quote opened here is never closed)",
                           c->name, open_line, open_col);
        char ch = c->buf[i];
        if (ch == '"') {
            if (i + 1 < c->len && c->buf[i + 1] == '"') { /* a doubled quote: keep one */
                if (scratch_put(c, c->buf + run, i + 1 - run, err)) return -1;
                i += 2;
                run = i;
                continue;
            }
            if (scratch_put(c, c->buf + run, i - run, err)) return -1;
            c->pos = i + 1;
            *n = c->scratch_len - *at;
            return 0;
        }
        if (ch == '\n') new_line(c, i + 1);
        i++;
    }
}

int tg_csv_next(tg_csv *c, tg_err *err) {
    c->n_fields = 0;
    c->scratch_len = 0;
    size_t skip;
    while (at_row_end(c, c->pos, &skip)) { /* empty lines between rows */
        c->pos += skip;
        new_line(c, c->pos);
    }
    if (c->pos >= c->len) return 0;
    c->row_line = c->line;
    for (;;) { /* c->pos < c->len on every round: the input's end breaks out */
        if (c->buf[c->pos] == '"') {
            size_t at = 0, n = 0;
            if (quoted_field(c, &at, &n, err) || add_field(c, NULL, n, at, err)) return -1;
            if (c->pos < c->len && c->buf[c->pos] != c->delim && !at_row_end(c, c->pos, &skip)) {
                char b[16];
                return tg_fail(err, "%s:%lld:%lld: unexpected %s after the closing quote of a field (a quote "
                                    "inside a quoted field is written as two quotes)",
                               c->name, (long long)c->line, column(c, c->pos), shown(c->buf[c->pos], b, sizeof b));
            }
        } else {
            size_t start = c->pos;
            while (c->pos < c->len && c->buf[c->pos] != c->delim && !at_row_end(c, c->pos, &skip)) {
                if (c->buf[c->pos] == '"')
                    return tg_fail(err, "%s:%lld:%lld: stray quote in an unquoted field (quote the whole field "
                                        "and write the quote twice)",
                                   c->name, (long long)c->line, column(c, c->pos));
                c->pos++;
            }
            if (add_field(c, c->buf + start, c->pos - start, SIZE_MAX, err)) return -1;
        }
        if (c->pos >= c->len) break;
        if (c->buf[c->pos] == c->delim) {
            c->pos++;
            if (c->pos >= c->len) { /* a delimiter ends the input: one more, empty, field */
                if (add_field(c, c->buf + c->pos, 0, SIZE_MAX, err)) return -1;
                break;
            }
            continue;
        }
        at_row_end(c, c->pos, &skip);
        c->pos += skip;
        new_line(c, c->pos);
        break;
    }
    for (int32_t i = 0; i < c->n_fields; i++)
        if (c->scratch_at[i] != SIZE_MAX) c->fields[i].p = c->scratch ? c->scratch + c->scratch_at[i] : "";
    return 1;
}
