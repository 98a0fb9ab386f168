#include "api/front.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"

int tg_front_compile_file(const char *path, const char *const *overrides, int n_overrides, tg_plan *plan,
                          tg_err *err) {
    return tg_front_compile_file_for(path, overrides, n_overrides, 0, plan, err);
}

int tg_front_compile_file_for(const char *path, const char *const *overrides, int n_overrides,
                              uint64_t memory_available, tg_plan *plan, tg_err *err) {
    tg_job job;
    if (tg_job_load(path, overrides, n_overrides, &job, err)) return -1;
    job.memory_available = memory_available;
    return tg_compile(&job, plan, err);
}

int tg_front_compile_text(const char *text, const char *name, const char *base_dir, const char *const *overrides,
                          int n_overrides, tg_plan *plan, tg_err *err) {
    tg_job job;
    if (tg_job_parse_text(text, name, base_dir, overrides, n_overrides, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

int tg_front_set_run(tg_plan *plan, const char *const *settings, int n, const char *plan_name, tg_err *err) {
    if (tg_job_apply_run_overrides(&plan->run, plan->train.n_buckets, settings, n, plan_name, err)) return -1;
    /* A bucket plan's run settings are the plan's. */
    for (int k = 0; plan->buckets && k + 1 < plan->train.n_buckets; k++) plan->buckets[k].run = plan->run;
    return 0;
}

int tg_front_job_key_known(const char *key) {
    for (int k = 0; k < TG_JOB_KEY_COUNT; k++)
        if (!strcmp(tg_job_key_name(k), key)) return 1;
    return 0;
}

/* The config.json tg_model_config_load read for `source`: a preset's when the name has no
 * '/' and such a preset exists, else the folder's. */
static char *model_config_path(const char *source) {
    struct stat st;
    char *path = NULL;
    if (!strchr(source, '/')) {
        if (tg_asprintf(&path, "%s/%s/config.json", tg_presets_dir(), source) < 0) return NULL;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) return path;
        free(path);
    }
    size_t n = strlen(source);
    while (n > 1 && source[n - 1] == '/') n--;
    return tg_asprintf(&path, "%.*s/config.json", (int)n, source) < 0 ? NULL : path;
}

int tg_front_plan_inputs(const tg_plan *plan, tg_named_path inputs[TG_PLAN_INPUTS], char **config_path, tg_err *err) {
    *config_path = plan->model.source[0] ? model_config_path(plan->model.source) : tg_strdup("");
    if (!*config_path) return tg_fail(err, "out of memory for the model config path");
    inputs[0] = (tg_named_path){*config_path, "model config"};
    inputs[1] = (tg_named_path){plan->model.weights, "model weights"};
    inputs[2] = (tg_named_path){plan->run.train_data, "training data (train_data)"};
    inputs[3] = (tg_named_path){plan->run.eval_data, "eval data (eval_data)"};
    return 0;
}
