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

/* json_loadb and json_load_file, except that a parse during which an allocation failed
 * (base/alloc.h; jansson reports one as a syntax error, or with no message) fails with
 * jerr's code json_error_out_of_memory and text "out of memory": see tg_json_out_of_memory. */
json_t *tg_json_loadb(const char *text, size_t len, size_t flags, json_error_t *jerr);
json_t *tg_json_load_file(const char *path, size_t flags, json_error_t *jerr);

/* Whether a failed parse ran out of memory (the caller then says so, not "invalid JSON"). */
static inline int tg_json_out_of_memory(const json_error_t *jerr) {
    return json_error_code(jerr) == json_error_out_of_memory;
}

/* Building JSON: json_object_set_new and json_array_append_new fail only out of memory (or
 * when given the NULL of a constructor that ran out) and then drop the entry silently; these
 * record the failure in *failed, so that a writer refuses once at the end instead of writing
 * a document with a field missing. */
static inline void tg_json_put(json_t *obj, const char *key, json_t *v, int *failed) {
    if (json_object_set_new(obj, key, v)) *failed = 1;
}
static inline void tg_json_push(json_t *arr, json_t *v, int *failed) {
    if (json_array_append_new(arr, v)) *failed = 1;
}

#endif
