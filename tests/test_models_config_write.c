/* config.json as written for an export (models/config_write.c): the Hugging Face class of
 * each architecture and task, the fields of BERT and GPT-2 under their own names (floats as
 * their shortest decimal, null where transformers derives the value), the special token
 * ids, the label maps and the names they refuse, and every allocation failed in turn. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "models/model_config.h"
#include "tests/harness.h"

#define CHECK_MSG(err, s) CHECK(strstr((err).msg, (s)) != NULL, "message '%s' lacks '%s'", (err).msg, (s))

TG_TEST(test_models_config_write_architectures) {
    CHECK(!strcmp(tg_hf_architecture(TG_ARCH_BERT, TG_TASK_CLASSIFY), "BertForSequenceClassification") &&
              !strcmp(tg_hf_architecture(TG_ARCH_ROBERTA, TG_TASK_CLASSIFY), "RobertaForSequenceClassification") &&
              !strcmp(tg_hf_architecture(TG_ARCH_GPT2, TG_TASK_CLASSIFY), "GPT2ForSequenceClassification") &&
              !strcmp(tg_hf_architecture(TG_ARCH_GPT2, TG_TASK_LM), "GPT2LMHeadModel") &&
              !strcmp(tg_hf_architecture(TG_ARCH_BERT, TG_TASK_MLM), "BertForMaskedLM") &&
              !strcmp(tg_hf_architecture(TG_ARCH_ROBERTA, TG_TASK_MLM), "RobertaForMaskedLM"),
          "class names");
    CHECK(tg_hf_architecture(TG_ARCH_BERT, TG_TASK_LM) == NULL && tg_hf_architecture(-1, TG_TASK_LM) == NULL &&
              tg_hf_architecture(TG_ARCH_GPT2, TG_TASK_MLM) == NULL &&
              tg_hf_architecture(TG_ARCH_COUNT, TG_TASK_LM) == NULL &&
              tg_hf_architecture(TG_ARCH_GPT2, -1) == NULL && tg_hf_architecture(TG_ARCH_GPT2, TG_TASK_COUNT) == NULL,
          "pairs without a class");
}

/* Parses the text (and frees it); NULL after a failed CHECK. */
static json_t *parsed(char *text, const tg_err *err) {
    if (!CHECK(text != NULL, "no config: %s", err->msg)) return NULL;
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    CHECK(root && strstr(text, "{\n  \"") == text, "config text: %.200s", text);
    free(text);
    return root;
}

static double real_of(json_t *c, const char *key) { return json_real_value(json_object_get(c, key)); }

TG_TEST(test_models_config_write_bert_fields) {
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-bert", &m, &err) == 0, "%s", err.msg);
    m.layer_norm_eps = 1e-12f, m.initializer_range = 0.111122616f; /* needs all 9 digits */
    m.hidden_dropout = 0.1f, m.classifier_dropout = 0.25f, m.gelu = TG_GELU_TANH;
    const char *const labels[] = {"neg", "pos", "mixed"};
    tg_hf_head h = {TG_TASK_CLASSIFY, 3, labels, 0, 5, -1};
    json_t *c = parsed(tg_model_config_hf_json(&m, &h, &err), &err);
    REQUIRE(c, "bert config");
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)),
                  "BertForSequenceClassification") &&
              !strcmp(json_string_value(json_object_get(c, "model_type")), "bert") &&
              !strcmp(json_string_value(json_object_get(c, "hidden_act")), "gelu_new") &&
              !strcmp(json_string_value(json_object_get(c, "torch_dtype")), "float32"),
          "names");
    CHECK(json_integer_value(json_object_get(c, "hidden_size")) == m.hidden &&
              json_integer_value(json_object_get(c, "vocab_size")) == m.vocab_size &&
              json_integer_value(json_object_get(c, "pad_token_id")) == 0 &&
              json_integer_value(json_object_get(c, "bos_token_id")) == 5 && !json_object_get(c, "eos_token_id"),
          "sizes and ids");
    /* the shortest decimal that reads back as the float, as a double: 1e-12, not 9.99999996e-13 */
    CHECK(real_of(c, "layer_norm_eps") == 1e-12 && real_of(c, "hidden_dropout_prob") == 0.1 &&
              real_of(c, "classifier_dropout") == 0.25 && real_of(c, "initializer_range") == 0.111122616,
          "floats: %.17g %.17g %.17g %.17g", real_of(c, "layer_norm_eps"), real_of(c, "hidden_dropout_prob"),
          real_of(c, "classifier_dropout"), real_of(c, "initializer_range"));
    json_t *id2label = json_object_get(c, "id2label"), *label2id = json_object_get(c, "label2id");
    CHECK(json_object_size(id2label) == 3 && !strcmp(json_string_value(json_object_get(id2label, "2")), "mixed") &&
              json_integer_value(json_object_get(label2id, "pos")) == 1 &&
              json_integer_value(json_object_get(c, "num_labels")) == 3 &&
              !strcmp(json_string_value(json_object_get(c, "problem_type")), "single_label_classification"),
          "labels");
    json_decref(c);

    /* classifier_dropout equal to the hidden dropout is null; no pad id, no label names */
    m.classifier_dropout = m.hidden_dropout, m.gelu = TG_GELU_ERF;
    h = (tg_hf_head){TG_TASK_CLASSIFY, 2, NULL, -1, -1, 1000000};
    c = parsed(tg_model_config_hf_json(&m, &h, &err), &err);
    REQUIRE(c, "bert config");
    CHECK(json_is_null(json_object_get(c, "classifier_dropout")) && !json_object_get(c, "pad_token_id") &&
              !json_object_get(c, "bos_token_id") && !json_object_get(c, "eos_token_id") &&
              !strcmp(json_string_value(json_object_get(c, "hidden_act")), "gelu") &&
              !strcmp(json_string_value(json_object_get(json_object_get(c, "id2label"), "1")), "LABEL_1"),
          "defaults");
    json_decref(c);
}

TG_TEST(test_models_config_write_gpt2_fields) {
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-gpt2", &m, &err) == 0, "%s", err.msg);
    m.intermediate = 4 * m.hidden;
    tg_hf_head h = {TG_TASK_LM, 0, NULL, -1, -1, 2};
    json_t *c = parsed(tg_model_config_hf_json(&m, &h, &err), &err);
    REQUIRE(c, "gpt2 config");
    /* inside a small vocabulary: bos null (50256 would be past it), eos the model's own */
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), "GPT2LMHeadModel") &&
              json_is_null(json_object_get(c, "n_inner")) && json_is_null(json_object_get(c, "bos_token_id")) &&
              json_integer_value(json_object_get(c, "eos_token_id")) == 2 &&
              json_integer_value(json_object_get(c, "n_embd")) == m.hidden && !json_object_get(c, "id2label") &&
              json_is_true(json_object_get(c, "scale_attn_weights")),
          "gpt2 LM");
    json_decref(c);

    /* a vocabulary that holds 50256: the ids are left to transformers' default */
    m.intermediate = 3 * m.hidden, m.vocab_size = 50257;
    h.bos_token_id = h.eos_token_id = 50257;
    c = parsed(tg_model_config_hf_json(&m, &h, &err), &err);
    REQUIRE(c, "gpt2 config");
    CHECK(json_integer_value(json_object_get(c, "n_inner")) == 3 * m.hidden && !json_object_get(c, "bos_token_id") &&
              !json_object_get(c, "eos_token_id"),
          "gpt2 large vocabulary");
    json_decref(c);
}

typedef struct bad_head {
    int arch;
    tg_hf_head head;
    const char *want;
} bad_head;

static const char *const k_empty[] = {"a", ""};
static const char *const k_null[] = {NULL, "b"};
static const char *const k_twice[] = {"x", "y", "x"};
static const char *const k_utf8[] = {"ok", "\xff"};

TG_TEST(test_models_config_write_refused) {
    const bad_head cases[] = {
        {TG_ARCH_BERT, {TG_TASK_LM, 0, NULL, -1, -1, -1}, "a bert model with task lm has no Hugging Face class here"},
        {TG_ARCH_BERT, {TG_TASK_CLASSIFY, 0, NULL, -1, -1, -1}, "a classification head needs num_labels >= 1 (got 0)"},
        {TG_ARCH_BERT, {TG_TASK_CLASSIFY, 2, k_empty, -1, -1, -1}, "label 1: the name is empty"},
        {TG_ARCH_BERT, {TG_TASK_CLASSIFY, 2, k_null, -1, -1, -1}, "label 0: the name is empty"},
        {TG_ARCH_BERT, {TG_TASK_CLASSIFY, 3, k_twice, -1, -1, -1},
         "label 2: the name 'x' is also label 0's: each label needs a name of its own"},
        {TG_ARCH_BERT, {TG_TASK_CLASSIFY, 2, k_utf8, -1, -1, -1}, "label 1: the name is not valid UTF-8"},
    };
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-bert", &m, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        m.arch = cases[i].arch;
        memset(&err, 0, sizeof err);
        char *text = tg_model_config_hf_json(&m, &cases[i].head, &err);
        CHECK(text == NULL && strstr(err.msg, cases[i].want), "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
        free(text);
    }
}

/* Every allocation of a classifier's config failed in turn: NULL and "out of memory". */
TG_TEST(test_models_config_write_out_of_memory) {
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-bert", &m, &err) == 0, "%s", err.msg);
    const char *const labels[] = {"neg", "pos"};
    const tg_hf_head h = {TG_TASK_CLASSIFY, 2, labels, 0, 1, 2};
    tg_alloc_fail_after(-1);
    char *text = tg_model_config_hf_json(&m, &h, &err);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(text && total > 10, "%ld allocations: %s", total, err.msg);
    free(text);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        text = tg_model_config_hf_json(&m, &h, &err);
        tg_alloc_fail_after(-1);
        CHECK(!text && !strcmp(err.msg, "out of memory"), "allocation %ld of %ld failing: '%s'", k, total, err.msg);
        free(text);
    }
}

/* Each allocation alone failed (the later ones succeeding again), for an encoder's and a
 * GPT-2's config: a single key left unset is still "out of memory", never a config that
 * lacks it. */
TG_TEST(test_models_config_write_each_allocation_failing_alone) {
    const char *const presets[] = {"tiny-bert", "tiny-gpt2"};
    const char *const labels[] = {"neg", "pos"};
    for (int p = 0; p < 2; p++) {
        tg_model_config m;
        tg_err err = {{0}};
        REQUIRE(tg_model_config_load(presets[p], &m, &err) == 0, "%s", err.msg);
        const tg_hf_head h = {TG_TASK_CLASSIFY, 2, labels, 0, 1, 2};
        tg_alloc_fail_after(-1);
        char *text = tg_model_config_hf_json(&m, &h, &err);
        const long total = tg_alloc_fail_after(-1);
        REQUIRE(text && total > 10, "%s: %ld allocations: %s", presets[p], total, err.msg);
        free(text);
        for (long k = 0; k < total; k++) {
            memset(&err, 0, sizeof err);
            tg_alloc_fail_only(k);
            text = tg_model_config_hf_json(&m, &h, &err);
            tg_alloc_fail_after(-1);
            CHECK(!text && !strcmp(err.msg, "out of memory"), "%s: allocation %ld of %ld failing alone: '%s'",
                  presets[p], k, total, err.msg);
            free(text);
        }
    }
}

/* The label maps are allocated before any name is looked at: a classification head whose
 * first name is empty gets "out of memory" when either map (or anything before them) cannot
 * be allocated, and the name's own refusal only with both in hand. */
TG_TEST(test_models_config_write_label_maps_before_names) {
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-bert", &m, &err) == 0, "%s", err.msg);
    const char *const labels[] = {"", "pos"};
    const tg_hf_head h = {TG_TASK_CLASSIFY, 2, labels, 0, -1, -1};
    tg_alloc_fail_after(-1);
    char *text = tg_model_config_hf_json(&m, &h, &err);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(!text && !strcmp(err.msg, "label 0: the name is empty") && total > 2, "%ld allocations: '%s'", total,
            err.msg);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        text = tg_model_config_hf_json(&m, &h, &err);
        tg_alloc_fail_after(-1);
        CHECK(!text && !strcmp(err.msg, "out of memory"), "allocation %ld of %ld failing alone: '%s'", k, total,
              err.msg);
        free(text);
    }
}
