#include "tests/cli_in_process.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"

int tunegraph_cli_main(int argc, char **argv);

tg_cli_run tg_test_cli_argv(const char *dir, int argc, char **argv, const char *out_path) {
    tg_cli_run r = {-1, NULL, NULL};
    char own_out[700], err_path[700];
    snprintf(own_out, sizeof own_out, "%s/cli-out.txt", dir);
    snprintf(err_path, sizeof err_path, "%s/cli-err.txt", dir);
    const int closed = out_path && !strcmp(out_path, "-");
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(STDOUT_FILENO), saved_err = dup(STDERR_FILENO);
    int fo = closed ? -2 : open(out_path ? out_path : own_out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (saved_out < 0 || saved_err < 0 || fo == -1 || fe < 0) return r;
    if (closed) close(STDOUT_FILENO);
    else dup2(fo, STDOUT_FILENO), close(fo);
    dup2(fe, STDERR_FILENO);
    close(fe);
    r.status = tunegraph_cli_main(argc, argv);
    /* A closed or full stdout leaves its error set; the stream must work again after. */
    clearerr(stdout);
    fflush(stdout);
    clearerr(stdout);
    fflush(stderr);
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_err, STDERR_FILENO);
    close(saved_out);
    close(saved_err);
    if (!out_path) r.out = tg_test_read_file(own_out, NULL);
    r.err = tg_test_read_file(err_path, NULL);
    return r;
}

tg_cli_run tg_test_cli_line(const char *dir, const char *line, const char *out_path) {
    char words[4096], *argv[256];
    int argc = 0;
    argv[argc++] = "tunegraph";
    snprintf(words, sizeof words, "%s", line);
    for (char *w = strtok(words, " "); w && argc < 255; w = strtok(NULL, " ")) argv[argc++] = w;
    argv[argc] = NULL;
    return tg_test_cli_argv(dir, argc, argv, out_path);
}

void tg_cli_run_free(tg_cli_run *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

int tg_test_cli_demo_weights(const char *dir, const char *run_extra, char *weights, size_t cap) {
    char line[2048];
    snprintf(line, sizeof line, "compile examples/demo-classify.job -o %s/p.tgp --set steps=1 --set batch=4 --set seq=16",
             dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    const int compiled = CHECK(r.status == 0, "compile: %s", r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    if (!compiled) return 0;
    snprintf(weights, cap, "%s/w.safetensors", dir);
    snprintf(line, sizeof line, "run %s/p.tgp %s --save %s", dir, run_extra, weights);
    r = tg_test_cli_line(dir, line, NULL);
    const int ran = CHECK(r.status == 0, "run: %s", r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    return ran;
}
