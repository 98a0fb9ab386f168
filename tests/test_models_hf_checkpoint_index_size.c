/* The size limit of a checkpoint index (models/hf_checkpoint.c, TG_HF_CHECKPOINT_INDEX_MAX_BYTES):
 * an index of exactly the limit (valid JSON padded with spaces) opens, one byte more is
 * refused with the message that names the index, the limit and what the file was read as,
 * and the checkpoint is left empty. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/hf_checkpoint.h"
#include "tests/harness.h"

/* The index text, then spaces up to `size` bytes. */
static int write_padded(const char *path, const char *text, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const size_t len = strlen(text);
    int ok = len <= size && fwrite(text, 1, len, f) == len;
    static char spaces[1 << 16];
    memset(spaces, ' ', sizeof spaces);
    for (size_t left = size - len; ok && left > 0;) {
        const size_t n = left < sizeof spaces ? left : sizeof spaces;
        ok = fwrite(spaces, 1, n, f) == n;
        left -= n;
    }
    return fclose(f) == 0 && ok ? 0 : -1;
}

TG_TEST(test_models_hf_checkpoint_index_size_limit) {
    const char *dir = tg_test_tmpdir();
    char shard[800], index[800];
    snprintf(shard, sizeof shard, "%s/a.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    static const float one = 1.0f;
    const tg_st_item item = {"x", TG_ST_F32, 0, NULL, &one};
    tg_err err = {{0}};
    REQUIRE(tg_st_write(shard, &item, 1, &err) == 0, "%s", err.msg);
    static const char text[] = "{\"weight_map\": {\"x\": \"a.safetensors\"}}";
    const size_t limit = TG_HF_CHECKPOINT_INDEX_MAX_BYTES;
    REQUIRE(limit == 64u << 20, "limit %zu", limit);

    /* exactly the limit: read whole, parsed, opened */
    REQUIRE(write_padded(index, text, limit) == 0, "index of %zu bytes", limit);
    tg_hf_checkpoint ck;
    CHECK(tg_hf_checkpoint_open(index, &ck, &err) == 0 && ck.sharded == 1 && ck.n_files == 1 && ck.n == 1 &&
              tg_hf_checkpoint_find(&ck, "x") != NULL,
          "an index of %zu bytes: %s", limit, err.msg);
    tg_hf_checkpoint_close(&ck);

    /* one byte past it: refused before any JSON is parsed */
    REQUIRE(write_padded(index, text, limit + 1) == 0, "index of %zu bytes", limit + 1);
    memset(&err, 0, sizeof err);
    const int rc = tg_hf_checkpoint_open(index, &ck, &err);
    char want[1024];
    snprintf(want, sizeof want, "%s: more than 67108864 bytes: too big for a checkpoint index", index);
    CHECK(rc == -1 && !strcmp(err.msg, want), "an index of %zu bytes: rc %d, '%s'\n    want '%s'", limit + 1, rc,
          err.msg, want);
    CHECK(ck.n == 0 && ck.n_files == 0 && ck.files == NULL && ck.tensors == NULL, "a refused index left state behind");
}
