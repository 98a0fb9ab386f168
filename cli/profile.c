/* `tunegraph run --profile`: where the time of one step goes, op by op, on stderr and in
 * the metrics file. */
#include "cli/profile.h"

#include <stdlib.h>

#include "base/alloc.h"
#include "cli/cost.h"
#include "cli/metrics.h"
#include "cli/plot.h"
#include "runtime/kernel_trace.h"

int report_comm_timeline(const tg_plan *p, const tg_comm_timeline *c, FILE *metrics) {
    if (!c->buckets || !c->steps) return 0;
    int64_t bytes[TG_COMM_TIMELINE_MAX] = {0};
    int j = 0;
    for (int o = p->phase_begin[TG_PHASE_BACKWARD]; o < p->phase_begin[TG_PHASE_OPTIMIZER]; o++)
        if (tg_op_is_sum(p->ops[o].kind)) { /* count and reduce_scatter begin with n */
            bytes[j] += p->ops[o].p.count.n * 4;
            if (j < TG_COMM_TIMELINE_MAX - 1) j++;
        }
    int rc = 0;
    fprintf(stderr, "  gradient sums beside the backward (this replica, mean of %lld captured steps; ms from the "
                    "backward's end):\n  %6s %9s %9s %9s %9s %9s %8s\n",
            (long long)c->steps, "bucket", "MB", "begin", "end", "ms", "exposed", "GB/s");
    for (int k = 0; k < c->buckets; k++) {
        const double begin = c->begin_ms[k] / (double)c->steps, end = c->end_ms[k] / (double)c->steps;
        const double exposed = end > 0 ? end - (begin > 0 ? begin : 0) : 0;
        fprintf(stderr, "  %6d %9.2f %9.3f %9.3f %9.3f %9.3f %8.1f\n", k, (double)bytes[k] / 1e6, begin, end,
                end - begin, exposed, end > begin ? (double)bytes[k] / 1e6 / (end - begin) : 0.0);
        if (metrics && metrics_write_profile_comm(metrics, k, bytes[k], begin, end)) rc = -1;
    }
    return rc;
}

/* What of the captured steps' gradient sums ran past the backward's end, as each step's
 * exposed_comm_ms counts it (the last bucket's end), mean over the timeline's steps. */
static double comm_exposed_ms(const tg_comm_timeline *c) {
    const double end = c->end_ms[c->buckets - 1] / (double)c->steps;
    return end > 0 ? end : 0;
}

/* The traced captured steps: device time, busy time, each group largest first, and the
 * communication beside other kernels or alone; as profile_graph metrics lines too. */
static int report_graph(const tg_kernel_trace_summary *g, double step_ms, FILE *metrics) {
    int rc = 0;
    fprintf(stderr,
            "  in the captured graph (%d steps one at a time, %lld kernels, copies and fills traced by CUPTI): %.3f ms "
            "a step on the device, kernels busy %.3f ms\n    by kernel group:",
            g->steps, (long long)g->kernels, step_ms, g->busy_ms);
    if (metrics && (metrics_write_profile_graph(metrics, "device step", step_ms) ||
                    metrics_write_profile_graph(metrics, "busy", g->busy_ms)))
        rc = -1;
    int shown[TG_GROUP_COUNT] = {0};
    for (int n = 0;; n++) {
        int best = -1;
        for (int k = 0; k < TG_GROUP_COUNT; k++)
            if (!shown[k] && g->group_ms[k] > 0 && (best < 0 || g->group_ms[k] > g->group_ms[best])) best = k;
        if (best < 0) break;
        shown[best] = 1;
        fprintf(stderr, "%s %s %.3f ms", n ? "," : "", tg_op_group_name(best), g->group_ms[best]);
        if (metrics && metrics_write_profile_graph(metrics, tg_op_group_name(best), g->group_ms[best])) rc = -1;
    }
    if (g->other_ms > 0) {
        fprintf(stderr, ", other %.3f ms", g->other_ms);
        if (metrics && metrics_write_profile_graph(metrics, "other", g->other_ms)) rc = -1;
    }
    fputc('\n', stderr);
    const char *unnamed[TG_KERNEL_TRACE_UNNAMED];
    const int n_unnamed = tg_kernel_trace_unnamed(unnamed, TG_KERNEL_TRACE_UNNAMED);
    for (int k = 0; k < n_unnamed && k < TG_KERNEL_TRACE_UNNAMED; k++)
        fprintf(stderr, "%s%.160s", k ? "\n      " : "    other: kernels of no group:\n      ", unnamed[k]);
    if (n_unnamed > TG_KERNEL_TRACE_UNNAMED) fprintf(stderr, "\n      and %d more", n_unnamed - TG_KERNEL_TRACE_UNNAMED);
    if (n_unnamed) fputc('\n', stderr);
    /* The kernels taking the most time, by name (template arguments and all). */
    const char *names[10];
    uint64_t ns[10];
    int64_t count[10];
    const int n_names = tg_kernel_trace_by_name(names, ns, count, 10);
    for (int k = 0; k < n_names; k++)
        fprintf(stderr, "%s%8.3f ms %5lld x  %.150s\n", k ? "      " : "    slowest kernels (ms a step, launches a step):\n      ",
                (double)ns[k] / 1e6 / g->steps, (long long)(count[k] / (g->steps > 0 ? g->steps : 1)), names[k]);
    if (g->group_ms[TG_GROUP_COMM] > 0) {
        fprintf(stderr, "    communication beside other kernels %.3f ms, alone %.3f ms\n", g->comm_hidden_ms,
                g->comm_exposed_ms);
        if (metrics && (metrics_write_profile_graph(metrics, "communication hidden", g->comm_hidden_ms) ||
                        metrics_write_profile_graph(metrics, "communication exposed", g->comm_exposed_ms)))
            rc = -1;
    }
    return rc;
}

int report_profile(tg_trainer *tr, metrics_file *metrics_out, double step_ms, const char *svg_path, tg_err *err) {
    const tg_plan *p = tr->plan;
    double *ms = tg_calloc((size_t)p->n_ops, sizeof *ms);
    if (!ms) return tg_fail(err, "out of memory for the profile's op times");
    /* On a GPU, first the captured steps as they run: their kernels traced by CUPTI and
     * summed by group (one replica; where it cannot be traced, the reason is printed). */
    const int cuda = tr->ex.device == TG_DEVICE_CUDA;
    tg_kernel_trace_summary graph;
    double graph_step_ms = 0;
    tg_err graph_err = {0};
    const int traced = cuda && tg_trainer_trace_kernels(tr, PROFILE_REPEATS, &graph, &graph_step_ms, &graph_err) == 0;
    if (tg_trainer_profile(tr, PROFILE_REPEATS, ms, err)) {
        free(ms);
        return -1;
    }
    /* Locked after the profile's steps: a failing replica ends the file from its own
     * thread, and must not wait on this one while this one waits on it. */
    FILE *metrics = metrics_out ? metrics_file_lock(metrics_out) : NULL;
    double kind_ms[TG_OP_COUNT] = {0}, total = 0, phase_ms[TG_PHASE_COUNT] = {0};
    int wrote = 0; /* -1 once a metrics line could not be written */
    int kind_n[TG_OP_COUNT] = {0};
    for (int o = 0; o < p->n_ops; o++) {
        kind_ms[p->ops[o].kind] += ms[o];
        kind_n[p->ops[o].kind]++;
        phase_ms[p->ops[o].phase] += ms[o];
        total += ms[o];
    }
    fprintf(stderr, "profile (ops launched one by one, mean of %d steps): %.3f ms in %d ops", PROFILE_REPEATS, total,
            p->n_ops);
    if (step_ms > 0) fprintf(stderr, "; the captured step took %.3f ms", step_ms);
    /* The phases (the chart's first section), with the gradient sums the backward did not
     * hide where the captured steps measured them. */
    const char *phase_names[TG_PHASE_COUNT + 1];
    double phase_shown[TG_PHASE_COUNT + 1];
    int n_phases = 0;
    for (int ph = 0; ph < TG_PHASE_COUNT; ph++) phase_names[n_phases] = tg_phase_name(ph), phase_shown[n_phases++] = phase_ms[ph];
    if (tr->comm.buckets && tr->comm.steps)
        phase_names[n_phases] = "communication exposed", phase_shown[n_phases++] = comm_exposed_ms(&tr->comm);
    for (int k = 0; k < n_phases; k++) {
        fprintf(stderr, "%s%s %.3f ms", k ? ", " : "\n  ", phase_names[k], phase_shown[k]);
        if (metrics && metrics_write_profile_phase(metrics, phase_names[k], phase_shown[k])) wrote = -1;
    }
    /* By kernel group (plan/ops.def's group column), largest first. */
    double group_ms[TG_GROUP_COUNT] = {0}, group_shown[TG_GROUP_COUNT];
    const char *group_names[TG_GROUP_COUNT];
    int n_groups = 0;
    for (int o = 0; o < p->n_ops; o++) group_ms[tg_op_group_of(p->ops[o].kind)] += ms[o];
    fprintf(stderr, "\n  by kernel group:");
    for (; n_groups < TG_GROUP_COUNT; n_groups++) {
        int best = -1;
        for (int g = 0; g < TG_GROUP_COUNT; g++)
            if (group_ms[g] > 0 && (best < 0 || group_ms[g] > group_ms[best])) best = g;
        if (best < 0) break;
        fprintf(stderr, "%s %s %.3f ms (%.1f%%)", n_groups ? "," : "", tg_op_group_name(best), group_ms[best],
                total > 0 ? 100 * group_ms[best] / total : 0.0);
        if (metrics && metrics_write_profile_group(metrics, tg_op_group_name(best), group_ms[best])) wrote = -1;
        group_names[n_groups] = tg_op_group_name(best), group_shown[n_groups] = group_ms[best];
        group_ms[best] = 0;
    }
    fputc('\n', stderr);
    if (traced) {
        if (report_graph(&graph, graph_step_ms, metrics)) wrote = -1;
    } else if (cuda)
        fprintf(stderr, "  in the captured graph: not traced (%s)\n", graph_err.msg);
    fprintf(stderr, "  %-18s %5s %10s %6s\n", "op", "count", "ms", "share");
    for (;;) { /* one kind a pass, until every kind of the plan is shown */
        int best = -1;
        for (int k = 0; k < TG_OP_COUNT; k++)
            if (kind_n[k] && (best < 0 || kind_ms[k] > kind_ms[best])) best = k;
        if (best < 0) break;
        fprintf(stderr, "  %-18s %5d %10.3f %5.1f%%\n", tg_op_name(best), kind_n[best], kind_ms[best],
                100 * kind_ms[best] / total);
        if (metrics && metrics_write_profile_kind(metrics, tg_op_name(best), kind_n[best], kind_ms[best]))
            wrote = -1;
        kind_n[best] = 0;
    }
    /* Every op's time in the metrics, so a report can say where each millisecond went. */
    for (int o = 0; metrics && o < p->n_ops; o++)
        if (metrics_write_profile_op(metrics, p, o, ms[o])) wrote = -1;
    if (report_comm_timeline(p, &tr->comm, metrics)) wrote = -1;
    if (metrics_out) metrics_file_unlock(metrics_out);
    fprintf(stderr, "  slowest ops:\n");
    /* Marked as shown apart from the times: the cost model's table below sums them. */
    char *shown_op = tg_calloc((size_t)p->n_ops, 1);
    if (!shown_op) {
        free(ms);
        return tg_fail(err, "out of memory for the profile's op times");
    }
    for (int shown = 0; shown < 8; shown++) {
        int best = -1;
        for (int o = 0; o < p->n_ops; o++)
            if (!shown_op[o] && (best < 0 || ms[o] > ms[best])) best = o;
        if (best < 0) break; /* GCOVR_EXCL_BR_LINE: a compiled plan has more than 8 ops (forward, loss, backward, update) */
        const tg_op *op = &p->ops[best];
        int out = op->out[0] >= 0 ? op->out[0] : op->in[0]; /* GCOVR_EXCL_BR_LINE: every op kind requires out[0] (plan/ops.def) and the plan validator checks it */
        fprintf(stderr, "    %4d %-16s %8.3f ms  %s", best, tg_op_name(op->kind), ms[best], p->tensors[out].name);
        const tg_matmul_params *mm = &op->p.matmul;
        if (op->kind == TG_OP_MATMUL)
            fprintf(stderr, "  M=%lld N=%lld K=%lld batch=%lld", (long long)mm->m, (long long)mm->n,
                    (long long)mm->k, (long long)mm->batch);
        fprintf(stderr, "\n");
        shown_op[best] = 1;
    }
    free(shown_op);
    /* The cost model beside what was measured, last (its metrics lines under the lock again). */
    FILE *cost_metrics = metrics_out ? metrics_file_lock(metrics_out) : NULL;
    if (cost_report_profile(p, tr->ex.device == TG_DEVICE_CUDA, tg_executor_cpu_threads(&tr->ex), ms, step_ms, stderr,
                            cost_metrics))
        wrote = -1;
    if (metrics_out) metrics_file_unlock(metrics_out);
    free(ms);
    if (wrote) return tg_fail(err, "cannot write the profile to the metrics file");
    return svg_path ? plot_write_profile(svg_path, phase_names, phase_shown, n_phases, group_names, group_shown, n_groups, err)
                    : 0;
}
