/* The manifest of a benchmark artifact (`--artifact DIR` on `run` and `sweep`): DIR/manifest.json
 * names every other file of the folder with its size and xxh64, and says which parts
 * could not be recorded. Written by cli/artifact.c, read back by `tunegraph compare`;
 * the reader is strict and touches no file (tests/fuzz/fuzz_artifact_manifest.c). */
#ifndef TUNEGRAPH_CLI_ARTIFACT_MANIFEST_H
#define TUNEGRAPH_CLI_ARTIFACT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define ARTIFACT_FORMAT "tunegraph-artifact"
#define ARTIFACT_VERSION 1
#define ARTIFACT_FILES_MAX 100000
#define ARTIFACT_PATH_MAX 1024 /* a listed path's longest, in bytes */

typedef struct artifact_manifest_file {
    char *path;     /* relative to the folder: no leading '/', no empty, "." or ".." part */
    uint64_t bytes;
    uint64_t xxh64;
} artifact_manifest_file;

typedef struct artifact_manifest {
    char command[16];          /* "run" or "sweep" */
    /* xxh64 of the job file as written and of the plan file, and the plan's fingerprint
     * (hex); "" where the artifact has none (a run given a plan has no job file; a sweep
     * has a plan per point). */
    char job_xxh64[17], plan_xxh64[17], plan_fingerprint[17];
    int n_files;
    artifact_manifest_file *files;
    int n_absent;              /* parts the artifact says it could not record */
} artifact_manifest;

/* Parses manifest text (`name` for messages: "NAME: field 'files'[3].path: ..."). 0, or -1
 * with the message and *m empty. */
int artifact_manifest_parse(const char *name, const char *text, size_t len, artifact_manifest *m, tg_err *err);
void artifact_manifest_free(artifact_manifest *m);
/* The manifest's entry for `path`, or NULL. */
const artifact_manifest_file *artifact_manifest_find(const artifact_manifest *m, const char *path);

/* Whether `path` is a path a manifest may list (see artifact_manifest_file.path). */
int artifact_path_ok(const char *path);

#endif
