/* Parameter and buffer values: seeded initialisation (HF's rules), loading from a Hugging
 * Face safetensors file by name, and saving a checkpoint HF can load. They work on a host
 * image of the values (tg_weights_image), which the trainer uploads into the pools. */
#ifndef TUNEGRAPH_WEIGHTS_H
#define TUNEGRAPH_WEIGHTS_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* The host values of every value tensor of a plan (tg_tensor_is_value): the trainable
 * parameters in an fp32 image of the params pool (at their plan offsets, so it uploads as
 * one tensor, params_all), and the frozen parameters and buffers each at its own offset in
 * `fixed`, as fp32 for float tensors (whatever their storage dtype: a bf16 frozen tensor is
 * narrowed when uploaded) and int32 for int32 ones. */
typedef struct tg_weights_image {
    const tg_plan *plan;
    float *params;          /* pool_bytes[TG_POOL_PARAMS] bytes */
    uint8_t *fixed;
    uint64_t fixed_bytes;
    uint64_t *fixed_offset; /* per tensor: its offset in `fixed`, UINT64_MAX for none */
} tg_weights_image;

/* Allocates an image for the plan, every value zero. */
int tg_weights_image_alloc(const tg_plan *plan, tg_weights_image *img, tg_err *err);
void tg_weights_image_free(tg_weights_image *img);
/* Host values of value tensor t (fp32, or int32 for an int32 tensor); NULL for any other. */
void *tg_weights_value(const tg_weights_image *img, int t);

/* Initialises every value tensor: normal(0, std) from a seeded Philox stream per tensor
 * name (so the result does not depend on the tensor order or class), zeros, ones, or
 * arange; the padding row of embeddings with a padding index is zeroed as nn.Embedding
 * does. */
void tg_weights_init(tg_weights_image *img, uint64_t seed);

typedef struct tg_weights_report {
    int loaded;          /* parameters and buffers found in the file */
    int trainable, frozen, buffers; /* of `loaded`, per class */
    int missing;         /* parameters (and persistent buffers) left at their initial values */
    int ignored;         /* non-persistent buffers the file holds, ignored as Hugging Face does */
    char first_missing[TG_NAME_MAX];
} tg_weights_report;

/* Copies every parameter and persistent buffer that the safetensors file holds into the
 * image. Names are matched as HF does: the exact name, without the base-model prefix
 * ("bert.", "roberta.", "transformer."), and with the old LayerNorm names gamma/beta. A
 * tensor whose shape differs is an error naming the file, the tensor and both shapes, and
 * so is a float value that is not finite (NaN, an infinity), naming the element; a file
 * holding none of the parameters is an error too. Integer buffers take I32 or I64 entries
 * (out-of-range values are an error). Non-persistent buffers found in the file are counted
 * as ignored and keep their initial values. */
int tg_weights_load(tg_weights_image *img, const char *path, tg_weights_report *report, tg_err *err);

/* Writes the trainable and frozen parameters and the persistent buffers as a safetensors
 * file (atomically), under their HF names. */
int tg_weights_save(const tg_weights_image *img, const char *path, tg_err *err);

#endif
