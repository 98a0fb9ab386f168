/* Llama's config.json (models/model_config.c: parse_llama, parse_rope): one table of small
 * Llama configs with fields set or removed, each refused with its exact message or read;
 * the values read for each form of the rotary settings (rope_parameters, rope_theta with
 * rope_scaling, null or absent, "type" for "rope_type") and of the optional fields; the
 * three presets; and the config an export writes (models/config_write.c) read back to the
 * same fields, for LM and classification heads. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model_config.h"
#include "tests/harness.h"

static const char k_llama[] = "{\"model_type\": \"llama\", \"vocab_size\": 128, \"hidden_size\": 32, "
                              "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                              "\"intermediate_size\": 48, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
                              "\"rope_theta\": 10000.0, \"rope_scaling\": null}";

/* A llama3 rope object with every field, and one without original_max_position_embeddings. */
#define L3 "\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4"
#define L3_FULL L3 ", \"original_max_position_embeddings\": 32"
#define SCALING(fields) "{\"rope_scaling\": {" fields "}}"
#define PARAMS(fields) "{\"rope_parameters\": {\"rope_theta\": 500000, " fields "}}"
#define UNSUPPORTED "' is not supported (supported: default, llama3)"

typedef struct llama_case {
    const char *set;  /* a JSON object whose members replace or join the config's */
    const char *del;  /* a field removed, or NULL */
    const char *want; /* the message after "<path>: ", or NULL: parsed */
} llama_case;

static const llama_case k_cases[] = {
    /* sizes */
    {"{}", "vocab_size", "field 'vocab_size': missing"},
    {"{\"hidden_size\": 0}", NULL, "field 'hidden_size': expected a positive integer"},
    {"{\"num_hidden_layers\": \"2\"}", NULL, "field 'num_hidden_layers': expected a positive integer"},
    {"{\"num_attention_heads\": 4097}", NULL, "field 'num_attention_heads': 4097 is past the limit of 4096"},
    {"{}", "intermediate_size", "field 'intermediate_size': missing"},
    {"{}", "max_position_embeddings", "field 'max_position_embeddings': missing"},
    /* grouped-query attention and the head width */
    {"{\"num_key_value_heads\": 0}", NULL, "field 'num_key_value_heads': expected a positive integer"},
    {"{\"num_key_value_heads\": 2.0}", NULL, "field 'num_key_value_heads': expected a positive integer"},
    {"{\"num_key_value_heads\": 4097}", NULL, "field 'num_key_value_heads': 4097 is past the limit of 4096"},
    {"{\"num_key_value_heads\": 3}", NULL,
     "field 'num_key_value_heads': num_attention_heads 4 is not a multiple of 3"},
    {"{\"num_key_value_heads\": 8}", NULL,
     "field 'num_key_value_heads': num_attention_heads 4 is not a multiple of 8"},
    {"{\"hidden_size\": 30}", NULL,
     "field 'num_attention_heads': hidden_size 30 is not divisible by num_attention_heads 4"},
    {"{\"head_dim\": 0}", NULL, "field 'head_dim': expected a positive integer"},
    {"{\"head_dim\": 65537}", NULL, "field 'head_dim': 65537 is past the limit of 65536"},
    {"{\"head_dim\": 16}", NULL, "field 'head_dim': 16 is not hidden_size / num_attention_heads = 8 (not supported)"},
    {"{\"head_dim\": 4}", NULL, "field 'head_dim': 4 is not hidden_size / num_attention_heads = 8 (not supported)"},
    /* ids, numbers, switches */
    {"{\"pad_token_id\": -1}", NULL, "field 'pad_token_id': expected a non-negative integer"},
    {"{\"pad_token_id\": 128}", NULL, "field 'pad_token_id': 128 is not below vocab_size 128"},
    {"{\"pretraining_tp\": 0}", NULL, "field 'pretraining_tp': expected a positive integer"},
    {"{\"pretraining_tp\": 2}", NULL, "field 'pretraining_tp': 2 is not supported (only 1)"},
    {"{\"rms_norm_eps\": 0}", NULL, "field 'rms_norm_eps': 0 is out of range [1e-30, 1]"},
    {"{\"rms_norm_eps\": \"1e-5\"}", NULL, "field 'rms_norm_eps': expected a number"},
    {"{\"initializer_range\": -1}", NULL, "field 'initializer_range': -1 is out of range [0, 10]"},
    {"{\"attention_dropout\": 1}", NULL, "field 'attention_dropout': 1 is out of range [0, 1)"},
    {"{\"hidden_act\": 5}", NULL, "field 'hidden_act': expected a string"},
    {"{\"hidden_act\": \"gelu\"}", NULL, "field 'hidden_act': 'gelu' is not supported (Llama's MLP takes silu, or swish)"},
    {"{\"hidden_act\": \"silu \"}", NULL,
     "field 'hidden_act': 'silu ' is not supported (Llama's MLP takes silu, or swish)"},
    {"{\"hidden_act\": \"relu\"}", NULL, "field 'hidden_act': 'relu' is not supported (Llama's MLP takes silu, or swish)"},
    {"{\"tie_word_embeddings\": \"true\"}", NULL, "field 'tie_word_embeddings': expected true or false"},
    {"{\"tie_word_embeddings\": null}", NULL, "field 'tie_word_embeddings': expected true or false"},
    {"{\"attention_bias\": true}", NULL, "field 'attention_bias': true is not supported"},
    {"{\"attention_bias\": 0}", NULL, "field 'attention_bias': expected true or false"},
    {"{\"mlp_bias\": true}", NULL, "field 'mlp_bias': true is not supported"},
    {"{\"mlp_bias\": null}", NULL, "field 'mlp_bias': expected true or false"},
    /* rope_theta at the top level */
    {"{\"rope_theta\": \"big\"}", NULL, "field 'rope_theta': expected a number"},
    {"{\"rope_theta\": 0.5}", NULL, "field 'rope_theta': 0.5 is out of range [1, 1e+12]"},
    {"{\"rope_theta\": 1e13}", NULL, "field 'rope_theta': 1e+13 is out of range [1, 1e+12]"},
    {"{\"rope_theta\": 1}", NULL, "field 'rope_theta': 1 is not above 1"},
    {"{\"rope_theta\": 1.00000001}", NULL, "field 'rope_theta': 1 is not above 1"}, /* 1 as a float */
    /* the rope objects */
    {"{\"rope_scaling\": 5}", NULL, "field 'rope_scaling': expected an object or null"},
    {"{\"rope_scaling\": []}", NULL, "field 'rope_scaling': expected an object or null"},
    {"{\"rope_parameters\": \"default\"}", NULL, "field 'rope_parameters': expected an object or null"},
    {SCALING("\"rope_type\": \"linear\", \"factor\": 2"), NULL, "field 'rope_scaling.rope_type': 'linear" UNSUPPORTED},
    {SCALING("\"type\": \"dynamic\", \"factor\": 2"), NULL, "field 'rope_scaling.type': 'dynamic" UNSUPPORTED},
    {SCALING("\"rope_type\": 3"), NULL, "field 'rope_scaling.rope_type': expected a string"},
    {SCALING("\"type\": null"), NULL, "field 'rope_scaling.type': expected a string"},
    {PARAMS("\"rope_type\": \"yarn\""), NULL, "field 'rope_parameters.rope_type': 'yarn" UNSUPPORTED},
    {"{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": \"x\"}}", NULL,
     "field 'rope_parameters.rope_theta': expected a number"},
    {"{\"rope_parameters\": {\"rope_theta\": 1}}", NULL, "field 'rope_parameters.rope_theta': 1 is not above 1"},
    {"{\"rope_parameters\": {\"rope_theta\": 0}}", NULL,
     "field 'rope_parameters.rope_theta': 0 is out of range [1, 1e+12]"},
    /* llama3's rule */
    {SCALING(L3_FULL ", \"factor\": 0.5"), NULL, "field 'rope_scaling.factor': 0.5 is out of range [1, 1e+06]"},
    {SCALING(L3_FULL ", \"factor\": \"8\""), NULL, "field 'rope_scaling.factor': expected a number"},
    {SCALING(L3_FULL ", \"low_freq_factor\": 0"), NULL,
     "field 'rope_scaling.low_freq_factor': 0 is out of range [1e-06, 1e+06]"},
    {SCALING(L3_FULL ", \"high_freq_factor\": 2e6"), NULL,
     "field 'rope_scaling.high_freq_factor': 2e+06 is out of range [1e-06, 1e+06]"},
    {SCALING(L3_FULL ", \"high_freq_factor\": 1"), NULL,
     "field 'rope_scaling.high_freq_factor': 1 is not above low_freq_factor 1"},
    {SCALING(L3_FULL ", \"low_freq_factor\": 4, \"high_freq_factor\": 1"), NULL,
     "field 'rope_scaling.high_freq_factor': 1 is not above low_freq_factor 4"},
    {SCALING(L3), NULL, "field 'rope_scaling.original_max_position_embeddings': missing"},
    {SCALING(L3 ", \"original_max_position_embeddings\": 0"), NULL,
     "field 'rope_scaling.original_max_position_embeddings': expected a positive integer"},
    {SCALING(L3 ", \"original_max_position_embeddings\": 1048577"), NULL,
     "field 'rope_scaling.original_max_position_embeddings': 1048577 is past the limit of 1048576"},
    {PARAMS(L3_FULL ", \"factor\": 0.5"), NULL, "field 'rope_parameters.factor': 0.5 is out of range [1, 1e+06]"},
    {PARAMS(L3_FULL ", \"high_freq_factor\": 0.5"), NULL,
     "field 'rope_parameters.high_freq_factor': 0.5 is not above low_freq_factor 1"},
    {PARAMS(L3), NULL, "field 'rope_parameters.original_max_position_embeddings': missing"},
    /* the weights and the whole model's parameters */
    {"{\"hidden_size\": 65536, \"vocab_size\": 4194304}", NULL,
     "field 'vocab_size': the token embeddings of 4194304 x hidden_size 65536 elements is past the limit of "
     "17179869184 elements per weight"},
    /* Llama's layers: q and o (h x h each), k and v (Hkv x Dh x h each), gate, up and down
     * (I x h each) and two RMSNorms, no biases; the embeddings and the final RMSNorm. */
    {"{\"hidden_size\": 65536, \"num_attention_heads\": 64, \"num_key_value_heads\": 64, "
     "\"intermediate_size\": 262144, \"num_hidden_layers\": 20}",
     NULL,
     "field 'num_hidden_layers': 20 layers of 68719607808 parameters, with 8454144 more in the embeddings, make "
     "1374400610304 parameters, past the limit of 1099511627776"},
    {"{\"hidden_size\": 65536, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, "
     "\"intermediate_size\": 262144, \"num_hidden_layers\": 18}",
     NULL,
     "field 'num_hidden_layers': 18 layers of 61203415040 parameters, with 8454144 more in the embeddings, make "
     "1101669924864 parameters, past the limit of 1099511627776"},
    /* accepted: within the limits, just */
    {"{\"hidden_size\": 65536, \"num_attention_heads\": 64, \"num_key_value_heads\": 64, "
     "\"intermediate_size\": 262144, \"num_hidden_layers\": 15}",
     NULL, NULL},
    {"{\"hidden_size\": 65536, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, "
     "\"intermediate_size\": 262144, \"num_hidden_layers\": 17}",
     NULL, NULL},
    /* no position table: positions past what an encoder's table could hold */
    {"{\"hidden_size\": 65536, \"max_position_embeddings\": 1048576}", NULL, NULL},
    /* accepted: the optional fields null, absent or at their bounds */
    {"{\"num_key_value_heads\": null, \"head_dim\": null, \"pretraining_tp\": null, \"pad_token_id\": null}", NULL,
     NULL},
    {"{\"head_dim\": 8, \"pretraining_tp\": 1, \"hidden_act\": \"silu\", \"attention_bias\": false, "
     "\"mlp_bias\": false, \"tie_word_embeddings\": true, \"pad_token_id\": 127}",
     NULL, NULL},
    {"{}", "num_key_value_heads", NULL},
    {"{\"num_key_value_heads\": 1, \"attention_dropout\": 0.5, \"rms_norm_eps\": 1}", NULL, NULL},
    {"{\"rope_theta\": 1e12}", NULL, NULL},
    {"{\"hidden_act\": \"swish\"}", NULL, NULL}, /* transformers' other name for silu */
    {SCALING(L3 ", \"original_max_position_embeddings\": 1048576, \"factor\": 1"), NULL, NULL},
};

/* dir/l<k>.json: the case's config; the path into path. */
static int write_config(const char *dir, const char *name, const char *set, const char *del, char *path, size_t cap) {
    json_error_t e;
    json_t *root = json_loads(k_llama, 0, &e), *edit = json_loads(set, 0, &e);
    if (!root || !edit) {
        json_decref(root), json_decref(edit);
        return -1;
    }
    json_object_update(root, edit);
    if (del) json_object_del(root, del);
    snprintf(path, cap, "%s/%s.json", dir, name);
    const int rc = json_dump_file(root, path, 0);
    json_decref(root), json_decref(edit);
    return rc;
}

TG_TEST(test_config_llama_table) {
    const char *dir = tg_test_tmpdir();
    for (size_t k = 0; k < sizeof k_cases / sizeof k_cases[0]; k++) {
        const llama_case *c = &k_cases[k];
        char path[700], name[32];
        snprintf(name, sizeof name, "l%zu", k);
        if (!CHECK(write_config(dir, name, c->set, c->del, path, sizeof path) == 0, "case %zu: cannot write", k))
            continue;
        tg_model_config cfg;
        tg_err err = {{0}};
        const int rc = tg_model_config_parse(path, &cfg, &err);
        if (c->want) {
            char want[900];
            snprintf(want, sizeof want, "%s: %s", path, c->want);
            CHECK(rc == -1 && !strcmp(err.msg, want), "case %zu (%s): rc %d, '%s', expected '%s'", k, c->set, rc,
                  err.msg, want);
        } else {
            CHECK(rc == 0 && cfg.arch == TG_ARCH_LLAMA, "case %zu (%s): refused: %s", k, c->set, err.msg);
        }
    }
}

/* The config `set` over the base, parsed into *c; 1 on success, else a failed CHECK. */
static int parse_edit(const char *set, const char *del, tg_model_config *c) {
    static int n;
    char path[700], name[32];
    snprintf(name, sizeof name, "v%d", n++);
    tg_err err = {{0}};
    if (!CHECK(write_config(tg_test_tmpdir(), name, set, del, path, sizeof path) == 0, "cannot write %s", set)) return 0;
    return CHECK(tg_model_config_parse(path, c, &err) == 0, "%s: %s", set, err.msg);
}

/* What each form reads: HF's defaults where a field is null or absent. */
TG_TEST(test_config_llama_values) {
    tg_model_config c;
    /* rope_theta and rope_scaling null: the default rule; GQA 4 heads over 2. */
    if (parse_edit("{}", NULL, &c))
        CHECK(c.arch == TG_ARCH_LLAMA && c.vocab_size == 128 && c.hidden == 32 && c.layers == 2 && c.heads == 4 &&
                  c.kv_heads == 2 && c.intermediate == 48 && c.max_positions == 64 && c.layer_norm_eps == 1e-5f &&
                  c.initializer_range == 0.02f && c.attention_dropout == 0 && c.hidden_dropout == 0 &&
                  c.embedding_dropout == 0 && c.classifier_dropout == 0 && c.type_vocab_size == 0 &&
                  c.pad_token_id == -1 && c.tie_word_embeddings == 0 && c.rope_type == TG_ROPE_DEFAULT &&
                  c.rope_theta == 10000.0f && c.rope_factor == 0 && c.rope_original_max_positions == 0,
              "base: kv %d, theta %g, rope %d, pad %d", c.kv_heads, c.rope_theta, c.rope_type, c.pad_token_id);
    /* Neither rope field, nor eps, nor the head counts' optional fields: 10000, 1e-6, kv =
     * heads; tie_word_embeddings absent: untied. */
    if (parse_edit("{\"num_key_value_heads\": null, \"head_dim\": null}", "rope_theta", &c))
        CHECK(c.rope_theta == 10000.0f && c.rope_type == TG_ROPE_DEFAULT && c.kv_heads == 4, "defaults: theta %g kv %d",
              c.rope_theta, c.kv_heads);
    if (parse_edit("{}", "rms_norm_eps", &c)) CHECK(c.layer_norm_eps == 1e-6f, "eps default %g", c.layer_norm_eps);
    if (parse_edit("{}", "num_key_value_heads", &c)) CHECK(c.kv_heads == 4, "kv absent: %d", c.kv_heads);
    if (parse_edit("{\"num_key_value_heads\": 1, \"head_dim\": 8, \"tie_word_embeddings\": true, \"pad_token_id\": 0, "
                   "\"attention_dropout\": 0.25, \"initializer_range\": 0.5}",
                   NULL, &c))
        CHECK(c.kv_heads == 1 && c.tie_word_embeddings == 1 && c.pad_token_id == 0 && c.attention_dropout == 0.25f &&
                  c.hidden_dropout == 0 && c.initializer_range == 0.5f,
              "MQA, tied: kv %d tie %d pad %d dropout %g", c.kv_heads, c.tie_word_embeddings, c.pad_token_id,
              c.attention_dropout);
    /* rope_theta with rope_scaling llama3 (Llama 3.2's). */
    if (parse_edit("{\"rope_theta\": 500000, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32, "
                   "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}}",
                   NULL, &c))
        CHECK(c.rope_type == TG_ROPE_LLAMA3 && c.rope_theta == 500000.0f && c.rope_factor == 32.0f &&
                  c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f &&
                  c.rope_original_max_positions == 8192,
              "rope_scaling llama3: type %d theta %g factor %g low %g high %g original %d", c.rope_type, c.rope_theta,
              c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_max_positions);
    /* "type" for "rope_type"; llama3's factors absent: 8, 1 and 4. */
    if (parse_edit("{\"rope_scaling\": {\"type\": \"llama3\", \"original_max_position_embeddings\": 16}}", NULL, &c))
        CHECK(c.rope_type == TG_ROPE_LLAMA3 && c.rope_factor == 8.0f && c.rope_low_freq_factor == 1.0f &&
                  c.rope_high_freq_factor == 4.0f && c.rope_original_max_positions == 16 && c.rope_theta == 10000.0f,
              "type llama3: type %d factor %g low %g high %g", c.rope_type, c.rope_factor, c.rope_low_freq_factor,
              c.rope_high_freq_factor);
    /* "rope_type" wins over "type"; a default object reads no llama3 field. */
    if (parse_edit("{\"rope_theta\": 20000, \"rope_scaling\": {\"rope_type\": \"default\", \"type\": \"llama3\", "
                   "\"factor\": 0}}",
                   NULL, &c))
        CHECK(c.rope_type == TG_ROPE_DEFAULT && c.rope_theta == 20000.0f && c.rope_factor == 0, "rope_type default: %d",
              c.rope_type);
    if (parse_edit("{\"rope_scaling\": {\"type\": \"default\"}}", NULL, &c))
        CHECK(c.rope_type == TG_ROPE_DEFAULT, "type default: %d", c.rope_type);
    if (parse_edit("{\"rope_scaling\": {}}", NULL, &c)) CHECK(c.rope_type == TG_ROPE_DEFAULT, "empty: %d", c.rope_type);
    /* rope_parameters (transformers 5): its own rope_theta; the top level's rope_theta and
     * rope_scaling are not read. */
    if (parse_edit("{\"rope_theta\": 7, \"rope_scaling\": {\"rope_type\": \"yarn\"}, \"rope_parameters\": "
                   "{\"rope_type\": \"llama3\", \"rope_theta\": 500000, \"factor\": 16, \"low_freq_factor\": 2, "
                   "\"high_freq_factor\": 8, \"original_max_position_embeddings\": 4096}}",
                   NULL, &c))
        CHECK(c.rope_type == TG_ROPE_LLAMA3 && c.rope_theta == 500000.0f && c.rope_factor == 16.0f &&
                  c.rope_low_freq_factor == 2.0f && c.rope_high_freq_factor == 8.0f &&
                  c.rope_original_max_positions == 4096,
              "rope_parameters llama3: theta %g factor %g", c.rope_theta, c.rope_factor);
    if (parse_edit("{\"rope_theta\": 7, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 250000}}",
                   NULL, &c))
        CHECK(c.rope_type == TG_ROPE_DEFAULT && c.rope_theta == 250000.0f, "rope_parameters default: theta %g",
              c.rope_theta);
    if (parse_edit("{\"rope_parameters\": {}}", NULL, &c))
        CHECK(c.rope_type == TG_ROPE_DEFAULT && c.rope_theta == 10000.0f, "rope_parameters empty: theta %g",
              c.rope_theta);
    /* rope_parameters null: the older fields. */
    if (parse_edit("{\"rope_parameters\": null, \"rope_theta\": 250000, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                   "\"original_max_position_embeddings\": 64}}",
                   NULL, &c))
        CHECK(c.rope_type == TG_ROPE_LLAMA3 && c.rope_theta == 250000.0f && c.rope_original_max_positions == 64,
              "rope_parameters null: type %d theta %g", c.rope_type, c.rope_theta);
}

typedef struct llama_preset {
    const char *name;
    int32_t layers, hidden, heads, kv_heads, inter, vocab, max_pos, tied, rope;
    float theta, factor, low, high;
    int32_t original, bos, eos;
} llama_preset;

TG_TEST(test_config_llama_presets) {
    static const llama_preset p[] = {
        {"llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 0, TG_ROPE_DEFAULT, 500000, 0, 0, 0, 0, 128000, 128001},
        {"llama-3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072, 1, TG_ROPE_LLAMA3, 500000, 32, 1, 4, 8192, 128000,
         128001},
        {"tiny-llama", 2, 64, 4, 2, 96, 128, 128, 0, TG_ROPE_LLAMA3, 10000, 8, 1, 4, 32, 1, 2},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        tg_model_config c;
        tg_err err = {{0}};
        const char *n = p[i].name;
        if (!CHECK(tg_model_config_load(n, &c, &err) == 0, "%s: %s", n, err.msg)) continue;
        CHECK(!strcmp(c.source, n) && c.weights[0] == 0 && c.arch == TG_ARCH_LLAMA, "%s: source '%s', arch %d", n,
              c.source, c.arch);
        CHECK(c.layers == p[i].layers && c.hidden == p[i].hidden && c.heads == p[i].heads &&
                  c.kv_heads == p[i].kv_heads && c.intermediate == p[i].inter && c.vocab_size == p[i].vocab &&
                  c.max_positions == p[i].max_pos,
              "%s: layers %d hidden %d heads %d kv %d intermediate %d vocab %d positions %d", n, c.layers, c.hidden,
              c.heads, c.kv_heads, c.intermediate, c.vocab_size, c.max_positions);
        CHECK(c.tie_word_embeddings == p[i].tied && c.pad_token_id == -1 && c.type_vocab_size == 0 &&
                  c.layer_norm_eps == 1e-5f && c.initializer_range == 0.02f && c.attention_dropout == 0,
              "%s: tied %d pad %d eps %g", n, c.tie_word_embeddings, c.pad_token_id, c.layer_norm_eps);
        CHECK(c.rope_type == p[i].rope && c.rope_theta == p[i].theta && c.rope_factor == p[i].factor &&
                  c.rope_low_freq_factor == p[i].low && c.rope_high_freq_factor == p[i].high &&
                  c.rope_original_max_positions == p[i].original,
              "%s: rope %d theta %g factor %g low %g high %g original %d", n, c.rope_type, c.rope_theta, c.rope_factor,
              c.rope_low_freq_factor, c.rope_high_freq_factor, c.rope_original_max_positions);
        int32_t bos = -5, eos = -5;
        tg_model_config_special_ids(n, &bos, &eos);
        CHECK(bos == p[i].bos && eos == p[i].eos, "%s: bos %d eos %d", n, bos, eos);
    }
}

/* The written config parsed back: every field the parser reads comes back the same. */
static void check_round_trip(const tg_model_config *m, const tg_hf_head *h, const char *what) {
    tg_err err = {{0}};
    char *text = tg_model_config_hf_json(m, h, &err);
    if (!CHECK(text, "%s: %s", what, err.msg)) return;
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (CHECK(root, "%s: not JSON: %s", what, text)) {
        const char *want_class = h->task == TG_TASK_LM ? "LlamaForCausalLM" : "LlamaForSequenceClassification";
        json_t *scaling = json_object_get(root, "rope_scaling");
        CHECK(!strcmp(json_string_value(json_array_get(json_object_get(root, "architectures"), 0)), want_class) &&
                  !strcmp(json_string_value(json_object_get(root, "model_type")), "llama") &&
                  !strcmp(json_string_value(json_object_get(root, "hidden_act")), "silu") &&
                  json_integer_value(json_object_get(root, "head_dim")) == m->hidden / m->heads &&
                  json_integer_value(json_object_get(root, "num_key_value_heads")) == m->kv_heads &&
                  json_is_false(json_object_get(root, "attention_bias")) &&
                  json_is_false(json_object_get(root, "mlp_bias")) &&
                  json_integer_value(json_object_get(root, "pretraining_tp")) == 1 &&
                  json_is_boolean(json_object_get(root, "tie_word_embeddings")) &&
                  (m->rope_type == TG_ROPE_LLAMA3
                       ? !strcmp(json_string_value(json_object_get(scaling, "rope_type")), "llama3")
                       : json_is_null(scaling)),
              "%s: fields of the text", what);
        json_decref(root);
    }
    char path[700];
    snprintf(path, sizeof path, "%s/%s.json", tg_test_tmpdir(), what);
    tg_model_config b;
    if (CHECK(tg_test_write_file(path, text) == 0, "%s: cannot write", what) &&
        CHECK(tg_model_config_parse(path, &b, &err) == 0, "%s: read back: %s", what, err.msg))
        CHECK(b.arch == m->arch && b.vocab_size == m->vocab_size && b.hidden == m->hidden && b.layers == m->layers &&
                  b.heads == m->heads && b.kv_heads == m->kv_heads && b.intermediate == m->intermediate &&
                  b.max_positions == m->max_positions && b.layer_norm_eps == m->layer_norm_eps &&
                  b.initializer_range == m->initializer_range && b.attention_dropout == m->attention_dropout &&
                  b.tie_word_embeddings == m->tie_word_embeddings && b.rope_type == m->rope_type &&
                  b.rope_theta == m->rope_theta && b.rope_factor == m->rope_factor &&
                  b.rope_low_freq_factor == m->rope_low_freq_factor &&
                  b.rope_high_freq_factor == m->rope_high_freq_factor &&
                  b.rope_original_max_positions == m->rope_original_max_positions &&
                  b.pad_token_id == h->pad_token_id && b.type_vocab_size == 0,
              "%s: read back: kv %d tie %d rope %d theta %g factor %g original %d pad %d", what, b.kv_heads,
              b.tie_word_embeddings, b.rope_type, b.rope_theta, b.rope_factor, b.rope_original_max_positions,
              b.pad_token_id);
    free(text);
}

TG_TEST(test_config_llama_write_round_trip) {
    static const char *const presets[] = {"tiny-llama", "llama-3.2-1b", "llama-3-8b"};
    const char *const labels[] = {"neg", "pos", "mixed"};
    for (int p = 0; p < 3; p++) {
        tg_model_config m;
        tg_err err = {{0}};
        if (!CHECK(tg_model_config_load(presets[p], &m, &err) == 0, "%s: %s", presets[p], err.msg)) continue;
        int32_t bos, eos;
        tg_model_config_special_ids(presets[p], &bos, &eos);
        char what[64];
        snprintf(what, sizeof what, "%s-lm", presets[p]);
        check_round_trip(&m, &(tg_hf_head){TG_TASK_LM, 0, NULL, -1, bos, eos}, what);
        snprintf(what, sizeof what, "%s-classify", presets[p]);
        check_round_trip(&m, &(tg_hf_head){TG_TASK_CLASSIFY, 3, labels, 0, bos, eos}, what);
    }
    /* Values the presets lack: MQA, tied with default rope, odd floats, dropout. */
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-llama", &m, &err) == 0, "%s", err.msg);
    m.kv_heads = 1, m.tie_word_embeddings = 1, m.rope_type = TG_ROPE_DEFAULT, m.rope_theta = 123456.7f;
    m.rope_factor = m.rope_low_freq_factor = m.rope_high_freq_factor = 0, m.rope_original_max_positions = 0;
    m.layer_norm_eps = 3.3e-6f, m.initializer_range = 0.111122616f, m.attention_dropout = 0.1f;
    check_round_trip(&m, &(tg_hf_head){TG_TASK_LM, 0, NULL, 5, -1, -1}, "edited-lm");
    m.rope_type = TG_ROPE_LLAMA3, m.rope_factor = 1.5f, m.rope_low_freq_factor = 0.25f;
    m.rope_high_freq_factor = 7.75f, m.rope_original_max_positions = 100;
    check_round_trip(&m, &(tg_hf_head){TG_TASK_CLASSIFY, 2, NULL, 3, -1, -1}, "edited-classify");
}

/* The classes a Llama has in transformers, and none for the encoders' tasks. */
TG_TEST(test_config_llama_architectures) {
    CHECK(!strcmp(tg_hf_architecture(TG_ARCH_LLAMA, TG_TASK_LM), "LlamaForCausalLM") &&
              !strcmp(tg_hf_architecture(TG_ARCH_LLAMA, TG_TASK_CLASSIFY), "LlamaForSequenceClassification") &&
              !tg_hf_architecture(TG_ARCH_LLAMA, TG_TASK_MLM) && !tg_hf_architecture(TG_ARCH_LLAMA, TG_TASK_QA),
          "Llama's classes");
    tg_model_config m;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load("tiny-llama", &m, &err) == 0, "%s", err.msg);
    char *text = tg_model_config_hf_json(&m, &(tg_hf_head){TG_TASK_MLM, 0, NULL, -1, -1, -1}, &err);
    CHECK(!text && !strcmp(err.msg, "a llama model with task mlm has no Hugging Face class here"), "mlm: '%s'", err.msg);
    free(text);
}
