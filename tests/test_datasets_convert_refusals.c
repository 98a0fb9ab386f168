/* `data convert` refusals and edge cases, table-driven: the options it refuses, malformed
 * SQuAD files (each message naming the file and the JSON path of the fault), the QA window
 * builder on hand-made contexts, encoder and writer failures naming the row, and every
 * allocation of a conversion failed in turn. Uses the byte-level stand-in tokenizer
 * (tests/byte_encoder.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "datasets/convert.h"
#include "datasets/qa_features.h"
#include "datasets/shard_format.h"
#include "datasets/squad.h"
#include "tests/byte_encoder.h"
#include "tests/harness.h"

/* ---- a fixture: a temp folder of inputs and an output folder ---------------------------- */

typedef struct conv {
    char dir[512], out[600];
    byte_encoder be;
    tg_text_encoder enc;
    tg_convert_options opt;
    const char *inputs[4];
    char paths[4][700];
} conv;

static void conv_init(conv *c, tg_tokenizer_family family, const char *sub) {
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s/%s", tg_test_tmpdir(), sub);
    mkdir(c->dir, 0755);
    snprintf(c->out, sizeof c->out, "%s/out", c->dir);
    c->enc = byte_encoder_make(&c->be, family);
    c->opt = (tg_convert_options){.inputs = c->inputs, .outdir = c->out, .doc_stride = -1, .command = "test"};
}

static void conv_input(conv *c, const char *name, const char *text) {
    int i = c->opt.n_inputs++;
    char path[sizeof c->paths[i]];
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    memcpy(c->paths[i], path, sizeof path);
    if (text) tg_test_write_file(c->paths[i], text);
    c->inputs[i] = c->paths[i];
}

/* Runs the conversion; 1 when it failed with a message holding `want` (which may hold one
 * %s for the first input's path) and left no output folder. */
static int conv_refused(conv *c, const char *want, const char *label) {
    char expect[1200];
    snprintf(expect, sizeof expect, want, c->paths[0]);
    tg_convert_report rep;
    tg_err err = {{0}};
    int rc = tg_convert(&c->opt, &c->enc, &rep, &err);
    struct stat st;
    int ok = CHECK(rc == -1, "%s: converted (want '%s')", label, expect);
    ok &= CHECK(strstr(err.msg, expect) != NULL, "%s: message '%s' lacks '%s'", label, err.msg, expect);
    ok &= CHECK(stat(c->out, &st) != 0, "%s: a failed conversion left %s", label, c->out);
    return ok;
}

/* ---- options ------------------------------------------------------------------------- */

TG_TEST(test_convert_format_names) {
    const char *names[] = {"csv", "tsv", "jsonl", "squad", "text", "folders", "instruct", "idx", "images"};
    for (int i = 0; i < 9; i++) {
        CHECK(tg_input_format_parse(names[i]) == i + 1, "%s -> %d", names[i], tg_input_format_parse(names[i]));
        CHECK(!strcmp(tg_input_format_name(i + 1), names[i]), "name of %d: %s", i + 1, tg_input_format_name(i + 1));
    }
    CHECK(tg_input_format_parse("auto") == -1 && tg_input_format_parse("xml") == -1 && tg_input_format_parse("") == -1,
          "auto, xml and '' are no input formats");
    CHECK(!strcmp(tg_input_format_name(0), "auto") && !strcmp(tg_input_format_name(-1), "?") &&
              !strcmp(tg_input_format_name(10), "?"),
          "names of 0, -1, 10");
}

typedef struct option_case {
    const char *file, *text; /* one input */
    int format;
    const char *text_column, *pair_column, *label_column, *labels;
    int32_t seq, doc_stride;
    double eval_fraction;
    int32_t vocab;
    int gpt2; /* GPT-2's family (no template) rather than WordPiece's */
    const char *want;
} option_case;

TG_TEST(test_convert_refuses_options) {
    static const option_case cases[] = {
        {"a.csv", "text\nx\n", .eval_fraction = -0.1, .want = "--eval-fraction -0.1 is outside [0, 1)"},
        {"a.csv", "text\nx\n", .eval_fraction = 1, .want = "--eval-fraction 1 is outside [0, 1)"},
        {"a.csv", "text\nx\n", .eval_fraction = NAN, .want = "--eval-fraction nan is outside [0, 1)"},
        {"a.csv", "text\nx\n", .format = 10, .want = "unknown input format 10"},
        {"a.csv", "text\nx\n", .format = -1, .want = "unknown input format -1"},
        {"missing.csv", NULL, .want = "%s: cannot open: no such file or folder"},
        {"a.txt", "x\n", .text_column = "t", .want = "--text-column, --pair-column and --label-column are for csv, "
                                                     "tsv and jsonl inputs, not text"},
        {"a.txt", "x\n", .pair_column = "p", .want = "are for csv, tsv and jsonl inputs, not text"},
        {"a.json", "{}", .label_column = "l", .want = "are for csv, tsv and jsonl inputs, not squad"},
        {"a.json", "{}", .labels = "a,b", .want = "--labels is for labelled inputs (csv, tsv, jsonl, folders), not squad"},
        {"a.txt", "x\n", .labels = "a,b", .want = "--labels is for labelled inputs (csv, tsv, jsonl, folders), not text"},
        {"a.csv", "text\nx\n", .doc_stride = 5, .want = "--doc-stride is for squad inputs, not csv"},
        {"a.csv", "text\nx\n", .seq = 1, .want = "--seq 1 is outside 2 to 4194304"},
        {"a.csv", "text\nx\n", .seq = TG_SHARD_SEQ_MAX + 1, .want = "--seq 4194305 is outside 2 to 4194304"},
        {"a.csv", "text\nx\n", .vocab = -1, .want = "the tokenizer has no vocabulary"},
        {"a.json", "{\"data\": []}", .seq = 20, .doc_stride = 20, .want = "--doc-stride 20 must be smaller than --seq 20"},
        /* the default stride, 128, against a given seq */
        {"a.json", "{\"data\": []}", .seq = 100, .doc_stride = -1, .want = "--doc-stride 128 must be smaller than --seq 100"},
        {"a.json", "{\"data\": []}", .seq = 20, .doc_stride = 4, .want = "%s: no questions"},
        {"a.csv", "text,label\nx,y\n", .label_column = "lab", .want = "%s: no column 'lab' for the label (the header "
                                                                          "has 'text', 'label')"},
        {"a.csv", "text,label\nx,\n", .want = "%s:2: the label ('label') is empty"},
        {"a.csv", "text\n\"\"\n", .gpt2 = 1, .want = "%s: no records (every row encoded to no tokens)"},
        /* vocabulary 50: byte ids (5 + byte) past it are refused by the writer, naming the row */
        {"a.csv", "text\nx\n", .vocab = 50, .want = "%s:2: shard writer: "},
        {"a.txt", "xyz\n", .vocab = 50, .seq = 2, .want = "input_ids[0] = 125 is outside the vocabulary (50)"},
        {"a.txt", "xyz\n", .vocab = 50, .seq = 8, .want = "input_ids[0] = 125 is outside the vocabulary (50)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const option_case *k = &cases[i];
        char sub[32], label[64];
        snprintf(sub, sizeof sub, "opt%zu", i);
        snprintf(label, sizeof label, "case %zu (%s)", i, k->want);
        conv c;
        conv_init(&c, k->gpt2 ? TG_TOKENIZER_BPE_GPT2 : TG_TOKENIZER_WORDPIECE, sub);
        conv_input(&c, k->file, k->text);
        c.opt.format = k->format;
        c.opt.text_column = k->text_column;
        c.opt.pair_column = k->pair_column;
        c.opt.label_column = k->label_column;
        c.opt.labels = k->labels;
        c.opt.seq = k->seq;
        c.opt.doc_stride = k->doc_stride ? k->doc_stride : -1;
        c.opt.eval_fraction = k->eval_fraction;
        if (k->vocab) c.enc.vocab_size = k->vocab < 0 ? 0 : k->vocab;
        conv_refused(&c, k->want, label);
        byte_encoder_free(&c.be);
    }
    conv c;
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "none");
    conv_refused(&c, "no input", "no inputs");
    /* A folder input with no label folders in it. */
    conv_input(&c, "tree", NULL);
    mkdir(c.paths[0], 0755);
    conv_refused(&c, "%s: no label folders (the layout is", "empty tree");
    byte_encoder_free(&c.be);
}

TG_TEST(test_convert_format_from_names_and_given_format) {
    /* .tab and .TSV are TSV, .JSONL jsonl, by name; --format overrides the name. */
    const char *names[] = {"a.tab", "b.TSV"};
    for (int i = 0; i < 2; i++) {
        conv c;
        char sub[16];
        snprintf(sub, sizeof sub, "ext%d", i);
        conv_init(&c, TG_TOKENIZER_WORDPIECE, sub);
        conv_input(&c, names[i], "text\tlabel\nab\tx\ncd\ty\n");
        tg_convert_report rep;
        tg_err err = {{0}};
        REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s: %s", names[i], err.msg);
        CHECK(rep.format == TG_INPUT_TSV && rep.task == TG_SHARD_CLASSIFY && rep.records[0] == 2 && rep.n_labels == 2,
              "%s: format %d task %d records %lld labels %d", names[i], rep.format, rep.task, (long long)rep.records[0],
              rep.n_labels);
        byte_encoder_free(&c.be);
    }
    conv c;
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "given");
    conv_input(&c, "rows.dat", "text\tlabel\nab\tx\n");
    conv_refused(&c, "%s: cannot tell the format from the name", "no format");
    c.opt.format = TG_INPUT_TSV;
    c.opt.doc_stride = 0; /* 0 is no stride, allowed for any format */
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.format == TG_INPUT_TSV && rep.records[0] == 1 && rep.tokens[0] == 4, "format %d, %lld records, %lld tokens",
          rep.format, (long long)rep.records[0], (long long)rep.tokens[0]);
    byte_encoder_free(&c.be);
}

TG_TEST(test_convert_manifest_family_names) {
    /* The family recorded in the manifest: RoBERTa's, GPT-2's, Llama's, and "unknown" for
     * another. */
    const struct {
        int family;
        const char *want;
    } cases[] = {{TG_TOKENIZER_BPE_ROBERTA, "\"bpe-roberta\""},
                 {TG_TOKENIZER_BPE_GPT2, "\"bpe-gpt2\""},
                 {TG_TOKENIZER_BPE_LLAMA, "\"bpe-llama\""},
                 {77, "\"unknown\""}};
    for (int i = 0; i < 4; i++) {
        conv c;
        char sub[16], manifest[800];
        snprintf(sub, sizeof sub, "fam%d", i);
        conv_init(&c, TG_TOKENIZER_WORDPIECE, sub);
        c.enc.family = cases[i].family;
        conv_input(&c, "a.jsonl", "{\"text\": \"hi\"}\n");
        tg_convert_report rep;
        tg_err err = {{0}};
        REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s", err.msg);
        snprintf(manifest, sizeof manifest, "%s/manifest.json", c.out);
        char *m = tg_test_read_file(manifest, NULL);
        CHECK(m && strstr(m, cases[i].want), "family %d: manifest lacks %s", cases[i].family, cases[i].want);
        free(m);
        byte_encoder_free(&c.be);
    }
}

/* ---- rows: labels, splits, LM tails ----------------------------------------------------- */

TG_TEST(test_convert_unknown_label_lists_names) {
    conv c;
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "lab");
    char long_label[120];
    memset(long_label, 'z', 100);
    long_label[100] = 0;
    char text[400];
    snprintf(text, sizeof text, "text,label\na,%s\n", long_label);
    conv_input(&c, "a.csv", text);
    /* Twelve 40-byte names overflow the 400-byte list: it ends ", ..."; the label shown is
     * cut at 80 bytes. */
    char labels[1000] = "";
    for (int i = 0; i < 12; i++)
        snprintf(labels + strlen(labels), sizeof labels - strlen(labels), "%s%02d%038d", i ? "," : "", i, 0);
    c.opt.labels = labels;
    char want[600];
    snprintf(want, sizeof want, "%%s:2: unknown label name '%.80s' (--labels lists: 00%038d, 01", long_label, 0);
    conv_refused(&c, want, "unknown label");
    tg_convert_report rep;
    tg_err err = {{0}};
    tg_convert(&c.opt, &c.enc, &rep, &err);
    size_t n = strlen(err.msg);
    CHECK(n > 5 && !strcmp(err.msg + n - 6, ", ...)"), "the list is cut: %s", err.msg);
    CHECK(strstr(err.msg, long_label) == NULL, "the label is not cut at 80 bytes: %s", err.msg);
    byte_encoder_free(&c.be);
}

TG_TEST(test_convert_empty_rows_and_split_refusals) {
    /* GPT-2 adds no template, so an empty text encodes to nothing: left out and counted. */
    conv c;
    conv_init(&c, TG_TOKENIZER_BPE_GPT2, "empty");
    conv_input(&c, "a.csv", "text\n\"\"\nab\n\"\"\n");
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.skipped_empty == 2 && rep.records[0] == 1 && rep.units == 3 && rep.task == TG_SHARD_LM,
          "skipped %lld, %lld records of %lld rows", (long long)rep.skipped_empty, (long long)rep.records[0],
          (long long)rep.units);
    byte_encoder_free(&c.be);

    /* One empty row and one not, half to eval: whichever split gets the empty row comes
     * out empty. Seeds 1..40 give both cases. */
    int seen[2] = {0, 0};
    for (uint64_t seed = 1; seed <= 40; seed++) {
        char sub[16];
        snprintf(sub, sizeof sub, "split%d", (int)seed);
        conv_init(&c, TG_TOKENIZER_BPE_GPT2, sub);
        conv_input(&c, "a.csv", "text\n\"\"\nab\n");
        c.opt.eval_fraction = 0.5;
        c.opt.seed = seed;
        REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == -1, "seed %d converted", (int)seed);
        int eval_empty = rep.records[TG_SPLIT_TRAIN] == 1;
        const char *want = eval_empty ? "the eval split came out empty (its lines made less than one record"
                                      : "the train split came out empty (lower --seq or --eval-fraction)";
        CHECK(strstr(err.msg, want) != NULL, "seed %d: '%s' lacks '%s'", (int)seed, err.msg, want);
        CHECK(rep.records[0] + rep.records[1] == 1, "seed %d: %lld + %lld records", (int)seed,
              (long long)rep.records[0], (long long)rep.records[1]);
        seen[eval_empty] = 1;
        byte_encoder_free(&c.be);
    }
    CHECK(seen[0] && seen[1], "both splits came out empty for some seed: train %d eval %d", seen[0], seen[1]);

    /* No examples in either of two inputs. */
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "noex");
    conv_input(&c, "a.jsonl", "\n");
    conv_input(&c, "b.jsonl", "  \n");
    conv_refused(&c, "%s and the other inputs: no examples", "no examples");
    byte_encoder_free(&c.be);
}

TG_TEST(test_convert_text_tail_records) {
    /* seq 5, GPT-2 (separator <4>): "abc" -> "abc<4>", a 4-token tail kept; "abcde" ->
     * "abcde" and a 1-token tail "<4>" dropped. */
    const struct {
        const char *text;
        int64_t records, tokens;
    } cases[] = {{"abc\n", 1, 4}, {"abcde\n", 1, 5}, {"abcdefgh\n", 2, 9}};
    for (int i = 0; i < 3; i++) {
        conv c;
        char sub[16];
        snprintf(sub, sizeof sub, "tail%d", i);
        conv_init(&c, TG_TOKENIZER_BPE_GPT2, sub);
        conv_input(&c, "a.txt", cases[i].text);
        c.opt.seq = 5;
        tg_convert_report rep;
        tg_err err = {{0}};
        REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s", err.msg);
        CHECK(rep.records[0] == cases[i].records && rep.tokens[0] == cases[i].tokens, "'%s': %lld records, %lld tokens",
              cases[i].text, (long long)rep.records[0], (long long)rep.tokens[0]);
        byte_encoder_free(&c.be);
    }
    /* A tokenizer with neither an end-of-text nor a separator token joins lines with none. */
    conv c;
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "nosep");
    c.enc.special.sep = -1;
    conv_input(&c, "a.txt", "ab\ncd\n");
    c.opt.seq = 3;
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.records[0] == 1 && rep.tokens[0] == 3, "'abcd' in 3s: %lld records, %lld tokens (the 'd' dropped)",
          (long long)rep.records[0], (long long)rep.tokens[0]);
    byte_encoder_free(&c.be);
}

/* ---- an encoder that fails on a marked text --------------------------------------------- */

static int failing_encode(void *ctx, const char *text, size_t len, const char *pair, size_t pair_len,
                          const tg_encode_options *opt, const tg_encoding **out, tg_err *err) {
    if (len >= 4 && !memcmp(text, "FAIL", 4)) return tg_fail(err, "the encoder refused '%.*s'", (int)len, text);
    return byte_encode(ctx, text, len, pair, pair_len, opt, out, err);
}

TG_TEST(test_convert_encoder_failures_name_the_row) {
    const struct {
        const char *file, *text, *want;
    } cases[] = {
        {"a.csv", "text\nok\nFAIL here\n", "%s:3: the encoder refused 'FAIL here'"},
        {"a.txt", "ok\n\nFAIL\n", "%s:3: the encoder refused 'FAIL'"},
        {"a.json",
         "{\"data\": [{\"paragraphs\": [{\"context\": \"FAILING context\", \"qas\": [{\"id\": \"q1\", \"question\": "
         "\"what\", \"answers\": []}]}]}]}",
         "%s: data[0].paragraphs[0].qas[0] (context): the encoder refused 'FAILING context'"},
        {"a.json",
         "{\"data\": [{\"paragraphs\": [{\"context\": \"ctx\", \"qas\": [{\"id\": \"q1\", \"question\": \"FAIL?\", "
         "\"answers\": []}]}]}]}",
         "%s: data[0].paragraphs[0].qas[0] (id 'q1'): the encoder refused 'FAIL?'"},
    };
    for (int i = 0; i < 4; i++) {
        conv c;
        char sub[16], label[32];
        snprintf(sub, sizeof sub, "enc%d", i);
        snprintf(label, sizeof label, "encoder case %d", i);
        conv_init(&c, TG_TOKENIZER_WORDPIECE, sub);
        c.enc.encode = failing_encode;
        conv_input(&c, cases[i].file, cases[i].text);
        if (cases[i].file[2] == 'j') c.opt.seq = 32, c.opt.doc_stride = 4;
        conv_refused(&c, cases[i].want, label);
        byte_encoder_free(&c.be);
    }
}

/* ---- SQuAD: several files, the eval split by article, blank-led questions ---------------- */

TG_TEST(test_convert_squad_files_and_article_split) {
    conv c;
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "sq");
    const char *one = "{\"data\": [{\"paragraphs\": [{\"context\": \"abc def\", \"qas\": [{\"id\": \"a\", \"question\": "
                      "\" \\t\\n\\r\\f\\u000bQ\", \"answers\": [{\"text\": \"def\", \"answer_start\": 4}]}]}]}, "
                      "{\"paragraphs\": [{\"context\": \"xyz\", \"qas\": [{\"id\": 7, \"question\": \"R\", "
                      "\"answers\": []}]}]}]}";
    conv_input(&c, "one.json", one);
    conv_input(&c, "two.json", "{\"data\": [{\"paragraphs\": [{\"context\": \"uvw\", \"qas\": [{\"id\": \"z\", "
                               "\"question\": \"S\", \"answers\": []}]}]}]}");
    c.opt.seq = 16;
    c.opt.doc_stride = 2;
    c.opt.eval_fraction = 0.3; /* ceil(0.3 x 3 articles) = 1 */
    tg_convert_report rep;
    tg_err err = {{0}};
    REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.units == 3 && rep.records[0] == 2 && rep.records[1] == 1 && rep.answered == 1,
          "%lld questions, %lld + %lld windows, %lld answered", (long long)rep.units, (long long)rep.records[0],
          (long long)rep.records[1], (long long)rep.answered);
    /* The blanks before "Q" are stripped: [CLS] Q [SEP] abc def [SEP] is 11 tokens. */
    CHECK(rep.tokens[0] + rep.tokens[1] == 11 + 7 + 7, "%lld + %lld tokens", (long long)rep.tokens[0],
          (long long)rep.tokens[1]);
    byte_encoder_free(&c.be);

    /* The second file is missing (the format given) or malformed. */
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "sq2");
    conv_input(&c, "one.json", one);
    conv_input(&c, "missing.json", NULL);
    c.opt.format = TG_INPUT_SQUAD;
    conv_refused(&c, "missing.json: cannot open", "missing second file");
    snprintf(c.paths[1], sizeof c.paths[1], "%s/bad.json", c.dir);
    tg_test_write_file(c.paths[1], "{\"data\": [7]}");
    conv_refused(&c, "bad.json: data[0] must be an object", "bad second file");
    /* The first of two files malformed: the second is not read. */
    snprintf(c.paths[1], sizeof c.paths[1], "%s/missing.json", c.dir);
    tg_test_write_file(c.paths[0], "{\"data\": 1}");
    conv_refused(&c, "%s: the top level.data must be an array", "bad first file");
    byte_encoder_free(&c.be);

    /* A question of blanks only is stripped to nothing: [CLS] [SEP] context [SEP]. */
    conv_init(&c, TG_TOKENIZER_WORDPIECE, "sq3");
    conv_input(&c, "q.json", "{\"data\": [{\"paragraphs\": [{\"context\": \"abc\", \"qas\": [{\"id\": \"a\", "
                             "\"question\": \"  \\t \", \"answers\": []}]}]}]}");
    c.opt.seq = 16;
    c.opt.doc_stride = 2;
    REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.records[0] == 1 && rep.tokens[0] == 6, "%lld records of %lld tokens", (long long)rep.records[0],
          (long long)rep.tokens[0]);
    byte_encoder_free(&c.be);
}

/* ---- SQuAD files: a table of malformed ones ---------------------------------------------- */

#define CTX(qas) "{\"data\": [{\"paragraphs\": [{\"context\": \"abcdef\", \"qas\": [" qas "]}]}]}"
#define QA(rest) CTX("{\"id\": \"a\", \"question\": \"q\", " rest "}")

TG_TEST(test_squad_refuses_malformed_files) {
    static const struct {
        const char *json, *want;
    } cases[] = {
        {"{\"data\": [", "s.json:1:10: invalid JSON"},
        {"{\"data\": [], \"data\": []}", "s.json:1:"},
        {"[]", "s.json: expected a SQuAD object {\"data\": [...]}"},
        {"{}", "s.json: the top level has no \"data\""},
        {"{\"data\": {}}", "s.json: the top level.data must be an array"},
        {"{\"data\": []}", "s.json: no questions"},
        {"{\"data\": [1]}", "s.json: data[0] must be an object"},
        {"{\"data\": [{}]}", "s.json: data[0] has no \"paragraphs\""},
        {"{\"data\": [{\"paragraphs\": \"x\"}]}", "s.json: data[0].paragraphs must be an array"},
        {"{\"data\": [{\"paragraphs\": [[]]}]}", "s.json: data[0].paragraphs[0] must be an object"},
        {"{\"data\": [{\"paragraphs\": [{}]}]}", "s.json: data[0].paragraphs[0] has no \"context\""},
        {"{\"data\": [{\"paragraphs\": [{\"context\": 5}]}]}", "s.json: data[0].paragraphs[0].context must be a string"},
        {"{\"data\": [{\"paragraphs\": [{\"context\": \"c\"}]}]}", "s.json: data[0].paragraphs[0] has no \"qas\""},
        {CTX(""), "s.json: no questions"},
        {CTX("3"), "s.json: data[0].paragraphs[0].qas[0] must be an object"},
        {CTX("{\"question\": \"q\", \"answers\": []}"), "qas[0]: \"id\" must be a string or an integer"},
        {CTX("{\"id\": 1.5, \"question\": \"q\", \"answers\": []}"), "qas[0]: \"id\" must be a string or an integer"},
        {CTX("{\"id\": \"a\", \"answers\": []}"), "s.json: data[0].paragraphs[0].qas[0] has no \"question\""},
        {CTX("{\"id\": \"a\", \"question\": [], \"answers\": []}"), "qas[0].question must be a string"},
        {QA("\"answers\": [], \"is_impossible\": 1"), "qas[0] (id 'a'): is_impossible must be true or false"},
        {QA("\"is_impossible\": false"), "s.json: data[0].paragraphs[0].qas[0] has no \"answers\""},
        {QA("\"answers\": {}"), "qas[0].answers must be an array"},
        {QA("\"answers\": [\"def\"]"), "qas[0].answers[0] (id 'a') must be an object"},
        {QA("\"answers\": [{\"answer_start\": 1}]"), "qas[0].answers[0] has no \"text\""},
        {QA("\"answers\": [{\"text\": \"b\"}]"), "qas[0].answers[0] (id 'a'): answer_start must be a whole number >= 0"},
        {QA("\"answers\": [{\"text\": \"b\", \"answer_start\": \"1\"}]"), "answer_start must be a whole number >= 0"},
        {QA("\"answers\": [{\"text\": \"b\", \"answer_start\": -1}]"), "answer_start must be a whole number >= 0"},
        {QA("\"answers\": [{\"text\": \"\", \"answer_start\": 1}]"), "qas[0].answers[0] (id 'a'): the answer text is empty"},
        {QA("\"answers\": [{\"text\": \"b\", \"answer_start\": 9}]"),
         "s.json: data[0].paragraphs[0].qas[0] (id 'a'): answer 'b' at character 9 is not in its context (the context "
         "has fewer characters)"},
        {QA("\"answers\": [{\"text\": \"efgh\", \"answer_start\": 4}]"),
         "answer 'efgh' at character 4 is not in its context (the context there reads 'ef')"},
        {QA("\"answers\": [{\"text\": \"bcd\", \"answer_start\": 0}]"),
         "answer 'bcd' at character 0 is not in its context (the context there reads 'abc')"},
        /* an integer id is spelled out in messages */
        {CTX("{\"id\": 57, \"question\": \"q\", \"answers\": [{\"text\": \"x\", \"answer_start\": 0}]}"),
         "qas[0] (id '57'): answer 'x' at character 0"},
        /* a second answer is checked too, also under is_impossible */
        {QA("\"is_impossible\": true, \"answers\": [{\"text\": \"a\", \"answer_start\": 0}, {\"text\": \"z\", "
            "\"answer_start\": 0}]"),
         "qas[0] (id 'a'): answer 'z' at character 0 is not in its context"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_squad sq;
        tg_err err = {{0}};
        int rc = tg_squad_parse("s.json", cases[i].json, strlen(cases[i].json), &sq, &err);
        CHECK(rc == -1, "case %zu parsed (want '%s')", i, cases[i].want);
        CHECK(strstr(err.msg, cases[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, cases[i].want);
        CHECK(sq.root == NULL && sq.questions == NULL && sq.n_questions == 0, "case %zu: a failed parse kept its parts", i);
    }
}

TG_TEST(test_squad_answers_in_bytes_and_long_quotes) {
    /* Code points to bytes: 'é' and 'ö' take two bytes each. */
    const char *json = "{\"data\": [{\"paragraphs\": [{\"context\": \"h\xc3\xa9llo w\xc3\xb6rld\", \"qas\": [{\"id\": 9, "
                       "\"question\": \"q\", \"answers\": [{\"text\": \"w\xc3\xb6rld\", \"answer_start\": 6}]}, {\"id\": "
                       "\"b\", \"question\": \"r\", \"is_impossible\": true, \"answers\": [{\"text\": \"llo\", "
                       "\"answer_start\": 2}]}, {\"id\": \"c\", \"question\": \"s\", \"is_impossible\": false, "
                       "\"answers\": [{\"text\": \"h\", \"answer_start\": 0}]}]}]}]}";
    tg_squad sq;
    tg_err err = {{0}};
    REQUIRE(tg_squad_parse("s.json", json, strlen(json), &sq, &err) == 0, "%s", err.msg);
    CHECK(sq.n_questions == 3 && sq.n_answers == 2 && sq.n_articles == 1 && sq.n_paragraphs == 1,
          "%lld questions, %lld answers", (long long)sq.n_questions, (long long)sq.n_answers);
    CHECK(!strcmp(sq.questions[0].id, "9") && sq.questions[0].n_answers == 1 && sq.answers[0].start == 7 &&
              sq.answers[0].end == 13,
          "id %s, answer %lld..%lld", sq.questions[0].id, (long long)sq.answers[0].start, (long long)sq.answers[0].end);
    CHECK(sq.questions[1].n_answers == 0 && sq.questions[2].n_answers == 1 && sq.questions[2].first_answer == 1 &&
              sq.answers[1].start == 0 && sq.answers[1].end == 1,
          "impossible question keeps no answer; the next has answer %lld", (long long)sq.questions[2].first_answer);
    tg_squad_free(&sq);

    /* A quote longer than 40 bytes is cut at a character boundary: "a" then 2-byte 'é's, so
     * byte 40 continues a character and the quote stops at 39 bytes. */
    char text[64] = "a", ctx[] = "zzz";
    for (int i = 0; i < 25; i++) strcat(text, "\xc3\xa9");
    char buf[512], want[128];
    snprintf(buf, sizeof buf,
             "{\"data\": [{\"paragraphs\": [{\"context\": \"%s\", \"qas\": [{\"id\": \"l\", \"question\": \"q\", "
             "\"answers\": [{\"text\": \"%s\", \"answer_start\": 0}]}]}]}]}",
             ctx, text);
    snprintf(want, sizeof want, "answer '%.39s' at character 0 is not in its context (the context there reads 'zzz')",
             text);
    CHECK(tg_squad_parse("s.json", buf, strlen(buf), &sq, &err) == -1 && strstr(err.msg, want),
          "'%s' lacks '%s'", err.msg, want);
    /* The context side of the quote is cut the same way. */
    char longctx[128] = "b";
    for (int i = 0; i < 30; i++) strcat(longctx, "\xc3\xa9");
    snprintf(buf, sizeof buf,
             "{\"data\": [{\"paragraphs\": [{\"context\": \"%s\", \"qas\": [{\"id\": \"l\", \"question\": \"q\", "
             "\"answers\": [{\"text\": \"%s\", \"answer_start\": 0}]}]}]}]}",
             longctx, text);
    snprintf(want, sizeof want, "(the context there reads '%.39s')", longctx);
    CHECK(tg_squad_parse("s.json", buf, strlen(buf), &sq, &err) == -1 && strstr(err.msg, want),
          "'%s' lacks '%s'", err.msg, want);
}

TG_TEST(test_squad_many_entries_grow) {
    /* 300 questions over 300 paragraphs: past the first 256 of each table. */
    size_t cap = 300 * 160 + 64, at = 0;
    char *json = malloc(cap);
    REQUIRE(json, "malloc");
    at += (size_t)snprintf(json + at, cap - at, "{\"data\": [{\"paragraphs\": [");
    for (int i = 0; i < 300; i++)
        at += (size_t)snprintf(json + at, cap - at,
                               "%s{\"context\": \"c%d\", \"qas\": [{\"id\": %d, \"question\": \"q\", \"answers\": "
                               "[{\"text\": \"c\", \"answer_start\": 0}]}]}",
                               i ? ", " : "", i, i);
    snprintf(json + at, cap - at, "]}]}");
    tg_squad sq;
    tg_err err = {{0}};
    REQUIRE(tg_squad_parse("s.json", json, strlen(json), &sq, &err) == 0, "%s", err.msg);
    CHECK(sq.n_questions == 300 && sq.n_paragraphs == 300 && sq.n_answers == 300 && !strcmp(sq.questions[299].id, "299") &&
              sq.questions[299].paragraph == 299,
          "%lld questions, id %s", (long long)sq.n_questions, sq.questions[299].id);
    tg_squad_free(&sq);
    free(json);
}

/* ---- QA windows on hand-made contexts ---------------------------------------------------- */

typedef struct sink_log {
    int n, fail_at;
    int32_t len[16], start[16], end[16];
} sink_log;

static int log_sink(void *ctx, const tg_shard_record *rec, tg_err *err) {
    sink_log *s = ctx;
    if (s->n == s->fail_at) return tg_fail(err, "the sink is full at window %d", s->n);
    if (s->n < 16) s->len[s->n] = rec->len, s->start[s->n] = rec->start, s->end[s->n] = rec->end;
    s->n++;
    return 0;
}

static void set_context(tg_qa_context *c, int n, const int64_t *start, const int64_t *end) {
    c->n = n;
    c->cap = n;
    c->ids = calloc((size_t)n + 1, sizeof *c->ids);
    c->start = calloc((size_t)n + 1, sizeof *c->start);
    c->end = calloc((size_t)n + 1, sizeof *c->end);
    for (int i = 0; i < n; i++) c->ids[i] = 10 + i, c->start[i] = start[i], c->end[i] = end[i];
}

TG_TEST(test_qa_features_special_tokens_and_refusals) {
    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    tg_qa_context c = {0};
    tg_qa_buffers buf = {0};
    int64_t windows = 0, answered = 0;
    sink_log log = {.fail_at = -1};
    tg_err err = {{0}};
    tg_err *e = &err;
    /* [CLS] from bos, [SEP] from eos when the tokenizer names only those. */
    enc.special.cls = -1, enc.special.bos = 7, enc.special.sep = -1, enc.special.eos = 8;
    REQUIRE(tg_qa_encode_context(&enc, "abc", 3, &c, e) == 0, "%s", err.msg);
    REQUIRE(tg_qa_features(&enc, "q", 1, &c, -1, -1, 10, 2, &buf, log_sink, &log, &windows, &answered, e) == 0, "%s",
            err.msg);
    CHECK(log.n == 1 && buf.ids[0] == 7 && buf.ids[2] == 8 && buf.ids[6] == 8 && log.len[0] == 7,
          "%d windows, ids %d %d %d", log.n, buf.ids[0], buf.ids[2], buf.ids[6]);
    enc.special.bos = -1;
    CHECK(tg_qa_features(&enc, "q", 1, &c, -1, -1, 10, 2, &buf, log_sink, &log, &windows, &answered, e) == -1 &&
              !strcmp(err.msg, "the tokenizer has no [CLS] (<s>) token"),
          "no cls: %s", err.msg);
    enc.special.bos = 7, enc.special.eos = -1;
    CHECK(tg_qa_features(&enc, "q", 1, &c, -1, -1, 10, 2, &buf, log_sink, &log, &windows, &answered, e) == -1 &&
              !strcmp(err.msg, "the tokenizer has no [SEP] (</s>) token"),
          "no sep: %s", err.msg);
    enc.special.cls = 2, enc.special.sep = 3;
    /* 12-token context, seq 8: a window holds 8 - 1 - 3 = 4 tokens, so stride 4 is refused. */
    REQUIRE(tg_qa_encode_context(&enc, "abcdefghijkl", 12, &c, e) == 0, "%s", err.msg);
    CHECK(tg_qa_features(&enc, "q", 1, &c, -1, -1, 8, 4, &buf, log_sink, &log, &windows, &answered, e) == -1 &&
              strstr(err.msg, "the question leaves 4 context tokens per window of seq 8; doc_stride 4 must be smaller"),
          "stride: %s", err.msg);
    /* Stride 3: windows start 1 apart, 9 of them; the sink failing at the third stops it. */
    log = (sink_log){.fail_at = 2};
    windows = 0;
    CHECK(tg_qa_features(&enc, "q", 1, &c, -1, -1, 8, 3, &buf, log_sink, &log, &windows, &answered, e) == -1 &&
              !strcmp(err.msg, "the sink is full at window 2") && windows == 3,
          "sink: %s, %lld windows", err.msg, (long long)windows);
    /* An empty question and an empty context: one window [CLS] [SEP] [SEP]. */
    REQUIRE(tg_qa_encode_context(&enc, "", 0, &c, e) == 0 && c.n == 0, "%s", err.msg);
    log = (sink_log){.fail_at = -1};
    REQUIRE(tg_qa_features(&enc, "", 0, &c, -1, -1, 8, 3, &buf, log_sink, &log, &windows, &answered, e) == 0, "%s",
            err.msg);
    CHECK(log.n == 1 && log.len[0] == 3 && buf.ids[0] == 2 && buf.ids[1] == 3 && buf.ids[2] == 3, "%d windows of %d",
          log.n, log.len[0]);
    /* An answer given over an empty context lies in no window. */
    log = (sink_log){.fail_at = -1};
    answered = 0;
    REQUIRE(tg_qa_features(&enc, "q", 1, &c, 0, 1, 8, 3, &buf, log_sink, &log, &windows, &answered, e) == 0, "%s",
            err.msg);
    CHECK(log.n == 1 && log.start[0] == 0 && log.end[0] == 0 && answered == 0, "empty context: answer %d..%d",
          log.start[0], log.end[0]);
    /* A 300-token question grows its buffer past 256. */
    char q[301];
    memset(q, 'q', 300);
    q[300] = 0;
    REQUIRE(tg_qa_encode_context(&enc, "ab", 2, &c, e) == 0, "%s", err.msg);
    log = (sink_log){.fail_at = -1};
    REQUIRE(tg_qa_features(&enc, q, 300, &c, -1, -1, 400, 3, &buf, log_sink, &log, &windows, &answered, e) == 0, "%s",
            err.msg);
    CHECK(log.n == 1 && log.len[0] == 305 && buf.q_cap == 512, "%d windows of %d, q_cap %d", log.n, log.len[0],
          buf.q_cap);
    tg_qa_context_free(&c);
    tg_qa_buffers_free(&buf);
    CHECK(c.ids == NULL && c.n == 0 && buf.ids == NULL && buf.cap == 0, "freed");
    byte_encoder_free(&be);
}

TG_TEST(test_qa_features_answer_positions) {
    byte_encoder be;
    tg_text_encoder enc = byte_encoder_make(&be, TG_TOKENIZER_WORDPIECE);
    tg_qa_buffers buf = {0};
    tg_err err = {{0}};
    int64_t windows = 0, answered = 0;
    /* Two tokens over the same bytes 0..2 (one character split in two): the answer [0, 2)
     * is the second token alone. ctx_at = 1 + 1 + 1 = 3. */
    tg_qa_context c = {0};
    set_context(&c, 3, (const int64_t[]){0, 0, 2}, (const int64_t[]){2, 2, 4});
    sink_log log = {.fail_at = -1};
    REQUIRE(tg_qa_features(&enc, "q", 1, &c, 0, 2, 16, 2, &buf, log_sink, &log, &windows, &answered, &err) == 0, "%s",
            err.msg);
    CHECK(log.n == 1 && log.start[0] == 4 && log.end[0] == 4 && answered == 1, "shared bytes: %d..%d", log.start[0],
          log.end[0]);
    /* The answer runs to the context's end: its last token. */
    log = (sink_log){.fail_at = -1};
    REQUIRE(tg_qa_features(&enc, "q", 1, &c, 2, 4, 16, 2, &buf, log_sink, &log, &windows, &answered, &err) == 0, "%s",
            err.msg);
    CHECK(log.start[0] == 5 && log.end[0] == 5, "last token: %d..%d", log.start[0], log.end[0]);
    tg_qa_context_free(&c);
    /* Windows of 2 tokens over 4 one-byte tokens, stride 1 (windows at 0, 1, 2): the
     * answer [1, 3) lies whole only in the window starting at 1; the window at 0 holds its
     * start but not its end, the one at 2 its end but not its start. */
    set_context(&c, 4, (const int64_t[]){0, 1, 2, 3}, (const int64_t[]){1, 2, 3, 4});
    log = (sink_log){.fail_at = -1};
    answered = 0;
    REQUIRE(tg_qa_features(&enc, "q", 1, &c, 1, 3, 6, 1, &buf, log_sink, &log, &windows, &answered, &err) == 0, "%s",
            err.msg);
    CHECK(log.n == 3 && answered == 1, "%d windows, %lld answered", log.n, (long long)answered);
    CHECK(log.start[0] == 0 && log.end[0] == 0 && log.start[1] == 3 && log.end[1] == 4 && log.start[2] == 0 &&
              log.end[2] == 0,
          "answers %d..%d, %d..%d, %d..%d", log.start[0], log.end[0], log.start[1], log.end[1], log.start[2], log.end[2]);
    tg_qa_context_free(&c);
    tg_qa_buffers_free(&buf);
    byte_encoder_free(&be);
}

/* ---- every allocation of a conversion, failed in turn ------------------------------------ */

typedef struct fault_case {
    const char *sub, *file, *text;
    int family;
    int32_t seq, doc_stride;
    double eval_fraction;
    const char *labels;
} fault_case;

TG_TEST(test_convert_allocation_failures) {
    static const fault_case cases[] = {
        {"fcsv", "a.csv", "text,hyp,label\nab,c,x\nde,f,y\ngh,i,x\n", TG_TOKENIZER_WORDPIECE, 0, -1, 0.3, NULL},
        {"flab", "a.jsonl", "{\"text\": \"ab\", \"label\": 2}\n{\"text\": \"cd\", \"label\": 1}\n",
         TG_TOKENIZER_WORDPIECE, 0, -1, 0, "1,2"},
        {"ftxt", "a.txt", "abcdef\nghi\n", TG_TOKENIZER_BPE_GPT2, 4, -1, 0, NULL},
        {"fsq", "a.json",
         "{\"data\": [{\"paragraphs\": [{\"context\": \"abc def\", \"qas\": [{\"id\": \"a\", \"question\": \"Q\", "
         "\"answers\": [{\"text\": \"def\", \"answer_start\": 4}]}, {\"id\": 2, \"question\": \"R\", \"answers\": []}]}]}]}",
         TG_TOKENIZER_WORDPIECE, 8, 2, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const fault_case *k = &cases[i];
        conv c;
        conv_init(&c, k->family, k->sub);
        conv_input(&c, k->file, k->text);
        c.opt.seq = k->seq;
        c.opt.doc_stride = k->doc_stride;
        c.opt.eval_fraction = k->eval_fraction;
        c.opt.labels = k->labels;
        if (k->file[2] == 'c') c.opt.pair_column = "hyp";
        tg_convert_report rep;
        tg_err err = {{0}};
        /* The counting run and the last one write beside the folder the failing runs name. */
        char counted[700];
        snprintf(counted, sizeof counted, "%s/counted", c.dir);
        c.opt.outdir = counted;
        tg_alloc_fail_after(-1);
        REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s: %s", k->sub, err.msg);
        const long total = tg_alloc_fail_after(-1);
        c.opt.outdir = c.out;
        const int64_t want_records = rep.records[0] + rep.records[1];
        /* Allocations are failed in order up to the shard set's manifest, which the commit
         * builds last (datasets/shard_manifest.c, tested with the writer): the reading,
         * encoding, labelling, splitting and record writing all come before it. */
        long fail = 0;
        for (; fail < total; fail++) {
            tg_alloc_fail_after(fail);
            int rc = tg_convert(&c.opt, &c.enc, &rep, &err);
            tg_alloc_fail_after(-1);
            if (!CHECK(rc == -1, "%s: allocation %ld of %ld failed, yet it converted", k->sub, fail, total)) break;
            if (!strncmp(err.msg, "manifest: ", 10)) break;
            CHECK(strstr(err.msg, "out of memory") != NULL, "%s: allocation %ld: '%s'", k->sub, fail, err.msg);
            struct stat st;
            CHECK(stat(c.out, &st) != 0, "%s: allocation %ld left %s", k->sub, fail, c.out);
        }
        CHECK(fail >= 15 && fail < total, "%s: %ld of %ld allocations come before the manifest", k->sub, fail, total);
        /* And after them all, the same conversion still succeeds. */
        snprintf(counted, sizeof counted, "%s/last", c.dir);
        c.opt.outdir = counted;
        REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == 0, "%s: %s", k->sub, err.msg);
        CHECK(rep.records[0] + rep.records[1] == want_records, "%s: %lld records", k->sub,
              (long long)(rep.records[0] + rep.records[1]));
        byte_encoder_free(&c.be);
    }
}

/* ---- exact messages: the label shown, the empty splits, the eval split's allocation ------- */

TG_TEST(test_convert_unknown_label_of_81_bytes_shows_80) {
    /* 80 bytes are shown whole; 81 are cut to 80. */
    for (int len = 80; len <= 81; len++) {
        conv c;
        char sub[16], label[100], text[200], want[400];
        snprintf(sub, sizeof sub, "lab%d", len);
        conv_init(&c, TG_TOKENIZER_WORDPIECE, sub);
        memset(label, 'q', (size_t)len);
        label[len] = 0;
        snprintf(text, sizeof text, "text,label\na,%s\n", label);
        conv_input(&c, "a.csv", text);
        c.opt.labels = "a,b";
        snprintf(want, sizeof want, "%s:2: unknown label name '%.80s' (--labels lists: a, b)", c.paths[0], label);
        tg_convert_report rep;
        tg_err err = {{0}};
        CHECK(tg_convert(&c.opt, &c.enc, &rep, &err) == -1, "a %d-byte unknown label converted", len);
        CHECK(!strcmp(err.msg, want), "%d bytes: '%s', want '%s'", len, err.msg, want);
        byte_encoder_free(&c.be);
    }
}

TG_TEST(test_convert_empty_split_messages_whole) {
    const char *want[2] = {"the train split came out empty (lower --seq or --eval-fraction)",
                           "the eval split came out empty (its lines made less than one record; lower --seq or raise "
                           "--eval-fraction)"};
    int seen[2] = {0, 0};
    for (uint64_t seed = 1; seed <= 40 && !(seen[0] && seen[1]); seed++) {
        conv c;
        char sub[16];
        snprintf(sub, sizeof sub, "whole%d", (int)seed);
        conv_init(&c, TG_TOKENIZER_BPE_GPT2, sub);
        conv_input(&c, "a.csv", "text\n\"\"\nab\n");
        c.opt.eval_fraction = 0.5;
        c.opt.seed = seed;
        tg_convert_report rep;
        tg_err err = {{0}};
        REQUIRE(tg_convert(&c.opt, &c.enc, &rep, &err) == -1, "seed %d converted", (int)seed);
        const int eval_empty = rep.records[TG_SPLIT_TRAIN] == 1;
        CHECK(!strcmp(err.msg, want[eval_empty]), "seed %d: '%s', want '%s'", (int)seed, err.msg, want[eval_empty]);
        seen[eval_empty] = 1;
        byte_encoder_free(&c.be);
    }
    CHECK(seen[0] && seen[1], "train empty %d, eval empty %d", seen[0], seen[1]);
}

/* Only the eval split's table failing (the allocations after it succeed): the conversion
 * stops there with its own message, for rows and for SQuAD articles, with and without an
 * eval fraction. */
TG_TEST(test_convert_eval_split_allocation_fails_alone) {
    static const struct {
        const char *file, *text, *want;
        double fraction;
        int32_t seq, stride;
    } cases[] = {
        {"a.csv", "text\nab\ncd\nef\n", "out of memory for the eval split of 3 rows", 0.5, 0, -1},
        {"a.csv", "text\nab\ncd\nef\n", "out of memory for the eval split of 3 rows", 0, 0, -1},
        {"a.txt", "ab\ncd\n", "out of memory for the eval split of 2 lines", 0.5, 0, -1},
        {"a.json",
         "{\"data\": [{\"paragraphs\": [{\"context\": \"abc def\", \"qas\": [{\"id\": \"a\", \"question\": \"Q\", "
         "\"answers\": [{\"text\": \"def\", \"answer_start\": 4}]}]}]}]}",
         "out of memory for the eval split of 1 articles", 0, 8, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        conv c;
        char sub[16];
        snprintf(sub, sizeof sub, "evalfail%zu", i);
        conv_init(&c, TG_TOKENIZER_WORDPIECE, sub);
        conv_input(&c, cases[i].file, cases[i].text);
        c.opt.eval_fraction = cases[i].fraction;
        c.opt.seq = cases[i].seq;
        c.opt.doc_stride = cases[i].stride;
        tg_convert_report rep;
        tg_err err = {{0}};
        int found = 0;
        for (long k = 0; k < 400 && !found; k++) {
            memset(&err, 0, sizeof err);
            tg_alloc_fail_only(k);
            int rc = tg_convert(&c.opt, &c.enc, &rep, &err);
            tg_alloc_fail_after(-1);
            if (rc == 0) break; /* past every allocation before the split: not found */
            found = !strcmp(err.msg, cases[i].want);
        }
        CHECK(found, "case %zu: no allocation failed with '%s'", i, cases[i].want);
        struct stat st;
        CHECK(stat(c.out, &st) != 0, "case %zu: a failed conversion left %s", i, c.out);
        byte_encoder_free(&c.be);
    }
}
