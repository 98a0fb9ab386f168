/* `tunegraph data convert`'s options taking effect and its report, word for word, in this
 * process (tests/cli_in_process.h): the column options (the set's records then dumped
 * exactly), each --format, the smallest and largest --seq and --seed and --doc-stride 0
 * taken, an eval split, SQuAD's questions and windows, folders' files, text's lines, rows
 * that encode to no tokens left out, and `data help` on standard output. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

static const char *test_dir;

/* fmt with every %s the test's folder. */
static const char *at(const char *fmt) {
    static char buf[4][2048];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 2048, fmt, test_dir, test_dir, test_dir, test_dir, test_dir, test_dir);
    return b;
}

static void write_at(const char *name, const char *text) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", test_dir, name);
    CHECK(tg_test_write_file(path, text) == 0, "%s", path);
}

/* The command (fmt with the folder) exits with `status`, writes exactly `out` (NULL: not
 * checked) on stdout and exactly `err` on stderr. */
static void expect(const char *fmt, int status, const char *out, const char *err) {
    const char *line = at(fmt);
    tg_cli_run r = tg_test_cli_line(test_dir, line, NULL);
    CHECK(r.status == status, "%s: exit %d, want %d (stderr '%s')", line, r.status, status, r.err ? r.err : "(none)");
    if (out) CHECK(r.out && !strcmp(r.out, out), "%s: stdout\n'%s'\nwant\n'%s'", line, r.out ? r.out : "(none)", out);
    CHECK(r.err && !strcmp(r.err, err), "%s: stderr\n'%s'\nwant\n'%s'", line, r.err ? r.err : "(none)", err);
    tg_cli_run_free(&r);
}

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

/* [CLS] 2, [SEP] 3, hello 5, world 6, the 9, cat 10. */
static void write_vocab(void) { write_at("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\nthe\ncat\n"); }

TG_TEST(test_cli_data_convert_columns_and_splits) {
    test_dir = tg_test_tmpdir();
    write_vocab();
    write_at("rows.csv", "id,body,other,y\n1,hello world,the cat,pos\n2,world,cat,neg\n3,hello,hello,pos\n4,the,world,neg\n");
    /* text, pair and label columns by name, labels in the order given */
    expect("data convert %s/rows.csv -o %s/s1 --tokenizer %s/vocab.txt --text-column body --pair-column other "
           "--label-column y --labels neg,pos --seq 8",
           0, "", at("tunegraph: wrote %s/s1: classify with 2 labels, 4 train records (22 tokens) from 4 rows\n"));
    expect("data dump %s/s1", 0,
           "{\"input_ids\": [2, 5, 6, 3, 9, 10, 3], \"token_type_ids\": [0, 0, 0, 0, 1, 1, 1], \"label\": 1}\n"
           "{\"input_ids\": [2, 6, 3, 10, 3], \"token_type_ids\": [0, 0, 0, 1, 1], \"label\": 0}\n"
           "{\"input_ids\": [2, 5, 3, 5, 3], \"token_type_ids\": [0, 0, 0, 1, 1], \"label\": 1}\n"
           "{\"input_ids\": [2, 9, 3, 6, 3], \"token_type_ids\": [0, 0, 0, 1, 1], \"label\": 0}\n",
           "tunegraph: dumped 4 records (classify, labels: neg,pos from the manifest)\n");
    /* --seq 2, the smallest: [CLS] [SEP] alone; half the rows for eval with seed 7 */
    expect("data convert %s/rows.csv -o %s/s2 --tokenizer %s/vocab.txt --text-column body --label-column y "
           "--eval-fraction 0.5 --seed 7 --seq 2",
           0, "",
           at("tunegraph: wrote %s/s2: classify with 2 labels, 2 train records (4 tokens) and 2 eval records (4 tokens) "
              "from 4 rows\n"));
    expect("data dump %s/s2/eval", 0, "{\"input_ids\": [2, 3], \"label\": 0}\n{\"input_ids\": [2, 3], \"label\": 1}\n",
           "tunegraph: dumped 2 records (classify, labels: neg,pos from the manifest)\n");
    /* the largest --seq and --seed, --doc-stride 0 */
    expect("data convert %s/rows.csv -o %s/s3 --tokenizer %s/vocab.txt --text-column body --label-column y "
           "--seq 4194304 --eval-fraction 0.25 --seed 18446744073709551615 --doc-stride 0",
           0, "",
           at("tunegraph: wrote %s/s3: classify with 2 labels, 3 train records (10 tokens) and 1 eval records (3 tokens) "
              "from 4 rows\n"));
    /* one past each: refused, and so is a seed with an eval fraction of 0 */
    char want[4096];
    static const struct {
        const char *args, *message;
    } refused[] = {
        {"--seq 4194305", "--seq needs a whole number from 2 to 4194304, got '4194305'"},
        {"--seq 1", "--seq needs a whole number from 2 to 4194304, got '1'"},
        {"--seq -", "--seq needs a whole number from 2 to 4194304, got '-'"},
        {"--doc-stride 4194305", "--doc-stride needs a whole number >= 0, got '4194305'"},
        {"--doc-stride x", "--doc-stride needs a whole number >= 0, got 'x'"},
        {"--seed 18446744073709551616 --eval-fraction 0.5", "--seed needs a whole number from 0 to 2^64-1, got '18446744073709551616'"},
        {"--seed -0 --eval-fraction 0.5", "--seed needs a whole number from 0 to 2^64-1, got '-0'"},
        {"--eval-fraction 0 --seed 5", "--seed picks the eval split: give --eval-fraction too"},
        {"--eval-fraction 0.999 --seed 5 --labels", "--labels needs a value"},
        {"--text-column", "--text-column needs a value"},
        {"--pair-column", "--pair-column needs a value"},
        {"--label-column", "--label-column needs a value"},
        {"--doc-stride", "--doc-stride needs a value"},
        {"--eval-fraction", "--eval-fraction needs a value"},
        {"--seed", "--seed needs a value"},
        {"--seq", "--seq needs a value"},
        {"-x", "unknown option -x"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        char line[1024];
        snprintf(line, sizeof line, "data convert %%s/rows.csv -o %%s/s4 --tokenizer %%s/vocab.txt %s", refused[k].args);
        snprintf(want, sizeof want, "tunegraph: %s\n%s", refused[k].message, k_data_usage);
        expect(line, 2, "", want);
    }
    struct stat st;
    CHECK(stat(at("%s/s4"), &st) != 0, "a refused convert made its folder");
}

TG_TEST(test_cli_data_convert_formats) {
    test_dir = tg_test_tmpdir();
    write_vocab();
    write_at("r.tsv", "text\tlabel\nhello world\ta\nthe\tb\n");
    expect("data convert %s/r.tsv -o %s/tsv --tokenizer %s/vocab.txt --seq 8 --format tsv", 0, "",
           at("tunegraph: wrote %s/tsv: classify with 2 labels, 2 train records (7 tokens) from 2 rows\n"));
    expect("data dump %s/tsv", 0, "{\"input_ids\": [2, 5, 6, 3], \"label\": 0}\n{\"input_ids\": [2, 9, 3], \"label\": 1}\n",
           "tunegraph: dumped 2 records (classify, labels: a,b from the manifest)\n");
    write_at("r.txt", "{\"text\": \"hello the cat\", \"label\": \"b\"}\n{\"text\": \"world\", \"label\": \"a\"}\n");
    expect("data convert %s/r.txt -o %s/jsonl --tokenizer %s/vocab.txt --seq 8 --format jsonl", 0, "",
           at("tunegraph: wrote %s/jsonl: classify with 2 labels, 2 train records (8 tokens) from 2 rows\n"));
    expect("data dump %s/jsonl", 0,
           "{\"input_ids\": [2, 5, 9, 10, 3], \"label\": 1}\n{\"input_ids\": [2, 6, 3], \"label\": 0}\n",
           "tunegraph: dumped 2 records (classify, labels: a,b from the manifest)\n");
    write_at("a.txt", "hello world\n\nthe cat\n");
    expect("data convert %s/a.txt -o %s/text --tokenizer %s/vocab.txt --format text --seq 4", 0, "",
           at("tunegraph: wrote %s/text: lm, 2 train records (6 tokens) from 2 lines\n"));
    expect("data dump %s/text", 0, "{\"input_ids\": [5, 6, 3, 9]}\n{\"input_ids\": [10, 3]}\n",
           "tunegraph: dumped 2 records (lm)\n");
    /* folders: one file an example, the folder its label */
    static const char *const dirs[] = {"docs", "docs/pos", "docs/neg"};
    for (int k = 0; k < 3; k++) REQUIRE(mkdir(at(k == 0 ? "%s/docs" : k == 1 ? "%s/docs/pos" : "%s/docs/neg"), 0755) == 0,
                                        "%s", dirs[k]);
    write_at("docs/pos/a.txt", "hello world\n");
    write_at("docs/neg/b.txt", "the cat\n");
    write_at("docs/neg/c.txt", "cat\n");
    expect("data convert %s/docs -o %s/folders --tokenizer %s/vocab.txt --seq 8 --format folders", 0, "",
           at("tunegraph: wrote %s/folders: classify with 2 labels, 3 train records (11 tokens) from 3 files\n"));
    /* SQuAD: every window of each question, and how many hold their answer */
    write_at("sq.json", tg_test_squad_v2);
    expect("data convert %s/sq.json -o %s/squad --tokenizer %s/vocab.txt --format squad --seq 8 --doc-stride 2", 0, "",
           at("tunegraph: wrote %s/squad: qa, 9 train records (69 tokens) from 3 questions (3 windows hold their "
              "answer)\n"));
    /* a template-less tokenizer (byte-level BPE) leaves out rows of empty text */
    REQUIRE(mkdir(at("%s/gpt2"), 0755) == 0, "gpt2");
    char *vocab = tg_test_bpe_vocab_json("");
    write_at("gpt2/vocab.json", vocab);
    free(vocab);
    write_at("gpt2/merges.txt", tg_test_bpe_merges);
    write_at("e.csv", "text,label\nhello,a\n\"\",b\n,a\nworld,b\n");
    expect("data convert %s/e.csv -o %s/empty --tokenizer %s/gpt2 --seq 8", 0, "",
           at("tunegraph: wrote %s/empty: classify with 2 labels, 2 train records (4 tokens) from 4 rows\n"
              "tunegraph: left out 2 rows that encode to no tokens\n"));
    /* help on stdout, for each of its spellings */
    expect("data help", 0, k_data_usage, "");
    expect("data --help", 0, k_data_usage, "");
    expect("data -h", 0, k_data_usage, "");
    char want[4096];
    snprintf(want, sizeof want, "tunegraph: unknown data subcommand 'show' (there are: convert, dump)\n%s", k_data_usage);
    expect("data show", 2, "", want);
    snprintf(want, sizeof want,
             "tunegraph: --format must be csv, tsv, jsonl, squad, text, folders, instruct, idx or images, got 'CSV'\n%s", k_data_usage);
    expect("data convert %s/r.tsv -o %s/x --tokenizer %s/vocab.txt --format CSV", 2, "", want);
}
