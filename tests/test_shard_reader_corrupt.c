/* The shard reader on damaged files: a shard built byte by byte (header, zstd frames,
 * index, footer), each field of it made wrong in turn under a manifest resealed to the
 * damaged bytes, so that the reader's own checks (not the checksum) must refuse it with the
 * file, frame and cause; blocks and records decoded from hand-made bytes; the manifest's
 * own limits; and allocation failures. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "base/alloc.h"
#include "datasets/shard_manifest.h"
#include "datasets/shard_reader.h"
#include "tests/harness.h"

#define SEQ 8
#define VOCAB 100

/* Three lm records: lengths 2 and 3 in frame 0, 1 in frame 1. Token t of record k is
 * (10 k + t) % VOCAB. */
static const int k_lens[3] = {2, 3, 1};

typedef struct image {
    uint8_t b[4096];
    size_t len;
    size_t frame_at[2], frame_len[2], index_at;
    uint32_t usize[2];
} image;

/* An lm block of records first..first+n-1. */
static size_t lm_block(uint8_t *out, int first, int n) {
    size_t at = 4 + 4 * (size_t)n, area = 0;
    tg_put_le32(out, (uint32_t)n);
    for (int k = first; k < first + n; k++) {
        uint8_t *p = out + at + area;
        tg_put_le32(p, (uint32_t)k_lens[k]);
        tg_put_le32(p + 4, 0);
        for (int t = 0; t < k_lens[k]; t++) tg_put_le32(p + 8 + 4 * t, (uint32_t)((10 * k + t) % VOCAB));
        area += 8 + 4 * (size_t)k_lens[k];
        tg_put_le32(out + 4 + 4 * (k - first), (uint32_t)area);
    }
    return at + area;
}

/* A valid shard of the three records; `pad` bytes between the frames and the index;
 * block_n, when not 0, is written as frame 0's record count instead of 2. */
static void build(image *im, size_t pad, uint32_t block_n) {
    memset(im, 0, sizeof *im);
    memcpy(im->b, tg_shard_magic, 8);
    tg_put_le32(im->b + 8, TG_SHARD_VERSION);
    tg_put_le32(im->b + 12, TG_SHARD_LM);
    size_t at = TG_SHARD_HEADER_BYTES;
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    for (int f = 0; f < 2; f++) {
        uint8_t block[512];
        size_t n = f == 0 ? lm_block(block, 0, 2) : lm_block(block, 2, 1);
        if (f == 0 && block_n) tg_put_le32(block, block_n);
        im->usize[f] = (uint32_t)n;
        im->frame_at[f] = at;
        im->frame_len[f] = ZSTD_compress2(cc, im->b + at, sizeof im->b - at, block, n);
        at += im->frame_len[f];
    }
    ZSTD_freeCCtx(cc);
    at += pad;
    im->index_at = at;
    for (int f = 0; f < 2; f++, at += TG_SHARD_INDEX_ENTRY_BYTES) {
        tg_put_le64(im->b + at, im->frame_at[f]);
        tg_put_le32(im->b + at + 8, (uint32_t)im->frame_len[f]);
        tg_put_le32(im->b + at + 12, im->usize[f]);
        tg_put_le64(im->b + at + 16, f == 0 ? 0 : 2);
    }
    tg_put_le64(im->b + at, im->index_at);
    tg_put_le64(im->b + at + 8, 2);
    tg_put_le64(im->b + at + 16, 3);
    memcpy(im->b + at + 24, tg_shard_footer_magic, 8);
    im->len = at + TG_SHARD_FOOTER_BYTES;
}

/* A manifest for one lm shard of `records` records at train/00000.tgshard, sealed to
 * `bytes` bytes with checksum `sum`. */
static int write_manifest(const char *dir, int64_t records, int64_t bytes, uint64_t sum) {
    int64_t hist_train[1] = {records}, hist_eval[1] = {0};
    tg_shard_entry e = {.file = "train/00000.tgshard", .split = TG_SPLIT_TRAIN, .records = records, .bytes = bytes,
                        .xxh64 = sum};
    tg_shard_manifest m = {.version = TG_SHARD_VERSION, .task = TG_SHARD_LM, .seq = SEQ,
                           .records = {records, 0}, .tokens = {6, 0}, .hist_bin = 8, .n_bins = 1,
                           .hist = {hist_train, hist_eval}, .tokenizer_identity = 1, .tokenizer_family = "wordpiece",
                           .vocab_size = VOCAB, .n_shards = 1, .shards = &e, .command = "test"};
    char *text, path[700];
    size_t len;
    tg_err err;
    if (tg_shard_manifest_format(&m, &text, &len, &err)) return -1;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    int rc = tg_test_write_file(path, text);
    free(text);
    return rc;
}

/* A fresh set folder holding the image as its one train shard, the manifest sealed to it. */
static const char *write_set(const image *im, int64_t manifest_records) {
    static char dir[600];
    char path[700];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    snprintf(path, sizeof path, "%s/train", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/train/00000.tgshard", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(im->b, 1, im->len, f) != im->len) abort();
    fclose(f);
    if (write_manifest(dir, manifest_records, (int64_t)im->len, XXH64(im->b, im->len, 0))) abort();
    return dir;
}

enum field { HEAD_MAGIC, HEAD_VERSION, HEAD_KIND, FOOT_INDEX_AT, FOOT_FRAMES, FOOT_RECORDS, FOOT_MAGIC,
             IDX_OFFSET, IDX_CSIZE, IDX_USIZE, IDX_FIRST, FRAME_BYTES, FRAME_LAST };

/* Sets a field of the image (frame: which index entry or frame) to value, or adds
 * value to it when add. */
static void set_field(image *im, int field, int frame, int add, int64_t value) {
    uint8_t *foot = im->b + im->len - TG_SHARD_FOOTER_BYTES;
    uint8_t *entry = im->b + im->index_at + (size_t)frame * TG_SHARD_INDEX_ENTRY_BYTES;
    uint8_t *p = NULL;
    int wide = 0;
    switch (field) {
    case HEAD_MAGIC: im->b[3] = 'X'; return;
    case FOOT_MAGIC: foot[26] = 'X'; return;
    case FRAME_BYTES: memset(im->b + im->frame_at[frame], 'A', im->frame_len[frame]); return;
    case FRAME_LAST: im->b[im->frame_at[frame] + im->frame_len[frame] - 1] ^= 0x5a; return;
    case HEAD_VERSION: p = im->b + 8; break;
    case HEAD_KIND: p = im->b + 12; break;
    case FOOT_INDEX_AT: p = foot, wide = 1; break;
    case FOOT_FRAMES: p = foot + 8, wide = 1; break;
    case FOOT_RECORDS: p = foot + 16, wide = 1; break;
    case IDX_OFFSET: p = entry, wide = 1; break;
    case IDX_CSIZE: p = entry + 8; break;
    case IDX_USIZE: p = entry + 12; break;
    case IDX_FIRST: p = entry + 16, wide = 1; break;
    }
    int64_t old = wide ? (int64_t)tg_get_le64(p) : (int64_t)tg_get_le32(p);
    int64_t v = add ? old + value : value;
    if (wide) tg_put_le64(p, (uint64_t)v);
    else tg_put_le32(p, (uint32_t)v);
}

TG_TEST(test_shard_reader_reads_the_built_shard) {
    image im;
    build(&im, 0, 0);
    const char *dir = write_set(&im, 3);
    tg_err err = {{0}};
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    CHECK(set.n_records == 3 && set.n_files == 1 && set.files[0].n_frames == 2, "counts");
    CHECK(set.files[0].frames[0].offset == 16 && set.files[0].frames[0].count == 2 && set.files[0].frames[1].first == 2 &&
              set.files[0].frames[1].count == 1 && set.files[0].frames[1].usize == im.usize[1],
          "frames");
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    for (int pass = 0; pass < 2; pass++)
        for (int k = 2; k >= 0; k--) {
            tg_shard_record r;
            REQUIRE(tg_shard_cursor_get(&cur, k, &r, &err) == 0, "%s", err.msg);
            CHECK(r.len == k_lens[k] && r.token_type_ids == NULL && r.label == -1, "record %d", k);
            for (int t = 0; t < r.len; t++) CHECK(r.input_ids[t] == 10 * k + t, "record %d token %d", k, t);
        }
    CHECK(tg_shard_cursor_get(&cur, -1, &(tg_shard_record){0}, &err) == -1, "record -1");
    char want[800];
    snprintf(want, sizeof want, "%s: no record -1 in the train split (3 records)", dir);
    CHECK(!strcmp(err.msg, want), "'%s'", err.msg);
    CHECK(tg_shard_cursor_get(&cur, 3, &(tg_shard_record){0}, &err) == -1 && strstr(err.msg, "no record 3 in the train"),
          "'%s'", err.msg);
    tg_shard_cursor_close(&cur);
    CHECK(cur.fd == -1 && cur.ids == NULL, "closed cursor");
    int32_t file = 7;
    int64_t local = 7;
    tg_shard_set_locate(&set, 2, &file, &local);
    CHECK(file == 0 && local == 2, "locate: %d %lld", file, (long long)local);
    tg_shard_set_close(&set);
    /* A split with no shards: every index maps to file 0, local = index. */
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_EVAL, &set, &err) == 0, "%s", err.msg);
    CHECK(set.n_files == 0 && set.n_records == 0, "eval split");
    tg_shard_set_locate(&set, 5, &file, &local);
    CHECK(file == 0 && local == 5, "locate in an empty split: %d %lld", file, (long long)local);
    tg_shard_set_close(&set);
    /* Trailing slashes on the folder are dropped. */
    char slashed[700];
    snprintf(slashed, sizeof slashed, "%s///", dir);
    REQUIRE(tg_shard_set_open(slashed, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(set.dir, dir), "dir '%s'", set.dir);
    snprintf(want, sizeof want, "%s/train/00000.tgshard", dir);
    CHECK(!strcmp(set.files[0].path, want), "path '%s'", set.files[0].path);
    tg_shard_set_close(&set);
}

TG_TEST(test_shard_reader_damaged_shards_are_refused) {
    image base;
    build(&base, 0, 0);
    const uint32_t csize0 = (uint32_t)base.frame_len[0];
    const struct {
        int field, frame, add;
        int64_t value;
        int at_get;        /* the set opens; reading record `record` fails */
        int record;
        const char *want, *want2;
    } cases[] = {
        {HEAD_MAGIC, 0, 0, 0, 0, 0, "not a tunegraph shard (bad magic)", NULL},
        {FOOT_MAGIC, 0, 0, 0, 0, 0, "not a tunegraph shard (bad magic)", NULL},
        {HEAD_VERSION, 0, 0, 2, 0, 0, "shard format version 2, this build reads version 1", NULL},
        {HEAD_KIND, 0, 0, 1, 0, 0, "holds records of kind 1, the manifest says lm", NULL},
        {FOOT_RECORDS, 0, 0, 4, 0, 0, "the footer says 4 records, the manifest 3", NULL},
        {FOOT_FRAMES, 0, 0, 0, 0, 0, "the footer's index (0 frames ", "does not fit the file (file corrupt)"},
        {FOOT_FRAMES, 0, 0, 4, 0, 0, "the footer's index (4 frames ", "does not fit the file"},
        {FOOT_FRAMES, 0, 0, 3, 0, 0, "the footer's index (3 frames ", "does not fit the file"},
        {FOOT_INDEX_AT, 0, 0, 15, 0, 0, "the footer's index (2 frames at byte 15)", NULL},
        {FOOT_INDEX_AT, 0, 1, 49, 0, 0, "the footer's index (2 frames", "does not fit the file"},
        {FOOT_INDEX_AT, 0, 1, 1, 0, 0, "the footer's index (2 frames", "does not fit the file"},
        {FOOT_INDEX_AT, 0, 1, -1, 0, 0, "the footer's index (2 frames", "does not fit the file"},
        {IDX_OFFSET, 0, 1, 1, 0, 0, "frame 0 of the index is inconsistent (its bytes; file corrupt)", NULL},
        {IDX_OFFSET, 1, 1, -1, 0, 0, "frame 1 of the index is inconsistent (its bytes;", NULL},
        {IDX_CSIZE, 0, 0, 0, 0, 0, "frame 0 of the index is inconsistent (its bytes;", NULL},
        {IDX_CSIZE, 0, 0, 100000, 0, 0, "frame 0 of the index is inconsistent (its bytes;", NULL},
        {IDX_CSIZE, 1, 1, 1, 0, 0, "frame 1 of the index is inconsistent (its bytes;", NULL},
        {IDX_FIRST, 0, 0, 1, 0, 0, "frame 0 of the index is inconsistent (its records;", NULL},
        {IDX_FIRST, 1, 0, 0, 0, 0, "frame 0 of the index is inconsistent (its records;", NULL},
        {IDX_FIRST, 1, 0, 4, 0, 0, "frame 0 of the index is inconsistent (its records;", NULL},
        {IDX_FIRST, 1, 0, 3, 0, 0, "frame 1 of the index is inconsistent (its records;", NULL},
        {IDX_FIRST, 1, 0, 1, 0, 0, "frame 1 of the index is inconsistent (its block size;", NULL},
        {IDX_USIZE, 0, 0, TG_SHARD_BLOCK_MAX + 1, 0, 0, "frame 0 of the index is inconsistent (its block size;", NULL},
        {IDX_USIZE, 0, 0, (int64_t)(csize0 + 1) * TG_SHARD_MAX_EXPANSION, 0, 0, "frame 0 of the index is inconsistent (its block size;", NULL},
        {IDX_USIZE, 0, 0, 4 + 2 * 12 - 1, 0, 0, "frame 0 of the index is inconsistent (its block size;", NULL},
        {IDX_USIZE, 1, 0, 4 + 12 - 1, 0, 0, "frame 1 of the index is inconsistent (its block size;", NULL},
        /* The index is sound; a frame's bytes are not. */
        {IDX_USIZE, 0, 1, 1, 1, 1, "frame 0 (records 0 to 1, at byte 16) is not a zstd frame of ", "bytes (file corrupt)"},
        {FRAME_BYTES, 1, 0, 0, 1, 2, "frame 1 (records 2 to 2, ", "is not a zstd frame of"},
        {FRAME_LAST, 0, 0, 0, 1, 0, "frame 0 (records 0 to 1, at byte 16) does not decompress: ", "(file corrupt)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        image im = base;
        set_field(&im, cases[i].field, cases[i].frame, cases[i].add, cases[i].value);
        const char *dir = write_set(&im, 3);
        char shard[700];
        snprintf(shard, sizeof shard, "%s/train/00000.tgshard", dir);
        tg_err err = {{0}};
        tg_shard_set set;
        int rc = tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err);
        if (cases[i].at_get) {
            if (!CHECK(rc == 0, "case %zu: open: %s", i, err.msg)) continue;
            tg_shard_cursor cur;
            REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
            tg_shard_record r;
            rc = tg_shard_cursor_get(&cur, cases[i].record, &r, &err);
            tg_shard_cursor_close(&cur);
            tg_shard_set_close(&set);
        } else {
            CHECK(set.files == NULL && set.dir == NULL, "case %zu: the set was not closed", i);
        }
        CHECK(rc == -1, "case %zu accepted", i);
        CHECK(!strncmp(err.msg, shard, strlen(shard)), "case %zu: '%s' does not name the shard", i, err.msg);
        CHECK(strstr(err.msg, cases[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
        if (cases[i].want2)
            CHECK(strstr(err.msg, cases[i].want2) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want2);
    }

    /* Bytes between the last frame and the index. */
    image im;
    build(&im, 4, 0);
    const char *dir = write_set(&im, 3);
    tg_err err = {{0}};
    tg_shard_set set;
    char want[200];
    snprintf(want, sizeof want, "the frames end at byte %zu, the index starts at %zu (file corrupt)", im.index_at - 4,
             im.index_at);
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && strstr(err.msg, want), "'%s'", err.msg);

    /* A block whose record count differs from the index's. */
    build(&im, 0, 1);
    dir = write_set(&im, 3);
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record r;
    CHECK(tg_shard_cursor_get(&cur, 1, &r, &err) == -1 &&
              strstr(err.msg, "/train/00000.tgshard: frame 0 (records 0 to 1, at byte 16): block holds 1 records, the "
                              "index says 2 (file corrupt)"),
          "'%s'", err.msg);
    /* The failed frame is not cached: asking again fails again; record 2 (frame 1) reads. */
    CHECK(tg_shard_cursor_get(&cur, 0, &r, &err) == -1 && strstr(err.msg, "block holds 1 records"), "'%s'", err.msg);
    CHECK(tg_shard_cursor_get(&cur, 2, &r, &err) == 0 && r.len == 1 && r.input_ids[0] == 20, "%s", err.msg);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
}

TG_TEST(test_shard_reader_files_that_change_or_vanish) {
    image im;
    build(&im, 0, 0);
    const char *dir = write_set(&im, 3);
    char shard[700];
    snprintf(shard, sizeof shard, "%s/train/00000.tgshard", dir);
    tg_err err = {{0}};
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record r;
    /* Truncated after opening: the frame read comes up short. */
    REQUIRE(truncate(shard, (off_t)im.frame_at[1]) == 0, "truncate");
    char want[900];
    snprintf(want, sizeof want, "%s: frame 1 (records 2 to 2, at byte %zu): read error (file changed since it was opened?)",
             shard, im.frame_at[1]);
    CHECK(tg_shard_cursor_get(&cur, 2, &r, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    /* Frame 0 still reads from the open file. */
    CHECK(tg_shard_cursor_get(&cur, 1, &r, &err) == 0 && r.len == 3, "%s", err.msg);
    tg_shard_cursor_close(&cur);
    /* Removed after opening: a new cursor cannot open it. */
    REQUIRE(unlink(shard) == 0, "unlink");
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    snprintf(want, sizeof want, "%s: cannot open the shard: No such file or directory", shard);
    CHECK(tg_shard_cursor_get(&cur, 0, &r, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    /* Missing when the set opens. */
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);

    /* Larger than the manifest says. */
    dir = write_set(&im, 3);
    snprintf(shard, sizeof shard, "%s/train/00000.tgshard", dir);
    FILE *f = fopen(shard, "ab");
    REQUIRE(f && fwrite("xyz", 1, 3, f) == 3, "append");
    fclose(f);
    snprintf(want, sizeof want, "%s: wrong size: the manifest says %zu bytes, the file has %zu (file corrupt or from another set)",
             shard, im.len, im.len + 3);
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);

    /* The shard is a folder: open() takes it, reading it fails. Its size is made the
     * manifest's by giving it entries until it is at least 48 bytes. */
    dir = tg_test_tmpdir();
    snprintf(shard, sizeof shard, "%s/train", dir);
    mkdir(shard, 0755);
    snprintf(shard, sizeof shard, "%s/train/00000.tgshard", dir);
    mkdir(shard, 0755);
    struct stat st = {0};
    for (int i = 0; i < 64 && stat(shard, &st) == 0 && st.st_size < 48; i++) {
        char sub[800];
        snprintf(sub, sizeof sub, "%s/entry-with-a-long-name-%02d", shard, i);
        mkdir(sub, 0755);
    }
    REQUIRE(stat(shard, &st) == 0 && st.st_size >= 48, "folder size %lld", (long long)st.st_size);
    REQUIRE(write_manifest(dir, 3, (int64_t)st.st_size, 0) == 0, "manifest");
    snprintf(want, sizeof want, "%s: read error: Is a directory", shard);
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
}

TG_TEST(test_shard_reader_manifest_file_limits) {
    tg_err err = {{0}};
    tg_shard_set set;
    CHECK(tg_shard_set_open("x", 2, &set, &err) == -1 && !strcmp(err.msg, "x: no split 2"), "'%s'", err.msg);
    CHECK(tg_shard_set_open("x", -1, &set, &err) == -1 && !strcmp(err.msg, "x: no split -1"), "'%s'", err.msg);
    const char *dir = tg_test_tmpdir();
    char want[800], path[700];
    snprintf(want, sizeof want, "%s/manifest.json: cannot open: No such file or directory (not a shard set?)", dir);
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    CHECK(set.dir == NULL && set.files == NULL, "closed after a failure");
    CHECK(tg_shard_set_open("/", TG_SPLIT_TRAIN, &set, &err) == -1 &&
              !strcmp(err.msg, "//manifest.json: cannot open: No such file or directory (not a shard set?)"),
          "'%s'", err.msg);
    /* manifest.json is a folder: fopen takes it, fread fails. */
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    REQUIRE(mkdir(path, 0755) == 0, "mkdir");
    snprintf(want, sizeof want, "%s/manifest.json: read error", dir);
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    /* Larger than 64 MiB (a sparse file). */
    dir = tg_test_tmpdir();
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    REQUIRE(tg_test_write_file(path, "{") == 0 && truncate(path, (64 << 20) + 1) == 0, "big manifest");
    snprintf(want, sizeof want, "%s/manifest.json: larger than 64 MiB", dir);
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    /* A manifest over the first 64 KiB read (the buffer grows), still parsed whole: a long
     * command. */
    image im;
    build(&im, 0, 0);
    dir = write_set(&im, 3);
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    long len;
    char *text = tg_test_read_file(path, &len);
    REQUIRE(text && strstr(text, "\"command\": \"test\""), "manifest");
    size_t big = 200000;
    char *grown = malloc((size_t)len + big + 1);
    char *cmd = strstr(text, "\"command\": \"test\"") + 12;
    size_t head = (size_t)(cmd - text);
    memcpy(grown, text, head);
    memset(grown + head, 'c', big);
    strcpy(grown + head + big, cmd);
    REQUIRE(tg_test_write_file(path, grown) == 0, "write");
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    CHECK(strlen(set.manifest.command) == big + 4 && set.manifest.command[0] == 'c' &&
              !strcmp(set.manifest.command + big, "test"),
          "command of %zu bytes", strlen(set.manifest.command));
    tg_shard_set_close(&set);
    free(grown);
    free(text);
    /* A manifest the parser refuses: its message, naming the file. */
    REQUIRE(tg_test_write_file(path, "{\"format\": \"tunegraph-shards\", \"version\": 1, \"task\": \"lm\"}") == 0, "write");
    snprintf(want, sizeof want, "%s/manifest.json: the manifest has no \"seq\"", dir);
    CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
}

/* ---- blocks and records from hand-made bytes ---------------------------------------- */

/* A block of the given records' bytes (each rec[i] of size[i] bytes). */
static size_t block_of(uint8_t *out, const uint8_t *const *rec, const size_t *size, int n) {
    size_t area = 0;
    tg_put_le32(out, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        memcpy(out + 4 + 4 * (size_t)n + area, rec[i], size[i]);
        area += size[i];
        tg_put_le32(out + 4 + 4 * i, (uint32_t)area);
    }
    return 4 + 4 * (size_t)n + area;
}

/* A record: length, flags, the task's head fields, ids, then types when flags say so. */
static size_t rec_of(uint8_t *out, int task, uint32_t len, uint32_t flags, int32_t a, int32_t b, const uint32_t *ids,
                     uint32_t n_ids, const uint8_t *types, uint32_t n_types) {
    tg_put_le32(out, len);
    tg_put_le32(out + 4, flags);
    size_t at = 8;
    if (task == TG_SHARD_CLASSIFY) tg_put_le32(out + 8, (uint32_t)a), at = 12;
    if (task == TG_SHARD_QA) tg_put_le32(out + 8, (uint32_t)a), tg_put_le32(out + 12, (uint32_t)b), at = 16;
    for (uint32_t i = 0; i < n_ids; i++, at += 4) tg_put_le32(out + at, ids[i]);
    if (n_types) memcpy(out + at, types, n_types);
    return at + n_types;
}

TG_TEST(test_shard_block_check_table) {
    uint8_t b[64];
    const struct {
        uint32_t words[6];
        size_t len;
        int64_t count;
        const char *want;
    } cases[] = {
        {{0}, 3, 0, "blk: block of 3 bytes is too short (file corrupt)"},
        {{2, 4, 8}, 20, 1, "blk: block holds 2 records, the index says 1 (file corrupt)"},
        {{3, 4, 8}, 12, 3, "blk: block of 12 bytes cannot hold 3 record ends (file corrupt)"},
        {{2, 0, 8}, 20, 2, "blk: record 0's end 0 is out of order or past the block (file corrupt)"},
        {{2, 8, 8}, 20, 2, "blk: record 1's end 8 is out of order or past the block (file corrupt)"},
        {{2, 4, 9}, 20, 2, "blk: record 1's end 9 is out of order or past the block (file corrupt)"},
        {{2, 4, 7}, 20, 2, "blk: the records end at 7, the block's record area has 8 bytes (file corrupt)"},
        {{2, 4, 8}, 20, 2, NULL},
        {{0}, 4, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memset(b, 0, sizeof b);
        for (int w = 0; w < 6; w++) tg_put_le32(b + 4 * w, cases[i].words[w]);
        tg_err err = {{0}};
        int rc = tg_shard_block_check(b, cases[i].len, cases[i].count, "blk", &err);
        if (!cases[i].want) CHECK(rc == 0, "case %zu refused: %s", i, err.msg);
        else CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg, cases[i].want);
    }
}

TG_TEST(test_shard_block_record_table) {
    static char *labels[] = {"a", "b", "c"};
    tg_shard_manifest classify = {.task = TG_SHARD_CLASSIFY, .seq = 4, .vocab_size = 50, .n_labels = 3, .labels = labels,
                                  .token_types = 1};
    tg_shard_manifest qa = {.task = TG_SHARD_QA, .seq = 4, .vocab_size = 50};
    tg_shard_manifest lm_no_types = {.task = TG_SHARD_LM, .seq = 4, .vocab_size = 50, .token_types = 0};
    const uint32_t ids[4] = {1, 2, 49, 3}, bad_ids[2] = {7, 50};
    const uint8_t types[4] = {0, 1, 1, 2};
    const struct {
        const tg_shard_manifest *m;
        uint32_t len, flags;
        int32_t a, b;
        const uint32_t *ids;
        uint32_t n_ids, n_types;
        int64_t which;     /* the record asked for */
        int truncate_head; /* the record's bytes cut to 8 */
        const char *want;
    } cases[] = {
        {&classify, 3, 1, 2, 0, ids, 3, 3, 0, 0, NULL},
        {&classify, 3, 0, 0, 0, ids, 3, 0, 0, 0, NULL},
        {&qa, 4, 0, 1, 3, ids, 4, 0, 0, 0, NULL},
        {&qa, 4, 0, 2, 2, ids, 4, 0, 0, 0, NULL},
        {&classify, 3, 0, 0, 0, ids, 3, 0, 1, 0, "rec: no record 1 in the block"},
        {&classify, 3, 0, 0, 0, ids, 3, 0, -1, 0, "rec: no record -1 in the block"},
        {&classify, 3, 0, 0, 0, ids, 3, 0, 0, 1, "rec: record of 8 bytes is too short (file corrupt)"},
        {&classify, 0, 0, 0, 0, ids, 0, 0, 0, 0, "rec: length 0 is outside 1 to the set's seq 4"},
        {&classify, 5, 0, 0, 0, ids, 4, 0, 0, 0, "rec: length 5 is outside 1 to the set's seq 4"},
        {&classify, 3, 2, 0, 0, ids, 3, 0, 0, 0, "rec: unknown flags 0x2 (file corrupt)"},
        {&classify, 3, 3, 0, 0, ids, 3, 3, 0, 0, "rec: unknown flags 0x3 (file corrupt)"},
        {&lm_no_types, 3, 1, 0, 0, ids, 3, 3, 0, 0, "rec: carries token types, the manifest says no record does (file corrupt)"},
        {&classify, 3, 0, 0, 0, ids, 2, 0, 0, 0, "rec: 20 bytes do not hold 3 tokens (file corrupt)"},
        {&classify, 3, 1, 0, 0, ids, 3, 2, 0, 0, "rec: 26 bytes do not hold 3 tokens with types (file corrupt)"},
        {&classify, 3, 0, -1, 0, ids, 3, 0, 0, 0, "rec: label -1 is outside the set's 3 labels"},
        {&classify, 3, 0, 3, 0, ids, 3, 0, 0, 0, "rec: label 3 is outside the set's 3 labels"},
        {&qa, 4, 0, -1, 2, ids, 4, 0, 0, 0, "rec: answer tokens -1 to 2 are outside the record's 4 tokens"},
        {&qa, 4, 0, 3, 2, ids, 4, 0, 0, 0, "rec: answer tokens 3 to 2 are outside the record's 4 tokens"},
        {&qa, 4, 0, 1, 4, ids, 4, 0, 0, 0, "rec: answer tokens 1 to 4 are outside the record's 4 tokens"},
        {&classify, 2, 0, 0, 0, bad_ids, 2, 0, 0, 0, "rec: input_ids[1] = 50 is outside the tokenizer's vocabulary (vocab_size 50)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t rec[128], block[256];
        size_t size = rec_of(rec, cases[i].m->task, cases[i].len, cases[i].flags, cases[i].a, cases[i].b, cases[i].ids,
                             cases[i].n_ids, types, cases[i].n_types);
        if (cases[i].truncate_head) size = 8;
        const uint8_t *recs[1] = {rec};
        size_t len = block_of(block, recs, &size, 1);
        tg_err err = {{0}};
        REQUIRE(tg_shard_block_check(block, len, 1, "blk", &err) == 0, "case %zu: block %s", i, err.msg);
        int32_t out_ids[4] = {-7, -7, -7, -7}, out_types[4] = {-7, -7, -7, -7};
        tg_shard_record r;
        int rc = tg_shard_block_record(block, len, cases[i].which, cases[i].m, out_ids, out_types, &r, "rec", &err);
        if (cases[i].want) {
            CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg,
                  cases[i].want);
            continue;
        }
        if (!CHECK(rc == 0, "case %zu: %s", i, err.msg)) continue;
        CHECK(r.len == (int32_t)cases[i].len && r.input_ids == out_ids, "case %zu: len %d", i, r.len);
        for (uint32_t t = 0; t < cases[i].len; t++) CHECK(out_ids[t] == (int32_t)ids[t], "case %zu: id %u", i, t);
        if (cases[i].flags & 1) {
            CHECK(r.token_type_ids == out_types, "case %zu: types", i);
            for (uint32_t t = 0; t < cases[i].len; t++) CHECK(out_types[t] == types[t], "case %zu: type %u", i, t);
        } else {
            CHECK(r.token_type_ids == NULL && out_types[0] == -7, "case %zu: types where none", i);
        }
        if (cases[i].m->task == TG_SHARD_CLASSIFY) CHECK(r.label == cases[i].a, "case %zu: label %d", i, r.label);
        if (cases[i].m->task == TG_SHARD_QA)
            CHECK(r.label == -1 && r.start == cases[i].a && r.end == cases[i].b, "case %zu: answer %d %d", i, r.start, r.end);
    }
    /* The second record of a block starts where the first ends. */
    uint8_t r0[64], r1[64], block[256];
    size_t sizes[2] = {rec_of(r0, TG_SHARD_LM, 1, 0, 0, 0, ids, 1, NULL, 0), rec_of(r1, TG_SHARD_LM, 2, 0, 0, 0, ids + 2, 2, NULL, 0)};
    const uint8_t *recs[2] = {r0, r1};
    size_t len = block_of(block, recs, sizes, 2);
    tg_err err = {{0}};
    int32_t out_ids[4], out_types[4];
    tg_shard_record r;
    REQUIRE(tg_shard_block_record(block, len, 1, &lm_no_types, out_ids, out_types, &r, "rec", &err) == 0, "%s", err.msg);
    CHECK(r.len == 2 && out_ids[0] == 49 && out_ids[1] == 3 && r.label == -1, "second record");
}

/* Each allocation of opening the set and reading every record failing in turn. */
static int open_and_read(const char *dir, tg_err *err) {
    tg_shard_set set;
    if (tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, err)) return -1;
    tg_shard_cursor cur;
    if (tg_shard_cursor_open(&cur, &set, err)) {
        tg_shard_set_close(&set);
        return -1;
    }
    int rc = 0;
    for (int64_t i = 0; i < set.n_records && !rc; i++) {
        tg_shard_record r;
        rc = tg_shard_cursor_get(&cur, i, &r, err);
    }
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    return rc;
}

/* The set of `im` with a command long enough that manifest.json is over 64 KiB. */
static const char *write_long_manifest_set(const image *im) {
    const char *dir = write_set(im, 3);
    char path[700];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    long len;
    char *text = tg_test_read_file(path, &len);
    char *cmd = text ? strstr(text, "\"command\": \"test\"") : NULL;
    if (!cmd) abort();
    const size_t head = (size_t)(cmd - text) + 12, big = 100000;
    char *grown = malloc((size_t)len + big + 1);
    memcpy(grown, text, head);
    memset(grown + head, 'c', big);
    strcpy(grown + head + big, text + head);
    if (tg_test_write_file(path, grown)) abort();
    free(grown);
    free(text);
    return dir;
}

/* Fails each allocation of open_and_read on the set in dir in turn. */
static void fail_each_allocation(const char *dir) {
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(open_and_read(dir, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 10, "%ld allocations", total);
    const char *seen[] = {"out of memory opening the shard set", "out of memory reading it", "out of memory for 1 shard files",
                          "out of memory naming shard train/00000.tgshard", "out of memory for the checksum's read buffer",
                          "out of memory for a shard cursor's buffers", "byte frame", "manifest.json: out of memory"};
    int hits[sizeof seen / sizeof *seen] = {0};
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        int rc = open_and_read(dir, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory"), "allocation %ld of %ld: rc %d '%s'", k, total, rc, err.msg);
        for (size_t s = 0; s < sizeof seen / sizeof *seen; s++) hits[s] += strstr(err.msg, seen[s]) != NULL;
    }
    for (size_t s = 0; s < sizeof seen / sizeof *seen; s++) CHECK(hits[s] > 0, "no failure said '%s'", seen[s]);
}

TG_TEST(test_shard_reader_out_of_memory) {
    image im;
    build(&im, 0, 0);
    fail_each_allocation(write_set(&im, 3));
    /* manifest.json over the first 64 KiB read: the buffer's growth fails too. */
    fail_each_allocation(write_long_manifest_set(&im));
}

/* An index entry wrong in two ways at once: the first check in the reader's order (its
 * bytes, then its records, then its block size) is the one named. */
TG_TEST(test_shard_reader_index_entry_wrong_twice_names_the_first_cause) {
    image base;
    build(&base, 0, 0);
    const struct {
        int field_a, frame_a, add_a;
        int64_t value_a;
        int field_b, frame_b, add_b;
        int64_t value_b;
        const char *want;
    } cases[] = {
        {IDX_CSIZE, 0, 0, 0, IDX_USIZE, 0, 0, TG_SHARD_BLOCK_MAX + 1, "frame 0 of the index is inconsistent (its bytes; file corrupt)"},
        {IDX_OFFSET, 0, 1, 1, IDX_FIRST, 0, 0, 1, "frame 0 of the index is inconsistent (its bytes; file corrupt)"},
        {IDX_CSIZE, 1, 1, 1, IDX_FIRST, 1, 0, 3, "frame 1 of the index is inconsistent (its bytes; file corrupt)"},
        {IDX_FIRST, 0, 0, 1, IDX_USIZE, 0, 0, TG_SHARD_BLOCK_MAX + 1, "frame 0 of the index is inconsistent (its records; file corrupt)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        image im = base;
        set_field(&im, cases[i].field_a, cases[i].frame_a, cases[i].add_a, cases[i].value_a);
        set_field(&im, cases[i].field_b, cases[i].frame_b, cases[i].add_b, cases[i].value_b);
        const char *dir = write_set(&im, 3);
        char want[900];
        snprintf(want, sizeof want, "%s/train/00000.tgshard: %s", dir, cases[i].want);
        tg_err err = {{0}};
        tg_shard_set set;
        CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1, "case %zu accepted", i);
        CHECK(!strcmp(err.msg, want), "case %zu: '%s', want '%s'", i, err.msg, want);
    }
}

/* Two copies of the image as train shards 00000 and 00001 (records 0-2 and 3-5). */
static const char *write_two_file_set(const image *im) {
    static char dir[600];
    char path[700];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    snprintf(path, sizeof path, "%s/train", dir);
    mkdir(path, 0755);
    tg_shard_entry e[2];
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/train/0000%d.tgshard", dir, k);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(im->b, 1, im->len, f) != im->len) abort();
        fclose(f);
        e[k] = (tg_shard_entry){.split = TG_SPLIT_TRAIN, .records = 3, .bytes = (int64_t)im->len,
                                .xxh64 = XXH64(im->b, im->len, 0)};
        snprintf(e[k].file, sizeof e[k].file, "train/0000%d.tgshard", k);
    }
    int64_t hist_train[1] = {6}, hist_eval[1] = {0};
    tg_shard_manifest m = {.version = TG_SHARD_VERSION, .task = TG_SHARD_LM, .seq = SEQ,
                           .records = {6, 0}, .tokens = {12, 0}, .hist_bin = 8, .n_bins = 1,
                           .hist = {hist_train, hist_eval}, .tokenizer_identity = 1, .tokenizer_family = "wordpiece",
                           .vocab_size = VOCAB, .n_shards = 2, .shards = e, .command = "test"};
    char *text;
    size_t len;
    tg_err err;
    if (tg_shard_manifest_format(&m, &text, &len, &err)) abort();
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (tg_test_write_file(path, text)) abort();
    free(text);
    return dir;
}

/* A shard that cannot be opened leaves the cursor with no file open: once it is back, the
 * next read opens it (rather than reading from the descriptor that failed). */
TG_TEST(test_shard_reader_cursor_reopens_a_shard_that_failed_to_open) {
    image im;
    build(&im, 0, 0);
    const char *dir = write_two_file_set(&im);
    char shard1[700], away[720];
    snprintf(shard1, sizeof shard1, "%s/train/00001.tgshard", dir);
    snprintf(away, sizeof away, "%s.away", shard1);
    tg_err err = {{0}};
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    REQUIRE(set.n_files == 2 && set.n_records == 6, "%d files, %lld records", set.n_files, (long long)set.n_records);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record r;
    CHECK(tg_shard_cursor_get(&cur, 1, &r, &err) == 0 && r.len == 3 && r.input_ids[2] == 12, "%s", err.msg);
    REQUIRE(rename(shard1, away) == 0, "rename");
    char want[900];
    snprintf(want, sizeof want, "%s: cannot open the shard: No such file or directory", shard1);
    CHECK(tg_shard_cursor_get(&cur, 4, &r, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    CHECK(cur.fd == -1, "fd %d after the failed open", cur.fd);
    REQUIRE(rename(away, shard1) == 0, "rename back");
    CHECK(tg_shard_cursor_get(&cur, 4, &r, &err) == 0 && r.len == 3 && r.input_ids[0] == 10 && r.input_ids[2] == 12,
          "%s", err.msg);
    CHECK(tg_shard_cursor_get(&cur, 5, &r, &err) == 0 && r.len == 1 && r.input_ids[0] == 20, "%s", err.msg);
    CHECK(tg_shard_cursor_get(&cur, 0, &r, &err) == 0 && r.len == 2 && r.input_ids[1] == 1, "%s", err.msg);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
}

/* With standard input closed the shard opens as descriptor 0, and closing the cursor
 * closes it. */
TG_TEST(test_shard_reader_cursor_closes_descriptor_zero) {
    image im;
    build(&im, 0, 0);
    const char *dir = write_set(&im, 3);
    tg_err err = {{0}};
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    const int saved = dup(0);
    REQUIRE(saved >= 0, "dup");
    close(0);
    tg_shard_record r;
    const int rc = tg_shard_cursor_get(&cur, 2, &r, &err);
    const int fd = cur.fd, len = rc == 0 ? r.len : -1, id0 = rc == 0 ? r.input_ids[0] : -1;
    tg_shard_cursor_close(&cur);
    const int still_open = fcntl(0, F_GETFD) != -1;
    dup2(saved, 0);
    close(saved);
    CHECK(rc == 0 && len == 1 && id0 == 20, "%s", err.msg);
    CHECK(fd == 0, "the shard opened as descriptor %d", fd);
    CHECK(!still_open, "descriptor 0 still open after the cursor closed");
    CHECK(cur.fd == -1, "fd %d", cur.fd);
    tg_shard_set_close(&set);
}

/* "/" (and "///") is the root folder, kept as "/": its manifest is "//manifest.json". The
 * name is a heap copy so that a read before its first byte is seen under ASan. */
TG_TEST(test_shard_reader_set_at_the_root_folder) {
    const char *names[] = {"/", "///"};
    for (int i = 0; i < 2; i++) {
        char *dir = strdup(names[i]);
        REQUIRE(dir, "strdup");
        tg_err err = {{0}};
        tg_shard_set set;
        CHECK(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == -1, "'%s' opened", dir);
        CHECK(!strcmp(err.msg, "//manifest.json: cannot open: No such file or directory (not a shard set?)"), "'%s': '%s'",
              names[i], err.msg);
        CHECK(set.dir == NULL && set.files == NULL, "the set was not closed");
        free(dir);
    }
}
