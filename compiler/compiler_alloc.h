/* The compiler's heap allocations, with a test hook that makes them fail: every allocation
 * in compiler/ goes through these, so that a test can fail each one in turn and check that
 * the compile stops with an error (never a crash, a leak or an index of -1). */
#ifndef TUNEGRAPH_COMPILER_ALLOC_H
#define TUNEGRAPH_COMPILER_ALLOC_H

#include <stddef.h>

void *tg_compiler_malloc(size_t bytes);
void *tg_compiler_calloc(size_t count, size_t size);
void *tg_compiler_realloc(void *p, size_t bytes);

/* Test hook, per thread: after this call the first `succeed` allocations succeed and every
 * later one fails; succeed < 0 lets all succeed (the default). Returns how many allocations
 * were made on this thread since the previous call. */
long tg_compiler_alloc_fail_after(long succeed);

#endif
