/* Assigns every tensor its pool offset. Parameters, gradients and optimizer state are
 * each one contiguous buffer with one layout (so one kernel can update them all);
 * activations share memory by liveness. */
#ifndef TUNEGRAPH_MEMORY_PLAN_H
#define TUNEGRAPH_MEMORY_PLAN_H

#include "compiler/graph.h"

/* Offsets of the trainable parameters, their gradients and the whole-pool views (before
 * autodiff, which needs the gradient tensors). Parameters are placed in tensor order, each
 * aligned; the members of a packed group (tg_tensor.group) go back to back as one aligned
 * block, in tensor order, where the first member is reached. The params, grads and optim
 * pools hold the trainable parameters only. */
int tg_plan_param_layout(tg_graph *g);
/* Offsets of the frozen parameters and the buffers, each pool laid out as the parameters are
 * (packed groups, room for padded views). After the precision pass, which decides the
 * frozen tensors' storage dtypes. */
int tg_plan_fixed_layout(tg_graph *g);

/* ZeRO-1 (job zero_stage 1): the parameter elements each replica updates, a slice of
 * ceil(elements / data_parallel) rounded up to an aligned count, so that data_parallel
 * slices cover the parameters (the pools are padded to their sum); 0 without ZeRO. */
int64_t tg_zero_slice(const tg_job *job, int64_t elements);
/* Liveness and offsets of every other tensor; fills pool sizes into pool_bytes and the
 * largest sum of simultaneously live activations into *live_peak. *share_grads 1: the
 * gradient pool lies at the start of the activation pool, the activations placed around
 * the gradients' holds (plan/grad_hold.h; tg_plan.grads_share_activations), unless padding
 * cuts the gradient pool into more than 64 stretches, when *share_grads becomes 0. */
int tg_plan_memory(tg_graph *g, const int *phase_begin, int *share_grads, uint64_t pool_bytes[TG_POOL_COUNT],
                   uint64_t *live_peak);

#endif
