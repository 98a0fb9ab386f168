/* Whole input files read into memory for the text readers of `data convert`. */
#ifndef TUNEGRAPH_FILE_BYTES_H
#define TUNEGRAPH_FILE_BYTES_H

#include <stddef.h>

#include "base/error.h"

/* Reads all of `path` into *buf (malloc'd, with a NUL after the last byte, which *len does
 * not count). Errors: "PATH: cannot open: reason", "PATH: read error: reason". */
int tg_file_bytes(const char *path, char **buf, size_t *len, tg_err *err);

#endif
