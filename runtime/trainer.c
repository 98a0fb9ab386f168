#include "runtime/trainer.h"
#include "base/alloc.h"
#include "base/clock.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/half_convert.h"
#include "runtime/kernel_trace.h"
#include "runtime/nvtx.h"
#include "datasets/shard_dataset.h"
#include "kernels/mlm_mask.h"

/* Header-only xxHash, as the plan file uses: the training data's identity. */
#define XXH_INLINE_ALL
#include <xxhash.h>


/* The plan of buffer k's bucket (where its input tensors sit). */
static const tg_plan *buffer_plan(const tg_trainer *t, int k) { return tg_plan_bucket(t->plan, t->staging_bucket[k]); }

/* Micro-batches per step (the plan's grad_accumulation; 1: none): a staging buffer holds
 * that many images of the inputs pool back to back (runtime/executor.h). */
static int micro_steps(const tg_trainer *t) { return tg_executor_micro_steps(t->plan); }

/* mlm: the plan's masking op, whose labels the loss counts (out1) and whose ids the model
 * reads (out0); NULL for a plan without one (its labels are the batch's). */
static const tg_op *masking_op(const tg_plan *p) {
    for (int o = p->phase_begin[TG_PHASE_FORWARD]; o < p->phase_begin[TG_PHASE_FORWARD + 1]; o++)
        if (p->ops[o].kind == TG_OP_MLM_MASK) return &p->ops[o];
    return NULL;
}

/* Input tensor `tensor` of micro-batch `micro` in staging buffer k, laid out for that
 * buffer's bucket. */
static void *staging_at(tg_trainer *t, int k, int micro, int tensor) {
    const tg_plan *p = buffer_plan(t, k);
    if (tensor < 0 || p->tensors[tensor].pool != TG_POOL_INPUTS) return NULL;
    return t->staging[k] + (size_t)micro * p->pool_bytes[TG_POOL_INPUTS] + p->tensors[tensor].offset;
}

/* Input tensor `tensor` in staging buffer k (its first micro-batch). */
static void *staging_in(tg_trainer *t, int k, int tensor) { return staging_at(t, k, 0, tensor); }

/* Bytes of one staging buffer. */
static size_t staging_bytes(const tg_trainer *t) {
    return (size_t)micro_steps(t) * (size_t)t->plan->pool_bytes[TG_POOL_INPUTS];
}

static void *staging_input(tg_trainer *t, int tensor) { return staging_in(t, t->cur, tensor); }

/* Stops the loader filling ahead (the caller then owns the sampler and every buffer);
 * t->filled is the batches it filled. */
static void park_loader(tg_trainer *t) {
    if (!t->loader_running) return;
    t->filled = tg_batch_loader_park(t->loader);
    t->loader_running = 0;
}

/* Puts the executor on bucket k for what follows. */
static int select_bucket(tg_trainer *t, int k, tg_err *err) {
    if (t->bucket == k) return 0;
    if (tg_executor_select_bucket(&t->ex, k, err)) return -1;
    t->bucket = k;
    return 0;
}

/* Waits for every step in flight, dropping their statistics. */
static int drain(tg_trainer *t, tg_err *err) {
    tg_step_result dropped;
    for (; t->returned < t->launched; t->returned++)
        if (t->ex.vt->step_wait(t->ex.impl, &dropped, err)) return -1;
    return 0;
}

/* Writes out the label rows of staging[cur] that were left for a step to derive; the
 * caller has waited for the steps in flight (one may be fetching the buffer). */
static void resolve_label_rows(tg_trainer *t) {
    if (!t->staging_marked[t->cur]) return;
    const tg_tensor *labels = &buffer_plan(t, t->cur)->tensors[t->plan->io.labels];
    tg_batch_derive_label_rows(staging_input(t, t->plan->io.labels), staging_input(t, t->plan->io.input_ids),
                               staging_input(t, t->plan->io.attention_mask), (int32_t)labels->shape[0],
                               (int32_t)labels->shape[1]);
    t->staging_marked[t->cur] = 0;
}

void *tg_trainer_input(tg_trainer *t, int tensor) {
    tg_err ignored; /* a failed step reports itself at the next step or read */
    park_loader(t);
    if (drain(t, &ignored) == 0) resolve_label_rows(t);
    t->staging_fixed[t->cur] = 0; /* the caller may write anything there */
    return staging_input(t, tensor);
}

int tg_trainer_read(tg_trainer *t, int tensor, void *host, tg_err *err) {
    park_loader(t);
    if (drain(t, err)) return -1;
    return tg_executor_read(&t->ex, tensor, host, err);
}

int tg_trainer_write(tg_trainer *t, int tensor, const void *host, tg_err *err) {
    park_loader(t);
    if (drain(t, err)) return -1;
    return tg_executor_write(&t->ex, tensor, host, err);
}

int tg_trainer_read_f32(tg_trainer *t, int tensor, float *host, tg_err *err) {
    const tg_tensor *x = &t->plan->tensors[tensor];
    if (x->dtype == TG_F32) return tg_trainer_read(t, tensor, host, err);
    if (!tg_dtype_is_half(x->dtype)) return tg_fail(err, "tensor %s is not a float tensor", x->name);
    int64_t n = tg_tensor_numel(x);
    /* The half values land in the upper half of the buffer, then widen from the front,
     * whose writes never reach a value still to be read. */
    uint16_t *low = (uint16_t *)(host + n) - n;
    if (tg_trainer_read(t, tensor, low, err)) return -1;
    tg_half_widen(x->dtype, host, low, n);
    return 0;
}

static int read_scalar(tg_trainer *t, int tensor, float *v, tg_err *err) { return tg_trainer_read_f32(t, tensor, v, err); }

static int write_scalar(tg_trainer *t, int tensor, float v, tg_err *err) { return tg_trainer_write(t, tensor, &v, err); }

/* Uploads every input tensor from the staging, on the executor put on its bucket. */
static int upload_inputs(tg_trainer *t, tg_err *err) {
    park_loader(t);
    if (drain(t, err)) return -1;
    resolve_label_rows(t);
    if (select_bucket(t, t->staging_bucket[t->cur], err)) return -1;
    for (int i = 0; i < t->plan->n_tensors; i++)
        if (t->plan->tensors[i].pool == TG_POOL_INPUTS && tg_trainer_write(t, i, staging_input(t, i), err))
            return -1;
    return 0;
}

int tg_trainer_run(tg_trainer *t, int first, int last, int training, tg_err *err) {
    if (upload_inputs(t, err)) return -1;
    return tg_executor_run(&t->ex, first, last, training, err);
}

/* Uploads the initial values: the trainable parameters as the params pool (and their bf16
 * copies), then each frozen parameter and buffer in its storage dtype, and the bf16 copies
 * of frozen fp32 tables that matmuls read (filled here, once). */
static int upload_values(tg_trainer *t, tg_err *err) {
    const tg_plan *plan = t->plan;
    int up = tg_trainer_write(t, plan->io.params_all, t->values.params, err);
    if (!up && plan->io.params_bf16_all >= 0) {
        /* The copies start as the rounded masters; the update ops keep them in step. */
        uint16_t *low = tg_malloc(plan->pool_bytes[TG_POOL_PARAMS_BF16]);
        if (!low) up = tg_fail(err, "out of memory for the %s parameter copies (%llu bytes)", tg_dtype_name(plan->tensors[plan->io.params_bf16_all].dtype), (unsigned long long)plan->pool_bytes[TG_POOL_PARAMS_BF16]);
        else {
            tg_half_narrow(plan->tensors[plan->io.params_bf16_all].dtype, low, t->values.params,
                           (int64_t)(plan->pool_bytes[TG_POOL_PARAMS_BF16] / 2));
            up = tg_trainer_write(t, plan->io.params_bf16_all, low, err);
            free(low);
        }
    }
    for (int i = 0; i < plan->n_tensors && !up; i++) {
        const tg_tensor *x = &plan->tensors[i];
        const int cls = tg_tensor_class_of(x);
        if ((cls != TG_CLASS_FROZEN && cls != TG_CLASS_BUFFER) || (x->flags & TG_TENSOR_VIEW)) continue;
        /* A value tensor, or the bf16 copy of its master's values. */
        const void *src = tg_weights_value(&t->values, x->flags & TG_TENSOR_PARAM_COPY ? x->master : i);
        if (!src) continue; /* GCOVR_EXCL_BR_LINE: a frozen parameter or buffer here is a value or a copy of one (plan/validate.c check_copies), and the image holds every value */
        if (!tg_dtype_is_half(x->dtype)) {
            up = tg_trainer_write(t, i, src, err);
            continue;
        }
        uint16_t *low = tg_malloc((size_t)x->bytes);
        if (!low) up = tg_fail(err, "out of memory for the %s copy of %s", tg_dtype_name(x->dtype), x->name);
        else {
            tg_half_narrow(x->dtype, low, src, tg_tensor_numel(x));
            up = tg_trainer_write(t, i, low, err);
            free(low);
        }
    }
    return up ? -1 : 0;
}

/* Fills staging buffer k, laid out for `bucket`; its example-independent parts are
 * rewritten only when the last fill there, of the same bucket, may have left others. mark:
 * LM label rows are left for the step to derive (not with buckets: the step fetching the
 * next batch derives it with its own bucket's layout). Touches buffer k's state alone, so
 * the loader thread may fill one buffer while the stepping thread reads others (the two
 * never fill at once: the stepping thread fills only with the loader parked). */
/* An image model's batch: pixel_values [B, C, S, S], each image's bytes as the shard set
 * stores them (the dataset holds them as bytes; IMAGE_INPUT normalises them on the
 * executor); labels [B]. Rows past the n examples are zero images whose labels count
 * for nothing. */
static void fill_image_batch(tg_trainer *t, int k, int micro, const tg_dataset *ds, const int32_t *idx, int32_t n,
                             tg_batch *b) {
    const tg_plan_io *io = &t->plan->io;
    const tg_model_config *m = &t->plan->model;
    const int64_t per = (int64_t)m->image_size * m->image_size * m->image_channels;
    uint8_t *px = staging_at(t, k, micro, io->pixel_values);
    int32_t *labels = staging_at(t, k, micro, io->labels);
    float *norm = io->loss_norm >= 0 ? staging_at(t, k, micro, io->loss_norm) : NULL;
    if (norm) memset(norm, 0, buffer_plan(t, k)->tensors[io->loss_norm].bytes);
    memset(b, 0, sizeof *b);
    for (int32_t r = 0; r < t->shape.batch; r++) {
        uint8_t *row = px + (int64_t)r * per;
        if (r >= n) {
            memset(row, 0, (size_t)per);
            labels[r] = TG_IGNORE_INDEX;
            continue;
        }
        const tg_example *ex = &ds->examples[idx[r]];
        memcpy(row, ex->pixels, (size_t)per);
        labels[r] = ex->label;
    }
    b->n_real = n;
    b->n_tokens = n;
}

static void fill_batch(tg_trainer *t, int k, int micro, int bucket, const tg_dataset *ds, const int32_t *idx,
                       int32_t n, int mark, tg_batch *b) {
    if (t->plan->io.pixel_values >= 0) {
        fill_image_batch(t, k, micro, ds, idx, n, b);
        return;
    }
    if (bucket != t->staging_bucket[k]) t->staging_fixed[k] = 0; /* another layout */
    t->staging_bucket[k] = bucket;
    const tg_plan_io *io = &t->plan->io;
    memset(b, 0, sizeof *b);
    b->input_ids = staging_at(t, k, micro, io->input_ids);
    b->attention_mask = staging_at(t, k, micro, io->attention_mask);
    b->position_ids = staging_at(t, k, micro, io->position_ids);
    b->labels = staging_at(t, k, micro, io->labels);
    /* GPT-2 has no token types; the batch still needs somewhere to write them. */
    b->token_type_ids = io->token_type_ids >= 0 ? staging_at(t, k, micro, io->token_type_ids) : t->type_scratch;
    /* With accumulation the host writes every label: it counts them for the window's
     * normaliser. A buffer's micro-batches are all written afresh (one set of marks and
     * row lengths per buffer would not describe them). */
    const int whole = micro_steps(t) > 1;
    mark = mark && !whole && t->plan->train.task == TG_TASK_LM && t->ex.vt->lm_label_rows && t->plan->train.n_buckets <= 1;
    /* A marked fill leaves the rest of each label row as it was: trust nothing there. */
    if (mark != t->staging_marked[k] || whole) t->staging_fixed[k] = 0;
    b->fixed_parts_written = t->staging_fixed[k];
    b->row_len = whole ? NULL : t->staging_rows + (size_t)k * (size_t)t->shape.batch;
    /* 0: the loss divides by the batch's own count (an eval batch, or until the window
     * fill writes the window's). */
    float *norm = staging_at(t, k, micro, io->loss_norm);
    if (norm) memset(norm, 0, buffer_plan(t, k)->tensors[io->loss_norm].bytes);
    b->mark_label_rows = mark;
    tg_batch_shape shape = t->shape;
    shape.seq = buffer_plan(t, k)->train.seq;
    tg_batch_fill(ds, idx, n, &shape, b);
    t->staging_fixed[k] = b->fixed_parts_written;
    t->staging_marked[k] = mark;
}

/* The training examples' order (datasets/batch_sampler.h): the run's last-batch rule and
 * the plan's length buckets over the examples' lengths. */
static int open_sampler(tg_trainer *t, tg_err *err) {
    const tg_plan_train *train = &t->plan->train;
    int32_t *lengths = tg_malloc((size_t)t->train.n * sizeof *lengths);
    if (!lengths) return tg_fail(err, "out of memory for the batch sampler's lengths (%d examples)", t->train.n);
    for (int32_t i = 0; i < t->train.n; i++) lengths[i] = t->train.examples[i].len;
    int rc = tg_batch_sampler_init(&t->sampler, lengths, t->train.n, train->batch * t->replicas,
                                   t->plan->run.last_batch, train->n_buckets, train->bucket_seq, t->plan->run.seed, err);
    free(lengths);
    return rc ? tg_fail_context(err, "%s", t->plan->run.train_data) : 0;
}

static void loader_fill(void *ctx, int64_t j);

/* Rows (classify) or tokens (lm) whose label counts. */
static int64_t counted_labels(const int32_t *labels, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += labels[i] != TG_IGNORE_INDEX;
    return c;
}

/* The seed the executor draws this replica's dropout from (and mlm's training masks). */
static uint64_t replica_seed(const tg_trainer *t) {
    return t->plan->run.seed + (uint64_t)t->rank * 0x9E3779B97F4A7C15ull;
}

/* mlm: the masking stream of micro-batch `micro` of buffer k (io.mlm_stream, MLM_MASK's
 * in3, kernels/mlm_mask.h): `step` (a training batch: the run's step, windows counted from
 * the first; an eval batch: its index in the eval set), the micro-batch's first element in
 * its window (micro x its positions, so that a window masks its rows as one batch of the
 * whole window does), and the replica's seed. */
static void write_mlm_stream(tg_trainer *t, int k, int micro, int64_t step) {
    uint32_t *s = staging_at(t, k, micro, t->plan->io.mlm_stream);
    if (!s) return;
    const uint64_t n = (uint64_t)tg_tensor_numel(&buffer_plan(t, k)->tensors[t->plan->io.input_ids]);
    const uint64_t seed = replica_seed(t);
    s[0] = (uint32_t)step, s[1] = (uint32_t)((uint64_t)micro * n), s[2] = (uint32_t)seed, s[3] = (uint32_t)(seed >> 32);
}

/* mlm: the positions micro-batch `micro` of buffer k gets masked in training, counted as
 * the masking op decides them (the same code on the same stream, kernels/mlm_mask.h). */
static int64_t masked_positions(tg_trainer *t, int k, int micro) {
    const tg_op *op = masking_op(t->plan);
    const tg_plan_io *io = &t->plan->io;
    const int32_t *ids = staging_at(t, k, micro, io->input_ids), *stream = staging_at(t, k, micro, io->mlm_stream);
    const float *mask = staging_at(t, k, micro, io->attention_mask);
    uint64_t seed, step, first;
    tg_mlm_stream_of(stream, 1, &seed, &step, &first);
    int64_t c = 0;
    for (int64_t i = 0; i < op->p.mlm_mask.n; i++) {
        int32_t id, label;
        tg_mlm_mask_element(&op->p.mlm_mask, seed, step, first + (uint64_t)i, ids[i], mask[i], &id, &label);
        c += label != TG_IGNORE_INDEX;
    }
    return c;
}

/* Adds a batch's counted labels to the window's counts (io.loss_norm): qa's rows [start,
 * end] count each side on its own, as SPAN_LOSS does (a position below 0 counts, one at
 * seq or past it is ignored); the other tasks count the labels that are not -100. */
static void count_window_labels(const tg_plan *p, const int32_t *labels, int64_t *counted) {
    const int64_t n = tg_tensor_numel(&p->tensors[p->io.labels]);
    if (p->train.task != TG_TASK_QA) {
        counted[0] += counted_labels(labels, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) counted[i & 1] += labels[i] < p->train.seq;
}

/* Steps (windows of micro_steps batches) in an epoch of per_epoch batches: the last one
 * takes what is left, as Hugging Face's Trainer runs the update on a partial window at an
 * epoch's end. */
static int64_t windows_per_epoch(const tg_trainer *t, int64_t per_epoch) {
    const int n = micro_steps(t);
    return (per_epoch + n - 1) / n;
}

/* The batches step j (from 0) draws: micro_steps, fewer in an epoch's last window. */
static int window_batches(const tg_trainer *t, int64_t j) {
    const int n = micro_steps(t);
    if (n == 1) return 1;
    const int64_t per_epoch = t->sampler.per_epoch, w = windows_per_epoch(t, per_epoch);
    const int64_t left = per_epoch - (j % w) * n;
    return left < n ? (int)left : n;
}

/* The most steps one run may take: what the step counters (int32, total_steps) hold. */
#define MAX_RUN_STEPS INT32_MAX

/* qa: the eval split's SQuAD eval file (datasets/squad_eval.h), which must describe its
 * windows one for one. */
static int open_squad_eval(tg_trainer *t, const char *eval_data, tg_err *err) {
    char dir[TG_PATH_MAX + 32], path[TG_PATH_MAX + 64];
    int split;
    tg_shard_path_resolve(eval_data, dir, sizeof dir, &split);
    snprintf(path, sizeof path, "%s/%s", dir, tg_squad_eval_file_name(split));
    if (access(path, F_OK) != 0)
        return tg_fail(err, "%s: task qa scores its eval with %s, which is not there (convert the set again with "
                            "`tunegraph data convert --format squad`)",
                       eval_data, path);
    if (tg_squad_eval_load(path, &t->squad, err)) return -1;
    t->has_squad = 1;
    if (t->squad.n_windows != t->eval.n)
        return tg_fail(err, "%s: %d windows, the eval set %s has %d records (a file of another conversion?)", path,
                       t->squad.n_windows, eval_data, t->eval.n);
    for (int32_t i = 0; i < t->eval.n; i++) {
        const tg_squad_eval_window *w = &t->squad.windows[i];
        if ((int64_t)w->at + w->count >= t->eval.examples[i].len)
            return tg_fail(err, "%s: window %d puts its context at positions %d to %d, past its record's %d tokens",
                           path, i, w->at, w->at + w->count - 1, t->eval.examples[i].len);
    }
    return 0;
}

/* The training and eval sets of the plan's run settings, and the training set's sampler. */
static int load_data(tg_trainer *t, const tg_trainer_options *opts, tg_err *err) {
    const tg_plan *plan = t->plan;
    const tg_plan_run *run = &plan->run;
    tg_data_rules rules = {.task = plan->train.task, .num_labels = plan->train.num_labels,
                           .vocab_size = plan->model.vocab_size, .type_vocab_size = plan->model.type_vocab_size};
    /* An image model's data: an image shard set of the plan's shape, pixels as ids. */
    if (plan->io.pixel_values >= 0)
        rules = (tg_data_rules){.task = plan->train.task, .num_labels = plan->train.num_labels, .vocab_size = 256,
                                .image_channels = plan->model.image_channels, .image_size = plan->model.image_size};
    if (!opts || !opts->eval_only) {
        if (tg_dataset_load(run->train_data, &rules, &t->train, err)) return -1;
        t->has_train = 1;
    }
    if (run->eval_data[0]) {
        if (tg_dataset_load(run->eval_data, &rules, &t->eval, err)) return -1;
        t->has_eval = 1;
        if (plan->train.task == TG_TASK_QA && open_squad_eval(t, run->eval_data, err)) return -1;
    }
    return t->has_train ? open_sampler(t, err) : 0;
}

int tg_trainer_open(tg_trainer *t, const tg_plan *plan, const tg_trainer_options *opts, tg_err *err) {
    memset(t, 0, sizeof *t);
    t->plan = plan;
    const tg_plan_train *train = &plan->train;
    const tg_plan_run *run = &plan->run;
    const tg_model_config *cfg = &plan->model;
    t->rank = opts && train->replicas > 1 ? opts->rank : 0;
    /* Each replica draws its own dropout masks (replica 0 those of a single trainer). */
    tg_executor_options eo = {opts ? opts->device : TG_DEVICE_CPU, opts ? opts->threads : 0,
                              opts ? !opts->no_graphs : 1, replica_seed(t),
                              t->rank, opts ? opts->comm : NULL};
    t->replicas = train->replicas > 1 ? train->replicas : 1;
    double t0 = tg_wall_ms();
    /* Before anything is allocated: a plan that cannot fit is refused now, not by an
     * allocation failure part way (or the OOM killer later). */
    /* A replica runs on its communicator's GPU (GPU r for replica thread r). */
    const int gpu = eo.device == TG_DEVICE_CUDA && t->replicas > 1 && eo.comm ? tg_cuda_comm_device(eo.comm) : t->rank;
    if (tg_preflight(plan, eo.device, gpu > 0 ? gpu : 0, &t->memory, err)) return -1;
    tg_nvtx_push("executor open");
    const int opened = tg_executor_open(&t->ex, plan, &eo, err);
    tg_nvtx_pop();
    if (opened) return -1;
    t->open_ms[0] = tg_wall_ms() - t0;
    t0 = tg_wall_ms();
    t->shape = (tg_batch_shape){train->batch, train->seq, train->task, cfg->arch, train->pad_id};
    t->batch_idx = tg_calloc((size_t)train->batch, sizeof *t->batch_idx);
    t->global_idx = tg_calloc((size_t)train->batch * (size_t)t->replicas, sizeof *t->global_idx);
    t->type_scratch = tg_calloc((size_t)train->batch * (size_t)train->seq, sizeof *t->type_scratch);
    t->staging_rows = tg_calloc((size_t)TG_TRAINER_STAGING_MAX * (size_t)train->batch, sizeof *t->staging_rows);
    int depth = opts && opts->max_in_flight > 1 ? opts->max_in_flight : 1;
    if (depth > t->ex.vt->max_in_flight) depth = t->ex.vt->max_in_flight;
    if (depth > TG_TRAINER_STAGING_MAX - 2) depth = TG_TRAINER_STAGING_MAX - 2; /* GCOVR_EXCL_BR_LINE: the CPU executor keeps one step in flight; only CUDA's ring may be deeper */
    /* A step of N micro-batches keeps the device busy N times as long per start, and each
     * buffer is N images: two steps in flight are enough. */
    if (train->grad_accumulation > 1 && depth > 2) depth = 2; /* GCOVR_EXCL_BR_LINE: depth is the executor's max_in_flight at most, 1 on the CPU; only CUDA's ring is deeper */
    t->max_in_flight = depth;
    int group = opts && opts->step_group > 0 ? opts->step_group : t->ex.vt->step_group;
    if (train->grad_accumulation > 1) group = 1;
    /* Length buckets: consecutive batches rarely share a bucket, so a start seldom holds a
     * group, and each bucket would capture a group graph it hardly uses (on an H100 that
     * made 3 epochs of a 4-bucket run 0.8 s slower: docs/perf-notes.md). */
    if (train->n_buckets > 1 && !(opts && opts->step_group > 0)) group = 1;
    t->step_group = group > depth / 2 ? depth / 2 : group;
    if (t->step_group < 1) t->step_group = 1; /* GCOVR_EXCL_BR_LINE: depth 1 (the CPU's) makes it 0 always; deeper rings are CUDA's */
    t->host_trace = opts && opts->host_trace;
    t->n_staging = depth + 2;
    t->handed = -1;
    t->stop_at = -1;
    t->checkpoint_every = run->checkpoint_every;
    t->drain_every = opts ? opts->drain_every : 0;
    /* The executor opens on the last bucket (the plan itself); so do the buffers. */
    t->bucket = train->n_buckets > 1 ? train->n_buckets - 1 : 0;
    for (int k = 0; k < TG_TRAINER_STAGING_MAX; k++) t->staging_bucket[k] = t->bucket;
    t->gate = opts ? opts->launch_gate : NULL;
    t->gate_ctx = opts ? opts->gate_ctx : NULL;
    int staged = 1;
    for (int k = 0; k < t->n_staging; k++) {
        t->staging[k] = t->ex.vt->host_alloc(t->ex.impl, staging_bytes(t));
        staged &= t->staging[k] != NULL;
    }
    if (!t->batch_idx || !t->global_idx || !t->type_scratch || !t->staging_rows || !staged) goto fail_oom;
    if (tg_weights_image_alloc(plan, &t->values, err)) goto fail;
    tg_nvtx_push("weights load");
    tg_weights_init(&t->values, run->seed);
    const char *weights = opts && opts->weights ? opts->weights : cfg->weights;
    int weights_failed = 0;
    if (weights[0]) {
        snprintf(t->weights_path, sizeof t->weights_path, "%s", weights);
        weights_failed = tg_weights_load(&t->values, weights, &t->weights, err);
        t->weights_loaded = !weights_failed;
    }
    if (!weights_failed) weights_failed = upload_values(t, err);
    tg_nvtx_pop();
    if (weights_failed) goto fail;
    /* The trainable parameters live in the params pool from here on (save reads them back). */
    free(t->values.params);
    t->values.params = NULL;
    t->open_ms[1] = tg_wall_ms() - t0;
    t0 = tg_wall_ms();

    if (!opts || opts->load_data) {
        tg_nvtx_push("data load");
        const int loaded = load_data(t, opts, err);
        tg_nvtx_pop();
        if (loaded) goto fail;
    }
    t->open_ms[2] = tg_wall_ms() - t0;
    const int64_t global_batch = (int64_t)train->batch * t->replicas;
    /* Steps per epoch: windows of grad_accumulation batches (batches without). */
    const int64_t per_epoch = t->has_train ? windows_per_epoch(t, t->sampler.per_epoch) : 1;
    /* epochs x steps per epoch, both from user input: int32 each, so their product is exact
     * in int64; at most MAX_RUN_STEPS. */
    const int64_t total = run->steps > 0 ? run->steps : (int64_t)run->epochs * per_epoch;
    if (run->steps <= 0 && total > MAX_RUN_STEPS) {
        tg_fail(err, "%s: key 'epochs': %d epochs of %lld steps (%d rows in batches of %lld) make %lld steps, more "
                "than the %d one run may take",
                plan->job_path, run->epochs, (long long)per_epoch, t->train.n /* 0 without training data */,
                (long long)global_batch, (long long)total, MAX_RUN_STEPS);
        goto fail;
    }
    t->total_steps = (int32_t)total;
    if (write_scalar(t, plan->io.total_steps, (float)t->total_steps, err) || write_scalar(t, plan->io.step, 0.0f, err)) /* GCOVR_EXCL_BR_LINE: the CPU executor's write cannot fail; CUDA's can */
        goto fail;
    /* fp16: the loss scale starts at the plan's, its growth tracker at 0 (a resumed run
     * takes both from the checkpoint). */
    if (plan->io.loss_scale >= 0 && (write_scalar(t, plan->io.loss_scale, plan->train.loss_scale_init, err) || /* GCOVR_EXCL_BR_LINE: the CPU executor's write cannot fail; CUDA's can */
                                     write_scalar(t, plan->io.loss_scale_growth, 0.0f, err)))
        goto fail;
    if (t->has_train && !(opts && opts->no_loader_thread) &&
        tg_batch_loader_start(&t->loader, loader_fill, t, err))
        goto fail;
    return 0;
fail_oom:
    tg_fail(err, "out of memory opening the trainer's batch buffers");
fail:
    tg_trainer_close(t);
    return -1;
}

void tg_trainer_close(tg_trainer *t) {
    tg_err ignored;
    tg_batch_loader_stop(t->loader); /* before anything it fills from goes */
    t->loader = NULL;
    if (t->ex.vt) drain(t, &ignored); /* no step may still read a staging buffer */
    if (t->has_train) tg_dataset_free(&t->train);
    if (t->has_eval) tg_dataset_free(&t->eval);
    if (t->has_squad) tg_squad_eval_free(&t->squad);
    tg_batch_sampler_free(&t->sampler);
    free(t->batch_idx);
    free(t->global_idx);
    free(t->type_scratch);
    free(t->staging_rows);
    for (int k = 0; k < t->n_staging; k++)
        if (t->staging[k]) t->ex.vt->host_free(t->ex.impl, t->staging[k]);
    tg_executor_close(&t->ex);
    tg_weights_image_free(&t->values);
    tg_weights_report_free(&t->weights);
    memset(t, 0, sizeof *t);
}

/* Fills staging[k] with the next training batch, that of step j (from 0): every replica
 * draws the whole global batch and keeps its rows, replica r rows [r * batch, (r + 1) *
 * batch) (fewer, or none, in a short last batch). With grad_accumulation, the step's
 * window: its batches one after another, as micro-batches (an epoch's last window, short
 * of batches, is completed with empty ones, which count for nothing), each told the count
 * of labels that count in the whole window (io.loss_norm). */
static void fill_buffer(tg_trainer *t, int k, int64_t j) {
    tg_nvtx_pushf("batch %lld fill", (long long)j + 1);
    double t0 = t->host_trace ? tg_thread_cpu_s() : 0;
    tg_batch b;
    t->staging_epoch[k] = t->sampler.epoch;
    t->staging_pos[k] = t->sampler.pos;
    const int micro = micro_steps(t), draws = window_batches(t, j);
    const tg_plan_io *io = &t->plan->io;
    int64_t tokens = 0, counted[2] = {0, 0};
    for (int i = 0; i < micro; i++) {
        int32_t bucket = t->staging_bucket[k], mine = 0;
        const int32_t first = t->rank * t->shape.batch;
        if (i < draws) {
            const int32_t rows = tg_batch_sampler_next(&t->sampler, t->global_idx, &bucket);
            mine = rows <= first ? 0 : rows - first < t->shape.batch ? rows - first : t->shape.batch;
        }
        fill_batch(t, k, i, bucket, &t->train, t->global_idx + first, mine, 1, &b);
        write_mlm_stream(t, k, i, j);
        tokens += b.n_tokens;
        /* mlm: the masked positions, which the labels of the batch are not. */
        if (micro > 1 && io->mlm_stream >= 0) counted[0] += masked_positions(t, k, i);
        else if (micro > 1) count_window_labels(buffer_plan(t, k), staging_at(t, k, i, io->labels), counted);
    }
    const int64_t n_norm = micro > 1 ? tg_tensor_numel(&t->plan->tensors[io->loss_norm]) : 0;
    for (int i = 0; i < micro && n_norm; i++)
        for (int64_t c = 0; c < n_norm; c++) ((float *)staging_at(t, k, i, io->loss_norm))[c] = (float)counted[c];
    t->staging_tokens[k] = tokens;
    if (t->host_trace) t->fill_cpu_s += tg_thread_cpu_s() - t0;
    tg_nvtx_pop();
}

/* The loader thread's fill of batch j (runtime/batch_loader.h). */
static void loader_fill(void *ctx, int64_t j) {
    tg_trainer *t = ctx;
    fill_buffer(t, (int)(j % t->n_staging), j);
}

void tg_trainer_next_batch(tg_trainer *t) {
    park_loader(t);
    tg_err ignored; /* a failed step reports itself at the next step or read */
    drain(t, &ignored); /* the buffer may be a step's in flight */
    /* The batch of the run's next step: steps taken one at a time (tg_trainer_run_step)
     * count in steps_done only, and that step's number picks mlm's masks and an epoch's
     * last window. */
    fill_buffer(t, t->cur, t->steps_done);
    t->filled = t->launched + 1; /* later prefetched batches are dropped */
}

static int64_t real_tokens(tg_trainer *t, int k) {
    int64_t n = 0;
    /* Image models: each image of the batch counts as one. */
    if (t->plan->io.attention_mask < 0) return (int64_t)t->shape.batch * micro_steps(t);
    for (int m = 0; m < micro_steps(t); m++) {
        const float *mask = staging_at(t, k, m, t->plan->io.attention_mask);
        for (int64_t i = 0; i < (int64_t)t->shape.batch * buffer_plan(t, k)->train.seq; i++) n += mask[i] != 0.0f;
    }
    return n;
}

void tg_comm_timeline_add(tg_comm_timeline *c, const tg_step_result *r, int32_t step, float *busy_ms,
                          float *exposed_ms) {
    *busy_ms = *exposed_ms = -1.0f;
    const int n = r->comm_buckets < TG_COMM_TIMELINE_MAX ? r->comm_buckets : TG_COMM_TIMELINE_MAX;
    if (n <= 0) return;
    float busy = 0;
    for (int j = 0; j < n; j++) busy += r->comm_end_ms[j] - r->comm_begin_ms[j];
    *busy_ms = busy;
    *exposed_ms = r->comm_end_ms[n - 1] > 0 ? r->comm_end_ms[n - 1] : 0.0f;
    /* The first step waited for its graph's capture; a timeline of another shape is not
     * this one's (a plan's buckets are all alike). */
    if (step <= 1 || (c->buckets && c->buckets != n)) return;
    c->buckets = n, c->steps++;
    for (int j = 0; j < n; j++) c->begin_ms[j] += r->comm_begin_ms[j], c->end_ms[j] += r->comm_end_ms[j];
}

/* Waits for the oldest step in flight and hands out its statistics; k is its batch's
 * buffer, `t0` the wall clock at its start, for executors that give no step period. */
static int finish_step(tg_trainer *t, tg_step_stats *s, int k, double t0, tg_err *err) {
    tg_step_result r;
    memset(s, 0, sizeof *s);
    tg_nvtx_pushf("step %d wait", t->steps_done + 1);
    const int waited = t->ex.vt->step_wait(t->ex.impl, &r, err);
    tg_nvtx_pop();
    if (waited) return -1;
    s->tokens = t->staging_tokens[k];
    s->seq = buffer_plan(t, k)->train.seq;
    s->slots = (int64_t)micro_steps(t) * t->shape.batch * s->seq;
    s->loss = r.loss, s->lr = r.lr, s->grad_norm = r.grad_norm, s->loss_scale = r.loss_scale;
    memcpy(s->phase_ms, r.phase_ms, sizeof s->phase_ms);
    s->step_ms = r.period_ms > 0 ? r.period_ms : tg_wall_ms() - t0;
    s->step = ++t->steps_done;
    tg_comm_timeline_add(&t->comm, &r, s->step, &s->comm_ms, &s->comm_exposed_ms);
    if (s->step == 1) tg_memory_probe_sample(&t->memory); /* every buffer of a step is in use by now */
    /* The update ops skipped a step whose gradient norm is not finite: the weights are
     * untouched (plan/ops.def). The run goes on past such steps as the plan says. */
    s->skipped = !isfinite(s->grad_norm);
    if (s->skipped) {
        const tg_plan_run *run = &t->plan->run;
        t->skipped_steps++;
        /* fp16: an overflow at a scale still above 1 is the scaler finding its range
         * (GradScaler skips such steps without end); it counts toward max_skipped_steps
         * only once backing off has taken the scale below 1, where the unscaled gradients
         * themselves overflow. */
        if (t->plan->io.loss_scale >= 0 && s->loss_scale >= 1.0f && isfinite(s->loss)) return 0;
        if (!run->skip_nonfinite)
            return tg_fail(err, "step %d: the gradient norm is %f (loss %f): diverged; the step was not applied, "
                                "and skip_nonfinite = false stops here (lower lr or enable grad_clip)",
                           s->step, s->grad_norm, s->loss);
        if (++t->skipped_in_row > run->max_skipped_steps)
            return tg_fail(err, "step %d: %d steps in a row had a non-finite gradient norm and were skipped "
                                "(max_skipped_steps = %d); the weights are those from before them (lower lr or "
                                "enable grad_clip)",
                           s->step, t->skipped_in_row, run->max_skipped_steps);
        return 0;
    }
    t->skipped_in_row = 0;
    if (!isfinite(s->loss))
        return tg_fail(err, "step %d: loss is %f (diverged; lower lr or enable grad_clip)", s->step, s->loss);
    return 0;
}

/* The executor's start of `k` steps, numbered from the one after those started so far. */
static int start_steps(tg_trainer *t, const void *const *batches, int k, tg_err *err) {
    const long long first = (long long)t->steps_done + (t->launched - t->returned) + 1;
    if (k > 1) tg_nvtx_pushf("steps %lld-%lld launch", first, first + k - 1);
    else tg_nvtx_pushf("step %lld launch", first);
    const int rc = t->ex.vt->step_start(t->ex.impl, batches, k, err);
    tg_nvtx_pop();
    return rc;
}

/* Outside the ring's count: staging[cur] stays the caller's batch, so repeated calls
 * step on the same batch unless the caller refills it. */
int tg_trainer_run_step(tg_trainer *t, tg_step_stats *s, tg_err *err) {
    park_loader(t);
    if (drain(t, err)) return -1;
    if (select_bucket(t, t->staging_bucket[t->cur], err)) return -1;
    double t0 = tg_wall_ms();
    t->staging_tokens[t->cur] = real_tokens(t, t->cur);
    const void *batches[2] = {t->staging[t->cur], NULL};
    if (t->handed == t->cur) {
        /* The executor holds this buffer's earlier batch as already fetched, and the caller
         * may have rewritten it since: hand it a copy, which it uploads. */
        const int spare = (t->cur + 1) % t->n_staging;
        memcpy(t->staging[spare], t->staging[t->cur], staging_bytes(t));
        t->staging_fixed[spare] = 0, t->staging_marked[spare] = t->staging_marked[t->cur];
        t->staging_bucket[spare] = t->staging_bucket[t->cur];
        batches[0] = t->staging[spare];
    }
    t->handed = -1;
    if (start_steps(t, batches, 1, err)) return -1;
    t->filled = t->launched; /* the caller wrote over any batch prefetched there */
    return finish_step(t, s, t->cur, t0, err);
}

/* Batches below this may be filled: batch j goes where batch j - n_staging was, whose
 * step (and the one before, which fetched it) has finished once j < returned + n_staging;
 * one less keeps the buffer after the last filled one free for eval and the caller. */
static int64_t fill_limit(const tg_trainer *t) { return t->returned + t->n_staging - 1; }

/* Makes sure batches below `end` are filled (end <= fill_limit): waits for the loader, or
 * fills them on this thread without one. */
static void have_batches(tg_trainer *t, int64_t end) {
    if (t->loader) {
        if (!t->loader_running) {
            tg_batch_loader_resume(t->loader, t->filled, fill_limit(t));
            t->loader_running = 1;
        }
        tg_nvtx_push("batch wait");
        t->batch_wait_s += tg_batch_loader_wait(t->loader, end);
        tg_nvtx_pop();
        return;
    }
    for (; t->filled < end; t->filled++) fill_buffer(t, (int)(t->filled % t->n_staging), t->filled);
}

/* Of the k steps about to start from batch `launched` on, how many in a row share its
 * bucket (one start runs one bucket's graph). */
static int same_bucket_run(const tg_trainer *t, int k) {
    const int32_t b = t->staging_bucket[t->launched % t->n_staging];
    int n = 1;
    while (n < k && t->staging_bucket[(t->launched + n) % t->n_staging] == b) n++;
    return n;
}

/* The count no start may pass: the schedule's end, the step the run stops at, and the next
 * checkpoint step (and multiple of drain_every) above the steps handed out (none is then in
 * flight when it is taken). */
static int64_t launch_limit(const tg_trainer *t) {
    int64_t limit = t->total_steps;
    if (t->stop_at >= 0 && t->stop_at < limit) limit = t->stop_at;
    const int32_t every[2] = {t->checkpoint_every, t->drain_every};
    for (int k = 0; k < 2; k++)
        if (every[k] > 0) {
            const int64_t next = (t->returned / every[k] + 1) * every[k];
            if (next < limit) limit = next;
        }
    return limit;
}

/* Steps to start now: a whole group while the limit leaves one and there is room for it,
 * else single steps into the room the limit's last few leave; one when none is in flight
 * (past total_steps too), unless the run stops. */
static int steps_to_start(const tg_trainer *t) {
    const int64_t in_flight = t->launched - t->returned, room = t->max_in_flight - in_flight;
    const int64_t left = launch_limit(t) - t->launched;
    if (t->step_group > 1 && left >= t->step_group) return room >= t->step_group ? t->step_group : 0;
    if (room > 0 && left > 0) return 1;
    return in_flight == 0 && t->stop_at < 0;
}

double tg_step_device_ms(const tg_step_stats *s) {
    double ms = 0;
    for (int k = 0; k < 4; k++) ms += s->phase_ms[k];
    return ms;
}

int tg_trainer_trace_kernels(tg_trainer *t, int steps, tg_kernel_trace_summary *out, double *step_ms, tg_err *err) {
    memset(out, 0, sizeof *out);
    *step_ms = 0;
    if (t->ex.device != TG_DEVICE_CUDA) return tg_fail(err, "kernels are traced on a GPU only");
    if (t->plan->train.replicas > 1)
        return tg_fail(err, "not traced with %d replicas in the run (their steps run together)", t->plan->train.replicas);
    if (steps < 1) return tg_fail(err, "no steps to trace");
    if (drain(t, err) || tg_kernel_trace_start(err)) return -1;
    int rc = 0;
    for (int k = 0; k < steps && !rc; k++) {
        tg_step_stats st;
        rc = tg_trainer_run_step(t, &st, err);
        if (!rc) *step_ms += tg_step_device_ms(&st) / steps;
    }
    tg_kernel_span *spans = NULL;
    int64_t n = 0;
    tg_err stop_err;
    if (tg_kernel_trace_stop(&spans, &n, rc ? &stop_err : err)) rc = -1;
    if (!rc) rc = tg_kernel_trace_summarize(spans, n, steps, out, err);
    free(spans);
    return rc;
}

void tg_trainer_hold(tg_trainer *t, int hold) { t->stop_at = hold ? t->launched : -1; }

int tg_trainer_step(tg_trainer *t, tg_step_stats *s, tg_err *err) {
    if (!t->has_train) return tg_fail(err, "no training data is bound");
    double t0 = tg_wall_ms();
    for (int k; (k = steps_to_start(t)) > 0;) {
        if (t->gate) {
            const int64_t allowed = t->gate(t->gate_ctx, t->launched, k);
            if (allowed < k) { /* the run stops there: start what is allowed, if anything */
                t->stop_at = t->launched + (allowed > 0 ? allowed : 0);
                continue;
            }
        }
        /* Step j of the start runs on batch launched + j and fetches the one after. */
        const void *batches[TG_TRAINER_STAGING_MAX + 1];
        have_batches(t, t->launched + k + 1);
        k = same_bucket_run(t, k);
        if (select_bucket(t, t->staging_bucket[t->launched % t->n_staging], err)) return -1;
        for (int j = 0; j <= k; j++) batches[j] = t->staging[(t->launched + j) % t->n_staging];
        if (start_steps(t, batches, k, err)) return -1;
        t->launched += k;
        t->handed = (int)(t->launched % t->n_staging);
        t->cur = (int)(t->launched % t->n_staging);
    }
    if (t->returned == t->launched)
        return tg_fail(err, "no step to take: the run stops at step %lld", (long long)t->stop_at);
    /* The batch the next start hands over as its `next`, filled while the GPU runs (the
     * loader fills further ahead on its own). */
    if (!t->loader) have_batches(t, t->launched + 2);
    int rc = finish_step(t, s, (int)(t->returned % t->n_staging), t0, err);
    t->returned++;
    if (t->loader_running) tg_batch_loader_allow(t->loader, fill_limit(t));
    return rc;
}



/* qa: each question's answer from its windows' logits (span: all start logits, then all end
 * logits, seq per window) and the SQuAD v2 scores. */
static int score_squad(tg_trainer *t, const float *span, int64_t T, tg_eval_stats *s, tg_err *err) {
    const tg_squad_eval *ev = &t->squad;
    const tg_plan_run *run = &t->plan->run;
    tg_qa_postprocess_options opt = {.n_best = run->qa_n_best, .max_answer_len = run->qa_max_answer_length,
                                      .null_threshold = run->qa_null_threshold};
    for (int32_t q = 0; q < ev->n_questions && !opt.version_2; q++) opt.version_2 = ev->questions[q].n_answers == 0;
    tg_squad_totals tot;
    if (tg_squad_eval_score(ev, span, span + (int64_t)t->eval.n * T, T, (int32_t)T, &opt, &tot, err))
        return tg_fail_context(err, "%s: the qa eval", t->eval.path);
    s->questions = tot.total;
    s->exact = tg_squad_percent(tot.exact, tot.total);
    s->f1 = tg_squad_percent(tot.f1, tot.total);
    s->has_ans_total = tot.has_total;
    s->has_ans_exact = tg_squad_percent(tot.has_exact, tot.has_total);
    s->has_ans_f1 = tg_squad_percent(tot.has_f1, tot.has_total);
    s->no_ans_total = tot.no_total;
    s->no_ans_exact = tg_squad_percent(tot.no_exact, tot.no_total);
    s->no_ans_f1 = tg_squad_percent(tot.no_f1, tot.no_total);
    return 0;
}

int tg_trainer_eval(tg_trainer *t, tg_eval_stats *s, tg_err *err) { return tg_trainer_eval_logits(t, s, NULL, NULL, err); }

static int eval_logits(tg_trainer *t, tg_eval_stats *s, tg_eval_logits_fn on_batch, void *ctx, tg_err *err) {
    memset(s, 0, sizeof *s);
    if (!t->has_eval) return tg_fail(err, "no eval_data in the run settings");
    const tg_plan *p = t->plan;
    const tg_tensor *logits_t = &p->tensors[p->io.logits];
    int64_t classes = logits_t->shape[logits_t->ndim - 1];
    int64_t n_labels = tg_tensor_numel(&p->tensors[p->io.labels]);
    double loss_sum = 0;
    int64_t correct = 0;
    int64_t *tp = NULL, *fp = NULL, *fn = NULL;
    /* A staging buffer holding no upcoming training batch (fill_limit keeps one). */
    park_loader(t);
    if (drain(t, err)) return -1;
    int saved_cur = t->cur;
    t->cur = (int)((t->filled > t->launched ? t->filled : t->launched) % t->n_staging);
    const int qa = p->train.task == TG_TASK_QA;
    const int want_logits = p->train.task == TG_TASK_CLASSIFY || qa || on_batch;
    float *logits = want_logits ? tg_malloc(sizeof(float) * (size_t)tg_tensor_numel(logits_t)) : NULL;
    /* qa: every window's start and end logits, [eval examples, seq] each, for the answers. */
    const int64_t T = p->train.seq;
    float *span = qa ? tg_malloc(2 * sizeof(float) * (size_t)(t->eval.n * T)) : NULL;
    if ((want_logits && !logits) || (qa && !span)) {
        free(logits), free(span);
        t->cur = saved_cur;
        return tg_fail(err, "out of memory for the eval logits");
    }
    /* mlm: the positions the eval's masks (a fixed stream, kernels/mlm_mask.h) selected, and
     * for on_batch the ids as masked (the plan's masking op's outputs). */
    const tg_op *mask_op = masking_op(p);
    int32_t *mlm_labels = mask_op ? tg_malloc(sizeof(int32_t) * (size_t)n_labels * (on_batch ? 2 : 1)) : NULL;
    if (mask_op && !mlm_labels) {
        free(logits), free(span);
        t->cur = saved_cur;
        return tg_fail(err, "out of memory for the eval's masked labels");
    }
    int32_t *mlm_ids = mlm_labels && on_batch ? mlm_labels + n_labels : NULL;
    /* Per class: true positives, false positives, false negatives (macro-F1). */
    if (p->train.task == TG_TASK_CLASSIFY) {
        tp = tg_calloc((size_t)(3 * classes), sizeof *tp);
        if (!tp) {
            free(logits), free(span), free(mlm_labels);
            t->cur = saved_cur;
            return tg_fail(err, "out of memory for the eval's per-class counts");
        }
        fp = tp + classes, fn = fp + classes;
    }
    for (int32_t start = 0; start < t->eval.n; start += t->shape.batch) {
        int32_t n = t->eval.n - start < t->shape.batch ? t->eval.n - start : t->shape.batch;
        for (int32_t i = 0; i < n; i++) t->batch_idx[i] = start + i;
        tg_batch b;
        /* The eval runs in the last bucket (train.seq): its batches keep the set's order. */
        fill_batch(t, t->cur, 0, p->train.n_buckets > 1 ? p->train.n_buckets - 1 : 0, &t->eval, t->batch_idx, n, 0, &b);
        /* mlm: each eval batch its own masks, the same on every eval and run. */
        write_mlm_stream(t, t->cur, 0, start / t->shape.batch);
        float loss;
        if (tg_trainer_run(t, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, err) || read_scalar(t, p->io.loss, &loss, err) ||
            (logits && tg_trainer_read_f32(t, p->io.logits, logits, err)) ||
            (mlm_labels && tg_trainer_read(t, mask_op->out[1], mlm_labels, err)) ||
            (mlm_ids && tg_trainer_read(t, mask_op->out[0], mlm_ids, err))) {
            free(logits), free(tp), free(span), free(mlm_labels);
            t->cur = saved_cur;
            return -1;
        }
        t->eval_masked_ids = mlm_ids, t->eval_masked_labels = mlm_ids ? mlm_labels : NULL;
        const int failed = on_batch && on_batch(ctx, logits, start, n, err);
        t->eval_masked_ids = t->eval_masked_labels = NULL;
        if (failed) {
            free(logits), free(tp), free(span), free(mlm_labels);
            t->cur = saved_cur;
            return -1;
        }
        for (int64_t r = 0; qa && r < n; r++)
            for (int64_t k = 0; k < T; k++) {
                span[(start + r) * T + k] = logits[(r * T + k) * 2];
                span[((int64_t)t->eval.n + start + r) * T + k] = logits[(r * T + k) * 2 + 1];
            }
        const int32_t *labels = mlm_labels ? mlm_labels : tg_trainer_input(t, p->io.labels);
        /* qa: the batch's loss is a mean over its windows. */
        int64_t counted = qa ? n : counted_labels(labels, n_labels);
        loss_sum += (double)loss * (double)counted;
        s->counted += counted;
        if (p->train.task == TG_TASK_CLASSIFY) {
            for (int64_t r = 0; r < n_labels; r++) {
                if (labels[r] == TG_IGNORE_INDEX) continue;
                int64_t best = 0;
                for (int64_t c = 1; c < classes; c++)
                    if (logits[r * classes + c] > logits[r * classes + best]) best = c;
                correct += best == labels[r];
                if (best == labels[r]) tp[best]++;
                else if (fp[best]++, labels[r] >= 0 && labels[r] < classes) fn[labels[r]]++; /* GCOVR_EXCL_BR_LINE: the loaders (jsonl.c, shard_reader.c, shard_dataset.c) refuse a classify label outside [0, num_labels), and -100 rows are skipped above */
            }
        }
        s->examples += n;
    }
    free(logits), free(mlm_labels);
    t->cur = saved_cur;
    if (qa && score_squad(t, span, T, s, err)) {
        free(span), free(tp);
        return -1;
    }
    free(span);
    const int classify = p->train.task == TG_TASK_CLASSIFY;
    double f1_sum = 0;
    int f1_classes = 0;
    for (int64_t c = 0; classify && c < classes; c++) {
        if (tp[c] + fp[c] + fn[c] == 0) continue; /* neither a label nor a prediction */
        f1_sum += 2.0 * (double)tp[c] / (double)(2 * tp[c] + fp[c] + fn[c]);
        f1_classes++;
    }
    free(tp);
    const int lm = p->train.task == TG_TASK_LM || p->train.task == TG_TASK_MLM; /* perplexity */
    if (s->counted == 0) { /* nothing to average: no loss, accuracy or perplexity, not 0 and 1 */
        s->loss = NAN;
        s->accuracy = s->macro_f1 = classify ? NAN : -1.0;
        s->perplexity = lm ? NAN : -1.0;
        return 0;
    }
    s->loss = loss_sum / (double)s->counted;
    s->accuracy = classify ? (double)correct / (double)s->counted : -1.0;
    s->macro_f1 = classify ? f1_sum / f1_classes : -1.0;
    s->perplexity = lm ? exp(s->loss) : -1.0;
    return 0;
}

int tg_trainer_eval_logits(tg_trainer *t, tg_eval_stats *s, tg_eval_logits_fn on_batch, void *ctx, tg_err *err) {
    tg_nvtx_push("eval");
    const int rc = eval_logits(t, s, on_batch, ctx, err);
    tg_nvtx_pop();
    return rc;
}

int tg_trainer_profile(tg_trainer *t, int repeats, double *op_ms, tg_err *err) {
    if (upload_inputs(t, err)) return -1;
    tg_nvtx_pushf("profile (%d steps, ops one by one)", repeats);
    const int rc = t->ex.vt->profile(t->ex.impl, repeats, op_ms, err);
    tg_nvtx_pop();
    return rc;
}

void tg_trainer_memory(tg_trainer *t, tg_memory_use *use) {
    tg_memory_estimate est;
    tg_estimate_memory(t->plan, t->memory.device, &est);
    use->planned = t->plan->peak_bytes;
    use->estimated = est.total;
    use->measured = tg_memory_probe_peak(&t->memory);
}

/* Writes the current values with `write` (tg_weights_save or an export): the trainable
 * parameters as they are now; the frozen parameters and the buffers as the executor holds
 * them where it stores them in fp32 or int32 (anything written since the upload), else
 * (bf16 frozen tensors) the fp32 values they were narrowed from. */
static int write_values(tg_trainer *t, int (*write)(const tg_weights_image *, const void *, tg_err *), const void *arg,
                        const char *what, tg_err *err) {
    const tg_plan *plan = t->plan;
    t->values.params = tg_malloc(plan->pool_bytes[TG_POOL_PARAMS]);
    if (!t->values.params) return tg_fail(err, "out of memory for the host image of the parameters (%llu bytes)", (unsigned long long)plan->pool_bytes[TG_POOL_PARAMS]);
    int rc = tg_trainer_read(t, plan->io.params_all, t->values.params, err);
    for (int i = 0; i < plan->n_tensors && !rc; i++) {
        const tg_tensor *x = &plan->tensors[i];
        if (tg_tensor_is_value(x) && tg_tensor_class_of(x) != TG_CLASS_TRAINABLE && !tg_dtype_is_half(x->dtype))
            rc = tg_trainer_read(t, i, tg_weights_value(&t->values, i), err);
    }
    tg_nvtx_push(what);
    if (!rc) rc = write(&t->values, arg, err);
    tg_nvtx_pop();
    free(t->values.params);
    t->values.params = NULL;
    return rc ? -1 : 0;
}

static int save_to(const tg_weights_image *img, const void *path, tg_err *err) { return tg_weights_save(img, path, err); }
static int export_to(const tg_weights_image *img, const void *o, tg_err *err) { return tg_hf_export(img, o, err); }

int tg_trainer_save(tg_trainer *t, const char *path, tg_err *err) {
    return write_values(t, save_to, path, "weights save", err);
}

int tg_trainer_export_hf(tg_trainer *t, const tg_hf_export_options *options, tg_err *err) {
    return write_values(t, export_to, options, "export", err);
}

/* ---- checkpoints ------------------------------------------------------------------------- */

/* xxh64 of the training examples as the batches read them: each one's ids, token types
 * (or their absence), label and prompt. */
uint64_t tg_trainer_data_hash(tg_trainer *t) {
    if (t->train_hashed) return t->train_hash;
    XXH64_state_t h;
    XXH64_reset(&h, 0);
    for (int32_t i = 0; t->has_train && i < t->train.n; i++) {
        const tg_example *e = &t->train.examples[i];
        const int32_t head[3] = {e->len, e->label, e->token_type_ids != NULL};
        XXH64_update(&h, head, sizeof head);
        if (t->plan->train.task == TG_TASK_QA) XXH64_update(&h, &e->label_end, sizeof e->label_end);
        /* Only where there is one, so the hashes of data without prompts stay as they were. */
        if (e->prompt_len > 1) XXH64_update(&h, &e->prompt_len, sizeof e->prompt_len);
        if (e->pixels) XXH64_update(&h, e->pixels, (size_t)e->len); /* an image's bytes */
        else XXH64_update(&h, e->input_ids, (size_t)e->len * sizeof *e->input_ids);
        if (e->token_type_ids) XXH64_update(&h, e->token_type_ids, (size_t)e->len * sizeof *e->token_type_ids);
    }
    t->train_hash = XXH64_digest(&h);
    t->train_hashed = 1;
    return t->train_hash;
}

static tg_checkpoint_run run_identity(tg_trainer *t) {
    return (tg_checkpoint_run){t->total_steps, t->has_train ? t->train.n : 0, tg_trainer_data_hash(t)};
}

/* The host form of a value tensor: fp32 floats (whatever the storage dtype) or int32. */
static int host_dtype(const tg_tensor *x) { return x->dtype == TG_I32 ? TG_I32 : TG_F32; }

/* A copy of tensor i as the executor holds it, added to ck as `replica`'s. */
static int add_read(tg_trainer *t, tg_checkpoint *ck, int i, int replica, tg_err *err) {
    const tg_tensor *x = &t->plan->tensors[i];
    void *buf = tg_malloc((size_t)x->bytes); /* 0 bytes: still a block (base/alloc.h) */
    if (!buf) return tg_fail(err, "out of memory reading %s for the checkpoint", x->name);
    if (tg_trainer_read(t, i, buf, err)) {
        free(buf);
        return -1;
    }
    return tg_checkpoint_add_tensor(ck, x->name, replica, x->dtype, x->ndim, x->shape, buf, err);
}

/* A value tensor's values in host form (the fp32 ones a bf16 frozen tensor was narrowed
 * from, which the executor does not hold). */
static int add_value(tg_trainer *t, tg_checkpoint *ck, int i, tg_err *err) {
    const tg_tensor *x = &t->plan->tensors[i];
    if (!tg_dtype_is_half(x->dtype)) return add_read(t, ck, i, -1, err);
    const size_t bytes = (size_t)tg_tensor_numel(x) * sizeof(float);
    void *buf = tg_malloc(bytes);
    if (!buf) return tg_fail(err, "out of memory reading %s for the checkpoint", x->name);
    memcpy(buf, tg_weights_value(&t->values, i), bytes);
    return tg_checkpoint_add_tensor(ck, x->name, -1, TG_F32, x->ndim, x->shape, buf, err);
}

/* Whether replicas keep optimizer state of their own (ZeRO-1 slices). */
static int sliced_state(const tg_trainer *t) { return t->plan->train.zero_stage > 0 && t->replicas > 1; } /* GCOVR_EXCL_BR_LINE: zero_stage 1 needs replicas >= 2: compile.c and plan/validate.c refuse it otherwise */

static int checkpoint_gather(tg_trainer *t, tg_checkpoint *ck, int whole, tg_err *err) {
    tg_checkpoint_init(ck);
    const tg_plan *plan = t->plan;
    const tg_plan_io *io = &plan->io;
    park_loader(t);
    if (t->launched > t->returned)
        return tg_fail(err, "checkpoint: %lld steps are in flight; hold the trainer and take them first",
                       (long long)(t->launched - t->returned));
    int rc = 0;
    if (whole) {
        float counter = 0;
        const tg_checkpoint_run run = run_identity(t);
        rc = tg_checkpoint_identify(ck, plan, &run, err) || read_scalar(t, io->step, &counter, err);
        /* The next step's batch: drawn already into staging[cur] when filled ahead. */
        const int ahead = t->filled > t->launched;
        ck->state = (tg_checkpoint_state){
            .step = t->steps_done, .total_steps = t->total_steps, .replicas = t->replicas,
            .plan_fingerprint = plan->fingerprint, .dropout_seed = plan->run.seed,
            .dropout_counter = (uint64_t)counter, .sampler_examples = t->has_train ? t->train.n : 0,
            .sampler_epoch = ahead ? t->staging_epoch[t->cur] : t->sampler.epoch,
            .sampler_pos = ahead ? t->staging_pos[t->cur] : t->sampler.pos, .sampler_seed = plan->run.seed};
        for (int i = 0; i < plan->n_tensors && !rc; i++)
            if (tg_tensor_is_value(&plan->tensors[i])) rc = add_value(t, ck, i, err);
        if (!rc && io->params_bf16_all >= 0) rc = add_read(t, ck, io->params_bf16_all, -1, err);
        if (!rc) rc = add_read(t, ck, io->step, -1, err) || add_read(t, ck, io->total_steps, -1, err);
        if (!rc && io->loss_scale >= 0)
            rc = add_read(t, ck, io->loss_scale, -1, err) || add_read(t, ck, io->loss_scale_growth, -1, err);
    }
    const int replica = sliced_state(t) ? t->rank : -1;
    if (!rc && (whole || replica >= 0))
        rc = add_read(t, ck, io->m_all, replica, err) || add_read(t, ck, io->v_all, replica, err);
    if (rc) tg_checkpoint_free(ck);
    return rc ? -1 : 0;
}

int tg_trainer_checkpoint(tg_trainer *t, tg_checkpoint *ck, int whole, tg_err *err) {
    tg_nvtx_pushf("checkpoint gather (step %d)", t->steps_done);
    const int rc = checkpoint_gather(t, ck, whole, err);
    tg_nvtx_pop();
    return rc;
}

/* "768,32" (out: 96 bytes). */
static const char *shape_text(const int64_t *shape, int ndim, char *out) {
    out[0] = 0;
    for (int d = 0; d < ndim; d++) snprintf(out + strlen(out), 96 - strlen(out), "%s%lld", d ? "," : "", (long long)shape[d]);
    return out;
}

/* The checkpoint's tensor named as x of `replica`, checked against the plan's tensor x in
 * host form (host 1) or as stored; NULL with the message when it is missing or differs. */
static const tg_checkpoint_tensor *expect(const tg_checkpoint *ck, const char *name, const tg_tensor *x, int replica,
                                          int host, tg_err *err) {
    const tg_checkpoint_tensor *r = tg_checkpoint_find(ck, x->name, replica);
    if (!r) {
        tg_fail(err, "%s: tensor '%s'%s is missing from the checkpoint", name, x->name,
                replica >= 0 ? " (this replica's slice)" : "");
        return NULL;
    }
    const int dtype = host ? host_dtype(x) : x->dtype;
    int same = r->dtype == dtype && r->ndim == x->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = r->shape[d] == x->shape[d];
    if (!same) {
        char a[96], b[96];
        tg_fail(err, "%s: tensor '%s' is %s [%s] in the checkpoint, the plan needs %s [%s]", name, x->name,
                tg_dtype_name(r->dtype), shape_text(r->shape, r->ndim, a), tg_dtype_name(dtype),
                shape_text(x->shape, x->ndim, b));
        return NULL;
    }
    return r;
}

/* Whether every tensor of the checkpoint is one the plan has (other replicas' optimizer
 * slices included); refuses the first that is not. */
static int check_known(const tg_trainer *t, const tg_checkpoint *ck, const char *name, tg_err *err) {
    const tg_plan *plan = t->plan;
    const tg_plan_io *io = &plan->io;
    for (int k = 0; k < ck->n_tensors; k++) {
        const tg_checkpoint_tensor *r = &ck->tensors[k];
        int known = 0;
        for (int i = 0; i < plan->n_tensors && !known; i++) {
            if (strcmp(plan->tensors[i].name, r->name)) continue;
            const int state = i == io->m_all || i == io->v_all;
            known = state ? (r->replica >= 0) == sliced_state(t)
                          : r->replica == -1 && (tg_tensor_is_value(&plan->tensors[i]) || i == io->params_bf16_all ||
                                                 i == io->step || i == io->total_steps || i == io->loss_scale ||
                                                 i == io->loss_scale_growth);
        }
        if (!known)
            return tg_fail(err, "%s: tensor '%s' (replica %d) is not part of this plan's training state", name, r->name,
                           r->replica);
    }
    return 0;
}

int tg_trainer_restore(tg_trainer *t, const tg_checkpoint *ck, const char *name, tg_err *err) {
    const tg_plan *plan = t->plan;
    const tg_plan_io *io = &plan->io;
    const tg_checkpoint_state *s = &ck->state;
    if (t->steps_done || t->launched) /* returned never passes launched */
        return tg_fail(err, "%s: a trainer that has taken steps cannot resume a checkpoint", name);
    const tg_checkpoint_run run = run_identity(t);
    if (tg_checkpoint_check_identity(ck, plan, &run, name, err)) return -1;
    if (s->replicas != t->replicas || s->total_steps != t->total_steps || s->step > t->total_steps ||
        s->sampler_examples != run.train_examples || s->sampler_seed != plan->run.seed ||
        s->dropout_seed != plan->run.seed)
        return tg_fail(err, "%s: the state record (step %d of %d, %d replicas, %d examples) does not fit this run "
                            "(%d steps, %d replicas, %d examples) or its seed",
                       name, s->step, s->total_steps, s->replicas, s->sampler_examples, t->total_steps, t->replicas,
                       run.train_examples);
    if (check_known(t, ck, name, err)) return -1;
    /* Every value, through the host image and the upload that opened the trainer. */
    t->values.params = tg_calloc(1, plan->pool_bytes[TG_POOL_PARAMS]);
    if (!t->values.params) return tg_fail(err, "out of memory for the host image of the parameters (%llu bytes)", (unsigned long long)plan->pool_bytes[TG_POOL_PARAMS]);
    int rc = 0;
    for (int i = 0; i < plan->n_tensors && !rc; i++) {
        const tg_tensor *x = &plan->tensors[i];
        if (!tg_tensor_is_value(x)) continue;
        const tg_checkpoint_tensor *r = expect(ck, name, x, -1, 1, err);
        if (!r) rc = -1;
        else if (tg_tensor_class_of(x) == TG_CLASS_TRAINABLE)
            memcpy((uint8_t *)t->values.params + x->offset, r->data, r->bytes);
        else memcpy(tg_weights_value(&t->values, i), r->data, r->bytes);
    }
    if (!rc) rc = upload_values(t, err);
    free(t->values.params);
    t->values.params = NULL;
    if (rc) return -1;
    /* The bf16 copies, the optimizer state and the step counter (the dropout streams'). */
    const int replica = sliced_state(t) ? t->rank : -1;
    const struct { int tensor, replica; } state[] = {
        {io->params_bf16_all, -1}, {io->m_all, replica},  {io->v_all, replica},
        {io->step, -1},            {io->total_steps, -1}, {io->loss_scale, -1},
        {io->loss_scale_growth, -1}};
    for (size_t k = 0; k < sizeof state / sizeof state[0]; k++) {
        if (state[k].tensor < 0) continue;
        const tg_checkpoint_tensor *r = expect(ck, name, &plan->tensors[state[k].tensor], state[k].replica, 0, err);
        if (!r || tg_trainer_write(t, state[k].tensor, r->data, err)) return -1;
    }
    float counter;
    memcpy(&counter, tg_checkpoint_find(ck, plan->tensors[io->step].name, -1)->data, sizeof counter);
    if ((uint64_t)counter != s->dropout_counter)
        return tg_fail(err, "%s: tensor '%s' is %g, the state record's dropout counter %llu (file corrupt)", name,
                       plan->tensors[io->step].name, counter, (unsigned long long)s->dropout_counter);
    park_loader(t);
    if (t->has_train && tg_batch_sampler_seek(&t->sampler, s->sampler_epoch, s->sampler_pos, err))
        return tg_fail_context(err, "%s", name);
    /* The ring starts over at the checkpoint's step: nothing in flight or filled ahead. */
    t->steps_done = s->step;
    t->launched = t->returned = t->filled = s->step;
    t->cur = (int)(s->step % t->n_staging);
    t->handed = -1;
    memset(t->staging_fixed, 0, sizeof t->staging_fixed);
    return 0;
}
