/* The trainer with length buckets, last-batch rules and the background batch loader:
 * each step runs in the bucket of its longest example, buckets cut the padding, the loader
 * thread changes nothing the run computes, and the last-batch rule sets the steps of an
 * epoch and the rows of its last batch. The runs use the CUDA executor when the suite runs
 * with TG_TEST_DEVICE=cuda. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* dir/job.job over the first `rows` rows of the sentiment set (11 to 42 tokens long),
 * batch 4, seq 48, 2 epochs, dropout as tiny-bert has it. */
static int write_job(const char *dir, int rows) {
    char cmd[1200], job[700], text[700];
    snprintf(cmd, sizeof cmd, "head -n %d examples/data/sentiment-train.jsonl > '%s/train.jsonl'", rows, dir);
    if (system(cmd) != 0) return -1;
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = tiny-bert\ntask = classify\nbatch = 4\nseq = 48\nepochs = 2\nlr = 2e-3\nwarmup_steps = 2\n"
             "train_data = train.jsonl\n");
    return tg_test_write_file(job, text);
}

typedef struct run {
    tg_plan plan;
    tg_trainer tr;
    int open;
} run;

static int open_run(run *r, const char *dir, const char *const *sets, int n_sets, int no_loader) {
    memset(r, 0, sizeof *r);
    char job[700];
    snprintf(job, sizeof job, "%s/job.job", dir);
    tg_err err;
    if (!CHECK(tg_front_compile_file(job, sets, n_sets, &r->plan, &err) == 0, "%s", err.msg)) return 0;
    setenv("TUNEGRAPH_GEMM_TUNE", "0", 1); /* separate CUDA runs pick the same GEMMs */
    tg_trainer_options o = {.device = tg_test_device() ? TG_DEVICE_CUDA : TG_DEVICE_CPU, .load_data = 1,
                            .max_in_flight = 4, .no_loader_thread = no_loader};
    const int ok = CHECK(tg_trainer_open(&r->tr, &r->plan, &o, &err) == 0, "%s", err.msg);
    unsetenv("TUNEGRAPH_GEMM_TUNE");
    if (!ok) {
        tg_plan_free(&r->plan);
        return 0;
    }
    r->open = 1;
    return 1;
}

static void close_run(run *r) {
    if (r->open) tg_trainer_close(&r->tr), tg_plan_free(&r->plan);
    r->open = 0;
}

/* Every step of the run: stats[step - 1]. */
static int train_all(run *r, tg_step_stats *stats) {
    tg_err err;
    while (r->tr.steps_done < r->tr.total_steps) {
        tg_step_stats s;
        if (!CHECK(tg_trainer_step(&r->tr, &s, &err) == 0, "step %d: %s", r->tr.steps_done + 1, err.msg)) return 0;
        stats[s.step - 1] = s;
    }
    return 1;
}

static double padding(const tg_step_stats *s, int n) {
    int64_t tokens = 0, slots = 0;
    for (int i = 0; i < n; i++) tokens += s[i].tokens, slots += s[i].slots;
    return slots ? 1.0 - (double)tokens / (double)slots : 0;
}

TG_TEST(test_buckets_steps_run_in_their_bucket) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, 40) == 0, "cannot write the job");
    const char *buckets[] = {"seq_buckets=16,32,48"};
    run a = {0}, b = {0};
    tg_step_stats sa[64], sb[64];
    int ok = open_run(&a, dir, buckets, 1, 0) && CHECK(a.tr.total_steps == 20, "%d steps", a.tr.total_steps);
    ok = ok && train_all(&a, sa);
    int seen[3] = {0};
    for (int i = 0; ok && i < a.tr.total_steps; i++) {
        const int k = sa[i].seq == 16 ? 0 : sa[i].seq == 32 ? 1 : sa[i].seq == 48 ? 2 : -1;
        ok = CHECK(k >= 0, "step %d ran at seq %d, not a bucket's", i + 1, sa[i].seq);
        if (k >= 0) seen[k]++;
        /* Its longest example needs its bucket: more tokens than the bucket below holds
         * in some row, so more than that bucket's seq in the batch. */
        ok = ok && CHECK(sa[i].slots == 4LL * sa[i].seq && sa[i].tokens <= sa[i].slots &&
                             (k == 0 || sa[i].tokens > (k == 1 ? 16 : 32)),
                         "step %d: %lld tokens in %lld slots at seq %d", i + 1, (long long)sa[i].tokens,
                         (long long)sa[i].slots, sa[i].seq);
    }
    ok = ok && CHECK(seen[0] && seen[1] && seen[2], "buckets used %d/%d/%d times", seen[0], seen[1], seen[2]);
    close_run(&a);
    ok = ok && open_run(&b, dir, NULL, 0, 0) && train_all(&b, sb);
    if (ok) {
        const double with = padding(sa, 20), without = padding(sb, 20);
        CHECK(with < without * 0.75, "padding %.3f with buckets, %.3f without", with, without);
        for (int i = 0; i < 20; i++) ok = ok && CHECK(sb[i].seq == 48, "step %d at seq %d without buckets", i + 1, sb[i].seq);
    }
    close_run(&b);
}

/* The loader thread fills the batches a run would fill between steps, in the same order:
 * the runs compute the same losses bit for bit (buckets and not). */
static void loader_changes_nothing(const char *const *sets, int n_sets) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, 40) == 0, "cannot write the job");
    run a = {0}, b = {0};
    tg_step_stats sa[64], sb[64];
    int ok = open_run(&a, dir, sets, n_sets, 0) && train_all(&a, sa);
    close_run(&a);
    ok = ok && open_run(&b, dir, sets, n_sets, 1) && train_all(&b, sb);
    close_run(&b);
    for (int i = 0; ok && i < 20; i++)
        ok = CHECK(!memcmp(&sa[i].loss, &sb[i].loss, sizeof sa[i].loss) && sa[i].seq == sb[i].seq &&
                       sa[i].tokens == sb[i].tokens,
                   "step %d: loss %.9g seq %d with the loader thread, %.9g seq %d without", i + 1, sa[i].loss,
                   sa[i].seq, sb[i].loss, sb[i].seq);
}

TG_TEST(test_buckets_loader_thread_changes_nothing) {
    const char *buckets[] = {"seq_buckets=16,32,48"};
    loader_changes_nothing(NULL, 0);
    loader_changes_nothing(buckets, 1);
}

/* 38 rows in batches of 4: pad takes 10 steps an epoch, the last with 2 rows; drop 9; wrap
 * 10, every batch full. */
TG_TEST(test_last_batch_rules) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, 38) == 0, "cannot write the job");
    const struct { const char *set; int per_epoch; int short_last; } cases[] = {
        {"last_batch=pad", 10, 1}, {"last_batch=drop", 9, 0}, {"last_batch=wrap", 10, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        /* At seq 12 every row holds 11 or 12 tokens: 4 rows 44 to 48, 2 rows 22 to 24. */
        const char *sets[] = {cases[c].set, "seq=12"};
        run r = {0};
        tg_step_stats s[64];
        int ok = open_run(&r, dir, sets, 2, 0) &&
                 CHECK(r.tr.total_steps == 2 * cases[c].per_epoch, "%s: %d steps for 2 epochs", cases[c].set,
                       r.tr.total_steps);
        ok = ok && train_all(&r, s);
        close_run(&r);
        for (int e = 0; ok && e < 2; e++) {
            const tg_step_stats *last = &s[(e + 1) * cases[c].per_epoch - 1];
            const int two_rows = last->tokens <= 2 * 12;
            ok = CHECK(two_rows == cases[c].short_last, "%s: epoch %d's last step has %lld tokens", cases[c].set, e + 1,
                       (long long)last->tokens);
        }
    }
    /* wrap with buckets is refused. */
    run r;
    const char *both[] = {"last_batch=wrap", "seq_buckets=16,48"};
    tg_err err;
    char job[700];
    snprintf(job, sizeof job, "%s/job.job", dir);
    memset(&r, 0, sizeof r);
    const int rc = tg_front_compile_file(job, both, 2, &r.plan, &err);
    if (CHECK(rc != 0, "wrap with buckets compiled")) CHECK(strstr(err.msg, "wrap") != NULL, "message: %s", err.msg);
    else tg_plan_free(&r.plan);
}

/* The sampler the trainer opens sees every example's length, the first included: each
 * example sits in the smallest bucket that holds it (the first example is longer than the
 * smallest bucket, so a length left unset would show). */
TG_TEST(test_buckets_sampler_sees_every_length) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, 40) == 0, "cannot write the job");
    char cmd[1600]; /* the rows backwards, so that the first is a long one */
    snprintf(cmd, sizeof cmd, "tac '%s/train.jsonl' > '%s/rev.jsonl' && mv '%s/rev.jsonl' '%s/train.jsonl'", dir, dir, dir,
             dir);
    REQUIRE(system(cmd) == 0, "%s", cmd);
    const char *buckets[] = {"seq_buckets=16,32,48"};
    run a = {0};
    /* (an unset length reads what the allocator left: ASan fills fresh blocks with 0xbe) */
    if (!open_run(&a, dir, buckets, 1, 1)) return;
    const tg_batch_sampler *s = &a.tr.sampler;
    CHECK(s->n == 40 && s->n_buckets == 3 && s->example_bucket, "%d examples, %d buckets", s->n, s->n_buckets);
    CHECK(a.tr.train.n == 40 && a.tr.train.examples[0].len > 16, "first example %d tokens", a.tr.train.examples[0].len);
    for (int32_t i = 0; s->example_bucket && i < s->n && i < a.tr.train.n; i++) {
        const int32_t len = a.tr.train.examples[i].len, want = len <= 16 ? 0 : len <= 32 ? 1 : 2;
        CHECK(s->example_bucket[i] == want, "example %d (%d tokens) in bucket %d, want %d", i, len, s->example_bucket[i],
              want);
    }
    close_run(&a);
}
