#include "base/alloc.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per thread, so that a test's failures reach only its own calls (a loader or thread pool
 * thread counts and fails nothing unless it arms its own). */
static _Thread_local long fail_after = -1, made = 0;

/* Whether the next allocation is to fail; counts it either way. */
static int refuse(void) {
    long n = made++;
    return fail_after >= 0 && n >= fail_after;
}

void *tg_malloc(size_t bytes) { return refuse() ? NULL : malloc(bytes); }
void *tg_calloc(size_t count, size_t size) { return refuse() ? NULL : calloc(count, size); }
void *tg_realloc(void *p, size_t bytes) { return refuse() ? NULL : realloc(p, bytes); }

char *tg_strdup(const char *s) { return refuse() ? NULL : strdup(s); }
char *tg_strndup(const char *s, size_t n) { return refuse() ? NULL : strndup(s, n); }

int tg_asprintf(char **out, const char *fmt, ...) {
    if (refuse()) return *out = NULL, -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(out, fmt, ap);
    va_end(ap);
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
    return n;
}
