/* The memory preflight: before a trainer allocates anything, what the plan will need on
 * its device (plan/memory_estimate.h) is compared with what the device has free, and a
 * plan that cannot fit is refused at once with both numbers. The same reading starts the
 * measurement of the run's peak memory, which the trainer reports beside the planned
 * peak. */
#ifndef TUNEGRAPH_PREFLIGHT_H
#define TUNEGRAPH_PREFLIGHT_H

#include <stdint.h>

#include "base/error.h"
#include "plan/memory_estimate.h"
#include "plan/plan.h"
#include "runtime/executor.h"

/* The measured peak of one run: on CUDA, free device memory right after the context
 * exists and before the pools, against the least seen at each sample; on the CPU, the
 * process's resident set at the start against its high-water mark (process-wide: every
 * replica of a CPU run in the process counts). */
typedef struct tg_memory_probe {
    int32_t device;     /* tg_device */
    int32_t gpu;        /* CUDA: the GPU of the run's replica */
    int32_t started;    /* the baseline was read: peaks can be measured */
    int32_t hwm_reset;  /* CPU: the kernel's high-water mark was reset at the start, so it
                           holds the peak between samples too */
    uint64_t baseline;  /* CUDA: free bytes; CPU: resident bytes */
    uint64_t low_free;  /* CUDA: least free bytes seen */
    uint64_t high_rss;  /* CPU: most resident bytes seen */
} tg_memory_probe;

/* Memory the device has for a run: CPU, MemAvailable from /proc/meminfo; CUDA, free
 * memory of GPU `gpu` (cudaMemGetInfo, which creates the GPU's context first). `source`
 * names where the number comes from ("MemAvailable", "free on GPU 0"). 0, or -1 with a
 * message (on the CPU also where /proc/meminfo cannot be read). */
/* The value of the "Key:   123 kB" line of a /proc file (/proc/meminfo, /proc/self/status)
 * in bytes: 0, or -1 (*bytes untouched) when the file cannot be read or its first line for
 * the key holds no number (or one past 64 bits). */
int tg_proc_kib(const char *path, const char *key, uint64_t *bytes);

int tg_device_free_memory(tg_device device, int gpu, uint64_t *free_bytes, char *source, int source_len, tg_err *err);

/* Starts *probe on `device` (GPU `gpu` on CUDA) and, unless the environment has
 * TUNEGRAPH_PREFLIGHT=0, refuses the plan (-1, a message naming the device, what the plan
 * needs with its parts, and what the device has) when its estimate exceeds the memory the
 * device has free. On CUDA the context exists by the time free memory can be read, so
 * the estimate's TG_MEM_CUDA_CONTEXT part is left out of the comparison. A device whose
 * memory cannot be read is not checked (the executor then reports what is wrong). */
int tg_preflight(const tg_plan *plan, tg_device device, int gpu, tg_memory_probe *probe, tg_err *err);

/* Reads the device's memory now and keeps the extreme; never call it inside a captured
 * step (the trainer calls it after it has waited for a step). */
void tg_memory_probe_sample(tg_memory_probe *probe);
/* The peak growth measured between the start and the samples so far (a sample is taken
 * first), or -1 where nothing could be measured. */
int64_t tg_memory_probe_peak(tg_memory_probe *probe);

#endif
