/* `tunegraph predict` (cli/export.c), in this process (tests/cli_in_process.h), on examples
 * longer and shorter than the plan's seq: each line's ids (and token types) cut to seq, its
 * label, its logits (a classifier's two, an LM's one row of the vocabulary per token), and
 * the loss, accuracy and perplexity it reports computed back from the written logits
 * (cross-entropy of each row against its label or next token), so each row is the one
 * the model gave its example. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* -log softmax(row)[label] for a JSON array of n logits. */
static double cross_entropy(json_t *row, int label) {
    const size_t n = json_array_size(row);
    double m = -INFINITY;
    for (size_t i = 0; i < n; i++) m = fmax(m, json_real_value(json_array_get(row, i)));
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += exp(json_real_value(json_array_get(row, i)) - m);
    return m + log(sum) - json_real_value(json_array_get(row, (size_t)label));
}

/* The ids of a JSON array as text "[a, b, ...]". */
static void ids_text(json_t *a, char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (size_t i = 0; i < json_array_size(a) && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, i ? ", %lld" : "%lld", (long long)json_integer_value(json_array_get(a, i)));
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* predict's last stderr line, re-printed from what it says: the whole line must match. */
static int parse_report(const char *err, const char *out_path, int *examples, double *loss, double *metric, int classify) {
    const char *at = err ? strstr(err, "predicted ") : NULL;
    if (!CHECK(at, "no report: %s", err ? err : "(nothing)")) return 0;
    const char *fmt = classify ? "predicted %d examples on cpu: loss %lf, accuracy %lf" : "predicted %d examples on cpu: loss %lf, perplexity %lf";
    if (!CHECK(sscanf(at, fmt, examples, loss, metric) == 3, "report: %s", at)) return 0;
    char again[1200];
    snprintf(again, sizeof again,
             classify ? "predicted %d examples on cpu: loss %.4f, accuracy %.4f; logits in %s\n"
                      : "predicted %d examples on cpu: loss %.4f, perplexity %.3f; logits in %s\n",
             *examples, *loss, *metric, out_path);
    return CHECK(!strcmp(at, again), "report '%s', want '%s'", at, again);
}

TG_TEST(test_cli_predict_classifier_rows) {
    const char *dir = tg_test_tmpdir();
    char data[800], out[800], line[2048];
    snprintf(data, sizeof data, "%s/cls.jsonl", dir);
    snprintf(out, sizeof out, "%s/cls-logits.jsonl", dir);
    REQUIRE(tg_test_write_file(data, "{\"input_ids\": [2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 3], "
                                     "\"token_type_ids\": [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1], \"label\": 1}\n"
                                     "{\"input_ids\": [2, 30, 3], \"token_type_ids\": [0, 0, 0], \"label\": 0}\n"
                                     "{\"input_ids\": [2, 40, 41, 3], \"token_type_ids\": [0, 0, 1, 1], \"label\": 1}\n") == 0,
            "data");
    snprintf(line, sizeof line, "predict examples/demo-classify.job --set seq=8 --set batch=2 -o %s --data %s --init-missing "
             "--device cpu --threads 1", out, data);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "%s: exit %d: %s", line, r.status, r.err ? r.err : "(nothing)");
    int examples = 0;
    double loss = -1, accuracy = -1;
    const int parsed = parse_report(r.err, out, &examples, &loss, &accuracy, 1);
    tg_cli_run_free(&r);
    REQUIRE(parsed, "report");
    char *text = tg_test_read_file(out, NULL);
    REQUIRE(text, "%s", out);
    static const char *const want_ids[] = {"[2, 10, 11, 12, 13, 14, 15, 16]", "[2, 30, 3]", "[2, 40, 41, 3]"};
    /* token types all 0 are not kept: that line has none */
    static const char *const want_types[] = {"[0, 0, 0, 0, 0, 0, 1, 1]", "[]", "[0, 0, 1, 1]"};
    static const int labels[] = {1, 0, 1};
    double sum = 0, got[3][2];
    int right = 0, n = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"), n++) {
        json_error_t e;
        json_t *o = json_loads(l, 0, &e);
        if (!CHECK(o && n < 3, "line %d: %s", n, l)) {
            json_decref(o);
            continue;
        }
        char ids[400], types[400];
        ids_text(json_object_get(o, "input_ids"), ids, sizeof ids);
        ids_text(json_object_get(o, "token_type_ids"), types, sizeof types);
        json_t *logits = json_object_get(o, "logits");
        CHECK(json_integer_value(json_object_get(o, "index")) == n && !strcmp(ids, want_ids[n]) &&
                  !strcmp(types, want_types[n]) && json_integer_value(json_object_get(o, "label")) == labels[n] &&
                  json_array_size(logits) == 2 && json_object_size(o) == (n == 1 ? 4u : 5u),
              "line %d: %s", n, l);
        if (json_array_size(logits) == 2) {
            /* different inputs: logits of their own (the initial head's are all near 0, so
             * the loss alone could not tell one example's row from another's) */
            got[n][0] = json_real_value(json_array_get(logits, 0)), got[n][1] = json_real_value(json_array_get(logits, 1));
            for (int j = 0; j < n; j++)
                CHECK(got[j][0] != got[n][0] || got[j][1] != got[n][1], "lines %d and %d have the same logits", j, n);
            sum += cross_entropy(logits, labels[n]);
            const int best = json_real_value(json_array_get(logits, 1)) > json_real_value(json_array_get(logits, 0));
            right += best == labels[n];
        }
        json_decref(o);
    }
    free(text);
    CHECK(n == 3 && examples == 3, "%d lines, %d examples reported", n, examples);
    CHECK(fabs(loss - sum / 3) <= 0.00005 + 1e-6, "reported loss %.4f, from the logits %.6f", loss, sum / 3);
    CHECK(fabs(accuracy - right / 3.0) <= 0.00005 + 1e-9, "reported accuracy %.4f, from the logits %d of 3", accuracy, right);
}

TG_TEST(test_cli_predict_lm_rows) {
    const char *dir = tg_test_tmpdir();
    char data[800], out[800], line[2048];
    snprintf(data, sizeof data, "%s/lm.jsonl", dir);
    snprintf(out, sizeof out, "%s/lm-logits.jsonl", dir);
    REQUIRE(tg_test_write_file(data, "{\"input_ids\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\n{\"input_ids\": [5, 6]}\n"
                                     "{\"input_ids\": [90, 91, 92]}\n") == 0,
            "data");
    snprintf(line, sizeof line, "predict examples/demo-lm.job --set seq=8 --set batch=2 -o %s --data %s --init-missing "
             "--device cpu --threads 1", out, data);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "%s: exit %d: %s", line, r.status, r.err ? r.err : "(nothing)");
    int examples = 0;
    double loss = -1, perplexity = -1;
    const int parsed = parse_report(r.err, out, &examples, &loss, &perplexity, 0);
    tg_cli_run_free(&r);
    REQUIRE(parsed, "report");
    char *text = tg_test_read_file(out, NULL);
    REQUIRE(text, "%s", out);
    static const char *const want_ids[] = {"[1, 2, 3, 4, 5, 6, 7, 8]", "[5, 6]", "[90, 91, 92]"};
    double sum = 0;
    int tokens = 0, n = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"), n++) {
        json_error_t e;
        json_t *o = json_loads(l, 0, &e);
        if (!CHECK(o && n < 3, "line %d: %.200s", n, l)) {
            json_decref(o);
            continue;
        }
        char ids[400];
        json_t *id = json_object_get(o, "input_ids"), *rows = json_object_get(o, "logits");
        ids_text(id, ids, sizeof ids);
        int shapes = json_array_size(rows) == json_array_size(id);
        for (size_t t = 0; t < json_array_size(rows); t++) shapes &= json_array_size(json_array_get(rows, t)) == 128;
        CHECK(json_integer_value(json_object_get(o, "index")) == n && !strcmp(ids, want_ids[n]) && shapes &&
                  json_object_size(o) == 3,
              "line %d: ids %s, %zu rows: %.200s", n, ids, json_array_size(rows), l);
        for (size_t t = 0; shapes && t + 1 < json_array_size(id); t++, tokens++)
            sum += cross_entropy(json_array_get(rows, t), (int)json_integer_value(json_array_get(id, t + 1)));
        json_decref(o);
    }
    free(text);
    CHECK(n == 3 && examples == 3 && tokens == 7 + 1 + 2, "%d lines, %d examples reported, %d tokens", n, examples, tokens);
    CHECK(fabs(loss - sum / tokens) <= 0.00005 + 1e-6, "reported loss %.4f, from the logits %.6f", loss, sum / tokens);
    CHECK(fabs(perplexity - exp(sum / tokens)) <= 0.0005 + 1e-6 * perplexity, "reported perplexity %.3f, from the logits %.4f",
          perplexity, exp(sum / tokens));
}
