/* The shard set on disk, shared by its writer and reader.
 *
 * A shard set is a folder:
 *   OUTDIR/manifest.json          what the set holds (datasets/shard_manifest.h)
 *   OUTDIR/train/00000.tgshard    the train split's shards, in record order
 *   OUTDIR/eval/00000.tgshard     the eval split's, when there is one
 *
 * A shard file, integers little-endian:
 *   header  16 bytes: magic "TGSHARD\0", u32 format version, u32 record kind (tg_shard_task)
 *   frames  one zstd frame per block of records (content size and checksum in the frame)
 *   index   24 bytes per frame: u64 frame offset, u32 compressed bytes, u32 block bytes,
 *           u64 the frame's first record (within the shard)
 *   footer  32 bytes: u64 index offset, u64 frames, u64 records, magic "TGSHIDX\0"
 * The index gives random access by record number: find the frame, decompress its block.
 *
 * A block: u32 n (records), u32 end[n] (where each record ends within the record area,
 * increasing), then the record area, each record:
 *   u32 length L (tokens, >= 1), u32 flags (bit 0: token types follow the ids),
 *   i32 label (classify) | i32 start, i32 end (qa: answer token positions) | nothing (lm) |
 *   i32 prompt P (instruct: the record's first P tokens are the prompt, 1 <= P < L),
 *   u32 input_ids[L], then u8 token_type_ids[L] when flagged.
 * An image record (task image) is a classify record whose values are pixels, one byte
 * each: u32 length L (channels x height x width, the set's seq), u32 flags (0), i32 label,
 * u8 pixels[L] in channel, row, column order. The writer takes and the reader gives the
 * pixels as input_ids in 0 to 255.
 * Version 1 holds every kind; a build that predates a kind refuses a set of it by the
 * manifest's task. */
#ifndef TUNEGRAPH_SHARD_FORMAT_H
#define TUNEGRAPH_SHARD_FORMAT_H

#include <stdint.h>
#include <string.h>

#define TG_SHARD_VERSION 1
#define TG_SHARD_HEADER_BYTES 16
#define TG_SHARD_INDEX_ENTRY_BYTES 24
#define TG_SHARD_FOOTER_BYTES 32
#define TG_SHARD_FLAG_TYPES 1u
#define TG_SHARD_SEQ_MAX (1 << 22) /* a record this long still fits a block */
/* A block (and so a record) is at most this large, which bounds what a damaged or hostile
 * index can make the reader allocate. */
#define TG_SHARD_BLOCK_MAX (64u << 20)
/* A zstd block yields at most 128 KiB from 4 bytes (RLE), so no frame expands more. */
#define TG_SHARD_MAX_EXPANSION 32768u

static const char tg_shard_magic[8] = {'T', 'G', 'S', 'H', 'A', 'R', 'D', 0};
static const char tg_shard_footer_magic[8] = {'T', 'G', 'S', 'H', 'I', 'D', 'X', 0};

/* instruct: lm records whose first tokens (the prompt) are no targets: an instruction
 * and its response, the loss on the response alone. */
typedef enum tg_shard_task { TG_SHARD_CLASSIFY = 1, TG_SHARD_LM = 2, TG_SHARD_QA = 3, TG_SHARD_INSTRUCT = 4,
                              TG_SHARD_IMAGE = 5 } tg_shard_task;
typedef enum tg_shard_split { TG_SPLIT_TRAIN = 0, TG_SPLIT_EVAL = 1, TG_SPLIT_COUNT } tg_shard_split;

/* Bytes of a record's fixed part (length, flags, label or positions) for a task. */
static inline uint32_t tg_shard_record_head(int task) {
    return 8u + (task == TG_SHARD_CLASSIFY || task == TG_SHARD_INSTRUCT || task == TG_SHARD_IMAGE ? 4u
                 : task == TG_SHARD_QA                                                          ? 8u
                                                                                                : 0u);
}
/* Bytes per stored value: a token id 4, a pixel 1. */
static inline uint32_t tg_shard_value_bytes(int task) { return task == TG_SHARD_IMAGE ? 1u : 4u; }

static inline void tg_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void tg_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t tg_get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t tg_get_le64(const uint8_t *p) {
    return (uint64_t)tg_get_le32(p) | (uint64_t)tg_get_le32(p + 4) << 32;
}

/* One record as the writer takes it and the reader gives it. */
typedef struct tg_shard_record {
    int32_t len;
    const int32_t *input_ids;
    const int32_t *token_type_ids;  /* NULL: all zero */
    int32_t label;                  /* classify */
    int32_t start, end;             /* qa: the answer's first and last token (0, 0: none) */
    int32_t prompt_len;             /* instruct: the prompt's tokens at the start (1 <= prompt_len < len) */
} tg_shard_record;

const char *tg_shard_task_name(int task);
const char *tg_shard_split_name(int split);

#endif
