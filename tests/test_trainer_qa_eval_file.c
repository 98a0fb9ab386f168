/* task = qa in the trainer (runtime/trainer.c): the SQuAD eval file beside the eval set
 * must be there, readable, and describe the set's windows one for one, each inside its
 * record; a set whose questions all have answers is scored as SQuAD v1 (no null answer);
 * an allocation failing in the eval is its clean error; and the training data's identity
 * in a checkpoint covers the answers' end positions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "datasets/convert.h"
#include "datasets/shard_format.h"
#include "datasets/squad_eval.h"
#include "runtime/trainer.h"
#include "tests/byte_encoder.h"
#include "tests/harness.h"

/* Two articles, each its own split at eval_fraction 0.5; every question answerable, unless
 * `impossible` puts an unanswerable one first in the first article (the eval split). The
 * second article (`end_b` its first answer: "dog", or "dog ran" with the same start) is
 * the training split. */
static void squad_text(char *out, size_t n, const char *end_b, int impossible) {
    snprintf(out, n,
             "{\"version\": \"v2.0\", \"data\": ["
             "{\"title\": \"a\", \"paragraphs\": [{\"context\": \"the cat sat on the mat by the door\", \"qas\": [%s"
             "{\"id\": \"a1\", \"question\": \"who sat\", \"answers\": [{\"text\": \"cat\", \"answer_start\": 4}]},"
             "{\"id\": \"a2\", \"question\": \"where\", \"answers\": [{\"text\": \"the mat\", \"answer_start\": 15}]}"
             "]}]},"
             "{\"title\": \"b\", \"paragraphs\": [{\"context\": \"a dog ran far away into the park\", \"qas\": ["
             "{\"id\": \"b1\", \"question\": \"who ran\", \"answers\": [{\"text\": \"%s\", \"answer_start\": 2}]},"
             "{\"id\": \"b3\", \"question\": \"to\", \"answers\": [{\"text\": \"the park\", \"answer_start\": 24}]}"
             "]}]}]}",
             impossible ? "{\"id\": \"a0\", \"question\": \"why\", \"answers\": [], \"is_impossible\": true}," : "",
             end_b);
}

static const char bert_json[] =
    "{\"architectures\": [\"BertForQuestionAnswering\"], \"model_type\": \"bert\", \"vocab_size\": 261, "
    "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 37, "
    "\"max_position_embeddings\": 40, \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", \"layer_norm_eps\": 1e-12, "
    "\"initializer_range\": 0.02, \"hidden_dropout_prob\": 0.1, \"attention_probs_dropout_prob\": 0.1, "
    "\"pad_token_id\": 0}";

/* dir/<name>: the model folder (once) and the set converted from the text above. */
static int make_set_of(const char *dir, const char *name, const char *end_b, int impossible) {
    char model_dir[700], json[700], out[700], text[2048], cfg[800];
    snprintf(model_dir, sizeof model_dir, "%s/model", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);
    struct stat st;
    if (stat(model_dir, &st) != 0 &&
        !CHECK(mkdir(model_dir, 0755) == 0 && tg_test_write_file(cfg, bert_json) == 0, "model folder %s", model_dir))
        return 0;
    snprintf(json, sizeof json, "%s/%s.json", dir, name);
    snprintf(out, sizeof out, "%s/%s", dir, name);
    squad_text(text, sizeof text, end_b, impossible);
    if (!CHECK(tg_test_write_file(json, text) == 0, "write %s", json)) return 0;
    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    const char *inputs[] = {json};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_SQUAD, .seq = 20,
                            .doc_stride = 4, .eval_fraction = 0.5, .seed = 3, .command = "test"};
    tg_convert_report rep;
    tg_err err = {{0}};
    const int rc = tg_convert(&o, &enc, &rep, &err);
    byte_encoder_free(&be);
    return CHECK(rc == 0 && rep.records[TG_SPLIT_EVAL] == (impossible ? 12 : 9), "convert %s: %s (%lld eval records)",
                 out, err.msg, (long long)rep.records[TG_SPLIT_EVAL]);
}

static int make_set(const char *dir, const char *name, const char *end_b) { return make_set_of(dir, name, end_b, 0); }

/* Compiles a qa job over dir/<name> (with its eval split where `eval`) and opens a trainer. */
static int open_qa(const char *dir, const char *name, int eval, tg_plan *plan, tg_trainer *tr, tg_err *err) {
    char job_text[2400];
    int n = snprintf(job_text, sizeof job_text,
                     "model = %s/model\ntask = qa\nbatch = 4\nseq = 20\nsteps = 2\ntrain_data = %s/%s\n", dir, dir, name);
    if (eval) snprintf(job_text + n, sizeof job_text - (size_t)n, "eval_data = %s/%s/eval\n", dir, name);
    tg_job job;
    if (!CHECK(tg_job_parse_text(job_text, "qa.job", NULL, NULL, 0, &job, err) == 0, "%s", err->msg)) return -2;
    if (!CHECK(tg_compile(&job, plan, err) == 0, "%s", err->msg)) return -2;
    tg_trainer_options opts = {.device = TG_DEVICE_CPU, .load_data = 1, .threads = 1, .no_loader_thread = 1};
    const int rc = tg_trainer_open(tr, plan, &opts, err);
    if (rc) tg_plan_free(plan);
    return rc;
}

/* Replaces the first `from` in the file with `to`. */
static int edit_file(const char *path, const char *from, const char *to) {
    char *text = tg_test_read_file(path, NULL);
    if (!text) return -1;
    char *at = strstr(text, from);
    int rc = -1;
    if (at) {
        const size_t head = (size_t)(at - text), n = strlen(text) - head - strlen(from);
        char *out = malloc(head + strlen(to) + n + 1);
        if (out) {
            memcpy(out, text, head);
            memcpy(out + head, to, strlen(to));
            memcpy(out + head + strlen(to), at + strlen(from), n + 1);
            rc = tg_test_write_file(path, out);
            free(out);
        }
    }
    free(text);
    return rc;
}

static void expect_refused(const char *dir, const char *name, const char *want1, const char *want2) {
    tg_plan plan;
    tg_trainer tr;
    tg_err err = {{0}};
    const int rc = open_qa(dir, name, 1, &plan, &tr, &err);
    if (rc == -2) return;
    if (rc == 0) tg_trainer_close(&tr), tg_plan_free(&plan);
    CHECK(rc == -1 && strstr(err.msg, want1) && strstr(err.msg, want2), "%s: rc %d, '%s'\n    want '%s' ... '%s'", name,
          rc, err.msg, want1, want2);
}

TG_TEST(test_trainer_qa_eval_file_refusals) {
    const char *dir = tg_test_tmpdir();
    char path[800], want[900];
    /* Not there. */
    if (make_set(dir, "gone", "dog")) {
        snprintf(path, sizeof path, "%s/gone/squad_eval.jsonl", dir);
        REQUIRE(unlink(path) == 0, "unlink %s", path);
        snprintf(want, sizeof want, "%s/gone/eval: task qa scores its eval with %s, which is not there (convert the set "
                 "again with `tunegraph data convert --format squad`)", dir, path);
        expect_refused(dir, "gone", want, want);
    }
    /* Not a SQuAD eval file. */
    if (make_set(dir, "junk", "dog")) {
        snprintf(path, sizeof path, "%s/junk/squad_eval.jsonl", dir);
        REQUIRE(tg_test_write_file(path, "not json\n") == 0, "write %s", path);
        expect_refused(dir, "junk", path, "");
    }
    /* One window fewer than the set's records. */
    if (make_set(dir, "short", "dog")) {
        snprintf(path, sizeof path, "%s/short/squad_eval.jsonl", dir);
        REQUIRE(edit_file(path, "{\"window\":1,\"at\":7,\"first\":24,\"count\":10}\n", "") == 0 &&
                    edit_file(path, "\"windows\":9", "\"windows\":8") == 0,
                "edit %s", path);
        snprintf(want, sizeof want, "%s: 8 windows, the eval set %s/short/eval has 9 records (a file of another "
                 "conversion?)", path, dir);
        expect_refused(dir, "short", want, want);
    }
    /* A window whose context runs to its record's end (where [SEP] is). */
    if (make_set(dir, "past", "dog")) {
        snprintf(path, sizeof path, "%s/past/squad_eval.jsonl", dir);
        REQUIRE(edit_file(path, "{\"window\":0,\"at\":9,\"first\":0,\"count\":10}",
                          "{\"window\":0,\"at\":10,\"first\":0,\"count\":10}") == 0,
                "edit %s", path);
        snprintf(want, sizeof want, "%s: window 0 puts its context at positions 10 to 19, past its record's 20 tokens",
                 path);
        expect_refused(dir, "past", want, want);
    }
}

/* Every question answerable: the eval scores SQuAD v1 (never the null answer), the same
 * totals as the scorer given the eval's logits with version_2 off. */
typedef struct span_log {
    float *start, *end;
    int32_t T;
} span_log;

static int keep_span(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    span_log *L = ctx;
    for (int32_t r = 0; r < rows; r++)
        for (int32_t k = 0; k < L->T; k++) {
            L->start[(first + r) * L->T + k] = logits[(r * L->T + k) * 2];
            L->end[(first + r) * L->T + k] = logits[(r * L->T + k) * 2 + 1];
        }
    return 0;
}

/* The eval of a set with (impossible) or without an unanswerable question, whose totals are
 * the scorer's given the eval's logits with version_2 on or off. */
static void check_version(int impossible) {
    const char *dir = tg_test_tmpdir();
    const char *name = impossible ? "v2" : "v1";
    if (!make_set_of(dir, name, "dog", impossible)) return;
    const int n = impossible ? 12 : 9;
    tg_plan plan;
    tg_trainer tr;
    tg_err err = {{0}};
    REQUIRE(open_qa(dir, name, 1, &plan, &tr, &err) == 0, "%s", err.msg);
    span_log L = {calloc((size_t)n * 20, sizeof(float)), calloc((size_t)n * 20, sizeof(float)), 20};
    tg_eval_stats s;
    if (CHECK(L.start && L.end && tr.eval.n == n, "%d windows", tr.eval.n) &&
        CHECK(tg_trainer_eval_logits(&tr, &s, keep_span, &L, &err) == 0, "%s", err.msg)) {
        CHECK(s.questions == 2 + impossible && s.has_ans_total == 2 && s.no_ans_total == impossible,
              "%s: %lld questions, %lld with answers, %lld without", name, (long long)s.questions,
              (long long)s.has_ans_total, (long long)s.no_ans_total);
        tg_qa_postprocess_options opt = {.n_best = plan.run.qa_n_best, .max_answer_len = plan.run.qa_max_answer_length,
                                         .null_threshold = plan.run.qa_null_threshold, .version_2 = impossible};
        tg_squad_totals tot;
        REQUIRE(tg_squad_eval_score(&tr.squad, L.start, L.end, 20, 20, &opt, &tot, &err) == 0, "%s", err.msg);
        CHECK(s.exact == tg_squad_percent(tot.exact, tot.total) && s.f1 == tg_squad_percent(tot.f1, tot.total),
              "%s: exact %g f1 %g, the scorer's %g %g", name, s.exact, s.f1, tg_squad_percent(tot.exact, tot.total),
              tg_squad_percent(tot.f1, tot.total));
    }
    free(L.start), free(L.end);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

TG_TEST(test_trainer_qa_eval_all_answerable_is_v1) { check_version(0); }

/* An unanswerable question first: v2 from the first question on. */
TG_TEST(test_trainer_qa_eval_unanswerable_first_is_v2) { check_version(1); }

/* Each allocation of a qa eval failing in turn: a clean error, and the trainer evaluates
 * as before afterwards. */
TG_TEST(test_trainer_qa_eval_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    if (!make_set(dir, "oom", "dog")) return;
    tg_plan plan;
    tg_trainer tr;
    tg_err err = {{0}};
    REQUIRE(open_qa(dir, "oom", 1, &plan, &tr, &err) == 0, "%s", err.msg);
    tg_eval_stats want, s;
    REQUIRE(tg_trainer_eval(&tr, &want, &err) == 0, "%s", err.msg);
    long k = 0;
    for (;; k++) {
        const long failed = tg_alloc_failures();
        tg_alloc_fail_only(k);
        const int rc = tg_trainer_eval(&tr, &s, &err);
        tg_alloc_fail_after(-1);
        if (tg_alloc_failures() == failed) {
            CHECK(rc == 0 && s.loss == want.loss && s.exact == want.exact && s.f1 == want.f1,
                  "no allocation failed (%ld): rc %d, loss %g (%g)", k, rc, s.loss, want.loss);
            break;
        }
        if (!CHECK(rc == -1 && strstr(err.msg, "out of memory"), "allocation %ld failing: rc %d, '%s'", k, rc, err.msg))
            break;
    }
    CHECK(k > 3, "only %ld allocations in a qa eval", k);
    CHECK(tg_trainer_eval(&tr, &s, &err) == 0 && s.loss == want.loss, "after the failures: %s", err.msg);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

/* Two training sets that differ only in where one answer ends: a checkpoint of one is not
 * resumed with the other (the data's identity hashes each window's end label). */
TG_TEST(test_trainer_qa_checkpoint_identity_covers_answer_ends) {
    const char *dir = tg_test_tmpdir();
    if (!make_set(dir, "ends_a", "dog") || !make_set(dir, "ends_b", "dog ran")) return;
    tg_plan plan;
    tg_trainer tr;
    tg_err err = {{0}};
    tg_checkpoint ck;
    REQUIRE(open_qa(dir, "ends_a", 0, &plan, &tr, &err) == 0, "%s", err.msg);
    const int ok = CHECK(tg_trainer_checkpoint(&tr, &ck, 1, &err) == 0, "%s", err.msg);
    int same_ids = tr.train.n > 0;
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
    if (!ok) return;
    if (CHECK(open_qa(dir, "ends_b", 0, &plan, &tr, &err) == 0, "%s", err.msg)) {
        CHECK(same_ids && tr.train.n > 0, "no training windows");
        CHECK(tg_trainer_restore(&tr, &ck, "ck", &err) == -1 && strstr(err.msg, "the checkpoint is of another job") &&
                  strstr(err.msg, "train_data.xxh64") && !strstr(err.msg, "train_data.examples"),
              "answer ends changed: '%s'", err.msg);
        tg_trainer_close(&tr);
        tg_plan_free(&plan);
    }
    tg_checkpoint_free(&ck);
}
