/* tests/libc_faults.h: fdopen and read defined in the test binary, passing on to the next
 * definition (libc's, or a sanitizer's that then calls libc's) found with dlsym. */
#include "tests/libc_faults.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static _Thread_local int fdopen_failures, read_failures, read_error;

void tg_test_fail_fdopen(int count) { fdopen_failures = count; }

void tg_test_fail_read(int count, int error) {
    read_failures = count;
    read_error = error;
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
    return next(fd, buf, n);
}
