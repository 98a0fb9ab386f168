/* `tunegraph inspect`: a plan as readable text or as one JSON object. */
#ifndef TUNEGRAPH_INSPECT_H
#define TUNEGRAPH_INSPECT_H

#include <stdio.h>

#include "base/error.h"
#include "plan/plan.h"

/* Writes the plan to `out`: text (json == 0) or a JSON object (json != 0). Returns 0,
 * or -1 with a message when the output cannot be built or written. */
int tg_plan_inspect(const tg_plan *plan, FILE *out, int json, tg_err *err);

#endif
