/* Names and sizes shared by every reader of a plan. */
#include "plan/plan.h"

#include <stdlib.h>
#include <string.h>

void tg_plan_free(tg_plan *plan) {
    if (!plan) return;
    if (plan->buckets) {
        for (int k = 0; k + 1 < plan->train.n_buckets; k++) tg_plan_free(&plan->buckets[k]);
        free(plan->buckets);
        plan->buckets = NULL;
    }
    free(plan->tensors);
    free(plan->ops);
    plan->tensors = NULL;
    plan->ops = NULL;
    plan->n_tensors = plan->n_ops = 0;
}

uint64_t tg_plan_pools_bytes(const tg_plan *plan) {
    uint64_t total = 0;
    for (int q = 0; q < TG_POOL_COUNT; q++) total += tg_pool_allocated(plan, q) ? plan->pool_bytes[q] : 0;
    return total;
}

const tg_plan *tg_plan_bucket(const tg_plan *plan, int k) {
    return plan->buckets && k >= 0 && k < plan->train.n_buckets - 1 ? &plan->buckets[k] : plan;
}

int tg_plan_bucket_for(const tg_plan *plan, int32_t len) {
    const tg_plan_train *t = &plan->train;
    for (int k = 0; k + 1 < t->n_buckets; k++)
        if (len <= t->bucket_seq[k]) return k;
    return t->n_buckets > 1 ? t->n_buckets - 1 : 0;
}

static const char *const pool_names[TG_POOL_COUNT] = {
    "params", "grads", "optim", "activations", "inputs", "workspace", "params_bf16", "frozen", "buffers",
};
_Static_assert(sizeof pool_names / sizeof pool_names[0] == TG_POOL_COUNT, "pool names");

static const char *const phase_names[TG_PHASE_COUNT] = {"forward", "backward", "optimizer"};
static const char *const dtype_names[TG_DTYPE_COUNT] = {"f32", "i32", "bf16", "f16", "u8"};
static const int dtype_sizes[TG_DTYPE_COUNT] = {4, 4, 2, 2, 1};
static const char *const arch_names[TG_ARCH_COUNT] = {"bert", "roberta", "gpt2", "llama", "mobilenet_v2"};
static const char *const task_names[TG_TASK_COUNT] = {"classify", "lm", "mlm", "qa"};
static const char *const precision_names[TG_PREC_COUNT] = {"fp32", "bf16", "fp16"};
static const char *const attention_mode_names[TG_ATTENTION_MODE_COUNT] = {"fused", "unfused"};
static const char *const last_batch_names[TG_LAST_BATCH_COUNT] = {"pad", "drop", "wrap"};
static const char *const lr_schedule_names[TG_LR_SCHEDULE_COUNT] = {"linear", "cosine", "constant"};

#define NAME_OR_UNKNOWN(table, count, v) ((v) >= 0 && (v) < (count) ? table[v] : "?")

const char *tg_pool_name(int pool) { return NAME_OR_UNKNOWN(pool_names, TG_POOL_COUNT, pool); }
const char *tg_phase_name(int phase) { return NAME_OR_UNKNOWN(phase_names, TG_PHASE_COUNT, phase); }
const char *tg_dtype_name(int dtype) { return NAME_OR_UNKNOWN(dtype_names, TG_DTYPE_COUNT, dtype); }
const char *tg_arch_name(int arch) { return NAME_OR_UNKNOWN(arch_names, TG_ARCH_COUNT, arch); }
const char *tg_task_name(int task) { return NAME_OR_UNKNOWN(task_names, TG_TASK_COUNT, task); }
const char *tg_precision_name(int p) { return NAME_OR_UNKNOWN(precision_names, TG_PREC_COUNT, p); }
const char *tg_attention_mode_name(int mode) {
    return NAME_OR_UNKNOWN(attention_mode_names, TG_ATTENTION_MODE_COUNT, mode);
}
const char *tg_last_batch_name(int mode) { return NAME_OR_UNKNOWN(last_batch_names, TG_LAST_BATCH_COUNT, mode); }
const char *tg_lr_schedule_name(int form) { return NAME_OR_UNKNOWN(lr_schedule_names, TG_LR_SCHEDULE_COUNT, form); }
int tg_dtype_size(int dtype) { return dtype >= 0 && dtype < TG_DTYPE_COUNT ? dtype_sizes[dtype] : 0; }

int64_t tg_tensor_numel(const tg_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

int tg_tensor_class_of(const tg_tensor *t) {
    if (t->flags & TG_TENSOR_PARAM) return TG_CLASS_TRAINABLE;
    if (t->flags & TG_TENSOR_FROZEN) return TG_CLASS_FROZEN;
    if (t->flags & TG_TENSOR_BUFFER) return TG_CLASS_BUFFER;
    return TG_CLASS_NONE;
}

static const char *const class_names[TG_CLASS_COUNT] = {"none", "trainable", "frozen", "buffer"};
const char *tg_tensor_class_name(int cls) { return NAME_OR_UNKNOWN(class_names, TG_CLASS_COUNT, cls); }

int tg_tensor_is_value(const tg_tensor *t) {
    return tg_tensor_class_of(t) != TG_CLASS_NONE && !(t->flags & (TG_TENSOR_VIEW | TG_TENSOR_PARAM_COPY));
}

int tg_name_layer(const char *name) {
    static const char *const containers[] = {"layer", "layers", "h", "block", "blocks"};
    const char *prev = NULL, *c = name;
    size_t prev_len = 0;
    while (c) {
        const char *dot = strchr(c, '.');
        const size_t len = dot ? (size_t)(dot - c) : strlen(c);
        int digits = len > 0 && len <= 6;
        for (size_t i = 0; digits && i < len; i++) digits = c[i] >= '0' && c[i] <= '9';
        if (digits && prev)
            for (size_t k = 0; k < sizeof containers / sizeof containers[0]; k++)
                if (strlen(containers[k]) == prev_len && !strncmp(prev, containers[k], prev_len)) {
                    int n = 0;
                    for (size_t i = 0; i < len; i++) n = n * 10 + (c[i] - '0');
                    return n;
                }
        prev = c, prev_len = len;
        c = dot ? dot + 1 : NULL;
    }
    return -1;
}

int tg_op_layer(const tg_tensor *tensors, int n_tensors, const tg_op *op) {
    int layer = -1;
    for (int k = 0; k < TG_OP_MAX_OUT; k++) {
        const int t = op->out[k];
        if (t < 0 || t >= n_tensors) continue;
        const int l = tg_name_layer(tensors[t].name);
        if (l >= 0 && (layer < 0 || l < layer)) layer = l;
    }
    return layer;
}

int tg_name_is_recomputed(const char *name) {
    static const char tail[] = ".recomputed";
    const size_t n = strnlen(name, TG_NAME_MAX), m = sizeof tail - 1;
    return n >= m && !memcmp(name + n - m, tail, m);
}
