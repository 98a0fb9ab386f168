/* libFuzzer target: job files (tg_job_load). The input up to its first NUL byte is the
 * file; each NUL-separated piece after it is a --set override (at most 8). */
#include <string.h>

#include "compiler/job.h"
#include "tests/fuzz/fuzz_input.h"

#define MAX_OVERRIDES 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t file_len = nul ? (size_t)(nul - data) : size;
    const char *path = fuzz_input_file(data, file_len);

    /* The overrides, each copied out so it is NUL-terminated. */
    char *rest = NULL;
    const char *overrides[MAX_OVERRIDES];
    int n = 0;
    if (nul) {
        size_t rest_len = size - file_len - 1;
        rest = malloc(rest_len + 1);
        if (!rest) abort();
        memcpy(rest, nul + 1, rest_len);
        rest[rest_len] = 0;
        for (char *p = rest; n < MAX_OVERRIDES && p <= rest + rest_len; p += strlen(p) + 1) overrides[n++] = p;
    }

    tg_job job;
    tg_err err;
    if (tg_job_load(path, overrides, n, &job, &err) == 0) {
        /* A loaded job passed the cross-key checks. */
        FUZZ_ASSERT(job.model[0] && job.train_data[0], "model '%s', train_data '%s'", job.model, job.train_data);
        FUZZ_ASSERT((job.steps > 0) != (job.epochs > 0), "steps %d, epochs %d", job.steps, job.epochs);
        FUZZ_ASSERT(job.batch > 0 && job.seq > 0 && job.data_parallel >= 1 && job.data_parallel <= TG_MAX_DATA_PARALLEL,
                    "batch %d, seq %d, data_parallel %d", job.batch, job.seq, job.data_parallel);
        char where[TG_PATH_MAX + 64];
        for (int k = 0; k < TG_JOB_KEY_COUNT; k++) tg_job_where(&job, k, where, (int)sizeof where);
    } else {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
    }
    free(rest);
    return 0;
}
