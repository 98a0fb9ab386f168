/* The GPUs' energy from NVML (runtime/nvml_energy.h) through a library of the test's own,
 * built here and opened by TUNEGRAPH_NVML, whose energy counters give scripted values; the
 * figures the run derives from it and from gpu_hour_price, the summary line's keys, the
 * sweep ranking by them and compare showing them; gpu_hour_price as a job key. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/front.h"
#include "cli/compare.h"
#include "cli/environment.h"
#include "cli/metrics.h"
#include "cli/sweep.h"
#include "compiler/job.h"
#include "plan/plan_file.h"
#include "runtime/nvml_energy.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* NVML as far as this project calls it. GPU i (NVML index) reads 1e6 x (i + 1) mJ at its
 * first read since nvmlInit_v2 and (i + 1) x 250000 mJ more at each read after; GPU 7 has
 * no counter (NVML_ERROR_NOT_SUPPORTED, 3); FAKE_NO_ENERGY leaves the energy function
 * out, FAKE_NO_INIT makes nvmlInit_v2 fail. */
static const char fake_nvml_source[] =
    "#include <stdint.h>\n"
    "#include <string.h>\n"
    "static unsigned long long reads[8];\n"
    "int nvmlInit_v2(void) {\n"
    "#ifdef FAKE_NO_INIT\n"
    "    return 1;\n"
    "#endif\n"
    "    memset(reads, 0, sizeof reads);\n"
    "    return 0;\n"
    "}\n"
    "int nvmlShutdown(void) { return 0; }\n"
    "int nvmlSystemGetDriverVersion(char *t, unsigned n) { strncpy(t, \"555.42.06\", n); return 0; }\n"
    "int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {\n"
    "    if (i >= 8) return 2;\n"
    "    *d = (void *)(uintptr_t)(i + 1);\n"
    "    return 0;\n"
    "}\n"
    "int nvmlDeviceGetHandleByUUID(const char *u, void **d) {\n"
    "    if (strcmp(u, \"GPU-5555\")) return 6;\n"
    "    *d = (void *)(uintptr_t)6;\n"
    "    return 0;\n"
    "}\n"
    "int nvmlDeviceGetName(void *d, char *t, unsigned n) { strncpy(t, \"Fake GPU\", n); return 0; }\n"
    "#ifndef FAKE_NO_ENERGY\n"
    "int nvmlDeviceGetTotalEnergyConsumption(void *d, unsigned long long *mj) {\n"
    "    unsigned i = (unsigned)(uintptr_t)d - 1;\n"
    "    if (i == 7) return 3;\n"
    "    *mj = 1000000ull * (i + 1) + reads[i]++ * 250000ull * (i + 1);\n"
    "    return 0;\n"
    "}\n"
    "#endif\n";

/* Builds the fake library with `defines` into dir/name; its path into path. 1, or a failed CHECK. */
static int build_fake_nvml(const char *dir, const char *name, const char *defines, char *path, size_t cap) {
    char src[1100], cmd[4000];
    snprintf(src, sizeof src, "%s/fake_nvml.c", dir);
    snprintf(path, cap, "%s/%s", dir, name);
    if (!CHECK(tg_test_write_file(src, fake_nvml_source) == 0, "cannot write %s", src)) return 0;
    const char *cc = getenv("CC");
    snprintf(cmd, sizeof cmd, "%s -shared -fPIC %s -o '%s' '%s'", cc && *cc ? cc : "cc", defines, path, src);
    return CHECK(system(cmd) == 0, "cannot build the fake NVML: %s", cmd);
}

/* Restores TUNEGRAPH_NVML and CUDA_VISIBLE_DEVICES as they were (the suite sets neither). */
static void unset_nvml_env(void) {
    unsetenv("TUNEGRAPH_NVML");
    unsetenv("CUDA_VISIBLE_DEVICES");
}

TG_TEST(test_nvml_energy_of_scripted_counters) {
    const char *dir = tg_test_tmpdir();
    char lib[1200];
    if (!build_fake_nvml(dir, "libfake-nvml.so", "", lib, sizeof lib)) return;
    setenv("TUNEGRAPH_NVML", lib, 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    tg_energy_meter m;
    tg_err err = {{0}};
    REQUIRE(tg_energy_meter_open(&m, 2, &err) == 0, "%s", err.msg);
    /* Opening read each GPU once; then GPU 0 reads 1.25e6 and 1.5e6 mJ, GPU 1 2.5e6 and 3e6. */
    double start = 0, end = 0;
    CHECK(tg_energy_meter_read(&m, &start, &err) == 0 && start == 3750.0, "start %.17g J: %s", start, err.msg);
    CHECK(tg_energy_meter_read(&m, &end, &err) == 0 && end == 4500.0, "end %.17g J: %s", end, err.msg);
    tg_energy_meter_close(&m);
    /* 750 J over 10 steps of 3000 tokens in all, 2.5 s. */
    tg_energy_use u = tg_energy_use_of(end - start, 10, 3000, 2.5);
    CHECK(u.joules == 750.0 && u.joules_per_step == 75.0 && u.joules_per_1k_tokens == 250.0 && u.avg_power_w == 300.0 &&
              u.tokens_per_joule == 4.0,
          "%.17g J: %.17g J/step, %.17g J/1k tokens, %.17g W, %.17g tokens/J", u.joules, u.joules_per_step,
          u.joules_per_1k_tokens, u.avg_power_w, u.tokens_per_joule);
    tg_energy_use none = tg_energy_use_of(0, 0, 0, 0);
    CHECK(isnan(none.joules_per_step) && isnan(none.joules_per_1k_tokens) && isnan(none.avg_power_w) &&
              isnan(none.tokens_per_joule),
          "figures over nothing are not NaN");
    /* CUDA_VISIBLE_DEVICES maps CUDA's GPUs to NVML's: "3,1" makes CUDA's 0 NVML's 3
     * (4e6 mJ at its first read, then 5e6), a GPU-... UUID is looked up as such. */
    setenv("CUDA_VISIBLE_DEVICES", "3,1", 1);
    REQUIRE(tg_energy_meter_open(&m, 1, &err) == 0, "%s", err.msg);
    CHECK(tg_energy_meter_read(&m, &start, &err) == 0 && start == 5000.0, "GPU 3 read %.17g J", start);
    tg_energy_meter_close(&m);
    setenv("CUDA_VISIBLE_DEVICES", "GPU-5555", 1);
    REQUIRE(tg_energy_meter_open(&m, 1, &err) == 0, "%s", err.msg);
    CHECK(tg_energy_meter_read(&m, &start, &err) == 0 && start == 7500.0, "GPU-5555 (NVML's 5) read %.17g J", start);
    tg_energy_meter_close(&m);
    setenv("CUDA_VISIBLE_DEVICES", "0", 1);
    CHECK(tg_energy_meter_open(&m, 2, &err) == -1 && strstr(err.msg, "CUDA_VISIBLE_DEVICES='0' has no entry for GPU 1"),
          "%s", err.msg);
    setenv("CUDA_VISIBLE_DEVICES", "GPU-0000", 1);
    CHECK(tg_energy_meter_open(&m, 1, &err) == -1 && strstr(err.msg, "NVML cannot find GPU GPU-0000 (CUDA's GPU 0)"),
          "%s", err.msg);
    setenv("CUDA_VISIBLE_DEVICES", "x1", 1);
    CHECK(tg_energy_meter_open(&m, 1, &err) == -1 && strstr(err.msg, "'x1' is neither an index nor a GPU-... UUID"),
          "%s", err.msg);
    /* A GPU without a counter, and one NVML does not have. */
    setenv("CUDA_VISIBLE_DEVICES", "0,7", 1);
    CHECK(tg_energy_meter_open(&m, 2, &err) == -1 &&
              !strcmp(err.msg, "GPU 1 has no energy counter (NVML gives no total energy consumption)"),
          "%s", err.msg);
    setenv("CUDA_VISIBLE_DEVICES", "9", 1);
    CHECK(tg_energy_meter_open(&m, 1, &err) == -1 && !strcmp(err.msg, "NVML cannot open GPU 9 (CUDA's GPU 0)"), "%s",
          err.msg);
    unsetenv("CUDA_VISIBLE_DEVICES");
    CHECK(tg_energy_meter_open(&m, 0, &err) == -1 && strstr(err.msg, "the energy meter reads 1 to"), "%s", err.msg);
    unset_nvml_env();
}

/* No library, one that does not start, one without the energy function: the meter says
 * why, which is the run's one note line. */
TG_TEST(test_nvml_energy_absent_says_why) {
    const char *dir = tg_test_tmpdir();
    char path[1200];
    tg_energy_meter m;
    tg_err err = {{0}};
    snprintf(path, sizeof path, "%s/none/libnvidia-ml.so.1", dir);
    setenv("TUNEGRAPH_NVML", path, 1);
    CHECK(tg_energy_meter_open(&m, 1, &err) == -1 && strstr(err.msg, "/none/libnvidia-ml.so.1 cannot be opened"), "%s",
          err.msg);
    if (build_fake_nvml(dir, "libno-init.so", "-DFAKE_NO_INIT", path, sizeof path)) {
        setenv("TUNEGRAPH_NVML", path, 1);
        CHECK(tg_energy_meter_open(&m, 1, &err) == -1 && strstr(err.msg, "NVML did not start"), "%s", err.msg);
    }
    if (build_fake_nvml(dir, "libno-energy.so", "-DFAKE_NO_ENERGY", path, sizeof path)) {
        setenv("TUNEGRAPH_NVML", path, 1);
        CHECK(tg_energy_meter_open(&m, 1, &err) == -1 &&
                  !strcmp(err.msg, "this NVML has no nvmlDeviceGetTotalEnergyConsumption"),
              "%s", err.msg);
    }
    unset_nvml_env();
}

/* environment.json's driver and clocks come through the same loader. */
TG_TEST(test_nvml_environment_through_the_loader) {
    const char *dir = tg_test_tmpdir();
    char lib[1200];
    if (!build_fake_nvml(dir, "libfake-nvml.so", "", lib, sizeof lib)) return;
    setenv("TUNEGRAPH_NVML", lib, 1);
    json_t *env = environment_describe("cuda");
    unset_nvml_env();
    REQUIRE(env, "no environment");
    json_t *gpu = json_object_get(env, "gpu");
    CHECK(!strcmp(json_string_value(json_object_get(gpu, "driver")) ? json_string_value(json_object_get(gpu, "driver")) : "",
                  "555.42.06") &&
              !strcmp(json_string_value(json_object_get(gpu, "nvml_name")) ? json_string_value(json_object_get(gpu, "nvml_name")) : "",
                      "Fake GPU"),
          "driver and name from the fake NVML");
    json_decref(env);
}

TG_TEST(test_cost_per_1m_tokens) {
    /* 2,000,000 tokens in 720 s: 360 s per 1M tokens, x 4 GPUs at 2.5 an hour = 1. */
    const double cost = tg_cost_per_1m_tokens(2.5, 4, 2000000, 720);
    CHECK(fabs(cost - 1.0) < 1e-12, "cost %.17g", cost);
    CHECK(isnan(tg_cost_per_1m_tokens(0, 4, 2000000, 720)) && isnan(tg_cost_per_1m_tokens(2.5, 0, 2000000, 720)) &&
              isnan(tg_cost_per_1m_tokens(2.5, 4, 0, 720)) && isnan(tg_cost_per_1m_tokens(2.5, 4, 2000000, 0)),
          "a cost without a price, GPUs, tokens or time");
}

/* The summary line: the energy keys the sweep and compare read, and the cost; none of them
 * when not measured or not priced. */
static json_t *summary_line(int energy, double joules_per_1k_tokens, double cost) {
    tg_memory_use mem = {.planned = 1000, .estimated = 2000, .measured = 3000};
    metrics_summary s = {.steps = 10, .train_s = 2.5, .tokens = 3000, .median_step_ms = 250, .device = "cuda",
                         .replicas = 1, .mem = &mem, .cost_per_1m_tokens = cost, .energy_measured = energy};
    s.energy = tg_energy_use_of(joules_per_1k_tokens * 3, 10, 3000, 2.5);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    int rc = metrics_write_summary(f, &s);
    fclose(f);
    json_t *o = rc ? NULL : json_loads(buf, 0, NULL);
    free(buf);
    return o;
}

static double key_number(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

TG_TEST(test_nvml_energy_summary_keys) {
    json_t *o = summary_line(1, 250, 1.25);
    REQUIRE(o, "no summary line");
    CHECK(key_number(o, "energy_j") == 750 && key_number(o, "joules_per_step") == 75 &&
              key_number(o, "joules_per_1k_tokens") == 250 && key_number(o, "avg_power_w") == 300 &&
              key_number(o, "tokens_per_joule") == 4 && key_number(o, "cost_per_1m_tokens") == 1.25,
          "energy and cost keys");
    json_decref(o);
    o = summary_line(0, 250, NAN);
    REQUIRE(o, "no summary line");
    static const char *const keys[] = {"energy_j", "joules_per_step", "joules_per_1k_tokens", "avg_power_w",
                                       "tokens_per_joule", "cost_per_1m_tokens"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        CHECK(!json_object_get(o, keys[k]), "%s written without a measure or a price", keys[k]);
    json_decref(o);
}

/* Writes a metrics file of `steps` step lines and a summary with the energy and cost given. */
static int write_metrics(const char *path, int steps, double joules_per_1k_tokens, double cost) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    for (int k = 1; k <= steps; k++)
        fprintf(f, "{\"step\": %d, \"loss\": 1.0, \"step_ms\": 10.0, \"tokens_per_s\": 1000.0}\n", k);
    json_t *o = summary_line(1, joules_per_1k_tokens, cost);
    int rc = o && json_dumpf(o, f, JSON_PRESERVE_ORDER) == 0 && fputc('\n', f) != EOF ? 0 : -1;
    json_decref(o);
    return fclose(f) || rc ? -1 : 0;
}

/* Stands for `run` in a sweep: batch 2 takes 200 J per 1k tokens and costs 1 per 1M
 * tokens, batch 4 100 J and 3, the same throughput. */
static int scripted_run(int argc, char **argv) {
    const char *metrics = NULL;
    int batch = 0;
    for (int i = 0; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--metrics")) metrics = argv[i + 1];
        if (!strcmp(argv[i], "--set") && !strncmp(argv[i + 1], "batch=", 6)) batch = atoi(argv[i + 1] + 6);
    }
    if (!metrics || (batch != 2 && batch != 4)) return 2;
    return write_metrics(metrics, 3, batch == 2 ? 200 : 100, batch == 2 ? 1 : 3) ? 1 : 0;
}

/* Runs a sweep over batch 2 and 4 with `weights` into dir/name; the results' lines. */
static json_t *scripted_sweep(const char *dir, const char *name, const char *weights) {
    char out[1200], path[1300];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    char *argv[] = {"examples/demo-classify.job", "--grid", "batch=2,4", "--set", "seq=16", "--steps", "2",
                    "--warmup", "1", "--weights", (char *)weights, "-o", out, "--device", "cpu", NULL};
    /* The table and progress lines go to files of their own. */
    fflush(stdout), fflush(stderr);
    snprintf(path, sizeof path, "%s/%s.out", dir, name);
    int saved_out = dup(1), saved_err = dup(2);
    FILE *sink = fopen(path, "w");
    if (sink) dup2(fileno(sink), 1), dup2(fileno(sink), 2);
    int status = cmd_sweep((int)(sizeof argv / sizeof argv[0]) - 1, argv, scripted_run);
    fflush(stdout), fflush(stderr);
    dup2(saved_out, 1), dup2(saved_err, 2);
    close(saved_out), close(saved_err);
    if (sink) fclose(sink);
    if (!CHECK(status == 0, "sweep %s exited %d (see %s)", weights, status, path)) return NULL;
    snprintf(path, sizeof path, "%s/results.jsonl", out);
    char *text = tg_test_read_file(path, NULL);
    json_t *lines = json_array();
    for (char *l = text ? strtok(text, "\n") : NULL; l; l = strtok(NULL, "\n")) json_array_append_new(lines, json_loads(l, 0, NULL));
    free(text);
    return lines;
}

TG_TEST(test_nvml_energy_sweep_ranks_by_energy_and_cost) {
    const char *dir = tg_test_tmpdir();
    json_t *by_energy = scripted_sweep(dir, "energy", "energy=1");
    REQUIRE(by_energy && json_array_size(by_energy) == 2, "results");
    json_t *b2 = json_array_get(by_energy, 0), *b4 = json_array_get(by_energy, 1);
    CHECK(key_number(b2, "joules_per_1k_tokens") == 200 && key_number(b4, "joules_per_1k_tokens") == 100 &&
              key_number(b2, "cost_per_1m_tokens") == 1 && key_number(b4, "cost_per_1m_tokens") == 3,
          "the points' energy and cost");
    CHECK(key_number(b4, "rank") == 1 && key_number(b2, "rank") == 2 && key_number(b4, "score") == 1 &&
              key_number(b2, "score") == 0.5,
          "by energy: batch 4 rank %g score %g, batch 2 rank %g score %g", key_number(b4, "rank"),
          key_number(b4, "score"), key_number(b2, "rank"), key_number(b2, "score"));
    json_decref(by_energy);
    json_t *by_cost = scripted_sweep(dir, "cost", "cost=1");
    REQUIRE(by_cost && json_array_size(by_cost) == 2, "results");
    b2 = json_array_get(by_cost, 0), b4 = json_array_get(by_cost, 1);
    CHECK(key_number(b2, "rank") == 1 && key_number(b4, "rank") == 2 && fabs(key_number(b4, "score") - 1.0 / 3) < 1e-5 /* written to 6 digits */,
          "by cost: batch 2 rank %g, batch 4 rank %g score %g", key_number(b2, "rank"), key_number(b4, "rank"),
          key_number(b4, "score"));
    json_decref(by_cost);
}

TG_TEST(test_nvml_energy_compare_shows_it) {
    const char *dir = tg_test_tmpdir();
    char a[1200], b[1200], line[2600];
    snprintf(a, sizeof a, "%s/a.jsonl", dir);
    snprintf(b, sizeof b, "%s/b.jsonl", dir);
    REQUIRE(write_metrics(a, 2, 250, 1.25) == 0 && write_metrics(b, 2, 125, 2.5) == 0, "cannot write the metrics");
    snprintf(line, sizeof line, "compare %s %s", a, b);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.out, "exit %d: %s", r.status, r.err ? r.err : "");
    const char *j1k = strstr(r.out, "energy (J/1k tokens)"), *step = strstr(r.out, "energy (J/step)");
    const char *cost = strstr(r.out, "cost (per 1M tokens)");
    CHECK(j1k && strstr(j1k, "250") && strstr(j1k, "125") && step && strstr(step, "75") && cost &&
              strstr(cost, "1.25") && strstr(cost, "2.5"),
          "compare:\n%s", r.out);
    tg_cli_run_free(&r);
}

/* gpu_hour_price: a run key, bounded, its errors naming the file, line and key; carried by
 * the plan's run settings and a --set on a plan. */
TG_TEST(test_gpu_hour_price_key) {
    const char *dir = tg_test_tmpdir();
    static const struct {
        const char *value, *error;
    } bad[] = {{"-1", "is out of range (must be in [0, 1e+06])"},
               {"2000000", "is out of range (must be in [0, 1e+06])"},
               {"abc", "'abc' is not a number"},
               {"inf", "is not a finite 32-bit float"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        char text[300];
        snprintf(text, sizeof text, "model = tiny-bert\ntask = classify\ngpu_hour_price = %s\n", bad[k].value);
        tg_job job;
        tg_err err = {{0}};
        CHECK(tg_job_parse_text(text, "price.job", dir, NULL, 0, &job, &err) == -1 &&
                  strstr(err.msg, "price.job:3: key 'gpu_hour_price': ") && strstr(err.msg, bad[k].error),
              "%s: %s", bad[k].value, err.msg);
    }
    const char *sets[] = {"gpu_hour_price=2.49", "steps=1"};
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_front_compile_file("examples/demo-classify.job", sets, 2, &plan, &err) == 0, "%s", err.msg);
    CHECK(plan.run.gpu_hour_price == 2.49f, "plan's price %g", (double)plan.run.gpu_hour_price);
    uint8_t *bytes = NULL;
    size_t n = 0;
    tg_plan back;
    REQUIRE(tg_plan_encode(&plan, &bytes, &n, &err) == 0, "%s", err.msg);
    REQUIRE(tg_plan_decode(bytes, n, "p.tgp", &back, &err) == 0, "%s", err.msg);
    CHECK(back.run.gpu_hour_price == 2.49f, "decoded price %g", (double)back.run.gpu_hour_price);
    const char *later[] = {"gpu_hour_price=0.5"};
    CHECK(tg_job_apply_run_overrides(&back.run, back.train.n_buckets, later, 1, "p.tgp", &err) == 0 &&
              back.run.gpu_hour_price == 0.5f,
          "--set on the plan: %g %s", (double)back.run.gpu_hour_price, err.msg);
    const char *wrong[] = {"gpu_hour_price=-3"};
    CHECK(tg_job_apply_run_overrides(&back.run, back.train.n_buckets, wrong, 1, "p.tgp", &err) == -1 &&
              strstr(err.msg, "key 'gpu_hour_price'") && strstr(err.msg, "out of range"),
          "%s", err.msg);
    free(bytes);
    tg_plan_free(&back);
    tg_plan_free(&plan);
}

/* A run with a price reports the cost per 1M tokens: price x GPUs (the machine's one hour
 * on the CPU) x the seconds 1M tokens took / 3600. On CUDA it also says what it measured of
 * the energy, or why not. */
TG_TEST(test_gpu_hour_price_run_reports_cost) {
    const char *dir = tg_test_tmpdir();
    char line[2048], metrics[1200];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    snprintf(line, sizeof line,
             "run examples/demo-classify.job --set steps=3 --set batch=4 --set seq=16 --threads 1 --set "
             "gpu_hour_price=3.6 --device %s --metrics %s",
             tg_test_device() ? "cuda" : "cpu", metrics);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "exit %d: %s", r.status, r.err ? r.err : "");
    CHECK(strstr(r.err, tg_test_device() ? " per 1M tokens (3.6 per GPU hour x 1)" : " per 1M tokens (3.6 per machine hour x 1)"),
          "stderr: %s", r.err);
    char *text = tg_test_read_file(metrics, NULL);
    json_t *summary = NULL;
    for (char *l = text ? strtok(text, "\n") : NULL; l; l = strtok(NULL, "\n"))
        if (strstr(l, "\"summary\": true")) summary = json_loads(l, 0, NULL);
    free(text);
    REQUIRE(summary, "no summary line in %s", metrics);
    /* 3.6 an hour is 1/1000 a second: the cost is 1000 / tokens per second. */
    const double cost = key_number(summary, "cost_per_1m_tokens"), tps = key_number(summary, "tokens_per_s");
    CHECK(tps > 0 && fabs(cost - 1000.0 / tps) <= 1e-3 * cost, "cost %g at %g tokens/s", cost, tps);
    if (tg_test_device()) {
        const int measured = json_object_get(summary, "joules_per_step") != NULL;
        CHECK(measured ? strstr(r.err, "energy: ") && strstr(r.err, " J/step, ") && key_number(summary, "avg_power_w") > 0 &&
                             key_number(summary, "tokens_per_joule") > 0
                       : strstr(r.err, "energy: not measured (") != NULL,
              "energy on CUDA: %s", r.err);
    } else {
        CHECK(!strstr(r.err, "energy: ") && !json_object_get(summary, "joules_per_step"), "energy on the CPU: %s", r.err);
    }
    json_decref(summary);
    tg_cli_run_free(&r);
}
