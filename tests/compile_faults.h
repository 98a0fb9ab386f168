/* The compile of a job text with each of its allocations failed in turn (tests of the
 * compiler's out-of-memory paths for one kind of plan or another). */
#ifndef TUNEGRAPH_TEST_COMPILE_FAULTS_H
#define TUNEGRAPH_TEST_COMPILE_FAULTS_H

/* Parses `text` as a job file, compiles it once to count its allocations, then fails each
 * in turn: every compile must fail with "out of memory" in its message (the harness's
 * CHECKs say which did not), and there must be over 100 allocations. */
void tg_test_compile_each_allocation_fails(const char *what, const char *text);

#endif
