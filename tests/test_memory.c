/* The memory estimate (its parts add up and follow the plan), the preflight's refusal
 * before anything is allocated, and the measured peak of a CPU run. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/inspect.h"
#include "plan/memory_estimate.h"
#include "runtime/preflight.h"
#include "runtime/trainer.h"
#include "runtime/weights.h"
#include "tests/harness.h"

/* The estimate of plan p on a GPU and on the CPU. */
static void estimate_both(const tg_plan *p, tg_memory_estimate *gpu, tg_memory_estimate *cpu) {
    tg_estimate_memory(p, TG_MEM_DEVICE_CUDA, gpu);
    tg_estimate_memory(p, TG_MEM_DEVICE_CPU, cpu);
}

static uint64_t sum_parts(const tg_memory_estimate *e) {
    uint64_t s = 0;
    for (int k = 0; k < TG_MEM_PART_COUNT; k++) s += e->part[k];
    return s;
}

TG_TEST(test_memory_estimate_parts_add_up) {
    tg_plan p;
    if (!tg_test_compile_sized("tiny-bert", TG_TASK_CLASSIFY, 4, 32, 1, TG_PREC_BF16, &p)) return;
    tg_memory_estimate gpu, cpu;
    estimate_both(&p, &gpu, &cpu);
    const uint64_t inputs = p.pool_bytes[TG_POOL_INPUTS];
    CHECK(gpu.total == sum_parts(&gpu) && cpu.total == sum_parts(&cpu), "totals %llu, %llu are not the sums",
          (unsigned long long)gpu.total, (unsigned long long)cpu.total);
    CHECK(gpu.part[TG_MEM_POOLS] == p.peak_bytes && cpu.part[TG_MEM_POOLS] == p.peak_bytes, "pools part");
    CHECK(gpu.part[TG_MEM_GEMM_WORKSPACE] == TG_MEM_GEMM_WORKSPACE_BYTES, "cuBLASLt workspace part");
    CHECK(gpu.part[TG_MEM_BATCH_STAGING] == 2 * ((inputs + 255) / 256 * 256) + 256, "device staging %llu for inputs %llu",
          (unsigned long long)gpu.part[TG_MEM_BATCH_STAGING], (unsigned long long)inputs);
    CHECK(gpu.part[TG_MEM_REDUCE_SCRATCH] == tg_reduce_scratch_bound_floats(&p) * 4 &&
              gpu.part[TG_MEM_REDUCE_SCRATCH] >= TG_MEM_REDUCE_SCRATCH_MIN_FLOATS * 4,
          "reduction scratch part %llu", (unsigned long long)gpu.part[TG_MEM_REDUCE_SCRATCH]);
    CHECK(gpu.part[TG_MEM_CUDA_CONTEXT] == TG_MEM_CUDA_CONTEXT_BYTES &&
              gpu.part[TG_MEM_CUDA_KERNELS] == TG_MEM_CUDA_KERNELS_BYTES,
          "CUDA context and kernels");
    CHECK(gpu.part[TG_MEM_NCCL] == 0 && gpu.part[TG_MEM_WEIGHTS_UPLOAD] == 0, "parts that do not apply to one GPU");
    CHECK(cpu.part[TG_MEM_BATCH_STAGING] == TG_MEM_CPU_STAGING_BUFFERS * inputs, "host staging");
    /* Exactly the host image: test_memory_estimate_weights_upload_is_the_host_image. */
    CHECK(cpu.part[TG_MEM_WEIGHTS_UPLOAD] >= p.pool_bytes[TG_POOL_PARAMS] + p.pool_bytes[TG_POOL_PARAMS_BF16] &&
              p.pool_bytes[TG_POOL_PARAMS_BF16] > 0,
          "weights upload (fp32 and bf16 copies)");
    for (int k = TG_MEM_GEMM_WORKSPACE; k <= TG_MEM_CUDA_KERNELS; k++)
        if (k != TG_MEM_BATCH_STAGING) CHECK(cpu.part[k] == 0, "CPU part %s is %llu", tg_mem_part_key(k),
                                             (unsigned long long)cpu.part[k]);
    /* The text form lists the nonzero parts in order, leaving out the one asked. */
    char text[512];
    tg_memory_estimate_parts(&gpu, TG_MEM_CUDA_CONTEXT, text, sizeof text);
    CHECK(!strncmp(text, "pools ", 6) && strstr(text, " + cuBLASLt workspace 32.0 MiB + ") && !strstr(text, "context") &&
              !strstr(text, "NCCL"),
          "parts: %s", text);
    tg_plan_free(&p);

    /* Data parallel: NCCL's buffers on each GPU. */
    if (!tg_test_compile_sized("tiny-bert", TG_TASK_CLASSIFY, 4, 32, 2, TG_PREC_FP32, &p)) return;
    tg_estimate_memory(&p, TG_MEM_DEVICE_CUDA, &gpu);
    CHECK(gpu.part[TG_MEM_NCCL] == TG_MEM_NCCL_BYTES && gpu.total == sum_parts(&gpu), "NCCL part with 2 replicas");
    tg_plan_free(&p);
}

/* The CPU estimate's weights upload is the host image the trainer fills while it opens: the
 * params pool in fp32 (and the bf16 copies of bf16 plans) and every frozen parameter and
 * buffer in fp32 or int32, so a freeze moves bytes from the one part of the image to the
 * other without shrinking it. */
TG_TEST(test_memory_estimate_weights_upload_is_the_host_image) {
    tg_model_config cfg;
    tg_err err;
    REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
    for (int frozen = 0; frozen < 2; frozen++)
        for (int precision = TG_PREC_FP32; precision <= TG_PREC_BF16; precision++) {
            tg_job job;
            tg_job_defaults(&job);
            snprintf(job.model, sizeof job.model, "tiny-bert");
            job.batch = 2, job.seq = 16, job.steps = 1, job.precision = precision;
            if (frozen) snprintf(job.freeze, sizeof job.freeze, "bert.embeddings.*, bert.encoder.layer.0.*");
            tg_plan p;
            if (!CHECK(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg)) return;
            tg_weights_image img;
            if (!CHECK(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg)) {
                tg_plan_free(&p);
                return;
            }
            tg_memory_estimate cpu;
            tg_estimate_memory(&p, TG_MEM_DEVICE_CPU, &cpu);
            const uint64_t want = p.pool_bytes[TG_POOL_PARAMS] + p.pool_bytes[TG_POOL_PARAMS_BF16] + img.fixed_bytes;
            CHECK(cpu.part[TG_MEM_WEIGHTS_UPLOAD] == want && img.fixed_bytes > 0 &&
                      (!frozen || p.pool_bytes[TG_POOL_FROZEN] > 0),
                  "%s%s: weights upload %llu, the host image %llu (fixed part %llu)", tg_precision_name(precision),
                  frozen ? " with a freeze" : "", (unsigned long long)cpu.part[TG_MEM_WEIGHTS_UPLOAD],
                  (unsigned long long)want, (unsigned long long)img.fixed_bytes);
            tg_weights_image_free(&img);
            tg_plan_free(&p);
        }
}

TG_TEST(test_memory_estimate_scales_with_plan) {
    /* Four times the rows: the pools, the staging and the scratch bound grow, and the
     * constant parts stay. */
    tg_plan small, big;
    if (!tg_test_compile_sized("tiny-gpt2", TG_TASK_LM, 2, 32, 1, TG_PREC_FP32, &small)) return;
    if (!tg_test_compile_sized("tiny-gpt2", TG_TASK_LM, 8, 32, 1, TG_PREC_FP32, &big)) {
        tg_plan_free(&small);
        return;
    }
    tg_memory_estimate gs, gb, cs, cb;
    estimate_both(&small, &gs, &cs);
    estimate_both(&big, &gb, &cb);
    CHECK(gb.part[TG_MEM_POOLS] > gs.part[TG_MEM_POOLS] && gb.total > gs.total && cb.total > cs.total,
          "totals did not grow: GPU %llu -> %llu, CPU %llu -> %llu", (unsigned long long)gs.total,
          (unsigned long long)gb.total, (unsigned long long)cs.total, (unsigned long long)cb.total);
    CHECK(cb.part[TG_MEM_BATCH_STAGING] == 4 * cs.part[TG_MEM_BATCH_STAGING], "host staging %llu -> %llu",
          (unsigned long long)cs.part[TG_MEM_BATCH_STAGING], (unsigned long long)cb.part[TG_MEM_BATCH_STAGING]);
    CHECK(gb.part[TG_MEM_BATCH_STAGING] > 3 * gs.part[TG_MEM_BATCH_STAGING] - 1024, "device staging %llu -> %llu",
          (unsigned long long)gs.part[TG_MEM_BATCH_STAGING], (unsigned long long)gb.part[TG_MEM_BATCH_STAGING]);
    CHECK(gb.part[TG_MEM_REDUCE_SCRATCH] >= gs.part[TG_MEM_REDUCE_SCRATCH], "scratch bound shrank");
    CHECK(gb.total - gb.part[TG_MEM_POOLS] - gb.part[TG_MEM_BATCH_STAGING] - gb.part[TG_MEM_REDUCE_SCRATCH] ==
              gs.total - gs.part[TG_MEM_POOLS] - gs.part[TG_MEM_BATCH_STAGING] - gs.part[TG_MEM_REDUCE_SCRATCH],
          "constant parts changed");
    CHECK(cb.part[TG_MEM_WEIGHTS_UPLOAD] == cs.part[TG_MEM_WEIGHTS_UPLOAD], "the weights do not depend on the batch");
    tg_plan_free(&small);
    tg_plan_free(&big);

    /* The scratch bound follows the widest reduction: the LM head's cross entropy and the
     * LayerNorm backwards over B*T rows grow with the rows. */
    if (!tg_test_compile_sized("bert-base-uncased", TG_TASK_CLASSIFY, 64, 512, 1, TG_PREC_FP32, &big)) return;
    const uint64_t floats = tg_reduce_scratch_bound_floats(&big);
    /* LayerNorm backward over 64*512 rows of 768: 4 floats per 128-row chunk and column. */
    CHECK(floats >= 4ull * (64 * 512 / 128) * 768, "scratch bound %llu floats", (unsigned long long)floats);
    tg_plan_free(&big);
}

/* inspect prints the estimate: a line per device after the pools, and in JSON a
 * "memory_estimate" object with every part. */
TG_TEST(test_inspect_memory_estimate) {
    tg_plan p;
    if (!tg_test_compile_sized("tiny-bert", TG_TASK_CLASSIFY, 16, 48, 1, TG_PREC_FP32, &p)) return;
    tg_memory_estimate gpu, cpu;
    estimate_both(&p, &gpu, &cpu);
    for (int json = 0; json < 2; json++) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        REQUIRE(f, "open_memstream");
        tg_err err;
        int rc = tg_plan_inspect(&p, f, json, &err);
        fclose(f);
        if (!CHECK(rc == 0 && text, "inspect failed")) {
            free(text);
            break;
        }
        if (!json) {
            char want_gpu[600], want_cpu[600], total[32], parts[512];
            snprintf(want_gpu, sizeof want_gpu, "\nmemory estimate, GPU: %s (%s)\n",
                     tg_mem_format_bytes(gpu.total, total, sizeof total),
                     tg_memory_estimate_parts(&gpu, -1, parts, sizeof parts));
            snprintf(want_cpu, sizeof want_cpu, "memory estimate, CPU: %s (%s)\nactivation live peak",
                     tg_mem_format_bytes(cpu.total, total, sizeof total),
                     tg_memory_estimate_parts(&cpu, -1, parts, sizeof parts));
            const char *peak = strstr(text, "\npeak: "), *g = strstr(text, want_gpu), *c = strstr(text, want_cpu);
            CHECK(peak && g && c && peak < g && g < c, "text lacks, or misplaces:\n%s%s", want_gpu, want_cpu);
        } else {
            json_error_t je;
            json_t *root = json_loads(text, 0, &je), *m = json_object_get(root, "memory_estimate");
            json_t *jg = json_object_get(m, "cuda"), *jc = json_object_get(m, "cpu");
            CHECK(json_integer_value(json_object_get(jg, "total_bytes")) == (json_int_t)gpu.total &&
                      json_integer_value(json_object_get(jc, "total_bytes")) == (json_int_t)cpu.total,
                  "memory_estimate totals");
            for (int k = 0; k < TG_MEM_PART_COUNT; k++)
                CHECK(json_integer_value(json_object_get(json_object_get(jg, "parts"), tg_mem_part_key(k))) ==
                              (json_int_t)gpu.part[k] &&
                          json_integer_value(json_object_get(json_object_get(jc, "parts"), tg_mem_part_key(k))) ==
                              (json_int_t)cpu.part[k],
                      "memory_estimate part %s", tg_mem_part_key(k));
            json_decref(root);
        }
        free(text);
    }
    tg_plan_free(&p);
}

/* A plan whose pools are far past any machine's memory: tiny, but claiming 2^60 bytes
 * of activations (never allocated: the preflight refuses first). */
static int huge_plan(tg_plan *p) {
    if (!tg_test_compile_sized("tiny-bert", TG_TASK_CLASSIFY, 2, 16, 1, TG_PREC_FP32, p)) return 0;
    p->pool_bytes[TG_POOL_ACTIVATIONS] = 1ull << 60;
    p->peak_bytes = 0;
    for (int q = 0; q < TG_POOL_COUNT; q++) p->peak_bytes += p->pool_bytes[q];
    return 1;
}

TG_TEST(test_preflight_refuses_before_allocating) {
    tg_plan p;
    if (!huge_plan(&p)) return;
    tg_err err = {{0}};
    tg_memory_probe probe;
    REQUIRE(getenv("TUNEGRAPH_PREFLIGHT") == NULL, "TUNEGRAPH_PREFLIGHT is set in the environment");
    CHECK(tg_preflight(&p, TG_DEVICE_CPU, 0, &probe, &err) == -1, "a plan of 2^60 bytes passed the preflight");
    CHECK(strstr(err.msg, "needs 1073741824.") && strstr(err.msg, "GiB available (MemAvailable)") &&
              strstr(err.msg, "on the CPU") && strstr(err.msg, "It needs pools ") &&
              strstr(err.msg, "TUNEGRAPH_PREFLIGHT=0"),
          "message: %s", err.msg);
    /* tg_trainer_open refuses with the same message, having opened no executor. */
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .load_data = 0};
    tg_err err2 = {{0}};
    CHECK(tg_trainer_open(&tr, &p, &o, &err2) == -1 && tr.ex.vt == NULL && tr.staging[0] == NULL,
          "the trainer opened or allocated");
    CHECK(!strcmp(err.msg, err2.msg), "trainer message: %s", err2.msg);
    /* TUNEGRAPH_PREFLIGHT=0 skips the check (the probe still starts). */
    setenv("TUNEGRAPH_PREFLIGHT", "0", 1);
    CHECK(tg_preflight(&p, TG_DEVICE_CPU, 0, &probe, &err) == 0, "TUNEGRAPH_PREFLIGHT=0 still refused: %s", err.msg);
    unsetenv("TUNEGRAPH_PREFLIGHT");
    tg_plan_free(&p);

    /* A plan that fits passes, and its probe measures. */
    if (!tg_test_compile_sized("tiny-bert", TG_TASK_CLASSIFY, 2, 16, 1, TG_PREC_FP32, &p)) return;
    CHECK(tg_preflight(&p, TG_DEVICE_CPU, 0, &probe, &err) == 0, "%s", err.msg);
    CHECK(probe.started && tg_memory_probe_peak(&probe) >= 0, "the CPU probe did not start");
    tg_plan_free(&p);
}

TG_TEST(test_device_free_memory_cpu) {
    uint64_t free_bytes = 0;
    char source[64];
    tg_err err;
    REQUIRE(tg_device_free_memory(TG_DEVICE_CPU, 0, &free_bytes, source, sizeof source, &err) == 0, "%s", err.msg);
    CHECK(free_bytes > (16ull << 20) && free_bytes < (1ull << 50), "MemAvailable %llu bytes",
          (unsigned long long)free_bytes);
    CHECK(strstr(source, "MemAvailable") != NULL, "source %s", source);
}

TG_TEST(test_mem_format_bytes) {
    char b[32];
    CHECK(!strcmp(tg_mem_format_bytes(260, b, sizeof b), "260 B"), "%s", b);
    CHECK(!strcmp(tg_mem_format_bytes(12352, b, sizeof b), "12.1 KiB"), "%s", b);
    CHECK(!strcmp(tg_mem_format_bytes(32u << 20, b, sizeof b), "32.0 MiB"), "%s", b);
    CHECK(!strcmp(tg_mem_format_bytes((uint64_t)(41.2 * (1ull << 30)), b, sizeof b), "41.2 GiB"), "%s", b);
}

/* ---- through the CLI --------------------------------------------------------------- */

/* Runs a shell command; its exit status (-1 when it did not exit). */
static int run_status(const char *cmd) {
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* bert-large-uncased at batch 4096 x seq 512: a plan of about 3 TiB. Compiling it is
 * quick (tens of ms) and small; `run` must refuse it before allocating anything. */
TG_TEST(test_cli_run_refuses_plan_that_cannot_fit) {
    const char *dir = tg_test_tmpdir();
    char job[600], plan[600], cmd[2400], path[700];
    snprintf(job, sizeof job, "%s/big.job", dir);
    snprintf(plan, sizeof plan, "%s/big.tgp", dir);
    char *cwd = realpath(".", NULL);
    REQUIRE(cwd, "no working directory");
    char text[1200];
    snprintf(text, sizeof text,
             "model = bert-large-uncased\ntask = classify\nnum_labels = 2\nbatch = 4096\nseq = 512\nsteps = 1\n"
             "train_data = %s/examples/data/sentiment-train.jsonl\n",
             cwd);
    free(cwd);
    REQUIRE(tg_test_write_file(job, text) == 0, "cannot write %s", job);
    /* The estimate, as inspect shows it, is far past any test machine's memory. */
    snprintf(cmd, sizeof cmd, "%s compile %s -o %s >/dev/null && %s inspect %s --json > %s/big.json", tg_test_cli(), job,
             plan, tg_test_cli(), plan, dir);
    REQUIRE(run_status(cmd) == 0, "compile or inspect failed: %s", cmd);
    snprintf(path, sizeof path, "%s/big.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    REQUIRE(root, "inspect --json: %s", je.text);
    json_t *cpu = json_object_get(json_object_get(root, "memory_estimate"), "cpu");
    double need = json_number_value(json_object_get(cpu, "total_bytes"));
    CHECK(need > 1024.0 * (1ull << 30), "the estimate is only %.0f bytes", need);
    json_decref(root);

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    snprintf(cmd, sizeof cmd, "%s run %s --device cpu 2>%s/stderr.txt", tg_test_cli(), job, dir);
    int rc = run_status(cmd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    char *err = tg_test_read_file(path, NULL);
    printf("    %s", err ? err : "(no stderr)\n");
    CHECK(rc == 1, "exit status %d", rc);
    char want[160], need_s[32];
    snprintf(want, sizeof want, "tunegraph: not enough memory for this plan on the CPU: needs %s, ",
             tg_mem_format_bytes((uint64_t)need, need_s, sizeof need_s));
    CHECK(err && !strncmp(err, want, strlen(want)) && strstr(err, " GiB available (MemAvailable). It needs pools ") &&
              strstr(err, " + batch staging ") && strstr(err, " + weights upload "),
          "stderr: %s (expected it to start: %s)", err ? err : "(none)", want);
    CHECK(err && !strstr(err, "examples"), "the run got past the preflight: %s", err ? err : "");
    CHECK(s < 5, "refusing took %.1f s", s);
    free(err);
}

/* The summary reports the measured peak beside the planned one; on the CPU the growth of
 * the resident set, which the pools (touched by every step) dominate at this size. */
TG_TEST(test_cli_run_reports_measured_peak_cpu) {
    const char *dir = tg_test_tmpdir();
    char cmd[1200], path[700];
    snprintf(cmd, sizeof cmd,
             "%s run examples/demo-classify.job --device cpu --set batch=128 --set seq=64 --set steps=2 "
             "--metrics %s/m.jsonl 2>%s/stderr.txt",
             tg_test_cli(), dir, dir);
    REQUIRE(run_status(cmd) == 0, "run failed: %s", cmd);
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *text = tg_test_read_file(path, NULL);
    REQUIRE(text, "no metrics");
    const char *last = strstr(text, "{\"summary\"");
    json_error_t je;
    json_t *o = last ? json_loads(last, JSON_DISABLE_EOF_CHECK, &je) : NULL;
    free(text);
    REQUIRE(o, "no summary line");
    double planned = json_number_value(json_object_get(o, "planned_peak_bytes"));
    double estimate = json_number_value(json_object_get(o, "memory_estimate_bytes"));
    double measured = json_number_value(json_object_get(o, "measured_peak_bytes"));
    printf("    planned %.1f MiB, estimate %.1f MiB, measured %.1f MiB\n", planned / 1048576, estimate / 1048576,
           measured / 1048576);
    CHECK(json_is_integer(json_object_get(o, "measured_peak_bytes")), "measured_peak_bytes missing");
    CHECK(planned > 16.0 * 1048576 && estimate >= planned, "planned %.0f, estimate %.0f", planned, estimate);
    /* At least the pools (every page of them is written) and the staging; at most the
     * estimate plus what the run holds besides (datasets, threads, allocator slack). Under
     * AddressSanitizer (make test-asan) the CLI's heap carries redzones and a quarantine of
     * freed blocks, which the resident set counts too. */
#if defined(__SANITIZE_ADDRESS__)
    const double besides = 256.0 * 1048576;
#else
    const double besides = 64.0 * 1048576;
#endif
    CHECK(measured >= 0.9 * planned && measured <= estimate + besides, "measured %.0f for planned %.0f", measured,
          planned);
    json_decref(o);
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    text = tg_test_read_file(path, NULL);
    CHECK(text && strstr(text, "peak memory on the CPU: measured ") && strstr(text, "(resident set growth), planned "),
          "stderr: %s", text ? text : "(none)");
    free(text);
}
