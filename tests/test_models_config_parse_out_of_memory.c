/* tg_model_config_parse (models/model_config.c) with each allocation failing alone in
 * turn: the refusal says what ran out (reading the file, or parsing the JSON), never that
 * the JSON is invalid, and parsing with no allocation failing reads the model. */
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "models/model_config.h"
#include "tests/harness.h"

static const char k_config[] =
    "{\"model_type\": \"bert\", \"vocab_size\": 128, \"hidden_size\": 32, \"num_hidden_layers\": 2,\n"
    " \"num_attention_heads\": 4, \"intermediate_size\": 64, \"max_position_embeddings\": 64,\n"
    " \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", \"layer_norm_eps\": 1e-12,\n"
    " \"hidden_dropout_prob\": 0.1, \"attention_probs_dropout_prob\": 0.1, \"pad_token_id\": 0,\n"
    " \"id2label\": {\"0\": \"neg\", \"1\": \"pos\"}, \"architectures\": [\"BertForSequenceClassification\"]}\n";

TG_TEST(test_models_config_parse_out_of_memory) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", tg_test_tmpdir());
    REQUIRE(tg_test_write_file(path, k_config) == 0, "cannot write %s", path);
    char want_parse[1200], want_read[1200];
    snprintf(want_parse, sizeof want_parse, "%s: out of memory parsing the JSON", path);
    snprintf(want_read, sizeof want_read, "%s: out of memory", path);
    int parse_failures = 0, other = 0;
    long k = 0;
    for (; k < 10000; k++) {
        tg_model_config cfg;
        tg_err err = {{0}};
        const long before = tg_alloc_failures();
        tg_alloc_fail_only(k);
        const int rc = tg_model_config_parse(path, &cfg, &err);
        tg_alloc_fail_after(-1);
        if (tg_alloc_failures() == before) {
            CHECK(rc == 0 && cfg.arch == TG_ARCH_BERT && cfg.hidden == 32 && cfg.layers == 2 && cfg.heads == 4 &&
                      cfg.intermediate == 64 && cfg.vocab_size == 128,
                  "no allocation failing: rc %d, '%s'", rc, err.msg);
            break;
        }
        if (!CHECK(rc == -1, "allocation %ld failing: parsed", k)) continue;
        if (!strcmp(err.msg, want_parse)) parse_failures++;
        else if (!CHECK(!strcmp(err.msg, want_read), "allocation %ld failing: '%s'", k, err.msg)) other++;
    }
    CHECK(parse_failures > 10 && !other && k > parse_failures, "%d failures parsing the JSON, %d others, %ld allocations",
          parse_failures, other, k);
}
