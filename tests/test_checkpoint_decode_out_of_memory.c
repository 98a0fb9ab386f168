/* Decoding a checkpoint (runtime/checkpoint.c, tg_checkpoint_decode) with each allocation
 * failing in turn: refused with the exact message of what it was allocating (the payload,
 * zstd's decompressor, an identity field, a tensor slot), the checkpoint left empty and
 * nothing leaked (ASan); with none failing it decodes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"

TG_TEST(test_checkpoint_decode_out_of_memory_messages) {
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    ck.state = (tg_checkpoint_state){.step = 1, .total_steps = 2, .replicas = 1};
    tg_err err = {{0}};
    REQUIRE(tg_checkpoint_add_field(&ck, "batch", "4", &err) == 0, "%s", err.msg);
    for (int i = 0; i < 9; i++) { /* past the tensor table's first room of 8 */
        char name[8];
        snprintf(name, sizeof name, "t%d", i);
        REQUIRE(tg_checkpoint_add_tensor(&ck, name, -1, TG_F32, 1, (const int64_t[]){2}, calloc(2, 4), &err) == 0,
                "%s", err.msg);
    }
    uint8_t *bytes;
    size_t len;
    REQUIRE(tg_checkpoint_encode(&ck, &bytes, &len, &err) == 0, "%s", err.msg);
    const uint64_t payload = (uint64_t)(bytes[32] | bytes[33] << 8 | bytes[34] << 16);
    char want_payload[200];
    snprintf(want_payload, sizeof want_payload, "mem: out of memory for a %llu-byte payload",
             (unsigned long long)payload);
    const char *const wants[] = {want_payload, "mem: out of memory for the zstd decompressor",
                                 "checkpoint: out of memory adding identity field 'batch'", "mem: out of memory"};
    int seen[4] = {0};
    tg_checkpoint back;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_checkpoint_decode(bytes, len, "mem", &back, &err) == 0 && back.n_tensors == 9, "%s", err.msg);
    tg_checkpoint_free(&back);
    const long total = tg_alloc_fail_after(-1);
    CHECK(total >= 5, "decoding allocates %ld times", total);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_checkpoint_decode(bytes, len, "mem", &back, &err);
        tg_alloc_fail_after(-1);
        int known = -1;
        for (int w = 0; w < 4; w++)
            if (!strcmp(err.msg, wants[w])) known = w;
        if (known >= 0) seen[known] = 1;
        CHECK(rc == -1 && known >= 0, "allocation %ld of %ld failing: rc %d, '%s'", k, total, rc, err.msg);
        CHECK(back.n_fields == 0 && back.n_tensors == 0 && back.n_blocks == 0 && !back.fields && !back.tensors &&
                  !back.blocks,
              "allocation %ld failing: the refused checkpoint keeps %d fields, %d tensors", k, back.n_fields,
              back.n_tensors);
        if (rc == 0) tg_checkpoint_free(&back);
    }
    CHECK(seen[0] && seen[1] && seen[2] && seen[3], "messages seen: payload %d, zstd %d, field %d, tensor %d", seen[0],
          seen[1], seen[2], seen[3]);
    free(bytes);
    tg_checkpoint_free(&ck);
}
