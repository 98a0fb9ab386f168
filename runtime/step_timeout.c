#include "runtime/step_timeout.h"

#include <errno.h>
#include <stdlib.h>

int tg_step_timeout_s(double *out, tg_err *err) {
    const char *env = getenv("TUNEGRAPH_STEP_TIMEOUT_S");
    *out = TG_STEP_TIMEOUT_DEFAULT_S;
    if (!env) return 0;
    char *end;
    errno = 0;
    const double v = strtod(env, &end);
    if (end == env || *end || errno || !(v > 0) || v > 1e9)
        return tg_fail(err, "TUNEGRAPH_STEP_TIMEOUT_S must be a number of seconds above 0, got '%s'", env);
    *out = v;
    return 0;
}
