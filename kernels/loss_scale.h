/* Dynamic loss scaling (LOSS_SCALE_UPDATE, plan/ops.def), written once for the CPU reference
 * and the CUDA kernel: torch.amp.GradScaler's update rule (_amp_update_scale_). */
#ifndef TUNEGRAPH_LOSS_SCALE_H
#define TUNEGRAPH_LOSS_SCALE_H

#include <math.h>

#include "kernels/philox.h" /* TG_HOST_DEVICE */

/* The scale and growth tracker after a step whose (unscaled) gradient norm is `norm`: an
 * overflow (a norm that is not finite) backs the scale off and restarts the count; a
 * finite one counts, and growth_interval finite steps in a row grow the scale. The tracker
 * is a float holding a small whole number (exact below 2^24). */
TG_HOST_DEVICE static inline void tg_loss_scale_step(float norm, float growth_factor, float backoff_factor,
                                                     int64_t growth_interval, float *scale, float *tracker) {
    if (!isfinite(norm)) {
        *scale = *scale * backoff_factor;
        *tracker = 0.0f;
        return;
    }
    const float counted = *tracker + 1.0f;
    if (counted >= (float)growth_interval) {
        *scale = *scale * growth_factor;
        *tracker = 0.0f;
    } else {
        *tracker = counted;
    }
}

#endif
