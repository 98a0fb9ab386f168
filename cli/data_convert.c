/* `tunegraph data convert INPUT... -o OUTDIR --tokenizer PATH [options]`: opens the
 * tokenizer, wraps it as the converter's text encoder and reports what was written.
 * `tunegraph data` also dispatches `dump` (cli/data_dump.c). */
#include "cli/data_convert.h"
#include "cli/data_dump.h"
#include "cli/progress.h"
#include "cli/usage.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "datasets/convert.h"
#include "datasets/shard_format.h"
#include "datasets/tokenizer.h"

static const char data_usage[] =
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

static int data_usage_error(const char *fmt, const char *arg) {
    return cli_usage_error(NULL, data_usage, fmt, arg);
}

typedef struct tokenizer_encoder {
    tg_tokenizer *tok;
    tg_encoding enc;
} tokenizer_encoder;

static int encode_with_tokenizer(void *ctx, const char *text, size_t len, const char *pair, size_t pair_len,
                                 const tg_encode_options *opt, const tg_encoding **out, tg_err *err) {
    tokenizer_encoder *t = ctx;
    if (tg_tokenizer_encode(t->tok, text, len, pair, pair_len, opt, &t->enc, err)) return -1;
    *out = &t->enc;
    return 0;
}

/* The command line as a shell would take it back, for the manifest: words with anything
 * but [A-Za-z0-9_./=:,+-] single-quoted, bytes that are not printable ASCII as '?'. */
static char *command_line(int argc, char **argv) {
    size_t cap = 64;
    for (int i = 0; i < argc; i++) cap += 4 * strlen(argv[i]) + 3;
    char *s = tg_malloc(cap), *p = s;
    if (!s) return NULL;
    p += sprintf(p, "tunegraph data");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int plain = a[0] != 0;
        for (const char *c = a; *c && plain; c++) plain = isalnum((unsigned char)*c) || strchr("_./=:,+-", *c);
        *p++ = ' ';
        if (!plain) *p++ = '\'';
        for (const char *c = a; *c; c++) {
            unsigned char u = (unsigned char)*c;
            if (u == '\'') p += sprintf(p, "'\\''"); /* a word with a quote is never plain: it is quoted */
            else *p++ = u >= 0x20 && u < 0x7F ? (char)u : '?';
        }
        if (!plain) *p++ = '\'';
    }
    *p = 0;
    return s;
}

static int parse_int(const char *text, long lo, long hi, int32_t *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (!text[0] || isspace((unsigned char)text[0]) || errno || *end || v < lo || v > hi) return -1;
    *out = (int32_t)v;
    return 0;
}

static void convert_progress(void *ctx, int64_t done, int64_t total, int64_t tokens) {
    cli_progress_update(ctx, done, total, tokens);
}

static int cmd_convert(int argc, char **argv, int all_argc, char **all_argv) {
    tg_convert_options o = {.doc_stride = -1, .seed = 42};
    const char *tokenizer = NULL;
    const char **inputs = tg_calloc((size_t)argc + 1, sizeof *inputs);
    if (!inputs) {
        fprintf(stderr, "tunegraph: out of memory for the input names\n");
        return 1;
    }
    o.inputs = inputs;
    int seed_given = 0;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = !strcmp(s, "-o") || !strcmp(s, "--tokenizer") || !strcmp(s, "--format") ||
                    !strcmp(s, "--text-column") || !strcmp(s, "--pair-column") || !strcmp(s, "--label-column") ||
                    !strcmp(s, "--labels") || !strcmp(s, "--seq") || !strcmp(s, "--doc-stride") ||
                    !strcmp(s, "--eval-fraction") || !strcmp(s, "--seed") || !strcmp(s, "--template") ||
                    !strcmp(s, "--image-size") || !strcmp(s, "--channels");
        if (takes && !value) {
            free(inputs);
            return data_usage_error("%s needs a value", s);
        }
        int bad = 0;
        if (!strcmp(s, "-o")) o.outdir = value;
        else if (!strcmp(s, "--tokenizer")) tokenizer = value;
        else if (!strcmp(s, "--format")) bad = (o.format = tg_input_format_parse(value)) < 0;
        else if (!strcmp(s, "--text-column")) o.text_column = value;
        else if (!strcmp(s, "--pair-column")) o.pair_column = value;
        else if (!strcmp(s, "--label-column")) o.label_column = value;
        else if (!strcmp(s, "--labels")) o.labels = value;
        else if (!strcmp(s, "--template")) o.template_path = value;
        else if (!strcmp(s, "--image-size")) bad = parse_int(value, 1, 4096, &o.image_size);
        else if (!strcmp(s, "--channels")) bad = parse_int(value, 1, 3, &o.image_channels) || o.image_channels == 2;
        else if (!strcmp(s, "--seq")) bad = parse_int(value, 2, 1 << 22, &o.seq);
        else if (!strcmp(s, "--doc-stride")) bad = parse_int(value, 0, 1 << 22, &o.doc_stride);
        else if (!strcmp(s, "--eval-fraction")) {
            char *end;
            o.eval_fraction = strtod(value, &end);
            bad = !value[0] || *end || !(o.eval_fraction >= 0 && o.eval_fraction < 1);
        } else if (!strcmp(s, "--seed")) {
            char *end;
            errno = 0;
            o.seed = strtoull(value, &end, 10);
            bad = !value[0] || *end || errno || value[0] == '-';
            seed_given = 1;
        } else if (!strcmp(s, "--skip-invalid")) o.skip_invalid = 1;
        else if (s[0] == '-' && s[1]) {
            free(inputs);
            return data_usage_error("unknown option %s", s);
        } else {
            inputs[o.n_inputs++] = s;
        }
        if (bad) {
            free(inputs);
            if (!strcmp(s, "--format"))
                return data_usage_error("--format must be csv, tsv, jsonl, squad, text, folders, instruct, idx or "
                                        "images, got '%s'",
                                        value);
            if (!strcmp(s, "--channels")) return data_usage_error("--channels must be 1 or 3, got '%s'", value);
            if (!strcmp(s, "--image-size")) return data_usage_error("--image-size needs a whole number from 1 to 4096, got '%s'", value);
            if (!strcmp(s, "--eval-fraction")) return data_usage_error("--eval-fraction needs a number in [0, 1), got '%s'", value);
            if (!strcmp(s, "--seed")) return data_usage_error("--seed needs a whole number from 0 to 2^64-1, got '%s'", value);
            if (!strcmp(s, "--seq")) return data_usage_error("--seq needs a whole number from 2 to 4194304, got '%s'", value);
            return data_usage_error("--doc-stride needs a whole number >= 0, got '%s'", value);
        }
        if (takes) i++;
    }
    const int idx = o.format == TG_INPUT_IDX, images = idx || o.format == TG_INPUT_IMAGES;
    if (idx) o.labels_path = o.labels, o.labels = NULL; /* --labels FILE: the IDX labels file */
    const char *missing = !o.n_inputs ? "missing INPUT" : !o.outdir ? "missing -o OUTDIR"
                        : idx && tokenizer ? "--format idx takes no --tokenizer (images)"
                        : images && tokenizer ? "--format images takes no --tokenizer"
                        : !tokenizer && !images ? "missing --tokenizer PATH" : NULL;
    if (!missing && seed_given && o.eval_fraction == 0) missing = "--seed picks the eval split: give --eval-fraction too";
    if (missing) {
        free(inputs);
        return data_usage_error("%s", missing);
    }
    tg_err err = {{0}};
    tokenizer_encoder te = {0};
    if (!images && tg_tokenizer_open(tokenizer, &te.tok, &err)) {
        free(inputs);
        fprintf(stderr, "tunegraph: %s\n", err.msg);
        return 1;
    }
    tg_text_encoder enc = {0};
    if (!images)
        enc = (tg_text_encoder){.ctx = &te,
                                .encode = encode_with_tokenizer,
                                .family = tg_tokenizer_family_of(te.tok),
                                .special = tg_tokenizer_special_ids(te.tok),
                                .vocab_size = tg_tokenizer_vocab_size(te.tok),
                                .identity = tg_tokenizer_identity(te.tok)};
    char *command = command_line(all_argc, all_argv);
    o.command = command;
    tg_convert_report rep;
    cli_progress progress;
    cli_progress_init(&progress, "data convert", isatty(STDERR_FILENO));
    o.progress = convert_progress, o.progress_ctx = &progress;
    int rc = command ? tg_convert(&o, &enc, &rep, &err) : tg_fail(&err, "out of memory for the command line");
    cli_progress_end(&progress);
    free(command);
    tg_encoding_free(&te.enc);
    tg_tokenizer_free(te.tok);
    free(inputs);
    if (rc) {
        fprintf(stderr, "tunegraph: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "tunegraph: wrote %s: %s", o.outdir, tg_shard_task_name(rep.task));
    if (rep.n_labels) fprintf(stderr, " with %d labels", rep.n_labels);
    const char *values = images ? "pixels" : "tokens";
    fprintf(stderr, ", %" PRId64 " train records (%" PRId64 " %s)", rep.records[0], rep.tokens[0], values);
    if (rep.records[1])
        fprintf(stderr, " and %" PRId64 " eval records (%" PRId64 " %s)", rep.records[1], rep.tokens[1], values);
    fprintf(stderr, " from %" PRId64 " %s", rep.units,
            rep.format == TG_INPUT_SQUAD     ? "questions"
            : rep.format == TG_INPUT_FOLDERS ? "files"
            : rep.format == TG_INPUT_TEXT    ? "lines"
            : rep.format == TG_INPUT_INSTRUCT ? "records"
            : images                          ? "images"
                                             : "rows");
    if (rep.format == TG_INPUT_SQUAD) fprintf(stderr, " (%" PRId64 " windows hold their answer)", rep.answered);
    fprintf(stderr, "\n");
    const int instruct = rep.format == TG_INPUT_INSTRUCT;
    if (rep.skipped_invalid)
        fprintf(stderr, "tunegraph: left out %" PRId64 " %s%s that %s not UTF-8 (--skip-invalid)\n", rep.skipped_invalid,
                rep.format == TG_INPUT_FOLDERS ? "file" : instruct ? "record" : "row", rep.skipped_invalid == 1 ? "" : "s",
                rep.skipped_invalid == 1 ? "is" : "are");
    if (rep.skipped_empty && !instruct)
        fprintf(stderr, "tunegraph: left out %" PRId64 " rows that encode to no tokens\n", rep.skipped_empty);
    if (rep.skipped_empty && instruct)
        fprintf(stderr, "tunegraph: left out %" PRId64 " record%s whose response encodes to no tokens\n",
                rep.skipped_empty, rep.skipped_empty == 1 ? "" : "s");
    if (rep.skipped_long)
        fprintf(stderr, "tunegraph: left out %" PRId64 " record%s whose prompt leaves no room for a response in --seq %d\n",
                rep.skipped_long, rep.skipped_long == 1 ? "" : "s", rep.seq);
    if (rep.truncated)
        fprintf(stderr, "tunegraph: cut the response of %" PRId64 " record%s to fit --seq %d\n", rep.truncated,
                rep.truncated == 1 ? "" : "s", rep.seq);
    return 0;
}

int cmd_data(int argc, char **argv) {
    if (argc < 1) return data_usage_error("%s", "data needs a subcommand: convert or dump");
    if (!strcmp(argv[0], "convert")) return cmd_convert(argc - 1, argv + 1, argc, argv);
    if (!strcmp(argv[0], "dump")) return cmd_data_dump(argc - 1, argv + 1, data_usage);
    if (!strcmp(argv[0], "help") || !strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        fputs(data_usage, stdout);
        return 0;
    }
    return data_usage_error("unknown data subcommand '%s' (there are: convert, dump)", argv[0]);
}
