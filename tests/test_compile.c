/* Compiler: whole-model plans, the memory-plan checker, determinism, job/model
 * mismatches, and the CLI's handling of failures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "compiler/autodiff.h"
#include "compiler/backward_rules.h"
#include "compiler/compile.h"
#include "compiler/compiler_alloc.h"
#include "compiler/limits.h"
#include "plan/inspect.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "plan/validate.h"
#include "compiler/model_build.h"
#include "models/model_config.h"
#include "models/safetensors.h"
#include "plan/op_meta.h"
#include "plan/plan_file.h"
#include "runtime/trainer.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/weights.h"
#include "tests/harness.h"

/* Compiles a job given as text (written to a file so messages carry real lines). */
static int compile_text(const char *text, tg_plan *plan, tg_err *err, char *job_path) {
    char local[512];
    if (!job_path) job_path = local;
    snprintf(job_path, 512, "%s/job.txt", tg_test_tmpdir());
    if (tg_test_write_file(job_path, text)) return tg_fail(err, "cannot write %s", job_path);
    tg_job job;
    if (tg_job_load(job_path, NULL, 0, &job, err)) return -1;
    return tg_compile(&job, plan, err);
}

static int64_t param_count(const tg_plan *p) {
    int64_t n = 0;
    for (int t = 0; t < p->n_tensors; t++)
        if ((p->tensors[t].flags & TG_TENSOR_PARAM) && !(p->tensors[t].flags & TG_TENSOR_VIEW)) n += tg_tensor_numel(&p->tensors[t]);
    return n;
}

static void check_plan_memory(const tg_plan *p, const char *what) {
    tg_memory_report r;
    tg_err err;
    int rc = tg_plan_check_memory(p, &r, &err);
    CHECK(rc == 0, "%s: memory check: %s", what, err.msg);
    CHECK(r.peak_bytes == p->peak_bytes, "%s: checker peak %llu != planned %llu", what,
          (unsigned long long)r.peak_bytes, (unsigned long long)p->peak_bytes);
    CHECK(r.activation_live_peak == p->activation_live_peak, "%s: live peak differs", what);
    CHECK(p->pool_bytes[TG_POOL_ACTIVATIONS] >= p->activation_live_peak, "%s: pool below the live peak", what);
}

TG_TEST(test_compile_bert_base) {
    tg_plan p;
    tg_err err;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = compile_text("model = bert-base-uncased\ntask = classify\nnum_labels = 2\nbatch = 32\nseq = 128\n"
                          "steps = 10\ntrain_data = none.jsonl\n",
                          &p, &err, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    REQUIRE(rc == 0, "%s", err.msg);
    printf("    bert-base B=32 T=128: %d ops, peak %.1f MiB, %.1f GFLOP/step, compiled in %.1f ms\n", p.n_ops,
           p.peak_bytes / 1048576.0, p.flops_per_step / 1e9, (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
    /* BertModel has 109,482,240 parameters; the 2-label classifier adds 768*2 + 2. */
    CHECK(param_count(&p) == 109482240 + 1538, "parameters %lld", (long long)param_count(&p));
    /* Forward matmul FLOPs alone: 2 * tokens * (12 layers * 12 D^2 + pooler/classifier). */
    double tokens = 32.0 * 128, d = 768, lower = 3 * 2 * tokens * 12 * 12 * d * d;
    CHECK(p.flops_per_step > lower && p.flops_per_step < 1.5 * lower, "flops %.3g vs %.3g", p.flops_per_step, lower);
    CHECK(p.pool_bytes[TG_POOL_PARAMS] >= 4 * (uint64_t)param_count(&p), "params pool too small");
    CHECK(p.pool_bytes[TG_POOL_GRADS] == p.pool_bytes[TG_POOL_PARAMS], "grads must mirror params");
    CHECK(p.pool_bytes[TG_POOL_OPTIM] >= 2 * p.pool_bytes[TG_POOL_PARAMS], "optim holds m and v");
    check_plan_memory(&p, "bert-base");
    /* Liveness reuse: the activation pool is far below the sum of all activations. */
    uint64_t all = 0;
    for (int t = 0; t < p.n_tensors; t++)
        if (p.tensors[t].pool == TG_POOL_ACTIVATIONS) all += p.tensors[t].bytes;
    CHECK(p.pool_bytes[TG_POOL_ACTIVATIONS] < all / 2, "activations %llu of %llu: no reuse?",
          (unsigned long long)p.pool_bytes[TG_POOL_ACTIVATIONS], (unsigned long long)all);
    tg_plan_free(&p);
}

TG_TEST(test_compile_all_presets) {
    static const struct {
        const char *job;
        int64_t params;
    } cases[] = {
        {"model = bert-large-uncased\nnum_labels = 3\nbatch = 8\nseq = 512\n", 335141888 + 1024 * 3 + 3},
        /* RobertaModel without its pooler (124,645,632 - 590,592) plus the classification head. */
        {"model = roberta-base\nnum_labels = 2\nbatch = 32\nseq = 128\n", 124055040 + 768 * 768 + 768 + 768 * 2 + 2},
        {"model = gpt2\ntask = lm\nbatch = 16\nseq = 1024\n", 124439808},
        {"model = gpt2\nnum_labels = 2\npad_token_id = 50256\nbatch = 8\nseq = 128\n", 124439808 + 768 * 2},
        {"model = distilgpt2\ntask = lm\nbatch = 8\nseq = 256\n", 81912576},
        {"model = tiny-bert\nbatch = 4\nseq = 16\n", 0},
        {"model = tiny-roberta\nbatch = 4\nseq = 16\n", 0},
        {"model = tiny-gpt2\ntask = lm\nbatch = 4\nseq = 16\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "%ssteps = 5\ntrain_data = none.jsonl\n", cases[i].job);
        tg_plan p;
        tg_err err;
        if (!CHECK(compile_text(text, &p, &err, NULL) == 0, "case %zu: %s", i, err.msg)) continue;
        if (cases[i].params)
            CHECK(param_count(&p) == cases[i].params, "case %zu: %lld parameters, expected %lld", i,
                  (long long)param_count(&p), (long long)cases[i].params);
        check_plan_memory(&p, cases[i].job);
        tg_plan_free(&p);
    }
}

/* GPT-2 (a padded view), and BERT in bf16 (packed groups of parameters, gradients and
 * bf16 copies). */
static void compile_deterministic(const char *text) {
    char path[512];
    tg_plan a, b;
    tg_err err;
    REQUIRE(compile_text(text, &a, &err, path) == 0, "%s", err.msg);
    tg_job job;
    REQUIRE(tg_job_load(path, NULL, 0, &job, &err) == 0, "%s", err.msg);
    REQUIRE(tg_compile(&job, &b, &err) == 0, "%s", err.msg);
    uint8_t *ea, *eb;
    size_t la, lb;
    REQUIRE(tg_plan_encode(&a, &ea, &la, &err) == 0 && tg_plan_encode(&b, &eb, &lb, &err) == 0, "%s", err.msg);
    CHECK(la == lb && memcmp(ea, eb, la) == 0, "two compilations differ (%zu vs %zu bytes)", la, lb);
    /* Round trip: decode, re-encode, same bytes; the decoded plan still checks out. */
    tg_plan c;
    REQUIRE(tg_plan_decode(ea, la, "plan", &c, &err) == 0, "%s", err.msg);
    uint8_t *ec;
    size_t lc;
    REQUIRE(tg_plan_encode(&c, &ec, &lc, &err) == 0, "%s", err.msg);
    CHECK(lc == la && memcmp(ec, ea, la) == 0, "round trip changed the plan");
    check_plan_memory(&c, "decoded");
    CHECK(c.fingerprint == a.fingerprint && c.fingerprint != 0, "fingerprint");
    free(ea), free(eb), free(ec);
    tg_plan_free(&a), tg_plan_free(&b), tg_plan_free(&c);
}

TG_TEST(test_compile_deterministic) {
    compile_deterministic("model = tiny-gpt2\ntask = lm\nbatch = 4\nseq = 32\nsteps = 5\ntrain_data = x.jsonl\n");
    compile_deterministic("model = tiny-bert\nbatch = 4\nseq = 32\nprecision = bf16\nsteps = 5\ntrain_data = x\n");
}

TG_TEST(test_memory_checker_catches_bad_plans) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n", &p, &err, NULL) == 0,
            "%s", err.msg);
    tg_memory_report r;
    REQUIRE(tg_plan_check_memory(&p, &r, &err) == 0, "%s", err.msg);
    /* Two activations live at the same time, at different offsets. */
    int a = -1, b = -1;
    for (int i = 0; i < p.n_tensors && b < 0; i++) {
        const tg_tensor *x = &p.tensors[i];
        if (x->pool != TG_POOL_ACTIVATIONS) continue;
        for (int j = 0; j < p.n_tensors; j++) {
            const tg_tensor *y = &p.tensors[j];
            if (j == i || y->pool != TG_POOL_ACTIVATIONS || y->offset == x->offset) continue;
            if (x->first_use <= y->last_use && y->first_use <= x->last_use) {
                a = i, b = j;
                break;
            }
        }
    }
    REQUIRE(b >= 0, "no two simultaneously live activations found");
    uint64_t saved = p.tensors[b].offset;
    p.tensors[b].offset = p.tensors[a].offset;
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "overlap"), "overlap not caught: %s", err.msg);
    p.tensors[b].offset = saved;
    /* A use outside the recorded lifetime. */
    int32_t last = p.tensors[a].last_use;
    p.tensors[a].last_use = p.tensors[a].first_use - 1;
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "outside its lifetime"), "lifetime: %s", err.msg);
    p.tensors[a].last_use = last;
    /* Packed groups: tiny-bert's q|k|v biases are 128 bytes each, so key.bias and
     * value.bias sit off the alignment, back to back after query.bias. */
    int qb = tg_test_tensor_named(&p, "bert.encoder.layer.0.attention.self.query.bias");
    int kb = tg_test_tensor_named(&p, "bert.encoder.layer.0.attention.self.key.bias");
    int vb = tg_test_tensor_named(&p, "bert.encoder.layer.0.attention.self.value.bias");
    REQUIRE(qb >= 0 && kb >= 0 && vb >= 0, "no packed biases");
    tg_tensor *k = &p.tensors[kb];
    const tg_tensor *view = &p.tensors[k->group];
    CHECK(k->group >= 0 && k->group == p.tensors[qb].group && k->group == p.tensors[vb].group &&
              !strcmp(view->name, "bert.encoder.layer.0.attention.self.qkv.bias") && view->offset == p.tensors[qb].offset &&
              k->offset == view->offset + 128 && p.tensors[vb].offset == view->offset + 256 && k->offset % 256,
          "key bias at %llu, packed in %d", (unsigned long long)k->offset, k->group);
    saved = k->offset;
    k->offset -= 64; /* into query.bias */
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "overlap"), "member overlap: %s", err.msg);
    k->offset = view->offset + view->bytes; /* past its view */
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "outside its group"), "outside: %s", err.msg);
    k->offset = saved;
    int32_t group = k->group;
    k->group = -1; /* unaligned without a group */
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "aligned"), "alignment: %s", err.msg);
    k->group = group;
    k->bytes -= 4; /* members no longer cover the view */
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "its members"), "tiling: %s", err.msg);
    k->bytes += 4;
    tg_tensor *gk = &p.tensors[k->grad];
    CHECK(gk->group >= 0 && p.tensors[gk->group].pool == TG_POOL_GRADS && gk->offset == k->offset, "key bias gradient");
    gk->offset += 64; /* gradients are checked alike */
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "overlap"), "gradient overlap: %s", err.msg);
    gk->offset -= 64;
    REQUIRE(tg_plan_check_memory(&p, &r, &err) == 0, "restored plan: %s", err.msg);
    /* A pool smaller than its tensors. */
    p.pool_bytes[TG_POOL_ACTIVATIONS] -= 256;
    CHECK(tg_plan_check_memory(&p, &r, &err) != 0 && strstr(err.msg, "pool activations"), "extent: %s", err.msg);
    tg_plan_free(&p);
}

static void expect_job_error(const char *text, const char *key, const char *detail) {
    tg_plan p;
    tg_err err = {{0}};
    char path[512];
    int rc = compile_text(text, &p, &err, path);
    if (!CHECK(rc != 0, "compiled, but expected an error about %s", key)) {
        tg_plan_free(&p);
        return;
    }
    char want[600];
    snprintf(want, sizeof want, "key '%s'", key);
    CHECK(strstr(err.msg, path) != NULL, "message does not name the job file: %s", err.msg);
    CHECK(strstr(err.msg, want) != NULL, "message does not name %s: %s", want, err.msg);
    CHECK(strstr(err.msg, detail) != NULL, "message lacks '%s': %s", detail, err.msg);
}

TG_TEST(test_compile_job_model_mismatch) {
    expect_job_error("model = tiny-bert\nseq = 65\nsteps = 1\ntrain_data = x\n", "seq", "max_position_embeddings 64");
    expect_job_error("model = tiny-roberta\nseq = 65\nsteps = 1\ntrain_data = x\n", "seq", "pad_token_id + 1");
    expect_job_error("model = tiny-bert\ntask = lm\nsteps = 1\ntrain_data = x\n", "task", "needs a decoder");
    expect_job_error("model = gpt2\nnum_labels = 2\nsteps = 1\ntrain_data = x\n", "pad_token_id", "padding id");
    expect_job_error("model = tiny-bert\nseq = 16\npad_token_id = 500\nsteps = 1\ntrain_data = x\n", "pad_token_id", "vocab");
    expect_job_error("model = no-such-model\nsteps = 1\ntrain_data = x\n", "model", "no-such-model");
}

/* Runs the CLI; returns its exit code and leaves stderr in dir/stderr.txt. */
static int run_cli(const char *dir, const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s >%s/stdout.txt 2>%s/stderr.txt", tg_test_cli(), args, dir, dir);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int file_has(const char *path, const char *needle) {
    char *text = tg_test_read_file(path, NULL);
    int found = text && strstr(text, needle);
    free(text);
    return found;
}

TG_TEST(test_cli_failures_leave_nothing) {
    const char *dir = tg_test_tmpdir();
    char out[600], args[1600], err_path[600], job[600];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    snprintf(job, sizeof job, "%s/bad.job", dir);
    tg_test_write_file(job, "model = tiny-bert\nseq = 999\nsteps = 1\ntrain_data = x\n");
    snprintf(out, sizeof out, "%s/out/plan.tgp", dir);
    snprintf(out, sizeof out, "%s/plan.tgp", dir);
    snprintf(args, sizeof args, "compile %s -o %s", job, out);
    CHECK(run_cli(dir, args) == 1, "compile of a bad job must exit 1");
    CHECK(file_has(err_path, "key 'seq'"), "stderr lacks the key");
    struct stat st;
    CHECK(stat(out, &st) != 0, "a plan file was left behind");
    CHECK(tg_test_count_files(dir) == 3, "files left behind: %d", tg_test_count_files(dir));

    /* A good plan, truncated, is refused by inspect and run. */
    snprintf(job, sizeof job, "%s/good.job", dir);
    tg_test_write_file(job, "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n");
    snprintf(args, sizeof args, "compile %s -o %s", job, out);
    REQUIRE(run_cli(dir, args) == 0, "compile failed");
    long len;
    char *bytes = tg_test_read_file(out, &len);
    REQUIRE(bytes, "no plan written");
    FILE *f = fopen(out, "wb");
    fwrite(bytes, 1, (size_t)len / 2, f);
    fclose(f);
    free(bytes);
    snprintf(args, sizeof args, "inspect %s", out);
    CHECK(run_cli(dir, args) == 1 && file_has(err_path, "truncated"), "truncated plan not refused");
    snprintf(args, sizeof args, "run %s", out);
    CHECK(run_cli(dir, args) == 1 && file_has(err_path, "truncated"), "run of a truncated plan not refused");
    /* Usage errors exit 2. */
    CHECK(run_cli(dir, "frobnicate") == 2, "unknown command");
    snprintf(args, sizeof args, "run %s --device tpu", out);
    CHECK(run_cli(dir, args) == 2, "bad --device");
}

/* The `attention` key through the CLI: a bad value names the file, line and key; the
 * chosen form reaches the plan; a compiled plan refuses to change it. */
/* --in-flight: 1 to 14 steps queued; anything else is a usage error naming the value. A
 * run with steps queued trains as one with one step at a time (on the CPU the executor
 * takes one at a time either way). */
TG_TEST(test_cli_in_flight) {
    const char *dir = tg_test_tmpdir();
    char args[1600], err_path[600], m1[600], m2[600];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", dir);
    static const char *const bad[] = {"0", "15", "x", "3x"};
    for (int k = 0; k < 4; k++) {
        snprintf(args, sizeof args, "run examples/demo-classify.job --set steps=3 --in-flight %s", bad[k]);
        CHECK(run_cli(dir, args) == 2, "--in-flight %s was accepted", bad[k]);
        char want[64];
        snprintf(want, sizeof want, "got '%s'", bad[k]);
        CHECK(file_has(err_path, "--in-flight needs a whole number from 1 to 14") && file_has(err_path, want),
              "message for --in-flight %s", bad[k]);
    }
    snprintf(m1, sizeof m1, "%s/one.jsonl", dir);
    snprintf(m2, sizeof m2, "%s/many.jsonl", dir);
    snprintf(args, sizeof args, "run examples/demo-classify.job --set steps=6 --in-flight 1 --metrics %s", m1);
    REQUIRE(run_cli(dir, args) == 0, "run with --in-flight 1 failed");
    snprintf(args, sizeof args, "run examples/demo-classify.job --set steps=6 --in-flight 14 --metrics %s", m2);
    REQUIRE(run_cli(dir, args) == 0, "run with --in-flight 14 failed");
    char *a = tg_test_read_file(m1, NULL), *b = tg_test_read_file(m2, NULL);
    int same = a && b, compared = 0;
    /* The loss of every step agrees (the timings do not). */
    for (const char *p = a, *q = b; same && (p = strstr(p, "\"loss\": ")) && (q = strstr(q, "\"loss\": ")); p++, q++)
        same = strncmp(p, q, 20) == 0, compared++;
    CHECK(same && compared == 6, "losses differ between --in-flight 1 and 14 (%d steps compared)", compared);
    free(a), free(b);
}

/* A job key through the CLI: files in one scratch folder, compile + inspect of a job. */
typedef struct cli_key_run {
    char dir[600], err[700], out[700], job[700], plan[700];
} cli_key_run;

static void cli_key_open(cli_key_run *k) {
    snprintf(k->dir, sizeof k->dir, "%s", tg_test_tmpdir());
    snprintf(k->err, sizeof k->err, "%s/stderr.txt", k->dir);
    snprintf(k->out, sizeof k->out, "%s/stdout.txt", k->dir);
    snprintf(k->plan, sizeof k->plan, "%s/plan.tgp", k->dir);
}

/* A job whose bad value compile refuses with exit 1 and "<job>:<where>" on stderr. */
static void cli_key_refused(cli_key_run *k, const char *text, const char *where) {
    char args[1600], want[1000];
    snprintf(k->job, sizeof k->job, "%s/bad.job", k->dir);
    tg_test_write_file(k->job, text);
    snprintf(args, sizeof args, "compile %s -o %s", k->job, k->plan);
    CHECK(run_cli(k->dir, args) == 1, "a bad value must exit 1 (%s)", where);
    snprintf(want, sizeof want, "%s:%s", k->job, where);
    CHECK(file_has(k->err, want), "stderr lacks '%s'", want);
}

/* Compiles the good job (with --set `set` unless NULL) and inspects the plan (with
 * `inspect_flags`, "" for none) into k->out. */
static int cli_key_inspect(cli_key_run *k, const char *set, const char *inspect_flags) {
    char args[1600];
    snprintf(args, sizeof args, "compile %s -o %s%s%s", k->job, k->plan, set ? " --set " : "", set ? set : "");
    if (!CHECK(run_cli(k->dir, args) == 0, "%s failed", args)) return 0;
    snprintf(args, sizeof args, "inspect %s %s", k->plan, inspect_flags);
    return CHECK(run_cli(k->dir, args) == 0, "%s failed", args);
}

static void cli_key_good_job(cli_key_run *k, const char *text) {
    snprintf(k->job, sizeof k->job, "%s/good.job", k->dir);
    tg_test_write_file(k->job, text);
}

/* A compiled plan refuses --set of a key that changes what it computes. */
static void cli_key_plan_refuses(cli_key_run *k, const char *set) {
    char args[1600];
    snprintf(args, sizeof args, "run %s --set %s", k->plan, set);
    CHECK(run_cli(k->dir, args) == 1 && file_has(k->err, "compiled into"), "a plan accepted --set %s", set);
}

static const char *const k_tiny_gpt2_lm = "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n";

TG_TEST(test_cli_attention_key) {
    cli_key_run k;
    cli_key_open(&k);
    cli_key_refused(&k, "model = tiny-bert\nattention = flash\nsteps = 1\ntrain_data = x\n",
                    "2: key 'attention': 'flash' is not one of fused, unfused");
    cli_key_good_job(&k, k_tiny_gpt2_lm);
    if (!cli_key_inspect(&k, "attention=unfused", "")) return;
    CHECK(file_has(k.out, "attention: unfused") && file_has(k.out, "attn_softmax") && !file_has(k.out, " attention "),
          "inspect of the unfused plan");
    if (!cli_key_inspect(&k, NULL, "")) return;
    CHECK(file_has(k.out, "attention: fused") && file_has(k.out, " attention ") && file_has(k.out, "attention_bwd") &&
              !file_has(k.out, "attn_softmax"),
          "inspect of the default (fused) plan");
    cli_key_plan_refuses(&k, "attention=unfused");
}

TG_TEST(test_cli_fuse_bias_grad_key) {
    cli_key_run k;
    cli_key_open(&k);
    cli_key_refused(&k, "model = tiny-bert\nsteps = 1\nfuse_bias_grad = yes\ntrain_data = x\n",
                    "3: key 'fuse_bias_grad': 'yes' is not a boolean (true, false, 1, 0)");
    cli_key_good_job(&k, "model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n");
    if (!cli_key_inspect(&k, "fuse_bias_grad=false", "")) return;
    CHECK(file_has(k.out, " bias_grad ") && !file_has(k.out, "bias_grad=1"), "inspect of the unfused plan");
    if (!cli_key_inspect(&k, NULL, "")) return;
    CHECK(!file_has(k.out, " bias_grad ") && file_has(k.out, "bias_grad=1"), "inspect of the default plan");
    cli_key_plan_refuses(&k, "fuse_bias_grad=false");
}

TG_TEST(test_cli_fuse_residual_layernorm_key) {
    cli_key_run k;
    cli_key_open(&k);
    cli_key_good_job(&k, k_tiny_gpt2_lm);
    if (!cli_key_inspect(&k, "fuse_residual_layernorm=false", "")) return;
    CHECK(!file_has(k.out, "residual_layernorm") && file_has(k.out, " layernorm "), "inspect of the unfused plan");
    if (!cli_key_inspect(&k, NULL, "")) return;
    CHECK(file_has(k.out, " residual_layernorm ") && file_has(k.out, " residual_layernorm_bwd ") &&
              file_has(k.out, "key=") && file_has(k.out, "p=0.1"),
          "inspect of the default plan");
    cli_key_plan_refuses(&k, "fuse_residual_layernorm=false");
}

/* The `fuse_qkv` key through the CLI: a bad value names the file, line and key; inspect
 * shows the packed views and the members packed in them, or three separate projections;
 * a compiled plan refuses to change it. */
TG_TEST(test_cli_fuse_qkv_key) {
    cli_key_run k;
    cli_key_open(&k);
    cli_key_refused(&k, "model = tiny-bert\nsteps = 1\nfuse_qkv = packed\ntrain_data = x\n",
                    "3: key 'fuse_qkv': 'packed' is not a boolean (true, false, 1, 0)");
    cli_key_good_job(&k, "model = tiny-roberta\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n");
    if (!cli_key_inspect(&k, NULL, "")) return;
    CHECK(file_has(k.out, "roberta.encoder.layer.0.attention.self.qkv.weight[96,32]") &&
              file_has(k.out, "param,no_decay  packed in roberta.encoder.layer.1.attention.self.qkv.bias") &&
              file_has(k.out, "grad  packed in grad.roberta.encoder.layer.0.attention.self.qkv.weight"),
          "inspect of the packed plan");
    if (!cli_key_inspect(&k, NULL, "--json")) return;
    CHECK(file_has(k.out, "\"packed_in\": \"roberta.encoder.layer.0.attention.self.qkv.weight\""),
          "inspect --json of the packed plan");
    if (!cli_key_inspect(&k, "fuse_qkv=false", "")) return;
    CHECK(!file_has(k.out, "qkv") && !file_has(k.out, "packed in") &&
              file_has(k.out, "roberta.encoder.layer.0.attention.self.key[16,32]"),
          "inspect of the separate plan");
    cli_key_plan_refuses(&k, "fuse_qkv=true");
}

/* A model folder: tiny-bert's config and a safetensors file built by the caller. */
static const char *model_folder(const tg_st_item *items, int n) {
    const char *dir = tg_test_tmpdir();
    char src[600], dst[600], cmd[1400];
    snprintf(src, sizeof src, "%s/tiny-bert/config.json", tg_presets_dir());
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", src, dst);
    if (system(cmd) != 0) return NULL;
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    tg_err err;
    if (n && tg_st_write(dst, items, n, &err)) return NULL;
    return dir;
}

static int open_with_folder_qkv(const char *dir, int fuse_qkv, tg_plan *p, tg_trainer *tr, tg_err *err) {
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (tg_model_config_load(dir, &cfg, err)) return -1;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", dir);
    job.batch = 2, job.seq = 8, job.steps = 1, job.fuse_qkv = fuse_qkv;
    if (tg_compile_with_config(&job, &cfg, p, err)) return -1;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 1, .load_data = 0};
    int rc = tg_trainer_open(tr, p, &o, err);
    if (rc) tg_plan_free(p);
    return rc;
}

static int open_with_folder(const char *dir, tg_plan *p, tg_trainer *tr, tg_err *err) {
    return open_with_folder_qkv(dir, 1, p, tr, err);
}

TG_TEST(test_weights_bad_checkpoints) {
    static float data[100 * 32];
    int64_t wrong_vocab[2] = {100, 32};
    tg_st_item items[] = {{"bert.embeddings.word_embeddings.weight", TG_ST_F32, 2, wrong_vocab, data}};
    const char *dir = model_folder(items, 1);
    REQUIRE(dir, "cannot make the model folder");
    tg_plan p;
    tg_trainer tr;
    tg_err err;
    CHECK(open_with_folder(dir, &p, &tr, &err) != 0, "wrong vocabulary accepted");
    CHECK(strstr(err.msg, "model.safetensors") && strstr(err.msg, "[100, 32]") && strstr(err.msg, "[128, 32]") &&
              strstr(err.msg, "vocabulary"),
          "message: %s", err.msg);

    int64_t shape[1] = {4};
    tg_st_item other[] = {{"unrelated.tensor", TG_ST_F32, 1, shape, data}};
    dir = model_folder(other, 1);
    REQUIRE(dir, "cannot make the model folder");
    CHECK(open_with_folder(dir, &p, &tr, &err) != 0 && strstr(err.msg, "holds none"), "message: %s", err.msg);

    dir = model_folder(NULL, 0);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tg_test_write_file(path, "\x10\0\0\0\0\0\0\0{not json}      ");
    CHECK(open_with_folder(dir, &p, &tr, &err) != 0 && strstr(err.msg, path), "message: %s", err.msg);
}

TG_TEST(test_weights_save_load_round_trip) {
    /* Save a seeded model, load it back through a model folder, and compare. */
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nseed = 7\n", &p, &err,
                         NULL) == 0,
            "%s", err.msg);
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 1, .load_data = 0};
    REQUIRE(tg_trainer_open(&tr, &p, &o, &err) == 0, "%s", err.msg);
    const char *dir = model_folder(NULL, 0);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    REQUIRE(tg_trainer_save(&tr, path, &err) == 0, "%s", err.msg);
    tg_plan p2;
    tg_trainer tr2;
    REQUIRE(open_with_folder(dir, &p2, &tr2, &err) == 0, "%s", err.msg);
    CHECK(tr2.weights.loaded > 0 && tr2.weights.missing == 0, "loaded %d, missing %d", tr2.weights.loaded,
          tr2.weights.missing);
    REQUIRE(p.pool_bytes[TG_POOL_PARAMS] == p2.pool_bytes[TG_POOL_PARAMS], "layouts differ");
    float *a = malloc(p.pool_bytes[TG_POOL_PARAMS]), *b = malloc(p.pool_bytes[TG_POOL_PARAMS]);
    REQUIRE(tg_trainer_read(&tr, p.io.params_all, a, &err) == 0 && tg_trainer_read(&tr2, p2.io.params_all, b, &err) == 0,
            "%s", err.msg);
    CHECK(memcmp(a, b, p.pool_bytes[TG_POOL_PARAMS]) == 0, "parameters differ after save and load");
    /* The file holds the HF parameters by name (query, key and value apart, no packed
     * views), and loads into the plan with three separate projections as well. */
    tg_safetensors st;
    REQUIRE(tg_st_open(path, &st, &err) == 0, "%s", err.msg);
    int params = 0, named = 0;
    for (int t = 0; t < p.n_tensors; t++)
        params += (p.tensors[t].flags & TG_TENSOR_PARAM) && !(p.tensors[t].flags & TG_TENSOR_VIEW);
    for (int e = 0; e < st.n; e++) {
        int t = tg_test_tensor_named(&p, st.entries[e].name);
        named += t >= 0 && !(p.tensors[t].flags & TG_TENSOR_VIEW) && (p.tensors[t].flags & TG_TENSOR_PARAM);
    }
    CHECK(st.n == params && named == params && tg_st_find(&st, "bert.encoder.layer.1.attention.self.key.bias") &&
              tg_st_find(&st, "bert.encoder.layer.0.attention.self.value.weight"),
          "the checkpoint holds %d tensors, %d of them parameters, of %d", st.n, named, params);
    tg_st_close(&st);
    tg_plan p3;
    tg_trainer tr3;
    REQUIRE(open_with_folder_qkv(dir, 0, &p3, &tr3, &err) == 0, "%s", err.msg);
    float *c = malloc(p3.pool_bytes[TG_POOL_PARAMS]);
    REQUIRE(c && tg_trainer_read(&tr3, p3.io.params_all, c, &err) == 0, "%s", err.msg);
    int same = 0;
    for (int t = 0; t < p3.n_tensors; t++) {
        const tg_tensor *y = &p3.tensors[t];
        if (!(y->flags & TG_TENSOR_PARAM) || (y->flags & TG_TENSOR_VIEW)) continue;
        int k = tg_test_tensor_named(&p, y->name);
        same += k >= 0 && !memcmp((char *)a + p.tensors[k].offset, (char *)c + y->offset, y->bytes);
    }
    CHECK(same == params && tr3.weights.loaded == params, "%d of %d parameters load alike into separate projections",
          same, params);
    free(c);
    tg_trainer_close(&tr3);
    tg_plan_free(&p3);
    /* The random init differs from a different seed's, and padding row 0 is zero. */
    const tg_tensor *we = NULL;
    for (int t = 0; t < p.n_tensors; t++)
        if (strstr(p.tensors[t].name, "word_embeddings")) we = &p.tensors[t];
    REQUIRE(we, "no word embeddings");
    const float *row0 = a + we->offset / 4;
    double sum = 0, sq = 0;
    for (int i = 0; i < 32; i++) sum += fabs(row0[i]);
    for (int64_t i = 32; i < tg_tensor_numel(we); i++) sq += (double)row0[i] * row0[i];
    CHECK(sum == 0, "padding row not zero");
    double std = sqrt(sq / (double)(tg_tensor_numel(we) - 32));
    CHECK(fabs(std - 0.02) < 0.002, "init std %.4f, config initializer_range 0.02", std);
    free(a), free(b);
    tg_trainer_close(&tr), tg_trainer_close(&tr2);
    tg_plan_free(&p), tg_plan_free(&p2);
}

TG_TEST(test_compile_bf16_plan) {
    /* Both attention forms: fused (the default) and unfused. */
    for (int mode = 0; mode < TG_ATTENTION_MODE_COUNT; mode++) {
        char text[256];
        tg_plan p, f;
        tg_err err;
        snprintf(text, sizeof text,
                 "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 16\nprecision = bf16\nsteps = 1\ntrain_data = x\n"
                 "attention = %s\n",
                 tg_attention_mode_name(mode));
        REQUIRE(compile_text(text, &p, &err, NULL) == 0, "%s", err.msg);
        REQUIRE(compile_text("model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 16\nsteps = 1\ntrain_data = x\n", &f,
                             &err, NULL) == 0,
                "%s", err.msg);
        check_plan_memory(&p, "bf16 plan");
        CHECK(p.pool_bytes[TG_POOL_PARAMS_BF16] * 2 == p.pool_bytes[TG_POOL_PARAMS], "bf16 copies: %llu bytes",
              (unsigned long long)p.pool_bytes[TG_POOL_PARAMS_BF16]);
        CHECK(f.pool_bytes[TG_POOL_PARAMS_BF16] == 0 && f.io.params_bf16_all < 0, "fp32 plan has bf16 copies");
        CHECK(p.pool_bytes[TG_POOL_ACTIVATIONS] < f.pool_bytes[TG_POOL_ACTIVATIONS] * 3 / 4,
              "%s: activations %llu vs %llu", tg_attention_mode_name(mode),
              (unsigned long long)p.pool_bytes[TG_POOL_ACTIVATIONS],
              (unsigned long long)f.pool_bytes[TG_POOL_ACTIVATIONS]);
        int copies = 0, params = 0, attention_ops = 0, softmax_ops = 0;
        for (int t = 0; t < p.n_tensors; t++) {
            const tg_tensor *x = &p.tensors[t];
            params += (x->flags & TG_TENSOR_PARAM) != 0;
            if (x->flags & TG_TENSOR_PARAM) CHECK(x->dtype == TG_F32, "master %s is not fp32", x->name);
            if (x->flags & TG_TENSOR_GRAD) CHECK(x->dtype == TG_F32, "gradient %s is not fp32", x->name);
            if (x->flags & TG_TENSOR_PARAM_COPY) {
                copies++;
                CHECK(x->dtype == TG_BF16 && x->master >= 0 && p.tensors[x->master].offset == 2 * x->offset,
                      "copy %s: dtype %d, master %d", x->name, x->dtype, x->master);
            }
        }
        CHECK(copies == params && params > 10, "%d copies of %d parameters", copies, params);
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            const tg_tensor *t0 = op->out[0] >= 0 ? &p.tensors[op->out[0]] : NULL;
            switch (op->kind) {
            case TG_OP_MATMUL:
                for (int s = 0; s < 3; s++)
                    if (op->in[s] >= 0)
                        CHECK(p.tensors[op->in[s]].dtype == TG_BF16 && !(p.tensors[op->in[s]].flags & TG_TENSOR_PARAM),
                              "matmul %d reads %s", o, p.tensors[op->in[s]].name);
                if (t0->pool == TG_POOL_GRADS) CHECK(t0->dtype == TG_F32, "weight gradient %s not fp32", t0->name);
                break;
            case TG_OP_LAYERNORM:
                CHECK(t0->dtype == TG_BF16 && p.tensors[op->out[1]].dtype == TG_F32 &&
                          p.tensors[op->out[2]].dtype == TG_F32,
                      "layernorm %d: y bf16, statistics fp32", o);
                break;
            case TG_OP_ATTN_SOFTMAX:
                softmax_ops++;
                CHECK(p.tensors[op->in[0]].dtype == TG_F32 && t0->dtype == TG_BF16, "softmax %d: fp32 scores, bf16 probs",
                      o);
                break;
            case TG_OP_ATTENTION:
                attention_ops++;
                CHECK(p.tensors[op->in[0]].dtype == TG_BF16 && t0->dtype == TG_BF16 &&
                          p.tensors[op->out[1]].dtype == TG_F32 && op->out[2] >= 0 &&
                          p.tensors[op->out[2]].dtype == TG_I32,
                      "attention %d: bf16 qkv and O, fp32 LSE, int32 keep bits", o);
                break;
            case TG_OP_ATTENTION_BWD:
                CHECK(p.tensors[op->in[0]].dtype == TG_BF16 && t0->dtype == TG_BF16 &&
                          p.tensors[op->in[2]].dtype == TG_F32 && p.tensors[op->out[3]].dtype == TG_F32 &&
                          op->in[4] >= 0 && p.tensors[op->in[4]].dtype == TG_I32,
                      "attention_bwd %d: bf16 dO and dqkv, fp32 LSE and delta, int32 keep bits", o);
                break;
            case TG_OP_CROSS_ENTROPY:
                CHECK(p.tensors[op->in[0]].dtype == TG_BF16 && t0->dtype == TG_F32, "loss fp32 from bf16 logits");
                break;
            case TG_OP_ADAMW:
                CHECK(op->out[3] == p.io.params_bf16_all, "adamw refreshes the bf16 copies");
                break;
            default:
                break;
            }
        }
        int fused = mode == TG_ATTENTION_FUSED;
        CHECK(attention_ops == (fused ? p.model.layers : 0) && softmax_ops == (fused ? 0 : p.model.layers),
              "attention = %s: %d attention ops, %d softmax ops", tg_attention_mode_name(mode), attention_ops,
              softmax_ops);
        tg_plan_free(&p), tg_plan_free(&f);
    }
}

/* In the unfused attention (`attention = unfused`), attention dropout is fused into
 * ATTN_SOFTMAX (out1) and ATTN_SOFTMAX_BWD (mask applied to the incoming gradient): no
 * DROPOUT op touches the [B,H,T,T] probabilities or their gradients, which saves two ops
 * per layer, and the stream keys keep their order. */
TG_TEST(test_compile_attention_dropout_fused) {
    tg_model_config cfg;
    tg_err err;
    memset(&cfg, 0, sizeof cfg);
    REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
    REQUIRE(cfg.attention_dropout > 0 && cfg.hidden_dropout > 0, "tiny-bert should have dropout on");
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "tiny-bert");
    job.task = TG_TASK_CLASSIFY, job.num_labels = 2, job.batch = 2, job.seq = 8, job.steps = 1;
    job.attention = TG_ATTENTION_UNFUSED;
    for (int prec = 0; prec < 2; prec++) {
        job.precision = prec ? TG_PREC_BF16 : TG_PREC_FP32;
        tg_plan p, q;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        tg_model_config no_attn = cfg;
        no_attn.attention_dropout = 0.0f;
        REQUIRE(tg_compile_with_config(&job, &no_attn, &q, &err) == 0, "%s", err.msg);
        check_plan_memory(&p, "attention dropout");
        const int L = p.model.layers;
        CHECK(L >= 2, "layers %d", L);
        /* Tensors that are attention probabilities (or the dropped ones) or their gradients. */
        char *attn = calloc((size_t)p.n_tensors, 1);
        REQUIRE(attn, "out of memory");
        int fused = 0, fused_bwd = 0, next_key = 0, keys_in_order = 1;
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind == TG_OP_ATTN_SOFTMAX) {
                attn[op->out[0]] = 1;
                if (op->out[1] >= 0) {
                    attn[op->out[1]] = 1;
                    fused++;
                    CHECK(op->in[2] == p.io.step && op->p.softmax.p == cfg.attention_dropout, "softmax %d: step %d, p %g",
                          o, op->in[2], op->p.softmax.p);
                    CHECK(p.tensors[op->in[0]].dtype == TG_F32 && p.tensors[op->out[0]].dtype == p.tensors[op->out[1]].dtype &&
                              p.tensors[op->out[1]].dtype == (prec ? TG_BF16 : TG_F32),
                          "softmax %d: scores fp32, probs and dropped probs in the activation type", o);
                    /* The PV product reads the dropped probabilities, nothing reads them otherwise. */
                    int readers = 0;
                    for (int k = 0; k < p.phase_begin[TG_PHASE_BACKWARD]; k++)
                        for (int s = 0; s < TG_OP_MAX_IN; s++)
                            if (p.ops[k].in[s] == op->out[1]) readers += p.ops[k].kind == TG_OP_MATMUL ? 1 : 100;
                    CHECK(readers == 1, "softmax %d: dropped probs read by %d forward ops", o, readers);
                }
            }
            if (op->kind == TG_OP_ATTN_SOFTMAX_BWD) {
                attn[op->in[0]] = attn[op->out[0]] = 1;
                if (op->in[2] >= 0) {
                    fused_bwd++;
                    CHECK(op->in[2] == p.io.step && op->p.softmax_bwd.p == cfg.attention_dropout, "softmax bwd %d: step, p",
                          o);
                }
            }
            /* Forward stream keys: one per dropout, in construction order, as before. */
            if (o < p.phase_begin[TG_PHASE_BACKWARD]) {
                if (op->kind == TG_OP_DROPOUT) keys_in_order &= op->p.dropout.key == next_key++;
                if (op->kind == TG_OP_ATTN_SOFTMAX && op->out[1] >= 0) keys_in_order &= op->p.softmax.key == next_key++;
                if (op->kind == TG_OP_RESIDUAL_LAYERNORM && op->p.residual_layernorm.p > 0)
                    keys_in_order &= op->p.residual_layernorm.key == next_key++;
            }
        }
        CHECK(keys_in_order, "dropout stream keys are not 0, 1, 2, ... in forward order");
        CHECK(fused == L && fused_bwd == L, "%d fused softmax ops, %d fused backward ops, %d layers", fused, fused_bwd, L);
        /* The backward's softmax keys match the forward's. */
        for (int o = p.phase_begin[TG_PHASE_BACKWARD]; o < p.phase_begin[TG_PHASE_OPTIMIZER]; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind != TG_OP_ATTN_SOFTMAX_BWD) continue;
            int found = 0;
            for (int k = 0; k < p.phase_begin[TG_PHASE_BACKWARD]; k++)
                found |= p.ops[k].kind == TG_OP_ATTN_SOFTMAX && p.ops[k].out[0] == op->in[1] &&
                         p.ops[k].p.softmax.key == op->p.softmax_bwd.key;
            CHECK(found, "softmax bwd %d: key %lld is not its forward's", o, (long long)op->p.softmax_bwd.key);
        }
        int bad = 0, drops_p = 0, drops_q = 0;
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind != TG_OP_DROPOUT) continue;
            drops_p++;
            bad += attn[op->in[0]] || attn[op->out[0]];
        }
        for (int o = 0; o < q.n_ops; o++) drops_q += q.ops[o].kind == TG_OP_DROPOUT;
        CHECK(!bad, "%d DROPOUT ops read or write attention probabilities", bad);
        CHECK(drops_p == drops_q && drops_p > 0, "DROPOUT ops: %d with attention dropout, %d without", drops_p, drops_q);
        /* Unfused, attention dropout cost one DROPOUT op per layer forward and one backward
         * over the plan without it; fused, it costs no op: 2 per layer fewer. */
        int unfused = q.n_ops + 2 * L;
        CHECK(p.n_ops == q.n_ops && p.n_ops == unfused - 2 * L, "%d ops; %d without attention dropout, unfused %d",
              p.n_ops, q.n_ops, unfused);
        /* FLOPs: the fused ops count the dropout multiply the DROPOUT ops counted. */
        double bhtt = (double)job.batch * cfg.heads * job.seq * job.seq;
        CHECK(fabs(p.flops_per_step - (q.flops_per_step + 2.0 * L * bhtt)) < 1e-6 * p.flops_per_step,
              "flops %.6g vs %.6g + 2 * L * B*H*T*T", p.flops_per_step, q.flops_per_step);
        free(attn);
        tg_plan_free(&p), tg_plan_free(&q);
    }
}

/* Counts of each op kind in a plan (forward and backward together). */
static void count_kinds(const tg_plan *p, int *counts) {
    memset(counts, 0, sizeof(int) * TG_OP_COUNT);
    for (int o = 0; o < p->n_ops; o++) counts[p->ops[o].kind]++;
}

/* Forward dropout stream keys in op order: DROPOUT's key, the attention's when it applies
 * dropout (fused ATTENTION, or the softmax's dropped probabilities), and the residual
 * LayerNorm's when it does. */
static int forward_keys(const tg_plan *p, int64_t *keys, int max) {
    int n = 0;
    for (int o = 0; o < p->phase_begin[TG_PHASE_BACKWARD] && n < max; o++) {
        const tg_op *op = &p->ops[o];
        if (op->kind == TG_OP_DROPOUT) keys[n++] = op->p.dropout.key;
        if (op->kind == TG_OP_ATTENTION && op->p.attention.p > 0) keys[n++] = op->p.attention.key;
        if (op->kind == TG_OP_ATTN_SOFTMAX && op->out[1] >= 0) keys[n++] = op->p.softmax.key;
        if (op->kind == TG_OP_RESIDUAL_LAYERNORM && op->p.residual_layernorm.p > 0) keys[n++] = op->p.residual_layernorm.key;
    }
    return n;
}

/* Index of the op that writes tensor t in the forward phase, or -1. */
static int producer(const tg_plan *p, int t) {
    for (int o = 0; o < p->phase_begin[TG_PHASE_BACKWARD]; o++)
        for (int s = 0; s < TG_OP_MAX_OUT; s++)
            if (p->ops[o].out[s] == t) return o;
    return -1;
}

/* Fused attention (the default): one ATTENTION per layer reading the projections directly
 * (BERT's query/key/value, GPT-2's packed c_attn), one ATTENTION_BWD per layer, no heads
 * ops or [B,H,T,T] tensors, the dropout keys of the unfused plan, and the FLOPs of the
 * useful work. */
TG_TEST(test_compile_attention_fused) {
    static const struct {
        const char *preset;
        int task, packed, causal;
    } cases[] = {{"tiny-bert", TG_TASK_CLASSIFY, 1, 0},
                 {"tiny-roberta", TG_TASK_CLASSIFY, 1, 0},
                 {"tiny-bert", TG_TASK_CLASSIFY, 0, 0}, /* fuse_qkv = false: three projections */
                 {"tiny-gpt2", TG_TASK_LM, 1, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tg_model_config cfg;
        tg_err err;
        memset(&cfg, 0, sizeof cfg);
        REQUIRE(tg_model_config_load(cases[i].preset, &cfg, &err) == 0, "%s", err.msg);
        REQUIRE(cfg.attention_dropout > 0, "%s should have attention dropout", cases[i].preset);
        tg_job job;
        tg_job_defaults(&job);
        snprintf(job.model, sizeof job.model, "%s", cases[i].preset);
        job.task = cases[i].task, job.batch = 3, job.seq = 7, job.steps = 1, job.fuse_qkv = cases[i].packed;
        CHECK(job.attention == TG_ATTENTION_FUSED, "fused attention is not the default");
        tg_plan p, q;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        job.attention = TG_ATTENTION_UNFUSED;
        REQUIRE(tg_compile_with_config(&job, &cfg, &q, &err) == 0, "%s", err.msg);
        check_plan_memory(&p, cases[i].preset);
        const char *name = cases[i].preset;
        int L = cfg.layers, H = cfg.heads, Dh = cfg.hidden / cfg.heads, T = job.seq, B = job.batch;
        int kp[TG_OP_COUNT], kq[TG_OP_COUNT];
        count_kinds(&p, kp);
        count_kinds(&q, kq);
        CHECK(kp[TG_OP_ATTENTION] == L && kp[TG_OP_ATTENTION_BWD] == L, "%s: %d attention, %d attention_bwd ops", name,
              kp[TG_OP_ATTENTION], kp[TG_OP_ATTENTION_BWD]);
        CHECK(!kp[TG_OP_ATTN_SOFTMAX] && !kp[TG_OP_ATTN_SOFTMAX_BWD] && !kp[TG_OP_HEADS_SPLIT] && !kp[TG_OP_HEADS_MERGE],
              "%s: the fused plan still has softmax or heads ops", name);
        CHECK(!kq[TG_OP_ATTENTION] && !kq[TG_OP_ATTENTION_BWD] && kq[TG_OP_ATTN_SOFTMAX] == L,
              "%s: the unfused plan has %d attention ops, %d softmax ops", name, kq[TG_OP_ATTENTION],
              kq[TG_OP_ATTN_SOFTMAX]);
        /* Per layer the unfused forward has 5 more ops (split(s), QK^T, softmax, PV, merge
         * instead of one; BERT splits q, k and v separately) and its backward has more again. */
        CHECK(p.n_ops < q.n_ops, "%s: fused %d ops, unfused %d", name, p.n_ops, q.n_ops);
        for (int t = 0; t < p.n_tensors; t++)
            if (p.tensors[t].pool == TG_POOL_ACTIVATIONS)
                CHECK(tg_tensor_numel(&p.tensors[t]) != (int64_t)B * H * T * T, "%s: %s has B*H*T*T elements", name,
                      p.tensors[t].name);

        int64_t keys_p[64], keys_q[64];
        int nk_p = forward_keys(&p, keys_p, 64), nk_q = forward_keys(&q, keys_q, 64);
        CHECK(nk_p == nk_q && nk_p > L && !memcmp(keys_p, keys_q, sizeof(int64_t) * (size_t)nk_p),
              "%s: dropout keys differ between fused and unfused plans", name);

        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind == TG_OP_ATTENTION) {
                const tg_attention_params *at = &op->p.attention;
                CHECK(at->b == B && at->h == H && at->t == T && at->causal == cases[i].causal &&
                          at->packed == cases[i].packed && at->head_dim == Dh && at->scale == 1.0f / sqrtf((float)Dh) &&
                          at->p == cfg.attention_dropout,
                      "%s: attention %d parameters", name, o);
                CHECK(op->in[3] == p.io.attention_mask && op->in[4] == p.io.step, "%s: attention %d mask %d step %d",
                      name, o, op->in[3], op->in[4]);
                /* q, k, v (or qkv) come straight from the projections' matmuls. */
                for (int s = 0; s < 3; s++) {
                    if (cases[i].packed && s > 0) {
                        CHECK(op->in[s] == -1, "%s: packed attention %d reads input %d", name, o, s);
                        continue;
                    }
                    int pr = producer(&p, op->in[s]);
                    const tg_tensor *x = &p.tensors[op->in[s]];
                    CHECK(pr >= 0 && p.ops[pr].kind == TG_OP_MATMUL &&
                              x->shape[1] == (cases[i].packed ? 3 : 1) * cfg.hidden,
                          "%s: attention %d input %d (%s) is not a projection output", name, o, s, x->name);
                }
                static const char *const proj[3] = {".query", ".key", ".value"};
                if (!cases[i].packed)
                    for (int s = 0; s < 3; s++)
                        CHECK(strstr(p.tensors[op->in[s]].name, proj[s]) != NULL, "%s: attention %d input %d is %s",
                              name, o, s, p.tensors[op->in[s]].name);
                else
                    CHECK(strstr(p.tensors[op->in[0]].name, cfg.arch == TG_ARCH_GPT2 ? "c_attn" : "self.qkv") != NULL,
                          "%s: attention %d reads %s", name, o, p.tensors[op->in[0]].name);
                CHECK(p.tensors[op->out[1]].dtype == TG_F32 && tg_tensor_numel(&p.tensors[op->out[1]]) == B * H * T,
                      "%s: LSE [B,H,T] fp32", name);
                /* With dropout, the keep bits: int32 [B,H,T,ceil(T/32)] activations. */
                const tg_tensor *bits = op->out[2] >= 0 ? &p.tensors[op->out[2]] : NULL;
                int64_t want_shape[4] = {B, H, T, (T + 31) / 32};
                CHECK(bits && bits->dtype == TG_I32 && bits->pool == TG_POOL_ACTIVATIONS && bits->ndim == 4 &&
                          !memcmp(bits->shape, want_shape, sizeof want_shape),
                      "%s: attention %d keep bits", name, o);
            }
            if (op->kind == TG_OP_ATTENTION_BWD) {
                /* Its forward: the ATTENTION whose O and LSE it reads, with the same parameters. */
                int found = 0;
                for (int k = 0; k < p.phase_begin[TG_PHASE_BACKWARD]; k++) {
                    const tg_op *f = &p.ops[k];
                    if (f->kind != TG_OP_ATTENTION || f->out[0] != op->in[1]) continue;
                    /* The backward reads the forward's keep bits where the forward reads the step. */
                    found = f->out[1] == op->in[2] && f->in[3] == op->in[3] && f->out[2] == op->in[4] &&
                            op->in[4] >= 0 && !memcmp(&f->p.attention, &op->p.attention, sizeof f->p.attention);
                    for (int s = 0; s < 3; s++) found &= f->in[s] == op->in[5 + s];
                }
                CHECK(found, "%s: attention_bwd %d does not match its forward", name, o);
                for (int s = 0; s < 3; s++) {
                    int want = !cases[i].packed || s == 0;
                    CHECK((op->out[s] >= 0) == want, "%s: attention_bwd %d output %d", name, o, s);
                }
                CHECK(op->out[3] >= 0 && tg_tensor_numel(&p.tensors[op->out[3]]) == B * H * T,
                      "%s: attention_bwd %d delta", name, o);
            }
        }
        /* FLOPs: the fused ops count 4*B*H*T*T*Dh forward (halved when causal) and twice that
         * backward; the unfused QK^T and PV matmuls count the full square, and the softmax
         * ops count 6 per score forward and backward (5, plus the dropout multiply). */
        double bhtt = (double)B * H * T * T, fwd = 4.0 * bhtt * Dh * (cases[i].causal ? 0.5 : 1.0);
        double unfused_attn = 3 * 4.0 * bhtt * Dh + 2 * 6.0 * bhtt;
        double want = q.flops_per_step - L * (unfused_attn - 3 * fwd);
        CHECK(fabs(p.flops_per_step - want) <= 1e-9 * want, "%s: flops %.9g, expected %.9g", name, p.flops_per_step,
              want);
        tg_plan_free(&p), tg_plan_free(&q);
    }
}

/* Heads wider than 128 (the CUDA kernel's limit) get the unfused attention even when the
 * job asks for the fused one; 128 itself is fused. */
TG_TEST(test_compile_attention_head_dim_limit) {
    tg_model_config cfg;
    tg_err err;
    memset(&cfg, 0, sizeof cfg);
    REQUIRE(tg_model_config_load("tiny-bert", &cfg, &err) == 0, "%s", err.msg);
    cfg.hidden = 256;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "tiny-bert");
    job.batch = 2, job.seq = 8, job.steps = 1;
    const struct {
        int heads, fused;
    } cases[] = {{2, 1}, {1, 0}};
    for (size_t i = 0; i < 2; i++) {
        cfg.heads = cases[i].heads;
        tg_plan p;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        int k[TG_OP_COUNT];
        count_kinds(&p, k);
        CHECK(tg_fused_attention(&job, &cfg) == cases[i].fused, "Dh %d: fusion rule", 256 / cases[i].heads);
        CHECK(k[TG_OP_ATTENTION] == (cases[i].fused ? cfg.layers : 0) &&
                  k[TG_OP_ATTN_SOFTMAX] == (cases[i].fused ? 0 : cfg.layers),
              "Dh %d: %d attention ops, %d softmax ops", 256 / cases[i].heads, k[TG_OP_ATTENTION],
              k[TG_OP_ATTN_SOFTMAX]);
        check_plan_memory(&p, "head dim limit");
        /* inspect says what the plan runs, and that the job asked for something else. */
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        REQUIRE(f, "open_memstream");
        CHECK(tg_plan_inspect(&p, f, 0, &err) == 0, "%s", err.msg);
        fclose(f);
        const char *want = cases[i].fused ? "attention: fused\n" : "attention: unfused (job asks fused)\n";
        CHECK(buf && strstr(buf, want), "inspect lacks '%s'", want);
        free(buf);
        tg_plan_free(&p);
    }
}

/* The kinds with a backward rule are exactly those the models' forward passes use: each
 * kind in a forward phase of the preset plans (BERT, RoBERTa, GPT-2 and Llama; LM, masked LM,
 * classification and question answering; MobileNetV2 on images; fused attention with every fusion on, unfused
 * attention with every fusion off) has one, but the masking op, and every other kind
 * (backward, optimizer, collective and filling ops, and ops no model emits) has none.
 * Derived from the plans, so a new op needs no edit
 * here (names, rows and CPU kernels: tests/test_op_meta.c). */
TG_TEST(test_compile_backward_rules) {
    static const char *const models[] = {
        "model = tiny-bert\n",
        "model = tiny-roberta\n",
        "model = tiny-gpt2\ntask = lm\n",
        "model = tiny-gpt2\npad_token_id = 0\n",
        "model = tiny-bert\ntask = mlm\n",
        "model = tiny-roberta\ntask = mlm\n",
        "model = tiny-bert\ntask = qa\n",
        "model = tiny-llama\ntask = lm\n",
        "model = tiny-llama\npad_token_id = 0\n",
        "model = mobilenet_v2\nnum_labels = 3\nimage_size = 32\nwidth_mult = 0.25\n",
        "model = mobilenet_v2\nnum_labels = 3\nimage_size = 32\nwidth_mult = 0.25\nfuse_bn_relu6 = false\n",
    };
    static const char *const forms[] = {
        "",
        "attention = unfused\nfuse_bias_grad = false\nfuse_gelu = false\nfuse_residual_layernorm = false\n"
        "fuse_qkv = false\n",
    };
    int forward[TG_OP_COUNT] = {0}, later[TG_OP_COUNT] = {0}, plans = 0;
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++)
        for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
            char text[512];
            /* An image model takes no seq. */
            snprintf(text, sizeof text, "%s%sbatch = 2\n%ssteps = 1\ntrain_data = x\n", models[m], forms[f],
                     strstr(models[m], "mobilenet") ? "" : "seq = 16\n");
            tg_plan p;
            tg_err err;
            if (!CHECK(compile_text(text, &p, &err, NULL) == 0, "%s: %s", text, err.msg)) continue;
            plans++;
            for (int o = 0; o < p.n_ops; o++) {
                const int k = p.ops[o].kind;
                if (k >= 0 && k < TG_OP_COUNT) (p.ops[o].phase == TG_PHASE_FORWARD ? forward : later)[k] = 1;
            }
            tg_plan_free(&p);
        }
    REQUIRE(plans == 22, "%d of 22 plans compiled", plans);
    int differentiated = 0;
    for (int k = 0; k < TG_OP_COUNT; k++) {
        const int rule = tg_backward_rule_of(k) != NULL;
        /* MLM_MASK makes ids and labels (integers) from ids, IMAGE_INPUT the input from the
         * stored bytes: nothing to differentiate, though they run in the forward phase. */
        if (k == TG_OP_MLM_MASK || k == TG_OP_IMAGE_INPUT) {
            CHECK(!rule && forward[k], "%s: %s a backward rule, %s in a forward phase", tg_op_name(k),
                  rule ? "has" : "lacks", forward[k] ? "is" : "is not");
            continue;
        }
        differentiated += forward[k];
        CHECK(rule == forward[k], "op kind %d (%s): %s a backward rule, %s", k, tg_op_name(k),
              rule ? "has" : "lacks",
              forward[k]  ? "and is in a forward phase"
              : later[k] ? "and is only in backward or optimizer phases"
                         : "and is in no preset plan");
    }
    /* The plans cover every rule's kind above; here, that they cover the differentiable
     * families at all (a projection, a normalisation, an attention, a loss). */
    CHECK(forward[TG_OP_MATMUL] && forward[TG_OP_LAYERNORM] && forward[TG_OP_ATTENTION] &&
              forward[TG_OP_ATTN_SOFTMAX] && forward[TG_OP_CROSS_ENTROPY] && differentiated > 10,
          "%d kinds in forward phases", differentiated);
}

TG_TEST(test_compile_lm_head_padded) {
    tg_plan p;
    tg_err err;
    REQUIRE(compile_text("model = gpt2\ntask = lm\nbatch = 2\nseq = 64\nprecision = bf16\nsteps = 1\ntrain_data = x\n", &p,
                         &err, NULL) == 0,
            "%s", err.msg);
    check_plan_memory(&p, "gpt2 lm");
    const tg_tensor *logits = &p.tensors[p.io.logits];
    CHECK(logits->shape[1] == 50304, "logits rows of %lld, want 50257 rounded up to 50304", (long long)logits->shape[1]);
    int views = 0, head_ok = 0;
    for (int t = 0; t < p.n_tensors; t++) {
        const tg_tensor *x = &p.tensors[t];
        if ((x->flags & TG_TENSOR_PARAM) && (x->flags & TG_TENSOR_VIEW)) {
            views++;
            const tg_tensor *m = &p.tensors[x->master];
            CHECK(!strcmp(m->name, "transformer.wte.weight") && x->offset == m->offset && x->shape[0] == 50304,
                  "padded view %s of %s", x->name, m->name);
            /* The padding rows lie in space no other parameter uses. */
            for (int u = 0; u < p.n_tensors; u++) {
                const tg_tensor *y = &p.tensors[u];
                if (u != x->master && y->pool == TG_POOL_PARAMS && !(y->flags & TG_TENSOR_VIEW))
                    CHECK(y->offset >= x->offset + x->bytes || y->offset + y->bytes <= x->offset, "%s overlaps the padding",
                          y->name);
            }
        }
    }
    for (int o = 0; o < p.n_ops; o++)
        if (p.ops[o].kind == TG_OP_CROSS_ENTROPY)
            head_ok = p.ops[o].p.cross_entropy.c == 50304 && p.ops[o].p.cross_entropy.classes == 50257;
    CHECK(views == 1 && head_ok, "%d padded views; loss over 50257 of 50304 columns: %d", views, head_ok);
    tg_plan_free(&p);
}

/* Bias gradients fused into the weight-gradient matmuls (the default): no BIAS_GRAD op;
 * each linear's dW matmul writes its bias gradient, summing dC as A (bias_grad = 1, BERT's
 * nn.Linear) or as B (bias_grad = 2, GPT-2's Conv1D); `fuse_bias_grad = false` keeps one
 * BIAS_GRAD per biased linear reading the same dC. Same FLOPs, one op fewer per bias. */
TG_TEST(test_compile_fused_bias_grad) {
    static const struct {
        const char *preset;
        int task, precision, biases, want_bias_grad;
    } cases[] = {{"bert-base-uncased", TG_TASK_CLASSIFY, TG_PREC_FP32, 12 * 4 + 2, 1}, /* one packed q|k|v bias */
                 {"gpt2", TG_TASK_LM, TG_PREC_FP32, 12 * 4, 2},
                 {"bert-base-uncased", TG_TASK_CLASSIFY, TG_PREC_BF16, 12 * 4 + 2, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_model_config cfg;
        tg_err err;
        memset(&cfg, 0, sizeof cfg);
        REQUIRE(tg_model_config_load(cases[c].preset, &cfg, &err) == 0, "%s", err.msg);
        tg_job job;
        tg_job_defaults(&job);
        CHECK(job.fuse_bias_grad == 1, "fuse_bias_grad is not on by default");
        snprintf(job.model, sizeof job.model, "%s", cases[c].preset);
        job.task = cases[c].task, job.precision = cases[c].precision, job.batch = 2, job.seq = 16, job.steps = 1;
        tg_plan p, q;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        job.fuse_bias_grad = 0;
        REQUIRE(tg_compile_with_config(&job, &cfg, &q, &err) == 0, "%s", err.msg);
        const char *name = cases[c].preset;
        check_plan_memory(&p, name);
        int kp[TG_OP_COUNT], kq[TG_OP_COUNT];
        count_kinds(&p, kp);
        count_kinds(&q, kq);
        CHECK(kp[TG_OP_BIAS_GRAD] == 0 && kq[TG_OP_BIAS_GRAD] == cases[c].biases,
              "%s: %d bias_grad ops fused, %d unfused (want 0, %d)", name, kp[TG_OP_BIAS_GRAD], kq[TG_OP_BIAS_GRAD],
              cases[c].biases);
        CHECK(p.n_ops == q.n_ops - cases[c].biases, "%s: %d ops fused, %d unfused", name, p.n_ops, q.n_ops);
        CHECK(fabs(p.flops_per_step - q.flops_per_step) <= 1e-12 * q.flops_per_step, "%s: flops %.9g vs %.9g", name,
              p.flops_per_step, q.flops_per_step);
        int fused = 0, in_gelu = 0;
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind == TG_OP_GELU_BWD && op->out[1] >= 0) {
                /* Summed by the GELU backward that makes dC: the unfused plan's BIAS_GRAD of
                 * that bias reads the GELU backward's output. */
                const tg_tensor *db = &p.tensors[op->out[1]];
                int match = 0;
                for (int k = 0; k < q.n_ops; k++)
                    if (q.ops[k].kind == TG_OP_BIAS_GRAD && !strcmp(q.tensors[q.ops[k].out[0]].name, db->name))
                        match = !strcmp(q.tensors[q.ops[k].in[0]].name, p.tensors[op->out[0]].name) &&
                                q.ops[k].p.bias_grad.n == op->p.gelu_bwd.bias_cols &&
                                q.ops[k].p.bias_grad.m * q.ops[k].p.bias_grad.n == op->p.gelu_bwd.n;
                CHECK((db->flags & TG_TENSOR_GRAD) && db->dtype == TG_F32 && match,
                      "%s: gelu_bwd %d writes %s, not what bias_grad of it sums", name, o, db->name);
                fused++, in_gelu++;
                continue;
            }
            if (op->kind != TG_OP_MATMUL || !op->p.matmul.bias_grad) {
                CHECK(op->kind != TG_OP_MATMUL || op->out[1] < 0, "%s: matmul %d has out1 without bias_grad", name, o);
                continue;
            }
            fused++;
            const tg_matmul_params *mm = &op->p.matmul;
            CHECK(op->phase == TG_PHASE_BACKWARD && mm->bias_grad == cases[c].want_bias_grad && mm->batch == 1 &&
                      op->in[2] < 0,
                  "%s: matmul %d: phase %d bias_grad=%lld batch %lld", name, o, op->phase, (long long)mm->bias_grad,
                  (long long)mm->batch);
            const tg_tensor *db = &p.tensors[op->out[1]];
            CHECK((db->flags & TG_TENSOR_GRAD) && db->dtype == TG_F32, "%s: matmul %d writes %s", name, o, db->name);
            /* Its forward: the matmul with that bias; out0 is that matmul's weight gradient. */
            int f = -1;
            for (int k = 0; k < p.phase_begin[TG_PHASE_BACKWARD]; k++)
                if (p.ops[k].kind == TG_OP_MATMUL && p.ops[k].in[2] >= 0) {
                    int bias = p.ops[k].in[2];
                    if (p.tensors[bias].flags & TG_TENSOR_PARAM_COPY) bias = p.tensors[bias].master;
                    if (p.tensors[bias].grad == op->out[1]) f = k;
                }
            REQUIRE(f >= 0, "%s: no forward matmul has the bias of %s", name, db->name);
            int w = p.ops[f].in[1];
            if (p.tensors[w].flags & TG_TENSOR_PARAM_COPY) w = p.tensors[w].master;
            CHECK(op->out[0] == p.tensors[w].grad && p.ops[f].p.matmul.trans_b == (mm->bias_grad == 1),
                  "%s: matmul %d is not the weight gradient of forward matmul %d", name, o, f);
            /* The unfused plan's BIAS_GRAD of that bias reads the tensor this one sums. */
            int summed = op->in[mm->bias_grad == 1 ? 0 : 1], match = 0;
            for (int k = 0; k < q.n_ops; k++)
                if (q.ops[k].kind == TG_OP_BIAS_GRAD && !strcmp(q.tensors[q.ops[k].out[0]].name, db->name))
                    match = !strcmp(q.tensors[q.ops[k].in[0]].name, p.tensors[summed].name) &&
                            q.ops[k].p.bias_grad.n == tg_tensor_numel(db);
            CHECK(match, "%s: matmul %d sums %s, not what bias_grad of %s sums", name, o, p.tensors[summed].name,
                  db->name);
        }
        CHECK(fused == cases[c].biases, "%s: %d fused bias gradients, want %d", name, fused, cases[c].biases);
        /* BERT's erf GELU is a separate op: its backward sums the first FFN bias. */
        CHECK(in_gelu == (cases[c].preset[0] == 'b' ? 12 : 0), "%s: %d bias gradients in the GELU backward", name,
              in_gelu);
        tg_plan_free(&p), tg_plan_free(&q);
    }
}

/* The MLP's tanh GELU inside its matmuls (fuse_gelu, the default): per layer, the c_fc
 * matmul writes the activation and keeps the pre-activation (activation 1, out2), and the
 * c_proj dA matmul writes the pre-activation's gradient as product * gelu'(pre) (activation 2,
 * in3 = that out2), which the c_fc weight-gradient matmul then reads; no GELU or GELU_BWD
 * op, the same FLOPs, fewer bytes, smaller peak. fuse_gelu = false keeps the separate ops.
 * BERT's exact erf GELU is never fused: its plan is the same either way. */
TG_TEST(test_compile_fused_gelu) {
    static const struct {
        const char *preset;
        int task, precision, fused;
    } cases[] = {{"gpt2", TG_TASK_LM, TG_PREC_FP32, 1},
                 {"gpt2", TG_TASK_CLASSIFY, TG_PREC_BF16, 1},
                 {"bert-base-uncased", TG_TASK_CLASSIFY, TG_PREC_FP32, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_model_config cfg;
        tg_err err;
        memset(&cfg, 0, sizeof cfg);
        REQUIRE(tg_model_config_load(cases[c].preset, &cfg, &err) == 0, "%s", err.msg);
        tg_job job;
        tg_job_defaults(&job);
        CHECK(job.fuse_gelu == 1, "fuse_gelu is not on by default");
        snprintf(job.model, sizeof job.model, "%s", cases[c].preset);
        job.task = cases[c].task, job.precision = cases[c].precision, job.batch = 2, job.seq = 16, job.steps = 1;
        job.pad_token_id = cfg.pad_token_id >= 0 ? -1 : 0;
        tg_plan p, q;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        job.fuse_gelu = 0;
        REQUIRE(tg_compile_with_config(&job, &cfg, &q, &err) == 0, "%s", err.msg);
        const char *name = cases[c].preset;
        check_plan_memory(&p, name);
        int kp[TG_OP_COUNT], kq[TG_OP_COUNT];
        count_kinds(&p, kp);
        count_kinds(&q, kq);
        if (!cases[c].fused) {
            CHECK(p.n_ops == q.n_ops && p.n_tensors == q.n_tensors &&
                      memcmp(p.ops, q.ops, sizeof *p.ops * (size_t)p.n_ops) == 0 &&
                      memcmp(p.tensors, q.tensors, sizeof *p.tensors * (size_t)p.n_tensors) == 0,
                  "%s: fuse_gelu changed a plan whose GELU is the erf form", name);
            CHECK(kp[TG_OP_GELU] == cfg.layers, "%s: %d gelu ops", name, kp[TG_OP_GELU]);
            tg_plan_free(&p), tg_plan_free(&q);
            continue;
        }
        CHECK(kp[TG_OP_GELU] == 0 && kp[TG_OP_GELU_BWD] == 0 && kq[TG_OP_GELU] == cfg.layers &&
                  kq[TG_OP_GELU_BWD] == cfg.layers,
              "%s: gelu ops fused %d/%d, separate %d/%d", name, kp[TG_OP_GELU], kp[TG_OP_GELU_BWD], kq[TG_OP_GELU],
              kq[TG_OP_GELU_BWD]);
        CHECK(p.n_ops == q.n_ops - 2 * cfg.layers, "%s: %d ops fused, %d separate", name, p.n_ops, q.n_ops);
        CHECK(fabs(p.flops_per_step - q.flops_per_step) <= 1e-12 * q.flops_per_step, "%s: flops %.9g vs %.9g", name,
              p.flops_per_step, q.flops_per_step);
        CHECK(p.bytes_per_step < q.bytes_per_step && p.activation_live_peak <= q.activation_live_peak,
              "%s: bytes per step %.6g vs %.6g, live peak %llu vs %llu", name, p.bytes_per_step, q.bytes_per_step,
              (unsigned long long)p.activation_live_peak, (unsigned long long)q.activation_live_peak);
        int pairs = 0;
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind != TG_OP_MATMUL || op->p.matmul.activation != TG_MATMUL_ACT_GELU) continue;
            CHECK(op->phase == TG_PHASE_FORWARD && op->in[2] >= 0 && op->out[2] >= 0 &&
                      strstr(p.tensors[op->out[0]].name, ".mlp.gelu") && strstr(p.tensors[op->out[2]].name, ".mlp.c_fc") &&
                      p.tensors[op->out[2]].dtype == p.tensors[op->out[0]].dtype,
                  "%s: forward gelu matmul %d writes %s, keeps %s", name, o, p.tensors[op->out[0]].name,
                  p.tensors[op->out[2]].name);
            /* Its backward partner reads the kept pre-activation and writes its gradient,
             * which the c_fc weight-gradient matmul reads as dC. */
            for (int b = p.phase_begin[TG_PHASE_BACKWARD]; b < p.n_ops; b++) {
                const tg_op *d = &p.ops[b];
                if (d->kind != TG_OP_MATMUL || d->p.matmul.activation != TG_MATMUL_ACT_GELU_BWD || d->in[3] != op->out[2])
                    continue;
                int read = 0;
                for (int k = b + 1; k < p.n_ops; k++)
                    read += p.ops[k].kind == TG_OP_MATMUL && p.ops[k].in[1] == d->out[0] && p.ops[k].in[0] == op->in[0];
                CHECK(d->in[2] < 0 && !d->p.matmul.accumulate && !d->p.matmul.bias_grad && d->p.matmul.batch == 1 &&
                          read == 1,
                      "%s: gelu backward matmul %d: bias %d, accumulate %lld, read by %d weight gradients", name, b,
                      d->in[2], (long long)d->p.matmul.accumulate, read);
                pairs++;
            }
        }
        CHECK(pairs == cfg.layers, "%s: %d gelu matmul pairs, want %d", name, pairs, cfg.layers);
        tg_plan_free(&p), tg_plan_free(&q);
    }
}

/* The backward rule when the consumer's dA cannot apply the GELU backward: an activation
 * read by two matmuls has two gradient contributions, so they are added and one GELU_BWD
 * on the kept pre-activation gives its gradient. A hand-built graph: h = gelu(x W1 + b1)
 * (activation 1), logits = h W2 + h W3, cross-entropy loss. */
TG_TEST(test_compile_gelu_epilogue_shared_activation) {
    tg_model_config cfg;
    tg_err err;
    memset(&cfg, 0, sizeof cfg);
    REQUIRE(tg_model_config_load("tiny-gpt2", &cfg, &err) == 0, "%s", err.msg);
    tg_job job;
    tg_job_defaults(&job);
    tg_graph g;
    tg_graph_init(&g, &cfg, &job, &err);
    const int64_t N = 4, D = 8, F = 16, C = 5;
    int64_t xs[2] = {N, D}, ls[1] = {N};
    int x = tg_graph_tensor(&g, "x", TG_F32, TG_POOL_INPUTS, 2, xs);
    int labels = tg_graph_tensor(&g, "labels", TG_I32, TG_POOL_INPUTS, 1, ls);
    g.io.labels = labels;
    int w1 = tg_param(&g, "w1", 2, D, F, TG_INIT_NORMAL, 0), b1 = tg_param(&g, "b1", 1, F, 0, TG_INIT_ZEROS, 1);
    int w2 = tg_param(&g, "w2", 2, F, C, TG_INIT_NORMAL, 0), w3 = tg_param(&g, "w3", 2, F, C, TG_INIT_NORMAL, 0);
    int pre = tg_act(&g, "pre", 2, N, F, 0, 0), h = tg_act(&g, "h", 2, N, F, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = w1, s.in[2] = b1, s.out[0] = h, s.out[2] = pre;
    s.p.matmul = (tg_matmul_params){.m = N, .n = F, .k = D, .batch = 1, .activation = TG_MATMUL_ACT_GELU, .alpha = 1.0f};
    tg_graph_op(&g, &s);
    int y[2];
    for (int k = 0; k < 2; k++) {
        y[k] = tg_act(&g, k ? "y3" : "y2", 2, N, C, 0, 0);
        s = tg_spec(TG_OP_MATMUL);
        s.in[0] = h, s.in[1] = k ? w3 : w2, s.out[0] = y[k];
        s.p.matmul = (tg_matmul_params){.m = N, .n = C, .k = F, .batch = 1, .alpha = 1.0f};
        tg_graph_op(&g, &s);
    }
    int logits = tg_act(&g, "logits", 2, N, C, 0, 0), loss = tg_act(&g, "loss", 1, 1, 0, 0, 0);
    s = tg_spec(TG_OP_ADD);
    s.in[0] = y[0], s.in[1] = y[1], s.out[0] = logits, s.p.count.n = N * C;
    tg_graph_op(&g, &s);
    s = tg_spec(TG_OP_CROSS_ENTROPY);
    s.in[0] = logits, s.in[1] = labels, s.out[0] = loss, s.p.cross_entropy.n = N, s.p.cross_entropy.c = C;
    tg_graph_op(&g, &s);
    REQUIRE(!g.failed && tg_plan_param_layout(&g) == 0 && tg_autodiff(&g, loss) == 0, "%s", err.msg);
    int fused_bwd = 0, gelu_bwd = 0, dw1 = 0;
    for (int o = 0; o < g.n_ops; o++) {
        const tg_op *op = &g.ops[o];
        fused_bwd += op->kind == TG_OP_MATMUL && op->p.matmul.activation == TG_MATMUL_ACT_GELU_BWD;
        if (op->kind == TG_OP_GELU_BWD) {
            gelu_bwd++;
            /* dh is the sum of both dA products (the second accumulating into the first's
             * output, or an ADD of the two); the result is pre's gradient. */
            int summed = 0, writes = 0, accumulates = 0;
            for (int k = 0; k < o; k++) {
                const tg_op *w = &g.ops[k];
                summed |= w->kind == TG_OP_ADD && w->out[0] == op->in[0];
                writes += w->kind == TG_OP_MATMUL && w->out[0] == op->in[0];
                accumulates += w->kind == TG_OP_MATMUL && w->out[0] == op->in[0] && w->p.matmul.accumulate;
            }
            summed |= writes == 2 && accumulates == 1;
            CHECK(op->in[1] == pre && op->p.gelu_bwd.form == TG_GELU_TANH && op->p.gelu_bwd.n == N * F && summed,
                  "gelu_bwd %d reads %d (pre %d), mode %lld, summed dh %d", o, op->in[1], pre,
                  (long long)op->p.gelu_bwd.form, summed);
            /* dW1 reads its output; the bias gradient is summed by the GELU backward itself. */
            for (int k = o + 1; k < g.n_ops; k++)
                dw1 += g.ops[k].kind == TG_OP_MATMUL && g.ops[k].in[1] == op->out[0] &&
                       g.ops[k].out[0] == g.tensors[w1].grad && g.ops[k].out[1] < 0 &&
                       op->out[1] == g.tensors[b1].grad && op->p.gelu_bwd.bias_cols == F;
        }
    }
    CHECK(fused_bwd == 0 && gelu_bwd == 1 && dw1 == 1, "%d fused gelu backward matmuls, %d gelu_bwd ops, dW1 %d",
          fused_bwd, gelu_bwd, dw1);
    tg_graph_free(&g);
}

/* The residual adds with their dropout and following LayerNorm as RESIDUAL_LAYERNORM ops
 * (the default): two per layer, at the LayerNorms that in the separate-op plan read a
 * residual ADD, reading the branch's matmul output and the residual stream, with the
 * hidden dropout's p, the step counter, fp32 statistics; GPT-2's s is the next op's
 * residual and its backward takes that op's gradient as ds_extra. */
TG_TEST(test_compile_residual_layernorm) {
    static const struct {
        const char *preset;
        int task, precision, gpt2;
    } cases[] = {{"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 0},
                 {"tiny-roberta", TG_TASK_CLASSIFY, TG_PREC_FP32, 0},
                 {"tiny-gpt2", TG_TASK_LM, TG_PREC_FP32, 1},
                 {"tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 1},
                 {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_model_config cfg;
        tg_err err;
        memset(&cfg, 0, sizeof cfg);
        REQUIRE(tg_model_config_load(cases[c].preset, &cfg, &err) == 0, "%s", err.msg);
        REQUIRE(cfg.hidden_dropout > 0, "%s should have hidden dropout", cases[c].preset);
        tg_job job;
        tg_job_defaults(&job);
        CHECK(job.fuse_residual_layernorm == 1, "fuse_residual_layernorm is not on by default");
        snprintf(job.model, sizeof job.model, "%s", cases[c].preset);
        job.task = cases[c].task, job.precision = cases[c].precision, job.batch = 2, job.seq = 8, job.steps = 1;
        tg_plan p, q;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        job.fuse_residual_layernorm = 0;
        REQUIRE(tg_compile_with_config(&job, &cfg, &q, &err) == 0, "%s", err.msg);
        const char *name = cases[c].preset;
        check_plan_memory(&p, name);
        check_plan_memory(&q, name);
        int L = cfg.layers, kp[TG_OP_COUNT], kq[TG_OP_COUNT];
        count_kinds(&p, kp);
        count_kinds(&q, kq);
        CHECK(kp[TG_OP_RESIDUAL_LAYERNORM] == 2 * L && kp[TG_OP_RESIDUAL_LAYERNORM_BWD] == 2 * L &&
                  !kq[TG_OP_RESIDUAL_LAYERNORM] && !kq[TG_OP_RESIDUAL_LAYERNORM_BWD],
              "%s: %d/%d fused ops, %d/%d without the fusion", name, kp[TG_OP_RESIDUAL_LAYERNORM],
              kp[TG_OP_RESIDUAL_LAYERNORM_BWD], kq[TG_OP_RESIDUAL_LAYERNORM], kq[TG_OP_RESIDUAL_LAYERNORM_BWD]);
        /* The separate-op plan's LayerNorms that read a residual ADD of a DROPOUT output. */
        int separate = 0;
        for (int o = 0; o < q.phase_begin[TG_PHASE_BACKWARD]; o++) {
            const tg_op *ln = &q.ops[o];
            if (ln->kind != TG_OP_LAYERNORM) continue;
            int a = producer(&q, ln->in[0]);
            if (a < 0 || q.ops[a].kind != TG_OP_ADD) continue;
            int d = producer(&q, q.ops[a].in[0]);
            if (d < 0 || q.ops[d].kind != TG_OP_DROPOUT) continue;
            separate++;
            const char *gamma = q.tensors[ln->in[1]].name;
            int found = 0;
            for (int k = 0; k < p.phase_begin[TG_PHASE_BACKWARD]; k++)
                found |= p.ops[k].kind == TG_OP_RESIDUAL_LAYERNORM && !strcmp(p.tensors[p.ops[k].in[2]].name, gamma) &&
                         p.ops[k].p.residual_layernorm.key == q.ops[d].p.dropout.key;
            CHECK(found, "%s: no fused op with %s and dropout key %lld", name, gamma, (long long)q.ops[d].p.dropout.key);
        }
        CHECK(separate == 2 * L, "%s: %d residual LayerNorms in the separate-op plan", name, separate);
        int low = cases[c].precision == TG_PREC_BF16, extra = 0;
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind == TG_OP_RESIDUAL_LAYERNORM) {
                const tg_residual_layernorm_params *rl = &op->p.residual_layernorm;
                CHECK(rl->p == cfg.hidden_dropout && op->in[4] == p.io.step && rl->eps == cfg.layer_norm_eps &&
                          rl->m == job.batch * job.seq && rl->d == cfg.hidden,
                      "%s: residual_layernorm %d parameters", name, o);
                int x = producer(&p, op->in[0]);
                CHECK(x >= 0 && p.ops[x].kind == TG_OP_MATMUL && p.ops[x].in[2] >= 0,
                      "%s: residual_layernorm %d: x is not a linear layer's output", name, o);
                int r = producer(&p, op->in[1]);
                /* GPT-2: the residual stream (a previous op's s, or the embeddings' dropout);
                 * BERT: the previous LayerNorm's output. */
                int stream = r >= 0 && ((p.ops[r].kind == TG_OP_RESIDUAL_LAYERNORM &&
                                         p.ops[r].out[cases[c].gpt2 ? 1 : 0] == op->in[1]) ||
                                        p.ops[r].kind == TG_OP_DROPOUT);
                CHECK(stream, "%s: residual_layernorm %d: r is %s", name, o, p.tensors[op->in[1]].name);
                const tg_tensor *y = &p.tensors[op->out[0]], *s = &p.tensors[op->out[1]];
                CHECK(y->dtype == (low ? TG_BF16 : TG_F32) && s->dtype == y->dtype &&
                          p.tensors[op->out[2]].dtype == TG_F32 && p.tensors[op->out[3]].dtype == TG_F32,
                      "%s: residual_layernorm %d: y %s, s %s, statistics fp32", name, o, tg_dtype_name(y->dtype),
                      tg_dtype_name(s->dtype));
            }
            if (op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD) {
                int f = producer(&p, op->in[1]);
                const tg_residual_layernorm_bwd_params *rb = &op->p.residual_layernorm_bwd;
                CHECK(f >= 0 && p.ops[f].kind == TG_OP_RESIDUAL_LAYERNORM && p.ops[f].out[2] == op->in[3] &&
                          p.ops[f].out[3] == op->in[4] && p.ops[f].p.residual_layernorm.key == rb->key &&
                          p.ops[f].p.residual_layernorm.p == rb->p && op->in[6] == p.io.step,
                      "%s: residual_layernorm_bwd %d does not read its forward's s, statistics, key and step", name, o);
                CHECK((p.tensors[op->out[2]].flags & TG_TENSOR_GRAD) && (p.tensors[op->out[3]].flags & TG_TENSOR_GRAD),
                      "%s: residual_layernorm_bwd %d: dgamma/dbeta are not parameter gradients", name, o);
                extra += op->in[5] >= 0;
            }
        }
        /* GPT-2: every s but the last block's is the next op's residual. */
        CHECK(extra == (cases[c].gpt2 ? 2 * L - 1 : 0), "%s: %d backward ops take ds_extra", name, extra);
        tg_plan_free(&p), tg_plan_free(&q);
    }
}

/* A matmul's dA contribution to an activation gradient that already exists accumulates
 * into it (MATMUL accumulate) instead of going to a fresh tensor summed by an ADD. With the
 * residual LayerNorm fused, tiny-bert's backward has no ADD at all (each layer input's
 * gradient starts as the residual gradient ds and takes the V, K and Q products, the FFN
 * input's the intermediate product: 4 accumulating matmuls per layer); without it, ADD's
 * rule hands one gradient to both addends, which is then not updated in place, so autodiff
 * sums the first product into it with an ADD (2 per layer), which compiler/fuse_sums.c
 * folds into that product once the other addend's reader (the dropout backward) has run:
 * again no ADD and 4 accumulating matmuls per layer. The planner must keep the
 * accumulated tensor live and its bytes unshared from its first write to its last
 * accumulation. */
TG_TEST(test_compile_gradient_accumulation) {
    static const struct {
        const char *preset;
        int task, fuse, precision, adds_per_layer, acc_per_layer, adds_extra;
    } cases[] = {{"tiny-bert", TG_TASK_CLASSIFY, 1, TG_PREC_FP32, 0, 4, 0},
                 {"tiny-bert", TG_TASK_CLASSIFY, 0, TG_PREC_FP32, 0, 4, 0},
                 {"tiny-bert", TG_TASK_CLASSIFY, 1, TG_PREC_BF16, 0, 4, 0},
                 /* GPT-2: block 0's ln_1 and first residual share the embeddings' output. */
                 {"tiny-gpt2", TG_TASK_LM, 1, TG_PREC_FP32, 0, 0, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_model_config cfg;
        tg_err err;
        memset(&cfg, 0, sizeof cfg);
        REQUIRE(tg_model_config_load(cases[c].preset, &cfg, &err) == 0, "%s", err.msg);
        tg_job job;
        tg_job_defaults(&job);
        job.fuse_qkv = 0; /* three q/k/v products: three dA contributions per layer */
        snprintf(job.model, sizeof job.model, "%s", cases[c].preset);
        job.task = cases[c].task, job.precision = cases[c].precision, job.batch = 2, job.seq = 8, job.steps = 1;
        job.fuse_residual_layernorm = cases[c].fuse;
        tg_plan p;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        char what[64];
        snprintf(what, sizeof what, "%s fuse %d %s", cases[c].preset, cases[c].fuse,
                 tg_precision_name(cases[c].precision));
        check_plan_memory(&p, what);
        int L = cfg.layers, adds = 0, accumulating = 0;
        for (int o = p.phase_begin[TG_PHASE_BACKWARD]; o < p.phase_begin[TG_PHASE_OPTIMIZER]; o++) {
            const tg_op *op = &p.ops[o];
            adds += op->kind == TG_OP_ADD;
            if (op->kind != TG_OP_MATMUL || !op->p.matmul.accumulate) continue;
            int g = op->out[0];
            const tg_tensor *x = &p.tensors[g];
            if (x->pool != TG_POOL_ACTIVATIONS) {
                CHECK(x->flags & TG_TENSOR_GRAD, "%s: matmul %d accumulates into %s", what, o, x->name);
                continue;
            }
            accumulating++;
            CHECK(!(x->flags & (TG_TENSOR_GRAD | TG_TENSOR_VIEW | TG_TENSOR_PARAM)), "%s: matmul %d accumulates into %s",
                  what, o, x->name);
            /* Written (not accumulated) by an earlier backward op, and live from there on. */
            int first = -1;
            for (int k = p.phase_begin[TG_PHASE_BACKWARD]; k < o && first < 0; k++)
                for (int s = 0; s < TG_OP_MAX_OUT; s++)
                    if (p.ops[k].out[s] == g && !(p.ops[k].kind == TG_OP_MATMUL && p.ops[k].p.matmul.accumulate && s == 0))
                        first = k;
            CHECK(first >= 0 && x->first_use <= first && x->last_use >= o,
                  "%s: %s is accumulated at op %d, first written at %d, live %d..%d", what, x->name, o, first,
                  x->first_use, x->last_use);
            /* No other activation shares its bytes while it holds the partial sum. */
            for (int t = 0; t < p.n_tensors; t++) {
                const tg_tensor *y = &p.tensors[t];
                if (t == g || y->pool != TG_POOL_ACTIVATIONS || y->first_use < 0) continue;
                int bytes = y->offset < x->offset + x->bytes && x->offset < y->offset + y->bytes;
                int time = !(y->last_use < first || y->first_use > o);
                CHECK(!(bytes && time), "%s: %s shares bytes with %s while it accumulates (ops %d..%d)", what, y->name,
                      x->name, first, o);
            }
        }
        CHECK(adds == cases[c].adds_per_layer * L + cases[c].adds_extra &&
                  accumulating == cases[c].acc_per_layer * L,
              "%s: %d backward ADD ops (want %d), %d accumulating matmuls (want %d)", what, adds,
              cases[c].adds_per_layer * L + cases[c].adds_extra, accumulating, cases[c].acc_per_layer * L);
        tg_plan_free(&p);
    }
}

/* Initial weights depend on the parameter's name and the seed only: plans of one model
 * that compute differently (fused or unfused attention, fused bias gradients, bf16, packed
 * or separate q/k/v projections) start from the same values, and a different seed changes
 * them. */
TG_TEST(test_weights_init_by_name) {
    static const char *const variants[] = {
        "attention = fused\nfuse_bias_grad = true\n",
        "attention = unfused\nfuse_bias_grad = false\nfuse_residual_layernorm = false\n",
        "attention = fused\nprecision = bf16\n",
        "fuse_qkv = false\n",
        /* Frozen parameters start from the same values as trainable ones. */
        "freeze = bert.encoder.layer.0.*, bert.embeddings.word_embeddings.*\nprecision = bf16\n",
    };
    enum { N_VARIANTS = sizeof variants / sizeof variants[0] };
    tg_plan plans[N_VARIANTS];
    tg_weights_image images[N_VARIANTS];
    tg_err err;
    for (int v = 0; v < N_VARIANTS; v++) {
        char text[512];
        snprintf(text, sizeof text, "model = tiny-bert\nbatch = 2\nseq = 16\nsteps = 1\ntrain_data = x\n%s", variants[v]);
        REQUIRE(compile_text(text, &plans[v], &err, NULL) == 0, "%s", err.msg);
        REQUIRE(tg_weights_image_alloc(&plans[v], &images[v], &err) == 0, "%s", err.msg);
        tg_weights_init(&images[v], 7);
    }
    int compared = 0, frozen = 0;
    for (int t = 0; t < plans[0].n_tensors; t++) {
        const tg_tensor *x = &plans[0].tensors[t];
        if (!tg_tensor_is_value(x)) continue;
        for (int v = 1; v < N_VARIANTS; v++) {
            int u = tg_test_tensor_named(&plans[v], x->name);
            if (!CHECK(u >= 0, "%s missing from variant %d", x->name, v)) continue;
            frozen += tg_tensor_class_of(&plans[v].tensors[u]) == TG_CLASS_FROZEN;
            CHECK(memcmp(tg_weights_value(&images[0], t), tg_weights_value(&images[v], u), (size_t)tg_tensor_numel(x) * 4) == 0,
                  "%s starts differently in variant %d", x->name, v);
            compared++;
        }
    }
    CHECK(compared > 20 && frozen == 17, "only %d parameters compared, %d of them frozen", compared, frozen);
    /* The buffers: positions 0..63 and zero token types. */
    int pos = tg_test_tensor_named(&plans[0], "bert.embeddings.position_ids");
    REQUIRE(pos >= 0 && plans[0].tensors[pos].dtype == TG_I32, "no position_ids buffer");
    const int32_t *ids = tg_weights_value(&images[0], pos);
    CHECK(ids[0] == 0 && ids[63] == 63, "position_ids start %d and end %d", ids[0], ids[63]);
    tg_weights_image other;
    REQUIRE(tg_weights_image_alloc(&plans[0], &other, &err) == 0, "%s", err.msg);
    tg_weights_init(&other, 8);
    CHECK(memcmp(other.params, images[0].params, plans[0].pool_bytes[TG_POOL_PARAMS]) != 0,
          "another seed gave the same weights");
    tg_weights_image_free(&other);
    for (int v = 0; v < N_VARIANTS; v++) {
        tg_weights_image_free(&images[v]);
        tg_plan_free(&plans[v]);
    }
}

/* The parameter a matmul operand reads (through its bf16 copy in bf16 plans). */
static int master_of(const tg_plan *p, int t) {
    return t >= 0 && (p->tensors[t].flags & TG_TENSOR_PARAM_COPY) ? p->tensors[t].master : t;
}

/* BERT's and RoBERTa's query, key and value projections as one packed product (`fuse_qkv`,
 * the default): per layer one forward matmul [N, D] x [3D, D]^T + [3D] through the packed
 * views, and one input-gradient and one weight-gradient product (with the bias gradient)
 * in the backward, writing the packed gradient views; `fuse_qkv = false` keeps three of
 * each. The parameters (names, shapes, init, decay), their count and the FLOPs are the
 * same; the packed groups lie back to back (q, k, v rows) in params, grads and the bf16
 * copies. */
TG_TEST(test_compile_packed_qkv) {
    static const char *const jobs[] = {
        "model = bert-base-uncased\nbatch = 32\nseq = 128\n",
        "model = roberta-base\nbatch = 8\nseq = 128\nprecision = bf16\nattention = unfused\n",
        "model = tiny-bert\nbatch = 2\nseq = 8\nprecision = bf16\n",
    };
    for (size_t c = 0; c < sizeof jobs / sizeof jobs[0]; c++) {
        char text[512];
        tg_plan plans[2];
        tg_err err;
        for (int m = 0; m < 2; m++) {
            snprintf(text, sizeof text, "%ssteps = 1\ntrain_data = x\nfuse_qkv = %s\n", jobs[c], m ? "false" : "true");
            REQUIRE(compile_text(text, &plans[m], &err, NULL) == 0, "%s", err.msg);
        }
        const tg_plan *p = &plans[0], *q = &plans[1];
        const char *name = p->model.source;
        int L = p->model.layers;
        int64_t D = p->model.hidden;
        check_plan_memory(p, name);
        check_plan_memory(q, name);
        CHECK(param_count(p) == param_count(q), "%s: %lld parameters packed, %lld separate", name,
              (long long)param_count(p), (long long)param_count(q));
        /* The same products; the separate plan sums the three input gradients by
         * accumulating matmuls, so no ADD either. The packed groups leave no alignment gaps
         * between small members. */
        int kp[TG_OP_COUNT], kq[TG_OP_COUNT];
        count_kinds(p, kp);
        count_kinds(q, kq);
        double mm_flops[2] = {0, 0};
        for (int m = 0; m < 2; m++)
            for (int o = 0; o < plans[m].n_ops; o++)
                if (plans[m].ops[o].kind == TG_OP_MATMUL)
                    mm_flops[m] += tg_op_flops(&plans[m].ops[o]);
        CHECK(kq[TG_OP_ADD] == kp[TG_OP_ADD] && fabs(mm_flops[0] - mm_flops[1]) <= 1e-12 * mm_flops[1],
              "%s: matmul flops %.9g packed, %.9g separate; adds %d, %d", name, mm_flops[0], mm_flops[1],
              kp[TG_OP_ADD], kq[TG_OP_ADD]);
        CHECK(p->pool_bytes[TG_POOL_PARAMS] <= q->pool_bytes[TG_POOL_PARAMS], "%s: params pool %llu packed, %llu separate",
              name, (unsigned long long)p->pool_bytes[TG_POOL_PARAMS], (unsigned long long)q->pool_bytes[TG_POOL_PARAMS]);
        /* The same parameters, one by one. */
        for (int t = 0; t < q->n_tensors; t++) {
            const tg_tensor *y = &q->tensors[t];
            if (!(y->flags & TG_TENSOR_PARAM) || (y->flags & TG_TENSOR_VIEW)) continue;
            int k = tg_test_tensor_named(p, y->name);
            const tg_tensor *x = k >= 0 ? &p->tensors[k] : NULL;
            CHECK(x && x->ndim == y->ndim && !memcmp(x->shape, y->shape, sizeof x->shape) && x->flags == y->flags &&
                      x->init == y->init && x->init_std == y->init_std,
                  "%s: %s differs in the packed plan", name, y->name);
        }
        /* Matmuls: forward, backward, and those reading or writing a packed view. */
        int fwd[2] = {0, 0}, bwd[2] = {0, 0}, packed_fwd = 0, packed_dw = 0;
        for (int m = 0; m < 2; m++)
            for (int o = 0; o < plans[m].n_ops; o++) {
                const tg_op *op = &plans[m].ops[o];
                if (op->kind != TG_OP_MATMUL) continue;
                (op->phase == TG_PHASE_FORWARD ? fwd : bwd)[m]++;
                if (m) continue;
                int w = master_of(p, op->in[1]);
                if (op->phase == TG_PHASE_FORWARD && w >= 0 && p->tensors[w].group < 0 &&
                    (p->tensors[w].flags & TG_TENSOR_VIEW) && strstr(p->tensors[w].name, "self.qkv.weight")) {
                    int b = master_of(p, op->in[2]);
                    const tg_matmul_params *mm = &op->p.matmul;
                    packed_fwd += mm->m == p->train.batch * p->train.seq && mm->n == 3 * D && mm->k == D &&
                                  mm->trans_b == 1 && b >= 0 && strstr(p->tensors[b].name, "self.qkv.bias") &&
                                  p->tensors[op->out[0]].shape[1] == 3 * D;
                }
                if (op->phase == TG_PHASE_BACKWARD && op->out[1] >= 0 &&
                    strstr(p->tensors[op->out[0]].name, "self.qkv.weight"))
                    packed_dw += op->p.matmul.m == 3 * D && op->p.matmul.n == D && op->p.matmul.bias_grad == 1 &&
                                 strstr(p->tensors[op->out[1]].name, "self.qkv.bias") != NULL;
            }
        CHECK(packed_fwd == L && packed_dw == L, "%s: %d packed q|k|v products, %d packed weight gradients (want %d)",
              name, packed_fwd, packed_dw, L);
        CHECK(fwd[1] - fwd[0] == 2 * L && bwd[1] - bwd[0] == 4 * L,
              "%s: forward matmuls %d packed, %d separate; backward %d, %d", name, fwd[0], fwd[1], bwd[0], bwd[1]);
        if (strstr(name, "bert-base"))
            CHECK(fwd[0] == 4 * L + 2 && fwd[1] == 6 * L + 2, "%s: %d forward matmuls", name, fwd[0]);
        /* Every layer's groups: q, k, v back to back under their views, in every pool. */
        static const char *const part[3] = {"query", "key", "value"};
        const char *base = p->model.arch == TG_ARCH_ROBERTA ? "roberta" : "bert";
        for (int l = 0; l < L; l++)
            for (int w = 0; w < 2; w++) {
                const char *kind = w ? "bias" : "weight";
                char vname[TG_NAME_MAX], mname[TG_NAME_MAX];
                snprintf(vname, sizeof vname, "%s.encoder.layer.%d.attention.self.qkv.%s", base, l, kind);
                int v = tg_test_tensor_named(p, vname);
                if (!CHECK(v >= 0, "%s: no view %s", name, vname)) continue;
                const tg_tensor *vt = &p->tensors[v];
                int64_t member_bytes = (w ? D : D * D) * 4;
                CHECK((vt->flags & TG_TENSOR_PARAM) && (vt->flags & TG_TENSOR_VIEW) && vt->shape[0] == 3 * D &&
                          vt->bytes == 3 * (uint64_t)member_bytes && vt->offset % 512 == 0 && vt->grad >= 0 &&
                          p->tensors[vt->grad].offset == vt->offset,
                      "%s: view %s", name, vname);
                for (int i = 0; i < 3; i++) {
                    snprintf(mname, sizeof mname, "%s.encoder.layer.%d.attention.self.%s.%s", base, l, part[i], kind);
                    int k = tg_test_tensor_named(p, mname);
                    if (!CHECK(k >= 0, "%s: no %s", name, mname)) continue;
                    const tg_tensor *x = &p->tensors[k], *g = &p->tensors[x->grad];
                    CHECK(x->group == v && x->offset == vt->offset + (uint64_t)(i * member_bytes) &&
                              g->group == vt->grad && g->offset == x->offset,
                          "%s: %s at %llu in group %d", name, mname, (unsigned long long)x->offset, x->group);
                    if (p->train.precision == TG_PREC_BF16) {
                        char cname[TG_NAME_MAX + 8];
                        snprintf(cname, sizeof cname, "bf16.%s", mname);
                        int cc = tg_test_tensor_named(p, cname);
                        CHECK(cc >= 0 && p->tensors[cc].offset * 2 == x->offset && p->tensors[cc].group >= 0 &&
                                  p->tensors[p->tensors[cc].group].master == v,
                              "%s: bf16 copy of %s", name, mname);
                    }
                }
            }
        tg_plan_free(&plans[0]), tg_plan_free(&plans[1]);
    }
}

/* Whether the first op writing bytes [a, b) of the gradient pool overwrites them (MATMUL
 * without accumulate, BIAS_GRAD and the LayerNorm backwards with overwrite, a fused bias
 * gradient), looking only at ops after `from`; -1 if no op writes there. */
static int first_write_overwrites(const tg_plan *p, int from, uint64_t a, uint64_t b) {
    for (int o = from; o < p->n_ops; o++) {
        const tg_op *op = &p->ops[o];
        for (int s = 0; s < TG_OP_MAX_OUT; s++) {
            const int t = op->out[s];
            if (t < 0 || t == p->io.grads_all || p->tensors[t].pool != TG_POOL_GRADS) continue;
            const tg_tensor *x = &p->tensors[t];
            if (x->offset >= b || x->offset + x->bytes <= a) continue;
            switch (op->kind) {
            case TG_OP_MATMUL: return s == 1 || !op->p.matmul.accumulate;
            case TG_OP_GELU_BWD: return s == 1; /* its fused bias gradient is written */
            case TG_OP_BIAS_GRAD: return op->p.bias_grad.overwrite != 0;
            case TG_OP_LAYERNORM_BWD: return op->p.layernorm_bwd.overwrite != 0;
            case TG_OP_RESIDUAL_LAYERNORM_BWD: return op->p.residual_layernorm_bwd.overwrite != 0;
            default: return 0;
            }
        }
    }
    return -1;
}

/* The backward clears only what must start at zero (compiler/grad_writes.c): BERT's three
 * embedding tables (scattered into), GPT-2's position table (its token table's first
 * writer is the tied LM head's product); every other gradient's first writer overwrites
 * it, with fused or separate bias gradients. */
TG_TEST(test_compile_first_gradient_writes) {
    static const struct {
        const char *preset;
        int task, fuse_bias_grad;
        const char *zeroed[4];
    } cases[] = {
        {"bert-base-uncased", TG_TASK_CLASSIFY, 1,
         {"grad.bert.embeddings.word_embeddings.weight", "grad.bert.embeddings.position_embeddings.weight",
          "grad.bert.embeddings.token_type_embeddings.weight", NULL}},
        {"bert-base-uncased", TG_TASK_CLASSIFY, 0,
         {"grad.bert.embeddings.word_embeddings.weight", "grad.bert.embeddings.position_embeddings.weight",
          "grad.bert.embeddings.token_type_embeddings.weight", NULL}},
        {"gpt2", TG_TASK_LM, 1, {"grad.transformer.wpe.weight", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_model_config cfg;
        tg_err err;
        REQUIRE(tg_model_config_load(cases[c].preset, &cfg, &err) == 0, "%s", err.msg);
        tg_job job;
        tg_job_defaults(&job);
        snprintf(job.model, sizeof job.model, "%s", cases[c].preset);
        job.task = cases[c].task, job.precision = TG_PREC_BF16, job.batch = 2, job.seq = 16, job.steps = 1;
        job.fuse_bias_grad = cases[c].fuse_bias_grad;
        tg_plan p;
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s", err.msg);
        check_plan_memory(&p, cases[c].preset);
        int zeros = 0, zero_op = -1;
        uint64_t za = 0, zb = 0, zeroed = 0;
        for (int o = 0; o < p.n_ops; o++)
            if (p.ops[o].kind == TG_OP_ZERO && p.tensors[p.ops[o].out[0]].pool == TG_POOL_GRADS) {
                const tg_tensor *z = &p.tensors[p.ops[o].out[0]];
                CHECK(z->offset + z->bytes <= p.pool_bytes[TG_POOL_GRADS] && p.ops[o].out[0] != p.io.grads_all,
                      "%s: ZERO %s is not a view inside the gradients", cases[c].preset, z->name);
                zeros++, zero_op = o, za = z->offset, zb = z->offset + z->bytes, zeroed += z->bytes;
            }
        CHECK(zeros == 1 && p.ops[zero_op].phase == TG_PHASE_BACKWARD, "%s: %d ZERO ops (want 1)", cases[c].preset,
              zeros);
        CHECK(zeroed * 4 < p.pool_bytes[TG_POOL_GRADS], "%s: %llu of %llu gradient bytes cleared", cases[c].preset,
              (unsigned long long)zeroed, (unsigned long long)p.pool_bytes[TG_POOL_GRADS]);
        int n_zeroed = 0;
        for (int t = 0; t < p.n_tensors; t++) {
            const tg_tensor *x = &p.tensors[t];
            if (!(x->flags & TG_TENSOR_GRAD) || (x->flags & TG_TENSOR_VIEW)) continue;
            int want_zero = 0;
            for (int k = 0; cases[c].zeroed[k]; k++) want_zero |= !strcmp(x->name, cases[c].zeroed[k]);
            const int inside = x->offset >= za && x->offset + x->bytes <= zb;
            n_zeroed += want_zero;
            if (want_zero) {
                CHECK(inside, "%s: %s is not cleared", cases[c].preset, x->name);
                continue;
            }
            /* From the backward's start: the clear sits before its own span's first writer only. */
            CHECK(first_write_overwrites(&p, p.phase_begin[TG_PHASE_BACKWARD], x->offset, x->offset + x->bytes) == 1,
                  "%s: %s: its first writer does not overwrite it%s", cases[c].preset, x->name,
                  inside ? " (and it is cleared)" : "");
        }
        for (int o = 0; o < p.n_ops; o++) {
            const tg_op *op = &p.ops[o];
            if (op->kind == TG_OP_LAYERNORM_BWD)
                CHECK(op->p.layernorm_bwd.overwrite == 1, "%s: LayerNorm backward %d adds into its parameter gradients",
                      cases[c].preset, o);
            if (op->kind == TG_OP_RESIDUAL_LAYERNORM_BWD)
                CHECK(op->p.residual_layernorm_bwd.overwrite == 1,
                      "%s: LayerNorm backward %d adds into its parameter gradients", cases[c].preset, o);
            if (op->kind == TG_OP_BIAS_GRAD)
                CHECK(op->p.bias_grad.overwrite == 1, "%s: bias gradient %d adds", cases[c].preset, o);
        }
        CHECK(n_zeroed > 0, "%s: none of the cleared tables found", cases[c].preset);
        tg_plan_free(&p);
    }
}

/* Compile time must not grow with the square of the depth: a 2,000-layer tiny BERT (122k
 * tensors) once took 34 s, nearly all of it in scans of every tensor or op per tensor or
 * op, then 1.1 s in the activations' best fit over every overlapping tensor; about 0.2 s on
 * two cores now that the best fit reads the bytes taken from a tree over lifetimes. */
TG_TEST(test_compile_deep_model_time) {
    /* Sanitizer builds (make test-asan) check the same path on a shallower model: their
     * instrumented loops run some 20 times slower, and the timing bound is for the build
     * users run. */
#if defined(__SANITIZE_ADDRESS__)
    const int layers = 400;
    const double limit = 5.0;
#elif !defined(__OPTIMIZE__)
    const int layers = 2000;
    const double limit = 8.0; /* the coverage build, at -O0 with counters: about 2 s */
#else
    const int layers = 2000;
    const double limit = 1.0; /* about 0.2 s on two cores; 34 s when it was quadratic */
#endif
    char dir[512], path[600], job[2048], config[512], what[64];
    snprintf(dir, sizeof dir, "%s/deep-bert", tg_test_tmpdir());
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(config, sizeof config,
             "{\"architectures\": [\"BertForMaskedLM\"], \"hidden_act\": \"gelu\", \"hidden_size\": 32,\n"
             " \"intermediate_size\": 64, \"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 64,\n"
             " \"model_type\": \"bert\", \"num_attention_heads\": 4, \"num_hidden_layers\": %d,\n"
             " \"pad_token_id\": 0, \"type_vocab_size\": 2, \"vocab_size\": 128}\n",
             layers);
    REQUIRE(tg_test_write_file(path, config) == 0, "cannot write %s", path);
    snprintf(job, sizeof job, "model = %s\nnum_labels = 2\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\n", dir);
    tg_plan p;
    tg_err err;
    /* The compiling thread's CPU time, which other processes on the machine do not inflate
     * (the compiler runs on this thread alone). */
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    REQUIRE(compile_text(job, &p, &err, NULL) == 0, "%s", err.msg);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    printf("  %d-layer compile: %.2f s (%d ops, %d tensors)\n", layers, s, p.n_ops, p.n_tensors);
    CHECK(s < limit, "%d-layer compile took %.2f s (limit %.0f s)", layers, s, limit);
    snprintf(what, sizeof what, "%d layers", layers);
    check_plan_memory(&p, what);
    tg_plan_free(&p);
}

/* A job for tg_compile_with_config, as the job parser leaves it. */
static void job_for(tg_job *job, const char *model, int task, int batch, int seq) {
    tg_job_defaults(job);
    snprintf(job->path, sizeof job->path, "job.txt");
    snprintf(job->model, sizeof job->model, "%s", model);
    job->task = task, job->batch = batch, job->seq = seq, job->steps = 1;
}

/* Every allocation of a compile may fail: each failure, at every allocation in turn, stops
 * the compile with an out-of-memory error; nothing crashes, reads outside the graph's tables
 * (a tensor index of -1) or leaks, which the sanitizer build (make test-asan) checks. The
 * jobs cover the builders of both families, autodiff, the bf16 pass with frozen
 * parameters, the gradient buckets and ZeRO-1's gathers. */
TG_TEST(test_compile_allocation_failures) {
    static const struct {
        const char *preset;
        int task, precision, data_parallel, zero_stage, attention;
        const char *freeze;
        int recompute; /* the GELU backward's copy (BERT), a GELU op (GPT-2's epilogue), the layers */
    } cases[] = {
        {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, 0, TG_ATTENTION_FUSED, "", TG_RECOMPUTE_GELU},
        {"tiny-roberta", TG_TASK_CLASSIFY, TG_PREC_BF16, 1, 0, TG_ATTENTION_UNFUSED, "roberta.embeddings.*",
         TG_RECOMPUTE_AUTO},
        {"tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 2, 1, TG_ATTENTION_FUSED, "transformer.wte.*", TG_RECOMPUTE_GELU},
        /* Every layer's forward copied into the backward (compiler/recompute.h). */
        {"tiny-llama", TG_TASK_LM, TG_PREC_BF16, 1, 0, TG_ATTENTION_FUSED, "", TG_RECOMPUTE_LAYERS},
        {"tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP32, 1, 0, TG_ATTENTION_UNFUSED, "", TG_RECOMPUTE_LAYERS},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tg_model_config cfg;
        tg_err err;
        REQUIRE(tg_model_config_load(cases[c].preset, &cfg, &err) == 0, "%s", err.msg);
        tg_job job;
        job_for(&job, cases[c].preset, cases[c].task, 2, 16);
        job.precision = cases[c].precision, job.data_parallel = cases[c].data_parallel;
        job.zero_stage = cases[c].zero_stage, job.attention = cases[c].attention;
        snprintf(job.freeze, sizeof job.freeze, "%s", cases[c].freeze);
        job.recompute = cases[c].recompute;
        tg_plan p;
        tg_compiler_alloc_fail_after(-1);
        REQUIRE(tg_compile_with_config(&job, &cfg, &p, &err) == 0, "%s: %s", cases[c].preset, err.msg);
        const long total = tg_compiler_alloc_fail_after(-1);
        tg_plan_free(&p);
        CHECK(total > 10, "%s: %ld allocations", cases[c].preset, total);
        int failed_cleanly = 0;
        for (long n = 0; n < total; n++) {
            tg_compiler_alloc_fail_after(n);
            const int rc = tg_compile_with_config(&job, &cfg, &p, &err);
            tg_compiler_alloc_fail_after(-1);
            if (rc == 0) tg_plan_free(&p);
            const int clean = rc == -1 && strstr(err.msg, "out of memory compiling model") == err.msg;
            failed_cleanly += clean;
            CHECK(clean, "%s: allocation %ld of %ld failing: rc %d, '%s'", cases[c].preset, n, total, rc,
                  rc ? err.msg : "");
        }
        printf("  %s: %ld allocations, each failing in turn: %d clean errors\n", cases[c].preset, total,
               failed_cleanly);
    }
}

/* Compiles `cfg` with one field changed (a config built in memory, as no config.json would
 * pass the loader's own limits) and expects a refusal whose message holds each of `needles`. */
static void expect_size_refused(const tg_model_config *cfg, const tg_job *job, const char *what, const char *n1,
                                const char *n2) {
    tg_plan p;
    tg_err err;
    int rc = tg_compile_with_config(job, cfg, &p, &err);
    if (rc == 0) tg_plan_free(&p);
    CHECK(rc == -1 && strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2)), "%s: rc %d, '%s' (want '%s', '%s')", what,
          rc, rc ? err.msg : "", n1, n2 ? n2 : "");
}

/* Sizes derived from the job and the config are computed without overflow and refused
 * past the stated limits (compiler/limits.h), naming the fields: a config that the loader
 * would take or not, built directly with huge values, never overflows an element count, a
 * byte count or a pool offset, and an absurd layer count is refused before anything is
 * built. */
TG_TEST(test_compile_size_limits) {
    tg_model_config base, cfg;
    tg_err err;
    REQUIRE(tg_model_config_load("tiny-bert", &base, &err) == 0, "%s", err.msg);
    tg_job job;
    job_for(&job, "tiny-bert", TG_TASK_CLASSIFY, 2, 16);

    /* hidden size 2^30 (heads dividing it): each [D, D] weight is 4 EiB. */
    cfg = base, cfg.hidden = 1 << 30, cfg.heads = 1 << 20;
    expect_size_refused(&cfg, &job, "hidden 2^30", "key 'model': model 'tiny-bert': 3 x hidden_size 1073741824 x "
                        "hidden_size 1073741824 makes the query, key and value weights of a layer of 12.0 EiB", "16.0 TiB");
    /* The largest int32 everywhere: every product overflows 64 bits or passes the limit. */
    cfg = base, cfg.vocab_size = INT32_MAX, cfg.hidden = INT32_MAX, cfg.heads = 1, cfg.intermediate = INT32_MAX;
    cfg.max_positions = INT32_MAX, cfg.type_vocab_size = INT32_MAX;
    expect_size_refused(&cfg, &job, "int32 max", "key 'model': model 'tiny-bert': vocab_size 2147483647 x hidden_size "
                        "2147483647 makes the token embedding table", NULL);
    cfg = base, cfg.intermediate = INT32_MAX, cfg.hidden = 1 << 12, cfg.heads = 1 << 5;
    expect_size_refused(&cfg, &job, "intermediate", "intermediate_size 2147483647 x hidden_size 4096 makes an MLP weight",
                        NULL);
    tg_job lm = job;
    lm.task = TG_TASK_LM;
    tg_model_config gpt2;
    REQUIRE(tg_model_config_load("tiny-gpt2", &gpt2, &err) == 0, "%s", err.msg);
    gpt2.vocab_size = 1 << 26;
    lm.batch = 1 << 16;
    expect_size_refused(&gpt2, &lm, "lm logits", "key 'batch': batch 65536 x seq 16 x vocab_size rounded up to 64 "
                        "67108864 makes the logits", NULL);
    /* Activations: batch x seq x width, with a seq the model holds. */
    cfg = base, cfg.max_positions = INT32_MAX;
    tg_job big = job;
    big.batch = INT32_MAX, big.seq = 1 << 20;
    expect_size_refused(&cfg, &big, "batch x seq", "key 'batch': batch 2147483647 x seq 1048576 x 3 x hidden_size", NULL);
    /* Unfused attention keeps [B, H, T, T] scores; a seq that fused attention handles. */
    cfg = base, cfg.max_positions = 1 << 20;
    big = job, big.batch = 64, big.seq = 1 << 20, big.attention = TG_ATTENTION_UNFUSED;
    expect_size_refused(&cfg, &big, "scores", "batch 64 x num_attention_heads 4 x seq 1048576 x seq 1048576",
                        "attention scores");
    cfg = base, cfg.hidden = 1 << 16, cfg.heads = 1 << 9;
    big = job, big.num_labels = INT32_MAX;
    expect_size_refused(&cfg, &big, "labels", "key 'num_labels': num_labels 2147483647 x hidden_size 65536", NULL);

    /* Layers: past TG_MAX_LAYERS refused at once, before a graph of 10^7 layers is built. */
    cfg = base, cfg.layers = 10000000;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    expect_size_refused(&cfg, &job, "layers", "num_hidden_layers 10000000 is more than the 10000 layers a plan may have",
                        NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    CHECK(b.tv_sec - a.tv_sec < 2, "the layer limit took %ld s", (long)(b.tv_sec - a.tv_sec));
    /* Each tensor within the limit, their sum over the layers not: the parameters pool. */
    cfg = base, cfg.layers = TG_MAX_LAYERS, cfg.hidden = 1 << 14, cfg.heads = 1 << 7, cfg.intermediate = 1 << 14;
    job.batch = 1, job.seq = 1;
    expect_size_refused(&cfg, &job, "params pool", "key 'model': model 'tiny-bert' (num_hidden_layers 10000, "
                        "hidden_size 16384", "the params pool needs at least");
    /* Dimensions the loader checks, checked again for configs built in memory. */
    cfg = base, cfg.heads = 0;
    expect_size_refused(&cfg, &job, "heads 0", "num_attention_heads 0 is not a positive count", NULL);
    cfg = base, cfg.heads = 3;
    expect_size_refused(&cfg, &job, "heads 3", "hidden_size 32 is not divisible by num_attention_heads 3", NULL);
    cfg = base, cfg.vocab_size = -5;
    expect_size_refused(&cfg, &job, "vocab -5", "vocab_size -5 is not a positive count", NULL);
    gpt2.vocab_size = 100, gpt2.layers = TG_MAX_LAYERS + 1;
    expect_size_refused(&gpt2, &lm, "gpt2 layers", "n_layer 10001 is more than", NULL);
}

/* epochs x steps per epoch is checked when the trainer opens (the data's size is known
 * only then): 2147483647 epochs of 3 steps are refused naming the key, where the product
 * once overflowed int32 ("-10 steps"); the most epochs that fit are taken. */
TG_TEST(test_trainer_epochs_overflow) {
    char data[600], text[1200];
    snprintf(data, sizeof data, "%s/epochs.jsonl", tg_test_tmpdir());
    REQUIRE(tg_test_write_file(data, "{\"input_ids\": [1, 5, 2], \"label\": 1}\n{\"input_ids\": [3, 4], \"label\": 0}\n"
                                     "{\"input_ids\": [7], \"label\": 1}\n{\"input_ids\": [2, 2], \"label\": 0}\n"
                                     "{\"input_ids\": [9, 8, 7], \"label\": 1}\n") == 0,
            "cannot write %s", data);
    static const struct {
        int32_t epochs;
        int ok;
    } cases[] = {{INT32_MAX, 0}, {INT32_MAX / 3, 1}, {INT32_MAX / 3 + 1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "model = tiny-bert\nbatch = 2\nseq = 8\nepochs = %d\ntrain_data = %s\n",
                 cases[i].epochs, data);
        tg_plan p;
        tg_err err;
        REQUIRE(compile_text(text, &p, &err, NULL) == 0, "%s", err.msg);
        tg_trainer tr;
        tg_trainer_options o = {.device = tg_test_device(), .threads = 1, .load_data = 1};
        const int rc = tg_trainer_open(&tr, &p, &o, &err);
        if (cases[i].ok) {
            CHECK(rc == 0 && tr.total_steps == INT32_MAX / 3 * 3, "%d epochs: rc %d, %d steps (%s)", cases[i].epochs, rc,
                  rc ? 0 : tr.total_steps, rc ? err.msg : "");
            if (rc == 0) tg_trainer_close(&tr);
        } else {
            char want[200];
            snprintf(want, sizeof want, "key 'epochs': %d epochs of 3 steps (5 rows in batches of 2) make %lld steps, "
                     "more than the 2147483647 one run may take", cases[i].epochs, (long long)cases[i].epochs * 3);
            CHECK(rc != 0 && strstr(err.msg, want), "%d epochs: rc %d, '%s'", cases[i].epochs, rc, rc ? err.msg : "");
        }
        tg_plan_free(&p);
    }
}
