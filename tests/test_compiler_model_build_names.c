/* The tensor names and shapes of the LayerNorms a compiled plan holds (compiler/model_build.c),
 * BERT and GPT-2, with the residual LayerNorm fused and not: each LayerNorm's output is
 * named after its Hugging Face module, its parameters "<module>.weight" and ".bias", its row
 * statistics "<module>.mean" and ".rstd"; the modules are exactly those of the model; and
 * no two tensors of a plan share a name (gradients aside). */
#include <stdio.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

enum { BATCH = 2, SEQ = 16 };

static int compile_fused(const char *preset, int task, int fused, tg_plan *p) {
    tg_model_config cfg;
    tg_err err;
    if (!CHECK(tg_model_config_load(preset, &cfg, &err) == 0, "%s", err.msg)) return 0;
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.model, sizeof job.model, "%s", preset);
    job.task = task, job.batch = BATCH, job.seq = SEQ, job.steps = 1, job.fuse_residual_layernorm = fused;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s: %s", preset, err.msg);
}

static const char *name_of(const tg_plan *p, int t) { return t >= 0 && t < p->n_tensors ? p->tensors[t].name : "(none)"; }

/* Whether tensor t is named prefix + suffix, of ndim dims [d0, d1]. */
static int named(const tg_plan *p, int t, const char *prefix, const char *suffix, int ndim, int64_t d0, int64_t d1) {
    char want[TG_NAME_MAX];
    snprintf(want, sizeof want, "%s%s", prefix, suffix);
    const tg_tensor *x = t >= 0 && t < p->n_tensors ? &p->tensors[t] : NULL;
    return CHECK(x && !strcmp(x->name, want) && x->ndim == ndim && x->shape[0] == d0 && (ndim < 2 || x->shape[1] == d1),
                 "tensor %d is '%s', expected '%s' [%lld%s%lld]", t, name_of(p, t), want, (long long)d0,
                 ndim < 2 ? "" : ", ", ndim < 2 ? 0LL : (long long)d1);
}

/* Checks the LayerNorms of p against the module names `modules` (in forward order). */
static void check_layernorms(const tg_plan *p, const char *const *modules, int n_modules, const char *what) {
    const int64_t N = BATCH * SEQ, D = p->model.hidden;
    int found = 0;
    for (int o = p->phase_begin[TG_PHASE_FORWARD]; o < p->phase_begin[TG_PHASE_FORWARD + 1]; o++) {
        const tg_op *op = &p->ops[o];
        if (op->kind != TG_OP_LAYERNORM && op->kind != TG_OP_RESIDUAL_LAYERNORM) continue;
        const int fused = op->kind == TG_OP_RESIDUAL_LAYERNORM;
        const char *m = found < n_modules ? modules[found] : "(extra)";
        found++;
        named(p, op->out[0], m, "", 2, N, D);
        named(p, op->in[fused ? 2 : 1], m, ".weight", 1, D, 0);
        named(p, op->in[fused ? 3 : 2], m, ".bias", 1, D, 0);
        named(p, op->out[fused ? 2 : 1], m, ".mean", 1, N, 0);
        named(p, op->out[fused ? 3 : 2], m, ".rstd", 1, N, 0);
    }
    CHECK(found == n_modules, "%s: %d LayerNorms, expected %d", what, found, n_modules);
    /* Gradients ("d.<name>") may come in partial sums of the same name; the rest may not. */
    for (int a = 0; a < p->n_tensors; a++)
        for (int b = a + 1; b < p->n_tensors; b++)
            if (strncmp(p->tensors[a].name, "d.", 2) && !strcmp(p->tensors[a].name, p->tensors[b].name))
                CHECK(0, "%s: tensors %d and %d are both named '%s'", what, a, b, p->tensors[a].name);
}

TG_TEST(test_model_build_layernorm_names) {
    for (int fused = 0; fused < 2; fused++) {
        tg_plan p;
        if (!compile_fused("tiny-bert", TG_TASK_CLASSIFY, fused, &p)) return;
        char names[16][TG_NAME_MAX];
        const char *modules[16];
        int n = 0;
        snprintf(names[n++], TG_NAME_MAX, "bert.embeddings.LayerNorm");
        for (int l = 0; l < p.model.layers && n + 2 <= 16; l++) {
            snprintf(names[n++], TG_NAME_MAX, "bert.encoder.layer.%d.attention.output.LayerNorm", l);
            snprintf(names[n++], TG_NAME_MAX, "bert.encoder.layer.%d.output.LayerNorm", l);
        }
        for (int i = 0; i < n; i++) modules[i] = names[i];
        check_layernorms(&p, modules, n, fused ? "tiny-bert, fused" : "tiny-bert");
        tg_plan_free(&p);

        if (!compile_fused("tiny-gpt2", TG_TASK_LM, fused, &p)) return;
        n = 0;
        for (int l = 0; l < p.model.layers && n + 2 <= 15; l++) {
            snprintf(names[n++], TG_NAME_MAX, "transformer.h.%d.ln_1", l);
            snprintf(names[n++], TG_NAME_MAX, "transformer.h.%d.ln_2", l);
        }
        snprintf(names[n++], TG_NAME_MAX, "transformer.ln_f");
        for (int i = 0; i < n; i++) modules[i] = names[i];
        check_layernorms(&p, modules, n, fused ? "tiny-gpt2, fused" : "tiny-gpt2");
        tg_plan_free(&p);
    }
}
