/* Checks of a finished plan that trust nothing the compiler recorded about it: the memory
 * checker, and the table consistency checks the plan decoder runs. */
#ifndef TUNEGRAPH_PLAN_VALIDATE_H
#define TUNEGRAPH_PLAN_VALIDATE_H

#include <stdint.h>

#include "base/error.h"
#include "plan/grad_hold.h"
#include "plan/plan.h"

/* Independent check of a finished plan: every op touching a tensor lies within its
 * [first_use, last_use]; every offset is aligned, except packed group members, which must
 * tile their group's view exactly (at offsets that are multiples of their element size); no two tensors of one pool overlap in bytes while both
 * are live (views aside); every tensor fits its pool. Reports the pools' extents summed
 * (which must equal plan->peak_bytes) and the largest live activation sum. */
typedef struct tg_memory_report {
    uint64_t pool_extent[TG_POOL_COUNT];
    uint64_t peak_bytes;
    uint64_t activation_live_peak;
} tg_memory_report;
int tg_plan_check_memory(const tg_plan *plan, tg_memory_report *report, tg_err *err);

/* The largest sum of activation bytes live at once, from the tensors' lifetimes, and of
 * the gradient holds (plan/grad_hold.h; NULL, 0 where the gradients have a pool of their
 * own) held with them: the least the activation pool can be. Into *peak; -1 when out of
 * memory (the caller names what it was doing). */
int tg_plan_live_activation_peak(const tg_tensor *tensors, int n_tensors, int n_ops, const struct tg_grad_hold *holds,
                                 int n_holds, uint64_t *peak);

/* The table checks every executor relies on, run by the plan decoder on what it read, so a
 * damaged or hand-edited plan is refused there instead of indexing outside the tables later:
 * enums in range, positive train and run settings (num_labels 2 or more for a classifier),
 * pool sizes up to TG_POOL_MAX_BYTES, tensor dims and byte sizes (the element count times
 * the dtype's size, without overflow), pools, offsets within their pool, known flag bits
 * and a consistent parameter class (trainable parameters f32), tensor and op indices in
 * range, lifetimes in order, the phase table, matmul activations. `name` (the file) starts
 * each message. */
int tg_plan_validate_tables(const tg_plan *plan, const char *name, tg_err *err);

/* What the plan decoder checks next, on tables that passed tg_plan_validate_tables: each op
 * against the tensors it touches, as the compiler checks every op it emits (tg_op_check,
 * plan/op_meta.h: slots and dtypes, then the shape rule over its parameters, every product
 * checked for overflow; "NAME: op O (KIND): WHY"), then the layout (tg_plan_check_memory)
 * and the totals the preflight trusts (peak_bytes, activation_live_peak), then what the
 * runtime binds by role: each io tensor in its pool, of the dtype and shape the runtime
 * writes or reads (the batch tensors train batch x seq, the scalars one element, the
 * parameter views starting their pools, every trainable parameter inside params_all), the
 * optimizer ops bound to the io tensors (every step counter slot is io.step, which only
 * SCHEDULE writes), replicas and zero_stage matched by the gradient sums and gathers, and
 * each parameter copy as large as its master. So no op or runtime copy of a loaded plan
 * reads or writes outside its tensors or into a live tensor's bytes. "NAME: io FIELD ..."
 * or "NAME: op O (KIND): ...". */
int tg_plan_validate_ops(const tg_plan *plan, const char *name, tg_err *err);

/* The plan's length buckets (plan.h, tg_plan.buckets), on a plan and bucket plans that
 * each passed the checks above: the last bucket length is train seq; n_buckets - 1 bucket
 * plans exactly when n_buckets > 1; each with the plan's train (seq bucket_seq[k]), run,
 * model, io, job path and fingerprint, no buckets of its own, the plan's tensors and ops
 * index for index (names, dtypes, pools, flags, links and initial values; op kinds,
 * phases and slots; outside the activation and input pools every tensor at the same
 * offset with the same shape) and every pool_bytes the plan's. "NAME: bucket K (seq S):
 * ..." names what differs. The compiler runs it on what it built, the decoder on what it
 * read. */
int tg_plan_validate_buckets(const tg_plan *plan, const char *name, tg_err *err);

#endif
