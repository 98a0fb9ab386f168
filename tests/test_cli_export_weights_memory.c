/* tunegraph export when the weights image cannot be allocated (cli/export.c), in this
 * process (tests/cli_in_process.h): each allocation up to the image's fails in turn, each
 * one that is not survived a one-line refusal that leaves no folder; the image's says "out
 * of memory for the weights". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

TG_TEST(test_cli_export_weights_image_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    char line[2048], out[800], weights[800];
    REQUIRE(tg_test_cli_demo_weights(dir, "", weights, sizeof weights), "the demo's weights");
    tg_cli_run r = {0};
    long image = -1;
    for (long k = 0; k < 2000 && image < 0; k++) {
        snprintf(out, sizeof out, "%s/hf%ld", dir, k); /* a folder of its own: some failures are survived */
        snprintf(line, sizeof line, "export %s/p.tgp --weights %s -o %s", dir, weights, out);
        tg_alloc_fail_only(k);
        r = tg_test_cli_line(dir, line, NULL);
        tg_alloc_fail_after(-1);
        struct stat st;
        if (r.status != 0)
            CHECK(r.status == 1 && r.err && !strncmp(r.err, "tunegraph: ", 11) &&
                      (strstr(r.err, "out of memory") || strstr(r.err, ": Cannot allocate memory")) &&
                      strchr(r.err, '\n') == r.err + strlen(r.err) - 1 && stat(out, &st) != 0,
                  "allocation %ld: exit %d, said '%s'", k, r.status, r.err ? r.err : "(nothing)");
        if (r.err && !strcmp(r.err, "tunegraph: out of memory for the weights\n")) image = k;
        tg_cli_run_free(&r);
    }
    CHECK(image > 0, "no allocation failed as the weights image");
    snprintf(out, sizeof out, "%s/hf", dir);
    snprintf(line, sizeof line, "export %s/p.tgp --weights %s -o %s", dir, weights, out);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, "/hf: BertForSequenceClassification, 41 tensors (fp32)\n"),
          "export: exit %d, said '%s'", r.status, r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
}
