/* models/safetensors.c's writer with each of its allocations failing alone (the later ones
 * succeeding again): the write is refused for want of memory and leaves no file, never a
 * file whose header lost bytes; with none failing, the file reads back as written. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "models/safetensors.h"
#include "tests/harness.h"

TG_TEST(test_models_safetensors_write_each_allocation_failing_alone) {
    const float values[6] = {1, 2, 3, 4, 5, 6};
    const int64_t matrix[2] = {2, 3}, vector[1] = {6};
    const tg_st_item items[2] = {{"weight.a", TG_ST_F32, 2, matrix, values}, {"bias.bb", TG_ST_F32, 1, vector, values}};
    const char *const meta[2] = {"format", "pt"};
    char path[600];
    snprintf(path, sizeof path, "%s/w.safetensors", tg_test_tmpdir());
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(tg_st_write_with_metadata(path, items, 2, meta, 1, &err) == 0, "write: %s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 10, "%ld allocations", total);
    tg_safetensors f;
    REQUIRE(tg_st_open(path, &f, &err) == 0, "read back: %s", err.msg);
    CHECK(f.n == 2, "%d tensors", f.n);
    tg_st_close(&f);
    for (long k = 0; k < total; k++) {
        REQUIRE(unlink(path) == 0 || k > 0, "unlink");
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_st_write_with_metadata(path, items, 2, meta, 1, &err);
        tg_alloc_fail_after(-1);
        /* (the atomic file's own allocation failing is said with ENOMEM's text) */
        CHECK(rc == -1 && (strstr(err.msg, "out of memory") || strstr(err.msg, strerror(ENOMEM))) &&
                  access(path, F_OK) != 0,
              "allocation %ld of %ld failing alone: rc %d, '%s'%s", k, total, rc, err.msg,
              access(path, F_OK) == 0 ? ", a file written" : "");
        if (rc == 0) unlink(path);
    }
}
