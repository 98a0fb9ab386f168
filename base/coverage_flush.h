/* A process that ends by _exit or by raising a signal skips exit()'s handlers, and with
 * them gcov's: in the coverage build (-DTG_COVERAGE) such an end writes the counters
 * first, so that `make coverage` and mutation testing's map of which test reaches which
 * line see what ran on those paths too. Elsewhere it does nothing. Not for a signal
 * handler: gcov's writer is not async-signal-safe. */
#ifndef TG_COVERAGE_FLUSH_H
#define TG_COVERAGE_FLUSH_H

#ifdef TG_COVERAGE
void __gcov_dump(void);
static inline void tg_coverage_flush(void) { __gcov_dump(); }
#else
static inline void tg_coverage_flush(void) {}
#endif

#endif
