/* Alpaca records (JSON Lines or one JSON array) to text rows, and prompt templates
 * (datasets/instruct.h). */
#include "datasets/instruct.h"
#include "base/alloc.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_strict.h"
#include "datasets/utf8.h"

const char tg_alpaca_prompt_input[] =
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
    "response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}"
    "\n\n### Response:\n{output}";
const char tg_alpaca_prompt_no_input[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n{output}";

/* ---- records ------------------------------------------------------------------------- */

static const char *const field_names[3] = {"instruction", "input", "output"};
static const char *const left_alone[] = {"id", "text", "source", "category", NULL};

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null"; /* a string is never asked about: it is what a field must be */
    }
}

/* One record's JSON text (a line, or an element of an array starting at column col0 of
 * `line`; element is 1 + its index, 0 for a line) into a row. */
static int read_record(const char *name, int64_t line, int64_t col0, int64_t element, const char *text, size_t len,
                       int skip_invalid, int32_t source, tg_text_rows *rows, tg_err *err) {
    char where[600];
    const tg_text_row at = {.source = source, .line = line, .element = element};
    tg_text_rows_where(rows, &at, where, sizeof where);
    const int64_t bad = tg_utf8_invalid_at(text, len);
    if (bad >= 0) {
        if (skip_invalid) {
            rows->skipped_invalid++;
            return 0;
        }
        return tg_fail(err, "%s: not valid UTF-8 (byte 0x%02x at byte %lld of the record; re-encode the file as UTF-8, "
                            "or pass --skip-invalid to leave such records out)",
                       where, (unsigned char)text[bad], (long long)bad);
    }
    json_error_t jerr;
    char dup[128];
    json_t *root = tg_json_loadb_strict(text, len, JSON_PRESERVE_ORDER, &jerr, dup, sizeof dup);
    if (!root && tg_json_out_of_memory(&jerr)) return tg_fail(err, "%s: out of memory parsing the record", where);
    if (!root && dup[0]) return tg_fail(err, "%s: key \"%s\" appears twice in one object", where, dup);
    if (!root) {
        const long long col = (jerr.line == 1 ? col0 : 0) + jerr.column;
        if (element) return tg_fail(err, "%s: invalid JSON: %s (line %lld, column %lld)", where, jerr.text,
                                    (long long)(line + jerr.line - 1), col);
        return tg_fail(err, "%s: invalid JSON: %s (column %lld)", where, jerr.text, col);
    }
    int rc = -1;
    if (json_typeof(root) != JSON_OBJECT) { /* an array: the parser takes nothing else at the top */
        tg_fail(err, "%s: expected a JSON object like {\"instruction\": \"...\", \"input\": \"...\", \"output\": "
                     "\"...\"}, not an array",
                where);
        goto done;
    }
    const char *f[3] = {NULL, NULL, NULL};
    size_t n[3] = {0, 0, 0};
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        int k = 0;
        while (k < 3 && strcmp(key, field_names[k])) k++;
        if (k == 3) {
            int j = 0;
            while (left_alone[j] && strcmp(key, left_alone[j])) j++;
            if (left_alone[j]) continue;
            tg_fail(err, "%s: unknown field \"%.60s\" (a record has \"instruction\", \"input\" and \"output\"; \"id\", "
                         "\"text\", \"source\" and \"category\" are left alone)",
                    where, key);
            goto done;
        }
        if (k == 1 && json_is_null(v)) continue;
        if (!json_is_string(v)) {
            tg_fail(err, "%s: \"%s\" must be a string%s, not %s", where, key, k == 1 ? " or null" : "", type_name(v));
            goto done;
        }
        f[k] = json_string_value(v);
        n[k] = json_string_length(v);
    }
    if (!f[0] || !f[2]) {
        tg_fail(err, "%s: no \"%s\" field (a record has \"instruction\", \"output\" and, optionally, \"input\")", where,
                f[0] ? "output" : "instruction");
        goto done;
    }
    if (n[0] == 0) {
        tg_fail(err, "%s: \"instruction\" is empty", where);
        goto done;
    }
    /* An empty input is none, as Alpaca's training code takes it. */
    rc = tg_text_rows_add(rows, source, line, f[0], n[0], n[1] ? f[1] : NULL, n[1], f[2], n[2], err);
    if (!rc) rows->rows[rows->n - 1].element = element;
done:
    json_decref(root);
    return rc;
}

static int read_lines(const char *name, const char *buf, size_t len, size_t at, int skip_invalid, int32_t source,
                      tg_text_rows *rows, tg_err *err) {
    int64_t line = 0;
    while (at < len) {
        const char *nl = memchr(buf + at, '\n', len - at);
        const size_t end = nl ? (size_t)(nl - buf) : len;
        line++;
        size_t k = at;
        while (k < end && is_blank(buf[k])) k++;
        if (k < end && read_record(name, line, 0, 0, buf + at, end - at, skip_invalid, source, rows, err)) return -1;
        at = end + 1;
    }
    return 0;
}

/* The end of the object that starts at b[at] ('{'), just past its closing brace, found
 * without parsing it (brackets counted outside strings; the parser checks the rest); 0
 * when the text ends inside it. */
static size_t object_end(const char *b, size_t len, size_t at) {
    int64_t depth = 0;
    int in_string = 0;
    for (size_t i = at; i < len; i++) {
        const char c = b[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if ((c == '}' || c == ']') && --depth == 0) {
            return i + 1;
        }
    }
    return 0;
}

/* Moves *line and *line_start (where the line begins) forward over b[*from..to). */
static void count_lines(const char *b, size_t to, size_t *from, int64_t *line, size_t *line_start) {
    for (size_t i = *from; i < to; i++)
        if (b[i] == '\n') (*line)++, *line_start = i + 1;
    *from = to;
}

static size_t skip_blanks(const char *b, size_t len, size_t at) {
    while (at < len && is_blank(b[at])) at++;
    return at;
}

/* A JSON array of records, b[at] being its '['. Each element is cut out and read as a
 * line of JSON Lines would be, so a message names its index and line. */
static int read_array(const char *name, const char *b, size_t len, size_t at, int skip_invalid, int32_t source,
                      tg_text_rows *rows, tg_err *err) {
    int64_t line = 1;
    size_t counted = 0, line_start = 0;
    at++;
    for (int64_t k = 0;; k++) {
        at = skip_blanks(b, len, at);
        count_lines(b, at, &counted, &line, &line_start);
        if (at == len) return tg_fail(err, "%s:%lld: the file ends inside the array (no closing ']')", name, (long long)line);
        if (k == 0 && b[at] == ']') break;
        if (b[at] != '{')
            return tg_fail(err, "%s: record %lld (line %lld): expected a JSON object like {\"instruction\": \"...\", "
                                "\"output\": \"...\"}%s",
                           name, (long long)k, (long long)line, b[at] == ']' ? " after the ',' (a trailing comma)" : "");
        const size_t end = object_end(b, len, at);
        if (!end)
            return tg_fail(err, "%s: record %lld (line %lld): the file ends inside the record", name, (long long)k,
                           (long long)line);
        if (read_record(name, line, (int64_t)(at - line_start), k + 1, b + at, end - at, skip_invalid, source, rows,
                        err))
            return -1;
        at = skip_blanks(b, len, end);
        count_lines(b, at, &counted, &line, &line_start);
        if (at < len && b[at] == ',') {
            at++;
            continue;
        }
        if (at < len && b[at] == ']') break;
        return tg_fail(err, "%s:%lld: expected ',' or ']' after record %lld", name, (long long)line, (long long)k);
    }
    at = skip_blanks(b, len, at + 1);
    count_lines(b, at, &counted, &line, &line_start);
    if (at < len) return tg_fail(err, "%s:%lld: text after the array's closing ']'", name, (long long)line);
    return 0;
}

int tg_text_read_instruct(const char *name, const char *buf, size_t len, int skip_invalid, tg_text_rows *rows,
                          tg_err *err) {
    int32_t source;
    if (tg_text_rows_source(rows, name, &source, err)) return -1;
    const size_t at = len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3) ? 3 : 0;
    const size_t first = skip_blanks(buf, len, at);
    if (first < len && buf[first] == '[') return read_array(name, buf, len, first, skip_invalid, source, rows, err);
    return read_lines(name, buf, len, at, skip_invalid, source, rows, err);
}

/* ---- templates ----------------------------------------------------------------------- */

enum { PIECE_TEXT = -1, PIECE_INSTRUCTION = 0, PIECE_INPUT = 1, PIECE_OUTPUT = 2, PIECE_BAD = 3 };

/* The piece of template t[at..len): a placeholder, a run of text (*from, *n: its bytes; one
 * brace for {{ or }}), or a brace that is neither. *next is past it. */
static int next_piece(const char *t, size_t len, size_t at, size_t *from, size_t *n, size_t *next) {
    const char c = t[at];
    if (c == '{' || c == '}') {
        if (at + 1 < len && t[at + 1] == c) {
            *from = at, *n = 1, *next = at + 2;
            return PIECE_TEXT;
        }
        for (int k = 0; c == '{' && k < 3; k++) {
            const size_t nl = strlen(field_names[k]);
            if (len - at >= nl + 2 && !memcmp(t + at + 1, field_names[k], nl) && t[at + 1 + nl] == '}') {
                *next = at + nl + 2;
                return k;
            }
        }
        return PIECE_BAD;
    }
    size_t e = at;
    while (e < len && t[e] != '{' && t[e] != '}') e++;
    *from = at, *n = e - at, *next = e;
    return PIECE_TEXT;
}

int tg_instruct_template_check(const char *name, const char *text, size_t len, tg_instruct_template *t,
                               tg_err *err) {
    const int64_t bad = tg_utf8_invalid_at(text, len);
    if (bad >= 0)
        return tg_fail(err, "%s: byte %lld: not valid UTF-8 (0x%02x)", name, (long long)bad,
                       (unsigned char)text[bad]);
    const char *nul = memchr(text, 0, len);
    if (nul) return tg_fail(err, "%s: byte %lld: a NUL byte", name, (long long)(nul - text));
    int count[3] = {0, 0, 0};
    size_t from, n, next;
    for (size_t at = 0; at < len; at = next) {
        const int kind = next_piece(text, len, at, &from, &n, &next);
        if (kind == PIECE_BAD)
            return tg_fail(err, "%s: byte %lld: a '%c' that is no placeholder (there are {instruction}, {input} and "
                                "{output}; write {{ and }} for braces)",
                           name, (long long)at, text[at]);
        if (kind != PIECE_TEXT && ++count[kind] > 1)
            return tg_fail(err, "%s: byte %lld: a second {%s}", name, (long long)at, field_names[kind]);
        if (kind != PIECE_TEXT && kind != PIECE_OUTPUT && count[PIECE_OUTPUT])
            return tg_fail(err, "%s: byte %lld: {%s} after {output} (the prompt comes before the response)", name,
                           (long long)at, field_names[kind]);
    }
    if (!count[PIECE_INSTRUCTION]) return tg_fail(err, "%s: no {instruction}", name);
    if (!count[PIECE_OUTPUT]) return tg_fail(err, "%s: no {output} (where the response goes)", name);
    *t = (tg_instruct_template){.text = text, .len = len, .has_input = count[PIECE_INPUT]};
    return 0;
}

static int put(tg_instruct_text *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = tg_realloc(b->s, cap);
        if (!p) return -1;
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

int tg_instruct_render(const tg_instruct_template *t, const char *instruction, size_t instruction_len,
                       const char *input, size_t input_len, const char *output, size_t output_len,
                       tg_instruct_text *prompt, tg_instruct_text *response, tg_err *err) {
    prompt->n = response->n = 0;
    tg_instruct_text *to = prompt;
    int rc = put(prompt, "", 0) || put(response, "", 0);
    size_t from, n, next;
    for (size_t at = 0; at < t->len && !rc; at = next) {
        const int kind = next_piece(t->text, t->len, at, &from, &n, &next); /* never PIECE_BAD: checked */
        if (kind == PIECE_TEXT) rc = put(to, t->text + from, n);
        else if (kind == PIECE_INSTRUCTION) rc = put(to, instruction, instruction_len);
        else if (kind == PIECE_INPUT) rc = put(to, input ? input : "", input ? input_len : 0);
        else {
            to = response;
            rc = put(to, output, output_len);
        }
    }
    if (rc) return tg_fail(err, "out of memory for a prompt of %zu bytes", prompt->n + response->n);
    return 0;
}

void tg_instruct_text_free(tg_instruct_text *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}
