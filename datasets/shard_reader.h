/* Reads a shard set (layout: datasets/shard_format.h) by record number.
 *
 * tg_shard_set_open reads the manifest and, for one split, each shard's size, xxh64,
 * header, footer and frame index; it decompresses nothing. A tg_shard_cursor then gives
 * any record of the split by number, decompressing the frame that holds it (the last
 * frame stays cached, so reading in order decompresses each frame once). The set is
 * read-only after open; each thread reading it uses its own cursor. Every record is
 * checked against the set as it is read: structure, length 1..seq, ids below the
 * tokenizer's vocab_size, labels, answer positions and prompt lengths in range. Errors
 * name the file, and the frame or record: "DIR/train/00000.tgshard: record 12: label 7
 * is outside the set's 5 labels". */
#ifndef TUNEGRAPH_SHARD_READER_H
#define TUNEGRAPH_SHARD_READER_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/shard_format.h"
#include "datasets/shard_manifest.h"

typedef struct tg_shard_frame {
    uint64_t offset;
    uint32_t csize, usize;
    int64_t first;            /* first record, within the shard */
    int64_t count;
} tg_shard_frame;

typedef struct tg_shard_file {
    char *path;
    int64_t first;            /* first record, within the split */
    int64_t records;
    int32_t n_frames;
    tg_shard_frame *frames;
} tg_shard_file;

typedef struct tg_shard_set {
    char *dir;
    int32_t split;            /* tg_shard_split */
    tg_shard_manifest manifest;
    int32_t n_files;
    tg_shard_file *files;     /* the split's shards in record order */
    int64_t n_records;
} tg_shard_set;

/* Opens split `split` of the set in folder `dir`. */
int tg_shard_set_open(const char *dir, int split, tg_shard_set *set, tg_err *err);
void tg_shard_set_close(tg_shard_set *set);
/* The shard holding record `index` of the split, and the record's number within it. */
void tg_shard_set_locate(const tg_shard_set *set, int64_t index, int32_t *file, int64_t *local);

typedef struct tg_shard_cursor {
    const tg_shard_set *set;
    void *dctx;               /* ZSTD_DCtx */
    int fd;
    int32_t fd_file;          /* the shard fd reads, -1 none */
    int32_t file, frame;      /* the cached block, -1 none */
    uint8_t *compressed, *block;
    size_t compressed_cap, block_cap;
    int32_t *ids, *types;     /* the last record's arrays */
    int32_t scratch_cap;
} tg_shard_cursor;

int tg_shard_cursor_open(tg_shard_cursor *c, const tg_shard_set *set, tg_err *err);
/* Record `index` (0-based, within the split) into *rec; its arrays stay valid until the
 * next call. */
int tg_shard_cursor_get(tg_shard_cursor *c, int64_t index, tg_shard_record *rec, tg_err *err);
void tg_shard_cursor_close(tg_shard_cursor *c);

/* The record area of a decompressed block: checks the block header (n records, ends)
 * against the frame's count and size. For the reader and its fuzz target. */
int tg_shard_block_check(const uint8_t *block, size_t len, int64_t count, const char *where, tg_err *err);
/* Decodes record i of a checked block and checks it against the manifest; arrays go to
 * ids and types (capacity at least the manifest's seq). */
int tg_shard_block_record(const uint8_t *block, size_t len, int64_t i, const tg_shard_manifest *m, int32_t *ids,
                          int32_t *types, tg_shard_record *rec, const char *where, tg_err *err);

#endif
