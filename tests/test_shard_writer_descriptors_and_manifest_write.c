/* The shard writer's file descriptors and its manifest write: a commit leaves no descriptor
 * open (the shards, and the folders it syncs, are closed); an abort with a shard of each
 * split open closes both and removes the temporary folder; a shard opened as descriptor 0
 * (standard input closed) is a shard like any other; and a manifest that cannot be written
 * is named as the shard set manifest in the message, with nothing left behind. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "tests/harness.h"

#define SEQ 4
#define VOCAB 50

static tg_shard_set_desc lm_desc(void) {
    return (tg_shard_set_desc){.task = TG_SHARD_LM, .seq = SEQ, .tokenizer_identity = 3,
                               .tokenizer_family = "wordpiece", .vocab_size = VOCAB, .command = "cmd"};
}

static int open_descriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the listing's own */
}

/* Records k = 0 .. n-1 of length 1 + k % SEQ, token t of record k is (k + t) % VOCAB, into
 * the train split (and the eval split for every third). */
static int add_records(tg_shard_writer *w, int n, tg_err *err) {
    for (int k = 0; k < n; k++) {
        int32_t ids[SEQ];
        const int32_t len = 1 + k % SEQ;
        for (int t = 0; t < len; t++) ids[t] = (k + t) % VOCAB;
        tg_shard_record r = {.len = len, .input_ids = ids, .label = -1};
        if (tg_shard_writer_add(w, k % 3 == 2 ? TG_SPLIT_EVAL : TG_SPLIT_TRAIN, &r, err)) return -1;
    }
    return 0;
}

/* Reads the split back and checks every record as add_records wrote it. */
static void check_split(const char *dir, int split, int n) {
    tg_shard_set set;
    tg_err err = {{0}};
    if (!CHECK(tg_shard_set_open(dir, split, &set, &err) == 0, "%s", err.msg)) return;
    tg_shard_cursor cur;
    if (CHECK(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg)) {
        int64_t i = 0;
        for (int k = 0; k < n; k++) {
            if ((k % 3 == 2) != (split == TG_SPLIT_EVAL)) continue;
            tg_shard_record r;
            if (!CHECK(tg_shard_cursor_get(&cur, i, &r, &err) == 0, "record %lld: %s", (long long)i, err.msg)) break;
            CHECK(r.len == 1 + k % SEQ, "record %d: len %d", k, r.len);
            for (int t = 0; t < r.len && t < SEQ; t++)
                CHECK(r.input_ids[t] == (k + t) % VOCAB, "record %d token %d: %d", k, t, r.input_ids[t]);
            i++;
        }
        CHECK(i == set.n_records, "%lld of %lld records", (long long)i, (long long)set.n_records);
        tg_shard_cursor_close(&cur);
    }
    tg_shard_set_close(&set);
}

TG_TEST(test_shard_writer_commit_leaves_no_descriptor_open) {
    char out[700];
    snprintf(out, sizeof out, "%s/set", tg_test_tmpdir());
    const int before = open_descriptors();
    REQUIRE(before > 0, "cannot list /proc/self/fd");
    tg_shard_set_desc d = lm_desc();
    tg_shard_writer *w = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    REQUIRE(add_records(w, 30, &err) == 0, "%s", err.msg);
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    CHECK(open_descriptors() == before, "%d descriptors open after the commit, %d before", open_descriptors(), before);
    check_split(out, TG_SPLIT_TRAIN, 30);
    check_split(out, TG_SPLIT_EVAL, 30);
    CHECK(open_descriptors() == before, "%d descriptors open after reading, %d before", open_descriptors(), before);
}

/* Both splits have a shard open (records went to train and eval); abort closes every one of
 * them, not just the first split's, and removes the temporary folder and leaves no OUTDIR;
 * so does an abort before any record, and abort of no writer does nothing. */
TG_TEST(test_shard_writer_abort_closes_the_shard_of_each_split) {
    char out[700];
    snprintf(out, sizeof out, "%s/set", tg_test_tmpdir());
    const int before = open_descriptors();
    REQUIRE(before > 0, "cannot list /proc/self/fd");
    tg_shard_set_desc d = lm_desc();
    tg_shard_writer *w = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    const int opened = open_descriptors();
    if (add_records(w, 6, &err)) {
        tg_shard_writer_abort(w);
        REQUIRE(0, "add: %s", err.msg);
    }
    /* one shard a split open now */
    CHECK(open_descriptors() == opened + 2, "%d descriptors open with records in both splits, %d before", open_descriptors(),
          opened);
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s", tg_shard_writer_folder(w));
    tg_shard_writer_abort(w);
    CHECK(open_descriptors() == before, "%d descriptors open after the abort, %d before", open_descriptors(), before);
    struct stat st;
    CHECK(stat(tmp, &st) != 0 && errno == ENOENT, "temporary folder %s left behind", tmp);
    CHECK(stat(out, &st) != 0 && errno == ENOENT, "%s made by an aborted writer", out);
    /* a writer with no shard open yet: its temporary folder goes too; no writer at all is nothing to do */
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    snprintf(tmp, sizeof tmp, "%s", tg_shard_writer_folder(w));
    CHECK(stat(tmp, &st) == 0 && S_ISDIR(st.st_mode), "no temporary folder %s", tmp);
    tg_shard_writer_abort(w);
    CHECK(stat(tmp, &st) != 0 && errno == ENOENT, "temporary folder %s left behind", tmp);
    tg_shard_writer_abort(NULL);
    CHECK(open_descriptors() == before, "%d descriptors open at the end, %d before", open_descriptors(), before);
}

/* With standard input closed, the first file the writer opens is descriptor 0. */
TG_TEST(test_shard_writer_shard_on_descriptor_zero) {
    char out[700];
    snprintf(out, sizeof out, "%s/set", tg_test_tmpdir());
    tg_shard_set_desc d = lm_desc();
    tg_shard_writer *w = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    const int saved = dup(0);
    REQUIRE(saved >= 0, "dup: %s", strerror(errno));
    close(0);
    const int rc = add_records(w, 7, &err);
    const int zero_open = fcntl(0, F_GETFD) != -1;
    const int commit = rc == 0 ? tg_shard_writer_commit(w, &err) : (tg_shard_writer_abort(w), -1);
    /* the shard on descriptor 0 was closed at the commit */
    const int zero_after = fcntl(0, F_GETFD) != -1;
    dup2(saved, 0);
    close(saved);
    CHECK(rc == 0, "add: %s", err.msg);
    CHECK(zero_open, "the shard was not opened as descriptor 0");
    CHECK(commit == 0, "commit: %s", err.msg);
    CHECK(!zero_after, "descriptor 0 still open after the commit");
    check_split(out, TG_SPLIT_TRAIN, 7);
    check_split(out, TG_SPLIT_EVAL, 7);
}

/* A folder where the manifest goes: the rename fails, the message names the manifest, the
 * output folder is not made and the temporary folder is removed. */
TG_TEST(test_shard_writer_manifest_that_cannot_be_written) {
    const char *parent = tg_test_tmpdir();
    char out[700], in_way[900];
    snprintf(out, sizeof out, "%s/set", parent);
    tg_shard_set_desc d = lm_desc();
    tg_shard_writer *w = NULL;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    REQUIRE(add_records(w, 5, &err) == 0, "%s", err.msg);
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s", tg_shard_writer_folder(w));
    snprintf(in_way, sizeof in_way, "%s/manifest.json", tmp);
    REQUIRE(mkdir(in_way, 0755) == 0, "mkdir %s", in_way);
    CHECK(tg_shard_writer_commit(w, &err) == -1, "commit with a folder in the manifest's place");
    char want[1200];
    snprintf(want, sizeof want, "%s: cannot write the shard set manifest (rename: %s)", in_way, strerror(EISDIR));
    CHECK(!strcmp(err.msg, want), "'%s', want '%s'", err.msg, want);
    struct stat st;
    CHECK(stat(out, &st) != 0 && stat(tmp, &st) != 0, "a folder left behind");
}
