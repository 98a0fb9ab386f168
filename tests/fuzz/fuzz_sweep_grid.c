/* libFuzzer target: `tunegraph sweep --grid key=v1,v2` (cli/sweep_spec.c). What it accepts
 * has a non-empty key of [a-z0-9_] of at most 63 bytes and 1 to SWEEP_VALUES_MAX values,
 * each non-empty, short enough, free of control characters and of the separator, and
 * distinct; what it refuses comes with a message naming --grid and leaves the axis empty. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "cli/sweep_spec.h"
#include "tests/fuzz/fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = malloc(size + 1);
    if (!spec) return 0;
    memcpy(spec, data, size);
    spec[size] = 0; /* an argument ends at its first NUL */
    sweep_axis axis;
    tg_err err = {{0}};
    if (sweep_grid_parse(spec, &axis, &err)) {
        FUZZ_ASSERT(!strncmp(err.msg, "--grid '", 8) && axis.n_values == 0 && !axis.key[0], "refusal: %s", err.msg);
        free(spec);
        return 0;
    }
    const size_t key_len = strlen(axis.key);
    FUZZ_ASSERT(key_len >= 1 && key_len <= SWEEP_KEY_MAX && !strncmp(spec, axis.key, key_len) && spec[key_len] == '=',
                "key '%s'", axis.key);
    for (size_t i = 0; i < key_len; i++)
        FUZZ_ASSERT(islower((unsigned char)axis.key[i]) || isdigit((unsigned char)axis.key[i]) || axis.key[i] == '_',
                    "key byte %zu", i);
    FUZZ_ASSERT(axis.n_values >= 1 && axis.n_values <= SWEEP_VALUES_MAX, "%d values", axis.n_values);
    const int bar = strchr(spec + key_len + 1, '|') != NULL;
    size_t joined = 0;
    for (int v = 0; v < axis.n_values; v++) {
        const size_t len = strlen(axis.values[v]);
        FUZZ_ASSERT(len >= 1 && len <= SWEEP_VALUE_MAX, "value %d: %zu bytes", v, len);
        FUZZ_ASSERT(!strchr(axis.values[v], bar ? '|' : ','), "value %d holds the separator", v);
        for (size_t i = 0; i < len; i++) FUZZ_ASSERT(!iscntrl((unsigned char)axis.values[v][i]), "value %d: control", v);
        for (int w = 0; w < v; w++) FUZZ_ASSERT(strcmp(axis.values[v], axis.values[w]), "values %d and %d equal", w, v);
        joined += len + 1;
    }
    /* The values and their separators are the text after '=', in order. */
    FUZZ_ASSERT(joined == strlen(spec) - key_len, "values cover %zu of %zu bytes", joined, strlen(spec) - key_len);
    sweep_axis_free(&axis);
    free(spec);
    return 0;
}
