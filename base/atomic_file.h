/* Whole-file writes that never leave a partial file: readers see the old file or the new.
 * The new file is written under a temporary name beside its target and renamed over it;
 * every temporary name in use is registered, so a process that ends on a signal or in a
 * failing thread can remove them first (tg_atomic_remove_temps). */
#ifndef TUNEGRAPH_ATOMIC_FILE_H
#define TUNEGRAPH_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "base/error.h"

typedef struct tg_chunk {
    const void *data;
    size_t len;
} tg_chunk;

/* A file being written in place of another. */
typedef struct tg_atomic_file tg_atomic_file;

/* Starts writing the file at `path`. A symlink there is followed and its target replaced
 * (the link stays a link); an existing character device, FIFO or block device is written
 * directly, never renamed over; anything else gets a temporary file beside it, named
 * "<name>.tmp.<pid>.<n>" (the name shortened to fit the system's limit), which keeps the
 * mode of the file it replaces. Paths of any length the system accepts work; on failure
 * err reads "PATH: cannot create the KIND: reason". */
int tg_atomic_begin(const char *path, const char *kind, tg_atomic_file **out, tg_err *err);
/* The descriptor to write to, or a stdio stream on it (made on the first call; NULL when
 * out of memory). Use one or the other. */
int tg_atomic_fd(const tg_atomic_file *f);
FILE *tg_atomic_stream(tg_atomic_file *f);
/* Flushes and fsyncs the file, renames it over its target and fsyncs the folder; on
 * failure the temporary file is removed, the target is untouched, and err reads "PATH:
 * cannot write the KIND (step: reason)". Frees f either way. */
int tg_atomic_commit(tg_atomic_file *f, tg_err *err);
/* Drops the file: the temporary file is removed, the target untouched. Frees f. */
void tg_atomic_discard(tg_atomic_file *f);

/* Writes the chunks, in order, through tg_atomic_begin and tg_atomic_commit. */
int tg_write_file_atomic(const char *path, const tg_chunk *chunks, int n_chunks, const char *kind, tg_err *err);

/* Removes every registered temporary file, with async-signal-safe calls only: for a
 * signal handler or a thread that ends the process, which must end after it (the files
 * being written can no longer be committed). */
void tg_atomic_remove_temps(void);

#endif
