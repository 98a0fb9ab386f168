/* The shard writer at its limits: an output folder path of 511 bytes (the longest taken; 512
 * is refused) whose set, split folders and shards are written and read back; and a frame
 * size asked beyond half the largest block a reader takes (64 MiB), which is held to 32 MiB:
 * 9 records of 4 MiB make two frames (7 and 2 records), not one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "tests/harness.h"

#define VOCAB 30

static tg_shard_set_desc lm_desc(int seq) {
    return (tg_shard_set_desc){.task = TG_SHARD_LM, .seq = seq, .tokenizer_identity = 1, .tokenizer_family = "bpe",
                               .vocab_size = VOCAB, .command = "cmd"};
}

/* A path of exactly `len` bytes under the test folder, its parents made (names of at most
 * 200 bytes); the last component is not made. */
static int long_path(char *out, size_t len) {
    const char *base = tg_test_tmpdir();
    size_t n = (size_t)snprintf(out, 1024, "%s", base);
    while (n < len) {
        size_t room = len - n - 1; /* after the slash */
        size_t part = room > 200 ? 200 : room;
        if (room > 200 && room - 200 < 2) part = room - 2; /* leave at least 1 byte for the last name */
        out[n++] = '/';
        memset(out + n, 'd', part);
        n += part;
        out[n] = 0;
        if (n < len && mkdir(out, 0755) != 0) return -1;
    }
    return n == len ? 0 : -1;
}

TG_TEST(test_shard_writer_output_path_of_511_bytes) {
    char out[1024];
    REQUIRE(long_path(out, 511) == 0 && strlen(out) == 511, "cannot make a 511-byte path: %s", strerror(errno));
    tg_shard_set_desc d = lm_desc(4);
    tg_shard_writer *w = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    for (int k = 0; k < 6; k++) {
        int32_t ids[4] = {k, k + 1, k + 2, k + 3};
        tg_shard_record r = {.len = 1 + k % 4, .input_ids = ids, .label = -1};
        REQUIRE(tg_shard_writer_add(w, k % 2 ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN, &r, &err) == 0, "%s", err.msg);
    }
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    for (int s = 0; s < TG_SPLIT_COUNT; s++) {
        tg_shard_set set;
        if (!CHECK(tg_shard_set_open(out, s, &set, &err) == 0, "%s", err.msg)) continue;
        tg_shard_cursor cur;
        CHECK(set.n_records == 3 && set.n_files == 1, "split %d: %lld records in %d files", s, (long long)set.n_records,
              set.n_files);
        if (CHECK(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg)) {
            for (int i = 0; i < 3; i++) {
                const int k = 2 * i + s;
                tg_shard_record r;
                CHECK(tg_shard_cursor_get(&cur, i, &r, &err) == 0 && r.len == 1 + k % 4 && r.input_ids[0] == k,
                      "split %d record %d: %s", s, i, err.msg);
            }
            tg_shard_cursor_close(&cur);
        }
        tg_shard_set_close(&set);
    }
    /* one byte more is refused, with nothing made */
    strcat(out, "x");
    CHECK(tg_shard_writer_open(out, &d, &w, &err) == -1 && w == NULL &&
              !strcmp(err.msg, "output folder: path is empty or too long"),
          "'%s'", err.msg);
}

TG_TEST(test_shard_writer_frame_size_held_to_32_mib) {
    enum { LEN = 1 << 20, N = 9 };
    char out[700];
    snprintf(out, sizeof out, "%s/big", tg_test_tmpdir());
    tg_shard_set_desc d = lm_desc(LEN);
    d.frame_bytes = INT64_MAX;
    tg_shard_writer *w = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    int32_t *ids = malloc((size_t)LEN * sizeof *ids);
    REQUIRE(ids, "malloc");
    for (int k = 0; k < N; k++) {
        for (int t = 0; t < LEN; t++) ids[t] = (k + t / 4096) % VOCAB;
        tg_shard_record r = {.len = LEN, .input_ids = ids, .label = -1};
        REQUIRE(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &r, &err) == 0, "%s", err.msg);
    }
    free(ids);
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(out, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    REQUIRE(set.n_files == 1, "%d files", set.n_files);
    const tg_shard_file *f = &set.files[0];
    CHECK(f->n_frames == 2, "%d frames", f->n_frames);
    if (f->n_frames == 2) {
        /* a record is 8 + 4 MiB bytes: 7 fit in 32 MiB, the 8th would not */
        CHECK(f->frames[0].count == 7 && f->frames[1].first == 7 && f->frames[1].count == 2, "frames of %lld and %lld",
              (long long)f->frames[0].count, (long long)f->frames[1].count);
        CHECK(f->frames[0].usize == 4 + 7 * 4 + 7 * (8 + 4u * LEN), "frame 0: %u bytes", f->frames[0].usize);
    }
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    tg_shard_record r;
    CHECK(tg_shard_cursor_get(&cur, 8, &r, &err) == 0 && r.len == LEN && r.input_ids[0] == 8 % VOCAB &&
              r.input_ids[LEN - 1] == (8 + (LEN - 1) / 4096) % VOCAB,
          "record 8: %s", err.msg);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
}
