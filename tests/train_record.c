/* tests/train_record.h */
#include "tests/train_record.h"

#include <stdlib.h>
#include <string.h>

#include "plan/plan_file.h"
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

void check_file_round_trip(const tg_plan *p, const char *what) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    tg_err err;
    tg_plan back;
    if (!CHECK(tg_plan_encode(p, &bytes, &len, &err) == 0, "%s: %s", what, err.msg)) return;
    if (CHECK(tg_plan_decode(bytes, len, what, &back, &err) == 0, "%s: %s", what, err.msg)) {
        CHECK(back.n_ops == p->n_ops && back.n_tensors == p->n_tensors && back.peak_bytes == p->peak_bytes &&
                  back.peak_bytes_without_recompute == p->peak_bytes_without_recompute,
              "%s: the decoded plan differs", what);
        tg_plan_free(&back);
    }
    free(bytes);
}

float *forward_logits(tg_trainer *tr, const tg_plan *p, float *loss, tg_err *err) {
    if (tg_trainer_run(tr, TG_PHASE_FORWARD, TG_PHASE_FORWARD, 0, err)) return NULL;
    float *l = malloc(sizeof(float) * (size_t)tg_tensor_numel(&p->tensors[p->io.logits]));
    if (l && (tg_trainer_read_f32(tr, p->io.logits, l, err) || tg_trainer_read_f32(tr, p->io.loss, loss, err))) {
        free(l);
        return NULL;
    }
    return l;
}

void random_fill(float *v, int64_t n, float scale, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = scale * ((float)(seed >> 8) / 16777216.0f - 0.5f);
    }
}
