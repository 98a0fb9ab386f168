/* Charts as SVG text, for `tunegraph plot`: a line chart with a left and a right axis, a
 * stacked-area chart with an optional line over it, and horizontal bar charts (in sections). Output
 * is a pure function of the input (fixed size, coordinates to two decimals), so charts
 * can be compared byte for byte. Series longer than SVG_CHART_POINTS are drawn as that
 * many bins, each the mean of its points' finite values; NaN values leave gaps. */
#ifndef TUNEGRAPH_CLI_SVG_CHART_H
#define TUNEGRAPH_CLI_SVG_CHART_H

#include <stddef.h>
#include <stdint.h>

#define SVG_CHART_POINTS 1000

/* Text being built; failed once an allocation failed (the text is then incomplete). */
typedef struct svg_buf {
    char *text;
    size_t len, cap;
    int failed;
} svg_buf;

void svg_buf_free(svg_buf *b);

typedef struct chart_series {
    const char *name;
    const double *y;   /* n values, beside the chart's x */
    const char *color; /* an SVG colour */
    int right_axis;    /* line charts: measured on the right axis */
} chart_series;

/* x: n values, increasing. Each returns 0, or -1 when out of memory. */
int svg_line_chart(svg_buf *b, const char *title, const char *x_label, const double *x, int64_t n,
                   const chart_series *series, int n_series, const char *left_label, const char *right_label);
/* The layers stacked from the axis up (a NaN counts 0), `line` (or NULL) drawn over them on
 * the same axis. */
int svg_stacked_chart(svg_buf *b, const char *title, const char *x_label, const double *x, int64_t n,
                      const chart_series *layers, int n_layers, const chart_series *line, const char *y_label);
int svg_bar_chart(svg_buf *b, const char *title, const char *const *names, const double *values, int n,
                  const char *value_label);

/* Bars under a heading (NULL: none), in one colour. */
typedef struct chart_bars {
    const char *heading;
    const char *const *names;
    const double *values;
    int n;
    const char *color;
} chart_bars;

/* Sections of horizontal bars one under the other, on one scale from 0; each bar labelled
 * with its value to three decimals. svg_bar_chart is one section without a heading. */
int svg_bar_sections(svg_buf *b, const char *title, const chart_bars *sections, int n_sections,
                     const char *value_label);

#endif
