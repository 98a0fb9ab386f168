/* The compiler's front door: a job (a file, or text) with --set overrides becomes a plan,
 * and a compiled plan takes new run settings. The CLI and the public library reach the
 * compiler only through here, so no command-line or API code depends on its internals. */
#ifndef TUNEGRAPH_API_FRONT_H
#define TUNEGRAPH_API_FRONT_H

#include <stdint.h>

#include "base/error.h"
#include "base/output_paths.h"
#include "plan/plan.h"

/* Reads the job file, applies the overrides ("key=value") and compiles it. Errors name the
 * file, line and key. */
int tg_front_compile_file(const char *path, const char *const *overrides, int n_overrides, tg_plan *plan,
                          tg_err *err);
/* The same for a device with `memory_available` bytes free (0: unknown): a job with
 * recompute = auto and no memory_limit recomputes as little as fits that. */
int tg_front_compile_file_for(const char *path, const char *const *overrides, int n_overrides,
                              uint64_t memory_available, tg_plan *plan, tg_err *err);
/* The same from job text; `name` stands for the file in messages, and relative paths in the
 * text resolve against base_dir (NULL or "": the current directory). */
int tg_front_compile_text(const char *text, const char *name, const char *base_dir, const char *const *overrides,
                          int n_overrides, tg_plan *plan, tg_err *err);
/* Applies run settings (train_data, eval_data, steps, epochs, seed, log_every,
 * checkpoint_every, keep_checkpoints, checkpoint_dir, last_batch) to a
 * compiled plan and its bucket plans, parsed and checked as in a job file; any other key is
 * refused as compiled in, and a refusal leaves the plan as it was. `plan_name` names the plan in messages. */
int tg_front_set_run(tg_plan *plan, const char *const *settings, int n, const char *plan_name, tg_err *err);

/* Whether `key` is a job file key ("batch", "precision", ...): 1 or 0. */
int tg_front_job_key_known(const char *key);

/* The files a plan's run reads, for the output checks (tg_outputs_check): its model's
 * config.json and weights, its training and eval data (paths "" where it has none).
 * *config_path holds the first one's path (malloc'd; the caller frees it). */
#define TG_PLAN_INPUTS 4
int tg_front_plan_inputs(const tg_plan *plan, tg_named_path inputs[TG_PLAN_INPUTS], char **config_path, tg_err *err);

#endif
