/* tg_qa_features (datasets/qa_features.c) window by window, every id and token type of each
 * record checked, and its window buffers when growing them fails: each allocation of the
 * growth failed in turn leaves the buffers as they were (still holding the smaller window,
 * nothing lost), and the next call at the old length gives the same records. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/qa_features.h"
#include "tests/byte_encoder.h"
#include "tests/harness.h"

#define MAX_WINDOWS 4
#define MAX_LEN 32

typedef struct windows_log {
    int n;
    int32_t len[MAX_WINDOWS], start[MAX_WINDOWS], end[MAX_WINDOWS];
    int32_t ids[MAX_WINDOWS][MAX_LEN], types[MAX_WINDOWS][MAX_LEN];
} windows_log;

static int log_window(void *ctx, const tg_shard_record *rec, tg_err *err) {
    windows_log *l = ctx;
    if (l->n == MAX_WINDOWS || rec->len > MAX_LEN) return tg_fail(err, "window %d of %d tokens: too many", l->n, rec->len);
    const int i = l->n++;
    l->len[i] = rec->len, l->start[i] = rec->start, l->end[i] = rec->end;
    memcpy(l->ids[i], rec->input_ids, (size_t)rec->len * sizeof *rec->input_ids);
    if (rec->token_type_ids) memcpy(l->types[i], rec->token_type_ids, (size_t)rec->len * sizeof *rec->token_type_ids);
    else memset(l->types[i], 0xFF, sizeof l->types[i]);
    return 0;
}

/* Window w of the log against "[CLS] q z [SEP] <ctx> [SEP]", types 1 from the context on
 * (RoBERTa: "<s> q z </s> </s> <ctx> </s>", types all 0). */
static int window_is_of(const windows_log *l, int w, int roberta, const char *ctx, int32_t start, int32_t end) {
    const int32_t at = roberta ? 5 : 4, n = (int32_t)strlen(ctx), len = at + n + 1;
    int ok = CHECK(l->len[w] == len && l->start[w] == start && l->end[w] == end,
                   "window %d: %d tokens, answer %d..%d; want %d, %d..%d", w, l->len[w], l->start[w], l->end[w], len,
                   start, end);
    const int32_t head[5] = {2, BYTE_ID('q'), BYTE_ID('z'), 3, 3};
    for (int32_t t = 0; ok && t < len; t++) {
        const int32_t id = t < at ? head[t] : t < len - 1 ? BYTE_ID(ctx[t - at]) : 3;
        const int32_t type = !roberta && t >= at;
        ok = CHECK(l->ids[w][t] == id && l->types[w][t] == type, "window %d token %d: id %d type %d, want %d %d", w, t,
                   l->ids[w][t], l->types[w][t], id, type);
    }
    return ok;
}

static int window_is(const windows_log *l, int w, const char *ctx, int32_t start, int32_t end) {
    return window_is_of(l, w, 0, ctx, start, end);
}

/* "qz" over "abcdefgh" (answer "ef", bytes 4..6) at seq 10, stride 2: windows of 5 context
 * tokens 3 apart, the answer in the second only (its tokens 5 and 6). */
static int features_seq10(const tg_text_encoder *enc, const tg_qa_context *c, tg_qa_buffers *buf) {
    windows_log l = {0};
    int64_t windows = 0, answered = 0;
    tg_err err = {{0}};
    if (!CHECK(tg_qa_features(enc, "qz", 2, c, 4, 6, 10, 2, buf, log_window, &l, &windows, &answered, &err) == 0, "%s",
               err.msg))
        return 0;
    return CHECK(l.n == 2 && windows == 2 && answered == 1, "%d windows (%lld counted), %lld answered", l.n,
                 (long long)windows, (long long)answered) &&
           window_is(&l, 0, "abcde", 0, 0) && window_is(&l, 1, "defgh", 5, 6);
}

TG_TEST(test_qa_features_window_growth_failures_keep_the_buffers) {
    byte_encoder be;
    const tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    tg_qa_context c = {0};
    tg_qa_buffers buf = {0};
    tg_err err = {{0}};
    REQUIRE(tg_qa_encode_context(&enc, "abcdefgh", 8, &c, &err) == 0 && c.n == 8, "%s", err.msg);
    REQUIRE(features_seq10(&enc, &c, &buf), "seq 10");
    REQUIRE(buf.cap == 10 && buf.q_cap == 256, "cap %d, q_cap %d", buf.cap, buf.q_cap);
    /* seq 20: one window of all 8 context tokens, answer tokens 8 and 9. Its ids and types
     * buffers grow; each allocation failed in turn. */
    int failures = 0;
    for (long k = 0; k < 8; k++) {
        windows_log l = {0};
        int64_t windows = 0, answered = 0;
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_qa_features(&enc, "qz", 2, &c, 4, 6, 20, 2, &buf, log_window, &l, &windows, &answered, &err);
        const long failed = tg_alloc_fail_after(-1) > k;
        if (rc == 0) {
            CHECK(!failed && buf.cap == 20 && l.n == 1 && window_is(&l, 0, "abcdefgh", 8, 9), "seq 20 after %ld", k);
            break;
        }
        failures++;
        CHECK(!strcmp(err.msg, "out of memory for a window of 20 tokens") && l.n == 0 && windows == 0,
              "allocation %ld: '%s', %d windows", k, err.msg, l.n);
        /* Kept: the seq-10 buffers, both of them. */
        if (!CHECK(buf.ids && buf.types && buf.cap == 10, "allocation %ld: ids %p types %p cap %d", k, (void *)buf.ids,
                   (void *)buf.types, buf.cap))
            break;
        CHECK(features_seq10(&enc, &c, &buf), "seq 10 after allocation %ld failed", k);
    }
    CHECK(failures == 2, "%d allocations failed before seq 20 went through, want 2 (ids, types)", failures);
    tg_qa_context_free(&c);
    tg_qa_buffers_free(&buf);
    byte_encoder_free(&be);
}

/* Where the answer lands: in both overlapping windows, in neither (it spans more than a
 * window), none, an empty one (the token it starts), the first and last tokens; BERT's and RoBERTa's
 * templates. "qz" over "abcdefgh", windows of 5 context tokens 3 apart. */
TG_TEST(test_qa_features_answers_in_windows) {
    static const struct {
        int roberta;
        int64_t a_start, a_end;
        int answered;
        int32_t s0, e0, s1, e1;
    } cases[] = {
        {0, 3, 5, 2, 7, 8, 4, 5},   /* "de": tokens 3-4 of the first window, 0-1 of the second */
        {0, 1, 7, 0, 0, 0, 0, 0},   /* "bcdefg": whole in neither */
        {0, -1, -1, 0, 0, 0, 0, 0}, /* no answer */
        {0, 4, 4, 2, 8, 8, 5, 5},   /* empty, at the start of "e": that token, in both windows */
        {0, 7, 8, 1, 0, 0, 8, 8},   /* "h", the context's last token */
        {0, 0, 1, 1, 4, 4, 0, 0},   /* "a", the first */
        {1, 3, 5, 2, 8, 9, 5, 6},
        {1, 4, 6, 1, 0, 0, 6, 7},
        {1, 1, 7, 0, 0, 0, 0, 0},
    };
    byte_encoder be;
    tg_qa_context c = {0};
    tg_qa_buffers buf = {0};
    tg_err err = {{0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const int roberta = cases[i].roberta;
        const tg_text_encoder enc = byte_encoder_make(&be, roberta ? TG_TOKENIZER_BPE_ROBERTA : TG_TOKENIZER_WORDPIECE);
        REQUIRE(tg_qa_encode_context(&enc, "abcdefgh", 8, &c, &err) == 0 && c.n == 8, "%s", err.msg);
        windows_log l = {0};
        int64_t windows = 0, answered = 0;
        const int32_t seq = roberta ? 11 : 10;
        if (CHECK(tg_qa_features(&enc, "qz", 2, &c, cases[i].a_start, cases[i].a_end, seq, 2, &buf, log_window, &l,
                                 &windows, &answered, &err) == 0,
                  "case %zu: %s", i, err.msg)) {
            CHECK(l.n == 2 && windows == 2 && answered == cases[i].answered, "case %zu: %d windows, %lld answered", i,
                  l.n, (long long)answered);
            CHECK(window_is_of(&l, 0, roberta, "abcde", cases[i].s0, cases[i].e0), "case %zu: first window", i);
            CHECK(window_is_of(&l, 1, roberta, "defgh", cases[i].s1, cases[i].e1), "case %zu: second window", i);
        }
        tg_qa_buffers_free(&buf);
        byte_encoder_free(&be);
    }
    tg_qa_context_free(&c);
}

/* Each refusal of tg_qa_features word for word, at the edges of what it takes: a question
 * leaving exactly one context token per window is taken, one more token is refused; a
 * stride as long as the window is refused only when the context needs a second window.
 * The window and answer counters add to what they held. */
TG_TEST(test_qa_features_refusal_messages_and_edges) {
    byte_encoder be;
    tg_text_encoder gpt2 = byte_encoder_make(&be, TG_TOKENIZER_BPE_GPT2);
    tg_qa_context c = {0};
    tg_qa_buffers buf = {0};
    windows_log l = {0};
    int64_t windows = 10, answered = 5;
    tg_err err = {{0}};
    REQUIRE(tg_qa_encode_context(&gpt2, "abcd", 4, &c, &err) == 0 && c.n == 4, "%s", err.msg);
    CHECK(tg_qa_features(&gpt2, "q", 1, &c, -1, -1, 16, 2, &buf, log_window, &l, &windows, &answered, &err) == -1 &&
              !strcmp(err.msg, "question answering needs a tokenizer with [CLS] and [SEP] templates (WordPiece, or "
                               "RoBERTa's byte-level BPE); GPT-2's adds none") &&
              l.n == 0 && windows == 10,
          "gpt2: '%s'", err.msg);
    byte_encoder_free(&be);

    static const struct {
        tg_tokenizer_family family;
        const char *q;
        int32_t seq, stride;
        const char *want; /* NULL: taken */
        int n_windows, n_answered;
    } cases[] = {
        {TG_TOKENIZER_WORDPIECE, "abcde", 8, 0,
         "the question takes 5 tokens, which with 3 special tokens leaves no room for the context in seq 8", 0, 0},
        {TG_TOKENIZER_WORDPIECE, "abcd", 8, 0, NULL, 4, 1},  /* one context token per window */
        {TG_TOKENIZER_BPE_ROBERTA, "abcd", 8, 0,
         "the question takes 4 tokens, which with 4 special tokens leaves no room for the context in seq 8", 0, 0},
        {TG_TOKENIZER_BPE_ROBERTA, "abc", 8, 0, NULL, 4, 1},
        /* "q" at seq 8: 4 context tokens a window, the whole context fits: any stride */
        {TG_TOKENIZER_WORDPIECE, "q", 8, 4, NULL, 1, 1},
        {TG_TOKENIZER_WORDPIECE, "q", 8, 9, NULL, 1, 1},
        /* "" at seq 7: 4 context tokens a window too; stride 3 steps one token */
        {TG_TOKENIZER_WORDPIECE, "", 7, 3, NULL, 1, 1},
        {TG_TOKENIZER_WORDPIECE, "", 6, 3,
         "the question leaves 3 context tokens per window of seq 6; doc_stride 3 must be smaller (raise --seq or lower "
         "--doc-stride)", 0, 0},
        {TG_TOKENIZER_WORDPIECE, "", 6, 2, NULL, 2, 2}, /* windows wxy and xyz both hold x */
        {TG_TOKENIZER_BPE_ROBERTA, "q", 8, 3,
         "the question leaves 3 context tokens per window of seq 8; doc_stride 3 must be smaller (raise --seq or lower "
         "--doc-stride)", 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        tg_text_encoder enc = byte_encoder_make(&be, cases[k].family);
        REQUIRE(tg_qa_encode_context(&enc, "wxyz", 4, &c, &err) == 0 && c.n == 4, "%s", err.msg);
        memset(&l, 0, sizeof l);
        memset(&err, 0, sizeof err);
        windows = 10, answered = 5;
        /* the answer "x" (byte 1) */
        const int rc = tg_qa_features(&enc, cases[k].q, strlen(cases[k].q), &c, 1, 2, cases[k].seq, cases[k].stride,
                                      &buf, log_window, &l, &windows, &answered, &err);
        if (cases[k].want) {
            CHECK(rc == -1 && !strcmp(err.msg, cases[k].want) && l.n == 0 && windows == 10 && answered == 5,
                  "case %zu: rc %d '%s', want '%s'", k, rc, err.msg, cases[k].want);
        } else {
            /* one window holds the answer: its token sits after the question and specials */
            const int32_t at = 1 + (int32_t)strlen(cases[k].q) + (cases[k].family == TG_TOKENIZER_BPE_ROBERTA ? 2 : 1);
            int with = -1;
            for (int w = 0; w < l.n; w++)
                if (l.start[w] || l.end[w]) with = w;
            CHECK(rc == 0 && l.n == cases[k].n_windows && windows == 10 + cases[k].n_windows && answered == 5 + cases[k].n_answered &&
                      with >= 0 && l.start[with] == l.end[with] && l.ids[with][l.start[with]] == BYTE_ID('x') &&
                      l.start[with] >= at,
                  "case %zu: rc %d '%s', %d windows (want %d), answered %lld", k, rc, err.msg, l.n, cases[k].n_windows,
                  (long long)answered);
        }
        byte_encoder_free(&be);
    }
    tg_qa_context_free(&c);
    tg_qa_buffers_free(&buf);
    CHECK(!c.ids && !c.start && !c.end && c.n == 0 && c.cap == 0 && !buf.ids && !buf.types && !buf.q_ids && buf.cap == 0,
          "freed");
}

/* A context that needs more room than the last one: each of its allocations failed in turn
 * fails the encoding with the message and keeps the buffers the context had (none lost,
 * none left NULL), which still encode a context of the old size. */
TG_TEST(test_qa_encode_context_growth_failures_keep_the_buffers) {
    byte_encoder be;
    const tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    tg_qa_context c = {0};
    tg_err err = {{0}};
    REQUIRE(tg_qa_encode_context(&enc, "abcdefgh", 8, &c, &err) == 0 && c.n == 8 && c.cap == 8, "%s", err.msg);
    int failures = 0;
    for (long k = 0; k < 16; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_qa_encode_context(&enc, "abcdefghijkl", 12, &c, &err);
        const long failed = tg_alloc_fail_after(-1) > k;
        if (rc == 0) {
            CHECK(!failed && c.n == 12 && c.cap == 12, "12 tokens after %ld", k);
            break;
        }
        if (strstr(err.msg, "context tokens")) {
            failures++;
            CHECK(!strcmp(err.msg, "out of memory for 12 context tokens"), "allocation %ld: '%s'", k, err.msg);
        }
        if (!CHECK(c.ids && c.start && c.end && c.cap == 8, "allocation %ld: ids %p start %p end %p cap %d", k,
                   (void *)c.ids, (void *)c.start, (void *)c.end, c.cap))
            break;
        CHECK(tg_qa_encode_context(&enc, "abcdefgh", 8, &c, &err) == 0 && c.n == 8, "8 tokens after allocation %ld", k);
    }
    CHECK(failures == 3, "%d of the context's allocations failed, want 3 (ids, start, end)", failures);
    tg_qa_context_free(&c);
    byte_encoder_free(&be);
}
