/* `data convert` of SQuAD (datasets/convert.c) and the eval files it writes beside the
 * shards: their exact lines for each split (a context once for its questions, questions
 * without answers, every window), an output folder of the longest length the writer
 * takes (the eval file's path is allocated to fit), and every allocation failed in turn,
 * each alone: an error that says what ran out and no output, or (where the code has a way
 * round it) the same output and no message; never a set without its eval lines. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "datasets/convert.h"
#include "datasets/shard_writer.h"
#include "datasets/squad_eval.h"
#include "plan/plan.h"
#include "tests/byte_encoder.h"
#include "tests/harness.h"

/* Article A: paragraph "ab" (questions x, answered "b", and y, unanswerable) and paragraph
 * "cd" (question z); article B: paragraph "ef" (question w). */
static const char SQUAD[] =
    "{\"data\": [{\"paragraphs\": [{\"context\": \"ab\", \"qas\": ["
    "{\"id\": \"x\", \"question\": \"q\", \"answers\": [{\"text\": \"b\", \"answer_start\": 1}]},"
    "{\"id\": \"y\", \"question\": \"q\", \"answers\": [], \"is_impossible\": true}]},"
    "{\"context\": \"cd\", \"qas\": [{\"id\": \"z\", \"question\": \"q\", \"answers\": "
    "[{\"text\": \"c\", \"answer_start\": 0}, {\"text\": \"cd\", \"answer_start\": 0}]}]}]},"
    "{\"paragraphs\": [{\"context\": \"ef\", \"qas\": [{\"id\": \"w\", \"question\": \"q\", \"answers\": "
    "[{\"text\": \"f\", \"answer_start\": 1}]}]}]}]}";

typedef struct fixture {
    char dir[600], out[1024], input[700];
    const char *inputs[1];
    byte_encoder be;
    tg_text_encoder enc;
    tg_convert_options opt;
} fixture;

static void fixture_init(fixture *f, const char *out) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s", tg_test_tmpdir());
    snprintf(f->out, sizeof f->out, "%s", out);
    snprintf(f->input, sizeof f->input, "%s/s.json", f->dir);
    tg_test_write_file(f->input, SQUAD);
    f->inputs[0] = f->input;
    f->enc = byte_encoder_make(&f->be, TG_TOKENIZER_WORDPIECE);
    f->opt = (tg_convert_options){.inputs = f->inputs, .n_inputs = 1, .outdir = f->out, .doc_stride = 2, .seq = 16,
                                  .eval_fraction = 0.5, .seed = 1, .command = "test"};
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* The eval files of both splits: which split took article A decides which holds what. */
static int expect_eval_files(const char *out) {
    static const char a_lines[] = "{\"context\":\"ab\",\"offsets\":[0,1,1,2]}\n"
                                  "{\"question\":\"x\",\"context\":0,\"answers\":[\"b\"]}\n"
                                  "{\"window\":0,\"at\":3,\"first\":0,\"count\":2}\n"
                                  "{\"question\":\"y\",\"context\":0,\"answers\":[]}\n"
                                  "{\"window\":1,\"at\":3,\"first\":0,\"count\":2}\n"
                                  "{\"context\":\"cd\",\"offsets\":[0,1,1,2]}\n"
                                  "{\"question\":\"z\",\"context\":1,\"answers\":[\"c\",\"cd\"]}\n"
                                  "{\"window\":2,\"at\":3,\"first\":0,\"count\":2}\n"
                                  "{\"end\":{\"contexts\":2,\"questions\":3,\"windows\":3}}\n";
    static const char b_lines[] = "{\"context\":\"ef\",\"offsets\":[0,1,1,2]}\n"
                                  "{\"question\":\"w\",\"context\":0,\"answers\":[\"f\"]}\n"
                                  "{\"window\":0,\"at\":3,\"first\":0,\"count\":2}\n"
                                  "{\"end\":{\"contexts\":1,\"questions\":1,\"windows\":1}}\n";
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", out, tg_squad_eval_file_name(TG_SPLIT_TRAIN));
    char *train = slurp(path);
    if (!CHECK(train, "%s: not there", path)) return 0;
    const int a_in_train = !strcmp(train, a_lines);
    int ok = CHECK(a_in_train || !strcmp(train, b_lines), "%s holds '%s'", path, train);
    snprintf(path, sizeof path, "%s/%s", out, tg_squad_eval_file_name(TG_SPLIT_EVAL));
    char *eval = slurp(path);
    if (!CHECK(eval, "%s: not there", path)) return 0;
    ok &= CHECK(!strcmp(eval, a_in_train ? b_lines : a_lines), "%s holds '%s'", path, eval);
    tg_squad_eval ev;
    tg_err err = {{0}};
    ok &= CHECK(tg_squad_eval_load(path, &ev, &err) == 0, "%s", err.msg);
    tg_squad_eval_free(&ev);
    return ok;
}

TG_TEST(test_convert_squad_eval_files_exact) {
    char out[700];
    snprintf(out, sizeof out, "%s/qa", tg_test_tmpdir());
    fixture f;
    fixture_init(&f, out);
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&f.opt, &f.enc, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.task == TG_SHARD_QA && rep.units == 4 && rep.records[TG_SPLIT_TRAIN] + rep.records[TG_SPLIT_EVAL] == 4 &&
              rep.answered == 3,
          "%lld units, %lld + %lld records, %lld answered", (long long)rep.units, (long long)rep.records[0],
          (long long)rep.records[1], (long long)rep.answered);
    expect_eval_files(out);
    byte_encoder_free(&f.be);
}

/* An output folder of TG_PATH_MAX - 1 bytes: its temporary folder and the eval files' paths
 * inside it are longer still. */
TG_TEST(test_convert_squad_longest_output_folder) {
    char out[TG_PATH_MAX + 8];
    int n = snprintf(out, sizeof out, "%s", tg_test_tmpdir());
    while (TG_PATH_MAX - 1 - n > 201) {
        n += snprintf(out + n, sizeof out - (size_t)n, "/%0200d", 0);
        mkdir(out, 0755);
    }
    out[n++] = '/';
    while (n < TG_PATH_MAX - 1) out[n++] = 'q';
    out[n] = 0;
    REQUIRE(strlen(out) == TG_PATH_MAX - 1, "%zu bytes", strlen(out));
    fixture f;
    fixture_init(&f, out);
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&f.opt, &f.enc, &rep, &err) == 0, "%s", err.msg);
    expect_eval_files(out);
    byte_encoder_free(&f.be);
}

/* Entries in dir other than s.json (the input). */
static int others_in(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "s.json");
    closedir(d);
    return n;
}

TG_TEST(test_convert_squad_each_allocation_failing) {
    char root[700], out[800];
    snprintf(root, sizeof root, "%s/faults", tg_test_tmpdir());
    mkdir(root, 0755);
    snprintf(out, sizeof out, "%s/qa", root);
    fixture f;
    fixture_init(&f, out);
    tg_convert_report rep;
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(tg_convert(&f.opt, &f.enc, &rep, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 20, "%ld allocations", total);
    tg_shard_remove_tree(out);
    int path_failed = 0, bad = 0;
    for (long k = 0; k < total; k++) {
        err.msg[0] = 0;
        tg_alloc_fail_only(k);
        const int rc = tg_convert(&f.opt, &f.enc, &rep, &err);
        tg_alloc_fail_after(-1);
        path_failed += strstr(err.msg, ": out of memory for the path of squad_train.jsonl") ||
                       strstr(err.msg, ": out of memory for the path of squad_eval.jsonl");
        const int left = others_in(root);
        if (rc == 0) { /* an allocation with a way round it (a cache, a buffer of choice) */
            if (!CHECK(!err.msg[0], "allocation %ld of %ld failed: success, yet '%s'", k, total, err.msg) ||
                !expect_eval_files(out))
                bad++;
            tg_shard_remove_tree(out);
        } else if (rc != -1 || !(strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory")) ||
                   left != 0) {
            if (bad++ < 5)
                CHECK(0, "allocation %ld of %ld failed: rc %d, '%s', %d entries left", k, total, rc, err.msg, left);
        }
    }
    CHECK(bad == 0, "%d of %ld failed allocations went wrong", bad, total);
    CHECK(path_failed == 2, "%d failures named an eval file's path", path_failed);
    byte_encoder_free(&f.be);
}

/* --doc-stride 0 is a stride of 0 (windows that do not overlap), not the default. */
TG_TEST(test_convert_squad_doc_stride_zero) {
    char out[700];
    snprintf(out, sizeof out, "%s/stride0", tg_test_tmpdir());
    fixture f;
    fixture_init(&f, out);
    tg_test_write_file(f.input, "{\"data\": [{\"paragraphs\": [{\"context\": \"abcdefghijklmnopqrst\", \"qas\": [{\"id\": "
                                "\"a\", \"question\": \"q\", \"answers\": [{\"text\": \"n\", \"answer_start\": 13}]}]}]}]}");
    f.opt.doc_stride = 0;
    f.opt.eval_fraction = 0;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&f.opt, &f.enc, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.records[TG_SPLIT_TRAIN] == 2 && rep.records[TG_SPLIT_EVAL] == 0 && rep.answered == 1,
          "%lld records, %lld answered", (long long)rep.records[TG_SPLIT_TRAIN], (long long)rep.answered);
    char path[800];
    snprintf(path, sizeof path, "%s/%s", out, tg_squad_eval_file_name(TG_SPLIT_TRAIN));
    const char *text = slurp(path);
    REQUIRE(text, "%s: not there", path);
    CHECK(strstr(text, "{\"window\":0,\"at\":3,\"first\":0,\"count\":12}\n"
                       "{\"window\":0,\"at\":3,\"first\":12,\"count\":8}\n"
                       "{\"end\":{\"contexts\":1,\"questions\":1,\"windows\":2}}\n") != NULL,
          "%s", text);
    byte_encoder_free(&f.be);
}

/* Under a file-size limit (SIGXFSZ ignored) the eval files' lines stay in their streams'
 * buffers until they close: closing must report the write that fails, for the first file
 * that fails, and the conversion leaves no output. After an earlier error the files close
 * (failing too) without replacing its message. */
static void convert_under_a_size_limit(fixture *f, rlim_t limit, const char *want, const char *not_want,
                                       const char *what) {
    struct rlimit saved, lim;
    if (!CHECK(getrlimit(RLIMIT_FSIZE, &saved) == 0, "getrlimit")) return;
    void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = limit;
    tg_convert_report rep;
    tg_err err = {{0}};
    int rc = 0;
    if (CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit")) {
        rc = tg_convert(&f->opt, &f->enc, &rep, &err);
        setrlimit(RLIMIT_FSIZE, &saved);
    }
    signal(SIGXFSZ, old);
    CHECK(rc == -1 && strstr(err.msg, want) && (!not_want || !strstr(err.msg, not_want)), "%s: rc %d '%s', want '%s'",
          what, rc, err.msg, want);
    struct stat st;
    CHECK(stat(f->out, &st) != 0, "%s: a failed conversion left %s", what, f->out);
}

TG_TEST(test_convert_squad_eval_files_fail_as_they_close) {
    fixture f;
    char out[700], want[200];
    snprintf(out, sizeof out, "%s/limited", tg_test_tmpdir());
    fixture_init(&f, out);
    snprintf(want, sizeof want, "/%s: write error: %s", tg_squad_eval_file_name(TG_SPLIT_TRAIN), strerror(EFBIG));
    convert_under_a_size_limit(&f, 64, want, NULL, "small lines");
    byte_encoder_free(&f.be);

    /* A record the writer refuses after the question's lines went into the buffers: the
     * files close without a second message about their own failed writes. */
    snprintf(out, sizeof out, "%s/limited_refused", tg_test_tmpdir());
    fixture_init(&f, out);
    f.enc.vocab_size = 50; /* a byte's id is 5 + its value: 'a' is 102 */
    convert_under_a_size_limit(&f, 64, "is outside the vocabulary (50)", "write error", "a refused record");
    byte_encoder_free(&f.be);
}
