/* What the CPU op tests share: a three-thread pool (rows and columns split unevenly) and
 * float buffers that abort on allocation failure (the tests' own memory, not the code's). */
#ifndef TUNEGRAPH_TESTS_OP_FIXTURES_H
#define TUNEGRAPH_TESTS_OP_FIXTURES_H

#include <stdint.h>

#include "runtime/cpu/threadpool.h"

tg_threadpool *pool3(void);
float *falloc(int64_t n);
/* n uniforms in [lo, hi) from seed (tg_test_fill_uniform). */
float *frand(int64_t n, uint64_t seed, float lo, float hi);
float *fconst(int64_t n, float v);

#endif
