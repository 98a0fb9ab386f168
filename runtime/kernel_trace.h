/* Tracing the GPU's kernels while steps run (CUPTI's activity records), for the profile's
 * kernel groups of the captured graph as it really runs (runtime/kernel_groups.h).
 *
 * CUPTI is opened at run time, never linked: TUNEGRAPH_CUPTI=PATH names the library, else
 * libcupti.so.13 and then libcupti.so are tried (CUDA's toolkit and PyTorch's wheels ship
 * it). A CPU build, or a machine without it, gets an error saying so and the profile goes
 * on without the trace. One trace at a time in a process; kernels of every GPU the process
 * drives are recorded, so it is meant for a process running one replica. */
#ifndef TUNEGRAPH_RUNTIME_KERNEL_TRACE_H
#define TUNEGRAPH_RUNTIME_KERNEL_TRACE_H

#include <stdint.h>

#include "base/error.h"
#include "runtime/kernel_groups.h"

/* Starts recording kernels, copies and fills. 0, or -1 with err saying why (no CUPTI, a
 * trace already running, CUPTI's own error). */
int tg_kernel_trace_start(tg_err *err);
/* Waits for the device's work, stops recording and hands the spans over (*spans, which the
 * caller frees; *n of them), each with its group (tg_kernel_group_of; copies and fills:
 * memory). 0, or -1 with err set (the spans then freed). */
int tg_kernel_trace_stop(tg_kernel_span **spans, int64_t *n, tg_err *err);

#define TG_KERNEL_TRACE_UNNAMED 8
/* The last trace's kernels that no rule gave a group (runtime/kernel_groups.c): up to cap
 * (at most TG_KERNEL_TRACE_UNNAMED) of their names into names, as the trace recorded them;
 * returns how many distinct ones there were (0 with no trace). */
int tg_kernel_trace_unnamed(const char **names, int cap);

/* The last trace's kernels by name (as CUPTI records them, C++ names mangled), the `cap`
 * largest total times first: names[k], their total ns[k] and launches count[k] over the
 * whole trace. Returns how many were written. The first TG_KERNEL_TRACE_NAMES distinct
 * names are counted; kernels past them are left out of this list (not of the spans). */
#define TG_KERNEL_TRACE_NAMES 256
int tg_kernel_trace_by_name(const char **names, uint64_t *ns, int64_t *count, int cap);

#endif
