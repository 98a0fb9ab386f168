/* Each allocation of a sharded checkpoint's open (models/hf_checkpoint.c) failed in turn,
 * alone and with every later one, and the exact message of each: reading the index
 * ("<index>: out of memory"), parsing its JSON ("<index>: out of memory parsing the index"),
 * the shard map and the file table ("<index>: out of memory"), each shard's open (its own
 * message, after "<index>: shard '<file>' of tensor '<first tensor>'"), the shard ids and
 * the tensor table ("<index>: out of memory"). Nothing is left open. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json_strict.h"
#include "models/hf_checkpoint.h"
#include "tests/harness.h"

static int write_shard(const char *path, const char *a, const char *b) {
    static const float one = 1.0f;
    const tg_st_item items[] = {{a, TG_ST_F32, 0, NULL, &one}, {b, TG_ST_F32, 0, NULL, &one}};
    tg_err err;
    return tg_st_write(path, items, b ? 2 : 1, &err);
}

/* Whether msg is one of the messages an allocation failure in the open may give. */
static int known_message(const char *msg, const char *index, const char *dir) {
    char want[4][1200];
    snprintf(want[0], sizeof want[0], "%s: out of memory", index);
    snprintf(want[1], sizeof want[1], "%s: out of memory parsing the index", index);
    static const char *const shards[][2] = {{"a.safetensors", "x"}, {"b.safetensors", "z"}};
    for (int s = 0; s < 2; s++) {
        snprintf(want[2], sizeof want[2], "%s: shard '%s' of tensor '%s': %s/%s: out of memory", index, shards[s][0],
                 shards[s][1], dir, shards[s][0]);
        snprintf(want[3], sizeof want[3], "%s: shard '%s' of tensor '%s': %s/%s: out of memory parsing the header",
                 index, shards[s][0], shards[s][1], dir, shards[s][0]);
        if (!strcmp(msg, want[2]) || !strcmp(msg, want[3])) return 1;
    }
    return !strcmp(msg, want[0]) || !strcmp(msg, want[1]);
}

TG_TEST(test_models_hf_checkpoint_index_each_allocation) {
    const char *dir = tg_test_tmpdir();
    char a[800], b[800], index[800];
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    static const char text[] = "{\"metadata\": {\"total_size\": 12}, \"weight_map\": {\"x\": \"a.safetensors\", "
                               "\"z\": \"b.safetensors\", \"y\": \"a.safetensors\"}}";
    REQUIRE(write_shard(a, "x", "y") == 0 && write_shard(b, "z", NULL) == 0 && tg_test_write_file(index, text) == 0,
            "files");

    /* the allocations of the index's JSON alone */
    json_error_t jerr;
    char dup[64];
    tg_alloc_fail_after(-1);
    json_t *root = tg_json_loadb_strict(text, strlen(text), 0, &jerr, dup, sizeof dup);
    const long parse = tg_alloc_fail_after(-1);
    REQUIRE(root && parse > 0, "the index's JSON: %s", jerr.text);
    json_decref(root);

    tg_hf_checkpoint ck;
    tg_err err = {{0}};
    REQUIRE(tg_hf_checkpoint_open(index, &ck, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    CHECK(ck.n == 3 && ck.n_files == 2, "%d tensors in %d files", ck.n, ck.n_files);
    tg_hf_checkpoint_close(&ck);
    REQUIRE(total > parse + 3, "%ld allocations in all, %ld parsing", total, parse);

    char plain[1000], parsing[1000];
    snprintf(plain, sizeof plain, "%s: out of memory", index);
    snprintf(parsing, sizeof parsing, "%s: out of memory parsing the index", index);
    for (int only = 0; only < 2; only++)
        for (long k = 0; k < total; k++) {
            memset(&err, 0, sizeof err);
            if (only) tg_alloc_fail_only(k);
            else tg_alloc_fail_after(k);
            const int rc = tg_hf_checkpoint_open(index, &ck, &err);
            tg_alloc_fail_after(-1);
            /* the read's one buffer, the parse, then the shard map and the file table */
            const char *want = k == 0 || k == parse + 1 || k == parse + 2 ? plain : k <= parse ? parsing : NULL;
            if (want)
                CHECK(rc == -1 && !strcmp(err.msg, want), "allocation %ld of %ld failing%s: rc %d, '%s'\n    want '%s'",
                      k, total, only ? " alone" : "", rc, err.msg, want);
            else
                CHECK(rc == -1 && known_message(err.msg, index, dir), "allocation %ld of %ld failing%s: rc %d, '%s'",
                      k, total, only ? " alone" : "", rc, err.msg);
            CHECK(ck.n == 0 && ck.n_files == 0 && ck.files == NULL && ck.tensors == NULL,
                  "allocation %ld failing: state left behind", k);
        }
    /* the last allocation is the tensor table's */
    memset(&err, 0, sizeof err);
    tg_alloc_fail_only(total - 1);
    CHECK(tg_hf_checkpoint_open(index, &ck, &err) == -1 && !strcmp(err.msg, plain), "the last allocation: '%s'",
          err.msg);
    tg_alloc_fail_after(-1);
}
