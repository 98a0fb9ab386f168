/* tunegraph export and predict (cli/export.c) run in this process, through the CLI that
 * tests/test_cli_metrics.c compiles in: an export refused because a file it reads (the
 * plan file, the weights) is inside the output folder it would replace, each named as what
 * it is; a prediction whose logits file gets no stream (fdopen out of memory, see
 * tests/libc_faults.h): exit 1 with "out of memory" and neither the logits file nor a
 * temporary file left, and the same command then writing one line per example. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/libc_faults.h"


/* tunegraph_cli_main on argv (argc words) in dir (tests/cli_in_process.h): its status,
 * and stderr into *said (malloc'd). */
static int run_cli(const char *dir, int argc, char **argv, char **said) {
    tg_cli_run r = tg_test_cli_argv(dir, argc, argv, NULL);
    free(r.out);
    *said = r.err;
    return r.status;
}

/* Names in dir starting with "." (temporary files). */
static int hidden_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

TG_TEST(test_cli_export_logits_stream_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    char data[800], out[800];
    snprintf(data, sizeof data, "%s/two.jsonl", dir);
    snprintf(out, sizeof out, "%s/logits.jsonl", dir);
    REQUIRE(tg_test_write_file(data, "{\"input_ids\": [1, 5, 9]}\n{\"input_ids\": [2, 4]}\n") == 0, "%s", data);
    char *argv[] = {"tunegraph", "predict", "examples/demo-lm.job", "-o", out, "--data", data, "--init-missing",
                    "--threads", "1", "--device", "cpu", NULL};
    const int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    char *said = NULL;
    tg_test_fail_fdopen(1);
    int status = run_cli(dir, argc, argv, &said);
    tg_test_fail_fdopen(0);
    CHECK(status == 1 && said && !strcmp(said, "tunegraph: out of memory\n"), "exit %d, said '%s'", status,
          said ? said : "(nothing)");
    free(said);
    CHECK(access(out, F_OK) != 0 && hidden_entries(dir) == 0, "a logits file or %d temporary files left",
          hidden_entries(dir));
    status = run_cli(dir, argc, argv, &said);
    CHECK(status == 0 && said && strstr(said, "predicted 2 examples on cpu: loss "), "exit %d, said '%s'", status,
          said ? said : "(nothing)");
    free(said);
    char *text = tg_test_read_file(out, NULL);
    CHECK(text && !strncmp(text, "{\"index\": 0, \"input_ids\": [1, 5, 9], \"logits\": [[", 48) &&
              strstr(text, "\n{\"index\": 1, \"input_ids\": [2, 4], \"logits\": [["),
          "logits: %.120s", text ? text : "(none)");
    free(text);
}

/* The files an export reads are checked before anything is loaded: the weights here are
 * not even a safetensors file. The folder is left as it was. */
TG_TEST(test_cli_export_inputs_inside_the_output_folder) {
    const char *dir = tg_test_tmpdir();
    char out[800], inside_weights[900], outside_weights[900], plan[900], want[4096];
    snprintf(out, sizeof out, "%s/out", dir);
    REQUIRE(mkdir(out, 0755) == 0, "%s", out);
    snprintf(inside_weights, sizeof inside_weights, "%s/w.safetensors", out);
    snprintf(outside_weights, sizeof outside_weights, "%s/w.safetensors", dir);
    snprintf(plan, sizeof plan, "%s/p.tgplan", out);
    REQUIRE(tg_test_write_file(inside_weights, "not read\n") == 0 && tg_test_write_file(outside_weights, "not read\n") == 0,
            "weights");
    char *said = NULL;
    char *compile[] = {"tunegraph", "compile", "examples/demo-classify.job", "-o", plan, NULL};
    REQUIRE(run_cli(dir, 5, compile, &said) == 0, "compile: %s", said ? said : "(nothing)");
    free(said);

    char *weights_inside[] = {"tunegraph", "export", "examples/demo-classify.job", "-o", out, "--weights",
                              inside_weights, "--force", NULL};
    int status = run_cli(dir, 8, weights_inside, &said);
    snprintf(want, sizeof want,
             "tunegraph: output folder %s: the weights (--weights) %s is inside it, and the export replaces the folder "
             "whole\n",
             out, inside_weights);
    CHECK(status == 1 && said && !strcmp(said, want), "weights inside: exit %d, said '%s'", status,
          said ? said : "(nothing)");
    free(said);

    char *plan_inside[] = {"tunegraph", "export", plan, "-o", out, "--weights", outside_weights, "--force", NULL};
    status = run_cli(dir, 8, plan_inside, &said);
    snprintf(want, sizeof want,
             "tunegraph: output folder %s: the plan file %s is inside it, and the export replaces the folder whole\n",
             out, plan);
    CHECK(status == 1 && said && !strcmp(said, want), "plan inside: exit %d, said '%s'", status,
          said ? said : "(nothing)");
    free(said);

    char *text = tg_test_read_file(inside_weights, NULL);
    struct stat st;
    CHECK(text && !strcmp(text, "not read\n") && stat(plan, &st) == 0, "the output folder changed");
    free(text);
}
