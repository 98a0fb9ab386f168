#include "base/json_strict.h"
#include "base/alloc.h"

#include <stdio.h>
#include <string.h>

/* jansson stops just past the repeated key's closing quote: walk back to its opening
 * quote (a quote inside the key is escaped, so it follows an odd run of backslashes) and
 * decode the token, escapes and all, as a JSON string. */
static void repeated_key(const char *text, size_t len, size_t end, char *out, size_t cap) {
    out[0] = 0;
    /* GCOVR_EXCL_BR_START: jansson's position for a repeated key is just past the key's
     * closing quote, inside an object that opened before it, and that token decodes as a
     * string; these guards keep a different position from reading outside the text. */
    if (end < 2 || end > len || text[end - 1] != '"') return;
    for (size_t i = end - 1; i-- > 0;) {
        if (text[i] != '"') continue;
        size_t slashes = 0;
        while (slashes < i && text[i - 1 - slashes] == '\\') slashes++;
        if (slashes % 2) continue;
        json_t *s = json_loadb(text + i, end - i, JSON_DECODE_ANY, NULL);
        if (json_is_string(s)) snprintf(out, cap, "%s", json_string_value(s));
        /* GCOVR_EXCL_BR_STOP */
        json_decref(s);
        /* Messages are one line: control characters in the key show as '?'. */
        for (char *c = out; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
        return;
    }
}

/* A parse during which an allocation failed is an out-of-memory failure, even one that
 * returned a document: jansson's lexer ignores a failed growth of its token buffer and goes
 * on with the characters it could not store dropped (a key cut short). */
static json_t *oom_checked(json_t *root, long failures_before, json_error_t *jerr) {
    if (tg_alloc_failures() == failures_before) return root;
    json_decref(root);
    snprintf(jerr->text, sizeof jerr->text, "out of memory");
    jerr->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory; /* where json_error_code reads */
    return NULL;
}

json_t *tg_json_loadb(const char *text, size_t len, size_t flags, json_error_t *jerr) {
    const long before = tg_alloc_failures();
    return oom_checked(json_loadb(text, len, flags, jerr), before, jerr);
}

json_t *tg_json_load_file(const char *path, size_t flags, json_error_t *jerr) {
    const long before = tg_alloc_failures();
    return oom_checked(json_load_file(path, flags, jerr), before, jerr);
}

json_t *tg_json_loadb_strict(const char *text, size_t len, size_t flags, json_error_t *jerr, char *dup_key,
                             size_t cap) {
    dup_key[0] = 0;
    json_t *root = tg_json_loadb(text, len, flags | JSON_REJECT_DUPLICATES, jerr);
    if (!root && json_error_code(jerr) == json_error_duplicate_key) {
        repeated_key(text, len, (size_t)jerr->position, dup_key, cap);
        if (!dup_key[0]) snprintf(dup_key, cap, "?"); /* GCOVR_EXCL_BR_LINE: found always, as above */
    }
    return root;
}
