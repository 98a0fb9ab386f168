/* The plan file's payload (private to plan/plan_file.c and plan/plan_codec.c, and the
 * plan file's tests): the explicit
 * little-endian encoding of every tg_plan field, and its decoding with the tables checked. */
#ifndef TUNEGRAPH_PLAN_CODEC_H
#define TUNEGRAPH_PLAN_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "plan/plan.h"

/* The uncompressed payload bytes of `plan` (malloc'd into *out); refuses a plan whose
 * table counts are negative, whose tables are missing, or with an op kind outside the enum. */
int tg_plan_payload_encode(const tg_plan *plan, uint8_t **out, size_t *out_len, tg_err *err);
/* How far the decoder checks what it read. Every reader of plan files gets everything; the
 * tables alone are for the codec's own tests, whose small hand-made plans carry every field
 * and parameter but are not runnable ops. */
typedef enum tg_plan_checks {
    TG_PLAN_CHECK_ALL,    /* tables, then each op and the layout (tg_plan_validate_ops) */
    TG_PLAN_CHECK_TABLES, /* tg_plan_validate_tables only */
} tg_plan_checks;

/* Fills `plan` (zeroed by the caller) from `len` payload bytes; refuses a short or overlong
 * payload, impossible counts, unterminated strings, an op whose kind name this build does not
 * know, inconsistent tables (tg_plan_validate_tables) and, with TG_PLAN_CHECK_ALL, ops
 * inconsistent with their tensors or an unsound layout (tg_plan_validate_ops). `plan` is
 * zeroed first, whatever it held; on failure the caller frees what was filled in. `name` is used in messages. */
int tg_plan_payload_decode(const uint8_t *buf, size_t len, const char *name, tg_plan_checks checks, tg_plan *plan,
                           tg_err *err);
/* tg_plan_decode (plan/plan_file.h) with the payload checked as far as `checks` says. */
int tg_plan_decode_checked(const uint8_t *bytes, size_t len, const char *name, tg_plan_checks checks, tg_plan *plan,
                           tg_err *err);

/* Little-endian reads, shared by the header and the payload. */
static inline uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static inline uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
