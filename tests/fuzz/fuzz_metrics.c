/* libFuzzer target: the metrics file reader of `tunegraph plot` (cli/metrics_read.c). What
 * it accepts has at least one step, the steps strictly increasing, every series as long as
 * the steps, and at most METRICS_GROUPS_MAX named groups of non-negative time; what it
 * refuses comes with a message and leaves nothing allocated. */
#include <string.h>

#include "cli/metrics_read.h"
#include "tests/fuzz/fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    metrics_series s;
    tg_err err = {{0}};
    if (metrics_read("fuzz.jsonl", (const char *)data, size, &s, &err)) {
        FUZZ_ASSERT(err.msg[0] && s.n == 0 && !s.step && !s.loss, "refused without a message, or with series left");
        return 0;
    }
    FUZZ_ASSERT(s.n >= 1 && s.step && s.loss && s.lr && s.phase_ms[3] && s.exposed_comm_ms, "accepted without steps");
    for (int64_t i = 1; i < s.n; i++) FUZZ_ASSERT(s.step[i] > s.step[i - 1], "step %lld not increasing", (long long)i);
    FUZZ_ASSERT(s.n_groups >= 0 && s.n_groups <= METRICS_GROUPS_MAX, "%d groups", s.n_groups);
    for (int g = 0; g < s.n_groups; g++)
        FUZZ_ASSERT(s.group[g][0] && memchr(s.group[g], 0, sizeof s.group[g]) && s.group_ms[g] >= 0, "group %d", g);
    metrics_series_free(&s);
    return 0;
}
