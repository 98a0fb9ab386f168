/* api/front.c's list of the files a plan's run reads: the model config's path from a
 * preset name, a folder (trailing slashes dropped) or nothing, each exactly; the
 * out-of-memory refusal at each of its allocations; and run settings reaching every bucket
 * plan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/front.h"
#include "base/alloc.h"
#include "models/model_config.h"
#include "tests/harness.h"

/* The config path tg_front_plan_inputs gives for a plan whose model source is `source`,
 * and the other three inputs' paths and names, checked against the plan's. */
static char *config_path_for(const char *source) {
    static tg_plan plan; /* large: kept off the stack */
    memset(&plan, 0, sizeof plan);
    snprintf(plan.model.source, sizeof plan.model.source, "%s", source);
    snprintf(plan.model.weights, sizeof plan.model.weights, "/w/model.safetensors");
    snprintf(plan.run.train_data, sizeof plan.run.train_data, "/d/train");
    snprintf(plan.run.eval_data, sizeof plan.run.eval_data, "/d/eval");
    tg_named_path inputs[TG_PLAN_INPUTS];
    char *config = NULL;
    tg_err err = {0};
    if (!CHECK(tg_front_plan_inputs(&plan, inputs, &config, &err) == 0, "%s: %s", source, err.msg)) return NULL;
    CHECK(inputs[0].path == config && !strcmp(inputs[0].what, "model config"), "%s: input 0 is %s", source,
          inputs[0].what);
    CHECK(!strcmp(inputs[1].path, "/w/model.safetensors") && !strcmp(inputs[1].what, "model weights"),
          "input 1: %s (%s)", inputs[1].path, inputs[1].what);
    CHECK(!strcmp(inputs[2].path, "/d/train") && !strcmp(inputs[2].what, "training data (train_data)"),
          "input 2: %s (%s)", inputs[2].path, inputs[2].what);
    CHECK(!strcmp(inputs[3].path, "/d/eval") && !strcmp(inputs[3].what, "eval data (eval_data)"),
          "input 3: %s (%s)", inputs[3].path, inputs[3].what);
    return config;
}

static void expect_config_path(const char *source, const char *want) {
    char *got = config_path_for(source);
    CHECK(got && !strcmp(got, want), "source '%s': config path '%s', want '%s'", source, got ? got : "(none)", want);
    free(got);
}

TG_TEST(test_api_front_inputs_config_paths) {
    char preset[TG_PATH_MAX + 32];
    snprintf(preset, sizeof preset, "%s/tiny-bert/config.json", tg_presets_dir());
    expect_config_path("tiny-bert", preset);                          /* a preset by name */
    expect_config_path("no-such-preset", "no-such-preset/config.json"); /* no slash, no preset: a folder */
    expect_config_path("models/x", "models/x/config.json");
    expect_config_path("/m/bert///", "/m/bert/config.json"); /* trailing slashes dropped */
    expect_config_path("/m/bert/", "/m/bert/config.json");
    expect_config_path("/", "//config.json"); /* the root keeps its one slash */
    expect_config_path("", "");               /* no model source: no config file */
}

TG_TEST(test_api_front_inputs_out_of_memory) {
    /* A preset name allocates twice (the preset's path, then the folder's when there is no
     * such preset); a folder once; no source once (the empty path). Each failure is refused. */
    const struct {
        const char *source;
        int allocations;
    } cases[] = {{"no-such-preset", 2}, {"tiny-bert", 1}, {"/m/bert", 1}, {"", 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        static tg_plan plan;
        memset(&plan, 0, sizeof plan);
        snprintf(plan.model.source, sizeof plan.model.source, "%s", cases[c].source);
        for (int k = 0; k < cases[c].allocations; k++) {
            tg_named_path inputs[TG_PLAN_INPUTS];
            char *config = (char *)"unset";
            tg_err err = {0};
            tg_alloc_fail_only(k);
            const int rc = tg_front_plan_inputs(&plan, inputs, &config, &err);
            tg_alloc_fail_after(-1);
            CHECK(rc == -1 && config == NULL && strstr(err.msg, "out of memory for the model config path"),
                  "'%s', allocation %d failed: rc %d, message '%s'", cases[c].source, k, rc, err.msg);
        }
        /* One more allocation than it makes: nothing fails. */
        tg_named_path inputs[TG_PLAN_INPUTS];
        char *config = NULL;
        tg_err err = {0};
        tg_alloc_fail_after(cases[c].allocations);
        const int rc = tg_front_plan_inputs(&plan, inputs, &config, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == 0 && config, "'%s' with %d allocations allowed: %s", cases[c].source, cases[c].allocations,
              err.msg);
        free(config);
    }
}

/* A preset folder whose config.json is not a file (a folder of that name) is no preset:
 * the name is read as a folder of the working directory. */
TG_TEST(test_api_front_inputs_preset_config_not_a_file) {
    const char *dir = tg_test_tmpdir();
    char odd[800];
    snprintf(odd, sizeof odd, "%s/odd", dir);
    REQUIRE(mkdir(odd, 0755) == 0, "%s", odd);
    snprintf(odd, sizeof odd, "%s/odd/config.json", dir);
    REQUIRE(mkdir(odd, 0755) == 0, "%s", odd);
    const char *old = getenv("TUNEGRAPH_PRESETS");
    char *saved = old ? strdup(old) : NULL;
    setenv("TUNEGRAPH_PRESETS", dir, 1);
    expect_config_path("odd", "odd/config.json");
    if (saved) setenv("TUNEGRAPH_PRESETS", saved, 1);
    else unsetenv("TUNEGRAPH_PRESETS");
    free(saved);
}
