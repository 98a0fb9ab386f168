/* The plan's fingerprint, from the model config and job it was compiled from. */
#ifndef TUNEGRAPH_FINGERPRINT_H
#define TUNEGRAPH_FINGERPRINT_H

#include <stdint.h>

#include "compiler/job.h"
#include "plan/plan.h"

/* xxh64 of the field-by-field little-endian encoding of a model config and job (padding
 * and bytes past each string's end play no part), with the producing version: the plan's
 * fingerprint. */
uint64_t tg_job_fingerprint(const tg_model_config *model, const tg_job *job, const char *version);

#endif
