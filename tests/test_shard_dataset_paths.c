/* Shard sets as datasets: the paths that name a set or a split (trailing and doubled
 * slashes, relative, the root, too long), folders that are no set, rules that leave
 * checks out or refuse token types, and allocation failures while loading. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "datasets/dataset.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_writer.h"
#include "plan/ops.h"
#include "tests/harness.h"

#define VOCAB 50
#define SEQ 6

static char *const k_labels[] = {"neg", "pos"};

/* Record i: length 1 + i % SEQ, ids (3 i + t) % VOCAB, token types (t % 2) on odd records,
 * label i % 2. */
static tg_shard_record record(int64_t i, int32_t *ids, int32_t *types) {
    int32_t len = 1 + (int32_t)(i % SEQ);
    for (int32_t t = 0; t < len; t++) ids[t] = (int32_t)((3 * i + t) % VOCAB), types[t] = t % 2;
    return (tg_shard_record){.len = len, .input_ids = ids, .token_type_ids = i % 2 ? types : NULL, .label = (int32_t)(i % 2)};
}

static int write_set(const char *out, int64_t n_train, int64_t n_eval) {
    tg_shard_set_desc d = {.task = TG_SHARD_CLASSIFY, .seq = SEQ, .n_labels = 2, .labels = k_labels,
                           .tokenizer_identity = 5, .tokenizer_family = "wordpiece", .vocab_size = VOCAB,
                           .frame_bytes = 64};
    tg_shard_writer *w;
    tg_err err;
    if (tg_shard_writer_open(out, &d, &w, &err)) return -1;
    for (int64_t i = 0; i < n_train + n_eval; i++) {
        int32_t ids[SEQ], types[SEQ];
        tg_shard_record r = record(i, ids, types);
        if (tg_shard_writer_add(w, i < n_train ? TG_SPLIT_TRAIN : TG_SPLIT_EVAL, &r, &err)) {
            tg_shard_writer_abort(w);
            return -1;
        }
    }
    return tg_shard_writer_commit(w, &err);
}

/* Loads path and checks each example against record(first + k). */
static int check_load(const char *path, const tg_data_rules *rules, int64_t first, int32_t n) {
    tg_dataset ds;
    tg_err err = {{0}};
    if (!CHECK(tg_shard_dataset_load(path, rules, 5, &ds, &err) == 0, "%s: %s", path, err.msg)) return 0;
    int ok = CHECK(ds.n == n && !strcmp(ds.path, path), "%s: %d examples, path '%s'", path, ds.n, ds.path);
    int64_t tokens = 0;
    for (int32_t k = 0; ok && k < n; k++) {
        int32_t ids[SEQ], types[SEQ];
        tg_shard_record want = record(first + k, ids, types);
        const tg_example *e = &ds.examples[k];
        ok = e->len == want.len && !memcmp(e->input_ids, ids, sizeof *ids * (size_t)want.len) &&
             !e->token_type_ids == !want.token_type_ids &&
             (!e->token_type_ids || !memcmp(e->token_type_ids, types, sizeof *types * (size_t)want.len)) &&
             e->label == (rules->task == TG_TASK_CLASSIFY ? want.label : TG_IGNORE_INDEX);
        CHECK(ok, "%s: example %d differs", path, k);
        tokens += e->len;
    }
    CHECK(ds.n_tokens == tokens, "n_tokens %lld, want %lld", (long long)ds.n_tokens, (long long)tokens);
    tg_dataset_free(&ds);
    return ok;
}

static void expect_error(const char *path, const tg_data_rules *rules, const char *want) {
    tg_dataset ds;
    tg_err err = {{0}};
    int rc = tg_shard_dataset_load(path, rules, 0, &ds, &err);
    if (rc == 0) tg_dataset_free(&ds);
    CHECK(rc == -1 && strstr(err.msg, want), "%s: rc %d '%s', want '%s'", path, rc, err.msg, want);
    CHECK(ds.n == 0 && ds.examples == NULL, "%s: examples left after a failure", path);
}

static const tg_data_rules k_classify = {TG_TASK_CLASSIFY, 2, VOCAB, 2, 0, 0};

TG_TEST(test_shard_dataset_paths_name_splits) {
    const char *parent = tg_test_tmpdir();
    char set[700], path[800], dir[800];
    snprintf(set, sizeof set, "%s/set", parent);
    REQUIRE(write_set(set, 9, 4) == 0, "write");
    snprintf(path, sizeof path, "%s//", set);
    CHECK(check_load(path, &k_classify, 0, 9), "OUTDIR//");
    snprintf(path, sizeof path, "%s/train/", set);
    CHECK(check_load(path, &k_classify, 0, 9), "OUTDIR/train/");
    snprintf(path, sizeof path, "%s//eval", set);
    CHECK(check_load(path, &k_classify, 9, 4), "OUTDIR//eval");
    const tg_data_rules lm = {TG_TASK_LM, 0, VOCAB, 2, 0, 0};
    snprintf(path, sizeof path, "%s/eval", set);
    CHECK(check_load(path, &lm, 9, 4), "an lm job on a classify set: no labels");
    /* No vocab_size in the rules: ids are not checked against one. */
    const tg_data_rules any_vocab = {TG_TASK_CLASSIFY, 2, 0, 2, 0, 0};
    CHECK(check_load(set, &any_vocab, 0, 9), "vocab_size 0");
    int split = 9;
    snprintf(path, sizeof path, "%s//eval//", set);
    tg_shard_path_resolve(path, dir, sizeof dir, &split);
    CHECK(split == TG_SPLIT_EVAL && !strcmp(dir, set), "resolve: split %d dir '%s'", split, dir);
    /* Relative: "train" and "eval" inside the set's folder name its splits of ".". */
    char cwd[700];
    REQUIRE(getcwd(cwd, sizeof cwd) && chdir(set) == 0, "chdir");
    tg_shard_path_resolve("eval", dir, sizeof dir, &split);
    int relative_split = split;
    char relative_dir[800];
    snprintf(relative_dir, sizeof relative_dir, "%s", dir);
    int loaded = check_load("train", &k_classify, 0, 9);
    REQUIRE(chdir(cwd) == 0, "chdir back");
    CHECK(relative_split == TG_SPLIT_EVAL && !strcmp(relative_dir, "."), "relative: split %d dir '%s'", relative_split,
          relative_dir);
    CHECK(loaded, "relative train");
    /* Names that are no split, and the root. */
    tg_shard_path_resolve("/eval", dir, sizeof dir, &split);
    CHECK(split == -1, "/eval: split %d", split);
    /* The root written with repeated slashes: its trailing ones go, the root's own stays
     * (the sanitizer build sees a read before the name's first byte). */
    tg_shard_path_resolve("//eval", dir, sizeof dir, &split);
    CHECK(split == -1, "//eval: split %d", split);
    tg_shard_path_resolve("///train", dir, sizeof dir, &split);
    CHECK(split == -1, "///train: split %d", split);
    tg_shard_path_resolve("/", dir, sizeof dir, &split);
    CHECK(split == -1, "/: split %d", split);
    tg_shard_path_resolve("///", dir, sizeof dir, &split);
    CHECK(split == -1, "///: split %d", split);
    /* TG_PATH_MAX bytes at most: SET////.../train of 512 bytes names the split; one more
     * byte (a trailing slash) is too long, never cut to fit. */
    char edge[TG_PATH_MAX + 2];
    const size_t pad = TG_PATH_MAX - strlen(set) - strlen("train");
    REQUIRE(pad > 1, "the test folder's path is too long");
    snprintf(edge, sizeof edge, "%s", set);
    memset(edge + strlen(set), '/', pad);
    snprintf(edge + strlen(set) + pad, sizeof edge - strlen(set) - pad, "train");
    REQUIRE(strlen(edge) == TG_PATH_MAX, "%zu bytes", strlen(edge));
    split = 9;
    tg_shard_path_resolve(edge, dir, sizeof dir, &split);
    CHECK(split == TG_SPLIT_TRAIN && !strcmp(dir, set), "%d bytes: split %d dir '%s'", TG_PATH_MAX, split, dir);
    strcat(edge, "/");
    split = 9;
    tg_shard_path_resolve(edge, dir, sizeof dir, &split);
    CHECK(split == -1, "%d bytes: split %d", TG_PATH_MAX + 1, split);
    snprintf(path, sizeof path, "%s/test", set);
    tg_shard_path_resolve(path, dir, sizeof dir, &split);
    CHECK(split == -1, "OUTDIR/test: split %d", split);
    CHECK(tg_shard_path_is_set(set) == 1, "the set");
    snprintf(path, sizeof path, "%s/manifest.json", set);
    CHECK(tg_shard_path_is_set(path) == 0, "a file in the set");
    snprintf(path, sizeof path, "%s/eval", parent);
    CHECK(tg_shard_path_is_set(path) == 0, "PARENT/eval (no manifest in PARENT)");
    char longpath[700];
    memset(longpath, 'x', 600);
    longpath[600] = 0;
    memcpy(longpath + 590, "/eval", 6);
    CHECK(tg_shard_path_is_set(longpath) == 0, "a path past TG_PATH_MAX");
    tg_shard_path_resolve(longpath, dir, sizeof dir, &split);
    CHECK(split == -1, "long path: split %d", split);
}

TG_TEST(test_shard_dataset_refusals) {
    const char *parent = tg_test_tmpdir();
    char set[700], path[800], want[900];
    /* An eval-only set asked for its train split: no hint about --eval-fraction. */
    snprintf(set, sizeof set, "%s/evalonly", parent);
    REQUIRE(write_set(set, 0, 3) == 0, "write");
    tg_dataset ds;
    tg_err err = {{0}};
    snprintf(want, sizeof want, "%s: the set has no train records", set);
    CHECK(tg_shard_dataset_load(set, &k_classify, 0, &ds, &err) == -1 && !strcmp(err.msg, want), "'%s'", err.msg);
    /* The model has one token type: type 1 is outside it. */
    snprintf(set, sizeof set, "%s/set", parent);
    REQUIRE(write_set(set, 4, 0) == 0, "write");
    const tg_data_rules one_type = {TG_TASK_CLASSIFY, 2, VOCAB, 1, 0, 0};
    snprintf(want, sizeof want, "%s/train/00000.tgshard: record 1: token_type_ids[1] = 1 is outside type_vocab_size", set);
    expect_error(set, &one_type, want);
    /* A folder whose manifest.json is a folder is no set. */
    snprintf(path, sizeof path, "%s/fake", parent);
    mkdir(path, 0755);
    char m[900];
    snprintf(m, sizeof m, "%s/manifest.json", path);
    mkdir(m, 0755);
    CHECK(tg_shard_path_is_set(path) == 1, "a folder is taken for a set (and then refused)");
    snprintf(want, sizeof want, "%s: a folder, but not a shard set (no manifest.json in it", path);
    expect_error(path, &k_classify, want);
    /* Nothing there; a path too long. */
    snprintf(path, sizeof path, "%s/nothing", parent);
    snprintf(want, sizeof want, "%s: cannot open dataset: No such file or directory", path);
    expect_error(path, &k_classify, want);
    char longpath[700];
    memset(longpath, 'y', 600);
    longpath[600] = 0;
    expect_error(longpath, &k_classify, ": dataset path is too long");
}

static int load_for_faults(const char *set, tg_err *err) {
    tg_dataset ds;
    if (tg_shard_dataset_load(set, &k_classify, 5, &ds, err)) return -1;
    tg_dataset_free(&ds);
    return 0;
}

TG_TEST(test_shard_dataset_out_of_memory) {
    const char *parent = tg_test_tmpdir();
    char set[700];
    snprintf(set, sizeof set, "%s/set", parent);
    /* Enough tokens that the id pool grows past its first 4096. */
    tg_shard_set_desc d = {.task = TG_SHARD_CLASSIFY, .seq = 512, .n_labels = 2, .labels = k_labels,
                           .tokenizer_identity = 5, .tokenizer_family = "wordpiece", .vocab_size = VOCAB};
    tg_shard_writer *w;
    tg_err err = {{0}};
    REQUIRE(tg_shard_writer_open(set, &d, &w, &err) == 0, "%s", err.msg);
    static int32_t ids[512], types[512];
    for (int i = 0; i < 512; i++) ids[i] = i % VOCAB, types[i] = 1;
    for (int i = 0; i < 12; i++) {
        tg_shard_record r = {.len = 500, .input_ids = ids, .token_type_ids = i % 2 ? types : NULL, .label = i % 2};
        REQUIRE(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &r, &err) == 0, "%s", err.msg);
    }
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    tg_alloc_fail_after(-1);
    REQUIRE(load_for_faults(set, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 10, "%ld allocations", total);
    int examples = 0, pool = 0;
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        int rc = load_for_faults(set, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory"), "allocation %ld of %ld: rc %d '%s'", k, total, rc, err.msg);
        examples += strstr(err.msg, "out of memory for 12 examples") != NULL;
        pool += strstr(err.msg, "token ids") != NULL;
    }
    CHECK(examples == 3 && pool >= 2, "examples %d, pool %d", examples, pool);
}

/* A qa job on a set of classify records: refused before any record is read, naming the
 * manifest and what the set holds. */
TG_TEST(test_shard_dataset_qa_job_on_a_classify_set) {
    char set[700], want[1000];
    snprintf(set, sizeof set, "%s/classify_for_qa", tg_test_tmpdir());
    REQUIRE(write_set(set, 3, 0) == 0, "write");
    const tg_data_rules qa = {TG_TASK_QA, 0, VOCAB, 2, 0, 0};
    tg_dataset ds;
    tg_err err = {{0}};
    snprintf(want, sizeof want,
             "%s/manifest.json: the set holds classify records, without answer positions; task qa needs a set "
             "converted with --format squad",
             set);
    const int rc = tg_shard_dataset_load(set, &qa, 5, &ds, &err);
    if (rc == 0) tg_dataset_free(&ds);
    CHECK(rc == -1 && !strcmp(err.msg, want), "rc %d '%s'\n    want '%s'", rc, err.msg, want);
}
