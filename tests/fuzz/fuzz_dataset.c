/* libFuzzer target: JSONL datasets (tg_dataset_load), read once under classify rules
 * and once under lm rules, both wide enough for the demo data (vocab 128, 2 labels). An lm
 * line's "labels" give its prompt: each lm example's batch row then has -100 on the
 * prompt's targets and the next ids after it. */
#include "datasets/dataset.h"
#include "plan/ops.h"
#include "tests/fuzz/fuzz_input.h"

static void load(const char *path, const tg_data_rules *rules) {
    tg_dataset ds;
    tg_err err;
    if (tg_dataset_load(path, rules, &ds, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return;
    }
    /* Every example as the batcher reads it: in range, ids and types alike. */
    FUZZ_ASSERT(ds.n > 0, "%d examples", ds.n);
    int64_t tokens = 0;
    for (int32_t i = 0; i < ds.n; i++) {
        const tg_example *e = &ds.examples[i];
        FUZZ_ASSERT(e->len > 0, "example %d has length %d", i, e->len);
        for (int32_t t = 0; t < e->len; t++) {
            FUZZ_ASSERT(e->input_ids[t] >= 0 && e->input_ids[t] < rules->vocab_size, "example %d id %d", i,
                        e->input_ids[t]);
            if (e->token_type_ids)
                FUZZ_ASSERT(e->token_type_ids[t] >= 0 && e->token_type_ids[t] < rules->type_vocab_size,
                            "example %d type %d", i, e->token_type_ids[t]);
        }
        if (rules->task == TG_TASK_CLASSIFY)
            FUZZ_ASSERT(e->label >= 0 && e->label < rules->num_labels, "example %d label %d", i, e->label);
        FUZZ_ASSERT(e->prompt_len == 0 || (rules->task == TG_TASK_LM && e->prompt_len > 1 && e->prompt_len < e->len),
                    "example %d of %d tokens: prompt %d", i, e->len, e->prompt_len);
        if (rules->task == TG_TASK_LM && e->len <= 64) {
            int32_t ids[64], types[64], pos[64], labels[64];
            float mask[64];
            tg_batch b = {.input_ids = ids, .attention_mask = mask, .token_type_ids = types, .position_ids = pos,
                          .labels = labels};
            const tg_batch_shape shape = {.batch = 1, .seq = 64, .task = TG_TASK_LM, .pad_id = 0};
            tg_batch_fill(&ds, &i, 1, &shape, &b);
            for (int32_t t = 0; t < 64; t++) {
                const int counted = t + 1 < e->len && t + 1 >= (e->prompt_len > 1 ? e->prompt_len : 1);
                FUZZ_ASSERT(labels[t] == (counted ? e->input_ids[t + 1] : TG_IGNORE_INDEX),
                            "example %d position %d: label %d", i, t, labels[t]);
            }
        }
        tokens += e->len;
    }
    FUZZ_ASSERT(tokens == ds.n_tokens, "%lld tokens counted, %lld recorded", (long long)tokens,
                (long long)ds.n_tokens);
    tg_dataset_free(&ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    const tg_data_rules classify = {.task = TG_TASK_CLASSIFY, .num_labels = 2, .vocab_size = 128, .type_vocab_size = 2};
    const tg_data_rules lm = {.task = TG_TASK_LM, .num_labels = 0, .vocab_size = 128, .type_vocab_size = 0};
    load(path, &classify);
    load(path, &lm);
    return 0;
}
