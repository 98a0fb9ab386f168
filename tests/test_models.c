/* safetensors reader/writer and config.json / preset parsing. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/model_config.h"
#include "models/safetensors.h"
#include "tests/harness.h"

#define CHECK_MSG(err, s) CHECK(strstr((err).msg, (s)) != NULL, "message '%s' lacks '%s'", (err).msg, (s))

/* Writes a safetensors file by hand: 8-byte little-endian length, header, data. */
static int write_raw_st(const char *path, const char *header, const void *data, size_t data_len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t hlen = strlen(header);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hlen >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header, 1, hlen, f) == hlen &&
             (data_len == 0 || fwrite(data, 1, data_len, f) == data_len);
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int float_bits_equal(float a, uint32_t bits) {
    uint32_t b;
    memcpy(&b, &a, 4);
    return b == bits;
}

TG_TEST(test_st_roundtrip) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);

    float a[3 * 5 * 7], scalar = -2.5f, c[3 * 1 * 2];
    int32_t ids[5] = {0, -1, 2147483647, -2147483647 - 1, 42};
    tg_test_fill_uniform(a, 105, 1, -3, 3);
    tg_test_fill_uniform(c, 6, 2, -1, 1);
    int64_t sa[] = {3, 5, 7}, sids[] = {5}, sc[] = {3, 1, 2}, sempty[] = {0, 4};
    tg_st_item items[] = {
        {"layer.0.weight", TG_ST_F32, 3, sa, a},
        {"input_ids", TG_ST_I32, 1, sids, ids},
        {"scale", TG_ST_F32, 0, NULL, &scalar},
        {"odd", TG_ST_F32, 3, sc, c},
        {"empty", TG_ST_F32, 2, sempty, NULL},
    };
    tg_err err = {{0}};
    REQUIRE(tg_st_write(path, items, 5, &err) == 0, "write: %s", err.msg);
    CHECK(tg_test_count_files(dir) == 1, "temporary file left behind (%d files)", tg_test_count_files(dir));

    long len = 0;
    char *raw = tg_test_read_file(path, &len);
    REQUIRE(raw && len >= 8, "cannot read back");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (uint8_t)raw[i];
    CHECK(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
    CHECK((uint64_t)len == 8 + hlen + 105 * 4 + 5 * 4 + 4 + 6 * 4, "file size %ld", len);
    free(raw);

    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "open: %s", err.msg);
    CHECK(st.n == 5, "n = %d", st.n);
    const tg_st_entry *e = tg_st_find(&st, "layer.0.weight");
    REQUIRE(e, "layer.0.weight missing");
    CHECK(e->dtype == TG_ST_F32 && e->ndim == 3 && e->shape[0] == 3 && e->shape[1] == 5 && e->shape[2] == 7,
          "layer.0.weight header wrong");
    float back[105];
    REQUIRE(tg_st_read_f32(&st, e, back, 105, &err) == 0, "%s", err.msg);
    CHECK(memcmp(back, a, sizeof a) == 0, "F32 data differs");

    e = tg_st_find(&st, "input_ids");
    REQUIRE(e && e->dtype == TG_ST_I32 && e->ndim == 1 && e->shape[0] == 5, "input_ids header wrong");
    int32_t ib[5];
    REQUIRE(tg_st_read_i32(&st, e, ib, 5, &err) == 0, "%s", err.msg);
    CHECK(memcmp(ib, ids, sizeof ids) == 0, "I32 data differs");

    e = tg_st_find(&st, "scale");
    REQUIRE(e && e->ndim == 0 && tg_st_numel(e) == 1, "scalar header wrong");
    float sb = 0;
    REQUIRE(tg_st_read_f32(&st, e, &sb, 1, &err) == 0, "%s", err.msg);
    CHECK(sb == -2.5f, "scalar = %g", sb);

    e = tg_st_find(&st, "odd");
    float cb[6];
    REQUIRE(e && tg_st_read_f32(&st, e, cb, 6, &err) == 0, "odd: %s", err.msg);
    CHECK(memcmp(cb, c, sizeof c) == 0, "odd data differs");

    e = tg_st_find(&st, "empty");
    REQUIRE(e && tg_st_numel(e) == 0 && e->begin == e->end, "empty tensor header wrong");
    CHECK(tg_st_read_f32(&st, e, NULL, 0, &err) == 0, "%s", err.msg);
    CHECK(tg_st_find(&st, "nope") == NULL, "found a tensor that does not exist");
    CHECK(tg_st_read_i32(&st, tg_st_find(&st, "scale"), ib, 1, &err) != 0, "read F32 as I32 succeeded");
    CHECK_MSG(err, "'scale'");
    tg_st_close(&st);
    tg_st_close(&st); /* closing twice is harmless */

    /* Rewriting replaces the file atomically and leaves only it. */
    tg_st_item one[] = {{"x", TG_ST_F32, 0, NULL, &scalar}};
    REQUIRE(tg_st_write(path, one, 1, &err) == 0, "rewrite: %s", err.msg);
    REQUIRE(tg_st_open(path, &st, &err) == 0, "reopen: %s", err.msg);
    CHECK(st.n == 1 && tg_st_find(&st, "x"), "rewrite kept old contents");
    tg_st_close(&st);
    CHECK(tg_test_count_files(dir) == 1, "files left behind after rewrite");
}

TG_TEST(test_st_half_conversion) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/half.safetensors", dir);
    /* f16 bit patterns and the exact float32 bit patterns they denote */
    static const uint16_t h[] = {0x0000, 0x8000, 0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff,
                                 0x0400, 0x7c00, 0xfc00, 0x3555, 0x8001};
    static const uint32_t hf[] = {0x00000000, 0x80000000, 0x3f800000, 0xc0000000, 0x477fe000, 0x33800000,
                                  0x387fc000, 0x38800000, 0x7f800000, 0xff800000, 0x3eaaa000, 0xb3800000};
    static const uint16_t b[] = {0x3f80, 0xc049, 0x7f80, 0x0001, 0x8000, 0x7fc0};
    double d[] = {0.1, -1e300, 3.0};
    int64_t i64[] = {7, -8, 2147483647};
    int64_t big[] = {1, 2147483648LL};
    uint8_t data[24 + 12 + 24 + 24 + 16 + 1];
    memcpy(data, h, 24);
    memcpy(data + 24, b, 12);
    memcpy(data + 36, d, 24);
    memcpy(data + 60, i64, 24);
    memcpy(data + 84, big, 16);
    data[100] = 1;
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[0,24]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[6],\"data_offsets\":[24,36]},"
        "\"d\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[36,60]},"
        "\"i\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[60,84]},"
        "\"big\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[84,100]},"
        "\"flag\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[100,101]}}";
    REQUIRE(write_raw_st(path, hdr, data, sizeof data) == 0, "cannot write %s", path);

    tg_safetensors st;
    tg_err err = {{0}};
    REQUIRE(tg_st_open(path, &st, &err) == 0, "open: %s", err.msg);
    CHECK(st.n == 6, "n = %d (metadata must not count)", st.n);
    float out[12];
    REQUIRE(tg_st_read_f32(&st, tg_st_find(&st, "h"), out, 12, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 12; i++) CHECK(float_bits_equal(out[i], hf[i]), "f16 0x%04x -> %a", h[i], out[i]);

    REQUIRE(tg_st_read_f32(&st, tg_st_find(&st, "b"), out, 6, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 6; i++)
        CHECK(float_bits_equal(out[i], (uint32_t)b[i] << 16), "bf16 0x%04x -> %a", b[i], out[i]);
    CHECK(out[1] == -3.140625f && isnan(out[5]), "bf16 values wrong");

    REQUIRE(tg_st_read_f32(&st, tg_st_find(&st, "d"), out, 3, &err) == 0, "%s", err.msg);
    CHECK(out[0] == (float)0.1 && isinf(out[1]) && out[1] < 0 && out[2] == 3.0f, "f64 -> %g %g %g", out[0],
          out[1], out[2]);

    int32_t iv[3];
    REQUIRE(tg_st_read_i32(&st, tg_st_find(&st, "i"), iv, 3, &err) == 0, "%s", err.msg);
    CHECK(iv[0] == 7 && iv[1] == -8 && iv[2] == 2147483647, "i64 -> %d %d %d", iv[0], iv[1], iv[2]);
    CHECK(tg_st_read_i32(&st, tg_st_find(&st, "big"), iv, 2, &err) != 0, "int32 overflow not caught");
    CHECK_MSG(err, "'big'");
    CHECK_MSG(err, "2147483648");
    CHECK(tg_st_read_f32(&st, tg_st_find(&st, "i"), out, 3, &err) != 0, "I64 read as float");
    CHECK_MSG(err, "I64");
    CHECK(tg_st_read_f32(&st, tg_st_find(&st, "flag"), out, 1, &err) != 0, "BOOL read as float");
    tg_st_close(&st);
}

typedef struct bad_case {
    const char *what;
    const char *header; /* NULL: raw bytes below */
    size_t data_len;
    const char *expect[3];
} bad_case;

TG_TEST(test_st_bad_files) {
    const char *dir = tg_test_tmpdir();
    static const bad_case cases[] = {
        {"invalid JSON", "{\"w\": {\"dtype\": ", 0, {"not valid JSON", "line 1"}},
        {"not an object", "[1, 2]", 0, {"not a JSON object"}},
        {"unknown dtype", "{\"w\":{\"dtype\":\"F8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2,
         {"tensor 'w'", "unknown dtype 'F8'"}},
        {"missing dtype", "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, {"tensor 'w'", "'dtype'"}},
        {"negative dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
         {"tensor 'w'", "'shape'"}},
        {"too many dims", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
         {"tensor 'w'", "9 dimensions"}},
        {"offsets past data", "{\"w\":{\"dtype\":\"F32\",\"shape\":[16],\"data_offsets\":[0,64]}}", 16,
         {"tensor 'w'", "data_offsets [0, 64] out of range", "16 bytes"}},
        {"begin after end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 16,
         {"tensor 'w'", "out of range"}},
        {"wrong byte size",
         "{\"bert.pooler.dense.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 24,
         {"tensor 'bert.pooler.dense.weight'", "data_offsets [0, 16] hold 16 bytes but shape [2, 3] of F32 needs 24"}},
        {"overlap",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
         24, {"'a'", "'b'", "overlap"}},
        {"metadata not strings", "{\"__metadata__\":{\"n\":3}}", 0, {"__metadata__", "'n'"}},
    };
    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    uint8_t zeros[64] = {0};
    for (int i = 0; i < n_cases; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/bad%d.safetensors", dir, i);
        REQUIRE(write_raw_st(path, cases[i].header, zeros, cases[i].data_len) == 0, "write %s", path);
        tg_safetensors st;
        tg_err err = {{0}};
        int rc = tg_st_open(path, &st, &err);
        if (!CHECK(rc != 0, "%s: opened a bad file", cases[i].what)) {
            tg_st_close(&st);
            continue;
        }
        CHECK(st.n == 0 && st.entries == NULL && st.map == NULL, "%s: failed open left state", cases[i].what);
        CHECK_MSG(err, path);
        for (int k = 0; k < 3 && cases[i].expect[k]; k++) CHECK_MSG(err, cases[i].expect[k]);
    }

    /* Truncated files and impossible header lengths, written byte by byte. */
    char path[600];
    tg_safetensors st;
    tg_err err = {{0}};
    snprintf(path, sizeof path, "%s/short.safetensors", dir);
    REQUIRE(tg_test_write_file(path, "abcd") == 0, "write");
    CHECK(tg_st_open(path, &st, &err) != 0, "opened a 4-byte file");
    CHECK_MSG(err, path);
    CHECK_MSG(err, "too short");

    snprintf(path, sizeof path, "%s/pastend.safetensors", dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "fopen");
    uint8_t bytes[20] = {0xe8, 0x03}; /* header length 1000, file only 20 bytes */
    fwrite(bytes, 1, sizeof bytes, f);
    fclose(f);
    CHECK(tg_st_open(path, &st, &err) != 0, "header length past EOF accepted");
    CHECK_MSG(err, path);
    CHECK_MSG(err, "header length 1000 runs past the end");

    /* A whole valid file cut short: the data section shrinks below the offsets. */
    snprintf(path, sizeof path, "%s/cut.safetensors", dir);
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[8],\"data_offsets\":[0,32]}}";
    REQUIRE(write_raw_st(path, hdr, zeros, 20) == 0, "write");
    CHECK(tg_st_open(path, &st, &err) != 0, "truncated data accepted");
    CHECK_MSG(err, "tensor 'w'");
    CHECK_MSG(err, "out of range");

    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    CHECK(tg_st_open(path, &st, &err) != 0, "opened a missing file");
    CHECK_MSG(err, path);
}

TG_TEST(test_st_wrong_shape) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    float w[6] = {1, 2, 3, 4, 5, 6};
    int32_t ids[6] = {0};
    int64_t s[] = {2, 3};
    tg_st_item items[] = {{"encoder.w", TG_ST_F32, 2, s, w}, {"ids", TG_ST_I32, 2, s, ids}};
    tg_err err = {{0}};
    REQUIRE(tg_st_write(path, items, 2, &err) == 0, "%s", err.msg);
    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    float out[8];
    CHECK(tg_st_read_f32(&st, tg_st_find(&st, "encoder.w"), out, 8, &err) != 0, "wrong numel accepted");
    CHECK_MSG(err, path);
    CHECK_MSG(err, "'encoder.w'");
    CHECK_MSG(err, "[2, 3]");
    CHECK_MSG(err, "6 elements");
    CHECK_MSG(err, "8 elements");
    int32_t iout[4];
    CHECK(tg_st_read_i32(&st, tg_st_find(&st, "ids"), iout, 4, &err) != 0, "wrong numel accepted (i32)");
    CHECK_MSG(err, "'ids'");
    CHECK_MSG(err, "4 elements");
    tg_st_close(&st);
}

TG_TEST(test_st_write_failures) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/out.safetensors", dir);
    float x[4] = {0};
    int64_t s[] = {4}, neg[] = {-1};
    tg_err err = {{0}};

    tg_st_item bad_dtype[] = {{"x", TG_ST_F16, 1, s, x}};
    CHECK(tg_st_write(path, bad_dtype, 1, &err) != 0, "F16 write accepted");
    CHECK_MSG(err, "'x'");
    CHECK(tg_test_count_files(dir) == 0, "file left after a bad dtype");

    tg_st_item dup[] = {{"x", TG_ST_F32, 1, s, x}, {"x", TG_ST_F32, 1, s, x}};
    CHECK(tg_st_write(path, dup, 2, &err) != 0, "duplicate names accepted");
    CHECK_MSG(err, "'x'");
    CHECK(tg_test_count_files(dir) == 0, "file left after duplicate names");

    tg_st_item negative[] = {{"y", TG_ST_F32, 1, neg, x}};
    CHECK(tg_st_write(path, negative, 1, &err) != 0, "negative dimension accepted");
    CHECK_MSG(err, "'y'");
    CHECK(tg_test_count_files(dir) == 0, "file left after a negative dimension");

    tg_st_item ok[] = {{"x", TG_ST_F32, 1, s, x}};
    /* The final rename fails (a folder sits at the target): the temp file must go. */
    REQUIRE(mkdir(path, 0755) == 0, "mkdir");
    CHECK(tg_st_write(path, ok, 1, &err) != 0, "write over a folder succeeded");
    CHECK_MSG(err, path);
    CHECK(tg_test_count_files(dir) == 1, "temp file left after a failed rename (%d entries)",
          tg_test_count_files(dir));
    rmdir(path);

    char missing[700];
    snprintf(missing, sizeof missing, "%s/no/such/dir/out.safetensors", dir);
    CHECK(tg_st_write(missing, ok, 1, &err) != 0, "write into a missing folder succeeded");
    CHECK_MSG(err, "cannot create");
    CHECK(tg_test_count_files(dir) == 0, "files left behind");
}

/* ---------------- config.json ---------------- */

typedef struct preset_expect {
    const char *name;
    int arch, vocab, hidden, layers, heads, inter, max_pos, type_vocab, pad, gelu;
    float eps, drop;
} preset_expect;

TG_TEST(test_config_presets) {
    static const preset_expect p[] = {
        {"bert-base-uncased", TG_ARCH_BERT, 30522, 768, 12, 12, 3072, 512, 2, 0, TG_GELU_ERF, 1e-12f, 0.1f},
        {"bert-large-uncased", TG_ARCH_BERT, 30522, 1024, 24, 16, 4096, 512, 2, 0, TG_GELU_ERF, 1e-12f, 0.1f},
        {"roberta-base", TG_ARCH_ROBERTA, 50265, 768, 12, 12, 3072, 514, 1, 1, TG_GELU_ERF, 1e-5f, 0.1f},
        {"gpt2", TG_ARCH_GPT2, 50257, 768, 12, 12, 3072, 1024, 0, -1, TG_GELU_TANH, 1e-5f, 0.1f},
        {"distilgpt2", TG_ARCH_GPT2, 50257, 768, 6, 12, 3072, 1024, 0, -1, TG_GELU_TANH, 1e-5f, 0.1f},
        {"tiny-bert", TG_ARCH_BERT, 128, 32, 2, 4, 64, 64, 2, 0, TG_GELU_ERF, 1e-12f, 0.1f},
        {"tiny-roberta", TG_ARCH_ROBERTA, 128, 32, 2, 4, 64, 66, 1, 1, TG_GELU_ERF, 1e-5f, 0.1f},
        {"tiny-gpt2", TG_ARCH_GPT2, 128, 32, 2, 4, 128, 64, 0, 0, TG_GELU_TANH, 1e-5f, 0.1f},
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) {
        tg_model_config c;
        tg_err err = {{0}};
        if (!CHECK(tg_model_config_load(p[i].name, &c, &err) == 0, "%s: %s", p[i].name, err.msg)) continue;
        const char *n = p[i].name;
        CHECK(strcmp(c.source, n) == 0, "%s: source '%s'", n, c.source);
        CHECK(c.weights[0] == 0, "%s: presets have no weights, got '%s'", n, c.weights);
        CHECK(c.arch == p[i].arch, "%s: arch %d", n, c.arch);
        CHECK(c.vocab_size == p[i].vocab, "%s: vocab %d", n, c.vocab_size);
        CHECK(c.hidden == p[i].hidden, "%s: hidden %d", n, c.hidden);
        CHECK(c.layers == p[i].layers, "%s: layers %d", n, c.layers);
        CHECK(c.heads == p[i].heads, "%s: heads %d", n, c.heads);
        CHECK(c.intermediate == p[i].inter, "%s: intermediate %d", n, c.intermediate);
        CHECK(c.max_positions == p[i].max_pos, "%s: max_positions %d", n, c.max_positions);
        CHECK(c.type_vocab_size == p[i].type_vocab, "%s: type_vocab %d", n, c.type_vocab_size);
        CHECK(c.pad_token_id == p[i].pad, "%s: pad %d", n, c.pad_token_id);
        CHECK(c.gelu == p[i].gelu, "%s: gelu %d", n, c.gelu);
        CHECK(c.layer_norm_eps == p[i].eps, "%s: eps %g", n, c.layer_norm_eps);
        CHECK(c.initializer_range == 0.02f, "%s: init range %g", n, c.initializer_range);
        CHECK(c.hidden_dropout == p[i].drop && c.attention_dropout == p[i].drop && c.embedding_dropout == p[i].drop,
              "%s: dropouts %g %g %g", n, c.hidden_dropout, c.attention_dropout, c.embedding_dropout);
        float cls = p[i].arch == TG_ARCH_GPT2 ? 0.0f : p[i].drop;
        CHECK(c.classifier_dropout == cls, "%s: classifier dropout %g", n, c.classifier_dropout);
    }
}

/* Writes the tiny-bert (or tiny-gpt2) preset, edited by `edit`, to dir/name/config.json. */
static void write_edited(const char *preset, const char *dir, const char *name, void (*edit)(json_t *),
                         char *path_out, size_t cap) {
    char src[1100], folder[700];
    snprintf(src, sizeof src, "%s/%s/config.json", tg_presets_dir(), preset);
    json_t *root = json_load_file(src, 0, NULL);
    if (!root) abort();
    edit(root);
    snprintf(folder, sizeof folder, "%s/%s", dir, name);
    mkdir(folder, 0755);
    snprintf(path_out, cap, "%s/config.json", folder);
    if (json_dump_file(root, path_out, JSON_INDENT(2)) != 0) abort();
    json_decref(root);
}

static void e_no_hidden(json_t *r) { json_object_del(r, "hidden_size"); }
static void e_hidden_str(json_t *r) { json_object_set_new(r, "hidden_size", json_string("32")); }
static void e_hidden_real(json_t *r) { json_object_set_new(r, "hidden_size", json_real(32.0)); }
static void e_layers_zero(json_t *r) { json_object_set_new(r, "num_hidden_layers", json_integer(0)); }
static void e_type_t5(json_t *r) { json_object_set_new(r, "model_type", json_string("t5")); }
static void e_no_type(json_t *r) { json_object_del(r, "model_type"); }
static void e_heads(json_t *r) { json_object_set_new(r, "num_attention_heads", json_integer(5)); }
static void e_relu(json_t *r) { json_object_set_new(r, "hidden_act", json_string("relu")); }
static void e_relative(json_t *r) { json_object_set_new(r, "position_embedding_type", json_string("relative_key")); }
static void e_eps_str(json_t *r) { json_object_set_new(r, "layer_norm_eps", json_string("tiny")); }
static void e_drop_big(json_t *r) { json_object_set_new(r, "hidden_dropout_prob", json_real(1.5)); }
static void e_g_relu(json_t *r) { json_object_set_new(r, "activation_function", json_string("relu")); }
static void e_g_inv(json_t *r) { json_object_set_new(r, "scale_attn_by_inverse_layer_idx", json_true()); }
static void e_g_reorder(json_t *r) { json_object_set_new(r, "reorder_and_upcast_attn", json_true()); }
static void e_g_heads(json_t *r) { json_object_set_new(r, "n_head", json_integer(3)); }
static void e_g_no_embd(json_t *r) { json_object_del(r, "n_embd"); }
static void e_g_inner_neg(json_t *r) { json_object_set_new(r, "n_inner", json_integer(-4)); }

typedef struct config_case {
    const char *preset;
    void (*edit)(json_t *);
    const char *field;
    const char *detail;
} config_case;

TG_TEST(test_config_malformed) {
    const char *dir = tg_test_tmpdir();
    static const config_case cases[] = {
        {"tiny-bert", e_no_hidden, "field 'hidden_size'", "missing"},
        {"tiny-bert", e_hidden_str, "field 'hidden_size'", "expected a positive integer"},
        {"tiny-bert", e_hidden_real, "field 'hidden_size'", "expected a positive integer"},
        {"tiny-bert", e_layers_zero, "field 'num_hidden_layers'", "expected a positive integer"},
        {"tiny-bert", e_type_t5, "field 'model_type'", "'t5'"},
        {"tiny-bert", e_no_type, "field 'model_type'", "missing"},
        {"tiny-bert", e_heads, "field 'num_attention_heads'", "not divisible"},
        {"tiny-bert", e_relu, "field 'hidden_act'", "'relu'"},
        {"tiny-bert", e_relative, "field 'position_embedding_type'", "relative_key"},
        {"tiny-bert", e_eps_str, "field 'layer_norm_eps'", "expected a number"},
        {"tiny-bert", e_drop_big, "field 'hidden_dropout_prob'", "out of range"},
        {"tiny-roberta", e_no_hidden, "field 'hidden_size'", "missing"},
        {"tiny-gpt2", e_g_relu, "field 'activation_function'", "'relu'"},
        {"tiny-gpt2", e_g_inv, "field 'scale_attn_by_inverse_layer_idx'", "not supported"},
        {"tiny-gpt2", e_g_reorder, "field 'reorder_and_upcast_attn'", "not supported"},
        {"tiny-gpt2", e_g_heads, "field 'n_head'", "not divisible"},
        {"tiny-gpt2", e_g_no_embd, "field 'n_embd'", "missing"},
        {"tiny-gpt2", e_g_inner_neg, "field 'n_inner'", "positive integer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32], path[1100];
        snprintf(name, sizeof name, "m%zu", i);
        write_edited(cases[i].preset, dir, name, cases[i].edit, path, sizeof path);
        tg_model_config c;
        tg_err err = {{0}};
        if (!CHECK(tg_model_config_parse(path, &c, &err) != 0, "case %zu (%s) parsed", i, cases[i].field))
            continue;
        CHECK_MSG(err, path);
        CHECK_MSG(err, cases[i].field);
        CHECK_MSG(err, cases[i].detail);
        /* Loading the folder reports the same error. */
        char folder[700];
        snprintf(folder, sizeof folder, "%s/%s", dir, name);
        CHECK(tg_model_config_load(folder, &c, &err) != 0, "case %zu loaded", i);
        CHECK_MSG(err, cases[i].field);
    }

    /* Malformed JSON reports jansson's line and column. */
    char path[700];
    snprintf(path, sizeof path, "%s/bad.json", dir);
    REQUIRE(tg_test_write_file(path, "{\n  \"model_type\": \"bert\",\n  \"hidden_size\": 32,,\n}\n") == 0, "write");
    tg_model_config c;
    tg_err err = {{0}};
    CHECK(tg_model_config_parse(path, &c, &err) != 0, "invalid JSON parsed");
    CHECK_MSG(err, path);
    CHECK_MSG(err, "line 3");
    CHECK_MSG(err, "column");

    REQUIRE(tg_test_write_file(path, "[1, 2]") == 0, "write");
    CHECK(tg_model_config_parse(path, &c, &err) != 0, "array parsed");
    CHECK_MSG(err, path);

    snprintf(path, sizeof path, "%s/absent.json", dir);
    CHECK(tg_model_config_parse(path, &c, &err) != 0, "missing file parsed");
    CHECK_MSG(err, path);
}

static void e_cls(json_t *r) { json_object_set_new(r, "classifier_dropout", json_real(0.25)); }
static void e_tanh(json_t *r) { json_object_set_new(r, "hidden_act", json_string("gelu_pytorch_tanh")); }
static void e_g_erf(json_t *r) {
    json_object_set_new(r, "activation_function", json_string("gelu"));
    json_object_set_new(r, "n_inner", json_integer(48));
    json_object_del(r, "pad_token_id");
}

TG_TEST(test_config_variants) {
    const char *dir = tg_test_tmpdir();
    char path[1100];
    tg_model_config c;
    tg_err err = {{0}};
    write_edited("tiny-bert", dir, "cls", e_cls, path, sizeof path);
    REQUIRE(tg_model_config_parse(path, &c, &err) == 0, "%s", err.msg);
    CHECK(c.classifier_dropout == 0.25f && c.hidden_dropout == 0.1f, "classifier dropout %g",
          c.classifier_dropout);

    write_edited("tiny-bert", dir, "tanh", e_tanh, path, sizeof path);
    REQUIRE(tg_model_config_parse(path, &c, &err) == 0, "%s", err.msg);
    CHECK(c.gelu == TG_GELU_TANH, "gelu_pytorch_tanh -> %d", c.gelu);

    write_edited("tiny-gpt2", dir, "erf", e_g_erf, path, sizeof path);
    REQUIRE(tg_model_config_parse(path, &c, &err) == 0, "%s", err.msg);
    CHECK(c.gelu == TG_GELU_ERF, "gpt2 gelu -> %d", c.gelu);
    CHECK(c.intermediate == 48, "n_inner -> %d", c.intermediate);
    CHECK(c.pad_token_id == -1, "absent pad -> %d", c.pad_token_id);

    /* $TUNEGRAPH_PRESETS redirects preset lookup. */
    const char *old = getenv("TUNEGRAPH_PRESETS");
    char *saved = old ? strdup(old) : NULL;
    char presets[1100];
    snprintf(presets, sizeof presets, "%s", dir);
    setenv("TUNEGRAPH_PRESETS", presets, 1);
    CHECK(strcmp(tg_presets_dir(), presets) == 0, "presets dir %s", tg_presets_dir());
    int rc = tg_model_config_load("cls", &c, &err);
    CHECK(rc == 0 && c.classifier_dropout == 0.25f, "env preset: %s", rc ? err.msg : "wrong values");
    CHECK(tg_model_config_load("tiny-bert", &c, &err) != 0, "tiny-bert found outside the redirected folder");
    CHECK_MSG(err, "cls, erf, tanh");
    if (saved) setenv("TUNEGRAPH_PRESETS", saved, 1);
    else unsetenv("TUNEGRAPH_PRESETS");
    free(saved);
}

TG_TEST(test_config_folder_weights) {
    const char *dir = tg_test_tmpdir();
    char folder[700], config[800], weights[800], src[1100];
    snprintf(folder, sizeof folder, "%s/my-model", dir);
    REQUIRE(mkdir(folder, 0755) == 0, "mkdir");
    snprintf(src, sizeof src, "%s/tiny-roberta/config.json", tg_presets_dir());
    char *text = tg_test_read_file(src, NULL);
    REQUIRE(text, "cannot read %s", src);
    snprintf(config, sizeof config, "%s/config.json", folder);
    REQUIRE(tg_test_write_file(config, text) == 0, "write config");
    free(text);

    tg_model_config c;
    tg_err err = {{0}};
    REQUIRE(tg_model_config_load(folder, &c, &err) == 0, "%s", err.msg);
    CHECK(strcmp(c.source, folder) == 0, "source '%s'", c.source);
    CHECK(c.weights[0] == 0, "weights '%s' without a safetensors file", c.weights);
    CHECK(c.arch == TG_ARCH_ROBERTA && c.max_positions == 66 && c.pad_token_id == 1, "values wrong");

    float x = 1;
    tg_st_item item = {"roberta.embeddings.word_embeddings.weight", TG_ST_F32, 0, NULL, &x};
    snprintf(weights, sizeof weights, "%s/model.safetensors", folder);
    REQUIRE(tg_st_write(weights, &item, 1, &err) == 0, "%s", err.msg);
    REQUIRE(tg_model_config_load(folder, &c, &err) == 0, "%s", err.msg);
    CHECK(strcmp(c.weights, weights) == 0, "weights '%s', expected '%s'", c.weights, weights);

    char slash[800];
    snprintf(slash, sizeof slash, "%s/", folder);
    REQUIRE(tg_model_config_load(slash, &c, &err) == 0, "%s", err.msg);
    CHECK(strcmp(c.weights, weights) == 0, "trailing slash: weights '%s'", c.weights);
}

TG_TEST(test_config_unknown_model) {
    tg_model_config c;
    tg_err err = {{0}};
    CHECK(tg_model_config_load("no-such-model", &c, &err) != 0, "unknown model loaded");
    CHECK_MSG(err, "model 'no-such-model'");
    CHECK_MSG(err, "no preset of that name");
    CHECK_MSG(err, "no-such-model/config.json");
    CHECK_MSG(err, "bert-base-uncased");
    CHECK_MSG(err, "tiny-gpt2");

    const char *dir = tg_test_tmpdir();
    CHECK(tg_model_config_load(dir, &c, &err) != 0, "folder without config.json loaded");
    CHECK_MSG(err, dir);
    CHECK(tg_model_config_load("", &c, &err) != 0, "empty name loaded");
}
