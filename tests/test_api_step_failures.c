/* The public API's trainer calls failing below it (api/tunegraph.c): a step that diverges
 * ends tunegraph_trainer_train and tunegraph_trainer_step with the trainer's message; a
 * checkpoint each of whose allocations fails in turn is refused, then written; an export
 * whose folder would replace the training data, and one into a folder that takes no new folder. */
#include "include/tunegraph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job"
#define TRAIN_DATA "examples/data/sentiment-train.jsonl"

static tunegraph_trainer *open_cpu(const tunegraph_plan *plan) {
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    if (tunegraph_trainer_open(plan, &o, &tr)) {
        CHECK(0, "open: %s", tunegraph_last_error());
        return NULL;
    }
    return tr;
}

/* lr = 1e30 makes step 2's gradient norm not finite; skip_nonfinite = false stops there. */
TG_TEST(api_step_failures_diverged) {
    const char *sets[] = {"steps=6", "batch=4", "seq=16", "lr=1e30", "warmup_steps=0", "skip_nonfinite=false"};
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_file(DEMO, sets, 6, &plan) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer *tr = open_cpu(plan);
    REQUIRE(tr, "no trainer");
    CHECK(tunegraph_trainer_train(tr, NULL, NULL) == -1, "a diverging run trained");
    const char *msg = tunegraph_last_error();
    CHECK(!strncmp(msg, "step 2: the gradient norm is ", 29) &&
              strstr(msg, "diverged; the step was not applied, and skip_nonfinite = false stops here"),
          "train: '%s'", msg);
    tunegraph_trainer_close(tr);
    /* The same through single steps: step 1 is taken, step 2 refused. */
    tr = open_cpu(plan);
    REQUIRE(tr, "no trainer");
    tunegraph_step_metrics m = {.struct_size = sizeof m};
    CHECK(tunegraph_trainer_step(tr, &m) == 0 && m.step == 1, "step 1: %s", tunegraph_last_error());
    m.step = -7;
    CHECK(tunegraph_trainer_step(tr, &m) == -1 && m.step == -7, "step 2 was taken (%lld)", (long long)m.step);
    msg = tunegraph_last_error();
    CHECK(!strncmp(msg, "step 2: the gradient norm is ", 29) && strstr(msg, "diverged"), "step: '%s'", msg);
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);
}

/* Each allocation of a checkpoint (the trainer's state, its file, the folder's pointer)
 * fails in turn: refused with an out-of-memory message; then one is written. */
TG_TEST(api_step_failures_checkpoint_out_of_memory) {
    const char *sets[] = {"steps=2", "batch=4", "seq=16"};
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_file(DEMO, sets, 3, &plan) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer *tr = open_cpu(plan);
    tunegraph_plan_free(plan);
    REQUIRE(tr, "no trainer");
    REQUIRE(tunegraph_trainer_step(tr, NULL) == 0, "%s", tunegraph_last_error());
    char dir[800], path[900];
    snprintf(dir, sizeof dir, "%s/ck", tg_test_tmpdir());
    snprintf(path, sizeof path, "%s/step-000001.tgckpt", dir);
    int failures = 0, rc = -1;
    for (long k = 0; k < 10000 && rc != 0; k++) {
        tg_alloc_fail_only(k);
        rc = tunegraph_trainer_save_checkpoint(tr, dir);
        tg_alloc_fail_after(-1);
        if (rc == 0) break;
        failures++;
        /* "out of memory" from the library, or the system's "Cannot allocate memory" */
        CHECK(rc == -1 && strstr(tunegraph_last_error(), " memory"), "allocation %ld failed: rc %d, '%s'", k, rc,
              tunegraph_last_error());
    }
    struct stat st;
    CHECK(rc == 0 && failures > 0 && stat(path, &st) == 0 && st.st_size > 0, "after %d failures: rc %d, '%s'",
          failures, rc, tunegraph_last_error());
    tunegraph_trainer_close(tr);
}

TG_TEST(api_step_failures_export) {
    const char *dir = tg_test_tmpdir();
    char data[800], out[800];
    /* The training data is named config.json, in the folder exported to. */
    snprintf(data, sizeof data, "%s/config.json", dir);
    char *rows = tg_test_read_file(TRAIN_DATA, NULL);
    REQUIRE(rows, TRAIN_DATA);
    REQUIRE(tg_test_write_file(data, rows) == 0, "%s", data);
    tunegraph_plan *plan = NULL;
    REQUIRE(tunegraph_compile_text("model = tiny-bert\nnum_labels = 2\nsteps = 1\nbatch = 4\nseq = 16\n"
                                   "train_data = config.json\n",
                                   dir, NULL, 0, &plan) == 0,
            "%s", tunegraph_last_error());
    tunegraph_trainer *tr = open_cpu(plan);
    tunegraph_plan_free(plan);
    REQUIRE(tr, "no trainer");
    /* The model config's path is the first allocation. */
    snprintf(out, sizeof out, "%s/hf", dir);
    tg_alloc_fail_only(0);
    int rc = tunegraph_trainer_export_hf(tr, out, NULL);
    tg_alloc_fail_after(-1);
    struct stat st;
    CHECK(rc == -1 && !strcmp(tunegraph_last_error(), "out of memory for the model config path") && stat(out, &st) != 0,
          "export without memory: %d '%s'", rc, tunegraph_last_error());
    /* Into the data's folder, forced: its config.json would replace the training data. */
    tunegraph_export_options o = {.struct_size = sizeof o, .force = 1};
    rc = tunegraph_trainer_export_hf(tr, dir, &o);
    CHECK(rc == -1 && strstr(tunegraph_last_error(), "config.json"), "export over the data: %d '%s'", rc,
          tunegraph_last_error());
    /* Checked, then refused by the folder it would be made in (/proc takes no new folder). */
    rc = tunegraph_trainer_export_hf(tr, "/proc/tunegraph-export", NULL);
    const char *msg = tunegraph_last_error();
    CHECK(rc == -1 && !strncmp(msg, "/proc/.tunegraph-export.tmp.", 28) &&
              strstr(msg, ": cannot create the temporary folder: No such file or directory"),
          "export into /proc: %d '%s'", rc,
          tunegraph_last_error());
    char *back = tg_test_read_file(data, NULL);
    CHECK(back && !strcmp(back, rows), "the training data changed");
    free(back);
    free(rows);
    tunegraph_trainer_close(tr);
}
