/* Length buckets and last_batch: the job keys, the compiled bucket plans (one plan per
 * length, the same tensors and ops, one set of pools), their plan file encoding and its
 * refusals, inspect, `--set` on a plan, and each bucket plan run on its own. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "plan/inspect.h"
#include "plan/plan_file.h"
#include "plan/validate.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

#define BASE "model = tiny-bert\ntrain_data = t.jsonl\nsteps = 10\n"

/* One job file path for the whole file (tg_test_tmpdir gives a new folder each call),
 * so that jobs compiled twice have the same path in their fingerprint. */
static const char *write_job(const char *text) {
    static char path[1024];
    if (!path[0]) snprintf(path, sizeof path, "%s/job.txt", tg_test_tmpdir());
    return tg_test_write_file(path, text) == 0 ? path : NULL;
}

/* Loads `text` (with overrides) and expects a failure whose message holds `want` (and
 * `want2` unless NULL). */
static void expect_error2(const char *text, const char *set, const char *want, const char *want2) {
    const char *path = write_job(text);
    REQUIRE(path, "write job");
    tg_job job;
    tg_err err = {{0}};
    const char *ov[] = {set};
    CHECK(tg_job_load(path, ov, set ? 1 : 0, &job, &err) == -1, "accepted:\n%s(--set %s)", text, set ? set : "-");
    CHECK(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
    if (want2) CHECK(strstr(err.msg, want2) != NULL, "'%s' lacks '%s'", err.msg, want2);
}
static void expect_error(const char *text, const char *set, const char *want) { expect_error2(text, set, want, NULL); }

static int has(const char *msg, const char *needle) { return strstr(msg, needle) != NULL; }

/* ---- job keys ----------------------------------------------------------------------- */

TG_TEST(test_buckets_job_defaults) {
    const char *path = write_job(BASE "seq = 24\n");
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "%s", err.msg);
    CHECK(j.n_buckets == 1 && j.bucket_seq[0] == 24 && j.bucket_seq[1] == 0, "no buckets: one, seq (%d: %d)",
          j.n_buckets, j.bucket_seq[0]);
    CHECK(j.last_batch == TG_LAST_BATCH_PAD && j.key_line[TG_JOB_LAST_BATCH] == 0, "last_batch defaults to pad");
    tg_plan_run run;
    tg_job_run_settings(&j, &run);
    CHECK(run.last_batch == TG_LAST_BATCH_PAD, "run last_batch");
}

TG_TEST(test_buckets_job_keys) {
    const char *path = write_job(BASE "seq_buckets = 8, 16 ,32\nlast_batch = drop\n");
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "%s", err.msg);
    CHECK(j.n_buckets == 3 && j.bucket_seq[0] == 8 && j.bucket_seq[1] == 16 && j.bucket_seq[2] == 32 &&
              j.bucket_seq[3] == 0,
          "seq_buckets parsed as %d lengths", j.n_buckets);
    CHECK(j.seq == 32, "seq is the last bucket without key seq (got %d)", j.seq);
    CHECK(j.last_batch == TG_LAST_BATCH_DROP, "last_batch drop");
    /* seq given and equal to the last bucket; wrap without buckets. */
    path = write_job(BASE "seq = 32\nseq_buckets = 16,32\n");
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "%s", err.msg);
    CHECK(j.seq == 32 && j.n_buckets == 2, "seq = the last bucket");
    path = write_job(BASE "last_batch = wrap\n");
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "%s", err.msg);
    CHECK(j.last_batch == TG_LAST_BATCH_WRAP && j.n_buckets == 1, "wrap without buckets");
    /* --set seq_buckets over a file seq-less job follows into seq. */
    path = write_job(BASE);
    const char *ov[] = {"seq_buckets=4,12"};
    REQUIRE(tg_job_load(path, ov, 1, &j, &err) == 0, "%s", err.msg);
    CHECK(j.seq == 12 && j.n_buckets == 2 && j.key_line[TG_JOB_SEQ_BUCKETS] == -1, "--set seq_buckets");
}

TG_TEST(test_buckets_job_errors) {
    expect_error(BASE "seq_buckets = 16,8\n", NULL,
                 "job.txt:4: key 'seq_buckets': 8 follows 16; the lengths must be strictly ascending");
    expect_error(BASE "seq_buckets = 16,16\n", NULL, "job.txt:4: key 'seq_buckets': 16 follows 16");
    expect_error(BASE "seq_buckets = 32\n", NULL, "job.txt:4: key 'seq_buckets': '32' names one length; give 2 to 8");
    expect_error(BASE "seq_buckets = 1,2,3,4,5,6,7,8,9\n", NULL, "job.txt:4: key 'seq_buckets': more than 8 buckets");
    expect_error(BASE "seq_buckets = 0,8\n", NULL, "job.txt:4: key 'seq_buckets': '0' is not a positive integer length");
    expect_error(BASE "seq_buckets = 8,x\n", NULL, "job.txt:4: key 'seq_buckets': 'x' is not a positive integer length");
    expect_error(BASE "seq_buckets = 8,,16\n", NULL, "job.txt:4: key 'seq_buckets': empty length in '8,,16'");
    expect_error(BASE "seq_buckets = 8,16,\n", NULL, "job.txt:4: key 'seq_buckets': empty length");
    expect_error(BASE "seq_buckets = 8,99999999999\n", NULL, "'99999999999' is not a positive integer length");
    expect_error2(BASE "seq = 24\nseq_buckets = 8,16\n", NULL,
                  "job.txt:4: key 'seq': 24 differs from the last of seq_buckets (16, ", "job.txt:5); the plan's seq");
    expect_error(BASE "seq_buckets = 8,16\n", "seq=8", "--set: key 'seq': 8 differs from the last of seq_buckets");
    expect_error2(BASE "last_batch = wrap\nseq_buckets = 8,16\n", NULL,
                  "job.txt:4: key 'last_batch': wrap is not allowed with seq_buckets (", "job.txt:5)");
    expect_error(BASE "last_batch = cycle\n", NULL, "job.txt:4: key 'last_batch': 'cycle' is not one of pad, drop, wrap");
    /* Each bucket must fit the model's positions (tiny-bert: 64). */
    const char *path = write_job(BASE "seq_buckets = 16,80\n");
    tg_job j;
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "%s", err.msg);
    CHECK(tg_compile(&j, &p, &err) == -1 &&
              has(err.msg, "job.txt:4: key 'seq_buckets': bucket length 80 exceeds what model 'tiny-bert' can hold"),
          "bucket past max positions: '%s'", err.msg);
}

TG_TEST(test_buckets_run_overrides) {
    tg_plan_run run;
    memset(&run, 0, sizeof run);
    run.steps = 3, run.log_every = 1;
    tg_err err = {{0}};
    const char *drop[] = {"last_batch=drop"};
    REQUIRE(tg_job_apply_run_overrides(&run, 2, drop, 1, "b.tgp", &err) == 0, "%s", err.msg);
    CHECK(run.last_batch == TG_LAST_BATCH_DROP, "--set last_batch=drop");
    const char *wrap[] = {"last_batch=wrap"};
    CHECK(tg_job_apply_run_overrides(&run, 2, wrap, 1, "b.tgp", &err) == -1 &&
              has(err.msg, "--set last_batch=wrap: b.tgp has 2 length buckets (seq_buckets), and wrap is not allowed"),
          "wrap on a bucket plan: '%s'", err.msg);
    CHECK(run.last_batch == TG_LAST_BATCH_DROP, "a refusal left the run settings changed");
    REQUIRE(tg_job_apply_run_overrides(&run, 1, wrap, 1, "p.tgp", &err) == 0, "%s", err.msg);
    CHECK(run.last_batch == TG_LAST_BATCH_WRAP, "--set last_batch=wrap without buckets");
    const char *buckets[] = {"seq_buckets=8,16"};
    CHECK(tg_job_apply_run_overrides(&run, 1, buckets, 1, "p.tgp", &err) == -1 &&
              has(err.msg, "--set seq_buckets=8,16: this key is compiled into p.tgp"),
          "seq_buckets on a plan: '%s'", err.msg);
}

/* ---- compiled bucket plans ----------------------------------------------------------- */

/* tiny-bert (or `preset`) at batch 2 with seq_buckets `buckets` (NULL: seq 32). */
static int compile_job(const char *preset, const char *task, const char *buckets, tg_plan *p, tg_err *err) {
    char text[512];
    /* Unshared gradients: a bucketed plan keeps them apart, and a one-bucket plan is
     * compared with it pool for pool. */
    snprintf(text, sizeof text,
             "model = %s\ntask = %s\nbatch = 2\n%s%s\n%ssteps = 2\ntrain_data = t.jsonl\nshare_grad_memory = false\n", preset,
             task, buckets ? "seq_buckets = " : "seq = 32", buckets ? buckets : "",
             strcmp(preset, "tiny-gpt2") == 0 && strcmp(task, "classify") == 0 ? "pad_token_id = 0\n" : "");
    const char *path = write_job(text);
    if (!path) return tg_fail(err, "cannot write the job");
    tg_job job;
    if (tg_job_load(path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, p, err);
}

static uint64_t pool_need(const tg_plan *p, int pool) {
    uint64_t need = 0;
    for (int t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].pool == pool && p->tensors[t].offset + p->tensors[t].bytes > need)
            need = p->tensors[t].offset + p->tensors[t].bytes;
    return need;
}

TG_TEST(test_buckets_compile_identity_and_pools) {
    const char *cases[][2] = {{"tiny-bert", "classify"}, {"tiny-gpt2", "lm"}, {"tiny-roberta", "classify"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_plan p;
        tg_err err = {{0}};
        REQUIRE(compile_job(cases[c][0], cases[c][1], "16,32", &p, &err) == 0, "%s: %s", cases[c][0], err.msg);
        const char *name = cases[c][0];
        CHECK(p.train.n_buckets == 2 && p.train.bucket_seq[0] == 16 && p.train.bucket_seq[1] == 32 &&
                  p.train.seq == 32 && p.buckets,
              "%s: train buckets", name);
        if (!p.buckets) {
            tg_plan_free(&p);
            continue;
        }
        const tg_plan *b = &p.buckets[0];
        CHECK(tg_plan_bucket(&p, 0) == b && tg_plan_bucket(&p, 1) == &p, "%s: tg_plan_bucket", name);
        CHECK(tg_plan_bucket_for(&p, 1) == 0 && tg_plan_bucket_for(&p, 16) == 0 && tg_plan_bucket_for(&p, 17) == 1 &&
                  tg_plan_bucket_for(&p, 500) == 1,
              "%s: tg_plan_bucket_for", name);
        CHECK(b->train.seq == 16 && b->train.n_buckets == 2 && b->train.batch == p.train.batch && !b->buckets &&
                  b->fingerprint == p.fingerprint && !strcmp(b->job_path, p.job_path) &&
                  b->run.steps == p.run.steps && !memcmp(&b->io, &p.io, sizeof p.io),
              "%s: the bucket plan's settings are the plan's but for seq", name);
        CHECK(tg_plan_validate_buckets(&p, name, &err) == 0, "%s: %s", name, err.msg);
        CHECK(tg_plan_validate_tables(b, name, &err) == 0 && tg_plan_validate_ops(b, name, &err) == 0, "%s: bucket: %s",
              name, err.msg);
        CHECK(tg_plan_validate_ops(&p, name, &err) == 0, "%s: plan: %s", name, err.msg);
        /* The shapes that follow seq differ; the rest is the plan's. */
        const tg_tensor *ids = &b->tensors[b->io.input_ids];
        CHECK(ids->shape[0] == 2 && ids->shape[1] == 16 && p.tensors[p.io.input_ids].shape[1] == 32,
              "%s: input_ids [2, 16] in the bucket", name);
        int outside = 0, same = 1;
        for (int t = 0; t < p.n_tensors; t++) {
            const tg_tensor *x = &b->tensors[t], *y = &p.tensors[t];
            if (y->pool == TG_POOL_ACTIVATIONS || y->pool == TG_POOL_INPUTS) continue;
            outside++;
            same &= x->offset == y->offset && x->bytes == y->bytes && !strcmp(x->name, y->name);
        }
        CHECK(same && outside > 20, "%s: %d tensors outside activations and inputs, same place: %d", name, outside, same);
        /* Every pool the largest need, in both; the small bucket needs less activation memory
         * and does less work. */
        for (int q = 0; q < TG_POOL_COUNT; q++) {
            const uint64_t want = pool_need(&p, q) > pool_need(b, q) ? pool_need(&p, q) : pool_need(b, q);
            CHECK(b->pool_bytes[q] == p.pool_bytes[q] && p.pool_bytes[q] >= want, "%s: pool %s: %llu and %llu", name,
                  tg_pool_name(q), (unsigned long long)b->pool_bytes[q], (unsigned long long)p.pool_bytes[q]);
        }
        uint64_t sum = 0;
        for (int q = 0; q < TG_POOL_COUNT; q++) sum += p.pool_bytes[q];
        CHECK(p.peak_bytes == sum && b->peak_bytes == sum, "%s: peak_bytes", name);
        CHECK(pool_need(b, TG_POOL_ACTIVATIONS) < pool_need(&p, TG_POOL_ACTIVATIONS) &&
                  b->flops_per_step < p.flops_per_step && b->activation_live_peak < p.activation_live_peak,
              "%s: the 16-token bucket needs less", name);

        /* A plan compiled at seq 32 without buckets: the same pools and ops as the largest bucket. */
        tg_plan direct;
        REQUIRE(compile_job(cases[c][0], cases[c][1], NULL, &direct, &err) == 0, "%s", err.msg);
        CHECK(direct.train.n_buckets == 1 && direct.train.bucket_seq[0] == 32 && !direct.buckets, "%s: no buckets",
              name);
        CHECK(direct.n_ops == p.n_ops && direct.pool_bytes[TG_POOL_ACTIVATIONS] == p.pool_bytes[TG_POOL_ACTIVATIONS],
              "%s: seq 32 compiled directly", name);
        CHECK(direct.fingerprint != p.fingerprint, "%s: the fingerprint ignores seq_buckets", name);
        tg_plan_free(&direct);
        tg_plan other;
        REQUIRE(compile_job(cases[c][0], cases[c][1], "8,32", &other, &err) == 0, "%s", err.msg);
        CHECK(other.fingerprint != p.fingerprint, "%s: the fingerprint ignores the bucket lengths", name);
        tg_plan_free(&other);
        tg_plan_free(&p);
    }
}

/* Compiling the same job twice gives the same bytes; the file round trip too, and the
 * decoded plan has its bucket plans back. */
TG_TEST(test_buckets_plan_file_round_trip) {
    tg_plan p, again, back;
    tg_err err = {{0}};
    REQUIRE(compile_job("tiny-bert", "classify", "8,16,32", &p, &err) == 0, "%s", err.msg);
    REQUIRE(compile_job("tiny-bert", "classify", "8,16,32", &again, &err) == 0, "%s", err.msg);
    uint8_t *a = NULL, *b = NULL, *c = NULL;
    size_t na = 0, nb = 0, nc = 0;
    REQUIRE(tg_plan_encode(&p, &a, &na, &err) == 0 && tg_plan_encode(&again, &b, &nb, &err) == 0, "%s", err.msg);
    CHECK(na == nb && !memcmp(a, b, na), "two compiles differ");
    char path[600];
    snprintf(path, sizeof path, "%s/b.tgp", tg_test_tmpdir());
    REQUIRE(tg_plan_write(&p, path, &err) == 0, "%s", err.msg);
    REQUIRE(tg_plan_read(path, &back, &err) == 0, "%s", err.msg);
    REQUIRE(tg_plan_encode(&back, &c, &nc, &err) == 0, "%s", err.msg);
    CHECK(nc == na && !memcmp(a, c, na), "the plan file does not round-trip byte for byte");
    CHECK(back.train.n_buckets == 3 && back.buckets && back.buckets[1].train.seq == 16 &&
              back.buckets[0].n_ops == p.buckets[0].n_ops &&
              back.buckets[1].flops_per_step == p.buckets[1].flops_per_step &&
              back.buckets[0].activation_live_peak == p.buckets[0].activation_live_peak &&
              !memcmp(back.buckets[0].tensors, p.buckets[0].tensors, sizeof(tg_tensor) * (size_t)p.n_tensors),
          "decoded bucket plans");
    /* --set on a plan: the run settings reach the bucket plans, the buckets stay. */
    const char *sets[] = {"last_batch=drop", "steps=5"};
    REQUIRE(tg_front_set_run(&back, sets, 2, path, &err) == 0, "%s", err.msg);
    CHECK(back.run.last_batch == TG_LAST_BATCH_DROP && back.buckets[0].run.last_batch == TG_LAST_BATCH_DROP &&
              back.buckets[1].run.steps == 5,
          "--set reaches the bucket plans");
    CHECK(tg_plan_validate_buckets(&back, path, &err) == 0, "after --set: %s", err.msg);
    const char *wrap[] = {"last_batch=wrap"};
    CHECK(tg_front_set_run(&back, wrap, 1, path, &err) == -1 && has(err.msg, "wrap is not allowed with buckets"),
          "--set last_batch=wrap: '%s'", err.msg);
    free(a), free(b), free(c);
    tg_plan_free(&p);
    tg_plan_free(&again);
    tg_plan_free(&back);
}

/* ---- refusals ------------------------------------------------------------------------ */

static int first_in_pool(const tg_plan *p, int pool) {
    for (int t = 0; t < p->n_tensors; t++)
        if (p->tensors[t].pool == pool && !(p->tensors[t].flags & TG_TENSOR_VIEW)) return t;
    return -1;
}

typedef void (*bucket_edit)(tg_plan *p, char *want, size_t len);

static void edit_state_offset(tg_plan *p, char *want, size_t len) {
    /* Two optimizer-state tensors swap places in the bucket plan: each alone is a sound
     * layout, but not the plan's. */
    tg_plan *b = &p->buckets[0];
    const int t = b->io.step, u = b->io.total_steps;
    const uint64_t o = b->tensors[t].offset;
    b->tensors[t].offset = b->tensors[u].offset, b->tensors[u].offset = o;
    snprintf(want, len, "plan.tgp: bucket 0 (seq 16): tensor %d (%s, optim pool) differs from the plan's tensor %d (%s) "
                        "in its offset",
             t < u ? t : u, b->tensors[t < u ? t : u].name, t < u ? t : u, b->tensors[t < u ? t : u].name);
}
static void edit_pool_size(tg_plan *p, char *want, size_t len) {
    p->buckets[0].pool_bytes[TG_POOL_ACTIVATIONS] -= 256;
    p->buckets[0].peak_bytes -= 256;
    snprintf(want, len, "plan.tgp: bucket 0 (seq 16): pool activations holds %llu bytes, the plan's %llu",
             (unsigned long long)p->buckets[0].pool_bytes[TG_POOL_ACTIVATIONS],
             (unsigned long long)p->pool_bytes[TG_POOL_ACTIVATIONS]);
}
static void edit_not_ascending(tg_plan *p, char *want, size_t len) {
    p->train.bucket_seq[0] = 40;
    snprintf(want, len, "plan.tgp: train bucket_seq[1] is 32; the 2 bucket lengths must be positive and strictly "
                        "ascending");
}
static void edit_last_not_seq(tg_plan *p, char *want, size_t len) {
    p->train.bucket_seq[0] = 32, p->train.bucket_seq[1] = 48;
    snprintf(want, len, "plan.tgp: train seq 32 is not the last bucket length (bucket_seq[1] = 48)");
}
static void edit_n_buckets(tg_plan *p, char *want, size_t len) {
    p->train.n_buckets = 0; /* the encoder then writes no bucket plans */
    snprintf(want, len, "plan.tgp: train n_buckets 0 is not in [1, 8]");
}
static void edit_wrap(tg_plan *p, char *want, size_t len) {
    p->run.last_batch = TG_LAST_BATCH_WRAP;
    snprintf(want, len, "plan.tgp: run last_batch is wrap, which is not allowed with length buckets");
}
static void edit_last_batch_range(tg_plan *p, char *want, size_t len) {
    p->run.last_batch = 3;
    snprintf(want, len, "plan.tgp: run last_batch 3 is not pad, drop or wrap");
}
static void edit_bucket_op(tg_plan *p, char *want, size_t len) {
    /* An op's parameter in the bucket plan that its tensors do not bear out. */
    tg_plan *b = &p->buckets[0];
    int o = 0;
    while (o < b->n_ops && b->ops[o].kind != TG_OP_MATMUL) o++;
    b->ops[o].p.matmul.m *= 2;
    snprintf(want, len, "plan.tgp: bucket 0 (seq 16): op %d (matmul):", o);
}
static void edit_bucket_tensor_name(tg_plan *p, char *want, size_t len) {
    tg_plan *b = &p->buckets[0];
    const int t = first_in_pool(b, TG_POOL_PARAMS);
    snprintf(b->tensors[t].name, sizeof b->tensors[t].name, "renamed");
    snprintf(want, len, "plan.tgp: bucket 0 (seq 16): tensor %d (renamed, params pool) differs from the plan's tensor "
                        "%d (%s) in its name",
             t, t, p->tensors[t].name);
}

TG_TEST(test_buckets_plan_file_refusals) {
    const struct {
        const char *what;
        bucket_edit edit;
    } cases[] = {
        {"state-pool offset", edit_state_offset},  {"pool size", edit_pool_size},
        {"bucket_seq order", edit_not_ascending},  {"last bucket != seq", edit_last_not_seq},
        {"n_buckets range", edit_n_buckets},       {"wrap with buckets", edit_wrap},
        {"last_batch range", edit_last_batch_range}, {"bucket op", edit_bucket_op},
        {"bucket tensor name", edit_bucket_tensor_name},
    };
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(compile_job("tiny-bert", "classify", "16,32", &p, &err) == 0, "%s", err.msg);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_plan e, back;
        uint8_t *bytes = NULL;
        size_t len = 0;
        REQUIRE(tg_plan_encode(&p, &bytes, &len, &err) == 0, "%s", err.msg);
        REQUIRE(tg_plan_decode(bytes, len, "copy", &e, &err) == 0, "%s", err.msg);
        free(bytes);
        char want[400];
        cases[c].edit(&e, want, sizeof want);
        memset(&err, 0, sizeof err);
        REQUIRE(tg_plan_encode(&e, &bytes, &len, &err) == 0, "%s: encode: %s", cases[c].what, err.msg);
        /* The edited count would leave the bucket plans unfreed: the plan's own for the free. */
        e.train.n_buckets = p.train.n_buckets;
        CHECK(tg_plan_decode(bytes, len, "plan.tgp", &back, &err) == -1, "%s: accepted, want '%s'", cases[c].what, want);
        CHECK(has(err.msg, want), "%s: '%s' lacks '%s'", cases[c].what, err.msg, want);
        CHECK(!back.buckets && !back.tensors, "%s: a refused decode left tables", cases[c].what);
        free(bytes);
        tg_plan_free(&e);
    }
    tg_plan_free(&p);
}

/* ---- inspect ------------------------------------------------------------------------- */

static char *inspect_to_string(const tg_plan *p, int json) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    tg_err err = {{0}};
    int rc = tg_plan_inspect(p, f, json, &err);
    fclose(f);
    if (rc) free(buf);
    return rc ? NULL : buf;
}

TG_TEST(test_buckets_inspect) {
    tg_plan p;
    tg_err err = {{0}};
    REQUIRE(compile_job("tiny-bert", "classify", "8,16,32", &p, &err) == 0, "%s", err.msg);
    char *text = inspect_to_string(&p, 0);
    REQUIRE(text, "inspect failed");
    if (getenv("TG_SHOW_INSPECT")) fputs(text, stderr);
    char line[256];
    snprintf(line, sizeof line,
             "buckets: 3 lengths, one set of pools: activations %llu bytes (%.2f MiB), sized by bucket 2 (seq 32), "
             "serve them all\n",
             (unsigned long long)p.pool_bytes[TG_POOL_ACTIVATIONS],
             (double)p.pool_bytes[TG_POOL_ACTIVATIONS] / (1024.0 * 1024.0));
    CHECK(has(text, line), "text lacks '%s'", line);
    for (int k = 0; k < 3; k++) {
        const tg_plan *b = tg_plan_bucket(&p, k);
        const uint64_t act = pool_need(b, TG_POOL_ACTIVATIONS);
        snprintf(line, sizeof line, "  bucket %d: seq %-6d activations %12llu bytes (%.2f MiB)  ops %d  %.3f GFLOP/step\n",
                 k, b->train.seq, (unsigned long long)act, (double)act / (1024.0 * 1024.0), b->n_ops,
                 b->flops_per_step / 1e9);
        CHECK(has(text, line), "text lacks '%s'", line);
    }
    CHECK(has(text, "run: steps 2  epochs 0  seed 42  last_batch: pad  skip_nonfinite: true (at most 10 in a row)\n"), "text lacks the run line");
    free(text);

    text = inspect_to_string(&p, 1);
    REQUIRE(text, "inspect --json failed");
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    free(text);
    REQUIRE(root, "JSON: %s", jerr.text);
    json_t *buckets = json_object_get(root, "buckets");
    CHECK(json_array_size(buckets) == 3, "3 buckets in the JSON");
    for (int k = 0; k < 3; k++) {
        const tg_plan *b = tg_plan_bucket(&p, k);
        json_t *jb = json_array_get(buckets, (size_t)k);
        CHECK(json_integer_value(json_object_get(jb, "seq")) == b->train.seq &&
                  json_integer_value(json_object_get(jb, "activation_bytes")) ==
                      (json_int_t)pool_need(b, TG_POOL_ACTIVATIONS) &&
                  json_integer_value(json_object_get(jb, "n_ops")) == b->n_ops &&
                  json_real_value(json_object_get(jb, "flops_per_step")) == b->flops_per_step,
              "JSON bucket %d", k);
    }
    CHECK(json_integer_value(json_object_get(root, "pools_sized_by_bucket")) == 2, "pools_sized_by_bucket");
    json_t *seqs = json_object_get(json_object_get(root, "train"), "bucket_seq");
    CHECK(json_array_size(seqs) == 3 && json_integer_value(json_array_get(seqs, 0)) == 8, "train bucket_seq");
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(root, "run"), "last_batch")), "pad"),
          "run last_batch");
    json_decref(root);
    tg_plan_free(&p);
}

/* ---- each bucket plan runs as a plan of its length --------------------------------- */

/* One CPU training step of `plan` from its seed's initial weights on the batch the test
 * rng fills: its loss and gradient norm. */
static int one_step(const tg_plan *plan, tg_step_stats *st) {
    tg_trainer tr;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .threads = 2, .load_data = 0};
    if (!CHECK(tg_trainer_open(&tr, plan, &o, &err) == 0, "%s", err.msg)) return -1;
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    tg_test_fill_random_inputs(&tr, plan, &rng);
    int rc = tg_trainer_run_step(&tr, st, &err);
    CHECK(rc == 0, "%s", err.msg);
    tg_trainer_close(&tr);
    return rc;
}

TG_TEST(test_buckets_bucket_plan_matches_direct_compile) {
    const char *cases[][2] = {{"tiny-bert", "classify"}, {"tiny-gpt2", "lm"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_plan p;
        tg_err err = {{0}};
        REQUIRE(compile_job(cases[c][0], cases[c][1], "8,16,32", &p, &err) == 0, "%s", err.msg);
        for (int k = 0; k + 1 < p.train.n_buckets; k++) {
            char seq[16];
            snprintf(seq, sizeof seq, "%d", p.train.bucket_seq[k]);
            char text[512];
            snprintf(text, sizeof text, "model = %s\ntask = %s\nbatch = 2\nseq = %s\nsteps = 2\ntrain_data = t.jsonl\n",
                     cases[c][0], cases[c][1], seq);
            tg_job job;
            tg_plan direct;
            const char *path = write_job(text);
            REQUIRE(path && tg_job_load(path, NULL, 0, &job, &err) == 0 && tg_compile(&job, &direct, &err) == 0, "%s",
                    err.msg);
            /* The bucket plan as a plan of its own: one length, no buckets. */
            tg_plan alone = p.buckets[k];
            alone.train.n_buckets = 1;
            alone.train.bucket_seq[0] = alone.train.seq;
            tg_step_stats a, b;
            if (one_step(&alone, &a) == 0 && one_step(&direct, &b) == 0) {
                CHECK(isfinite(a.loss) && !memcmp(&a.loss, &b.loss, sizeof a.loss) &&
                          !memcmp(&a.grad_norm, &b.grad_norm, sizeof a.grad_norm),
                      "%s bucket %d (seq %s): loss %.9g vs %.9g, grad norm %.9g vs %.9g", cases[c][0], k, seq,
                      (double)a.loss, (double)b.loss, (double)a.grad_norm, (double)b.grad_norm);
            }
            tg_plan_free(&direct);
        }
        tg_plan_free(&p);
    }
}
