#include "base/alloc.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per thread, so that a test's failures reach only its own calls (a loader or thread pool
 * thread counts and fails nothing unless it arms its own). */
static _Thread_local long fail_after = -1, made = 0, failed = 0;
static _Thread_local int fail_once; /* only allocation number fail_after fails */

/* Whether the next allocation is to fail; counts it either way. */
static int refuse(void) {
    long n = made++;
    return fail_after >= 0 && (fail_once ? n == fail_after : n >= fail_after);
}

/* Counts a failed allocation (refused or not) for tg_alloc_failures. */
static void *counted(void *p) {
    failed += !p;
    return p;
}

void *tg_malloc(size_t bytes) { return counted(refuse() ? NULL : malloc(bytes ? bytes : 1)); }
void *tg_calloc(size_t count, size_t size) { return counted(refuse() ? NULL : calloc(count ? count : 1, size ? size : 1)); }
void *tg_realloc(void *p, size_t bytes) { return counted(refuse() ? NULL : realloc(p, bytes ? bytes : 1)); }

char *tg_strdup(const char *s) { return counted(refuse() ? NULL : strdup(s)); }
char *tg_strndup(const char *s, size_t n) { return counted(refuse() ? NULL : strndup(s, n)); }

void *tg_aligned_alloc(size_t alignment, size_t bytes) {
    return counted(refuse() ? NULL : aligned_alloc(alignment, bytes ? bytes : alignment));
}

long tg_alloc_failures(void) { return failed; }

long tg_alloc_made(void) { return made; }

int tg_asprintf(char **out, const char *fmt, ...) {
    if (refuse()) return failed++, *out = NULL, -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(out, fmt, ap);
    va_end(ap);
    if (n < 0) failed++, *out = NULL; /* GCOVR_EXCL_BR_LINE: vasprintf fails only when the C library's malloc does (refuse() above is the hook's failure) or past INT_MAX bytes of output, which would need 2 GiB of memory */
    return n;
}

long tg_alloc_fail_after(long succeed) {
    /* jansson's own malloc and ours are the same heap, so memory allocated before the switch
     * is freed correctly after it; the switch is made once, before any failure is armed. */
    static atomic_int json_hooked;
    if (!atomic_exchange(&json_hooked, 1)) json_set_alloc_funcs(tg_malloc, free);
    long n = made;
    made = 0;
    fail_after = succeed;
    fail_once = 0;
    return n;
}

long tg_alloc_fail_only(long index) {
    const long n = tg_alloc_fail_after(index);
    fail_once = 1;
    return n;
}
