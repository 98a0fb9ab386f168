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
