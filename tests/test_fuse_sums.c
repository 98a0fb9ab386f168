/* Sums folded into matrix products (compiler/fuse_sums.h): LoRA's sum of the base
 * projection and the scaled B product becomes the B product accumulating into the base
 * output, so the plans lose those ADDs (and the two tensors they joined); the CPU reference
 * trains bit for bit as the unfolded plan in fp32 (losses, gradient norms, every step's
 * gradients, the weights and the optimizer state) and within bf16's rounding in bf16; the
 * plan file's checks accept the folded plans; models without such sums are unchanged. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/fuse_sums.h"
#include "compiler/job.h"
#include "plan/op_meta.h"
#include "plan/plan_file.h"
#include "runtime/trainer.h"
#include "tests/harness.h"
#include "tests/train_record.h"

#define ALL_TARGETS "lora_targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

/* The job compiled with the folding on (off = 0) or off. */
static int compile_job(const char *job_path, const char *const *sets, int n_sets, int off, tg_plan *p) {
    memset(p, 0, sizeof *p);
    tg_err err;
    tg_job job;
    if (!CHECK(tg_job_load(job_path, sets, n_sets, &job, &err) == 0, "%s: %s", job_path, err.msg)) return 0;
    tg_fuse_sums_off = off;
    const int rc = tg_compile(&job, p, &err);
    tg_fuse_sums_off = 0;
    return CHECK(rc == 0, "%s: %s", job_path, err.msg);
}

static int count_kind(const tg_plan *p, int kind, int phase) {
    int n = 0;
    for (int o = 0; o < p->n_ops; o++) n += p->ops[o].kind == kind && (phase < 0 || p->ops[o].phase == phase);
    return n;
}

static int accumulating_products(const tg_plan *p, int phase) {
    int n = 0;
    for (int o = p->phase_begin[phase]; o < p->phase_begin[phase + 1]; o++)
        n += p->ops[o].kind == TG_OP_MATMUL && p->ops[o].p.matmul.accumulate;
    return n;
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Every LoRA sum of a folded plan: written by the B product (overwriting, alpha / r) and
 * then by the base product (accumulating: the larger product reads the sum in its
 * epilogue), both in one phase; no ADD writes it and no tensor "<projection>.lora_B" (the
 * B product's own output) is left. Returns the sums. */
static int check_lora_sums(const tg_plan *p, const char *what) {
    int sums = 0;
    for (int t = 0; t < p->n_tensors; t++) {
        const char *name = p->tensors[t].name;
        CHECK(!ends_with(name, ".lora_B"), "%s: tensor %s is left", what, name);
        if (!strncmp(name, "d.", 2) || (!ends_with(name, ".lora_sum") && !ends_with(name, ".lora_sum.recomputed")))
            continue; /* the sums themselves, not their gradients */
        int first = -1, second = -1, writers = 0;
        for (int o = 0; o < p->n_ops; o++)
            for (int k = 0; k < TG_OP_MAX_OUT; k++)
                if (p->ops[o].out[k] == t) {
                    writers++;
                    if (first < 0) first = o;
                    else second = o;
                }
        sums++;
        if (!CHECK(writers == 2 && first >= 0 && second > first, "%s: %s has %d writers", what, name, writers)) continue;
        const tg_op *b = &p->ops[first], *base = &p->ops[second];
        CHECK(b->kind == TG_OP_MATMUL && !b->p.matmul.accumulate && b->p.matmul.alpha != 1.0f &&
                  base->kind == TG_OP_MATMUL && base->p.matmul.accumulate && base->p.matmul.alpha == 1.0f &&
                  base->phase == b->phase && tg_op_flops(base) > tg_op_flops(b),
              "%s: %s is not a B product then an accumulating base product (ops %d, %d)", what, name, first, second);
    }
    return sums;
}

/* Per layer 7 sums (tiny-llama: 2 layers); the residual adds stay (their other addend,
 * the residual stream, is read again by the backward). */
TG_TEST(test_fuse_sums_lora_plan) {
    const char *sets[] = {"model=tiny-llama", "lora_r=2", ALL_TARGETS};
    tg_plan on, off;
    if (!compile_job("examples/demo-lm.job", sets, 3, 0, &on)) return;
    if (!compile_job("examples/demo-lm.job", sets, 3, 1, &off)) {
        tg_plan_free(&on);
        return;
    }
    const int adds_on = count_kind(&on, TG_OP_ADD, -1), adds_off = count_kind(&off, TG_OP_ADD, -1);
    CHECK(adds_off == 21 && adds_on == 7, "ADDs: %d folded, %d not (want 7, 21)", adds_on, adds_off);
    CHECK(count_kind(&on, TG_OP_ADD, TG_PHASE_FORWARD) == 4, "forward ADDs: %d (want the 4 residual adds)",
          count_kind(&on, TG_OP_ADD, TG_PHASE_FORWARD));
    CHECK(accumulating_products(&on, TG_PHASE_FORWARD) == 14 && accumulating_products(&off, TG_PHASE_FORWARD) == 0,
          "forward accumulating products: %d folded, %d not", accumulating_products(&on, TG_PHASE_FORWARD),
          accumulating_products(&off, TG_PHASE_FORWARD));
    CHECK(on.n_ops == off.n_ops - 14 && on.n_tensors == off.n_tensors - 28, "ops %d/%d, tensors %d/%d", on.n_ops,
          off.n_ops, on.n_tensors, off.n_tensors);
    CHECK(check_lora_sums(&on, "lora") == 14, "lora sums");
    CHECK(on.flops_per_step <= off.flops_per_step && on.bytes_per_step < off.bytes_per_step,
          "FLOPs %.0f/%.0f, bytes %.0f/%.0f", on.flops_per_step, off.flops_per_step, on.bytes_per_step,
          off.bytes_per_step);
    CHECK(on.peak_bytes <= off.peak_bytes, "planned peak %llu folded, %llu not", (unsigned long long)on.peak_bytes,
          (unsigned long long)off.peak_bytes);
    /* io roles kept, pointing at tensors of the same names. */
    CHECK(!strcmp(on.tensors[on.io.loss].name, off.tensors[off.io.loss].name) &&
              !strcmp(on.tensors[on.io.grads_all].name, "grads.all") &&
              !strcmp(on.tensors[on.io.logits].name, off.tensors[off.io.logits].name),
          "io roles moved");
    check_file_round_trip(&on, "lora");
    tg_plan_free(&on);
    tg_plan_free(&off);
}

/* Models without a product summed into something dead after the sum: the same plan.
 * (GPT-2's residual adds read a product with a bias and a residual stream the backward
 * reads again; its backward sums meet LayerNorm backwards, not products.) */
TG_TEST(test_fuse_sums_leaves_other_models) {
    static const struct {
        const char *job;
        const char *sets[3];
    } cases[] = {
        {"examples/demo-lm.job", {"model=tiny-llama"}},
        {"examples/demo-lm.job", {"precision=bf16"}},
        {"examples/demo-lm.job", {"fuse_residual_layernorm=false", "attention=unfused"}},
        {"examples/demo-classify.job", {NULL}},
        {"examples/demo-mlm.job", {NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = 0;
        while (n < 3 && cases[c].sets[n]) n++;
        tg_plan on, off;
        if (!compile_job(cases[c].job, cases[c].sets, n, 0, &on)) continue;
        if (compile_job(cases[c].job, cases[c].sets, n, 1, &off)) {
            int same = on.n_ops == off.n_ops && on.n_tensors == off.n_tensors;
            for (int o = 0; same && o < on.n_ops; o++) same = !memcmp(&on.ops[o], &off.ops[o], sizeof on.ops[o]);
            CHECK(same, "%s %s: the folding changed a plan with nothing to fold (%d/%d ops, ADDs %d/%d)", cases[c].job,
                  n ? cases[c].sets[0] : "", on.n_ops, off.n_ops, count_kind(&on, TG_OP_ADD, -1),
                  count_kind(&off, TG_OP_ADD, -1));
            tg_plan_free(&off);
        }
        tg_plan_free(&on);
    }
}

/* The job trained `steps` steps folded and not. exact: the same bytes (fp32); else each
 * step's loss within rel_tol and the final parameters within rel_tol (relative L2). */
static void check_same_training(const char *job_path, const char *const *sets, int n_sets, int steps, int exact,
                                double rel_tol) {
    char what[512] = "";
    snprintf(what, sizeof what, "%s", job_path);
    for (int i = 0; i < n_sets; i++) snprintf(what + strlen(what), sizeof what - strlen(what), " %s", sets[i]);
    tg_plan on, off;
    if (!compile_job(job_path, sets, n_sets, 0, &on)) return;
    if (!compile_job(job_path, sets, n_sets, 1, &off)) {
        tg_plan_free(&on);
        return;
    }
    CHECK(count_kind(&on, TG_OP_ADD, -1) < count_kind(&off, TG_OP_ADD, -1), "%s: nothing folded", what);
    check_lora_sums(&on, what);
    check_file_round_trip(&on, what);
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (train_record(&on, steps, &a, &na) && train_record(&off, steps, &b, &nb) && CHECK(na == nb, "%s: sizes", what)) {
        if (exact) {
            size_t at = 0;
            while (at < na && a[at] == b[at]) at++;
            CHECK(at == na, "%s: the runs differ at byte %zu of %zu (losses, gradients, weights, state)", what, at, na);
        } else {
            const size_t grads = on.tensors[on.io.grads_all].bytes, params = on.tensors[on.io.params_all].bytes;
            for (int s = 0; s < steps; s++) {
                float la, lb;
                memcpy(&la, a + (size_t)s * (8 + grads), 4), memcpy(&lb, b + (size_t)s * (8 + grads), 4);
                CHECK(isfinite(la) && fabs((double)la - lb) <= rel_tol * fabs((double)lb),
                      "%s: step %d loss %.7g folded, %.7g not", what, s + 1, la, lb);
            }
            const float *pa = (const float *)(a + (size_t)steps * (8 + grads));
            const float *pb = (const float *)(b + (size_t)steps * (8 + grads));
            double d = 0, r = 0;
            for (size_t i = 0; i < params / 4; i++) d += ((double)pa[i] - pb[i]) * ((double)pa[i] - pb[i]), r += (double)pb[i] * pb[i];
            CHECK(sqrt(d) <= rel_tol * sqrt(r), "%s: parameters differ by %.3g (relative L2)", what, sqrt(d / r));
        }
    }
    free(a), free(b);
    tg_plan_free(&on);
    tg_plan_free(&off);
}

/* fp32: LoRA on every projection (with adapter dropout), on some, with recomputed layers
 * (the copies' sums fold too), with length buckets, for classification: bit for bit. bf16:
 * one rounding fewer per sum, within bf16's tolerance. BERT with separate residual adds
 * and LayerNorms: each LayerNorm output's gradient is the residual's (which the residual
 * add hands to both its inputs, so autodiff sums it with an ADD) plus the first product's
 * input gradient, which now accumulates into the residual's once the dropout backward has
 * read it. */
TG_TEST(test_fuse_sums_trains_the_same) {
    const char *all[] = {"model=tiny-llama", "batch=8", "lora_r=4", "lora_dropout=0.1", ALL_TARGETS};
    check_same_training("examples/demo-lm.job", all, 5, 3, 1, 0);
    const char *some[] = {"model=tiny-llama", "batch=8", "lora_r=2", "lora_targets=q_proj,v_proj,down_proj"};
    check_same_training("examples/demo-lm.job", some, 4, 3, 1, 0);
    const char *layers[] = {"model=tiny-llama", "batch=8", "lora_r=4", "lora_dropout=0.1", ALL_TARGETS,
                            "recompute=layers"};
    check_same_training("examples/demo-lm.job", layers, 6, 2, 1, 0);
    const char *buckets[] = {"model=tiny-llama", "batch=8", "lora_r=2", ALL_TARGETS, "seq_buckets=24,48"};
    check_same_training("examples/demo-lm.job", buckets, 5, 3, 1, 0);
    const char *classify[] = {"model=tiny-llama", "batch=8", "pad_token_id=0", "lora_r=2", ALL_TARGETS};
    check_same_training("examples/demo-classify.job", classify, 5, 2, 1, 0);
    const char *bf16[] = {"model=tiny-llama", "batch=8", "lora_r=4", ALL_TARGETS, "precision=bf16", "lr=2e-2"};
    check_same_training("examples/demo-lm.job", bf16, 6, 4, 0, 2e-2);
    const char *bert[] = {"fuse_residual_layernorm=false", "steps=4"};
    check_same_training("examples/demo-classify.job", bert, 2, 3, 1, 0);
    const char *bert_separate[] = {"fuse_residual_layernorm=false", "fuse_qkv=false", "attention=unfused",
                                   "fuse_bias_grad=false"};
    check_same_training("examples/demo-classify.job", bert_separate, 4, 2, 1, 0);
    const char *bert_bf16[] = {"fuse_residual_layernorm=false", "precision=bf16"};
    check_same_training("examples/demo-classify.job", bert_bf16, 2, 3, 0, 2e-2);
}

/* Plans the runs above do not train, through the file checks: data parallelism with ZeRO-1
 * and gradient buckets, gradient accumulation, fp16 (LoRA on q and v alone: layer 0's
 * attention residual add folds too, its residual being the frozen embedding's output, which
 * no backward op reads), BERT's masked LM with recomputed layers, and the benchmark job (7
 * sums in each of Llama-3-8B's 32 layers). */
TG_TEST(test_fuse_sums_other_plans) {
    static const struct {
        const char *job;
        const char *sets[6];
        int folded, lora_sums;
    } cases[] = {
        {"examples/demo-lm.job", {"model=tiny-llama", "lora_r=2", ALL_TARGETS, "data_parallel=2", "zero_stage=1"}, 14, 14},
        {"examples/demo-lm.job", {"model=tiny-llama", "lora_r=2", ALL_TARGETS, "grad_accumulation=2"}, 14, 14},
        {"examples/demo-lm.job", {"model=tiny-llama", "lora_r=2", "precision=fp16"}, 5, 4},
        {"examples/demo-classify.job", {"fuse_residual_layernorm=false", "data_parallel=2"}, 4, 0},
        {"examples/demo-mlm.job", {"fuse_residual_layernorm=false", "recompute=layers"}, 4, 0},
        {"bench/jobs/llama-3-8b-lora-b1-t4096.job", {"train_data=t.jsonl"}, 224, 224},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = 0;
        while (n < 6 && cases[c].sets[n]) n++;
        tg_plan on, off;
        if (!compile_job(cases[c].job, cases[c].sets, n, 0, &on)) continue;
        if (compile_job(cases[c].job, cases[c].sets, n, 1, &off)) {
            const int a = count_kind(&on, TG_OP_ADD, -1), b = count_kind(&off, TG_OP_ADD, -1);
            CHECK(b - a == cases[c].folded && on.n_ops == off.n_ops - cases[c].folded,
                  "%s %s: %d ADDs folded, %d not (want %d fewer)", cases[c].job, cases[c].sets[0], a, b, cases[c].folded);
            CHECK(check_lora_sums(&on, cases[c].job) == cases[c].lora_sums, "%s %s: LoRA sums", cases[c].job,
                  cases[c].sets[0]);
            tg_plan_free(&off);
        }
        check_file_round_trip(&on, cases[c].job);
        tg_plan_free(&on);
    }
}
