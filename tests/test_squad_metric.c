/* The SQuAD v2 metric (datasets/squad_metric.c) and run_qa's post-processing
 * (datasets/qa_postprocess.c) against tests/data/squad_reference.json, which
 * tests/squad_reference.py wrote from the official evaluation script and Hugging Face's
 * utils_qa restated in Python: every normalization, exact match and F1, and every answer
 * (kind, byte range and float32 score difference) must agree exactly. Then hand-worked
 * cases, the errors, and every allocation failed in turn. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/qa_postprocess.h"
#include "datasets/squad_metric.h"
#include "tests/harness.h"

#define REFERENCE "tests/data/squad_reference.json"

static json_t *load_reference(void) {
    json_error_t jerr;
    json_t *root = json_load_file(REFERENCE, 0, &jerr);
    CHECK(root != NULL, "%s:%d: %s", REFERENCE, jerr.line, jerr.text);
    return root;
}

TG_TEST(test_squad_normalize_matches_reference) {
    json_t *root = load_reference();
    if (!root) return;
    json_t *cases = json_object_get(root, "normalize"), *c;
    size_t i;
    REQUIRE(json_array_size(cases) > 300, "too few normalization cases");
    int bad = 0;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        const char *want = json_string_value(json_object_get(c, "normalized"));
        char *got = NULL;
        size_t got_len = 0;
        tg_err err = {{0}};
        if (!CHECK(tg_squad_normalize(text, strlen(text), &got, &got_len, &err) == 0, "%s", err.msg)) continue;
        if (strlen(want) != got_len || memcmp(want, got, got_len)) {
            if (bad++ < 5) CHECK(0, "case %zu: '%s' normalizes to '%s', the script gives '%s'", i, text, got, want);
        }
        CHECK(got[got_len] == 0, "case %zu: not NUL-terminated", i);
        free(got);
    }
    CHECK(bad == 0, "%d of %zu normalizations differ from the script's", bad, json_array_size(cases));
    json_decref(root);
}

TG_TEST(test_squad_score_matches_reference) {
    json_t *root = load_reference();
    if (!root) return;
    json_t *cases = json_object_get(root, "score"), *c;
    size_t i;
    REQUIRE(json_array_size(cases) > 400, "too few scoring cases");
    int bad = 0;
    json_array_foreach(cases, i, c) {
        const char *pred = json_string_value(json_object_get(c, "pred"));
        json_t *golds = json_object_get(c, "gold");
        const char *gold[8];
        size_t gold_len[8];
        const int n = (int)json_array_size(golds);
        REQUIRE(n <= 8, "case %zu: %d golds", i, n);
        for (int g = 0; g < n; g++) {
            gold[g] = json_string_value(json_array_get(golds, (size_t)g));
            gold_len[g] = strlen(gold[g]);
        }
        double exact = -1, f1 = -1;
        tg_err err = {{0}};
        if (!CHECK(tg_squad_score(pred, strlen(pred), gold, gold_len, n, &exact, &f1, &err) == 0, "%s", err.msg))
            continue;
        const double want_exact = json_number_value(json_object_get(c, "exact"));
        const double want_f1 = json_number_value(json_object_get(c, "f1"));
        if (exact != want_exact || f1 != want_f1) {
            if (bad++ < 5)
                CHECK(0, "case %zu: '%s' scores exact %g f1 %.17g, the script %g %.17g", i, pred, exact, f1,
                      want_exact, want_f1);
        }
    }
    CHECK(bad == 0, "%d of %zu scores differ from the script's", bad, json_array_size(cases));
    json_decref(root);
}

static float f32_of(json_t *v) {
    const uint32_t bits = (uint32_t)json_integer_value(v);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

typedef struct window_arrays {
    float start[64], end[64];
    int64_t cstart[64], cend[64];
} window_arrays;

TG_TEST(test_qa_postprocess_matches_reference) {
    json_t *root = load_reference();
    if (!root) return;
    json_t *cases = json_object_get(root, "postprocess"), *c;
    size_t i;
    REQUIRE(json_array_size(cases) >= 300, "too few post-processing cases");
    int bad = 0, kinds[3] = {0};
    json_array_foreach(cases, i, c) {
        json_t *ws = json_object_get(c, "windows");
        const int32_t n = (int32_t)json_array_size(ws);
        REQUIRE(n >= 1 && n <= 4, "case %zu: %d windows", i, n);
        window_arrays arr[4];
        tg_qa_window_logits w[4];
        for (int32_t k = 0; k < n; k++) {
            json_t *win = json_array_get(ws, (size_t)k);
            json_t *sl = json_object_get(win, "start_logits"), *el = json_object_get(win, "end_logits");
            json_t *off = json_object_get(win, "offsets");
            const int32_t len = (int32_t)json_array_size(sl);
            REQUIRE(len <= 64, "case %zu: window of %d", i, len);
            for (int32_t p = 0; p < len; p++) {
                arr[k].start[p] = f32_of(json_array_get(sl, (size_t)p));
                arr[k].end[p] = f32_of(json_array_get(el, (size_t)p));
                arr[k].cstart[p] = json_integer_value(json_array_get(json_array_get(off, (size_t)p), 0));
                arr[k].cend[p] = json_integer_value(json_array_get(json_array_get(off, (size_t)p), 1));
            }
            w[k] = (tg_qa_window_logits){arr[k].start, arr[k].end, arr[k].cstart, arr[k].cend, len};
        }
        const tg_qa_postprocess_options opt = {
            (int32_t)json_integer_value(json_object_get(c, "n_best")),
            (int32_t)json_integer_value(json_object_get(c, "max_answer_len")),
            json_number_value(json_object_get(c, "null_threshold")),
            json_is_true(json_object_get(c, "v2")),
        };
        tg_qa_answer a;
        tg_err err = {{0}};
        if (!CHECK(tg_qa_postprocess(w, n, &opt, &a, &err) == 0, "case %zu: %s", i, err.msg)) continue;
        json_t *want = json_object_get(c, "answer");
        const char *kind = json_string_value(json_object_get(want, "kind"));
        const tg_qa_answer_kind want_kind =
            !strcmp(kind, "span") ? TG_QA_SPAN : !strcmp(kind, "null") ? TG_QA_NULL : TG_QA_FALLBACK_EMPTY;
        kinds[want_kind]++;
        const float want_diff = f32_of(json_object_get(want, "score_diff"));
        const int64_t ws_ = json_integer_value(json_object_get(want, "start"));
        const int64_t we = json_integer_value(json_object_get(want, "end"));
        if (a.kind != want_kind || a.start != ws_ || a.end != we || memcmp(&a.score_diff, &want_diff, 4)) {
            if (bad++ < 5)
                CHECK(0, "case %zu: answer kind %d [%lld, %lld) diff %.9g; run_qa: %s [%lld, %lld) diff %.9g", i,
                      (int)a.kind, (long long)a.start, (long long)a.end, a.score_diff, kind, (long long)ws_,
                      (long long)we, want_diff);
        }
    }
    CHECK(bad == 0, "%d of %zu answers differ from run_qa's", bad, json_array_size(cases));
    CHECK(kinds[TG_QA_SPAN] > 50 && kinds[TG_QA_NULL] > 10 && kinds[TG_QA_FALLBACK_EMPTY] > 10,
          "the reference should hold every kind of answer: %d spans, %d null, %d empty", kinds[0], kinds[1],
          kinds[2]);
    json_decref(root);
}

static double score_one(const char *pred, const char *g0, const char *g1, int n, double *f1) {
    const char *gold[2] = {g0, g1};
    const size_t len[2] = {g0 ? strlen(g0) : 0, g1 ? strlen(g1) : 0};
    double exact = -1;
    tg_err err = {{0}};
    CHECK(tg_squad_score(pred, strlen(pred), gold, len, n, &exact, f1, &err) == 0, "%s", err.msg);
    return exact;
}

/* Hand-worked: tokens as bags, the best gold, the empty answer. */
TG_TEST(test_squad_score_worked_examples) {
    double f1 = -1;
    /* pred {cat, sat, cat}, gold {cat, sat, on, mat}: 2 in common; P 2/3, R 2/4, F1 4/7. */
    CHECK(score_one("The cat sat, cat.", "cat sat on a mat", NULL, 1, &f1) == 0.0 && fabs(f1 - 4.0 / 7.0) < 1e-15,
          "f1 %.17g", f1);
    /* Counted once per occurrence on both sides: {x, x} against {x}: P 1/2, R 1, F1 2/3. */
    CHECK(score_one("x x", "x", NULL, 1, &f1) == 0.0 && fabs(f1 - 2.0 / 3.0) < 1e-15, "f1 %.17g", f1);
    /* The best gold wins for each score on its own. */
    CHECK(score_one("Paris, France", "paris", "Paris France", 2, &f1) == 1.0 && f1 == 1.0, "f1 %g", f1);
    /* No gold, or golds that normalize to nothing: scored against the empty answer. */
    CHECK(score_one("", NULL, NULL, 0, &f1) == 1.0 && f1 == 1.0, "empty against none: f1 %g", f1);
    CHECK(score_one("something", NULL, NULL, 0, &f1) == 0.0 && f1 == 0.0, "text against none: f1 %g", f1);
    CHECK(score_one("The.", "a", "!!", 2, &f1) == 1.0 && f1 == 1.0, "articles only: f1 %g", f1);
    CHECK(score_one("no overlap", "other words", NULL, 1, &f1) == 0.0 && f1 == 0.0, "disjoint: f1 %g", f1);
    CHECK(score_one("", "an answer", NULL, 1, &f1) == 0.0 && f1 == 0.0, "empty against one: f1 %g", f1);
}

/* Bytes that are not UTF-8 pass through as themselves and end a word: "a" before one is
 * still an article. */
TG_TEST(test_squad_normalize_invalid_utf8) {
    const char text[] = "a\xff the \xfe" "B \xc3";
    char *got = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_squad_normalize(text, sizeof text - 1, &got, &len, &err) == 0, "%s", err.msg);
    CHECK(len == 6 && !memcmp(got, "\xff \xfe" "b \xc3", 6), "got %zu bytes '%s'", len, got);
    free(got);
    double f1 = -1;
    /* An empty prediction against a gold with words: 0 (and its exact match 0). */
    CHECK(score_one("a the", "some words", NULL, 1, &f1) == 0.0 && f1 == 0.0, "f1 %g", f1);
}

/* Which characters join a word, so that "a", "an" and "the" inside one stay: each end of
 * the ASCII ranges (0-9, a-z, A-Z), letters and numbers of each Unicode category (Ll, Nd,
 * No, Nl, Lm, Lt), and characters that end a word: a control character, a symbol, and
 * spaces (the ASCII unit separator, U+3000, U+2028). Expected values from the script's
 * normalize_answer. */
TG_TEST(test_squad_normalize_word_characters) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"a0", "a0"},
        {"0the", "0the"},
        {"An0an", "an0an"},
        {"a9", "a9"},
        {"9the", "9the"},
        {"An9an", "an9an"},
        {"aa", "aa"},
        {"athe", "athe"},
        {"Anaan", "anaan"},
        {"az", "az"},
        {"zthe", "zthe"},
        {"Anzan", "anzan"},
        {"aA", "aa"},
        {"Athe", "athe"},
        {"AnAan", "anaan"},
        {"aZ", "az"},
        {"Zthe", "zthe"},
        {"AnZan", "anzan"},
        {"a\x1f", ""},
        {"\x1fthe", ""},
        {"An\x1f" "an", ""},
        {"a\x7f", "\x7f"},
        {"\x7fthe", "\x7f"},
        {"An\x7f" "an", "\x7f"},
        {"a\xc3\xa9", "a\xc3\xa9"},
        {"\xc3\xa9the", "\xc3\xa9the"},
        {"An\xc3\xa9" "an", "an\xc3\xa9" "an"},
        {"a\xd9\xa0", "a\xd9\xa0"},
        {"\xd9\xa0the", "\xd9\xa0the"},
        {"An\xd9\xa0" "an", "an\xd9\xa0" "an"},
        {"a\xc2\xb2", "a\xc2\xb2"},
        {"\xc2\xb2the", "\xc2\xb2the"},
        {"An\xc2\xb2" "an", "an\xc2\xb2" "an"},
        {"a\xe2\x85\xab", "a\xe2\x85\xbb"},
        {"\xe2\x85\xabthe", "\xe2\x85\xbbthe"},
        {"An\xe2\x85\xab" "an", "an\xe2\x85\xbb" "an"},
        {"a\xca\xb0", "a\xca\xb0"},
        {"\xca\xb0the", "\xca\xb0the"},
        {"An\xca\xb0" "an", "an\xca\xb0" "an"},
        {"a\xc7\x85", "a\xc7\x86"},
        {"\xc7\x85the", "\xc7\x86the"},
        {"An\xc7\x85" "an", "an\xc7\x86" "an"},
        {"a\xc3\x97", "\xc3\x97"},
        {"\xc3\x97the", "\xc3\x97"},
        {"An\xc3\x97" "an", "\xc3\x97"},
        {"a\xe3\x80\x80", ""},
        {"\xe3\x80\x80the", ""},
        {"An\xe3\x80\x80" "an", ""},
        {"a\xe2\x80\xa8", ""},
        {"\xe2\x80\xa8the", ""},
        {"An\xe2\x80\xa8" "an", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *got = NULL;
        size_t len = 0;
        tg_err err = {{0}};
        if (!CHECK(tg_squad_normalize(cases[i].text, strlen(cases[i].text), &got, &len, &err) == 0, "%s", err.msg))
            continue;
        CHECK(len == strlen(cases[i].want) && !memcmp(got, cases[i].want, len), "case %zu: '%s' normalizes to '%s', want '%s'",
              i, cases[i].text, got, cases[i].want);
        free(got);
    }
}

TG_TEST(test_squad_totals_split_by_answerable) {
    tg_squad_totals t = {0};
    tg_squad_totals_add(&t, 1, 1.0, 1.0);
    tg_squad_totals_add(&t, 1, 0.0, 0.5);
    tg_squad_totals_add(&t, 0, 1.0, 1.0);
    tg_squad_totals_add(&t, 0, 0.0, 0.0);
    CHECK(t.total == 4 && t.has_total == 2 && t.no_total == 2, "counts %lld %lld %lld", (long long)t.total,
          (long long)t.has_total, (long long)t.no_total);
    CHECK(tg_squad_percent(t.exact, t.total) == 50.0 && tg_squad_percent(t.f1, t.total) == 62.5,
          "total exact %g f1 %g", tg_squad_percent(t.exact, t.total), tg_squad_percent(t.f1, t.total));
    CHECK(tg_squad_percent(t.has_exact, t.has_total) == 50.0 && tg_squad_percent(t.has_f1, t.has_total) == 75.0,
          "HasAns %g %g", tg_squad_percent(t.has_exact, t.has_total), tg_squad_percent(t.has_f1, t.has_total));
    CHECK(tg_squad_percent(t.no_exact, t.no_total) == 50.0 && tg_squad_percent(t.no_f1, t.no_total) == 50.0,
          "NoAns %g %g", tg_squad_percent(t.no_exact, t.no_total), tg_squad_percent(t.no_f1, t.no_total));
    CHECK(tg_squad_percent(3.0, 0) == 0.0, "no question of a kind scores 0");
}

/* One window "[CLS] q [SEP] Paris is big [SEP]": context "Paris is big", tokens at bytes
 * [0,5) [6,8) [9,12). */
static const char *const CONTEXT = "Paris is big";
static const int64_t CS[6] = {-1, -1, -1, 0, 6, 9}, CE[6] = {-1, -1, -1, 5, 8, 12};

static int answer_of(const float *sl, const float *el, int v2, double threshold, int max_len, tg_qa_answer *a,
                     tg_err *err) {
    const tg_qa_window_logits w = {sl, el, CS, CE, 6};
    const tg_qa_postprocess_options opt = {20, max_len, threshold, v2};
    return tg_qa_postprocess(&w, 1, &opt, a, err);
}

TG_TEST(test_qa_postprocess_worked_examples) {
    tg_qa_answer a;
    tg_err err = {{0}};
    const char *text;
    size_t len;
    /* Best span "Paris is" (3 + 2 = 5) against null 1 + 1 = 2: diff 2 - 5 = -3, answered. */
    const float sl[6] = {1, 0, 0, 3, 0, 0}, el[6] = {1, 0, 0, 0, 2, 0};
    REQUIRE(answer_of(sl, el, 1, 0.0, 30, &a, &err) == 0, "%s", err.msg);
    tg_qa_answer_text(&a, CONTEXT, &text, &len);
    CHECK(a.kind == TG_QA_SPAN && len == 8 && !memcmp(text, "Paris is", 8) && a.score_diff == -3.0f,
          "answer kind %d '%.*s' diff %g", (int)a.kind, (int)len, text, a.score_diff);
    /* The same with a threshold below -3: the null answer. */
    REQUIRE(answer_of(sl, el, 1, -3.5, 30, &a, &err) == 0, "%s", err.msg);
    tg_qa_answer_text(&a, CONTEXT, &text, &len);
    CHECK(a.kind == TG_QA_NULL && len == 0 && a.score_diff == -3.0f, "kind %d diff %g", (int)a.kind, a.score_diff);
    /* max_answer_len 1 keeps single tokens only: "Paris" 3 + 0, or "is" 0 + 2, or ...; the
     * best is "Paris" (3). */
    REQUIRE(answer_of(sl, el, 0, 0.0, 1, &a, &err) == 0, "%s", err.msg);
    tg_qa_answer_text(&a, CONTEXT, &text, &len);
    CHECK(a.kind == TG_QA_SPAN && len == 5 && !memcmp(text, "Paris", 5), "'%.*s'", (int)len, text);
    /* Equal scores keep the order they were tried in: start positions by logit, so "big"
     * (start 5, 5 - 9) comes before "Paris" (start 3, -9 + 5). */
    const float sl2[6] = {0, 0, 0, -9, -9, 5}, el2[6] = {0, 0, 0, 5, -9, -9};
    REQUIRE(answer_of(sl2, el2, 0, 0.0, 1, &a, &err) == 0, "%s", err.msg);
    tg_qa_answer_text(&a, CONTEXT, &text, &len);
    CHECK(a.kind == TG_QA_SPAN && len == 3 && !memcmp(text, "big", 3), "v1 single token: '%.*s'", (int)len, text);
    /* No candidate: "empty" in v1... */
    const float sl3[6] = {0, 9, 9, -9, -9, -9}, el3[6] = {0, 9, 9, -9, -9, -9};
    /* n_best 20 covers every position, so spans exist; with n_best 2 only the question's
     * positions are tried, none is context: no candidate. */
    const tg_qa_window_logits w = {sl3, el3, CS, CE, 6};
    tg_qa_postprocess_options opt = {2, 30, 0.0, 0};
    REQUIRE(tg_qa_postprocess(&w, 1, &opt, &a, &err) == 0, "%s", err.msg);
    tg_qa_answer_text(&a, CONTEXT, &text, &len);
    CHECK(a.kind == TG_QA_FALLBACK_EMPTY && len == 5 && !memcmp(text, "empty", 5), "v1 no candidate: kind %d",
          (int)a.kind);
    /* ...and in v2 the "empty" text with logits 0 against the null score 0: diff 0, not
     * above the threshold 0, so "empty"; above -1, so the null answer. */
    opt.version_2 = 1;
    REQUIRE(tg_qa_postprocess(&w, 1, &opt, &a, &err) == 0, "%s", err.msg);
    CHECK(a.kind == TG_QA_FALLBACK_EMPTY && a.score_diff == 0.0f, "v2 no candidate: kind %d diff %g", (int)a.kind,
          a.score_diff);
    opt.null_threshold = -1.0;
    REQUIRE(tg_qa_postprocess(&w, 1, &opt, &a, &err) == 0, "%s", err.msg);
    CHECK(a.kind == TG_QA_NULL, "v2 no candidate below the threshold: kind %d", (int)a.kind);
}

/* Two windows: the null answer comes from the window with the lowest [CLS] score, and
 * the spans of both compete. */
TG_TEST(test_qa_postprocess_null_from_lowest_window) {
    const float sa[6] = {4, 0, 0, 1, 0, 0}, ea[6] = {4, 0, 0, 0, 0, 1};
    const float sb[6] = {-1, 0, 0, 0, 2, 0}, eb[6] = {0.5f, 0, 0, 0, 0, 2};
    const tg_qa_window_logits w[2] = {{sa, ea, CS, CE, 6}, {sb, eb, CS, CE, 6}};
    const tg_qa_postprocess_options opt = {20, 30, 0.0, 1};
    tg_qa_answer a;
    tg_err err = {{0}};
    REQUIRE(tg_qa_postprocess(w, 2, &opt, &a, &err) == 0, "%s", err.msg);
    /* Null: min(8, -0.5) = -0.5. Best span: window b "is big" 2 + 2 = 4. Diff -0.5 - 4. */
    CHECK(a.kind == TG_QA_SPAN && a.start == 6 && a.end == 12 && a.score_diff == -4.5f, "kind %d [%lld, %lld) %g",
          (int)a.kind, (long long)a.start, (long long)a.end, a.score_diff);
}

TG_TEST(test_qa_postprocess_refuses_bad_input) {
    const float sl[6] = {0, 0, 0, 1, 2, 3}, el[6] = {0, 0, 0, 1, 2, 3};
    float nan_l[6] = {0, 0, 0, 1, 2, 3};
    nan_l[4] = NAN;
    const int64_t empty_cs[6] = {-1, -1, -1, 0, 6, 9}, empty_ce[6] = {-1, -1, -1, 5, 6, 12};
    struct {
        tg_qa_window_logits w;
        int32_t n, n_best, max_len;
        const char *want;
    } cases[] = {
        {{sl, el, CS, CE, 6}, 0, 20, 30, "a question with no window"},
        {{sl, el, CS, CE, 6}, 1, 0, 30, "n_best (0) and max_answer_len (30) must be at least 1"},
        {{sl, el, CS, CE, 6}, 1, 20, 0, "n_best (20) and max_answer_len (0) must be at least 1"},
        {{sl, el, CS, CE, 0}, 1, 20, 30, "window 0 has no positions"},
        {{nan_l, el, CS, CE, 6}, 1, 20, 30, "window 0, position 4: the start logit is not a number"},
        {{sl, nan_l, CS, CE, 6}, 1, 20, 30, "window 0, position 4: the end logit is not a number"},
        {{sl, el, empty_cs, empty_ce, 6}, 1, 20, 30, "window 0, position 4: context bytes [6, 6) are empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const tg_qa_postprocess_options opt = {cases[i].n_best, cases[i].max_len, 0.0, 1};
        tg_qa_answer a;
        tg_err err = {{0}};
        CHECK(tg_qa_postprocess(&cases[i].w, cases[i].n, &opt, &a, &err) == -1 && strstr(err.msg, cases[i].want),
              "case %zu: '%s', want '%s'", i, err.msg, cases[i].want);
    }
}

/* Every allocation of a normalization, a score and a post-processing failed in turn: an
 * error that says what ran out, never a crash or a result. */
TG_TEST(test_squad_metric_allocation_failures) {
    const char *gold[2] = {"The cat sat", "a mat"};
    const size_t gold_len[2] = {11, 5};
    const float sl[6] = {1, 0, 0, 3, 0, 0}, el[6] = {1, 0, 0, 0, 2, 0};
    const tg_qa_window_logits w = {sl, el, CS, CE, 6};
    const tg_qa_postprocess_options opt = {20, 30, 0.0, 1};
    for (int what = 0; what < 2; what++) {
        tg_alloc_fail_after(-1);
        double exact, f1;
        tg_qa_answer a;
        tg_err err = {{0}};
        const int ok = what == 0 ? tg_squad_score("the cat", 7, gold, gold_len, 2, &exact, &f1, &err)
                                 : tg_qa_postprocess(&w, 1, &opt, &a, &err);
        const long total = tg_alloc_fail_after(-1);
        REQUIRE(ok == 0 && total > 0, "%d: %s (%ld allocations)", what, err.msg, total);
        for (long k = 0; k < total; k++) {
            tg_alloc_fail_after(k);
            const int rc = what == 0 ? tg_squad_score("the cat", 7, gold, gold_len, 2, &exact, &f1, &err)
                                     : tg_qa_postprocess(&w, 1, &opt, &a, &err);
            tg_alloc_fail_after(-1);
            CHECK(rc == -1 && strstr(err.msg, "out of memory for the"), "%d: allocation %ld of %ld failed: rc %d '%s'",
                  what, k, total, rc, err.msg);
        }
    }
}
