/* Writes a shard set (layout: datasets/shard_format.h) atomically: everything goes into a
 * temporary folder beside OUTDIR (".NAME.tmp-XXXXXX"), which is renamed to OUTDIR when the
 * set is complete, so a failed or interrupted conversion leaves no partial set under
 * OUTDIR. An existing OUTDIR is replaced only when it is an empty folder or a shard set
 * (swapped atomically with renameat2, then removed); anything else there is refused. */
#ifndef TUNEGRAPH_SHARD_WRITER_H
#define TUNEGRAPH_SHARD_WRITER_H

#include <stdint.h>

#include "base/error.h"
#include "datasets/shard_format.h"

typedef struct tg_shard_set_desc {
    int32_t task;                  /* tg_shard_task */
    int32_t seq;                   /* the longest record */
    int32_t doc_stride;            /* qa */
    int32_t n_labels;              /* classify: label names by id */
    char *const *labels;
    uint64_t tokenizer_identity;
    const char *tokenizer_family;
    int32_t vocab_size;
    const char *command;
    int64_t frame_bytes;           /* uncompressed bytes per frame; 0: 32 KiB */
    int64_t shard_bytes;           /* uncompressed bytes per shard; 0: 64 MiB */
    /* image: the images' shape; seq must be channels x height x width and vocab_size 256
     * (a pixel's values), and the set has labels and no tokenizer */
    int32_t image_channels, image_height, image_width;
} tg_shard_set_desc;

typedef struct tg_shard_writer tg_shard_writer;

int tg_shard_writer_open(const char *outdir, const tg_shard_set_desc *desc, tg_shard_writer **out, tg_err *err);
/* Appends a record to a split (tg_shard_split). Records are checked against the set:
 * 1 <= len <= seq, ids in [0, vocab_size), type ids in [0, 255], labels and answer
 * positions in range; an image record has exactly seq values (its pixels), no types. */
int tg_shard_writer_add(tg_shard_writer *w, int split, const tg_shard_record *rec, tg_err *err);
/* Records so far in a split. */
int64_t tg_shard_writer_count(const tg_shard_writer *w, int split);
/* Finishes the shards, writes manifest.json and moves the set to OUTDIR. Frees w; on
 * failure nothing is left behind. */
int tg_shard_writer_commit(tg_shard_writer *w, tg_err *err);
/* The temporary folder the set is written in: files a caller adds there move to OUTDIR with
 * the set at commit (the SQuAD eval files, datasets/squad_eval.h). */
const char *tg_shard_writer_folder(const tg_shard_writer *w);
/* Drops everything written. Frees w. */
void tg_shard_writer_abort(tg_shard_writer *w);

/* Removes a folder tree (a temporary or replaced set); 0 or -1. */
int tg_shard_remove_tree(const char *dir);

#endif
