/* The cost model (plan/cost_model.h): per-op roofline, the step with its overlaps, and the
 * fit of the efficiency factors to measured op times. */
#include "plan/cost_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "plan/gpu_specs.h"
#include "plan/grad_hold.h"
#include "plan/memory_estimate.h"
#include "plan/op_meta.h"

/* The flops column of every op kind, from the one op list. */
static const char *const flops_formulas[] = {
#define TG_OP(KIND, name, set, inputs, outputs, contract, rule, flops, group) [TG_OP_##KIND] = #flops,
#include "plan/ops.def"
};
_Static_assert(sizeof flops_formulas / sizeof flops_formulas[0] == TG_OP_COUNT, "every op kind needs a FLOPs row");

const char *tg_cost_flops_formula(int kind) { return kind >= 0 && kind < TG_OP_COUNT ? flops_formulas[kind] : NULL; }

double tg_cost_op_flops(const tg_plan *plan, int o) { return tg_op_flops(&plan->ops[o]); }

/* Bytes of slot tensor `t` as op `op` touches it (out: whether it is an output slot s). */
static double slot_bytes(const tg_plan *plan, const tg_op *op, int t, int out, int s) {
    const tg_tensor *x = &plan->tensors[t];
    double b = (double)x->bytes;
    const int64_t numel = tg_tensor_numel(x);
    if ((op->kind == TG_OP_EMBEDDING && !out && s == 1) || (op->kind == TG_OP_EMBEDDING_BWD && out && s == 0))
        b = (double)op->p.embedding.n * (double)op->p.embedding.dim * tg_dtype_size(x->dtype);
    if (tg_op_is_update(op->kind) && numel > 0) {
        const int64_t count = op->p.adamw.zero_slice > 0 ? op->p.adamw.zero_slice : op->p.adamw.n;
        if (count < numel) b *= (double)count / (double)numel;
    }
    if (out && (tg_op_out_contract(op->kind, s) == TG_ACCUMULATE ||
                (op->kind == TG_OP_MATMUL && s == 0 && op->p.matmul.accumulate)))
        b *= 2; /* read, then written */
    return b;
}

double tg_cost_op_bytes(const tg_plan *plan, int o) {
    const tg_op *op = &plan->ops[o];
    const double r = plan->train.replicas > 1 ? plan->train.replicas : 1;
    if (op->kind == TG_OP_ALL_REDUCE) return 2.0 * (r - 1) / r * (double)op->p.count.n * 4; /* f32 (plan/ops.def) */
    if (op->kind == TG_OP_REDUCE_SCATTER) return (r - 1) / r * (double)op->p.reduce_scatter.n * 4; /* half of it */
    if (op->kind == TG_OP_ALL_GATHER)
        return (r - 1) * (double)op->p.all_gather.slice * tg_dtype_size(plan->tensors[op->out[0]].dtype);
    double bytes = 0;
    for (int s = 0; s < TG_OP_MAX_IN; s++)
        if (op->in[s] >= 0) bytes += slot_bytes(plan, op, op->in[s], 0, s);
    /* SCHEDULE's out1 is its in0, the step counter updated in place: counted once. */
    for (int s = 0; s < TG_OP_MAX_OUT; s++)
        if (op->out[s] >= 0 && (op->kind != TG_OP_SCHEDULE || s == 0)) bytes += slot_bytes(plan, op, op->out[s], 1, s);
    return bytes;
}

double tg_cost_seconds(const tg_cost_device *d, int group, double flops, double bytes, int *bound) {
    const double bw = group == TG_GROUP_COMM ? d->link_bw : d->peak_bw;
    const double tc = flops > 0 ? flops / (d->peak_flops * d->eff_flops[group]) : 0;
    const double tm = bytes > 0 ? bytes / (bw * d->eff_bw[group]) : 0;
    if (bound) *bound = tc >= tm && tc > 0 ? TG_COST_COMPUTE : TG_COST_MEMORY;
    return (tc > tm ? tc : tm) + d->launch_s;
}

int tg_cost_attention_backend(const tg_cost_device *d, const tg_op *op, int dtype) {
    if (d->cpu || !d->cudnn_attention || (op->kind != TG_OP_ATTENTION && op->kind != TG_OP_ATTENTION_BWD))
        return TG_COST_ATTENTION_OWN;
    const tg_attention_params *at = &op->p.attention;
    const int eligible = (dtype == TG_BF16 || dtype == TG_F16) && (at->head_dim == 64 || at->head_dim == 128) &&
                         at->p == 0.0f && at->b > 0 && at->h > 0 && at->t > 0;
    return eligible ? TG_COST_ATTENTION_CUDNN : TG_COST_ATTENTION_OWN;
}

tg_cost_sample tg_cost_op_sample(const tg_plan *plan, int o, const tg_cost_device *d) {
    const tg_op *op = &plan->ops[o];
    tg_cost_sample s = {.group = tg_op_group_of(op->kind), .flops = tg_cost_op_flops(plan, o),
                        .bytes = tg_cost_op_bytes(plan, o)};
    if (op->kind == TG_OP_ATTENTION || op->kind == TG_OP_ATTENTION_BWD) {
        /* The storage type of Q (the backward's in0 is dO, of the same type). */
        const int q = op->in[0];
        const int dtype = q >= 0 && q < plan->n_tensors ? plan->tensors[q].dtype : TG_F32;
        s.attention = op->kind == TG_OP_ATTENTION ? TG_COST_ATTENTION_FORWARD : TG_COST_ATTENTION_BACKWARD;
        s.backend = tg_cost_attention_backend(d, op, dtype);
        s.causal = op->p.attention.causal != 0;
        s.work = (double)op->p.attention.t * (double)op->p.attention.head_dim;
    }
    return s;
}

/* The compute efficiency of sample s on d (a fraction of peak_flops). */
static double compute_efficiency(const tg_cost_device *d, const tg_cost_sample *s) {
    if (s->attention != TG_COST_PLAIN) {
        const tg_cost_attention *a = &d->attention[s->backend];
        double e = s->attention == TG_COST_ATTENTION_FORWARD ? a->eff_forward : a->eff_backward;
        if (a->work_half > 0 && s->work > 0) e *= s->work / (s->work + a->work_half);
        return s->causal ? e * a->causal_factor : e;
    }
    double e = d->eff_flops[s->group];
    if (s->group == TG_GROUP_MATMUL && d->matmul_flops_half > 0) e *= s->flops / (s->flops + d->matmul_flops_half);
    return e;
}

double tg_cost_sample_seconds(const tg_cost_device *d, const tg_cost_sample *s, int *bound) {
    /* The CPU: one pair per group, its attention one kernel whatever the shape. */
    if (d->cpu || (s->attention == TG_COST_PLAIN && !(s->group == TG_GROUP_MATMUL && d->matmul_flops_half > 0)))
        return tg_cost_seconds(d, s->group, s->flops, s->bytes, bound);
    const double tc = s->flops > 0 ? s->flops / (d->peak_flops * compute_efficiency(d, s)) : 0;
    const double tm = s->bytes > 0 ? s->bytes / (d->peak_bw * d->eff_bw[s->group]) : 0;
    if (bound) *bound = tc >= tm && tc > 0 ? TG_COST_COMPUTE : TG_COST_MEMORY;
    return (tc > tm ? tc : tm) + d->launch_s;
}

/* Default factors, stated rather than measured: what a well-tuned kernel of each group
 * commonly reaches on a recent GPU (matmuls 60% of the dense peak, streaming kernels
 * 70-80% of the bandwidth), and one half everywhere on the CPU. */
static const double gpu_eff[TG_GROUP_COUNT][2] = {
    [TG_GROUP_MATMUL] = {0.60, 0.70},    [TG_GROUP_ATTENTION] = {0.40, 0.60}, [TG_GROUP_NORM] = {0.25, 0.70},
    [TG_GROUP_EMBEDDING] = {0.10, 0.40}, [TG_GROUP_LOSS] = {0.25, 0.60},      [TG_GROUP_OPTIMIZER] = {0.25, 0.80},
    [TG_GROUP_MEMORY] = {0.25, 0.80},    [TG_GROUP_COMM] = {1.00, 0.70},
};
#define GPU_LAUNCH_S 3e-6 /* a small kernel in a captured graph, gap included */
#define CPU_PEAK_FLOPS 50e9
#define CPU_PEAK_BW 10e9
#define CPU_LAUNCH_S 5e-6

int tg_cost_device_builtin(const char *key, int precision, int allow_tf32, tg_cost_device *d, tg_err *err) {
    memset(d, 0, sizeof *d);
    if (key && !strcmp(key, "cpu")) {
        snprintf(d->key, sizeof d->key, "cpu");
        snprintf(d->name, sizeof d->name, "the CPU executor");
        d->cpu = 1;
        d->peak_flops = CPU_PEAK_FLOPS, d->peak_bw = d->link_bw = CPU_PEAK_BW, d->launch_s = CPU_LAUNCH_S;
        for (int g = 0; g < TG_GROUP_COUNT; g++) d->eff_flops[g] = d->eff_bw[g] = 0.5;
        for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++)
            d->attention[b] = (tg_cost_attention){0.5, 0.5, 0, 1, 0};
        d->update_overlap = 1;
        return 0;
    }
    const tg_gpu_spec *s = tg_gpu_spec_by_key(key);
    if (!s) {
        char keys[256] = "cpu";
        for (int k = 0; tg_gpu_spec_at(k); k++)
            snprintf(keys + strlen(keys), sizeof keys - strlen(keys), ", %s", tg_gpu_spec_at(k)->key);
        return tg_fail(err, "no cost description for device '%s' (known: %s)", key ? key : "", keys);
    }
    snprintf(d->key, sizeof d->key, "%s", s->key);
    snprintf(d->name, sizeof d->name, "%s", s->key);
    d->peak_flops = tg_gpu_spec_peak_tflops(s, precision, allow_tf32) * 1e12;
    d->peak_bw = s->mem_gbps * 1e9, d->link_bw = s->link_gbps * 1e9, d->launch_s = GPU_LAUNCH_S;
    for (int g = 0; g < TG_GROUP_COUNT; g++) d->eff_flops[g] = gpu_eff[g][0], d->eff_bw[g] = gpu_eff[g][1];
    /* Uncalibrated, both backends take the attention group's factor and no shape term. */
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++)
        d->attention[b] = (tg_cost_attention){gpu_eff[TG_GROUP_ATTENTION][0], gpu_eff[TG_GROUP_ATTENTION][0], 0, 1, 0};
    /* As the executor decides (kernels/cudnn_attention.h): cuDNN unless TUNEGRAPH_ATTENTION=own. */
    const char *backend = getenv("TUNEGRAPH_ATTENTION");
    d->cudnn_attention = !(backend && !strcmp(backend, "own"));
    d->graph_launch_s = d->launch_s, d->update_overlap = 1;
    return 0;
}

void tg_cost_prediction_free(tg_cost_prediction *p) {
    free(p->ops);
    p->ops = NULL;
}

/* The forward with the previous step's update beside it (runtime/deferred_update.h): the
 * update covers the parameters at a steady rate, in the order the forward first reads them,
 * and forward op j starts once the update has passed the prefix need[j] it reads; the
 * backward waits for the whole update. Returns the forward's time so, or the serial
 * forward's when the plan's update cannot be deferred (*update_s 0). */
static double forward_beside_update(const tg_plan *plan, const double *op_s, double serial, double *update_s,
                                    int *failed) {
    const int f0 = plan->phase_begin[TG_PHASE_FORWARD], f1 = plan->phase_begin[TG_PHASE_FORWARD + 1];
    *update_s = 0;
    if (plan->n_ops < 1 || f1 < f0 || plan->train.precision == TG_PREC_FP16) return serial;
    int64_t *need = tg_calloc((size_t)(f1 - f0) + 1, sizeof *need);
    if (!need) {
        *failed = 1;
        return serial;
    }
    const uint64_t shared = plan->grads_share_activations ? plan->pool_bytes[TG_POOL_GRADS] : 0;
    double t = serial;
    const tg_op *last = &plan->ops[plan->n_ops - 1];
    if (tg_update_read_prefix(plan->tensors, plan->ops, plan->n_ops, f0, f1, shared, need) == 1 && last->p.adamw.n > 0) {
        const double u = op_s[plan->n_ops - 1], n = (double)last->p.adamw.n;
        t = 0;
        for (int j = 0; j < f1 - f0; j++) {
            const double ready = u * (double)need[j] / n;
            t = (t > ready ? t : ready) + op_s[f0 + j];
        }
        if (t < u) t = u;
        *update_s = u;
    }
    free(need);
    return t;
}

int tg_cost_predict(const tg_plan *plan, const tg_cost_device *d, tg_cost_prediction *out, tg_err *err) {
    memset(out, 0, sizeof *out);
    out->n_ops = plan->n_ops;
    out->ops = tg_calloc(plan->n_ops > 0 ? (size_t)plan->n_ops : 1, sizeof *out->ops);
    /* Each op's time inside the step: its launch term that of a captured graph. */
    double *step_op = tg_calloc(plan->n_ops > 0 ? (size_t)plan->n_ops : 1, sizeof *step_op);
    if (!out->ops || !step_op) {
        free(step_op);
        tg_cost_prediction_free(out);
        return tg_fail(err, "out of memory for the cost model's %d ops", plan->n_ops);
    }
    const double in_graph = d->cpu ? 0 : d->graph_launch_s - d->launch_s;
    double step_phase[TG_PHASE_COUNT] = {0};
    for (int o = 0; o < plan->n_ops; o++) {
        tg_cost_op *c = &out->ops[o];
        const tg_cost_sample s = tg_cost_op_sample(plan, o, d);
        c->group = s.group, c->flops = s.flops, c->bytes = s.bytes;
        c->seconds = tg_cost_sample_seconds(d, &s, &c->bound);
        step_op[o] = c->seconds + in_graph;
        out->group_s[c->group] += c->seconds;
        out->group_flops[c->group] += c->flops;
        out->group_bytes[c->group] += c->bytes;
        out->group_ops[c->group]++;
        const int ph = plan->ops[o].phase;
        if (ph >= 0 && ph < TG_PHASE_COUNT) out->phase_s[ph] += c->seconds, step_phase[ph] += step_op[o];
    }
    const int micro = plan->train.grad_accumulation > 1 ? plan->train.grad_accumulation : 1;
    out->micro_steps = micro;
    /* The backward: gradient sums beside it, each after the op before it, one at a time. */
    double compute = 0, comm_free = 0;
    for (int o = plan->phase_begin[TG_PHASE_BACKWARD]; o < plan->phase_begin[TG_PHASE_BACKWARD + 1]; o++) {
        const tg_cost_op *c = &out->ops[o];
        if (c->group != TG_GROUP_COMM || d->cpu) {
            compute += step_op[o];
            if (c->group == TG_GROUP_COMM) out->comm_s += step_op[o], out->comm_exposed_s += step_op[o];
            continue;
        }
        const double start = compute > comm_free ? compute : comm_free;
        comm_free = start + step_op[o];
        out->comm_s += step_op[o];
    }
    double backward = compute;
    if (!d->cpu && comm_free > compute) {
        out->comm_exposed_s = comm_free - compute;
        backward = comm_free;
    }
    double forward_first = step_phase[TG_PHASE_FORWARD], update = 0;
    if (!d->cpu) {
        int failed = 0;
        forward_first = forward_beside_update(plan, step_op, step_phase[TG_PHASE_FORWARD], &update, &failed);
        if (failed) {
            free(step_op);
            tg_cost_prediction_free(out);
            return tg_fail(err, "out of memory for the cost model's deferred update");
        }
    }
    free(step_op);
    out->update_s = update;
    out->update_hidden_s = d->update_overlap * (update + step_phase[TG_PHASE_FORWARD] - forward_first);
    out->serial_s = micro * (out->phase_s[TG_PHASE_FORWARD] + out->phase_s[TG_PHASE_BACKWARD]) +
                    out->phase_s[TG_PHASE_OPTIMIZER];
    out->step_s = micro * (step_phase[TG_PHASE_FORWARD] + backward) + step_phase[TG_PHASE_OPTIMIZER] -
                  out->update_hidden_s;
    return 0;
}

/* ---- the fit ------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The fit's objective over samples s[0..n) on device x: sum of w ln(pred / meas)^2. */
static double sum_log_error(const tg_cost_device *x, const tg_cost_sample *s, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        const double e = log(tg_cost_sample_seconds(x, &s[i], NULL) / s[i].seconds);
        sum += s[i].seconds * (s[i].repeats > 1 ? s[i].repeats : 1) * e * e;
    }
    return sum;
}

#define FIT_LO 1e-4
#define FIT_HI 4.0
#define FIT_STEPS 96

/* The pair (eff_flops[g], eff_bw[g]) of x minimising the objective plus a pull towards
 * (ef0, eb0): a log grid, then a finer grid over one coarse step either side, then a
 * tenth of that. Returns the objective reached. */
static double fit_pair(tg_cost_device *x, int g, const tg_cost_sample *s, int n, double ef0, double eb0, double pull) {
    const double step = log(FIT_HI / FIT_LO) / (FIT_STEPS - 1);
    double best = INFINITY, bf = ef0, bb = eb0;
    for (int i = 0; i < FIT_STEPS; i++)
        for (int j = 0; j < FIT_STEPS; j++) {
            x->eff_flops[g] = FIT_LO * exp(step * i), x->eff_bw[g] = FIT_LO * exp(step * j);
            const double a = log(x->eff_flops[g] / ef0), b = log(x->eff_bw[g] / eb0);
            const double v = sum_log_error(x, s, n) + pull * (a * a + b * b);
            if (v < best) best = v, bf = x->eff_flops[g], bb = x->eff_bw[g];
        }
    for (double span = step; span > step / 50; span /= 10) {
        const double cf = bf, cb = bb;
        for (int i = -10; i <= 10; i++)
            for (int j = -10; j <= 10; j++) {
                x->eff_flops[g] = cf * exp(span * i / 10), x->eff_bw[g] = cb * exp(span * j / 10);
                const double a = log(x->eff_flops[g] / ef0), b = log(x->eff_bw[g] / eb0);
                const double v = sum_log_error(x, s, n) + pull * (a * a + b * b);
                if (v < best) best = v, bf = x->eff_flops[g], bb = x->eff_bw[g];
            }
    }
    x->eff_flops[g] = bf, x->eff_bw[g] = bb;
    return best;
}

/* One factor *v of x in [FIT_LO, FIT_HI] minimising the objective (a log grid, refined). */
static double fit_one(tg_cost_device *x, double *v, const tg_cost_sample *s, int n) {
    const double step = log(FIT_HI / FIT_LO) / (FIT_STEPS - 1);
    double best = INFINITY, bv = *v;
    for (int i = 0; i < FIT_STEPS; i++) {
        *v = FIT_LO * exp(step * i);
        const double e = sum_log_error(x, s, n);
        if (e < best) best = e, bv = *v;
    }
    for (double span = step; span > step / 50; span /= 10) {
        const double c = bv;
        for (int i = -10; i <= 10; i++) {
            *v = c * exp(span * i / 10);
            const double e = sum_log_error(x, s, n);
            if (e < best) best = e, bv = *v;
        }
    }
    *v = bv;
    return best;
}

/* The matmuls on a GPU: the pair for each FLOPs-at-half-efficiency on a log grid from 1e7
 * to 1e12 (or none), the best kept. */
#define HALF_STEPS 21
static void fit_matmul(tg_cost_device *d, const tg_cost_sample *s, int n, double pull) {
    tg_cost_device x = *d, best_x = *d;
    const double ef0 = d->eff_flops[TG_GROUP_MATMUL], eb0 = d->eff_bw[TG_GROUP_MATMUL];
    double best = INFINITY;
    for (int h = -1; h < HALF_STEPS; h++) {
        x.matmul_flops_half = h < 0 ? 0 : 1e7 * pow(1e5, (double)h / (HALF_STEPS - 1));
        const double v = fit_pair(&x, TG_GROUP_MATMUL, s, n, ef0, eb0, pull);
        if (v < best) best = v, best_x = x;
    }
    d->eff_flops[TG_GROUP_MATMUL] = best_x.eff_flops[TG_GROUP_MATMUL];
    d->eff_bw[TG_GROUP_MATMUL] = best_x.eff_bw[TG_GROUP_MATMUL];
    d->matmul_flops_half = best_x.matmul_flops_half;
}

/* The attention group: per backend measured, its forward and backward factors for each
 * work_half (none, or a log grid from 1e2 to 1e7) and causal factor (1, or 0.5 to 1.3
 * where both causal and full ops were measured); then the group's eff_bw; twice. */
static void fit_attention(tg_cost_device *d, const tg_cost_sample *s, int n) {
    tg_cost_device x = *d;
    for (int round = 0; round < 2; round++) {
        for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++) {
            int count = 0, causal = 0;
            for (int i = 0; i < n; i++)
                if (s[i].attention != TG_COST_PLAIN && s[i].backend == b) count++, causal += s[i].causal;
            if (!count) continue;
            const int causal_steps = causal > 0 && causal < count ? 9 : 1;
            tg_cost_attention best_a = x.attention[b];
            double best = INFINITY;
            for (int h = -1; h < 16; h++)
                for (int c = 0; c < causal_steps; c++) {
                    tg_cost_attention *a = &x.attention[b];
                    a->work_half = h < 0 ? 0 : 1e2 * pow(1e5, h / 15.0);
                    a->causal_factor = causal_steps > 1 ? 0.5 + 0.1 * c : 1;
                    fit_one(&x, &a->eff_forward, s, n);
                    const double v = fit_one(&x, &a->eff_backward, s, n);
                    if (v < best) best = v, best_a = *a;
                }
            x.attention[b] = best_a;
            x.attention[b].samples = count;
        }
        fit_one(&x, &x.eff_bw[TG_GROUP_ATTENTION], s, n);
    }
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++) d->attention[b] = x.attention[b];
    d->eff_bw[TG_GROUP_ATTENTION] = x.eff_bw[TG_GROUP_ATTENTION];
    /* The group's compute factor, printed beside the others: the own kernels' forward. */
    d->eff_flops[TG_GROUP_ATTENTION] = d->attention[TG_COST_ATTENTION_OWN].eff_forward;
}

int tg_cost_fit(const tg_cost_sample *s, int n, int fit_peaks, tg_cost_device *d, int samples_per_group[TG_GROUP_COUNT],
                tg_err *err) {
    for (int g = 0; g < TG_GROUP_COUNT; g++) samples_per_group[g] = 0;
    int timed = 0;
    for (int i = 0; i < n; i++) timed += s[i].seconds > 0 && s[i].group >= 0 && s[i].group < TG_GROUP_COUNT;
    if (!timed) return tg_fail(err, "no measured ops to calibrate the cost model with");
    double *t = tg_calloc((size_t)timed, sizeof *t);
    if (!t) return tg_fail(err, "out of memory for the cost model's fit");
    int m = 0;
    for (int i = 0; i < n; i++)
        if (s[i].seconds > 0 && s[i].group >= 0 && s[i].group < TG_GROUP_COUNT) t[m++] = s[i].seconds;
    qsort(t, (size_t)m, sizeof *t, cmp_double);
    d->launch_s = t[m / 20];
    d->graph_launch_s = d->launch_s; /* until tg_cost_fit_step measures the captured step's */
    free(t);
    if (fit_peaks) {
        /* The 90th percentile of what the ops achieved, not the largest: an op whose bytes
         * stay in cache would set a bandwidth no streaming op reaches. */
        double *rate = tg_calloc((size_t)n + 1, sizeof *rate);
        if (!rate) return tg_fail(err, "out of memory for the cost model's fit");
        for (int pass = 0; pass < 2; pass++) {
            int k = 0;
            for (int i = 0; i < n; i++) {
                const double busy = s[i].seconds - d->launch_s;
                if (!(busy > 0) || s[i].group == TG_GROUP_COMM) continue;
                if (pass == 0 && s[i].group == TG_GROUP_MATMUL && s[i].flops > 0) rate[k++] = s[i].flops / busy;
                if (pass == 1 && s[i].group != TG_GROUP_MATMUL && s[i].bytes > 0) rate[k++] = s[i].bytes / busy;
            }
            if (!k) continue;
            qsort(rate, (size_t)k, sizeof *rate, cmp_double);
            const double r = rate[(k * 9) / 10 < k ? (k * 9) / 10 : k - 1];
            if (pass == 0) d->peak_flops = r;
            else d->peak_bw = d->link_bw = r;
        }
        free(rate);
    }
    tg_cost_sample *mine = tg_calloc((size_t)timed, sizeof *mine);
    if (!mine) return tg_fail(err, "out of memory for the cost model's fit");
    for (int g = 0; g < TG_GROUP_COUNT; g++) {
        double weight = 0;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (s[i].group == g && s[i].seconds > 0)
                mine[k++] = s[i], weight += s[i].seconds * (s[i].repeats > 1 ? s[i].repeats : 1);
        samples_per_group[g] = k;
        if (!k) continue;
        /* A pull of 1e-6 of the group's time: it decides only among fits the samples cannot tell apart. */
        const double pull = 1e-6 * weight;
        /* The shape terms on a GPU (the CPU's one pair per group predicts its steps as it is). */
        if (!d->cpu && g == TG_GROUP_MATMUL) fit_matmul(d, mine, k, pull);
        else if (!d->cpu && g == TG_GROUP_ATTENTION) fit_attention(d, mine, k);
        else {
            tg_cost_device x = *d;
            fit_pair(&x, g, mine, k, d->eff_flops[g], d->eff_bw[g], pull);
            d->eff_flops[g] = x.eff_flops[g], d->eff_bw[g] = x.eff_bw[g];
            if (g == TG_GROUP_ATTENTION) /* the CPU: both backends the group's factor */
                for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++)
                    d->attention[b] = (tg_cost_attention){x.eff_flops[g], x.eff_flops[g], 0, 1, k};
        }
    }
    free(mine);
    d->calibrated = 1;
    return 0;
}

int tg_cost_fit_step(const tg_plan *const *plans, const double *step_s, int n, tg_cost_device *d, tg_err *err) {
    if (n < 1) return tg_fail(err, "no measured steps to fit the captured step with");
    double best = INFINITY, best_launch = d->launch_s, best_overlap = 1;
    tg_cost_device x = *d;
    /* The launch term in a graph, 0 to the op-by-op one in 40ths, and the overlap in 20ths. */
    for (int i = 0; i <= 40; i++)
        for (int j = 0; j <= 20; j++) {
            x.graph_launch_s = d->launch_s * i / 40.0, x.update_overlap = j / 20.0;
            double sum = 0;
            for (int k = 0; k < n; k++) {
                tg_cost_prediction p;
                if (tg_cost_predict(plans[k], &x, &p, err)) return -1;
                const double e = log(p.step_s / step_s[k]);
                sum += e * e;
                tg_cost_prediction_free(&p);
            }
            if (sum < best) best = sum, best_launch = x.graph_launch_s, best_overlap = x.update_overlap;
        }
    d->graph_launch_s = best_launch, d->update_overlap = best_overlap;
    return 0;
}

/* ---- the printout -------------------------------------------------------------------- */

void tg_cost_shape_terms_print(const tg_cost_device *d, FILE *out) {
    if (d->cpu || !d->calibrated) return;
    static const char *const backend_names[TG_COST_ATTENTION_BACKENDS] = {"own kernels", "cuDNN"};
    if (d->matmul_flops_half > 0)
        fprintf(out, "  matmul: eff_flops x F / (F + %.4g GFLOP)\n", d->matmul_flops_half / 1e9);
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++) {
        const tg_cost_attention *a = &d->attention[b];
        fprintf(out, "  attention, %s%s: eff_flops forward %.4f, backward %.4f, x w / (w + %.4g) for w = T x Dh, "
                     "causal x %.2f (%d ops calibrated)\n",
                backend_names[b], b == TG_COST_ATTENTION_CUDNN && !d->cudnn_attention ? " (off: TUNEGRAPH_ATTENTION=own)" : "",
                a->eff_forward, a->eff_backward, a->work_half, a->causal_factor, a->samples);
    }
    fprintf(out, "  captured step: %.2f us an op, %.0f%% of the deferred update's modelled hiding\n",
            d->graph_launch_s * 1e6, 100 * d->update_overlap);
}

int tg_cost_prediction_print(const tg_plan *plan, const tg_cost_device *d, const tg_cost_prediction *p, int top,
                             FILE *out) {
    fprintf(out, "cost model: %s%s%s, peak %.4g TFLOP/s (%s), memory %.4g GB/s", d->key,
            strcmp(d->name, d->key) ? " = " : "", strcmp(d->name, d->key) ? d->name : "", d->peak_flops / 1e12,
            d->cpu ? "fp32, measured" : tg_precision_name(plan->train.precision), d->peak_bw / 1e9);
    if (plan->train.replicas > 1) fprintf(out, ", link %.4g GB/s", d->link_bw / 1e9);
    fprintf(out, ", %.2f us an op", d->launch_s * 1e6);
    if (d->cpu && d->threads > 0) fprintf(out, ", %d threads", d->threads);
    fprintf(out, "\n  efficiency factors: %s\n",
            d->calibrated ? "calibrated" : "defaults, uncalibrated (`tunegraph calibrate` measures them)");
    tg_cost_shape_terms_print(d, out);
    fprintf(out, "  %-21s %5s %12s %12s %9s %9s %11s %6s\n", "group", "ops", "GFLOP", "MB moved", "eff_flops", "eff_bw",
            "ms", "share");
    double total = 0;
    for (int g = 0; g < TG_GROUP_COUNT; g++) total += p->group_s[g];
    for (int g = 0; g < TG_GROUP_COUNT; g++) {
        if (!p->group_ops[g]) continue;
        fprintf(out, "  %-21s %5d %12.4f %12.4f %9.4f %9.4f %11.4f %5.1f%%\n", tg_op_group_name(g), p->group_ops[g],
                p->group_flops[g] / 1e9, p->group_bytes[g] / 1e6, d->eff_flops[g], d->eff_bw[g], p->group_s[g] * 1e3,
                total > 0 ? 100 * p->group_s[g] / total : 0.0);
    }
    fprintf(out, "  phases, ops one after another: forward %.4f ms, backward %.4f ms, optimizer %.4f ms\n",
            p->phase_s[TG_PHASE_FORWARD] * 1e3, p->phase_s[TG_PHASE_BACKWARD] * 1e3,
            p->phase_s[TG_PHASE_OPTIMIZER] * 1e3);
    if (p->comm_s > 0)
        fprintf(out, "  gradient sums: %.4f ms a micro-step%s, %.4f ms of it exposed\n", p->comm_s * 1e3,
                d->cpu ? " inside the backward" : " beside the backward", p->comm_exposed_s * 1e3);
    if (p->update_s > 0)
        fprintf(out, "  deferred update: %.4f ms beside the next forward, %.4f ms of it hidden\n", p->update_s * 1e3,
                p->update_hidden_s * 1e3);
    fprintf(out, "  step: %.4f ms predicted", p->step_s * 1e3);
    if (p->micro_steps > 1) fprintf(out, " (%d micro-batches)", p->micro_steps);
    fprintf(out, "; %.4f ms with every op one after another\n", p->serial_s * 1e3);
    if (top > 0) fprintf(out, "  slowest ops (predicted):\n");
    char *shown = top > 0 ? tg_calloc(p->n_ops > 0 ? (size_t)p->n_ops : 1, 1) : NULL;
    if (top > 0 && !shown) return -1;
    for (int k = 0; k < top; k++) {
        int best = -1;
        for (int o = 0; o < p->n_ops; o++)
            if (!shown[o] && (best < 0 || p->ops[o].seconds > p->ops[best].seconds)) best = o;
        if (best < 0) break;
        shown[best] = 1;
        const tg_op *op = &plan->ops[best];
        const int t = op->out[0] >= 0 ? op->out[0] : op->in[0];
        fprintf(out, "    %5d %-22s %10.4f ms  %-7s %s\n", best, tg_op_name(op->kind), p->ops[best].seconds * 1e3,
                p->ops[best].bound == TG_COST_COMPUTE ? "compute" : "memory",
                t >= 0 && t < plan->n_tensors ? plan->tensors[t].name : "");
    }
    free(shown);
    tg_memory_estimate est;
    tg_estimate_memory(plan, d->cpu ? TG_MEM_DEVICE_CPU : TG_MEM_DEVICE_CUDA, &est);
    char total_s[32], parts[512];
    fprintf(out, "  predicted peak memory on the %s: %s (%s)\n", d->cpu ? "host" : "GPU",
            tg_mem_format_bytes(est.total, total_s, sizeof total_s), tg_memory_estimate_parts(&est, -1, parts, sizeof parts));
    return ferror(out) ? -1 : 0;
}
