/* NVML loaded at run time, and the energy of a run's GPUs (runtime/nvml_energy.h). */
#include "runtime/nvml_energy.h"

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NVML_DEFAULT_LIBRARY "libnvidia-ml.so.1"

int tg_nvml_open(tg_nvml *n, tg_err *err) {
    memset(n, 0, sizeof *n);
    const char *path = getenv("TUNEGRAPH_NVML");
    if (!path || !*path) path = NVML_DEFAULT_LIBRARY;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return tg_fail(err, "%s cannot be opened", path);
    /* dlsym gives a void *; POSIX guarantees it converts to the function's pointer. */
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    n->shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown");
    if (!init || !n->shutdown || init() != 0) {
        dlclose(lib);
        memset(n, 0, sizeof *n);
        return tg_fail(err, "NVML did not start (%s)", path);
    }
    n->lib = lib;
    n->driver_version = (int (*)(char *, unsigned))dlsym(lib, "nvmlSystemGetDriverVersion");
    n->cuda_driver_version = (int (*)(int *))dlsym(lib, "nvmlSystemGetCudaDriverVersion_v2");
    n->handle_by_index = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    n->handle_by_uuid = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByUUID");
    n->max_clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetMaxClockInfo");
    n->clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
    n->name = (int (*)(void *, char *, unsigned))dlsym(lib, "nvmlDeviceGetName");
    n->total_energy = (int (*)(void *, unsigned long long *))dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    return 0;
}

void tg_nvml_close(tg_nvml *n) {
    if (!n->lib) return;
    n->shutdown();
    dlclose(n->lib);
    memset(n, 0, sizeof *n);
}

int tg_nvml_cuda_device(const tg_nvml *n, int cuda_index, void **device, tg_err *err) {
    /* CUDA_VISIBLE_DEVICES: CUDA's GPU i is the list's entry i, an NVML index or a UUID. */
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    char entry[96] = "";
    if (visible && *visible) {
        const char *p = visible;
        for (int i = 0; i < cuda_index && p; i++) {
            p = strchr(p, ',');
            if (p) p++;
        }
        const size_t len = p ? strcspn(p, ",") : 0;
        if (!p || len == 0 || len >= sizeof entry)
            return tg_fail(err, "CUDA_VISIBLE_DEVICES='%s' has no entry for GPU %d", visible, cuda_index);
        memcpy(entry, p, len);
        entry[len] = 0;
    }
    if (entry[0] && strncmp(entry, "GPU-", 4) == 0) {
        if (!n->handle_by_uuid || n->handle_by_uuid(entry, device) != 0)
            return tg_fail(err, "NVML cannot find GPU %s (CUDA's GPU %d)", entry, cuda_index);
        return 0;
    }
    long index = cuda_index;
    if (entry[0]) {
        char *end;
        index = strtol(entry, &end, 10);
        if (*end || index < 0)
            return tg_fail(err, "CUDA_VISIBLE_DEVICES entry '%s' is neither an index nor a GPU-... UUID", entry);
    }
    if (!n->handle_by_index || n->handle_by_index((unsigned)index, device) != 0)
        return tg_fail(err, "NVML cannot open GPU %ld (CUDA's GPU %d)", index, cuda_index);
    return 0;
}

int tg_energy_meter_open(tg_energy_meter *m, int gpus, tg_err *err) {
    memset(m, 0, sizeof *m);
    if (gpus < 1 || gpus > TG_ENERGY_MAX_GPUS)
        return tg_fail(err, "%d GPUs: the energy meter reads 1 to %d", gpus, TG_ENERGY_MAX_GPUS);
    if (tg_nvml_open(&m->nvml, err)) return -1;
    int rc = 0;
    if (!m->nvml.total_energy) rc = tg_fail(err, "this NVML has no nvmlDeviceGetTotalEnergyConsumption");
    for (int g = 0; g < gpus && !rc; g++) {
        unsigned long long mj;
        if (tg_nvml_cuda_device(&m->nvml, g, &m->device[g], err)) rc = -1;
        else if (m->nvml.total_energy(m->device[g], &mj) != 0)
            rc = tg_fail(err, "GPU %d has no energy counter (NVML gives no total energy consumption)", g);
    }
    if (rc) {
        tg_nvml_close(&m->nvml);
        return -1;
    }
    m->gpus = gpus;
    return 0;
}

int tg_energy_meter_read(const tg_energy_meter *m, double *joules, tg_err *err) {
    unsigned long long total = 0;
    for (int g = 0; g < m->gpus; g++) {
        unsigned long long mj;
        if (m->nvml.total_energy(m->device[g], &mj) != 0)
            return tg_fail(err, "GPU %d: NVML stopped giving its total energy consumption", g);
        total += mj;
    }
    *joules = (double)total / 1e3;
    return 0;
}

void tg_energy_meter_close(tg_energy_meter *m) {
    tg_nvml_close(&m->nvml);
    m->gpus = 0;
}

tg_energy_use tg_energy_use_of(double joules, int64_t steps, int64_t tokens, double seconds) {
    tg_energy_use u = {.joules = joules};
    u.joules_per_step = steps > 0 ? joules / (double)steps : NAN;
    u.joules_per_1k_tokens = tokens > 0 ? joules / (double)tokens * 1e3 : NAN;
    u.avg_power_w = seconds > 0 ? joules / seconds : NAN;
    u.tokens_per_joule = joules > 0 ? (double)tokens / joules : NAN;
    return u;
}

double tg_cost_per_1m_tokens(double price_per_gpu_hour, int gpus, int64_t tokens, double seconds) {
    if (!(price_per_gpu_hour > 0) || gpus < 1 || tokens <= 0 || !(seconds > 0)) return NAN;
    const double seconds_per_1m_tokens = seconds / (double)tokens * 1e6;
    return price_per_gpu_hour * gpus * seconds_per_1m_tokens / 3600.0;
}
