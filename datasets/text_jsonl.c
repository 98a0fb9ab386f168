/* JSON Lines files of text to text rows: one object per line, fields by name (duplicate
 * keys refused). Text fields are strings; a label is a string or an integer, kept as its
 * decimal spelling so labels sort as numbers (datasets/labels.c). */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "base/json_strict.h"
#include "datasets/text_rows.h"
#include "datasets/utf8.h"

static int is_blank(const char *s, size_t n) { /* a line: its '\n' is not part of it */
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

/* The string field `key` of obj into *s, *n; -1 when it is absent or not a string. */
static int string_field(json_t *obj, const char *key, const char *what, const char *name, int64_t line, const char **s,
                        size_t *n, tg_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) return tg_fail(err, "%s:%lld: no \"%s\" field for the %s", name, (long long)line, key, what);
    if (json_typeof(v) != JSON_STRING)
        return tg_fail(err, "%s:%lld: \"%s\" (the %s) must be a string", name, (long long)line, key, what);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return 0;
}

static int read_line(const char *name, int64_t line, const char *text, size_t len, const tg_text_columns *cols,
                     int32_t source, tg_text_rows *rows, tg_err *err) {
    /* Checked before parsing, so --skip-invalid can pass over a line JSON would refuse. */
    int64_t bad = tg_utf8_invalid_at(text, len);
    if (bad >= 0) {
        if (cols->skip_invalid) {
            rows->skipped_invalid++;
            return 0;
        }
        return tg_fail(err, "%s:%lld: not valid UTF-8 (byte 0x%02x at column %lld; re-encode the file as UTF-8, or "
                            "pass --skip-invalid to leave such lines out)",
                       name, (long long)line, (unsigned char)text[bad], (long long)bad + 1);
    }
    json_error_t jerr;
    json_t *root = tg_json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && tg_json_out_of_memory(&jerr))
        return tg_fail(err, "%s:%lld: out of memory parsing the line", name, (long long)line);
    if (!root)
        return tg_fail(err, "%s:%lld: invalid JSON: %s (column %d)", name, (long long)line, jerr.text, jerr.column);
    int rc = -1;
    if (json_typeof(root) != JSON_OBJECT) {
        tg_fail(err, "%s:%lld: expected a JSON object like {\"%s\": \"...\"}", name, (long long)line, cols->text);
        goto done;
    }
    tg_text_fields f = {0};
    if (string_field(root, cols->text, "text", name, line, &f.text, &f.text_len, err) < 0) goto done;
    if (cols->pair && string_field(root, cols->pair, "pair text", name, line, &f.pair, &f.pair_len, err) < 0)
        goto done;
    char number[32];
    json_t *label = cols->label ? json_object_get(root, cols->label) : NULL;
    if (!label && cols->label && cols->label_required) {
        tg_fail(err, "%s:%lld: no \"%s\" field for the label", name, (long long)line, cols->label);
        goto done;
    }
    if (label) {
        if (json_typeof(label) == JSON_STRING) {
            f.label = json_string_value(label);
            f.label_len = json_string_length(label);
        } else if (json_typeof(label) == JSON_INTEGER) {
            snprintf(number, sizeof number, "%" JSON_INTEGER_FORMAT, json_integer_value(label));
            f.label = number;
            f.label_len = strlen(number);
        } else {
            tg_fail(err, "%s:%lld: \"%s\" (the label) must be a string or an integer", name, (long long)line,
                    cols->label);
            goto done;
        }
    }
    rc = tg_text_fields_add(rows, source, line, &f, cols, err);
done:
    json_decref(root);
    return rc;
}

int tg_text_read_jsonl(const char *name, const char *buf, size_t len, const tg_text_columns *cols,
                       tg_text_rows *rows, tg_err *err) {
    int32_t source;
    if (tg_text_rows_source(rows, name, &source, err)) return -1;
    int64_t line = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(buf + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - buf) : len;
        line++;
        if (!is_blank(buf + at, end - at) && read_line(name, line, buf + at, end - at, cols, source, rows, err))
            return -1;
        at = end + 1;
    }
    return 0;
}
