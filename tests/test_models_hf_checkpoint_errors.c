/* Sharded Hugging Face checkpoints that must be refused, each with the message naming the
 * index, the field, the shard or the tensor: a table of damaged indexes and of indexes that
 * disagree with their shards, shard names that leave the index's folder, too many shards,
 * paths too long, an index named without a folder, and every allocation of an open failed
 * in turn. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "models/hf_checkpoint.h"
#include "tests/harness.h"

#define CHECK_MSG(err, s) CHECK(strstr((err).msg, (s)) != NULL, "message '%s' lacks '%s'", (err).msg, (s))

/* A shard holding scalar F32 tensors named in `names` (space-separated). */
static int write_shard(const char *dir, const char *file, const char *names) {
    char path[800], copy[256];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(copy, sizeof copy, "%s", names);
    tg_st_item items[8];
    static const float one = 1.0f;
    int n = 0;
    for (char *s = strtok(copy, " "); s && n < 8; s = strtok(NULL, " ")) items[n++] = (tg_st_item){s, TG_ST_F32, 0, NULL, &one};
    tg_err err;
    return tg_st_write(path, items, n, &err);
}

/* A shard of no tensor: the length 2 and "{}" (written directly: thousands are made). */
static int write_empty_shard(const char *dir, const char *file) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const int ok = fwrite("\x02\0\0\0\0\0\0\0{}", 1, 10, f) == 10;
    return fclose(f) == 0 && ok ? 0 : -1;
}

typedef struct bad_index {
    const char *index;
    const char *want;
} bad_index;

/* Shards a.safetensors (tensors x, y) and b.safetensors (tensor z) sit beside each index. */
static const bad_index k_bad_indexes[] = {
    {"{\"weight_map\": ", "model.safetensors.index.json: invalid JSON at line 1, column 15"},
    {"{\"weight_map\": {}, \"weight_map\": {}}", "key 'weight_map' appears twice in one object (line 1"},
    {"[\"a.safetensors\"]", "index.json: expected a JSON object at the top level"},
    {"{\"metadata\": {}}", "index.json: field 'weight_map': missing or not an object (tensor name -> shard file)"},
    {"{\"weight_map\": [\"x\"]}", "field 'weight_map': missing or not an object"},
    {"{\"weight_map\": {}}", "index.json: field 'weight_map' names no tensor"},
    {"{\"metadata\": [], \"weight_map\": {\"x\": \"a.safetensors\"}}", "index.json: field 'metadata' is not an object"},
    {"{\"weight_map\": {\"x\": 1}}", "weight_map: the value of 'x' is not a string (a shard file name)"},
    {"{\"weight_map\": {\"x\": \"\"}}", "weight_map: 'x' maps to shard '', which is not a file name inside the index's"},
    {"{\"weight_map\": {\"x\": \"/etc/a.safetensors\"}}", "'x' maps to shard '/etc/a.safetensors', which is not a file"},
    {"{\"weight_map\": {\"x\": \"sub//a.safetensors\"}}", "maps to shard 'sub//a.safetensors', which is not a file"},
    {"{\"weight_map\": {\"x\": \"../a.safetensors\"}}", "maps to shard '../a.safetensors', which is not a file"},
    {"{\"weight_map\": {\"x\": \"sub/../a.safetensors\"}}", "maps to shard 'sub/../a.safetensors', which is not"},
    {"{\"weight_map\": {\"x\": \"sub/..\"}}", "maps to shard 'sub/..', which is not a file name"},
    {"{\"weight_map\": {\"x\": \"sub/\"}}", "shard 'sub/' of tensor 'x': "}, /* a name the open refuses */
    {"{\"weight_map\": {\"x\": \"..a.safetensors\"}}", "shard '..a.safetensors' of tensor 'x': "},
    {"{\"weight_map\": {\"x\": \"ab/a.safetensors\"}}", "shard 'ab/a.safetensors' of tensor 'x': "},
    /* Two characters beginning with a dot, as "..", but a folder name like any other. */
    {"{\"weight_map\": {\"x\": \".a/a.safetensors\"}}", "shard '.a/a.safetensors' of tensor 'x': "},
    {"{\"weight_map\": {\"x\": \"sub/.b\"}}", "shard 'sub/.b' of tensor 'x': "},
    {"{\"weight_map\": {\"x\": \"c.safetensors\"}}", "index.json: shard 'c.safetensors' of tensor 'x': "},
    {"{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"a.safetensors\", \"z\": \"a.safetensors\"}}",
     "weight_map puts tensor 'z' in "},
    {"{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\", \"z\": \"b.safetensors\"}}",
     "weight_map puts tensor 'y' in "},
    {"{\"weight_map\": {\"x\": \"a.safetensors\", \"z\": \"b.safetensors\"}}", "holds tensor 'y', which the weight_map of "},
    {"{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"a.safetensors\", \"z\": \"b.safetensors\", "
     "\"w\": \"d.safetensors\"}}",
     "tensor 'w' is in two shards, "},
};

TG_TEST(test_models_hf_checkpoint_bad_indexes) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_shard(dir, "a.safetensors", "x y") == 0 && write_shard(dir, "b.safetensors", "z") == 0 &&
                write_shard(dir, "d.safetensors", "w") == 0 && write_shard(dir, "e.safetensors", "w") == 0,
            "shards");
    char index[800];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    for (size_t i = 0; i < sizeof k_bad_indexes / sizeof k_bad_indexes[0]; i++) {
        const char *text = k_bad_indexes[i].index;
        /* the last case: w in d and, unnamed by the index, again in e */
        char both[512];
        if (i + 1 == sizeof k_bad_indexes / sizeof k_bad_indexes[0]) {
            snprintf(both, sizeof both, "%.*s, \"v\": \"e.safetensors\"}}", (int)strlen(text) - 2, text);
            REQUIRE(write_shard(dir, "e.safetensors", "w v") == 0, "shard e");
            text = both;
        }
        REQUIRE(tg_test_write_file(index, text) == 0, "index");
        tg_hf_checkpoint ck;
        tg_err err = {{0}};
        const int rc = tg_hf_checkpoint_open(index, &ck, &err);
        CHECK(rc == -1 && strstr(err.msg, k_bad_indexes[i].want) && strstr(err.msg, index),
              "index %zu: rc %d, '%s' lacks '%s'", i, rc, err.msg, k_bad_indexes[i].want);
        CHECK(ck.n == 0 && ck.files == NULL && ck.tensors == NULL, "index %zu: state left behind", i);
    }
    /* which shard each message names */
    tg_hf_checkpoint ck;
    tg_err err = {{0}};
    REQUIRE(tg_test_write_file(index, "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"b.safetensors\", "
                                      "\"z\": \"b.safetensors\"}}") == 0, "index");
    CHECK(tg_hf_checkpoint_open(index, &ck, &err) == -1, "y in the wrong shard accepted");
    CHECK_MSG(err, "b.safetensors, but it is in ");
    CHECK_MSG(err, "/a.safetensors");
    REQUIRE(tg_test_write_file(index, "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"a.safetensors\", "
                                      "\"z\": \"a.safetensors\"}}") == 0, "index");
    CHECK(tg_hf_checkpoint_open(index, &ck, &err) == -1, "z in a accepted");
    CHECK_MSG(err, "a.safetensors, which does not hold it");
}

/* An index with metadata, and shards in a subfolder: every tensor found in its shard. */
TG_TEST(test_models_hf_checkpoint_index_opens) {
    const char *dir = tg_test_tmpdir();
    char sub[800], index[800];
    snprintf(sub, sizeof sub, "%s/part", dir);
    REQUIRE(mkdir(sub, 0777) == 0 && write_shard(sub, "a.safetensors", "x y") == 0 &&
                write_shard(dir, "b.safetensors", "z") == 0,
            "shards");
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    REQUIRE(tg_test_write_file(index, "{\"metadata\": {\"total_size\": 12}, \"weight_map\": {\"z\": \"b.safetensors\", "
                                      "\"x\": \"part/a.safetensors\", \"y\": \"part/a.safetensors\"}}") == 0,
            "index");
    tg_hf_checkpoint ck;
    tg_err err = {{0}};
    REQUIRE(tg_hf_checkpoint_open(index, &ck, &err) == 0, "%s", err.msg);
    CHECK(ck.sharded == 1 && ck.n_files == 2 && ck.n == 3, "sharded %d, %d files, %d tensors", ck.sharded, ck.n_files,
          ck.n);
    const tg_hf_checkpoint_tensor *x = tg_hf_checkpoint_find(&ck, "x"), *z = tg_hf_checkpoint_find(&ck, "z");
    REQUIRE(x && z && !tg_hf_checkpoint_find(&ck, "w"), "find");
    CHECK(z->file == 0 && x->file == 1 && strstr(tg_hf_checkpoint_file(&ck, x)->path, "/part/a.safetensors"),
          "files: z in %d, x in %d", z->file, x->file);
    tg_hf_checkpoint_close(&ck);
    tg_hf_checkpoint_close(NULL); /* harmless */

    /* a single file of no tensor opens, and finds nothing */
    char single[800];
    snprintf(single, sizeof single, "%s/empty.safetensors", dir);
    REQUIRE(write_shard(dir, "empty.safetensors", "") == 0, "empty file");
    REQUIRE(tg_hf_checkpoint_open(single, &ck, &err) == 0, "%s", err.msg);
    CHECK(ck.sharded == 0 && ck.n_files == 1 && ck.n == 0 && !tg_hf_checkpoint_find(&ck, "x"), "empty file: n %d", ck.n);
    tg_hf_checkpoint_close(&ck);
}

/* Paths: an index or a file too long to hold, a shard whose path would be, a short name
 * that is no index, and an index named without a folder (its shards are then beside it in
 * the working folder). */
TG_TEST(test_models_hf_checkpoint_paths) {
    tg_hf_checkpoint ck;
    tg_err err = {{0}};
    char longname[TG_ST_PATH_MAX + 16];
    memset(longname, 'a', sizeof longname);
    memcpy(longname + sizeof longname - 6, ".json", 6);
    CHECK(tg_hf_checkpoint_open(longname, &ck, &err) == -1, "long path opened");
    CHECK_MSG(err, "aaaa.json: path too long");

    CHECK(tg_hf_checkpoint_open("abc", &ck, &err) == -1 && ck.sharded == 0, "'abc' opened");
    CHECK_MSG(err, "abc: cannot open: No such file");

    const char *dir = tg_test_tmpdir();
    char index[800];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    char text[1200], shard[TG_ST_PATH_MAX];
    memset(shard, 's', sizeof shard - 1);
    shard[sizeof shard - 1] = 0;
    snprintf(text, sizeof text, "{\"weight_map\": {\"x\": \"%s\"}}", shard);
    REQUIRE(tg_test_write_file(index, text) == 0, "index");
    CHECK(tg_hf_checkpoint_open(index, &ck, &err) == -1, "long shard path opened");
    CHECK_MSG(err, "sss' (of tensor 'x'): path too long");

    char cwd[PATH_MAX];
    REQUIRE(getcwd(cwd, sizeof cwd) && chdir(dir) == 0, "chdir");
    const int shard_ok = write_shard(".", "a.safetensors", "x") == 0 &&
                         tg_test_write_file("i.json", "{\"weight_map\": {\"x\": \"a.safetensors\"}}") == 0;
    const int rc = tg_hf_checkpoint_open("i.json", &ck, &err);
    const int found = rc == 0 && ck.n == 1 && !strcmp(ck.files[0].path, "a.safetensors");
    if (rc == 0) tg_hf_checkpoint_close(&ck);
    REQUIRE(chdir(cwd) == 0, "chdir back");
    CHECK(shard_ok && found, "index without a folder: rc %d, '%s'", rc, rc ? err.msg : "");
}

/* Shards past the limit: 4096 open (each an empty file), the 4097th refused by name. */
TG_TEST(test_models_hf_checkpoint_too_many_shards) {
    const char *dir = tg_test_tmpdir();
    const int n = TG_HF_CHECKPOINT_MAX_SHARDS + 1;
    size_t cap = (size_t)n * 48 + 64, len = 0;
    char *text = malloc(cap);
    REQUIRE(text, "malloc");
    len += (size_t)snprintf(text + len, cap - len, "{\"weight_map\": {");
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "s%d.safetensors", i);
        if (i < n - 1 && !CHECK(write_empty_shard(dir, name) == 0, "shard %d", i)) break;
        len += (size_t)snprintf(text + len, cap - len, "%s\"t%d\": \"%s\"", i ? ", " : "", i, name);
    }
    snprintf(text + len, cap - len, "}}");
    char index[800];
    snprintf(index, sizeof index, "%s/big.index.json", dir);
    const int wrote = tg_test_write_file(index, text);
    free(text);
    REQUIRE(wrote == 0, "index");
    tg_hf_checkpoint ck;
    tg_err err = {{0}};
    CHECK(tg_hf_checkpoint_open(index, &ck, &err) == -1, "4097 shards opened");
    CHECK_MSG(err, "big.index.json: weight_map names more than 4096 shard files");
}

/* Every allocation of a sharded open and of a single-file open failed in turn. */
static int open_attempt(const char *path, tg_err *err) {
    tg_hf_checkpoint ck;
    if (tg_hf_checkpoint_open(path, &ck, err)) return -1;
    tg_hf_checkpoint_close(&ck);
    return 0;
}

static void fail_each(const char *path) {
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(open_attempt(path, &err) == 0, "%s: %s", path, err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 2, "%s: %ld allocations", path, total);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = open_attempt(path, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && strstr(err.msg, "out of memory") && strstr(err.msg, ".safetensors"),
              "%s: allocation %ld of %ld failing: rc %d, '%s'", path, k, total, rc, err.msg);
    }
}

TG_TEST(test_models_hf_checkpoint_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_shard(dir, "a.safetensors", "x y") == 0 && write_shard(dir, "b.safetensors", "z") == 0, "shards");
    char index[800], single[800];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    REQUIRE(tg_test_write_file(index, "{\"metadata\": {}, \"weight_map\": {\"x\": \"a.safetensors\", "
                                      "\"y\": \"a.safetensors\", \"z\": \"b.safetensors\"}}") == 0,
            "index");
    fail_each(index);
    snprintf(single, sizeof single, "%s/a.safetensors", dir);
    fail_each(single);
}

/* Names shorter than ".json" are single files, and nothing before the name is read (each
 * sits on the heap with no byte to spare, so the sanitizer build sees a read before it);
 * ".json" itself, five bytes, is looked at whole. */
TG_TEST(test_models_hf_checkpoint_short_names) {
    static const char *const names[] = {"a", "ab", "a.js", "json"};
    for (int i = 0; i < 4; i++) {
        char *name = malloc(strlen(names[i]) + 1);
        REQUIRE(name, "malloc");
        memcpy(name, names[i], strlen(names[i]) + 1);
        tg_hf_checkpoint ck;
        tg_err err = {{0}};
        char want[64];
        snprintf(want, sizeof want, "%s: cannot open: No such file", names[i]);
        CHECK(tg_hf_checkpoint_open(name, &ck, &err) == -1 && !strncmp(err.msg, want, strlen(want)), "'%s': '%s'",
              names[i], err.msg);
        free(name);
    }
    char *index = malloc(6);
    REQUIRE(index, "malloc");
    memcpy(index, ".json", 6);
    tg_hf_checkpoint ck;
    tg_err err = {{0}};
    CHECK(tg_hf_checkpoint_open(index, &ck, &err) == -1 && !strncmp(err.msg, ".json: cannot open", 18), "'.json': '%s'",
          err.msg);
    free(index);
}

/* TG_ST_PATH_MAX (512 with its terminator) at its edge: a name or a shard's path of 511
 * bytes is opened (and here not found), one of 512 is refused as too long (never opened
 * cut short). */
TG_TEST(test_models_hf_checkpoint_path_limit_edges) {
    for (size_t len = TG_ST_PATH_MAX - 1; len <= TG_ST_PATH_MAX; len++) {
        /* The name: "x/" repeated (folders that are not there), then "i.json" to the length. */
        char name[TG_ST_PATH_MAX + 8];
        size_t n = 0;
        while (len - n > 8) name[n++] = 'x', name[n++] = '/';
        while (len - n > 6) name[n++] = 'i';
        memcpy(name + n, "i.json", 7);
        REQUIRE(strlen(name) == len, "a %zu-byte name", strlen(name));
        tg_hf_checkpoint ck;
        tg_err err = {{0}};
        char want[TG_ST_PATH_MAX + 64];
        if (len < TG_ST_PATH_MAX) snprintf(want, sizeof want, "%s: cannot open", name);
        else snprintf(want, sizeof want, "%s: path too long", name);
        CHECK(tg_hf_checkpoint_open(name, &ck, &err) == -1 && !strncmp(err.msg, want, strlen(want)),
              "a %zu-byte name: '...%s'", len, err.msg + (strlen(err.msg) > 60 ? strlen(err.msg) - 60 : 0));
    }
    /* A shard named in an index: its path is the index's folder then the name. */
    const char *dir = tg_test_tmpdir();
    char index[800];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    const size_t dir_len = strlen(dir) + 1;
    REQUIRE(dir_len + 20 < TG_ST_PATH_MAX, "a short test folder");
    for (size_t len = TG_ST_PATH_MAX - 1; len <= TG_ST_PATH_MAX; len++) {
        char shard[TG_ST_PATH_MAX + 8], text[2 * TG_ST_PATH_MAX];
        const size_t shard_len = len - dir_len;
        size_t n = 0;
        while (shard_len - n > 20) {
            memset(shard + n, 's', 9);
            shard[n + 9] = '/';
            n += 10;
        }
        memset(shard + n, 't', shard_len - n);
        shard[shard_len] = 0;
        snprintf(text, sizeof text, "{\"weight_map\": {\"x\": \"%s\"}}", shard);
        REQUIRE(tg_test_write_file(index, text) == 0, "index");
        tg_hf_checkpoint ck;
        tg_err err = {{0}};
        const int rc = tg_hf_checkpoint_open(index, &ck, &err);
        /* 511: the shard's own refusal (not there), after a context cut to 512 bytes. */
        char want[3 * TG_ST_PATH_MAX];
        if (len < TG_ST_PATH_MAX) snprintf(want, sizeof want, "%s: shard '%s", index, shard);
        else snprintf(want, sizeof want, "%s: shard '%s' (of tensor 'x'): path too long", index, shard);
        const int too_long = strstr(err.msg, "path too long") != NULL;
        CHECK(rc == -1 && !strncmp(err.msg, want, 400) && too_long == (len == TG_ST_PATH_MAX),
              "a %zu-byte shard path: '%s'\n    want '%s'", len, err.msg, want);
    }
}
