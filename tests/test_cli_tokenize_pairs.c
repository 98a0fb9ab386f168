/* `tunegraph tokenize --pair` (cli/tokenize.c): each line split at its first TAB into text
 * and pair, the pair ending where the line does (before its '\n', or at the end of a last
 * line without one), byte for byte: with a byte-level BPE tokenizer, where a newline or a
 * NUL byte would be a token of its own, and with WordPiece's template ([CLS] a [SEP] b
 * [SEP]); --max-len and --no-special on pairs; a line without a TAB or with a pair that is
 * not UTF-8 stops the command with its line number, after the lines before it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* `tunegraph tokenize ARGS` with stdin the `len` bytes of `in`; its status, stdout and
 * stderr (malloc'd) in *out and *err. */
static int tokenize(const char *dir, const char *args, const char *in, size_t len, char **out, char **err) {
    char in_path[700], out_path[700], err_path[700], cmd[3000];
    snprintf(in_path, sizeof in_path, "%s/in.txt", dir);
    snprintf(out_path, sizeof out_path, "%s/out.txt", dir);
    snprintf(err_path, sizeof err_path, "%s/err.txt", dir);
    FILE *f = fopen(in_path, "wb");
    if (!f || fwrite(in, 1, len, f) != len || fclose(f) != 0) return -100;
    snprintf(cmd, sizeof cmd, "%s tokenize %s <%s >%s 2>%s", tg_test_cli(), args, in_path, out_path, err_path);
    const int st = system(cmd);
    *out = tg_test_read_file(out_path, NULL);
    *err = tg_test_read_file(err_path, NULL);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct pair_case {
    const char *args; /* after --tokenizer PATH */
    const char *in;
    size_t len;       /* of in: it may hold a NUL byte */
    int rc;
    const char *out, *err;
} pair_case;

#define IN(s) s, sizeof s - 1

static void run_cases(const char *dir, const char *tokenizer, const pair_case *cases, size_t n) {
    for (size_t k = 0; k < n; k++) {
        char args[1200], *out = NULL, *err = NULL;
        snprintf(args, sizeof args, "--tokenizer %s %s", tokenizer, cases[k].args);
        const int rc = tokenize(dir, args, cases[k].in, cases[k].len, &out, &err);
        CHECK(rc == cases[k].rc && out && !strcmp(out, cases[k].out) && err && !strcmp(err, cases[k].err),
              "case %zu (%s): exit %d (want %d), stdout '%s' (want '%s'), stderr '%s' (want '%s')", k, cases[k].args, rc,
              cases[k].rc, out ? out : "(none)", cases[k].out, err ? err : "(none)", cases[k].err);
        free(out);
        free(err);
    }
}

/* GPT-2's byte-level BPE (tests/text_fixtures.h): no template tokens; "hello" 259,
 * "Ġworld" 264, "or" 261, "ld" 263, and each byte's own token the byte's value ('w' 119,
 * ' ' 32, TAB 9, '\r' 13; a '\n' or a NUL taken into the pair would add 10 or 0). */
TG_TEST(test_cli_tokenize_pairs_byte_level) {
    const char *dir = tg_test_tmpdir();
    char folder[700], path[800];
    snprintf(folder, sizeof folder, "%s/gpt2", dir);
    snprintf(path, sizeof path, "mkdir -p %s", folder);
    REQUIRE(system(path) == 0, "%s", path);
    char *vocab = tg_test_bpe_vocab_json("");
    snprintf(path, sizeof path, "%s/vocab.json", folder);
    REQUIRE(tg_test_write_file(path, vocab) == 0, "%s", path);
    free(vocab);
    snprintf(path, sizeof path, "%s/merges.txt", folder);
    REQUIRE(tg_test_write_file(path, tg_test_bpe_merges) == 0, "%s", path);
    static const pair_case cases[] = {
        {"--pair --offsets", IN("hello\tworld\n"), 0, "259:0-5 119:0-1 261:1-3 263:3-5\n", ""},
        /* the last line without its '\n': the pair ends at the end of the input */
        {"--pair --offsets", IN("hello\tworld"), 0, "259:0-5 119:0-1 261:1-3 263:3-5\n", ""},
        {"--pair --offsets",
         IN("hello world\t hello\n\t world\nhello\t\nhello\tworld\thello\nhello\t world"), 0,
         "259:0-5 264:5-11 32:0-1 259:1-6\n264:0-6\n259:0-5\n259:0-5 119:0-1 261:1-3 263:3-5 9:5-6 259:6-11\n"
         "259:0-5 264:0-6\n",
         ""},
        /* a '\r' before the '\n' is the pair's own byte */
        {"--pair --offsets", IN("hello\tworld\r\n"), 0, "259:0-5 119:0-1 261:1-3 263:3-5 13:5-6\n", ""},
        {"--pair", IN("hello\tworld\n"), 0, "259 119 261 263\n", ""},
        {"--pair --max-len 3", IN("hello\t world hello\n"), 0, "259 264 32\n", ""},
        {"--pair", IN("hello\tworld\nhello\n"), 1, "259 119 261 263\n", "tunegraph tokenize: stdin:2: no TAB between text and pair\n"},
        {"--pair", IN("\n"), 1, "", "tunegraph tokenize: stdin:1: no TAB between text and pair\n"},
        {"--pair", IN("hello\tw\xff\n"), 1, "", "tunegraph tokenize: stdin:1: pair: invalid UTF-8 at byte 1\n"},
        /* without --pair a TAB is text */
        {"--offsets", IN("hello\tworld\n"), 0, "259:0-5 9:5-6 119:6-7 261:7-9 263:9-11\n", ""},
    };
    run_cases(dir, folder, cases, sizeof cases / sizeof cases[0]);
}

/* WordPiece: [CLS] 2, [SEP] 3, hello 5, world 6, [UNK] 1. */
TG_TEST(test_cli_tokenize_pairs_wordpiece) {
    const char *dir = tg_test_tmpdir();
    char vocab[700];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    REQUIRE(tg_test_write_file(vocab, "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n") == 0, "vocab");
    static const pair_case cases[] = {
        {"--pair --offsets", IN("hello\tworld\nhello world\t\n\tworld\nhello\tworld\thello\nworld\t hello"), 0,
         "2:- 5:0-5 3:- 6:0-5 3:-\n2:- 5:0-5 6:6-11 3:- 3:-\n2:- 3:- 6:0-5 3:-\n2:- 5:0-5 3:- 6:0-5 5:6-11 3:-\n"
         "2:- 6:0-5 3:- 5:1-6 3:-\n",
         ""},
        {"--pair --max-len 6", IN("hello world hello\tworld hello world\n"), 0, "2 5 3 6 5 3\n", ""},
        {"--pair --no-special", IN("hello\tworld\n"), 0, "5 6\n", ""},
        {"--pair --no-special --offsets", IN("hello\tworld x\n"), 0, "5:0-5 6:0-5 1:6-7\n", ""},
        {"--pair", IN("hello\twor\xffld\n"), 1, "", "tunegraph tokenize: stdin:1: pair: invalid UTF-8 at byte 3\n"},
        {"--pair", IN("hel\xfflo\tworld\n"), 1, "", "tunegraph tokenize: stdin:1: text: invalid UTF-8 at byte 3\n"},
        {"--pair", IN("hello\tworld\n\n"), 1, "2 5 3 6 3\n", "tunegraph tokenize: stdin:2: no TAB between text and pair\n"},
    };
    run_cases(dir, vocab, cases, sizeof cases / sizeof cases[0]);
}
