/* A data-parallel run whose follower replica's thread cannot start (cli/main.c): the
 * process ends with status 1, the message on stderr, and the metrics file's one line is
 * the error of replica 0, the leader that failed to start it. The CLI binary runs (on the
 * CPU) in a shell whose stack limit (glibc's default thread stack size) is 10^12 KiB (about 0.9 PiB): more than
 * x86-64's 128 TiB of user address space, so no machine can map it (2 TB could be, on a
 * host that overcommits). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/harness.h"

TG_TEST(test_cli_main_replica_thread_cannot_start) {
    const char *dir = tg_test_tmpdir();
    char cmd[8192], err_path[800], metrics_path[800];
    snprintf(err_path, sizeof err_path, "%s/thread_err.txt", dir);
    snprintf(metrics_path, sizeof metrics_path, "%s/thread_m.jsonl", dir);
    snprintf(cmd, sizeof cmd,
             "ulimit -s 1000000000000 || exit 77; %s run examples/demo-classify.job --device cpu --set steps=1 "
             "--set batch=4 --set seq=16 --set data_parallel=2 --metrics %s 2>%s",
             tg_test_cli(), metrics_path, err_path);
    const int st = system(cmd);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        printf("    not run: this shell may not raise its stack limit (ulimit -s)\n");
        return;
    }
    char *err = tg_test_read_file(err_path, NULL);
    char *m = tg_test_read_file(metrics_path, NULL);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    CHECK(err && !strcmp(err, "tunegraph: cannot start the thread of replica 1\n"), "stderr: %s", err ? err : "(none)");
    CHECK(m && !strcmp(m, "{\"event\": \"error\", \"message\": \"cannot start the thread of replica 1\", \"replica\": 0}\n"),
          "metrics: %s", m ? m : "(none)");
    free(err);
    free(m);
}
