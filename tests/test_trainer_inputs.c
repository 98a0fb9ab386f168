/* What the trainer refuses or reports honestly about its inputs: weights that are not
 * finite numbers (runtime/weights.c), and an eval set with nothing to count, whose loss,
 * accuracy and perplexity are missing rather than 0, 0 and 1 (runtime/trainer.c, and the
 * CLI's summary and console line). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* Writes `text` as dir/name and returns the path (static buffer: one at a time). */
static const char *write_in(const char *dir, const char *name, const char *text) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return tg_test_write_file(path, text) == 0 ? path : NULL;
}

/* Compiles job text written into dir (relative paths resolve there). */
static int compile_job(const char *dir, const char *text, tg_plan *plan, tg_err *err) {
    const char *path = write_in(dir, "job.txt", text);
    if (!path) return tg_fail(err, "cannot write the job");
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

/* A tiny-bert model folder whose model.safetensors holds the word embeddings with one
 * value replaced by `bad`, stored as `dtype` (F32 or BF16): loading refuses it, naming the
 * tensor and the element, whatever the dtype. */
static void expect_weights_refused(const char *name, int dtype, float bad, const char *what) {
    char dir[700], src[1100];
    snprintf(dir, sizeof dir, "%s/%s", tg_test_tmpdir(), name);
    REQUIRE(mkdir(dir, 0755) == 0, "mkdir");
    snprintf(src, sizeof src, "%s/tiny-bert/config.json", tg_presets_dir());
    char *config = tg_test_read_file(src, NULL);
    REQUIRE(config && write_in(dir, "config.json", config), "config");
    free(config);

    enum { ROWS = 128, COLS = 32, N = ROWS * COLS, BAD = 5 * COLS + 7 };
    float *w = malloc(sizeof(float) * N);
    uint16_t *half = malloc(sizeof(uint16_t) * N);
    REQUIRE(w && half, "alloc");
    tg_test_fill_uniform(w, N, 1, -0.1f, 0.1f);
    w[BAD] = bad;
    for (int i = 0; i < N; i++) {
        uint32_t bits;
        memcpy(&bits, &w[i], 4);
        half[i] = (uint16_t)(bits >> 16); /* bf16: the top half (NaN and infinities stay so) */
    }
    /* The writer takes F32 only: a BF16 file is written by hand. */
    char weights[800];
    snprintf(weights, sizeof weights, "%s/model.safetensors", dir);
    tg_err err = {{0}};
    if (dtype == TG_ST_F32) {
        int64_t shape[] = {ROWS, COLS};
        tg_st_item item = {"bert.embeddings.word_embeddings.weight", TG_ST_F32, 2, shape, w};
        REQUIRE(tg_st_write(weights, &item, 1, &err) == 0, "%s", err.msg);
    } else {
        char hdr[256];
        snprintf(hdr, sizeof hdr,
                 "{\"bert.embeddings.word_embeddings.weight\":{\"dtype\":\"BF16\",\"shape\":[%d,%d],"
                 "\"data_offsets\":[0,%d]}}",
                 ROWS, COLS, 2 * N);
        FILE *f = fopen(weights, "wb");
        REQUIRE(f, "create %s", weights);
        uint64_t hlen = strlen(hdr);
        uint8_t len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hlen >> (8 * i));
        int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hlen, f) == hlen &&
                 fwrite(half, 2, N, f) == (size_t)N;
        REQUIRE(fclose(f) == 0 && ok, "write %s", weights);
    }
    free(w);
    free(half);

    char job[1024];
    snprintf(job, sizeof job, "model = %s\nnum_labels = 2\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x.jsonl\n", dir);
    tg_plan plan;
    REQUIRE(compile_job(dir, job, &plan, &err) == 0, "%s", err.msg);
    CHECK(strcmp(plan.model.weights, weights) == 0, "weights '%s'", plan.model.weights);
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .load_data = 0};
    if (CHECK(tg_trainer_open(&tr, &plan, &o, &err) != 0, "%s: %s weights loaded", name, what)) {
        CHECK(strstr(err.msg, weights), "message '%s' lacks the file", err.msg);
        CHECK(strstr(err.msg, "tensor 'bert.embeddings.word_embeddings.weight'"), "message '%s' lacks the tensor",
              err.msg);
        char want[64];
        snprintf(want, sizeof want, "element %d is %s", (int)BAD, what);
        CHECK(strstr(err.msg, want), "message '%s' lacks '%s'", err.msg, want);
    } else {
        tg_trainer_close(&tr);
    }
    tg_plan_free(&plan);
}

TG_TEST(test_weights_non_finite_refused) {
    expect_weights_refused("nan-f32", TG_ST_F32, NAN, "NaN");
    expect_weights_refused("inf-f32", TG_ST_F32, -INFINITY, "-infinity");
    expect_weights_refused("nan-bf16", TG_ST_BF16, NAN, "NaN");
    expect_weights_refused("inf-bf16", TG_ST_BF16, INFINITY, "+infinity");
}

/* LM examples of one token have no next token to predict: the eval counts nothing. */
static const char *const k_one_token_rows = "{\"input_ids\": [5]}\n{\"input_ids\": [7]}\n{\"input_ids\": [9]}\n";

TG_TEST(test_eval_lm_nothing_to_count) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_in(dir, "train.jsonl", "{\"input_ids\": [5, 6, 7, 8]}\n{\"input_ids\": [9, 10, 11]}\n"), "train");
    REQUIRE(write_in(dir, "eval.jsonl", k_one_token_rows), "eval");
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(compile_job(dir,
                        "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\nsteps = 1\npad_token_id = 0\n"
                        "train_data = train.jsonl\neval_data = eval.jsonl\n",
                        &plan, &err) == 0,
            "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .load_data = 1};
    REQUIRE(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg);
    tg_eval_stats ev;
    if (CHECK(tg_trainer_eval(&tr, &ev, &err) == 0, "%s", err.msg)) {
        CHECK(ev.examples == 3 && ev.counted == 0, "examples %d counted %lld", ev.examples, (long long)ev.counted);
        CHECK(isnan(ev.loss) && isnan(ev.perplexity) && ev.accuracy == -1.0,
              "nothing counted, yet loss %g perplexity %g accuracy %g", ev.loss, ev.perplexity, ev.accuracy);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

TG_TEST(test_eval_classify_nothing_to_count) {
    /* The dataset loader refuses an empty file, so the trainer is handed an empty eval set
     * directly: a classification eval over no rows. */
    tg_plan plan;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan), "compile");
    tg_trainer tr;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = tg_test_device(), .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg);
    memset(&tr.eval, 0, sizeof tr.eval);
    tr.has_eval = 1;
    tg_eval_stats ev;
    if (CHECK(tg_trainer_eval(&tr, &ev, &err) == 0, "%s", err.msg)) {
        CHECK(ev.examples == 0 && ev.counted == 0, "examples %d counted %lld", ev.examples, (long long)ev.counted);
        CHECK(isnan(ev.loss) && isnan(ev.accuracy) && ev.perplexity == -1.0,
              "nothing counted, yet loss %g accuracy %g perplexity %g", ev.loss, ev.accuracy, ev.perplexity);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}

/* The CLI: the summary's eval fields are null with the reason, never 0 and 1 (nor inf),
 * and the console says there was nothing to count. */
TG_TEST(test_eval_cli_nothing_to_count) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_in(dir, "train.jsonl", "{\"input_ids\": [5, 6, 7, 8]}\n{\"input_ids\": [9, 10, 11]}\n"), "train");
    REQUIRE(write_in(dir, "eval.jsonl", k_one_token_rows), "eval");
    REQUIRE(write_in(dir, "lm.job",
                     "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\nsteps = 2\npad_token_id = 0\n"
                     "train_data = train.jsonl\neval_data = eval.jsonl\n"),
            "job");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s run %s/lm.job --metrics %s/m.jsonl >/dev/null 2>%s/stderr.txt", tg_test_cli(), dir,
             dir, dir);
    REQUIRE(system(cmd) == 0, "CLI run failed: %s", cmd);
    char path[1100];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    char *console = tg_test_read_file(path, NULL);
    CHECK(console && strstr(console, "eval on 3 examples: no tokens to count in eval_data, so no loss or perplexity"),
          "console: %s", console ? console : "(none)");
    free(console);

    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *metrics = tg_test_read_file(path, NULL);
    REQUIRE(metrics, "no metrics");
    const char *last = strstr(metrics, "{\"summary\"");
    REQUIRE(last, "no summary line in %s", metrics);
    json_error_t e;
    json_t *o = json_loads(last, 0, &e);
    if (CHECK(o, "summary is not JSON: %s (%s)", e.text, last)) {
        CHECK(json_integer_value(json_object_get(o, "eval_examples")) == 3, "eval_examples");
        static const char *const keys[] = {"eval_loss", "eval_perplexity"};
        for (int k = 0; k < 2; k++) {
            char error_key[64];
            snprintf(error_key, sizeof error_key, "%s_error", keys[k]);
            const char *why = json_string_value(json_object_get(o, error_key));
            CHECK(json_is_null(json_object_get(o, keys[k])) && why && !strcmp(why, "no tokens to count in eval_data"),
                  "%s: %s", keys[k], last);
        }
        CHECK(!json_object_get(o, "eval_accuracy"), "eval_accuracy in an LM summary");
    }
    json_decref(o);
    free(metrics);
}
