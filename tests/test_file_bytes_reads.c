/* tg_file_bytes: regular files (empty, with NUL bytes), pipes read in growing steps, a
 * folder, a missing file, a read error, and allocation failures, each with its message. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "datasets/file_bytes.h"
#include "tests/harness.h"

#define PIPE_BYTES 200000

static char pattern(size_t i) { return (char)('a' + i % 23); }

/* A FIFO at path with a child writing PIPE_BYTES of pattern() into it; returns the child. */
static pid_t fifo_writer(const char *path) {
    if (mkfifo(path, 0600) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        int fd = open(path, O_WRONLY);
        static char buf[PIPE_BYTES];
        for (size_t i = 0; i < PIPE_BYTES; i++) buf[i] = pattern(i);
        size_t at = 0;
        while (fd >= 0 && at < PIPE_BYTES) {
            ssize_t w = write(fd, buf + at, PIPE_BYTES - at);
            if (w <= 0) break;
            at += (size_t)w;
        }
        _exit(at == PIPE_BYTES ? 0 : 1);
    }
    return pid;
}

TG_TEST(test_file_bytes_regular_files) {
    const char *dir = tg_test_tmpdir();
    char path[700];
    snprintf(path, sizeof path, "%s/data.bin", dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite("hello\0world", 1, 11, f) == 11, "write");
    fclose(f);
    char *buf = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_file_bytes(path, &buf, &len, &err) == 0, "%s", err.msg);
    CHECK(len == 11 && !memcmp(buf, "hello\0world", 11) && buf[11] == 0, "len %zu", len);
    free(buf);
    snprintf(path, sizeof path, "%s/empty.txt", dir);
    REQUIRE(tg_test_write_file(path, "") == 0, "write");
    REQUIRE(tg_file_bytes(path, &buf, &len, &err) == 0, "%s", err.msg);
    CHECK(len == 0 && buf && buf[0] == 0, "empty: len %zu", len);
    free(buf);
}

TG_TEST(test_file_bytes_refusals) {
    const char *dir = tg_test_tmpdir();
    char path[700], want[800];
    char *buf = (char *)1;
    size_t len = 9;
    tg_err err = {{0}};
    snprintf(path, sizeof path, "%s/missing.txt", dir);
    snprintf(want, sizeof want, "%s: cannot open: No such file or directory", path);
    CHECK(tg_file_bytes(path, &buf, &len, &err) == -1 && !strcmp(err.msg, want) && buf == NULL && len == 0, "'%s'",
          err.msg);
    snprintf(want, sizeof want, "%s: is a folder, not a file", dir);
    CHECK(tg_file_bytes(dir, &buf, &len, &err) == -1 && !strcmp(err.msg, want) && buf == NULL, "'%s'", err.msg);
    /* Reading address 0 of this process's memory fails with EIO. */
    CHECK(tg_file_bytes("/proc/self/mem", &buf, &len, &err) == -1 &&
              !strcmp(err.msg, "/proc/self/mem: read error: Input/output error") && buf == NULL,
          "'%s'", err.msg);
    snprintf(path, sizeof path, "%s/data.txt", dir);
    REQUIRE(tg_test_write_file(path, "some text") == 0, "write");
    snprintf(want, sizeof want, "%s: out of memory", path);
    tg_alloc_fail_after(0);
    int rc = tg_file_bytes(path, &buf, &len, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, want) && buf == NULL, "'%s'", err.msg);
}

/* A pipe has no size: the buffer starts at 64 KiB and doubles. */
TG_TEST(test_file_bytes_pipe_grows) {
    const char *dir = tg_test_tmpdir();
    for (int fail = 0; fail < 2; fail++) {
        char path[700];
        snprintf(path, sizeof path, "%s/fifo%d", dir, fail);
        pid_t pid = fifo_writer(path);
        REQUIRE(pid > 0, "fork");
        char *buf = NULL;
        size_t len = 0;
        tg_err err = {{0}};
        if (fail) tg_alloc_fail_after(1); /* the first buffer, then its growth fails */
        int rc = tg_file_bytes(path, &buf, &len, &err);
        tg_alloc_fail_after(-1);
        int status = 0;
        waitpid(pid, &status, 0);
        if (fail) {
            char want[800];
            snprintf(want, sizeof want, "%s: out of memory", path);
            CHECK(rc == -1 && !strcmp(err.msg, want) && buf == NULL, "'%s'", err.msg);
            continue;
        }
        REQUIRE(rc == 0, "%s", err.msg);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer status %d", status);
        CHECK(len == PIPE_BYTES && buf[len] == 0, "len %zu", len);
        size_t bad = 0;
        for (size_t i = 0; i < len; i++) bad += buf[i] != pattern(i);
        CHECK(bad == 0, "%zu bytes differ", bad);
        free(buf);
    }
}
