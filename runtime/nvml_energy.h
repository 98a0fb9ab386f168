/* NVML (the NVIDIA driver's management library), opened at run time with dlopen and never
 * linked, so the CPU build and machines without the driver need none of it: the one loader
 * for the GPU energy a run measures and for the driver and clocks an artifact's
 * environment.json records (cli/environment.c).
 *
 * TUNEGRAPH_NVML=PATH opens the library at PATH instead of libnvidia-ml.so.1 (the suite
 * points it at a library of its own that reports scripted values; README.md). */
#ifndef TUNEGRAPH_RUNTIME_NVML_ENERGY_H
#define TUNEGRAPH_RUNTIME_NVML_ENERGY_H

#include <stdint.h>

#include "base/error.h"

/* The library's functions this project calls, NULL where the library lacks one. NVML's
 * return codes: 0 is NVML_SUCCESS; a device is an opaque handle. */
typedef struct tg_nvml {
    void *lib;
    int (*shutdown)(void);
    int (*driver_version)(char *text, unsigned cap);
    int (*cuda_driver_version)(int *version);
    int (*handle_by_index)(unsigned index, void **device);
    int (*handle_by_uuid)(const char *uuid, void **device);
    int (*max_clock)(void *device, int type, unsigned *mhz);
    int (*clock)(void *device, int type, unsigned *mhz);
    int (*name)(void *device, char *text, unsigned cap);
    /* Millijoules the GPU has used since the driver was loaded (Volta and later). */
    int (*total_energy)(void *device, unsigned long long *millijoules);
} tg_nvml;

/* Opens the library (TUNEGRAPH_NVML's path, else libnvidia-ml.so.1) and starts NVML: 0, or
 * -1 with err saying why ("libnvidia-ml.so.1 cannot be opened", "NVML did not start"). */
int tg_nvml_open(tg_nvml *n, tg_err *err);
/* Stops NVML and closes the library; a closed or never opened one is left alone. */
void tg_nvml_close(tg_nvml *n);

/* NVML's handle of CUDA's GPU `cuda_index`: NVML numbers every GPU of the machine, CUDA
 * only those CUDA_VISIBLE_DEVICES lists, in its order (indices or GPU-... UUIDs). 0, or -1
 * with err set. */
int tg_nvml_cuda_device(const tg_nvml *n, int cuda_index, void **device, tg_err *err);

#define TG_ENERGY_MAX_GPUS 64

/* The energy counters of a run's GPUs (CUDA's 0 .. gpus-1, one per data-parallel replica). */
typedef struct tg_energy_meter {
    tg_nvml nvml;
    int gpus;
    void *device[TG_ENERGY_MAX_GPUS];
} tg_energy_meter;

/* Opens NVML and each GPU's counter, reading it once: 0, or -1 with err saying why energy
 * cannot be measured (no library, NVML not starting, a GPU it cannot find, or one without
 * an energy counter), the meter then closed. */
int tg_energy_meter_open(tg_energy_meter *m, int gpus, tg_err *err);
/* The GPUs' counters summed, in joules since their drivers were loaded: 0, or -1 with err. */
int tg_energy_meter_read(const tg_energy_meter *m, double *joules, tg_err *err);
void tg_energy_meter_close(tg_energy_meter *m);

/* What a run's energy comes to: `joules` over `steps` steps of `tokens` tokens in
 * `seconds`. Each figure is NaN where its divisor is not positive. */
typedef struct tg_energy_use {
    double joules;
    double joules_per_step, joules_per_1k_tokens, avg_power_w, tokens_per_joule;
} tg_energy_use;
tg_energy_use tg_energy_use_of(double joules, int64_t steps, int64_t tokens, double seconds);

/* The price of 1M tokens at `price_per_gpu_hour` for each of `gpus` GPUs, `tokens` taking
 * `seconds`: price x GPUs x the seconds 1M tokens take / 3600; NaN where the price, the
 * tokens or the seconds are not positive. */
double tg_cost_per_1m_tokens(double price_per_gpu_hour, int gpus, int64_t tokens, double seconds);

#endif
