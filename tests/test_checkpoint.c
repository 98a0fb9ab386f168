/* Native checkpoints (runtime/checkpoint.h): the file format and its refusals, the folder
 * (latest, keep-last-K, stale temporary files), resuming in process and through `tunegraph
 * run --resume` with bitwise-identical losses and parameters (fp32, bf16, LM, data
 * parallel, with dropout), refusals of another job's checkpoint, and SIGTERM, SIGINT,
 * a second signal and SIGKILL during a save. The in-process and CLI runs use the CUDA
 * executor when the suite runs with TG_TEST_DEVICE=cuda. */
#include <limits.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <zstd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "api/front.h"
#include "include/tunegraph.h"
#include "base/alloc.h"
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* ---- jobs and in-process runs -------------------------------------------------------- */

/* dir/job.job over the first 40 training rows (an epoch is 10 steps of batch 4, 5 with two
 * replicas), so runs cross epochs; `kind` "classify" (tiny-bert, dropout 0.1) or "lm"
 * (tiny-gpt2). */
static int write_job(const char *dir, const char *kind, int steps) {
    const int lm = !strcmp(kind, "lm");
    char cmd[1600], job[700], text[700];
    snprintf(cmd, sizeof cmd, "head -n 40 examples/data/%s-train.jsonl > '%s/train.jsonl' && "
                              "head -n 8 examples/data/%s-eval.jsonl > '%s/eval.jsonl'",
             lm ? "tiny-lm" : "sentiment", dir, lm ? "tiny-lm" : "sentiment", dir);
    if (system(cmd) != 0) return -1;
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(text, sizeof text,
             "model = %s\ntask = %s\nbatch = 4\nseq = 16\nsteps = %d\nlr = 2e-3\nwarmup_steps = 3\n"
             "train_data = train.jsonl\neval_data = eval.jsonl\n",
             lm ? "tiny-gpt2" : "tiny-bert", lm ? "lm" : "classify", steps);
    return tg_test_write_file(job, text);
}

/* The GEMM algorithms are the heuristic's first choice in these runs, not timed ones, so
 * separate CUDA runs compute alike (timing could pick another algorithm in the second). */
static void deterministic_gemms(int on) {
    static char saved[64];
    static int had;
    if (on) {
        const char *v = getenv("TUNEGRAPH_GEMM_TUNE");
        had = v != NULL;
        if (v) snprintf(saved, sizeof saved, "%s", v);
        setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
    } else if (had) {
        setenv("TUNEGRAPH_GEMM_TUNE", saved, 1);
    } else {
        unsetenv("TUNEGRAPH_GEMM_TUNE");
    }
}

typedef struct run {
    tg_plan plan;
    tg_trainer tr;
    int open;
} run;

/* Compiles dir/job.job with the overrides and opens a trainer on the suite's device with up
 * to 4 steps in flight (the CPU runs one). */
static int open_run(run *r, const char *dir, const char *const *sets, int n_sets) {
    memset(r, 0, sizeof *r);
    char job[700];
    snprintf(job, sizeof job, "%s/job.job", dir);
    tg_err err;
    if (!CHECK(tg_front_compile_file(job, sets, n_sets, &r->plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = tg_test_device() ? TG_DEVICE_CUDA : TG_DEVICE_CPU, .load_data = 1,
                            .max_in_flight = 4};
    if (!CHECK(tg_trainer_open(&r->tr, &r->plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&r->plan);
        return 0;
    }
    r->open = 1;
    return 1;
}

static void close_run(run *r) {
    if (r->open) tg_trainer_close(&r->tr);
    if (r->open) tg_plan_free(&r->plan);
    r->open = 0;
}

/* Steps until `until` steps are taken: losses[step - 1]. */
static int train_until(run *r, int32_t until, float *losses) {
    tg_err err;
    while (r->tr.steps_done < until) {
        tg_step_stats s;
        if (!CHECK(tg_trainer_step(&r->tr, &s, &err) == 0, "step %d: %s", r->tr.steps_done + 1, err.msg)) return 0;
        losses[s.step - 1] = s.loss;
    }
    return 1;
}

/* A copy of a whole tensor of the run (malloc'd). */
static void *read_tensor(run *r, int tensor) {
    void *buf = malloc(r->plan.tensors[tensor].bytes);
    tg_err err;
    if (buf && !CHECK(tg_trainer_read(&r->tr, tensor, buf, &err) == 0, "%s", err.msg)) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The state a run ends with: parameters, AdamW m and v, and (fp16) the loss scale and its
 * growth tracker. */
typedef struct final_state {
    void *params, *m, *v;
    uint64_t params_bytes, state_bytes;
    float scale[2];
} final_state;

static int read_final(run *r, final_state *f) {
    const tg_plan_io *io = &r->plan.io;
    f->params = read_tensor(r, io->params_all);
    f->m = read_tensor(r, io->m_all);
    f->v = read_tensor(r, io->v_all);
    f->params_bytes = r->plan.tensors[io->params_all].bytes;
    f->state_bytes = r->plan.tensors[io->m_all].bytes;
    tg_err err;
    if (io->loss_scale >= 0 && (!CHECK(tg_trainer_read_f32(&r->tr, io->loss_scale, &f->scale[0], &err) == 0, "%s", err.msg) ||
                                !CHECK(tg_trainer_read_f32(&r->tr, io->loss_scale_growth, &f->scale[1], &err) == 0, "%s", err.msg)))
        return 0;
    return f->params && f->m && f->v;
}

static void free_final(final_state *f) {
    free(f->params), free(f->m), free(f->v);
    memset(f, 0, sizeof *f);
}

/* ck through the file format and back: what a resume reads. */
static int round_trip(const tg_checkpoint *ck, tg_checkpoint *out) {
    uint8_t *bytes;
    size_t len;
    tg_err err;
    tg_checkpoint_init(out);
    if (!CHECK(tg_checkpoint_encode(ck, &bytes, &len, &err) == 0, "%s", err.msg)) return 0;
    int ok = CHECK(tg_checkpoint_decode(bytes, len, "round trip", out, &err) == 0, "%s", err.msg);
    free(bytes);
    return ok;
}

/* Trains `steps` steps uninterrupted, and again as a run checkpointed after `at` steps and
 * resumed from the checkpoint (through the file format) in a new trainer: the resumed
 * steps' losses, and the final parameters, m and v, equal bit for bit. */
static void resume_matches_with(const char *kind, const char *precision, int steps, int at, const char *more[2]) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, kind, steps) == 0, "cannot write the job");
    char every[32];
    snprintf(every, sizeof every, "checkpoint_every=%d", at);
    const int n_more = more ? 2 : 0;
    const char *sets[4] = {precision, more ? more[0] : NULL, more ? more[1] : NULL};
    sets[1 + n_more] = every;
    float *want = calloc((size_t)steps, sizeof *want), *got = calloc((size_t)steps, sizeof *got);
    final_state a = {0}, c = {0};
    tg_checkpoint ck, read;
    tg_checkpoint_init(&ck), tg_checkpoint_init(&read);
    deterministic_gemms(1);
    run r;
    int ok = want && got && open_run(&r, dir, sets, 1 + n_more);
    ok = ok && train_until(&r, steps, want) && read_final(&r, &a);
    close_run(&r);
    /* The interrupted run: the trainer starts no step past the checkpoint step. */
    ok = ok && open_run(&r, dir, sets, 2 + n_more) && train_until(&r, at, got);
    tg_err err;
    ok = ok && CHECK(r.tr.launched == at, "%lld steps started at the checkpoint step %d", (long long)r.tr.launched, at);
    ok = ok && CHECK(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == 0, "%s", err.msg);
    close_run(&r);
    ok = ok && round_trip(&ck, &read);
    ok = ok && open_run(&r, dir, sets, 1 + n_more) &&
         CHECK(tg_trainer_restore(&r.tr, &read, "ck", &err) == 0, "%s", err.msg);
    ok = ok && CHECK(r.tr.steps_done == at, "resumed at step %d, not %d", r.tr.steps_done, at);
    ok = ok && train_until(&r, steps, got) && read_final(&r, &c);
    close_run(&r);
    deterministic_gemms(0);
    if (ok) {
        int first = -1;
        for (int s = at; s < steps && first < 0; s++)
            if (memcmp(&want[s], &got[s], sizeof *got)) first = s;
        CHECK(first < 0, "%s %s: step %d's loss is %.9g resumed, %.9g uninterrupted", kind, precision, first + 1,
              first >= 0 ? got[first] : 0, first >= 0 ? want[first] : 0);
        CHECK(!memcmp(a.params, c.params, a.params_bytes), "%s %s: the final parameters differ", kind, precision);
        CHECK(!memcmp(a.m, c.m, a.state_bytes) && !memcmp(a.v, c.v, a.state_bytes), "%s %s: AdamW m or v differs", kind,
              precision);
        CHECK(a.scale[0] == c.scale[0] && a.scale[1] == c.scale[1], "%s %s: loss scale %g (tracker %g) resumed, %g (%g)",
              kind, precision, c.scale[0], c.scale[1], a.scale[0], a.scale[1]);
    }
    free_final(&a), free_final(&c);
    tg_checkpoint_free(&ck), tg_checkpoint_free(&read);
    free(want), free(got);
}

static void resume_matches(const char *kind, const char *precision, int steps, int at) {
    resume_matches_with(kind, precision, steps, at, NULL);
}

TG_TEST(test_checkpoint_resume_bitwise_fp32) { resume_matches("classify", "precision=fp32", 24, 7); }
/* Length buckets and a short last batch: the data position is a batch of the epoch's
 * bucketed order. */
TG_TEST(test_checkpoint_resume_bitwise_buckets) {
    const char *buckets[2] = {"seq=32", "seq_buckets=12,16,24,32"};
    resume_matches_with("classify", "precision=fp32", 24, 13, buckets);
    const char *lm[2] = {"seq=48", "seq_buckets=24,48"};
    resume_matches_with("lm", "precision=bf16", 16, 9, lm);
}
/* Adan's four state vectors (two in each of m and v) and the cosine schedule resume too. */
TG_TEST(test_checkpoint_resume_bitwise_adan) {
    const char *adan[2] = {"optimizer=adan", "lr_schedule=cosine"};
    resume_matches_with("classify", "precision=fp32", 16, 5, adan);
    resume_matches_with("lm", "precision=bf16", 12, 7, adan);
}
/* bf16 optimizer state (AdamW's m and v, Adan's four vectors, stored rounded): saved as
 * stored, and the rounding's draws resume at the checkpoint's step. */
TG_TEST(test_checkpoint_resume_bitwise_bf16_state) {
    const char *adamw[2] = {"optimizer_state=bf16", "optimizer=adamw"};
    resume_matches_with("classify", "precision=bf16", 16, 5, adamw);
    const char *adan[2] = {"optimizer_state=bf16", "optimizer=adan"};
    resume_matches_with("lm", "precision=fp32", 12, 7, adan);
}
TG_TEST(test_checkpoint_resume_bitwise_bf16) { resume_matches("classify", "precision=bf16", 24, 7); }
TG_TEST(test_checkpoint_resume_bitwise_lm) { resume_matches("lm", "precision=fp32", 16, 11); }
TG_TEST(test_checkpoint_resume_bitwise_lm_bf16) { resume_matches("lm", "precision=bf16", 16, 5); }
/* fp16: the loss scale and its growth tracker are state too (growing every 3 steps, the
 * checkpoint at 7 falls between two growths). */
TG_TEST(test_checkpoint_resume_bitwise_fp16) {
    const char *scaling[2] = {"loss_scale_init=256", "loss_scale_growth_interval=3"};
    resume_matches_with("classify", "precision=fp16", 24, 7, scaling);
}

/* What the checkpoint holds of the dropout streams and the data: the counter is the steps
 * taken, and the next step's forward draws the masks an uninterrupted run draws, on the
 * batch it takes (the same loss with dropout on, which differs from dropout off); a counter
 * one behind gives other masks. */
TG_TEST(test_checkpoint_dropout_continues) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "classify", 30) == 0, "cannot write the job");
    const char *sets[] = {"checkpoint_every=13"};
    float losses[30];
    run a = {0}, c = {0};
    tg_err err;
    tg_checkpoint ck, read;
    tg_checkpoint_init(&ck), tg_checkpoint_init(&read);
    deterministic_gemms(1);
    REQUIRE(open_run(&a, dir, sets, 1), "open");
    CHECK(a.plan.model.hidden_dropout > 0 && a.plan.model.attention_dropout > 0, "the job's model has no dropout");
    int ok = train_until(&a, 13, losses) && CHECK(tg_trainer_checkpoint(&a.tr, &ck, 1, &err) == 0, "%s", err.msg);
    ok = ok && CHECK(ck.state.dropout_counter == 13 && ck.state.step == 13, "dropout counter %llu at step %d",
                     (unsigned long long)ck.state.dropout_counter, ck.state.step);
    /* 13 steps of 4 rows over 40: epoch 1, 3 batches in. */
    ok = ok && CHECK(ck.state.sampler_epoch == 1 && ck.state.sampler_pos == 3 && ck.state.sampler_examples == 40,
                     "sampler at epoch %d position %d of %d", ck.state.sampler_epoch, ck.state.sampler_pos,
                     ck.state.sampler_examples);
    ok = ok && round_trip(&ck, &read) && open_run(&c, dir, NULL, 0) &&
         CHECK(tg_trainer_restore(&c.tr, &read, "ck", &err) == 0, "%s", err.msg);
    float la = NAN, lc = NAN, lc_eval = NAN, lb = NAN;
    const int loss = a.plan.io.loss;
    /* a holds step 14's batch in its staging already (filled ahead); c draws it now. */
    if (ok) {
        tg_trainer_next_batch(&c.tr);
        ok = CHECK(tg_trainer_run(&a.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0, "%s", err.msg) &&
             CHECK(tg_trainer_read_f32(&a.tr, loss, &la, &err) == 0, "%s", err.msg) &&
             CHECK(tg_trainer_run(&c.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0, "%s", err.msg) &&
             CHECK(tg_trainer_read_f32(&c.tr, loss, &lc, &err) == 0, "%s", err.msg) &&
             CHECK(tg_trainer_run(&c.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, &err) == 0, "%s", err.msg) &&
             CHECK(tg_trainer_read_f32(&c.tr, loss, &lc_eval, &err) == 0, "%s", err.msg);
    }
    close_run(&c);
    /* The control: the same state with the counter one step behind. */
    if (ok) {
        tg_checkpoint_tensor *counter = (tg_checkpoint_tensor *)tg_checkpoint_find(&read, "optim.step", -1);
        ok = CHECK(counter && counter->bytes == 4, "no step counter in the checkpoint");
        if (ok) {
            const float behind = 12.0f;
            memcpy((void *)counter->data, &behind, sizeof behind);
            read.state.dropout_counter = 12;
        }
        ok = ok && open_run(&c, dir, NULL, 0) && CHECK(tg_trainer_restore(&c.tr, &read, "ck", &err) == 0, "%s", err.msg);
        if (ok) tg_trainer_next_batch(&c.tr);
        ok = ok && CHECK(tg_trainer_run(&c.tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0, "%s", err.msg) &&
             CHECK(tg_trainer_read_f32(&c.tr, loss, &lb, &err) == 0, "%s", err.msg);
        close_run(&c);
    }
    close_run(&a);
    deterministic_gemms(0);
    if (ok) {
        CHECK(!memcmp(&la, &lc, sizeof la), "step 14's forward: loss %.9g resumed, %.9g uninterrupted", lc, la);
        CHECK(lc != lc_eval, "dropout off gives the same loss (%.9g): the masks play no part", lc);
        CHECK(lb != la, "a counter one step behind gives the same masks (loss %.9g)", lb);
    }
    tg_checkpoint_free(&ck), tg_checkpoint_free(&read);
}

/* A checkpoint of one job is refused by a run of another, naming what differs; a run that
 * differs only in settings that leave the training alone (log_every, eval_data, the
 * checkpoint keys) takes it. */
TG_TEST(test_checkpoint_refuses_another_job) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "classify", 12) == 0, "cannot write the job");
    run r;
    tg_err err;
    tg_checkpoint ck;
    float losses[12];
    REQUIRE(open_run(&r, dir, (const char *[]){"checkpoint_every=4"}, 1), "open");
    int ok = train_until(&r, 4, losses) && CHECK(tg_trainer_checkpoint(&r.tr, &ck, 1, &err) == 0, "%s", err.msg);
    close_run(&r);
    REQUIRE(ok, "no checkpoint");
    char other_data[700], set_data[760];
    snprintf(other_data, sizeof other_data, "%s/other.jsonl", dir);
    snprintf(set_data, sizeof set_data, "train_data=%s", other_data);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "tail -n 40 examples/data/sentiment-train.jsonl > '%s'", other_data);
    REQUIRE(system(cmd) == 0, "cannot write %s", other_data);
    const struct {
        const char *set, *want[3];
    } cases[] = {
        {"batch=8", {"batch: 4 in the checkpoint, 8 now"}},
        {"model=tiny-roberta", {"model.arch: bert in the checkpoint, roberta now", "model: tiny-bert"}},
        {"precision=bf16", {"precision: fp32 in the checkpoint, bf16 now"}},
        {"lr=1e-3", {"lr: 0.00200000009 in the checkpoint, 0.00100000005 now"}},
        {"seed=7", {"seed: 42 in the checkpoint, 7 now"}},
        {"steps=13", {"total_steps: 12 in the checkpoint, 13 now"}},
        {"freeze=bert.embeddings.*", {"plan.structure", "freeze patterns"}},
        {set_data, {"train_data.xxh64", "(besides, train_data"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (!open_run(&r, dir, &cases[k].set, 1)) continue;
        CHECK(tg_trainer_restore(&r.tr, &ck, "ckpt/step-000004.tgckpt", &err) != 0, "%s: resumed", cases[k].set);
        CHECK(strstr(err.msg, "ckpt/step-000004.tgckpt: the checkpoint is of another job or plan"), "%s: %s",
              cases[k].set, err.msg);
        for (int w = 0; w < 3 && cases[k].want[w]; w++)
            CHECK(strstr(err.msg, cases[k].want[w]), "%s: the message lacks '%s': %s", cases[k].set, cases[k].want[w],
                  err.msg);
        close_run(&r);
    }
    char eval_set[760];
    snprintf(eval_set, sizeof eval_set, "eval_data=%s/train.jsonl", dir);
    const char *harmless[] = {"log_every=3", "checkpoint_every=5", "keep_checkpoints=1", eval_set};
    if (open_run(&r, dir, harmless, 4)) {
        CHECK(tg_trainer_restore(&r.tr, &ck, "ck", &err) == 0, "settings that leave training alone: %s", err.msg);
        close_run(&r);
    }
    tg_checkpoint_free(&ck);
}

/* ---- the file format ------------------------------------------------------------------- */

/* A small checkpoint made by hand. */
static void make_small(tg_checkpoint *ck, int32_t step) {
    tg_err err;
    tg_checkpoint_init(ck);
    ck->state = (tg_checkpoint_state){.step = step, .total_steps = 100, .replicas = 2, .plan_fingerprint = 0x1234,
                                      .dropout_seed = 42, .dropout_counter = (uint64_t)step, .sampler_examples = 10,
                                      .sampler_epoch = 3, .sampler_pos = 4, .sampler_seed = 42};
    CHECK(tg_checkpoint_add_field(ck, "batch", "4", &err) == 0 && tg_checkpoint_add_field(ck, "model", "tiny", &err) == 0,
          "%s", err.msg);
    float *w = malloc(6 * sizeof *w);
    int32_t *ids = malloc(3 * sizeof *ids);
    for (int i = 0; i < 6; i++) w[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 3; i++) ids[i] = i * 7;
    CHECK(tg_checkpoint_add_tensor(ck, "w", -1, TG_F32, 2, (const int64_t[]){2, 3}, w, &err) == 0 &&
              tg_checkpoint_add_tensor(ck, "optim.m", 1, TG_I32, 1, (const int64_t[]){3}, ids, &err) == 0,
          "%s", err.msg);
}

static int same_checkpoint(const tg_checkpoint *a, const tg_checkpoint *b) {
    if (memcmp(&a->state, &b->state, sizeof a->state) || a->n_fields != b->n_fields || a->n_tensors != b->n_tensors)
        return 0;
    for (int i = 0; i < a->n_fields; i++)
        if (strcmp(a->fields[i].key, b->fields[i].key) || strcmp(a->fields[i].value, b->fields[i].value)) return 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const tg_checkpoint_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) || x->replica != y->replica || x->dtype != y->dtype || x->ndim != y->ndim ||
            x->bytes != y->bytes || memcmp(x->shape, y->shape, sizeof x->shape) || memcmp(x->data, y->data, x->bytes))
            return 0;
    }
    return 1;
}

TG_TEST(test_checkpoint_format_round_trip) {
    const char *dir = tg_test_tmpdir();
    tg_checkpoint ck, back, file;
    make_small(&ck, 9);
    uint8_t *bytes;
    size_t len;
    tg_err err;
    REQUIRE(tg_checkpoint_encode(&ck, &bytes, &len, &err) == 0, "%s", err.msg);
    CHECK(len > TG_CHECKPOINT_HEADER_BYTES && !memcmp(bytes, "TGCKPT\0\0", 8), "header");
    CHECK(tg_checkpoint_decode(bytes, len, "mem", &back, &err) == 0 && same_checkpoint(&ck, &back), "decode: %s",
          err.msg);
    char path[700];
    snprintf(path, sizeof path, "%s/one.tgckpt", dir);
    CHECK(tg_checkpoint_write(&ck, path, &err) == 0, "%s", err.msg);
    long flen = 0;
    char *fbytes = tg_test_read_file(path, &flen);
    CHECK(fbytes && (size_t)flen == len && !memcmp(fbytes, bytes, len), "the file differs from the encoding");
    free(fbytes);
    CHECK(tg_checkpoint_read(path, &file, &err) == 0 && same_checkpoint(&ck, &file), "read: %s", err.msg);
    CHECK(tg_checkpoint_field_value(&file, "model") && !strcmp(tg_checkpoint_field_value(&file, "model"), "tiny"),
          "field");
    CHECK(tg_checkpoint_find(&file, "optim.m", 1) && !tg_checkpoint_find(&file, "optim.m", -1), "find by replica");
    free(bytes);
    tg_checkpoint_free(&ck), tg_checkpoint_free(&back), tg_checkpoint_free(&file);
}

static void le64_put(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* bytes with its payload edited by `edit` (which may change its length) and the header's
 * sizes and checksums made to match, so only the record checks can refuse it (malloc'd). */
static uint8_t *reseal(const uint8_t *bytes, size_t len, void (*edit)(uint8_t *payload, size_t *n), size_t *out_len) {
    const uint64_t usize = ((uint64_t *)(bytes + 32))[0];
    uint8_t *payload = malloc((size_t)usize + 64);
    if (ZSTD_decompress(payload, (size_t)usize, bytes + 64, len - 64) != usize) return free(payload), NULL;
    size_t n = (size_t)usize;
    edit(payload, &n);
    const size_t bound = ZSTD_compressBound(n);
    uint8_t *out = malloc(64 + bound);
    const size_t c = ZSTD_compress(out + 64, bound, payload, n, 1);
    memcpy(out, bytes, 64);
    le64_put(out + 32, n);
    le64_put(out + 40, c);
    le64_put(out + 48, XXH64(payload, n, 0));
    le64_put(out + 56, XXH64(out, 56, 0));
    free(payload);
    *out_len = 64 + c;
    return out;
}

/* The payload of make_small: IDNT (12 + 4 + 2 fields), STAT at 12 + idnt, then tensor "w". */
static size_t idnt_end(const uint8_t *p) { return 12 + (size_t)p[4]; }
static void bad_tensor_bytes(uint8_t *p, size_t *n) {
    const size_t w = idnt_end(p) + 12 + 56; /* the first TNSR record */
    const size_t bytes_field = w + 12 + 4 + 1 + 12 + 2 * 8;
    p[bytes_field] += 4;
}
static void bad_sampler(uint8_t *p, size_t *n) { p[idnt_end(p) + 12 + 44] = 11; } /* position 11 of 10 */
static void bad_tag(uint8_t *p, size_t *n) { memcpy(p + idnt_end(p) + 12 + 56, "TNSX", 4); }
static void no_end(uint8_t *p, size_t *n) { *n -= 12; }
static void bad_dtype(uint8_t *p, size_t *n) { p[idnt_end(p) + 12 + 56 + 12 + 4 + 1 + 4] = 9; }

/* A damaged checkpoint is refused naming the file and the field: every truncation, a flipped
 * byte anywhere (but in the few bits of a zstd frame that do not change what it holds, and
 * then the content is the same), bytes past the end, and records that do not hold together. */
TG_TEST(test_checkpoint_corrupt_refused) {
    const char *dir = tg_test_tmpdir();
    tg_checkpoint ck, out;
    make_small(&ck, 9);
    uint8_t *bytes;
    size_t len;
    tg_err err;
    REQUIRE(tg_checkpoint_encode(&ck, &bytes, &len, &err) == 0, "%s", err.msg);
    char path[700];
    snprintf(path, sizeof path, "%s/bad.tgckpt", dir);
    for (size_t cut = 0; cut < len; cut += cut < 80 ? 1 : 7) {
        const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0 && write(fd, bytes, cut) == (ssize_t)cut, "write");
        close(fd);
        if (!CHECK(tg_checkpoint_read(path, &out, &err) != 0, "cut at %zu of %zu: read", cut, len)) {
            tg_checkpoint_free(&out);
            continue;
        }
        CHECK(strstr(err.msg, path) && (strstr(err.msg, "truncated") || strstr(err.msg, "field")), "cut at %zu: %s",
              cut, err.msg);
    }
    for (size_t at = 0; at < len; at++) {
        bytes[at] ^= 0x40;
        const int refused = tg_checkpoint_decode(bytes, len, "flip.tgckpt", &out, &err) != 0;
        bytes[at] ^= 0x40;
        if (!refused) {
            CHECK(at >= TG_CHECKPOINT_HEADER_BYTES && same_checkpoint(&ck, &out), "byte %zu flipped: read as other content",
                  at);
            tg_checkpoint_free(&out);
            continue;
        }
        CHECK(strstr(err.msg, "flip.tgckpt: ") && (strstr(err.msg, "field '") || strstr(err.msg, "decompress")),
              "byte %zu flipped: %s", at, err.msg);
    }
    uint8_t *longer = malloc(len + 3);
    memcpy(longer, bytes, len);
    memset(longer + len, 0, 3);
    CHECK(tg_checkpoint_decode(longer, len + 3, "long", &out, &err) != 0 && strstr(err.msg, "3 bytes past"), "%s",
          err.msg);
    free(longer);
    const struct {
        void (*edit)(uint8_t *, size_t *);
        const char *want;
    } edits[] = {
        {bad_tensor_bytes, "record 2 (tensor 'w'): field 'bytes' is 28, its dtype and shape make 24"},
        {bad_sampler, "record 1 (STAT): field 'sampler': epoch 3, position 11 of 10 examples"},
        {bad_tag, "record 2: tag 'TNSX' where a tensor (TNSR) or END! belongs"},
        {no_end, "ends without its END! record"},
        {bad_dtype, "record 2 (tensor 'w'): field 'dtype' is 9"},
    };
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        size_t n = 0;
        uint8_t *b = reseal(bytes, len, edits[k].edit, &n);
        if (!CHECK(b, "reseal %zu", k)) continue;
        CHECK(tg_checkpoint_decode(b, n, "edited.tgckpt", &out, &err) != 0 && strstr(err.msg, "edited.tgckpt: ") &&
                  strstr(err.msg, edits[k].want),
              "edit %zu: '%s' lacks '%s'", k, err.msg, edits[k].want);
        free(b);
    }
    free(bytes);
    tg_checkpoint_free(&ck);
}

/* ---- the folder ---------------------------------------------------------------------- */

static int file_exists(const char *dir, const char *name) {
    char path[800];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

static int count_files(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += strstr(e->d_name, part) != NULL;
    if (d) closedir(d);
    return n;
}

/* The newest `keep` stay; `latest` names the newest and resume finds it (the highest one
 * when `latest` is gone); temporary files of a dead writer go at the next save, a live
 * one's stay; an earlier step than the folder holds is refused. */
/* Pruning stops at the first old checkpoint it cannot name (out of memory): what stays is
 * always the oldest ones, never a gap where a newer one stayed and an older one went. Each
 * allocation of a save that prunes four fails in turn, alone (the later ones succeed). */
TG_TEST(test_checkpoint_prune_stops_when_out_of_memory) {
    const char *root = tg_test_tmpdir();
    int pruning_failed = 0;
    for (long k = 0;; k++) {
        char dir[700], *path = NULL;
        snprintf(dir, sizeof dir, "%s/k%ld", root, k);
        tg_err err;
        REQUIRE(tg_checkpoint_dir_prepare(dir, &err) == 0, "%s", err.msg);
        for (int step = 1; step <= 4; step++) {
            char old[800];
            snprintf(old, sizeof old, "%s/step-%06d.tgckpt", dir, step);
            REQUIRE(tg_test_write_file(old, "x") == 0, "%s", old);
        }
        tg_checkpoint ck;
        make_small(&ck, 5);
        tg_alloc_fail_only(k);
        const int rc = tg_checkpoint_save_in_dir(&ck, dir, 1, &path, &err);
        const long made = tg_alloc_fail_after(-1);
        tg_checkpoint_free(&ck);
        free(path);
        if (rc != 0) continue; /* the save itself ran out of memory: another test's concern */
        int kept[5] = {0};
        for (int step = 1; step <= 4; step++) {
            char name[32];
            snprintf(name, sizeof name, "step-%06d.tgckpt", step);
            kept[step] = file_exists(dir, name);
        }
        for (int step = 2; step <= 4; step++)
            CHECK(!kept[step] || kept[step - 1], "allocation %ld failed: step %d kept but step %d pruned", k, step,
                  step - 1);
        pruning_failed += kept[4];
        if (made <= k) break; /* nothing failed: every allocation has had its turn */
    }
    CHECK(pruning_failed > 0, "no failed allocation stopped the pruning");
}

TG_TEST(test_checkpoint_keep_last_k) {
    const char *dir = tg_test_tmpdir();
    char ck_dir[700], *path = NULL;
    snprintf(ck_dir, sizeof ck_dir, "%s/runs/ck", dir);
    tg_err err;
    REQUIRE(tg_checkpoint_dir_prepare(ck_dir, &err) == 0, "%s", err.msg);
    CHECK(tg_checkpoint_locate(ck_dir, &path, &err) != 0 && strstr(err.msg, "no checkpoint in the folder"), "%s",
          err.msg);
    /* A pid that has exited, and one that lives (this process's parent). */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char stale[800], live[800];
    snprintf(stale, sizeof stale, "%s/step-000007.tgckpt.tmp.%d.0", ck_dir, (int)dead);
    snprintf(live, sizeof live, "%s/latest.tmp.%d.0", ck_dir, (int)getppid());
    CHECK(tg_test_write_file(stale, "part") == 0 && tg_test_write_file(live, "part") == 0, "temps");
    for (int32_t step = 1; step <= 6; step++) {
        tg_checkpoint ck;
        make_small(&ck, step);
        CHECK(tg_checkpoint_save_in_dir(&ck, ck_dir, 2, &path, &err) == 0, "step %d: %s", step, err.msg);
        char want[800];
        snprintf(want, sizeof want, "%s/step-%06d.tgckpt", ck_dir, step);
        CHECK(path && !strcmp(path, want), "path %s", path ? path : "(none)");
        free(path);
        tg_checkpoint_free(&ck);
    }
    CHECK(count_files(ck_dir, ".tgckpt") == 2 + 0 && file_exists(ck_dir, "step-000005.tgckpt") &&
              file_exists(ck_dir, "step-000006.tgckpt"),
          "kept: %d checkpoints", count_files(ck_dir, ".tgckpt"));
    CHECK(!file_exists(ck_dir, strrchr(stale, '/') + 1), "a dead writer's temporary file stayed");
    CHECK(file_exists(ck_dir, strrchr(live, '/') + 1), "a live writer's temporary file was removed");
    unlink(live);
    char latest[800];
    snprintf(latest, sizeof latest, "%s/latest", ck_dir);
    char *text = tg_test_read_file(latest, NULL);
    CHECK(text && !strcmp(text, "step-000006.tgckpt\n"), "latest: %s", text ? text : "(none)");
    free(text);
    CHECK(tg_checkpoint_locate(ck_dir, &path, &err) == 0 && strstr(path, "/step-000006.tgckpt"), "%s", err.msg);
    free(path);
    tg_checkpoint ck;
    make_small(&ck, 3);
    CHECK(tg_checkpoint_save_in_dir(&ck, ck_dir, 2, NULL, &err) != 0 && strstr(err.msg, "holds step-000006.tgckpt"),
          "an earlier step was written: %s", err.msg);
    tg_checkpoint_free(&ck);
    unlink(latest);
    CHECK(tg_checkpoint_locate(ck_dir, &path, &err) == 0 && strstr(path, "/step-000006.tgckpt"), "%s", err.msg);
    free(path);
    tg_test_write_file(latest, "../elsewhere\n");
    CHECK(tg_checkpoint_locate(ck_dir, &path, &err) != 0 && strstr(err.msg, "latest: names '../elsewhere'"), "%s",
          err.msg);
    /* keep 0 keeps them all. */
    unlink(latest);
    for (int32_t step = 7; step <= 9; step++) {
        make_small(&ck, step);
        CHECK(tg_checkpoint_save_in_dir(&ck, ck_dir, 0, NULL, &err) == 0, "%s", err.msg);
        tg_checkpoint_free(&ck);
    }
    CHECK(count_files(ck_dir, ".tgckpt") == 5, "keep 0 kept %d", count_files(ck_dir, ".tgckpt"));
}

/* ---- the command line ------------------------------------------------------------------ */

/* Runs `tunegraph ARGS` in dir with `env` before it; its exit status, stderr in dir/stderr.txt. */
static int run_cli(const char *dir, const char *env, const char *args) {
    char cmd[3000], cli[PATH_MAX];
    const char *c = tg_test_cli();
    if (!realpath(c, cli)) snprintf(cli, sizeof cli, "%s", c);
    snprintf(cmd, sizeof cmd, "cd '%s' && %s TUNEGRAPH_GEMM_TUNE=0 '%s' %s --device %s >stdout.txt 2>stderr.txt", dir,
             env, cli, args, tg_test_device() ? "cuda" : "cpu");
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *stderr_of(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/stderr.txt", dir);
    char *text = tg_test_read_file(path, NULL);
    return text ? text : strdup("");
}

/* The losses of a metrics file by step (0 where it has none), up to `steps`; the last
 * line's object into *last (NULL: not wanted). */
static int metrics_losses(const char *path, float *loss, int steps, json_t **last) {
    for (int s = 0; s < steps; s++) loss[s] = 0;
    if (last) *last = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        json_t *step = json_object_get(o, "step"), *l = json_object_get(o, "loss");
        if (json_is_integer(step) && json_is_number(l) && json_integer_value(step) >= 1 &&
            json_integer_value(step) <= steps)
            loss[json_integer_value(step) - 1] = (float)json_number_value(l);
        if (last) {
            json_decref(*last);
            *last = o;
        } else {
            json_decref(o);
        }
    }
    fclose(f);
    return 1;
}

static int same_file(const char *dir, const char *a, const char *b) {
    char pa[800], pb[800];
    snprintf(pa, sizeof pa, "%s/%s", dir, a);
    snprintf(pb, sizeof pb, "%s/%s", dir, b);
    long la = -1, lb = -2;
    char *x = tg_test_read_file(pa, &la), *y = tg_test_read_file(pb, &lb);
    int same = x && y && la == lb && !memcmp(x, y, (size_t)la);
    free(x), free(y);
    return same;
}

/* Steps [from, steps) of metrics file `got` have the losses of `want` (dir/...). */
static void check_losses(const char *dir, const char *want, const char *got, int from, int steps, const char *what) {
    float a[64], b[64];
    char pa[800], pb[800];
    snprintf(pa, sizeof pa, "%s/%s", dir, want);
    snprintf(pb, sizeof pb, "%s/%s", dir, got);
    if (!CHECK(steps <= 64 && metrics_losses(pa, a, steps, NULL) && metrics_losses(pb, b, steps, NULL),
               "%s: cannot read the metrics", what))
        return;
    for (int s = from; s < steps; s++)
        if (!CHECK(a[s] != 0 && !memcmp(&a[s], &b[s], sizeof a[s]), "%s: step %d's loss is %.9g resumed, %.9g "
                                                                    "uninterrupted",
                   what, s + 1, b[s], a[s]))
            break;
}

/* `run --resume` from a periodic checkpoint ends as the uninterrupted run does: the same
 * losses from the checkpoint on and the same saved weights; for one replica and for two
 * data-parallel replicas (ZeRO-1 slices gathered into the file, and without ZeRO). */
static void cli_resume(const char *sets, const char *what) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "classify", 17) == 0, "cannot write the job");
    char args[1200];
    snprintf(args, sizeof args, "run job.job %s --metrics full.jsonl --save full.safetensors", sets);
    int rc = run_cli(dir, "", args);
    char *text = stderr_of(dir);
    REQUIRE(rc == 0, "%s: uninterrupted run: %s", what, text);
    free(text);
    snprintf(args, sizeof args, "run job.job %s --set checkpoint_every=5 --set keep_checkpoints=2 "
                                "--checkpoint-dir ck --metrics first.jsonl", sets);
    rc = run_cli(dir, "", args);
    text = stderr_of(dir);
    REQUIRE(rc == 0 && strstr(text, "checkpoint ck/step-000015.tgckpt"), "%s: checkpointed run: %s", what, text);
    free(text);
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    CHECK(count_files(ck, ".tgckpt") == 2 && file_exists(ck, "step-000010.tgckpt"), "%s: keep_checkpoints 2", what);
    CHECK(count_files(ck, ".tmp.") == 0, "%s: temporary files left", what);
    check_losses(dir, "full.jsonl", "first.jsonl", 0, 17, what); /* checkpoints change nothing */
    snprintf(args, sizeof args, "run job.job %s --resume ck/step-000010.tgckpt --checkpoint-dir ck2 "
                                "--metrics resumed.jsonl --save resumed.safetensors", sets);
    rc = run_cli(dir, "", args);
    text = stderr_of(dir);
    CHECK(rc == 0 && strstr(text, "resumed from ck/step-000010.tgckpt at step 10 of 17"), "%s: resumed run: %s", what,
          text);
    free(text);
    check_losses(dir, "full.jsonl", "resumed.jsonl", 10, 17, what);
    CHECK(same_file(dir, "full.safetensors", "resumed.safetensors"), "%s: the saved weights differ", what);
}

TG_TEST(test_checkpoint_cli_resume) { cli_resume("", "one replica"); }
TG_TEST(test_checkpoint_cli_resume_data_parallel) {
    if (tg_test_device() && tg_cuda_device_count() < 2) {
        printf("  not run: data parallelism on CUDA needs 2 GPUs\n");
        return;
    }
    cli_resume("--set data_parallel=2 --set zero_stage=1", "2 replicas, ZeRO-1");
    cli_resume("--set data_parallel=2", "2 replicas");
}

/* Starts `tunegraph ARGS...` in dir (env TUNEGRAPH_TEST_CHECKPOINT_STALL=stall), stderr into
 * dir/stderr.txt; its pid. */
static pid_t start_cli(const char *dir, int stall, char **argv) {
    char cli[PATH_MAX], out[800], stall_s[16];
    if (!realpath(tg_test_cli(), cli)) snprintf(cli, sizeof cli, "%s", tg_test_cli());
    snprintf(out, sizeof out, "%s/stderr.txt", dir);
    snprintf(stall_s, sizeof stall_s, "%d", stall);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || chdir(dir) != 0) _exit(127);
        dup2(fd, 1), dup2(fd, 2);
        setenv("TUNEGRAPH_TEST_CHECKPOINT_STALL", stall_s, 1);
        setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
        execv(cli, argv);
        _exit(127);
    }
    return pid;
}

/* Waits until the run says it stalled in a checkpoint save; 0 when it ended first or took
 * longer than 2 minutes. */
static int wait_for_stall(const char *dir, pid_t pid) {
    for (int i = 0; i < 12000; i++) {
        char *text = stderr_of(dir);
        const int stalled = strstr(text, "stalled part-written") != NULL;
        free(text);
        if (stalled) return 1;
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) return 0;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    return 0;
}

/* Waits for the process to end, killing it after 2 minutes; its status. */
static int wait_end(pid_t pid) {
    int status = 0;
    for (int i = 0; i < 12000; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

/* The first SIGTERM (or SIGINT) of a run that checkpoints, arriving while it writes the
 * step-4 checkpoint: the save completes, the run stops at a step every replica can reach,
 * checkpoints there, puts its metrics in place with the interruption last, and ends by the
 * signal; resumed, it ends as the uninterrupted run. */
static void signal_stops(int sig, const char *replicas) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "classify", 12) == 0, "cannot write the job");
    const int two = !strcmp(replicas, "2");
    /* Two replicas with ZeRO-1: replica 0 gathers the others' optimizer slices. */
    const char *dp = two ? "--set data_parallel=2 --set zero_stage=1" : "";
    char args[1000], device[8];
    snprintf(device, sizeof device, "%s", tg_test_device() ? "cuda" : "cpu");
    snprintf(args, sizeof args, "run job.job %s --metrics full.jsonl --save full.safetensors", dp);
    REQUIRE(run_cli(dir, "", args) == 0, "the uninterrupted run failed");
    char *argv[] = {"tunegraph", "run", "job.job", "--device", device, "--set", "checkpoint_every=2",
                    "--checkpoint-dir", "ck", "--metrics", "m.jsonl", "--set", "data_parallel=2", "--set",
                    "zero_stage=1", NULL};
    if (!two) argv[11] = NULL;
    pid_t pid = start_cli(dir, 4, argv);
    REQUIRE(pid > 0, "fork");
    int stalled = wait_for_stall(dir, pid);
    if (stalled) kill(pid, sig);
    else kill(pid, SIGKILL);
    const int status = wait_end(pid);
    char *text = stderr_of(dir);
    REQUIRE(stalled, "the run did not stall at the step-4 checkpoint: %s", text);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sig, "%s, %s replicas: status %#x: %s", strsignal(sig), replicas,
          status, text);
    free(text);
    char ck[700], metrics[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", dir);
    CHECK(count_files(ck, ".tmp.") == 0 && count_files(dir, ".tmp.") == 0, "temporary files left");
    char *path = NULL;
    tg_err err;
    tg_checkpoint read;
    if (CHECK(tg_checkpoint_locate(ck, &path, &err) == 0 && tg_checkpoint_read(path, &read, &err) == 0, "%s", err.msg)) {
        /* One replica stops at once; two may have started one more step. */
        CHECK(read.state.step >= 4 && read.state.step <= 6 && read.state.replicas == atoi(replicas),
              "stopped at step %d of %d replicas", read.state.step, read.state.replicas);
        tg_checkpoint_free(&read);
    }
    free(path);
    float losses[12];
    json_t *last = NULL;
    const char *message = NULL;
    if (metrics_losses(metrics, losses, 12, &last) && last) message = json_string_value(json_object_get(last, "message"));
    CHECK(message && strstr(message, sig == SIGINT ? "interrupted by SIGINT" : "interrupted by SIGTERM"),
          "the metrics do not end with the interruption: %s", message ? message : "(no message)");
    json_decref(last);
    snprintf(args, sizeof args, "run job.job %s --resume ck --metrics resumed.jsonl --save resumed.safetensors", dp);
    int rc = run_cli(dir, "", args);
    text = stderr_of(dir);
    CHECK(rc == 0 && strstr(text, "resumed from ck/step-0000"), "the resumed run: %s", text);
    free(text);
    check_losses(dir, "full.jsonl", "resumed.jsonl", 6, 12, strsignal(sig));
    CHECK(same_file(dir, "full.safetensors", "resumed.safetensors"), "%s: the saved weights differ", strsignal(sig));
}

TG_TEST(test_checkpoint_cli_sigterm_writes_checkpoint) { signal_stops(SIGTERM, "1"); }
TG_TEST(test_checkpoint_cli_sigint_writes_checkpoint) { signal_stops(SIGINT, "1"); }
TG_TEST(test_checkpoint_cli_sigterm_data_parallel) {
    if (tg_test_device() && tg_cuda_device_count() < 2) {
        printf("  not run: data parallelism on CUDA needs 2 GPUs\n");
        return;
    }
    signal_stops(SIGTERM, "2");
}

/* A second signal ends the run at once: the save under way is dropped (its temporary file
 * removed), the previous checkpoint stays the latest. Both signals are pending together
 * (the process stopped meanwhile), so the second is handled right after the first. */
TG_TEST(test_checkpoint_cli_second_signal_ends_at_once) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "classify", 12) == 0, "cannot write the job");
    char device[8];
    snprintf(device, sizeof device, "%s", tg_test_device() ? "cuda" : "cpu");
    char *argv[] = {"tunegraph", "run", "job.job", "--device", device, "--set", "checkpoint_every=2",
                    "--checkpoint-dir", "ck", NULL};
    pid_t pid = start_cli(dir, 4, argv);
    REQUIRE(pid > 0, "fork");
    const int stalled = wait_for_stall(dir, pid);
    int status = 0;
    if (stalled) {
        kill(pid, SIGSTOP);
        waitpid(pid, &status, WUNTRACED);
        kill(pid, SIGTERM);
        kill(pid, SIGINT);
        kill(pid, SIGCONT);
    } else {
        kill(pid, SIGKILL);
    }
    status = wait_end(pid);
    REQUIRE(stalled, "the run did not stall at the step-4 checkpoint");
    CHECK(WIFSIGNALED(status) && (WTERMSIG(status) == SIGTERM || WTERMSIG(status) == SIGINT), "status %#x", status);
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    CHECK(count_files(ck, ".tmp.") == 0, "the save's temporary file was left");
    CHECK(!file_exists(ck, "step-000004.tgckpt") && file_exists(ck, "step-000002.tgckpt"),
          "the step-4 save was completed after a second signal");
}

/* SIGKILL while a checkpoint is half written: the previous one stays the latest, loads, and
 * the run resumed from the folder ends as the uninterrupted one; the next save there
 * removes the dead writer's temporary file. */
TG_TEST(test_checkpoint_cli_sigkill_during_save) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "classify", 12) == 0, "cannot write the job");
    REQUIRE(run_cli(dir, "", "run job.job --metrics full.jsonl --save full.safetensors") == 0, "uninterrupted run");
    char device[8];
    snprintf(device, sizeof device, "%s", tg_test_device() ? "cuda" : "cpu");
    char *argv[] = {"tunegraph", "run", "job.job", "--device", device, "--set", "checkpoint_every=2",
                    "--checkpoint-dir", "ck", NULL};
    pid_t pid = start_cli(dir, 4, argv);
    REQUIRE(pid > 0, "fork");
    const int stalled = wait_for_stall(dir, pid);
    kill(pid, SIGKILL);
    wait_end(pid);
    REQUIRE(stalled, "the run did not stall at the step-4 checkpoint");
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    CHECK(count_files(ck, ".tmp.") == 1 && !file_exists(ck, "step-000004.tgckpt"), "the half-written save");
    char *path = NULL;
    tg_err err;
    tg_checkpoint read;
    if (CHECK(tg_checkpoint_locate(ck, &path, &err) == 0 && tg_checkpoint_read(path, &read, &err) == 0, "%s", err.msg)) {
        CHECK(read.state.step == 2, "the latest checkpoint is of step %d", read.state.step);
        tg_checkpoint_free(&read);
    }
    free(path);
    int rc = run_cli(dir, "", "run job.job --set checkpoint_every=2 --resume ck --metrics resumed.jsonl "
                              "--save resumed.safetensors");
    char *text = stderr_of(dir);
    CHECK(rc == 0 && strstr(text, "resumed from ck/step-000002.tgckpt at step 2 of 12"), "resumed: %s", text);
    free(text);
    check_losses(dir, "full.jsonl", "resumed.jsonl", 2, 12, "after SIGKILL");
    CHECK(same_file(dir, "full.safetensors", "resumed.safetensors"), "the saved weights differ");
    CHECK(count_files(ck, ".tmp.") == 0 && file_exists(ck, "step-000012.tgckpt"), "after the resumed run's saves");
}

/* Refusals before any training: another job's checkpoint (naming what differs), a damaged
 * one (naming the file and field), a fresh run into a folder holding checkpoints, a resume
 * from an earlier checkpoint into a folder holding later ones, checkpoint_every without a
 * folder. */
TG_TEST(test_checkpoint_cli_refusals) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "classify", 8) == 0, "cannot write the job");
    REQUIRE(run_cli(dir, "", "run job.job --set checkpoint_every=2 --set keep_checkpoints=0 --checkpoint-dir ck") == 0,
            "checkpointed run");
    const struct {
        const char *args, *want[2];
    } cases[] = {
        {"run job.job --set batch=8 --resume ck --checkpoint-dir ck2",
         {"ck/step-000008.tgckpt: the checkpoint is of another job or plan", "batch: 4 in the checkpoint, 8 now"}},
        {"run job.job --resume ck/step-000004.tgckpt", {"ck: the checkpoint folder holds step-000008.tgckpt, past step 4"}},
        {"run job.job --checkpoint-dir ck", {"ck: the checkpoint folder already holds checkpoints", "--resume ck"}},
        {"run job.job --set checkpoint_every=3", {"key 'checkpoint_every' (3) needs a folder"}},
        {"run job.job --resume ck/nothing", {"ck/nothing: cannot open the checkpoint"}},
        {"run job.job --resume bad.tgckpt --checkpoint-dir ck3", {"bad.tgckpt: ", "(file corrupt)"}},
    };
    char good[800], bad[800];
    snprintf(good, sizeof good, "%s/ck/step-000006.tgckpt", dir);
    snprintf(bad, sizeof bad, "%s/bad.tgckpt", dir);
    long len = 0;
    char *bytes = tg_test_read_file(good, &len);
    REQUIRE(bytes && len > 200, "no checkpoint at step 6");
    bytes[len - 5] ^= 1;
    FILE *f = fopen(bad, "wb");
    REQUIRE(f && fwrite(bytes, 1, (size_t)len, f) == (size_t)len, "write");
    fclose(f);
    free(bytes);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int rc = run_cli(dir, "", cases[k].args);
        char *text = stderr_of(dir);
        CHECK(rc == 1, "'%s': status %d: %s", cases[k].args, rc, text);
        for (int w = 0; w < 2 && cases[k].want[w]; w++)
            CHECK(strstr(text, cases[k].want[w]), "'%s': the message lacks '%s': %s", cases[k].args, cases[k].want[w],
                  text);
        free(text);
    }
}

/* ---- the library ------------------------------------------------------------------------- */

/* tunegraph_trainer_save_checkpoint between steps (with steps in flight, whose metrics still
 * come in order) and the job's own checkpoints, then tunegraph_trainer_resume in a new
 * trainer: the same losses as one uninterrupted trainer. */
TG_TEST(test_checkpoint_api) {
    const char *dir = tg_test_tmpdir();
    REQUIRE(write_job(dir, "lm", 14) == 0, "cannot write the job");
    char job[700], ck_dir[700], every[800], manual[700];
    snprintf(job, sizeof job, "%s/job.job", dir);
    snprintf(ck_dir, sizeof ck_dir, "%s/ck", dir);
    snprintf(manual, sizeof manual, "%s/manual", dir);
    snprintf(every, sizeof every, "checkpoint_dir=%s", ck_dir);
    const char *sets[] = {"checkpoint_every=6", every};
    tunegraph_trainer_options o = {.struct_size = sizeof o,
                                   .device = tg_test_device() ? TUNEGRAPH_DEVICE_CUDA : TUNEGRAPH_DEVICE_CPU,
                                   .max_in_flight = 4};
    tunegraph_plan *plan = NULL, *plain = NULL;
    tunegraph_trainer *t = NULL;
    double want[14], got[14];
    deterministic_gemms(1);
    REQUIRE(tunegraph_compile_file(job, sets, 2, &plan) == 0 && tunegraph_compile_file(job, NULL, 0, &plain) == 0, "%s",
            tunegraph_last_error());
    int ok = CHECK(tunegraph_trainer_open(plain, &o, &t) == 0, "%s", tunegraph_last_error());
    for (int s = 0; ok && s < 14; s++) {
        tunegraph_step_metrics m = {.struct_size = sizeof m};
        ok = CHECK(tunegraph_trainer_step(t, &m) == 0, "%s", tunegraph_last_error());
        want[s] = m.loss;
    }
    tunegraph_trainer_close(t);
    ok = ok && CHECK(tunegraph_trainer_open(plan, &o, &t) == 0, "%s", tunegraph_last_error());
    for (int s = 0; ok && s < 9; s++) {
        tunegraph_step_metrics m = {.struct_size = sizeof m};
        ok = CHECK(tunegraph_trainer_step(t, &m) == 0, "%s", tunegraph_last_error()) &&
             CHECK(m.step == s + 1 && m.loss == want[s], "step %lld: loss %.9g, uninterrupted %.9g", (long long)m.step,
                   m.loss, want[s]);
        if (ok && s == 2) ok = CHECK(tunegraph_trainer_save_checkpoint(t, manual) == 0, "%s", tunegraph_last_error());
    }
    int64_t done = -1;
    ok = ok && CHECK(tunegraph_trainer_steps_done(t, &done) == 0 && done == 9, "steps done %lld", (long long)done);
    tunegraph_trainer_close(t);
    /* The one made by hand holds the steps queued when it was asked for (none on the CPU). */
    char *path = NULL;
    tg_err err;
    tg_checkpoint read;
    int manual_step = -1;
    if (ok && CHECK(tg_checkpoint_locate(manual, &path, &err) == 0 && tg_checkpoint_read(path, &read, &err) == 0, "%s",
                    err.msg)) {
        manual_step = read.state.step;
        tg_checkpoint_free(&read);
    }
    free(path);
    /* On CUDA the trainer queues steps ahead (as many as its ring holds), so the one made by
     * hand after step 3's metrics is of step 3 up to the last of the 14. */
    ok = ok && CHECK(file_exists(ck_dir, "step-000006.tgckpt") && manual_step >= 3 && manual_step <= 14 &&
                         (tg_test_device() || manual_step == 3),
                     "the checkpoints (by hand at step %d)", manual_step);
    /* From the job's checkpoint at step 6, and from the one made by hand. */
    const char *from[] = {ck_dir, manual};
    const int at[] = {6, manual_step};
    for (int k = 0; ok && k < 2; k++) {
        ok = CHECK(tunegraph_trainer_open(plain, &o, &t) == 0, "%s", tunegraph_last_error()) &&
             CHECK(tunegraph_trainer_resume(t, from[k]) == 0, "%s", tunegraph_last_error()) &&
             CHECK(tunegraph_trainer_steps_done(t, &done) == 0 && done == at[k], "resumed at %lld", (long long)done);
        for (int s = at[k]; ok && s < 14; s++) {
            tunegraph_step_metrics m = {.struct_size = sizeof m};
            ok = CHECK(tunegraph_trainer_step(t, &m) == 0, "%s", tunegraph_last_error());
            got[s] = m.loss;
            ok = ok && CHECK(m.step == s + 1 && got[s] == want[s], "from step %d: step %lld: loss %.9g, uninterrupted "
                                                                     "%.9g",
                             at[k], (long long)m.step, got[s], want[s]);
        }
        CHECK(tunegraph_trainer_resume(t, from[k]) != 0 && strstr(tunegraph_last_error(), "has taken steps"),
              "resumed a trainer that has trained: %s", tunegraph_last_error());
        tunegraph_trainer_close(t);
        t = NULL;
    }
    deterministic_gemms(0);
    tunegraph_plan_free(plan);
    tunegraph_plan_free(plain);
}
