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
        /* Llama: no token types, no padding id, no dropout (its GQA and rotary fields:
         * tests/test_models_config_llama.c) */
        {"llama-3-8b", TG_ARCH_LLAMA, 128256, 4096, 32, 32, 14336, 8192, 0, -1, TG_GELU_ERF, 1e-5f, 0.0f},
        {"llama-3.2-1b", TG_ARCH_LLAMA, 128256, 2048, 16, 32, 8192, 131072, 0, -1, TG_GELU_ERF, 1e-5f, 0.0f},
        {"tiny-llama", TG_ARCH_LLAMA, 128, 64, 2, 4, 96, 128, 0, -1, TG_GELU_ERF, 1e-5f, 0.0f},
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
/* Names that sort before and after "gelu" and share its start: refused as well. */
static void e_elu(json_t *r) { json_object_set_new(r, "hidden_act", json_string("elu")); }
static void e_gelu_fast(json_t *r) { json_object_set_new(r, "hidden_act", json_string("gelu_fast")); }
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
        {"tiny-bert", e_elu, "field 'hidden_act'", "unsupported activation 'elu' (supported: gelu, gelu_new, gelu_pytorch_tanh)"},
        {"tiny-bert", e_gelu_fast, "field 'hidden_act'", "unsupported activation 'gelu_fast'"},
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

/* ---------------- strict parsing: bad inputs refused by name ---------------- */

/* Opens a hand-written safetensors file and expects a refusal naming the file and each needle. */
static void expect_st_refused(const char *name, const char *header, const void *data, size_t data_len,
                              const char *n1, const char *n2) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s.safetensors", tg_test_tmpdir(), name);
    REQUIRE(write_raw_st(path, header, data, data_len) == 0, "write %s", path);
    tg_safetensors st;
    tg_err err = {{0}};
    if (!CHECK(tg_st_open(path, &st, &err) != 0, "%s: opened", name)) {
        tg_st_close(&st);
        return;
    }
    CHECK(st.n == 0 && st.entries == NULL && st.map == NULL, "%s: failed open left state", name);
    CHECK_MSG(err, path);
    if (n1) CHECK_MSG(err, n1);
    if (n2) CHECK_MSG(err, n2);
}

/* A key named twice in one object: jansson would keep the last value, even over an
 * invalid first one. */
TG_TEST(test_st_duplicate_keys) {
    static const uint8_t zeros[16] = {0};
    expect_st_refused("dup-tensor",
                      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                      zeros, 16, "key 'w' appears twice", "line 1");
    /* A long name, past the 20 characters jansson quotes itself. */
    expect_st_refused("dup-long",
                      "{\"bert.encoder.layer.0.attention.self.query.weight\":{\"dtype\":\"F32\",\"shape\":[1],"
                      "\"data_offsets\":[0,4]},\n\"bert.encoder.layer.0.attention.self.query.weight\":{\"dtype\":"
                      "\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      zeros, 8, "key 'bert.encoder.layer.0.attention.self.query.weight' appears twice", "line 2");
    expect_st_refused("dup-field", "{\"w\":{\"dtype\":\"BOOL\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                      zeros, 4, "key 'dtype' appears twice", NULL);
    expect_st_refused("dup-metadata",
                      "{\"__metadata__\":{\"format\":\"pt\",\"format\":\"tf\"},"
                      "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                      zeros, 4, "key 'format' appears twice", NULL);
    expect_st_refused("dup-escaped",
                      "{\"a\\\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\\\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      zeros, 8, "key 'a\"b' appears twice", NULL);
}

/* The tensors must tile the data section: no hole, no overlap, no trailing bytes. */
TG_TEST(test_st_tiling) {
    static const uint8_t zeros[64] = {0};
    expect_st_refused("hole-first", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", zeros, 16,
                      "bytes [0, 8) of the data section belong to no tensor", "before 'w'");
    expect_st_refused("hole-between",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
                      zeros, 16, "bytes [8, 12)", "between 'a' and 'b'");
    expect_st_refused("trailing", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", zeros, 9,
                      "holds 9 bytes but its tensors end at byte 8", "1 trailing byte belong");
    expect_st_refused("no-tensors-data", "{\"__metadata__\":{\"format\":\"pt\"}}", zeros, 4, "names no tensor",
                      "4 bytes of data");
    expect_st_refused("empty-inside",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}",
                      zeros, 8, "'a' [0, 8] and 'e' [4, 4] overlap", NULL);
    expect_st_refused("same-start",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                      zeros, 8, "overlap", NULL);

    /* Empty tensors on the boundaries, out of order in the header, are a valid tiling. */
    char path[600];
    snprintf(path, sizeof path, "%s/tiled.safetensors", tg_test_tmpdir());
    REQUIRE(write_raw_st(path,
                         "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[12,12]},"
                         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
                         "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                         zeros, 12) == 0,
            "write");
    tg_safetensors st;
    tg_err err = {{0}};
    CHECK(tg_st_open(path, &st, &err) == 0, "valid tiling refused: %s", err.msg);
    tg_st_close(&st);
}

/* A header length that is off by one shifts every tensor by a byte: refused, with the
 * length named. */
TG_TEST(test_st_header_length_off) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    float w[4] = {1, 2, 3, 4};
    int64_t shape[] = {4};
    tg_st_item item = {"w", TG_ST_F32, 1, shape, w};
    tg_err err = {{0}};
    REQUIRE(tg_st_write(path, &item, 1, &err) == 0, "%s", err.msg);
    long len = 0;
    char *raw = tg_test_read_file(path, &len);
    REQUIRE(raw && len > 8, "read back");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (uint8_t)raw[i];
    /* The writer pads its header with spaces to 8 bytes; make sure there is one to lose. */
    REQUIRE(raw[8 + hlen - 1] == ' ', "header has no padding");
    const int64_t deltas[] = {-1, +1};
    for (int d = 0; d < 2; d++) {
        uint64_t off = hlen + (uint64_t)deltas[d];
        for (int i = 0; i < 8; i++) raw[i] = (char)((off >> (8 * i)) & 0xff);
        FILE *f = fopen(path, "wb");
        REQUIRE(f && fwrite(raw, 1, (size_t)len, f) == (size_t)len && fclose(f) == 0, "rewrite");
        tg_safetensors st;
        if (!CHECK(tg_st_open(path, &st, &err) != 0, "header length %+lld accepted", (long long)deltas[d])) {
            tg_st_close(&st);
            continue;
        }
        char want[64];
        snprintf(want, sizeof want, "header length%s %llu", deltas[d] < 0 ? "," : ",", (unsigned long long)off);
        CHECK_MSG(err, path);
        CHECK_MSG(err, want);
    }
    free(raw);
    /* Without padding, one byte short cuts the JSON. */
    expect_st_refused("cut-json", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", "}abc", 4,
                      "not valid JSON", "is the header length");
}

/* Non-finite weights are refused naming the tensor and element, in every float dtype;
 * tg_st_read_f32 itself converts them as they are (test_st_half_conversion). */
TG_TEST(test_st_non_finite_weights) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    snprintf(path, sizeof path, "%s/nf.safetensors", dir);
    const float f32_nan[3] = {1, 2, NAN}, f32_inf[2] = {INFINITY, 0};
    const uint16_t f16_inf[2] = {0x3c00, 0xfc00}, f16_nan[1] = {0x7e00}, bf16_nan[2] = {0x3f80, 0x7fc0},
                   bf16_inf[1] = {0x7f80};
    const double f64_big[2] = {0.5, 1e300}, f64_nan[1] = {NAN};
    const float f32_ok[2] = {-3.0e38f, 1e-45f};
    uint8_t data[12 + 8 + 4 + 2 + 4 + 2 + 16 + 8 + 8];
    size_t at = 0;
#define PUT(x) (memcpy(data + at, (x), sizeof(x)), at += sizeof(x))
    PUT(f32_nan), PUT(f32_inf), PUT(f16_inf), PUT(f16_nan), PUT(bf16_nan), PUT(bf16_inf), PUT(f64_big), PUT(f64_nan),
        PUT(f32_ok);
#undef PUT
    REQUIRE(at == sizeof data, "layout");
    const char *hdr = "{\"f32_nan\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                      "\"f32_inf\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]},"
                      "\"f16_inf\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[20,24]},"
                      "\"f16_nan\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[24,26]},"
                      "\"bf16_nan\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[26,30]},"
                      "\"bf16_inf\":{\"dtype\":\"BF16\",\"shape\":[1],\"data_offsets\":[30,32]},"
                      "\"f64_big\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[32,48]},"
                      "\"f64_nan\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[48,56]},"
                      "\"f32_ok\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[56,64]}}";
    REQUIRE(write_raw_st(path, hdr, data, sizeof data) == 0, "write");
    tg_safetensors st;
    tg_err err = {{0}};
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    static const struct {
        const char *name;
        int64_t numel;
        const char *expect;
    } cases[] = {
        {"f32_nan", 3, "tensor 'f32_nan' (F32): element 2 is NaN"},
        {"f32_inf", 2, "tensor 'f32_inf' (F32): element 0 is +infinity"},
        {"f16_inf", 2, "tensor 'f16_inf' (F16): element 1 is -infinity"},
        {"f16_nan", 1, "tensor 'f16_nan' (F16): element 0 is NaN"},
        {"bf16_nan", 2, "tensor 'bf16_nan' (BF16): element 1 is NaN"},
        {"bf16_inf", 1, "tensor 'bf16_inf' (BF16): element 0 is +infinity"},
        {"f64_big", 2, "tensor 'f64_big' (F64): element 1 = 1e+300 is outside float32's range"},
        {"f64_nan", 1, "tensor 'f64_nan' (F64): element 0 is NaN"},
    };
    float out[4];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const tg_st_entry *e = tg_st_find(&st, cases[i].name);
        REQUIRE(e, "%s missing", cases[i].name);
        CHECK(tg_st_read_f32(&st, e, out, cases[i].numel, &err) == 0, "%s: plain read: %s", cases[i].name, err.msg);
        if (!CHECK(tg_st_read_f32_finite(&st, e, out, cases[i].numel, &err) != 0, "%s accepted", cases[i].name))
            continue;
        CHECK_MSG(err, path);
        CHECK_MSG(err, cases[i].expect);
    }
    CHECK(tg_st_read_f32_finite(&st, tg_st_find(&st, "f32_ok"), out, 2, &err) == 0, "finite extremes: %s", err.msg);
    CHECK(out[0] == -3.0e38f && out[1] == 1e-45f, "values %g %g", out[0], out[1]);
    tg_st_close(&st);
}

/* A preset's config written into dir/name/config.json, its text edited by each pair
 * {from, to} of `edits` (NULL-terminated; NULL: none) in turn. */
static void write_model_folder(const char *name, const char *preset, const char *const *edits, char *folder,
                               size_t cap) {
    char src[1100], config[1200];
    snprintf(src, sizeof src, "%s/%s/config.json", tg_presets_dir(), preset);
    char *text = tg_test_read_file(src, NULL);
    if (!text) abort();
    for (int e = 0; edits && edits[e]; e += 2) {
        const char *from = edits[e], *to = edits[e + 1];
        char *hit = strstr(text, from);
        if (!hit) abort();
        char *edited = malloc(strlen(text) + strlen(to) + 1);
        if (!edited) abort();
        sprintf(edited, "%.*s%s%s", (int)(hit - text), text, to, hit + strlen(from));
        free(text);
        text = edited;
    }
    snprintf(folder, cap, "%s/%s", tg_test_tmpdir(), name);
    mkdir(folder, 0755);
    snprintf(config, sizeof config, "%s/config.json", folder);
    if (tg_test_write_file(config, text) != 0) abort();
    free(text);
}

TG_TEST(test_config_duplicate_keys) {
    char folder[700], config[800];
    tg_model_config c;
    tg_err err = {{0}};
    /* The second value is invalid: last-wins would have hidden the first, valid one. */
    const char *const dup_top[] = {"\"hidden_size\": 32,", "\"hidden_size\": 32,\n  \"hidden_size\": -1,", NULL};
    write_model_folder("dup-top", "tiny-bert", dup_top, folder, sizeof folder);
    snprintf(config, sizeof config, "%s/config.json", folder);
    CHECK(tg_model_config_parse(config, &c, &err) != 0, "duplicate hidden_size accepted");
    CHECK_MSG(err, config);
    CHECK_MSG(err, "key 'hidden_size' appears twice");
    CHECK_MSG(err, "line ");
    CHECK(tg_model_config_load(folder, &c, &err) != 0, "duplicate loaded through the folder");
    CHECK_MSG(err, "'hidden_size'");
    /* Keys past 20 characters, and in nested objects, are named too. */
    const char *const dup_long[] = {"\"hidden_size\": 32,", "\"hidden_size\": 32, \"max_position_embeddings\": 64,",
                                    NULL};
    write_model_folder("dup-long", "tiny-bert", dup_long, folder, sizeof folder);
    snprintf(config, sizeof config, "%s/config.json", folder);
    CHECK(tg_model_config_parse(config, &c, &err) != 0, "duplicate max_position_embeddings accepted");
    CHECK_MSG(err, "key 'max_position_embeddings' appears twice");
    const char *const dup_nested[] = {"\"hidden_size\": 32,",
                                      "\"hidden_size\": 32, \"id2label\": {\"0\": \"neg\", \"0\": \"pos\"},", NULL};
    write_model_folder("dup-nested", "tiny-bert", dup_nested, folder, sizeof folder);
    snprintf(config, sizeof config, "%s/config.json", folder);
    CHECK(tg_model_config_parse(config, &c, &err) != 0, "duplicate id2label key accepted");
    CHECK_MSG(err, "key '0' appears twice");
}

typedef struct size_case {
    const char *preset;
    const char *edits[7]; /* {from, to} pairs on the preset's config.json text, NULL-terminated */
    const char *expect[2];
} size_case;

/* Every size has a limit, and the weights and parameter count derived from the sizes are
 * checked too: a hidden size of 2^30 once overflowed the element counts and compiled to a
 * plan of 8.8e12 MiB. */
TG_TEST(test_config_size_limits) {
#define H(v) "\"hidden_size\": 32", "\"hidden_size\": " v
#define E(v) "\"n_embd\": 32", "\"n_embd\": " v
    static const size_case cases[] = {
        {"tiny-bert", {H("1073741824")}, {"field 'hidden_size': 1073741824 is past the limit of 65536"}},
        {"tiny-bert", {"\"vocab_size\": 128", "\"vocab_size\": 4194305"}, {"field 'vocab_size'", "limit of 4194304"}},
        {"tiny-bert", {"\"num_hidden_layers\": 2", "\"num_hidden_layers\": 4097"},
         {"field 'num_hidden_layers'", "limit of 4096"}},
        {"tiny-bert", {"\"num_attention_heads\": 4", "\"num_attention_heads\": 4097"},
         {"field 'num_attention_heads'", "limit of 4096"}},
        {"tiny-bert", {"\"intermediate_size\": 64", "\"intermediate_size\": 262145"},
         {"field 'intermediate_size'", "limit of 262144"}},
        {"tiny-bert", {"\"max_position_embeddings\": 64", "\"max_position_embeddings\": 1048577"},
         {"field 'max_position_embeddings'", "limit of 1048576"}},
        {"tiny-bert", {"\"type_vocab_size\": 2", "\"type_vocab_size\": 1025"}, {"field 'type_vocab_size'", "limit of 1024"}},
        {"tiny-bert", {H("9223372036854775807")}, {"field 'hidden_size'", "past the limit"}},
        {"tiny-gpt2", {E("65540")}, {"field 'n_embd'", "limit of 65536"}},
        {"tiny-gpt2", {"\"n_layer\": 2", "\"n_layer\": 5000"}, {"field 'n_layer'", "limit of 4096"}},
        {"tiny-gpt2", {"\"n_head\": 4", "\"n_head\": 8192"}, {"field 'n_head'", "limit of 4096"}},
        {"tiny-gpt2", {"\"n_positions\": 64", "\"n_positions\": 2000000"}, {"field 'n_positions'", "limit of 1048576"}},
        {"tiny-gpt2", {"\"n_inner\": null", "\"n_inner\": 300000"}, {"field 'n_inner'", "limit of 262144"}},
        {"tiny-gpt2", {"\"vocab_size\": 128", "\"vocab_size\": 5000000"}, {"field 'vocab_size'", "limit of 4194304"}},
        /* Each size within its limit, their products past the per-weight limit (2^34). */
        {"tiny-bert",
         {H("65536"), "\"vocab_size\": 128", "\"vocab_size\": 4194304"},
         {"field 'vocab_size': the token embeddings of 4194304 x hidden_size 65536 elements",
          "limit of 17179869184 elements per weight"}},
        {"tiny-gpt2",
         {E("65536"), "\"n_positions\": 64", "\"n_positions\": 1048576"},
         {"field 'n_positions': the position embeddings of 1048576 x n_embd 65536", "per weight"}},
        /* Every weight within its limit, the whole model past 2^40 parameters. */
        {"tiny-bert",
         {H("65536"), "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 4096"},
         {"field 'num_hidden_layers': 4096 layers of", "past the limit of 1099511627776"}},
        {"tiny-gpt2",
         {E("16384"), "\"n_layer\": 2", "\"n_layer\": 1024"},
         {"field 'n_layer': 1024 layers of 3221438464 parameters", "past the limit of 1099511627776"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32], folder[700], config[800];
        snprintf(name, sizeof name, "size%zu", i);
        write_model_folder(name, cases[i].preset, cases[i].edits, folder, sizeof folder);
        snprintf(config, sizeof config, "%s/config.json", folder);
        tg_model_config c;
        tg_err err = {{0}};
        if (!CHECK(tg_model_config_parse(config, &c, &err) != 0, "case %zu (%s) parsed", i, cases[i].edits[1]))
            continue;
        CHECK_MSG(err, config);
        for (int k = 0; k < 2 && cases[i].expect[k]; k++) CHECK_MSG(err, cases[i].expect[k]);
        /* The compiler's door refuses it the same way. */
        CHECK(tg_model_config_load(folder, &c, &err) != 0, "case %zu loaded", i);
    }
    /* The largest sizes that fit every limit together still parse (a wide, shallow model). */
    char folder[700], config[800];
    const char *const widest[] = {E("65536"), "\"n_positions\": 64", "\"n_positions\": 262144", "\"n_inner\": null",
                                  "\"n_inner\": 262144", NULL};
#undef H
#undef E
    write_model_folder("size-max", "tiny-gpt2", widest, folder, sizeof folder);
    snprintf(config, sizeof config, "%s/config.json", folder);
    tg_model_config c;
    tg_err err = {{0}};
    CHECK(tg_model_config_parse(config, &c, &err) == 0, "sizes at their limits refused: %s", err.msg);
}

/* An endless or huge config.json is refused once the limit has been read. */
TG_TEST(test_config_too_big) {
    tg_model_config c;
    tg_err err = {{0}};
    CHECK(tg_model_config_parse("/dev/zero", &c, &err) != 0, "/dev/zero parsed");
    CHECK_MSG(err, "/dev/zero: more than 16777216 bytes");
    char path[700];
    snprintf(path, sizeof path, "%s/big.json", tg_test_tmpdir());
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "create");
    CHECK(ftruncate(fileno(f), TG_MODEL_CONFIG_MAX_BYTES + 1) == 0, "truncate");
    fclose(f);
    CHECK(tg_model_config_parse(path, &c, &err) != 0, "17 MB file parsed");
    CHECK_MSG(err, "too big for a config.json");
}

/* A model.safetensors (or config.json) that is there but cannot be read is an error
 * naming it, never a silent start from random weights. */
TG_TEST(test_config_weights_not_readable) {
    char folder[700], weights[800], target[800];
    tg_model_config c;
    tg_err err = {{0}};
    write_model_folder("weights-link", "tiny-bert", NULL, folder, sizeof folder);
    snprintf(weights, sizeof weights, "%s/model.safetensors", folder);

    REQUIRE(symlink("no-such-file.safetensors", weights) == 0, "symlink");
    CHECK(tg_model_config_load(folder, &c, &err) != 0, "dangling symlink ignored");
    CHECK_MSG(err, weights);
    CHECK_MSG(err, "symbolic link to nothing readable");
    unlink(weights);

    REQUIRE(symlink("model.safetensors", weights) == 0, "symlink loop");
    CHECK(tg_model_config_load(folder, &c, &err) != 0, "symlink loop ignored");
    CHECK_MSG(err, weights);
    unlink(weights);

    REQUIRE(mkdir(weights, 0755) == 0, "mkdir");
    CHECK(tg_model_config_load(folder, &c, &err) != 0, "folder ignored");
    CHECK_MSG(err, weights);
    CHECK_MSG(err, "is a folder, not a regular file");
    rmdir(weights);

    REQUIRE(mkfifo(weights, 0644) == 0, "mkfifo");
    CHECK(tg_model_config_load(folder, &c, &err) != 0, "FIFO ignored");
    CHECK_MSG(err, weights);
    CHECK_MSG(err, "is a FIFO");
    unlink(weights);

    /* Without read permission (root reads anything, so only checked for others). */
    float x = 1;
    tg_st_item item = {"bert.embeddings.word_embeddings.weight", TG_ST_F32, 0, NULL, &x};
    REQUIRE(tg_st_write(weights, &item, 1, &err) == 0, "%s", err.msg);
    if (geteuid() != 0) {
        REQUIRE(chmod(weights, 0) == 0, "chmod");
        CHECK(tg_model_config_load(folder, &c, &err) != 0, "unreadable file ignored");
        CHECK_MSG(err, weights);
        CHECK_MSG(err, "cannot be read");
        chmod(weights, 0644);
    }
    /* A link to a readable file is the file. */
    snprintf(target, sizeof target, "%s/real.safetensors", folder);
    REQUIRE(rename(weights, target) == 0 && symlink("real.safetensors", weights) == 0, "link to a file");
    REQUIRE(tg_model_config_load(folder, &c, &err) == 0, "%s", err.msg);
    CHECK(strcmp(c.weights, weights) == 0, "weights '%s'", c.weights);
    unlink(weights);
    REQUIRE(tg_model_config_load(folder, &c, &err) == 0, "%s", err.msg);
    CHECK(c.weights[0] == 0, "absent weights gave '%s'", c.weights);

    /* config.json as a dangling link: named, not "no folder". */
    char config[800];
    snprintf(config, sizeof config, "%s/config.json", folder);
    unlink(config);
    REQUIRE(symlink("gone.json", config) == 0, "symlink config");
    CHECK(tg_model_config_load(folder, &c, &err) != 0, "dangling config.json loaded");
    CHECK_MSG(err, config);
    CHECK_MSG(err, "symbolic link to nothing readable");
}
