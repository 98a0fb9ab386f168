/* The official SQuAD v2.0 evaluation (evaluate-v2.0.py, which Hugging Face's squad_v2
 * metric runs): answers are normalized — Python's str.lower(), ASCII punctuation removed,
 * the words "a", "an" and "the" removed, whitespace runs made one space — then a prediction
 * scores exact match (normalized strings equal) and F1 over whitespace tokens (as bags)
 * against each gold answer, keeping the best. A question whose gold answers all normalize
 * to nothing is scored against the empty answer, as an unanswerable one is. Scores are
 * summed over questions, in total and split by whether the question has an answer. */
#ifndef TUNEGRAPH_SQUAD_METRIC_H
#define TUNEGRAPH_SQUAD_METRIC_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

/* text[0..len) normalized into a new string (*out, *out_len, NUL-terminated; free() it).
 * Invalid UTF-8 bytes pass through unchanged and count as neither letters nor spaces. */
int tg_squad_normalize(const char *text, size_t len, char **out, size_t *out_len, tg_err *err);

/* Exact match (0 or 1) and F1 (0..1) of the prediction against n_gold answers, the best of
 * each over the answers (n_gold 0, or all answers normalizing to nothing: the empty answer). */
int tg_squad_score(const char *pred, size_t pred_len, const char *const *gold, const size_t *gold_len, int n_gold,
                   double *exact, double *f1, tg_err *err);

typedef struct tg_squad_totals {
    double exact, f1;           /* sums over questions */
    int64_t total;
    double has_exact, has_f1;   /* over questions with a gold answer */
    int64_t has_total;
    double no_exact, no_f1;     /* over unanswerable ones */
    int64_t no_total;
} tg_squad_totals;

/* Adds one question's scores. has_answer: the question lists at least one answer (as the
 * script's qid_to_has_ans: even one that normalizes to nothing). */
void tg_squad_totals_add(tg_squad_totals *t, int has_answer, double exact, double f1);

/* The script's percentages: 100 * sum / count, 0 when there is no question of that kind. */
double tg_squad_percent(double sum, int64_t count);

#endif
