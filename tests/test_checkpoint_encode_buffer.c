/* tg_checkpoint_encode's output buffer (runtime/checkpoint.c): it starts at 64 KiB and
 * doubles, so an encoding under 64 KiB takes the same allocations whatever its size, and a
 * larger one a reallocation per doubling; each encoding decodes back to its tensor. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"

/* Encodes a checkpoint of one tensor of n random floats (incompressible): the encoding's
 * length and the allocations it made; 0 on failure. */
static int encode_floats(int64_t n, size_t *len, long *made) {
    tg_checkpoint ck, back;
    tg_err err = {{0}};
    tg_checkpoint_init(&ck);
    ck.state = (tg_checkpoint_state){.step = 1, .total_steps = 2, .replicas = 1};
    float *w = malloc(sizeof *w * (size_t)n);
    if (!w) return 0;
    tg_test_fill_uniform(w, n, 99, -1.0f, 1.0f);
    if (!CHECK(tg_checkpoint_add_tensor(&ck, "w", -1, TG_F32, 1, (const int64_t[]){n}, w, &err) == 0, "%s", err.msg))
        return 0;
    uint8_t *bytes;
    tg_alloc_fail_after(-1);
    int ok = CHECK(tg_checkpoint_encode(&ck, &bytes, len, &err) == 0, "%lld floats: %s", (long long)n, err.msg);
    *made = tg_alloc_fail_after(-1);
    if (ok) {
        ok = CHECK(tg_checkpoint_decode(bytes, *len, "mem", &back, &err) == 0, "%lld floats: %s", (long long)n, err.msg);
        if (ok) {
            const tg_checkpoint_tensor *t = tg_checkpoint_find(&back, "w", -1);
            ok = CHECK(t && t->bytes == (uint64_t)n * 4 && !memcmp(t->data, ck.tensors[0].data, (size_t)n * 4),
                       "%lld floats: decoded otherwise", (long long)n);
            tg_checkpoint_free(&back);
        }
        free(bytes);
    }
    tg_checkpoint_free(&ck);
    return ok;
}

TG_TEST(test_checkpoint_encode_buffer_growth) {
    size_t len_small, len_mid, len_big;
    long made_small, made_mid, made_big;
    REQUIRE(encode_floats(16, &len_small, &made_small) && encode_floats(12000, &len_mid, &made_mid) &&
                encode_floats(40000, &len_big, &made_big),
            "encodings");
    CHECK(len_small < 1024 && len_mid > 40000 && len_mid < 65536 && len_big > 131072 && len_big < 262144,
          "encodings of %zu, %zu and %zu bytes", len_small, len_mid, len_big);
    /* 64 KiB holds the first two; the third doubles it twice. */
    CHECK(made_mid == made_small && made_big == made_small + 2, "allocations: %ld, %ld and %ld", made_small, made_mid,
          made_big);
}
