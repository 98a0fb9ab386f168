/* ATTENTION and ATTENTION_BWD through cuDNN 9's graph API (kernels/cudnn_attention.h).
 *
 * The graphs are the operation patterns cuDNN's fused flash-attention engines recognise
 * (those NVIDIA's cudnn-frontend builds for its SDPA nodes with cuDNN 9.0-9.20): the
 * forward Q K^T, scale, causal mask (row index >= column index, else -inf), a softmax
 * whose max and log-sum are kept as the row statistic (our LSE), and P V; the backward
 * sum(dO * O) per row (our delta), P again from the statistic, dV = P^T dO, dS = P (dP -
 * delta) scale, dK = dS^T Q and dQ = dS K through an fp32 accumulator. Q, K and V are
 * read where the projections wrote them ([B T, H Dh] rows, or the packed [B T, 3 H Dh]),
 * by strides. */
#include "kernels/cudnn_attention.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>

#include "kernels/cuda_common.cuh"
#include "plan/ops.h"

/* ---- the library ------------------------------------------------------------------ */

struct dnn_fns {
    size_t (*GetVersion)(void);
    const char *(*GetErrorString)(cudnnStatus_t);
    void (*GetLastErrorString)(char *, size_t);
    cudnnStatus_t (*Create)(cudnnHandle_t *);
    cudnnStatus_t (*Destroy)(cudnnHandle_t);
    cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*CreateDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*DestroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*Finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*SetAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                  int64_t, const void *);
    cudnnStatus_t (*GetAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*Execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};

/* Descriptors one graph made: kept with its plan (cuDNN's plan may refer to them). */
#define DNN_MAX_DESCS 128
#define DNN_MAX_OPS 40
#define DNN_MAX_PLANS 64

/* The shape an execution plan serves. */
typedef struct dnn_key {
    int32_t backward, b, h, t, head_dim, causal, packed, dtype;
    int32_t mask; /* the key mask's bias form (BIAS_*), 0 without a key mask */
    float scale;
} dnn_key;

/* A key mask enters the graphs as an additive bias (0 kept, a large negative masked) the
 * launch makes from the mask: per key [B, 1, 1, T] broadcast over heads and queries
 * where cuDNN takes that, else written out per query, [B, 1, T, T]. */
enum { BIAS_NONE = 0, BIAS_PER_KEY = 1, BIAS_PER_QUERY = 2 };

typedef struct dnn_plan {
    dnn_key key;
    int usable;                         /* 0: no engine took it (the own kernels run it) */
    int bias_form;                      /* BIAS_*: the key mask's form in the graph */
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
    cudnnBackendDescriptor_t descs[DNN_MAX_DESCS];
    int n_descs;
} dnn_plan;

struct tg_cudnn_attention {
    void *lib;
    dnn_fns f;
    cudnnHandle_t handle;
    size_t version;
    int required; /* TUNEGRAPH_ATTENTION=cudnn */
    dnn_plan plans[DNN_MAX_PLANS];
    int n_plans;
    int ops_taken, ops_seen;
    int masked_per_key, masked_per_query; /* ops taken with a key mask, by its bias form */
    int mask_implied;                     /* causal ops taken whose key mask the graph leaves out */
};

static int dnn_fail(const tg_cudnn_attention *d, cudnnStatus_t st, const char *what, tg_err *err) {
    char last[256] = "";
    if (d->f.GetLastErrorString) d->f.GetLastErrorString(last, sizeof last);
    return tg_fail(err, "cuDNN %s: %s%s%s", what, d->f.GetErrorString ? d->f.GetErrorString(st) : "failed",
                   last[0] ? ": " : "", last);
}

static const char *backend_choice(void) {
    const char *env = getenv("TUNEGRAPH_ATTENTION");
    return env && env[0] ? env : "auto";
}

extern "C" int tg_cudnn_attention_open(tg_cudnn_attention **out, char *why, size_t why_len, tg_err *err) {
    *out = NULL;
    if (why_len) why[0] = 0;
    const char *choice = backend_choice();
    if (!strcmp(choice, "own")) {
        snprintf(why, why_len, "TUNEGRAPH_ATTENTION=own");
        return 0;
    }
    if (strcmp(choice, "auto") && strcmp(choice, "cudnn"))
        return tg_fail(err, "TUNEGRAPH_ATTENTION=%s: expected auto, own or cudnn", choice);
    const int required = !strcmp(choice, "cudnn");
    const char *path = getenv("TUNEGRAPH_CUDNN");
    if (!path || !path[0]) path = "libcudnn.so.9";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *msg = dlerror();
        if (required) return tg_fail(err, "TUNEGRAPH_ATTENTION=cudnn: cannot load %s: %s", path, msg ? msg : "?");
        snprintf(why, why_len, "%s not loaded: %s", path, msg ? msg : "?");
        return 0;
    }
    tg_cudnn_attention *d = (tg_cudnn_attention *)calloc(1, sizeof *d);
    if (!d) {
        dlclose(lib);
        return tg_fail(err, "out of host memory for the cuDNN attention state");
    }
    d->lib = lib, d->required = required;
    struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&d->f.GetVersion, "cudnnGetVersion"},
        {(void **)&d->f.GetErrorString, "cudnnGetErrorString"},
        {(void **)&d->f.GetLastErrorString, "cudnnGetLastErrorString"},
        {(void **)&d->f.Create, "cudnnCreate"},
        {(void **)&d->f.Destroy, "cudnnDestroy"},
        {(void **)&d->f.SetStream, "cudnnSetStream"},
        {(void **)&d->f.CreateDescriptor, "cudnnBackendCreateDescriptor"},
        {(void **)&d->f.DestroyDescriptor, "cudnnBackendDestroyDescriptor"},
        {(void **)&d->f.Finalize, "cudnnBackendFinalize"},
        {(void **)&d->f.SetAttribute, "cudnnBackendSetAttribute"},
        {(void **)&d->f.GetAttribute, "cudnnBackendGetAttribute"},
        {(void **)&d->f.Execute, "cudnnBackendExecute"},
    };
    for (size_t k = 0; k < sizeof syms / sizeof syms[0]; k++) {
        *syms[k].slot = dlsym(lib, syms[k].name);
        if (!*syms[k].slot) {
            const int rc = required ? tg_fail(err, "%s lacks %s (not cuDNN 9?)", path, syms[k].name) : 0;
            if (!required) snprintf(why, why_len, "%s lacks %s", path, syms[k].name);
            free(d);
            dlclose(lib);
            return rc;
        }
    }
    d->version = d->f.GetVersion();
    if (d->version < 90000) {
        const int rc = required ? tg_fail(err, "%s is cuDNN %zu; the attention graphs need 9.0 or later", path, d->version) : 0;
        if (!required) snprintf(why, why_len, "%s is cuDNN %zu, before 9.0", path, d->version);
        free(d);
        dlclose(lib);
        return rc;
    }
    cudnnStatus_t st = d->f.Create(&d->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        dnn_fail(d, st, "cudnnCreate", err);
        free(d);
        dlclose(lib);
        return -1;
    }
    *out = d;
    return 0;
}

static void plan_free(const tg_cudnn_attention *d, dnn_plan *p) {
    if (p->plan) d->f.DestroyDescriptor(p->plan);
    for (int k = p->n_descs - 1; k >= 0; k--) d->f.DestroyDescriptor(p->descs[k]);
    p->plan = NULL, p->n_descs = 0;
}

extern "C" void tg_cudnn_attention_close(tg_cudnn_attention *d) {
    if (!d) return;
    for (int k = 0; k < d->n_plans; k++) plan_free(d, &d->plans[k]);
    if (d->handle) d->f.Destroy(d->handle);
    dlclose(d->lib);
    free(d);
}

extern "C" int tg_cudnn_attention_taken(const tg_cudnn_attention *d) { return d ? d->ops_taken : 0; }

extern "C" void tg_cudnn_attention_describe(const tg_cudnn_attention *d, char *buf, size_t len) {
    if (!d) {
        snprintf(buf, len, "own kernels");
        return;
    }
    const size_t v = d->version;
    snprintf(buf, len,
             "cuDNN %zu.%zu.%zu for %d of %d attention ops (key mask as a bias: %d per key, %d per query; "
             "implied by causality: %d)",
             v / 10000, v / 100 % 100, v % 100, d->ops_taken, d->ops_seen, d->masked_per_key, d->masked_per_query,
             d->mask_implied);
}

/* ---- which ops ------------------------------------------------------------------- */

static int eligible_shape(const tg_op *op) {
    if (op->kind != TG_OP_ATTENTION && op->kind != TG_OP_ATTENTION_BWD) return 0;
    const tg_attention_params *at = &op->p.attention;
    return (at->head_dim == 64 || at->head_dim == 128) && at->p == 0.0f && at->b > 0 && at->h > 0 && at->t > 0;
}

extern "C" int tg_cudnn_attention_eligible(const tg_op *op, int dtype) {
    return (dtype == TG_BF16 || dtype == TG_F16) && eligible_shape(op);
}

/* In the reduction scratch: the key mask's bias (16-bit, room for the per-query form,
 * rounded to 4 floats), then the backward's fp32 dQ accumulator, its rows rounded up to
 * whole 128-row tiles (the engines may clear or write past B H T Dh). */
static int64_t dq_floats(const tg_op *op) {
    const tg_attention_params *at = &op->p.attention;
    return op->kind == TG_OP_ATTENTION_BWD ? at->b * at->h * ((at->t + 127) / 128 * 128) * at->head_dim : 0;
}

/* Whether the graph needs the op's key mask. A causal op's does not: a step's mask is
 * always ones then zeros (tg_batch_fill writes each row's tokens first, its padding
 * after), so every key a real query sees (at or before it) is a real token, and only the
 * padding rows' outputs change without the mask. Those rows' outputs reach no loss and no
 * real row (causality again, layer after layer), so their upstream gradients are 0 and
 * every gradient is the masked one. This keeps the fused kernels' fast unmasked path
 * (the masked backward needs the per-query bias, twice as slow at Llama-3-8B's shape). */
static int key_mask_needed(const tg_op *op) { return op->in[3] >= 0 && !op->p.attention.causal; }

static int64_t bias_floats(const tg_op *op) {
    const tg_attention_params *at = &op->p.attention;
    return key_mask_needed(op) ? (at->b * at->t * at->t / 2 + 3) / 4 * 4 : 0;
}

extern "C" int64_t tg_cudnn_attention_scratch_floats(const tg_op *op) {
    if (!eligible_shape(op)) return 0;
    return dq_floats(op) + bias_floats(op);
}

static dnn_key key_of(const tg_op *op, int dtype) {
    const tg_attention_params *at = &op->p.attention;
    dnn_key k;
    memset(&k, 0, sizeof k);
    k.backward = op->kind == TG_OP_ATTENTION_BWD;
    k.b = (int32_t)at->b, k.h = (int32_t)at->h, k.t = (int32_t)at->t, k.head_dim = (int32_t)at->head_dim;
    k.causal = at->causal != 0, k.packed = at->packed != 0, k.dtype = dtype, k.scale = at->scale;
    k.mask = key_mask_needed(op) ? BIAS_PER_KEY : BIAS_NONE;
    return k;
}

static dnn_plan *find_plan(tg_cudnn_attention *d, const dnn_key *k) {
    for (int i = 0; i < d->n_plans; i++)
        if (!memcmp(&d->plans[i].key, k, sizeof *k)) return &d->plans[i];
    return NULL;
}

/* ---- building a graph ------------------------------------------------------------ */

/* The tensors' unique ids in the variant pack. */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_DO, UID_DQ, UID_DK, UID_DV, UID_SUM,
    UID_DQ_ACC, UID_ONE, UID_BIAS, UID_VIRTUAL /* first of the virtual tensors' */
};

typedef struct graph_builder {
    const tg_cudnn_attention *d;
    dnn_plan *p;              /* owns the descriptors */
    cudnnBackendDescriptor_t ops[DNN_MAX_OPS];
    int n_ops;
    int64_t next_uid;
    cudnnStatus_t st;         /* the first failure */
    char what[160];
} graph_builder;

static void gb_failed(graph_builder *g, cudnnStatus_t st, const char *what) {
    if (g->st == CUDNN_STATUS_SUCCESS && st != CUDNN_STATUS_SUCCESS) {
        g->st = st;
        snprintf(g->what, sizeof g->what, "%s", what);
    }
}

static cudnnBackendDescriptor_t gb_new(graph_builder *g, cudnnBackendDescriptorType_t type, const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->p->n_descs == DNN_MAX_DESCS) {
        gb_failed(g, CUDNN_STATUS_INTERNAL_ERROR, "descriptor table full");
        return NULL;
    }
    cudnnBackendDescriptor_t x = NULL;
    gb_failed(g, g->d->f.CreateDescriptor(type, &x), what);
    if (g->st == CUDNN_STATUS_SUCCESS) g->p->descs[g->p->n_descs++] = x;
    return g->st == CUDNN_STATUS_SUCCESS ? x : NULL;
}

static void gb_set(graph_builder *g, cudnnBackendDescriptor_t x, cudnnBackendAttributeName_t attr,
                   cudnnBackendAttributeType_t type, int64_t n, const void *v, const char *what) {
    if (g->st == CUDNN_STATUS_SUCCESS) gb_failed(g, g->d->f.SetAttribute(x, attr, type, n, v), what);
}

static void gb_finalize(graph_builder *g, cudnnBackendDescriptor_t x, const char *what) {
    if (g->st == CUDNN_STATUS_SUCCESS) gb_failed(g, g->d->f.Finalize(x), what);
}

/* A tensor of rank `nd` (4, or 1-dim scalars given as four 1s). */
static cudnnBackendDescriptor_t gb_tensor(graph_builder *g, int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                          const int64_t *strides, bool is_virtual, bool by_value) {
    cudnnBackendDescriptor_t x = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
    const int64_t align = 16;
    gb_set(g, x, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    gb_set(g, x, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dimensions");
    gb_set(g, x, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    gb_set(g, x, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
    gb_set(g, x, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    gb_set(g, x, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual flag");
    if (by_value) gb_set(g, x, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by-value flag");
    gb_finalize(g, x, "tensor descriptor");
    return x;
}

static cudnnBackendDescriptor_t gb_virtual(graph_builder *g, cudnnDataType_t dt, const int64_t *dims,
                                           const int64_t *strides) {
    return gb_tensor(g, g->next_uid++, dt, dims, strides, true, false);
}

static cudnnBackendDescriptor_t gb_scalar(graph_builder *g, int64_t uid) {
    static const int64_t ones[4] = {1, 1, 1, 1};
    return gb_tensor(g, uid, CUDNN_DATA_FLOAT, ones, ones, false, true);
}

static void gb_op(graph_builder *g, cudnnBackendDescriptor_t op) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (g->n_ops == DNN_MAX_OPS) gb_failed(g, CUDNN_STATUS_INTERNAL_ERROR, "operation table full");
    else g->ops[g->n_ops++] = op;
}

static void gb_matmul(graph_builder *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t c) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
    gb_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
    gb_finalize(g, mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul A");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul B");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul C");
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul descriptor");
    gb_finalize(g, op, "matmul operation");
    gb_op(g, op);
}

/* y = mode(x[, b][, t]); `axis` for GEN_INDEX (else -1). */
static void gb_pointwise(graph_builder *g, cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                         cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                         int64_t axis) {
    cudnnBackendDescriptor_t pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math, "pointwise precision");
    if (axis >= 0) gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    gb_finalize(g, pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
    if (b) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
    if (t) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
    gb_finalize(g, op, "pointwise operation");
    gb_op(g, op);
}

static void gb_reduce(graph_builder *g, cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "reduction operator");
    gb_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
    gb_finalize(g, rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction descriptor");
    gb_finalize(g, op, "reduction operation");
    gb_op(g, op);
}

static void gb_reshape(graph_builder *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
    gb_finalize(g, op, "reshape operation");
    gb_op(g, op);
}

/* The layouts: [b, h, rows, cols] with the given strides. */
typedef struct layout {
    int64_t dims[4], strides[4];
} layout;

static layout lay(int64_t d0, int64_t d1, int64_t d2, int64_t d3, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    layout l = {{d0, d1, d2, d3}, {s0, s1, s2, s3}};
    return l;
}

/* A new fp32 virtual tensor of layout `l` = mode(x[, b]). */
static cudnnBackendDescriptor_t gb_apply(graph_builder *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                         cudnnBackendDescriptor_t b, const layout *l) {
    cudnnBackendDescriptor_t y = gb_virtual(g, CUDNN_DATA_FLOAT, l->dims, l->strides);
    gb_pointwise(g, mode, CUDNN_DATA_FLOAT, x, b, NULL, y, -1);
    return y;
}

/* Scores masked to row >= column (causal, the diagonal at the top left) where `causal`;
 * returns the tensor the softmax reads. */
static cudnnBackendDescriptor_t gb_causal(graph_builder *g, const dnn_key *k, cudnnBackendDescriptor_t s,
                                          cudnnBackendDescriptor_t neg_inf, const layout *sc) {
    if (!k->causal) return s;
    cudnnBackendDescriptor_t row = gb_virtual(g, CUDNN_DATA_INT32, sc->dims, sc->strides);
    cudnnBackendDescriptor_t col = gb_virtual(g, CUDNN_DATA_INT32, sc->dims, sc->strides);
    cudnnBackendDescriptor_t keep = gb_virtual(g, CUDNN_DATA_BOOLEAN, sc->dims, sc->strides);
    cudnnBackendDescriptor_t out = gb_virtual(g, CUDNN_DATA_FLOAT, sc->dims, sc->strides);
    gb_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
    gb_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
    gb_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    gb_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neg_inf, keep, out, -1);
    return out;
}

/* scores + the key mask's bias where the op has a key mask. */
static cudnnBackendDescriptor_t gb_bias(graph_builder *g, const dnn_key *k, cudnnBackendDescriptor_t s,
                                        cudnnDataType_t io, const layout *sc) {
    if (k->mask == BIAS_NONE) return s;
    const int64_t B = k->b, T = k->t;
    const layout per_key = lay(B, 1, 1, T, T, T, T, 1), per_query = lay(B, 1, T, T, T * T, T * T, T, 1);
    const layout *l = k->mask == BIAS_PER_KEY ? &per_key : &per_query;
    cudnnBackendDescriptor_t bias = gb_tensor(g, UID_BIAS, io, l->dims, l->strides, false, false);
    cudnnBackendDescriptor_t out = gb_virtual(g, CUDNN_DATA_FLOAT, sc->dims, sc->strides);
    gb_pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, s, bias, NULL, out, -1);
    return out;
}

static void build_forward(graph_builder *g, const dnn_key *k, cudnnDataType_t io) {
    const int64_t B = k->b, H = k->h, T = k->t, Dh = k->head_dim, D = H * Dh, ld = k->packed ? 3 * D : D;
    const layout q = lay(B, H, T, Dh, T * ld, Dh, ld, 1), kt = lay(B, H, Dh, T, T * ld, Dh, 1, ld);
    const layout o = lay(B, H, T, Dh, T * D, Dh, D, 1), row = lay(B, H, T, 1, H * T, T, 1, 1);
    const layout sc = lay(B, H, T, T, H * T * T, T * T, T, 1);
    cudnnBackendDescriptor_t Q = gb_tensor(g, UID_Q, io, q.dims, q.strides, false, false);
    cudnnBackendDescriptor_t K = gb_tensor(g, UID_K, io, kt.dims, kt.strides, false, false);
    cudnnBackendDescriptor_t V = gb_tensor(g, UID_V, io, q.dims, q.strides, false, false);
    cudnnBackendDescriptor_t O = gb_tensor(g, UID_O, io, o.dims, o.strides, false, false);
    cudnnBackendDescriptor_t stats = gb_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, row.dims, row.strides, false, false);
    cudnnBackendDescriptor_t scale = gb_scalar(g, UID_SCALE);
    cudnnBackendDescriptor_t neg_inf = k->causal ? gb_scalar(g, UID_NEG_INF) : NULL;

    cudnnBackendDescriptor_t s = gb_virtual(g, CUDNN_DATA_FLOAT, sc.dims, sc.strides);
    gb_matmul(g, Q, K, s);
    cudnnBackendDescriptor_t scaled = gb_apply(g, CUDNN_POINTWISE_MUL, s, scale, &sc);
    cudnnBackendDescriptor_t masked = gb_causal(g, k, gb_bias(g, k, scaled, io, &sc), neg_inf, &sc);
    /* softmax, keeping max + log(sum) as the row statistic */
    cudnnBackendDescriptor_t mx = gb_virtual(g, CUDNN_DATA_FLOAT, row.dims, row.strides);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_MAX, masked, mx);
    cudnnBackendDescriptor_t centred = gb_apply(g, CUDNN_POINTWISE_SUB, masked, mx, &sc);
    cudnnBackendDescriptor_t e = gb_apply(g, CUDNN_POINTWISE_EXP, centred, NULL, &sc);
    cudnnBackendDescriptor_t sum = gb_virtual(g, CUDNN_DATA_FLOAT, row.dims, row.strides);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    cudnnBackendDescriptor_t log_sum = gb_apply(g, CUDNN_POINTWISE_LOG, sum, NULL, &row);
    gb_pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, log_sum, NULL, stats, -1);
    cudnnBackendDescriptor_t p = gb_virtual(g, io, sc.dims, sc.strides);
    gb_pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, sum, NULL, p, -1);
    gb_matmul(g, p, V, O);
}

static void build_backward(graph_builder *g, const dnn_key *k, cudnnDataType_t io) {
    const int64_t B = k->b, H = k->h, T = k->t, Dh = k->head_dim, D = H * Dh, ld = k->packed ? 3 * D : D;
    const layout q = lay(B, H, T, Dh, T * ld, Dh, ld, 1), kt = lay(B, H, Dh, T, T * ld, Dh, 1, ld);
    const layout o = lay(B, H, T, Dh, T * D, Dh, D, 1), row = lay(B, H, T, 1, H * T, T, 1, 1);
    const layout sc = lay(B, H, T, T, H * T * T, T * T, T, 1), sct = lay(B, H, T, T, H * T * T, T * T, 1, T);
    const layout acc = lay(B, H, T, Dh, H * T * Dh, T * Dh, Dh, 1);
    /* sum(dO * O) over a row: cudnn-frontend's layout of the product (virtual) */
    const layout prod = lay(B, H, T, Dh, H * T * Dh, T * Dh, H * Dh, 1);
    cudnnBackendDescriptor_t Q = gb_tensor(g, UID_Q, io, q.dims, q.strides, false, false);
    cudnnBackendDescriptor_t K = gb_tensor(g, UID_K, io, kt.dims, kt.strides, false, false);
    cudnnBackendDescriptor_t V = gb_tensor(g, UID_V, io, kt.dims, kt.strides, false, false);
    cudnnBackendDescriptor_t O = gb_tensor(g, UID_O, io, o.dims, o.strides, false, false);
    cudnnBackendDescriptor_t dO = gb_tensor(g, UID_DO, io, o.dims, o.strides, false, false);
    cudnnBackendDescriptor_t stats = gb_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, row.dims, row.strides, false, false);
    cudnnBackendDescriptor_t dQ = gb_tensor(g, UID_DQ, io, q.dims, q.strides, false, false);
    cudnnBackendDescriptor_t dK = gb_tensor(g, UID_DK, io, q.dims, q.strides, false, false);
    cudnnBackendDescriptor_t dV = gb_tensor(g, UID_DV, io, q.dims, q.strides, false, false);
    cudnnBackendDescriptor_t delta = gb_tensor(g, UID_SUM, CUDNN_DATA_FLOAT, row.dims, row.strides, false, false);
    cudnnBackendDescriptor_t dq_acc = gb_tensor(g, UID_DQ_ACC, CUDNN_DATA_FLOAT, acc.dims, acc.strides, false, false);
    cudnnBackendDescriptor_t scale = gb_scalar(g, UID_SCALE);
    cudnnBackendDescriptor_t one = gb_scalar(g, UID_ONE);
    cudnnBackendDescriptor_t neg_inf = k->causal ? gb_scalar(g, UID_NEG_INF) : NULL;

    /* delta = sum(dO * O) per row */
    cudnnBackendDescriptor_t d_o = gb_apply(g, CUDNN_POINTWISE_MUL, dO, O, &prod);
    cudnnBackendDescriptor_t rowsum = gb_virtual(g, CUDNN_DATA_FLOAT, row.dims, row.strides);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, d_o, rowsum);
    gb_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rowsum, one, NULL, delta, -1);
    /* P = exp(scale Q K^T - LSE), masked */
    cudnnBackendDescriptor_t s = gb_virtual(g, CUDNN_DATA_FLOAT, sc.dims, sc.strides);
    gb_matmul(g, Q, K, s);
    cudnnBackendDescriptor_t scaled = gb_apply(g, CUDNN_POINTWISE_MUL, s, scale, &sc);
    cudnnBackendDescriptor_t centred = gb_apply(g, CUDNN_POINTWISE_SUB, gb_bias(g, k, scaled, io, &sc), stats, &sc);
    cudnnBackendDescriptor_t masked = gb_causal(g, k, centred, neg_inf, &sc);
    cudnnBackendDescriptor_t p = gb_apply(g, CUDNN_POINTWISE_EXP, masked, NULL, &sc);
    /* dV = P^T dO */
    cudnnBackendDescriptor_t pt = gb_virtual(g, io, sct.dims, sct.strides);
    gb_reshape(g, p, pt);
    gb_matmul(g, pt, dO, dV);
    /* dS = P (dO V^T - delta) scale */
    cudnnBackendDescriptor_t dp = gb_virtual(g, CUDNN_DATA_FLOAT, sc.dims, sc.strides);
    gb_matmul(g, dO, V, dp);
    cudnnBackendDescriptor_t dp_c = gb_apply(g, CUDNN_POINTWISE_SUB, dp, delta, &sc);
    cudnnBackendDescriptor_t ds_u = gb_apply(g, CUDNN_POINTWISE_MUL, dp_c, p, &sc);
    cudnnBackendDescriptor_t ds = gb_apply(g, CUDNN_POINTWISE_MUL, ds_u, scale, &sc);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = gb_virtual(g, io, sct.dims, sct.strides);
    gb_reshape(g, ds, dst);
    gb_matmul(g, dst, Q, dK);
    /* dQ = dS K, through the fp32 accumulator */
    cudnnBackendDescriptor_t kn = gb_virtual(g, io, q.dims, q.strides);
    gb_reshape(g, K, kn);
    gb_matmul(g, ds, kn, dq_acc);
    gb_pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_acc, NULL, NULL, dQ, -1);
}

/* The graph, the heuristic's engine configurations, and the first whose plan finalizes
 * with at most `workspace_limit` bytes of workspace. Sets p->usable; -1 only on a
 * failure outside the engines' say (err). */
static int build_plan(tg_cudnn_attention *d, dnn_plan *p, size_t workspace_limit, tg_err *err) {
    graph_builder g;
    memset(&g, 0, sizeof g);
    g.d = d, g.p = p, g.next_uid = UID_VIRTUAL;
    const cudnnDataType_t io = p->key.dtype == TG_F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
    if (p->key.backward) build_backward(&g, &p->key, io);
    else build_forward(&g, &p->key, io);
    cudnnBackendDescriptor_t graph = gb_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.n_ops, g.ops, "graph operations");
    gb_set(&g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &d->handle, "graph handle");
    gb_finalize(&g, graph, "operation graph");
    if (g.st != CUDNN_STATUS_SUCCESS) {
        /* A graph this version cannot express: not an error, the own kernels take it. */
        if (d->required) return dnn_fail(d, g.st, g.what, err);
        p->usable = 0;
        return 0;
    }
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = gb_new(&g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristic");
    gb_set(&g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristic graph");
    gb_set(&g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristic mode");
    gb_finalize(&g, heur, "engine heuristic");
    enum { MAX_CFGS = 8 };
    cudnnBackendDescriptor_t cfgs[MAX_CFGS];
    int n_cfgs = 0;
    for (; n_cfgs < MAX_CFGS && g.st == CUDNN_STATUS_SUCCESS; n_cfgs++)
        cfgs[n_cfgs] = gb_new(&g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine configuration");
    int64_t got = 0;
    if (g.st == CUDNN_STATUS_SUCCESS)
        gb_failed(&g, d->f.GetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_cfgs,
                                        &got, cfgs),
                  "engine heuristic results");
    if (g.st != CUDNN_STATUS_SUCCESS) {
        if (d->required) return dnn_fail(d, g.st, g.what, err);
        p->usable = 0;
        return 0;
    }
    char last[200] = "no engine configuration";
    for (int64_t c = 0; c < got; c++) {
        cudnnBackendDescriptor_t plan = NULL;
        cudnnStatus_t st = d->f.CreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (st != CUDNN_STATUS_SUCCESS) return dnn_fail(d, st, "creating an execution plan", err);
        if ((st = d->f.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &d->handle)) ==
                CUDNN_STATUS_SUCCESS &&
            (st = d->f.SetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                    &cfgs[c])) == CUDNN_STATUS_SUCCESS &&
            (st = d->f.Finalize(plan)) == CUDNN_STATUS_SUCCESS) {
            int64_t ws = 0, n = 0;
            st = d->f.GetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
            if (st == CUDNN_STATUS_SUCCESS && ws >= 0 && (uint64_t)ws <= workspace_limit) {
                p->plan = plan, p->workspace = ws, p->usable = 1;
                return 0;
            }
            if (st == CUDNN_STATUS_SUCCESS)
                snprintf(last, sizeof last, "engine configuration %lld needs %lld bytes of workspace, past %zu",
                         (long long)c, (long long)ws, workspace_limit);
        }
        if (st != CUDNN_STATUS_SUCCESS) {
            char msg[160] = "";
            d->f.GetLastErrorString(msg, sizeof msg);
            snprintf(last, sizeof last, "engine configuration %lld: %s%s%s", (long long)c, d->f.GetErrorString(st),
                     msg[0] ? ": " : "", msg);
        }
        d->f.DestroyDescriptor(plan);
    }
    if (d->required)
        return tg_fail(err, "cuDNN takes no %s attention of B %d H %d T %d Dh %d%s: %s",
                       p->key.backward ? "backward" : "forward", p->key.b, p->key.h, p->key.t, p->key.head_dim,
                       p->key.causal ? " causal" : "", last);
    p->usable = 0;
    return 0;
}

extern "C" int tg_cudnn_attention_prepare(tg_cudnn_attention *d, const tg_op *op, int dtype, size_t workspace_limit,
                                          tg_err *err) {
    if (!d || (op->kind != TG_OP_ATTENTION && op->kind != TG_OP_ATTENTION_BWD)) return 0;
    d->ops_seen++;
    if (!tg_cudnn_attention_eligible(op, dtype)) return 0;
    const dnn_key k = key_of(op, dtype);
    dnn_plan *p = find_plan(d, &k);
    if (!p) {
        if (d->n_plans == DNN_MAX_PLANS) return 0; /* more shapes than kept: the own kernels run the rest */
        p = &d->plans[d->n_plans++];
        memset(p, 0, sizeof *p);
        p->key = k;
        /* A key mask: the forward takes the broadcast per-key bias first, the per-query one
         * where cuDNN takes only that; the backward the per-query one alone (cuDNN 9.19's
         * backward finalizes with the per-key form but its gradients are wrong: dQ 68%
         * off the reference at Llama-3-8B's shape, while its forward matches). An error
         * under TUNEGRAPH_ATTENTION=cudnn waits for the last form. */
        const int forms = k.mask ? 2 : 1;
        for (int f = k.mask && k.backward ? 1 : 0; f < forms && !p->usable; f++) {
            if (k.mask) p->key.mask = f == 0 ? BIAS_PER_KEY : BIAS_PER_QUERY;
            const int saved = d->required;
            d->required = saved && f == forms - 1;
            const int rc = build_plan(d, p, workspace_limit, err);
            d->required = saved;
            if (rc) {
                plan_free(d, p);
                d->n_plans--;
                return tg_fail_context(err, "building the cuDNN attention plan");
            }
            if (!p->usable) plan_free(d, p);
        }
        p->bias_form = p->usable ? p->key.mask : BIAS_NONE;
        p->key.mask = k.mask; /* found again by the op's own key */
    }
    d->ops_taken += p->usable;
    d->masked_per_key += p->usable && p->bias_form == BIAS_PER_KEY;
    d->masked_per_query += p->usable && p->bias_form == BIAS_PER_QUERY;
    d->mask_implied += p->usable && op->in[3] >= 0 && !key_mask_needed(op);
    return p->usable;
}

/* ---- running ---------------------------------------------------------------------- */

/* The additive bias of key mask `mask` [B, T] (1 keep, 0 masked): 0 where kept, else a
 * large negative that is finite in the storage type (a row with no kept key then averages
 * V instead of the reference's 0; such rows are padding, whose gradient is 0). Per key
 * [B, T], or per query [B, T, T] (element (b, q, k) from mask[b, k]). */
template <class T>
__global__ void key_mask_bias(const float *mask, T *bias, int64_t total, int64_t t, int per_query, float masked) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t key = per_query ? (i / (t * t)) * t + i % t : i;
        tg_st(bias, i, mask[key] != 0.0f ? 0.0f : masked);
    }
}

extern "C" int tg_cudnn_attention_run(const tg_cuda_op_args *a, int backward, tg_err *err) {
    tg_cudnn_attention *d = (tg_cudnn_attention *)a->ctx->cudnn;
    const int dtype = a->in_dtype[backward ? 5 : 0];
    if (!d || !tg_cudnn_attention_eligible(a->op, dtype)) return 0;
    const dnn_key k = key_of(a->op, dtype);
    const dnn_plan *p = find_plan(d, &k);
    if (!p || !p->usable) return 0; /* not prepared (the executor prepares every op it runs) or no engine */
    const tg_attention_params *at = &a->op->p.attention;
    const int64_t D = at->h * at->head_dim, es = 2;
    const int qs = backward ? 5 : 0;
    char *qkv = (char *)a->in[qs];
    void *q = qkv, *kk = at->packed ? qkv + D * es : a->in[qs + 1], *v = at->packed ? qkv + 2 * D * es : a->in[qs + 2];
    if (!q || !kk || !v) return tg_fail(err, "cuDNN attention: q, k and v are needed");
    float scale = at->scale, neg_inf = -INFINITY, one = 1.0f;
    int64_t uids[16];
    void *ptrs[16];
    int n = 0;
#define BIND(uid, ptr) (uids[n] = (uid), ptrs[n] = (void *)(ptr), n++)
    BIND(UID_Q, q), BIND(UID_K, kk), BIND(UID_V, v), BIND(UID_SCALE, &scale);
    if (at->causal) BIND(UID_NEG_INF, &neg_inf);
    if ((size_t)tg_cudnn_attention_scratch_floats(a->op) > a->ctx->reduce_scratch_floats)
        return tg_fail(err, "cuDNN attention: the reduction scratch holds %zu floats, the op needs %lld",
                       a->ctx->reduce_scratch_floats, (long long)tg_cudnn_attention_scratch_floats(a->op));
    float *bias = a->ctx->reduce_scratch, *dq_acc = bias + bias_floats(a->op);
    if (p->bias_form != BIAS_NONE) {
        if (!a->in[3]) return tg_fail(err, "cuDNN attention: the key mask is missing");
        const int64_t total = p->bias_form == BIAS_PER_KEY ? (int64_t)at->b * at->t : (int64_t)at->b * at->t * at->t;
        const unsigned blocks = (unsigned)((total + 255) / 256);
        if (dtype == TG_F16)
            key_mask_bias<tg_f16><<<blocks, 256, 0, a->ctx->stream>>>((const float *)a->in[3], (tg_f16 *)bias, total,
                                                                       at->t, p->bias_form == BIAS_PER_QUERY, -65504.0f);
        else
            key_mask_bias<tg_bf16><<<blocks, 256, 0, a->ctx->stream>>>((const float *)a->in[3], (tg_bf16 *)bias, total,
                                                                        at->t, p->bias_form == BIAS_PER_QUERY, -1e30f);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return tg_fail(err, "cuDNN attention: the key mask's bias: %s", cudaGetErrorString(e));
        BIND(UID_BIAS, bias);
    }
    if (!backward) {
        BIND(UID_O, a->out[0]), BIND(UID_STATS, a->out[1]);
    } else {
        char *dq = (char *)a->out[0];
        void *dk = at->packed ? dq + D * es : a->out[1], *dv = at->packed ? dq + 2 * D * es : a->out[2];
        if (!dq || !dk || !dv || !a->out[3]) return tg_fail(err, "cuDNN attention backward: dq, dk, dv and delta are needed");
        BIND(UID_DO, a->in[0]), BIND(UID_O, a->in[1]), BIND(UID_STATS, a->in[2]), BIND(UID_DQ, dq), BIND(UID_DK, dk);
        BIND(UID_DV, dv), BIND(UID_SUM, a->out[3]), BIND(UID_DQ_ACC, dq_acc), BIND(UID_ONE, &one);
        /* Before 9.6 the accumulator was the caller's to clear. */
        if (d->version < 90600) {
            const cudaError_t e = cudaMemsetAsync(dq_acc, 0, (size_t)dq_floats(a->op) * sizeof(float), a->ctx->stream);
            if (e != cudaSuccess)
                return tg_fail(err, "cuDNN attention backward: clearing the dQ accumulator: %s", cudaGetErrorString(e));
        }
    }
#undef BIND
    if (p->workspace > 0 && (size_t)p->workspace > a->ctx->gemm_workspace_bytes)
        return tg_fail(err, "cuDNN attention: its plan needs %lld bytes of workspace, %zu are there", (long long)p->workspace,
                       a->ctx->gemm_workspace_bytes);
    cudnnStatus_t st = d->f.SetStream(d->handle, a->ctx->stream);
    if (st != CUDNN_STATUS_SUCCESS) return dnn_fail(d, st, "cudnnSetStream", err);
    cudnnBackendDescriptor_t pack = NULL;
    st = d->f.CreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st != CUDNN_STATUS_SUCCESS) return dnn_fail(d, st, "creating the variant pack", err);
    void *ws = a->ctx->gemm_workspace;
    const char *what = "variant pack ids";
    if ((st = d->f.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids)) ==
            CUDNN_STATUS_SUCCESS &&
        (what = "variant pack pointers",
         st = d->f.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs)) ==
            CUDNN_STATUS_SUCCESS &&
        (what = "variant pack workspace",
         st = d->f.SetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) ==
            CUDNN_STATUS_SUCCESS &&
        (what = "variant pack", st = d->f.Finalize(pack)) == CUDNN_STATUS_SUCCESS)
        what = backward ? "attention backward" : "attention forward", st = d->f.Execute(d->handle, p->plan, pack);
    int rc = st == CUDNN_STATUS_SUCCESS ? 1 : dnn_fail(d, st, what, err);
    d->f.DestroyDescriptor(pack);
    return rc;
}
