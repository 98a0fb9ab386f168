/* `data convert` through datasets/convert.h with a byte-level stand-in tokenizer
 * (tests/byte_encoder.h): each input format to records, the eval split, label ids, SQuAD
 * windows and answer positions, LM chunks, refusals with their messages, an output that is
 * all or nothing, and a job trained on a shard set. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "datasets/convert.h"
#include "datasets/dataset.h"
#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "runtime/trainer.h"
#include "tests/byte_encoder.h"
#include "tests/harness.h"

typedef struct fixture {
    char dir[512], out[600];
    byte_encoder be;
    tg_text_encoder enc;
    tg_convert_options opt;
    const char *inputs[4];
    char paths[4][600];
} fixture;

static void fixture_init(fixture *f, tg_tokenizer_family family) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s", tg_test_tmpdir());
    snprintf(f->out, sizeof f->out, "%s/out", f->dir);
    f->enc = byte_encoder_make(&f->be, family);
    f->opt = (tg_convert_options){.inputs = f->inputs, .outdir = f->out, .doc_stride = -1, .command = "test"};
}

/* Writes an input file and adds it to the options. */
static void fixture_input(fixture *f, const char *name, const char *text) {
    int i = f->opt.n_inputs++;
    char path[sizeof f->paths[i]];
    snprintf(path, sizeof path, "%s/%s", f->dir, name);
    memcpy(f->paths[i], path, sizeof path);
    tg_test_write_file(f->paths[i], text);
    f->inputs[i] = f->paths[i];
}

/* Reads split `split` of the output into records (ids as text for short checks). */
typedef struct got_set {
    tg_shard_set set;
    tg_shard_cursor cur;
    int ok;
} got_set;

static int open_out(const fixture *f, int split, got_set *g) {
    tg_err err = {{0}};
    memset(g, 0, sizeof *g);
    if (!CHECK(tg_shard_set_open(f->out, split, &g->set, &err) == 0, "%s", err.msg)) return 0;
    if (!CHECK(tg_shard_cursor_open(&g->cur, &g->set, &err) == 0, "%s", err.msg)) {
        tg_shard_set_close(&g->set);
        return 0;
    }
    return g->ok = 1;
}

static void close_out(got_set *g) {
    if (!g->ok) return;
    tg_shard_cursor_close(&g->cur);
    tg_shard_set_close(&g->set);
}

/* Record i as text: "[CLS]" "[SEP]" for ids 2 and 3, bytes for byte ids, "<4>" for 4. */
static const char *record_text(got_set *g, int64_t i, tg_shard_record *r) {
    static char buf[4096];
    tg_err err = {{0}};
    if (tg_shard_cursor_get(&g->cur, i, r, &err)) {
        snprintf(buf, sizeof buf, "error: %s", err.msg);
        return buf;
    }
    size_t at = 0;
    for (int32_t t = 0; t < r->len && at + 8 < sizeof buf; t++) {
        int32_t id = r->input_ids[t];
        if (id == 2) at += (size_t)snprintf(buf + at, sizeof buf - at, "[CLS]");
        else if (id == 3) at += (size_t)snprintf(buf + at, sizeof buf - at, "[SEP]");
        else if (id >= 5) buf[at++] = (char)(id - 5);
        else at += (size_t)snprintf(buf + at, sizeof buf - at, "<%d>", id);
    }
    buf[at] = 0;
    return buf;
}

static int convert(fixture *f, tg_convert_report *rep, tg_err *err) { return tg_convert(&f->opt, &f->enc, rep, err); }

static void expect_convert_error(fixture *f, const char *want) {
    tg_convert_report rep;
    tg_err err = {{0}};
    CHECK(convert(f, &rep, &err) == -1, "converted (want '%s')", want);
    CHECK(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
    struct stat st;
    CHECK(stat(f->out, &st) != 0, "a failed conversion left %s", f->out);
    DIR *d = opendir(f->dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        CHECK(strncmp(e->d_name, ".out.tmp", 8) != 0, "a failed conversion left %s", e->d_name);
    if (d) closedir(d);
}

TG_TEST(test_convert_csv_pairs_with_labels) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "train.csv", "premise,hypothesis,label\n"
                                   "a cat,an animal,entail\n"
                                   "\"long, long premise\",no,contradict\n"
                                   "x,y,entail\n");
    f.opt.pair_column = "hypothesis";
    f.opt.text_column = "premise";
    f.opt.seq = 20;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.task == TG_SHARD_CLASSIFY && rep.n_labels == 2 && rep.records[0] == 3 && rep.records[1] == 0,
          "task %d, %d labels, %lld records", rep.task, rep.n_labels, (long long)rep.records[0]);
    got_set g;
    if (!open_out(&f, TG_SPLIT_TRAIN, &g)) return;
    tg_shard_record r;
    const char *t = record_text(&g, 0, &r);
    CHECK(!strcmp(t, "[CLS]a cat[SEP]an animal[SEP]"), "record 0: %s", t);
    CHECK(r.label == 1 && r.token_type_ids && r.token_type_ids[7] == 1 && r.token_type_ids[6] == 0,
          "labels sorted (contradict 0, entail 1): %d; types", r.label);
    t = record_text(&g, 1, &r);
    /* 20 tokens: 3 for the template, the longer text trimmed. */
    CHECK(!strcmp(t, "[CLS]long, long prem[SEP]no[SEP]") && r.len == 20 && r.label == 0, "record 1: %s", t);
    CHECK(!strcmp(g.set.manifest.labels[0], "contradict") && g.set.manifest.tokenizer_identity == BYTE_IDENTITY &&
              !strcmp(g.set.manifest.tokenizer_family, "wordpiece") && !strcmp(g.set.manifest.command, "test"),
          "manifest");
    close_out(&g);
    byte_encoder_free(&f.be);
}

TG_TEST(test_convert_folders_and_labels) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    char d[700], p[800];
    const char *labels[] = {"sport", "business"};
    for (int i = 0; i < 2; i++) {
        snprintf(d, sizeof d, "%s/tree/%s", f.dir, labels[i]);
        snprintf(p, sizeof p, "%s/tree", f.dir);
        mkdir(p, 0755);
        mkdir(d, 0755);
        for (int k = 0; k < 3; k++) {
            snprintf(p, sizeof p, "%s/%03d.txt", d, k);
            char text[64];
            snprintf(text, sizeof text, "%s story %d", labels[i], k);
            tg_test_write_file(p, text);
        }
    }
    snprintf(f.paths[0], sizeof f.paths[0], "%s/tree", f.dir);
    f.inputs[0] = f.paths[0];
    f.opt.n_inputs = 1;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.format == TG_INPUT_FOLDERS && rep.task == TG_SHARD_CLASSIFY && rep.records[0] == 6, "format %d, %lld",
          rep.format, (long long)rep.records[0]);
    got_set g;
    if (open_out(&f, TG_SPLIT_TRAIN, &g)) {
        tg_shard_record r;
        const char *t = record_text(&g, 4, &r);
        CHECK(!strcmp(t, "[CLS]sport story 1[SEP]") && r.label == 1 && !r.token_type_ids, "record 4: %s label %d", t,
              r.label);
        close_out(&g);
    }
    /* A fixed label list sets the ids; a name outside it is refused with the file. */
    f.opt.labels = "sport,business";
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    if (open_out(&f, TG_SPLIT_TRAIN, &g)) {
        tg_shard_record r;
        record_text(&g, 0, &r);
        CHECK(r.label == 1, "business is 1 in the given list: %d", r.label);
        close_out(&g);
    }
    f.opt.labels = "sport,tech";
    snprintf(f.out, sizeof f.out, "%s/out2", f.dir);
    char want[900];
    snprintf(want, sizeof want, "%s/tree/business/000.txt: unknown label name 'business' (--labels lists: sport, tech)",
             f.dir);
    expect_convert_error(&f, want);
    byte_encoder_free(&f.be);
}

TG_TEST(test_convert_text_to_lm_chunks) {
    for (int family = 0; family < 2; family++) {
        fixture f;
        fixture_init(&f, family ? TG_TOKENIZER_WORDPIECE : TG_TOKENIZER_BPE_GPT2);
        fixture_input(&f, "a.txt", "abcdef\n\nghij\r\n");
        fixture_input(&f, "b.txt", "klmnopq");
        f.opt.seq = 5;
        tg_convert_report rep;
        tg_err err = {{0}};
        REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
        CHECK(rep.task == TG_SHARD_LM && rep.units == 3, "task %d, %lld lines", rep.task, (long long)rep.units);
        /* Lines joined by the end-of-text token (GPT-2: <4>; WordPiece: [SEP]), then cut
         * into 5-token records; the last partial record is kept. */
        const char *want_gpt2[] = {"abcde", "f<4>ghi", "j<4>klm", "nopq<4>"};
        const char *want_bert[] = {"abcde", "f[SEP]ghi", "j[SEP]klm", "nopq[SEP]"};
        got_set g;
        if (!open_out(&f, TG_SPLIT_TRAIN, &g)) return;
        CHECK(g.set.n_records == 4, "%lld records", (long long)g.set.n_records);
        for (int64_t i = 0; i < g.set.n_records && i < 4; i++) {
            tg_shard_record r;
            const char *t = record_text(&g, i, &r);
            CHECK(!strcmp(t, family ? want_bert[i] : want_gpt2[i]), "record %lld: %s", (long long)i, t);
        }
        close_out(&g);
        byte_encoder_free(&f.be);
    }
}

/* The tail of the joined lines: one token left over predicts nothing and is dropped, two
 * make a record; exactly full records leave no tail. The report counts the records and
 * tokens written. */
TG_TEST(test_convert_text_lm_tails) {
    static const struct {
        const char *text;
        int64_t records, tokens;
        const char *last;
    } cases[] = {
        {"abcd\nefghijklm\n", 3, 15, "jklm<4>"},     /* 15 tokens: 3 full records */
        {"abcd\nefghijklmn\n", 3, 15, "jklmn"},      /* 16: the tail <4> dropped */
        {"abcd\nefghijklmno\n", 4, 17, "o<4>"},      /* 17: a tail of two kept */
        {"a\n", 1, 2, "a<4>"},                          /* one record of two */
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        fixture f;
        fixture_init(&f, TG_TOKENIZER_BPE_GPT2);
        fixture_input(&f, "a.txt", cases[k].text);
        f.opt.seq = 5;
        tg_convert_report rep;
        tg_err err = {{0}};
        if (!CHECK(convert(&f, &rep, &err) == 0, "case %zu: %s", k, err.msg)) continue;
        CHECK(rep.records[TG_SPLIT_TRAIN] == cases[k].records && rep.tokens[TG_SPLIT_TRAIN] == cases[k].tokens &&
                  rep.records[TG_SPLIT_EVAL] == 0 && rep.tokens[TG_SPLIT_EVAL] == 0,
              "case %zu: %lld records, %lld tokens", k, (long long)rep.records[TG_SPLIT_TRAIN],
              (long long)rep.tokens[TG_SPLIT_TRAIN]);
        got_set g;
        if (!open_out(&f, TG_SPLIT_TRAIN, &g)) continue;
        CHECK(g.set.n_records == cases[k].records, "case %zu: %lld records", k, (long long)g.set.n_records);
        tg_shard_record r;
        const char *t = record_text(&g, g.set.n_records - 1, &r);
        CHECK(!strcmp(t, cases[k].last), "case %zu: last record '%s', want '%s'", k, t, cases[k].last);
        close_out(&g);
        byte_encoder_free(&f.be);
    }
    /* a single token in all: no records */
    fixture f;
    fixture_init(&f, TG_TOKENIZER_BPE_GPT2);
    fixture_input(&f, "one.txt", "\n\n");
    f.enc.special.eos = -1, f.enc.special.sep = -1;
    fixture_input(&f, "two.txt", "x");
    f.opt.seq = 5;
    tg_convert_report rep;
    tg_err err = {{0}};
    CHECK(convert(&f, &rep, &err) == -1 && strstr(err.msg, ": no records (every row encoded to no tokens)"),
          "one token: '%s'", err.msg);
    byte_encoder_free(&f.be);
}

/* Finds `answer` in record r's bytes between r.start and r.end. */
static int span_is(const tg_shard_record *r, const char *answer) {
    size_t n = strlen(answer);
    if (r->end - r->start + 1 != (int32_t)n) return 0;
    for (size_t i = 0; i < n; i++)
        if (r->input_ids[r->start + (int32_t)i] != BYTE_ID(answer[i])) return 0;
    return 1;
}

TG_TEST(test_convert_squad_windows_and_positions) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    /* A 40-byte context, question "  Q?" (stripped to "Q?"), seq 16: 16 - 2 - 3 = 11 context
     * tokens per window, stride 4 so windows start 7 apart: 0, 7, 14, 21, 28, 35; six windows
     * per question. */
    fixture_input(&f, "s.json",
                  "{\"data\": [{\"paragraphs\": [{\"context\": \"0123456789abcdefghijklmnopqrstuvwxyzABCD\", \"qas\": "
                  "[{\"id\": \"a\", \"question\": \"  Q?\", \"answers\": [{\"text\": \"mnop\", \"answer_start\": 22}]}, "
                  "{\"id\": \"b\", \"question\": \"Q?\", \"answers\": [], \"is_impossible\": true}]}]}]}");
    f.opt.seq = 16;
    f.opt.doc_stride = 4;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.task == TG_SHARD_QA && rep.records[0] == 12 && rep.units == 2, "task %d, %lld records", rep.task,
          (long long)rep.records[0]);
    /* "mnop" is bytes 22..25: windows [14, 25) and [21, 32) hold only part or all of it. */
    CHECK(rep.answered == 1, "%lld windows hold the answer", (long long)rep.answered);
    got_set g;
    if (!open_out(&f, TG_SPLIT_TRAIN, &g)) return;
    CHECK(g.set.manifest.doc_stride == 4, "doc_stride %d", g.set.manifest.doc_stride);
    const char *want[] = {"[CLS]Q?[SEP]0123456789a[SEP]", "[CLS]Q?[SEP]789abcdefgh[SEP]", "[CLS]Q?[SEP]efghijklmno[SEP]",
                          "[CLS]Q?[SEP]lmnopqrstuv[SEP]", "[CLS]Q?[SEP]stuvwxyzABC[SEP]", "[CLS]Q?[SEP]zABCD[SEP]"};
    for (int64_t i = 0; i < 12; i++) {
        tg_shard_record r;
        const char *t = record_text(&g, i, &r);
        CHECK(!strcmp(t, want[i % 6]), "window %lld: %s", (long long)i, t);
        if (i == 3) CHECK(span_is(&r, "mnop") && r.start == 5, "window 3: answer at %d..%d", r.start, r.end);
        else CHECK(r.start == 0 && r.end == 0, "window %lld: answer %d..%d, want [CLS]", (long long)i, r.start, r.end);
        CHECK(r.token_type_ids && r.token_type_ids[3] == 0 && r.token_type_ids[4] == 1, "types of window %lld",
              (long long)i);
    }
    close_out(&g);
    byte_encoder_free(&f.be);

    /* RoBERTa's template: <s> q </s></s> c </s>, no token types. */
    fixture_init(&f, TG_TOKENIZER_BPE_ROBERTA);
    fixture_input(&f, "s.json", "{\"data\": [{\"paragraphs\": [{\"context\": \"hello world\", \"qas\": [{\"id\": \"a\", "
                                "\"question\": \"who\", \"answers\": [{\"text\": \"world\", \"answer_start\": 6}]}]}]}]}");
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    if (open_out(&f, TG_SPLIT_TRAIN, &g)) {
        tg_shard_record r;
        const char *t = record_text(&g, 0, &r);
        CHECK(!strcmp(t, "[CLS]who[SEP][SEP]hello world[SEP]") && !r.token_type_ids, "roberta: %s", t);
        CHECK(span_is(&r, "world") && r.start == 12, "roberta answer %d..%d", r.start, r.end);
        close_out(&g);
    }
    byte_encoder_free(&f.be);

    /* Refusals: GPT-2 has no template; the answer must be in its context; the question must
     * leave room for the context. */
    fixture_init(&f, TG_TOKENIZER_BPE_GPT2);
    fixture_input(&f, "s.json", "{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"a\", "
                                "\"question\": \"q\", \"answers\": []}]}]}]}");
    expect_convert_error(&f, "question answering needs a tokenizer with [CLS] and [SEP] templates");
    byte_encoder_free(&f.be);
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "s.json", "{\"data\": [{\"paragraphs\": [{\"context\": \"the answer is 42\", \"qas\": [{\"id\": "
                                "\"q9\", \"question\": \"q\", \"answers\": [{\"text\": \"43\", \"answer_start\": 14}]}]}]}]}");
    char want_msg[900];
    snprintf(want_msg, sizeof want_msg, "%s: data[0].paragraphs[0].qas[0] (id 'q9'): answer '43' at character 14 is "
                                        "not in its context (the context there reads '42')",
             f.paths[0]);
    expect_convert_error(&f, want_msg);
    byte_encoder_free(&f.be);
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "s.json", "{\"data\": [{\"paragraphs\": [{\"context\": \"a long context here\", \"qas\": [{\"id\": "
                                "\"q1\", \"question\": \"a question far too long\", \"answers\": []}]}]}]}");
    f.opt.seq = 20;
    f.opt.doc_stride = 2;
    expect_convert_error(&f, "qas[0] (id 'q1'): the question takes 23 tokens, which with 3 special tokens leaves no room");
    byte_encoder_free(&f.be);
}

TG_TEST(test_convert_eval_split) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    char text[4096] = "text,label\n";
    for (int i = 0; i < 50; i++) snprintf(text + strlen(text), sizeof text - strlen(text), "row%02d,%c\n", i, 'a' + i % 4);
    fixture_input(&f, "d.csv", text);
    f.opt.eval_fraction = 0.2;
    f.opt.seed = 7;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.records[0] == 40 && rep.records[1] == 10, "split %lld + %lld", (long long)rep.records[0],
          (long long)rep.records[1]);
    /* The same seed picks the same rows, in input order within each split; another seed
     * picks others. */
    char first[2][64];
    got_set g;
    for (int run = 0; run < 3; run++) {
        if (run == 2) f.opt.seed = 8;
        if (run) REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
        if (!open_out(&f, TG_SPLIT_EVAL, &g)) return;
        tg_shard_record r;
        char seen[64] = "";
        int ordered = 1;
        for (int64_t i = 0; i < g.set.n_records; i++) {
            const char *t = record_text(&g, i, &r);
            if (i && strcmp(t, seen) <= 0) ordered = 0;
            snprintf(seen, sizeof seen, "%s", t);
            if (i == 0) snprintf(first[run == 2], sizeof first[0], "%s", t);
            if (i == 0 && run == 1) CHECK(!strcmp(t, first[0]), "seed 7 twice: %s vs %s", t, first[0]);
        }
        CHECK(ordered, "eval records out of input order");
        close_out(&g);
    }
    CHECK(strcmp(first[0], first[1]) != 0, "seeds 7 and 8 gave the same first eval row %s", first[0]);
    f.opt.eval_fraction = 0.999;
    snprintf(f.out, sizeof f.out, "%s/out-none", f.dir);
    expect_convert_error(&f, "--eval-fraction 0.999 of 50 rows leaves nothing to train on");
    byte_encoder_free(&f.be);
}

TG_TEST(test_convert_bad_inputs) {
    fixture f;
    char want[900];
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "empty.csv", "text,label\n");
    snprintf(want, sizeof want, "%s: no examples", f.paths[0]);
    expect_convert_error(&f, want);

    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "q.csv", "text,label\nfine,a\n\"broken,b\n");
    snprintf(want, sizeof want, "%s:3:1: unterminated quoted field", f.paths[0]);
    expect_convert_error(&f, want);

    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "q.tsv", "text\tlabel\nfi\"ne\ta\n");
    snprintf(want, sizeof want, "%s:2:3: stray quote in an unquoted field", f.paths[0]);
    expect_convert_error(&f, want);

    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "m.jsonl", "{\"text\": \"a\", \"label\": \"x\"}\n{\"text\": \"b\"}\n");
    snprintf(want, sizeof want, "%s:2: no label, but other rows have one", f.paths[0]);
    expect_convert_error(&f, want);

    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "u.jsonl", "{\"text\": \"a\"}\n");
    f.opt.labels = "x,y";
    expect_convert_error(&f, "--labels is given, but the rows have no labels");

    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "data.parquet", "PAR1");
    expect_convert_error(&f, "data.parquet: cannot tell the format from the name (--format");

    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "a.csv", "text\nx\n");
    fixture_input(&f, "b.txt", "y\n");
    expect_convert_error(&f, "b.txt: a text input among csv inputs");

    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "l.txt", "\xff\xfe" "abc\n");
    snprintf(want, sizeof want, "%s:1: column 'text' is not valid UTF-8 (byte 0xff at offset 0", f.paths[0]);
    expect_convert_error(&f, want);
    f.opt.skip_invalid = 1;
    expect_convert_error(&f, "no examples (every one was left out as not UTF-8)");
    byte_encoder_free(&f.be);
}

/* ---- a job trains on a shard set as on its JSONL ------------------------------------------ */

static int train_losses(const char *train, const char *eval, float *losses, int steps, tg_eval_stats *ev) {
    char t[700], e[700], s[32];
    snprintf(t, sizeof t, "train_data=%s", train);
    snprintf(e, sizeof e, "eval_data=%s", eval);
    snprintf(s, sizeof s, "steps=%d", steps);
    const char *sets[] = {t, e, s};
    tg_err err;
    tg_job job;
    tg_plan plan;
    tg_trainer tr;
    if (!CHECK(tg_job_load("examples/demo-classify.job", sets, 3, &job, &err) == 0, "%s", err.msg)) return 0;
    if (!CHECK(tg_compile(&job, &plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = tg_test_device(), .load_data = 1};
    if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return 0;
    }
    int ok = 1;
    for (int i = 0; ok && i < steps; i++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "%s", err.msg);
        losses[i] = st.loss;
    }
    if (ok) ok = CHECK(tg_trainer_eval(&tr, ev, &err) == 0, "%s", err.msg);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
    return ok;
}

TG_TEST(test_convert_job_trains_on_a_shard_set) {
    /* The demo's pre-tokenized examples written as a shard set, train and eval. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/demo", tg_test_tmpdir());
    const tg_data_rules rules = {TG_TASK_CLASSIFY, 2, 128, 2, 0, 0};
    tg_dataset train, eval;
    tg_err err = {{0}};
    REQUIRE(tg_dataset_load("examples/data/sentiment-train.jsonl", &rules, &train, &err) == 0, "%s", err.msg);
    REQUIRE(tg_dataset_load("examples/data/sentiment-eval.jsonl", &rules, &eval, &err) == 0, "%s", err.msg);
    char *const names[] = {"0", "1"};
    tg_shard_set_desc d = {.task = TG_SHARD_CLASSIFY, .seq = 64, .n_labels = 2, .labels = names,
                           .tokenizer_family = "wordpiece", .vocab_size = 128, .frame_bytes = 2048};
    tg_shard_writer *w;
    REQUIRE(tg_shard_writer_open(dir, &d, &w, &err) == 0, "%s", err.msg);
    int rc = 0;
    for (int s = 0; s < 2 && !rc; s++) {
        const tg_dataset *ds = s ? &eval : &train;
        for (int32_t i = 0; i < ds->n && !rc; i++) {
            const tg_example *e = &ds->examples[i];
            tg_shard_record r = {.len = e->len, .input_ids = e->input_ids, .token_type_ids = e->token_type_ids,
                                 .label = e->label};
            rc = tg_shard_writer_add(w, s, &r, &err);
        }
    }
    if (rc) tg_shard_writer_abort(w);
    else rc = tg_shard_writer_commit(w, &err);
    tg_dataset_free(&train);
    tg_dataset_free(&eval);
    REQUIRE(rc == 0, "%s", err.msg);
    /* Same examples, same order, same seed: the same losses to the bit. */
    enum { STEPS = 12 };
    float a[STEPS], b[STEPS];
    tg_eval_stats ea, eb;
    char eval_dir[700];
    snprintf(eval_dir, sizeof eval_dir, "%s/eval", dir);
    if (!train_losses("examples/data/sentiment-train.jsonl", "examples/data/sentiment-eval.jsonl", a, STEPS, &ea)) return;
    if (!train_losses(dir, eval_dir, b, STEPS, &eb)) return;
    CHECK(!memcmp(a, b, sizeof a), "losses differ: %.6f vs %.6f at step 0, %.6f vs %.6f at the last", a[0], b[0],
          a[STEPS - 1], b[STEPS - 1]);
    CHECK(ea.examples == eb.examples && ea.loss == eb.loss && ea.accuracy == eb.accuracy, "eval %d %.6f vs %d %.6f",
          ea.examples, ea.loss, eb.examples, eb.loss);
}

/* A tokenizer with neither an end-of-text nor a separator token: the lines of a text file
 * are joined with nothing between them, then cut into records as usual. */
TG_TEST(test_convert_text_lm_without_a_separator_token) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_BPE_GPT2);
    f.enc.special.eos = f.enc.special.sep = -1;
    fixture_input(&f, "a.txt", "abcdef\n\nghij\r\n");
    fixture_input(&f, "b.txt", "klmnopq");
    f.opt.seq = 5;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    const char *want[] = {"abcde", "fghij", "klmno", "pq"};
    got_set g;
    if (open_out(&f, TG_SPLIT_TRAIN, &g)) {
        CHECK(g.set.n_records == 4, "%lld records", (long long)g.set.n_records);
        for (int64_t i = 0; i < g.set.n_records && i < 4; i++) {
            tg_shard_record r;
            const char *t = record_text(&g, i, &r);
            CHECK(!strcmp(t, want[i]), "record %lld: '%s', want '%s'", (long long)i, t, want[i]);
        }
        close_out(&g);
    }
    byte_encoder_free(&f.be);
}

/* An input named by fewer characters than any format's suffix: the name tells no format. */
TG_TEST(test_convert_input_name_shorter_than_a_suffix) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "ab", "x,0\n");
    f.inputs[0] = "ab"; /* relative to the fixture's folder */
    f.opt.seq = 8;
    const int here = open(".", O_RDONLY | O_DIRECTORY);
    REQUIRE(here >= 0 && chdir(f.dir) == 0, "chdir %s", f.dir);
    tg_convert_report rep;
    tg_err err = {{0}};
    const int rc = convert(&f, &rep, &err);
    CHECK(fchdir(here) == 0, "back to the first folder");
    close(here);
    CHECK(rc == -1 && !strcmp(err.msg, "ab: cannot tell the format from the name (--format "
                                       "csv|tsv|jsonl|squad|text|folders|instruct|idx|images)"),
          "rc %d '%s'", rc, err.msg);
    byte_encoder_free(&f.be);
}

/* The separator token completes a record that the writer refuses (here an end-of-text id
 * outside the vocabulary): the conversion stops with the writer's message, leaving nothing. */
TG_TEST(test_convert_text_lm_record_completed_by_a_refused_separator) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_BPE_GPT2);
    f.enc.special.eos = f.enc.vocab_size;
    fixture_input(&f, "a.txt", "abc\n");
    f.opt.seq = 4;
    char want[200];
    snprintf(want, sizeof want,
             "shard writer: record 0 of the train split: input_ids[3] = %d is outside the vocabulary (%d)",
             f.enc.vocab_size, f.enc.vocab_size);
    expect_convert_error(&f, want);
    byte_encoder_free(&f.be);
}

/* The progress callback: after each unit but the last (then the report says the rest),
 * with the units done in order, the whole count, and the tokens written so far. */
typedef struct progress_log {
    int calls;
    int64_t last_done, total, last_tokens;
    int ordered;
} progress_log;

static void log_progress(void *ctx, int64_t done, int64_t total, int64_t tokens) {
    progress_log *l = ctx;
    l->ordered &= done == l->last_done + 1 && tokens >= l->last_tokens && (l->calls == 0 || total == l->total);
    l->calls++, l->last_done = done, l->total = total, l->last_tokens = tokens;
}

TG_TEST(test_convert_progress_callback) {
    fixture f;
    fixture_init(&f, TG_TOKENIZER_WORDPIECE);
    fixture_input(&f, "t.csv", "text,label\naa,x\nbbb,y\ncccc,x\nd,y\n");
    progress_log l = {.ordered = 1};
    f.opt.progress = log_progress, f.opt.progress_ctx = &l;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(l.ordered && l.calls == 3 && l.last_done == 3 && l.total == 4 && l.last_tokens > 0 &&
              l.last_tokens < rep.tokens[0],
          "rows: %d calls, last %lld of %lld, %lld tokens (report %lld), ordered %d", l.calls, (long long)l.last_done,
          (long long)l.total, (long long)l.last_tokens, (long long)rep.tokens[0], l.ordered);
    fixture g;
    fixture_init(&g, TG_TOKENIZER_WORDPIECE);
    snprintf(g.out, sizeof g.out, "%s/out-squad", g.dir);
    fixture_input(&g, "s.json",
                  "{\"data\": [{\"paragraphs\": [{\"context\": \"0123456789\", \"qas\": [{\"id\": \"a\", \"question\": "
                  "\"Q?\", \"answers\": []}, {\"id\": \"b\", \"question\": \"R?\", \"answers\": []}, {\"id\": \"c\", "
                  "\"question\": \"S?\", \"answers\": []}]}]}]}");
    progress_log q = {.ordered = 1};
    g.opt.progress = log_progress, g.opt.progress_ctx = &q;
    REQUIRE(convert(&g, &rep, &err) == 0, "%s", err.msg);
    CHECK(q.ordered && q.calls == 2 && q.last_done == 2 && q.total == 3, "questions: %d calls, last %lld of %lld",
          q.calls, (long long)q.last_done, (long long)q.total);
    byte_encoder_free(&f.be);
    byte_encoder_free(&g.be);
}
