/* Hugging Face config.json -> tg_model_config. Presets are config files in
 * models/presets/<name>/config.json, so a preset and a downloaded folder share one path. */
#ifndef TUNEGRAPH_MODEL_CONFIG_H
#define TUNEGRAPH_MODEL_CONFIG_H

#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* Limits on a config's sizes, each refused naming its field. They lie far past the models
 * these architectures come in (GPT-2 XL: 48 layers of 1,600, vocabulary 50,257; BERT-large:
 * 24 of 1,024) and keep every size derived from them, in elements or bytes, with gradients
 * and optimizer states, well inside 64 bits. */
#define TG_MODEL_MAX_HIDDEN 65536            /* hidden_size, n_embd */
#define TG_MODEL_MAX_LAYERS 4096             /* num_hidden_layers, n_layer */
#define TG_MODEL_MAX_HEADS 4096              /* num_attention_heads, n_head */
#define TG_MODEL_MAX_INTERMEDIATE 262144     /* intermediate_size, n_inner (4 x the widest hidden) */
#define TG_MODEL_MAX_VOCAB 4194304           /* vocab_size (2^22) */
#define TG_MODEL_MAX_POSITIONS 1048576       /* max_position_embeddings, n_positions (2^20) */
#define TG_MODEL_MAX_TYPE_VOCAB 1024         /* type_vocab_size */
/* Elements of any one weight (2^34: 64 GiB in fp32) and parameters of the whole model (2^40). */
#define TG_MODEL_MAX_TENSOR_ELEMENTS (INT64_C(1) << 34)
#define TG_MODEL_MAX_PARAMS (INT64_C(1) << 40)
/* config.json files are a few KB; a bigger one is not a config. */
#define TG_MODEL_CONFIG_MAX_BYTES (16 << 20)

/* source: a preset name (see tg_presets_dir) or a folder holding config.json and,
 * optionally, model.safetensors or a sharded checkpoint's model.safetensors.index.json
 * (the first there is recorded in cfg->weights). A weights file that is there but is no
 * readable regular file (a dangling link, a folder, a FIFO, no read permission) is an
 * error naming it: the model would otherwise train from random weights. */
int tg_model_config_load(const char *source, tg_model_config *cfg, tg_err *err);

/* Parses one config.json. Errors name the file and the field: invalid JSON, a key named
 * twice in an object, a missing or ill-typed field, a size past its limit above, or a
 * weight or parameter count derived from the sizes past TG_MODEL_MAX_TENSOR_ELEMENTS or
 * TG_MODEL_MAX_PARAMS. */
int tg_model_config_parse(const char *config_json_path, tg_model_config *cfg, tg_err *err);

/* The presets folder: $TUNEGRAPH_PRESETS if set, else the one compiled in. */
const char *tg_presets_dir(void);

/* ---- writing: config.json for a Hugging Face model folder (models/config_write.c) ---- */

/* The task head a written config describes. */
typedef struct tg_hf_head {
    int32_t task;              /* tg_task */
    int32_t num_labels;        /* classify: the classes */
    const char *const *labels; /* classify: num_labels distinct names; NULL: LABEL_0, LABEL_1, ... */
    int32_t pad_token_id;      /* -1: none */
    /* The model's own, carried over (tg_model_config_special_ids); -1: unknown, written as
     * null where transformers' default would lie outside the vocabulary (GPT-2's 50256 in
     * a smaller one), else left to that default. */
    int32_t bos_token_id, eos_token_id;
} tg_hf_head;

/* bos_token_id and eos_token_id of the config.json that tg_model_config_load reads for
 * `source`; -1 each where it has none (or null), or cannot be read. */
void tg_model_config_special_ids(const char *source, int32_t *bos, int32_t *eos);

/* The transformers class of that model and task ("BertForSequenceClassification",
 * "GPT2LMHeadModel", ...); NULL for a pair tunegraph does not build. */
const char *tg_hf_architecture(int arch, int task);

/* config.json text (malloc'd, NUL-terminated) that transformers reads back as this model
 * with this head: model_type, architectures, every size, dropout, activation and
 * LayerNorm field of cfg under its Hugging Face name, pad_token_id, torch_dtype float32,
 * and for classification num_labels, id2label, label2id and problem_type. Floats are
 * written as the shortest decimal that reads back as the same float32. tg_model_config_parse
 * reads the file back to the same fields. Errors: an empty or repeated label name, a head
 * tunegraph does not build. */
char *tg_model_config_hf_json(const tg_model_config *cfg, const tg_hf_head *head, tg_err *err);

#endif
