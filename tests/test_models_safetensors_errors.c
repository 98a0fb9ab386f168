/* safetensors files that must be refused, each with the message that names its cause: a
 * table of damaged headers (length field, JSON, __metadata__, dtype, shape, data_offsets,
 * tiling of the data section), reads in the wrong dtype or shape and of values that are no
 * numbers, writes of items that cannot be written, and every allocation of an open and a
 * write failed in turn. */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "models/safetensors.h"
#include "tests/harness.h"

#define CHECK_MSG(err, s) CHECK(strstr((err).msg, (s)) != NULL, "message '%s' lacks '%s'", (err).msg, (s))

/* Writes an 8-byte little-endian length (hlen, or the header's own length when hlen < 0),
 * the header text and data_len bytes 0, 1, 2, ... */
static int write_st(const char *path, const char *header, long long hlen, size_t data_len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const uint64_t len = hlen < 0 ? strlen(header) : (uint64_t)hlen;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(header, 1, strlen(header), f) == strlen(header);
    for (size_t i = 0; i < data_len && ok; i++) ok = fputc((int)(i & 0xff), f) != EOF;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static const char *tmp_path(const char *name) {
    static char path[700];
    snprintf(path, sizeof path, "%s/%s", tg_test_tmpdir(), name);
    return path;
}

/* Opens a file expected to be refused; 1 when it was, with the message checked. */
static void expect_refused(const char *path, const char *want, const char *what) {
    tg_safetensors st;
    tg_err err = {{0}};
    const int rc = tg_st_open(path, &st, &err);
    CHECK(rc == -1, "%s: opened (rc %d)", what, rc);
    CHECK(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", what, err.msg, want);
    CHECK(st.n == 0 && st.entries == NULL && st.map == NULL, "%s: a refused file left state behind", what);
}

typedef struct bad_header {
    const char *header;
    long long hlen; /* -1: the header's own length */
    size_t data_len;
    const char *want;
} bad_header;

static const bad_header k_bad_headers[] = {
    /* the JSON itself */
    {"{x}", -1, 0, "header is not valid JSON (line 1, column 2"},
    {"{\"a\":", -1, 0, "is the header length, 5, right?"},
    {"{} {}", -1, 0, "is the header length, 5, right?"},
    {"{\"a\": 1, \"a\": 2}", -1, 0, "header: key 'a' appears twice in one object (line 1"},
    {"[1]", -1, 0, "header is not a JSON object"},
    {"{\"__metadata__\": [1]}", -1, 0, "field '__metadata__' is not an object"},
    {"{\"__metadata__\": {\"format\": \"pt\", \"n\": 3}}", -1, 0, "field '__metadata__': value of 'n' is not a string"},
    /* one tensor's entry */
    {"{\"t\": 5}", -1, 0, "tensor 't': header entry is not a JSON object"},
    {"{\"t\": {\"shape\": [], \"data_offsets\": [0, 4]}}", -1, 4, "tensor 't': field 'dtype' missing or not a string"},
    {"{\"t\": {\"dtype\": 4, \"shape\": [], \"data_offsets\": [0, 4]}}", -1, 4, "field 'dtype' missing or not a string"},
    {"{\"t\": {\"dtype\": \"F8\", \"shape\": [], \"data_offsets\": [0, 4]}}", -1, 4,
     "tensor 't': field 'dtype': unknown dtype 'F8' (expected F32, F16"},
    {"{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", -1, 4, "tensor 't': field 'shape' missing or not an array"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", -1, 4, "field 'shape' missing or not an array"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}", -1, 4,
     "tensor 't': field 'shape' has 9 dimensions (at most 8)"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 4]}}", -1, 4,
     "tensor 't': field 'shape': dimension 1 is not a non-negative integer"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", -1, 4,
     "field 'shape': dimension 0 is not a non-negative integer"},
    {"{\"t\": {\"dtype\": \"U8\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", -1, 4,
     "tensor 't': field 'shape': element count overflows"},
    {"{\"t\": {\"dtype\": \"F64\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 4]}}", -1, 4,
     "tensor 't': field 'shape': element count overflows"},
    {"{\"t\": {\"dtype\": \"U8\", \"shape\": [9223372036854775807, 2], \"data_offsets\": [0, 4]}}", -1, 4,
     "field 'shape': element count overflows"},
    {"{\"t\": {\"dtype\": \"I8\", \"shape\": [9223372036854775807], \"data_offsets\": [0, 4]}}", -1, 4,
     "data_offsets [0, 4] hold 4 bytes but shape [9223372036854775807] of I8 needs 9223372036854775807"},
    {"{\"t\": {\"dtype\": \"I16\", \"shape\": [1], \"data_offsets\": [0, 2]}}", -1, 2, "unknown dtype 'I16'"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", -1, 4,
     "tensor 't': field 'data_offsets' must be [begin, end] with non-negative integers"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", -1, 4,
     "field 'data_offsets' must be [begin, end]"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", 4]}}", -1, 4,
     "field 'data_offsets' must be [begin, end]"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4.0]}}", -1, 4,
     "field 'data_offsets' must be [begin, end]"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 4]}}", -1, 4,
     "field 'data_offsets' must be [begin, end]"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, -4]}}", -1, 4,
     "field 'data_offsets' must be [begin, end]"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": 0}}", -1, 4, "field 'data_offsets' must be"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", -1, 4,
     "tensor 't': data_offsets [4, 0] out of range (data section holds 4 bytes)"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 8]}}", -1, 4,
     "tensor 't': data_offsets [0, 8] out of range (data section holds 4 bytes)"},
    {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", -1, 20,
     "tensor 't': data_offsets [0, 20] hold 20 bytes but shape [2, 3] of F32 needs 24"},
    {"{\"t\": {\"dtype\": \"BF16\", \"shape\": [], \"data_offsets\": [0, 4]}}", -1, 4,
     "data_offsets [0, 4] hold 4 bytes but shape [] of BF16 needs 2"},
    /* the tensors must tile the data section */
    {"{}", -1, 3, "the header names no tensor but 3 bytes of data follow it (header length 2)"},
    {"{\"__metadata__\": {}}", -1, 1, "the header names no tensor but 1 bytes of data follow it"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
     " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
     -1, 8, "tensors 'a' [0, 8] and 'b' [4, 8] overlap"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", -1, 8,
     "bytes [0, 4) of the data section belong to no tensor (a hole before 'a'): tensors must tile"},
    /* the first fault of several: the walk stops there, a later tensor changes nothing */
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
     " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]},"
     " \"c\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
     -1, 12, "tensors 'a' [0, 8] and 'b' [4, 8] overlap"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
     " \"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [6, 8]},"
     " \"c\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
     -1, 12, "bytes [4, 6) of the data section belong to no tensor (a hole between 'a' and 'b')"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
     " \"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [6, 8]}}",
     -1, 8, "bytes [4, 6) of the data section belong to no tensor (a hole between 'a' and 'b')"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 5,
     "holds 5 bytes but its tensors end at byte 4: 1 trailing byte belong to no tensor"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", -1, 7,
     "holds 7 bytes but its tensors end at byte 4: 3 trailing bytes belong to no tensor (bytes appended to the "
     "file, or a header length, 61, that is too small)"},
    /* the length field */
    {"{}", 100, 0, "header length 100 runs past the end of the file (10 bytes)"},
    {"{} ", 2, 0, "the header names no tensor but 1 bytes of data follow it (header length 2)"},
};

TG_TEST(test_models_safetensors_bad_headers) {
    const char *path = tmp_path("bad.safetensors");
    for (size_t i = 0; i < sizeof k_bad_headers / sizeof k_bad_headers[0]; i++) {
        const bad_header *b = &k_bad_headers[i];
        REQUIRE(write_st(path, b->header, b->hlen, b->data_len) == 0, "cannot write %s", path);
        char what[64];
        snprintf(what, sizeof what, "bad header %zu", i);
        expect_refused(path, b->want, what);
    }
}

/* Headers that are right, at the edges: no tensor and no data, an empty tensor between two
 * others (at a boundary), metadata strings, a header padded with spaces. */
TG_TEST(test_models_safetensors_edge_headers_open) {
    const char *path = tmp_path("edge.safetensors");
    tg_safetensors st;
    tg_err err = {{0}};
    REQUIRE(write_st(path, "{\"__metadata__\": {\"format\": \"pt\"}}", -1, 0) == 0, "write");
    REQUIRE(tg_st_open(path, &st, &err) == 0, "no tensors: %s", err.msg);
    CHECK(st.n == 0 && tg_st_find(&st, "a") == NULL, "no tensors: n %d", st.n);
    tg_st_close(&st);
    tg_st_close(NULL); /* harmless */

    REQUIRE(write_st(path,
                     "{\"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [4, 6]},"
                     " \"e\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [4, 4]},"
                     " \"a\": {\"dtype\": \"I32\", \"shape\": [1], \"data_offsets\": [0, 4]}}   ",
                     -1, 6) == 0,
            "write");
    REQUIRE(tg_st_open(path, &st, &err) == 0, "empty tensor on a boundary: %s", err.msg);
    const tg_st_entry *e = tg_st_find(&st, "e"), *b = tg_st_find(&st, "b");
    REQUIRE(e && b && st.n == 3, "entries");
    CHECK(e->ndim == 2 && e->shape[0] == 0 && e->shape[1] == 3 && tg_st_numel(e) == 0 && e->begin == 4 && e->end == 4,
          "e: ndim %d begin %llu", e->ndim, (unsigned long long)e->begin);
    CHECK(b->dtype == TG_ST_U8 && b->begin == 4 && b->end == 6 && st.data[b->begin] == 4 && st.data[b->begin + 1] == 5,
          "b's bytes");
    tg_st_close(&st);
}

/* The file itself: missing, a folder, too short for the length field, a path too long, and
 * a header length past the 100 MB limit (in a sparse file that long). */
TG_TEST(test_models_safetensors_bad_files) {
    expect_refused(tmp_path("missing.safetensors"), "missing.safetensors: cannot open: No such file", "missing");
    expect_refused(tg_test_tmpdir(), ": not a regular file", "a folder");
    const char *path = tmp_path("short.safetensors");
    REQUIRE(tg_test_write_file(path, "1234567") == 0, "write");
    expect_refused(path, "file is 7 bytes, too short for a safetensors header length (8 bytes)", "short");
    char longpath[TG_ST_PATH_MAX + 8];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = 0;
    expect_refused(longpath, ": path too long", "long path");
    longpath[TG_ST_PATH_MAX - 1] = 0; /* the longest that fits: opened, and not there */
    expect_refused(longpath, ": cannot open:", "longest path");

    path = tmp_path("huge.safetensors");
    const uint64_t hlen = 100u * 1024u * 1024u + 1;
    REQUIRE(write_st(path, "{}", (long long)hlen, 0) == 0, "write");
    REQUIRE(truncate(path, (off_t)(8 + hlen)) == 0, "truncate");
    expect_refused(path, "header length 104857601 exceeds the 100 MB limit", "huge header");
    REQUIRE(truncate(path, (off_t)(8 + hlen - 1)) == 0, "truncate");
    expect_refused(path, "header length 104857601 runs past the end of the file (104857608 bytes)", "past the end");
    unlink(path);
}

/* A file of one tensor of that dtype and shape holding `bytes`. */
static int write_one(const char *path, const char *dtype, const char *shape, const void *bytes, size_t n) {
    char header[256];
    snprintf(header, sizeof header, "{\"t\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[0,%zu]}}", dtype, shape,
             n);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const uint64_t len = strlen(header);
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(len >> (8 * i));
    int ok = fwrite(le, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len && fwrite(bytes, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int open_one(const char *dtype, const char *shape, const void *bytes, size_t n, tg_safetensors *st) {
    const char *path = tmp_path("one.safetensors");
    tg_err err = {{0}};
    if (!CHECK(write_one(path, dtype, shape, bytes, n) == 0, "write %s", path)) return 0;
    return CHECK(tg_st_open(path, st, &err) == 0, "open %s %s: %s", dtype, shape, err.msg);
}

static int same_bits(float a, float b) { return !memcmp(&a, &b, 4); }

/* Every float dtype widened exactly: F16 normals, subnormals, signed zeros, infinities and
 * NaN; BF16; F64. */
TG_TEST(test_models_safetensors_read_float_dtypes) {
    tg_safetensors st;
    tg_err err = {{0}};
    /* 1.0, -2.5, the smallest subnormal 2^-24, the largest subnormal, -0, +inf, -inf, NaN, 65504 */
    const uint16_t half[] = {0x3c00, 0xc100, 0x0001, 0x03ff, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7bff};
    if (!open_one("F16", "[9]", half, sizeof half, &st)) return;
    float f[9];
    REQUIRE(tg_st_read_f32(&st, &st.entries[0], f, 9, &err) == 0, "%s", err.msg);
    CHECK(f[0] == 1.0f && f[1] == -2.5f && f[2] == ldexpf(1, -24) && f[3] == ldexpf(1023, -24), "F16 %g %g %g %g",
          f[0], f[1], f[2], f[3]);
    CHECK(same_bits(f[4], -0.0f) && f[5] == INFINITY && f[6] == -INFINITY && isnan(f[7]) && f[8] == 65504.0f,
          "F16 specials %g %g %g %g %g", f[4], f[5], f[6], f[7], f[8]);
    /* a NaN is refused by the finite read, by index (the infinities come first) */
    CHECK(tg_st_read_f32_finite(&st, &st.entries[0], f, 9, &err) == -1, "finite read of infinities succeeded");
    CHECK_MSG(err, "one.safetensors: tensor 't' (F16): element 5 is +infinity; weights must be finite numbers");
    CHECK(tg_st_read_f32(&st, &st.entries[0], f, 8, &err) == -1, "8 of 9 elements read");
    CHECK_MSG(err, "tensor 't': wrong shape: the file has [9] (9 elements) but 8 elements are expected");
    tg_st_close(&st);

    const uint16_t neg_inf[] = {0x3c00, 0xfc00};
    if (!open_one("F16", "[2]", neg_inf, sizeof neg_inf, &st)) return;
    CHECK(tg_st_read_f32_finite(&st, &st.entries[0], f, 2, &err) == -1, "-inf accepted");
    CHECK_MSG(err, "tensor 't' (F16): element 1 is -infinity");
    tg_st_close(&st);

    const uint16_t bf[] = {0x3f80, 0xc020, 0x7fc0};
    if (!open_one("BF16", "[1, 3]", bf, sizeof bf, &st)) return;
    REQUIRE(tg_st_read_f32(&st, &st.entries[0], f, 3, &err) == 0, "%s", err.msg);
    CHECK(f[0] == 1.0f && f[1] == -2.5f && isnan(f[2]), "BF16 %g %g %g", f[0], f[1], f[2]);
    CHECK(tg_st_read_f32_finite(&st, &st.entries[0], f, 3, &err) == -1, "NaN accepted");
    CHECK_MSG(err, "tensor 't' (BF16): element 2 is NaN; weights must be finite numbers");
    tg_st_close(&st);

    const double d[] = {0.5, -3.0, 1e300};
    if (!open_one("F64", "[3]", d, sizeof d, &st)) return;
    REQUIRE(tg_st_read_f32(&st, &st.entries[0], f, 3, &err) == 0, "%s", err.msg);
    CHECK(f[0] == 0.5f && f[1] == -3.0f && f[2] == INFINITY, "F64 %g %g %g", f[0], f[1], f[2]);
    CHECK(tg_st_read_f32_finite(&st, &st.entries[0], f, 3, &err) == -1, "1e300 accepted");
    CHECK_MSG(err, "tensor 't' (F64): element 2 = 1e+300 is outside float32's range");
    tg_st_close(&st);

    const double dinf[] = {-INFINITY};
    if (!open_one("F64", "[1]", dinf, sizeof dinf, &st)) return;
    CHECK(tg_st_read_f32_finite(&st, &st.entries[0], f, 1, &err) == -1, "-inf accepted");
    CHECK_MSG(err, "tensor 't' (F64): element 0 is -infinity");
    tg_st_close(&st);

    const int32_t ints[] = {1, 2};
    if (!open_one("I32", "[2]", ints, sizeof ints, &st)) return;
    CHECK(tg_st_read_f32(&st, &st.entries[0], f, 2, &err) == -1, "I32 read as float");
    CHECK_MSG(err, "tensor 't' has dtype I32, expected a float dtype (F32, F16, BF16 or F64)");
    CHECK(tg_st_read_f32_finite(&st, &st.entries[0], f, 2, &err) == -1, "I32 read as finite float");
    CHECK_MSG(err, "expected a float dtype");
    tg_st_close(&st);
}

/* The finite check scans in blocks of 4096: a bad value in the second and in the last,
 * partial block is found at its index, and a clean tensor of several blocks passes. */
TG_TEST(test_models_safetensors_finite_blocks) {
    enum { N = 4096 * 2 + 100 };
    float *v = malloc(sizeof *v * N), *got = malloc(sizeof *got * N);
    REQUIRE(v && got, "malloc");
    for (int i = 0; i < N; i++) v[i] = (float)i * 0.25f;
    const int bad_at[] = {-1, 4096 + 7, N - 1, 0};
    for (size_t k = 0; k < sizeof bad_at / sizeof bad_at[0]; k++) {
        float *w = malloc(sizeof *w * N);
        REQUIRE(w, "malloc");
        memcpy(w, v, sizeof *w * N);
        if (bad_at[k] >= 0) w[bad_at[k]] = NAN;
        char shape[32];
        snprintf(shape, sizeof shape, "[%d]", N);
        tg_safetensors st;
        tg_err err = {{0}};
        const int opened = open_one("F32", shape, w, sizeof *w * N, &st);
        free(w);
        if (!opened) break;
        const int rc = tg_st_read_f32_finite(&st, &st.entries[0], got, N, &err);
        if (bad_at[k] < 0) {
            CHECK(rc == 0 && got[N - 1] == v[N - 1] && got[4096] == v[4096], "clean tensor: %s", err.msg);
        } else {
            char want[64];
            snprintf(want, sizeof want, "(F32): element %d is NaN", bad_at[k]);
            CHECK(rc == -1 && strstr(err.msg, want), "NaN at %d: rc %d '%s'", bad_at[k], rc, err.msg);
        }
        tg_st_close(&st);
    }
    free(v);
    free(got);
}

TG_TEST(test_models_safetensors_read_int_dtypes) {
    tg_safetensors st;
    tg_err err = {{0}};
    int32_t i[4];
    const int64_t wide[] = {INT32_MIN, INT32_MAX, -1, 7};
    if (!open_one("I64", "[4]", wide, sizeof wide, &st)) return;
    REQUIRE(tg_st_read_i32(&st, &st.entries[0], i, 4, &err) == 0, "%s", err.msg);
    CHECK(i[0] == INT32_MIN && i[1] == INT32_MAX && i[2] == -1 && i[3] == 7, "I64 %d %d %d %d", i[0], i[1], i[2], i[3]);
    CHECK(tg_st_read_i32(&st, &st.entries[0], i, 3, &err) == -1, "3 of 4 read");
    CHECK_MSG(err, "wrong shape: the file has [4] (4 elements) but 3 elements are expected");
    tg_st_close(&st);

    const int64_t over[] = {0, (int64_t)INT32_MAX + 1};
    if (!open_one("I64", "[2]", over, sizeof over, &st)) return;
    CHECK(tg_st_read_i32(&st, &st.entries[0], i, 2, &err) == -1, "2^31 read");
    CHECK_MSG(err, "tensor 't': element 1 = 2147483648 does not fit in int32");
    tg_st_close(&st);
    const int64_t under[] = {(int64_t)INT32_MIN - 1};
    if (!open_one("I64", "[1]", under, sizeof under, &st)) return;
    CHECK(tg_st_read_i32(&st, &st.entries[0], i, 1, &err) == -1, "-2^31 - 1 read");
    CHECK_MSG(err, "tensor 't': element 0 = -2147483649 does not fit in int32");
    tg_st_close(&st);

    const int32_t narrow[] = {-5, 9};
    if (!open_one("I32", "[2, 1]", narrow, sizeof narrow, &st)) return;
    REQUIRE(tg_st_read_i32(&st, &st.entries[0], i, 2, &err) == 0, "%s", err.msg);
    CHECK(i[0] == -5 && i[1] == 9, "I32 %d %d", i[0], i[1]);
    tg_st_close(&st);

    const uint8_t bytes[] = {1, 0};
    if (!open_one("BOOL", "[2]", bytes, sizeof bytes, &st)) return;
    CHECK(tg_st_read_i32(&st, &st.entries[0], i, 2, &err) == -1, "BOOL read as int");
    CHECK_MSG(err, "tensor 't' has dtype BOOL, expected an integer dtype (I64 or I32)");
    tg_st_close(&st);

    if (!open_one("I64", "[0]", bytes, 0, &st)) return;
    CHECK(tg_st_read_i32(&st, &st.entries[0], NULL, 0, &err) == 0, "empty: %s", err.msg);
    tg_st_close(&st);

    CHECK(!strcmp(tg_st_dtype_name(TG_ST_BOOL), "BOOL") && !strcmp(tg_st_dtype_name(-1), "?") &&
              !strcmp(tg_st_dtype_name(TG_ST_DTYPE_COUNT), "?"),
          "dtype names");
}

typedef struct bad_item {
    tg_st_item item[2];
    int n;
    const char *const *meta;
    int n_meta;
    const char *want;
} bad_item;

static const int64_t k_shape2[] = {2, 2}, k_neg[] = {2, -1};
static const float k_vals[4] = {1, 2, 3, 4};
static const char *const k_bad_meta_value[] = {"format", "\xff\xfe"};
static const char *const k_bad_meta_key[] = {"\xc3", "pt"};

static const bad_item k_bad_items[] = {
    {{{NULL, TG_ST_F32, 0, NULL, k_vals}}, 1, NULL, 0, "tensor 0: invalid name '(null)'"},
    {{{"", TG_ST_F32, 0, NULL, k_vals}}, 1, NULL, 0, "tensor 0: invalid name ''"},
    {{{"a", TG_ST_F32, 0, NULL, k_vals}, {"__metadata__", TG_ST_F32, 0, NULL, k_vals}}, 2, NULL, 0,
     "tensor 1: invalid name '__metadata__'"},
    {{{"a", TG_ST_F32, 0, NULL, k_vals}, {"a", TG_ST_F32, 0, NULL, k_vals}}, 2, NULL, 0,
     "tensor 'a': name appears twice"},
    {{{"h", TG_ST_F16, 1, k_shape2, k_vals}}, 1, NULL, 0, "tensor 'h': dtype F16 cannot be written (only F32, BF16"},
    {{{"h", TG_ST_U8, 1, k_shape2, k_vals}}, 1, NULL, 0, "tensor 'h': dtype U8 cannot be written"},
    {{{"h", -1, 1, k_shape2, k_vals}}, 1, NULL, 0, "tensor 'h': dtype ? cannot be written"},
    {{{"n", TG_ST_I64, -1, k_shape2, k_vals}}, 1, NULL, 0, "tensor 'n': invalid ndim -1"},
    {{{"n", TG_ST_I32, 9, k_shape2, k_vals}}, 1, NULL, 0, "tensor 'n': invalid ndim 9"},
    {{{"n", TG_ST_BF16, 1, NULL, k_vals}}, 1, NULL, 0, "tensor 'n': invalid ndim 1"},
    {{{"x", TG_ST_F32, 2, k_neg, k_vals}}, 1, NULL, 0, "tensor 'x': dimension 1 is negative (-1)"},
    {{{"x", TG_ST_F32, 2, k_shape2, NULL}}, 1, NULL, 0, "tensor 'x': no data"},
    {{{"\xff", TG_ST_F32, 0, NULL, k_vals}}, 1, NULL, 0, "tensor 0: name is not valid UTF-8"},
    {{{"x", TG_ST_F32, 0, NULL, k_vals}}, 1, k_bad_meta_value, 1, "__metadata__ 'format': not valid UTF-8"},
    {{{"x", TG_ST_F32, 0, NULL, k_vals}}, 1, k_bad_meta_key, 1, "__metadata__ '\xc3': not valid UTF-8"},
};

TG_TEST(test_models_safetensors_bad_writes) {
    const char *path = tmp_path("w.safetensors");
    for (size_t i = 0; i < sizeof k_bad_items / sizeof k_bad_items[0]; i++) {
        const bad_item *b = &k_bad_items[i];
        tg_err err = {{0}};
        const int rc = tg_st_write_with_metadata(path, b->item, b->n, b->meta, b->n_meta, &err);
        CHECK(rc == -1, "bad write %zu succeeded", i);
        CHECK(strstr(err.msg, b->want) && strstr(err.msg, "w.safetensors: "), "bad write %zu: '%s' lacks '%s'", i,
              err.msg, b->want);
        CHECK(access(path, F_OK) != 0, "bad write %zu left a file", i);
    }
    /* a folder that is not there: the atomic write says so */
    tg_err err = {{0}};
    const tg_st_item one = {"x", TG_ST_F32, 0, NULL, k_vals};
    CHECK(tg_st_write(tmp_path("no/such/w.safetensors"), &one, 1, &err) == -1, "write into a missing folder");
    CHECK_MSG(err, "no/such/w.safetensors");
}

/* What a write puts in the file, byte for byte: the length, the compact header padded with
 * spaces to 8 bytes, then the data in item order; an empty tensor needs no data. */
TG_TEST(test_models_safetensors_write_bytes) {
    const char *path = tmp_path("exact.safetensors");
    const int64_t two[] = {2}, none[] = {0, 5};
    const int32_t ints[] = {7, -1};
    const uint16_t low[] = {0x3f80, 0x4000};
    const tg_st_item items[] = {{"i", TG_ST_I32, 1, two, ints}, {"e", TG_ST_F32, 2, none, NULL},
                                {"b", TG_ST_BF16, 1, two, low}};
    const char *const meta[] = {"format", "pt"};
    tg_err err = {{0}};
    REQUIRE(tg_st_write_with_metadata(path, items, 3, meta, 1, &err) == 0, "%s", err.msg);
    long len = 0;
    char *got = tg_test_read_file(path, &len);
    REQUIRE(got, "read back");
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},\"i\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[8,8]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}";
    const size_t tlen = strlen(hdr), hlen = (tlen + 7) & ~(size_t)7;
    uint64_t stored = 0;
    for (int i = 7; i >= 0; i--) stored = (stored << 8) | (uint8_t)got[i];
    CHECK(stored == hlen && hlen % 8 == 0 && (size_t)len == 8 + hlen + 12, "length field %llu, file %ld bytes",
          (unsigned long long)stored, len);
    CHECK(!memcmp(got + 8, hdr, tlen), "header '%.*s'", (int)tlen, got + 8);
    int pad_ok = 1;
    for (size_t i = tlen; i < hlen; i++) pad_ok &= got[8 + i] == ' ';
    CHECK(pad_ok, "header padding is not spaces");
    CHECK(!memcmp(got + 8 + hlen, ints, 8) && !memcmp(got + 8 + hlen + 8, low, 4), "data bytes");
    free(got);
}

/* Every allocation of an open (metadata and two tensors) and of a write failed in turn:
 * each ends in -1 with a message that names the file and says it ran out of memory. */
static int open_attempt(const char *path, tg_err *err) {
    tg_safetensors st;
    if (tg_st_open(path, &st, err)) return -1;
    tg_st_close(&st);
    return 0;
}

static int write_attempt(const char *path, tg_err *err) {
    const int64_t shape[] = {2, 2};
    const int32_t ints[] = {1, 2};
    const int64_t one[] = {2};
    const tg_st_item items[] = {{"w", TG_ST_F32, 2, shape, k_vals}, {"ids", TG_ST_I32, 1, one, ints}};
    const char *const meta[] = {"format", "pt", "by", "tunegraph"};
    return tg_st_write_with_metadata(path, items, 2, meta, 2, err);
}

static void fail_each(const char *what, int (*fn)(const char *, tg_err *), const char *path) {
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(fn(path, &err) == 0, "%s: %s", what, err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 2, "%s: %ld allocations", what, total);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = fn(path, &err);
        tg_alloc_fail_after(-1);
        /* the atomic write reports its own allocations with strerror(ENOMEM) */
        CHECK(rc == -1 && (strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory")) &&
                  strstr(err.msg, path),
              "%s: allocation %ld of %ld failing: rc %d, '%s'", what, k, total, rc, err.msg);
    }
}

TG_TEST(test_models_safetensors_out_of_memory) {
    char path[700];
    snprintf(path, sizeof path, "%s", tmp_path("oom.safetensors"));
    tg_err err = {{0}};
    REQUIRE(write_attempt(path, &err) == 0, "%s", err.msg);
    fail_each("tg_st_open", open_attempt, path);
    fail_each("tg_st_write_with_metadata", write_attempt, path);
    /* and what the last write left is the whole file */
    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    float w[4];
    CHECK(st.n == 2 && tg_st_read_f32(&st, tg_st_find(&st, "w"), w, 4, &err) == 0 && w[3] == 4.0f, "read back");
    tg_st_close(&st);
}

/* A header whose JSON is wrong inside (not cut short, nothing after it) is reported without
 * the question about the header length, which only a cut or an overrun raises. */
TG_TEST(test_models_safetensors_bad_json_not_length) {
    const char *path = tmp_path("inside.safetensors");
    REQUIRE(write_st(path, "{x}    ", -1, 0) == 0, "cannot write %s", path);
    tg_safetensors st;
    tg_err err = {{0}};
    CHECK(tg_st_open(path, &st, &err) == -1, "opened");
    char want[800];
    snprintf(want, sizeof want, "%s: header is not valid JSON (line 1, column 2: ", path);
    const size_t n = strlen(err.msg);
    CHECK(!strncmp(err.msg, want, strlen(want)) && n > strlen(want) + 1 && err.msg[n - 1] == ')' &&
              !strstr(err.msg, "header length"),
          "%s", err.msg);
}
