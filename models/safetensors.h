/* safetensors files: an 8-byte little-endian header length, a JSON header naming each
 * tensor's dtype, shape and byte range, then the raw data. */
#ifndef TUNEGRAPH_SAFETENSORS_H
#define TUNEGRAPH_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef enum tg_st_dtype {
    TG_ST_F32 = 0, TG_ST_F16, TG_ST_BF16, TG_ST_F64, TG_ST_I64, TG_ST_I32, TG_ST_I8, TG_ST_U8,
    TG_ST_BOOL, TG_ST_DTYPE_COUNT
} tg_st_dtype;

typedef struct tg_st_entry {
    char *name;
    int dtype;           /* tg_st_dtype */
    int ndim;
    int64_t shape[8];
    uint64_t begin, end; /* byte range within the data section */
} tg_st_entry;

/* The longest path a safetensors file may be opened by (including the NUL). */
#define TG_ST_PATH_MAX 512

typedef struct tg_safetensors {
    char path[TG_ST_PATH_MAX];
    int n;
    tg_st_entry *entries;
    const uint8_t *data;  /* start of the data section */
    void *map;            /* whole file mapping */
    size_t map_size;
} tg_safetensors;

/* Opens and validates the whole header: JSON with no key named twice in an object, dtype
 * known, byte size = product of shape x dtype size, and the tensors tiling the data
 * section exactly (no overlap, no hole, no trailing bytes). */
int tg_st_open(const char *path, tg_safetensors *st, tg_err *err);
void tg_st_close(tg_safetensors *st);
const tg_st_entry *tg_st_find(const tg_safetensors *st, const char *name);
int64_t tg_st_numel(const tg_st_entry *e);
const char *tg_st_dtype_name(int dtype);

/* Copies a tensor into dst as float32 (from F32, F16, BF16 or F64). Fails, naming the
 * file and tensor, when the element count differs from numel or the dtype is not float. */
int tg_st_read_f32(const tg_safetensors *st, const tg_st_entry *e, float *dst, int64_t numel, tg_err *err);
/* tg_st_read_f32 for values that must be numbers, such as weights: a NaN, an infinity or
 * an F64 value past float32's range is refused, naming the file, the tensor and the
 * element's index. */
int tg_st_read_f32_finite(const tg_safetensors *st, const tg_st_entry *e, float *dst, int64_t numel, tg_err *err);
/* Copies an integer tensor (I64, I32) into dst as int32, failing on overflow. */
int tg_st_read_i32(const tg_safetensors *st, const tg_st_entry *e, int32_t *dst, int64_t numel, tg_err *err);

typedef struct tg_st_item {
    const char *name;
    int dtype;             /* TG_ST_F32, TG_ST_BF16, TG_ST_I32 or TG_ST_I64 */
    int ndim;
    const int64_t *shape;
    const void *data;      /* the values stored in that dtype (little-endian) */
} tg_st_item;

/* Writes a safetensors file atomically (temporary file in the same folder, then rename). */
int tg_st_write(const char *path, const tg_st_item *items, int n, tg_err *err);
/* The same with a __metadata__ object of n_meta string pairs meta[2i] -> meta[2i+1] (Hugging
 * Face writes {"format": "pt"}). */
int tg_st_write_with_metadata(const char *path, const tg_st_item *items, int n, const char *const *meta, int n_meta,
                              tg_err *err);

#endif
