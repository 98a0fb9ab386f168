/* libFuzzer target: sharded checkpoint indexes (tg_hf_checkpoint_open) over two fixed shards
 * in a temporary folder, s1.safetensors holding 'a' and 'b' and s2.safetensors holding
 * 'c'. An index that opens must give every tensor once, sorted by name, each found by name
 * in a shard the index named; one that fails must say why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/hf_checkpoint.h"
#include "tests/fuzz/fuzz_input.h"

static char dir[64] = "/tmp/tunegraph-fuzz-hf-index.XXXXXX";
static char index_path[128];

static void remove_folder(void) {
    static const char *const names[] = {"s1.safetensors", "s2.safetensors", "model.safetensors.index.json"};
    char path[160];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static void make_shards(void) {
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        abort();
    }
    atexit(remove_folder);
    static const float v[2] = {1, 2};
    static const int64_t shape[] = {2};
    const tg_st_item one[] = {{"a", TG_ST_F32, 1, shape, v}, {"b", TG_ST_F32, 1, shape, v}};
    const tg_st_item two[] = {{"c", TG_ST_F32, 1, shape, v}};
    char path[160];
    tg_err err;
    snprintf(path, sizeof path, "%s/s1.safetensors", dir);
    if (tg_st_write(path, one, 2, &err)) abort();
    snprintf(path, sizeof path, "%s/s2.safetensors", dir);
    if (tg_st_write(path, two, 1, &err)) abort();
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!index_path[0]) make_shards();
    FILE *f = fopen(index_path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();
    tg_hf_checkpoint ck;
    tg_err err;
    if (tg_hf_checkpoint_open(index_path, &ck, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return 0;
    }
    FUZZ_ASSERT(ck.sharded && ck.n_files >= 1 && ck.n_files <= 2 && ck.n >= 1 && ck.n <= 3, "%d files, %d tensors",
                ck.n_files, ck.n);
    for (int k = 0; k < ck.n; k++) {
        const tg_hf_checkpoint_tensor *t = &ck.tensors[k];
        FUZZ_ASSERT(t->file >= 0 && t->file < ck.n_files, "'%s' in file %d", t->entry->name, t->file);
        FUZZ_ASSERT(tg_hf_checkpoint_find(&ck, t->entry->name) == t, "'%s' not found by name", t->entry->name);
        FUZZ_ASSERT(k == 0 || strcmp(ck.tensors[k - 1].entry->name, t->entry->name) < 0, "'%s' out of order",
                    t->entry->name);
    }
    tg_hf_checkpoint_close(&ck);
    return 0;
}
