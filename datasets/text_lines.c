/* Plain text files to text rows for language modelling: one row per line (LF or CRLF;
 * the line end is not part of the row), blank lines left out. */
#include <string.h>

#include "datasets/text_rows.h"

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return 0;
    return 1;
}

int tg_text_read_lines(const char *name, const char *buf, size_t len, int skip_invalid, tg_text_rows *rows,
                       tg_err *err) {
    int32_t source;
    if (tg_text_rows_source(rows, name, &source, err)) return -1;
    const tg_text_columns cols = {.text = "text", .skip_invalid = skip_invalid};
    size_t at = 0;
    if (len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3)) at = 3;
    int64_t line = 0;
    while (at < len) {
        const char *nl = memchr(buf + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - buf) : len, text_end = end;
        if (text_end > at && buf[text_end - 1] == '\r') text_end--;
        line++;
        if (!is_blank(buf + at, text_end - at)) {
            tg_text_fields f = {.text = buf + at, .text_len = text_end - at};
            if (tg_text_fields_add(rows, source, line, &f, &cols, err)) return -1;
        }
        at = end + 1;
    }
    return 0;
}
