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
