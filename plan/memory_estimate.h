/* What a run of a plan needs in memory, part by part, known before anything is
 * allocated: the preflight (runtime/preflight.c) compares it with what the device has
 * free and refuses a plan that cannot fit; `tunegraph inspect` prints it.
 *
 * A pure function of the plan and the device kind. The estimate is per replica: each
 * replica of a data-parallel plan checks its own GPU (or, on the CPU, its own share of
 * the host as it opens, so the replicas together are checked). */
#ifndef TUNEGRAPH_MEMORY_ESTIMATE_H
#define TUNEGRAPH_MEMORY_ESTIMATE_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- sizes the CUDA executor allocates (runtime/cuda/cuda_exec.c uses these) ----------- */

/* The cuBLASLt workspace. */
#define TG_MEM_GEMM_WORKSPACE_BYTES (32u << 20)
/* The device batch staging of the step pipeline: this many slots, each an image of the
 * inputs pool rounded up to TG_MEM_STAGING_ALIGN bytes, and one alignment's slack. */
#define TG_MEM_STAGING_SLOTS 2
#define TG_MEM_STAGING_ALIGN 256
/* The reduction scratch is never smaller than this many floats. */
#define TG_MEM_REDUCE_SCRATCH_MIN_FLOATS 1024

/* ---- stated constants (not derived from the plan) ---------------------------------- */

/* The CUDA context's own device memory (its heaps, the per-SM local memory reserve):
 * about 500 MiB for a fresh context on an H100 with CUDA 12 and 13. It is in place before
 * free memory can be read at all, so the preflight leaves it out of what it compares. */
#define TG_MEM_CUDA_CONTEXT_BYTES (512ull << 20)
/* Device memory that appears once the executor runs: its kernels and cuBLASLt's, loaded
 * on first launch (lazy module loading), the cuBLASLt handle, and the step graphs
 * uploaded for device launch. An upper allowance; tests/gpu/test_cuda_memory.c checks
 * that the measured peak stays within the estimate's non-pool parts. */
#define TG_MEM_CUDA_KERNELS_BYTES (256ull << 20)
/* NCCL's buffers on each GPU of a data-parallel run (replicas > 1). Assumes NCCL's
 * defaults with NVLink SHARP off (runtime/cuda/executor_cuda.c): up to 32 channels, each
 * with ring and tree connections holding the Simple (NCCL_BUFFSIZE, 4 MiB), LL128 (about
 * 4.5 MiB) and LL buffers, about 1 GiB in all; a larger NCCL_BUFFSIZE needs more. */
#define TG_MEM_NCCL_BYTES (1024ull << 20)
/* Host images of the inputs pool a CPU trainer keeps: the CPU executor runs one step at
 * a time, and the trainer's ring holds steps in flight + 2 (runtime/trainer.c). */
#define TG_MEM_CPU_STAGING_BUFFERS 3

/* The device kinds an estimate is for; the values are runtime/executor.h's tg_device. */
typedef enum tg_mem_device { TG_MEM_DEVICE_CPU = 0, TG_MEM_DEVICE_CUDA = 1 } tg_mem_device;

typedef enum tg_mem_part {
    TG_MEM_POOLS = 0,         /* the plan's pools (plan->peak_bytes) */
    TG_MEM_GEMM_WORKSPACE,    /* CUDA: cuBLASLt workspace */
    TG_MEM_REDUCE_SCRATCH,    /* CUDA: reduction scratch, an upper bound from the op shapes */
    TG_MEM_BATCH_STAGING,     /* CUDA: the two device staging slots; CPU: the host images */
    TG_MEM_NCCL,              /* CUDA with replicas > 1: NCCL buffers */
    TG_MEM_CUDA_CONTEXT,      /* CUDA: the context */
    TG_MEM_CUDA_KERNELS,      /* CUDA: loaded kernels, cuBLASLt, uploaded graphs */
    TG_MEM_WEIGHTS_UPLOAD,    /* CPU: the host image of the values the trainer fills and
                                 uploads while it opens: the trainable parameters (fp32, and
                                 bf16 for bf16 plans), the frozen ones and the buffers (fp32
                                 or int32) */
    TG_MEM_PART_COUNT
} tg_mem_part;

typedef struct tg_memory_estimate {
    int32_t device;                   /* tg_mem_device */
    uint64_t part[TG_MEM_PART_COUNT]; /* bytes; 0 where a part does not apply */
    uint64_t total;                   /* the sum of the parts */
} tg_memory_estimate;

/* Fills *est for running the plan on `device` (tg_mem_device). */
void tg_estimate_memory(const tg_plan *plan, int device, tg_memory_estimate *est);

/* An upper bound of the CUDA executor's reduction scratch, in floats: the largest any op
 * of the plan asks for, from the shapes of its tensors (plan/memory_estimate.c gives the
 * bound of each op kind). */
uint64_t tg_reduce_scratch_bound_floats(const tg_plan *plan);
/* The bound for schedule op `op` alone (0 for ops that need no scratch). */
uint64_t tg_op_scratch_bound_floats(const tg_plan *plan, int op);

/* The part's key ("pools", "gemm_workspace", ...) and its words ("cuBLASLt workspace"). */
const char *tg_mem_part_key(int part);
const char *tg_mem_part_label(int part);

/* Bytes for people: "41.2 GiB", "32.0 MiB", "12.0 KiB", "260 B". Returns buf. */
char *tg_mem_format_bytes(uint64_t bytes, char *buf, size_t len);
/* The nonzero parts as "pools 40.1 GiB + cuBLASLt workspace 32.0 MiB + ...", leaving out
 * part `skip` (-1: none). Returns buf. */
char *tg_memory_estimate_parts(const tg_memory_estimate *est, int skip, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
