/* The shard set's manifest is read into a buffer of 64 KiB that doubles only while the
 * file fills it: a small manifest costs no growth, one of just over 64 KiB (a long
 * command line) exactly one, seen by failing each allocation in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "tests/harness.h"

static int write_set(const char *out, const char *command, tg_err *err) {
    const tg_shard_set_desc d = {.task = TG_SHARD_LM, .seq = 4, .tokenizer_identity = 7, .tokenizer_family = "wordpiece",
                                 .vocab_size = 40, .command = command};
    tg_shard_writer *w;
    if (tg_shard_writer_open(out, &d, &w, err)) return -1;
    for (int32_t i = 0; i < 3; i++) {
        const int32_t ids[2] = {i, i + 1};
        if (tg_shard_writer_add(w, TG_SPLIT_TRAIN, &(tg_shard_record){.len = 2, .input_ids = ids}, err)) {
            tg_shard_writer_abort(w);
            return -1;
        }
    }
    return tg_shard_writer_commit(w, err);
}

/* Of tg_shard_set_open's allocations, each failed in turn: how many fail it with "out of
 * memory reading it" (the manifest's buffer); -1 when the open fails otherwise. */
static int buffer_allocations(const char *out, tg_err *err) {
    int buffer = 0;
    for (long k = 0; k < 100000; k++) {
        tg_shard_set set;
        memset(err, 0, sizeof *err);
        tg_alloc_fail_only(k);
        const int rc = tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, err);
        const long failed = tg_alloc_fail_after(-1) > k;
        if (rc == 0) {
            tg_shard_set_close(&set);
            return failed ? -1 : buffer;
        }
        buffer += strstr(err->msg, "manifest.json: out of memory reading it") != NULL;
    }
    return -1;
}

TG_TEST(test_shard_reader_manifest_buffer_grows_when_full) {
    char small[700], large[700];
    snprintf(small, sizeof small, "%s/small", tg_test_tmpdir());
    snprintf(large, sizeof large, "%s/large", tg_test_tmpdir());
    char *command = malloc(70001);
    REQUIRE(command, "memory");
    memset(command, 'c', 70000);
    command[70000] = 0;
    tg_err err = {{0}};
    REQUIRE(write_set(small, "x", &err) == 0, "%s", err.msg);
    REQUIRE(write_set(large, command, &err) == 0, "%s", err.msg);
    free(command);
    CHECK(buffer_allocations(small, &err) == 1, "small manifest: %d buffer allocations, want 1 (%s)",
          buffer_allocations(small, &err), err.msg);
    CHECK(buffer_allocations(large, &err) == 2, "large manifest: %d buffer allocations, want 2 (%s)",
          buffer_allocations(large, &err), err.msg);
}
