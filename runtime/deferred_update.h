/* The deferred parameter update: how an executor overlaps a step's AdamW with the next
 * step's forward.
 *
 * A step's update depends on the whole backward (the clipping norm spans every
 * gradient), so within one step nothing can run beside it. The next step's forward,
 * though, needs a layer's parameters only when it reaches that layer. An executor may
 * therefore end a step after its learning-rate schedule and gradient norm, and run the
 * step's AdamW at the start of the next step, beside that step's forward: in chunks of
 * the parameter buffer, in the order the forward first reads them, each forward op
 * waiting only for the chunks holding what it reads, and the backward (which overwrites
 * the gradients the update reads) waiting for all of them. Every element gets the same
 * update from the same inputs as in schedule order, so training is bit-for-bit unchanged.
 *
 * ZeRO-1 (the update's zero_slice > 0): replica r updates only its slice, elements
 * [r * zero_slice, (r + 1) * zero_slice), and the plan's ALL_GATHERs after the update share
 * the updated slices (the parameters, and their bf16 copies in bf16 plans). Deferred, the
 * same chunks serve: for chunk k each replica updates the part of the chunk inside its own
 * slice, then the chunk's elements are shared from their owners (tg_deferred_update_share:
 * one broadcast per owner of a part of the chunk, for each gathered tensor, the same list on
 * every replica, so all issue the same collectives in the same order), and a forward op
 * waits for the chunks it reads as without ZeRO. The gathers then never run after the
 * step's update, outside the forward. A ZeRO-1 update still pending when something outside
 * a step reads the parameters (eval, a save, a checkpoint, the end of training) is settled
 * by the update and the plan's gathers, which, being collectives, every replica must run at
 * the same point (tg_trainer_settle).
 *
 * This file computes the chunks, the waits and the shared parts from a plan; it has no
 * device code. */
#ifndef TUNEGRAPH_DEFERRED_UPDATE_H
#define TUNEGRAPH_DEFERRED_UPDATE_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* The most tensors a ZeRO-1 plan gathers after its update: the parameters and their bf16
 * (or fp16) copies. */
#define TG_DEFERRED_GATHERS 2

typedef struct tg_deferred_update {
    /* Schedule index of the plan's update op, ADAMW or ADAN: the last op, or with ZeRO-1 the
     * last before the gathers. */
    int adamw_op;
    int n_chunks;
    /* Chunk k updates parameter elements [begin[k], begin[k + 1]); begin[0] = 0 and
     * begin[n_chunks] = the parameter count. Every boundary is a multiple of 4 elements
     * (the update's vector width). */
    int64_t *begin;
    /* For forward op phase_begin[FORWARD] + j: how many chunks, from the first, must be
     * done before it starts (0: none). Never decreases along the forward. */
    int *chunks_before;
    int n_forward;
    /* ZeRO-1: the update's zero_slice (0: none, and no gathers), the replicas, and the
     * schedule indices of the ALL_GATHERs that end the schedule (gather_op[0 .. n_gathers),
     * in schedule order), each of zero_slice-element slices over `gather_end` = zero_slice
     * x replicas elements from the start of its pool (past the parameter count: the last
     * chunk's share reaches there, as the gathers do). */
    int64_t zero_slice;
    int replicas;
    int n_gathers;
    int gather_op[TG_DEFERRED_GATHERS];
    int64_t gather_end;
} tg_deferred_update;

/* The least chunk an executor asks for on a plan updating n parameter elements: n / 16,
 * at least 4096 and at most 2M elements (a few microseconds of update each), so the update
 * is cut into about 16 launches at most. */
int64_t tg_deferred_update_min_chunk(int64_t n);

/* Plans the chunks for `plan`, each (but possibly the last) at least min_chunk elements,
 * so that the update is not cut into more launches than it gains from. Returns 1 with
 * *u filled when the plan allows deferral (one update op, ADAMW or ADAN, after every read
 * of the gradients: the last of the schedule, or with ZeRO-1 followed only by
 * ALL_GATHERs, in place, of the whole parameter pool and of its bf16 copies, each of the
 * update's slices), 0 when it does not (*u zeroed), -1 on error. */
int tg_deferred_update_plan(const tg_plan *plan, int64_t min_chunk, tg_deferred_update *u, tg_err *err);
void tg_deferred_update_free(tg_deferred_update *u);

/* The elements of chunk k that `replica` updates, [*lo, *hi): the whole chunk without
 * ZeRO-1, else its part inside the replica's slice (*lo == *hi where it has none). */
void tg_deferred_update_own(const tg_deferred_update *u, int k, int replica, int64_t *lo, int64_t *hi);

/* One broadcast of the ZeRO-1 share of a chunk: elements [lo, hi) of each gathered tensor,
 * from `owner`, whose slice holds them. */
typedef struct tg_deferred_share {
    int owner;
    int64_t lo, hi;
} tg_deferred_share;

/* The broadcasts that share chunk k after its update (ZeRO-1), owners in rank order, into
 * out[0 .. replicas): the chunk's elements, the last chunk's up to gather_end, cut at the
 * slices' bounds. The same on every replica (it does not depend on the rank). Returns
 * their count (0 without ZeRO-1). */
int tg_deferred_update_share(const tg_deferred_update *u, int k, tg_deferred_share *out);

#endif
