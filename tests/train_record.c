/* tests/train_record.h */
#include "tests/train_record.h"

#include <stdlib.h>
#include <string.h>

#include "runtime/trainer.h"
#include "tests/harness.h"

int train_record(const tg_plan *plan, int steps, uint8_t **out, size_t *n) {
    tg_err err;
    tg_trainer tr;
    *out = NULL, *n = 0;
    tg_trainer_options o = {.device = TG_DEVICE_CPU, .load_data = 1};
    if (!CHECK(tg_trainer_open(&tr, plan, &o, &err) == 0, "%s", err.msg)) return 0;
    const size_t grads = plan->tensors[plan->io.grads_all].bytes, params = plan->tensors[plan->io.params_all].bytes;
    const size_t m = plan->tensors[plan->io.m_all].bytes, v = plan->tensors[plan->io.v_all].bytes;
    const size_t cap = (size_t)steps * (8 + grads) + params + m + v;
    uint8_t *buf = malloc(cap);
    int ok = CHECK(buf != NULL, "out of memory");
    size_t at = 0;
    for (int s = 0; ok && s < steps; s++) {
        tg_step_stats st;
        ok = CHECK(tg_trainer_step(&tr, &st, &err) == 0, "step %d: %s", s + 1, err.msg) &&
             CHECK(tg_trainer_read(&tr, plan->io.grads_all, buf + at + 8, &err) == 0, "%s", err.msg);
        if (!ok) break;
        memcpy(buf + at, &st.loss, 4), memcpy(buf + at + 4, &st.grad_norm, 4);
        at += 8 + grads;
    }
    ok = ok && CHECK(tg_trainer_read(&tr, plan->io.params_all, buf + at, &err) == 0, "%s", err.msg) &&
         CHECK(tg_trainer_read(&tr, plan->io.m_all, buf + at + params, &err) == 0, "%s", err.msg) &&
         CHECK(tg_trainer_read(&tr, plan->io.v_all, buf + at + params + m, &err) == 0, "%s", err.msg);
    tg_trainer_close(&tr);
    if (!ok) {
        free(buf);
        return 0;
    }
    *out = buf, *n = cap;
    return 1;
}
