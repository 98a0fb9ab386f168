/* Job files, JSONL datasets, batch filling and the sampler. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "datasets/dataset.h"
#include "tests/harness.h"
#include "plan/ops.h"

/* ---- job helpers ---- */

static const char *write_tmp(const char *name, const char *text) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", tg_test_tmpdir(), name);
    if (tg_test_write_file(path, text) != 0) return NULL;
    return path;
}

/* Loads a job from `text` and expects failure with every needle in the message. */
static void expect_job_error(const char *text, const char *const *ov, int n_ov,
                             const char *n1, const char *n2, const char *n3) {
    const char *path = write_tmp("job.txt", text);
    REQUIRE(path, "write job");
    tg_job job;
    tg_err err = {{0}};
    int rc = tg_job_load(path, ov, n_ov, &job, &err);
    CHECK(rc == -1, "expected failure for:\n%s", text);
    const char *needles[3] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i])
            CHECK(strstr(err.msg, needles[i]) != NULL, "message '%s' lacks '%s'", err.msg,
                  needles[i]);
}

#define BASE "model = tiny-bert\ntrain_data = t.jsonl\nsteps = 10\n"

TG_TEST(test_job_valid_parses) {
    const char *path = write_tmp("job.txt",
                                 "# a job\n"
                                 "model = bert-base-uncased\n"
                                 "task = classify\n"
                                 "num_labels = 3\n"
                                 "batch = 16\n"
                                 "seq = 64\n"
                                 "precision = bf16\n"
                                 "allow_tf32 = true\n"
                                 "optimizer = adamw\n"
                                 "lr = 2e-5\n"
                                 "beta1 = 0.8\n"
                                 "beta2 = 0.99\n"
                                 "eps = 1e-6\n"
                                 "weight_decay = 0.1\n"
                                 "warmup_steps = 5\n"
                                 "steps = 100\n"
                                 "grad_clip = 0\n"
                                 "seed = 18446744073709551615\n"
                                 "pad_token_id = 1\n"
                                 "log_every = 7\n"
                                 "train_data = /abs/train.jsonl\n"
                                 "eval_data = /abs/eval.jsonl\n"
                                 "attention = unfused\n"
                                 "fuse_bias_grad = false\n"
                                 "fuse_gelu = false\n"
                                 "fuse_residual_layernorm = 0\n"
                                 "fuse_qkv = false\n");
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
    CHECK(strcmp(j.path, path) == 0, "path %s", j.path);
    CHECK(strcmp(j.model, "bert-base-uncased") == 0, "model %s", j.model);
    CHECK(j.task == TG_TASK_CLASSIFY && j.num_labels == 3, "task/labels");
    CHECK(j.batch == 16 && j.seq == 64, "batch %d seq %d", j.batch, j.seq);
    CHECK(j.precision == TG_PREC_BF16 && j.allow_tf32 == 1, "precision/tf32");
    CHECK(j.lr == 2e-5f && j.beta1 == 0.8f && j.beta2 == 0.99f && j.eps == 1e-6f, "adam");
    CHECK(j.weight_decay == 0.1f && j.warmup_steps == 5 && j.steps == 100 && j.epochs == 0,
          "schedule");
    CHECK(j.grad_clip == 0.0f, "grad_clip %g", j.grad_clip);
    CHECK(j.seed == UINT64_MAX, "seed %llu", (unsigned long long)j.seed);
    CHECK(j.pad_token_id == 1 && j.log_every == 7, "pad/log");
    CHECK(strcmp(j.train_data, "/abs/train.jsonl") == 0, "train %s", j.train_data);
    CHECK(strcmp(j.eval_data, "/abs/eval.jsonl") == 0, "eval %s", j.eval_data);
    CHECK(j.key_line[TG_JOB_MODEL] == 2 && j.key_line[TG_JOB_EVAL_DATA] == 22, "lines %d %d",
          j.key_line[TG_JOB_MODEL], j.key_line[TG_JOB_EVAL_DATA]);
    CHECK(j.attention == TG_ATTENTION_UNFUSED && j.key_line[TG_JOB_ATTENTION] == 23, "attention %d line %d",
          j.attention, j.key_line[TG_JOB_ATTENTION]);
    CHECK(strcmp(tg_job_key_name(TG_JOB_ATTENTION), "attention") == 0, "attention key name");
    CHECK(j.fuse_bias_grad == 0 && j.key_line[TG_JOB_FUSE_BIAS_GRAD] == 24, "fuse_bias_grad %d line %d",
          j.fuse_bias_grad, j.key_line[TG_JOB_FUSE_BIAS_GRAD]);
    CHECK(strcmp(tg_job_key_name(TG_JOB_FUSE_BIAS_GRAD), "fuse_bias_grad") == 0, "fuse_bias_grad key name");
    CHECK(j.fuse_gelu == 0 && j.key_line[TG_JOB_FUSE_GELU] == 25, "fuse_gelu %d line %d", j.fuse_gelu,
          j.key_line[TG_JOB_FUSE_GELU]);
    CHECK(strcmp(tg_job_key_name(TG_JOB_FUSE_GELU), "fuse_gelu") == 0, "fuse_gelu key name");
    CHECK(j.fuse_residual_layernorm == 0 && j.key_line[TG_JOB_FUSE_RESIDUAL_LAYERNORM] == 26,
          "fuse_residual_layernorm %d line %d", j.fuse_residual_layernorm, j.key_line[TG_JOB_FUSE_RESIDUAL_LAYERNORM]);
    CHECK(strcmp(tg_job_key_name(TG_JOB_FUSE_RESIDUAL_LAYERNORM), "fuse_residual_layernorm") == 0,
          "fuse_residual_layernorm key name");
    CHECK(j.fuse_qkv == 0 && j.key_line[TG_JOB_FUSE_QKV] == 27, "fuse_qkv %d line %d", j.fuse_qkv,
          j.key_line[TG_JOB_FUSE_QKV]);
    CHECK(strcmp(tg_job_key_name(TG_JOB_FUSE_QKV), "fuse_qkv") == 0, "fuse_qkv key name");
    char buf[1200], want[1200];
    snprintf(want, sizeof want, "%s:10", path);
    CHECK(strcmp(tg_job_where(&j, TG_JOB_LR, buf, sizeof buf), want) == 0, "where %s", buf);
    CHECK(strcmp(tg_job_key_name(TG_JOB_WARMUP_STEPS), "warmup_steps") == 0, "key name");
}

TG_TEST(test_job_comments_quotes_whitespace) {
    const char *path = write_tmp("job.txt",
                                 "\xEF\xBB\xBF# BOM, then comments\n"
                                 "\n"
                                 "   # indented comment\n"
                                 "\tmodel\t=   \"my#model\"   # trailing comment\r\n"
                                 "task=lm\n"
                                 "train_data = \"train data.jsonl\"\n"
                                 "epochs = 3 # three passes\n"
                                 "lr = 1e-4#not-a-comment-without-space\n");
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    int rc = tg_job_load(path, NULL, 0, &j, &err);
    /* `1e-4#...` is not a number: '#' only starts a comment after whitespace. */
    CHECK(rc == -1 && strstr(err.msg, ":8: key 'lr'"), "msg %s", err.msg);

    path = write_tmp("job.txt",
                     "\xEF\xBB\xBF# BOM, then comments\n"
                     "\n"
                     "   # indented comment\n"
                     "\tmodel\t=   \"my#model\"   # trailing comment\r\n"
                     "task=lm\n"
                     "train_data = \"train data.jsonl\"\n"
                     "epochs = 3 # three passes\n");
    REQUIRE(path, "write");
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
    CHECK(strcmp(j.model, "my#model") == 0, "model '%s'", j.model);
    CHECK(j.task == TG_TASK_LM && j.epochs == 3 && j.steps == 0, "task/epochs");
    CHECK(j.key_line[TG_JOB_MODEL] == 4 && j.key_line[TG_JOB_EPOCHS] == 7, "lines");
    char want[1100];
    snprintf(want, sizeof want, "%s", path);
    *strrchr(want, '/') = 0;
    strcat(want, "/train data.jsonl");
    CHECK(strcmp(j.train_data, want) == 0, "train '%s' want '%s'", j.train_data, want);
}

TG_TEST(test_job_defaults_applied) {
    const char *path = write_tmp("job.txt", BASE);
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
    CHECK(j.task == TG_TASK_CLASSIFY && j.num_labels == 2, "task");
    CHECK(j.batch == 8 && j.seq == 128 && j.precision == TG_PREC_FP32 && !j.allow_tf32, "shape");
    CHECK(j.lr == 5e-5f && j.beta1 == 0.9f && j.beta2 == 0.999f && j.eps == 1e-8f, "adam");
    CHECK(j.weight_decay == 0.01f && j.warmup_steps == 0 && j.grad_clip == 1.0f, "wd/clip");
    CHECK(j.seed == 42 && j.log_every == 1 && j.pad_token_id == -1, "seed/log/pad");
    CHECK(j.attention == TG_ATTENTION_FUSED && j.key_line[TG_JOB_ATTENTION] == 0, "attention defaults to fused");
    CHECK(j.fuse_bias_grad == 1 && j.key_line[TG_JOB_FUSE_BIAS_GRAD] == 0, "fuse_bias_grad defaults to true");
    CHECK(j.fuse_gelu == 1 && j.key_line[TG_JOB_FUSE_GELU] == 0, "fuse_gelu defaults to true");
    CHECK(j.fuse_residual_layernorm == 1 && j.key_line[TG_JOB_FUSE_RESIDUAL_LAYERNORM] == 0,
          "fuse_residual_layernorm defaults to true");
    CHECK(j.fuse_qkv == 1 && j.key_line[TG_JOB_FUSE_QKV] == 0, "fuse_qkv defaults to true");
    CHECK(j.eval_data[0] == 0, "no eval");
    CHECK(j.key_line[TG_JOB_LR] == 0 && j.key_line[TG_JOB_STEPS] == 3, "lines");
    char buf[1200], want[1200];
    snprintf(want, sizeof want, "%s (default)", path);
    CHECK(strcmp(tg_job_where(&j, TG_JOB_BATCH, buf, sizeof buf), want) == 0, "where %s", buf);
}

TG_TEST(test_job_relative_paths) {
    const char *dir = tg_test_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/job.txt", dir);
    REQUIRE(tg_test_write_file(path, "model = ./models/bert\ntrain_data = data/t.jsonl\n"
                                     "eval_data = /abs/e.jsonl\nsteps = 1\n") == 0, "write");
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
    char want[1200];
    snprintf(want, sizeof want, "%s/./models/bert", dir);
    CHECK(strcmp(j.model, want) == 0, "model %s", j.model);
    snprintf(want, sizeof want, "%s/data/t.jsonl", dir);
    CHECK(strcmp(j.train_data, want) == 0, "train %s", j.train_data);
    CHECK(strcmp(j.eval_data, "/abs/e.jsonl") == 0, "eval %s", j.eval_data);

    /* A preset name (no '/') is kept as written. */
    REQUIRE(tg_test_write_file(path, "model = roberta-base\ntrain_data = t.jsonl\nsteps = 1\n") == 0,
            "write");
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
    CHECK(strcmp(j.model, "roberta-base") == 0, "model %s", j.model);
}

/* `run PLAN --set`: the run keys change the plan's run settings (parsed as in a job
 * file), a compiled-in key or a bad value is refused naming the key, and a refused list
 * leaves the settings as they were. */
TG_TEST(test_job_run_overrides_on_plan) {
    tg_job job;
    tg_plan plan;
    tg_err err = {{0}};
    REQUIRE(tg_job_load("examples/demo-classify.job", NULL, 0, &job, &err) == 0, "load: %s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "compile: %s", err.msg);
    const tg_plan_train train = plan.train;
    CHECK(plan.run.steps == 200 && plan.run.epochs == 0 && plan.run.seed == 42 && plan.run.log_every == 10 &&
              strcmp(plan.run.train_data, "examples/data/sentiment-train.jsonl") == 0,
          "compiled run settings: steps %d seed %llu log_every %d train %s", plan.run.steps,
          (unsigned long long)plan.run.seed, plan.run.log_every, plan.run.train_data);

    const char *sets[] = {"steps = 7", "seed=18446744073709551615", "log_every=3", "train_data=rel/t.jsonl",
                          "eval_data=\"/abs/e.jsonl\""};
    REQUIRE(tg_job_apply_run_overrides(&plan.run, 1, sets, 5, "d.tgp", &err) == 0, "run keys: %s", err.msg);
    CHECK(plan.run.steps == 7 && plan.run.epochs == 0 && plan.run.seed == UINT64_MAX && plan.run.log_every == 3,
          "steps %d epochs %d seed %llu log_every %d", plan.run.steps, plan.run.epochs,
          (unsigned long long)plan.run.seed, plan.run.log_every);
    /* Command-line paths stay relative to the current directory, not the job's folder. */
    CHECK(strcmp(plan.run.train_data, "rel/t.jsonl") == 0 && strcmp(plan.run.eval_data, "/abs/e.jsonl") == 0,
          "train %s eval %s", plan.run.train_data, plan.run.eval_data);
    CHECK(memcmp(&train, &plan.train, sizeof train) == 0, "run keys changed the compiled-in settings");

    /* epochs replaces the plan's steps, and the other way round. */
    const char *epochs[] = {"epochs=2"};
    REQUIRE(tg_job_apply_run_overrides(&plan.run, 1, epochs, 1, "d.tgp", &err) == 0, "epochs: %s", err.msg);
    CHECK(plan.run.epochs == 2 && plan.run.steps == 0, "epochs %d steps %d", plan.run.epochs, plan.run.steps);
    const char *steps[] = {"steps=5"};
    REQUIRE(tg_job_apply_run_overrides(&plan.run, 1, steps, 1, "d.tgp", &err) == 0, "steps: %s", err.msg);
    CHECK(plan.run.steps == 5 && plan.run.epochs == 0, "steps %d epochs %d", plan.run.steps, plan.run.epochs);

    const tg_plan_run before = plan.run;
    struct {
        const char *set;
        const char *want;
    } refused[] = {
        {"batch=4", "--set batch=4: this key is compiled into d.tgp; recompile the job to change it (a plan takes "
                    "steps, epochs, seed, log_every, train_data, eval_data, checkpoint_every, keep_checkpoints, "
                    "checkpoint_dir, last_batch, skip_nonfinite, max_skipped_steps, qa_n_best, qa_max_answer_length, "
                      "qa_null_threshold, gpu_hour_price)"},
        {"lr=0.1", "--set lr=0.1: this key is compiled into d.tgp"},
        /* The first key of the table (model) too. */
        {"model=tiny-gpt2", "--set model=tiny-gpt2: this key is compiled into d.tgp; recompile the job to change it"},
        {"steps=0", "--set steps=0: key 'steps': 0 is out of range (must be 1..2147483647)"},
        {"seed=-1", "--set seed=-1: key 'seed': '-1' is not a non-negative integer"},
        {"log_every=often", "--set log_every=often: key 'log_every': 'often' is not an integer"},
        {"train_data=", "--set train_data=: key 'train_data': value is empty"},
        {"stpes=3", "--set stpes=3: key 'stpes': unknown key (did you mean 'steps'?)"},
    };
    for (size_t c = 0; c < sizeof refused / sizeof refused[0]; c++) {
        const char *one[] = {"seed=5", refused[c].set}; /* the good key before it is not kept either */
        memset(&err, 0, sizeof err);
        CHECK(tg_job_apply_run_overrides(&plan.run, 1, one, 2, "d.tgp", &err) == -1, "--set %s accepted",
              refused[c].set);
        CHECK(strstr(err.msg, refused[c].want) == err.msg, "--set %s: '%s' lacks '%s'", refused[c].set, err.msg,
              refused[c].want);
        CHECK(memcmp(&before, &plan.run, sizeof before) == 0, "--set %s changed the run settings", refused[c].set);
    }
    const char *both[] = {"steps=5", "epochs=1"};
    CHECK(tg_job_apply_run_overrides(&plan.run, 1, both, 2, "d.tgp", &err) == -1 &&
              strstr(err.msg, "d.tgp: keys 'steps' (--set) and 'epochs' (--set) are both set; give exactly one"),
          "both: %s", err.msg);
    tg_plan_free(&plan);
}

TG_TEST(test_job_set_overrides) {
    const char *path = write_tmp("job.txt", BASE "lr = 1e-3\nbatch = 4\n");
    REQUIRE(path, "write");
    const char *ov[] = {"lr=3e-4", " batch = 32 ", "train_data=rel/x.jsonl", "task=lm",
                        "epochs=2", "attention=unfused", "fuse_bias_grad=0", "fuse_gelu=false",
                        "fuse_residual_layernorm=false", "fuse_qkv=0"};
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, ov, 10, &j, &err) == 0, "load: %s", err.msg);
    CHECK(j.fuse_qkv == 0 && j.key_line[TG_JOB_FUSE_QKV] == -1, "--set fuse_qkv");
    CHECK(j.fuse_gelu == 0 && j.key_line[TG_JOB_FUSE_GELU] == -1, "--set fuse_gelu");
    CHECK(j.fuse_bias_grad == 0 && j.key_line[TG_JOB_FUSE_BIAS_GRAD] == -1, "--set fuse_bias_grad");
    CHECK(j.fuse_residual_layernorm == 0 && j.key_line[TG_JOB_FUSE_RESIDUAL_LAYERNORM] == -1,
          "--set fuse_residual_layernorm");
    CHECK(j.attention == TG_ATTENTION_UNFUSED && j.key_line[TG_JOB_ATTENTION] == -1, "--set attention");
    CHECK(j.lr == 3e-4f && j.batch == 32, "lr %g batch %d", j.lr, j.batch);
    CHECK(strcmp(j.train_data, "rel/x.jsonl") == 0, "override path kept: %s", j.train_data);
    CHECK(j.key_line[TG_JOB_LR] == -1 && j.key_line[TG_JOB_BATCH] == -1, "lines -1");
    CHECK(j.key_line[TG_JOB_MODEL] == 1, "model line");
    /* --set epochs replaces the file's steps rather than conflicting with it. */
    CHECK(j.epochs == 2 && j.steps == 0, "epochs %d steps %d", j.epochs, j.steps);
    char buf[64];
    CHECK(strcmp(tg_job_where(&j, TG_JOB_LR, buf, sizeof buf), "--set") == 0, "where %s", buf);

    /* apply_overrides on an existing job; errors name the override. */
    const char *bad[] = {"seq=0"};
    CHECK(tg_job_apply_overrides(&j, bad, 1, &err) == -1, "seq=0 accepted");
    CHECK(strstr(err.msg, "--set seq=0: ") == err.msg, "msg %s", err.msg);
    const char *typo[] = {"btach=3"};
    CHECK(tg_job_apply_overrides(&j, typo, 1, &err) == -1, "typo accepted");
    CHECK(strstr(err.msg, "--set btach=3: key 'btach': unknown key (did you mean 'batch'?)"),
          "msg %s", err.msg);
    const char *noeq[] = {"lr"};
    CHECK(tg_job_apply_overrides(&j, noeq, 1, &err) == -1 && strstr(err.msg, "--set lr: "),
          "msg %s", err.msg);
    /* Both set on the command line is still a conflict. */
    const char *both[] = {"steps=5", "epochs=1"};
    tg_job j2;
    CHECK(tg_job_load(path, both, 2, &j2, &err) == -1 && strstr(err.msg, "both"), "msg %s",
          err.msg);
}

TG_TEST(test_job_error_unknown_key) {
    expect_job_error(BASE "warmup_step = 3\n", NULL, 0, "job.txt:4: key 'warmup_step'",
                     "unknown key", "did you mean 'warmup_steps'?");
    expect_job_error(BASE "frobnicate = 3\n", NULL, 0, "job.txt:4: key 'frobnicate'",
                     "unknown key", NULL);
    const char *path = write_tmp("job.txt", BASE "frobnicate = 3\n");
    tg_job j;
    tg_err err = {{0}};
    CHECK(tg_job_load(path, NULL, 0, &j, &err) == -1 && !strstr(err.msg, "did you mean"),
          "no suggestion expected: %s", err.msg);
}

TG_TEST(test_job_error_duplicate) {
    expect_job_error(BASE "lr = 1e-3\n\nlr = 2e-3\n", NULL, 0, "job.txt:6: key 'lr'", "duplicate",
                     "line 4");
}

TG_TEST(test_job_error_missing_equals) {
    expect_job_error(BASE "# c\nlr 1e-3\n", NULL, 0, "job.txt:5:", "missing '='", NULL);
}

TG_TEST(test_job_error_bad_int) {
    expect_job_error(BASE "batch = 8x\n", NULL, 0, "job.txt:4: key 'batch'", "not an integer", NULL);
    expect_job_error(BASE "batch = 1.5\n", NULL, 0, "job.txt:4: key 'batch'", "not an integer",
                     NULL);
    expect_job_error(BASE "batch = 0\n", NULL, 0, "job.txt:4: key 'batch'", "out of range", NULL);
    expect_job_error(BASE "seq = 99999999999\n", NULL, 0, "job.txt:4: key 'seq'", "out of range",
                     NULL);
    expect_job_error(BASE "warmup_steps = -1\n", NULL, 0, "key 'warmup_steps'", "out of range",
                     NULL);
    expect_job_error(BASE "seed = -1\n", NULL, 0, "job.txt:4: key 'seed'", NULL, NULL);
    expect_job_error(BASE "seed = 18446744073709551616\n", NULL, 0, "key 'seed'", "out of range",
                     NULL);
    expect_job_error(BASE "log_every = \n", NULL, 0, "job.txt:4: key 'log_every'", NULL, NULL);
}

TG_TEST(test_job_error_bad_float) {
    expect_job_error(BASE "lr = 0\n", NULL, 0, "job.txt:4: key 'lr'", "out of range", NULL);
    expect_job_error(BASE "lr = -1e-3\n", NULL, 0, "job.txt:4: key 'lr'", "out of range", NULL);
    expect_job_error(BASE "beta2 = 1.0\n", NULL, 0, "job.txt:4: key 'beta2'", "out of range", NULL);
    expect_job_error(BASE "beta1 = -0.1\n", NULL, 0, "key 'beta1'", "out of range", NULL);
    expect_job_error(BASE "eps = 0\n", NULL, 0, "key 'eps'", "out of range", NULL);
    expect_job_error(BASE "weight_decay = -0.01\n", NULL, 0, "key 'weight_decay'", "out of range",
                     NULL);
    expect_job_error(BASE "grad_clip = nan\n", NULL, 0, "job.txt:4: key 'grad_clip'", NULL, NULL);
    expect_job_error(BASE "lr = inf\n", NULL, 0, "job.txt:4: key 'lr'", "finite", NULL);
    expect_job_error(BASE "lr = 1e40\n", NULL, 0, "job.txt:4: key 'lr'", "finite", NULL);
    expect_job_error(BASE "lr = fast\n", NULL, 0, "job.txt:4: key 'lr'", "not a number", NULL);
}

TG_TEST(test_job_error_bad_enum) {
    expect_job_error(BASE "task = regress\n", NULL, 0, "job.txt:4: key 'task'", "'regress'",
                     "classify, lm");
    expect_job_error(BASE "precision = fp8\n", NULL, 0, "job.txt:4: key 'precision'", "fp8", NULL);
    expect_job_error(BASE "optimizer = sgd\n", NULL, 0, "job.txt:4: key 'optimizer'", "adamw", NULL);
    expect_job_error(BASE "allow_tf32 = maybe\n", NULL, 0, "job.txt:4: key 'allow_tf32'", NULL,
                     NULL);
    expect_job_error(BASE "eval_data = \"unterminated\n", NULL, 0, "job.txt:4: key 'eval_data'",
                     "unterminated", NULL);
}

TG_TEST(test_job_error_bad_attention) {
    expect_job_error(BASE "attention = flash\n", NULL, 0,
                     "job.txt:4: key 'attention': 'flash' is not one of fused, unfused", NULL, NULL);
    expect_job_error(BASE "attention =\n", NULL, 0, "job.txt:4: key 'attention': '' is not one of", NULL, NULL);
    const char *upper[] = {"attention=Fused"};
    expect_job_error(BASE, upper, 1, "--set attention=Fused: key 'attention'", "'Fused'", "fused, unfused");
    expect_job_error(BASE "atention = fused\n", NULL, 0, "job.txt:4: key 'atention'", "did you mean 'attention'?",
                     NULL);
}

/* A boolean key: a value that is none of true, false, 1, 0 (in the file and through
 * --set) and a misspelt name get errors naming the line or override and the key. */
static void expect_bool_key_errors(const char *key, const char *bad, const char *typo) {
    char text[512], want[512], set[128], where[256];
    snprintf(text, sizeof text, BASE "%s = %s\n", key, bad);
    snprintf(want, sizeof want, "job.txt:4: key '%s': '%s' is not a boolean (true, false, 1, 0)", key, bad);
    expect_job_error(text, NULL, 0, want, NULL, NULL);
    snprintf(set, sizeof set, "%s=2", key);
    snprintf(where, sizeof where, "--set %s=2: key '%s'", key, key);
    const char *two[] = {set};
    expect_job_error(BASE, two, 1, where, "'2' is not a boolean", NULL);
    snprintf(text, sizeof text, BASE "%s = true\n", typo);
    snprintf(where, sizeof where, "job.txt:4: key '%s'", typo);
    snprintf(want, sizeof want, "did you mean '%s'?", key);
    expect_job_error(text, NULL, 0, where, want, NULL);
}

TG_TEST(test_job_error_bad_fuse_bias_grad) {
    expect_bool_key_errors("fuse_bias_grad", "yes", "fuse_bias_grads");
    expect_job_error(BASE "fuse_bias_grad =\n", NULL, 0, "job.txt:4: key 'fuse_bias_grad': '' is not a boolean", NULL,
                     NULL);
}

TG_TEST(test_job_error_bad_fuse_gelu) { expect_bool_key_errors("fuse_gelu", "tanh", "fuse_gelus"); }

TG_TEST(test_job_error_bad_fuse_residual_layernorm) {
    expect_bool_key_errors("fuse_residual_layernorm", "on", "fuse_residual_layernorms");
}

TG_TEST(test_job_error_bad_fuse_qkv) { expect_bool_key_errors("fuse_qkv", "packed", "fuse_qvk"); }

TG_TEST(test_job_error_steps_epochs) {
    expect_job_error(BASE "epochs = 2\n", NULL, 0, "'steps'", "'epochs'", "both");
    expect_job_error("model = m\ntrain_data = t.jsonl\n", NULL, 0, "job.txt", "'steps'",
                     "'epochs'");
}

TG_TEST(test_job_error_missing_required) {
    expect_job_error("train_data = t.jsonl\nsteps = 1\n", NULL, 0, "job.txt", "'model'",
                     "required");
    expect_job_error("model = m\nsteps = 1\n", NULL, 0, "job.txt", "'train_data'", "required");
    expect_job_error(BASE "task = lm\nnum_labels = 4\n", NULL, 0, "job.txt:5", "'num_labels'",
                     "classify");
    tg_job j;
    tg_err err = {{0}};
    CHECK(tg_job_load("/nonexistent/dir/job.txt", NULL, 0, &j, &err) == -1, "missing file");
    CHECK(strstr(err.msg, "/nonexistent/dir/job.txt: cannot open job file: "), "msg %s", err.msg);
}

/* A number must survive conversion to its stored type: floats that would be stored as 0,
 * as a denormal or as infinity, or that round onto an excluded bound, and integers outside
 * the key's range (however large) are refused with the true range. */
TG_TEST(test_job_error_number_conversion) {
    expect_job_error(BASE "lr = 1e-50\n", NULL, 0,
                     "job.txt:4: key 'lr': 1e-50 is too small for a 32-bit float (smallest nonzero 1.17549e-38)", NULL,
                     NULL);
    expect_job_error(BASE "eps = 1e-50\n", NULL, 0, "job.txt:4: key 'eps': 1e-50 is too small for a 32-bit float",
                     NULL, NULL);
    expect_job_error(BASE "eps = 1e-40\n", NULL, 0, "job.txt:4: key 'eps': 1e-40 is too small", NULL, NULL);
    expect_job_error(BASE "weight_decay = 1e-400\n", NULL, 0, "job.txt:4: key 'weight_decay': 1e-400 is too small",
                     NULL, NULL);
    expect_job_error(BASE "grad_clip = 1e39\n", NULL, 0,
                     "job.txt:4: key 'grad_clip': 1e39 is not a finite 32-bit float (largest 3.40282e+38)", NULL,
                     NULL);
    expect_job_error(BASE "beta2 = 0.9999999999\n", NULL, 0,
                     "job.txt:4: key 'beta2': 0.9999999999 is out of range as a 32-bit float (it rounds to 1) "
                     "(must be in [0, 1))",
                     NULL, NULL);
    expect_job_error(BASE "batch = 0\n", NULL, 0, "job.txt:4: key 'batch': 0 is out of range (must be 1..2147483647)",
                     NULL, NULL);
    expect_job_error(BASE "batch = 9223372036854775808\n", NULL, 0,
                     "job.txt:4: key 'batch': 9223372036854775808 is out of range (must be 1..2147483647)", NULL, NULL);
    expect_job_error(BASE "seq = -99999999999999999999\n", NULL, 0,
                     "job.txt:4: key 'seq': -99999999999999999999 is out of range (must be 1..2147483647)", NULL, NULL);
    expect_job_error(BASE "data_parallel = 65\n", NULL, 0,
                     "job.txt:4: key 'data_parallel': 65 is out of range (must be 1..64; replicas)", NULL, NULL);
    expect_job_error(BASE "zero_stage = 2\n", NULL, 0,
                     "job.txt:4: key 'zero_stage': 2 is out of range (must be 0..1; 0: none, 1: the optimizer state "
                     "sharded)",
                     NULL, NULL);
    expect_job_error(BASE "num_labels = 1\n", NULL, 0, "job.txt:4: key 'num_labels': 1 is out of range (must be "
                                                       "2..2147483647)",
                     NULL, NULL);
    expect_job_error(BASE "pad_token_id = 2147483648\n", NULL, 0,
                     "job.txt:4: key 'pad_token_id': 2147483648 is out of range (must be 0..2147483647)", NULL, NULL);
    const char *set[] = {"eps=1e-50"};
    expect_job_error(BASE, set, 1, "--set eps=1e-50: key 'eps': 1e-50 is too small", NULL, NULL);

    /* The limits themselves are taken, as is the smallest normal float. */
    const char *path = write_tmp("job.txt", BASE "data_parallel = 64\nnum_labels = 2\nlr = 1.2e-38\nseed = 0\n");
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
    CHECK(j.data_parallel == 64 && j.num_labels == 2 && j.lr > 0 && j.seed == 0, "dp %d labels %d lr %g",
          j.data_parallel, j.num_labels, (double)j.lr);
}

/* Writes `n` bytes (NULs included) as the job file. */
static const char *write_tmp_bytes(const char *name, const char *bytes, size_t n) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", tg_test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    int ok = fwrite(bytes, 1, n, f) == n;
    if (fclose(f) != 0 || !ok) return NULL;
    return path;
}

static void expect_job_bytes_error(const char *bytes, size_t n, const char *want) {
    const char *path = write_tmp_bytes("job.txt", bytes, n);
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    CHECK(tg_job_load(path, NULL, 0, &j, &err) == -1, "expected failure for '%s'", want);
    CHECK(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
}

/* A job file is UTF-8 text: a NUL byte anywhere (it would end the text early, so that
 * `batch = 4\0garbage` read as batch 4) and malformed UTF-8 are refused with the line. */
TG_TEST(test_job_error_not_text) {
    static const char nul_value[] = BASE "batch = 4\0garbage\n";
    expect_job_bytes_error(nul_value, sizeof nul_value - 1, "job.txt:4: NUL byte at column 10 (a job file is text)");
    static const char nul_late[] = BASE "batch = 4\r\n# c\r\0\n";
    expect_job_bytes_error(nul_late, sizeof nul_late - 1, "job.txt:6: NUL byte at column 1");
    static const char nul_first[] = "\0" BASE;
    expect_job_bytes_error(nul_first, sizeof nul_first - 1, "job.txt:1: NUL byte at column 1");

    expect_job_error(BASE "model2 = caf\xC3\xA9\n", NULL, 0, "job.txt:4: key 'model2': unknown key", NULL, NULL);
    expect_job_error(BASE "eval_data = e\xFF.jsonl\n", NULL, 0, "job.txt:4: invalid UTF-8 (byte 0xFF at column 14)",
                     NULL, NULL);
    expect_job_error(BASE "# caf\xC3\n", NULL, 0, "job.txt:4: invalid UTF-8 (byte 0xC3 at column 6)", NULL, NULL);
    expect_job_error(BASE "# overlong \xC0\xAF\n", NULL, 0, "job.txt:4: invalid UTF-8 (byte 0xC0", NULL, NULL);
    expect_job_error(BASE "# surrogate \xED\xA0\x80\n", NULL, 0, "job.txt:4: invalid UTF-8 (byte 0xED", NULL, NULL);
    expect_job_error(BASE "# past U+10FFFF \xF4\x90\x80\x80\n", NULL, 0, "job.txt:4: invalid UTF-8 (byte 0xF4",
                     NULL, NULL);
    const char *set[] = {"eval_data=\xFF"};
    expect_job_error(BASE, set, 1, "--set eval_data=\xFF: invalid UTF-8 (byte 0xFF at column 11)", NULL, NULL);

    /* Well-formed multi-byte text is fine, in values and comments. */
    const char *path = write_tmp("job.txt", BASE "# \xE2\x9C\x93 \xF0\x9F\x98\x80\neval_data = caf\xC3\xA9.jsonl\n");
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    CHECK(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
}

/* Lines end at \n, \r\n or a lone \r, and the line numbers count each. */
TG_TEST(test_job_line_ends) {
    const char *path = write_tmp("job.txt", "model = tiny-bert\rtrain_data = t.jsonl\r\rsteps = 10\r\nbatch = 4\rseq = 16");
    REQUIRE(path, "write");
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "load: %s", err.msg);
    CHECK(strcmp(j.model, "tiny-bert") == 0 && j.steps == 10 && j.batch == 4 && j.seq == 16,
          "model '%s' steps %d batch %d seq %d", j.model, j.steps, j.batch, j.seq);
    CHECK(j.key_line[TG_JOB_TRAIN_DATA] == 2 && j.key_line[TG_JOB_STEPS] == 4 && j.key_line[TG_JOB_BATCH] == 5 &&
              j.key_line[TG_JOB_SEQ] == 6,
          "lines %d %d %d %d", j.key_line[TG_JOB_TRAIN_DATA], j.key_line[TG_JOB_STEPS], j.key_line[TG_JOB_BATCH],
          j.key_line[TG_JOB_SEQ]);
    expect_job_error("model = tiny-bert\rtrain_data = t.jsonl\rsteps = 10\r\rbatch = 4x\r", NULL, 0,
                     "job.txt:5: key 'batch': '4x' is not an integer", NULL, NULL);
    expect_job_error("model = tiny-bert\r\ntrain_data = t.jsonl\r\nsteps = 10\r\nlr = 1e-3\rlr = 2e-3\r\n", NULL, 0,
                     "job.txt:5: key 'lr': duplicate key (first set on line 4)", NULL, NULL);
    expect_job_error("model = tiny-bert\rtrain_data = \"t.jsonl\rsteps = 10\r", NULL, 0,
                     "job.txt:2: key 'train_data': unterminated quoted value", NULL, NULL);
}

/* ---- datasets ---- */

static const tg_data_rules k_classify = {TG_TASK_CLASSIFY, 2, 100, 2, 0, 0};
static const tg_data_rules k_lm = {TG_TASK_LM, 0, 100, 0, 0, 0};

static void expect_data_error(const char *text, const tg_data_rules *r, const char *n1,
                              const char *n2) {
    const char *path = write_tmp("d.jsonl", text);
    REQUIRE(path, "write");
    tg_dataset ds;
    tg_err err = {{0}};
    CHECK(tg_dataset_load(path, r, &ds, &err) == -1, "expected failure for:\n%s", text);
    CHECK(ds.examples == NULL && ds.n == 0, "dataset left allocated");
    if (n1) CHECK(strstr(err.msg, n1) != NULL, "message '%s' lacks '%s'", err.msg, n1);
    if (n2) CHECK(strstr(err.msg, n2) != NULL, "message '%s' lacks '%s'", err.msg, n2);
}

TG_TEST(test_data_classify_loads) {
    const char *path = write_tmp("d.jsonl",
                                 "{\"input_ids\": [1, 5, 2], \"label\": 1, \"text\": \"hi\"}\n"
                                 "\n"
                                 "   \n"
                                 "{\"input_ids\": [1, 6, 7, 2], \"token_type_ids\": [0, 0, 1, 1],"
                                 " \"label\": 0}\r\n"
                                 "{\"input_ids\": [9], \"token_type_ids\": [0], \"label\": 1}");
    REQUIRE(path, "write");
    tg_dataset ds;
    tg_err err = {{0}};
    REQUIRE(tg_dataset_load(path, &k_classify, &ds, &err) == 0, "load: %s", err.msg);
    CHECK(ds.n == 3 && ds.n_tokens == 8, "n %d tokens %lld", ds.n, (long long)ds.n_tokens);
    CHECK(strcmp(ds.path, path) == 0, "path");
    REQUIRE(ds.n == 3, "n");
    CHECK(ds.examples[0].len == 3 && ds.examples[0].input_ids[1] == 5 &&
              ds.examples[0].label == 1 && ds.examples[0].token_type_ids == NULL,
          "ex0");
    CHECK(ds.examples[1].len == 4 && ds.examples[1].input_ids[3] == 2 &&
              ds.examples[1].label == 0,
          "ex1");
    REQUIRE(ds.examples[1].token_type_ids, "ex1 types");
    CHECK(ds.examples[1].token_type_ids[2] == 1 && ds.examples[1].token_type_ids[0] == 0, "types");
    CHECK(ds.examples[2].len == 1 && ds.examples[2].input_ids[0] == 9, "ex2");
    tg_dataset_free(&ds);
    CHECK(ds.examples == NULL && ds.n == 0, "freed");
}

TG_TEST(test_data_lm_loads) {
    /* A long line (some 80 KB), well inside TG_JSONL_MAX_LINE_BYTES. */
    size_t n = 20000;
    char *text = malloc(n * 4 + 64);
    REQUIRE(text, "alloc");
    char *p = text + sprintf(text, "{\"input_ids\": [");
    for (size_t i = 0; i < n; i++) p += sprintf(p, "%s%zu", i ? "," : "", i % 100);
    sprintf(p, "], \"label\": 999}\n{\"input_ids\": [3, 4]}\n");
    const char *path = write_tmp("lm.jsonl", text);
    free(text);
    REQUIRE(path, "write");
    tg_dataset ds;
    tg_err err = {{0}};
    REQUIRE(tg_dataset_load(path, &k_lm, &ds, &err) == 0, "load: %s", err.msg);
    CHECK(ds.n == 2 && ds.n_tokens == (int64_t)n + 2, "n %d tokens %lld", ds.n,
          (long long)ds.n_tokens);
    CHECK(ds.examples[0].len == (int32_t)n && ds.examples[0].input_ids[n - 1] == (int32_t)((n - 1) % 100),
          "long line");
    CHECK(ds.examples[0].label == TG_IGNORE_INDEX && ds.examples[1].label == TG_IGNORE_INDEX,
          "lm labels ignored");
    CHECK(ds.examples[1].input_ids[1] == 4, "ex1");
    tg_dataset_free(&ds);
}

TG_TEST(test_data_demo_files_load) {
    /* The committed demo data must fit the tiny presets (vocab 128, 2 types). */
    static const char *const files[] = {"examples/data/sentiment-train.jsonl",
                                        "examples/data/sentiment-eval.jsonl",
                                        "examples/data/tiny-lm-train.jsonl",
                                        "examples/data/tiny-lm-eval.jsonl"};
    for (int i = 0; i < 4; i++) {
        FILE *f = fopen(files[i], "r");
        if (!f) continue; /* run from another folder */
        fclose(f);
        tg_data_rules r = {i < 2 ? TG_TASK_CLASSIFY : TG_TASK_LM, 2, 128, 2, 0, 0};
        tg_dataset ds;
        tg_err err = {{0}};
        CHECK(tg_dataset_load(files[i], &r, &ds, &err) == 0, "%s", err.msg);
        CHECK(ds.n >= 200, "%s: %d examples", files[i], ds.n);
        tg_dataset_free(&ds);
    }
}

TG_TEST(test_data_error_invalid_json) {
    expect_data_error("{\"input_ids\": [1], \"label\": 0}\n\n{\"input_ids\": [1,}\n", &k_classify,
                      "d.jsonl:3: invalid JSON: ", "(column ");
    expect_data_error("[1, 2]\n", &k_classify, "d.jsonl:1:", "object");
}

TG_TEST(test_data_error_wrong_vocab) {
    expect_data_error("{\"input_ids\": [1], \"label\": 0}\n{\"input_ids\": [1, 2, 3, 100], "
                      "\"label\": 0}\n",
                      &k_classify, "d.jsonl:2: input_ids[3] = 100 is outside the vocabulary",
                      "vocab_size 100");
    expect_data_error("{\"input_ids\": [-1]}\n", &k_lm, "d.jsonl:1: input_ids[0] = -1", NULL);
    expect_data_error("{\"input_ids\": [1, \"a\"]}\n", &k_lm, "d.jsonl:1: input_ids[1]",
                      "not an integer");
}

TG_TEST(test_data_error_label) {
    expect_data_error("{\"input_ids\": [1], \"label\": 7}\n", &k_classify,
                      "d.jsonl:1: label 7 is out of range for num_labels 2", NULL);
    expect_data_error("{\"input_ids\": [1], \"label\": -1}\n", &k_classify, "d.jsonl:1: label -1",
                      NULL);
    expect_data_error("{\"input_ids\": [1]}\n", &k_classify, "d.jsonl:1:", "\"label\"");
    expect_data_error("{\"input_ids\": [1], \"label\": \"pos\"}\n", &k_classify, "d.jsonl:1:",
                      "label must be an integer");
}

TG_TEST(test_data_error_input_ids) {
    expect_data_error("{\"label\": 1, \"text\": \"x\"}\n", &k_classify, "d.jsonl:1:",
                      "missing \"input_ids\"");
    expect_data_error("{\"input_ids\": [1]}\n{\"input_ids\": []}\n", &k_lm, "d.jsonl:2:",
                      "input_ids is empty");
    expect_data_error("{\"input_ids\": 5}\n", &k_lm, "d.jsonl:1:", "array");
}

TG_TEST(test_data_error_token_types) {
    expect_data_error("{\"input_ids\": [1, 2, 3], \"token_type_ids\": [0, 1], \"label\": 0}\n",
                      &k_classify, "d.jsonl:1:", "token_type_ids has 2 entries but input_ids has 3");
    expect_data_error("{\"input_ids\": [1, 2], \"token_type_ids\": [0, 2], \"label\": 0}\n",
                      &k_classify, "d.jsonl:1: token_type_ids[1] = 2", "type_vocab_size 2");
    /* GPT-2 (type_vocab_size 0): only zeros. */
    const char *path = write_tmp("d.jsonl", "{\"input_ids\": [1, 2], \"token_type_ids\": [0, 0]}\n");
    tg_dataset ds;
    tg_err err = {{0}};
    CHECK(tg_dataset_load(path, &k_lm, &ds, &err) == 0, "zeros ok: %s", err.msg);
    tg_dataset_free(&ds);
    expect_data_error("{\"input_ids\": [1, 2], \"token_type_ids\": [0, 1]}\n", &k_lm,
                      "d.jsonl:1: token_type_ids[1] = 1", "only 0");
}

TG_TEST(test_data_error_empty) {
    expect_data_error("", &k_classify, "d.jsonl: no examples", NULL);
    expect_data_error("\n  \n\n", &k_classify, "d.jsonl: no examples", NULL);
    tg_dataset ds;
    tg_err err = {{0}};
    CHECK(tg_dataset_load("/nonexistent/x.jsonl", &k_lm, &ds, &err) == -1 &&
              strstr(err.msg, "/nonexistent/x.jsonl: cannot open"),
          "msg %s", err.msg);
}

/* A key named twice in one row: jansson would keep the last value, even over a first one
 * that is invalid. */
TG_TEST(test_data_error_duplicate_key) {
    expect_data_error("{\"input_ids\": [1], \"label\": 0}\n{\"input_ids\": [1], \"label\": 9, \"label\": 1}\n",
                      &k_classify, "d.jsonl:2: key \"label\" appears twice", NULL);
    expect_data_error("{\"input_ids\": [1, 2], \"input_ids\": [3]}\n", &k_lm, "d.jsonl:1:",
                      "key \"input_ids\" appears twice");
    expect_data_error("{\"input_ids\": [1], \"meta\": {\"source\": \"a\", \"source\": \"b\"}}\n", &k_lm,
                      "d.jsonl:1:", "key \"source\" appears twice");
    expect_data_error("\n{\"input_ids\": [1], \"a_key_longer_than_twenty_chars\": 1, "
                      "\"a_key_longer_than_twenty_chars\": 2}\n",
                      &k_lm, "d.jsonl:2:", "key \"a_key_longer_than_twenty_chars\" appears twice");
}

/* No line may pass TG_JSONL_MAX_LINE_BYTES: /dev/zero (an endless line) or a huge line is
 * refused once that much is read, not read into memory without end. */
TG_TEST(test_data_error_line_too_long) {
    tg_dataset ds;
    tg_err err = {{0}};
    CHECK(tg_dataset_load("/dev/zero", &k_lm, &ds, &err) == -1, "/dev/zero loaded");
    CHECK(strstr(err.msg, "/dev/zero:1: line is longer than 16777216 bytes (16 MiB)"), "message '%s'", err.msg);

    /* A line of exactly the limit loads; one byte more is refused, naming its line. */
    const size_t max = TG_JSONL_MAX_LINE_BYTES;
    char *text = malloc(max + 64);
    REQUIRE(text, "alloc");
    int head = sprintf(text, "{\"input_ids\": [3]}\n");
    for (int extra = 0; extra < 2; extra++) {
        const char *open = "{\"input_ids\": [1, 2], \"text\": \"", *close = "\"}";
        size_t fill = max + (size_t)extra - strlen(open) - strlen(close);
        char *p = text + head;
        p += sprintf(p, "%s", open);
        memset(p, 'x', fill);
        p += fill;
        sprintf(p, "%s\n", close);
        REQUIRE(strlen(text) == (size_t)head + max + (size_t)extra + 1, "layout");
        const char *path = write_tmp("long.jsonl", text);
        REQUIRE(path, "write");
        int rc = tg_dataset_load(path, &k_lm, &ds, &err);
        if (extra == 0) {
            CHECK(rc == 0 && ds.n == 2, "a line of exactly the limit: %s", rc ? err.msg : "wrong count");
            if (rc == 0) tg_dataset_free(&ds);
        } else {
            CHECK(rc == -1, "a line one byte past the limit loaded");
            CHECK(strstr(err.msg, "long.jsonl:2: line is longer than 16777216 bytes"), "message '%s'", err.msg);
        }
    }
    free(text);
}

/* ---- batches ---- */

typedef struct bufs {
    int32_t ids[64], types[64], pos[64], labels[64];
    float mask[64];
    tg_batch b;
} bufs;

static void bufs_init(bufs *x) {
    memset(x, 0x5A, sizeof *x); /* garbage, so every slot must be written */
    x->b = (tg_batch){x->ids, x->mask, x->types, x->pos, x->labels, -1, -1, 0, NULL, 0};
}

static int load_text(const char *text, const tg_data_rules *r, tg_dataset *ds) {
    const char *path = write_tmp("b.jsonl", text);
    tg_err err = {{0}};
    if (!path || tg_dataset_load(path, r, ds, &err) != 0) {
        CHECK(0, "load: %s", err.msg);
        return -1;
    }
    return 0;
}

TG_TEST(test_data_batch_classify) {
    tg_dataset ds;
    REQUIRE(load_text("{\"input_ids\": [11, 12, 13], \"token_type_ids\": [0, 1, 1], \"label\": 1}\n"
                      "{\"input_ids\": [21, 22, 23, 24, 25, 26, 27], \"label\": 0}\n",
                      &k_classify, &ds) == 0, "load");
    bufs x;
    bufs_init(&x);
    tg_batch_shape sh = {.batch = 3, .seq = 5, .task = TG_TASK_CLASSIFY, .arch = TG_ARCH_BERT,
                         .pad_id = 0};
    int32_t idx[2] = {1, 0};
    tg_batch_fill(&ds, idx, 2, &sh, &x.b);
    CHECK(x.b.n_real == 2 && x.b.n_tokens == 8, "n_real %d tokens %lld", x.b.n_real,
          (long long)x.b.n_tokens);
    static const int32_t want_ids[15] = {21, 22, 23, 24, 25, 11, 12, 13, 0, 0, 0, 0, 0, 0, 0};
    static const float want_mask[15] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    static const int32_t want_types[15] = {0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < 15; i++) {
        CHECK(x.ids[i] == want_ids[i], "ids[%d] = %d want %d", i, x.ids[i], want_ids[i]);
        CHECK(x.mask[i] == want_mask[i], "mask[%d] = %g", i, x.mask[i]);
        CHECK(x.types[i] == want_types[i], "types[%d] = %d", i, x.types[i]);
        CHECK(x.pos[i] == i % 5, "pos[%d] = %d", i, x.pos[i]);
    }
    CHECK(x.labels[0] == 0 && x.labels[1] == 1 && x.labels[2] == TG_IGNORE_INDEX, "labels %d %d %d",
          x.labels[0], x.labels[1], x.labels[2]);
    CHECK(x.labels[3] == 0x5A5A5A5A, "classify labels are [B], wrote past them");

    /* Pad id other than 0 lands in padded slots. */
    sh.pad_id = 7;
    tg_batch_fill(&ds, idx + 1, 1, &sh, &x.b);
    CHECK(x.ids[3] == 7 && x.ids[14] == 7 && x.b.n_real == 1 && x.b.n_tokens == 3, "pad 7");
    tg_dataset_free(&ds);
}

/* A refill of the same buffers skips the example-independent parts (positions, zero
 * token types) only while they hold what a full fill writes: a batch that copied token
 * types marks them stale, and the next fill writes them all again. */
TG_TEST(test_data_batch_fixed_parts) {
    tg_dataset ds;
    REQUIRE(load_text("{\"input_ids\": [11, 12, 13], \"token_type_ids\": [0, 1, 1], \"label\": 1}\n"
                      "{\"input_ids\": [21, 22], \"label\": 0}\n",
                      &k_classify, &ds) == 0, "load");
    bufs x, ref;
    bufs_init(&x);
    tg_batch_shape sh = {.batch = 2, .seq = 4, .task = TG_TASK_CLASSIFY, .arch = TG_ARCH_BERT, .pad_id = 0};
    int32_t no_types[2] = {1, 1}, with_types[2] = {0, 1};
    const int32_t *order[4] = {no_types, with_types, no_types, no_types};
    for (int round = 0; round < 4; round++) {
        int kept = x.b.fixed_parts_written;
        tg_batch_fill(&ds, order[round], 2, &sh, &x.b);
        bufs_init(&ref);
        tg_batch_fill(&ds, order[round], 2, &sh, &ref.b);
        CHECK(memcmp(x.ids, ref.ids, sizeof(int32_t) * 8) == 0 && memcmp(x.mask, ref.mask, sizeof(float) * 8) == 0 &&
                  memcmp(x.types, ref.types, sizeof(int32_t) * 8) == 0 && memcmp(x.pos, ref.pos, sizeof(int32_t) * 8) == 0 &&
                  memcmp(x.labels, ref.labels, sizeof(int32_t) * 2) == 0,
              "round %d (fixed parts kept: %d): the refill differs from a full fill", round, kept);
        CHECK(x.b.fixed_parts_written == (order[round] == no_types), "round %d: fixed parts %d", round,
              x.b.fixed_parts_written);
        /* What a later fill may skip must still be in place: poison only the rest. */
        memset(x.ids, 0x5A, sizeof(int32_t) * 8), memset(x.mask, 0x5A, sizeof(float) * 8);
    }
    CHECK(x.b.fixed_parts_written, "a fill without token types leaves the fixed parts written");
    tg_dataset_free(&ds);
}

/* With row lengths kept per buffer, a row refilled to its previous length skips its mask,
 * padding, label tail and RoBERTa positions; refills whose rows change length in either
 * direction, or keep it, must still equal a fresh fill (classify with RoBERTa positions,
 * and LM labels). */
TG_TEST(test_data_batch_row_lengths) {
    for (int lm = 0; lm < 2; lm++) {
        tg_dataset ds;
        REQUIRE(load_text("{\"input_ids\": [11, 12, 13], \"label\": 1}\n{\"input_ids\": [21, 22], \"label\": 0}\n"
                          "{\"input_ids\": [31, 32, 33, 34, 35, 36], \"label\": 1}\n",
                          lm ? &k_lm : &k_classify, &ds) == 0, "load");
        bufs x, ref;
        bufs_init(&x);
        int32_t rows[2] = {-1, -1};
        x.b.row_len = rows;
        tg_batch_shape sh = {.batch = 2, .seq = 4, .task = lm ? TG_TASK_LM : TG_TASK_CLASSIFY,
                             .arch = lm ? TG_ARCH_GPT2 : TG_ARCH_ROBERTA, .pad_id = 1};
        static const int32_t order[6][2] = {{0, 1}, {0, 1}, {1, 0}, {2, 2}, {2, 1}, {0, 1}};
        int labels = lm ? 8 : 2;
        for (int round = 0; round < 6; round++) {
            tg_batch_fill(&ds, order[round], 2, &sh, &x.b);
            bufs_init(&ref);
            tg_batch_fill(&ds, order[round], 2, &sh, &ref.b);
            CHECK(memcmp(x.ids, ref.ids, sizeof(int32_t) * 8) == 0 && memcmp(x.mask, ref.mask, sizeof(float) * 8) == 0 &&
                      memcmp(x.pos, ref.pos, sizeof(int32_t) * 8) == 0 &&
                      memcmp(x.labels, ref.labels, sizeof(int32_t) * (size_t)labels) == 0,
                  "%s round %d: the refill differs from a full fill", lm ? "lm" : "classify", round);
            CHECK(rows[0] == (order[round][0] == 2 ? 4 : 3 - order[round][0]) &&
                      rows[1] == (order[round][1] == 2 ? 4 : 3 - order[round][1]),
                  "round %d: row lengths %d %d", round, rows[0], rows[1]);
        }
        tg_dataset_free(&ds);
    }
}

TG_TEST(test_data_batch_lm_shift) {
    tg_dataset ds;
    REQUIRE(load_text("{\"input_ids\": [5, 6, 7]}\n{\"input_ids\": [1, 2, 3, 4, 5, 6]}\n", &k_lm,
                      &ds) == 0, "load");
    bufs x;
    bufs_init(&x);
    tg_batch_shape sh = {.batch = 3, .seq = 4, .task = TG_TASK_LM, .arch = TG_ARCH_GPT2,
                         .pad_id = 0};
    int32_t idx[2] = {0, 1};
    tg_batch_fill(&ds, idx, 2, &sh, &x.b);
    const int I = TG_IGNORE_INDEX;
    /* Row 0 padded (len 3 < 4); row 1 truncated to 4 so its last label is ignored. */
    const int32_t want_labels[12] = {6, 7, I, I, 2, 3, 4, I, I, I, I, I};
    const int32_t want_ids[12] = {5, 6, 7, 0, 1, 2, 3, 4, 0, 0, 0, 0};
    for (int i = 0; i < 12; i++) {
        CHECK(x.labels[i] == want_labels[i], "labels[%d] = %d want %d", i, x.labels[i],
              want_labels[i]);
        CHECK(x.ids[i] == want_ids[i], "ids[%d] = %d", i, x.ids[i]);
        CHECK(x.pos[i] == i % 4, "gpt2 pos[%d] = %d", i, x.pos[i]);
    }
    CHECK(x.b.n_real == 2 && x.b.n_tokens == 7, "n_real %d tokens %lld", x.b.n_real,
          (long long)x.b.n_tokens);
    tg_dataset_free(&ds);
}

/* Rows of 1 KB and more are copied with streaming stores (datasets/batch.c): rows of 700
 * and 650 tokens (lengths that leave a tail past the last 64 bytes) into 16-byte aligned
 * buffers, ids and shifted labels checked element by element. */
TG_TEST(test_data_batch_long_rows) {
    enum { T = 704, B = 2 };
    const int lens[B] = {700, 650};
    size_t cap = 64 + 12 * T * B, n = 0;
    char *text = malloc(cap);
    REQUIRE(text, "out of memory");
    for (int r = 0; r < B; r++) {
        n += (size_t)snprintf(text + n, cap - n, "{\"input_ids\": [");
        for (int t = 0; t < lens[r]; t++) n += (size_t)snprintf(text + n, cap - n, "%s%d", t ? ", " : "", (r * 1000 + t * 7) % 97 + 1);
        n += (size_t)snprintf(text + n, cap - n, "]}\n");
    }
    tg_dataset ds;
    int loaded = load_text(text, &k_lm, &ds);
    free(text);
    REQUIRE(loaded == 0, "load");
    int32_t *ids = aligned_alloc(64, sizeof(int32_t) * B * T), *types = aligned_alloc(64, sizeof(int32_t) * B * T);
    int32_t *pos = aligned_alloc(64, sizeof(int32_t) * B * T), *labels = aligned_alloc(64, sizeof(int32_t) * B * T);
    float *mask = aligned_alloc(64, sizeof(float) * B * T);
    REQUIRE(ids && types && pos && labels && mask, "out of memory");
    memset(ids, 0x5A, sizeof(int32_t) * B * T), memset(labels, 0x5A, sizeof(int32_t) * B * T);
    tg_batch b = {ids, mask, types, pos, labels, -1, -1, 0, NULL, 0};
    tg_batch_shape sh = {.batch = B, .seq = T, .task = TG_TASK_LM, .arch = TG_ARCH_GPT2, .pad_id = 0};
    int32_t idx[B] = {0, 1};
    tg_batch_fill(&ds, idx, B, &sh, &b);
    int bad = 0;
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) {
            const int32_t want_id = t < lens[r] ? (r * 1000 + t * 7) % 97 + 1 : 0;
            const int32_t want_label = t + 1 < lens[r] ? (r * 1000 + (t + 1) * 7) % 97 + 1 : TG_IGNORE_INDEX;
            bad += !CHECK(ids[r * T + t] == want_id && labels[r * T + t] == want_label,
                          "row %d token %d: id %d label %d (want %d, %d)", r, t, ids[r * T + t], labels[r * T + t],
                          want_id, want_label);
            if (bad > 3) break;
        }
    free(ids), free(types), free(pos), free(labels), free(mask);
    tg_dataset_free(&ds);
}

/* LM rows marked for the step to derive (mark_label_rows): the fill writes only the mark,
 * and tg_batch_derive_label_rows then gives what an unmarked fill writes, for full,
 * short, truncated and padding rows, refilled over earlier batches of other lengths. */
TG_TEST(test_data_batch_lm_marked_label_rows) {
    tg_dataset ds;
    REQUIRE(load_text("{\"input_ids\": [5, 6, 7, 8, 9, 10, 11]}\n{\"input_ids\": [3, 4]}\n{\"input_ids\": [12]}\n"
                      "{\"input_ids\": [1, 2, 3, 4, 5]}\n",
                      &k_lm, &ds) == 0,
            "load");
    enum { B = 4, T = 5 };
    tg_batch_shape sh = {.batch = B, .seq = T, .task = TG_TASK_LM, .arch = TG_ARCH_GPT2, .pad_id = 0};
    const int32_t orders[3][3] = {{0, 1, 2}, {3, 0, 1}, {2, 3, 0}};
    bufs plain, marked;
    bufs_init(&plain), bufs_init(&marked);
    int32_t row_len[2][B] = {{0}};
    plain.b.row_len = row_len[0], marked.b.row_len = row_len[1];
    for (int round = 0; round < 3; round++) {
        /* Three real rows and a padding row; the buffers keep their fixed parts between rounds. */
        tg_batch_fill(&ds, orders[round], 3, &sh, &plain.b);
        marked.b.mark_label_rows = 1;
        tg_batch_fill(&ds, orders[round], 3, &sh, &marked.b);
        for (int r = 0; r < B; r++)
            CHECK(marked.labels[r * T] == TG_LABELS_FROM_IDS, "round %d row %d: first label %d, not the mark", round, r,
                  marked.labels[r * T]);
        tg_batch_derive_label_rows(marked.labels, marked.ids, marked.mask, B, T);
        for (int i = 0; i < B * T; i++)
            CHECK(marked.labels[i] == plain.labels[i] && marked.ids[i] == plain.ids[i] && marked.mask[i] == plain.mask[i],
                  "round %d element %d: marked then derived label %d id %d, unmarked %d %d", round, i, marked.labels[i],
                  marked.ids[i], plain.labels[i], plain.ids[i]);
    }
    /* The last round's row 2 is the first example, truncated to T tokens. */
    CHECK(plain.labels[2 * T] == 6 && plain.labels[2 * T + 3] == 9 && plain.labels[2 * T + 4] == TG_IGNORE_INDEX,
          "round 3 row 2 labels %d %d %d", plain.labels[2 * T], plain.labels[2 * T + 3], plain.labels[2 * T + 4]);
    /* Unmarked rows are left alone. */
    int32_t labels[T] = {1, 2, 3, 4, 5}, ids[T] = {9, 9, 9, 9, 9};
    float mask[T] = {1, 1, 1, 1, 1};
    tg_batch_derive_label_rows(labels, ids, mask, 1, T);
    CHECK(labels[0] == 1 && labels[4] == 5, "an unmarked row changed: %d .. %d", labels[0], labels[4]);
    tg_dataset_free(&ds);
}

TG_TEST(test_data_batch_roberta_positions) {
    tg_dataset ds;
    REQUIRE(load_text("{\"input_ids\": [0, 9, 2], \"label\": 1}\n", &k_classify, &ds) == 0, "load");
    bufs x;
    bufs_init(&x);
    tg_batch_shape sh = {.batch = 2, .seq = 5, .task = TG_TASK_CLASSIFY, .arch = TG_ARCH_ROBERTA,
                         .pad_id = 1};
    int32_t idx[1] = {0};
    tg_batch_fill(&ds, idx, 1, &sh, &x.b);
    const int32_t want_pos[10] = {2, 3, 4, 1, 1, 1, 1, 1, 1, 1};
    const int32_t want_ids[10] = {0, 9, 2, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 10; i++) {
        CHECK(x.pos[i] == want_pos[i], "pos[%d] = %d want %d", i, x.pos[i], want_pos[i]);
        CHECK(x.ids[i] == want_ids[i], "ids[%d] = %d", i, x.ids[i]);
    }
    CHECK(x.labels[0] == 1 && x.labels[1] == TG_IGNORE_INDEX, "labels");
    tg_dataset_free(&ds);
}

/* ---- sampler ---- */

static int is_permutation(const int32_t *v, int n) {
    char seen[1000] = {0};
    for (int i = 0; i < n; i++) {
        if (v[i] < 0 || v[i] >= n || seen[v[i]]) return 0;
        seen[v[i]] = 1;
    }
    return 1;
}

TG_TEST(test_data_sampler) {
    enum { N = 97 };
    tg_sampler s, s2, s3;
    tg_err err = {{0}};
    REQUIRE(tg_sampler_init(&s, N, 42, &err) == 0, "init: %s", err.msg);
    REQUIRE(tg_sampler_init(&s2, N, 42, &err) == 0, "init: %s", err.msg);
    REQUIRE(tg_sampler_init(&s3, N, 43, &err) == 0, "init: %s", err.msg);
    int32_t a[2 * N], b[2 * N], c[N];
    /* Odd chunk sizes cross the epoch boundary mid-request. */
    for (int i = 0; i < 2 * N; i += 10) tg_sampler_next(&s, a + i, i + 10 <= 2 * N ? 10 : 2 * N - i);
    tg_sampler_next(&s2, b, 2 * N);
    tg_sampler_next(&s3, c, N);
    CHECK(is_permutation(a, N) && is_permutation(a + N, N), "each epoch is a permutation");
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed, same stream");
    CHECK(memcmp(a, a + N, N * sizeof(int32_t)) != 0, "epochs differ");
    CHECK(memcmp(a, c, sizeof c) != 0, "seeds differ");
    int identity = 1;
    for (int i = 0; i < N; i++) identity &= a[i] == i;
    CHECK(!identity, "shuffled");
    CHECK(s.epoch == 1 && s.pos == N, "epoch %d pos %d", s.epoch, s.pos);
    tg_sampler_free(&s);
    tg_sampler_free(&s2);
    tg_sampler_free(&s3);

    /* Golden first indices: the stream must be the same on every machine. */
    REQUIRE(tg_sampler_init(&s, 10, 7, &err) == 0, "init");
    int32_t g[10];
    tg_sampler_next(&s, g, 10);
    CHECK(is_permutation(g, 10), "perm");
    static const int32_t golden[10] = {0, 1, 8, 4, 9, 5, 3, 2, 6, 7};
    CHECK(memcmp(g, golden, sizeof g) == 0, "sampler(10, seed 7): %d %d %d %d %d %d %d %d %d %d",
          g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9]);
    tg_sampler_free(&s);

    REQUIRE(tg_sampler_init(&s, 1, 0, &err) == 0, "n=1");
    int32_t one[3];
    tg_sampler_next(&s, one, 3);
    CHECK(one[0] == 0 && one[1] == 0 && one[2] == 0, "n=1 stream");
    tg_sampler_free(&s);
    CHECK(tg_sampler_init(&s, 0, 0, &err) == -1, "n=0 must fail");
}

TG_TEST(test_job_demo_files_parse) {
    /* The committed demo jobs must stay valid (tests run from the repository root). */
    static const char *const files[] = {"examples/demo-classify.job", "examples/demo-lm.job"};
    for (int i = 0; i < 2; i++) {
        tg_job j;
        tg_err err = {{0}};
        CHECK(tg_job_load(files[i], NULL, 0, &j, &err) == 0, "%s", err.msg);
        CHECK(j.steps > 0 && j.batch == 16 && j.seq == 48, "%s: shape", files[i]);
        CHECK(strncmp(j.train_data, "examples/data/", 14) == 0, "%s: %s", files[i], j.train_data);
    }
}
