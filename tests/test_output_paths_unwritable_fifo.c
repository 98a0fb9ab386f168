/* An output that names a FIFO (or device) it may not write (base/output_paths.c): refused
 * with the output's name, its path and the cause, before anything is written. A FIFO of
 * mode 0444 is unwritable for anyone but root, so as root the check runs in a child
 * process that has become the unprivileged user 65534 (nobody). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/coverage_flush.h"
#include "base/output_paths.h"
#include "tests/harness.h"

TG_TEST(test_outputs_check_unwritable_fifo) {
    char dir[] = "/tmp/tg_fifo_XXXXXX", fifo[64];
    REQUIRE(mkdtemp(dir) && chmod(dir, 0755) == 0, "mkdtemp");
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    REQUIRE(mkfifo(fifo, 0444) == 0, "mkfifo %s", fifo);
    int fds[2];
    REQUIRE(pipe(fds) == 0, "pipe");
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        /* The saved ids stay root's, so that the child can take them back to write gcov's
         * counts (owned by root) in the coverage build; access() checks the real ids. */
        const int was_root = geteuid() == 0;
        if (was_root && (setresgid(65534, 65534, 0) || setresuid(65534, 65534, 0))) _exit(2);
        tg_err err = {{0}};
        const tg_named_path out = {fifo, "metrics"};
        const int rc = tg_outputs_check(&out, 1, NULL, 0, &err);
        const ssize_t n = write(fds[1], err.msg, strlen(err.msg));
        if (was_root && (setresuid(0, 0, 0) || setresgid(0, 0, 0))) _exit(3);
        tg_coverage_flush(); /* _exit skips gcov's writer */
        _exit(rc == -1 && n >= 0 ? 0 : 1);
    }
    close(fds[1]);
    char msg[sizeof((tg_err *)0)->msg + 1] = "";
    size_t len = 0;
    ssize_t n;
    while (len < sizeof msg - 1 && (n = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0) len += (size_t)n;
    msg[len] = 0;
    close(fds[0]);
    int st = -1;
    waitpid(pid, &st, 0);
    unlink(fifo);
    rmdir(dir);
    char want[200];
    snprintf(want, sizeof want, "metrics %s: cannot be written: Permission denied", fifo);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the check in the child: status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    CHECK(!strcmp(msg, want), "'%s'\n    want '%s'", msg, want);
}
