/* The metrics file's summary and profile lines (cli/metrics.c) character for character:
 * each field under its own key, rounded to its own digits, the ones computed from others
 * (tokens per second, the batch wait's share, the host's own CPU time, a matmul's TFLOPS)
 * with their values; an LM's eval with its perplexity; a matmul's flags each under its key.
 * The CLI's functions come from the copy that tests/test_cli_metrics.c compiles in. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/metrics.h"
#include "tests/harness.h"

/* What `call` writes into a memory stream f (malloc'd); its rc in *rc. */
#define WRITTEN(call, text, rc)                   \
    do {                                          \
        size_t len_ = 0;                          \
        FILE *f = open_memstream(&(text), &len_); \
        REQUIRE(f, "open_memstream");             \
        (rc) = (call);                            \
        fclose(f);                                \
    } while (0)

TG_TEST(test_cli_metrics_summary_exact) {
    const tg_memory_use mem = {.planned = 123, .estimated = 456, .measured = 789};
    const tg_eval_stats cls = {.examples = 10, .counted = 10, .loss = 0.6931471805, .accuracy = 0.6, .perplexity = -1,
                               .macro_f1 = 0.5833333333};
    const tg_eval_stats lm = {.examples = 5, .counted = 40, .loss = 2.5134, .accuracy = -1, .perplexity = 12.3456789};
    metrics_summary s = {.steps = 7,
                         .first_loss = 2.718281828,
                         .final_loss = 0.123456789,
                         .train_s = 10.0,
                         .warmup_s = 1.23456,
                         .tokens = 123457,
                         .padding_fraction = 0.256789,
                         .batch_wait_s = 0.98767,
                         .median_step_ms = 3.14159265,
                         .host_cpu_us = 1500.26,
                         .loop_cpu_us = 900.56,
                         .driver_cpu_us = 200.04,
                         .device = "cuda",
                         .replicas = 2,
                         .mem = &mem,
                         .eval = &cls};
    static const char head[] =
        "{\"summary\": true, \"steps\": 7, \"skipped_steps\": 0, \"first_loss\": 2.71828, \"final_loss\": 0.123457, \"train_s\": 10.0, "
        "\"warmup_s\": 1.235, \"tokens_per_s\": 12345.7, \"median_step_ms\": 3.1416, \"padding_fraction\": 0.2568, "
        "\"batch_wait_s\": 0.9877, \"batch_wait_share\": 0.09877, \"host_cpu_us_per_step\": 1500.3, "
        "\"host_cpu_own_us_per_step\": 1300.2, \"loop_cpu_us_per_step\": 900.6, \"driver_thread_cpu_us_per_step\": 200.0, "
        "\"device\": \"cuda\", \"replicas\": 2, \"planned_peak_bytes\": 123, \"memory_estimate_bytes\": 456, "
        "\"measured_peak_bytes\": 789";
    char want[2048];
    char *text = NULL;
    int rc = -1;
    WRITTEN(metrics_write_summary(f, &s), text, rc);
    snprintf(want, sizeof want, "%s, \"eval_examples\": 10, \"eval_loss\": 0.693147, \"eval_accuracy\": 0.6, \"eval_macro_f1\": 0.583333}\n", head);
    CHECK(rc == 0 && text && !strcmp(text, want), "classify summary:\n%s\nwant\n%s", text ? text : "(none)", want);
    free(text);
    text = NULL;
    s.eval = &lm;
    WRITTEN(metrics_write_summary(f, &s), text, rc);
    snprintf(want, sizeof want, "%s, \"eval_examples\": 5, \"eval_loss\": 2.5134, \"eval_perplexity\": 12.3457}\n", head);
    CHECK(rc == 0 && text && !strcmp(text, want), "lm summary:\n%s\nwant\n%s", text ? text : "(none)", want);
    free(text);
    text = NULL;
    s.eval = NULL;
    WRITTEN(metrics_write_summary(f, &s), text, rc);
    snprintf(want, sizeof want, "%s}\n", head);
    CHECK(rc == 0 && text && !strcmp(text, want), "summary without eval:\n%s\nwant\n%s", text ? text : "(none)", want);
    free(text);
}

TG_TEST(test_cli_metrics_profile_lines_exact) {
    tg_tensor tensors[2];
    memset(tensors, 0, sizeof tensors);
    snprintf(tensors[0].name, sizeof tensors[0].name, "x.in");
    snprintf(tensors[1].name, sizeof tensors[1].name, "y.out");
    tg_op ops[2] = {tg_test_op(TG_OP_GELU), tg_test_op(TG_OP_MATMUL)};
    ops[0].in[0] = 0; /* no output: named by its first input */
    tg_matmul_params *mm = &ops[1].p.matmul;
    mm->m = 1000, mm->n = 2000, mm->k = 3000, mm->batch = 4;
    mm->trans_a = 1, mm->trans_b = 0, mm->accumulate = 1, mm->bias_grad = 1, mm->activation = 2;
    ops[1].out[0] = 1, ops[1].in[0] = 0;
    tg_plan p;
    memset(&p, 0, sizeof p);
    p.ops = ops;
    p.n_ops = 2;
    p.tensors = tensors;
    p.n_tensors = 2;
    char *text = NULL;
    int rc = -1;
    WRITTEN(metrics_write_profile_op(f, &p, 0, 0.123456), text, rc);
    CHECK(rc == 0 && text && !strcmp(text, "{\"profile_op_index\": 0, \"op\": \"gelu\", \"tensor\": \"x.in\", \"ms\": 0.1235}\n"),
          "gelu line: '%s'", text ? text : "(none)");
    free(text);
    text = NULL;
    /* 2 * 1000 * 2000 * 3000 * 4 flop in 8 ms: 6 TFLOPS */
    WRITTEN(metrics_write_profile_op(f, &p, 1, 8.0), text, rc);
    CHECK(rc == 0 && text &&
              !strcmp(text, "{\"profile_op_index\": 1, \"op\": \"matmul\", \"tensor\": \"y.out\", \"ms\": 8.0, \"M\": 1000, "
                            "\"N\": 2000, \"K\": 3000, \"batch\": 4, \"trans_a\": 1, \"trans_b\": 0, \"accumulate\": 1, "
                            "\"bias_grad\": 1, \"act\": 2, \"tflops\": 6.0}\n"),
          "matmul line: '%s'", text ? text : "(none)");
    free(text);
    text = NULL;
    WRITTEN(metrics_write_profile_kind(f, "matmul", 30, 0.57526), text, rc);
    CHECK(rc == 0 && text && !strcmp(text, "{\"profile_op\": \"matmul\", \"count\": 30, \"ms\": 0.5753}\n") ,
          "kind line: '%s'", text ? text : "(none)");
    free(text);
    text = NULL;
    WRITTEN(metrics_write_profile_group(f, "norm and elementwise", 1.23456), text, rc);
    CHECK(rc == 0 && text && !strcmp(text, "{\"profile_group\": \"norm and elementwise\", \"ms\": 1.2346}\n"),
          "group line: '%s'", text ? text : "(none)");
    free(text);
    text = NULL;
    WRITTEN(metrics_write_profile_graph(f, "communication hidden", 0.98765), text, rc);
    CHECK(rc == 0 && text && !strcmp(text, "{\"profile_graph\": \"communication hidden\", \"ms\": 0.9877}\n"),
          "graph line: '%s'", text ? text : "(none)");
    free(text);
}

/* Data parallelism's lines: the gradient sums' medians in the summary (after the replica
 * count), their busy and exposed ms on each step line (after the step's own keys, in the
 * general line too), and a bucket's profile line with its exposed part. */
TG_TEST(test_cli_metrics_comm_lines_exact) {
    const tg_memory_use mem = {.planned = 1, .estimated = 2, .measured = 3};
    metrics_summary s = {.steps = 3, .train_s = 1.0, .tokens = 10, .median_step_ms = 8.8, .device = "cuda",
                         .replicas = 2, .comm_ms = 2.45891, .comm_exposed_ms = 0.34487, .mem = &mem};
    char *text = NULL;
    int rc = -1;
    WRITTEN(metrics_write_summary(f, &s), text, rc);
    CHECK(rc == 0 && text && strstr(text, "\"replicas\": 2, \"median_comm_ms\": 2.4589, \"median_exposed_comm_ms\": 0.3449, "
                                          "\"planned_peak_bytes\": 1"),
          "summary: %s", text ? text : "(none)");
    free(text);
    text = NULL;
    s.gpu = "NVIDIA H100 80GB \"HBM3\"", s.model_tflops = 412.345, s.mfu = 0.416759;
    WRITTEN(metrics_write_summary(f, &s), text, rc);
    CHECK(rc == 0 && text && strstr(text, "\"replicas\": 2, \"gpu\": \"NVIDIA H100 80GB \\\"HBM3\\\"\", \"model_tflops\": 412.35, "
                                          "\"mfu\": 0.4168, \"median_comm_ms\""),
          "summary with MFU: %s", text ? text : "(none)");
    free(text);
    text = NULL;
    metrics_step_line *w = metrics_step_line_new();
    REQUIRE(w, "out of memory");
    tg_step_stats st = {.step = 1, .loss = 0.5f, .lr = 1.0f, .grad_norm = 2.0f, .step_ms = 8.5, .seq = 128,
                        .comm_ms = -1.0f, .comm_exposed_ms = -1.0f};
    WRITTEN(metrics_write_step(w, f, &st, 100), text, rc);
    CHECK(rc == 0 && text && !strstr(text, "comm"), "a step without sums: %s", text ? text : "(none)");
    free(text);
    text = NULL;
    st.step = 2, st.comm_ms = 2.5f, st.comm_exposed_ms = 0.25f;
    WRITTEN(metrics_write_step(w, f, &st, 100), text, rc);
    CHECK(rc == 0 && text && strstr(text, "\"seq\": 128, \"comm_ms\": 2.5, \"exposed_comm_ms\": 0.25}\n"),
          "a step with sums: %s", text ? text : "(none)");
    free(text);
    text = NULL;
    st.step = 3, st.loss = NAN, st.comm_ms = 3.0f, st.comm_exposed_ms = 0.5f;
    WRITTEN(metrics_write_step(w, f, &st, 100), text, rc);
    CHECK(rc == 0 && text && strstr(text, "\"loss\": null") && strstr(text, "\"comm_ms\": 3.0, \"exposed_comm_ms\": 0.5}\n"),
          "a non-finite step with sums: %s", text ? text : "(none)");
    free(text);
    text = NULL;
    metrics_step_line_free(w);
    WRITTEN(metrics_write_profile_comm(f, 3, 28350000, -0.5, 0.25), text, rc);
    CHECK(rc == 0 && text && !strcmp(text, "{\"profile_comm_bucket\": 3, \"bytes\": 28350000, \"begin_ms\": -0.5, "
                                           "\"end_ms\": 0.25, \"exposed_ms\": 0.25}\n"),
          "bucket line: %s", text ? text : "(none)");
    free(text);
    text = NULL;
    WRITTEN(metrics_write_profile_comm(f, 0, 100, 0.125, 0.375), text, rc);
    CHECK(rc == 0 && text && strstr(text, "\"exposed_ms\": 0.25}"), "a bucket begun after the backward: %s",
          text ? text : "(none)");
    free(text);
}

/* The error line: the replica named when there is one, replica 0 included. */
TG_TEST(test_cli_metrics_error_line_exact) {
    static const struct {
        int replica;
        const char *want;
    } cases[] = {
        {-1, "{\"event\": \"error\", \"message\": \"step 3: \\\"x\\\" failed\"}\n"},
        {0, "{\"event\": \"error\", \"message\": \"step 3: \\\"x\\\" failed\", \"replica\": 0}\n"},
        {1, "{\"event\": \"error\", \"message\": \"step 3: \\\"x\\\" failed\", \"replica\": 1}\n"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *text = NULL;
        int rc = -1;
        WRITTEN(metrics_write_error(f, "step 3: \"x\" failed", cases[k].replica), text, rc);
        CHECK(rc == 0 && text && !strcmp(text, cases[k].want), "replica %d: '%s', want '%s'", cases[k].replica,
              text ? text : "(none)", cases[k].want);
        free(text);
    }
}
