/* The CPU probe's reset of the resident high-water mark (runtime/preflight.c): where the
 * kernel lets the process write /proc/self/clear_refs, tg_preflight resets VmHWM to the
 * resident set (a peak from before the run no longer shows) and the probe says so, and a
 * peak that comes and goes between two samples is then measured all the same. Where the
 * kernel refuses the write, the probe says it was not reset. Memory is mapped and unmapped
 * directly so that no allocator (nor AddressSanitizer's quarantine) keeps it resident. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "runtime/preflight.h"
#include "tests/harness.h"

#define MIB (1024ull * 1024ull)

/* Maps `bytes`, touches every page, unmaps: the resident set rises and falls back. */
static int touch_and_release(size_t bytes) {
    unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    for (size_t i = 0; i < bytes; i += 4096) p[i] = (unsigned char)(i >> 12);
    return munmap(p, bytes);
}

static uint64_t status_bytes(const char *key) {
    uint64_t v = 0;
    return tg_proc_kib("/proc/self/status", key, &v) == 0 ? v : 0;
}

/* Whether this process may reset its high-water mark (Linux >= 4.0, unless a sandbox refuses). */
static int can_reset(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return 0;
    const int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

TG_TEST(test_preflight_high_water_mark_reset) {
    tg_plan plan;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &plan)) return;
    const int resettable = can_reset();
    /* a peak 256 MiB above the resident set, gone again before the preflight */
    REQUIRE(touch_and_release(256 * MIB) == 0, "mmap");
    const uint64_t hwm_before = status_bytes("VmHWM"), rss_before = status_bytes("VmRSS");
    REQUIRE(hwm_before >= rss_before + 200 * MIB, "VmHWM %llu, VmRSS %llu", (unsigned long long)hwm_before,
            (unsigned long long)rss_before);
    tg_memory_probe probe;
    tg_err err = {{0}};
    CHECK(tg_preflight(&plan, TG_DEVICE_CPU, 0, &probe, &err) == 0, "%s", err.msg);
    const uint64_t hwm_after = status_bytes("VmHWM");
    CHECK(probe.device == TG_DEVICE_CPU && probe.gpu == 0 && probe.started == 1 && probe.high_rss == probe.baseline &&
              probe.low_free == 0,
          "probe: device %d gpu %d started %d baseline %llu high %llu low %llu", probe.device, probe.gpu, probe.started,
          (unsigned long long)probe.baseline, (unsigned long long)probe.high_rss, (unsigned long long)probe.low_free);
    if (!resettable) {
        CHECK(probe.hwm_reset == 0, "the high-water mark said reset where the kernel refuses it");
        tg_plan_free(&plan);
        return;
    }
    CHECK(probe.hwm_reset == 1, "the high-water mark was not reset (it can be here)");
    CHECK(hwm_after + 200 * MIB <= hwm_before, "VmHWM %llu before the preflight, %llu after: not reset",
          (unsigned long long)hwm_before, (unsigned long long)hwm_after);
    CHECK(probe.baseline + 100 * MIB >= rss_before && probe.baseline <= rss_before + 100 * MIB,
          "baseline %llu, VmRSS before %llu", (unsigned long long)probe.baseline, (unsigned long long)rss_before);

    /* a peak of 128 MiB between two samples: the high-water mark holds it (less what the
     * process gave back meanwhile: 114 MiB measured inside the GPU suite's process) */
    REQUIRE(touch_and_release(128 * MIB) == 0, "mmap");
    const int64_t peak = tg_memory_probe_peak(&probe);
    CHECK(peak >= (int64_t)(96 * MIB) && peak < (int64_t)(200 * MIB), "peak %lld bytes after a 128 MiB excursion",
          (long long)peak);
    tg_plan_free(&plan);
}
