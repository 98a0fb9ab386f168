/* The metrics lines in their rarer shapes, character for character (cli/metrics.c): a
 * summary whose memory could not be measured, whose training took no measurable time
 * (tokens per second not finite, the batch wait's share 0) and skipped steps; a step line
 * with non-finite values and "skipped", then the same line object's next finite step, and
 * a step line's whole numbers. The CLI's functions come from the copy that
 * tests/test_cli_metrics.c compiles in. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/metrics.h"
#include "tests/harness.h"

TG_TEST(test_cli_metrics_rarer_summary) {
    const tg_memory_use mem = {.planned = 10, .estimated = 20, .measured = -1};
    const metrics_summary s = {.steps = 4,
                               .skipped_steps = 2,
                               .first_loss = 1.5,
                               .final_loss = NAN,
                               .train_s = 0,
                               .warmup_s = 0.5,
                               .tokens = 100,
                               .padding_fraction = 0,
                               .batch_wait_s = 0.25,
                               .median_step_ms = 2,
                               .host_cpu_us = 10,
                               .loop_cpu_us = 5,
                               .driver_cpu_us = 0,
                               .device = "cpu",
                               .replicas = 1,
                               .mem = &mem,
                               .eval = NULL};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    const int rc = metrics_write_summary(f, &s);
    fclose(f);
    static const char want[] =
        "{\"summary\": true, \"steps\": 4, \"skipped_steps\": 2, \"first_loss\": 1.5, \"final_loss\": null, "
        "\"final_loss_error\": \"not finite\", \"train_s\": 0.0, \"warmup_s\": 0.5, \"tokens_per_s\": null, "
        "\"tokens_per_s_error\": \"not finite\", \"median_step_ms\": 2.0, \"padding_fraction\": 0.0, "
        "\"batch_wait_s\": 0.25, \"batch_wait_share\": 0.0, \"host_cpu_us_per_step\": 10.0, "
        "\"host_cpu_own_us_per_step\": 10.0, \"loop_cpu_us_per_step\": 5.0, \"driver_thread_cpu_us_per_step\": 0.0, "
        "\"device\": \"cpu\", \"replicas\": 1, \"planned_peak_bytes\": 10, \"memory_estimate_bytes\": 20, "
        "\"measured_peak_bytes\": null, \"measured_peak_bytes_error\": \"not measurable here\"}\n";
    CHECK(rc == 0 && text && !strcmp(text, want), "summary:\n%s\nwant\n%s", text ? text : "(none)", want);
    free(text);
}

TG_TEST(test_cli_metrics_rarer_step_lines) {
    metrics_step_line *w = metrics_step_line_new();
    REQUIRE(w, "out of memory");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    /* a step skipped for its gradient norm, its loss not finite either */
    tg_step_stats s = {.step = 5, .loss = NAN, .lr = 0.25f, .grad_norm = INFINITY, .step_ms = 2.5,
                       .phase_ms = {0.5f, 1.0f, 0.75f, 0.125f}, .tokens = 7, .seq = 64, .slots = 8, .skipped = 1};
    int rc = metrics_write_step(w, f, &s, 1000.0);
    /* the next, finite: the reused line has every value of its own step */
    s.step = 6, s.loss = 0.375f, s.lr = 0.125f, s.grad_norm = 3.0f, s.step_ms = 1.25, s.skipped = 0, s.seq = 32;
    s.phase_ms[0] = 0.0625f, s.phase_ms[1] = 0.5f, s.phase_ms[2] = 0.25f, s.phase_ms[3] = 2.0f;
    rc |= metrics_write_step(w, f, &s, 2048.5);
    /* a finite step whose tokens per second are not: the general line, without "skipped" */
    s.step = 7;
    rc |= metrics_write_step(w, f, &s, -INFINITY);
    fclose(f);
    metrics_step_line_free(w);
    static const char want[] =
        "{\"step\": 5, \"loss\": null, \"loss_error\": \"not finite\", \"lr\": 0.25, \"grad_norm\": null, "
        "\"grad_norm_error\": \"not finite\", \"step_ms\": 2.5, \"tokens_per_s\": 1000.0, \"batch_ms\": 0.5, "
        "\"forward_ms\": 1.0, \"backward_ms\": 0.75, \"optimizer_ms\": 0.125, \"seq\": 64, \"skipped\": true}\n"
        "{\"step\": 6, \"loss\": 0.375, \"lr\": 0.125, \"grad_norm\": 3.0, \"step_ms\": 1.25, \"tokens_per_s\": 2048.5, "
        "\"batch_ms\": 0.0625, \"forward_ms\": 0.5, \"backward_ms\": 0.25, \"optimizer_ms\": 2.0, \"seq\": 32}\n"
        "{\"step\": 7, \"loss\": 0.375, \"lr\": 0.125, \"grad_norm\": 3.0, \"step_ms\": 1.25, \"tokens_per_s\": null, "
        "\"tokens_per_s_error\": \"not finite\", \"batch_ms\": 0.0625, \"forward_ms\": 0.5, \"backward_ms\": 0.25, "
        "\"optimizer_ms\": 2.0, \"seq\": 32}\n";
    CHECK(rc == 0 && text && !strcmp(text, want), "step lines:\n%s\nwant\n%s", text ? text : "(none)", want);
    free(text);
}

/* A line object's first step: every field its own, none left at the object's start. */
TG_TEST(test_cli_metrics_rarer_first_step_line) {
    metrics_step_line *w = metrics_step_line_new();
    REQUIRE(w, "out of memory");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    const tg_step_stats s = {.step = 0, .seq = 0};
    const int rc = metrics_write_step(w, f, &s, 0.0);
    fclose(f);
    metrics_step_line_free(w);
    static const char want[] =
        "{\"step\": 0, \"loss\": 0.0, \"lr\": 0.0, \"grad_norm\": 0.0, \"step_ms\": 0.0, \"tokens_per_s\": 0.0, "
        "\"batch_ms\": 0.0, \"forward_ms\": 0.0, \"backward_ms\": 0.0, \"optimizer_ms\": 0.0, \"seq\": 0}\n";
    CHECK(rc == 0 && text && !strcmp(text, want), "first step line:\n%s\nwant\n%s", text ? text : "(none)", want);
    free(text);
}
