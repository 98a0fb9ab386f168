/* Gradients that share the activation pool (tg_plan.grads_share_activations): the ops
 * during which each gradient's bytes hold a value the step still needs, so that the
 * compiler can place activations in the gradients' bytes where they are free, and the
 * plan checker can verify it, from one rule.
 *
 * With the flag, the gradient pool is not an allocation of its own: it lies at the start
 * of the activation pool, [0, pool_bytes[TG_POOL_GRADS]). A gradient's bytes are held from
 * the first op that touches them (through the gradient or any view over it) to the end
 * of the step. When the plan's update can be deferred (the executor runs a step's AdamW
 * beside the next step's forward, runtime/deferred_update.h), they are held again from
 * the next step's start until the forward has waited for the update of the parameters
 * they belong to: the first forward op whose read prefix (below) covers them, or the
 * whole forward. Bytes of the gradient pool that no gradient covers (padding between
 * them, which the update reads as zeros) are held for the whole step and never written.
 *
 * Gradients next to each other join one hold, held whenever any of them is, while the
 * hold is under TG_GRAD_HOLD_MIN_BYTES: a model's small gradients (biases, norms, a tiny
 * model's every tensor) would otherwise cut the pool into many small stretches free at
 * different times, which cost the activations' placement more to search than they can
 * hold. */
#ifndef TUNEGRAPH_GRAD_HOLD_H
#define TUNEGRAPH_GRAD_HOLD_H

#include <stdint.h>

#include "plan/plan.h"

/* The forward's reads of what the plan's update writes. When the schedule's last op
 * (ops[n_ops - 1]) is its only update op (ADAMW or ADAN) and no forward op writes what
 * that op reads or writes or reads optimizer state, fills need[j] for forward op f0 + j
 * (j < f1 - f0) with the parameter elements [0, need[j]) it and the forward ops before it
 * read (the parameters or their bf16 copies), rounded up to whole 4-element vectors and at
 * most the update's count, and returns 1: the update can run deferred beside the next
 * forward. Returns 0 otherwise (need untouched).
 *
 * `shared_grad_bytes`: 0 to look at reads only (the rule the lifetimes follow); else the
 * size of a gradient pool that shares the activation pool, whose forward writers then
 * also wait for the update of the gradients they overwrite (need grows to cover them), as
 * the executor must whatever the plan's layout says. */
int tg_update_read_prefix(const tg_tensor *tensors, const tg_op *ops, int n_ops, int f0, int f1,
                          uint64_t shared_grad_bytes, int64_t *need);

#define TG_GRAD_HOLD_MIN_BYTES (UINT64_C(1) << 20)

/* One span of the gradient pool and the ops during which it is held: [from, to] and,
 * where wrap_to >= 0, also [0, wrap_to] (the previous step's value, until the deferred
 * update has read it). */
typedef struct tg_grad_hold {
    uint64_t a, b;   /* bytes [a, b) of the gradient pool (= of the activation pool) */
    int32_t from, to;
    int32_t wrap_to; /* -1: not held at the step's start */
    int32_t tensor;  /* the (first) gradient it holds, or -1 for padding no gradient covers */
} tg_grad_hold;

/* The holds of a plan whose gradients share the activation pool: the non-view tensors of
 * the gradient pool, joined as above, and one per stretch of the pool's bytes no such tensor covers (held
 * for the whole step), in offset order. *out is malloc'ed (free it); *n_out its count.
 * 0, or -1 when out of memory. Tensors whose offsets or lifetimes lie outside the pool or
 * the schedule are the plan checks' to refuse; here they are clamped. */
int tg_grad_holds(const tg_tensor *tensors, int n_tensors, const tg_op *ops, int n_ops, const int32_t *phase_begin,
                  uint64_t grad_pool_bytes, tg_grad_hold **out, int *n_out);

/* Whether a hold and an activation live over ops [first, last] meet in time. */
int tg_grad_hold_meets(const tg_grad_hold *h, int first, int last);

#endif
