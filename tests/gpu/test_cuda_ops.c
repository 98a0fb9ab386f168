/* Every CUDA kernel against the CPU reference: each op of several compiled plans runs
 * alone on both executors from the same fresh random inputs. Overwritten outputs are
 * poisoned with NaN first (an unwritten element fails), accumulated outputs start from the
 * same random values. fp32 tolerance: 1e-5 relative (L2); with a bf16 slot 2e-2, with an
 * fp16 (IEEE half) slot 5e-3 (why: at check_plan_ops); ops that only move, mask or select
 * values must match bit for bit. NaN never passes (tg_rel_err). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "kernels/cudnn_attention.h"
#include "models/model_config.h"
#include "base/bf16.h"
#include "base/f16.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/executor.h"
#include "tests/harness.h"

static uint64_t rng;
static uint32_t next_u32(void) { return tg_test_rand(&rng); }
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u32() >> 8) * (1.0f / 16777216.0f); }

static int exact_op(int kind) {
    switch (kind) {
    case TG_OP_ZERO: case TG_OP_FILL: case TG_OP_EMBEDDING: case TG_OP_ADD: case TG_OP_DROPOUT:
    case TG_OP_HEADS_SPLIT: case TG_OP_HEADS_MERGE: case TG_OP_SELECT_TOKEN: case TG_OP_SELECT_TOKEN_BWD:
    case TG_OP_SCHEDULE: case TG_OP_MLM_MASK: case TG_OP_IMAGE_INPUT:
        return 1;
    default:
        return 0;
    }
}

static void randomize_f32(const tg_plan *p, int t, void *host);

/* Set: a causal plan's key mask keeps every key. cuDNN leaves a causal op's key mask out
 * (a step's mask is ones then zeros, so causality hides the padding from real rows), so
 * alone, with random dout on every row, the op matches the reference only without padding;
 * test_gpu_step_llama_cudnn_padded_matches_own checks whole padded steps. */
static int g_causal_keys_kept;

static int plan_is_causal(const tg_plan *p) {
    for (int o = 0; o < p->n_ops; o++)
        if (p->ops[o].kind == TG_OP_ATTENTION) return p->ops[o].p.attention.causal != 0;
    return 0;
}

/* Random contents that are valid for the tensor's role, in its storage type (bf16 and
 * half: the fp32 values rounded to nearest even, as the plan stores them). */
static void randomize(const tg_plan *p, int t, void *host) {
    const tg_tensor *x = &p->tensors[t];
    if (x->dtype != TG_BF16 && x->dtype != TG_F16) {
        randomize_f32(p, t, host);
        return;
    }
    int64_t n = tg_tensor_numel(x);
    float *wide = malloc(sizeof(float) * (size_t)n);
    randomize_f32(p, t, wide);
    if (x->dtype == TG_F16) tg_f16_narrow(host, wide, n);
    else tg_bf16_narrow(host, wide, n);
    free(wide);
}

static void randomize_f32(const tg_plan *p, int t, void *host) {
    const tg_tensor *x = &p->tensors[t];
    const tg_plan_io *io = &p->io;
    int64_t n = tg_tensor_numel(x);
    int32_t *iv = host;
    float *fv = host;
    if (t == io->input_ids)
        for (int64_t i = 0; i < n; i++) iv[i] = (int32_t)(next_u32() % (uint32_t)p->model.vocab_size);
    else if (t == io->position_ids)
        for (int64_t i = 0; i < n; i++) iv[i] = (int32_t)(next_u32() % (uint32_t)p->train.seq);
    else if (t == io->token_type_ids)
        for (int64_t i = 0; i < n; i++) iv[i] = (int32_t)(next_u32() % (uint32_t)(p->model.type_vocab_size));
    else if (t == io->labels && p->train.task == TG_TASK_QA) {
        /* Answer positions: mostly inside [0, T), some below 0 (clamped to 0), at or past T and
         * the padding rows' TG_SPAN_NONE (ignored). */
        const uint32_t T = (uint32_t)p->train.seq;
        for (int64_t i = 0; i < n; i++)
            iv[i] = next_u32() % 7 == 0 ? TG_SPAN_NONE : (int32_t)(next_u32() % (T + 6)) - 3;
    } else if (t == io->labels) {
        int classes = p->train.task == TG_TASK_LM ? p->model.vocab_size : p->train.num_labels;
        for (int64_t i = 0; i < n; i++) iv[i] = next_u32() % 5 == 0 ? TG_IGNORE_INDEX : (int32_t)(next_u32() % (uint32_t)classes);
    } else if (t == io->attention_mask)
        for (int64_t i = 0; i < n; i++)
            fv[i] = (i % p->train.seq == 0 || (g_causal_keys_kept && plan_is_causal(p)) || next_u32() % 4) ? 1.0f : 0.0f;
    else if (t == io->mlm_stream)
        /* A batch's masking stream: any step, first element and seed. */
        for (int64_t i = 0; i < n; i++) iv[i] = (int32_t)next_u32();
    else if (t == io->loss_norm)
        /* A window's counts (grad_accumulation): positive, or 0 for a side that falls back
         * to its own count. */
        for (int64_t i = 0; i < n; i++) fv[i] = next_u32() % 3 == 0 ? 0.0f : (float)(1 + next_u32() % 12);
    else if (t == io->step)
        fv[0] = (float)(1 + next_u32() % 50); /* AdamW bias correction needs t >= 1 */
    else if (t == io->total_steps)
        fv[0] = 60.0f;
    else if (t == io->lr)
        fv[0] = 1e-3f;
    else if (t == io->grad_norm)
        fv[0] = uniform(0.5f, 3.0f);
    else if (t == io->loss_scale)
        fv[0] = ldexpf(1.0f, (int)(next_u32() % 24)); /* a power of two, as the plan keeps it */
    else if (t == io->loss_scale_growth)
        fv[0] = next_u32() % 2 ? 1999.0f : (float)(next_u32() % 1999); /* growing at the interval, or counting */
    else if (t == io->v_all)
        for (int64_t i = 0; i < n; i++) fv[i] = uniform(0.0f, 1e-4f);
    else if (!strcmp(x->name, "grad_squares")) /* sums of squares (ZeRO-1's norm from the shards) */
        for (int64_t i = 0; i < n; i++) fv[i] = uniform(0.0f, 1.0f);
    else if (strstr(x->name, ".stats")) /* a batch norm's means, then its variances */
        for (int64_t i = 0; i < n; i++) fv[i] = i < n / 2 ? uniform(-1.0f, 1.0f) : uniform(0.05f, 2.0f);
    else if (strstr(x->name, ".running_var"))
        for (int64_t i = 0; i < n; i++) fv[i] = uniform(0.05f, 2.0f);
    else if (strstr(x->name, ".rstd"))
        for (int64_t i = 0; i < n; i++) fv[i] = uniform(0.5f, 2.0f);
    else if (x->dtype == TG_I32)
        memset(host, 0, x->bytes);
    else if (x->dtype == TG_U8) /* an image batch's stored pixels (IMAGE_INPUT's in0) */
        for (int64_t i = 0; i < n; i++) ((uint8_t *)host)[i] = (uint8_t)(next_u32() >> 24);
    else
        for (int64_t i = 0; i < n; i++) fv[i] = uniform(-1.0f, 1.0f);
}

static int is_accumulated(const tg_op *op, int slot) {
    switch (op->kind) {
    case TG_OP_EMBEDDING_BWD: return slot == 0;
    case TG_OP_BIAS_GRAD: return slot == 0 && !op->p.bias_grad.overwrite;
    case TG_OP_LAYERNORM_BWD: return slot >= 1 && !op->p.layernorm_bwd.overwrite;
    case TG_OP_RESIDUAL_LAYERNORM_BWD: return slot >= 2 && !op->p.residual_layernorm_bwd.overwrite;
    case TG_OP_RMSNORM_BWD: return slot == 1; /* dgamma is added into */
    case TG_OP_CONV2D_BWD: return slot >= 1 && !op->p.conv2d_bwd.overwrite;
    case TG_OP_BATCHNORM_BWD: return slot >= 1 && !op->p.batchnorm_bwd.overwrite;
    case TG_OP_BATCHNORM: return slot >= 2; /* the running statistics, in place */
    case TG_OP_MATMUL: return slot == 0 && op->p.matmul.accumulate != 0; /* out1 (a fused bias gradient) is written */
    case TG_OP_SCHEDULE: return slot == 1;
    case TG_OP_ADAMW:
    case TG_OP_ADAN: return 1; /* updated in place */
    case TG_OP_ALL_REDUCE:
    case TG_OP_REDUCE_SCATTER: return 1; /* in place */
    case TG_OP_ALL_GATHER: return 1; /* in place */
    case TG_OP_LOSS_SCALE_UPDATE: return 1; /* the scale and its tracker, in place */
    default: return 0;
    }
}

static int tensor_in_slots(const int *slots, int n, int t) {
    for (int s = 0; s < n; s++)
        if (slots[s] == t) return 1;
    return 0;
}

/* MATMUL's GELU epilogues met by check_plan_ops, by activation (1, 2): op-by-op
 * comparisons, and the GEMM cache entries that say how they ran (as the cuBLASLt epilogue
 * or as the fallback product plus GELU kernel). */
typedef struct act_seen {
    int ops[3];
    int epilogue[3], fallback[3];
} act_seen;

static act_seen g_act;

/* Attention ops the executors of check_plan_ops gave to cuDNN (kernels/cudnn_attention.h). */
static int g_cudnn_taken, g_cudnn_eligible;

/* The attention backend the executors open (TUNEGRAPH_ATTENTION): the tests of every op
 * check the own kernels; test_gpu_attention_cudnn_matches_cpu checks cuDNN's graphs. */
static void attention_backend(const char *which) { setenv("TUNEGRAPH_ATTENTION", which, 1); }

/* Set: the plan's first gradient writers are turned back into accumulating ones (MATMUL
 * accumulate, BIAS_GRAD's and the LayerNorm backwards' overwrite), so both forms of each op run. */
static int g_accumulate_gradients;
static int g_adan; /* plans with optimizer = adan (ADAN in place of ADAMW) */
static int g_state_bf16; /* plans with optimizer_state = bf16 (moments rounded stochastically) */

/* With g_data_parallel > 1: ZeRO-1 plans, run as replica g_zero_rank. As replica 0 the
 * one-GPU communicator gathers (the slice it holds already); as another replica both sides
 * run without a communicator (no sum, no gather), so that the AdamW of a slice that does
 * not start at element 0 is compared. */
static int g_zero, g_zero_rank;

static void accumulate_gradients(tg_plan *p) {
    for (int o = 0; o < p->n_ops; o++) {
        tg_op *op = &p->ops[o];
        if (op->kind == TG_OP_LAYERNORM_BWD) op->p.layernorm_bwd.overwrite = 0;
        if (op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD) op->p.residual_layernorm_bwd.overwrite = 0;
        if (op->kind == TG_OP_BIAS_GRAD) op->p.bias_grad.overwrite = 0;
        if (op->kind == TG_OP_CONV2D_BWD) op->p.conv2d_bwd.overwrite = 0;
        if (op->kind == TG_OP_BATCHNORM_BWD) op->p.batchnorm_bwd.overwrite = 0;
        if (op->kind == TG_OP_MATMUL && !op->p.matmul.activation && p->tensors[op->out[0]].pool == TG_POOL_GRADS)
            op->p.matmul.accumulate = 1;
    }
}

/* fp16 plans' fp32 ops alone (the scaled loss seed, the unscaled norm and update, the
 * loss-scale update; the update ops without their half weight copies), beside the fp32 and
 * bf16 plans; test_gpu_ops_match_cpu_fp16 runs every op of fp16 plans. */
static int g_f32_ops_only;

/* 0: the ops run in eval mode on both executors (batch norms normalise with their running
 * statistics and leave them as they are; dropout is the identity). */
static int g_training = 1;

static int has_f16_slot(const tg_plan *p, const tg_op *op) {
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (op->in[s] >= 0 && p->tensors[op->in[s]].dtype == TG_F16) return 1;
    for (int s = 0; s < TG_OP_MAX_OUT; s++)
        if (op->out[s] >= 0 && p->tensors[op->out[s]].dtype == TG_F16) return 1;
    return 0;
}

static void check_plan_ops(const char *what, const tg_job *job, const tg_model_config *cfg, int *kinds_seen) {
    tg_plan p;
    tg_err err;
    REQUIRE(tg_compile_with_config(job, cfg, &p, &err) == 0, "%s: %s", what, err.msg);
    if (g_accumulate_gradients) accumulate_gradients(&p);
    for (int o = 0; g_f32_ops_only && o < p.n_ops; o++)
        if (tg_op_is_update(p.ops[o].kind)) p.ops[o].out[3] = -1;
    tg_cpu_exec cpu;
    tg_cuda_exec gpu;
    REQUIRE(tg_cpu_exec_init(&cpu, &p, 0, &err) == 0, "%s", err.msg);
    void *nccl = NULL; /* data-parallel plans: a communicator of this GPU alone */
    if (p.train.replicas > 1 && !CHECK(tg_cuda_comms_create(&nccl, 1, &err) == 0, "%s: %s", what, err.msg)) {
        tg_cpu_exec_free(&cpu);
        tg_plan_free(&p);
        return;
    }
    if (!CHECK(tg_cuda_exec_init_on(&gpu, &p, job->seed, 0, nccl, &err) == 0, "%s", err.msg)) {
        if (nccl) tg_cuda_comms_destroy(&nccl, 1);
        tg_cpu_exec_free(&cpu);
        tg_plan_free(&p);
        return;
    }
    cpu.seed = job->seed;
    cpu.training = g_training;
    if (g_zero_rank) cpu.rank = gpu.ctx.rank = g_zero_rank, gpu.ctx.nccl_comm = NULL;
    int failures = 0;
    for (int o = 0; o < p.n_ops && failures < 5; o++) {
        const tg_op *op = &p.ops[o];
        if (g_f32_ops_only && has_f16_slot(&p, op)) continue;
        kinds_seen[op->kind]++;
        if (op->kind == TG_OP_MATMUL && op->p.matmul.activation > 0 && op->p.matmul.activation < 3)
            g_act.ops[op->p.matmul.activation]++;
        /* Inputs and accumulated outputs: fresh random values, the same on both sides. */
        int ok = 1;
        for (int s = 0; s < TG_OP_MAX_IN + TG_OP_MAX_OUT; s++) {
            int out = s >= TG_OP_MAX_IN, slot = out ? s - TG_OP_MAX_IN : s;
            int t = out ? op->out[slot] : op->in[slot];
            if (t < 0) continue;
            void *host = tg_cpu_tensor(&cpu, t);
            if (!out || is_accumulated(op, slot)) {
                if (out && tensor_in_slots(op->in, TG_OP_MAX_IN, t)) continue; /* aliased: already set */
                randomize(&p, t, host);
            } else {
                memset(host, 0xff, p.tensors[t].bytes); /* NaN */
            }
            ok &= tg_cuda_upload(&gpu, t, host, &err) == 0;
        }
        if (!CHECK(ok, "%s: upload: %s", what, err.msg)) break;
        if (!CHECK(tg_cuda_exec_range(&gpu, o, o + 1, g_training, &err) == 0, "%s: %s", what, err.msg) ||
            !CHECK(tg_cuda_sync(&gpu, &err) == 0, "%s: op %d (%s): %s", what, o, tg_op_name(op->kind), err.msg))
            break;
        if (!CHECK(tg_cpu_exec_range(&cpu, o, o + 1, &err) == 0, "%s", err.msg)) break;
        for (int slot = 0; slot < TG_OP_MAX_OUT; slot++) {
            int t = op->out[slot];
            if (t < 0) continue;
            const tg_tensor *x = &p.tensors[t];
            void *got = malloc(x->bytes);
            if (!CHECK(got && tg_cuda_download(&gpu, t, got, &err) == 0, "%s", err.msg)) {
                free(got);
                continue;
            }
            const void *want = tg_cpu_tensor(&cpu, t);
            int64_t n = tg_tensor_numel(x);
            if (exact_op(op->kind) || x->dtype == TG_I32) {
                int same = memcmp(got, want, x->bytes) == 0;
                failures += !CHECK(same, "%s: op %d %s output %s differs from the CPU bit for bit", what, o,
                                   tg_op_name(op->kind), x->name);
            } else {
                /* fp32 kernels within 1e-5; with any bf16 slot, within 2e-2; with any half
                 * slot (and none bf16), within 5e-3. The half kernels round where the bf16
                 * ones do (the stored outputs, the fused attention's P and dS before their
                 * tensor-core products) and the CPU rounds only what the plan stores, so
                 * the differences are those roundings' at half's unit roundoff, 2^-11,
                 * 8 times smaller than bf16's 2^-8: 2e-2 / 8 = 2.5e-3, and 5e-3 keeps a
                 * factor 2 of margin (still 20 times looser than fp32's 1e-5 would be). */
                int low = x->dtype == TG_BF16, half = x->dtype == TG_F16;
                for (int s2 = 0; s2 < TG_OP_MAX_IN; s2++) {
                    low |= op->in[s2] >= 0 && p.tensors[op->in[s2]].dtype == TG_BF16;
                    half |= op->in[s2] >= 0 && p.tensors[op->in[s2]].dtype == TG_F16;
                }
                double tol = low ? 2e-2 : half ? 5e-3 : 1e-5, rel;
                if (x->dtype == TG_BF16 || x->dtype == TG_F16) {
                    float *g32 = malloc(sizeof(float) * (size_t)n), *w32 = malloc(sizeof(float) * (size_t)n);
                    if (x->dtype == TG_F16) {
                        tg_f16_widen(g32, got, n);
                        tg_f16_widen(w32, want, n);
                    } else {
                        tg_bf16_widen(g32, got, n);
                        tg_bf16_widen(w32, want, n);
                    }
                    rel = tg_rel_err(g32, w32, n);
                    free(g32), free(w32);
                } else {
                    rel = tg_rel_err(got, want, n);
                }
                failures += !CHECK(rel <= tol, "%s: op %d %s output %s: relative error %.3g > %g", what, o,
                                   tg_op_name(op->kind), x->name, rel, tol);
            }
            free(got);
        }
    }
    g_cudnn_taken += tg_cudnn_attention_taken((const tg_cudnn_attention *)gpu.ctx.cudnn);
    for (int o = 0; o < p.n_ops; o++) {
        const tg_op *op = &p.ops[o];
        const int q = op->kind == TG_OP_ATTENTION ? op->in[0] : op->kind == TG_OP_ATTENTION_BWD ? op->in[5] : -1;
        g_cudnn_eligible += q >= 0 && tg_cudnn_attention_eligible(op, p.tensors[q].dtype);
    }
    for (int act = 1; act < 3; act++) {
        g_act.epilogue[act] += tg_gemm_cache_act_entries(gpu.ctx.gemm_cache, act, 0);
        g_act.fallback[act] += tg_gemm_cache_act_entries(gpu.ctx.gemm_cache, act, 1);
    }
    tg_cuda_exec_free(&gpu);
    if (nccl) tg_cuda_comms_destroy(&nccl, 1);
    tg_cpu_exec_free(&cpu);
    tg_plan_free(&p);
}

static void base_job(tg_job *job, const char *model, int task, int batch, int seq, uint64_t seed) {
    tg_job_defaults(job);
    snprintf(job->model, sizeof job->model, "%s", model);
    job->task = task, job->batch = batch, job->seq = seq, job->steps = 10, job->seed = seed;
    job->num_labels = 3, job->warmup_steps = 5;
}

/* Fresh inputs every run, replayable with TG_TEST_SEED. */
static uint64_t test_seed(uint64_t offset) {
    uint64_t seed = getenv("TG_TEST_SEED") ? strtoull(getenv("TG_TEST_SEED"), NULL, 10) : (uint64_t)time(NULL) + offset;
    printf("    random inputs from TG_TEST_SEED=%llu\n", (unsigned long long)seed);
    rng = seed * 0x9E3779B97F4A7C15ull | 1;
    return seed;
}

/* Plans of this many data-parallel replicas (their ALL_REDUCE runs through a one-GPU NCCL
 * communicator: the sum over one replica, by NCCL inside the executor's stream). */
static int g_data_parallel = 1;

/* Micro-batches a step of the plans checked (job key grad_accumulation; 1: none). */
static int g_grad_accumulation = 1;

/* BERT plans with query, key and value as three products (`fuse_qkv = false`): the fused
 * attention then reads three [B*T, D] tensors instead of one packed [B*T, 3D]. */
static int g_separate_qkv;
static int g_recompute; /* plans with recompute = gelu (GELU_BWD's out2, the GELU op in the backward) */
static int g_kv_heads;  /* Llama plans: the kv heads (0: the preset's) */
static int g_lora_r;    /* Llama plans: LoRA's rank on every projection (0: none) */
static int g_no_attention_dropout; /* the config's attention dropout set to 0 */

/* A preset's plan at a precision; `wide` widens tiny-gpt2 past the presets' sizes:
 * multi-block rows, a GPT-2-sized vocabulary for the cross-entropy (padded LM head) and
 * the embedding gradient, an odd sequence length. hidden/heads (0: the preset's) reshape
 * the attention heads; `attention` picks fused or unfused attention (and with it fused or
 * separate bias gradients and residual LayerNorms). BERT's q/k/v projections are one
 * packed product unless g_separate_qkv is set. */
static void check_shape(const char *what, const char *preset, int task, int batch, int seq, uint64_t seed,
                        int precision, int wide, int hidden, int heads, int attention, int *kinds_seen) {
    /* The unfused-attention plans also keep separate bias gradients and the residual
     * add, dropout and LayerNorm as separate ops, so those stay covered next to the
     * fused forms. */
    const int fuse_bias_grad = attention == TG_ATTENTION_FUSED;
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    REQUIRE(tg_model_config_load(preset, &cfg, &err) == 0, "%s", err.msg);
    if (wide) cfg.vocab_size = 50257, cfg.hidden = 96, cfg.heads = 6, cfg.intermediate = 384, cfg.max_positions = 128;
    if (hidden) cfg.hidden = hidden, cfg.heads = heads, cfg.intermediate = 2 * hidden;
    if (cfg.arch == TG_ARCH_LLAMA) cfg.kv_heads = g_kv_heads ? g_kv_heads : cfg.kv_heads > cfg.heads ? cfg.heads : cfg.kv_heads;
    if (cfg.max_positions < seq) cfg.max_positions = seq;
    if (g_no_attention_dropout) cfg.attention_dropout = 0.0f;
    base_job(&job, preset, task, batch, seq, seed);
    job.precision = precision;
    job.attention = attention;
    job.fuse_bias_grad = fuse_bias_grad;
    job.fuse_residual_layernorm = fuse_bias_grad;
    job.fuse_qkv = !g_separate_qkv;
    job.data_parallel = g_data_parallel;
    job.grad_accumulation = g_grad_accumulation;
    job.zero_stage = g_zero;
    job.recompute = g_recompute;
    if (g_adan) job.optimizer = TG_OPTIMIZER_ADAN, job.beta1 = 0.98f, job.beta2 = 0.92f, job.no_prox = g_adan > 1;
    if (g_state_bf16) job.optimizer_state = TG_OPTIMIZER_STATE_BF16;
    if (g_lora_r) {
        job.lora_r = g_lora_r, job.lora_dropout = 0.1f;
        snprintf(job.lora_targets, sizeof job.lora_targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    }
    if (task == TG_TASK_CLASSIFY && cfg.pad_token_id < 0) job.pad_token_id = 0;
    job.num_labels = task == TG_TASK_CLASSIFY && wide ? 2 : job.num_labels;
    check_plan_ops(what, &job, &cfg, kinds_seen);
}

static void check_preset(const char *what, const char *preset, int task, int batch, int seq, uint64_t seed,
                         int precision, int wide, int *kinds_seen) {
    check_shape(what, preset, task, batch, seq, seed, precision, wide, 0, 0, TG_ATTENTION_FUSED, kinds_seen);
}

/* The packed q|k|v product (the default, checked by every BERT plan above) next to three
 * separate ones: the same layers with fused attention (three inputs), with unfused
 * attention (three single-part head splits), and at a head dim without 16-byte rows. */
static void check_data_parallel_plan(int precision, uint64_t seed, int *kinds_seen) {
    g_data_parallel = 2;
    check_shape("tiny-bert, 2 data-parallel replicas", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed + 31, precision, 0, 0,
                0, TG_ATTENTION_FUSED, kinds_seen);
    g_zero = 1;
    for (g_zero_rank = 0; g_zero_rank < 2; g_zero_rank++)
        check_shape(g_zero_rank ? "tiny-gpt2, ZeRO-1, replica 1 of 2" : "tiny-gpt2, ZeRO-1, replica 0 of 2", "tiny-gpt2",
                    TG_TASK_LM, 2, 24, seed + 32, precision, 0, 0, 0, TG_ATTENTION_FUSED, kinds_seen);
    g_zero = g_zero_rank = 0;
    g_data_parallel = 1;
}

/* Adan in place of AdamW: one replica (the reference's decay after the step, then before
 * it), and ZeRO-1 replica 1 of 2, whose slice and state do not start at element 0. */
/* recompute = gelu: the GELU backward writing the GELU output again, in its bias-column
 * kernel (fused attention plans keep the fused bias gradients) and in its plain one
 * (unfused plans keep them apart), and the GPT-2 epilogue's copy by a GELU op. */
static void check_recompute_plans(int precision, uint64_t seed, int *kinds_seen) {
    g_recompute = TG_RECOMPUTE_GELU;
    check_shape("tiny-bert, recompute gelu", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed + 41, precision, 0, 0, 0,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("tiny-bert unfused, recompute gelu", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed + 42, precision, 0, 0,
                0, TG_ATTENTION_UNFUSED, kinds_seen);
    check_shape("gpt2-wide lm, recompute gelu", "tiny-gpt2", TG_TASK_LM, 2, 40, seed + 43, precision, 1, 0, 0,
                TG_ATTENTION_FUSED, kinds_seen);
    g_recompute = TG_RECOMPUTE_NONE;
}

static void check_adan_plans(int precision, uint64_t seed, int *kinds_seen) {
    for (g_adan = 1; g_adan <= 2; g_adan++)
        check_shape(g_adan == 1 ? "tiny-bert adan" : "tiny-bert adan no_prox", "tiny-bert", TG_TASK_CLASSIFY, 3, 24,
                    seed + 51 + g_adan, precision, 0, 0, 0, TG_ATTENTION_FUSED, kinds_seen);
    g_adan = 1;
    g_data_parallel = 2, g_zero = 1, g_zero_rank = 1;
    check_shape("tiny-gpt2 adan, ZeRO-1, replica 1 of 2", "tiny-gpt2", TG_TASK_LM, 2, 24, seed + 54, precision, 0, 0,
                0, TG_ATTENTION_FUSED, kinds_seen);
    g_data_parallel = 1, g_zero = g_zero_rank = 0;
    g_adan = 0;
}

/* optimizer_state = bf16: AdamW's and Adan's moments stored in bf16 with the stochastic
 * rounding's draws, bit for bit with the CPU (one plan per optimizer, and a ZeRO-1 slice
 * that starts past element 0, whose draws are those of the parameters' own elements). */
static void check_state_bf16_plans(int precision, uint64_t seed, int *kinds_seen) {
    g_state_bf16 = 1;
    check_shape("tiny-bert, bf16 optimizer state", "tiny-bert", TG_TASK_CLASSIFY, 3, 24, seed + 61, precision, 0, 0, 0,
                TG_ATTENTION_FUSED, kinds_seen);
    g_adan = 1;
    check_shape("tiny-bert adan, bf16 optimizer state", "tiny-bert", TG_TASK_CLASSIFY, 3, 24, seed + 62, precision, 0,
                0, 0, TG_ATTENTION_FUSED, kinds_seen);
    g_data_parallel = 2, g_zero = 1, g_zero_rank = 1;
    for (g_adan = 0; g_adan <= 1; g_adan++)
        check_shape(g_adan ? "tiny-gpt2 adan, bf16 state, ZeRO-1 replica 1 of 2" : "tiny-gpt2, bf16 state, ZeRO-1 replica 1 of 2",
                    "tiny-gpt2", TG_TASK_LM, 2, 24, seed + 63 + g_adan, precision, 0, 0, 0, TG_ATTENTION_FUSED,
                    kinds_seen);
    g_data_parallel = 1, g_zero = g_zero_rank = 0;
    g_adan = 0, g_state_bf16 = 0;
}

static void check_separate_qkv(int precision, uint64_t seed, int *kinds_seen) {
    g_separate_qkv = 1;
    check_shape("tiny-bert separate q/k/v", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed + 21, precision, 0, 0, 0,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("tiny-roberta separate q/k/v unfused", "tiny-roberta", TG_TASK_CLASSIFY, 3, 40, seed + 22, precision, 0,
                0, 0, TG_ATTENTION_UNFUSED, kinds_seen);
    check_shape("bert Dh=12 T=21 separate q/k/v", "tiny-bert", TG_TASK_CLASSIFY, 3, 21, seed + 23, precision, 0, 36, 3,
                TG_ATTENTION_FUSED, kinds_seen);
    g_separate_qkv = 0;
}

/* Fused attention at the head dims and lengths the kernels treat differently: Dh 8, 12
 * (no 16-byte rows), 16, 64 and 128 (tile widths 16..128; wgmma at 64 and 128), T with
 * several 64-row tiles and a partial last one (the two-kernel backward past T = 128, at
 * both wgmma widths), T % 4 != 0 (one Philox draw per element), causal and key-masked,
 * with attention dropout and without. */
static void check_attention_shapes(int precision, uint64_t seed, int *kinds_seen) {
    check_shape("bert Dh=64 T=128", "tiny-bert", TG_TASK_CLASSIFY, 2, 128, seed + 11, precision, 0, 256, 4,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("bert Dh=128 T=72", "tiny-bert", TG_TASK_CLASSIFY, 2, 72, seed + 12, precision, 0, 256, 2,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("bert Dh=12 T=21", "tiny-bert", TG_TASK_CLASSIFY, 3, 21, seed + 13, precision, 0, 36, 3,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("gpt2 Dh=64 T=200 causal", "tiny-gpt2", TG_TASK_LM, 2, 200, seed + 14, precision, 0, 128, 2,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("gpt2 Dh=32 T=66 causal", "tiny-gpt2", TG_TASK_LM, 2, 66, seed + 15, precision, 0, 64, 2,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("gpt2 Dh=128 T=168 causal", "tiny-gpt2", TG_TASK_LM, 2, 168, seed + 16, precision, 0, 256, 2,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("bert Dh=128 T=136", "tiny-bert", TG_TASK_CLASSIFY, 2, 136, seed + 17, precision, 0, 256, 2,
                TG_ATTENTION_FUSED, kinds_seen);
    /* The two-kernel backward at Dh 64 with dropout, not causal, key-masked: 5 query tiles. */
    check_shape("bert Dh=64 T=264", "tiny-bert", TG_TASK_CLASSIFY, 2, 264, seed + 21, precision, 0, 256, 4,
                TG_ATTENTION_FUSED, kinds_seen);
    /* Without attention dropout the 16-bit forward at Dh 64 and 128 is the pipelined kernel
     * (the softmax beside P V): key-masked rows, a partial last tile, causal blocks whose
     * first warpgroup skips the last tile. */
    g_no_attention_dropout = 1;
    check_shape("bert Dh=64 T=200 no dropout", "tiny-bert", TG_TASK_CLASSIFY, 2, 200, seed + 18, precision, 0, 256, 4,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("bert Dh=128 T=136 no dropout", "tiny-bert", TG_TASK_CLASSIFY, 2, 136, seed + 19, precision, 0, 256,
                2, TG_ATTENTION_FUSED, kinds_seen);
    check_shape("gpt2 Dh=64 T=300 causal no dropout", "tiny-gpt2", TG_TASK_LM, 2, 300, seed + 20, precision, 0, 128,
                2, TG_ATTENTION_FUSED, kinds_seen);
    g_no_attention_dropout = 0;
}

/* qa with grad_accumulation: the span loss and its backward divided by the window's
 * counts per side (io.loss_norm), where they are positive. */
static void check_qa_window(int precision, uint64_t seed, int *kinds_seen) {
    g_grad_accumulation = 3;
    check_preset("tiny-bert qa accumulated", "tiny-bert", TG_TASK_QA, 4, 32, seed + 51, precision, 0, kinds_seen);
    g_grad_accumulation = 1;
}

/* Parameter-gradient ops in both forms: as compiled (first writers overwrite) above, and
 * accumulating here, with separate bias gradients (BIAS_GRAD) and with fused ones. */
static void check_accumulating_gradients(int precision, uint64_t seed, int *kinds_seen) {
    g_accumulate_gradients = 1;
    check_shape("tiny-bert accumulating gradients", "tiny-bert", TG_TASK_CLASSIFY, 3, 24, seed + 41, precision, 0, 0,
                0, TG_ATTENTION_FUSED, kinds_seen);
    check_shape("tiny-bert unfused accumulating gradients", "tiny-bert", TG_TASK_CLASSIFY, 3, 24, seed + 42,
                precision, 0, 0, 0, TG_ATTENTION_UNFUSED, kinds_seen);
    g_accumulate_gradients = 0;
}

/* The LayerNorm backward with fused column sums (kernels/layernorm.cu) at D = 768 and
 * 1024 (more than 48 KB of shared memory: the opt-in path), with row counts (42, 135)
 * that leave the last group of 8 partial, and 4608 rows (more row groups than the fixed
 * grid of 512 blocks, so blocks take several). D = 96 and 256 are in the presets and
 * attention shapes above; D = 30 (fp32) and 36 take the row and column kernels. */
static void check_layernorm_widths(int precision, uint64_t seed, int *kinds_seen) {
    check_shape("bert D=768 T=21", "tiny-bert", TG_TASK_CLASSIFY, 2, 21, seed + 31, precision, 0, 768, 12,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("gpt2 D=1024 T=45", "tiny-gpt2", TG_TASK_LM, 3, 45, seed + 32, precision, 0, 1024, 16,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("gpt2 D=64 M=4608", "tiny-gpt2", TG_TASK_LM, 9, 512, seed + 33, precision, 0, 64, 2,
                TG_ATTENTION_FUSED, kinds_seen);
}

/* One plan of a preset with the tanh GELU, run op by op against the CPU with an empty
 * GEMM cache folder, so the cache entries it leaves say how its GELU matmuls ran; *delta
 * gets its counts. intermediate 0: the preset's MLP width. */
static void check_gelu_plan(const char *what, const char *preset, int task, int intermediate, int fuse_gelu,
                            int precision, uint64_t seed, int *kinds_seen, act_seen *delta) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    REQUIRE(tg_model_config_load(preset, &cfg, &err) == 0, "%s", err.msg);
    cfg.gelu = TG_GELU_TANH;
    if (intermediate) cfg.intermediate = intermediate;
    base_job(&job, preset, task, 3, 19, seed);
    job.precision = precision;
    job.fuse_gelu = fuse_gelu;
    if (task == TG_TASK_CLASSIFY && cfg.pad_token_id < 0) job.pad_token_id = 0;
    char saved[1024] = "";
    const char *old = getenv("TUNEGRAPH_CACHE_DIR");
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("TUNEGRAPH_CACHE_DIR", tg_test_tmpdir(), 1);
    act_seen before = g_act;
    check_plan_ops(what, &job, &cfg, kinds_seen);
    for (int a = 1; a < 3; a++) {
        delta->ops[a] = g_act.ops[a] - before.ops[a];
        delta->epilogue[a] = g_act.epilogue[a] - before.epilogue[a];
        delta->fallback[a] = g_act.fallback[a] - before.fallback[a];
    }
    if (saved[0]) setenv("TUNEGRAPH_CACHE_DIR", saved, 1);
    else unsetenv("TUNEGRAPH_CACHE_DIR");
}

/* The GELU epilogues (MATMUL activation) in plans made for them: GPT-2 (Conv1D) at the preset's
 * MLP width (a multiple of 8: the cuBLASLt epilogue in bf16 and fp16) and at an odd width (aux
 * leading dimension not a multiple of 8: the fallback), a BERT-style model with the tanh
 * GELU (nn.Linear: the other transposes), and GPT-2 with fuse_gelu = false (the separate
 * tanh GELU and GELU_BWD kernels). fp32 products always take the fallback. */
static void check_gelu_plans(int precision, uint64_t seed, int *kinds_seen) {
    const int half = precision == TG_PREC_BF16 || precision == TG_PREC_FP16; /* 16-bit products */
    const char *name = precision == TG_PREC_BF16 ? "bf16" : precision == TG_PREC_FP16 ? "fp16" : "fp32";
    const struct {
        const char *what, *preset;
        int task, intermediate, fuse_gelu, odd;
    } plans[] = {
        {"gpt2 gelu epilogue", "tiny-gpt2", TG_TASK_LM, 0, 1, 0},
        {"gpt2 gelu epilogue odd width", "tiny-gpt2", TG_TASK_CLASSIFY, 100, 1, 1},
        {"bert tanh gelu epilogue", "tiny-bert", TG_TASK_CLASSIFY, 0, 1, 0},
        {"gpt2 separate tanh gelu", "tiny-gpt2", TG_TASK_LM, 0, 0, 0},
    };
    for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
        char what[96];
        snprintf(what, sizeof what, "%s (%s)", plans[k].what, name);
        act_seen d;
        memset(&d, 0, sizeof d);
        check_gelu_plan(what, plans[k].preset, plans[k].task, plans[k].intermediate, plans[k].fuse_gelu, precision,
                        seed + 20 + k, kinds_seen, &d);
        if (!plans[k].fuse_gelu) {
            CHECK(d.ops[1] == 0 && d.ops[2] == 0, "%s: fuse_gelu = false still fused the GELU", what);
            continue;
        }
        CHECK(d.ops[1] > 0 && d.ops[2] > 0, "%s: %d forward and %d backward GELU matmuls", what, d.ops[1], d.ops[2]);
        /* Each GELU matmul shape has one cache entry, of the form it ran in. */
        /* cuBLASLt documents GELU_AUX(_BIAS) and DGELU for 16F as for 16BF outputs. */
        const int want_epilogue = half && !plans[k].odd;
        for (int a = 1; a < 3; a++)
            CHECK(want_epilogue ? d.epilogue[a] > 0 && d.fallback[a] == 0 : d.epilogue[a] == 0 && d.fallback[a] > 0,
                  "%s: activation %d ran %d times as the cuBLASLt epilogue and %d times as the fallback (want the %s)",
                  what, a, d.epilogue[a], d.fallback[a], want_epilogue ? "epilogue" : "fallback");
    }
}

/* Llama: RMSNorm, the rotary embedding (q and k rotated, k and v repeated to the query
 * heads) and SwiGLU, with their backwards: tiny-llama's LM and classification plans (4
 * heads over 2 kv heads, llama3 rope), head dims 64 and 128 with 4 and 2 query heads a kv
 * head, an odd length, and unfused attention. */
static void check_llama_plans(int precision, uint64_t seed, int *kinds_seen) {
    check_preset("tiny-llama lm", "tiny-llama", TG_TASK_LM, 3, 40, seed + 70, precision, 0, kinds_seen);
    check_preset("tiny-llama classify", "tiny-llama", TG_TASK_CLASSIFY, 4, 24, seed + 71, precision, 0, kinds_seen);
    g_kv_heads = 1;
    check_shape("llama Dh=64 GQA 4 T=77", "tiny-llama", TG_TASK_LM, 2, 77, seed + 72, precision, 0, 256, 4,
                TG_ATTENTION_FUSED, kinds_seen);
    check_shape("llama Dh=128 GQA 2 T=130", "tiny-llama", TG_TASK_LM, 2, 130, seed + 73, precision, 0, 256, 2,
                TG_ATTENTION_FUSED, kinds_seen);
    /* D = 30 and I = 60: RMSNorm and SwiGLU rows without 16-byte accesses (the scalar kernels) */
    check_shape("llama D=30 I=60 Dh=10 T=21", "tiny-llama", TG_TASK_LM, 2, 21, seed + 76, precision, 0, 30, 3,
                TG_ATTENTION_FUSED, kinds_seen);
    g_kv_heads = 0;
    check_shape("tiny-llama lm unfused", "tiny-llama", TG_TASK_LM, 3, 40, seed + 74, precision, 0, 0, 0,
                TG_ATTENTION_UNFUSED, kinds_seen);
    /* LoRA on every projection: q, k and v (and gate and up) made apart. */
    g_lora_r = 4;
    check_preset("tiny-llama lm lora", "tiny-llama", TG_TASK_LM, 3, 40, seed + 75, precision, 0, kinds_seen);
    g_lora_r = 0;
}

/* MobileNetV2 in the given precision (fp32, or bf16 / fp16: half activations, the
 * convolutions reading half weight copies, the batch norms' statistics fp32): the image
 * input, the stem's full convolution (1 and 3 input channels), depthwise convolutions of
 * strides 1 and 2 over even and odd sizes (padding on every edge), batch norms in training
 * and in eval mode with their ReLU6 inside (the default) and apart, pooling, with their
 * backwards writing and accumulating gradients; batch 2 at 32 pixels reaches a 1 x 1 map (a
 * batch norm over 2 values). */
static void image_job(tg_job *job, int precision, int batch, int size, int channels, float width, uint64_t seed) {
    base_job(job, "mobilenet_v2", TG_TASK_CLASSIFY, batch, 1, seed);
    job->image_size = size, job->image_channels = channels, job->width_mult = width, job->precision = precision;
}

static void check_image_plans(int precision, uint64_t seed, int *kinds_seen) {
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    char what[96];
    const char *name = precision == TG_PREC_BF16 ? " bf16" : precision == TG_PREC_FP16 ? " fp16" : "";
    REQUIRE(tg_model_config_load("mobilenet_v2", &cfg, &err) == 0, "%s", err.msg);
    image_job(&job, precision, 2, 32, 1, 0.35f, seed + 90);
    snprintf(what, sizeof what, "mobilenet_v2%s 32px x1 w0.35", name);
    check_plan_ops(what, &job, &cfg, kinds_seen);
    image_job(&job, precision, 3, 37, 3, 0.5f, seed + 91);
    snprintf(what, sizeof what, "mobilenet_v2%s 37px x3 w0.5", name);
    check_plan_ops(what, &job, &cfg, kinds_seen);
    /* ReLU6 as its own ops (fuse_bn_relu6 = false) beside the fused batch norms above */
    image_job(&job, precision, 2, 33, 1, 0.35f, seed + 94);
    job.fuse_bn_relu6 = 0;
    snprintf(what, sizeof what, "mobilenet_v2%s 33px, separate ReLU6", name);
    check_plan_ops(what, &job, &cfg, kinds_seen);
    g_accumulate_gradients = 1;
    image_job(&job, precision, 2, 40, 1, 0.25f, seed + 92);
    snprintf(what, sizeof what, "mobilenet_v2%s 40px, accumulating gradients", name);
    check_plan_ops(what, &job, &cfg, kinds_seen);
    g_accumulate_gradients = 0;
    g_training = 0;
    image_job(&job, precision, 2, 32, 1, 0.35f, seed + 93);
    snprintf(what, sizeof what, "mobilenet_v2%s 32px eval", name);
    check_plan_ops(what, &job, &cfg, kinds_seen);
    g_training = 1;
}

TG_TEST(test_gpu_ops_match_cpu) {
    attention_backend("own");
    uint64_t seed = test_seed(0);
    int kinds_seen[TG_OP_COUNT] = {0};
    check_preset("tiny-bert", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed, TG_PREC_FP32, 0, kinds_seen);
    check_preset("tiny-roberta", "tiny-roberta", TG_TASK_CLASSIFY, 3, 40, seed + 1, TG_PREC_FP32, 0, kinds_seen);
    check_preset("gpt2-wide lm", "tiny-gpt2", TG_TASK_LM, 4, 77, seed + 2, TG_PREC_FP32, 1, kinds_seen);
    check_preset("gpt2-wide classify", "tiny-gpt2", TG_TASK_CLASSIFY, 4, 77, seed + 2, TG_PREC_FP32, 1, kinds_seen);
    /* Masked LM: the masking op (bit for bit) and the heads, one at a 50257-id vocabulary. */
    check_preset("tiny-bert mlm", "tiny-bert", TG_TASK_MLM, 4, 32, seed + 5, TG_PREC_FP32, 0, kinds_seen);
    check_preset("roberta-wide mlm", "tiny-roberta", TG_TASK_MLM, 2, 40, seed + 6, TG_PREC_FP32, 1, kinds_seen);
    check_shape("tiny-bert unfused", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed + 3, TG_PREC_FP32, 0, 0, 0,
                TG_ATTENTION_UNFUSED, kinds_seen);
    /* task = qa: the span head and its loss (SPAN_LOSS, SPAN_LOSS_BWD). */
    check_preset("tiny-bert qa", "tiny-bert", TG_TASK_QA, 4, 32, seed + 5, TG_PREC_FP32, 0, kinds_seen);
    check_preset("tiny-roberta qa", "tiny-roberta", TG_TASK_QA, 3, 40, seed + 6, TG_PREC_FP32, 0, kinds_seen);
    check_qa_window(TG_PREC_FP32, seed, kinds_seen);
    check_attention_shapes(TG_PREC_FP32, seed, kinds_seen);
    check_gelu_plans(TG_PREC_FP32, seed, kinds_seen);
    /* D = 30: rows of the residual LayerNorm kernels that take no vector access. */
    check_shape("bert D=30 Dh=10 T=21", "tiny-bert", TG_TASK_CLASSIFY, 3, 21, seed + 4, TG_PREC_FP32, 0, 30, 3,
                TG_ATTENTION_FUSED, kinds_seen);
    check_separate_qkv(TG_PREC_FP32, seed, kinds_seen);
    check_data_parallel_plan(TG_PREC_FP32, seed, kinds_seen);
    check_layernorm_widths(TG_PREC_FP32, seed, kinds_seen);
    check_accumulating_gradients(TG_PREC_FP32, seed, kinds_seen);
    check_adan_plans(TG_PREC_FP32, seed, kinds_seen);
    check_state_bf16_plans(TG_PREC_FP32, seed, kinds_seen);
    check_recompute_plans(TG_PREC_FP32, seed, kinds_seen);
    check_llama_plans(TG_PREC_FP32, seed, kinds_seen);
    /* fp16's loss scaling: the scaled FILL, GRAD_NORM and updates, LOSS_SCALE_UPDATE. */
    g_f32_ops_only = 1;
    check_preset("tiny-bert fp16 (f32 ops)", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed + 8, TG_PREC_FP16, 0, kinds_seen);
    g_adan = 1;
    check_preset("tiny-bert fp16 adan (f32 ops)", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed + 9, TG_PREC_FP16, 0,
                 kinds_seen);
    g_adan = 0, g_f32_ops_only = 0;
    check_image_plans(TG_PREC_FP32, seed, kinds_seen);
    for (int k = 0; k < TG_OP_COUNT; k++) CHECK(kinds_seen[k] > 0, "op %s was never tested", tg_op_name(k));
}

TG_TEST(test_gpu_ops_match_cpu_bf16) {
    attention_backend("own");
    uint64_t seed = test_seed(7);
    int kinds_seen[TG_OP_COUNT] = {0};
    check_preset("tiny-bert bf16", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed, TG_PREC_BF16, 0, kinds_seen);
    check_preset("gpt2-wide lm bf16", "tiny-gpt2", TG_TASK_LM, 4, 77, seed + 2, TG_PREC_BF16, 1, kinds_seen);
    check_preset("tiny-bert mlm bf16", "tiny-bert", TG_TASK_MLM, 4, 32, seed + 5, TG_PREC_BF16, 0, kinds_seen);
    check_preset("roberta-wide mlm bf16", "tiny-roberta", TG_TASK_MLM, 2, 40, seed + 6, TG_PREC_BF16, 1, kinds_seen);
    check_preset("tiny-roberta qa bf16", "tiny-roberta", TG_TASK_QA, 3, 40, seed + 7, TG_PREC_BF16, 0, kinds_seen);
    check_qa_window(TG_PREC_BF16, seed, kinds_seen);
    check_shape("gpt2-wide lm bf16 unfused", "tiny-gpt2", TG_TASK_LM, 4, 77, seed + 3, TG_PREC_BF16, 1, 0, 0,
                TG_ATTENTION_UNFUSED, kinds_seen);
    check_attention_shapes(TG_PREC_BF16, seed, kinds_seen);
    check_gelu_plans(TG_PREC_BF16, seed, kinds_seen);
    check_separate_qkv(TG_PREC_BF16, seed, kinds_seen);
    check_data_parallel_plan(TG_PREC_BF16, seed, kinds_seen);
    check_layernorm_widths(TG_PREC_BF16, seed, kinds_seen);
    check_accumulating_gradients(TG_PREC_BF16, seed, kinds_seen);
    check_adan_plans(TG_PREC_BF16, seed, kinds_seen);
    check_state_bf16_plans(TG_PREC_BF16, seed, kinds_seen);
    check_recompute_plans(TG_PREC_BF16, seed, kinds_seen);
    check_llama_plans(TG_PREC_BF16, seed, kinds_seen);
    /* fp16 plans' f32 ops alone (test_gpu_ops_match_cpu_fp16 runs all): LOSS_SCALE_UPDATE too. */
    g_f32_ops_only = 1;
    check_preset("tiny-roberta fp16 (f32 ops)", "tiny-roberta", TG_TASK_CLASSIFY, 3, 40, seed + 8, TG_PREC_FP16, 0,
                 kinds_seen);
    g_f32_ops_only = 0;
    check_image_plans(TG_PREC_BF16, seed, kinds_seen);
    for (int k = 0; k < TG_OP_COUNT; k++) CHECK(kinds_seen[k] > 0, "op %s was never tested in bf16", tg_op_name(k));
}

/* Every op of fp16 plans (half activations and weight copies, loss scaling) on the same
 * plans and shapes as test_gpu_ops_match_cpu_bf16, against the CPU reference (which rounds
 * to half where the plan stores half): every kind is seen. */
TG_TEST(test_gpu_ops_match_cpu_fp16) {
    attention_backend("own");
    uint64_t seed = test_seed(13);
    int kinds_seen[TG_OP_COUNT] = {0};
    check_preset("tiny-bert fp16", "tiny-bert", TG_TASK_CLASSIFY, 4, 32, seed, TG_PREC_FP16, 0, kinds_seen);
    check_preset("gpt2-wide lm fp16", "tiny-gpt2", TG_TASK_LM, 4, 77, seed + 2, TG_PREC_FP16, 1, kinds_seen);
    check_preset("tiny-bert mlm fp16", "tiny-bert", TG_TASK_MLM, 4, 32, seed + 5, TG_PREC_FP16, 0, kinds_seen);
    check_preset("roberta-wide mlm fp16", "tiny-roberta", TG_TASK_MLM, 2, 40, seed + 6, TG_PREC_FP16, 1, kinds_seen);
    check_preset("tiny-roberta qa fp16", "tiny-roberta", TG_TASK_QA, 3, 40, seed + 7, TG_PREC_FP16, 0, kinds_seen);
    check_qa_window(TG_PREC_FP16, seed, kinds_seen);
    check_shape("gpt2-wide lm fp16 unfused", "tiny-gpt2", TG_TASK_LM, 4, 77, seed + 3, TG_PREC_FP16, 1, 0, 0,
                TG_ATTENTION_UNFUSED, kinds_seen);
    check_attention_shapes(TG_PREC_FP16, seed, kinds_seen);
    check_gelu_plans(TG_PREC_FP16, seed, kinds_seen);
    check_separate_qkv(TG_PREC_FP16, seed, kinds_seen);
    check_data_parallel_plan(TG_PREC_FP16, seed, kinds_seen);
    check_layernorm_widths(TG_PREC_FP16, seed, kinds_seen);
    check_accumulating_gradients(TG_PREC_FP16, seed, kinds_seen);
    check_adan_plans(TG_PREC_FP16, seed, kinds_seen);
    check_llama_plans(TG_PREC_FP16, seed, kinds_seen);
    check_image_plans(TG_PREC_FP16, seed, kinds_seen);
    for (int k = 0; k < TG_OP_COUNT; k++) CHECK(kinds_seen[k] > 0, "op %s was never tested in fp16", tg_op_name(k));
}

/* ATTENTION and ATTENTION_BWD through cuDNN's graphs against the CPU reference, at the
 * shapes cuDNN takes (16-bit storage, head dims 64 and 128, no attention dropout):
 * Llama's causal attention (packed q|k|v, grouped-query heads repeated by the rotary op,
 * LoRA's apart projections; its key mask keeping every key, see g_causal_keys_kept),
 * BERT's unmasked-direction attention with a key mask (attention dropout set to 0; packed and three separate q, k, v), T with a
 * partial last tile, bf16 and fp16; the
 * tolerances of every op (2e-2 bf16, 5e-3 fp16). Every executor must give cuDNN the
 * attention ops (TUNEGRAPH_ATTENTION=cudnn fails an op it cannot take). Skipped, with the
 * reason, where cuDNN does not load (TUNEGRAPH_CUDNN names the library). */
TG_TEST(test_gpu_attention_cudnn_matches_cpu) {
    tg_cudnn_attention *probe = NULL;
    char why[256];
    tg_err err;
    attention_backend("auto");
    REQUIRE(tg_cudnn_attention_open(&probe, why, sizeof why, &err) == 0, "%s", err.msg);
    if (!probe) {
        printf("    skipped: cuDNN is not there (%s)\n", why);
        return;
    }
    tg_cudnn_attention_close(probe);
    uint64_t seed = test_seed(17);
    int kinds_seen[TG_OP_COUNT] = {0};
    attention_backend("cudnn");
    g_cudnn_taken = g_cudnn_eligible = 0;
    g_causal_keys_kept = 1;
    const int precisions[2] = {TG_PREC_BF16, TG_PREC_FP16};
    for (int pr = 0; pr < 2; pr++) {
        const int prec = precisions[pr];
        const char *tag = prec == TG_PREC_BF16 ? "bf16" : "fp16";
        char what[96];
        snprintf(what, sizeof what, "llama Dh=64 T=200 gqa 2 %s", tag);
        check_shape(what, "tiny-llama", TG_TASK_LM, 2, 200, seed + 1 + pr, prec, 0, 256, 4, TG_ATTENTION_FUSED,
                    kinds_seen);
        snprintf(what, sizeof what, "llama Dh=128 T=168 %s", tag);
        check_shape(what, "tiny-llama", TG_TASK_LM, 2, 168, seed + 3 + pr, prec, 0, 256, 2, TG_ATTENTION_FUSED,
                    kinds_seen);
    }
    g_lora_r = 4;
    check_shape("llama lora Dh=64 T=64 bf16", "tiny-llama", TG_TASK_LM, 3, 64, seed + 5, TG_PREC_BF16, 0, 256, 4,
                TG_ATTENTION_FUSED, kinds_seen);
    g_lora_r = 0;
    check_shape("llama classify Dh=128 T=40 bf16", "tiny-llama", TG_TASK_CLASSIFY, 3, 40, seed + 6, TG_PREC_BF16, 0,
                256, 2, TG_ATTENTION_FUSED, kinds_seen);
    g_no_attention_dropout = 1;
    check_shape("bert Dh=64 T=136 no attention dropout bf16", "tiny-bert", TG_TASK_CLASSIFY, 2, 136, seed + 7,
                TG_PREC_BF16, 0, 256, 4, TG_ATTENTION_FUSED, kinds_seen);
    g_separate_qkv = 1;
    check_shape("bert separate q/k/v Dh=128 T=72 no attention dropout fp16", "tiny-bert", TG_TASK_CLASSIFY, 2, 72,
                seed + 8, TG_PREC_FP16, 0, 256, 2, TG_ATTENTION_FUSED, kinds_seen);
    g_separate_qkv = 0, g_no_attention_dropout = 0, g_causal_keys_kept = 0;
    attention_backend("auto");
    /* the LM plans' attention (a forward and a backward a layer) at least */
    CHECK(g_cudnn_eligible >= 28 && g_cudnn_taken == g_cudnn_eligible,
          "cuDNN took %d attention ops of the %d it should take", g_cudnn_taken, g_cudnn_eligible);
    CHECK(kinds_seen[TG_OP_ATTENTION] >= 6 && kinds_seen[TG_OP_ATTENTION_BWD] >= 6, "attention ops checked: %d / %d",
          kinds_seen[TG_OP_ATTENTION], kinds_seen[TG_OP_ATTENTION_BWD]);
}

/* EMBEDDING_BWD on ids the plan tests rarely make: one id on 40% of the tokens (summed in
 * 256-token chunks whose last finisher adds them up), the padding id, ids outside the
 * table, small tables (token types: per-id column sums) and rows without 16-byte vectors
 * (D = 30), fp32, bf16 and half dout, against the CPU, accumulating onto random table values. */
/* MLM_MASK on a large batch (64 x 512 positions, half of them padding in some rows):
 * CUDA's masks equal the CPU's bit for bit, in training (the stream's seed, step and first
 * element, each giving other masks) and in eval (the fixed eval stream at the batch's
 * index). */
TG_TEST(test_gpu_mlm_masks_match_cpu) {
    uint64_t seed = test_seed(11);
    tg_model_config cfg;
    tg_err err;
    tg_job job;
    REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
    cfg.max_positions = 512;
    base_job(&job, "tiny-bert", TG_TASK_MLM, 64, 512, seed);
    tg_plan p;
    REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
    const tg_op *op = &p.ops[0];
    REQUIRE(op->kind == TG_OP_MLM_MASK, "op 0 is %s", tg_op_name(op->kind));
    tg_cpu_exec cpu;
    tg_cuda_exec gpu;
    REQUIRE(tg_cpu_exec_init(&cpu, &p, 0, &err) == 0, "%s", err.msg);
    REQUIRE(tg_cuda_exec_init_on(&gpu, &p, seed, 0, NULL, &err) == 0, "%s", err.msg);
    cpu.seed = seed;
    const int64_t n = op->p.mlm_mask.n;
    int32_t *got = malloc(sizeof(int32_t) * (size_t)n), *first = malloc(sizeof(int32_t) * (size_t)n);
    REQUIRE(got && first, "out of memory");
    for (int in = 0; in < 2; in++) {
        void *host = tg_cpu_tensor(&cpu, op->in[in]);
        randomize(&p, op->in[in], host);
        REQUIRE(tg_cuda_upload(&gpu, op->in[in], host, &err) == 0, "%s", err.msg);
    }
    /* The stream (io.mlm_stream, kernels/mlm_mask.h): several steps, a later micro-batch of
     * a window (its first element past 0), another seed, and eval batches 3 and 0. */
    static const struct {
        int training;
        uint32_t step, first;
        uint64_t seed;
    } runs[] = {{1, 0, 0, 42},           {1, 1, 0, 42}, {1, 4097, 0, 42},           {1, 1, 3 * 64 * 512, 42},
                {1, 1, 0, 0x9E3779B97F4A7C15ull}, {0, 3, 0, 42}, {0, 0, 0, 42}};
    REQUIRE(p.io.mlm_stream >= 0 && op->in[3] == p.io.mlm_stream, "the masking op reads no stream");
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        uint32_t *stream = tg_cpu_tensor(&cpu, op->in[3]);
        stream[0] = runs[r].step, stream[1] = runs[r].first;
        stream[2] = (uint32_t)runs[r].seed, stream[3] = (uint32_t)(runs[r].seed >> 32);
        REQUIRE(tg_cuda_upload(&gpu, op->in[3], stream, &err) == 0, "%s", err.msg);
        cpu.training = runs[r].training;
        REQUIRE(tg_cuda_exec_range(&gpu, 0, 1, runs[r].training, &err) == 0 && tg_cuda_sync(&gpu, &err) == 0 &&
                    tg_cpu_exec_range(&cpu, 0, 1, &err) == 0,
                "%s", err.msg);
        for (int slot = 0; slot < 2; slot++) {
            REQUIRE(tg_cuda_download(&gpu, op->out[slot], got, &err) == 0, "%s", err.msg);
            const int32_t *want = tg_cpu_tensor(&cpu, op->out[slot]);
            int64_t differ = 0, selected = 0;
            for (int64_t i = 0; i < n; i++) differ += got[i] != want[i], selected += want[i] != TG_IGNORE_INDEX;
            CHECK(differ == 0, "run %zu (training %d, step %u): %lld of %lld %s differ", r, runs[r].training,
                  runs[r].step, (long long)differ, (long long)n, p.tensors[op->out[slot]].name);
            if (slot == 1) {
                CHECK(selected > n / 20, "run %zu: %lld of %lld positions selected", r, (long long)selected, (long long)n);
                if (r == 0) memcpy(first, want, sizeof(int32_t) * (size_t)n);
                else CHECK(memcmp(first, want, sizeof(int32_t) * (size_t)n) != 0, "run %zu masks as run 0", r);
            }
        }
    }
    free(got), free(first);
    tg_cuda_exec_free(&gpu);
    tg_cpu_exec_free(&cpu);
    tg_plan_free(&p);
}

TG_TEST(test_gpu_embedding_bwd_long_ids) {
    (void)test_seed(41);
    /* N <= 4096: one tile, its sorted runs as the segments; 9000: three tiles placed by
     * per-id counts and cursors. */
    static const struct {
        int V, D, dtype;
        int64_t N;
    } cases[] = {{700, 96, TG_F32, 3000},  {700, 96, TG_BF16, 3000}, {700, 30, TG_F32, 3000}, {2, 96, TG_BF16, 3000},
                 {3, 30, TG_F32, 3000},    {700, 96, TG_F32, 9000},  {700, 96, TG_BF16, 9000}, {700, 30, TG_F32, 9000},
                 {700, 96, TG_F16, 3000},  {2, 96, TG_F16, 3000},    {700, 96, TG_F16, 9000},  {700, 30, TG_F16, 3000}};
    cudaStream_t st;
    REQUIRE(cudaStreamCreate(&st) == cudaSuccess, "cudaStreamCreate");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int V = cases[k].V, D = cases[k].D, pad = V > 3 ? 3 : -1;
        const int bf16 = cases[k].dtype == TG_BF16 || cases[k].dtype == TG_F16; /* a 16-bit dout */
        const int64_t N = cases[k].N;
        tg_op op = tg_test_op(TG_OP_EMBEDDING_BWD);
        op.phase = TG_PHASE_BACKWARD;
        op.in[0] = 0, op.in[1] = 1, op.out[0] = 2;
        op.p.embedding = (tg_embedding_params){.n = N, .vocab = V, .dim = D, .padding_idx = pad};
        int32_t *ids = malloc(sizeof *ids * N);
        float *dy = malloc(sizeof *dy * N * D), *table = malloc(sizeof *table * V * D), *want = malloc(sizeof *want * V * D);
        uint16_t *dy16 = malloc(sizeof *dy16 * N * D);
        for (int64_t n = 0; n < N; n++) {
            const uint32_t r = next_u32() % 100;
            ids[n] = r < 40 ? V / 2 : r < 45 ? pad : r < 48 ? (r & 1 ? -1 : V) : (int32_t)(next_u32() % (uint32_t)V);
        }
        for (int64_t i = 0; i < N * D; i++) dy[i] = uniform(-1.0f, 1.0f);
        if (cases[k].dtype == TG_F16) tg_f16_narrow(dy16, dy, N * D);
        else if (bf16) tg_bf16_narrow(dy16, dy, N * D);
        for (int64_t i = 0; i < (int64_t)V * D; i++) want[i] = table[i] = uniform(-1.0f, 1.0f);
        /* CPU */
        tg_cpu_op_args c = {.op = &op, .in = {ids, bf16 ? (void *)dy16 : (void *)dy}, .out = {want},
                            .in_numel = {N, N * D}, .out_numel = {(int64_t)V * D},
                            .in_dtype = {TG_I32, (int8_t)cases[k].dtype}, .out_dtype = {TG_F32}};
        REQUIRE(tg_cpu_op_run_any(&c) == 0, "cpu embedding_bwd");
        /* GPU */
        void *d_ids, *d_dy, *d_table;
        float *scratch;
        const int64_t in_numel[TG_OP_MAX_IN] = {N, N * D};
        const int64_t floats = tg_cuda_op_scratch_floats(&op, in_numel);
        REQUIRE(cudaMalloc(&d_ids, sizeof *ids * N) == cudaSuccess &&
                    cudaMalloc(&d_dy, (bf16 ? 2 : 4) * (size_t)(N * D)) == cudaSuccess &&
                    cudaMalloc(&d_table, sizeof(float) * V * D) == cudaSuccess &&
                    cudaMalloc((void **)&scratch, sizeof(float) * (size_t)(floats > 0 ? floats : 1)) == cudaSuccess,
                "cudaMalloc");
        cudaMemcpy(d_ids, ids, sizeof *ids * N, cudaMemcpyHostToDevice);
        cudaMemcpy(d_dy, bf16 ? (void *)dy16 : (void *)dy, (bf16 ? 2 : 4) * (size_t)(N * D), cudaMemcpyHostToDevice);
        cudaMemcpy(d_table, table, sizeof(float) * V * D, cudaMemcpyHostToDevice);
        cudaMemset(scratch, 0xff, sizeof(float) * (size_t)floats); /* stale scratch from other ops */
        tg_cuda_ctx ctx = {.stream = st, .reduce_scratch = scratch, .reduce_scratch_floats = (size_t)floats};
        tg_cuda_op_args g = {.op = &op, .in = {d_ids, d_dy}, .out = {d_table}, .in_numel = {N, N * D},
                             .out_numel = {(int64_t)V * D}, .in_dtype = {TG_I32, (int8_t)cases[k].dtype},
                             .out_dtype = {TG_F32}, .training = 1, .ctx = &ctx};
        tg_err err;
        float *got = malloc(sizeof *got * V * D);
        for (int rep = 0; rep < 2; rep++) { /* twice: the arrival counters start from zero again */
            cudaMemcpy(d_table, table, sizeof(float) * V * D, cudaMemcpyHostToDevice);
            CHECK(tg_cuda_op_run(&g, &err) == 0, "V=%d D=%d: %s", V, D, err.msg);
            CHECK(cudaStreamSynchronize(st) == cudaSuccess, "V=%d D=%d: %s", V, D, cudaGetErrorString(cudaGetLastError()));
            cudaMemcpy(got, d_table, sizeof(float) * V * D, cudaMemcpyDeviceToHost);
            const double rel = tg_rel_err(got, want, (int64_t)V * D);
            CHECK(rel <= 1e-5, "V=%d D=%d N=%lld %s run %d: relative error %.3g", V, D, (long long)N,
                  tg_dtype_name(cases[k].dtype), rep, rel);
        }
        if (pad >= 0) CHECK(memcmp(got + (int64_t)pad * D, table + (int64_t)pad * D, sizeof(float) * D) == 0,
                            "V=%d: the padding row changed", V);
        cudaFree(d_ids), cudaFree(d_dy), cudaFree(d_table), cudaFree(scratch);
        free(ids), free(dy), free(dy16), free(table), free(want), free(got);
    }
    cudaStreamDestroy(st);
}

/* The kernels' rounding to half (__float2half_rn through tg_st / tg_h16::pack) is the
 * CPU's (tg_f16_from_f32) bit for bit: EMBEDDING gathers fp32 table rows into a half
 * output, vectorised (D = 4: 4 halves packed per 8-byte store) and element by element
 * (D = 3), over the edges (the largest half 65504, the first value rounding to infinity
 * 65520 and the last one that does not, the smallest subnormal 2^-24 and the halfway
 * 2^-25 that rounds to zero, signed zeros, infinities, values far out of range), ties
 * between neighbouring halves (to even), and random floats across and past half's range.
 * NaN is left out: the CPU keeps the payload, __float2half_rn gives the canonical NaN. */
TG_TEST(test_gpu_f16_rounding_matches_cpu) {
    (void)test_seed(53);
    static const float edges[] = {0.0f,     -0.0f,     1.0f,       -1.0f,      65504.0f, -65504.0f,  65519.996f,
                                  65520.0f, -65520.0f, 1e6f,       -1e30f,     INFINITY, -INFINITY,  0x1p-24f,
                                  0x1p-25f, 0x1.8p-25f, -0x1p-25f, 0x1p-14f,   0x1.ff8p-15f, 0x1p-26f, 3.14159265f};
    const int n_edges = (int)(sizeof edges / sizeof edges[0]);
    const int V = 6000;
    float *values = malloc(sizeof *values * V);
    REQUIRE(values, "out of memory");
    for (int i = 0; i < V; i++) {
        if (i < n_edges) {
            values[i] = edges[i];
        } else if (i % 3 == 0) { /* halfway between a finite half and the next one up (to even: either way) */
            uint16_t h = (uint16_t)(next_u32() % 0x7bffu);
            values[i] = 0.5f * (tg_f32_from_f16(h) + tg_f32_from_f16((uint16_t)(h + 1))) * (next_u32() & 1 ? -1.0f : 1.0f);
        } else { /* any sign, exponents 2^-30 .. 2^20, any mantissa */
            uint32_t bits = (next_u32() & 0x807fffffu) | ((uint32_t)(97 + next_u32() % 51) << 23);
            memcpy(&values[i], &bits, 4);
        }
    }
    cudaStream_t st;
    REQUIRE(cudaStreamCreate(&st) == cudaSuccess, "cudaStreamCreate");
    for (int D = 3; D <= 4; D++) {
        const int rows = V / D, N = rows;
        int32_t *ids = malloc(sizeof *ids * N);
        uint16_t *want = malloc(sizeof *want * N * D), *got = malloc(sizeof *got * N * D);
        REQUIRE(ids && want && got, "out of memory");
        for (int r = 0; r < N; r++) ids[r] = r;
        for (int i = 0; i < N * D; i++) want[i] = tg_f16_from_f32(values[i]);
        tg_op op = tg_test_op(TG_OP_EMBEDDING);
        op.in[0] = 0, op.in[1] = 1, op.out[0] = 2;
        op.p.embedding = (tg_embedding_params){.n = N, .vocab = rows, .dim = D, .padding_idx = -1};
        void *d_ids, *d_table, *d_out;
        REQUIRE(cudaMalloc(&d_ids, sizeof *ids * N) == cudaSuccess &&
                    cudaMalloc(&d_table, sizeof(float) * (size_t)(N * D)) == cudaSuccess &&
                    cudaMalloc(&d_out, 2 * (size_t)(N * D)) == cudaSuccess,
                "cudaMalloc");
        cudaMemcpy(d_ids, ids, sizeof *ids * N, cudaMemcpyHostToDevice);
        cudaMemcpy(d_table, values, sizeof(float) * (size_t)(N * D), cudaMemcpyHostToDevice);
        cudaMemset(d_out, 0xff, 2 * (size_t)(N * D)); /* NaN: an unwritten element differs */
        tg_cuda_ctx ctx = {.stream = st};
        tg_cuda_op_args g = {.op = &op, .in = {d_ids, d_table}, .out = {d_out}, .in_numel = {N, (int64_t)N * D},
                             .out_numel = {(int64_t)N * D}, .in_dtype = {TG_I32, TG_F32}, .out_dtype = {TG_F16},
                             .training = 1, .ctx = &ctx};
        tg_err err;
        CHECK(tg_cuda_op_run(&g, &err) == 0, "D=%d: %s", D, err.msg);
        CHECK(cudaStreamSynchronize(st) == cudaSuccess, "D=%d: %s", D, cudaGetErrorString(cudaGetLastError()));
        cudaMemcpy(got, d_out, 2 * (size_t)(N * D), cudaMemcpyDeviceToHost);
        int bad = 0;
        for (int i = 0; i < N * D; i++)
            if (got[i] != want[i] && bad++ < 5)
                CHECK(0, "D=%d: %a rounded to half 0x%04x on the GPU, 0x%04x on the CPU", D, values[i], got[i], want[i]);
        CHECK(bad == 0, "D=%d: %d of %d values rounded differently", D, bad, N * D);
        cudaFree(d_ids), cudaFree(d_table), cudaFree(d_out);
        free(ids), free(want), free(got);
    }
    cudaStreamDestroy(st);
    free(values);
}
