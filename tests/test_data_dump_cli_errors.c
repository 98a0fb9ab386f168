/* `tunegraph data dump` and `data convert` failures and rarer inputs, run in this process
 * through the CLI that tests/test_cli_metrics.c compiles in (tunegraph_cli_main): outputs
 * that cannot be written (-o /dev/full, standard output on /dev/full), a shard damaged
 * after it was written, a folder that is no set, JSONL files whose first line is blank,
 * long or not an object; convert's report of skipped rows and the command line it records. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "tests/harness.h"

int tunegraph_cli_main(int argc, char **argv);

static const char *test_dir;

/* Runs tunegraph_cli_main on `line` (words split at spaces, each "%s" replaced by the
 * test's folder, a word '' standing for an empty one) with stdout into `stdout_path` (NULL: a file of the test's folder) and
 * stderr captured; its status, and stderr into *err (malloc'd). */
static int dump_cli(const char *line, const char *stdout_path, char **err) {
    char full[4096], words[4096], *argv[64], out_path[700], err_path[700];
    snprintf(full, sizeof full, line, test_dir, test_dir, test_dir, test_dir);
    int argc = 0;
    argv[argc++] = "tunegraph";
    snprintf(words, sizeof words, "%s", full);
    for (char *w = strtok(words, " "); w && argc < 63; w = strtok(NULL, " ")) argv[argc++] = strcmp(w, "''") ? w : "";
    argv[argc] = NULL;
    snprintf(out_path, sizeof out_path, "%s/dump-out.txt", test_dir);
    snprintf(err_path, sizeof err_path, "%s/dump-err.txt", test_dir);
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(STDOUT_FILENO), saved_err = dup(STDERR_FILENO);
    int fo = open(stdout_path ? stdout_path : out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (saved_out < 0 || saved_err < 0 || fo < 0 || fe < 0) return -1;
    dup2(fo, STDOUT_FILENO);
    dup2(fe, STDERR_FILENO);
    close(fo);
    close(fe);
    int status = tunegraph_cli_main(argc, argv);
    fflush(stdout);
    clearerr(stdout);
    fflush(stderr);
    dup2(saved_out, STDOUT_FILENO);
    dup2(saved_err, STDERR_FILENO);
    close(saved_out);
    close(saved_err);
    *err = tg_test_read_file(err_path, NULL);
    return status;
}

static void expect_dump(const char *line, const char *stdout_path, int status, const char *says) {
    char *err = NULL;
    int got = dump_cli(line, stdout_path, &err);
    CHECK(got == status, "tunegraph %s: exit %d, want %d: %s", line, got, status, err ? err : "");
    if (says) CHECK(err && strstr(err, says), "tunegraph %s: stderr lacks '%s': %s", line, says, err ? err : "(none)");
    free(err);
}

static void write_in(const char *name, const char *text) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    CHECK(tg_test_write_file(path, text) == 0, "%s", path);
}

static char *read_in(const char *name) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    return tg_test_read_file(path, NULL);
}

static void write_vocab(void) { write_in("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\n"); }

TG_TEST(test_data_dump_cli_unwritable_outputs) {
    test_dir = tg_test_tmpdir();
    write_vocab();
    write_in("t.txt", "hello world\nworld hello !\n");
    write_in("d.jsonl", "{\"input_ids\": [5, 6]}\n");
    expect_dump("data convert %s/t.txt -o %s/set --tokenizer %s/vocab.txt --format text --seq 8", NULL, 0,
                "lm, 1 train records (7 tokens) from 2 lines");
    /* A set and a JSONL file dumped into /dev/full: the file cannot be put in place. */
    expect_dump("data dump %s/set -o /dev/full", NULL, 1, "/dev/full");
    expect_dump("data dump %s/d.jsonl -o /dev/full", NULL, 1, "/dev/full");
    /* Standard output on /dev/full. */
    expect_dump("data dump %s/set", "/dev/full", 1, "tunegraph: writing standard output failed");
    expect_dump("data dump %s/d.jsonl", "/dev/full", 1, "tunegraph: writing standard output failed");
    /* The same dumps into a file: the records, and the kind each was read as. */
    expect_dump("data dump %s/set -o %s/set.jsonl", NULL, 0, "tunegraph: dumped 1 records (lm)\n");
    char *text = read_in("set.jsonl");
    CHECK(text && !strcmp(text, "{\"input_ids\": [5, 6, 3, 6, 5, 8, 3]}\n"), "set dump: %s", text ? text : "(none)");
    free(text);
}

TG_TEST(test_data_dump_cli_damaged_and_missing_sets) {
    test_dir = tg_test_tmpdir();
    write_vocab();
    write_in("t.txt", "hello world\nworld hello !\n");
    expect_dump("data convert %s/t.txt -o %s/set --tokenizer %s/vocab.txt --format text --seq 8", NULL, 0, NULL);
    /* A shard whose bytes changed after the manifest was written: refused, no output left. */
    char path[800];
    snprintf(path, sizeof path, "%s/set/train/00000.tgshard", test_dir);
    long len = 0;
    char *shard = tg_test_read_file(path, &len);
    REQUIRE(shard && len > 8, "%s", path);
    shard[len - 3] ^= 0x55;
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(shard, 1, (size_t)len, f) == (size_t)len && fclose(f) == 0, "%s", path);
    free(shard);
    expect_dump("data dump %s/set -o %s/out.jsonl", NULL, 1, "00000.tgshard: checksum mismatch");
    snprintf(path, sizeof path, "%s/out.jsonl", test_dir);
    struct stat st;
    CHECK(stat(path, &st) != 0, "a failed dump left %s", path);
    /* A folder that is no set. */
    snprintf(path, sizeof path, "%s/empty", test_dir);
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    expect_dump("data dump %s/empty", NULL, 1, "empty: a folder, but not a shard set (no manifest.json in it");
}

/* The kind of a JSONL file is read from its first line that is not blank: a "label" key
 * makes it classify. */
TG_TEST(test_data_dump_cli_jsonl_first_line) {
    test_dir = tg_test_tmpdir();
    write_in("blank-first.jsonl", "\n   \t\r\n{\"input_ids\": [1, 2], \"label\": 1}\n{\"input_ids\": [3], \"label\": 0}\n");
    expect_dump("data dump %s/blank-first.jsonl -o %s/a.jsonl", NULL, 0, "tunegraph: dumped 2 records (classify)\n");
    char *text = read_in("a.jsonl");
    CHECK(text && !strcmp(text, "{\"input_ids\": [1, 2], \"label\": 1}\n{\"input_ids\": [3], \"label\": 0}\n"), "dump: %s",
          text ? text : "(none)");
    free(text);
    /* A first line of 3000 ids (over 4096 bytes) is read whole. */
    char *big = malloc(40000);
    REQUIRE(big, "malloc");
    char *p = big + sprintf(big, "{\"input_ids\": [");
    for (int i = 0; i < 3000; i++) p += sprintf(p, i ? ", %d" : "%d", 1 + i % 100);
    sprintf(p, "], \"label\": 4}\n");
    write_in("long.jsonl", big);
    expect_dump("data dump %s/long.jsonl -o %s/b.jsonl", NULL, 0, "tunegraph: dumped 1 records (classify)\n");
    text = read_in("b.jsonl");
    CHECK(text && strlen(text) == strlen(big) && !strcmp(text, big), "the long line did not come back as it was");
    free(text);
    free(big);
    /* A first line that is no object: read as lm, whose loader names the line. */
    write_in("array.jsonl", "[1, 2]\n");
    expect_dump("data dump %s/array.jsonl", NULL, 1, "array.jsonl:1");
    /* A file with no line at all. */
    write_in("nothing.jsonl", "");
    expect_dump("data dump %s/nothing.jsonl", NULL, 1, "nothing.jsonl");
}

/* convert reports the rows it left out, and the manifest records the command line with
 * words quoted as a shell would take them back. */
TG_TEST(test_data_dump_cli_convert_reports) {
    test_dir = tg_test_tmpdir();
    write_vocab();
    write_in("bad.txt", "hello world\nworld \xff hello\n");
    expect_dump("data convert %s/bad.txt -o %s/set1 --tokenizer %s/vocab.txt --format text --seq 8 --skip-invalid", NULL,
                0, "tunegraph: left out 1 row that is not UTF-8 (--skip-invalid)");
    write_in("bad2.txt", "hello\n\xff a\n\xfe b\n");
    expect_dump("data convert %s/bad2.txt -o %s/set2 --tokenizer %s/vocab.txt --format text --seq 8 --skip-invalid",
                NULL, 0, "tunegraph: left out 2 rows that are not UTF-8 (--skip-invalid)");
    /* Folders: one file per example, its folder the label. */
    char path[800];
    snprintf(path, sizeof path, "%s/docs", test_dir);
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    snprintf(path, sizeof path, "%s/docs/pos", test_dir);
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    snprintf(path, sizeof path, "%s/docs/neg", test_dir);
    REQUIRE(mkdir(path, 0755) == 0, "%s", path);
    write_in("docs/pos/a.txt", "hello world\n");
    write_in("docs/neg/b.txt", "world\n");
    write_in("docs/neg/c.txt", "\xff\n");
    expect_dump("data convert %s/docs -o %s/set3 --tokenizer %s/vocab.txt --format folders --seq 8 --skip-invalid", NULL,
                0, "tunegraph: left out 1 file that is not UTF-8 (--skip-invalid)");
    write_in("docs/neg/d.txt", "\xfe\n");
    expect_dump("data convert %s/docs -o %s/set4 --tokenizer %s/vocab.txt --format folders --seq 8 --skip-invalid", NULL,
                0, "tunegraph: left out 2 files that are not UTF-8 (--skip-invalid)");
    /* The command line as recorded: a word with a quote or a byte outside printable ASCII
     * is single-quoted, the quote escaped, the byte a '?'. */
    write_in("it's-\xc3\xa9.txt", "hello world\n");
    expect_dump("data convert %s/it's-\xc3\xa9.txt -o %s/set5 --tokenizer %s/vocab.txt --format text --seq 8", NULL, 0,
                "from 1 lines");
    char *manifest = read_in("set5/manifest.json");
    char want[1200];
    snprintf(want, sizeof want, "\"tunegraph data convert '%s/it'\\\\''s-??.txt' -o %s/set5 --tokenizer ", test_dir,
             test_dir);
    CHECK(manifest && strstr(manifest, want), "manifest lacks %s: %s", want, manifest ? manifest : "(none)");
    free(manifest);
}

/* Option values that are empty or start with a blank, and a lone "-" (an input, not an
 * option). */
TG_TEST(test_data_dump_cli_empty_and_blank_values) {
    test_dir = tg_test_tmpdir();
    static const struct { const char *line, *says; } cases[] = {
        {"data convert in.csv --seq ''", "--seq needs a whole number from 2 to 4194304, got ''"},
        {"data convert in.csv --seq \t12", "--seq needs a whole number from 2 to 4194304, got '\t12'"},
        {"data convert in.csv --doc-stride ''", "--doc-stride needs a whole number >= 0, got ''"},
        {"data convert in.csv --eval-fraction ''", "--eval-fraction needs a number in [0, 1), got ''"},
        {"data convert in.csv --seed ''", "--seed needs a whole number from 0 to 2^64-1, got ''"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_dump(cases[i].line, NULL, 2, cases[i].says);
    expect_dump("data convert - -o %s/set --tokenizer %s/none.txt", NULL, 1, "none.txt");
    expect_dump("data dump -", NULL, 1, "tunegraph: -");
}

/* Each allocation of a dump failed in turn, a set's and a JSONL file's: exit 1 with a
 * message, no output file left; a set's file names say so by name. */
TG_TEST(test_data_dump_cli_out_of_memory) {
    test_dir = tg_test_tmpdir();
    write_vocab();
    write_in("t.txt", "hello world\nworld hello !\n");
    write_in("d.jsonl", "\n{\"input_ids\": [5, 6], \"label\": 1}\n");
    expect_dump("data convert %s/t.txt -o %s/set --tokenizer %s/vocab.txt --format text --seq 8", NULL, 0, NULL);
    static const char *const lines[] = {"data dump %s/set -o %s/out.jsonl", "data dump %s/d.jsonl -o %s/out.jsonl"};
    char out[800];
    snprintf(out, sizeof out, "%s/out.jsonl", test_dir);
    for (int l = 0; l < 2; l++) {
        int failures = 0, named = 0, done = 0;
        for (long k = 0; k < 5000 && !done; k++) {
            remove(out);
            char *err = NULL;
            tg_alloc_fail_after(k);
            int status = dump_cli(lines[l], NULL, &err);
            tg_alloc_fail_after(-1);
            struct stat st;
            if (status == 0) {
                done = 1;
                CHECK(stat(out, &st) == 0, "%s: success without the output", lines[l]);
            } else {
                failures++;
                named += err && strstr(err, "out of memory for the set's file names") != NULL;
                CHECK(status == 1 && err && !strncmp(err, "tunegraph: ", 11) && strlen(err) > 20,
                      "%s, allocation %ld: exit %d: %s", lines[l], k, status, err ? err : "");
                CHECK(stat(out, &st) != 0, "%s, allocation %ld: a failed dump left its output", lines[l], k);
            }
            free(err);
        }
        CHECK(done && failures > 3, "%s: %d failures, done %d", lines[l], failures, done);
        if (l == 0) CHECK(named >= 2, "the set's file names failed %d times by name", named);
    }
}
