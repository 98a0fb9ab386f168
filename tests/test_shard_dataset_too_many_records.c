/* A shard set of more records than one dataset holds (datasets/shard_dataset.c): refused
 * after the set opens and before any record is read, naming the set, the count and the
 * limit. Opening checks each shard's checksum, footer and index but decompresses nothing,
 * so the shard here is made by hand: 400 frames of 2 KiB, each indexed as 5,400,000
 * smallest lm records (64,800,004 bytes once decompressed, within the block limit and the
 * largest expansion zstd allows), 2,160,000,000 records in all in a file under 1 MiB. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "datasets/dataset.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_format.h"
#include "datasets/shard_writer.h"
#include "plan/ops.h"
#include "tests/harness.h"

enum { FRAMES = 400, CSIZE = 2048 };
#define PER_FRAME 5400000ull

/* The hand-made shard; its size and checksum. */
static uint8_t *big_shard(size_t *size) {
    const uint64_t index_at = TG_SHARD_HEADER_BYTES + (uint64_t)FRAMES * CSIZE;
    *size = (size_t)index_at + (size_t)FRAMES * TG_SHARD_INDEX_ENTRY_BYTES + TG_SHARD_FOOTER_BYTES;
    uint8_t *b = calloc(1, *size);
    if (!b) return NULL;
    memcpy(b, tg_shard_magic, 8);
    tg_put_le32(b + 8, TG_SHARD_VERSION);
    tg_put_le32(b + 12, TG_SHARD_LM);
    const uint32_t usize = (uint32_t)(4 + PER_FRAME * (tg_shard_record_head(TG_SHARD_LM) + 4));
    for (uint64_t i = 0; i < FRAMES; i++) {
        uint8_t *p = b + index_at + i * TG_SHARD_INDEX_ENTRY_BYTES;
        tg_put_le64(p, TG_SHARD_HEADER_BYTES + i * CSIZE);
        tg_put_le32(p + 8, CSIZE);
        tg_put_le32(p + 12, usize);
        tg_put_le64(p + 16, i * PER_FRAME);
    }
    uint8_t *foot = b + *size - TG_SHARD_FOOTER_BYTES;
    tg_put_le64(foot, index_at);
    tg_put_le64(foot + 8, FRAMES);
    tg_put_le64(foot + 16, FRAMES * PER_FRAME);
    memcpy(foot + 24, tg_shard_footer_magic, 8);
    return b;
}

TG_TEST(test_shard_dataset_more_records_than_a_dataset_holds) {
    char set[700], path[800];
    snprintf(set, sizeof set, "%s/huge", tg_test_tmpdir());
    /* A genuine one-record set, whose manifest and shard are then replaced. */
    const tg_shard_set_desc d = {.task = TG_SHARD_LM, .seq = 4, .tokenizer_identity = 5,
                                 .tokenizer_family = "bpe", .vocab_size = 50};
    tg_shard_writer *w;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(set, &d, &w, &err) == 0, "%s", err.msg);
    int32_t ids[2] = {7, 8};
    const tg_shard_record r = {.len = 2, .input_ids = ids, .label = -1};
    REQUIRE(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &r, &err) == 0, "%s", err.msg);
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);

    size_t size;
    uint8_t *shard = big_shard(&size);
    REQUIRE(shard, "calloc");
    char xxh[17];
    snprintf(xxh, sizeof xxh, "%016llx", (unsigned long long)XXH64(shard, size, 0));
    snprintf(path, sizeof path, "%s/train/00000.tgshard", set);
    FILE *f = fopen(path, "wb");
    const int written = f && fwrite(shard, 1, size, f) == size;
    if (f) fclose(f);
    free(shard);
    REQUIRE(written, "%s", path);

    const long long records = (long long)(FRAMES * PER_FRAME);
    snprintf(path, sizeof path, "%s/manifest.json", set);
    json_t *m = json_load_file(path, 0, NULL);
    REQUIRE(m, "%s", path);
    json_object_set_new(json_object_get(m, "records"), "train", json_integer(records));
    json_object_set_new(json_object_get(m, "tokens"), "train", json_integer(records));
    json_t *hist = json_object_get(json_object_get(m, "length_histogram"), "train");
    for (size_t i = 0; i < json_array_size(hist); i++) json_array_set_new(hist, i, json_integer(i ? 0 : records));
    json_t *entry = json_array_get(json_object_get(m, "shards"), 0);
    json_object_set_new(entry, "records", json_integer(records));
    json_object_set_new(entry, "bytes", json_integer((json_int_t)size));
    json_object_set_new(entry, "xxh64", json_string(xxh));
    const int dumped = json_dump_file(m, path, JSON_INDENT(2)) == 0;
    json_decref(m);
    REQUIRE(dumped, "%s", path);

    const tg_data_rules lm = {TG_TASK_LM, 0, 50, 0, 0, 0};
    tg_dataset ds;
    char want[1000];
    snprintf(want, sizeof want, "%s: %lld train records, more than one dataset holds (%d)", set, records, INT32_MAX);
    memset(&err, 0, sizeof err);
    const int rc = tg_shard_dataset_load(set, &lm, 5, &ds, &err);
    if (rc == 0) tg_dataset_free(&ds);
    CHECK(rc == -1 && !strcmp(err.msg, want), "rc %d '%s'\n    want '%s'", rc, err.msg, want);
}
