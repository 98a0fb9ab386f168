/* What the tests that compare two plans' training share: one CPU run recorded byte for
 * byte. */
#ifndef TUNEGRAPH_TESTS_TRAIN_RECORD_H
#define TUNEGRAPH_TESTS_TRAIN_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"

/* One CPU run of `steps` steps: each step's loss and gradient norm, each step's gradients,
 * then the parameters and the optimizer state, appended to *out (malloc'ed, *n bytes).
 * Returns 1, or 0 after a failed CHECK (nothing to free). */
int train_record(const tg_plan *plan, int steps, uint8_t **out, size_t *n);

#endif
