#include "datasets/qa_features.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

static int grow32(int32_t **p, int32_t *cap, int32_t need, tg_err *err) {
    if (need <= *cap) return 0;
    int32_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    int32_t *q = tg_realloc(*p, (size_t)c * sizeof *q);
    if (!q) return tg_fail(err, "out of memory for %d token ids", need);
    *p = q;
    *cap = c;
    return 0;
}

int tg_qa_encode_context(const tg_text_encoder *enc, const char *text, size_t len, tg_qa_context *c, tg_err *err) {
    const tg_encode_options opt = {.add_special_tokens = 0};
    const tg_encoding *e;
    if (enc->encode(enc->ctx, text, len, NULL, 0, &opt, &e, err)) return -1;
    c->n = 0;
    if (e->n_real > c->cap) {
        int32_t cap = e->n_real;
        int32_t *ids = tg_realloc(c->ids, (size_t)cap * sizeof *ids);
        if (ids) c->ids = ids;
        int64_t *s = tg_realloc(c->start, (size_t)cap * sizeof *s);
        if (s) c->start = s;
        int64_t *t = tg_realloc(c->end, (size_t)cap * sizeof *t);
        if (t) c->end = t;
        if (!ids || !s || !t) return tg_fail(err, "out of memory for %d context tokens", cap);
        c->cap = cap;
    }
    if (e->n_real > 0) {
        memcpy(c->ids, e->ids, (size_t)e->n_real * sizeof *c->ids);
        memcpy(c->start, e->start, (size_t)e->n_real * sizeof *c->start);
        memcpy(c->end, e->end, (size_t)e->n_real * sizeof *c->end);
    }
    c->n = e->n_real;
    return 0;
}

void tg_qa_context_free(tg_qa_context *c) {
    free(c->ids);
    free(c->start);
    free(c->end);
    memset(c, 0, sizeof *c);
}

void tg_qa_buffers_free(tg_qa_buffers *b) {
    free(b->q_ids);
    free(b->ids);
    free(b->types);
    memset(b, 0, sizeof *b);
}

int tg_qa_features(const tg_text_encoder *enc, const char *q, size_t q_len, const tg_qa_context *c, int64_t a_start,
                   int64_t a_end, int32_t seq, int32_t doc_stride, tg_qa_buffers *buf, tg_qa_sink sink,
                   void *sink_ctx, int64_t *windows, int64_t *answered, tg_err *err) {
    const int roberta = enc->family == TG_TOKENIZER_BPE_ROBERTA;
    if (enc->family != TG_TOKENIZER_WORDPIECE && !roberta)
        return tg_fail(err, "question answering needs a tokenizer with [CLS] and [SEP] templates (WordPiece, or "
                            "RoBERTa's byte-level BPE); GPT-2's adds none");
    const int32_t cls = enc->special.cls >= 0 ? enc->special.cls : enc->special.bos;
    const int32_t sep = enc->special.sep >= 0 ? enc->special.sep : enc->special.eos;
    if (cls < 0 || sep < 0) return tg_fail(err, "the tokenizer has no %s token", cls < 0 ? "[CLS] (<s>)" : "[SEP] (</s>)");
    const tg_encode_options opt = {.add_special_tokens = 0};
    const tg_encoding *e;
    if (enc->encode(enc->ctx, q, q_len, NULL, 0, &opt, &e, err)) return -1;
    const int32_t qn = e->n_real;
    if (grow32(&buf->q_ids, &buf->q_cap, qn + 1, err)) return -1;
    if (qn) memcpy(buf->q_ids, e->ids, (size_t)qn * sizeof *buf->q_ids);
    const int32_t specials = roberta ? 4 : 3;
    const int32_t window = seq - qn - specials; /* context tokens per window */
    if (window < 1)
        return tg_fail(err, "the question takes %d tokens, which with %d special tokens leaves no room for the context "
                            "in seq %d",
                       qn, specials, seq);
    if (c->n > window && doc_stride >= window)
        return tg_fail(err, "the question leaves %d context tokens per window of seq %d; doc_stride %d must be smaller "
                            "(raise --seq or lower --doc-stride)",
                       window, seq, doc_stride);
    const int32_t ctx_at = 1 + qn + (roberta ? 2 : 1);
    if (seq > buf->cap) { /* ids and types of one window */
        int32_t *i = tg_realloc(buf->ids, (size_t)seq * sizeof *i);
        if (i) buf->ids = i;
        int32_t *t = tg_realloc(buf->types, (size_t)seq * sizeof *t);
        if (t) buf->types = t;
        if (!i || !t) return tg_fail(err, "out of memory for a window of %d tokens", seq);
        buf->cap = seq;
    }
    int32_t *ids = buf->ids, *types = buf->types;
    ids[0] = cls;
    memcpy(ids + 1, buf->q_ids, (size_t)qn * sizeof *ids);
    ids[1 + qn] = sep;
    if (roberta) ids[2 + qn] = sep;
    const int32_t step = window - doc_stride;
    for (int32_t start = 0;; start += step) {
        const int32_t stop = c->n - start < window ? c->n : start + window;
        const int32_t len = ctx_at + (stop - start) + 1;
        if (stop > start) memcpy(ids + ctx_at, c->ids + start, (size_t)(stop - start) * sizeof *ids);
        ids[len - 1] = sep;
        for (int32_t t = 0; t < len; t++) types[t] = !roberta && t >= ctx_at;
        tg_shard_record rec = {.len = len, .input_ids = ids, .token_type_ids = types};
        /* As run_qa: the answer must lie within the window's context tokens. */
        if (a_start >= 0 && stop > start && c->start[start] <= a_start && c->end[stop - 1] >= a_end) {
            int32_t s = start, t = stop - 1;
            while (s < stop && c->start[s] <= a_start) s++;
            while (t >= start && c->end[t] >= a_end) t--;
            s--, t++;
            if (t < s) t = s; /* tokens sharing a character's bytes */
            rec.start = ctx_at + (s - start);
            rec.end = ctx_at + (t - start);
            ++*answered;
        }
        ++*windows;
        buf->window_at = ctx_at, buf->window_first = start, buf->window_count = stop - start;
        if (sink(sink_ctx, &rec, err)) return -1;
        if (stop >= c->n) break;
    }
    return 0;
}
