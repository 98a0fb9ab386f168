#include <stddef.h>

#include "runtime/thread_cpu.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first field of /proc/self/task/TID/schedstat is the thread's time on a CPU in ns
 * (finer than stat's clock ticks, which count 10 ms at a time). A thread that exits
 * between the listing and the reads is left out (or keeps no name). */
static int read_thread(const char *task_dir, int tid, char *name, size_t name_len, double *cpu_s) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%d/schedstat", task_dir, tid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    unsigned long long ns = 0;
    int ok = fscanf(f, "%llu", &ns) == 1;
    fclose(f);
    if (!ok) return -1;
    *cpu_s = (double)ns / 1e9;
    snprintf(path, sizeof path, "%s/%d/comm", task_dir, tid);
    name[0] = 0;
    if ((f = fopen(path, "r"))) {
        if (fgets(name, (int)name_len, f)) name[strcspn(name, "\n")] = 0;
        fclose(f);
    }
    return 0;
}

int tg_thread_cpu_snapshot(tg_thread_cpu *snap) { return tg_thread_cpu_snapshot_of(snap, "/proc/self/task"); }

int tg_thread_cpu_snapshot_of(tg_thread_cpu *snap, const char *task_dir) {
    memset(snap, 0, sizeof *snap);
    DIR *d = opendir(task_dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) && snap->n < TG_THREAD_CPU_MAX) {
        int tid = atoi(e->d_name);
        if (tid <= 0) continue;
        int k = snap->n;
        if (read_thread(task_dir, tid, snap->thread[k].name, sizeof snap->thread[k].name, &snap->thread[k].cpu_s) == 0) {
            snap->thread[k].tid = tid;
            snap->n++;
        }
    }
    closedir(d);
    return 0;
}

double tg_thread_cpu_named(const tg_thread_cpu *before, const tg_thread_cpu *after, const char *prefix) {
    double total = 0;
    for (int i = 0; i < after->n; i++) {
        if (strncmp(after->thread[i].name, prefix, strlen(prefix))) continue;
        total += after->thread[i].cpu_s;
        for (int j = 0; j < before->n; j++)
            if (before->thread[j].tid == after->thread[i].tid) total -= before->thread[j].cpu_s;
    }
    return total;
}

void tg_thread_cpu_report(const tg_thread_cpu *before, const tg_thread_cpu *after, double per, char *buf,
                          size_t len) {
    double delta[TG_THREAD_CPU_MAX];
    int order[TG_THREAD_CPU_MAX];
    for (int i = 0; i < after->n; i++) {
        delta[i] = after->thread[i].cpu_s;
        for (int j = 0; j < before->n; j++)
            if (before->thread[j].tid == after->thread[i].tid) delta[i] -= before->thread[j].cpu_s;
        order[i] = i;
    }
    for (int i = 1; i < after->n; i++) /* busiest first */
        for (int j = i; j > 0 && delta[order[j]] > delta[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < after->n && n < len; i++) {
        const int k = order[i];
        n += (size_t)snprintf(buf + n, len - n, "%s%s %d: %.1f us", i ? ", " : "", after->thread[k].name,
                              after->thread[k].tid, delta[k] / per * 1e6);
    }
}
