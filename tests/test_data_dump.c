/* `tunegraph data dump` through the CLI: a shard set made by `data convert` dumped and
 * loaded back as a JSONL dataset equals the set record for record (ids, token types,
 * labels), qa answer positions come out as the reader gives them, a JSONL dataset's dump
 * equals its records, standard output and -o agree, and refusals (a missing set, an
 * output that is an input, an empty split, a bad line) exit 1 with their message and
 * leave no file. */
#include <limits.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "datasets/dataset.h"
#include "datasets/shard_reader.h"
#include "tests/harness.h"

/* Runs `tunegraph ARGS` in dir; its exit status, stdout in dir/stdout.txt and stderr in
 * dir/stderr.txt. */
static int run_cli(const char *dir, const char *args) {
    char cmd[3000], cli[PATH_MAX];
    const char *c = tg_test_cli();
    if (!realpath(c, cli)) snprintf(cli, sizeof cli, "%s", c);
    snprintf(cmd, sizeof cmd, "cd '%s' && '%s' %s >stdout.txt 2>stderr.txt", dir, cli, args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *file_in(const char *dir, const char *name) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = tg_test_read_file(path, NULL);
    return text ? text : strdup("");
}

static int stderr_has(const char *dir, const char *want) {
    char *text = file_in(dir, "stderr.txt");
    int has = strstr(text, want) != NULL;
    if (!has) fprintf(stderr, "    stderr: %s", text);
    free(text);
    return has;
}

static void write_in(const char *dir, const char *name, const char *text) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tg_test_write_file(path, text);
}

/* A WordPiece vocabulary for the inputs below (lowercase words and punctuation). */
static void write_vocab(const char *dir) {
    write_in(dir, "vocab.txt",
             "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\ncat\ndog\nis\nan\nanimal\nthe\nbig\nsmall\nred\nblue\nsky\nsea\n"
             "what\ncolor\n?\n.\n");
}

/* Two datasets hold the same records: lengths, ids, token types (none = all zero) and labels. */
static int same_records(const tg_dataset *a, const tg_dataset *b, const char *what) {
    if (!CHECK(a->n == b->n, "%s: %d records, want %d", what, b->n, a->n)) return 0;
    for (int32_t i = 0; i < a->n; i++) {
        const tg_example *x = &a->examples[i], *y = &b->examples[i];
        if (!CHECK(x->len == y->len && x->label == y->label, "%s: record %d: len %d label %d, want %d %d", what, i,
                   y->len, y->label, x->len, x->label))
            return 0;
        for (int32_t t = 0; t < x->len; t++) {
            int32_t tx = x->token_type_ids ? x->token_type_ids[t] : 0, ty = y->token_type_ids ? y->token_type_ids[t] : 0;
            if (!CHECK(x->input_ids[t] == y->input_ids[t] && tx == ty, "%s: record %d token %d: id %d type %d, want %d %d",
                       what, i, t, y->input_ids[t], ty, x->input_ids[t], tx))
                return 0;
        }
    }
    return 1;
}

static int load_in(const char *dir, const char *name, const tg_data_rules *rules, tg_dataset *ds) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tg_err err = {{0}};
    return CHECK(tg_dataset_load(path, rules, ds, &err) == 0, "%s", err.msg);
}

TG_TEST(test_data_dump_shard_set_round_trip) {
    const char *dir = tg_test_tmpdir();
    write_vocab(dir);
    write_in(dir, "pairs.csv",
             "premise,hypothesis,label\n"
             "a cat,an animal,entail\n"
             "the dog,a cat,contra\n"
             "the sky,is blue,neutral\n"
             "the sea,is red,contra\n"
             "big dog,an animal,entail\n"
             "small cat,the sky,neutral\n"
             "a red sea,is blue,contra\n");
    REQUIRE(run_cli(dir, "data convert pairs.csv -o set --tokenizer vocab.txt --text-column premise --pair-column "
                         "hypothesis --eval-fraction 0.3 --seed 1") == 0 && stderr_has(dir, "4 train records"),
            "convert failed");
    REQUIRE(run_cli(dir, "data dump set -o train.jsonl") == 0, "dump of set failed");
    CHECK(stderr_has(dir, "dumped 4 records (classify, labels: contra,entail,neutral from the manifest)"),
          "the report line");
    REQUIRE(run_cli(dir, "data dump set/eval -o eval.jsonl") == 0, "dump of set/eval failed");
    CHECK(stderr_has(dir, "dumped 3 records (classify"), "the eval report line");
    /* OUTDIR and OUTDIR/train name the same split; without -o the lines go to stdout. */
    REQUIRE(run_cli(dir, "data dump set/train") == 0, "dump of set/train to stdout failed");
    char *a = file_in(dir, "train.jsonl"), *b = file_in(dir, "stdout.txt");
    CHECK(a[0] && !strcmp(a, b), "stdout differs from -o:\n%s\n%s", b, a);
    CHECK(strstr(a, "{\"input_ids\": [2, 5, 6, 3, 9, 10, 3], \"token_type_ids\": [0, 0, 0, 0, 1, 1, 1], \"label\": 1}\n") ==
              a,
          "first line: %s", a);
    free(a);
    free(b);

    const tg_data_rules rules = {.task = TG_TASK_CLASSIFY, .num_labels = 3, .vocab_size = 22, .type_vocab_size = 2};
    const char *names[2][2] = {{"set", "train.jsonl"}, {"set/eval", "eval.jsonl"}};
    for (int s = 0; s < 2; s++) {
        tg_dataset set, dump;
        if (!load_in(dir, names[s][0], &rules, &set)) continue;
        if (load_in(dir, names[s][1], &rules, &dump)) {
            CHECK(dump.n_tokens == set.n_tokens, "%s: %lld tokens, want %lld", names[s][1], (long long)dump.n_tokens,
                  (long long)set.n_tokens);
            same_records(&set, &dump, names[s][1]);
            tg_dataset_free(&dump);
        }
        tg_dataset_free(&set);
    }
}

/* qa: each line's ids, types and answer positions are the reader's record; the dump loads
 * as an lm dataset (the positions are keys the loader leaves). */
TG_TEST(test_data_dump_qa_positions) {
    const char *dir = tg_test_tmpdir();
    write_vocab(dir);
    write_in(dir, "s.json",
             "{\"version\": \"1.1\", \"data\": [{\"title\": \"T\", \"paragraphs\": [{\"context\": \"the sky is blue . the "
             "sea is red . a cat is small . a dog is big .\", \"qas\": [{\"id\": \"q1\", \"question\": \"what color is "
             "the sky ?\", \"answers\": [{\"text\": \"blue\", \"answer_start\": 11}]}, {\"id\": \"q2\", \"question\": "
             "\"what color is the sea ?\", \"answers\": [{\"text\": \"red\", \"answer_start\": 29}]}]}]}]}\n");
    REQUIRE(run_cli(dir, "data convert s.json -o qa --tokenizer vocab.txt --seq 16 --doc-stride 4") == 0, "convert");
    REQUIRE(run_cli(dir, "data dump qa -o qa.jsonl") == 0 && stderr_has(dir, "(qa)"), "dump failed");
    char path[700];
    snprintf(path, sizeof path, "%s/qa", dir);
    tg_err err = {{0}};
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(path, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    tg_shard_cursor cur;
    if (!CHECK(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg)) {
        tg_shard_set_close(&set);
        return;
    }
    char *text = file_in(dir, "qa.jsonl");
    int64_t lines = 0, answered = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        tg_shard_record r;
        if (!CHECK(lines < set.n_records && tg_shard_cursor_get(&cur, lines, &r, &err) == 0, "line %lld: %s",
                   (long long)lines + 1, err.msg))
            break;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *ids = json_object_get(o, "input_ids"), *types = json_object_get(o, "token_type_ids");
        int ok = o && (int32_t)json_array_size(ids) == r.len && !json_object_get(o, "label") &&
                 json_integer_value(json_object_get(o, "start_position")) == r.start &&
                 json_integer_value(json_object_get(o, "end_position")) == r.end &&
                 (r.token_type_ids ? (int32_t)json_array_size(types) == r.len : types == NULL);
        for (int32_t t = 0; ok && t < r.len; t++)
            ok = json_integer_value(json_array_get(ids, (size_t)t)) == r.input_ids[t] &&
                 (!r.token_type_ids || json_integer_value(json_array_get(types, (size_t)t)) == r.token_type_ids[t]);
        CHECK(ok, "line %lld differs from record %lld: %s", (long long)lines + 1, (long long)lines, line);
        answered += r.start > 0;
        json_decref(o);
    }
    CHECK(lines == set.n_records && answered == 4, "%lld lines for %lld records, %lld answered", (long long)lines,
          (long long)set.n_records, (long long)answered);
    free(text);
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    const tg_data_rules lm = {.task = TG_TASK_LM, .vocab_size = 22, .type_vocab_size = 2};
    tg_dataset ds;
    if (load_in(dir, "qa.jsonl", &lm, &ds)) {
        CHECK(ds.n == lines, "the dump loads %d records", ds.n);
        tg_dataset_free(&ds);
    }
}

/* A JSONL dataset's dump holds its records as the loader reads them: other keys and blank
 * lines left out, all-zero token types dropped, labels kept when the lines have them. */
TG_TEST(test_data_dump_jsonl_dataset) {
    const char *dir = tg_test_tmpdir();
    write_in(dir, "in.jsonl",
             "{\"text\": \"x\", \"input_ids\": [5, 6, 7], \"label\": 3}\n"
             "\n"
             "{\"label\": 0, \"input_ids\": [9], \"token_type_ids\": [0]}\n"
             "{\"input_ids\": [1, 2], \"token_type_ids\": [0, 1], \"label\": 12}\n");
    REQUIRE(run_cli(dir, "data dump in.jsonl -o out.jsonl") == 0 && stderr_has(dir, "dumped 3 records (classify)"),
            "dump failed");
    char *out = file_in(dir, "out.jsonl");
    const char *want = "{\"input_ids\": [5, 6, 7], \"label\": 3}\n"
                       "{\"input_ids\": [9], \"label\": 0}\n"
                       "{\"input_ids\": [1, 2], \"token_type_ids\": [0, 1], \"label\": 12}\n";
    CHECK(!strcmp(out, want), "dump:\n%swant:\n%s", out, want);
    free(out);
    const tg_data_rules rules = {.task = TG_TASK_CLASSIFY, .num_labels = 13, .vocab_size = 10, .type_vocab_size = 2};
    tg_dataset in, dump;
    if (load_in(dir, "in.jsonl", &rules, &in)) {
        if (load_in(dir, "out.jsonl", &rules, &dump)) {
            same_records(&in, &dump, "out.jsonl");
            tg_dataset_free(&dump);
        }
        tg_dataset_free(&in);
    }
    /* Lines without labels: an lm dataset, ids alone. */
    write_in(dir, "lm.jsonl", "{\"input_ids\": [4, 3]}\n{\"input_ids\": [8]}\n");
    REQUIRE(run_cli(dir, "data dump lm.jsonl") == 0 && stderr_has(dir, "dumped 2 records (lm)"), "lm dump failed");
    out = file_in(dir, "stdout.txt");
    CHECK(!strcmp(out, "{\"input_ids\": [4, 3]}\n{\"input_ids\": [8]}\n"), "lm dump: %s", out);
    free(out);
}

TG_TEST(test_data_dump_refusals) {
    const char *dir = tg_test_tmpdir();
    write_vocab(dir);
    write_in(dir, "rows.csv", "text,label\na cat,x\nthe dog,y\n");
    REQUIRE(run_cli(dir, "data convert rows.csv -o set --tokenizer vocab.txt") == 0, "convert failed");
    write_in(dir, "in.jsonl", "{\"input_ids\": [1], \"label\": 0}\n");
    write_in(dir, "bad.jsonl", "{\"input_ids\": [1], \"label\": 0}\n{\"input_ids\": [2]}\n");
    const struct {
        const char *args, *want;
        int status;
    } cases[] = {
        {"data dump missing.jsonl -o out.jsonl", "missing.jsonl: cannot open dataset", 1},
        {"data dump missing/eval -o out.jsonl", "missing/eval: cannot open dataset", 1},
        {"data dump in.jsonl -o in.jsonl", "dump (-o) in.jsonl: would overwrite the dataset in.jsonl", 1},
        {"data dump in.jsonl -o ./in.jsonl", "would overwrite the dataset in.jsonl (the same file)", 1},
        {"data dump set -o set/manifest.json", "would overwrite the manifest set/manifest.json", 1},
        {"data dump set -o set/train/00000.tgshard", "would overwrite the shard set/train/00000.tgshard", 1},
        {"data dump set/eval -o out.jsonl", "set: the set has no eval records (convert with --eval-fraction", 1},
        {"data dump bad.jsonl -o out.jsonl", "bad.jsonl:2: missing \"label\"", 1},
        {"data dump . -o out.jsonl", "a folder, but not a shard set", 1},
        {"data dump -o out.jsonl", "missing SET", 2},
        {"data dump in.jsonl bad.jsonl", "takes one SET, got a second: bad.jsonl", 2},
        {"data dump in.jsonl -o", "-o needs a value", 2},
        {"data dump in.jsonl --labels a", "unknown option --labels", 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int rc = run_cli(dir, cases[k].args);
        CHECK(rc == cases[k].status && stderr_has(dir, cases[k].want), "%s: exit %d, want %d and '%s'", cases[k].args,
              rc, cases[k].status, cases[k].want);
    }
    /* No refusal wrote anything: no output, no temporary file, the inputs as they were. */
    char path[700];
    struct stat st;
    snprintf(path, sizeof path, "%s/out.jsonl", dir);
    CHECK(stat(path, &st) != 0, "a refused dump left out.jsonl");
    CHECK(tg_test_count_files(dir) == 7, "%d entries in the folder, want 7 (no temporary files)",
          tg_test_count_files(dir));
    char *in = file_in(dir, "in.jsonl");
    CHECK(!strcmp(in, "{\"input_ids\": [1], \"label\": 0}\n"), "in.jsonl changed: %s", in);
    free(in);
}

/* The eval split's default seed is 42, as README says: leaving --seed out picks the same
 * rows as --seed 42, and another seed picks others. */
TG_TEST(test_data_convert_default_seed_is_42) {
    const char *dir = tg_test_tmpdir();
    write_vocab(dir);
    char rows[2048] = "text,label\n";
    static const char *const words[] = {"a cat", "the dog", "a dog", "the cat"};
    for (int i = 0; i < 40; i++) {
        char line[64];
        snprintf(line, sizeof line, "%s %d,%s\n", words[i % 4], i, i % 2 ? "x" : "y");
        strcat(rows, line);
    }
    write_in(dir, "rows.csv", rows);
    char *dumps[3] = {NULL, NULL, NULL};
    static const char *const seeds[3] = {"", " --seed 42", " --seed 7"};
    for (int k = 0; k < 3; k++) {
        char cmd[256], set[16];
        snprintf(set, sizeof set, "set%d", k);
        snprintf(cmd, sizeof cmd, "data convert rows.csv -o %s --tokenizer vocab.txt --eval-fraction 0.25%s", set,
                 seeds[k]);
        REQUIRE(run_cli(dir, cmd) == 0, "%s", cmd);
        snprintf(cmd, sizeof cmd, "data dump %s/eval", set);
        REQUIRE(run_cli(dir, cmd) == 0, "%s", cmd);
        dumps[k] = file_in(dir, "stdout.txt");
        REQUIRE(dumps[k] && dumps[k][0], "no eval records for seed '%s'", seeds[k]);
    }
    CHECK(!strcmp(dumps[0], dumps[1]), "no --seed and --seed 42 differ:\n%s\n%s", dumps[0], dumps[1]);
    CHECK(strcmp(dumps[0], dumps[2]), "--seed 7 picked the same eval rows as 42");
    for (int k = 0; k < 3; k++) free(dumps[k]);
}
