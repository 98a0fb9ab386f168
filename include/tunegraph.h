/* tunegraph: compile a fine-tuning job into a static plan, then run it.
 *
 * The library's life cycle, for embedding:
 *   tg_job job;  tg_job_load("job.txt", NULL, 0, &job, &err);      (compiler/job.h)
 *   tg_plan plan; tg_compile(&job, &plan, &err);                      (compiler/compile.h)
 *   tg_plan_write(&plan, "job.tgp", &err);                            (runtime/plan_file.h)
 *   tg_trainer t; tg_trainer_open(&t, &plan, &opts, &err);           (runtime/trainer.h)
 *   while (...) tg_trainer_step(&t, &stats, &err);
 *   tg_trainer_eval(&t, &eval, &err); tg_trainer_close(&t); tg_plan_free(&plan);
 */
#ifndef TUNEGRAPH_H
#define TUNEGRAPH_H

#define TG_VERSION_STRING "tunegraph 0.1.0"

#include "tunegraph/error.h"
#include "tunegraph/ops.h"
#include "tunegraph/plan.h"

#endif
