#include "api/front.h"

#include "compiler/compile.h"
#include "compiler/job.h"

int tg_front_compile_file(const char *path, const char *const *overrides, int n_overrides, tg_plan *plan,
                          tg_err *err) {
    tg_job job;
    if (tg_job_load(path, overrides, n_overrides, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

int tg_front_compile_text(const char *text, const char *name, const char *base_dir, const char *const *overrides,
                          int n_overrides, tg_plan *plan, tg_err *err) {
    tg_job job;
    if (tg_job_parse_text(text, name, base_dir, overrides, n_overrides, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

int tg_front_set_run(tg_plan *plan, const char *const *settings, int n, const char *plan_name, tg_err *err) {
    return tg_job_apply_run_overrides(&plan->run, settings, n, plan_name, err);
}
