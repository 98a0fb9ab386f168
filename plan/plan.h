/* The plan: the immutable program the compiler writes and every executor runs.
 * One tensor table, one schedule of ops (sorted by phase), memory pools with fixed
 * offsets, the model it was compiled for, and the training settings the runtime needs
 * (compiled in, or left to the run). */
#ifndef TUNEGRAPH_PLAN_H
#define TUNEGRAPH_PLAN_H

#include <stdint.h>

#include "plan/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TG_PLAN_VERSION 29
/* The most data-parallel replicas a plan may train with. */
#define TG_MAX_DATA_PARALLEL 64
#define TG_NAME_MAX 96
/* The most answer candidates a qa eval keeps (job key qa_n_best): each window weighs
 * n_best x n_best start and end pairs. */
#define TG_QA_MAX_N_BEST 1024

/* The most micro-batches one optimizer step may accumulate (job key grad_accumulation). */
#define TG_MAX_GRAD_ACCUMULATION 1024
/* The most sequence-length buckets (job key seq_buckets) a plan may hold. */
#define TG_MAX_BUCKETS 8
#define TG_PATH_MAX 512
#define TG_MAX_DIMS 4
/* Every tensor offset is a multiple of this (packed group members excepted). */
#define TG_TENSOR_ALIGN 256
/* The most bytes one memory pool of a plan may hold (256 TiB, far past any device), so
 * that sums of pool sizes, offsets and byte counts never overflow. */
#define TG_POOL_MAX_BYTES (UINT64_C(1) << 48)

/* bf16: the upper half of an fp32 (1 sign, 8 exponent, 7 mantissa bits), rounded to
 * nearest even when narrowed. u8: bytes as the data stores them (an image batch's pixels). */
typedef enum tg_dtype { TG_F32 = 0, TG_I32 = 1, TG_BF16 = 2, TG_F16 = 3, TG_U8 = 4, TG_DTYPE_COUNT } tg_dtype;

typedef enum tg_pool {
    TG_POOL_PARAMS = 0,  /* trainable parameters (fp32 masters), one contiguous buffer */
    TG_POOL_GRADS,       /* parameter gradients, same layout as params */
    TG_POOL_OPTIM,       /* AdamW m and v (each params-shaped), step counter, total steps */
    TG_POOL_ACTIVATIONS, /* forward/backward intermediates, reused by liveness */
    TG_POOL_INPUTS,      /* the batch: ids, masks, positions, labels */
    TG_POOL_WORKSPACE,   /* per-step scalars (lr, grad norm) */
    TG_POOL_PARAMS_BF16, /* bf16 copies of the parameters (bf16 plans; AdamW refreshes them) */
    TG_POOL_FROZEN,      /* frozen parameters, stored once in the working precision (see
                            TG_TENSOR_FROZEN); no gradients, no optimizer state */
    TG_POOL_BUFFERS,     /* buffers: non-trainable tensors of the model (HF register_buffer) */
    TG_POOL_COUNT
} tg_pool;

typedef enum tg_phase {
    TG_PHASE_FORWARD = 0,
    TG_PHASE_BACKWARD,
    TG_PHASE_OPTIMIZER,
    TG_PHASE_COUNT
} tg_phase;

enum tg_tensor_flags {
    TG_TENSOR_PARAM = 1 << 0,    /* a trainable parameter */
    TG_TENSOR_GRAD = 1 << 1,     /* a parameter's gradient (grads pool) */
    TG_TENSOR_NO_DECAY = 1 << 2, /* parameter excluded from weight decay (biases, LayerNorm) */
    TG_TENSOR_INPUT = 1 << 3,    /* filled by the runtime from the batch */
    TG_TENSOR_OUTPUT = 1 << 4,   /* read by the runtime after the forward phase */
    TG_TENSOR_VIEW = 1 << 5,     /* aliases other tensors: a whole pool, a padded parameter, or a
                                    packed group of parameters (see tg_tensor.group) */
    TG_TENSOR_TIED = 1 << 6,     /* parameter shared by two uses (GPT-2 wte / lm_head) */
    TG_TENSOR_PARAM_COPY = 1 << 7, /* low-precision copy of the parameter `master` */
    /* A frozen parameter (TG_POOL_FROZEN): loaded, initialised and saved like a trainable one
     * under its Hugging Face name, but it has no gradient and no optimizer state. It is stored
     * once, in the working precision: in bf16 plans a frozen tensor that only matmuls read is
     * bf16 (narrowed from the fp32 values when uploaded) and the matmuls read it directly; one
     * that an op taking fp32 also reads (LayerNorm gamma/beta, embedding tables) stays fp32.
     * The exception: an fp32 frozen tensor that a matmul reads as well (GPT-2's wte, also the
     * tied LM head) gets a bf16 copy in the frozen pool too (flags FROZEN | PARAM_COPY, master
     * the fp32 tensor), filled once when the weights are uploaded. */
    TG_TENSOR_FROZEN = 1 << 8,
    /* A buffer (TG_POOL_BUFFERS): a non-trainable tensor of the model that a checkpoint may
     * hold, of any plan dtype (BERT's embeddings.position_ids). */
    TG_TENSOR_BUFFER = 1 << 9,
    /* A buffer Hugging Face saves and loads (register_buffer's persistent=True). A buffer
     * without it is never saved, and ignored when a checkpoint holds it, as HF does. */
    TG_TENSOR_PERSISTENT = 1 << 10,
};
/* Every flag bit a plan may use. */
#define TG_TENSOR_FLAGS_ALL ((1 << 11) - 1)

/* What a tensor of the model is: a trainable parameter (TG_TENSOR_PARAM: fp32 master in the
 * params pool, a gradient, AdamW state, a bf16 copy in bf16 plans), a frozen parameter
 * (TG_TENSOR_FROZEN), a buffer (TG_TENSOR_BUFFER), or none of these (activations, inputs,
 * gradients, optimizer state, the trainable parameters' bf16 copies, whole-pool views).
 * Views of a parameter (packed groups, the padded LM-head view) have their master's class. */
typedef enum tg_tensor_class {
    TG_CLASS_NONE = 0,
    TG_CLASS_TRAINABLE,
    TG_CLASS_FROZEN,
    TG_CLASS_BUFFER,
    TG_CLASS_COUNT
} tg_tensor_class;

/* TG_INIT_ARANGE: element i holds i modulo the last dimension (torch.arange(n).expand). */
/* TG_INIT_UNIFORM: uniform in [-init_std, init_std) (LoRA's A, as PEFT's kaiming-uniform
 * with a = sqrt(5): a bound of 1 / sqrt(fan_in)). */
typedef enum tg_init {
    TG_INIT_NONE = 0, TG_INIT_NORMAL, TG_INIT_ZEROS, TG_INIT_ONES, TG_INIT_ARANGE, TG_INIT_UNIFORM, TG_INIT_COUNT
} tg_init;

typedef struct tg_tensor {
    char name[TG_NAME_MAX];  /* parameters carry their Hugging Face name */
    int32_t dtype;           /* tg_dtype */
    int32_t pool;            /* tg_pool */
    int32_t ndim;
    int32_t flags;           /* tg_tensor_flags */
    int64_t shape[TG_MAX_DIMS];
    uint64_t offset;         /* bytes from the pool's base, 256-byte aligned (packed group
                                members: the group's start is, they follow back to back) */
    uint64_t bytes;
    int32_t first_use;       /* index of the first op reading or writing it, -1 if none */
    int32_t last_use;        /* index of the last such op */
    int32_t grad;            /* parameters: index of the gradient tensor; else -1 */
    int32_t init;            /* tg_init, for parameters and buffers without pretrained weights */
    float init_std;
    int32_t master;          /* TG_TENSOR_PARAM_COPY: the fp32 parameter it copies; a parameter
                                view: the parameter it starts at; else -1 */
    int32_t group;           /* member of a packed group: the view that covers the group's
                                members back to back, as one tensor (BERT's query, key and
                                value weights as one [3D, D] matrix); else -1 */
} tg_tensor;


/* TG_ARCH_MOBILENET_V2: torchvision's mobilenet_v2, an image classifier (the rest are
 * transformers over token ids). */
typedef enum tg_arch {
    TG_ARCH_BERT = 0,
    TG_ARCH_ROBERTA,
    TG_ARCH_GPT2,
    TG_ARCH_LLAMA,
    TG_ARCH_MOBILENET_V2,
    TG_ARCH_COUNT
} tg_arch;
/* Rotary position embeddings (Llama): HF's rope_type "default" or "llama3" (Llama 3.1's
 * frequency rule); TG_ROPE_NONE for the architectures that have absolute positions. */
typedef enum tg_rope_type { TG_ROPE_NONE = 0, TG_ROPE_DEFAULT, TG_ROPE_LLAMA3, TG_ROPE_TYPE_COUNT } tg_rope_type;
/* TG_TASK_MLM: masked language modelling (BERT, RoBERTa), the batch masked on the device
 * (TG_OP_MLM_MASK). TG_TASK_QA: extractive question answering (a start and an end logit
 * per token). */
typedef enum tg_task { TG_TASK_CLASSIFY = 0, TG_TASK_LM, TG_TASK_MLM, TG_TASK_QA, TG_TASK_COUNT } tg_task;
typedef enum tg_precision { TG_PREC_FP32 = 0, TG_PREC_BF16, TG_PREC_FP16, TG_PREC_COUNT } tg_precision;
/* How attention is built: one TG_OP_ATTENTION per layer (fused, where the head dim allows
 * it), or heads split, QK^T, ATTN_SOFTMAX, PV and heads merge (unfused). */
typedef enum tg_attention_mode { TG_ATTENTION_FUSED = 0, TG_ATTENTION_UNFUSED, TG_ATTENTION_MODE_COUNT } tg_attention_mode;

/* What the compiler needs from a Hugging Face config.json (or a preset, which is one). */
typedef struct tg_model_config {
    char source[TG_PATH_MAX];   /* model folder, or preset name */
    char weights[TG_PATH_MAX];  /* model.safetensors in that folder, "" when absent */
    int32_t arch;               /* tg_arch */
    int32_t vocab_size;
    int32_t hidden;
    int32_t layers;
    int32_t heads;
    int32_t intermediate;
    int32_t max_positions;
    int32_t type_vocab_size;    /* 0 for GPT-2 */
    int32_t pad_token_id;       /* -1 when the config has none */
    int32_t gelu;               /* TG_GELU_ERF or TG_GELU_TANH */
    float layer_norm_eps;
    float initializer_range;
    float hidden_dropout;       /* BERT hidden_dropout_prob; GPT-2 resid_pdrop */
    float attention_dropout;    /* BERT attention_probs_dropout_prob; GPT-2 attn_pdrop */
    float embedding_dropout;    /* BERT hidden_dropout_prob; GPT-2 embd_pdrop */
    float classifier_dropout;   /* BERT classifier_dropout (or hidden); GPT-2 none (0) */
    /* Llama (layer_norm_eps is its rms_norm_eps); the other architectures have kv_heads =
     * heads, tie_word_embeddings as their heads tie, rope_type TG_ROPE_NONE, the rest 0. */
    int32_t kv_heads;           /* num_key_value_heads: grouped-query attention when < heads */
    int32_t tie_word_embeddings; /* 1: the LM head reads the token embeddings */
    int32_t rope_type;          /* tg_rope_type */
    int32_t rope_original_max_positions; /* llama3: original_max_position_embeddings */
    float rope_theta;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3's rule */
    /* Image models (mobilenet_v2; 0 for the transformers): the input's channels (1 or 3) and
     * square size in pixels, and the width multiplier (torchvision's width_mult), from the
     * config and the job keys of the same names; the batch normalisations' momentum
     * (layer_norm_eps is their eps, classifier_dropout the head's dropout). */
    int32_t image_channels;
    int32_t image_size;
    float width_mult;
    float batch_norm_momentum;
    /* Image models: a batch's pixels are (byte / 255 - image_mean[c]) / image_std[c] per
     * channel c (the first image_channels entries; the job keys of the same names). */
    float image_mean[3], image_std[3];
} tg_model_config;

/* What the plan was compiled for: shapes and numerics depend on every field, so a run
 * cannot change them (recompile the job instead). */
typedef struct tg_plan_train {
    int32_t task;                /* tg_task */
    int32_t batch;               /* rows per step, per replica */
    int32_t seq;                 /* tokens a row; image models: 1 (an image a row) */
    int32_t num_labels;          /* classify: the classes */
    int32_t pad_id;              /* the padding id batches use: the job's pad_token_id, else the
                                    model config's, else 0 */
    int32_t precision;           /* tg_precision */
    int32_t allow_tf32;          /* GPU fp32 only */
    int32_t replicas;            /* data-parallel replicas training together, each on its own
                                    batch of `batch` rows (1: one); their gradients are summed
                                    (TG_OP_ALL_REDUCE) */
    int32_t zero_stage;          /* 1: the AdamW state is sharded over the replicas (ZeRO-1): each
                                    updates its own slice of the parameters, then they are
                                    gathered (TG_OP_ALL_GATHER); 0: every replica updates all */
    int32_t attention;           /* tg_attention_mode the job asked for; the ops say what runs
                                    (wide heads get unfused attention whatever was asked) */
    /* Sequence-length buckets (job key seq_buckets): n_buckets lengths, ascending, the last
     * one seq; n_buckets 1 (bucket_seq[0] = seq) when the job names none. A batch runs in
     * the smallest bucket that holds its longest example (tg_plan_bucket). */
    int32_t n_buckets;
    int32_t bucket_seq[TG_MAX_BUCKETS];
    /* Gradient accumulation (job key grad_accumulation): one optimizer step takes N
     * consecutive micro-batches of `batch` rows, and updates once with the gradient of
     * their whole window, as one step on a batch of N * batch rows would. N = 1: none.
     * N > 1: the backward adds into the gradients, which the optimizer phase clears after
     * the update (ZERO of grads.all, its last op), and the losses divide by
     * io.loss_norm, the window's count of counted labels (plan/ops.def CROSS_ENTROPY). */
    int32_t grad_accumulation;
    /* fp16 plans' dynamic loss scaling: the scale a run starts from (io.loss_scale; torch's
     * GradScaler init_scale); 0 in other plans. The update rule's factors and interval
     * are LOSS_SCALE_UPDATE's parameters. */
    float loss_scale_init;
} tg_plan_train;

/* What a run does with the examples left over when an epoch's count is not a multiple of
 * the global batch (job key last_batch). */
typedef enum tg_last_batch {
    TG_LAST_BATCH_PAD = 0,  /* a short last batch, its missing rows padding that counts for
                               nothing (PyTorch's DataLoader with drop_last=False) */
    TG_LAST_BATCH_DROP,     /* left out of that epoch (drop_last=True) */
    TG_LAST_BATCH_WRAP,     /* completed from the next epoch's order: every batch is full
                               (no buckets) */
    TG_LAST_BATCH_COUNT
} tg_last_batch;

/* The run settings a plan leaves open: `tunegraph run PLAN --set` may change them. */
typedef struct tg_plan_run {
    char train_data[TG_PATH_MAX];
    char eval_data[TG_PATH_MAX]; /* "" when none */
    int32_t steps;               /* 0 when epochs is set instead */
    int32_t epochs;              /* 0 when steps is set instead */
    int32_t log_every;
    uint64_t seed;               /* initialisation, shuffling and dropout */
    int32_t checkpoint_every;    /* steps between checkpoints (runtime/checkpoint.h); 0: none */
    int32_t keep_checkpoints;    /* how many of the newest checkpoints the folder keeps; 0: all */
    char checkpoint_dir[TG_PATH_MAX]; /* where checkpoints go; "" when the job names none */
    int32_t last_batch;          /* tg_last_batch */
    /* A step with a non-finite gradient norm is never applied (the update ops skip it); the
     * run goes on past it when skip_nonfinite is 1, until more than max_skipped_steps in a
     * row were skipped (0: at the first), and stops at the first one when it is 0. */
    int32_t skip_nonfinite;
    int32_t max_skipped_steps;   /* >= 0 */
    /* task = qa: the eval's answer post-processing (datasets/qa_postprocess.h, Hugging
     * Face run_qa's n_best_size, max_answer_length and null_score_diff_threshold): the
     * candidates kept (1 .. TG_QA_MAX_N_BEST), the longest answer in tokens (>= 1), and the
     * margin by which the null answer must beat the best span (finite). */
    int32_t qa_n_best;
    int32_t qa_max_answer_length;
    float qa_null_threshold;
    /* The price of one GPU for an hour, currency-free (0: unset, in [0, TG_GPU_HOUR_PRICE_MAX]):
     * the run reports its cost per 1M tokens from it. */
    float gpu_hour_price;
} tg_plan_run;

#define TG_GPU_HOUR_PRICE_MAX 1e6

/* Tensors the runtime binds or reads by role (indices into the tensor table, -1 if absent). */
typedef struct tg_plan_io {
    int32_t input_ids, attention_mask, token_type_ids, position_ids, labels;
    int32_t logits, loss;
    int32_t step, total_steps, lr, grad_norm;
    int32_t params_all, grads_all, m_all, v_all;
    int32_t params_bf16_all;  /* the bf16 copies as one buffer (bf16 plans) */
    /* Plans with grad_accumulation > 1: an f32 [1] input, the rows (classify) or tokens
     * (lm, mlm: the masked positions) whose label counts over the step's whole window of
     * micro-batches; qa: f32 [2], the rows whose answer start, and those whose answer end,
     * counts (SPAN_LOSS); -1 without. */
    int32_t loss_norm;
    /* fp16 plans: the loss scale and its growth tracker, f32 [1] each in the optimizer
     * pool (state a checkpoint keeps, LOSS_SCALE_UPDATE); -1 in other plans. */
    int32_t loss_scale, loss_scale_growth;
    /* task = mlm: an int32 [4] input, the masking stream of each batch (MLM_MASK's in3,
     * kernels/mlm_mask.h tg_mlm_stream_of), written by the host; -1 in other plans. */
    int32_t mlm_stream;
    /* Image models: the batch's images as the data stores them, u8 [batch, channels, size,
     * size] in the inputs pool (IMAGE_INPUT makes the network's normalised channels-last
     * input of them); -1 in the transformers' plans, which take token ids instead. */
    int32_t pixel_values;
} tg_plan_io;

typedef struct tg_plan {
    tg_model_config model;
    tg_plan_train train;
    tg_plan_run run;
    char job_path[TG_PATH_MAX];          /* the job file it was compiled from, for messages */
    int32_t n_tensors;
    int32_t n_ops;
    tg_tensor *tensors;
    tg_op *ops;                          /* sorted by phase */
    int32_t phase_begin[TG_PHASE_COUNT + 1]; /* ops of phase p: [phase_begin[p], phase_begin[p+1]) */
    uint64_t pool_bytes[TG_POOL_COUNT];
    /* 1: the gradient pool is no allocation of its own but the first pool_bytes[GRADS]
     * bytes of the activation pool, each gradient's bytes held only while the step needs
     * them and free for activations otherwise (plan/grad_hold.h); plans without gradient
     * accumulation (a plan's bucket plans all alike). 0: a pool of its own. */
    int32_t grads_share_activations;
    uint64_t peak_bytes;                 /* all pools together (the gradient pool once, inside the
                                            activation pool where it shares it): the planned
                                            device footprint */
    uint64_t activation_live_peak;       /* largest sum of simultaneously live activations */
    double flops_per_step;
    double bytes_per_step;
    /* What the job's freeze removed from the backward: the ops and FLOPs per step that the
     * same job without freeze has in its backward phase and this plan has not (gradients of
     * frozen parameters, and everything below the lowest trainable one). 0 without freeze. */
    int32_t freeze_pruned_ops;
    double freeze_pruned_flops;
    /* Recomputation (job key recompute): the planned peak (peak_bytes) of the same job
     * compiled with recompute = none, for inspect to set beside this plan's; 0 when the plan
     * recomputes nothing. Printed, never executed; at most TG_POOL_COUNT pools of
     * TG_POOL_MAX_BYTES. A bucket plan carries the plan's. */
    uint64_t peak_bytes_without_recompute;
    tg_plan_io io;
    uint64_t fingerprint;                /* xxh64 of model config, job and tunegraph version
                                            (computed by the compiler) */
    /* Length buckets (train.n_buckets > 1): the same schedule compiled at each of
     * train.bucket_seq but the last, ascending (n_buckets - 1 plans); the plan itself is
     * the last bucket (seq = train.seq). A bucket plan has this plan's tensors and ops
     * index for index: the same names, dtypes, pools, flags and op kinds, and every tensor
     * outside the activation and input pools at the same offset with the same shape. Only
     * the shapes that follow seq, the offsets in the activation and input pools, the ops'
     * parameters, costs and the schedule's liveness differ; every pool_bytes is this
     * plan's (the largest bucket's need), so one set of pools serves them all. Its own
     * train, run, model and io are this plan's but for train.seq; its buckets is NULL. */
    struct tg_plan *buckets;
} tg_plan;

void tg_plan_free(tg_plan *plan);

/* Whether pool `pool` of the plan is an allocation of its own: all but a gradient pool that
 * shares the activation pool (whose base is the activation pool's). */
static inline int tg_pool_allocated(const tg_plan *plan, int pool) {
    return !(pool == TG_POOL_GRADS && plan->grads_share_activations);
}
/* What the plan's pools take together: the sizes of the pools allocated on their own
 * (plan->peak_bytes of a consistent plan). Each pool is at most 2^48 bytes. */
uint64_t tg_plan_pools_bytes(const tg_plan *plan);

/* Bucket k of the plan (0 .. train.n_buckets - 1): the plan itself for the last (or when
 * it has no buckets). */
const tg_plan *tg_plan_bucket(const tg_plan *plan, int k);
/* The smallest bucket whose seq holds `len` tokens; the last when none does (the batch
 * is truncated to seq). */
int tg_plan_bucket_for(const tg_plan *plan, int32_t len);
const char *tg_last_batch_name(int mode);

/* The transformer layer a name belongs to: N of a dotted component N (digits) right after a
 * component `layer`, `layers`, `h`, `block` or `blocks` (BERT's "bert.encoder.layer.3.x",
 * GPT-2's "transformer.h.3.x", Llama's "model.layers.3.x"); -1 when it names none. */
int tg_name_layer(const char *name);
/* The layer of an op: the lowest layer its outputs' names name (GPT-2's residual LayerNorm
 * closing block l writes block l's residual and block l + 1's ln_1: block l's), -1 when
 * none does. Out-of-range output indices are skipped. */
int tg_op_layer(const tg_tensor *tensors, int n_tensors, const tg_op *op);
/* Whether tensor name `name` is a recomputed copy (compiler/recompute.h): it ends with
 * ".recomputed". */
int tg_name_is_recomputed(const char *name);

const char *tg_op_name(int kind);
/* The kernel group (tg_op_group) of op kind `kind`, and a group's printed name. */
int tg_op_group_of(int kind);
const char *tg_op_group_name(int group);
const char *tg_pool_name(int pool);
const char *tg_phase_name(int phase);
const char *tg_dtype_name(int dtype);
const char *tg_arch_name(int arch);
const char *tg_task_name(int task);
const char *tg_precision_name(int precision);
const char *tg_attention_mode_name(int mode);
/* tg_schedule_params.form's name: linear, cosine or constant. */
const char *tg_lr_schedule_name(int form);
int tg_dtype_size(int dtype);
int64_t tg_tensor_numel(const tg_tensor *t);
/* The tensor's class (tg_tensor_class) from its flags. */
int tg_tensor_class_of(const tg_tensor *t);
const char *tg_tensor_class_name(int cls);
/* Whether t holds values of its own that weights are initialised, loaded and saved into: a
 * parameter (trainable or frozen) or a buffer that is neither a view nor a low-precision copy. */
int tg_tensor_is_value(const tg_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
