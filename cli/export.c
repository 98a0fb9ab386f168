/* tunegraph export, tunegraph predict, and run --save-dir (cli/export.h). */
#include "cli/export.h"
#include "cli/usage.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "base/alloc.h"
#include "base/atomic_file.h"
#include "plan/plan_file.h"
#include "runtime/hf_export.h"

#define EXPORT_MAX_SETS 64

static const char export_usage[] =
    "usage: tunegraph export PLAN|JOB --weights FILE.safetensors -o OUTDIR [--tokenizer PATH] [--labels a,b,...]\n"
    "                        [--dtype fp32|bf16] [--force] [--set key=value]...\n";
static const char predict_usage[] =
    "usage: tunegraph predict PLAN|JOB -o LOGITS.jsonl [--weights FILE.safetensors] [--data FILE.jsonl]\n"
    "                         [--device cpu|cuda] [--threads N] [--init-missing] [--set key=value]...\n";

static int usage_refused(const char *usage, const char *fmt, const char *arg) {
    return cli_usage_error(NULL, usage, fmt, arg);
}

static int report_error(const tg_err *err) {
    fprintf(stderr, "tunegraph: %s\n", err->msg);
    return 1;
}

typedef struct cmd_args {
    const char *input, *output, *weights, *tokenizer, *labels, *dtype, *data, *device, *threads;
    int force;
    int init_missing; /* predict: parameters the weights lack keep their initial values */
    const char *sets[EXPORT_MAX_SETS];
    int n_sets;
} cmd_args;

/* Options of `allowed` (space-separated words) into a; 0, or 2 after a usage message. */
static int parse(int argc, char **argv, const char *allowed, const char *usage, cmd_args *a) {
    memset(a, 0, sizeof *a);
    static const char *const valued[] = {"-o", "--weights", "--tokenizer", "--labels", "--dtype",
                                         "--data", "--device", "--threads", "--set"};
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!(s[0] == '-' && s[1])) {
            if (a->input) return usage_refused(usage, "unexpected argument %s", s);
            a->input = s;
            continue;
        }
        const size_t n = strlen(s);
        int known = 0;
        for (const char *w = allowed; *w && !known; w += strcspn(w, " "), w += *w == ' ')
            known = strcspn(w, " ") == n && !strncmp(w, s, n);
        if (!known) return usage_refused(usage, "unknown option %s", s);
        if (!strcmp(s, "--force")) {
            a->force = 1;
            continue;
        }
        if (!strcmp(s, "--init-missing")) {
            a->init_missing = 1;
            continue;
        }
        const char **slot = NULL;
        const char **slots[] = {&a->output, &a->weights, &a->tokenizer, &a->labels, &a->dtype,
                                &a->data, &a->device, &a->threads, NULL};
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            if (!strcmp(s, valued[k])) slot = slots[k];
        if (i + 1 >= argc) return usage_refused(usage, "%s needs a value", s);
        const char *v = argv[++i];
        if (slot) {
            *slot = v;
        } else { /* --set */
            if (a->n_sets == EXPORT_MAX_SETS) return usage_refused(usage, "too many --set options (%s)", "64 at most");
            if (!strchr(v, '=')) return usage_refused(usage, "--set needs key=value, got '%s'", v);
            a->sets[a->n_sets++] = v;
        }
    }
    if (!a->input) return usage_refused(usage, "%s", "missing plan or job file");
    return 0;
}

/* The plan file as written (with run settings from --set), or the job compiled. */
static int load_plan(const cmd_args *a, tg_plan *plan, tg_err *err) {
    if (!tg_plan_file_sniff(a->input)) return tg_front_compile_file(a->input, a->sets, a->n_sets, plan, err);
    if (tg_plan_read(a->input, plan, err)) return -1;
    if (tg_front_set_run(plan, a->sets, a->n_sets, a->input, err)) {
        tg_plan_free(plan);
        return -1;
    }
    return 0;
}

/* "a,b,c" as names, in one allocation (the pointers, then the text they point into), freed
 * by free_labels. */
static int split_labels(const char *text, char ***names, int *n) {
    *names = NULL, *n = 0;
    int count = 1;
    for (const char *c = text; *c; c++) count += *c == ',';
    const size_t len = strlen(text);
    char **out = tg_malloc(sizeof *out * (size_t)count + len + 1);
    if (!out) return -1;
    char *copy = memcpy((char *)(out + count), text, len + 1);
    for (int i = 0; i < count; i++) {
        out[i] = copy;
        copy += strcspn(copy, ",");
        if (*copy) *copy++ = 0;
    }
    *names = out, *n = count;
    return 0;
}

static void free_labels(char **names) { free(names); }

/* --dtype: 0 fp32, 1 bf16, -1 anything else. */
static int parse_dtype(const char *text) {
    if (!text || !strcmp(text, "fp32")) return 0;
    return !strcmp(text, "bf16") ? 1 : -1;
}

/* The model folder (for messages: Hugging Face names the checkpoint by its folder) when
 * the weights are the model's own, else the checkpoint file. */
static const char *checkpoint_name(const tg_plan *plan, const char *weights) {
    return !strcmp(weights, plan->model.weights) ? plan->model.source : weights;
}

static void print_report(FILE *out, const tg_plan *plan, const tg_weights_report *r, const char *weights) {
    char *text = tg_weights_report_text(r, tg_hf_model_class(plan), checkpoint_name(plan, weights));
    if (text) fputs(text, out);
    free(text);
}

void print_weights_report(FILE *out, const tg_trainer *tr) {
    if (tr->weights_loaded) print_report(out, tr->plan, &tr->weights, tr->weights_path);
}

/* An export or a prediction needs every parameter: one left at its random initial value
 * would go out as if trained. The message lists them as Hugging Face does. */
static int require_complete(const tg_weights_report *r, const char *weights, const char *why, tg_err *err) {
    if (!r->missing) return 0;
    char list[768];
    size_t len = (size_t)snprintf(list, sizeof list, "[");
    for (int i = 0; i < r->missing && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s'%s'", i ? ", " : "", r->missing_names[i]);
    if (len < sizeof list) snprintf(list + len, sizeof list - len, "]");
    return tg_fail(err, "%s: lacks %d of the plan's parameters, which %s needs: %s", weights, r->missing, why, list);
}

/* The files a command reads besides the plan's own: inputs[0..n) as tg_front_plan_inputs
 * gives them, then the command's input file and weights. *config_path is the caller's to
 * free. */
static int command_inputs(const tg_plan *plan, const char *input, const char *weights, tg_named_path *inputs, int *n,
                          char **config_path, tg_err *err) {
    if (tg_front_plan_inputs(plan, inputs, config_path, err)) return -1;
    *n = TG_PLAN_INPUTS;
    inputs[(*n)++] = (tg_named_path){input, tg_plan_file_sniff(input) ? "plan file" : "job file"};
    if (weights) inputs[(*n)++] = (tg_named_path){weights, "weights (--weights)"};
    return 0;
}

int cmd_export(int argc, char **argv) {
    cmd_args a;
    int rc = parse(argc, argv, "-o --weights --tokenizer --labels --dtype --force --set", export_usage, &a);
    if (rc) return rc;
    if (!a.output) return usage_refused(export_usage, "%s", "-o OUTDIR is required");
    if (!a.weights) return usage_refused(export_usage, "%s", "--weights FILE.safetensors is required");
    const int bf16 = parse_dtype(a.dtype);
    if (bf16 < 0) return usage_refused(export_usage, "--dtype must be fp32 or bf16, got '%s'", a.dtype);
    tg_err err = {{0}};
    tg_plan plan;
    if (load_plan(&a, &plan, &err)) return report_error(&err);
    char **labels = NULL;
    int n_labels = 0;
    if (a.labels && split_labels(a.labels, &labels, &n_labels)) {
        tg_plan_free(&plan);
        return report_error(&(tg_err){"out of memory"});
    }
    const tg_hf_export_options opts = {a.output, a.tokenizer, (const char *const *)labels, n_labels, a.force, bf16};
    tg_named_path inputs[TG_PLAN_INPUTS + 2];
    int n_inputs = 0;
    char *config_path = NULL;
    tg_weights_image img = {0};
    tg_weights_report report = {0};
    rc = command_inputs(&plan, a.input, a.weights, inputs, &n_inputs, &config_path, &err) ||
         tg_hf_export_check(&plan, &opts, inputs, n_inputs, &err) || tg_weights_image_alloc(&plan, &img, &err);
    if (!rc) {
        tg_weights_init(&img, plan.run.seed);
        rc = tg_weights_load(&img, a.weights, &report, &err) ||
             require_complete(&report, a.weights, "an export", &err);
    }
    if (!rc) {
        print_report(stderr, &plan, &report, a.weights); /* tensors the model does not use */
        rc = tg_hf_export(&img, &opts, &err);
    }
    if (!rc)
        fprintf(stderr, "exported %s: %s, %d tensors (%s)\n", a.output, tg_hf_model_class(&plan), report.loaded,
                bf16 ? "bf16" : "fp32");
    tg_weights_report_free(&report);
    if (img.plan) tg_weights_image_free(&img);
    free(config_path);
    free_labels(labels);
    tg_plan_free(&plan);
    return rc ? report_error(&err) : 0;
}

/* ---- predict ---- */

typedef struct logits_writer {
    FILE *f;
    const tg_trainer *tr;
    int failed;
} logits_writer;

static void write_float(FILE *f, float v) {
    if (isfinite(v)) fprintf(f, "%.9g", (double)v);
    else fputs("null", f); /* JSON has no NaN or infinity */
}

static void write_ints(FILE *f, const char *key, const int32_t *v, int32_t n) {
    fprintf(f, ", \"%s\": [", key);
    for (int32_t i = 0; i < n; i++) fprintf(f, i ? ", %d" : "%d", v[i]);
    fputc(']', f);
}

/* One line per eval example: its index, the ids the plan saw (not for images; cut to seq; mlm: as the
 * eval masked them, with "labels", -100 off the masked positions), its token types and
 * label (qa: answer positions) where they have them, and its logits (LM: one row per token;
 * qa: a start and an end logit per token). */
static int write_logits(void *ctx, const float *logits, int32_t first, int32_t rows, tg_err *err) {
    logits_writer *w = ctx;
    const tg_plan *p = w->tr->plan;
    const tg_tensor *lt = &p->tensors[p->io.logits];
    const int64_t cols = lt->shape[lt->ndim - 1], seq = p->train.seq;
    for (int32_t r = 0; r < rows; r++) {
        const tg_example *ex = &w->tr->eval.examples[first + r];
        const int32_t len = ex->len < seq ? ex->len : (int32_t)seq;
        fprintf(w->f, "{\"index\": %d", first + r);
        const int32_t *masked = w->tr->eval_masked_ids, *labels = w->tr->eval_masked_labels;
        /* An image's pixels are not ids: its line is the index, label and logits. */
        if (p->io.pixel_values < 0) write_ints(w->f, "input_ids", masked ? masked + (int64_t)r * seq : ex->input_ids, len);
        if (masked) write_ints(w->f, "labels", labels + (int64_t)r * seq, len);
        if (ex->token_type_ids) write_ints(w->f, "token_type_ids", ex->token_type_ids, len);
        if (p->train.task == TG_TASK_CLASSIFY) {
            fprintf(w->f, ", \"label\": %d, \"logits\": [", ex->label);
            for (int64_t c = 0; c < cols; c++) {
                if (c) fputs(", ", w->f);
                write_float(w->f, logits[r * cols + c]);
            }
        } else {
            /* lm: the vocabulary's columns of each token's row; qa: its start and end logits. */
            const int64_t width = p->train.task == TG_TASK_LM ? p->model.vocab_size : cols;
            if (p->train.task == TG_TASK_QA)
                fprintf(w->f, ", \"start_position\": %d, \"end_position\": %d", ex->label, ex->label_end);
            fputs(", \"logits\": [", w->f);
            for (int32_t t = 0; t < len; t++) {
                fputs(t ? ", [" : "[", w->f);
                const float *row = logits + ((int64_t)r * seq + t) * cols;
                for (int64_t v = 0; v < width; v++) {
                    if (v) fputs(", ", w->f);
                    write_float(w->f, row[v]);
                }
                fputc(']', w->f);
            }
        }
        fputs("]}\n", w->f);
    }
    if (ferror(w->f)) return tg_fail(err, "cannot write the logits file: %s", strerror(errno));
    return 0;
}

int cmd_predict(int argc, char **argv) {
    cmd_args a;
    int rc = parse(argc, argv, "-o --weights --data --device --threads --init-missing --set", predict_usage, &a);
    if (rc) return rc;
    if (!a.output) return usage_refused(predict_usage, "%s", "-o LOGITS.jsonl is required");
    if (a.device && strcmp(a.device, "cpu") && strcmp(a.device, "cuda"))
        return usage_refused(predict_usage, "--device must be cpu or cuda, got '%s'", a.device);
    int threads = 0;
    if (a.threads) {
        char *end;
        /* digits only: an overflow gives LONG_MAX, past the limit */
        long v = a.threads[0] >= '0' && a.threads[0] <= '9' ? strtol(a.threads, &end, 10) : -1;
        if (v < 0 || v > 1024 || *end)
            return usage_refused(predict_usage, "--threads needs a whole number from 0 to 1024 (0: one per core), got '%s'",
                              a.threads);
        threads = (int)v;
    }
    tg_err err = {{0}};
    tg_plan plan;
    if (load_plan(&a, &plan, &err)) return report_error(&err);
    char *data_set = NULL;
    rc = 0;
    if (a.data && (tg_asprintf(&data_set, "eval_data=%s", a.data) < 0 ||
                   tg_front_set_run(&plan, (const char *const *)&data_set, 1, a.input, &err)))
        rc = err.msg[0] ? -1 : tg_fail(&err, "out of memory");
    free(data_set);
    const char *weights = a.weights ? a.weights : plan.model.weights;
    if (!rc && plan.train.replicas > 1)
        rc = tg_fail(&err, "%s: predict runs one replica; compile the job with data_parallel = 1", a.input);
    if (!rc && !plan.run.eval_data[0])
        rc = tg_fail(&err, "%s: no examples to predict: give --data FILE.jsonl or set eval_data", a.input);
    if (!rc && !weights[0] && !a.init_missing)
        rc = tg_fail(&err, "%s: the model (%s) has no weights of its own: give --weights FILE.safetensors (or "
                           "--init-missing to predict with its initial values)",
                     a.input, plan.model.source);
    tg_named_path inputs[TG_PLAN_INPUTS + 2];
    int n_inputs = 0;
    char *config_path = NULL;
    const tg_named_path output = {a.output, "logits (-o)"};
    if (!rc) rc = command_inputs(&plan, a.input, a.weights, inputs, &n_inputs, &config_path, &err) ||
                  tg_outputs_check(&output, 1, inputs, n_inputs, &err);
    free(config_path);
    if (rc) {
        tg_plan_free(&plan);
        return report_error(&err);
    }
    tg_trainer tr;
    tg_trainer_options opts = {.device = a.device ? (tg_device)tg_device_parse(a.device) : tg_default_device(),
                               .threads = threads, .load_data = 1, .eval_only = 1, .weights = a.weights};
    if (tg_trainer_open(&tr, &plan, &opts, &err)) {
        tg_plan_free(&plan);
        return report_error(&err);
    }
    print_weights_report(stderr, &tr); /* tensors the model does not use */
    tg_atomic_file *f = NULL;
    /* --init-missing: as transformers' from_pretrained, a head the checkpoint lacks keeps its
     * seeded initial values (reported above), e.g. the accuracy of a new classifier; a
     * model without weights predicts with its initial values throughout. */
    rc = (!a.init_missing && require_complete(&tr.weights, tr.weights_path, "a prediction", &err)) ||
         tg_atomic_begin(a.output, "logits file", &f, &err);
    logits_writer w = {f ? tg_atomic_stream(f) : NULL, &tr, 0};
    if (!rc && !w.f) rc = tg_fail(&err, "out of memory");
    tg_eval_stats ev;
    if (!rc) rc = tg_trainer_eval_logits(&tr, &ev, write_logits, &w, &err);
    if (f) {
        if (rc) tg_atomic_discard(f);
        else rc = tg_atomic_commit(f, &err);
    }
    if (!rc) {
        fprintf(stderr, "predicted %d examples on %s: loss %.4f", ev.examples,
                opts.device == TG_DEVICE_CUDA ? "cuda" : "cpu", ev.loss); /* GCOVR_EXCL_BR_LINE: cuda only in the GPU build */
        if (ev.accuracy >= 0) fprintf(stderr, ", accuracy %.4f", ev.accuracy);
        if (ev.perplexity >= 0) fprintf(stderr, ", perplexity %.3f", ev.perplexity);
        fprintf(stderr, "; logits in %s\n", a.output);
    }
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
    return rc ? report_error(&err) : 0;
}

/* ---- run --save-dir ---- */

int run_export_args(int *argc, char **argv, run_export *ex) {
    static const char run_usage[] = "usage: tunegraph run PLAN|JOB ... --save-dir DIR [--labels a,b,...] "
                                    "[--tokenizer PATH] [--dtype fp32|bf16] [--force]\n";
    memset(ex, 0, sizeof *ex);
    /* run's own options that take a value: their values are skipped, never taken as ours */
    static const char *const run_valued[] = {"-o", "--set", "--metrics", "--device", "--threads", "--save", "--in-flight", "--nproc"};
    const char *dtype = NULL;
    int kept = 0;
    for (int i = 0; i < *argc; i++) {
        const char *s = argv[i];
        const char **slot = !strcmp(s, "--save-dir")    ? &ex->save_dir
                            : !strcmp(s, "--labels")    ? &ex->labels_text
                            : !strcmp(s, "--tokenizer") ? &ex->tokenizer
                            : !strcmp(s, "--dtype")     ? &dtype
                                                        : NULL;
        if (slot) {
            if (i + 1 >= *argc) return usage_refused(run_usage, "%s needs a value", s);
            *slot = argv[++i];
            continue;
        }
        if (!strcmp(s, "--force")) {
            ex->force = 1;
            continue;
        }
        argv[kept++] = argv[i];
        for (size_t k = 0; k < sizeof run_valued / sizeof run_valued[0]; k++)
            if (!strcmp(s, run_valued[k]) && i + 1 < *argc) argv[kept++] = argv[++i];
    }
    *argc = kept;
    if (!ex->save_dir && (ex->labels_text || ex->tokenizer || dtype || ex->force))
        return usage_refused(run_usage, "%s", "--labels, --tokenizer, --dtype and --force go with --save-dir");
    ex->bf16 = parse_dtype(dtype);
    if (ex->bf16 < 0) return usage_refused(run_usage, "--dtype must be fp32 or bf16, got '%s'", dtype);
    if (ex->labels_text && split_labels(ex->labels_text, &ex->labels, &ex->n_labels)) {
        fprintf(stderr, "tunegraph: out of memory\n");
        return 1;
    }
    return 0;
}

void run_export_free(run_export *ex) {
    free_labels(ex->labels);
    memset(ex, 0, sizeof *ex);
}

static tg_hf_export_options export_options(const run_export *ex) {
    return (tg_hf_export_options){ex->save_dir, ex->tokenizer, (const char *const *)ex->labels, ex->n_labels,
                                  ex->force, ex->bf16};
}

int run_export_check(const run_export *ex, const tg_plan *plan, const char *input, const char *input_what,
                     const tg_named_path *outputs, int n_outputs, tg_err *err) {
    tg_named_path keep[TG_PLAN_INPUTS + 1 + 8];
    char *config_path;
    if (n_outputs > 8) return tg_fail(err, "too many outputs"); /* GCOVR_EXCL_BR_LINE: cli/main.c passes at most 2 */
    if (tg_front_plan_inputs(plan, keep, &config_path, err)) return -1;
    int n = TG_PLAN_INPUTS;
    keep[n++] = (tg_named_path){input, input_what};
    for (int i = 0; i < n_outputs; i++) keep[n++] = outputs[i];
    const tg_hf_export_options o = export_options(ex);
    int rc = tg_hf_export_check(plan, &o, keep, n, err);
    free(config_path);
    return rc;
}

int run_export_write(const run_export *ex, tg_trainer *tr, tg_err *err) {
    const tg_hf_export_options o = export_options(ex);
    return tg_trainer_export_hf(tr, &o, err);
}
