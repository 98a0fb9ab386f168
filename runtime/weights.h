/* Parameter values: seeded initialisation (HF's rules), loading from a Hugging Face
 * safetensors file by parameter name, and saving a checkpoint HF can load. */
#ifndef TUNEGRAPH_WEIGHTS_H
#define TUNEGRAPH_WEIGHTS_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* Initialises every parameter in the params pool: normal(0, std) from a seeded Philox
 * stream (per tensor, so the result does not depend on the tensor order), zeros or ones;
 * the padding row of embeddings with a padding index is zeroed as nn.Embedding does. */
void tg_weights_init(const tg_plan *plan, float *params_pool, uint64_t seed);

typedef struct tg_weights_report {
    int loaded;          /* parameters found in the file */
    int missing;         /* parameters left at their initial values (e.g. a new head) */
    char first_missing[TG_NAME_MAX];
} tg_weights_report;

/* Copies every parameter that the safetensors file holds into the params pool. Names
 * are matched as HF does: the exact name, without the base-model prefix ("bert.",
 * "roberta.", "transformer."), and with the old LayerNorm names gamma/beta. A tensor
 * whose shape differs is an error naming the file, the tensor and both shapes; a file
 * holding none of the parameters is an error too. */
int tg_weights_load(const tg_plan *plan, float *params_pool, const char *path, tg_weights_report *report,
                    tg_err *err);

/* Writes the parameters as a safetensors file (atomically), under their HF names. */
int tg_weights_save(const tg_plan *plan, const float *params_pool, const char *path, tg_err *err);

#endif
