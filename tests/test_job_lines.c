/* Job files line by line (compiler/job.c): a table of bad job texts, each with the message
 * naming the file, line and key; --set overrides of a job and of a compiled plan's run keys;
 * the value parsers' edges (numbers that round or underflow, quoted blanks, UTF-8 forms,
 * comments); freeze patterns and seq_buckets; reading the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "compiler/job.h"
#include "tests/harness.h"

#define BASE "model = tiny-bert\ntrain_data = t.jsonl\nsteps = 1\n"

/* Parses `text` as job "j.job"; 1 when it failed with a message holding `want`. */
static int job_refused(const char *text, const char *const *sets, int n_sets, const char *want, const char *label) {
    tg_job job;
    tg_err err = {{0}};
    int rc = tg_job_parse_text(text, "j.job", "d", sets, n_sets, &job, &err);
    int ok = CHECK(rc == -1, "%s: accepted (want '%s')", label, want);
    return ok & CHECK(strstr(err.msg, want) != NULL, "%s: '%s' lacks '%s'", label, err.msg, want);
}

TG_TEST(test_job_lines_refused) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        /* the line's form */
        {"model tiny-bert\n", "j.job:1: expected 'key = value', got 'model tiny-bert' (missing '=')"},
        {"  = 5\n", "j.job:1: missing key before '='"},
        {"modle = x\n", "j.job:1: key 'modle': unknown key (did you mean 'model'?)"},
        /* Two letters missing, two too many, two changed (each costs 1; 3 is too far); any case. */
        {"chckpoint_evry = 2\n", "j.job:1: key 'chckpoint_evry': unknown key (did you mean 'checkpoint_every'?)"},
        {"modelxx = x\n", "j.job:1: key 'modelxx': unknown key (did you mean 'model'?)"},
        {"SEEx = 1\n", "j.job:1: key 'SEEx': unknown key (did you mean 'seed'?)"},
        {"chckpint_evry = 2\n", "j.job:1: key 'chckpint_evry': unknown key"},
        {"an_unknown_key_far_from_any_other_key_with_more_than_sixty_four_bytes = 1\n",
         "key 'an_unknown_key_far_from_any_other_key_with_more_than_sixty_four_bytes': unknown key\n"},
        {"zzzzzz = 1\n", "j.job:1: key 'zzzzzz': unknown key"},
        {BASE "seq = 8\nseq = 9\n", "j.job:5: key 'seq': duplicate key (first set on line 4)"},
        {"seq = \"8\n", "j.job:1: key 'seq': unterminated quoted value"},
        {"seq = \"8\" 9\n", "j.job:1: key 'seq': unexpected text after the quoted value: '9'"},
        /* UTF-8: overlong, surrogate, past U+10FFFF, cut short, a bad continuation */
        {"\xFFmodel = tiny-bert\n", "j.job:1: invalid UTF-8 (byte 0xFF at column 1)"}, /* the first byte: column 1 */
        {"# \xE0\x80\x80\n", "j.job:1: invalid UTF-8 (byte 0xE0 at column 3)"},
        {"# \xED\xA0\x80\n", "j.job:1: invalid UTF-8 (byte 0xED at column 3)"},
        {"# \xF0\x80\x80\x80\n", "invalid UTF-8 (byte 0xF0 at column 3)"},
        {"# \xF4\x90\x80\x80\n", "invalid UTF-8 (byte 0xF4 at column 3)"},
        {"# \xF5\x80\x80\x80\n", "invalid UTF-8 (byte 0xF5 at column 3)"},
        {"# \xC1\x80\n", "invalid UTF-8 (byte 0xC1 at column 3)"},
        {"# \xE2\x82", "invalid UTF-8 (byte 0xE2 at column 3)"},
        {"# \xE2\x82\x41\n", "invalid UTF-8 (byte 0xE2 at column 3)"},
        {"# \xE2\x82\xC0\n", "invalid UTF-8 (byte 0xE2 at column 3)"},
        {"# \xE2\x7F\x80\n", "invalid UTF-8 (byte 0xE2 at column 3)"},
        /* a byte-order mark only on line 1; U+FEFE and U+FF00 are no mark */
        {"\xEF\xBB\xBE\n", "j.job:1: expected 'key = value', got '\xEF\xBB\xBE' (missing '=')"},
        {"\xEF\xBC\x80\n", "j.job:1: expected 'key = value', got '\xEF\xBC\x80' (missing '=')"},
        {"\n\xEF\xBB\xBFseq = 8\n", "j.job:2: key '\xEF\xBB\xBFseq': unknown key"},
        /* integers */
        {"seq = \" 8\"\n", "j.job:1: key 'seq': ' 8' is not an integer"},
        {"seq = 8x\n", "j.job:1: key 'seq': '8x' is not an integer"},
        {"seq =\n", "j.job:1: key 'seq': '' is not an integer"},
        {"seq = 0\n", "j.job:1: key 'seq': 0 is out of range (must be 1..2147483647)"},
        {"seq = 99999999999999999999\n", "key 'seq': 99999999999999999999 is out of range (must be 1..2147483647)"},
        {"num_labels = 1\n", "key 'num_labels': 1 is out of range (must be 2..2147483647)"},
        {"data_parallel = 65\n", "key 'data_parallel': 65 is out of range (must be 1..64; replicas)"},
        {"zero_stage = 2\n", "key 'zero_stage': 2 is out of range (must be 0..1; 0: none, 1: the optimizer state sharded)"},
        {"checkpoint_every = -1\n", "key 'checkpoint_every': -1 is out of range (must be 0..2147483647; steps; 0: none)"},
        {"keep_checkpoints = -2\n", "key 'keep_checkpoints': -2 is out of range (must be 0..2147483647; 0: every one)"},
        {"warmup_steps = -1\n", "key 'warmup_steps': -1 is out of range (must be 0..2147483647)"},
        {"epochs = 0\n", "key 'epochs': 0 is out of range"},
        {"log_every = 0\n", "key 'log_every': 0 is out of range"},
        {"pad_token_id = -1\n", "key 'pad_token_id': -1 is out of range"},
        {"batch = 0\n", "key 'batch': 0 is out of range"},
        /* floats */
        {"lr =\n", "j.job:1: key 'lr': '' is not a number"},
        {"lr = \" 1\"\n", "j.job:1: key 'lr': ' 1' is not a number"},
        {"lr = 1e-3x\n", "key 'lr': '1e-3x' is not a number"},
        {"lr = nan\n", "key 'lr': 'nan' is not a number"},
        {"lr = 1e400\n", "key 'lr': 1e400 is not a finite 32-bit float (largest 3.40282e+38)"},
        {"lr = 1e39\n", "key 'lr': 1e39 is not a finite 32-bit float"},
        {"lr = inf\n", "key 'lr': inf is not a finite 32-bit float"},
        {"lr = 1e-400\n", "key 'lr': 1e-400 is too small for a 32-bit float (smallest nonzero 1.17549e-38)"},
        {"eps = 1e-40\n", "key 'eps': 1e-40 is too small for a 32-bit float"},
        {"lr = 0\n", "key 'lr': 0 is out of range (must be > 0)"},
        {"lr = -1\n", "key 'lr': -1 is out of range (must be > 0)"},
        {"weight_decay = -0.5\n", "key 'weight_decay': -0.5 is out of range (must be >= 0)"},
        {"grad_clip = -1\n", "key 'grad_clip': -1 is out of range (must be >= 0)"},
        {"beta1 = 1\n", "key 'beta1': 1 is out of range (must be in [0, 1))"},
        {"beta2 = -0.1\n", "key 'beta2': -0.1 is out of range (must be in [0, 1))"},
        {"beta2 = 0.9999999999\n",
         "key 'beta2': 0.9999999999 is out of range as a 32-bit float (it rounds to 1) (must be in [0, 1))"},
        /* enums, booleans, seed */
        {"task = regress\n", "key 'task': 'regress' is not one of classify, lm"},
        {"precision = fp8\n", "key 'precision': 'fp8' is not one of fp32, bf16, fp16"},
        {"last_batch = keep\n", "key 'last_batch': 'keep' is not one of pad, drop, wrap"},
        {"optimizer = sgd\n", "key 'optimizer': 'sgd' is not one of adamw, adan"},
        {"optimizer_state = fp16\n", "key 'optimizer_state': 'fp16' is not one of fp32, bf16"},
        {"allow_tf32 = yes\n", "key 'allow_tf32': 'yes' is not a boolean (true, false, 1, 0)"},
        {"fuse_gelu = 2\n", "key 'fuse_gelu': '2' is not a boolean"},
        {"seed = -1\n", "key 'seed': '-1' is not a non-negative integer"},
        {"seed = 12ab\n", "key 'seed': '12ab' is not a non-negative integer"},
        {"seed = 18446744073709551616\n", "key 'seed': 18446744073709551616 is out of range (must be 0..2^64-1)"},
        /* paths */
        {"train_data = \"\"\n", "j.job:1: key 'train_data': value is empty"},
        {"model = # only a comment\n", "j.job:1: key 'model': value is empty"},
        /* freeze */
        {"freeze = a,,b\n", "key 'freeze': empty pattern in 'a,,b' (patterns are separated by commas)"},
        {"freeze = a, \n", "key 'freeze': empty pattern in 'a,'"},
        {"freeze = ,a\n", "key 'freeze': empty pattern in ',a'"},
        /* seq_buckets */
        {"seq_buckets = 64,,128\n", "key 'seq_buckets': empty length in '64,,128' (lengths are separated by commas"},
        {"seq_buckets = 64, \n", "key 'seq_buckets': empty length in '64,'"},
        {"seq_buckets = 1,2,3,4,5,6,7,8,9\n", "key 'seq_buckets': more than 8 buckets in '1,2,3,4,5,6,7,8,9'"},
        {"seq_buckets = 64,x\n", "key 'seq_buckets': 'x' is not a positive integer length (must be 1..2147483647)"},
        {"seq_buckets = 0,64\n", "key 'seq_buckets': '0' is not a positive integer length"},
        {"seq_buckets = 1,000000000000000000000000000000064\n",
         "key 'seq_buckets': '000000000000000000000000000000064' is not a positive integer length"},
        {"seq_buckets = 64,64\n", "key 'seq_buckets': 64 follows 64; the lengths must be strictly ascending"},
        {"seq_buckets = 128,64\n", "key 'seq_buckets': 64 follows 128; the lengths must be strictly ascending"},
        {"seq_buckets = 64\n", "key 'seq_buckets': '64' names one length; give 2 to 8 (one length is key 'seq')"},
        /* the cross-key checks */
        {BASE "seq = 100\nseq_buckets = 64, 128\n",
         "j.job:4: key 'seq': 100 differs from the last of seq_buckets (128, j.job:5); the plan's seq is its largest"},
        {BASE "last_batch = wrap\nseq_buckets = 64,128\n",
         "j.job:4: key 'last_batch': wrap is not allowed with seq_buckets (j.job:5)"},
        {"train_data = t\nsteps = 1\n", "j.job: key 'model' is required (a model folder or preset name)"},
        {"model = m\nsteps = 1\n", "j.job: key 'train_data' is required (a .jsonl file)"},
        {"model = m\ntrain_data = t\n", "j.job: one of keys 'steps' or 'epochs' is required"},
        {BASE "epochs = 2\n", "j.job: keys 'steps' (j.job:3) and 'epochs' (j.job:4) are both set; give exactly one"},
        {BASE "task = lm\nnum_labels = 3\n", "j.job:5: key 'num_labels': only meaningful for task = classify (task is lm)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char label[40];
        snprintf(label, sizeof label, "case %zu", i);
        /* The table's messages end at the key's text; the trailing "\n" above marks an
         * exact end for the unknown key without a suggestion. */
        const char *want = cases[i].want;
        char exact[400];
        size_t n = strlen(want);
        if (n && want[n - 1] == '\n') {
            snprintf(exact, sizeof exact, "j.job:1: %.*s", (int)(n - 1), want);
            tg_job job;
            tg_err err = {{0}};
            CHECK(tg_job_parse_text(cases[i].text, "j.job", "d", NULL, 0, &job, &err) == -1 && !strcmp(err.msg, exact),
                  "%s: '%s', want exactly '%s'", label, err.msg, exact);
            continue;
        }
        job_refused(cases[i].text, NULL, 0, want, label);
    }
}

TG_TEST(test_job_lines_long_values) {
    /* A path past TG_PATH_MAX, a freeze value past its buffer, a pattern longer than a
     * parameter name, more patterns than allowed. */
    char text[6000];
    char longv[700];
    memset(longv, 'p', 600);
    longv[600] = 0;
    snprintf(text, sizeof text, "train_data = /%s\n", longv);
    job_refused(text, NULL, 0, "j.job:1: key 'train_data': path is too long (limit 511 bytes)", "long path");
    snprintf(text, sizeof text, "model = %s/x\n", longv);
    job_refused(text, NULL, 0, "j.job:1: key 'model': path is too long (limit 511 bytes)", "long model");
    char big[2200];
    memset(big, 'f', 2100);
    big[2100] = 0;
    snprintf(text, sizeof text, "freeze = %s\n", big);
    job_refused(text, NULL, 0, "j.job:1: key 'freeze': value is too long (limit 2047 bytes)", "long freeze");
    char pat[120];
    memset(pat, 'q', 96);
    pat[96] = 0;
    snprintf(text, sizeof text, "freeze = a, %s\n", pat);
    char want[300];
    snprintf(want, sizeof want, "key 'freeze': pattern '%s' is longer than a parameter name can be (95 bytes)", pat);
    job_refused(text, NULL, 0, want, "long pattern");
    size_t at = (size_t)snprintf(text, sizeof text, "freeze = ");
    for (int i = 0; i < 65; i++) at += (size_t)snprintf(text + at, sizeof text - at, "%sp%d", i ? "," : "", i);
    snprintf(text + at, sizeof text - at, "\n");
    job_refused(text, NULL, 0, "key 'freeze': more than 64 patterns", "65 patterns");
    /* The job's name and base folder: too long. */
    char name[700];
    memset(name, 'n', 600);
    name[600] = 0;
    tg_job job;
    tg_err err = {{0}};
    CHECK(tg_job_parse_text(BASE, name, NULL, NULL, 0, &job, &err) == -1 && strstr(err.msg, ": job name is too long"),
          "long name: %s", err.msg);
    CHECK(tg_job_parse_text(BASE, "j.job", name, NULL, 0, &job, &err) == -1 &&
              strstr(err.msg, "j.job: base folder nnnn") && strstr(err.msg, " is too long"),
          "long base: %s", err.msg);
    char path[700];
    snprintf(path, sizeof path, "/%s", name);
    CHECK(tg_job_load(path, NULL, 0, &job, &err) == -1 && strstr(err.msg, ": job file path is too long"), "long path: %s",
          err.msg);
}

TG_TEST(test_job_lines_accepted_forms) {
    /* Every key set once, in the forms the parser takes: quotes with a comment after them,
     * a comment after a blank, '#' inside a word, true/1/FALSE/0, a byte-order mark, CRLF
     * and lone CR line ends; relative paths joined to the base folder, absolute ones not. */
    const char *text = "\xEF\xBB\xBF# a job\r\n"
                       "model = tiny-bert\r"
                       "task = lm\n"
                       "batch = 4 # four rows\n"
                       "seq_buckets = 16, 32\n"
                       "precision = bf16\n"
                       "allow_tf32 = 1\n"
                       "optimizer = adamw\n"
                       "lr = \"1e-4\" # quoted\n"
                       "beta1 = 0.8\n"
                       "beta2 = 0.99\n"
                       "eps = 1e-6\n"
                       "weight_decay = 0\n"
                       "warmup_steps = 3\n"
                       "epochs = 2\n"
                       "grad_clip = 0.5\n"
                       "seed = 18446744073709551615\n"
                       "pad_token_id = 0\n"
                       "log_every = 5\n"
                       "train_data = data/t#1.jsonl\n"
                       "eval_data = /abs/e.jsonl\n"
                       "attention = unfused\n"
                       "fuse_bias_grad = FALSE\n"
                       "fuse_gelu = true\n"
                       "fuse_residual_layernorm = 0\n"
                       "fuse_qkv = True\n"
                       "data_parallel = 2\n"
                       "zero_stage = 1\n"
                       "freeze = embeddings.* , layer.0.*\n"
                       "checkpoint_every = 10\n"
                       "keep_checkpoints = 0\n"
                       "checkpoint_dir = ck\n"
                       "last_batch = drop\n";
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text(text, "j.job", "base/", NULL, 0, &j, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(j.model, "tiny-bert") && j.task == TG_TASK_LM && j.batch == 4 && j.seq == 32 && j.n_buckets == 2 &&
              j.bucket_seq[0] == 16 && j.bucket_seq[1] == 32,
          "model %s task %d batch %d seq %d buckets %d", j.model, j.task, j.batch, j.seq, j.n_buckets);
    CHECK(j.precision == TG_PREC_BF16 && j.allow_tf32 == 1 && j.lr == 1e-4f && j.beta1 == 0.8f && j.beta2 == 0.99f &&
              j.eps == 1e-6f && j.weight_decay == 0 && j.warmup_steps == 3 && j.epochs == 2 && j.steps == 0 &&
              j.grad_clip == 0.5f,
          "numbers");
    CHECK(j.seed == 18446744073709551615ull && j.pad_token_id == 0 && j.log_every == 5, "seed %llu",
          (unsigned long long)j.seed);
    CHECK(!strcmp(j.train_data, "base/data/t#1.jsonl") && !strcmp(j.eval_data, "/abs/e.jsonl") &&
              !strcmp(j.checkpoint_dir, "base/ck"),
          "paths %s %s %s", j.train_data, j.eval_data, j.checkpoint_dir);
    CHECK(j.attention == TG_ATTENTION_UNFUSED && j.fuse_bias_grad == 0 && j.fuse_gelu == 1 &&
              j.fuse_residual_layernorm == 0 && j.fuse_qkv == 1 && j.data_parallel == 2 && j.zero_stage == 1,
          "switches");
    CHECK(!strcmp(j.freeze, "embeddings.* , layer.0.*") && j.checkpoint_every == 10 && j.keep_checkpoints == 0 &&
              j.last_batch == TG_LAST_BATCH_DROP,
          "freeze '%s'", j.freeze);
    /* Line numbers count CRLF and lone CR as one line end each. */
    char where[700];
    CHECK(!strcmp(tg_job_where(&j, TG_JOB_TASK, where, sizeof where), "j.job:3"), "task at %s", where);
    CHECK(!strcmp(tg_job_where(&j, TG_JOB_LAST_BATCH, where, sizeof where), "j.job:33"), "last_batch at %s", where);
    CHECK(!strcmp(tg_job_where(&j, -1, where, sizeof where), "j.job (default)") &&
              !strcmp(tg_job_where(&j, TG_JOB_KEY_COUNT, where, sizeof where), "j.job (default)"),
          "no key: %s", where);
    CHECK(!strcmp(tg_job_key_name(TG_JOB_SEQ_BUCKETS), "seq_buckets") && !strcmp(tg_job_key_name(-1), "?") &&
              !strcmp(tg_job_key_name(TG_JOB_KEY_COUNT), "?"),
          "key names");
    /* A model name without '/' is a preset (not joined); with one it is a folder. The base
     * folder "" and "/" are used as they are. */
    REQUIRE(tg_job_parse_text("model = m/x\ntrain_data = t\nsteps = 1\n", "j.job", "", NULL, 0, &j, &err) == 0, "%s",
            err.msg);
    CHECK(!strcmp(j.model, "m/x") && !strcmp(j.train_data, "t"), "no base: %s %s", j.model, j.train_data);
    REQUIRE(tg_job_parse_text("model = m/x\ntrain_data = t\nsteps = 1\n", "j.job", "/", NULL, 0, &j, &err) == 0, "%s",
            err.msg);
    CHECK(!strcmp(j.model, "/m/x") && !strcmp(j.train_data, "/t"), "root base: %s %s", j.model, j.train_data);
    /* seq equal to the last bucket; blanks around lengths; an empty freeze; no base folder. */
    REQUIRE(tg_job_parse_text(BASE "seq = 32\nseq_buckets = 16 , 32\nfreeze = \"\"\n", "j.job", NULL, NULL, 0, &j,
                              &err) == 0,
            "%s", err.msg);
    CHECK(j.seq == 32 && j.n_buckets == 2 && j.bucket_seq[0] == 16 && j.freeze[0] == 0 &&
              j.key_line[TG_JOB_FREEZE] == 6 && !strcmp(j.train_data, "t.jsonl"),
          "seq %d buckets %d freeze '%s'", j.seq, j.n_buckets, j.freeze);
}

TG_TEST(test_job_lines_freeze_patterns) {
    tg_job j;
    tg_job_defaults(&j);
    char p[8][TG_NAME_MAX];
    snprintf(j.freeze, sizeof j.freeze, " a.* ,b , ,  c  ");
    /* Blank patterns are passed over (a job's value has none; this one is set by hand). */
    int n = tg_job_freeze_patterns(&j, p, 8);
    CHECK(n == 3 && !strcmp(p[0], "a.*") && !strcmp(p[1], "b") && !strcmp(p[2], "c"), "%d: %s|%s|%s", n, p[0], p[1],
          p[2]);
    CHECK(tg_job_freeze_patterns(&j, p, 2) == 2 && !strcmp(p[1], "b"), "max 2");
    memset(j.freeze, 'x', 200);
    j.freeze[200] = 0;
    CHECK(tg_job_freeze_patterns(&j, p, 8) == 0, "a pattern too long for a name is passed over");
    j.freeze[0] = 0;
    CHECK(tg_job_freeze_patterns(&j, p, 8) == 0, "none");
}

TG_TEST(test_job_lines_overrides) {
    static const struct {
        const char *set, *want;
    } bad[] = {
        {"seq", "--set seq: expected key=value (missing '=')"},
        {" =5", "--set  =5: missing key before '='"},
        {"sed=5", "--set sed=5: key 'sed': unknown key (did you mean 'seq'?)"},
        {"seq=\"5", "--set seq=\"5: key 'seq': unterminated quoted value"},
        {"seq=\xC3(", "--set seq=\xC3(: invalid UTF-8 (byte 0xC3 at column 5)"},
        {"seq=0", "--set seq=0: key 'seq': 0 is out of range"},
        {"seq_buckets=8,16", "j.job:4: key 'seq': 32 differs from the last of seq_buckets (16, --set)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char label[32];
        snprintf(label, sizeof label, "--set case %zu", i);
        job_refused(BASE "seq = 32\n", &bad[i].set, 1, bad[i].want, label);
    }
    /* steps and epochs replace each other from --set, unless both come from --set. */
    tg_job j;
    tg_err err = {{0}};
    const char *epochs[] = {"epochs=3"};
    REQUIRE(tg_job_parse_text(BASE, "j.job", "d", epochs, 1, &j, &err) == 0, "%s", err.msg);
    CHECK(j.epochs == 3 && j.steps == 0 && j.key_line[TG_JOB_STEPS] == 0 && j.key_line[TG_JOB_EPOCHS] == -1,
          "epochs %d steps %d", j.epochs, j.steps);
    const char *steps[] = {"steps=7"};
    REQUIRE(tg_job_parse_text("model = m\ntrain_data = t\nepochs = 2\n", "j.job", "d", steps, 1, &j, &err) == 0, "%s",
            err.msg);
    CHECK(j.steps == 7 && j.epochs == 0 && j.key_line[TG_JOB_STEPS] == -1 && j.key_line[TG_JOB_EPOCHS] == 0,
          "steps %d epochs %d, lines %d %d", j.steps, j.epochs, j.key_line[TG_JOB_STEPS], j.key_line[TG_JOB_EPOCHS]);
    /* The replaced key reads as a default again, in messages and in the job's fingerprint. */
    char replaced[64];
    CHECK(!strcmp(tg_job_where(&j, TG_JOB_EPOCHS, replaced, sizeof replaced), "j.job (default)") &&
              !strcmp(tg_job_where(&j, TG_JOB_STEPS, replaced, sizeof replaced), "--set"),
          "where %s", replaced);
    REQUIRE(tg_job_parse_text("model = m\ntrain_data = t\nepochs = 2\n", "j.job", "d", epochs, 1, &j, &err) == 0,
            "%s", err.msg);
    CHECK(!strcmp(tg_job_where(&j, TG_JOB_EPOCHS, replaced, sizeof replaced), "--set") && j.epochs == 3 &&
              j.key_line[TG_JOB_STEPS] == 0,
          "epochs over epochs: where %s, epochs %d", replaced, j.epochs);
    const char *both[] = {"epochs=3", "steps=4"};
    job_refused(BASE, both, 2, "j.job: keys 'steps' (--set) and 'epochs' (--set) are both set", "both --set");
    const char *both2[] = {"steps=4", "epochs=3"};
    job_refused(BASE, both2, 2, "keys 'steps' (--set) and 'epochs' (--set) are both set", "both --set, steps first");
    /* --set paths stay relative to the current folder; seq comes from the buckets. */
    const char *sets[] = {"train_data=x.jsonl", "seq_buckets=8, 16"};
    REQUIRE(tg_job_parse_text(BASE, "j.job", "d", sets, 2, &j, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(j.train_data, "x.jsonl") && j.seq == 16 && j.n_buckets == 2, "%s seq %d", j.train_data, j.seq);
    char where[64];
    CHECK(!strcmp(tg_job_where(&j, TG_JOB_TRAIN_DATA, where, sizeof where), "--set"), "where %s", where);
    /* The --set copy is allocated through the hook: its failure is reported. */
    tg_alloc_fail_after(0);
    int rc = tg_job_apply_overrides(&j, sets, 1, &err);
    tg_alloc_fail_after(-1);
    CHECK(rc == -1 && !strcmp(err.msg, "--set train_data=x.jsonl: out of memory"), "oom: %s", err.msg);
}

TG_TEST(test_job_lines_run_overrides) {
    tg_job j;
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text(BASE "eval_data = e\n", "j.job", "", NULL, 0, &j, &err) == 0, "%s", err.msg);
    tg_plan_run run;
    tg_job_run_settings(&j, &run);
    CHECK(run.steps == 1 && !strcmp(run.train_data, "t.jsonl") && !strcmp(run.eval_data, "e") && run.seed == 42,
          "run settings");
    const struct {
        const char *set;
        int buckets;
        const char *want;
    } bad[] = {
        {"seq=64", 1, "--set seq=64: this key is compiled into p.tgp; recompile the job to change it (a plan takes steps, "
                      "epochs, seed, log_every, train_data, eval_data, checkpoint_every, keep_checkpoints, "
                      "checkpoint_dir, last_batch, skip_nonfinite, max_skipped_steps, qa_n_best, qa_max_answer_length, "
                      "qa_null_threshold, gpu_hour_price)"},
        {"last_batch=wrap", 2, "--set last_batch=wrap: p.tgp has 2 length buckets (seq_buckets), and wrap is not allowed"},
        {"steps=x", 1, "--set steps=x: key 'steps': 'x' is not an integer"},
        {"stesp=2", 1, "--set stesp=2: key 'stesp': unknown key (did you mean 'steps'?)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tg_plan_run r = run;
        CHECK(tg_job_apply_run_overrides(&r, bad[i].buckets, &bad[i].set, 1, "p.tgp", &err) == -1 &&
                  strstr(err.msg, bad[i].want),
              "run case %zu: '%s' lacks '%s'", i, err.msg, bad[i].want);
    }
    const char *both[2][2] = {{"steps=3", "epochs=2"}, {"epochs=2", "steps=3"}};
    tg_plan_run r;
    for (int i = 0; i < 2; i++) {
        r = run;
        CHECK(tg_job_apply_run_overrides(&r, 1, both[i], 2, "p.tgp", &err) == -1 &&
                  !strcmp(err.msg, "p.tgp: keys 'steps' (--set) and 'epochs' (--set) are both set; give exactly one"),
              "both, order %d: %s", i, err.msg);
    }
    /* Accepted: epochs replaces steps; wrap with one bucket; pad with several. */
    const char *ok[] = {"epochs=2", "last_batch=wrap", "seed=7", "train_data=n.jsonl"};
    r = run;
    REQUIRE(tg_job_apply_run_overrides(&r, 1, ok, 4, "p.tgp", &err) == 0, "%s", err.msg);
    CHECK(r.epochs == 2 && r.steps == 0 && r.last_batch == TG_LAST_BATCH_WRAP && r.seed == 7 &&
              !strcmp(r.train_data, "n.jsonl") && !strcmp(r.eval_data, "e"),
          "epochs %d steps %d last %d seed %llu", r.epochs, r.steps, r.last_batch, (unsigned long long)r.seed);
    const char *steps[] = {"steps=5", "last_batch=pad"};
    REQUIRE(tg_job_apply_run_overrides(&r, 3, steps, 2, "p.tgp", &err) == 0, "%s", err.msg);
    CHECK(r.steps == 5 && r.epochs == 0 && r.last_batch == TG_LAST_BATCH_PAD, "steps %d epochs %d", r.steps, r.epochs);
}

TG_TEST(test_job_lines_files) {
    const char *dir = tg_test_tmpdir();
    char path[600];
    tg_job j;
    tg_err err = {{0}};
    /* A job longer than the first 4 KiB read, with comments padding it. */
    size_t cap = 12000, at = 0;
    char *text = malloc(cap);
    REQUIRE(text, "malloc");
    at += (size_t)snprintf(text + at, cap - at, "model = tiny-bert\n");
    while (at < 9000) at += (size_t)snprintf(text + at, cap - at, "# padding padding padding padding padding\n");
    snprintf(text + at, cap - at, "train_data = t.jsonl\nsteps = 2\n");
    snprintf(path, sizeof path, "%s/long.job", dir);
    REQUIRE(tg_test_write_file(path, text) == 0, "write");
    REQUIRE(tg_job_load(path, NULL, 0, &j, &err) == 0, "%s", err.msg);
    char want[700];
    snprintf(want, sizeof want, "%s/t.jsonl", dir);
    CHECK(j.steps == 2 && !strcmp(j.train_data, want), "steps %d data %s", j.steps, j.train_data);
    /* Failing its allocations in turn: each is reported. */
    for (long k = 0; k < 4; k++) {
        tg_alloc_fail_after(k);
        int rc = tg_job_load(path, NULL, 0, &j, &err);
        tg_alloc_fail_after(-1);
        snprintf(want, sizeof want, "%s: out of memory", path);
        CHECK(rc == -1 && !strcmp(err.msg, want), "allocation %ld: '%s'", k, err.msg);
    }
    free(text);
    /* A folder is no job file; a job named without a folder is read from the current one. */
    CHECK(tg_job_load(dir, NULL, 0, &j, &err) == -1 && strstr(err.msg, ": read error: Is a directory"), "folder: %s",
          err.msg);
    CHECK(tg_job_load("no-such.job", NULL, 0, &j, &err) == -1 &&
              !strcmp(err.msg, "no-such.job: cannot open job file: No such file or directory"),
          "no folder: %s", err.msg);
}
