/* `tunegraph run`'s opening line and closing eval line (cli/main.c), word for word, in this
 * process (tests/cli_in_process.h), on the CPU executor: micro-batches a step and
 * data-parallel replicas (the steps per epoch rounded up to whole windows of micro-
 * batches), frozen parameters, length buckets with the last batch dropped, and a model
 * folder whose weights lack the classifier and hold a tensor Hugging Face ignores and one
 * the model does not use; the eval line as the metrics' summary has it, a qa run's with its
 * SQuAD scores. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/safetensors.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

#define DEMO "examples/demo-classify.job"

/* The text of `said` from its start up to and including its first line beginning with
 * `upto` (exclusive of that line), in out. */
static void lines_before(const char *said, const char *upto, char *out, size_t cap) {
    const char *end = strstr(said, upto);
    const size_t n = end ? (size_t)(end - said) : strlen(said);
    snprintf(out, cap, "%.*s", (int)n, said);
}

static json_t *summary_of(const char *path) {
    char *text = tg_test_read_file(path, NULL);
    if (!text) return NULL;
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n') text[--n] = 0;
    const char *last = strrchr(text, '\n');
    json_t *o = json_loads(last ? last + 1 : text, 0, NULL);
    free(text);
    return o;
}

TG_TEST(test_cli_main_run_opening_lines_micro_batches_and_replicas) {
    const char *dir = tg_test_tmpdir();
    char line[2048], metrics[700];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    /* 2000 examples in batches of 4 on 2 replicas: 250 batches an epoch, 84 windows of 3 */
    snprintf(line, sizeof line,
             "run " DEMO " --device cpu --set steps=2 --set batch=4 --set seq=16 --set freeze=bert.embeddings.* "
             "--set grad_accumulation=3 --set data_parallel=2 --metrics %s",
             metrics);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "run: exit %d: %s", r.status, r.err ? r.err : "");
    static const char opening[] =
        "tunegraph: bert classify on cpu: 2000 examples, batch 4 x seq 16, 3 micro-batches a step on each of 2 "
        "data-parallel replicas, 2 steps (84 per epoch, last batch: pad), 36 parameters trainable, 5 frozen\n"
        "tunegraph: ready in ";
    CHECK(!strncmp(r.err, opening, strlen(opening)), "opening:\n%s\nwant\n%s", r.err, opening);
    json_t *s = summary_of(metrics);
    if (CHECK(s && json_is_true(json_object_get(s, "summary")), "no summary in %s", metrics)) {
        char want[256];
        snprintf(want, sizeof want, "\neval on %d examples: loss %.4f, accuracy %.4f, macro-F1 %.4f\n",
                 (int)json_integer_value(json_object_get(s, "eval_examples")),
                 json_real_value(json_object_get(s, "eval_loss")), json_real_value(json_object_get(s, "eval_accuracy")),
                 json_real_value(json_object_get(s, "eval_macro_f1")));
        const char *eval = strstr(r.err, "\neval on ");
        CHECK(eval && !strcmp(eval, want), "eval line: %s\nwant%s", eval ? eval : r.err, want);
        CHECK(json_integer_value(json_object_get(s, "replicas")) == 2 && json_integer_value(json_object_get(s, "steps")) == 2,
              "summary replicas and steps");
        /* the tokens counted are every replica's: the steps' own (tokens per second times
         * the step's time, replica 0's for each) add up to the summary's, to its rounding */
        char *all = tg_test_read_file(metrics, NULL);
        double steps_tokens = 0;
        int step_lines = 0;
        for (char *l = all ? strtok(all, "\n") : NULL; l; l = strtok(NULL, "\n")) {
            json_t *o = json_loads(l, 0, NULL);
            if (o && !json_object_get(o, "summary") && json_object_get(o, "step_ms")) {
                steps_tokens += json_number_value(json_object_get(o, "tokens_per_s")) *
                                json_number_value(json_object_get(o, "step_ms")) / 1e3;
                step_lines++;
            }
            json_decref(o);
        }
        free(all);
        const double summary_tokens = json_number_value(json_object_get(s, "tokens_per_s")) *
                                      json_number_value(json_object_get(s, "train_s"));
        /* 2 steps of 3 micro-batches of 4 rows on 2 replicas: 48 rows of at most 16 tokens */
        const double train_s = json_number_value(json_object_get(s, "train_s"));
        const double slack = train_s > 0 ? steps_tokens * (0.0005 / train_s + 0.01) : 0; /* train_s to 1 ms */
        CHECK(step_lines == 2 && steps_tokens > 48 && steps_tokens <= 48 * 16 + 0.5 && slack < steps_tokens / 3 &&
                  fabs(summary_tokens - steps_tokens) <= slack,
              "tokens: %g from the %d step lines, %g from the summary", steps_tokens, step_lines, summary_tokens);
        json_decref(s);
    }
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_main_run_opening_lines_buckets_dropped) {
    const char *dir = tg_test_tmpdir();
    char line[2048], save[700];
    snprintf(save, sizeof save, "%s/w.safetensors", dir);
    snprintf(line, sizeof line,
             "run " DEMO " --device cpu --set steps=2 --set batch=4 --set seq=16 --set seq_buckets=8,16 "
             "--set last_batch=drop --save %s",
             save);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "run: exit %d: %s", r.status, r.err ? r.err : "");
    static const char opening[] =
        "tunegraph: bert classify on cpu: 2000 examples, batch 4 x seq 16 (length buckets 8,16), 2 steps (500 per "
        "epoch, last batch: drop)\ntunegraph: ready in ";
    CHECK(!strncmp(r.err, opening, strlen(opening)), "opening:\n%s\nwant\n%s", r.err, opening);
    const char *batches = strstr(r.err, "\nbatches: ");
    CHECK(batches && strstr(batches, "% of the token slots padding (with length buckets), waited for "),
          "batches line: %s", r.err);
    char tail[800];
    snprintf(tail, sizeof tail, "\nsaved %s\n", save);
    CHECK(strlen(r.err) > strlen(tail) && !strcmp(r.err + strlen(r.err) - strlen(tail), tail), "the last line: %s", r.err);
    tg_cli_run_free(&r);
}

/* A model folder (config and weights) whose weights lack the classifier, and hold
 * position_ids (a buffer Hugging Face ignores in a checkpoint) and a tensor no part of the
 * model reads. */
TG_TEST(test_cli_main_run_opening_lines_weights_report) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[800], cwd[600];
    snprintf(path, sizeof path, "%s/full.safetensors", dir);
    snprintf(line, sizeof line, "run " DEMO " --device cpu --set steps=1 --set batch=4 --set seq=16 --save %s", path);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "run: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    tg_safetensors st;
    tg_err err;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    tg_st_item items[64];
    int n = 0;
    for (int i = 0; i < st.n && n < 60; i++) {
        const tg_st_entry *e = &st.entries[i];
        if (!strncmp(e->name, "classifier.", 11)) continue;
        items[n++] = (tg_st_item){e->name, e->dtype, e->ndim, e->shape, st.data + e->begin};
    }
    static const int64_t pos_shape[2] = {1, 64}, extra_shape[1] = {3};
    static int32_t pos[64];
    static const float extra[3] = {1, 2, 3};
    for (int i = 0; i < 64; i++) pos[i] = i;
    items[n++] = (tg_st_item){"bert.embeddings.position_ids", TG_ST_I32, 2, pos_shape, pos};
    items[n++] = (tg_st_item){"unused.extra", TG_ST_F32, 1, extra_shape, extra};
    snprintf(path, sizeof path, "%s/model", dir);
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    snprintf(path, sizeof path, "%s/model/model.safetensors", dir);
    const int wrote = tg_st_write(path, items, n, &err);
    tg_st_close(&st);
    REQUIRE(wrote == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model/config.json", dir);
    char *config = tg_test_read_file("models/presets/tiny-bert/config.json", NULL);
    REQUIRE(config && tg_test_write_file(path, config) == 0, "%s", path);
    free(config);
    REQUIRE(getcwd(cwd, sizeof cwd), "getcwd");
    char job[2048];
    snprintf(job, sizeof job, "model = %s/model\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = 1\n"
                              "train_data = %s/examples/data/sentiment-train.jsonl\n", dir, cwd);
    snprintf(path, sizeof path, "%s/j.job", dir);
    REQUIRE(tg_test_write_file(path, job) == 0, "%s", path);
    snprintf(line, sizeof line, "run %s --device cpu", path);
    r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "run: exit %d: %s", r.status, r.err ? r.err : "");
    char got[4096], want[4096];
    lines_before(r.err, "tunegraph: ready in ", got, sizeof got);
    /* then the weights' own report as Hugging Face words it, the checkpoint named by its
     * model folder: the tensor the model does not use, the head left at its initial values */
    snprintf(want, sizeof want,
             "tunegraph: bert classify on cpu: 2000 examples, batch 4 x seq 16, 1 steps (500 per epoch, last batch: pad), "
             "39 tensors from %s/model/model.safetensors (39 trainable, 0 frozen, 0 buffers; 2 newly initialised, first "
             "classifier.weight; 1 ignored as Hugging Face does)\n"
             "Some weights of the model checkpoint at %s/model were not used when initializing "
             "BertForSequenceClassification: ['unused.extra']\n"
             "Some weights of BertForSequenceClassification were not initialized from the model checkpoint at %s/model "
             "and are newly initialized: ['classifier.bias', 'classifier.weight']\n",
             dir, dir, dir);
    CHECK(!strcmp(got, want), "opening:\n%s\nwant\n%s", got, want);
    tg_cli_run_free(&r);
}

/* A qa run's eval line: the loss, then the SQuAD v2 scores of its questions, all and
 * split into those with an answer and those without, as the summary has them. */
TG_TEST(test_cli_main_run_opening_lines_qa_eval) {
    const char *dir = tg_test_tmpdir();
    char path[800], line[2048], metrics[800];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\nthe\ncat\n") == 0, "vocab");
    snprintf(path, sizeof path, "%s/sq.json", dir);
    REQUIRE(tg_test_write_file(path, tg_test_squad_v2) == 0, "squad");
    /* seed 1 puts the article of q1 (answered) and q2 (unanswerable) in the eval split */
    snprintf(line, sizeof line,
             "data convert %s/sq.json -o %s/qs --tokenizer %s/vocab.txt --format squad --seq 12 --doc-stride 2 "
             "--eval-fraction 0.5 --seed 1",
             dir, dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    char want[2048];
    snprintf(want, sizeof want,
             "tunegraph: wrote %s/qs: qa, 1 train records (5 tokens) and 2 eval records (22 tokens) from 3 questions (2 "
             "windows hold their answer)\n",
             dir);
    REQUIRE(r.status == 0 && r.err && !strcmp(r.err, want), "convert: exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
    char job[1024];
    snprintf(job, sizeof job,
             "model = tiny-bert\ntask = qa\nbatch = 2\nseq = 12\nsteps = 2\ntrain_data = %s/qs\neval_data = %s/qs/eval\n",
             dir, dir);
    snprintf(path, sizeof path, "%s/qa.job", dir);
    REQUIRE(tg_test_write_file(path, job) == 0, "job");
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(line, sizeof line, "run %s --device cpu --metrics %s", path, metrics);
    r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "run: exit %d: %s", r.status, r.err ? r.err : "");
    json_t *s = summary_of(metrics);
#define NUM(k) json_number_value(json_object_get(s, k))
    if (CHECK(s && json_integer_value(json_object_get(s, "eval_questions")) == 2, "summary of %s", metrics)) {
        snprintf(want, sizeof want,
                 "\neval on %d examples: loss %.4f, %d questions: exact %.2f, F1 %.2f (HasAns %d: exact %.2f, F1 %.2f; "
                 "NoAns %d: exact %.2f, F1 %.2f)\n",
                 (int)NUM("eval_examples"), NUM("eval_loss"), (int)NUM("eval_questions"), NUM("eval_exact"),
                 NUM("eval_f1"), (int)NUM("eval_HasAns_total"), NUM("eval_HasAns_exact"), NUM("eval_HasAns_f1"),
                 (int)NUM("eval_NoAns_total"), NUM("eval_NoAns_exact"), NUM("eval_NoAns_f1"));
        const char *eval = strstr(r.err, "\neval on ");
        CHECK(eval && !strcmp(eval, want) && NUM("eval_HasAns_total") == 1 && NUM("eval_NoAns_total") == 1,
              "eval line: %s\nwant%s", eval ? eval : r.err, want);
    }
#undef NUM
    json_decref(s);
    tg_cli_run_free(&r);
}
