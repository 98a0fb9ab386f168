/* `tunegraph tokenize`'s options and streams: each usage error with its exit status 2 and
 * message, --help, --offsets with template tokens, output longer than the command's 64 KiB
 * buffer (byte for byte), and the errors of a stdout that cannot be written (/dev/full),
 * mid-stream or at the end, and a stdin that cannot be read (a folder). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/harness.h"

/* Runs `tunegraph tokenize ARGS` with stdin from `in` (a path) and stdout to `out` (a
 * path); stderr goes to dir/stderr.txt. Returns the exit status. */
static int run(const char *dir, const char *args, const char *in, const char *out) {
    char cmd[2400];
    snprintf(cmd, sizeof cmd, "%s tokenize %s <%s >%s 2>%s/stderr.txt", tg_test_cli(), args, in, out, dir);
    const int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int file_has(const char *path, const char *want, int exact) {
    char *got = tg_test_read_file(path, NULL);
    const int ok = got && (exact ? !strcmp(got, want) : strstr(got, want) != NULL);
    CHECK(ok, "%s: '%.300s', want %s'%.300s'", path, got ? got : "(none)", exact ? "" : "one holding ", want);
    free(got);
    return ok;
}

TG_TEST(test_tokenizer_cli_usage_errors) {
    const char *dir = tg_test_tmpdir();
    char in[700], out[700], err[700], vocab[700], args[1200];
    snprintf(in, sizeof in, "%s/in.txt", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(in, "hello\n") == 0 && tg_test_write_file(vocab, "[UNK]\n[CLS]\n[SEP]\nhello\n") == 0,
            "fixtures");
    static const struct {
        const char *args, *want;
    } bad[] = {
        {"--tokenizer", "tunegraph tokenize: --tokenizer needs a value\nusage: tunegraph tokenize"},
        {"--max-len", "tunegraph tokenize: --max-len needs a value"},
        {"--max-len ''", "--max-len needs a whole number from 1 to 16777216, got ''"},
        {"--max-len abc", "--max-len needs a whole number from 1 to 16777216, got 'abc'"},
        {"--max-len 5x", "got '5x'"},
        {"--max-len 0", "got '0'"},
        {"--max-len -3", "got '-3'"},
        {"--max-len 16777217", "got '16777217'"},
        {"--max-len 99999999999999999999", "got '99999999999999999999'"},
        {"--bogus", "tunegraph tokenize: unexpected argument --bogus"},
        {"--offsets --no-special", "--tokenizer PATH is required"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        CHECK(run(dir, bad[k].args, in, out) == 2, "'%s' is not a usage error", bad[k].args);
        file_has(err, bad[k].want, 0);
    }
    /* the largest --max-len is taken */
    snprintf(args, sizeof args, "--tokenizer %s --max-len 16777216", vocab);
    CHECK(run(dir, args, in, out) == 0, "--max-len 16777216 refused");
    file_has(out, "1 3 2\n", 1);
    for (int k = 0; k < 2; k++) {
        CHECK(run(dir, k ? "-h" : "--help", in, out) == 0, "help failed");
        file_has(out, "usage: tunegraph tokenize --tokenizer PATH [--pair] [--max-len N] [--no-special] [--offsets]\n", 0);
    }
}

TG_TEST(test_tokenizer_cli_streams) {
    const char *dir = tg_test_tmpdir();
    char in[700], out[700], err[700], vocab[700], args[1200];
    snprintf(in, sizeof in, "%s/in.txt", dir);
    snprintf(out, sizeof out, "%s/out.txt", dir);
    snprintf(err, sizeof err, "%s/stderr.txt", dir);
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(vocab, "[UNK]\n[CLS]\n[SEP]\nhello\n") == 0, "vocab");

    /* --offsets with the template: its tokens as ID:- */
    REQUIRE(tg_test_write_file(in, "hello x\n") == 0, "input");
    snprintf(args, sizeof args, "--tokenizer %s --offsets", vocab);
    CHECK(run(dir, args, in, out) == 0, "--offsets failed");
    file_has(out, "1:- 3:0-5 0:6-7 2:-\n", 1);

    /* 3 lines of 20,000 words: over 64 KiB of output, flushed on the way */
    const int words = 20000, lines = 3;
    char *text = malloc((size_t)words * 6 * lines + 1), *want = malloc((size_t)words * 2 * lines + 64);
    REQUIRE(text && want, "out of memory");
    size_t nt = 0, nw = 0;
    for (int l = 0; l < lines; l++) {
        nw += (size_t)sprintf(want + nw, "1");
        for (int i = 0; i < words; i++) {
            memcpy(text + nt, i + 1 < words ? "hello " : "hello\n", 6);
            nt += 6;
            memcpy(want + nw, " 3", 2);
            nw += 2;
        }
        nw += (size_t)sprintf(want + nw, " 2\n");
    }
    text[nt] = 0;
    REQUIRE(tg_test_write_file(in, text) == 0, "input");
    snprintf(args, sizeof args, "--tokenizer %s", vocab);
    CHECK(run(dir, args, in, out) == 0, "long lines failed");
    file_has(out, want, 1);
    /* the same to /dev/full: the first 64 KiB written fails */
    CHECK(run(dir, args, in, "/dev/full") == 1, "long lines to /dev/full succeeded");
    file_has(err, "tunegraph tokenize: writing stdout failed: No space left on device", 0);
    free(text);
    free(want);

    /* a line that fails, with stdout failing too: the line's error alone */
    REQUIRE(tg_test_write_file(in, "hello\nbad \xff\n") == 0, "input");
    CHECK(run(dir, args, in, "/dev/full") == 1, "a bad line to /dev/full succeeded");
    if (file_has(err, "tunegraph tokenize: stdin:2: text: invalid UTF-8 at byte 4", 0)) {
        char *e = tg_test_read_file(err, NULL);
        CHECK(e && !strstr(e, "writing stdout failed"), "a second error after the line's: '%s'", e ? e : "");
        free(e);
    }

    /* stdout that takes nothing; stdin that is a folder */
    REQUIRE(tg_test_write_file(in, "hello\n") == 0, "input");
    CHECK(run(dir, args, in, "/dev/full") == 1, "writing to /dev/full succeeded");
    file_has(err, "tunegraph tokenize: writing stdout failed: No space left on device", 0);
    CHECK(run(dir, args, dir, out) == 1, "reading a folder succeeded");
    file_has(err, "tunegraph tokenize: reading stdin failed: Is a directory", 0);
}
