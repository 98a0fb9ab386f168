/* `tunegraph data dump` in its rarer cases, in this process (tests/cli_in_process.h): an
 * output file whose stream cannot be made (fdopen out of memory), and a JSONL file whose
 * first line is longer than any line the loader reads (the labels are not looked for past
 * that length; the loader's message names the file); a set whose train split has no
 * records. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "base/alloc.h"
#include "datasets/dataset.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/libc_faults.h"

static char line_buf[2048];

/* `fmt` with every %s the test's folder. */
static const char *in_dir(const char *dir, const char *fmt) {
    snprintf(line_buf, sizeof line_buf, fmt, dir, dir, dir, dir);
    return line_buf;
}

TG_TEST(test_cli_data_dump_rarer_stream_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/pairs.jsonl", dir);
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [1, 2, 3]}\n") == 0, "%s", path);
    tg_test_fail_fdopen(1);
    tg_cli_run r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/pairs.jsonl -o %s/out.jsonl"), NULL);
    tg_test_fail_fdopen(0);
    CHECK(r.status == 1 && r.err && !strcmp(r.err, "tunegraph: out of memory for the dump's stream\n"),
          "exit %d, said '%s'", r.status, r.err ? r.err : "(nothing)");
    struct stat st;
    snprintf(path, sizeof path, "%s/out.jsonl", dir);
    CHECK(stat(path, &st) != 0 && errno == ENOENT, "%s was written", path);
    tg_cli_run_free(&r);
    /* The same command with its stream writes the file. */
    r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/pairs.jsonl -o %s/out.jsonl"), NULL);
    char *text = tg_test_read_file(path, NULL);
    CHECK(r.status == 0 && text && !strcmp(text, "{\"input_ids\": [1, 2, 3]}\n"), "exit %d, wrote '%s'", r.status,
          text ? text : "(nothing)");
    free(text);
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_data_dump_rarer_first_line_too_long) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/long.jsonl", dir);
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "%s", path);
    /* {"label": 1, "input_ids": [1, 1, ...]} past the longest line read */
    fputs("{\"label\": 1, \"input_ids\": [1", f);
    for (long n = 0; n < TG_JSONL_MAX_LINE_BYTES / 3 + 1; n++) fputs(", 1", f);
    fputs("]}\n", f);
    REQUIRE(fclose(f) == 0, "%s", path);
    tg_cli_run r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/long.jsonl"), NULL);
    char want[1024];
    snprintf(want, sizeof want,
             "tunegraph: %s:1: line is longer than 16777216 bytes (16 MiB), the limit for a JSON Lines row; is this a "
             "JSON Lines file?\n",
             path);
    CHECK(r.status == 1 && r.out && !r.out[0] && r.err && !strcmp(r.err, want), "exit %d, said '%s'", r.status,
          r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    remove(path);
}

/* A set whose manifest gives its train split no records (only an eval split): dumping the
 * train split is refused, without the eval split's hint. */
TG_TEST(test_cli_data_dump_rarer_train_split_empty) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n") == 0, "%s", path);
    snprintf(path, sizeof path, "%s/t.txt", dir);
    REQUIRE(tg_test_write_file(path, "hello world\nworld hello\nhello\nworld\n") == 0, "%s", path);
    tg_cli_run r = tg_test_cli_line(
        dir, in_dir(dir, "data convert %s/t.txt -o %s/set --tokenizer %s/vocab.txt --format text --seq 8 --eval-fraction 0.5"),
        NULL);
    REQUIRE(r.status == 0, "convert: %s", r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    /* The train split taken out of the manifest. */
    snprintf(path, sizeof path, "%s/set/manifest.json", dir);
    json_error_t e;
    json_t *m = json_load_file(path, 0, &e);
    REQUIRE(m, "%s: %s", path, e.text);
    json_object_set_new(json_object_get(m, "records"), "train", json_integer(0));
    json_object_set_new(json_object_get(m, "tokens"), "train", json_integer(0));
    json_object_set_new(json_object_get(m, "length_histogram"), "train", json_pack("[i]", 0));
    json_t *shards = json_object_get(m, "shards"), *kept = json_array();
    for (size_t i = 0; i < json_array_size(shards); i++) {
        json_t *s = json_array_get(shards, i);
        if (strcmp(json_string_value(json_object_get(s, "split")), "train")) json_array_append(kept, s);
    }
    json_object_set_new(m, "shards", kept);
    REQUIRE(json_dump_file(m, path, JSON_INDENT(2)) == 0, "%s", path);
    json_decref(m);
    r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/set/train"), NULL);
    CHECK(r.status == 1 && r.out && !r.out[0] && r.err && !strcmp(r.err, in_dir(dir, "tunegraph: %s/set: the set has no train records\n")),
          "exit %d, said '%s'", r.status, r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    /* Its eval split still dumps. */
    r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/set/eval"), NULL);
    CHECK(r.status == 0 && r.err && !strcmp(r.err, "tunegraph: dumped 1 records (lm)\n"), "eval: exit %d, said '%s'",
          r.status, r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
}

/* A set dumped onto a full standard output (/dev/full), each allocation failed in turn: its
 * first frame holds 64 long rows, its second (larger: 3000 short rows and their ends) grows
 * the reader's block buffer after the first rows went out. A dump that fails says why (the
 * allocation, never the output); the one that completes says standard output failed. */
TG_TEST(test_cli_data_dump_rarer_full_stdout) {
    const char *dir = tg_test_tmpdir();
    char path[800];
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(path, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n") == 0, "%s", path);
    snprintf(path, sizeof path, "%s/rows.csv", dir);
    FILE *f = fopen(path, "w");
    REQUIRE(f, "%s", path);
    fputs("text,label\n", f);
    for (int r = 0; r < 64; r++) {
        for (int w = 0; w < 126; w++) fputs(w ? " hello" : "hello", f);
        fputs(",pos\n", f);
    }
    for (int r = 0; r < 3000; r++) fputs("world,neg\n", f);
    REQUIRE(fclose(f) == 0, "%s", path);
    tg_cli_run r = tg_test_cli_line(
        dir, in_dir(dir, "data convert %s/rows.csv -o %s/set --tokenizer %s/vocab.txt --labels neg,pos --seq 128"), NULL);
    REQUIRE(r.status == 0, "convert: %s", r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    int failures = 0, done = 0;
    for (long k = 0; k < 500 && !done; k++) {
        tg_alloc_fail_after(k);
        r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/set"), "/dev/full");
        tg_alloc_fail_after(-1);
        done = r.err && !strcmp(r.err, "tunegraph: writing standard output failed\n");
        if (!done) {
            failures++;
            CHECK(r.status == 1 && r.err && !strncmp(r.err, "tunegraph: ", 11) && strstr(r.err, "out of memory") &&
                      strchr(r.err, '\n') == r.err + strlen(r.err) - 1,
                  "allocation %ld: exit %d, said '%s'", k, r.status, r.err ? r.err : "(nothing)");
        }
        CHECK(r.status == 1, "allocation %ld: exit %d", k, r.status);
        tg_cli_run_free(&r);
    }
    CHECK(done && failures > 3, "%d failures, done %d", failures, done);
}
