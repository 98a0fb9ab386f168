/* Reading a whole small text file (config.json, a checkpoint index) with a size bound. */
#ifndef TUNEGRAPH_TEXT_FILE_H
#define TUNEGRAPH_TEXT_FILE_H

#include <stddef.h>

#include "base/error.h"

/* The whole file, NUL-terminated, in *text (malloc'd), its length in *len. More than `max`
 * bytes is refused ("PATH: more than MAX bytes: too big for WHAT"), so a huge or endless
 * file (a FIFO, /dev/zero) is refused promptly. */
int tg_read_text_file(const char *path, size_t max, const char *what, char **text, size_t *len, tg_err *err);

#endif
