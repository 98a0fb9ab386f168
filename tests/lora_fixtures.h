/* What the LoRA tests share: a trainer on a plan with fixed text inputs, and a tensor read
 * back as floats. */
#ifndef TUNEGRAPH_TESTS_LORA_FIXTURES_H
#define TUNEGRAPH_TESTS_LORA_FIXTURES_H

#include "base/error.h"
#include "plan/plan.h"
#include "runtime/trainer.h"

/* Opens a trainer on p (the suite's device) with its inputs fixed: ids from a small
 * generator over full rows, token types 0, labels by task (the next token; a class). 0, or
 * -1 with err. */
int tg_test_lora_open_fixed(tg_trainer *tr, const tg_plan *p, tg_err *err);
/* Tensor t's values as floats (malloc'd), or NULL with err. */
float *tg_test_lora_read(tg_trainer *tr, const tg_plan *p, int t, tg_err *err);

#endif
