/* Failures of libc calls that no test can cause otherwise: the suite's binary defines
 * fdopen and read itself (they take the place of libc's for every caller in the process)
 * and passes each call on to libc's, unless a test armed a failure on the calling thread. */
#ifndef TUNEGRAPH_TESTS_LIBC_FAULTS_H
#define TUNEGRAPH_TESTS_LIBC_FAULTS_H

/* The next `count` calls of fdopen on this thread return NULL with errno ENOMEM (as when
 * its FILE cannot be allocated); 0 disarms. */
void tg_test_fail_fdopen(int count);

/* The next `count` calls of read on this thread return -1 with errno `error` (EIO: a
 * device's error; EINTR: a signal came first) without reading; 0 disarms. */
void tg_test_fail_read(int count, int error);

#endif
