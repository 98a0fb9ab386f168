/* What the tests that compare plans and their training share: one CPU run recorded byte
 * for byte, a plan's file round trip, an eval forward's logits, deterministic fills. */
#ifndef TUNEGRAPH_TESTS_TRAIN_RECORD_H
#define TUNEGRAPH_TESTS_TRAIN_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"
#include "runtime/trainer.h"

/* One CPU run of `steps` steps: each step's loss and gradient norm, each step's gradients,
 * then the parameters and the optimizer state, appended to *out (malloc'ed, *n bytes).
 * Returns 1, or 0 after a failed CHECK (nothing to free). */
int train_record(const tg_plan *plan, int steps, uint8_t **out, size_t *n);

/* The plan through its file encoding and back: the decoder's checks (tables, ops, the
 * memory checker, bucket plans) accept it and give the same plan (ops, tensors, both
 * peaks); CHECKs name `what`. */
void check_file_round_trip(const tg_plan *p, const char *what);

/* The forward in eval mode (no dropout): its logits (malloc'd) and *loss; NULL on error. */
float *forward_logits(tg_trainer *tr, const tg_plan *p, float *loss, tg_err *err);

/* n values in scale x [-0.5, 0.5) from a 32-bit LCG seeded with `seed`. */
void random_fill(float *v, int64_t n, float scale, uint32_t seed);

#endif
