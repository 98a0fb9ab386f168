/* `tunegraph data dump SET [-o FILE.jsonl]`: every record of a dataset as pre-tokenized
 * JSON Lines, in record order, so that the output is itself a dataset the loader takes
 * (and a reference implementation can read the same split). */
#include "cli/data_dump.h"
#include "cli/usage.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/atomic_file.h"
#include "base/output_paths.h"
#include "datasets/dataset.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_reader.h"
#include "plan/ops.h"
#include "plan/plan.h"

/* What a line carries besides input_ids (and token_type_ids where the record has them). */
typedef enum dump_kind { DUMP_LM, DUMP_CLASSIFY, DUMP_QA } dump_kind;

static const char *const dump_kind_name[] = {"lm", "classify", "qa"};

static void put_ids(FILE *f, const char *key, const int32_t *v, int32_t n) {
    fprintf(f, "\"%s\": [", key);
    for (int32_t i = 0; i < n; i++) fprintf(f, i ? ", %" PRId32 : "%" PRId32, v[i]);
    fputc(']', f);
}

/* {"input_ids": [...], "token_type_ids": [...], "label": N | "start_position": S,
 * "end_position": E | "labels": [...]}: the record as tg_dataset_load reads it back (it
 * ignores the qa keys). An lm record with a prompt (instruct) has "labels" as Hugging
 * Face's causal LMs take them: its ids with -100 on the prompt's `prompt` tokens. */
static void put_record(FILE *f, dump_kind kind, int32_t len, const int32_t *ids, const int32_t *types, int32_t label,
                       int32_t start, int32_t end, int32_t prompt) {
    fputc('{', f);
    put_ids(f, "input_ids", ids, len);
    if (types) {
        fputs(", ", f);
        put_ids(f, "token_type_ids", types, len);
    }
    if (kind == DUMP_LM && prompt > 1) {
        fputs(", \"labels\": [", f);
        for (int32_t i = 0; i < len; i++) fprintf(f, i ? ", %" PRId32 : "%" PRId32, i < prompt ? TG_IGNORE_INDEX : ids[i]);
        fputc(']', f);
    }
    if (kind == DUMP_CLASSIFY) fprintf(f, ", \"label\": %" PRId32, label);
    if (kind == DUMP_QA) fprintf(f, ", \"start_position\": %" PRId32 ", \"end_position\": %" PRId32, start, end);
    fputs("}\n", f);
}

/* Where the lines go: the -o file, written atomically, or standard output. */
typedef struct dump_out {
    const char *path;         /* NULL: stdout */
    tg_atomic_file *file;
    FILE *f;
} dump_out;

static int out_begin(dump_out *o, tg_err *err) {
    if (!o->path) {
        o->f = stdout;
        return 0;
    }
    if (tg_atomic_begin(o->path, "dump", &o->file, err)) return -1;
    if (!(o->f = tg_atomic_stream(o->file))) {
        tg_atomic_discard(o->file);
        o->file = NULL;
        return tg_fail(err, "out of memory for the dump's stream");
    }
    return 0;
}

/* Commits the file (or flushes stdout) when ok, else drops what was written. Called only
 * after out_begin succeeded, so a path has its file. */
static int out_end(dump_out *o, int ok, tg_err *err) {
    if (!o->path) {
        if (fflush(stdout) != 0 || ferror(stdout)) /* GCOVR_EXCL_BR_LINE: the error flag with a flush that succeeds needs a write that failed for a while (EAGAIN on a non-blocking stdout drained meanwhile): a timing no test can set */
            return ok ? tg_fail(err, "writing standard output failed") : -1;
        return ok ? 0 : -1;
    }
    if (!ok) {
        tg_atomic_discard(o->file);
        return -1;
    }
    return tg_atomic_commit(o->file, err);
}

/* A shard set's split, read through the shard reader (every record checked against the
 * manifest as it is read) and written as it is read. The manifest and every shard of
 * the set are inputs the output may not replace. */
static int dump_shard_set(const char *dir, int split, dump_out *o, int64_t *n_records,
                          tg_shard_manifest *m_out, tg_err *err) {
    tg_shard_set set;
    if (tg_shard_set_open(dir, split, &set, err)) return -1;
    const tg_shard_manifest *m = &set.manifest;
    int rc = 0;
    if (set.n_records == 0)
        rc = tg_fail(err, "%s: the set has no %s records%s", set.dir, tg_shard_split_name(split),
                     split == TG_SPLIT_EVAL ? " (convert with --eval-fraction to make an eval split)" : "");
    if (!rc && o->path) {
        tg_named_path *inputs = tg_calloc((size_t)m->n_shards + 1, sizeof *inputs);
        char **names = tg_calloc((size_t)m->n_shards + 1, sizeof *names);
        rc = inputs && names ? 0 : tg_fail(err, "out of memory for the set's file names");
        int n = 0;
        for (int32_t i = 0; !rc && i <= m->n_shards; i++) {
            const char *file = i < m->n_shards ? m->shards[i].file : "manifest.json";
            if (tg_asprintf(&names[n], "%s/%s", set.dir, file) < 0) {
                names[n] = NULL;
                rc = tg_fail(err, "out of memory for the set's file names");
                break;
            }
            inputs[n] = (tg_named_path){names[n], i < m->n_shards ? "shard" : "manifest"};
            n++;
        }
        const tg_named_path output = {o->path, "dump (-o)"};
        if (!rc) rc = tg_outputs_check(&output, 1, inputs, n, err);
        for (int i = 0; names && i < n; i++) free(names[i]);
        free(names);
        free(inputs);
    }
    if (!rc && m->task == TG_SHARD_IMAGE)
        rc = tg_fail(err, "%s: an image set (%d x %d x %d); dump writes token records only", dir,
                     m->image_channels, m->image_height, m->image_width);
    tg_shard_cursor cur;
    if (!rc && tg_shard_cursor_open(&cur, &set, err)) rc = -1;
    else if (!rc) {
        const dump_kind kind = m->task == TG_SHARD_CLASSIFY ? DUMP_CLASSIFY : m->task == TG_SHARD_QA ? DUMP_QA : DUMP_LM;
        rc = out_begin(o, err);
        for (int64_t i = 0; !rc && i < set.n_records; i++) {
            tg_shard_record rec;
            if ((rc = tg_shard_cursor_get(&cur, i, &rec, err))) break;
            put_record(o->f, kind, rec.len, rec.input_ids, rec.token_type_ids, rec.label, rec.start, rec.end,
                       rec.prompt_len);
        }
        if (o->f) rc = out_end(o, !rc, err);
        tg_shard_cursor_close(&cur);
    }
    *n_records = set.n_records;
    /* The caller reports the task and label names; hand the manifest over. */
    *m_out = set.manifest;
    memset(&set.manifest, 0, sizeof set.manifest);
    tg_shard_set_close(&set);
    return rc;
}

/* Whether the first non-blank line of a JSONL file has a "label" key: the dataset is then
 * read as classify (every line must have one), else as lm. A line that cannot be read or
 * parsed here says no; the loader then names what is wrong with it. */
static int jsonl_has_labels(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char *line = NULL;
    size_t len = 0, cap = 0;
    int c, has = 0, done = 0;
    while (!done) {
        c = fgetc(f);
        if (c == EOF || c == '\n') {
            size_t k = 0;
            while (k < len && strchr(" \t\r", line[k])) k++;
            if (k < len) {
                json_error_t e;
                json_t *o = json_loadb(line, len, 0, &e);
                has = json_is_object(o) && json_object_get(o, "label") != NULL;
                json_decref(o);
                done = 1;
            }
            len = 0;
            if (c == EOF) done = 1;
            continue;
        }
        if (len == cap) {
            if (cap >= TG_JSONL_MAX_LINE_BYTES) break;
            char *grown = tg_realloc(line, cap ? cap * 2 : 4096);
            if (!grown) break;
            line = grown;
            cap = cap ? cap * 2 : 4096;
        }
        line[len++] = (char)c;
    }
    free(line);
    fclose(f);
    return has;
}

/* A pre-tokenized JSONL file through tg_dataset_load, with rules that accept any id,
 * token type and label the format allows; each line's other keys are not kept. */
static int dump_jsonl(const char *path, dump_out *o, int64_t *n_records, dump_kind *kind, tg_err *err) {
    if (o->path) {
        const tg_named_path output = {o->path, "dump (-o)"}, input = {path, "dataset"};
        if (tg_outputs_check(&output, 1, &input, 1, err)) return -1;
    }
    *kind = jsonl_has_labels(path) ? DUMP_CLASSIFY : DUMP_LM;
    const tg_data_rules rules = {.task = *kind == DUMP_CLASSIFY ? TG_TASK_CLASSIFY : TG_TASK_LM,
                                 .num_labels = INT32_MAX, .vocab_size = 0, .type_vocab_size = INT32_MAX};
    tg_dataset ds;
    if (tg_dataset_load(path, &rules, &ds, err)) return -1;
    int rc = out_begin(o, err);
    for (int32_t i = 0; !rc && i < ds.n; i++) {
        const tg_example *e = &ds.examples[i];
        put_record(o->f, *kind, e->len, e->input_ids, e->token_type_ids, e->label, 0, 0, e->prompt_len);
    }
    if (o->f) rc = out_end(o, !rc, err);
    *n_records = ds.n;
    tg_dataset_free(&ds);
    return rc;
}

int cmd_data_dump(int argc, char **argv, const char *usage) {
    const char *set = NULL, *output = NULL;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-o")) {
            if (i + 1 >= argc) return cli_usage_error(NULL, usage, "%s needs a value", s);
            output = argv[++i];
        } else if (s[0] == '-' && s[1]) {
            return cli_usage_error(NULL, usage, "unknown option %s", s);
        } else if (set) {
            return cli_usage_error(NULL, usage, "data dump takes one SET, got a second: %s", s);
        } else {
            set = s;
        }
    }
    if (!set) return cli_usage_error(NULL, usage, "%s", "missing SET (a shard set, OUTDIR/train, OUTDIR/eval or a .jsonl file)");
    tg_err err = {{0}};
    dump_out o = {.path = output};
    int64_t n = 0;
    int rc;
    if (tg_shard_path_is_set(set)) {
        char dir[TG_PATH_MAX + 32];
        int split;
        tg_shard_path_resolve(set, dir, sizeof dir, &split);
        if (split < 0) {
            /* A folder that is no set: the loader's own message says so. */
            tg_dataset ds;
            const tg_data_rules rules = {.task = TG_TASK_LM};
            rc = tg_dataset_load(set, &rules, &ds, &err);
            if (!rc) tg_dataset_free(&ds); /* GCOVR_EXCL_BR_LINE: the loader resolves the same path to no split and refuses it */
        } else {
            tg_shard_manifest m = {0};
            rc = dump_shard_set(dir, split, &o, &n, &m, &err);
            if (!rc) {
                fprintf(stderr, "tunegraph: dumped %" PRId64 " records (%s", n, tg_shard_task_name(m.task));
                for (int32_t i = 0; i < m.n_labels; i++) fprintf(stderr, "%s%s", i ? "," : ", labels: ", m.labels[i]);
                fprintf(stderr, "%s)\n", m.n_labels ? " from the manifest" : "");
            }
            tg_shard_manifest_free(&m);
        }
    } else {
        dump_kind kind;
        rc = dump_jsonl(set, &o, &n, &kind, &err);
        if (!rc) fprintf(stderr, "tunegraph: dumped %" PRId64 " records (%s)\n", n, dump_kind_name[kind]);
    }
    if (rc) {
        fprintf(stderr, "tunegraph: %s\n", err.msg);
        return 1;
    }
    return 0;
}
