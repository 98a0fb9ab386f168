/* The rank a launcher gave this process (runtime/launch_env.h). */
#include "runtime/launch_env.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tg_launcher_name(int launcher) {
    static const char *const names[TG_LAUNCHER_COUNT] = {"none", "torchrun", "mpirun", "srun"};
    return launcher >= 0 && launcher < TG_LAUNCHER_COUNT ? names[launcher] : "?";
}

static const char *process_env(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

/* A whole decimal number in [lo, hi] (no sign, no blanks): 0, or -1 naming the variable. */
static int env_int(const char *name, const char *v, long lo, long hi, int *out, tg_err *err) {
    char *end = NULL;
    errno = 0;
    const long n = v && isdigit((unsigned char)v[0]) ? strtol(v, &end, 10) : -1;
    if (!v || !end || *end || errno || n < lo || n > hi)
        return tg_fail(err, "environment variable %s='%s': want a whole number from %ld to %ld", name, v ? v : "",
                       lo, hi);
    *out = (int)n;
    return 0;
}

/* A launcher's variables: rank, size, local rank (required) and local size (optional, NULL
 * for none). The rank's variable says whether the launcher started this process (a
 * WORLD_SIZE alone is no launch); with it, the others must be there. 1 when they are set
 * (read into out), 0 when the rank's is not, -1 on a partial or bad set. */
static int read_set(tg_env_lookup get, void *ctx, const char *const names[4], tg_rank_env *out, tg_err *err) {
    const char *v[4];
    for (int k = 0; k < 4; k++) v[k] = names[k] ? get(names[k], ctx) : NULL;
    if (!v[0]) return 0;
    for (int k = 1; k < 3; k++)
        if (!v[k])
            return tg_fail(err, "environment variable %s is not set, but %s is (a launcher sets them together)", names[k],
                           names[0]);
    if (env_int(names[1], v[1], 1, TG_LAUNCH_MAX_RANKS, &out->world_size, err) ||
        env_int(names[0], v[0], 0, out->world_size - 1, &out->rank, err))
        return -1;
    out->local_size = 0;
    if (v[3] && env_int(names[3], v[3], 1, out->world_size, &out->local_size, err)) return -1;
    if (env_int(names[2], v[2], 0, (out->local_size ? out->local_size : out->world_size) - 1, &out->local_rank, err))
        return -1;
    return 1;
}

/* MASTER_ADDR and MASTER_PORT where set (the port 1 to 65535). */
static int read_master(tg_env_lookup get, void *ctx, tg_rank_env *out, tg_err *err) {
    const char *addr = get("MASTER_ADDR", ctx), *port = get("MASTER_PORT", ctx);
    if (addr) {
        if (!addr[0] || strlen(addr) >= sizeof out->master_addr)
            return tg_fail(err, "environment variable MASTER_ADDR='%.64s': want a host name or address of 1 to %zu bytes",
                           addr, sizeof out->master_addr - 1);
        snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
    }
    return port ? env_int("MASTER_PORT", port, 1, 65535, &out->master_port, err) : 0;
}

int tg_rank_env_read(tg_rank_env *out, tg_env_lookup lookup, void *ctx, tg_err *err) {
    static const char *const torchrun[4] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
    static const char *const openmpi[4] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE"};
    static const char *const slurm[4] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL};
    static const char *const *const sets[3] = {torchrun, openmpi, slurm};
    static const int launchers[3] = {TG_LAUNCHER_TORCHRUN, TG_LAUNCHER_OPENMPI, TG_LAUNCHER_SLURM};
    tg_env_lookup get = lookup ? lookup : process_env;
    memset(out, 0, sizeof *out);
    out->world_size = 1;
    for (int s = 0; s < 3; s++) {
        tg_rank_env r;
        memset(&r, 0, sizeof r);
        const int rc = read_set(get, ctx, sets[s], &r, err);
        if (rc < 0) return tg_fail_context(err, "reading the rank %s gave this process", tg_launcher_name(launchers[s]));
        if (!rc) continue;
        r.launcher = launchers[s];
        if (read_master(get, ctx, &r, err)) return tg_fail_context(err, "reading the rank's rendezvous");
        if (!r.master_addr[0] && r.launcher == TG_LAUNCHER_SLURM) {
            const char *list = get("SLURM_JOB_NODELIST", ctx);
            if (!list) list = get("SLURM_NODELIST", ctx);
            if (list && tg_slurm_first_host(list, r.master_addr, sizeof r.master_addr, err))
                return tg_fail_context(err, "finding the first host of the Slurm job (SLURM_JOB_NODELIST)");
        }
        *out = r;
        return 0;
    }
    return 0;
}

/* Appends s[0, n) to host[*len]; -1 when it would not fit. */
static int append(char *host, size_t cap, size_t *len, const char *s, size_t n) {
    if (*len + n + 1 > cap) return -1;
    memcpy(host + *len, s, n);
    *len += n;
    host[*len] = 0;
    return 0;
}

/* The range list of a bracket, [p, close): "01-04,07"; each range digits or digits-digits
 * with its start at most its end. Its first number's text in *first, *first_len. */
static int check_ranges(const char *p, const char *close, const char **first, size_t *first_len) {
    *first = NULL;
    while (p < close) {
        const char *a = p;
        while (p < close && isdigit((unsigned char)*p)) p++;
        if (p == a) return -1;
        if (!*first) *first = a, *first_len = (size_t)(p - a);
        if (p < close && *p == '-') {
            const char *b = ++p;
            while (p < close && isdigit((unsigned char)*p)) p++;
            if (p == b || strtoull(a, NULL, 10) > strtoull(b, NULL, 10)) return -1;
        }
        if (p < close && *p != ',') return -1;
        if (p < close) {
            p++;
            if (p == close) return -1; /* a trailing comma */
        }
    }
    return *first ? 0 : -1;
}

/* The bracket opening at *p: past its ']' when it closes, holds no '[' and well-formed
 * ranges (their first number in *first, *first_len), else NULL. */
static const char *past_bracket(const char *p, const char **first, size_t *first_len) {
    const char *close = strchr(p, ']'), *open = strchr(p + 1, '[');
    if (!close || (open && open < close) || check_ranges(p + 1, close, first, first_len)) return NULL;
    return close + 1;
}

int tg_slurm_first_host(const char *nodelist, char *host, size_t cap, tg_err *err) {
    size_t len = 0, first_len;
    if (cap) host[0] = 0;
    const char *p = nodelist;
    int bad = !p[0] || p[0] == ',';
    while (!bad && *p && *p != ',') {
        if (*p == '[') {
            const char *first, *next = past_bracket(p, &first, &first_len);
            bad = !next || append(host, cap, &len, first, first_len);
            p = next;
        } else if (*p == ']' || iscntrl((unsigned char)*p) || *p == ' ') {
            bad = 1;
        } else {
            bad = append(host, cap, &len, p, 1);
            p++;
        }
    }
    /* The rest of the list: brackets balanced and ranges well formed too. */
    while (!bad && *p) {
        if (*p == '[') {
            const char *first;
            p = past_bracket(p, &first, &first_len);
            bad = !p;
        } else {
            bad = *p == ']' || iscntrl((unsigned char)*p) || *p == ' ' || (*p == ',' && (!p[1] || p[1] == ','));
            p++;
        }
    }
    if (bad || !len) {
        if (cap) host[0] = 0;
        return tg_fail(err,
                       "Slurm node list '%.200s': not a list of host names with bracketed number ranges such as "
                       "gpu[01-04,07],cpu3, or its first host is longer than %zu bytes",
                       nodelist, cap ? cap - 1 : 0);
    }
    return 0;
}
