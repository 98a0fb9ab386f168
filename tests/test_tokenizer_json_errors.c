/* tokenizer.json files that are refused, one small file per case with the message each
 * must give (the field and the cause): the model (vocabulary, WordPiece and BPE settings,
 * merges), the normalizer, the pre-tokenizer, added tokens and the post-processors
 * (BertProcessing, RobertaProcessing, TemplateProcessing, Sequence); and the folder
 * files beside a vocab.json or vocab.txt (tokenizer_config.json, config.json,
 * merges.txt). The JSON is written with ' for " to keep the table readable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/tokenizer.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"


/* Opening path fails with a message holding each of want[0..] (NULL-terminated). */
static int refused(const char *path, const char *want, const char *want2) {
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    const int rc = tg_tokenizer_open(path, &t, &err);
    int ok = CHECK(rc == -1 && t == NULL, "%s opened (rc %d)", path, rc);
    ok &= CHECK(strstr(err.msg, want) != NULL, "error '%s' lacks '%s'", err.msg, want);
    if (want2) ok &= CHECK(strstr(err.msg, want2) != NULL, "error '%s' lacks '%s'", err.msg, want2);
    tg_tokenizer_free(t);
    return ok;
}

#define WP_MODEL "'model': {'type': 'WordPiece', 'vocab': {'[CLS]': 0, '[SEP]': 1, 'a': 2}}"
#define WP_PRE "'pre_tokenizer': {'type': 'BertPreTokenizer'}"
#define WP WP_MODEL ", " WP_PRE
#define BPE_MODEL "'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1, 'ab': 2}, 'merges': ['a b']}"
#define BPE_PRE "'pre_tokenizer': {'type': 'ByteLevel'}"
#define BPE BPE_MODEL ", " BPE_PRE
#define BPE_WITH(model_keys) "'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1, 'ab': 2}, " model_keys "}, " BPE_PRE
#define WP_WITH(model_keys) "'model': {'type': 'WordPiece', 'vocab': {'[CLS]': 0, '[SEP]': 1, 'a': 2}, " model_keys "}, " WP_PRE
#define TP(single, pair, specials)                                                                                      \
    "'post_processor': {'type': 'TemplateProcessing', 'single': " single ", 'pair': " pair                              \
    ", 'special_tokens': " specials "}"
#define SEQ_A "{'Sequence': {'id': 'A', 'type_id': 0}}"
#define SEQ_B "{'Sequence': {'id': 'B', 'type_id': 1}}"
#define SP_CLS "{'SpecialToken': {'id': '[CLS]', 'type_id': 0}}"
#define CLS_IDS "{'[CLS]': {'id': '[CLS]', 'ids': [0], 'tokens': ['[CLS]']}}"

typedef struct bad_json {
    const char *json;
    const char *want;
} bad_json;

static const bad_json k_bad[] = {
    /* the model and its vocabulary */
    {"{'model': {}}", "model type '' is not supported (WordPiece and BPE are)"},
    {"{'model': {'type': 5}}", "model type '' is not supported"},
    {"{'model': {'type': 'WordPiece', 'vocab': []}, " WP_PRE "}", "model.vocab is not an object of token: id"},
    {"{'model': {'type': 'WordPiece', 'vocab': {'a': 'x'}}}", "model.vocab: 'a' has no id from 0 to 4194303"},
    {"{'model': {'type': 'WordPiece', 'vocab': {'a': 1.5}}}", "model.vocab: 'a' has no id from 0 to 4194303"},
    {"{'model': {'type': 'WordPiece', 'vocab': {'b': 4194304}}}", "model.vocab: 'b' has no id from 0 to 4194303"},
    {"{'model': {'type': 'WordPiece', 'vocab': {}}}", "model.vocab: empty vocabulary"},
    {"{'model': {'type': 'BPE', 'vocab': {}, 'merges': []}}", "model.vocab: empty vocabulary"},
    {"{" WP_WITH("'continuing_subword_prefix': '0123456789012345678901234567890123'") "}",
     "model.continuing_subword_prefix is too long"},
    {"{" WP_WITH("'max_input_chars_per_word': '5'") "}", "model.max_input_chars_per_word is not an integer"},
    {"{" WP_WITH("'max_input_chars_per_word': -1") "}", "model.max_input_chars_per_word -1 is out of range"},
    {"{" WP_WITH("'max_input_chars_per_word': 2147483648") "}",
     "model.max_input_chars_per_word 2147483648 is out of range"},
    /* BPE settings that would change the encoding and are not implemented */
    {"{" BPE_WITH("'merges': [], 'dropout': 0.1") "}", "model.dropout is not supported"},
    {"{" BPE_WITH("'merges': [], 'dropout': 'none'") "}", "model.dropout is not supported"},
    {"{" BPE_WITH("'merges': [], 'dropout': true") "}", "model.dropout is not supported"},
    {"{" BPE_WITH("'merges': [], 'continuing_subword_prefix': '##'") "}",
     "model.continuing_subword_prefix is not supported with byte-level BPE"},
    {"{" BPE_WITH("'merges': [], 'continuing_subword_prefix': 0") "}",
     "model.continuing_subword_prefix is not supported with byte-level BPE"},
    {"{" BPE_WITH("'merges': [], 'end_of_word_suffix': '</w>'") "}",
     "model.end_of_word_suffix is not supported with byte-level BPE"},
    {"{" BPE_WITH("'merges': [], 'byte_fallback': true") "}", "model.byte_fallback is not supported"},
    {"{" BPE_WITH("'merges': [], 'unk_token': 'zz'") "}", "model.unk_token 'zz' is not in the vocabulary"},
    {"{" BPE_WITH("'merges': {}") "}", "model.merges is not a list"},
    {"{" BPE_WITH("'vocab_only': 1") "}", "model.merges is not a list"},
    /* merges, as "a b" strings and as ["a", "b"] pairs */
    {"{" BPE_WITH("'merges': ['ab']") "}", "model.merges[0]: 'ab' is not two tokens separated by one space"},
    {"{" BPE_WITH("'merges': ['a b', ' b']") "}", "model.merges[1]: ' b' is not two tokens"},
    {"{" BPE_WITH("'merges': ['a ']") "}", "model.merges[0]: 'a ' is not two tokens"},
    {"{" BPE_WITH("'merges': ['a b c']") "}", "model.merges[0]: 'a b c' is not two tokens"},
    {"{" BPE_WITH("'merges': [['a']]") "}", "model.merges[0] is neither \"a b\" nor [\"a\", \"b\"]"},
    {"{" BPE_WITH("'merges': [['a', 'b', 'c']]") "}", "model.merges[0] is neither"},
    {"{" BPE_WITH("'merges': [[1, 'b']]") "}", "model.merges[0] is neither"},
    {"{" BPE_WITH("'merges': [['a', 2]]") "}", "model.merges[0] is neither"},
    {"{" BPE_WITH("'merges': [7]") "}", "model.merges[0] is neither"},
    {"{" BPE_WITH("'merges': [['a', 'b'], ['zz', 'b']]") "}", "model.merges: merge 2: 'zz' is not in the vocabulary"},
    {"{" BPE_WITH("'merges': [['a', 'zz']]") "}", "model.merges: merge 1: 'zz' is not in the vocabulary"},
    {"{" BPE_WITH("'merges': ['b a']") "}", "model.merges: merge 1: 'ba' is not in the vocabulary"},
    /* normalizers and pre-tokenizers */
    {"{" WP ", 'normalizer': {'type': 'Lowercase'}}", "normalizer 'Lowercase' is not supported"},
    {"{" WP ", 'normalizer': {'lowercase': true}}", "normalizer '' is not supported"},
    {"{" BPE ", 'normalizer': {'type': 'BertNormalizer'}}", "normalizer 'BertNormalizer' is not supported"},
    {"{" WP_MODEL "}", "pre_tokenizer 'none' is not supported with WordPiece (BertPreTokenizer is)"},
    {"{" WP_MODEL ", 'pre_tokenizer': null}", "pre_tokenizer 'none' is not supported with WordPiece"},
    {"{" WP_MODEL ", 'pre_tokenizer': {'type': 'ByteLevel'}}", "pre_tokenizer 'ByteLevel' is not supported with WordPiece"},
    {"{" BPE_MODEL "}", "pre_tokenizer 'none' is not supported with BPE (ByteLevel, or Sequence [Split, ByteLevel], is)"},
    {"{" BPE_MODEL ", 'pre_tokenizer': {'type': 'Metaspace'}}", "pre_tokenizer 'Metaspace' is not supported with BPE"},
    {"{" BPE_MODEL ", 'pre_tokenizer': {'type': 'ByteLevel', 'use_regex': false}}",
     "pre_tokenizer ByteLevel without use_regex is not supported"},
    /* added tokens */
    {"{" WP ", 'added_tokens': {}}", "added_tokens is not a list"},
    {"{" WP ", 'added_tokens': [{'id': '1', 'content': 'x'}]}", "added_tokens[0] has no integer id and string content"},
    {"{" WP ", 'added_tokens': [{'id': 0, 'content': 'a'}, {'id': 1}]}",
     "added_tokens[1] has no integer id and string content"},
    {"{" WP ", 'added_tokens': [{'id': -1, 'content': 'x'}]}", "added_tokens[0].id -1 is out of range"},
    {"{" WP ", 'added_tokens': [{'id': 3, 'content': 5}]}", "added_tokens[0] has no integer id and string content"},
    {"{" WP ", 'added_tokens': [{'content': 'x'}]}", "added_tokens[0] has no integer id and string content"},
    {"{" WP ", 'added_tokens': [{'id': 4194304, 'content': 'x'}]}", "added_tokens[0].id 4194304 is out of range"},
    {"{" WP ", 'added_tokens': [{'id': 5, 'content': ''}]}", "added_tokens[0]: an added token with empty content (id 5)"},
    /* post-processors */
    {"{" WP ", 'post_processor': {'type': 'Foo'}}", "post_processor 'Foo' is not supported"},
    {"{" WP ", 'post_processor': {'type': 'Sequence'}}", "post_processor Sequence has no processors list"},
    {"{" WP ", 'post_processor': {'type': 'Sequence', 'processors': {}}}", "post_processor Sequence has no processors list"},
    {"{" WP ", 'post_processor': {'type': 'Sequence', 'processors': [{'type': 'ByteLevel'}, {'type': 'Foo'}]}}",
     "post_processor 'Foo' is not supported"},
    {"{" WP ", 'post_processor': {'type': 'Sequence', 'processors': [{'type': 'BertProcessing', 'cls': ['[CLS]', 0], "
     "'sep': ['[SEP]', 1]}, {'type': 'BertProcessing', 'cls': ['[CLS]', 0], 'sep': ['[SEP]', 1]}]}}",
     "post_processor: more than one template"},
    {"{" WP ", 'post_processor': {'type': 'BertProcessing', 'sep': ['[SEP]', 1]}}", "post_processor cls is not [token, id]"},
    {"{" WP ", 'post_processor': {'type': 'BertProcessing', 'cls': '[CLS]', 'sep': ['[SEP]', 1]}}",
     "post_processor cls is not [token, id]"},
    {"{" WP ", 'post_processor': {'type': 'BertProcessing', 'cls': ['[CLS]'], 'sep': ['[SEP]', 1]}}",
     "post_processor cls is not [token, id]"},
    {"{" WP ", 'post_processor': {'type': 'BertProcessing', 'cls': [0, 0], 'sep': ['[SEP]', 1]}}",
     "post_processor cls is not [token, id]"},
    {"{" WP ", 'post_processor': {'type': 'BertProcessing', 'cls': ['[CLS]', '0'], 'sep': ['[SEP]', 1]}}",
     "post_processor cls is not [token, id]"},
    {"{" WP ", 'post_processor': {'type': 'BertProcessing', 'cls': ['[CLS]', -1], 'sep': ['[SEP]', 1]}}",
     "post_processor cls is not [token, id]"},
    {"{" WP ", 'post_processor': {'type': 'BertProcessing', 'cls': ['[CLS]', 0], 'sep': ['[SEP]', 4194304]}}",
     "post_processor sep is not [token, id]"},
    {"{" WP ", 'post_processor': {'type': 'RobertaProcessing', 'cls': ['[CLS]', 0], 'sep': ['[SEP]', 1]}}",
     "RobertaProcessing with a WordPiece model"},
    {"{" WP ", " TP("{}", "[]", "{}") "}", "post_processor.single is not a list"},
    {"{" WP ", " TP("[" SEQ_A "]", "null", "{}") "}", "post_processor.pair is not a list"},
    {"{" WP ", 'post_processor': {'type': 'TemplateProcessing', 'pair': [], 'special_tokens': {}}}",
     "post_processor.single is not a list"},
    {"{" WP ", " TP("[" SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A
                    "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "," SEQ_A "]",
                    "[]", "{}") "}",
     "post_processor.single has over 16 pieces"},
    {"{" WP ", " TP("[{'Foo': {'id': 'A', 'type_id': 0}}]", "[]", "{}") "}",
     "post_processor.single[0] is not a Sequence or SpecialToken with id and type_id"},
    {"{" WP ", " TP("[" SEQ_A ", {'SpecialToken': 5}]", "[]", "{}") "}", "post_processor.single[1] is not a Sequence"},
    {"{" WP ", " TP("[{'Sequence': {'id': 'A'}}]", "[]", "{}") "}", "post_processor.single[0] is not a Sequence"},
    {"{" WP ", " TP("[{'Sequence': {'id': 'A', 'type_id': -1}}]", "[]", "{}") "}", "post_processor.single[0] is not"},
    {"{" WP ", " TP("[{'Sequence': {'id': 'A', 'type_id': 256}}]", "[]", "{}") "}", "post_processor.single[0] is not"},
    {"{" WP ", " TP("[{'Sequence': {'id': 0, 'type_id': 0}}]", "[]", "{}") "}", "post_processor.single[0] is not"},
    {"{" WP ", " TP("[{'Sequence': {'id': 'A', 'type_id': '0'}}]", "[]", "{}") "}", "post_processor.single[0] is not"},
    {"{" WP ", " TP("[" SEQ_A ", {'SpecialToken': {'type_id': 0}}]", "[]", "{}") "}", "post_processor.single[1] is not"},
    {"{" WP ", " TP("[{'Sequence': {'id': 'C', 'type_id': 0}}]", "[]", "{}") "}",
     "post_processor.single[0]: sequence 'C' is not A or B"},
    {"{" WP ", " TP("[" SEQ_B "]", "[]", "{}") "}", "post_processor.single names sequence B"},
    {"{" WP ", " TP("[" SP_CLS "]", "[]", "{'[CLS]': {'id': '[CLS]', 'ids': []}}") "}",
     "special token '[CLS]' has no ids in special_tokens"},
    {"{" WP ", " TP("[" SP_CLS "]", "[]", "{'[CLS]': {'id': '[CLS]'}}") "}", "special token '[CLS]' has no ids"},
    {"{" WP ", " TP("[" SP_CLS "]", "[]", "{'[CLS]': {'id': '[CLS]', 'ids': 0}}") "}", "special token '[CLS]' has no ids"},
    {"{" WP ", " TP("[" SP_CLS "]", "[]", "{'[CLS]': {'id': '[CLS]', 'ids': ['0']}}") "}",
     "post_processor: special token '[CLS]' has a bad id"},
    {"{" WP ", " TP("[" SP_CLS "]", "[]", "{'[CLS]': {'id': '[CLS]', 'ids': [0, -1]}}") "}",
     "special token '[CLS]' has a bad id"},
    {"{" WP ", " TP("[" SP_CLS "]", "[]", "{'[CLS]': {'id': '[CLS]', 'ids': [4194304]}}") "}",
     "special token '[CLS]' has a bad id"},
    {"{" WP ", " TP("[" SEQ_A "," SEQ_A "]", "[]", "{}") "}", "post_processor.single must name sequence A once"},
    {"{" WP ", " TP("[" SP_CLS "]", "[]", CLS_IDS) "}", "post_processor.single must name sequence A once"},
    {"{" WP ", " TP("[" SEQ_A "]", "[" SEQ_A "]", "{}") "}", "post_processor.pair must name sequence A once and B once"},
    {"{" WP ", " TP("[" SEQ_A "]", "[" SEQ_A "," SEQ_B "," SEQ_B "]", "{}") "}",
     "post_processor.pair must name sequence A once and B once"},
    {"{" WP ", " TP("[" SEQ_A "]", "[" SEQ_B "]", "{}") "}", "post_processor.pair must name sequence A once and B once"},
};

TG_TEST(test_tokenizer_json_errors_table) {
    const char *dir = tg_test_tmpdir();
    for (size_t k = 0; k < sizeof k_bad / sizeof *k_bad; k++) {
        const char *path = tg_test_write_quoted(dir, "tokenizer.json", k_bad[k].json);
        if (!refused(path, k_bad[k].want, "tokenizer.json")) CHECK(0, "case %zu: %s", k, k_bad[k].json);
    }
}

/* Special tokens of n ids in the single template: 64 ids in all fit, 65 do not; one token
 * of 64 ids fits, of 65 does not. */
static void template_of_ids(int first, int second, const char *want) {
    char ids[2][400] = {"", ""};
    for (int i = 0; i < first; i++) snprintf(ids[0] + strlen(ids[0]), 8, "%s2", i ? ", " : "");
    for (int i = 0; i < second; i++) snprintf(ids[1] + strlen(ids[1]), 8, "%s2", i ? ", " : "");
    char json[2000];
    if (second)
        snprintf(json, sizeof json,
                 "{" WP ", " TP("[" SP_CLS ", " SEQ_A ", {'SpecialToken': {'id': 'Z', 'type_id': 0}}]", "[" SEQ_A ", " SEQ_B "]",
                                "{'[CLS]': {'id': '[CLS]', 'ids': [%s]}, 'Z': {'id': 'Z', 'ids': [%s]}}") "}",
                 ids[0], ids[1]);
    else
        snprintf(json, sizeof json,
                 "{" WP ", " TP("[" SP_CLS ", " SEQ_A "]", "[" SEQ_A ", " SEQ_B "]", "{'[CLS]': {'id': '[CLS]', 'ids': [%s]}}") "}",
                 ids[0]);
    const char *path = tg_test_write_quoted(tg_test_tmpdir(), "tokenizer.json", json);
    tg_tokenizer *t = NULL;
    tg_err err = {{0}};
    const int rc = tg_tokenizer_open(path, &t, &err);
    if (want) {
        CHECK(rc == -1 && strstr(err.msg, want), "%d + %d ids: rc %d, '%s'", first, second, rc, err.msg);
    } else if (CHECK(rc == 0, "%d + %d ids: %s", first, second, err.msg)) {
        CHECK(tg_tokenizer_added_count(t, 0) == first + second, "%d + %d ids: %d added", first, second,
              tg_tokenizer_added_count(t, 0));
    }
    tg_tokenizer_free(t);
}

TG_TEST(test_tokenizer_json_errors_template_sizes) {
    template_of_ids(32, 32, NULL);
    template_of_ids(32, 33, "post_processor: more than 64 special token ids");
    template_of_ids(64, 0, NULL);
    template_of_ids(65, 0, "post_processor: too many ids");
}

/* Files that are not tokenizer.json: a JSON vocabulary with nothing beside it, and the
 * folder's settings files. */
TG_TEST(test_tokenizer_json_errors_folder_files) {
    /* a vocab.json opened as a file, with no merges beside it */
    const char *dir = tg_test_tmpdir();
    refused(tg_test_write_quoted(dir, "vocab.json", "{'a': 0}"), "vocab.json: a vocabulary without merges.txt or vocab.bpe beside it",
            NULL);
    /* not JSON, with the line and column */
    refused(tg_test_write_quoted(dir, "broken.json", "{\n 'model': }"), "broken.json:2:", NULL);

    /* a vocab.json + merges.txt folder: its own JSON errors, read through the folder */
    const char *bdir = tg_test_tmpdir();
    tg_test_write_quoted(bdir, "merges.txt", "#version: 0.2\n");
    tg_test_write_quoted(bdir, "vocab.json", "{'a': 0");
    refused(bdir, "vocab.json:1:", NULL);
    tg_test_write_quoted(bdir, "vocab.json", "['a']");
    refused(bdir, "vocab.json is not an object of token: id", NULL);
    tg_test_write_quoted(bdir, "vocab.json", "{'a': 0, 'b': 1, 'ab': 2}");
    static const struct {
        const char *merges, *want;
    } merges[] = {
        {"a\n", "merges.txt:1: not two tokens separated by one space"},
        {"#version: 0.2\na b\n b\n", "merges.txt:3: not two tokens"},
        {"a \n", "merges.txt:1: not two tokens"},
        {"zz b\n", "merge 1: 'zz' is not in the vocabulary"},
    };
    for (size_t k = 0; k < sizeof merges / sizeof *merges; k++) {
        tg_test_write_quoted(bdir, "merges.txt", merges[k].merges);
        refused(bdir, merges[k].want, NULL);
    }
    tg_test_write_quoted(bdir, "merges.txt", "a b\n");
    /* RoBERTa named by the config, but the vocabulary lacks <s> */
    tg_test_write_quoted(bdir, "config.json", "{'model_type': 'roberta'}");
    refused(bdir, "vocab.json: a RoBERTa vocabulary without <s> or </s>", NULL);
    tg_test_write_quoted(bdir, "config.json", "{'model_type': ");
    refused(bdir, "config.json:1:", NULL);
    tg_test_write_quoted(bdir, "config.json", "{}");

    /* tokenizer_config.json: its JSON and its flags */
    static const struct {
        const char *json, *want;
    } configs[] = {
        {"{'do_lower_case': 1", "tokenizer_config.json:1:"},
        {"{'do_lower_case': 'yes'}", "tokenizer_config.json: do_lower_case is not true or false"},
        {"{'strip_accents': 0}", "tokenizer_config.json: strip_accents is not true or false"},
        {"{'tokenize_chinese_chars': 'no'}", "tokenizer_config.json: tokenize_chinese_chars is not true or false"},
        {"{'add_prefix_space': []}", "tokenizer_config.json: add_prefix_space is not true or false"},
        {"{'do_lower_case': true, 'do_lower_case': false}", "tokenizer_config.json:1:"},
    };
    const char *wdir = tg_test_tmpdir();
    tg_test_write_quoted(wdir, "vocab.txt", "[CLS]\n[SEP]\na\n");
    for (size_t k = 0; k < sizeof configs / sizeof *configs; k++) {
        tg_test_write_quoted(bdir, "tokenizer_config.json", configs[k].json);
        refused(bdir, configs[k].want, NULL);
        tg_test_write_quoted(wdir, "tokenizer_config.json", configs[k].json);
        refused(wdir, configs[k].want, NULL);
    }
    /* a vocab.txt opened as a file reads the hints of its folder too */
    char vocab[700];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", wdir);
    refused(vocab, "tokenizer_config.json:1:", NULL);
}

TG_TEST(test_tokenizer_json_errors_open_arguments) {
    tg_tokenizer *t = (tg_tokenizer *)&t;
    tg_err err = {{0}};
    CHECK(tg_tokenizer_open(NULL, &t, &err) == -1 && t == NULL && strstr(err.msg, "no tokenizer path"), "NULL: %s",
          err.msg);
    t = (tg_tokenizer *)&t;
    CHECK(tg_tokenizer_open("", &t, &err) == -1 && t == NULL && strstr(err.msg, "no tokenizer path"), "empty: %s",
          err.msg);
}
