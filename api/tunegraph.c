/* The public API (include/tunegraph.h) over the compiler, the plan and the trainer. Each
 * call turns the internal tg_err into the calling thread's last error and returns -1. */
#include "include/tunegraph.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/output_paths.h"
#include "base/version.h"
#include "api/front.h"
#include "plan/inspect.h"
#include "plan/plan_file.h"
#include "runtime/trainer.h"

#define STR_(x) #x
#define STR(x) STR_(x)
#define VERSION STR(TUNEGRAPH_VERSION_MAJOR) "." STR(TUNEGRAPH_VERSION_MINOR) "." STR(TUNEGRAPH_VERSION_PATCH)

struct tunegraph_plan {
    tg_plan plan;
};

/* The trainer holds its own plan: tg_trainer points into it for as long as it is open.
 * A checkpoint finishes the steps in flight first; their metrics wait in `queued` for the
 * next step calls. */
struct tunegraph_trainer {
    tg_plan plan;
    tg_trainer tr;
    char *weights_report; /* tg_weights_report_text of the load, "" when none */
    tunegraph_step_metrics queued[TG_TRAINER_STAGING_MAX];
    int n_queued, queue_head;
    int32_t checkpointed;   /* the step of the last checkpoint written into the job's folder, or resumed (-1: none) */
};

static _Thread_local char last_error[sizeof(((tg_err *)0)->msg)];

static int fail_err(const tg_err *err) {
    snprintf(last_error, sizeof last_error, "%s", err->msg);
    return -1;
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return -1;
}

const char *tunegraph_version(void) { return VERSION; }

const char *tunegraph_last_error(void) { return last_error; }

/* ---- caller-allocated structs: struct_size says how much of ours the caller knows ---- */

/* The caller's struct_size, or 0 (and the message) when it is too small to be one. */
static size_t struct_size(const void *s, const char *type) {
    size_t size;
    memcpy(&size, s, sizeof size);
    if (size < sizeof(size_t)) fail("%s.struct_size is %zu: set it to sizeof(%s)", type, size, type);
    return size < sizeof(size_t) ? 0 : size;
}

/* Fills the caller's struct from ours: the bytes both know, zeros past ours. */
static int fill_out(void *dst, const void *src, size_t src_size, const char *type) {
    size_t size = struct_size(dst, type);
    if (!size) return -1;
    memset(dst, 0, size);
    memcpy(dst, src, size < src_size ? size : src_size);
    memcpy(dst, &size, sizeof size);
    return 0;
}

/* Reads the caller's struct into ours (zeroed first): fields it does not know stay 0,
 * and fields past ours (a newer header) must be 0, since this library cannot honour them. */
static int read_in(void *dst, size_t dst_size, const void *src, const char *type) {
    size_t size = struct_size(src, type);
    if (!size) return -1;
    memset(dst, 0, dst_size);
    memcpy(dst, src, size < dst_size ? size : dst_size);
    for (size_t i = dst_size; i < size; i++)
        if (((const unsigned char *)src)[i])
            return fail("%s: byte %zu is set, but this library (%s) knows %zu bytes of the struct", type, i, VERSION,
                        dst_size);
    return 0;
}

/* ---- plans ---- */

/* Hands p to the caller when rc (the call that filled p->plan) succeeded, else frees it. */
static int new_plan(tunegraph_plan **out, int rc, tunegraph_plan *p, const tg_err *err) {
    if (rc) {
        free(p);
        return fail_err(err);
    }
    *out = p;
    return 0;
}

int tunegraph_compile_file(const char *job_path, const char *const *overrides, int n_overrides,
                           tunegraph_plan **plan) {
    if (!job_path || !plan || n_overrides < 0 || (n_overrides && !overrides))
        return fail("tunegraph_compile_file: job_path and plan are required, and overrides for n_overrides > 0");
    tunegraph_plan *p = tg_calloc(1, sizeof *p);
    if (!p) return fail("out of memory for the plan");
    tg_err err = {{0}};
    return new_plan(plan, tg_front_compile_file(job_path, overrides, n_overrides, &p->plan, &err), p, &err);
}

int tunegraph_compile_text(const char *job_text, const char *base_dir, const char *const *overrides,
                           int n_overrides, tunegraph_plan **plan) {
    if (!job_text || !plan || n_overrides < 0 || (n_overrides && !overrides))
        return fail("tunegraph_compile_text: job_text and plan are required, and overrides for n_overrides > 0");
    tunegraph_plan *p = tg_calloc(1, sizeof *p);
    if (!p) return fail("out of memory for the plan");
    tg_err err = {{0}};
    return new_plan(plan,
                    tg_front_compile_text(job_text, "<job text>", base_dir, overrides, n_overrides, &p->plan, &err),
                    p, &err);
}

int tunegraph_plan_load(const char *path, tunegraph_plan **plan) {
    if (!path || !plan) return fail("tunegraph_plan_load: path and plan are required");
    tunegraph_plan *p = tg_calloc(1, sizeof *p);
    if (!p) return fail("out of memory for the plan");
    tg_err err = {{0}};
    return new_plan(plan, tg_plan_read(path, &p->plan, &err), p, &err);
}

/* Refuses to write `path` over a file the plan reads (its model's config and weights, its
 * training and eval data), or where it cannot be written (base/output_paths.h). */
static int check_output(const tg_plan *plan, const char *path, const char *what, tg_err *err) {
    tg_named_path inputs[TG_PLAN_INPUTS];
    char *config_path;
    if (tg_front_plan_inputs(plan, inputs, &config_path, err)) return -1;
    const tg_named_path output = {path, what};
    int rc = tg_outputs_check(&output, 1, inputs, TG_PLAN_INPUTS, err);
    free(config_path);
    return rc;
}

int tunegraph_plan_save(const tunegraph_plan *plan, const char *path) {
    if (!plan || !path) return fail("tunegraph_plan_save: plan and path are required");
    tg_err err = {{0}};
    if (check_output(&plan->plan, path, "plan", &err)) return fail_err(&err);
    return tg_plan_write(&plan->plan, path, &err) ? fail_err(&err) : 0;
}

int tunegraph_plan_inspect(const tunegraph_plan *plan, FILE *out, tunegraph_format format) {
    if (!plan || !out) return fail("tunegraph_plan_inspect: plan and out are required");
    if (format != TUNEGRAPH_FORMAT_TEXT && format != TUNEGRAPH_FORMAT_JSON)
        return fail("tunegraph_plan_inspect: format %d is neither TUNEGRAPH_FORMAT_TEXT nor TUNEGRAPH_FORMAT_JSON",
                    (int)format);
    tg_err err = {{0}};
    return tg_plan_inspect(&plan->plan, out, format == TUNEGRAPH_FORMAT_JSON, &err) ? fail_err(&err) : 0;
}

int tunegraph_plan_summarize(const tunegraph_plan *plan, tunegraph_plan_summary *summary) {
    if (!plan || !summary) return fail("tunegraph_plan_summarize: plan and summary are required");
    const tg_plan *p = &plan->plan;
    tunegraph_plan_summary s = {
        .struct_size = sizeof s,
        .ops = p->n_ops,
        .tensors = p->n_tensors,
        .planned_peak_bytes = p->peak_bytes,
        .flops_per_step = p->flops_per_step,
        .batch = p->train.batch,
        .seq = p->train.seq,
        .replicas = p->train.replicas,
        .total_steps = p->run.steps > 0 ? p->run.steps : -1,
    };
    return fill_out(summary, &s, sizeof s, "tunegraph_plan_summary");
}

/* A run setting goes through the job file's parsers and rules (compiler/job.c); a refused
 * setting leaves the plan as it was. */
static int plan_set_run_key(tg_plan *plan, const char *setting) {
    tg_err err = {{0}};
    const char *name = plan->job_path[0] ? plan->job_path : "the plan";
    if (tg_front_set_run(plan, &setting, 1, name, &err)) return fail_err(&err);
    return 0;
}

int tunegraph_plan_set(tunegraph_plan *plan, const char *setting) {
    if (!plan || !setting) return fail("tunegraph_plan_set: plan and setting are required");
    return plan_set_run_key(&plan->plan, setting);
}

void tunegraph_plan_free(tunegraph_plan *plan) {
    if (!plan) return;
    tg_plan_free(&plan->plan);
    free(plan);
}

/* ---- trainers ---- */

/* A deep copy through the plan file's encoding, which carries every field. */
static int copy_plan(const tg_plan *src, tg_plan *dst, tg_err *err) {
    uint8_t *bytes;
    size_t len;
    if (tg_plan_encode(src, &bytes, &len, err)) return -1;
    int rc = tg_plan_decode(bytes, len, "plan", dst, err);
    free(bytes);
    return rc;
}

int tunegraph_trainer_open(const tunegraph_plan *plan, const tunegraph_trainer_options *options,
                           tunegraph_trainer **trainer) {
    if (!plan || !trainer) return fail("tunegraph_trainer_open: plan and trainer are required");
    tunegraph_trainer_options o = {.struct_size = sizeof o};
    if (options && read_in(&o, sizeof o, options, "tunegraph_trainer_options")) return -1;
    tg_device device;
    switch (o.device) {
    case TUNEGRAPH_DEVICE_AUTO: device = tg_default_device(); break;
    case TUNEGRAPH_DEVICE_CPU: device = TG_DEVICE_CPU; break;
    case TUNEGRAPH_DEVICE_CUDA: device = TG_DEVICE_CUDA; break;
    default: return fail("tunegraph_trainer_options.device: %d is not a tunegraph_device", (int)o.device);
    }
    if (o.threads < 0) return fail("tunegraph_trainer_options.threads: %d is negative (0: one per core)", o.threads);
    const int in_flight_max = TG_TRAINER_STAGING_MAX - 2;
    if (o.max_in_flight < 0 || o.max_in_flight > in_flight_max)
        return fail("tunegraph_trainer_options.max_in_flight: %d is not in 0..%d (0: the default, %d)",
                    o.max_in_flight, in_flight_max, in_flight_max);
    if (plan->plan.train.replicas > 1)
        return fail("%s: the plan trains %d data-parallel replicas; the library runs one (use `tunegraph run`)",
                    plan->plan.job_path, plan->plan.train.replicas);

    /* Before anything is allocated: a refusal here has nothing to free. */
    const tg_plan_run *run = &plan->plan.run;
    if (run->checkpoint_every > 0 && !run->checkpoint_dir[0])
        return fail("%s: key 'checkpoint_every' (%d) needs a folder for the checkpoints: key 'checkpoint_dir'",
                    plan->plan.job_path, run->checkpoint_every);

    tg_err err = {{0}};
    tunegraph_trainer *t = tg_calloc(1, sizeof *t);
    if (!t) return fail("out of memory for the trainer");
    if (copy_plan(&plan->plan, &t->plan, &err)) {
        free(t);
        return fail_err(&err);
    }
    tg_trainer_options to = {.device = device, .threads = o.threads, .load_data = 1,
                             .max_in_flight = o.max_in_flight ? o.max_in_flight : in_flight_max};
    if (tg_trainer_open(&t->tr, &t->plan, &to, &err)) {
        tg_plan_free(&t->plan);
        free(t);
        return fail_err(&err);
    }
    const char *checkpoint = t->plan.model.source; /* Hugging Face names the model folder */
    t->weights_report = t->tr.weights_loaded
                            ? tg_weights_report_text(&t->tr.weights, tg_hf_model_class(&t->plan), checkpoint)
                            : tg_strdup("");
    if (!t->weights_report) {
        tunegraph_trainer_close(t);
        return fail("out of memory for the weights report");
    }
    t->checkpointed = -1;
    *trainer = t;
    return 0;
}

int tunegraph_trainer_total_steps(const tunegraph_trainer *trainer, int64_t *total_steps) {
    if (!trainer || !total_steps) return fail("tunegraph_trainer_total_steps: trainer and total_steps are required");
    *total_steps = trainer->tr.total_steps;
    return 0;
}

/* One step of the trainer, its statistics as metrics. */
static int trainer_step(tunegraph_trainer *t, tunegraph_step_metrics *m) {
    tg_err err = {{0}};
    tg_step_stats s;
    if (tg_trainer_step(&t->tr, &s, &err)) return fail_err(&err);
    *m = (tunegraph_step_metrics){.struct_size = sizeof *m, .step = s.step, .loss = s.loss, .lr = s.lr,
                                  .grad_norm = s.grad_norm, .step_ms = s.step_ms, .tokens = s.tokens,
                                  .skipped = s.skipped, .loss_scale = s.loss_scale};
    return 0;
}

/* Writes a checkpoint of the trainer's state into dir: the steps in flight are taken
 * first, their metrics queued. */
static int write_checkpoint(tunegraph_trainer *t, const char *dir) {
    tg_err err = {{0}};
    tg_trainer_hold(&t->tr, 1);
    int rc = 0;
    /* GCOVR_EXCL_BR_START: steps are in flight here only on an executor that queues them
     * ahead (CUDA); the CPU executor's max_in_flight is 1, so the CPU build never loops. */
    while (!rc && t->tr.returned < t->tr.launched) {
        const int slot = (t->queue_head + t->n_queued) % TG_TRAINER_STAGING_MAX;
        if ((rc = trainer_step(t, &t->queued[slot])) == 0) t->n_queued++;
    }
    tg_trainer_hold(&t->tr, 0);
    if (rc) return -1;
    /* GCOVR_EXCL_BR_STOP */
    tg_checkpoint ck;
    if (tg_checkpoint_dir_prepare(dir, &err) || tg_trainer_checkpoint(&t->tr, &ck, 1, &err)) return fail_err(&err);
    rc = tg_checkpoint_save_in_dir(&ck, dir, t->plan.run.keep_checkpoints, NULL, &err);
    tg_checkpoint_free(&ck);
    if (rc) return fail_err(&err);
    /* Only one in the job's folder stands for the job's checkpoint at this step: one made by
     * hand elsewhere (of steps queued ahead, perhaps a multiple of checkpoint_every) does not. */
    if (!strcmp(dir, t->plan.run.checkpoint_dir)) t->checkpointed = t->tr.steps_done;
    return 0;
}

static int take_step(tunegraph_trainer *t, tunegraph_step_metrics *m) {
    if (t->n_queued) { /* GCOVR_EXCL_BR_LINE: steps queue only on CUDA (write_checkpoint) */
        *m = t->queued[t->queue_head];
        t->queue_head = (t->queue_head + 1) % TG_TRAINER_STAGING_MAX;
        t->n_queued--;
    } else if (t->tr.steps_done >= t->tr.total_steps) {
        return fail("%s: all %d steps of the schedule are taken", t->plan.job_path, t->tr.total_steps);
    } else if (trainer_step(t, m)) {
        return -1;
    }
    /* The job's checkpoints: due at a multiple of checkpoint_every, where the trainer has
     * nothing in flight (it starts no step past one). */
    const tg_plan_run *run = &t->plan.run;
    if (run->checkpoint_every > 0 && m->step % run->checkpoint_every == 0 && m->step == t->tr.steps_done && /* GCOVR_EXCL_BR_LINE: a step behind steps_done is a queued one, only on CUDA */
        t->checkpointed != t->tr.steps_done) /* GCOVR_EXCL_BR_LINE: checkpointed reaches this step first only through steps queued ahead (CUDA) */
        return write_checkpoint(t, run->checkpoint_dir);
    return 0;
}

int tunegraph_trainer_step(tunegraph_trainer *trainer, tunegraph_step_metrics *metrics) {
    if (!trainer) return fail("tunegraph_trainer_step: trainer is required");
    /* Checked first: a step taken cannot be given back. */
    if (metrics && !struct_size(metrics, "tunegraph_step_metrics")) return -1;
    tunegraph_step_metrics m;
    if (take_step(trainer, &m)) return -1;
    return metrics ? fill_out(metrics, &m, sizeof m, "tunegraph_step_metrics") : 0;
}

int tunegraph_trainer_train(tunegraph_trainer *trainer, tunegraph_step_callback on_step, void *ctx) {
    if (!trainer) return fail("tunegraph_trainer_train: trainer is required");
    while (trainer->n_queued || trainer->tr.steps_done < trainer->tr.total_steps) { /* GCOVR_EXCL_BR_LINE: n_queued is nonzero only on CUDA (write_checkpoint) */
        tunegraph_step_metrics m;
        if (take_step(trainer, &m)) return -1;
        if (on_step) on_step(ctx, &m);
    }
    return 0;
}

int tunegraph_trainer_evaluate(tunegraph_trainer *trainer, tunegraph_eval_metrics *metrics) {
    if (!trainer || !metrics) return fail("tunegraph_trainer_evaluate: trainer and metrics are required");
    if (!struct_size(metrics, "tunegraph_eval_metrics")) return -1;
    tg_err err = {{0}};
    tg_eval_stats s;
    if (tg_trainer_eval(&trainer->tr, &s, &err))
        return fail("%s: evaluate: %s", trainer->plan.job_path, err.msg);
    tunegraph_eval_metrics m = {.struct_size = sizeof m, .examples = s.examples, .counted = s.counted, .loss = s.loss,
                                .has_accuracy = s.accuracy >= 0, .accuracy = s.accuracy >= 0 ? s.accuracy : 0,
                                .has_perplexity = s.perplexity >= 0, .perplexity = s.perplexity >= 0 ? s.perplexity : 0,
                                .macro_f1 = s.accuracy >= 0 ? s.macro_f1 : 0,
                                .has_squad = s.questions > 0, .questions = s.questions, .exact = s.exact,
                                .f1 = s.f1, .has_ans_total = s.has_ans_total, .has_ans_exact = s.has_ans_exact,
                                .has_ans_f1 = s.has_ans_f1, .no_ans_total = s.no_ans_total,
                                .no_ans_exact = s.no_ans_exact, .no_ans_f1 = s.no_ans_f1};
    return fill_out(metrics, &m, sizeof m, "tunegraph_eval_metrics");
}

int tunegraph_trainer_save_weights(tunegraph_trainer *trainer, const char *path) {
    if (!trainer || !path) return fail("tunegraph_trainer_save_weights: trainer and path are required");
    tg_err err = {{0}};
    if (check_output(&trainer->plan, path, "weights", &err)) return fail_err(&err);
    return tg_trainer_save(&trainer->tr, path, &err) ? fail_err(&err) : 0;
}

int tunegraph_trainer_export_hf(tunegraph_trainer *trainer, const char *out_dir,
                                const tunegraph_export_options *options) {
    if (!trainer || !out_dir) return fail("tunegraph_trainer_export_hf: trainer and out_dir are required");
    tunegraph_export_options o = {.struct_size = sizeof o};
    if (options && read_in(&o, sizeof o, options, "tunegraph_export_options")) return -1;
    if (o.n_labels < 0 || o.n_labels > INT32_MAX || (o.n_labels && !o.labels))
        return fail("tunegraph_export_options.n_labels: %lld names%s", (long long)o.n_labels,
                    o.labels ? "" : " with labels NULL");
    const tg_hf_export_options eo = {out_dir, o.tokenizer, o.labels, (int)o.n_labels, o.force != 0, o.bf16 != 0};
    tg_named_path inputs[TG_PLAN_INPUTS];
    char *config_path;
    tg_err err = {{0}};
    if (tg_front_plan_inputs(&trainer->plan, inputs, &config_path, &err)) return fail_err(&err);
    int rc = tg_hf_export_check(&trainer->plan, &eo, inputs, TG_PLAN_INPUTS, &err) ||
             tg_trainer_export_hf(&trainer->tr, &eo, &err);
    free(config_path);
    return rc ? fail_err(&err) : 0;
}

const char *tunegraph_trainer_weights_report(const tunegraph_trainer *trainer) {
    return trainer ? trainer->weights_report : ""; /* an open trainer always has one */
}

int tunegraph_trainer_save_checkpoint(tunegraph_trainer *trainer, const char *dir) {
    if (!trainer) return fail("tunegraph_trainer_save_checkpoint: trainer is required");
    if (!dir && !trainer->plan.run.checkpoint_dir[0])
        return fail("%s: tunegraph_trainer_save_checkpoint: no folder given and the job has no checkpoint_dir",
                    trainer->plan.job_path);
    return write_checkpoint(trainer, dir ? dir : trainer->plan.run.checkpoint_dir);
}

int tunegraph_trainer_resume(tunegraph_trainer *trainer, const char *path) {
    if (!trainer || !path) return fail("tunegraph_trainer_resume: trainer and path are required");
    tg_err err = {{0}};
    char *file;
    tg_checkpoint ck;
    if (tg_checkpoint_locate(path, &file, &err)) return fail_err(&err);
    int rc = tg_checkpoint_read(file, &ck, &err);
    if (!rc) {
        rc = tg_trainer_restore(&trainer->tr, &ck, file, &err);
        tg_checkpoint_free(&ck);
    }
    free(file);
    if (rc) return fail_err(&err);
    trainer->checkpointed = trainer->tr.steps_done;
    return 0;
}

int tunegraph_trainer_steps_done(const tunegraph_trainer *trainer, int64_t *steps) {
    if (!trainer || !steps) return fail("tunegraph_trainer_steps_done: trainer and steps are required");
    *steps = trainer->tr.steps_done - trainer->n_queued;
    return 0;
}

void tunegraph_trainer_close(tunegraph_trainer *trainer) {
    if (!trainer) return;
    free(trainer->weights_report);
    tg_trainer_close(&trainer->tr);
    tg_plan_free(&trainer->plan);
    free(trainer);
}
