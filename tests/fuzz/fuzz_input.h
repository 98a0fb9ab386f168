/* The fuzz input as a file: the parsers take a path, so each input is written into one
 * memfd per process and handed over as /proc/self/fd/N (no parser changes, no disk). */
#ifndef TUNEGRAPH_FUZZ_INPUT_H
#define TUNEGRAPH_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Replaces the memfd's contents with data[0..size); returns its path. Aborts on a
 * system error, which is no finding about the parser. */
static inline const char *fuzz_input_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("tunegraph-fuzz", MFD_CLOEXEC);
        if (fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) {
        perror("ftruncate");
        abort();
    }
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        if (n <= 0) {
            perror("pwrite");
            abort();
        }
        done += (size_t)n;
    }
    return path;
}

/* A broken invariant after a successful parse: a finding, reported as a crash. */
#define FUZZ_ASSERT(cond, ...)                                          \
    do {                                                                \
        if (!(cond)) {                                                  \
            fprintf(stderr, "fuzz invariant failed: %s: ", #cond);      \
            fprintf(stderr, __VA_ARGS__);                               \
            fputc('\n', stderr);                                        \
            abort();                                                    \
        }                                                               \
    } while (0)

#endif
