/* `tunegraph predict` of a masked LM (cli/export.c write_logits), in this process
 * (tests/cli_in_process.h): each line gives the ids as the eval masked them and "labels",
 * the original id at each masked position and -100 elsewhere (where the ids are the
 * example's own), one row of the vocabulary's logits per token, cut to seq; the loss and
 * perplexity it reports are the mean cross-entropy of the masked positions' rows against
 * their labels and its exponential, computed back from the written logits. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

#define SEQ 16
#define VOCAB 128

static double cross_entropy(json_t *row, int label) {
    const size_t n = json_array_size(row);
    double m = -INFINITY;
    for (size_t i = 0; i < n; i++) m = fmax(m, json_real_value(json_array_get(row, i)));
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += exp(json_real_value(json_array_get(row, i)) - m);
    return m + log(sum) - json_real_value(json_array_get(row, (size_t)label));
}

TG_TEST(test_cli_predict_mlm_rows) {
    const char *dir = tg_test_tmpdir();
    char data[800], out[800], line[2048];
    snprintf(data, sizeof data, "%s/mlm.jsonl", dir);
    snprintf(out, sizeof out, "%s/mlm-logits.jsonl", dir);
    /* four examples of 20 ids (cut to 16), 12 and 16; [CLS] (1) first, never masked */
    enum { N = 4 };
    static int ids[N][20];
    static const int lens[N] = {20, 12, 16, 20};
    char text[4096];
    size_t n = 0;
    for (int e = 0; e < N; e++) {
        n += (size_t)snprintf(text + n, sizeof text - n, "{\"input_ids\": [");
        for (int t = 0; t < lens[e]; t++) {
            ids[e][t] = t == 0 ? 1 : 3 + (e * 37 + t * 11) % (VOCAB - 3);
            n += (size_t)snprintf(text + n, sizeof text - n, t ? ", %d" : "%d", ids[e][t]);
        }
        n += (size_t)snprintf(text + n, sizeof text - n, "]}\n");
    }
    REQUIRE(tg_test_write_file(data, text) == 0, "data");
    snprintf(line, sizeof line, "predict examples/demo-mlm.job --set seq=%d --set batch=2 --set mlm_probability=0.4 -o %s "
             "--data %s --init-missing --device cpu --threads 1", SEQ, out, data);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "%s: exit %d: %s", line, r.status, r.err ? r.err : "(nothing)");
    const char *at = strstr(r.err, "predicted ");
    int examples = -1;
    double loss = -1, perplexity = -1;
    char again[1200] = "";
    if (at && sscanf(at, "predicted %d examples on cpu: loss %lf, perplexity %lf", &examples, &loss, &perplexity) == 3)
        snprintf(again, sizeof again, "predicted %d examples on cpu: loss %.4f, perplexity %.3f; logits in %s\n", examples,
                 loss, perplexity, out);
    CHECK(at && again[0] && !strcmp(at, again), "report: %s", r.err);
    tg_cli_run_free(&r);

    char *logits_text = tg_test_read_file(out, NULL);
    REQUIRE(logits_text, "%s", out);
    double sum = 0;
    int masked = 0, lines = 0;
    for (char *l = strtok(logits_text, "\n"); l; l = strtok(NULL, "\n"), lines++) {
        json_t *o = json_loads(l, 0, NULL);
        const int e = lines;
        if (!CHECK(o && e < N, "line %d: %.200s", e, l)) {
            json_decref(o);
            continue;
        }
        const int len = lens[e] < SEQ ? lens[e] : SEQ;
        json_t *in = json_object_get(o, "input_ids"), *labels = json_object_get(o, "labels"),
               *rows = json_object_get(o, "logits");
        int ok = json_object_size(o) == 4 && json_integer_value(json_object_get(o, "index")) == e &&
                 json_array_size(in) == (size_t)len && json_array_size(labels) == (size_t)len &&
                 json_array_size(rows) == (size_t)len;
        /* the keys in their order */
        ok = ok && !strncmp(l, "{\"index\": ", 10) && strstr(l, ", \"input_ids\": [") < strstr(l, ", \"labels\": [") &&
             strstr(l, ", \"labels\": [") < strstr(l, ", \"logits\": [[") && !strcmp(l + strlen(l) - 3, "]]}");
        for (int t = 0; ok && t < len; t++) {
            const int id = (int)json_integer_value(json_array_get(in, (size_t)t));
            const int label = (int)json_integer_value(json_array_get(labels, (size_t)t));
            json_t *row = json_array_get(rows, (size_t)t);
            ok = json_array_size(row) == VOCAB && id >= 0 && id < VOCAB;
            if (label == -100) {
                ok = ok && id == ids[e][t];
            } else {
                ok = ok && t > 0 && label == ids[e][t];
                sum += cross_entropy(row, label);
                masked++;
            }
        }
        CHECK(ok, "line %d: %.300s", e, l);
        json_decref(o);
    }
    free(logits_text);
    CHECK(lines == N && examples == N && masked >= 3, "%d lines, %d examples reported, %d masked", lines, examples, masked);
    CHECK(masked > 0 && fabs(loss - sum / masked) <= 0.00005 + 1e-6, "reported loss %.4f, from the logits %.6f (%d masked)",
          loss, masked ? sum / masked : NAN, masked);
    CHECK(fabs(perplexity - exp(loss)) <= 0.0005 + exp(loss) * 0.0001, "perplexity %.3f, exp(loss) %.3f", perplexity,
          exp(loss));
}
