/* Label names and their ids for `data convert`. Without a given list, the ids follow the
 * sorted distinct names: by value when every name is a whole number ("2" < "10"), else
 * by bytes. A given list (--labels a,b,c) fixes names and order, and a row whose label is
 * not in it is refused. */
#ifndef TUNEGRAPH_LABELS_H
#define TUNEGRAPH_LABELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "datasets/text_rows.h"

typedef struct tg_label_set {
    int32_t n;
    char **names;   /* id -> name */
    size_t *lens;
    int32_t *sorted;  /* ids in byte order of their names, for lookups */
} tg_label_set;

/* The list "a,b,c" (names non-empty after trimming blanks, each once). */
int tg_labels_parse_list(const char *list, tg_label_set *ls, tg_err *err);
/* The distinct labels of the rows that have one. */
int tg_labels_collect(const tg_text_rows *rows, tg_label_set *ls, tg_err *err);
/* The distinct names of a list (folder names, NUL-terminated), in the same order. */
int tg_labels_of_names(const char *const *names, int32_t n, tg_label_set *ls, tg_err *err);
/* The id of a name, or -1. */
int32_t tg_labels_find(const tg_label_set *ls, const char *name, size_t len);
void tg_labels_free(tg_label_set *ls);

#endif
