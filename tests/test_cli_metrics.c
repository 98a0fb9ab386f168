/* The CLI's metrics lines: jansson objects written one per line, each real with its
 * field's digits, a non-finite value as null with "<key>_error" beside it; and its whole-number
 * parser. The CLI's sources are compiled in here (its main renamed) to reach their static
 * helpers. */
#include "cli/export.c"
#include "cli/checkpoints.c"
#include "cli/cost.c"
#include "cli/metrics.c"
#include "cli/profile.c"
#include "cli/data_convert.c"
#include "cli/data_dump.c"
#include "cli/tokenize.c"
#include "cli/metrics_read.c"
#include "cli/svg_chart.c"
#include "cli/plot.c"
#include "cli/progress.c"
#include "cli/sweep_spec.c"
#include "cli/artifact_manifest.c"
#include "cli/environment.c"
#include "cli/artifact.c"
#include "cli/sweep.c"
#include "cli/compare.c"
#include "cli/launch.c"
#define main tunegraph_cli_main
#include "cli/main.c"
#undef main

#include <fcntl.h>
#include <sys/wait.h>
#include <sys/stat.h>

#include "tests/harness.h"

/* The line the object gives, without its newline (malloc'd). */
static char *written(metrics_line *l, int *rc) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    *rc = line_write(l, f);
    fclose(f);
    if (buf && len && buf[len - 1] == '\n') buf[len - 1] = 0;
    return buf;
}

TG_TEST(test_cli_metrics_line_json) {
    metrics_line l = line_begin();
    put_int(&l, "step", 3);
    put_real(&l, "loss", 0.69555401802062988, "%.6g");
    put_real(&l, "lr", 0.0, "%.6g");
    put_real(&l, "step_ms", 18.956000123, "%.3f");
    put_real(&l, "tokens_per_s", 1234567.891, "%.1f");
    put_str(&l, "tensor", "a \"quoted\" name");
    put_true(&l, "summary");
    int rc = -1;
    char *text = written(&l, &rc);
    REQUIRE(text && rc == 0, "not written");
    const char *want = "{\"step\": 3, \"loss\": 0.695554, \"lr\": 0.0, \"step_ms\": 18.956, \"tokens_per_s\": "
                       "1234567.9, \"tensor\": \"a \\\"quoted\\\" name\", \"summary\": true}";
    CHECK(!strcmp(text, want), "line %s\n      want %s", text, want);
    json_error_t e;
    json_t *o = json_loads(text, 0, &e);
    CHECK(o && json_real_value(json_object_get(o, "step_ms")) == 18.956, "does not parse back: %s", e.text);
    json_decref(o);
    free(text);
}

TG_TEST(test_cli_metrics_non_finite) {
    metrics_line l = line_begin();
    put_real(&l, "loss", NAN, "%.6g");
    put_real(&l, "grad_norm", INFINITY, "%.6g");
    put_real(&l, "lr", -INFINITY, "%.6g");
    put_real(&l, "step_ms", 1.5, "%.3f");
    int rc = -1;
    char *text = written(&l, &rc);
    REQUIRE(text && rc == 0, "not written");
    const char *want = "{\"loss\": null, \"loss_error\": \"not finite\", \"grad_norm\": null, \"grad_norm_error\": "
                       "\"not finite\", \"lr\": null, \"lr_error\": \"not finite\", \"step_ms\": 1.5}";
    CHECK(!strcmp(text, want), "line %s\n      want %s", text, want);
    json_error_t e;
    json_t *o = json_loads(text, 0, &e);
    CHECK(o && json_is_null(json_object_get(o, "loss")), "not JSON: %s", e.text);
    json_decref(o);
    free(text);
}

/* The summary's eval fields: null with the reason when the eval counted nothing (never
 * loss 0 and perplexity 1), null with "not finite" for an overflowing perplexity; qa's
 * SQuAD scores. */
TG_TEST(test_cli_metrics_summary_eval) {
    const tg_memory_use mem = {.planned = 1, .estimated = 2, .measured = 3};
    const tg_eval_stats lm_none = {.examples = 3, .counted = 0, .loss = NAN, .accuracy = -1, .perplexity = NAN};
    const tg_eval_stats cls_none = {.examples = 0, .counted = 0, .loss = NAN, .accuracy = NAN, .perplexity = -1,
                                    .macro_f1 = NAN};
    const tg_eval_stats lm_inf = {.examples = 2, .counted = 9, .loss = 800.0, .accuracy = -1, .perplexity = INFINITY};
    const tg_eval_stats cls = {.examples = 4, .counted = 4, .loss = 0.5, .accuracy = 0.75, .perplexity = -1,
                               .macro_f1 = 0.7333333333};
    const tg_eval_stats qa = {.examples = 5, .counted = 5, .loss = 2.25, .accuracy = -1, .perplexity = -1,
                              .macro_f1 = -1, .questions = 3, .exact = 200.0 / 3, .f1 = 75.0, .has_ans_total = 2,
                              .has_ans_exact = 50.0, .has_ans_f1 = 62.5, .no_ans_total = 1, .no_ans_exact = 100.0,
                              .no_ans_f1 = 100.0};
    const struct {
        const tg_eval_stats *ev;
        const char *want;
    } cases[] = {
        {&lm_none, "\"eval_examples\": 3, \"eval_loss\": null, \"eval_loss_error\": \"no tokens to count in eval_data\", "
                   "\"eval_perplexity\": null, \"eval_perplexity_error\": \"no tokens to count in eval_data\"}"},
        {&cls_none, "\"eval_examples\": 0, \"eval_loss\": null, \"eval_loss_error\": \"no rows to count in eval_data\", "
                    "\"eval_accuracy\": null, \"eval_accuracy_error\": \"no rows to count in eval_data\", "
                    "\"eval_macro_f1\": null, \"eval_macro_f1_error\": \"no rows to count in eval_data\"}"},
        {&lm_inf, "\"eval_examples\": 2, \"eval_loss\": 800.0, \"eval_perplexity\": null, "
                  "\"eval_perplexity_error\": \"not finite\"}"},
        {&cls, "\"eval_examples\": 4, \"eval_loss\": 0.5, \"eval_accuracy\": 0.75, \"eval_macro_f1\": 0.733333}"},
        {&qa, "\"eval_examples\": 5, \"eval_loss\": 2.25, \"eval_questions\": 3, \"eval_exact\": 66.6667, "
              "\"eval_f1\": 75.0, \"eval_HasAns_total\": 2, \"eval_HasAns_exact\": 50.0, \"eval_HasAns_f1\": 62.5, "
              "\"eval_NoAns_total\": 1, \"eval_NoAns_exact\": 100.0, \"eval_NoAns_f1\": 100.0}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        metrics_summary s = {.steps = 1, .train_s = 1, .device = "cpu", .replicas = 1, .mem = &mem, .eval = cases[i].ev};
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        REQUIRE(f, "open_memstream");
        int rc = metrics_write_summary(f, &s);
        fclose(f);
        REQUIRE(rc == 0 && buf, "case %zu not written", i);
        const char *eval = strstr(buf, "\"eval_examples\"");
        CHECK(eval && !strncmp(eval, cases[i].want, strlen(cases[i].want)), "case %zu: %s\n      want ...%s", i, buf,
              cases[i].want);
        json_error_t e;
        json_t *o = json_loads(buf, 0, &e);
        CHECK(o, "case %zu: not JSON: %s", i, e.text);
        json_decref(o);
        free(buf);
    }
    CHECK(metrics_eval_nothing_counted(&cls) == NULL, "a counted eval has a reason");
}

/* The step line, updated in place from step to step: each line is the step's own values,
 * with enough digits to read the float statistics back exactly; a non-finite value takes
 * the general line (null and "<key>_error"). */
TG_TEST(test_cli_metrics_step_line) {
    metrics_step_line *w = metrics_step_line_new();
    REQUIRE(w, "out of memory");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f, "open_memstream");
    tg_step_stats s = {.step = 1, .loss = 0.695554018f, .lr = 5e-5f, .grad_norm = 2.5f, .step_ms = 7.8521,
                       .phase_ms = {0.01f, 2.25f, 4.5f, 1.0f}, .seq = 128};
    int rc = metrics_write_step(w, f, &s, 521000.25);
    s.step = 2, s.loss = 0.5f, s.grad_norm = NAN;
    rc |= metrics_write_step(w, f, &s, 600000.0);
    s.step = 3, s.grad_norm = 1.0f;
    rc |= metrics_write_step(w, f, &s, 610000.0);
    fclose(f);
    metrics_step_line_free(w);
    REQUIRE(rc == 0 && buf, "not written");
    const char *want1 = "{\"step\": 1, \"loss\": 0.695554018, \"lr\": 4.99999987e-5, \"grad_norm\": 2.5, "
                        "\"step_ms\": 7.8521, \"tokens_per_s\": 521000.25, \"batch_ms\": 0.00999999978, "
                        "\"forward_ms\": 2.25, \"backward_ms\": 4.5, \"optimizer_ms\": 1.0, \"seq\": 128}\n";
    CHECK(!strncmp(buf, want1, strlen(want1)), "first line %s\n      want %s", buf, want1);
    const char *line2 = strchr(buf, '\n') ? strchr(buf, '\n') + 1 : "";
    const char *line3 = strchr(line2, '\n') ? strchr(line2, '\n') + 1 : "";
    const char *want2 = "{\"step\": 2, \"loss\": 0.5, ", *want3 = "{\"step\": 3, \"loss\": 0.5, \"lr\": 4.99999987e-5, \"grad_norm\": 1.0, ";
    CHECK(!strncmp(line2, want2, strlen(want2)) && strstr(line2, "\"grad_norm\": null, \"grad_norm_error\": \"not finite\"") &&
              strstr(line2, "\"seq\": 128}"),
          "second line %s", line2);
    CHECK(!strncmp(line3, want3, strlen(want3)),
          "third line %s", line3);
    json_error_t e;
    json_t *o = json_loadb(buf, strlen(want1), 0, &e);
    CHECK(o && (float)json_real_value(json_object_get(o, "loss")) == 0.695554018f, "loss does not read back: %s",
          e.text);
    json_decref(o);
    free(buf);
}

TG_TEST(test_cli_parse_whole) {
    int v = -7;
    CHECK(parse_whole("0", 0, 1024, &v) == 0 && v == 0, "0");
    CHECK(parse_whole("1024", 0, 1024, &v) == 0 && v == 1024, "1024");
    static const char *const bad[] = {"", "abc", "4x", "1025", "-1", " 4", "4 ", "+", "0x10", "99999999999999999999"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        CHECK(parse_whole(bad[k], 0, 1024, &v) == -1, "'%s' accepted as %d", bad[k], v);
}

/* The ending signals' handler of cli/main.c (reachable here only, where main.c is compiled
 * in), in a child process: with a checkpointing run under way, the first SIGTERM asks for
 * the stop and re-arms the handler, once (SA_RESETHAND), so that a second one ends the
 * process at once, by the signal. */
TG_TEST(test_cli_main_first_signal_rearms_the_handler) {
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    REQUIRE(pid >= 0, "fork");
    if (pid == 0) {
        const int quiet = open("/dev/null", O_WRONLY); /* the handler's note */
        if (quiet >= 0) dup2(quiet, STDERR_FILENO);
        sigset_t term;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        sigprocmask(SIG_UNBLOCK, &term, NULL);
        signal(SIGTERM, SIG_DFL);
        install_signal_handlers();
        g_defer_stop = 1;
        raise(SIGTERM);
        struct sigaction sa;
        if (g_stop_signal != SIGTERM || sigaction(SIGTERM, NULL, &sa) != 0 || sa.sa_handler != on_ending_signal ||
            !(sa.sa_flags & SA_RESETHAND))
            _exit(3); /* the first signal ended nothing, but left no handler for the second */
        raise(SIGTERM);
        _exit(4); /* the second signal did not end the process */
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM, "status %#x (exit 3: not re-armed, 4: not ended)", status);
}

/* The CPU communicator of a data-parallel run cannot be made: refused with the
 * communicator's message; then made, one group shared by every replica. */
TG_TEST(test_cli_main_open_comms_out_of_memory) {
    void *comms[2] = {NULL, NULL};
    tg_cpu_comm_group *group = NULL;
    tg_err err = {{0}};
    tg_alloc_fail_after(0);
    int rc = open_comms(TG_DEVICE_CPU, 2, comms, &group, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !group && !strcmp(err.msg, "out of memory for a communicator of 2 ranks"), "rc %d: '%s'", rc,
          err.msg);
    rc = open_comms(TG_DEVICE_CPU, 2, comms, &group, &err);
    CHECK(rc == 0 && group && comms[0] == group && comms[1] == group, "rc %d: %s", rc, err.msg);
    tg_cpu_comm_group_destroy(group);
}

/* The checkpoint folder's name (from --checkpoint-dir, from the job) cannot be copied:
 * "out of memory", no folder made; then the folder is made. */
TG_TEST(test_cli_main_checkpoint_folder_out_of_memory) {
    static tg_plan plan; /* large: kept off the stack */
    memset(&plan, 0, sizeof plan);
    char dir[800];
    for (int from_job = 0; from_job < 2; from_job++) {
        snprintf(dir, sizeof dir, "%s/ck%d", tg_test_tmpdir(), from_job);
        cli_args a;
        memset(&a, 0, sizeof a);
        a.input = "job";
        if (from_job) snprintf(plan.run.checkpoint_dir, sizeof plan.run.checkpoint_dir, "%s", dir);
        else a.checkpoint_dir = dir;
        run_resume r;
        tg_err err = {{0}};
        tg_alloc_fail_after(0);
        int rc = setup_checkpoints(&a, &plan, &r, &err);
        tg_alloc_fail_after(-1);
        struct stat st;
        CHECK(rc == -1 && !r.dir && !strcmp(err.msg, "out of memory") && stat(dir, &st) != 0, "%s: rc %d, '%s'", dir,
              rc, err.msg);
        run_resume_free(&r);
        rc = setup_checkpoints(&a, &plan, &r, &err);
        CHECK(rc == 0 && r.dir && !strcmp(r.dir, dir) && stat(dir, &st) == 0 && S_ISDIR(st.st_mode), "%s: rc %d, %s",
              dir, rc, err.msg);
        run_resume_free(&r);
    }
}

/* The weights report's text cannot be made: nothing is printed; then the report. */
TG_TEST(test_cli_export_print_report_out_of_memory) {
    static tg_plan plan;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan), "compile");
    char *names[] = {"extra.weight"};
    tg_weights_report report;
    memset(&report, 0, sizeof report);
    report.unexpected = 1;
    report.unexpected_names = names;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    REQUIRE(f, "open_memstream");
    tg_alloc_fail_after(0);
    print_report(f, &plan, &report, "w.safetensors");
    tg_alloc_fail_after(-1);
    fflush(f);
    CHECK(len == 0, "printed without memory: '%s'", text);
    print_report(f, &plan, &report, "w.safetensors");
    fclose(f);
    CHECK(text && !strncmp(text, "Some weights of the model checkpoint at w.safetensors were not used when initializing ",
                           86) && strstr(text, "extra.weight"),
          "report: '%s'", text ? text : "(none)");
    free(text);
    tg_plan_free(&plan);
}

/* A checkpoint folder that holds a step file, each allocation failed in turn: refused as
 * out of memory (the folder's name, its preparation, the list of its step files); then
 * refused for the checkpoint it holds. */
TG_TEST(test_cli_main_checkpoint_folder_list_out_of_memory) {
    static tg_plan plan;
    memset(&plan, 0, sizeof plan);
    char dir[800], step[900];
    snprintf(dir, sizeof dir, "%s/ck", tg_test_tmpdir());
    REQUIRE(mkdir(dir, 0755) == 0, "%s", dir);
    snprintf(step, sizeof step, "%s/step-000003.tgckpt", dir);
    REQUIRE(tg_test_write_file(step, "x") == 0, "%s", step);
    cli_args a;
    memset(&a, 0, sizeof a);
    a.input = "job";
    a.checkpoint_dir = dir;
    int listing = 0, rc = -1;
    tg_err err = {{0}};
    char want[1200];
    snprintf(want, sizeof want, "%s: cannot list the checkpoint folder: Cannot allocate memory", dir);
    for (long k = 0; k < 100; k++) {
        run_resume r;
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        rc = setup_checkpoints(&a, &plan, &r, &err);
        tg_alloc_fail_after(-1);
        run_resume_free(&r);
        if (!strstr(err.msg, "memory")) break;
        listing += !strcmp(err.msg, want);
        CHECK(rc == -1 && (strstr(err.msg, "out of memory") || !strcmp(err.msg, want)), "allocation %ld: rc %d, '%s'", k,
              rc, err.msg);
    }
    CHECK(listing == 1, "%d failures listing the folder", listing);
    CHECK(rc == -1 && strstr(err.msg, ": the checkpoint folder already holds checkpoints (the newest step-000003.tgckpt)"),
          "after the faults: rc %d, '%s'", rc, err.msg);
}

/* The folder of the checkpoint resumed from, where later checkpoints go: the root for a
 * file in it, "." for a bare name, else the path up to its last slash; out of memory:
 * NULL. */
TG_TEST(test_cli_main_folder_of_a_checkpoint) {
    static const char *const cases[][2] = {{"/step-000001.tgckpt", "/"}, {"step-000001.tgckpt", "."},
                                           {"runs/a/step-000002.tgckpt", "runs/a"}, {"/ck/x", "/ck"},
                                           {"a//b", "a/"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = folder_of(cases[i][0]);
        CHECK(got && !strcmp(got, cases[i][1]), "%s: '%s', want '%s'", cases[i][0], got ? got : "(null)", cases[i][1]);
        free(got);
    }
    for (int bare = 0; bare < 2; bare++) {
        tg_alloc_fail_after(0);
        char *got = folder_of(bare ? "x" : "/x");
        tg_alloc_fail_after(-1);
        CHECK(!got, "out of memory: '%s'", got);
        free(got);
    }
}
