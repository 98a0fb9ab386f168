/* Benchmark artifacts: `--artifact DIR` on `run` and `sweep` writes into DIR what re-running
 * and comparing the benchmark needs: the job as written (job.job) and as resolved
 * (job.resolved.json: the plan's model, train and run settings, the overrides, the
 * fingerprint), the plan file(s), environment.json (cli/environment.h), the metrics, the
 * profile (profile.jsonl, with --profile), the plots, and manifest.json listing every file
 * with its size and xxh64 (cli/artifact_manifest.h). Each file is written atomically. */
#ifndef TUNEGRAPH_CLI_ARTIFACT_H
#define TUNEGRAPH_CLI_ARTIFACT_H

#include <stddef.h>

#include "base/error.h"
#include "cli/artifact_manifest.h"
#include "plan/plan.h"

/* A command's entry point: `run`'s, handed to the wrappers so they run it as the CLI does. */
typedef int (*cli_command_fn)(int argc, char **argv);

/* An artifact folder being written. */
typedef struct artifact artifact;

/* Creates folder `dir` and the missing folders above it (mkdir -p): 0, or an errno value. */
int artifact_make_folders(const char *dir);

/* Creates DIR (and the folders above it) or takes an empty one; a folder holding anything is
 * refused, so the manifest lists this artifact's files alone. command: "run" or "sweep". */
int artifact_open(artifact **a, const char *dir, const char *command, tg_err *err);
const char *artifact_dir(const artifact *a);
/* Writes DIR/name (subfolders made as needed) atomically. */
int artifact_write(artifact *a, const char *name, const void *data, size_t len, tg_err *err);
/* Copies file `src` to DIR/name. */
int artifact_copy(artifact *a, const char *name, const char *src, const char *what, tg_err *err);
/* Records a part the artifact could not hold, and why (listed in the manifest). */
int artifact_absent(artifact *a, const char *what, const char *why);
/* job.job: a copy of job file `input`, its xxh64 recorded in the manifest. */
int artifact_job(artifact *a, const char *input, tg_err *err);
/* PREFIX + job.resolved.json (the plan's model, train and run settings, the input and
 * overrides that made it) and PREFIX + plan.tgp; prefix "" (the artifact's one plan)
 * records the plan's xxh64 and fingerprint in the manifest. */
int artifact_plan(artifact *a, const char *prefix, const char *input, const char *const *sets, int n_sets,
                  const tg_plan *plan, tg_err *err);
/* environment.json for a run on `device` ("cpu" or "cuda"). */
int artifact_environment(artifact *a, const char *device, tg_err *err);
/* Writes manifest.json (every file under DIR, sorted by path, with its size and xxh64)
 * and frees a, whatever the outcome. */
int artifact_close(artifact *a, tg_err *err);
/* Drops a without a manifest. */
void artifact_free(artifact *a);

/* `tunegraph run ... --artifact DIR`: takes --artifact out of argv and, when it was
 * there, runs `run` with --metrics into the artifact (or copies the run's own --metrics
 * file into it) and then writes the artifact, the run failed or not (not after a usage
 * error). Returns run's exit status, or 1 when the artifact could not be written. */
int artifact_run(int argc, char **argv, cli_command_fn run);

/* Checks every file the manifest of artifact folder `dir` lists against its size and
 * xxh64; *m holds the manifest. 0, or -1 naming the file that differs. */
int artifact_verify(const char *dir, artifact_manifest *m, tg_err *err);

/* xxh64 (seed 0) of a whole file, its size into *bytes. 0, or -1 naming the file. */
int artifact_hash_file(const char *path, unsigned long long *hash, unsigned long long *bytes, tg_err *err);

#endif
