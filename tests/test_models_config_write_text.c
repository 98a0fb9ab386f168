/* config.json as written for an export (models/config_write.c), compared whole: every key
 * of a BERT classifier's and a GPT-2 LM's config, in sorted order with two-space indent, and
 * nothing else. */
#include <stdlib.h>
#include <string.h>

#include "models/model_config.h"
#include "tests/harness.h"

static void set_sizes(tg_model_config *m) {
    m->vocab_size = 128, m->hidden = 32, m->layers = 2, m->heads = 4, m->max_positions = 64;
    m->layer_norm_eps = 1e-12f, m->initializer_range = 0.02f, m->hidden_dropout = 0.1f;
}

static void check_text(const char *what, char *text, const tg_err *err, const char *want) {
    if (!CHECK(text != NULL, "%s: %s", what, err->msg)) return;
    CHECK(!strcmp(text, want), "%s: got\n%s\nwant\n%s", what, text, want);
    free(text);
}

TG_TEST(test_models_config_write_bert_text) {
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-bert", &m, &err) == 0, "%s", err.msg);
    set_sizes(&m);
    m.intermediate = 64, m.type_vocab_size = 2;
    m.attention_dropout = 0.05f, m.classifier_dropout = 0.25f, m.gelu = TG_GELU_ERF;
    const char *const labels[] = {"neg", "pos"};
    tg_hf_head h = {TG_TASK_CLASSIFY, 2, labels, 0, 1, 2};
    check_text("bert", tg_model_config_hf_json(&m, &h, &err), &err,
               "{\n"
               "  \"architectures\": [\n"
               "    \"BertForSequenceClassification\"\n"
               "  ],\n"
               "  \"attention_probs_dropout_prob\": 0.05,\n"
               "  \"bos_token_id\": 1,\n"
               "  \"classifier_dropout\": 0.25,\n"
               "  \"eos_token_id\": 2,\n"
               "  \"hidden_act\": \"gelu\",\n"
               "  \"hidden_dropout_prob\": 0.1,\n"
               "  \"hidden_size\": 32,\n"
               "  \"id2label\": {\n"
               "    \"0\": \"neg\",\n"
               "    \"1\": \"pos\"\n"
               "  },\n"
               "  \"initializer_range\": 0.02,\n"
               "  \"intermediate_size\": 64,\n"
               "  \"label2id\": {\n"
               "    \"neg\": 0,\n"
               "    \"pos\": 1\n"
               "  },\n"
               "  \"layer_norm_eps\": 1e-12,\n"
               "  \"max_position_embeddings\": 64,\n"
               "  \"model_type\": \"bert\",\n"
               "  \"num_attention_heads\": 4,\n"
               "  \"num_hidden_layers\": 2,\n"
               "  \"num_labels\": 2,\n"
               "  \"pad_token_id\": 0,\n"
               "  \"position_embedding_type\": \"absolute\",\n"
               "  \"problem_type\": \"single_label_classification\",\n"
               "  \"torch_dtype\": \"float32\",\n"
               "  \"type_vocab_size\": 2,\n"
               "  \"vocab_size\": 128\n"
               "}");
}

TG_TEST(test_models_config_write_gpt2_text) {
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-gpt2", &m, &err) == 0, "%s", err.msg);
    set_sizes(&m);
    m.intermediate = 4 * 32, m.layer_norm_eps = 1e-5f;
    m.attention_dropout = 0.2f, m.embedding_dropout = 0.3f, m.gelu = TG_GELU_TANH;
    tg_hf_head h = {TG_TASK_LM, 0, NULL, -1, 1, 2};
    check_text("gpt2", tg_model_config_hf_json(&m, &h, &err), &err,
               "{\n"
               "  \"activation_function\": \"gelu_new\",\n"
               "  \"architectures\": [\n"
               "    \"GPT2LMHeadModel\"\n"
               "  ],\n"
               "  \"attn_pdrop\": 0.2,\n"
               "  \"bos_token_id\": 1,\n"
               "  \"embd_pdrop\": 0.3,\n"
               "  \"eos_token_id\": 2,\n"
               "  \"initializer_range\": 0.02,\n"
               "  \"layer_norm_epsilon\": 1e-5,\n"
               "  \"model_type\": \"gpt2\",\n"
               "  \"n_embd\": 32,\n"
               "  \"n_head\": 4,\n"
               "  \"n_inner\": null,\n"
               "  \"n_layer\": 2,\n"
               "  \"n_positions\": 64,\n"
               "  \"reorder_and_upcast_attn\": false,\n"
               "  \"resid_pdrop\": 0.1,\n"
               "  \"scale_attn_by_inverse_layer_idx\": false,\n"
               "  \"scale_attn_weights\": true,\n"
               "  \"torch_dtype\": \"float32\",\n"
               "  \"vocab_size\": 128\n"
               "}");
}
