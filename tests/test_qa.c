/* task = qa end to end on the CPU: the SQuAD eval file (datasets/squad_eval.h) written and
 * read back, its refusals, and a tiny SQuAD v2 file converted with the byte-level stand-in
 * tokenizer, trained a few steps on BERT and RoBERTa with the span head, and evaluated: the
 * trainer's exact and F1 against the same logits post-processed here by brute force (every
 * context span of at most 30 tokens, the null score, the threshold) and scored; then
 * exported as a Hugging Face folder, loaded back, and run by `tunegraph predict`. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "datasets/convert.h"
#include "datasets/shard_format.h"
#include "datasets/squad_eval.h"
#include "plan/validate.h"
#include "runtime/trainer.h"
#include "tests/byte_encoder.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* ---- the eval file ---------------------------------------------------------------------- */

static char *write_sample(size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    tg_err err = {{0}};
    const int64_t s[] = {0, 4, 8}, e[] = {3, 7, 12};
    const char *answers[] = {"cat", "dog"};
    const size_t lens[] = {3, 3};
    int rc = tg_squad_eval_put_context(f, "s", "cat dog bird", 12, s, e, 3, &err) ||
             tg_squad_eval_put_question(f, "s", "q1", 0, answers, lens, 2, &err) ||
             tg_squad_eval_put_window(f, "s", 0, 4, 0, 3, &err) || tg_squad_eval_put_window(f, "s", 0, 4, 1, 2, &err) ||
             tg_squad_eval_put_question(f, "s", "q\"2", 0, NULL, NULL, 0, &err) ||
             tg_squad_eval_put_window(f, "s", 1, 5, 0, 3, &err) || tg_squad_eval_put_end(f, "s", 1, 2, 3, &err);
    fclose(f);
    CHECK(rc == 0, "%s", err.msg);
    return buf;
}

TG_TEST(test_squad_eval_file_round_trip) {
    size_t len;
    char *text = write_sample(&len);
    REQUIRE(text, "open_memstream");
    tg_squad_eval ev;
    tg_err err = {{0}};
    REQUIRE(tg_squad_eval_parse("s.jsonl", text, len, &ev, &err) == 0, "%s", err.msg);
    CHECK(ev.n_contexts == 1 && ev.n_questions == 2 && ev.n_windows == 3 && ev.n_answers == 2 && ev.n_offsets == 3,
          "counts %d %d %d %lld", ev.n_contexts, ev.n_questions, ev.n_windows, (long long)ev.n_answers);
    CHECK(!strcmp(ev.contexts[0].text, "cat dog bird") && ev.offsets[4] == 8 && ev.offsets[5] == 12, "context");
    CHECK(!strcmp(ev.questions[1].id, "q\"2") && ev.questions[1].n_answers == 0 && ev.questions[0].n_answers == 2 &&
              !strcmp(ev.answers[1], "dog") && ev.answer_len[1] == 3,
          "questions");
    CHECK(ev.windows[1].question == 0 && ev.windows[1].at == 4 && ev.windows[1].first == 1 &&
              ev.windows[1].count == 2 && ev.windows[2].question == 1 && ev.questions[0].first_window == 0 &&
              ev.questions[0].n_windows == 2 && ev.questions[1].first_window == 2 && ev.questions[1].n_windows == 1,
          "windows");
    /* Scoring: positions 4.. hold "cat" "dog" "bird" (window 0); the start logit peaks on
     * "dog" and the end on "dog": q1 answers "dog" (exact). q2's windows favour [CLS]. */
    enum { T = 9 };
    float start[3 * T] = {0}, end[3 * T] = {0};
    start[0 * T + 5] = 5, end[0 * T + 5] = 5; /* window 0: dog */
    start[1 * T + 0] = 1, end[1 * T + 0] = 1; /* window 1: a null score of 2 beats nothing */
    start[2 * T + 0] = 9, end[2 * T + 0] = 9; /* q2: null */
    tg_qa_postprocess_options opt = {.n_best = 20, .max_answer_len = 30, .version_2 = 1};
    tg_squad_totals tot;
    REQUIRE(tg_squad_eval_score(&ev, start, end, T, T, &opt, &tot, &err) == 0, "%s", err.msg);
    CHECK(tot.total == 2 && tot.exact == 2 && tot.has_total == 1 && tot.no_total == 1, "totals %lld exact %g",
          (long long)tot.total, tot.exact);
    /* Positions past the record length are never candidates: with 5 positions, window 0
     * offers "cat" alone. */
    start[0 * T + 4] = 4, end[0 * T + 4] = 4;
    REQUIRE(tg_squad_eval_score(&ev, start, end, T, 5, &opt, &tot, &err) == 0, "%s", err.msg);
    CHECK(tot.has_exact == 1 && tot.exact == 2, "cut windows: HasAns exact %g", tot.has_exact);
    tg_squad_eval_free(&ev);
    free(text);
}

static void expect_refusal(const char *text, const char *want) {
    tg_squad_eval ev;
    tg_err err = {{0}};
    int rc = tg_squad_eval_parse("e.jsonl", text, strlen(text), &ev, &err);
    CHECK(rc == -1 && strstr(err.msg, want), "'%s': rc %d, '%s' lacks '%s'", text, rc, err.msg, want);
    if (rc == 0) tg_squad_eval_free(&ev);
}

TG_TEST(test_squad_eval_file_refusals) {
    const char *ctx = "{\"context\": \"ab\", \"offsets\": [0, 1, 1, 2]}\n";
    const char *q = "{\"question\": \"x\", \"context\": 0, \"answers\": [\"a\"]}\n";
    char text[1024];
    expect_refusal("", "no end line (the file is cut short)");
    expect_refusal("[1]\n", "e.jsonl:1: each line must be an object");
    expect_refusal("{\"context\": \"ab\", \"offsets\": [0, 1, 1, 3]}\n", "e.jsonl:1: offsets[3] is not a byte offset");
    expect_refusal("{\"context\": \"ab\", \"offsets\": [0, 1, 1]}\n", "\"offsets\" must be an array of byte pairs");
    expect_refusal("{\"context\": \"ab\", \"offsets\": [1, 0]}\n", "token 0 ends (byte 0) before it starts (byte 1)");
    expect_refusal("{\"context\": \"ab\", \"offsets\": [], \"x\": 1}\n", "e.jsonl:1: unknown key \"x\"");
    expect_refusal("{\"context\": \"ab\", \"context\": \"ab\", \"offsets\": []}\n", "key \"context\" appears twice");
    expect_refusal(q, "e.jsonl:1: a question before any context");
    snprintf(text, sizeof text, "%s{\"question\": \"x\", \"context\": 1, \"answers\": []}\n", ctx);
    expect_refusal(text, "e.jsonl:2: \"context\" = 1 is outside [0, 0]");
    snprintf(text, sizeof text, "%s{\"question\": \"x\", \"context\": 0, \"answers\": [3]}\n", ctx);
    expect_refusal(text, "answers[0] must be a string");
    snprintf(text, sizeof text, "%s{\"window\": 0, \"at\": 1, \"first\": 0, \"count\": 1}\n", ctx);
    expect_refusal(text, "e.jsonl:2: a window before any question");
    snprintf(text, sizeof text, "%s%s{\"window\": 0, \"at\": 1, \"first\": 1, \"count\": 2}\n", ctx, q);
    expect_refusal(text, "e.jsonl:3: \"count\" = 2 is outside [0, 1]");
    snprintf(text, sizeof text,
             "%s%s{\"window\": 0, \"at\": 1, \"first\": 0, \"count\": 1}\n%s{\"window\": 1, \"at\": 1, \"first\": 0, "
             "\"count\": 1}\n{\"window\": 0, \"at\": 1, \"first\": 0, \"count\": 1}\n",
             ctx, q, q);
    expect_refusal(text, "e.jsonl:6: a window of question 0 after another question's");
    snprintf(text, sizeof text, "%s%s{\"window\": 0, \"at\": 1.5, \"first\": 1, \"count\": 0}\n", ctx, q);
    expect_refusal(text, "\"at\" must be a whole number");
    snprintf(text, sizeof text, "%s%s{\"end\": {\"contexts\": 1, \"questions\": 1, \"windows\": 1}}\n", ctx, q);
    expect_refusal(text, "e.jsonl:3: the end line counts 1 windows, the file has 0");
    snprintf(text, sizeof text, "%s%s{\"end\": {\"contexts\": 1, \"questions\": 1, \"windows\": 0}}\n%s", ctx, q, ctx);
    expect_refusal(text, "e.jsonl:4: a line after the end line");
    expect_refusal("{\"end\": 3}\n", "\"end\" must be the line's only key");
    expect_refusal("{\"other\": 3}\n", "a line that is no context, question, window or end");
    expect_refusal("{\"context\": 3, \"offsets\": []}\n", "\"context\" must be a string");
    expect_refusal("{oops\n", "e.jsonl:1: invalid JSON");
}

/* ---- converted, trained and evaluated -------------------------------------------------- */

/* Two articles (each its own split with eval_fraction 0.5), contexts long enough for two
 * windows at seq 20; answerable and unanswerable questions. */
static const char squad_text[] =
    "{\"version\": \"v2.0\", \"data\": ["
    "{\"title\": \"a\", \"paragraphs\": [{\"context\": \"the cat sat on the mat by the door\", \"qas\": ["
    "{\"id\": \"a1\", \"question\": \"who sat\", \"answers\": [{\"text\": \"cat\", \"answer_start\": 4}]},"
    "{\"id\": \"a2\", \"question\": \"where\", \"answers\": [{\"text\": \"the mat\", \"answer_start\": 15},"
    " {\"text\": \"mat\", \"answer_start\": 19}]},"
    "{\"id\": \"a3\", \"question\": \"why\", \"answers\": [], \"is_impossible\": true}]}]},"
    "{\"title\": \"b\", \"paragraphs\": [{\"context\": \"a dog ran far away into the park\", \"qas\": ["
    "{\"id\": \"b1\", \"question\": \"who ran\", \"answers\": [{\"text\": \"dog\", \"answer_start\": 2}]},"
    "{\"id\": \"b2\", \"question\": \"when\", \"answers\": [], \"is_impossible\": true},"
    "{\"id\": \"b3\", \"question\": \"to\", \"answers\": [{\"text\": \"the park\", \"answer_start\": 24}]}]}]}]}";

typedef struct logits_log {
    float *start, *end; /* [windows, T] */
    int32_t T, n;
} logits_log;

static int keep_logits(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    logits_log *L = ctx;
    for (int32_t r = 0; r < rows; r++)
        for (int32_t t = 0; t < L->T; t++) {
            L->start[(int64_t)(first + r) * L->T + t] = logits[((int64_t)r * L->T + t) * 2];
            L->end[(int64_t)(first + r) * L->T + t] = logits[((int64_t)r * L->T + t) * 2 + 1];
        }
    L->n += rows;
    return 0;
}

/* The answer of question q by brute force over its windows (every window holds at most
 * 20 positions, so HF's n_best of 20 starts and ends leaves none out), and its scores. */
static void brute_force(const tg_squad_eval *ev, const logits_log *L, int32_t q, int version_2, double *exact,
                        double *f1) {
    const tg_squad_eval_question *qq = &ev->questions[q];
    const tg_squad_eval_context *c = &ev->contexts[qq->context];
    float best = -INFINITY, null = INFINITY;
    int64_t bs = -1, be = -1;
    for (int32_t w = 0; w < ev->n_windows; w++) {
        const tg_squad_eval_window *win = &ev->windows[w];
        if (win->question != q) continue;
        const float *S = L->start + (int64_t)w * L->T, *E = L->end + (int64_t)w * L->T;
        if (S[0] + E[0] < null) null = S[0] + E[0];
        for (int32_t a = 0; a < win->count; a++)
            for (int32_t b = a; b < win->count && b - a + 1 <= 30; b++) {
                const float score = S[win->at + a] + E[win->at + b];
                if (score > best) {
                    best = score;
                    bs = ev->offsets[2 * (c->first_offset + win->first + a)];
                    be = ev->offsets[2 * (c->first_offset + win->first + b) + 1];
                }
            }
    }
    const char *text = c->text + bs;
    size_t len = (size_t)(be - bs);
    if (version_2 && null - best > 0) text = "", len = 0;
    tg_err err = {{0}};
    CHECK(tg_squad_score(text, len, (const char *const *)ev->answers + qq->first_answer,
                         ev->answer_len + qq->first_answer, qq->n_answers, exact, f1, &err) == 0,
          "%s", err.msg);
}

/* `tunegraph predict` of the exported folder on the eval windows: a start and an end logit
 * per real token, equal to those the trainer's eval saw (L), the answer positions, and the
 * same loss. */
static void check_predict(const char *dir, const char *job_text, const char *hf, const tg_trainer *tr,
                          const logits_log *L, double eval_loss) {
    char job[800], out[800], line[2400];
    snprintf(job, sizeof job, "%s/qa.job", dir);
    snprintf(out, sizeof out, "%s/qa-logits.jsonl", dir);
    REQUIRE(tg_test_write_file(job, job_text) == 0, "%s", job);
    snprintf(line, sizeof line, "predict %s --set model=%s -o %s --device cpu --threads 1", job, hf, out);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "%s: exit %d: %s", line, r.status, r.err ? r.err : "(nothing)");
    const char *at = r.err ? strstr(r.err, "predicted ") : NULL;
    int examples = 0;
    double loss = -1;
    CHECK(at && sscanf(at, "predicted %d examples on cpu: loss %lf", &examples, &loss) == 2, "report: %s",
          r.err ? r.err : "");
    tg_cli_run_free(&r);
    char *text = tg_test_read_file(out, NULL);
    REQUIRE(text, "%s", out);
    int n = 0, bad = 0;
    double worst = 0;
    for (char *l = strtok(text, "\n"); l; l = strtok(NULL, "\n"), n++) {
        json_error_t e;
        json_t *o = json_loads(l, 0, &e), *rows = json_object_get(o, "logits");
        const tg_example *ex = n < tr->eval.n ? &tr->eval.examples[n] : NULL;
        int ok = o && ex && json_array_size(rows) == (size_t)ex->len &&
                 json_integer_value(json_object_get(o, "start_position")) == ex->label &&
                 json_integer_value(json_object_get(o, "end_position")) == ex->label_end;
        for (size_t t = 0; ok && t < json_array_size(rows); t++) {
            json_t *row = json_array_get(rows, t);
            ok = json_array_size(row) == 2;
            worst = fmax(worst, fabs(json_number_value(json_array_get(row, 0)) - L->start[(int64_t)n * L->T + (int64_t)t]));
            worst = fmax(worst, fabs(json_number_value(json_array_get(row, 1)) - L->end[(int64_t)n * L->T + (int64_t)t]));
        }
        if (!ok && bad++ < 3) CHECK(0, "line %d: %.200s", n, l);
        json_decref(o);
    }
    free(text);
    CHECK(n == tr->eval.n && examples == n && !bad, "%d lines, %d reported, %d windows", n, examples, tr->eval.n);
    CHECK(worst <= 1e-6, "predict's logits differ from the eval's by %g", worst);
    CHECK(fabs(loss - eval_loss) <= 0.00005 + 1e-6, "predict's loss %.4f, the eval's %.6f", loss, eval_loss);
}

/* The parameter `name`'s values (numel floats). */
static float *param_values(tg_trainer *tr, const char *name, int64_t *numel) {
    const tg_plan *p = tr->plan;
    for (int t = 0; t < p->n_tensors; t++) {
        if (strcmp(p->tensors[t].name, name) || !(p->tensors[t].flags & TG_TENSOR_PARAM)) continue;
        *numel = tg_tensor_numel(&p->tensors[t]);
        float *v = malloc(sizeof(float) * (size_t)*numel);
        tg_err err;
        if (v && tg_trainer_read_f32(tr, t, v, &err) == 0) return v;
        free(v);
    }
    return NULL;
}

/* The head's values in tr against a trainer opened on `model` (a folder): equal when the
 * folder holds them, else HF's init (normal(0, initializer_range), bias 0). */
static void check_head_loaded(tg_trainer *tr, const char *model, int from_folder) {
    char job_text[1024];
    snprintf(job_text, sizeof job_text, "model = %s\ntask = qa\nbatch = 4\nseq = 20\nsteps = 1\ntrain_data = x\n", model);
    tg_job job;
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text(job_text, "qa.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    tg_trainer t2;
    tg_trainer_options opts = {.device = TG_DEVICE_CPU, .load_data = 0};
    if (CHECK(tg_trainer_open(&t2, &plan, &opts, &err) == 0, "%s", err.msg)) {
        int64_t n = 0, m = 0, nb = 0, mb = 0;
        float *w0 = param_values(tr, "qa_outputs.weight", &n), *w1 = param_values(&t2, "qa_outputs.weight", &m);
        float *b0 = param_values(tr, "qa_outputs.bias", &nb), *b1 = param_values(&t2, "qa_outputs.bias", &mb);
        REQUIRE(w0 && w1 && b0 && b1 && n == m && n == 2 * 32 && nb == 2 && mb == 2, "qa_outputs parameters");
        if (from_folder) {
            CHECK(t2.weights.missing == 0 && !memcmp(w0, w1, sizeof(float) * (size_t)n) &&
                      !memcmp(b0, b1, sizeof(float) * 2),
                  "the exported head did not load back (%d missing, first %s)", t2.weights.missing,
                  t2.weights.first_missing);
        } else {
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)w1[i] * w1[i];
            const double sd = sqrt(ss / (double)n);
            CHECK(sd > 0.01 && sd < 0.03 && b1[0] == 0.0f && b1[1] == 0.0f, "new head: weight sd %g, bias %g %g", sd,
                  b1[0], b1[1]);
        }
        free(w0), free(w1), free(b0), free(b1);
        tg_trainer_close(&t2);
    }
    tg_plan_free(&plan);
}

static void train_and_eval(const char *dir, const char *model_json, tg_tokenizer_family family) {
    char model_dir[700], squad[700], out[700], job_text[2048];
    snprintf(model_dir, sizeof model_dir, "%s/model", dir);
    snprintf(squad, sizeof squad, "%s/train.json", dir);
    snprintf(out, sizeof out, "%s/set", dir);
    REQUIRE(mkdir(model_dir, 0755) == 0, "mkdir %s", model_dir);
    char cfg[800];
    snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);
    tg_test_write_file(cfg, model_json);
    tg_test_write_file(squad, squad_text);

    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, family);
    const char *inputs[] = {squad};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_SQUAD, .seq = 20,
                            .doc_stride = 4, .eval_fraction = 0.5, .seed = 3, .command = "test"};
    tg_convert_report rep;
    tg_err err = {{0}};
    int rc = tg_convert(&o, &enc, &rep, &err);
    byte_encoder_free(&be);
    REQUIRE(rc == 0, "%s", err.msg);
    REQUIRE(rep.records[TG_SPLIT_EVAL] > 3 && rep.records[TG_SPLIT_TRAIN] > 3, "records %lld / %lld",
            (long long)rep.records[0], (long long)rep.records[1]);

    snprintf(job_text, sizeof job_text,
             "model = %s\ntask = qa\nbatch = 4\nseq = 20\nsteps = 6\nlr = 1e-3\nwarmup_steps = 0\n"
             "train_data = %s\neval_data = %s/eval\n",
             model_dir, out, out);
    tg_job job;
    tg_plan plan;
    REQUIRE(tg_job_parse_text(job_text, "qa.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options opts = {.device = TG_DEVICE_CPU, .load_data = 1, .threads = 2};
    if (!CHECK(tg_trainer_open(&tr, &plan, &opts, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return;
    }
    float first = NAN, last = NAN;
    for (int i = 0; i < 6; i++) {
        tg_step_stats st;
        if (!CHECK(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg)) break;
        if (i == 0) first = st.loss;
        last = st.loss;
    }
    CHECK(isfinite(first) && first > 0 && last < first, "loss %g -> %g", first, last);

    logits_log L = {.T = 20};
    L.start = calloc((size_t)tr.eval.n * 20, sizeof(float));
    L.end = calloc((size_t)tr.eval.n * 20, sizeof(float));
    tg_eval_stats ev;
    REQUIRE(L.start && L.end, "out of memory");
    if (CHECK(tg_trainer_eval_logits(&tr, &ev, keep_logits, &L, &err) == 0, "%s", err.msg)) {
        CHECK(L.n == tr.eval.n && ev.examples == tr.eval.n && isfinite(ev.loss) && ev.accuracy == -1 &&
                  ev.perplexity == -1,
              "eval of %d windows: %d seen, loss %g", tr.eval.n, L.n, ev.loss);
        const tg_squad_eval *s = &tr.squad;
        CHECK(ev.questions == 3 && ev.questions == s->n_questions && ev.has_ans_total + ev.no_ans_total == 3,
              "%lld questions", (long long)ev.questions);
        int version_2 = 0;
        for (int32_t q = 0; q < s->n_questions; q++) version_2 |= s->questions[q].n_answers == 0;
        CHECK(version_2, "the eval article has an unanswerable question");
        double exact = 0, f1 = 0, has_exact = 0, no_exact = 0;
        for (int32_t q = 0; q < s->n_questions; q++) {
            double e, f;
            brute_force(s, &L, q, version_2, &e, &f);
            exact += e, f1 += f;
            if (s->questions[q].n_answers) has_exact += e;
            else no_exact += e;
        }
        CHECK(fabs(ev.exact - 100.0 * exact / 3) < 1e-9 && fabs(ev.f1 - 100.0 * f1 / 3) < 1e-9,
              "exact %g F1 %g, by brute force %g %g", ev.exact, ev.f1, 100.0 * exact / 3, 100.0 * f1 / 3);
        CHECK(fabs(ev.has_ans_exact - tg_squad_percent(has_exact, ev.has_ans_total)) < 1e-9 &&
                  fabs(ev.no_ans_exact - tg_squad_percent(no_exact, ev.no_ans_total)) < 1e-9,
              "HasAns exact %g, NoAns exact %g", ev.has_ans_exact, ev.no_ans_exact);
    }
    /* Exported as a Hugging Face folder (...ForQuestionAnswering), the head loads back. */
    char hf[800];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    const tg_hf_export_options eo = {.out_dir = hf};
    if (CHECK(tg_trainer_export_hf(&tr, &eo, &err) == 0, "%s", err.msg)) {
        char cfg_path[900];
        snprintf(cfg_path, sizeof cfg_path, "%s/config.json", hf);
        FILE *f = fopen(cfg_path, "r");
        char text[8192] = "";
        if (f) text[fread(text, 1, sizeof text - 1, f)] = 0, fclose(f);
        CHECK(strstr(text, family == TG_TOKENIZER_BPE_ROBERTA ? "\"RobertaForQuestionAnswering\""
                                                              : "\"BertForQuestionAnswering\""),
              "config.json: %s", text);
        check_head_loaded(&tr, hf, 1);
        check_predict(dir, job_text, hf, &tr, &L, ev.loss);
    }
    free(L.start), free(L.end);
    /* The model folder has no weights: the head starts as HF initialises it. */
    check_head_loaded(&tr, model_dir, 0);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

static const char bert_json[] =
    "{\"architectures\": [\"BertForQuestionAnswering\"], \"model_type\": \"bert\", \"vocab_size\": 261, "
    "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 37, "
    "\"max_position_embeddings\": 40, \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", \"layer_norm_eps\": 1e-12, "
    "\"initializer_range\": 0.02, \"hidden_dropout_prob\": 0.1, \"attention_probs_dropout_prob\": 0.1, "
    "\"pad_token_id\": 0}";
static const char roberta_json[] =
    "{\"architectures\": [\"RobertaForQuestionAnswering\"], \"model_type\": \"roberta\", \"vocab_size\": 261, "
    "\"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 37, "
    "\"max_position_embeddings\": 42, \"type_vocab_size\": 1, \"hidden_act\": \"gelu\", \"layer_norm_eps\": 1e-5, "
    "\"initializer_range\": 0.02, \"hidden_dropout_prob\": 0.0, \"attention_probs_dropout_prob\": 0.0, "
    "\"pad_token_id\": 1}";

TG_TEST(test_qa_bert_trains_and_scores_squad) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/bert", tg_test_tmpdir());
    REQUIRE(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    train_and_eval(dir, bert_json, TG_TOKENIZER_WORDPIECE);
}

TG_TEST(test_qa_roberta_trains_and_scores_squad) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/roberta", tg_test_tmpdir());
    REQUIRE(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    train_and_eval(dir, roberta_json, TG_TOKENIZER_BPE_ROBERTA);
}

/* The compiler's refusals and the data a qa job takes. */
TG_TEST(test_qa_job_refusals) {
    tg_job job;
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text("model = tiny-gpt2\ntask = qa\nsteps = 1\ntrain_data = x\n", "j", NULL, NULL, 0, &job,
                              &err) == 0,
            "%s", err.msg);
    CHECK(tg_compile(&job, &plan, &err) == -1 && strstr(err.msg, "task qa needs an encoder (bert or roberta family)"),
          "gpt2: '%s'", err.msg);
    const tg_data_rules rules = {TG_TASK_QA, 2, 128, 2, 0, 0};
    tg_dataset ds;
    CHECK(tg_dataset_load("examples/data/sentiment-train.jsonl", &rules, &ds, &err) == -1 &&
              strstr(err.msg, "task qa reads a shard set made by `tunegraph data convert --format squad`"),
          "jsonl: '%s'", err.msg);
}

/* ---- the eval's post-processing keys (qa_n_best, qa_max_answer_length, qa_null_threshold) -- */

/* The run keys: their defaults (run_qa's 20, 30 and 0), values from a job file, --set on a
 * compiled plan, and the refusals, each naming the key. */
TG_TEST(test_qa_eval_keys_job_and_plan) {
    tg_job job;
    tg_err err = {{0}};
    static const char base[] = "model = tiny-bert\ntask = qa\nbatch = 2\nseq = 20\nsteps = 1\ntrain_data = x\n";
    REQUIRE(tg_job_parse_text(base, "j", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    tg_plan_run run;
    tg_job_run_settings(&job, &run);
    CHECK(run.qa_n_best == 20 && run.qa_max_answer_length == 30 && run.qa_null_threshold == 0.0f,
          "defaults %d %d %g", run.qa_n_best, run.qa_max_answer_length, (double)run.qa_null_threshold);
    char text[512];
    snprintf(text, sizeof text, "%sqa_n_best = 3\nqa_max_answer_length = 2\nqa_null_threshold = -1.5\n", base);
    REQUIRE(tg_job_parse_text(text, "j", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    tg_plan plan;
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    CHECK(plan.run.qa_n_best == 3 && plan.run.qa_max_answer_length == 2 && plan.run.qa_null_threshold == -1.5f,
          "plan %d %d %g", plan.run.qa_n_best, plan.run.qa_max_answer_length, (double)plan.run.qa_null_threshold);
    /* Run keys: a compiled plan takes them with --set. */
    const char *sets[] = {"qa_n_best=1", "qa_max_answer_length=64", "qa_null_threshold=2.25"};
    REQUIRE(tg_job_apply_run_overrides(&plan.run, 1, sets, 3, "p.tgp", &err) == 0, "%s", err.msg);
    CHECK(plan.run.qa_n_best == 1 && plan.run.qa_max_answer_length == 64 && plan.run.qa_null_threshold == 2.25f,
          "--set %d %d %g", plan.run.qa_n_best, plan.run.qa_max_answer_length, (double)plan.run.qa_null_threshold);
    static const struct {
        const char *set, *want;
    } bad[] = {
        {"qa_n_best=0", "--set qa_n_best=0: key 'qa_n_best': 0 is out of range (must be 1..1024; answer candidates kept)"},
        {"qa_n_best=1025", "key 'qa_n_best': 1025 is out of range (must be 1..1024"},
        {"qa_n_best=two", "key 'qa_n_best': 'two' is not an integer"},
        {"qa_max_answer_length=0", "key 'qa_max_answer_length': 0 is out of range (must be 1..2147483647; tokens)"},
        {"qa_max_answer_length=-3", "key 'qa_max_answer_length': -3 is out of range"},
        {"qa_null_threshold=nan", "key 'qa_null_threshold': 'nan' is not a number"},
        {"qa_null_threshold=inf", "key 'qa_null_threshold': inf is not a finite 32-bit float"},
        {"qa_null_threshold=1e39", "key 'qa_null_threshold': 1e39 is not a finite 32-bit float"},
        {"qa_null_threshold=zero", "key 'qa_null_threshold': 'zero' is not a number"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        tg_job j2;
        tg_err e2 = {{0}};
        int rc = tg_job_parse_text(base, "j", NULL, &bad[k].set, 1, &j2, &e2);
        CHECK(rc == -1 && strstr(e2.msg, bad[k].want), "%s: %d '%s'", bad[k].set, rc, e2.msg);
        tg_plan_run r2 = plan.run;
        e2.msg[0] = 0;
        rc = tg_job_apply_run_overrides(&r2, 1, &bad[k].set, 1, "p.tgp", &e2);
        CHECK(rc == -1 && strstr(e2.msg, bad[k].want), "--set on a plan, %s: %d '%s'", bad[k].set, rc, e2.msg);
    }
    /* A plan file holding values the keys refuse is refused when read. */
    static const struct {
        int32_t n_best, max_len;
        float threshold;
        const char *want;
    } plans[] = {
        {0, 30, 0, "p: run qa_n_best 0 is not in [1, 1024]"},
        {1025, 30, 0, "p: run qa_n_best 1025 is not in [1, 1024]"},
        {20, 0, 0, "p: run qa_max_answer_length 0 is below 1"},
        {20, 30, INFINITY, "p: run qa_null_threshold inf is not finite"},
        {20, 30, NAN, "p: run qa_null_threshold nan is not finite"},
    };
    for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
        tg_plan_run keep = plan.run;
        plan.run.qa_n_best = plans[k].n_best, plan.run.qa_max_answer_length = plans[k].max_len;
        plan.run.qa_null_threshold = plans[k].threshold;
        tg_err e2 = {{0}};
        const int rc = tg_plan_validate_tables(&plan, "p", &e2);
        CHECK(rc == -1 && strstr(e2.msg, plans[k].want), "plan case %zu: %d '%s'", k, rc, e2.msg);
        plan.run = keep;
    }
    tg_plan_free(&plan);
}

/* One question over one window of 8 positions: [CLS], three question tokens, then the
 * context "cat dog bird" (positions 4, 5, 6), and position 7 past it; `answer` its only
 * answer. */
static int one_window_eval(const char *answer, tg_squad_eval *ev) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return -1;
    tg_err err = {{0}};
    const int64_t s[] = {0, 4, 8}, e[] = {3, 7, 12};
    const size_t alen = strlen(answer);
    int rc = tg_squad_eval_put_context(f, "s", "cat dog bird", 12, s, e, 3, &err) ||
             tg_squad_eval_put_question(f, "s", "q", 0, &answer, &alen, 1, &err) ||
             tg_squad_eval_put_window(f, "s", 0, 4, 0, 3, &err) || tg_squad_eval_put_end(f, "s", 1, 1, 1, &err);
    fclose(f);
    rc = rc || tg_squad_eval_parse("s.jsonl", buf, len, ev, &err);
    free(buf);
    return CHECK(rc == 0, "%s", err.msg) ? 0 : -1;
}

/* The exact match of the one question under opt, with logits s and e. */
static double one_window_exact(const char *answer, const float *s, const float *e, int32_t n_best, int32_t max_len,
                               double threshold) {
    tg_squad_eval ev;
    if (one_window_eval(answer, &ev)) return -1;
    tg_qa_postprocess_options opt = {.n_best = n_best, .max_answer_len = max_len, .null_threshold = threshold,
                                     .version_2 = 1};
    tg_squad_totals tot;
    tg_err err = {{0}};
    const int rc = tg_squad_eval_score(&ev, s, e, 8, 8, &opt, &tot, &err);
    tg_squad_eval_free(&ev);
    return CHECK(rc == 0, "%s", err.msg) ? tot.exact : -1;
}

/* Logits where each setting changes the answer. n_best: the highest start ("bird") lies
 * after the highest end ("cat"), so one of each leaves no span, and 20 find "cat".
 * max_answer_length: the start peaks on "cat" and the end on "bird", a 3-token answer that
 * 2 tokens cannot hold. null_threshold: [CLS] scores 4 against "cat"'s 6, a difference of
 * -2: a threshold below it answers null. */
TG_TEST(test_qa_eval_keys_change_the_answers) {
    float s[8] = {0}, e[8] = {0};
    s[6] = 5, s[4] = 4, e[4] = 5;
    CHECK(one_window_exact("cat", s, e, 20, 30, 0) == 1 && one_window_exact("cat", s, e, 1, 30, 0) == 0,
          "n_best 20 and 1: exact %g and %g", one_window_exact("cat", s, e, 20, 30, 0),
          one_window_exact("cat", s, e, 1, 30, 0));
    memset(s, 0, sizeof s), memset(e, 0, sizeof e);
    s[4] = 5, e[6] = 5;
    CHECK(one_window_exact("cat dog bird", s, e, 20, 30, 0) == 1 && one_window_exact("cat dog bird", s, e, 20, 2, 0) == 0,
          "max_answer_length 30 and 2: exact %g and %g", one_window_exact("cat dog bird", s, e, 20, 30, 0),
          one_window_exact("cat dog bird", s, e, 20, 2, 0));
    memset(s, 0, sizeof s), memset(e, 0, sizeof e);
    s[4] = e[4] = 3, s[0] = e[0] = 2;
    CHECK(one_window_exact("cat", s, e, 20, 30, 0) == 1 && one_window_exact("cat", s, e, 20, 30, -2.5) == 0 &&
              one_window_exact("cat", s, e, 20, 30, -1.5) == 1,
          "null_threshold 0, -2.5 and -1.5: exact %g, %g and %g", one_window_exact("cat", s, e, 20, 30, 0),
          one_window_exact("cat", s, e, 20, 30, -2.5), one_window_exact("cat", s, e, 20, 30, -1.5));
}

/* The trainer's qa eval scores with the plan's run settings: for each, its exact and F1
 * are those of the post-processing of its own logits under the same options, and the
 * thresholds that answer every question null and none give other scores. */
TG_TEST(test_qa_eval_keys_reach_the_trainer) {
    char dir[600], model_dir[700], squad[700], out[700], cfg[800], job_text[2048];
    snprintf(dir, sizeof dir, "%s/keys", tg_test_tmpdir());
    REQUIRE(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    snprintf(model_dir, sizeof model_dir, "%s/model", dir);
    snprintf(squad, sizeof squad, "%s/train.json", dir);
    snprintf(out, sizeof out, "%s/set", dir);
    REQUIRE(mkdir(model_dir, 0755) == 0, "mkdir %s", model_dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", model_dir);
    tg_test_write_file(cfg, bert_json);
    tg_test_write_file(squad, squad_text);
    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    const char *inputs[] = {squad};
    tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_SQUAD, .seq = 20,
                            .doc_stride = 4, .eval_fraction = 0.5, .seed = 3, .command = "test"};
    tg_convert_report rep;
    tg_err err = {{0}};
    const int rc = tg_convert(&o, &enc, &rep, &err);
    byte_encoder_free(&be);
    REQUIRE(rc == 0, "%s", err.msg);
    snprintf(job_text, sizeof job_text,
             "model = %s\ntask = qa\nbatch = 4\nseq = 20\nsteps = 1\ntrain_data = %s\neval_data = %s/eval\n", model_dir,
             out, out);
    tg_job job;
    tg_plan plan;
    REQUIRE(tg_job_parse_text(job_text, "qa.job", NULL, NULL, 0, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options opts = {.device = TG_DEVICE_CPU, .load_data = 1, .threads = 1};
    REQUIRE(tg_trainer_open(&tr, &plan, &opts, &err) == 0, "%s", err.msg);
    logits_log L = {.T = 20};
    L.start = calloc((size_t)tr.eval.n * 20, sizeof(float));
    L.end = calloc((size_t)tr.eval.n * 20, sizeof(float));
    tg_eval_stats first;
    REQUIRE(L.start && L.end, "out of memory");
    REQUIRE(tg_trainer_eval_logits(&tr, &first, keep_logits, &L, &err) == 0, "%s", err.msg);
    int unanswerable = 0;
    for (int32_t q = 0; q < tr.squad.n_questions; q++) unanswerable += tr.squad.questions[q].n_answers == 0;
    REQUIRE(unanswerable > 0 && unanswerable < tr.squad.n_questions, "%d of %d questions unanswerable", unanswerable,
            tr.squad.n_questions);
    /* The settings: the defaults; thresholds that answer every question null (-1e30) and
     * none (1e30); then, never null, run_qa's n_best and max_answer_length against the
     * smallest values that change the scores of these logits (so that the trainer's scores
     * show the setting was used). */
    enum { SETTINGS = 5 };
    int32_t n_best[SETTINGS] = {20, 20, 20, 20, 20}, max_len[SETTINGS] = {30, 30, 30, 30, 30};
    float threshold[SETTINGS] = {0, -1e30f, 1e30f, 1e30f, 1e30f};
    double exact[SETTINGS], f1[SETTINGS];
    for (int k = 0; k < SETTINGS; k++) {
        for (int32_t v = 1; k >= 3 && v < 20; v++) {
            if (k == 3) n_best[k] = v;
            else max_len[k] = v;
            tg_qa_postprocess_options opt = {.n_best = n_best[k], .max_answer_len = max_len[k],
                                             .null_threshold = threshold[k], .version_2 = 1};
            tg_squad_totals tot;
            REQUIRE(tg_squad_eval_score(&tr.squad, L.start, L.end, 20, 20, &opt, &tot, &err) == 0, "%s", err.msg);
            if (tg_squad_percent(tot.f1, tot.total) != f1[2]) break;
        }
        plan.run.qa_n_best = n_best[k], plan.run.qa_max_answer_length = max_len[k];
        plan.run.qa_null_threshold = threshold[k];
        tg_eval_stats ev;
        REQUIRE(tg_trainer_eval(&tr, &ev, &err) == 0, "%s", err.msg);
        tg_qa_postprocess_options opt = {.n_best = n_best[k], .max_answer_len = max_len[k],
                                         .null_threshold = threshold[k], .version_2 = 1};
        tg_squad_totals tot;
        REQUIRE(tg_squad_eval_score(&tr.squad, L.start, L.end, 20, 20, &opt, &tot, &err) == 0, "%s", err.msg);
        CHECK(ev.exact == tg_squad_percent(tot.exact, tot.total) && ev.f1 == tg_squad_percent(tot.f1, tot.total) &&
                  ev.questions == tot.total,
              "n_best %d, max_answer_length %d, threshold %g: the trainer's exact %g F1 %g, the post-processing's "
              "%g %g",
              n_best[k], max_len[k], (double)threshold[k], ev.exact, ev.f1, tg_squad_percent(tot.exact, tot.total),
              tg_squad_percent(tot.f1, tot.total));
        exact[k] = ev.exact, f1[k] = ev.f1;
    }
    /* Every question null, then none: the unanswerable ones right, then wrong. */
    CHECK(exact[1] == 100.0 * unanswerable / tr.squad.n_questions && exact[2] != exact[1],
          "thresholds -1e30 and 1e30: exact %g and %g (%d of %d unanswerable)", exact[1], exact[2], unanswerable,
          tr.squad.n_questions);
    CHECK(n_best[3] < 20 && f1[3] != f1[2], "no n_best below 20 changes the F1 of %g", f1[2]);
    CHECK(max_len[4] < 20 && f1[4] != f1[2], "no max_answer_length below 20 changes the F1 of %g", f1[2]);
    CHECK(first.exact == exact[0] && first.f1 == f1[0], "the defaults: exact %g, then %g", first.exact, exact[0]);
    free(L.start), free(L.end);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}
