/* The sorted entries of one folder, for the folder-per-label readers of `data convert`
 * (text in datasets/text_folders.c, images in datasets/image_folders.c): byte order of the
 * names, so what is read does not depend on the file system's order; names starting with
 * '.' are left out. */
#ifndef TUNEGRAPH_FOLDER_NAMES_H
#define TUNEGRAPH_FOLDER_NAMES_H

#include <stddef.h>

#include "base/error.h"

typedef struct tg_folder_names {
    char **v;
    size_t n, cap;
} tg_folder_names;

/* The entries of `dir` that are folders (want_dir) or regular files (links followed),
 * sorted by bytes. Errors: "DIR: cannot open the folder: reason", "DIR/NAME: reason". */
int tg_folder_list(const char *dir, int want_dir, tg_folder_names *out, tg_err *err);
void tg_folder_names_free(tg_folder_names *s);

#endif
