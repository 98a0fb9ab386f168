#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tests/harness.h"

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "runtime/trainer.h"

#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct test_case {
    const char *name;
    const char *file;
    tg_test_fn fn;
} test_case;

static test_case *g_tests;
static int g_n_tests, g_cap_tests;
static int g_current_failed;
static char g_tmpdir[512];
static int g_tmp_counter;
static char g_tmp_root[512];

void tg_test_register(const char *name, const char *file, tg_test_fn fn) {
    if (g_n_tests == g_cap_tests) {
        g_cap_tests = g_cap_tests ? 2 * g_cap_tests : 64;
        g_tests = realloc(g_tests, sizeof *g_tests * (size_t)g_cap_tests);
        if (!g_tests) abort();
    }
    g_tests[g_n_tests++] = (test_case){name, file, fn};
}

int tg_test_check(int ok, const char *file, int line, const char *fmt, ...) {
    if (ok) return 1;
    g_current_failed++;
    fprintf(stdout, "    %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    return 0;
}

const char *tg_test_tmpdir(void) {
    snprintf(g_tmpdir, sizeof g_tmpdir, "%s/t%d", g_tmp_root, ++g_tmp_counter);
    if (mkdir(g_tmpdir, 0755) != 0) {
        perror(g_tmpdir);
        abort();
    }
    return g_tmpdir;
}

int tg_test_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

char *tg_test_read_file(const char *path, long *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len) *len = n;
    }
    return buf;
}

int tg_test_count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

double tg_rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

double tg_l2_diff(const float *a, const float *b, int64_t n) {
    double num = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - (double)b[i];
        num += d * d;
    }
    return sqrt(num);
}

double tg_rel_err_after_update(const float *got, const float *want, const float *grad_a, const float *grad_b,
                               int64_t n, double floor, int64_t *left_out) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double ga = grad_a ? fabs(grad_a[i]) : 0, gb = grad_b ? fabs(grad_b[i]) : 0;
        if (ga < floor && gb < floor && (ga != 0 || gb != 0)) {
            ++*left_out;
            continue;
        }
        if (isnan(got[i]) || isnan(want[i])) return INFINITY;
        double d = (double)got[i] - (double)want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return sqrt(num) / fmax(sqrt(den), 1e-30);
}

int tg_test_tensor_named(const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) return t;
    return -1;
}

uint32_t tg_test_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float tg_test_f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void tg_test_fill_uniform(float *x, int64_t n, uint64_t seed, float lo, float hi) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    /* The state's top 24 bits: a float's worth of uniform mantissa. */
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)((tg_test_rand(&s) >> 8) * (1.0 / 16777216.0));
}

tg_op tg_test_op(int kind) {
    tg_op op;
    memset(&op, 0, sizeof op);
    op.kind = kind;
    memset(op.in, 0xff, sizeof op.in); /* all-ones int32: -1 */
    memset(op.out, 0xff, sizeof op.out);
    return op;
}

uint32_t tg_test_rand(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state >> 32);
}

void tg_test_fill_random_inputs(tg_trainer *tr, const tg_plan *p, uint64_t *rng) {
    const tg_plan_io *io = &p->io;
    int B = p->train.batch, T = p->train.seq, V = p->model.vocab_size;
    int pad = p->train.pad_id;
    int32_t *ids = tg_trainer_input(tr, io->input_ids), *pos = tg_trainer_input(tr, io->position_ids);
    int32_t *types = tg_trainer_input(tr, io->token_type_ids), *labels = tg_trainer_input(tr, io->labels);
    float *mask = tg_trainer_input(tr, io->attention_mask);
    for (int b = 0; b < B; b++) {
        int len = b == 1 ? T / 2 : T;
        int real = 0;
        for (int t = 0; t < T; t++) {
            int i = b * T + t, keep = t < len;
            ids[i] = keep ? (int32_t)(pad + 1 + tg_test_rand(rng) % (uint32_t)(V - pad - 1)) : pad;
            mask[i] = keep ? 1.0f : 0.0f;
            real += keep;
            pos[i] = p->model.arch == TG_ARCH_ROBERTA ? (keep ? pad + real : pad) : t;
            if (types) types[i] = keep && p->model.type_vocab_size > 1 ? (int32_t)(tg_test_rand(rng) % 2) : 0;
            if (p->train.task == TG_TASK_LM)
                labels[i] = t + 1 < len ? (int32_t)(tg_test_rand(rng) % (uint32_t)V) : TG_IGNORE_INDEX;
        }
        if (p->train.task == TG_TASK_CLASSIFY) labels[b] = (int32_t)(tg_test_rand(rng) % (uint32_t)p->train.num_labels);
    }
}

const char *tg_test_cli(void) {
    const char *cli = getenv("TG_TEST_CLI");
    if (cli && *cli) return cli;
    return tg_test_device() ? "./build/gpu/tunegraph" : "./build/tunegraph";
}

int tg_test_device(void) {
    const char *d = getenv("TG_TEST_DEVICE");
    return d && !strcmp(d, "cuda");
}

static void remove_tree(const char *path) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", path);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The order the tests run in: those named in `first` (comma-separated test names, in that
 * order; unknown names are skipped) and then the rest as registered. Mutation testing
 * names the tests that killed earlier mutants of the same file, so that with
 * TG_TEST_FAIL_FAST a mutant's first failing test tends to come early. */
static int *run_order(const char *first) {
    int *order = malloc(sizeof *order * (size_t)(g_n_tests ? g_n_tests : 1));
    char *placed = calloc((size_t)(g_n_tests ? g_n_tests : 1), 1);
    if (!order || !placed) abort();
    int n = 0;
    for (const char *s = first; s && *s;) {
        const char *end = strchr(s, ',');
        const size_t len = end ? (size_t)(end - s) : strlen(s);
        for (int i = 0; i < g_n_tests; i++)
            if (!placed[i] && strlen(g_tests[i].name) == len && !strncmp(g_tests[i].name, s, len)) {
                placed[i] = 1;
                order[n++] = i;
                break;
            }
        s = end ? end + 1 : s + len;
    }
    for (int i = 0; i < g_n_tests; i++)
        if (!placed[i]) order[n++] = i;
    free(placed);
    return order;
}

/* Whether name is one of the comma-separated names in list. */
static int named_in(const char *list, const char *name) {
    const size_t len = strlen(name);
    for (const char *s = list; *s;) {
        const char *end = strchr(s, ',');
        const size_t n = end ? (size_t)(end - s) : strlen(s);
        if (n == len && !strncmp(s, name, len)) return 1;
        s = end ? end + 1 : s + n;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *filter = argc > 1 ? argv[1] : NULL;
    /* TG_TEST_LIST=1 prints each test as "name file" and runs none; TG_TEST_ONLY runs just
     * the tests it names (comma-separated): mutation testing runs, for a mutated line, only
     * the tests that reach it. */
    const char *list = getenv("TG_TEST_LIST");
    if (list && !strcmp(list, "1")) {
        for (int i = 0; i < g_n_tests; i++) printf("%s %s\n", g_tests[i].name, g_tests[i].file);
        return 0;
    }
    const char *only = getenv("TG_TEST_ONLY");
    const char *tmp = getenv("TMPDIR");
    snprintf(g_tmp_root, sizeof g_tmp_root, "%s/tunegraph-test-XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(g_tmp_root)) {
        perror("mkdtemp");
        return 2;
    }
    /* Caches the suite writes (GEMM algorithms) stay in its own folder. */
    char cache_dir[600];
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", g_tmp_root);
    setenv("TUNEGRAPH_CACHE_DIR", cache_dir, 1);
    /* TG_TEST_FAIL_FAST=1 stops at the first failing test (mutation testing: one failure
     * decides, and the rest of the suite would only cost time). */
    const char *ff = getenv("TG_TEST_FAIL_FAST");
    int fail_fast = ff && !strcmp(ff, "1");
    int *order = run_order(getenv("TG_TEST_FIRST"));
    int passed = 0, failed = 0;
    for (int k = 0; k < g_n_tests && !(fail_fast && failed); k++) {
        const int i = order[k];
        if (filter && !strstr(g_tests[i].name, filter) && !strstr(g_tests[i].file, filter)) continue;
        if (only && !named_in(only, g_tests[i].name)) continue;
        g_current_failed = 0;
        double t0 = now_ms();
        g_tests[i].fn();
        double ms = now_ms() - t0;
        if (g_current_failed) {
            failed++;
            printf("FAIL %s (%s, %.0f ms)\n", g_tests[i].name, g_tests[i].file, ms);
        } else {
            passed++;
            printf("ok   %s (%.0f ms)\n", g_tests[i].name, ms);
        }
        fflush(stdout);
    }
    free(order);
    remove_tree(g_tmp_root);
    if (tg_test_device()) printf("(executor: cuda)\n");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

int tg_test_compile_preset(const char *preset, int task, int precision, int data_parallel, tg_plan *p) {
    return tg_test_compile_sized(preset, task, 2, 16, data_parallel, precision, p);
}

int tg_test_compile_sized(const char *preset, int task, int batch, int seq, int data_parallel, int precision,
                          tg_plan *p) {
    tg_model_config cfg;
    tg_err err;
    if (!CHECK(tg_model_config_load(preset, &cfg, &err) == 0, "%s", err.msg)) return 0;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", preset);
    job.task = task, job.precision = precision, job.batch = batch, job.seq = seq, job.steps = 1;
    job.data_parallel = data_parallel;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s: %s", preset, err.msg);
}

int tg_test_train_cpu(const char *job_path, const char *const *sets, int n_sets, int steps, float **params,
                      size_t *bytes, int *shared) {
    tg_err err;
    tg_job job;
    tg_plan plan;
    tg_trainer tr;
    *params = NULL;
    if (!CHECK(tg_job_load(job_path, sets, n_sets, &job, &err) == 0, "%s", err.msg)) return 0;
    if (!CHECK(tg_compile(&job, &plan, &err) == 0, "%s", err.msg)) return 0;
    if (shared) *shared = plan.grads_share_activations;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .load_data = 1};
    if (!CHECK(tg_trainer_open(&tr, &plan, &o, &err) == 0, "%s", err.msg)) {
        tg_plan_free(&plan);
        return 0;
    }
    int ok = 1;
    for (int s = 0; ok && s < steps; s++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "step %d: %s", s + 1, err.msg);
    }
    *bytes = plan.pool_bytes[TG_POOL_PARAMS];
    *params = ok ? malloc(*bytes) : NULL;
    ok = ok && *params && CHECK(tg_trainer_read(&tr, plan.io.params_all, *params, &err) == 0, "%s", err.msg);
    tg_trainer_close(&tr);
    tg_plan_free(&plan);
    return ok;
}

int tg_test_compile_bert_base_b32(int share_grad_memory, int recompute, uint64_t memory_limit, tg_plan *p, tg_err *err) {
    tg_model_config cfg;
    if (!CHECK(tg_model_config_load("bert-base-uncased", &cfg, err) == 0, "%s", err->msg)) return -2;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "bert-base-uncased");
    job.task = TG_TASK_CLASSIFY, job.precision = TG_PREC_BF16, job.batch = 32, job.seq = 128, job.steps = 1;
    job.share_grad_memory = share_grad_memory, job.recompute = recompute, job.memory_limit = memory_limit;
    return tg_compile_with_config(&job, &cfg, p, err);
}
