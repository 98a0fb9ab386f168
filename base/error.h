/* Error reporting shared by every layer: a function that can fail takes a tg_err*,
 * fills it with a message naming the file, field and cause, and returns -1. */
#ifndef TUNEGRAPH_ERROR_H
#define TUNEGRAPH_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tg_err {
    char msg[1024];
} tg_err;

/* Formats the message into err (if non-NULL) and returns -1, so callers can write
 * `return tg_fail(err, "...")`. */
int tg_fail(tg_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to an existing message (e.g. the file being read). */
int tg_fail_context(tg_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
