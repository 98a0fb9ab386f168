/* What the CPU executor refuses, each with its message: tensors an op names outside the
 * table or their pool, op and phase ranges outside the schedule, unknown kinds, pools or
 * worker threads it cannot have (runtime/cpu/cpu_exec.c); and what tg_executor_open
 * refuses (replicas without a communicator or rank, a communicator of another size,
 * malformed length buckets, CUDA in a CPU-only build), the device names, bucket checks
 * and the CPU's one step per start (runtime/executor.c). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/comm.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/executor.h"
#include "tests/harness.h"

/* Three 5-float activations: FILL t0 = 2, FILL t1 = 3.5 (forward), t2 = t0 + t1 (backward). */
typedef struct small_plan {
    tg_tensor t[3];
    tg_op ops[3];
    tg_plan plan;
} small_plan;

static void small_plan_init(small_plan *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 3; i++) {
        snprintf(s->t[i].name, sizeof s->t[i].name, "t%d", i);
        s->t[i].pool = TG_POOL_ACTIVATIONS, s->t[i].ndim = 1, s->t[i].shape[0] = 5;
        s->t[i].offset = (uint64_t)i * 256, s->t[i].bytes = 20;
    }
    s->ops[0] = tg_test_op(TG_OP_FILL), s->ops[1] = tg_test_op(TG_OP_FILL), s->ops[2] = tg_test_op(TG_OP_ADD);
    s->ops[0].out[0] = 0, s->ops[0].p.fill.value = 2.0f;
    s->ops[1].out[0] = 1, s->ops[1].p.fill.value = 3.5f;
    s->ops[2].in[0] = 0, s->ops[2].in[1] = 1, s->ops[2].out[0] = 2, s->ops[2].p.count.n = 5;
    s->ops[2].phase = TG_PHASE_BACKWARD;
    tg_plan *p = &s->plan;
    p->n_tensors = 3, p->tensors = s->t, p->n_ops = 3, p->ops = s->ops;
    p->phase_begin[0] = 0, p->phase_begin[1] = 2;
    for (int k = 2; k <= TG_PHASE_COUNT; k++) p->phase_begin[k] = 3;
    p->pool_bytes[TG_POOL_ACTIVATIONS] = 532;
    p->train.replicas = 1;
}

TG_TEST(test_cpu_exec_bind_refusals) {
    small_plan s;
    small_plan_init(&s);
    tg_cpu_exec x;
    tg_err err = {{0}};
    REQUIRE(tg_cpu_exec_init(&x, &s.plan, 1, &err) == 0, "init: %s", err.msg);
    /* Each case breaks the ADD (op 2) one way and is refused naming it. */
    static const struct {
        int slot_in1, slot_out0;   /* tensors for in[1] and out[0] */
        int t1_pool;               /* tensor 1's pool */
        uint64_t t1_offset, t1_bytes;
        const char *want;
    } cases[] = {
        {9, 2, TG_POOL_ACTIVATIONS, 256, 20, "op 2 (add): in[1] names tensor 9, outside the table of 3"},
        {-7, 2, TG_POOL_ACTIVATIONS, 256, 20, "op 2 (add): in[1] names tensor -7, outside the table of 3"},
        {1, 3, TG_POOL_ACTIVATIONS, 256, 20, "op 2 (add): out[0] names tensor 3, outside the table of 3"},
        {1, 2, -1, 256, 20, "op 2 (add): tensor 't1' (20 bytes at 256) lies outside the"},
        {1, 2, TG_POOL_COUNT, 256, 20, "op 2 (add): tensor 't1' (20 bytes at 256) lies outside the"},
        {1, 2, TG_POOL_ACTIVATIONS, 768, 20, "tensor 't1' (20 bytes at 768) lies outside the activations pool"},
        {1, 2, TG_POOL_ACTIVATIONS, 520, 20, "tensor 't1' (20 bytes at 520) lies outside the activations pool"},
        {1, 2, TG_POOL_ACTIVATIONS, 256, 277, "tensor 't1' (277 bytes at 256) lies outside the activations pool"},
        /* The params pool has no bytes and so no storage: a tensor with bytes there is outside. */
        {1, 2, TG_POOL_PARAMS, 0, 20, "tensor 't1' (20 bytes at 0) lies outside the params pool"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s.ops[2].in[1] = cases[i].slot_in1, s.ops[2].out[0] = cases[i].slot_out0;
        s.t[1].pool = cases[i].t1_pool, s.t[1].offset = cases[i].t1_offset, s.t[1].bytes = cases[i].t1_bytes;
        memset(&err, 0, sizeof err);
        CHECK(tg_cpu_exec_range(&x, 2, 3, &err) == -1 && strstr(err.msg, cases[i].want), "case %zu: '%s', want '%s'",
              i, err.msg, cases[i].want);
    }
    /* Bounds that just fit run: t1 ends exactly at the pool's end. */
    small_plan_init(&s);
    s.t[1].offset = 512;
    s.plan.tensors = s.t;
    CHECK(tg_cpu_exec_range(&x, 0, 3, &err) == 0, "a tensor ending at the pool's end: %s", err.msg);
    const float *c = tg_cpu_tensor(&x, 2);
    CHECK(c && c[0] == 5.5f && c[4] == 5.5f, "sum %g %g", c ? c[0] : -1, c ? c[4] : -1);
    /* An empty tensor in an empty pool binds to no storage. */
    s.t[1].pool = TG_POOL_PARAMS, s.t[1].offset = 0, s.t[1].bytes = 0, s.t[1].shape[0] = 0;
    s.ops[2] = tg_test_op(TG_OP_FILL);
    s.ops[2].out[0] = 1, s.ops[2].p.fill.value = 9, s.ops[2].phase = TG_PHASE_BACKWARD;
    CHECK(tg_cpu_exec_range(&x, 2, 3, &err) == 0, "an empty tensor of an empty pool: %s", err.msg);
    /* A pool the plan sizes but the executor never allocated (the plan changed since). */
    s.plan.pool_bytes[TG_POOL_GRADS] = 64;
    s.t[1].pool = TG_POOL_GRADS, s.t[1].shape[0] = 5, s.t[1].bytes = 20;
    CHECK(tg_cpu_exec_range(&x, 2, 3, &err) == -1 &&
              strstr(err.msg, "op 2 (fill): tensor 't1' (20 bytes at 0) lies outside the grads pool"),
          "an unallocated pool: %s", err.msg);
    tg_cpu_exec_free(&x);
    tg_cpu_exec_free(NULL);
}

TG_TEST(test_cpu_exec_range_and_tensor_refusals) {
    small_plan s;
    small_plan_init(&s);
    tg_cpu_exec x;
    tg_err err = {{0}};
    REQUIRE(tg_cpu_exec_init(&x, &s.plan, 1, &err) == 0, "init: %s", err.msg);
    static const struct { int first, last; } ranges[] = {{-1, 2}, {0, 4}, {2, 1}};
    for (int i = 0; i < 3; i++) {
        char want[128];
        snprintf(want, sizeof want, "cpu executor: op range [%d, %d) outside the schedule of 3 ops", ranges[i].first,
                 ranges[i].last);
        CHECK(tg_cpu_exec_range(&x, ranges[i].first, ranges[i].last, &err) == -1 && strstr(err.msg, want),
              "range [%d, %d): '%s'", ranges[i].first, ranges[i].last, err.msg);
    }
    CHECK(tg_cpu_exec_range(&x, 3, 3, &err) == 0 && tg_cpu_exec_range(&x, 0, 0, &err) == 0, "empty ranges: %s", err.msg);
    static const struct { int first, last; } phases[] = {{-1, 0}, {0, TG_PHASE_COUNT}, {2, 1}};
    for (int i = 0; i < 3; i++) {
        char want[128];
        snprintf(want, sizeof want, "cpu executor: phase range [%d, %d] is not within 0..%d", phases[i].first,
                 phases[i].last, TG_PHASE_COUNT - 1);
        CHECK(tg_cpu_exec_phases(&x, phases[i].first, phases[i].last, &err) == -1 && strstr(err.msg, want),
              "phases [%d, %d]: '%s'", phases[i].first, phases[i].last, err.msg);
    }
    CHECK(tg_cpu_exec_phases(&x, 0, TG_PHASE_COUNT - 1, &err) == 0, "every phase: %s", err.msg);
    s.ops[1].kind = -1;
    CHECK(tg_cpu_exec_range(&x, 1, 2, &err) == -1 && strstr(err.msg, "op 1: unknown op kind -1"), "kind -1: %s", err.msg);
    s.ops[1].kind = TG_OP_COUNT;
    char want[64];
    snprintf(want, sizeof want, "op 1: unknown op kind %d", TG_OP_COUNT);
    CHECK(tg_cpu_exec_range(&x, 1, 2, &err) == -1 && strstr(err.msg, want), "kind past the enum: %s", err.msg);
    s.ops[1].kind = TG_OP_FILL;
    /* tg_cpu_tensor: NULL outside the table, outside the pools, or in an empty pool. */
    CHECK(tg_cpu_tensor(&x, -1) == NULL && tg_cpu_tensor(&x, 3) == NULL, "outside the table");
    CHECK((uint8_t *)tg_cpu_tensor(&x, 1) == x.pool[TG_POOL_ACTIVATIONS] + 256, "tensor 1's address");
    s.t[1].pool = -1;
    CHECK(tg_cpu_tensor(&x, 1) == NULL, "pool -1");
    s.t[1].pool = TG_POOL_COUNT;
    CHECK(tg_cpu_tensor(&x, 1) == NULL, "pool past the enum");
    s.t[1].pool = TG_POOL_PARAMS;
    CHECK(tg_cpu_tensor(&x, 1) == NULL, "an empty pool");
    tg_cpu_exec_free(&x);
    CHECK(x.plan == NULL && tg_cpu_tensor(&x, 0) == NULL, "a freed executor still answers");
}

static int refuse_threads(pthread_attr_t *saved) {
    pthread_attr_t huge;
    if (pthread_getattr_default_np(saved) || pthread_attr_init(&huge)) return -1;
    int rc = pthread_attr_setstacksize(&huge, (size_t)1 << 60) || pthread_setattr_default_np(&huge);
    pthread_attr_destroy(&huge);
    return rc ? -1 : 0;
}

TG_TEST(test_cpu_exec_init_failures) {
    small_plan s;
    small_plan_init(&s);
    tg_cpu_exec x;
    tg_err err = {{0}};
    /* A pool whose size, rounded up to 64 bytes, would wrap around: refused, never allocated. */
    s.plan.pool_bytes[TG_POOL_GRADS] = UINT64_MAX - 10;
    CHECK(tg_cpu_exec_init(&x, &s.plan, 1, &err) == -1 && x.pool[TG_POOL_ACTIVATIONS] == NULL, "a pool of 2^64 - 11");
    char want[128];
    snprintf(want, sizeof want, "cpu executor: cannot allocate %llu bytes for the grads pool",
             (unsigned long long)(UINT64_MAX - 10));
    CHECK(strstr(err.msg, want) != NULL, "message: %s", err.msg);
    s.plan.pool_bytes[TG_POOL_GRADS] = 0;
    /* Out of memory for the pool, then for the worker threads' bookkeeping. */
    for (long k = 0; k < 3; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = tg_cpu_exec_init(&x, &s.plan, 3, &err);
        tg_alloc_fail_after(-1);
        const char *w = k == 0 ? "cpu executor: cannot allocate 532 bytes for the activations pool"
                               : "cpu executor: out of memory starting 3 worker threads";
        CHECK(rc == -1 && strstr(err.msg, w) && x.pool[TG_POOL_ACTIVATIONS] == NULL, "allocation %ld failing: '%s'", k,
              err.msg);
    }
    /* Threads refused: not out of memory, and said so. */
    pthread_attr_t saved;
    REQUIRE(refuse_threads(&saved) == 0, "cannot set the default thread attributes");
    memset(&err, 0, sizeof err);
    const int rc = tg_cpu_exec_init(&x, &s.plan, 2, &err);
    pthread_setattr_default_np(&saved);
    pthread_attr_destroy(&saved);
    CHECK(rc == -1 && strstr(err.msg, "cpu executor: cannot start 2 worker threads"), "threads refused: '%s'", err.msg);
}

TG_TEST(test_executor_names_and_buckets) {
    CHECK(tg_device_parse("cpu") == TG_DEVICE_CPU && tg_device_parse("cuda") == TG_DEVICE_CUDA, "device names");
    CHECK(tg_device_parse("gpu") == -1 && tg_device_parse("") == -1 && tg_device_parse("CPU") == -1, "unknown names");
    CHECK(tg_cuda_built() || tg_default_device() == TG_DEVICE_CPU, "a CPU-only build defaults to the CPU");
    small_plan s;
    small_plan_init(&s);
    tg_err err = {{0}};
    s.plan.train.n_buckets = 0;
    CHECK(tg_executor_bucket_count(&s.plan) == 1 && tg_executor_check_bucket(&s.plan, 0, &err) == 0, "no buckets");
    CHECK(tg_executor_check_bucket(&s.plan, 1, &err) == -1 &&
              strstr(err.msg, "length bucket 1 asked for: the plan has 1 (0 .. 0), it was compiled without seq_buckets"),
          "bucket 1 of 1: %s", err.msg);
    s.plan.train.n_buckets = 3;
    CHECK(tg_executor_bucket_count(&s.plan) == 3 && tg_executor_check_bucket(&s.plan, 2, &err) == 0, "3 buckets");
    memset(&err, 0, sizeof err);
    CHECK(tg_executor_check_bucket(&s.plan, -1, &err) == -1 && strstr(err.msg, "length bucket -1 asked for: the plan "
                                                                               "has 3 (0 .. 2)") &&
              !strstr(err.msg, "seq_buckets"),
          "bucket -1 of 3: %s", err.msg);
    CHECK(tg_executor_check_bucket(&s.plan, 3, &err) == -1 && strstr(err.msg, "bucket 3 asked for"), "bucket 3: %s",
          err.msg);
}

TG_TEST(test_executor_open_refusals) {
    small_plan s;
    small_plan_init(&s);
    tg_executor ex;
    tg_err err = {{0}};
    tg_executor_options o = {.device = TG_DEVICE_CUDA, .threads = 1};
    if (!tg_cuda_built()) /* a CUDA build opens it (the GPU suite's tests) */
        CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 && ex.vt == NULL &&
                  strstr(err.msg, "this build has no CUDA executor (build it with `make gpu`), use --device cpu"),
              "CUDA: %s", err.msg);
    o.device = TG_DEVICE_CPU;
    /* Data-parallel replicas need a communicator of their count and a rank inside it. */
    s.plan.train.replicas = 2;
    tg_cpu_comm_group *two, *three;
    REQUIRE(tg_cpu_comm_group_create(&two, 2, &err) == 0 && tg_cpu_comm_group_create(&three, 3, &err) == 0, "%s",
            err.msg);
    static const struct { int with_comm, rank; const char *want; } dp[] = {
        {0, 0, "the plan trains 2 data-parallel replicas: the executor needs a communicator and a rank in [0, 2) (rank 0, "
               "no communicator)"},
        {1, -1, "needs a communicator and a rank in [0, 2) (rank -1)"},
        {1, 2, "needs a communicator and a rank in [0, 2) (rank 2)"},
    };
    for (int i = 0; i < 3; i++) {
        o.comm = dp[i].with_comm ? two : NULL, o.rank = dp[i].rank;
        memset(&err, 0, sizeof err);
        CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 && strstr(err.msg, dp[i].want), "case %d: %s", i, err.msg);
        CHECK(dp[i].with_comm == 0 || !strstr(err.msg, "no communicator"), "case %d: %s", i, err.msg);
    }
    o.comm = three, o.rank = 1;
    CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 &&
              strstr(err.msg, "the plan trains 2 data-parallel replicas, the communicator joins 3"),
          "a communicator of 3: %s", err.msg);
    /* Fewer ranks than replicas is refused as more is. */
    tg_cpu_comm_group *one;
    REQUIRE(tg_cpu_comm_group_create(&one, 1, &err) == 0, "%s", err.msg);
    for (int rank = 0; rank < 2; rank++) {
        o.comm = one, o.rank = rank;
        memset(&err, 0, sizeof err);
        CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 && ex.vt == NULL &&
                  !strcmp(err.msg, "the plan trains 2 data-parallel replicas, the communicator joins 1"),
              "rank %d of a communicator of 1: %s", rank, err.msg);
    }
    tg_cpu_comm_group_destroy(one);
    o.comm = two, o.rank = 1;
    REQUIRE(tg_executor_open(&ex, &s.plan, &o, &err) == 0, "rank 1 of 2: %s", err.msg);
    CHECK(ex.device == TG_DEVICE_CPU && ex.plan == &s.plan && strcmp(ex.vt->name, "cpu") == 0, "the CPU executor");
    /* The CPU starts one step at a time; with no inputs pool there is nothing to copy, and
     * the step hands over the loss, lr and grad norm tensors' first values. */
    const void *batches[3] = {NULL, NULL, NULL};
    s.plan.io.loss = 0, s.plan.io.lr = 1, s.plan.io.grad_norm = 2;
    tg_step_result r;
    CHECK(ex.vt->step_start(ex.impl, batches, 1, &err) == 0 && ex.vt->step_wait(ex.impl, &r, &err) == 0, "step: %s",
          err.msg);
    CHECK(r.loss == 2.0f && r.lr == 3.5f && r.grad_norm == 5.5f && r.period_ms == -1.0f,
          "step result: loss %g lr %g norm %g period %g", r.loss, r.lr, r.grad_norm, r.period_ms);
    /* The phases' times (batch in place, forward, backward, optimizer) one after the other. */
    CHECK(r.phase_ms[0] >= 0 && r.phase_ms[1] >= 0 && r.phase_ms[2] >= 0 && r.phase_ms[3] >= 0 &&
              r.phase_ms[0] + r.phase_ms[1] + r.phase_ms[2] + r.phase_ms[3] < 60000,
          "phase times %g %g %g %g ms", r.phase_ms[0], r.phase_ms[1], r.phase_ms[2], r.phase_ms[3]);
    void *host = ex.vt->host_alloc(ex.impl, 0);
    CHECK(host != NULL, "host_alloc(0) gave NULL");
    ex.vt->host_free(ex.impl, host);
    CHECK(ex.vt->step_start(ex.impl, batches, 2, &err) == -1 &&
              strstr(err.msg, "the CPU executor runs one step per start, asked for 2"),
          "two steps: %s", err.msg);
    tg_executor_close(&ex);
    CHECK(ex.vt == NULL && ex.impl == NULL, "closed");
    tg_executor_close(&ex); /* closing twice is harmless */
    /* One replica: a communicator and a rank given are not looked at. */
    s.plan.train.replicas = 1;
    o.comm = three, o.rank = 7;
    CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == 0, "one replica, a communicator of 3: %s", err.msg);
    tg_executor_close(&ex);
    tg_cpu_comm_group_destroy(two);
    tg_cpu_comm_group_destroy(three);
    s.plan.train.replicas = 1;
    o.comm = NULL, o.rank = 0;

    /* Length buckets as plan.h says, or refused. */
    small_plan b[2];
    small_plan_init(&b[0]), small_plan_init(&b[1]);
    s.plan.buckets = NULL;
    s.plan.train.n_buckets = TG_MAX_BUCKETS + 1;
    char want[160];
    snprintf(want, sizeof want, "the plan has %d length buckets, more than the %d a plan may hold", TG_MAX_BUCKETS + 1,
             TG_MAX_BUCKETS);
    CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 && strstr(err.msg, want), "too many buckets: %s", err.msg);
    s.plan.train.n_buckets = 3;
    CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 &&
              strstr(err.msg, "the plan names 3 length buckets but holds no bucket plans"),
          "no bucket plans: %s", err.msg);
    tg_plan buckets[2] = {b[0].plan, b[1].plan};
    buckets[0].train.seq = 16, buckets[1].train.seq = 32;
    s.plan.buckets = buckets;
    buckets[1].n_tensors = 2;
    CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 &&
              strstr(err.msg, "length bucket 1 (seq 32) has 2 tensors and 3 ops, the plan 3 and 3"),
          "fewer tensors: %s", err.msg);
    buckets[1].n_tensors = 3, buckets[0].n_ops = 4;
    CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 &&
              strstr(err.msg, "length bucket 0 (seq 16) has 3 tensors and 4 ops, the plan 3 and 3"),
          "more ops: %s", err.msg);
    buckets[0].n_ops = 3, buckets[1].pool_bytes[TG_POOL_ACTIVATIONS] = 512;
    CHECK(tg_executor_open(&ex, &s.plan, &o, &err) == -1 &&
              strstr(err.msg, "length bucket 1 (seq 32): its activations pool is 512 bytes, the plan's 532 (one set of "
                              "pools serves every bucket)"),
          "a smaller pool: %s", err.msg);
    buckets[1].pool_bytes[TG_POOL_ACTIVATIONS] = 532;
    REQUIRE(tg_executor_open(&ex, &s.plan, &o, &err) == 0, "3 well-formed buckets: %s", err.msg);
    CHECK(tg_executor_select_bucket(&ex, 0, &err) == 0 && ((tg_cpu_exec *)ex.impl)->plan == &buckets[0], "bucket 0");
    CHECK(tg_executor_select_bucket(&ex, 2, &err) == 0 && ((tg_cpu_exec *)ex.impl)->plan == &s.plan, "bucket 2");
    CHECK(tg_executor_select_bucket(&ex, 3, &err) == -1 && strstr(err.msg, "length bucket 3 asked for"), "bucket 3: %s",
          err.msg);
    /* A profile stops at the op that fails. */
    double ms[3];
    s.ops[1].kind = TG_OP_COUNT;
    CHECK(ex.vt->profile(ex.impl, 1, ms, &err) == -1 && strstr(err.msg, "op 1: unknown op kind"), "profile: %s",
          err.msg);
    s.ops[1].kind = TG_OP_FILL;
    CHECK(ex.vt->profile(ex.impl, 2, ms, &err) == 0 && ms[0] >= 0 && ms[2] >= 0, "profile: %s", err.msg);
    tg_executor_close(&ex);
    /* Out of memory for the executor itself. */
    s.plan.train.n_buckets = 1, s.plan.buckets = NULL;
    tg_alloc_fail_after(0);
    const int rc = tg_executor_open(&ex, &s.plan, &o, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && strstr(err.msg, "out of memory opening the CPU executor"), "no memory: %s", err.msg);
}

/* tg_executor_open with each of its allocations failing alone: -1, out of memory, and no
 * executor; with none failing, it opens. */
TG_TEST(test_executor_open_out_of_memory) {
    small_plan s;
    small_plan_init(&s);
    const tg_executor_options o = {.device = TG_DEVICE_CPU, .threads = 2};
    tg_executor ex;
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    REQUIRE(tg_executor_open(&ex, &s.plan, &o, &err) == 0, "%s", err.msg);
    const long total = tg_alloc_fail_after(-1);
    tg_executor_close(&ex);
    REQUIRE(total >= 2, "%ld allocations", total);
    for (long k = 0; k < total; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_only(k);
        const int rc = tg_executor_open(&ex, &s.plan, &o, &err);
        tg_alloc_fail_after(-1);
        if (rc == 0) tg_executor_close(&ex);
        CHECK(rc == -1 && ex.vt == NULL && (strstr(err.msg, "out of memory") || strstr(err.msg, "cannot allocate")),
              "allocation %ld of %ld failing: rc %d, '%s'", k, total, rc, err.msg);
    }
}
