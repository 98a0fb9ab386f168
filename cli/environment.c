/* environment.json of a benchmark artifact (cli/environment.h). The GPU's libraries are
 * read at run time (NVML opened with dlopen; cuBLASLt and NCCL where the process has them
 * loaded), so the CPU build needs none of them. */
#include "cli/environment.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <zstd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/json_strict.h"
#include "base/version.h"
#include "runtime/executor.h"
#include "runtime/nvml_energy.h"
#include "runtime/preflight.h"

/* What is being built, and whether an allocation failed on the way. */
typedef struct env_doc {
    json_t *root, *absent;
    int failed;
} env_doc;

static void env_absent(env_doc *d, const char *what, const char *why) {
    json_t *a = json_object();
    if (!a) {
        d->failed = 1;
        return;
    }
    tg_json_put(a, "what", json_string(what), &d->failed);
    tg_json_put(a, "why", json_string(why), &d->failed);
    tg_json_push(d->absent, a, &d->failed);
}

/* The value of the first "key<spaces>: value" line of a text file (trailing newline cut):
 * 0, or -1 when the file or the key is not there. */
static int file_field(const char *path, const char *key, char sep, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    const size_t klen = strlen(key);
    int rc = -1;
    while (rc && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen)) continue;
        const char *p = line + klen;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != sep) continue;
        p++;
        while (*p == ' ' || *p == '\t' || *p == '"') p++;
        size_t n = strcspn(p, "\n");
        while (n && p[n - 1] == '"') n--;
        snprintf(out, cap, "%.*s", (int)n, p);
        rc = 0;
    }
    fclose(f);
    return rc;
}

static void describe_host(env_doc *d) {
    json_t *host = json_object();
    if (!host) {
        d->failed = 1;
        return;
    }
    char cpu[256];
    /* x86 names its CPU "model name"; Arm kernels give "Model" or only "CPU part" codes. */
    if (!file_field("/proc/cpuinfo", "model name", ':', cpu, sizeof cpu) ||
        !file_field("/proc/cpuinfo", "Model", ':', cpu, sizeof cpu))
        tg_json_put(host, "cpu_model", json_string(cpu), &d->failed);
    else env_absent(d, "host.cpu_model", "/proc/cpuinfo names no model");
    tg_json_put(host, "cpus_online", json_integer(sysconf(_SC_NPROCESSORS_ONLN)), &d->failed);
    uint64_t total;
    if (tg_proc_kib("/proc/meminfo", "MemTotal", &total) == 0)
        tg_json_put(host, "memory_total_bytes", json_integer((json_int_t)total), &d->failed);
    else env_absent(d, "host.memory_total_bytes", "/proc/meminfo has no MemTotal");
    struct utsname u;
    if (uname(&u) == 0) {
        char kernel[sizeof u.sysname + sizeof u.release + sizeof u.version + sizeof u.machine + 4];
        snprintf(kernel, sizeof kernel, "%s %s %s %s", u.sysname, u.release, u.version, u.machine);
        tg_json_put(host, "kernel", json_string(kernel), &d->failed);
    } else {
        env_absent(d, "host.kernel", "uname failed");
    }
    char os[256];
    if (!file_field("/etc/os-release", "PRETTY_NAME", '=', os, sizeof os))
        tg_json_put(host, "os", json_string(os), &d->failed);
    else env_absent(d, "host.os", "/etc/os-release has no PRETTY_NAME");
    tg_json_put(d->root, "host", host, &d->failed);
}

static void describe_build(env_doc *d) {
    json_t *build = json_object(), *libs = json_object();
    if (!build || !libs) {
        json_decref(build), json_decref(libs);
        d->failed = 1;
        return;
    }
#if defined(__clang__)
    tg_json_put(build, "compiler", json_string("clang " __clang_version__), &d->failed);
#elif defined(__GNUC__)
    tg_json_put(build, "compiler", json_string("gcc " __VERSION__), &d->failed);
#else
    env_absent(d, "build.compiler", "built by a compiler that names no version");
#endif
    tg_json_put(build, "cuda_executor", json_boolean(tg_cuda_built()), &d->failed);
    tg_json_put(d->root, "build", build, &d->failed);
    tg_json_put(libs, "jansson", json_string(JANSSON_VERSION), &d->failed);
    tg_json_put(libs, "zstd", json_string(ZSTD_versionString()), &d->failed);
    char xxh[32];
    const unsigned x = XXH_versionNumber();
    snprintf(xxh, sizeof xxh, "%u.%u.%u", x / 10000, x / 100 % 100, x % 100);
    tg_json_put(libs, "xxhash", json_string(xxh), &d->failed);
    tg_json_put(d->root, "libraries", libs, &d->failed);
}

/* The path of a shared object the process has loaded whose name holds `part`. */
typedef struct loaded_search {
    const char *part;
    char path[1024];
} loaded_search;

static int find_loaded(struct dl_phdr_info *info, size_t size, void *arg) {
    loaded_search *s = arg;
    const char *slash = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    const char *base = slash ? slash + 1 : info->dlpi_name;
    if (!base || !strstr(base, s->part)) return 0;
    snprintf(s->path, sizeof s->path, "%s", info->dlpi_name);
    return 1;
}

/* A function of a library this process has loaded already (never loads one), or NULL. */
static void *loaded_symbol(const char *library, const char *symbol, void **handle) {
    loaded_search s = {library, ""};
    *handle = NULL;
    if (!dl_iterate_phdr(find_loaded, &s)) return NULL;
    *handle = dlopen(s.path, RTLD_LAZY | RTLD_NOLOAD);
    return *handle ? dlsym(*handle, symbol) : NULL;
}

static void describe_cuda_libraries(env_doc *d, json_t *gpu) {
    void *h;
    size_t (*lt_version)(void) = (size_t (*)(void))loaded_symbol("libcublasLt.so", "cublasLtGetVersion", &h);
    if (lt_version) {
        const size_t v = lt_version();
        char text[32];
        snprintf(text, sizeof text, "%zu.%zu.%zu", v / 10000, v / 100 % 100, v % 100);
        tg_json_put(gpu, "cublaslt", json_string(text), &d->failed);
    } else {
        env_absent(d, "gpu.cublaslt", "libcublasLt is not loaded in this process");
    }
    if (h) dlclose(h);
    int (*nccl_version)(int *) = (int (*)(int *))loaded_symbol("libnccl.so", "ncclGetVersion", &h);
    int v = 0;
    if (nccl_version && nccl_version(&v) == 0) {
        char text[32];
        /* NCCL 2.9 and later: major * 10000 + minor * 100 + patch. */
        snprintf(text, sizeof text, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
        tg_json_put(gpu, "nccl", json_string(text), &d->failed);
    } else {
        env_absent(d, "gpu.nccl", "libnccl is not loaded in this process");
    }
    if (h) dlclose(h);
    /* The CUDA runtime is linked statically and exports nothing; the driver's CUDA version
     * (NVML) stands for what the machine supports. */
    env_absent(d, "gpu.cuda_runtime", "the CUDA runtime is linked in statically (see gpu.cuda_driver for the driver's)");
}

/* The driver and GPU 0's clocks from NVML (runtime/nvml_energy.h; its GPU 0 is CUDA's, as
 * CUDA_VISIBLE_DEVICES maps it). */
static void describe_nvml(env_doc *d, json_t *gpu) {
    tg_nvml nvml;
    tg_err err;
    if (tg_nvml_open(&nvml, &err)) {
        env_absent(d, "gpu.driver", err.msg);
        env_absent(d, "gpu.clocks", "no NVML");
        return;
    }
    char text[96];
    int v;
    if (nvml.driver_version && nvml.driver_version(text, sizeof text) == 0)
        tg_json_put(gpu, "driver", json_string(text), &d->failed);
    else env_absent(d, "gpu.driver", "NVML gives no driver version");
    if (nvml.cuda_driver_version && nvml.cuda_driver_version(&v) == 0) {
        snprintf(text, sizeof text, "%d.%d", v / 1000, v % 1000 / 10);
        tg_json_put(gpu, "cuda_driver", json_string(text), &d->failed);
    } else {
        env_absent(d, "gpu.cuda_driver", "NVML gives no CUDA driver version");
    }
    void *dev = NULL;
    if (tg_nvml_cuda_device(&nvml, 0, &dev, &err) == 0) {
        if (nvml.name && nvml.name(dev, text, sizeof text) == 0) tg_json_put(gpu, "nvml_name", json_string(text), &d->failed);
        /* NVML's clock types: 1 the SM clock, 2 the memory clock. */
        static const struct {
            const char *key;
            int type, max;
        } clocks[] = {{"sm_clock_max_mhz", 1, 1}, {"memory_clock_max_mhz", 2, 1}, {"sm_clock_mhz", 1, 0},
                      {"memory_clock_mhz", 2, 0}};
        for (size_t k = 0; k < sizeof clocks / sizeof clocks[0]; k++) {
            unsigned mhz;
            int (*fn)(void *, int, unsigned *) = clocks[k].max ? nvml.max_clock : nvml.clock;
            if (fn && fn(dev, clocks[k].type, &mhz) == 0) tg_json_put(gpu, clocks[k].key, json_integer(mhz), &d->failed);
            else env_absent(d, clocks[k].key, "NVML gives no such clock");
        }
    } else {
        env_absent(d, "gpu.clocks", err.msg);
    }
    tg_nvml_close(&nvml);
}

static void describe_gpu(env_doc *d, const char *device) {
    if (strcmp(device, "cuda")) {
        env_absent(d, "gpu", "the run was on the CPU");
        return;
    }
    json_t *gpu = json_object();
    if (!gpu) {
        d->failed = 1;
        return;
    }
    char name[256];
    if (tg_cuda_built() && tg_cuda_device_name(0, name, sizeof name) == 0)
        tg_json_put(gpu, "name", json_string(name), &d->failed);
    else env_absent(d, "gpu.name", "CUDA names no GPU 0");
    describe_nvml(d, gpu);
    describe_cuda_libraries(d, gpu);
    tg_json_put(d->root, "gpu", gpu, &d->failed);
}

json_t *environment_describe(const char *device) {
    env_doc d = {json_object(), json_array(), 0};
    if (!d.root || !d.absent) {
        json_decref(d.root), json_decref(d.absent);
        return NULL;
    }
    tg_json_put(d.root, "tunegraph", json_string(TG_VERSION_STRING), &d.failed);
    tg_json_put(d.root, "device", json_string(device), &d.failed);
    describe_host(&d);
    describe_build(&d);
    describe_gpu(&d, device);
    tg_json_put(d.root, "absent", d.absent, &d.failed);
    if (d.failed) {
        json_decref(d.root);
        return NULL;
    }
    return d.root;
}
