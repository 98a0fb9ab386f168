/* The SQuAD reader's answers (datasets/squad.c): answer_start counts characters, turned into
 * context bytes (multi-byte characters before the answer and inside it); and the exact
 * refusal of each answer that is not where it says: past the context's end (the bytes
 * compared stop at the end), text that differs, a start beyond the last character, an
 * empty text, a start that is no whole number >= 0. */
#include <stdio.h>
#include <string.h>

#include "datasets/squad.h"
#include "tests/harness.h"

/* One question "q" over `context` with one answer {text, answer_start: start}. */
static int parse_one(const char *context, const char *answer, const char *start, tg_squad *sq, tg_err *err) {
    char doc[1024];
    snprintf(doc, sizeof doc,
             "{\"data\": [{\"paragraphs\": [{\"context\": \"%s\", \"qas\": [{\"id\": \"q\", \"question\": \"?\", "
             "\"answers\": [{\"text\": \"%s\", \"answer_start\": %s}]}]}]}]}",
             context, answer, start);
    return tg_squad_parse("s.json", doc, strlen(doc), sq, err);
}

TG_TEST(test_squad_answer_bytes_from_characters) {
    static const struct {
        const char *context, *answer, *start;
        int64_t from, to;
    } cases[] = {
        {"ab c", "c", "3", 3, 4},
        {"ab c", "ab c", "0", 0, 4},
        {"h\xc3\xa9llo w\xc3\xb6rld", "w\xc3\xb6rld", "6", 7, 13},
        {"h\xc3\xa9llo", "\xc3\xa9l", "1", 1, 4},
        {"\xe2\x82\xac\xe2\x82\xac x", "x", "3", 7, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_squad sq;
        tg_err err = {{0}};
        if (!CHECK(parse_one(cases[i].context, cases[i].answer, cases[i].start, &sq, &err) == 0, "case %zu: %s", i,
                   err.msg))
            continue;
        CHECK(sq.n_questions == 1 && sq.n_answers == 1 && sq.questions[0].n_answers == 1 &&
                  sq.answers[0].start == cases[i].from && sq.answers[0].end == cases[i].to,
              "case %zu: bytes [%lld, %lld), want [%lld, %lld)", i, (long long)sq.answers[0].start,
              (long long)sq.answers[0].end, (long long)cases[i].from, (long long)cases[i].to);
        tg_squad_free(&sq);
    }
}

TG_TEST(test_squad_answer_refusals_exact) {
    static const struct {
        const char *context, *answer, *start, *want;
    } cases[] = {
        {"abc", "cde", "2",
         "s.json: data[0].paragraphs[0].qas[0] (id 'q'): answer 'cde' at character 2 is not in its context (the "
         "context there reads 'c')"},
        /* Far past the end: the comparison must not read beyond the context's bytes. */
        {"abc", "cdefghijklmnop", "2",
         "s.json: data[0].paragraphs[0].qas[0] (id 'q'): answer 'cdefghijklmnop' at character 2 is not in its "
         "context (the context there reads 'c')"},
        {"abc", "bcd", "1",
         "s.json: data[0].paragraphs[0].qas[0] (id 'q'): answer 'bcd' at character 1 is not in its context (the "
         "context there reads 'bc')"},
        {"abc", "bd", "1",
         "s.json: data[0].paragraphs[0].qas[0] (id 'q'): answer 'bd' at character 1 is not in its context (the "
         "context there reads 'bc')"},
        {"abc", "x", "3",
         "s.json: data[0].paragraphs[0].qas[0] (id 'q'): answer 'x' at character 3 is not in its context (the "
         "context there reads '')"},
        {"abc", "x", "4",
         "s.json: data[0].paragraphs[0].qas[0] (id 'q'): answer 'x' at character 4 is not in its context (the "
         "context has fewer characters)"},
        {"abc", "", "0", "s.json: data[0].paragraphs[0].qas[0].answers[0] (id 'q'): the answer text is empty"},
        {"abc", "a", "-1",
         "s.json: data[0].paragraphs[0].qas[0].answers[0] (id 'q'): answer_start must be a whole number >= 0"},
        {"abc", "a", "\"0\"",
         "s.json: data[0].paragraphs[0].qas[0].answers[0] (id 'q'): answer_start must be a whole number >= 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_squad sq;
        tg_err err = {{0}};
        const int rc = parse_one(cases[i].context, cases[i].answer, cases[i].start, &sq, &err);
        CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg,
              cases[i].want);
        if (rc == 0) tg_squad_free(&sq);
    }
}
