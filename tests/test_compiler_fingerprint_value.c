/* The plan fingerprint (compiler/fingerprint.c) of one fixed model config and job, pinned
 * to its value: xxh64 with seed 0 of the 782-byte little-endian encoding, field by field,
 * computed apart from this code (tests/fingerprint_value.py). Bytes past a
 * string's NUL and struct padding play no part; every field does. */
#include <string.h>

#include "compiler/fingerprint.h"
#include "tests/harness.h"

#define FIXED_FINGERPRINT 0x210b4cd7d7afd709ull

static void fixed_inputs(tg_model_config *m, tg_job *j, unsigned char fill) {
    memset(m, fill, sizeof *m);
    memset(j, fill, sizeof *j);
    /* Each string ends at its NUL; what follows it is `fill`. */
    strcpy(m->source, "src/config.json");
    strcpy(m->weights, "w.safetensors");
    m->arch = 1, m->vocab_size = 30522, m->hidden = 64, m->layers = 2, m->heads = 4, m->intermediate = 256;
    m->max_positions = 512, m->type_vocab_size = 2, m->pad_token_id = 0, m->gelu = 1;
    m->layer_norm_eps = 1e-12f, m->initializer_range = 0.02f, m->hidden_dropout = 0.1f;
    m->attention_dropout = 0.25f, m->embedding_dropout = 0.5f, m->classifier_dropout = 0.75f;
    m->kv_heads = 2, m->tie_word_embeddings = 1, m->rope_type = 2, m->rope_original_max_positions = 8192;
    m->rope_theta = 500000.0f, m->rope_factor = 32.0f, m->rope_low_freq_factor = 1.0f, m->rope_high_freq_factor = 4.0f;

    strcpy(j->path, "dir/j.job");
    strcpy(j->model, "tiny-bert");
    j->task = 1, j->num_labels = 3, j->batch = 8, j->seq = 48, j->precision = 1, j->allow_tf32 = 0;
    j->attention = 2, j->fuse_bias_grad = 1, j->fuse_gelu = 0, j->fuse_residual_layernorm = 1, j->fuse_qkv = 1;
    j->data_parallel = 2, j->zero_stage = 1;
    j->optimizer = 1, j->beta3 = 0.95f, j->no_prox = 1;
    j->lr = 2e-3f, j->beta1 = 0.9f, j->beta2 = 0.999f, j->eps = 1e-8f, j->weight_decay = 0.01f;
    j->warmup_steps = 7, j->lr_schedule = 1, j->steps = 100, j->epochs = 3, j->grad_clip = 1.0f;
    j->seed = 0x0123456789abcdefull;
    j->pad_token_id = -1, j->log_every = 10;
    strcpy(j->train_data, "train.jsonl");
    strcpy(j->eval_data, "eval.jsonl");
    strcpy(j->freeze, "bert.embeddings.*");
    j->checkpoint_every = 50, j->keep_checkpoints = 3;
    strcpy(j->checkpoint_dir, "ckpt");
    j->n_buckets = 3;
    const int32_t seqs[TG_MAX_BUCKETS] = {16, 32, 48};
    memcpy(j->bucket_seq, seqs, sizeof seqs);
    j->last_batch = 2, j->skip_nonfinite = 1, j->max_skipped_steps = 7;
    j->mlm_probability = 0.2f, j->mask_token_id = 103, j->n_special_ids = 2;
    const int32_t special[TG_JOB_SPECIAL_IDS_MAX] = {0, 101, -1, -1, -1};
    memcpy(j->special_ids, special, sizeof special);
    j->grad_accumulation = 4;
    j->loss_scale_init = 1024.0f, j->loss_scale_growth_factor = 4.0f, j->loss_scale_backoff = 0.25f;
    j->loss_scale_growth_interval = 100;
    j->qa_n_best = 5, j->qa_max_answer_length = 17, j->qa_null_threshold = -2.5f;
    j->share_grad_memory = 0, j->recompute = 1, j->memory_limit = 3ull << 30;
    j->optimizer_state = 1;
    j->grad_bucket_mb = 7;
    j->lora_r = 16, j->lora_alpha = 32.0f, j->lora_dropout = 0.05f;
    strcpy(j->lora_targets, "q_proj,v_proj");
    j->lora_modules_to_save[0] = 0; /* unset: hashed only when set */
    j->random_crop_padding = 0, j->random_horizontal_flip = 0; /* likewise */
    j->gpu_hour_price = 2.5f;
    for (int k = 0; k < (int)(sizeof j->key_line / sizeof j->key_line[0]); k++) j->key_line[k] = k * 3 - 5;
}

TG_TEST(test_fingerprint_of_fixed_inputs) {
    static tg_model_config m;
    static tg_job j;
    fixed_inputs(&m, &j, 0);
    const uint64_t fp = tg_job_fingerprint(&m, &j, "1.2.3");
    CHECK(fp == FIXED_FINGERPRINT, "fingerprint 0x%016llx, expected 0x%016llx", (unsigned long long)fp,
          FIXED_FINGERPRINT);
    /* The bytes after each string's NUL and the padding: not part of it. */
    fixed_inputs(&m, &j, 0xA7);
    CHECK(tg_job_fingerprint(&m, &j, "1.2.3") == FIXED_FINGERPRINT, "bytes past the strings changed it");
    /* The version is hashed as well. */
    CHECK(tg_job_fingerprint(&m, &j, "1.2.4") != FIXED_FINGERPRINT, "the version is not part of it");
}

/* One field changed at a time, each changes the value (the encoding has no field twice and
 * drops none). */
TG_TEST(test_fingerprint_every_field_counts) {
    static tg_model_config m;
    static tg_job j;
#define FIELD_CHANGES(X)                                                                                              \
    X(m.source[0] = 'S') X(m.weights[1] = 'W') X(m.arch = 0) X(m.vocab_size++) X(m.hidden++) X(m.layers++)            \
    X(m.heads++) X(m.intermediate++) X(m.max_positions++) X(m.type_vocab_size++) X(m.pad_token_id++) X(m.gelu = 0)  \
    X(m.layer_norm_eps = 1e-5f) X(m.initializer_range = 0.03f) X(m.hidden_dropout = 0) X(m.attention_dropout = 0)   \
    X(m.embedding_dropout = 0) X(m.classifier_dropout = 0) X(m.kv_heads = 4) X(m.tie_word_embeddings = 0)          \
    X(m.rope_type = 1) X(m.rope_original_max_positions++) X(m.rope_theta = 1e4f) X(m.rope_factor = 8.0f)            \
    X(m.rope_low_freq_factor = 2.0f) X(m.rope_high_freq_factor = 8.0f) X(j.path[0] = 'D') X(j.model[0] = 'T') X(j.task = 0)    \
    X(j.num_labels++) X(j.batch++) X(j.seq++) X(j.precision = 0) X(j.allow_tf32 = 1) X(j.attention = 0)            \
    X(j.fuse_bias_grad = 0) X(j.fuse_gelu = 1) X(j.fuse_residual_layernorm = 0) X(j.fuse_qkv = 0)                   \
    X(j.data_parallel = 1) X(j.zero_stage = 0) X(j.optimizer = 0) X(j.beta3 = 0.9f) X(j.no_prox = 0) X(j.lr = 1e-3f) X(j.beta1 = 0.8f) X(j.beta2 = 0.99f)                 \
    X(j.eps = 1e-6f) X(j.weight_decay = 0) X(j.warmup_steps++) X(j.lr_schedule = 2) X(j.steps++) X(j.epochs++) X(j.grad_clip = 0)       \
    X(j.seed ^= 1ull << 63) X(j.pad_token_id = 0) X(j.log_every++) X(j.train_data[0] = 'T')                         \
    X(j.eval_data[0] = 'E') X(j.freeze[0] = 'B') X(j.checkpoint_every++) X(j.keep_checkpoints++)                   \
    X(j.checkpoint_dir[0] = 'C') X(j.n_buckets = 1) X(j.bucket_seq[TG_MAX_BUCKETS - 1] = 64) X(j.last_batch = 0) X(j.skip_nonfinite = 0) X(j.max_skipped_steps = 8)   \
    X(j.mlm_probability = 0.15f) X(j.mask_token_id = 4) X(j.n_special_ids = 1) X(j.special_ids[TG_JOB_SPECIAL_IDS_MAX - 1] = 7) \
    X(j.grad_accumulation = 1) X(j.loss_scale_init = 2.0f) X(j.loss_scale_growth_factor = 2.0f)                     \
    X(j.loss_scale_backoff = 0.5f) X(j.loss_scale_growth_interval = 7)                                                                \
    X(j.qa_n_best = 20) X(j.qa_max_answer_length = 30) X(j.qa_null_threshold = 0) X(j.share_grad_memory = 1) X(j.recompute = 0) X(j.memory_limit = 0) X(j.optimizer_state = 0) X(j.grad_bucket_mb = 25) X(j.lora_r = 0) X(j.lora_alpha = 8.0f) X(j.lora_dropout = 0) X(j.lora_targets[0] = 0) X(strcpy(j.lora_modules_to_save, "ln_f")) X(j.random_crop_padding = 4) X(j.random_horizontal_flip = 1) X(j.gpu_hour_price = 0) X(j.key_line[63] = 0) X(j.key_line[0] = 0)
#define TRY_CHANGE(change)                                                                                            \
    fixed_inputs(&m, &j, 0);                                                                                          \
    change;                                                                                                           \
    CHECK(tg_job_fingerprint(&m, &j, "1.2.3") != FIXED_FINGERPRINT, "'%s' left the fingerprint as it was", #change);
    FIELD_CHANGES(TRY_CHANGE)
#undef TRY_CHANGE
#undef FIELD_CHANGES
    /* A string as long as its field (no NUL) counts up to the field's end only. */
    fixed_inputs(&m, &j, 0);
    memset(j.freeze, 'f', sizeof j.freeze);
    const uint64_t full = tg_job_fingerprint(&m, &j, "1.2.3");
    j.checkpoint_every = 51;
    CHECK(full != FIXED_FINGERPRINT && tg_job_fingerprint(&m, &j, "1.2.3") != full, "a full-length freeze field");
}
