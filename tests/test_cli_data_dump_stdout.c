/* `tunegraph data dump` onto standard output, in this process (tests/cli_in_process.h):
 * the exact lines and report of a set and of a JSONL file, and every allocation of a set's
 * dump failed in turn: a record that cannot be read after lines went out ends the command
 * with exit 1 and its message, never with the report of a finished dump. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

static char line_buf[2048];

/* `fmt` with every %s the test's folder. */
static const char *in_dir(const char *dir, const char *fmt) {
    snprintf(line_buf, sizeof line_buf, fmt, dir, dir, dir, dir);
    return line_buf;
}

static void write_at(const char *dir, const char *name, const char *text) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(tg_test_write_file(path, text) == 0, "%s", path);
}

TG_TEST(test_cli_data_dump_stdout_exact) {
    const char *dir = tg_test_tmpdir();
    write_at(dir, "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\n");
    write_at(dir, "rows.csv", "text,label\nhello world,pos\n\"world, hello\",neg\nhello !,pos\n");
    tg_cli_run r = tg_test_cli_line(
        dir, in_dir(dir, "data convert %s/rows.csv -o %s/set --tokenizer %s/vocab.txt --labels neg,pos --seq 8"), NULL);
    CHECK(r.status == 0 && r.err &&
              !strcmp(r.err, in_dir(dir, "tunegraph: wrote %s/set: classify with 2 labels, 3 train records (13 tokens) "
                                         "from 3 rows\n")),
          "convert: exit %d, said '%s'", r.status, r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/set"), NULL);
    CHECK(r.status == 0 && r.err && !strcmp(r.err, "tunegraph: dumped 3 records (classify, labels: neg,pos from the manifest)\n"),
          "dump: exit %d, said '%s'", r.status, r.err ? r.err : "(nothing)");
    CHECK(r.out && !strcmp(r.out, "{\"input_ids\": [2, 5, 6, 3], \"label\": 1}\n"
                                  "{\"input_ids\": [2, 6, 7, 5, 3], \"label\": 0}\n"
                                  "{\"input_ids\": [2, 5, 8, 3], \"label\": 1}\n"),
          "stdout: '%s'", r.out ? r.out : "(none)");
    tg_cli_run_free(&r);
    /* the train split named, and the eval split it does not have */
    r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/set/train"), NULL);
    CHECK(r.status == 0 && r.out && !strncmp(r.out, "{\"input_ids\": [2, 5, 6, 3], \"label\": 1}\n", 40),
          "train: exit %d, stdout '%s'", r.status, r.out ? r.out : "(none)");
    tg_cli_run_free(&r);
    r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/set/eval"), NULL);
    CHECK(r.status == 1 && r.out && !r.out[0] && r.err &&
              !strcmp(r.err, in_dir(dir, "tunegraph: %s/set: the set has no eval records (convert with --eval-fraction "
                                         "to make an eval split)\n")),
          "eval: exit %d, said '%s'", r.status, r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    /* a JSONL file with token types, lm (no label on its first line) */
    write_at(dir, "pairs.jsonl", "{\"input_ids\": [1, 2, 3], \"token_type_ids\": [0, 0, 1]}\n{\"input_ids\": [4]}\n");
    r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/pairs.jsonl"), NULL);
    CHECK(r.status == 0 && r.err && !strcmp(r.err, "tunegraph: dumped 2 records (lm)\n"), "jsonl: exit %d, said '%s'",
          r.status, r.err ? r.err : "(nothing)");
    CHECK(r.out && !strcmp(r.out, "{\"input_ids\": [1, 2, 3], \"token_type_ids\": [0, 0, 1]}\n{\"input_ids\": [4]}\n"),
          "jsonl stdout: '%s'", r.out ? r.out : "(none)");
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_data_dump_stdout_out_of_memory) {
    const char *dir = tg_test_tmpdir();
    write_at(dir, "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\n");
    write_at(dir, "t.txt", "hello world\nworld hello !\n");
    tg_cli_run r = tg_test_cli_line(
        dir, in_dir(dir, "data convert %s/t.txt -o %s/set --tokenizer %s/vocab.txt --format text --seq 8"), NULL);
    REQUIRE(r.status == 0, "convert: %s", r.err ? r.err : "(nothing)");
    tg_cli_run_free(&r);
    static const char want_out[] = "{\"input_ids\": [5, 6, 3, 6, 5, 8, 3]}\n";
    int failures = 0, frame_failures = 0, done = 0;
    for (long k = 0; k < 5000 && !done; k++) {
        tg_alloc_fail_after(k);
        r = tg_test_cli_line(dir, in_dir(dir, "data dump %s/set"), NULL);
        tg_alloc_fail_after(-1);
        if (r.status == 0) {
            done = 1;
            CHECK(r.out && !strcmp(r.out, want_out) && r.err && !strcmp(r.err, "tunegraph: dumped 1 records (lm)\n"),
                  "allocation %ld: exit 0, stdout '%s', said '%s'", k, r.out ? r.out : "(none)", r.err ? r.err : "");
        } else {
            failures++;
            frame_failures += r.err && strstr(r.err, "out of memory for a ") && strstr(r.err, "-byte frame");
            CHECK(r.status == 1 && r.err && !strncmp(r.err, "tunegraph: ", 11) && strstr(r.err, "out of memory") &&
                      !strstr(r.err, "dumped"),
                  "allocation %ld: exit %d, said '%s'", k, r.status, r.err ? r.err : "(nothing)");
        }
        tg_cli_run_free(&r);
    }
    CHECK(done && failures > 3, "%d failures, done %d", failures, done);
    /* the frame buffers are allocated as the first record is read */
    CHECK(frame_failures >= 1, "no failure while reading a record (%d)", frame_failures);
}
