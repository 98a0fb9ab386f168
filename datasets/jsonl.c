/* Pre-tokenized JSON Lines datasets, checked line by line against the model so a
 * mismatch fails before compiling or training, with the line that caused it.
 * Memory: one int32 pool holds every example's ids (and token types, when a line has
 * any non-zero ones); examples point into it. The pool starts at examples[0].input_ids. */
#include "datasets/dataset.h"
#include "base/alloc.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_strict.h"
#include "datasets/shard_dataset.h"
#include "plan/ops.h"

typedef struct loader {
    const char *path;
    long long line;
    int32_t *pool;
    int64_t pool_n, pool_cap;
    tg_example *ex;
    int64_t *ids_off, *types_off; /* pool offsets, turned into pointers at the end */
    int32_t n, cap;
} loader;

static int pool_reserve(loader *L, int64_t extra, tg_err *err) {
    if (L->pool_n + extra <= L->pool_cap) return 0;
    int64_t cap = L->pool_cap ? L->pool_cap : 4096;
    while (cap < L->pool_n + extra) cap *= 2;
    int32_t *p = tg_realloc(L->pool, (size_t)cap * sizeof *p);
    if (!p) return tg_fail(err, "%s: out of memory", L->path);
    L->pool = p;
    L->pool_cap = cap;
    return 0;
}

static int examples_reserve(loader *L, tg_err *err) {
    if (L->n < L->cap) return 0;
    /* GCOVR_EXCL_BR_START: 2^30 examples of one token or more outgrow memory first */
    if (L->cap >= INT32_MAX / 2) return tg_fail(err, "%s: too many examples", L->path);
    /* GCOVR_EXCL_BR_STOP */
    int32_t cap = L->cap ? 2 * L->cap : 1024;
    tg_example *e = tg_realloc(L->ex, (size_t)cap * sizeof *e);
    if (e) L->ex = e;
    int64_t *a = tg_realloc(L->ids_off, (size_t)cap * sizeof *a);
    if (a) L->ids_off = a;
    int64_t *b = tg_realloc(L->types_off, (size_t)cap * sizeof *b);
    if (b) L->types_off = b;
    if (!e || !a || !b) return tg_fail(err, "%s: out of memory", L->path);
    L->cap = cap;
    return 0;
}

/* Appends the integers of `arr` (field `name`) to the pool, each in [0, limit).
 * limit_msg explains the limit when a value is outside it. */
static int read_ids(loader *L, json_t *arr, const char *name, int32_t limit,
                    const char *limit_msg, tg_err *err) {
    size_t n = json_array_size(arr);
    if (pool_reserve(L, (int64_t)n, err)) return -1;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (json_typeof(v) != JSON_INTEGER)
            return tg_fail(err, "%s:%lld: %s[%zu] is not an integer", L->path, L->line, name, i);
        json_int_t x = json_integer_value(v);
        if (x < 0 || x >= limit)
            return tg_fail(err, "%s:%lld: %s[%zu] = %lld %s", L->path, L->line, name, i,
                           (long long)x, limit_msg);
        L->pool[L->pool_n + (int64_t)i] = (int32_t)x;
    }
    L->pool_n += (int64_t)n;
    return 0;
}

/* lm's "labels" as Hugging Face writes them: labels[t] is ids[t] (a target) or -100 (none).
 * Position 0 is never a target of the shifted loss; past it, the -100 positions must come
 * first (a prompt), so *prompt is the first counted position (0 when that is position 1,
 * which is plain causal LM). */
static int read_prompt(loader *L, json_t *labels, const int32_t *ids, size_t n, int32_t *prompt, tg_err *err) {
    if (json_typeof(labels) != JSON_ARRAY)
        return tg_fail(err, "%s:%lld: labels must be an array of integers", L->path, L->line);
    if (json_array_size(labels) != n)
        return tg_fail(err, "%s:%lld: labels has %zu entries but input_ids has %zu", L->path, L->line,
                       json_array_size(labels), n);
    size_t first = 0; /* the first counted position past 0 */
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(labels, i);
        if (json_typeof(v) != JSON_INTEGER)
            return tg_fail(err, "%s:%lld: labels[%zu] is not an integer", L->path, L->line, i);
        const json_int_t x = json_integer_value(v);
        if (x != TG_IGNORE_INDEX && x != ids[i])
            return tg_fail(err, "%s:%lld: labels[%zu] = %lld is neither input_ids[%zu] (%d) nor -100 (labels are the "
                                "ids, unshifted, with -100 where a position is no target)",
                           L->path, L->line, i, (long long)x, i, ids[i]);
        if (i == 0) continue;
        if (x != TG_IGNORE_INDEX && !first) first = i;
        if (x == TG_IGNORE_INDEX && first)
            return tg_fail(err, "%s:%lld: labels[%zu] is -100 after the counted labels[%zu]: only a prompt at the start "
                                "can be left out of the loss",
                           L->path, L->line, i, first);
    }
    if (!first)
        return tg_fail(err, "%s:%lld: labels leave no position to learn (every one past the first is -100)", L->path,
                       L->line);
    *prompt = first > 1 ? (int32_t)first : 0;
    return 0;
}

static int parse_line(loader *L, const char *text, size_t len, const tg_data_rules *r,
                      tg_err *err) {
    json_error_t jerr;
    char dup[128];
    json_t *root = tg_json_loadb_strict(text, len, 0, &jerr, dup, sizeof dup);
    if (!root && tg_json_out_of_memory(&jerr))
        return tg_fail(err, "%s:%lld: out of memory parsing the line", L->path, L->line);
    if (!root && dup[0])
        return tg_fail(err, "%s:%lld: key \"%s\" appears twice in one object (column %d)", L->path, L->line, dup,
                       jerr.column);
    if (!root)
        return tg_fail(err, "%s:%lld: invalid JSON: %s (column %d)", L->path, L->line, jerr.text,
                       jerr.column);
    int rc = -1;
    char msg[160];
    int64_t ids_at = L->pool_n;
    if (json_typeof(root) != JSON_OBJECT) {
        tg_fail(err, "%s:%lld: expected a JSON object like {\"input_ids\": [...]}", L->path, L->line);
        goto done;
    }
    json_t *ids = json_object_get(root, "input_ids");
    if (!ids) {
        tg_fail(err, "%s:%lld: missing \"input_ids\" (pre-tokenized ids are required)", L->path,
                L->line);
        goto done;
    }
    if (json_typeof(ids) != JSON_ARRAY) {
        tg_fail(err, "%s:%lld: input_ids must be an array of integers", L->path, L->line);
        goto done;
    }
    size_t n = json_array_size(ids);
    if (n == 0) {
        tg_fail(err, "%s:%lld: input_ids is empty", L->path, L->line);
        goto done;
    }
    if (n > INT32_MAX) { /* GCOVR_EXCL_BR_LINE: a line of at most 16 MiB holds fewer ids */
        tg_fail(err, "%s:%lld: input_ids is too long", L->path, L->line);
        goto done;
    }
    /* vocab_size <= 0 means "unknown": only negative ids are rejected. */
    int32_t vocab = r->vocab_size > 0 ? r->vocab_size : INT32_MAX;
    snprintf(msg, sizeof msg,
             "is outside the vocabulary (vocab_size %d; wrong vocab? tokenize with the model's "
             "tokenizer)", r->vocab_size);
    if (read_ids(L, ids, "input_ids", vocab, msg, err)) goto done;

    int64_t types_at = -1;
    json_t *types = json_object_get(root, "token_type_ids");
    if (types && json_typeof(types) != JSON_NULL) {
        if (json_typeof(types) != JSON_ARRAY) {
            tg_fail(err, "%s:%lld: token_type_ids must be an array of integers", L->path, L->line);
            goto done;
        }
        if (json_array_size(types) != n) {
            tg_fail(err, "%s:%lld: token_type_ids has %zu entries but input_ids has %zu", L->path,
                    L->line, json_array_size(types), n);
            goto done;
        }
        int32_t tv = r->type_vocab_size > 0 ? r->type_vocab_size : 1;
        if (r->type_vocab_size > 0)
            snprintf(msg, sizeof msg, "is outside type_vocab_size %d", r->type_vocab_size);
        else
            snprintf(msg, sizeof msg, "but the model has no token types (only 0 is allowed)");
        types_at = L->pool_n;
        if (read_ids(L, types, "token_type_ids", tv, msg, err)) goto done;
        /* All-zero types are the same as none: drop them to keep the pool small. */
        int any = 0;
        for (size_t i = 0; i < n && !any; i++) any = L->pool[types_at + (int64_t)i] != 0;
        if (!any) {
            L->pool_n = types_at;
            types_at = -1;
        }
    }

    int32_t label = TG_IGNORE_INDEX;
    if (r->task == TG_TASK_CLASSIFY) {
        json_t *lab = json_object_get(root, "label");
        if (!lab) {
            tg_fail(err, "%s:%lld: missing \"label\" (task classify needs an integer label per line)",
                    L->path, L->line);
            goto done;
        }
        if (json_typeof(lab) != JSON_INTEGER) {
            tg_fail(err, "%s:%lld: label must be an integer", L->path, L->line);
            goto done;
        }
        json_int_t x = json_integer_value(lab);
        if (x < 0 || x >= r->num_labels) {
            tg_fail(err, "%s:%lld: label %lld is out of range for num_labels %d", L->path, L->line,
                    (long long)x, r->num_labels);
            goto done;
        }
        label = (int32_t)x;
    }

    int32_t prompt = 0;
    json_t *labels = r->task == TG_TASK_LM ? json_object_get(root, "labels") : NULL;
    if (labels && read_prompt(L, labels, L->pool + ids_at, n, &prompt, err)) goto done;

    if (examples_reserve(L, err)) goto done;
    L->ex[L->n] = (tg_example){.len = (int32_t)n, .input_ids = NULL, .token_type_ids = NULL,
                               .label = label, .prompt_len = prompt};
    L->ids_off[L->n] = ids_at;
    L->types_off[L->n] = types_at;
    L->n++;
    rc = 0;
done:
    if (rc) L->pool_n = ids_at;
    json_decref(root);
    return rc;
}

static int is_blank(const char *s, size_t n) { /* a line: its '\n' is not part of it */
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

/* Lines read through a block buffer into a line buffer that never grows past
 * TG_JSONL_MAX_LINE_BYTES (getline would grow without bound on a file with no newline). */
typedef struct line_reader {
    FILE *f;
    char *block;
    size_t pos, end;
    char *line;
    size_t len, cap;
} line_reader;

enum { READ_BLOCK = 1 << 16 };

/* Next line (newline dropped) in r->line[0..r->len): 1, 0 at the end of the file, -1 on a
 * read error or a line past the limit (message naming the file and line). */
static int next_line(line_reader *r, const loader *L, tg_err *err) {
    r->len = 0;
    int any = 0;
    for (;;) {
        if (r->pos == r->end) {
            r->pos = 0;
            r->end = fread(r->block, 1, READ_BLOCK, r->f);
            if (r->end == 0) {
                if (ferror(r->f)) return tg_fail(err, "%s: read error: %s", L->path, strerror(errno));
                return any;
            }
        }
        any = 1;
        const char *start = r->block + r->pos;
        const char *nl = memchr(start, '\n', r->end - r->pos);
        const size_t take = nl ? (size_t)(nl - start) : r->end - r->pos;
        if (take > TG_JSONL_MAX_LINE_BYTES - r->len)
            return tg_fail(err, "%s:%lld: line is longer than %d bytes (%d MiB), the limit for a JSON Lines row; is this "
                                "a JSON Lines file?",
                           L->path, L->line + 1, TG_JSONL_MAX_LINE_BYTES, TG_JSONL_MAX_LINE_BYTES >> 20);
        if (r->len + take > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < r->len + take) cap *= 2;
            /* GCOVR_EXCL_BR_START: 4096 doubled meets the limit (a power of two) exactly, and no line passes it */
            if (cap > TG_JSONL_MAX_LINE_BYTES) cap = TG_JSONL_MAX_LINE_BYTES;
            /* GCOVR_EXCL_BR_STOP */
            char *grown = tg_realloc(r->line, cap);
            if (!grown) return tg_fail(err, "%s: out of memory", L->path);
            r->line = grown;
            r->cap = cap;
        }
        if (take) memcpy(r->line + r->len, start, take); /* an empty line may come before any buffer */
        r->len += take;
        r->pos += take + (nl != NULL);
        if (nl) return 1;
    }
}

int tg_dataset_load(const char *path, const tg_data_rules *rules, tg_dataset *ds, tg_err *err) {
    if (tg_shard_path_is_set(path)) return tg_shard_dataset_load(path, rules, 0, ds, err);
    if (rules->image_channels > 0)
        return tg_fail(err, "%s: an image model reads an image shard set made by `tunegraph data convert --format "
                            "idx`, not JSON Lines",
                       path);
    if (rules->task == TG_TASK_QA)
        return tg_fail(err, "%s: task qa reads a shard set made by `tunegraph data convert --format squad`, not JSON "
                            "Lines",
                       path);
    memset(ds, 0, sizeof *ds);
    if (snprintf(ds->path, sizeof ds->path, "%s", path) >= (int)sizeof ds->path)
        return tg_fail(err, "%s: dataset path is too long", path);
    FILE *f = fopen(path, "rb");
    if (!f) return tg_fail(err, "%s: cannot open dataset: %s", path, strerror(errno));

    loader L = {.path = path};
    line_reader reader = {.f = f, .block = tg_malloc(READ_BLOCK)};
    int rc = reader.block ? 0 : tg_fail(err, "%s: out of memory", path);
    int got;
    while (!rc && (got = next_line(&reader, &L, err)) != 0) {
        if (got < 0) {
            rc = -1;
            break;
        }
        L.line++;
        if (is_blank(reader.line, reader.len)) continue;
        if (parse_line(&L, reader.line, reader.len, rules, err)) rc = -1;
    }
    free(reader.block);
    free(reader.line);
    if (rc == 0 && L.n == 0) rc = tg_fail(err, "%s: no examples", path);
    fclose(f);
    if (rc) {
        free(L.pool);
        free(L.ex);
        free(L.ids_off);
        free(L.types_off);
        return rc;
    }
    /* Shrink to fit, then point examples into the final pool. A shrink that fails keeps the
     * larger block, so it is no allocation the hook (base/alloc.h) need fail. */
    int32_t *pool = realloc(L.pool, (size_t)L.pool_n * sizeof *pool);
    if (pool) L.pool = pool; /* GCOVR_EXCL_BR_LINE: glibc's shrinking realloc does not fail */
    tg_example *ex = realloc(L.ex, (size_t)L.n * sizeof *ex);
    if (ex) L.ex = ex; /* GCOVR_EXCL_BR_LINE: glibc's shrinking realloc does not fail */
    for (int32_t i = 0; i < L.n; i++) {
        L.ex[i].input_ids = L.pool + L.ids_off[i];
        L.ex[i].token_type_ids = L.types_off[i] >= 0 ? L.pool + L.types_off[i] : NULL;
        ds->n_tokens += L.ex[i].len;
    }
    free(L.ids_off);
    free(L.types_off);
    ds->n = L.n;
    ds->examples = L.ex;
    return 0;
}

void tg_dataset_free(tg_dataset *ds) {
    if (!ds) return;
    /* The pool's base: example 0's ids, or an image set's bytes. */
    if (ds->examples && ds->n > 0) /* GCOVR_EXCL_BR_LINE: both loaders refuse an empty dataset ('no examples', a shard set of no records): examples is set only with n > 0 */
        free(ds->examples[0].input_ids ? (void *)ds->examples[0].input_ids : (void *)ds->examples[0].pixels);
    free(ds->examples);
    memset(ds, 0, sizeof *ds);
}
