/* MLM_MASK's CPU reference: each position through kernels/mlm_mask.h, the code the CUDA
 * kernel runs, so the masks agree bit for bit. */
#include "kernels/mlm_mask.h"
#include "runtime/cpu/cpu_kernels.h"

static void mlm_mask_range(const tg_cpu_op_args *a, int64_t b, int64_t e) {
    const tg_mlm_mask_params *p = &a->op->p.mlm_mask;
    const int32_t *ids = CI32(a->in[0]);
    const float *mask = CF32(a->in[1]);
    int32_t *out = (int32_t *)a->out[0], *labels = (int32_t *)a->out[1];
    uint64_t seed = a->training ? a->seed : TG_MLM_EVAL_SEED;
    uint64_t step = a->training ? step_counter(CF32(a->in[2])) : 0, first = 0;
    if (a->in[3]) tg_mlm_stream_of(CI32(a->in[3]), a->training, &seed, &step, &first);
    for (int64_t i = b; i < e; i++)
        tg_mlm_mask_element(p, seed, step, first + (uint64_t)i, ids[i], mask[i], &out[i], &labels[i]);
}

void tg_cpu_kernel_mlm_mask(const tg_cpu_op_args *a) { tg_cpu_elementwise_parallel(a, a->op->p.mlm_mask.n, mlm_mask_range); }
