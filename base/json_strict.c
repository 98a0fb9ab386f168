#include "base/json_strict.h"

#include <stdio.h>
#include <string.h>

/* jansson stops just past the repeated key's closing quote: walk back to its opening
 * quote (a quote inside the key is escaped, so it follows an odd run of backslashes) and
 * decode the token, escapes and all, as a JSON string. */
static void repeated_key(const char *text, size_t len, size_t end, char *out, size_t cap) {
    out[0] = 0;
    if (end < 2 || end > len || text[end - 1] != '"') return;
    for (size_t i = end - 1; i-- > 0;) {
        if (text[i] != '"') continue;
        size_t slashes = 0;
        while (slashes < i && text[i - 1 - slashes] == '\\') slashes++;
        if (slashes % 2) continue;
        json_t *s = json_loadb(text + i, end - i, JSON_DECODE_ANY, NULL);
        if (json_is_string(s)) snprintf(out, cap, "%s", json_string_value(s));
        json_decref(s);
        /* Messages are one line: control characters in the key show as '?'. */
        for (char *c = out; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
        return;
    }
}

json_t *tg_json_loadb_strict(const char *text, size_t len, size_t flags, json_error_t *jerr, char *dup_key,
                             size_t cap) {
    dup_key[0] = 0;
    json_t *root = json_loadb(text, len, flags | JSON_REJECT_DUPLICATES, jerr);
    if (!root && json_error_code(jerr) == json_error_duplicate_key) {
        repeated_key(text, len, (size_t)jerr->position, dup_key, cap);
        if (!dup_key[0]) snprintf(dup_key, cap, "?");
    }
    return root;
}
