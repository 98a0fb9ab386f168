/* manifest.json of a shard set, field by field: every field missing, of the wrong type or
 * out of range, unknown keys, and counts that disagree, each refused with a message naming
 * the field; the writer's side (format) for names that are not UTF-8; allocation failures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "datasets/shard_manifest.h"
#include "tests/harness.h"

/* A valid classify manifest: seq 16, 8-token bins (2 bins), 3 train and 1 eval records. */
static const char k_classify[] =
    "{\"format\": \"tunegraph-shards\", \"version\": 1, \"task\": \"classify\", \"seq\": 16,\n"
    " \"records\": {\"train\": 3, \"eval\": 1}, \"tokens\": {\"train\": 20, \"eval\": 5},\n"
    " \"labels\": [\"neg\", \"pos\"],\n"
    " \"length_histogram\": {\"bin_width\": 8, \"train\": [1, 2], \"eval\": [1, 0]},\n"
    " \"token_types\": false,\n"
    " \"tokenizer\": {\"identity\": \"00000000000000ff\", \"family\": \"wordpiece\", \"vocab_size\": 100},\n"
    " \"shards\": [{\"file\": \"train/00000.tgshard\", \"split\": \"train\", \"records\": 3, \"bytes\": 100, "
    "\"xxh64\": \"0123456789abcdef\"},\n"
    "            {\"file\": \"eval/00000.tgshard\", \"split\": \"eval\", \"records\": 1, \"bytes\": 60, "
    "\"xxh64\": \"fedcba9876543210\"}],\n"
    " \"command\": \"tunegraph data convert x\"}";

/* A valid qa manifest: doc_stride, no labels, token types, one train shard. */
static const char k_qa[] =
    "{\"format\": \"tunegraph-shards\", \"version\": 1, \"task\": \"qa\", \"seq\": 16, \"doc_stride\": 4,\n"
    " \"records\": {\"train\": 2, \"eval\": 0}, \"tokens\": {\"train\": 32, \"eval\": 0},\n"
    " \"labels\": [],\n"
    " \"length_histogram\": {\"bin_width\": 16, \"train\": [2], \"eval\": [0]},\n"
    " \"token_types\": true,\n"
    " \"tokenizer\": {\"identity\": \"abcdef0123456789\", \"family\": \"bpe\", \"vocab_size\": 50},\n"
    " \"shards\": [{\"file\": \"train/a.tgshard\", \"split\": \"train\", \"records\": 2, \"bytes\": 48, "
    "\"xxh64\": \"0000000000000000\"}],\n"
    " \"command\": \"\"}";

typedef struct edit {
    const char *base;
    const char *from, *to; /* the first `from` in base becomes `to` */
    const char *want;      /* a substring of the message */
} edit;

/* base with its first `from` replaced by `to`, malloc'd; NULL if from is not in base. */
static char *edited(const char *base, const char *from, const char *to) {
    const char *p = strstr(base, from);
    if (!p) return NULL;
    size_t n = strlen(base) - strlen(from) + strlen(to) + 1;
    char *s = malloc(n);
    snprintf(s, n, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
    return s;
}

TG_TEST(test_shard_manifest_valid_sets_parse) {
    tg_err err = {{0}};
    tg_shard_manifest m;
    REQUIRE(tg_shard_manifest_parse(k_classify, strlen(k_classify), "m.json", &m, &err) == 0, "%s", err.msg);
    CHECK(m.version == 1 && m.task == TG_SHARD_CLASSIFY && m.seq == 16 && m.doc_stride == 0, "header fields");
    CHECK(m.records[0] == 3 && m.records[1] == 1 && m.tokens[0] == 20 && m.tokens[1] == 5, "counts");
    CHECK(m.n_labels == 2 && !strcmp(m.labels[0], "neg") && !strcmp(m.labels[1], "pos"), "labels");
    CHECK(m.hist_bin == 8 && m.n_bins == 2 && m.hist[0][0] == 1 && m.hist[0][1] == 2 && m.hist[1][0] == 1 &&
              m.hist[1][1] == 0,
          "histogram");
    CHECK(m.token_types == 0 && m.tokenizer_identity == 0xff && !strcmp(m.tokenizer_family, "wordpiece") &&
              m.vocab_size == 100,
          "tokenizer");
    CHECK(m.n_shards == 2 && !strcmp(m.shards[0].file, "train/00000.tgshard") && m.shards[0].split == 0 &&
              m.shards[0].records == 3 && m.shards[0].bytes == 100 && m.shards[0].xxh64 == 0x0123456789abcdefull,
          "shard 0");
    CHECK(!strcmp(m.shards[1].file, "eval/00000.tgshard") && m.shards[1].split == 1 &&
              m.shards[1].xxh64 == 0xfedcba9876543210ull,
          "shard 1");
    CHECK(!strcmp(m.command, "tunegraph data convert x"), "command '%s'", m.command);
    tg_shard_manifest_free(&m);
    CHECK(m.labels == NULL && m.shards == NULL && m.n_labels == 0, "free clears the manifest");

    REQUIRE(tg_shard_manifest_parse(k_qa, strlen(k_qa), "q.json", &m, &err) == 0, "%s", err.msg);
    CHECK(m.task == TG_SHARD_QA && m.doc_stride == 4 && m.n_labels == 0 && m.token_types == 1 && m.n_bins == 1 &&
              m.hist[0][0] == 2 && m.tokens[0] == 32 && !strcmp(m.command, "") && m.tokenizer_identity == 0xabcdef0123456789ull,
          "qa fields");
    /* format(parse(x)) parses to the same manifest, doc_stride included. */
    char *text;
    size_t len;
    REQUIRE(tg_shard_manifest_format(&m, &text, &len, &err) == 0, "%s", err.msg);
    CHECK(len == strlen(text) && strstr(text, "\"doc_stride\": 4") && strstr(text, "\"token_types\": true") &&
              strstr(text, "\"identity\": \"abcdef0123456789\"") && strstr(text, "\"labels\": []"),
          "formatted: %s", text);
    tg_shard_manifest again;
    REQUIRE(tg_shard_manifest_parse(text, len, "again", &again, &err) == 0, "%s", err.msg);
    CHECK(again.doc_stride == 4 && again.records[0] == 2 && again.shards[0].bytes == 48 && again.vocab_size == 50,
          "round trip");
    tg_shard_manifest_free(&again);
    free(text);
    tg_shard_manifest_free(&m);

    /* An lm set: no doc_stride, no labels. */
    char *lm = edited(k_qa, "\"task\": \"qa\", \"seq\": 16, \"doc_stride\": 4,", "\"task\": \"lm\", \"seq\": 16,");
    REQUIRE(lm, "lm edit");
    REQUIRE(tg_shard_manifest_parse(lm, strlen(lm), "lm.json", &m, &err) == 0, "%s", err.msg);
    CHECK(m.task == TG_SHARD_LM && m.doc_stride == 0, "lm fields");
    REQUIRE(tg_shard_manifest_format(&m, &text, &len, &err) == 0, "%s", err.msg);
    CHECK(!strstr(text, "doc_stride") && strstr(text, "\"task\": \"lm\""), "lm formatted: %s", text);
    free(text);
    tg_shard_manifest_free(&m);
    free(lm);

    CHECK(!strcmp(tg_shard_task_name(TG_SHARD_LM), "lm") && !strcmp(tg_shard_task_name(0), "?") &&
              !strcmp(tg_shard_task_name(TG_SHARD_INSTRUCT), "instruct") && !strcmp(tg_shard_task_name(TG_SHARD_IMAGE), "image") && !strcmp(tg_shard_task_name(6), "?"),
          "task names");
    CHECK(!strcmp(tg_shard_split_name(TG_SPLIT_EVAL), "eval") && !strcmp(tg_shard_split_name(2), "?") &&
              !strcmp(tg_shard_split_name(-1), "?"),
          "split names");
}

TG_TEST(test_shard_manifest_bad_fields_are_named) {
    const char *C = k_classify, *Q = k_qa;
    const edit edits[] = {
        /* the document */
        {C, "{\"format\"", "[{\"format\"", "m.json:9:39: invalid JSON: ']' expected"},
        {C, "\"format\": \"tunegraph-shards\", \"version\": 1,", "\"format\": \"tunegraph-shards\", \"version\": 1, \"version\": 1,",
         "invalid JSON"},
        {C, "\"format\": \"tunegraph-shards\"", "\"format\": 7", "not a tunegraph shard set manifest (\"format\" is not \"tunegraph-shards\")"},
        {C, "\"format\": \"tunegraph-shards\", ", "", "not a tunegraph shard set manifest"},
        {C, "\"version\": 1", "\"version\": \"1\"", "m.json: \"version\" must be a whole number"},
        {C, "\"version\": 1, ", "", "m.json: \"version\" must be a whole number"},
        {C, "\"version\": 1", "\"version\": 0", "shard set format version 0, this build reads version 1 (convert the data again"},
        {C, "\"command\"", "\"comment\"", "m.json: unknown key \"comment\" in the manifest"},
        /* task, seq, doc_stride */
        {C, "\"task\": \"classify\", ", "", "m.json: the manifest has no \"task\""},
        {C, "\"task\": \"classify\"", "\"task\": 1", "\"task\" must be \"classify\", \"lm\", \"qa\", \"instruct\" or \"image\""},
        {C, "\"task\": \"classify\"", "\"task\": \"\"", "\"task\" must be \"classify\", \"lm\", \"qa\", \"instruct\" or \"image\""},
        {C, "\"seq\": 16,", "", "the manifest has no \"seq\""},
        {C, "\"seq\": 16", "\"seq\": 16.0", "the manifest.seq must be a whole number from 1 to 4194304"},
        {C, "\"seq\": 16", "\"seq\": 0", "the manifest.seq must be a whole number from 1 to 4194304"},
        {C, "\"seq\": 16", "\"seq\": 4194305", "the manifest.seq must be a whole number from 1 to 4194304"},
        {C, "\"seq\": 16", "\"seq\": 16, \"doc_stride\": 2", "\"doc_stride\" belongs to qa sets only"},
        {Q, "\"doc_stride\": 4,", "", "the manifest has no \"doc_stride\""},
        {Q, "\"doc_stride\": 4", "\"doc_stride\": 16", "the manifest.doc_stride must be a whole number from 0 to 15"},
        {Q, "\"doc_stride\": 4", "\"doc_stride\": -1", "the manifest.doc_stride must be a whole number from 0 to 15"},
        /* records, tokens */
        {C, "\"records\": {\"train\": 3, \"eval\": 1}, ", "", "the manifest has no \"records\""},
        {C, "\"records\": {\"train\": 3, \"eval\": 1}", "\"records\": [3, 1]",
         "\"records\" must be an object {\"train\": N, \"eval\": N}"},
        {C, "\"records\": {\"train\": 3, \"eval\": 1}", "\"records\": {}", "m.json: records has no \"train\""},
        {C, "\"records\": {\"train\": 3, \"eval\": 1}", "\"records\": {\"train\": 3}", "m.json: records has no \"eval\""},
        {C, "\"records\": {\"train\": 3, \"eval\": 1}", "\"records\": {\"train\": 3, \"eval\": 1, \"test\": 0}",
         "unknown key \"test\" in records"},
        {C, "\"records\": {\"train\": 3", "\"records\": {\"train\": -3", "records.train must be a whole number from 0 to"},
        {C, "\"tokens\": {\"train\": 20", "\"tokens\": {\"train\": \"20\"", "tokens.train must be a whole number from 0 to"},
        {C, "\"tokens\": {\"train\": 20", "\"tokens\": {\"train\": 2", "tokens.train 2 does not fit 3 records of 1 to 16 tokens"},
        {C, "\"tokens\": {\"train\": 20", "\"tokens\": {\"train\": 64", "tokens.train 64 does not fit 3 records of 1 to 16 tokens"},
        {C, "\"tokens\": {\"train\": 20", "\"tokens\": {\"train\": 49", "tokens.train 49 does not fit 3 records of 1 to 16 tokens"},
        {C, "\"eval\": 5}", "\"eval\": 0}", "tokens.eval 0 does not fit 1 records of 1 to 16 tokens"},
        {Q, "\"records\": {\"train\": 2, \"eval\": 0}, \"tokens\": {\"train\": 32,",
         "\"records\": {\"train\": 0, \"eval\": 0}, \"tokens\": {\"train\": 0,", "q.json: the set holds no records"},
        /* labels */
        {C, "\"labels\": [\"neg\", \"pos\"],", "", "the manifest has no \"labels\""},
        {C, "\"labels\": [\"neg\", \"pos\"]", "\"labels\": \"neg\"", "\"labels\" must be an array of names"},
        {C, "\"labels\": [\"neg\", \"pos\"]", "\"labels\": []", "m.json: a classify set needs label names"},
        {Q, "\"labels\": []", "\"labels\": [\"a\", \"b\"]", "q.json: a qa set has no labels, but \"labels\" lists 2"},
        {C, "[\"neg\", \"pos\"]", "[\"neg\", 2]", "labels[1] must be a non-empty name"},
        {C, "[\"neg\", \"pos\"]", "[\"\", \"pos\"]", "labels[0] must be a non-empty name"},
        /* jansson refuses NUL inside strings (no JSON_ALLOW_NUL), so no name holds one */
        {C, "[\"neg\", \"pos\"]", "[\"neg\", \"p\\u0000s\"]", "m.json:3:29: invalid JSON: \\u0000 is not allowed"},
        {C, "[\"neg\", \"pos\"]", "[\"pos\", \"pos\"]", "label 'pos' is listed twice"},
        {C, "[\"neg\", \"pos\"]", "[\"pos\", \"zed\", \"pos\", \"neg\", \"neg\"]", "label 'neg' is listed twice"},
        /* length_histogram */
        {C, "\"length_histogram\": {\"bin_width\": 8, \"train\": [1, 2], \"eval\": [1, 0]},", "",
         "the manifest has no \"length_histogram\""},
        {C, "{\"bin_width\": 8, \"train\": [1, 2], \"eval\": [1, 0]}", "8", "\"length_histogram\" must be an object"},
        {C, "\"eval\": [1, 0]}", "\"eval\": [1, 0], \"test\": []}", "unknown key \"test\" in length_histogram"},
        {C, "\"bin_width\": 8, ", "", "length_histogram has no \"bin_width\""},
        {C, "\"bin_width\": 8", "\"bin_width\": 0", "length_histogram.bin_width must be a whole number from 1 to 4194304"},
        {C, "\"bin_width\": 8", "\"bin_width\": 4194305", "length_histogram.bin_width must be a whole number from 1 to 4194304"},
        {C, "\"bin_width\": 8, \"train\": [1, 2], ", "\"bin_width\": 8, ", "length_histogram has no \"train\""},
        {C, "\"train\": [1, 2]", "\"train\": {\"0\": 1}", "length_histogram.train must be an array of 2 counts (ceil(seq 16 / bin_width 8))"},
        {C, "\"eval\": [1, 0]", "\"eval\": [1]", "length_histogram.eval must be an array of 2 counts"},
        {C, "\"train\": [1, 2]", "\"train\": [1, \"2\"]", "length_histogram.train[1] must be a count from 0 to the split's 3 records"},
        {C, "\"train\": [1, 2]", "\"train\": [-1, 4]", "length_histogram.train[0] must be a count from 0 to the split's 3 records"},
        {C, "\"train\": [1, 2]", "\"train\": [4, 0]", "length_histogram.train[0] must be a count from 0 to the split's 3 records"},
        {C, "\"train\": [1, 2]", "\"train\": [2, 2]", "length_histogram.train counts 4 records, the train split has 3"},
        {C, "\"train\": [1, 2]", "\"train\": [1, 1]", "length_histogram.train counts 2 records, the train split has 3"},
        {C, "\"eval\": [1, 0]", "\"eval\": [0, 0]", "length_histogram.eval counts 0 records, the eval split has 1"},
        /* token_types */
        {C, "\"token_types\": false,", "", "the manifest has no \"token_types\""},
        {C, "\"token_types\": false", "\"token_types\": 0", "\"token_types\" must be true or false"},
        {C, "\"token_types\": false", "\"token_types\": \"no\"", "\"token_types\" must be true or false"},
        /* tokenizer */
        {C, "\"tokenizer\": {\"identity\": \"00000000000000ff\", \"family\": \"wordpiece\", \"vocab_size\": 100},", "",
         "the manifest has no \"tokenizer\""},
        {C, "{\"identity\": \"00000000000000ff\", \"family\": \"wordpiece\", \"vocab_size\": 100}", "[]",
         "\"tokenizer\" must be an object"},
        {C, "\"vocab_size\": 100}", "\"vocab_size\": 100, \"cased\": true}", "unknown key \"cased\" in tokenizer"},
        {C, "\"identity\": \"00000000000000ff\", ", "", "tokenizer has no \"identity\""},
        {C, "\"identity\": \"00000000000000ff\"", "\"identity\": 255", "tokenizer.identity must be 16 lower-case hex digits"},
        {C, "\"identity\": \"00000000000000ff\"", "\"identity\": \"0000000000000ff\"", "tokenizer.identity must be 16 lower-case hex digits"},
        {C, "\"identity\": \"00000000000000ff\"", "\"identity\": \"00000000000000FF\"", "tokenizer.identity must be 16 lower-case hex digits"},
        {C, "\"identity\": \"00000000000000ff\"", "\"identity\": \"00000000000000ff0\"", "tokenizer.identity must be 16 lower-case hex digits"},
        {C, "\"identity\": \"00000000000000ff\"", "\"identity\": \"00000000000000ffz\"", "tokenizer.identity must be 16 lower-case hex digits"},
        {C, "\"identity\": \"00000000000000ff\"", "\"identity\": \"00000000000000ff \"", "tokenizer.identity must be 16 lower-case hex digits"},
        {C, ", \"vocab_size\": 100}", "}", "tokenizer has no \"vocab_size\""},
        {C, "\"vocab_size\": 100", "\"vocab_size\": 0", "tokenizer.vocab_size must be a whole number from 1 to 2147483647"},
        {C, "\"vocab_size\": 100", "\"vocab_size\": 2147483648", "tokenizer.vocab_size must be a whole number from 1 to 2147483647"},
        {C, "\"family\": \"wordpiece\", ", "", "tokenizer has no \"family\""},
        {C, "\"family\": \"wordpiece\"", "\"family\": 3", "tokenizer.family must be a name of 1 to 31 characters"},
        {C, "\"family\": \"wordpiece\"", "\"family\": \"\"", "tokenizer.family must be a name of 1 to 31 characters"},
        {C, "\"family\": \"wordpiece\"", "\"family\": \"abcdefghijklmnopqrstuvwxyz012345\"",
         "tokenizer.family must be a name of 1 to 31 characters"},
        {C, "\"family\": \"wordpiece\"", "\"family\": \"word\\u0000piece\"", "m.json:6:74: invalid JSON: \\u0000 is not allowed"},
        /* shards */
        {Q, "\"shards\": [", "\"x\": [", "unknown key \"x\" in the manifest"},
        {Q, ",\n \"shards\": [{\"file\": \"train/a.tgshard\", \"split\": \"train\", \"records\": 2, \"bytes\": 48, \"xxh64\": \"0000000000000000\"}]",
         "", "q.json: the manifest has no \"shards\""},
        {Q, "[{\"file\": \"train/a.tgshard\", \"split\": \"train\", \"records\": 2, \"bytes\": 48, \"xxh64\": \"0000000000000000\"}]",
         "[]", "q.json: the train shards hold 0 records, records.train says 2"},
        {Q, "[{\"file\": \"train/a.tgshard\", \"split\": \"train\", \"records\": 2, \"bytes\": 48, \"xxh64\": \"0000000000000000\"}]",
         "{}", "\"shards\" must be an array"},
        {C, "\"shards\": [{", "\"shards\": [7, {", "m.json: shards[0] must be an object"},
        {C, "\"xxh64\": \"0123456789abcdef\"}", "\"xxh64\": \"0123456789abcdef\", \"mode\": 1}",
         "unknown key \"mode\" in shards[0]"},
        {C, "\"split\": \"eval\", ", "", "shards[1] has no \"split\""},
        {C, "\"split\": \"train\"", "\"split\": 0", "shards[0].split must be \"train\" or \"eval\""},
        {C, "\"split\": \"train\"", "\"split\": \"test\"", "shards[0].split must be \"train\" or \"eval\""},
        {C, "\"file\": \"eval/00000.tgshard\", ", "", "shards[1] has no \"file\""},
        {C, "\"file\": \"train/00000.tgshard\"", "\"file\": 0",
         "shards[0].file must name a file in the set's train/ folder (\"train/00000.tgshard\")"},
        {C, "\"file\": \"train/00000.tgshard\"",
         "\"file\": \"train/0000000000000000000000000000000000000000000000000000000000.tgshard\"",
         "shards[0].file must name a file in the set's train/ folder"},
        {C, "\"file\": \"train/00000.tgshard\"", "\"file\": \"train/00\\u0000000.tgshard\"",
         "m.json:7:48: invalid JSON: \\u0000 is not allowed"},
        {C, "\"file\": \"eval/00000.tgshard\"", "\"file\": \"train/00001.tgshard\"",
         "shards[1].file must name a file in the set's eval/ folder (\"eval/00000.tgshard\")"},
        {C, "\"file\": \"train/00000.tgshard\"", "\"file\": \"train00000.tgshard\"", "shards[0].file must name a file"},
        {C, "\"file\": \"train/00000.tgshard\"", "\"file\": \"train/\"", "shards[0].file must name a file"},
        {C, "\"file\": \"train/00000.tgshard\"", "\"file\": \"train/.hidden\"", "shards[0].file must name a file"},
        {C, "\"file\": \"train/00000.tgshard\"", "\"file\": \"train/sub/00000.tgshard\"", "shards[0].file must name a file"},
        {Q, "\"shards\": [{\"file\": \"train/a.tgshard\", \"split\": \"train\", \"records\": 2,",
         "\"shards\": [{\"file\": \"train/a.tgshard\", \"split\": \"train\", \"records\": 1, \"bytes\": 48, "
         "\"xxh64\": \"0000000000000000\"}, {\"file\": \"train/a.tgshard\", \"split\": \"train\", \"records\": 1,",
         "q.json: shards[1] names train/a.tgshard, as shards[0] does"},
        {C, "\"records\": 3, \"bytes\": 100, ", "\"bytes\": 100, ", "shards[0] has no \"records\""},
        {C, "\"records\": 3, \"bytes\"", "\"records\": 0, \"bytes\"", "shards[0].records must be a whole number from 1 to"},
        {C, "\"bytes\": 100", "\"bytes\": 47", "shards[0].bytes must be a whole number from 48 to"},
        {C, "\"bytes\": 100, ", "", "shards[0] has no \"bytes\""},
        {C, ", \"xxh64\": \"fedcba9876543210\"", "", "shards[1] has no \"xxh64\""},
        {C, "\"xxh64\": \"fedcba9876543210\"", "\"xxh64\": \"fedcba987654321g\"", "shards[1].xxh64 must be 16 lower-case hex digits"},
        {C, "\"xxh64\": \"fedcba9876543210\"", "\"xxh64\": \"fedcba9876543210-\"", "shards[1].xxh64 must be 16 lower-case hex digits"},
        {C, "\"xxh64\": \"fedcba9876543210\"", "\"xxh64\": null", "shards[1].xxh64 must be 16 lower-case hex digits"},
        {C, "\"records\": 3, \"bytes\"", "\"records\": 4, \"bytes\"", "the train shards hold more records than records.train (3)"},
        {C, "\"records\": 3, \"bytes\"", "\"records\": 2, \"bytes\"", "the train shards hold 2 records, records.train says 3"},
        {C, ",\n            {\"file\": \"eval/00000.tgshard\", \"split\": \"eval\", \"records\": 1, \"bytes\": 60, "
            "\"xxh64\": \"fedcba9876543210\"}",
         "", "the eval shards hold 0 records, records.eval says 1"},
        /* command */
        {C, ",\n \"command\": \"tunegraph data convert x\"", "", "the manifest has no \"command\""},
        {C, "\"command\": \"tunegraph data convert x\"", "\"command\": null", "\"command\" must be a string"},
        {C, "\"command\": \"tunegraph data convert x\"", "\"command\": \"a\\u0000b\"", "m.json:9:22: invalid JSON: \\u0000 is not allowed"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        const edit *e = &edits[i];
        char *text = edited(e->base, e->from, e->to);
        if (!CHECK(text, "edit %zu: '%s' is not in the manifest", i, e->from)) continue;
        const char *name = e->base == k_qa ? "q.json" : "m.json";
        tg_err err = {{0}};
        tg_shard_manifest m;
        memset(&m, 0x5a, sizeof m);
        int rc = tg_shard_manifest_parse(text, strlen(text), name, &m, &err);
        CHECK(rc == -1, "edit %zu ('%s' -> '%s') accepted", i, e->from, e->to);
        CHECK(strstr(err.msg, e->want) != NULL, "edit %zu: message '%s' lacks '%s'", i, err.msg, e->want);
        CHECK(!strncmp(err.msg, name, strlen(name)), "edit %zu: message '%s' does not start with the file", i, err.msg);
        CHECK(m.labels == NULL && m.shards == NULL && m.command == NULL && m.hist[0] == NULL, "edit %zu: not freed", i);
        if (rc == 0) tg_shard_manifest_free(&m);
        free(text);
    }
    /* Not an object at all. */
    tg_err err = {{0}};
    tg_shard_manifest m;
    CHECK(tg_shard_manifest_parse("[1]", 3, "a.json", &m, &err) == -1 && !strcmp(err.msg, "a.json: expected a JSON object"),
          "%s", err.msg);
}

/* More than 2^20 labels or shards is refused before any is read. */
TG_TEST(test_shard_manifest_too_many_labels_or_shards) {
    const size_t n = (1u << 20) + 1;
    for (int which = 0; which < 2; which++) {
        const char *key = which ? "\"shards\": [" : "\"labels\": [";
        char *p = strstr(k_classify, key);
        const char *close = which ? "}],\n \"command\"" : "],\n \"length_histogram\"";
        char *q = strstr(p, close);
        REQUIRE(p && q, "layout");
        const size_t head = (size_t)(p - k_classify) + strlen(key), total = head + 2 * n + strlen(q) + 8;
        char *text = malloc(total);
        memcpy(text, k_classify, head);
        char *t = text + head;
        for (size_t i = 0; i < n; i++, t += 2) memcpy(t, i + 1 < n ? "0," : "0 ", 2);
        strcpy(t, q + (which ? 1 : 0));
        tg_err err = {{0}};
        tg_shard_manifest m;
        CHECK(tg_shard_manifest_parse(text, strlen(text), "big.json", &m, &err) == -1, "%d accepted", which);
        const char *want = which ? "big.json: more than 1048576 shards" : "big.json: more than 1048576 labels";
        CHECK(!strcmp(err.msg, want), "message '%s', want '%s'", err.msg, want);
        free(text);
    }
}

TG_TEST(test_shard_manifest_format_refuses_non_utf8) {
    tg_err err = {{0}};
    tg_shard_manifest m;
    REQUIRE(tg_shard_manifest_parse(k_classify, strlen(k_classify), "m.json", &m, &err) == 0, "%s", err.msg);
    char *text = (char *)1;
    size_t len = 7;
    for (int field = 0; field < 3; field++) {
        char *saved = field == 0 ? m.labels[1] : field == 2 ? m.command : NULL;
        char family[32];
        memcpy(family, m.tokenizer_family, sizeof family);
        char bad[] = "p\xffs";
        if (field == 0) m.labels[1] = bad;
        if (field == 1) snprintf(m.tokenizer_family, sizeof m.tokenizer_family, "%s", bad);
        if (field == 2) m.command = bad;
        CHECK(tg_shard_manifest_format(&m, &text, &len, &err) == -1 && text == NULL && len == 0, "field %d accepted",
              field);
        CHECK(!strcmp(err.msg, "manifest: a label name, the tokenizer family or the command is not UTF-8"),
              "field %d: %s", field, err.msg);
        if (field == 0) m.labels[1] = saved;
        if (field == 1) memcpy(m.tokenizer_family, family, sizeof family);
        if (field == 2) m.command = saved;
    }
    /* No command: written as "". */
    char *cmd = m.command;
    m.command = NULL;
    REQUIRE(tg_shard_manifest_format(&m, &text, &len, &err) == 0, "%s", err.msg);
    CHECK(strstr(text, "\"command\": \"\"") != NULL, "%s", text);
    free(text);
    m.command = cmd;
    tg_shard_manifest_free(&m);
}

/* Each allocation of a parse failing in turn: a clean error naming what ran out. */
TG_TEST(test_shard_manifest_parse_out_of_memory) {
    tg_err err = {{0}};
    tg_shard_manifest m;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_shard_manifest_parse(k_classify, strlen(k_classify), "m.json", &m, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    tg_shard_manifest_free(&m);
    REQUIRE(total > 10, "%ld allocations", total);
    int seen_json = 0, seen_labels = 0, seen_shards = 0, seen_hist = 0, seen_command = 0, seen_sorted = 0, seen_label = 0;
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        int rc = tg_shard_manifest_parse(k_classify, strlen(k_classify), "m.json", &m, &err);
        tg_alloc_fail_after(-1);
        if (!CHECK(rc == -1 && strstr(err.msg, "m.json: out of memory"), "allocation %ld of %ld: rc %d '%s'", k, total,
                   rc, err.msg)) {
            if (rc == 0) tg_shard_manifest_free(&m);
            continue;
        }
        seen_json += strstr(err.msg, "parsing the JSON") != NULL;
        seen_labels += strstr(err.msg, "for 2 labels") != NULL;
        seen_label += strstr(err.msg, "for labels[") != NULL;
        seen_sorted += strstr(err.msg, "checking the labels") != NULL;
        seen_hist += strstr(err.msg, "for length_histogram.") != NULL;
        seen_shards += strstr(err.msg, "for 2 shards") != NULL;
        seen_command += strstr(err.msg, "for \"command\"") != NULL;
    }
    CHECK(seen_json && seen_labels == 1 && seen_label == 2 && seen_sorted == 1 && seen_hist == 2 && seen_shards == 1 &&
              seen_command == 1,
          "messages: json %d labels %d label %d sorted %d hist %d shards %d command %d", seen_json, seen_labels,
          seen_label, seen_sorted, seen_hist, seen_shards, seen_command);
}

/* Each allocation of a format failing in turn (jansson's included): "out of memory", never a
 * manifest that lacks the key whose value could not be made. */
TG_TEST(test_shard_manifest_format_out_of_memory) {
    tg_err err = {{0}};
    tg_shard_manifest m;
    REQUIRE(tg_shard_manifest_parse(k_classify, strlen(k_classify), "m.json", &m, &err) == 0, "%s", err.msg);
    char *want;
    size_t want_len;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_shard_manifest_format(&m, &want, &want_len, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    REQUIRE(total > 20, "%ld allocations", total);
    long clean = 0;
    for (long k = 0; k < total; k++) {
        char *text = NULL;
        size_t len = 0;
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        int rc = tg_shard_manifest_format(&m, &text, &len, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            CHECK(len == want_len && !strcmp(text, want), "allocation %ld failing: a different manifest", k);
            free(text);
            continue;
        }
        clean += rc == -1 && !strcmp(err.msg, "manifest: out of memory") && text == NULL;
        CHECK(!strcmp(err.msg, "manifest: out of memory"), "allocation %ld of %ld: '%s'", k, total, err.msg);
    }
    CHECK(clean == total, "%ld of %ld failures were clean", clean, total);
    free(want);
    tg_shard_manifest_free(&m);
}

/* Each allocation of a format failing alone (the later ones succeed, jansson's included): a
 * string value that could not be made is "out of memory", never a manifest holding null in
 * its place. */
TG_TEST(test_shard_manifest_format_single_allocation_failures) {
    tg_err err = {{0}};
    tg_shard_manifest m;
    REQUIRE(tg_shard_manifest_parse(k_classify, strlen(k_classify), "m.json", &m, &err) == 0, "%s", err.msg);
    char *want;
    size_t want_len;
    tg_alloc_fail_after(-1);
    REQUIRE(tg_shard_manifest_format(&m, &want, &want_len, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    long failed = 0, same = 0;
    for (long k = 0; k < total; k++) {
        char *text = NULL;
        size_t len = 0;
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        int rc = tg_shard_manifest_format(&m, &text, &len, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            same += CHECK(len == want_len && !strcmp(text, want), "allocation %ld failing: a different manifest:\n%s", k,
                          text);
            free(text);
            continue;
        }
        failed += CHECK(!strcmp(err.msg, "manifest: out of memory") && text == NULL && len == 0,
                        "allocation %ld of %ld: '%s'", k, total, err.msg);
    }
    CHECK(failed + same == total && failed > 0, "%ld failed, %ld the same, of %ld", failed, same, total);
    free(want);
    tg_shard_manifest_free(&m);
}
