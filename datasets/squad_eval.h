/* What the eval of a question-answering split needs beyond its records: for each window
 * (record), its question and where its context tokens come from; for each question, its id,
 * context and gold answers; for each context, its text and the bytes each of its tokens
 * covers. `data convert --format squad` writes it beside the shard set, one file per split
 * with records: OUTDIR/squad_train.jsonl and OUTDIR/squad_eval.jsonl.
 *
 * The file is JSON Lines; each line one object, in the order written, each entry numbered
 * from 0 in its kind and naming only earlier ones:
 *   {"context": TEXT, "offsets": [s0, e0, s1, e1, ...]}   token i covers bytes [si, ei) of
 *                                                          TEXT (UTF-8), 0 <= si <= ei <= len
 *   {"question": ID, "context": C, "answers": [TEXT, ...]}  the gold answers' texts ([]:
 *                                                          unanswerable)
 *   {"window": Q, "at": A, "first": F, "count": N}        record positions A .. A+N-1 hold
 *                                                          tokens F .. F+N-1 of Q's context;
 *                                                          a question's windows are consecutive
 *   {"end": {"contexts": C, "questions": Q, "windows": W}}  last, the counts (a cut file
 *                                                          is refused)
 * The reader is strict: exactly these keys, whole numbers in range, nothing after "end". */
#ifndef TUNEGRAPH_SQUAD_EVAL_H
#define TUNEGRAPH_SQUAD_EVAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "datasets/qa_postprocess.h"
#include "datasets/squad_metric.h"

typedef struct tg_squad_eval_context {
    char *text;
    size_t len;
    int32_t n_tokens;
    int64_t first_offset;      /* into offsets: token i is offsets[2 * (first_offset + i)] .. [+1] */
} tg_squad_eval_context;

typedef struct tg_squad_eval_question {
    char *id;
    int32_t context;
    int32_t n_answers;
    int64_t first_answer;      /* into answers / answer_len */
    int32_t first_window, n_windows; /* its windows, consecutive in the file (0: none) */
} tg_squad_eval_question;

typedef struct tg_squad_eval_window {
    int32_t question, at, first, count;
} tg_squad_eval_window;

typedef struct tg_squad_eval {
    tg_squad_eval_context *contexts;
    int32_t n_contexts;
    tg_squad_eval_question *questions;
    int32_t n_questions;
    tg_squad_eval_window *windows;
    int32_t n_windows;
    int64_t *offsets;          /* byte pairs of every context's tokens */
    int64_t n_offsets;         /* pairs */
    char **answers;
    size_t *answer_len;
    int64_t n_answers;
} tg_squad_eval;

/* The file's name for a split: "squad_train.jsonl" or "squad_eval.jsonl". */
const char *tg_squad_eval_file_name(int split);

/* Writing, line by line (name for messages). Each returns 0 or -1 with err set. */
int tg_squad_eval_put_context(FILE *f, const char *name, const char *text, size_t len, const int64_t *start,
                              const int64_t *end, int32_t n_tokens, tg_err *err);
int tg_squad_eval_put_question(FILE *f, const char *name, const char *id, int32_t context, const char *const *answers,
                               const size_t *answer_len, int32_t n_answers, tg_err *err);
int tg_squad_eval_put_window(FILE *f, const char *name, int32_t question, int32_t at, int32_t first, int32_t count,
                             tg_err *err);
int tg_squad_eval_put_end(FILE *f, const char *name, int32_t contexts, int32_t questions, int32_t windows,
                          tg_err *err);

/* Parses buf[0..len) (a whole file; name in messages: "squad_eval.jsonl:12: ..."). */
int tg_squad_eval_parse(const char *name, const char *buf, size_t len, tg_squad_eval *ev, tg_err *err);
/* Reads and parses the file at path. */
int tg_squad_eval_load(const char *path, tg_squad_eval *ev, tg_err *err);
void tg_squad_eval_free(tg_squad_eval *ev);

/* The scores of every question from its windows' logits: window w's start and end logits
 * are start[w * stride ..] and end[w * stride ..], `positions` of them (the record length
 * the model saw; context tokens past it are not offered). Each question's answer comes from
 * tg_qa_postprocess over its windows (context tokens only are candidates), scored with
 * tg_squad_score against its gold answers and added to *totals. */
int tg_squad_eval_score(const tg_squad_eval *ev, const float *start, const float *end, int64_t stride,
                        int32_t positions, const tg_qa_postprocess_options *opt, tg_squad_totals *totals,
                        tg_err *err);

#endif
