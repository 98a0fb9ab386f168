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

/* What a load found, as Hugging Face reports it: the parameters (and persistent buffers)
 * left at their initial values because the checkpoint lacks them, and the checkpoint
 * tensors the model has no use for. */
typedef struct tg_weights_report {
    int loaded;          /* parameters and buffers found in the file */
    int trainable, frozen, buffers; /* of `loaded`, per class */
    int missing;         /* parameters (and persistent buffers) left at their initial values */
    int ignored;         /* tensors Hugging Face ignores without a word: non-persistent buffers
                            (position_ids) and GPT-2's attention-mask buffers (attn.bias) */
    int unexpected;      /* checkpoint tensors no parameter or buffer takes */
    int files;           /* safetensors files read (the shards of a sharded checkpoint) */
    char first_missing[TG_NAME_MAX];
    /* The `missing` parameter names and the `unexpected` checkpoint names, each sorted as
     * Python sorts strings (byte order); malloc'd, freed by tg_weights_report_free. */
    char **missing_names;
    char **unexpected_names;
} tg_weights_report;

void tg_weights_report_free(tg_weights_report *r);

/* Hugging Face's warnings for the report, one per line (malloc'd; "" when nothing is
 * missing or unexpected):
 *   Some weights of the model checkpoint at CHECKPOINT were not used when initializing
 *   MODEL_CLASS: ['cls.predictions.bias', ...]
 *   Some weights of MODEL_CLASS were not initialized from the model checkpoint at CHECKPOINT
 *   and are newly initialized: ['classifier.bias', 'classifier.weight']
 * NULL when out of memory. */
char *tg_weights_report_text(const tg_weights_report *r, const char *model_class, const char *checkpoint);

/* Copies every parameter and persistent buffer that the checkpoint holds into the image.
 * `path` is a safetensors file or a sharded checkpoint's index (models/hf_checkpoint.h).
 * Names are matched as HF does: the exact name, without the base-model prefix ("bert.",
 * "roberta.", "transformer.": checkpoints saved from BertModel, RobertaModel, GPT2Model),
 * and with the old LayerNorm names gamma/beta; GPT-2's lm_head.weight is the tied
 * transformer.wte.weight. A tensor whose shape differs is an error naming the file, the
 * tensor and both shapes, and so is a float value that is not finite (NaN, an infinity),
 * naming the element; a checkpoint holding none of the parameters is an error too. F32,
 * F16, BF16 and F64 tensors are widened or narrowed to fp32; integer buffers take I32 or
 * I64 entries (out-of-range values are an error). Non-persistent buffers found in the
 * file keep their initial values. The report (freed by the caller, also after a failure)
 * lists what is missing and unexpected. */
int tg_weights_load(tg_weights_image *img, const char *path, tg_weights_report *report, tg_err *err);

/* Writes the trainable and frozen parameters and the persistent buffers as a safetensors
 * file (atomically), under their HF names. */
int tg_weights_save(const tg_weights_image *img, const char *path, tg_err *err);

/* The same as Hugging Face's save_pretrained writes it: __metadata__ {"format": "pt"},
 * float tensors in fp32 (bf16: rounded to nearest even), integer buffers as I64. Tied
 * weights are saved once, under the name HF keeps (GPT-2's transformer.wte.weight, no
 * lm_head.weight). */
int tg_weights_save_hf(const tg_weights_image *img, const char *path, int bf16, tg_err *err);

#endif
