/* The cost model on the command line (cli/cost.c), run in this process: `inspect --predict`
 * printouts compared with tests/data/predict_*.txt (the predicted peak memory line is left
 * out: plan/memory_estimate.c has its own tests; TG_TEST_WRITE_EXPECTED=1 rewrites the
 * files), its refusals, the table and metrics lines after `run --profile`, and the whole
 * loop on the CPU executor: calibrate on the sweep's plans, then predict a plan the sweep
 * did not run and compare with its measured step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/front.h"
#include "plan/cost_calibration.h"
#include "runtime/trainer.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* An empty cache folder, so that no calibration of this machine changes the printouts. */
static char g_dir[600];
static const char *private_cache(void) {
    snprintf(g_dir, sizeof g_dir, "%s", tg_test_tmpdir()); /* a fresh folder each call */
    char cache[700];
    snprintf(cache, sizeof cache, "%s/cache", g_dir);
    setenv("TUNEGRAPH_CACHE_DIR", cache, 1);
    return g_dir;
}

/* text without its line starting with "  predicted peak memory" (malloc'd). */
static char *without_memory_line(const char *text) {
    char *out = strdup(text);
    char *m = strstr(out, "  predicted peak memory");
    if (m) {
        char *nl = strchr(m, '\n');
        memmove(m, nl ? nl + 1 : m + strlen(m), strlen(nl ? nl + 1 : m + strlen(m)) + 1);
    }
    return out;
}

TG_TEST(test_cli_cost_predict_golden) {
    static const struct {
        const char *file, *line;
    } cases[] = {
        {"tests/data/predict_bert_classify_h100.txt",
         "inspect examples/demo-classify.job --predict --gpu h100 --set batch=32 --set seq=48 --top 5"},
        {"tests/data/predict_gpt2_lm_replicas_h200.txt",
         "inspect examples/demo-lm.job --predict --gpu h200 --set model=tiny-gpt2 --set data_parallel=2 --set "
         "precision=bf16 --top 3"},
        {"tests/data/predict_bert_accumulation_cpu.txt",
         "inspect examples/demo-classify.job --predict --gpu cpu --threads 2 --set grad_accumulation=2 --top 2"},
    };
    const char *tmp = private_cache();
    const int write = getenv("TG_TEST_WRITE_EXPECTED") != NULL;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_cli_run r = tg_test_cli_line(tmp, cases[k].line, NULL);
        if (!CHECK(r.status == 0 && r.out, "%s: status %d: %s", cases[k].line, r.status, r.err ? r.err : "")) {
            tg_cli_run_free(&r);
            continue;
        }
        CHECK(strstr(r.out, "  predicted peak memory on the "), "%s: no peak memory line", cases[k].line);
        char *got = without_memory_line(r.out);
        if (write) tg_test_write_file(cases[k].file, got);
        char *want = tg_test_read_file(cases[k].file, NULL);
        if (CHECK(want, "cannot read %s", cases[k].file)) {
            size_t at = 0, line = 1;
            for (; got[at] && got[at] == want[at]; at++) line += got[at] == '\n';
            CHECK(got[at] == want[at], "%s line %zu differs:\n got: %.300s\nwant: %.300s", cases[k].file, line, got + at,
                  want + at);
        }
        free(got), free(want);
        tg_cli_run_free(&r);
    }
}

TG_TEST(test_cli_cost_refusals) {
    const char *tmp = private_cache();
    static const struct {
        const char *line;
        int status;
        const char *want;
    } cases[] = {
        {"inspect examples/demo-classify.job --predict --gpu a800", 1, "no cost description for device 'a800'"},
        {"inspect examples/demo-classify.job --predict --threads x", 2, "--threads needs a whole number 0 to 1024, got 'x'"},
        {"inspect examples/demo-classify.job --predict --gpu", 2, "--gpu needs a value"},
        {"inspect examples/demo-classify.job --predict --bogus", 2, "unknown option --bogus"},
        {"inspect --predict", 2, "missing plan or job file"},
        {"inspect examples/demo-classify.job --predict --calibration /nonexistent/cal.txt", 1,
         "calibration /nonexistent/cal.txt"},
        {"calibrate --device tpu", 2, "--device must be cpu or cuda, got 'tpu'"},
        {"calibrate --repeats 0", 2, "--repeats needs a whole number 1 to 100, got '0'"},
        {"calibrate --device cuda", 1, "calibrate --device cuda needs the GPU build"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        /* The GPU build calibrates on the GPU instead (its refusal is the CPU build's). */
        if (tg_cuda_built() && strstr(cases[k].line, "--device cuda")) continue;
        tg_cli_run r = tg_test_cli_line(tmp, cases[k].line, NULL);
        CHECK(r.status == cases[k].status && r.err && strstr(r.err, cases[k].want), "%s: status %d: %s", cases[k].line,
              r.status, r.err ? r.err : "");
        tg_cli_run_free(&r);
    }
    /* A damaged cached calibration: said, and the defaults used. */
    char path[1024];
    REQUIRE(tg_cost_calibration_path("h100", 0, path, sizeof path) == 0, "path");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/cache", tmp);
    char mk[1100];
    snprintf(mk, sizeof mk, "mkdir -p %s", dir);
    REQUIRE(system(mk) == 0, "mkdir");
    REQUIRE(tg_test_write_file(path, "tunegraph cost calibration 1\ndevice = h100\n") == 0, "write %s", path);
    tg_cli_run r = tg_test_cli_line(tmp, "inspect examples/demo-classify.job --predict --gpu h100", NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, "the cached calibration cannot be used") &&
              strstr(r.err, "cost-h100.txt:3: the file ends here") && r.out && strstr(r.out, "uncalibrated"),
          "damaged cache: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    unlink(path);
}

TG_TEST(test_cli_cost_run_profile_table) {
    const char *tmp = private_cache();
    char line[1024];
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --set steps=2 --set batch=4 --set seq=16 --threads 1 --profile --metrics "
             "%s/m.jsonl",
             tmp);
    tg_cli_run r = tg_test_cli_line(tmp, line, NULL);
    REQUIRE(r.status == 0 && r.err, "status %d: %s", r.status, r.err ? r.err : "");
    /* On a GPU the run's device is the detected GPU, described by its key. */
    const int gpu = tg_test_device() == 1;
    CHECK(strstr(r.err, gpu ? ", uncalibrated defaults) against the profile:"
                            : "cost model (cpu, uncalibrated defaults) against the profile:") &&
              strstr(r.err, "  matmul ") && strstr(r.err, "  step (run's median) "),
          "no table:\n%s", r.err);
    /* The table's measured column is the profile's op times summed: every entry positive,
     * the groups and the phases adding up to the profile's total (the slowest-ops list
     * once marked its ops by overwriting their times, and the table summed those). */
    const char *head = strstr(r.err, "profile (ops launched one by one, mean of ");
    double total = -1, one_by_one = -1, groups = 0, phases = 0;
    int rows = 0, in_phases = 0; /* the groups' rows come first, then forward, backward, optimizer */
    REQUIRE(head && sscanf(strchr(head, ':') + 1, " %lf ms in", &total) == 1, "no profile total:\n%s", r.err);
    const char *at = strstr(r.err, "against the profile:");
    at = at ? strchr(at, '\n') : NULL;
    for (at = at ? strchr(at + 1, '\n') : NULL; at && at[1] == ' ' && at[2] == ' '; at = strchr(at + 1, '\n')) {
        char name[64] = "";
        double predicted, measured;
        const char *nums = at + 3 + 20; /* the name's column is 20 wide */
        if (strlen(at) < 24 || sscanf(nums, "%lf %lf", &predicted, &measured) != 2) break;
        snprintf(name, sizeof name, "%.20s", at + 3);
        rows++;
        CHECK(measured >= 0 && !strstr(nums, "nan"), "table row '%s': measured %.4f ms", name, measured);
        if (!strncmp(name, "forward ", 8)) in_phases = 1;
        if (!strncmp(name, "ops one by one", 14)) one_by_one = measured, in_phases = 0;
        else if (in_phases) phases += measured;
        else if (strncmp(name, "step", 4)) groups += measured;
    }
    CHECK(rows >= 6, "%d table rows:\n%s", rows, r.err);
    CHECK(fabs(groups - total) <= 0.01 + 1e-3 * total && fabs(phases - total) <= 0.01 + 1e-3 * total,
          "measured groups sum to %.4f ms, phases to %.4f ms, the profile's total %.3f ms", groups, phases, total);
    CHECK(fabs(one_by_one - total) <= 0.002 + 1e-3 * total, "ops one by one measured %.4f ms, the profile's %.3f ms",
          one_by_one, total);
    tg_cli_run_free(&r);
    char path[1024];
    snprintf(path, sizeof path, "%s/m.jsonl", tmp);
    char *m = tg_test_read_file(path, NULL);
    REQUIRE(m, "no metrics");
    CHECK(strstr(m, gpu ? "{\"cost_model\": \"group\", \"name\": \"matmul\", \"device\": \""
                        : "{\"cost_model\": \"group\", \"name\": \"matmul\", \"device\": \"cpu\", \"calibrated\": false, "
                          "\"predicted_ms\": ") &&
              strstr(m, "{\"cost_model\": \"step\", \"name\": \"step\"") && strstr(m, "\"error_pct\": "),
          "metrics lines");
    free(m);
    /* `tunegraph plot` reads the file with its cost_model lines. */
    snprintf(line, sizeof line, "plot %s -o %s/plots", path, tmp);
    r = tg_test_cli_line(tmp, line, NULL);
    CHECK(r.status == 0, "plot: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* A BERT the calibration sweep does not run (width 192, 3 layers). */
static int compile_target(const char *tmp, tg_plan *p) {
    char dir[700], path[800];
    snprintf(dir, sizeof dir, "%s/bert192", tmp);
    snprintf(path, sizeof path, "mkdir -p %s", dir);
    if (!CHECK(system(path) == 0, "mkdir")) return 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    tg_test_write_file(path,
                       "{\"model_type\": \"bert\", \"hidden_size\": 192, \"num_hidden_layers\": 3, "
                       "\"num_attention_heads\": 4, \"intermediate_size\": 768, \"vocab_size\": 3000, "
                       "\"max_position_embeddings\": 512, \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", "
                       "\"layer_norm_eps\": 1e-12, \"initializer_range\": 0.02, \"hidden_dropout_prob\": 0.1, "
                       "\"attention_probs_dropout_prob\": 0.1, \"pad_token_id\": 0}\n");
    char job[1200];
    snprintf(job, sizeof job, "model = %s\ntask = classify\nnum_labels = 2\nbatch = 4\nseq = 96\nsteps = 10\n"
                              "train_data = unused.jsonl\n", dir);
    tg_err err = {{0}};
    return CHECK(tg_front_compile_text(job, "target", dir, NULL, 0, p, &err) == 0, "%s", err.msg);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The CPU executor end to end: calibrate (one thread), predict the target's step, run it.
 * The calibrated model predicted the target's step +12% to +29% off its median step on a
 * quiet 2-core host, +64% once with CI's other work on the cores (docs/COST_MODEL.md): how
 * close it comes is the benchmarks' to say, not a timed test's. This one holds the
 * prediction within a factor of E2E_FACTOR of the measured step, which a mistake in the
 * mechanics (a unit, a group left out, a calibration not applied) breaks by far more. */
#define E2E_FACTOR 3.0
TG_TEST(test_cli_cost_cpu_calibrate_then_predict) {
    const char *tmp = private_cache();
    char line[1024], cal[800];
    snprintf(cal, sizeof cal, "%s/cal.txt", tmp);
    snprintf(line, sizeof line, "calibrate --device cpu --threads 1 --repeats 2 -o %s", cal);
    tg_cli_run r = tg_test_cli_line(tmp, line, NULL);
    REQUIRE(r.status == 0 && r.out && strstr(r.out, "calibrated cpu (the CPU executor, 1 threads)"), "calibrate: %s",
            r.err ? r.err : "");
    tg_cli_run_free(&r);
    tg_cost_calibration c;
    tg_err err = {{0}};
    REQUIRE(tg_cost_calibration_read(cal, &c, &err) == 0, "%s", err.msg);
    CHECK(c.threads == 1 && c.samples[TG_GROUP_MATMUL] > 50 && c.samples[TG_GROUP_COMM] == 0 && c.peak_tflops > 0,
          "calibration fields");
    tg_plan p;
    REQUIRE(compile_target(tmp, &p), "target");
    tg_cost_device d;
    REQUIRE(tg_cost_device_builtin("cpu", p.train.precision, 0, &d, &err) == 0 && tg_cost_device_apply(&d, &c, &err) == 0,
            "%s", err.msg);
    tg_cost_prediction pred;
    REQUIRE(tg_cost_predict(&p, &d, &pred, &err) == 0, "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    /* Full rows, as the sweep measured: every token real. */
    int32_t *ids = tg_trainer_input(&tr, p.io.input_ids), *pos = tg_trainer_input(&tr, p.io.position_ids);
    float *mask = tg_trainer_input(&tr, p.io.attention_mask);
    int32_t *labels = tg_trainer_input(&tr, p.io.labels);
    for (int i = 0; i < p.train.batch * p.train.seq; i++)
        ids[i] = 1 + (i * 7919) % 2999, pos[i] = i % p.train.seq, mask[i] = 1.0f;
    for (int b = 0; b < p.train.batch; b++) labels[b] = b % 2;
    double ms[6];
    for (int s = 0; s < 6; s++) {
        tg_step_stats st;
        REQUIRE(tg_trainer_run_step(&tr, &st, &err) == 0, "%s", err.msg);
        ms[s] = st.step_ms;
    }
    tg_trainer_close(&tr);
    qsort(ms + 1, 5, sizeof ms[0], cmp_double); /* the first step left out (first touches) */
    const double measured = ms[3] / 1e3, error = (pred.step_s - measured) / measured;
    printf("    cost model on the CPU: predicted %.2f ms, measured %.2f ms (median of 5), error %+.1f%%\n",
           pred.step_s * 1e3, measured * 1e3, 100 * error);
    CHECK(pred.step_s < measured * E2E_FACTOR && measured < pred.step_s * E2E_FACTOR,
          "predicted %.3f ms, measured %.3f ms: more than a factor of %.0f apart", pred.step_s * 1e3, measured * 1e3,
          E2E_FACTOR);
    tg_cost_prediction_free(&pred);
    tg_plan_free(&p);
}
