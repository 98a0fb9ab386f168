#include "runtime/lora_export.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/atomic_file.h"
#include "base/bf16.h"
#include "models/safetensors.h"

static int ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

static int find(const tg_plan *plan, const char *name) {
    for (int t = 0; t < plan->n_tensors; t++)
        if (!strcmp(plan->tensors[t].name, name)) return t;
    return -1;
}

/* A trainable parameter (not its gradient, copy or a view) named as an adapter's A. */
static int is_lora_a(const tg_tensor *x) {
    return (x->flags & TG_TENSOR_PARAM) && !(x->flags & (TG_TENSOR_VIEW | TG_TENSOR_PARAM_COPY)) &&
           ends_with(x->name, ".lora_A.weight");
}

int tg_lora_head_param(const tg_plan *plan, int t) {
    const tg_tensor *x = &plan->tensors[t];
    return (x->flags & TG_TENSOR_PARAM) && !(x->flags & (TG_TENSOR_VIEW | TG_TENSOR_PARAM_COPY)) &&
           !ends_with(x->name, ".lora_A.weight") && !ends_with(x->name, ".lora_B.weight");
}

int tg_lora_pairs(const tg_plan *plan, tg_lora_pair **pairs, tg_err *err) {
    *pairs = NULL;
    int n = 0;
    for (int t = 0; t < plan->n_tensors; t++) n += is_lora_a(&plan->tensors[t]);
    if (!n) return 0;
    tg_lora_pair *out = tg_calloc((size_t)n, sizeof *out);
    if (!out) return tg_fail(err, "out of memory");
    int k = 0;
    for (int t = 0; t < plan->n_tensors; t++) {
        const char *name = plan->tensors[t].name;
        if (!is_lora_a(&plan->tensors[t])) continue;
        char other[TG_NAME_MAX];
        const int stem = (int)(strlen(name) - strlen(".lora_A.weight"));
        snprintf(other, sizeof other, "%.*s.lora_B.weight", stem, name);
        const int b = find(plan, other);
        snprintf(other, sizeof other, "%.*s.weight", stem, name);
        const int base = find(plan, other);
        float scale = 0;
        for (int o = 0; o < plan->n_ops && b >= 0; o++)
            if (plan->ops[o].kind == TG_OP_MATMUL && plan->ops[o].phase == TG_PHASE_FORWARD && plan->ops[o].in[1] == b)
                scale = plan->ops[o].p.matmul.alpha;
        /* GPT-2's projections are Conv1D, their weights [in, out] (PEFT's fan_in_fan_out). */
        const int fan_in_fan_out = plan->model.arch == TG_ARCH_GPT2;
        const int in_dim = !fan_in_fan_out, out_dim = fan_in_fan_out; /* the dims of in and out in the base */
        if (b < 0 || base < 0 || scale == 0.0f || plan->tensors[base].ndim != 2 ||
            plan->tensors[t].shape[1] != plan->tensors[base].shape[in_dim] ||
            plan->tensors[b].shape[0] != plan->tensors[base].shape[out_dim] ||
            plan->tensors[b].shape[1] != plan->tensors[t].shape[0]) {
            free(out);
            return tg_fail(err, "%s: no matching base weight, lora_B and product: not a LoRA plan this build exports",
                           name);
        }
        out[k++] = (tg_lora_pair){base, t, b, scale, fan_in_fan_out};
    }
    *pairs = out;
    return k;
}

float *tg_lora_merged(const tg_weights_image *img, const tg_lora_pair *p) {
    const tg_plan *plan = img->plan;
    const int64_t in = plan->tensors[p->a].shape[1], out = plan->tensors[p->b].shape[0];
    const int64_t r = plan->tensors[p->a].shape[0];
    float *w = tg_malloc(sizeof(float) * (size_t)(out * in));
    if (!w) return NULL;
    const float *base = tg_weights_value(img, p->base), *a = tg_weights_value(img, p->a), *b = tg_weights_value(img, p->b);
    for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < in; j++) {
            double s = 0;
            for (int64_t k = 0; k < r; k++) s += (double)b[i * r + k] * a[k * in + j];
            /* (B A)[i, j] lands at W[i, j], or at W[j, i] for a weight stored [in, out]. */
            const int64_t at = p->fan_in_fan_out ? j * out + i : i * in + j;
            w[at] = (float)(base[at] + (double)p->scale * s);
        }
    return w;
}

/* The module name of a pair (the projection's last name part: "q_proj"). */
static const char *module_of(const char *base_name, char *buf, size_t cap) {
    const size_t n = strlen(base_name) - strlen(".weight");
    const char *dot = base_name + n;
    while (dot > base_name && dot[-1] != '.') dot--;
    snprintf(buf, cap, "%.*s", (int)(base_name + n - dot), dot);
    return buf;
}

/* Appends the string s[0, len) to the array of strings unless it holds it already; 0, or -1
 * when out of memory. */
static int append_once(json_t *array, const char *s, size_t len) {
    for (size_t i = 0; i < json_array_size(array); i++) {
        const char *v = json_string_value(json_array_get(array, i));
        if (strlen(v) == len && !strncmp(v, s, len)) return 0;
    }
    return json_array_append_new(array, json_stringn(s, len)) ? -1 : 0;
}

/* PEFT's task_type for the plan's task: masked LM has none (a plain PeftModel). */
static json_t *task_type(int task) {
    return task == TG_TASK_CLASSIFY ? json_string("SEQ_CLS")
           : task == TG_TASK_QA     ? json_string("QUESTION_ANS")
           : task == TG_TASK_LM     ? json_string("CAUSAL_LM")
                                    : json_null();
}

/* Whether every weight of the plan's modules called `module` (tensors "*.<module>.weight")
 * has an adapter: then the name alone tells PEFT the modules, else their paths must. */
static int every_module_adapted(const tg_plan *plan, const tg_lora_pair *pairs, int n, const char *module) {
    const size_t m = strlen(module);
    for (int t = 0; t < plan->n_tensors; t++) {
        const char *name = plan->tensors[t].name, *w = strstr(name, ".weight");
        if (!w || w[7] || (size_t)(w - name) <= m || strncmp(w - m, module, m) || w[-(ptrdiff_t)m - 1] != '.') continue;
        int adapted = 0;
        for (int k = 0; k < n && !adapted; k++) adapted = pairs[k].base == t;
        if (!adapted) return 0;
    }
    return 1;
}

static char *adapter_config(const tg_plan *plan, const tg_lora_pair *pairs, int n, tg_err *err) {
    json_t *c = json_object(), *targets = json_array(), *save = json_array();
    int rc = !c || !targets || !save;
    char module[TG_NAME_MAX];
    /* target_modules: a module name where every module of that name has an adapter, else
     * each adapted module's path (a job's `mlp.c_proj` leaves GPT-2's attn.c_proj without),
     * so that PEFT adapts exactly the modules the export holds pairs for. */
    for (int k = 0; k < n && !rc; k++) {
        const char *base = plan->tensors[pairs[k].base].name;
        module_of(base, module, sizeof module);
        if (every_module_adapted(plan, pairs, n, module)) rc = append_once(targets, module, strlen(module));
        else rc = append_once(targets, base, strlen(base) - strlen(".weight"));
    }
    /* What trains whole: the task head (classifier, score, qa_outputs) as its top-level
     * module, and each module of the job's lora_modules_to_save by its path (the parameter's
     * name less its last part: transformer.ln_f), which PEFT matches as a path's tail. */
    for (int t = 0; t < plan->n_tensors && !rc; t++)
        if (tg_lora_head_param(plan, t)) {
            const char *name = plan->tensors[t].name, *dot = strchr(name, '.'), *last = strrchr(name, '.');
            const size_t top = dot ? (size_t)(dot - name) : strlen(name);
            const int head = (top == 10 && !strncmp(name, "classifier", top)) || (top == 5 && !strncmp(name, "score", top)) ||
                             (top == 10 && !strncmp(name, "qa_outputs", top));
            rc = append_once(save, name, head || !last ? top : (size_t)(last - name));
        }
    float dropout = 0;
    for (int o = 0; o < plan->n_ops; o++)
        if (plan->ops[o].kind == TG_OP_DROPOUT && plan->ops[o].phase == TG_PHASE_FORWARD &&
            strstr(plan->tensors[plan->ops[o].out[0]].name, ".lora_dropout"))
            dropout = plan->ops[o].p.dropout.p;
    const int64_t r = n ? plan->tensors[pairs[0].a].shape[0] : 0;
    if (!rc)
        rc = json_object_set_new(c, "peft_type", json_string("LORA")) |
             json_object_set_new(c, "task_type", task_type(plan->train.task)) |
             json_object_set_new(c, "base_model_name_or_path", json_string(plan->model.source)) |
             json_object_set_new(c, "r", json_integer(r)) |
             json_object_set_new(c, "lora_alpha", json_real((double)pairs[0].scale * (double)r)) |
             json_object_set_new(c, "lora_dropout", json_real(dropout)) | json_object_set_new(c, "bias", json_string("none")) |
             json_object_set_new(c, "fan_in_fan_out", json_boolean(n && pairs[0].fan_in_fan_out)) |
             json_object_set_new(c, "inference_mode", json_true()) |
             json_object_set_new(c, "init_lora_weights", json_true()) | json_object_set(c, "target_modules", targets) |
             json_object_set(c, "modules_to_save", json_array_size(save) ? save : json_null());
    char *text = rc ? NULL : json_dumps(c, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(c), json_decref(targets), json_decref(save);
    if (!text) tg_fail(err, "adapter_config.json: out of memory");
    return text;
}

int tg_lora_write_adapter(const tg_weights_image *img, const tg_lora_pair *pairs, int n, const char *dir, int bf16,
                          tg_err *err) {
    const tg_plan *plan = img->plan;
    char *config = adapter_config(plan, pairs, n, err), *path = NULL;
    if (!config) return -1;
    int rc = tg_asprintf(&path, "%s/adapter_config.json", dir) < 0 ? tg_fail(err, "out of memory") : 0;
    const tg_chunk chunk = {config, strlen(config)};
    if (!rc) rc = tg_write_file_atomic(path, &chunk, 1, "adapter_config.json", err);
    free(config);
    free(path);
    path = NULL;
    /* PEFT's names: base_model.model. + the model's, and the head and the modules of
     * lora_modules_to_save, which train whole, saved whole (modules_to_save). */
    int n_head = 0;
    for (int t = 0; t < plan->n_tensors; t++) n_head += tg_lora_head_param(plan, t);
    const int items_n = 2 * n + n_head;
    tg_st_item *items = tg_calloc((size_t)items_n + 1, sizeof *items);
    char (*names)[TG_NAME_MAX + 32] = tg_calloc((size_t)items_n + 1, sizeof *names);
    void **low = tg_calloc((size_t)items_n + 1, sizeof *low);
    if (!rc && (!items || !names || !low)) rc = tg_fail(err, "adapter_model.safetensors: out of memory");
    for (int i = 0, head = 0; i < items_n && !rc; i++) {
        if (i >= 2 * n)
            while (!tg_lora_head_param(plan, head)) head++;
        const int t = i < 2 * n ? (i % 2 ? pairs[i / 2].b : pairs[i / 2].a) : head++;
        const tg_tensor *x = &plan->tensors[t];
        snprintf(names[i], sizeof names[i], "base_model.model.%s", x->name);
        const void *values = tg_weights_value(img, t);
        int dtype = TG_ST_F32;
        if (bf16) {
            const int64_t numel = tg_tensor_numel(x);
            uint16_t *h = tg_malloc(sizeof *h * ((size_t)numel + 1));
            if (!h) {
                rc = tg_fail(err, "adapter_model.safetensors: out of memory");
                break;
            }
            tg_bf16_narrow(h, values, numel);
            values = low[i] = h, dtype = TG_ST_BF16;
        }
        items[i] = (tg_st_item){names[i], dtype, x->ndim, x->shape, values};
    }
    static const char *const metadata[] = {"format", "pt"};
    if (!rc && tg_asprintf(&path, "%s/adapter_model.safetensors", dir) < 0) rc = tg_fail(err, "out of memory");
    if (!rc) rc = tg_st_write_with_metadata(path, items, items_n, metadata, 1, err);
    free(path);
    for (int i = 0; low && i < items_n; i++) free(low[i]);
    free(low), free(names), free(items);
    return rc ? -1 : 0;
}
