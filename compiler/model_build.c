#include "compiler/model_build.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "compiler/grad_state.h"

typedef struct builder {
    tg_graph *g;
    int64_t B, T, D, H, Dh, N; /* N = B*T rows */
    int fused_attention;       /* one TG_OP_ATTENTION per layer */
    int fused_gelu;            /* the MLP's GELU as the first matmul's epilogue (MATMUL activation) */
    int fused_residual_ln;     /* dropout + residual add + LayerNorm as one op */
    int fuse_qkv;              /* BERT/RoBERTa: query, key and value as one packed product */
} builder;

static int input(tg_graph *g, const char *name, int dtype, int ndim, int64_t d0, int64_t d1) {
    int64_t shape[2] = {d0, d1};
    int t = tg_graph_tensor(g, name, dtype, TG_POOL_INPUTS, ndim, shape);
    if (t >= 0) g->tensors[t].flags |= TG_TENSOR_INPUT;
    return t;
}

/* BERT's attention projections, in the order of the packed [3D, D] weight's rows. */
static const char *const qkv_names[3] = {"query", "key", "value"};

/* The product of a linear layer: y = x W^T + b (nn.Linear, weight [out,in]) or y = x W + b
 * (GPT-2 Conv1D, weight [in,out]); bias -1 for none. With gelu_name, the product is the
 * pre-activation (out2, named `name`) and the op returns the tanh GELU of it (out0, named
 * gelu_name): MATMUL's GELU epilogue, activation 1. */
static int linear_apply(builder *b, const char *name, int x, int w, int bias, int64_t rows, int64_t in,
                        int64_t out, int conv1d, const char *gelu_name) {
    tg_graph *g = b->g;
    int y = tg_act(g, name, 2, rows, out, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = w, s.in[2] = bias, s.out[0] = y;
    tg_matmul_params *mm = &s.p.matmul;
    mm->m = rows, mm->n = out, mm->k = in, mm->trans_a = 0, mm->trans_b = !conv1d, mm->batch = 1;
    mm->alpha = 1.0f;
    if (gelu_name) {
        s.out[2] = y;
        s.out[0] = y = tg_act(g, gelu_name, 2, rows, out, 0, 0);
        mm->activation = TG_MATMUL_ACT_GELU;
    }
    tg_graph_op(g, &s);
    return y;
}

/* A linear layer's parameters `prefix.weight` and `prefix.bias` (none: *bias = -1). */
static int linear_params(builder *b, const char *prefix, int64_t in, int64_t out, int conv1d, int with_bias,
                         float init_scale, int *bias) {
    tg_graph *g = b->g;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.weight", prefix);
    int w = conv1d ? tg_param(g, name, 2, in, out, TG_INIT_NORMAL, 0)
                   : tg_param(g, name, 2, out, in, TG_INIT_NORMAL, 0);
    if (w >= 0) g->tensors[w].init_std *= init_scale;
    *bias = -1;
    if (with_bias) {
        snprintf(name, sizeof name, "%s.bias", prefix);
        *bias = tg_param(g, name, 1, out, 0, TG_INIT_ZEROS, 1);
    }
    return w;
}

static int linear_act(builder *b, const char *prefix, int x, int64_t rows, int64_t in, int64_t out, int conv1d,
                      int with_bias, float init_scale, const char *gelu_name) {
    int bias;
    int w = linear_params(b, prefix, in, out, conv1d, with_bias, init_scale, &bias);
    return linear_apply(b, prefix, x, w, bias, rows, in, out, conv1d, gelu_name);
}

static int linear(builder *b, const char *prefix, int x, int64_t rows, int64_t in, int64_t out,
                  int conv1d, int with_bias, float init_scale) {
    return linear_act(b, prefix, x, rows, in, out, conv1d, with_bias, init_scale, NULL);
}

/* BERT's query, key and value projections as one product [N, D] x [3D, D]^T + [3D] ->
 * [N, 3D] (q | k | v per row, GPT-2's c_attn layout). The three nn.Linear parameters
 * keep their names and init; packed groups lay them out as one weight [3D, D] (rows
 * query, key, value) and one bias [3D], which the product reads through views. */
static int qkv_packed(builder *b, const char *prefix, int x) {
    int w[3], bias[3];
    char name[TG_NAME_MAX];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "%s.%s", prefix, qkv_names[i]);
        w[i] = linear_params(b, name, b->D, b->D, 0, 1, 1.0f, &bias[i]);
    }
    snprintf(name, sizeof name, "%s.qkv.weight", prefix);
    int wv = tg_param_pack(b->g, name, w, 3, 2, 3 * b->D, b->D);
    snprintf(name, sizeof name, "%s.qkv.bias", prefix);
    int bv = tg_param_pack(b->g, name, bias, 3, 1, 3 * b->D, 0);
    snprintf(name, sizeof name, "%s.qkv", prefix);
    return linear_apply(b, name, x, wv, bv, b->N, b->D, 3 * b->D, 0, NULL);
}

/* A LayerNorm's parameters (HF names "<prefix>.weight" and ".bias") and outputs: y named
 * after the module, its row mean and rstd. */
typedef struct ln_tensors {
    int gamma, beta, y, mean, rstd;
} ln_tensors;

static ln_tensors ln_tensors_of(builder *b, const char *prefix, int64_t rows) {
    tg_graph *g = b->g;
    char name[TG_NAME_MAX];
    ln_tensors t;
    snprintf(name, sizeof name, "%s.weight", prefix);
    t.gamma = tg_param(g, name, 1, b->D, 0, TG_INIT_ONES, 1);
    snprintf(name, sizeof name, "%s.bias", prefix);
    t.beta = tg_param(g, name, 1, b->D, 0, TG_INIT_ZEROS, 1);
    t.y = tg_act(g, prefix, 2, rows, b->D, 0, 0);
    snprintf(name, sizeof name, "%s.mean", prefix);
    t.mean = tg_act(g, name, 1, rows, 0, 0, 0);
    snprintf(name, sizeof name, "%s.rstd", prefix);
    t.rstd = tg_act(g, name, 1, rows, 0, 0, 0);
    return t;
}

static int layernorm(builder *b, const char *prefix, int x, int64_t rows) {
    tg_graph *g = b->g;
    ln_tensors t = ln_tensors_of(b, prefix, rows);
    tg_op_spec s = tg_spec(TG_OP_LAYERNORM);
    s.in[0] = x, s.in[1] = t.gamma, s.in[2] = t.beta;
    s.out[0] = t.y, s.out[1] = t.mean, s.out[2] = t.rstd;
    s.p.layernorm.m = rows, s.p.layernorm.d = b->D;
    s.p.layernorm.eps = g->cfg->layer_norm_eps;
    tg_graph_op(g, &s);
    return t.y;
}

/* GELU (of the model's form) or TANH of x. */
static int unary(builder *b, int kind, const char *name, int x) {
    tg_graph *g = b->g;
    if (x < 0) return -1; /* an earlier failure, already recorded */
    const tg_tensor *src = &g->tensors[x];
    int y = tg_graph_tensor(g, name, TG_F32, TG_POOL_ACTIVATIONS, src->ndim, src->shape);
    tg_op_spec s = tg_spec(kind);
    s.in[0] = x, s.out[0] = y;
    const int64_t n = tg_tensor_numel(&g->tensors[x]);
    if (kind == TG_OP_GELU) s.p.gelu.n = n, s.p.gelu.form = g->cfg->gelu;
    else s.p.count.n = n;
    tg_graph_op(g, &s);
    return y;
}

/* The MLP's first projection and its GELU over the N rows: one matmul with the GELU
 * epilogue when the builder fuses it, else the matmul and a GELU op. Either way the
 * product is named prefix and the activation gelu_name. */
static int linear_gelu(builder *b, const char *prefix, const char *gelu_name, int x, int64_t in, int64_t out,
                       int conv1d) {
    if (b->fused_gelu) return linear_act(b, prefix, x, b->N, in, out, conv1d, 1, 1.0f, gelu_name);
    int y = linear(b, prefix, x, b->N, in, out, conv1d, 1, 1.0f);
    return unary(b, TG_OP_GELU, gelu_name, y);
}

/* Dropout with probability p; no op at all when p is 0. */
static int dropout(builder *b, const char *name, int x, float p) {
    tg_graph *g = b->g;
    if (p <= 0.0f || x < 0) return x;
    const tg_tensor *src = &g->tensors[x];
    int y = tg_graph_tensor(g, name, TG_F32, TG_POOL_ACTIVATIONS, src->ndim, src->shape);
    tg_op_spec s = tg_spec(TG_OP_DROPOUT);
    s.in[0] = x, s.in[1] = g->io.step, s.out[0] = y;
    s.p.dropout.n = tg_tensor_numel(&g->tensors[x]);
    s.p.dropout.key = g->dropout_key++;
    s.p.dropout.p = p;
    tg_graph_op(g, &s);
    return y;
}

static int add(builder *b, const char *name, int x, int y) {
    tg_graph *g = b->g;
    if (x < 0) return -1; /* an earlier failure, already recorded */
    const tg_tensor *src = &g->tensors[x];
    int z = tg_graph_tensor(g, name, TG_F32, TG_POOL_ACTIVATIONS, src->ndim, src->shape);
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = x, s.in[1] = y, s.out[0] = z;
    s.p.count.n = tg_tensor_numel(&g->tensors[x]); /* src moved if the new tensor grew the table */
    tg_graph_op(g, &s);
    return z;
}

/* The residual connection of a block followed by a LayerNorm: s = dropout(x) + r (named
 * `residual`, *s_out) and y = LayerNorm(s) (module `ln`, returned). With the job's
 * fuse_residual_layernorm one RESIDUAL_LAYERNORM, else DROPOUT (none when p is 0), ADD
 * and LAYERNORM. Both take the dropout's stream key at the same point, create the
 * parameters in the same order and draw the same elements, so their masks and parameter
 * layouts are the same. */
static int residual_layernorm(builder *b, const char *dropout_name, const char *residual, const char *ln, int x,
                              int r, float p, int *s_out) {
    tg_graph *g = b->g;
    if (!b->fused_residual_ln) {
        *s_out = add(b, residual, dropout(b, dropout_name, x, p), r);
        return layernorm(b, ln, *s_out, b->N);
    }
    int64_t key = p > 0.0f ? g->dropout_key++ : 0;
    ln_tensors t = ln_tensors_of(b, ln, b->N);
    int sum = tg_act(g, residual, 2, b->N, b->D, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_RESIDUAL_LAYERNORM);
    s.in[0] = x, s.in[1] = r, s.in[2] = t.gamma, s.in[3] = t.beta, s.in[4] = p > 0.0f ? g->io.step : -1;
    s.out[0] = t.y, s.out[1] = sum, s.out[2] = t.mean, s.out[3] = t.rstd;
    tg_residual_layernorm_params *rl = &s.p.residual_layernorm;
    rl->m = b->N, rl->d = b->D, rl->key = key;
    rl->eps = g->cfg->layer_norm_eps, rl->p = p > 0.0f ? p : 0.0f;
    tg_graph_op(g, &s);
    *s_out = sum;
    return t.y;
}

/* ---- LoRA ------------------------------------------------------------------------------- */

/* The modules LoRA adapts in a family, by the last part of their Hugging Face module path:
 * PEFT matches a target_modules name against a module whose path is the name or ends with
 * "." + the name, so "dense" is every module of that name. BERT and RoBERTa: query, key and
 * value (attention.self), and dense: attention.output.dense, intermediate.dense and
 * output.dense in each layer, BERT's pooler.dense (classification) and the masked-LM
 * head's transform dense (cls.predictions.transform.dense, RoBERTa's lm_head.dense). A
 * classification or span head is PEFT's modules_to_save, which no adapter targets
 * (RoBERTa's classifier.dense stays out) and which trains whole. GPT-2: c_attn (q, k and v
 * as one Conv1D, one pair of out 3 x hidden), c_proj (attn.c_proj and mlp.c_proj), c_fc.
 * Llama: the seven projections. The defaults are PEFT's
 * (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING). */
typedef struct lora_family {
    const char *defaults;
    const char *const *modules;
    int n_modules;
} lora_family;

static lora_family lora_family_of(int arch) {
    static const char *const encoder[] = {"query", "key", "value", "dense"};
    static const char *const gpt2[] = {"c_attn", "c_proj", "c_fc"};
    static const char *const llama[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (arch == TG_ARCH_GPT2) return (lora_family){"c_attn", gpt2, 3};
    if (arch == TG_ARCH_LLAMA) return (lora_family){"q_proj,v_proj", llama, 7};
    return (lora_family){"query,value", encoder, 4};
}

/* The next name of a comma-separated list at *p (blanks around names skipped): its start
 * and length, *p moved past it; NULL at the list's end. */
static const char *next_name(const char **p, size_t *len) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t' || *s == ',') s++;
    const char *start = s;
    while (*s && *s != ',' && *s != ' ' && *s != '\t') s++;
    *p = s, *len = (size_t)(s - start);
    return s > start ? start : NULL;
}

/* The job's LoRA targets: its lora_targets, or the family's default. */
static const char *lora_targets(const tg_graph *g) {
    return g->job->lora_targets[0] ? g->job->lora_targets : lora_family_of(g->cfg->arch).defaults;
}

/* Whether target t[0, len) names the module at `path` as PEFT's target_modules do: the
 * whole path, or its tail after a dot (`c_proj` and `mlp.c_proj` name
 * transformer.h.0.mlp.c_proj; `h.0.mlp.c_proj` only layer 0's). */
static int names_module(const char *t, size_t len, const char *path) {
    const size_t n = strlen(path);
    return n >= len && !strncmp(path + n - len, t, len) && (n == len || path[n - len - 1] == '.');
}

/* The last part of target t[0, len): its module name. */
static const char *target_module(const char *t, size_t len, size_t *mlen) {
    const char *m = t + len;
    while (m > t && m[-1] != '.') m--;
    *mlen = (size_t)(t + len - m);
    return m;
}

/* Whether the module at `path` (its whole path) is a LoRA target; counts the targets that
 * name it (g->lora_hits). */
static int lora_target(tg_graph *g, const char *path) {
    if (g->job->lora_r <= 0) return 0;
    size_t len;
    const char *p = lora_targets(g), *t;
    int hit = 0;
    for (int k = 0; (t = next_name(&p, &len)); k++)
        if (names_module(t, len, path)) {
            hit = 1;
            if (k < 64) g->lora_hits[k]++;
        }
    return hit;
}

/* Whether some target names a module called `module` (the models make q, k and v, or gate
 * and up, apart for any adapter on one of them). */
static int lora_module_targeted(const tg_graph *g, const char *module) {
    if (g->job->lora_r <= 0) return 0;
    size_t len, mlen;
    const char *p = lora_targets(g), *t;
    while ((t = next_name(&p, &len))) {
        const char *m = target_module(t, len, &mlen);
        if (mlen == strlen(module) && !strncmp(m, module, mlen)) return 1;
    }
    return 0;
}

/* After the build: a target that named no module is refused, naming a module of its kind. */
static int lora_check_hits(tg_graph *g) {
    if (g->job->lora_r <= 0) return 0;
    size_t len, mlen;
    const char *p = lora_targets(g), *t;
    for (int k = 0; (t = next_name(&p, &len)) && k < 64; k++) {
        if (g->lora_hits[k]) continue;
        const char *m = target_module(t, len, &mlen);
        const char *example = NULL;
        for (int x = 0; x < g->n_tensors && !example; x++) {
            const char *name = g->tensors[x].name, *w = strstr(name, ".weight");
            if (w && !w[7] && w - name > (ptrdiff_t)mlen && !strncmp(w - mlen, m, mlen) && w[-(ptrdiff_t)mlen - 1] == '.')
                example = name;
        }
        char like[TG_NAME_MAX + 40] = "";
        if (example) snprintf(like, sizeof like, " (its modules are such as %.*s)", (int)(strlen(example) - 7), example);
        return tg_graph_job_fail(g, TG_JOB_LORA_TARGETS, "'%.*s' names no module of the model%s", (int)len, t, like);
    }
    return 0;
}

/* Whether some name of lora_modules_to_save ends in module `module` (its last part): the
 * models make q, k and v, or gate and up, apart then, so that one of them trains whole
 * while the others stay frozen. */
static int lora_module_saved(const tg_graph *g, const char *module) {
    if (g->job->lora_r <= 0) return 0;
    size_t len, mlen;
    const char *p = g->job->lora_modules_to_save, *t;
    while ((t = next_name(&p, &len))) {
        const char *m = target_module(t, len, &mlen);
        if (mlen == strlen(module) && !strncmp(m, module, mlen)) return 1;
    }
    return 0;
}

static int edit_distance(const char *a, size_t na, const char *b, size_t nb) {
    int row[TG_NAME_MAX + 1];
    if (na > TG_NAME_MAX || nb > TG_NAME_MAX) return 1 << 20;
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            const int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best, diag = up;
        }
    }
    return row[nb];
}

/* After the build: a name of lora_modules_to_save that named no module is refused, naming
 * a module of the model of its kind: one whose last part is the name's (a dotted tail that
 * narrowed to nothing), else the one whose last part is nearest in spelling. */
static int lora_check_saved(tg_graph *g) {
    if (g->job->lora_r <= 0) return 0;
    size_t len, mlen;
    const char *p = g->job->lora_modules_to_save, *t;
    for (int k = 0; (t = next_name(&p, &len)) && k < 64; k++) {
        if (g->save_hits[k]) continue;
        const char *m = target_module(t, len, &mlen);
        int best = -1, best_d = 1 << 20;
        size_t best_len = 0;
        for (int x = 0; x < g->n_tensors && best_d; x++) {
            const tg_tensor *tt = &g->tensors[x];
            if (!(tt->flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN)) || (tt->flags & TG_TENSOR_VIEW)) continue;
            const char *name = tt->name, *end = strrchr(name, '.'), *last = end;
            if (!end) continue;
            while (last > name && last[-1] != '.') last--;
            const int d = edit_distance(m, mlen, last, (size_t)(end - last));
            if (d < best_d) best_d = d, best = x, best_len = (size_t)(end - name);
        }
        char like[TG_NAME_MAX + 40] = "";
        if (best >= 0) snprintf(like, sizeof like, " (its modules are such as %.*s)", (int)best_len, g->tensors[best].name);
        return tg_graph_job_fail(g, TG_JOB_LORA_MODULES_TO_SAVE, "'%.*s' names no module of the model%s", (int)len, t,
                                 like);
    }
    return 0;
}

/* The LM head's weight tied to the input embeddings (HF tie_word_embeddings), as module
 * paths: the decoder module and the table's module; NULL when the job's model has none. */
static const char *tied_decoder(const tg_graph *g, const char **table) {
    const tg_model_config *c = g->cfg;
    const int task = g->job->task;
    *table = NULL;
    if (task == TG_TASK_LM && c->arch == TG_ARCH_GPT2) return *table = "transformer.wte", "lm_head";
    if (task == TG_TASK_LM && c->arch == TG_ARCH_LLAMA && c->tie_word_embeddings)
        return *table = "model.embed_tokens", "lm_head";
    if (task == TG_TASK_MLM && c->arch == TG_ARCH_ROBERTA)
        return *table = "roberta.embeddings.word_embeddings", "lm_head.decoder";
    if (task == TG_TASK_MLM && c->arch == TG_ARCH_BERT)
        return *table = "bert.embeddings.word_embeddings", "cls.predictions.decoder";
    return NULL;
}

/* The module of `path` (a dotted name) or one holding it, if list names any: the path's
 * prefix it names (at a dot or the whole), into out; 0 if none. */
static int names_path_or_holder(const char *list, const char *path, char *out, size_t cap, const char **name,
                                size_t *name_len) {
    size_t len;
    const char *p = list, *t;
    while ((t = next_name(&p, &len)))
        for (size_t n = strlen(path); n > 0; n--) {
            if (n != strlen(path) && path[n] != '.') continue;
            snprintf(out, cap, "%.*s", (int)n, path);
            if (names_module(t, len, out)) {
                *name = t, *name_len = len;
                return 1;
            }
        }
    return 0;
}

/* lora_modules_to_save may name neither the tied LM head's decoder nor the embeddings it is
 * tied to, nor a module holding either: PEFT keeps a module it saves apart from the weights
 * tied to it, so its model with the adapter would compute the head from a copy the other
 * side of the tie (PEFT 0.21.2 does, even with ensure_weight_tying:
 * tests/golden/peft_export_check.sh), not what trained here. */
static int lora_check_tied(tg_graph *g) {
    const char *table, *decoder = tied_decoder(g, &table);
    if (!decoder || g->job->lora_r <= 0) return 0;
    char path[TG_NAME_MAX];
    const char *t;
    size_t len;
    if (names_path_or_holder(g->job->lora_modules_to_save, decoder, path, sizeof path, &t, &len))
        return tg_graph_job_fail(g, TG_JOB_LORA_MODULES_TO_SAVE,
                                 "'%.*s' names %s, which holds the LM head's decoder, tied to %s: PEFT would keep a "
                                 "saved copy apart from the embeddings; with LoRA the tied head and table stay frozen",
                                 (int)len, t, path, table);
    if (names_path_or_holder(g->job->lora_modules_to_save, table, path, sizeof path, &t, &len))
        return tg_graph_job_fail(g, TG_JOB_LORA_MODULES_TO_SAVE,
                                 "'%.*s' names %s, which holds %s, tied to the LM head (%s): PEFT would keep a saved "
                                 "copy apart from the head, which would read the untrained table; with LoRA the tied "
                                 "head and table stay frozen",
                                 (int)len, t, path, table, decoder);
    return 0;
}

/* With LoRA, every target the job names must be a module the family adapts: the first that
 * is not is refused, naming the family's modules. Also freezes the base (held in the plan's
 * storage type, no master, no state). */
static int lora_setup(tg_graph *g) {
    const tg_job *j = g->job;
    g->base_frozen = j->lora_r > 0;
    if (j->lora_r <= 0) return 0;
    const lora_family f = lora_family_of(g->cfg->arch);
    size_t len;
    const char *p = lora_targets(g), *t;
    while ((t = next_name(&p, &len))) {
        size_t mlen;
        const char *m = target_module(t, len, &mlen);
        int found = 0;
        for (int k = 0; k < f.n_modules && !found; k++) found = strlen(f.modules[k]) == mlen && !strncmp(m, f.modules[k], mlen);
        if (found) continue;
        char known[128] = "";
        for (int k = 0; k < f.n_modules; k++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", k ? ", " : "", f.modules[k]);
        return tg_graph_job_fail(g, TG_JOB_LORA_TARGETS, "'%.*s' is not a module LoRA adapts in the %s family (%s)",
                                 (int)len, t, tg_arch_name(g->cfg->arch), known);
    }
    return 0;
}

/* x [rows, in] through the LoRA pair of module `prefix` (PEFT's names: prefix.lora_A.weight
 * [r, in], uniform in +-1/sqrt(in), and prefix.lora_B.weight [out, r], zeros, whatever the
 * layout of the base weight), added to the module's product y [rows, out]:
 * y + (alpha / r) B A dropout(x). Returns the sum. */
static int lora_add(builder *b, const char *prefix, int x, int y, int64_t rows, int64_t in, int64_t out) {
    tg_graph *g = b->g;
    const tg_job *j = g->job;
    char name[TG_NAME_MAX];
    /* PEFT wraps a module either way, not both: its adapter or its whole copy. */
    if (tg_graph_saves_module(g, prefix))
        return tg_graph_job_fail(g, TG_JOB_LORA_MODULES_TO_SAVE,
                                 "names %s (or a module holding it), which lora_targets adapts: a module trains "
                                 "through its adapter or whole, not both",
                                 prefix);
    g->adapter = 1;
    snprintf(name, sizeof name, "%s.lora_A.weight", prefix);
    int a = tg_param(g, name, 2, j->lora_r, in, TG_INIT_UNIFORM, 0);
    if (a >= 0) g->tensors[a].init_std = 1.0f / sqrtf((float)in);
    snprintf(name, sizeof name, "%s.lora_B.weight", prefix);
    int bw = tg_param(g, name, 2, out, j->lora_r, TG_INIT_ZEROS, 0);
    g->adapter = 0;
    snprintf(name, sizeof name, "%s.lora_dropout", prefix);
    int xin = dropout(b, name, x, j->lora_dropout);
    snprintf(name, sizeof name, "%s.lora_A", prefix);
    int t = linear_apply(b, name, xin, a, -1, rows, in, j->lora_r, 0, NULL);
    snprintf(name, sizeof name, "%s.lora_B", prefix);
    int d = tg_act(g, name, 2, rows, out, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = t, s.in[1] = bw, s.out[0] = d;
    s.p.matmul.m = rows, s.p.matmul.n = out, s.p.matmul.k = j->lora_r, s.p.matmul.trans_b = 1;
    s.p.matmul.batch = 1, s.p.matmul.alpha = j->lora_alpha / (float)j->lora_r;
    tg_graph_op(g, &s);
    snprintf(name, sizeof name, "%s.lora_sum", prefix);
    return add(b, name, y, d);
}

/* A linear layer `prefix` (as linear()) with its LoRA pair when the job targets it. */
static int adapted_linear(builder *b, const char *prefix, int x, int64_t rows, int64_t in, int64_t out, int conv1d,
                          int with_bias, float init_scale) {
    int y = linear(b, prefix, x, rows, in, out, conv1d, with_bias, init_scale);
    return y >= 0 && lora_target(b->g, prefix) ? lora_add(b, prefix, x, y, rows, in, out) : y;
}

/* linear_gelu with its LoRA pair when the job targets it: the adapter adds to the
 * pre-activation, so the GELU is an op of its own then (not the matmul's epilogue). */
static int adapted_linear_gelu(builder *b, const char *prefix, const char *gelu_name, int x, int64_t in, int64_t out,
                               int conv1d) {
    if (!lora_target(b->g, prefix)) return linear_gelu(b, prefix, gelu_name, x, in, out, conv1d);
    return unary(b, TG_OP_GELU, gelu_name, adapted_linear(b, prefix, x, b->N, in, out, conv1d, 1, 1.0f));
}

static int embedding(builder *b, const char *name, int ids, int64_t vocab, int padding_idx, int *table_out) {
    tg_graph *g = b->g;
    int table = tg_param(g, name, 2, vocab, b->D, TG_INIT_NORMAL, 0);
    if (table_out) *table_out = table;
    char out_name[TG_NAME_MAX];
    snprintf(out_name, sizeof out_name, "%s.out", name);
    int y = tg_act(g, out_name, 2, b->N, b->D, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_EMBEDDING);
    s.in[0] = ids, s.in[1] = table, s.out[0] = y;
    s.p.embedding.n = b->N, s.p.embedding.vocab = vocab, s.p.embedding.dim = b->D;
    s.p.embedding.padding_idx = padding_idx;
    tg_graph_op(g, &s);
    return y;
}

static int heads_op(builder *b, int kind, const int *in, int n_in, int *out, int parts, const char *prefix) {
    tg_graph *g = b->g;
    tg_op_spec s = tg_spec(kind);
    for (int i = 0; i < n_in; i++) s.in[i] = in[i];
    static const char *const qkv_parts[3] = {"q", "k", "v"};
    if (kind == TG_OP_HEADS_SPLIT) {
        for (int p = 0; p < parts; p++) {
            char name[TG_NAME_MAX];
            snprintf(name, sizeof name, "%s.%s", prefix, parts == 3 ? qkv_parts[p] : "heads");
            out[p] = tg_act(g, name, 4, b->B, b->H, b->T, b->Dh);
            s.out[p] = out[p];
        }
    } else {
        out[0] = tg_act(g, prefix, 2, b->N, parts * b->D, 0, 0);
        s.out[0] = out[0];
    }
    tg_heads_params *hp = &s.p.heads;
    hp->b = b->B, hp->t = b->T, hp->h = b->H, hp->head_dim = b->Dh, hp->parts = parts;
    return tg_graph_op(g, &s);
}

/* softmax(q k^T * scale + mask) v over heads; q, k, v are [B,H,T,Dh]. Returns [B*T, D]. */
static int attention_unfused(builder *b, const char *prefix, int q, int k, int v, int causal, float attn_p) {
    tg_graph *g = b->g;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.scores", prefix);
    int scores = tg_act(g, name, 4, b->B, b->H, b->T, b->T);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = q, s.in[1] = k, s.out[0] = scores;
    s.p.matmul.m = b->T, s.p.matmul.n = b->T, s.p.matmul.k = b->Dh, s.p.matmul.trans_b = 1;
    s.p.matmul.batch = b->B * b->H, s.p.matmul.alpha = 1.0f;
    tg_graph_op(g, &s);

    /* One op writes the probabilities (kept for the backward) and, with attention
     * dropout, the dropped probabilities the PV product reads: the [B,H,T,T] tensor is
     * not read and written again by a separate DROPOUT op. The stream key is taken here,
     * where the DROPOUT op took it, so every mask is unchanged. */
    snprintf(name, sizeof name, "%s.probs", prefix);
    int probs = tg_act(g, name, 4, b->B, b->H, b->T, b->T);
    s = tg_spec(TG_OP_ATTN_SOFTMAX);
    s.in[0] = scores, s.in[1] = g->io.attention_mask, s.out[0] = probs;
    tg_softmax_params *sm = &s.p.softmax;
    sm->b = b->B, sm->h = b->H, sm->t = b->T, sm->causal = causal;
    sm->scale = 1.0f / sqrtf((float)b->Dh);
    if (attn_p > 0.0f) {
        snprintf(name, sizeof name, "%s.probs_dropout", prefix);
        int dropped = tg_act(g, name, 4, b->B, b->H, b->T, b->T);
        s.in[2] = g->io.step, s.out[1] = dropped;
        sm->key = g->dropout_key++;
        sm->p = attn_p;
        probs = dropped;
    }
    tg_graph_op(g, &s);

    snprintf(name, sizeof name, "%s.context", prefix);
    int ctx = tg_act(g, name, 4, b->B, b->H, b->T, b->Dh);
    s = tg_spec(TG_OP_MATMUL);
    s.in[0] = probs, s.in[1] = v, s.out[0] = ctx;
    s.p.matmul.m = b->T, s.p.matmul.n = b->Dh, s.p.matmul.k = b->T;
    s.p.matmul.batch = b->B * b->H, s.p.matmul.alpha = 1.0f;
    tg_graph_op(g, &s);

    int merged;
    snprintf(name, sizeof name, "%s.context_merged", prefix);
    heads_op(b, TG_OP_HEADS_MERGE, &ctx, 1, &merged, 1, name);
    return merged;
}

/* The same attention as one TG_OP_ATTENTION, reading the projections' [B*T, D] outputs
 * directly (qkv[0] alone when packed: GPT-2's c_attn [B*T, 3D]). Returns O [B*T, D]. The
 * dropout stream key is taken where the unfused path takes it and the op draws the same
 * element indices, so the masks are the same. */
static int attention_fused(builder *b, const char *prefix, const int *qkv, int packed, int causal, float attn_p) {
    tg_graph *g = b->g;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.context", prefix);
    int out = tg_act(g, name, 2, b->N, b->D, 0, 0);
    snprintf(name, sizeof name, "%s.lse", prefix);
    int lse = tg_act(g, name, 3, b->B, b->H, b->T, 0);
    tg_op_spec s = tg_spec(TG_OP_ATTENTION);
    for (int p = 0; p < (packed ? 1 : 3); p++) s.in[p] = qkv[p];
    s.in[3] = g->io.attention_mask;
    s.out[0] = out, s.out[1] = lse;
    tg_attention_params *at = &s.p.attention;
    at->b = b->B, at->h = b->H, at->t = b->T, at->causal = causal, at->packed = packed, at->head_dim = b->Dh;
    at->scale = 1.0f / sqrtf((float)b->Dh);
    if (attn_p > 0.0f) {
        /* The keep bits the backward reads instead of drawing the mask again. */
        snprintf(name, sizeof name, "%s.keep_bits", prefix);
        int64_t shape[4] = {b->B, b->H, b->T, (b->T + 31) / 32};
        s.out[2] = tg_graph_tensor(g, name, TG_I32, TG_POOL_ACTIVATIONS, 4, shape);
        s.in[4] = g->io.step;
        at->key = g->dropout_key++;
        at->p = attn_p;
    }
    tg_graph_op(g, &s);
    return out;
}

/* A head's logits and loss become the plan's outputs; the loss, or -1 after an earlier
 * failure (already recorded). */
static int head_outputs(tg_graph *g, int logits, int loss) {
    if (logits < 0 || loss < 0) return -1;
    g->tensors[logits].flags |= TG_TENSOR_OUTPUT;
    g->tensors[loss].flags |= TG_TENSOR_OUTPUT;
    g->io.logits = logits;
    g->io.loss = loss;
    return loss;
}

/* Cross-entropy loss over logits [rows, width] whose first `classes` columns count, against
 * `labels` (the batch's, or the masking op's). */
static int loss_of(builder *b, int logits, int labels, int64_t rows, int64_t width, int64_t classes) {
    tg_graph *g = b->g;
    int loss = tg_act(g, "loss", 1, 1, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_CROSS_ENTROPY);
    s.in[0] = logits, s.in[1] = labels, s.in[2] = g->io.loss_norm, s.out[0] = loss;
    s.out[1] = tg_act(g, "loss.lse", 2, rows, 2, 0, 0); /* read by the backward (ops.def) */
    s.p.cross_entropy.n = rows, s.p.cross_entropy.c = width;
    s.p.cross_entropy.classes = classes < width ? classes : 0;
    tg_graph_op(g, &s);
    return head_outputs(g, logits, loss);
}

/* BertForQuestionAnswering / RobertaForQuestionAnswering: qa_outputs, Linear(D, 2) on
 * every token (column 0 the start logit, column 1 the end logit), and the span loss. No
 * pooler, no dropout. */
static int span_head(builder *b, int h) {
    tg_graph *g = b->g;
    g->adapter = 1; /* with LoRA the head trains whole (PEFT's modules_to_save for QUESTION_ANS) */
    int logits = linear(b, "qa_outputs", h, b->N, b->D, 2, 0, 1, 1.0f);
    g->adapter = 0;
    int loss = tg_act(g, "loss", 1, 1, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_SPAN_LOSS);
    s.in[0] = logits, s.in[1] = g->io.labels, s.in[2] = g->io.loss_norm, s.out[0] = loss;
    s.p.span_loss.b = b->B, s.p.span_loss.t = b->T;
    tg_graph_op(g, &s);
    return head_outputs(g, logits, loss);
}

static int select_token(builder *b, const char *name, int x, int mode, int pad_id) {
    tg_graph *g = b->g;
    int y = tg_act(g, name, 2, b->B, b->D, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_SELECT_TOKEN);
    s.in[0] = x, s.in[1] = g->io.input_ids, s.out[0] = y;
    tg_select_params *sp = &s.p.select;
    sp->b = b->B, sp->t = b->T, sp->d = b->D, sp->mode = mode, sp->pad_id = pad_id;
    tg_graph_op(g, &s);
    return y;
}

void tg_mlm_token_ids(const tg_job *job, const tg_model_config *cfg, int pad_id, int32_t *mask_id,
                      int32_t special[TG_JOB_SPECIAL_IDS_MAX]) {
    const int roberta = cfg->arch == TG_ARCH_ROBERTA;
    *mask_id = job->mask_token_id >= 0 ? job->mask_token_id : roberta ? cfg->vocab_size - 1 : 103;
    const int32_t bert[] = {pad_id, 100, 101, 102}, roberta_ids[] = {0, pad_id, 2, 3};
    for (int i = 0; i < TG_JOB_SPECIAL_IDS_MAX; i++)
        special[i] = job->n_special_ids >= 0 ? job->special_ids[i] : i < 4 ? (roberta ? roberta_ids : bert)[i] : -1;
}

/* task = mlm: the batch's ids masked on the device (TG_OP_MLM_MASK); *labels gets the
 * labels tensor it writes. Returns the masked ids, which the embedding reads. */
static int mlm_mask(builder *b, int pad_id, int *labels) {
    tg_graph *g = b->g;
    int64_t shape[2] = {b->B, b->T};
    int ids = tg_graph_tensor(g, "mlm.input_ids", TG_I32, TG_POOL_ACTIVATIONS, 2, shape);
    *labels = tg_graph_tensor(g, "mlm.labels", TG_I32, TG_POOL_ACTIVATIONS, 2, shape);
    tg_op_spec s = tg_spec(TG_OP_MLM_MASK);
    s.in[0] = g->io.input_ids, s.in[1] = g->io.attention_mask, s.in[2] = g->io.step, s.in[3] = g->io.mlm_stream;
    s.out[0] = ids, s.out[1] = *labels;
    tg_mlm_mask_params *mp = &s.p.mlm_mask;
    int32_t mask_id, special[TG_JOB_SPECIAL_IDS_MAX];
    tg_mlm_token_ids(g->job, g->cfg, pad_id, &mask_id, special);
    mp->n = b->N, mp->vocab = g->cfg->vocab_size, mp->key = g->dropout_key++, mp->mask_id = mask_id;
    mp->p = g->job->mlm_probability;
    mp->special0 = special[0], mp->special1 = special[1], mp->special2 = special[2];
    mp->special3 = special[3], mp->special4 = special[4];
    tg_graph_op(g, &s);
    return ids;
}

/* The masked-LM head over the encoder's output h [N, D]: HF's BertLMPredictionHead
 * (cls.predictions: transform.dense, the config's activation, transform.LayerNorm, the
 * decoder tied to the word embeddings, bias) or RobertaLMHead (lm_head: dense, the exact
 * GELU whatever the config says, layer_norm, the tied decoder, bias). Returns the logits
 * [N, V]. The head's GELU is an op of its own (never the matmul epilogue), so its form is
 * the one HF applies. */
static int mlm_head(builder *b, int h, int table) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    const int roberta = c->arch == TG_ARCH_ROBERTA;
    int x = adapted_linear(b, roberta ? "lm_head.dense" : "cls.predictions.transform.dense", h, b->N, b->D, b->D, 0, 1,
                           1.0f);
    if (x < 0) return -1; /* an earlier failure, already recorded */
    int y = tg_graph_tensor(g, roberta ? "lm_head.gelu" : "cls.predictions.transform.act", TG_F32,
                            TG_POOL_ACTIVATIONS, g->tensors[x].ndim, g->tensors[x].shape);
    tg_op_spec s = tg_spec(TG_OP_GELU);
    s.in[0] = x, s.out[0] = y;
    s.p.gelu.n = b->N * b->D, s.p.gelu.form = roberta ? TG_GELU_ERF : c->gelu;
    tg_graph_op(g, &s);
    x = layernorm(b, roberta ? "lm_head.layer_norm" : "cls.predictions.transform.LayerNorm", y, b->N);
    int bias = tg_param(g, roberta ? "lm_head.bias" : "cls.predictions.bias", 1, c->vocab_size, 0, TG_INIT_ZEROS, 1);
    if (bias < 0) return -1; /* table >= 0: had it failed, the graph would have, and x above */
    g->tensors[table].flags |= TG_TENSOR_TIED;
    int logits = tg_act(g, roberta ? "lm_head.decoder" : "cls.predictions.decoder", 2, b->N, c->vocab_size, 0, 0);
    s = tg_spec(TG_OP_MATMUL);
    s.in[0] = x, s.in[1] = table, s.in[2] = bias, s.out[0] = logits;
    s.p.matmul.m = b->N, s.p.matmul.n = c->vocab_size, s.p.matmul.k = b->D, s.p.matmul.trans_b = 1;
    s.p.matmul.batch = 1, s.p.matmul.alpha = 1.0f;
    tg_graph_op(g, &s);
    return logits;
}

static int build_encoder(builder *b, int pad_id) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    const char *base = c->arch == TG_ARCH_ROBERTA ? "roberta" : "bert";
    char p[TG_NAME_MAX], name[TG_NAME_MAX], act[TG_NAME_MAX];

    snprintf(p, sizeof p, "%s.embeddings", base);
    snprintf(name, sizeof name, "%s.word_embeddings.weight", p);
    /* HF: word embeddings (and RoBERTa's positions) have padding_idx = pad_token_id. */
    int cfg_pad = c->pad_token_id;
    const int mlm = g->job->task == TG_TASK_MLM;
    int mlm_labels = -1, word_table;
    int ids = mlm ? mlm_mask(b, pad_id, &mlm_labels) : g->io.input_ids;
    int we = embedding(b, name, ids, c->vocab_size, cfg_pad, &word_table);
    snprintf(name, sizeof name, "%s.token_type_embeddings.weight", p);
    int te = embedding(b, name, g->io.token_type_ids, c->type_vocab_size, -1, NULL);
    snprintf(name, sizeof name, "%s.position_embeddings.weight", p);
    int pe = embedding(b, name, g->io.position_ids, c->max_positions,
                       c->arch == TG_ARCH_ROBERTA ? cfg_pad : -1, NULL);
    /* HF's buffers of the embeddings (transformers 5 BertEmbeddings and RobertaEmbeddings,
     * both persistent=False): the default position ids (arange) and token types (zeros) for
     * inputs that lack them. The plan takes both from the batch, so no op reads them; they
     * are declared so that checkpoints holding them (older HF versions saved position_ids)
     * are recognised, and the tensors ignored as HF ignores them. */
    snprintf(name, sizeof name, "%s.position_ids", p);
    tg_buffer(g, name, TG_I32, 2, 1, c->max_positions, TG_INIT_ARANGE, 0);
    snprintf(name, sizeof name, "%s.token_type_ids", p);
    tg_buffer(g, name, TG_I32, 2, 1, c->max_positions, TG_INIT_ZEROS, 0);
    int h = add(b, "embeddings.sum", add(b, "embeddings.word_type", we, te), pe);
    snprintf(name, sizeof name, "%s.LayerNorm", p);
    h = layernorm(b, name, h, b->N);
    h = dropout(b, "embeddings.dropout", h, c->embedding_dropout);

    /* query, key and value made apart when LoRA adds to any of them or one trains whole. */
    const int packed_qkv =
        b->fuse_qkv && !lora_module_targeted(g, "query") && !lora_module_targeted(g, "key") &&
        !lora_module_targeted(g, "value") && !lora_module_saved(g, "query") && !lora_module_saved(g, "key") &&
        !lora_module_saved(g, "value");
    for (int l = 0; l < c->layers; l++) {
        snprintf(p, sizeof p, "%s.encoder.layer.%d", base, l);
        int qkv[3], heads[3];
        if (packed_qkv) {
            snprintf(name, sizeof name, "%s.attention.self", p);
            qkv[0] = qkv_packed(b, name, h);
            snprintf(name, sizeof name, "%s.attention.self.qkv", p);
            if (!b->fused_attention) heads_op(b, TG_OP_HEADS_SPLIT, qkv, 1, heads, 3, name);
        } else {
            for (int i = 0; i < 3; i++) {
                snprintf(name, sizeof name, "%s.attention.self.%s", p, qkv_names[i]);
                qkv[i] = adapted_linear(b, name, h, b->N, b->D, b->D, 0, 1, 1.0f);
                if (!b->fused_attention) heads_op(b, TG_OP_HEADS_SPLIT, &qkv[i], 1, &heads[i], 1, name);
            }
        }
        snprintf(name, sizeof name, "%s.attention", p);
        int ctx = b->fused_attention ? attention_fused(b, name, qkv, packed_qkv, 0, c->attention_dropout)
                                     : attention_unfused(b, name, heads[0], heads[1], heads[2], 0, c->attention_dropout);
        char drop[TG_NAME_MAX], resid[TG_NAME_MAX];
        int s;
        snprintf(name, sizeof name, "%s.attention.output.dense", p);
        int a = adapted_linear(b, name, ctx, b->N, b->D, b->D, 0, 1, 1.0f);
        snprintf(drop, sizeof drop, "%s.attention.output.dropout", p);
        snprintf(resid, sizeof resid, "%s.attention.output.residual", p);
        snprintf(name, sizeof name, "%s.attention.output.LayerNorm", p);
        h = residual_layernorm(b, drop, resid, name, a, h, c->hidden_dropout, &s);

        snprintf(name, sizeof name, "%s.intermediate.dense", p);
        snprintf(act, sizeof act, "%s.intermediate.gelu", p);
        int f = adapted_linear_gelu(b, name, act, h, b->D, c->intermediate, 0);
        snprintf(name, sizeof name, "%s.output.dense", p);
        f = adapted_linear(b, name, f, b->N, c->intermediate, b->D, 0, 1, 1.0f);
        snprintf(drop, sizeof drop, "%s.output.dropout", p);
        snprintf(resid, sizeof resid, "%s.output.residual", p);
        snprintf(name, sizeof name, "%s.output.LayerNorm", p);
        h = residual_layernorm(b, drop, resid, name, f, h, c->hidden_dropout, &s);
    }

    if (mlm) return loss_of(b, mlm_head(b, h, word_table), mlm_labels, b->N, c->vocab_size, c->vocab_size);
    if (g->job->task == TG_TASK_QA) return span_head(b, h);
    int labels = g->job->num_labels;
    int cls = select_token(b, "cls", h, TG_SELECT_FIRST, pad_id);
    int logits;
    /* With LoRA the classifier trains whole (PEFT's modules_to_save for SEQ_CLS); BERT's
     * pooler stays frozen, with an adapter when "dense" is a target, as in PEFT. */
    if (c->arch == TG_ARCH_BERT) {
        int pooled = adapted_linear(b, "bert.pooler.dense", cls, b->B, b->D, b->D, 0, 1, 1.0f);
        pooled = unary(b, TG_OP_TANH, "bert.pooler.tanh", pooled);
        pooled = dropout(b, "classifier.dropout", pooled, c->classifier_dropout);
        g->adapter = 1;
        logits = linear(b, "classifier", pooled, b->B, b->D, labels, 0, 1, 1.0f);
    } else { /* RobertaClassificationHead */
        int x = dropout(b, "classifier.dropout_in", cls, c->classifier_dropout);
        g->adapter = 1;
        x = linear(b, "classifier.dense", x, b->B, b->D, b->D, 0, 1, 1.0f);
        x = unary(b, TG_OP_TANH, "classifier.tanh", x);
        x = dropout(b, "classifier.dropout_out", x, c->classifier_dropout);
        logits = linear(b, "classifier.out_proj", x, b->B, b->D, labels, 0, 1, 1.0f);
    }
    g->adapter = 0;
    return loss_of(b, logits, g->io.labels, b->B, labels, labels);
}

/* The LM head tied to the token embedding `table` (HF tie_word_embeddings) over h [N, D],
 * and its loss. It reads the table through a view (named padded_name) padded with zero rows
 * to a multiple of 64: logits rows of 50257 bf16 values are not 16-byte aligned, which
 * keeps cuBLASLt off its fast kernels. The padding rows stay zero (AdamW skips views),
 * their logits are 0 and the loss leaves those columns out. */
static int tied_lm_head(builder *b, int table, const char *padded_name, int h) {
    tg_graph *g = b->g;
    g->tensors[table].flags |= TG_TENSOR_TIED;
    int64_t V = g->cfg->vocab_size, Vp = (V + 63) / 64 * 64;
    int head = table;
    if (Vp != V) {
        int64_t shape[2] = {Vp, b->D};
        /* The view has the table's class: trainable, or frozen (frozen pool). */
        head = tg_graph_tensor(g, padded_name, TG_F32, g->tensors[table].pool, 2, shape);
        if (head < 0) return -1;
        g->tensors[head].flags |=
            (g->tensors[table].flags & (TG_TENSOR_PARAM | TG_TENSOR_FROZEN)) | TG_TENSOR_VIEW | TG_TENSOR_TIED;
        g->tensors[head].master = table;
    }
    int logits = tg_act(g, "lm_head", 2, b->N, Vp, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_MATMUL);
    s.in[0] = h, s.in[1] = head, s.out[0] = logits;
    s.p.matmul.m = b->N, s.p.matmul.n = Vp, s.p.matmul.k = b->D, s.p.matmul.trans_b = 1;
    s.p.matmul.batch = 1, s.p.matmul.alpha = 1.0f;
    tg_graph_op(g, &s);
    return loss_of(b, logits, g->io.labels, b->N, Vp, V);
}

static int build_gpt2(builder *b, int pad_id) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    char p[TG_NAME_MAX], name[TG_NAME_MAX], act[TG_NAME_MAX];
    /* GPT-2 scales the residual projections' init by 1/sqrt(2 * n_layer). */
    float proj_scale = 1.0f / sqrtf(2.0f * (float)c->layers);

    int wte;
    int we = embedding(b, "transformer.wte.weight", g->io.input_ids, c->vocab_size, -1, &wte);
    int pe = embedding(b, "transformer.wpe.weight", g->io.position_ids, c->max_positions, -1, NULL);
    int h = add(b, "transformer.embeddings", we, pe);
    h = dropout(b, "transformer.drop", h, c->embedding_dropout);

    /* Pre-LN: each residual add is followed by the next LayerNorm (ln_2 of the block, ln_1
     * of the next, ln_f after the last), which residual_layernorm emits with it; `normed`
     * is that LayerNorm's output, the next sublayer's input. Block 0's ln_1 reads the
     * embeddings, which have no residual add before them. */
    int normed = layernorm(b, "transformer.h.0.ln_1", h, b->N);
    for (int l = 0; l < c->layers; l++) {
        char drop[TG_NAME_MAX], resid[TG_NAME_MAX];
        snprintf(p, sizeof p, "transformer.h.%d", l);
        int a = normed;
        snprintf(name, sizeof name, "%s.attn.c_attn", p);
        int qkv = adapted_linear(b, name, a, b->N, b->D, 3 * b->D, 1, 1, 1.0f);
        int heads[3];
        if (!b->fused_attention) heads_op(b, TG_OP_HEADS_SPLIT, &qkv, 1, heads, 3, name);
        snprintf(name, sizeof name, "%s.attn", p);
        int ctx = b->fused_attention ? attention_fused(b, name, &qkv, 1, 1, c->attention_dropout)
                                     : attention_unfused(b, name, heads[0], heads[1], heads[2], 1, c->attention_dropout);
        snprintf(name, sizeof name, "%s.attn.c_proj", p);
        int o = adapted_linear(b, name, ctx, b->N, b->D, b->D, 1, 1, proj_scale);
        snprintf(drop, sizeof drop, "%s.attn.resid_dropout", p);
        snprintf(resid, sizeof resid, "%s.attn.residual", p);
        snprintf(name, sizeof name, "%s.ln_2", p);
        int m = residual_layernorm(b, drop, resid, name, o, h, c->hidden_dropout, &h);
        snprintf(name, sizeof name, "%s.mlp.c_fc", p);
        snprintf(act, sizeof act, "%s.mlp.gelu", p);
        m = adapted_linear_gelu(b, name, act, m, b->D, c->intermediate, 1);
        snprintf(name, sizeof name, "%s.mlp.c_proj", p);
        m = adapted_linear(b, name, m, b->N, c->intermediate, b->D, 1, 1, proj_scale);
        snprintf(drop, sizeof drop, "%s.mlp.dropout", p);
        snprintf(resid, sizeof resid, "%s.mlp.residual", p);
        if (l + 1 < c->layers) snprintf(name, sizeof name, "transformer.h.%d.ln_1", l + 1);
        else snprintf(name, sizeof name, "transformer.ln_f");
        normed = residual_layernorm(b, drop, resid, name, m, h, c->hidden_dropout, &h);
    }
    h = normed; /* ln_f's output */

    if (wte < 0) return -1; /* an earlier failure, already recorded */
    if (g->job->task == TG_TASK_LM) {
        /* The LM head is tied to the token embedding (HF tie_word_embeddings). It reads
         * the table through a view padded with zero rows to a multiple of 64: logits rows
         * of 50257 bf16 values are not 16-byte aligned, which keeps cuBLASLt off its fast
         * kernels. The padding rows stay zero (AdamW skips views), their logits are 0 and
         * the loss leaves those columns out. */
        return tied_lm_head(b, wte, "transformer.wte.weight.padded", h);
    }
    int last = select_token(b, "last_token", h, TG_SELECT_LAST_NON_PAD, pad_id);
    int labels = g->job->num_labels;
    g->adapter = 1; /* the classification head trains with LoRA (PEFT's modules_to_save) */
    int logits = linear(b, "score", last, b->B, b->D, labels, 0, 0, 1.0f);
    g->adapter = 0;
    return loss_of(b, logits, g->io.labels, b->B, labels, labels);
}

/* LlamaRMSNorm `prefix` (its weight "<prefix>.weight") over x [N, D]; returns y. */
static int rmsnorm(builder *b, const char *prefix, int x) {
    tg_graph *g = b->g;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.weight", prefix);
    int gamma = tg_param(g, name, 1, b->D, 0, TG_INIT_ONES, 1);
    int y = tg_act(g, prefix, 2, b->N, b->D, 0, 0);
    snprintf(name, sizeof name, "%s.rstd", prefix);
    int rstd = tg_act(g, name, 1, b->N, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_RMSNORM);
    s.in[0] = x, s.in[1] = gamma, s.out[0] = y, s.out[1] = rstd;
    s.p.rmsnorm.m = b->N, s.p.rmsnorm.d = b->D, s.p.rmsnorm.eps = g->cfg->layer_norm_eps;
    tg_graph_op(g, &s);
    return y;
}

/* Bias-free nn.Linear layers `prefix.names[i]` (out_rows[i] x in each, HF names and init)
 * applied as one product over x [N, in]: their weights packed as one [sum, in] matrix
 * named `packed`, the product [N, sum] named likewise (Llama's q/k/v and gate/up). */
static int packed_linear(builder *b, const char *prefix, const char *const *names, const int64_t *out_rows, int n,
                         const char *packed, int x, int64_t in) {
    int w[3], bias;
    int64_t total = 0;
    char name[TG_NAME_MAX];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s.%s", prefix, names[i]);
        w[i] = linear_params(b, name, in, out_rows[i], 0, 0, 1.0f, &bias);
        total += out_rows[i];
    }
    snprintf(name, sizeof name, "%s.%s.weight", prefix, packed);
    int wv = tg_param_pack(b->g, name, w, n, 2, total, in);
    snprintf(name, sizeof name, "%s.%s", prefix, packed);
    return linear_apply(b, name, x, wv, -1, b->N, in, total, 0, NULL);
}

/* The rotary embedding of layer `prefix`'s projections, packed qkv [N, (H + 2 Hkv) Dh] (k
 * and v -1) or q, k and v made apart, k and v repeated to H heads: [N, 3 H Dh], the packed
 * input of the attention. */
static int rope(builder *b, const char *prefix, int qkv, int k, int v) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.qkv_rotary", prefix);
    int y = tg_act(g, name, 2, b->N, 3 * b->H * b->Dh, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_ROPE);
    s.in[0] = qkv, s.in[1] = g->io.position_ids, s.in[2] = k, s.in[3] = v, s.out[0] = y;
    tg_rope_params *p = &s.p.rope;
    p->n = b->N, p->h = b->H, p->kv_heads = c->kv_heads, p->head_dim = b->Dh, p->type = c->rope_type;
    p->theta = c->rope_theta, p->factor = c->rope_factor, p->low_freq = c->rope_low_freq_factor;
    p->high_freq = c->rope_high_freq_factor, p->original_max = c->rope_original_max_positions;
    tg_graph_op(g, &s);
    return y;
}

/* A bias-free projection `prefix.module` over x [N, in], with its LoRA pair when the job
 * targets it. */
static int llama_linear(builder *b, const char *prefix, const char *module, int x, int64_t in, int64_t out) {
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.%s", prefix, module);
    return adapted_linear(b, name, x, b->N, in, out, 0, 0, 1.0f);
}

/* LlamaForCausalLM / LlamaForSequenceClassification: pre-norm blocks of RMSNorm, rotary
 * grouped-query attention and a SwiGLU MLP, with plain residual adds; no biases and no
 * dropout but the attention's. */
static int build_llama(builder *b, int pad_id) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    char p[TG_NAME_MAX], name[TG_NAME_MAX];
    static const char *const attn_names[3] = {"q_proj", "k_proj", "v_proj"}, *const mlp_names[2] = {"gate_proj", "up_proj"};
    /* q, k and v made apart when LoRA adds to any of them or one trains whole
     * (lora_modules_to_save); gate and up likewise. */
    const int qkv_apart = lora_module_targeted(g, "q_proj") || lora_module_targeted(g, "k_proj") ||
                          lora_module_targeted(g, "v_proj") || lora_module_saved(g, "q_proj") ||
                          lora_module_saved(g, "k_proj") || lora_module_saved(g, "v_proj");
    const int mlp_apart = lora_module_targeted(g, "gate_proj") || lora_module_targeted(g, "up_proj") ||
                          lora_module_saved(g, "gate_proj") || lora_module_saved(g, "up_proj");
    int table;
    int h = embedding(b, "model.embed_tokens.weight", g->io.input_ids, c->vocab_size, c->pad_token_id, &table);
    const int64_t qkv_rows[3] = {b->H * b->Dh, (int64_t)c->kv_heads * b->Dh, (int64_t)c->kv_heads * b->Dh};
    const int64_t mlp_rows[2] = {c->intermediate, c->intermediate};
    for (int l = 0; l < c->layers; l++) {
        snprintf(p, sizeof p, "model.layers.%d", l);
        snprintf(name, sizeof name, "%s.input_layernorm", p);
        int x = rmsnorm(b, name, h);
        snprintf(name, sizeof name, "%s.self_attn", p);
        int rotary;
        if (qkv_apart) {
            int part[3];
            for (int k = 0; k < 3; k++) part[k] = llama_linear(b, name, attn_names[k], x, b->D, qkv_rows[k]);
            rotary = part[0] < 0 || part[1] < 0 || part[2] < 0 ? -1 : rope(b, name, part[0], part[1], part[2]);
        } else {
            int qkv = packed_linear(b, name, attn_names, qkv_rows, 3, "qkv_proj", x, b->D);
            rotary = qkv < 0 ? -1 : rope(b, name, qkv, -1, -1);
        }
        int ctx;
        if (b->fused_attention) {
            ctx = attention_fused(b, name, &rotary, 1, 1, c->attention_dropout);
        } else {
            int heads[3];
            snprintf(name, sizeof name, "%s.self_attn.qkv_rotary", p);
            heads_op(b, TG_OP_HEADS_SPLIT, &rotary, 1, heads, 3, name);
            snprintf(name, sizeof name, "%s.self_attn", p);
            ctx = attention_unfused(b, name, heads[0], heads[1], heads[2], 1, c->attention_dropout);
        }
        snprintf(name, sizeof name, "%s.self_attn", p);
        int o = llama_linear(b, name, "o_proj", ctx, b->D, b->D);
        snprintf(name, sizeof name, "%s.attn_residual", p);
        h = add(b, name, h, o);
        snprintf(name, sizeof name, "%s.post_attention_layernorm", p);
        x = rmsnorm(b, name, h);
        snprintf(name, sizeof name, "%s.mlp", p);
        int gate, up = -1;
        if (mlp_apart) {
            gate = llama_linear(b, name, mlp_names[0], x, b->D, c->intermediate);
            up = llama_linear(b, name, mlp_names[1], x, b->D, c->intermediate);
        } else {
            gate = packed_linear(b, name, mlp_names, mlp_rows, 2, "gate_up_proj", x, b->D);
        }
        snprintf(name, sizeof name, "%s.mlp.act", p);
        int act = gate < 0 ? -1 : tg_act(g, name, 2, b->N, c->intermediate, 0, 0);
        tg_op_spec s = tg_spec(TG_OP_SWIGLU);
        s.in[0] = gate, s.in[1] = up, s.out[0] = act;
        s.p.swiglu.m = b->N, s.p.swiglu.i = c->intermediate;
        tg_graph_op(g, &s);
        snprintf(name, sizeof name, "%s.mlp", p);
        int d = llama_linear(b, name, "down_proj", act, c->intermediate, b->D);
        snprintf(name, sizeof name, "%s.mlp_residual", p);
        h = add(b, name, h, d);
    }
    h = rmsnorm(b, "model.norm", h);
    if (table < 0 || h < 0) return -1; /* an earlier failure, already recorded */
    if (g->job->task == TG_TASK_LM) {
        if (c->tie_word_embeddings) return tied_lm_head(b, table, "model.embed_tokens.weight.padded", h);
        int logits = linear(b, "lm_head", h, b->N, b->D, c->vocab_size, 0, 0, 1.0f);
        return loss_of(b, logits, g->io.labels, b->N, c->vocab_size, c->vocab_size);
    }
    int last = select_token(b, "last_token", h, TG_SELECT_LAST_NON_PAD, pad_id);
    int labels = g->job->num_labels;
    g->adapter = 1; /* the classification head trains with LoRA (PEFT's modules_to_save) */
    int logits = linear(b, "score", last, b->B, b->D, labels, 0, 0, 1.0f);
    g->adapter = 0;
    return loss_of(b, logits, g->io.labels, b->B, labels, labels);
}

/* ---- torchvision's mobilenet_v2 ---------------------------------------------------------
 * MobileNetV2 (Sandler et al.) as torchvision.models.mobilenet_v2 builds it, on channels-last
 * images (NHWC, as PyTorch's channels_last memory format; the weights keep torch's layout), with
 * its state-dict names: features.0 the stem (3x3 convolution of stride 2, BatchNorm2d, ReLU6),
 * features.1 .. features.17 the inverted residual blocks of the (t, c, n, s) table, features.18
 * the last 1x1 convolution to last_channel, then global average pooling, classifier.0 a
 * dropout and classifier.1 the linear classifier. Channel counts are torchvision's
 * _make_divisible(c * width_mult, 8). Every convolution is bias-free and followed by a
 * batch normalisation (eps and momentum of the config) with its running statistics as
 * persistent buffers; initialisation as torchvision's: convolutions kaiming_normal_ (fan_out,
 * std sqrt(2 / (out channels x k x k))), the normalisations 1 and 0, the classifier's weight
 * normal(0, 0.01) and bias 0. The pointwise (1x1, stride 1) convolutions are MATMULs over
 * the pixels: on channels-last images they are exactly a linear layer of each pixel. */

/* torchvision's _make_divisible(v, 8): the nearest multiple of 8, at least 8, and not below
 * 90% of v. */
static int64_t make_divisible(double v) {
    const int64_t d = 8;
    int64_t n = (int64_t)(v + d / 2.0) / d * d;
    if (n < d) n = d;
    if ((double)n < 0.9 * v) n += d;
    return n;
}

/* A channels-last image activation [B, H, W, C] (H = W). */
typedef struct image {
    int t;        /* the tensor, -1 after a failure */
    int64_t c, s; /* channels and size */
} image;

static image image_act(builder *b, const char *name, int64_t c, int64_t s) {
    return (image){tg_act(b->g, name, 4, b->B, s, s, c), c, s};
}

/* nn.Conv2d(x.c, c_out, k, stride, padding (k - 1) / 2, groups, bias=False) named prefix:
 * its weight `prefix.weight` [c_out, x.c / groups, k, k] (torch's layout), its output named
 * prefix. A pointwise one (k 1, stride 1, groups 1) is the MATMUL of the B S S pixel rows,
 * [B S S, x.c] @ W^T with the 4-D weight read as [c_out, x.c]; the others are CONV2Ds. */
static image conv2d(builder *b, const char *prefix, image x, int64_t c_out, int64_t k, int64_t stride,
                    int64_t groups) {
    tg_graph *g = b->g;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const int64_t shape[4] = {c_out, x.c / groups, k, k};
    const int w = tg_param_shaped(g, name, 4, shape, TG_INIT_NORMAL, 0);
    if (w >= 0) g->tensors[w].init_std = (float)sqrt(2.0 / (double)(c_out * k * k));
    const int64_t pad = (k - 1) / 2, s = (x.s + 2 * pad - k) / stride + 1;
    image y = image_act(b, prefix, c_out, s);
    if (x.t < 0 || w < 0 || y.t < 0) return (image){-1, c_out, s};
    if (k == 1 && stride == 1 && groups == 1) {
        tg_op_spec sp = tg_spec(TG_OP_MATMUL);
        sp.in[0] = x.t, sp.in[1] = w, sp.out[0] = y.t;
        sp.p.matmul = (tg_matmul_params){.m = b->B * x.s * x.s, .n = c_out, .k = x.c, .trans_b = 1, .batch = 1,
                                         .alpha = 1.0f};
        tg_graph_op(g, &sp);
        return y;
    }
    tg_op_spec sp = tg_spec(TG_OP_CONV2D);
    sp.in[0] = x.t, sp.in[1] = w, sp.out[0] = y.t;
    sp.p.conv2d = (tg_conv2d_params){.n = b->B, .c_in = x.c, .h = x.s, .w = x.s, .c_out = c_out, .k = k,
                                     .stride = stride, .pad = pad, .groups = groups};
    tg_graph_op(g, &sp);
    return y;
}

/* nn.BatchNorm2d(x.c) named prefix: weight 1 and bias 0 (no weight decay), running_mean 0
 * and running_var 1 (persistent buffers, updated in place by the op in training). */
static image batchnorm2d_act(builder *b, const char *prefix, image x, const char *relu6_name);

static image batchnorm2d(builder *b, const char *prefix, image x) { return batchnorm2d_act(b, prefix, x, NULL); }

/* With relu6_name, the ReLU6 after it inside the op (BATCHNORM relu6, job key fuse_bn_relu6):
 * its output, named relu6_name, is what the batch norm writes. */
static image batchnorm2d_act(builder *b, const char *prefix, image x, const char *relu6_name) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const int gamma = tg_param(g, name, 1, x.c, 0, TG_INIT_ONES, 1);
    snprintf(name, sizeof name, "%s.bias", prefix);
    const int beta = tg_param(g, name, 1, x.c, 0, TG_INIT_ZEROS, 1);
    snprintf(name, sizeof name, "%s.running_mean", prefix);
    const int mean = tg_buffer(g, name, TG_F32, 1, x.c, 0, TG_INIT_ZEROS, 1);
    snprintf(name, sizeof name, "%s.running_var", prefix);
    const int var = tg_buffer(g, name, TG_F32, 1, x.c, 0, TG_INIT_ONES, 1);
    image y = image_act(b, relu6_name ? relu6_name : prefix, x.c, x.s);
    snprintf(name, sizeof name, "%s.stats", prefix);
    const int stats = tg_act(g, name, 2, 2, x.c, 0, 0);
    if (x.t < 0 || y.t < 0 || stats < 0 || mean < 0 || var < 0) return (image){-1, x.c, x.s};
    tg_op_spec sp = tg_spec(TG_OP_BATCHNORM);
    sp.in[0] = x.t, sp.in[1] = gamma, sp.in[2] = beta, sp.in[3] = mean, sp.in[4] = var;
    sp.out[0] = y.t, sp.out[1] = stats, sp.out[2] = mean, sp.out[3] = var;
    sp.p.batchnorm = (tg_batchnorm_params){.n = b->B, .c = x.c, .hw = x.s * x.s, .eps = c->layer_norm_eps,
                                           .momentum = c->batch_norm_momentum, .relu6 = relu6_name != NULL};
    tg_graph_op(g, &sp);
    return y;
}

static image relu6(builder *b, const char *name, image x) {
    tg_graph *g = b->g;
    image y = image_act(b, name, x.c, x.s);
    if (x.t < 0 || y.t < 0) return (image){-1, x.c, x.s};
    tg_op_spec sp = tg_spec(TG_OP_RELU6);
    sp.in[0] = x.t, sp.out[0] = y.t;
    sp.p.count.n = tg_tensor_numel(&g->tensors[y.t]);
    tg_graph_op(g, &sp);
    return y;
}

/* torchvision's Conv2dNormActivation: prefix.0 the convolution, prefix.1 its BatchNorm2d,
 * then ReLU6 (prefix.2, no parameters): inside the batch norm's op with fuse_bn_relu6 (the
 * default), else its own op. */
static image conv_bn_relu6(builder *b, const char *prefix, image x, int64_t c_out, int64_t k, int64_t stride,
                           int64_t groups) {
    char name[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.0", prefix);
    image y = conv2d(b, name, x, c_out, k, stride, groups);
    char act[TG_NAME_MAX];
    snprintf(name, sizeof name, "%s.1", prefix);
    snprintf(act, sizeof act, "%s.2", prefix);
    if (b->g->job->fuse_bn_relu6) return batchnorm2d_act(b, name, y, act);
    y = batchnorm2d(b, name, y);
    return relu6(b, act, y);
}

/* InvertedResidual(x.c, oup, stride, expand_ratio) as features.<index>: with t != 1 the 1x1
 * expansion (conv.0), the 3x3 depthwise convolution (conv.0 or conv.1), the linear 1x1
 * projection (conv.<j>, no activation) and its BatchNorm2d (conv.<j + 1>); the input added
 * back where stride is 1 and the channels match. */
static image inverted_residual(builder *b, int index, image x, int64_t oup, int64_t stride, int64_t t) {
    char prefix[TG_NAME_MAX], name[TG_NAME_MAX];
    const int64_t hidden = x.c * t;
    int j = 0;
    image h = x;
    if (t != 1) {
        snprintf(prefix, sizeof prefix, "features.%d.conv.%d", index, j++);
        h = conv_bn_relu6(b, prefix, h, hidden, 1, 1, 1);
    }
    snprintf(prefix, sizeof prefix, "features.%d.conv.%d", index, j++);
    h = conv_bn_relu6(b, prefix, h, hidden, 3, stride, hidden);
    snprintf(name, sizeof name, "features.%d.conv.%d", index, j++);
    h = conv2d(b, name, h, oup, 1, 1, 1);
    snprintf(name, sizeof name, "features.%d.conv.%d", index, j);
    h = batchnorm2d(b, name, h);
    if (stride != 1 || x.c != oup) return h;
    snprintf(name, sizeof name, "features.%d", index);
    const int sum = add(b, name, h.t, x.t);
    return (image){h.t < 0 ? -1 : sum, oup, h.s};
}

/* The batch's stored pixels (io.pixel_values, bytes) as the network's channels-last input,
 * normalised with the config's mean and std and, in training, augmented as the job asks. */
static int image_input(builder *b) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    const tg_job *j = g->job;
    const int x = tg_act(g, "pixel_values.normalized", 4, b->B, c->image_size, c->image_size, c->image_channels);
    tg_op_spec sp = tg_spec(TG_OP_IMAGE_INPUT);
    const int augment = j->random_crop_padding > 0 || j->random_horizontal_flip;
    sp.in[0] = g->io.pixel_values, sp.in[1] = augment ? g->io.step : -1, sp.out[0] = x;
    sp.p.image_input = (tg_image_input_params){
        .n = b->B, .c = c->image_channels, .size = c->image_size, .key = augment ? g->dropout_key++ : 0,
        .crop_pad = j->random_crop_padding, .flip = j->random_horizontal_flip,
        .mean0 = c->image_mean[0], .mean1 = c->image_mean[1], .mean2 = c->image_mean[2],
        .std0 = c->image_std[0], .std1 = c->image_std[1], .std2 = c->image_std[2]};
    /* Channels past the image's: 1, so that the op's rule sees finite, positive values. */
    if (c->image_channels < 2) sp.p.image_input.std1 = 1.0f;
    if (c->image_channels < 3) sp.p.image_input.std2 = 1.0f;
    tg_graph_op(g, &sp);
    return g->failed ? -1 : x;
}

static int build_mobilenet_v2(builder *b) {
    tg_graph *g = b->g;
    const tg_model_config *c = g->cfg;
    static const int64_t settings[7][4] = {{1, 16, 1, 1}, {6, 24, 2, 2}, {6, 32, 3, 2}, {6, 64, 4, 2},
                                           {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}}; /* t, c, n, s */
    const double wm = c->width_mult;
    const int64_t stem = make_divisible(32 * wm);
    const int64_t last_channel = make_divisible(1280 * (wm > 1.0 ? wm : 1.0));
    image x = {image_input(b), c->image_channels, c->image_size};
    if (x.t < 0) return -1;
    x = conv_bn_relu6(b, "features.0", x, stem, 3, 2, 1);
    int index = 1;
    for (int k = 0; k < 7; k++) {
        const int64_t out = make_divisible((double)settings[k][1] * wm);
        for (int64_t i = 0; i < settings[k][2]; i++)
            x = inverted_residual(b, index++, x, out, i == 0 ? settings[k][3] : 1, settings[k][0]);
    }
    char prefix[TG_NAME_MAX];
    snprintf(prefix, sizeof prefix, "features.%d", index);
    x = conv_bn_relu6(b, prefix, x, last_channel, 1, 1, 1);
    if (x.t < 0) return -1;
    /* adaptive_avg_pool2d to 1x1 and flatten ([B, S S, C] -> [B, C]), then the classifier. */
    const int pooled = tg_act(g, "pooled", 2, b->B, last_channel, 0, 0);
    tg_op_spec sp = tg_spec(TG_OP_GLOBAL_AVG_POOL);
    sp.in[0] = x.t, sp.out[0] = pooled;
    sp.p.avg_pool = (tg_avg_pool_params){.n = b->B, .c = last_channel, .hw = x.s * x.s};
    tg_graph_op(g, &sp);
    const int dropped = dropout(b, "classifier.0", pooled, c->classifier_dropout);
    const int64_t labels = g->job->num_labels;
    int bias;
    const int w = linear_params(b, "classifier.1", last_channel, labels, 0, 1, 1.0f, &bias);
    if (w < 0) return -1;
    g->tensors[w].init_std = 0.01f;
    const int logits = linear_apply(b, "classifier.1", dropped, w, bias, b->B, last_channel, labels, 0, NULL);
    return loss_of(b, logits, g->io.labels, b->B, labels, labels);
}

int tg_fused_attention(const tg_job *job, const tg_model_config *cfg) {
    return job->attention == TG_ATTENTION_FUSED && cfg->heads > 0 &&
           cfg->hidden / cfg->heads <= TG_FUSED_ATTENTION_MAX_HEAD_DIM;
}

/* An image model's inputs (the images and their labels) and forward. */
static int build_image_forward(tg_graph *g) {
    const tg_model_config *c = g->cfg;
    const tg_job *j = g->job;
    builder b = {.g = g, .B = j->batch, .T = 1, .N = j->batch};
    g->phase = TG_PHASE_FORWARD;
    const int64_t shape[4] = {j->batch, c->image_channels, c->image_size, c->image_size}; /* as stored: planes */
    g->io.pixel_values = tg_graph_tensor(g, "pixel_values", TG_U8, TG_POOL_INPUTS, 4, shape);
    if (g->io.pixel_values >= 0) g->tensors[g->io.pixel_values].flags |= TG_TENSOR_INPUT;
    g->io.labels = input(g, "labels", TG_I32, 1, j->batch, 0);
    if (j->grad_accumulation > 1) g->io.loss_norm = input(g, "loss_norm", TG_F32, 1, 1, 0);
    int64_t one = 1;
    g->io.step = tg_graph_tensor(g, "optim.step", TG_F32, TG_POOL_OPTIM, 1, &one);
    g->io.total_steps = tg_graph_tensor(g, "optim.total_steps", TG_F32, TG_POOL_OPTIM, 1, &one);
    return build_mobilenet_v2(&b);
}

int tg_build_forward(tg_graph *g, int pad_id) {
    const tg_model_config *c = g->cfg;
    const tg_job *j = g->job;
    if (c->arch == TG_ARCH_MOBILENET_V2) return build_image_forward(g);
    builder b = {.g = g, .B = j->batch, .T = j->seq, .D = c->hidden, .H = c->heads};
    b.Dh = c->hidden / c->heads;
    b.fused_attention = tg_fused_attention(j, c);
    /* cuBLASLt's GELU epilogues are the tanh form only; the exact erf GELU stays an op. */
    b.fused_gelu = j->fuse_gelu && c->gelu == TG_GELU_TANH;
    b.fused_residual_ln = j->fuse_residual_layernorm != 0;
    b.fuse_qkv = j->fuse_qkv;
    b.N = b.B * b.T;
    g->phase = TG_PHASE_FORWARD;

    g->io.input_ids = input(g, "input_ids", TG_I32, 2, b.B, b.T);
    g->io.attention_mask = input(g, "attention_mask", TG_F32, 2, b.B, b.T);
    if (c->arch != TG_ARCH_GPT2 && c->arch != TG_ARCH_LLAMA)
        g->io.token_type_ids = input(g, "token_type_ids", TG_I32, 2, b.B, b.T);
    g->io.position_ids = input(g, "position_ids", TG_I32, 2, b.B, b.T);
    g->io.labels = j->task == TG_TASK_LM || j->task == TG_TASK_MLM ? input(g, "labels", TG_I32, 2, b.B, b.T)
                   : j->task == TG_TASK_QA ? input(g, "labels", TG_I32, 2, b.B, 2) /* start, end */
                                           : input(g, "labels", TG_I32, 1, b.B, 0);
    /* Accumulated steps divide every micro-batch's summed loss by the whole window's count
     * (qa: one count per side of the span, start and end). */
    if (j->grad_accumulation > 1)
        g->io.loss_norm = input(g, "loss_norm", TG_F32, 1, j->task == TG_TASK_QA ? 2 : 1, 0);
    /* mlm: each batch's masking stream, written by the host (kernels/mlm_mask.h). */
    if (j->task == TG_TASK_MLM) g->io.mlm_stream = input(g, "mlm_stream", TG_I32, 1, 4, 0);
    int64_t one = 1;
    g->io.step = tg_graph_tensor(g, "optim.step", TG_F32, TG_POOL_OPTIM, 1, &one);
    g->io.total_steps = tg_graph_tensor(g, "optim.total_steps", TG_F32, TG_POOL_OPTIM, 1, &one);

    if (lora_setup(g) || lora_check_tied(g)) return -1;
    const int loss = c->arch == TG_ARCH_GPT2    ? build_gpt2(&b, pad_id)
                     : c->arch == TG_ARCH_LLAMA ? build_llama(&b, pad_id)
                                                : build_encoder(&b, pad_id);
    return loss < 0 || lora_check_hits(g) || lora_check_saved(g) ? -1 : loss;
}
