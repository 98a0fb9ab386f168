/* The plan file: a fixed header (magic "TGPLAN\0\0", format version, payload sizes,
 * xxh64 of the compressed payload) followed by the zstd-compressed payload, an explicit
 * little-endian encoding of every tg_plan field. Written atomically. */
#ifndef TUNEGRAPH_PLAN_FILE_H
#define TUNEGRAPH_PLAN_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* The exact file bytes (malloc'd into *out). Same plan -> same bytes. */
int tg_plan_encode(const tg_plan *plan, uint8_t **out, size_t *out_len, tg_err *err);
/* Decodes file bytes; `name` is used in messages. Refuses a short file, wrong magic,
 * other version, checksum mismatch, a payload whose tables are inconsistent (indices out of
 * range, offsets past their pool), an op inconsistent with its tensors, or an unsound layout
 * (plan/validate.h). */
int tg_plan_decode(const uint8_t *bytes, size_t len, const char *name, tg_plan *plan, tg_err *err);

int tg_plan_write(const tg_plan *plan, const char *path, tg_err *err);
int tg_plan_read(const char *path, tg_plan *plan, tg_err *err);

/* True when the file starts with the plan magic (used by `run PLAN|JOB`). */
int tg_plan_file_sniff(const char *path);

#endif
