/* LoRA plans exported as Hugging Face and PEFT expect them: model.safetensors holds the
 * base weights with each adapter merged in (W + (alpha / r) B A, so transformers loads the
 * folder as a plain model), and adapter_config.json with adapter_model.safetensors hold the
 * adapters alone, as PEFT's save_pretrained writes them (names under base_model.model.). */
#ifndef TUNEGRAPH_LORA_EXPORT_H
#define TUNEGRAPH_LORA_EXPORT_H

#include "base/error.h"
#include "plan/plan.h"
#include "runtime/weights.h"

/* One adapted projection: the base weight [out, in] (nn.Linear) or [in, out] (GPT-2's
 * Conv1D: fan_in_fan_out), lora_A [r, in], lora_B [out, r] and the scale alpha / r (the
 * plan's product of B reads it as its alpha). */
typedef struct tg_lora_pair {
    int base, a, b;
    float scale;
    int fan_in_fan_out;
} tg_lora_pair;

/* The plan's adapted projections (malloc'd into *pairs, their count returned; 0 and NULL
 * for a plan without LoRA), or -1 when out of memory or a pair is incomplete. */
int tg_lora_pairs(const tg_plan *plan, tg_lora_pair **pairs, tg_err *err);

/* Whether tensor t of a LoRA plan trains whole beside the adapters: a trainable parameter
 * (not a view or copy) that is no lora_A or lora_B, i.e. a parameter of the head PEFT keeps
 * as modules_to_save (classifier, score, qa_outputs) or of a module the job's
 * lora_modules_to_save names. */
int tg_lora_head_param(const tg_plan *plan, int t);

/* W + scale B A of pair p, in the base weight's layout (W + scale (B A)^T for a weight
 * stored [in, out]), in a new buffer (malloc'd; NULL when out of memory). */
float *tg_lora_merged(const tg_weights_image *img, const tg_lora_pair *p);

/* adapter_config.json and adapter_model.safetensors in folder dir (bf16: the adapters in
 * bf16). model_source: the base model's name for base_model_name_or_path. */
int tg_lora_write_adapter(const tg_weights_image *img, const tg_lora_pair *pairs, int n, const char *dir, int bf16,
                          tg_err *err);

#endif
