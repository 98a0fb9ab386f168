/* The bytes of an encoded checkpoint (runtime/checkpoint.c, tg_checkpoint_encode and
 * tg_checkpoint_write): every header field, the payload record by record as
 * runtime/checkpoint.h lays it out (rebuilt here by hand), the zstd frame as level 1 makes
 * it, the same bytes from a file as in memory, and every state field and tensor read back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>
#define XXH_INLINE_ALL /* header-only, as runtime/checkpoint.c */
#include <xxhash.h>

#include "runtime/checkpoint.h"
#include "tests/harness.h"

typedef struct buf {
    uint8_t *d;
    size_t n;
} buf;

static void put(buf *b, const void *p, size_t n) {
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void put32(buf *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b->d[b->n++] = (uint8_t)(v >> (8 * i));
}
static void put64(buf *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b->d[b->n++] = (uint8_t)(v >> (8 * i));
}
static void put_str(buf *b, const char *s) {
    put32(b, (uint32_t)strlen(s));
    put(b, s, strlen(s));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

static const tg_checkpoint_state k_state = {.step = 5,
                                            .total_steps = 9,
                                            .replicas = 2,
                                            .plan_fingerprint = 0x1122334455667788ull,
                                            .dropout_seed = 0x0102030405060708ull,
                                            .dropout_counter = 0x1112131415161718ull,
                                            .sampler_examples = 30,
                                            .sampler_epoch = 2,
                                            .sampler_pos = 7,
                                            .sampler_seed = 0xa1a2a3a4a5a6a7a8ull};

typedef struct tensor_spec {
    const char *name;
    int replica, dtype, ndim;
    int64_t shape[TG_MAX_DIMS];
    size_t bytes;
} tensor_spec;

/* A scalar, a four-dimensional bf16 tensor (as many dimensions as a tensor may have), one
 * replica's slice and, when `big`, 256 KiB of text-like floats that fill several zstd blocks. */
static const tensor_spec k_tensors[] = {
    {"encoder.layer.0.w", -1, TG_F32, 2, {2, 3}, 24},
    {"step", -1, TG_F32, 0, {0}, 4},
    {"cube", -1, TG_BF16, 4, {2, 1, 3, 2}, 24},
    {"m", 1, TG_F32, 1, {5}, 20},
    {"big", 0, TG_F32, 1, {65536}, 262144},
};

static uint8_t *tensor_data(size_t k, size_t bytes) {
    uint8_t *d = malloc(bytes);
    uint32_t s = 77u + (uint32_t)k;
    for (size_t i = 0; i < bytes; i++) {
        s = s * 1103515245u + 12345u;
        d[i] = (s >> 16) & 7 ? (uint8_t)("abcdefgh"[(s >> 20) & 7]) : (uint8_t)(s >> 24);
    }
    return d;
}

static int make(tg_checkpoint *ck, int big, tg_err *err) {
    tg_checkpoint_init(ck);
    ck->state = k_state;
    if (tg_checkpoint_add_field(ck, "batch", "4", err) || tg_checkpoint_add_field(ck, "model", "tiny-bert", err))
        return -1;
    for (size_t k = 0; k < sizeof k_tensors / sizeof k_tensors[0] - (big ? 0 : 1); k++) {
        const tensor_spec *t = &k_tensors[k];
        if (tg_checkpoint_add_tensor(ck, t->name, t->replica, t->dtype, t->ndim, t->shape, tensor_data(k, t->bytes),
                                     err))
            return -1;
    }
    return 0;
}

/* The payload as runtime/checkpoint.h lays it out (b->d large enough). */
static void expected_payload(buf *b, int big) {
    put(b, "IDNT", 4), put64(b, 4 + (8 + 5 + 1) + (8 + 5 + 9));
    put32(b, 2), put_str(b, "batch"), put_str(b, "4"), put_str(b, "model"), put_str(b, "tiny-bert");
    put(b, "STAT", 4), put64(b, 56);
    put32(b, 5), put32(b, 9), put32(b, 2);
    put64(b, k_state.plan_fingerprint), put64(b, k_state.dropout_seed), put64(b, k_state.dropout_counter);
    put32(b, 30), put32(b, 2), put32(b, 7), put64(b, k_state.sampler_seed);
    for (size_t k = 0; k < sizeof k_tensors / sizeof k_tensors[0] - (big ? 0 : 1); k++) {
        const tensor_spec *t = &k_tensors[k];
        put(b, "TNSR", 4), put64(b, 4 + strlen(t->name) + 12 + 8 * (uint64_t)t->ndim + 8 + t->bytes);
        put_str(b, t->name);
        put32(b, (uint32_t)t->replica), put32(b, (uint32_t)t->dtype), put32(b, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) put64(b, (uint64_t)t->shape[d]);
        put64(b, t->bytes);
        uint8_t *data = tensor_data(k, t->bytes);
        put(b, data, t->bytes);
        free(data);
    }
    put(b, "END!", 4), put64(b, 0);
}

static void check_layout(int big) {
    tg_checkpoint ck;
    tg_err err = {{0}};
    REQUIRE(make(&ck, big, &err) == 0, "%s", err.msg);
    uint8_t *file = NULL;
    size_t len = 0;
    REQUIRE(tg_checkpoint_encode(&ck, &file, &len, &err) == 0 && len > 64, "%s", err.msg);
    buf want = {malloc(300000), 0};
    expected_payload(&want, big);

    /* the header */
    CHECK(!memcmp(file, "TGCKPT\0\0", 8), "big %d: magic", big);
    CHECK(get32(file + 8) == 1 && get32(file + 12) == 0 && get32(file + 16) == 5 && get32(file + 20) == 0,
          "big %d: version %u, flags %u, step %u, reserved %u", big, get32(file + 8), get32(file + 12),
          get32(file + 16), get32(file + 20));
    CHECK(get64(file + 24) == k_state.plan_fingerprint, "big %d: fingerprint %llx", big,
          (unsigned long long)get64(file + 24));
    CHECK(get64(file + 32) == want.n && get64(file + 40) == len - 64, "big %d: payload %llu (want %zu), compressed %llu (want %zu)",
          big, (unsigned long long)get64(file + 32), want.n, (unsigned long long)get64(file + 40), len - 64);
    CHECK(get64(file + 48) == XXH64(want.d, want.n, 0), "big %d: payload checksum", big);
    CHECK(get64(file + 56) == XXH64(file, 56, 0), "big %d: header checksum", big);

    /* the payload, byte for byte */
    uint8_t *payload = malloc(want.n + 1);
    const size_t got = ZSTD_decompress(payload, want.n + 1, file + 64, len - 64);
    CHECK(!ZSTD_isError(got) && got == want.n && !memcmp(payload, want.d, want.n), "big %d: payload of %zu bytes, want %zu",
          big, ZSTD_isError(got) ? 0 : got, want.n);
    CHECK(ZSTD_getFrameContentSize(file + 64, len - 64) == want.n, "big %d: the frame states its size", big);

    /* the frame: zstd level 1, as one call compressing the whole payload makes it */
    ZSTD_CCtx *z = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, 1);
    const size_t bound = ZSTD_compressBound(want.n);
    uint8_t *again = malloc(bound);
    const size_t c = ZSTD_compress2(z, again, bound, want.d, want.n);
    CHECK(!ZSTD_isError(c) && c == len - 64 && !memcmp(again, file + 64, c), "big %d: frame of %zu bytes, level 1 makes %zu",
          big, len - 64, c);
    ZSTD_freeCCtx(z);
    free(again);

    /* a file holds the same bytes */
    char path[700];
    snprintf(path, sizeof path, "%s/c%d.tgckpt", tg_test_tmpdir(), big);
    CHECK(tg_checkpoint_write(&ck, path, &err) == 0, "big %d: %s", big, err.msg);
    long flen = 0;
    char *written = tg_test_read_file(path, &flen);
    CHECK(written && (size_t)flen == len && !memcmp(written, file, len), "big %d: the file differs from the encoding",
          big);
    free(written);

    /* read back: every state field, field and tensor */
    tg_checkpoint back;
    REQUIRE(tg_checkpoint_read(path, &back, &err) == 0, "big %d: %s", big, err.msg);
    CHECK(!memcmp(&back.state, &k_state, sizeof k_state), "big %d: state read back otherwise", big);
    CHECK(back.n_fields == 2 && !strcmp(back.fields[0].key, "batch") && !strcmp(back.fields[0].value, "4") &&
              !strcmp(back.fields[1].key, "model") && !strcmp(back.fields[1].value, "tiny-bert"),
          "big %d: fields", big);
    CHECK(back.n_tensors == ck.n_tensors, "big %d: %d tensors, want %d", big, back.n_tensors, ck.n_tensors);
    for (int k = 0; k < back.n_tensors && k < ck.n_tensors; k++) {
        const tg_checkpoint_tensor *a = &back.tensors[k], *w = &ck.tensors[k];
        CHECK(!strcmp(a->name, w->name) && a->replica == w->replica && a->dtype == w->dtype && a->ndim == w->ndim &&
                  !memcmp(a->shape, w->shape, sizeof a->shape) && a->bytes == w->bytes &&
                  !memcmp(a->data, w->data, (size_t)w->bytes),
              "big %d: tensor %d (%s) read back otherwise", big, k, w->name);
    }
    tg_checkpoint_free(&back);
    free(payload);
    free(want.d);
    free(file);
    tg_checkpoint_free(&ck);
}

TG_TEST(test_checkpoint_encode_layout_small) { check_layout(0); }
TG_TEST(test_checkpoint_encode_layout_several_blocks) { check_layout(1); }

/* The byte count of a tensor: the dtype's size times every dimension, for 0 to 4 of them. */
TG_TEST(test_checkpoint_add_tensor_bytes_by_rank) {
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    tg_err err = {{0}};
    const int64_t shape[TG_MAX_DIMS + 1] = {2, 3, 5, 7, 11};
    uint64_t want = 4;
    for (int ndim = 0; ndim <= TG_MAX_DIMS; ndim++) {
        char name[16];
        snprintf(name, sizeof name, "r%d", ndim);
        REQUIRE(tg_checkpoint_add_tensor(&ck, name, -1, TG_F32, ndim, shape, calloc(1, (size_t)want), &err) == 0,
                "rank %d: %s", ndim, err.msg);
        const tg_checkpoint_tensor *t = tg_checkpoint_find(&ck, name, -1);
        CHECK(t && t->bytes == want && t->ndim == ndim && (ndim == 0 || t->shape[ndim - 1] == shape[ndim - 1]),
              "rank %d: %llu bytes, want %llu", ndim, t ? (unsigned long long)t->bytes : 0ull, (unsigned long long)want);
        if (ndim < TG_MAX_DIMS) want *= (uint64_t)shape[ndim];
    }
    CHECK(tg_checkpoint_add_tensor(&ck, "r5", -1, TG_F32, TG_MAX_DIMS + 1, shape, malloc(4), &err) == -1 &&
              !strcmp(err.msg, "checkpoint: tensor 'r5' has a bad name, replica, dtype or shape"),
          "rank 5: %s", err.msg);
    CHECK(ck.n_tensors == TG_MAX_DIMS + 1 && ck.n_blocks == TG_MAX_DIMS + 1, "%d tensors", ck.n_tensors);
    tg_checkpoint_free(&ck);
}
