/* The SQuAD eval file's reader (datasets/squad_eval.c): the exact refusal of a question
 * whose "answers" is no array, and the question table growing only when it is full
 * (64 entries, then doubling), counted through the allocation hook. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/squad_eval.h"
#include "tests/harness.h"

TG_TEST(test_squad_eval_answers_not_array) {
    static const char doc[] = "{\"context\": \"cat dog\", \"offsets\": [0, 3, 4, 7]}\n"
                              "{\"question\": \"q1\", \"context\": 0, \"answers\": \"cat\"}\n";
    tg_squad_eval ev;
    memset(&ev, 0, sizeof ev);
    tg_err err = {{0}};
    CHECK(tg_squad_eval_parse("eval.jsonl", doc, strlen(doc), &ev, &err) == -1, "parsed");
    CHECK(!strcmp(err.msg, "eval.jsonl:2: \"answers\" must be an array of strings"), "%s", err.msg);
    tg_squad_eval_free(&ev);
}

/* n questions with no answers and no windows, then the end line. */
static char *questions_doc(int n) {
    size_t cap = 200 + (size_t)n * 80, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    len += (size_t)snprintf(buf + len, cap - len, "{\"context\": \"cat dog\", \"offsets\": [0, 3, 4, 7]}\n");
    for (int k = 0; k < n; k++)
        len += (size_t)snprintf(buf + len, cap - len, "{\"question\": \"q%03d\", \"context\": 0, \"answers\": []}\n", k);
    snprintf(buf + len, cap - len, "{\"end\": {\"contexts\": 1, \"questions\": %d, \"windows\": 0}}\n", n);
    return buf;
}

/* Allocations made while parsing n questions. */
static long parse_allocations(int n, tg_err *err) {
    char *doc = questions_doc(n);
    if (!doc) return -1;
    tg_squad_eval ev;
    memset(&ev, 0, sizeof ev);
    tg_alloc_fail_after(-1);
    int rc = tg_squad_eval_parse("eval.jsonl", doc, strlen(doc), &ev, err);
    long made = tg_alloc_made();
    int ok = rc == 0 && ev.n_questions == n;
    tg_squad_eval_free(&ev);
    free(doc);
    return ok ? made : -1;
}

TG_TEST(test_squad_eval_question_table_growth) {
    tg_err err = {{0}};
    long a[70];
    for (int n = 60; n < 70; n++) {
        a[n] = parse_allocations(n, &err);
        REQUIRE(a[n] >= 0, "%d questions: %s", n, err.msg);
    }
    /* Each question costs the same allocations, except the 65th, which doubles the table. */
    const long per = a[61] - a[60];
    for (int n = 61; n < 70; n++)
        CHECK(a[n] - a[n - 1] == per + (n == 65), "question %d: %ld more allocations (each costs %ld)", n,
              a[n] - a[n - 1], per);
}

/* A set whose questions have no answer at all (every one unanswerable) has no answer
 * arrays: scoring it scores every question as a NoAns one, and offsets no null pointer
 * (found by fuzz_squad_eval under clang's UBSan; the input is in its corpus). */
TG_TEST(test_squad_eval_score_set_without_answers) {
    static const char doc[] = "{\"context\":\"cat dog b2ird\",\"offsets\":[0,3,3,7,8,12]}\n"
                              "{\"question\":\"q1\",\"context\":0,\"answers\":[]}\n"
                              "{\"window\":0,\"at\":3,\"first\":0,\"count\":3}\n"
                              "{\"window\":0,\"at\":4,\"first\":1,\"count\":2}\n"
                              "{\"question\":\"q4\",\"context\":0,\"answers\":[]}\n"
                              "{\"window\":1,\"at\":5,\"first\":0,\"count\":0}\n"
                              "{\"end\":{\"contexts\":1,\"questions\":2,\"windows\":3}}\n";
    tg_squad_eval ev;
    tg_err err = {{0}};
    REQUIRE(tg_squad_eval_parse("none.jsonl", doc, strlen(doc), &ev, &err) == 0, "%s", err.msg);
    CHECK(ev.n_answers == 0 && ev.n_questions == 2 && ev.n_windows == 3, "%d answers, %d questions, %d windows",
          (int)ev.n_answers, ev.n_questions, ev.n_windows);
    enum { T = 8 };
    float logits[3 * T * 2];
    for (int i = 0; i < 3 * T * 2; i++) logits[i] = (float)((i * 7919) % 23) - 11;
    tg_qa_postprocess_options opt = {.n_best = 20, .max_answer_len = 30, .version_2 = 1};
    tg_squad_totals tot;
    const int rc = tg_squad_eval_score(&ev, logits, logits + 3 * T, T, T, &opt, &tot, &err);
    CHECK(rc == 0 && tot.total == 2 && tot.no_total == 2 && tot.has_total == 0, "rc %d '%s': %d questions, %d NoAns",
          rc, err.msg, (int)tot.total, (int)tot.no_total);
    tg_squad_eval_free(&ev);
}
