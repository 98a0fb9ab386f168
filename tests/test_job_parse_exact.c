/* Job files (compiler/job.c) pinned whole: every field tg_job_defaults fills, every key
 * name in table order, the first bad line stopping the parse (a later line never replaces
 * its message), the UTF-8 check at each range's edges, and a message prefix as long as the
 * longest job path. */
#include <stdio.h>
#include <string.h>

#include "compiler/job.h"
#include "tests/harness.h"

TG_TEST(test_job_parse_exact_defaults) {
    tg_job want;
    memset(&want, 0, sizeof want);
    want.task = TG_TASK_CLASSIFY, want.num_labels = 2, want.batch = 8, want.seq = 128;
    want.precision = TG_PREC_FP32, want.allow_tf32 = 0;
    want.lr = 5e-5f, want.beta1 = 0.9f, want.beta2 = 0.999f, want.beta3 = 0.99f, want.eps = 1e-8f;
    want.weight_decay = 0.01f, want.warmup_steps = 0, want.grad_clip = 1.0f, want.seed = 42;
    want.pad_token_id = -1, want.log_every = 1, want.attention = TG_ATTENTION_FUSED;
    want.fuse_bias_grad = want.fuse_gelu = want.fuse_residual_layernorm = want.fuse_qkv = 1;
    want.data_parallel = 1, want.keep_checkpoints = 3, want.n_buckets = 1, want.bucket_seq[0] = 128;
    want.last_batch = TG_LAST_BATCH_PAD, want.skip_nonfinite = 1, want.max_skipped_steps = 10;
    want.mlm_probability = 0.15f, want.mask_token_id = -1, want.n_special_ids = -1;
    for (int i = 0; i < TG_JOB_SPECIAL_IDS_MAX; i++) want.special_ids[i] = -1;
    want.grad_accumulation = 1;
    want.loss_scale_init = 65536.0f, want.loss_scale_growth_factor = 2.0f, want.loss_scale_backoff = 0.5f;
    want.loss_scale_growth_interval = 2000;
    want.qa_n_best = 20, want.qa_max_answer_length = 30, want.qa_null_threshold = 0.0f;
    want.grad_bucket_mb = 25;
    want.lora_alpha = 8.0f;
    want.share_grad_memory = 1, want.recompute = TG_RECOMPUTE_AUTO;
    want.fuse_bn_relu6 = 1;
    tg_job job;
    memset(&job, 0x5A, sizeof job); /* every byte the defaults leave alone would show */
    tg_job_defaults(&job);
    CHECK(job.keep_checkpoints == 3 && job.max_skipped_steps == 10 && job.beta3 == 0.99f && job.n_buckets == 1 &&
              job.bucket_seq[0] == 128 && job.grad_accumulation == 1 && job.mask_token_id == -1 &&
              job.n_special_ids == -1,
          "keep %d, skipped %d, beta3 %g, buckets %d (%d), accumulation %d, mask %d, special %d", job.keep_checkpoints,
          job.max_skipped_steps, (double)job.beta3, job.n_buckets, job.bucket_seq[0], job.grad_accumulation,
          job.mask_token_id, job.n_special_ids);
    CHECK(memcmp(&job, &want, sizeof job) == 0, "tg_job_defaults fills more or other than the documented defaults");
    /* A parsed job holds the defaults where the text sets nothing, and the line of what it sets. */
    tg_err err = {{0}};
    REQUIRE(tg_job_parse_text("model = tiny-bert\ntrain_data = t\nsteps = 2\n", "j.job", "", NULL, 0, &job, &err) == 0,
            "%s", err.msg);
    snprintf(want.model, sizeof want.model, "tiny-bert");
    snprintf(want.train_data, sizeof want.train_data, "t");
    snprintf(want.path, sizeof want.path, "j.job");
    want.steps = 2;
    want.key_line[TG_JOB_MODEL] = 1, want.key_line[TG_JOB_TRAIN_DATA] = 2, want.key_line[TG_JOB_STEPS] = 3;
    CHECK(!strcmp(job.path, "j.job") && !strcmp(job.model, "tiny-bert") && !strcmp(job.train_data, "t"),
          "path '%s', model '%s', train '%s'", job.path, job.model, job.train_data);
    CHECK(memcmp(&job, &want, sizeof job) == 0, "the parsed job differs from the defaults plus its three keys");
}

TG_TEST(test_job_parse_exact_key_names) {
    static const char *const names[TG_JOB_KEY_COUNT] = {
        "model", "task", "num_labels", "batch", "seq", "precision", "allow_tf32", "optimizer", "lr", "beta1",
        "beta2", "eps", "weight_decay", "warmup_steps", "steps", "epochs", "grad_clip", "seed", "pad_token_id",
        "log_every", "train_data", "eval_data", "attention", "fuse_bias_grad", "fuse_gelu",
        "fuse_residual_layernorm", "fuse_qkv", "data_parallel", "zero_stage", "freeze", "checkpoint_every",
        "keep_checkpoints", "checkpoint_dir", "seq_buckets", "last_batch", "lr_schedule", "beta3", "no_prox",
        "skip_nonfinite", "max_skipped_steps", "mlm_probability", "mask_token_id", "special_token_ids",
        "grad_accumulation", "loss_scale_init", "loss_scale_growth_factor", "loss_scale_backoff",
        "loss_scale_growth_interval", "qa_n_best", "qa_max_answer_length", "qa_null_threshold", "share_grad_memory", "recompute", "memory_limit", "optimizer_state", "grad_bucket_mb",
        "lora_r", "lora_alpha", "lora_dropout", "lora_targets", "gpu_hour_price", "image_channels", "image_size",
        "width_mult", "image_mean", "image_std", "fuse_bn_relu6", "lora_modules_to_save", "random_crop_padding",
        "random_horizontal_flip"};
    for (int k = 0; k < TG_JOB_KEY_COUNT; k++)
        CHECK(!strcmp(tg_job_key_name(k), names[k]), "key %d is '%s', want '%s'", k, tg_job_key_name(k), names[k]);
    CHECK(!strcmp(tg_job_key_name(-1), "?") && !strcmp(tg_job_key_name(TG_JOB_KEY_COUNT), "?"), "outside the table");
    /* tg_job_where: the file and line, --set, or the file's default. */
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.path, sizeof job.path, "a/j.job");
    job.key_line[TG_JOB_SEQ] = 7, job.key_line[TG_JOB_LR] = -1;
    char buf[64];
    CHECK(!strcmp(tg_job_where(&job, TG_JOB_SEQ, buf, sizeof buf), "a/j.job:7"), "%s", buf);
    CHECK(!strcmp(tg_job_where(&job, TG_JOB_LR, buf, sizeof buf), "--set"), "%s", buf);
    CHECK(!strcmp(tg_job_where(&job, TG_JOB_BATCH, buf, sizeof buf), "a/j.job (default)"), "%s", buf);
    CHECK(!strcmp(tg_job_where(&job, -1, buf, sizeof buf), "a/j.job (default)"), "%s", buf);
    CHECK(!strcmp(tg_job_where(&job, TG_JOB_KEY_COUNT, buf, sizeof buf), "a/j.job (default)"), "%s", buf);
}

/* Each refused line is the last one read: the lines after it, wrong in another way, never
 * replace its message. */
TG_TEST(test_job_parse_exact_first_bad_line_stops) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"model tiny-bert\nzzzz = 1\n", "j.job:1: expected 'key = value', got 'model tiny-bert' (missing '=')"},
        {"model tiny-bert\nseq = 8\n", "j.job:1: expected 'key = value', got 'model tiny-bert' (missing '=')"},
        {"seq = 8\n = 5\nseq = 9\n", "j.job:2: missing key before '='"},
        {"sqe = 8\nseq\n", "j.job:1: key 'sqe': unknown key (did you mean 'seq'?)"},
        {"seq = 8\nseq = 9\nbogus\n", "j.job:2: key 'seq': duplicate key (first set on line 1)"},
        {"seq = \"8\nbogus\n", "j.job:1: key 'seq': unterminated quoted value"},
        {"seq = x\nbogus\n", "j.job:1: key 'seq': 'x' is not an integer"},
        {"# \x80\nbogus\n", "j.job:1: invalid UTF-8 (byte 0x80 at column 3)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_job job;
        tg_err err = {{0}};
        int rc = tg_job_parse_text(cases[i].text, "j.job", "", NULL, 0, &job, &err);
        CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg,
              cases[i].want);
    }
}

/* UTF-8 at the edges of each range: the lowest and highest lead and continuation bytes
 * accepted, one past them refused at the lead byte's column. */
TG_TEST(test_job_parse_exact_utf8_edges) {
    static const struct {
        const char *comment;
        int bad_byte, column; /* 0: accepted */
    } cases[] = {
        {"\x7F", 0, 0},
        {"\x80", 0x80, 3},
        {"\xBF", 0xBF, 3},
        {"\xC0\x80", 0xC0, 3},
        {"\xC2\x80", 0, 0},
        {"\xDF\xBF", 0, 0},
        {"\xC2\x7F", 0xC2, 3},
        {"\xC2\xC0", 0xC2, 3},
        {"\xE0\xA0\x80", 0, 0},
        {"\xE0\x9F\xBF", 0xE0, 3},
        {"\xE1\x80\x80", 0, 0},
        {"\xED\x9F\xBF", 0, 0},
        {"\xED\xA0\x80", 0xED, 3},
        {"\xEF\xBF\xBF", 0, 0},
        {"\xEE\x80\x7F", 0xEE, 3},
        {"\xF0\x90\x80\x80", 0, 0},
        {"\xF0\x8F\xBF\xBF", 0xF0, 3},
        {"\xF3\xBF\xBF\xBF", 0, 0},
        {"\xF4\x8F\xBF\xBF", 0, 0},
        {"\xF4\x90\x80\x80", 0xF4, 3},
        {"\xF1\x80\x80\xC0", 0xF1, 3},
        {"\xF5\x80\x80\x80", 0xF5, 3},
        {"ab\xC2\x80\xE2\x82\xAC\xF0\x9F\x98\x80\xFF", 0xFF, 14},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[128], want[128];
        snprintf(text, sizeof text, "# %s\nmodel = tiny-bert\ntrain_data = t\nsteps = 1\n", cases[i].comment);
        tg_job job;
        tg_err err = {{0}};
        int rc = tg_job_parse_text(text, "j.job", "", NULL, 0, &job, &err);
        if (!cases[i].bad_byte) {
            CHECK(rc == 0 && !strcmp(job.model, "tiny-bert"), "case %zu: '%s'", i, err.msg);
            continue;
        }
        snprintf(want, sizeof want, "j.job:1: invalid UTF-8 (byte 0x%02X at column %d)", cases[i].bad_byte,
                 cases[i].column);
        CHECK(rc == -1 && !strcmp(err.msg, want), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg, want);
    }
}

/* A job named by a path of TG_PATH_MAX - 1 bytes: each message carries its whole
 * "<path>:<line>: " prefix. */
TG_TEST(test_job_parse_exact_longest_name_prefix) {
    char name[TG_PATH_MAX];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = 0;
    static const struct {
        const char *text, *rest;
    } cases[] = {
        {"seq = 8\n\n\n\n\n\n\n\n\n\n\n\n\nbogus line\n", ":14: expected 'key = value', got 'bogus line' (missing '=')"},
        {"modle = x\n", ":1: key 'modle': unknown key (did you mean 'model'?)"},
        {"seq = 0\n", ":1: key 'seq': "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_job job;
        tg_err err = {{0}};
        char want[sizeof err.msg];
        snprintf(want, sizeof want, "%s%s", name, cases[i].rest);
        int rc = tg_job_parse_text(cases[i].text, name, "", NULL, 0, &job, &err);
        CHECK(rc == -1 && !strncmp(err.msg, want, strlen(want)), "case %zu: rc %d, message of %zu bytes ends '%s'", i,
              rc, strlen(err.msg), err.msg + (strlen(err.msg) > 80 ? strlen(err.msg) - 80 : 0));
    }
}

/* Relative paths in a job read from text join its base folder with one slash, whatever
 * character the folder's name ends in (one that sorts below '/' too), and none is added
 * after a folder that ends in one. */
TG_TEST(test_job_parse_exact_base_folder_join) {
    static const struct {
        const char *base, *want;
    } cases[] = {{"data.", "data./t.jsonl"}, {"a-", "a-/t.jsonl"}, {"x", "x/t.jsonl"},
                 {"y/", "y/t.jsonl"},     {"/", "/t.jsonl"},      {"", "t.jsonl"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_job job;
        tg_err err = {{0}};
        REQUIRE(tg_job_parse_text("model = tiny-bert\ntrain_data = t.jsonl\nsteps = 1\n", "j.job", cases[k].base, NULL,
                                  0, &job, &err) == 0,
                "%s", err.msg);
        CHECK(!strcmp(job.train_data, cases[k].want), "base '%s': train_data '%s', want '%s'", cases[k].base,
              job.train_data, cases[k].want);
    }
}

/* A special token id is at most 31 characters: 31 zeros and a 5 is refused whole (it would
 * read as 5), the longest that fits is read. */
TG_TEST(test_job_parse_exact_special_id_length) {
    tg_job job;
    tg_err err = {{0}};
    int rc = tg_job_parse_text("special_token_ids = 1, 00000000000000000000000000000005\n", "j.job", "", NULL, 0,
                               &job, &err);
    CHECK(rc == -1 && !strcmp(err.msg, "j.job:1: key 'special_token_ids': '00000000000000000000000000000005' is not "
                                       "a token id (ids are separated by commas, as in 0,100,101,102; or none)"),
          "32 characters: rc %d '%s'", rc, err.msg);
    memset(&err, 0, sizeof err);
    rc = tg_job_parse_text("model = tiny-bert\ntask = mlm\ntrain_data = x\nsteps = 1\n"
                           "special_token_ids = 1, 0000000000000000000000000000005\n",
                           "j.job", "", NULL, 0, &job, &err);
    CHECK(rc == 0 && job.n_special_ids == 2 && job.special_ids[0] == 1 && job.special_ids[1] == 5,
          "31 characters: rc %d '%s', %d ids", rc, err.msg, job.n_special_ids);
}
