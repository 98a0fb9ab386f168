/* What the LoRA tests share (tests/lora_fixtures.h). */
#include "tests/lora_fixtures.h"

#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"

int tg_test_lora_open_fixed(tg_trainer *tr, const tg_plan *p, tg_err *err) {
    tg_trainer_options o = {.device = tg_test_device(), .threads = 0, .load_data = 0};
    if (tg_trainer_open(tr, p, &o, err)) return -1;
    const tg_plan_io *io = &p->io;
    const int64_t B = p->train.batch, T = p->train.seq;
    int32_t *ids = tg_trainer_input(tr, io->input_ids), *pos = tg_trainer_input(tr, io->position_ids);
    int32_t *labels = tg_trainer_input(tr, io->labels);
    float *mask = tg_trainer_input(tr, io->attention_mask);
    uint32_t s = 12345;
    for (int64_t i = 0; i < B * T; i++) {
        s = s * 1664525u + 1013904223u;
        ids[i] = (int32_t)(3 + (s >> 8) % (uint32_t)(p->model.vocab_size - 3));
        pos[i] = (int32_t)(i % T), mask[i] = 1.0f;
    }
    if (io->token_type_ids >= 0) memset(tg_trainer_input(tr, io->token_type_ids), 0, sizeof(int32_t) * (size_t)(B * T));
    if (p->train.task == TG_TASK_LM)
        for (int64_t i = 0; i < B * T; i++) labels[i] = i % T == T - 1 ? -100 : ids[i + 1];
    else
        for (int64_t i = 0; i < B; i++) labels[i] = (int32_t)((i + 1) % p->train.num_labels);
    return 0;
}

float *tg_test_lora_read(tg_trainer *tr, const tg_plan *p, int t, tg_err *err) {
    float *v = malloc(sizeof(float) * (size_t)tg_tensor_numel(&p->tensors[t]));
    if (v && tg_trainer_read_f32(tr, t, v, err)) {
        free(v);
        return NULL;
    }
    return v;
}
