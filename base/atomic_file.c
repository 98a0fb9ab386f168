#include "base/atomic_file.h"
#include "base/alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/output_paths.h"

/* ---- the registry of temporary files ------------------------------------------------
 * A fixed table that a signal handler can walk: a slot is claimed (FREE -> FILLING),
 * filled, then published (LIVE). Its owner takes it back (LIVE -> FREE) after the rename
 * or removal; a handler takes it for good (LIVE -> REMOVING) before unlinking, so the two
 * never both use its folder descriptor. More slots than files a process writes at once
 * (the metrics, saved weights, a GEMM cache per data-parallel replica). */
#define TEMP_SLOTS 256
enum { SLOT_FREE, SLOT_FILLING, SLOT_LIVE, SLOT_REMOVING };

static struct temp_slot {
    atomic_int state;
    int dir_fd;
    char name[NAME_MAX + 1];
} g_slots[TEMP_SLOTS];

static atomic_uint g_temp_serial;

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the signal handler needs lock-free atomics");

static int slot_claim(int dir_fd, const char *name) {
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int expected = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&g_slots[i].state, &expected, SLOT_FILLING)) continue;
        g_slots[i].dir_fd = dir_fd;
        snprintf(g_slots[i].name, sizeof g_slots[i].name, "%s", name);
        atomic_store(&g_slots[i].state, SLOT_LIVE);
        return i;
    }
    return -1;
}

/* 0, or -1 when a handler has taken the slot (the process is ending; its folder
 * descriptor must stay open). */
static int slot_release(int i) {
    int expected = SLOT_LIVE;
    return atomic_compare_exchange_strong(&g_slots[i].state, &expected, SLOT_FREE) ? 0 : -1;
}

void tg_atomic_remove_temps(void) {
    for (int i = 0; i < TEMP_SLOTS; i++) {
        int expected = SLOT_LIVE;
        if (atomic_compare_exchange_strong(&g_slots[i].state, &expected, SLOT_REMOVING))
            (void)unlinkat(g_slots[i].dir_fd, g_slots[i].name, 0);
    }
}

/* ---- writing -------------------------------------------------------------------------- */

struct tg_atomic_file {
    char *path;        /* as the caller named it, for messages */
    const char *kind;
    int fd;
    FILE *stream;      /* on fd, when asked for */
    int direct;        /* a device or FIFO: written in place */
    int dir_fd;        /* the target's folder (not direct) */
    char *target_name; /* the target's name in that folder */
    int slot;          /* the temporary file's registry slot */
};

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue; /* GCOVR_EXCL_BR_LINE: only a signal handler installed without SA_RESTART interrupts it */
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void release(tg_atomic_file *f) {
    if (!f->direct && f->slot >= 0 && slot_release(f->slot) != 0) f->dir_fd = -1; /* a handler uses it */
    if (f->dir_fd >= 0) close(f->dir_fd);
    free(f->target_name);
    free(f->path);
    free(f);
}

/* The temporary name for `target` in its folder: as much of the target's name as fits
 * the system's name limit, then ".tmp.<pid>.<n>". */
static void temp_name(const char *target, char out[NAME_MAX + 1]) {
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".tmp.%ld.%u", (long)getpid(), atomic_fetch_add(&g_temp_serial, 1));
    const size_t keep = strlen(target) < NAME_MAX - strlen(suffix) ? strlen(target) : NAME_MAX - strlen(suffix);
    snprintf(out, NAME_MAX + 1, "%.*s%s", (int)keep, target, suffix);
}

/* Creates and registers the temporary file beside the target; 0, or an errno value. */
static int create_temp(tg_atomic_file *f, mode_t mode) {
    for (int attempt = 0; attempt < 100; attempt++) {
        char name[NAME_MAX + 1];
        temp_name(f->target_name, name);
        /* Registered before it exists: a signal in between finds nothing to remove. */
        f->slot = slot_claim(f->dir_fd, name);
        if (f->slot < 0) return EMFILE;
        f->fd = openat(f->dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (f->fd >= 0) return 0;
        const int e = errno;
        slot_release(f->slot);
        f->slot = -1;
        if (e != EEXIST) return e; /* EEXIST: left by an earlier process of the same id */
    }
    return EEXIST;
}

int tg_atomic_begin(const char *path, const char *kind, tg_atomic_file **out, tg_err *err) {
    *out = NULL;
    tg_atomic_file *f = tg_calloc(1, sizeof *f);
    if (!f || !(f->path = tg_strdup(path))) {
        free(f);
        return tg_fail(err, "%s: out of memory", path);
    }
    f->kind = kind, f->fd = -1, f->dir_fd = -1, f->slot = -1;
    struct stat st;
    int e = 0;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        f->direct = 1;
        f->fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY);
        if (f->fd < 0) e = errno;
    } else {
        char *target = NULL;
        e = tg_output_resolve(path, &target);
        char *slash = target ? strrchr(target, '/') : NULL;
        if (slash) {
            *slash = 0;
            f->dir_fd = open(slash == target ? "/" : target, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (f->dir_fd < 0) e = errno;
            else if (!(f->target_name = tg_strdup(slash + 1))) e = ENOMEM;
        }
        free(target);
        /* The replacement keeps the mode of the file it replaces. */
        const int replaces = !e && fstatat(f->dir_fd, f->target_name, &st, 0) == 0 && S_ISREG(st.st_mode);
        const mode_t mode = replaces ? st.st_mode & 07777 : 0644;
        if (!e) e = create_temp(f, mode);
        if (!e && replaces) (void)fchmod(f->fd, mode); /* openat applied the umask */
    }
    if (e) {
        release(f);
        return tg_fail(err, "%s: cannot create the %s: %s", path, kind,
                       e == EMFILE ? "too many files being written at once" : strerror(e));
    }
    *out = f;
    return 0;
}

int tg_atomic_fd(const tg_atomic_file *f) { return f->fd; }

FILE *tg_atomic_stream(tg_atomic_file *f) {
    if (!f->stream) f->stream = fdopen(f->fd, "w");
    return f->stream;
}

/* Closes the file (stream or descriptor); the step that failed, with errno, or NULL. */
static const char *close_file(tg_atomic_file *f, int sync, int *e) {
    const char *step = NULL;
    if (f->stream && fflush(f->stream)) step = "write", *e = errno;
    /* GCOVR_EXCL_BR_START: fsync and close fail only on the device's I/O errors, which no test can cause */
    if (!step && sync && fsync(f->fd)) step = "fsync", *e = errno;
    const int closed = f->stream ? fclose(f->stream) : close(f->fd);
    if (closed && !step) step = "close", *e = errno;
    /* GCOVR_EXCL_BR_STOP */
    f->stream = NULL, f->fd = -1;
    return step;
}

int tg_atomic_commit(tg_atomic_file *f, tg_err *err) {
    int e = 0;
    const char *step = close_file(f, !f->direct, &e);
    if (!f->direct) {
        const char *tmp = g_slots[f->slot].name;
        if (!step && renameat(f->dir_fd, tmp, f->dir_fd, f->target_name)) step = "rename", e = errno;
        if (step) unlinkat(f->dir_fd, tmp, 0);
        else (void)fsync(f->dir_fd); /* makes the rename durable; its failure loses nothing written */
    }
    if (step) tg_fail(err, "%s: cannot write the %s (%s: %s)", f->path, f->kind, step, strerror(e));
    release(f);
    return step ? -1 : 0;
}

void tg_atomic_discard(tg_atomic_file *f) {
    int e;
    (void)close_file(f, 0, &e);
    if (!f->direct) unlinkat(f->dir_fd, g_slots[f->slot].name, 0);
    release(f);
}

int tg_write_file_atomic(const char *path, const tg_chunk *chunks, int n_chunks, const char *kind, tg_err *err) {
    tg_atomic_file *f;
    if (tg_atomic_begin(path, kind, &f, err)) return -1;
    for (int i = 0; i < n_chunks; i++)
        if (chunks[i].len && write_all(f->fd, chunks[i].data, chunks[i].len)) {
            const int e = errno;
            tg_atomic_discard(f);
            return tg_fail(err, "%s: cannot write the %s (write: %s)", path, kind, strerror(e));
        }
    return tg_atomic_commit(f, err);
}
