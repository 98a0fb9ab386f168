/* libFuzzer target: SQuAD JSON (datasets/squad.c), then each question's training features
 * (datasets/qa_features.c) with a byte-level stand-in tokenizer, seq 48 and doc_stride 8.
 * Answers must be byte ranges of their context holding the answer text; every window
 * must fit seq, with its answer positions inside the window's context or both 0. */
#include <string.h>

#include "datasets/qa_features.h"
#include "datasets/squad.h"
#include "tests/byte_encoder.h"
#include "tests/fuzz/fuzz_input.h"

#define SEQ 48

typedef struct check_ctx {
    int64_t windows;
} check_ctx;

static int check_window(void *ctx, const tg_shard_record *r, tg_err *err) {
    (void)err;
    ((check_ctx *)ctx)->windows++;
    FUZZ_ASSERT(r->len >= 3 && r->len <= SEQ, "window of %d tokens", r->len);
    FUZZ_ASSERT(r->input_ids[0] == 2 && r->input_ids[r->len - 1] == 3, "template ends");
    FUZZ_ASSERT((r->start == 0 && r->end == 0) || (r->start > 0 && r->start <= r->end && r->end < r->len - 1),
                "answer %d..%d in %d tokens", r->start, r->end, r->len);
    for (int32_t t = 0; t < r->len; t++) FUZZ_ASSERT(r->input_ids[t] >= 0 && r->input_ids[t] < BYTE_VOCAB, "id");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tg_squad sq;
    tg_err err;
    if (tg_squad_parse("fuzz.json", (const char *)data, size, &sq, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return 0;
    }
    FUZZ_ASSERT(sq.n_questions > 0, "no questions accepted");
    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    tg_qa_context ctx = {0};
    tg_qa_buffers buf = {0};
    int32_t encoded = -1;
    int64_t budget = 4000; /* windows per input, so a huge context stays quick */
    for (int64_t k = 0; k < sq.n_questions && budget > 0; k++) {
        const tg_squad_question *q = &sq.questions[k];
        FUZZ_ASSERT(q->paragraph >= 0 && q->paragraph < sq.n_paragraphs, "paragraph %d", q->paragraph);
        const tg_squad_paragraph *p = &sq.paragraphs[q->paragraph];
        FUZZ_ASSERT(p->article >= 0 && p->article < sq.n_articles, "article %d", p->article);
        FUZZ_ASSERT(q->first_answer >= 0 && q->first_answer + q->n_answers <= sq.n_answers, "answers");
        for (int32_t a = 0; a < q->n_answers; a++) {
            const tg_squad_answer *an = &sq.answers[q->first_answer + a];
            FUZZ_ASSERT(an->start >= 0 && an->start < an->end && (size_t)an->end <= p->len, "answer %lld..%lld of %zu",
                        (long long)an->start, (long long)an->end, p->len);
        }
        if (q->paragraph != encoded) {
            FUZZ_ASSERT(tg_qa_encode_context(&enc, p->context, p->len, &ctx, &err) == 0, "%s", err.msg);
            encoded = q->paragraph;
        }
        check_ctx cc = {0};
        int64_t windows = 0, answered = 0;
        int64_t s = q->n_answers ? sq.answers[q->first_answer].start : -1;
        int64_t e = q->n_answers ? sq.answers[q->first_answer].end : -1;
        if (tg_qa_features(&enc, q->text, q->len, &ctx, s, e, SEQ, 8, &buf, check_window, &cc, &windows, &answered,
                           &err) != 0)
            FUZZ_ASSERT(err.msg[0], "failed without a message");
        FUZZ_ASSERT(cc.windows == windows && answered <= windows, "windows %lld/%lld", (long long)cc.windows,
                    (long long)windows);
        budget -= windows + 1;
    }
    tg_qa_context_free(&ctx);
    tg_qa_buffers_free(&buf);
    byte_encoder_free(&be);
    tg_squad_free(&sq);
    return 0;
}
