#include "datasets/shard_reader.h"
#include "base/alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "base/zstd_alloc.h"

static int read_at(int fd, void *buf, size_t n, uint64_t offset) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue; /* GCOVR_EXCL_BR_LINE: only a signal handler installed without SA_RESTART interrupts it */
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return 0;
}

/* xxh64 of the whole file, read in 1 MiB pieces. -1 on a read error, -2 out of memory. */
static int hash_file(int fd, uint64_t size, uint64_t *out) {
    enum { PIECE = 1 << 20 };
    uint8_t *buf = tg_malloc(PIECE);
    if (!buf) return -2;
    XXH64_state_t st;
    XXH64_reset(&st, 0);
    int rc = 0;
    for (uint64_t at = 0; at < size && !rc;) { /* GCOVR_EXCL_BR_LINE: !rc false before the last piece: a read fails inside the size fstat gave only on an I/O error or a file cut short meanwhile */
        size_t n = size - at < PIECE ? (size_t)(size - at) : PIECE;
        rc = read_at(fd, buf, n, at);
        XXH64_update(&st, buf, n);
        at += n;
    }
    free(buf);
    *out = XXH64_digest(&st);
    return rc;
}

/* Reads and checks one shard's header, footer and index against its manifest entry. */
static int open_file(const tg_shard_set *set, const tg_shard_entry *e, tg_shard_file *f, tg_err *err) {
    const tg_shard_manifest *m = &set->manifest;
    const char *path = f->path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_fail(err, "%s: cannot open the shard: %s", path, strerror(errno));
    int rc = -1;
    uint8_t *index = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) { /* GCOVR_EXCL_BR_LINE: fstat of the descriptor just opened fails only on the device's I/O errors */
        tg_fail(err, "%s: %s", path, strerror(errno));
        goto done;
    }
    if ((uint64_t)st.st_size != (uint64_t)e->bytes) {
        tg_fail(err, "%s: %s: the manifest says %lld bytes, the file has %lld (file corrupt or from another set)",
                path, st.st_size < e->bytes ? "truncated" : "wrong size", (long long)e->bytes, (long long)st.st_size);
        goto done;
    }
    uint64_t sum;
    const int hashed = hash_file(fd, (uint64_t)e->bytes, &sum);
    if (hashed) {
        if (hashed == -2) tg_fail(err, "%s: out of memory for the checksum's read buffer", path);
        else tg_fail(err, "%s: read error: %s", path, strerror(errno ? errno : EIO)); /* GCOVR_EXCL_BR_LINE: errno 0: pread found the end of the file inside the size fstat gave, only when the file is cut short meanwhile */
        goto done;
    }
    if (sum != e->xxh64) {
        tg_fail(err, "%s: checksum mismatch: xxh64 %016llx, the manifest says %016llx (file corrupt)", path,
                (unsigned long long)sum, (unsigned long long)e->xxh64);
        goto done;
    }
    uint8_t head[TG_SHARD_HEADER_BYTES], foot[TG_SHARD_FOOTER_BYTES];
    const uint64_t size = (uint64_t)e->bytes;
    if (read_at(fd, head, sizeof head, 0) || read_at(fd, foot, sizeof foot, size - sizeof foot)) { /* GCOVR_EXCL_BR_LINE: hash_file has just read the whole file, of the size fstat gave */
        tg_fail(err, "%s: read error", path);
        goto done;
    }
    if (memcmp(head, tg_shard_magic, 8) || memcmp(foot + 24, tg_shard_footer_magic, 8)) {
        tg_fail(err, "%s: not a tunegraph shard (bad magic)", path);
        goto done;
    }
    if (tg_get_le32(head + 8) != TG_SHARD_VERSION) {
        tg_fail(err, "%s: shard format version %u, this build reads version %d", path, tg_get_le32(head + 8),
                TG_SHARD_VERSION);
        goto done;
    }
    if (tg_get_le32(head + 12) != (uint32_t)m->task) {
        tg_fail(err, "%s: holds records of kind %u, the manifest says %s", path, tg_get_le32(head + 12),
                tg_shard_task_name(m->task));
        goto done;
    }
    const uint64_t index_at = tg_get_le64(foot), n_frames = tg_get_le64(foot + 8), records = tg_get_le64(foot + 16);
    if (records != (uint64_t)e->records) {
        tg_fail(err, "%s: the footer says %llu records, the manifest %lld", path, (unsigned long long)records,
                (long long)e->records);
        goto done;
    }
    if (n_frames == 0 || n_frames > records || index_at < TG_SHARD_HEADER_BYTES ||
        index_at > size - TG_SHARD_FOOTER_BYTES ||
        (size - TG_SHARD_FOOTER_BYTES - index_at) / TG_SHARD_INDEX_ENTRY_BYTES != n_frames ||
        (size - TG_SHARD_FOOTER_BYTES - index_at) % TG_SHARD_INDEX_ENTRY_BYTES) {
        tg_fail(err, "%s: the footer's index (%llu frames at byte %llu) does not fit the file (file corrupt)", path,
                (unsigned long long)n_frames, (unsigned long long)index_at);
        goto done;
    }
    size_t index_len = (size_t)n_frames * TG_SHARD_INDEX_ENTRY_BYTES;
    index = tg_malloc(index_len);
    f->frames = tg_calloc((size_t)n_frames, sizeof *f->frames);
    if (!index || !f->frames) {
        tg_fail(err, "%s: out of memory", path);
        goto done;
    }
    if (read_at(fd, index, index_len, index_at)) { /* GCOVR_EXCL_BR_LINE: hash_file has just read the whole file, of the size fstat gave */
        tg_fail(err, "%s: read error", path);
        goto done;
    }
    const uint32_t head_min = tg_shard_record_head(m->task) + 4; /* the smallest record, and its end */
    uint64_t expect_at = TG_SHARD_HEADER_BYTES;
    for (uint64_t i = 0; i < n_frames; i++) {
        const uint8_t *p = index + i * TG_SHARD_INDEX_ENTRY_BYTES;
        tg_shard_frame *fr = &f->frames[i];
        fr->offset = tg_get_le64(p);
        fr->csize = tg_get_le32(p + 8);
        fr->usize = tg_get_le32(p + 12);
        uint64_t first = tg_get_le64(p + 16), next = i + 1 < n_frames ? tg_get_le64(p + 16 + TG_SHARD_INDEX_ENTRY_BYTES) : records;
        const char *bad = NULL;
        if (fr->offset != expect_at || fr->csize == 0 || fr->csize > index_at - fr->offset) bad = "its bytes";
        else if (first != (i ? (uint64_t)f->frames[i - 1].first + (uint64_t)f->frames[i - 1].count : 0) || next <= first ||
                 next > records)
            bad = "its records";
        else if (fr->usize > TG_SHARD_BLOCK_MAX || fr->usize / TG_SHARD_MAX_EXPANSION > fr->csize ||
                 (uint64_t)fr->usize < 4 + (next - first) * head_min)
            bad = "its block size";
        if (bad) {
            tg_fail(err, "%s: frame %llu of the index is inconsistent (%s; file corrupt)", path, (unsigned long long)i,
                    bad);
            goto done;
        }
        fr->first = (int64_t)first;
        fr->count = (int64_t)(next - first);
        expect_at = fr->offset + fr->csize;
    }
    if (expect_at != index_at) {
        tg_fail(err, "%s: the frames end at byte %llu, the index starts at %llu (file corrupt)", path,
                (unsigned long long)expect_at, (unsigned long long)index_at);
        goto done;
    }
    f->n_frames = (int32_t)n_frames;
    f->records = (int64_t)records;
    rc = 0;
done:
    free(index);
    close(fd);
    return rc;
}

int tg_shard_set_open(const char *dir, int split, tg_shard_set *set, tg_err *err) {
    memset(set, 0, sizeof *set);
    if (split < 0 || split >= TG_SPLIT_COUNT) return tg_fail(err, "%s: no split %d", dir, split);
    set->split = split;
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/') dlen--;
    if (!(set->dir = tg_strndup(dir, dlen))) return tg_fail(err, "%s: out of memory opening the shard set", dir);
    size_t plen = dlen + 32;
    char *mpath = tg_malloc(plen);
    if (!mpath) {
        tg_shard_set_close(set);
        return tg_fail(err, "%s: out of memory opening the shard set", dir);
    }
    snprintf(mpath, plen, "%s/manifest.json", set->dir);
    char *text = NULL;
    int rc = -1;
    FILE *f = fopen(mpath, "rb");
    if (!f) {
        tg_fail(err, "%s: cannot open: %s (not a shard set?)", mpath, strerror(errno));
        goto done;
    }
    size_t cap = 1 << 16, n = 0;
    text = tg_malloc(cap);
    while (text) {
        n += fread(text + n, 1, cap - n, f);
        if (n < cap || cap >= (64u << 20)) break;
        char *t = tg_realloc(text, cap * 2);
        if (!t) free(text);
        text = t;
        cap *= 2;
    }
    int read_failed = ferror(f);
    fclose(f);
    if (!text || read_failed || n == cap) {
        tg_fail(err, "%s: %s", mpath, !text ? "out of memory reading it" : read_failed ? "read error" : "larger than 64 MiB");
        goto done;
    }
    if (tg_shard_manifest_parse(text, n, mpath, &set->manifest, err)) goto done;
    const tg_shard_manifest *m = &set->manifest;
    int32_t count = 0;
    for (int32_t i = 0; i < m->n_shards; i++) count += m->shards[i].split == split;
    if (count && !(set->files = tg_calloc((size_t)count, sizeof *set->files))) {
        tg_fail(err, "%s: out of memory for %d shard files", dir, count);
        goto done;
    }
    for (int32_t i = 0; i < m->n_shards; i++) {
        const tg_shard_entry *e = &m->shards[i];
        if (e->split != split) continue;
        tg_shard_file *sf = &set->files[set->n_files++];
        size_t len = dlen + strlen(e->file) + 2;
        if (!(sf->path = tg_malloc(len))) {
            tg_fail(err, "%s: out of memory naming shard %s", dir, e->file);
            goto done;
        }
        snprintf(sf->path, len, "%s/%s", set->dir, e->file);
        sf->first = set->n_records;
        if (open_file(set, e, sf, err)) goto done;
        set->n_records += sf->records;
    }
    rc = 0;
done:
    free(text);
    free(mpath);
    if (rc) tg_shard_set_close(set);
    return rc;
}

void tg_shard_set_close(tg_shard_set *set) {
    for (int32_t i = 0; i < set->n_files; i++) {
        free(set->files[i].path);
        free(set->files[i].frames);
    }
    free(set->files);
    free(set->dir);
    tg_shard_manifest_free(&set->manifest);
    memset(set, 0, sizeof *set);
}

void tg_shard_set_locate(const tg_shard_set *set, int64_t index, int32_t *file, int64_t *local) {
    int32_t lo = 0, hi = set->n_files - 1;
    while (lo < hi) { /* the last file whose first record is <= index */
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (set->files[mid].first <= index) lo = mid;
        else hi = mid - 1;
    }
    *file = lo;
    *local = index - (set->n_files ? set->files[lo].first : 0);
}

/* ---- blocks and records --------------------------------------------------------- */

int tg_shard_block_check(const uint8_t *b, size_t len, int64_t count, const char *where, tg_err *err) {
    if (len < 4) return tg_fail(err, "%s: block of %zu bytes is too short (file corrupt)", where, len);
    uint32_t n = tg_get_le32(b);
    if ((int64_t)n != count)
        return tg_fail(err, "%s: block holds %u records, the index says %lld (file corrupt)", where, n, (long long)count);
    if (4 + 4 * (uint64_t)n > len)
        return tg_fail(err, "%s: block of %zu bytes cannot hold %u record ends (file corrupt)", where, len, n);
    const uint64_t area = len - 4 - 4 * (uint64_t)n;
    uint32_t prev = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t end = tg_get_le32(b + 4 + 4 * (uint64_t)i);
        if (end <= prev || end > area)
            return tg_fail(err, "%s: record %u's end %u is out of order or past the block (file corrupt)", where, i, end);
        prev = end;
    }
    if (prev != area)
        return tg_fail(err, "%s: the records end at %u, the block's record area has %llu bytes (file corrupt)", where,
                       prev, (unsigned long long)area);
    return 0;
}

int tg_shard_block_record(const uint8_t *b, size_t len, int64_t i, const tg_shard_manifest *m, int32_t *ids,
                          int32_t *types, tg_shard_record *rec, const char *where, tg_err *err) {
    const uint32_t n = tg_get_le32(b);
    if (i < 0 || i >= (int64_t)n) return tg_fail(err, "%s: no record %lld in the block", where, (long long)i);
    const uint8_t *area = b + 4 + 4 * (uint64_t)n;
    const uint32_t start = i ? tg_get_le32(b + 4 + 4 * (uint64_t)(i - 1)) : 0;
    const uint32_t end = tg_get_le32(b + 4 + 4 * (uint64_t)i);
    (void)len; /* tg_shard_block_check bounded every end by the block */
    const uint8_t *p = area + start;
    const uint64_t size = end - start, head = tg_shard_record_head(m->task);
    if (size < head) return tg_fail(err, "%s: record of %llu bytes is too short (file corrupt)", where, (unsigned long long)size);
    const uint32_t L = tg_get_le32(p), flags = tg_get_le32(p + 4);
    if (L < 1 || L > (uint32_t)m->seq)
        return tg_fail(err, "%s: length %u is outside 1 to the set's seq %d", where, L, m->seq);
    if (flags & ~TG_SHARD_FLAG_TYPES) return tg_fail(err, "%s: unknown flags 0x%x (file corrupt)", where, flags);
    const int has_types = (flags & TG_SHARD_FLAG_TYPES) != 0;
    if (has_types && !m->token_types)
        return tg_fail(err, "%s: carries token types, the manifest says no record does (file corrupt)", where);
    const uint32_t value_bytes = tg_shard_value_bytes(m->task);
    if (value_bytes == 1 && (has_types || L != (uint32_t)m->seq))
        return tg_fail(err, "%s: an image of %u values%s, the set's images have %d (file corrupt)", where, L,
                       has_types ? " with token types" : "", m->seq);
    if (size != head + value_bytes * (uint64_t)L + (has_types ? L : 0))
        return tg_fail(err, "%s: %llu bytes do not hold %u tokens%s (file corrupt)", where, (unsigned long long)size, L,
                       has_types ? " with types" : "");
    memset(rec, 0, sizeof *rec);
    rec->len = (int32_t)L;
    rec->label = -1;
    if (m->task == TG_SHARD_CLASSIFY || m->task == TG_SHARD_IMAGE) {
        rec->label = (int32_t)tg_get_le32(p + 8);
        if (rec->label < 0 || rec->label >= m->n_labels)
            return tg_fail(err, "%s: label %d is outside the set's %d labels", where, rec->label, m->n_labels);
    } else if (m->task == TG_SHARD_QA) {
        rec->start = (int32_t)tg_get_le32(p + 8);
        rec->end = (int32_t)tg_get_le32(p + 12);
        if (rec->start < 0 || rec->start > rec->end || rec->end >= rec->len)
            return tg_fail(err, "%s: answer tokens %d to %d are outside the record's %d tokens", where, rec->start,
                           rec->end, rec->len);
    } else if (m->task == TG_SHARD_INSTRUCT) {
        rec->prompt_len = (int32_t)tg_get_le32(p + 8);
        if (rec->prompt_len < 1 || rec->prompt_len >= rec->len)
            return tg_fail(err, "%s: a prompt of %d tokens is outside 1 to %d (the record's %d tokens less one "
                                "response token)",
                           where, rec->prompt_len, rec->len - 1, rec->len);
    }
    p += head;
    if (value_bytes == 1) {
        for (uint32_t t = 0; t < L; t++) ids[t] = p[t];
        rec->input_ids = ids;
        return 0;
    }
    for (uint32_t t = 0; t < L; t++, p += 4) {
        uint32_t id = tg_get_le32(p);
        if (id >= (uint32_t)m->vocab_size)
            return tg_fail(err, "%s: input_ids[%u] = %u is outside the tokenizer's vocabulary (vocab_size %d)", where, t,
                           id, m->vocab_size);
        ids[t] = (int32_t)id;
    }
    rec->input_ids = ids;
    if (has_types) {
        for (uint32_t t = 0; t < L; t++) types[t] = p[t];
        rec->token_type_ids = types;
    }
    return 0;
}

/* ---- the cursor ------------------------------------------------------------------ */

int tg_shard_cursor_open(tg_shard_cursor *c, const tg_shard_set *set, tg_err *err) {
    memset(c, 0, sizeof *c);
    c->set = set;
    c->fd = -1;
    c->fd_file = c->file = c->frame = -1;
    c->scratch_cap = set->manifest.seq;
    c->dctx = tg_zstd_dctx();
    c->ids = tg_malloc((size_t)c->scratch_cap * sizeof *c->ids);
    c->types = tg_malloc((size_t)c->scratch_cap * sizeof *c->types);
    if (!c->dctx || !c->ids || !c->types) {
        tg_shard_cursor_close(c);
        return tg_fail(err, "%s: out of memory for a shard cursor's buffers", set->dir);
    }
    return 0;
}

void tg_shard_cursor_close(tg_shard_cursor *c) {
    if (c->fd >= 0) close(c->fd);
    ZSTD_freeDCtx(c->dctx);
    free(c->compressed);
    free(c->block);
    free(c->ids);
    free(c->types);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

static int grow(uint8_t **p, size_t *cap, size_t need, tg_err *err) {
    if (need <= *cap) return 0;
    uint8_t *q = tg_realloc(*p, need);
    if (!q) return tg_fail(err, "out of memory for a %zu-byte frame", need);
    *p = q;
    *cap = need;
    return 0;
}

static int load_frame(tg_shard_cursor *c, int32_t file, int32_t frame, tg_err *err) {
    const tg_shard_file *f = &c->set->files[file];
    const tg_shard_frame *fr = &f->frames[frame];
    c->file = c->frame = -1;
    if (c->fd_file != file) {
        if (c->fd >= 0) close(c->fd);
        c->fd_file = -1;
        if ((c->fd = open(f->path, O_RDONLY | O_CLOEXEC)) < 0)
            return tg_fail(err, "%s: cannot open the shard: %s", f->path, strerror(errno));
        c->fd_file = file;
    }
    char where[64];
    snprintf(where, sizeof where, "frame %d (records %lld to %lld, at byte %llu)", frame, (long long)fr->first,
             (long long)(fr->first + fr->count - 1), (unsigned long long)fr->offset);
    if (grow(&c->compressed, &c->compressed_cap, fr->csize, err) || grow(&c->block, &c->block_cap, fr->usize, err))
        return tg_fail_context(err, "%s: %s", f->path, where);
    if (read_at(c->fd, c->compressed, fr->csize, fr->offset))
        return tg_fail(err, "%s: %s: read error (file changed since it was opened?)", f->path, where);
    unsigned long long content = ZSTD_getFrameContentSize(c->compressed, fr->csize);
    if (content != fr->usize)
        return tg_fail(err, "%s: %s is not a zstd frame of %u bytes (file corrupt)", f->path, where, fr->usize);
    size_t got = ZSTD_decompressDCtx(c->dctx, c->block, fr->usize, c->compressed, fr->csize);
    if (tg_zstd_out_of_memory(got)) return tg_fail(err, "%s: %s: out of memory for the zstd decompressor", f->path, where); /* GCOVR_EXCL_BR_LINE: one-shot decompression into a buffer of the frame's size allocates nothing; the context was made with its memory */
    if (ZSTD_isError(got) || got != fr->usize) /* GCOVR_EXCL_BR_LINE: the frame's content size was checked to be usize just above, and zstd returns exactly that or an error */
        return tg_fail(err, "%s: %s does not decompress: %s (file corrupt)", f->path, where, /* GCOVR_EXCL_BR_LINE: the frame's content size was checked to be usize just above, and zstd returns exactly that or an error */
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
    char block_where[TG_SHARD_FILE_MAX + 4200];
    snprintf(block_where, sizeof block_where, "%s: %s", f->path, where);
    if (tg_shard_block_check(c->block, fr->usize, fr->count, block_where, err)) return -1;
    c->file = file;
    c->frame = frame;
    return 0;
}

int tg_shard_cursor_get(tg_shard_cursor *c, int64_t index, tg_shard_record *rec, tg_err *err) {
    const tg_shard_set *set = c->set;
    if (index < 0 || index >= set->n_records)
        return tg_fail(err, "%s: no record %lld in the %s split (%lld records)", set->dir, (long long)index,
                       tg_shard_split_name(set->split), (long long)set->n_records);
    int32_t file;
    int64_t local;
    tg_shard_set_locate(set, index, &file, &local);
    const tg_shard_file *f = &set->files[file];
    int32_t lo = 0, hi = f->n_frames - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (f->frames[mid].first <= local) lo = mid;
        else hi = mid - 1;
    }
    if ((c->file != file || c->frame != lo) && load_frame(c, file, lo, err)) return -1;
    char where[4200];
    snprintf(where, sizeof where, "%s: record %lld", f->path, (long long)local);
    return tg_shard_block_record(c->block, f->frames[lo].usize, local - f->frames[lo].first, &set->manifest, c->ids,
                                 c->types, rec, where, err);
}
