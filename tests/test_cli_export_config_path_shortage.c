/* The model config's path, which export, predict and run --save-dir name among the files
 * their outputs may not replace (cli/export.c command_inputs and run_export_check), could
 * not be had: each allocation failed alone in turn up to the last such path, the command
 * ends with exit 1 and only its one line on stderr, never going on to write anything; run
 * --save-dir asks for the path twice (its own outputs, then the export's), each refusal
 * saying so exactly. In this process (tests/cli_in_process.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

static const char k_shortage[] = "tunegraph: out of memory for the model config path\n";

/* How many single allocation failures of `line` end with k_shortage, counting up to
 * `want` of them among its first 300 allocations. A failure that ends the command must end
 * it with exit 1, one line, nothing on stdout and `output` absent; some are passed over
 * (an output's resolved name, which its device and inode stand in for). */
static int shortages(const char *dir, const char *line, int want, const char *output) {
    int seen = 0;
    for (long k = 0; k < 300 && seen < want; k++) {
        tg_alloc_fail_only(k);
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        tg_alloc_fail_after(-1);
        struct stat st;
        const int one_line = r.err && !strncmp(r.err, "tunegraph: ", 11) && strchr(r.err, '\n') == r.err + strlen(r.err) - 1;
        if (r.status != 0) {
            CHECK(r.status == 1 && one_line && r.out && !r.out[0] && stat(output, &st) != 0,
                  "%s: allocation %ld failed: exit %d, stdout '%s', stderr '%s'", line, k, r.status, r.out ? r.out : "(none)",
                  r.err ? r.err : "(none)");
        } else if (stat(output, &st) == 0) { /* passed over: the output is written; the next run writes it again */
            char cmd[1000];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", output);
            CHECK(system(cmd) == 0, "%s", cmd);
        }
        seen += r.err && !strcmp(r.err, k_shortage);
        tg_cli_run_free(&r);
    }
    return seen;
}

TG_TEST(test_cli_export_config_path_shortage) {
    const char *dir = tg_test_tmpdir();
    char line[2048], out[800], weights[800];
    REQUIRE(tg_test_cli_demo_weights(dir, "--device cpu", weights, sizeof weights), "the demo's weights");
    tg_cli_run r = {0};

    snprintf(out, sizeof out, "%s/hf", dir);
    snprintf(line, sizeof line, "export %s/p.tgp --weights %s -o %s", dir, weights, out);
    CHECK(shortages(dir, line, 1, out) == 1, "%s: the config path's shortage", line);

    snprintf(out, sizeof out, "%s/logits.jsonl", dir);
    snprintf(line, sizeof line, "predict %s/p.tgp --device cpu --weights %s -o %s --data examples/data/sentiment-eval.jsonl",
             dir, weights, out);
    CHECK(shortages(dir, line, 1, out) == 1, "%s: the config path's shortage", line);

    /* run --save-dir: the run's outputs checked, then the export's */
    snprintf(out, sizeof out, "%s/saved", dir);
    snprintf(line, sizeof line, "run %s/p.tgp --device cpu --save-dir %s", dir, out);
    CHECK(shortages(dir, line, 2, out) == 2, "%s: the config path's two shortages", line);
    /* and without a failure, each command does its work */
    char want[900];
    snprintf(want, sizeof want, "\nexported %s\n", out);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, want), "run --save-dir: exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}
