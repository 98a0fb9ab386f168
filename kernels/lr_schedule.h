/* The learning-rate schedules of SCHEDULE (tg_schedule_params.form), written once for the
 * CPU reference and the CUDA kernel so both compute the same double expressions. Each is
 * the multiplier of the peak rate after `step` completed updates of `total`, as Hugging
 * Face's get_{linear,cosine,constant}_schedule_with_warmup lambdas (the cosine with their
 * default half cycle): a linear warm-up from 0 over `warmup` steps, then
 *   linear:   down to 0 at `total`, never below 0;
 *   cosine:   0.5 * (1 + cos(pi * progress)), progress 0 -> 1 over the steps after the warm-up;
 *   constant: 1. */
#ifndef TUNEGRAPH_LR_SCHEDULE_H
#define TUNEGRAPH_LR_SCHEDULE_H

#include <math.h>

#include "kernels/philox.h" /* TG_HOST_DEVICE */
#include "plan/ops.h"

TG_HOST_DEVICE static inline double tg_lr_multiplier(int form, double step, double total, double warmup) {
    if (step < warmup) return step / fmax(1.0, warmup);
    const double after = fmax(1.0, total - warmup);
    if (form == TG_LR_COSINE) return fmax(0.0, 0.5 * (1.0 + cos(3.14159265358979323846 * ((step - warmup) / after))));
    if (form == TG_LR_CONSTANT) return 1.0;
    return fmax(0.0, (total - step) / after);
}

#endif
