/* The memory preflight and the peak probe (runtime/preflight.c): reading "Key: N kB"
 * lines of /proc files (a table of fake files), the refusal of a plan that cannot fit on
 * the CPU with its numbers, TUNEGRAPH_PREFLIGHT, what a CPU-only build does with CUDA,
 * and the probe's samples and peaks on either device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "runtime/preflight.h"
#include "runtime/executor.h"
#include "tests/harness.h"

TG_TEST(test_preflight_proc_kib_table) {
    static const struct {
        const char *text;   /* NULL: no such file */
        const char *key;
        int rc;
        uint64_t bytes;     /* when rc is 0 */
    } cases[] = {
        {"MemTotal:  100 kB\nMemAvailable:   2048 kB\n", "MemAvailable", 0, 2048ull * 1024},
        {"MemAvailable:0 kB\n", "MemAvailable", 0, 0},
        {"VmRSS:\t  12 kB\n", "VmRSS", 0, 12 * 1024},
        /* A longer key sharing the prefix is another line. */
        {"MemAvailableX: 5 kB\nMemAvailable: 7 kB\n", "MemAvailable", 0, 7 * 1024},
        {"MemAvail: 3 kB\n", "MemAvailable", -1, 0},
        {"MemAvailable 3 kB\n", "MemAvailable", -1, 0},
        {"", "MemAvailable", -1, 0},
        /* The first line for the key decides: no number there is a miss. */
        {"MemAvailable: kB\nMemAvailable: 5 kB\n", "MemAvailable", -1, 0},
        {"MemAvailable: 99999999999999999999999 kB\n", "MemAvailable", -1, 0},
        {NULL, "MemAvailable", -1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/proc%zu", tg_test_tmpdir(), i);
        if (cases[i].text) REQUIRE(tg_test_write_file(path, cases[i].text) == 0, "write %s", path);
        uint64_t bytes = 42;
        const int rc = tg_proc_kib(path, cases[i].key, &bytes);
        CHECK(rc == cases[i].rc, "case %zu: rc %d, want %d", i, rc, cases[i].rc);
        const uint64_t want = cases[i].rc ? 42 : cases[i].bytes;
        CHECK(bytes == want, "case %zu: %llu bytes, want %llu", i, (unsigned long long)bytes, (unsigned long long)want);
    }
}

TG_TEST(test_preflight_device_free_memory) {
    uint64_t bytes = 7, avail = 0;
    char source[64] = "unchanged";
    tg_err err = {{0}};
    /* A CPU-only build has no GPU to ask (a CUDA build's answer is the GPU suite's). */
    if (!tg_cuda_built()) {
        CHECK(tg_device_free_memory(TG_DEVICE_CUDA, 0, &bytes, source, sizeof source, &err) == -1, "CUDA answered");
        CHECK(strstr(err.msg, "this build has no CUDA executor") != NULL, "message: %s", err.msg);
        CHECK(strcmp(source, "unchanged") == 0, "source: %s", source);
    }
    REQUIRE(tg_device_free_memory(TG_DEVICE_CPU, 0, &bytes, source, sizeof source, &err) == 0, "%s", err.msg);
    CHECK(strcmp(source, "available (MemAvailable)") == 0, "source: %s", source);
    REQUIRE(tg_proc_kib("/proc/meminfo", "MemAvailable", &avail) == 0, "MemAvailable");
    /* The same reading, give or take what the system did in between. */
    const double ratio = (double)bytes / (double)avail;
    CHECK(bytes > 0 && ratio > 0.5 && ratio < 2, "free %llu, MemAvailable %llu", (unsigned long long)bytes,
          (unsigned long long)avail);
}

/* Runs the preflight with TUNEGRAPH_PREFLIGHT set to `env` (NULL: unset). */
static int preflight_with(const char *env, const tg_plan *plan, tg_device device, tg_memory_probe *probe, tg_err *err) {
    const char *old = getenv("TUNEGRAPH_PREFLIGHT");
    char *saved = old ? strdup(old) : NULL;
    if (env) setenv("TUNEGRAPH_PREFLIGHT", env, 1);
    else unsetenv("TUNEGRAPH_PREFLIGHT");
    const int rc = tg_preflight(plan, device, 0, probe, err);
    if (saved) setenv("TUNEGRAPH_PREFLIGHT", saved, 1), free(saved);
    else unsetenv("TUNEGRAPH_PREFLIGHT");
    return rc;
}

TG_TEST(test_preflight_refuses_and_probes) {
    tg_plan plan;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan)) return;
    tg_memory_probe probe;
    tg_err err = {{0}};
    CHECK(preflight_with(NULL, &plan, TG_DEVICE_CPU, &probe, &err) == 0, "the tiny plan refused: %s", err.msg);
    CHECK(probe.started == 1 && probe.baseline > 0 && probe.high_rss == probe.baseline && probe.device == TG_DEVICE_CPU,
          "probe: started %d, baseline %llu, high %llu", probe.started, (unsigned long long)probe.baseline,
          (unsigned long long)probe.high_rss);

    /* Pools of a petabyte: refused, naming what it needs and what there is. */
    const uint64_t real_peak = plan.peak_bytes;
    plan.peak_bytes = 1ull << 50;
    tg_memory_estimate est;
    tg_estimate_memory(&plan, TG_DEVICE_CPU, &est);
    char need[32], want[256];
    snprintf(want, sizeof want, "not enough memory for this plan on the CPU: needs %s, ",
             tg_mem_format_bytes(est.total, need, sizeof need));
    static const char *const refusing[] = {NULL, "1", "yes"};
    for (int i = 0; i < 3; i++) {
        memset(&err, 0, sizeof err);
        CHECK(preflight_with(refusing[i], &plan, TG_DEVICE_CPU, &probe, &err) == -1, "TUNEGRAPH_PREFLIGHT=%s: fits",
              refusing[i] ? refusing[i] : "(unset)");
        CHECK(strstr(err.msg, want) && strstr(err.msg, " available (MemAvailable). It needs pools ") &&
                  strstr(err.msg, "set TUNEGRAPH_PREFLIGHT=0 to skip this check") && !strstr(err.msg, "CUDA context"),
              "TUNEGRAPH_PREFLIGHT=%s: %s", refusing[i] ? refusing[i] : "(unset)", err.msg);
    }
    memset(&err, 0, sizeof err);
    CHECK(preflight_with("0", &plan, TG_DEVICE_CPU, &probe, &err) == 0 && !err.msg[0], "TUNEGRAPH_PREFLIGHT=0: %s",
          err.msg);
    CHECK(probe.started == 1, "the probe starts with the check off too");
    /* A CPU-only build leaves CUDA to tg_executor_open: no check, and no probe. */
    if (!tg_cuda_built()) {
        CHECK(preflight_with(NULL, &plan, TG_DEVICE_CUDA, &probe, &err) == 0, "CUDA refused: %s", err.msg);
        CHECK(probe.started == 0 && probe.device == TG_DEVICE_CUDA && tg_memory_probe_peak(&probe) == -1,
              "CUDA probe: started %d", probe.started);
    }
    plan.peak_bytes = real_peak;
    tg_plan_free(&plan);
}

TG_TEST(test_preflight_probe_samples) {
    /* Not started: nothing is sampled, and no peak. */
    tg_memory_probe p = {.device = TG_DEVICE_CPU, .high_rss = 5};
    tg_memory_probe_sample(&p);
    CHECK(p.high_rss == 5 && tg_memory_probe_peak(&p) == -1, "unstarted probe: high %llu", (unsigned long long)p.high_rss);
    /* Without the high-water mark reset: samples read VmRSS and keep the most. */
    uint64_t rss = 0;
    REQUIRE(tg_proc_kib("/proc/self/status", "VmRSS", &rss) == 0 && rss > 0, "VmRSS");
    p = (tg_memory_probe){.device = TG_DEVICE_CPU, .started = 1, .hwm_reset = 0, .baseline = 4096, .high_rss = 4096};
    tg_memory_probe_sample(&p);
    CHECK(p.high_rss >= rss / 2 && p.high_rss <= rss * 2, "VmRSS sample %llu, VmRSS %llu", (unsigned long long)p.high_rss,
          (unsigned long long)rss);
    const uint64_t high = p.high_rss;
    CHECK(tg_memory_probe_peak(&p) >= (int64_t)(high - 4096), "peak %lld", (long long)tg_memory_probe_peak(&p));
    /* A reading below the most seen keeps the most. */
    p.high_rss = UINT64_MAX / 2;
    tg_memory_probe_sample(&p);
    CHECK(p.high_rss == UINT64_MAX / 2, "the most seen lowered to %llu", (unsigned long long)p.high_rss);
    /* With the reset: VmHWM, at least VmRSS. */
    p = (tg_memory_probe){.device = TG_DEVICE_CPU, .started = 1, .hwm_reset = 1, .baseline = 0, .high_rss = 0};
    tg_memory_probe_sample(&p);
    uint64_t hwm = 0;
    REQUIRE(tg_proc_kib("/proc/self/status", "VmHWM", &hwm) == 0, "VmHWM");
    CHECK(p.high_rss > 0 && p.high_rss <= hwm, "VmHWM sample %llu, VmHWM %llu", (unsigned long long)p.high_rss,
          (unsigned long long)hwm);
    /* CUDA in a CPU-only build: the GPU cannot be read, the least free stays, and the peak
     * is the baseline less the least free seen. */
    p = (tg_memory_probe){.device = TG_DEVICE_CUDA, .started = 1, .baseline = 1000, .low_free = 400};
    tg_memory_probe_sample(&p);
    CHECK(p.low_free == 400, "low free %llu", (unsigned long long)p.low_free);
    CHECK(tg_memory_probe_peak(&p) == 600, "CUDA peak %lld, want 600", (long long)tg_memory_probe_peak(&p));
}

/* /proc/self/status cannot be opened (no descriptor left under RLIMIT_NOFILE): the sample
 * keeps the most seen, and the next one that can read it takes the reading. */
TG_TEST(test_preflight_probe_sample_unreadable_status) {
    struct rlimit was;
    REQUIRE(getrlimit(RLIMIT_NOFILE, &was) == 0, "getrlimit");
    const int lowest = dup(0); /* the lowest free descriptor */
    REQUIRE(lowest >= 0, "dup");
    close(lowest);
    tg_memory_probe p = {.device = TG_DEVICE_CPU, .started = 1, .baseline = 0, .high_rss = 1};
    struct rlimit none = {(rlim_t)lowest, was.rlim_max};
    REQUIRE(setrlimit(RLIMIT_NOFILE, &none) == 0, "setrlimit %d", lowest);
    FILE *f = fopen("/proc/self/status", "r"); /* the probe's own open, refused */
    const int refused = f == NULL;
    if (f) fclose(f);
    tg_memory_probe_sample(&p);
    const uint64_t kept = p.high_rss;
    REQUIRE(setrlimit(RLIMIT_NOFILE, &was) == 0, "setrlimit back");
    CHECK(refused && kept == 1, "without a descriptor: open %s, the most seen became %llu",
          refused ? "refused" : "allowed", (unsigned long long)kept);
    tg_memory_probe_sample(&p);
    CHECK(p.high_rss > 1, "with descriptors again: %llu", (unsigned long long)p.high_rss);
}
