#include "datasets/shard_manifest.h"
#include "base/json_strict.h"
#include "base/alloc.h"
#include "datasets/utf8.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FORMAT_NAME "tunegraph-shards"
#define MAX_LABELS (1 << 20)
#define MAX_SHARDS (1 << 20)

const char *tg_shard_task_name(int task) {
    switch (task) {
    case TG_SHARD_CLASSIFY: return "classify";
    case TG_SHARD_LM: return "lm";
    case TG_SHARD_QA: return "qa";
    case TG_SHARD_INSTRUCT: return "instruct";
    case TG_SHARD_IMAGE: return "image";
    default: return "?";
    }
}

const char *tg_shard_split_name(int split) { return split == TG_SPLIT_TRAIN ? "train" : split == TG_SPLIT_EVAL ? "eval" : "?"; }

static int split_of(const char *s) { return !strcmp(s, "train") ? TG_SPLIT_TRAIN : !strcmp(s, "eval") ? TG_SPLIT_EVAL : -1; }

void tg_shard_manifest_free(tg_shard_manifest *m) {
    if (m->labels)
        for (int32_t i = 0; i < m->n_labels; i++) free(m->labels[i]);
    free(m->labels);
    for (int s = 0; s < TG_SPLIT_COUNT; s++) free(m->hist[s]);
    free(m->shards);
    free(m->command);
    memset(m, 0, sizeof *m);
}

/* ---- reading ------------------------------------------------------------------ */

typedef struct reader {
    const char *name;
    tg_err *err;
} reader;

/* Refuses keys of obj other than those listed (NULL-terminated). */
static int only_keys(const reader *R, json_t *obj, const char *where, const char *const *keys) {
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) { /* GCOVR_EXCL_BR_LINE: the macro's value test cannot fail for a key it found */
        int known = 0;
        for (const char *const *k = keys; *k && !known; k++) known = !strcmp(*k, key);
        if (!known) return tg_fail(R->err, "%s: unknown key \"%s\" in %s", R->name, key, where);
    }
    return 0;
}

/* The type test for a value known to be there (json_is_* would test for NULL again). */
static int is(const json_t *v, json_type t) { return json_typeof(v) == t; }

static json_t *member(const reader *R, json_t *obj, const char *key, const char *where) {
    json_t *v = json_object_get(obj, key);
    if (!v) tg_fail(R->err, "%s: %s has no \"%s\"", R->name, where, key);
    return v;
}

static int whole(const reader *R, json_t *obj, const char *key, const char *where, int64_t lo, int64_t hi,
                 int64_t *out) {
    json_t *v = member(R, obj, key, where);
    if (!v) return -1;
    if (!is(v, JSON_INTEGER) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return tg_fail(R->err, "%s: %s.%s must be a whole number from %lld to %lld", R->name, where, key,
                       (long long)lo, (long long)hi);
    *out = json_integer_value(v);
    return 0;
}

static int hex64(const reader *R, json_t *obj, const char *key, const char *where, uint64_t *out) {
    json_t *v = member(R, obj, key, where);
    if (!v) return -1;
    const char *s = is(v, JSON_STRING) ? json_string_value(v) : "";
    if (!is(v, JSON_STRING) || strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16)
        return tg_fail(R->err, "%s: %s.%s must be 16 lower-case hex digits", R->name, where, key);
    *out = strtoull(s, NULL, 16);
    return 0;
}

/* {"train": N, "eval": N} */
static int per_split(const reader *R, json_t *root, const char *key, int64_t hi, int64_t out[TG_SPLIT_COUNT]) {
    json_t *v = member(R, root, key, "the manifest");
    if (!v) return -1;
    if (!is(v, JSON_OBJECT)) return tg_fail(R->err, "%s: \"%s\" must be an object {\"train\": N, \"eval\": N}", R->name, key);
    static const char *const keys[] = {"train", "eval", NULL};
    if (only_keys(R, v, key, keys)) return -1;
    for (int s = 0; s < TG_SPLIT_COUNT; s++)
        if (whole(R, v, tg_shard_split_name(s), key, 0, INT64_MAX / 2, &out[s])) return -1;
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int read_labels(const reader *R, json_t *root, tg_shard_manifest *m) {
    json_t *v = member(R, root, "labels", "the manifest");
    if (!v) return -1;
    if (!is(v, JSON_ARRAY)) return tg_fail(R->err, "%s: \"labels\" must be an array of names", R->name);
    size_t n = json_array_size(v);
    const int labelled = m->task == TG_SHARD_CLASSIFY || m->task == TG_SHARD_IMAGE;
    if (labelled && n == 0)
        return tg_fail(R->err, "%s: %s set needs label names", R->name,
                       m->task == TG_SHARD_IMAGE ? "an image" : "a classify");
    if (!labelled && n)
        return tg_fail(R->err, "%s: a %s set has no labels, but \"labels\" lists %zu", R->name,
                       tg_shard_task_name(m->task), n);
    if (n > MAX_LABELS) return tg_fail(R->err, "%s: more than %d labels", R->name, MAX_LABELS);
    if (!n) return 0;
    if (!(m->labels = tg_calloc(n, sizeof *m->labels))) return tg_fail(R->err, "%s: out of memory for %zu labels", R->name, n);
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(v, i);
        if (!is(s, JSON_STRING) || json_string_length(s) == 0)
            return tg_fail(R->err, "%s: labels[%zu] must be a non-empty name", R->name, i);
        if (!(m->labels[i] = tg_strdup(json_string_value(s)))) return tg_fail(R->err, "%s: out of memory for labels[%zu]", R->name, i);
        m->n_labels = (int32_t)i + 1;
    }
    /* Names are unique: in a sorted copy a repeat sits beside its twin. */
    char **sorted = tg_malloc(n * sizeof *sorted);
    if (!sorted) return tg_fail(R->err, "%s: out of memory checking the labels", R->name);
    memcpy(sorted, m->labels, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, by_name);
    int rc = 0;
    for (size_t i = 1; i < n && !rc; i++)
        if (!strcmp(sorted[i - 1], sorted[i])) rc = tg_fail(R->err, "%s: label '%s' is listed twice", R->name, sorted[i]);
    free(sorted);
    return rc;
}

static int read_histogram(const reader *R, json_t *root, tg_shard_manifest *m) {
    json_t *v = member(R, root, "length_histogram", "the manifest");
    if (!v) return -1;
    const char *where = "length_histogram";
    if (!is(v, JSON_OBJECT)) return tg_fail(R->err, "%s: \"%s\" must be an object", R->name, where);
    static const char *const keys[] = {"bin_width", "train", "eval", NULL};
    if (only_keys(R, v, where, keys)) return -1;
    int64_t bin;
    if (whole(R, v, "bin_width", where, 1, TG_SHARD_SEQ_MAX, &bin)) return -1;
    m->hist_bin = (int32_t)bin;
    m->n_bins = (int32_t)((m->seq + bin - 1) / bin);
    for (int s = 0; s < TG_SPLIT_COUNT; s++) {
        const char *split = tg_shard_split_name(s);
        json_t *a = member(R, v, split, where);
        if (!a) return -1;
        if (!is(a, JSON_ARRAY) || json_array_size(a) != (size_t)m->n_bins)
            return tg_fail(R->err, "%s: %s.%s must be an array of %d counts (ceil(seq %d / bin_width %d))", R->name,
                           where, split, m->n_bins, m->seq, m->hist_bin);
        if (!(m->hist[s] = tg_calloc((size_t)m->n_bins, sizeof *m->hist[s]))) return tg_fail(R->err, "%s: out of memory for %s.%s", R->name, where, split);
        int64_t sum = 0;
        for (int32_t i = 0; i < m->n_bins; i++) {
            json_t *c = json_array_get(a, (size_t)i);
            if (!is(c, JSON_INTEGER) || json_integer_value(c) < 0 || json_integer_value(c) > m->records[s])
                return tg_fail(R->err, "%s: %s.%s[%d] must be a count from 0 to the split's %lld records", R->name,
                               where, split, i, (long long)m->records[s]);
            m->hist[s][i] = json_integer_value(c);
            sum += m->hist[s][i];
            if (sum > m->records[s]) break;
        }
        if (sum != m->records[s])
            return tg_fail(R->err, "%s: %s.%s counts %lld records, the %s split has %lld", R->name, where, split,
                           (long long)sum, split, (long long)m->records[s]);
    }
    return 0;
}

/* An image set's shape; its pixels are bytes, so its "vocabulary" is 256 values. */
static int read_image(const reader *R, json_t *root, tg_shard_manifest *m) {
    json_t *v = member(R, root, "image", "the manifest");
    if (!v) return -1;
    if (!is(v, JSON_OBJECT)) return tg_fail(R->err, "%s: \"image\" must be an object", R->name);
    static const char *const keys[] = {"channels", "height", "width", NULL};
    if (only_keys(R, v, "image", keys)) return -1;
    int64_t c, h, w;
    if (whole(R, v, "channels", "image", 1, 4, &c) || whole(R, v, "height", "image", 1, 65536, &h) ||
        whole(R, v, "width", "image", 1, 65536, &w))
        return -1;
    if (c * h * w != m->seq)
        return tg_fail(R->err, "%s: image %lld x %lld x %lld is %lld values, \"seq\" says %d", R->name, (long long)c,
                       (long long)h, (long long)w, (long long)(c * h * w), m->seq);
    for (int s = 0; s < TG_SPLIT_COUNT; s++)
        if (m->tokens[s] != m->records[s] * m->seq)
            return tg_fail(R->err, "%s: tokens.%s %lld is not %lld images of %d values", R->name, tg_shard_split_name(s),
                           (long long)m->tokens[s], (long long)m->records[s], m->seq);
    m->image_channels = (int32_t)c, m->image_height = (int32_t)h, m->image_width = (int32_t)w;
    m->vocab_size = 256;
    snprintf(m->tokenizer_family, sizeof m->tokenizer_family, "pixels");
    return 0;
}

static int read_tokenizer(const reader *R, json_t *root, tg_shard_manifest *m) {
    json_t *v = member(R, root, "tokenizer", "the manifest");
    if (!v) return -1;
    if (!is(v, JSON_OBJECT)) return tg_fail(R->err, "%s: \"tokenizer\" must be an object", R->name);
    static const char *const keys[] = {"identity", "family", "vocab_size", NULL};
    if (only_keys(R, v, "tokenizer", keys)) return -1;
    int64_t vocab;
    if (hex64(R, v, "identity", "tokenizer", &m->tokenizer_identity) ||
        whole(R, v, "vocab_size", "tokenizer", 1, INT32_MAX, &vocab))
        return -1;
    m->vocab_size = (int32_t)vocab;
    json_t *f = member(R, v, "family", "tokenizer");
    if (!f) return -1;
    if (!is(f, JSON_STRING) || json_string_length(f) == 0 || json_string_length(f) >= sizeof m->tokenizer_family)
        return tg_fail(R->err, "%s: tokenizer.family must be a name of 1 to %zu characters", R->name,
                       sizeof m->tokenizer_family - 1);
    memcpy(m->tokenizer_family, json_string_value(f), json_string_length(f) + 1);
    return 0;
}

/* "train/00000.tgshard": the split's folder, then a plain file name. */
static int file_name_ok(const char *file, int split) {
    const char *dir = tg_shard_split_name(split);
    size_t d = strlen(dir);
    if (strncmp(file, dir, d) || file[d] != '/') return 0;
    const char *base = file + d + 1;
    return base[0] && base[0] != '.' && !strchr(base, '/');
}

static int read_shards(const reader *R, json_t *root, tg_shard_manifest *m) {
    json_t *v = member(R, root, "shards", "the manifest");
    if (!v) return -1;
    if (!is(v, JSON_ARRAY)) return tg_fail(R->err, "%s: \"shards\" must be an array", R->name);
    size_t n = json_array_size(v);
    if (n > MAX_SHARDS) return tg_fail(R->err, "%s: more than %d shards", R->name, MAX_SHARDS);
    if (n && !(m->shards = tg_calloc(n, sizeof *m->shards))) return tg_fail(R->err, "%s: out of memory for %zu shards", R->name, n);
    int64_t records[TG_SPLIT_COUNT] = {0};
    for (size_t i = 0; i < n; i++) {
        char where[32];
        snprintf(where, sizeof where, "shards[%zu]", i);
        json_t *s = json_array_get(v, i);
        if (!is(s, JSON_OBJECT)) return tg_fail(R->err, "%s: %s must be an object", R->name, where);
        static const char *const keys[] = {"file", "split", "records", "bytes", "xxh64", NULL};
        if (only_keys(R, s, where, keys)) return -1;
        tg_shard_entry *e = &m->shards[i];
        json_t *split = member(R, s, "split", where);
        if (!split) return -1;
        e->split = is(split, JSON_STRING) ? split_of(json_string_value(split)) : -1;
        if (e->split < 0) return tg_fail(R->err, "%s: %s.split must be \"train\" or \"eval\"", R->name, where);
        json_t *file = member(R, s, "file", where);
        if (!file) return -1;
        if (!is(file, JSON_STRING) || json_string_length(file) >= sizeof e->file ||
            !file_name_ok(json_string_value(file), e->split))
            return tg_fail(R->err, "%s: %s.file must name a file in the set's %s/ folder (\"%s/00000.tgshard\")",
                           R->name, where, tg_shard_split_name(e->split), tg_shard_split_name(e->split));
        memcpy(e->file, json_string_value(file), json_string_length(file) + 1);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(m->shards[j].file, e->file))
                return tg_fail(R->err, "%s: %s names %s, as shards[%zu] does", R->name, where, e->file, j);
        if (whole(R, s, "records", where, 1, INT64_MAX / 2, &e->records) ||
            whole(R, s, "bytes", where, TG_SHARD_HEADER_BYTES + TG_SHARD_FOOTER_BYTES, INT64_MAX / 2, &e->bytes) ||
            hex64(R, s, "xxh64", where, &e->xxh64))
            return -1;
        records[e->split] += e->records;
        if (records[e->split] > m->records[e->split])
            return tg_fail(R->err, "%s: the %s shards hold more records than records.%s (%lld)", R->name,
                           tg_shard_split_name(e->split), tg_shard_split_name(e->split),
                           (long long)m->records[e->split]);
        m->n_shards = (int32_t)i + 1;
    }
    for (int s = 0; s < TG_SPLIT_COUNT; s++)
        if (records[s] != m->records[s])
            return tg_fail(R->err, "%s: the %s shards hold %lld records, records.%s says %lld", R->name,
                           tg_shard_split_name(s), (long long)records[s], tg_shard_split_name(s),
                           (long long)m->records[s]);
    return 0;
}

static int parse_root(const reader *R, json_t *root, tg_shard_manifest *m) {
    if (!is(root, JSON_OBJECT)) return tg_fail(R->err, "%s: expected a JSON object", R->name);
    json_t *format = json_object_get(root, "format");
    if (!json_is_string(format) || strcmp(json_string_value(format), FORMAT_NAME))
        return tg_fail(R->err, "%s: not a tunegraph shard set manifest (\"format\" is not \"%s\")", R->name, FORMAT_NAME);
    json_t *version = json_object_get(root, "version");
    if (!json_is_integer(version))
        return tg_fail(R->err, "%s: \"version\" must be a whole number", R->name);
    if (json_integer_value(version) != TG_SHARD_VERSION)
        return tg_fail(R->err, "%s: shard set format version %" JSON_INTEGER_FORMAT ", this build reads version %d "
                               "(convert the data again with this build)",
                       R->name, json_integer_value(version), TG_SHARD_VERSION);
    m->version = TG_SHARD_VERSION;
    static const char *const keys[] = {"format", "version", "task", "seq", "doc_stride", "records", "tokens",
                                       "labels", "length_histogram", "token_types", "tokenizer", "image",
                                       "shards", "command", NULL};
    if (only_keys(R, root, "the manifest", keys)) return -1;
    json_t *task = member(R, root, "task", "the manifest");
    if (!task) return -1;
    const char *t = is(task, JSON_STRING) ? json_string_value(task) : "";
    m->task = !strcmp(t, "classify") ? TG_SHARD_CLASSIFY : !strcmp(t, "lm") ? TG_SHARD_LM
            : !strcmp(t, "qa")       ? TG_SHARD_QA : !strcmp(t, "instruct") ? TG_SHARD_INSTRUCT
            : !strcmp(t, "image")    ? TG_SHARD_IMAGE : 0;
    if (!m->task)
        return tg_fail(R->err, "%s: \"task\" must be \"classify\", \"lm\", \"qa\", \"instruct\" or \"image\"", R->name);
    int64_t seq, stride = 0;
    if (whole(R, root, "seq", "the manifest", 1, TG_SHARD_SEQ_MAX, &seq)) return -1;
    m->seq = (int32_t)seq;
    json_t *ds = json_object_get(root, "doc_stride");
    if (m->task == TG_SHARD_QA) {
        if (whole(R, root, "doc_stride", "the manifest", 0, seq - 1, &stride)) return -1;
    } else if (ds) {
        return tg_fail(R->err, "%s: \"doc_stride\" belongs to qa sets only", R->name);
    }
    m->doc_stride = (int32_t)stride;
    if (per_split(R, root, "records", INT64_MAX / 2, m->records) || per_split(R, root, "tokens", INT64_MAX / 2, m->tokens))
        return -1;
    for (int s = 0; s < TG_SPLIT_COUNT; s++)
        if (m->tokens[s] < m->records[s] || m->tokens[s] / m->seq > m->records[s] ||
            (m->tokens[s] / m->seq == m->records[s] && m->tokens[s] % m->seq))
            return tg_fail(R->err, "%s: tokens.%s %lld does not fit %lld records of 1 to %d tokens", R->name,
                           tg_shard_split_name(s), (long long)m->tokens[s], (long long)m->records[s], m->seq);
    if (m->records[TG_SPLIT_TRAIN] + m->records[TG_SPLIT_EVAL] == 0)
        return tg_fail(R->err, "%s: the set holds no records", R->name);
    if (read_labels(R, root, m) || read_histogram(R, root, m) ||
        (m->task == TG_SHARD_IMAGE ? read_image(R, root, m) : read_tokenizer(R, root, m)))
        return -1;
    if (m->task == TG_SHARD_IMAGE && json_object_get(root, "tokenizer"))
        return tg_fail(R->err, "%s: an image set has no \"tokenizer\"", R->name);
    if (m->task != TG_SHARD_IMAGE && json_object_get(root, "image"))
        return tg_fail(R->err, "%s: \"image\" belongs to image sets only", R->name);
    json_t *types = member(R, root, "token_types", "the manifest");
    if (!types) return -1;
    if (!is(types, JSON_TRUE) && !is(types, JSON_FALSE)) return tg_fail(R->err, "%s: \"token_types\" must be true or false", R->name);
    m->token_types = is(types, JSON_TRUE);
    if (read_shards(R, root, m)) return -1;
    json_t *cmd = member(R, root, "command", "the manifest");
    if (!cmd) return -1;
    if (!is(cmd, JSON_STRING))
        return tg_fail(R->err, "%s: \"command\" must be a string", R->name);
    if (!(m->command = tg_strdup(json_string_value(cmd)))) return tg_fail(R->err, "%s: out of memory for \"command\"", R->name);
    return 0;
}

int tg_shard_manifest_parse(const char *text, size_t len, const char *name, tg_shard_manifest *m, tg_err *err) {
    memset(m, 0, sizeof *m);
    json_error_t jerr;
    /* Without JSON_ALLOW_NUL no string holds a NUL (tests/test_shard_manifest_fields.c checks
     * "\u0000" is refused), so each json_string_value is the whole string. */
    json_t *root = tg_json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && tg_json_out_of_memory(&jerr)) return tg_fail(err, "%s: out of memory parsing the JSON", name);
    if (!root) return tg_fail(err, "%s:%d:%d: invalid JSON: %s", name, jerr.line, jerr.column, jerr.text);
    reader R = {name, err};
    int rc = parse_root(&R, root, m);
    json_decref(root);
    if (rc) tg_shard_manifest_free(m);
    return rc;
}

/* ---- writing ------------------------------------------------------------------ */

/* What went wrong building the JSON: a name that is not UTF-8, or an allocation (jansson
 * then returns NULL, and json_object_set_new / json_array_append_new return -1, which would
 * otherwise drop the key and leave a manifest without it). */
typedef struct built {
    int bad, oom;
} built;

static json_t *split_counts(const int64_t v[TG_SPLIT_COUNT], built *b) {
    json_t *o = json_object();
    for (int s = 0; s < TG_SPLIT_COUNT; s++) tg_json_put(o, tg_shard_split_name(s), json_integer(v[s]), &b->oom);
    return o;
}

/* json_string refuses text that is not UTF-8 (b->bad) and fails when out of memory. */
static json_t *str(const char *s, built *b) {
    json_t *v = json_string(s);
    if (!v) {
        if (tg_utf8_invalid_at(s, strlen(s)) >= 0) b->bad = 1;
        else b->oom = 1;
        v = json_null();
    }
    return v;
}

static json_t *hex(uint64_t v) {
    char s[17];
    snprintf(s, sizeof s, "%016" PRIx64, v);
    return json_string(s);
}

int tg_shard_manifest_format(const tg_shard_manifest *m, char **text, size_t *len, tg_err *err) {
    *text = NULL;
    *len = 0;
    built b = {0, 0};
    json_t *root = json_object();
    tg_json_put(root, "format", json_string(FORMAT_NAME), &b.oom);
    tg_json_put(root, "version", json_integer(m->version), &b.oom);
    tg_json_put(root, "task", json_string(tg_shard_task_name(m->task)), &b.oom);
    tg_json_put(root, "seq", json_integer(m->seq), &b.oom);
    if (m->task == TG_SHARD_QA) tg_json_put(root, "doc_stride", json_integer(m->doc_stride), &b.oom);
    tg_json_put(root, "records", split_counts(m->records, &b), &b.oom);
    tg_json_put(root, "tokens", split_counts(m->tokens, &b), &b.oom);
    json_t *labels = json_array();
    for (int32_t i = 0; i < m->n_labels; i++) tg_json_push(labels, str(m->labels[i], &b), &b.oom);
    tg_json_put(root, "labels", labels, &b.oom);
    json_t *hist = json_object();
    tg_json_put(hist, "bin_width", json_integer(m->hist_bin), &b.oom);
    for (int s = 0; s < TG_SPLIT_COUNT; s++) {
        json_t *a = json_array();
        for (int32_t i = 0; i < m->n_bins; i++) tg_json_push(a, json_integer(m->hist[s][i]), &b.oom);
        tg_json_put(hist, tg_shard_split_name(s), a, &b.oom);
    }
    tg_json_put(root, "length_histogram", hist, &b.oom);
    tg_json_put(root, "token_types", json_boolean(m->token_types), &b.oom);
    if (m->task == TG_SHARD_IMAGE) {
        json_t *img = json_object();
        tg_json_put(img, "channels", json_integer(m->image_channels), &b.oom);
        tg_json_put(img, "height", json_integer(m->image_height), &b.oom);
        tg_json_put(img, "width", json_integer(m->image_width), &b.oom);
        tg_json_put(root, "image", img, &b.oom);
    } else {
        json_t *tok = json_object();
        tg_json_put(tok, "identity", hex(m->tokenizer_identity), &b.oom);
        tg_json_put(tok, "family", str(m->tokenizer_family, &b), &b.oom);
        tg_json_put(tok, "vocab_size", json_integer(m->vocab_size), &b.oom);
        tg_json_put(root, "tokenizer", tok, &b.oom);
    }
    json_t *shards = json_array();
    for (int32_t i = 0; i < m->n_shards; i++) {
        const tg_shard_entry *e = &m->shards[i];
        json_t *o = json_object();
        tg_json_put(o, "file", str(e->file, &b), &b.oom);
        tg_json_put(o, "split", json_string(tg_shard_split_name(e->split)), &b.oom);
        tg_json_put(o, "records", json_integer(e->records), &b.oom);
        tg_json_put(o, "bytes", json_integer(e->bytes), &b.oom);
        tg_json_put(o, "xxh64", hex(e->xxh64), &b.oom);
        tg_json_push(shards, o, &b.oom);
    }
    tg_json_put(root, "shards", shards, &b.oom);
    tg_json_put(root, "command", str(m->command ? m->command : "", &b), &b.oom);
    /* jansson's dump ignores a key it failed to write (a buffer that could not grow), and
     * returns the text without it: any allocation failing during the dump fails it. */
    const long failures_before = tg_alloc_failures();
    char *s = b.bad || b.oom ? NULL : json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s && tg_alloc_failures() != failures_before) {
        free(s);
        s = NULL;
    }
    json_decref(root);
    if (b.bad) return tg_fail(err, "manifest: a label name, the tokenizer family or the command is not UTF-8");
    if (!s) return tg_fail(err, "manifest: out of memory");
    *text = s;
    *len = strlen(s);
    return 0;
}
