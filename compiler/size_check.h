/* The sizes a job and a model config make, checked before anything is built: dimensions
 * positive, layers at most TG_MAX_LAYERS, and the largest tensors the builders make within
 * TG_MAX_POOL_BYTES, each product computed without overflow and refused naming its fields.
 * The graph checks every tensor and pool again as it is built (compiler/graph.c,
 * compiler/memory_plan.c); these checks name the fields behind a size. */
#ifndef TUNEGRAPH_SIZE_CHECK_H
#define TUNEGRAPH_SIZE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "compiler/job.h"
#include "plan/plan.h"

/* 0, or -1 with a message naming where the job sets the key (model, batch, seq,
 * num_labels) and the config fields involved. A non-positive num_labels is left to the
 * compiler's job checks (classify needs at least 2). */
int tg_check_sizes(const tg_job *job, const tg_model_config *cfg, tg_err *err);

/* For a pool past the limit: the job key to blame (batch for the per-step pools, model for
 * the whole-step ones) and the fields that size it ("model 'x' (n_layer 12, n_embd 768,
 * ...)"). job and cfg may be NULL (hand-built graphs). */
int tg_pool_size_key(int pool);
void tg_describe_pool_size(const tg_job *job, const tg_model_config *cfg, int pool, char *buf, size_t len);

/* "512 B", "3.0 GiB", "16.0 TiB", for messages. */
void tg_format_bytes(uint64_t bytes, char *buf, size_t len);

#endif
