/* Forward graphs of the supported model families, with Hugging Face parameter names
 * and semantics (BertForSequenceClassification, RobertaForSequenceClassification,
 * GPT2LMHeadModel, GPT2ForSequenceClassification). */
#ifndef TUNEGRAPH_MODEL_BUILD_H
#define TUNEGRAPH_MODEL_BUILD_H

#include "compiler/graph.h"

/* The largest head dim the fused attention op is emitted for (the CUDA kernel's limit);
 * models with larger heads get the unfused attention whatever the job's `attention`. */
#define TG_FUSED_ATTENTION_MAX_HEAD_DIM 128

/* Whether attention is built as one TG_OP_ATTENTION per layer. */
int tg_fused_attention(const tg_job *job, const tg_model_config *cfg);

/* Builds the forward phase: creates the input tensors (g->io), parameters and ops, and
 * returns the scalar loss tensor (-1 on failure). pad_id is the id of padding tokens. */
int tg_build_forward(tg_graph *g, int pad_id);

#endif
