/* Exporting a plan's weights as a Hugging Face model folder that transformers loads with
 * from_pretrained: config.json (the model, its task head and label names), model.safetensors
 * (the parameters under their Hugging Face names) and the tokenizer files. A LoRA plan's
 * model.safetensors has the adapters merged in, and the subfolder TG_HF_ADAPTER_DIR holds
 * them alone as PEFT saves an adapter (peft.PeftModel.from_pretrained(base, DIR/adapter)).
 * The folder is written beside its target under a temporary name and renamed into place
 * whole, so a reader sees the old folder or the complete new one. */
#ifndef TUNEGRAPH_HF_EXPORT_H
#define TUNEGRAPH_HF_EXPORT_H

#include "base/error.h"
#include "base/output_paths.h"
#include "plan/plan.h"
#include "runtime/weights.h"

/* A LoRA export's subfolder with adapter_config.json and adapter_model.safetensors. They
 * are not beside model.safetensors: transformers (with peft installed) loads a folder
 * holding adapter_config.json as a base model plus that adapter, which over the merged
 * weights would add every adapter twice. */
#define TG_HF_ADAPTER_DIR "adapter"

typedef struct tg_hf_export_options {
    const char *out_dir;
    /* A tokenizer file Hugging Face loads by name (tokenizer.json, tokenizer_config.json,
     * special_tokens_map.json, added_tokens.json, vocab.txt, vocab.json, merges.txt) or a
     * folder holding some of them; NULL: those in the model's folder, if it has any. */
    const char *tokenizer;
    const char *const *labels; /* classify: the plan's num_labels names; NULL: LABEL_0, LABEL_1, ... */
    int n_labels;
    int force;                 /* replace an out_dir that is not empty */
    int bf16;                  /* store the weights in bf16 (rounded to nearest even) instead of fp32 */
} tg_hf_export_options;

/* The transformers class the plan's model and task export as ("BertForSequenceClassification",
 * "GPT2LMHeadModel", ...). */
const char *tg_hf_model_class(const tg_plan *plan);

/* The file names copied from a tokenizer folder, NULL-terminated. */
extern const char *const tg_hf_tokenizer_files[];

/* Everything that can be checked before the weights exist, so a run never fails after
 * training for an export it could have refused: out_dir is a folder path whose parent
 * exists and is writable, and it is absent, an empty folder, or (force) a folder; the label
 * names fit the plan (as many as num_labels, distinct, none empty; none for an LM); the
 * tokenizer files are there and readable; and none of `keep` (the files the command reads
 * or writes besides, and the plan's model files) lies inside out_dir, which the export
 * replaces. */
int tg_hf_export_check(const tg_plan *plan, const tg_hf_export_options *o, const tg_named_path *keep, int n_keep,
                       tg_err *err);

/* Writes the folder from the image's values (tg_hf_export_check's checks are made again).
 * An out_dir that was filled by someone else in between is left alone, and the new folder
 * kept under its temporary name, which the message gives. */
int tg_hf_export(const tg_weights_image *img, const tg_hf_export_options *o, tg_err *err);

#endif
