/* How long a data-parallel replica waits for its peers before giving up: a step on CUDA, a
 * collective of CPU ranks under MPI. TUNEGRAPH_STEP_TIMEOUT_S, default 60 s. */
#ifndef TUNEGRAPH_STEP_TIMEOUT_H
#define TUNEGRAPH_STEP_TIMEOUT_H

#include "base/error.h"

#define TG_STEP_TIMEOUT_DEFAULT_S 60.0

/* The environment's timeout, read strictly (a number of seconds above 0, at most 1e9): 0,
 * or -1 naming the value. */
int tg_step_timeout_s(double *out, tg_err *err);

#endif
