#include "base/text_file.h"
#include "base/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tg_read_text_file(const char *path, size_t max, const char *what, char **text, size_t *len, tg_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return tg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    size_t n = 0, cap = 0;
    char *buf = NULL;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            if (cap > max) {
                rc = tg_fail(err, "%s: more than %zu bytes: too big for %s", path, max, what);
                break;
            }
            cap = cap ? 2 * cap : 16384;
            if (cap > max) cap = max + 1; /* one past: too big */
            char *grown = tg_realloc(buf, cap + 1);
            if (!grown) {
                rc = tg_fail(err, "%s: out of memory", path);
                break;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) rc = tg_fail(err, "%s: cannot read: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (rc) {
        free(buf);
        return -1;
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return 0;
}
