/* JSON parsed strictly: an object that names a key twice is refused (jansson would keep
 * the last value), and the refusal names the key, which jansson's own message does only
 * for short keys. config.json, safetensors headers and JSON Lines rows all read this way. */
#ifndef TUNEGRAPH_JSON_STRICT_H
#define TUNEGRAPH_JSON_STRICT_H

#include <jansson.h>
#include <stddef.h>

/* Parses text[0..len) (flags as json_loadb's, JSON_REJECT_DUPLICATES added). On failure
 * returns NULL with jerr filled as jansson fills it, and dup_key (cap bytes, cap > 0)
 * holds the repeated key, cut to fit, when that was the failure, else "". */
json_t *tg_json_loadb_strict(const char *text, size_t len, size_t flags, json_error_t *jerr, char *dup_key,
                             size_t cap);

#endif
