/* The CLI run in the test process (tests/test_cli_metrics.c compiles the CLI sources in), with
 * its stdout and stderr captured: for tests that reach the CLI's own paths with the
 * allocation hook or tests/libc_faults.h armed, which a child process would not see. */
#ifndef TUNEGRAPH_TESTS_CLI_IN_PROCESS_H
#define TUNEGRAPH_TESTS_CLI_IN_PROCESS_H

#include <stddef.h>

typedef struct tg_cli_run {
    int status;      /* tunegraph_cli_main's, or -1 when the capture could not be set up */
    char *out, *err; /* what it wrote (malloc'd; out NULL when it went elsewhere) */
} tg_cli_run;

/* tunegraph_cli_main(argc, argv) with stderr into dir/cli-err.txt and stdout into out_path:
 * NULL for dir/cli-out.txt (read back into out), "-" for stdout closed. */
tg_cli_run tg_test_cli_argv(const char *dir, int argc, char **argv, const char *out_path);
/* The same on the words of `line` split at spaces ("tunegraph" put first). */
tg_cli_run tg_test_cli_line(const char *dir, const char *line, const char *out_path);
void tg_cli_run_free(tg_cli_run *r);
/* The demo classification job compiled into dir/p.tgp (1 step, batch 4, seq 16) and run
 * with `run_extra` (words, or ""), its weights saved to dir/w.safetensors, whose path goes
 * to weights: 1, or 0 with the failing command's message CHECKed. */
int tg_test_cli_demo_weights(const char *dir, const char *run_extra, char *weights, size_t cap);

#endif
