#include "models/safetensors.h"
#include "base/alloc.h"

#include "base/atomic_file.h"
#include "base/f16.h"
#include "base/json_strict.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u * 1024u * 1024u)
#define ST_MAX_DIMS 8
#define TG_ST_NAME_IN_MESSAGE 256 /* a repeated key is quoted up to this many bytes */

static const char *const k_dtype_names[TG_ST_DTYPE_COUNT] = {
    "F32", "F16", "BF16", "F64", "I64", "I32", "I8", "U8", "BOOL",
};
static const int k_dtype_sizes[TG_ST_DTYPE_COUNT] = {4, 2, 2, 8, 8, 4, 1, 1, 1};

const char *tg_st_dtype_name(int dtype) {
    return dtype >= 0 && dtype < TG_ST_DTYPE_COUNT ? k_dtype_names[dtype] : "?";
}

static int dtype_from_name(const char *s) {
    for (int i = 0; i < TG_ST_DTYPE_COUNT; i++)
        if (strcmp(s, k_dtype_names[i]) == 0) return i;
    return -1;
}

int64_t tg_st_numel(const tg_st_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

/* "[768, 768]" for messages. */
static void format_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t len = 0;
    len += (size_t)snprintf(buf, cap, "[");
    /* GCOVR_EXCL_BR_START: callers pass 256 bytes; 8 dimensions of 20 characters fill 177 */
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
    /* GCOVR_EXCL_BR_STOP */
}

void tg_st_close(tg_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->entries[i].name);
    free(st->entries);
    if (st->map) munmap(st->map, st->map_size);
    memset(st, 0, sizeof *st);
}

/* Parses one header entry into e; data_size bounds the byte range. */
static int parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size,
                       tg_st_entry *e, tg_err *err) {
    if (!json_is_object(v)) /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: a member's value is never NULL */
        return tg_fail(err, "%s: tensor '%s': header entry is not a JSON object", path, name);

    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return tg_fail(err, "%s: tensor '%s': field 'dtype' missing or not a string", path, name);
    e->dtype = dtype_from_name(json_string_value(dt));
    if (e->dtype < 0)
        return tg_fail(err,
                       "%s: tensor '%s': field 'dtype': unknown dtype '%s' (expected F32, F16, BF16, "
                       "F64, I64, I32, I8, U8 or BOOL)",
                       path, name, json_string_value(dt));

    json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape))
        return tg_fail(err, "%s: tensor '%s': field 'shape' missing or not an array", path, name);
    size_t nd = json_array_size(shape);
    if (nd > ST_MAX_DIMS)
        return tg_fail(err, "%s: tensor '%s': field 'shape' has %zu dimensions (at most %d)", path,
                       name, nd, ST_MAX_DIMS);
    e->ndim = (int)nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0) /* GCOVR_EXCL_BR_LINE: json_is_integer's NULL test: an element below the array's size is never NULL */
            return tg_fail(err, "%s: tensor '%s': field 'shape': dimension %zu is not a non-negative integer",
                           path, name, i);
        e->shape[i] = (int64_t)json_integer_value(d);
        if (__builtin_mul_overflow(numel, (uint64_t)e->shape[i], &numel)) overflow = 1;
    }
    uint64_t need = 0;
    if (overflow || __builtin_mul_overflow(numel, (uint64_t)k_dtype_sizes[e->dtype], &need) ||
        need > (uint64_t)INT64_MAX)
        return tg_fail(err, "%s: tensor '%s': field 'shape': element count overflows", path, name);

    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 || /* GCOVR_EXCL_BR_LINE: the NULL tests inside json_is_integer: an array of 2 has both elements */
        !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)) || /* GCOVR_EXCL_BR_LINE: the NULL tests inside json_is_integer: an array of 2 has both elements */
        json_integer_value(json_array_get(off, 0)) < 0 || json_integer_value(json_array_get(off, 1)) < 0)
        return tg_fail(err,
                       "%s: tensor '%s': field 'data_offsets' must be [begin, end] with non-negative integers",
                       path, name);
    e->begin = (uint64_t)json_integer_value(json_array_get(off, 0));
    e->end = (uint64_t)json_integer_value(json_array_get(off, 1));
    if (e->begin > e->end || e->end > data_size)
        return tg_fail(err,
                       "%s: tensor '%s': data_offsets [%llu, %llu] out of range (data section holds %llu bytes)",
                       path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)data_size);
    if (e->end - e->begin != need) {
        char sh[256];
        format_shape(sh, sizeof sh, e->shape, e->ndim);
        return tg_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but shape %s of %s needs %llu",
                       path, name, (unsigned long long)e->begin, (unsigned long long)e->end,
                       (unsigned long long)(e->end - e->begin), sh, tg_st_dtype_name(e->dtype),
                       (unsigned long long)need);
    }
    e->name = tg_strdup(name);
    if (!e->name) return tg_fail(err, "%s: out of memory", path);
    return 0;
}

/* By start, then end, so an empty tensor sorts before a tensor starting where it sits. */
static int cmp_range(const void *a, const void *b) {
    const tg_st_entry *x = *(const tg_st_entry *const *)a, *y = *(const tg_st_entry *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors must tile the data section exactly, as the safetensors format requires:
 * sorted by range, each starts where the one before ends (no overlap, no hole; an empty
 * tensor sits on a boundary), the first at 0 and the last at the section's end (no
 * trailing bytes). Anything else is a damaged file, or a header length that is off, which
 * shifts every tensor. */
static int check_tiling(tg_safetensors *st, uint64_t data_size, uint64_t header_len, tg_err *err) {
    if (st->n == 0) {
        if (data_size == 0) return 0;
        return tg_fail(err, "%s: the header names no tensor but %llu bytes of data follow it (header length %llu)",
                       st->path, (unsigned long long)data_size, (unsigned long long)header_len);
    }
    const tg_st_entry **order = tg_malloc(sizeof *order * (size_t)st->n);
    if (!order) return tg_fail(err, "%s: out of memory", st->path);
    for (int i = 0; i < st->n; i++) order[i] = &st->entries[i];
    qsort(order, (size_t)st->n, sizeof *order, cmp_range);
    int rc = 0;
    uint64_t at = 0;
    for (int i = 0; i < st->n && !rc; i++) {
        const tg_st_entry *e = order[i], *prev = i ? order[i - 1] : NULL;
        if (e->begin < at) /* only after a tensor: at is 0 before the first */
            rc = tg_fail(err, "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", st->path, prev->name,
                         (unsigned long long)prev->begin, (unsigned long long)prev->end, e->name,
                         (unsigned long long)e->begin, (unsigned long long)e->end);
        else if (e->begin > at)
            rc = tg_fail(err,
                         "%s: bytes [%llu, %llu) of the data section belong to no tensor (a hole %s%s%s'%s'): "
                         "tensors must tile the data section exactly",
                         st->path, (unsigned long long)at, (unsigned long long)e->begin, prev ? "between '" : "before",
                         prev ? prev->name : "", prev ? "' and " : " ", e->name);
        at = e->end;
    }
    if (!rc && at != data_size)
        rc = tg_fail(err,
                     "%s: the data section holds %llu bytes but its tensors end at byte %llu: %llu trailing byte%s "
                     "belong to no tensor (bytes appended to the file, or a header length, %llu, that is too small)",
                     st->path, (unsigned long long)data_size, (unsigned long long)at,
                     (unsigned long long)(data_size - at), data_size - at == 1 ? "" : "s", (unsigned long long)header_len);
    free(order);
    return rc;
}

static int parse_header(tg_safetensors *st, const char *hdr, size_t hlen, uint64_t data_size, tg_err *err) {
    json_error_t jerr;
    char dup[TG_ST_NAME_IN_MESSAGE];
    json_t *root = tg_json_loadb_strict(hdr, hlen, 0, &jerr, dup, sizeof dup);
    if (!root && tg_json_out_of_memory(&jerr)) return tg_fail(err, "%s: out of memory parsing the header", st->path);
    if (!root && dup[0])
        return tg_fail(err, "%s: header: key '%s' appears twice in one object (line %d, column %d)", st->path, dup,
                       jerr.line, jerr.column);
    if (!root) {
        /* The JSON cut short, or followed by more: the length field may be what is wrong. */
        const enum json_error_code code = json_error_code(&jerr);
        const int length_suspect = code == json_error_premature_end_of_input || code == json_error_end_of_input_expected;
        if (length_suspect)
            return tg_fail(err, "%s: header is not valid JSON (line %d, column %d: %s); is the header length, %llu, right?",
                           st->path, jerr.line, jerr.column, jerr.text, (unsigned long long)hlen);
        return tg_fail(err, "%s: header is not valid JSON (line %d, column %d: %s)", st->path, jerr.line, jerr.column,
                       jerr.text);
    }
    int rc = 0;
    if (!json_is_object(root)) { /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: root is not NULL here (refused above) */
        rc = tg_fail(err, "%s: header is not a JSON object", st->path);
        goto done;
    }
    json_t *meta = json_object_get(root, "__metadata__");
    if (meta) {
        const char *k;
        json_t *v;
        if (!json_is_object(meta)) { /* GCOVR_EXCL_BR_LINE: json_is_object's NULL test: inside if (meta) */
            rc = tg_fail(err, "%s: field '__metadata__' is not an object", st->path);
            goto done;
        }
        json_object_foreach(meta, k, v) { /* GCOVR_EXCL_BR_LINE: jansson's json_object_foreach: a key's value is never NULL */
            if (!json_is_string(v)) { /* GCOVR_EXCL_BR_LINE: json_is_string's NULL test: a member's value is never NULL */
                rc = tg_fail(err, "%s: field '__metadata__': value of '%s' is not a string", st->path, k);
                goto done;
            }
        }
    }
    size_t count = json_object_size(root) - (meta ? 1 : 0);
    st->entries = tg_calloc(count ? count : 1, sizeof *st->entries);
    if (!st->entries) {
        rc = tg_fail(err, "%s: out of memory", st->path);
        goto done;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) { /* GCOVR_EXCL_BR_LINE: jansson's json_object_foreach: a key's value is never NULL */
        if (strcmp(name, "__metadata__") == 0) continue;
        if (parse_entry(st->path, name, v, data_size, &st->entries[st->n], err) != 0) {
            rc = -1;
            goto done;
        }
        st->n++;
    }
    rc = check_tiling(st, data_size, hlen, err);
done:
    json_decref(root);
    return rc;
}

int tg_st_open(const char *path, tg_safetensors *st, tg_err *err) {
    memset(st, 0, sizeof *st);
    if (strlen(path) >= sizeof st->path) return tg_fail(err, "%s: path too long", path);
    snprintf(st->path, sizeof st->path, "%s", path);

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tg_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) { /* GCOVR_EXCL_BR_LINE: fstat of a descriptor open() just gave cannot fail here */
        int e = errno;
        close(fd);
        return tg_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return tg_fail(err, "%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return tg_fail(err, "%s: file is %llu bytes, too short for a safetensors header length (8 bytes)",
                       path, (unsigned long long)size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) /* GCOVR_EXCL_BR_LINE: a readable regular file maps unless the address space is full */
        return tg_fail(err, "%s: cannot mmap: %s", path, strerror(map_errno));
    st->map = map;
    st->map_size = (size_t)size;

    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i]; /* little-endian on any host */
    if (hlen > size - 8) {
        tg_fail(err, "%s: header length %llu runs past the end of the file (%llu bytes)", path,
                (unsigned long long)hlen, (unsigned long long)size);
        goto fail;
    }
    if (hlen > ST_MAX_HEADER) {
        tg_fail(err, "%s: header length %llu exceeds the 100 MB limit", path, (unsigned long long)hlen);
        goto fail;
    }
    st->data = p + 8 + hlen;
    if (parse_header(st, (const char *)p + 8, (size_t)hlen, size - 8 - hlen, err) != 0) goto fail;
    return 0;
fail:
    tg_st_close(st);
    return -1;
}

const tg_st_entry *tg_st_find(const tg_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->entries[i].name, name) == 0) return &st->entries[i];
    return NULL;
}

static int check_numel(const tg_safetensors *st, const tg_st_entry *e, int64_t numel, tg_err *err) {
    int64_t have = tg_st_numel(e);
    if (have == numel) return 0;
    char sh[256];
    format_shape(sh, sizeof sh, e->shape, e->ndim);
    return tg_fail(err, "%s: tensor '%s': wrong shape: the file has %s (%lld elements) but %lld elements are expected",
                   st->path, e->name, sh, (long long)have, (long long)numel);
}

/* Data is only byte-aligned in general, so every element goes through memcpy. */
int tg_st_read_f32(const tg_safetensors *st, const tg_st_entry *e, float *dst, int64_t numel, tg_err *err) {
    if (check_numel(st, e, numel, err) != 0) return -1;
    if (numel == 0) return 0; /* dst may be NULL for an empty tensor */
    const uint8_t *src = st->data + e->begin;
    switch (e->dtype) {
    case TG_ST_F32:
        memcpy(dst, src, (size_t)numel * 4);
        return 0;
    case TG_ST_F16:
        for (int64_t i = 0; i < numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = tg_f32_from_f16(h);
        }
        return 0;
    case TG_ST_BF16:
        for (int64_t i = 0; i < numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        return 0;
    case TG_ST_F64:
        for (int64_t i = 0; i < numel; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            dst[i] = (float)d;
        }
        return 0;
    default:
        return tg_fail(err, "%s: tensor '%s' has dtype %s, expected a float dtype (F32, F16, BF16 or F64)",
                       st->path, e->name, tg_st_dtype_name(e->dtype));
    }
}

/* Index of the first non-finite value of x[0..n), or -1: blocks are checked without a
 * branch per element (an infinity or NaN has every exponent bit set), so the check costs
 * little beside the copy. */
static int64_t first_non_finite(const float *x, int64_t n) {
    enum { BLOCK = 4096 };
    for (int64_t b = 0; b < n; b += BLOCK) {
        const int64_t end = n - b < BLOCK ? n : b + BLOCK;
        uint32_t any = 0;
        for (int64_t i = b; i < end; i++) {
            uint32_t bits;
            memcpy(&bits, &x[i], 4);
            any |= (bits & 0x7f800000u) == 0x7f800000u;
        }
        if (!any) continue;
        int64_t i = b; /* `any`: one of x[b..end) is not finite */
        while (isfinite(x[i])) i++;
        return i;
    }
    return -1;
}

int tg_st_read_f32_finite(const tg_safetensors *st, const tg_st_entry *e, float *dst, int64_t numel, tg_err *err) {
    if (tg_st_read_f32(st, e, dst, numel, err)) return -1;
    const int64_t i = first_non_finite(dst, numel);
    if (i < 0) return 0;
    if (e->dtype == TG_ST_F64) {
        double d;
        memcpy(&d, st->data + e->begin + 8 * (uint64_t)i, 8);
        if (isfinite(d))
            return tg_fail(err, "%s: tensor '%s' (F64): element %lld = %g is outside float32's range", st->path,
                           e->name, (long long)i, d);
    }
    return tg_fail(err, "%s: tensor '%s' (%s): element %lld is %s; weights must be finite numbers", st->path, e->name,
                   tg_st_dtype_name(e->dtype), (long long)i,
                   isnan(dst[i]) ? "NaN" : dst[i] > 0 ? "+infinity" : "-infinity");
}

int tg_st_read_i32(const tg_safetensors *st, const tg_st_entry *e, int32_t *dst, int64_t numel, tg_err *err) {
    if (check_numel(st, e, numel, err) != 0) return -1;
    if (numel == 0) return 0; /* dst may be NULL for an empty tensor */
    const uint8_t *src = st->data + e->begin;
    switch (e->dtype) {
    case TG_ST_I32:
        memcpy(dst, src, (size_t)numel * 4);
        return 0;
    case TG_ST_I64:
        for (int64_t i = 0; i < numel; i++) {
            int64_t v;
            memcpy(&v, src + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return tg_fail(err, "%s: tensor '%s': element %lld = %lld does not fit in int32", st->path,
                               e->name, (long long)i, (long long)v);
            dst[i] = (int32_t)v;
        }
        return 0;
    default:
        return tg_fail(err, "%s: tensor '%s' has dtype %s, expected an integer dtype (I64 or I32)", st->path,
                       e->name, tg_st_dtype_name(e->dtype));
    }
}

/* The dtypes a file may be written in: the bytes in `data` are stored as they are. */
static int writable_dtype(int dtype) {
    return dtype == TG_ST_F32 || dtype == TG_ST_I32 || dtype == TG_ST_BF16 || dtype == TG_ST_I64;
}

/* Bytes of one item's data. */
static size_t item_bytes(const tg_st_item *it) {
    size_t bytes = (size_t)k_dtype_sizes[it->dtype];
    for (int d = 0; d < it->ndim; d++) bytes *= (size_t)it->shape[d];
    return bytes;
}

/* Builds the JSON header for items laid out back to back in the given order, with
 * __metadata__ from the key/value pairs meta[0..2*n_meta). */
static json_t *build_header(const char *path, const tg_st_item *items, int n, const char *const *meta, int n_meta,
                            uint64_t *data_bytes, tg_err *err) {
    json_t *root = json_object();
    if (!root) {
        tg_fail(err, "%s: out of memory", path);
        return NULL;
    }
    if (n_meta > 0) {
        json_t *m = json_object();
        if (json_object_set_new(root, "__metadata__", m)) {
            tg_fail(err, "%s: out of memory", path);
            goto fail;
        }
        for (int i = 0; i < n_meta; i++) {
            const long failed = tg_alloc_failures(); /* jansson fails the same way out of memory */
            if (json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1]))) {
                tg_fail(err, "%s: __metadata__ '%s': %s", path, meta[2 * i],
                        tg_alloc_failures() != failed ? "out of memory" : "not valid UTF-8");
                goto fail;
            }
        }
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const tg_st_item *it = &items[i];
        const char *name = it->name ? it->name : "(null)";
        if (!it->name || !it->name[0] || strcmp(it->name, "__metadata__") == 0) {
            tg_fail(err, "%s: tensor %d: invalid name '%s'", path, i, name);
            goto fail;
        }
        if (json_object_get(root, it->name)) {
            tg_fail(err, "%s: tensor '%s': name appears twice", path, name);
            goto fail;
        }
        if (!writable_dtype(it->dtype)) {
            tg_fail(err, "%s: tensor '%s': dtype %s cannot be written (only F32, BF16, I32 and I64)", path, name,
                    tg_st_dtype_name(it->dtype));
            goto fail;
        }
        if (it->ndim < 0 || it->ndim > ST_MAX_DIMS || (it->ndim > 0 && !it->shape)) {
            tg_fail(err, "%s: tensor '%s': invalid ndim %d", path, name, it->ndim);
            goto fail;
        }
        uint64_t numel = 1;
        json_t *shape = json_array();
        json_t *obj = json_object();
        json_t *offs = json_array();
        if (!shape || !obj || !offs) {
            json_decref(shape), json_decref(obj), json_decref(offs);
            tg_fail(err, "%s: out of memory", path);
            goto fail;
        }
        /* Each of these fails only out of memory (ASCII keys and values): checked below,
         * so that no header goes out with a field missing. */
        int entry_failed = 0;
        tg_json_put(obj, "dtype", json_string(tg_st_dtype_name(it->dtype)), &entry_failed);
        tg_json_put(obj, "shape", shape, &entry_failed);
        tg_json_put(obj, "data_offsets", offs, &entry_failed);
        if (entry_failed) { /* a failed set has released its value: shape and offs may be gone */
            json_decref(obj);
            tg_fail(err, "%s: tensor '%s': out of memory for its header entry", path, name);
            goto fail;
        }
        const long failed = tg_alloc_failures(); /* jansson fails the same way out of memory */
        if (json_object_set_new(root, it->name, obj) != 0) { /* frees obj either way */
            tg_fail(err, "%s: tensor %d: %s", path, i,
                    tg_alloc_failures() != failed ? "out of memory" : "name is not valid UTF-8");
            goto fail;
        }
        for (int d = 0; d < it->ndim; d++) {
            if (it->shape[d] < 0) {
                tg_fail(err, "%s: tensor '%s': dimension %d is negative (%lld)", path, name, d,
                        (long long)it->shape[d]);
                goto fail;
            }
            numel *= (uint64_t)it->shape[d];
            tg_json_push(shape, json_integer(it->shape[d]), &entry_failed);
        }
        uint64_t bytes = numel * (uint64_t)k_dtype_sizes[it->dtype];
        if (bytes > 0 && !it->data) {
            tg_fail(err, "%s: tensor '%s': no data", path, name);
            goto fail;
        }
        tg_json_push(offs, json_integer((json_int_t)off), &entry_failed);
        tg_json_push(offs, json_integer((json_int_t)(off + bytes)), &entry_failed);
        if (entry_failed) {
            tg_fail(err, "%s: tensor '%s': out of memory for its header entry", path, name);
            goto fail;
        }
        off += bytes;
    }
    *data_bytes = off;
    return root;
fail:
    json_decref(root);
    return NULL;
}

int tg_st_write(const char *path, const tg_st_item *items, int n, tg_err *err) {
    return tg_st_write_with_metadata(path, items, n, NULL, 0, err);
}

int tg_st_write_with_metadata(const char *path, const tg_st_item *items, int n, const char *const *meta, int n_meta,
                              tg_err *err) {
    uint64_t data_bytes = 0;
    json_t *root = build_header(path, items, n, meta, n_meta, &data_bytes, err);
    if (!root) return -1;
    /* jansson's dump goes on past some failed growths of its buffer with the bytes
     * dropped: a header made while an allocation failed is not the header either. */
    const long failed = tg_alloc_failures();
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (text && tg_alloc_failures() != failed) {
        free(text);
        text = NULL;
    }
    if (!text) return tg_fail(err, "%s: out of memory writing the header", path); /* its only failure */
    size_t tlen = strlen(text);
    size_t hlen = (tlen + 7) & ~(size_t)7; /* keeps the data section 8-byte aligned */
    char *hdr = tg_malloc(8 + hlen);
    if (!hdr) {
        free(text);
        return tg_fail(err, "%s: out of memory", path);
    }
    for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)hlen >> (8 * i)) & 0xff);
    memcpy(hdr + 8, text, tlen);
    memset(hdr + 8 + tlen, ' ', hlen - tlen);
    free(text);

    tg_chunk *chunks = tg_calloc((size_t)n + 1, sizeof *chunks);
    if (!chunks) {
        free(hdr);
        return tg_fail(err, "%s: out of memory", path);
    }
    chunks[0] = (tg_chunk){hdr, 8 + hlen};
    for (int i = 0; i < n; i++) chunks[i + 1] = (tg_chunk){items[i].data, item_bytes(&items[i])};
    int rc = tg_write_file_atomic(path, chunks, n + 1, "safetensors file", err);
    free(chunks);
    free(hdr);
    return rc;
}
