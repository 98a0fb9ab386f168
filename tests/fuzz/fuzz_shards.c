/* libFuzzer target: shard sets. The first byte picks what the rest is:
 *   0  manifest.json text: parsed; what parses formats to text that parses to the same text
 *   1  a decompressed block (the second byte picks classify, lm, qa or instruct): checked and
 *      every record decoded against a fixed manifest (seq 64, vocab 300, 3 labels, token types)
 *   2  a whole shard file: written into a set beside a manifest that matches its size,
 *      checksum and footer, then loaded with tg_dataset_load and read back by record
 *      number, so the footer, the index and the frames meet the reader past the checksum.
 * Accepted records must honour the set: lengths 1..seq, ids below vocab, labels, answers and
 * prompts in range; an instruct set loads for lm with each record's prompt. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "datasets/dataset.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_manifest.h"
#include "datasets/shard_reader.h"
#include "datasets/shard_writer.h"
#include "plan/ops.h"
#include "tests/fuzz/fuzz_input.h"

#define SEQ 64
#define VOCAB 300

static char *labels[] = {"a", "b", "c"};

static void manifest_text(const uint8_t *data, size_t size) {
    tg_shard_manifest m, again;
    tg_err err;
    if (tg_shard_manifest_parse((const char *)data, size, "fuzz.json", &m, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return;
    }
    char *a, *b;
    size_t na, nb;
    FUZZ_ASSERT(tg_shard_manifest_format(&m, &a, &na, &err) == 0, "format: %s", err.msg);
    FUZZ_ASSERT(tg_shard_manifest_parse(a, na, "formatted", &again, &err) == 0, "parse of the formatted: %s", err.msg);
    FUZZ_ASSERT(tg_shard_manifest_format(&again, &b, &nb, &err) == 0, "second format: %s", err.msg);
    FUZZ_ASSERT(na == nb && !memcmp(a, b, na), "formatting is not stable");
    free(a);
    free(b);
    tg_shard_manifest_free(&again);
    tg_shard_manifest_free(&m);
}

static tg_shard_manifest fixed_manifest(int task) {
    static int64_t hist[2][SEQ / 8];
    tg_shard_manifest m = {.version = TG_SHARD_VERSION, .task = task, .seq = SEQ, .vocab_size = VOCAB,
                           .token_types = 1, .n_labels = task == TG_SHARD_CLASSIFY ? 3 : 0, .labels = labels,
                           .hist_bin = 8, .n_bins = SEQ / 8};
    m.hist[0] = hist[0];
    m.hist[1] = hist[1];
    return m;
}

static void check_record(const tg_shard_record *r, int task) {
    FUZZ_ASSERT(r->len >= 1 && r->len <= SEQ, "length %d", r->len);
    for (int32_t t = 0; t < r->len; t++) {
        FUZZ_ASSERT(r->input_ids[t] >= 0 && r->input_ids[t] < VOCAB, "id %d", r->input_ids[t]);
        if (r->token_type_ids) FUZZ_ASSERT(r->token_type_ids[t] >= 0 && r->token_type_ids[t] < 256, "type");
    }
    if (task == TG_SHARD_CLASSIFY) FUZZ_ASSERT(r->label >= 0 && r->label < 3, "label %d", r->label);
    if (task == TG_SHARD_QA) FUZZ_ASSERT(r->start >= 0 && r->start <= r->end && r->end < r->len, "answer");
    if (task == TG_SHARD_INSTRUCT) FUZZ_ASSERT(r->prompt_len >= 1 && r->prompt_len < r->len, "prompt %d", r->prompt_len);
}

static void block(const uint8_t *data, size_t size) {
    if (size < 5) return;
    const int task = TG_SHARD_CLASSIFY + data[0] % 4;
    const uint8_t *b = data + 1;
    const size_t len = size - 1;
    tg_err err;
    const int64_t count = tg_get_le32(b);
    if (tg_shard_block_check(b, len, count, "block", &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return;
    }
    const tg_shard_manifest m = fixed_manifest(task);
    int32_t ids[SEQ], types[SEQ];
    for (int64_t i = 0; i < count; i++) {
        tg_shard_record r;
        if (tg_shard_block_record(b, len, i, &m, ids, types, &r, "record", &err) != 0)
            FUZZ_ASSERT(err.msg[0], "failed without a message");
        else
            check_record(&r, task);
    }
}

/* A folder of the process's own for mode 2, removed at exit. */
static char set_dir[256];
static void remove_set_dir(void) { tg_shard_remove_tree(set_dir); }

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static void whole_shard(const uint8_t *data, size_t size) {
    if (!set_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(set_dir, sizeof set_dir, "%s/tunegraph-fuzz-shards-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!mkdtemp(set_dir)) abort();
        atexit(remove_set_dir);
        char train[300];
        snprintf(train, sizeof train, "%s/train", set_dir);
        if (mkdir(train, 0755)) abort();
    }
    /* The header names the kind of records; the footer their count. */
    int task = size >= 16 ? (int)tg_get_le32(data + 12) : TG_SHARD_LM;
    if (task < TG_SHARD_CLASSIFY || task > TG_SHARD_INSTRUCT) task = TG_SHARD_LM;
    int64_t records = size >= 32 ? (int64_t)(tg_get_le64(data + size - 16) & 0xffffff) : 1;
    if (records < 1) records = 1;
    char path[400];
    snprintf(path, sizeof path, "%s/train/00000.tgshard", set_dir);
    if (write_bytes(path, data, size)) abort();
    tg_shard_manifest m = fixed_manifest(task);
    int64_t hist[2][SEQ / 8] = {{0}};
    hist[0][0] = records;
    m.hist[0] = hist[0];
    m.hist[1] = hist[1];
    m.records[0] = m.tokens[0] = records;
    tg_shard_entry e = {.file = "train/00000.tgshard", .split = TG_SPLIT_TRAIN, .records = records,
                        .bytes = (int64_t)size, .xxh64 = XXH64(data, size, 0)};
    m.n_shards = 1;
    m.shards = &e;
    m.command = "fuzz";
    snprintf(m.tokenizer_family, sizeof m.tokenizer_family, "wordpiece");
    char *text;
    size_t n;
    tg_err err;
    FUZZ_ASSERT(tg_shard_manifest_format(&m, &text, &n, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/manifest.json", set_dir);
    if (write_bytes(path, text, n)) abort();
    free(text);

    const tg_data_rules rules = {task == TG_SHARD_CLASSIFY ? TG_TASK_CLASSIFY : TG_TASK_LM, 3, VOCAB, 256, 0, 0};
    tg_dataset ds;
    if (tg_dataset_load(set_dir, &rules, &ds, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return;
    }
    FUZZ_ASSERT(ds.n == records, "%d examples, %lld records", ds.n, (long long)records);
    for (int32_t i = 0; i < ds.n; i++) {
        const tg_example *x = &ds.examples[i];
        tg_shard_record r = {.len = x->len, .input_ids = x->input_ids, .token_type_ids = x->token_type_ids,
                             .label = task == TG_SHARD_CLASSIFY ? x->label : 0, .prompt_len = x->prompt_len};
        check_record(&r, task == TG_SHARD_CLASSIFY || task == TG_SHARD_INSTRUCT ? task : TG_SHARD_LM);
        FUZZ_ASSERT(task == TG_SHARD_INSTRUCT || x->prompt_len == 0, "a prompt of %d in a %s set", x->prompt_len,
                    tg_shard_task_name(task));
    }
    /* Backwards through the cursor: every frame loaded again, from the last. */
    tg_shard_set set;
    FUZZ_ASSERT(tg_shard_set_open(set_dir, TG_SPLIT_TRAIN, &set, &err) == 0, "reopen: %s", err.msg);
    tg_shard_cursor cur;
    FUZZ_ASSERT(tg_shard_cursor_open(&cur, &set, &err) == 0, "%s", err.msg);
    for (int64_t i = set.n_records - 1; i >= 0; i--) {
        tg_shard_record r;
        FUZZ_ASSERT(tg_shard_cursor_get(&cur, i, &r, &err) == 0, "record %lld read once but not again: %s",
                    (long long)i, err.msg);
        FUZZ_ASSERT(r.len == ds.examples[i].len && !memcmp(r.input_ids, ds.examples[i].input_ids,
                                                           (size_t)r.len * sizeof *r.input_ids),
                    "record %lld differs on a second read", (long long)i);
    }
    tg_shard_cursor_close(&cur);
    tg_shard_set_close(&set);
    tg_dataset_free(&ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: manifest_text(data + 1, size - 1); break;
    case 1: block(data + 1, size - 1); break;
    default: whole_shard(data + 1, size - 1); break;
    }
    return 0;
}
