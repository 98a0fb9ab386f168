/* A run whose stderr is a terminal (a pseudo-terminal here, in raw mode) stopped by SIGTERM
 * while its step-2 checkpoint is written (cli/main.c): its progress is the one rewritten
 * line ("\rstep N/4  loss ..."), and the stop's message starts on a line of its own after
 * it, naming the checkpoint and the folder to resume from. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "runtime/checkpoint.h"
#include "tests/harness.h"

/* Reads what is there on the terminal's master side into buf (NUL-terminated); 0 once
 * the other side is gone. */
static int drain(int master, char *buf, size_t cap, size_t *len) {
    for (;;) {
        struct pollfd p = {master, POLLIN, 0};
        if (poll(&p, 1, 10) != 1) return 1;
        if (*len + 1 >= cap) return 1;
        const ssize_t got = read(master, buf + *len, cap - 1 - *len);
        if (got <= 0) return got < 0 && errno == EAGAIN; /* EIO: the last writer closed */
        *len += (size_t)got;
        buf[*len] = 0;
    }
}

TG_TEST(test_cli_main_tty_stop) {
    const char *dir = tg_test_tmpdir();
    char ck[700], cli[PATH_MAX];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    if (!realpath(tg_test_cli(), cli)) snprintf(cli, sizeof cli, "%s", tg_test_cli());
    const int master = posix_openpt(O_RDWR | O_NOCTTY);
    REQUIRE(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0, "posix_openpt");
    const char *slave_name = ptsname(master);
    REQUIRE(slave_name, "ptsname");
    char slave_path[256];
    snprintf(slave_path, sizeof slave_path, "%s", slave_name);
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        const int slave = open(slave_path, O_RDWR | O_NOCTTY);
        if (slave < 0) _exit(127);
        struct termios t;
        if (tcgetattr(slave, &t) == 0) cfmakeraw(&t), tcsetattr(slave, TCSANOW, &t); /* no \r added to \n */
        dup2(slave, STDERR_FILENO);
        close(slave);
        close(master);
        setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", "2", 1);
        setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
        execl(cli, "tunegraph", "run", "examples/demo-classify.job", "--device", "cpu", "--set", "steps=4", "--set",
              "checkpoint_every=2", "--checkpoint-dir", ck, (char *)NULL);
        _exit(127);
    }
    static char said[1 << 16];
    size_t len = 0;
    said[0] = 0;
    int stalled = 0, status = 0, ended = 0;
    for (int i = 0; i < 12000 && !stalled && !ended; i++) {
        drain(master, said, sizeof said, &len);
        stalled = strstr(said, "stalled part-written") != NULL;
        ended = !stalled && waitpid(pid, &status, WNOHANG) == pid;
    }
    kill(pid, stalled ? SIGTERM : SIGKILL);
    if (!ended) {
        for (int i = 0; i < 12000 && waitpid(pid, &status, WNOHANG) != pid; i++) drain(master, said, sizeof said, &len);
    }
    drain(master, said, sizeof said, &len);
    close(master);
    REQUIRE(stalled, "the run did not stall at the step-2 checkpoint: %s", said);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %#x: %s", status, said);
    char *path = NULL;
    tg_err err;
    tg_checkpoint read;
    if (CHECK(tg_checkpoint_locate(ck, &path, &err) == 0 && tg_checkpoint_read(path, &read, &err) == 0, "%s",
              err.msg)) {
        char want[2400], progress[64];
        snprintf(want, sizeof want,
                 "\n\ntunegraph: interrupted by SIGTERM after step %d of 4; checkpoint %s (resume with --resume %s)\n",
                 read.state.step, path, ck);
        snprintf(progress, sizeof progress, "\rstep %d/4  loss ", read.state.step);
        CHECK(strstr(said, progress) && strstr(said, want), "terminal lacks '%s': %s", want, said);
        tg_checkpoint_free(&read);
    }
    free(path);
}
