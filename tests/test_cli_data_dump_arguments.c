/* `tunegraph data dump`'s command line and its SET (cli/data_dump.c), in this process
 * (tests/cli_in_process.h): every refusal of its words with the usage after it, a set
 * named by a path as long as a path may be (its folder whole, not cut), and how the kind
 * of a JSONL file is read from its first line: in blocks of 4096 bytes, doubled as the
 * line needs, an allocation that fails there reading the file as lm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "plan/plan.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

static const char k_data_usage[] =
    "usage:\n"
    "  tunegraph data convert INPUT... -o OUTDIR --tokenizer PATH\n"
    "                [--format csv|tsv|jsonl|squad|text|folders|instruct] [--template FILE]\n"
    "                [--text-column NAME] [--pair-column NAME] [--label-column NAME] [--labels A,B,...]\n"
    "                [--seq N] [--doc-stride N] [--eval-fraction F] [--seed S] [--skip-invalid]\n"
    "  tunegraph data convert IMAGES -o OUTDIR --format idx [--labels FILE] [--image-size N]\n"
    "                [--eval-fraction F] [--seed N]\n"
    "                IMAGES: MNIST's IDX images file, plain or gzip'd (.gz)\n"
    "  tunegraph data convert ROOT -o OUTDIR --format images [--image-size N] [--channels 1|3]\n"
    "                [--eval-fraction F] [--seed N]\n"
    "                ROOT: a folder per label (ROOT/LABEL/FILE) of PNG and JPEG files\n"
    "  tunegraph data dump SET [-o FILE.jsonl]\n"
    "                SET: a shard set (OUTDIR, OUTDIR/train, OUTDIR/eval) or a .jsonl file; its records\n"
    "                as pre-tokenized JSON Lines, in order (standard output without -o)\n"
    "See README.md (Data) for the formats and the shard set it writes.\n";

static void write_at(const char *dir, const char *name, const char *text) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(tg_test_write_file(path, text) == 0, "%s", path);
}

/* argv (NULL-terminated, "tunegraph" first) exits `status`, with exactly `out` on stdout
 * and `err` on stderr. */
static void expect_argv(const char *dir, char **argv, int status, const char *out, const char *err) {
    int argc = 0;
    while (argv[argc]) argc++;
    tg_cli_run r = tg_test_cli_argv(dir, argc, argv, NULL);
    CHECK(r.status == status && r.out && !strcmp(r.out, out) && r.err && !strcmp(r.err, err),
          "%s %s %s: exit %d (want %d), stdout '%s' (want '%s'), stderr\n'%s'\nwant\n'%s'", argv[1], argc > 2 ? argv[2] : "",
          argc > 3 ? argv[3] : "", r.status, status, r.out ? r.out : "(none)", out, r.err ? r.err : "(none)", err);
    tg_cli_run_free(&r);
}

TG_TEST(test_cli_data_dump_arguments_refused) {
    const char *dir = tg_test_tmpdir();
    char a[800], b[800];
    snprintf(a, sizeof a, "%s/a.jsonl", dir);
    snprintf(b, sizeof b, "%s/b.jsonl", dir);
    write_at(dir, "a.jsonl", "{\"input_ids\": [1, 2]}\n");
    static const struct {
        const char *words[5], *message;
    } cases[] = {
        {{NULL}, "missing SET (a shard set, OUTDIR/train, OUTDIR/eval or a .jsonl file)"},
        {{"-x"}, "unknown option -x"},
        {{"A", "-x"}, "unknown option -x"},
        {{"--o", "x"}, "unknown option --o"},
        {{"--", "A"}, "unknown option --"},
        {{"A", "-o"}, "-o needs a value"},
        {{"-o"}, "-o needs a value"},
        {{"A", "B"}, "data dump takes one SET, got a second: %s"},
        {{"-o", "A"}, "missing SET (a shard set, OUTDIR/train, OUTDIR/eval or a .jsonl file)"},
        {{"A", "B", "-x"}, "data dump takes one SET, got a second: %s"},
        {{"-o", "out", "A", "-"}, "data dump takes one SET, got a second: -"},
    };
    char want[4096];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *argv[10] = {"tunegraph", "data", "dump"};
        int n = 3;
        for (int w = 0; w < 5 && cases[c].words[w]; w++)
            argv[n++] = !strcmp(cases[c].words[w], "A") ? a : !strcmp(cases[c].words[w], "B") ? b : (char *)cases[c].words[w];
        argv[n] = NULL;
        char message[1024];
        snprintf(message, sizeof message, cases[c].message, b); /* "%s": the second SET */
        snprintf(want, sizeof want, "tunegraph: %s\n%s", message, k_data_usage);
        expect_argv(dir, argv, 2, "", want);
    }
    /* the refusals wrote no output file */
    char out[800];
    snprintf(out, sizeof out, "%s/out", dir);
    CHECK(tg_test_read_file(out, NULL) == NULL, "a refused dump wrote %s", out);
    /* "-" alone is a SET (a file of that name), not an option */
    char *argv[] = {"tunegraph", "data", "dump", "-", NULL};
    expect_argv(dir, argv, 1, "", "tunegraph: -: cannot open dataset: No such file or directory\n");
    /* -o before the SET, and the SET's records in the file */
    char *to_file[] = {"tunegraph", "data", "dump", "-o", out, a, NULL};
    expect_argv(dir, to_file, 0, "", "tunegraph: dumped 1 records (lm)\n");
    char *text = tg_test_read_file(out, NULL);
    CHECK(text && !strcmp(text, "{\"input_ids\": [1, 2]}\n"), "%s: '%s'", out, text ? text : "(none)");
    free(text);
}

/* A set named by the longest path a set's name may have (TG_PATH_MAX bytes, made long
 * with "./"), and its train split by one as long: dumped whole. One byte more is no set. */
TG_TEST(test_cli_data_dump_arguments_longest_set_path) {
    const char *dir = tg_test_tmpdir();
    write_at(dir, "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n");
    write_at(dir, "t.txt", "hello world\nworld\n");
    char line[4096];
    snprintf(line, sizeof line, "data convert %s/t.txt -o %s/set --tokenizer %s/vocab.txt --format text --seq 4", dir, dir,
             dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "convert: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    static const char want_out[] = "{\"input_ids\": [5, 6, 3, 6]}\n";
    for (int train = 0; train < 2; train++) {
        for (int extra = 0; extra < 2; extra++) {
            char path[TG_PATH_MAX + 64];
            const char *tail = train ? "set/train" : "set";
            int n = snprintf(path, sizeof path, "%s/", dir);
            /* "./" until the name with its tail is TG_PATH_MAX bytes (+ 1 with a "/" more) */
            while (n + 2 + (int)strlen(tail) <= TG_PATH_MAX) n += snprintf(path + n, sizeof path - (size_t)n, "./");
            if (n + (int)strlen(tail) < TG_PATH_MAX) n += snprintf(path + n, sizeof path - (size_t)n, "/");
            n += snprintf(path + n, sizeof path - (size_t)n, "%s%s", tail, extra ? "/" : "");
            REQUIRE(n == TG_PATH_MAX + extra, "path of %d bytes", n);
            char *argv[] = {"tunegraph", "data", "dump", path, NULL};
            r = tg_test_cli_argv(dir, 4, argv, NULL);
            if (!extra)
                CHECK(r.status == 0 && r.out && !strcmp(r.out, want_out) && r.err &&
                          !strcmp(r.err, "tunegraph: dumped 1 records (lm)\n"),
                      "%s of %d bytes: exit %d, stdout '%s', stderr '%s'", tail, n, r.status, r.out ? r.out : "",
                      r.err ? r.err : "");
            else
                CHECK(r.status == 1 && r.out && !r.out[0] && r.err && strstr(r.err, ": dataset path is too long\n"),
                      "%s of %d bytes: exit %d, stderr '%s'", tail, n, r.status, r.err ? r.err : "");
            tg_cli_run_free(&r);
        }
    }
}

/* How many of a dump's allocations, each failed alone, leave the JSONL file read as lm:
 * those of reading its first line for a "label" key. -1 when a failure ends otherwise than
 * in that reading or a message naming the shortage. */
static int allocations_read_as_lm(const char *dir, const char *path, const char *classify_out) {
    int as_lm = 0, done = 0;
    char *argv[] = {"tunegraph", "data", "dump", (char *)path, NULL};
    for (long k = 0; k < 2000 && !done; k++) {
        tg_alloc_fail_only(k);
        tg_cli_run r = tg_test_cli_argv(dir, 4, argv, NULL);
        tg_alloc_fail_after(-1);
        if (r.status == 0 && r.err && !strcmp(r.err, "tunegraph: dumped 1 records (lm)\n")) {
            as_lm++;
        } else if (r.status == 0) {
            done = 1;
            if (!r.err || strcmp(r.err, "tunegraph: dumped 1 records (classify)\n") || !r.out || strcmp(r.out, classify_out))
                as_lm = -1;
        } else if (r.status != 1 || !r.err || !strstr(r.err, "out of memory")) {
            as_lm = -1;
        }
        if (as_lm < 0) {
            CHECK(0, "%s, allocation %ld failed: exit %d, stdout '%.200s', stderr '%s'", path, k, r.status, r.out ? r.out : "",
                  r.err ? r.err : "");
            done = 1;
        }
        tg_cli_run_free(&r);
    }
    return done ? as_lm : -1;
}

TG_TEST(test_cli_data_dump_arguments_first_line_blocks) {
    const char *dir = tg_test_tmpdir();
    /* the same line, its blanks making it 99, 4096 and 4097 bytes before its newline */
    static const char head[] = "{\"input_ids\": [5, 6],", tail[] = "\"label\": 1}\n";
    const size_t sizes[] = {100, 4097, 4098};
    int counts[3];
    for (int s = 0; s < 3; s++) {
        char *text = malloc(sizes[s] + 1);
        REQUIRE(text, "malloc");
        const size_t blanks = sizes[s] - strlen(head) - strlen(tail);
        memcpy(text, head, strlen(head));
        memset(text + strlen(head), ' ', blanks);
        memcpy(text + strlen(head) + blanks, tail, strlen(tail) + 1);
        REQUIRE(strlen(text) == sizes[s], "line of %zu", strlen(text));
        char name[64], path[800];
        snprintf(name, sizeof name, "l%zu.jsonl", sizes[s]);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        write_at(dir, name, text);
        free(text);
        counts[s] = allocations_read_as_lm(dir, path, "{\"input_ids\": [5, 6], \"label\": 1}\n");
    }
    /* one block for a line of up to 4096 bytes (the newline not kept), a second past it */
    CHECK(counts[0] > 0 && counts[1] == counts[0] && counts[2] == counts[0] + 1,
          "allocations read as lm: %d (99 bytes), %d (4096), %d (4097)", counts[0], counts[1], counts[2]);
}

/* -o may not replace any file of the set: its manifest, or a shard of either split
 * (whichever split is dumped); each refusal names the file as what it is. The eval split
 * dumped into a file. */
TG_TEST(test_cli_data_dump_arguments_set_files_kept) {
    const char *dir = tg_test_tmpdir();
    write_at(dir, "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n");
    write_at(dir, "t.txt", "hello world\nworld\n");
    char line[4096];
    snprintf(line, sizeof line,
             "data convert %s/t.txt -o %s/s --tokenizer %s/vocab.txt --format text --seq 4 --eval-fraction 0.5 --seed 1",
             dir, dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0, "convert: %s", r.err ? r.err : "");
    tg_cli_run_free(&r);
    static const struct {
        const char *set, *output, *what;
    } cases[] = {
        {"s", "s/manifest.json", "manifest"},
        {"s/train", "s/manifest.json", "manifest"},
        {"s", "s/train/00000.tgshard", "shard"},
        {"s/eval", "s/train/00000.tgshard", "shard"},
        {"s/eval", "s/eval/00000.tgshard", "shard"},
        {"s/train", "s/eval/00000.tgshard", "shard"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char set[800], out[800], want[2048];
        snprintf(set, sizeof set, "%s/%s", dir, cases[k].set);
        snprintf(out, sizeof out, "%s/%s", dir, cases[k].output);
        long before = 0, after = 0;
        char *kept = tg_test_read_file(out, &before);
        char *argv[] = {"tunegraph", "data", "dump", set, "-o", out, NULL};
        snprintf(want, sizeof want, "tunegraph: dump (-o) %s: would overwrite the %s %s (the same file)\n", out,
                 cases[k].what, out);
        expect_argv(dir, argv, 1, "", want);
        char *now = tg_test_read_file(out, &after);
        CHECK(kept && now && before == after && !memcmp(kept, now, (size_t)before), "%s changed", out);
        free(kept);
        free(now);
    }
    char set[800], out[800];
    snprintf(set, sizeof set, "%s/s/eval", dir);
    snprintf(out, sizeof out, "%s/eval.jsonl", dir);
    char *argv[] = {"tunegraph", "data", "dump", set, "-o", out, NULL};
    expect_argv(dir, argv, 0, "", "tunegraph: dumped 1 records (lm)\n");
    char *text = tg_test_read_file(out, NULL);
    CHECK(text && !strcmp(text, "{\"input_ids\": [5, 6, 3]}\n"), "%s: '%s'", out, text ? text : "(none)");
    free(text);
}
