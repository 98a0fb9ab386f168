/* Whole-file writes that never leave a partial file: readers see the old file or the new. */
#ifndef TUNEGRAPH_ATOMIC_FILE_H
#define TUNEGRAPH_ATOMIC_FILE_H

#include <stddef.h>

#include "base/error.h"

typedef struct tg_chunk {
    const void *data;
    size_t len;
} tg_chunk;

/* Writes the chunks, in order, to a temporary file beside `path`, fsyncs it, renames it
 * over `path` and fsyncs the folder. On failure the temporary file is removed, `path` is
 * untouched, and err reads "PATH: cannot create the KIND: reason" or "PATH: cannot write
 * the KIND (step: reason)". */
int tg_write_file_atomic(const char *path, const tg_chunk *chunks, int n_chunks, const char *kind, tg_err *err);

#endif
