/* CPU reference: IMAGE_INPUT (plan/ops.def), the batch's stored pixel planes to the model's
 * channels-last input, augmented in training as the op's draws say (kernels/image_input.h,
 * shared with the CUDA kernel). */
#include "kernels/image_input.h"
#include "runtime/cpu/cpu_kernels.h"

/* Output rows [b, e) of the n x size: every column and channel of each. */
static void image_rows(void *arg, int64_t b, int64_t e) {
    const tg_cpu_op_args *a = arg;
    const tg_image_input_params *p = &a->op->p.image_input;
    const int64_t S = p->size, C = p->c;
    const uint8_t *px = a->in[0];
    float *out = F32(a->out[0]);
    const uint64_t step = step_counter(a->in[1] ? CF32(a->in[1]) : NULL);
    for (int64_t r = b; r < e; r++) {
        const int64_t image = r / S, y = r % S;
        const tg_image_draw d = tg_image_draw_of(p, a->seed, step, a->training, image);
        float *row = out + r * S * C;
        for (int64_t ch = 0; ch < C; ch++) {
            const uint8_t *plane = px + (image * C + ch) * S * S;
            const float mean = tg_image_mean(p, ch), std = tg_image_std(p, ch);
            for (int64_t x = 0; x < S; x++)
                row[x * C + ch] = tg_image_value(tg_image_source(plane, S, p->crop_pad, d, y, x), mean, std);
        }
    }
}

void tg_cpu_kernel_image_input(const tg_cpu_op_args *a) {
    const tg_image_input_params *p = &a->op->p.image_input;
    tg_parallel_for(a->threads, p->n * p->size, image_rows, (void *)a);
}
