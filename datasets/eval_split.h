/* The eval split of `data convert`: which of N units (rows, files, lines, articles,
 * images) go to eval. */
#ifndef TUNEGRAPH_EVAL_SPLIT_H
#define TUNEGRAPH_EVAL_SPLIT_H

#include <stdint.h>

#include "base/error.h"

/* in_eval[u] (malloc'd, n bytes) for the n units: ceil(fraction x n) of them, picked by a
 * Fisher-Yates shuffle seeded with `seed`; none when fraction is 0. `what` names the units
 * in messages ("images"). Refused when it would leave nothing to train on. */
int tg_eval_split_pick(int64_t n, double fraction, uint64_t seed, const char *what, uint8_t **in_eval, int64_t *n_eval,
                       tg_err *err);

#endif
