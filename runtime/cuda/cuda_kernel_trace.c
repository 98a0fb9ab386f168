/* CUPTI's kernel, copy and fill records while steps run (runtime/kernel_trace.h). */
#include <cuda_runtime_api.h>
#include <cupti_activity.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/kernel_trace.h"

#define TRACE_BUFFER_BYTES ((size_t)8 << 20)

/* The library's functions this file calls (CUPTI's C API, opened with dlopen). */
typedef struct cupti_api {
    void *lib;
    CUptiResult (*enable)(CUpti_ActivityKind kind);
    CUptiResult (*disable)(CUpti_ActivityKind kind);
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc requested,
                                      CUpti_BuffersCallbackCompleteFunc completed);
    CUptiResult (*flush_all)(uint32_t flag);
    CUptiResult (*next_record)(uint8_t *buffer, size_t valid, CUpti_Activity **record);
    CUptiResult (*result_string)(CUptiResult result, const char **text);
} cupti_api;

/* The trace: CUPTI calls the buffer callbacks from its own thread. */
static struct {
    cupti_api api;
    int opened, running;
    pthread_mutex_t lock;
    tg_kernel_span *spans;
    int64_t n, cap;
    int lost; /* spans dropped: out of memory, or records CUPTI could not keep */
    /* The names of kernels no rule gave a group, the first TG_KERNEL_TRACE_UNNAMED distinct
     * ones (CUPTI keeps the strings), and how many distinct there were. */
    const char *unknown[TG_KERNEL_TRACE_UNNAMED];
    int n_unknown;
    /* Each kernel name's total time and launches (the first TG_KERNEL_TRACE_NAMES names). */
    const char *names[TG_KERNEL_TRACE_NAMES];
    uint64_t name_ns[TG_KERNEL_TRACE_NAMES];
    int64_t name_count[TG_KERNEL_TRACE_NAMES];
    int n_names;
} g_trace = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void note_kernel(const char *name, uint64_t ns) {
    if (!name) return;
    int i = 0;
    while (i < g_trace.n_names && g_trace.names[i] != name && strcmp(g_trace.names[i], name) != 0) i++;
    if (i == g_trace.n_names) {
        if (i == TG_KERNEL_TRACE_NAMES) return;
        g_trace.names[i] = name, g_trace.name_ns[i] = 0, g_trace.name_count[i] = 0, g_trace.n_names++;
    }
    g_trace.name_ns[i] += ns, g_trace.name_count[i]++;
}

static void note_unknown(const char *name) {
    if (!name) return;
    for (int i = 0; i < g_trace.n_unknown && i < TG_KERNEL_TRACE_UNNAMED; i++)
        if (g_trace.unknown[i] == name || strcmp(g_trace.unknown[i], name) == 0) return;
    if (g_trace.n_unknown < TG_KERNEL_TRACE_UNNAMED) g_trace.unknown[g_trace.n_unknown] = name;
    g_trace.n_unknown++;
}

static const CUpti_ActivityKind KINDS[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                           CUPTI_ACTIVITY_KIND_MEMSET};
#define N_KINDS (int)(sizeof KINDS / sizeof KINDS[0])

static int cupti_fail(tg_err *err, const char *what, CUptiResult r) {
    const char *text = NULL;
    if (g_trace.api.result_string) g_trace.api.result_string(r, &text);
    return tg_fail(err, "CUPTI %s failed: %s (%d)", what, text ? text : "unknown error", (int)r);
}

static int open_cupti(tg_err *err) {
    if (g_trace.opened) return 0;
    const char *env = getenv("TUNEGRAPH_CUPTI");
    const char *tried[3] = {env && *env ? env : "libcupti.so.13", env && *env ? NULL : "libcupti.so", NULL};
    void *lib = NULL;
    for (int i = 0; tried[i] && !lib; i++) lib = dlopen(tried[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return tg_fail(err, "CUPTI cannot be opened (%s; TUNEGRAPH_CUPTI names the library)",
                       env && *env ? env : "libcupti.so.13, libcupti.so");
    cupti_api *a = &g_trace.api;
    /* dlsym gives a void *; POSIX guarantees it converts to the function's pointer. */
    a->enable = (CUptiResult(*)(CUpti_ActivityKind))dlsym(lib, "cuptiActivityEnable");
    a->disable = (CUptiResult(*)(CUpti_ActivityKind))dlsym(lib, "cuptiActivityDisable");
    a->register_callbacks = (CUptiResult(*)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc))dlsym(
        lib, "cuptiActivityRegisterCallbacks");
    a->flush_all = (CUptiResult(*)(uint32_t))dlsym(lib, "cuptiActivityFlushAll");
    a->next_record = (CUptiResult(*)(uint8_t *, size_t, CUpti_Activity **))dlsym(lib, "cuptiActivityGetNextRecord");
    a->result_string = (CUptiResult(*)(CUptiResult, const char **))dlsym(lib, "cuptiGetResultString");
    if (!a->enable || !a->disable || !a->register_callbacks || !a->flush_all || !a->next_record) {
        dlclose(lib);
        memset(a, 0, sizeof *a);
        return tg_fail(err, "the CUPTI library opened lacks the activity API");
    }
    a->lib = lib;
    g_trace.opened = 1;
    return 0;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0; /* as many as fit */
}

static void add_span(uint64_t start, uint64_t end, int group) {
    if (g_trace.n == g_trace.cap) {
        const int64_t cap = g_trace.cap ? 2 * g_trace.cap : 4096;
        tg_kernel_span *s = realloc(g_trace.spans, (size_t)cap * sizeof *s);
        if (!s) {
            g_trace.lost++;
            return;
        }
        g_trace.spans = s, g_trace.cap = cap;
    }
    g_trace.spans[g_trace.n++] = (tg_kernel_span){.start = start, .end = end, .group = group};
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&g_trace.lock);
    while (buffer && g_trace.api.next_record(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
            const int group = tg_kernel_group_of(k->name);
            if (group < 0) note_unknown(k->name);
            note_kernel(k->name, k->end > k->start ? k->end - k->start : 0);
            add_span(k->start, k->end, group);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
            add_span(m->start, m->end, TG_GROUP_MEMORY);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)r;
            add_span(m->start, m->end, TG_GROUP_MEMORY);
        }
    }
    pthread_mutex_unlock(&g_trace.lock);
    free(buffer);
}

int tg_kernel_trace_start(tg_err *err) {
    if (open_cupti(err)) return -1;
    if (g_trace.running) return tg_fail(err, "a kernel trace is already running in this process");
    pthread_mutex_lock(&g_trace.lock);
    free(g_trace.spans);
    g_trace.spans = NULL, g_trace.n = g_trace.cap = 0, g_trace.lost = 0, g_trace.n_unknown = 0, g_trace.n_names = 0;
    pthread_mutex_unlock(&g_trace.lock);
    CUptiResult r = g_trace.api.register_callbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) return cupti_fail(err, "cuptiActivityRegisterCallbacks", r);
    for (int k = 0; k < N_KINDS; k++)
        if ((r = g_trace.api.enable(KINDS[k])) != CUPTI_SUCCESS) {
            for (int j = 0; j < k; j++) g_trace.api.disable(KINDS[j]);
            return cupti_fail(err, "cuptiActivityEnable", r);
        }
    g_trace.running = 1;
    return 0;
}

int tg_kernel_trace_unnamed(const char **names, int cap) {
    pthread_mutex_lock(&g_trace.lock);
    for (int i = 0; i < cap && i < g_trace.n_unknown && i < TG_KERNEL_TRACE_UNNAMED; i++) names[i] = g_trace.unknown[i];
    const int n = g_trace.n_unknown;
    pthread_mutex_unlock(&g_trace.lock);
    return n;
}

int tg_kernel_trace_by_name(const char **names, uint64_t *ns, int64_t *count, int cap) {
    pthread_mutex_lock(&g_trace.lock);
    char taken[TG_KERNEL_TRACE_NAMES] = {0};
    int n = 0;
    for (; n < cap && n < g_trace.n_names; n++) {
        int best = -1;
        for (int i = 0; i < g_trace.n_names; i++)
            if (!taken[i] && (best < 0 || g_trace.name_ns[i] > g_trace.name_ns[best])) best = i;
        taken[best] = 1;
        names[n] = g_trace.names[best], ns[n] = g_trace.name_ns[best], count[n] = g_trace.name_count[best];
    }
    pthread_mutex_unlock(&g_trace.lock);
    return n;
}

int tg_kernel_trace_stop(tg_kernel_span **spans, int64_t *n, tg_err *err) {
    *spans = NULL, *n = 0;
    if (!g_trace.running) return tg_fail(err, "no kernel trace is running");
    g_trace.running = 0;
    cudaError_t e = cudaDeviceSynchronize();
    CUptiResult r = g_trace.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (int k = 0; k < N_KINDS; k++) g_trace.api.disable(KINDS[k]);
    pthread_mutex_lock(&g_trace.lock);
    tg_kernel_span *s = g_trace.spans;
    const int64_t count = g_trace.n;
    const int lost = g_trace.lost;
    g_trace.spans = NULL, g_trace.n = g_trace.cap = 0;
    pthread_mutex_unlock(&g_trace.lock);
    int rc = 0;
    if (e != cudaSuccess) rc = tg_fail(err, "the traced steps failed: %s", cudaGetErrorString(e));
    else if (r != CUPTI_SUCCESS) rc = cupti_fail(err, "cuptiActivityFlushAll", r);
    else if (lost) rc = tg_fail(err, "out of memory for the kernel trace (%d spans lost)", lost);
    else if (!count) rc = tg_fail(err, "CUPTI recorded no kernels");
    if (rc) {
        free(s);
        return -1;
    }
    *spans = s, *n = count;
    return 0;
}
