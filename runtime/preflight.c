/* The memory preflight and the measured peak (runtime/preflight.h). */
#include "runtime/preflight.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert((int)TG_MEM_DEVICE_CPU == (int)TG_DEVICE_CPU && (int)TG_MEM_DEVICE_CUDA == (int)TG_DEVICE_CUDA,
               "tg_mem_device follows tg_device");

int tg_proc_kib(const char *path, const char *key, uint64_t *bytes) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    const size_t klen = strlen(key);
    int rc = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) || line[klen] != ':') continue;
        char *end;
        errno = 0;
        unsigned long long kib = strtoull(line + klen + 1, &end, 10);
        if (!errno && end != line + klen + 1) *bytes = (uint64_t)kib * 1024, rc = 0;
        break;
    }
    fclose(f);
    return rc;
}

int tg_device_free_memory(tg_device device, int gpu, uint64_t *free_bytes, char *source, int source_len,
                          tg_err *err) {
    if (device == TG_DEVICE_CUDA) {
        uint64_t total;
        if (tg_cuda_memory_info(gpu, free_bytes, &total, err)) return -1; /* GCOVR_EXCL_BR_LINE: succeeds only in a GPU build (cuda_absent.c fails it) */
        snprintf(source, (size_t)source_len, "free on GPU %d", gpu);
        return 0;
    }
    /* MemAvailable is in /proc/meminfo on every kernel since 3.14 (tg_proc_kib's misses are tested). */
    if (tg_proc_kib("/proc/meminfo", "MemAvailable", free_bytes)) /* GCOVR_EXCL_BR_LINE: always there on Linux >= 3.14 */
        return tg_fail(err, "cannot read MemAvailable from /proc/meminfo");
    snprintf(source, (size_t)source_len, "available (MemAvailable)");
    return 0;
}

static int preflight_on(void) {
    const char *env = getenv("TUNEGRAPH_PREFLIGHT");
    return !env || strcmp(env, "0");
}

/* Resets the process's resident high-water mark (VmHWM) to the current resident set. */
static int reset_high_water_mark(void) {
    /* Writable by the process itself since Linux 4.0; some sandboxes refuse it, and the
     * probe then samples VmRSS (tested by clearing hwm_reset). */
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1; /* GCOVR_EXCL_BR_LINE: the kernel's, not reachable from a test */
    int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1; /* GCOVR_EXCL_BR_LINE: the kernel's, as above */
}

static void probe_start(tg_memory_probe *probe, tg_device device, int gpu) {
    memset(probe, 0, sizeof *probe);
    probe->device = device, probe->gpu = gpu;
    if (device == TG_DEVICE_CPU) {
        probe->hwm_reset = reset_high_water_mark() == 0;
        probe->started = tg_proc_kib("/proc/self/status", "VmRSS", &probe->baseline) == 0;
        probe->high_rss = probe->baseline;
    }
}

int tg_preflight(const tg_plan *plan, tg_device device, int gpu, tg_memory_probe *probe, tg_err *err) {
    probe_start(probe, device, gpu);
    /* The CUDA branches below are taken only in a GPU build, where tests/gpu/ runs them. */
    if (device == TG_DEVICE_CUDA && !tg_cuda_built()) return 0; /* GCOVR_EXCL_BR_LINE: tg_cuda_built() is 0 here; tg_executor_open says so */
    uint64_t free_bytes;
    char source[64];
    tg_err ignored;
    /* GCOVR_EXCL_BR_START: on the CPU free memory fails only without MemAvailable (above); the rest is CUDA's */
    if (tg_device_free_memory(device, gpu, &free_bytes, source, sizeof source, &ignored)) return 0;
    if (device == TG_DEVICE_CUDA) probe->baseline = probe->low_free = free_bytes, probe->started = 1;
    /* GCOVR_EXCL_BR_STOP */
    if (!preflight_on()) return 0;
    tg_memory_estimate est;
    tg_estimate_memory(plan, device, &est);
    /* On CUDA the context is in place already: free memory no longer includes it. */
    /* GCOVR_EXCL_BR_START: device is CUDA only in a GPU build (returned above otherwise) */
    const int in_place = device == TG_DEVICE_CUDA ? TG_MEM_CUDA_CONTEXT : -1;
    const uint64_t needs = est.total - (in_place >= 0 ? est.part[in_place] : 0);
    /* GCOVR_EXCL_BR_STOP */
    if (needs <= free_bytes) return 0;
    char need_s[32], free_s[32], parts[512];
    /* GCOVR_EXCL_BR_START: the CUDA wording is a GPU build's (device is CPU here) */
    return tg_fail(err,
                   "not enough memory for this plan%s: needs %s, %s %s. It needs %s%s. Lower batch or seq, or set "
                   "TUNEGRAPH_PREFLIGHT=0 to skip this check",
                   device == TG_DEVICE_CUDA ? "" : " on the CPU", tg_mem_format_bytes(needs, need_s, sizeof need_s),
                   tg_mem_format_bytes(free_bytes, free_s, sizeof free_s), source,
                   tg_memory_estimate_parts(&est, in_place, parts, sizeof parts),
                   in_place >= 0 ? " (the CUDA context is in place already)" : "");
    /* GCOVR_EXCL_BR_STOP */
}

void tg_memory_probe_sample(tg_memory_probe *probe) {
    if (!probe->started) return;
    if (probe->device == TG_DEVICE_CUDA) {
        uint64_t free_bytes, total;
        tg_err ignored;
        /* GCOVR_EXCL_BR_START: tg_cuda_memory_info succeeds only in a GPU build */
        if (tg_cuda_memory_info(probe->gpu, &free_bytes, &total, &ignored) == 0 &&
            free_bytes < probe->low_free)
            probe->low_free = free_bytes;
        /* GCOVR_EXCL_BR_STOP */
        return;
    }
    uint64_t rss;
    /* The high-water mark, once reset, also holds the peaks between samples. */
    if (tg_proc_kib("/proc/self/status", probe->hwm_reset ? "VmHWM" : "VmRSS", &rss) == 0 && rss > probe->high_rss)
        probe->high_rss = rss;
}

int64_t tg_memory_probe_peak(tg_memory_probe *probe) {
    if (!probe->started) return -1;
    tg_memory_probe_sample(probe);
    if (probe->device == TG_DEVICE_CUDA) return (int64_t)(probe->baseline - probe->low_free);
    return (int64_t)(probe->high_rss - probe->baseline);
}
