/* libFuzzer target: safetensors files (tg_st_open), then every entry read as the loader
 * would: float dtypes with tg_st_read_f32 (and tg_st_read_f32_finite, refusing exactly the
 * non-finite values), integer ones with tg_st_read_i32, the others refused by both. */
#include <math.h>
#include <string.h>

#include "models/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

static int is_float(int dtype) {
    return dtype == TG_ST_F32 || dtype == TG_ST_F16 || dtype == TG_ST_BF16 || dtype == TG_ST_F64;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    tg_safetensors st;
    tg_err err;
    if (tg_st_open(path, &st, &err) != 0) {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
        return 0;
    }
    uint64_t data_size = st.map_size - (uint64_t)(st.data - (const uint8_t *)st.map);
    for (int i = 0; i < st.n; i++) {
        const tg_st_entry *e = &st.entries[i];
        FUZZ_ASSERT(e->begin <= e->end && e->end <= data_size, "'%s' [%llu, %llu] of %llu", e->name,
                    (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_size);
        FUZZ_ASSERT(tg_st_find(&st, e->name) != NULL, "'%s' not found by name", e->name);
        int64_t numel = tg_st_numel(e);
        FUZZ_ASSERT(numel >= 0 && (uint64_t)numel <= e->end - e->begin,
                    "'%s' has %lld elements in %llu bytes", e->name, (long long)numel,
                    (unsigned long long)(e->end - e->begin));
        /* 4 bytes per element for either destination; at least one byte so dst is real. */
        void *dst = malloc((size_t)numel * 4 + 4);
        if (!dst) abort();
        int f = tg_st_read_f32(&st, e, dst, numel, &err) == 0;
        if (f) { /* the weights loader's read: refused exactly when a value is not finite */
            int finite = 1;
            for (int64_t k = 0; k < numel; k++) finite &= isfinite(((const float *)dst)[k]) != 0;
            int ok = tg_st_read_f32_finite(&st, e, dst, numel, &err) == 0;
            FUZZ_ASSERT(ok == finite, "'%s' (%s): finite read gave %d for finite %d", e->name,
                        tg_st_dtype_name(e->dtype), ok, finite);
        }
        int n = tg_st_read_i32(&st, e, dst, numel, &err) == 0;
        int is_int = e->dtype == TG_ST_I32 || e->dtype == TG_ST_I64;
        /* Empty tensors are read by either; an int64 value past int32 fails the int read. */
        FUZZ_ASSERT(numel == 0 || f == is_float(e->dtype), "'%s' (%s) f32 read gave %d", e->name,
                    tg_st_dtype_name(e->dtype), f);
        FUZZ_ASSERT(numel == 0 || !n || is_int, "'%s' (%s) i32 read succeeded", e->name, tg_st_dtype_name(e->dtype));
        FUZZ_ASSERT(e->dtype != TG_ST_I32 || numel == 0 || n, "'%s' I32 read failed: %s", e->name, err.msg);
        /* A caller expecting another element count is refused. */
        FUZZ_ASSERT(tg_st_read_f32(&st, e, dst, numel + 1, &err) != 0, "'%s' read with a wrong count", e->name);
        free(dst);
    }
    tg_st_close(&st);
    return 0;
}
