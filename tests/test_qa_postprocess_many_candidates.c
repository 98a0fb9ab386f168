/* Post-processing (datasets/qa_postprocess.c) when every window gives n_best x n_best
 * candidates: 3 windows of 5 positions, the [CLS] one and 4 context tokens, n_best 2, so
 * 12 spans (and the null answer in SQuAD v2) are all kept and ranked; the best is the last
 * window's, whose logits are the highest. */
#include <string.h>

#include "datasets/qa_postprocess.h"
#include "tests/harness.h"

TG_TEST(test_qa_postprocess_every_window_full_of_candidates) {
    enum { N = 3, L = 5 };
    float sl[N][L], el[N][L];
    int64_t cs[N][L], ce[N][L];
    tg_qa_window_logits w[N];
    for (int i = 0; i < N; i++) {
        /* starts 1 and 2 lead, ends 3 and 4: (1,3) (1,4) (2,3) (2,4) are all spans */
        const float lift = (float)i;
        const float s[L] = {-1.0f, 5 + lift, 4 + lift, -3.0f, -3.0f}, e[L] = {-1.0f, -3.0f, -3.0f, 5 + lift, 4 + lift};
        for (int p = 0; p < L; p++) {
            sl[i][p] = s[p], el[i][p] = e[p];
            cs[i][p] = p == 0 ? -1 : 100 * i + 2 * p, ce[i][p] = p == 0 ? -1 : 100 * i + 2 * p + 2;
        }
        w[i] = (tg_qa_window_logits){sl[i], el[i], cs[i], ce[i], L};
    }
    tg_qa_answer a;
    tg_err err = {{0}};
    const tg_qa_postprocess_options v1 = {.n_best = 2, .max_answer_len = 30, .null_threshold = 0, .version_2 = 0};
    CHECK(tg_qa_postprocess(w, N, &v1, &a, &err) == 0, "%s", err.msg);
    CHECK(a.kind == TG_QA_SPAN && a.start == 202 && a.end == 208 && a.score_diff == 0.0f, "v1: kind %d [%lld, %lld) %g",
          a.kind, (long long)a.start, (long long)a.end, a.score_diff);
    /* v2: null score -2 (the lowest [CLS] sum), best span 7 + 7: the span, 16 below */
    const tg_qa_postprocess_options v2 = {.n_best = 2, .max_answer_len = 30, .null_threshold = 0, .version_2 = 1};
    CHECK(tg_qa_postprocess(w, N, &v2, &a, &err) == 0, "%s", err.msg);
    CHECK(a.kind == TG_QA_SPAN && a.start == 202 && a.end == 208 && a.score_diff == -16.0f,
          "v2: kind %d [%lld, %lld) %g", a.kind, (long long)a.start, (long long)a.end, a.score_diff);
}
