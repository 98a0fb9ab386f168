/* CSV and TSV rows as RFC 4180 writes them: fields separated by a delimiter (',' or '\t'),
 * rows ended by CRLF or LF, a field in double quotes may hold delimiters, line breaks and
 * quotes written twice (""). A quote inside an unquoted field, or anything but a delimiter
 * or a line end after a closing quote, is an error, as is a quote never closed. A UTF-8
 * byte-order mark before the first row is skipped, and so are empty lines between rows.
 * The parser reads a buffer in memory; errors name the file, line and column (1-based,
 * columns in bytes). */
#ifndef TUNEGRAPH_CSV_H
#define TUNEGRAPH_CSV_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct tg_csv_field {
    const char *p; /* into the buffer, or into the parser's scratch when it had quotes */
    size_t len;
} tg_csv_field;

typedef struct tg_csv {
    const char *name, *buf;
    size_t len, pos;
    char delim;
    int64_t line;          /* the line pos is on */
    size_t line_start;     /* the offset where that line begins */
    int64_t row_line;      /* the line the last row read began on */
    tg_csv_field *fields;  /* the last row read */
    int32_t n_fields, cap_fields;
    size_t *scratch_at;    /* per field while a row is read: its offset in scratch, or
                              SIZE_MAX for a field that points into the buffer */
    char *scratch;         /* unquoted copies of the row's quoted fields */
    size_t scratch_len, scratch_cap;
} tg_csv;

void tg_csv_init(tg_csv *c, const char *name, const char *buf, size_t len, char delim);
/* Reads the next row into c->fields: 1 for a row, 0 at the end of the input, -1 on error. */
int tg_csv_next(tg_csv *c, tg_err *err);
void tg_csv_free(tg_csv *c);

#endif
