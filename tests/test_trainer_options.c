/* tg_trainer_open's options (runtime/trainer.c): none at all (the defaults), host_trace,
 * eval_only, load_data = 0, a launch gate that stops the run, weights from a saved file;
 * and what the trainer refuses without the data a call needs, or when the sampler cannot
 * make a batch of the training set. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* tiny-bert classifying 5 rows, batch 2 (or 8 where `big`), seq 8, 3 steps, with
 * eval_data (and `extra`). */
static int compile_sized(const char *extra, int big, tg_plan *plan) {
    const char *dir = tg_test_tmpdir();
    char path[800], text[600];
    snprintf(path, sizeof path, "%s/rows.jsonl", dir);
    if (tg_test_write_file(path, "{\"input_ids\": [5, 6, 7], \"label\": 0}\n{\"input_ids\": [8, 9], \"label\": 1}\n"
                                 "{\"input_ids\": [10, 11, 12, 13], \"token_type_ids\": [0, 0, 1, 1], \"label\": 1}\n"
                                 "{\"input_ids\": [14], \"label\": 0}\n"
                                 "{\"input_ids\": [15, 16], \"label\": 1}\n"))
        return 0;
    snprintf(path, sizeof path, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = classify\nbatch = %d\nseq = 8\nsteps = 3\ntrain_data = rows.jsonl\n"
             "eval_data = rows.jsonl\n%s",
             big ? 8 : 2, extra);
    tg_err err;
    return tg_test_write_file(path, text) == 0 &&
           CHECK(tg_front_compile_file(path, NULL, 0, plan, &err) == 0, "%s", err.msg);
}

static int compile_small(const char *extra, tg_plan *plan) { return compile_sized(extra, 0, plan); }

TG_TEST(test_trainer_open_without_options) {
    tg_plan plan;
    if (!compile_small("", &plan)) return;
    tg_trainer t;
    tg_err err = {{0}};
    REQUIRE(tg_trainer_open(&t, &plan, NULL, &err) == 0, "%s", err.msg);
    /* The defaults: the CPU, data loaded, the loader thread, one step at a time. */
    CHECK(t.ex.device == TG_DEVICE_CPU && t.has_train && t.has_eval && t.loader != NULL && t.max_in_flight == 1 &&
              t.step_group == 1 && t.host_trace == 0 && t.rank == 0 && t.total_steps == 3 && t.gate == NULL,
          "device %d, train %d, eval %d, loader %p, depth %d, group %d", t.ex.device, t.has_train, t.has_eval,
          (void *)t.loader, t.max_in_flight, t.step_group);
    tg_step_stats s;
    CHECK(tg_trainer_step(&t, &s, &err) == 0 && s.step == 1 && isfinite(s.loss) && s.tokens > 0 && s.tokens <= s.slots && s.slots == 16,
          "step: %s (tokens %lld)", err.msg, (long long)s.tokens);
    CHECK(t.fill_cpu_s == 0, "no host trace, yet %g s of fills counted", t.fill_cpu_s);
    /* Inputs only: no tensor, or one outside the inputs pool, has none. */
    CHECK(tg_trainer_input(&t, -1) == NULL && tg_trainer_input(&t, plan.io.loss) == NULL &&
              tg_trainer_input(&t, plan.io.input_ids) != NULL,
          "inputs");
    /* Every tensor: those of the inputs pool at their offset in the batch being filled,
     * those of every other pool (before it in the list or after it) none. */
    const uint8_t *base = tg_trainer_input(&t, plan.io.input_ids);
    base = base ? base - plan.tensors[plan.io.input_ids].offset : NULL;
    int pools_after = 0;
    for (int i = 0; i < plan.n_tensors; i++) {
        const tg_tensor *x = &plan.tensors[i];
        const uint8_t *got = tg_trainer_input(&t, i);
        pools_after += x->pool > TG_POOL_INPUTS;
        CHECK(x->pool == TG_POOL_INPUTS ? got == base + x->offset : got == NULL, "tensor %s of pool %d: %p", x->name,
              x->pool, (const void *)got);
    }
    CHECK(pools_after > 0, "no tensor in a pool after the inputs'");
    tg_trainer_close(&t);
    CHECK(t.plan == NULL && t.ex.vt == NULL, "closed");
    tg_trainer_close(&t); /* a closed trainer closes again harmlessly */
    tg_plan_free(&plan);
}

/* No options with length buckets: the defaults again, one step at a time (a bucketed run
 * groups no steps unless step_group asks), each step in its bucket. */
TG_TEST(test_trainer_open_without_options_buckets) {
    tg_plan plan;
    if (!compile_small("seq_buckets = 4, 8\n", &plan)) return;
    REQUIRE(plan.train.n_buckets == 2, "%d buckets", plan.train.n_buckets);
    tg_trainer t;
    tg_err err = {{0}};
    REQUIRE(tg_trainer_open(&t, &plan, NULL, &err) == 0, "%s", err.msg);
    CHECK(t.has_train && t.has_eval && t.loader != NULL && t.max_in_flight == 1 && t.step_group == 1 && t.bucket == 1 &&
              t.total_steps == 3,
          "train %d, eval %d, loader %p, depth %d, group %d, bucket %d", t.has_train, t.has_eval, (void *)t.loader,
          t.max_in_flight, t.step_group, t.bucket);
    for (int k = 0; k < 3; k++) {
        tg_step_stats s;
        CHECK(tg_trainer_step(&t, &s, &err) == 0 && s.step == k + 1 && isfinite(s.loss) && s.tokens > 0 &&
                  s.tokens <= s.slots && (s.slots == 8 || s.slots == 16),
              "step %d: %s (tokens %lld of %lld)", k + 1, err.msg, (long long)s.tokens, (long long)s.slots);
    }
    tg_trainer_close(&t);
    tg_plan_free(&plan);
}

TG_TEST(test_trainer_host_trace_counts_fills) {
    tg_plan plan;
    if (!compile_small("", &plan)) return;
    tg_trainer t;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1,
                            .host_trace = 1, .no_graphs = 1};
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    tg_step_stats s;
    for (int i = 0; i < 3; i++) CHECK(tg_trainer_step(&t, &s, &err) == 0, "step %d: %s", i + 1, err.msg);
    CHECK(t.host_trace == 1 && t.fill_cpu_s > 0 && t.fill_cpu_s < 10, "fills took %g s of CPU", t.fill_cpu_s);
    tg_trainer_close(&t);
    tg_plan_free(&plan);
}

TG_TEST(test_trainer_data_refusals) {
    tg_plan plan;
    if (!compile_small("", &plan)) return;
    tg_trainer t;
    tg_err err = {{0}};
    /* The eval set alone: no steps. */
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .eval_only = 1};
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    CHECK(!t.has_train && t.has_eval && t.loader == NULL, "eval_only: train %d, eval %d", t.has_train, t.has_eval);
    tg_step_stats s;
    CHECK(tg_trainer_step(&t, &s, &err) == -1 && strstr(err.msg, "no training data is bound"), "step: %s", err.msg);
    tg_eval_stats e;
    /* A checkpoint without training data: no examples, no sampler position; it resumes in
     * another eval-only trainer. */
    tg_checkpoint ck;
    CHECK(tg_trainer_checkpoint(&t, &ck, 1, &err) == 0 && ck.state.sampler_examples == 0 && ck.state.step == 0,
          "eval-only checkpoint: %s", err.msg);
    tg_trainer t2;
    if (CHECK(tg_trainer_open(&t2, &plan, &o, &err) == 0, "%s", err.msg)) {
        CHECK(tg_trainer_restore(&t2, &ck, "ck", &err) == 0 && t2.steps_done == 0, "eval-only restore: %s", err.msg);
        tg_trainer_close(&t2);
    }
    tg_checkpoint_free(&ck);
    CHECK(tg_trainer_eval(&t, &e, &err) == 0 && e.examples == 5 && e.counted == 5 && e.accuracy >= 0 &&
              e.accuracy <= 1 && e.perplexity == -1.0,
          "eval: %s (%d examples)", err.msg, e.examples);
    /* No datasets: nothing to evaluate either (the steps count 3, from the job). */
    tg_trainer_close(&t);
    o.load_data = 0, o.eval_only = 0;
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    CHECK(!t.has_train && !t.has_eval && t.total_steps == 3, "no data: train %d, eval %d, %d steps", t.has_train,
          t.has_eval, t.total_steps);
    e.examples = 99;
    CHECK(tg_trainer_eval(&t, &e, &err) == -1 && strstr(err.msg, "no eval_data in the run settings") && e.examples == 0,
          "eval: %s", err.msg);
    tg_trainer_close(&t);
    tg_plan_free(&plan);
    /* A sampler that can make no batch: 5 rows, batches of 8, the short one dropped. */
    if (!compile_sized("last_batch = drop\n", 1, &plan)) return;
    o.load_data = 1;
    memset(&err, 0, sizeof err);
    CHECK(tg_trainer_open(&t, &plan, &o, &err) == -1 &&
              strstr(err.msg, "rows.jsonl: batch sampler: last_batch = drop leaves no batch: 5 examples, global batch 8"),
          "sampler: %s", err.msg);
    CHECK(t.plan == NULL, "the failed open kept its trainer");
    tg_plan_free(&plan);
}

typedef struct gate {
    int64_t stop;    /* steps allowed in all */
    int calls;
} gate;

static int64_t gate_fn(void *ctx, int64_t launched, int64_t steps) {
    gate *g = ctx;
    g->calls++;
    const int64_t left = g->stop - launched;
    return left < steps ? left : steps;
}

TG_TEST(test_trainer_launch_gate_stops_the_run) {
    tg_plan plan;
    if (!compile_small("", &plan)) return;
    tg_trainer t;
    tg_err err = {{0}};
    gate g = {.stop = 2};
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .launch_gate = gate_fn,
                            .gate_ctx = &g};
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    tg_step_stats s;
    CHECK(tg_trainer_step(&t, &s, &err) == 0 && s.step == 1, "step 1: %s", err.msg);
    CHECK(tg_trainer_step(&t, &s, &err) == 0 && s.step == 2, "step 2: %s", err.msg);
    CHECK(tg_trainer_step(&t, &s, &err) == -1 && strstr(err.msg, "no step to take: the run stops at step 2"),
          "step 3 past the gate: %s", err.msg);
    CHECK(t.stop_at == 2 && t.launched == 2 && g.calls == 3, "stop at %lld, launched %lld, %d gate calls",
          (long long)t.stop_at, (long long)t.launched, g.calls);
    tg_trainer_close(&t);
    tg_plan_free(&plan);
}

TG_TEST(test_trainer_weights_option_loads_a_save) {
    tg_plan plan;
    if (!compile_small("", &plan)) return;
    tg_trainer a, b;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    REQUIRE(tg_trainer_open(&a, &plan, &o, &err) == 0, "%s", err.msg);
    CHECK(!a.weights_loaded && a.weights_path[0] == 0, "weights loaded from '%s'", a.weights_path);
    tg_step_stats s;
    REQUIRE(tg_trainer_step(&a, &s, &err) == 0, "%s", err.msg);
    char path[800];
    /* A '%' in the name is a plain character of the path the trainer keeps. */
    snprintf(path, sizeof path, "%s/trained-100%%%%-%%s.safetensors", tg_test_tmpdir());
    REQUIRE(tg_trainer_save(&a, path, &err) == 0, "%s", err.msg);
    const size_t bytes = plan.pool_bytes[TG_POOL_PARAMS];
    float *pa = malloc(bytes), *pb = malloc(bytes);
    REQUIRE(pa && pb, "alloc");
    CHECK(tg_trainer_read(&a, plan.io.params_all, pa, &err) == 0, "%s", err.msg);
    tg_trainer_close(&a);
    o.weights = path;
    REQUIRE(tg_trainer_open(&b, &plan, &o, &err) == 0, "%s", err.msg);
    CHECK(b.weights_loaded && strcmp(b.weights_path, path) == 0, "weights from '%s'", b.weights_path);
    CHECK(tg_trainer_read(&b, plan.io.params_all, pb, &err) == 0 && memcmp(pa, pb, bytes) == 0,
          "the parameters opened from the save differ from the trained ones");
    tg_trainer_close(&b);
    free(pa), free(pb);
    tg_plan_free(&plan);
}

typedef struct logits_seen {
    int calls, rows;
    int stop_at;   /* the call that fails (1-based), 0: none */
    int hits, predicted_one; /* rows whose largest logit is their label's; rows predicted 1 */
} logits_seen;

/* The labels of compile_sized's 5 rows, in order. */
static const int32_t row_labels[5] = {0, 1, 1, 0, 1};

static int on_logits(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    logits_seen *l = ctx;
    l->calls++;
    if (first != l->rows) return tg_fail(err, "batch at row %d, want %d", first, l->rows);
    /* Rows of 2 logits each: those whose larger logit is their label's. */
    for (int32_t r = 0; r < rows && first + r < 5; r++) {
        const int best = logits[2 * r + 1] > logits[2 * r] ? 1 : 0;
        l->hits += best == row_labels[first + r];
        l->predicted_one += best;
    }
    l->rows += rows;
    if (l->calls == l->stop_at) return tg_fail(err, "callback stops at call %d", l->calls);
    return isfinite(logits[0]) ? 0 : tg_fail(err, "logits not finite");
}

TG_TEST(test_trainer_eval_logits_callback) {
    tg_plan plan;
    if (!compile_small("", &plan)) return;
    tg_trainer t;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "%s", err.msg);
    tg_eval_stats e;
    logits_seen l = {0};
    CHECK(tg_trainer_eval_logits(&t, &e, on_logits, &l, &err) == 0 && l.calls == 3 && l.rows == 5 && e.examples == 5,
          "every batch: %s (%d calls, %d rows)", err.msg, l.calls, l.rows);
    /* The accuracy: the rows whose largest logit (of both classes) is their label's. */
    CHECK(e.counted == 5 && e.accuracy == l.hits / 5.0 && e.perplexity == -1.0,
          "accuracy %g of %lld, the logits' %d of 5 (%d predicted 1)", e.accuracy, (long long)e.counted, l.hits,
          l.predicted_one);
    l = (logits_seen){.stop_at = 2};
    CHECK(tg_trainer_eval_logits(&t, &e, on_logits, &l, &err) == -1 && strstr(err.msg, "callback stops at call 2") &&
              l.calls == 2,
          "stopped: %s (%d calls)", err.msg, l.calls);
    /* The trainer goes on as before: a step, then the whole eval again. */
    tg_step_stats s;
    CHECK(tg_trainer_step(&t, &s, &err) == 0 && s.step == 1, "step: %s", err.msg);
    l = (logits_seen){0};
    CHECK(tg_trainer_eval_logits(&t, &e, on_logits, &l, &err) == 0 && l.rows == 5, "again: %s", err.msg);
    tg_trainer_close(&t);
    tg_plan_free(&plan);
}

/* A plan of one replica trains as rank 0 whatever rank the options give: the same rank,
 * dropout masks and so losses as a trainer given rank 0. The open reports the time of each
 * of its parts. */
TG_TEST(test_trainer_rank_of_one_replica_is_zero) {
    tg_plan plan;
    if (!compile_small("", &plan)) return;
    REQUIRE(plan.train.replicas == 1, "%d replicas", plan.train.replicas);
    float loss[2][2];
    for (int k = 0; k < 2; k++) {
        tg_trainer t;
        tg_err err = {{0}};
        const tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1,
                                      .rank = k ? 3 : 0};
        REQUIRE(tg_trainer_open(&t, &plan, &o, &err) == 0, "rank %d: %s", o.rank, err.msg);
        CHECK(t.rank == 0, "option rank %d: the trainer's rank is %d", o.rank, t.rank);
        /* The open's three parts each took some time: executor and pools, weights, datasets. */
        CHECK(t.open_ms[0] > 0 && t.open_ms[1] > 0 && t.open_ms[2] > 0, "open times %g %g %g ms", t.open_ms[0],
              t.open_ms[1], t.open_ms[2]);
        for (int s = 0; s < 2; s++) {
            tg_step_stats st;
            CHECK(tg_trainer_step(&t, &st, &err) == 0, "rank %d, step %d: %s", o.rank, s + 1, err.msg);
            loss[k][s] = st.loss;
        }
        tg_trainer_close(&t);
    }
    CHECK(loss[0][0] == loss[1][0] && loss[0][1] == loss[1][1], "losses %.9g %.9g as rank 0, %.9g %.9g given rank 3",
          loss[0][0], loss[0][1], loss[1][0], loss[1][1]);
    tg_plan_free(&plan);
}
