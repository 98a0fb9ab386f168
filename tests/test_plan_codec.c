/* The plan file read as untrusted input (plan/plan_codec.c, plan/plan_file.c): a compiled
 * plan is encoded, then one field of the payload or of the container is corrupted at a
 * time and the decoder must refuse it with the specific message; every truncation of the
 * payload names the section it ends in, in payload order; the encoder refuses tables it
 * cannot write and fails cleanly without memory. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "plan/plan_codec.h"
#include "plan/plan_file.h"
#include "tests/harness.h"

#define BERT_JOB "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n"
#define BUCKETS_JOB "model = tiny-bert\nbatch = 2\nsteps = 1\ntrain_data = x\nseq_buckets = 4, 8\n"

static int compile_text(const char *text, tg_plan *p) {
    tg_job job;
    tg_err err = {{0}};
    return CHECK(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0 && tg_compile(&job, p, &err) == 0,
                 "compile: %s", err.msg);
}

static void put32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

/* ---- where the payload's fields lie ------------------------------------------------------ */

typedef struct layout {
    size_t weights_len, job_len, n_buckets, grad_accumulation, eval_len, ckpt_len, body, tensor0_name, names, ops, op0;
} layout;

/* The offsets of the fields the cases edit, from the plan the payload encodes
 * (plan/plan_codec.c's order); checked against the payload's own values. */
static int find_layout(const tg_plan *p, const uint8_t *b, size_t len, layout *l) {
    l->weights_len = 4 + strlen(p->model.source);
    l->job_len = l->weights_len + 4 + strlen(p->model.weights) + 34 * 4; /* 24 fields, the image models' 10 */
    const size_t train = l->job_len + 4 + strlen(p->job_path);
    l->n_buckets = train + 10 * 4;
    l->grad_accumulation = l->n_buckets + 4 + 4 * TG_MAX_BUCKETS;
    const size_t run = l->grad_accumulation + 4 + 4; /* then loss_scale_init */
    l->eval_len = run + 4 + strlen(p->run.train_data);
    l->ckpt_len = l->eval_len + 4 + strlen(p->run.eval_data) + 3 * 4 + 8 + 2 * 4;
    /* last_batch, skip_nonfinite, max_skipped, qa_n_best, qa_max_answer_length, qa_null_threshold,
     * gpu_hour_price */
    l->body = l->ckpt_len + 4 + strlen(p->run.checkpoint_dir) + 7 * 4;
    l->tensor0_name = l->body + 4;
    l->names = l->tensor0_name;
    for (int t = 0; t < p->n_tensors; t++) l->names += 96 + strlen(p->tensors[t].name);
    if (l->names + 4 > len) return 0;
    const uint32_t n_names = get_le32(b + l->names);
    l->ops = l->names + 4;
    for (uint32_t j = 0; j < n_names && l->ops + 4 <= len; j++) l->ops += 4 + get_le32(b + l->ops);
    l->op0 = l->ops + 4;
    return l->op0 + 4 <= len && get_le32(b + l->n_buckets) == (uint32_t)p->train.n_buckets &&
           get_le32(b + l->grad_accumulation) == (uint32_t)p->train.grad_accumulation &&
           get_le32(b + l->body) == (uint32_t)p->n_tensors && get_le32(b + l->ops) == (uint32_t)p->n_ops &&
           get_le32(b + l->op0) == 0 && get_le32(b + l->ckpt_len) == strlen(p->run.checkpoint_dir);
}

/* ---- payload fields -------------------------------------------------------------------------- */

typedef struct payload_case {
    const char *what;
    size_t at;      /* where the int32 is written */
    int32_t value;
    const char *want;
} payload_case;

TG_TEST(test_plan_codec_payload_fields) {
    tg_plan p;
    REQUIRE(compile_text(BERT_JOB, &p), "no plan");
    uint8_t *payload = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_plan_payload_encode(&p, &payload, &len, &err) == 0, "%s", err.msg);
    layout l;
    REQUIRE(find_layout(&p, payload, len, &l), "the payload is not laid out as the test expects");
    tg_plan back;
    memset(&back, 0, sizeof back);
    REQUIRE(tg_plan_payload_decode(payload, len, "p", TG_PLAN_CHECK_ALL, &back, &err) == 0, "%s", err.msg);
    tg_plan_free(&back);

    char count_msg[4][128];
    snprintf(count_msg[0], sizeof count_msg[0], "p: tensor count -1 is impossible for a %zu-byte payload", len);
    snprintf(count_msg[1], sizeof count_msg[1], "p: tensor count 16777217 is impossible for a %zu-byte payload", len);
    snprintf(count_msg[2], sizeof count_msg[2], "p: tensor count 1000000 is impossible for a %zu-byte payload", len);
    snprintf(count_msg[3], sizeof count_msg[3], "p: op count 16777217 is impossible for a %zu-byte payload", len);
    char op_msg[2][128];
    snprintf(op_msg[0], sizeof op_msg[0], "p: op count -1 is impossible for a %zu-byte payload", len);
    snprintf(op_msg[1], sizeof op_msg[1], "p: op 0 names op kind -1 of the %u the plan lists (file corrupt)",
             get_le32(payload + l.names));
    /* More names than the rest of the payload could hold (within the limit). */
    const int32_t past_payload = (int32_t)((len - l.names - 4) / 4 + 1);
    char names_msg[128];
    snprintf(names_msg, sizeof names_msg, "p: op kind name count %d is impossible (at most 4096, file corrupt)",
             past_payload);
    REQUIRE(past_payload <= 4096, "the payload is too long for the case");
    const payload_case cases[] = {
        {"model source length", 0, 512, "p: model source is 512 bytes, its field holds at most 511 (file corrupt)"},
        {"model weights length", l.weights_len, -1,
         "p: model weights path is 4294967295 bytes, its field holds at most 511 (file corrupt)"},
        {"job path length", l.job_len, 512, "p: job path is 512 bytes, its field holds at most 511 (file corrupt)"},
        {"n_buckets 0", l.n_buckets, 0, "p: train n_buckets 0 is not in [1, 8] (file corrupt)"},
        {"n_buckets 9", l.n_buckets, 9, "p: train n_buckets 9 is not in [1, 8] (file corrupt)"},
        {"grad_accumulation 0", l.grad_accumulation, 0, "p: train grad_accumulation 0 is not in [1, 1024]"},
        {"grad_accumulation 1025", l.grad_accumulation, 1025, "p: train grad_accumulation 1025 is not in [1, 1024]"},
        {"run eval_data length", l.eval_len, 600, "p: run eval_data is 600 bytes, its field holds at most 511"},
        {"run checkpoint_dir length", l.ckpt_len, 512, "p: run checkpoint_dir is 512 bytes, its field holds at most 511"},
        {"tensor count -1", l.body, -1, count_msg[0]},
        {"tensor count past the limit", l.body, (1 << 24) + 1, count_msg[1]},
        {"tensor count past the payload", l.body, 1000000, count_msg[2]},
        {"tensor 0 name length", l.tensor0_name, 96, "p: tensor 0 name is 96 bytes, its field holds at most 95"},
        {"kind name count -1", l.names, -1, "p: op kind name count -1 is impossible (at most 4096, file corrupt)"},
        {"kind name count past the limit", l.names, 4097,
         "p: op kind name count 4097 is impossible (at most 4096, file corrupt)"},
        {"kind name count past the payload", l.names, past_payload, names_msg},
        {"op count -1", l.ops, -1, op_msg[0]},
        {"op count past the limit", l.ops, (1 << 24) + 1, count_msg[3]},
        {"op 0 kind entry -1", l.op0, -1, op_msg[1]},
    };
    uint8_t *edited = malloc(len + 1);
    REQUIRE(edited, "out of memory");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        memcpy(edited, payload, len);
        put32(edited + cases[c].at, (uint32_t)cases[c].value);
        memset(&back, 0, sizeof back);
        memset(&err, 0, sizeof err);
        const int rc = tg_plan_payload_decode(edited, len, "p", TG_PLAN_CHECK_ALL, &back, &err);
        CHECK(rc == -1 && strstr(err.msg, cases[c].want), "%s: rc %d, '%s', want '%s'", cases[c].what, rc, err.msg,
              cases[c].want);
        tg_plan_free(&back);
    }
    /* Counts one past what the rest of the payload could hold at the smallest entry (a tensor
     * of 96 bytes plus its name, an op of its kind entry, phase and slots) are impossible;
     * the count that just fits is read on, and refused later for another cause. */
    const size_t tensor_min = 96, op_min = 8 + 4 * (TG_OP_MAX_IN + TG_OP_MAX_OUT);
    const struct {
        const char *what;
        size_t at, min;
    } fits[] = {{"tensor count", l.body, tensor_min}, {"op count", l.ops, op_min}};
    for (int f = 0; f < 2; f++)
        for (int over = 0; over < 2; over++) {
            const uint32_t count = (uint32_t)((len - fits[f].at - 4) / fits[f].min) + (uint32_t)over;
            memcpy(edited, payload, len);
            put32(edited + fits[f].at, count);
            memset(&back, 0, sizeof back);
            memset(&err, 0, sizeof err);
            const int rc = tg_plan_payload_decode(edited, len, "p", TG_PLAN_CHECK_ALL, &back, &err);
            char want[160];
            snprintf(want, sizeof want, "p: %s %u is impossible for a %zu-byte payload", fits[f].what, count, len);
            CHECK(rc == -1 && (over ? !strcmp(err.msg, want) : !strstr(err.msg, "is impossible")),
                  "%s %u (%s the payload): rc %d, '%s'", fits[f].what, count, over ? "past" : "within", rc, err.msg);
            tg_plan_free(&back);
        }
    /* A NUL inside a string; a byte after the payload. */
    memcpy(edited, payload, len);
    edited[4 + 1] = 0;
    memset(&back, 0, sizeof back);
    CHECK(tg_plan_payload_decode(edited, len, "p", TG_PLAN_CHECK_ALL, &back, &err) == -1 &&
              strstr(err.msg, "p: model source contains a NUL byte (file corrupt)"),
          "NUL in the source: '%s'", err.msg);
    tg_plan_free(&back);
    memcpy(edited, payload, len);
    edited[len] = 7;
    memset(&back, 0, sizeof back);
    CHECK(tg_plan_payload_decode(edited, len + 1, "p", TG_PLAN_CHECK_ALL, &back, &err) == -1 &&
              strstr(err.msg, "p: 1 unexpected bytes after the plan payload (file corrupt)"),
          "a trailing byte: '%s'", err.msg);
    tg_plan_free(&back);
    free(edited);
    free(payload);
    tg_plan_free(&p);
}

/* ---- truncation ------------------------------------------------------------------------------ */

/* The sections in payload order, as the truncation messages name them. */
static const char *const sections[] = {"model config", "job path",     "train settings", "run settings", "tensor table",
                                       "op kind names", "op table",    "plan totals",    "io table",     "fingerprint",
                                       "recompute summary"};
enum { N_SECTIONS = sizeof sections / sizeof sections[0] };

/* The section a refusal of a truncated payload names (counts refused as impossible for the
 * payload's length belong to their table), or -1. */
static int section_of(const char *msg, const char *bucket_prefix) {
    char want[128];
    for (int s = 0; s < N_SECTIONS; s++) {
        snprintf(want, sizeof want, "payload ends inside %s%s (file corrupt)", bucket_prefix, sections[s]);
        if (strstr(msg, want)) return s;
    }
    if (strstr(msg, "tensor count")) return 4;
    if (strstr(msg, "op kind name count")) return 5;
    if (strstr(msg, "op count")) return 6;
    return -1;
}

/* Decodes every prefix of the payload (every `step`-th length, and every length around the
 * section boundaries); each must be refused, naming a section no earlier than the last. */
static void check_truncations(const uint8_t *payload, size_t len, size_t from, size_t step, const char *bucket_prefix,
                              int *seen, int *last) {
    for (size_t n = from; n < len; n += n + step < len ? step : 1) {
        tg_plan back;
        memset(&back, 0, sizeof back);
        tg_err err = {{0}};
        const int rc = tg_plan_payload_decode(payload, n, "p", TG_PLAN_CHECK_TABLES, &back, &err);
        tg_plan_free(&back);
        const int s = section_of(err.msg, bucket_prefix);
        if (!CHECK(rc == -1 && s >= *last, "%zu of %zu bytes: rc %d, '%s' (after section %s)", n, len, rc, err.msg,
                   sections[*last]))
            return;
        seen[s] = 1, *last = s;
    }
}

/* Counts past the limit of 2^24 entries are refused for that, even in a payload long
 * enough to hold them at the smallest entry: the payload is the plan's, followed by zeros
 * up to that length in memory that is never touched (an anonymous mapping), and the first
 * entry after the count is one the decoder would refuse for another cause. */
TG_TEST(test_plan_codec_counts_past_the_limit) {
    tg_plan p;
    REQUIRE(compile_text(BERT_JOB, &p), "no plan");
    uint8_t *payload = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_plan_payload_encode(&p, &payload, &len, &err) == 0, "%s", err.msg);
    layout l;
    REQUIRE(find_layout(&p, payload, len, &l), "the payload is not laid out as the test expects");
    const uint32_t count = (1u << 24) + 1;
    const struct {
        const char *what;
        size_t at, entry_min, first_entry;
        uint32_t first_entry_value;
    } cases[] = {
        {"tensor count", l.body, 96, l.tensor0_name, 96},              /* tensor 0's name too long */
        {"op count", l.ops, 8 + 4 * (TG_OP_MAX_IN + TG_OP_MAX_OUT), l.op0, UINT32_MAX}, /* op 0 of kind -1 */
    };
    for (int c = 0; c < 2; c++) {
        const size_t big = cases[c].at + 4 + (size_t)count * cases[c].entry_min + 64;
        uint8_t *b = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (!CHECK(b != MAP_FAILED, "cannot map %zu bytes", big)) break;
        memcpy(b, payload, len);
        put32(b + cases[c].at, count);
        put32(b + cases[c].first_entry, cases[c].first_entry_value);
        tg_plan back;
        memset(&back, 0, sizeof back);
        memset(&err, 0, sizeof err);
        const int rc = tg_plan_payload_decode(b, big, "p", TG_PLAN_CHECK_ALL, &back, &err);
        char want[160];
        snprintf(want, sizeof want, "p: %s 16777217 is impossible for a %zu-byte payload", cases[c].what, big);
        CHECK(rc == -1 && !strcmp(err.msg, want), "%s: rc %d, '%s', want '%s'", cases[c].what, rc, err.msg, want);
        tg_plan_free(&back);
        munmap(b, big);
    }
    /* A tensor count at the limit passes it: the table is allocated (here that fails, so
     * nothing of 2^24 tensors is read or mapped). */
    {
        const uint32_t at_limit = 1u << 24;
        const size_t big = l.body + 4 + (size_t)at_limit * 96 + 64;
        uint8_t *b = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (CHECK(b != MAP_FAILED, "cannot map %zu bytes", big)) {
            memcpy(b, payload, len);
            put32(b + l.body, at_limit);
            tg_plan back;
            memset(&back, 0, sizeof back);
            memset(&err, 0, sizeof err);
            tg_alloc_fail_after(0);
            const int rc = tg_plan_payload_decode(b, big, "p", TG_PLAN_CHECK_ALL, &back, &err);
            tg_alloc_fail_after(-1);
            CHECK(rc == -1 && !strcmp(err.msg, "p: out of memory for 16777216 tensors"),
                  "tensor count 2^24: rc %d, '%s'", rc, err.msg);
            tg_plan_free(&back);
            munmap(b, big);
        }
    }
    free(payload);
    tg_plan_free(&p);
}

TG_TEST(test_plan_codec_truncated_payload) {
    tg_plan p;
    REQUIRE(compile_text(BERT_JOB, &p), "no plan");
    uint8_t *payload = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_plan_payload_encode(&p, &payload, &len, &err) == 0, "%s", err.msg);
    layout l;
    REQUIRE(find_layout(&p, payload, len, &l), "the payload is not laid out as the test expects");
    int seen[N_SECTIONS] = {0}, last = 0;
    /* Byte by byte through the settings and the first tensors, then sampled, then byte by
     * byte through the end. */
    check_truncations(payload, l.body + 400, 0, 1, "the ", seen, &last);
    check_truncations(payload, len - 400, l.body + 400, 97, "the ", seen, &last);
    check_truncations(payload, len, len - 400, 1, "the ", seen, &last);
    for (int s = 0; s < N_SECTIONS; s++) CHECK(seen[s], "no truncation ended in the %s", sections[s]);
    free(payload);
    tg_plan_free(&p);
}

/* ---- length buckets ---------------------------------------------------------------------------- */

TG_TEST(test_plan_codec_bucket_plans) {
    tg_plan p;
    REQUIRE(compile_text(BUCKETS_JOB, &p), "no plan");
    REQUIRE(p.train.n_buckets == 2 && p.buckets, "%d buckets", p.train.n_buckets);
    uint8_t *payload = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_plan_payload_encode(&p, &payload, &len, &err) == 0, "%s", err.msg);
    tg_plan back;
    memset(&back, 0, sizeof back);
    REQUIRE(tg_plan_payload_decode(payload, len, "p", TG_PLAN_CHECK_ALL, &back, &err) == 0, "%s", err.msg);
    CHECK(back.buckets && back.buckets[0].train.seq == 4 && back.buckets[0].n_ops == p.buckets[0].n_ops &&
              back.buckets[0].fingerprint == p.fingerprint,
          "the bucket plan read back differs");
    tg_plan_free(&back);

    /* The bucket plan's body is the last part of the payload: truncations inside it name it. */
    uint8_t *plain = NULL;
    size_t plain_len = 0;
    tg_plan one = p;
    one.train.n_buckets = 1, one.buckets = NULL;
    REQUIRE(tg_plan_payload_encode(&one, &plain, &plain_len, &err) == 0, "%s", err.msg);
    const size_t bucket_body = plain_len; /* the same settings and body, without the bucket plan */
    free(plain);
    int seen[N_SECTIONS] = {0}, last = 0;
    check_truncations(payload, bucket_body + 300, bucket_body, 1, "bucket 0's ", seen, &last);
    check_truncations(payload, len, len - 200, 1, "bucket 0's ", seen, &last);
    CHECK(seen[4] && seen[7], "truncations in the bucket plan did not name its tensor table and totals");

    /* The bucket plan's tensor count. */
    uint8_t *edited = malloc(len);
    REQUIRE(edited, "out of memory");
    memcpy(edited, payload, len);
    put32(edited + bucket_body, (uint32_t)-1);
    memset(&back, 0, sizeof back);
    char want[160];
    snprintf(want, sizeof want, "p: bucket 0 (seq 4): tensor count -1 is impossible for a %zu-byte payload", len);
    CHECK(tg_plan_payload_decode(edited, len, "p", TG_PLAN_CHECK_ALL, &back, &err) == -1 && strstr(err.msg, want),
          "'%s', want '%s'", err.msg, want);
    tg_plan_free(&back);
    free(edited);
    free(payload);

    /* A bucket plan consistent with the plan but not in itself: an activation's lifetime
     * (which follows seq, so the comparison with the plan leaves it) past its schedule. */
    int a = -1;
    for (int t = 0; t < p.buckets[0].n_tensors && a < 0; t++)
        if (p.buckets[0].tensors[t].pool == TG_POOL_ACTIVATIONS && p.buckets[0].tensors[t].first_use >= 0) a = t;
    REQUIRE(a >= 0, "no activation in the bucket plan");
    p.buckets[0].tensors[a].last_use = p.buckets[0].n_ops;
    REQUIRE(tg_plan_payload_encode(&p, &payload, &len, &err) == 0, "%s", err.msg);
    memset(&back, 0, sizeof back);
    snprintf(want, sizeof want, "p: bucket 0 (seq 4): tensor %d (%s) uses ops", a, p.buckets[0].tensors[a].name);
    CHECK(tg_plan_payload_decode(payload, len, "p", TG_PLAN_CHECK_ALL, &back, &err) == -1 && strstr(err.msg, want),
          "'%s', want '%s'", err.msg, want);
    tg_plan_free(&back);
    free(payload);

    /* The encoder: bucket plans it cannot write. */
    tg_plan q = p;
    q.buckets = NULL;
    uint8_t *out = NULL;
    CHECK(tg_plan_payload_encode(&q, &out, &len, &err) == -1 &&
              strstr(err.msg, "plan encode: train n_buckets 2 without its 1 bucket plans") && !out,
          "buckets missing: '%s'", err.msg);
    q = p;
    q.train.n_buckets = TG_MAX_BUCKETS + 1;
    CHECK(tg_plan_payload_encode(&q, &out, &len, &err) == -1 &&
              strstr(err.msg, "plan encode: train n_buckets 9 without its 8 bucket plans"),
          "9 buckets: '%s'", err.msg);
    const int saved = p.buckets[0].n_ops;
    p.buckets[0].n_ops = -1;
    CHECK(tg_plan_payload_encode(&p, &out, &len, &err) == -1 &&
              strstr(err.msg, "plan encode, bucket 0: bad table (n_tensors"),
          "a bucket's bad table: '%s'", err.msg);
    p.buckets[0].n_ops = saved;
    tg_plan_free(&p);
}

/* Three buckets: a payload that ends inside the first bucket plan is refused there, and the
 * second is not read. */
TG_TEST(test_plan_codec_three_buckets_truncated) {
    tg_plan p;
    REQUIRE(compile_text("model = tiny-bert\nbatch = 2\nsteps = 1\ntrain_data = x\nseq_buckets = 4, 6, 8\n", &p),
            "no plan");
    REQUIRE(p.train.n_buckets == 3, "%d buckets", p.train.n_buckets);
    uint8_t *payload = NULL, *plain = NULL;
    size_t len = 0, plain_len = 0;
    tg_err err = {{0}};
    tg_plan one = p;
    one.train.n_buckets = 1, one.buckets = NULL;
    REQUIRE(tg_plan_payload_encode(&p, &payload, &len, &err) == 0 &&
                tg_plan_payload_encode(&one, &plain, &plain_len, &err) == 0,
            "%s", err.msg);
    tg_plan back;
    memset(&back, 0, sizeof back);
    const int rc = tg_plan_payload_decode(payload, plain_len + 2, "p", TG_PLAN_CHECK_ALL, &back, &err);
    CHECK(rc == -1 && strstr(err.msg, "p: payload ends inside bucket 0's tensor table (file corrupt)"), "rc %d, '%s'",
          rc, err.msg);
    CHECK(back.buckets && back.buckets[1].n_tensors == 0 && !back.buckets[1].tensors, "bucket 1 was read");
    tg_plan_free(&back);
    free(plain);
    free(payload);
    tg_plan_free(&p);
}

/* ---- the encoder ----------------------------------------------------------------------------- */

/* Every bucket plan is checked before anything is written: a bad op kind in the second
 * (or third) of three plans is refused naming that bucket. */
TG_TEST(test_plan_codec_encode_refuses_each_bucket) {
    tg_plan p;
    REQUIRE(compile_text("model = tiny-bert\nbatch = 2\nsteps = 1\ntrain_data = x\nseq_buckets = 4, 6, 8\n", &p),
            "no plan");
    REQUIRE(p.train.n_buckets == 3 && p.buckets && p.buckets[1].n_ops > 0, "%d buckets", p.train.n_buckets);
    tg_plan *const buckets = p.buckets;
    tg_plan copies[2] = {buckets[0], buckets[1]};
    tg_op *ops = malloc((size_t)buckets[1].n_ops * sizeof *ops);
    REQUIRE(ops, "out of memory");
    memcpy(ops, buckets[1].ops, (size_t)buckets[1].n_ops * sizeof *ops);
    ops[0].kind = -1;
    copies[1].ops = ops;
    p.buckets = copies;
    uint8_t *out = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    char want[96];
    snprintf(want, sizeof want, "plan encode, bucket 1: op 0 has kind -1 of %d", TG_OP_COUNT);
    CHECK(tg_plan_payload_encode(&p, &out, &len, &err) == -1 && !strcmp(err.msg, want) && !out && len == 0,
          "bucket 1 with op kind -1: '%s', want '%s'", err.msg, want);
    copies[1].ops = buckets[1].ops, copies[1].n_tensors = -1;
    snprintf(want, sizeof want, "plan encode, bucket 1: bad table (n_tensors -1, n_ops %d)", buckets[1].n_ops);
    CHECK(tg_plan_payload_encode(&p, &out, &len, &err) == -1 && !strcmp(err.msg, want) && !out,
          "bucket 1 with n_tensors -1: '%s', want '%s'", err.msg, want);
    copies[1].n_tensors = buckets[1].n_tensors;
    copies[0].n_ops = -1;
    snprintf(want, sizeof want, "plan encode, bucket 0: bad table (n_tensors %d, n_ops -1)", buckets[0].n_tensors);
    CHECK(tg_plan_payload_encode(&p, &out, &len, &err) == -1 && !strcmp(err.msg, want) && !out,
          "bucket 0 with n_ops -1: '%s', want '%s'", err.msg, want);
    copies[0].n_ops = buckets[0].n_ops;
    CHECK(tg_plan_payload_encode(&p, &out, &len, &err) == 0 && out && len > 0, "restored: %s", err.msg);
    free(out);
    free(ops);
    p.buckets = buckets;
    tg_plan_free(&p);
}

TG_TEST(test_plan_codec_encode_refusals) {
    tg_plan p;
    REQUIRE(compile_text(BERT_JOB, &p), "no plan");
    uint8_t *out = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    tg_plan q = p;
    q.n_tensors = -1;
    char want[96];
    snprintf(want, sizeof want, "plan encode: bad table (n_tensors -1, n_ops %d)", p.n_ops);
    CHECK(tg_plan_payload_encode(&q, &out, &len, &err) == -1 && strstr(err.msg, want) && !out && len == 0,
          "n_tensors -1: '%s'", err.msg);
    q = p, q.n_ops = -1;
    snprintf(want, sizeof want, "plan encode: bad table (n_tensors %d, n_ops -1)", p.n_tensors);
    CHECK(tg_plan_payload_encode(&q, &out, &len, &err) == -1 && strstr(err.msg, want), "n_ops -1: '%s'", err.msg);
    q = p, q.tensors = NULL;
    CHECK(tg_plan_payload_encode(&q, &out, &len, &err) == -1 && strstr(err.msg, "plan encode: bad table"),
          "no tensor table: '%s'", err.msg);
    q = p, q.ops = NULL;
    CHECK(tg_plan_payload_encode(&q, &out, &len, &err) == -1 && strstr(err.msg, "plan encode: bad table"),
          "no op table: '%s'", err.msg);
    /* Empty tables need no storage. */
    q = p, q.n_tensors = q.n_ops = 0, q.tensors = NULL, q.ops = NULL;
    CHECK(tg_plan_payload_encode(&q, &out, &len, &err) == 0 && out && len > 0, "empty tables refused: %s", err.msg);
    free(out);

    /* Out of memory at each allocation of the encoding, then enough. */
    int failures = 0;
    for (long k = 0; k < 64; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_plan_encode(&p, &out, &len, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) {
            free(out);
            break;
        }
        failures++;
        CHECK(rc == -1 &&
                  (!strcmp(err.msg, "plan encode: out of memory") ||
                   !strcmp(err.msg, "plan encode: out of memory for the zstd compressor")) &&
                  !out && len == 0,
              "allocation %ld failed: rc %d, '%s'", k, rc, err.msg);
    }
    CHECK(failures >= 2, "only %d allocations to fail", failures);

    /* tg_plan_write names the path when the encoding fails. */
    char path[600];
    snprintf(path, sizeof path, "%s/bad.tgp", tg_test_tmpdir());
    q = p, q.n_tensors = -1;
    CHECK(tg_plan_write(&q, path, &err) == -1 && strstr(err.msg, path) && strstr(err.msg, "bad table"),
          "write of a bad plan: '%s'", err.msg);
    struct stat st;
    CHECK(stat(path, &st) != 0, "a refused plan left %s", path);
    tg_plan_free(&p);
}

/* ---- the container ----------------------------------------------------------------------------- */

/* A file of `payload` compressed as given (csize bytes at frame) under a valid header whose
 * payload size is usize and whose checksum covers the frame. */
static uint8_t *seal(const uint8_t *frame, size_t csize, uint64_t usize, size_t *len) {
    uint8_t *f = malloc(40 + csize);
    if (!f) return NULL;
    memcpy(f, "TGPLAN\0\0", 8);
    put32(f + 8, TG_PLAN_VERSION);
    put32(f + 12, 0);
    put64(f + 16, usize);
    put64(f + 24, csize);
    memcpy(f + 40, frame, csize);
    put64(f + 32, XXH64(f + 40, csize, 0));
    *len = 40 + csize;
    return f;
}

static int decode_says(const uint8_t *bytes, size_t len, const char *name, const char *want, char *got, size_t n) {
    tg_plan back;
    tg_err err = {{0}};
    const int rc = tg_plan_decode(bytes, len, name, &back, &err);
    snprintf(got, n, "%s", err.msg);
    const int ok = rc == -1 && strstr(err.msg, want) && !back.tensors && !back.ops && back.n_tensors == 0;
    tg_plan_free(&back);
    return ok;
}

TG_TEST(test_plan_codec_container) {
    tg_plan p;
    REQUIRE(compile_text(BERT_JOB, &p), "no plan");
    uint8_t *file = NULL, *payload = NULL;
    size_t len = 0, plen = 0;
    tg_err err = {{0}};
    REQUIRE(tg_plan_encode(&p, &file, &len, &err) == 0 && tg_plan_payload_encode(&p, &payload, &plen, &err) == 0,
            "%s", err.msg);
    char got[512], want[256];
    uint8_t *f = malloc(len + 1);
    REQUIRE(f, "out of memory");

    /* No name: "plan". */
    CHECK(decode_says((const uint8_t *)"hello", 5, NULL, "plan: not a tunegraph plan (bad magic)", got, sizeof got),
          "'%s'", got);
    /* Header flags. */
    memcpy(f, file, len);
    put32(f + 12, 1);
    CHECK(decode_says(f, len, "p", "p: unknown header flags 0x1 (file corrupt or from a newer build)", got, sizeof got),
          "'%s'", got);
    /* A byte after the payload. */
    memcpy(f, file, len);
    f[len] = 0;
    snprintf(want, sizeof want, "p: 1 unexpected bytes after the %zu-byte payload (file corrupt)", len - 40);
    CHECK(decode_says(f, len + 1, "p", want, got, sizeof got), "'%s'", got);

    /* Frames whose own size does not agree with the header: none recorded, not a frame. */
    const size_t bound = ZSTD_compressBound(plen);
    uint8_t *frame = malloc(bound);
    REQUIRE(frame, "out of memory");
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    REQUIRE(cctx && !ZSTD_isError(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 0)), "zstd context");
    size_t csize = ZSTD_compress2(cctx, frame, bound, payload, plen);
    ZSTD_freeCCtx(cctx);
    REQUIRE(!ZSTD_isError(csize), "zstd: %s", ZSTD_getErrorName(csize));
    size_t flen = 0;
    uint8_t *sealed = seal(frame, csize, plen, &flen);
    snprintf(want, sizeof want, "p: header says %zu payload bytes, the compressed frame does not agree (file corrupt)",
             plen);
    CHECK(sealed && decode_says(sealed, flen, "p", want, got, sizeof got), "frame without its size: '%s'", got);
    free(sealed);
    memset(frame, 0xab, 64);
    sealed = seal(frame, 64, plen, &flen);
    CHECK(sealed && decode_says(sealed, flen, "p", want, got, sizeof got), "not a frame: '%s'", got);
    free(sealed);

    /* Sizes no frame of its length can have: none, past half the address space, and more
     * than 32768 times the compressed bytes (frame headers made by hand: single segment,
     * an 8-byte content size). */
    csize = ZSTD_compress(frame, bound, payload, 0, 3);
    REQUIRE(!ZSTD_isError(csize), "zstd: %s", ZSTD_getErrorName(csize));
    sealed = seal(frame, csize, 0, &flen);
    CHECK(sealed && decode_says(sealed, flen, "p", "p: payload size 0 is impossible (file corrupt)", got, sizeof got),
          "empty payload: '%s'", got);
    free(sealed);
    const uint64_t huge[2] = {UINT64_C(1) << 63, UINT64_C(1) << 40};
    for (int k = 0; k < 2; k++) {
        uint8_t hand[16] = {0x28, 0xb5, 0x2f, 0xfd, 0xe0};
        put64(hand + 5, huge[k]);
        sealed = seal(hand, sizeof hand, huge[k], &flen);
        snprintf(want, sizeof want, "p: payload size %llu is impossible (file corrupt)", (unsigned long long)huge[k]);
        CHECK(sealed && decode_says(sealed, flen, "p", want, got, sizeof got), "size %llu: '%s'",
              (unsigned long long)huge[k], got);
        free(sealed);
    }
    /* A frame cut short: its header agrees, its blocks do not decompress. */
    csize = ZSTD_compress(frame, bound, payload, plen, 3);
    REQUIRE(!ZSTD_isError(csize), "zstd: %s", ZSTD_getErrorName(csize));
    sealed = seal(frame, csize - 3, plen, &flen);
    CHECK(sealed && decode_says(sealed, flen, "p", "p: payload does not decompress: ", got, sizeof got) &&
              strstr(got, "(file corrupt)"),
          "cut frame: '%s'", got);
    free(sealed);

    /* Out of memory for the payload. */
    tg_plan back;
    tg_alloc_fail_after(0);
    int rc = tg_plan_decode(file, len, "p", &back, &err);
    tg_alloc_fail_after(-1);
    snprintf(want, sizeof want, "p: out of memory for a %zu-byte payload", plen);
    CHECK(rc == -1 && strstr(err.msg, want) && !back.tensors, "'%s', want '%s'", err.msg, want);
    free(frame);
    free(f);
    free(payload);

    /* Files: a folder, a missing file, an empty file, and out of memory for the bytes. */
    const char *dir = tg_test_tmpdir();
    CHECK(tg_plan_read(dir, &back, &err) == -1 && strstr(err.msg, dir) && strstr(err.msg, ": not a regular file"),
          "a folder: '%s'", err.msg);
    char path[600];
    snprintf(path, sizeof path, "%s/missing.tgp", dir);
    CHECK(tg_plan_read(path, &back, &err) == -1 && strstr(err.msg, "missing.tgp: cannot open: "), "missing: '%s'",
          err.msg);
    CHECK(!tg_plan_file_sniff(path), "a missing file sniffed as a plan");
    snprintf(path, sizeof path, "%s/empty.tgp", dir);
    REQUIRE(tg_test_write_file(path, "") == 0, "cannot write %s", path);
    CHECK(tg_plan_read(path, &back, &err) == -1 &&
              strstr(err.msg, "empty.tgp: truncated: file has 0 bytes, the plan header alone is 40"),
          "empty: '%s'", err.msg);
    CHECK(!tg_plan_file_sniff(path), "an empty file sniffed as a plan");
    snprintf(path, sizeof path, "%s/plan.tgp", dir);
    REQUIRE(tg_plan_write(&p, path, &err) == 0, "%s", err.msg);
    CHECK(tg_plan_file_sniff(path), "a plan not sniffed");
    tg_alloc_fail_after(0);
    rc = tg_plan_read(path, &back, &err);
    tg_alloc_fail_after(-1);
    snprintf(want, sizeof want, "plan.tgp: out of memory for %zu bytes", len);
    CHECK(rc == -1 && strstr(err.msg, want), "'%s', want '%s'", err.msg, want);
    CHECK(tg_plan_read(path, &back, &err) == 0 && back.n_ops == p.n_ops && back.fingerprint == p.fingerprint,
          "read back: %s", err.msg);
    tg_plan_free(&back);
    free(file);
    tg_plan_free(&p);
}

/* Decoding into a plan that held anything (here every byte 0xA5, its bucket pointer
 * too) gives the payload's plan: no field of what was there survives, and a one-bucket
 * payload is not taken for a plan with bucket plans. */
TG_TEST(test_plan_codec_decode_overwrites_what_was_there) {
    tg_plan p;
    REQUIRE(compile_text(BERT_JOB, &p), "no plan");
    uint8_t *payload = NULL;
    size_t len = 0;
    tg_err err = {{0}};
    REQUIRE(tg_plan_payload_encode(&p, &payload, &len, &err) == 0, "%s", err.msg);
    tg_plan back;
    memset(&back, 0xA5, sizeof back);
    const int rc = tg_plan_payload_decode(payload, len, "p", TG_PLAN_CHECK_ALL, &back, &err);
    CHECK(rc == 0, "decode into a used plan: %s", err.msg);
    if (rc == 0) {
        CHECK(back.buckets == NULL && back.train.n_buckets == 1 && back.n_ops == p.n_ops &&
                  back.n_tensors == p.n_tensors && back.peak_bytes == p.peak_bytes,
              "buckets %p, n_buckets %d, %d ops of %d", (void *)back.buckets, back.train.n_buckets, back.n_ops, p.n_ops);
        tg_plan_free(&back);
    }
    free(payload);
    tg_plan_free(&p);
}
