/* The compiler's refusals of a job its model cannot run (compiler/compile.c check_job and
 * check_trainable), each message compared whole: the key and line it names, the numbers and
 * the hints that differ between BERT, RoBERTa (positions after the padding id) and GPT-2;
 * a length that just fits next to one that just does not. */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

/* Compiles `text` (plus train_data and steps) as job "j.job"; a vocab_size > 0 replaces
 * the model's, and pad_none clears the model's padding id. Returns tg_compile's result;
 * the message in err. */
static int compile_text(const char *text, int vocab_size, int pad_none, tg_err *err) {
    char full[1024];
    snprintf(full, sizeof full, "%strain_data = t.jsonl\nsteps = 1\n", text);
    tg_job job;
    if (!CHECK(tg_job_parse_text(full, "j.job", "", NULL, 0, &job, err) == 0, "job: %s", err->msg)) return -2;
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (!CHECK(tg_model_config_load(job.model, &cfg, err) == 0, "model: %s", err->msg)) return -2;
    if (vocab_size > 0) cfg.vocab_size = vocab_size;
    if (pad_none) cfg.pad_token_id = -1;
    tg_plan plan;
    memset(err, 0, sizeof *err);
    int rc = tg_compile_with_config(&job, &cfg, &plan, err);
    if (rc == 0) tg_plan_free(&plan);
    return rc;
}

TG_TEST(test_compile_refusals_exact_messages) {
    static const struct {
        const char *text;
        int vocab_size, pad_none;
        const char *want; /* NULL: compiles */
    } cases[] = {
        {"model = tiny-bert\nseq = 8\nprecision = fp16\n", 0, 0, NULL},
        {"model = tiny-roberta\ntask = lm\n", 0, 0,
         "j.job:2: key 'task': task lm needs a decoder (gpt2 or llama family); model 'tiny-roberta' is roberta"},
        {"model = tiny-gpt2\ntask = mlm\n", 0, 0,
         "j.job:2: key 'task': task mlm needs an encoder (bert or roberta family); model 'tiny-gpt2' is gpt2"},
        {"model = tiny-gpt2\ntask = qa\n", 0, 0,
         "j.job:2: key 'task': task qa needs an encoder (bert or roberta family); model 'tiny-gpt2' is gpt2"},
        /* The mask id: the job's own (no hint), or BERT's 103 past a vocabulary of 100 (the hint). */
        {"model = tiny-bert\ntask = mlm\nmask_token_id = 128\nseq = 8\n", 0, 0,
         "j.job:3: key 'mask_token_id': mask token id 128 is outside the vocabulary of model 'tiny-bert' (vocab_size "
         "128)"},
        {"model = tiny-bert\ntask = mlm\nmask_token_id = 127\nseq = 8\n", 0, 0, NULL},
        {"model = tiny-bert\ntask = mlm\nseq = 8\n", 100, 0,
         "j.job (default): key 'mask_token_id': mask token id 103 is outside the vocabulary of model 'tiny-bert' "
         "(vocab_size 100); set mask_token_id to the tokenizer's [MASK] id"},
        {"model = tiny-bert\ntask = mlm\nseq = 8\n", 104, 0, NULL},
        /* Lengths: BERT and GPT-2 hold max_position_embeddings positions; RoBERTa's start
         * after the padding id (1), so 66 hold 64. */
        {"model = tiny-bert\nseq = 64\n", 0, 0, NULL},
        {"model = tiny-bert\nseq = 65\n", 0, 0,
         "j.job:2: key 'seq': seq 65 exceeds what model 'tiny-bert' can hold (max_position_embeddings 64)"},
        {"model = tiny-gpt2\nseq = 65\npad_token_id = 0\n", 0, 0,
         "j.job:2: key 'seq': seq 65 exceeds what model 'tiny-gpt2' can hold (max_position_embeddings 64)"},
        {"model = tiny-roberta\nseq = 64\n", 0, 0, NULL},
        {"model = tiny-roberta\nseq = 65\n", 0, 0,
         "j.job:2: key 'seq': seq 65 exceeds what model 'tiny-roberta' can hold (max_position_embeddings 66, less "
         "pad_token_id + 1)"},
        {"model = tiny-roberta\nseq_buckets = 8, 65\n", 0, 0,
         "j.job:2: key 'seq_buckets': bucket length 65 exceeds what model 'tiny-roberta' can hold "
         "(max_position_embeddings 66, less pad_token_id + 1)"},
        {"model = tiny-bert\nseq_buckets = 8, 65\n", 0, 0,
         "j.job:2: key 'seq_buckets': bucket length 65 exceeds what model 'tiny-bert' can hold "
         "(max_position_embeddings 64)"},
        {"model = tiny-bert\nseq = 16\ndata_parallel = 1\nzero_stage = 1\n", 0, 0,
         "j.job:4: key 'zero_stage': zero_stage 1 shards the optimizer state over data-parallel replicas; it needs "
         "data_parallel >= 2 (got 1)"},
        {"model = tiny-bert\nseq_buckets = 8, 16\ngrad_accumulation = 2\n", 0, 0,
         "j.job:3: key 'grad_accumulation': grad_accumulation 2 with seq_buckets is not supported yet (a window's "
         "micro-batches would fall in different buckets); leave seq_buckets out"},
        {"model = tiny-bert\nseq = 8\ntask = mlm\ngrad_accumulation = 2\n", 0, 0, NULL},
        {"model = tiny-bert\nseq = 8\ntask = qa\ngrad_accumulation = 3\n", 0, 0, NULL},
        {"model = tiny-bert\nseq = 8\ngrad_accumulation = 2\n", 0, 0, NULL},
        /* The padding id: the job's, else the model's; it must be a token. */
        {"model = tiny-bert\nseq = 8\npad_token_id = 128\n", 0, 0,
         "j.job:3: key 'pad_token_id': pad_token_id 128 is outside the vocabulary (vocab_size 128)"},
        {"model = tiny-bert\nseq = 8\npad_token_id = 127\n", 0, 0, NULL},
        {"model = tiny-gpt2\nseq = 8\n", 0, 1,
         "j.job (default): key 'pad_token_id': classification with model 'tiny-gpt2' pools at the last non-padding "
         "token, so it needs a padding id: set pad_token_id in the job (the config has none)"},
        {"model = tiny-gpt2\nseq = 8\npad_token_id = 3\n", 0, 1, NULL},
        {"model = tiny-gpt2\nseq = 8\ntask = lm\n", 0, 1, NULL},
        {"model = tiny-gpt2\nseq = 8\n", 0, 0, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_err err = {{0}};
        int rc = compile_text(cases[i].text, cases[i].vocab_size, cases[i].pad_none, &err);
        if (rc == -2) continue;
        if (cases[i].want)
            CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg,
                  cases[i].want);
        else
            CHECK(rc == 0, "case %zu: '%s'", i, err.msg);
    }
}

/* A freeze that matches every parameter: the message counts the parameters frozen, each
 * once, never the packed views over them (fuse_qkv) nor the tied LM head: tiny-bert's 5
 * embedding, 16 per layer (2 layers) and 4 pooler and classifier parameters; tiny-gpt2's
 * 2 embedding, 12 per layer and 2 final LayerNorm parameters. */
TG_TEST(test_compile_refusals_freeze_everything_counts_parameters) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"model = tiny-bert\nseq = 8\nfreeze = *\n",
         "j.job:3: key 'freeze': freezes all 41 parameters of model 'tiny-bert': nothing to train"},
        {"model = tiny-bert\nseq = 8\nfreeze = *\nfuse_qkv = false\n",
         "j.job:3: key 'freeze': freezes all 41 parameters of model 'tiny-bert': nothing to train"},
        {"model = tiny-gpt2\nseq = 8\ntask = lm\nfreeze = *\n",
         "j.job:4: key 'freeze': freezes all 28 parameters of model 'tiny-gpt2': nothing to train"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_err err = {{0}};
        int rc = compile_text(cases[i].text, 0, 0, &err);
        if (rc == -2) continue;
        CHECK(rc == -1 && !strcmp(err.msg, cases[i].want), "case %zu: rc %d '%s', want '%s'", i, rc, err.msg,
              cases[i].want);
    }
}
