/* A data-parallel run whose training data went away after the plan was compiled
 * (cli/main.c): every replica's trainer fails to open, the follower's in its own thread;
 * the process ends with status 1, the data file named on stderr (by each replica that
 * says so before the process ends) and as the metrics file's one error line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/harness.h"

TG_TEST(test_cli_main_replica_open_fails) {
    const char *dir = tg_test_tmpdir();
    char data[800], plan[800], err_path[800], metrics_path[800], cmd[8192];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    snprintf(plan, sizeof plan, "%s/p2.tgp", dir);
    snprintf(err_path, sizeof err_path, "%s/open_err.txt", dir);
    snprintf(metrics_path, sizeof metrics_path, "%s/open_m.jsonl", dir);
    char *rows = tg_test_read_file("examples/data/sentiment-train.jsonl", NULL);
    REQUIRE(rows && tg_test_write_file(data, rows) == 0, "%s", data);
    free(rows);
    snprintf(cmd, sizeof cmd,
             "%s compile examples/demo-classify.job -o %s --set steps=2 --set batch=4 --set seq=16 --set data_parallel=2 "
             "--set train_data=%s >/dev/null 2>&1",
             tg_test_cli(), plan, data);
    REQUIRE(system(cmd) == 0, "%s", cmd);
    REQUIRE(remove(data) == 0, "%s", data);
    snprintf(cmd, sizeof cmd, "%s run %s --device cpu --metrics %s 2>%s", tg_test_cli(), plan, metrics_path, err_path);
    const int st = system(cmd);
    char *err = tg_test_read_file(err_path, NULL), *m = tg_test_read_file(metrics_path, NULL);
    char want[1200];
    snprintf(want, sizeof want, "%s: cannot open dataset: No such file or directory", data);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    /* each replica that fails before the process ends says so, naming the file */
    int lines = 0, named = 0;
    for (const char *l = err; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : "") {
        const size_t len = strcspn(l, "\n");
        lines++;
        named += !strncmp(l, "tunegraph: ", 11) && memmem(l, len, want, strlen(want)) != NULL;
    }
    CHECK(lines >= 1 && lines <= 2 && named == lines, "stderr: %s", err ? err : "(none)");
    CHECK(m && !strncmp(m, "{\"event\": \"error\", \"message\": \"", 31) && strstr(m, want) &&
              strchr(m, '\n') == m + strlen(m) - 1,
          "metrics: %s", m ? m : "(none)");
    free(err);
    free(m);
}
