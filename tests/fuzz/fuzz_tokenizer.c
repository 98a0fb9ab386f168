/* libFuzzer target: the tokenizers. The first byte picks what the rest is:
 *   0  a tokenizer file (vocab.txt, tokenizer.json or a vocab.json), opened, and on
 *      success used on a few fixed texts
 *   1+ text for one of four fixed tokenizers (a vocab.txt WordPiece; a WordPiece
 *      tokenizer.json with added tokens of every kind; a byte-level BPE tokenizer.json
 *      with RoBERTa's template, add_prefix_space and ignore_merges; one of Llama 3's
 *      shape: its Split pattern, <|begin_of_text|> A, ignore_merges), after one byte of
 *      options (special tokens, a pair split at the first TAB, truncation, padding)
 * Every encoding is checked: ids inside the vocabulary, offsets inside their text,
 * lengths as truncation and padding say, the same result twice (the BPE cache), and
 * success on any valid UTF-8 (checked here apart from the tokenizer) when the options
 * leave room for the template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "datasets/tokenizer.h"
#include "tests/fuzz/fuzz_input.h"

static tg_tokenizer *fixed[4];

static const char wordpiece_vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\nun\n##aff\n##able\na\n##a\n"
                                      "\xe4\xb8\xad\ncafe\n.\n##s\nx\n##\xc3\xa9\n\xc3\xa9t\xc3\xa9\n";

static const char wordpiece_json[] =
    "{\"added_tokens\": ["
    "{\"id\": 0, \"content\": \"[PAD]\", \"special\": true, \"normalized\": false},"
    "{\"id\": 1, \"content\": \"[UNK]\", \"special\": true, \"normalized\": false},"
    "{\"id\": 2, \"content\": \"[CLS]\", \"special\": true, \"normalized\": false},"
    "{\"id\": 3, \"content\": \"[SEP]\", \"special\": true, \"normalized\": false, \"rstrip\": true},"
    "{\"id\": 4, \"content\": \"[MASK]\", \"special\": true, \"normalized\": false, \"lstrip\": true},"
    "{\"id\": 9, \"content\": \"new york\", \"special\": false, \"normalized\": true},"
    "{\"id\": 10, \"content\": \"ab\", \"special\": false, \"normalized\": true, \"single_word\": true}],"
    " \"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true, \"handle_chinese_chars\": true,"
    " \"strip_accents\": null, \"lowercase\": true},"
    " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
    " \"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 3], \"cls\": [\"[CLS]\", 2]},"
    " \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"continuing_subword_prefix\": \"##\","
    " \"max_input_chars_per_word\": 12, \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2, \"[SEP]\": 3,"
    " \"[MASK]\": 4, \"a\": 5, \"##b\": 6, \"b\": 7, \"##a\": 8, \"new\": 11, \"york\": 12}}}";

/* The 256 byte characters as "char": byte, comma-separated. */
static size_t put_byte_vocab(char *s, size_t cap, size_t n) {
    for (int b = 0; b < 256; b++) {
        /* GPT-2's byte characters: printable bytes as themselves, the rest from U+0100 */
        unsigned cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE ? (unsigned)b
                      : b <= 0x20                                                    ? 0x100u + (unsigned)b
                      : b <= 0xA0                                                    ? 0x100u + 33 + (unsigned)(b - 0x7F)
                                                                                     : 0x100u + 67;
        char u[8];
        if (cp == '"' || cp == '\\') snprintf(u, sizeof u, "\\%c", (char)cp);
        else if (cp < 0x80) snprintf(u, sizeof u, "%c", (char)cp);
        else snprintf(u, sizeof u, "%c%c", (char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F)));
        n += (size_t)snprintf(s + n, cap - n, "%s\"%s\": %d", b ? ", " : "", u, b);
    }
    return n;
}

/* Llama 3's shape: its Split pattern and template, its added tokens, ignore_merges. */
static char *llama_json(void) {
    size_t cap = 65536, n = 0;
    char *s = malloc(cap);
    if (!s) abort();
    n += (size_t)snprintf(
        s + n, cap - n,
        "{\"added_tokens\": ["
        "{\"id\": 300, \"content\": \"<|begin_of_text|>\", \"special\": true, \"normalized\": false},"
        "{\"id\": 301, \"content\": \"<|end_of_text|>\", \"special\": true, \"normalized\": false},"
        "{\"id\": 302, \"content\": \"<|eot_id|>\", \"special\": true, \"normalized\": false}],"
        " \"normalizer\": null,"
        " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
        " {\"Regex\": \"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}|"
        " ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
        " \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
        " \"trim_offsets\": true, \"use_regex\": false}]},"
        " \"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\", \"trim_offsets\":"
        " false}, {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\","
        " \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": {\"id\":"
        " \"<|begin_of_text|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\":"
        " {\"id\": \"<|begin_of_text|>\", \"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}],"
        " \"special_tokens\": {\"<|begin_of_text|>\": {\"id\": \"<|begin_of_text|>\", \"ids\": [300]}}}]},"
        " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {");
    n = put_byte_vocab(s, cap, n);
    n += (size_t)snprintf(s + n, cap - n,
                          ", \"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"\xc4\xa0hello\": 260,"
                          " \"12\": 261, \"123\": 262, \"\xc4\x8a\xc4\x8a\": 263, \"'s\": 264},"
                          " \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\", \"1 2\", \"12 3\", \"\xc4\x8a \xc4\x8a\","
                          " \"' s\"]}}");
    return s;
}

/* Byte-level BPE: the 256 byte characters, a few merges, RoBERTa's specials. */
static char *bpe_json(void) {
    size_t cap = 65536, n = 0;
    char *s = malloc(cap);
    if (!s) abort();
    n += (size_t)snprintf(s + n, cap - n,
                          "{\"added_tokens\": ["
                          "{\"id\": 300, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
                          "{\"id\": 301, \"content\": \"</s>\", \"special\": true, \"normalized\": false},"
                          "{\"id\": 302, \"content\": \"<pad>\", \"special\": true, \"normalized\": false},"
                          "{\"id\": 303, \"content\": \"<mask>\", \"special\": true, \"normalized\": false, \"lstrip\": true},"
                          "{\"id\": 304, \"content\": \"<|x|>\", \"special\": false, \"normalized\": true}],"
                          " \"normalizer\": null,"
                          " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true},"
                          " \"post_processor\": {\"type\": \"RobertaProcessing\", \"sep\": [\"</s>\", 301],"
                          " \"cls\": [\"<s>\", 300], \"trim_offsets\": true, \"add_prefix_space\": true},"
                          " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {");
    n = put_byte_vocab(s, cap, n);
    n += (size_t)snprintf(s + n, cap - n,
                          ", \"he\": 256, \"ll\": 257, \"hell\": 258, \"hello\": 259, \"\xc4\xa0h\": 260,"
                          " \"\xc4\xa0he\": 261, \"\xc3\x83\xc2\xa9\": 262, \"\xc4\xa0\xc4\xa0\": 263, \"\xc4\xa0hell\": 264,"
                          " \"\xc4\xa0hello\": 265},"
                          " \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\", \"\xc4\xa0 h\", \"\xc4\xa0h e\","
                          " [\"\xc3\x83\", \"\xc2\xa9\"], \"\xc4\xa0 \xc4\xa0\", \"\xc4\xa0he ll\", \"\xc4\xa0hell o\"]}}");
    return s;
}

static const char *write_tmp(const char *dir, const char *name, const char *text) {
    static char path[4][600];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 600, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(text, 1, strlen(text), f) != strlen(text) || fclose(f)) abort();
    return p;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    char dir[] = "/tmp/tg-fuzz-tokenizer.XXXXXX";
    if (!mkdtemp(dir)) abort();
    char *bpe = bpe_json(), *llama = llama_json();
    const char *paths[4] = {write_tmp(dir, "vocab.txt", wordpiece_vocab), write_tmp(dir, "wordpiece.json", wordpiece_json),
                            write_tmp(dir, "bpe.json", bpe), write_tmp(dir, "llama.json", llama)};
    free(bpe);
    free(llama);
    for (int k = 0; k < 4; k++) {
        tg_err err;
        if (tg_tokenizer_open(paths[k], &fixed[k], &err)) {
            fprintf(stderr, "fuzz_tokenizer: fixed tokenizer %d: %s\n", k, err.msg);
            abort();
        }
        unlink(paths[k]);
    }
    rmdir(dir);
    return 0;
}

/* Valid UTF-8, checked independently of the tokenizer's own check. */
static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t c = s[i], min;
        size_t need;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) need = 1, c &= 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) need = 2, c &= 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) need = 3, c &= 0x07, min = 0x10000;
        else return 0;
        if (n - i <= need) return 0;
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            c = (c << 6) | (s[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
        i += need + 1;
    }
    return 1;
}

static void check_encoding(const tg_tokenizer *t, const tg_encoding *e, size_t len, size_t pair_len, int pair,
                           const tg_encode_options *o) {
    const int32_t vocab = tg_tokenizer_vocab_size(t);
    FUZZ_ASSERT(e->n_real >= 0 && e->n >= e->n_real, "n %d n_real %d", e->n, e->n_real);
    if (o->max_len > 0) FUZZ_ASSERT(e->n_real <= o->max_len, "%d tokens past max_len %d", e->n_real, o->max_len);
    FUZZ_ASSERT(e->n == (o->pad_to > e->n_real ? o->pad_to : e->n_real), "n %d, pad_to %d, n_real %d", e->n, o->pad_to,
                e->n_real);
    for (int32_t i = 0; i < e->n; i++) {
        FUZZ_ASSERT(e->ids[i] >= 0 && e->ids[i] < vocab, "id %d of %d", e->ids[i], vocab);
        /* a template may name any type id; the reader takes 0 to 255 */
        FUZZ_ASSERT(e->type_ids[i] >= 0 && e->type_ids[i] <= 255, "type id %d", e->type_ids[i]);
        const int32_t s = e->sequence[i];
        FUZZ_ASSERT(s == -1 || s == 0 || (s == 1 && pair), "sequence %d", s);
        if (s < 0) {
            FUZZ_ASSERT(e->special[i] == 1 && e->start[i] == -1 && e->end[i] == -1, "template token %d", i);
            continue;
        }
        const int64_t limit = (int64_t)(s ? pair_len : len);
        FUZZ_ASSERT(e->special[i] == 0 && e->start[i] >= 0 && e->start[i] <= e->end[i] && e->end[i] <= limit,
                    "token %d offsets %lld-%lld in %lld bytes", i, (long long)e->start[i], (long long)e->end[i],
                    (long long)limit);
        if (i >= e->n_real) FUZZ_ASSERT(0, "a text token after padding");
    }
}

static void encode_checked(tg_tokenizer *t, const char *text, size_t len, const char *pair, size_t pair_len,
                           const tg_encode_options *o) {
    tg_encoding e = {0}, again = {0};
    tg_err err = {{0}};
    const int rc = tg_tokenizer_encode(t, text, len, pair, pair_len, o, &e, &err);
    const int valid = valid_utf8((const uint8_t *)text, len) && (!pair || valid_utf8((const uint8_t *)pair, pair_len));
    if (rc) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        /* valid text is refused only for a template longer than max_len, padding without a
         * pad token, a word a vocabulary without an unk token cannot spell, or a Split
         * pattern (of a fuzzed file) that backtracks past PCRE2's limits */
        FUZZ_ASSERT(!valid || strstr(err.msg, "special tokens the template adds") || strstr(err.msg, "no pad token") ||
                        strstr(err.msg, "no unk token") || strstr(err.msg, "pre-tokenisation failed"),
                    "valid text refused: %s", err.msg);
    } else {
        FUZZ_ASSERT(valid, "invalid UTF-8 accepted");
        check_encoding(t, &e, len, pair_len, pair != NULL, o);
        /* the same again: the merge cache changes nothing */
        FUZZ_ASSERT(tg_tokenizer_encode(t, text, len, pair, pair_len, o, &again, &err) == 0, "second encode: %s", err.msg);
        FUZZ_ASSERT(again.n == e.n, "second encode: %d tokens, first %d", again.n, e.n);
        for (int32_t i = 0; i < e.n; i++)
            FUZZ_ASSERT(again.ids[i] == e.ids[i] && again.start[i] == e.start[i] && again.end[i] == e.end[i],
                        "second encode differs at %d", i);
    }
    tg_encoding_free(&e);
    tg_encoding_free(&again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t mode = data[0] % 5;
    data++, size--;
    if (mode == 0) {
        tg_tokenizer *t = NULL;
        tg_err err = {{0}};
        if (tg_tokenizer_open(fuzz_input_file(data, size), &t, &err)) {
            FUZZ_ASSERT(err.msg[0] && !t, "failed without a message");
            return 0;
        }
        FUZZ_ASSERT(tg_tokenizer_vocab_size(t) > 0, "vocab size %d", tg_tokenizer_vocab_size(t));
        static const char *const texts[] = {"", "Hello, world! unaffable", "  caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87\t[SEP] <s>x",
                                            "a b c d e f g h i j k l m n o p"};
        const tg_encode_options opts[] = {{1, 0, 0}, {0, 0, 0}, {1, 8, 12}};
        for (size_t k = 0; k < sizeof texts / sizeof *texts; k++)
            for (size_t j = 0; j < sizeof opts / sizeof *opts; j++) {
                encode_checked(t, texts[k], strlen(texts[k]), NULL, 0, &opts[j]);
                encode_checked(t, texts[k], strlen(texts[k]), texts[(k + 1) % 4], strlen(texts[(k + 1) % 4]), &opts[j]);
            }
        tg_tokenizer_free(t);
        return 0;
    }
    if (size < 1) return 0;
    tg_tokenizer *t = fixed[mode - 1];
    const uint8_t flags = data[0];
    data++, size--;
    tg_encode_options o = {flags & 1, (flags & 2) ? (flags >> 4) + 1 : 0, (flags & 4) ? (flags >> 3) % 16 : 0};
    const char *text = (const char *)data, *pair = NULL;
    size_t len = size, pair_len = 0;
    if (flags & 8) {
        const char *tab = memchr(text, '\t', size);
        if (tab) {
            len = (size_t)(tab - text);
            pair = tab + 1;
            pair_len = size - len - 1;
        } else {
            pair = "";
        }
    }
    encode_checked(t, text, len, pair, pair_len, &o);
    return 0;
}
