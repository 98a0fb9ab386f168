#include "datasets/folder_names.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"

void tg_folder_names_free(tg_folder_names *s) {
    for (size_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static int by_bytes(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int tg_folder_list(const char *dir, int want_dir, tg_folder_names *out, tg_err *err) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) return tg_fail(err, "%s: cannot open the folder: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    char path[4096];
    while ((errno = 0, e = readdir(d))) { /* every failure below breaks out */
        if (e->d_name[0] == '.') continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) {
            rc = tg_fail(err, "%s/%s: path too long", dir, e->d_name);
            break;
        }
        struct stat st;
        if (stat(path, &st) != 0) {
            rc = tg_fail(err, "%s: %s", path, strerror(errno));
            break;
        }
        if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) continue;
        if (out->n == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 64;
            char **v = tg_realloc(out->v, cap * sizeof *v);
            if (!v) {
                rc = tg_fail(err, "out of memory");
                break;
            }
            out->v = v;
            out->cap = cap;
        }
        if (!(out->v[out->n] = tg_strdup(e->d_name))) {
            rc = tg_fail(err, "out of memory");
            break;
        }
        out->n++;
    }
    /* GCOVR_EXCL_BR_START: readdir fails only on a folder removed or corrupted while read */
    if (!rc && errno) rc = tg_fail(err, "%s: cannot read the folder: %s", dir, strerror(errno));
    /* GCOVR_EXCL_BR_STOP */
    closedir(d);
    if (rc) tg_folder_names_free(out);
    else if (out->n) qsort(out->v, out->n, sizeof *out->v, by_bytes);
    return rc;
}
