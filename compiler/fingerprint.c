/* The plan fingerprint: xxh64 of a model config and job, field by field, with the producing
 * version. */
#include "compiler/fingerprint.h"

#include <string.h>

/* Header-only xxHash, as the plan file uses. */
#define XXH_INLINE_ALL
#include <xxhash.h>

/* Every value is hashed little-endian, field by field, so struct padding and the bytes
 * after a string's NUL never reach the hash and every build agrees. */
static void fp_u32(XXH64_state_t *h, uint32_t v) {
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    XXH64_update(h, x, 4);
}

static void fp_u64(XXH64_state_t *h, uint64_t v) {
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    XXH64_update(h, x, 8);
}

static void fp_i32(XXH64_state_t *h, int32_t v) { fp_u32(h, (uint32_t)v); }

static void fp_f32(XXH64_state_t *h, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    fp_u32(h, u);
}

/* A string as its length, then its bytes (at most `field`). */
static void fp_str(XXH64_state_t *h, const char *s, size_t field) {
    size_t n = strnlen(s, field);
    fp_u32(h, (uint32_t)n);
    XXH64_update(h, s, n);
}

#if UINTPTR_MAX == 0xffffffffffffffffu
/* Every field of tg_job is hashed but recompute_layers and memory_available, which no job
 * key sets (the layers recompute = auto chose, the device's free memory it planned for:
 * the fingerprint is the job's as written). */
_Static_assert(sizeof(tg_job) == 5800, "tg_job changed: update tg_job_fingerprint");
_Static_assert(sizeof(tg_model_config) == 1160, "tg_model_config changed: update tg_job_fingerprint");
#endif

uint64_t tg_job_fingerprint(const tg_model_config *m, const tg_job *j, const char *version) {
    XXH64_state_t h;
    XXH64_reset(&h, 0);
    fp_str(&h, version, strlen(version) + 1);

    fp_str(&h, m->source, sizeof m->source);
    fp_str(&h, m->weights, sizeof m->weights);
    fp_i32(&h, m->arch);
    fp_i32(&h, m->vocab_size);
    fp_i32(&h, m->hidden);
    fp_i32(&h, m->layers);
    fp_i32(&h, m->heads);
    fp_i32(&h, m->intermediate);
    fp_i32(&h, m->max_positions);
    fp_i32(&h, m->type_vocab_size);
    fp_i32(&h, m->pad_token_id);
    fp_i32(&h, m->gelu);
    fp_f32(&h, m->layer_norm_eps);
    fp_f32(&h, m->initializer_range);
    fp_f32(&h, m->hidden_dropout);
    fp_f32(&h, m->attention_dropout);
    fp_f32(&h, m->embedding_dropout);
    fp_f32(&h, m->classifier_dropout);
    fp_i32(&h, m->kv_heads);
    fp_i32(&h, m->tie_word_embeddings);
    fp_i32(&h, m->rope_type);
    fp_i32(&h, m->rope_original_max_positions);
    fp_f32(&h, m->rope_theta);
    fp_f32(&h, m->rope_factor);
    fp_f32(&h, m->rope_low_freq_factor);
    fp_f32(&h, m->rope_high_freq_factor);
    /* The image models' fields and job keys count only where they mean something, so the
     * transformers' fingerprints are what they were before these fields existed. */
    const int image = m->arch == TG_ARCH_MOBILENET_V2;
    if (image) {
        fp_i32(&h, m->image_channels);
        fp_i32(&h, m->image_size);
        fp_f32(&h, m->width_mult);
        fp_f32(&h, m->batch_norm_momentum);
        for (int c = 0; c < 3; c++) fp_f32(&h, m->image_mean[c]), fp_f32(&h, m->image_std[c]);
    }

    fp_str(&h, j->path, sizeof j->path);
    fp_str(&h, j->model, sizeof j->model);
    fp_i32(&h, j->task);
    fp_i32(&h, j->num_labels);
    fp_i32(&h, j->batch);
    fp_i32(&h, j->seq);
    fp_i32(&h, j->precision);
    fp_i32(&h, j->allow_tf32);
    fp_i32(&h, j->attention);
    fp_i32(&h, j->fuse_bias_grad);
    fp_i32(&h, j->fuse_gelu);
    fp_i32(&h, j->fuse_residual_layernorm);
    fp_i32(&h, j->fuse_qkv);
    fp_i32(&h, j->data_parallel);
    fp_i32(&h, j->zero_stage);
    fp_i32(&h, j->optimizer);
    fp_f32(&h, j->lr);
    fp_f32(&h, j->beta1);
    fp_f32(&h, j->beta2);
    fp_f32(&h, j->eps);
    fp_f32(&h, j->weight_decay);
    fp_f32(&h, j->beta3);
    fp_i32(&h, j->no_prox);
    fp_i32(&h, j->warmup_steps);
    fp_i32(&h, j->lr_schedule);
    fp_i32(&h, j->steps);
    fp_i32(&h, j->epochs);
    fp_f32(&h, j->grad_clip);
    fp_u64(&h, j->seed);
    fp_i32(&h, j->pad_token_id);
    fp_i32(&h, j->log_every);
    fp_str(&h, j->train_data, sizeof j->train_data);
    fp_str(&h, j->eval_data, sizeof j->eval_data);
    fp_str(&h, j->freeze, sizeof j->freeze);
    fp_i32(&h, j->checkpoint_every);
    fp_i32(&h, j->keep_checkpoints);
    fp_str(&h, j->checkpoint_dir, sizeof j->checkpoint_dir);
    fp_i32(&h, j->n_buckets);
    for (int k = 0; k < TG_MAX_BUCKETS; k++) fp_i32(&h, j->bucket_seq[k]);
    fp_i32(&h, j->last_batch);
    fp_i32(&h, j->skip_nonfinite);
    fp_i32(&h, j->max_skipped_steps);
    fp_f32(&h, j->mlm_probability);
    fp_i32(&h, j->mask_token_id);
    fp_i32(&h, j->n_special_ids);
    for (int k = 0; k < TG_JOB_SPECIAL_IDS_MAX; k++) fp_i32(&h, j->special_ids[k]);
    fp_i32(&h, j->grad_accumulation);
    fp_f32(&h, j->loss_scale_init);
    fp_f32(&h, j->loss_scale_growth_factor);
    fp_f32(&h, j->loss_scale_backoff);
    fp_i32(&h, j->loss_scale_growth_interval);
    fp_i32(&h, j->qa_n_best);
    fp_i32(&h, j->qa_max_answer_length);
    fp_f32(&h, j->qa_null_threshold);
    fp_i32(&h, j->share_grad_memory);
    fp_i32(&h, j->recompute);
    fp_u64(&h, j->memory_limit);
    fp_i32(&h, j->optimizer_state);
    fp_i32(&h, j->grad_bucket_mb);
    fp_i32(&h, j->lora_r);
    fp_f32(&h, j->lora_alpha);
    fp_f32(&h, j->lora_dropout);
    fp_str(&h, j->lora_targets, sizeof j->lora_targets);
    fp_f32(&h, j->gpu_hour_price);
    /* Hashed only when set (with its key line), so that the fingerprints of jobs without
     * it stay what they were before the key. */
    if (j->lora_modules_to_save[0]) {
        fp_str(&h, j->lora_modules_to_save, sizeof j->lora_modules_to_save);
        fp_i32(&h, j->key_line[TG_JOB_LORA_MODULES_TO_SAVE]);
    }
    /* Hashed only when set, as lora_modules_to_save. */
    if (j->random_crop_padding || j->random_horizontal_flip) {
        fp_i32(&h, j->random_crop_padding);
        fp_i32(&h, j->random_horizontal_flip);
        fp_i32(&h, j->key_line[TG_JOB_RANDOM_CROP_PADDING]);
        fp_i32(&h, j->key_line[TG_JOB_RANDOM_HORIZONTAL_FLIP]);
    }
    if (image) {
        fp_i32(&h, j->image_channels);
        fp_i32(&h, j->image_size);
        fp_f32(&h, j->width_mult);
        fp_i32(&h, j->fuse_bn_relu6);
    }
    /* The first 64 key lines as they were hashed before there were more keys; those past
     * them (image_mean, image_std) with the image fields. */
    const int n_lines = 64;
    fp_u32(&h, (uint32_t)n_lines);
    for (int k = 0; k < n_lines; k++) fp_i32(&h, j->key_line[k]);
    if (image) {
        /* The image keys' lines (lora_modules_to_save's, after them, is hashed with it). */
        for (int k = n_lines; k <= TG_JOB_FUSE_BN_RELU6; k++) fp_i32(&h, j->key_line[k]);
        fp_i32(&h, j->n_image_mean);
        fp_i32(&h, j->n_image_std);
        for (int c = 0; c < 3; c++) fp_f32(&h, j->image_mean[c]), fp_f32(&h, j->image_std[c]);
    }
    return XXH64_digest(&h);
}
