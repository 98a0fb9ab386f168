/* runtime/nvtx.h. Compiled twice: plain (no-op ranges, counted) in every build's library,
 * and with TG_NVTX=1 and the CUDA toolkit's include path in a GPU build's, which links that
 * object in place of the plain one (Makefile: GPU_LIB_OBJ). */
#include "runtime/nvtx.h"

#include <stdarg.h>
#include <stdio.h>

#ifndef TG_NVTX
#define TG_NVTX 0
#endif

#if TG_NVTX
#include <pthread.h>

#include <nvtx3/nvToolsExt.h>
#endif

static long g_pushed, g_popped;

int tg_nvtx_built(void) { return TG_NVTX; }

#if TG_NVTX
static nvtxDomainHandle_t g_domain;
static pthread_once_t g_domain_once = PTHREAD_ONCE_INIT;
static void domain_create(void) { g_domain = nvtxDomainCreateA("tunegraph"); }
#endif

void tg_nvtx_push(const char *name) {
    __atomic_add_fetch(&g_pushed, 1, __ATOMIC_RELAXED);
#if TG_NVTX
    pthread_once(&g_domain_once, domain_create);
    nvtxEventAttributes_t at = {0};
    at.version = NVTX_VERSION;
    at.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    at.messageType = NVTX_MESSAGE_TYPE_ASCII;
    at.message.ascii = name;
    nvtxDomainRangePushEx(g_domain, &at);
#else
    (void)name;
#endif
}

void tg_nvtx_pushf(const char *fmt, ...) {
    if (!TG_NVTX) { /* nothing to name */
        tg_nvtx_push(fmt);
        return;
    }
    char name[TG_NVTX_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    tg_nvtx_push(name);
}

void tg_nvtx_pop(void) {
    __atomic_add_fetch(&g_popped, 1, __ATOMIC_RELAXED);
#if TG_NVTX
    pthread_once(&g_domain_once, domain_create);
    nvtxDomainRangePop(g_domain);
#endif
}

void tg_nvtx_counts(long *pushed, long *popped) {
    *pushed = __atomic_load_n(&g_pushed, __ATOMIC_RELAXED);
    *popped = __atomic_load_n(&g_popped, __ATOMIC_RELAXED);
}
