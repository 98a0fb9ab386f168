/* Native checkpoints: the in-memory form, the run identity, the file format (written as a
 * stream through zstd, read back whole) and the checkpoint folder (names, `latest`,
 * keeping the newest few). runtime/checkpoint.h describes the format. */
#include "runtime/checkpoint.h"
#include "base/alloc.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/checked.h"
#include "base/version.h"
#include "plan/plan_file.h"

/* Header-only xxHash, as the plan file uses. */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <zstd.h>

#include "base/zstd_alloc.h"

static const uint8_t k_magic[8] = {'T', 'G', 'C', 'K', 'P', 'T', 0, 0};
#define HEADER_BYTES TG_CHECKPOINT_HEADER_BYTES
#define RECORD_HEAD_BYTES 12
#define STAT_BYTES 56
/* Parameters compress little; the fastest level keeps a save short. */
#define ZSTD_LEVEL 1
/* Far above any real checkpoint; keeps a hostile count from driving a huge allocation. */
#define MAX_FIELDS 4096
#define MAX_TENSORS (1 << 20)

/* ---- the in-memory form ----------------------------------------------------------------- */

void tg_checkpoint_init(tg_checkpoint *ck) { memset(ck, 0, sizeof *ck); }

void tg_checkpoint_free(tg_checkpoint *ck) {
    for (int i = 0; i < ck->n_blocks; i++) free(ck->blocks[i]);
    free(ck->blocks);
    free(ck->fields);
    free(ck->tensors);
    memset(ck, 0, sizeof *ck);
}

/* Room for element n of an array grown by doubling (capacity: the next power of two). */
static int room_for(void **array, int n, size_t elem) {
    if (n > 0 && (n & (n - 1))) return 0; /* not a power of two: room is left */
    const size_t cap = n ? 2 * (size_t)n : 8;
    void *p = tg_realloc(*array, cap * elem);
    if (!p) return -1;
    *array = p;
    return 0;
}

static int keep_block(tg_checkpoint *ck, void *block) {
    if (room_for((void **)&ck->blocks, ck->n_blocks, sizeof *ck->blocks)) return -1;
    ck->blocks[ck->n_blocks++] = block;
    return 0;
}

int tg_checkpoint_add_field(tg_checkpoint *ck, const char *key, const char *value, tg_err *err) {
    if (!key[0] || strlen(key) >= TG_CHECKPOINT_KEY_MAX || strlen(value) >= TG_PATH_MAX)
        return tg_fail(err, "checkpoint: identity field '%.80s' is empty or too long", key);
    if (room_for((void **)&ck->fields, ck->n_fields, sizeof *ck->fields)) return tg_fail(err, "checkpoint: out of memory adding identity field '%.80s'", key);
    tg_checkpoint_field *f = &ck->fields[ck->n_fields++];
    snprintf(f->key, sizeof f->key, "%s", key);
    snprintf(f->value, sizeof f->value, "%s", value);
    return 0;
}

const char *tg_checkpoint_field_value(const tg_checkpoint *ck, const char *key) {
    for (int i = 0; i < ck->n_fields; i++)
        if (!strcmp(ck->fields[i].key, key)) return ck->fields[i].value;
    return NULL;
}

/* The byte count of a tensor of that dtype and shape; -1 when it is not one. */
static int tensor_bytes(int dtype, int ndim, const int64_t *shape, uint64_t *bytes) {
    if (dtype < 0 || dtype >= TG_DTYPE_COUNT || ndim < 0 || ndim > TG_MAX_DIMS) return -1;
    uint64_t n = (uint64_t)tg_dtype_size(dtype);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || tg_mul_u64(n, (uint64_t)shape[d], &n)) return -1;
    *bytes = n;
    return 0;
}

static int push_tensor(tg_checkpoint *ck, const char *name, int replica, int dtype, int ndim, const int64_t *shape,
                       uint64_t bytes, const void *data) {
    if (room_for((void **)&ck->tensors, ck->n_tensors, sizeof *ck->tensors)) return -1;
    tg_checkpoint_tensor *t = &ck->tensors[ck->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->replica = replica, t->dtype = dtype, t->ndim = ndim, t->bytes = bytes, t->data = data;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    return 0;
}

int tg_checkpoint_add_tensor(tg_checkpoint *ck, const char *name, int replica, int dtype, int ndim,
                             const int64_t *shape, void *data, tg_err *err) {
    uint64_t bytes;
    if (!name[0] || strlen(name) >= TG_NAME_MAX || replica < -1 || tensor_bytes(dtype, ndim, shape, &bytes)) {
        free(data);
        return tg_fail(err, "checkpoint: tensor '%.100s' has a bad name, replica, dtype or shape", name);
    }
    if (keep_block(ck, data)) {
        free(data);
        return tg_fail(err, "checkpoint: out of memory adding tensor '%.100s'", name);
    }
    return push_tensor(ck, name, replica, dtype, ndim, shape, bytes, data) ? tg_fail(err, "checkpoint: out of memory adding tensor '%.100s'", name) : 0;
}

const tg_checkpoint_tensor *tg_checkpoint_find(const tg_checkpoint *ck, const char *name, int replica) {
    for (int i = 0; i < ck->n_tensors; i++)
        if (ck->tensors[i].replica == replica && !strcmp(ck->tensors[i].name, name)) return &ck->tensors[i];
    return NULL;
}

int tg_checkpoint_take_tensors(tg_checkpoint *to, tg_checkpoint *from, tg_err *err) {
    for (int i = 0; i < from->n_tensors; i++) {
        const tg_checkpoint_tensor *t = &from->tensors[i];
        if (push_tensor(to, t->name, t->replica, t->dtype, t->ndim, t->shape, t->bytes, t->data))
            return tg_fail(err, "checkpoint: out of memory moving tensor '%.100s'", t->name);
    }
    for (int i = 0; i < from->n_blocks; i++) {
        if (keep_block(to, from->blocks[i])) return tg_fail(err, "checkpoint: out of memory moving %d tensor blocks", from->n_blocks);
        from->blocks[i] = NULL; /* `to` owns it now */
    }
    tg_checkpoint_free(from);
    return 0;
}

/* ---- the run's identity ------------------------------------------------------------------ */

/* Fields shown in messages that a resume does not compare: where things are, and the plan's
 * fingerprint, which also covers settings that do not change the training (log_every,
 * eval_data, checkpoint keys, the job's line numbers). */
static const char *const k_info_fields[] = {"model", "train_data", "plan.fingerprint"};

static int is_info_field(const char *key) {
    for (size_t i = 0; i < sizeof k_info_fields / sizeof k_info_fields[0]; i++)
        if (!strcmp(key, k_info_fields[i])) return 1;
    return 0;
}

/* Fields added one after another; after the first failure the rest are skipped and rc
 * stays -1 with that failure's message. */
typedef struct field_adder {
    tg_checkpoint *ck;
    tg_err *err;
    int rc;
} field_adder;

static void fieldf(field_adder *a, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fieldf(field_adder *a, const char *key, const char *fmt, ...) {
    if (a->rc) return;
    char value[TG_PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof value, fmt, ap);
    va_end(ap);
    a->rc = tg_checkpoint_add_field(a->ck, key, value, a->err);
}

/* xxh64 of the plan's file encoding with everything that does not shape the computation
 * cleared: run settings, fingerprint and paths. */
static int plan_structure_hash(const tg_plan *plan, uint64_t *hash, tg_err *err) {
    tg_plan p = *plan; /* shallow: the tables are only read */
    memset(&p.run, 0, sizeof p.run);
    p.fingerprint = 0;
    p.job_path[0] = 0;
    p.model.source[0] = 0;
    p.model.weights[0] = 0;
    uint8_t *bytes;
    size_t len;
    if (tg_plan_encode(&p, &bytes, &len, err)) return -1;
    *hash = XXH64(bytes, len, 0);
    free(bytes);
    return 0;
}

int tg_checkpoint_identify(tg_checkpoint *ck, const tg_plan *plan, const tg_checkpoint_run *run, tg_err *err) {
    const tg_model_config *m = &plan->model;
    const tg_plan_train *t = &plan->train;
    const tg_op *schedule = NULL, *update = NULL;
    for (int o = 0; o < plan->n_ops; o++) {
        if (plan->ops[o].kind == TG_OP_SCHEDULE) schedule = &plan->ops[o];
        if (tg_op_is_update(plan->ops[o].kind)) update = &plan->ops[o];
    }
    uint64_t structure;
    if (plan_structure_hash(plan, &structure, err)) return -1;
    char real[PATH_MAX];
    const char *train_data = realpath(plan->run.train_data, real) ? real : plan->run.train_data;
    field_adder a = {ck, err, 0};
    fieldf(&a, "tunegraph", "%s", TG_VERSION_STRING);
    fieldf(&a, "model", "%s", m->source);
    fieldf(&a, "model.arch", "%s", tg_arch_name(m->arch));
    fieldf(&a, "model.vocab_size", "%d", m->vocab_size);
    fieldf(&a, "model.hidden", "%d", m->hidden);
    fieldf(&a, "model.layers", "%d", m->layers);
    fieldf(&a, "model.heads", "%d", m->heads);
    fieldf(&a, "model.intermediate", "%d", m->intermediate);
    fieldf(&a, "model.max_positions", "%d", m->max_positions);
    fieldf(&a, "model.type_vocab_size", "%d", m->type_vocab_size);
    fieldf(&a, "model.gelu", "%d", m->gelu);
    fieldf(&a, "model.layer_norm_eps", "%.9g", m->layer_norm_eps);
    fieldf(&a, "model.dropout", "hidden %.9g, attention %.9g, embedding %.9g, classifier %.9g", m->hidden_dropout,
           m->attention_dropout, m->embedding_dropout, m->classifier_dropout);
    fieldf(&a, "task", "%s", tg_task_name(t->task));
    fieldf(&a, "num_labels", "%d", t->num_labels);
    fieldf(&a, "batch", "%d", t->batch);
    fieldf(&a, "seq", "%d", t->seq);
    fieldf(&a, "pad_id", "%d", t->pad_id);
    fieldf(&a, "precision", "%s", tg_precision_name(t->precision));
    fieldf(&a, "allow_tf32", "%d", t->allow_tf32);
    fieldf(&a, "data_parallel", "%d", t->replicas);
    fieldf(&a, "zero_stage", "%d", t->zero_stage);
    /* Only where there is accumulation, so that checkpoints from before the key resume. */
    if (t->grad_accumulation > 1) fieldf(&a, "grad_accumulation", "%d", t->grad_accumulation);
    fieldf(&a, "attention", "%s", tg_attention_mode_name(t->attention));
    if (schedule) {
        fieldf(&a, "lr", "%.9g", schedule->p.schedule.lr);
        fieldf(&a, "warmup_steps", "%lld", (long long)schedule->p.schedule.warmup);
        fieldf(&a, "lr_schedule", "%s", tg_lr_schedule_name((int)schedule->p.schedule.form));
    }
    if (update) { /* ADAN's parameters begin with ADAMW's */
        fieldf(&a, "optimizer", "%s", tg_op_name(update->kind));
        fieldf(&a, "beta1", "%.9g", update->p.adamw.beta1);
        fieldf(&a, "beta2", "%.9g", update->p.adamw.beta2);
        if (update->kind == TG_OP_ADAN) {
            fieldf(&a, "beta3", "%.9g", update->p.adan.beta3);
            fieldf(&a, "no_prox", "%lld", (long long)update->p.adan.no_prox);
        }
        fieldf(&a, "eps", "%.9g", update->p.adamw.eps);
        fieldf(&a, "weight_decay", "%.9g", update->p.adamw.weight_decay);
        fieldf(&a, "grad_clip", "%.9g", update->p.adamw.max_grad_norm);
    }
    fieldf(&a, "seed", "%" PRIu64, plan->run.seed);
    fieldf(&a, "total_steps", "%d", run->total_steps);
    fieldf(&a, "train_data", "%s", train_data);
    fieldf(&a, "train_data.examples", "%d", run->train_examples);
    fieldf(&a, "train_data.xxh64", "%016" PRIx64, run->train_hash);
    fieldf(&a, "plan.structure", "%016" PRIx64, structure);
    fieldf(&a, "plan.fingerprint", "%016" PRIx64, plan->fingerprint);
    return a.rc ? -1 : 0;
}

/* Appends "; key: A in the checkpoint, B now" to list (cut short when full). */
static void note_difference(char *list, size_t cap, const char *key, const char *was, const char *now) {
    const size_t used = strlen(list);
    if (used + 1 >= cap) return;
    snprintf(list + used, cap - used, "%s%s: %.120s in the checkpoint, %.120s now", used ? "; " : "", key,
             was ? was : "(none)", now ? now : "(none)");
}

int tg_checkpoint_check_identity(const tg_checkpoint *ck, const tg_plan *plan, const tg_checkpoint_run *run,
                                 const char *name, tg_err *err) {
    tg_checkpoint now;
    tg_checkpoint_init(&now);
    if (tg_checkpoint_identify(&now, plan, run, err)) {
        tg_checkpoint_free(&now);
        return -1;
    }
    char differ[720] = "", info[300] = "";
    int structure = 0;
    for (int i = 0; i < now.n_fields; i++) {
        const char *key = now.fields[i].key, *was = tg_checkpoint_field_value(ck, key);
        if (was && !strcmp(was, now.fields[i].value)) continue;
        if (is_info_field(key)) note_difference(info, sizeof info, key, was, now.fields[i].value);
        else note_difference(differ, sizeof differ, key, was, now.fields[i].value);
        structure |= !strcmp(key, "plan.structure");
    }
    /* Fields the checkpoint has and this run does not (the info fields are always here). */
    for (int i = 0; i < ck->n_fields; i++)
        if (!tg_checkpoint_field_value(&now, ck->fields[i].key))
            note_difference(differ, sizeof differ, ck->fields[i].key, ck->fields[i].value, NULL);
    tg_checkpoint_free(&now);
    if (!differ[0]) return 0;
    return tg_fail(err, "%s: the checkpoint is of another job or plan: %s%s%s%s%s; resume with the job it was "
                        "written by, or start afresh",
                   name, differ, info[0] ? " (besides, " : "", info, info[0] ? ")" : "",
                   structure ? " (plan.structure: the plan's tensors or ops differ, as other freeze patterns, "
                               "fusion settings or another tunegraph build make them)"
                             : "");
}

/* ---- encoding ------------------------------------------------------------------------------ */

static void le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static uint64_t idnt_bytes(const tg_checkpoint *ck) {
    uint64_t n = 4;
    for (int i = 0; i < ck->n_fields; i++) n += 8 + strlen(ck->fields[i].key) + strlen(ck->fields[i].value);
    return n;
}

static uint64_t tensor_head_bytes(const tg_checkpoint_tensor *t) {
    return 4 + strlen(t->name) + 12 + 8 * (uint64_t)t->ndim + 8;
}

static uint64_t payload_bytes(const tg_checkpoint *ck) {
    uint64_t n = RECORD_HEAD_BYTES + idnt_bytes(ck) + RECORD_HEAD_BYTES + STAT_BYTES + RECORD_HEAD_BYTES;
    for (int i = 0; i < ck->n_tensors; i++)
        n += RECORD_HEAD_BYTES + tensor_head_bytes(&ck->tensors[i]) + ck->tensors[i].bytes;
    return n;
}

/* Where the compressed bytes go: a file (the header's place written last), or memory. */
typedef struct sink {
    int fd;
    uint8_t *mem;
    size_t len, cap;
    int error; /* errno of a failed write; ENOMEM */
} sink;

static int sink_put(sink *s, const void *p, size_t n) {
    if (s->fd >= 0) {
        const uint8_t *b = p;
        while (n > 0) {
            ssize_t w = write(s->fd, b, n);
            /* A regular file's write is not interrupted by a signal (local disk I/O is not
             * interruptible): no test can make EINTR happen. */
            if (w < 0 && errno == EINTR) continue; /* GCOVR_EXCL_BR_LINE: see above */
            if (w < 0) return s->error = errno, -1;
            b += w, n -= (size_t)w;
        }
        return 0;
    }
    if (s->len + n > s->cap) {
        size_t cap = s->cap ? s->cap : 1 << 16;
        while (cap < s->len + n) cap *= 2;
        uint8_t *m = tg_realloc(s->mem, cap);
        if (!m) return s->error = ENOMEM, -1;
        s->mem = m, s->cap = cap;
    }
    memcpy(s->mem + s->len, p, n);
    s->len += n;
    return 0;
}

typedef struct writer {
    ZSTD_CCtx *z;
    XXH64_state_t hash;
    uint64_t compressed;
    sink *out;
    uint8_t *buf;
    size_t buf_cap;
    const char *zstd_error;
    int failed; /* a write or zstd failed: later feeds do nothing */
} writer;

/* Compresses n raw payload bytes into the sink; mode ZSTD_e_end ends the frame. */
static void feed(writer *w, const void *p, size_t n, ZSTD_EndDirective mode) {
    if (w->failed) return;
    XXH64_update(&w->hash, p, n);
    ZSTD_inBuffer in = {p, n, 0};
    for (;;) {
        ZSTD_outBuffer o = {w->buf, w->buf_cap, 0};
        const size_t left = ZSTD_compressStream2(w->z, &o, &in, mode);
        /* zstd fails only when its allocations do (through tg_alloc): the pledged size is
         * payload_bytes, what is fed. */
        if (ZSTD_isError(left)) {
            w->zstd_error = tg_zstd_out_of_memory(left) /* GCOVR_EXCL_BR_LINE: see above */
                                ? "out of memory for the zstd compressor"
                                : ZSTD_getErrorName(left); /* GCOVR_EXCL_BR_LINE: zstd fails here only when its allocations do (the comment above) */
            w->failed = 1;
            return;
        }
        if (o.pos && sink_put(w->out, w->buf, o.pos)) {
            w->failed = 1;
            return;
        }
        w->compressed += o.pos;
        if (mode == ZSTD_e_continue ? in.pos == in.size : left == 0) return;
    }
}

static void feed_head(writer *w, const char tag[4], uint64_t len) {
    uint8_t h[RECORD_HEAD_BYTES];
    memcpy(h, tag, 4);
    le64(h + 4, len);
    feed(w, h, sizeof h, ZSTD_e_continue);
}

static void feed_str(writer *w, const char *s) {
    uint8_t n[4];
    le32(n, (uint32_t)strlen(s));
    feed(w, n, 4, ZSTD_e_continue);
    feed(w, s, strlen(s), ZSTD_e_continue);
}

static void feed_tensor(writer *w, const tg_checkpoint_tensor *t) {
    uint8_t h[12 + 8 * TG_MAX_DIMS + 8];
    le32(h, (uint32_t)t->replica);
    le32(h + 4, (uint32_t)t->dtype);
    le32(h + 8, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) le64(h + 12 + 8 * d, (uint64_t)t->shape[d]);
    le64(h + 12 + 8 * t->ndim, t->bytes);
    feed_head(w, "TNSR", tensor_head_bytes(t) + t->bytes);
    feed_str(w, t->name);
    feed(w, h, 12 + 8 * (size_t)t->ndim + 8, ZSTD_e_continue);
    feed(w, t->data, (size_t)t->bytes, ZSTD_e_continue);
}

/* The step at which TUNEGRAPH_TEST_CHECKPOINT_STALL asks the writer to stop part way
 * through the file until a signal is handled (tests signal or kill the process there); -1
 * when unset. */
static long stall_step(void) {
    const char *s = getenv("TUNEGRAPH_TEST_CHECKPOINT_STALL");
    return s && *s ? strtol(s, NULL, 10) : -1;
}

/* Test hook: the part written so far reaches the file (a file sink: only writes to a path
 * stall), then the thread waits until a SIGINT or SIGTERM has been handled (one that came
 * before the wait is not missed: they are blocked until sigsuspend), and goes on. A failed
 * flush is the write's failure, and nothing waits. */
static void stall(writer *w, const char *path) {
    feed(w, NULL, 0, ZSTD_e_flush);
    if (w->failed) return;
    (void)fsync(w->out->fd);
    sigset_t ending, old;
    sigemptyset(&ending);
    sigaddset(&ending, SIGINT);
    sigaddset(&ending, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &ending, &old);
    fprintf(stderr, "tunegraph: %s: stalled part-written (TUNEGRAPH_TEST_CHECKPOINT_STALL), waiting for a signal\n",
            path);
    fflush(stderr);
    sigset_t wait_mask = old;
    sigdelset(&wait_mask, SIGINT);
    sigdelset(&wait_mask, SIGTERM);
    sigsuspend(&wait_mask);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void make_header(uint8_t h[HEADER_BYTES], const tg_checkpoint *ck, uint64_t raw, uint64_t compressed,
                        uint64_t sum) {
    memcpy(h, k_magic, 8);
    le32(h + 8, TG_CHECKPOINT_VERSION);
    le32(h + 12, 0);
    le32(h + 16, (uint32_t)ck->state.step);
    le32(h + 20, 0);
    le64(h + 24, ck->state.plan_fingerprint);
    le64(h + 32, raw);
    le64(h + 40, compressed);
    le64(h + 48, sum);
    le64(h + 56, XXH64(h, 56, 0));
}

/* Streams the payload of ck into `out` (after the header's place); *raw and *sum describe
 * it, the writer's `compressed` counts what went out. `path` is for the test hook. */
static int write_payload(const tg_checkpoint *ck, sink *out, const char *path, uint64_t *raw, uint64_t *sum,
                         uint64_t *compressed, tg_err *err) {
    const char *name = path ? path : "checkpoint encode";
    writer w = {.out = out, .buf_cap = ZSTD_CStreamOutSize()};
    w.z = tg_zstd_cctx();
    w.buf = tg_malloc(w.buf_cap);
    if (!w.z || !w.buf) {
        ZSTD_freeCCtx(w.z);
        free(w.buf);
        return tg_fail(err, "%s: out of memory for the compression buffer", name);
    }
    *raw = payload_bytes(ck);
    XXH64_reset(&w.hash, 0);
    ZSTD_CCtx_setParameter(w.z, ZSTD_c_compressionLevel, ZSTD_LEVEL);
    ZSTD_CCtx_setPledgedSrcSize(w.z, *raw);
    const long stall_at = path ? stall_step() : -1;
    uint8_t stat[STAT_BYTES], n_fields[4];
    const tg_checkpoint_state *s = &ck->state;
    le32(stat, (uint32_t)s->step);
    le32(stat + 4, (uint32_t)s->total_steps);
    le32(stat + 8, (uint32_t)s->replicas);
    le64(stat + 12, s->plan_fingerprint);
    le64(stat + 20, s->dropout_seed);
    le64(stat + 28, s->dropout_counter);
    le32(stat + 36, (uint32_t)s->sampler_examples);
    le32(stat + 40, (uint32_t)s->sampler_epoch);
    le32(stat + 44, (uint32_t)s->sampler_pos);
    le64(stat + 48, s->sampler_seed);
    le32(n_fields, (uint32_t)ck->n_fields);
    feed_head(&w, "IDNT", idnt_bytes(ck));
    feed(&w, n_fields, 4, ZSTD_e_continue);
    for (int i = 0; i < ck->n_fields; i++) {
        feed_str(&w, ck->fields[i].key);
        feed_str(&w, ck->fields[i].value);
    }
    feed_head(&w, "STAT", STAT_BYTES);
    feed(&w, stat, STAT_BYTES, ZSTD_e_continue);
    for (int i = 0; i < ck->n_tensors; i++) {
        feed_tensor(&w, &ck->tensors[i]);
        if (i == 0 && stall_at == s->step && !w.failed) stall(&w, path);
    }
    feed_head(&w, "END!", 0);
    feed(&w, NULL, 0, ZSTD_e_end);
    *sum = XXH64_digest(&w.hash);
    *compressed = w.compressed;
    if (w.failed) {
        if (w.zstd_error) tg_fail(err, "%s: zstd: %s", name, w.zstd_error);
        else tg_fail(err, "%s: cannot write the checkpoint (write: %s)", name, strerror(out->error));
    }
    ZSTD_freeCCtx(w.z);
    free(w.buf);
    return w.failed ? -1 : 0;
}

int tg_checkpoint_encode(const tg_checkpoint *ck, uint8_t **out, size_t *out_len, tg_err *err) {
    *out = NULL, *out_len = 0;
    sink s = {.fd = -1};
    uint8_t header[HEADER_BYTES] = {0};
    uint64_t raw, sum, compressed;
    if (sink_put(&s, header, HEADER_BYTES) || write_payload(ck, &s, NULL, &raw, &sum, &compressed, err)) {
        free(s.mem);
        return s.error == ENOMEM ? tg_fail(err, "checkpoint encode: out of memory") : -1;
    }
    make_header(s.mem, ck, raw, compressed, sum);
    *out = s.mem, *out_len = s.len;
    return 0;
}

int tg_checkpoint_write(const tg_checkpoint *ck, const char *path, tg_err *err) {
    tg_atomic_file *f;
    if (tg_atomic_begin(path, "checkpoint", &f, err)) return -1;
    sink s = {.fd = tg_atomic_fd(f)};
    uint8_t header[HEADER_BYTES] = {0};
    uint64_t raw, sum, compressed;
    if (sink_put(&s, header, HEADER_BYTES)) {
        tg_atomic_discard(f);
        return tg_fail(err, "%s: cannot write the checkpoint (write: %s)", path, strerror(s.error));
    }
    if (write_payload(ck, &s, path, &raw, &sum, &compressed, err)) {
        tg_atomic_discard(f);
        return -1;
    }
    make_header(header, ck, raw, compressed, sum);
    /* GCOVR_EXCL_BR_START: the header overwrites 64 bytes written above at offset 0: no
     * file-size limit or full disk refuses them, and a signal does not interrupt it. */
    for (size_t done = 0; done < HEADER_BYTES;) {
        ssize_t w = pwrite(s.fd, header + done, HEADER_BYTES - done, (off_t)done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const int e = w < 0 ? errno : EIO;
            tg_atomic_discard(f);
            return tg_fail(err, "%s: cannot write the checkpoint (write: %s)", path, strerror(e));
        }
        done += (size_t)w;
    }
    /* GCOVR_EXCL_BR_STOP */
    return tg_atomic_commit(f, err);
}

/* ---- decoding ------------------------------------------------------------------------------ */

typedef struct reader {
    const uint8_t *p;
    size_t len, pos;
} reader;

static int has(const reader *r, uint64_t n) { return r->len - r->pos >= n; }

/* A string field: u32 length, then that many bytes (no NUL), shorter than `cap`. */
static int get_str(reader *r, char *dst, size_t cap, const char *name, const char *where, const char *field,
                   tg_err *err) {
    if (!has(r, 4)) return tg_fail(err, "%s: %s: field '%s' is cut short (file corrupt)", name, where, field);
    const uint32_t n = rd32(r->p + r->pos);
    r->pos += 4;
    if (n >= cap)
        return tg_fail(err, "%s: %s: field '%s' is %u bytes, at most %zu allowed (file corrupt)", name, where, field, n,
                       cap - 1);
    if (!has(r, n)) return tg_fail(err, "%s: %s: field '%s' is cut short (file corrupt)", name, where, field);
    if (memchr(r->p + r->pos, 0, n))
        return tg_fail(err, "%s: %s: field '%s' holds a NUL byte (file corrupt)", name, where, field);
    memcpy(dst, r->p + r->pos, n);
    dst[n] = 0;
    r->pos += n;
    return 0;
}

static int read_idnt(reader *r, const char *name, tg_checkpoint *ck, tg_err *err) {
    const char *where = "record 0 (IDNT)";
    if (!has(r, 4)) return tg_fail(err, "%s: %s: field 'count' is cut short (file corrupt)", name, where);
    const uint32_t n = rd32(r->p + r->pos);
    r->pos += 4;
    if (n > MAX_FIELDS || (uint64_t)n * 8 > r->len - r->pos)
        return tg_fail(err, "%s: %s: field 'count' is %u, more than the record holds (file corrupt)", name, where, n);
    for (uint32_t i = 0; i < n; i++) {
        char key[TG_CHECKPOINT_KEY_MAX], value[TG_PATH_MAX];
        if (get_str(r, key, sizeof key, name, where, "key", err) ||
            get_str(r, value, sizeof value, name, where, "value", err))
            return -1;
        if (!key[0]) return tg_fail(err, "%s: %s: field %u has an empty key (file corrupt)", name, where, i);
        if (tg_checkpoint_field_value(ck, key))
            return tg_fail(err, "%s: %s: field '%s' is there twice (file corrupt)", name, where, key);
        if (tg_checkpoint_add_field(ck, key, value, err)) return -1;
    }
    return 0;
}

static int read_stat(const uint8_t *b, const char *name, tg_checkpoint_state *s, tg_err *err) {
    s->step = (int32_t)rd32(b);
    s->total_steps = (int32_t)rd32(b + 4);
    s->replicas = (int32_t)rd32(b + 8);
    s->plan_fingerprint = rd64(b + 12);
    s->dropout_seed = rd64(b + 20);
    s->dropout_counter = rd64(b + 28);
    s->sampler_examples = (int32_t)rd32(b + 36);
    s->sampler_epoch = (int32_t)rd32(b + 40);
    s->sampler_pos = (int32_t)rd32(b + 44);
    s->sampler_seed = rd64(b + 48);
    const char *where = "record 1 (STAT)";
    if (s->step < 0 || s->total_steps < s->step)
        return tg_fail(err, "%s: %s: field 'step' is %d of %d total steps (file corrupt)", name, where, s->step,
                       s->total_steps);
    if (s->replicas < 1 || s->replicas > TG_MAX_DATA_PARALLEL)
        return tg_fail(err, "%s: %s: field 'replicas' is %d, not in [1, %d] (file corrupt)", name, where,
                       s->replicas, TG_MAX_DATA_PARALLEL);
    if (s->sampler_examples < 0 || s->sampler_epoch < 0 || s->sampler_pos < 0 ||
        s->sampler_pos > s->sampler_examples)
        return tg_fail(err, "%s: %s: field 'sampler': epoch %d, position %d of %d examples (file corrupt)", name,
                       where, s->sampler_epoch, s->sampler_pos, s->sampler_examples);
    return 0;
}

static int read_tensor(reader *r, int index, const char *name, tg_checkpoint *ck, tg_err *err) {
    char where[64], tname[TG_NAME_MAX];
    snprintf(where, sizeof where, "record %d (TNSR)", index);
    if (get_str(r, tname, sizeof tname, name, where, "name", err)) return -1;
    char at[TG_NAME_MAX + 80];
    snprintf(at, sizeof at, "record %d (tensor '%s')", index, tname);
    if (!tname[0]) return tg_fail(err, "%s: %s: field 'name' is empty (file corrupt)", name, where);
    if (!has(r, 12)) return tg_fail(err, "%s: %s: field 'replica' is cut short (file corrupt)", name, at);
    const int32_t replica = (int32_t)rd32(r->p + r->pos), dtype = (int32_t)rd32(r->p + r->pos + 4),
                  ndim = (int32_t)rd32(r->p + r->pos + 8);
    r->pos += 12;
    if (replica < -1 || replica >= ck->state.replicas)
        return tg_fail(err, "%s: %s: field 'replica' is %d, the checkpoint has %d (file corrupt)", name, at, replica,
                       ck->state.replicas);
    if (dtype < 0 || dtype >= TG_DTYPE_COUNT)
        return tg_fail(err, "%s: %s: field 'dtype' is %d, not a known dtype (file corrupt)", name, at, dtype);
    if (ndim < 0 || ndim > TG_MAX_DIMS)
        return tg_fail(err, "%s: %s: field 'ndim' is %d, not in [0, %d] (file corrupt)", name, at, ndim, TG_MAX_DIMS);
    if (!has(r, 8 * (uint64_t)ndim + 8))
        return tg_fail(err, "%s: %s: field 'shape' is cut short (file corrupt)", name, at);
    int64_t shape[TG_MAX_DIMS] = {0};
    for (int d = 0; d < ndim; d++) shape[d] = (int64_t)rd64(r->p + r->pos + 8 * (size_t)d);
    r->pos += 8 * (size_t)ndim;
    const uint64_t bytes = rd64(r->p + r->pos);
    r->pos += 8;
    uint64_t want;
    if (tensor_bytes(dtype, ndim, shape, &want))
        return tg_fail(err, "%s: %s: field 'shape' has a negative or overflowing dimension (file corrupt)", name, at);
    if (bytes != want)
        return tg_fail(err, "%s: %s: field 'bytes' is %" PRIu64 ", its dtype and shape make %" PRIu64
                            " (file corrupt)",
                       name, at, bytes, want);
    if (!has(r, bytes))
        return tg_fail(err, "%s: %s: field 'data' is cut short: %" PRIu64 " bytes, %zu left (file corrupt)", name, at,
                       bytes, r->len - r->pos);
    if (tg_checkpoint_find(ck, tname, replica))
        return tg_fail(err, "%s: %s: the tensor is there twice (file corrupt)", name, at);
    /* A guard against a hostile count: reaching it takes 2^20 records, each compared with
     * every one before it above, hours of work for a test. */
    if (ck->n_tensors >= MAX_TENSORS) /* GCOVR_EXCL_BR_LINE: 2^20 records take hours to check */
        return tg_fail(err, "%s: %s: more than %d tensors (file corrupt)", name, at, MAX_TENSORS);
    if (push_tensor(ck, tname, replica, dtype, ndim, shape, bytes, r->p + r->pos))
        return tg_fail(err, "%s: out of memory", name);
    r->pos += (size_t)bytes;
    return 0;
}

/* The tag as text for messages: printable, else in hex. */
static void tag_text(const uint8_t *tag, char out[16]) {
    int printable = 1;
    for (int i = 0; i < 4; i++) printable &= isprint(tag[i]) != 0;
    if (printable) snprintf(out, 16, "'%c%c%c%c'", tag[0], tag[1], tag[2], tag[3]);
    else snprintf(out, 16, "0x%02x%02x%02x%02x", tag[0], tag[1], tag[2], tag[3]);
}

/* The records of the payload, in their order: IDNT, STAT, TNSR..., END!. */
static int read_records(const uint8_t *payload, size_t len, const char *name, uint32_t header_step,
                        uint64_t header_fingerprint, tg_checkpoint *ck, tg_err *err) {
    reader all = {payload, len, 0};
    int ended = 0;
    for (int index = 0; all.pos < all.len; index++) {
        if (ended) return tg_fail(err, "%s: record %d follows the END! record (file corrupt)", name, index);
        if (!has(&all, RECORD_HEAD_BYTES))
            return tg_fail(err, "%s: record %d: its header is cut short (file corrupt)", name, index);
        const uint8_t *tag = all.p + all.pos;
        const uint64_t body = rd64(tag + 4);
        char tag_s[16];
        tag_text(tag, tag_s);
        all.pos += RECORD_HEAD_BYTES;
        if (!has(&all, body))
            return tg_fail(err, "%s: record %d (%s): field 'length' is %" PRIu64 ", %zu bytes are left (file corrupt)",
                           name, index, tag_s, body, all.len - all.pos);
        reader r = {all.p + all.pos, (size_t)body, 0};
        all.pos += (size_t)body;
        const int want = index == 0 ? 0 : index == 1 ? 1 : 2; /* IDNT, STAT, then tensors or END! */
        int rc;
        if (!memcmp(tag, "IDNT", 4) && want == 0) rc = read_idnt(&r, name, ck, err);
        else if (!memcmp(tag, "STAT", 4) && want == 1) {
            if (body != STAT_BYTES)
                return tg_fail(err, "%s: record 1 (STAT): field 'length' is %" PRIu64 ", not %d (file corrupt)", name,
                               body, STAT_BYTES);
            rc = read_stat(r.p, name, &ck->state, err);
            r.pos = r.len;
            if (!rc && (uint32_t)ck->state.step != header_step)
                return tg_fail(err, "%s: header field 'step' is %u, the state record says %d (file corrupt)", name,
                               header_step, ck->state.step);
            if (!rc && ck->state.plan_fingerprint != header_fingerprint)
                return tg_fail(err, "%s: header field 'plan fingerprint' disagrees with the state record (file corrupt)",
                               name);
        } else if (!memcmp(tag, "TNSR", 4) && want == 2) rc = read_tensor(&r, index, name, ck, err);
        else if (!memcmp(tag, "END!", 4) && want == 2) {
            rc = 0;
            ended = 1;
        } else {
            static const char *const expected[] = {"the identity (IDNT)", "the state (STAT)", "a tensor (TNSR) or END!"};
            return tg_fail(err, "%s: record %d: tag %s where %s belongs (file corrupt)", name, index, tag_s,
                           expected[want]);
        }
        if (rc) return -1;
        if (r.pos != r.len)
            return tg_fail(err, "%s: record %d (%s): %zu bytes past its fields (file corrupt)", name, index, tag_s,
                           r.len - r.pos);
    }
    if (!ended) return tg_fail(err, "%s: the payload ends without its END! record (file corrupt)", name);
    return 0;
}

int tg_checkpoint_decode(const uint8_t *b, size_t len, const char *name, tg_checkpoint *ck, tg_err *err) {
    tg_checkpoint_init(ck);
    if (!name) name = "checkpoint";
    /* Magic before length, so a short file of another kind is called what it is. */
    if (len > 0 && memcmp(b, k_magic, len < 8 ? len : 8) != 0)
        return tg_fail(err, "%s: not a tunegraph checkpoint (header field 'magic')", name);
    if (len < HEADER_BYTES)
        return tg_fail(err, "%s: truncated: %zu bytes, the checkpoint header alone is %d", name, len, HEADER_BYTES);
    const uint32_t version = rd32(b + 8);
    if (version != TG_CHECKPOINT_VERSION)
        return tg_fail(err, "%s: header field 'version': checkpoint format %u, this build reads format %d", name,
                       version, TG_CHECKPOINT_VERSION);
    if (rd64(b + 56) != XXH64(b, 56, 0))
        return tg_fail(err, "%s: header field 'header checksum' does not match the header (file corrupt)", name);
    if (rd32(b + 12) != 0 || rd32(b + 20) != 0)
        return tg_fail(err, "%s: header field '%s' is 0x%x, not 0 (file corrupt or from a newer build)", name,
                       rd32(b + 12) ? "flags" : "reserved", rd32(b + 12) ? rd32(b + 12) : rd32(b + 20));
    const uint64_t usize = rd64(b + 32), csize = rd64(b + 40), sum = rd64(b + 48);
    const size_t have = len - HEADER_BYTES;
    if (csize > have)
        return tg_fail(err, "%s: truncated: header field 'compressed bytes' is %" PRIu64 ", the file holds %zu after "
                            "the header",
                       name, csize, have);
    if (csize < have)
        return tg_fail(err, "%s: %zu bytes past the %" PRIu64 " that header field 'compressed bytes' gives (file corrupt)",
                       name, have - (size_t)csize, csize);
    const uint8_t *frame = b + HEADER_BYTES;
    const unsigned long long fsize = ZSTD_getFrameContentSize(frame, (size_t)csize);
    if (fsize == ZSTD_CONTENTSIZE_ERROR || fsize == ZSTD_CONTENTSIZE_UNKNOWN || fsize != usize)
        return tg_fail(err, "%s: header field 'payload bytes' (%" PRIu64 ") disagrees with the compressed frame (file "
                            "corrupt)",
                       name, usize);
    /* A zstd block yields at most 128 KiB from 4 bytes, so no frame expands more than
     * 32768-fold: a larger size must not drive the allocation. */
    if (usize == 0 || usize > SIZE_MAX / 2 || usize / 32768 > csize)
        return tg_fail(err, "%s: header field 'payload bytes' (%" PRIu64 ") is impossible (file corrupt)", name, usize);
    uint8_t *payload = tg_malloc((size_t)usize);
    if (!payload || keep_block(ck, payload)) {
        free(payload);
        return tg_fail(err, "%s: out of memory for a %" PRIu64 "-byte payload", name, usize);
    }
    const size_t got = tg_zstd_decompress(payload, (size_t)usize, frame, (size_t)csize);
    if (tg_zstd_out_of_memory(got)) {
        tg_checkpoint_free(ck);
        return tg_fail(err, "%s: out of memory for the zstd decompressor", name);
    }
    /* GCOVR_EXCL_BR_START: got != usize without a zstd error cannot happen: the frame's
     * content size is usize (checked above), and zstd refuses a frame whose content differs
     * from its stated size or overflows the buffer; kept as a guard on untrusted input. */
    if (ZSTD_isError(got) || got != usize) {
        tg_checkpoint_free(ck);
        return tg_fail(err, "%s: the payload does not decompress: %s (file corrupt)", name,
                       ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short");
    }
    /* GCOVR_EXCL_BR_STOP */
    const uint64_t actual = XXH64(payload, (size_t)usize, 0);
    if (actual != sum) {
        tg_checkpoint_free(ck);
        return tg_fail(err, "%s: header field 'payload checksum' is %016" PRIx64 ", the payload's xxh64 is %016" PRIx64
                            " (file corrupt)",
                       name, sum, actual);
    }
    if (read_records(payload, (size_t)usize, name, rd32(b + 16), rd64(b + 24), ck, err)) {
        tg_checkpoint_free(ck);
        return -1;
    }
    return 0;
}

int tg_checkpoint_read(const char *path, tg_checkpoint *ck, tg_err *err) {
    tg_checkpoint_init(ck);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_fail(err, "%s: cannot open the checkpoint: %s", path, strerror(errno));
    struct stat st;
    memset(&st, 0, sizeof st); /* a failed fstat leaves st_mode 0: not a regular file */
    (void)fstat(fd, &st);
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tg_fail(err, "%s: not a checkpoint file", path);
    }
    uint8_t *bytes = tg_malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
    if (!bytes) {
        close(fd);
        return tg_fail(err, "%s: out of memory for %lld bytes", path, (long long)st.st_size);
    }
    /* A file that ends before the size fstat gave (a sysfs file, one cut short meanwhile)
     * is decoded as far as it goes, so refused as truncated; only a failed read is an error. */
    size_t got = 0;
    int e = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, bytes + got, (size_t)st.st_size - got);
        /* GCOVR_EXCL_BR_START: a regular file's read fails only on an I/O error, and a
         * signal does not interrupt it: no test can make either happen. */
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) e = errno;
        /* GCOVR_EXCL_BR_STOP */
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (e) { /* GCOVR_EXCL_BR_LINE: as the read above */
        free(bytes);
        return tg_fail(err, "%s: read error: %s", path, strerror(e));
    }
    int rc = tg_checkpoint_decode(bytes, got, path, ck, err);
    free(bytes);
    return rc;
}

/* ---- the checkpoint folder ----------------------------------------------------------------- */

/* The step of a checkpoint file name "step-<digits>.tgckpt"; -1 for any other name. */
static long step_of_name(const char *name) {
    if (strncmp(name, "step-", 5) || !isdigit((unsigned char)name[5])) return -1;
    char *end;
    errno = 0;
    const long step = strtol(name + 5, &end, 10);
    if (errno || step > INT32_MAX || strcmp(end, TG_CHECKPOINT_EXT)) return -1;
    return step;
}

int tg_checkpoint_dir_prepare(const char *dir, tg_err *err) {
    if (!dir[0]) return tg_fail(err, "checkpoint folder: the name is empty");
    char *path = tg_strdup(dir);
    if (!path) return tg_fail(err, "checkpoint folder %s: out of memory", dir);
    for (char *c = path + 1; *c; c++) /* mkdir -p */
        if (*c == '/') {
            *c = 0;
            if (mkdir(path, 0755) != 0 && errno != EEXIST) break;
            *c = '/';
        }
    int rc = 0;
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        rc = tg_fail(err, "%s: cannot create the checkpoint folder: %s", dir, strerror(errno));
    struct stat st;
    memset(&st, 0, sizeof st); /* a failed stat leaves st_mode 0: not a folder */
    if (!rc) (void)stat(path, &st);
    if (!rc && !S_ISDIR(st.st_mode))
        rc = tg_fail(err, "%s: the checkpoint folder is not a folder", dir);
    if (!rc && access(path, W_OK | X_OK) != 0)
        rc = tg_fail(err, "%s: cannot write into the checkpoint folder: %s", dir, strerror(errno));
    free(path);
    return rc;
}

typedef struct step_file {
    long step;
    char name[NAME_MAX + 1];
} step_file;

static int by_step_descending(const void *a, const void *b) {
    const long x = ((const step_file *)a)->step, y = ((const step_file *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The checkpoint files of the folder, newest first (malloc'd into *files); -1 with errno. */
static int list_steps(const char *dir, step_file **files, int *n) {
    *files = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const long step = step_of_name(e->d_name);
        if (step < 0) continue;
        if (*n == cap) {
            step_file *grown = tg_realloc(*files, (size_t)(cap = cap ? 2 * cap : 16) * sizeof **files);
            if (!grown) {
                closedir(d);
                free(*files);
                *files = NULL;
                errno = ENOMEM;
                return -1;
            }
            *files = grown;
        }
        (*files)[*n].step = step;
        snprintf((*files)[*n].name, sizeof (*files)[*n].name, "%s", e->d_name);
        (*n)++;
    }
    closedir(d);
    if (*n) qsort(*files, (size_t)*n, sizeof **files, by_step_descending);
    return 0;
}

/* Removes temporary files that processes now gone left while writing a checkpoint or
 * `latest` here ("<name>.tmp.<pid>.<n>", base/atomic_file.h). */
static void remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return; /* GCOVR_EXCL_BR_LINE: the folder was listed and written into just before */
    for (struct dirent *e; (e = readdir(d));) {
        const char *tmp = strstr(e->d_name, ".tmp.");
        if (!tmp) continue;
        const size_t stem = (size_t)(tmp - e->d_name);
        char target[NAME_MAX + 1];
        snprintf(target, sizeof target, "%.*s", (int)stem, e->d_name);
        if (step_of_name(target) < 0 && strcmp(target, TG_CHECKPOINT_LATEST)) continue;
        char *end;
        const long pid = strtol(tmp + 5, &end, 10);
        if (pid <= 0 || *end != '.' || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* its writer may still be at work */
        (void)unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

int tg_checkpoint_save_in_dir(const tg_checkpoint *ck, const char *dir, int keep, char **path_out, tg_err *err) {
    if (path_out) *path_out = NULL;
    int32_t newest;
    if (tg_checkpoint_dir_newest(dir, &newest))
        return tg_fail(err, "%s: cannot list the checkpoint folder: %s", dir, strerror(errno));
    if (newest > ck->state.step)
        return tg_fail(err, "%s: the checkpoint folder holds step-%06d%s, past step %d being written (another run's "
                            "checkpoints: give another folder)",
                       dir, newest, TG_CHECKPOINT_EXT, ck->state.step);
    char name[64];
    snprintf(name, sizeof name, "step-%06d%s", ck->state.step, TG_CHECKPOINT_EXT);
    char *path = NULL, *latest = NULL;
    if (tg_asprintf(&path, "%s/%s", dir, name) < 0) path = NULL;
    if (!path || tg_asprintf(&latest, "%s/%s", dir, TG_CHECKPOINT_LATEST) < 0) {
        free(path);
        return tg_fail(err, "checkpoint folder %s: out of memory naming step file %s", dir, name);
    }
    char line[80];
    snprintf(line, sizeof line, "%s\n", name);
    const tg_chunk chunk = {line, strlen(line)};
    int rc = tg_checkpoint_write(ck, path, err);
    if (!rc) rc = tg_write_file_atomic(latest, &chunk, 1, "checkpoint pointer", err);
    free(latest);
    if (!rc) { /* the new one and `latest` are on disk: the oldest may go */
        step_file *files;
        int n;
        if (list_steps(dir, &files, &n) == 0) {
            for (int i = keep > 0 ? keep : n; i < n; i++) {
                char *old;
                if (tg_asprintf(&old, "%s/%s", dir, files[i].name) < 0) break;
                (void)unlink(old);
                free(old);
            }
            free(files);
        }
        remove_stale_temps(dir);
    }
    if (!rc && path_out) *path_out = path;
    else free(path);
    return rc;
}

int tg_checkpoint_dir_newest(const char *dir, int32_t *step) {
    step_file *files;
    int n;
    *step = -1;
    if (list_steps(dir, &files, &n)) return errno == ENOENT ? 0 : -1;
    if (n) *step = (int32_t)files[0].step;
    free(files);
    return 0;
}

int tg_checkpoint_locate(const char *where, char **path, tg_err *err) {
    *path = NULL;
    struct stat st;
    if (stat(where, &st) != 0) return tg_fail(err, "%s: cannot open the checkpoint: %s", where, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        *path = tg_strdup(where);
        return *path ? 0 : tg_fail(err, "%s: out of memory naming the checkpoint", where);
    }
    char *latest;
    if (tg_asprintf(&latest, "%s/%s", where, TG_CHECKPOINT_LATEST) < 0) return tg_fail(err, "%s: out of memory naming the checkpoint", where);
    FILE *f = fopen(latest, "r");
    if (f) {
        char line[NAME_MAX + 2] = "";
        const int got = fgets(line, sizeof line, f) != NULL;
        fclose(f);
        line[strcspn(line, "\r\n")] = 0;
        if (!got || step_of_name(line) < 0) {
            tg_fail(err, "%s: names '%.80s', not a checkpoint file of the folder (step-N%s)", latest, line,
                    TG_CHECKPOINT_EXT);
            free(latest);
            return -1;
        }
        free(latest);
        if (tg_asprintf(path, "%s/%s", where, line) < 0) return *path = NULL, tg_fail(err, "%s: out of memory naming the checkpoint", where);
        return 0;
    }
    free(latest);
    step_file *files;
    int n;
    if (list_steps(where, &files, &n)) return tg_fail(err, "%s: cannot list the folder: %s", where, strerror(errno));
    int rc = 0;
    if (!n) rc = tg_fail(err, "%s: no checkpoint in the folder (step-N%s)", where, TG_CHECKPOINT_EXT);
    else if (tg_asprintf(path, "%s/%s", where, files[0].name) < 0) *path = NULL, rc = tg_fail(err, "%s: out of memory naming the checkpoint", where);
    free(files);
    return rc;
}
