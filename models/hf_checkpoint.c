#include "models/hf_checkpoint.h"
#include "base/alloc.h"

#include "base/text_file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_strict.h"

#define KEY_IN_MESSAGE 256 /* a repeated key is quoted up to this many bytes */

void tg_hf_checkpoint_close(tg_hf_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_files; i++) tg_st_close(&ck->files[i]);
    free(ck->files);
    free(ck->tensors);
    memset(ck, 0, sizeof *ck);
}

static int cmp_tensor(const void *a, const void *b) {
    const tg_hf_checkpoint_tensor *x = a, *y = b;
    return strcmp(x->entry->name, y->entry->name);
}

const tg_hf_checkpoint_tensor *tg_hf_checkpoint_find(const tg_hf_checkpoint *ck, const char *name) {
    tg_st_entry key_entry = {.name = (char *)name};
    const tg_hf_checkpoint_tensor key = {&key_entry, 0};
    return bsearch(&key, ck->tensors, (size_t)ck->n, sizeof *ck->tensors, cmp_tensor);
}

/* The name of file i for messages: its path as opened. */
static const char *file_name(const tg_hf_checkpoint *ck, int i) { return ck->files[i].path; }

/* Every tensor of every file, sorted by name; a name in two files is an error. */
static int collect(tg_hf_checkpoint *ck, tg_err *err) {
    size_t n = 0;
    for (int i = 0; i < ck->n_files; i++) n += (size_t)ck->files[i].n;
    ck->tensors = tg_malloc(sizeof *ck->tensors * (n ? n : 1));
    if (!ck->tensors) return tg_fail(err, "%s: out of memory", ck->path);
    for (int i = 0; i < ck->n_files; i++)
        for (int k = 0; k < ck->files[i].n; k++) ck->tensors[ck->n++] = (tg_hf_checkpoint_tensor){&ck->files[i].entries[k], i};
    qsort(ck->tensors, n, sizeof *ck->tensors, cmp_tensor);
    for (int k = 1; k < ck->n; k++) {
        const tg_hf_checkpoint_tensor *a = &ck->tensors[k - 1], *b = &ck->tensors[k];
        if (!strcmp(a->entry->name, b->entry->name)) {
            int first = a->file < b->file ? a->file : b->file, second = a->file < b->file ? b->file : a->file;
            return tg_fail(err, "%s: tensor '%s' is in two shards, %s and %s: each tensor must be in one", ck->path,
                           a->entry->name, file_name(ck, first), file_name(ck, second));
        }
    }
    return 0;
}

/* A shard name the index may give: a relative path inside the index's folder. */
static int shard_name_ok(const char *name) {
    if (!name[0] || name[0] == '/') return 0;
    for (const char *part = name; *part; part += strcspn(part, "/"), part += *part == '/') {
        size_t len = strcspn(part, "/");
        if (len == 0 || (len == 2 && !strncmp(part, "..", 2))) return 0;
    }
    return 1;
}

/* Opens the distinct shards the weight map names, in order of first mention; `ids` maps
 * each shard name to its index in ck->files. */
static int open_shards(tg_hf_checkpoint *ck, json_t *map, json_t *ids, tg_err *err) {
    const char *slash = strrchr(ck->path, '/');
    const int dir_len = slash ? (int)(slash - ck->path + 1) : 0;
    const char *tensor;
    json_t *v;
    size_t n_entries = json_object_size(map);
    ck->files = tg_calloc(n_entries < TG_HF_CHECKPOINT_MAX_SHARDS ? n_entries : TG_HF_CHECKPOINT_MAX_SHARDS,
                       sizeof *ck->files);
    if (!ck->files) return tg_fail(err, "%s: out of memory", ck->path);
    json_object_foreach(map, tensor, v) { /* GCOVR_EXCL_BR_LINE: jansson's json_object_foreach: a key's value is never NULL */
        if (!json_is_string(v)) /* GCOVR_EXCL_BR_LINE: json_is_string's NULL test: a member's value is never NULL */
            return tg_fail(err, "%s: weight_map: the value of '%s' is not a string (a shard file name)", ck->path,
                           tensor);
        const char *shard = json_string_value(v);
        if (!shard_name_ok(shard))
            return tg_fail(err,
                           "%s: weight_map: '%s' maps to shard '%s', which is not a file name inside the index's "
                           "folder (empty, absolute or with '..')",
                           ck->path, tensor, shard);
        if (json_object_get(ids, shard)) continue;
        if (ck->n_files == TG_HF_CHECKPOINT_MAX_SHARDS)
            return tg_fail(err, "%s: weight_map names more than %d shard files", ck->path, TG_HF_CHECKPOINT_MAX_SHARDS);
        char path[TG_ST_PATH_MAX];
        if (snprintf(path, sizeof path, "%.*s%s", dir_len, ck->path, shard) >= (int)sizeof path)
            return tg_fail(err, "%s: shard '%s' (of tensor '%s'): path too long", ck->path, shard, tensor);
        if (tg_st_open(path, &ck->files[ck->n_files], err))
            return tg_fail_context(err, "%s: shard '%s' of tensor '%s'", ck->path, shard, tensor);
        if (json_object_set_new(ids, shard, json_integer(ck->n_files++)))
            return tg_fail(err, "%s: out of memory", ck->path);
    }
    return 0;
}

/* The index and its shards agree: each tensor it names is in the shard it names, and
 * each shard's tensors are all named, with that shard. */
static int check_map(const tg_hf_checkpoint *ck, json_t *map, json_t *ids, tg_err *err) {
    const char *tensor;
    json_t *v;
    json_object_foreach(map, tensor, v) { /* GCOVR_EXCL_BR_LINE: jansson's json_object_foreach: a key's value is never NULL */
        const int want = (int)json_integer_value(json_object_get(ids, json_string_value(v)));
        const tg_hf_checkpoint_tensor *t = tg_hf_checkpoint_find(ck, tensor);
        if (!t)
            return tg_fail(err, "%s: weight_map puts tensor '%s' in %s, which does not hold it", ck->path, tensor,
                           file_name(ck, want));
        if (t->file != want)
            return tg_fail(err, "%s: weight_map puts tensor '%s' in %s, but it is in %s", ck->path, tensor,
                           file_name(ck, want), file_name(ck, t->file));
    }
    for (int k = 0; k < ck->n; k++)
        if (!json_object_get(map, ck->tensors[k].entry->name))
            return tg_fail(err, "%s: holds tensor '%s', which the weight_map of %s does not name",
                           file_name(ck, ck->tensors[k].file), ck->tensors[k].entry->name, ck->path);
    return 0;
}

static int open_index(tg_hf_checkpoint *ck, tg_err *err) {
    char *text = NULL;
    size_t len = 0;
    if (tg_read_text_file(ck->path, TG_HF_CHECKPOINT_INDEX_MAX_BYTES, "a checkpoint index", &text, &len, err)) return -1;
    json_error_t jerr;
    char dup[KEY_IN_MESSAGE];
    json_t *root = tg_json_loadb_strict(text, len, 0, &jerr, dup, sizeof dup);
    free(text);
    if (!root && tg_json_out_of_memory(&jerr)) return tg_fail(err, "%s: out of memory parsing the index", ck->path);
    if (!root && dup[0])
        return tg_fail(err, "%s: key '%s' appears twice in one object (line %d, column %d)", ck->path, dup, jerr.line,
                       jerr.column);
    if (!root)
        return tg_fail(err, "%s: invalid JSON at line %d, column %d: %s", ck->path, jerr.line, jerr.column, jerr.text);
    json_t *ids = json_object();
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL; /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: root is not NULL here (refused above) */
    int rc = 0;
    if (!ids) rc = tg_fail(err, "%s: out of memory", ck->path);
    else if (!json_is_object(root)) rc = tg_fail(err, "%s: expected a JSON object at the top level", ck->path); /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: root is not NULL here (refused above) */
    else if (!json_is_object(map))
        rc = tg_fail(err, "%s: field 'weight_map': missing or not an object (tensor name -> shard file)", ck->path);
    else if (json_object_size(map) == 0) rc = tg_fail(err, "%s: field 'weight_map' names no tensor", ck->path);
    else if (json_object_get(root, "metadata") && !json_is_object(json_object_get(root, "metadata"))) /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: the left side has found the member */
        rc = tg_fail(err, "%s: field 'metadata' is not an object", ck->path);
    if (!rc) rc = open_shards(ck, map, ids, err);
    if (!rc) rc = collect(ck, err);
    if (!rc) rc = check_map(ck, map, ids, err);
    json_decref(ids);
    json_decref(root);
    return rc;
}

int tg_hf_checkpoint_open(const char *path, tg_hf_checkpoint *ck, tg_err *err) {
    memset(ck, 0, sizeof *ck);
    if (strlen(path) >= sizeof ck->path) return tg_fail(err, "%s: path too long", path);
    snprintf(ck->path, sizeof ck->path, "%s", path);
    const size_t len = strlen(path);
    ck->sharded = len >= 5 && !strcmp(path + len - 5, ".json");
    int rc;
    if (ck->sharded) {
        rc = open_index(ck, err);
    } else {
        ck->files = tg_calloc(1, sizeof *ck->files);
        rc = !ck->files ? tg_fail(err, "%s: out of memory", path) : tg_st_open(path, &ck->files[0], err);
        if (!rc) ck->n_files = 1;
        if (!rc) rc = collect(ck, err);
    }
    if (rc) tg_hf_checkpoint_close(ck);
    return rc;
}
