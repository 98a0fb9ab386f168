/* libFuzzer target: the SQuAD eval file (datasets/squad_eval.c). What it accepts must hold
 * together: every reference in range, every token's bytes inside its context, the counts
 * of the end line; then scoring the accepted set on fixed logits (8 positions per window)
 * must succeed or fail with a message, never read outside the arrays. */
#include <string.h>

#include "datasets/squad_eval.h"
#include "tests/fuzz/fuzz_input.h"

#define POSITIONS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tg_squad_eval ev;
    tg_err err;
    if (tg_squad_eval_parse("fuzz.jsonl", (const char *)data, size, &ev, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return 0;
    }
    for (int32_t c = 0; c < ev.n_contexts; c++) {
        const tg_squad_eval_context *x = &ev.contexts[c];
        FUZZ_ASSERT(x->first_offset >= 0 && x->first_offset + x->n_tokens <= ev.n_offsets, "context %d offsets", c);
        for (int32_t i = 0; i < x->n_tokens; i++) {
            const int64_t *o = ev.offsets + 2 * (x->first_offset + i);
            FUZZ_ASSERT(o[0] >= 0 && o[0] <= o[1] && (size_t)o[1] <= x->len, "token %d of context %d", i, c);
        }
    }
    for (int32_t q = 0; q < ev.n_questions; q++) {
        const tg_squad_eval_question *x = &ev.questions[q];
        FUZZ_ASSERT(x->context >= 0 && x->context < ev.n_contexts, "question %d context", q);
        FUZZ_ASSERT(x->first_answer >= 0 && x->first_answer + x->n_answers <= ev.n_answers, "question %d answers", q);
    }
    for (int32_t w = 0; w < ev.n_windows; w++) {
        const tg_squad_eval_window *x = &ev.windows[w];
        FUZZ_ASSERT(x->question >= 0 && x->question < ev.n_questions, "window %d question", w);
        const tg_squad_eval_context *c = &ev.contexts[ev.questions[x->question].context];
        FUZZ_ASSERT(x->first >= 0 && x->count >= 0 && x->first + x->count <= c->n_tokens && x->at >= 0, "window %d", w);
    }
    if (ev.n_windows > 0 && ev.n_windows <= 4096) {
        float *logits = malloc(sizeof(float) * (size_t)ev.n_windows * POSITIONS * 2);
        FUZZ_ASSERT(logits, "out of memory");
        for (int64_t i = 0; i < (int64_t)ev.n_windows * POSITIONS * 2; i++) logits[i] = (float)((i * 7919) % 23) - 11;
        tg_qa_postprocess_options opt = {.n_best = 20, .max_answer_len = 30, .version_2 = 1};
        tg_squad_totals tot;
        if (tg_squad_eval_score(&ev, logits, logits + (int64_t)ev.n_windows * POSITIONS, POSITIONS, POSITIONS, &opt,
                                &tot, &err) != 0)
            FUZZ_ASSERT(err.msg[0], "scoring failed without a message");
        else
            FUZZ_ASSERT(tot.total <= ev.n_questions && tot.has_total + tot.no_total == tot.total, "totals");
        free(logits);
    }
    tg_squad_eval_free(&ev);
    return 0;
}
