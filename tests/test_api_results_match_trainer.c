/* api/tunegraph.c hands out what the layers below compute, field by field: a plan's summary
 * is its plan's numbers, a step's metrics the trainer's statistics of that step, an eval's
 * metrics the trainer's eval (accuracy, macro F1 and perplexity only where the task has
 * them, 0 otherwise). Each is compared with the same call made on the internal trainer
 * (runtime/trainer.h) over the same plan. Also: struct_size at its smallest, the exact
 * message for a newer header's byte, and the trainer's copy of the plan running out of
 * memory. */
#include "include/tunegraph.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "base/alloc.h"
#include "base/version.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

#define DEMO_CLASSIFY "examples/demo-classify.job"
#define DEMO_LM "examples/demo-lm.job"

static const char *const k_small[] = {"steps=3", "batch=4", "seq=16"};

/* The same job compiled through the library and through the front door. */
static int compile_both(const char *job, tunegraph_plan **api, tg_plan *plan) {
    tg_err err = {{0}};
    if (tunegraph_compile_file(job, k_small, 3, api)) return CHECK(0, "%s: %s", job, tunegraph_last_error()), 0;
    memset(plan, 0, sizeof *plan);
    if (tg_front_compile_file(job, k_small, 3, plan, &err)) {
        tunegraph_plan_free(*api);
        return CHECK(0, "%s: %s", job, err.msg), 0;
    }
    return 1;
}

static tunegraph_trainer *open_api(const tunegraph_plan *plan) {
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    if (tunegraph_trainer_open(plan, &o, &tr)) CHECK(0, "open: %s", tunegraph_last_error());
    return tr;
}

/* The internal trainer with the options tunegraph_trainer_open gives it. */
static int open_internal(tg_trainer *t, const tg_plan *plan) {
    tg_err err = {{0}};
    tg_trainer_options to = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .max_in_flight = 1};
    if (tg_trainer_open(t, plan, &to, &err)) return CHECK(0, "tg_trainer_open: %s", err.msg), 0;
    return 1;
}

TG_TEST(test_api_summary_is_the_plans) {
    tunegraph_plan *api = NULL;
    tg_plan plan;
    REQUIRE(compile_both(DEMO_CLASSIFY, &api, &plan), "compile");
    tunegraph_plan_summary s;
    memset(&s, 0x5a, sizeof s);
    s.struct_size = sizeof s;
    REQUIRE(tunegraph_plan_summarize(api, &s) == 0, "%s", tunegraph_last_error());
    CHECK(s.struct_size == sizeof s && s.ops == plan.n_ops && s.tensors == plan.n_tensors &&
              s.planned_peak_bytes == plan.peak_bytes && s.flops_per_step == plan.flops_per_step && s.batch == 4 &&
              s.seq == 16 && s.replicas == 1 && s.total_steps == 3,
          "summary: %lld ops (%d), %lld tensors (%d), peak %llu (%llu), flops %g (%g), %lld x %lld, %lld replicas, "
          "%lld steps",
          (long long)s.ops, plan.n_ops, (long long)s.tensors, plan.n_tensors, (unsigned long long)s.planned_peak_bytes,
          (unsigned long long)plan.peak_bytes, s.flops_per_step, plan.flops_per_step, (long long)s.batch,
          (long long)s.seq, (long long)s.replicas, (long long)s.total_steps);
    /* steps = 0 with epochs: -1. */
    REQUIRE(tunegraph_plan_set(api, "epochs=2") == 0, "%s", tunegraph_last_error());
    REQUIRE(tunegraph_plan_summarize(api, &s) == 0, "%s", tunegraph_last_error());
    CHECK(s.total_steps == -1, "total_steps %lld with epochs", (long long)s.total_steps);
    /* A struct_size of just the size field is taken: that field alone is written. */
    size_t only_size = sizeof(size_t);
    CHECK(tunegraph_plan_summarize(api, (tunegraph_plan_summary *)&only_size) == 0 && only_size == sizeof(size_t),
          "struct_size %zu: %s", only_size, tunegraph_last_error());
    /* One byte less is no struct. */
    struct {
        tunegraph_plan_summary s;
    } tiny = {{.struct_size = sizeof(size_t) - 1}};
    CHECK(tunegraph_plan_summarize(api, &tiny.s) == -1 &&
              !strcmp(tunegraph_last_error(),
                      "tunegraph_plan_summary.struct_size is 7: set it to sizeof(tunegraph_plan_summary)"),
          "struct_size 7: '%s'", tunegraph_last_error());
    /* A newer header's struct: the bytes past this library's are zeroed, struct_size kept. */
    union {
        tunegraph_plan_summary s;
        unsigned char bytes[sizeof(tunegraph_plan_summary) + 16];
    } newer;
    memset(&newer, 0x5a, sizeof newer);
    newer.s.struct_size = sizeof newer;
    REQUIRE(tunegraph_plan_summarize(api, &newer.s) == 0, "%s", tunegraph_last_error());
    int zeros = 1;
    for (size_t i = sizeof(tunegraph_plan_summary); i < sizeof newer; i++) zeros &= newer.bytes[i] == 0;
    CHECK(zeros && newer.s.struct_size == sizeof newer && newer.s.ops == plan.n_ops,
          "newer struct: tail zeroed %d, struct_size %zu", zeros, newer.s.struct_size);
    tg_plan_free(&plan);
    tunegraph_plan_free(api);
}

TG_TEST(test_api_options_newer_byte_message) {
    tunegraph_plan *api = NULL;
    REQUIRE(tunegraph_compile_file(DEMO_CLASSIFY, k_small, 3, &api) == 0, "%s", tunegraph_last_error());
    const size_t ours = sizeof(tunegraph_trainer_options);
    union {
        tunegraph_trainer_options o;
        unsigned char bytes[sizeof(tunegraph_trainer_options) + 16];
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.o = (tunegraph_trainer_options){sizeof newer, TUNEGRAPH_DEVICE_CPU, 1, 1};
    newer.o.struct_size = sizeof newer;
    newer.bytes[ours + 5] = 1;
    newer.bytes[ours + 9] = 1;
    tunegraph_trainer *tr = NULL;
    char want[200];
    snprintf(want, sizeof want, "tunegraph_trainer_options: byte %zu is set, but this library (%d.%d.%d) knows %zu "
                                "bytes of the struct",
             ours + 5, TUNEGRAPH_VERSION_MAJOR, TUNEGRAPH_VERSION_MINOR, TUNEGRAPH_VERSION_PATCH, ours);
    CHECK(tunegraph_trainer_open(api, &newer.o, &tr) == -1 && tr == NULL && !strcmp(tunegraph_last_error(), want),
          "'%s'\n    want '%s'", tunegraph_last_error(), want);
    /* Options of just the size field: the defaults. */
    size_t only_size = sizeof(size_t);
    CHECK(tunegraph_trainer_open(api, (const tunegraph_trainer_options *)&only_size, &tr) == 0 && tr,
          "options of 8 bytes: %s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(api);
}

/* The trainer copies the plan through its file encoding: that allocation failing (the
 * first after the trainer's own) is the encoder's message, and no trainer comes back. */
TG_TEST(test_api_trainer_open_plan_copy_out_of_memory) {
    tunegraph_plan *api = NULL;
    REQUIRE(tunegraph_compile_file(DEMO_CLASSIFY, k_small, 3, &api) == 0, "%s", tunegraph_last_error());
    tunegraph_trainer_options o = {sizeof o, TUNEGRAPH_DEVICE_CPU, 1, 1};
    tunegraph_trainer *tr = NULL;
    tg_alloc_fail_only(0);
    int rc = tunegraph_trainer_open(api, &o, &tr);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && tr == NULL && !strcmp(tunegraph_last_error(), "out of memory for the trainer"),
          "the trainer's allocation: %d '%s'", rc, tunegraph_last_error());
    tg_alloc_fail_only(1);
    rc = tunegraph_trainer_open(api, &o, &tr);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && tr == NULL && !strcmp(tunegraph_last_error(), "plan encode: out of memory"),
          "the plan copy's first allocation: %d '%s'", rc, tunegraph_last_error());
    tunegraph_plan_free(api);
}

TG_TEST(test_api_step_metrics_are_the_trainers) {
    tunegraph_plan *api = NULL;
    tg_plan plan;
    REQUIRE(compile_both(DEMO_CLASSIFY, &api, &plan), "compile");
    tunegraph_trainer *tr = open_api(api);
    tg_trainer t;
    const int internal = open_internal(&t, &plan);
    if (tr && internal) {
        CHECK(!strcmp(tunegraph_trainer_weights_report(tr), ""), "a preset's weights report: '%s'",
              tunegraph_trainer_weights_report(tr));
        int64_t total = 0;
        CHECK(tunegraph_trainer_total_steps(tr, &total) == 0 && total == t.total_steps && total == 3,
              "total steps %lld, the trainer's %d", (long long)total, t.total_steps);
        for (int k = 1; k <= 3; k++) {
            tunegraph_step_metrics m;
            memset(&m, 0x5a, sizeof m);
            m.struct_size = sizeof m;
            tg_step_stats s;
            tg_err err = {{0}};
            REQUIRE(tunegraph_trainer_step(tr, &m) == 0, "step %d: %s", k, tunegraph_last_error());
            REQUIRE(tg_trainer_step(&t, &s, &err) == 0, "internal step %d: %s", k, err.msg);
            CHECK(m.struct_size == sizeof m && m.step == k && m.step == s.step && m.loss == s.loss && m.lr == s.lr &&
                      m.grad_norm == s.grad_norm && m.tokens == s.tokens && m.skipped == s.skipped &&
                      m.skipped == 0 && m.step_ms > 0,
                  "step %d: step %lld (%d) loss %.9g (%.9g) lr %.9g (%.9g) norm %.9g (%.9g) tokens %lld (%lld) "
                  "skipped %lld (%d) %g ms",
                  k, (long long)m.step, s.step, m.loss, s.loss, m.lr, s.lr, m.grad_norm, s.grad_norm,
                  (long long)m.tokens, (long long)s.tokens, (long long)m.skipped, s.skipped, m.step_ms);
            int64_t done = -1;
            CHECK(tunegraph_trainer_steps_done(tr, &done) == 0 && done == k, "steps done %lld after step %d",
                  (long long)done, k);
        }
        tunegraph_step_metrics m = {.struct_size = sizeof m};
        CHECK(tunegraph_trainer_step(tr, &m) == -1 &&
                  !strcmp(tunegraph_last_error(), "examples/demo-classify.job: all 3 steps of the schedule are taken"),
              "a fourth step: '%s'", tunegraph_last_error());
    }
    if (internal) tg_trainer_close(&t);
    tunegraph_trainer_close(tr);
    tg_plan_free(&plan);
    tunegraph_plan_free(api);
}

/* Evaluates both trainers (no step taken) and compares; *e gets the library's metrics. */
static void eval_both(const char *job, tunegraph_eval_metrics *e, tg_eval_stats *s) {
    tunegraph_plan *api = NULL;
    tg_plan plan;
    memset(e, 0x5a, sizeof *e);
    e->struct_size = sizeof *e;
    memset(s, 0, sizeof *s);
    if (!compile_both(job, &api, &plan)) return;
    tunegraph_trainer *tr = open_api(api);
    tg_trainer t;
    const int internal = open_internal(&t, &plan);
    tg_err err = {{0}};
    if (tr && internal) {
        CHECK(tunegraph_trainer_evaluate(tr, e) == 0, "%s: %s", job, tunegraph_last_error());
        CHECK(tg_trainer_eval(&t, s, &err) == 0, "%s: %s", job, err.msg);
        CHECK(e->struct_size == sizeof *e && e->examples == s->examples && e->counted == s->counted &&
                  e->loss == s->loss && e->examples > 0 && e->counted > 0 && isfinite(e->loss),
              "%s: %lld examples (%d), %lld counted (%lld), loss %.9g (%.9g)", job, (long long)e->examples,
              s->examples, (long long)e->counted, (long long)s->counted, e->loss, s->loss);
        /* No SQuAD scores outside qa: all zero. */
        CHECK(!e->has_squad && !e->questions && !e->exact && !e->f1 && !e->has_ans_total && !e->has_ans_exact &&
                  !e->has_ans_f1 && !e->no_ans_total && !e->no_ans_exact && !e->no_ans_f1,
              "%s: SQuAD fields set: %d %lld %g %g", job, e->has_squad, (long long)e->questions, e->exact, e->f1);
    }
    if (internal) tg_trainer_close(&t);
    tunegraph_trainer_close(tr);
    tg_plan_free(&plan);
    tunegraph_plan_free(api);
}

TG_TEST(test_api_eval_metrics_are_the_trainers) {
    tunegraph_eval_metrics e;
    tg_eval_stats s;
    eval_both(DEMO_CLASSIFY, &e, &s);
    CHECK(e.has_accuracy == 1 && e.accuracy == s.accuracy && e.macro_f1 == s.macro_f1 && e.has_perplexity == 0 &&
              e.perplexity == 0 && s.perplexity == -1 && e.accuracy > 0 && e.accuracy < 1 && e.macro_f1 > 0,
          "classify: accuracy %d %.9g (%.9g), macro F1 %.9g (%.9g), perplexity %d %g", e.has_accuracy, e.accuracy,
          s.accuracy, e.macro_f1, s.macro_f1, e.has_perplexity, e.perplexity);
    eval_both(DEMO_LM, &e, &s);
    CHECK(e.has_perplexity == 1 && e.perplexity == s.perplexity && e.perplexity == exp(s.loss) && e.has_accuracy == 0 &&
              e.accuracy == 0 && e.macro_f1 == 0 && s.accuracy == -1 && s.macro_f1 == -1,
          "lm: perplexity %d %.9g (%.9g), accuracy %d %g, macro F1 %g", e.has_perplexity, e.perplexity, s.perplexity,
          e.has_accuracy, e.accuracy, e.macro_f1);
}
