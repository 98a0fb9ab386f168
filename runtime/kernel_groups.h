/* The kernel groups of a GPU trace: which group (plan/ops.h's TG_GROUP_*) a kernel's name
 * belongs to, and what a traced stretch of kernels adds up to per group, busy, and the
 * communication the other kernels hid.
 *
 * A profile's groups from op-by-op launches (cli/profile.c) say what each op costs alone;
 * a trace of the captured steps as they really run (runtime/cuda/cuda_kernel_trace.c,
 * CUPTI's kernel records) says what the GPU did, kernels overlapping where streams run
 * side by side (the gradient sums beside the backward, the deferred update beside the
 * forward). Records carry kernel names, not ops, so the group comes from the name: this
 * project's kernels by their names' prefixes (the .cu files of kernels/; tests/test_kernel_groups.c
 * checks that every __global__ function there has one), the libraries' by what their
 * names hold (cuBLASLt's products, cuDNN's attention, NCCL). This file has no device code. */
#ifndef TUNEGRAPH_RUNTIME_KERNEL_GROUPS_H
#define TUNEGRAPH_RUNTIME_KERNEL_GROUPS_H

#include <stdint.h>

#include "base/error.h"
#include "plan/ops.h"

/* The group of a kernel named `name` (as a trace records it: C++ kernels mangled, as
 * _Z13fa_fwd_kernelILi64E..., others plain), or -1 when no rule knows it. */
int tg_kernel_group_of(const char *name);

/* One traced kernel (or copy or fill): device clock ns, and its group (-1: other). */
typedef struct tg_kernel_span {
    uint64_t start, end;
    int group;
} tg_kernel_span;

/* What a traced stretch of `steps` steps adds up to, in ms a step. */
typedef struct tg_kernel_trace_summary {
    int steps;
    int64_t kernels;                  /* spans traced */
    double group_ms[TG_GROUP_COUNT];  /* each group's kernel time (overlaps counted in each) */
    double other_ms;                  /* spans of no group */
    double busy_ms;                   /* the union of every span: the GPU doing anything */
    double comm_hidden_ms;            /* communication time beside other kernels */
    double comm_exposed_ms;           /* communication time with nothing else running */
} tg_kernel_trace_summary;

/* Sums `n` spans over `steps` steps into *out. Sorts spans in place (by start). 0, or -1
 * with err set when out of memory. */
int tg_kernel_trace_summarize(tg_kernel_span *spans, int64_t n, int steps, tg_kernel_trace_summary *out,
                              tg_err *err);

#endif
