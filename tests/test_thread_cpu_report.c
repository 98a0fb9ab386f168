/* Per-thread CPU time (runtime/thread_cpu.c): a snapshot finds a named busy thread with
 * its CPU time and keeps to TG_THREAD_CPU_MAX threads; the differences between two
 * snapshots by name prefix, and the report, busiest first, cut to its buffer. */
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/thread_cpu.h"
#include "tests/harness.h"

static void set(tg_thread_cpu *s, int i, int tid, const char *name, double cpu_s) {
    s->thread[i].tid = tid;
    snprintf(s->thread[i].name, sizeof s->thread[i].name, "%s", name);
    s->thread[i].cpu_s = cpu_s;
    if (s->n <= i) s->n = i + 1;
}

TG_TEST(test_thread_cpu_named_and_report) {
    tg_thread_cpu before = {0}, after = {0};
    set(&before, 0, 10, "main", 1.0);
    set(&before, 1, 11, "cuda-EvtHandlr", 2.0);
    set(&before, 2, 13, "gone", 9.0); /* exited since: in no sum */
    set(&after, 0, 11, "cuda-EvtHandlr", 4.0);
    set(&after, 1, 10, "main", 1.5);
    set(&after, 2, 12, "cuda-EvtHandlr", 0.25); /* new since: all its time counts */
    set(&after, 3, 14, "idle", 1.0);
    set(&before, 3, 14, "idle", 1.0);
    CHECK(tg_thread_cpu_named(&before, &after, "cuda-EvtHandlr") == 2.25, "driver threads: %g, want 2.25",
          tg_thread_cpu_named(&before, &after, "cuda-EvtHandlr"));
    CHECK(tg_thread_cpu_named(&before, &after, "cuda") == 2.25, "prefix 'cuda': %g", tg_thread_cpu_named(&before, &after, "cuda"));
    CHECK(tg_thread_cpu_named(&before, &after, "main") == 0.5, "main: %g, want 0.5", tg_thread_cpu_named(&before, &after, "main"));
    CHECK(tg_thread_cpu_named(&before, &after, "nothing") == 0.0, "no such thread counted");

    char buf[256];
    tg_thread_cpu_report(&before, &after, 2.0, buf, sizeof buf);
    const char *want = "cuda-EvtHandlr 11: 1000000.0 us, main 10: 250000.0 us, cuda-EvtHandlr 12: 125000.0 us, "
                       "idle 14: 0.0 us";
    CHECK(strcmp(buf, want) == 0, "report:\n  %s\nwant\n  %s", buf, want);
    /* A short buffer holds what fits, terminated, and the loop stops there. */
    char small[24];
    memset(small, 'x', sizeof small);
    tg_thread_cpu_report(&before, &after, 2.0, small, 20);
    CHECK(strcmp(small, "cuda-EvtHandlr 11: ") == 0 && small[20] == 'x', "cut report: '%.20s'", small);
    /* The busiest last: it moves all the way to the front. */
    tg_thread_cpu b2 = {0}, a2 = {0};
    set(&a2, 0, 1, "one", 0.001);
    set(&a2, 1, 2, "two", 0.002);
    set(&a2, 2, 3, "three", 0.004);
    tg_thread_cpu_report(&b2, &a2, 1.0, buf, sizeof buf);
    CHECK(strcmp(buf, "three 3: 4000.0 us, two 2: 2000.0 us, one 1: 1000.0 us") == 0, "ascending: %s", buf);
    /* No threads: an empty report. */
    tg_thread_cpu none = {0};
    buf[0] = 'x';
    tg_thread_cpu_report(&none, &none, 1.0, buf, sizeof buf);
    CHECK(buf[0] == 0, "empty report: '%s'", buf);
}

static volatile int spin_stop;

static void *spin_main(void *arg) {
    pthread_setname_np(pthread_self(), "tg-spin");
    int *tid = arg;
    *tid = gettid();
    while (!spin_stop) {
    }
    return NULL;
}

static void *sleeper_main(void *arg) {
    while (!spin_stop) usleep(1000);
    return NULL;
}

TG_TEST(test_thread_cpu_snapshot_finds_threads) {
    tg_thread_cpu before, after;
    REQUIRE(tg_thread_cpu_snapshot(&before) == 0, "snapshot");
    spin_stop = 0;
    int tid = 0;
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, spin_main, &tid) == 0, "thread");
    /* Until the spinning thread has had 5 ms of CPU (50 ms at a time: a loaded machine may
     * give it little of the first), for 5 s at most. */
    const struct timespec ms50 = {0, 50 * 1000 * 1000};
    int ok = -1;
    for (int waits = 0; waits < 100; waits++) {
        nanosleep(&ms50, NULL);
        ok = tg_thread_cpu_snapshot(&after);
        if (ok || tg_thread_cpu_named(&before, &after, "tg-spin") > 0.005) break;
    }
    spin_stop = 1;
    pthread_join(th, NULL);
    REQUIRE(ok == 0, "second snapshot");
    int found = -1, self = -1;
    for (int i = 0; i < after.n; i++) {
        if (after.thread[i].tid == tid) found = i;
        if (after.thread[i].tid == gettid()) self = i;
    }
    REQUIRE(found >= 0 && self >= 0, "the spinning thread %d (%d) or this one (%d) is missing", tid, found, self);
    CHECK(strcmp(after.thread[found].name, "tg-spin") == 0, "name '%s'", after.thread[found].name);
    const double spun = tg_thread_cpu_named(&before, &after, "tg-spin");
    CHECK(spun > 0.005 && spun == after.thread[found].cpu_s, "the spinning thread used %g s", spun);

    /* More threads than a snapshot holds: it keeps TG_THREAD_CPU_MAX. */
    enum { EXTRA = TG_THREAD_CPU_MAX + 4 };
    pthread_t many[EXTRA];
    int started = 0;
    spin_stop = 0;
    while (started < EXTRA && pthread_create(&many[started], NULL, sleeper_main, NULL) == 0) started++;
    const int full = tg_thread_cpu_snapshot(&after);
    spin_stop = 1;
    for (int i = 0; i < started; i++) pthread_join(many[i], NULL);
    REQUIRE(started == EXTRA, "started %d threads", started);
    CHECK(full == 0 && after.n == TG_THREAD_CPU_MAX, "snapshot of %d threads holds %d", EXTRA + 1, after.n);
}

static void put(const char *dir, const char *tid, const char *file, const char *text) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, tid);
    mkdir(path, 0755);
    if (!file) return;
    snprintf(path, sizeof path, "%s/%s/%s", dir, tid, file);
    CHECK(tg_test_write_file(path, text) == 0, "write %s", path);
}

TG_TEST(test_thread_cpu_snapshot_of_task_dir) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/task", tg_test_tmpdir());
    REQUIRE(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    put(dir, "101", "schedstat", "2500000000 17 3\n");
    put(dir, "101", "comm", "worker-1\n");
    put(dir, "102", "schedstat", "1000 0 0\n");     /* no comm: no name */
    put(dir, "103", "schedstat", "123456789\n");
    put(dir, "103", "comm", "");                       /* an empty comm: no name */
    put(dir, "104", "comm", "exited\n");              /* no schedstat: left out */
    put(dir, "105", "schedstat", "not a number\n");   /* left out */
    put(dir, "105", "comm", "garbled\n");
    put(dir, "notes", NULL, NULL);                     /* no thread id: left out */
    put(dir, "0", "schedstat", "5\n");                /* tid 0: none */
    tg_thread_cpu s;
    memset(&s, 0x55, sizeof s);
    REQUIRE(tg_thread_cpu_snapshot_of(&s, dir) == 0, "snapshot of %s", dir);
    REQUIRE(s.n == 3, "%d threads read, want 3", s.n);
    int seen = 0;
    for (int i = 0; i < s.n; i++) {
        const int tid = s.thread[i].tid;
        if (tid == 101)
            seen |= 1, CHECK(strcmp(s.thread[i].name, "worker-1") == 0 && s.thread[i].cpu_s == 2.5,
                             "101: '%s' %g s", s.thread[i].name, s.thread[i].cpu_s);
        else if (tid == 102)
            seen |= 2, CHECK(s.thread[i].name[0] == 0 && s.thread[i].cpu_s == 1e-6, "102: '%s' %g s", s.thread[i].name,
                             s.thread[i].cpu_s);
        else if (tid == 103)
            seen |= 4, CHECK(s.thread[i].name[0] == 0 && s.thread[i].cpu_s == 0.123456789, "103: '%s' %.9f s",
                             s.thread[i].name, s.thread[i].cpu_s);
        else CHECK(0, "thread %d read", tid);
    }
    CHECK(seen == 7, "threads seen: mask %d", seen);
    char missing[1200];
    snprintf(missing, sizeof missing, "%s/none", dir);
    CHECK(tg_thread_cpu_snapshot_of(&s, missing) == -1 && s.n == 0, "a missing directory: %d threads", s.n);
}
