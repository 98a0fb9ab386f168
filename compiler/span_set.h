/* Sets of byte ranges [a, b), kept sorted and merged (ranges that overlap or touch become
 * one), so that their ends rise and a binary search finds where a range falls. An insert
 * moves the ranges after it: for sets of a few ranges (the memory planner's per-node sets). */
#ifndef TUNEGRAPH_SPAN_SET_H
#define TUNEGRAPH_SPAN_SET_H

#include <stdint.h>

typedef struct tg_span {
    uint64_t a, b;
} tg_span;

typedef struct tg_span_set {
    tg_span *v;
    int n, cap;
} tg_span_set;

/* Adds [a, b) (nothing when a >= b). 0, or -1 when out of memory (the set unchanged). */
int tg_span_set_add(tg_span_set *s, uint64_t a, uint64_t b);
void tg_span_set_free(tg_span_set *s);

#endif
