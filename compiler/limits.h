/* What one compile may build. Every size the compiler derives from the job and the model
 * config (element and byte counts, pool offsets, table entries) is computed with overflow
 * checks and refused beyond these, so that each fits the integer types of the plan and the
 * executors with room to spare. */
#ifndef TUNEGRAPH_COMPILER_LIMITS_H
#define TUNEGRAPH_COMPILER_LIMITS_H

#include <stdint.h>

/* Transformer layers of one model: the deepest models trained today have about a hundred;
 * the graph grows by some 60 tensors and 20 ops per layer. */
#define TG_MAX_LAYERS 10000
/* Bytes of one memory pool, and so of any tensor or offset in it: 16 TiB, beyond the memory
 * of any one device or host that runs a plan. Under it, element counts stay below 2^42 and
 * sums of sizes and offsets cannot overflow 64 bits. */
#define TG_MAX_POOL_BYTES ((uint64_t)1 << 44)
/* Entries of the graph's tensor table and op list (int indices), far above what
 * TG_MAX_LAYERS layers need. */
#define TG_MAX_GRAPH_TENSORS (1 << 24)
#define TG_MAX_GRAPH_OPS (1 << 24)

#endif
