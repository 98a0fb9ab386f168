/* Shard sets: the writer and the reader by record number, tg_dataset_load on a set and
 * its splits, and damaged or mismatched sets refused with the file, record and field. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "datasets/dataset.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_manifest.h"
#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "plan/ops.h"
#include "tests/harness.h"

#define VOCAB 300
#define SEQ 40

static char *const k_labels[] = {"alpha", "beta", "gamma"};

/* Record i of a split, the same every time: lengths 1..SEQ, ids below VOCAB, token types
 * on every third record, labels cycling. */
static void make_record(int split, int64_t i, int task, int32_t *ids, int32_t *types, tg_shard_record *r) {
    int32_t len = 1 + (int32_t)((i * 7 + split * 3) % SEQ);
    for (int32_t t = 0; t < len; t++) {
        ids[t] = (int32_t)((i * 31 + t * 17 + split) % VOCAB);
        types[t] = t >= len / 2;
    }
    *r = (tg_shard_record){.len = len, .input_ids = ids, .token_type_ids = i % 3 == 0 ? types : NULL,
                           .label = (int32_t)(i % 3)};
    if (task == TG_SHARD_QA) {
        r->start = len / 3;
        r->end = len / 2;
    }
}

static int write_set(const char *outdir, int task, int64_t n_train, int64_t n_eval, int64_t frame_bytes,
                     int64_t shard_bytes, tg_err *err) {
    tg_shard_set_desc d = {.task = task, .seq = SEQ, .doc_stride = task == TG_SHARD_QA ? 8 : 0,
                           .n_labels = task == TG_SHARD_CLASSIFY ? 3 : 0, .labels = k_labels,
                           .tokenizer_identity = 0xfeedfacecafebeefull, .tokenizer_family = "wordpiece",
                           .vocab_size = VOCAB, .command = "tunegraph data convert test", .frame_bytes = frame_bytes,
                           .shard_bytes = shard_bytes};
    tg_shard_writer *w;
    if (tg_shard_writer_open(outdir, &d, &w, err)) return -1;
    int32_t ids[SEQ], types[SEQ];
    for (int64_t i = 0; i < n_train + n_eval; i++) {
        int split = i < n_train ? TG_SPLIT_TRAIN : TG_SPLIT_EVAL;
        int64_t k = split ? i - n_train : i;
        tg_shard_record r;
        make_record(split, k, task, ids, types, &r);
        if (tg_shard_writer_add(w, split, &r, err)) {
            tg_shard_writer_abort(w);
            return -1;
        }
    }
    return tg_shard_writer_commit(w, err);
}

static int same_record(const tg_shard_record *a, const tg_shard_record *b, int task) {
    if (a->len != b->len || memcmp(a->input_ids, b->input_ids, (size_t)a->len * sizeof *a->input_ids)) return 0;
    if (!a->token_type_ids != !b->token_type_ids) return 0;
    if (a->token_type_ids && memcmp(a->token_type_ids, b->token_type_ids, (size_t)a->len * sizeof(int32_t))) return 0;
    if (task == TG_SHARD_CLASSIFY && a->label != b->label) return 0;
    return task != TG_SHARD_QA || (a->start == b->start && a->end == b->end);
}

static const char *set_dir(const char *name) {
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", tg_test_tmpdir(), name);
    return path;
}

TG_TEST(test_shards_round_trip_by_record_number) {
    tg_err err = {{0}};
    char dir[600];
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    /* Small frames and shards: many of each. */
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 500, 77, 512, 4096, &err) == 0, "%s", err.msg);
    for (int split = 0; split < TG_SPLIT_COUNT; split++) {
        tg_shard_set set;
        REQUIRE(tg_shard_set_open(dir, split, &set, &err) == 0, "%s", err.msg);
        const int64_t n = split ? 77 : 500;
        CHECK(set.n_records == n, "%lld records", (long long)set.n_records);
        if (!split) CHECK(set.n_files > 3 && set.files[0].n_frames > 3, "%d shards, %d frames in the first",
                          set.n_files, set.n_files ? set.files[0].n_frames : 0);
        const tg_shard_manifest *m = &set.manifest;
        int64_t hist = 0;
        for (int32_t b = 0; b < m->n_bins; b++) hist += m->hist[split][b];
        CHECK(hist == n && m->n_labels == 3 && !strcmp(m->labels[2], "gamma") && m->token_types,
              "manifest: histogram %lld, %d labels", (long long)hist, m->n_labels);
        tg_shard_cursor cur;
        REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
        /* In order, then in a scattered order (random access across frames and shards). */
        int32_t ids[SEQ], types[SEQ];
        int bad = 0;
        for (int pass = 0; pass < 2 && !bad; pass++)
            for (int64_t k = 0; k < n && !bad; k++) {
                int64_t i = pass ? (k * 211) % n : k;
                tg_shard_record want, got;
                make_record(split, i, TG_SHARD_CLASSIFY, ids, types, &want);
                if (tg_shard_cursor_get(&cur, i, &got, &err)) {
                    CHECK(0, "record %lld: %s", (long long)i, err.msg);
                    bad = 1;
                } else if (!same_record(&want, &got, TG_SHARD_CLASSIFY)) {
                    CHECK(0, "%s record %lld differs (pass %d)", tg_shard_split_name(split), (long long)i, pass);
                    bad = 1;
                }
            }
        CHECK(tg_shard_cursor_get(&cur, n, &(tg_shard_record){0}, &err) == -1 && strstr(err.msg, "no record"),
              "past the end: %s", err.msg);
        tg_shard_cursor_close(&cur);
        tg_shard_set_close(&set);
    }
}

TG_TEST(test_shards_qa_and_lm_records) {
    tg_err err = {{0}};
    for (int task = TG_SHARD_LM; task <= TG_SHARD_QA; task++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s", set_dir("set"));
        REQUIRE(write_set(dir, task, 50, 0, 0, 0, &err) == 0, "%s", err.msg);
        tg_shard_set set;
        REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
        CHECK(set.manifest.task == task && set.n_files == 1, "task %d, %d files", set.manifest.task, set.n_files);
        tg_shard_cursor cur;
        REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
        int32_t ids[SEQ], types[SEQ];
        for (int64_t i = 0; i < 50; i++) {
            tg_shard_record want, got;
            make_record(0, i, task, ids, types, &want);
            REQUIRE(tg_shard_cursor_get(&cur, i, &got, &err) == 0, "%s", err.msg);
            REQUIRE(same_record(&want, &got, task), "%s record %lld differs", tg_shard_task_name(task), (long long)i);
        }
        tg_shard_cursor_close(&cur);
        tg_shard_set_close(&set);
    }
}

static const tg_data_rules k_classify = {TG_TASK_CLASSIFY, 3, VOCAB, 2, 0, 0};

TG_TEST(test_shards_load_as_datasets) {
    tg_err err = {{0}};
    char dir[600], path[700];
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 120, 30, 256, 2048, &err) == 0, "%s", err.msg);
    /* OUTDIR is the train split; OUTDIR/train and OUTDIR/eval (with or without a slash) one
     * split each. */
    const char *suffix[] = {"", "/", "/train", "/train/", "/eval"};
    const int32_t want_n[] = {120, 120, 120, 120, 30};
    for (int k = 0; k < 5; k++) {
        snprintf(path, sizeof path, "%s%s", dir, suffix[k]);
        tg_dataset ds;
        REQUIRE(tg_dataset_load(path, &k_classify, &ds, &err) == 0, "%s: %s", path, err.msg);
        CHECK(ds.n == want_n[k], "%s: %d examples", path, ds.n);
        int32_t ids[SEQ], types[SEQ];
        int64_t tokens = 0;
        for (int32_t i = 0; i < ds.n; i++) {
            tg_shard_record want;
            make_record(k == 4, i, TG_SHARD_CLASSIFY, ids, types, &want);
            const tg_example *e = &ds.examples[i];
            tokens += e->len;
            tg_shard_record got = {.len = e->len, .input_ids = e->input_ids, .token_type_ids = e->token_type_ids,
                                   .label = e->label};
            if (!same_record(&want, &got, TG_SHARD_CLASSIFY)) {
                CHECK(0, "%s: example %d differs", path, i);
                break;
            }
        }
        CHECK(tokens == ds.n_tokens, "tokens %lld vs %lld", (long long)tokens, (long long)ds.n_tokens);
        tg_dataset_free(&ds);
    }
    /* lm reads the ids of a classify set and ignores its labels. */
    tg_dataset ds;
    const tg_data_rules lm = {TG_TASK_LM, 0, VOCAB, 2, 0, 0};
    REQUIRE(tg_dataset_load(dir, &lm, &ds, &err) == 0, "%s", err.msg);
    CHECK(ds.n == 120 && ds.examples[5].label == TG_IGNORE_INDEX, "lm labels %d", ds.examples[5].label);
    tg_dataset_free(&ds);
    /* The right tokenizer passes the identity check. */
    REQUIRE(tg_shard_dataset_load(dir, &k_classify, 0xfeedfacecafebeefull, &ds, &err) == 0, "%s", err.msg);
    tg_dataset_free(&ds);
}

/* ---- damaged and mismatched sets ----------------------------------------------------- */

static void expect_load_error(const char *path, const tg_data_rules *r, uint64_t identity, const char *want1,
                              const char *want2) {
    tg_dataset ds;
    tg_err err = {{0}};
    int rc = tg_shard_dataset_load(path, r, identity, &ds, &err);
    if (rc == 0) tg_dataset_free(&ds);
    CHECK(rc == -1, "%s loaded (want '%s')", path, want1);
    CHECK(strstr(err.msg, want1) != NULL, "message '%s' lacks '%s'", err.msg, want1);
    if (want2) CHECK(strstr(err.msg, want2) != NULL, "message '%s' lacks '%s'", err.msg, want2);
}

/* Reads, edits and rewrites the manifest of a set. */
static int edit_manifest(const char *dir, void (*edit)(tg_shard_manifest *m, const char *dir)) {
    char path[700];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    long len;
    char *text = tg_test_read_file(path, &len);
    tg_shard_manifest m;
    tg_err err;
    if (!text || tg_shard_manifest_parse(text, (size_t)len, path, &m, &err)) return -1;
    free(text);
    edit(&m, dir);
    size_t n;
    int rc = tg_shard_manifest_format(&m, &text, &n, &err) || tg_test_write_file(path, text);
    free(text);
    tg_shard_manifest_free(&m);
    return rc;
}

/* The manifest's sizes and checksums made to match the shard files again. */
static void reseal(tg_shard_manifest *m, const char *dir) {
    for (int32_t i = 0; i < m->n_shards; i++) {
        char path[800];
        snprintf(path, sizeof path, "%s/%s", dir, m->shards[i].file);
        long len;
        char *bytes = tg_test_read_file(path, &len);
        if (!bytes) continue;
        m->shards[i].bytes = len;
        m->shards[i].xxh64 = XXH64(bytes, (size_t)len, 0);
        free(bytes);
    }
}

static void drop_a_label(tg_shard_manifest *m, const char *dir) {
    (void)dir;
    free(m->labels[--m->n_labels]);
}

static int flip_byte(const char *path, long at) {
    long len;
    char *bytes = tg_test_read_file(path, &len);
    if (!bytes || at >= len) return -1;
    bytes[at] ^= 0x5a;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(bytes, 1, (size_t)len, f) == (size_t)len;
    if (f) fclose(f);
    free(bytes);
    return ok ? 0 : -1;
}

TG_TEST(test_shards_bad_sets_are_refused) {
    tg_err err = {{0}};
    char dir[600], shard[700], want[900];
    const tg_data_rules lm = {TG_TASK_LM, 0, VOCAB, 2, 0, 0};

    /* Truncated shard. */
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 60, 10, 256, 0, &err) == 0, "%s", err.msg);
    snprintf(shard, sizeof shard, "%s/train/00000.tgshard", dir);
    struct stat st;
    REQUIRE(stat(shard, &st) == 0, "no shard");
    REQUIRE(truncate(shard, st.st_size - 7) == 0, "truncate");
    snprintf(want, sizeof want, "%s: truncated: the manifest says %lld bytes, the file has %lld", shard,
             (long long)st.st_size, (long long)st.st_size - 7);
    expect_load_error(dir, &k_classify, 0, want, NULL);

    /* A flipped byte: the checksum. */
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 60, 10, 256, 0, &err) == 0, "%s", err.msg);
    snprintf(shard, sizeof shard, "%s/train/00000.tgshard", dir);
    REQUIRE(flip_byte(shard, 40) == 0, "flip");
    snprintf(want, sizeof want, "%s: checksum mismatch: xxh64 ", shard);
    expect_load_error(dir, &k_classify, 0, want, "(file corrupt)");

    /* The same flip under a resealed manifest: the frame itself fails (zstd's own checksum). */
    REQUIRE(edit_manifest(dir, reseal) == 0, "reseal");
    snprintf(want, sizeof want, "%s: frame 0 (records 0 to ", shard);
    expect_load_error(dir, &k_classify, 0, want, "(file corrupt)");

    /* A manifest from a newer format. */
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 20, 0, 0, 0, &err) == 0, "%s", err.msg);
    char mpath[700];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    long len;
    char *text = tg_test_read_file(mpath, &len);
    REQUIRE(text && strstr(text, "\"version\": 1,"), "manifest text");
    memcpy(strstr(text, "\"version\": 1,") + 11, "2", 1);
    tg_test_write_file(mpath, text);
    free(text);
    snprintf(want, sizeof want, "%s: shard set format version 2, this build reads version 1", mpath);
    expect_load_error(dir, &k_classify, 0, want, NULL);

    /* Another tokenizer. */
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 20, 0, 0, 0, &err) == 0, "%s", err.msg);
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    snprintf(want, sizeof want, "%s: the set was made by tokenizer feedfacecafebeef, the job's tokenizer is "
                                "0000000000000001 (convert the data again",
             mpath);
    expect_load_error(dir, &k_classify, 1, want, NULL);

    /* A job with fewer labels than the set; ids past the model's vocabulary; a classify job
     * on an lm set; an eval split that was never made. */
    const tg_data_rules two_labels = {TG_TASK_CLASSIFY, 2, VOCAB, 2, 0, 0};
    snprintf(want, sizeof want, "%s: the set has 3 labels (alpha, ...), the job's num_labels is 2", mpath);
    expect_load_error(dir, &two_labels, 0, want, NULL);
    const tg_data_rules small_vocab = {TG_TASK_CLASSIFY, 3, 100, 2, 0, 0};
    snprintf(want, sizeof want, "%s/train/00000.tgshard: record 1: input_ids[5] = 116 is outside the vocabulary "
                                "(vocab_size 100",
             dir);
    expect_load_error(dir, &small_vocab, 0, want, NULL);
    snprintf(want, sizeof want, "%s/eval", dir);
    expect_load_error(want, &k_classify, 0, ": the set has no eval records (convert with --eval-fraction", NULL);
    const tg_data_rules no_types = {TG_TASK_CLASSIFY, 3, VOCAB, 0, 0, 0};
    expect_load_error(dir, &no_types, 0, "record 0: token_type_ids[0] = 1 but the model has no token types", NULL);

    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_LM, 20, 0, 0, 0, &err) == 0, "%s", err.msg);
    expect_load_error(dir, &k_classify, 0, "the set holds lm records, without labels; task classify needs", NULL);

    /* Label out of range: the manifest lists fewer labels than the records use. */
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 20, 0, 0, 0, &err) == 0, "%s", err.msg);
    REQUIRE(edit_manifest(dir, drop_a_label) == 0, "edit");
    snprintf(want, sizeof want, "%s/train/00000.tgshard: record 2: label 2 is outside the set's 2 labels", dir);
    expect_load_error(dir, &lm, 0, want, NULL);

    /* A folder that is no set, and a path that is nothing. */
    snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    expect_load_error(dir, &k_classify, 0, "a folder, but not a shard set (no manifest.json", NULL);
}

TG_TEST(test_shard_manifest_checks) {
    tg_err err = {{0}};
    char dir[600], mpath[700];
    snprintf(dir, sizeof dir, "%s", set_dir("set"));
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 30, 5, 0, 0, &err) == 0, "%s", err.msg);
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    long len;
    char *good = tg_test_read_file(mpath, &len);
    REQUIRE(good, "manifest");
    tg_shard_manifest m;
    REQUIRE(tg_shard_manifest_parse(good, (size_t)len, "m.json", &m, &err) == 0, "%s", err.msg);
    CHECK(m.records[0] == 30 && m.records[1] == 5 && m.n_shards == 2 && !strcmp(m.shards[1].file, "eval/00000.tgshard"),
          "counts");
    CHECK(!strcmp(m.command, "tunegraph data convert test") && m.tokenizer_identity == 0xfeedfacecafebeefull,
          "command and tokenizer");
    char *again;
    size_t n;
    REQUIRE(tg_shard_manifest_format(&m, &again, &n, &err) == 0, "%s", err.msg);
    CHECK(n == (size_t)len && !memcmp(again, good, n), "format(parse(x)) != x");
    free(again);
    tg_shard_manifest_free(&m);
    /* Each edit of the text, and what the parser says. */
    struct {
        const char *from, *to, *want;
    } edits[] = {
        {"\"records\": 30", "\"records\": 31", "the train shards hold more records than records.train (30)"},
        {"\"task\": \"classify\"", "\"task\": \"regress\"", "\"task\" must be \"classify\", \"lm\", \"qa\", \"instruct\" or \"image\""},
        {"\"file\": \"train/00000.tgshard\"", "\"file\": \"../00000.tgshard\"", "shards[0].file must name a file in the set's train/ folder"},
        {"\"labels\": [", "\"colour\": 1, \"labels\": [", "unknown key \"colour\" in the manifest"},
        {"\"beta\"", "\"alpha\"", "label 'alpha' is listed twice"},
        {"\"bin_width\": 8", "\"bin_width\": 4", "length_histogram.train must be an array of 10 counts"},
        {"\"format\": \"tunegraph-shards\"", "\"format\": \"other\"", "not a tunegraph shard set manifest"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        char *p = strstr(good, edits[i].from);
        REQUIRE(p, "edit %zu: '%s' not in the manifest", i, edits[i].from);
        char text[65536];
        snprintf(text, sizeof text, "%.*s%s%s", (int)(p - good), good, edits[i].to, p + strlen(edits[i].from));
        CHECK(tg_shard_manifest_parse(text, strlen(text), "m.json", &m, &err) == -1, "edit %zu accepted", i);
        CHECK(strstr(err.msg, edits[i].want) != NULL, "edit %zu: message '%s' lacks '%s'", i, err.msg, edits[i].want);
    }
    free(good);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

TG_TEST(test_shard_writer_is_atomic) {
    tg_err err = {{0}};
    char parent[600], dir[700], file[800];
    snprintf(parent, sizeof parent, "%s", tg_test_tmpdir());
    snprintf(dir, sizeof dir, "%s/out", parent);
    /* A failure half way (a record past seq) leaves nothing: no OUTDIR, no temporary folder. */
    tg_shard_set_desc d = {.task = TG_SHARD_LM, .seq = SEQ, .tokenizer_family = "wordpiece", .vocab_size = VOCAB};
    tg_shard_writer *w;
    REQUIRE(tg_shard_writer_open(dir, &d, &w, &err) == 0, "%s", err.msg);
    CHECK(count_entries(parent) == 1, "the temporary folder is beside OUTDIR");
    int32_t ids[SEQ + 1] = {0};
    tg_shard_record r = {.len = 5, .input_ids = ids};
    REQUIRE(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &r, &err) == 0, "%s", err.msg);
    r.len = SEQ + 1;
    CHECK(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &r, &err) == -1 && strstr(err.msg, "41 tokens, outside 1 to seq 40"),
          "%s", err.msg);
    tg_shard_writer_abort(w);
    CHECK(count_entries(parent) == 0, "%d entries left after abort", count_entries(parent));

    /* An existing set is replaced; anything else is refused before any work. */
    REQUIRE(write_set(dir, TG_SHARD_CLASSIFY, 10, 0, 0, 0, &err) == 0, "%s", err.msg);
    REQUIRE(write_set(dir, TG_SHARD_LM, 7, 0, 0, 0, &err) == 0, "%s", err.msg);
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    CHECK(set.n_records == 7 && set.manifest.task == TG_SHARD_LM, "the old set is still there");
    tg_shard_set_close(&set);
    CHECK(count_entries(parent) == 1, "%d entries: the old set was not removed", count_entries(parent));
    snprintf(file, sizeof file, "%s/notes.txt", parent);
    tg_test_write_file(file, "mine");
    CHECK(tg_shard_writer_open(file, &d, &w, &err) == -1 && strstr(err.msg, "exists and is not a folder"), "%s",
          err.msg);
    snprintf(file, sizeof file, "%s/mine", parent);
    mkdir(file, 0755);
    snprintf(dir, sizeof dir, "%s/keep.txt", file);
    tg_test_write_file(dir, "keep");
    CHECK(tg_shard_writer_open(file, &d, &w, &err) == -1 && strstr(err.msg, "exists and is not a shard set"), "%s",
          err.msg);
    CHECK(count_entries(file) == 1, "the folder was touched");
}
