#include "datasets/qa_postprocess.h"

#include <math.h>
#include <stdlib.h>

#include "base/alloc.h"

typedef struct candidate {
    float score, start_logit, end_logit;
    int64_t start, end;        /* context bytes; the null answer: 0, 0 */
    int is_null;
    int64_t order;             /* insertion order: sorting keeps it among equal scores */
} candidate;

/* Highest score first; equal scores keep their insertion order (Python's stable sort). */
static int by_score(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* The k highest positions of v[0..n) into top (k filled or n if fewer): highest value first,
 * a later position before an earlier one of equal value. */
static int32_t top_positions(const float *v, int32_t n, int32_t k, int32_t *top) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t at = m;
        while (at > 0 && v[top[at - 1]] <= v[i]) at--;
        if (at >= k) continue;
        for (int32_t j = (m < k ? m : k - 1); j > at; j--) top[j] = top[j - 1];
        top[at] = i;
        if (m < k) m++;
    }
    return m;
}

static int check_window(const tg_qa_window_logits *w, int32_t index, tg_err *err) {
    if (w->len < 1) return tg_fail(err, "qa post-processing: window %d has no positions", index);
    for (int32_t i = 0; i < w->len; i++) {
        if (isnan(w->start_logits[i]) || isnan(w->end_logits[i]))
            return tg_fail(err, "qa post-processing: window %d, position %d: the %s logit is not a number", index, i,
                           isnan(w->start_logits[i]) ? "start" : "end");
        if (w->context_start[i] >= 0 && w->context_end[i] <= w->context_start[i])
            return tg_fail(err, "qa post-processing: window %d, position %d: context bytes [%lld, %lld) are empty",
                           index, i, (long long)w->context_start[i], (long long)w->context_end[i]);
    }
    return 0;
}

int tg_qa_postprocess(const tg_qa_window_logits *windows, int32_t n, const tg_qa_postprocess_options *opt,
                      tg_qa_answer *answer, tg_err *err) {
    *answer = (tg_qa_answer){TG_QA_FALLBACK_EMPTY, 0, 0, 0.0f};
    if (n < 1) return tg_fail(err, "qa post-processing: a question with no window");
    if (opt->n_best < 1 || opt->max_answer_len < 1)
        return tg_fail(err, "qa post-processing: n_best (%d) and max_answer_len (%d) must be at least 1", opt->n_best,
                       opt->max_answer_len);
    for (int32_t w = 0; w < n; w++)
        if (check_window(&windows[w], w, err)) return -1;
    const int64_t per_window = (int64_t)opt->n_best * opt->n_best;
    candidate *c = tg_malloc(sizeof *c * (size_t)(per_window * n + 2));
    int32_t *starts = tg_malloc(sizeof *starts * (size_t)opt->n_best);
    int32_t *ends = tg_malloc(sizeof *ends * (size_t)opt->n_best);
    if (!c || !starts || !ends) {
        free(c), free(starts), free(ends);
        return tg_fail(err, "out of memory for the answer candidates of %d windows", n);
    }
    int64_t m = 0;
    candidate null = {0};
    for (int32_t wi = 0; wi < n; wi++) {
        const tg_qa_window_logits *w = &windows[wi];
        const float null_score = w->start_logits[0] + w->end_logits[0];
        if (wi == 0 || null.score > null_score)
            null = (candidate){null_score, w->start_logits[0], w->end_logits[0], 0, 0, 1, 0};
        const int32_t ns = top_positions(w->start_logits, w->len, opt->n_best, starts);
        const int32_t ne = top_positions(w->end_logits, w->len, opt->n_best, ends);
        for (int32_t a = 0; a < ns; a++)
            for (int32_t b = 0; b < ne; b++) {
                const int32_t s = starts[a], e = ends[b];
                if (w->context_start[s] < 0 || w->context_start[e] < 0) continue;
                if (e < s || e - s + 1 > opt->max_answer_len) continue;
                c[m] = (candidate){w->start_logits[s] + w->end_logits[e], w->start_logits[s], w->end_logits[e],
                                   w->context_start[s], w->context_end[e], 0, m};
                m++;
            }
    }
    if (opt->version_2) null.order = m, c[m++] = null;
    qsort(c, (size_t)m, sizeof *c, by_score);
    if (m > opt->n_best) m = opt->n_best;
    if (opt->version_2) {
        int has_null = 0;
        for (int64_t i = 0; i < m; i++) has_null |= c[i].is_null;
        if (!has_null) c[m++] = null;
    }
    /* Only the null answer (or nothing): run_qa puts the text "empty" first, logits 0. */
    int64_t best = -1;
    for (int64_t i = 0; i < m && best < 0; i++)
        if (!c[i].is_null) best = i;
    const int fallback = m == 0 || (m == 1 && c[0].is_null);
    if (!opt->version_2) {
        if (!fallback) *answer = (tg_qa_answer){TG_QA_SPAN, c[0].start, c[0].end, 0.0f};
    } else if (fallback) {
        const float diff = null.score - 0.0f - 0.0f;
        answer->score_diff = diff;
        answer->kind = (double)diff > opt->null_threshold ? TG_QA_NULL : TG_QA_FALLBACK_EMPTY;
    } else { /* not the fallback: a span is among the candidates (spans are never empty) */
        const float diff = null.score - c[best].start_logit - c[best].end_logit;
        *answer = (tg_qa_answer){TG_QA_SPAN, c[best].start, c[best].end, diff};
        if ((double)diff > opt->null_threshold) answer->kind = TG_QA_NULL, answer->start = answer->end = 0;
    }
    free(c), free(starts), free(ends);
    return 0;
}

void tg_qa_answer_text(const tg_qa_answer *a, const char *context, const char **text, size_t *len) {
    if (a->kind == TG_QA_SPAN) {
        *text = context + a->start;
        *len = (size_t)(a->end - a->start);
    } else if (a->kind == TG_QA_NULL) {
        *text = "";
        *len = 0;
    } else {
        *text = "empty";
        *len = 5;
    }
}
