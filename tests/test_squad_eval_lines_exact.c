/* The SQuAD eval file (datasets/squad_eval.c) byte for byte: the exact lines each writer
 * puts (compact JSON, keys in order) and its refusals (write error, out of memory); the
 * reader's exact messages and return value for every refusal, the window order rule, a
 * last line without a newline, every field it fills; and scoring's refusals and its
 * treatment of empty tokens and positions past the record. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/shard_format.h"
#include "datasets/squad_eval.h"
#include "tests/harness.h"

/* What writer `which` puts into a memory stream (*rc its return value, *len the bytes). */
static char *written(int which, int *rc_out, size_t *len_out, tg_err *err) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    const int64_t s[] = {0, 4}, e[] = {3, 7};
    const char *answers[] = {"cat", "do\"g\nx"};
    const size_t lens[] = {3, 4};
    int rc = 0;
    switch (which) {
    case 0: rc = tg_squad_eval_put_context(f, "s", "cat dogXX", 7, s, e, 2, err); break;
    case 1: rc = tg_squad_eval_put_question(f, "s", "q1", 3, answers, lens, 2, err); break;
    case 2: rc = tg_squad_eval_put_question(f, "s", "q2", 0, NULL, NULL, 0, err); break;
    case 3: rc = tg_squad_eval_put_window(f, "s", 2, 4, 1, 3, err); break;
    default: rc = tg_squad_eval_put_end(f, "s", 1, 2, 3, err); break;
    }
    fclose(f);
    *rc_out = rc;
    *len_out = len;
    return buf;
}

TG_TEST(test_squad_eval_writers_exact_lines) {
    static const char *const want[] = {
        "{\"context\":\"cat dog\",\"offsets\":[0,3,4,7]}\n",
        "{\"question\":\"q1\",\"context\":3,\"answers\":[\"cat\",\"do\\\"g\"]}\n",
        "{\"question\":\"q2\",\"context\":0,\"answers\":[]}\n",
        "{\"window\":2,\"at\":4,\"first\":1,\"count\":3}\n",
        "{\"end\":{\"contexts\":1,\"questions\":2,\"windows\":3}}\n",
    };
    for (int i = 0; i < 5; i++) {
        tg_err err = {{0}};
        int rc;
        size_t len;
        char *got = written(i, &rc, &len, &err);
        REQUIRE(got && rc == 0, "writer %d: %s", i, err.msg);
        CHECK(!strcmp(got, want[i]), "writer %d wrote '%s', want '%s'", i, got, want[i]);
        free(got);
    }
    CHECK(!strcmp(tg_squad_eval_file_name(TG_SPLIT_EVAL), "squad_eval.jsonl") &&
              !strcmp(tg_squad_eval_file_name(TG_SPLIT_TRAIN), "squad_train.jsonl"),
          "file names");
}

TG_TEST(test_squad_eval_writers_refusals) {
    /* A stream open for reading takes no bytes. */
    FILE *f = fopen("/dev/null", "r");
    REQUIRE(f, "/dev/null");
    const int64_t s[] = {0}, e[] = {1};
    tg_err err = {{0}};
    CHECK(tg_squad_eval_put_context(f, "out.jsonl", "a", 1, s, e, 1, &err) == -1 &&
              !strcmp(err.msg, "out.jsonl: write error"),
          "'%s'", err.msg);
    err.msg[0] = 0;
    CHECK(tg_squad_eval_put_end(f, "out.jsonl", 0, 0, 0, &err) == -1 && !strcmp(err.msg, "out.jsonl: write error"),
          "'%s'", err.msg);
    fclose(f);
    /* Each allocation of each writer failed in turn: the same message, nothing written. */
    for (int which = 0; which < 5; which++) {
        int rc;
        size_t len;
        tg_alloc_fail_after(-1);
        char *ok = written(which, &rc, &len, &err);
        const long total = tg_alloc_fail_after(-1);
        REQUIRE(ok && rc == 0 && total > 0, "writer %d: %s", which, err.msg);
        free(ok);
        for (long k = 0; k < total; k++) {
            err.msg[0] = 0;
            tg_alloc_fail_after(k);
            char *buf = written(which, &rc, &len, &err);
            tg_alloc_fail_after(-1);
            CHECK(rc == -1 && !strcmp(err.msg, "s: out of memory for a line") && len == 0,
                  "writer %d, allocation %ld failed: rc %d '%s', %zu bytes written", which, k, rc, err.msg, len);
            free(buf);
        }
    }
}

/* ---- reading ------------------------------------------------------------------------ */

static const char CTX[] = "{\"context\": \"ab\", \"offsets\": [0, 1, 1, 2]}\n";
static const char Q0[] = "{\"question\": \"x\", \"context\": 0, \"answers\": [\"a\"]}\n";
static const char Q1[] = "{\"question\": \"y\", \"context\": 0, \"answers\": []}\n";

static void expect_exact_refusal(const char *text, const char *want) {
    tg_squad_eval ev;
    tg_err err = {{0}};
    const int rc = tg_squad_eval_parse("e.jsonl", text, strlen(text), &ev, &err);
    CHECK(rc == -1 && !strcmp(err.msg, want), "'%s': rc %d, '%s', want '%s'", text, rc, err.msg, want);
    CHECK(ev.contexts == NULL && ev.questions == NULL && ev.windows == NULL && ev.n_contexts == 0 &&
              ev.n_questions == 0 && ev.n_answers == 0,
          "'%s': the refused file's tables are left", text);
    if (rc == 0) tg_squad_eval_free(&ev);
}

TG_TEST(test_squad_eval_parse_exact_refusals) {
    char t[2048];
    /* A token that ends before it starts, in the second context: the start is that token's. */
    snprintf(t, sizeof t, "%s{\"context\": \"abc\", \"offsets\": [0, 2, 2, 1]}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: token 1 ends (byte 1) before it starts (byte 2)");
    snprintf(t, sizeof t, "%s{\"context\": \"abc\", \"offsets\": [0, 2, 3, 0]}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: token 1 ends (byte 0) before it starts (byte 3)");
    expect_exact_refusal("{\"context\": \"ab\", \"offsets\": [0, \"1\"]}\n",
                         "e.jsonl:1: offsets[1] is not a byte offset in the context (0 to 2)");
    expect_exact_refusal("{\"context\": \"ab\", \"offsets\": [-1, 1]}\n",
                         "e.jsonl:1: offsets[0] is not a byte offset in the context (0 to 2)");
    expect_exact_refusal("{\"context\": \"ab\", \"offsets\": 3}\n",
                         "e.jsonl:1: \"offsets\" must be an array of byte pairs");
    expect_exact_refusal("{\"context\": \"ab\"}\n", "e.jsonl:1: no \"offsets\"");
    expect_exact_refusal("{\"context\": [], \"offsets\": []}\n", "e.jsonl:1: \"context\" must be a string");
    /* Questions. */
    snprintf(t, sizeof t, "%s{\"question\": 7, \"context\": 0, \"answers\": []}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: \"question\" (the id) must be a string");
    snprintf(t, sizeof t, "%s{\"question\": \"x\", \"context\": 0}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: no \"answers\"");
    snprintf(t, sizeof t, "%s{\"question\": \"x\", \"context\": 0, \"answers\": [], \"y\": 0}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: unknown key \"y\"");
    snprintf(t, sizeof t, "%s{\"question\": \"x\", \"context\": \"0\", \"answers\": []}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: \"context\" must be a whole number");
    snprintf(t, sizeof t, "%s{\"question\": \"x\", \"context\": -1, \"answers\": []}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: \"context\" = -1 is outside [0, 0]");
    snprintf(t, sizeof t, "%s{\"question\": \"x\", \"context\": 0, \"answers\": [\"a\", null]}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: answers[1] must be a string");
    /* Windows: an unknown or missing key, a bad number, a question out of range. */
    snprintf(t, sizeof t, "%s%s{\"window\": 0, \"at\": 1, \"first\": 0, \"count\": 1, \"x\": 1}\n", CTX, Q0);
    expect_exact_refusal(t, "e.jsonl:3: unknown key \"x\"");
    snprintf(t, sizeof t, "%s%s{\"window\": 0, \"at\": 1, \"first\": 0}\n", CTX, Q0);
    expect_exact_refusal(t, "e.jsonl:3: no \"count\"");
    snprintf(t, sizeof t, "%s%s{\"window\": 1, \"at\": 1, \"first\": 0, \"count\": 1}\n", CTX, Q0);
    expect_exact_refusal(t, "e.jsonl:3: \"window\" = 1 is outside [0, 0]");
    snprintf(t, sizeof t, "%s%s{\"window\": 0, \"at\": %d, \"first\": 0, \"count\": 1}\n", CTX, Q0,
             TG_SHARD_SEQ_MAX + 1);
    char want[256];
    snprintf(want, sizeof want, "e.jsonl:3: \"at\" = %d is outside [0, %d]", TG_SHARD_SEQ_MAX + 1, TG_SHARD_SEQ_MAX);
    expect_exact_refusal(t, want);
    snprintf(t, sizeof t, "%s%s{\"window\": 0, \"at\": 0, \"first\": 3, \"count\": 0}\n", CTX, Q0);
    expect_exact_refusal(t, "e.jsonl:3: \"first\" = 3 is outside [0, 2]");
    snprintf(t, sizeof t, "%s{\"window\": 0, \"at\": 0, \"first\": 0, \"count\": 0}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: a window before any question");
    /* A question's windows after another's, whichever is numbered higher. */
    snprintf(t, sizeof t,
             "%s%s%s{\"window\": 1, \"at\": 1, \"first\": 0, \"count\": 1}\n"
             "{\"window\": 0, \"at\": 1, \"first\": 0, \"count\": 1}\n"
             "{\"window\": 1, \"at\": 1, \"first\": 1, \"count\": 1}\n",
             CTX, Q0, Q1);
    expect_exact_refusal(t, "e.jsonl:6: a window of question 1 after another question's (a question's windows must "
                            "be consecutive)");
    /* The end line. */
    expect_exact_refusal("{\"end\": {\"contexts\": -1, \"questions\": 0, \"windows\": 0}}\n",
                         "e.jsonl:1: \"contexts\" = -1 is outside [0, 1073741823]");
    expect_exact_refusal("{\"end\": {\"contexts\": 0, \"questions\": 1073741824, \"windows\": 0}}\n",
                         "e.jsonl:1: \"questions\" = 1073741824 is outside [0, 1073741823]");
    expect_exact_refusal("{\"end\": {\"contexts\": 0, \"questions\": 0, \"windows\": 0.0}}\n",
                         "e.jsonl:1: \"windows\" must be a whole number");
    expect_exact_refusal("{\"end\": {\"contexts\": 0, \"questions\": 0}}\n", "e.jsonl:1: no \"windows\"");
    expect_exact_refusal("{\"end\": {\"contexts\": 0, \"questions\": 0, \"windows\": 0, \"w\": 0}}\n",
                         "e.jsonl:1: unknown key \"w\"");
    expect_exact_refusal("{\"end\": {\"contexts\": 0, \"questions\": 0, \"windows\": 0}, \"x\": 1}\n",
                         "e.jsonl:1: \"end\" must be the line's only key, an object of counts");
    expect_exact_refusal("{\"end\": {\"contexts\": 1, \"questions\": 0, \"windows\": 0}}\n",
                         "e.jsonl:1: the end line counts 1 contexts, the file has 0");
    snprintf(t, sizeof t, "%s{\"end\": {\"contexts\": 1, \"questions\": 1, \"windows\": 0}}\n", CTX);
    expect_exact_refusal(t, "e.jsonl:2: the end line counts 1 questions, the file has 0");
    snprintf(t, sizeof t, "%s{\"end\": {\"contexts\": 1, \"questions\": 0, \"windows\": 0}}\n\n", CTX);
    expect_exact_refusal(t, "e.jsonl:3: a line after the end line");
    /* Lines that are no entry. */
    expect_exact_refusal("", "e.jsonl: no end line (the file is cut short)");
    expect_exact_refusal(CTX, "e.jsonl: no end line (the file is cut short)");
    expect_exact_refusal("[]\n", "e.jsonl:1: each line must be an object");
    expect_exact_refusal("{\"at\": 1}\n", "e.jsonl:1: a line that is no context, question, window or end");
    expect_exact_refusal("{\"end\": 1, \"end\": 2}\n", "e.jsonl:1: key \"end\" appears twice");
}

TG_TEST(test_squad_eval_parse_fills_every_field) {
    /* Two contexts, three questions (one answer of two characters, three bytes), windows; the
     * last line has no newline and is longer than every line before it put together. */
    static const char doc[] =
        "{\"context\":\"ab\",\"offsets\":[0,1,1,2]}\n"
        "{\"context\":\"x\\u00e9z\",\"offsets\":[0,1,1,3,3,4]}\n"
        "{\"question\":\"q0\",\"context\":1,\"answers\":[\"x\\u00e9\",\"z\"]}\n"
        "{\"window\":0,\"at\":2,\"first\":1,\"count\":2}\n"
        "{\"window\":0,\"at\":3,\"first\":0,\"count\":3}\n"
        "{\"question\":\"q1\",\"context\":0,\"answers\":[]}\n"
        "{\"question\":\"q2\",\"context\":0,\"answers\":[\"b\"]}\n"
        "{\"window\":2,\"at\":0,\"first\":0,\"count\":0}\n"
        "{\"end\":                                                                                                      "
        "                                                                                                               "
        "                                                                                                               "
        "                                                                                                               "
        "{\"contexts\": 2, \"questions\": 3, \"windows\": 3}}";
    tg_squad_eval ev;
    tg_err err = {{0}};
    REQUIRE(tg_squad_eval_parse("e.jsonl", doc, strlen(doc), &ev, &err) == 0, "%s", err.msg);
    CHECK(ev.n_contexts == 2 && ev.n_questions == 3 && ev.n_windows == 3 && ev.n_offsets == 5 && ev.n_answers == 3,
          "counts %d %d %d %lld %lld", ev.n_contexts, ev.n_questions, ev.n_windows, (long long)ev.n_offsets,
          (long long)ev.n_answers);
    CHECK(ev.contexts[0].len == 2 && !strcmp(ev.contexts[0].text, "ab") && ev.contexts[0].n_tokens == 2 &&
              ev.contexts[0].first_offset == 0,
          "context 0");
    CHECK(ev.contexts[1].len == 4 && !strcmp(ev.contexts[1].text, "x\xc3\xa9z") && ev.contexts[1].n_tokens == 3 &&
              ev.contexts[1].first_offset == 2,
          "context 1");
    const int64_t offsets[] = {0, 1, 1, 2, 0, 1, 1, 3, 3, 4};
    for (int i = 0; i < 10; i++) CHECK(ev.offsets[i] == offsets[i], "offsets[%d] = %lld", i, (long long)ev.offsets[i]);
    CHECK(!strcmp(ev.questions[0].id, "q0") && ev.questions[0].context == 1 && ev.questions[0].n_answers == 2 &&
              ev.questions[0].first_answer == 0 && ev.questions[0].first_window == 0 && ev.questions[0].n_windows == 2,
          "question 0");
    CHECK(!strcmp(ev.questions[1].id, "q1") && ev.questions[1].context == 0 && ev.questions[1].n_answers == 0 &&
              ev.questions[1].first_answer == 2 && ev.questions[1].n_windows == 0,
          "question 1");
    CHECK(!strcmp(ev.questions[2].id, "q2") && ev.questions[2].n_answers == 1 && ev.questions[2].first_answer == 2 &&
              ev.questions[2].first_window == 2 && ev.questions[2].n_windows == 1,
          "question 2");
    CHECK(ev.answer_len[0] == 3 && !strcmp(ev.answers[0], "x\xc3\xa9") && ev.answer_len[1] == 1 &&
              !strcmp(ev.answers[1], "z") && ev.answer_len[2] == 1 && !strcmp(ev.answers[2], "b"),
          "answers");
    const tg_squad_eval_window w[] = {{0, 2, 1, 2}, {0, 3, 0, 3}, {2, 0, 0, 0}};
    for (int i = 0; i < 3; i++)
        CHECK(!memcmp(&ev.windows[i], &w[i], sizeof w[i]), "window %d: %d %d %d %d", i, ev.windows[i].question,
              ev.windows[i].at, ev.windows[i].first, ev.windows[i].count);
    tg_squad_eval_free(&ev);
    CHECK(ev.contexts == NULL && ev.n_contexts == 0 && ev.answers == NULL, "freed");
    /* A file of the end line alone, without a newline. */
    static const char end_only[] = "{\"end\": {\"contexts\": 0, \"questions\": 0, \"windows\": 0}}";
    REQUIRE(tg_squad_eval_parse("e.jsonl", end_only, strlen(end_only), &ev, &err) == 0, "%s", err.msg);
    CHECK(ev.n_contexts == 0 && ev.n_questions == 0 && ev.n_windows == 0, "empty set");
    tg_squad_eval_free(&ev);
}

/* ---- scoring ------------------------------------------------------------------------ */

TG_TEST(test_squad_eval_score_empty_tokens_and_refusals) {
    /* Context "ab c": token 1 is empty (bytes [2, 2)), so it is never a candidate though
     * its logits are the highest; token 2 ("c") lies past 3 positions. */
    static const char doc[] = "{\"context\": \"ab c\", \"offsets\": [0, 2, 2, 2, 3, 4]}\n"
                              "{\"question\": \"q\", \"context\": 0, \"answers\": [\"ab\"]}\n"
                              "{\"window\": 0, \"at\": 1, \"first\": 0, \"count\": 3}\n"
                              "{\"end\": {\"contexts\": 1, \"questions\": 1, \"windows\": 1}}\n";
    tg_squad_eval ev;
    tg_err err = {{0}};
    REQUIRE(tg_squad_eval_parse("e.jsonl", doc, strlen(doc), &ev, &err) == 0, "%s", err.msg);
    const float start[4] = {0, 1, 9, 5}, end[4] = {0, 1, 9, 5};
    const tg_qa_postprocess_options opt = {.n_best = 20, .max_answer_len = 30, .version_2 = 0};
    tg_squad_totals tot;
    REQUIRE(tg_squad_eval_score(&ev, start, end, 4, 3, &opt, &tot, &err) == 0, "%s", err.msg);
    CHECK(tot.total == 1 && tot.exact == 1 && tot.f1 == 1 && tot.has_total == 1 && tot.no_total == 0,
          "totals %lld exact %g f1 %g", (long long)tot.total, tot.exact, tot.f1);
    /* With 4 positions "c" is a candidate, and its logits win. */
    REQUIRE(tg_squad_eval_score(&ev, start, end, 4, 4, &opt, &tot, &err) == 0, "%s", err.msg);
    CHECK(tot.total == 1 && tot.exact == 0 && tot.f1 == 0, "c: exact %g f1 %g", tot.exact, tot.f1);
    CHECK(tg_squad_eval_score(&ev, start, end, 4, 0, &opt, &tot, &err) == -1 &&
              !strcmp(err.msg, "qa eval: windows of 0 positions"),
          "'%s'", err.msg);
    const float nan_start[4] = {0, 1, 0.0f / 0.0f, 5};
    CHECK(tg_squad_eval_score(&ev, nan_start, end, 4, 4, &opt, &tot, &err) == -1 &&
              !strcmp(err.msg, "question 'q': qa post-processing: window 0, position 2: the start logit is not a "
                               "number"),
          "'%s'", err.msg);
    tg_alloc_fail_after(0);
    const int rc = tg_squad_eval_score(&ev, start, end, 4, 4, &opt, &tot, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, "out of memory for the context ranges of 1 eval windows"), "'%s'", err.msg);
    tg_squad_eval_free(&ev);
}
