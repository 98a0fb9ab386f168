/* libFuzzer target: `tunegraph sweep --weights throughput=W,...` (cli/sweep_spec.c). What it
 * accepts sets every weight to a finite number from 0 to 1e6, at least one above 0; what it
 * refuses comes with a message naming --weights and leaves the weights as they were. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/sweep_spec.h"
#include "tests/fuzz/fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = malloc(size + 1);
    if (!spec) return 0;
    memcpy(spec, data, size);
    spec[size] = 0;
    sweep_weights w = {{-7, -7, -7, -7}};
    tg_err err = {{0}};
    if (sweep_weights_parse(spec, &w, &err)) {
        FUZZ_ASSERT(!strncmp(err.msg, "--weights '", 11), "refusal: %s", err.msg);
        for (int m = 0; m < SWEEP_METRICS; m++) FUZZ_ASSERT(w.w[m] == -7, "weight %d changed on a refusal", m);
        free(spec);
        return 0;
    }
    double sum = 0;
    for (int m = 0; m < SWEEP_METRICS; m++) {
        FUZZ_ASSERT(isfinite(w.w[m]) && w.w[m] >= 0 && w.w[m] <= 1e6, "weight %d: %g", m, w.w[m]);
        sum += w.w[m];
    }
    FUZZ_ASSERT(sum > 0, "every weight 0 accepted");
    free(spec);
    return 0;
}
