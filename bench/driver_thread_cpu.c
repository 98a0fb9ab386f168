/* How much CPU the CUDA driver's event thread ("cuda-EvtHandlr") takes in a process that
 * holds a CUDA context and does nothing else: the floor under any CUDA program's host CPU,
 * which tunegraph's run summary reports apart from its own.
 * usage: driver_thread_cpu [seconds]   (prints us of CPU per ms of wall time, per flag) */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/clock.h"
#include "runtime/thread_cpu.h"

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    /* The scheduling flag tunegraph sets; the thread's rate was the same under every flag. */
    cudaError_t e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    if (e == cudaSuccess) e = cudaFree(0); /* creates the context, and with it the thread */
    if (e != cudaSuccess) {
        fprintf(stderr, "driver_thread_cpu: creating a CUDA context failed: %s\n", cudaGetErrorString(e));
        return 1;
    }
    tg_thread_cpu before, after;
    if (tg_thread_cpu_snapshot(&before)) {
        fprintf(stderr, "driver_thread_cpu: /proc/self/task is not readable\n");
        return 1;
    }
    const double t0 = tg_wall_s();
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    const double wall = tg_wall_s() - t0;
    if (tg_thread_cpu_snapshot(&after)) return 1;
    const double driver = tg_thread_cpu_named(&before, &after, "cuda-EvtHandlr");
    printf("{\"idle_s\": %.3f, \"driver_event_thread_cpu_us_per_ms\": %.3f}\n", wall,
           driver * 1e6 / (wall * 1e3));
    return 0;
}
