/* The metrics file's lines: jansson objects written one per line (keys in the order they
 * were put), each real with its field's digits, a non-finite value as null with
 * "<key>_error" beside it; and the CLI's records built from them (step, summary, profile). */
#include "cli/metrics.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/atomic_file.h"

/* An object under construction; `bad` records a value or key that could not be added. */
typedef struct metrics_line {
    json_t *o;
    int bad;
} metrics_line;

static metrics_line line_begin(void) {
    json_t *o = json_object();
    return (metrics_line){o, o == NULL};
}

/* Takes v (json_object_set_new does, even when it fails; without a line, v is freed here). */
static void put(metrics_line *l, const char *key, json_t *v) {
    if (!l->o) json_decref(v), l->bad = 1;
    else if (!v || json_object_set_new(l->o, key, v)) l->bad = 1;
}

static void put_int(metrics_line *l, const char *key, long long v) { put(l, key, json_integer((json_int_t)v)); }
static void put_str(metrics_line *l, const char *key, const char *v) { put(l, key, json_string(v)); }
static void put_true(metrics_line *l, const char *key) { put(l, key, json_true()); } /* only true is written */

/* null, with "<key>_error": why beside it. */
static void put_missing(metrics_line *l, const char *key, const char *why) {
    char error_key[128];
    snprintf(error_key, sizeof error_key, "%s_error", key);
    put(l, key, json_null());
    put_str(l, error_key, why);
}

const char *metrics_eval_nothing_counted(const tg_eval_stats *ev) {
    if (ev->counted != 0) return NULL;
    return ev->perplexity < 0 ? "no rows to count in eval_data" : "no tokens to count in eval_data";
}

/* A real written with the digits `fmt` gives it (each field's precision): the value is
 * rounded through that text, which the dump's 15 significant digits print back as it is.
 * A value JSON cannot hold (inf, nan) is written as null, with "<key>_error":
 * "not finite" beside it. */
static void put_real(metrics_line *l, const char *key, double v, const char *fmt) {
    if (!isfinite(v)) {
        put_missing(l, key, "not finite");
        return;
    }
    char text[64];
    snprintf(text, sizeof text, fmt, v);
    put(l, key, json_real(strtod(text, NULL)));
}

/* Writes the object as one line (keys in the order they were put) and releases it:
 * 0, or -1 when it could not be built or written. */
static int line_write(metrics_line *l, FILE *f) {
    int rc = l->bad || json_dumpf(l->o, f, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15)) || fputc('\n', f) == EOF;
    json_decref(l->o);
    l->o = NULL;
    return rc ? -1 : 0;
}

/* The step line comes once per training step, so it is built once and updated in place:
 * its values are set on the same object every step, and the line is dumped into a buffer
 * and written with one fwrite. A fresh object per step, its reals rounded through text and
 * dumped piece by piece, took about 15 us of the training loop's time per step on an H100
 * host, half of the loop's own work. Reals carry 9 significant digits, which reads every
 * float statistic back exactly. */
#define STEP_FIELDS 11
static const char *const step_keys[STEP_FIELDS] = {"step",         "loss",     "lr",         "grad_norm",
                                                   "step_ms",      "tokens_per_s", "batch_ms", "forward_ms",
                                                   "backward_ms",  "optimizer_ms", "seq"};
/* The integer fields: the step and its sequence length (its bucket's). */
#define STEP_SEQ_FIELD 10
static int step_field_is_int(int k) { return k == 0 || k == STEP_SEQ_FIELD; }

struct metrics_step_line {
    json_t *o;
    json_t *v[STEP_FIELDS];
    json_t *loss_scale; /* fp16 runs: added at the first step that has a scale */
    /* data parallelism on CUDA: the gradient sums' busy and exposed ms, added at the first
     * step that measured them */
    json_t *comm_ms, *exposed_comm_ms;
};

metrics_step_line *metrics_step_line_new(void) {
    metrics_step_line *w = tg_calloc(1, sizeof *w);
    if (!w || !(w->o = json_object())) {
        free(w);
        return NULL;
    }
    for (int k = 0; k < STEP_FIELDS; k++) {
        w->v[k] = step_field_is_int(k) ? json_integer(0) : json_real(0.0);
        /* set (not set_new): the line keeps a reference of its own to update. */
        if (!w->v[k] || json_object_set(w->o, step_keys[k], w->v[k])) {
            metrics_step_line_free(w);
            return NULL;
        }
    }
    return w;
}

void metrics_step_line_free(metrics_step_line *w) {
    if (!w) return;
    for (int k = 0; k < STEP_FIELDS; k++) json_decref(w->v[k]);
    json_decref(w->loss_scale);
    json_decref(w->comm_ms);
    json_decref(w->exposed_comm_ms);
    json_decref(w->o);
    free(w);
}

int metrics_write_step(metrics_step_line *w, FILE *f, const tg_step_stats *s, double tokens_per_s) {
    const double v[STEP_FIELDS] = {s->step,      s->loss,        s->lr,          s->grad_norm,   s->step_ms,
                                   tokens_per_s, s->phase_ms[0], s->phase_ms[1], s->phase_ms[2], s->phase_ms[3],
                                   s->seq};
    int finite = 1;
    for (int k = 1; k < STEP_FIELDS; k++) finite &= isfinite(v[k]) != 0;
    if (!finite) { /* rare: the general line, with null and "<key>_error" where needed */
        metrics_line l = line_begin();
        for (int k = 0; k < STEP_FIELDS; k++)
            if (step_field_is_int(k)) put_int(&l, step_keys[k], (long long)v[k]);
            else put_real(&l, step_keys[k], v[k], "%.9g");
        if (s->skipped) put_true(&l, "skipped"); /* nothing was updated (a non-finite gradient norm) */
        if (s->loss_scale > 0) put_real(&l, "loss_scale", s->loss_scale, "%.9g");
        if (s->comm_ms > 0) {
            put_real(&l, "comm_ms", s->comm_ms, "%.9g");
            put_real(&l, "exposed_comm_ms", s->comm_exposed_ms, "%.9g");
        }
        return line_write(&l, f);
    }
    for (int k = 0; k < STEP_FIELDS; k++)
        if (step_field_is_int(k)) json_integer_set(w->v[k], (json_int_t)v[k]);
        else json_real_set(w->v[k], v[k]);
    if (s->loss_scale > 0 && !w->loss_scale &&
        (!(w->loss_scale = json_real(0.0)) || json_object_set(w->o, "loss_scale", w->loss_scale)))
        return -1;
    if (w->loss_scale) json_real_set(w->loss_scale, s->loss_scale);
    if (s->comm_ms > 0 && !w->comm_ms &&
        (!(w->comm_ms = json_real(0.0)) || json_object_set(w->o, "comm_ms", w->comm_ms) ||
         !(w->exposed_comm_ms = json_real(0.0)) || json_object_set(w->o, "exposed_comm_ms", w->exposed_comm_ms)))
        return -1;
    if (w->comm_ms) json_real_set(w->comm_ms, s->comm_ms), json_real_set(w->exposed_comm_ms, s->comm_exposed_ms);
    char buf[1024];
    size_t n = json_dumpb(w->o, buf, sizeof buf - 1, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    if (n == 0 || n >= sizeof buf - 1) return -1; /* GCOVR_EXCL_BR_LINE: 14 keys and numbers of at most 24 characters stay under 700 bytes; n == 0 is a failed dump */
    buf[n++] = '\n';
    return fwrite(buf, 1, n, f) == n ? 0 : -1;
}

int metrics_write_summary(FILE *f, const metrics_summary *s) {
    const tg_memory_use *mem = s->mem;
    metrics_line l = line_begin();
    put_true(&l, "summary");
    put_int(&l, "steps", s->steps);
    put_int(&l, "skipped_steps", s->skipped_steps);
    put_real(&l, "first_loss", s->first_loss, "%.6g");
    put_real(&l, "final_loss", s->final_loss, "%.6g");
    put_real(&l, "train_s", s->train_s, "%.3f");
    put_real(&l, "warmup_s", s->warmup_s, "%.3f");
    put_real(&l, "tokens_per_s", s->tokens / s->train_s, "%.1f");
    put_real(&l, "median_step_ms", s->median_step_ms, "%.4f");
    put_real(&l, "padding_fraction", s->padding_fraction, "%.4f");
    put_real(&l, "batch_wait_s", s->batch_wait_s, "%.4f");
    put_real(&l, "batch_wait_share", s->train_s > 0 ? s->batch_wait_s / s->train_s : 0, "%.5f");
    put_real(&l, "host_cpu_us_per_step", s->host_cpu_us, "%.1f");
    put_real(&l, "host_cpu_own_us_per_step", s->host_cpu_us - s->driver_cpu_us, "%.1f");
    put_real(&l, "loop_cpu_us_per_step", s->loop_cpu_us, "%.1f");
    put_real(&l, "driver_thread_cpu_us_per_step", s->driver_cpu_us, "%.1f");
    put_str(&l, "device", s->device);
    put_int(&l, "replicas", s->replicas);
    if (s->mfu > 0) {
        put_str(&l, "gpu", s->gpu);
        put_real(&l, "model_tflops", s->model_tflops, "%.2f");
        put_real(&l, "mfu", s->mfu, "%.4f");
    }
    if (s->energy_measured) {
        put_real(&l, "energy_j", s->energy.joules, "%.6g");
        put_real(&l, "joules_per_step", s->energy.joules_per_step, "%.6g");
        put_real(&l, "joules_per_1k_tokens", s->energy.joules_per_1k_tokens, "%.6g");
        put_real(&l, "avg_power_w", s->energy.avg_power_w, "%.6g");
        put_real(&l, "tokens_per_joule", s->energy.tokens_per_joule, "%.6g");
    }
    if (s->cost_per_1m_tokens > 0) put_real(&l, "cost_per_1m_tokens", s->cost_per_1m_tokens, "%.6g");
    if (s->comm_ms > 0) {
        put_real(&l, "median_comm_ms", s->comm_ms, "%.4f");
        put_real(&l, "median_exposed_comm_ms", s->comm_exposed_ms, "%.4f");
    }
    put_int(&l, "planned_peak_bytes", (long long)mem->planned);
    put_int(&l, "memory_estimate_bytes", (long long)mem->estimated);
    if (mem->measured >= 0) put_int(&l, "measured_peak_bytes", mem->measured);
    else put(&l, "measured_peak_bytes", json_null()), put_str(&l, "measured_peak_bytes_error", "not measurable here");
    if (s->eval) {
        const tg_eval_stats *ev = s->eval;
        const int qa = ev->questions > 0, classify = ev->perplexity < 0 && !qa;
        put_int(&l, "eval_examples", ev->examples);
        if (ev->counted == 0) { /* nothing measured: null with the reason, not 0 and 1 */
            const char *why = metrics_eval_nothing_counted(ev);
            put_missing(&l, "eval_loss", why);
            put_missing(&l, classify ? "eval_accuracy" : "eval_perplexity", why);
            if (classify) put_missing(&l, "eval_macro_f1", why);
        } else {
            put_real(&l, "eval_loss", ev->loss, "%.6g");
            if (classify) put_real(&l, "eval_accuracy", ev->accuracy, "%.6g"), put_real(&l, "eval_macro_f1", ev->macro_f1, "%.6g");
            else if (!qa) put_real(&l, "eval_perplexity", ev->perplexity, "%.6g");
        }
        if (qa) { /* the official SQuAD v2 scores, in percent */
            put_int(&l, "eval_questions", ev->questions);
            put_real(&l, "eval_exact", ev->exact, "%.6g");
            put_real(&l, "eval_f1", ev->f1, "%.6g");
            put_int(&l, "eval_HasAns_total", ev->has_ans_total);
            put_real(&l, "eval_HasAns_exact", ev->has_ans_exact, "%.6g");
            put_real(&l, "eval_HasAns_f1", ev->has_ans_f1, "%.6g");
            put_int(&l, "eval_NoAns_total", ev->no_ans_total);
            put_real(&l, "eval_NoAns_exact", ev->no_ans_exact, "%.6g");
            put_real(&l, "eval_NoAns_f1", ev->no_ans_f1, "%.6g");
        }
    }
    return line_write(&l, f);
}

int metrics_write_error(FILE *f, const char *message, int replica) {
    metrics_line l = line_begin();
    put_str(&l, "event", "error");
    put_str(&l, "message", message);
    if (replica >= 0) put_int(&l, "replica", replica);
    return line_write(&l, f);
}

int metrics_write_profile_kind(FILE *f, const char *op_name, int count, double ms) {
    metrics_line l = line_begin();
    put_str(&l, "profile_op", op_name);
    put_int(&l, "count", count);
    put_real(&l, "ms", ms, "%.4f");
    return line_write(&l, f);
}

int metrics_write_profile_group(FILE *f, const char *group, double ms) {
    metrics_line l = line_begin();
    put_str(&l, "profile_group", group);
    put_real(&l, "ms", ms, "%.4f");
    return line_write(&l, f);
}

int metrics_write_profile_graph(FILE *f, const char *what, double ms) {
    metrics_line l = line_begin();
    put_str(&l, "profile_graph", what);
    put_real(&l, "ms", ms, "%.4f");
    return line_write(&l, f);
}

int metrics_write_profile_phase(FILE *f, const char *phase, double ms) {
    metrics_line l = line_begin();
    put_str(&l, "profile_phase", phase);
    put_real(&l, "ms", ms, "%.4f");
    return line_write(&l, f);
}

int metrics_write_profile_comm(FILE *f, int j, int64_t bytes, double begin_ms, double end_ms) {
    metrics_line l = line_begin();
    put_int(&l, "profile_comm_bucket", j);
    put_int(&l, "bytes", bytes);
    put_real(&l, "begin_ms", begin_ms, "%.4f");
    put_real(&l, "end_ms", end_ms, "%.4f");
    put_real(&l, "exposed_ms", end_ms > 0 ? end_ms - (begin_ms > 0 ? begin_ms : 0) : 0, "%.4f");
    return line_write(&l, f);
}

int metrics_write_cost_model(FILE *f, const char *kind, const char *name, const char *device, int calibrated,
                             double predicted_ms, double measured_ms) {
    metrics_line l = line_begin();
    put_str(&l, "cost_model", kind);
    put_str(&l, "name", name);
    put_str(&l, "device", device);
    put(&l, "calibrated", json_boolean(calibrated));
    put_real(&l, "predicted_ms", predicted_ms, "%.4f");
    put_real(&l, "measured_ms", measured_ms, "%.4f");
    put_real(&l, "error_pct", measured_ms > 0 ? 100 * (predicted_ms - measured_ms) / measured_ms : NAN, "%.2f");
    return line_write(&l, f);
}

int metrics_write_profile_op(FILE *f, const tg_plan *p, int o, double ms) {
    const tg_op *op = &p->ops[o];
    int out = op->out[0] >= 0 ? op->out[0] : op->in[0];
    metrics_line l = line_begin();
    put_int(&l, "profile_op_index", o);
    put_str(&l, "op", tg_op_name(op->kind));
    put_str(&l, "tensor", out >= 0 ? p->tensors[out].name : "");
    put_real(&l, "ms", ms, "%.4f");
    if (op->kind == TG_OP_MATMUL) {
        const tg_matmul_params *mm = &op->p.matmul;
        put_int(&l, "M", mm->m);
        put_int(&l, "N", mm->n);
        put_int(&l, "K", mm->k);
        put_int(&l, "batch", mm->batch);
        put_int(&l, "trans_a", mm->trans_a);
        put_int(&l, "trans_b", mm->trans_b);
        put_int(&l, "accumulate", mm->accumulate);
        put_int(&l, "bias_grad", mm->bias_grad);
        put_int(&l, "act", mm->activation);
        put_real(&l, "tflops", ms > 0 ? 2.0 * mm->m * mm->n * mm->k * mm->batch / (ms * 1e9) : 0.0, "%.1f");
    }
    return line_write(&l, f);
}

/* ---- the file ---------------------------------------------------------------------- */

struct metrics_file {
    pthread_mutex_t lock;
    tg_atomic_file *file; /* NULL once ended */
    FILE *stream;
    char *path;
};

int metrics_file_open(metrics_file **out, const char *path, tg_err *err) {
    *out = NULL;
    metrics_file *m = tg_calloc(1, sizeof *m);
    if (!m || !(m->path = tg_strdup(path))) {
        free(m);
        return tg_fail(err, "%s: out of memory", path);
    }
    if (tg_atomic_begin(path, "metrics file", &m->file, err)) {
        free(m->path);
        free(m);
        return -1;
    }
    if (!(m->stream = tg_atomic_stream(m->file))) {
        tg_atomic_discard(m->file);
        free(m->path);
        free(m);
        return tg_fail(err, "%s: out of memory", path);
    }
    pthread_mutex_init(&m->lock, NULL);
    *out = m;
    return 0;
}

FILE *metrics_file_lock(metrics_file *m) {
    pthread_mutex_lock(&m->lock);
    return m->file ? m->stream : NULL;
}

void metrics_file_unlock(metrics_file *m) { pthread_mutex_unlock(&m->lock); }

int metrics_file_end(metrics_file *m, const char *error, int replica, tg_err *err) {
    pthread_mutex_lock(&m->lock);
    int rc = 0;
    if (m->file) {
        /* The lines so far go into place even when the error line cannot be added. */
        if (error && metrics_write_error(m->stream, error, replica))
            rc = tg_fail(err, "%s: cannot add the error line to the metrics file", m->path);
        tg_err commit_err;
        if (tg_atomic_commit(m->file, &commit_err)) {
            if (err) *err = commit_err;
            rc = -1;
        }
        m->file = NULL, m->stream = NULL;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

void metrics_file_free(metrics_file *m) {
    if (!m) return;
    if (m->file) tg_atomic_discard(m->file);
    pthread_mutex_destroy(&m->lock);
    free(m->path);
    free(m);
}
