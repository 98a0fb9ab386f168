/* The compiler's heap allocations: the general hook of base/alloc.h under the compiler's
 * names, so that a test can fail each one in turn and check that the compile stops with an
 * error (never a crash, a leak or an index of -1). */
#ifndef TUNEGRAPH_COMPILER_ALLOC_H
#define TUNEGRAPH_COMPILER_ALLOC_H

#include "base/alloc.h"

#define tg_compiler_malloc tg_malloc
#define tg_compiler_calloc tg_calloc
#define tg_compiler_realloc tg_realloc
/* Test hook, per thread (base/alloc.h: tg_alloc_fail_after). */
#define tg_compiler_alloc_fail_after tg_alloc_fail_after

#endif
