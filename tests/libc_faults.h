/* Failures of libc calls that no test can cause otherwise: the suite's binary defines
 * fdopen, read, rename and renameat2 itself (they take the place of libc's for every caller in the process)
 * and passes each call on to libc's, unless a test armed a failure on the calling thread. */
#ifndef TUNEGRAPH_TESTS_LIBC_FAULTS_H
#define TUNEGRAPH_TESTS_LIBC_FAULTS_H

#include <stddef.h>

/* The next `count` calls of fdopen on this thread return NULL with errno ENOMEM (as when
 * its FILE cannot be allocated); 0 disarms. */
void tg_test_fail_fdopen(int count);

/* The next `count` calls of read on this thread return -1 with errno `error` (EIO: a
 * device's error; EINTR: a signal came first) without reading; 0 disarms. */
void tg_test_fail_read(int count, int error);

/* The next call of read on this thread reads at most `max` bytes (a short count, as a
 * signal or a slow device may give), then calls `then(fd)` if non-NULL before returning
 * (a test grows the file there, as a writer might meanwhile); 0 disarms. */
void tg_test_short_read(size_t max, void (*then)(int fd));

/* Calls of rename on this thread for which `fails(from, to)` returns nonzero return -1
 * with errno `error` and rename nothing; NULL disarms. */
void tg_test_fail_rename(int (*fails)(const char *from, const char *to), int error);

/* The next `count` calls of renameat2 on this thread return -1 with errno `error` (EINVAL:
 * a file system without RENAME_EXCHANGE) and rename nothing; 0 disarms. */
void tg_test_fail_renameat2(int count, int error);

#endif
