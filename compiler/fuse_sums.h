/* Sums folded into matrix products: an ADD one of whose addends is a MATMUL's product
 * becomes that MATMUL accumulating into the other addend (MATMUL accumulate = 1, out0 +=
 * alpha A B), so the sum costs no op of its own and no pass over memory. */
#ifndef TUNEGRAPH_FUSE_SUMS_H
#define TUNEGRAPH_FUSE_SUMS_H

#include "compiler/graph.h"

/* Rewrites every ADD(a, m) -> z of the schedule where:
 *   - m is written by one op alone, a MATMUL that overwrites it (accumulate = 0) with no
 *     epilogue (no bias in2, no bias gradient out1, no activation), in the ADD's phase;
 *     nothing but the ADD reads m;
 *   - no op after the ADD reads or writes a (so a may take the sum in place), and z is
 *     written by the ADD alone;
 *   - a, m and z are plain activations (activation pool, no view, no parameter or gradient
 *     flag, no io role) of one dtype and one shape, and the MATMUL reads none of them;
 *   - no op between the MATMUL and the ADD writes what the MATMUL reads (moved to the ADD's
 *     place it reads the same values).
 * The MATMUL moves to the ADD's place in the schedule with out0 = z and accumulate = 1; the
 * ops before it that wrote or read a write or read z instead (z keeps the sum's name); the
 * ADD, a and m leave the plan (the tensor and op tables close up). Where both addends are
 * such products, the one of more FLOPs is folded (the second, in1, where they tie): an
 * accumulating product reads the sum in its epilogue, which a large product's arithmetic
 * hides, where a small one (LoRA's B product, K = r) is bound by memory and would read and
 * write the whole sum once more; the small one writes the sum first instead. On the CPU reference in fp32 the result is
 * bit for bit the ADD's (a + (alpha AB) either way); in bf16 and fp16 the product is
 * rounded once, with the sum, instead of before it.
 *
 * LoRA's sums (the base projection plus the scaled B product) are the ones the models
 * build; the backward's input-gradient sums already accumulate as autodiff emits them
 * (compiler/grad_state.h tg_ad_grad_accumulable), and the residual-stream sums have no
 * product as an addend. Runs last before memory planning, after every pass that places
 * or renames ops. Returns 0 or -1 (g->err). */
int tg_fuse_matmul_sums(tg_graph *g);

/* Nonzero: tg_fuse_matmul_sums leaves the graph as it is, in the calling thread (the
 * unfused schedule, which the tests compare with). */
extern _Thread_local int tg_fuse_sums_off;

#endif
