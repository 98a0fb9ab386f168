/* Checkpoint decoding (runtime/checkpoint.c) of files made by hand: one table of payloads
 * whose records are malformed, out of order or inconsistent, and one of headers and zstd
 * frames that disagree, each refused with the message naming the record, field and cause. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/checkpoint.h"
#include "tests/harness.h"

/* ---- a payload writer ------------------------------------------------------------------ */

typedef struct buf {
    uint8_t d[8192];
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
static void set64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void set32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
/* A string field: u32 length, the bytes. */
static void put_str(buf *b, const char *s, size_t n) {
    put32(b, (uint32_t)n);
    put(b, s, n);
}
/* A record head with its length patched by rec_end; returns where the body starts. */
static size_t rec_begin(buf *b, const char *tag) {
    put(b, tag, 4);
    put64(b, 0);
    return b->n;
}
static void rec_end(buf *b, size_t body) { set64(b->d + body - 8, b->n - body); }

#define STEP 3
#define FINGERPRINT 0x77ull

/* IDNT with one field batch = 4. */
static void idnt(buf *b) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 1);
    put_str(b, "batch", 5);
    put_str(b, "4", 1);
    rec_end(b, at);
}
typedef struct stat_rec {
    int32_t step, total, replicas, examples, epoch, pos;
    uint64_t fingerprint;
} stat_rec;
static const stat_rec k_stat = {STEP, 10, 2, 10, 1, 4, FINGERPRINT};
static void stat_of(buf *b, stat_rec s) {
    const size_t at = rec_begin(b, "STAT");
    put32(b, (uint32_t)s.step), put32(b, (uint32_t)s.total), put32(b, (uint32_t)s.replicas);
    put64(b, s.fingerprint), put64(b, 42), put64(b, STEP);
    put32(b, (uint32_t)s.examples), put32(b, (uint32_t)s.epoch), put32(b, (uint32_t)s.pos);
    put64(b, 42);
    rec_end(b, at);
}
static void stat_ok(buf *b) { stat_of(b, k_stat); }
/* TNSR: name, replica, dtype, ndim, shape[ndim], byte count, `data` bytes of value 1. */
static void tensor(buf *b, const char *name, int32_t replica, int32_t dtype, int32_t ndim, const int64_t *shape,
                   uint64_t bytes, size_t data) {
    const size_t at = rec_begin(b, "TNSR");
    put_str(b, name, strlen(name));
    put32(b, (uint32_t)replica), put32(b, (uint32_t)dtype), put32(b, (uint32_t)ndim);
    for (int d = 0; d < ndim; d++) put64(b, (uint64_t)shape[d]);
    put64(b, bytes);
    memset(b->d + b->n, 1, data);
    b->n += data;
    rec_end(b, at);
}
static const int64_t k_two[1] = {2};
static void tensor_ok(buf *b) { tensor(b, "w", -1, TG_F32, 1, k_two, 8, 8); }
static void end(buf *b) { rec_begin(b, "END!"); }
/* A record body of raw bytes under `tag`. */
static void raw_rec(buf *b, const char *tag, const void *body, size_t n) {
    const size_t at = rec_begin(b, tag);
    put(b, body, n);
    rec_end(b, at);
}

/* The file: a header over the payload compressed as one frame (malloc'd). */
static uint8_t *seal_as(const buf *payload, uint32_t step, uint64_t fingerprint, size_t *len) {
    const size_t bound = ZSTD_compressBound(payload->n);
    uint8_t *out = malloc(64 + bound);
    const size_t c = ZSTD_compress(out + 64, bound, payload->d, payload->n, 1);
    memcpy(out, "TGCKPT\0\0", 8);
    set32(out + 8, TG_CHECKPOINT_VERSION);
    set32(out + 12, 0);
    set32(out + 16, step);
    set32(out + 20, 0);
    set64(out + 24, fingerprint);
    set64(out + 32, payload->n);
    set64(out + 40, c);
    set64(out + 48, XXH64(payload->d, payload->n, 0));
    set64(out + 56, XXH64(out, 56, 0));
    *len = 64 + c;
    return out;
}
static uint8_t *seal(const buf *payload, size_t *len) { return seal_as(payload, STEP, FINGERPRINT, len); }

/* ---- the payload table ---------------------------------------------------------------- */

#define CASE(name) static void name(buf *b)
CASE(good) { idnt(b), stat_ok(b), tensor_ok(b), end(b); }
/* IDNT */
CASE(idnt_count_cut) { raw_rec(b, "IDNT", "\1\0", 2), stat_ok(b), end(b); }
CASE(idnt_count_huge) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 5000); /* past the 4096 fields allowed, whatever follows */
    rec_end(b, at);
}
CASE(idnt_count_past_record) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 3), put_str(b, "ab", 2), put_str(b, "c", 1);
    rec_end(b, at);
}
/* Two fields counted, one there: 16 bytes of fields at the least, 11 left after the count. */
CASE(idnt_count_one_past_record) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 2), put_str(b, "ab", 2), put_str(b, "c", 1);
    rec_end(b, at);
}
CASE(idnt_key_long) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 1), put32(b, TG_CHECKPOINT_KEY_MAX), put32(b, 0); /* one past the longest */
    rec_end(b, at);
}
CASE(idnt_key_cut) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 1), put32(b, 10), put(b, "abcd", 4);
    rec_end(b, at);
}
CASE(idnt_key_nul) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 1), put_str(b, "a\0b", 3), put_str(b, "1", 1);
    rec_end(b, at);
}
CASE(idnt_value_cut) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 1), put_str(b, "ab", 2), put(b, "\1\0", 2);
    rec_end(b, at);
}
CASE(idnt_value_long) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 1), put_str(b, "ab", 2), put32(b, TG_PATH_MAX);
    rec_end(b, at);
}
CASE(idnt_key_empty) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 1), put_str(b, "", 0), put_str(b, "x", 1);
    rec_end(b, at);
}
CASE(idnt_key_twice) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 2), put_str(b, "a", 1), put_str(b, "1", 1), put_str(b, "a", 1), put_str(b, "2", 1);
    rec_end(b, at);
}
CASE(idnt_trailing) {
    const size_t at = rec_begin(b, "IDNT");
    put32(b, 0), put(b, "xyz", 3);
    rec_end(b, at);
    stat_ok(b), end(b);
}
/* STAT */
CASE(stat_length) {
    idnt(b);
    uint8_t body[50] = {0};
    raw_rec(b, "STAT", body, sizeof body);
    end(b);
}
#define STAT_CASE(name, ...)                                                                                   \
    CASE(name) {                                                                                               \
        stat_rec s = k_stat;                                                                                   \
        __VA_ARGS__;                                                                                           \
        idnt(b), stat_of(b, s), end(b);                                                                        \
    }
STAT_CASE(stat_step_negative, s.step = -1)
STAT_CASE(stat_step_past_total, s.total = 2)
STAT_CASE(stat_replicas_zero, s.replicas = 0)
STAT_CASE(stat_replicas_many, s.replicas = TG_MAX_DATA_PARALLEL + 1)
STAT_CASE(stat_examples_negative, s.examples = -1, s.pos = -2)
STAT_CASE(stat_epoch_negative, s.epoch = -1)
STAT_CASE(stat_pos_negative, s.pos = -1)
STAT_CASE(stat_step_disagrees, s.step = 4)
STAT_CASE(stat_step_below_header, s.step = 2)
STAT_CASE(stat_fingerprint_disagrees, s.fingerprint = 0x78)
/* TNSR */
CASE(tnsr_name_cut) { idnt(b), stat_ok(b), raw_rec(b, "TNSR", "\1\0", 2), end(b); }
CASE(tnsr_name_empty) { idnt(b), stat_ok(b), tensor(b, "", -1, TG_F32, 1, k_two, 8, 8), end(b); }
CASE(tnsr_name_long) {
    idnt(b), stat_ok(b);
    const size_t at = rec_begin(b, "TNSR");
    put32(b, TG_NAME_MAX);
    rec_end(b, at);
    end(b);
}
CASE(tnsr_replica_cut) {
    idnt(b), stat_ok(b);
    const size_t at = rec_begin(b, "TNSR");
    put_str(b, "w", 1), put32(b, 0), put32(b, 0);
    rec_end(b, at);
    end(b);
}
CASE(tnsr_replica_low) { idnt(b), stat_ok(b), tensor(b, "w", -2, TG_F32, 1, k_two, 8, 8), end(b); }
CASE(tnsr_replica_high) { idnt(b), stat_ok(b), tensor(b, "w", 2, TG_F32, 1, k_two, 8, 8), end(b); }
CASE(tnsr_replica_last) { idnt(b), stat_ok(b), tensor(b, "w", 1, TG_F32, 1, k_two, 8, 8), end(b); }
CASE(tnsr_dtype_negative) { idnt(b), stat_ok(b), tensor(b, "w", -1, -1, 1, k_two, 8, 8), end(b); }
CASE(tnsr_ndim_negative) { idnt(b), stat_ok(b), tensor(b, "w", -1, TG_F32, -1, k_two, 8, 8), end(b); }
CASE(tnsr_ndim_many) {
    const int64_t shape[TG_MAX_DIMS + 1] = {1, 1, 1, 1, 2};
    idnt(b), stat_ok(b), tensor(b, "w", -1, TG_F32, TG_MAX_DIMS + 1, shape, 8, 8), end(b);
}
CASE(tnsr_shape_cut) {
    idnt(b), stat_ok(b);
    const size_t at = rec_begin(b, "TNSR");
    put_str(b, "w", 1), put32(b, (uint32_t)-1), put32(b, TG_F32), put32(b, 2), put64(b, 2);
    rec_end(b, at);
    end(b);
}
CASE(tnsr_shape_negative) {
    const int64_t shape[2] = {2, -3};
    idnt(b), stat_ok(b), tensor(b, "w", -1, TG_F32, 2, shape, 8, 8), end(b);
}
CASE(tnsr_shape_overflow) {
    const int64_t shape[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    idnt(b), stat_ok(b), tensor(b, "w", -1, TG_F32, 2, shape, 8, 8), end(b);
}
CASE(tnsr_data_cut) {
    idnt(b), stat_ok(b);
    const size_t at = rec_begin(b, "TNSR");
    put_str(b, "w", 1), put32(b, (uint32_t)-1), put32(b, TG_F32), put32(b, 1), put64(b, 2), put64(b, 8);
    put(b, "\1\1\1\1", 4);
    rec_end(b, at);
    end(b);
}
CASE(tnsr_twice) { idnt(b), stat_ok(b), tensor_ok(b), tensor_ok(b), end(b); }
CASE(tnsr_twice_other_replica) {
    idnt(b), stat_ok(b), tensor(b, "w", 0, TG_F32, 1, k_two, 8, 8), tensor(b, "w", 1, TG_F32, 1, k_two, 8, 8);
    tensor(b, "w", 0, TG_F32, 1, k_two, 8, 8), end(b);
}
CASE(tnsr_trailing) {
    idnt(b), stat_ok(b);
    const size_t at = rec_begin(b, "TNSR");
    put_str(b, "w", 1), put32(b, (uint32_t)-1), put32(b, TG_F32), put32(b, 1), put64(b, 2), put64(b, 8);
    put(b, "\1\1\1\1\1\1\1\1", 8);
    put(b, "\7\7", 2);
    rec_end(b, at);
    end(b);
}
/* the records' order */
CASE(first_is_stat) { stat_ok(b), idnt(b), end(b); }
CASE(first_is_end) { end(b); }
CASE(idnt_twice) { idnt(b), idnt(b), stat_ok(b), end(b); }
CASE(second_is_end) { idnt(b), end(b); }
CASE(second_is_tensor) { idnt(b), tensor_ok(b), stat_ok(b), end(b); }
CASE(stat_twice) { idnt(b), stat_ok(b), stat_ok(b), end(b); }
CASE(tag_unprintable) { idnt(b), stat_ok(b), raw_rec(b, "\1\2\3\4", "", 0), end(b); }
CASE(after_end) { idnt(b), stat_ok(b), end(b), tensor_ok(b); }
CASE(head_cut) { idnt(b), stat_ok(b), put(b, "TNSR\0", 5); }
CASE(length_past_end) {
    idnt(b), stat_ok(b);
    put(b, "TNSR", 4), put64(b, 1000), put(b, "abc", 3);
}
CASE(end_with_body) { idnt(b), stat_ok(b), raw_rec(b, "END!", "z", 1); }
CASE(no_end) { idnt(b), stat_ok(b), tensor_ok(b); }
CASE(only_idnt) { idnt(b); }

typedef struct payload_case {
    void (*make)(buf *);
    const char *want; /* NULL: decodes */
} payload_case;

static const payload_case k_cases[] = {
    {good, NULL},
    {tnsr_replica_last, NULL},
    {idnt_count_cut, "record 0 (IDNT): field 'count' is cut short (file corrupt)"},
    {idnt_count_huge, "record 0 (IDNT): field 'count' is 5000, more than the record holds"},
    {idnt_count_past_record, "record 0 (IDNT): field 'count' is 3, more than the record holds"},
    {idnt_count_one_past_record, "record 0 (IDNT): field 'count' is 2, more than the record holds"},
    {idnt_key_long, "record 0 (IDNT): field 'key' is 64 bytes, at most 63 allowed"},
    {idnt_key_cut, "record 0 (IDNT): field 'key' is cut short"},
    {idnt_key_nul, "record 0 (IDNT): field 'key' holds a NUL byte"},
    {idnt_value_cut, "record 0 (IDNT): field 'value' is cut short"},
    {idnt_value_long, "record 0 (IDNT): field 'value' is 512 bytes, at most 511 allowed"},
    {idnt_key_empty, "record 0 (IDNT): field 0 has an empty key"},
    {idnt_key_twice, "record 0 (IDNT): field 'a' is there twice"},
    {idnt_trailing, "record 0 ('IDNT'): 3 bytes past its fields"},
    {stat_length, "record 1 (STAT): field 'length' is 50, not 56"},
    {stat_step_negative, "record 1 (STAT): field 'step' is -1 of 10 total steps"},
    {stat_step_past_total, "record 1 (STAT): field 'step' is 3 of 2 total steps"},
    {stat_replicas_zero, "record 1 (STAT): field 'replicas' is 0, not in [1, 64]"},
    {stat_replicas_many, "record 1 (STAT): field 'replicas' is 65, not in [1, 64]"},
    {stat_examples_negative, "record 1 (STAT): field 'sampler': epoch 1, position -2 of -1 examples"},
    {stat_epoch_negative, "record 1 (STAT): field 'sampler': epoch -1, position 4 of 10 examples"},
    {stat_pos_negative, "record 1 (STAT): field 'sampler': epoch 1, position -1 of 10 examples"},
    {stat_step_disagrees, "header field 'step' is 3, the state record says 4"},
    {stat_step_below_header, "header field 'step' is 3, the state record says 2"},
    {stat_fingerprint_disagrees, "header field 'plan fingerprint' disagrees with the state record"},
    {tnsr_name_cut, "record 2 (TNSR): field 'name' is cut short"},
    {tnsr_name_empty, "record 2 (TNSR): field 'name' is empty"},
    {tnsr_name_long, "record 2 (TNSR): field 'name' is 96 bytes, at most 95 allowed"},
    {tnsr_replica_cut, "record 2 (tensor 'w'): field 'replica' is cut short"},
    {tnsr_replica_low, "record 2 (tensor 'w'): field 'replica' is -2, the checkpoint has 2"},
    {tnsr_replica_high, "record 2 (tensor 'w'): field 'replica' is 2, the checkpoint has 2"},
    {tnsr_dtype_negative, "record 2 (tensor 'w'): field 'dtype' is -1, not a known dtype"},
    {tnsr_ndim_negative, "record 2 (tensor 'w'): field 'ndim' is -1, not in [0, 4]"},
    {tnsr_ndim_many, "record 2 (tensor 'w'): field 'ndim' is 5, not in [0, 4]"},
    {tnsr_shape_cut, "record 2 (tensor 'w'): field 'shape' is cut short"},
    {tnsr_shape_negative, "record 2 (tensor 'w'): field 'shape' has a negative or overflowing dimension"},
    {tnsr_shape_overflow, "record 2 (tensor 'w'): field 'shape' has a negative or overflowing dimension"},
    {tnsr_data_cut, "record 2 (tensor 'w'): field 'data' is cut short: 8 bytes, 4 left"},
    {tnsr_twice, "record 3 (tensor 'w'): the tensor is there twice"},
    {tnsr_twice_other_replica, "record 4 (tensor 'w'): the tensor is there twice"},
    {tnsr_trailing, "record 2 ('TNSR'): 2 bytes past its fields"},
    {first_is_stat, "record 0: tag 'STAT' where the identity (IDNT) belongs"},
    {first_is_end, "record 0: tag 'END!' where the identity (IDNT) belongs"},
    {idnt_twice, "record 1: tag 'IDNT' where the state (STAT) belongs"},
    {second_is_end, "record 1: tag 'END!' where the state (STAT) belongs"},
    {second_is_tensor, "record 1: tag 'TNSR' where the state (STAT) belongs"},
    {stat_twice, "record 2: tag 'STAT' where a tensor (TNSR) or END! belongs"},
    {tag_unprintable, "record 2: tag 0x01020304 where a tensor (TNSR) or END! belongs"},
    {after_end, "record 3 follows the END! record"},
    {head_cut, "record 2: its header is cut short"},
    {length_past_end, "record 2 ('TNSR'): field 'length' is 1000, 3 bytes are left"},
    {end_with_body, "record 2 ('END!'): 1 bytes past its fields"},
    {no_end, "the payload ends without its END! record"},
    {only_idnt, "the payload ends without its END! record"},
};

TG_TEST(test_checkpoint_decode_record_table) {
    for (size_t k = 0; k < sizeof k_cases / sizeof k_cases[0]; k++) {
        buf *b = calloc(1, sizeof *b);
        k_cases[k].make(b);
        size_t len;
        uint8_t *bytes = seal(b, &len);
        tg_checkpoint ck;
        tg_err err = {{0}};
        const int rc = tg_checkpoint_decode(bytes, len, "crafted.tgckpt", &ck, &err);
        if (!k_cases[k].want) {
            CHECK(rc == 0, "case %zu: refused: %s", k, err.msg);
            if (rc == 0) {
                const tg_checkpoint_tensor *t = ck.n_tensors == 1 ? &ck.tensors[0] : NULL;
                CHECK(ck.state.step == STEP && ck.state.replicas == 2 && ck.state.plan_fingerprint == FINGERPRINT &&
                          ck.state.sampler_pos == 4 && t && t->bytes == 8 && t->shape[0] == 2 &&
                          ((const uint8_t *)t->data)[7] == 1 && ck.n_fields == 1,
                      "case %zu: decoded otherwise", k);
                tg_checkpoint_free(&ck);
            }
        } else {
            CHECK(rc == -1 && strstr(err.msg, "crafted.tgckpt: ") == err.msg && strstr(err.msg, k_cases[k].want),
                  "case %zu: rc %d, '%s' lacks '%s'", k, rc, err.msg, k_cases[k].want);
            CHECK(rc != -1 || (ck.n_tensors == 0 && ck.n_blocks == 0 && ck.n_fields == 0),
                  "case %zu: a refused checkpoint keeps what it read", k);
        }
        free(bytes);
        free(b);
    }
}

/* ---- headers and frames ---------------------------------------------------------------- */

static void header_reseal(uint8_t *h) { set64(h + 56, XXH64(h, 56, 0)); }

/* A zstd frame header alone that claims `size` content bytes (single segment, 8-byte
 * content size), then one empty raw last block: valid up to the size it claims. */
static size_t fake_frame(uint8_t *out, uint64_t size) {
    set32(out, 0xFD2FB528u);
    out[4] = 0xE0; /* content size field 8 bytes, single segment */
    set64(out + 5, size);
    out[13] = 1, out[14] = 0, out[15] = 0; /* last block, raw, 0 bytes */
    return 16;
}

TG_TEST(test_checkpoint_decode_header_table) {
    buf *b = calloc(1, sizeof *b);
    good(b);
    size_t len;
    uint8_t *good_bytes = seal(b, &len);
    uint8_t *bytes = malloc(len + 64);
    tg_checkpoint ck;
    tg_err err;

    /* A name of NULL is called "checkpoint". */
    CHECK(tg_checkpoint_decode((const uint8_t *)"PK\3\4", 4, NULL, &ck, &err) == -1 &&
              !strcmp(err.msg, "checkpoint: not a tunegraph checkpoint (header field 'magic')"),
          "%s", err.msg);
    CHECK(tg_checkpoint_decode(good_bytes, 0, "empty", &ck, &err) == -1 &&
              !strcmp(err.msg, "empty: truncated: 0 bytes, the checkpoint header alone is 64"),
          "%s", err.msg);

    memcpy(bytes, good_bytes, len);
    set32(bytes + 12, 1);
    header_reseal(bytes);
    CHECK(tg_checkpoint_decode(bytes, len, "h", &ck, &err) == -1 &&
              !strcmp(err.msg, "h: header field 'flags' is 0x1, not 0 (file corrupt or from a newer build)"),
          "flags: %s", err.msg);
    /* Flags set in their high byte alone, and with reserved set too: flags are named first. */
    memcpy(bytes, good_bytes, len);
    set32(bytes + 12, 0x80000000u);
    header_reseal(bytes);
    CHECK(tg_checkpoint_decode(bytes, len, "h", &ck, &err) == -1 &&
              !strcmp(err.msg, "h: header field 'flags' is 0x80000000, not 0 (file corrupt or from a newer build)"),
          "high flags: %s", err.msg);
    memcpy(bytes, good_bytes, len);
    set32(bytes + 12, 0x100), set32(bytes + 20, 7);
    header_reseal(bytes);
    CHECK(tg_checkpoint_decode(bytes, len, "h", &ck, &err) == -1 &&
              !strcmp(err.msg, "h: header field 'flags' is 0x100, not 0 (file corrupt or from a newer build)"),
          "flags and reserved: %s", err.msg);
    memcpy(bytes, good_bytes, len);
    set32(bytes + 20, 0x2a);
    header_reseal(bytes);
    CHECK(tg_checkpoint_decode(bytes, len, "h", &ck, &err) == -1 &&
              !strcmp(err.msg, "h: header field 'reserved' is 0x2a, not 0 (file corrupt or from a newer build)"),
          "reserved: %s", err.msg);
    memcpy(bytes, good_bytes, len);
    set32(bytes + 8, 2);
    header_reseal(bytes);
    CHECK(tg_checkpoint_decode(bytes, len, "h", &ck, &err) == -1 &&
              strstr(err.msg, "h: header field 'version': checkpoint format 2, this build reads format 1"),
          "version: %s", err.msg);

    /* A frame without its content size (streamed with the size flag off). */
    {
        ZSTD_CCtx *z = ZSTD_createCCtx();
        ZSTD_CCtx_setParameter(z, ZSTD_c_contentSizeFlag, 0);
        memcpy(bytes, good_bytes, 64);
        const size_t c = ZSTD_compress2(z, bytes + 64, len, b->d, b->n);
        ZSTD_freeCCtx(z);
        REQUIRE(!ZSTD_isError(c), "zstd");
        set64(bytes + 40, c);
        header_reseal(bytes);
        char want[120];
        snprintf(want, sizeof want, "h: header field 'payload bytes' (%zu) disagrees with the compressed frame", b->n);
        CHECK(tg_checkpoint_decode(bytes, 64 + c, "h", &ck, &err) == -1 && strstr(err.msg, want), "no size: %s",
              err.msg);
    }
    /* A header stating one payload byte more or less than the frame holds, and a frame
     * that is no zstd frame. */
    for (int d = -1; d <= 2; d++) {
        memcpy(bytes, good_bytes, len);
        const uint64_t stated = (uint64_t)b->n + (uint64_t)(d == 2 ? 0 : d);
        set64(bytes + 32, stated);
        if (d == 2) memset(bytes + 64, 0x55, 4); /* the frame's magic number overwritten */
        if (d == 0) continue;
        header_reseal(bytes);
        char want[160];
        snprintf(want, sizeof want,
                 "h: header field 'payload bytes' (%llu) disagrees with the compressed frame (file corrupt)",
                 (unsigned long long)stated);
        CHECK(tg_checkpoint_decode(bytes, len, "h", &ck, &err) == -1 && !strcmp(err.msg, want), "stated %llu%s: '%s'",
              (unsigned long long)stated, d == 2 ? ", no frame" : "", err.msg);
    }
    /* Frames whose stated size is impossible: 0, past half the address space, and more than
     * 32768 times the compressed bytes. */
    const struct {
        uint64_t size;
        const char *want;
    } sizes[] = {
        {0, "h: header field 'payload bytes' (0) is impossible (file corrupt)"},
        {UINT64_C(1) << 63, "h: header field 'payload bytes' (9223372036854775808) is impossible (file corrupt)"},
        {UINT64_C(1) << 30, "h: header field 'payload bytes' (1073741824) is impossible (file corrupt)"},
        {16 * 32768, "h: the payload does not decompress"},
    };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        memcpy(bytes, good_bytes, 64);
        const size_t c = fake_frame(bytes + 64, sizes[k].size);
        set64(bytes + 32, sizes[k].size);
        set64(bytes + 40, c);
        header_reseal(bytes);
        CHECK(tg_checkpoint_decode(bytes, 64 + c, "h", &ck, &err) == -1 && strstr(err.msg, sizes[k].want),
              "size %llu: '%s' lacks '%s'", (unsigned long long)sizes[k].size, err.msg, sizes[k].want);
    }
    /* The payload checksum, stated otherwise. */
    memcpy(bytes, good_bytes, len);
    set64(bytes + 48, 0x1234);
    header_reseal(bytes);
    CHECK(tg_checkpoint_decode(bytes, len, "h", &ck, &err) == -1 &&
              strstr(err.msg, "h: header field 'payload checksum' is 0000000000001234, the payload's xxh64 is "),
          "checksum: %s", err.msg);
    /* The sealed file as made decodes. */
    CHECK(tg_checkpoint_decode(good_bytes, len, "h", &ck, &err) == 0, "%s", err.msg);
    tg_checkpoint_free(&ck);
    free(bytes);
    free(good_bytes);
    free(b);
}
