/* Hugging Face config.json parsing (models/model_config.c): one table of configs, each a
 * small BERT, RoBERTa or GPT-2 config with fields set or removed, refused naming the file,
 * the field and the cause, or read with the values HF would use; then the model folders
 * that cannot be read, the preset listing, and the special token ids. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "base/alloc.h"
#include "models/model_config.h"
#include "tests/harness.h"

static const char k_bert[] = "{\"model_type\": \"bert\", \"vocab_size\": 300, \"hidden_size\": 32, "
                             "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"intermediate_size\": 64, "
                             "\"max_position_embeddings\": 64, \"type_vocab_size\": 2, \"pad_token_id\": 0}";
static const char k_gpt2[] = "{\"model_type\": \"gpt2\", \"vocab_size\": 128, \"n_embd\": 32, \"n_layer\": 2, "
                             "\"n_head\": 4, \"n_positions\": 64, \"n_inner\": null, \"pad_token_id\": 0}";

typedef struct config_case {
    char arch;          /* 'b' BERT, 'r' RoBERTa (the BERT config as model_type roberta), 'g' GPT-2 */
    const char *set;    /* a JSON object whose members replace or join the config's */
    const char *del;    /* a field removed, or NULL */
    const char *want;   /* the message after "<path>: ", or NULL: parsed */
} config_case;

static const config_case k_cases[] = {
    /* integers */
    {'b', "{}", "vocab_size", "field 'vocab_size': missing"},
    {'b', "{\"type_vocab_size\": \"2\"}", NULL, "field 'type_vocab_size': expected a positive integer"},
    {'b', "{\"intermediate_size\": 0}", NULL, "field 'intermediate_size': expected a positive integer"},
    {'b', "{\"max_position_embeddings\": 1.5}", NULL, "field 'max_position_embeddings': expected a positive integer"},
    {'b', "{\"pad_token_id\": -1}", NULL, "field 'pad_token_id': expected a non-negative integer"},
    {'b', "{\"pad_token_id\": 2147483648}", NULL, "field 'pad_token_id': 2147483648 is past the limit of 2147483647"},
    {'b', "{\"pad_token_id\": 300}", NULL, "field 'pad_token_id': 300 is not below vocab_size 300"},
    {'g', "{\"n_layer\": \"2\"}", NULL, "field 'n_layer': expected a positive integer"},
    {'g', "{\"n_head\": 0}", NULL, "field 'n_head': expected a positive integer"},
    {'g', "{}", "n_positions", "field 'n_positions': missing"},
    {'g', "{\"n_inner\": \"64\"}", NULL, "field 'n_inner': expected a positive integer"},
    {'g', "{\"pad_token_id\": 128}", NULL, "field 'pad_token_id': 128 is not below vocab_size 128"},
    {'g', "{\"pad_token_id\": true}", NULL, "field 'pad_token_id': expected a non-negative integer"},
    /* numbers */
    {'b', "{\"layer_norm_eps\": 0}", NULL, "field 'layer_norm_eps': 0 is out of range [1e-30, 1]"},
    {'b', "{\"layer_norm_eps\": 1.5}", NULL, "field 'layer_norm_eps': 1.5 is out of range [1e-30, 1]"},
    {'b', "{\"initializer_range\": \"0.02\"}", NULL, "field 'initializer_range': expected a number"},
    {'b', "{\"initializer_range\": -0.5}", NULL, "field 'initializer_range': -0.5 is out of range [0, 10]"},
    {'b', "{\"hidden_dropout_prob\": 1}", NULL, "field 'hidden_dropout_prob': 1 is out of range [0, 1)"},
    {'b', "{\"attention_probs_dropout_prob\": 1.0}", NULL,
     "field 'attention_probs_dropout_prob': 1 is out of range [0, 1)"},
    {'b', "{\"classifier_dropout\": 1}", NULL, "field 'classifier_dropout': 1 is out of range [0, 1)"},
    {'b', "{\"classifier_dropout\": \"none\"}", NULL, "field 'classifier_dropout': expected a number"},
    {'g', "{\"layer_norm_epsilon\": 0}", NULL, "field 'layer_norm_epsilon': 0 is out of range [1e-30, 1]"},
    {'g', "{\"initializer_range\": 11}", NULL, "field 'initializer_range': 11 is out of range [0, 10]"},
    {'g', "{\"resid_pdrop\": 1}", NULL, "field 'resid_pdrop': 1 is out of range [0, 1)"},
    {'g', "{\"attn_pdrop\": -0.1}", NULL, "field 'attn_pdrop': -0.1 is out of range [0, 1)"},
    {'g', "{\"embd_pdrop\": 2}", NULL, "field 'embd_pdrop': 2 is out of range [0, 1)"},
    /* strings and switches */
    {'b', "{\"model_type\": 7}", NULL, "field 'model_type': expected a string"},
    {'b', "{\"model_type\": \"t5\"}", NULL,
     "field 'model_type': unsupported model type 't5' (supported: bert, roberta, gpt2, llama, "
     "mobilenet_v2)"},
    {'b', "{\"hidden_act\": 5}", NULL, "field 'hidden_act': expected a string"},
    {'b', "{\"hidden_act\": \"swish\"}", NULL,
     "field 'hidden_act': unsupported activation 'swish' (supported: gelu, gelu_new, gelu_pytorch_tanh)"},
    {'b', "{\"position_embedding_type\": true}", NULL, "field 'position_embedding_type': expected a string"},
    {'b', "{\"position_embedding_type\": \"rotary\"}", NULL,
     "field 'position_embedding_type': 'rotary' is not supported (only 'absolute')"},
    {'g', "{\"activation_function\": 3}", NULL, "field 'activation_function': expected a string"},
    {'g', "{\"scale_attn_weights\": \"yes\"}", NULL, "field 'scale_attn_weights': expected true or false"},
    {'g', "{\"scale_attn_weights\": false}", NULL, "field 'scale_attn_weights': false is not supported"},
    {'g', "{\"scale_attn_by_inverse_layer_idx\": true}", NULL,
     "field 'scale_attn_by_inverse_layer_idx': true is not supported"},
    {'g', "{\"reorder_and_upcast_attn\": 1}", NULL, "field 'reorder_and_upcast_attn': expected true or false"},
    {'g', "{\"add_cross_attention\": true}", NULL, "field 'add_cross_attention': true is not supported"},
    /* shapes */
    {'b', "{\"num_attention_heads\": 3}", NULL, "field 'num_attention_heads': hidden_size 32 is not divisible by "
                                                 "num_attention_heads 3"},
    {'g', "{\"n_head\": 5}", NULL, "field 'n_head': n_embd 32 is not divisible by n_head 5"},
    {'r', "{\"pad_token_id\": 1, \"max_position_embeddings\": 2}", NULL,
     "field 'max_position_embeddings': 2 leaves no positions after the padding offset (pad_token_id 1 + 1)"},
    {'r', "{\"pad_token_id\": 10, \"max_position_embeddings\": 5}", NULL,
     "field 'max_position_embeddings': 5 leaves no positions after the padding offset (pad_token_id 10 + 1)"},
    {'r', "{\"pad_token_id\": 10, \"max_position_embeddings\": 11}", NULL,
     "field 'max_position_embeddings': 11 leaves no positions after the padding offset (pad_token_id 10 + 1)"},
    /* numbers: true, false, null and text are none */
    {'b', "{\"hidden_dropout_prob\": true}", NULL, "field 'hidden_dropout_prob': expected a number"},
    {'b', "{\"attention_probs_dropout_prob\": false}", NULL, "field 'attention_probs_dropout_prob': expected a number"},
    {'b', "{\"layer_norm_eps\": null}", NULL, "field 'layer_norm_eps': expected a number"},
    {'b', "{\"initializer_range\": \"0.02\"}", NULL, "field 'initializer_range': expected a number"},
    {'b', "{\"hidden_dropout_prob\": [0.1]}", NULL, "field 'hidden_dropout_prob': expected a number"},
    {'b', "{\"hidden_size\": 65536, \"vocab_size\": 262145, \"num_attention_heads\": 1}", NULL,
     "field 'vocab_size': the token embeddings of 262145 x hidden_size 65536 elements is past the limit of "
     "17179869184 elements per weight"},
    {'b', "{\"hidden_size\": 32768, \"num_attention_heads\": 1, \"num_hidden_layers\": 1024, "
          "\"intermediate_size\": 131072}", NULL,
     "field 'num_hidden_layers': 1024 layers of 12885327872 parameters, with 1085898752 more in the embeddings, make "
     "13195661639680 parameters, past the limit of 1099511627776"},
    /* accepted */
    {'b', "{\"pad_token_id\": null, \"classifier_dropout\": null, \"hidden_dropout_prob\": 0.25}", NULL, NULL},
    {'b', "{\"classifier_dropout\": 0.5, \"hidden_act\": \"gelu_new\"}", "pad_token_id", NULL},
    {'r', "{\"max_position_embeddings\": 3}", "pad_token_id", NULL},
    {'g', "{\"scale_attn_weights\": true, \"reorder_and_upcast_attn\": false, \"add_cross_attention\": false, "
          "\"activation_function\": \"gelu_pytorch_tanh\", \"pad_token_id\": null}", NULL, NULL},
    {'g', "{\"n_inner\": 48, \"activation_function\": \"gelu\"}", NULL, NULL},
    /* the first position past the padding offset is enough; numbers at their bounds */
    {'r', "{\"pad_token_id\": 10, \"max_position_embeddings\": 12}", NULL, NULL},
    {'b', "{\"hidden_dropout_prob\": 0, \"layer_norm_eps\": 1}", NULL, NULL},
};

/* dir/c<k>.json: the case's config; the path into path. */
static int write_case(const char *dir, size_t k, const config_case *c, char *path, size_t cap) {
    json_error_t e;
    json_t *root = json_loads(c->arch == 'g' ? k_gpt2 : k_bert, 0, &e), *set = json_loads(c->set, 0, &e);
    if (!root || !set) return -1;
    if (c->arch == 'r') json_object_set_new(root, "model_type", json_string("roberta"));
    json_object_update(root, set);
    if (c->del) json_object_del(root, c->del);
    snprintf(path, cap, "%s/c%zu.json", dir, k);
    const int rc = json_dump_file(root, path, 0);
    json_decref(root), json_decref(set);
    return rc;
}

TG_TEST(test_config_parse_table) {
    const char *dir = tg_test_tmpdir();
    for (size_t k = 0; k < sizeof k_cases / sizeof k_cases[0]; k++) {
        const config_case *c = &k_cases[k];
        char path[700];
        if (!CHECK(write_case(dir, k, c, path, sizeof path) == 0, "case %zu: cannot write", k)) continue;
        tg_model_config cfg;
        tg_err err = {{0}};
        const int rc = tg_model_config_parse(path, &cfg, &err);
        if (c->want) {
            char want[900];
            snprintf(want, sizeof want, "%s: %s", path, c->want);
            CHECK(rc == -1 && !strcmp(err.msg, want), "case %zu (%s): rc %d, '%s', expected '%s'", k, c->set, rc,
                  err.msg, want);
        } else {
            CHECK(rc == 0, "case %zu (%s): refused: %s", k, c->set, err.msg);
        }
    }
}

static int parse_case(size_t k, tg_model_config *cfg) {
    char path[700];
    tg_err err = {{0}};
    if (write_case(tg_test_tmpdir(), k, &k_cases[k], path, sizeof path)) return 0;
    return CHECK(tg_model_config_parse(path, cfg, &err) == 0, "case %zu: %s", k, err.msg);
}

/* What the accepted configs read: HF's defaults where a field is null or absent. */
TG_TEST(test_config_parse_defaults) {
    size_t first = 0;
    while (k_cases[first].want) first++;
    tg_model_config c;
    if (parse_case(first, &c))
        CHECK(c.arch == TG_ARCH_BERT && c.pad_token_id == -1 && c.hidden_dropout == 0.25f &&
                  c.embedding_dropout == 0.25f && c.classifier_dropout == 0.25f && c.attention_dropout == 0.1f &&
                  c.gelu == TG_GELU_ERF && c.layer_norm_eps == 1e-12f && c.initializer_range == 0.02f,
              "null pad and classifier dropout: pad %d, classifier %g", c.pad_token_id, c.classifier_dropout);
    if (parse_case(first + 1, &c))
        CHECK(c.pad_token_id == 0 && c.classifier_dropout == 0.5f && c.hidden_dropout == 0.1f &&
                  c.gelu == TG_GELU_TANH,
              "BERT without pad_token_id: pad %d, classifier %g", c.pad_token_id, c.classifier_dropout);
    if (parse_case(first + 2, &c))
        CHECK(c.arch == TG_ARCH_ROBERTA && c.pad_token_id == 1 && c.max_positions == 3,
              "RoBERTa without pad_token_id: pad %d", c.pad_token_id);
    if (parse_case(first + 3, &c))
        CHECK(c.arch == TG_ARCH_GPT2 && c.pad_token_id == -1 && c.intermediate == 128 && c.gelu == TG_GELU_TANH &&
                  c.type_vocab_size == 0 && c.classifier_dropout == 0 && c.layer_norm_eps == 1e-5f &&
                  c.hidden_dropout == 0.1f && c.embedding_dropout == 0.1f,
              "GPT-2 defaults: pad %d, intermediate %d", c.pad_token_id, c.intermediate);
    if (parse_case(first + 4, &c))
        CHECK(c.intermediate == 48 && c.gelu == TG_GELU_ERF && c.pad_token_id == 0, "GPT-2 n_inner 48: %d",
              c.intermediate);
}

/* ---- model folders and presets ----------------------------------------------------------- */

static void set_presets(const char *dir) {
    if (dir) setenv("TUNEGRAPH_PRESETS", dir, 1);
    else unsetenv("TUNEGRAPH_PRESETS");
}

/* A model name whose config.json cannot be read is refused naming what is there. */
TG_TEST(test_config_load_unreadable) {
    const char *dir = tg_test_tmpdir();
    char path[900], target[900], want[1200];
    tg_model_config c;
    tg_err err;
    CHECK(tg_model_config_load(NULL, &c, &err) == -1 && !strcmp(err.msg, "model: empty model name"), "%s", err.msg);
    CHECK(tg_model_config_load("", &c, &err) == -1 && !strcmp(err.msg, "model: empty model name"), "%s", err.msg);
    char long_name[TG_PATH_MAX + 8];
    memset(long_name, 'm', sizeof long_name - 1), long_name[sizeof long_name - 1] = 0;
    snprintf(want, sizeof want, "model '%.64s...': name too long", long_name);
    CHECK(tg_model_config_load(long_name, &c, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);

    /* Below a plain file: lstat says "not a folder". */
    snprintf(path, sizeof path, "%s/plain", dir);
    tg_test_write_file(path, "x");
    snprintf(target, sizeof target, "%s/plain/sub", dir);
    snprintf(want, sizeof want, "model '%s': %s/config.json: cannot look at it: %s", target, target,
             strerror(ENOTDIR));
    CHECK(tg_model_config_load(target, &c, &err) == -1 && !strcmp(err.msg, want), "under a file: %s", err.msg);
    /* config.json a dangling link, a folder, a socket, a character device. */
    const char *kinds[] = {"dangling", "folder", "socket", "chardev"};
    for (int k = 0; k < 4; k++) {
        char model[900], config[1000];
        snprintf(model, sizeof model, "%s/%s", dir, kinds[k]);
        mkdir(model, 0755);
        snprintf(config, sizeof config, "%s/config.json", model);
        const char *is = NULL;
        if (k == 0) {
            if (!CHECK(symlink("nothing-here", config) == 0, "symlink %s", config)) continue;
        } else if (k == 1) {
            mkdir(config, 0755), is = "a folder";
        } else if (k == 2) {
            struct sockaddr_un a = {.sun_family = AF_UNIX};
            const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
            if (strlen(config) >= sizeof a.sun_path) continue; /* a temporary folder too deep for a socket */
            snprintf(a.sun_path, sizeof a.sun_path, "%s", config);
            bind(fd, (struct sockaddr *)&a, sizeof a);
            close(fd);
            is = "a socket";
        } else {
            if (!CHECK(symlink("/dev/null", config) == 0, "symlink %s", config)) continue;
            is = "a character device";
        }
        if (is) snprintf(want, sizeof want, "model '%s': %s: is %s, not a regular file", model, config, is);
        else snprintf(want, sizeof want, "model '%s': %s: a symbolic link to nothing readable: %s", model, config,
                      strerror(ENOENT));
        CHECK(tg_model_config_load(model, &c, &err) == -1 && !strcmp(err.msg, want), "%s: '%s', expected '%s'",
              kinds[k], err.msg, want);
    }
    /* A preset name whose preset folder holds a folder as its config.json. */
    char presets[900];
    snprintf(presets, sizeof presets, "%s/presets", dir);
    mkdir(presets, 0755);
    snprintf(path, sizeof path, "%s/odd", presets);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/odd/config.json", presets);
    mkdir(path, 0755);
    set_presets(presets);
    snprintf(want, sizeof want, "model 'odd': %s: is a folder, not a regular file", path);
    CHECK(tg_model_config_load("odd", &c, &err) == -1 && !strcmp(err.msg, want), "preset: %s", err.msg);
    /* model.safetensors that is a folder. */
    snprintf(path, sizeof path, "%s/weights-folder", dir);
    mkdir(path, 0755);
    snprintf(target, sizeof target, "%s/config.json", path);
    tg_test_write_file(target, k_bert);
    snprintf(target, sizeof target, "%s/model.safetensors", path);
    mkdir(target, 0755);
    snprintf(want, sizeof want, "model '%s': %s: is a folder, not a regular file", path, target);
    CHECK(tg_model_config_load(path, &c, &err) == -1 && !strcmp(err.msg, want), "weights: %s", err.msg);
    /* A folder name so long that its weights' path would pass TG_PATH_MAX. */
    char deep[TG_PATH_MAX + 100];
    snprintf(deep, sizeof deep, "%s", dir);
    while (strlen(deep) + 1 + 100 < TG_PATH_MAX - 16) {
        strcat(deep, "/");
        const size_t at = strlen(deep);
        memset(deep + at, 'd', 100), deep[at + 100] = 0;
        mkdir(deep, 0755);
    }
    strcat(deep, "/");
    while (strlen(deep) < TG_PATH_MAX - 14) strcat(deep, "e");
    mkdir(deep, 0755);
    snprintf(target, sizeof target, "%s/config.json", deep);
    REQUIRE(tg_test_write_file(target, k_bert) == 0, "deep config");
    char cut[sizeof err.msg]; /* the message is cut at the error's room, as this is */
    snprintf(cut, sizeof cut, "model '%s': path %s/model.safetensors is too long", deep, deep);
    CHECK(tg_model_config_load(deep, &c, &err) == -1 && !strcmp(err.msg, cut), "a deep folder: %s", err.msg);
    set_presets(NULL);
}

/* An unknown name lists the presets: none when the folder cannot be opened or holds none,
 * sorted and cut at the message's room when there are many. */
TG_TEST(test_config_preset_listing) {
    const char *dir = tg_test_tmpdir();
    char presets[800], want[1200], path[1000];
    tg_model_config c;
    tg_err err;
    snprintf(presets, sizeof presets, "%s/absent", dir);
    set_presets(presets);
    CHECK(!strcmp(tg_presets_dir(), presets), "TUNEGRAPH_PRESETS: %s", tg_presets_dir());
    snprintf(want, sizeof want,
             "model 'nope': no preset of that name and no folder nope/config.json (presets: none: cannot open %s)",
             presets);
    CHECK(tg_model_config_load("nope", &c, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);
    snprintf(presets, sizeof presets, "%s/empty", dir);
    mkdir(presets, 0755);
    snprintf(path, sizeof path, "%s/no-config", presets);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/.hidden", presets);
    mkdir(path, 0755);
    strcat(path, "/config.json"); /* a hidden folder is no preset, even with a config.json */
    REQUIRE(tg_test_write_file(path, k_bert) == 0, "hidden config");
    set_presets(presets);
    snprintf(want, sizeof want,
             "model 'nope': no preset of that name and no folder nope/config.json (presets: none in %s)", presets);
    CHECK(tg_model_config_load("nope", &c, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);
    /* 300 presets: the first 256 found are listed, sorted, as far as the room goes. */
    snprintf(presets, sizeof presets, "%s/many", dir);
    mkdir(presets, 0755);
    for (int k = 0; k < 300; k++) {
        snprintf(path, sizeof path, "%s/preset-%03d", presets, k);
        mkdir(path, 0755);
        strcat(path, "/config.json");
        tg_test_write_file(path, k_bert);
    }
    set_presets(presets);
    CHECK(tg_model_config_load("nope", &c, &err) == -1 &&
              strstr(err.msg, "model 'nope': no preset of that name and no folder nope/config.json (presets: preset-"),
          "%s", err.msg);
    const char *list = strstr(err.msg, "(presets: ");
    int sorted = list != NULL, n = 0;
    for (const char *p = list ? strstr(list, "preset-") : NULL, *prev = NULL; p; prev = p, p = strstr(p + 7, "preset-"))
        sorted &= !prev || strncmp(prev, p, 10) < 0, n++;
    CHECK(sorted && n >= 20 && n < 256, "%d presets listed, sorted %d: %s", n, sorted, err.msg);
    tg_alloc_fail_after(0);
    const int rc = tg_model_config_load("nope", &c, &err);
    tg_alloc_fail_after(-1);
    snprintf(want, sizeof want, "model 'nope': no preset of that name and no folder nope/config.json (presets: none in %s)",
             presets);
    CHECK(rc == -1 && !strcmp(err.msg, want), "no memory for the names: %s", err.msg);
    setenv("TUNEGRAPH_PRESETS", "", 1);
    CHECK(tg_presets_dir()[0] && strcmp(tg_presets_dir(), presets), "an empty TUNEGRAPH_PRESETS: %s", tg_presets_dir());
    set_presets(NULL);
    CHECK(tg_model_config_load("tiny-bert", &c, &err) == 0 && c.hidden == 32, "tiny-bert: %s", err.msg);
}

/* bos and eos ids from a preset or a folder's config: -1 where absent, null, negative, too
 * big or not an integer, or where the config cannot be read or is not an object. */
TG_TEST(test_config_special_ids) {
    const char *dir = tg_test_tmpdir();
    int32_t bos = 5, eos = 5;
    tg_model_config_special_ids("tiny-gpt2", &bos, &eos);
    CHECK(bos == 0 && eos == 0, "tiny-gpt2: bos %d, eos %d", bos, eos);
    const struct {
        const char *text;
        int32_t bos, eos;
    } cases[] = {
        {"{\"bos_token_id\": 7, \"eos_token_id\": 2147483647}", 7, 2147483647},
        {"{\"bos_token_id\": null, \"eos_token_id\": -3}", -1, -1},
        {"{\"bos_token_id\": 2147483648, \"eos_token_id\": \"2\"}", -1, -1},
        {"{}", -1, -1},
        {"[1, 2]", -1, -1},
        {"{\"bos_token_id\": 1,", -1, -1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char folder[800], path[900];
        snprintf(folder, sizeof folder, "%s/m%zu", dir, k);
        mkdir(folder, 0755);
        snprintf(path, sizeof path, "%s/config.json", folder);
        tg_test_write_file(path, cases[k].text);
        strcat(folder, "//"); /* trailing slashes are dropped */
        bos = eos = 5;
        tg_model_config_special_ids(folder, &bos, &eos);
        CHECK(bos == cases[k].bos && eos == cases[k].eos, "case %zu: bos %d, eos %d, expected %d, %d", k, bos, eos,
              cases[k].bos, cases[k].eos);
    }
    bos = eos = 5;
    tg_model_config_special_ids("no-such-model", &bos, &eos);
    CHECK(bos == -1 && eos == -1, "a missing model: bos %d, eos %d", bos, eos);
}

/* More of what a model name can point at: a block device as config.json (where this
 * process may make one), a file it may not read (where permissions apply to it), "/"
 * (trailing slashes are kept to one), and a preset folder whose config.json is a folder,
 * which the listing passes over. */
TG_TEST(test_config_load_odd_paths) {
    const char *dir = tg_test_tmpdir();
    char model[800], config[900], want[1200];
    tg_model_config c;
    tg_err err;
    snprintf(model, sizeof model, "%s/blockdev", dir);
    mkdir(model, 0755);
    snprintf(config, sizeof config, "%s/config.json", model);
    if (mknod(config, S_IFBLK | 0600, makedev(7, 0)) == 0) {
        snprintf(want, sizeof want, "model '%s': %s: is a block device, not a regular file", model, config);
        CHECK(tg_model_config_load(model, &c, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);
    }
    snprintf(model, sizeof model, "%s/unreadable", dir);
    mkdir(model, 0755);
    snprintf(config, sizeof config, "%s/config.json", model);
    tg_test_write_file(config, k_bert);
    chmod(config, 0);
    if (geteuid() != 0) {
        snprintf(want, sizeof want, "model '%s': %s: cannot be read: %s", model, config, strerror(EACCES));
        CHECK(tg_model_config_load(model, &c, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);
    }
    char presets[800], path[1000];
    snprintf(presets, sizeof presets, "%s/presets", dir);
    mkdir(presets, 0755);
    const char *names[] = {"alpha", "beta", "gamma"};
    for (int k = 0; k < 3; k++) {
        snprintf(path, sizeof path, "%s/%s", presets, names[k]);
        mkdir(path, 0755);
        strcat(path, "/config.json");
        if (k == 1) mkdir(path, 0755);
        else tg_test_write_file(path, k_gpt2);
    }
    set_presets(presets);
    CHECK(tg_model_config_load("/", &c, &err) == -1 &&
              !strcmp(err.msg, "model '/': no preset of that name and no folder //config.json (presets: alpha, gamma)"),
          "%s", err.msg);
    int32_t bos = 3, eos = 3;
    tg_model_config_special_ids("/", &bos, &eos);
    CHECK(bos == -1 && eos == -1, "'/': bos %d, eos %d", bos, eos);
    CHECK(tg_model_config_load("gamma", &c, &err) == 0 && c.arch == TG_ARCH_GPT2 && !strcmp(c.source, "gamma") &&
              c.weights[0] == 0,
          "gamma: %s", err.msg);
    set_presets(NULL);
}

/* Runs a copy of the CLI at `exe` (from `cwd` as `argv0`) compiling a job of an unknown
 * model; its stderr (malloc'd). */
static char *compile_unknown(const char *dir, const char *cwd, const char *argv0) {
    char cmd[3000], out[800];
    snprintf(out, sizeof out, "%s/stderr.txt", dir);
    snprintf(cmd, sizeof cmd, "cd '%s' && env -u TUNEGRAPH_PRESETS %s compile '%s/j.job' -o '%s/p.plan' 2>'%s'", cwd,
             argv0, dir, dir, out);
    if (system(cmd) == -1) return NULL;
    return tg_test_read_file(out, NULL);
}

/* The CLI finds the presets beside itself: an installed bin/ beside share/tunegraph/presets
 * (found from /proc/self/exe when run by a relative name, from the loaded file's absolute
 * name otherwise); with none beside it (a file where a folder would be), the source tree's. */
TG_TEST(test_config_presets_beside_the_program) {
    const char *dir = tg_test_tmpdir();
    char cli[4096], cmd[9000], path[1000];
    REQUIRE(realpath(tg_test_cli(), cli), "no CLI at %s", tg_test_cli());
    snprintf(path, sizeof path, "%s/j.job", dir);
    tg_test_write_file(path, "model = nope\ntask = classify\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = t.jsonl\n");
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/inst/bin' '%s/inst/share/tunegraph/presets/solo' '%s/bare/bin' '%s/bare/models' && "
             "cp '%s' '%s/inst/bin/tunegraph' && cp '%s' '%s/bare/bin/tunegraph' && "
             "cp models/presets/tiny-bert/config.json '%s/inst/share/tunegraph/presets/solo/' && "
             ": > '%s/bare/models/presets'",
             dir, dir, dir, dir, cli, dir, cli, dir, dir, dir);
    REQUIRE(system(cmd) == 0, "cannot lay out the copies");
    const char *want_inst = "key 'model': model 'nope': no preset of that name and no folder nope/config.json "
                            "(presets: solo)\n";
    char bin[900], exe[1000];
    snprintf(bin, sizeof bin, "%s/inst/bin", dir);
    char *text = compile_unknown(dir, bin, "./tunegraph");
    CHECK(text && strstr(text, want_inst), "installed, run as ./tunegraph: %s", text ? text : "(none)");
    free(text);
    snprintf(exe, sizeof exe, "%s/tunegraph", bin);
    text = compile_unknown(dir, dir, exe);
    CHECK(text && strstr(text, want_inst), "installed, run by its full name: %s", text ? text : "(none)");
    free(text);
    /* With nothing beside it the CLI takes the presets folder of the tree it was built in
     * (TG_PRESETS_DIR, compiled in); a binary built in another tree than this one, whose
     * folder is not here, has none to find, so that case is left to the builds run here. */
    struct stat built_in;
    if (stat(TG_PRESETS_DIR, &built_in) || !S_ISDIR(built_in.st_mode)) {
        printf("  nothing beside it: not checked: the presets folder compiled in (%s) is not here\n", TG_PRESETS_DIR);
        return;
    }
    snprintf(exe, sizeof exe, "%s/bare/bin/tunegraph", dir);
    text = compile_unknown(dir, dir, exe);
    CHECK(text && strstr(text, "(presets: bert-base-uncased, bert-large-uncased, distilgpt2, gpt2, llama-3-8b, llama-3.2-1b, "
                               "mobilenet_v2, roberta-base, tiny-bert, tiny-gpt2, tiny-llama, tiny-roberta)"),
          "nothing beside it: %s", text ? text : "(none)");
    free(text);
}

/* Run through a symbolic link by the link's full name, the CLI takes the presets beside the
 * link (the name it was loaded by), not those beside the file the link leads to (which
 * /proc/self/exe names); by a relative name, the file's. */
TG_TEST(test_config_presets_beside_a_link_to_the_program) {
    const char *dir = tg_test_tmpdir();
    char cli[4096], cmd[9000], path[1000];
    REQUIRE(realpath(tg_test_cli(), cli), "no CLI at %s", tg_test_cli());
    snprintf(path, sizeof path, "%s/j.job", dir);
    tg_test_write_file(path, "model = nope\ntask = classify\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = t.jsonl\n");
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/real/bin' '%s/real/share/tunegraph/presets/far' '%s/link/bin' "
             "'%s/link/share/tunegraph/presets/near' && cp '%s' '%s/real/bin/tunegraph' && "
             "ln -s '%s/real/bin/tunegraph' '%s/link/bin/tunegraph' && "
             "cp models/presets/tiny-bert/config.json '%s/real/share/tunegraph/presets/far/' && "
             "cp models/presets/tiny-bert/config.json '%s/link/share/tunegraph/presets/near/'",
             dir, dir, dir, dir, cli, dir, dir, dir, dir, dir);
    REQUIRE(system(cmd) == 0, "cannot lay out the copy and the link");
    char exe[1000], bin[900];
    snprintf(exe, sizeof exe, "%s/link/bin/tunegraph", dir);
    char *text = compile_unknown(dir, dir, exe);
    CHECK(text && strstr(text, "no folder nope/config.json (presets: near)\n"), "by the link's full name: %s",
          text ? text : "(none)");
    free(text);
    snprintf(bin, sizeof bin, "%s/link/bin", dir);
    text = compile_unknown(dir, bin, "./tunegraph");
    CHECK(text && strstr(text, "no folder nope/config.json (presets: far)\n"), "by a relative name: %s",
          text ? text : "(none)");
    free(text);
}

/* A load refused before any config.json is read (no name, a name too long, nothing of
 * that name) leaves the config zeroed, whatever it held before. */
TG_TEST(test_config_load_refused_leaves_the_config_zeroed) {
    char *long_name = malloc(TG_PATH_MAX + 8);
    REQUIRE(long_name, "malloc");
    memset(long_name, 'm', TG_PATH_MAX + 7);
    long_name[TG_PATH_MAX + 7] = 0;
    const char *const sources[] = {"", long_name, "no-such-preset-anywhere", "./no/such/folder"};
    const char *const want[] = {"model: empty model name", "name too long", "no preset of that name", "no preset of that name"};
    static const tg_model_config zero;
    for (int i = 0; i < 4; i++) {
        tg_model_config c;
        memset(&c, 0xAB, sizeof c);
        tg_err err = {{0}};
        CHECK(tg_model_config_load(sources[i], &c, &err) == -1 && strstr(err.msg, want[i]), "source %d: '%s'", i, err.msg);
        CHECK(!memcmp(&c, &zero, sizeof c), "source %d: the config is not zeroed", i);
    }
    tg_model_config c;
    memset(&c, 0xAB, sizeof c);
    tg_err err = {{0}};
    CHECK(tg_model_config_load(NULL, &c, &err) == -1 && !strcmp(err.msg, "model: empty model name") &&
              !memcmp(&c, &zero, sizeof c),
          "NULL: '%s'", err.msg);
    free(long_name);
}

/* tg_model_config_special_ids of a folder named with trailing slashes reads its
 * config.json; of "/" alone (the root, one slash kept) finds none and gives -1, reading
 * nothing before the name (which sits on the heap with no byte to spare). */
TG_TEST(test_config_special_ids_of_slashed_names) {
    const char *dir = tg_test_tmpdir();
    char folder[800], path[900];
    snprintf(folder, sizeof folder, "%s/m", dir);
    snprintf(path, sizeof path, "%s/config.json", folder);
    REQUIRE(mkdir(folder, 0755) == 0 && tg_test_write_file(path, "{\"bos_token_id\": 3, \"eos_token_id\": 4}") == 0,
            "setup");
    char slashed[900];
    snprintf(slashed, sizeof slashed, "%s///", folder);
    int32_t bos = 0, eos = 0;
    tg_model_config_special_ids(slashed, &bos, &eos);
    CHECK(bos == 3 && eos == 4, "%s: bos %d eos %d", slashed, bos, eos);
    static const char *const none[] = {"/", "///"};
    for (int i = 0; i < 2; i++) {
        char *name = malloc(strlen(none[i]) + 1);
        REQUIRE(name, "malloc");
        memcpy(name, none[i], strlen(none[i]) + 1);
        bos = eos = 0;
        tg_model_config_special_ids(name, &bos, &eos);
        CHECK(bos == -1 && eos == -1, "'%s': bos %d eos %d", none[i], bos, eos);
        free(name);
    }
}

/* A config.json whose top level is an array: refused as no object, by the parser and by a
 * load of its folder, which returns -1 like every refusal. */
TG_TEST(test_config_top_level_not_an_object) {
    const char *dir = tg_test_tmpdir();
    static const char *const texts[] = {"[]", "[{\"model_type\": \"bert\"}]"};
    for (int i = 0; i < 2; i++) {
        char folder[800], path[900], want[1200];
        snprintf(folder, sizeof folder, "%s/top%d", dir, i);
        snprintf(path, sizeof path, "%s/config.json", folder);
        REQUIRE(mkdir(folder, 0755) == 0 && tg_test_write_file(path, texts[i]) == 0, "setup %d", i);
        snprintf(want, sizeof want, "%s: expected a JSON object at the top level", path);
        tg_model_config c;
        tg_err err = {{0}};
        int rc = tg_model_config_parse(path, &c, &err);
        CHECK(rc == -1 && !strcmp(err.msg, want), "parse '%s': rc %d '%s'", texts[i], rc, err.msg);
        memset(&err, 0, sizeof err);
        rc = tg_model_config_load(folder, &c, &err);
        CHECK(rc == -1 && !strcmp(err.msg, want), "load '%s': rc %d '%s'", texts[i], rc, err.msg);
    }
    /* A field refused: the load returns -1 too. */
    char folder[800], path[900];
    snprintf(folder, sizeof folder, "%s/bad_field", dir);
    snprintf(path, sizeof path, "%s/config.json", folder);
    REQUIRE(mkdir(folder, 0755) == 0 && tg_test_write_file(path, "{\"model_type\": \"bert\"}") == 0, "setup");
    tg_model_config c;
    tg_err err = {{0}};
    const int rc = tg_model_config_load(folder, &c, &err);
    CHECK(rc == -1 && strstr(err.msg, "config.json: field 'vocab_size': missing"), "rc %d '%s'", rc, err.msg);
}

/* A name with a slash is a folder, never a preset: "tiny-bert/" (from a folder without a
 * tiny-bert folder) is refused, while the preset's own folder named as a path loads. */
TG_TEST(test_config_slashed_names_are_folders) {
    tg_model_config c;
    tg_err err = {{0}};
    const char *want = "model 'tiny-bert/': no preset of that name and no folder tiny-bert/config.json (presets: ";
    CHECK(tg_model_config_load("tiny-bert/", &c, &err) == -1 && !strncmp(err.msg, want, strlen(want)), "'%s'",
          err.msg);
    const char *want2 = "model './tiny-bert': no preset of that name and no folder ./tiny-bert/config.json (presets: ";
    CHECK(tg_model_config_load("./tiny-bert", &c, &err) == -1 && !strncmp(err.msg, want2, strlen(want2)), "'%s'",
          err.msg);
    char folder[800];
    snprintf(folder, sizeof folder, "%s/tiny-bert/", tg_presets_dir());
    CHECK(tg_model_config_load(folder, &c, &err) == 0 && c.arch == TG_ARCH_BERT && c.hidden == 32 &&
              !strcmp(c.source, folder),
          "%s: %s", folder, err.msg);
}
