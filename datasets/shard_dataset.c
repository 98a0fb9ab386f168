#include "datasets/shard_dataset.h"
#include "base/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datasets/shard_reader.h"
#include "plan/ops.h"

static int has_manifest(const char *dir) {
    char path[TG_PATH_MAX + 32];
    struct stat st;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void tg_shard_path_resolve(const char *path, char *dir, size_t n, int *split) {
    *split = -1;
    char p[TG_PATH_MAX + 1];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return;
    size_t len = strlen(p);
    while (len > 1 && p[len - 1] == '/') p[--len] = 0;
    if (has_manifest(p)) {
        snprintf(dir, n, "%s", p);
        *split = TG_SPLIT_TRAIN;
        return;
    }
    char *slash = strrchr(p, '/');
    const char *base = slash ? slash + 1 : p;
    int s = !strcmp(base, "train") ? TG_SPLIT_TRAIN : !strcmp(base, "eval") ? TG_SPLIT_EVAL : -1;
    if (s < 0) return;
    if (!slash) snprintf(p, sizeof p, ".");
    else if (slash == p) p[1] = 0; /* "/eval": the root */
    else {
        *slash = 0;
        len = strlen(p);
        while (len > 1 && p[len - 1] == '/') p[--len] = 0;
    }
    if (has_manifest(p)) {
        snprintf(dir, n, "%s", p);
        *split = s;
    }
}

int tg_shard_path_is_set(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0) return S_ISDIR(st.st_mode);
    char dir[TG_PATH_MAX + 32];
    int split;
    tg_shard_path_resolve(path, dir, sizeof dir, &split);
    return split >= 0;
}

typedef struct pool {
    int32_t *v;
    int64_t n, cap;
} pool;

static int pool_take(pool *p, int64_t n, int64_t *at, tg_err *err) {
    if (p->n + n > p->cap) {
        int64_t cap = p->cap ? p->cap : 4096;
        while (cap < p->n + n) cap *= 2;
        int32_t *v = tg_realloc(p->v, (size_t)cap * sizeof *v);
        if (!v) return tg_fail(err, "out of memory for %lld token ids", (long long)cap);
        p->v = v;
        p->cap = cap;
    }
    *at = p->n;
    p->n += n;
    return 0;
}

static int check_set(const tg_shard_set *set, const char *mpath, const tg_data_rules *r, uint64_t identity,
                     tg_err *err) {
    const tg_shard_manifest *m = &set->manifest;
    if (identity && identity != m->tokenizer_identity)
        return tg_fail(err, "%s: the set was made by tokenizer %016llx, the job's tokenizer is %016llx (convert the "
                            "data again with the model's tokenizer)",
                       mpath, (unsigned long long)m->tokenizer_identity, (unsigned long long)identity);
    if (r->image_channels > 0) {
        if (m->task != TG_SHARD_IMAGE)
            return tg_fail(err, "%s: the set holds %s records (token sequences); the image model takes images of "
                                "%d x %d x %d (convert images with --format idx)",
                           mpath, tg_shard_task_name(m->task), r->image_channels, r->image_size, r->image_size);
        if (m->image_channels != r->image_channels || m->image_height != r->image_size ||
            m->image_width != r->image_size)
            return tg_fail(err, "%s: the set's images are %d x %d x %d, the plan's are %d x %d x %d (image_channels x "
                                "image_size x image_size; convert with --image-size %d, or set the job's keys)",
                           mpath, m->image_channels, m->image_height, m->image_width, r->image_channels,
                           r->image_size, r->image_size, r->image_size);
        if (m->n_labels > r->num_labels)
            return tg_fail(err, "%s: the set has %d labels (%s, ...), the job's num_labels is %d", mpath, m->n_labels,
                           m->labels[0], r->num_labels);
    } else if (m->task == TG_SHARD_IMAGE)
        return tg_fail(err, "%s: the set holds images (%d x %d x %d), not token sequences; a token model cannot "
                            "train on it",
                       mpath, m->image_channels, m->image_height, m->image_width);
    if (r->task == TG_TASK_CLASSIFY && r->image_channels <= 0) {
        if (m->task != TG_SHARD_CLASSIFY)
            return tg_fail(err, "%s: the set holds %s records, without labels; task classify needs a set converted "
                                "with labels (a label column, or --format folders)",
                           mpath, tg_shard_task_name(m->task));
        if (m->n_labels > r->num_labels)
            return tg_fail(err, "%s: the set has %d labels (%s, ...), the job's num_labels is %d", mpath, m->n_labels,
                           m->labels[0], r->num_labels);
    }
    if (r->task == TG_TASK_QA && m->task != TG_SHARD_QA)
        return tg_fail(err, "%s: the set holds %s records, without answer positions; task qa needs a set converted "
                            "with --format squad",
                       mpath, tg_shard_task_name(m->task));
    if (set->n_records == 0)
        return tg_fail(err, "%s: the set has no %s records%s", set->dir, tg_shard_split_name(set->split),
                       set->split == TG_SPLIT_EVAL ? " (convert with --eval-fraction to make an eval split)" : "");
    if (set->n_records > INT32_MAX)
        return tg_fail(err, "%s: %lld %s records, more than one dataset holds (%d)", set->dir,
                       (long long)set->n_records, tg_shard_split_name(set->split), INT32_MAX);
    return 0;
}

/* The record against the job's rules; where names the shard and record. */
static int check_record(const tg_shard_record *rec, const tg_data_rules *r, const char *where, tg_err *err) {
    for (int32_t t = 0; r->vocab_size > 0 && t < rec->len; t++)
        if (rec->input_ids[t] >= r->vocab_size)
            return tg_fail(err, "%s: input_ids[%d] = %d is outside the vocabulary (vocab_size %d; wrong vocab? "
                                "convert with the model's tokenizer)",
                           where, t, rec->input_ids[t], r->vocab_size);
    for (int32_t t = 0; rec->token_type_ids && t < rec->len; t++) {
        int32_t limit = r->type_vocab_size > 0 ? r->type_vocab_size : 1;
        if (rec->token_type_ids[t] >= limit)
            return tg_fail(err, "%s: token_type_ids[%d] = %d %s", where, t, rec->token_type_ids[t],
                           r->type_vocab_size > 0 ? "is outside type_vocab_size" : "but the model has no token types");
    }
    if (r->task == TG_TASK_CLASSIFY && rec->label >= r->num_labels) /* GCOVR_EXCL_BR_LINE: the reader refuses a label outside the set's labels, and the set's labels were checked against num_labels */
        return tg_fail(err, "%s: label %d is out of range for num_labels %d", where, rec->label, r->num_labels);
    return 0;
}

/* An image set's records, the set and cursor open: each image's bytes in one block (a byte
 * a pixel, as stored; the reader gives them as ids in 0..255), example i's at i x len; closes
 * the cursor and the set. */
static int load_images(const char *path, tg_shard_set *set, tg_shard_cursor *cur, const tg_data_rules *rules,
                       tg_dataset *ds, tg_err *err) {
    const int32_t n = (int32_t)set->n_records;
    const int64_t per = (int64_t)rules->image_channels * rules->image_size * rules->image_size;
    tg_example *ex = tg_calloc((size_t)n, sizeof *ex);
    uint64_t bytes = 0;
    int rc = __builtin_mul_overflow((uint64_t)n, (uint64_t)per, &bytes) || bytes > SIZE_MAX
                 ? tg_fail(err, "%s: %d images of %lld pixels are more bytes than memory holds", path, n, (long long)per)
                 : 0;
    uint8_t *pool = rc ? NULL : tg_malloc((size_t)bytes);
    if (!rc && (!ex || !pool))
        rc = tg_fail(err, "%s: out of memory for %d images (%llu bytes)", path, n, (unsigned long long)bytes);
    for (int32_t i = 0; i < n && !rc; i++) {
        tg_shard_record rec;
        if ((rc = tg_shard_cursor_get(cur, i, &rec, err))) break;
        int32_t file;
        int64_t local;
        tg_shard_set_locate(set, i, &file, &local);
        char where[TG_PATH_MAX + 128];
        snprintf(where, sizeof where, "%s: record %lld", set->files[file].path, (long long)local);
        if ((rc = check_record(&rec, rules, where, err))) break;
        if (rec.len != per) { /* GCOVR_EXCL_BR_LINE: the reader checks every record's length against the manifest's shape, which check_set matched to the plan's */
            rc = tg_fail(err, "%s: %d pixels, the plan's images have %lld", where, rec.len, (long long)per);
            break;
        }
        uint8_t *dst = pool + (int64_t)i * per;
        for (int64_t k = 0; k < per; k++) dst[k] = (uint8_t)rec.input_ids[k];
        ex[i] = (tg_example){.len = rec.len, .pixels = dst, .label = rec.label};
        ds->n_tokens += rec.len;
    }
    tg_shard_cursor_close(cur);
    tg_shard_set_close(set);
    if (rc) {
        free(ex);
        free(pool);
        ds->n_tokens = 0;
        return -1;
    }
    ds->n = n;
    ds->examples = ex;
    return 0;
}

int tg_shard_dataset_load(const char *path, const tg_data_rules *rules, uint64_t tokenizer_identity, tg_dataset *ds,
                          tg_err *err) {
    memset(ds, 0, sizeof *ds);
    if (snprintf(ds->path, sizeof ds->path, "%s", path) >= (int)sizeof ds->path)
        return tg_fail(err, "%s: dataset path is too long", path);
    char dir[TG_PATH_MAX + 32];
    int split;
    tg_shard_path_resolve(path, dir, sizeof dir, &split);
    if (split < 0) {
        struct stat st;
        if (stat(path, &st) != 0) return tg_fail(err, "%s: cannot open dataset: %s", path, strerror(errno));
        return tg_fail(err, "%s: a folder, but not a shard set (no manifest.json in it, nor in its parent for "
                            "OUTDIR/train or OUTDIR/eval)",
                       path);
    }
    tg_shard_set set;
    if (tg_shard_set_open(dir, split, &set, err)) return -1;
    char mpath[TG_PATH_MAX + 48];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", set.dir);
    tg_shard_cursor cur;
    if (check_set(&set, mpath, rules, tokenizer_identity, err) || tg_shard_cursor_open(&cur, &set, err)) {
        tg_shard_set_close(&set);
        return -1;
    }
    const int32_t n = (int32_t)set.n_records;
    if (rules->image_channels > 0) return load_images(path, &set, &cur, rules, ds, err);
    tg_example *ex = tg_calloc((size_t)n, sizeof *ex);
    int64_t *ids_at = tg_malloc((size_t)n * sizeof *ids_at), *types_at = tg_malloc((size_t)n * sizeof *types_at);
    pool p = {0};
    int rc = ex && ids_at && types_at ? 0 : tg_fail(err, "%s: out of memory for %d examples", path, n);
    for (int32_t i = 0; i < n && !rc; i++) {
        tg_shard_record rec;
        if ((rc = tg_shard_cursor_get(&cur, i, &rec, err))) break;
        int32_t file;
        int64_t local;
        tg_shard_set_locate(&set, i, &file, &local);
        char where[TG_PATH_MAX + 128];
        snprintf(where, sizeof where, "%s: record %lld", set.files[file].path, (long long)local);
        if ((rc = check_record(&rec, rules, where, err)) || (rc = pool_take(&p, rec.len, &ids_at[i], err))) break;
        memcpy(p.v + ids_at[i], rec.input_ids, (size_t)rec.len * sizeof *p.v);
        types_at[i] = -1;
        if (rec.token_type_ids) {
            if ((rc = pool_take(&p, rec.len, &types_at[i], err))) break;
            memcpy(p.v + types_at[i], rec.token_type_ids, (size_t)rec.len * sizeof *p.v);
        }
        ex[i] = (tg_example){.len = rec.len, .label = rules->task == TG_TASK_CLASSIFY ? rec.label : TG_IGNORE_INDEX};
        if (rules->task == TG_TASK_QA) ex[i].label = rec.start, ex[i].label_end = rec.end;
        if (rules->task == TG_TASK_LM) ex[i].prompt_len = rec.prompt_len; /* 0 but in instruct sets */
    }
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    if (!rc) {
        /* Examples point into one pool that starts with example 0's ids, as tg_dataset_free
         * expects. A shrink that fails keeps the larger block: no allocation for the hook. */
        int32_t *v = realloc(p.v, (size_t)p.n * sizeof *v);
        if (v) p.v = v; /* GCOVR_EXCL_BR_LINE: a realloc that shrinks the block does not fail */
        for (int32_t i = 0; i < n; i++) {
            ex[i].input_ids = p.v + ids_at[i];
            ex[i].token_type_ids = types_at[i] >= 0 ? p.v + types_at[i] : NULL;
            ds->n_tokens += ex[i].len;
        }
        ds->n = n;
        ds->examples = ex;
    } else {
        free(ex);
        free(p.v);
    }
    free(ids_at);
    free(types_at);
    return rc;
}
