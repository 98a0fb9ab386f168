/* IMAGE_INPUT (plan/ops.def): the batch's stored pixel planes (bytes) to the model's
 * channels-last input, normalised and, in training, augmented by the draws of
 * kernels/image_input.h, which the CPU reference shares: the same bits on both.
 *
 * A thread per output pixel (all its channels): neighbouring threads read neighbouring
 * bytes of a plane (mirrored for a flipped image) and write neighbouring values. Each
 * thread makes its image's draw itself (one Philox block: cheaper than a pass to share it). */
#include "kernels/cuda_common.cuh"
#include "kernels/image_input.h"

#define IMAGE_THREADS 256

template <class T>
__global__ void __launch_bounds__(IMAGE_THREADS)
image_input_kernel(const uint8_t *__restrict__ px, T *__restrict__ out, const float *__restrict__ step_counter,
                   tg_image_input_params p, uint64_t seed, int training) {
    const int64_t S = p.size, C = p.c, total = p.n * S * S;
    const float sc = step_counter ? *step_counter : 0.0f;
    const uint64_t step = sc > 0.0f ? (uint64_t)sc : 0; /* the CPU's step_counter() */
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t image = t / (S * S), y = t / S % S, x = t % S;
        const tg_image_draw d = tg_image_draw_of(&p, seed, step, training, image);
        for (int64_t ch = 0; ch < C; ch++) {
            const uint8_t v = tg_image_source(px + (image * C + ch) * S * S, S, p.crop_pad, d, y, x);
            tg_st(out, t * C + ch, tg_image_value(v, tg_image_mean(&p, ch), tg_image_std(&p, ch)));
        }
    }
}

template <class T>
static void launch(const tg_cuda_op_args *a, const tg_image_input_params *p) {
    const int64_t total = p->n * p->size * p->size;
    image_input_kernel<T><<<tg_blocks(total, IMAGE_THREADS), IMAGE_THREADS, 0, a->ctx->stream>>>(
        (const uint8_t *)a->in[0], (T *)a->out[0], (const float *)a->in[1], *p, a->ctx->seed, a->training);
}

int tg_launch_image_input(const tg_cuda_op_args *a, tg_err *err) {
    const tg_image_input_params *p = &a->op->p.image_input;
    if (p->n <= 0 || p->size <= 0) return 0;
    const int dt = a->out_dtype[0];
    if (dt == TG_BF16) launch<tg_bf16>(a, p);
    else if (dt == TG_F16) launch<tg_f16>(a, p);
    else launch<float>(a, p);
    (void)err;
    return 0;
}
