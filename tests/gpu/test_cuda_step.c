/* Whole training steps on the CUDA executor: against the CPU reference (loss and every
 * gradient after 3 steps, dropout on), captured-graph replay against op-by-op launches
 * (bit for bit), and two runs of one seed (bit for bit). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "kernels/cudnn_attention.h"
#include "models/model_config.h"
#include "runtime/cuda/cuda_exec.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

typedef struct run {
    tg_plan plan;
    tg_trainer tr;
    int open;
} run;

static int g_precision = TG_PREC_FP32;
static int g_fuse_gelu = 1;
static int g_fuse_qkv = 1; /* BERT/RoBERTa: one packed q|k|v product (the default) */
static const char *g_freeze = ""; /* the job's freeze patterns */
static int g_lora_r;               /* Llama: LoRA's rank (0: none) on every projection */
static int g_llama_dh64;           /* Llama: hidden 128 in 2 query heads of 64 over 1 kv head */
static float g_loss_scale_init;   /* fp16 plans: the job's loss_scale_init; 0: the default (2^16) */
static int g_loss_scale_interval; /* fp16 plans: loss_scale_growth_interval; 0: the default (2000) */

static int open_run(run *r, const char *preset, int task, tg_device device, int no_graphs, uint64_t seed) {
    memset(r, 0, sizeof *r);
    tg_err err;
    tg_model_config cfg;
    if (!CHECK(tg_model_config_load(preset, &cfg, &err) == 0, "%s", err.msg)) return 0;
    if (g_llama_dh64 && cfg.arch == TG_ARCH_LLAMA) cfg.hidden = 128, cfg.heads = 2, cfg.kv_heads = 1;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", preset);
    job.task = task, job.num_labels = 3, job.batch = 4, job.seq = 24, job.steps = 10, job.seed = seed;
    job.lr = 1e-3f, job.warmup_steps = 2, job.precision = g_precision, job.fuse_gelu = g_fuse_gelu;
    job.fuse_qkv = g_fuse_qkv;
    if (task == TG_TASK_CLASSIFY && cfg.pad_token_id < 0) job.pad_token_id = 0; /* tiny-llama's config has none */
    snprintf(job.freeze, sizeof job.freeze, "%s", g_freeze);
    if (g_lora_r) {
        job.lora_r = g_lora_r, job.lora_alpha = 16.0f, job.lora_dropout = 0.1f;
        snprintf(job.lora_targets, sizeof job.lora_targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    }
    if (g_loss_scale_init > 0) job.loss_scale_init = g_loss_scale_init;
    if (g_loss_scale_interval > 0) job.loss_scale_growth_interval = g_loss_scale_interval;
    if (!CHECK(tg_compile_with_config(&job, &cfg, &r->plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = device, .threads = 0, .load_data = 0, .no_graphs = no_graphs};
    if (!CHECK(tg_trainer_open(&r->tr, &r->plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&r->plan);
        return 0;
    }
    r->open = 1;
    return 1;
}

static void close_run(run *r) {
    if (!r->open) return;
    tg_trainer_close(&r->tr);
    tg_plan_free(&r->plan);
    r->open = 0;
}

/* Step-dependent but run-independent inputs. */
static void fill_inputs(run *r, int step) {
    const tg_plan *p = &r->plan;
    const tg_plan_io *io = &p->io;
    int B = p->train.batch, T = p->train.seq, V = p->model.vocab_size;
    int32_t *ids = tg_trainer_input(&r->tr, io->input_ids), *pos = tg_trainer_input(&r->tr, io->position_ids);
    int32_t *labels = tg_trainer_input(&r->tr, io->labels), *types = tg_trainer_input(&r->tr, io->token_type_ids);
    float *mask = tg_trainer_input(&r->tr, io->attention_mask);
    uint64_t s = 0x1234567ull + (uint64_t)step * 7919;
    for (int b = 0; b < B; b++) {
        int len = T - 5 * b;
        for (int t = 0; t < T; t++) {
            int i = b * T + t;
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = t < len ? (int32_t)(1 + (s >> 33) % (uint64_t)(V - 2)) : 0;
            mask[i] = t < len;
            pos[i] = p->model.arch == TG_ARCH_ROBERTA ? (t < len ? p->model.pad_token_id + 1 + t : p->model.pad_token_id) : t;
            if (types) types[i] = 0;
            if (p->train.task == TG_TASK_LM) labels[i] = t + 1 < len ? (int32_t)((s >> 40) % (uint64_t)V) : TG_IGNORE_INDEX;
        }
        if (p->train.task == TG_TASK_CLASSIFY) labels[b] = b % 3;
    }
}

static float *read_all_trainer(tg_trainer *tr, int tensor, size_t bytes) {
    tg_err err;
    float *buf = malloc(bytes);
    if (buf && !CHECK(tg_trainer_read(tr, tensor, buf, &err) == 0, "%s", err.msg)) {
        free(buf);
        return NULL;
    }
    return buf;
}

static float *read_all(run *r, int tensor) { return read_all_trainer(&r->tr, tensor, r->plan.tensors[tensor].bytes); }

static void compare_with_cpu(const char *preset, int task) {
    run cpu, gpu;
    if (!open_run(&cpu, preset, task, TG_DEVICE_CPU, 0, 5)) return;
    if (!open_run(&gpu, preset, task, TG_DEVICE_CUDA, 0, 5)) {
        close_run(&cpu);
        return;
    }
    tg_err err;
    /* The default plan: the residual adds, their dropout and LayerNorms fused (Llama: each
     * block's two RMSNorms, and the final one). */
    const int llama = gpu.plan.model.arch == TG_ARCH_LLAMA;
    const int norm_bwd = llama ? TG_OP_RMSNORM_BWD : TG_OP_RESIDUAL_LAYERNORM_BWD;
    int fused = 0;
    for (int o = 0; o < gpu.plan.n_ops; o++) fused += gpu.plan.ops[o].kind == norm_bwd;
    /* With LoRA the base is frozen: the first RMSNorm, over the frozen embeddings, has no
     * backward. */
    CHECK(fused == 2 * gpu.plan.model.layers + llama - (g_lora_r > 0), "%s: %d %s ops", preset, fused,
          tg_op_name(norm_bwd));
    for (int step = 0; step < 3; step++) {
        tg_step_stats a, b;
        fill_inputs(&cpu, step);
        fill_inputs(&gpu, step);
        if (!CHECK(tg_trainer_run_step(&cpu.tr, &a, &err) == 0, "%s", err.msg) ||
            !CHECK(tg_trainer_run_step(&gpu.tr, &b, &err) == 0, "%s", err.msg))
            break;
        CHECK(fabsf(a.loss - b.loss) <= 1e-4f * fabsf(a.loss), "%s step %d: loss cpu %.7g cuda %.7g", preset, step,
              a.loss, b.loss);
        CHECK(fabsf(a.grad_norm - b.grad_norm) <= 1e-4f * a.grad_norm, "%s step %d: grad norm %.7g vs %.7g", preset,
              step, a.grad_norm, b.grad_norm);
    }
    /* Every gradient of step 3, and every parameter after it. */
    float *ga = read_all(&cpu, cpu.plan.io.grads_all), *gb = read_all(&gpu, gpu.plan.io.grads_all);
    float *pa = read_all(&cpu, cpu.plan.io.params_all), *pb = read_all(&gpu, gpu.plan.io.params_all);
    double grad_max = 0;
    int64_t total = (int64_t)(cpu.plan.pool_bytes[TG_POOL_GRADS] / 4), left_out = 0;
    for (int64_t i = 0; ga && i < total; i++) grad_max = fmax(grad_max, fabs(ga[i]));
    for (int t = 0; ga && gb && pa && pb && t < cpu.plan.n_tensors; t++) {
        const tg_tensor *x = &cpu.plan.tensors[t];
        if (!(x->flags & TG_TENSOR_PARAM) || (x->flags & TG_TENSOR_VIEW)) continue;
        int64_t off = (int64_t)(x->offset / 4), n = tg_tensor_numel(x);
        /* A gradient of pure rounding noise (attention key biases) matches in size, not
         * in value: it passes on an absolute floor far below real gradients. */
        double rg = tg_rel_err(gb + off, ga + off, n), dg = tg_l2_diff(gb + off, ga + off, n);
        double rp = tg_rel_err_after_update(pb + off, pa + off, ga + off, gb + off, n, 1e-9 * grad_max, &left_out);
        CHECK(rg <= 1e-4 || dg <= 1e-9 * grad_max, "%s: gradient of %s: relative error %.3g", preset, x->name, rg);
        CHECK(rp <= 1e-4, "%s: %s after 3 steps: relative error %.3g", preset, x->name, rp);
    }
    CHECK(left_out <= (int64_t)cpu.plan.model.layers * cpu.plan.model.hidden + total / 1000,
          "%s: %lld elements with noise-level gradients", preset, (long long)left_out);
    free(ga), free(gb), free(pa), free(pb);
    close_run(&cpu);
    close_run(&gpu);
}

TG_TEST(test_gpu_step_bert_matches_cpu) { compare_with_cpu("tiny-bert", TG_TASK_CLASSIFY); }
/* RoBERTa's packed q|k|v groups, and BERT with three separate projections. */
TG_TEST(test_gpu_step_roberta_matches_cpu) { compare_with_cpu("tiny-roberta", TG_TASK_CLASSIFY); }
TG_TEST(test_gpu_step_bert_separate_qkv_matches_cpu) {
    g_fuse_qkv = 0;
    compare_with_cpu("tiny-bert", TG_TASK_CLASSIFY);
    g_fuse_qkv = 1;
}
/* GPT-2's MLP runs with the GELU in its matmuls (fuse_gelu, the default); fp32 products
 * take the plain product plus the GELU kernels. */
TG_TEST(test_gpu_step_gpt2_matches_cpu) { compare_with_cpu("tiny-gpt2", TG_TASK_LM); }
/* Llama: RMSNorm, rotary grouped-query attention and SwiGLU through captured steps. */
TG_TEST(test_gpu_step_llama_matches_cpu) { compare_with_cpu("tiny-llama", TG_TASK_LM); }
/* LoRA on every projection (the projections made apart, the adapters' dropout, the base
 * frozen), LM and classification. */
TG_TEST(test_gpu_step_llama_lora_matches_cpu) {
    g_lora_r = 4;
    compare_with_cpu("tiny-llama", TG_TASK_LM);
    compare_with_cpu("tiny-llama", TG_TASK_CLASSIFY);
    g_lora_r = 0;
}
/* Masked LM: the captured step masks on the device at each step's counter, as the CPU does
 * (other masks every step), through the tied decoder. */
TG_TEST(test_gpu_step_bert_mlm_matches_cpu) { compare_with_cpu("tiny-bert", TG_TASK_MLM); }
TG_TEST(test_gpu_step_roberta_mlm_matches_cpu) { compare_with_cpu("tiny-roberta", TG_TASK_MLM); }
TG_TEST(test_gpu_step_gpt2_separate_gelu_matches_cpu) {
    g_fuse_gelu = 0;
    compare_with_cpu("tiny-gpt2", TG_TASK_LM);
    g_fuse_gelu = 1;
}

/* Three steps of runs r[0..n) on fill_inputs' batches: each later run's loss within 2e-2
 * and gradient norm within 5e-2 of run 0's (bf16 activations round differently along
 * the paths). Returns the steps every run took. */
static int steps_agree(run *r, int n, const char *const *names, const char *what) {
    tg_err err;
    for (int step = 0; step < 3; step++) {
        tg_step_stats st[4];
        for (int k = 0; k < n; k++) {
            fill_inputs(&r[k], step);
            if (!CHECK(tg_trainer_run_step(&r[k].tr, &st[k], &err) == 0, "%s %s: %s", what, names[k], err.msg)) return step;
        }
        for (int k = 1; k < n; k++) {
            CHECK(isfinite(st[k].loss) && fabsf(st[k].loss - st[0].loss) <= 2e-2f * fabsf(st[0].loss),
                  "%s step %d: loss %s %.7g, %s %.7g", what, step, names[k], st[k].loss, names[0], st[0].loss);
            CHECK(isfinite(st[k].grad_norm) && fabsf(st[k].grad_norm - st[0].grad_norm) <= 5e-2f * st[0].grad_norm,
                  "%s step %d: gradient norm %s %.7g, %s %.7g", what, step, names[k], st[k].grad_norm, names[0],
                  st[0].grad_norm);
        }
    }
    return 3;
}

/* Llama steps in bf16 with cuDNN's attention on right-padded rows (fill_inputs' lengths
 * 24, 19, 14 and 9 of 24), against the CPU reference and the own attention kernels, LM and
 * classification: cuDNN leaves the causal ops' key mask out (kernels/cudnn_attention.h),
 * which changes only padding rows, so three steps' losses (2e-2 of the CPU's) and gradient
 * norms (5e-2), and after them every trainable gradient (2e-2 of the own kernels', bf16's
 * tolerance), agree. A wrong leave-out (a real row seeing a padding key) moves the loss of
 * these short rows far past that. Skipped where cuDNN does not load. */
static void llama_cudnn_padded(int task) {
    tg_cudnn_attention *probe = NULL;
    char why[256];
    tg_err err;
    setenv("TUNEGRAPH_ATTENTION", "auto", 1);
    if (!CHECK(tg_cudnn_attention_open(&probe, why, sizeof why, &err) == 0, "%s", err.msg)) return;
    if (!probe) {
        printf("    skipped: cuDNN is not there (%s)\n", why);
        return;
    }
    tg_cudnn_attention_close(probe);
    static const char *const names[3] = {"cpu", "cuda own", "cuda cudnn"};
    static const char *const backend[3] = {"auto", "own", "cudnn"};
    const tg_device device[3] = {TG_DEVICE_CPU, TG_DEVICE_CUDA, TG_DEVICE_CUDA};
    g_precision = TG_PREC_BF16, g_llama_dh64 = 1;
    run r[3];
    int opened = 0;
    for (int k = 0; k < 3; k++) {
        /* TUNEGRAPH_ATTENTION=cudnn: an op cuDNN should take and cannot fails the open. */
        setenv("TUNEGRAPH_ATTENTION", backend[k], 1);
        if (!open_run(&r[k], "tiny-llama", task, device[k], 0, 5)) break;
        opened++;
    }
    setenv("TUNEGRAPH_ATTENTION", "auto", 1);
    g_precision = TG_PREC_FP32, g_llama_dh64 = 0;
    if (opened == 3 && steps_agree(r, 3, names, task == TG_TASK_LM ? "lm" : "classify") == 3) {
        const tg_plan *p = &r[1].plan;
        int compared = 0;
        for (int t = 0; t < p->n_tensors; t++) {
            const tg_tensor *x = &p->tensors[t];
            if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) != TG_CLASS_TRAINABLE || x->grad < 0 ||
                p->tensors[x->grad].dtype != TG_F32)
                continue;
            float *own = read_all(&r[1], x->grad), *dnn = read_all(&r[2], x->grad);
            if (own && dnn) {
                const double rel = tg_rel_err(dnn, own, tg_tensor_numel(&p->tensors[x->grad]));
                CHECK(rel <= 2e-2, "task %d: gradient of %s: cuDNN against the own kernels %.3g", task, x->name, rel);
                compared++;
            }
            free(own), free(dnn);
        }
        CHECK(compared >= 10, "task %d: %d gradients compared", task, compared);
    }
    for (int k = 0; k < opened; k++) close_run(&r[k]);
}

TG_TEST(test_gpu_step_llama_cudnn_padded_matches_own) {
    llama_cudnn_padded(TG_TASK_LM);
    llama_cudnn_padded(TG_TASK_CLASSIFY);
}

/* bf16 GPT-2 steps with the cuBLASLt GELU epilogues (GELU_AUX_BIAS, DGELU) against the CPU
 * reference of the same plan and against the GPU with separate GELU ops (fuse_gelu =
 * false): three steps, the loss within 2e-2 and the gradient norm within 5e-2 relative
 * (bf16 activations round differently along the three paths). */
TG_TEST(test_gpu_step_gpt2_gelu_epilogue_bf16) {
    g_precision = TG_PREC_BF16;
    run r[3];
    const tg_device device[3] = {TG_DEVICE_CPU, TG_DEVICE_CUDA, TG_DEVICE_CUDA};
    const int fuse[3] = {1, 1, 0};
    int opened = 0;
    for (int k = 0; k < 3; k++) {
        g_fuse_gelu = fuse[k];
        if (!open_run(&r[k], "tiny-gpt2", TG_TASK_LM, device[k], 0, 5)) break;
        opened++;
    }
    g_fuse_gelu = 1;
    g_precision = TG_PREC_FP32;
    static const char *const names[3] = {"cpu fused", "cuda fused", "cuda separate"};
    if (opened == 3) steps_agree(r, 3, names, "gpt2");
    for (int k = 0; k < opened; k++) close_run(&r[k]);
}

/* A job with a freeze, three steps on the CPU and on CUDA: the loss and gradient norm of
 * each step agree (to 1e-4 in fp32; to 2e-2 and 5e-2 in bf16, whose activations round
 * differently), in fp32 so does every trainable parameter's gradient and value, and the
 * frozen tensors (bf16 ones narrowed on upload, the bf16 copy of a frozen tied table) hold
 * on the GPU exactly what the CPU holds. */
static void frozen_matches_cpu(const char *preset, int task, int precision, const char *freeze) {
    g_precision = precision, g_freeze = freeze;
    run r[2];
    int opened = open_run(&r[0], preset, task, TG_DEVICE_CPU, 0, 5);
    opened += opened && open_run(&r[1], preset, task, TG_DEVICE_CUDA, 0, 5);
    g_precision = TG_PREC_FP32, g_freeze = "";
    const float loss_tol = precision == TG_PREC_FP32 ? 1e-4f : 2e-2f, norm_tol = precision == TG_PREC_FP32 ? 1e-4f : 5e-2f;
    tg_err err;
    int frozen = 0;
    for (int t = 0; opened == 2 && t < r[0].plan.n_tensors; t++) frozen += tg_tensor_class_of(&r[0].plan.tensors[t]) == TG_CLASS_FROZEN;
    CHECK(opened < 2 || frozen > 0, "%s: nothing frozen", preset);
    for (int step = 0; opened == 2 && step < 3; step++) {
        tg_step_stats st[2];
        fill_inputs(&r[0], step);
        fill_inputs(&r[1], step);
        if (!CHECK(tg_trainer_run_step(&r[0].tr, &st[0], &err) == 0, "%s", err.msg) ||
            !CHECK(tg_trainer_run_step(&r[1].tr, &st[1], &err) == 0, "%s", err.msg))
            break;
        CHECK(isfinite(st[1].loss) && fabsf(st[1].loss - st[0].loss) <= loss_tol * fabsf(st[0].loss),
              "%s step %d: loss cpu %.7g cuda %.7g", preset, step, st[0].loss, st[1].loss);
        CHECK(fabsf(st[1].grad_norm - st[0].grad_norm) <= norm_tol * st[0].grad_norm,
              "%s step %d: grad norm cpu %.7g cuda %.7g", preset, step, st[0].grad_norm, st[1].grad_norm);
    }
    const tg_plan *p = &r[0].plan;
    if (opened == 2 && precision == TG_PREC_FP32) {
        float *ga = read_all(&r[0], p->io.grads_all), *gb = read_all(&r[1], p->io.grads_all);
        float *pa = read_all(&r[0], p->io.params_all), *pb = read_all(&r[1], p->io.params_all);
        double grad_max = 0;
        int64_t total = (int64_t)(p->pool_bytes[TG_POOL_GRADS] / 4), left_out = 0;
        for (int64_t i = 0; ga && i < total; i++) grad_max = fmax(grad_max, fabs(ga[i]));
        for (int t = 0; ga && gb && pa && pb && t < p->n_tensors; t++) {
            const tg_tensor *x = &p->tensors[t];
            if (!tg_tensor_is_value(x) || tg_tensor_class_of(x) != TG_CLASS_TRAINABLE) continue;
            int64_t off = (int64_t)(x->offset / 4), n = tg_tensor_numel(x);
            double rg = tg_rel_err(gb + off, ga + off, n), dg = tg_l2_diff(gb + off, ga + off, n);
            double rp = tg_rel_err_after_update(pb + off, pa + off, ga + off, gb + off, n, 1e-9 * grad_max, &left_out);
            CHECK(rg <= 1e-4 || dg <= 1e-9 * grad_max, "%s: gradient of %s: relative error %.3g", preset, x->name, rg);
            CHECK(rp <= 1e-4, "%s: %s after 3 steps: relative error %.3g", preset, x->name, rp);
        }
        free(ga), free(gb), free(pa), free(pb);
    }
    for (int t = 0; opened == 2 && t < p->n_tensors; t++) {
        const tg_tensor *x = &p->tensors[t];
        if (tg_tensor_class_of(x) != TG_CLASS_FROZEN || (x->flags & TG_TENSOR_VIEW)) continue;
        void *a = read_all(&r[0], t), *b = read_all(&r[1], t);
        CHECK(a && b && memcmp(a, b, x->bytes) == 0, "%s: frozen %s differs between the CPU and CUDA", preset, x->name);
        free(a), free(b);
    }
    for (int k = 0; k < opened; k++) close_run(&r[k]);
}

TG_TEST(test_gpu_step_frozen_bert_matches_cpu) {
    frozen_matches_cpu("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, "bert.embeddings.*, bert.encoder.layer.0.*");
}
TG_TEST(test_gpu_step_frozen_bert_bf16_matches_cpu) {
    frozen_matches_cpu("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, "bert.embeddings.*, bert.encoder.layer.0.*");
}
/* The tied table frozen: bf16 plans read a bf16 copy of it in the LM head. */
TG_TEST(test_gpu_step_frozen_gpt2_matches_cpu) {
    frozen_matches_cpu("tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, "transformer.wte.*, transformer.wpe.*, transformer.h.0.*");
}
TG_TEST(test_gpu_step_frozen_gpt2_bf16_matches_cpu) {
    frozen_matches_cpu("tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, "transformer.wte.*, transformer.wpe.*, transformer.h.0.*");
}

/* Runs `steps` steps and returns the final parameters (and losses). */
static float *train_gpu(const char *preset, int task, int no_graphs, uint64_t seed, int steps, float *losses) {
    run r;
    if (!open_run(&r, preset, task, TG_DEVICE_CUDA, no_graphs, seed)) return NULL;
    tg_err err;
    for (int s = 0; s < steps; s++) {
        tg_step_stats st;
        fill_inputs(&r, s);
        if (!CHECK(tg_trainer_run_step(&r.tr, &st, &err) == 0, "%s", err.msg)) break;
        losses[s] = st.loss;
    }
    float *params = read_all(&r, r.plan.io.params_all);
    close_run(&r);
    return params;
}

static size_t params_bytes(const char *preset, int task) {
    run r;
    if (!open_run(&r, preset, task, TG_DEVICE_CPU, 0, 1)) return 0;
    size_t n = r.plan.pool_bytes[TG_POOL_PARAMS];
    close_run(&r);
    return n;
}

TG_TEST(test_gpu_graph_replay_matches_stream) {
    const char *presets[] = {"tiny-bert", "tiny-gpt2", "tiny-bert", "tiny-gpt2"};
    int tasks[] = {TG_TASK_CLASSIFY, TG_TASK_LM, TG_TASK_CLASSIFY, TG_TASK_LM};
    for (int i = 0; i < 4; i++) {
        g_precision = i < 2 ? TG_PREC_FP32 : TG_PREC_BF16;
        float la[6], lb[6];
        float *a = train_gpu(presets[i], tasks[i], 0, 9, 6, la), *b = train_gpu(presets[i], tasks[i], 1, 9, 6, lb);
        size_t n = params_bytes(presets[i], tasks[i]);
        CHECK(a && b && n && memcmp(a, b, n) == 0, "%s: graph replay and stream launches differ", presets[i]);
        CHECK(memcmp(la, lb, sizeof la) == 0, "%s: losses differ", presets[i]);
        free(a), free(b);
    }
    g_precision = TG_PREC_FP32;
}

/* fp16 plans: the captured step graph against op-by-op launches, bit for bit (losses,
 * parameters, their half copies, the loss scale and its growth tracker), BERT classify and
 * GPT-2 LM, with a scale that overflows the first steps (skipped, halved) and one that
 * grows (interval 2) within the 6 steps. TUNEGRAPH_GEMM_TUNE=0: the two runs take the
 * heuristic's GEMMs (a timed pick can differ from one run to the next). */
static float *train_gpu_fp16(const char *preset, int task, int no_graphs, int steps, float *losses, float *scales,
                             void **copies, size_t *copies_bytes, float *scale_state) {
    run r;
    *copies = NULL, *copies_bytes = 0;
    if (!open_run(&r, preset, task, TG_DEVICE_CUDA, no_graphs, 9)) return NULL;
    tg_err err;
    for (int s = 0; s < steps; s++) {
        tg_step_stats st;
        fill_inputs(&r, s);
        if (!CHECK(tg_trainer_run_step(&r.tr, &st, &err) == 0, "%s", err.msg)) break;
        losses[s] = st.loss, scales[s] = st.loss_scale;
    }
    float *params = read_all(&r, r.plan.io.params_all);
    *copies = read_all(&r, r.plan.io.params_bf16_all);
    *copies_bytes = r.plan.tensors[r.plan.io.params_bf16_all].bytes;
    scale_state[0] = scale_state[1] = -1.0f;
    CHECK(tg_trainer_read_f32(&r.tr, r.plan.io.loss_scale, &scale_state[0], &err) == 0 &&
              tg_trainer_read_f32(&r.tr, r.plan.io.loss_scale_growth, &scale_state[1], &err) == 0,
          "%s", err.msg);
    close_run(&r);
    return params;
}

TG_TEST(test_gpu_graph_replay_matches_stream_fp16) {
    const char *presets[] = {"tiny-bert", "tiny-gpt2", "tiny-bert", "tiny-gpt2"};
    const int tasks[] = {TG_TASK_CLASSIFY, TG_TASK_LM, TG_TASK_CLASSIFY, TG_TASK_LM};
    const float init[] = {0x1p40f, 0x1p40f, 16.0f, 16.0f};
    const int interval[] = {0, 0, 2, 2};
    const char *tune = getenv("TUNEGRAPH_GEMM_TUNE");
    char *tune_saved = tune ? strdup(tune) : NULL;
    setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
    for (int i = 0; i < 4; i++) {
        g_precision = TG_PREC_FP16, g_loss_scale_init = init[i], g_loss_scale_interval = interval[i];
        float la[6] = {0}, lb[6] = {0}, sa[6] = {0}, sb[6] = {0}, ta[2] = {0}, tb[2] = {0};
        void *ca, *cb;
        size_t na = 0, nb = 0;
        float *a = train_gpu_fp16(presets[i], tasks[i], 0, 6, la, sa, &ca, &na, ta);
        float *b = train_gpu_fp16(presets[i], tasks[i], 1, 6, lb, sb, &cb, &nb, tb);
        g_precision = TG_PREC_FP32, g_loss_scale_init = 0, g_loss_scale_interval = 0;
        size_t n = params_bytes(presets[i], tasks[i]);
        CHECK(a && b && n && memcmp(a, b, n) == 0, "%s fp16 (scale %g): graph replay and stream launches differ",
              presets[i], init[i]);
        CHECK(ca && cb && na && na == nb && memcmp(ca, cb, na) == 0, "%s fp16 (scale %g): the half copies differ",
              presets[i], init[i]);
        CHECK(memcmp(la, lb, sizeof la) == 0 && memcmp(sa, sb, sizeof sa) == 0 && memcmp(ta, tb, sizeof ta) == 0,
              "%s fp16 (scale %g): losses or loss scales differ", presets[i], init[i]);
        /* The runs did what they were set up for: skips halving 2^40, or growth from 16
         * (interval 2: doubled after steps 2, 4 and 6, none of which overflows at 16..128). */
        CHECK(init[i] > 65536.0f ? sa[0] == init[i] / 2 : sa[5] == 8 * init[i], "%s fp16: scales %g .. %g from %g",
              presets[i], sa[0], sa[5], init[i]);
        free(a), free(b), free(ca), free(cb);
    }
    if (tune_saved) setenv("TUNEGRAPH_GEMM_TUNE", tune_saved, 1);
    else unsetenv("TUNEGRAPH_GEMM_TUNE");
    free(tune_saved);
    g_precision = TG_PREC_FP32, g_loss_scale_init = 0, g_loss_scale_interval = 0;
}

/* fp16 training on CUDA against the CPU executor on the same plan (BERT classify, GPT-2
 * LM), step by step: the same steps skipped (a non-finite gradient norm on both, or on
 * neither) and the same loss scale after every step, bit for bit (powers of two moved by
 * the same rule on the same skips); each loss within 5e-3 and each applied step's gradient
 * norm within 1e-2 relative (bf16's 2e-2 and 5e-2 for the same comparison, scaled by half's
 * 8 times smaller rounding, with a factor 2 of margin); and after the run the parameters
 * within 2e-3 relative (L2 over the whole parameter pool, whose norm the LayerNorm gains
 * of 1 dominate), leaving out the elements whose last gradients the two executors disagree
 * on by more than half: rounding noise (the attention key biases, whose gradient is zero
 * but for rounding), which Adam moves by about lr either way; at most layers x hidden of
 * them plus 1% of the pool. An element moved the wrong way by lr on each of 3 steps shifts
 * the pool by about 5e-3 in L2, so 2e-3 of a pool of norm ~13 (the tiny presets) allows a
 * few dozen such elements and no systematic error. Two scales: the default (2^16) for 4 steps,
 * and 2^40, whose first steps overflow (skipped, the scale halving: 2^39 after the first),
 * until 2 steps after the first applied one (at most 64 steps); either run goes on until
 * a step is applied. scale_init 0: the job's default. */
static void fp16_matches_cpu(const char *preset, int task, float scale_init, int min_steps) {
    g_precision = TG_PREC_FP16, g_loss_scale_init = scale_init;
    run r[2];
    int opened = open_run(&r[0], preset, task, TG_DEVICE_CPU, 0, 5);
    opened += opened && open_run(&r[1], preset, task, TG_DEVICE_CUDA, 0, 5);
    g_precision = TG_PREC_FP32, g_loss_scale_init = 0;
    tg_err err;
    int applied = 0, steps = 0, last_skipped = 0;
    /* The update is not deferred in fp16 plans (runtime/cuda/cuda_exec.c says why). */
    if (opened == 2) CHECK(!((tg_cuda_exec *)r[1].tr.ex.impl)->defer_on, "%s: fp16 update deferred", preset);
    /* Ends on an applied step: the parameter check's noise floor reads its gradients. */
    for (int step = 0; opened == 2 && step < 64 && (step < min_steps || applied < 3 || last_skipped); step++) {
        tg_step_stats st[2];
        fill_inputs(&r[0], step);
        fill_inputs(&r[1], step);
        if (!CHECK(tg_trainer_run_step(&r[0].tr, &st[0], &err) == 0, "%s", err.msg) ||
            !CHECK(tg_trainer_run_step(&r[1].tr, &st[1], &err) == 0, "%s", err.msg))
            break;
        steps++;
        CHECK(st[1].skipped == st[0].skipped && st[1].loss_scale == st[0].loss_scale,
              "%s (scale %g) step %d: skipped cpu %d cuda %d, loss scale cpu %a cuda %a", preset, scale_init, step,
              st[0].skipped, st[1].skipped, st[0].loss_scale, st[1].loss_scale);
        CHECK(st[0].loss_scale > 0.0f, "%s step %d: no loss scale reported", preset, step);
        if (step == 0 && scale_init > 65536.0f)
            CHECK(st[0].skipped && st[1].skipped && st[1].loss_scale == scale_init / 2,
                  "%s: a first step at scale %g applied (cpu %d cuda %d) or did not halve it (%a)", preset, scale_init,
                  !st[0].skipped, !st[1].skipped, st[1].loss_scale);
        CHECK(isfinite(st[1].loss) && fabsf(st[1].loss - st[0].loss) <= 5e-3f * fabsf(st[0].loss),
              "%s (scale %g) step %d: loss cpu %.7g cuda %.7g", preset, scale_init, step, st[0].loss, st[1].loss);
        if (st[0].skipped)
            CHECK(!isfinite(st[0].grad_norm) && !isfinite(st[1].grad_norm), "%s step %d: skipped with norms %g %g",
                  preset, step, st[0].grad_norm, st[1].grad_norm);
        else
            CHECK(fabsf(st[1].grad_norm - st[0].grad_norm) <= 1e-2f * st[0].grad_norm,
                  "%s (scale %g) step %d: grad norm cpu %.7g cuda %.7g", preset, scale_init, step, st[0].grad_norm,
                  st[1].grad_norm);
        applied += !st[0].skipped, last_skipped = st[0].skipped;
    }
    CHECK(opened < 2 || (applied >= 3 && !last_skipped), "%s (scale %g): %d of %d steps applied, the last %s",
          preset, scale_init, applied, steps, last_skipped ? "skipped" : "applied");
    const tg_plan *p = &r[0].plan;
    if (opened == 2 && !last_skipped) {
        float *ga = read_all(&r[0], p->io.grads_all), *gb = read_all(&r[1], p->io.grads_all);
        float *pa = read_all(&r[0], p->io.params_all), *pb = read_all(&r[1], p->io.params_all);
        const int64_t total = tg_tensor_numel(&p->tensors[p->io.params_all]);
        int64_t noise = 0;
        double num = 0, den = 0;
        for (int64_t i = 0; ga && gb && pa && pb && i < total; i++) {
            const double a = ga[i], b = gb[i];
            if (fabs(a - b) > 0.5 * fmax(fabs(a), fabs(b))) {
                noise++;
                continue;
            }
            const double d = (double)pb[i] - (double)pa[i];
            num += isnan(d) ? INFINITY : d * d;
            den += (double)pa[i] * pa[i];
        }
        const double rp = sqrt(num) / fmax(sqrt(den), 1e-30);
        CHECK(ga && gb && pa && pb && rp <= 2e-3, "%s (scale %g): parameters after %d steps: relative error %.3g",
              preset, scale_init, steps, rp);
        CHECK(noise <= (int64_t)p->model.layers * p->model.hidden + total / 100,
              "%s (scale %g): %lld of %lld parameters with gradients the executors disagree on", preset, scale_init,
              (long long)noise, (long long)total);
        free(ga), free(gb), free(pa), free(pb);
    }
    for (int k = 0; k < opened; k++) close_run(&r[k]);
}

TG_TEST(test_gpu_step_fp16_bert_matches_cpu) {
    fp16_matches_cpu("tiny-bert", TG_TASK_CLASSIFY, 0.0f, 4);
    fp16_matches_cpu("tiny-bert", TG_TASK_CLASSIFY, 0x1p40f, 1);
}
TG_TEST(test_gpu_step_fp16_gpt2_matches_cpu) {
    fp16_matches_cpu("tiny-gpt2", TG_TASK_LM, 0.0f, 4);
    fp16_matches_cpu("tiny-gpt2", TG_TASK_LM, 0x1p40f, 1);
}

/* The step graph instantiated for device launch (the default) and as a plain graph
 * (TUNEGRAPH_HOST_GRAPH=1, the fallback) run the same nodes: bitwise-equal training. */
TG_TEST(test_gpu_host_launched_graph_matches) {
    g_precision = TG_PREC_BF16;
    float la[6], lb[6];
    float *a = train_gpu("tiny-gpt2", TG_TASK_LM, 0, 9, 6, la);
    setenv("TUNEGRAPH_HOST_GRAPH", "1", 1);
    float *b = train_gpu("tiny-gpt2", TG_TASK_LM, 0, 9, 6, lb);
    unsetenv("TUNEGRAPH_HOST_GRAPH");
    g_precision = TG_PREC_FP32;
    size_t n = params_bytes("tiny-gpt2", TG_TASK_LM);
    CHECK(a && b && n && memcmp(a, b, n) == 0, "device-launch and host-launch graphs differ");
    CHECK(memcmp(la, lb, sizeof la) == 0, "losses differ between device-launch and host-launch graphs");
    free(a), free(b);
}

TG_TEST(test_gpu_same_seed_bitwise_bf16) {
    float la[8], lb[8];
    g_precision = TG_PREC_BF16;
    float *a = train_gpu("tiny-bert", TG_TASK_CLASSIFY, 0, 21, 8, la), *b = train_gpu("tiny-bert", TG_TASK_CLASSIFY, 0, 21, 8, lb);
    size_t n = params_bytes("tiny-bert", TG_TASK_CLASSIFY);
    g_precision = TG_PREC_FP32;
    CHECK(a && b && n && memcmp(a, b, n) == 0, "two bf16 runs of one seed differ");
    CHECK(memcmp(la, lb, sizeof la) == 0, "bf16 losses differ between runs of one seed");
    free(a), free(b);
}

TG_TEST(test_gpu_same_seed_bitwise) {
    float la[8], lb[8], lc[8];
    float *a = train_gpu("tiny-gpt2", TG_TASK_LM, 0, 21, 8, la), *b = train_gpu("tiny-gpt2", TG_TASK_LM, 0, 21, 8, lb);
    float *c = train_gpu("tiny-gpt2", TG_TASK_LM, 0, 22, 8, lc);
    size_t n = params_bytes("tiny-gpt2", TG_TASK_LM);
    CHECK(a && b && n && memcmp(a, b, n) == 0, "two runs of one seed differ");
    CHECK(memcmp(la, lb, sizeof la) == 0, "losses differ between runs of one seed");
    CHECK(c && memcmp(a, c, n) != 0, "another seed gave the same parameters");
    free(a), free(b), free(c);
}

/* The GEMM algorithms chosen by one executor are written to the cache folder and taken
 * from it by the next, which then chooses nothing new and computes the same step. */
TG_TEST(test_gpu_gemm_cache_on_disk) {
    const char *dir = tg_test_tmpdir();
    char saved[1024] = "";
    const char *old = getenv("TUNEGRAPH_CACHE_DIR");
    if (old) snprintf(saved, sizeof saved, "%s", old);
    setenv("TUNEGRAPH_CACHE_DIR", dir, 1);
    run r;
    float *a = NULL, *b = NULL;
    int imported = 0, chosen = -1;
    for (int pass = 0; pass < 2; pass++) {
        if (!open_run(&r, "tiny-gpt2", TG_TASK_LM, TG_DEVICE_CUDA, 0, 3)) break;
        tg_err err;
        tg_step_stats st;
        fill_inputs(&r, 0);
        CHECK(tg_trainer_run_step(&r.tr, &st, &err) == 0, "%s", err.msg);
        tg_cuda_exec *x = (tg_cuda_exec *)r.tr.ex.impl; /* cuda_impl starts with its tg_cuda_exec */
        if (pass == 1) {
            imported = tg_gemm_cache_imported(x->ctx.gemm_cache);
            chosen = tg_gemm_cache_new_entries(x->ctx.gemm_cache);
            b = read_all(&r, r.plan.io.params_all);
        } else {
            a = read_all(&r, r.plan.io.params_all);
        }
        close_run(&r);
    }
    CHECK(tg_test_count_files(dir) == 1, "cache files in %s: %d", dir, tg_test_count_files(dir));
    CHECK(imported > 0 && chosen == 0, "second run imported %d algorithms and chose %d", imported, chosen);
    size_t n = params_bytes("tiny-gpt2", TG_TASK_LM);
    CHECK(a && b && n && memcmp(a, b, n) == 0, "a step with cached algorithms differs");
    free(a), free(b);
    if (saved[0]) setenv("TUNEGRAPH_CACHE_DIR", saved, 1);
}

/* One training run of a demo job (examples/): through tg_trainer_step with up to `depth`
 * steps in flight, `group` started together where they fit (each step fetches the next
 * batch on its branch beside the forward), or, with depth 0, batch by batch with
 * tg_trainer_next_batch + tg_trainer_run_step (each batch uploaded before its step).
 * defer 0 turns the deferred update off (TUNEGRAPH_DEFERRED_UPDATE=0); read_at > 0 reads
 * the parameters after that many steps (which applies a pending update) and trains on. */
typedef struct demo_run {
    const char *job;
    tg_device device;
    int depth, group, no_graphs, defer, read_at;
    const char *what;
    const char *set; /* one more job key=value, or NULL */
} demo_run;

/* Runs it for `steps` steps: each step's loss, and the final parameters into *params. */
static int train_demo(const demo_run *d, int steps, float *losses, float **params, size_t *params_bytes) {
    tg_err err;
    tg_job job;
    tg_plan plan;
    tg_trainer tr;
    char total[32];
    snprintf(total, sizeof total, "steps=%d", steps);
    const char *sets[] = {total, d->set};
    *params = NULL;
    if (!CHECK(tg_job_load(d->job, sets, d->set ? 2 : 1, &job, &err) == 0, "%s", err.msg)) return 0;
    if (!CHECK(tg_compile(&job, &plan, &err) == 0, "%s", err.msg)) return 0;
    tg_trainer_options o = {.device = d->device, .load_data = 1, .no_graphs = d->no_graphs, .max_in_flight = d->depth,
                            .step_group = d->group};
    if (!d->defer) setenv("TUNEGRAPH_DEFERRED_UPDATE", "0", 1);
    int opened = CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg);
    unsetenv("TUNEGRAPH_DEFERRED_UPDATE");
    if (!opened) {
        tg_plan_free(&plan);
        return 0;
    }
    int ok = CHECK(d->depth == 0 || d->device == TG_DEVICE_CPU || tr.max_in_flight == d->depth,
                   "%s: asked for %d steps in flight, got %d", d->what, d->depth, tr.max_in_flight);
    ok = ok && CHECK(d->group == 0 || tr.step_group == d->group, "%s: asked for groups of %d steps, got %d", d->what,
                     d->group, tr.step_group);
    for (int s = 0; ok && s < steps; s++) {
        tg_step_stats st;
        if (d->depth == 0) tg_trainer_next_batch(&tr);
        ok = CHECK((d->depth == 0 ? tg_trainer_run_step(&tr, &st, &err) : tg_trainer_step(&tr, &st, &err)) == 0,
                   "%s: %s", d->what, err.msg);
        ok = ok && CHECK(st.step == s + 1 && st.step_ms > 0, "%s: step %d reported as %d, %.3f ms", d->what, s + 1,
                         st.step, st.step_ms);
        losses[s] = st.loss;
        if (ok && s + 1 == d->read_at) {
            float *mid = read_all_trainer(&tr, plan.io.params_all, plan.pool_bytes[TG_POOL_PARAMS]);
            ok = mid != NULL;
            free(mid);
        }
    }
    *params_bytes = plan.pool_bytes[TG_POOL_PARAMS];
    *params = ok ? read_all_trainer(&tr, plan.io.params_all, *params_bytes) : NULL;
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
    return ok && *params;
}

/* Trains each of n runs for `steps` steps: losses[r * steps + s], params[r]; 0 when one
 * failed (the rest are not run). */
static int train_runs(const demo_run *runs, int n, int steps, float *losses, float **params, size_t *bytes) {
    for (int r = 0; r < n; r++)
        if (!train_demo(&runs[r], steps, losses + (size_t)r * (size_t)steps, &params[r], bytes)) return 0;
    return 1;
}

/* Runs [first, n) against run `ref`: the same losses and parameters, bit for bit. */
static void check_bitwise(const demo_run *runs, int ref, int first, int n, int steps, const float *losses,
                          float *const *params, size_t bytes, const char *against) {
    const float *want = losses + (size_t)ref * (size_t)steps;
    for (int r = first; r < n; r++) {
        const float *got = losses + (size_t)r * (size_t)steps;
        CHECK(memcmp(want, got, sizeof(float) * (size_t)steps) == 0, "%s: losses differ from %s (step 2: %g vs %g)",
              runs[r].what, against, got[1], want[1]);
        CHECK(memcmp(params[ref], params[r], bytes) == 0, "%s: parameters differ from %s", runs[r].what, against);
    }
}

/* The batch each step fetches for the next is exactly that batch, and queued steps train
 * as steps taken one at a time: pipelined training equals uploading every batch before its
 * step, bit for bit, with graphs and without, one or several steps in flight. */
TG_TEST(test_gpu_fetched_batches_match_uploads) {
    enum { STEPS = 14, RUNS = 8 };
    const char *job = "examples/demo-classify.job";
    /* The first run applies every update in schedule order; the others defer it beside
     * the next forward (one also reads the parameters midway, applying it there). Groups
     * of 4 in 8 in flight run 14 steps as three groups and two single starts. */
    const demo_run runs[RUNS] = {
        {job, TG_DEVICE_CUDA, 0, 1, 0, 0, 0, "uploaded, update in schedule order", NULL},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "fetched", NULL},
        {job, TG_DEVICE_CUDA, 4, 1, 0, 1, 0, "fetched, 4 in flight", NULL},
        {job, TG_DEVICE_CUDA, 4, 1, 1, 1, 0, "stream launches, 4 in flight", NULL},
        {job, TG_DEVICE_CUDA, 0, 1, 0, 1, 0, "uploaded", NULL},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 5, "fetched, parameters read after step 5", NULL},
        {job, TG_DEVICE_CUDA, 8, 4, 0, 1, 0, "groups of 4 steps in one graph, 8 in flight", NULL},
        {job, TG_DEVICE_CUDA, 8, 4, 1, 1, 0, "groups of 4 by stream launches", NULL},
    };
    float losses[RUNS][STEPS];
    float *params[RUNS] = {NULL};
    size_t bytes = 0;
    if (train_runs(runs, RUNS, STEPS, &losses[0][0], params, &bytes)) {
        check_bitwise(runs, 0, 1, RUNS, STEPS, &losses[0][0], params, bytes, "uploaded batches");
        int distinct = 0;
        for (int s = 1; s < STEPS; s++) distinct += losses[0][s] != losses[0][s - 1];
        CHECK(distinct >= STEPS / 2, "losses barely change between steps (%d of %d): batches are not moving", distinct,
              STEPS - 1);
    }
    for (int r = 0; r < RUNS; r++) free(params[r]);
}

/* Runs runs[0] (the CPU) and runs[1..n) (CUDA) for 10 steps: the first CUDA run's losses
 * within 1e-4 of the CPU's, the others bit for bit the first CUDA run (`against`). */
static void cuda_runs_as_cpu(const demo_run *runs, int n, const char *against) {
    enum { STEPS = 10, MAX_RUNS = 8 };
    float losses[MAX_RUNS][STEPS];
    float *params[MAX_RUNS] = {NULL};
    size_t bytes = 0;
    REQUIRE(n <= MAX_RUNS, "%d runs", n);
    if (train_runs(runs, n, STEPS, &losses[0][0], params, &bytes)) {
        for (int s = 0; s < STEPS; s++)
            CHECK(fabsf(losses[1][s] - losses[0][s]) <= 1e-4f * fabsf(losses[0][s]), "step %d: loss cpu %.7g cuda %.7g",
                  s + 1, losses[0][s], losses[1][s]);
        check_bitwise(runs, 1, 2, n, STEPS, &losses[0][0], params, bytes, against);
    }
    for (int r = 0; r < n; r++) free(params[r]);
}

/* Adan's update deferred beside the next forward, in chunks, trains as in schedule order,
 * bit for bit, one step or several in flight, and with the parameters read midway (which
 * applies the pending update); and as the CPU within float rounding. (A read midway with
 * steps in flight takes those steps too, so a run reading there is not step for step.) */
TG_TEST(test_gpu_adan_deferred_update_matches) {
    enum { RUNS = 5 };
    const char *job = "examples/demo-classify.job", *adan = "optimizer=adan";
    const demo_run runs[RUNS] = {
        {job, TG_DEVICE_CPU, 1, 1, 0, 1, 0, "CPU reference", adan},
        {job, TG_DEVICE_CUDA, 0, 1, 0, 0, 0, "update in schedule order", adan},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "deferred", adan},
        {job, TG_DEVICE_CUDA, 4, 1, 0, 1, 0, "deferred, 4 in flight", adan},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 3, "deferred, parameters read after step 3", adan},
    };
    cuda_runs_as_cpu(runs, RUNS, "schedule order");
}

/* Gradients sharing the activation pool (the default) train as gradients in a pool of
 * their own, bit for bit: with the update in schedule order, deferred beside the next
 * forward (whose activations overwrite the gradients once the update has read them), with
 * steps in flight and with the parameters read midway; and as the CPU within rounding.
 * The shared plan still defers its update. */
TG_TEST(test_gpu_shared_gradients_match_own_pool) {
    enum { RUNS = 6 };
    const char *job = "examples/demo-classify.job", *own = "share_grad_memory=false";
    const demo_run runs[RUNS] = {
        {job, TG_DEVICE_CPU, 1, 1, 0, 1, 0, "CPU reference, shared", NULL},
        {job, TG_DEVICE_CUDA, 0, 1, 0, 0, 0, "own pool, update in schedule order", own},
        {job, TG_DEVICE_CUDA, 0, 1, 0, 0, 0, "shared, update in schedule order", NULL},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "shared, deferred", NULL},
        {job, TG_DEVICE_CUDA, 4, 1, 0, 1, 0, "shared, deferred, 4 in flight", NULL},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 3, "shared, deferred, parameters read after step 3", NULL},
    };
    cuda_runs_as_cpu(runs, RUNS, "the own pool in schedule order");
    tg_err err;
    tg_job j;
    tg_plan plan;
    tg_trainer tr;
    if (!CHECK(tg_job_load(job, NULL, 0, &j, &err) == 0 && tg_compile(&j, &plan, &err) == 0, "%s", err.msg)) return;
    CHECK(plan.grads_share_activations, "the demo plan does not share its gradients");
    tg_trainer_options o = {.device = TG_DEVICE_CUDA, .load_data = 0};
    if (CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
        const tg_cuda_exec *x = tr.ex.impl;
        CHECK(x->defer_on, "the shared plan's update is not deferred");
        CHECK(x->pool[TG_POOL_GRADS] == x->pool[TG_POOL_ACTIVATIONS], "the gradients are not at the activations' base");
        tg_trainer_close(&tr);
    }
    tg_plan_free(&plan);
}

/* recompute = gelu (the backward makes the MLP's GELU output again) trains on CUDA as with
 * the outputs kept, bit for bit (the same GELU kernel on the same pre-activation), with the
 * update deferred and steps in flight; and as the CPU within rounding. */
TG_TEST(test_gpu_recompute_gelu_matches) {
    enum { RUNS = 4 };
    const char *job = "examples/demo-classify.job", *gelu = "recompute=gelu";
    const demo_run runs[RUNS] = {
        {job, TG_DEVICE_CPU, 1, 1, 0, 1, 0, "CPU reference, recompute", gelu},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "outputs kept", NULL},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "recompute", gelu},
        {job, TG_DEVICE_CUDA, 4, 1, 0, 1, 0, "recompute, 4 in flight", gelu},
    };
    cuda_runs_as_cpu(runs, RUNS, "the outputs kept");
}

/* recompute = layers (each layer's forward again right before its backward, with the
 * dropout keys of the first) trains on CUDA as with the activations kept, bit for bit (the
 * same kernels on the same inputs), with the update deferred and steps in flight; and as
 * the CPU within rounding: the BERT classification and GPT-2 LM demos. */
TG_TEST(test_gpu_recompute_layers_matches) {
    enum { RUNS = 4 };
    static const char *const jobs[2] = {"examples/demo-classify.job", "examples/demo-lm.job"};
    const char *layers = "recompute=layers";
    for (int k = 0; k < 2; k++) {
        const demo_run runs[RUNS] = {
            {jobs[k], TG_DEVICE_CPU, 1, 1, 0, 1, 0, "CPU reference, recompute", layers},
            {jobs[k], TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "activations kept", NULL},
            {jobs[k], TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "recompute", layers},
            {jobs[k], TG_DEVICE_CUDA, 4, 1, 0, 1, 0, "recompute, 4 in flight", layers},
        };
        cuda_runs_as_cpu(runs, RUNS, "the activations kept");
    }
}

/* optimizer_state = bf16: the moments' stochastic rounding draws the same bits whatever
 * runs the update (in schedule order, deferred in chunks beside the next forward, with
 * steps in flight, with the parameters read midway), so those train bit for bit alike;
 * and as the CPU within float rounding. Adan's four rounded vectors likewise. */
TG_TEST(test_gpu_bf16_optimizer_state_matches) {
    enum { RUNS = 5 };
    const char *job = "examples/demo-classify.job", *bf16 = "optimizer_state=bf16";
    const demo_run runs[RUNS] = {
        {job, TG_DEVICE_CPU, 1, 1, 0, 1, 0, "CPU reference, bf16 state", bf16},
        {job, TG_DEVICE_CUDA, 0, 1, 0, 0, 0, "bf16 state, update in schedule order", bf16},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "bf16 state, deferred", bf16},
        {job, TG_DEVICE_CUDA, 4, 1, 0, 1, 0, "bf16 state, deferred, 4 in flight", bf16},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 3, "bf16 state, deferred, parameters read after step 3", bf16},
    };
    cuda_runs_as_cpu(runs, RUNS, "bf16 state in schedule order");
}

/* LM batches leave their labels to the step (TG_LABELS_FROM_IDS rows): the demo LM job
 * (padded rows of many lengths) trains on CUDA as on the CPU, whose batches carry every
 * label, through uploads, fetches and groups of steps; the CUDA runs agree bit for bit. */
TG_TEST(test_gpu_lm_label_rows_train_as_cpu) {
    enum { RUNS = 4 };
    const char *job = "examples/demo-lm.job";
    const demo_run runs[RUNS] = {
        {job, TG_DEVICE_CPU, 1, 1, 0, 1, 0, "CPU reference", NULL},
        {job, TG_DEVICE_CUDA, 0, 1, 0, 1, 0, "uploaded", NULL},
        {job, TG_DEVICE_CUDA, 1, 1, 0, 1, 0, "fetched", NULL},
        {job, TG_DEVICE_CUDA, 8, 4, 0, 1, 0, "groups of 4, 8 in flight", NULL},
    };
    cuda_runs_as_cpu(runs, RUNS, "uploads");
}

/* The label-row kernel against the host's derivation (datasets/batch.c) on random rows
 * of every length, marked or not, more rows than one chunk of the kernel's marks; the
 * image's other bytes unchanged. */
TG_TEST(test_gpu_derive_label_rows_matches_host) {
    enum { ROWS = 1500, SEQ = 7 };
    const size_t n = (size_t)ROWS * SEQ, ids_off = 0, mask_off = n * 4, labels_off = 2 * n * 4, bytes = 3 * n * 4 + 64;
    uint8_t *host = malloc(bytes), *want = malloc(bytes), *got = malloc(bytes), *dev = NULL;
    REQUIRE(host && want && got, "out of memory");
    uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
    for (size_t i = 0; i < bytes; i++) host[i] = (uint8_t)((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    int32_t *ids = (int32_t *)(host + ids_off), *labels = (int32_t *)(host + labels_off);
    float *mask = (float *)(host + mask_off);
    for (int r = 0; r < ROWS; r++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int len = (int)((s >> 33) % (SEQ + 1)), marked = (s >> 20) % 3 != 0;
        for (int t = 0; t < SEQ; t++) {
            ids[r * SEQ + t] = (int32_t)((s >> (t + 3)) % 50000);
            mask[r * SEQ + t] = t < len ? 1.0f : 0.0f;
            labels[r * SEQ + t] = (int32_t)(s >> 40) - 100;
        }
        if (marked) labels[r * SEQ] = TG_LABELS_FROM_IDS;
    }
    memcpy(want, host, bytes);
    tg_batch_derive_label_rows((int32_t *)(want + labels_off), (int32_t *)(want + ids_off), (float *)(want + mask_off),
                               ROWS, SEQ);
    tg_lm_label_rows rows = {ids_off, mask_off, labels_off, ROWS, SEQ};
    int ok = CHECK(cudaMalloc((void **)&dev, bytes) == cudaSuccess, "cudaMalloc") &&
             CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess, "upload") &&
             CHECK(tg_cuda_derive_label_rows(dev, rows, 0) == 0, "launch: %s", cudaGetErrorString(cudaGetLastError())) &&
             CHECK(cudaMemcpy(got, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
    int bad = 0;
    for (size_t i = 0; ok && i < bytes && bad < 4; i++)
        bad += !CHECK(got[i] == want[i], "byte %zu (label %zu): device %u, host %u", i, (i - labels_off) / 4, got[i],
                      want[i]);
    int derived = 0;
    for (int r = 0; r < ROWS; r++) derived += ((int32_t *)(want + labels_off))[r * SEQ] != labels[r * SEQ];
    CHECK(derived > ROWS / 3, "only %d rows were derived", derived);
    cudaFree(dev);
    free(host), free(want), free(got);
}

/* Steps taken through tg_trainer_step hand the executor the next batch, which it fetches;
 * a caller that then rewrites that batch (tg_trainer_input) and takes a step with
 * tg_trainer_run_step trains on what it wrote: the step's loss is the forward's loss on
 * those inputs (same parameters, same step counter, so the same dropout masks). */
TG_TEST(test_gpu_run_step_after_pipelined_steps) {
    tg_err err;
    tg_job job;
    tg_plan plan;
    tg_trainer tr;
    const char *sets[] = {"steps=20"};
    REQUIRE(tg_job_load("examples/demo-classify.job", sets, 1, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &plan, &err) == 0, "%s", err.msg);
    tg_trainer_options o = {.device = TG_DEVICE_CUDA, .load_data = 1, .max_in_flight = 4};
    if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return;
    }
    tg_step_stats st;
    int ok = 1;
    for (int s = 0; s < 3 && ok; s++) ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "step %d: %s", s + 1, err.msg);
    const int B = plan.train.batch, T = plan.train.seq;
    int32_t *ids = tg_trainer_input(&tr, plan.io.input_ids), *labels = tg_trainer_input(&tr, plan.io.labels);
    for (int i = 0; ok && i < B * T; i++) ids[i] = ids[i] ? 1 + (i * 7) % 100 : 0; /* same padding, other tokens */
    for (int b = 0; ok && b < B; b++) labels[b] = (b + 1) % 2;
    float forward_loss = 0;
    ok = ok && CHECK(tg_trainer_run(&tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 1, &err) == 0, "%s", err.msg) &&
         CHECK(tg_trainer_read_f32(&tr, plan.io.loss, &forward_loss, &err) == 0, "%s", err.msg);
    ok = ok && CHECK(tg_trainer_run_step(&tr, &st, &err) == 0, "%s", err.msg);
    if (ok)
        CHECK(st.loss == forward_loss, "the step trained on another batch: loss %.7g, the forward on the written inputs %.7g",
              st.loss, forward_loss);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
}
