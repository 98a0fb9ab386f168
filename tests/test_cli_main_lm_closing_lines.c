/* The closing lines of an LM run (cli/main.c), in this process (tests/cli_in_process.h):
 * the eval line with the loss and perplexity the metrics' summary holds (and no accuracy),
 * then "saved FILE" and "exported DIR" last, as given. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

TG_TEST(test_cli_main_lm_closing_lines) {
    const char *dir = tg_test_tmpdir();
    char line[2048], metrics[800], weights[800], folder[800];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(weights, sizeof weights, "%s/w.safetensors", dir);
    snprintf(folder, sizeof folder, "%s/hf", dir);
    snprintf(line, sizeof line,
             "run examples/demo-lm.job --device cpu --set steps=1 --set batch=4 --set seq=16 --metrics %s --save %s "
             "--save-dir %s",
             metrics, weights, folder);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "%s: exit %d: %s", line, r.status, r.err ? r.err : "(nothing)");
    char *text = tg_test_read_file(metrics, NULL);
    REQUIRE(text, "%s", metrics);
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = 0;
    const char *last = strrchr(text, '\n');
    json_t *s = json_loads(last ? last + 1 : text, 0, NULL);
    free(text);
    REQUIRE(s && json_is_true(json_object_get(s, "summary")), "no summary line");
    const double loss = json_number_value(json_object_get(s, "eval_loss")),
                 perplexity = json_number_value(json_object_get(s, "eval_perplexity"));
    const int examples = (int)json_integer_value(json_object_get(s, "eval_examples"));
    CHECK(examples == 200 && !json_object_get(s, "eval_accuracy") && loss > 0 && fabs(perplexity - exp(loss)) < 1e-3 * perplexity,
          "summary: %d examples, loss %g, perplexity %g", examples, loss, perplexity);
    json_decref(s);
    /* the eval line, then what was saved, in that order and nothing after */
    const char *at = strstr(r.err, "\neval on ");
    int got_n = -1, used = 0;
    double got_loss = -1, got_ppl = -1;
    REQUIRE(at && sscanf(at, "\neval on %d examples: loss %lf, perplexity %lf%n", &got_n, &got_loss, &got_ppl, &used) == 3,
            "no LM eval line: %s", r.err);
    char want[3000];
    snprintf(want, sizeof want, "\neval on %d examples: loss %.4f, perplexity %.3f\nsaved %s\nexported %s\n", examples,
             got_loss, got_ppl, weights, folder);
    CHECK(!strcmp(at, want), "closing lines '%s', want '%s'", at, want);
    CHECK(got_n == examples && fabs(got_loss - loss) <= 6e-5 && fabs(got_ppl - perplexity) <= 6e-4,
          "eval line %d examples, loss %.4f, perplexity %.3f; the summary: %d, %g, %g", got_n, got_loss, got_ppl, examples,
          loss, perplexity);
    tg_cli_run_free(&r);
}
