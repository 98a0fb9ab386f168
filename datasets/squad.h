/* SQuAD v1.1 and v2.0 JSON: {"data": [{"title", "paragraphs": [{"context", "qas": [{"id",
 * "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}. answer_start
 * counts code points (Python's str indices), as the files are made; the reader turns
 * answers into byte ranges of their context and refuses an answer whose text is not
 * found there. A question with no answers, or marked is_impossible, is unanswerable (as
 * Hugging Face's run_qa treats an empty answer list). Duplicate keys are refused; keys the
 * format does not use (title, plausible_answers, version, ...) are passed over. */
#ifndef TUNEGRAPH_SQUAD_H
#define TUNEGRAPH_SQUAD_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct tg_squad_answer {
    int64_t start, end;       /* bytes of the context, end exclusive */
} tg_squad_answer;

typedef struct tg_squad_question {
    const char *id;           /* as written (a string, or an integer spelled out) */
    const char *text;
    size_t len;
    int32_t paragraph;
    int32_t n_answers;        /* 0: unanswerable */
    int64_t first_answer;     /* into answers */
    char path[128];           /* data[i].paragraphs[j].qas[k], for messages */
} tg_squad_question;

typedef struct tg_squad_paragraph {
    const char *context;
    size_t len;
    int32_t article;          /* index into data[] */
} tg_squad_paragraph;

typedef struct tg_squad {
    void *root;               /* the parsed JSON, which owns the strings */
    tg_squad_paragraph *paragraphs;
    int32_t n_paragraphs;
    tg_squad_question *questions;
    int64_t n_questions;
    tg_squad_answer *answers;
    int64_t n_answers;
    int32_t n_articles;
    char (*ids)[32];          /* integer ids spelled out */
} tg_squad;

/* Parses buf[0..len) (a whole file; `name` in messages). Errors name the file and the
 * question: "dev.json: data[0].paragraphs[2].qas[1] (id '57...'): answer 'x' at character
 * 12 is not in its context (the context there reads 'y')". */
int tg_squad_parse(const char *name, const char *buf, size_t len, tg_squad *sq, tg_err *err);
void tg_squad_free(tg_squad *sq);

#endif
