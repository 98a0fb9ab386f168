#include "compiler/compiler_alloc.h"

#include <stdlib.h>

/* Per thread, so that a test's failures reach only its own compile. */
static _Thread_local long fail_after = -1, made = 0;

/* Whether the next allocation is to fail; counts it either way. */
static int refuse(void) {
    long n = made++;
    return fail_after >= 0 && n >= fail_after;
}

void *tg_compiler_malloc(size_t bytes) { return refuse() ? NULL : malloc(bytes); }
void *tg_compiler_calloc(size_t count, size_t size) { return refuse() ? NULL : calloc(count, size); }
void *tg_compiler_realloc(void *p, size_t bytes) { return refuse() ? NULL : realloc(p, bytes); }

long tg_compiler_alloc_fail_after(long succeed) {
    long n = made;
    made = 0;
    fail_after = succeed;
    return n;
}
