/* Native checkpoints: the whole training state of a run at a step boundary, so that a
 * resumed run continues with bitwise-identical losses and parameters.
 *
 * A checkpoint holds every parameter and buffer value (runtime/weights.h's values: trainable
 * fp32 masters, frozen parameters, buffers), the bf16 copies of bf16 plans, the AdamW state
 * (m and v, per replica where ZeRO-1 shards them; the step counter, which is also the
 * dropout streams' counter, and the schedule's total), the step, the data sampler's
 * position (epoch, position in the epoch's order, order seed), and an identity of the run
 * (model, task, shapes, optimizer settings, seed, schedule, training data, the plan's
 * tensors and ops) that a resume must match.
 *
 * File (little-endian): a 64-byte header
 *     0  magic "TGCKPT\0\0"        8  u32 format version (1)   12 u32 flags (0)
 *     16 i32 step                  20 u32 reserved (0)         24 u64 plan fingerprint
 *     32 u64 payload bytes         40 u64 compressed bytes     48 u64 xxh64 of the payload
 *     56 u64 xxh64 of header bytes [0, 56)
 * then the payload as one zstd frame: records, each a 4-byte tag, a u64 body length and
 * the body, in this order:
 *     "IDNT"  u32 count, then count x (key, value) strings (u32 length + bytes)
 *     "STAT"  i32 step, total_steps, replicas; u64 plan fingerprint, dropout seed, dropout
 *             counter; i32 sampler examples, epoch, position; u64 sampler seed
 *     "TNSR"  (any number) name string, i32 replica (-1: every replica's), i32 dtype,
 *             i32 ndim, i64 shape[ndim], u64 byte count, the bytes
 *     "END!"  empty, last
 * Files are written atomically (base/atomic_file.h). In a checkpoint folder they are named
 * step-000123.tgckpt; `latest` names the newest, and only the newest keep_checkpoints stay. */
#ifndef TUNEGRAPH_CHECKPOINT_H
#define TUNEGRAPH_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

#define TG_CHECKPOINT_VERSION 1
#define TG_CHECKPOINT_HEADER_BYTES 64
#define TG_CHECKPOINT_KEY_MAX 64
/* The extension of checkpoint files, and the folder's pointer to the newest one. */
#define TG_CHECKPOINT_EXT ".tgckpt"
#define TG_CHECKPOINT_LATEST "latest"

typedef struct tg_checkpoint_state {
    int32_t step;             /* training steps taken */
    int32_t total_steps;      /* the schedule's length */
    int32_t replicas;         /* data-parallel replicas */
    uint64_t plan_fingerprint;
    /* Dropout: replica r draws from Philox stream (seed + r * 0x9E3779B97F4A7C15) at
     * counter `dropout_counter` + 1 next (the plan's optim.step, which the schedule
     * increments before the forward reads it). */
    uint64_t dropout_seed;
    uint64_t dropout_counter;
    /* The sampler (datasets/dataset.h) before the next step's batch. */
    int32_t sampler_examples;
    int32_t sampler_epoch;
    int32_t sampler_pos;
    uint64_t sampler_seed;
} tg_checkpoint_state;

typedef struct tg_checkpoint_field {
    char key[TG_CHECKPOINT_KEY_MAX];
    char value[TG_PATH_MAX];
} tg_checkpoint_field;

typedef struct tg_checkpoint_tensor {
    char name[TG_NAME_MAX];
    int32_t replica;          /* -1: every replica's; r: replica r's own (a ZeRO-1 slice) */
    int32_t dtype;            /* tg_dtype */
    int32_t ndim;
    int64_t shape[TG_MAX_DIMS];
    uint64_t bytes;           /* numel x the dtype's size */
    const void *data;         /* in memory the checkpoint owns */
} tg_checkpoint_tensor;

typedef struct tg_checkpoint {
    tg_checkpoint_state state;
    tg_checkpoint_field *fields;
    int n_fields;
    tg_checkpoint_tensor *tensors;
    int n_tensors;
    void **blocks;            /* the memory the tensors' data lives in */
    int n_blocks;
} tg_checkpoint;

void tg_checkpoint_init(tg_checkpoint *ck);
void tg_checkpoint_free(tg_checkpoint *ck);

/* Adds an identity field (key shorter than TG_CHECKPOINT_KEY_MAX, value than TG_PATH_MAX). */
int tg_checkpoint_add_field(tg_checkpoint *ck, const char *key, const char *value, tg_err *err);
const char *tg_checkpoint_field_value(const tg_checkpoint *ck, const char *key);
/* Adds a tensor whose bytes are `data`, a malloc'd block the checkpoint takes over (also on
 * failure). */
int tg_checkpoint_add_tensor(tg_checkpoint *ck, const char *name, int replica, int dtype, int ndim,
                             const int64_t *shape, void *data, tg_err *err);
const tg_checkpoint_tensor *tg_checkpoint_find(const tg_checkpoint *ck, const char *name, int replica);
/* Moves every tensor of `from` (one replica's part) into `to`; `from` is left empty. */
int tg_checkpoint_take_tensors(tg_checkpoint *to, tg_checkpoint *from, tg_err *err);

/* What identifies a run beyond its plan. */
typedef struct tg_checkpoint_run {
    int32_t total_steps;      /* the schedule's length */
    int32_t train_examples;
    uint64_t train_hash;      /* xxh64 of the training examples (ids, token types, labels) */
} tg_checkpoint_run;

/* The identity of a run of `plan`, added to ck as fields: the tunegraph version, the model
 * (its name as the job gives it, for messages, and the config values the plan uses), task,
 * shapes, precision, data parallelism, attention, optimizer and schedule settings, seed,
 * steps, training data (its path, for messages, and its examples' count and hash), and
 * xxh64 of the plan's tables (its tensors and ops: freeze patterns and fusions). */
int tg_checkpoint_identify(tg_checkpoint *ck, const tg_plan *plan, const tg_checkpoint_run *run, tg_err *err);
/* Refuses a checkpoint (called `name`) of another run than this one, listing every field
 * that differs ("batch: 8 in the checkpoint, 16 now; ..."). Fields for messages only (the
 * model's and training data's paths, the plan's fingerprint, which also covers run
 * settings such as log_every) may differ. */
int tg_checkpoint_check_identity(const tg_checkpoint *ck, const tg_plan *plan, const tg_checkpoint_run *run,
                                 const char *name, tg_err *err);

/* The file bytes (malloc'd into *out). */
int tg_checkpoint_encode(const tg_checkpoint *ck, uint8_t **out, size_t *out_len, tg_err *err);
/* Writes the file atomically at `path`, compressing as it goes. */
int tg_checkpoint_write(const tg_checkpoint *ck, const char *path, tg_err *err);
/* Decodes file bytes into ck (initialised here; freed by the caller on success only).
 * Refuses, naming `name` and the field: a bad magic, version or flags, a header or payload
 * checksum mismatch, a truncated or overlong file, a frame that does not decompress to the
 * stated size, a malformed, duplicate, missing or out-of-order record, a tensor whose
 * dtype, shape and byte count disagree. */
int tg_checkpoint_decode(const uint8_t *bytes, size_t len, const char *name, tg_checkpoint *ck, tg_err *err);
int tg_checkpoint_read(const char *path, tg_checkpoint *ck, tg_err *err);

/* Creates the folder (and its parents) if missing; refuses one that is not a writable
 * folder. */
int tg_checkpoint_dir_prepare(const char *dir, tg_err *err);
/* Writes ck as DIR/step-NNNNNN.tgckpt, then DIR/latest naming it, then removes all but the
 * `keep` newest checkpoints (0: removes none), and temporary files of checkpoints that
 * processes now gone left behind, each only once what replaces it is on disk. Refused when
 * the folder holds a checkpoint of a later step (another run's: pruning by step number
 * would remove this run's). The new file's path goes to path_out (malloc'd) unless NULL. */
int tg_checkpoint_save_in_dir(const tg_checkpoint *ck, const char *dir, int keep, char **path_out, tg_err *err);
/* The step of the newest checkpoint in the folder (-1: none, or no such folder); -1 with
 * errno when it cannot be listed. */
int tg_checkpoint_dir_newest(const char *dir, int32_t *step);
/* The checkpoint to resume from: `where` itself when it is a file, else in the folder
 * `where` the one `latest` names, or where that is missing, the highest-numbered one
 * (malloc'd into *path). Refuses a folder holding none. */
int tg_checkpoint_locate(const char *where, char **path, tg_err *err);

#endif
