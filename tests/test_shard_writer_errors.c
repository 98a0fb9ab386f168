/* The shard writer's refusals and failures: set descriptions and records out of range
 * (each with its message), output paths (trailing slashes, relative, missing parents,
 * something else in the way at commit), write errors (a file size limit), shards and frames
 * split by size and read back, and allocation failures, after each of which nothing is
 * left behind. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "tests/harness.h"

#define SEQ 6
#define VOCAB 40

static char *const k_labels[] = {"no", "yes"};

static tg_shard_set_desc desc_of(int task) {
    return (tg_shard_set_desc){.task = task, .seq = SEQ, .doc_stride = task == TG_SHARD_QA ? 2 : 0,
                               .n_labels = task == TG_SHARD_CLASSIFY ? 2 : 0, .labels = k_labels,
                               .tokenizer_identity = 7, .tokenizer_family = "wordpiece", .vocab_size = VOCAB,
                               .command = "cmd"};
}

static int entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

TG_TEST(test_shard_writer_refuses_bad_descriptions) {
    const char *parent = tg_test_tmpdir();
    char out[700], longpath[700];
    snprintf(out, sizeof out, "%s/out", parent);
    memset(longpath, 'a', 600);
    longpath[600] = 0;
    const struct {
        const char *path;
        int task, seq, vocab, n_labels;
        const char *want;
    } cases[] = {
        {"", TG_SHARD_LM, SEQ, VOCAB, 0, "output folder: path is empty or too long"},
        {longpath, TG_SHARD_LM, SEQ, VOCAB, 0, "output folder: path is empty or too long"},
        {out, TG_SHARD_LM, 0, VOCAB, 0, "seq 0 is outside 1 to 4194304"},
        {out, TG_SHARD_LM, TG_SHARD_SEQ_MAX + 1, VOCAB, 0, "seq 4194305 is outside 1 to 4194304"},
        {out, TG_SHARD_LM, SEQ, 0, 0, "the tokenizer's vocabulary is empty"},
        {out, TG_SHARD_CLASSIFY, SEQ, VOCAB, 0, "a classify set has 0 labels"},
        {out, TG_SHARD_QA, SEQ, VOCAB, 2, "a qa set has 2 labels"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_shard_set_desc d = desc_of(cases[i].task);
        d.seq = cases[i].seq;
        d.vocab_size = cases[i].vocab;
        d.n_labels = cases[i].n_labels;
        tg_shard_writer *w = (tg_shard_writer *)1;
        tg_err err = {{0}};
        CHECK(tg_shard_writer_open(cases[i].path, &d, &w, &err) == -1 && w == NULL, "case %zu accepted", i);
        CHECK(!strcmp(err.msg, cases[i].want), "case %zu: '%s', want '%s'", i, err.msg, cases[i].want);
    }
    CHECK(entries(parent) == 0, "%d entries left", entries(parent));

    /* Output paths that cannot be: under a file, under a missing folder. */
    tg_shard_set_desc d = desc_of(TG_SHARD_LM);
    tg_shard_writer *w;
    tg_err err = {{0}};
    char file[700], path[800], want[900];
    snprintf(file, sizeof file, "%s/file.txt", parent);
    REQUIRE(tg_test_write_file(file, "x") == 0, "write");
    snprintf(path, sizeof path, "%s/out", file);
    snprintf(want, sizeof want, "%s: Not a directory", path);
    CHECK(tg_shard_writer_open(path, &d, &w, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    snprintf(path, sizeof path, "%s/missing/out", parent);
    snprintf(want, sizeof want, "%s: cannot create a temporary folder beside it: No such file or directory", path);
    CHECK(tg_shard_writer_open(path, &d, &w, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    /* A folder holding a manifest of something else. */
    snprintf(path, sizeof path, "%s/other", parent);
    mkdir(path, 0755);
    snprintf(file, sizeof file, "%s/manifest.json", path);
    REQUIRE(tg_test_write_file(file, "{\"format\": \"other\"}") == 0, "write");
    snprintf(want, sizeof want, "%s: exists and is not a shard set (it would be replaced; remove it or choose another name)",
             path);
    CHECK(tg_shard_writer_open(path, &d, &w, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    REQUIRE(tg_test_write_file(file, "{\"format\": 1}") == 0, "write");
    CHECK(tg_shard_writer_open(path, &d, &w, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    REQUIRE(tg_test_write_file(file, "{\"format\": ") == 0, "write");
    CHECK(tg_shard_writer_open(path, &d, &w, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    CHECK(entries(parent) == 2, "%d entries: a temporary folder was left", entries(parent));
}

TG_TEST(test_shard_writer_refuses_bad_records) {
    const char *parent = tg_test_tmpdir();
    const int32_t ids[SEQ] = {1, 2, 3, 4, 5, 6}, neg[2] = {1, -1}, big[2] = {VOCAB, 1};
    const int32_t types_neg[3] = {0, -1, 0}, types_big[3] = {0, 1, 256}, types_ok[3] = {0, 1, 255};
    const struct {
        int task, split;
        tg_shard_record r;
        const char *want;
    } cases[] = {
        {TG_SHARD_LM, -1, {.len = 2, .input_ids = ids}, "shard writer: no split -1"},
        {TG_SHARD_LM, 2, {.len = 2, .input_ids = ids}, "shard writer: no split 2"},
        {TG_SHARD_LM, 0, {.len = 0, .input_ids = ids}, "shard writer: record 1 of the train split has 0 tokens, outside 1 to seq 6"},
        {TG_SHARD_LM, 1, {.len = 7, .input_ids = ids}, "shard writer: record 0 of the eval split has 7 tokens, outside 1 to seq 6"},
        {TG_SHARD_LM, 0, {.len = 2, .input_ids = neg}, "record 1 of the train split: input_ids[1] = -1 is outside the vocabulary (40)"},
        {TG_SHARD_LM, 0, {.len = 2, .input_ids = big}, "record 1 of the train split: input_ids[0] = 40 is outside the vocabulary (40)"},
        {TG_SHARD_LM, 0, {.len = 3, .input_ids = ids, .token_type_ids = types_neg}, "token_types_ids"},
        {TG_SHARD_LM, 0, {.len = 3, .input_ids = ids, .token_type_ids = types_big}, "token_type_ids[2] = 256 is outside 0 to 255"},
        {TG_SHARD_CLASSIFY, 0, {.len = 2, .input_ids = ids, .label = -1}, "record 1 of the train split: label -1 is outside 0 to 1"},
        {TG_SHARD_CLASSIFY, 0, {.len = 2, .input_ids = ids, .label = 2}, "record 1 of the train split: label 2 is outside 0 to 1"},
        {TG_SHARD_QA, 0, {.len = 3, .input_ids = ids, .start = -1, .end = 1}, "answer tokens -1 to 1 are outside the record's 3 tokens"},
        {TG_SHARD_QA, 0, {.len = 3, .input_ids = ids, .start = 2, .end = 1}, "answer tokens 2 to 1 are outside the record's 3 tokens"},
        {TG_SHARD_QA, 0, {.len = 3, .input_ids = ids, .start = 1, .end = 3}, "answer tokens 1 to 3 are outside the record's 3 tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[700];
        snprintf(out, sizeof out, "%s/out%zu", parent, i);
        tg_shard_set_desc d = desc_of(cases[i].task);
        tg_shard_writer *w;
        tg_err err = {{0}};
        REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
        /* One good record first, so the record number counts it. */
        tg_shard_record good = {.len = 3, .input_ids = ids, .token_type_ids = types_ok, .label = 1, .start = 0, .end = 2};
        REQUIRE(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &good, &err) == 0, "%s", err.msg);
        CHECK(tg_shard_writer_add(w, cases[i].split, &cases[i].r, &err) == -1, "case %zu accepted", i);
        const char *want = cases[i].want;
        if (!strcmp(want, "token_types_ids")) want = "record 1 of the train split: token_type_ids[1] = -1 is outside 0 to 255";
        CHECK(strstr(err.msg, want) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, want);
        CHECK(tg_shard_writer_count(w, TG_SPLIT_TRAIN) == 1 && tg_shard_writer_count(w, TG_SPLIT_EVAL) == 0,
              "case %zu: the refused record was counted", i);
        tg_shard_writer_abort(w);
    }
    CHECK(entries(parent) == 0, "%d entries left", entries(parent));
    tg_shard_writer_abort(NULL);
}

/* Writes n records of lengths 1..SEQ (ids (i + t) % VOCAB) into split 0, others into
 * split 1 when eval; returns the commit's rc. */
static int write_records(const char *out, int task, int64_t n, int64_t n_eval, int64_t frame_bytes, int64_t shard_bytes,
                         tg_err *err) {
    tg_shard_set_desc d = desc_of(task);
    d.frame_bytes = frame_bytes;
    d.shard_bytes = shard_bytes;
    tg_shard_writer *w;
    if (tg_shard_writer_open(out, &d, &w, err)) return -1;
    for (int64_t i = 0; i < n + n_eval; i++) {
        int32_t ids[SEQ], types[SEQ];
        int32_t len = 1 + (int32_t)(i % SEQ);
        for (int32_t t = 0; t < len; t++) ids[t] = (int32_t)((i + t) % VOCAB), types[t] = t & 1;
        tg_shard_record r = {.len = len, .input_ids = ids, .token_type_ids = i % 2 ? types : NULL, .label = (int32_t)(i % 2),
                             .start = 0, .end = len - 1};
        if (tg_shard_writer_add(w, i < n ? TG_SPLIT_TRAIN : TG_SPLIT_EVAL, &r, err)) {
            tg_shard_writer_abort(w);
            return -1;
        }
    }
    if (tg_shard_writer_count(w, -1) != 0 || tg_shard_writer_count(w, 2) != 0 ||
        tg_shard_writer_count(w, TG_SPLIT_TRAIN) != n || tg_shard_writer_count(w, TG_SPLIT_EVAL) != n_eval) {
        tg_shard_writer_abort(w);
        return tg_fail(err, "tg_shard_writer_count disagrees");
    }
    return tg_shard_writer_commit(w, err);
}

/* Reads every record of a split back and checks it against write_records. */
static int check_split(const char *out, int split, int64_t first, int64_t n, int task, int32_t *files, int32_t *frames) {
    tg_err err = {{0}};
    tg_shard_set set;
    if (!CHECK(tg_shard_set_open(out, split, &set, &err) == 0, "%s", err.msg)) return 0;
    *files = set.n_files;
    *frames = 0;
    for (int32_t f = 0; f < set.n_files; f++) *frames += set.files[f].n_frames;
    tg_shard_cursor cur;
    int ok = CHECK(set.n_records == n, "%lld records, want %lld", (long long)set.n_records, (long long)n);
    if (!CHECK(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg)) ok = 0, n = 0;
    for (int64_t k = 0; ok && k < n; k++) {
        int64_t i = first + k;
        tg_shard_record r;
        ok = tg_shard_cursor_get(&cur, k, &r, &err) == 0 && r.len == 1 + (int32_t)(i % SEQ) &&
             (i % 2 ? r.token_type_ids != NULL : r.token_type_ids == NULL) &&
             (task != TG_SHARD_CLASSIFY || r.label == (int32_t)(i % 2)) && (task != TG_SHARD_QA || r.end == r.len - 1);
        for (int32_t t = 0; ok && t < r.len; t++)
            ok = r.input_ids[t] == (int32_t)((i + t) % VOCAB) && (!r.token_type_ids || r.token_type_ids[t] == (t & 1));
        CHECK(ok, "%s record %lld differs (%s)", tg_shard_split_name(split), (long long)k, err.msg);
    }
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    return ok;
}

TG_TEST(test_shard_writer_frames_shards_and_paths) {
    const char *parent = tg_test_tmpdir();
    char out[700];
    tg_err err = {{0}};
    int32_t files, frames;
    /* Small frames and shards: many of each, every record back as written. */
    snprintf(out, sizeof out, "%s/small///", parent);
    REQUIRE(write_records(out, TG_SHARD_QA, 50, 9, 40, 120, &err) == 0, "%s", err.msg);
    REQUIRE(check_split(out, TG_SPLIT_TRAIN, 0, 50, TG_SHARD_QA, &files, &frames), "train");
    CHECK(files > 3 && frames > files, "%d files, %d frames", files, frames);
    REQUIRE(check_split(out, TG_SPLIT_EVAL, 50, 9, TG_SHARD_QA, &files, &frames), "eval");
    CHECK(files >= 1, "%d eval files", files);
    snprintf(out, sizeof out, "%s/small", parent);
    struct stat st;
    CHECK(stat(out, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0755, "mode %o", st.st_mode & 0777);
    /* A frame size past the limit is held to half a block: one frame, one shard. */
    snprintf(out, sizeof out, "%s/huge", parent);
    REQUIRE(write_records(out, TG_SHARD_CLASSIFY, 30, 0, (int64_t)1 << 40, 0, &err) == 0, "%s", err.msg);
    REQUIRE(check_split(out, TG_SPLIT_TRAIN, 0, 30, TG_SHARD_CLASSIFY, &files, &frames), "huge");
    CHECK(files == 1 && frames == 1, "%d files, %d frames", files, frames);
    /* Eval records only. */
    snprintf(out, sizeof out, "%s/evalonly", parent);
    REQUIRE(write_records(out, TG_SHARD_LM, 0, 4, 0, 0, &err) == 0, "%s", err.msg);
    REQUIRE(check_split(out, TG_SPLIT_EVAL, 0, 4, TG_SHARD_LM, &files, &frames), "eval only");
    REQUIRE(check_split(out, TG_SPLIT_TRAIN, 0, 0, TG_SHARD_LM, &files, &frames), "no train");
    CHECK(files == 0, "%d train files", files);
    /* No records at all: refused, nothing left. */
    snprintf(out, sizeof out, "%s/empty", parent);
    char want[800];
    snprintf(want, sizeof want, "%s: no records to write", out);
    CHECK(write_records(out, TG_SHARD_LM, 0, 0, 0, 0, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    CHECK(stat(out, &st) != 0, "an empty set was left");
    /* A relative OUTDIR: the temporary folder beside it in the working folder. */
    char cwd[700];
    REQUIRE(getcwd(cwd, sizeof cwd) && chdir(parent) == 0, "chdir");
    int rc = write_records("relative", TG_SHARD_LM, 3, 0, 0, 0, &err);
    int back = chdir(cwd);
    REQUIRE(back == 0 && rc == 0, "relative: %s", err.msg);
    snprintf(out, sizeof out, "%s/relative", parent);
    REQUIRE(check_split(out, TG_SPLIT_TRAIN, 0, 3, TG_SHARD_LM, &files, &frames), "relative");
    /* An empty folder at OUTDIR is taken. */
    snprintf(out, sizeof out, "%s/emptydir", parent);
    mkdir(out, 0755);
    REQUIRE(write_records(out, TG_SHARD_LM, 2, 0, 0, 0, &err) == 0, "%s", err.msg);
    REQUIRE(check_split(out, TG_SPLIT_TRAIN, 0, 2, TG_SHARD_LM, &files, &frames), "into an empty folder");
    CHECK(entries(parent) == 5, "%d entries in the parent (temporary folders left?)", entries(parent));
    /* Not written back (a non-UTF-8 label name): the manifest fails, nothing is left. */
    tg_shard_set_desc d = desc_of(TG_SHARD_CLASSIFY);
    char *bad_labels[] = {"no", "y\xffs"};
    d.labels = bad_labels;
    tg_shard_writer *w;
    snprintf(out, sizeof out, "%s/badlabel", parent);
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    const int32_t ids[2] = {1, 2};
    REQUIRE(tg_shard_writer_add(w, 0, &(tg_shard_record){.len = 2, .input_ids = ids, .label = 1}, &err) == 0, "%s", err.msg);
    CHECK(tg_shard_writer_commit(w, &err) == -1 && strstr(err.msg, "is not UTF-8"), "'%s'", err.msg);
    CHECK(entries(parent) == 5, "%d entries after a failed commit", entries(parent));
    /* No family and no command: written as "". */
    d = desc_of(TG_SHARD_LM);
    d.tokenizer_family = NULL;
    d.command = NULL;
    snprintf(out, sizeof out, "%s/bare", parent);
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    REQUIRE(tg_shard_writer_add(w, 0, &(tg_shard_record){.len = 2, .input_ids = ids}, &err) == 0, "%s", err.msg);
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    char mpath[800];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", out);
    long len;
    char *text = tg_test_read_file(mpath, &len);
    CHECK(text && strstr(text, "\"family\": \"\"") && strstr(text, "\"command\": \"\""), "%s", text ? text : "(none)");
    free(text);
}

TG_TEST(test_shard_writer_outdir_taken_before_commit) {
    const char *parent = tg_test_tmpdir();
    char out[700], want[900];
    snprintf(out, sizeof out, "%s/out", parent);
    tg_shard_set_desc d = desc_of(TG_SHARD_LM);
    tg_shard_writer *w;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    const int32_t ids[2] = {1, 2};
    REQUIRE(tg_shard_writer_add(w, 0, &(tg_shard_record){.len = 2, .input_ids = ids}, &err) == 0, "%s", err.msg);
    REQUIRE(tg_test_write_file(out, "someone else's") == 0, "write");
    snprintf(want, sizeof want, "%s: exists and is not a folder (the output is a new folder; choose another name)", out);
    CHECK(tg_shard_writer_commit(w, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    CHECK(entries(parent) == 1, "%d entries: the temporary folder was left", entries(parent));
    long len;
    char *text = tg_test_read_file(out, &len);
    CHECK(text && !strcmp(text, "someone else's"), "the file was touched");
    free(text);

    /* The temporary folder removed under the writer: the split's folder cannot be made. */
    snprintf(out, sizeof out, "%s/gone", parent);
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    DIR *dir = opendir(parent);
    struct dirent *e;
    char tmp[800] = "";
    while ((e = readdir(dir)))
        if (!strncmp(e->d_name, ".gone.tmp-", 10)) snprintf(tmp, sizeof tmp, "%s/%s", parent, e->d_name);
    closedir(dir);
    REQUIRE(tmp[0] && rmdir(tmp) == 0, "temporary folder '%s'", tmp);
    snprintf(want, sizeof want, "%s/train: cannot create: No such file or directory", tmp);
    CHECK(tg_shard_writer_add(w, 0, &(tg_shard_record){.len = 2, .input_ids = ids}, &err) == -1 && !strcmp(err.msg, want),
          "'%s'", err.msg);
    tg_shard_writer_abort(w);
    /* The next shard's file is taken when the first shard ends (1-byte frames and shards). */
    snprintf(out, sizeof out, "%s/taken", parent);
    d.frame_bytes = 1;
    d.shard_bytes = 1;
    REQUIRE(tg_shard_writer_open(out, &d, &w, &err) == 0, "%s", err.msg);
    REQUIRE(tg_shard_writer_add(w, 0, &(tg_shard_record){.len = 2, .input_ids = ids}, &err) == 0, "%s", err.msg);
    dir = opendir(parent);
    tmp[0] = 0;
    while ((e = readdir(dir)))
        if (!strncmp(e->d_name, ".taken.tmp-", 11)) snprintf(tmp, sizeof tmp, "%s/%s", parent, e->d_name);
    closedir(dir);
    char shard[900];
    snprintf(shard, sizeof shard, "%s/train/00001.tgshard", tmp);
    REQUIRE(tg_test_write_file(shard, "x") == 0, "write");
    snprintf(want, sizeof want, "%s: cannot create: File exists", shard);
    CHECK(tg_shard_writer_add(w, 0, &(tg_shard_record){.len = 2, .input_ids = ids}, &err) == -1 && !strcmp(err.msg, want),
          "'%s'", err.msg);
    tg_shard_writer_abort(w);
    CHECK(entries(parent) == 1, "%d entries after the aborts", entries(parent));
}

/* Writes under a file size limit: write() fails with EFBIG (SIGXFSZ ignored). */
TG_TEST(test_shard_writer_write_errors) {
    const char *parent = tg_test_tmpdir();
    char out[700];
    struct rlimit old;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0, "getrlimit");
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    const struct {
        int64_t n, frame_bytes, shard_bytes;
        rlim_t limit;
        const char *want;
    } cases[] = {
        {1, 0, 0, 10, "/train/00000.tgshard: cannot write: File too large"},        /* the header */
        {200, 64, 0, 200, "/train/00000.tgshard: cannot write: File too large"},    /* a frame */
        {2, 0, 0, 20, "/train/00000.tgshard: cannot write: File too large"},        /* the frame, at commit */
        {2, 0, 0, 0, "/train/00000.tgshard: cannot write: File too large"},         /* the index, at commit */
        {40, 64, 64, 0, "/train/00000.tgshard: cannot write: File too large"},      /* the index, ending a shard */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_err err = {{0}};
        rlim_t limit = cases[i].limit;
        if (!limit) { /* one byte short of the first shard: its frames fit, its index does not */
            snprintf(out, sizeof out, "%s/dry", parent);
            REQUIRE(write_records(out, TG_SHARD_LM, cases[i].n, 0, cases[i].frame_bytes, cases[i].shard_bytes, &err) == 0,
                    "%s", err.msg);
            char shard[800];
            snprintf(shard, sizeof shard, "%s/train/00000.tgshard", out);
            struct stat st;
            REQUIRE(stat(shard, &st) == 0, "stat");
            limit = (rlim_t)st.st_size - 1;
            REQUIRE(tg_shard_remove_tree(out) == 0, "remove");
        }
        snprintf(out, sizeof out, "%s/out%zu", parent, i);
        struct rlimit lim = {limit, old.rlim_max};
        REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
        int rc = write_records(out, TG_SHARD_LM, cases[i].n, 0, cases[i].frame_bytes, cases[i].shard_bytes, &err);
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(rc == -1 && strstr(err.msg, cases[i].want), "case %zu: rc %d '%s'", i, rc, err.msg);
        CHECK(!strncmp(err.msg, parent, strlen(parent)), "case %zu: '%s' does not name the file", i, err.msg);
    }
    signal(SIGXFSZ, old_handler);
    CHECK(entries(parent) == 0, "%d entries left", entries(parent));
}

/* A frame per record (so one shard's index outgrows the block buffer), both splits. */
static int write_for_faults(const char *out, tg_err *err) {
    return write_records(out, TG_SHARD_CLASSIFY, 8, 1, 1, 0, err);
}

TG_TEST(test_shard_writer_out_of_memory) {
    const char *parent = tg_test_tmpdir();
    char out[700];
    snprintf(out, sizeof out, "%s/out", parent);
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(write_for_faults(out, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 20, "%ld allocations", total);
    REQUIRE(tg_shard_remove_tree(out) == 0, "remove");
    long clean = 0;
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        int rc = write_for_faults(out, &err);
        tg_alloc_fail_after(-1);
        /* The manifest's atomic write reports its own failure as ENOMEM's "Cannot allocate memory". */
        int ok = rc == -1 && (strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory")) &&
                 entries(parent) == 0;
        clean += ok;
        CHECK(ok, "allocation %ld of %ld: rc %d '%s', %d entries", k, total, rc, err.msg, entries(parent));
        if (rc == 0) tg_shard_remove_tree(out);
    }
    CHECK(clean == total, "%ld of %ld clean", clean, total);
}
