/* job -> plan. */
#ifndef TUNEGRAPH_COMPILE_H
#define TUNEGRAPH_COMPILE_H

#include "base/error.h"
#include "compiler/job.h"
#include "plan/plan.h"

/* Loads the job's model config, checks the job against it, builds the forward graph,
 * differentiates it, appends the optimizer and plans memory. Same job -> byte-identical
 * plan. Errors about the job name its file, line and key. */
int tg_compile(const tg_job *job, tg_plan *plan, tg_err *err);

/* Same, from a model config already loaded (tests build configs in memory). */
int tg_compile_with_config(const tg_job *job, const tg_model_config *cfg, tg_plan *plan, tg_err *err);

/* The padding id batches use: the job's pad_token_id, else the config's, else 0. */
int tg_job_pad_id(const tg_job *job, const tg_model_config *cfg);

#endif
