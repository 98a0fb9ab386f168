/* The cost model's calibration file (plan/cost_calibration.h). */
#include "plan/cost_calibration.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/alloc.h"
#include "base/atomic_file.h"
#include "base/text_file.h"

/* The keys after the header, in file order: the scalars, then one group.NAME per group. */
static const char *const scalar_keys[] = {"device", "name", "precision", "threads",
                                          "peak_tflops", "peak_gbps", "link_gbps", "launch_us"};
enum { N_SCALARS = sizeof scalar_keys / sizeof scalar_keys[0] };
/* The groups' keys (group.KEY): one word each, in tg_op_group order. */
static const char *const group_keys[TG_GROUP_COUNT] = {
    [TG_GROUP_MATMUL] = "matmul", [TG_GROUP_ATTENTION] = "attention", [TG_GROUP_NORM] = "norm",
    [TG_GROUP_EMBEDDING] = "embedding", [TG_GROUP_LOSS] = "loss", [TG_GROUP_OPTIMIZER] = "optimizer",
    [TG_GROUP_MEMORY] = "memory", [TG_GROUP_COMM] = "comm",
};

/* The keys after the groups (version 2). */
static const char *const tail_keys[] = {"matmul_gflop_half", "attention.own", "attention.cudnn", "graph_launch_us",
                                        "update_overlap"};
enum { N_TAIL = sizeof tail_keys / sizeof tail_keys[0] };

/* A real in [lo, hi] (lo_open: lo excluded) written as all of text[0..n). */
static int parse_real(const char *text, size_t n, double lo, int lo_open, double hi, double *out) {
    char buf[64];
    if (n == 0 || n >= sizeof buf || text[0] == ' ' || text[0] == '+') return -1;
    memcpy(buf, text, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    const double v = strtod(buf, &end);
    if (errno || *end || !isfinite(v) || v > hi || (lo_open ? !(v > lo) : !(v >= lo))) return -1;
    *out = v;
    return 0;
}

/* A whole number in [0, hi], decimal digits only. */
static int parse_count(const char *text, size_t n, long hi, int32_t *out) {
    if (n == 0 || n > 10) return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] < '0' || text[i] > '9') return -1;
        v = v * 10 + (text[i] - '0');
    }
    if (v > hi || (n > 1 && text[0] == '0')) return -1;
    *out = (int32_t)v;
    return 0;
}

static int bad(tg_err *err, const char *path, int line, const char *key, const char *what, const char *v, size_t n) {
    return tg_fail(err, "%s:%d: field '%s': %s ('%.*s')", path, line, key, what, (int)(n > 60 ? 60 : n), v);
}

/* One value v[0..n) of key `key` (index k: scalars first, then groups) into c. */
static int parse_value(int k, const char *key, const char *v, size_t n, const char *path, int line,
                       tg_cost_calibration *c, tg_err *err) {
    switch (k) {
    case 0: /* device */
        if (n == 0 || n >= sizeof c->device) return bad(err, path, line, key, "needs 1 to 31 characters", v, n);
        for (size_t i = 0; i < n; i++)
            if (!((v[i] >= 'a' && v[i] <= 'z') || (v[i] >= '0' && v[i] <= '9') || v[i] == '-'))
                return bad(err, path, line, key, "needs lowercase letters, digits and '-'", v, n);
        memcpy(c->device, v, n), c->device[n] = 0;
        return 0;
    case 1: /* name */
        if (n == 0 || n >= sizeof c->name) return bad(err, path, line, key, "needs 1 to 127 characters", v, n);
        for (size_t i = 0; i < n; i++)
            if (v[i] < 0x20 || v[i] > 0x7e) return bad(err, path, line, key, "needs printable ASCII", v, n);
        memcpy(c->name, v, n), c->name[n] = 0;
        return 0;
    case 2: /* precision */
        for (int p = 0; p < TG_PREC_COUNT; p++)
            if (strlen(tg_precision_name(p)) == n && !memcmp(v, tg_precision_name(p), n)) {
                c->precision = p;
                return 0;
            }
        return bad(err, path, line, key, "needs fp32, bf16 or fp16", v, n);
    case 3:
        return parse_count(v, n, 1024, &c->threads) ? bad(err, path, line, key, "needs a whole number 0 to 1024", v, n)
                                                      : 0;
    case 4:
        return parse_real(v, n, 0, 1, 1e6, &c->peak_tflops)
                   ? bad(err, path, line, key, "needs a number above 0, at most 1e6", v, n) : 0;
    case 5:
        return parse_real(v, n, 0, 1, 1e6, &c->peak_gbps)
                   ? bad(err, path, line, key, "needs a number above 0, at most 1e6", v, n) : 0;
    case 6:
        return parse_real(v, n, 0, 1, 1e6, &c->link_gbps)
                   ? bad(err, path, line, key, "needs a number above 0, at most 1e6", v, n) : 0;
    case 7:
        return parse_real(v, n, 0, 0, 1e6, &c->launch_us)
                   ? bad(err, path, line, key, "needs a number from 0 to 1e6", v, n) : 0;
    case N_SCALARS + TG_GROUP_COUNT:
        return parse_real(v, n, 0, 0, 1e6, &c->matmul_gflop_half)
                   ? bad(err, path, line, key, "needs a number from 0 to 1e6", v, n) : 0;
    case N_SCALARS + TG_GROUP_COUNT + 1:
    case N_SCALARS + TG_GROUP_COUNT + 2: { /* EFF_FORWARD EFF_BACKWARD WORK_HALF CAUSAL_FACTOR SAMPLES */
        tg_cost_attention *a = &c->attention[k - N_SCALARS - TG_GROUP_COUNT - 1];
        const char *word[5];
        size_t len[5];
        int words = 0;
        for (size_t i = 0; i <= n && words <= 5;) {
            const char *sp = memchr(v + i, ' ', n - i);
            const size_t end = sp ? (size_t)(sp - v) : n;
            if (words < 5) word[words] = v + i, len[words] = end - i;
            words++;
            i = end + 1;
        }
        if (words != 5)
            return bad(err, path, line, key, "needs five values: eff_forward eff_backward work_half causal_factor samples",
                       v, n);
        if (parse_real(word[0], len[0], 0, 1, 100, &a->eff_forward))
            return bad(err, path, line, key, "eff_forward needs a number above 0, at most 100", v, n);
        if (parse_real(word[1], len[1], 0, 1, 100, &a->eff_backward))
            return bad(err, path, line, key, "eff_backward needs a number above 0, at most 100", v, n);
        if (parse_real(word[2], len[2], 0, 0, 1e12, &a->work_half))
            return bad(err, path, line, key, "work_half needs a number from 0 to 1e12", v, n);
        if (parse_real(word[3], len[3], 0, 1, 100, &a->causal_factor))
            return bad(err, path, line, key, "causal_factor needs a number above 0, at most 100", v, n);
        int32_t count;
        if (parse_count(word[4], len[4], 1000000000, &count))
            return bad(err, path, line, key, "samples needs a whole number 0 to 1e9", v, n);
        a->samples = count;
        return 0;
    }
    case N_SCALARS + TG_GROUP_COUNT + 3:
        return parse_real(v, n, 0, 0, 1e6, &c->graph_launch_us)
                   ? bad(err, path, line, key, "needs a number from 0 to 1e6", v, n) : 0;
    case N_SCALARS + TG_GROUP_COUNT + 4:
        return parse_real(v, n, 0, 0, 1, &c->update_overlap)
                   ? bad(err, path, line, key, "needs a number from 0 to 1", v, n) : 0;
    default: { /* group.NAME = EFF_FLOPS EFF_BW SAMPLES */
        const int g = k - N_SCALARS;
        const char *sp1 = memchr(v, ' ', n);
        const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - v)) : NULL;
        if (!sp2 || memchr(sp2 + 1, ' ', n - (size_t)(sp2 + 1 - v)))
            return bad(err, path, line, key, "needs three values: eff_flops eff_bw samples", v, n);
        if (parse_real(v, (size_t)(sp1 - v), 0, 1, 100, &c->eff_flops[g]))
            return bad(err, path, line, key, "eff_flops needs a number above 0, at most 100", v, n);
        if (parse_real(sp1 + 1, (size_t)(sp2 - sp1 - 1), 0, 1, 100, &c->eff_bw[g]))
            return bad(err, path, line, key, "eff_bw needs a number above 0, at most 100", v, n);
        if (parse_count(sp2 + 1, n - (size_t)(sp2 + 1 - v), 1000000000, &c->samples[g]))
            return bad(err, path, line, key, "samples needs a whole number 0 to 1e9", v, n);
        return 0;
    }
    }
}

int tg_cost_calibration_parse(const char *text, size_t len, const char *path, tg_cost_calibration *c, tg_err *err) {
    memset(c, 0, sizeof *c);
    int n_keys = N_SCALARS + TG_GROUP_COUNT + N_TAIL; /* version 1: no tail */
    size_t at = 0;
    for (int line = 1; line <= 1 + n_keys; line++) {
        if (at >= len)
            return tg_fail(err, "%s:%d: the file ends here; %s expected", path, line,
                           line == 1 ? "the header '" TG_COST_CALIBRATION_HEADER "'" : "more fields");
        const char *nl = memchr(text + at, '\n', len - at);
        if (!nl) return tg_fail(err, "%s:%d: the line has no newline at its end", path, line);
        const char *s = text + at;
        const size_t n = (size_t)(nl - s);
        at += n + 1;
        if (line == 1) {
            const int v1 = n == strlen(TG_COST_CALIBRATION_HEADER_V1) && !memcmp(s, TG_COST_CALIBRATION_HEADER_V1, n);
            if (!v1 && (n != strlen(TG_COST_CALIBRATION_HEADER) || memcmp(s, TG_COST_CALIBRATION_HEADER, n)))
                return tg_fail(err, "%s:1: not a cost calibration file (the first line must be '%s')", path,
                               TG_COST_CALIBRATION_HEADER);
            if (v1) n_keys = N_SCALARS + TG_GROUP_COUNT;
            continue;
        }
        const int k = line - 2;
        char key[64];
        if (k < N_SCALARS) snprintf(key, sizeof key, "%s", scalar_keys[k]);
        else if (k < N_SCALARS + TG_GROUP_COUNT) snprintf(key, sizeof key, "group.%s", group_keys[k - N_SCALARS]);
        else snprintf(key, sizeof key, "%s", tail_keys[k - N_SCALARS - TG_GROUP_COUNT]);
        const size_t kn = strlen(key);
        if (n < kn + 3 || memcmp(s, key, kn) || memcmp(s + kn, " = ", 3)) {
            const char *eq = memchr(s, '=', n);
            size_t shown = eq ? (size_t)(eq - s) : n;
            while (shown && s[shown - 1] == ' ') shown--;
            return tg_fail(err, "%s:%d: field '%s' expected here (the fields come in a fixed order), found '%.*s'", path,
                           line, key, (int)(shown > 60 ? 60 : shown), s);
        }
        if (parse_value(k, key, s + kn + 3, n - kn - 3, path, line, c, err)) return -1;
    }
    if (at != len) return tg_fail(err, "%s:%d: text after the last field", path, 2 + n_keys);
    if (n_keys == N_SCALARS + TG_GROUP_COUNT) { /* version 1: what its model was */
        for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++)
            c->attention[b] = (tg_cost_attention){c->eff_flops[TG_GROUP_ATTENTION], c->eff_flops[TG_GROUP_ATTENTION], 0, 1,
                                                  c->samples[TG_GROUP_ATTENTION]};
        c->graph_launch_us = c->launch_us, c->update_overlap = 1;
    }
    return 0;
}

int tg_cost_calibration_format(const tg_cost_calibration *c, char **text, size_t *len, tg_err *err) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return tg_fail(err, "out of memory for the cost calibration's text");
    fprintf(f, "%s\ndevice = %s\nname = %s\nprecision = %s\nthreads = %d\n", TG_COST_CALIBRATION_HEADER, c->device,
            c->name, tg_precision_name(c->precision), c->threads);
    fprintf(f, "peak_tflops = %.17g\npeak_gbps = %.17g\nlink_gbps = %.17g\nlaunch_us = %.17g\n", c->peak_tflops,
            c->peak_gbps, c->link_gbps, c->launch_us);
    for (int g = 0; g < TG_GROUP_COUNT; g++)
        fprintf(f, "group.%s = %.17g %.17g %d\n", group_keys[g], c->eff_flops[g], c->eff_bw[g], c->samples[g]);
    fprintf(f, "matmul_gflop_half = %.17g\n", c->matmul_gflop_half);
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++)
        fprintf(f, "%s = %.17g %.17g %.17g %.17g %d\n", tail_keys[1 + b], c->attention[b].eff_forward,
                c->attention[b].eff_backward, c->attention[b].work_half, c->attention[b].causal_factor,
                c->attention[b].samples);
    fprintf(f, "graph_launch_us = %.17g\nupdate_overlap = %.17g\n", c->graph_launch_us, c->update_overlap);
    if (fclose(f) || !buf) {
        free(buf);
        return tg_fail(err, "out of memory for the cost calibration's text");
    }
    *text = buf, *len = n;
    return 0;
}

int tg_cost_calibration_read(const char *path, tg_cost_calibration *c, tg_err *err) {
    char *text;
    size_t len;
    if (tg_read_text_file(path, TG_COST_CALIBRATION_MAX_BYTES, "a cost calibration file", &text, &len, err)) return -1;
    const int rc = tg_cost_calibration_parse(text, len, path, c, err);
    free(text);
    return rc;
}

int tg_cost_calibration_write(const char *path, const tg_cost_calibration *c, tg_err *err) {
    char *text;
    size_t len;
    if (tg_cost_calibration_format(c, &text, &len, err)) return -1;
    /* The folder first (mkdir -p), as the GEMM cache does. */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *s = dir + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                const int e = errno;
                free(text);
                return tg_fail(err, "%s: cannot make the folder %s: %s", path, dir, strerror(e));
            }
            *s = '/';
        }
    tg_chunk chunk = {text, len};
    const int rc = tg_write_file_atomic(path, &chunk, 1, "cost calibration", err);
    free(text);
    return rc;
}

int tg_cost_calibration_path(const char *key, int threads, char *path, size_t len) {
    char dir[600];
    const char *env = getenv("TUNEGRAPH_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (env && env[0]) snprintf(dir, sizeof dir, "%s", env);
    else if (xdg && xdg[0]) snprintf(dir, sizeof dir, "%s/tunegraph", xdg);
    else if (home && home[0]) snprintf(dir, sizeof dir, "%s/.cache/tunegraph", home);
    else return -1;
    const int n = !strcmp(key, "cpu") ? snprintf(path, len, "%s/cost-cpu-threads%d.txt", dir, threads)
                                      : snprintf(path, len, "%s/cost-%s.txt", dir, key);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

void tg_cost_calibration_of_device(const tg_cost_device *d, int precision, const int samples[TG_GROUP_COUNT],
                                   tg_cost_calibration *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->device, sizeof c->device, "%s", d->key);
    snprintf(c->name, sizeof c->name, "%s", d->name);
    c->precision = precision;
    c->threads = d->cpu ? d->threads : 0;
    c->peak_tflops = d->peak_flops / 1e12, c->peak_gbps = d->peak_bw / 1e9, c->link_gbps = d->link_bw / 1e9;
    c->launch_us = d->launch_s * 1e6;
    for (int g = 0; g < TG_GROUP_COUNT; g++)
        c->eff_flops[g] = d->eff_flops[g], c->eff_bw[g] = d->eff_bw[g], c->samples[g] = samples[g];
    c->matmul_gflop_half = d->matmul_flops_half / 1e9;
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++) c->attention[b] = d->attention[b];
    c->graph_launch_us = d->graph_launch_s * 1e6;
    c->update_overlap = d->update_overlap;
}

int tg_cost_device_apply(tg_cost_device *d, const tg_cost_calibration *c, tg_err *err) {
    if (strcmp(d->key, c->device))
        return tg_fail(err, "the calibration is for device '%s', not '%s'", c->device, d->key);
    snprintf(d->name, sizeof d->name, "%s", c->name);
    d->launch_s = c->launch_us * 1e-6;
    for (int g = 0; g < TG_GROUP_COUNT; g++) d->eff_flops[g] = c->eff_flops[g], d->eff_bw[g] = c->eff_bw[g];
    d->matmul_flops_half = c->matmul_gflop_half * 1e9;
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++) d->attention[b] = c->attention[b];
    d->graph_launch_s = c->graph_launch_us * 1e-6, d->update_overlap = c->update_overlap;
    if (d->cpu) {
        d->peak_flops = c->peak_tflops * 1e12, d->peak_bw = c->peak_gbps * 1e9, d->link_bw = c->link_gbps * 1e9;
        d->threads = c->threads;
    }
    d->calibrated = 1;
    return 0;
}
