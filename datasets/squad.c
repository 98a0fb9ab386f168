#include "datasets/squad.h"
#include "base/json_strict.h"
#include "base/alloc.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/utf8.h"

#define MAX_ITEMS (INT32_MAX / 2)

typedef struct parser {
    const char *name;
    tg_squad *sq;
    int64_t cap_paragraphs, cap_questions, cap_ids, cap_answers;
} parser;

static int grow(void **v, int64_t *cap, int64_t n, size_t size, tg_err *err) {
    if (n < *cap) return 0;
    /* GCOVR_EXCL_BR_START: MAX_ITEMS entries take more JSON than memory holds */
    if (*cap >= MAX_ITEMS) return tg_fail(err, "too many entries");
    /* GCOVR_EXCL_BR_STOP */
    int64_t c = *cap ? 2 * *cap : 256;
    void *p = tg_realloc(*v, (size_t)c * size);
    if (!p) return tg_fail(err, "out of memory for %lld SQuAD entries", (long long)c);
    *v = p;
    *cap = c;
    return 0;
}

/* The array under `key` of obj, or an error naming where. */
static json_t *array_at(const parser *P, json_t *obj, const char *key, const char *where, tg_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) tg_fail(err, "%s: %s has no \"%s\"", P->name, where, key);
    else if (json_typeof(v) != JSON_ARRAY) tg_fail(err, "%s: %s.%s must be an array", P->name, where, key);
    return v && json_typeof(v) == JSON_ARRAY ? v : NULL;
}

static const char *string_at(const parser *P, json_t *obj, const char *key, const char *where, size_t *len,
                             tg_err *err) {
    json_t *v = json_object_get(obj, key);
    if (!v) tg_fail(err, "%s: %s has no \"%s\"", P->name, where, key);
    else if (json_typeof(v) != JSON_STRING) tg_fail(err, "%s: %s.%s must be a string", P->name, where, key);
    else {
        *len = json_string_length(v);
        return json_string_value(v);
    }
    return NULL;
}

/* A short quote of s for messages: at most 40 bytes, cut at a character boundary. */
static int quote_len(const char *s, size_t n) {
    if (n <= 40) return (int)n;
    size_t k = 40;
    /* GCOVR_EXCL_BR_START: s is UTF-8 (jansson checks), so a lead byte comes before k reaches 0 */
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    /* GCOVR_EXCL_BR_STOP */
    return (int)k;
}

static int add_answer(parser *P, tg_squad_question *q, const tg_squad_paragraph *para, json_t *a, size_t k,
                      tg_err *err) {
    tg_squad *sq = P->sq;
    char where[160];
    snprintf(where, sizeof where, "%s.answers[%zu]", q->path, k);
    if (json_typeof(a) != JSON_OBJECT) return tg_fail(err, "%s: %s (id '%s') must be an object", P->name, where, q->id);
    size_t tlen;
    const char *text = string_at(P, a, "text", where, &tlen, err);
    if (!text) return -1;
    json_t *start = json_object_get(a, "answer_start");
    if (!json_is_integer(start) || json_integer_value(start) < 0)
        return tg_fail(err, "%s: %s (id '%s'): answer_start must be a whole number >= 0", P->name, where, q->id);
    json_int_t chars = json_integer_value(start);
    if (tlen == 0) return tg_fail(err, "%s: %s (id '%s'): the answer text is empty", P->name, where, q->id);
    int64_t b = tg_utf8_byte_offset(para->context, para->len, chars);
    int found = b >= 0 && (size_t)b + tlen <= para->len && !memcmp(para->context + b, text, tlen);
    if (!found) {
        if (b < 0)
            return tg_fail(err, "%s: %s (id '%s'): answer '%.*s' at character %lld is not in its context (the "
                                "context has fewer characters)",
                           P->name, q->path, q->id, quote_len(text, tlen), text, (long long)chars);
        size_t rest = para->len - (size_t)b;
        size_t show = rest < tlen ? rest : tlen;
        return tg_fail(err, "%s: %s (id '%s'): answer '%.*s' at character %lld is not in its context (the context "
                            "there reads '%.*s')",
                       P->name, q->path, q->id, quote_len(text, tlen), text, (long long)chars,
                       quote_len(para->context + b, show), para->context + b);
    }
    if (grow((void **)&sq->answers, &P->cap_answers, sq->n_answers, sizeof *sq->answers, err)) return -1;
    sq->answers[sq->n_answers++] = (tg_squad_answer){b, b + (int64_t)tlen};
    q->n_answers++;
    return 0;
}

static int add_question(parser *P, json_t *qa, int32_t paragraph, const char *para_where, size_t k, tg_err *err) {
    tg_squad *sq = P->sq;
    if (grow((void **)&sq->questions, &P->cap_questions, sq->n_questions, sizeof *sq->questions, err) ||
        grow((void **)&sq->ids, &P->cap_ids, sq->n_questions, sizeof *sq->ids, err))
        return -1;
    tg_squad_question *q = &sq->questions[sq->n_questions];
    memset(q, 0, sizeof *q);
    snprintf(q->path, sizeof q->path, "%s.qas[%zu]", para_where, k);
    q->paragraph = paragraph;
    q->first_answer = sq->n_answers;
    if (json_typeof(qa) != JSON_OBJECT) return tg_fail(err, "%s: %s must be an object", P->name, q->path);
    json_t *id = json_object_get(qa, "id");
    if (json_is_string(id)) q->id = json_string_value(id);
    else if (json_is_integer(id)) {
        snprintf(sq->ids[sq->n_questions], sizeof sq->ids[0], "%" JSON_INTEGER_FORMAT, json_integer_value(id));
        q->id = sq->ids[sq->n_questions];
    } else return tg_fail(err, "%s: %s: \"id\" must be a string or an integer", P->name, q->path);
    if (!(q->text = string_at(P, qa, "question", q->path, &q->len, err))) return -1;
    json_t *impossible = json_object_get(qa, "is_impossible");
    if (impossible && json_typeof(impossible) != JSON_TRUE && json_typeof(impossible) != JSON_FALSE)
        return tg_fail(err, "%s: %s (id '%s'): is_impossible must be true or false", P->name, q->path, q->id);
    json_t *answers = array_at(P, qa, "answers", q->path, err);
    if (!answers) return -1;
    const tg_squad_paragraph *para = &sq->paragraphs[paragraph];
    for (size_t i = 0; i < json_array_size(answers); i++)
        if (add_answer(P, q, para, json_array_get(answers, i), i, err)) return -1;
    /* An impossible question's answers (if any) are checked above but not used. */
    if (json_is_true(impossible)) {
        sq->n_answers = q->first_answer;
        q->n_answers = 0;
    }
    sq->n_questions++;
    return 0;
}

int tg_squad_parse(const char *name, const char *buf, size_t len, tg_squad *sq, tg_err *err) {
    memset(sq, 0, sizeof *sq);
    json_error_t jerr;
    json_t *root = tg_json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && tg_json_out_of_memory(&jerr)) return tg_fail(err, "%s: out of memory parsing the JSON", name);
    if (!root)
        return tg_fail(err, "%s:%d:%d: invalid JSON: %s", name, jerr.line, jerr.column, jerr.text);
    sq->root = root;
    parser P = {.name = name, .sq = sq};
    int rc = -1;
    if (json_typeof(root) != JSON_OBJECT) {
        tg_fail(err, "%s: expected a SQuAD object {\"data\": [...]}", name);
        goto done;
    }
    json_t *data = array_at(&P, root, "data", "the top level", err);
    if (!data) goto done;
    for (size_t i = 0; i < json_array_size(data); i++) {
        json_t *article = json_array_get(data, i);
        char where[48], pwhere[96];
        snprintf(where, sizeof where, "data[%zu]", i);
        if (json_typeof(article) != JSON_OBJECT) {
            tg_fail(err, "%s: %s must be an object", name, where);
            goto done;
        }
        json_t *paragraphs = array_at(&P, article, "paragraphs", where, err);
        if (!paragraphs) goto done;
        for (size_t j = 0; j < json_array_size(paragraphs); j++) {
            json_t *para = json_array_get(paragraphs, j);
            snprintf(pwhere, sizeof pwhere, "%s.paragraphs[%zu]", where, j);
            if (json_typeof(para) != JSON_OBJECT) {
                tg_fail(err, "%s: %s must be an object", name, pwhere);
                goto done;
            }
            if (grow((void **)&sq->paragraphs, &P.cap_paragraphs, sq->n_paragraphs, sizeof *sq->paragraphs, err))
                goto done;
            tg_squad_paragraph *p = &sq->paragraphs[sq->n_paragraphs];
            p->article = (int32_t)i;
            if (!(p->context = string_at(&P, para, "context", pwhere, &p->len, err))) goto done;
            sq->n_paragraphs++;
            json_t *qas = array_at(&P, para, "qas", pwhere, err);
            if (!qas) goto done;
            for (size_t k = 0; k < json_array_size(qas); k++)
                if (add_question(&P, json_array_get(qas, k), sq->n_paragraphs - 1, pwhere, k, err)) goto done;
        }
        sq->n_articles = (int32_t)i + 1;
    }
    if (sq->n_questions == 0) {
        tg_fail(err, "%s: no questions", name);
        goto done;
    }
    rc = 0;
done:
    if (rc) tg_squad_free(sq);
    return rc;
}

void tg_squad_free(tg_squad *sq) {
    json_decref(sq->root);
    free(sq->paragraphs);
    free(sq->questions);
    free(sq->answers);
    free(sq->ids);
    memset(sq, 0, sizeof *sq);
}
