/* What the custom mutators of zstd-framed files (plans, checkpoints) share: a fixed header
 * that starts with an 8-byte magic, then one zstd frame. A mutator edits the decompressed
 * payload and re-seals it, so its edits reach past the checksums. */
#ifndef TUNEGRAPH_FUZZ_FRAMED_H
#define TUNEGRAPH_FUZZ_FRAMED_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

static inline void fuzz_put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The decompressed payload (at most max_payload bytes) of an input that starts with
 * `magic` (8 bytes) and a header of header_bytes, in a buffer of *cap bytes with room to
 * grow; NULL when the input is not of that shape. */
static inline uint8_t *fuzz_framed_payload(const uint8_t *data, size_t size, const char *magic, size_t header_bytes,
                                           unsigned long long max_payload, size_t *len, size_t *cap) {
    if (size < header_bytes || memcmp(data, magic, 8) != 0) return NULL;
    unsigned long long n = ZSTD_getFrameContentSize(data + header_bytes, size - header_bytes);
    if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN || n > max_payload) return NULL;
    *cap = (size_t)n + 4096;
    uint8_t *buf = malloc(*cap);
    if (!buf) return NULL;
    size_t got = ZSTD_decompress(buf, *cap, data + header_bytes, size - header_bytes);
    if (ZSTD_isError(got)) {
        free(buf);
        return NULL;
    }
    *len = got;
    return buf;
}

#endif
