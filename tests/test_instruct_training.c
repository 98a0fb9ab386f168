/* Instruct records from the shard set to the loss: the record kind in the shard writer,
 * reader and manifest; an lm job's examples carrying each record's prompt length (and mlm,
 * classify and qa jobs taking the set as they take any other); the batches' labels, -100 on
 * every position whose target is in the prompt or padding, whether the host writes the
 * rows or leaves plain rows to the step; JSON Lines with Hugging Face's "labels"; `data
 * dump` writing them and reading them back; and CPU training runs of tiny GPT-2 on an
 * instruct set whose eval loss is the mean cross-entropy over the response tokens alone,
 * computed here from the eval's own logits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "datasets/convert.h"
#include "datasets/dataset.h"
#include "datasets/shard_manifest.h"
#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "plan/ops.h"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"
#include "tests/byte_encoder.h"
#include "tests/cli_in_process.h"
#include "tests/harness.h"

/* The label an lm row's position t gets: the next token, when it is kept (t + 1 < the
 * kept length) and past the prompt; else ignored. */
static int32_t want_label(const tg_example *ex, int32_t T, int32_t t) {
    if (!ex) return TG_IGNORE_INDEX;
    const int32_t kept = ex->len < T ? ex->len : T;
    const int32_t first = ex->prompt_len > 1 ? ex->prompt_len : 1;
    return t + 1 < kept && t + 1 >= first ? ex->input_ids[t + 1] : TG_IGNORE_INDEX;
}

typedef struct bufs {
    int32_t ids[64], types[64], pos[64], labels[64];
    float mask[64];
    int32_t row_len[8];
    tg_batch b;
} bufs;

static void bufs_init(bufs *x) {
    memset(x, 0x5A, sizeof *x); /* garbage, so every slot must be written */
    x->b = (tg_batch){x->ids, x->mask, x->types, x->pos, x->labels, -1, -1, 0, x->row_len, 0};
}

/* Rows of examples with a prompt, plain rows, a prompt longer than the batch's seq, a short
 * row and a padding row, refilled in turn over the same buffers (rows of one length
 * changing from plain to prompted and back): the labels are want_label's each time, with
 * the host writing every row, and with plain rows left to the step (marked, then derived
 * as the step derives them) while prompted rows are written whole. */
TG_TEST(test_instruct_batch_labels_skip_the_prompt) {
    static int32_t ids[5][9] = {{10, 11, 12, 13, 14, 15, 16},
                                {20, 21, 22, 23, 24, 25, 26},
                                {30, 31, 32, 33, 34, 35, 36, 37, 38},
                                {40, 41, 42},
                                {50, 51, 52, 53, 54, 55, 56}};
    tg_example ex[5] = {{.len = 7, .input_ids = ids[0], .prompt_len = 3},
                        {.len = 7, .input_ids = ids[1]},
                        {.len = 9, .input_ids = ids[2], .prompt_len = 7},
                        {.len = 3, .input_ids = ids[3], .prompt_len = 2},
                        {.len = 7, .input_ids = ids[4], .prompt_len = 1}};
    tg_dataset ds = {.n = 5, .examples = ex};
    enum { B = 5, T = 6 };
    const tg_batch_shape sh = {.batch = B, .seq = T, .task = TG_TASK_LM, .arch = TG_ARCH_GPT2, .pad_id = 0};
    static const int32_t orders[4][4] = {{0, 1, 2, 3}, {1, 0, 3, 4}, {4, 2, 0, 1}, {0, 1, 2, 3}};
    for (int mark = 0; mark < 2; mark++) {
        bufs x;
        bufs_init(&x);
        for (int round = 0; round < 4; round++) {
            x.b.mark_label_rows = mark;
            tg_batch_fill(&ds, orders[round], 4, &sh, &x.b);
            for (int r = 0; r < B; r++) {
                const tg_example *e = r < 4 ? &ex[orders[round][r]] : NULL;
                const int marked = mark && !(e && e->prompt_len > 1);
                CHECK((x.labels[r * T] == TG_LABELS_FROM_IDS) == marked, "mark %d round %d row %d: first label %d",
                      mark, round, r, x.labels[r * T]);
            }
            tg_batch_derive_label_rows(x.labels, x.ids, x.mask, B, T);
            for (int r = 0; r < B; r++) {
                const tg_example *e = r < 4 ? &ex[orders[round][r]] : NULL;
                for (int t = 0; t < T; t++)
                    CHECK(x.labels[r * T + t] == want_label(e, T, t), "mark %d round %d row %d position %d: label %d, want %d",
                          mark, round, r, t, x.labels[r * T + t], want_label(e, T, t));
            }
        }
    }
    /* Masked LM ignores the prompt: every label is the masking op's to make. */
    bufs x;
    bufs_init(&x);
    tg_batch_shape mlm = sh;
    mlm.task = TG_TASK_MLM;
    tg_batch_fill(&ds, orders[0], 4, &mlm, &x.b);
    for (int i = 0; i < B * T; i++) CHECK(x.labels[i] == TG_IGNORE_INDEX, "mlm label %d: %d", i, x.labels[i]);
}

/* ---- the record kind in the writer, the reader and the manifest ----------------------------- */

static int write_set(const char *dir, const tg_shard_record *recs, int n, tg_err *err) {
    tg_shard_set_desc d = {.task = TG_SHARD_INSTRUCT, .seq = 8, .tokenizer_family = "bpe-gpt2", .vocab_size = 100,
                           .command = "test"};
    tg_shard_writer *w;
    if (tg_shard_writer_open(dir, &d, &w, err)) return -1;
    for (int i = 0; i < n; i++)
        if (tg_shard_writer_add(w, TG_SPLIT_TRAIN, &recs[i], err)) {
            tg_shard_writer_abort(w);
            return -1;
        }
    return tg_shard_writer_commit(w, err);
}

TG_TEST(test_instruct_shard_records_and_jobs) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/set", tg_test_tmpdir());
    const int32_t a[] = {1, 2, 3, 4, 5}, b[] = {6, 7};
    const tg_shard_record recs[] = {{.len = 5, .input_ids = a, .prompt_len = 3}, {.len = 2, .input_ids = b, .prompt_len = 1}};
    tg_err err = {{0}};
    /* The writer refuses a prompt outside 1 .. len - 1. */
    tg_shard_record bad = recs[0];
    bad.prompt_len = 0;
    CHECK(write_set(dir, &bad, 1, &err) == -1 &&
              !strcmp(err.msg, "shard writer: record 0 of the train split: a prompt of 0 tokens is outside 1 to 4 (the "
                               "record's 5 tokens less one response token)"),
          "prompt 0: %s", err.msg);
    bad.prompt_len = 5;
    CHECK(write_set(dir, &bad, 1, &err) == -1 &&
              !strcmp(err.msg, "shard writer: record 0 of the train split: a prompt of 5 tokens is outside 1 to 4 (the "
                               "record's 5 tokens less one response token)"),
          "prompt 5: %s", err.msg);
    REQUIRE(write_set(dir, recs, 2, &err) == 0, "%s", err.msg);
    /* Read back: the kind in the manifest, the prompts in the records. */
    tg_shard_set set;
    REQUIRE(tg_shard_set_open(dir, TG_SPLIT_TRAIN, &set, &err) == 0, "%s", err.msg);
    CHECK(set.manifest.task == TG_SHARD_INSTRUCT && !strcmp(tg_shard_task_name(TG_SHARD_INSTRUCT), "instruct"),
          "task %d", set.manifest.task);
    tg_shard_cursor cur;
    REQUIRE(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        tg_shard_record r;
        CHECK(tg_shard_cursor_get(&cur, i, &r, &err) == 0 && r.len == recs[i].len && r.prompt_len == recs[i].prompt_len &&
                  r.input_ids[r.len - 1] == recs[i].input_ids[r.len - 1],
              "record %d: %d tokens, prompt %d (%s)", i, r.len, r.prompt_len, err.msg);
    }
    /* A block whose record holds a prompt outside 1 .. len - 1 is refused by the reader. */
    uint8_t block[4 + 4 + 12 + 8];
    tg_put_le32(block, 1);
    tg_put_le32(block + 4, 12 + 8);
    tg_put_le32(block + 8, 2);  /* length */
    tg_put_le32(block + 12, 0); /* flags */
    tg_put_le32(block + 20, 9);
    tg_put_le32(block + 24, 9);
    const int32_t prompts[] = {0, 2, -1};
    for (int k = 0; k < 3; k++) {
        tg_put_le32(block + 16, (uint32_t)prompts[k]);
        int32_t out_ids[8], out_types[8];
        tg_shard_record r;
        char want[200];
        snprintf(want, sizeof want,
                 "blk: a prompt of %d tokens is outside 1 to 1 (the record's 2 tokens less one response token)", prompts[k]);
        CHECK(tg_shard_block_check(block, sizeof block, 1, "blk", &err) == 0 &&
                  tg_shard_block_record(block, sizeof block, 0, &set.manifest, out_ids, out_types, &r, "blk", &err) == -1 &&
                  !strcmp(err.msg, want),
              "prompt %d: '%s'", prompts[k], err.msg);
    }
    tg_shard_cursor_close(&cur);
    /* The manifest of the kind formats and parses to itself. */
    char *text;
    size_t n;
    tg_shard_manifest again;
    REQUIRE(tg_shard_manifest_format(&set.manifest, &text, &n, &err) == 0, "%s", err.msg);
    CHECK(strstr(text, "\"task\": \"instruct\"") && tg_shard_manifest_parse(text, n, "m", &again, &err) == 0 &&
              again.task == TG_SHARD_INSTRUCT,
          "manifest: %s", err.msg);
    free(text);
    tg_shard_manifest_free(&again);
    tg_shard_set_close(&set);

    /* An lm job reads the prompts; mlm the ids alone; classify and qa refuse the set. */
    tg_data_rules rules = {.task = TG_TASK_LM, .vocab_size = 100};
    tg_dataset ds;
    REQUIRE(tg_dataset_load(dir, &rules, &ds, &err) == 0, "%s", err.msg);
    CHECK(ds.n == 2 && ds.examples[0].prompt_len == 3 && ds.examples[1].prompt_len == 1 && ds.n_tokens == 7,
          "lm: %d examples, prompts %d %d", ds.n, ds.examples[0].prompt_len, ds.examples[1].prompt_len);
    tg_dataset_free(&ds);
    rules.task = TG_TASK_MLM;
    REQUIRE(tg_dataset_load(dir, &rules, &ds, &err) == 0, "%s", err.msg);
    CHECK(ds.examples[0].prompt_len == 0, "mlm: prompt %d", ds.examples[0].prompt_len);
    tg_dataset_free(&ds);
    char want[1000];
    rules = (tg_data_rules){.task = TG_TASK_CLASSIFY, .num_labels = 2, .vocab_size = 100};
    snprintf(want, sizeof want, "%s/manifest.json: the set holds instruct records, without labels; task classify needs a "
                                "set converted with labels (a label column, or --format folders)", dir);
    CHECK(tg_dataset_load(dir, &rules, &ds, &err) == -1 && !strcmp(err.msg, want), "classify: %s", err.msg);
    rules.task = TG_TASK_QA;
    snprintf(want, sizeof want, "%s/manifest.json: the set holds instruct records, without answer positions; task qa "
                                "needs a set converted with --format squad", dir);
    CHECK(tg_dataset_load(dir, &rules, &ds, &err) == -1 && !strcmp(err.msg, want), "qa: %s", err.msg);
}

/* ---- JSON Lines with "labels" -------------------------------------------------------------- */

TG_TEST(test_instruct_jsonl_labels) {
    const char *dir = tg_test_tmpdir();
    char path[700];
    snprintf(path, sizeof path, "%s/l.jsonl", dir);
    const tg_data_rules lm = {.task = TG_TASK_LM, .vocab_size = 100};
    tg_dataset ds;
    tg_err err = {{0}};
    /* A prompt of 3; labels[0] either way; labels all counted (plain lm); classify ignores them. */
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [1, 2, 3, 4, 5], \"labels\": [-100, -100, -100, 4, 5]}\n"
                                     "{\"input_ids\": [1, 2, 3, 4], \"labels\": [1, -100, 3, 4]}\n"
                                     "{\"input_ids\": [1, 2, 3], \"labels\": [1, 2, 3], \"label\": 0}\n"
                                     "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n") == 0,
            "write");
    REQUIRE(tg_dataset_load(path, &lm, &ds, &err) == 0, "%s", err.msg);
    CHECK(ds.n == 4 && ds.examples[0].prompt_len == 3 && ds.examples[1].prompt_len == 2 &&
              ds.examples[2].prompt_len == 0 && ds.examples[3].prompt_len == 0,
          "prompts %d %d %d %d", ds.examples[0].prompt_len, ds.examples[1].prompt_len, ds.examples[2].prompt_len,
          ds.examples[3].prompt_len);
    tg_dataset_free(&ds);
    const tg_data_rules classify = {.task = TG_TASK_CLASSIFY, .num_labels = 2, .vocab_size = 100};
    REQUIRE(tg_test_write_file(path, "{\"input_ids\": [1, 2], \"labels\": \"anything\", \"label\": 1}\n") == 0, "write");
    REQUIRE(tg_dataset_load(path, &classify, &ds, &err) == 0, "%s", err.msg);
    CHECK(ds.examples[0].prompt_len == 0 && ds.examples[0].label == 1, "classify");
    tg_dataset_free(&ds);
    static const struct {
        const char *line, *want;
    } cases[] = {
        {"{\"input_ids\": [1, 2], \"labels\": 5}", "labels must be an array of integers"},
        {"{\"input_ids\": [1, 2], \"labels\": [1]}", "labels has 1 entries but input_ids has 2"},
        {"{\"input_ids\": [1, 2], \"labels\": [1, 2.5]}", "labels[1] is not an integer"},
        {"{\"input_ids\": [1, 2], \"labels\": [1, 3]}",
         "labels[1] = 3 is neither input_ids[1] (2) nor -100 (labels are the ids, unshifted, with -100 where a position "
         "is no target)"},
        {"{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, -100]}",
         "labels[2] is -100 after the counted labels[1]: only a prompt at the start can be left out of the loss"},
        {"{\"input_ids\": [1, 2, 3], \"labels\": [1, -100, -100]}",
         "labels leave no position to learn (every one past the first is -100)"},
        {"{\"input_ids\": [7], \"labels\": [7]}", "labels leave no position to learn (every one past the first is -100)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[300], want[1000];
        snprintf(text, sizeof text, "{\"input_ids\": [1, 2]}\n%s\n", cases[i].line);
        REQUIRE(tg_test_write_file(path, text) == 0, "write");
        snprintf(want, sizeof want, "%s:2: %s", path, cases[i].want);
        CHECK(tg_dataset_load(path, &lm, &ds, &err) == -1 && !strcmp(err.msg, want), "case %zu: '%s', want '%s'", i,
              err.msg, want);
    }
}

/* ---- `data convert` and `data dump` through the CLI ---------------------------------------- */

static void write_in(const char *dir, const char *name, const char *text) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK(tg_test_write_file(path, text) == 0, "%s", path);
}

static void expect_cli(const char *dir, const char *line, int status, const char *out, const char *err) {
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == status, "%s: exit %d, want %d (stderr '%s')", line, r.status, status, r.err ? r.err : "");
    if (out) CHECK(r.out && !strcmp(r.out, out), "%s: stdout\n'%s'\nwant\n'%s'", line, r.out ? r.out : "", out);
    if (err) CHECK(r.err && !strcmp(r.err, err), "%s: stderr\n'%s'\nwant\n'%s'", line, r.err ? r.err : "", err);
    tg_cli_run_free(&r);
}

/* A WordPiece vocabulary: [SEP] 3 ends each record (WordPiece has no eos, nor a bos). The
 * template puts "q :" before the instruction and "a :" before the response. */
TG_TEST(test_instruct_cli_convert_dump_and_run) {
    const char *dir = tg_test_tmpdir();
    write_in(dir, "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nq\na\n:\nhello\nworld\nthe\ncat\nsat\n");
    write_in(dir, "t.txt", "q: {instruction}\na: {output}\n");
    write_in(dir, "d.jsonl", "{\"instruction\": \"hello\", \"output\": \"world\"}\n"
                             "{\"instruction\": \"the cat\", \"output\": \"sat sat sat\"}\n"
                             "{\"instruction\": \"the cat sat\", \"output\": \"hello\"}\n"
                             "{\"instruction\": \"cat\", \"output\": \"\"}\n");
    char line[3000], want[3000];
    snprintf(line, sizeof line, "data convert %s/d.jsonl -o %s/set --tokenizer %s/vocab.txt --format instruct --template "
                                "%s/t.txt --seq 8", dir, dir, dir, dir);
    snprintf(want, sizeof want, "tunegraph: wrote %s/set: instruct, 2 train records (15 tokens) from 4 records\n"
                                "tunegraph: left out 1 record whose response encodes to no tokens\n"
                                "tunegraph: left out 1 record whose prompt leaves no room for a response in --seq 8\n"
                                "tunegraph: cut the response of 1 record to fit --seq 8\n", dir);
    expect_cli(dir, line, 0, "", want);
    /* Each twice, one more not UTF-8 left out, at the default --seq, 512: nothing cut or too long. */
    write_in(dir, "d2.jsonl", "{\"instruction\": \"cat\", \"output\": \"\"}\n{\"instruction\": \"\xff\", \"output\": \"a\"}\n"
                              "{\"instruction\": \"the\", \"output\": \"\"}\n{\"instruction\": \"hello\", \"output\": \"cat\"}\n");
    snprintf(line, sizeof line, "data convert %s/d2.jsonl -o %s/set2 --tokenizer %s/vocab.txt --format instruct --skip-invalid",
             dir, dir, dir);
    {
        tg_cli_run r = tg_test_cli_line(dir, line, NULL);
        const char *tail = r.err ? strstr(r.err, " tokens) from 3 records\n") : NULL;
        const char *rest = "tunegraph: left out 1 record that is not UTF-8 (--skip-invalid)\n"
                           "tunegraph: left out 2 records whose response encodes to no tokens\n";
        CHECK(r.status == 0 && tail && !strcmp(tail + strlen(" tokens) from 3 records\n"), rest), "%s: %s", line,
              r.err ? r.err : "");
        tg_cli_run_free(&r);
    }
    /* Twice each: cut and too long, at --seq 8. */
    write_in(dir, "d3.jsonl", "{\"instruction\": \"the cat\", \"output\": \"sat sat sat\"}\n"
                              "{\"instruction\": \"the cat\", \"output\": \"sat sat\"}\n"
                              "{\"instruction\": \"the cat sat\", \"output\": \"hello\"}\n"
                              "{\"instruction\": \"the the cat\", \"output\": \"hello\"}\n");
    snprintf(line, sizeof line, "data convert %s/d3.jsonl -o %s/set3 --tokenizer %s/vocab.txt --format instruct --template "
                                "%s/t.txt --seq 8", dir, dir, dir, dir);
    snprintf(want, sizeof want, "tunegraph: wrote %s/set3: instruct, 2 train records (16 tokens) from 4 records\n"
                                "tunegraph: left out 2 records whose prompt leaves no room for a response in --seq 8\n"
                                "tunegraph: cut the response of 2 records to fit --seq 8\n", dir);
    expect_cli(dir, line, 0, "", want);
    /* q : hello a : world [SEP]; q : the cat a : sat (cut) [SEP] */
    snprintf(line, sizeof line, "data dump %s/set -o %s/dump.jsonl", dir, dir);
    expect_cli(dir, line, 0, "", "tunegraph: dumped 2 records (instruct)\n");
    char path[800];
    snprintf(path, sizeof path, "%s/dump.jsonl", dir);
    char *text = tg_test_read_file(path, NULL);
    CHECK(text && !strcmp(text, "{\"input_ids\": [5, 7, 8, 6, 7, 9, 3], \"labels\": [-100, -100, -100, -100, -100, 9, 3]}\n"
                                "{\"input_ids\": [5, 7, 10, 11, 6, 7, 12, 3], \"labels\": [-100, -100, -100, -100, -100, "
                                "-100, 12, 3]}\n"),
          "dump:\n%s", text ? text : "(none)");
    /* The dump read back as a dataset and dumped again: the same lines. */
    snprintf(line, sizeof line, "data dump %s/dump.jsonl", dir);
    expect_cli(dir, line, 0, text, "tunegraph: dumped 2 records (lm)\n");
    free(text);
    /* tiny GPT-2 trains on the set with an eval over it. */
    snprintf(line, sizeof line, "run examples/demo-lm.job --device cpu --threads 1 --set steps=2 --set batch=2 --set seq=8 "
                                "--set train_data=%s/set --set eval_data=%s/set",
             dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 0 && r.err && strstr(r.err, "\neval on 2 examples: loss "), "%s: exit %d: %s", line, r.status,
          r.err ? r.err : "");
    tg_cli_run_free(&r);
}

/* ---- training: the loss counts the response tokens alone --------------------------------------- */

/* -log softmax(row)[label] over n logits. */
static double cross_entropy(const float *row, int64_t n, int32_t label) {
    double m = -INFINITY, sum = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, row[i]);
    for (int64_t i = 0; i < n; i++) sum += exp(row[i] - m);
    return m + log(sum) - row[label];
}

typedef struct logit_sums {
    const tg_trainer *tr;
    int64_t vocab, cols, seq; /* a row's logits: vocab of them, cols apart */
    double response_sum, all_sum;
    int64_t response_n, all_n;
} logit_sums;

/* Adds each eval example's cross-entropies: over its response targets, and over every
 * next token (what plain lm would count). */
static int add_logits(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    logit_sums *s = ctx;
    for (int32_t r = 0; r < rows; r++) {
        const tg_example *ex = &s->tr->eval.examples[first + r];
        const int32_t kept = ex->len < s->seq ? ex->len : (int32_t)s->seq;
        for (int32_t t = 0; t + 1 < kept; t++) {
            const double ce = cross_entropy(logits + ((int64_t)r * s->seq + t) * s->cols, s->vocab, ex->input_ids[t + 1]);
            s->all_sum += ce, s->all_n++;
            if (t + 1 >= ex->prompt_len) s->response_sum += ce, s->response_n++;
        }
    }
    return 0;
}

TG_TEST(test_instruct_training_counts_response_tokens_only) {
    /* Records through a short template, bytes as tokens (all below tiny GPT-2's 128), its
     * end-of-text token 4 first and last. */
    const char *dir = tg_test_tmpdir();
    char in[700], tpl[700], out[700];
    snprintf(in, sizeof in, "%s/arith.jsonl", dir);
    snprintf(tpl, sizeof tpl, "%s/t.txt", dir);
    snprintf(out, sizeof out, "%s/set", dir);
    static const char *const words[] = {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"};
    char text[8192] = "";
    for (int i = 0; i < 24; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text),
                 "{\"instruction\": \"add %d and %d\", \"output\": \"%s\"}\n", i % 5, i / 5, words[(i % 5 + i / 5) % 10]);
    REQUIRE(tg_test_write_file(in, text) == 0 && tg_test_write_file(tpl, "q:{instruction}\na:{output}") == 0, "inputs");
    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_BPE_GPT2);
    enc.vocab_size = 128;
    const char *inputs[] = {in};
    const tg_convert_options o = {.inputs = inputs, .n_inputs = 1, .outdir = out, .format = TG_INPUT_INSTRUCT,
                                  .template_path = tpl, .seq = 24, .doc_stride = -1, .eval_fraction = 0.25, .seed = 3,
                                  .command = "test"};
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&o, &enc, &rep, &err) == 0, "%s", err.msg);
    byte_encoder_free(&be);
    CHECK(rep.records[0] == 18 && rep.records[1] == 6, "%lld + %lld records", (long long)rep.records[0],
          (long long)rep.records[1]);

    char t[800], e[800];
    snprintf(t, sizeof t, "train_data=%s", out);
    snprintf(e, sizeof e, "eval_data=%s/eval", out);
    const char *sets[] = {t, e, "steps=4", "batch=4", "seq=24", "warmup_steps=0"};
    tg_job job;
    tg_plan plan;
    tg_trainer tr;
    REQUIRE(tg_job_load("examples/demo-lm.job", sets, 6, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    const tg_trainer_options opts = {.device = tg_test_device(), .load_data = 1, .threads = 2};
    if (!CHECK(tg_trainer_open(&tr, &plan, &opts, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return;
    }
    int ok = 1;
    for (int i = 0; ok && i < 4; i++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0 && isfinite(st.loss), "step %d: %s", i, err.msg);
    }
    /* The eval's loss and count against the cross-entropies of its own logits. */
    const tg_tensor *lt = &plan.tensors[plan.io.logits];
    logit_sums s = {.tr = &tr, .vocab = plan.model.vocab_size, .cols = lt->shape[lt->ndim - 1], .seq = plan.train.seq};
    tg_eval_stats ev;
    if (ok) ok = CHECK(tg_trainer_eval_logits(&tr, &ev, add_logits, &s, &err) == 0, "%s", err.msg);
    if (ok) {
        /* Every eval record: bos, "q:add I and J\na:" (16 bytes), the word, eos. */
        int64_t want_n = 0;
        for (int32_t i = 0; i < tr.eval.n; i++) {
            CHECK(tr.eval.examples[i].prompt_len == 17, "eval example %d: prompt %d", i, tr.eval.examples[i].prompt_len);
            want_n += tr.eval.examples[i].len - 17;
        }
        const double mean = s.response_sum / (double)s.response_n, all = s.all_sum / (double)s.all_n;
        CHECK(ev.examples == 6 && ev.counted == s.response_n && s.response_n == want_n,
              "eval counted %lld, response targets %lld (want %lld) of %lld", (long long)ev.counted,
              (long long)s.response_n, (long long)want_n, (long long)s.all_n);
        CHECK(fabs(ev.loss - mean) <= 1e-4 * fabs(mean), "eval loss %.6f, the response tokens' mean %.6f", ev.loss, mean);
        CHECK(fabs(all - mean) > 1e-2, "the mean over every token (%.4f) is the response's (%.4f)", all, mean);
        /* The checkpoint's data identity covers the prompts. */
        tg_checkpoint ck;
        if (CHECK(tg_trainer_checkpoint(&tr, &ck, 0, &err) == 0, "%s", err.msg)) tg_checkpoint_free(&ck);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}
