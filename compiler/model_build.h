/* Forward graphs of the supported model families, with Hugging Face parameter names
 * and semantics (BertForSequenceClassification, RobertaForSequenceClassification,
 * GPT2LMHeadModel, GPT2ForSequenceClassification). */
#ifndef TUNEGRAPH_MODEL_BUILD_H
#define TUNEGRAPH_MODEL_BUILD_H

#include "compiler/graph.h"

/* Builds the forward phase: creates the input tensors (g->io), parameters and ops, and
 * returns the scalar loss tensor (-1 on failure). pad_id is the id of padding tokens. */
int tg_build_forward(tg_graph *g, int pad_id);

#endif
