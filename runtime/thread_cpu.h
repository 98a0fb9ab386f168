/* CPU time of every thread of this process, by name (Linux: /proc/self/task), so a host
 * trace can say which thread spends what: the training loop's, the CUDA driver's. */
#ifndef TUNEGRAPH_THREAD_CPU_H
#define TUNEGRAPH_THREAD_CPU_H

#define TG_THREAD_CPU_MAX 64

typedef struct tg_thread_cpu {
    int n;
    struct {
        int tid;
        char name[32];
        double cpu_s; /* on-CPU time so far */
    } thread[TG_THREAD_CPU_MAX];
} tg_thread_cpu;

/* Reads every thread's CPU time; 0, or -1 where /proc cannot say. */
int tg_thread_cpu_snapshot(tg_thread_cpu *snap);
/* The same from a directory laid out as /proc/self/task (TID/schedstat, TID/comm): entries
 * that are no thread id, or whose schedstat is missing or holds no number, are left out. */
int tg_thread_cpu_snapshot_of(tg_thread_cpu *snap, const char *task_dir);

/* CPU seconds between two snapshots of the threads whose names start with `prefix` (the
 * CUDA driver's event thread: "cuda-EvtHandlr"). */
double tg_thread_cpu_named(const tg_thread_cpu *before, const tg_thread_cpu *after, const char *prefix);

/* Writes "name tid: X us" for each thread's CPU time between two snapshots divided by
 * `per` (e.g. steps), busiest first, into buf. */
void tg_thread_cpu_report(const tg_thread_cpu *before, const tg_thread_cpu *after, double per, char *buf,
                          size_t len);

#endif
