/* End to end on the CPU: the shipped demo jobs train, the CLI writes its metrics, and
 * a run is bitwise reproducible from its seed. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "runtime/trainer.h"
#include "runtime/executor.h"
#include "tests/harness.h"

typedef struct run_result {
    int steps;
    float losses[400];
    tg_eval_stats eval;
} run_result;

static int train(const char *job_path, const char *const *sets, int n_sets, run_result *r) {
    tg_err err;
    tg_job job;
    tg_plan plan;
    tg_trainer tr;
    memset(r, 0, sizeof *r);
    if (!CHECK(tg_job_load(job_path, sets, n_sets, &job, &err) == 0, "%s", err.msg)) return 0;
    if (!CHECK(tg_compile(&job, &plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 0, .load_data = 1};
    if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return 0;
    }
    int ok = CHECK(tr.total_steps <= 400, "too many steps");
    for (int s = 0; ok && s < tr.total_steps; s++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
        r->losses[r->steps++] = st.loss;
    }
    if (ok && tr.has_eval) ok = CHECK(tg_trainer_eval(&tr, &r->eval, &err) == 0, "%s", err.msg);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
    return ok;
}

static double mean(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s / n;
}

TG_TEST(test_e2e_demo_classify_learns) {
    run_result r;
    if (!train("examples/demo-classify.job", NULL, 0, &r)) return;
    double first = mean(r.losses, 10), last = mean(r.losses + r.steps - 20, 20);
    printf("    demo-classify: %d steps, loss %.4f -> %.4f, eval loss %.4f accuracy %.3f\n", r.steps, first, last,
           r.eval.loss, r.eval.accuracy);
    CHECK(first > 0.6 && first < 0.8, "initial loss %.4f should be near ln 2", first);
    CHECK(last < 0.5 * first, "loss did not fall: %.4f -> %.4f", first, last);
    CHECK(r.eval.examples == 400 && r.eval.counted == 400, "eval covered %d examples", r.eval.examples);
    CHECK(r.eval.accuracy > 0.85, "eval accuracy %.3f", r.eval.accuracy);
}

TG_TEST(test_e2e_demo_lm_learns) {
    run_result r;
    const char *sets[] = {"steps=150"};
    if (!train("examples/demo-lm.job", sets, 1, &r)) return;
    double first = mean(r.losses, 5), last = mean(r.losses + r.steps - 20, 20);
    printf("    demo-lm: %d steps, loss %.4f -> %.4f, eval perplexity %.2f\n", r.steps, first, last, r.eval.perplexity);
    CHECK(fabs(first - log(128.0)) < 0.3, "initial loss %.4f should be near ln 128", first);
    CHECK(last < first - 0.8, "loss did not fall: %.4f -> %.4f", first, last);
    CHECK(r.eval.perplexity > 1 && r.eval.perplexity < 128, "perplexity %.2f", r.eval.perplexity);
}

TG_TEST(test_e2e_reproducible) {
    /* Dropout, shuffling and init all come from the seed: two runs agree bit for bit,
     * and another seed gives another run. */
    const char *sets[] = {"steps=15"};
    const char *other[] = {"steps=15", "seed=43"};
    run_result a, b, c;
    if (!train("examples/demo-classify.job", sets, 1, &a) || !train("examples/demo-classify.job", sets, 1, &b) ||
        !train("examples/demo-classify.job", other, 2, &c))
        return;
    CHECK(memcmp(a.losses, b.losses, sizeof a.losses) == 0, "same seed, different losses");
    CHECK(memcmp(a.losses, c.losses, sizeof a.losses) != 0, "different seeds, same losses");
}

TG_TEST(test_e2e_bf16_tracks_fp32) {
    /* Same seed, same batches and dropout masks: the bf16 curve stays within 2% of the
     * fp32 one over 150 steps of the demo, through the part where the loss falls. */
    const char *f32[] = {"steps=150"}, *b16[] = {"steps=150", "precision=bf16"};
    run_result a, b;
    if (!train("examples/demo-classify.job", f32, 1, &a) || !train("examples/demo-classify.job", b16, 2, &b)) return;
    double worst = 0;
    for (int w = 0; w < 150; w += 10) {
        double fa = mean(a.losses + w, 10), fb = mean(b.losses + w, 10), rel = fabs(fb - fa) / fa;
        if (rel > worst) worst = rel;
    }
    printf("    bf16 vs fp32 over 150 steps: worst 10-step window %.3f%%, final %.4f vs %.4f\n", 100 * worst,
           mean(b.losses + 140, 10), mean(a.losses + 140, 10));
    CHECK(worst <= 0.02, "bf16 loss curve departs from fp32 by %.2f%%", 100 * worst);
    CHECK(mean(a.losses + 140, 10) < 0.6 * mean(a.losses, 10), "fp32 did not learn in 150 steps");
    CHECK(fabs(b.eval.accuracy - a.eval.accuracy) <= 0.02, "eval accuracy bf16 %.3f, fp32 %.3f", b.eval.accuracy,
          a.eval.accuracy);
}

TG_TEST(test_e2e_cli_metrics) {
    const char *dir = tg_test_tmpdir();
    char cmd[2048], plan[600], metrics[600];
    snprintf(plan, sizeof plan, "%s/demo.tgp", dir);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    /* The binary of the executor under test: build/gpu/ holds the CUDA one. */
    const char *bin = tg_test_cli();
    snprintf(cmd, sizeof cmd,
             "%s compile examples/demo-classify.job -o %s >/dev/null && "
             "%s run %s --set steps=12 --metrics %s 2>%s/stderr.txt",
             bin, plan, bin, plan, metrics, dir);
    REQUIRE(system(cmd) == 0, "CLI run failed: %s", cmd);
    FILE *f = fopen(metrics, "r");
    REQUIRE(f, "no metrics file");
    char line[4096];
    int steps = 0, summary = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        if (!CHECK(o, "metrics line is not JSON: %s", line)) break;
        if (json_object_get(o, "summary")) {
            summary++;
            CHECK(json_integer_value(json_object_get(o, "steps")) == 12, "summary steps");
            double acc = json_number_value(json_object_get(o, "eval_accuracy"));
            CHECK(acc > 0 && acc <= 1, "summary eval_accuracy %g", acc);
            const char *dev = json_string_value(json_object_get(o, "device"));
            CHECK(dev && !strcmp(dev, tg_test_device() ? "cuda" : "cpu"), "summary device %s", dev ? dev : "(none)");
        } else {
            steps++;
            CHECK(json_integer_value(json_object_get(o, "step")) == steps, "step numbering");
            static const char *const keys[] = {"loss",     "lr",         "step_ms",     "tokens_per_s", "grad_norm",
                                               "batch_ms", "forward_ms", "backward_ms", "optimizer_ms"};
            for (int k = 0; k < 9; k++)
                CHECK(json_is_number(json_object_get(o, keys[k])) &&
                          json_number_value(json_object_get(o, keys[k])) >= 0,
                      "step %d: %s missing", steps, keys[k]);
            double phases = json_number_value(json_object_get(o, "forward_ms")) +
                            json_number_value(json_object_get(o, "backward_ms")) +
                            json_number_value(json_object_get(o, "optimizer_ms"));
            CHECK(json_integer_value(json_object_get(o, "seq")) == 48, "step %d: seq %lld", steps,
                  (long long)json_integer_value(json_object_get(o, "seq")));
            CHECK(phases > 0 && phases <= json_number_value(json_object_get(o, "step_ms")) + 0.05,
                  "step %d: phases %.3f ms in a step of %.3f ms", steps, phases,
                  json_number_value(json_object_get(o, "step_ms")));
        }
        json_decref(o);
    }
    fclose(f);
    CHECK(steps == 12 && summary == 1, "%d step lines, %d summaries", steps, summary);
    /* A compiled plan refuses overrides that would change it. */
    snprintf(cmd, sizeof cmd, "%s run %s --set lr=0.1 2>%s/stderr.txt", bin, plan, dir);
    CHECK(system(cmd) != 0, "--set lr on a plan must fail");
    snprintf(cmd, sizeof cmd, "%s/stderr.txt", dir);
    char *text = tg_test_read_file(cmd, NULL);
    CHECK(text && strstr(text, "recompile"), "message: %s", text ? text : "(none)");
    free(text);
}

/* tunegraph run with data_parallel = 2 and ZeRO-1: the CLI starts the second replica itself, trains,
 * evaluates and saves from replica 0, and reports both replicas. On CUDA it needs two
 * GPUs. */
TG_TEST(test_e2e_cli_data_parallel) {
    const int cuda = tg_test_device();
    if (cuda && tg_cuda_device_count() < 2) {
        printf("    not run: 2 replicas on CUDA need 2 GPUs\n");
        return;
    }
    const char *dir = tg_test_tmpdir();
    char cmd[2048], metrics[600], saved[600];
    snprintf(metrics, sizeof metrics, "%s/dp.jsonl", dir);
    snprintf(saved, sizeof saved, "%s/dp.safetensors", dir);
    snprintf(cmd, sizeof cmd,
             "%s run examples/demo-classify.job --device %s --set data_parallel=2 --set zero_stage=1 --set batch=8 "
             "--set steps=20 --metrics %s --save %s 2>%s/dp-stderr.txt",
             tg_test_cli(), cuda ? "cuda" : "cpu", metrics, saved, dir);
    REQUIRE(system(cmd) == 0, "CLI run failed: %s", cmd);
    char *text = tg_test_read_file(metrics, NULL);
    REQUIRE(text, "no metrics file");
    const char *last = strstr(text, "\"summary\"");
    CHECK(last && strstr(last, "\"replicas\": 2") && strstr(last, "\"steps\": 20") && strstr(last, "eval_accuracy"),
          "summary: %s", last ? last : "(none)");
    free(text);
    snprintf(cmd, sizeof cmd, "%s/dp-stderr.txt", dir);
    text = tg_test_read_file(cmd, NULL);
    CHECK(text && strstr(text, "on each of 2 data-parallel replicas") && strstr(text, "saved"), "stderr: %s",
          text ? text : "(none)");
    free(text);
    struct stat st;
    CHECK(stat(saved, &st) == 0 && st.st_size > 0, "no checkpoint from replica 0");
}
