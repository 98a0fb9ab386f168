/* tests/libc_faults.h: fdopen, read, rename and renameat2 defined in the test binary,
 * passing on to the next definition (libc's, or a sanitizer's that then calls libc's)
 * found with dlsym. */
#include "tests/libc_faults.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static _Thread_local int fdopen_failures, read_failures, read_error, renameat2_failures, renameat2_error,
    rename_error;
static _Thread_local int (*rename_fails)(const char *from, const char *to);
static _Thread_local size_t short_read_max;
static _Thread_local void (*short_read_then)(int fd);

void tg_test_fail_fdopen(int count) { fdopen_failures = count; }

void tg_test_fail_read(int count, int error) {
    read_failures = count;
    read_error = error;
}

void tg_test_short_read(size_t max, void (*then)(int fd)) {
    short_read_max = max;
    short_read_then = then;
}

void tg_test_fail_rename(int (*fails)(const char *from, const char *to), int error) {
    rename_fails = fails;
    rename_error = error;
}

void tg_test_fail_renameat2(int count, int error) {
    renameat2_failures = count;
    renameat2_error = error;
}

FILE *fdopen(int fd, const char *mode) {
    static FILE *(*next)(int, const char *);
    if (fdopen_failures > 0) {
        fdopen_failures--;
        errno = ENOMEM;
        return NULL;
    }
    if (!next) next = (FILE * (*)(int, const char *)) dlsym(RTLD_NEXT, "fdopen");
    if (!next) abort();
    return next(fd, mode);
}

ssize_t read(int fd, void *buf, size_t n) {
    static ssize_t (*next)(int, void *, size_t);
    if (read_failures > 0) {
        read_failures--;
        errno = read_error;
        return -1;
    }
    if (!next) next = (ssize_t(*)(int, void *, size_t))dlsym(RTLD_NEXT, "read");
    if (!next) abort();
    if (short_read_max) {
        const size_t max = short_read_max;
        void (*then)(int) = short_read_then;
        short_read_max = 0, short_read_then = NULL;
        const ssize_t got = next(fd, buf, n < max ? n : max);
        if (then) then(fd);
        return got;
    }
    return next(fd, buf, n);
}

int rename(const char *from, const char *to) {
    static int (*next)(const char *, const char *);
    if (rename_fails && rename_fails(from, to)) {
        errno = rename_error;
        return -1;
    }
    if (!next) next = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    if (!next) abort();
    return next(from, to);
}

int renameat2(int from_dir, const char *from, int to_dir, const char *to, unsigned flags) {
    static int (*next)(int, const char *, int, const char *, unsigned);
    if (renameat2_failures > 0) {
        renameat2_failures--;
        errno = renameat2_error;
        return -1;
    }
    if (!next) next = (int (*)(int, const char *, int, const char *, unsigned))dlsym(RTLD_NEXT, "renameat2");
    if (!next) abort();
    return next(from_dir, from, to_dir, to, flags);
}
