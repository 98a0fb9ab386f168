/* The cost model on the command line: inspect --predict, calibrate, and the table beside
 * run --profile (cli/cost.h). */
#include "cli/cost.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/front.h"
#include "base/alloc.h"
#include "cli/metrics.h"
#include "cli/usage.h"
#include "plan/cost_calibration.h"
#include "plan/gpu_specs.h"
#include "plan/op_meta.h"
#include "plan/plan_file.h"
#include "runtime/executor.h"
#include "runtime/trainer.h"

#define MAX_SETS 64

static const char inspect_predict_usage[] =
    "usage: tunegraph inspect PLAN|JOB --predict [--gpu h100|h200|cpu|auto|KEY] [--threads N]\n"
    "                [--calibration FILE] [--top N] [--set key=value]...\n";
static const char calibrate_usage[] =
    "usage: tunegraph calibrate [--device cpu|cuda] [--threads N] [--repeats N] [-o FILE]\n";

static int resolved_threads(int threads) {
    if (threads > 0) return threads;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 ? (int)cores : 1;
}

/* A whole number in [lo, hi], all of text. */
static int whole(const char *text, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    const long v = text[0] >= '0' && text[0] <= '9' ? strtol(text, &end, 10) : -1;
    if (v < 0 || errno || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int cost_wants_predict(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--predict")) return 1;
    return 0;
}

int cost_device_resolve(const char *which, const tg_plan *plan, int threads, const char *calibration,
                        tg_cost_device *d, char *note, size_t note_len, tg_err *err) {
    note[0] = 0;
    char key[TG_COST_KEY_MAX] = "cpu", gpu[256] = "";
    if (which && strcmp(which, "auto")) snprintf(key, sizeof key, "%s", which);
    else if (tg_cuda_built() && tg_cuda_device_name(0, gpu, sizeof gpu) == 0) { /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
        const tg_gpu_spec *s = tg_gpu_spec_by_name(gpu);
        if (!s) return tg_fail(err, "the cost model has no description of GPU '%s' (pass --gpu with a known key)", gpu);
        snprintf(key, sizeof key, "%s", s->key);
    }
    if (tg_cost_device_builtin(key, plan->train.precision, plan->train.allow_tf32, d, err)) return -1;
    if (d->cpu) d->threads = resolved_threads(threads);
    if (gpu[0]) snprintf(d->name, sizeof d->name, "%s", gpu);
    tg_cost_calibration c;
    if (calibration) {
        if (tg_cost_calibration_read(calibration, &c, err) || tg_cost_device_apply(d, &c, err))
            return tg_fail_context(err, "calibration %s", calibration);
        return 0;
    }
    char path[1024];
    struct stat st;
    if (tg_cost_calibration_path(d->key, d->threads, path, sizeof path) || stat(path, &st) != 0) return 0;
    tg_err why = {{0}};
    if (tg_cost_calibration_read(path, &c, &why) || tg_cost_device_apply(d, &c, &why))
        snprintf(note, note_len, "the cached calibration cannot be used (%s): defaults instead", why.msg);
    return 0;
}

/* ---- inspect --predict ---------------------------------------------------------------- */

int cmd_inspect_predict(int argc, char **argv) {
    const char *input = NULL, *which = NULL, *calibration = NULL, *sets[MAX_SETS];
    int n_sets = 0, threads = 0, top = 10;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        const int value = !strcmp(s, "--gpu") || !strcmp(s, "--threads") || !strcmp(s, "--calibration") ||
                          !strcmp(s, "--set") || !strcmp(s, "--top");
        if (value && i + 1 >= argc) return cli_usage_error("inspect", inspect_predict_usage, "%s needs a value", s);
        if (!strcmp(s, "--predict")) continue;
        if (!strcmp(s, "--gpu")) which = argv[++i];
        else if (!strcmp(s, "--calibration")) calibration = argv[++i];
        else if (!strcmp(s, "--threads")) {
            if (whole(argv[++i], 0, 1024, &threads))
                return cli_usage_error("inspect", inspect_predict_usage, "--threads needs a whole number 0 to 1024, got '%s'",
                                       argv[i]);
        } else if (!strcmp(s, "--top")) {
            if (whole(argv[++i], 0, 1000, &top))
                return cli_usage_error("inspect", inspect_predict_usage, "--top needs a whole number 0 to 1000, got '%s'",
                                       argv[i]);
        } else if (!strcmp(s, "--set")) {
            if (n_sets == MAX_SETS) return cli_usage_error("inspect", inspect_predict_usage, "too many --set options (%s)", "64");
            sets[n_sets++] = argv[++i];
        } else if (s[0] == '-' && s[1]) return cli_usage_error("inspect", inspect_predict_usage, "unknown option %s", s);
        else if (input) return cli_usage_error("inspect", inspect_predict_usage, "unexpected argument %s", s);
        else input = s;
    }
    if (!input) return cli_usage_error("inspect", inspect_predict_usage, "%s", "missing plan or job file");
    tg_err err = {{0}};
    tg_plan plan;
    const int from_plan = tg_plan_file_sniff(input);
    if (from_plan && n_sets) return cli_usage_error("inspect", inspect_predict_usage, "%s", "--set applies to a job, not a plan");
    if (from_plan ? tg_plan_read(input, &plan, &err) : tg_front_compile_file(input, sets, n_sets, &plan, &err)) {
        fprintf(stderr, "tunegraph: %s\n", err.msg);
        return 1;
    }
    tg_cost_device d;
    char note[1024];
    tg_cost_prediction pred;
    int rc = cost_device_resolve(which, &plan, threads, calibration, &d, note, sizeof note, &err);
    if (!rc) rc = tg_cost_predict(&plan, &d, &pred, &err);
    if (!rc) {
        if (note[0]) fprintf(stderr, "tunegraph: %s\n", note);
        printf("plan %s: %s %s, batch %d x seq %d, %s\n", input, tg_arch_name(plan.model.arch),
               tg_task_name(plan.train.task), plan.train.batch, plan.train.seq, tg_precision_name(plan.train.precision));
        if (tg_cost_prediction_print(&plan, &d, &pred, top, stdout))
            rc = tg_fail(&err, "cannot write the prediction to standard output");
        tg_cost_prediction_free(&pred);
    }
    tg_plan_free(&plan);
    if (rc) fprintf(stderr, "tunegraph: %s\n", err.msg);
    return rc ? 1 : 0;
}

/* ---- run --profile -------------------------------------------------------------------- */

static double pct(double predicted, double measured) {
    return measured > 0 ? 100 * (predicted - measured) / measured : NAN;
}

int cost_report_profile(const tg_plan *plan, int cuda, int threads, const double *op_ms, double step_ms, FILE *out,
                        FILE *metrics) {
    tg_cost_device d;
    tg_err err = {{0}};
    char note[1024];
    tg_cost_prediction p;
    if (cost_device_resolve(cuda ? "auto" : "cpu", plan, threads, NULL, &d, note, sizeof note, &err) ||
        tg_cost_predict(plan, &d, &p, &err)) {
        fprintf(out, "  cost model: no prediction (%s)\n", err.msg);
        return 0;
    }
    if (note[0]) fprintf(out, "  cost model: %s\n", note);
    fprintf(out, "  cost model (%s, %s) against the profile:\n  %-20s %12s %12s %8s\n", d.key,
            d.calibrated ? "calibrated" : "uncalibrated defaults", "", "predicted ms", "measured ms", "error");
    int wrote = 0;
    double group_ms[TG_GROUP_COUNT] = {0}, phase_ms[TG_PHASE_COUNT] = {0}, total = 0;
    for (int o = 0; o < plan->n_ops; o++) {
        group_ms[tg_op_group_of(plan->ops[o].kind)] += op_ms[o];
        if (plan->ops[o].phase >= 0 && plan->ops[o].phase < TG_PHASE_COUNT) phase_ms[plan->ops[o].phase] += op_ms[o];
        total += op_ms[o];
    }
    for (int g = 0; g < TG_GROUP_COUNT; g++) {
        if (!p.group_ops[g]) continue;
        fprintf(out, "  %-20s %12.4f %12.4f %7.1f%%\n", tg_op_group_name(g), p.group_s[g] * 1e3, group_ms[g],
                pct(p.group_s[g] * 1e3, group_ms[g]));
        if (metrics && metrics_write_cost_model(metrics, "group", tg_op_group_name(g), d.key, d.calibrated,
                                                p.group_s[g] * 1e3, group_ms[g]))
            wrote = -1;
    }
    for (int ph = 0; ph < TG_PHASE_COUNT; ph++) {
        fprintf(out, "  %-20s %12.4f %12.4f %7.1f%%\n", tg_phase_name(ph), p.phase_s[ph] * 1e3, phase_ms[ph],
                pct(p.phase_s[ph] * 1e3, phase_ms[ph]));
        if (metrics && metrics_write_cost_model(metrics, "phase", tg_phase_name(ph), d.key, d.calibrated,
                                                p.phase_s[ph] * 1e3, phase_ms[ph]))
            wrote = -1;
    }
    /* The op-by-op sum is one forward and backward; the step runs micro-steps of them. */
    fprintf(out, "  %-20s %12.4f %12.4f %7.1f%%\n", "ops one by one", (p.phase_s[0] + p.phase_s[1] + p.phase_s[2]) * 1e3,
            total, pct((p.phase_s[0] + p.phase_s[1] + p.phase_s[2]) * 1e3, total));
    if (metrics && metrics_write_cost_model(metrics, "step", "ops one by one", d.key, d.calibrated,
                                            (p.phase_s[0] + p.phase_s[1] + p.phase_s[2]) * 1e3, total))
        wrote = -1;
    if (step_ms > 0) {
        fprintf(out, "  %-20s %12.4f %12.4f %7.1f%%\n", "step (run's median)", p.step_s * 1e3, step_ms,
                pct(p.step_s * 1e3, step_ms));
        if (metrics && metrics_write_cost_model(metrics, "step", "step", d.key, d.calibrated, p.step_s * 1e3, step_ms))
            wrote = -1;
    }
    tg_cost_prediction_free(&p);
    return wrote;
}

/* ---- calibrate ------------------------------------------------------------------------ */

/* The sweep: small models written as config.json folders (random weights), each trained
 * at a few shapes. The CPU's are small enough for seconds of measuring; the GPU's are
 * the benchmark models' shapes. */
typedef struct sweep_case {
    const char *arch; /* bert, gpt2 or llama */
    int hidden, layers, heads, vocab;
    const char *task;
    int batch, seq;
    int lora_r; /* llama: LoRA on all seven projections, rank lora_r (0: full training) */
} sweep_case;

static const sweep_case cpu_sweep[] = {
    {"bert", 64, 2, 2, 1024, "classify", 4, 64, 0},  {"bert", 128, 2, 4, 2048, "classify", 8, 64, 0},
    {"bert", 256, 2, 4, 2048, "classify", 4, 128, 0}, {"gpt2", 128, 2, 4, 2048, "lm", 4, 128, 0},
    {"gpt2", 256, 2, 4, 4096, "lm", 8, 64, 0},
};
static const sweep_case gpu_sweep[] = {
    {"bert", 768, 12, 12, 30522, "classify", 8, 128, 0},  {"bert", 768, 12, 12, 30522, "classify", 32, 128, 0},
    {"bert", 1024, 4, 16, 30522, "classify", 16, 256, 0}, {"gpt2", 768, 12, 12, 50257, "lm", 8, 256, 0},
    {"gpt2", 768, 12, 12, 50257, "lm", 16, 512, 0},       {"bert", 256, 4, 4, 8192, "classify", 64, 128, 0},
    /* Attention over long rows: the own kernels (attention dropout) at T 1024, and Llama's
     * (no dropout, bf16: cuDNN where it is there) at head dim 64 and 128, T 2048 and 4096;
     * the LoRA one adds the rank-16 products, memory-bound, of many shapes. */
    {"bert", 768, 4, 12, 30522, "classify", 4, 1024, 0},  {"llama", 1024, 4, 16, 32000, "lm", 2, 2048, 0},
    {"llama", 2048, 4, 16, 32000, "lm", 1, 4096, 16},
};

/* Writes dir/config.json for the case's model. */
static int write_config(const char *dir, const sweep_case *c, tg_err *err) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return tg_fail(err, "%s: cannot write: %s", path, strerror(errno));
    const int positions = c->seq > 512 ? c->seq : 512;
    if (!strcmp(c->arch, "bert"))
        fprintf(f, "{\"model_type\": \"bert\", \"hidden_size\": %d, \"num_hidden_layers\": %d, "
                   "\"num_attention_heads\": %d, \"intermediate_size\": %d, \"vocab_size\": %d, "
                   "\"max_position_embeddings\": %d, \"type_vocab_size\": 2, \"hidden_act\": \"gelu\", "
                   "\"layer_norm_eps\": 1e-12, \"initializer_range\": 0.02, \"hidden_dropout_prob\": 0.1, "
                   "\"attention_probs_dropout_prob\": 0.1, \"pad_token_id\": 0}\n",
                c->hidden, c->layers, c->heads, 4 * c->hidden, c->vocab, positions);
    else if (!strcmp(c->arch, "llama"))
        fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": %d, \"num_hidden_layers\": %d, "
                   "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
                   "\"intermediate_size\": %d, \"vocab_size\": %d, \"max_position_embeddings\": %d, "
                   "\"hidden_act\": \"silu\", \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0, "
                   "\"attention_dropout\": 0.0, \"attention_bias\": false, \"mlp_bias\": false, "
                   "\"tie_word_embeddings\": false, \"initializer_range\": 0.02}\n",
                c->hidden, c->layers, c->heads, c->heads / 4, c->hidden / c->heads, 7 * c->hidden / 2, c->vocab,
                positions);
    else
        fprintf(f, "{\"model_type\": \"gpt2\", \"n_embd\": %d, \"n_layer\": %d, \"n_head\": %d, \"vocab_size\": %d, "
                   "\"n_positions\": %d, \"activation_function\": \"gelu_new\", \"layer_norm_epsilon\": 1e-5, "
                   "\"initializer_range\": 0.02, \"resid_pdrop\": 0.1, \"attn_pdrop\": 0.1, \"embd_pdrop\": 0.1}\n",
                c->hidden, c->layers, c->heads, c->vocab, positions);
    if (fclose(f)) return tg_fail(err, "%s: cannot write: %s", path, strerror(errno));
    return 0;
}

/* Real tokens in every row, valid labels: the kernels see a batch like a training one. */
static void fill_inputs(tg_trainer *tr, const tg_plan *p) {
    const tg_plan_io *io = &p->io;
    const int B = p->train.batch, T = p->train.seq, V = p->model.vocab_size;
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int32_t *ids = tg_trainer_input(tr, io->input_ids);
    int32_t *pos = io->position_ids >= 0 ? tg_trainer_input(tr, io->position_ids) : NULL;
    int32_t *types = io->token_type_ids >= 0 ? tg_trainer_input(tr, io->token_type_ids) : NULL;
    int32_t *labels = io->labels >= 0 ? tg_trainer_input(tr, io->labels) : NULL;
    float *mask = io->attention_mask >= 0 ? tg_trainer_input(tr, io->attention_mask) : NULL;
    for (int i = 0; i < B * T; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = 1 + (int32_t)((x >> 33) % (uint64_t)(V - 1));
        if (pos) pos[i] = i % T;
        if (types) types[i] = 0;
        if (mask) mask[i] = 1.0f;
        if (labels && p->train.task == TG_TASK_LM) labels[i] = (int32_t)((x >> 11) % (uint64_t)V);
    }
    if (labels && p->train.task == TG_TASK_CLASSIFY)
        for (int b = 0; b < B; b++) labels[b] = b % 2;
}

/* Measures the case op by op into samples (grown as needed), and its step (the median of
 * 3; on a GPU the captured graph's) into *step_s; the compiled plan is left in *plan (the
 * caller frees it) when the call succeeds. */
static int measure_case(const sweep_case *c, const char *dir, int cuda, int threads, int repeats, int precision,
                        tg_cost_sample **samples, int *n, int *cap, char *gpu_name, size_t gpu_len, tg_plan *kept,
                        double *step_s, tg_err *err) {
    if (write_config(dir, c, err)) return -1;
    char job[2048], lora[256] = "";
    if (c->lora_r > 0)
        snprintf(lora, sizeof lora, "lora_r = %d\nlora_alpha = %d\nlora_targets = q_proj,k_proj,v_proj,o_proj,gate_proj,"
                                    "up_proj,down_proj\n", c->lora_r, 2 * c->lora_r);
    snprintf(job, sizeof job,
             "model = %s\ntask = %s\nbatch = %d\nseq = %d\nprecision = %s\nsteps = 10\ntrain_data = unused.jsonl\n%s%s",
             dir, c->task, c->batch, c->seq, tg_precision_name(precision),
             !strcmp(c->task, "classify") ? "num_labels = 2\n" : "", lora);
    tg_plan plan;
    if (tg_front_compile_text(job, "calibration job", dir, NULL, 0, &plan, err)) return -1;
    /* What the model needs of the device to describe an op: whether cuDNN takes attention. */
    tg_cost_device probe;
    if (tg_cost_device_builtin(cuda ? "h100" : "cpu", precision, 0, &probe, err)) {
        tg_plan_free(&plan);
        return -1;
    }
    tg_trainer tr;
    tg_trainer_options o = {.device = cuda ? TG_DEVICE_CUDA : TG_DEVICE_CPU, .threads = threads, .load_data = 0};
    if (tg_trainer_open(&tr, &plan, &o, err)) {
        tg_plan_free(&plan);
        return -1;
    }
    if (cuda && gpu_name[0] == 0) tg_cuda_device_name(0, gpu_name, gpu_len); /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
    fill_inputs(&tr, &plan);
    double *ms = tg_calloc((size_t)plan.n_ops, sizeof *ms);
    int rc = ms ? 0 : tg_fail(err, "out of memory for the op times");
    /* A first pass warms the caches and the allocator (and, on CUDA, the GEMM choice). */
    if (!rc) rc = tg_trainer_profile(&tr, 1, ms, err);
    if (!rc) rc = tg_trainer_profile(&tr, repeats, ms, err);
    if (!rc && *n + plan.n_ops > *cap) {
        const int grown = (*n + plan.n_ops) * 2;
        tg_cost_sample *s = realloc(*samples, (size_t)grown * sizeof *s);
        if (!s) rc = tg_fail(err, "out of memory for the calibration's samples");
        else *samples = s, *cap = grown;
    }
    double total = 0, scale = 1, step_ms = 0;
    for (int o = 0; !rc && o < plan.n_ops; o++) total += ms[o];
    /* The CPU runs a step's ops in line, each faster than alone (no timer around it, the
     * caches warm from the op before): the ops' times are scaled so that they sum to the
     * measured step (median of 3), which is what the model predicts. On a GPU the op-by-op
     * times stay as measured, and the steps (a first one captures the graph) fit the
     * captured step's terms (tg_cost_fit_step). A GPU step is its own device time (its
     * phases, first stamp to last), not the time since the step before ended: taken one at
     * a time, that would add the host's turn between steps, which `run` (steps back to
     * back) never sees; BERT B32 T128 read 7.969 ms that way against the run's 7.646. */
    if (!rc && total > 0) {
        double steps[3];
        for (int k = cuda ? -1 : 0; k < 3 && !rc; k++) {
            tg_step_stats st;
            rc = tg_trainer_run_step(&tr, &st, err);
            if (k >= 0) steps[k] = cuda ? tg_step_device_ms(&st) : st.step_ms;
        }
        if (!rc) {
            step_ms = steps[0] + steps[1] + steps[2] - fmin(steps[0], fmin(steps[1], steps[2])) -
                      fmax(steps[0], fmax(steps[1], steps[2]));
            if (!cuda) scale = step_ms / total;
        }
    }
    for (int o = 0; !rc && o < plan.n_ops; o++) {
        tg_cost_sample s = tg_cost_op_sample(&plan, o, &probe);
        s.seconds = ms[o] * scale / 1e3;
        (*samples)[(*n)++] = s;
    }
    *step_s = step_ms / 1e3;
    if (!rc && step_ms > 0)
        fprintf(stderr, "  %s hidden %d x %d layers, %s batch %d x seq %d: %d ops, %.3f ms op by op, step %.3f ms\n",
                c->arch, c->hidden, c->layers, c->task, c->batch, c->seq, plan.n_ops, total, step_ms);
    else if (!rc)
        fprintf(stderr, "  %s hidden %d x %d layers, %s batch %d x seq %d: %d ops, %.3f ms op by op\n", c->arch,
                c->hidden, c->layers, c->task, c->batch, c->seq, plan.n_ops, total);
    free(ms);
    tg_trainer_close(&tr);
    if (rc) tg_plan_free(&plan);
    else *kept = plan;
    return rc;
}

static void remove_dir(const char *dir) {
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int cmd_calibrate(int argc, char **argv) {
    const char *device = NULL, *output = NULL;
    int threads = 0, repeats = 3;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        const int value = !strcmp(s, "--device") || !strcmp(s, "-o") || !strcmp(s, "--threads") || !strcmp(s, "--repeats");
        if (value && i + 1 >= argc) return cli_usage_error("calibrate", calibrate_usage, "%s needs a value", s);
        if (!strcmp(s, "--device")) device = argv[++i];
        else if (!strcmp(s, "-o")) output = argv[++i];
        else if (!strcmp(s, "--threads")) {
            if (whole(argv[++i], 0, 1024, &threads))
                return cli_usage_error("calibrate", calibrate_usage, "--threads needs a whole number 0 to 1024, got '%s'",
                                       argv[i]);
        } else if (!strcmp(s, "--repeats")) {
            if (whole(argv[++i], 1, 100, &repeats))
                return cli_usage_error("calibrate", calibrate_usage, "--repeats needs a whole number 1 to 100, got '%s'",
                                       argv[i]);
        } else return cli_usage_error("calibrate", calibrate_usage, "unexpected argument %s", s);
    }
    if (device && strcmp(device, "cpu") && strcmp(device, "cuda"))
        return cli_usage_error("calibrate", calibrate_usage, "--device must be cpu or cuda, got '%s'", device);
    const int cuda = device ? !strcmp(device, "cuda") : tg_default_device() == TG_DEVICE_CUDA;
    tg_err err = {{0}};
    if (cuda && !tg_cuda_built()) {
        fprintf(stderr, "tunegraph: calibrate --device cuda needs the GPU build (make gpu)\n");
        return 1;
    }
    const sweep_case *cases = cuda ? gpu_sweep : cpu_sweep; /* GCOVR_EXCL_BR_LINE: the CPU build has no CUDA executor */
    const int n_cases = cuda ? (int)(sizeof gpu_sweep / sizeof gpu_sweep[0]) : (int)(sizeof cpu_sweep / sizeof cpu_sweep[0]); /* GCOVR_EXCL_BR_LINE: as above */
    const int precision = cuda ? TG_PREC_BF16 : TG_PREC_FP32; /* GCOVR_EXCL_BR_LINE: as above */
    char dir[] = "/tmp/tunegraph-calibrate-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "tunegraph: cannot make a folder for the calibration's models: %s\n", strerror(errno));
        return 1;
    }
    fprintf(stderr, "tunegraph: calibrating the cost model on %s: %d plans op by op, %d repeats each\n",
            cuda ? "the GPU" : "the CPU", n_cases, repeats);
    tg_cost_sample *samples = NULL;
    int n = 0, cap = 0, rc = 0, measured = 0;
    char gpu[256] = "";
    tg_plan plans[sizeof gpu_sweep / sizeof gpu_sweep[0] > sizeof cpu_sweep / sizeof cpu_sweep[0]
                      ? sizeof gpu_sweep / sizeof gpu_sweep[0]
                      : sizeof cpu_sweep / sizeof cpu_sweep[0]];
    const tg_plan *plan_of[sizeof plans / sizeof plans[0]];
    double steps[sizeof plans / sizeof plans[0]];
    for (int k = 0; k < n_cases && !rc; k++) {
        rc = measure_case(&cases[k], dir, cuda, threads, repeats, precision, &samples, &n, &cap, gpu, sizeof gpu,
                          &plans[k], &steps[k], &err);
        if (!rc) plan_of[k] = &plans[k], measured++;
    }
    remove_dir(dir);
    tg_cost_device d;
    const tg_gpu_spec *spec = cuda ? tg_gpu_spec_by_name(gpu) : NULL;
    if (!rc && cuda && !spec) rc = tg_fail(&err, "the cost model has no description of GPU '%s'", gpu);
    if (!rc) rc = tg_cost_device_builtin(cuda ? spec->key : "cpu", precision, 0, &d, &err);
    int per_group[TG_GROUP_COUNT];
    if (!rc) {
        if (d.cpu) d.threads = resolved_threads(threads);
        if (cuda) snprintf(d.name, sizeof d.name, "%s", gpu);
        else snprintf(d.name, sizeof d.name, "the CPU executor, %d threads", d.threads);
        rc = tg_cost_fit(samples, n, d.cpu, &d, per_group, &err);
    }
    /* On a GPU, the captured step's launch term and the update's overlap from the plans' steps. */
    if (!rc && cuda) rc = tg_cost_fit_step(plan_of, steps, measured, &d, &err);
    for (int k = 0; k < measured; k++) tg_plan_free(&plans[k]);
    free(samples);
    char path[1024];
    if (!rc && output) snprintf(path, sizeof path, "%s", output);
    else if (!rc && tg_cost_calibration_path(d.key, d.threads, path, sizeof path))
        rc = tg_fail(&err, "no cache folder for the calibration (set TUNEGRAPH_CACHE_DIR or HOME, or pass -o FILE)");
    tg_cost_calibration c;
    if (!rc) {
        tg_cost_calibration_of_device(&d, precision, per_group, &c);
        rc = tg_cost_calibration_write(path, &c, &err);
    }
    if (rc) {
        fprintf(stderr, "tunegraph: %s\n", err.msg);
        return 1;
    }
    printf("calibrated %s (%s): peak %.4g TFLOP/s, %.4g GB/s, %.2f us an op, from %d ops -> %s\n", d.key, d.name,
           d.peak_flops / 1e12, d.peak_bw / 1e9, d.launch_s * 1e6, n, path);
    printf("  %-21s %10s %10s %7s\n", "group", "eff_flops", "eff_bw", "ops");
    for (int g = 0; g < TG_GROUP_COUNT; g++)
        printf("  %-21s %10.4f %10.4f %7d%s\n", tg_op_group_name(g), d.eff_flops[g], d.eff_bw[g], per_group[g],
               per_group[g] ? "" : " (none measured: default kept)");
    tg_cost_shape_terms_print(&d, stdout);
    return 0;
}
