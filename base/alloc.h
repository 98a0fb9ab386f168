/* The heap allocations of the compiler, the plan loader, the CPU executor and trainer, and
 * the parsers, with a test hook that makes them fail: a test fails each allocation in turn
 * and checks that the caller stops with an error naming what it was allocating (never a
 * crash, a leak or success with garbage). Memory from these is released with free(). A
 * request for 0 bytes (or 0 elements) gets a valid block of one, so NULL always means out
 * of memory. */
#ifndef TUNEGRAPH_BASE_ALLOC_H
#define TUNEGRAPH_BASE_ALLOC_H

#include <stddef.h>

void *tg_malloc(size_t bytes);
void *tg_calloc(size_t count, size_t size);
void *tg_realloc(void *p, size_t bytes);
char *tg_strdup(const char *s);
char *tg_strndup(const char *s, size_t n);
void *tg_aligned_alloc(size_t alignment, size_t bytes);
/* asprintf(3) through the hook: returns -1 (and *out NULL) when the allocation fails. */
int tg_asprintf(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* How many allocations through these have failed on this thread (refused by the test hook
 * or not): a caller whose library reports a failed allocation as something else (jansson
 * reports it as a syntax error) compares the count before and after. */
long tg_alloc_failures(void);

/* How many allocations were made on this thread since the last tg_alloc_fail_after. */
long tg_alloc_made(void);

/* Test hook, per thread: after this call the first `succeed` allocations succeed and every
 * later one fails; succeed < 0 lets all succeed (the default). Returns how many allocations
 * were made on this thread since the previous call. The first call also routes jansson's
 * allocations (json_set_alloc_funcs) through tg_malloc, so that JSON parsing fails too;
 * with no failure armed that changes nothing. */
long tg_alloc_fail_after(long succeed);

/* Test hook, per thread: like tg_alloc_fail_after, but only allocation number `index`
 * (from 0, counted from this call) fails and the later ones succeed again: a passing
 * shortage, for code that must stop at the first failure rather than go on. */
long tg_alloc_fail_only(long index);

#endif
