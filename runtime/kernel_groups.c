/* Kernel names to groups, and a trace's sums (runtime/kernel_groups.h). */
#include "runtime/kernel_groups.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/alloc.h"

/* This project's kernels, by the prefix of their names (the .cu files of kernels/). Longer prefixes
 * that share a start come first. */
static const struct {
    const char *prefix;
    int group;
} OWN[] = {
    {"fa32_", TG_GROUP_ATTENTION},     {"fa_", TG_GROUP_ATTENTION},
    {"attn_softmax", TG_GROUP_ATTENTION}, {"heads_kernel", TG_GROUP_ATTENTION},
    {"key_mask_bias", TG_GROUP_ATTENTION},
    {"ln_", TG_GROUP_NORM},            {"rln_", TG_GROUP_NORM},
    {"fc_bwd", TG_GROUP_NORM},         {"fc_final", TG_GROUP_NORM},
    {"col_stripe", TG_GROUP_NORM},     {"col_final", TG_GROUP_NORM},
    {"rmsnorm", TG_GROUP_NORM},        {"rope", TG_GROUP_NORM},
    {"swiglu", TG_GROUP_NORM},         {"ew_kernel", TG_GROUP_NORM},
    {"dropout_kernel", TG_GROUP_NORM}, {"mlm_mask", TG_GROUP_NORM},
    {"emb_", TG_GROUP_EMBEDDING},
    {"ce_", TG_GROUP_LOSS},            {"select_", TG_GROUP_LOSS},
    {"span_loss", TG_GROUP_LOSS},      {"loss_window", TG_GROUP_LOSS},
    {"adamw", TG_GROUP_OPTIMIZER},     {"adan", TG_GROUP_OPTIMIZER},
    {"norm_squares", TG_GROUP_OPTIMIZER}, {"norm_final", TG_GROUP_OPTIMIZER},
    {"schedule_kernel", TG_GROUP_OPTIMIZER}, {"loss_scale_kernel", TG_GROUP_OPTIMIZER},
    {"fill_kernel", TG_GROUP_MEMORY},  {"take_batch", TG_GROUP_MEMORY},
    {"fetch_batch", TG_GROUP_MEMORY},  {"label_rows", TG_GROUP_MEMORY},
    {"stamp_kernel", TG_GROUP_MEMORY}, {"step_end", TG_GROUP_MEMORY},
    {"set_flag", TG_GROUP_MEMORY},
    {"conv2d_", TG_GROUP_MATMUL},      {"depthwise_", TG_GROUP_MATMUL}, /* the image model's (conv.cu, */
    {"dw3_", TG_GROUP_MATMUL},
    {"bn_", TG_GROUP_NORM},            {"avg_pool", TG_GROUP_NORM},     /* batchnorm.cu) */
    {"image_input", TG_GROUP_NORM}, /* the image batch into the network (image_input.cu) */
};

/* The libraries' kernels, by what their names hold (case-insensitive), the first rule that
 * matches. */
static const struct {
    const char *part;
    int group;
} LIBRARY[] = {
    {"nccl", TG_GROUP_COMM},                                              /* ncclDevKernel_... */
    {"fmha", TG_GROUP_ATTENTION},    {"sdpa", TG_GROUP_ATTENTION},       /* fused attention (cuDNN's), */
    {"flash", TG_GROUP_ATTENTION},   {"cudnn", TG_GROUP_ATTENTION},      /* before the products' rules */
    {"gemm", TG_GROUP_MATMUL},       {"nvjet", TG_GROUP_MATMUL},         /* cuBLASLt, its bias-gradient */
    {"cutlass", TG_GROUP_MATMUL},    {"xmma", TG_GROUP_MATMUL},          /* epilogue kernels included */
    {"splitkreduce", TG_GROUP_MATMUL}, {"cublas", TG_GROUP_MATMUL},
    {"memset", TG_GROUP_MEMORY},     {"memcpy", TG_GROUP_MEMORY},        /* the driver's fills and copies */
};

/* The identifier a name starts with, with a C++ mangling's _Z<length> taken off: into
 * base (cap bytes). */
static void base_name(const char *name, char *base, size_t cap) {
    const char *p = name;
    size_t len = 0;
    if (p[0] == '_' && p[1] == 'Z' && isdigit((unsigned char)p[2])) {
        p += 2;
        while (isdigit((unsigned char)*p)) len = len * 10 + (size_t)(*p++ - '0');
        if (len > strlen(p)) len = strlen(p);
    } else
        while (p[len] && (isalnum((unsigned char)p[len]) || p[len] == '_')) len++;
    if (len >= cap) len = cap - 1;
    memcpy(base, p, len);
    base[len] = 0;
}

static int holds(const char *s, const char *part) {
    const size_t n = strlen(part);
    for (; *s; s++)
        if (strncasecmp(s, part, n) == 0) return 1;
    return 0;
}

int tg_kernel_group_of(const char *name) {
    if (!name) return -1;
    char base[256];
    base_name(name, base, sizeof base);
    for (size_t i = 0; i < sizeof OWN / sizeof OWN[0]; i++)
        if (strncmp(base, OWN[i].prefix, strlen(OWN[i].prefix)) == 0) return OWN[i].group;
    for (size_t i = 0; i < sizeof LIBRARY / sizeof LIBRARY[0]; i++)
        if (holds(name, LIBRARY[i].part)) return LIBRARY[i].group;
    return -1;
}

static int by_start(const void *a, const void *b) {
    const tg_kernel_span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* Merges spans (sorted by start) into disjoint intervals, in order, into iv (room for n):
 * every span with `any`, else the communication ones (comm 1) or the others (comm 0).
 * Returns the intervals' count. */
static int64_t merge(const tg_kernel_span *s, int64_t n, int comm, int any, tg_kernel_span *iv) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!any && (s[i].group == TG_GROUP_COMM) != comm) continue;
        if (m && s[i].start <= iv[m - 1].end) {
            if (s[i].end > iv[m - 1].end) iv[m - 1].end = s[i].end;
        } else
            iv[m++] = s[i];
    }
    return m;
}

static double length_ns(const tg_kernel_span *iv, int64_t m) {
    double ns = 0;
    for (int64_t i = 0; i < m; i++) ns += (double)(iv[i].end - iv[i].start);
    return ns;
}

int tg_kernel_trace_summarize(tg_kernel_span *spans, int64_t n, int steps, tg_kernel_trace_summary *out,
                              tg_err *err) {
    memset(out, 0, sizeof *out);
    out->steps = steps;
    out->kernels = n;
    if (n <= 0 || steps <= 0) return 0;
    qsort(spans, (size_t)n, sizeof *spans, by_start);
    tg_kernel_span *compute = tg_malloc((size_t)n * sizeof *compute), *comm = tg_malloc((size_t)n * sizeof *comm);
    if (!compute || !comm) {
        free(compute), free(comm);
        return tg_fail(err, "out of memory for a kernel trace's %lld spans", (long long)n);
    }
    const double per = 1e-6 / steps; /* ns in all -> ms a step */
    for (int64_t i = 0; i < n; i++) {
        const double ns = (double)(spans[i].end - spans[i].start);
        if (spans[i].group >= 0 && spans[i].group < TG_GROUP_COUNT) out->group_ms[spans[i].group] += ns * per;
        else out->other_ms += ns * per;
    }
    out->busy_ms = length_ns(compute, merge(spans, n, 0, 1, compute)) * per;
    /* The communication beside other work: each merged stretch of communication against the
     * merged stretches of everything else (both in order, one pass). */
    const int64_t mc = merge(spans, n, 0, 0, compute), mm = merge(spans, n, 1, 0, comm);
    double all = 0, hidden = 0;
    for (int64_t i = 0, j = 0; i < mm; i++) {
        all += (double)(comm[i].end - comm[i].start);
        while (j < mc && compute[j].end <= comm[i].start) j++;
        for (int64_t k = j; k < mc && compute[k].start < comm[i].end; k++) {
            const uint64_t a = compute[k].start > comm[i].start ? compute[k].start : comm[i].start;
            const uint64_t b = compute[k].end < comm[i].end ? compute[k].end : comm[i].end;
            if (b > a) hidden += (double)(b - a);
        }
    }
    out->comm_hidden_ms = hidden * per;
    out->comm_exposed_ms = (all - hidden) * per;
    free(compute), free(comm);
    return 0;
}
