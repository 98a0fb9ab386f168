/* tg_model_config -> config.json, as transformers' save_pretrained would write it for the
 * same model and head (models/model_config.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "models/model_config.h"

const char *tg_hf_architecture(int arch, int task) {
    static const char *const names[TG_ARCH_COUNT][TG_TASK_COUNT] = {
        [TG_ARCH_BERT] = {[TG_TASK_CLASSIFY] = "BertForSequenceClassification", [TG_TASK_MLM] = "BertForMaskedLM",
                          [TG_TASK_QA] = "BertForQuestionAnswering"},
        [TG_ARCH_ROBERTA] = {[TG_TASK_CLASSIFY] = "RobertaForSequenceClassification",
                             [TG_TASK_MLM] = "RobertaForMaskedLM", [TG_TASK_QA] = "RobertaForQuestionAnswering"},
        [TG_ARCH_GPT2] = {[TG_TASK_CLASSIFY] = "GPT2ForSequenceClassification", [TG_TASK_LM] = "GPT2LMHeadModel"},
        [TG_ARCH_LLAMA] = {[TG_TASK_CLASSIFY] = "LlamaForSequenceClassification", [TG_TASK_LM] = "LlamaForCausalLM"},
        /* torchvision's class: its state dict is what the weights file holds */
        [TG_ARCH_MOBILENET_V2] = {[TG_TASK_CLASSIFY] = "MobileNetV2"},
    };
    if (arch < 0 || arch >= TG_ARCH_COUNT || task < 0 || task >= TG_TASK_COUNT) return NULL;
    return names[arch][task];
}

/* The shortest decimal that reads back as f (at most 9 digits do), as a JSON number: the
 * file then says 1e-12 and 0.1, not 9.99999996e-13 and 0.100000001. */
static json_t *float_number(float f) {
    char text[32];
    int digits = 0;
    do snprintf(text, sizeof text, "%.*g", ++digits, (double)f);
    while (digits < 9 && strtof(text, NULL) != f);
    return json_real(strtod(text, NULL));
}

static const char *gelu_name(int32_t gelu) { return gelu == TG_GELU_TANH ? "gelu_new" : "gelu"; }

/* Sets key to value (taking the reference); 0, or -1 when out of memory. */
static int set(json_t *obj, const char *key, json_t *value) { return value ? json_object_set_new(obj, key, value) : -1; }

static int put_encoder(json_t *c, const tg_model_config *m) {
    return set(c, "vocab_size", json_integer(m->vocab_size)) | set(c, "hidden_size", json_integer(m->hidden)) |
           set(c, "num_hidden_layers", json_integer(m->layers)) |
           set(c, "num_attention_heads", json_integer(m->heads)) |
           set(c, "intermediate_size", json_integer(m->intermediate)) |
           set(c, "max_position_embeddings", json_integer(m->max_positions)) |
           set(c, "type_vocab_size", json_integer(m->type_vocab_size)) |
           set(c, "hidden_act", json_string(gelu_name(m->gelu))) |
           set(c, "layer_norm_eps", float_number(m->layer_norm_eps)) |
           set(c, "initializer_range", float_number(m->initializer_range)) |
           set(c, "hidden_dropout_prob", float_number(m->hidden_dropout)) |
           set(c, "attention_probs_dropout_prob", float_number(m->attention_dropout)) |
           /* null: the hidden dropout, as the config read it */
           set(c, "classifier_dropout",
               m->classifier_dropout == m->hidden_dropout ? json_null() : float_number(m->classifier_dropout)) |
           set(c, "position_embedding_type", json_string("absolute"));
}

static int put_gpt2(json_t *c, const tg_model_config *m) {
    return set(c, "vocab_size", json_integer(m->vocab_size)) | set(c, "n_embd", json_integer(m->hidden)) |
           set(c, "n_layer", json_integer(m->layers)) | set(c, "n_head", json_integer(m->heads)) |
           /* null: 4 x n_embd, as the config read it */
           set(c, "n_inner", m->intermediate == 4 * m->hidden ? json_null() : json_integer(m->intermediate)) |
           set(c, "n_positions", json_integer(m->max_positions)) |
           set(c, "activation_function", json_string(gelu_name(m->gelu))) |
           set(c, "layer_norm_epsilon", float_number(m->layer_norm_eps)) |
           set(c, "initializer_range", float_number(m->initializer_range)) |
           set(c, "resid_pdrop", float_number(m->hidden_dropout)) |
           set(c, "attn_pdrop", float_number(m->attention_dropout)) |
           set(c, "embd_pdrop", float_number(m->embedding_dropout)) |
           set(c, "scale_attn_weights", json_true()) | set(c, "scale_attn_by_inverse_layer_idx", json_false()) |
           set(c, "reorder_and_upcast_attn", json_false());
}

/* The rotary settings as Llama 3 folders spell them: rope_theta and rope_scaling (null,
 * or llama3's object). */
static int put_rope(json_t *c, const tg_model_config *m) {
    if (set(c, "rope_theta", float_number(m->rope_theta))) return -1;
    if (m->rope_type != TG_ROPE_LLAMA3) return set(c, "rope_scaling", json_null());
    json_t *r = json_object();
    if (!r) return -1;
    if (set(r, "rope_type", json_string("llama3")) | set(r, "factor", float_number(m->rope_factor)) |
        set(r, "low_freq_factor", float_number(m->rope_low_freq_factor)) |
        set(r, "high_freq_factor", float_number(m->rope_high_freq_factor)) |
        set(r, "original_max_position_embeddings", json_integer(m->rope_original_max_positions))) {
        json_decref(r);
        return -1;
    }
    return set(c, "rope_scaling", r);
}

static int put_llama(json_t *c, const tg_model_config *m) {
    return set(c, "vocab_size", json_integer(m->vocab_size)) | set(c, "hidden_size", json_integer(m->hidden)) |
           set(c, "num_hidden_layers", json_integer(m->layers)) |
           set(c, "num_attention_heads", json_integer(m->heads)) |
           set(c, "num_key_value_heads", json_integer(m->kv_heads)) |
           set(c, "head_dim", json_integer(m->hidden / m->heads)) |
           set(c, "intermediate_size", json_integer(m->intermediate)) |
           set(c, "max_position_embeddings", json_integer(m->max_positions)) |
           set(c, "hidden_act", json_string("silu")) | set(c, "rms_norm_eps", float_number(m->layer_norm_eps)) |
           set(c, "initializer_range", float_number(m->initializer_range)) |
           set(c, "attention_dropout", float_number(m->attention_dropout)) |
           set(c, "attention_bias", json_false()) | set(c, "mlp_bias", json_false()) |
           set(c, "pretraining_tp", json_integer(1)) |
           set(c, "tie_word_embeddings", json_boolean(m->tie_word_embeddings)) | put_rope(c, m);
}

/* tunegraph's mobilenet_v2 config (models/model_config.c parse_mobilenet_v2). */
static int put_mobilenet_v2(json_t *c, const tg_model_config *m) {
    return set(c, "image_channels", json_integer(m->image_channels)) | set(c, "image_size", json_integer(m->image_size)) |
           set(c, "width_mult", float_number(m->width_mult)) |
           set(c, "classifier_dropout", float_number(m->classifier_dropout)) |
           set(c, "batch_norm_eps", float_number(m->layer_norm_eps)) |
           set(c, "batch_norm_momentum", float_number(m->batch_norm_momentum));
}

/* bos_token_id or eos_token_id: the model's own, else null where transformers' default
 * (GPT2Config's 50256) would lie outside the vocabulary. */
static int put_special(json_t *c, const char *key, int32_t id, const tg_model_config *m) {
    if (id >= 0 && id < m->vocab_size) return set(c, key, json_integer(id));
    if (m->arch == TG_ARCH_GPT2 && m->vocab_size <= 50256) return set(c, key, json_null());
    return 0;
}

/* id2label, label2id, num_labels and problem_type; label names must be distinct and not
 * empty (label2id maps each back to its index). */
static int put_labels(json_t *c, const tg_hf_head *h, tg_err *err) {
    const long failed = tg_alloc_failures();
    json_t *id2label = json_object(), *label2id = json_object();
    int rc = !id2label || !label2id ? tg_fail(err, "out of memory") : 0;
    for (int i = 0; i < h->num_labels && !rc; i++) {
        char id[16], fallback[32];
        snprintf(id, sizeof id, "%d", i);
        snprintf(fallback, sizeof fallback, "LABEL_%d", i);
        const char *name = h->labels ? h->labels[i] : fallback;
        if (!name || !name[0]) rc = tg_fail(err, "label %d: the name is empty", i);
        else if (json_object_get(label2id, name))
            rc = tg_fail(err, "label %d: the name '%s' is also label %lld's: each label needs a name of its own", i,
                         name, (long long)json_integer_value(json_object_get(label2id, name)));
        else if (set(id2label, id, json_string(name)) || set(label2id, name, json_integer(i)))
            /* jansson fails the same way out of memory */
            rc = tg_alloc_failures() != failed ? tg_fail(err, "out of memory")
                                              : tg_fail(err, "label %d: the name is not valid UTF-8", i);
    }
    if (!rc && (set(c, "id2label", id2label) | set(c, "label2id", label2id) |
                set(c, "num_labels", json_integer(h->num_labels)) |
                set(c, "problem_type", json_string("single_label_classification"))))
        return tg_fail(err, "out of memory");
    if (rc) {
        json_decref(id2label);
        json_decref(label2id);
    }
    return rc;
}

char *tg_model_config_hf_json(const tg_model_config *cfg, const tg_hf_head *head, tg_err *err) {
    const char *arch = tg_hf_architecture(cfg->arch, head->task);
    if (!arch) {
        tg_fail(err, "a %s model with task %s has no Hugging Face class here", tg_arch_name(cfg->arch),
                tg_task_name(head->task));
        return NULL;
    }
    if (head->task == TG_TASK_CLASSIFY && head->num_labels < 1) {
        tg_fail(err, "a classification head needs num_labels >= 1 (got %d)", head->num_labels);
        return NULL;
    }
    json_t *c = json_object(), *archs = json_array();
    int rc = 0;
    if (!c || !archs || json_array_append_new(archs, json_string(arch))) {
        json_decref(archs);
        rc = tg_fail(err, "out of memory");
    } else if (set(c, "architectures", archs) | set(c, "model_type", json_string(tg_arch_name(cfg->arch))) |
               (cfg->arch == TG_ARCH_GPT2           ? put_gpt2(c, cfg)
                : cfg->arch == TG_ARCH_LLAMA        ? put_llama(c, cfg)
                : cfg->arch == TG_ARCH_MOBILENET_V2 ? put_mobilenet_v2(c, cfg)
                                                    : put_encoder(c, cfg)) |
               (head->pad_token_id >= 0 ? set(c, "pad_token_id", json_integer(head->pad_token_id)) : 0) |
               put_special(c, "bos_token_id", head->bos_token_id, cfg) |
               put_special(c, "eos_token_id", head->eos_token_id, cfg) |
               set(c, "torch_dtype", json_string("float32"))) {
        rc = tg_fail(err, "out of memory");
    }
    if (!rc && head->task == TG_TASK_CLASSIFY) rc = put_labels(c, head, err);
    char *text = NULL;
    /* Sorted keys, two-space indent: the layout save_pretrained writes. jansson's dump goes
     * on past some failed growths of its buffer with the bytes dropped (a key cut short), so
     * a text made while an allocation failed is not the config either. */
    const long failed = tg_alloc_failures();
    if (!rc && (!(text = json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9))) ||
                tg_alloc_failures() != failed)) {
        free(text);
        text = NULL;
        tg_fail(err, "out of memory");
    }
    json_decref(c);
    return text;
}
