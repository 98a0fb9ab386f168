/* Allocation fault injection (base/alloc.h): for a compile, a plan load, a trainer's open
 * and first CPU step, and each parser on a small valid input, the allocations of a
 * successful run are counted, then each one is failed in turn. Every failure must end in an
 * error (never success with garbage) whose message says it ran out of memory and names
 * what it was doing; nothing may crash, and under make test-asan (LeakSanitizer) nothing may
 * leak. jansson's allocations are counted (json_set_alloc_funcs), and so are zstd's and
 * PCRE2's (base/zstd_alloc.h, a PCRE2 general context): JSON parsing, (de)compression and
 * the BPE pattern fail too. utf8proc's functions used here do not allocate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "datasets/csv.h"
#include "datasets/dataset.h"
#include "datasets/shard_dataset.h"
#include "datasets/shard_writer.h"
#include "datasets/squad.h"
#include "datasets/squad_eval.h"
#include "datasets/tokenizer.h"
#include "models/hf_checkpoint.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "plan/plan_file.h"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"
#include "datasets/tokenizer_impl.h"
#include "tests/harness.h"
#include "tests/text_fixtures.h"

/* One attempt: does the work, releases what it made when it succeeds, returns 0 or -1. */
typedef int (*attempt_fn)(void *ctx, tg_err *err);

/* Whether a failed attempt's message is a clean out-of-memory error: it says so ("out of
 * memory", or the executor's pools' "cannot allocate N bytes for the X pool") and names more
 * than that (what was being allocated, or the file or object it was reading). */
static int names_out_of_memory(const char *msg) {
    return (strstr(msg, "out of memory") && strlen(msg) > strlen("out of memory") + 4) ||
           strstr(msg, "cannot allocate");
}

/* Counts the allocations of a successful attempt, then fails allocation k for every k below
 * `exhaustive` (all of them when it is negative) and from *tail_from on (when tail_from is
 * not NULL: the attempt sets it while counting), and for `sample` more picked with a fixed
 * seed among the rest. Returns the count. */
static long fail_ranges(const char *what, attempt_fn fn, void *ctx, long exhaustive, const long *tail_from,
                        int sample) {
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    if (!CHECK(fn(ctx, &err) == 0, "%s: %s", what, err.msg)) return 0;
    const long total = tg_alloc_fail_after(-1);
    /* The count must be the same every time, or failing allocation k tests something else. */
    if (!CHECK(fn(ctx, &err) == 0, "%s: %s", what, err.msg)) return 0;
    const long again = tg_alloc_fail_after(-1);
    if (!CHECK(total == again && total > 0, "%s: %ld allocations, then %ld", what, total, again)) return total;
    const long upto = exhaustive < 0 || exhaustive > total ? total : exhaustive;
    const long tail = tail_from && *tail_from > upto && *tail_from <= total ? *tail_from : total;
    uint64_t rng = 0x5eed2025ull;
    int bad = 0;
    const long tries = upto + (total - tail) + (tail > upto ? sample : 0);
    for (long i = 0; i < tries && bad < 5; i++) {
        const long k = i < upto                  ? i
                       : i < upto + total - tail ? tail + (i - upto)
                                                 : upto + (long)(tg_test_rand(&rng) % (uint32_t)(tail - upto));
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = fn(ctx, &err);
        tg_alloc_fail_after(-1);
        const int clean = rc == -1 && names_out_of_memory(err.msg);
        bad += !clean;
        CHECK(clean, "%s: allocation %ld of %ld failing: rc %d, '%s'", what, k, total, rc, rc ? err.msg : "");
    }
    printf("  %s: %ld allocations, %ld failed in turn\n", what, total, tries);
    return total;
}

static long fail_each(const char *what, attempt_fn fn, void *ctx, long exhaustive, int sample) {
    return fail_ranges(what, fn, ctx, exhaustive, NULL, sample);
}

/* The fixtures' folder (tg_test_tmpdir makes a new one each call). */
static const char *fixture_dir(void) {
    static char dir[600];
    if (!dir[0]) snprintf(dir, sizeof dir, "%s", tg_test_tmpdir());
    return dir;
}

static const char *fixture(const char *name, const char *text) {
    static char path[8][700];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 700, "%s/%s", fixture_dir(), name);
    if (tg_test_write_file(p, text)) abort();
    return p;
}

/* ---- parsers ------------------------------------------------------------------------- */

static const char k_job[] = "model = tiny-bert\ntask = classify\nnum_labels = 2\nbatch = 4\nseq = 16\n"
                            "freeze = bert.embeddings.*\nseq_buckets = 8, 16\nsteps = 3\nlr = 1e-3\n"
                            "train_data = train.jsonl\neval_data = eval.jsonl\n";

static int parse_job(void *ctx, tg_err *err) {
    tg_job job;
    const char *sets[] = {"warmup_steps=1", "log_every=2"};
    return tg_job_parse_text(k_job, "job.txt", "", sets, 2, &job, err);
}

static int parse_model_config(void *path, tg_err *err) {
    tg_model_config cfg;
    return tg_model_config_parse(path, &cfg, err);
}

static int open_checkpoint_file(void *path, tg_err *err) {
    tg_hf_checkpoint ck;
    if (tg_hf_checkpoint_open(path, &ck, err)) return -1;
    tg_hf_checkpoint_close(&ck);
    return 0;
}

static const tg_data_rules k_rules = {TG_TASK_CLASSIFY, 3, 300, 2, 0, 0};

static int load_dataset(void *path, tg_err *err) {
    tg_dataset ds;
    if (tg_dataset_load(path, &k_rules, &ds, err)) return -1;
    tg_dataset_free(&ds);
    return 0;
}

static int load_shards(void *path, tg_err *err) {
    tg_dataset ds;
    if (tg_shard_dataset_load(path, &k_rules, 0x1234, &ds, err)) return -1;
    tg_dataset_free(&ds);
    return 0;
}

/* An image set of 2 x 3 x 3 pixels and 3 labels, held as bytes. */
static int load_image_shards(void *path, tg_err *err) {
    const tg_data_rules rules = {.task = TG_TASK_CLASSIFY, .num_labels = 3, .image_channels = 2, .image_size = 3};
    tg_dataset ds;
    if (tg_shard_dataset_load(path, &rules, 0, &ds, err)) return -1;
    tg_dataset_free(&ds);
    return 0;
}

static const char k_csv[] = "text,label\n\"a, quoted \"\"cell\"\"\",1\nplain,0\n\"multi\nline\",2\n";

static int read_csv(void *ctx, tg_err *err) {
    tg_csv c;
    tg_csv_init(&c, "t.csv", k_csv, strlen(k_csv), ',');
    int rc, rows = 0;
    while ((rc = tg_csv_next(&c, err)) == 1) rows++;
    tg_csv_free(&c);
    return rc == 0 && rows == 4 ? 0 : -1;
}

static const char k_squad_eval[] =
    "{\"context\": \"cat dog bird\", \"offsets\": [0, 3, 4, 7, 8, 12]}\n"
    "{\"question\": \"q1\", \"context\": 0, \"answers\": [\"cat\", \"dog\"]}\n"
    "{\"window\": 0, \"at\": 4, \"first\": 0, \"count\": 3}\n"
    "{\"question\": \"q2\", \"context\": 0, \"answers\": []}\n"
    "{\"window\": 1, \"at\": 5, \"first\": 1, \"count\": 2}\n"
    "{\"end\": {\"contexts\": 1, \"questions\": 2, \"windows\": 2}}\n";

static int parse_squad_eval(void *ctx, tg_err *err) {
    tg_squad_eval ev;
    if (tg_squad_eval_parse("squad_eval.jsonl", k_squad_eval, strlen(k_squad_eval), &ev, err)) return -1;
    tg_squad_eval_free(&ev);
    return 0;
}

static int parse_squad(void *ctx, tg_err *err) {
    tg_squad sq;
    if (tg_squad_parse("s.json", tg_test_squad_v2, strlen(tg_test_squad_v2), &sq, err)) return -1;
    tg_squad_free(&sq);
    return 0;
}

/* Opens a tokenizer and encodes a pair with it (the encoder's buffers grow on first use). */
static int open_tokenizer(void *path, tg_err *err) {
    tg_tokenizer *tok = NULL;
    if (tg_tokenizer_open(path, &tok, err)) return -1;
    tg_encoding enc = {0};
    static const char a[] = "Hello, unaffable world! caf\xc3\xa9 hello", b[] = "world hello";
    const tg_encode_options o = {.add_special_tokens = 1, .max_len = 12};
    int rc = tg_tokenizer_encode(tok, a, strlen(a), b, strlen(b), &o, &enc, err);
    tg_encoding_free(&enc);
    tg_tokenizer_free(tok);
    return rc;
}

/* Encoded bytes (a checkpoint, a plan). */
typedef struct blob {
    uint8_t *bytes;
    size_t len;
} blob;

static int decode_checkpoint(void *ctx, tg_err *err) {
    const blob *b = ctx;
    tg_checkpoint ck;
    if (tg_checkpoint_decode(b->bytes, b->len, "ck.tgck", &ck, err)) return -1;
    tg_checkpoint_free(&ck);
    return 0;
}

TG_TEST(test_alloc_faults_parsers) {
    long n;
    n = fail_each("job file", parse_job, NULL, -1, 0);
    CHECK(n > 0, "job: %ld", n);

    const char *config = fixture("config.json", "{\"model_type\": \"bert\", \"vocab_size\": 300, \"hidden_size\": 32, "
                                                "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
                                                "\"intermediate_size\": 64, \"max_position_embeddings\": 64, "
                                                "\"type_vocab_size\": 2, \"pad_token_id\": 0, \"layer_norm_eps\": 1e-12, "
                                                "\"id2label\": {\"0\": \"neg\", \"1\": \"pos\"}}");
    fail_each("model config", parse_model_config, (void *)config, -1, 0);

    /* A safetensors file, and a two-shard Hugging Face index over two more. */
    tg_err err = {{0}};
    const int64_t shape[2] = {2, 3};
    const float v[6] = {1, 2, 3, 4, 5, 6};
    const tg_st_item items[2] = {{"a.weight", TG_ST_F32, 2, shape, v}, {"a.bias", TG_ST_F32, 1, shape + 1, v}};
    char st[700], s1[700], s2[700];
    snprintf(st, sizeof st, "%s/model.safetensors", fixture_dir());
    snprintf(s1, sizeof s1, "%s/model-00001-of-00002.safetensors", fixture_dir());
    snprintf(s2, sizeof s2, "%s/model-00002-of-00002.safetensors", fixture_dir());
    static const char *const meta[2] = {"format", "pt"};
    REQUIRE(tg_st_write_with_metadata(st, items, 2, meta, 1, &err) == 0, "%s", err.msg);
    REQUIRE(tg_st_write(s1, items, 1, &err) == 0 && tg_st_write(s2, items + 1, 1, &err) == 0, "%s", err.msg);
    fail_each("safetensors", open_checkpoint_file, st, -1, 0);
    const char *index = fixture("model.safetensors.index.json",
                                "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {\"a.weight\": "
                                "\"model-00001-of-00002.safetensors\", \"a.bias\": \"model-00002-of-00002.safetensors\"}}");
    fail_each("HF index", open_checkpoint_file, (void *)index, -1, 0);

    const char *jsonl = fixture("train.jsonl", "{\"input_ids\": [2, 7, 9, 3], \"label\": 1}\n"
                                               "{\"input_ids\": [2, 8, 3], \"token_type_ids\": [0, 0, 0], \"label\": 2}\n"
                                               "{\"input_ids\": [2, 5, 6, 7, 8, 3], \"label\": 0}\n");
    fail_each("JSONL dataset", load_dataset, (void *)jsonl, -1, 0);

    /* A shard set of two splits and a few frames. */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/shards", fixture_dir());
    char *const labels[3] = {"a", "b", "c"};
    tg_shard_set_desc d = {.task = TG_SHARD_CLASSIFY, .seq = 16, .n_labels = 3, .labels = labels,
                           .tokenizer_identity = 0x1234, .tokenizer_family = "wordpiece", .vocab_size = 300,
                           .command = "test", .frame_bytes = 256, .shard_bytes = 1024};
    tg_shard_writer *w;
    REQUIRE(tg_shard_writer_open(dir, &d, &w, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 40; i++) {
        int32_t ids[16];
        const int32_t len = 1 + i % 16;
        for (int t = 0; t < len; t++) ids[t] = (i * 31 + t * 17) % 300;
        tg_shard_record r = {.len = len, .input_ids = ids, .label = i % 3};
        REQUIRE(tg_shard_writer_add(w, i < 30 ? TG_SPLIT_TRAIN : TG_SPLIT_EVAL, &r, &err) == 0, "%s", err.msg);
    }
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    fail_each("shard set", load_shards, dir, -1, 0);
    char img_dir[700];
    snprintf(img_dir, sizeof img_dir, "%s/image-shards", fixture_dir());
    tg_shard_set_desc di = {.task = TG_SHARD_IMAGE, .seq = 18, .n_labels = 3, .labels = labels, .vocab_size = 256,
                            .command = "test", .image_channels = 2, .image_height = 3, .image_width = 3};
    REQUIRE(tg_shard_writer_open(img_dir, &di, &w, &err) == 0, "%s", err.msg);
    for (int i = 0; i < 5; i++) {
        int32_t px[18];
        for (int t = 0; t < 18; t++) px[t] = (i * 37 + t * 11) % 256;
        tg_shard_record r = {.len = 18, .input_ids = px, .label = i % 3};
        REQUIRE(tg_shard_writer_add(w, TG_SPLIT_TRAIN, &r, &err) == 0, "%s", err.msg);
    }
    REQUIRE(tg_shard_writer_commit(w, &err) == 0, "%s", err.msg);
    fail_each("image shard set", load_image_shards, img_dir, -1, 0);

    fail_each("CSV", read_csv, NULL, -1, 0);
    fail_each("SQuAD", parse_squad, NULL, -1, 0);
    fail_each("SQuAD eval file", parse_squad_eval, NULL, -1, 0);

    /* Tokenizers: a WordPiece vocab.txt, a byte-level BPE vocab.json + merges.txt folder. */
    const char *vocab = fixture("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n,\n!\nun\n##aff\n"
                                             "##able\na\n##a\ncafe\n");
    fail_each("WordPiece vocab.txt", open_tokenizer, (void *)vocab, -1, 0);
    char bpe[700];
    snprintf(bpe, sizeof bpe, "%s/bpe", fixture_dir());
    REQUIRE(mkdir(bpe, 0755) == 0, "mkdir %s", bpe);
    char *vj = tg_test_bpe_vocab_json("");
    char vp[800], mp[800];
    snprintf(vp, sizeof vp, "%s/vocab.json", bpe);
    snprintf(mp, sizeof mp, "%s/merges.txt", bpe);
    REQUIRE(tg_test_write_file(vp, vj) == 0 &&
                tg_test_write_file(mp, tg_test_bpe_merges) == 0,
            "bpe fixture");
    free(vj);
    fail_each("BPE vocab.json + merges.txt", open_tokenizer, bpe, -1, 0);

    /* A checkpoint, decoded from bytes. */
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    ck.state.step = 3, ck.state.total_steps = 10, ck.state.replicas = 1;
    float *data = malloc(sizeof v);
    REQUIRE(data, "out of memory");
    memcpy(data, v, sizeof v);
    REQUIRE(tg_checkpoint_add_field(&ck, "step", "3", &err) == 0 &&
                tg_checkpoint_add_tensor(&ck, "a.weight", -1, TG_F32, 2, shape, data, &err) == 0,
            "%s", err.msg);
    blob b;
    REQUIRE(tg_checkpoint_encode(&ck, &b.bytes, &b.len, &err) == 0, "%s", err.msg);
    tg_checkpoint_free(&ck);
    fail_each("checkpoint", decode_checkpoint, &b, -1, 0);
    free(b.bytes);
}

/* ---- compile and plan load ----------------------------------------------------------- */

static const char k_bert_job[] = "model = tiny-bert\ntask = classify\nnum_labels = 2\nbatch = 4\nseq = 16\nsteps = 2\n"
                                 "lr = 1e-3\nseed = 7\ntrain_data = train.jsonl\n";

/* Parses and compiles the tiny BERT job: job file, the preset's config.json, the compiler. */
static int compile_job(void *ctx, tg_err *err) {
    tg_job job;
    tg_plan plan;
    if (tg_job_parse_text(ctx, "job.txt", "", NULL, 0, &job, err) || tg_compile(&job, &plan, err)) return -1;
    tg_plan_free(&plan);
    return 0;
}

static int decode_plan(void *ctx, tg_err *err) {
    const blob *b = ctx;
    tg_plan plan;
    if (tg_plan_decode(b->bytes, b->len, "plan.tgplan", &plan, err)) return -1;
    tg_plan_free(&plan);
    return 0;
}

TG_TEST(test_alloc_faults_compile_and_plan_load) {
    fail_each("compile tiny-bert", compile_job, (void *)k_bert_job, -1, 0);
    /* With length buckets and a frozen embedding the plan carries more tables. */
    static const char bucketed[] = "model = tiny-bert\ntask = classify\nnum_labels = 2\nbatch = 4\nseq = 16\n"
                                   "seq_buckets = 8, 16\nfreeze = bert.embeddings.*\nsteps = 2\ntrain_data = train.jsonl\n";
    tg_err err = {{0}};
    const char *const jobs[2] = {k_bert_job, bucketed};
    for (int j = 0; j < 2; j++) {
        tg_job job;
        tg_plan plan;
        REQUIRE(tg_job_parse_text(jobs[j], "job.txt", "", NULL, 0, &job, &err) == 0 && tg_compile(&job, &plan, &err) == 0,
                "%s", err.msg);
        blob b;
        const int rc = tg_plan_encode(&plan, &b.bytes, &b.len, &err);
        tg_plan_free(&plan);
        REQUIRE(rc == 0, "%s", err.msg);
        fail_each(j ? "plan load (buckets, frozen)" : "plan load", decode_plan, &b, -1, 0);
        free(b.bytes);
    }
}

/* ---- a trainer's open and first CPU step ----------------------------------------------- */

typedef struct step_ctx {
    tg_plan plan;
    long opened; /* allocations made by the time the trainer was open */
} step_ctx;

/* Opens a trainer on the CPU with the example data sets, takes one step, closes it. The
 * batches are filled on the calling thread and one CPU thread runs the ops, so the
 * allocations are counted (per thread) the same every time. */
static int open_and_step(void *ctx, tg_err *err) {
    step_ctx *s = ctx;
    tg_trainer tr;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 1, .load_data = 1, .no_loader_thread = 1};
    if (tg_trainer_open(&tr, &s->plan, &o, err)) return -1;
    s->opened = tg_alloc_made();
    tg_step_stats st;
    const int rc = tg_trainer_step(&tr, &st, err);
    tg_trainer_close(&tr);
    return rc;
}

TG_TEST(test_alloc_faults_trainer_step) {
    step_ctx s;
    tg_err err = {{0}};
    tg_job job;
    static const char text[] = "model = tiny-bert\ntask = classify\nnum_labels = 2\nbatch = 4\nseq = 48\nsteps = 2\n"
                               "lr = 1e-3\nseed = 7\ntrain_data = data/sentiment-train.jsonl\n"
                               "eval_data = data/sentiment-eval.jsonl\n";
    REQUIRE(tg_job_parse_text(text, "job.txt", "examples", NULL, 0, &job, &err) == 0 &&
                tg_compile(&job, &s.plan, &err) == 0,
            "%s", err.msg);
    /* Loading the two example sets makes about a hundred thousand allocations (jansson's,
     * for each row's JSON), each of a kind the JSONL parser's own test fails exhaustively:
     * the first 400 allocations (the executor, pools, weights and the first rows) and every
     * one from the end of the open on (the step, its batch, the close) are failed in turn,
     * and a seeded sample of 200 of the rest. */
    s.opened = -1;
    fail_ranges("trainer open + one CPU step", open_and_step, &s, 400, &s.opened, 200);
    tg_plan_free(&s.plan);
}
