/* The progress line of long commands (cli/progress.c): its text, and when it is printed:
 * nothing in a command's first seconds, then on a terminal a line redrawn in place and
 * ended at the end, elsewhere a plain line every CLI_PROGRESS_LOG_S. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/progress.h"
#include "tests/harness.h"

TG_TEST(test_cli_progress_text) {
    char buf[256];
    cli_progress_text(buf, sizeof buf, "data convert", 250, 1000, 50000, 5.0);
    CHECK(!strcmp(buf, "data convert: 250/1000 (25.0%), 50000 tokens, 10000 tokens/s, ETA 0:00:15"), "'%s'", buf);
    cli_progress_text(buf, sizeof buf, "x", 0, 0, 0, 0);
    CHECK(!strcmp(buf, "x: 0/0 (0.0%), 0 tokens, 0 tokens/s, ETA -"), "'%s'", buf);
    cli_progress_text(buf, sizeof buf, "x", 1, 7201, 3, 1.0);
    CHECK(strstr(buf, "ETA 2:00:00"), "'%s'", buf);
}

/* What the updates print, with stderr in a file and the clock's start moved back. */
static char *printed(int tty, double started_ago, double shown_ago, int end) {
    char path[800];
    snprintf(path, sizeof path, "%s/progress.txt", tg_test_tmpdir());
    fflush(stderr);
    int saved = dup(STDERR_FILENO), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (saved < 0 || fd < 0) return NULL;
    dup2(fd, STDERR_FILENO);
    close(fd);
    cli_progress p;
    cli_progress_init(&p, "rows", tty);
    p.start_s -= started_ago, p.shown_s -= shown_ago;
    cli_progress_update(&p, 5, 10, 100);
    if (end) cli_progress_end(&p);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    return tg_test_read_file(path, NULL);
}

TG_TEST(test_cli_progress_when_printed) {
    char *t = printed(0, 1.0, 1.0, 1);
    CHECK(t && !*t, "within the quiet start: '%s'", t ? t : "(none)");
    free(t);
    t = printed(0, 5.0, 5.0, 1);
    CHECK(t && !*t, "not a terminal, a line shown 5 s ago: '%s'", t ? t : "(none)");
    free(t);
    t = printed(0, 30.0, 30.0, 1);
    CHECK(t && !strncmp(t, "rows: 5/10 (50.0%), 100 tokens, ", 32) && t[strlen(t) - 1] == '\n' && !strchr(t, '\r'),
          "not a terminal: '%s'", t ? t : "(none)");
    free(t);
    t = printed(1, 3.0, 1.0, 1);
    CHECK(t && t[0] == '\r' && !strncmp(t + 1, "rows: 5/10", 10) && t[strlen(t) - 1] == '\n', "terminal: '%s'",
          t ? t : "(none)");
    free(t);
    t = printed(1, 3.0, 0.0, 1);
    CHECK(t && !*t, "terminal, just shown: '%s'", t ? t : "(none)");
    free(t);
}
