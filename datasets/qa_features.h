/* SQuAD questions to training features as Hugging Face's run_qa prepares them: the
 * question and a window of the context, [CLS] question [SEP] context [SEP] (RoBERTa:
 * <s> question </s></s> context </s>), truncating only the context; a context longer than
 * a window is covered by windows that overlap by doc_stride tokens. Each window's answer
 * is the first and last context token covering the answer's bytes, or 0 and 0 (the
 * [CLS] token) when the window does not hold the whole answer or the question has none.
 * The context is encoded once and shared by its questions. */
#ifndef TUNEGRAPH_QA_FEATURES_H
#define TUNEGRAPH_QA_FEATURES_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/shard_format.h"
#include "datasets/text_encoder.h"

typedef struct tg_qa_context {
    int32_t n, cap;
    int32_t *ids;
    int64_t *start, *end;     /* byte offsets of each token in the context */
} tg_qa_context;

typedef struct tg_qa_buffers {
    int32_t *q_ids, *ids, *types;
    int32_t q_cap, cap;
    /* Set for the sink: the window it is handed holds context tokens window_first ..
     * window_first + window_count - 1 at positions window_at onwards. */
    int32_t window_at, window_first, window_count;
} tg_qa_buffers;

typedef int (*tg_qa_sink)(void *ctx, const tg_shard_record *rec, tg_err *err);

int tg_qa_encode_context(const tg_text_encoder *enc, const char *text, size_t len, tg_qa_context *c, tg_err *err);
void tg_qa_context_free(tg_qa_context *c);

/* Hands each window of question q over context c to sink. The answer is the context's
 * bytes [a_start, a_end), or a_start < 0 for none. *windows and *answered count the
 * windows and those holding the answer. */
int tg_qa_features(const tg_text_encoder *enc, const char *q, size_t q_len, const tg_qa_context *c, int64_t a_start,
                   int64_t a_end, int32_t seq, int32_t doc_stride, tg_qa_buffers *buf, tg_qa_sink sink,
                   void *sink_ctx, int64_t *windows, int64_t *answered, tg_err *err);
void tg_qa_buffers_free(tg_qa_buffers *b);

#endif
