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
static double forward_beside_update(const tg_plan *plan, const tg_cost_prediction *p, double *update_s, int *failed) {
    const int f0 = plan->phase_begin[TG_PHASE_FORWARD], f1 = plan->phase_begin[TG_PHASE_FORWARD + 1];
    const double serial = p->phase_s[TG_PHASE_FORWARD];
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
        const double u = p->ops[plan->n_ops - 1].seconds, n = (double)last->p.adamw.n;
        t = 0;
        for (int j = 0; j < f1 - f0; j++) {
            const double ready = u * (double)need[j] / n;
            t = (t > ready ? t : ready) + p->ops[f0 + j].seconds;
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
    if (!out->ops) return tg_fail(err, "out of memory for the cost model's %d ops", plan->n_ops);
    for (int o = 0; o < plan->n_ops; o++) {
        tg_cost_op *c = &out->ops[o];
        const int kind = plan->ops[o].kind;
        c->group = tg_op_group_of(kind);
        c->flops = tg_cost_op_flops(plan, o);
        c->bytes = tg_cost_op_bytes(plan, o);
        c->seconds = tg_cost_seconds(d, c->group, c->flops, c->bytes, &c->bound);
        out->group_s[c->group] += c->seconds;
        out->group_flops[c->group] += c->flops;
        out->group_bytes[c->group] += c->bytes;
        out->group_ops[c->group]++;
        const int ph = plan->ops[o].phase;
        if (ph >= 0 && ph < TG_PHASE_COUNT) out->phase_s[ph] += c->seconds;
    }
    const int micro = plan->train.grad_accumulation > 1 ? plan->train.grad_accumulation : 1;
    out->micro_steps = micro;
    /* The backward: gradient sums beside it, each after the op before it, one at a time. */
    double compute = 0, comm_free = 0;
    for (int o = plan->phase_begin[TG_PHASE_BACKWARD]; o < plan->phase_begin[TG_PHASE_BACKWARD + 1]; o++) {
        const tg_cost_op *c = &out->ops[o];
        if (c->group != TG_GROUP_COMM || d->cpu) {
            compute += c->seconds;
            if (c->group == TG_GROUP_COMM) out->comm_s += c->seconds, out->comm_exposed_s += c->seconds;
            continue;
        }
        const double start = compute > comm_free ? compute : comm_free;
        comm_free = start + c->seconds;
        out->comm_s += c->seconds;
    }
    double backward = compute;
    if (!d->cpu && comm_free > compute) {
        out->comm_exposed_s = comm_free - compute;
        backward = comm_free;
    }
    double forward_first = out->phase_s[TG_PHASE_FORWARD], update = 0;
    if (!d->cpu) {
        int failed = 0;
        forward_first = forward_beside_update(plan, out, &update, &failed);
        if (failed) {
            tg_cost_prediction_free(out);
            return tg_fail(err, "out of memory for the cost model's deferred update");
        }
    }
    out->update_s = update;
    out->update_hidden_s = update + out->phase_s[TG_PHASE_FORWARD] - forward_first;
    out->serial_s = micro * (out->phase_s[TG_PHASE_FORWARD] + out->phase_s[TG_PHASE_BACKWARD]) +
                    out->phase_s[TG_PHASE_OPTIMIZER];
    out->step_s = forward_first + (micro - 1) * out->phase_s[TG_PHASE_FORWARD] + micro * backward +
                  out->phase_s[TG_PHASE_OPTIMIZER] - update;
    return 0;
}

/* ---- the fit ------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The fit's objective for one group's samples at (ef, eb): sum of w ln(pred / meas)^2,
 * plus the pull towards (ef0, eb0). */
static double objective(const tg_cost_device *d, const tg_cost_sample *s, int n, double ef, double eb, double ef0,
                        double eb0, double pull) {
    tg_cost_device x = *d;
    const int g = s[0].group;
    x.eff_flops[g] = ef, x.eff_bw[g] = eb;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        const double e = log(tg_cost_seconds(&x, g, s[i].flops, s[i].bytes, NULL) / s[i].seconds);
        sum += s[i].seconds * e * e;
    }
    const double a = log(ef / ef0), b = log(eb / eb0);
    return sum + pull * (a * a + b * b);
}

#define FIT_LO 1e-4
#define FIT_HI 4.0
#define FIT_STEPS 96

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
    const double step = log(FIT_HI / FIT_LO) / (FIT_STEPS - 1);
    tg_cost_sample *mine = tg_calloc((size_t)timed, sizeof *mine);
    if (!mine) return tg_fail(err, "out of memory for the cost model's fit");
    for (int g = 0; g < TG_GROUP_COUNT; g++) {
        double weight = 0;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (s[i].group == g && s[i].seconds > 0) mine[k++] = s[i], weight += s[i].seconds;
        samples_per_group[g] = k;
        if (!k) continue;
        /* A pull of 1e-6 of the group's time: it decides only among fits the samples cannot tell apart. */
        const double ef0 = d->eff_flops[g], eb0 = d->eff_bw[g], pull = 1e-6 * weight;
        double best = INFINITY, bf = ef0, bb = eb0;
        for (int i = 0; i < FIT_STEPS; i++)
            for (int j = 0; j < FIT_STEPS; j++) {
                const double ef = FIT_LO * exp(step * i), eb = FIT_LO * exp(step * j);
                const double v = objective(d, mine, k, ef, eb, ef0, eb0, pull);
                if (v < best) best = v, bf = ef, bb = eb;
            }
        /* Refined: a finer grid over one coarse step either side, then a tenth of that. */
        for (double span = step; span > step / 50; span /= 10) {
            const double cf = bf, cb = bb;
            for (int i = -10; i <= 10; i++)
                for (int j = -10; j <= 10; j++) {
                    const double ef = cf * exp(span * i / 10), eb = cb * exp(span * j / 10);
                    const double v = objective(d, mine, k, ef, eb, ef0, eb0, pull);
                    if (v < best) best = v, bf = ef, bb = eb;
                }
        }
        d->eff_flops[g] = bf, d->eff_bw[g] = bb;
    }
    free(mine);
    d->calibrated = 1;
    return 0;
}

/* ---- the printout -------------------------------------------------------------------- */

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
