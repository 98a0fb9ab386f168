#include "compiler/recompute.h"
#include "compiler/compile.h"
#include "base/alloc.h"
#include "compiler/compiler_alloc.h"
#include "compiler/grad_buckets.h"
#include "compiler/grad_writes.h"
#include "compiler/fuse_sums.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/autodiff.h"
#include "compiler/fingerprint.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "compiler/model_build.h"
#include "compiler/precision.h"
#include "compiler/size_check.h"
#include "models/model_config.h"
#include "plan/memory_estimate.h"
#include "plan/op_meta.h"
#include "plan/validate.h"
#include "base/version.h"

int tg_job_pad_id(const tg_job *job, const tg_model_config *cfg) {
    if (job->pad_token_id >= 0) return job->pad_token_id;
    return cfg->pad_token_id >= 0 ? cfg->pad_token_id : 0;
}

/* A job that the model cannot run: the message names where the key was set. */
static int job_error(const tg_job *job, int key, tg_err *err, const char *what) {
    char where[TG_PATH_MAX + 32];
    return tg_fail(err, "%s: key '%s': %s", tg_job_where(job, key, where, sizeof where), tg_job_key_name(key), what);
}

/* An image model's job: image classification (in fp32, bf16 or fp16: compiler/precision.c's
 * rules cover its convolution and batch-norm ops; fp16 with the transformers' loss scaling),
 * without what only the transformers have (token lengths, LoRA's projections, layer
 * recomputation). */
static int check_image_job(const tg_job *job, const tg_model_config *cfg, tg_err *err) {
    char msg[700];
    const char *model = cfg->source;
    if (job->task != TG_TASK_CLASSIFY) {
        snprintf(msg, sizeof msg, "model '%s' (%s) classifies images: task must be classify", model,
                 tg_arch_name(cfg->arch));
        return job_error(job, TG_JOB_TASK, err, msg);
    }
    if (job->num_labels < 2) {
        snprintf(msg, sizeof msg, "classify needs num_labels >= 2 (got %d)", job->num_labels);
        return job_error(job, TG_JOB_NUM_LABELS, err, msg);
    }
    static const int text_keys[] = {TG_JOB_SEQ, TG_JOB_SEQ_BUCKETS, TG_JOB_PAD_TOKEN_ID, TG_JOB_LORA_R,
                                    TG_JOB_LORA_TARGETS, TG_JOB_MLM_PROBABILITY, TG_JOB_MASK_TOKEN_ID,
                                    TG_JOB_SPECIAL_TOKEN_IDS};
    for (size_t k = 0; k < sizeof text_keys / sizeof text_keys[0]; k++)
        if (job->key_line[text_keys[k]] != 0) {
            snprintf(msg, sizeof msg, "model '%s' (%s) takes images, not token sequences: leave this key out", model,
                     tg_arch_name(cfg->arch));
            return job_error(job, text_keys[k], err, msg);
        }
    const int channels = job->image_channels ? job->image_channels : cfg->image_channels;
    static const int norm_keys[] = {TG_JOB_IMAGE_MEAN, TG_JOB_IMAGE_STD};
    for (int k = 0; k < 2; k++) {
        const int32_t n = k ? job->n_image_std : job->n_image_mean;
        if (n && n != channels) {
            snprintf(msg, sizeof msg, "%d values for %d channel%s (image_channels): one per channel", n, channels,
                     channels == 1 ? "" : "s");
            return job_error(job, norm_keys[k], err, msg);
        }
    }
    if (job->recompute == TG_RECOMPUTE_GELU || job->recompute == TG_RECOMPUTE_LAYERS) {
        snprintf(msg, sizeof msg, "model '%s' (%s) has no transformer layers or GELUs to recompute (none or auto)",
                 model, tg_arch_name(cfg->arch));
        return job_error(job, TG_JOB_RECOMPUTE, err, msg);
    }
    const int size = job->image_size ? job->image_size : cfg->image_size;
    if (job->random_crop_padding >= size) {
        snprintf(msg, sizeof msg, "%d must be below image_size %d: a crop of the image padded by as much could miss "
                 "it entirely", job->random_crop_padding, size);
        return job_error(job, TG_JOB_RANDOM_CROP_PADDING, err, msg);
    }
    if (job->zero_stage > 0 && job->data_parallel < 2) {
        snprintf(msg, sizeof msg,
                 "zero_stage %d shards the optimizer state over data-parallel replicas; it needs data_parallel >= 2 "
                 "(got %d)",
                 job->zero_stage, job->data_parallel);
        return job_error(job, TG_JOB_ZERO_STAGE, err, msg);
    }
    return 0;
}

static int check_job(const tg_job *job, const tg_model_config *cfg, tg_err *err) {
    char msg[700];
    if (cfg->arch == TG_ARCH_MOBILENET_V2) return check_image_job(job, cfg, err);
    static const int image_keys[] = {TG_JOB_IMAGE_CHANNELS, TG_JOB_IMAGE_SIZE, TG_JOB_WIDTH_MULT, TG_JOB_IMAGE_MEAN,
                                     TG_JOB_IMAGE_STD, TG_JOB_FUSE_BN_RELU6, TG_JOB_RANDOM_CROP_PADDING,
                                     TG_JOB_RANDOM_HORIZONTAL_FLIP};
    for (size_t k = 0; k < sizeof image_keys / sizeof image_keys[0]; k++)
        if (job->key_line[image_keys[k]] != 0) {
            snprintf(msg, sizeof msg, "only image models take it; model '%s' is %s", cfg->source,
                     tg_arch_name(cfg->arch));
            return job_error(job, image_keys[k], err, msg);
        }
    const int decoder = cfg->arch == TG_ARCH_GPT2 || cfg->arch == TG_ARCH_LLAMA;
    if (job->task == TG_TASK_LM && !decoder) {
        snprintf(msg, sizeof msg, "task lm needs a decoder (gpt2 or llama family); model '%s' is %s", cfg->source,
                 tg_arch_name(cfg->arch));
        return job_error(job, TG_JOB_TASK, err, msg);
    }
    if ((job->task == TG_TASK_MLM || job->task == TG_TASK_QA) && decoder) {
        snprintf(msg, sizeof msg, "task %s needs an encoder (bert or roberta family); model '%s' is %s",
                 tg_task_name(job->task), cfg->source, tg_arch_name(cfg->arch));
        return job_error(job, TG_JOB_TASK, err, msg);
    }
    if (job->task == TG_TASK_MLM) {
        int32_t mask_id, special[TG_JOB_SPECIAL_IDS_MAX];
        tg_mlm_token_ids(job, cfg, tg_job_pad_id(job, cfg), &mask_id, special);
        if (mask_id >= cfg->vocab_size) {
            snprintf(msg, sizeof msg, "mask token id %d is outside the vocabulary of model '%s' (vocab_size %d)%s",
                     mask_id, cfg->source, cfg->vocab_size,
                     job->mask_token_id < 0 ? "; set mask_token_id to the tokenizer's [MASK] id" : "");
            return job_error(job, TG_JOB_MASK_TOKEN_ID, err, msg);
        }
    }
    if (job->task == TG_TASK_CLASSIFY && job->num_labels < 2) {
        snprintf(msg, sizeof msg, "classify needs num_labels >= 2 (got %d)", job->num_labels);
        return job_error(job, TG_JOB_NUM_LABELS, err, msg);
    }
    /* RoBERTa positions start after the padding id, so they use pad_id + 1 slots more.
     * Every bucket holds its length in positions (the last one is seq). */
    const int64_t extra = cfg->arch == TG_ARCH_ROBERTA ? cfg->pad_token_id + 1 : 0;
    for (int k = 0; k < job->n_buckets; k++) {
        const int32_t seq = job->n_buckets > 1 ? job->bucket_seq[k] : job->seq;
        if (seq + extra <= cfg->max_positions) continue;
        snprintf(msg, sizeof msg, "%s %d exceeds what model '%s' can hold (max_position_embeddings %d%s)",
                 job->n_buckets > 1 ? "bucket length" : "seq", seq, cfg->source, cfg->max_positions,
                 cfg->arch == TG_ARCH_ROBERTA ? ", less pad_token_id + 1" : "");
        return job_error(job, job->n_buckets > 1 ? TG_JOB_SEQ_BUCKETS : TG_JOB_SEQ, err, msg);
    }
    if (job->zero_stage > 0 && job->data_parallel < 2) {
        snprintf(msg, sizeof msg,
                 "zero_stage %d shards the optimizer state over data-parallel replicas; it needs data_parallel >= 2 "
                 "(got %d)",
                 job->zero_stage, job->data_parallel);
        return job_error(job, TG_JOB_ZERO_STAGE, err, msg);
    }
    if (job->grad_accumulation > 1 && job->n_buckets > 1) {
        snprintf(msg, sizeof msg,
                 "grad_accumulation %d with seq_buckets is not supported yet (a window's micro-batches would fall in "
                 "different buckets); leave seq_buckets out",
                 job->grad_accumulation);
        return job_error(job, TG_JOB_GRAD_ACCUMULATION, err, msg);
    }
    int pad = tg_job_pad_id(job, cfg);
    if (pad >= cfg->vocab_size) {
        snprintf(msg, sizeof msg, "pad_token_id %d is outside the vocabulary (vocab_size %d)", pad, cfg->vocab_size);
        return job_error(job, TG_JOB_PAD_TOKEN_ID, err, msg);
    }
    if (decoder && job->task == TG_TASK_CLASSIFY && job->pad_token_id < 0 &&
        cfg->pad_token_id < 0) {
        snprintf(msg, sizeof msg,
                 "classification with model '%s' pools at the last non-padding token, so it needs a padding id: "
                 "set pad_token_id in the job (the config has none)",
                 cfg->source);
        return job_error(job, TG_JOB_PAD_TOKEN_ID, err, msg);
    }
    return 0;
}

/* A job whose freeze leaves no trainable parameter has nothing to train. */
static int check_trainable(tg_graph *g) {
    int trainable = 0, frozen = 0;
    for (int t = 0; t < g->n_tensors; t++) {
        trainable += (g->tensors[t].flags & TG_TENSOR_PARAM) != 0;
        frozen += (g->tensors[t].flags & TG_TENSOR_FROZEN) && !(g->tensors[t].flags & TG_TENSOR_VIEW);
    }
    if (trainable) return 0;
    return tg_graph_job_fail(g, TG_JOB_FREEZE, "freezes all %d parameters of model '%s': nothing to train", frozen,
                             g->cfg->source);
}

static int scalar(tg_graph *g, const char *name, int pool) {
    int64_t one = 1;
    return tg_graph_tensor(g, name, TG_F32, pool, 1, &one);
}

static void build_optimizer(tg_graph *g) {
    const tg_job *j = g->job;
    g->phase = TG_PHASE_OPTIMIZER;
    g->io.lr = scalar(g, "lr", TG_POOL_WORKSPACE);
    g->io.grad_norm = scalar(g, "grad_norm", TG_POOL_WORKSPACE);
    int64_t n = g->failed ? 0 : tg_tensor_numel(&g->tensors[g->io.grads_all]);

    /* Data parallelism sums the replicas' gradients in the backward (compiler/grad_buckets.c).
     * fp16: the gradients carry the loss scale; the norm is the unscaled gradients'. */
    const int64_t slice = tg_zero_slice(j, n);
    tg_op_spec s = tg_spec(TG_OP_GRAD_NORM);
    if (slice) {
        /* ZeRO-1: each replica holds the sums of its own slice only, so its blocks' squares
         * are summed over the replicas before the norm (plan/ops.def GRAD_SQUARES). */
        int64_t blocks = (n + TG_NORM_BLOCK - 1) / TG_NORM_BLOCK;
        const int squares = tg_graph_tensor(g, "grad_squares", TG_F32, TG_POOL_WORKSPACE, 1, &blocks);
        s = tg_spec(TG_OP_GRAD_SQUARES);
        s.in[0] = g->io.grads_all, s.out[0] = squares;
        s.p.squares = (tg_squares_params){.n = n, .slice = slice};
        tg_graph_op(g, &s);
        s = tg_spec(TG_OP_ALL_REDUCE);
        s.in[0] = s.out[0] = squares;
        s.p.count.n = blocks;
        tg_graph_op(g, &s);
        s = tg_spec(TG_OP_NORM_OF_SQUARES);
        s.in[0] = squares;
    } else {
        s.in[0] = g->io.grads_all;
        s.p.count.n = n;
    }
    s.in[1] = g->io.loss_scale, s.out[0] = g->io.grad_norm;
    tg_graph_op(g, &s);

    /* The norm first: a step with a non-finite gradient is skipped, uncounted (ops.def). */
    s = tg_spec(TG_OP_SCHEDULE);
    s.in[0] = g->io.step, s.in[1] = g->io.total_steps, s.in[2] = g->io.grad_norm;
    s.out[0] = g->io.lr, s.out[1] = g->io.step;
    s.p.schedule.warmup = j->warmup_steps;
    s.p.schedule.lr = j->lr;
    s.p.schedule.form = j->lr_schedule;
    tg_graph_op(g, &s);

    const int adan = j->optimizer == TG_OPTIMIZER_ADAN;
    s = tg_spec(adan ? TG_OP_ADAN : TG_OP_ADAMW);
    s.in[0] = g->io.grads_all, s.in[1] = g->io.lr, s.in[2] = g->io.step, s.in[3] = g->io.grad_norm;
    s.in[4] = g->io.loss_scale;
    s.out[0] = g->io.params_all, s.out[1] = g->io.m_all, s.out[2] = g->io.v_all;
    /* ADAN's parameters begin with ADAMW's (plan/ops.h). */
    tg_adamw_params *a = &s.p.adamw;
    a->n = n;
    a->zero_slice = slice; /* ZeRO-1: this replica's slice only */
    a->beta1 = j->beta1, a->beta2 = j->beta2, a->eps = j->eps, a->weight_decay = j->weight_decay;
    a->max_grad_norm = j->grad_clip;
    if (adan) s.p.adan.beta3 = j->beta3, s.p.adan.no_prox = j->no_prox;
    tg_graph_op(g, &s);
    if (a->zero_slice) tg_zero_gather(g, g->io.params_all, "params.slices");
    /* After the update, which read this step's scale (GradScaler.update after step). */
    if (g->io.loss_scale >= 0) {
        s = tg_spec(TG_OP_LOSS_SCALE_UPDATE);
        s.in[0] = g->io.grad_norm, s.in[1] = g->io.loss_scale, s.in[2] = g->io.loss_scale_growth;
        s.out[0] = g->io.loss_scale, s.out[1] = g->io.loss_scale_growth;
        s.p.loss_scale.growth_factor = j->loss_scale_growth_factor;
        s.p.loss_scale.backoff_factor = j->loss_scale_backoff;
        s.p.loss_scale.growth_interval = j->loss_scale_growth_interval;
        tg_graph_op(g, &s);
    }
    /* grad_accumulation: the backward adds every micro-step's gradients (the first writer
     * does not overwrite, compile_one), so they are cleared once the window's update has
     * read them, ready for the next window (the executors open with them zeroed). */
    if (j->grad_accumulation > 1) {
        s = tg_spec(TG_OP_ZERO);
        s.out[0] = g->io.grads_all;
        tg_graph_op(g, &s);
    }
}

/* The job compiled at its seq, as one plan without buckets of its own (train records the
 * job's buckets all the same). */
static int compile_one(const tg_job *j, const tg_model_config *cfg, tg_plan *plan, tg_err *err) {
    memset(plan, 0, sizeof *plan);
    int rc = -1;
    tg_graph g;
    tg_graph_init(&g, cfg, j, err);
    if (tg_check_sizes(j, cfg, err) || check_job(j, cfg, err)) goto out;

    int loss = tg_build_forward(&g, tg_job_pad_id(j, cfg));
    if (g.failed || tg_graph_check_freeze(&g) || check_trainable(&g)) goto out;
    if (j->precision == TG_PREC_FP16) { /* the state the loss gradient's seed reads */
        g.io.loss_scale = scalar(&g, "optim.loss_scale", TG_POOL_OPTIM);
        g.io.loss_scale_growth = scalar(&g, "optim.loss_scale_growth", TG_POOL_OPTIM);
    }
    if (tg_plan_param_layout(&g) || tg_autodiff(&g, loss)) goto out;
    build_optimizer(&g);
    if (g.failed || tg_apply_precision(&g, j->precision) || tg_plan_fixed_layout(&g) ||
        tg_recompute(&g) || (j->grad_accumulation <= 1 && tg_first_gradient_writes(&g)) || tg_gather_embedding_grads(&g) ||
        tg_gradient_buckets(&g) || tg_fuse_matmul_sums(&g))
        goto out;

    int phase_begin[TG_PHASE_COUNT + 1];
    for (int p = 0, o = 0; p <= TG_PHASE_COUNT; p++) {
        while (o < g.n_ops && g.ops[o].phase < p) o++;
        phase_begin[p] = o;
    }
    /* Gradients in the activation pool: one step's values (no accumulation window). Each
     * length bucket's plan places its activations around its own holds; the gradients sit
     * at the same offsets in all of them (the start of the shared activation pool). */
    int share_grads = j->share_grad_memory && j->grad_accumulation <= 1;
    if (tg_plan_memory(&g, phase_begin, &share_grads, plan->pool_bytes, &plan->activation_live_peak)) goto out;
    plan->grads_share_activations = share_grads;

    plan->model = *cfg;
    /* An image is one row of the batch: seq 1 (the trainer's row length). */
    const int32_t seq = cfg->arch == TG_ARCH_MOBILENET_V2 ? 1 : j->seq;
    plan->train = (tg_plan_train){.task = j->task,
                                  .batch = j->batch,
                                  .seq = seq,
                                  .num_labels = j->num_labels,
                                  .pad_id = tg_job_pad_id(j, cfg),
                                  .precision = j->precision,
                                  .allow_tf32 = j->allow_tf32,
                                  .replicas = j->data_parallel,
                                  .zero_stage = j->zero_stage,
                                  .attention = j->attention,
                                  .n_buckets = j->n_buckets,
                                  .grad_accumulation = j->grad_accumulation,
                                  .loss_scale_init = j->precision == TG_PREC_FP16 ? j->loss_scale_init : 0.0f};
    memcpy(plan->train.bucket_seq, j->bucket_seq, sizeof plan->train.bucket_seq);
    if (cfg->arch == TG_ARCH_MOBILENET_V2) plan->train.bucket_seq[0] = seq;
    tg_job_run_settings(j, &plan->run);
    memcpy(plan->job_path, j->path, sizeof plan->job_path);
    memcpy(plan->phase_begin, phase_begin, sizeof phase_begin);
    plan->peak_bytes = tg_plan_pools_bytes(plan);
    /* A step of grad_accumulation micro-steps runs forward and backward that many times. */
    for (int o = 0; o < g.n_ops; o++) {
        const double times = g.ops[o].phase == TG_PHASE_OPTIMIZER ? 1.0 : (double)j->grad_accumulation;
        plan->flops_per_step += times * tg_op_flops(&g.ops[o]);
        plan->bytes_per_step += times * tg_op_bytes(g.tensors, &g.ops[o]);
    }
    plan->io = g.io;
    plan->fingerprint = tg_job_fingerprint(cfg, j, TG_VERSION_STRING);
    /* Hand the arrays over to the plan. */
    plan->n_tensors = g.n_tensors;
    plan->n_ops = g.n_ops;
    plan->tensors = g.tensors;
    plan->ops = g.ops;
    g.tensors = NULL;
    g.ops = NULL;
    rc = 0;
out:
    tg_graph_free(&g);
    if (rc) tg_plan_free(plan);
    return rc;
}

static double backward_flops(const tg_plan *p) {
    double f = 0;
    for (int o = p->phase_begin[TG_PHASE_BACKWARD]; o < p->phase_begin[TG_PHASE_OPTIMIZER]; o++)
        f += tg_op_flops(&p->ops[o]);
    return f;
}

/* What the job's freeze removed from the backward, for inspect: the job compiled again
 * without freeze, its backward phase compared with the plan's. */
static int measure_freeze_pruning(const tg_job *j, const tg_model_config *cfg, tg_plan *plan, tg_err *err) {
    tg_job open = *j;
    open.freeze[0] = 0;
    tg_plan full;
    /* It compiles whatever the frozen job compiles; it can only run out of memory, and
     * says so as the compile does. */
    if (compile_one(&open, cfg, &full, err)) return -1;
    const int ops = (full.phase_begin[TG_PHASE_OPTIMIZER] - full.phase_begin[TG_PHASE_BACKWARD]) -
                    (plan->phase_begin[TG_PHASE_OPTIMIZER] - plan->phase_begin[TG_PHASE_BACKWARD]);
    const double flops = backward_flops(&full) - backward_flops(plan);
    tg_plan_free(&full);
    /* Freezing only removes backward work (compiler/autodiff.c): neither is negative. */
    plan->freeze_pruned_ops = ops;
    plan->freeze_pruned_flops = flops;
    return 0;
}

/* What LoRA's frozen base removed from the backward, for inspect: the job compiled as a
 * full fine-tune (no LoRA, no freeze), and the backward ops of that plan whose every output
 * is the gradient of a parameter the LoRA plan freezes (the base's weight-gradient products,
 * the embedding's backward and their clears), with their FLOPs. */
static int measure_lora_pruning(const tg_job *j, const tg_model_config *cfg, tg_plan *plan, tg_err *err) {
    tg_job open = *j;
    open.lora_r = 0, open.freeze[0] = 0;
    tg_plan full;
    if (compile_one(&open, cfg, &full, err)) return -1;
    char *frozen_grad = tg_compiler_calloc((size_t)full.n_tensors + 1, 1);
    if (!frozen_grad) {
        tg_plan_free(&full);
        return tg_fail(err, "out of memory");
    }
    for (int t = 0; t < full.n_tensors; t++) {
        const tg_tensor *x = &full.tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || x->grad < 0) continue;
        /* A packed group's view (q|k|v, gate|up) goes by its first member's name. */
        const char *name = (x->flags & TG_TENSOR_VIEW) && x->master >= 0 ? full.tensors[x->master].name : x->name;
        for (int u = 0; u < plan->n_tensors; u++)
            if ((plan->tensors[u].flags & TG_TENSOR_FROZEN) && !strcmp(plan->tensors[u].name, name))
                frozen_grad[x->grad] = 1;
    }
    int ops = 0;
    double flops = 0;
    for (int o = full.phase_begin[TG_PHASE_BACKWARD]; o < full.phase_begin[TG_PHASE_OPTIMIZER]; o++) {
        const tg_op *op = &full.ops[o];
        int outs = 0, frozen = 0;
        for (int k = 0; k < TG_OP_MAX_OUT; k++)
            if (op->out[k] >= 0) outs++, frozen += frozen_grad[op->out[k]];
        if (outs && frozen == outs) ops++, flops += tg_op_flops(op);
    }
    free(frozen_grad);
    tg_plan_free(&full);
    plan->freeze_pruned_ops = ops;
    plan->freeze_pruned_flops = flops;
    return 0;
}

/* The length buckets: the job compiled again at each bucket length but the last (the
 * plan itself), each a complete plan whose settings, io and fingerprint are the plan's but
 * for seq; then one set of pools, every pool as large as the largest bucket needs it, and
 * the identity rules of plan.h checked on the result. */
static int compile_buckets(const tg_job *j, const tg_model_config *cfg, tg_plan *plan, tg_err *err) {
    const int n = j->n_buckets - 1;
    plan->buckets = tg_calloc((size_t)n, sizeof *plan->buckets);
    if (!plan->buckets) return tg_fail(err, "%s: out of memory for %d bucket plans", j->path, n);
    tg_job *bj = tg_malloc(sizeof *bj);
    if (!bj) return tg_fail(err, "%s: out of memory", j->path);
    int rc = 0;
    for (int k = 0; k < n; k++) { /* a failed bucket breaks out */
        *bj = *j;
        bj->seq = j->bucket_seq[k];
        tg_plan *b = &plan->buckets[k];
        if (compile_one(bj, cfg, b, err)) {
            char where[TG_PATH_MAX + 32];
            rc = tg_fail_context(err, "%s: key 'seq_buckets': bucket %d (seq %d)",
                                 tg_job_where(j, TG_JOB_SEQ_BUCKETS, where, sizeof where), k, bj->seq);
            break;
        }
        b->train = plan->train;
        b->train.seq = j->bucket_seq[k];
        b->fingerprint = plan->fingerprint;
    }
    free(bj);
    if (rc) return -1;
    uint64_t pools[TG_POOL_COUNT];
    memcpy(pools, plan->pool_bytes, sizeof pools);
    for (int k = 0; k < n; k++)
        for (int q = 0; q < TG_POOL_COUNT; q++)
            if (plan->buckets[k].pool_bytes[q] > pools[q]) pools[q] = plan->buckets[k].pool_bytes[q];
    for (int k = 0; k <= n; k++) {
        tg_plan *b = k < n ? &plan->buckets[k] : plan;
        memcpy(b->pool_bytes, pools, sizeof pools);
        b->peak_bytes = tg_plan_pools_bytes(b);
    }
    if (tg_plan_validate_buckets(plan, j->path, err)) /* GCOVR_EXCL_BR_LINE: a self-check: the bucket plans come from one compiler and take the pools set just above */
        return tg_fail_context(err, "internal error: the bucket plans do not share the plan's tensors and layout");
    return 0;
}

/* The plan's memory estimate on one GPU (what memory_limit bounds). */
static uint64_t gpu_estimate(const tg_plan *p) {
    tg_memory_estimate est;
    tg_estimate_memory(p, TG_MEM_DEVICE_CUDA, &est);
    return est.total;
}

/* Whether the plan passes the job's memory_limit, else the device's free memory (or the
 * job has neither). */
static int within_limit(const tg_job *j, const tg_plan *p) {
    const uint64_t limit = j->memory_limit ? j->memory_limit : j->memory_available;
    return !limit || gpu_estimate(p) <= limit;
}

/* The job compiled whole: at its seq, then, with length buckets, at each other length with
 * one set of pools. */
static int compile_full(const tg_job *j, const tg_model_config *cfg, tg_plan *plan, tg_err *err) {
    if (compile_one(j, cfg, plan, err)) return -1;
    if (j->n_buckets > 1 && compile_buckets(j, cfg, plan, err)) {
        tg_plan_free(plan);
        return -1;
    }
    return 0;
}

/* The GPU estimate of the job compiled with recompute `mode` (every layer for layers) and
 * no limit; 0 when that does not compile. */
static uint64_t estimate_with(const tg_job *j, const tg_model_config *cfg, int mode) {
    tg_job g = *j;
    g.recompute = mode, g.recompute_layers = 0, g.memory_limit = 0;
    tg_plan q;
    tg_err ignored;
    if (compile_full(&g, cfg, &q, &ignored)) return 0;
    const uint64_t need = gpu_estimate(&q);
    tg_plan_free(&q);
    return need;
}

/* memory_limit: a plan whose estimate on one GPU passes it is refused, naming both and
 * what the recompute modes past the job's would need (recompute = auto has tried them all:
 * it says so). */
static int check_memory_limit(const tg_job *job, const tg_job *j, const tg_model_config *cfg, const tg_plan *p,
                              tg_err *err) {
    tg_memory_estimate est;
    tg_estimate_memory(p, TG_MEM_DEVICE_CUDA, &est);
    if (!j->memory_limit || est.total <= j->memory_limit) return 0;
    char where[TG_PATH_MAX + 32], a[32], b[32], parts[512], how[96] = "", also[160] = "", c[32], d[32];
    if (job->recompute == TG_RECOMPUTE_AUTO) {
        snprintf(how, sizeof how, " with every layer recomputed (recompute = auto tried none, gelu and layers)");
    } else if (j->recompute == TG_RECOMPUTE_NONE || j->recompute == TG_RECOMPUTE_GELU) {
        /* gelu where the job has none and it needs less (a model without GELUs gains nothing). */
        uint64_t gelu = j->recompute == TG_RECOMPUTE_NONE ? estimate_with(j, cfg, TG_RECOMPUTE_GELU) : 0;
        if (gelu >= est.total) gelu = 0;
        const uint64_t layers = estimate_with(j, cfg, TG_RECOMPUTE_LAYERS);
        if (gelu && layers)
            snprintf(also, sizeof also, "; recompute = gelu would need %s, recompute = layers %s",
                     tg_mem_format_bytes(gelu, c, sizeof c), tg_mem_format_bytes(layers, d, sizeof d));
        else if (layers)
            snprintf(also, sizeof also, "; recompute = layers would need %s", tg_mem_format_bytes(layers, d, sizeof d));
    }
    return tg_fail(err, "%s: key 'memory_limit': the plan needs %s on one GPU (%s)%s, more than the limit of %s%s",
                   tg_job_where(j, TG_JOB_MEMORY_LIMIT, where, sizeof where), tg_mem_format_bytes(est.total, a, sizeof a),
                   tg_memory_estimate_parts(&est, -1, parts, sizeof parts), how,
                   tg_mem_format_bytes(j->memory_limit, b, sizeof b), also);
}

/* Whether the plan recomputes anything: a backward op writes a recomputed copy. */
static int recomputes(const tg_plan *p) {
    for (int o = p->phase_begin[TG_PHASE_BACKWARD]; o < p->phase_begin[TG_PHASE_OPTIMIZER]; o++)
        for (int k = 0; k < TG_OP_MAX_OUT; k++)
            if (p->ops[o].out[k] >= 0 && tg_name_is_recomputed(p->tensors[p->ops[o].out[k]].name)) return 1;
    return 0;
}

/* recompute = auto with a memory_limit the plan without recomputation passes not (*plan,
 * compiled so): the GELU outputs, then every layer, then, where that passes, the fewest
 * layers from the first that still pass (a bisection: fewer layers recomputed never need
 * less). *plan is the last plan tried that passes, or the one recomputing every layer when
 * none does; *chosen its settings. */
static int escalate(tg_job *chosen, const tg_model_config *cfg, tg_plan *plan, tg_err *err) {
    tg_plan_free(plan);
    chosen->recompute = TG_RECOMPUTE_GELU;
    if (compile_full(chosen, cfg, plan, err)) return -1;
    if (within_limit(chosen, plan)) return 0;
    tg_plan_free(plan);
    const int layers = cfg->layers;
    chosen->recompute = TG_RECOMPUTE_LAYERS, chosen->recompute_layers = 0;
    if (compile_full(chosen, cfg, plan, err)) return -1;
    if (!within_limit(chosen, plan)) return 0;
    int lo = 1, hi = layers; /* hi layers pass: *plan */
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        tg_job trial = *chosen;
        trial.recompute_layers = mid;
        tg_plan q;
        if (compile_full(&trial, cfg, &q, err)) return -1;
        if (within_limit(&trial, &q)) {
            tg_plan_free(plan);
            *plan = q, hi = mid;
            chosen->recompute_layers = mid < layers ? mid : 0;
        } else {
            tg_plan_free(&q);
            lo = mid + 1;
        }
    }
    return 0;
}

int tg_compile_with_config(const tg_job *job, const tg_model_config *cfg, tg_plan *plan, tg_err *err) {
    /* Image models: the job's image_channels, image_size and width_mult over the config's;
     * the plan's model config (and its fingerprint) holds the values compiled. */
    tg_model_config image_cfg = *cfg;
    if (cfg->arch == TG_ARCH_MOBILENET_V2) {
        if (job->image_channels) image_cfg.image_channels = job->image_channels;
        if (job->image_size) image_cfg.image_size = job->image_size;
        if (job->width_mult > 0.0f) image_cfg.width_mult = job->width_mult;
        for (int c = 0; c < 3; c++) {
            image_cfg.image_mean[c] = c < image_cfg.image_channels ? (job->n_image_mean ? job->image_mean[c] : 0.5f) : 0;
            image_cfg.image_std[c] = c < image_cfg.image_channels ? (job->n_image_std ? job->image_std[c] : 0.5f) : 0;
        }
        cfg = &image_cfg;
    }
    /* recompute = auto: nothing recomputed unless memory_limit needs it. */
    tg_job chosen = *job;
    const tg_job *j = &chosen;
    const int automatic = job->recompute == TG_RECOMPUTE_AUTO;
    if (automatic) chosen.recompute = TG_RECOMPUTE_NONE, chosen.recompute_layers = 0;
    if (compile_full(j, cfg, plan, err)) return -1;
    uint64_t peak_without = plan->peak_bytes;
    if (automatic && !within_limit(j, plan) && escalate(&chosen, cfg, plan, err)) return -1;
    /* What the plan would need without recomputation, for inspect. */
    if (!recomputes(plan)) {
        peak_without = 0;
    } else if (!automatic) {
        tg_job none = chosen;
        none.recompute = TG_RECOMPUTE_NONE, none.recompute_layers = 0, none.memory_limit = 0;
        tg_plan q;
        if (compile_full(&none, cfg, &q, err)) {
            tg_plan_free(plan);
            return -1;
        }
        peak_without = q.peak_bytes;
        tg_plan_free(&q);
    }
    if (j->lora_r > 0 ? measure_lora_pruning(j, cfg, plan, err) : j->freeze[0] && measure_freeze_pruning(j, cfg, plan, err)) {
        tg_plan_free(plan);
        return -1;
    }
    if (check_memory_limit(job, j, cfg, plan, err)) {
        tg_plan_free(plan);
        return -1;
    }
    /* The fingerprint is the job's as written (recompute = auto, not what it chose). */
    plan->fingerprint = tg_job_fingerprint(cfg, job, TG_VERSION_STRING);
    plan->peak_bytes_without_recompute = peak_without;
    for (int k = 0; plan->buckets && k + 1 < plan->train.n_buckets; k++) {
        plan->buckets[k].fingerprint = plan->fingerprint;
        plan->buckets[k].peak_bytes_without_recompute = peak_without;
    }
    return 0;
}

int tg_compile(const tg_job *job, tg_plan *plan, tg_err *err) {
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (tg_model_config_load(job->model, &cfg, err)) {
        char where[TG_PATH_MAX + 32];
        return tg_fail_context(err, "%s: key 'model'", tg_job_where(job, TG_JOB_MODEL, where, sizeof where));
    }
    return tg_compile_with_config(job, &cfg, plan, err);
}
