/* Compiling a data-parallel job (gradient buckets and their sums, compiler/grad_buckets.c;
 * ZeRO-1 slices and gathers) with each allocation failing in turn: every failure ends the
 * compile with a message naming what ran out, never another refusal after it or a crash,
 * and nothing stays allocated (the sanitizer build's leak check). */
#include <string.h>

#include "base/alloc.h"
#include "compiler/compile.h"
#include "compiler/job.h"
#include "tests/compile_faults.h"
#include "tests/harness.h"

TG_TEST(test_compile_data_parallel_each_allocation_fails) {
    tg_test_compile_each_allocation_fails("2 replicas", "model = tiny-bert\nbatch = 4\nseq = 16\nsteps = 2\ndata_parallel = 2\n"
                                       "train_data = train.jsonl\n");
    tg_test_compile_each_allocation_fails("2 replicas, ZeRO-1", "model = tiny-gpt2\ntask = lm\nbatch = 2\nseq = 16\nsteps = 2\n"
                                               "data_parallel = 2\nzero_stage = 1\ntrain_data = train.jsonl\n");
}
