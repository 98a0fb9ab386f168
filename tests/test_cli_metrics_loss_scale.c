/* The metrics lines of fp16 runs and the lines' last failures (cli/metrics.c): a step line
 * with a loss scale (its last key, added at the first step that has one and updated in place
 * after), the general line of a non-finite step with one; each allocation of the scale's
 * value and key failed in turn; a summary each of whose allocations (values and the keys
 * the object adds) fails in turn; and a stream that takes the line but not its newline. The
 * CLI's functions come from the copy that tests/test_cli_metrics.c compiles in. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "cli/metrics.h"
#include "tests/harness.h"

/* What `call` writes to a memory stream `f` (malloc'd, newlines kept) into text, its rc into rc. */
#define WRITTEN(call, text, rc)                       \
    do {                                              \
        size_t len_ = 0;                              \
        FILE *f = open_memstream(&(text), &len_);     \
        REQUIRE(f, "open_memstream");                 \
        (rc) = (call);                                \
        fclose(f);                                    \
    } while (0)

TG_TEST(test_cli_metrics_loss_scale_step_lines) {
    metrics_step_line *w = metrics_step_line_new();
    REQUIRE(w, "out of memory");
    char *text = NULL;
    int rc = -1;
    tg_step_stats s = {.step = 1, .loss = 0.5f, .lr = 0.25f, .grad_norm = 2.0f, .step_ms = 1.5, .seq = 16};
    /* fp32 first (no scale), then a scale of 65536, then 32768 on the same line object;
     * then a skipped step (norm not finite) with its scale, written as the general line. */
    WRITTEN((metrics_write_step(w, f, &s, 10.0) || (s.step = 2, s.loss_scale = 65536.0f,
                                                    metrics_write_step(w, f, &s, 10.0)) ||
             (s.step = 3, s.loss_scale = 32768.0f, metrics_write_step(w, f, &s, 10.0)) ||
             (s.step = 4, s.grad_norm = INFINITY, s.skipped = 1, s.loss_scale = 16384.0f,
              metrics_write_step(w, f, &s, 10.0))),
            text, rc);
    metrics_step_line_free(w);
    static const char want[] =
        "{\"step\": 1, \"loss\": 0.5, \"lr\": 0.25, \"grad_norm\": 2.0, \"step_ms\": 1.5, \"tokens_per_s\": 10.0, "
        "\"batch_ms\": 0.0, \"forward_ms\": 0.0, \"backward_ms\": 0.0, \"optimizer_ms\": 0.0, \"seq\": 16}\n"
        "{\"step\": 2, \"loss\": 0.5, \"lr\": 0.25, \"grad_norm\": 2.0, \"step_ms\": 1.5, \"tokens_per_s\": 10.0, "
        "\"batch_ms\": 0.0, \"forward_ms\": 0.0, \"backward_ms\": 0.0, \"optimizer_ms\": 0.0, \"seq\": 16, "
        "\"loss_scale\": 65536.0}\n"
        "{\"step\": 3, \"loss\": 0.5, \"lr\": 0.25, \"grad_norm\": 2.0, \"step_ms\": 1.5, \"tokens_per_s\": 10.0, "
        "\"batch_ms\": 0.0, \"forward_ms\": 0.0, \"backward_ms\": 0.0, \"optimizer_ms\": 0.0, \"seq\": 16, "
        "\"loss_scale\": 32768.0}\n"
        "{\"step\": 4, \"loss\": 0.5, \"lr\": 0.25, \"grad_norm\": null, \"grad_norm_error\": \"not finite\", "
        "\"step_ms\": 1.5, \"tokens_per_s\": 10.0, \"batch_ms\": 0.0, \"forward_ms\": 0.0, \"backward_ms\": 0.0, "
        "\"optimizer_ms\": 0.0, \"seq\": 16, \"skipped\": true, \"loss_scale\": 16384.0}\n";
    CHECK(rc == 0 && text && !strcmp(text, want), "step lines (rc %d):\n%s\nwant\n%s", rc, text ? text : "(none)", want);
    free(text);
}

/* The scale's value and its key in the line object, each allocation failed in turn on a
 * line's first scaled step: -1 with nothing written, never a line without its scale. */
TG_TEST(test_cli_metrics_loss_scale_out_of_memory) {
    const tg_step_stats s = {.step = 2, .loss = 1.0f, .step_ms = 1.0, .seq = 8, .loss_scale = 1024.0f};
    int failures = 0, rc = -1;
    char *text = NULL;
    for (long k = 0; k < 100 && rc != 0; k++) {
        metrics_step_line *w = metrics_step_line_new();
        REQUIRE(w, "out of memory");
        text = NULL;
        tg_alloc_fail_only(k);
        WRITTEN(metrics_write_step(w, f, &s, 1.0), text, rc);
        tg_alloc_fail_after(-1);
        metrics_step_line_free(w);
        if (rc != 0) {
            failures++;
            CHECK(rc == -1 && text && !text[0], "allocation %ld failed: rc %d, wrote '%s'", k, rc, text ? text : "");
            free(text);
            text = NULL;
        }
    }
    CHECK(failures >= 2, "%d allocations of a scaled step failed", failures);
    CHECK(rc == 0 && text && strstr(text, ", \"seq\": 8, \"loss_scale\": 1024.0}\n"), "after the faults: '%s'",
          text ? text : "(none)");
    free(text);
}

/* A summary each of whose allocations fails in turn (the object, each value, each key the
 * object adds): -1 with nothing written, then the whole line. */
TG_TEST(test_cli_metrics_loss_scale_summary_out_of_memory) {
    const tg_memory_use mem = {.planned = 10, .estimated = 20, .measured = 30};
    const metrics_summary sum = {.steps = 2, .first_loss = 1, .final_loss = 0.5, .train_s = 1, .tokens = 10,
                                 .device = "cpu", .replicas = 1, .mem = &mem};
    int failures = 0, rc = -1;
    char *text = NULL;
    for (long k = 0; k < 1000 && rc != 0; k++) {
        text = NULL;
        tg_alloc_fail_only(k);
        WRITTEN(metrics_write_summary(f, &sum), text, rc);
        tg_alloc_fail_after(-1);
        if (rc != 0) {
            failures++;
            CHECK(rc == -1 && text && !text[0], "allocation %ld failed: rc %d, wrote '%s'", k, rc, text ? text : "");
            free(text);
            text = NULL;
        }
    }
    /* At least the object, its 21 values and a key of each. */
    CHECK(failures >= 43, "%d allocations of a summary failed", failures);
    CHECK(rc == 0 && text && !strncmp(text, "{\"summary\": true, \"steps\": 2, ", 30) &&
              strstr(text, "\"measured_peak_bytes\": 30}\n"),
          "after the faults: '%s'", text ? text : "(none)");
    free(text);
}

/* A stream that takes `room` bytes, then refuses every write. */
typedef struct {
    size_t room;
} limited;

static ssize_t limited_write(void *cookie, const char *buf, size_t n) {
    limited *l = cookie;
    (void)buf;
    if (n > l->room) return -1;
    l->room -= n;
    return (ssize_t)n;
}

/* A line whose text is taken but whose newline is not: the write fails. */
TG_TEST(test_cli_metrics_loss_scale_newline_refused) {
    const tg_memory_use mem = {.planned = 10, .estimated = 20, .measured = 30};
    const metrics_summary sum = {.steps = 2, .first_loss = 1, .final_loss = 0.5, .train_s = 1, .tokens = 10,
                                 .device = "cpu", .replicas = 1, .mem = &mem};
    char *text = NULL;
    int rc = -1;
    WRITTEN(metrics_write_summary(f, &sum), text, rc);
    REQUIRE(rc == 0 && text && strlen(text) > 1, "summary: %d", rc);
    limited l = {strlen(text) - 1}; /* all but the newline */
    free(text);
    FILE *g = fopencookie(&l, "w", (cookie_io_functions_t){.write = limited_write});
    REQUIRE(g, "fopencookie");
    setvbuf(g, NULL, _IONBF, 0);
    rc = metrics_write_summary(g, &sum);
    CHECK(rc == -1 && l.room == 0, "a summary without its newline: rc %d, %zu bytes of room left", rc, l.room);
    fclose(g);
}
