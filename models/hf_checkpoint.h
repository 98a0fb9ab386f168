/* A Hugging Face checkpoint as one set of named tensors: a single model.safetensors, or a
 * sharded one (model.safetensors.index.json, whose weight_map names the shard file of each
 * tensor). Every file is opened and checked up front, so a damaged shard or an index that
 * disagrees with its shards is refused before any value is read. */
#ifndef TUNEGRAPH_HF_CHECKPOINT_H
#define TUNEGRAPH_HF_CHECKPOINT_H

#include "base/error.h"
#include "models/safetensors.h"

/* The file names Hugging Face gives a checkpoint in a model folder. */
#define TG_HF_CHECKPOINT_FILE "model.safetensors"
#define TG_HF_CHECKPOINT_INDEX_FILE "model.safetensors.index.json"
/* An index is JSON of a few hundred bytes per tensor; a bigger one is not an index. */
#define TG_HF_CHECKPOINT_INDEX_MAX_BYTES (64 << 20)
/* Shards one index may name (Hugging Face's largest checkpoints have a few hundred). */
#define TG_HF_CHECKPOINT_MAX_SHARDS 4096

typedef struct tg_hf_checkpoint_tensor {
    const tg_st_entry *entry; /* within files[file] */
    int file;
} tg_hf_checkpoint_tensor;

typedef struct tg_hf_checkpoint {
    char path[TG_ST_PATH_MAX]; /* the safetensors file or the index, as named */
    int sharded;
    int n_files;
    tg_safetensors *files;
    int n;                         /* tensors over all files */
    tg_hf_checkpoint_tensor *tensors; /* sorted by name */
} tg_hf_checkpoint;

/* Opens `path`: a name ending in ".json" is an index, anything else one safetensors file.
 * An index must be a JSON object whose "weight_map" maps each tensor name to a shard file
 * in the index's folder (a relative path without ".." parts). Each shard must open as a
 * safetensors file (tg_st_open), hold every tensor the index maps to it and no other, so no
 * tensor is in two shards; errors name the index, the shard and the tensor. */
int tg_hf_checkpoint_open(const char *path, tg_hf_checkpoint *ck, tg_err *err);
void tg_hf_checkpoint_close(tg_hf_checkpoint *ck);
/* The tensor of that name, or NULL. */
const tg_hf_checkpoint_tensor *tg_hf_checkpoint_find(const tg_hf_checkpoint *ck, const char *name);
/* The file a tensor lives in. */
static inline const tg_safetensors *tg_hf_checkpoint_file(const tg_hf_checkpoint *ck, const tg_hf_checkpoint_tensor *t) {
    return &ck->files[t->file];
}

#endif
