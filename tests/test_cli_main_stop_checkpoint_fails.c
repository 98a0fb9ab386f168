/* A stop asked for before the first step whose checkpoint cannot be written (cli/main.c):
 * SIGTERM comes while the run reads its training data (a FIFO, so the test knows when), the
 * run stops before step 1 and writes the step-0 checkpoint, whose `latest` pointer cannot
 * replace the folder of that name; the run exits 1 naming the pointer, not by the signal. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

TG_TEST(test_cli_main_stop_checkpoint_fails) {
    const char *dir = tg_test_tmpdir();
    char fifo[700], ck[700], latest[800], err_path[700], data_arg[800], cli[PATH_MAX];
    snprintf(fifo, sizeof fifo, "%s/train.jsonl", dir);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(latest, sizeof latest, "%s/latest", ck);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    snprintf(data_arg, sizeof data_arg, "train_data=%s", fifo);
    REQUIRE(mkdir(ck, 0755) == 0 && mkdir(latest, 0755) == 0 && mkfifo(fifo, 0644) == 0, "%s", ck);
    char *rows = tg_test_read_file("examples/data/sentiment-train.jsonl", NULL);
    REQUIRE(rows, "the training data");
    if (!realpath(tg_test_cli(), cli)) snprintf(cli, sizeof cli, "%s", tg_test_cli());
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        signal(SIGTERM, SIG_DFL);
        const int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) _exit(127);
        dup2(fd, STDERR_FILENO);
        setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
        execl(cli, "tunegraph", "run", "examples/demo-classify.job", "--device", "cpu", "--set", "steps=4", "--set",
              "batch=4", "--set", "seq=16", "--set", data_arg, "--checkpoint-dir", ck, (char *)NULL);
        _exit(127);
    }
    /* The FIFO takes a writer once the run opened it to read. */
    int w = -1, status = 0, ended = 0;
    for (int i = 0; i < 12000 && w < 0 && !ended; i++) {
        w = open(fifo, O_WRONLY | O_NONBLOCK);
        if (w < 0) {
            ended = waitpid(pid, &status, WNOHANG) == pid;
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        }
    }
    if (w >= 0) {
        kill(pid, SIGTERM); /* held until the trainer is open, then a stop before step 1 */
        fcntl(w, F_SETFL, fcntl(w, F_GETFL) & ~O_NONBLOCK);
        void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN); /* a run that ended reads no more */
        for (size_t off = 0, n = strlen(rows); off < n;) {
            const ssize_t put = write(w, rows + off, n - off);
            if (put <= 0) break;
            off += (size_t)put;
        }
        close(w);
        signal(SIGPIPE, old_pipe);
    } else if (!ended) {
        kill(pid, SIGKILL);
    }
    free(rows);
    for (int i = 0; i < 12000 && !ended; i++) {
        ended = waitpid(pid, &status, WNOHANG) == pid;
        if (!ended) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    if (!ended) kill(pid, SIGKILL), waitpid(pid, &status, 0);
    char *said = tg_test_read_file(err_path, NULL);
    REQUIRE(w >= 0, "the run never opened its training data: %s", said ? said : "");
    char want[1000];
    snprintf(want, sizeof want, "\ntunegraph: %s: cannot write the checkpoint pointer (rename: Is a directory)\n", latest);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %#x: %s", status, said ? said : "");
    CHECK(said && strstr(said, "tunegraph: stopping after the steps in flight to write a checkpoint") &&
              strstr(said, want) && !strstr(said, "interrupted by"),
          "stderr: %s", said ? said : "");
    free(said);
}
