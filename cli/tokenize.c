/* `tunegraph tokenize --tokenizer PATH [--pair] [--max-len N] [--no-special] [--offsets]`:
 * each line of stdin (with --pair: text TAB pair, split at the first TAB) becomes one line
 * of space-separated token ids on stdout, the template's special tokens included unless
 * --no-special; --offsets writes each token as ID:START-END (UTF-8 byte offsets into its
 * own text) and template tokens as ID:-. Lines end at '\n' alone; a line that fails
 * (invalid UTF-8, no TAB with --pair) stops the command with its line number. */
#include "cli/tokenize.h"
#include "cli/usage.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/tokenizer.h"

static const char tokenize_usage[] =
    "usage: tunegraph tokenize --tokenizer PATH [--pair] [--max-len N] [--no-special] [--offsets]\n"
    "  PATH: a vocab.txt, a tokenizer.json, a folder with vocab.json + merges.txt, or a\n"
    "  Hugging Face model folder. Reads text lines on stdin (--pair: text TAB pair) and\n"
    "  writes one line of space-separated token ids per input line (--offsets: each token\n"
    "  as ID:START-END, byte offsets into its text; template tokens as ID:-).\n";

static int tokenize_usage_error(const char *fmt, const char *arg) {
    return cli_usage_error("tokenize", tokenize_usage, fmt, arg);
}

/* Output through one buffer: ids are written with a hand-rolled decimal conversion,
 * which keeps printf out of the per-token path. */
typedef struct tokenize_out {
    char buf[1 << 16];
    size_t n;
    int failed;
} tokenize_out;

static void tokenize_flush(tokenize_out *o) {
    if (o->n && fwrite(o->buf, 1, o->n, stdout) != o->n) o->failed = 1;
    o->n = 0;
}

static void tokenize_put_number(tokenize_out *o, uint64_t v) {
    char digits[24];
    int k = 0;
    do digits[k++] = (char)('0' + v % 10);
    while (v /= 10);
    while (k) o->buf[o->n++] = digits[--k];
}

static void tokenize_put_line(tokenize_out *o, const tg_encoding *enc, int offsets) {
    for (int32_t i = 0; i < enc->n; i++) {
        if (o->n + 64 > sizeof o->buf) tokenize_flush(o);
        if (i) o->buf[o->n++] = ' ';
        tokenize_put_number(o, (uint32_t)enc->ids[i]);
        if (!offsets) continue;
        o->buf[o->n++] = ':';
        if (enc->sequence[i] < 0) {
            o->buf[o->n++] = '-';
            continue;
        }
        tokenize_put_number(o, (uint64_t)enc->start[i]);
        o->buf[o->n++] = '-';
        tokenize_put_number(o, (uint64_t)enc->end[i]);
    }
    /* each token leaves at least 11 bytes (64 before it, 53 at most for it) */
    if (o->n + 1 > sizeof o->buf) tokenize_flush(o); /* GCOVR_EXCL_BR_LINE: 11 bytes are free */
    o->buf[o->n++] = '\n';
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    int pair = 0, offsets = 0;
    tg_encode_options opt = {1, 0, 0};
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--tokenizer") || !strcmp(s, "--max-len")) {
            if (i + 1 >= argc) return tokenize_usage_error("%s needs a value", s);
            const char *v = argv[++i];
            if (s[2] == 't') {
                path = v;
                continue;
            }
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (!v[0] || *end || errno || n < 1 || n > 1 << 24)
                return tokenize_usage_error("--max-len needs a whole number from 1 to 16777216, got '%s'", v);
            opt.max_len = (int32_t)n;
        } else if (!strcmp(s, "--pair")) {
            pair = 1;
        } else if (!strcmp(s, "--offsets")) {
            offsets = 1;
        } else if (!strcmp(s, "--no-special")) {
            opt.add_special_tokens = 0;
        } else if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            fputs(tokenize_usage, stdout);
            return 0;
        } else {
            return tokenize_usage_error("unexpected argument %s", s);
        }
    }
    if (!path) return tokenize_usage_error("%s", "--tokenizer PATH is required");
    tg_err err = {{0}};
    tg_tokenizer *tok;
    if (tg_tokenizer_open(path, &tok, &err)) {
        fprintf(stderr, "tunegraph tokenize: %s\n", err.msg);
        return 1;
    }
    tokenize_out *o = tg_malloc(sizeof *o);
    if (!o) {
        tg_tokenizer_free(tok);
        fprintf(stderr, "tunegraph tokenize: out of memory\n");
        return 1;
    }
    o->n = 0;
    o->failed = 0;
    tg_encoding enc = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long line_no = 0;
    int rc = 0;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        line_no++;
        if (len > 0 && line[len - 1] == '\n') len--; /* GCOVR_EXCL_BR_LINE: getline gives a byte at least */
        const char *second = NULL;
        size_t first_len = (size_t)len, second_len = 0;
        if (pair) {
            const char *tab = memchr(line, '\t', (size_t)len);
            if (!tab) {
                fprintf(stderr, "tunegraph tokenize: stdin:%ld: no TAB between text and pair\n", line_no);
                rc = 1;
                break;
            }
            first_len = (size_t)(tab - line);
            second = tab + 1;
            second_len = (size_t)len - first_len - 1;
        }
        if (tg_tokenizer_encode(tok, line, first_len, second, second_len, &opt, &enc, &err)) {
            fprintf(stderr, "tunegraph tokenize: stdin:%ld: %s\n", line_no, err.msg);
            rc = 1;
            break;
        }
        tokenize_put_line(o, &enc, offsets);
    }
    if (!rc && ferror(stdin)) {
        fprintf(stderr, "tunegraph tokenize: reading stdin failed: %s\n", strerror(errno));
        rc = 1;
    }
    tokenize_flush(o);
    if (fflush(stdout) != 0 || o->failed) {
        if (!rc) fprintf(stderr, "tunegraph tokenize: writing stdout failed: %s\n", strerror(errno));
        rc = 1;
    }
    free(line);
    free(o);
    tg_encoding_free(&enc);
    tg_tokenizer_free(tok);
    return rc;
}
