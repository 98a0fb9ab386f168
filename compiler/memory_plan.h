/* Assigns every tensor its pool offset. Parameters, gradients and optimizer state are
 * each one contiguous buffer with one layout (so one kernel can update them all);
 * activations share memory by liveness. */
#ifndef TUNEGRAPH_MEMORY_PLAN_H
#define TUNEGRAPH_MEMORY_PLAN_H

#include "compiler/graph.h"

#define TG_TENSOR_ALIGN 256

/* Offsets of parameters, their gradients and the whole-pool views (before autodiff,
 * which needs the gradient tensors). Parameters are placed in tensor order, each aligned;
 * the members of a packed group (tg_tensor.group) go back to back as one aligned block, in
 * tensor order, where the first member is reached. */
int tg_plan_param_layout(tg_graph *g);

/* ZeRO-1 (job zero_stage 1): the parameter elements each replica updates, a slice of
 * ceil(elements / data_parallel) rounded up to an aligned count, so that data_parallel
 * slices cover the parameters (the pools are padded to their sum); 0 without ZeRO. */
int64_t tg_zero_slice(const tg_job *job, int64_t elements);
/* Liveness and offsets of every other tensor; fills pool sizes into pool_bytes and the
 * largest sum of simultaneously live activations into *live_peak. */
int tg_plan_memory(tg_graph *g, const int *phase_begin, uint64_t pool_bytes[TG_POOL_COUNT],
                   uint64_t *live_peak);

/* Independent check of a finished plan: every op touching a tensor lies within its
 * [first_use, last_use]; every offset is aligned, except packed group members, which must
 * tile their group's view exactly; no two tensors of one pool overlap in bytes while both
 * are live (views aside); every tensor fits its pool. Reports the pools' extents summed
 * (which must equal plan->peak_bytes) and the largest live activation sum. */
typedef struct tg_memory_report {
    uint64_t pool_extent[TG_POOL_COUNT];
    uint64_t peak_bytes;
    uint64_t activation_live_peak;
} tg_memory_report;
int tg_plan_check_memory(const tg_plan *plan, tg_memory_report *report, tg_err *err);

#endif
