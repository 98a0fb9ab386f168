/* `inspect` (plan/inspect.c) of a hand-made plan that is not valid — tensor indices
 * outside the table, dims outside 0..4, a phase table past the ops, a name that is not
 * UTF-8, a NaN total, a seed past int64, three length buckets — printed as text and as
 * JSON with every such value shown as documented; then the JSON built with each
 * allocation failing in turn, and output that cannot be written. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "base/alloc.h"
#include "plan/inspect.h"
#include "plan/op_meta.h"
#include "tests/harness.h"

typedef struct odd_plan {
    tg_plan p, b[2];
    tg_tensor t[4], bt[2][4];
    tg_op o[3];
} odd_plan;

static void set_tensor(tg_tensor *x, const char *name, int pool, int ndim, int64_t d0, uint64_t offset,
                       uint64_t bytes) {
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = TG_F32;
    x->pool = pool;
    x->ndim = ndim;
    for (int d = 0; d < TG_MAX_DIMS; d++) x->shape[d] = d0 + d;
    x->offset = offset;
    x->bytes = bytes;
    x->grad = x->master = x->group = -1;
    x->first_use = x->last_use = -1;
}

/* The plan: three buckets (seq 4, 8, 16), the middle one with the largest activations. */
static void build(odd_plan *s) {
    memset(s, 0, sizeof *s);
    tg_plan *p = &s->p;
    snprintf(p->model.source, sizeof p->model.source, "%s", "models/odd");
    p->model.arch = TG_ARCH_GPT2;
    snprintf(p->model.weights, sizeof p->model.weights, "%s", "models/odd/model.safetensors");
    p->model.vocab_size = 50, p->model.hidden = 12, p->model.layers = 3, p->model.heads = 4;
    p->model.intermediate = 48, p->model.max_positions = 64; /* each value distinct */
    snprintf(p->job_path, sizeof p->job_path, "%s", "jobs/odd.job");
    p->train = (tg_plan_train){.task = TG_TASK_LM, .batch = 2, .seq = 16, .replicas = 2, .zero_stage = 1,
                               .attention = TG_ATTENTION_FUSED, .n_buckets = 3, .bucket_seq = {4, 8, 16},
                               .grad_accumulation = 3};
    p->run = (tg_plan_run){.steps = 3, .seed = UINT64_MAX, .last_batch = TG_LAST_BATCH_DROP, .log_every = 5,
                           .checkpoint_every = 7, .keep_checkpoints = 2, .qa_n_best = 6,
                           .qa_max_answer_length = 13, .qa_null_threshold = -0.5f, .gpu_hour_price = 2.5f};
    snprintf(p->run.train_data, sizeof p->run.train_data, "%s", "data/train.jsonl");
    snprintf(p->run.eval_data, sizeof p->run.eval_data, "%s", "data/eval.jsonl");
    snprintf(p->run.checkpoint_dir, sizeof p->run.checkpoint_dir, "%s", "ckpt");
    p->train.pad_id = 9, p->train.allow_tf32 = 1, p->train.precision = TG_PREC_BF16;
    p->tensors = s->t, p->n_tensors = 4;
    set_tensor(&s->t[0], "w", TG_POOL_PARAMS, 2, 3, 0, 24);
    s->t[0].flags = TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY;
    s->t[0].group = 77; /* outside the table */
    set_tensor(&s->t[1], "bad\xff", TG_POOL_ACTIVATIONS, -1, 5, 0, 600); /* not UTF-8, ndim -1 */
    set_tensor(&s->t[2], "wide", TG_POOL_ACTIVATIONS, 7, 2, 512, 100);  /* ndim 7: 4 dims shown */
    set_tensor(&s->t[3], "frozen", TG_POOL_FROZEN, 1, 6, 0, 24);
    s->t[3].flags = TG_TENSOR_FROZEN;
    p->ops = s->o, p->n_ops = 3;
    s->o[0] = tg_test_op(TG_OP_ADD);
    s->o[0].in[0] = 1, s->o[0].in[1] = 99, s->o[0].out[0] = 2, s->o[0].p.count.n = 5;
    s->o[1] = tg_test_op(TG_OP_FILL);
    s->o[1].out[0] = -7, s->o[1].p.fill.value = 0.5f;
    s->o[2] = tg_test_op(TG_OP_ZERO);
    s->o[2].out[0] = 1; /* ndim -1: no dims shown */
    s->t[2].flags = TG_TENSOR_FLAGS_ALL; /* every flag named */
    /* Forward from -3 (clamped to 0) to 2; backward 2..1 (none); optimizer 1..9 (to 3). */
    p->phase_begin[0] = -3, p->phase_begin[1] = 2, p->phase_begin[2] = 1, p->phase_begin[3] = 9;
    p->pool_bytes[TG_POOL_PARAMS] = 256, p->pool_bytes[TG_POOL_ACTIVATIONS] = 2048;
    p->pool_bytes[TG_POOL_FROZEN] = 256;
    p->peak_bytes = 2560;
    p->flops_per_step = NAN; /* null in JSON */
    p->bytes_per_step = 12.5;
    p->freeze_pruned_ops = 7, p->freeze_pruned_flops = 2.5e9;
    p->fingerprint = 0xabc;
    /* Buckets 0 and 1: the same tensors, activations of 300 and 900 bytes (the plan's
     * reach 612). */
    p->buckets = s->b;
    for (int k = 0; k < 2; k++) {
        tg_plan *b = &s->b[k];
        *b = *p;
        b->buckets = NULL;
        b->train.seq = p->train.bucket_seq[k];
        memcpy(s->bt[k], s->t, sizeof s->t);
        b->tensors = s->bt[k];
        b->tensors[1].bytes = k ? 900 : 300;
        b->tensors[2].offset = 0, b->tensors[2].bytes = 0;
        b->flops_per_step = 1e9 * (k + 1);
        b->n_ops = k + 1;
    }
}

/* What tg_plan_inspect writes (malloc'd, NUL-terminated), or NULL. */
static char *inspect_text(const tg_plan *p, int json, tg_err *err, int *rc) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    *rc = tg_plan_inspect(p, f, json, err);
    fclose(f);
    return buf;
}

static int has(const char *s, const char *needle) { return s && strstr(s, needle); }

TG_TEST(test_plan_inspect_odd_plan_text) {
    odd_plan s;
    build(&s);
    tg_err err = {{0}};
    int rc = -1;
    char *text = inspect_text(&s.p, 0, &err, &rc);
    REQUIRE(text && rc == 0, "inspect: rc %d %s", rc, err.msg);
    static const char *const want[] = {
        "model: models/odd (gpt2)\n",
        "attention: unfused (job asks fused)  data parallel: 2 replicas (ZeRO-1: optimizer state sharded)  "
        "grad_accumulation: 3 micro-batches a step (6 rows)\n",
        "buckets: 3 lengths, one set of pools: activations 2048 bytes (0.00 MiB), sized by bucket 1 (seq 8), serve them "
        "all\n",
        "  bucket 0: seq 4      activations          300 bytes (0.00 MiB)  ops 1  1.000 GFLOP/step\n",
        "  bucket 1: seq 8      activations          900 bytes (0.00 MiB)  ops 2  2.000 GFLOP/step\n",
        "  bucket 2: seq 16     activations          612 bytes (0.00 MiB)  ops 3  nan GFLOP/step\n",
        "run: steps 3  epochs 0  seed 18446744073709551615  last_batch: drop  skip_nonfinite: false\n",
        "fingerprint: 0000000000000abc\n",
        "parameters: trainable 1 (256 bytes), frozen 1 (256 bytes), buffers 0 (0 bytes)\n",
        "\n== forward (2 ops) ==\n",
        "    0 add                wide[2,3,4,5] <- bad\xff, #99? | n=5\n",
        "    1 fill               #-7? <- - | value=0.5\n",
        "\n== backward (0 ops) ==\n\n== optimizer (2 ops) ==\n    1 fill",
        "    2 zero               bad\xff[] <- -\n",
        "param,grad,no_decay,input,output,view,tied,copy,frozen,buffer,persistent\n",
        "[2,3,4,5]",
        "packed in #77?\n",
        "no_decay",
        "flops per step: nan (nan GFLOP)\n",
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        CHECK(has(text, want[k]), "the text lacks '%s':\n%s", want[k], text);
    /* The ndim -1 tensor's shape is empty. */
    char row[96];
    snprintf(row, sizeof row, "    1 %-40s %-5s %-18s %-11s", "bad\xff", "f32", "[]", "activations");
    CHECK(has(text, row), "the ndim -1 tensor's row lacks '%s':\n%s", row, text);
    free(text);

    /* Bucket counts past the limit, or of one: no bucket lines (the plan alone). */
    const int counts[] = {TG_MAX_BUCKETS + 1, 1};
    for (int k = 0; k < 2; k++) {
        s.p.train.n_buckets = counts[k];
        text = inspect_text(&s.p, 0, &err, &rc);
        CHECK(text && rc == 0 && !has(text, "buckets:"), "%d buckets printed as buckets", counts[k]);
        free(text);
    }
}

TG_TEST(test_plan_inspect_odd_plan_json) {
    odd_plan s;
    build(&s);
    tg_err err = {{0}};
    int rc = -1;
    char *text = inspect_text(&s.p, 1, &err, &rc);
    REQUIRE(text && rc == 0, "inspect --json: rc %d %s", rc, err.msg);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    REQUIRE(root, "not JSON: %s\n%s", jerr.text, text);
    const json_t *ops = json_object_get(root, "ops"), *tensors = json_object_get(root, "tensors");
    const json_t *op0 = json_array_get(ops, 0), *op1 = json_array_get(ops, 1);
    CHECK(json_array_size(ops) == 3 && json_array_size(tensors) == 4, "%zu ops, %zu tensors", json_array_size(ops),
          json_array_size(tensors));
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(op0, "inputs"), 1)), "#99?") &&
              !strcmp(json_string_value(json_array_get(json_object_get(op0, "inputs"), 0)), "?") &&
              !strcmp(json_string_value(json_array_get(json_object_get(op1, "outputs"), 0)), "#-7?") &&
              json_real_value(json_object_get(json_object_get(op1, "params"), "value")) == 0.5 &&
              json_integer_value(json_object_get(json_object_get(op0, "params"), "n")) == 5,
          "op references and parameters");
    const json_t *t0 = json_array_get(tensors, 0), *t1 = json_array_get(tensors, 1), *t2 = json_array_get(tensors, 2);
    CHECK(!strcmp(json_string_value(json_object_get(t0, "packed_in")), "#77?") &&
              json_array_size(json_object_get(t0, "flags")) == 2 && !json_object_get(t1, "packed_in"),
          "packed_in and flags of tensor 0");
    CHECK(json_array_size(json_object_get(t2, "flags")) == 11 &&
              !strcmp(json_string_value(json_array_get(json_object_get(t2, "flags"), 10)), "persistent"),
          "every flag of tensor 2");
    CHECK(!strcmp(json_string_value(json_object_get(t1, "name")), "?") && json_array_size(json_object_get(t1, "shape")) == 0 &&
              json_array_size(json_object_get(t2, "shape")) == 4 &&
              json_integer_value(json_array_get(json_object_get(t2, "shape"), 3)) == 5,
          "names and shapes outside their ranges");
    CHECK(json_is_null(json_object_get(root, "flops_per_step")) &&
              json_real_value(json_object_get(root, "bytes_per_step")) == 12.5,
          "NaN flops not null");
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(root, "run"), "seed")), "18446744073709551615"),
          "a seed past int64 not its decimal text");
    CHECK(json_integer_value(json_object_get(root, "pools_sized_by_bucket")) == 1 &&
              json_array_size(json_object_get(root, "buckets")) == 3 &&
              json_integer_value(json_object_get(json_array_get(json_object_get(root, "buckets"), 1), "activation_bytes")) ==
                  900 &&
              json_array_size(json_object_get(json_object_get(root, "train"), "bucket_seq")) == 3,
          "buckets");
    const json_t *per_phase = json_object_get(root, "ops_per_phase");
    CHECK(json_integer_value(json_object_get(per_phase, "forward")) == 5 &&
              json_integer_value(json_object_get(per_phase, "backward")) == 0 &&
              json_integer_value(json_object_get(per_phase, "optimizer")) == 8,
          "ops per phase (as the table says, negative as 0)");
    CHECK(!strcmp(json_string_value(json_object_get(root, "attention")), "unfused") &&
              !strcmp(json_string_value(json_object_get(json_object_get(root, "train"), "attention")), "fused"),
          "attention run and asked");
    json_decref(root);
    free(text);

    /* More buckets than a plan may have: the first eight lengths, and the plan alone. */
    s.p.train.n_buckets = TG_MAX_BUCKETS + 1;
    text = inspect_text(&s.p, 1, &err, &rc);
    root = text ? json_loads(text, 0, &jerr) : NULL;
    CHECK(root && json_array_size(json_object_get(json_object_get(root, "train"), "bucket_seq")) == TG_MAX_BUCKETS &&
              json_array_size(json_object_get(root, "buckets")) == 1,
          "9 buckets in JSON");
    json_decref(root);
    free(text);
    s.p.train.n_buckets = 3;

    /* A seed inside int64 is a number. */
    s.p.run.seed = 42;
    text = inspect_text(&s.p, 1, &err, &rc);
    root = text ? json_loads(text, 0, &jerr) : NULL;
    CHECK(root && json_integer_value(json_object_get(json_object_get(root, "run"), "seed")) == 42, "seed 42");
    json_decref(root);
    free(text);
}

/* Each allocation of the JSON failing in turn: refused as out of memory (building it, or
 * writing it: jansson's dump allocates too); then enough. */
TG_TEST(test_plan_inspect_json_out_of_memory) {
    odd_plan s;
    build(&s);
    tg_err err = {{0}};
    int failures = 0, dump_failures = 0, rc = -1;
    for (long k = 0; k < 20000; k++) {
        memset(&err, 0, sizeof err);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        REQUIRE(f, "no memory stream");
        tg_alloc_fail_after(k);
        rc = tg_plan_inspect(&s.p, f, 1, &err);
        tg_alloc_fail_after(-1);
        fclose(f);
        const size_t written = len;
        free(buf);
        if (rc == 0) break;
        failures++;
        const int building = !strcmp(err.msg, "inspect: cannot build the JSON (out of memory)");
        dump_failures += !building;
        if (!CHECK((building && written == 0) || !strcmp(err.msg, "inspect: out of memory writing the JSON"),
                   "allocation %ld failed: '%s', %zu bytes written", k, err.msg, written))
            break;
    }
    CHECK(rc == 0 && failures > 100 && dump_failures >= 1, "the JSON written after %d failures, %d of them dumping (rc %d)",
          failures, dump_failures, rc);
}

/* Each allocation failing alone in turn (later ones succeed): the JSON is refused whole,
 * never written with a field missing; with none failing it is the JSON written at first. */
TG_TEST(test_plan_inspect_json_one_allocation_failing) {
    odd_plan s;
    build(&s);
    tg_err err = {{0}};
    int rc = -1;
    char *full = inspect_text(&s.p, 1, &err, &rc);
    REQUIRE(full && rc == 0, "inspect --json: rc %d %s", rc, err.msg);
    int building = 0, dumping = 0;
    long k = 0;
    for (; k < 20000; k++) {
        memset(&err, 0, sizeof err);
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        REQUIRE(f, "no memory stream");
        const long before = tg_alloc_failures();
        tg_alloc_fail_only(k);
        rc = tg_plan_inspect(&s.p, f, 1, &err);
        tg_alloc_fail_after(-1);
        const int failed = tg_alloc_failures() != before;
        fclose(f);
        if (!failed) {
            CHECK(rc == 0 && buf && !strcmp(buf, full), "no allocation failing: rc %d, %s", rc, err.msg);
            free(buf);
            break;
        }
        const int b = !strcmp(err.msg, "inspect: cannot build the JSON (out of memory)");
        building += b;
        dumping += !strcmp(err.msg, "inspect: out of memory writing the JSON");
        const int ok = CHECK(rc == -1 && (b ? len == 0 : !strcmp(err.msg, "inspect: out of memory writing the JSON")),
                             "allocation %ld failing alone: rc %d, '%s', %zu bytes written", k, rc, err.msg, len);
        free(buf);
        if (!ok) break;
    }
    CHECK(building > 100 && dumping >= 1 && building + dumping == k, "%d failures building, %d dumping, of %ld",
          building, dumping, k);
    free(full);
}

/* Output that cannot be written: /dev/full. */
TG_TEST(test_plan_inspect_write_failure) {
    odd_plan s;
    build(&s);
    /* Unbuffered (each write fails), then buffered text (the flush fails). */
    for (int json = 0; json < 3; json++) {
        FILE *f = fopen("/dev/full", "w");
        REQUIRE(f, "no /dev/full");
        if (json < 2) setvbuf(f, NULL, _IONBF, 0);
        tg_err err = {{0}};
        const int rc = tg_plan_inspect(&s.p, f, json == 1, &err);
        fclose(f);
        CHECK(rc == -1 && !strcmp(err.msg, json == 1 ? "inspect: cannot write the JSON output" : "inspect: cannot write the output"),
              "%s to /dev/full: rc %d, '%s'", json == 1 ? "JSON" : "text", rc, err.msg);
    }
}
/* The whole of inspect's text and JSON for the odd plan, byte for byte, against
 * tests/data/inspect_odd_plan.txt and .json: every line, field, name and number, in order. */
TG_TEST(test_plan_inspect_odd_plan_whole_output) {
    odd_plan s;
    build(&s);
    static const char *const files[2] = {"tests/data/inspect_odd_plan.txt", "tests/data/inspect_odd_plan.json"};
    for (int json = 0; json < 2; json++) {
        tg_err err = {{0}};
        int rc = -1;
        char *text = inspect_text(&s.p, json, &err, &rc);
        /* TG_TEST_WRITE_EXPECTED=1 writes what inspect prints as the expected files (review the diff). */
        if (text && getenv("TG_TEST_WRITE_EXPECTED")) tg_test_write_file(files[json], text);
        long len = 0;
        char *want = tg_test_read_file(files[json], &len);
        REQUIRE(text && rc == 0 && want, "inspect (json %d): rc %d %s; %s unreadable", json, rc, err.msg, files[json]);
        size_t at = 0;
        while (text[at] && text[at] == want[at]) at++;
        CHECK(text[at] == want[at] && (long)strlen(text) == len,
              "%s differs at byte %zu: got '%.60s', want '%.60s'", files[json], at, text + at, want + at);
        free(text);
        free(want);
    }
}

/* One op in each phase: each phase counts it, in the text and in the JSON (a count of one
 * is a count, not an empty phase). */
TG_TEST(test_plan_inspect_one_op_per_phase) {
    odd_plan s;
    build(&s);
    s.p.phase_begin[0] = 0, s.p.phase_begin[1] = 1, s.p.phase_begin[2] = 2, s.p.phase_begin[3] = 3;
    tg_err err = {{0}};
    int rc = -1;
    char *text = inspect_text(&s.p, 0, &err, &rc);
    CHECK(text && rc == 0 && has(text, "\n== forward (1 ops) ==\n    0 add ") &&
              has(text, "\n== backward (1 ops) ==\n    1 fill ") && has(text, "\n== optimizer (1 ops) ==\n    2 zero "),
          "text phases: rc %d %s\n%s", rc, err.msg, text ? text : "");
    free(text);
    text = inspect_text(&s.p, 1, &err, &rc);
    json_error_t jerr;
    json_t *root = text && rc == 0 ? json_loads(text, 0, &jerr) : NULL;
    const json_t *per_phase = json_object_get(root, "ops_per_phase");
    CHECK(json_object_size(per_phase) == 3 && json_integer_value(json_object_get(per_phase, "forward")) == 1 &&
              json_integer_value(json_object_get(per_phase, "backward")) == 1 &&
              json_integer_value(json_object_get(per_phase, "optimizer")) == 1,
          "JSON ops_per_phase: %s", text ? text : err.msg);
    json_decref(root);
    free(text);
}

/* Sizes in MiB (2^20 bytes) with two decimals, and the settings line: one replica says
 * nothing of data parallelism, two do. */
TG_TEST(test_plan_inspect_mib_and_replicas) {
    odd_plan s;
    build(&s);
    s.p.buckets = NULL, s.p.train.n_buckets = 1;
    s.p.pool_bytes[TG_POOL_ACTIVATIONS] = (uint64_t)3 << 29; /* 1536 MiB */
    s.p.peak_bytes = ((uint64_t)3 << 29) + 512;
    s.p.activation_live_peak = (uint64_t)1 << 20;
    s.p.train.replicas = 1, s.p.train.zero_stage = 0;
    tg_err err = {{0}};
    int rc = -1;
    char *text = inspect_text(&s.p, 0, &err, &rc);
    CHECK(text && rc == 0 && has(text, "\nactivations      1610612736 bytes      1536.00 MiB\n") &&
              has(text, "peak: 1610613248 bytes (1536.00 MiB)\n") &&
              has(text, "activation live peak: 1048576 bytes (1.00 MiB)\n") && !has(text, "data parallel") &&
              !has(text, "ZeRO"),
          "one replica: rc %d %s\n%s", rc, err.msg, text ? text : "");
    free(text);
    s.p.train.replicas = 2;
    text = inspect_text(&s.p, 0, &err, &rc);
    CHECK(text && rc == 0 && has(text, "  data parallel: 2 replicas") && !has(text, "ZeRO"), "two replicas:\n%s",
          text ? text : "");
    free(text);
}

/* Pruned backward ops without a frozen parameter (a plan file may say so): the line is
 * written, naming 0 frozen parameters; with neither, no line. */
TG_TEST(test_plan_inspect_pruned_ops_without_frozen) {
    odd_plan s;
    build(&s);
    s.t[3].flags = 0; /* no frozen parameter left */
    tg_err err = {{0}};
    int rc = -1;
    char *text = inspect_text(&s.p, 0, &err, &rc);
    CHECK(rc == 0 && has(text, "\nfreeze pruned: 7 backward ops, 2.5e+09 FLOPs (2.500 GFLOP) per step, beside no "
                               "gradient and no optimizer state for the 0 frozen parameters\n"),
          "rc %d: %s", rc, text ? text : err.msg);
    free(text);
    s.p.freeze_pruned_ops = 0;
    text = inspect_text(&s.p, 0, &err, &rc);
    CHECK(rc == 0 && text && !has(text, "freeze pruned"), "rc %d: %s", rc, text ? text : err.msg);
    free(text);
}

/* A stream that takes the JSON but not the newline after it. */
typedef struct capped_stream {
    size_t written, cap;
} capped_stream;

static ssize_t capped_write(void *cookie, const char *buf, size_t len) {
    capped_stream *c = cookie;
    if (c->written + len > c->cap) {
        errno = ENOSPC;
        return -1;
    }
    c->written += len;
    return (ssize_t)len;
}

TG_TEST(test_plan_inspect_json_newline_unwritable) {
    odd_plan s;
    build(&s);
    tg_err err = {{0}};
    int rc = -1;
    char *json = inspect_text(&s.p, 1, &err, &rc);
    REQUIRE(json && rc == 0, "%s", err.msg);
    capped_stream c = {0, strlen(json) - 1}; /* all but the closing newline */
    free(json);
    FILE *f = fopencookie(&c, "w", (cookie_io_functions_t){.write = capped_write});
    REQUIRE(f, "fopencookie");
    setvbuf(f, NULL, _IONBF, 0);
    rc = tg_plan_inspect(&s.p, f, 1, &err);
    fclose(f);
    CHECK(rc == -1 && !strcmp(err.msg, "inspect: cannot write the JSON output") && c.written == c.cap,
          "rc %d, '%s', %zu of %zu bytes written", rc, err.msg, c.written, c.cap);
}
