/* Labelled text read from the inputs of `data convert`, before tokenizing: each row a text,
 * an optional pair text and an optional label name, and where it came from (file and
 * line) for messages. The bytes live in one growing arena; rows hold offsets into it.
 * Instruction records (datasets/instruct.h) are rows too: the text is the instruction,
 * the pair the input (absent when empty), the label the output. */
#ifndef TUNEGRAPH_TEXT_ROWS_H
#define TUNEGRAPH_TEXT_ROWS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct tg_text_row {
    int64_t text, pair, label;          /* arena offsets; pair and label -1 when absent */
    int64_t text_len, pair_len, label_len;
    int32_t source;                     /* index into sources */
    int64_t line;                       /* 1-based line in the source; 0: the whole file */
    int64_t element;                    /* 1 + the row's index in a JSON array; 0: none */
} tg_text_row;

typedef struct tg_text_rows {
    char *bytes;
    int64_t n_bytes, cap_bytes;
    tg_text_row *rows;
    int64_t n, cap;
    char **sources;
    int32_t n_sources, cap_sources;
    int64_t skipped_invalid;            /* rows or files left out as not UTF-8 (--skip-invalid) */
} tg_text_rows;

/* Column names for the tabular readers (CSV, TSV, JSONL). */
typedef struct tg_text_columns {
    const char *text;       /* the text column */
    const char *pair;       /* the second text of a pair, or NULL */
    const char *label;      /* the label column */
    int label_required;     /* 1: `label` was named, so every row must have it; 0: the
                               rows have labels when the input has that column */
    int skip_invalid;       /* leave out rows whose text is not UTF-8, counting them */
} tg_text_columns;

/* Appends a source name; its index is *index. */
int tg_text_rows_source(tg_text_rows *r, const char *name, int32_t *index, tg_err *err);
/* Appends a row; pair and label may be NULL. */
int tg_text_rows_add(tg_text_rows *r, int32_t source, int64_t line, const char *text, size_t text_len,
                     const char *pair, size_t pair_len, const char *label, size_t label_len, tg_err *err);
static inline const char *tg_text_rows_at(const tg_text_rows *r, int64_t off) { return r->bytes + off; }
/* "file:line" or "file" of a row, for messages; "file: record K (line L)" for the
 * element K (0-based) of a JSON array. */
void tg_text_rows_where(const tg_text_rows *r, const tg_text_row *row, char *buf, size_t n);
void tg_text_rows_free(tg_text_rows *r);

/* One row's fields as a reader found them (pair and label NULL when absent). */
typedef struct tg_text_fields {
    const char *text, *pair, *label;
    size_t text_len, pair_len, label_len;
} tg_text_fields;

/* Checks a reader's row and appends it: text and pair must be UTF-8 (else an error naming
 * where and the column, or, with cols->skip_invalid, the row is counted and left out); a
 * label must be a non-empty UTF-8 name without NUL bytes. `where` is "file:line". */
int tg_text_fields_add(tg_text_rows *rows, int32_t source, int64_t line, const tg_text_fields *f,
                       const tg_text_columns *cols, tg_err *err);

/* The readers, each appending to rows. Buffers are whole files (NUL after the last
 * byte), `name` the file's name in messages. CSV/TSV: the first row names the columns.
 * JSONL: one object per line, string fields; a label may be a string or an integer.
 * Text: one row per line (LF or CRLF), blank lines left out. Folders: a root whose
 * folders name the labels, each file in them one row (hidden files left out). */
int tg_text_read_csv(const char *name, const char *buf, size_t len, char delim, const tg_text_columns *cols,
                     tg_text_rows *rows, tg_err *err);
int tg_text_read_jsonl(const char *name, const char *buf, size_t len, const tg_text_columns *cols,
                       tg_text_rows *rows, tg_err *err);
int tg_text_read_lines(const char *name, const char *buf, size_t len, int skip_invalid, tg_text_rows *rows,
                       tg_err *err);
int tg_text_read_folders(const char *root, int skip_invalid, tg_text_rows *rows, tg_err *err);

#endif
