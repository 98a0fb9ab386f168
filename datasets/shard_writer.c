#include "datasets/shard_writer.h"
#include "base/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "datasets/shard_manifest.h"
#include "plan/plan.h"

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "base/zstd_alloc.h"

#define ZSTD_LEVEL 3
#define DEFAULT_FRAME_BYTES (32 << 10)
#define DEFAULT_SHARD_BYTES (64 << 20)
#define HIST_BIN 8

typedef struct frame_entry {
    uint64_t offset, first;
    uint32_t csize, usize;
} frame_entry;

/* The shard a split is writing, and its block in the making. */
typedef struct split_out {
    int fd;                        /* -1: no shard open */
    char path[TG_PATH_MAX + 64];
    char file[TG_SHARD_FILE_MAX];
    XXH64_state_t hash;
    uint64_t offset;               /* bytes written to the shard */
    int64_t shard_records, shard_block_bytes;
    frame_entry *frames;
    int64_t n_frames;
    size_t cap_frames;
    uint8_t *area;                 /* the block's records */
    size_t area_len, area_cap;
    uint32_t *ends;
    int64_t n_block;
    size_t cap_block;
    int32_t n_shards;
    int64_t records, tokens;
    int has_dir;
} split_out;

struct tg_shard_writer {
    tg_shard_set_desc desc;
    char outdir[TG_PATH_MAX];
    char tmp[TG_PATH_MAX + 64];
    ZSTD_CCtx *cctx;
    uint8_t *staging, *compressed;  /* a whole block, and its frame */
    size_t staging_cap, compressed_cap;
    split_out split[TG_SPLIT_COUNT];
    tg_shard_manifest m;            /* the entries as shards close */
    int32_t cap_shards;
    int any_types;
};

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path) ? -1 : 0;
}

int tg_shard_remove_tree(const char *dir) { return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void sync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Whether a folder holds a shard set's manifest (of any version), so may be replaced. */
static int holds_shard_set(const char *dir) {
    char path[TG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_t *root = json_load_file(path, 0, NULL);
    json_t *format = json_object_get(root, "format");
    int yes = json_is_string(format) && !strcmp(json_string_value(format), "tunegraph-shards");
    json_decref(root);
    return yes;
}

static int folder_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int empty = 1;
    while (empty && (e = readdir(d))) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* What is at OUTDIR: 0 nothing (or an empty folder), 1 a shard set to replace, -1 refused. */
static int outdir_state(const char *outdir, tg_err *err) {
    struct stat st;
    if (lstat(outdir, &st) != 0) {
        if (errno == ENOENT) return 0;
        return tg_fail(err, "%s: %s", outdir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return tg_fail(err, "%s: exists and is not a folder (the output is a new folder; choose another name)",
                       outdir);
    if (folder_is_empty(outdir)) return 0;
    if (holds_shard_set(outdir)) return 1;
    return tg_fail(err, "%s: exists and is not a shard set (it would be replaced; remove it or choose another "
                        "name)",
                   outdir);
}

static void block_reset(split_out *s) {
    s->area_len = 0;
    s->n_block = 0;
}

static int reserve(void **p, size_t *cap, size_t need, size_t size, tg_err *err) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = tg_realloc(*p, c * size);
    if (!q) return tg_fail(err, "shard writer: out of memory");
    *p = q;
    *cap = c;
    return 0;
}

static int write_all(split_out *s, const void *p, size_t n, tg_err *err) {
    const uint8_t *b = p;
    XXH64_update(&s->hash, b, n);
    while (n > 0) {
        ssize_t w = write(s->fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue; /* GCOVR_EXCL_BR_LINE: only a signal handler installed without SA_RESTART interrupts it */
            return tg_fail(err, "%s: cannot write: %s", s->path, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
        s->offset += (uint64_t)w;
    }
    return 0;
}

static int shard_begin(tg_shard_writer *w, int split, tg_err *err) {
    split_out *s = &w->split[split];
    const char *name = tg_shard_split_name(split);
    if (!s->has_dir) {
        char dir[TG_PATH_MAX + 64];
        snprintf(dir, sizeof dir, "%s/%s", w->tmp, name);
        if (mkdir(dir, 0755) != 0) return tg_fail(err, "%s: cannot create: %s", dir, strerror(errno));
        s->has_dir = 1;
    }
    snprintf(s->file, sizeof s->file, "%s/%05d.tgshard", name, s->n_shards);
    char path[sizeof s->path];
    snprintf(path, sizeof path, "%s/%s", w->tmp, s->file);
    memcpy(s->path, path, sizeof path);
    s->fd = open(s->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (s->fd < 0) return tg_fail(err, "%s: cannot create: %s", s->path, strerror(errno));
    XXH64_reset(&s->hash, 0);
    s->offset = 0;
    s->shard_records = s->shard_block_bytes = 0;
    s->n_frames = 0;
    uint8_t head[TG_SHARD_HEADER_BYTES];
    memcpy(head, tg_shard_magic, 8);
    tg_put_le32(head + 8, TG_SHARD_VERSION);
    tg_put_le32(head + 12, (uint32_t)w->desc.task);
    return write_all(s, head, sizeof head, err);
}

/* Compresses the split's pending block into one frame of its shard. */
static int frame_flush(tg_shard_writer *w, int split, tg_err *err) {
    split_out *s = &w->split[split];
    if (s->n_block == 0) return 0;
    size_t ubytes = 4 + 4 * (size_t)s->n_block + s->area_len;
    if (reserve((void **)&w->staging, &w->staging_cap, ubytes, 1, err)) return -1;
    tg_put_le32(w->staging, (uint32_t)s->n_block);
    for (int64_t i = 0; i < s->n_block; i++) tg_put_le32(w->staging + 4 + 4 * i, s->ends[i]);
    memcpy(w->staging + 4 + 4 * s->n_block, s->area, s->area_len);
    size_t bound = ZSTD_compressBound(ubytes);
    if (reserve((void **)&w->compressed, &w->compressed_cap, bound, 1, err)) return -1;
    size_t csize = ZSTD_compress2(w->cctx, w->compressed, bound, w->staging, ubytes);
    if (ZSTD_isError(csize))
        return tg_fail(err, "%s: zstd: %s", s->path, /* GCOVR_EXCL_BR_LINE: the destination holds ZSTD_compressBound bytes and the context's parameters were accepted when it was made: only an allocation fails */
                       tg_zstd_out_of_memory(csize) ? "out of memory for the zstd compressor" : ZSTD_getErrorName(csize));
    if (reserve((void **)&s->frames, &s->cap_frames, (size_t)s->n_frames + 1, sizeof *s->frames, err))
        return -1;
    s->frames[s->n_frames++] = (frame_entry){.offset = s->offset, .first = (uint64_t)s->shard_records,
                                             .csize = (uint32_t)csize, .usize = (uint32_t)ubytes};
    if (write_all(s, w->compressed, csize, err)) return -1;
    s->shard_records += s->n_block;
    s->shard_block_bytes += (int64_t)ubytes;
    block_reset(s);
    return 0;
}

/* Writes the index and footer, closes the shard and lists it in the manifest. */
static int shard_end(tg_shard_writer *w, int split, tg_err *err) {
    split_out *s = &w->split[split];
    if (s->fd < 0) return 0;
    if (frame_flush(w, split, err)) return -1;
    uint64_t index_at = s->offset;
    size_t n = (size_t)s->n_frames * TG_SHARD_INDEX_ENTRY_BYTES + TG_SHARD_FOOTER_BYTES;
    if (reserve((void **)&w->staging, &w->staging_cap, n, 1, err)) return -1;
    uint8_t *p = w->staging;
    for (int64_t i = 0; i < s->n_frames; i++, p += TG_SHARD_INDEX_ENTRY_BYTES) {
        tg_put_le64(p, s->frames[i].offset);
        tg_put_le32(p + 8, s->frames[i].csize);
        tg_put_le32(p + 12, s->frames[i].usize);
        tg_put_le64(p + 16, s->frames[i].first);
    }
    tg_put_le64(p, index_at);
    tg_put_le64(p + 8, (uint64_t)s->n_frames);
    tg_put_le64(p + 16, (uint64_t)s->shard_records);
    memcpy(p + 24, tg_shard_footer_magic, 8);
    if (write_all(s, w->staging, n, err)) return -1;
    int rc = fsync(s->fd);
    if (close(s->fd) != 0) rc = -1; /* GCOVR_EXCL_BR_LINE: close fails only on the device's I/O errors, which no test can cause */
    s->fd = -1;
    if (rc) return tg_fail(err, "%s: cannot write: %s", s->path, strerror(errno)); /* GCOVR_EXCL_BR_LINE: fsync and close fail only on the device's I/O errors, which no test can cause */
    tg_shard_manifest *m = &w->m;
    if (m->n_shards == w->cap_shards) {
        int32_t cap = w->cap_shards ? 2 * w->cap_shards : 8;
        tg_shard_entry *e = tg_realloc(m->shards, (size_t)cap * sizeof *e);
        if (!e) return tg_fail(err, "shard writer: out of memory");
        m->shards = e;
        w->cap_shards = cap;
    }
    tg_shard_entry *e = &m->shards[m->n_shards++];
    memset(e, 0, sizeof *e);
    memcpy(e->file, s->file, sizeof e->file);
    e->split = split;
    e->records = s->shard_records;
    e->bytes = (int64_t)s->offset;
    e->xxh64 = XXH64_digest(&s->hash);
    s->n_shards++;
    return 0;
}

int tg_shard_writer_open(const char *outdir, const tg_shard_set_desc *desc, tg_shard_writer **out, tg_err *err) {
    *out = NULL;
    size_t len = strlen(outdir);
    while (len > 1 && outdir[len - 1] == '/') len--;
    if (len == 0 || len >= TG_PATH_MAX) return tg_fail(err, "output folder: path is empty or too long");
    if (desc->seq < 1 || desc->seq > TG_SHARD_SEQ_MAX)
        return tg_fail(err, "seq %d is outside 1 to %d", desc->seq, TG_SHARD_SEQ_MAX);
    if (desc->vocab_size < 1) return tg_fail(err, "the tokenizer's vocabulary is empty");
    if (desc->task == TG_SHARD_IMAGE &&
        (desc->image_channels < 1 || desc->image_height < 1 || desc->image_width < 1 ||
         (int64_t)desc->image_channels * desc->image_height * desc->image_width != desc->seq || desc->vocab_size != 256))
        return tg_fail(err, "an image set of %d x %d x %d needs seq their product (got %d) and vocab_size 256 (got %d)",
                       desc->image_channels, desc->image_height, desc->image_width, desc->seq, desc->vocab_size);
    if ((desc->task == TG_SHARD_CLASSIFY || desc->task == TG_SHARD_IMAGE) != (desc->n_labels > 0))
        return tg_fail(err, "a %s set has %d labels", tg_shard_task_name(desc->task), desc->n_labels);
    tg_shard_writer *w = tg_calloc(1, sizeof *w);
    if (!w) return tg_fail(err, "out of memory");
    w->desc = *desc;
    memcpy(w->outdir, outdir, len);
    for (int s = 0; s < TG_SPLIT_COUNT; s++) w->split[s].fd = -1;
    if (outdir_state(w->outdir, err) < 0) {
        free(w);
        return -1;
    }
    /* The temporary folder sits beside OUTDIR, so the final rename stays on one file system. */
    const char *slash = strrchr(w->outdir, '/');
    if (slash == w->outdir) snprintf(w->tmp, sizeof w->tmp, "/.%s.tmp-XXXXXX", w->outdir + 1);
    else if (slash) snprintf(w->tmp, sizeof w->tmp, "%.*s/.%s.tmp-XXXXXX", (int)(slash - w->outdir), w->outdir, slash + 1);
    else snprintf(w->tmp, sizeof w->tmp, ".%s.tmp-XXXXXX", w->outdir);
    if (!mkdtemp(w->tmp)) {
        tg_fail(err, "%s: cannot create a temporary folder beside it: %s", w->outdir, strerror(errno));
        free(w);
        return -1;
    }
    (void)chmod(w->tmp, 0755); /* mkdtemp's 0700 would carry over to OUTDIR */
    tg_shard_manifest *m = &w->m;
    m->version = TG_SHARD_VERSION;
    m->task = desc->task;
    m->seq = desc->seq;
    m->doc_stride = desc->doc_stride;
    m->hist_bin = HIST_BIN;
    m->n_bins = (desc->seq + HIST_BIN - 1) / HIST_BIN;
    m->tokenizer_identity = desc->tokenizer_identity;
    m->vocab_size = desc->vocab_size;
    if (desc->task == TG_SHARD_IMAGE) {
        m->image_channels = desc->image_channels;
        m->image_height = desc->image_height;
        m->image_width = desc->image_width;
    }
    snprintf(m->tokenizer_family, sizeof m->tokenizer_family, "%s", desc->tokenizer_family ? desc->tokenizer_family : "");
    int ok = (w->cctx = tg_zstd_cctx()) != NULL;
    ok = ok && (m->command = tg_strdup(desc->command ? desc->command : "")) != NULL;
    for (int s = 0; s < TG_SPLIT_COUNT && ok; s++) ok = (m->hist[s] = tg_calloc((size_t)m->n_bins, sizeof *m->hist[s])) != NULL;
    if (ok && desc->n_labels) {
        ok = (m->labels = tg_calloc((size_t)desc->n_labels, sizeof *m->labels)) != NULL;
        for (int32_t i = 0; ok && i < desc->n_labels; i++) {
            ok = (m->labels[i] = tg_strdup(desc->labels[i])) != NULL;
            m->n_labels = i + 1;
        }
    }
    if (ok) {
        ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel, ZSTD_LEVEL);
        ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1);
        ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_contentSizeFlag, 1);
    }
    if (!ok) {
        tg_shard_writer_abort(w);
        return tg_fail(err, "out of memory");
    }
    if (!w->desc.frame_bytes) w->desc.frame_bytes = DEFAULT_FRAME_BYTES;
    if (!w->desc.shard_bytes) w->desc.shard_bytes = DEFAULT_SHARD_BYTES;
    if (w->desc.frame_bytes > TG_SHARD_BLOCK_MAX / 2) w->desc.frame_bytes = TG_SHARD_BLOCK_MAX / 2;
    *out = w;
    return 0;
}

int64_t tg_shard_writer_count(const tg_shard_writer *w, int split) {
    return split >= 0 && split < TG_SPLIT_COUNT ? w->split[split].records : 0;
}

static int check_record(const tg_shard_writer *w, int split, const tg_shard_record *r, int *types, tg_err *err) {
    const tg_shard_set_desc *d = &w->desc;
    char at[64];
    snprintf(at, sizeof at, "record %lld of the %s split", (long long)w->split[split].records,
             tg_shard_split_name(split));
    if (r->len < 1 || r->len > d->seq)
        return tg_fail(err, "shard writer: %s has %d tokens, outside 1 to seq %d", at, r->len, d->seq);
    for (int32_t i = 0; i < r->len; i++)
        if (r->input_ids[i] < 0 || r->input_ids[i] >= d->vocab_size)
            return tg_fail(err, "shard writer: %s: input_ids[%d] = %d is outside the vocabulary (%d)", at, i,
                           r->input_ids[i], d->vocab_size);
    *types = 0;
    for (int32_t i = 0; r->token_type_ids && i < r->len; i++) {
        if (r->token_type_ids[i] < 0 || r->token_type_ids[i] > 255)
            return tg_fail(err, "shard writer: %s: token_type_ids[%d] = %d is outside 0 to 255", at, i,
                           r->token_type_ids[i]);
        *types |= r->token_type_ids[i] != 0;
    }
    if (d->task == TG_SHARD_IMAGE && (r->len != d->seq || *types))
        return tg_fail(err, "shard writer: %s: an image of %d values%s, the set's images have %d", at, r->len,
                       *types ? " with token types" : "", d->seq);
    if ((d->task == TG_SHARD_CLASSIFY || d->task == TG_SHARD_IMAGE) && (r->label < 0 || r->label >= d->n_labels))
        return tg_fail(err, "shard writer: %s: label %d is outside 0 to %d", at, r->label, d->n_labels - 1);
    if (d->task == TG_SHARD_QA && (r->start < 0 || r->start > r->end || r->end >= r->len))
        return tg_fail(err, "shard writer: %s: answer tokens %d to %d are outside the record's %d tokens", at,
                       r->start, r->end, r->len);
    if (d->task == TG_SHARD_INSTRUCT && (r->prompt_len < 1 || r->prompt_len >= r->len))
        return tg_fail(err, "shard writer: %s: a prompt of %d tokens is outside 1 to %d (the record's %d tokens "
                            "less one response token)",
                       at, r->prompt_len, r->len - 1, r->len);
    return 0;
}

int tg_shard_writer_add(tg_shard_writer *w, int split, const tg_shard_record *r, tg_err *err) {
    if (split < 0 || split >= TG_SPLIT_COUNT) return tg_fail(err, "shard writer: no split %d", split);
    int types = 0;
    if (check_record(w, split, r, &types, err)) return -1;
    split_out *s = &w->split[split];
    const uint32_t head = tg_shard_record_head(w->desc.task);
    const uint32_t value_bytes = tg_shard_value_bytes(w->desc.task);
    const size_t size = head + value_bytes * (size_t)r->len + (types ? (size_t)r->len : 0);
    if (s->n_block && s->area_len + size > (size_t)w->desc.frame_bytes && frame_flush(w, split, err)) return -1;
    if (s->fd >= 0 && s->n_block == 0 && s->shard_block_bytes >= w->desc.shard_bytes && shard_end(w, split, err))
        return -1;
    if (s->fd < 0 && shard_begin(w, split, err)) return -1;
    if (reserve((void **)&s->area, &s->area_cap, s->area_len + size, 1, err) ||
        reserve((void **)&s->ends, &s->cap_block, (size_t)s->n_block + 1, sizeof *s->ends, err))
        return -1;
    uint8_t *p = s->area + s->area_len;
    tg_put_le32(p, (uint32_t)r->len);
    tg_put_le32(p + 4, types ? TG_SHARD_FLAG_TYPES : 0);
    if (w->desc.task == TG_SHARD_CLASSIFY || w->desc.task == TG_SHARD_IMAGE) tg_put_le32(p + 8, (uint32_t)r->label);
    if (w->desc.task == TG_SHARD_INSTRUCT) tg_put_le32(p + 8, (uint32_t)r->prompt_len);
    if (w->desc.task == TG_SHARD_QA) {
        tg_put_le32(p + 8, (uint32_t)r->start);
        tg_put_le32(p + 12, (uint32_t)r->end);
    }
    p += head;
    if (value_bytes == 1)
        for (int32_t i = 0; i < r->len; i++) *p++ = (uint8_t)r->input_ids[i];
    else
        for (int32_t i = 0; i < r->len; i++, p += 4) tg_put_le32(p, (uint32_t)r->input_ids[i]);
    for (int32_t i = 0; types && i < r->len; i++) *p++ = (uint8_t)r->token_type_ids[i];
    s->area_len += size;
    s->ends[s->n_block++] = (uint32_t)s->area_len;
    s->records++;
    s->tokens += r->len;
    w->m.hist[split][(r->len - 1) / HIST_BIN]++;
    w->any_types |= types;
    return 0;
}

/* Frees w; its shards are closed (by shard_end on commit, by tg_shard_writer_abort). */
static void writer_free(tg_shard_writer *w) {
    for (int s = 0; s < TG_SPLIT_COUNT; s++) {
        split_out *o = &w->split[s];
        free(o->frames);
        free(o->area);
        free(o->ends);
    }
    ZSTD_freeCCtx(w->cctx);
    free(w->staging);
    free(w->compressed);
    tg_shard_manifest_free(&w->m);
    free(w);
}

void tg_shard_writer_abort(tg_shard_writer *w) {
    if (!w) return;
    for (int s = 0; s < TG_SPLIT_COUNT; s++)
        if (w->split[s].fd >= 0) {
            close(w->split[s].fd);
            w->split[s].fd = -1;
        }
    tg_shard_remove_tree(w->tmp); /* a writer exists only once its temporary folder does */
    writer_free(w);
}

/* Moves the finished temporary folder to OUTDIR: a rename, or, over an existing set, an
 * atomic swap followed by removing the old set. */
static int install(tg_shard_writer *w, tg_err *err) {
    int state = outdir_state(w->outdir, err);
    if (state < 0) return -1;
    if (state == 0) {
        if (rename(w->tmp, w->outdir) != 0)
            return tg_fail(err, "%s: cannot move the new set into place: %s", w->outdir, strerror(errno));
    } else {
        if (renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->outdir, RENAME_EXCHANGE) != 0)
            return tg_fail(err, "%s: cannot swap the new set for the old one: %s", w->outdir, strerror(errno));
        tg_shard_remove_tree(w->tmp); /* the old set now */
    }
    w->tmp[0] = 0;
    char parent[TG_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", w->outdir);
    char *slash = strrchr(parent, '/');
    if (slash) *(slash == parent ? slash + 1 : slash) = 0;
    sync_path(slash ? parent : ".");
    return 0;
}

const char *tg_shard_writer_folder(const tg_shard_writer *w) { return w->tmp; }

int tg_shard_writer_commit(tg_shard_writer *w, tg_err *err) {
    tg_shard_manifest *m = &w->m;
    int rc = 0;
    for (int s = 0; s < TG_SPLIT_COUNT && !rc; s++) rc = shard_end(w, s, err);
    if (!rc && w->split[TG_SPLIT_TRAIN].records + w->split[TG_SPLIT_EVAL].records == 0)
        rc = tg_fail(err, "%s: no records to write", w->outdir);
    char *text = NULL;
    size_t len = 0;
    if (!rc) {
        for (int s = 0; s < TG_SPLIT_COUNT; s++) {
            m->records[s] = w->split[s].records;
            m->tokens[s] = w->split[s].tokens;
        }
        m->token_types = w->any_types;
        rc = tg_shard_manifest_format(m, &text, &len, err);
    }
    if (!rc) {
        char path[TG_PATH_MAX + 96];
        snprintf(path, sizeof path, "%s/manifest.json", w->tmp);
        tg_chunk chunk = {text, len};
        rc = tg_write_file_atomic(path, &chunk, 1, "shard set manifest", err);
        for (int s = 0; s < TG_SPLIT_COUNT && !rc; s++)
            if (w->split[s].has_dir) {
                snprintf(path, sizeof path, "%s/%s", w->tmp, tg_shard_split_name(s));
                sync_path(path);
            }
        sync_path(w->tmp);
    }
    free(text);
    if (!rc) rc = install(w, err);
    if (rc) tg_shard_writer_abort(w);
    else writer_free(w);
    return rc;
}
