#include "datasets/file_bytes.h"
#include "base/alloc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>

int tg_file_bytes(const char *path, char **buf, size_t *len, tg_err *err) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return tg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    /* fstat of an open stream's descriptor does not fail; were it to, st stays zero: a
     * file of unknown size, read in growing steps. */
    struct stat st = {0};
    (void)fstat(fileno(f), &st);
    if (S_ISDIR(st.st_mode)) {
        fclose(f);
        return tg_fail(err, "%s: is a folder, not a file", path);
    }
    /* Read in growing steps rather than trusting st_size: pipes and /proc files have none. */
    size_t cap = st.st_size > 0 ? (size_t)st.st_size + 1 : 65536, n = 0;
    char *b = tg_malloc(cap);
    while (b) {
        size_t got = fread(b + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        if (cap > SIZE_MAX / 2) { /* GCOVR_EXCL_BR_LINE: no file fills half the address space */
            free(b);
            b = NULL;
            break;
        }
        char *bigger = tg_realloc(b, cap * 2);
        if (!bigger) free(b);
        b = bigger;
        cap *= 2;
    }
    int failed = !b ? ENOMEM : ferror(f) ? (errno ? errno : EIO) : 0; /* GCOVR_EXCL_BR_LINE: ferror follows a read(2) that failed and set errno (tested with /proc/self/mem); EIO stands in only for a C library that would not */
    fclose(f);
    if (failed) {
        free(b);
        return failed == ENOMEM ? tg_fail(err, "%s: out of memory", path)
                                : tg_fail(err, "%s: read error: %s", path, strerror(failed));
    }
    b[n] = 0; /* n < cap: the loop left after a short read */
    *buf = b;
    *len = n;
    return 0;
}
