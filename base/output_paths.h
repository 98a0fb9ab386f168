/* What file an output path names, and the checks that keep an output from destroying an
 * input or another output: run before anything is read or trained, so a command never
 * fails late for an output it could have refused up front. */
#ifndef TUNEGRAPH_OUTPUT_PATHS_H
#define TUNEGRAPH_OUTPUT_PATHS_H

#include "base/error.h"

/* A path and what it is, for messages: "plan (-o)", "training data", ... */
typedef struct tg_named_path {
    const char *path;
    const char *what;
} tg_named_path;

/* The file a write to `path` replaces or creates: symlinks on its last component followed
 * (a dangling one to the name it points at), its folder made absolute with realpath. *out
 * is malloc'd. 0, or an errno value: ENAMETOOLONG for a path the system does not accept,
 * ENOENT for a missing folder, EISDIR for a name ending in '/', ELOOP, ENOMEM, ... */
int tg_output_resolve(const char *path, char **out);

/* Refuses, naming both paths, an output that is the same file as an input or as another
 * output (same device and inode where both exist, else the same resolved name); and an
 * output that is empty, longer than the system accepts, a folder or a socket, in a folder
 * that is missing or not writable, or an existing character device or FIFO that cannot be
 * written. Paths that are NULL or "" among the inputs are left out. Character devices are
 * never the same file as anything: they hold no data to destroy (/dev/null for two outputs
 * is fine). 0, or -1 with err set. */
int tg_outputs_check(const tg_named_path *outputs, int n_outputs, const tg_named_path *inputs, int n_inputs,
                     tg_err *err);

#endif
