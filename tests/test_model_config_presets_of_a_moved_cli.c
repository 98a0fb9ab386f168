/* Where a program finds the model presets (models/model_config.c) when neither it nor the
 * library it runs sits in a tree with a presets folder: a copy of the CLI in a bare bin/
 * folder, with $TUNEGRAPH_PRESETS unset, falls back to the presets folder it was built with,
 * so an unknown model name still lists the presets. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "models/model_config.h"
#include "tests/harness.h"

static int copy_file(const char *from, const char *to) {
    long len = 0;
    char *bytes = tg_test_read_file(from, &len);
    if (!bytes) return -1;
    FILE *f = fopen(to, "wb");
    int ok = f && fwrite(bytes, 1, (size_t)len, f) == (size_t)len;
    if (f && fclose(f)) ok = 0;
    free(bytes);
    return ok && chmod(to, 0755) == 0 ? 0 : -1;
}

TG_TEST(test_model_config_presets_found_by_a_moved_cli) {
    const char *dir = tg_test_tmpdir();
    char bin[700], cli[800], job[800], data[800], out[800], plan[800];
    snprintf(bin, sizeof bin, "%s/bin", dir);
    snprintf(cli, sizeof cli, "%s/tunegraph", bin);
    snprintf(job, sizeof job, "%s/job.txt", dir);
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    snprintf(out, sizeof out, "%s/stderr.txt", dir);
    snprintf(plan, sizeof plan, "%s/p.plan", dir);
    REQUIRE(mkdir(bin, 0755) == 0, "mkdir %s", bin);
    REQUIRE(copy_file(tg_test_cli(), cli) == 0, "copy %s to %s", tg_test_cli(), cli);
    REQUIRE(tg_test_write_file(data, "{\"text\": \"a b\", \"label\": 0}\n") == 0, "%s", data);
    char text[1000];
    snprintf(text, sizeof text, "model = nope\ntrain_data = %s\nsteps = 1\n", data);
    REQUIRE(tg_test_write_file(job, text) == 0, "%s", job);
    const pid_t pid = fork();
    if (pid == 0) {
        unsetenv("TUNEGRAPH_PRESETS");
        const int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 2) < 0) _exit(126);
        execl(cli, cli, "compile", job, "-o", plan, (char *)NULL);
        _exit(127);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit status %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    char *msg = tg_test_read_file(out, NULL);
    /* The same list as this suite's own lookup (from the build tree) gives. */
    tg_model_config cfg;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("nope", &cfg, &err) == -1 &&
                strstr(err.msg, ", tiny-bert, "),
            "in-process: '%s'", err.msg);
    char want[1200];
    snprintf(want, sizeof want, "tunegraph: %s:1: key 'model': %s\n", job, err.msg);
    CHECK(msg && !strcmp(msg, want), "stderr '%s'\n    want '%s'", msg ? msg : "(none)", want);
    free(msg);
}
