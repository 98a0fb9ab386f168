/* Masked-LM masking of one position (MLM_MASK, plan/ops.def), header-only so the CPU
 * reference and the CUDA kernel make bit-identical masks: the decision reads only the
 * position's id and mask and the four uniforms of Philox block `element` of stream
 * (seed, step, key) (kernels/philox.h), never the thread layout. HF's
 * DataCollatorForLanguageModeling.torch_mask_tokens draws its three Bernoullis and the
 * random word from torch's generator; the rule is the same (selected with probability p,
 * then 80% [MASK], 10% a random id, 10% unchanged), the stream is this one. */
#ifndef TUNEGRAPH_MLM_MASK_H
#define TUNEGRAPH_MLM_MASK_H

#include <stdint.h>

#include "kernels/philox.h"
#include "plan/ops.h"

/* The seed of the eval masks ("mlm_eval"): an eval masks the same positions of the same
 * batch on every run and at every point of a run, so its losses compare. */
#define TG_MLM_EVAL_SEED UINT64_C(0x6D6C6D5F6576616C)

/* The stream of an op with the optional stream input (in3, int32 [4], written by the host
 * with each batch: the stream's step, the first element, and the seed's low and high 32
 * bits): in training (seed, step), in eval (TG_MLM_EVAL_SEED, step); position e of the
 * batch is element first + e. A window of micro-batches (grad_accumulation) gives micro-batch
 * k the first element k x n, so its rows get the masks the same rows get in one batch of
 * the whole window; eval batch b gets step b, so each eval batch has masks of its own. */
TG_HOST_DEVICE static inline void tg_mlm_stream_of(const int32_t *stream, int training, uint64_t *seed,
                                                   uint64_t *step, uint64_t *first) {
    *seed = training ? (uint64_t)(uint32_t)stream[3] << 32 | (uint32_t)stream[2] : TG_MLM_EVAL_SEED;
    *step = (uint32_t)stream[0];
    *first = (uint32_t)stream[1];
}

/* Whether id is one of the op's special ids (the mask id among them). */
TG_HOST_DEVICE static inline int tg_mlm_is_special(const tg_mlm_mask_params *p, int32_t id) {
    return id == p->mask_id || id == p->special0 || id == p->special1 || id == p->special2 || id == p->special3 ||
           id == p->special4;
}

/* Position `element`: its id and attention mask value in, its masked id and label out. */
TG_HOST_DEVICE static inline void tg_mlm_mask_element(const tg_mlm_mask_params *p, uint64_t seed, uint64_t step,
                                                      uint64_t element, int32_t id, float mask, int32_t *out_id,
                                                      int32_t *label) {
    *out_id = id;
    *label = TG_IGNORE_INDEX;
    if (mask == 0.0f || tg_mlm_is_special(p, id)) return;
    float u[4];
    tg_philox_uniform4(seed, step, (uint32_t)p->key, element, u);
    if (!(u[0] < p->p)) return;
    *label = id;
    if (u[1] < 0.8f) {
        *out_id = (int32_t)p->mask_id;
    } else if (u[2] < 0.5f) {
        /* u3's 24 bits (exact in a float) scaled to [0, vocab) in integers: no rounding. */
        const uint64_t bits = (uint64_t)(u[3] * 16777216.0f);
        *out_id = (int32_t)((bits * (uint64_t)p->vocab) >> 24);
    }
}

#endif
