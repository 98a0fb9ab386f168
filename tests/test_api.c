/* The public API (include/tunegraph.h): its errors, plans, run keys and a trainer. */
#include "include/tunegraph.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/version.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job"
#define CHECK_LAST_ERROR(s) \
    CHECK(strstr(tunegraph_last_error(), (s)) != NULL, "message '%s' lacks '%s'", tunegraph_last_error(), (s))

TG_TEST(api_version) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", TUNEGRAPH_VERSION_MAJOR, TUNEGRAPH_VERSION_MINOR, TUNEGRAPH_VERSION_PATCH);
    CHECK(strcmp(tunegraph_version(), want) == 0, "tunegraph_version() %s, the header says %s", tunegraph_version(),
          want);
    /* The CLI and plan fingerprints carry the same version. */
    CHECK(strcmp(TG_VERSION_STRING + strlen("tunegraph "), want) == 0, "TG_VERSION_STRING %s, the header says %s",
          TG_VERSION_STRING, want);
}

static void *fail_in_thread(void *arg) {
    tunegraph_plan *plan = NULL;
    *(int *)arg = tunegraph_compile_file("no/such/other.job", NULL, 0, &plan);
    return NULL;
}

TG_TEST(api_errors_name_the_file_per_thread) {
    tunegraph_plan *plan = NULL;
    CHECK(tunegraph_compile_file("no/such/dir/missing.job", NULL, 0, &plan) == -1, "missing job compiled");
    CHECK(plan == NULL, "plan set on failure");
    CHECK_LAST_ERROR("no/such/dir/missing.job: cannot open job file");

    /* Another thread's failure leaves this thread's message alone. */
    pthread_t th;
    int rc = 0;
    REQUIRE(pthread_create(&th, NULL, fail_in_thread, &rc) == 0, "pthread_create");
    pthread_join(th, NULL);
    CHECK(rc == -1, "the other thread's compile succeeded");
    CHECK_LAST_ERROR("missing.job");

    /* An override's value error names the key and where it came from. */
    const char *bad[] = {"lr=fast"};
    CHECK(tunegraph_compile_file(DEMO, bad, 1, &plan) == -1, "lr=fast compiled");
    CHECK_LAST_ERROR("--set lr=fast: key 'lr': 'fast' is not a number");

    tunegraph_plan_summary unsized = {0};
    const char *short_run[] = {"steps=2"};
    REQUIRE(tunegraph_compile_file(DEMO, short_run, 1, &plan) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_plan_summarize(plan, &unsized) == -1, "struct_size 0 accepted");
    CHECK_LAST_ERROR("tunegraph_plan_summary.struct_size is 0");
    tunegraph_trainer_options future = {sizeof future, TUNEGRAPH_DEVICE_CPU, 1, 1};
    struct {
        tunegraph_trainer_options o;
        int newer_field;
    } newer = {{sizeof newer, TUNEGRAPH_DEVICE_CPU, 1, 1}, 7};
    tunegraph_trainer *tr = NULL;
    CHECK(tunegraph_trainer_open(plan, &newer.o, &tr) == -1, "an options field this library lacks was accepted");
    CHECK_LAST_ERROR("tunegraph_trainer_options: byte");
    future.device = (tunegraph_device)9;
    CHECK(tunegraph_trainer_open(plan, &future, &tr) == -1, "device 9 accepted");
    CHECK_LAST_ERROR("tunegraph_trainer_options.device");
    tunegraph_plan_free(plan);
}

TG_TEST(api_compile_text_resolves_against_base_dir) {
    const char *text = "model = tiny-bert\n"
                       "batch = 4\nseq = 16\nsteps = 2\n"
                       "train_data = data/sentiment-train.jsonl\n";
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_text(text, "examples", NULL, 0, &plan) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    /* Opening loads the training data from examples/data/. */
    CHECK(tunegraph_trainer_open(plan, &o, &tr) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);

    plan = NULL;
    CHECK(tunegraph_compile_text("model = tiny-bert\nbatch = 0\n", NULL, NULL, 0, &plan) == -1, "batch 0 compiled");
    CHECK_LAST_ERROR("<job text>:2: key 'batch'");
}

TG_TEST(api_plan_set_takes_run_keys_only) {
    tunegraph_plan *plan = NULL;
    const char *sets[] = {"steps=3"};
    REQUIRE(tunegraph_compile_file(DEMO, sets, 1, &plan) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_plan_set(plan, "lr=1e-4") == -1, "lr changed on a compiled plan");
    CHECK_LAST_ERROR("lr=1e-4: this key is compiled into");
    CHECK(tunegraph_plan_set(plan, "batch = 4") == -1, "batch changed on a compiled plan");
    CHECK_LAST_ERROR("batch = 4: this key is compiled into");
    CHECK(tunegraph_plan_set(plan, "steps=many") == -1, "steps=many accepted");
    CHECK_LAST_ERROR("key 'steps': 'many' is not an integer");
    CHECK(tunegraph_plan_set(plan, "train_data=") == -1, "an empty train_data accepted");

    tunegraph_plan_summary s = {.struct_size = sizeof s};
    CHECK(tunegraph_plan_set(plan, "steps=5") == 0, "%s", tunegraph_last_error());
    REQUIRE(tunegraph_plan_summarize(plan, &s) == 0, "%s", tunegraph_last_error());
    CHECK(s.total_steps == 5, "total_steps %lld after steps=5", (long long)s.total_steps);
    CHECK(tunegraph_plan_set(plan, "epochs=1") == 0, "%s", tunegraph_last_error());
    REQUIRE(tunegraph_plan_summarize(plan, &s) == 0, "%s", tunegraph_last_error());
    CHECK(s.total_steps == -1, "total_steps %lld for epochs", (long long)s.total_steps);
    CHECK(tunegraph_plan_set(plan, "steps=4") == 0, "%s", tunegraph_last_error());
    REQUIRE(tunegraph_plan_summarize(plan, &s) == 0, "%s", tunegraph_last_error());
    CHECK(s.total_steps == 4, "total_steps %lld after steps=4", (long long)s.total_steps);
    CHECK(tunegraph_plan_set(plan, "seed=7") == 0 && tunegraph_plan_set(plan, "log_every=2") == 0, "%s",
          tunegraph_last_error());
    tunegraph_plan_free(plan);
}

TG_TEST(api_plan_summary_and_save_load) {
    tunegraph_plan *plan = NULL, *back = NULL;
    const char *sets[] = {"steps=7"};
    REQUIRE(tunegraph_compile_file(DEMO, sets, 1, &plan) == 0, "%s", tunegraph_last_error());
    tunegraph_plan_summary s = {.struct_size = sizeof s};
    REQUIRE(tunegraph_plan_summarize(plan, &s) == 0, "%s", tunegraph_last_error());
    CHECK(s.struct_size == sizeof s, "struct_size %zu", s.struct_size);
    CHECK(s.ops > 0 && s.tensors > s.ops / 4, "%lld ops, %lld tensors", (long long)s.ops, (long long)s.tensors);
    CHECK(s.planned_peak_bytes > 0 && s.flops_per_step > 0, "peak %llu, flops %g",
          (unsigned long long)s.planned_peak_bytes, s.flops_per_step);
    CHECK(s.batch == 16 && s.seq == 48 && s.replicas == 1 && s.total_steps == 7,
          "batch %lld seq %lld replicas %lld steps %lld", (long long)s.batch, (long long)s.seq, (long long)s.replicas,
          (long long)s.total_steps);

    /* A caller built against a shorter struct gets just the fields it knows. */
    struct {
        tunegraph_plan_summary head;
        char guard[8];
    } older;
    memset(&older, 0x5a, sizeof older);
    older.head.struct_size = offsetof(tunegraph_plan_summary, tensors);
    REQUIRE(tunegraph_plan_summarize(plan, &older.head) == 0, "%s", tunegraph_last_error());
    CHECK(older.head.ops == s.ops && older.head.struct_size == offsetof(tunegraph_plan_summary, tensors),
          "short struct: ops %lld", (long long)older.head.ops);
    CHECK(((unsigned char *)&older.head)[offsetof(tunegraph_plan_summary, tensors)] == 0x5a,
          "written past the caller's struct_size");

    char path[600], text_a[600], text_b[600];
    const char *dir = tg_test_tmpdir();
    snprintf(path, sizeof path, "%s/demo.tgp", dir);
    snprintf(text_a, sizeof text_a, "%s/a.json", dir);
    snprintf(text_b, sizeof text_b, "%s/b.json", dir);
    REQUIRE(tunegraph_plan_save(plan, path) == 0, "%s", tunegraph_last_error());
    CHECK(tg_test_count_files(dir) == 1, "%d files after an atomic save", tg_test_count_files(dir));
    REQUIRE(tunegraph_plan_load(path, &back) == 0, "%s", tunegraph_last_error());
    FILE *a = fopen(text_a, "w"), *b = fopen(text_b, "w");
    REQUIRE(a && b, "cannot write %s", dir);
    CHECK(tunegraph_plan_inspect(plan, a, TUNEGRAPH_FORMAT_JSON) == 0, "%s", tunegraph_last_error());
    CHECK(tunegraph_plan_inspect(back, b, TUNEGRAPH_FORMAT_JSON) == 0, "%s", tunegraph_last_error());
    fclose(a);
    fclose(b);
    long na, nb;
    char *ja = tg_test_read_file(text_a, &na), *jb = tg_test_read_file(text_b, &nb);
    REQUIRE(ja && jb, "inspect output missing");
    CHECK(na > 1000 && na == nb && memcmp(ja, jb, (size_t)na) == 0 && ja[0] == '{',
          "inspect of the loaded plan differs (%ld vs %ld bytes)", na, nb);
    free(ja);
    free(jb);
    tunegraph_plan_summary s2 = {.struct_size = sizeof s2};
    REQUIRE(tunegraph_plan_summarize(back, &s2) == 0, "%s", tunegraph_last_error());
    CHECK(memcmp(&s, &s2, sizeof s) == 0, "summaries differ after save and load");
    CHECK(tunegraph_plan_inspect(back, stdout, (tunegraph_format)3) == -1, "format 3 accepted");

    snprintf(path, sizeof path, "%s/missing/demo.tgp", dir);
    CHECK(tunegraph_plan_load(path, &back) == -1, "a missing plan loaded");
    CHECK_LAST_ERROR(path);
    tunegraph_plan_free(back);
    tunegraph_plan_free(plan);
}

/* Counts steps in order, each metrics struct sized as this library's. */
static void count_steps(void *ctx, const tunegraph_step_metrics *m) {
    int64_t *last = ctx;
    if (m->struct_size == sizeof *m && m->step == *last + 1) *last = m->step;
}

TG_TEST(api_trainer_steps_on_the_cpu) {
    tunegraph_plan *plan = NULL;
    const char *sets[] = {"steps=3", "batch=4", "seq=16"};
    REQUIRE(tunegraph_compile_text("model = tiny-bert\nsteps = 1\n"
                                   "train_data = data/sentiment-train.jsonl\neval_data = data/sentiment-eval.jsonl\n",
                                   "examples/", sets, 3, &plan) == 0,
            "%s", tunegraph_last_error());
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    REQUIRE(tunegraph_trainer_open(plan, &o, &tr) == 0, "%s", tunegraph_last_error());
    tunegraph_plan_free(plan); /* the trainer holds its own copy */
    int64_t total = 0;
    CHECK(tunegraph_trainer_total_steps(tr, &total) == 0 && total == 3, "total steps %lld", (long long)total);

    tunegraph_step_metrics m = {.struct_size = sizeof m};
    REQUIRE(tunegraph_trainer_step(tr, &m) == 0, "%s", tunegraph_last_error());
    CHECK(m.step == 1 && isfinite(m.loss) && m.loss > 0 && m.lr > 0 && m.grad_norm > 0 && m.step_ms > 0,
          "step %lld loss %g lr %g grad norm %g %g ms", (long long)m.step, m.loss, m.lr, m.grad_norm, m.step_ms);
    CHECK(m.tokens > 4 && m.tokens <= 4 * 16, "%lld tokens in 4 rows of 16", (long long)m.tokens);

    int64_t last = 1;
    CHECK(tunegraph_trainer_train(tr, count_steps, &last) == 0, "%s", tunegraph_last_error());
    CHECK(last == 3, "the callback saw steps up to %lld", (long long)last);
    CHECK(tunegraph_trainer_step(tr, &m) == -1, "a step past the schedule");
    CHECK_LAST_ERROR("all 3 steps");

    tunegraph_eval_metrics e = {.struct_size = sizeof e};
    REQUIRE(tunegraph_trainer_evaluate(tr, &e) == 0, "%s", tunegraph_last_error());
    CHECK(e.examples == 400 && e.counted == 400 && e.has_accuracy && !e.has_perplexity && e.accuracy >= 0 &&
              e.accuracy <= 1 && isfinite(e.loss),
          "eval: %lld examples, %lld counted, accuracy %d %g, loss %g", (long long)e.examples, (long long)e.counted,
          e.has_accuracy, e.accuracy, e.loss);

    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", tg_test_tmpdir());
    CHECK(tunegraph_trainer_save_weights(tr, path) == 0, "%s", tunegraph_last_error());
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size > 100000, "%s not written", path);
    tunegraph_trainer_close(tr);

    /* A CPU-only build refuses CUDA with a message; a GPU build without a GPU too. */
    REQUIRE(tunegraph_compile_file(DEMO, sets, 1, &plan) == 0, "%s", tunegraph_last_error());
    o.device = TUNEGRAPH_DEVICE_CUDA;
    if (tunegraph_trainer_open(plan, &o, &tr) == 0) tunegraph_trainer_close(tr);
    else CHECK(tunegraph_last_error()[0], "no message for a failed CUDA open");
    tunegraph_plan_free(plan);
}
