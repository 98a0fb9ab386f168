/* From a question's start and end logits over its windows to its answer, as Hugging Face's
 * run_qa post-processing does (utils_qa.postprocess_qa_predictions), in float32 as there:
 *   - candidates: in each window, the n_best highest start positions by n_best highest end
 *     positions, kept when both are context tokens, end >= start and the span is at most
 *     max_answer_len tokens; a span's score is start logit + end logit;
 *   - the null answer: the window whose [CLS] score (start + end logit at position 0) is
 *     the lowest gives it (SQuAD v2 only);
 *   - the n_best best candidates by score (ties keep their order: window, then start, then
 *     end), the null answer among them; the best one with text is the answer, unless the
 *     null score beats its start + end logits by more than null_threshold (SQuAD v2), when
 *     the answer is empty. When nothing but the null answer is left, the answer is the
 *     literal text "empty", as there.
 * Top-n positions are ordered by logit, highest first; equal logits put the later position
 * first (numpy's argsort read backwards). */
#ifndef TUNEGRAPH_QA_POSTPROCESS_H
#define TUNEGRAPH_QA_POSTPROCESS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct tg_qa_window_logits {
    const float *start_logits, *end_logits;  /* one per position */
    const int64_t *context_start;            /* the bytes of the context each position covers, */
    const int64_t *context_end;              /* end exclusive; start < 0: not a context token */
    int32_t len;                             /* positions */
} tg_qa_window_logits;

typedef struct tg_qa_postprocess_options {
    int32_t n_best;            /* 20 in run_qa */
    int32_t max_answer_len;    /* tokens; 30 in run_qa */
    double null_threshold;     /* null_score_diff_threshold; 0 in run_qa */
    int version_2;             /* SQuAD v2: unanswerable questions exist */
} tg_qa_postprocess_options;

typedef enum tg_qa_answer_kind {
    TG_QA_SPAN = 0,            /* context bytes [start, end) */
    TG_QA_NULL,                /* the empty answer (unanswerable) */
    TG_QA_FALLBACK_EMPTY,      /* no candidate: the text "empty" */
} tg_qa_answer_kind;

typedef struct tg_qa_answer {
    tg_qa_answer_kind kind;
    int64_t start, end;        /* TG_QA_SPAN */
    float score_diff;          /* null score - best span's logits (SQuAD v2; 0 otherwise) */
} tg_qa_answer;

/* The answer of one question from its n windows' logits. Errors: no window, a bad option,
 * a NaN logit, or a context range that is not start < end (so that no span is empty, where
 * run_qa could fail). */
int tg_qa_postprocess(const tg_qa_window_logits *windows, int32_t n, const tg_qa_postprocess_options *opt,
                      tg_qa_answer *answer, tg_err *err);

/* The answer's text in its context (*text, *len: a span of context, "" or "empty"). */
void tg_qa_answer_text(const tg_qa_answer *a, const char *context, const char **text, size_t *len);

#endif
