#include "base/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Makes the rename durable; a failure here loses nothing already written. */
static void sync_folder_of(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
    int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(dir);
}

int tg_write_file_atomic(const char *path, const tg_chunk *chunks, int n_chunks, const char *kind, tg_err *err) {
    size_t tmp_len = strlen(path) + 32;
    char *tmp = malloc(tmp_len);
    if (!tmp) return tg_fail(err, "%s: out of memory", path);
    /* Unique per thread as well as per process: the replicas of a data-parallel run are
     * threads that may save the same cache file at once. */
    snprintf(tmp, tmp_len, "%s.tmp.%ld.%ld", path, (long)getpid(), (long)syscall(SYS_gettid));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return tg_fail(err, "%s: cannot create the %s: %s", path, kind, strerror(e));
    }
    const char *step = NULL;
    int e = 0;
    for (int i = 0; i < n_chunks && !step; i++)
        if (chunks[i].len && write_all(fd, chunks[i].data, chunks[i].len)) step = "write", e = errno;
    if (!step && fsync(fd)) step = "fsync", e = errno;
    if (close(fd) && !step) step = "close", e = errno;
    if (!step && rename(tmp, path)) step = "rename", e = errno;
    if (step) unlink(tmp);
    free(tmp);
    if (step) return tg_fail(err, "%s: cannot write the %s (%s: %s)", path, kind, step, strerror(e));
    sync_folder_of(path);
    return 0;
}
