/* run --profile on a GPU traces the captured steps' kernels (runtime/kernel_trace.h,
 * CUPTI): the profile prints the groups of the captured graph as it ran, and the metrics
 * file's profile_graph lines hold them, with products and attention among them and every
 * kernel named by a group's rule; the slowest kernels are listed by name. Skipped, with the reason, where CUPTI does not load
 * (TUNEGRAPH_CUPTI names the library). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* The ms of the profile_graph line for `what` in metrics text m, or -1. */
static double graph_ms(const char *m, const char *what) {
    char key[96];
    snprintf(key, sizeof key, "{\"profile_graph\": \"%s\", \"ms\": ", what);
    const char *p = strstr(m, key);
    return p ? atof(p + strlen(key)) : -1;
}

TG_TEST(test_gpu_profile_traces_the_captured_graph) {
    const char *dir = tg_test_tmpdir();
    char line[1024], path[600];
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --device cuda --set steps=6 --set batch=8 --set seq=64 --set "
             "precision=bf16 --metrics %s/m.jsonl --profile",
             dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "%s: exit %d: %s", line, r.status, r.err ? r.err : "");
    const char *err = r.err ? r.err : "";
    if (strstr(err, "in the captured graph: not traced (CUPTI")) {
        const char *why = strstr(err, "not traced (");
        printf("    skipped: %.*s\n", (int)strcspn(why, "\n"), why);
        tg_cli_run_free(&r);
        return;
    }
    CHECK(strstr(err, "in the captured graph (5 steps one at a time, "), "no trace in the profile: %s", err);
    /* The kernels taking the most time, by name, largest first (tg_kernel_trace_by_name). */
    const char *slow = strstr(err, "    slowest kernels (ms a step, launches a step):\n      ");
    CHECK(slow && strstr(slow, " ms ") && strstr(slow, " x  "), "no slowest kernels in the profile: %s", err);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *m = tg_test_read_file(path, NULL);
    REQUIRE(m, "no metrics file %s", path);
    const double step = graph_ms(m, "device step"), busy = graph_ms(m, "busy"), mm = graph_ms(m, "matmul"),
                 att = graph_ms(m, "attention"), other = graph_ms(m, "other");
    CHECK(step > 0 && busy > 0 && busy <= step * 1.05, "device step %g ms, busy %g ms", step, busy);
    CHECK(mm > 0 && att > 0, "matmul %g ms, attention %g ms", mm, att);
    /* Every kernel the step launches has a group: no "other" line (or a negligible one). */
    CHECK(other < 0 || other < 0.01 * busy, "other %g ms of %g busy: a kernel without a group", other, busy);
    printf("    device step %.3f ms, busy %.3f, matmul %.3f, attention %.3f, other %.3f\n", step, busy, mm, att, other);
    free(m);
    tg_cli_run_free(&r);
}
