/* Post-processing (datasets/qa_postprocess.c) of windows of one position, the [CLS] one:
 * each logit array holds exactly one float (on the heap, so that AddressSanitizer sees a
 * read past it). No span can come of them: SQuAD v1 leaves the fallback answer, v2 takes
 * the null answer when its score (start + end logit, the lowest over the windows) is above
 * the threshold, else the fallback with that score. */
#include <stdlib.h>
#include <string.h>

#include "datasets/qa_postprocess.h"
#include "tests/harness.h"

TG_TEST(test_qa_postprocess_windows_of_one_position) {
    enum { N = 3 };
    static const float start_v[N] = {2.0f, 0.5f, 4.0f}, end_v[N] = {1.0f, 0.25f, -1.0f};
    float *sl[N], *el[N];
    int64_t *cs[N], *ce[N];
    tg_qa_window_logits w[N];
    for (int i = 0; i < N; i++) {
        sl[i] = malloc(sizeof *sl[i]), el[i] = malloc(sizeof *el[i]);
        cs[i] = malloc(sizeof *cs[i]), ce[i] = malloc(sizeof *ce[i]);
        REQUIRE(sl[i] && el[i] && cs[i] && ce[i], "malloc");
        *sl[i] = start_v[i], *el[i] = end_v[i], *cs[i] = -1, *ce[i] = -1;
        w[i] = (tg_qa_window_logits){sl[i], el[i], cs[i], ce[i], 1};
    }
    static const struct {
        int n;
        double threshold;
        int version_2;
        tg_qa_answer want;
    } cases[] = {
        {1, 0.0, 0, {TG_QA_FALLBACK_EMPTY, 0, 0, 0.0f}},
        {1, 0.0, 1, {TG_QA_NULL, 0, 0, 3.0f}},
        {1, 3.0, 1, {TG_QA_FALLBACK_EMPTY, 0, 0, 3.0f}},
        {1, 2.99, 1, {TG_QA_NULL, 0, 0, 3.0f}},
        /* the lowest null score of the windows: 0.75 (window 1), not 3 or 3 */
        {3, 0.0, 1, {TG_QA_NULL, 0, 0, 0.75f}},
        {3, 1.0, 1, {TG_QA_FALLBACK_EMPTY, 0, 0, 0.75f}},
        {3, 0.0, 0, {TG_QA_FALLBACK_EMPTY, 0, 0, 0.0f}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const tg_qa_postprocess_options opt = {20, 30, cases[c].threshold, cases[c].version_2};
        tg_qa_answer a;
        memset(&a, 0x5A, sizeof a);
        tg_err err = {{0}};
        CHECK(tg_qa_postprocess(w, cases[c].n, &opt, &a, &err) == 0, "case %zu: %s", c, err.msg);
        CHECK(a.kind == cases[c].want.kind && a.start == 0 && a.end == 0 && a.score_diff == cases[c].want.score_diff,
              "case %zu: kind %d [%lld, %lld) diff %g, want kind %d diff %g", c, (int)a.kind, (long long)a.start,
              (long long)a.end, a.score_diff, (int)cases[c].want.kind, cases[c].want.score_diff);
        const char *text = NULL;
        size_t len = 99;
        tg_qa_answer_text(&a, "context", &text, &len);
        CHECK(a.kind == TG_QA_NULL ? len == 0 && !strcmp(text, "") : len == 5 && !strncmp(text, "empty", 5),
              "case %zu: text '%.*s'", c, (int)len, text);
    }
    for (int i = 0; i < N; i++) free(sl[i]), free(el[i]), free(cs[i]), free(ce[i]);
}
