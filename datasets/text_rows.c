#include "datasets/text_rows.h"
#include "base/alloc.h"

#include "datasets/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int arena_put(tg_text_rows *r, const char *p, size_t n, int64_t *off, tg_err *err) {
    /* GCOVR_EXCL_BR_START: n and the arena are text in memory, far below INT64_MAX / 4 */
    if ((uint64_t)n > (uint64_t)INT64_MAX / 4) return tg_fail(err, "text too large");
    /* GCOVR_EXCL_BR_STOP */
    if (r->n_bytes + (int64_t)n + 1 > r->cap_bytes) {
        int64_t cap = r->cap_bytes ? r->cap_bytes : 65536;
        while (cap < r->n_bytes + (int64_t)n + 1) {
            /* GCOVR_EXCL_BR_START: the arena is text in memory, far below INT64_MAX / 2 */
            if (cap > INT64_MAX / 2) return tg_fail(err, "text too large");
            /* GCOVR_EXCL_BR_STOP */
            cap *= 2;
        }
        char *b = tg_realloc(r->bytes, (size_t)cap);
        if (!b) return tg_fail(err, "out of memory for %lld bytes of text", (long long)cap);
        r->bytes = b;
        r->cap_bytes = cap;
    }
    *off = r->n_bytes;
    if (n) memcpy(r->bytes + r->n_bytes, p, n);
    r->bytes[r->n_bytes + (int64_t)n] = 0; /* labels are compared and printed as C strings */
    r->n_bytes += (int64_t)n + 1;
    return 0;
}

int tg_text_rows_source(tg_text_rows *r, const char *name, int32_t *index, tg_err *err) {
    if (r->n_sources == r->cap_sources) {
        /* GCOVR_EXCL_BR_START: 2^30 input file names outgrow memory first */
        if (r->cap_sources >= INT32_MAX / 2) return tg_fail(err, "too many input files");
        /* GCOVR_EXCL_BR_STOP */
        int32_t cap = r->cap_sources ? 2 * r->cap_sources : 8;
        char **s = tg_realloc(r->sources, (size_t)cap * sizeof *s);
        if (!s) return tg_fail(err, "out of memory adding input file %s", name);
        r->sources = s;
        r->cap_sources = cap;
    }
    char *copy = tg_strdup(name);
    if (!copy) return tg_fail(err, "out of memory adding input file %s", name);
    r->sources[r->n_sources] = copy;
    *index = r->n_sources++;
    return 0;
}

int tg_text_rows_add(tg_text_rows *r, int32_t source, int64_t line, const char *text, size_t text_len,
                     const char *pair, size_t pair_len, const char *label, size_t label_len, tg_err *err) {
    if (r->n == r->cap) {
        /* GCOVR_EXCL_BR_START: rows of text in memory are far fewer */
        if (r->cap > INT64_MAX / 2 / (int64_t)sizeof(tg_text_row)) return tg_fail(err, "too many rows");
        /* GCOVR_EXCL_BR_STOP */
        int64_t cap = r->cap ? 2 * r->cap : 1024;
        tg_text_row *rows = tg_realloc(r->rows, (size_t)cap * sizeof *rows);
        if (!rows) return tg_fail(err, "out of memory for %lld rows", (long long)cap);
        r->rows = rows;
        r->cap = cap;
    }
    tg_text_row row = {.pair = -1, .label = -1, .text_len = (int64_t)text_len, .source = source, .line = line};
    if (arena_put(r, text, text_len, &row.text, err)) return -1;
    if (pair) {
        if (arena_put(r, pair, pair_len, &row.pair, err)) return -1;
        row.pair_len = (int64_t)pair_len;
    }
    if (label) {
        if (arena_put(r, label, label_len, &row.label, err)) return -1;
        row.label_len = (int64_t)label_len;
    }
    r->rows[r->n++] = row;
    return 0;
}

/* 0 when s[0..n) is UTF-8; else fills err with "WHERE: column 'NAME' is not UTF-8 ...". */
static int check_utf8(const char *where, const char *column, const char *s, size_t n, int skippable, tg_err *err) {
    int64_t bad = tg_utf8_invalid_at(s, n);
    if (bad < 0) return 0;
    return tg_fail(err, "%s: column '%s' is not valid UTF-8 (byte 0x%02x at offset %lld of the field; re-encode the "
                        "file as UTF-8%s)",
                   where, column, (unsigned char)s[bad], (long long)bad,
                   skippable ? ", or pass --skip-invalid to leave such rows out" : "");
}

int tg_text_fields_add(tg_text_rows *rows, int32_t source, int64_t line, const tg_text_fields *f,
                       const tg_text_columns *cols, tg_err *err) {
    char where[512];
    tg_text_row at = {.source = source, .line = line};
    tg_text_rows_where(rows, &at, where, sizeof where);
    tg_err ignored;
    tg_err *text_err = cols->skip_invalid ? &ignored : err;
    if (check_utf8(where, cols->text, f->text, f->text_len, 1, text_err) ||
        (f->pair && check_utf8(where, cols->pair, f->pair, f->pair_len, 1, text_err))) {
        if (!cols->skip_invalid) return -1;
        rows->skipped_invalid++;
        return 0;
    }
    if (f->label) {
        if (f->label_len == 0) return tg_fail(err, "%s: the label ('%s') is empty", where, cols->label);
        if (memchr(f->label, 0, f->label_len))
            return tg_fail(err, "%s: the label ('%s') holds a NUL byte", where, cols->label);
        if (check_utf8(where, cols->label, f->label, f->label_len, 0, err)) return -1;
    }
    return tg_text_rows_add(rows, source, line, f->text, f->text_len, f->pair, f->pair_len, f->label, f->label_len,
                            err);
}

void tg_text_rows_where(const tg_text_rows *r, const tg_text_row *row, char *buf, size_t n) {
    const char *src = row->source >= 0 && row->source < r->n_sources ? r->sources[row->source] : "input";
    if (row->element > 0)
        snprintf(buf, n, "%s: record %lld (line %lld)", src, (long long)row->element - 1, (long long)row->line);
    else if (row->line > 0) snprintf(buf, n, "%s:%lld", src, (long long)row->line);
    else snprintf(buf, n, "%s", src);
}

void tg_text_rows_free(tg_text_rows *r) {
    free(r->bytes);
    free(r->rows);
    for (int32_t i = 0; i < r->n_sources; i++) free(r->sources[i]);
    free(r->sources);
    memset(r, 0, sizeof *r);
}
