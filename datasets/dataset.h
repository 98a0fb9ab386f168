/* Pre-tokenized JSON Lines datasets and fixed-shape batches.
 * Each line: {"input_ids": [..], "label": n} for classify, {"input_ids": [..]} for lm;
 * optional "token_type_ids": [..] (same length as input_ids); for lm, optional "labels":
 * [..] as Hugging Face writes them (the same length as input_ids, each the id at its
 * position or -100 for a position that is no target; the -100 positions past the first
 * come before every counted one: a prompt whose tokens are no targets, the way
 * `data convert --format instruct` makes them). tg_dataset_load also takes
 * a shard set made by `data convert` (datasets/shard_dataset.h): OUTDIR for its train
 * split, OUTDIR/train or OUTDIR/eval. */
#ifndef TUNEGRAPH_DATASET_H
#define TUNEGRAPH_DATASET_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* The longest line a dataset may have, newline excluded: 16 MiB, some two million token
 * ids, far past any sequence the models take. A longer line (a file that is not JSON
 * Lines, /dev/zero) is refused once this much of it has been read. */
#define TG_JSONL_MAX_LINE_BYTES (16 << 20)

typedef struct tg_example {
    int32_t len;
    int32_t *input_ids;       /* NULL in an image set, whose values are pixels */
    uint8_t *pixels;          /* an image set's record: its len bytes (channel planes); else NULL */
    int32_t *token_type_ids;  /* NULL when the line has none (all zeros) */
    int32_t label;            /* classify; qa: the answer's start token; TG_IGNORE_INDEX for lm */
    int32_t label_end;        /* qa: the answer's end token (0, 0: no answer, the [CLS] token) */
    int32_t prompt_len;       /* lm: the first prompt_len tokens are no targets (an instruction's
                                 prompt, < len); 0 or 1: every token after the first is one */
} tg_example;

typedef struct tg_dataset {
    char path[TG_PATH_MAX];
    int32_t n;
    tg_example *examples;
    int64_t n_tokens;
} tg_dataset;

/* What a dataset is checked against: ids < vocab_size, type ids < type_vocab_size
 * (or 0 when type_vocab_size is 0), 0 <= label < num_labels for classify. Errors name
 * file, line and field: "train.jsonl:12: input_ids[3] = 40000 is outside the vocabulary
 * (vocab_size 30522)". An empty file or an empty input_ids is an error, and so is a line
 * longer than TG_JSONL_MAX_LINE_BYTES or an object that names a key twice. */
typedef struct tg_data_rules {
    int32_t task;
    int32_t num_labels;
    int32_t vocab_size;
    int32_t type_vocab_size;
    /* Image models (image_channels > 0): the data must be an image shard set of
     * image_channels x image_size x image_size (`data convert --format idx`), its labels
     * below num_labels; examples hold the pixels as bytes (tg_example.pixels). */
    int32_t image_channels, image_size;
} tg_data_rules;

int tg_dataset_load(const char *path, const tg_data_rules *rules, tg_dataset *ds, tg_err *err);
void tg_dataset_free(tg_dataset *ds);

/* Host buffers of one batch, laid out as the plan's input tensors. */
typedef struct tg_batch {
    int32_t *input_ids;       /* [B,T] */
    float *attention_mask;    /* [B,T] 1 for real tokens, 0 for padding */
    int32_t *token_type_ids;  /* [B,T] */
    int32_t *position_ids;    /* [B,T] */
    int32_t *labels;          /* classify [B]; lm [B,T]; qa [B,2] (start, end) */
    int32_t n_real;           /* examples that are not padding rows */
    int64_t n_tokens;         /* real (unpadded) tokens */
    /* In and out: the buffers already hold the parts of a batch that do not depend on
     * its examples, 0..T-1 positions (not RoBERTa) and all-zero token types, so a fill
     * skips writing them again; set after a fill that copied no token types. */
    int32_t fixed_parts_written;
    /* Optional, in and out: each row's real length as the buffers hold it, trusted only
     * with fixed_parts_written. A row refilled to the same length keeps its mask, its
     * padding and (RoBERTa) its positions; full-length rows, the common case, then write
     * just their ids and labels. */
    int32_t *row_len;
    /* In: LM rows get TG_LABELS_FROM_IDS as their first label and nothing else, for a
     * training step that derives the rest on the device (tg_batch_derive_label_rows); the
     * rows of examples with a prompt get their whole label row all the same. A
     * marked fill leaves the rest of each label row as it was, so a fill that changes this
     * over buffers filled before must come with fixed_parts_written = 0. */
    int32_t mark_label_rows;
} tg_batch;

typedef struct tg_batch_shape {
    int32_t batch, seq;
    int32_t task;             /* tg_task */
    int32_t arch;             /* tg_arch: RoBERTa positions start after the pad id */
    int32_t pad_id;           /* id written into padded positions */
} tg_batch_shape;

/* Fills a batch from examples idx[0..n-1] (n <= batch); rows past n are padding rows
 * whose labels are all TG_IGNORE_INDEX, so they add nothing to loss or accuracy.
 * Sequences longer than seq are truncated. Labels: classify -> the example's label;
 * qa -> labels[2b], labels[2b+1] = its start and end token (padding rows TG_SPAN_NONE);
 * lm -> labels[t] = input_ids[t+1] where position t+1 is a real token and not in the
 * example's prompt (t+1 >= prompt_len), else ignored (the shift HF's causal-LM loss
 * applies to labels that are -100 on the prompt). Positions: 0..T-1, or for RoBERTa
 * pad_id + 1 + (count of real tokens so far) on real tokens and pad_id on padding. */
void tg_batch_fill(const tg_dataset *ds, const int32_t *idx, int32_t n,
                   const tg_batch_shape *shape, tg_batch *out);

/* Writes the labels of each row marked TG_LABELS_FROM_IDS as tg_batch_fill would have
 * (labels[t] = ids[t + 1] while mask[t + 1] != 0, else TG_IGNORE_INDEX); [rows, seq]. */
void tg_batch_derive_label_rows(int32_t *labels, const int32_t *ids, const float *mask, int32_t rows, int32_t seq);

/* A seeded shuffled stream over a dataset, reshuffled each epoch (xorshift-based,
 * identical across machines). */
typedef struct tg_sampler {
    int32_t n;
    int32_t *order;
    int32_t pos;
    int32_t epoch;
    uint64_t seed;
} tg_sampler;

/* The streams of tg_seeded_order: the examples' order of an epoch (tg_sampler's), and the
 * order a batch sampler puts an epoch's batches in (datasets/batch_sampler.h). */
enum { TG_ORDER_EXAMPLES = 0, TG_ORDER_BATCHES = 1 };

/* Writes a shuffled permutation of 0..n-1 into order that depends only on (seed, epoch,
 * stream); TG_ORDER_EXAMPLES gives epoch `epoch`'s order of tg_sampler. */
void tg_seeded_order(int32_t *order, int32_t n, uint64_t seed, int32_t epoch, int stream);

int tg_sampler_init(tg_sampler *s, int32_t n, uint64_t seed, tg_err *err);
/* Puts the sampler where one that has drawn `pos` indices of epoch `epoch` would be (pos
 * in [0, n], epoch >= 0): a resumed run's data position (runtime/checkpoint.h). */
int tg_sampler_seek(tg_sampler *s, int32_t epoch, int32_t pos, tg_err *err);
/* Writes the next `count` example indices, crossing epochs as needed. */
void tg_sampler_next(tg_sampler *s, int32_t *idx, int32_t count);
void tg_sampler_free(tg_sampler *s);

#endif
