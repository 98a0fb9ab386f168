/* Shard sets wherever a job names a dataset (train_data, eval_data): the folder OUTDIR
 * that `data convert` made stands for its train split, OUTDIR/train and OUTDIR/eval for
 * one split each. tg_dataset_load (datasets/jsonl.c) hands such paths here. */
#ifndef TUNEGRAPH_SHARD_DATASET_H
#define TUNEGRAPH_SHARD_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/dataset.h"

/* Whether `path` names a shard set or one of its splits (a folder, or OUTDIR/eval of a set
 * without an eval split) rather than a JSONL file. */
int tg_shard_path_is_set(const char *path);

/* The set's folder (into dir, n bytes) and the split `path` names: OUTDIR -> train,
 * OUTDIR/train, OUTDIR/eval. *split is -1 (tg_shard_split otherwise) when path names no
 * set. */
void tg_shard_path_resolve(const char *path, char *dir, size_t n, int *split);

/* Loads a split into memory as tg_dataset_load does for JSONL, checked against the rules:
 * the set's task against the job's (classify needs a classify set; lm reads the ids of
 * any set, and an instruct set's prompt lengths), label names against num_labels, every id against vocab_size, token types
 * against type_vocab_size, and, when tokenizer_identity is not 0, the manifest's tokenizer
 * against it (tg_tokenizer_identity of the job's tokenizer; tg_dataset_load passes 0
 * until jobs name one). */
int tg_shard_dataset_load(const char *path, const tg_data_rules *rules, uint64_t tokenizer_identity, tg_dataset *ds,
                          tg_err *err);

#endif
