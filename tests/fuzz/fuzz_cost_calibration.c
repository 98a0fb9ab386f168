/* libFuzzer target: the cost model's calibration file (plan/cost_calibration.c). What it
 * accepts has every field in range, and formats to a text that parses back to the same
 * values and the same text; what it refuses comes with a message naming the file's line. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/cost_calibration.h"
#include "tests/fuzz/fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tg_cost_calibration c, again;
    tg_err err = {{0}};
    if (tg_cost_calibration_parse((const char *)data, size, "fuzz.txt", &c, &err)) {
        FUZZ_ASSERT(!strncmp(err.msg, "fuzz.txt:", 9), "refused without the file and line: %s", err.msg);
        return 0;
    }
    FUZZ_ASSERT(c.device[0] && c.name[0] && c.precision >= 0 && c.precision < TG_PREC_COUNT, "fields");
    FUZZ_ASSERT(c.threads >= 0 && c.threads <= 1024 && c.peak_tflops > 0 && c.peak_gbps > 0 && c.link_gbps > 0 &&
                    c.launch_us >= 0 && isfinite(c.launch_us),
                "scalars out of range");
    for (int g = 0; g < TG_GROUP_COUNT; g++)
        FUZZ_ASSERT(c.eff_flops[g] > 0 && c.eff_flops[g] <= 100 && c.eff_bw[g] > 0 && c.eff_bw[g] <= 100 &&
                        c.samples[g] >= 0,
                    "group %d", g);
    char *text, *text2;
    size_t len, len2;
    FUZZ_ASSERT(tg_cost_calibration_format(&c, &text, &len, &err) == 0, "format: %s", err.msg);
    FUZZ_ASSERT(tg_cost_calibration_parse(text, len, "again.txt", &again, &err) == 0, "reparse: %s", err.msg);
    FUZZ_ASSERT(!memcmp(&c, &again, sizeof c), "the values differ after a round trip");
    FUZZ_ASSERT(tg_cost_calibration_format(&again, &text2, &len2, &err) == 0, "format: %s", err.msg);
    FUZZ_ASSERT(len == len2 && !memcmp(text, text2, len), "the text differs after a round trip");
    free(text);
    free(text2);
    return 0;
}
