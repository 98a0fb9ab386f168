/* Llama 3's tokenizer.json on a small hand-made file of its shape: the 256 byte-level
 * characters and a few merges (tg_test_bpe_vocab_json, with " hello", "'S", "12", "123",
 * "45", "\n\n" and "'ſ" besides), Llama's added tokens, the pre-tokenizer Sequence [Split
 * with Llama 3's pattern, ByteLevel without regex], ignore_merges, and the post-processor
 * Sequence [ByteLevel, TemplateProcessing <|begin_of_text|> A / <|begin_of_text|> A
 * <|begin_of_text|>:1 B:1]. Each encoding is checked token for token (ids and byte
 * offsets, type ids where pairs) against what Hugging Face `tokenizers` 0.23 gives for the
 * same file and text. Then other Split patterns (text between matches, empty matches, no
 * match, the constructs taken into PCRE2's syntax), the family and special ids with and
 * without a tokenizer_config.json beside, and every refusal with its message: the
 * pre-tokenizer, the pattern, tokenizer_config.json, and a pattern that backtracks past
 * PCRE2's limit. The JSON is written with ' for "; patterns are escaped for JSON here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* Llama 3's pattern, as its tokenizer.json has it (once JSON is read). */
#define LLAMA_REGEX                                                                                                    \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"

#define BYTE_LEVEL_NO_REGEX "{'type': 'ByteLevel', 'add_prefix_space': false, 'trim_offsets': true, 'use_regex': false}"
#define ADDED(id, content)                                                                                             \
    "{'id': " #id ", 'content': '" content "', 'single_word': false, 'lstrip': false, 'rstrip': false, "              \
    "'normalized': false, 'special': true}"
#define BOS_PIECE(type) "{'SpecialToken': {'id': '<|begin_of_text|>', 'type_id': " #type "}}"
#define LLAMA_POST                                                                                                     \
    "{'type': 'Sequence', 'processors': [{'type': 'ByteLevel', 'add_prefix_space': true, 'trim_offsets': false, "      \
    "'use_regex': true}, {'type': 'TemplateProcessing', 'single': [" BOS_PIECE(0) ", {'Sequence': {'id': 'A', "      \
    "'type_id': 0}}], 'pair': [" BOS_PIECE(0) ", {'Sequence': {'id': 'A', 'type_id': 0}}, " BOS_PIECE(1) ", "        \
    "{'Sequence': {'id': 'B', 'type_id': 1}}], 'special_tokens': {'<|begin_of_text|>': {'id': '<|begin_of_text|>', "  \
    "'ids': [273], 'tokens': ['<|begin_of_text|>']}}}]}"

/* JSON's string for text: \, " and ' (which tg_test_write_quoted would turn into ")
 * escaped. */
static void json_escape(const char *text, char *out, size_t cap) {
    size_t n = 0;
    for (const char *c = text; *c && n + 8 < cap; c++) {
        if (*c == '\\') n += (size_t)snprintf(out + n, cap - n, "\\\\");
        else if (*c == '\'') n += (size_t)snprintf(out + n, cap - n, "\\u0027");
        else if (*c == '"') n += (size_t)snprintf(out + n, cap - n, "\\u0022");
        else out[n++] = *c;
    }
    out[n] = 0;
}

/* The pre-tokenizer Sequence [Split (regex, Isolated), ByteLevel without regex]. */
static const char *split_pre(const char *regex) {
    static char pre[4096];
    char esc[2048];
    json_escape(regex, esc, sizeof esc);
    snprintf(pre, sizeof pre,
             "{'type': 'Sequence', 'pretokenizers': [{'type': 'Split', 'pattern': {'Regex': '%s'}, 'behavior': "
             "'Isolated', 'invert': false}, " BYTE_LEVEL_NO_REGEX "]}",
             esc);
    return pre;
}

/* The tokenizer.json of this shape with the pre-tokenizer and post-processor given (JSON
 * with ' for "), written into dir; returns its path (valid until the next call). */
static const char *write_llama(const char *dir, const char *pre, const char *post, int ignore_merges) {
    static char path[700];
    char *vocab = tg_test_bpe_vocab_json(", \"\xc4\xa0hello\": 266, \"'S\": 267, \"12\": 268, \"123\": 269, \"45\": 270,"
                                         " \"\xc4\x8a\xc4\x8a\": 271, \"'\xc3\x85\xc2\xbf\": 272");
    /* the vocabulary keeps its " and ': it goes in after the rest is quoted */
    const size_t cap = strlen(vocab) + strlen(pre) + strlen(post) + 4096;
    char *quoted = malloc(cap), *json = malloc(cap);
    if (!quoted || !json) abort();
    snprintf(quoted, cap,
             "{'version': '1.0', 'truncation': null, 'padding': null, 'added_tokens': [" ADDED(273, "<|begin_of_text|>")
             ", " ADDED(274, "<|end_of_text|>") ", " ADDED(275, "<|eot_id|>") ", " ADDED(
                 276, "<|reserved_special_token_0|>") "], 'normalizer': null, 'pre_tokenizer': %s, 'post_processor': "
                                                      "%s, 'decoder': {'type': 'ByteLevel'}, 'model': {'type': 'BPE', "
                                                      "'dropout': null, 'unk_token': null, 'fuse_unk': false, "
                                                      "'byte_fallback': false, 'ignore_merges': %s, 'vocab': @, "
                                                      "'merges': ['h e', 'l l', 'he ll', 'hell o', '\xc4\xa0 w', 'o r', "
                                                      "'\xc4\xa0w or', 'l d', '\xc4\xa0wor ld', '1 2', '12 3', '4 5', "
                                                      "'\xc4\x8a \xc4\x8a']}}",
             pre, post, ignore_merges ? "true" : "false");
    for (char *c = quoted; *c; c++)
        if (*c == '\'') *c = '"';
    char *at = strchr(quoted, '@');
    snprintf(json, cap, "%.*s%s%s", (int)(at - quoted), quoted, vocab, at + 1);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (tg_test_write_file(path, json)) abort();
    free(vocab);
    free(quoted);
    free(json);
    return path;
}

static tg_tokenizer *open_path(const char *path) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(path, &t, &err) == 0, "open %s: %s", path, err.msg);
    return t;
}

/* A fresh sub-folder of this test's folder. */
static const char *subdir(const char *name) {
    static char path[4][700];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 700, "%s/%s", tg_test_tmpdir(), name);
    if (mkdir(p, 0755)) abort();
    return p;
}

/* The encoding as `tunegraph tokenize --offsets` writes it: ID:START-END, ID:- for
 * template tokens; with types, each token's type id after a '/'. */
static void format_encoding(const tg_encoding *e, int types, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int32_t i = 0; i < e->n && n + 48 < cap; i++) {
        if (e->sequence[i] < 0) n += (size_t)snprintf(out + n, cap - n, "%s%d:-", i ? " " : "", e->ids[i]);
        else
            n += (size_t)snprintf(out + n, cap - n, "%s%d:%lld-%lld", i ? " " : "", e->ids[i], (long long)e->start[i],
                                  (long long)e->end[i]);
        if (types) n += (size_t)snprintf(out + n, cap - n, "/%d", e->type_ids[i]);
    }
}

static void expect_with(tg_tokenizer *t, const char *text, const char *pair, const tg_encode_options *o, int types,
                        const char *want) {
    if (!t) return;
    tg_encoding e = {0};
    tg_err err = {{0}};
    if (CHECK(tg_tokenizer_encode(t, text, strlen(text), pair, pair ? strlen(pair) : 0, o, &e, &err) == 0,
              "encode '%s': %s", text, err.msg)) {
        char got[2048];
        format_encoding(&e, types, got, sizeof got);
        CHECK(!strcmp(got, want), "'%s' / '%s': got '%s', want '%s'", text, pair ? pair : "-", got, want);
    }
    tg_encoding_free(&e);
}

static void expect_tokens(tg_tokenizer *t, const char *text, const char *want) {
    expect_with(t, text, NULL, NULL, 0, want);
}

static void expect_special(const tg_tokenizer *t, tg_tokenizer_family family, tg_special_ids want) {
    if (!t) return;
    CHECK(tg_tokenizer_family_of(t) == family, "family %d, want %d", tg_tokenizer_family_of(t), family);
    const tg_special_ids s = tg_tokenizer_special_ids(t);
    CHECK(s.cls == want.cls && s.sep == want.sep && s.pad == want.pad && s.unk == want.unk && s.mask == want.mask &&
              s.bos == want.bos && s.eos == want.eos,
          "special ids cls %d sep %d pad %d unk %d mask %d bos %d eos %d", s.cls, s.sep, s.pad, s.unk, s.mask, s.bos,
          s.eos);
}

/* ---- Llama 3's shape ------------------------------------------------------------------ */

TG_TEST(test_tokenizer_llama_split_template_ignore_merges) {
    const char *dir = subdir("llama");
    tg_tokenizer *t = open_path(write_llama(dir, split_pre(LLAMA_REGEX), LLAMA_POST, 1));
    REQUIRE(t, "no tokenizer");
    /* no tokenizer_config.json: bos the template's, eos <|end_of_text|>, no pad */
    expect_special(t, TG_TOKENIZER_BPE_LLAMA, (tg_special_ids){-1, -1, -1, -1, -1, 273, 274});
    CHECK(tg_tokenizer_added_count(t, 0) == 1 && tg_tokenizer_added_count(t, 1) == 2, "Llama adds 1 and 2, not %d and %d",
          tg_tokenizer_added_count(t, 0), tg_tokenizer_added_count(t, 1));
    CHECK(tg_tokenizer_vocab_size(t) == 277, "vocab size %d", tg_tokenizer_vocab_size(t));
    /* ignore_merges: " hello" is in the vocabulary whole (no merge makes it) */
    expect_tokens(t, "hello world hello", "273:- 259:0-5 264:5-11 266:11-17");
    /* contractions in any case ('S whole, where GPT-2's pattern takes ' alone); 'll; ' Re
     * is no contraction after a space */
    expect_tokens(t, "he'S it'll 'Re",
                  "273:- 256:0-2 267:2-4 32:4-5 105:5-6 116:6-7 39:7-8 257:8-10 32:10-11 39:11-12 82:12-13 101:13-14");
    /* ſ folds to s: 'ſ is a contraction, then t */
    expect_tokens(t, "'\xc5\xbft", "273:- 272:0-3 116:3-4");
    /* numbers in threes */
    expect_tokens(t, "12345 6", "273:- 269:0-3 270:3-5 32:5-6 54:6-7");
    /* line breaks with the spaces before them; spaces before a word, then the word with one */
    expect_tokens(t, "a\n\n  b  ", "273:- 97:0-1 271:1-3 32:3-4 32:4-5 98:5-6 32:6-7 32:7-8");
    expect_tokens(t, "x\r\n\r\ny", "273:- 120:0-1 13:1-2 10:2-3 13:3-4 10:4-5 121:5-6");
    expect_tokens(t, " \xc2\xa0\xe2\x80\xa8x", "273:- 32:0-1 194:1-3 160:1-3 226:3-6 128:3-6 168:3-6 120:6-7");
    /* special tokens written in the text */
    expect_tokens(t, "<|eot_id|>hello<|begin_of_text|> x", "273:- 275:0-10 259:10-15 273:15-32 32:32-33 120:33-34");
    /* characters of several bytes: each byte a token over the whole character */
    expect_tokens(t, "\xe4\xb8\xad\xe6\x96\x87 caf\xc3\xa9!!\n",
                  "273:- 228:0-3 184:0-3 173:0-3 230:3-6 150:3-6 135:3-6 32:6-7 99:7-8 97:8-9 102:9-10 195:10-12 "
                  "169:10-12 33:12-13 33:13-14 10:14-15");
    expect_tokens(t, "", "273:-");
    /* pairs: the second <|begin_of_text|> and B of type 1 */
    expect_with(t, "hello", "he'S", NULL, 1, "273:-/0 259:0-5/0 273:-/1 256:0-2/1 267:2-4/1");
    /* truncation longest first, counting the template's tokens; none */
    const tg_encode_options five = {1, 5, 0}, three = {1, 3, 0}, plain = {0, 0, 0}, one = {1, 1, 0};
    expect_with(t, "hello world hello", "12345 6", &five, 0, "273:- 259:0-5 273:- 269:0-3 270:3-5");
    expect_with(t, "hello world hello", NULL, &three, 0, "273:- 259:0-5 264:5-11");
    expect_with(t, "hello world hello", NULL, &one, 0, "273:-");
    expect_with(t, "hello world", NULL, &plain, 0, "259:0-5 264:5-11");
    expect_with(t, "hello", "12", &plain, 1, "259:0-5/0 268:0-2/1");
    tg_encoding e = {0};
    tg_err err = {{0}};
    CHECK(tg_tokenizer_encode(t, "a", 1, "b", 1, &one, &e, &err) == -1 &&
              strstr(err.msg, "max_len 1 is shorter than the 2 special tokens the template adds"),
          "pair under max_len 1: %s", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);

    /* without ignore_merges: Ġ and hello */
    t = open_path(write_llama(subdir("merges"), split_pre(LLAMA_REGEX), LLAMA_POST, 0));
    expect_tokens(t, "hello world hello", "273:- 259:0-5 264:5-11 32:11-12 259:12-17");
    tg_tokenizer_free(t);
}

/* Other Split patterns on the same file, as HF splits: matches and the text between them
 * are words, an empty match splits where it is and the search goes on a character further;
 * the constructs taken into PCRE2's syntax match as Oniguruma's. */
TG_TEST(test_tokenizer_llama_split_patterns) {
    static const struct {
        const char *regex, *text, *want;
    } cases[] = {
        {"2", "12", "273:- 49:0-1 50:1-2"},       /* text before a match: 12 is no word */
        {"2", "121", "273:- 49:0-1 50:1-2 49:2-3"}, /* and after the last */
        {"1", "12", "273:- 49:0-1 50:1-2"},
        {"z", "12", "273:- 268:0-2"},                  /* no match: one word */
        {"(?=2)", "1212", "273:- 49:0-1 50:1-2 49:2-3 50:3-4"}, /* empty matches split */
        {"x*", "\xc3\xa9x\xc3\xa9", "273:- 195:0-2 169:0-2 120:2-3 195:3-5 169:3-5"},
        {"x*", "", "273:-"},
        {"b*", "abba c", "273:- 97:0-1 98:1-2 98:2-3 97:3-4 32:4-5 99:5-6"},
        {"(?<=a)\\p{^L}{2,}|(?<!x)[\\s\\-]{1,3}?|(?=q)|(b|c)++|\\S{2}|\\P{N}\\t??|(?i:k)", "a12 - bbc qq9\tz",
         "273:- 97:0-1 49:1-2 50:2-3 32:3-4 45:4-5 32:5-6 98:6-7 98:7-8 99:8-9 32:9-10 113:10-11 113:11-12 57:12-13 "
         "9:13-14 122:14-15"},
        {"(?<=a)\\p{^L}{2,}|(?<!x)[\\s\\-]{1,3}?|(?=q)|(b|c)++|\\S{2}|\\P{N}\\t??|(?i:k)", "x -  \t\xe2\x84\xaa" "12",
         "273:- 120:0-1 32:1-2 45:2-3 32:3-4 32:4-5 9:5-6 226:6-9 132:6-9 170:6-9 49:9-10 50:10-11"},
        /* case-insensitive groups: letters apart (alternatives, a class, a group closed) */
        {"(?i:s|t)|(?i:k)s|(?i:f)|i|(?i:[a-z]\\n)|(?i:x|\\p{L})", "1st2", "273:- 49:0-1 115:1-2 116:2-3 50:3-4"},
        {"(?:hel)+lo|[^\\p{L}]+|wor(?!x)ld", "hello world", "273:- 259:0-5 32:5-6 119:6-7 261:7-9 263:9-11"},
        /* escaped punctuation stands for itself */
        {"\\{\\}|\\[|\\]|\\\\|\\^|\\||\\~|_", "a{}[b]\\^|~_c",
         "273:- 97:0-1 123:1-2 125:2-3 91:3-4 98:4-5 93:5-6 92:6-7 94:7-8 124:8-9 126:9-10 95:10-11 99:11-12"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char name[32];
        snprintf(name, sizeof name, "p%zu", k);
        tg_tokenizer *t = open_path(write_llama(subdir(name), split_pre(cases[k].regex), LLAMA_POST, 0));
        if (!CHECK(t != NULL, "pattern %s", cases[k].regex)) continue;
        expect_tokens(t, cases[k].text, cases[k].want);
        tg_tokenizer_free(t);
    }
}

/* A pattern that backtracks past PCRE2's match limit: the encoding fails, naming it. */
TG_TEST(test_tokenizer_llama_split_match_limit) {
    tg_tokenizer *t = open_path(write_llama(subdir("limit"), split_pre("(a+)+[bc]"), LLAMA_POST, 0));
    REQUIRE(t, "no tokenizer");
    char text[64];
    memset(text, 'a', 40);
    text[40] = 'd', text[41] = 0;
    tg_encoding e = {0};
    tg_err err = {{0}};
    CHECK(tg_tokenizer_encode(t, text, strlen(text), NULL, 0, NULL, &e, &err) == -1 &&
              strstr(err.msg, "pre-tokenisation failed at byte 0: ") && strstr(err.msg, "limit"),
          "catastrophic backtracking: '%s'", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t);
}

/* The family: a BPE template that starts with one token and adds no <s>. */
TG_TEST(test_tokenizer_llama_family_and_special_ids) {
    /* a template of bos A eos, without <|end_of_text|>: eos -1, bos the template's */
    tg_tokenizer *t = open_path(write_llama(
        subdir("eot"), split_pre(LLAMA_REGEX),
        "{'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': 'B', 'type_id': 0}}, {'Sequence': {'id': 'A',"
        " 'type_id': 0}}, {'SpecialToken': {'id': 'E', 'type_id': 0}}], 'pair': [{'Sequence': {'id': 'A', 'type_id':"
        " 0}}, {'Sequence': {'id': 'B', 'type_id': 1}}], 'special_tokens': {'B': {'id': 'B', 'ids': [276]}, 'E': {'id':"
        " 'E', 'ids': [275]}}}",
        1));
    expect_special(t, TG_TOKENIZER_BPE_LLAMA, (tg_special_ids){-1, -1, -1, -1, -1, 276, 274});
    expect_tokens(t, "12", "276:- 268:0-2 275:-");
    tg_tokenizer_free(t);

    /* a template that starts with a token of two ids: GPT-2's family */
    t = open_path(write_llama(
        subdir("two"), split_pre(LLAMA_REGEX),
        "{'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': 'B', 'type_id': 0}}, {'Sequence': {'id': 'A',"
        " 'type_id': 0}}], 'pair': [{'Sequence': {'id': 'A', 'type_id': 0}}, {'Sequence': {'id': 'B', 'type_id': 1}}],"
        " 'special_tokens': {'B': {'id': 'B', 'ids': [273, 276]}}}",
        1));
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, 265, -1, 265, 265});
    expect_tokens(t, "12", "273:- 276:- 268:0-2");
    tg_tokenizer_free(t);

    /* no post-processor: GPT-2's family, the Split pattern still Llama's */
    t = open_path(write_llama(subdir("none"), split_pre(LLAMA_REGEX), "null", 1));
    expect_special(t, TG_TOKENIZER_BPE_GPT2, (tg_special_ids){-1, -1, -1, 265, -1, 265, 265});
    expect_tokens(t, "12345", "269:0-3 270:3-5");
    tg_tokenizer_free(t);
}

/* tokenizer_config.json beside the tokenizer.json (opened as a file or as its folder) names
 * bos, eos and pad; its other keys change nothing; the identity follows the ids. */
TG_TEST(test_tokenizer_llama_config) {
    const char *plain = subdir("plain");
    tg_tokenizer *t0 = open_path(write_llama(plain, split_pre(LLAMA_REGEX), LLAMA_POST, 1));
    REQUIRE(t0, "no tokenizer");
    const char *dir = subdir("config");
    const char *path = write_llama(dir, split_pre(LLAMA_REGEX), LLAMA_POST, 1);
    char cfg[800];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    REQUIRE(!tg_test_write_file(cfg, "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": {\"__type\": \"AddedToken\","
                                     " \"content\": \"<|eot_id|>\"}, \"pad_token\": \"<|reserved_special_token_0|>\","
                                     " \"add_bos_token\": true, \"add_eos_token\": false, \"added_tokens_decoder\":"
                                     " {\"273\": {\"content\": \"<|begin_of_text|>\", \"special\": true}, \"276\":"
                                     " {\"content\": \"<|reserved_special_token_0|>\"}}, \"model_max_length\": 131072,"
                                     " \"chat_template\": \"{{ bos_token }}\", \"tokenizer_class\":"
                                     " \"PreTrainedTokenizerFast\"}"),
            "write");
    for (int as_folder = 0; as_folder < 2; as_folder++) {
        tg_tokenizer *t = open_path(as_folder ? dir : path);
        expect_special(t, TG_TOKENIZER_BPE_LLAMA, (tg_special_ids){-1, -1, 276, -1, -1, 273, 275});
        expect_tokens(t, "12345 6", "273:- 269:0-3 270:3-5 32:5-6 54:6-7");
        CHECK(t && tg_tokenizer_identity(t) != tg_tokenizer_identity(t0), "the identity does not follow the config");
        /* padding with the config's pad */
        const tg_encode_options pad = {1, 0, 4};
        expect_with(t, "12", NULL, &pad, 0, "273:- 268:0-2 276:- 276:-");
        tg_tokenizer_free(t);
    }
    tg_encoding e = {0};
    tg_err err = {{0}};
    const tg_encode_options pad = {1, 0, 4};
    CHECK(tg_tokenizer_encode(t0, "12", 2, NULL, 0, &pad, &e, &err) == -1 && strstr(err.msg, "no pad token"),
          "padding without a pad: %s", err.msg);
    tg_encoding_free(&e);
    tg_tokenizer_free(t0);

    /* null: none; null switches; bos and eos not named: the template's and <|end_of_text|> */
    REQUIRE(!tg_test_write_file(cfg, "{\"pad_token\": null, \"add_bos_token\": null, \"add_eos_token\": null,"
                                     " \"added_tokens_decoder\": {}}"),
            "write");
    tg_tokenizer *t = open_path(dir);
    expect_special(t, TG_TOKENIZER_BPE_LLAMA, (tg_special_ids){-1, -1, -1, -1, -1, 273, 274});
    tg_tokenizer_free(t);
    REQUIRE(!tg_test_write_file(cfg, "{\"bos_token\": null, \"eos_token\": \"12\", \"add_eos_token\": false}"), "write");
    t = open_path(dir);
    expect_special(t, TG_TOKENIZER_BPE_LLAMA, (tg_special_ids){-1, -1, -1, -1, -1, -1, 268});
    tg_tokenizer_free(t);
}

/* ---- refusals ------------------------------------------------------------------------- */

static void refused_path(const char *path, const char *want) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    const int rc = tg_tokenizer_open(path, &t, &err);
    CHECK(rc == -1 && t == NULL, "%s opened (rc %d), want '%s'", path, rc, want);
    CHECK(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    tg_tokenizer_free(t);
}

#define SPLIT_WITH(keys) "{'type': 'Split', 'pattern': {'Regex': 'a'}" keys "}"
#define SEQ_OF(items) "{'type': 'Sequence', 'pretokenizers': [" items "]}"
#define ISOLATED ", 'behavior': 'Isolated'"

TG_TEST(test_tokenizer_llama_pre_tokenizer_refusals) {
    static const struct {
        const char *pre, *want;
    } cases[] = {
        {SEQ_OF(SPLIT_WITH(ISOLATED)), "pre_tokenizer Sequence: only [Split, ByteLevel] (Llama 3's) is supported"},
        {"{'type': 'Sequence'}", "pre_tokenizer Sequence: only [Split, ByteLevel]"},
        {SEQ_OF(BYTE_LEVEL_NO_REGEX ", " SPLIT_WITH(ISOLATED)), "pre_tokenizer Sequence: only [Split, ByteLevel]"},
        {SEQ_OF(SPLIT_WITH(ISOLATED) ", " SPLIT_WITH(ISOLATED)), "pre_tokenizer Sequence: only [Split, ByteLevel]"},
        {SEQ_OF(SPLIT_WITH(ISOLATED) ", " BYTE_LEVEL_NO_REGEX ", " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer Sequence: only [Split, ByteLevel]"},
        {SEQ_OF("{'type': 'Split', 'pattern': {'String': 'a'}, 'behavior': 'Isolated'}, " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer.pretokenizers[0].pattern is not {\"Regex\": pattern} (the one supported)"},
        {SEQ_OF("{'type': 'Split', 'pattern': 'a', 'behavior': 'Isolated'}, " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer.pretokenizers[0].pattern is not {\"Regex\": pattern}"},
        {SEQ_OF("{'type': 'Split', 'pattern': {'Regex': 5}, 'behavior': 'Isolated'}, " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer.pretokenizers[0].pattern is not {\"Regex\": pattern}"},
        {SEQ_OF(SPLIT_WITH(", 'behavior': 'Removed'") ", " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer.pretokenizers[0].behavior 'Removed' is not supported (Isolated is)"},
        {SEQ_OF(SPLIT_WITH(", 'behavior': 'MergedWithPrevious'") ", " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer.pretokenizers[0].behavior 'MergedWithPrevious' is not supported"},
        {SEQ_OF(SPLIT_WITH("") ", " BYTE_LEVEL_NO_REGEX), "pre_tokenizer.pretokenizers[0].behavior '' is not supported"},
        {SEQ_OF(SPLIT_WITH(", 'behavior': 3") ", " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer.pretokenizers[0].behavior '' is not supported"},
        {SEQ_OF(SPLIT_WITH(ISOLATED ", 'invert': true") ", " BYTE_LEVEL_NO_REGEX),
         "pre_tokenizer.pretokenizers[0].invert true is not supported"},
        {SEQ_OF(SPLIT_WITH(ISOLATED) ", {'type': 'ByteLevel', 'add_prefix_space': false}"),
         "pre_tokenizer.pretokenizers[1]: ByteLevel with use_regex after a Split is not supported"},
        {SEQ_OF(SPLIT_WITH(ISOLATED) ", {'type': 'ByteLevel', 'use_regex': false}"),
         "pre_tokenizer.pretokenizers[1]: ByteLevel with add_prefix_space after a Split is not supported"},
        {SEQ_OF(SPLIT_WITH(ISOLATED) ", {'type': 'ByteLevel', 'use_regex': false, 'add_prefix_space': true}"),
         "pre_tokenizer.pretokenizers[1]: ByteLevel with add_prefix_space after a Split is not supported"},
        {"{'type': 'Split', 'pattern': {'Regex': 'a'}, 'behavior': 'Isolated'}",
         "pre_tokenizer 'Split' is not supported with BPE (ByteLevel, or Sequence [Split, ByteLevel], is)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char name[32];
        snprintf(name, sizeof name, "pre%zu", k);
        refused_path(write_llama(subdir(name), cases[k].pre, LLAMA_POST, 1), cases[k].want);
    }
}

/* Patterns refused, each naming the construct and its byte. */
TG_TEST(test_tokenizer_llama_pattern_refusals) {
    char long_bad[400];
    memset(long_bad, 'a', 330);
    strcpy(long_bad + 330, "(b");
    const struct {
        const char *regex, *want;
    } cases[] = {
        {"a\\d", "pattern.Regex: this escape at byte 1 ('\\d') is not supported"},
        {"\\h", "this escape at byte 0 ('\\h')"},
        {"\\1", "this escape at byte 0 ('\\1')"},
        {"\\ ", "this escape at byte 0"},
        {"\\\xc3\xa9", "this escape at byte 0"},
        {"a\\", "this escape at byte 1 ('\\')"},
        {"\\p", "this escape at byte 0 ('\\p')"},
        {"\\pL", "this escape at byte 0 ('\\pL')"},
        {"\\p{L", "this escape at byte 0 ('\\p{L')"},
        {"\\p{", "this escape at byte 0 ('\\p{')"},
        {"a\\dbcdefghijklmnop", "this escape at byte 1 ('\\dbcdefghijk') is not supported"},
        {"\\p{Latin}", "this escape at byte 0 ('\\p{Latin}')"},
        {"\\P{^Foo}", "this escape at byte 0"},
        {"[\\S]", "this escape in a class at byte 1 ('\\S]')"},
        {"[\\d]", "this escape in a class at byte 1"},
        {"[]a]", "']' first in a class (write \\]) at byte 1"},
        {"[^]a]", "']' first in a class (write \\]) at byte 2"},
        {"[a[b]]", "a set operation inside a class ([...] or &&) at byte 2"},
        {"[a-z&&b]", "a set operation inside a class ([...] or &&) at byte 4"},
        {"[&a", "a class without its ']' at byte 0"},
        {"[a&", "a class without its ']' at byte 0"},
        {"x[", "a class without its ']' at byte 1"},
        {"x[^", "a class without its ']' at byte 1"},
        {"(?<n>a)", "this kind of group at byte 0 ('(?<n>a)')"},
        {"(?i)a", "this kind of group at byte 0"},
        {"(?", "this kind of group at byte 0"},
        {"(*UTF)a", "this kind of group at byte 0"},
        {"a{,3}", "'{' that is no {n}, {n,} or {n,m} quantifier (write \\{) at byte 1"},
        {"a{x}", "'{' that is no {n}"},
        {"a{2", "'{' that is no {n}"},
        {"a{2,x}", "'{' that is no {n}"},
        {"a{2,3x", "'{' that is no {n}"},
        {"a{2,", "'{' that is no {n}"},
        {"a{2,-}", "'{' that is no {n}"},
        {"a{", "'{' that is no {n}"},
        {"a{2}+", "'+' after {n,m} (a repeat in Oniguruma's syntax, a possessive in PCRE2's) at byte 4"},
        {"a{2,}?+", "'+' after {n,m}"},
        {"^a", "'^' and '$' (line anchors in Oniguruma's syntax) at byte 0"},
        {"a$", "'^' and '$' (line anchors in Oniguruma's syntax) at byte 1"},
        {"a.b", "'.' at byte 1"},
        {"(?i:ss)", "ss, st, ff, fi or fl in a case-insensitive group (Oniguruma matches a ligature or \xc3\x9f there) at "
                    "byte 4 ('ss)')"},
        {"(?i:a(?:St))", "ss, st, ff, fi or fl in a case-insensitive group"},
        {"(?i:xfF)", "ss, st, ff, fi or fl in a case-insensitive group (Oniguruma matches a ligature or \xc3\x9f there) at byte 5"},
        {"(?i:fi)", "ss, st, ff, fi or fl"},
        {"(?i:s(?:t))", "a ligature or \xc3\x9f there) at byte 4 ('s(?:t))')"},
        {"(?i:s{1}t)", "a ligature or \xc3\x9f there) at byte 4 ('s{1}t)')"},
        {"(?i:(?:f)(i))", "a ligature or \xc3\x9f there) at byte 7"},
        {"(?i:FL)", "ss, st, ff, fi or fl"},
        {"(?i:a\xc3\x9f)", "a character past ASCII in a case-insensitive group (Oniguruma folds some into several "
                           "characters) at byte 5"},
        {"(?i:[\xc3\x9f])", "a character past ASCII in a case-insensitive group (Oniguruma folds some into several "
                            "characters) at byte 5"},
        /* taken, then refused by PCRE2 */
        {"(ab", "pattern.Regex does not compile: missing closing parenthesis at byte 3 of its PCRE2 form '(ab'"},
        {"a(", "pattern.Regex does not compile: missing closing parenthesis at byte 2 of its PCRE2 form 'a('"},
        {"a)", "pattern.Regex does not compile: "},
        {"*a", "pattern.Regex does not compile: quantifier does not follow a repeatable item at byte 0"},
        {long_bad, "pattern.Regex does not compile: missing closing parenthesis at byte 332 of its PCRE2 form 'aaaa"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char name[32];
        snprintf(name, sizeof name, "re%zu", k);
        refused_path(write_llama(subdir(name), split_pre(cases[k].regex), LLAMA_POST, 1), cases[k].want);
    }
}

TG_TEST(test_tokenizer_llama_config_refusals) {
    static const struct {
        const char *config, *want;
    } cases[] = {
        {"{\"bos_token\": ", "tokenizer_config.json:1: "},
        {"[1]", "tokenizer_config.json is not a JSON object"},
        {"{\"bos_token\": 5}", "tokenizer_config.json: bos_token is not a token (a string, an object with content, or null)"},
        {"{\"eos_token\": {\"text\": \"x\"}}", "tokenizer_config.json: eos_token is not a token"},
        {"{\"pad_token\": [\"<pad>\"]}", "tokenizer_config.json: pad_token is not a token"},
        {"{\"eos_token\": \"<|eot|>\"}",
         "tokenizer_config.json: eos_token '<|eot|>' is neither in the vocabulary nor an added token of the tokenizer.json"},
        {"{\"bos_token\": {\"content\": \"<s>\"}}", "tokenizer_config.json: bos_token '<s>' is neither"},
        {"{\"add_bos_token\": false}",
         "tokenizer_config.json: add_bos_token is not supported unless true (the template of the tokenizer.json adds "
         "the bos token)"},
        {"{\"add_bos_token\": \"yes\"}", "tokenizer_config.json: add_bos_token is not supported unless true"},
        {"{\"add_eos_token\": true}",
         "tokenizer_config.json: add_eos_token is not supported unless false (the template of the tokenizer.json is used)"},
        {"{\"added_tokens_decoder\": []}", "tokenizer_config.json: added_tokens_decoder is not an object of id: token"},
        {"{\"added_tokens_decoder\": {\"273\": {\"content\": \"<|eot_id|>\"}}}",
         "tokenizer_config.json: added_tokens_decoder['273'] is not an added token of the tokenizer.json with that id "
         "and content"},
        {"{\"added_tokens_decoder\": {\"277\": {\"content\": \"<|image|>\"}}}", "added_tokens_decoder['277'] is not"},
        {"{\"added_tokens_decoder\": {\"266\": {\"content\": \"\xc4\xa0hello\"}}}", "added_tokens_decoder['266'] is not"},
        {"{\"added_tokens_decoder\": {\"273\": {\"content\": \"<|begin_of_text|>\"}, \"x\": {\"content\": \"a\"}}}",
         "added_tokens_decoder['x'] is not"},
        {"{\"added_tokens_decoder\": {\"273x\": {\"content\": \"<|begin_of_text|>\"}}}",
         "added_tokens_decoder['273x'] is not"},
        {"{\"added_tokens_decoder\": {\"\": {\"content\": \"<|begin_of_text|>\"}}}", "added_tokens_decoder[''] is not"},
        {"{\"added_tokens_decoder\": {\"273\": \"<|begin_of_text|>\"}}", "added_tokens_decoder['273'] is not"},
        {"{\"added_tokens_decoder\": {\"273\": {\"content\": 273}}}", "added_tokens_decoder['273'] is not"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char name[32], cfg[800];
        snprintf(name, sizeof name, "cfg%zu", k);
        const char *dir = subdir(name);
        write_llama(dir, split_pre(LLAMA_REGEX), LLAMA_POST, 1);
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
        if (tg_test_write_file(cfg, cases[k].config)) abort();
        refused_path(dir, cases[k].want);
    }
}
