/* libFuzzer target: plan files (tg_plan_decode), then tg_plan_inspect of each decoded
 * plan as text and as JSON to /dev/null, and a re-encode that must decode to the same
 * bytes. The payload is zstd-compressed under a checksum, so byte flips in a plan file
 * mostly die at the checksum: the custom mutator below mutates the decompressed payload
 * and rewrites the frame and header around it, and now and then the raw file (header
 * paths included) with its checksum recomputed. */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "plan/inspect.h"
#include "plan/plan_file.h"
#include "tests/fuzz/fuzz_framed.h"
#include "tests/fuzz/fuzz_input.h"

#define HEADER_BYTES 40

static FILE *devnull(void) {
    static FILE *f;
    if (!f && !(f = fopen("/dev/null", "w"))) {
        perror("/dev/null");
        abort();
    }
    return f;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tg_plan plan;
    tg_err err;
    if (tg_plan_decode(data, size, "fuzz.tgp", &plan, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return 0;
    }
    /* Inspect reads only what decode validated; a write error is the only failure. */
    FUZZ_ASSERT(tg_plan_inspect(&plan, devnull(), 0, &err) == 0, "inspect: %s", err.msg);
    FUZZ_ASSERT(tg_plan_inspect(&plan, devnull(), 1, &err) == 0, "inspect --json: %s", err.msg);

    /* What decodes re-encodes to a file that decodes to the same plan. */
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    FUZZ_ASSERT(tg_plan_encode(&plan, &a, &na, &err) == 0, "encode: %s", err.msg);
    tg_plan again;
    FUZZ_ASSERT(tg_plan_decode(a, na, "re-encoded", &again, &err) == 0, "decode of the re-encoding: %s", err.msg);
    FUZZ_ASSERT(tg_plan_encode(&again, &b, &nb, &err) == 0, "second encode: %s", err.msg);
    FUZZ_ASSERT(na == nb && memcmp(a, b, na) == 0, "re-encoding differs (%zu vs %zu bytes)", na, nb);
    free(a);
    free(b);
    tg_plan_free(&again);
    tg_plan_free(&plan);
    return 0;
}

/* ---- the mutator --------------------------------------------------------------- */

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    size_t len, cap;
    uint8_t *payload = seed % 8 ? fuzz_framed_payload(data, size, "TGPLAN\0\0", HEADER_BYTES, 64u << 20, &len, &cap) : NULL;
    if (!payload) {
        /* The raw file: header fields and frame bytes, then the checksum made to match
         * (most of the time) so the mutation reaches past it. */
        size = LLVMFuzzerMutate(data, size, max_size);
        if (size >= HEADER_BYTES && seed % 16 != 1)
            fuzz_put_le(data + 32, XXH64(data + HEADER_BYTES, size - HEADER_BYTES, 0), 8);
        return size;
    }
    len = LLVMFuzzerMutate(payload, len, cap);
    size_t bound = ZSTD_compressBound(len);
    uint8_t *out = malloc(HEADER_BYTES + bound);
    if (!out) abort();
    size_t csize = ZSTD_compress(out + HEADER_BYTES, bound, payload, len, 1);
    free(payload);
    if (ZSTD_isError(csize) || HEADER_BYTES + csize > max_size) {
        free(out);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    memcpy(out, data, 16); /* magic, version and flags as they were */
    fuzz_put_le(out + 16, len, 8);
    fuzz_put_le(out + 24, csize, 8);
    fuzz_put_le(out + 32, XXH64(out + HEADER_BYTES, csize, 0), 8);
    memcpy(data, out, HEADER_BYTES + csize);
    free(out);
    return HEADER_BYTES + csize;
}
