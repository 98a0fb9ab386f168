/* Length-bucket plans for the executor tests, assembled from plans the compiler builds one
 * length at a time (the same job compiled at each seq), checking plan.h's rules for a
 * bucket plan as it goes; and what the tests feed an executor: initial values, step
 * counters, and batch images of the inputs pool laid out for one bucket. */
#ifndef TUNEGRAPH_TEST_BUCKET_PLAN_H
#define TUNEGRAPH_TEST_BUCKET_PLAN_H

#include <stdint.h>

#include "runtime/executor.h"
#include "plan/plan.h"

/* A tiny job (batch 2 x seq, lr 1e-3, warmup 2, `steps` steps, 3 classes, dropout as the
 * preset has it) for `preset`, compiled from its text. 1 on success, else a failed CHECK. */
int tg_test_compile_job_text(const char *preset, int task, int precision, int seq, int steps, tg_plan *p);

/* The plan with buckets seqs[0] < ... < seqs[n - 1] (n <= TG_MAX_BUCKETS): the job of
 * tg_test_compile_job_text compiled at each length, the last becoming *out and the others
 * its buckets (malloc'd; tg_plan_free frees them), every pool_bytes of each the largest
 * over all. CHECKs that a bucket plan has the same tensors (names, dtypes, pools, flags;
 * outside the activation and input pools the same offsets, shapes and bytes), the same op
 * kinds and phases, io, and the same sizes of the pools other than activations and inputs.
 * 1 on success. */
int tg_test_bucket_plan(const char *preset, int task, int precision, const int *seqs, int n, int steps,
                        tg_plan *out);

/* Uploads initial values (tg_weights_init with `seed`) as the trainer does, with their bf16
 * copies in bf16 plans, and the step counters (step 0 of total_steps). 1 on success. */
int tg_test_upload_values(tg_executor *ex, const tg_plan *p, uint64_t seed, int total_steps);

/* Fills `image` (pool_bytes[TG_POOL_INPUTS] bytes, zeroed first) with the batch of `step`
 * laid out by plan p (one bucket's): rows of lengths from seq down, ids and LM labels drawn
 * from the step alone, so that two plans of one seq get the same batch. Every label is
 * written (none is left for the step to derive). */
void tg_test_fill_batch_image(const tg_plan *p, int step, void *image);

/* Copies every tensor outside the activation and input pools from one executor to
 * another (of plans sharing those tensors, as buckets do). 1 on success. */
int tg_test_copy_state(tg_executor *from, tg_executor *to, const tg_plan *p);

#endif
