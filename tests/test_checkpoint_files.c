/* Checkpoints (runtime/checkpoint.c) beyond the format: refused fields and tensors, the
 * run's identity and how a resume compares it, writes that fail part way (a file-size
 * limit), the writer's stall hook, reading files that are not checkpoints, the checkpoint
 * folder's edge cases, and every allocation failing in turn. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/checkpoint.h"
#include "tests/harness.h"

/* ---- helpers ---------------------------------------------------------------------------- */

/* A checkpoint of two fields and one tensor "w" of n floats (i * 0.25) at `step`. */
static int make_ck(tg_checkpoint *ck, int32_t step, int64_t n, tg_err *err) {
    tg_checkpoint_init(ck);
    ck->state = (tg_checkpoint_state){.step = step, .total_steps = 100, .replicas = 1, .plan_fingerprint = 0xabc,
                                      .sampler_examples = 8, .sampler_pos = 2};
    float *w = malloc((size_t)n * sizeof *w);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* incompressible: a large one fills zstd's blocks */
        w[i] = n > 1000 ? (float)(x >> 40) : (float)i * 0.25f;
    }
    return tg_checkpoint_add_field(ck, "batch", "4", err) || tg_checkpoint_add_field(ck, "model", "tiny", err) ||
                   tg_checkpoint_add_tensor(ck, "w", -1, TG_F32, 1, (const int64_t[]){n}, w, err)
               ? -1
               : 0;
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Entries of dir whose name holds `part`. */
static int count_in(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

typedef int (*attempt_fn)(void *ctx, tg_err *err);

/* Counts the allocations of a successful attempt, then fails each in turn: the attempt must
 * return -1 naming the memory it lacked (`alt`, when not NULL, is another accepted wording),
 * or succeed where `may_succeed` (failures the code tolerates: pruning old files). Returns
 * the count. */
static long fail_each(const char *what, attempt_fn fn, void *ctx, const char *alt, int may_succeed) {
    tg_err err = {{0}};
    tg_alloc_fail_after(-1);
    if (!CHECK(fn(ctx, &err) == 0, "%s: %s", what, err.msg)) return 0;
    const long total = tg_alloc_fail_after(-1);
    int bad = 0;
    for (long k = 0; k < total && bad < 5; k++) {
        memset(&err, 0, sizeof err);
        tg_alloc_fail_after(k);
        const int rc = fn(ctx, &err);
        tg_alloc_fail_after(-1);
        const int ok = rc == -1 ? strstr(err.msg, "out of memory") || (alt && strstr(err.msg, alt))
                                : rc == 0 && may_succeed;
        bad += !ok;
        CHECK(ok, "%s: allocation %ld of %ld failing: rc %d, '%s'", what, k, total, rc, err.msg);
    }
    return total;
}

/* ---- fields and tensors ------------------------------------------------------------------ */

TG_TEST(test_checkpoint_add_refusals) {
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    tg_err err;
    char long_key[TG_CHECKPOINT_KEY_MAX + 1], long_value[TG_PATH_MAX + 1], long_name[TG_NAME_MAX + 1];
    memset(long_key, 'k', sizeof long_key - 1), long_key[sizeof long_key - 1] = 0;
    memset(long_value, 'v', sizeof long_value - 1), long_value[sizeof long_value - 1] = 0;
    memset(long_name, 'n', sizeof long_name - 1), long_name[sizeof long_name - 1] = 0;
    long_key[TG_CHECKPOINT_KEY_MAX - 1] = 0; /* 63 characters: the longest allowed */
    CHECK(tg_checkpoint_add_field(&ck, long_key, "1", &err) == 0, "a 63-character key: %s", err.msg);
    long_key[TG_CHECKPOINT_KEY_MAX - 1] = 'k';
    long_value[TG_PATH_MAX - 1] = 0;
    CHECK(tg_checkpoint_add_field(&ck, "v", long_value, &err) == 0, "a 511-character value: %s", err.msg);
    long_value[TG_PATH_MAX - 1] = 'v';
    const struct {
        const char *key, *value;
    } fields[] = {{"", "1"}, {long_key, "1"}, {"x", long_value}};
    for (size_t k = 0; k < 3; k++) {
        char want[200];
        snprintf(want, sizeof want, "checkpoint: identity field '%.80s' is empty or too long", fields[k].key);
        CHECK(tg_checkpoint_add_field(&ck, fields[k].key, fields[k].value, &err) == -1 && !strcmp(err.msg, want),
              "field %zu: %s", k, err.msg);
    }
    CHECK(ck.n_fields == 2, "%d fields", ck.n_fields);

    const int64_t ok_shape[2] = {2, 3}, negative[2] = {2, -1}, huge[2] = {INT64_C(1) << 62, 4};
    const struct {
        const char *name;
        int replica, dtype, ndim;
        const int64_t *shape;
    } tensors[] = {
        {"", -1, TG_F32, 2, ok_shape},         {long_name, -1, TG_F32, 2, ok_shape},
        {"t", -2, TG_F32, 2, ok_shape},        {"t", -1, -1, 2, ok_shape},
        {"t", -1, TG_DTYPE_COUNT, 2, ok_shape}, {"t", -1, TG_F32, -1, ok_shape},
        {"t", -1, TG_F32, TG_MAX_DIMS + 1, ok_shape}, {"t", -1, TG_F32, 2, negative},
        {"t", -1, TG_F32, 2, huge},
    };
    for (size_t k = 0; k < sizeof tensors / sizeof tensors[0]; k++) {
        char want[200];
        snprintf(want, sizeof want, "checkpoint: tensor '%.100s' has a bad name, replica, dtype or shape",
                 tensors[k].name);
        /* the block is the checkpoint's to free, also when refused (ASan: no leak) */
        CHECK(tg_checkpoint_add_tensor(&ck, tensors[k].name, tensors[k].replica, tensors[k].dtype, tensors[k].ndim,
                                       tensors[k].shape, malloc(24), &err) == -1 &&
                  !strcmp(err.msg, want),
              "tensor %zu: %s", k, err.msg);
    }
    CHECK(ck.n_tensors == 0 && ck.n_blocks == 0, "%d tensors kept", ck.n_tensors);
    CHECK(tg_checkpoint_add_tensor(&ck, "t", 0, TG_BF16, 2, ok_shape, malloc(12), &err) == 0 && ck.n_tensors == 1 &&
              ck.tensors[0].bytes == 12 && tg_checkpoint_find(&ck, "t", 0) && !tg_checkpoint_find(&ck, "t", 1),
          "a bf16 [2, 3] tensor: %s", err.msg);
    tg_checkpoint_free(&ck);
}

static int add_two_tensors(void *ctx, tg_err *err) {
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    const int rc = tg_checkpoint_add_tensor(&ck, "a", -1, TG_F32, 1, (const int64_t[]){2}, malloc(8), err) ||
                   tg_checkpoint_add_tensor(&ck, "b", 0, TG_I32, 1, (const int64_t[]){1}, malloc(4), err);
    tg_checkpoint_free(&ck);
    return rc ? -1 : 0;
}

/* Replica 1's two tensors moved into a checkpoint that has one. */
static int take_two(void *ctx, tg_err *err) {
    tg_checkpoint to, from;
    tg_checkpoint_init(&to), tg_checkpoint_init(&from);
    tg_alloc_fail_after(-1);
    long saved = *(long *)ctx;
    tg_err setup;
    if (tg_checkpoint_add_tensor(&to, "a", -1, TG_F32, 1, (const int64_t[]){2}, malloc(8), &setup) ||
        tg_checkpoint_add_tensor(&from, "m", 1, TG_F32, 1, (const int64_t[]){2}, malloc(8), &setup) ||
        tg_checkpoint_add_tensor(&from, "v", 1, TG_F32, 1, (const int64_t[]){2}, malloc(8), &setup))
        return tg_fail(err, "setup: %s", setup.msg);
    tg_alloc_fail_after(saved); /* only take_tensors' allocations are counted and failed */
    int rc = tg_checkpoint_take_tensors(&to, &from, err);
    if (!rc && (to.n_tensors != 3 || !tg_checkpoint_find(&to, "v", 1) || from.n_tensors != 0 || from.n_blocks != 0))
        rc = tg_fail(err, "moved wrongly: %d tensors", to.n_tensors);
    tg_checkpoint_free(&to), tg_checkpoint_free(&from);
    return rc;
}

TG_TEST(test_checkpoint_add_out_of_memory) {
    fail_each("two tensors added", add_two_tensors, NULL, NULL, 0);
    /* take_tensors: its 4 allocations (two tensor slots, two block slots), each failing. */
    for (long k = 0; k < 4; k++) {
        tg_err err = {{0}};
        const int rc = take_two(&k, &err);
        tg_alloc_fail_after(-1);
        CHECK(rc == -1 && (strstr(err.msg, k < 2 ? "checkpoint: out of memory moving tensor '"
                                                 : "checkpoint: out of memory moving 2 tensor blocks")),
              "allocation %ld of take_tensors failing: rc %d, '%s'", k, rc, err.msg);
    }
    long all = -1;
    tg_err err = {{0}};
    CHECK(take_two(&all, &err) == 0, "%s", err.msg);
    tg_alloc_fail_after(-1);
}

/* ---- the run's identity ----------------------------------------------------------------- */

static const tg_checkpoint_run k_run = {.total_steps = 12, .train_examples = 40, .train_hash = 0xfeed};

/* Sets field `key` of ck to `value` (which must be there). */
static void set_field(tg_checkpoint *ck, const char *key, const char *value) {
    for (int i = 0; i < ck->n_fields; i++)
        if (!strcmp(ck->fields[i].key, key)) snprintf(ck->fields[i].value, sizeof ck->fields[i].value, "%s", value);
}

/* Without a schedule or update op the identity has no optimizer fields; a training file
 * that does not resolve is named as given, one that does by its real path. */
TG_TEST(test_checkpoint_identify_fields) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_err err;
    tg_checkpoint ck;
    const char *dir = tg_test_tmpdir();
    char data[700], real[4096];
    snprintf(data, sizeof data, "%s/./train.jsonl", dir);
    REQUIRE(tg_test_write_file(data, "{}\n") == 0 && realpath(data, real), "the data file");
    snprintf(p.run.train_data, sizeof p.run.train_data, "%s", data);
    tg_checkpoint_init(&ck);
    REQUIRE(tg_checkpoint_identify(&ck, &p, &k_run, &err) == 0, "%s", err.msg);
    const char *v = tg_checkpoint_field_value(&ck, "train_data");
    CHECK(v && !strcmp(v, real), "train_data %s, expected %s", v ? v : "(none)", real);
    v = tg_checkpoint_field_value(&ck, "lr");
    CHECK(v && tg_checkpoint_field_value(&ck, "warmup_steps") && tg_checkpoint_field_value(&ck, "grad_clip"),
          "optimizer fields missing");
    v = tg_checkpoint_field_value(&ck, "total_steps");
    CHECK(v && !strcmp(v, "12"), "total_steps %s", v ? v : "(none)");
    v = tg_checkpoint_field_value(&ck, "train_data.xxh64");
    CHECK(v && !strcmp(v, "000000000000feed"), "train_data.xxh64 %s", v ? v : "(none)");
    const int with_optimizer = ck.n_fields;
    tg_checkpoint_free(&ck);

    snprintf(p.run.train_data, sizeof p.run.train_data, "%s", "no/such/train.jsonl");
    const int n_ops = p.n_ops;
    p.n_ops = 0;
    tg_checkpoint_init(&ck);
    REQUIRE(tg_checkpoint_identify(&ck, &p, &k_run, &err) == 0, "%s", err.msg);
    p.n_ops = n_ops;
    v = tg_checkpoint_field_value(&ck, "train_data");
    CHECK(v && !strcmp(v, "no/such/train.jsonl"), "train_data %s", v ? v : "(none)");
    CHECK(!tg_checkpoint_field_value(&ck, "lr") && !tg_checkpoint_field_value(&ck, "warmup_steps") &&
              !tg_checkpoint_field_value(&ck, "lr_schedule") &&
              !tg_checkpoint_field_value(&ck, "beta1") && !tg_checkpoint_field_value(&ck, "grad_clip"),
          "optimizer fields without the ops");
    CHECK(ck.n_fields == with_optimizer - 9, "%d fields without the optimizer's, %d with", ck.n_fields,
          with_optimizer);
    tg_checkpoint_free(&ck);
    tg_plan_free(&p);
}

/* A resume compares every field: equal passes; paths (info) alone may differ; every other
 * difference is listed, fields on one side only as "(none)", the list cut short when long. */
TG_TEST(test_checkpoint_identity_differences) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_err err;
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    REQUIRE(tg_checkpoint_identify(&ck, &p, &k_run, &err) == 0, "%s", err.msg);
    CHECK(tg_checkpoint_check_identity(&ck, &p, &k_run, "ck", &err) == 0, "the same run: %s", err.msg);
    set_field(&ck, "model", "elsewhere/tiny-bert");
    set_field(&ck, "plan.fingerprint", "0000000000000001");
    CHECK(tg_checkpoint_check_identity(&ck, &p, &k_run, "ck", &err) == 0, "paths and fingerprint only: %s",
          err.msg);
    tg_checkpoint plain;
    tg_checkpoint_init(&plain);
    REQUIRE(tg_checkpoint_identify(&plain, &p, &k_run, &err) == 0, "%s", err.msg);
    set_field(&plain, "seq", "64");
    CHECK(tg_checkpoint_check_identity(&plain, &p, &k_run, "ck", &err) == -1 &&
              !strcmp(err.msg, "ck: the checkpoint is of another job or plan: seq: 64 in the checkpoint, 16 now; resume "
                               "with the job it was written by, or start afresh"),
          "seq alone: %s", err.msg);
    tg_checkpoint_free(&plain);
    set_field(&ck, "batch", "9");
    CHECK(tg_checkpoint_check_identity(&ck, &p, &k_run, "ck", &err) == -1 &&
              strstr(err.msg, "ck: the checkpoint is of another job or plan: batch: 9 in the checkpoint, 2 now (besides, "
                              "model: elsewhere/tiny-bert in the checkpoint, ") &&
              strstr(err.msg, "; plan.fingerprint: 0000000000000001 in the checkpoint, ") &&
              strstr(err.msg, "); resume with the job it was written by, or start afresh") &&
              !strstr(err.msg, "plan.structure"),
          "batch and the paths: %s", err.msg);
    /* One field only in the checkpoint, one only in this run, and the plan's structure. */
    tg_checkpoint other;
    tg_checkpoint_init(&other);
    for (int i = 0; i < ck.n_fields; i++)
        if (strcmp(ck.fields[i].key, "seed"))
            tg_checkpoint_add_field(&other, ck.fields[i].key, ck.fields[i].value, &err);
    set_field(&other, "batch", "2");
    set_field(&other, "model", p.model.source);
    set_field(&other, "plan.structure", "0123456789abcdef");
    tg_checkpoint_add_field(&other, "color", "red", &err);
    CHECK(tg_checkpoint_check_identity(&other, &p, &k_run, "ck", &err) == -1 &&
              strstr(err.msg, "ck: the checkpoint is of another job or plan: seed: (none) in the checkpoint, 42 now; "
                              "plan.structure: 0123456789abcdef in the checkpoint, ") &&
              strstr(err.msg, "; color: red in the checkpoint, (none) now (besides, plan.fingerprint: ") &&
              strstr(err.msg, "(plan.structure: the plan's tensors or ops differ"),
          "one-sided fields: %s", err.msg);
    tg_checkpoint_free(&other);
    /* Every field different: the list stops at its room, whole notes first. */
    for (int i = 0; i < ck.n_fields; i++) memset(ck.fields[i].value, 'x', 200), ck.fields[i].value[200] = 0;
    CHECK(tg_checkpoint_check_identity(&ck, &p, &k_run, "ck", &err) == -1 &&
              strstr(err.msg, "ck: the checkpoint is of another job or plan: tunegraph: xxxx") &&
              strstr(err.msg, "; model.arch: xxx") && !strstr(err.msg, "; seed:") && !strstr(err.msg, "; grad_clip:"),
          "every field: %s", err.msg);
    tg_checkpoint_free(&ck);
    tg_plan_free(&p);
}

typedef struct identity_ctx {
    tg_plan *plan;
    tg_checkpoint *ck;
} identity_ctx;

static int identify_attempt(void *ctx, tg_err *err) {
    identity_ctx *c = ctx;
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    const int rc = tg_checkpoint_identify(&ck, c->plan, &k_run, err);
    tg_checkpoint_free(&ck);
    return rc;
}

static int check_identity_attempt(void *ctx, tg_err *err) {
    identity_ctx *c = ctx;
    return tg_checkpoint_check_identity(c->ck, c->plan, &k_run, "ck", err);
}

TG_TEST(test_checkpoint_identity_out_of_memory) {
    tg_plan p;
    if (!tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, &p)) return;
    tg_checkpoint ck;
    tg_checkpoint_init(&ck);
    tg_err err;
    REQUIRE(tg_checkpoint_identify(&ck, &p, &k_run, &err) == 0, "%s", err.msg);
    identity_ctx c = {&p, &ck};
    CHECK(fail_each("identify", identify_attempt, &c, NULL, 0) >= 8, "identify allocates too little");
    fail_each("check identity", check_identity_attempt, &c, NULL, 0);
    tg_checkpoint_free(&ck);
    tg_plan_free(&p);
}

/* ---- writing ---------------------------------------------------------------------------- */

/* A file-size limit makes the header's write (limit 10 bytes), a payload write (a tensor of
 * 1 MiB past a 100 000-byte limit) or the stall hook's flush (limit 64: the header alone)
 * fail: refused naming the file and the cause, nothing left at the path or beside it; the
 * stall hook waits for no signal on a write that failed. */
TG_TEST(test_checkpoint_write_file_too_large) {
    const char *dir = tg_test_tmpdir();
    char path[700];
    snprintf(path, sizeof path, "%s/step-000005.tgckpt", dir);
    tg_checkpoint small, big;
    tg_err err;
    REQUIRE(make_ck(&small, 5, 6, &err) == 0 && make_ck(&big, 5, 1 << 18, &err) == 0, "%s", err.msg);
    struct rlimit saved;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &saved) == 0, "getrlimit");
    void (*old)(int) = signal(SIGXFSZ, SIG_IGN);
    const struct {
        const tg_checkpoint *ck;
        rlim_t limit;
    } cases[] = {{&small, 10}, {&big, 100000}, {&small, 64}};
    setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", "5", 1);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct rlimit lim = saved;
        lim.rlim_cur = cases[k].limit;
        REQUIRE(setrlimit(RLIMIT_FSIZE, &lim) == 0, "setrlimit");
        const int rc = tg_checkpoint_write(cases[k].ck, path, &err);
        setrlimit(RLIMIT_FSIZE, &saved);
        char want[800];
        snprintf(want, sizeof want, "%s: cannot write the checkpoint (write: %s)", path, strerror(EFBIG));
        CHECK(rc == -1 && !strcmp(err.msg, want), "limit %llu: rc %d, '%s'", (unsigned long long)cases[k].limit, rc,
              err.msg);
        CHECK(!exists(path) && count_in(dir, ".tmp.") == 0, "limit %llu: files left", (unsigned long long)cases[k].limit);
    }
    unsetenv("TUNEGRAPH_TEST_CHECKPOINT_STALL");
    signal(SIGXFSZ, old);
    /* Without the limit, the same write succeeds and reads back. */
    CHECK(tg_checkpoint_write(&big, path, &err) == 0, "%s", err.msg);
    tg_checkpoint back;
    CHECK(tg_checkpoint_read(path, &back, &err) == 0 && back.n_tensors == 1 && back.tensors[0].bytes == 4u << 18 &&
              !memcmp(back.tensors[0].data, big.tensors[0].data, 4u << 18),
          "read back: %s", err.msg);
    tg_checkpoint_free(&back);
    /* A folder that does not exist. */
    snprintf(path, sizeof path, "%s/no/such/folder/c.tgckpt", dir);
    CHECK(tg_checkpoint_write(&small, path, &err) == -1 && strstr(err.msg, path) == err.msg &&
              strstr(err.msg, "cannot create the checkpoint"),
          "%s", err.msg);
    tg_checkpoint_free(&small), tg_checkpoint_free(&big);
}

typedef struct stall_run {
    const tg_checkpoint *ck;
    const char *path;
    tg_err err;
    int rc;
    volatile int done;
} stall_run;

static void *write_in_thread(void *arg) {
    stall_run *s = arg;
    s->rc = tg_checkpoint_write(s->ck, s->path, &s->err);
    s->done = 1;
    return NULL;
}

static void on_signal(int sig) { (void)sig; }

/* TUNEGRAPH_TEST_CHECKPOINT_STALL=<step> stops the writer after the first tensor until a
 * signal comes, the part written so far on disk and the checkpoint not yet at its path; it
 * goes on after, and the file is whole. Another step, or the variable empty, does not stall. */
TG_TEST(test_checkpoint_write_stall_hook) {
    const char *dir = tg_test_tmpdir();
    char path[700], log[700];
    snprintf(path, sizeof path, "%s/step-000007.tgckpt", dir);
    snprintf(log, sizeof log, "%s/stderr.txt", dir);
    tg_checkpoint ck;
    tg_err err;
    REQUIRE(make_ck(&ck, 7, 6, &err) == 0, "%s", err.msg);
    setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", "", 1);
    CHECK(tg_checkpoint_write(&ck, path, &err) == 0, "an empty variable: %s", err.msg);
    setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", "8", 1);
    CHECK(tg_checkpoint_write(&ck, path, &err) == 0, "another step: %s", err.msg);
    unlink(path);

    struct sigaction sa = {.sa_handler = on_signal}, old_sa;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_sa);
    fflush(stderr);
    const int saved_stderr = dup(2), logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(logfd, 2);
    close(logfd);
    setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", "7", 1);
    stall_run s = {.ck = &ck, .path = path};
    pthread_t t;
    pthread_create(&t, NULL, write_in_thread, &s);
    int polls = 0, seen_part = 0;
    /* Signal until the writer is done: a signal before its wait is handled and it waits on,
     * a later one ends the wait. */
    for (; !s.done && polls < 500; polls++) {
        usleep(10000);
        seen_part |= count_in(dir, "step-000007.tgckpt.tmp.") == 1 && !exists(path);
        if (polls >= 5) pthread_kill(t, SIGTERM);
    }
    pthread_join(t, NULL);
    fflush(stderr);
    dup2(saved_stderr, 2);
    close(saved_stderr);
    unsetenv("TUNEGRAPH_TEST_CHECKPOINT_STALL");
    sigaction(SIGTERM, &old_sa, NULL);
    CHECK(s.rc == 0, "the stalled write: %s", s.err.msg);
    CHECK(seen_part && polls >= 5, "the part-written file was not seen (%d polls)", polls);
    char *text = tg_test_read_file(log, NULL);
    char want[800];
    snprintf(want, sizeof want, "tunegraph: %s: stalled part-written (TUNEGRAPH_TEST_CHECKPOINT_STALL), waiting for a "
                                "signal\n", path);
    CHECK(text && !strcmp(text, want), "stderr: '%s'", text ? text : "(none)");
    free(text);
    tg_checkpoint back;
    CHECK(tg_checkpoint_read(path, &back, &err) == 0 && back.state.step == 7 && back.n_tensors == 1 &&
              !memcmp(back.tensors[0].data, ck.tensors[0].data, 24),
          "after the stall: %s", err.msg);
    tg_checkpoint_free(&back);
    CHECK(count_in(dir, ".tmp.") == 0, "temporary files left");
    tg_checkpoint_free(&ck);
}

typedef struct encode_ctx {
    tg_checkpoint ck;
} encode_ctx;

static int encode_attempt(void *ctx, tg_err *err) {
    uint8_t *bytes;
    size_t len;
    if (tg_checkpoint_encode(&((encode_ctx *)ctx)->ck, &bytes, &len, err)) return -1;
    free(bytes);
    return 0;
}

/* Encoding 1 MiB of incompressible floats grows its buffer several times; each allocation
 * failing is refused as "checkpoint encode: out of memory ...". */
TG_TEST(test_checkpoint_encode_out_of_memory) {
    encode_ctx c;
    tg_err err;
    REQUIRE(make_ck(&c.ck, 3, 1 << 18, &err) == 0, "%s", err.msg);
    const long n = fail_each("encode", encode_attempt, &c, NULL, 0);
    CHECK(n >= 4, "%ld allocations: the buffer did not grow", n);
    tg_alloc_fail_after(0);
    uint8_t *bytes = NULL;
    size_t len = 1;
    const int rc = tg_checkpoint_encode(&c.ck, &bytes, &len, &err);
    tg_alloc_fail_after(1);
    const int rc1 = tg_checkpoint_encode(&c.ck, &bytes, &len, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && rc1 == -1 && !bytes && len == 0 &&
              !strcmp(err.msg, "checkpoint encode: out of memory for the compression buffer"),
          "the compression buffer: %s", err.msg);
    tg_checkpoint_free(&c.ck);
}

/* ---- reading ---------------------------------------------------------------------------- */

static int read_attempt(void *ctx, tg_err *err) {
    tg_checkpoint ck;
    if (tg_checkpoint_read(ctx, &ck, err)) return -1;
    tg_checkpoint_free(&ck);
    return 0;
}

TG_TEST(test_checkpoint_read_refusals) {
    const char *dir = tg_test_tmpdir();
    tg_checkpoint ck;
    tg_err err;
    char path[700], want[800];
    snprintf(path, sizeof path, "%s/none.tgckpt", dir);
    snprintf(want, sizeof want, "%s: cannot open the checkpoint: %s", path, strerror(ENOENT));
    CHECK(tg_checkpoint_read(path, &ck, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);
    snprintf(want, sizeof want, "%s: not a checkpoint file", dir);
    CHECK(tg_checkpoint_read(dir, &ck, &err) == -1 && !strcmp(err.msg, want), "a folder: %s", err.msg);
    /* A file shorter than its stated size (sysfs states 4096): what it holds is decoded,
     * whatever errno held before. */
    static const char *const sysfs[] = {"/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state",
                                        "/sys/kernel/profiling"};
    for (size_t k = 0; k < sizeof sysfs / sizeof sysfs[0]; k++) {
        struct stat st;
        if (stat(sysfs[k], &st) || !S_ISREG(st.st_mode) || st.st_size != 4096 || access(sysfs[k], R_OK)) continue;
        errno = ENOENT;
        snprintf(want, sizeof want, "%s: not a tunegraph checkpoint (header field 'magic')", sysfs[k]);
        CHECK(tg_checkpoint_read(sysfs[k], &ck, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);
        break;
    }
    tg_checkpoint small;
    REQUIRE(make_ck(&small, 2, 6, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/c.tgckpt", dir);
    REQUIRE(tg_checkpoint_write(&small, path, &err) == 0, "%s", err.msg);
    tg_checkpoint_free(&small);
    fail_each("read", read_attempt, path, NULL, 0);
    tg_alloc_fail_after(0);
    const int rc = tg_checkpoint_read(path, &ck, &err);
    tg_alloc_fail_after(-1);
    struct stat st;
    stat(path, &st);
    snprintf(want, sizeof want, "%s: out of memory for %lld bytes", path, (long long)st.st_size);
    CHECK(rc == -1 && !strcmp(err.msg, want), "%s", err.msg);
}

/* ---- the folder ------------------------------------------------------------------------- */

TG_TEST(test_checkpoint_dir_prepare_refusals) {
    const char *dir = tg_test_tmpdir();
    tg_err err;
    char file[700], path[800], want[1000];
    snprintf(file, sizeof file, "%s/plain", dir);
    REQUIRE(tg_test_write_file(file, "x") == 0, "file");
    CHECK(tg_checkpoint_dir_prepare("", &err) == -1 && !strcmp(err.msg, "checkpoint folder: the name is empty"), "%s",
          err.msg);
    snprintf(path, sizeof path, "%s/a/b", file);
    snprintf(want, sizeof want, "%s: cannot create the checkpoint folder: %s", path, strerror(ENOTDIR));
    CHECK(tg_checkpoint_dir_prepare(path, &err) == -1 && !strcmp(err.msg, want), "under a file: %s", err.msg);
    snprintf(want, sizeof want, "%s: the checkpoint folder is not a folder", file);
    CHECK(tg_checkpoint_dir_prepare(file, &err) == -1 && !strcmp(err.msg, want), "a file: %s", err.msg);
    snprintf(path, sizeof path, "%s/new/deeper/", dir);
    CHECK(tg_checkpoint_dir_prepare(path, &err) == 0 && tg_checkpoint_dir_prepare(path, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/new/deeper", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode), "%s not made", path);
    /* A folder this process cannot write into: a read-only one, or (as root, whom
     * permissions do not stop) a read-only mount. */
    snprintf(path, sizeof path, "%s/readonly", dir);
    mkdir(path, 0555);
    const char *ro = geteuid() != 0 ? path : access("/proc/sys", W_OK) != 0 ? "/proc/sys" : NULL;
    if (ro) {
        CHECK(tg_checkpoint_dir_prepare(ro, &err) == -1 && strstr(err.msg, ro) == err.msg &&
                  strstr(err.msg, ": cannot write into the checkpoint folder: "),
              "%s: %s", ro, err.msg);
    }
    tg_alloc_fail_after(0);
    const int rc = tg_checkpoint_dir_prepare(dir, &err);
    tg_alloc_fail_after(-1);
    snprintf(want, sizeof want, "checkpoint folder %s: out of memory", dir);
    CHECK(rc == -1 && !strcmp(err.msg, want), "%s", err.msg);
}

typedef struct save_ctx {
    const char *dir;
    tg_checkpoint ck;
} save_ctx;

/* step-000001 in the folder, then step 2 saved keeping 1: the path of step 2. */
static int save_counted(void *ctx, tg_err *err) {
    save_ctx *c = ctx;
    char old[800], *path = NULL;
    snprintf(old, sizeof old, "%s/step-000001.tgckpt", c->dir);
    int fd = open(old, O_WRONLY | O_CREAT, 0644); /* no allocation */
    if (fd >= 0) close(fd);
    const int rc = tg_checkpoint_save_in_dir(&c->ck, c->dir, 1, &path, err);
    if (!rc && (!path || !strstr(path, "/step-000002.tgckpt"))) return free(path), tg_fail(err, "path %s", path);
    free(path);
    return rc;
}

/* Saving: each allocation failing refuses the save naming the memory, except those of the
 * pruning and temporary-file sweep after the new checkpoint is on disk, which leave old
 * files for the next save. The folder as a file, or a checkpoint's name taken by a folder,
 * is refused. */
TG_TEST(test_checkpoint_save_refusals) {
    const char *dir = tg_test_tmpdir();
    save_ctx c = {.dir = dir};
    tg_err err;
    REQUIRE(make_ck(&c.ck, 2, 6, &err) == 0, "%s", err.msg);
    fail_each("save", save_counted, &c, "Cannot allocate memory", 1);
    char latest[800];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    CHECK(save_counted(&c, &err) == 0, "the save after: %s", err.msg);
    char *text = tg_test_read_file(latest, NULL);
    CHECK(text && !strcmp(text, "step-000002.tgckpt\n"), "latest: %s", text ? text : "(none)");
    free(text);
    CHECK(count_in(dir, ".tgckpt") == 1 && count_in(dir, ".tmp.") == 0, "%d checkpoints, %d temporary files",
          count_in(dir, ".tgckpt"), count_in(dir, ".tmp."));

    char file[700], want[1000];
    snprintf(file, sizeof file, "%s/plain", dir);
    REQUIRE(tg_test_write_file(file, "x") == 0, "file");
    snprintf(want, sizeof want, "%s: cannot list the checkpoint folder: %s", file, strerror(ENOTDIR));
    CHECK(tg_checkpoint_save_in_dir(&c.ck, file, 1, NULL, &err) == -1 && !strcmp(err.msg, want), "%s", err.msg);
    int32_t newest = 5;
    CHECK(tg_checkpoint_dir_newest(file, &newest) == -1 && newest == -1, "newest of a file: %d", newest);
    tg_checkpoint_free(&c.ck);

    /* step-000003.tgckpt is a folder: the write fails, `latest` still names step 2, nothing pruned. */
    char taken[800];
    snprintf(taken, sizeof taken, "%s/step-000003.tgckpt", dir);
    mkdir(taken, 0755);
    snprintf(taken, sizeof taken, "%s/step-000003.tgckpt/inside", dir);
    tg_test_write_file(taken, "x");
    REQUIRE(make_ck(&c.ck, 3, 6, &err) == 0, "%s", err.msg);
    CHECK(tg_checkpoint_save_in_dir(&c.ck, dir, 1, NULL, &err) == -1 && strstr(err.msg, "step-000003.tgckpt"), "%s",
          err.msg);
    text = tg_test_read_file(latest, NULL);
    CHECK(text && !strcmp(text, "step-000002.tgckpt\n") && count_in(dir, "step-000002.tgckpt") == 1,
          "after a failed save: latest %s", text ? text : "(none)");
    free(text);
    tg_checkpoint_free(&c.ck);
}

/* Names that are not checkpoints are passed over; temporary files go only when their
 * writer is gone and they belong to a checkpoint or `latest`. */
TG_TEST(test_checkpoint_folder_names) {
    const char *dir = tg_test_tmpdir();
    tg_err err;
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char name[200];
    const char *plain[] = {"step-abc.tgckpt", "step-.tgckpt", "step-3000000000.tgckpt",
                           "step-99999999999999999999999.tgckpt", "step-5.tgckpt.bak", "stop-6.tgckpt",
                           "step-3.tgckpt", "step-000003.tgckpt", "notes.tmp.1.0", "latest.tmp.0.0",
                           "latest.tmp.12x", "step-000001.tgckpt.tmp.1.0"};
    for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
        char path[900];
        snprintf(path, sizeof path, "%s/%s", dir, plain[k]);
        tg_test_write_file(path, "x");
    }
    char own[900], gone[900];
    snprintf(own, sizeof own, "%s/latest.tmp.%d.0", dir, (int)getpid());
    snprintf(gone, sizeof gone, "%s/step-000002.tgckpt.tmp.%d.3", dir, (int)dead);
    tg_test_write_file(own, "x"), tg_test_write_file(gone, "x");
    int32_t newest;
    CHECK(tg_checkpoint_dir_newest(dir, &newest) == 0 && newest == 3, "newest %d, expected 3", newest);
    char *path = NULL;
    CHECK(tg_checkpoint_locate(dir, &path, &err) == 0 && path && strstr(path, "/step-00000") == NULL &&
              strstr(path, "/step-3.tgckpt"),
          "located %s: %s", path ? path : "(none)", err.msg);
    free(path);
    tg_checkpoint ck;
    REQUIRE(make_ck(&ck, 4, 6, &err) == 0, "%s", err.msg);
    CHECK(tg_checkpoint_save_in_dir(&ck, dir, 0, NULL, &err) == 0, "%s", err.msg);
    tg_checkpoint_free(&ck);
    CHECK(!exists(gone), "a gone writer's temporary file stayed");
    CHECK(exists(own), "this process's temporary file was removed");
    for (size_t k = 0; k < sizeof plain / sizeof plain[0]; k++) {
        snprintf(name, sizeof name, "%s/%s", dir, plain[k]);
        CHECK(exists(name), "%s was removed", plain[k]);
    }
    snprintf(name, sizeof name, "%s", "/step-000004.tgckpt");
    CHECK(tg_checkpoint_locate(dir, &path, &err) == 0 && strstr(path, name), "%s", err.msg);
    free(path);
    /* More checkpoints than the listing's first room (16), and a folder that is not there. */
    for (int step = 10; step <= 40; step++) {
        snprintf(name, sizeof name, "%s/step-%06d.tgckpt", dir, step);
        tg_test_write_file(name, "x");
    }
    CHECK(tg_checkpoint_dir_newest(dir, &newest) == 0 && newest == 40, "newest %d of 31 more, expected 40", newest);
    snprintf(name, sizeof name, "%s/missing", dir);
    newest = 7;
    CHECK(tg_checkpoint_dir_newest(name, &newest) == 0 && newest == -1, "a missing folder: newest %d", newest);
}

static int locate_attempt(void *ctx, tg_err *err) {
    char *path;
    if (tg_checkpoint_locate(ctx, &path, err)) return -1;
    free(path);
    return 0;
}

TG_TEST(test_checkpoint_locate_cases) {
    const char *dir = tg_test_tmpdir();
    tg_err err;
    char *path = NULL, where[700], want[900], latest[800];
    snprintf(where, sizeof where, "%s/none", dir);
    snprintf(want, sizeof want, "%s: cannot open the checkpoint: %s", where, strerror(ENOENT));
    CHECK(tg_checkpoint_locate(where, &path, &err) == -1 && !path && !strcmp(err.msg, want), "%s", err.msg);
    snprintf(where, sizeof where, "%s/some.tgckpt", dir);
    tg_test_write_file(where, "x");
    CHECK(tg_checkpoint_locate(where, &path, &err) == 0 && path && !strcmp(path, where), "a file: %s", err.msg);
    free(path);
    fail_each("locate a file", locate_attempt, where, NULL, 0);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    tg_test_write_file(latest, "");
    snprintf(want, sizeof want, "%s: names '', not a checkpoint file of the folder (step-N.tgckpt)", latest);
    CHECK(tg_checkpoint_locate(dir, &path, &err) == -1 && !path && !strcmp(err.msg, want), "empty latest: %s",
          err.msg);
    tg_test_write_file(latest, "step-000012.tgckpt\r\n");
    snprintf(want, sizeof want, "%s/step-000012.tgckpt", dir);
    CHECK(tg_checkpoint_locate(dir, &path, &err) == 0 && path && !strcmp(path, want), "latest: %s", err.msg);
    free(path);
    fail_each("locate by latest", locate_attempt, (void *)dir, NULL, 0);
    /* A name as long as a file name may be (NAME_MAX: "step-", 243 digits, ".tgckpt") is read
     * whole; a line past the buffer (NAME_MAX + 1 bytes and its end) is cut and names no
     * checkpoint file. */
    char longest[NAME_MAX + 2], text[NAME_MAX + 4];
    snprintf(longest, sizeof longest, "step-%0243d.tgckpt", 7);
    REQUIRE(strlen(longest) == NAME_MAX, "%zu bytes", strlen(longest));
    snprintf(text, sizeof text, "%s\n", longest);
    tg_test_write_file(latest, text);
    snprintf(want, sizeof want, "%s/%s", dir, longest);
    CHECK(tg_checkpoint_locate(dir, &path, &err) == 0 && path && !strcmp(path, want), "a %d-byte name: %s", NAME_MAX,
          path ? path : err.msg);
    free(path);
    snprintf(text, sizeof text, "step-%0245d.tgckpt\n", 7);
    tg_test_write_file(latest, text);
    snprintf(want, sizeof want, "%s: names 'step-00000", latest);
    CHECK(tg_checkpoint_locate(dir, &path, &err) == -1 && !path && !strncmp(err.msg, want, strlen(want)) &&
              strstr(err.msg, "', not a checkpoint file of the folder (step-N.tgckpt)"),
          "a name past NAME_MAX: %s", err.msg);
    unlink(latest);
    snprintf(want, sizeof want, "%s/step-000004.tgckpt", dir);
    tg_test_write_file(want, "x");
    fail_each("locate the highest", locate_attempt, (void *)dir, "Cannot allocate memory", 0);
    /* Step 0 (weights saved before any step) is a checkpoint like any other. */
    char first_dir[700], first[800];
    snprintf(first_dir, sizeof first_dir, "%s/first", dir);
    REQUIRE(mkdir(first_dir, 0755) == 0, "mkdir %s", first_dir);
    snprintf(first, sizeof first, "%s/step-000000.tgckpt", first_dir);
    tg_test_write_file(first, "x");
    CHECK(tg_checkpoint_locate(first_dir, &path, &err) == 0 && path && !strcmp(path, first), "step 0: %s",
          path ? path : err.msg);
    free(path);
}

#ifdef TG_COVERAGE
void __gcov_dump(void);
#endif

/* Ends a forked child without the exit handlers (the parent's thread pools, which they
 * would stop, have no threads in the child); the coverage build writes its counts first. */
static void child_exit(int code) {
#ifdef TG_COVERAGE
    __gcov_dump();
#endif
    _exit(code);
}

/* A temporary file whose writer is a process this one may not signal (pid 1, another
 * user's: kill answers EPERM, not ESRCH) may still be in use: a save leaves it. Run in a
 * child process that, as root, has become user 65534 (nobody) with root kept as its saved
 * user, which it takes back before exiting (to write its coverage counts). */
TG_TEST(test_checkpoint_folder_keeps_temps_of_unsignalable_writers) {
    char dir[] = "/tmp/tg_ckpt_perm_XXXXXX", path[200], made[200];
    REQUIRE(mkdtemp(dir) && chmod(dir, 0777) == 0, "mkdtemp");
    snprintf(path, sizeof path, "%s/step-000001.tgckpt.tmp.1.0", dir);
    snprintf(made, sizeof made, "%s/step-000002.tgckpt", dir);
    REQUIRE(tg_test_write_file(path, "x") == 0, "write %s", path);
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        const int root_user = geteuid() == 0;
        if (root_user && (setresgid(65534, 65534, 0) || setresuid(65534, 65534, 0))) _exit(2);
        const int refused = kill(1, 0) == -1 && errno == EPERM;
        tg_err err = {{0}};
        tg_checkpoint ck;
        int rc = make_ck(&ck, 2, 6, &err);
        if (!rc) rc = tg_checkpoint_save_in_dir(&ck, dir, 0, NULL, &err), tg_checkpoint_free(&ck);
        if (rc) fprintf(stderr, "save: %s\n", err.msg);
        if (root_user && (setresuid(0, 0, 0) || setresgid(0, 0, 0))) _exit(3);
        child_exit(rc ? 1 : refused ? 0 : 4);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || (geteuid() != 0 && WEXITSTATUS(st) == 4)),
          "the save in the child: status %#x", st);
    CHECK(exists(path) && exists(made), "after the save: %s %s, %s %s", path, exists(path) ? "kept" : "removed", made,
          exists(made) ? "written" : "absent");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}
