/* libFuzzer target: checkpoint files (tg_checkpoint_decode, and tg_checkpoint_read of the
 * same bytes as a file, which must agree), then what a resume relies on in each decoded
 * checkpoint: every tensor's byte count matches its dtype and shape, names and replicas are
 * in range, lookups find each tensor and field; and a re-encode that decodes to the same
 * checkpoint and encodes to the same bytes. The payload is zstd-compressed under checksums,
 * so the custom mutator below mutates the decompressed payload and rewrites the frame,
 * sizes and checksums around it, and now and then the raw file with its header checksum
 * made to match. */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "runtime/checkpoint.h"
#include "tests/fuzz/fuzz_framed.h"
#include "tests/fuzz/fuzz_input.h"

#define HEADER_BYTES TG_CHECKPOINT_HEADER_BYTES

static int same(const tg_checkpoint *a, const tg_checkpoint *b) {
    if (memcmp(&a->state, &b->state, sizeof a->state) || a->n_fields != b->n_fields || a->n_tensors != b->n_tensors)
        return 0;
    for (int i = 0; i < a->n_fields; i++)
        if (strcmp(a->fields[i].key, b->fields[i].key) || strcmp(a->fields[i].value, b->fields[i].value)) return 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const tg_checkpoint_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) || x->replica != y->replica || x->dtype != y->dtype || x->ndim != y->ndim ||
            x->bytes != y->bytes || memcmp(x->shape, y->shape, sizeof x->shape) ||
            (x->bytes && memcmp(x->data, y->data, (size_t)x->bytes)))
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tg_checkpoint ck, file;
    tg_err err;
    const int decoded = tg_checkpoint_decode(data, size, "fuzz.tgckpt", &ck, &err) == 0;
    if (!decoded) FUZZ_ASSERT(err.msg[0] && strstr(err.msg, "fuzz.tgckpt: "), "failed without naming the file: %s", err.msg);
    /* The file reader takes the same bytes the same way. */
    const int read = tg_checkpoint_read(fuzz_input_file(data, size), &file, &err) == 0;
    FUZZ_ASSERT(read == decoded, "decode %d, read %d: %s", decoded, read, err.msg);
    if (!decoded) return 0;
    FUZZ_ASSERT(same(&ck, &file), "the file reader decoded other content");
    tg_checkpoint_free(&file);

    const tg_checkpoint_state *s = &ck.state;
    FUZZ_ASSERT(s->step >= 0 && s->step <= s->total_steps && s->replicas >= 1 && s->replicas <= TG_MAX_DATA_PARALLEL &&
                    s->sampler_pos >= 0 && s->sampler_pos <= s->sampler_examples && s->sampler_epoch >= 0,
                "state out of range: step %d of %d, %d replicas, sampler %d/%d", s->step, s->total_steps, s->replicas,
                s->sampler_pos, s->sampler_examples);
    for (int i = 0; i < ck.n_fields; i++)
        FUZZ_ASSERT(tg_checkpoint_field_value(&ck, ck.fields[i].key) == ck.fields[i].value, "field '%s' lookup",
                    ck.fields[i].key);
    for (int i = 0; i < ck.n_tensors; i++) {
        const tg_checkpoint_tensor *t = &ck.tensors[i];
        uint64_t n = (uint64_t)tg_dtype_size(t->dtype);
        FUZZ_ASSERT(n > 0 && t->ndim >= 0 && t->ndim <= TG_MAX_DIMS, "tensor '%s': dtype %d, %d dims", t->name,
                    t->dtype, t->ndim);
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_ASSERT(t->shape[d] >= 0, "tensor '%s' dim %d is %lld", t->name, d, (long long)t->shape[d]);
            n *= (uint64_t)t->shape[d];
        }
        FUZZ_ASSERT(n == t->bytes, "tensor '%s': %llu bytes for its shape, %llu held", t->name, (unsigned long long)n,
                    (unsigned long long)t->bytes);
        FUZZ_ASSERT(t->name[0] && t->replica >= -1 && t->replica < s->replicas, "tensor '%s' replica %d", t->name,
                    t->replica);
        FUZZ_ASSERT(tg_checkpoint_find(&ck, t->name, t->replica) == t, "tensor '%s' lookup", t->name);
        volatile uint8_t sum = 0; /* every byte is readable (ASan) */
        for (uint64_t k = 0; k < t->bytes; k++) sum ^= ((const uint8_t *)t->data)[k];
        (void)sum;
    }

    /* What decodes re-encodes to a checkpoint that decodes the same and encodes the same. */
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    tg_checkpoint again;
    FUZZ_ASSERT(tg_checkpoint_encode(&ck, &a, &na, &err) == 0, "encode: %s", err.msg);
    FUZZ_ASSERT(tg_checkpoint_decode(a, na, "re-encoded", &again, &err) == 0, "decode of the re-encoding: %s", err.msg);
    FUZZ_ASSERT(same(&ck, &again), "the re-encoding decodes to other content");
    FUZZ_ASSERT(tg_checkpoint_encode(&again, &b, &nb, &err) == 0, "second encode: %s", err.msg);
    FUZZ_ASSERT(na == nb && memcmp(a, b, na) == 0, "re-encoding differs (%zu vs %zu bytes)", na, nb);
    free(a);
    free(b);
    tg_checkpoint_free(&again);
    tg_checkpoint_free(&ck);
    return 0;
}

/* ---- the mutator --------------------------------------------------------------- */

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    size_t len, cap;
    uint8_t *payload = seed % 8 ? fuzz_framed_payload(data, size, "TGCKPT\0\0", HEADER_BYTES, 16u << 20, &len, &cap) : NULL;
    if (!payload) {
        /* The raw file: header fields and frame bytes, then (most of the time) the header
         * checksum made to match so the mutation reaches past it. */
        size = LLVMFuzzerMutate(data, size, max_size);
        if (size >= HEADER_BYTES && seed % 16 != 1) fuzz_put_le(data + 56, XXH64(data, 56, 0), 8);
        return size;
    }
    len = LLVMFuzzerMutate(payload, len, cap);
    size_t bound = ZSTD_compressBound(len);
    uint8_t *out = malloc(HEADER_BYTES + bound);
    if (!out) abort();
    size_t csize = ZSTD_compress(out + HEADER_BYTES, bound, payload, len, 1);
    if (ZSTD_isError(csize) || HEADER_BYTES + csize > max_size) {
        free(payload);
        free(out);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    memcpy(out, data, 32); /* magic, version, flags, step, reserved, fingerprint as they were */
    fuzz_put_le(out + 32, len, 8);
    fuzz_put_le(out + 40, csize, 8);
    fuzz_put_le(out + 48, XXH64(payload, len, 0), 8);
    /* The header's step and fingerprint follow the state record where it sits (second
     * record), so the mutation reaches the records after it. */
    const size_t stat = len >= 12 ? 12 + (size_t)(payload[4] | payload[5] << 8 | payload[6] << 16) : 0;
    if (stat && stat + 12 + 20 <= len && !memcmp(payload + stat, "STAT", 4) && seed % 4) {
        memcpy(out + 16, payload + stat + 12, 4);
        memcpy(out + 24, payload + stat + 12 + 12, 8);
    }
    fuzz_put_le(out + 56, XXH64(out, 56, 0), 8);
    free(payload);
    memcpy(data, out, HEADER_BYTES + csize);
    free(out);
    return HEADER_BYTES + csize;
}
