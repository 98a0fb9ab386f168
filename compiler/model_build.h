/* Forward graphs of the supported model families, with Hugging Face parameter names
 * and semantics (BertForSequenceClassification, RobertaForSequenceClassification,
 * BertForMaskedLM, RobertaForMaskedLM, GPT2LMHeadModel, GPT2ForSequenceClassification). */
#ifndef TUNEGRAPH_MODEL_BUILD_H
#define TUNEGRAPH_MODEL_BUILD_H

#include "compiler/graph.h"

/* The largest head dim the fused attention op is emitted for (the CUDA kernel's limit);
 * models with larger heads get the unfused attention whatever the job's `attention`. */
#define TG_FUSED_ATTENTION_MAX_HEAD_DIM 128

/* Whether attention is built as one TG_OP_ATTENTION per layer. */
int tg_fused_attention(const tg_job *job, const tg_model_config *cfg);

/* task = mlm: the [MASK] id and the special ids never masked (TG_JOB_SPECIAL_IDS_MAX, -1
 * unused), the job's or else the architecture's tokenizer's: BERT (the WordPiece
 * vocabularies of bert-base-*) [MASK] 103 and [PAD] (pad_id), [UNK] 100, [CLS] 101,
 * [SEP] 102; RoBERTa (roberta-base's BPE) <mask> the last id of the vocabulary and <s> 0,
 * <pad> (pad_id), </s> 2, <unk> 3. */
void tg_mlm_token_ids(const tg_job *job, const tg_model_config *cfg, int pad_id, int32_t *mask_id,
                      int32_t special[TG_JOB_SPECIAL_IDS_MAX]);

/* Builds the forward phase: creates the input tensors (g->io), parameters and ops, and
 * returns the scalar loss tensor (-1 on failure). pad_id is the id of padding tokens. */
int tg_build_forward(tg_graph *g, int pad_id);

#endif
