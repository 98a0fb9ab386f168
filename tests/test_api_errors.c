/* The public API's refusals (include/tunegraph.h): every call's required arguments, bad
 * options and structs, wrong states (no eval data, no checkpoint folder, a plan the library
 * cannot run), outputs over the plan's inputs, and each call's failure passed through with
 * the message of the layer below. Each case asserts the return code and the message. */
#include "include/tunegraph.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job"
#define TRAIN_DATA "examples/data/sentiment-train.jsonl"

/* rc must be -1 and the calling thread's last error must hold `want`. */
#define CHECK_REFUSED(rc, want)                                                                            \
    do {                                                                                                   \
        int rc_ = (rc);                                                                                    \
        CHECK(rc_ == -1, "%s: returned %d, want -1", #rc, rc_);                                            \
        CHECK(strstr(tunegraph_last_error(), (want)) != NULL, "%s: message '%s' lacks '%s'", #rc,         \
              tunegraph_last_error(), (want));                                                             \
    } while (0)

/* The demo job cut to `steps` steps of 4 x 16, as a plan (NULL and a failed CHECK on failure). */
static tunegraph_plan *small_plan(const char *steps_setting) {
    const char *sets[] = {steps_setting, "batch=4", "seq=16"};
    tunegraph_plan *plan = NULL;
    if (tunegraph_compile_file(DEMO, sets, 3, &plan)) {
        CHECK(0, "compile: %s", tunegraph_last_error());
        return NULL;
    }
    return plan;
}

static tunegraph_trainer *open_cpu(const tunegraph_plan *plan, int max_in_flight) {
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, max_in_flight};
    tunegraph_trainer *tr = NULL;
    if (tunegraph_trainer_open(plan, &o, &tr)) {
        CHECK(0, "open: %s", tunegraph_last_error());
        return NULL;
    }
    return tr;
}

TG_TEST(api_errors_required_arguments) {
    tunegraph_plan *plan = small_plan("steps=2");
    REQUIRE(plan, "no plan");
    tunegraph_trainer *tr = open_cpu(plan, 1);
    REQUIRE(tr, "no trainer");
    const char *sets[] = {"steps=1"};
    tunegraph_plan *out = NULL;
    tunegraph_trainer *tout = NULL;
    int64_t n = 0;
    tunegraph_plan_summary s = {.struct_size = sizeof s};
    tunegraph_eval_metrics e = {.struct_size = sizeof e};

    static const char compile_file_msg[] =
        "tunegraph_compile_file: job_path and plan are required, and overrides for n_overrides > 0";
    CHECK_REFUSED(tunegraph_compile_file(NULL, NULL, 0, &out), compile_file_msg);
    CHECK_REFUSED(tunegraph_compile_file(DEMO, NULL, 0, NULL), compile_file_msg);
    CHECK_REFUSED(tunegraph_compile_file(DEMO, sets, -1, &out), compile_file_msg);
    CHECK_REFUSED(tunegraph_compile_file(DEMO, NULL, 1, &out), compile_file_msg);
    static const char compile_text_msg[] =
        "tunegraph_compile_text: job_text and plan are required, and overrides for n_overrides > 0";
    CHECK_REFUSED(tunegraph_compile_text(NULL, NULL, NULL, 0, &out), compile_text_msg);
    CHECK_REFUSED(tunegraph_compile_text("model = tiny-bert\n", NULL, NULL, 0, NULL), compile_text_msg);
    CHECK_REFUSED(tunegraph_compile_text("model = tiny-bert\n", NULL, sets, -1, &out), compile_text_msg);
    CHECK_REFUSED(tunegraph_compile_text("model = tiny-bert\n", NULL, NULL, 2, &out), compile_text_msg);
    CHECK(out == NULL, "a refused compile set the plan");
    CHECK_REFUSED(tunegraph_plan_load(NULL, &out), "tunegraph_plan_load: path and plan are required");
    CHECK_REFUSED(tunegraph_plan_load("x.tgp", NULL), "tunegraph_plan_load: path and plan are required");
    CHECK_REFUSED(tunegraph_plan_save(NULL, "x.tgp"), "tunegraph_plan_save: plan and path are required");
    CHECK_REFUSED(tunegraph_plan_save(plan, NULL), "tunegraph_plan_save: plan and path are required");
    CHECK_REFUSED(tunegraph_plan_inspect(NULL, stdout, TUNEGRAPH_FORMAT_TEXT),
                  "tunegraph_plan_inspect: plan and out are required");
    CHECK_REFUSED(tunegraph_plan_inspect(plan, NULL, TUNEGRAPH_FORMAT_TEXT),
                  "tunegraph_plan_inspect: plan and out are required");
    CHECK_REFUSED(tunegraph_plan_inspect(plan, stdout, (tunegraph_format)-1),
                  "tunegraph_plan_inspect: format -1 is neither TUNEGRAPH_FORMAT_TEXT nor TUNEGRAPH_FORMAT_JSON");
    CHECK_REFUSED(tunegraph_plan_summarize(NULL, &s), "tunegraph_plan_summarize: plan and summary are required");
    CHECK_REFUSED(tunegraph_plan_summarize(plan, NULL), "tunegraph_plan_summarize: plan and summary are required");
    CHECK_REFUSED(tunegraph_plan_set(NULL, "steps=1"), "tunegraph_plan_set: plan and setting are required");
    CHECK_REFUSED(tunegraph_plan_set(plan, NULL), "tunegraph_plan_set: plan and setting are required");
    CHECK_REFUSED(tunegraph_trainer_open(NULL, NULL, &tout), "tunegraph_trainer_open: plan and trainer are required");
    CHECK_REFUSED(tunegraph_trainer_open(plan, NULL, NULL), "tunegraph_trainer_open: plan and trainer are required");
    CHECK(tout == NULL, "a refused open set the trainer");
    CHECK_REFUSED(tunegraph_trainer_total_steps(NULL, &n),
                  "tunegraph_trainer_total_steps: trainer and total_steps are required");
    CHECK_REFUSED(tunegraph_trainer_total_steps(tr, NULL),
                  "tunegraph_trainer_total_steps: trainer and total_steps are required");
    CHECK_REFUSED(tunegraph_trainer_step(NULL, NULL), "tunegraph_trainer_step: trainer is required");
    CHECK_REFUSED(tunegraph_trainer_train(NULL, NULL, NULL), "tunegraph_trainer_train: trainer is required");
    CHECK_REFUSED(tunegraph_trainer_evaluate(NULL, &e), "tunegraph_trainer_evaluate: trainer and metrics are required");
    CHECK_REFUSED(tunegraph_trainer_evaluate(tr, NULL), "tunegraph_trainer_evaluate: trainer and metrics are required");
    CHECK_REFUSED(tunegraph_trainer_save_weights(NULL, "w.safetensors"),
                  "tunegraph_trainer_save_weights: trainer and path are required");
    CHECK_REFUSED(tunegraph_trainer_save_weights(tr, NULL), "tunegraph_trainer_save_weights: trainer and path are required");
    CHECK_REFUSED(tunegraph_trainer_export_hf(NULL, "out", NULL),
                  "tunegraph_trainer_export_hf: trainer and out_dir are required");
    CHECK_REFUSED(tunegraph_trainer_export_hf(tr, NULL, NULL), "tunegraph_trainer_export_hf: trainer and out_dir are required");
    CHECK_REFUSED(tunegraph_trainer_save_checkpoint(NULL, "ck"), "tunegraph_trainer_save_checkpoint: trainer is required");
    CHECK_REFUSED(tunegraph_trainer_resume(NULL, "ck"), "tunegraph_trainer_resume: trainer and path are required");
    CHECK_REFUSED(tunegraph_trainer_resume(tr, NULL), "tunegraph_trainer_resume: trainer and path are required");
    CHECK_REFUSED(tunegraph_trainer_steps_done(NULL, &n), "tunegraph_trainer_steps_done: trainer and steps are required");
    CHECK_REFUSED(tunegraph_trainer_steps_done(tr, NULL), "tunegraph_trainer_steps_done: trainer and steps are required");
    CHECK(!strcmp(tunegraph_trainer_weights_report(NULL), ""), "a NULL trainer's weights report is not \"\"");
    /* The trainer took no step through any of the refusals. */
    CHECK(tunegraph_trainer_steps_done(tr, &n) == 0 && n == 0, "steps done %lld after refusals", (long long)n);
    tunegraph_plan_free(NULL);
    tunegraph_trainer_close(NULL);
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);
}

TG_TEST(api_errors_trainer_options) {
    tunegraph_plan *plan = small_plan("steps=1");
    REQUIRE(plan, "no plan");
    tunegraph_trainer *tr = NULL;
    static const struct {
        tunegraph_trainer_options o;
        const char *want;
    } cases[] = {
        {{0, TUNEGRAPH_DEVICE_CPU, 1, 1}, "tunegraph_trainer_options.struct_size is 0: set it to sizeof(tunegraph_trainer_options)"},
        {{sizeof(tunegraph_trainer_options), (tunegraph_device)-1, 1, 1},
         "tunegraph_trainer_options.device: -1 is not a tunegraph_device"},
        {{sizeof(tunegraph_trainer_options), (tunegraph_device)3, 1, 1},
         "tunegraph_trainer_options.device: 3 is not a tunegraph_device"},
        {{sizeof(tunegraph_trainer_options), TUNEGRAPH_DEVICE_CPU, -1, 1},
         "tunegraph_trainer_options.threads: -1 is negative (0: one per core)"},
        {{sizeof(tunegraph_trainer_options), TUNEGRAPH_DEVICE_CPU, 1, -1},
         "tunegraph_trainer_options.max_in_flight: -1 is not in 0..14 (0: the default, 14)"},
        {{sizeof(tunegraph_trainer_options), TUNEGRAPH_DEVICE_CPU, 1, 15},
         "tunegraph_trainer_options.max_in_flight: 15 is not in 0..14 (0: the default, 14)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_REFUSED(tunegraph_trainer_open(plan, &cases[i].o, &tr), cases[i].want);
    CHECK(tr == NULL, "a refused open set the trainer");
    /* The bounds themselves are taken. */
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 0, 14};
    CHECK(tunegraph_trainer_open(plan, &o, &tr) == 0, "max_in_flight 14, threads 0: %s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tr = NULL;
    o.max_in_flight = 0;
    CHECK(tunegraph_trainer_open(plan, &o, &tr) == 0, "max_in_flight 0: %s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tr = NULL;
    /* A newer header's struct whose extra bytes are zero is taken. */
    struct {
        tunegraph_trainer_options o;
        int64_t newer;
    } newer = {{sizeof newer, TUNEGRAPH_DEVICE_CPU, 1, 1}, 0};
    CHECK(tunegraph_trainer_open(plan, &newer.o, &tr) == 0, "zero bytes past the struct: %s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tr = NULL;
    tunegraph_plan_free(plan);

    /* A data-parallel plan is the command line's. */
    const char *dp[] = {"steps=1", "batch=4", "seq=16", "data_parallel=2"};
    REQUIRE(tunegraph_compile_file(DEMO, dp, 4, &plan) == 0, "%s", tunegraph_last_error());
    CHECK_REFUSED(tunegraph_trainer_open(plan, NULL, &tr),
                  "demo-classify.job: the plan trains 2 data-parallel replicas; the library runs one (use `tunegraph run`)");
    tunegraph_plan_free(plan);

    /* checkpoint_every without a folder for the checkpoints. */
    plan = small_plan("steps=2");
    REQUIRE(plan, "no plan");
    REQUIRE(tunegraph_plan_set(plan, "checkpoint_every=1") == 0, "%s", tunegraph_last_error());
    CHECK_REFUSED(tunegraph_trainer_open(plan, NULL, &tr),
                  "demo-classify.job: key 'checkpoint_every' (1) needs a folder for the checkpoints: key 'checkpoint_dir'");
    CHECK(tr == NULL, "a refused open set the trainer");
    /* Training data that is not there: the trainer's own message. */
    REQUIRE(tunegraph_plan_set(plan, "checkpoint_every=0") == 0, "%s", tunegraph_last_error());
    REQUIRE(tunegraph_plan_set(plan, "train_data=no/such/train.jsonl") == 0, "%s", tunegraph_last_error());
    CHECK_REFUSED(tunegraph_trainer_open(plan, NULL, &tr), "no/such/train.jsonl");
    tunegraph_plan_free(plan);
}

TG_TEST(api_errors_plan_outputs) {
    tunegraph_plan *plan = small_plan("steps=1");
    REQUIRE(plan, "no plan");
    /* Never over a file the plan reads. */
    CHECK_REFUSED(tunegraph_plan_save(plan, TRAIN_DATA), "sentiment-train.jsonl");
    struct stat st;
    CHECK(stat(TRAIN_DATA, &st) == 0 && st.st_size > 1000, "the training data was touched");
    char path[700];
    snprintf(path, sizeof path, "%s/no/such/dir/p.tgp", tg_test_tmpdir());
    CHECK_REFUSED(tunegraph_plan_save(plan, path), "no/such/dir");
    /* A device that takes no bytes: the write itself fails. */
    CHECK_REFUSED(tunegraph_plan_save(plan, "/dev/full"), "/dev/full");

    /* Text and JSON both write; a stream that cannot be written fails with a message. */
    char *text = NULL, *json = NULL;
    size_t text_len = 0, json_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    REQUIRE(f, "open_memstream");
    CHECK(tunegraph_plan_inspect(plan, f, TUNEGRAPH_FORMAT_TEXT) == 0, "%s", tunegraph_last_error());
    fclose(f);
    f = open_memstream(&json, &json_len);
    REQUIRE(f, "open_memstream");
    CHECK(tunegraph_plan_inspect(plan, f, TUNEGRAPH_FORMAT_JSON) == 0, "%s", tunegraph_last_error());
    fclose(f);
    CHECK(text && json && text_len > 100 && json[0] == '{' && text[0] != '{', "text %zu bytes, json starts '%.10s'",
          text_len, json ? json : "");
    free(text);
    free(json);
    FILE *full = fopen("/dev/full", "w");
    REQUIRE(full, "/dev/full");
    setvbuf(full, NULL, _IONBF, 0);
    CHECK(tunegraph_plan_inspect(plan, full, TUNEGRAPH_FORMAT_TEXT) == -1, "inspect into /dev/full succeeded");
    CHECK(tunegraph_last_error()[0] != 0, "no message for a failed inspect");
    fclose(full);
    tunegraph_plan_free(plan);
}

TG_TEST(api_errors_trainer_states) {
    tunegraph_plan *plan = small_plan("steps=1");
    REQUIRE(plan, "no plan");
    tunegraph_trainer *tr = open_cpu(plan, 1);
    REQUIRE(tr, "no trainer");
    tunegraph_eval_metrics e = {0};
    CHECK_REFUSED(tunegraph_trainer_evaluate(tr, &e), "tunegraph_eval_metrics.struct_size is 0");
    tunegraph_step_metrics m = {0};
    CHECK_REFUSED(tunegraph_trainer_step(tr, &m), "tunegraph_step_metrics.struct_size is 0");
    int64_t done = -1;
    CHECK(tunegraph_trainer_steps_done(tr, &done) == 0 && done == 0, "a refused step was taken (%lld)", (long long)done);
    /* metrics NULL: the step is taken, nothing filled. */
    CHECK(tunegraph_trainer_step(tr, NULL) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_trainer_steps_done(tr, &done) == 0 && done == 1, "steps done %lld", (long long)done);
    CHECK_REFUSED(tunegraph_trainer_step(tr, NULL), "demo-classify.job: all 1 steps of the schedule are taken");
    /* train with nothing left to take does nothing. */
    CHECK(tunegraph_trainer_train(tr, NULL, NULL) == 0, "%s", tunegraph_last_error());
    /* No folder given, none in the job. */
    CHECK_REFUSED(tunegraph_trainer_save_checkpoint(tr, NULL),
                  "demo-classify.job: tunegraph_trainer_save_checkpoint: no folder given and the job has no checkpoint_dir");
    /* Weights never over the training data; a folder that is not there. */
    CHECK_REFUSED(tunegraph_trainer_save_weights(tr, TRAIN_DATA), "sentiment-train.jsonl");
    char path[700];
    snprintf(path, sizeof path, "%s/no/such/w.safetensors", tg_test_tmpdir());
    CHECK_REFUSED(tunegraph_trainer_save_weights(tr, path), "no/such");
    CHECK_REFUSED(tunegraph_trainer_save_weights(tr, "/dev/full"), "/dev/full");
    /* Resuming from what is no checkpoint. */
    snprintf(path, sizeof path, "%s/none", tg_test_tmpdir());
    CHECK_REFUSED(tunegraph_trainer_resume(tr, path), "none");
    snprintf(path, sizeof path, "%s/bad.tgckpt", tg_test_tmpdir());
    REQUIRE(tg_test_write_file(path, "not a checkpoint\n") == 0, "%s", path);
    CHECK_REFUSED(tunegraph_trainer_resume(tr, path), "bad.tgckpt");
    tunegraph_trainer_close(tr);

    /* A plan without eval_data. */
    tunegraph_plan_free(plan);
    plan = NULL;
    REQUIRE(tunegraph_compile_text("model = tiny-bert\nsteps = 1\nbatch = 4\nseq = 16\n"
                                   "train_data = data/sentiment-train.jsonl\n",
                                   "examples", NULL, 0, &plan) == 0,
            "%s", tunegraph_last_error());
    tr = open_cpu(plan, 1);
    REQUIRE(tr, "no trainer");
    tunegraph_eval_metrics e2 = {.struct_size = sizeof e2};
    CHECK_REFUSED(tunegraph_trainer_evaluate(tr, &e2), "<job text>: evaluate: ");
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);
}

/* An LM plan evaluates to a perplexity, not an accuracy. */
TG_TEST(api_errors_lm_evaluates_perplexity) {
    const char *sets[] = {"steps=1", "batch=4", "seq=16"};
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_file("examples/demo-lm.job", sets, 3, &plan) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer *tr = open_cpu(plan, 1);
    tunegraph_plan_free(plan);
    REQUIRE(tr, "no trainer");
    tunegraph_eval_metrics e = {.struct_size = sizeof e};
    REQUIRE(tunegraph_trainer_evaluate(tr, &e) == 0, "%s", tunegraph_last_error());
    CHECK(e.examples == 200 && e.counted > 200 && !e.has_accuracy && e.accuracy == 0 && e.has_perplexity &&
              fabs(e.perplexity - exp(e.loss)) < 1e-3 * e.perplexity,
          "examples %lld counted %lld accuracy %d %g perplexity %d %g loss %g", (long long)e.examples,
          (long long)e.counted, e.has_accuracy, e.accuracy, e.has_perplexity, e.perplexity, e.loss);
    /* A struct from an older header: only its bytes are filled. */
    struct {
        tunegraph_eval_metrics m;
        uint64_t guard;
    } older = {{0}, 0x5a5a5a5a5a5a5a5aull};
    older.m.struct_size = offsetof(tunegraph_eval_metrics, loss);
    REQUIRE(tunegraph_trainer_evaluate(tr, &older.m) == 0, "%s", tunegraph_last_error());
    CHECK(older.m.struct_size == offsetof(tunegraph_eval_metrics, loss) && older.m.examples == 200 &&
              older.m.loss == 0 && older.guard == 0x5a5a5a5a5a5a5a5aull,
          "older struct: size %zu examples %lld loss %g", older.m.struct_size, (long long)older.m.examples,
          older.m.loss);
    tunegraph_trainer_close(tr);
}

TG_TEST(api_errors_export_options) {
    tunegraph_plan *plan = small_plan("steps=1");
    REQUIRE(plan, "no plan");
    tunegraph_trainer *tr = open_cpu(plan, 1);
    tunegraph_plan_free(plan);
    REQUIRE(tr, "no trainer");
    char out[700];
    snprintf(out, sizeof out, "%s/hf", tg_test_tmpdir());
    static const char *const names[] = {"neg", "pos"};
    tunegraph_export_options o = {0};
    CHECK_REFUSED(tunegraph_trainer_export_hf(tr, out, &o), "tunegraph_export_options.struct_size is 0");
    o.struct_size = sizeof o;
    o.n_labels = -1;
    CHECK_REFUSED(tunegraph_trainer_export_hf(tr, out, &o), "tunegraph_export_options.n_labels: -1 names with labels NULL");
    o.n_labels = (int64_t)INT32_MAX + 1;
    o.labels = names;
    CHECK_REFUSED(tunegraph_trainer_export_hf(tr, out, &o), "tunegraph_export_options.n_labels: 2147483648 names");
    CHECK(!strstr(tunegraph_last_error(), "NULL"), "labels given, message says NULL: %s", tunegraph_last_error());
    o.n_labels = 2;
    o.labels = NULL;
    CHECK_REFUSED(tunegraph_trainer_export_hf(tr, out, &o), "tunegraph_export_options.n_labels: 2 names with labels NULL");
    /* One label name for a two-label model: the export's own check. */
    o.n_labels = 1;
    o.labels = names;
    CHECK_REFUSED(tunegraph_trainer_export_hf(tr, out, &o), "label");
    struct stat st;
    CHECK(stat(out, &st) != 0, "a refused export left %s", out);
    /* A newer header's field this library lacks must be zero. */
    struct {
        tunegraph_export_options o;
        int64_t newer;
    } newer = {{.struct_size = sizeof newer}, 1};
    CHECK_REFUSED(tunegraph_trainer_export_hf(tr, out, &newer.o), "tunegraph_export_options: byte");
    /* No options: the defaults, LABEL_0 and LABEL_1. */
    char out2[800];
    snprintf(out2, sizeof out2, "%s/hf-default", tg_test_tmpdir());
    CHECK(tunegraph_trainer_export_hf(tr, out2, NULL) == 0, "%s", tunegraph_last_error());
    snprintf(out2 + strlen(out2), sizeof out2 - strlen(out2), "/config.json");
    char *defaults = tg_test_read_file(out2, NULL);
    CHECK(defaults && strstr(defaults, "\"LABEL_0\"") && strstr(defaults, "\"LABEL_1\""), "config.json: %s",
          defaults ? defaults : "(none)");
    free(defaults);
    o.n_labels = 2;
    CHECK(tunegraph_trainer_export_hf(tr, out, &o) == 0, "%s", tunegraph_last_error());
    snprintf(out + strlen(out), sizeof out - strlen(out), "/config.json");
    char *config = tg_test_read_file(out, NULL);
    CHECK(config && strstr(config, "\"neg\"") && strstr(config, "\"pos\""), "config.json: %s", config ? config : "(none)");
    free(config);
    tunegraph_trainer_close(tr);
}

static void collect_steps(void *ctx, const tunegraph_step_metrics *m) {
    int64_t *seen = ctx;
    seen[++seen[0]] = m->step;
}

/* A checkpoint written while steps are queued ahead takes those steps first; their metrics
 * still come, in order, from the next step calls. checkpoint_every writes one at its steps. */
TG_TEST(api_errors_checkpoints_with_steps_in_flight) {
    tunegraph_plan *plan = small_plan("steps=4");
    REQUIRE(plan, "no plan");
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/ck", tg_test_tmpdir());
    tunegraph_trainer *tr = open_cpu(plan, 4);
    REQUIRE(tr, "no trainer");
    tunegraph_step_metrics m = {.struct_size = sizeof m};
    REQUIRE(tunegraph_trainer_step(tr, &m) == 0 && m.step == 1, "step %lld: %s", (long long)m.step,
            tunegraph_last_error());
    REQUIRE(tunegraph_trainer_save_checkpoint(tr, dir) == 0, "%s", tunegraph_last_error());
    /* Every step was in flight: the checkpoint is of step 4, steps 2..4 wait in order. */
    snprintf(path, sizeof path, "%s/step-000004.tgckpt", dir);
    struct stat st;
    int64_t done = 0;
    CHECK(tunegraph_trainer_steps_done(tr, &done) == 0 && done == 1, "steps done %lld, want 1", (long long)done);
    int64_t seen[8] = {0};
    CHECK(tunegraph_trainer_train(tr, collect_steps, seen) == 0, "%s", tunegraph_last_error());
    CHECK(seen[0] == 3 && seen[1] == 2 && seen[2] == 3 && seen[3] == 4, "queued steps %lld: %lld %lld %lld",
          (long long)seen[0], (long long)seen[1], (long long)seen[2], (long long)seen[3]);
    CHECK(tunegraph_trainer_steps_done(tr, &done) == 0 && done == 4, "steps done %lld, want 4", (long long)done);
    tunegraph_trainer_close(tr);

    /* The job's checkpoints: checkpoint_every 2 into checkpoint_dir; a save with no folder
     * given goes there too. A second run into the same folder is refused (a later step). */
    char setting[800];
    snprintf(dir, sizeof dir, "%s/job-ck", tg_test_tmpdir());
    snprintf(setting, sizeof setting, "checkpoint_dir=%s", dir);
    REQUIRE(tunegraph_plan_set(plan, setting) == 0 && tunegraph_plan_set(plan, "checkpoint_every=2") == 0, "%s",
            tunegraph_last_error());
    tr = open_cpu(plan, 1);
    REQUIRE(tr, "no trainer");
    REQUIRE(tunegraph_trainer_step(tr, &m) == 0, "%s", tunegraph_last_error());
    snprintf(path, sizeof path, "%s/step-000001.tgckpt", dir);
    CHECK(stat(path, &st) != 0, "step 1 is no multiple of 2 but was checkpointed");
    CHECK(tunegraph_trainer_save_checkpoint(tr, NULL) == 0, "%s", tunegraph_last_error());
    CHECK(stat(path, &st) == 0, "%s missing", path);
    CHECK(tunegraph_trainer_train(tr, NULL, NULL) == 0, "%s", tunegraph_last_error());
    snprintf(path, sizeof path, "%s/step-000004.tgckpt", dir);
    CHECK(stat(path, &st) == 0, "%s missing", path);
    tunegraph_trainer_close(tr);

    /* Resumed from the folder: at step 4, nothing left to take. */
    tr = open_cpu(plan, 1);
    REQUIRE(tr, "no trainer");
    REQUIRE(tunegraph_trainer_resume(tr, dir) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_trainer_steps_done(tr, &done) == 0 && done == 4, "resumed at %lld, want 4", (long long)done);
    CHECK_REFUSED(tunegraph_trainer_step(tr, &m), "all 4 steps of the schedule are taken");
    tunegraph_trainer_close(tr);

    /* A fresh trainer writing step 1 into the folder that holds step 4. */
    tr = open_cpu(plan, 1);
    REQUIRE(tr, "no trainer");
    REQUIRE(tunegraph_trainer_step(tr, &m) == 0, "%s", tunegraph_last_error());
    CHECK_REFUSED(tunegraph_trainer_save_checkpoint(tr, dir), "step");
    /* A checkpoint folder that cannot be made. */
    CHECK_REFUSED(tunegraph_trainer_save_checkpoint(tr, TRAIN_DATA "/ck"), "sentiment-train.jsonl");
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);
}

/* A clean out-of-memory message: "out of memory for <what>", the executor's pools' "cannot
 * allocate N bytes for the X pool", or a file layer's strerror(ENOMEM) after the file's name. */
static int names_out_of_memory(const char *msg) {
    return (strstr(msg, "out of memory") && strlen(msg) > strlen("out of memory") + 4) ||
           strstr(msg, "cannot allocate") || (strstr(msg, ": Cannot allocate memory") && msg[0] != ':');
}

/* Fails allocation k of `call` for k = 0, 1, ... until the call succeeds: each failure
 * must return -1 with an "out of memory for <what>" message. The count of failures. */
#define FAIL_EACH_ALLOCATION(what, call, on_success)                                                    \
    do {                                                                                                \
        failures = 0;                                                                                   \
        for (long k = 0; k < 100000; k++) {                                                             \
            tg_alloc_fail_after(k);                                                                     \
            int rc_ = (call);                                                                           \
            tg_alloc_fail_after(-1);                                                                    \
            if (rc_ == 0) {                                                                             \
                on_success;                                                                             \
                break;                                                                                  \
            }                                                                                           \
            failures++;                                                                                 \
            CHECK(rc_ == -1 && names_out_of_memory(tunegraph_last_error()), "%s, allocation %ld: %d '%s'", \
                  what, k, rc_, tunegraph_last_error());                                                \
        }                                                                                               \
    } while (0)

/* Each allocation of plan loading, saving and trainer opening failed in turn (a training
 * set of 8 rows keeps the trainer's count small): the call returns -1 with an
 * out-of-memory message and hands out no handle. */
TG_TEST(api_errors_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    char path[700], data[700];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    char *rows = tg_test_read_file(TRAIN_DATA, NULL);
    REQUIRE(rows, TRAIN_DATA);
    char *end = rows;
    for (int i = 0; i < 8 && (end = strchr(end, '\n')); i++) end++;
    REQUIRE(end, "8 rows");
    *end = 0;
    REQUIRE(tg_test_write_file(data, rows) == 0, "%s", data);
    free(rows);
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_text("model = tiny-bert\nnum_labels = 2\nsteps = 1\nbatch = 4\nseq = 16\n"
                                   "train_data = train.jsonl\n",
                                   dir, NULL, 0, &plan) == 0,
            "%s", tunegraph_last_error());
    snprintf(path, sizeof path, "%s/p.tgp", dir);
    int failures = 0;
    /* The first allocation of a compile is the plan handle. */
    tunegraph_plan *none = NULL;
    tg_alloc_fail_after(0);
    int rc_file = tunegraph_compile_file(DEMO, NULL, 0, &none);
    int rc_text = tunegraph_compile_text("model = tiny-bert\n", NULL, NULL, 0, &none);
    tg_alloc_fail_after(-1);
    CHECK(rc_file == -1 && rc_text == -1 && none == NULL && !strcmp(tunegraph_last_error(), "out of memory for the plan"),
          "compile with no memory: %d %d '%s'", rc_file, rc_text, tunegraph_last_error());
    FAIL_EACH_ALLOCATION("save", tunegraph_plan_save(plan, path), (void)0);
    CHECK(failures > 0, "no allocation of plan saving failed");
    tunegraph_plan *back = NULL;
    FAIL_EACH_ALLOCATION("load", tunegraph_plan_load(path, &back), tunegraph_plan_free(back));
    CHECK(failures > 0 && back != NULL, "no allocation of plan loading failed");
    tunegraph_trainer *tr = NULL;
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    FAIL_EACH_ALLOCATION("open", tunegraph_trainer_open(plan, &o, &tr), (void)0);
    CHECK(failures > 0 && tr != NULL, "no allocation of trainer opening failed (%d)", failures);
    /* The opened trainer still trains. */
    tunegraph_step_metrics m = {.struct_size = sizeof m};
    CHECK(tr && tunegraph_trainer_step(tr, &m) == 0 && m.step == 1 && isfinite(m.loss), "step after the faults: %s",
          tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);
}

/* A run key set on a plan with length buckets reaches every bucket's plan: the trainer
 * takes the new step count. */
TG_TEST(api_errors_plan_set_reaches_buckets) {
    const char *sets[] = {"steps=1", "batch=4", "seq=16", "seq_buckets=8,16"};
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_file(DEMO, sets, 4, &plan) == 0, "%s", tunegraph_last_error());
    REQUIRE(tunegraph_plan_set(plan, "steps=3") == 0, "%s", tunegraph_last_error());
    tunegraph_trainer *tr = open_cpu(plan, 1);
    tunegraph_plan_free(plan);
    REQUIRE(tr, "no trainer");
    int64_t total = 0;
    int64_t seen[8] = {0};
    CHECK(tunegraph_trainer_total_steps(tr, &total) == 0 && total == 3, "total steps %lld, want 3", (long long)total);
    CHECK(tunegraph_trainer_train(tr, collect_steps, seen) == 0 && seen[0] == 3 && seen[3] == 3, "%s; %lld steps",
          tunegraph_last_error(), (long long)seen[0]);
    tunegraph_trainer_close(tr);
}

/* A model folder named with trailing slashes: its config.json is still an input the plan
 * may not be saved over. */
TG_TEST(api_errors_plan_save_over_model_config) {
    const char *dir = tg_test_tmpdir();
    char model[700], config[800], job[2048];
    snprintf(model, sizeof model, "%s/model", dir);
    REQUIRE(mkdir(model, 0755) == 0, "%s", model);
    snprintf(config, sizeof config, "%s/config.json", model);
    char *text = tg_test_read_file("models/presets/tiny-bert/config.json", NULL);
    REQUIRE(text && tg_test_write_file(config, text) == 0, "%s", config);
    free(text);
    snprintf(job, sizeof job, "model = %s//\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = 1\n"
                              "train_data = data/sentiment-train.jsonl\n", model);
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_text(job, "examples", NULL, 0, &plan) == 0, "%s", tunegraph_last_error());
    CHECK_REFUSED(tunegraph_plan_save(plan, config), "model config");
    char *after = tg_test_read_file(config, NULL);
    CHECK(after && strstr(after, "\"hidden_size\""), "config.json was touched: %s", after ? after : "(none)");
    free(after);
    tunegraph_plan_free(plan);
}
