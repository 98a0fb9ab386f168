/* Reading an artifact's manifest.json (cli/artifact_manifest.h). */
#include "cli/artifact_manifest.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json_strict.h"

void artifact_manifest_free(artifact_manifest *m) {
    for (int i = 0; i < m->n_files; i++) free(m->files[i].path);
    free(m->files);
    memset(m, 0, sizeof *m);
}

int artifact_path_ok(const char *path) {
    const size_t len = strlen(path);
    if (len == 0 || len > ARTIFACT_PATH_MAX || path[0] == '/') return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)path[i] < 0x20 || path[i] == 0x7f || path[i] == '\\') return 0;
    for (const char *part = path;;) {
        const size_t n = strcspn(part, "/");
        if (n == 0 || (n == 1 && part[0] == '.') || (n == 2 && part[0] == '.' && part[1] == '.')) return 0;
        part += n;
        if (!*part) return 1;
        part++;
    }
}

/* 16 lower-case hex digits into *v: 0, or -1. */
static int parse_hex64(const char *s, uint64_t *v) {
    if (strlen(s) != 16) return -1;
    uint64_t x = 0;
    for (int i = 0; i < 16; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        x = x << 4 | (uint64_t)d;
    }
    *v = x;
    return 0;
}

/* An optional hash field: a 16-digit hex string into out (17 bytes), or null / missing: "". */
static int read_hash_field(json_t *root, const char *key, char *out, const char *name, tg_err *err) {
    json_t *v = json_object_get(root, key);
    out[0] = 0;
    if (!v || json_is_null(v)) return 0;
    uint64_t ignored;
    if (!json_is_string(v) || parse_hex64(json_string_value(v), &ignored))
        return tg_fail(err, "%s: field '%s' is not 16 lower-case hex digits or null", name, key);
    memcpy(out, json_string_value(v), 17);
    return 0;
}

static int read_files(json_t *files, artifact_manifest *m, const char *name, tg_err *err) {
    const size_t n = json_array_size(files);
    if (n > ARTIFACT_FILES_MAX) return tg_fail(err, "%s: field 'files' lists more than %d files", name, ARTIFACT_FILES_MAX);
    m->files = tg_calloc(n ? n : 1, sizeof *m->files);
    if (!m->files) return tg_fail(err, "%s: out of memory for %zu files", name, n);
    for (size_t i = 0; i < n; i++) {
        json_t *f = json_array_get(files, i);
        json_t *path = json_object_get(f, "path"), *bytes = json_object_get(f, "bytes"), *hash = json_object_get(f, "xxh64");
        if (!json_is_object(f) || json_object_size(f) != 3)
            return tg_fail(err, "%s: field 'files'[%zu] is not an object of path, bytes and xxh64", name, i);
        if (!json_is_string(path) || strlen(json_string_value(path)) != json_string_length(path) ||
            !artifact_path_ok(json_string_value(path)) || !strcmp(json_string_value(path), "manifest.json"))
            return tg_fail(err,
                           "%s: field 'files'[%zu].path is not a relative path inside the folder (no '/' first, no "
                           "empty, '.' or '..' part, at most %d bytes, not manifest.json)",
                           name, i, ARTIFACT_PATH_MAX);
        if (!json_is_integer(bytes) || json_integer_value(bytes) < 0)
            return tg_fail(err, "%s: field 'files'[%zu].bytes is not a whole number from 0", name, i);
        uint64_t h;
        if (!json_is_string(hash) || parse_hex64(json_string_value(hash), &h))
            return tg_fail(err, "%s: field 'files'[%zu].xxh64 is not 16 lower-case hex digits", name, i);
        for (int k = 0; k < m->n_files; k++)
            if (!strcmp(m->files[k].path, json_string_value(path)))
                return tg_fail(err, "%s: field 'files'[%zu].path '%s' is listed twice", name, i, m->files[k].path);
        char *copy = tg_strdup(json_string_value(path));
        if (!copy) return tg_fail(err, "%s: out of memory", name);
        m->files[m->n_files++] = (artifact_manifest_file){copy, (uint64_t)json_integer_value(bytes), h};
    }
    return 0;
}

int artifact_manifest_parse(const char *name, const char *text, size_t len, artifact_manifest *m, tg_err *err) {
    memset(m, 0, sizeof *m);
    json_error_t jerr;
    char dup[64];
    json_t *root = tg_json_loadb_strict(text, len, 0, &jerr, dup, sizeof dup);
    if (!root) {
        if (tg_json_out_of_memory(&jerr)) return tg_fail(err, "%s: out of memory reading the manifest", name);
        if (dup[0]) return tg_fail(err, "%s: key '%s' appears twice", name, dup);
        return tg_fail(err, "%s: not JSON: %s (line %d)", name, jerr.text, jerr.line);
    }
    int rc = 0;
    json_t *format = json_object_get(root, "format"), *version = json_object_get(root, "version");
    json_t *command = json_object_get(root, "command"), *files = json_object_get(root, "files");
    json_t *absent = json_object_get(root, "absent");
    if (!json_is_object(root)) rc = tg_fail(err, "%s: not a JSON object", name);
    else if (!json_is_string(format) || strcmp(json_string_value(format), ARTIFACT_FORMAT))
        rc = tg_fail(err, "%s: field 'format' is not \"%s\": not a tunegraph artifact manifest", name, ARTIFACT_FORMAT);
    else if (!json_is_integer(version) || json_integer_value(version) != ARTIFACT_VERSION)
        rc = tg_fail(err, "%s: field 'version' is not %d (an artifact of another tunegraph version)", name,
                     ARTIFACT_VERSION);
    else if (!json_is_string(command) ||
             (strcmp(json_string_value(command), "run") && strcmp(json_string_value(command), "sweep")))
        rc = tg_fail(err, "%s: field 'command' is not \"run\" or \"sweep\"", name);
    else if (!json_is_array(files)) rc = tg_fail(err, "%s: field 'files' is not an array", name);
    else if (absent && !json_is_array(absent)) rc = tg_fail(err, "%s: field 'absent' is not an array", name);
    if (!rc) {
        snprintf(m->command, sizeof m->command, "%s", json_string_value(command));
        m->n_absent = (int)json_array_size(absent);
        for (int i = 0; i < m->n_absent && !rc; i++) {
            json_t *a = json_array_get(absent, (size_t)i);
            if (!json_is_string(json_object_get(a, "what")) || !json_is_string(json_object_get(a, "why")))
                rc = tg_fail(err, "%s: field 'absent'[%d] is not an object with strings what and why", name, i);
        }
    }
    if (!rc) rc = read_hash_field(root, "job_xxh64", m->job_xxh64, name, err);
    if (!rc) rc = read_hash_field(root, "plan_xxh64", m->plan_xxh64, name, err);
    if (!rc) rc = read_hash_field(root, "plan_fingerprint", m->plan_fingerprint, name, err);
    if (!rc) rc = read_files(files, m, name, err);
    json_decref(root);
    if (rc) artifact_manifest_free(m);
    return rc;
}

const artifact_manifest_file *artifact_manifest_find(const artifact_manifest *m, const char *path) {
    for (int i = 0; i < m->n_files; i++)
        if (!strcmp(m->files[i].path, path)) return &m->files[i];
    return NULL;
}
