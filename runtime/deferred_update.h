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
 * This file computes the chunks and the waits from a plan; it has no device code. */
#ifndef TUNEGRAPH_DEFERRED_UPDATE_H
#define TUNEGRAPH_DEFERRED_UPDATE_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

typedef struct tg_deferred_update {
    int adamw_op;        /* schedule index of the plan's update op, ADAMW or ADAN (the last op) */
    int n_chunks;
    /* Chunk k updates parameter elements [begin[k], begin[k + 1]); begin[0] = 0 and
     * begin[n_chunks] = the parameter count. Every boundary is a multiple of 4 elements
     * (the update's vector width). */
    int64_t *begin;
    /* For forward op phase_begin[FORWARD] + j: how many chunks, from the first, must be
     * done before it starts (0: none). Never decreases along the forward. */
    int *chunks_before;
    int n_forward;
} tg_deferred_update;

/* Plans the chunks for `plan`, each (but possibly the last) at least min_chunk elements,
 * so that the update is not cut into more launches than it gains from. Returns 1 with
 * *u filled when the plan allows deferral (one update op, ADAMW or ADAN, the last of the schedule,
 * after every read of the gradients), 0 when it does not (*u zeroed), -1 on error. */
int tg_deferred_update_plan(const tg_plan *plan, int64_t min_chunk, tg_deferred_update *u, tg_err *err);
void tg_deferred_update_free(tg_deferred_update *u);

#endif
