/* The shard writer's files byte by byte: records of a classify set (some with token types)
 * and of a qa set, with small frame and shard sizes, are written; each shard is then read
 * as bytes and must be exactly the header, the zstd frames of the blocks (record count, ends,
 * records) a model of the documented format splits them into, the index and the footer; the
 * manifest lists the shards with their records, sizes and xxh64, the counts, the length
 * histogram and whether any record has token types. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "datasets/shard_manifest.h"
#include "datasets/shard_writer.h"
#include "tests/harness.h"

#define SEQ 12
#define VOCAB 97
#define N_RECORDS 23
#define FRAME_BYTES 92
/* sizes at which a record fills a block exactly, and blocks fill a train shard exactly */
#define SHARD_BYTES 264

static char *const k_labels[] = {"neg", "pos", "mixed"};

/* Record k: 1 + (5k) % SEQ tokens, token t = (7k + t) % VOCAB; token types 0, 1, 0, 1 ...
 * on every fourth; label k % 3; answer tokens (k % len, len - 1). Eval gets every fifth. */
static int rec_len(int k) { return 1 + (5 * k) % SEQ; }
static int rec_split(int k) { return k % 5 == 4 ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN; }
static int rec_types(int k) { return k % 4 == 1; }

typedef struct buf {
    uint8_t *b;
    size_t n, cap;
} buf;

static void put(buf *b, const void *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->b = realloc(b->b, b->cap);
        if (!b->b) abort();
    }
    memcpy(b->b + b->n, p, n);
    b->n += n;
}

static void put32(buf *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static uint32_t get32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* The bytes of record k in a block of a `task` set. */
static void record_bytes(buf *b, int task, int k) {
    const int len = rec_len(k), types = rec_types(k);
    put32(b, (uint32_t)len);
    put32(b, types ? TG_SHARD_FLAG_TYPES : 0);
    if (task == TG_SHARD_CLASSIFY) put32(b, (uint32_t)(k % 3));
    if (task == TG_SHARD_QA) put32(b, (uint32_t)(k % len)), put32(b, (uint32_t)(len - 1));
    for (int t = 0; t < len; t++) put32(b, (uint32_t)((7 * k + t) % VOCAB));
    for (int t = 0; types && t < len; t++) {
        const uint8_t v = (uint8_t)(t % 2);
        put(b, &v, 1);
    }
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)size + 1);
    if (p && fread(p, 1, (size_t)size, f) != (size_t)size) free(p), p = NULL;
    fclose(f);
    *n = (size_t)size;
    return p;
}

/* One split's expected shards: a list of frames (block bytes, first record) per shard. */
typedef struct frame_model {
    buf block;
    int64_t first, count;
} frame_model;

typedef struct shard_model {
    frame_model frames[32];
    int n_frames;
    int64_t records;
} shard_model;

/* The writer's rule: a record that would take the pending block past FRAME_BYTES closes it
 * first (a block holds at least one record); a shard whose blocks reach SHARD_BYTES is closed
 * before the next record. */
static int model_split(int task, int split, shard_model *shards, int max) {
    int n = 0;
    size_t area = 0, shard_bytes = 0;
    int64_t n_block = 0;
    buf recs = {0};
    size_t ends[64];
    int open = 0;
    for (int k = 0; k < N_RECORDS; k++) {
        if (rec_split(k) != split) continue;
        buf r = {0};
        record_bytes(&r, task, k);
        int flushed = 0;
        if (n_block && area + r.n > FRAME_BYTES) {
            shard_model *s = &shards[n - 1];
            frame_model *f = &s->frames[s->n_frames++];
            memset(&f->block, 0, sizeof f->block);
            put32(&f->block, (uint32_t)n_block);
            for (int64_t i = 0; i < n_block; i++) put32(&f->block, (uint32_t)ends[i]);
            put(&f->block, recs.b, recs.n);
            f->first = s->records;
            f->count = n_block;
            s->records += n_block;
            shard_bytes += f->block.n;
            recs.n = 0, area = 0, n_block = 0, flushed = 1;
        }
        if (open && flushed && shard_bytes >= SHARD_BYTES) open = 0;
        if (!open) {
            if (n == max) abort();
            memset(&shards[n++], 0, sizeof *shards);
            open = 1, shard_bytes = 0;
        }
        put(&recs, r.b, r.n);
        area += r.n;
        ends[n_block++] = area;
        free(r.b);
    }
    if (n_block) {
        shard_model *s = &shards[n - 1];
        frame_model *f = &s->frames[s->n_frames++];
        memset(&f->block, 0, sizeof f->block);
        put32(&f->block, (uint32_t)n_block);
        for (int64_t i = 0; i < n_block; i++) put32(&f->block, (uint32_t)ends[i]);
        put(&f->block, recs.b, recs.n);
        f->first = s->records;
        f->count = n_block;
        s->records += n_block;
    }
    free(recs.b);
    return n;
}

/* Checks shard file `path` against the model; returns its size, or -1. */
static int64_t check_shard(const char *path, int task, const shard_model *s, uint64_t *hash) {
    size_t n;
    uint8_t *b = read_all(path, &n);
    if (!CHECK(b != NULL, "cannot read %s", path)) return -1;
    *hash = XXH64(b, n, 0);
    int ok = CHECK(n >= 16 + 24 * (size_t)s->n_frames + 32 && !memcmp(b, "TGSHARD\0", 8) && get32(b + 8) == TG_SHARD_VERSION &&
                       get32(b + 12) == (uint32_t)task,
                   "%s: header", path);
    size_t at = 16;
    for (int f = 0; ok && f < s->n_frames; f++) {
        const frame_model *fm = &s->frames[f];
        const size_t csize = ZSTD_findFrameCompressedSize(b + at, n - at);
        ok = CHECK(!ZSTD_isError(csize), "%s: frame %d is no zstd frame", path, f);
        if (!ok) break;
        ok = CHECK(ZSTD_getFrameContentSize(b + at, csize) == fm->block.n, "%s: frame %d content size", path, f);
        uint8_t *out = malloc(fm->block.n + 1);
        const size_t got = ZSTD_decompress(out, fm->block.n + 1, b + at, csize);
        ok = ok && CHECK(got == fm->block.n && !memcmp(out, fm->block.b, got), "%s: frame %d block bytes (%zu, want %zu)",
                         path, f, got, fm->block.n);
        free(out);
        /* index entry f */
        const size_t index_at = n - 32 - 24 * (size_t)s->n_frames;
        const uint8_t *e = b + index_at + 24 * (size_t)f;
        ok = ok && CHECK(get64(e) == at && get32(e + 8) == csize && get32(e + 12) == fm->block.n &&
                             get64(e + 16) == (uint64_t)fm->first,
                         "%s: index entry %d: %llu %u %u %llu", path, f, (unsigned long long)get64(e), get32(e + 8),
                         get32(e + 12), (unsigned long long)get64(e + 16));
        at += csize;
    }
    const uint8_t *foot = b + n - 32;
    ok = ok && CHECK(at + 24 * (size_t)s->n_frames + 32 == n, "%s: %zu bytes, frames end at %zu", path, n, at);
    ok = ok && CHECK(get64(foot) == at && get64(foot + 8) == (uint64_t)s->n_frames &&
                         get64(foot + 16) == (uint64_t)s->records && !memcmp(foot + 24, "TGSHIDX\0", 8),
                     "%s: footer %llu %llu %llu", path, (unsigned long long)get64(foot),
                     (unsigned long long)get64(foot + 8), (unsigned long long)get64(foot + 16));
    free(b);
    return ok ? (int64_t)n : -1;
}

static void write_and_check(int task) {
    char out[700];
    snprintf(out, sizeof out, "%s/set-%d", tg_test_tmpdir(), task);
    tg_shard_set_desc d = {.task = task, .seq = SEQ, .doc_stride = task == TG_SHARD_QA ? 3 : 0,
                           .n_labels = task == TG_SHARD_CLASSIFY ? 3 : 0, .labels = k_labels,
                           .tokenizer_identity = 0x0123456789abcdefull, .tokenizer_family = "bpe",
                           .vocab_size = VOCAB, .command = "convert --test", .frame_bytes = FRAME_BYTES,
                           .shard_bytes = SHARD_BYTES};
    tg_shard_writer *w = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    int64_t hist[TG_SPLIT_COUNT][2] = {{0}}, records[TG_SPLIT_COUNT] = {0}, tokens[TG_SPLIT_COUNT] = {0};
    for (int k = 0; k < N_RECORDS; k++) {
        int32_t ids[SEQ], types[SEQ];
        const int len = rec_len(k);
        for (int t = 0; t < len; t++) ids[t] = (7 * k + t) % VOCAB, types[t] = t % 2;
        tg_shard_record r = {.len = len, .input_ids = ids, .token_type_ids = rec_types(k) ? types : NULL,
                             .label = task == TG_SHARD_CLASSIFY ? k % 3 : -1, .start = k % len, .end = len - 1};
        /* a record of types all 0 is stored as one without types */
        int32_t zeros[SEQ] = {0};
        if (!rec_types(k) && k % 3 == 0) r.token_type_ids = zeros;
        const int s = rec_split(k);
        REQUIRE(tg_shard_writer_add(w, s, &r, &err) == 0, "record %d: %s", k, err.msg);
        records[s]++, tokens[s] += len, hist[s][(len - 1) / 8]++;
        CHECK(tg_shard_writer_count(w, s) == records[s], "count");
    }
    CHECK(tg_shard_writer_count(w, -1) == 0 && tg_shard_writer_count(w, TG_SPLIT_COUNT) == 0, "count of no split");
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);

    char path[900];
    snprintf(path, sizeof path, "%s/manifest.json", out);
    size_t mlen;
    char *text = (char *)read_all(path, &mlen);
    REQUIRE(text, "read %s", path);
    tg_shard_manifest m;
    REQUIRE(tg_shard_manifest_parse(text, mlen, "manifest.json", &m, &err) == 0, "%s", err.msg);
    free(text);
    CHECK(m.version == TG_SHARD_VERSION && m.task == task && m.seq == SEQ && m.doc_stride == d.doc_stride, "header");
    CHECK(m.tokenizer_identity == 0x0123456789abcdefull && !strcmp(m.tokenizer_family, "bpe") &&
              m.vocab_size == VOCAB && !strcmp(m.command, "convert --test"),
          "tokenizer fields");
    CHECK(m.token_types == 1, "token_types %d", m.token_types);
    CHECK(m.n_labels == d.n_labels, "%d labels", m.n_labels);
    for (int i = 0; i < m.n_labels; i++) CHECK(!strcmp(m.labels[i], k_labels[i]), "label %d '%s'", i, m.labels[i]);
    CHECK(m.hist_bin == 8 && m.n_bins == 2, "histogram %d x %d", m.n_bins, m.hist_bin);
    int e = 0;
    for (int s = 0; s < TG_SPLIT_COUNT; s++) {
        CHECK(m.records[s] == records[s] && m.tokens[s] == tokens[s], "split %d: %lld records, %lld tokens", s,
              (long long)m.records[s], (long long)m.tokens[s]);
        for (int bin = 0; bin < 2; bin++)
            CHECK(m.hist[s][bin] == hist[s][bin], "split %d bin %d: %lld, want %lld", s, bin, (long long)m.hist[s][bin],
                  (long long)hist[s][bin]);
        shard_model shards[16];
        const int n = model_split(task, s, shards, 16);
        CHECK(n >= (s == TG_SPLIT_TRAIN ? 3 : 1), "split %d: the model makes only %d shards", s, n);
        for (int i = 0; i < n; i++, e++) {
            /* listed in the order they were closed */
            char want_file[64];
            snprintf(want_file, sizeof want_file, "%s/%05d.tgshard", tg_shard_split_name(s), i);
            const tg_shard_entry *en = NULL;
            for (int j = 0; j < m.n_shards; j++)
                if (!strcmp(m.shards[j].file, want_file)) en = &m.shards[j];
            if (CHECK(en != NULL, "%s not listed", want_file)) {
                CHECK(en->split == s && en->records == shards[i].records, "%s: split %d, %lld records; want %lld",
                      want_file, en->split, (long long)en->records, (long long)shards[i].records);
                snprintf(path, sizeof path, "%s/%s", out, want_file);
                uint64_t hash = 0;
                const int64_t bytes = check_shard(path, task, &shards[i], &hash);
                CHECK(bytes == en->bytes && hash == en->xxh64, "%s: %lld bytes, manifest %lld", want_file,
                      (long long)bytes, (long long)en->bytes);
            }
            for (int f = 0; f < shards[i].n_frames; f++) free(shards[i].frames[f].block.b);
        }
    }
    CHECK(e == m.n_shards, "%d shards listed, %d expected", m.n_shards, e);
    tg_shard_manifest_free(&m);
}

TG_TEST(test_shard_writer_classify_files_byte_by_byte) { write_and_check(TG_SHARD_CLASSIFY); }

TG_TEST(test_shard_writer_qa_files_byte_by_byte) { write_and_check(TG_SHARD_QA); }
