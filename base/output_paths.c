#include "base/output_paths.h"
#include "base/alloc.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The kernel follows at most 40 links in a path; so does this. */
#define MAX_LINK_HOPS 40

/* "dir" and "base" of a path, malloc'd ("." for a bare name, "/" for the root). */
static int split(const char *path, char **dir, const char **base) {
    const char *slash = strrchr(path, '/');
    *base = slash ? slash + 1 : path;
    *dir = !slash ? tg_strdup(".") : slash == path ? tg_strdup("/") : tg_strndup(path, (size_t)(slash - path));
    return *dir ? 0 : ENOMEM;
}

/* dir "/" base, malloc'd; NULL when out of memory. */
static char *join(const char *dir, const char *base) {
    size_t d = strlen(dir), b = strlen(base);
    int root = !strcmp(dir, "/"); /* dir is absolute: the root is its only one-byte form */
    char *s = tg_malloc(d + b + 2);
    if (s) snprintf(s, d + b + 2, "%s%s%s", root ? "" : dir, "/", base);
    return s;
}

/* The text of a symlink, malloc'd; NULL with errno set. Links under /proc report size 0. */
static char *read_link(const char *path, size_t size_hint) {
    for (size_t cap = size_hint + 1 > 256 ? size_hint + 1 : 256;; cap *= 2) {
        char *s = tg_malloc(cap);
        if (!s) { /* errno says so: the caller returns it (a refused allocation sets none) */
            errno = ENOMEM;
            return NULL;
        }
        ssize_t n = readlink(path, s, cap);
        if (n < 0) { /* GCOVR_EXCL_BR_LINE: lstat has just seen the link; only its removal in between fails this */
            free(s);
            return NULL;
        }
        if ((size_t)n < cap) {
            s[n] = 0;
            return s;
        }
        free(s);
        if (cap > PATH_MAX) { /* GCOVR_EXCL_BR_LINE: link texts are shorter than PATH_MAX (symlink(2) refuses longer) */
            errno = ENAMETOOLONG;
            return NULL;
        }
    }
}

int tg_output_resolve(const char *path, char **out) {
    *out = NULL;
    if (!path[0]) return ENOENT;
    if (strlen(path) >= PATH_MAX) return ENAMETOOLONG;
    char *cur = tg_strdup(path);
    if (!cur) return ENOMEM;
    for (int hops = 0;; hops++) {
        char *dir;
        const char *base;
        int e = split(cur, &dir, &base);
        if (e) break;
        if (!base[0] || !strcmp(base, ".") || !strcmp(base, "..")) {
            free(dir), free(cur);
            return EISDIR;
        }
        char *real_dir = realpath(dir, NULL);
        e = errno;
        free(dir);
        if (!real_dir) {
            free(cur);
            return e;
        }
        char *abs = join(real_dir, base);
        if (!abs || strlen(abs) >= PATH_MAX) {
            int why = abs ? ENAMETOOLONG : ENOMEM;
            free(abs), free(real_dir), free(cur);
            return why;
        }
        struct stat st;
        const int missing = lstat(abs, &st) != 0;
        if (missing && errno != ENOENT) {
            e = errno;
            free(abs), free(real_dir), free(cur);
            return e;
        }
        if (missing || !S_ISLNK(st.st_mode)) {
            free(real_dir), free(cur);
            *out = abs;
            return 0;
        }
        /* A symlink: the write lands on what it points at (relative to its folder). */
        if (hops == MAX_LINK_HOPS) {
            free(abs), free(real_dir), free(cur);
            return ELOOP;
        }
        char *link = read_link(abs, (size_t)st.st_size);
        e = errno;
        free(abs), free(cur);
        if (!link) {
            free(real_dir);
            return e;
        }
        cur = link[0] == '/' ? link : join(real_dir, link);
        if (cur != link) free(link);
        free(real_dir);
        if (!cur) return ENOMEM;
        if (strlen(cur) >= PATH_MAX) {
            free(cur);
            return ENAMETOOLONG;
        }
    }
    free(cur);
    return ENOMEM;
}

/* A path as messages show it: long ones keep their start and end. */
typedef struct shown_path {
    char text[200];
} shown_path;

static shown_path show(const char *path) {
    shown_path s;
    size_t n = strlen(path);
    if (n < sizeof s.text) snprintf(s.text, sizeof s.text, "%s", path);
    else snprintf(s.text, sizeof s.text, "%.80s...%s (%zu bytes)", path, path + n - 80, n);
    return s;
}

/* What identifies a file: its device and inode where it exists, its resolved name. */
typedef struct file_id {
    int exists, chr;
    dev_t dev;
    ino_t ino;
    char *resolved; /* NULL when it could not be resolved */
} file_id;

static void identify(const char *path, file_id *id) {
    struct stat st;
    memset(id, 0, sizeof *id);
    if (stat(path, &st) == 0) id->exists = 1, id->chr = S_ISCHR(st.st_mode), id->dev = st.st_dev, id->ino = st.st_ino;
    if (tg_output_resolve(path, &id->resolved)) id->resolved = NULL;
}

static int same_file(const file_id *a, const file_id *b) {
    if (a->chr || b->chr) return 0;
    if (a->exists && b->exists) return a->dev == b->dev && a->ino == b->ino;
    return a->resolved && b->resolved && !strcmp(a->resolved, b->resolved);
}

static int name_too_long(const tg_named_path *o, tg_err *err) {
    return tg_fail(err, "%s %s: the path is longer than the system accepts (%d bytes at most, %d for each name in it)",
                   o->what, show(o->path).text, PATH_MAX - 1, NAME_MAX);
}

/* The checks on one output alone; fills *id. */
static int check_output(const tg_named_path *o, file_id *id, tg_err *err) {
    const char *p = o->path;
    memset(id, 0, sizeof *id);
    if (!p || !p[0]) return tg_fail(err, "%s: the path is empty", o->what);
    if (strlen(p) >= PATH_MAX) return name_too_long(o, err);
    struct stat st;
    if (stat(p, &st) == 0) {
        id->exists = 1, id->chr = S_ISCHR(st.st_mode), id->dev = st.st_dev, id->ino = st.st_ino;
        if (S_ISDIR(st.st_mode)) return tg_fail(err, "%s %s: is a folder; name a file", o->what, show(p).text);
        if (S_ISSOCK(st.st_mode)) return tg_fail(err, "%s %s: is a socket; name a file", o->what, show(p).text);
        if (!S_ISREG(st.st_mode)) { /* a device or FIFO, written directly */
            if (access(p, W_OK) != 0)
                return tg_fail(err, "%s %s: cannot be written: %s", o->what, show(p).text, strerror(errno));
            return 0;
        }
    } else if (errno == ENAMETOOLONG) {
        return name_too_long(o, err);
    } else if (errno != ENOENT) {
        return tg_fail(err, "%s %s: %s", o->what, show(p).text, strerror(errno));
    }
    int e = tg_output_resolve(p, &id->resolved);
    if (e == ENAMETOOLONG) return name_too_long(o, err);
    if (e == EISDIR) return tg_fail(err, "%s %s: names a folder; name a file", o->what, show(p).text);
    if (e == ENOENT || e == ENOTDIR) { /* GCOVR_EXCL_BR_LINE: ENOTDIR: stat(p) above follows the same links and meets a non-folder first, failing with ENOTDIR there */
        char *dir;
        const char *base;
        if (split(p, &dir, &base)) return tg_fail(err, "%s %s: out of memory", o->what, show(p).text);
        /* Its own folder there: p is a dangling link, whose target's folder is missing. */
        struct stat dir_st;
        if (stat(dir, &dir_st) == 0)
            tg_fail(err, "%s %s: is a link into a folder that does not exist", o->what, show(p).text);
        else tg_fail(err, "%s %s: the folder %s does not exist", o->what, show(p).text, show(dir).text);
        free(dir);
        return -1;
    }
    if (e) return tg_fail(err, "%s %s: %s", o->what, show(p).text, strerror(e));
    /* The resolved name's folder is where the temporary file and the rename happen. */
    char *dir;
    const char *base;
    if (split(id->resolved, &dir, &base)) return tg_fail(err, "%s %s: out of memory", o->what, show(p).text);
    int rc = 0;
    if (access(dir, W_OK | X_OK) != 0)
        rc = tg_fail(err, "%s %s: cannot create files in the folder %s: %s", o->what, show(p).text, show(dir).text,
                     strerror(errno));
    free(dir);
    return rc;
}

int tg_outputs_check(const tg_named_path *outputs, int n_outputs, const tg_named_path *inputs, int n_inputs,
                     tg_err *err) {
    file_id *out_id = tg_calloc((size_t)n_outputs + 1, sizeof *out_id);
    file_id *in_id = tg_calloc((size_t)n_inputs + 1, sizeof *in_id);
    int rc = out_id && in_id ? 0 : tg_fail(err, "out of memory checking %d output and %d input paths", n_outputs, n_inputs);
    for (int o = 0; o < n_outputs && !rc; o++) rc = check_output(&outputs[o], &out_id[o], err);
    for (int i = 0; i < n_inputs && !rc; i++)
        if (inputs[i].path && inputs[i].path[0]) identify(inputs[i].path, &in_id[i]);
    for (int o = 0; o < n_outputs && !rc; o++) {
        const tg_named_path *a = &outputs[o];
        for (int i = 0; i < n_inputs && !rc; i++)
            if (inputs[i].path && inputs[i].path[0] && same_file(&out_id[o], &in_id[i]))
                rc = tg_fail(err, "%s %s: would overwrite the %s %s (the same file)", a->what, show(a->path).text,
                             inputs[i].what, show(inputs[i].path).text);
        for (int k = 0; k < o && !rc; k++)
            if (same_file(&out_id[o], &out_id[k]))
                rc = tg_fail(err, "%s %s and %s %s are the same file: each output needs a file of its own",
                             outputs[k].what, show(outputs[k].path).text, a->what, show(a->path).text);
    }
    for (int o = 0; out_id && o < n_outputs; o++) free(out_id[o].resolved);
    for (int i = 0; in_id && i < n_inputs; i++) free(in_id[i].resolved);
    free(out_id);
    free(in_id);
    return rc;
}
