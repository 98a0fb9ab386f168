/* `data convert --format instruct` (datasets/instruct.h, datasets/convert.c) with the byte-level
 * stand-in tokenizer (tests/byte_encoder.h): Alpaca's two templates token for token, JSON Lines
 * and JSON arrays giving the same records, the prompt's length exact in every record, bos and
 * eos per tokenizer family, truncation and the records left out, user templates, the eval
 * split, every refusal with its whole message, and every allocation failed in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "datasets/convert.h"
#include "datasets/instruct.h"
#include "datasets/shard_reader.h"
#include "tests/byte_encoder.h"
#include "tests/harness.h"

/* Alpaca's templates as the task states them (tatsu-lab/stanford_alpaca, torchtune). */
#define WITH_INPUT_HEAD                                                                                              \
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "   \
    "response that appropriately completes the request.\n\n### Instruction:\n"
#define NO_INPUT_HEAD                                                                                                \
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n" \
    "### Instruction:\n"

typedef struct ifx {
    char dir[512], out[600], template_path[700];
    byte_encoder be;
    tg_text_encoder enc;
    tg_convert_options opt;
    const char *inputs[4];
    char paths[4][700];
} ifx;

static void ifx_init(ifx *f, tg_tokenizer_family family, const char *sub) {
    memset(f, 0, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "%s/%s", tg_test_tmpdir(), sub);
    mkdir(f->dir, 0755);
    snprintf(f->out, sizeof f->out, "%s/out", f->dir);
    f->enc = byte_encoder_make(&f->be, family);
    f->opt = (tg_convert_options){.inputs = f->inputs, .outdir = f->out, .doc_stride = -1, .command = "test",
                                  .format = TG_INPUT_INSTRUCT};
}

static void ifx_input(ifx *f, const char *name, const char *text) {
    int i = f->opt.n_inputs++;
    char path[sizeof f->paths[i]]; /* f->dir is a part of f */
    snprintf(path, sizeof path, "%s/%s", f->dir, name);
    memcpy(f->paths[i], path, sizeof path);
    if (text) tg_test_write_file(f->paths[i], text);
    f->inputs[i] = f->paths[i];
}

static void ifx_template(ifx *f, const char *text) {
    char path[sizeof f->template_path];
    snprintf(path, sizeof path, "%s/template.txt", f->dir);
    memcpy(f->template_path, path, sizeof path);
    tg_test_write_file(f->template_path, text);
    f->opt.template_path = f->template_path;
}

static int ifx_convert(ifx *f, tg_convert_report *rep, tg_err *err) {
    memset(err, 0, sizeof *err);
    return tg_convert(&f->opt, &f->enc, rep, err);
}

/* want with @IN@ replaced by the first input's path and @TPL@ by the template's. */
static void expand(const ifx *f, const char *want, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = want; *p && n + 1 < cap;) {
        const char *sub = !strncmp(p, "@IN@", 4) ? f->inputs[0] : !strncmp(p, "@TPL@", 5) ? f->template_path : NULL;
        if (sub) {
            n += (size_t)snprintf(out + n, cap - n, "%s", sub);
            p += p[1] == 'I' ? 4 : 5;
        } else {
            out[n++] = *p++;
        }
    }
    out[n < cap ? n : cap - 1] = 0;
}

/* The conversion fails with exactly `want` (expanded) and leaves no output (it writes to
 * a folder of its own, beside the fixture's). */
static int ifx_refused(ifx *f, const char *want, const char *label) {
    char expect[2000], refused[700];
    expand(f, want, expect, sizeof expect);
    snprintf(refused, sizeof refused, "%s/refused", f->dir);
    const char *outdir = f->opt.outdir;
    f->opt.outdir = refused;
    tg_convert_report rep;
    tg_err err;
    const int rc = ifx_convert(f, &rep, &err);
    f->opt.outdir = outdir;
    struct stat st;
    int ok = CHECK(rc == -1, "%s: converted (want '%s')", label, expect);
    ok &= CHECK(!strcmp(err.msg, expect), "%s: message\n'%s'\nwant\n'%s'", label, err.msg, expect);
    ok &= CHECK(stat(refused, &st) != 0, "%s: a failed conversion left %s", label, refused);
    return ok;
}

/* A record of the output, copied. */
typedef struct rec {
    int32_t len, prompt;
    int32_t ids[700];
} rec;

/* The records of a split (at most max); -1 when the set cannot be read. */
static int read_split(const char *dir, int split, rec *out, int max) {
    tg_err err = {{0}};
    tg_shard_set set;
    tg_shard_cursor cur;
    if (!CHECK(tg_shard_set_open(dir, split, &set, &err) == 0, "%s", err.msg)) return -1;
    int n = -1;
    if (CHECK(set.manifest.task == TG_SHARD_INSTRUCT, "task %d", set.manifest.task) &&
        CHECK(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg)) {
        n = 0;
        for (int64_t i = 0; i < set.n_records && n < max; i++, n++) {
            tg_shard_record r;
            if (!CHECK(tg_shard_cursor_get(&cur, i, &r, &err) == 0, "%s", err.msg)) break;
            out[n].len = r.len;
            out[n].prompt = r.prompt_len;
            memcpy(out[n].ids, r.input_ids, sizeof *r.input_ids * (size_t)r.len);
        }
        tg_shard_cursor_close(&cur);
    }
    tg_shard_set_close(&set);
    return n;
}

/* Whether r is bos (if >= 0), the prompt's bytes, the response's bytes, eos (if >= 0), with
 * the prompt (bos included) as its prompt. */
static int is_record(const rec *r, int32_t bos, const char *prompt, const char *response, int32_t eos,
                     const char *label) {
    int32_t want[700], n = 0;
    if (bos >= 0) want[n++] = bos;
    for (const char *p = prompt; *p; p++) want[n++] = BYTE_ID(*p);
    const int32_t prompt_len = n;
    for (const char *p = response; *p; p++) want[n++] = BYTE_ID(*p);
    if (eos >= 0) want[n++] = eos;
    int ok = CHECK(r->len == n && r->prompt == prompt_len, "%s: %d tokens with a prompt of %d, want %d and %d", label,
                   r->len, r->prompt, n, prompt_len);
    for (int32_t i = 0; ok && i < n; i++)
        ok = CHECK(r->ids[i] == want[i], "%s: token %d is %d, want %d", label, i, r->ids[i], want[i]);
    return ok;
}

static const char k_records[] =
    "{\"instruction\": \"Name a color.\", \"input\": \"\", \"output\": \"Blue.\"}\n"
    "{\"instruction\": \"Add the numbers.\", \"input\": \"2 and 3\", \"output\": \"5\"}\n"
    "\n"
    "{\"id\": 7, \"instruction\": \"Say hi.\", \"output\": \"Hi!\", \"text\": [\"left\", \"alone\"], "
    "\"source\": {\"a\": 1}, \"category\": null}\n"
    "{\"instruction\": \"Echo.\", \"input\": null, \"output\": \"Echo.\"}";

/* The four records through Alpaca's templates, checked against k_records' text. */
static void check_alpaca_records(const rec *got, int n, int32_t bos, int32_t eos, const char *label) {
    if (!CHECK(n == 4, "%s: %d records", label, n)) return;
    is_record(&got[0], bos, NO_INPUT_HEAD "Name a color.\n\n### Response:\n", "Blue.", eos, label);
    is_record(&got[1], bos, WITH_INPUT_HEAD "Add the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n", "5", eos,
              label);
    is_record(&got[2], bos, NO_INPUT_HEAD "Say hi.\n\n### Response:\n", "Hi!", eos, label);
    is_record(&got[3], bos, NO_INPUT_HEAD "Echo.\n\n### Response:\n", "Echo.", eos, label);
}

/* JSON Lines through Alpaca's templates for each family: GPT-2 starts with its end-of-text
 * token (its bos) and ends with it; RoBERTa has <s> and </s>; WordPiece no bos and [SEP] as
 * the end. An empty or null input takes the template without an input. */
TG_TEST(test_convert_instruct_alpaca_templates_per_family) {
    static const struct {
        tg_tokenizer_family family;
        int32_t bos, eos;
    } fams[] = {{TG_TOKENIZER_BPE_GPT2, 4, 4}, {TG_TOKENIZER_BPE_ROBERTA, 2, 3}, {TG_TOKENIZER_WORDPIECE, -1, 3}};
    static rec got[8];
    for (size_t k = 0; k < sizeof fams / sizeof *fams; k++) {
        ifx f;
        char sub[16];
        snprintf(sub, sizeof sub, "fam%zu", k);
        ifx_init(&f, fams[k].family, sub);
        ifx_input(&f, "alpaca.jsonl", k_records);
        tg_convert_report rep;
        tg_err err;
        REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
        CHECK(rep.format == TG_INPUT_INSTRUCT && rep.task == TG_SHARD_INSTRUCT && rep.units == 4 &&
                  rep.records[0] == 4 && rep.records[1] == 0 && !rep.skipped_long && !rep.skipped_empty &&
                  !rep.truncated && rep.n_labels == 0,
              "family %zu: format %d task %d, %lld units, %lld records", k, rep.format, rep.task, (long long)rep.units,
              (long long)rep.records[0]);
        const int n = read_split(f.out, TG_SPLIT_TRAIN, got, 8);
        int64_t tokens = 0;
        for (int i = 0; i < n; i++) tokens += got[i].len;
        CHECK(tokens == rep.tokens[0], "family %zu: %lld tokens read, %lld reported", k, (long long)tokens,
              (long long)rep.tokens[0]);
        check_alpaca_records(got, n, fams[k].bos, fams[k].eos, sub);
        byte_encoder_free(&f.be);
    }
}

/* The same records as one JSON array (alpaca_data.json's form: indented, or all on one line,
 * after a byte order mark, with CRLF line ends) give the same set. */
TG_TEST(test_convert_instruct_json_array_matches_lines) {
    static const char *const arrays[] = {
        "[\n  {\n    \"instruction\": \"Name a color.\",\n    \"input\": \"\",\n    \"output\": \"Blue.\"\n  },\n"
        "  {\n    \"instruction\": \"Add the numbers.\",\n    \"input\": \"2 and 3\",\n    \"output\": \"5\"\n  },\n"
        "  {\"id\": 7, \"instruction\": \"Say hi.\", \"output\": \"Hi!\"},\n"
        "  {\"instruction\": \"Echo.\", \"input\": null, \"output\": \"Echo.\"}\n]\n",
        "\xEF\xBB\xBF \r\n[{\"instruction\":\"Name a color.\",\"input\":\"\",\"output\":\"Blue.\"},{\"instruction\":"
        "\"Add the numbers.\",\"input\":\"2 and 3\",\"output\":\"5\"},{\"instruction\":\"Say hi.\",\"output\":\"Hi!\""
        ",\"category\":\"open_qa\"},{\"instruction\":\"Echo.\",\"output\":\"Echo.\"}]\r\n",
    };
    static rec got[8];
    for (size_t k = 0; k < 2; k++) {
        ifx f;
        char sub[16];
        snprintf(sub, sizeof sub, "arr%zu", k);
        ifx_init(&f, TG_TOKENIZER_BPE_GPT2, sub);
        ifx_input(&f, "alpaca_data.json", arrays[k]);
        tg_convert_report rep;
        tg_err err;
        REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
        check_alpaca_records(got, read_split(f.out, TG_SPLIT_TRAIN, got, 8), 4, 4, sub);
        byte_encoder_free(&f.be);
    }
    /* An empty array, and a file of blank lines, hold no examples. */
    ifx f;
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "arr-empty");
    ifx_input(&f, "e.json", " [ \n ] \n");
    ifx_refused(&f, "@IN@: no examples", "empty array");
    byte_encoder_free(&f.be);
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "lines-empty");
    ifx_input(&f, "e.jsonl", "\n \t\r\n");
    ifx_refused(&f, "@IN@: no examples", "blank lines");
    byte_encoder_free(&f.be);
}

/* A user template: its last line end dropped, braces from {{ and }}, text after {output}
 * part of the response; records cut to seq keep their prompt and eos and lose the end of
 * the response; a prompt with no room for a response token, or a response of no tokens,
 * leaves its record out, counted. */
TG_TEST(test_convert_instruct_template_truncation_and_skips) {
    ifx f;
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "trunc");
    ifx_template(&f, "Q:{instruction}{input}\nA:{output}\n");
    ifx_input(&f, "t.jsonl",
              "{\"instruction\": \"ab\", \"output\": \"xyz\"}\n"          /* prompt 1 + 7: room for 1 of 3 */
              "{\"instruction\": \"a\", \"output\": \"z\"}\n"             /* 1 + 6 + 1 + eos: fits */
              "{\"instruction\": \"abc\", \"output\": \"q\"}\n"           /* 1 + 8 + eos: no room */
              "{\"instruction\": \"a\", \"output\": \"\"}\n"              /* an empty response */
              "{\"instruction\": \"a\", \"input\": \"b\", \"output\": \"yy\"}\n"); /* room for 1 of 2 */
    f.opt.seq = 10;
    tg_convert_report rep;
    tg_err err;
    REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.units == 5 && rep.records[0] == 3 && rep.skipped_long == 1 && rep.skipped_empty == 1 && rep.truncated == 2 &&
              rep.tokens[0] == 29,
          "%lld units, %lld records (%lld tokens), %lld long, %lld empty, %lld cut", (long long)rep.units,
          (long long)rep.records[0], (long long)rep.tokens[0], (long long)rep.skipped_long,
          (long long)rep.skipped_empty, (long long)rep.truncated);
    static rec got[8];
    if (CHECK(read_split(f.out, TG_SPLIT_TRAIN, got, 8) == 3, "records")) {
        is_record(&got[0], 4, "Q:ab\nA:", "x", 4, "cut to one response token");
        is_record(&got[1], 4, "Q:a\nA:", "z", 4, "fits");
        is_record(&got[2], 4, "Q:ab\nA:", "y", 4, "with an input, cut");
    }
    /* Every record left out: the message counts them. */
    ifx_input(&f, "none.jsonl", "{\"instruction\": \"abc\", \"output\": \"q\"}\n{\"instruction\": \"a\", \"output\": \"\"}\n");
    f.inputs[0] = f.paths[1], f.opt.n_inputs = 1;
    f.opt.seq = 9;
    ifx_refused(&f, "@IN@: no records: every one was left out (1 whose prompt leaves no room for a response in --seq 9, "
                    "1 whose response encodes to no tokens)",
                "all left out");
    byte_encoder_free(&f.be);

    /* Escaped braces, a CRLF end, text after {output} (so an empty output still responds); WordPiece:
     * no bos, [SEP] ends the record. */
    ifx_init(&f, TG_TOKENIZER_WORDPIECE, "braces");
    ifx_template(&f, "{{{instruction}}}: {input}|{output}</>\r\n");
    ifx_input(&f, "t.jsonl", "{\"instruction\": \"ab\", \"input\": \"c\", \"output\": \"\"}\n"
                             "{\"instruction\": \"d\", \"output\": \"ef\"}\n");
    REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
    if (CHECK(read_split(f.out, TG_SPLIT_TRAIN, got, 8) == 2, "records")) {
        is_record(&got[0], -1, "{ab}: c|", "</>", 3, "braces, empty output");
        is_record(&got[1], -1, "{d}: |", "ef</>", 3, "no input");
    }
    byte_encoder_free(&f.be);

    /* A tokenizer with neither eos nor sep ends records with the response; the room is seq
     * less the prompt. A template file that is one line end is no template. */
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "noeos");
    f.enc.special.eos = f.enc.special.sep = -1;
    ifx_template(&f, "{instruction}={output}");
    ifx_input(&f, "t.jsonl", "{\"instruction\": \"ab\", \"output\": \"cdef\"}\n");
    f.opt.seq = 6;
    REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
    if (CHECK(read_split(f.out, TG_SPLIT_TRAIN, got, 8) == 1, "records"))
        is_record(&got[0], 4, "ab=", "cd", -1, "no eos");
    CHECK(rep.truncated == 1, "%lld cut", (long long)rep.truncated);
    ifx_template(&f, "\n");
    ifx_refused(&f, "--template: @TPL@: no {instruction}", "a template of one line end");
    ifx_template(&f, "");
    ifx_refused(&f, "--template: @TPL@: no {instruction}", "an empty template");
    byte_encoder_free(&f.be);
}

/* The eval split takes ceil(F x N) of the records, each split in input order; the progress
 * callback sees every record but the last. */
static void count_progress(void *ctx, int64_t done, int64_t total, int64_t tokens) {
    int64_t *c = ctx;
    c[0]++;
    c[1] = done;
    c[2] = total;
}

TG_TEST(test_convert_instruct_eval_split) {
    ifx f;
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "split");
    ifx_template(&f, "{instruction}:{output}");
    char text[2048] = "";
    for (int i = 0; i < 10; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "{\"instruction\": \"i%d\", \"output\": \"o%d\"}\n",
                 i, i);
    ifx_input(&f, "t.jsonl", text);
    f.opt.eval_fraction = 0.3;
    f.opt.seed = 5;
    int64_t calls[3] = {0, 0, 0};
    f.opt.progress = count_progress, f.opt.progress_ctx = calls;
    tg_convert_report rep;
    tg_err err;
    REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.records[0] == 7 && rep.records[1] == 3 && rep.units == 10, "%lld + %lld of %lld",
          (long long)rep.records[0], (long long)rep.records[1], (long long)rep.units);
    CHECK(calls[0] == 9 && calls[1] == 9 && calls[2] == 10, "progress: %lld calls, last %lld of %lld",
          (long long)calls[0], (long long)calls[1], (long long)calls[2]);
    static rec got[2][8];
    int seen[10] = {0};
    for (int s = 0; s < 2; s++) {
        const int n = read_split(f.out, s, got[s], 8);
        int last = -1;
        for (int i = 0; i < n; i++) {
            const int which = got[s][i].ids[2] - BYTE_ID('0'); /* bos, 'i', digit */
            CHECK(which > last && which < 10, "split %d record %d is i%d after i%d", s, i, which, last);
            if (which >= 0 && which < 10) seen[which]++;
            last = which;
            CHECK(got[s][i].prompt == 4, "split %d record %d: prompt %d", s, i, got[s][i].prompt);
        }
    }
    for (int i = 0; i < 10; i++) CHECK(seen[i] == 1, "record %d in %d splits", i, seen[i]);
    f.opt.eval_fraction = 0.95;
    ifx_refused(&f, "--eval-fraction 0.95 of 10 records leaves nothing to train on", "eval takes all");
    byte_encoder_free(&f.be);
}

/* ---- refusals ---------------------------------------------------------------------------- */

typedef struct refusal {
    const char *name, *text, *want; /* want: @IN@ the input's path */
} refusal;

TG_TEST(test_convert_instruct_refuses_records) {
    static const refusal cases[] = {
        {"a.jsonl", "{\"input\": \"x\", \"output\": \"y\"}\n",
         "@IN@:1: no \"instruction\" field (a record has \"instruction\", \"output\" and, optionally, \"input\")"},
        {"a.jsonl", "\n{\"instruction\": \"x\"}\n",
         "@IN@:2: no \"output\" field (a record has \"instruction\", \"output\" and, optionally, \"input\")"},
        {"a.jsonl", "{\"instruction\": 1, \"output\": \"y\"}", "@IN@:1: \"instruction\" must be a string, not an integer"},
        {"a.jsonl", "{\"instruction\": \"x\", \"output\": 1.5}", "@IN@:1: \"output\" must be a string, not a number"},
        {"a.jsonl", "{\"instruction\": \"x\", \"output\": true}", "@IN@:1: \"output\" must be a string, not a boolean"},
        {"a.jsonl", "{\"instruction\": \"x\", \"output\": false}", "@IN@:1: \"output\" must be a string, not a boolean"},
        {"a.jsonl", "{\"instruction\": null, \"output\": \"y\"}", "@IN@:1: \"instruction\" must be a string, not null"},
        {"a.jsonl", "{\"instruction\": [\"x\"], \"output\": \"y\"}", "@IN@:1: \"instruction\" must be a string, not an array"},
        {"a.jsonl", "{\"instruction\": \"x\", \"input\": {}, \"output\": \"y\"}",
         "@IN@:1: \"input\" must be a string or null, not an object"},
        {"a.jsonl", "{\"instruction\": \"\", \"output\": \"y\"}", "@IN@:1: \"instruction\" is empty"},
        {"a.jsonl", "{\"instruction\": \"x\", \"output\": \"y\", \"context\": \"z\"}",
         "@IN@:1: unknown field \"context\" (a record has \"instruction\", \"input\" and \"output\"; \"id\", \"text\", "
         "\"source\" and \"category\" are left alone)"},
        {"a.jsonl", "{\"instruction\": \"x\", \"output\": \"y\", \"output\": \"z\"}",
         "@IN@:1: key \"output\" appears twice in one object"},
        {"a.jsonl", "{\"instruction\": \"x\", \"output\": \"y\"}\n{\"instruction\": \"x\" \"output\": \"y\"}",
         "@IN@:2: invalid JSON: '}' expected near '\"output\"' (column 28)"},
        {"a.jsonl", "\"just text\"", "@IN@:1: invalid JSON: '[' or '{' expected near '\"just text\"' (column 11)"},
        {"a.jsonl", "{\"instruction\": \"x\", \"output\": \"y\"}\n[1]",
         "@IN@:2: expected a JSON object like {\"instruction\": \"...\", \"input\": \"...\", \"output\": \"...\"}, not "
         "an array"},
        {"a.jsonl", "{\"instruction\": \"x\xff\", \"output\": \"y\"}",
         "@IN@:1: not valid UTF-8 (byte 0xff at byte 18 of the record; re-encode the file as UTF-8, or pass "
         "--skip-invalid to leave such records out)"},
        /* arrays: the record's index (from 0) and line */
        {"a.json", "[\n{\"instruction\": \"x\", \"output\": \"y\"},\n  {\"output\": \"y\"}]",
         "@IN@: record 1 (line 3): no \"instruction\" field (a record has \"instruction\", \"output\" and, optionally, "
         "\"input\")"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\"}, {\"instruction\": \"x\", \"output\": 2}]",
         "@IN@: record 1 (line 1): \"output\" must be a string, not an integer"},
        {"a.json", "[\n  {\"instruction\": \"x\",\n   \"output\": \"y\" \"z\"}\n]",
         "@IN@: record 0 (line 2): invalid JSON: '}' expected near '\"z\"' (line 3, column 20)"},
        {"a.json", "[\n  {\"instruction\" \"x\"}]", "@IN@: record 0 (line 2): invalid JSON: ':' expected near '\"x\"' "
                                                   "(line 2, column 20)"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\"},]",
         "@IN@: record 1 (line 1): expected a JSON object like {\"instruction\": \"...\", \"output\": \"...\"} after the "
         "',' (a trailing comma)"},
        {"a.json", "[\"x\"]",
         "@IN@: record 0 (line 1): expected a JSON object like {\"instruction\": \"...\", \"output\": \"...\"}"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\"}\n{\"instruction\": \"x\", \"output\": \"y\"}]",
         "@IN@:2: expected ',' or ']' after record 0"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\"}", "@IN@:1: expected ',' or ']' after record 0"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\"},\n", "@IN@:2: the file ends inside the array (no closing ']')"},
        {"a.json", "[{\"instruction\": \"x}\\\"\", \"output\": \"[y\"", "@IN@: record 0 (line 1): the file ends inside the record"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\\", "@IN@: record 0 (line 1): the file ends inside the record"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\"}]\n\n]", "@IN@:3: text after the array's closing ']'"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"y\", \"more\": [1, {\"k\": 2}]}]",
         "@IN@: record 0 (line 1): unknown field \"more\" (a record has \"instruction\", \"input\" and \"output\"; "
         "\"id\", \"text\", \"source\" and \"category\" are left alone)"},
        {"a.json", "[{\"instruction\": \"x\", \"output\": \"\xc3\"}]",
         "@IN@: record 0 (line 1): not valid UTF-8 (byte 0xc3 at byte 32 of the record; re-encode the file as UTF-8, or "
         "pass --skip-invalid to leave such records out)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ifx f;
        char sub[16], label[32];
        snprintf(sub, sizeof sub, "ref%zu", i);
        snprintf(label, sizeof label, "case %zu", i);
        ifx_init(&f, TG_TOKENIZER_BPE_GPT2, sub);
        ifx_input(&f, cases[i].name, cases[i].text);
        ifx_refused(&f, cases[i].want, label);
        byte_encoder_free(&f.be);
    }
}

/* --skip-invalid leaves out the records that are not UTF-8, lines and array elements alike,
 * counting them; a file of nothing else has no examples. Other faults still stop it. */
TG_TEST(test_convert_instruct_skip_invalid) {
    ifx f;
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "skip");
    ifx_template(&f, "{instruction}:{output}");
    ifx_input(&f, "a.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"\xfe\", \"output\": \"b\"}\n");
    ifx_input(&f, "b.json", "[{\"instruction\": \"\xe2\x82\", \"output\": \"b\"}, {\"instruction\": \"c\", "
                            "\"output\": \"d\"}]");
    f.opt.skip_invalid = 1;
    tg_convert_report rep;
    tg_err err;
    REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
    CHECK(rep.skipped_invalid == 2 && rep.units == 2 && rep.records[0] == 2, "%lld left out, %lld units",
          (long long)rep.skipped_invalid, (long long)rep.units);
    static rec got[4];
    if (CHECK(read_split(f.out, TG_SPLIT_TRAIN, got, 4) == 2, "records")) {
        is_record(&got[0], 4, "a:", "b", 4, "the line");
        is_record(&got[1], 4, "c:", "d", 4, "the element");
    }
    byte_encoder_free(&f.be);
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "skipall");
    ifx_input(&f, "a.jsonl", "{\"instruction\": \"\xfe\", \"output\": \"b\"}\n");
    f.opt.skip_invalid = 1;
    ifx_refused(&f, "@IN@: no examples (every one was left out as not UTF-8)", "all left out");
    byte_encoder_free(&f.be);
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "skipother");
    ifx_input(&f, "a.jsonl", "{\"instruction\": \"\xfe\", \"output\": \"b\"}\n{\"output\": \"b\"}\n");
    f.opt.skip_invalid = 1;
    ifx_refused(&f, "@IN@:2: no \"instruction\" field (a record has \"instruction\", \"output\" and, optionally, \"input\")",
                "a fault that is no encoding");
    byte_encoder_free(&f.be);
}

TG_TEST(test_convert_instruct_refuses_templates_and_options) {
    static const struct {
        const char *template, *want; /* want: @TPL@ the template's path */
    } cases[] = {
        {"{instruction} {output", "--template: @TPL@: byte 14: a '{' that is no placeholder (there are {instruction}, "
                                  "{input} and {output}; write {{ and }} for braces)"},
        {"{instruction} {outputs} {output}", "--template: @TPL@: byte 14: a '{' that is no placeholder (there are "
                                             "{instruction}, {input} and {output}; write {{ and }} for braces)"},
        {"{instruction} } {output}", "--template: @TPL@: byte 14: a '}' that is no placeholder (there are {instruction}, "
                                     "{input} and {output}; write {{ and }} for braces)"},
        {"{instruction}{output}}", "--template: @TPL@: byte 21: a '}' that is no placeholder (there are {instruction}, "
                                   "{input} and {output}; write {{ and }} for braces)"},
        {"{instruction}{x}{output}", "--template: @TPL@: byte 13: a '{' that is no placeholder (there are {instruction}, "
                                     "{input} and {output}; write {{ and }} for braces)"},
        {"{instruction}{output}{output}", "--template: @TPL@: byte 21: a second {output}"},
        {"{input}{instruction}{input}{output}", "--template: @TPL@: byte 20: a second {input}"},
        {"{instruction}{instruction}{output}", "--template: @TPL@: byte 13: a second {instruction}"},
        {"{instruction}{output}{input}", "--template: @TPL@: byte 21: {input} after {output} (the prompt comes before "
                                         "the response)"},
        {"{output}{instruction}", "--template: @TPL@: byte 8: {instruction} after {output} (the prompt comes before the "
                                  "response)"},
        {"{input}{output}", "--template: @TPL@: no {instruction}"},
        {"{instruction}:", "--template: @TPL@: no {output} (where the response goes)"},
        {"{instruction}\xc3(:{output}", "--template: @TPL@: byte 13: not valid UTF-8 (0xc3)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ifx f;
        char sub[16], label[32];
        snprintf(sub, sizeof sub, "tpl%zu", i);
        snprintf(label, sizeof label, "template %zu", i);
        ifx_init(&f, TG_TOKENIZER_BPE_GPT2, sub);
        ifx_input(&f, "a.jsonl", "{\"instruction\": \"x\", \"output\": \"y\"}\n");
        ifx_template(&f, cases[i].template);
        ifx_refused(&f, cases[i].want, label);
        byte_encoder_free(&f.be);
    }
    /* A NUL byte in the template file (written by hand: the helper writes C strings). */
    ifx f;
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "tplnul");
    ifx_input(&f, "a.jsonl", "{\"instruction\": \"x\", \"output\": \"y\"}\n");
    ifx_template(&f, "");
    FILE *tf = fopen(f.template_path, "wb");
    REQUIRE(tf && fwrite("{instruction}\0{output}", 1, 22, tf) == 22 && fclose(tf) == 0, "template with a NUL");
    ifx_refused(&f, "--template: @TPL@: byte 13: a NUL byte", "NUL");
    /* A template without {input} and a record with one; a template that is no file. */
    ifx_template(&f, "{instruction}:{output}");
    ifx_input(&f, "b.jsonl", "{\"instruction\": \"x\", \"input\": \"z\", \"output\": \"y\"}\n");
    f.inputs[0] = f.paths[1];
    ifx_refused(&f, "@IN@:1: the record has an input, but the template @TPL@ has no {input}", "input without {input}");
    f.inputs[0] = f.paths[0];
    char absent[sizeof f.template_path];
    snprintf(absent, sizeof absent, "%s/absent.txt", f.dir);
    memcpy(f.template_path, absent, sizeof absent);
    ifx_refused(&f, "--template: @TPL@: cannot open: No such file or directory", "no template file");
    /* --template is for instruct inputs only. */
    f.opt.format = TG_INPUT_JSONL;
    ifx_refused(&f, "--template is for instruct inputs, not jsonl", "template with jsonl");
    f.opt.format = TG_INPUT_INSTRUCT;
    f.opt.template_path = NULL;
    f.opt.labels = "a,b";
    ifx_refused(&f, "--labels is for labelled inputs (csv, tsv, jsonl, folders), not instruct", "labels");
    f.opt.labels = NULL;
    f.opt.text_column = "t";
    ifx_refused(&f, "--text-column, --pair-column and --label-column are for csv, tsv and jsonl inputs, not instruct",
                "text column");
    f.opt.text_column = NULL;
    f.opt.doc_stride = 4;
    ifx_refused(&f, "--doc-stride is for squad inputs, not instruct", "doc stride");
    byte_encoder_free(&f.be);
}

/* ---- the encoder and the writer failing, an empty prompt ------------------------------------ */

typedef struct wrapped {
    byte_encoder be;
    int fail_at;       /* the call that fails (from 1), 0 none */
    int calls;
    tg_encoding empty;
} wrapped;

/* The byte encoder, but blank text encodes to nothing (as WordPiece encodes blanks) and
 * call fail_at fails. */
static int wrapped_encode(void *ctx, const char *text, size_t len, const char *pair, size_t pair_len,
                          const tg_encode_options *opt, const tg_encoding **out, tg_err *err) {
    wrapped *w = ctx;
    if (++w->calls == w->fail_at) return tg_fail(err, "the encoder fails");
    size_t k = 0;
    while (k < len && text[k] == ' ') k++;
    if (k == len) {
        *out = &w->empty;
        return 0;
    }
    return byte_encode(&w->be, text, len, pair, pair_len, opt, out, err);
}

TG_TEST(test_convert_instruct_encoder_writer_and_empty_prompt) {
    ifx f;
    ifx_init(&f, TG_TOKENIZER_WORDPIECE, "enc");
    wrapped w = {0};
    f.enc = byte_encoder_make(&w.be, TG_TOKENIZER_WORDPIECE);
    f.enc.ctx = &w;
    f.enc.encode = wrapped_encode;
    ifx_template(&f, "{instruction}{output}");
    ifx_input(&f, "a.jsonl", "{\"instruction\": \"ab\", \"output\": \"c\"}\n{\"instruction\": \"d\", \"output\": \"e\"}\n");
    /* the prompt's encoding, then the response's, of the second record */
    w.fail_at = 3;
    ifx_refused(&f, "@IN@:2: the encoder fails", "prompt");
    w.calls = 0, w.fail_at = 4;
    ifx_refused(&f, "@IN@:2: the encoder fails", "response");
    /* a prompt of blanks encodes to nothing, and WordPiece has no bos */
    w.calls = 0, w.fail_at = 0;
    ifx_input(&f, "b.jsonl", "{\"instruction\": \"  \", \"output\": \"c\"}\n");
    f.inputs[0] = f.paths[1], f.opt.n_inputs = 1;
    ifx_refused(&f, "@IN@:1: the prompt encodes to no tokens, and the tokenizer has no bos token to start it",
                "empty prompt");
    /* With a bos the record starts with it, and the response is all there is after it. */
    f.enc.special.bos = 2;
    tg_convert_report rep;
    tg_err err;
    REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s", err.msg);
    static rec got[2];
    if (CHECK(read_split(f.out, TG_SPLIT_TRAIN, got, 2) == 1, "records")) is_record(&got[0], 2, "", "c", 3, "bos prompt");
    byte_encoder_free(&w.be);

    /* The writer refuses an id outside the vocabulary, naming the record. */
    ifx_init(&f, TG_TOKENIZER_BPE_GPT2, "vocab");
    ifx_template(&f, "{instruction}{output}");
    ifx_input(&f, "a.json", "[{\"instruction\": \"a\", \"output\": \"b\"},\n {\"instruction\": \"a\", \"output\": \"~\"}]");
    f.enc.vocab_size = BYTE_ID('~');
    char want[1600];
    snprintf(want, sizeof want, "@IN@: record 1 (line 2): shard writer: record 1 of the train split: input_ids[2] = %d is "
                                "outside the vocabulary (%d)",
             BYTE_ID('~'), BYTE_ID('~'));
    ifx_refused(&f, want, "writer");
    byte_encoder_free(&f.be);
}

/* ---- every allocation failed in turn --------------------------------------------------------- */

TG_TEST(test_convert_instruct_allocation_failures) {
    static const struct {
        const char *sub, *name, *text, *template;
        double eval_fraction;
        int32_t seq;
    } cases[] = {
        {"fl", "a.jsonl",
         "{\"instruction\": \"ab\", \"input\": \"c\", \"output\": \"de\"}\n{\"instruction\": \"f\", \"output\": \"g\"}\n"
         "{\"instruction\": \"hi\", \"output\": \"jk\"}\n",
         NULL, 0.3, 0},
        {"fa", "a.json", "[{\"instruction\": \"ab\", \"output\": \"de\"}, {\"instruction\": \"f\", \"output\": \"g\"}]",
         "Q {instruction} {input}:{output}.", 0, 9},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ifx f;
        ifx_init(&f, TG_TOKENIZER_BPE_GPT2, cases[i].sub);
        ifx_input(&f, cases[i].name, cases[i].text);
        if (cases[i].template) ifx_template(&f, cases[i].template);
        f.opt.eval_fraction = cases[i].eval_fraction;
        f.opt.seq = cases[i].seq;
        char other[700];
        snprintf(other, sizeof other, "%s/counted", f.dir);
        f.opt.outdir = other;
        tg_convert_report rep;
        tg_err err;
        tg_alloc_fail_after(-1);
        REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s: %s", cases[i].sub, err.msg);
        const long total = tg_alloc_fail_after(-1);
        const int64_t want_records = rep.records[0] + rep.records[1];
        f.opt.outdir = f.out;
        long fail = 0;
        for (; fail < total; fail++) {
            tg_alloc_fail_after(fail);
            const int rc = ifx_convert(&f, &rep, &err);
            tg_alloc_fail_after(-1);
            if (!CHECK(rc == -1, "%s: allocation %ld of %ld failed, yet it converted", cases[i].sub, fail, total)) break;
            if (!strncmp(err.msg, "manifest: ", 10)) break;
            CHECK(strstr(err.msg, "out of memory") != NULL, "%s: allocation %ld: '%s'", cases[i].sub, fail, err.msg);
            struct stat st;
            CHECK(stat(f.out, &st) != 0, "%s: allocation %ld left %s", cases[i].sub, fail, f.out);
        }
        CHECK(fail >= 15 && fail < total, "%s: %ld of %ld allocations come before the manifest", cases[i].sub, fail,
              total);
        /* Each allocation failing alone: a message, never a crash. */
        for (long k = 0; k < total; k++) {
            tg_alloc_fail_only(k);
            const int rc = ifx_convert(&f, &rep, &err);
            tg_alloc_fail_after(-1);
            if (rc == 0) {
                CHECK(rep.records[0] + rep.records[1] == want_records, "%s: allocation %ld alone: %lld records",
                      cases[i].sub, k, (long long)(rep.records[0] + rep.records[1]));
            } else {
                CHECK(err.msg[0], "%s: allocation %ld alone failed without a message", cases[i].sub, k);
            }
        }
        snprintf(other, sizeof other, "%s/last", f.dir);
        f.opt.outdir = other;
        REQUIRE(ifx_convert(&f, &rep, &err) == 0, "%s: %s", cases[i].sub, err.msg);
        CHECK(rep.records[0] + rep.records[1] == want_records, "%s: %lld records", cases[i].sub,
              (long long)(rep.records[0] + rep.records[1]));
        byte_encoder_free(&f.be);
    }
}

/* The renderer on its own: a long text grows the buffers, an absent input renders empty. */
TG_TEST(test_instruct_render_grows_and_absent_input) {
    tg_instruct_template t;
    tg_err err = {{0}};
    const char *tpl = "<{instruction}|{input}>{output}!";
    REQUIRE(tg_instruct_template_check("t", tpl, strlen(tpl), &t, &err) == 0, "%s", err.msg);
    CHECK(t.has_input == 1, "has_input %d", t.has_input);
    static char big[5000];
    memset(big, 'x', sizeof big - 1);
    tg_instruct_text p = {0}, r = {0};
    REQUIRE(tg_instruct_render(&t, big, strlen(big), NULL, 0, "o", 1, &p, &r, &err) == 0, "%s", err.msg);
    CHECK(p.n == strlen(big) + 3 && p.s[0] == '<' && !strcmp(p.s + p.n - 2, "|>") && !strcmp(r.s, "o!"),
          "prompt of %zu bytes, response '%s'", p.n, r.s);
    REQUIRE(tg_instruct_render(&t, "i", 1, "in", 2, big, strlen(big), &p, &r, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(p.s, "<i|in>") && r.n == strlen(big) + 1, "prompt '%s', response of %zu bytes", p.s, r.n);
    tg_instruct_text_free(&p);
    tg_instruct_text_free(&r);
    CHECK(!p.s && !p.n && !p.cap, "freed");
}
