#include "datasets/squad_eval.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json_strict.h"
#include "datasets/file_bytes.h"
#include "datasets/shard_format.h"

const char *tg_squad_eval_file_name(int split) {
    return split == TG_SPLIT_EVAL ? "squad_eval.jsonl" : "squad_train.jsonl";
}

/* ---- writing ------------------------------------------------------------------------ */

/* Writes obj as one line and drops it; failed: a constructor ran out of memory. */
static int put_line(FILE *f, const char *name, json_t *obj, int failed, tg_err *err) {
    /* jansson's dump goes on past a buffer that failed to grow, with those bytes dropped
     * (a key without its closing quote): any allocation failing during it fails the line. */
    const long failures_before = tg_alloc_failures();
    char *text = obj && !failed ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (text && tg_alloc_failures() != failures_before) {
        free(text);
        text = NULL;
    }
    json_decref(obj);
    if (!text) return tg_fail(err, "%s: out of memory for a line", name);
    const size_t n = strlen(text);
    const int bad = fwrite(text, 1, n, f) != n || fputc('\n', f) == EOF;
    free(text);
    return bad ? tg_fail(err, "%s: write error", name) : 0;
}

int tg_squad_eval_put_context(FILE *f, const char *name, const char *text, size_t len, const int64_t *start,
                              const int64_t *end, int32_t n_tokens, tg_err *err) {
    int failed = 0;
    json_t *o = json_object(), *offsets = json_array();
    tg_json_put(o, "context", json_stringn(text, len), &failed);
    for (int32_t i = 0; i < n_tokens; i++) {
        tg_json_push(offsets, json_integer(start[i]), &failed);
        tg_json_push(offsets, json_integer(end[i]), &failed);
    }
    tg_json_put(o, "offsets", offsets, &failed);
    return put_line(f, name, o, failed, err);
}

int tg_squad_eval_put_question(FILE *f, const char *name, const char *id, int32_t context, const char *const *answers,
                               const size_t *answer_len, int32_t n_answers, tg_err *err) {
    int failed = 0;
    json_t *o = json_object(), *a = json_array();
    tg_json_put(o, "question", json_string(id), &failed);
    tg_json_put(o, "context", json_integer(context), &failed);
    for (int32_t i = 0; i < n_answers; i++) tg_json_push(a, json_stringn(answers[i], answer_len[i]), &failed);
    tg_json_put(o, "answers", a, &failed);
    return put_line(f, name, o, failed, err);
}

int tg_squad_eval_put_window(FILE *f, const char *name, int32_t question, int32_t at, int32_t first, int32_t count,
                             tg_err *err) {
    int failed = 0;
    json_t *o = json_object();
    tg_json_put(o, "window", json_integer(question), &failed);
    tg_json_put(o, "at", json_integer(at), &failed);
    tg_json_put(o, "first", json_integer(first), &failed);
    tg_json_put(o, "count", json_integer(count), &failed);
    return put_line(f, name, o, failed, err);
}

int tg_squad_eval_put_end(FILE *f, const char *name, int32_t contexts, int32_t questions, int32_t windows,
                          tg_err *err) {
    int failed = 0;
    json_t *o = json_object(), *c = json_object();
    tg_json_put(c, "contexts", json_integer(contexts), &failed);
    tg_json_put(c, "questions", json_integer(questions), &failed);
    tg_json_put(c, "windows", json_integer(windows), &failed);
    tg_json_put(o, "end", c, &failed);
    return put_line(f, name, o, failed, err);
}

/* ---- reading ------------------------------------------------------------------------ */

#define MAX_ENTRIES (INT32_MAX / 2)

typedef struct reader {
    const char *name;
    long long line;
    tg_squad_eval *ev;
    int64_t cap_contexts, cap_questions, cap_windows, cap_offsets, cap_answers;
} reader;

static int grow(void **v, int64_t *cap, int64_t need, size_t size, const reader *R, tg_err *err) {
    if (need <= *cap) return 0;
    if (need > MAX_ENTRIES) return tg_fail(err, "%s:%lld: too many entries", R->name, R->line); /* GCOVR_EXCL_BR_LINE: more than INT32_MAX / 2 entries in one file: gigabytes of eval lines, more memory than a test has */
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *p = tg_realloc(*v, (size_t)c * size);
    if (!p) return tg_fail(err, "%s:%lld: out of memory for %lld entries", R->name, R->line, (long long)c);
    *v = p;
    *cap = c;
    return 0;
}

/* The object's keys are exactly `keys` (n of them). */
static int keys_are(const reader *R, json_t *o, const char *const *keys, int n, tg_err *err) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) { /* GCOVR_EXCL_BR_LINE: jansson's json_object_foreach: a key's value is never NULL */
        int known = 0;
        for (int i = 0; i < n; i++) known |= !strcmp(k, keys[i]);
        if (!known) return tg_fail(err, "%s:%lld: unknown key \"%s\"", R->name, R->line, k);
    }
    for (int i = 0; i < n; i++)
        if (!json_object_get(o, keys[i])) return tg_fail(err, "%s:%lld: no \"%s\"", R->name, R->line, keys[i]);
    return 0;
}

/* A whole number in [lo, hi] under key. */
static int whole(const reader *R, json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, tg_err *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return tg_fail(err, "%s:%lld: \"%s\" must be a whole number", R->name, R->line, key); /* GCOVR_EXCL_BR_LINE: json_is_integer's NULL test: keys_are has required this key */
    const json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return tg_fail(err, "%s:%lld: \"%s\" = %lld is outside [%lld, %lld]", R->name, R->line, key, (long long)x,
                       (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return 0;
}

static char *copy_string(json_t *v, size_t *len) {
    *len = json_string_length(v);
    char *s = tg_malloc(*len + 1);
    if (s) memcpy(s, json_string_value(v), *len + 1);
    return s;
}

static int read_context(reader *R, json_t *o, tg_err *err) {
    static const char *const keys[] = {"context", "offsets"};
    tg_squad_eval *ev = R->ev;
    if (keys_are(R, o, keys, 2, err)) return -1;
    json_t *text = json_object_get(o, "context"), *offsets = json_object_get(o, "offsets");
    if (!json_is_string(text)) return tg_fail(err, "%s:%lld: \"context\" must be a string", R->name, R->line); /* GCOVR_EXCL_BR_LINE: json_is_string's NULL test: keys_are has required this key */
    if (!json_is_array(offsets) || json_array_size(offsets) % 2) /* GCOVR_EXCL_BR_LINE: json_is_array's NULL test: keys_are has required this key */
        return tg_fail(err, "%s:%lld: \"offsets\" must be an array of byte pairs", R->name, R->line);
    const int64_t n = (int64_t)json_array_size(offsets) / 2;
    if (grow((void **)&ev->contexts, &R->cap_contexts, ev->n_contexts + 1, sizeof *ev->contexts, R, err) ||
        grow((void **)&ev->offsets, &R->cap_offsets, ev->n_offsets + n, 2 * sizeof *ev->offsets, R, err))
        return -1;
    tg_squad_eval_context *c = &ev->contexts[ev->n_contexts];
    const size_t len = json_string_length(text);
    for (int64_t i = 0; i < 2 * n; i++) {
        json_t *v = json_array_get(offsets, (size_t)i);
        const json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1; /* GCOVR_EXCL_BR_LINE: json_is_integer's NULL test: an element below the array's size is never NULL */
        if (x < 0 || (size_t)x > len)
            return tg_fail(err, "%s:%lld: offsets[%lld] is not a byte offset in the context (0 to %zu)", R->name,
                           R->line, (long long)i, len);
        ev->offsets[2 * ev->n_offsets + i] = (int64_t)x;
        if (i % 2 && ev->offsets[2 * ev->n_offsets + i] < ev->offsets[2 * ev->n_offsets + i - 1])
            return tg_fail(err, "%s:%lld: token %lld ends (byte %lld) before it starts (byte %lld)", R->name, R->line,
                           (long long)(i / 2), (long long)x, (long long)ev->offsets[2 * ev->n_offsets + i - 1]);
    }
    size_t got;
    if (!(c->text = copy_string(text, &got))) return tg_fail(err, "%s:%lld: out of memory for a context", R->name, R->line);
    c->len = got;
    c->n_tokens = (int32_t)n;
    c->first_offset = ev->n_offsets;
    ev->n_offsets += n;
    ev->n_contexts++;
    return 0;
}

static int read_question(reader *R, json_t *o, tg_err *err) {
    static const char *const keys[] = {"question", "context", "answers"};
    tg_squad_eval *ev = R->ev;
    if (keys_are(R, o, keys, 3, err)) return -1;
    json_t *id = json_object_get(o, "question"), *answers = json_object_get(o, "answers");
    if (!json_is_string(id)) return tg_fail(err, "%s:%lld: \"question\" (the id) must be a string", R->name, R->line); /* GCOVR_EXCL_BR_LINE: json_is_string's NULL test: keys_are has required this key */
    if (!json_is_array(answers)) /* GCOVR_EXCL_BR_LINE: json_is_array's NULL test: keys_are has required this key */
        return tg_fail(err, "%s:%lld: \"answers\" must be an array of strings", R->name, R->line);
    int64_t context;
    if (ev->n_contexts == 0) return tg_fail(err, "%s:%lld: a question before any context", R->name, R->line);
    if (whole(R, o, "context", 0, ev->n_contexts - 1, &context, err)) return -1;
    const int64_t n = (int64_t)json_array_size(answers);
    if (grow((void **)&ev->questions, &R->cap_questions, ev->n_questions + 1, sizeof *ev->questions, R, err) ||
        grow((void **)&ev->answers, &R->cap_answers, ev->n_answers + n, sizeof *ev->answers, R, err))
        return -1;
    /* answer_len follows answers' capacity. */
    size_t *lens = tg_realloc(ev->answer_len, (size_t)(R->cap_answers ? R->cap_answers : 1) * sizeof *lens);
    if (!lens) return tg_fail(err, "%s:%lld: out of memory for the answers", R->name, R->line);
    ev->answer_len = lens;
    tg_squad_eval_question *q = &ev->questions[ev->n_questions];
    memset(q, 0, sizeof *q);
    for (int64_t i = 0; i < n; i++)
        if (!json_is_string(json_array_get(answers, (size_t)i))) /* GCOVR_EXCL_BR_LINE: json_is_string's NULL test: an element below the array's size is never NULL */
            return tg_fail(err, "%s:%lld: answers[%lld] must be a string", R->name, R->line, (long long)i);
    size_t got;
    if (!(q->id = copy_string(id, &got))) return tg_fail(err, "%s:%lld: out of memory for an id", R->name, R->line);
    q->context = (int32_t)context;
    q->first_answer = ev->n_answers;
    q->n_answers = (int32_t)n;
    ev->n_questions++; /* owns the id from here on */
    for (int64_t i = 0; i < n; i++) {
        char *a = copy_string(json_array_get(answers, (size_t)i), &ev->answer_len[ev->n_answers]);
        if (!a) return tg_fail(err, "%s:%lld: out of memory for an answer", R->name, R->line);
        ev->answers[ev->n_answers++] = a;
    }
    return 0;
}

static int read_window(reader *R, json_t *o, tg_err *err) {
    static const char *const keys[] = {"window", "at", "first", "count"};
    tg_squad_eval *ev = R->ev;
    if (keys_are(R, o, keys, 4, err)) return -1;
    if (ev->n_questions == 0) return tg_fail(err, "%s:%lld: a window before any question", R->name, R->line);
    int64_t q, at, first, count;
    if (whole(R, o, "window", 0, ev->n_questions - 1, &q, err) || whole(R, o, "at", 0, TG_SHARD_SEQ_MAX, &at, err))
        return -1;
    const tg_squad_eval_context *c = &ev->contexts[ev->questions[q].context];
    if (whole(R, o, "first", 0, c->n_tokens, &first, err) || whole(R, o, "count", 0, c->n_tokens - first, &count, err))
        return -1;
    tg_squad_eval_question *qq = &ev->questions[q];
    if (qq->n_windows > 0 && ev->windows[ev->n_windows - 1].question != q)
        return tg_fail(err, "%s:%lld: a window of question %lld after another question's (a question's windows must be "
                            "consecutive)",
                       R->name, R->line, (long long)q);
    if (grow((void **)&ev->windows, &R->cap_windows, ev->n_windows + 1, sizeof *ev->windows, R, err)) return -1;
    if (qq->n_windows++ == 0) qq->first_window = ev->n_windows;
    ev->windows[ev->n_windows++] = (tg_squad_eval_window){(int32_t)q, (int32_t)at, (int32_t)first, (int32_t)count};
    return 0;
}

static int read_end(reader *R, json_t *o, tg_err *err) {
    static const char *const keys[] = {"contexts", "questions", "windows"};
    const tg_squad_eval *ev = R->ev;
    json_t *c = json_object_get(o, "end");
    if (json_object_size(o) != 1 || !json_is_object(c)) /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: the caller chose this line because it has "end" */
        return tg_fail(err, "%s:%lld: \"end\" must be the line's only key, an object of counts", R->name, R->line);
    if (keys_are(R, c, keys, 3, err)) return -1;
    const int64_t have[3] = {ev->n_contexts, ev->n_questions, ev->n_windows};
    for (int i = 0; i < 3; i++) {
        int64_t v;
        if (whole(R, c, keys[i], 0, MAX_ENTRIES, &v, err)) return -1;
        if (v != have[i])
            return tg_fail(err, "%s:%lld: the end line counts %lld %s, the file has %lld", R->name, R->line,
                           (long long)v, keys[i], (long long)have[i]);
    }
    return 0;
}

int tg_squad_eval_parse(const char *name, const char *buf, size_t len, tg_squad_eval *ev, tg_err *err) {
    memset(ev, 0, sizeof *ev);
    reader R = {.name = name, .ev = ev};
    int ended = 0, rc = 0;
    for (size_t at = 0; at < len && !rc;) {
        const char *nl = memchr(buf + at, '\n', len - at);
        const size_t n = nl ? (size_t)(nl - (buf + at)) : len - at;
        const char *line = buf + at;
        at += n + 1;
        R.line++;
        if (ended) {
            rc = tg_fail(err, "%s:%lld: a line after the end line", name, R.line);
            break;
        }
        json_error_t jerr;
        char dup[64];
        json_t *o = tg_json_loadb_strict(line, n, 0, &jerr, dup, sizeof dup);
        if (!o) {
            if (tg_json_out_of_memory(&jerr)) rc = tg_fail(err, "%s:%lld: out of memory parsing the line", name, R.line);
            else if (dup[0]) rc = tg_fail(err, "%s:%lld: key \"%s\" appears twice", name, R.line, dup);
            else rc = tg_fail(err, "%s:%lld: invalid JSON: %s", name, R.line, jerr.text);
            break;
        }
        if (!json_is_object(o)) rc = tg_fail(err, "%s:%lld: each line must be an object", name, R.line); /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: o is the parsed line, NULL was handled above */
        else if (json_object_get(o, "context") && !json_object_get(o, "question")) rc = read_context(&R, o, err);
        else if (json_object_get(o, "question")) rc = read_question(&R, o, err);
        else if (json_object_get(o, "window")) rc = read_window(&R, o, err);
        else if (json_object_get(o, "end")) rc = read_end(&R, o, err), ended = 1;
        else rc = tg_fail(err, "%s:%lld: a line that is no context, question, window or end", name, R.line);
        json_decref(o);
    }
    if (!rc && !ended) rc = tg_fail(err, "%s: no end line (the file is cut short)", name);
    if (rc) tg_squad_eval_free(ev);
    return rc;
}

int tg_squad_eval_load(const char *path, tg_squad_eval *ev, tg_err *err) {
    memset(ev, 0, sizeof *ev);
    char *buf;
    size_t len;
    if (tg_file_bytes(path, &buf, &len, err)) return -1;
    int rc = tg_squad_eval_parse(path, buf, len, ev, err);
    free(buf);
    return rc;
}

void tg_squad_eval_free(tg_squad_eval *ev) {
    for (int32_t i = 0; ev->contexts && i < ev->n_contexts; i++) free(ev->contexts[i].text);
    for (int32_t i = 0; ev->questions && i < ev->n_questions; i++) free(ev->questions[i].id);
    for (int64_t i = 0; ev->answers && i < ev->n_answers; i++) free(ev->answers[i]);
    free(ev->contexts);
    free(ev->questions);
    free(ev->windows);
    free(ev->offsets);
    free(ev->answers);
    free(ev->answer_len);
    memset(ev, 0, sizeof *ev);
}

/* ---- scoring ------------------------------------------------------------------------ */

int tg_squad_eval_score(const tg_squad_eval *ev, const float *start, const float *end, int64_t stride,
                        int32_t positions, const tg_qa_postprocess_options *opt, tg_squad_totals *totals,
                        tg_err *err) {
    memset(totals, 0, sizeof *totals);
    if (positions < 1) return tg_fail(err, "qa eval: windows of %d positions", positions);
    int32_t most = 1; /* the most windows of one question */
    for (int32_t i = 0, n = 0; i < ev->n_windows; i++) {
        n = i > 0 && ev->windows[i].question == ev->windows[i - 1].question ? n + 1 : 1;
        if (n > most) most = n;
    }
    tg_qa_window_logits *w = tg_calloc((size_t)most, sizeof *w);
    int64_t *ranges = tg_malloc(2 * sizeof *ranges * (size_t)positions * (size_t)most);
    int rc = w && ranges ? 0 : tg_fail(err, "out of memory for the context ranges of %d eval windows", most);
    /* Windows of a question are consecutive, as the converter writes them. */
    for (int32_t i = 0; i < ev->n_windows && !rc;) {
        const int32_t q = ev->windows[i].question;
        int32_t n = 0;
        while (i + n < ev->n_windows && ev->windows[i + n].question == q) {
            const tg_squad_eval_window *win = &ev->windows[i + n];
            const tg_squad_eval_context *c = &ev->contexts[ev->questions[q].context];
            int64_t *cs = ranges + (int64_t)n * 2 * positions, *ce = cs + positions;
            for (int32_t t = 0; t < positions; t++) cs[t] = -1, ce[t] = -1;
            for (int32_t k = 0; k < win->count && win->at + k < positions; k++) {
                const int64_t *o = ev->offsets + 2 * (c->first_offset + win->first + k);
                if (o[1] > o[0]) cs[win->at + k] = o[0], ce[win->at + k] = o[1]; /* empty: no candidate */
            }
            w[n] = (tg_qa_window_logits){start + (int64_t)(i + n) * stride, end + (int64_t)(i + n) * stride, cs, ce,
                                         positions};
            n++;
        }
        const tg_squad_eval_question *qq = &ev->questions[q];
        tg_qa_answer a;
        if ((rc = tg_qa_postprocess(w, n, opt, &a, err))) {
            tg_fail_context(err, "question '%s'", qq->id);
            break;
        }
        const char *text;
        size_t len;
        tg_qa_answer_text(&a, ev->contexts[qq->context].text, &text, &len);
        double exact, f1;
        /* A set with no answer at all has no answer arrays: no pointer arithmetic on NULL. */
        const char *const *golds = qq->n_answers ? (const char *const *)ev->answers + qq->first_answer : NULL;
        const size_t *gold_lens = qq->n_answers ? ev->answer_len + qq->first_answer : NULL;
        if ((rc = tg_squad_score(text, len, golds, gold_lens, qq->n_answers, &exact, &f1, err)))
            break;
        tg_squad_totals_add(totals, qq->n_answers > 0, exact, f1);
        i += n;
    }
    free(w);
    free(ranges);
    return rc;
}
