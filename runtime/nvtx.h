/* NVTX ranges (NVIDIA Tools Extension v3) in the domain "tunegraph", so that a profiler's
 * timeline (Nsight Systems: `nsys profile tunegraph run ...`) shows the run's structure on
 * the host: compile, plan and weights loading, the GEMM tuning pass, graph capture, each
 * step's launch and wait, eval, checkpoints, export and data loading.
 *
 * A GPU build emits them (runtime/nvtx.c compiled with TG_NVTX, the header-only NVTX3 of
 * the CUDA toolkit: no library to link); in a build without CUDA every call does nothing.
 * With no tool attached the NVTX calls return at once (the first finds no tool and makes
 * the rest no-ops). Ranges nest per thread: each push is popped on the thread that pushed. */
#ifndef TUNEGRAPH_RUNTIME_NVTX_H
#define TUNEGRAPH_RUNTIME_NVTX_H

/* The longest range name kept (tg_nvtx_pushf cuts a longer one). */
#define TG_NVTX_NAME_MAX 128

/* 1 when this build emits ranges, 0 when its calls do nothing. */
int tg_nvtx_built(void);

/* Opens a range named `name` on this thread, inside any range open on it. */
void tg_nvtx_push(const char *name);
/* The same with a printf name ("step 12"), cut to TG_NVTX_NAME_MAX - 1 bytes. */
void tg_nvtx_pushf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Closes this thread's innermost open range. */
void tg_nvtx_pop(void);

/* How many ranges this process has pushed and popped through this module (every thread;
 * counted in a build without CUDA too), for tests to check that every push is popped. */
void tg_nvtx_counts(long *pushed, long *popped);

#endif
