/* Trains a job through libtunegraph's public API alone, as a program embedding it would.
 *
 *   cc embed.c $(pkg-config --cflags --libs tunegraph) -o embed
 *   ./embed examples/demo-classify.job steps=80 lr=3e-3 warmup_steps=10
 *
 * Arguments after the job are `key=value` overrides. Prints the metrics of every tenth
 * step, evaluates on the job's eval_data, and exits 1 unless the loss went down. */
#include <stdio.h>

#include <tunegraph.h>

typedef struct progress {
    int64_t total_steps;
    double first_loss, last_loss;
} progress;

static void on_step(void *ctx, const tunegraph_step_metrics *m) {
    progress *p = ctx;
    if (m->step == 1) p->first_loss = m->loss;
    p->last_loss = m->loss;
    if (m->step % 10 == 0 || m->step == 1 || m->step == p->total_steps)
        printf("step %lld/%lld  loss %.4f  lr %.2e  grad norm %.3f  %.1f ms  %lld tokens\n", (long long)m->step,
               (long long)p->total_steps, m->loss, m->lr, m->grad_norm, m->step_ms, (long long)m->tokens);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s JOB [key=value]...\n", argv[0]);
        return 2;
    }
    printf("libtunegraph %s (built against %d.%d.%d)\n", tunegraph_version(), TUNEGRAPH_VERSION_MAJOR,
           TUNEGRAPH_VERSION_MINOR, TUNEGRAPH_VERSION_PATCH);

    tunegraph_plan *plan = NULL;
    tunegraph_trainer *trainer = NULL;
    progress p = {0};
    tunegraph_plan_summary summary = {.struct_size = sizeof summary};
    tunegraph_trainer_options options = {.struct_size = sizeof options};
    options.device = TUNEGRAPH_DEVICE_AUTO;
    tunegraph_eval_metrics eval = {.struct_size = sizeof eval};

    if (tunegraph_compile_file(argv[1], (const char *const *)argv + 2, argc - 2, &plan) ||
        tunegraph_plan_summarize(plan, &summary))
        goto fail;
    printf("plan: %lld ops, %lld tensors, planned peak %.1f MiB, %.2f GFLOP/step, batch %lld x seq %lld\n",
           (long long)summary.ops, (long long)summary.tensors, summary.planned_peak_bytes / 1048576.0,
           summary.flops_per_step / 1e9, (long long)summary.batch, (long long)summary.seq);

    if (tunegraph_trainer_open(plan, &options, &trainer) || tunegraph_trainer_total_steps(trainer, &p.total_steps) ||
        tunegraph_trainer_train(trainer, on_step, &p))
        goto fail;
    if (tunegraph_trainer_evaluate(trainer, &eval)) goto fail;
    printf("eval on %lld examples: loss %.4f", (long long)eval.examples, eval.loss);
    if (eval.has_accuracy) printf(", accuracy %.4f", eval.accuracy);
    if (eval.has_perplexity) printf(", perplexity %.3f", eval.perplexity);
    printf("\n");
    tunegraph_trainer_close(trainer);
    tunegraph_plan_free(plan);
    if (!(p.last_loss < p.first_loss)) {
        fprintf(stderr, "embed: the loss did not go down (%.4f -> %.4f)\n", p.first_loss, p.last_loss);
        return 1;
    }
    printf("loss %.4f -> %.4f\n", p.first_loss, p.last_loss);
    return 0;

fail:
    fprintf(stderr, "embed: %s\n", tunegraph_last_error());
    tunegraph_trainer_close(trainer);
    tunegraph_plan_free(plan);
    return 1;
}
