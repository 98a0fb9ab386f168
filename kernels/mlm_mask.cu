/* MLM_MASK: one thread per position, each through kernels/mlm_mask.h (the CPU reference's
 * code), so the masks equal the CPU's bit for bit. The step counter, or the stream input
 * where the op has one, is read on the device, so a captured step masks each replay with
 * its own batch's stream. */
#include "kernels/cuda_common.cuh"
#include "kernels/mlm_mask.h"

#define MLM_THREADS 256

__global__ void __launch_bounds__(MLM_THREADS)
mlm_mask_kernel(tg_mlm_mask_params p, const int32_t *__restrict__ ids, const float *__restrict__ mask,
                const float *__restrict__ step_ptr, const int32_t *__restrict__ stream, int32_t *__restrict__ out,
                int32_t *__restrict__ labels, uint64_t seed, int training) {
    uint64_t step = training ? tg_dropout_step(step_ptr) : 0, first = 0;
    if (stream) tg_mlm_stream_of(stream, training, &seed, &step, &first);
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
        tg_mlm_mask_element(&p, seed, step, first + (uint64_t)i, ids[i], mask[i], &out[i], &labels[i]);
}

int tg_launch_mlm_mask(const tg_cuda_op_args *a, tg_err *err) {
    const tg_mlm_mask_params *p = &a->op->p.mlm_mask;
    if (p->n <= 0) return 0;
    const uint64_t seed = a->training ? a->ctx->seed : TG_MLM_EVAL_SEED;
    mlm_mask_kernel<<<tg_blocks(p->n, MLM_THREADS), MLM_THREADS, 0, a->ctx->stream>>>(
        *p, (const int32_t *)a->in[0], (const float *)a->in[1], (const float *)a->in[2], (const int32_t *)a->in[3],
        (int32_t *)a->out[0], (int32_t *)a->out[1], seed, a->training);
    (void)err;
    return 0;
}
