#include "cli/svg_chart.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

enum { W = 720, H = 400, LEFT = 80, RIGHT = 80, TOP = 44, BOTTOM = 56 };

void svg_buf_free(svg_buf *b) {
    free(b->text);
    memset(b, 0, sizeof *b);
}

static void svg_put(svg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void svg_put(svg_buf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = b->cap - b->len;
        const int n = vsnprintf(b->text ? b->text + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) { /* GCOVR_EXCL_BR_LINE: the formats are the module's own */
            b->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        const size_t cap = (b->cap ? b->cap * 2 : 4096) + (size_t)n;
        char *p = tg_realloc(b->text, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->text = p, b->cap = cap;
    }
}

/* Text with XML's five special characters escaped. */
static void svg_put_text(svg_buf *b, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': svg_put(b, "&amp;"); break;
        case '<': svg_put(b, "&lt;"); break;
        case '>': svg_put(b, "&gt;"); break;
        case '"': svg_put(b, "&quot;"); break;
        case '\'': svg_put(b, "&apos;"); break;
        default: svg_put(b, "%c", *s);
        }
    }
}

static void svg_begin(svg_buf *b, const char *title) {
    svg_put(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
           "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
           "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">",
        W, H, W, H, W, H, W / 2);
    svg_put_text(b, title);
    svg_put(b, "</text>\n");
}

static int svg_end(svg_buf *b) {
    svg_put(b, "</svg>\n");
    return b->failed ? -1 : 0;
}

/* An chart_axis: its ends and tick spacing, from the finite values' range (one tick each side
 * of a constant series). */
typedef struct chart_axis {
    double lo, hi, step;
} chart_axis;

static chart_axis chart_axis_of(double lo, double hi) {
    if (!(lo <= hi)) lo = 0, hi = 1; /* no finite value */
    if (lo == hi) {
        const double pad = lo == 0 ? 1 : fabs(lo) * 0.1;
        lo -= pad, hi += pad;
    }
    const double raw = (hi - lo) / 5, mag = pow(10, floor(log10(raw))), f = raw / mag;
    const double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    return (chart_axis){floor(lo / step) * step, ceil(hi / step) * step, step};
}

static double chart_px_x(const chart_axis *a, double x) { return LEFT + (x - a->lo) / (a->hi - a->lo) * (W - LEFT - RIGHT); }
static double chart_px_y(const chart_axis *a, double y) { return H - BOTTOM - (y - a->lo) / (a->hi - a->lo) * (H - TOP - BOTTOM); }

/* Gridlines and labels of an chart_axis: x along the bottom, y on the left (side 0) or right. */
static void chart_draw_axis(svg_buf *b, const chart_axis *a, int vertical, int side, const char *label, const char *color) {
    for (int k = 0;; k++) {
        const double v = a->lo + k * a->step;
        if (v > a->hi + a->step * 1e-9) break;
        const double r = fabs(v) < a->step * 1e-9 ? 0 : v;
        if (vertical) {
            const double y = chart_px_y(a, v);
            if (!side) svg_put(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#e0e0e0\"/>\n", LEFT, y, W - RIGHT, y);
            svg_put(b, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"%s\" fill=\"%s\">%g</text>\n", side ? W - RIGHT + 6 : LEFT - 6,
                y + 4, side ? "start" : "end", color, r);
        } else {
            const double x = chart_px_x(a, v);
            svg_put(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#e0e0e0\"/>\n", x, TOP, x, H - BOTTOM);
            svg_put(b, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">%g</text>\n", x, H - BOTTOM + 16, r);
        }
    }
    if (vertical)
        svg_put(b, "<text transform=\"translate(%d %d) rotate(-90)\" text-anchor=\"middle\" fill=\"%s\">",
            side ? W - 14 : 16, (TOP + H - BOTTOM) / 2, color);
    else svg_put(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (LEFT + W - RIGHT) / 2, H - 14);
    svg_put_text(b, label);
    svg_put(b, "</text>\n");
}

/* Bin k of n points drawn as `bins`: the mean of the finite values of its points. */
static int chart_bins(int64_t n) { return n > SVG_CHART_POINTS ? SVG_CHART_POINTS : (int)n; }
static double chart_bin_mean(const double *v, int64_t n, int bins, int k) {
    const int64_t a = n * k / bins, e = n * (k + 1) / bins;
    double sum = 0;
    int64_t m = 0;
    for (int64_t i = a; i < e; i++)
        if (isfinite(v[i])) sum += v[i], m++;
    return m ? sum / (double)m : NAN;
}

static void chart_range(const double *v, int64_t n, double *lo, double *hi) {
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i])) {
            if (v[i] < *lo) *lo = v[i];
            if (v[i] > *hi) *hi = v[i];
        }
}

/* A series as polylines, broken where a bin has no finite value. */
static void chart_draw_line(svg_buf *b, const chart_axis *ax, const chart_axis *ay, const double *x, const double *y, int64_t n,
                      const char *color) {
    const int bins = chart_bins(n);
    int open = 0;
    for (int k = 0; k < bins; k++) {
        const double xv = chart_bin_mean(x, n, bins, k), yv = chart_bin_mean(y, n, bins, k);
        if (!isfinite(yv)) {
            if (open) svg_put(b, "\"/>\n");
            open = 0;
            continue;
        }
        if (!open) svg_put(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
        svg_put(b, "%s%.2f,%.2f", open ? " " : "", chart_px_x(ax, xv), chart_px_y(ay, yv));
        open = 1;
    }
    if (open) svg_put(b, "\"/>\n");
}

static void chart_legend(svg_buf *b, const chart_series *s, int n, int at) {
    for (int k = 0; k < n; k++) {
        const int x = LEFT + 10 + (at + k) * 120;
        svg_put(b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>\n<text x=\"%d\" y=\"%d\">", x, TOP - 14,
            s[k].color, x + 16, TOP - 4);
        svg_put_text(b, s[k].name);
        svg_put(b, "</text>\n");
    }
}

int svg_line_chart(svg_buf *b, const char *title, const char *x_label, const double *x, int64_t n,
                   const chart_series *series, int n_series, const char *left_label, const char *right_label) {
    svg_begin(b, title);
    double xlo = INFINITY, xhi = -INFINITY, lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
    chart_range(x, n, &xlo, &xhi);
    for (int k = 0; k < n_series; k++) chart_range(series[k].y, n, &lo[series[k].right_axis != 0], &hi[series[k].right_axis != 0]);
    const chart_axis ax = chart_axis_of(xlo, xhi), ay[2] = {chart_axis_of(lo[0], hi[0]), chart_axis_of(lo[1], hi[1])};
    chart_draw_axis(b, &ax, 0, 0, x_label, "black");
    int right = 0;
    for (int k = 0; k < n_series; k++) right |= series[k].right_axis != 0;
    chart_draw_axis(b, &ay[0], 1, 0, left_label, right ? series[0].color : "black");
    if (right) {
        const char *color = "black";
        for (int k = 0; k < n_series; k++)
            if (series[k].right_axis) color = series[k].color;
        chart_draw_axis(b, &ay[1], 1, 1, right_label, color);
    }
    for (int k = 0; k < n_series; k++) chart_draw_line(b, &ax, &ay[series[k].right_axis != 0], x, series[k].y, n, series[k].color);
    chart_legend(b, series, n_series, 0);
    return svg_end(b);
}

int svg_stacked_chart(svg_buf *b, const char *title, const char *x_label, const double *x, int64_t n,
                      const chart_series *layers, int n_layers, const chart_series *line, const char *y_label) {
    svg_begin(b, title);
    const int bins = chart_bins(n);
    double *bx = tg_calloc((size_t)bins, sizeof *bx), *top = tg_calloc((size_t)bins * (size_t)(n_layers + 1), sizeof *top);
    if (!bx || !top) {
        free(bx), free(top);
        b->failed = 1;
        return -1;
    }
    double xlo = INFINITY, xhi = -INFINITY, hi = 0;
    for (int k = 0; k < bins; k++) {
        bx[k] = chart_bin_mean(x, n, bins, k);
        for (int l = 0; l < n_layers; l++) {
            const double v = chart_bin_mean(layers[l].y, n, bins, k);
            top[(size_t)(l + 1) * bins + k] = top[(size_t)l * bins + k] + (isfinite(v) ? v : 0);
        }
        if (top[(size_t)n_layers * bins + k] > hi) hi = top[(size_t)n_layers * bins + k];
    }
    chart_range(bx, bins, &xlo, &xhi);
    double lo = 0;
    if (line) chart_range(line->y, n, &lo, &hi);
    const chart_axis ax = chart_axis_of(xlo, xhi), ay = chart_axis_of(0, hi);
    chart_draw_axis(b, &ax, 0, 0, x_label, "black");
    chart_draw_axis(b, &ay, 1, 0, y_label, "black");
    for (int l = 0; l < n_layers; l++) {
        svg_put(b, "<polygon fill=\"%s\" fill-opacity=\"0.85\" points=\"", layers[l].color);
        for (int k = 0; k < bins; k++) svg_put(b, "%s%.2f,%.2f", k ? " " : "", chart_px_x(&ax, bx[k]), chart_px_y(&ay, top[(size_t)(l + 1) * bins + k]));
        for (int k = bins - 1; k >= 0; k--) svg_put(b, " %.2f,%.2f", chart_px_x(&ax, bx[k]), chart_px_y(&ay, top[(size_t)l * bins + k]));
        svg_put(b, "\"/>\n");
    }
    if (line) chart_draw_line(b, &ax, &ay, x, line->y, n, line->color);
    free(bx), free(top);
    chart_legend(b, layers, n_layers, 0);
    if (line) chart_legend(b, line, 1, n_layers);
    return svg_end(b);
}

int svg_bar_sections(svg_buf *b, const char *title, const chart_bars *sections, int n_sections,
                     const char *value_label) {
    svg_begin(b, title);
    double hi = 0;
    int rows = 0;
    for (int s = 0; s < n_sections; s++) {
        rows += sections[s].n + (sections[s].heading != NULL);
        for (int k = 0; k < sections[s].n; k++)
            if (sections[s].values[k] > hi) hi = sections[s].values[k];
    }
    const chart_axis ax = chart_axis_of(0, hi);
    const int label_w = 170, row = rows ? (H - TOP - BOTTOM) / rows : 0;
    int y = TOP;
    for (int s = 0; s < n_sections; s++) {
        const chart_bars *sec = &sections[s];
        if (sec->heading) {
            svg_put(b, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">", 8, y + row / 2 + 4);
            svg_put_text(b, sec->heading);
            svg_put(b, "</text>\n");
            y += row;
        }
        for (int k = 0; k < sec->n; k++, y += row) {
            const double w = (sec->values[k] - ax.lo) / (ax.hi - ax.lo) * (W - RIGHT - label_w);
            svg_put(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">", label_w - 8, y + row / 2 + 4);
            svg_put_text(b, sec->names[k]);
            svg_put(b, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"/>\n"
                   "<text x=\"%.2f\" y=\"%d\">%.3f</text>\n",
                label_w, y + 3, w, row - 6, sec->color, label_w + w + 4, y + row / 2 + 4, sec->values[k]);
        }
    }
    svg_put(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", (label_w + W - RIGHT) / 2, H - 14);
    svg_put_text(b, value_label);
    svg_put(b, "</text>\n");
    return svg_end(b);
}

int svg_bar_chart(svg_buf *b, const char *title, const char *const *names, const double *values, int n,
                  const char *value_label) {
    const chart_bars bars = {NULL, names, values, n, "#4e79a7"};
    return svg_bar_sections(b, title, &bars, 1, value_label);
}
