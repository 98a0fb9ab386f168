/* manifest.json of a shard set: what the set holds and how it was made.
 *
 *   {"format": "tunegraph-shards", "version": 1, "task": "classify" | "lm" | "qa" | "instruct" | "image",
 *    "seq": N, "doc_stride": N (qa only),
 *    "records": {"train": N, "eval": N}, "tokens": {"train": N, "eval": N},
 *    "labels": ["name", ...] (classify: label names by id),
 *    "length_histogram": {"bin_width": W, "train": [...], "eval": [...]}
 *        (bin i counts records of i*W+1 .. (i+1)*W tokens; ceil(seq / W) bins),
 *    "token_types": true | false (whether any record carries token types),
 *    "tokenizer": {"identity": "16 hex digits", "family": "wordpiece" | ..., "vocab_size": N}
 *        (not in image sets),
 *    "image": {"channels": C, "height": H, "width": W} (image sets only: the records are
 *        images of this shape, one byte a pixel, seq = C x H x W; labels as classify),
 *    "shards": [{"file": "train/00000.tgshard", "split": "train", "records": N, "bytes": N,
 *                "xxh64": "16 hex digits"}, ...],
 *    "command": "the command line that made the set"}
 *
 * The reader checks the version first, then every field, unknown keys included, and that
 * the counts agree with each other (shards and histogram against records). */
#ifndef TUNEGRAPH_SHARD_MANIFEST_H
#define TUNEGRAPH_SHARD_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/shard_format.h"

#define TG_SHARD_FILE_MAX 64

typedef struct tg_shard_entry {
    char file[TG_SHARD_FILE_MAX];  /* relative to the set: "train/00000.tgshard" */
    int32_t split;
    int64_t records;
    int64_t bytes;
    uint64_t xxh64;                /* of the whole file */
} tg_shard_entry;

typedef struct tg_shard_manifest {
    int32_t version;
    int32_t task;                  /* tg_shard_task */
    int32_t seq;                   /* the longest record allowed */
    int32_t doc_stride;            /* qa: context tokens shared by consecutive windows */
    int64_t records[TG_SPLIT_COUNT], tokens[TG_SPLIT_COUNT];
    int32_t n_labels;
    char **labels;
    int32_t hist_bin, n_bins;
    int64_t *hist[TG_SPLIT_COUNT];
    int32_t token_types;
    uint64_t tokenizer_identity;
    char tokenizer_family[32];
    int32_t vocab_size;            /* image: 256 */
    int32_t image_channels, image_height, image_width; /* image sets; else 0 */
    int32_t n_shards;
    tg_shard_entry *shards;
    char *command;
} tg_shard_manifest;

/* Parses manifest text (`name` in messages). */
int tg_shard_manifest_parse(const char *text, size_t len, const char *name, tg_shard_manifest *m, tg_err *err);
/* The manifest as JSON text (malloc'd, NUL-terminated). */
int tg_shard_manifest_format(const tg_shard_manifest *m, char **text, size_t *len, tg_err *err);
void tg_shard_manifest_free(tg_shard_manifest *m);

#endif
