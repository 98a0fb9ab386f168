/* Clocks for timings and reports: seconds of the monotonic wall clock, of this process's
 * CPU time (all threads, the CUDA driver's included) and of the calling thread's. */
#ifndef TUNEGRAPH_CLOCK_H
#define TUNEGRAPH_CLOCK_H

#include <time.h>

static inline double tg_clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static inline double tg_wall_s(void) { return tg_clock_s(CLOCK_MONOTONIC); }
static inline double tg_wall_ms(void) { return 1e3 * tg_clock_s(CLOCK_MONOTONIC); }
static inline double tg_process_cpu_s(void) { return tg_clock_s(CLOCK_PROCESS_CPUTIME_ID); }
static inline double tg_thread_cpu_s(void) { return tg_clock_s(CLOCK_THREAD_CPUTIME_ID); }

#endif
