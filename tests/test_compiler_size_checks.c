/* The compiler's size checks before building (compiler/size_check.c), table-driven: each
 * refused dimension and each tensor too large for a pool, with the message naming the job
 * key, the config fields and the size; byte formatting and the pool descriptions. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "compiler/job.h"
#include "compiler/size_check.h"
#include "tests/harness.h"

typedef struct size_case {
    int arch, task, attention;
    int32_t vocab, hidden, layers, heads, inter, positions, types;
    float attention_dropout;
    int32_t batch, seq, labels;
    const char *want; /* NULL: accepted */
} size_case;

#define W "j.job (default): key "

TG_TEST(test_size_checks_table) {
    static const size_case cases[] = {
        /* every dimension positive: BERT's and GPT-2's field names */
        {TG_ARCH_BERT, .vocab = -1, .want = W "'model': model 'tiny': vocab_size 0 is not a positive count"},
        {TG_ARCH_BERT, .hidden = -1, .want = W "'model': model 'tiny': hidden_size 0 is not a positive count"},
        {TG_ARCH_BERT, .layers = -1, .want = "model 'tiny': num_hidden_layers 0 is not a positive count"},
        {TG_ARCH_BERT, .heads = -1, .want = "model 'tiny': num_attention_heads 0 is not a positive count"},
        {TG_ARCH_BERT, .inter = -1, .want = "model 'tiny': intermediate_size 0 is not a positive count"},
        {TG_ARCH_BERT, .positions = -1, .want = "model 'tiny': max_position_embeddings 0 is not a positive count"},
        {TG_ARCH_BERT, .types = -1, .want = "model 'tiny': type_vocab_size 0 is not a positive count"},
        {TG_ARCH_GPT2, .hidden = -1, .want = "model 'tiny': n_embd 0 is not a positive count"},
        {TG_ARCH_GPT2, .inter = -1, .want = "model 'tiny': n_inner 0 is not a positive count"},
        {TG_ARCH_GPT2, .types = -1, .want = NULL}, /* GPT-2 has no token types */
        {TG_ARCH_BERT, .hidden = 10, .heads = 4, .want = "model 'tiny': hidden_size 10 is not divisible by "
                                                         "num_attention_heads 4"},
        {TG_ARCH_GPT2, .hidden = 10, .heads = 4, .want = "model 'tiny': n_embd 10 is not divisible by n_head 4"},
        {TG_ARCH_BERT, .layers = 10001, .want = "model 'tiny': num_hidden_layers 10001 is more than the 10000 layers"},
        {TG_ARCH_BERT, .layers = 10000, .want = NULL},
        {TG_ARCH_BERT, .batch = -1, .want = W "'batch': batch must be at least 1"},
        {TG_ARCH_BERT, .seq = -1, .want = W "'seq': seq must be at least 1"},
        /* tensors past the 16 TiB pool limit */
        {TG_ARCH_BERT, .vocab = 1 << 30, .hidden = 1 << 14, .heads = 128,
         .want = W "'model': model 'tiny': vocab_size 1073741824 x hidden_size 16384 makes the token embedding table of "
                   "64.0 TiB (4-byte elements), more than the 16.0 TiB one memory pool may hold"},
        {TG_ARCH_GPT2, .task = TG_TASK_LM, .vocab = (1 << 30) - 1, .hidden = 1 << 14, .heads = 128,
         .want = "model 'tiny': vocab_size rounded up to 64 1073741824 x n_embd 16384 makes the token embedding table"},
        {TG_ARCH_BERT, .positions = 1 << 30, .hidden = 1 << 14, .heads = 128,
         .want = "max_position_embeddings 1073741824 x hidden_size 16384 makes the position embedding table of 64.0 TiB"},
        {TG_ARCH_BERT, .types = 1 << 30, .hidden = 1 << 14, .heads = 128,
         .want = "type_vocab_size 1073741824 x hidden_size 16384 makes the token type embedding table"},
        {TG_ARCH_BERT, .hidden = 1 << 21, .heads = 1 << 14,
         .want = "model 'tiny': 3 x hidden_size 2097152 x hidden_size 2097152 makes the query, key and value weights of a "
                 "layer of 48.0 TiB"},
        {TG_ARCH_BERT, .inter = 1 << 30, .hidden = 1 << 14, .heads = 128,
         .want = "intermediate_size 1073741824 x hidden_size 16384 makes an MLP weight of 64.0 TiB"},
        {TG_ARCH_BERT, .batch = 1 << 20, .seq = 1 << 12, .hidden = 1024, .heads = 16,
         .want = W "'batch': batch 1048576 x seq 4096 x 3 x hidden_size 1024 makes a layer's query, key and value of "
                   "48.0 TiB (4-byte elements)"},
        {TG_ARCH_BERT, .batch = INT32_MAX, .seq = INT32_MAX, .hidden = 1024, .heads = 16,
         .want = W "'batch': batch 2147483647 x seq 2147483647 x 3 x hidden_size 1024 makes a layer's query, key and "
                   "value of more than 2^64 bytes (4-byte elements)"},
        {TG_ARCH_BERT, .batch = 1 << 20, .seq = 1 << 10, .hidden = 64, .heads = 1, .inter = 1 << 16,
         .want = W "'batch': batch 1048576 x seq 1024 x intermediate_size 65536 makes a layer's MLP activation"},
        {TG_ARCH_BERT, .attention = TG_ATTENTION_UNFUSED, .batch = 1 << 16, .seq = 1 << 10, .hidden = 256, .heads = 256,
         .want = W "'batch': batch 65536 x num_attention_heads 256 x seq 1024 x seq 1024 makes a layer's attention "
                   "scores of 64.0 TiB"},
        /* fused attention keeps no scores, only dropout mask bits when there is dropout */
        {TG_ARCH_BERT, .batch = 1 << 16, .seq = 1 << 10, .hidden = 256, .heads = 256, .want = NULL},
        {TG_ARCH_BERT, .batch = 1 << 12, .seq = 1 << 16, .hidden = 256, .heads = 256, .attention_dropout = 0.1f,
         .want = W "'batch': batch 4096 x num_attention_heads 256 x seq 65536 x seq/32 2048 makes a layer's attention "
                   "dropout mask bits of 512.0 TiB"},
        /* the same shapes without attention dropout: no mask bits to keep */
        {TG_ARCH_BERT, .batch = 1 << 12, .seq = 1 << 16, .hidden = 256, .heads = 256, .want = NULL},
        /* a head dimension past the fused kernel's: the scores are kept */
        {TG_ARCH_BERT, .batch = 1 << 12, .seq = 1 << 16, .hidden = 256, .heads = 1, .inter = 64,
         .want = W "'batch': batch 4096 x num_attention_heads 1 x seq 65536 x seq 65536 makes a layer's attention scores "
                   "of 64.0 TiB"},
        {TG_ARCH_GPT2, .task = TG_TASK_LM, .batch = 1 << 14, .seq = 1 << 14, .vocab = 1 << 16, .hidden = 64, .heads = 1,
         .want = W "'batch': batch 16384 x seq 16384 x vocab_size rounded up to 64 65536 makes the logits of 64.0 TiB"},
        {TG_ARCH_BERT, .labels = INT32_MAX, .hidden = 1 << 14, .heads = 128,
         .want = W "'num_labels': num_labels 2147483647 x hidden_size 16384 makes the classifier weight of 128.0 TiB"},
        /* a num_labels below 1 is left to the job checks */
        {TG_ARCH_BERT, .labels = -1, .want = NULL},
        /* Llama: the encoders' field names, no token types and no position table */
        {TG_ARCH_LLAMA, .layers = -1, .want = W "'model': model 'tiny': num_hidden_layers 0 is not a positive count"},
        {TG_ARCH_LLAMA, .hidden = 10, .heads = 4,
         .want = "model 'tiny': hidden_size 10 is not divisible by num_attention_heads 4"},
        {TG_ARCH_LLAMA, .types = -1, .want = NULL},
        {TG_ARCH_LLAMA, .positions = 1 << 30, .hidden = 1 << 14, .heads = 128, .want = NULL},
        {TG_ARCH_LLAMA, .task = TG_TASK_LM, .vocab = (1 << 30) - 1, .hidden = 1 << 14, .heads = 128,
         .want = W "'model': model 'tiny': vocab_size rounded up to 64 1073741824 x hidden_size 16384 makes the token "
                   "embedding table of 64.0 TiB"},
        /* its gate and up projections, one product of twice the MLP's width: each MLP weight
         * and activation at the pool's 16 TiB, the pair past it */
        {TG_ARCH_LLAMA, .inter = 1 << 30, .hidden = 1 << 12, .heads = 32,
         .want = W "'model': model 'tiny': 2 x intermediate_size 1073741824 x hidden_size 4096 makes the gate and up "
                   "weights of a layer of 32.0 TiB (4-byte elements), more than the 16.0 TiB one memory pool may hold"},
        {TG_ARCH_LLAMA, .batch = 1 << 12, .seq = 1 << 10, .inter = 1 << 20,
         .want = W "'batch': batch 4096 x seq 1024 x 2 x intermediate_size 1048576 makes a layer's gate and up "
                   "projections of 32.0 TiB (4-byte elements), more than the 16.0 TiB one memory pool may hold"},
        /* the same shapes in BERT, whose MLP has no such pair */
        {TG_ARCH_BERT, .inter = 1 << 30, .hidden = 1 << 12, .heads = 32, .want = NULL},
        {TG_ARCH_BERT, .batch = 1 << 12, .seq = 1 << 10, .inter = 1 << 20, .want = NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const size_case *k = &cases[i];
        tg_job job;
        tg_job_defaults(&job);
        snprintf(job.path, sizeof job.path, "j.job");
        job.task = k->task;
        job.attention = k->attention;
        if (k->batch) job.batch = k->batch < 0 ? 0 : k->batch;
        if (k->seq) job.seq = k->seq < 0 ? 0 : k->seq;
        if (k->labels) job.num_labels = k->labels < 0 ? 0 : k->labels;
        tg_model_config cfg = {.arch = k->arch, .vocab_size = 100, .hidden = 64, .layers = 2, .heads = 4,
                               .intermediate = 128, .max_positions = 512, .type_vocab_size = 2,
                               .attention_dropout = k->attention_dropout};
        snprintf(cfg.source, sizeof cfg.source, "tiny");
        /* A -1 in the table stands for 0, which leaves the default. */
        if (k->vocab) cfg.vocab_size = k->vocab < 0 ? 0 : k->vocab;
        if (k->hidden) cfg.hidden = k->hidden < 0 ? 0 : k->hidden;
        if (k->layers) cfg.layers = k->layers < 0 ? 0 : k->layers;
        if (k->heads) cfg.heads = k->heads < 0 ? 0 : k->heads;
        if (k->inter) cfg.intermediate = k->inter < 0 ? 0 : k->inter;
        if (k->positions) cfg.max_positions = k->positions < 0 ? 0 : k->positions;
        if (k->types) cfg.type_vocab_size = k->types < 0 ? 0 : k->types;
        tg_err err = {{0}};
        int rc = tg_check_sizes(&job, &cfg, &err);
        if (!k->want) {
            CHECK(rc == 0, "case %zu refused: %s", i, err.msg);
            continue;
        }
        CHECK(rc == -1 && strstr(err.msg, k->want) != NULL, "case %zu: '%s' lacks '%s'", i, err.msg, k->want);
    }
}

TG_TEST(test_size_checks_format_and_pools) {
    static const struct {
        uint64_t bytes;
        const char *want;
    } sizes[] = {{0, "0 B"},           {1023, "1023 B"},          {1024, "1.0 KiB"},
                 {1536, "1.5 KiB"},    {1 << 20, "1.0 MiB"},      {(uint64_t)3 << 30, "3.0 GiB"},
                 {(uint64_t)1 << 44, "16.0 TiB"}, {(uint64_t)1 << 50, "1.0 PiB"}, {UINT64_MAX, "16.0 EiB"}};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        char buf[32];
        tg_format_bytes(sizes[i].bytes, buf, sizeof buf);
        CHECK(!strcmp(buf, sizes[i].want), "%llu: '%s', want '%s'", (unsigned long long)sizes[i].bytes, buf,
              sizes[i].want);
    }
    const int batch_pools[] = {TG_POOL_ACTIVATIONS, TG_POOL_INPUTS, TG_POOL_WORKSPACE};
    const int model_pools[] = {TG_POOL_PARAMS, TG_POOL_GRADS, TG_POOL_OPTIM, TG_POOL_PARAMS_BF16, TG_POOL_FROZEN,
                               TG_POOL_BUFFERS};
    for (int i = 0; i < 3; i++) CHECK(tg_pool_size_key(batch_pools[i]) == TG_JOB_BATCH, "pool %d", batch_pools[i]);
    for (int i = 0; i < 6; i++) CHECK(tg_pool_size_key(model_pools[i]) == TG_JOB_MODEL, "pool %d", model_pools[i]);
    tg_job job;
    tg_job_defaults(&job);
    tg_model_config cfg = {.arch = TG_ARCH_GPT2, .vocab_size = 100, .hidden = 64, .layers = 2, .intermediate = 128};
    snprintf(cfg.source, sizeof cfg.source, "gpt");
    char buf[600];
    tg_describe_pool_size(&job, &cfg, TG_POOL_ACTIVATIONS, buf, sizeof buf);
    CHECK(!strcmp(buf, "batch 8 x seq 128 with model 'gpt' (n_layer 2, n_embd 64, n_inner 128, vocab_size 100)"), "%s",
          buf);
    tg_describe_pool_size(&job, &cfg, TG_POOL_PARAMS, buf, sizeof buf);
    CHECK(!strcmp(buf, "model 'gpt' (n_layer 2, n_embd 64, n_inner 128, vocab_size 100)"), "%s", buf);
    cfg.arch = TG_ARCH_BERT;
    tg_describe_pool_size(NULL, &cfg, TG_POOL_ACTIVATIONS, buf, sizeof buf);
    CHECK(!strcmp(buf, "model 'gpt' (num_hidden_layers 2, hidden_size 64, intermediate_size 128, vocab_size 100)"), "%s",
          buf);
    cfg.arch = TG_ARCH_LLAMA; /* Llama's config.json names its sizes as BERT's does */
    tg_describe_pool_size(&job, &cfg, TG_POOL_PARAMS, buf, sizeof buf);
    CHECK(!strcmp(buf, "model 'gpt' (num_hidden_layers 2, hidden_size 64, intermediate_size 128, vocab_size 100)"), "%s",
          buf);
    tg_describe_pool_size(&job, NULL, TG_POOL_ACTIVATIONS, buf, sizeof buf);
    CHECK(!strcmp(buf, "the graph"), "%s", buf);
}
