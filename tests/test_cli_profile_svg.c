/* `run --profile --metrics M.jsonl` on the CPU writes M.profile.svg beside the metrics file:
 * well-formed (every element closed, in order), the phases (forward, backward, optimizer)
 * and then the kernel groups as bars whose names and values are the stderr report's,
 * digit for digit, and the metrics file's profile_phase lines; `--artifact DIR` draws the
 * same chart into DIR/plots/profile.svg from the metrics. A chart path that cannot be
 * written is refused before the run. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/cli_in_process.h"
#include "tests/harness.h"

#define DEMO "examples/demo-classify.job --set steps=2 --set batch=4 --set seq=16"
#define BARS_MAX 32

typedef struct bars {
    int n;
    char name[BARS_MAX][64], value[BARS_MAX][32];
    char heading[2][64];
    int first_of[2]; /* the bar each heading comes before */
} bars;

/* Whether svg is well-formed as this module writes it: one root <svg>, every element
 * closed by its own end tag or "/>", attribute values quoted, no stray '<' or '&'. */
static int well_formed(const char *svg) {
    char stack[16][16];
    int depth = 0, roots = 0;
    for (const char *p = svg; *p; p++) {
        if (*p == '&') {
            if (strncmp(p, "&amp;", 5) && strncmp(p, "&lt;", 4) && strncmp(p, "&gt;", 4) && strncmp(p, "&quot;", 6) &&
                strncmp(p, "&apos;", 6))
                return 0;
            continue;
        }
        if (*p != '<') continue;
        const char *end = p + 1;
        int quoted = 0;
        for (; *end && (quoted || *end != '>'); end++) {
            if (*end == '"') quoted = !quoted;
            if (!quoted && *end == '<') return 0;
        }
        if (!*end) return 0;
        if (p[1] == '/') {
            const size_t n = strcspn(p + 2, " >");
            if (!depth || strlen(stack[depth - 1]) != n || strncmp(stack[depth - 1], p + 2, n)) return 0;
            depth--;
        } else if (end[-1] != '/') {
            const size_t n = strcspn(p + 1, " />");
            if (depth == 16 || n == 0 || n >= sizeof stack[0]) return 0;
            if (!depth) roots++;
            snprintf(stack[depth++], sizeof stack[0], "%.*s", (int)n, p + 1);
        } else if (!depth) {
            return 0;
        }
        p = end;
    }
    return depth == 0 && roots == 1 && !strncmp(svg, "<svg ", 5);
}

/* The chart's headings and bars: a bar is a right-aligned name, its rect, its value. */
static int read_bars(const char *svg, bars *b) {
    memset(b, 0, sizeof *b);
    int headings = 0;
    for (const char *p = svg; (p = strstr(p, "<text ")) != NULL; p++) {
        const char *gt = strchr(p, '>'), *close = gt ? strstr(gt, "</text>") : NULL;
        if (!close) return 0;
        const int len = (int)(close - gt - 1);
        if (memmem(p, (size_t)(gt - p), "font-weight=\"bold\"", 18)) {
            if (headings == 2) return 0;
            snprintf(b->heading[headings], sizeof b->heading[0], "%.*s", len, gt + 1);
            b->first_of[headings++] = b->n;
        } else if (memmem(p, (size_t)(gt - p), "text-anchor=\"end\"", 17)) {
            if (b->n == BARS_MAX) return 0;
            snprintf(b->name[b->n], sizeof b->name[0], "%.*s", len, gt + 1);
            const char *value = strstr(close, "<text "), *vgt = value ? strchr(value, '>') : NULL;
            if (!vgt || !strstr(close, "<rect ") || strstr(close, "<rect ") > value) return 0;
            snprintf(b->value[b->n++], sizeof b->value[0], "%.*s", (int)strcspn(vgt + 1, "<"), vgt + 1);
        }
    }
    return headings == 2;
}

/* One "NAME VALUE ms" of the report at p, read by `fmt`, appended to b: p past it, or NULL. */
static const char *report_bar(const char *p, const char *fmt, bars *b) {
    char name[64], value[32];
    int used = 0;
    if (b->n == BARS_MAX || sscanf(p, fmt, name, value, &used) != 2 || !used) return NULL;
    for (size_t n = strlen(name); n && name[n - 1] == ' ';) name[--n] = '\0';
    snprintf(b->name[b->n], sizeof b->name[0], "%s", name);
    snprintf(b->value[b->n++], sizeof b->value[0], "%s", value);
    return p + used;
}

/* "  forward X ms, backward Y ms, optimizer Z ms" and "  by kernel group: NAME X ms (P%), ..."
 * of the stderr report, as the bars they should be. */
static int report_bars(const char *err, bars *b) {
    memset(b, 0, sizeof *b);
    const char *p = strstr(err, "\n  forward ");
    for (p = p ? p + 3 : NULL; p; p += 2)
        if (!(p = report_bar(p, "%63[a-z ] %31[0-9.] ms%n", b)) || strncmp(p, ", ", 2)) break;
    b->first_of[1] = b->n;
    p = p ? strstr(p, "\n  by kernel group:") : NULL;
    for (p = p ? p + strlen("\n  by kernel group:") : NULL; p && *p == ' '; p += p && *p == ',')
        p = report_bar(p, " %63[a-z &] %31[0-9.] ms (%*[0-9.]%%)%n", b);
    return p && b->first_of[1] > 0 && b->n > b->first_of[1];
}

/* "&amp;" as "&" (kernel group names hold '&'). */
static void unescape(char *s) {
    for (char *at; (at = strstr(s, "&amp;"));) memmove(at + 1, at + 5, strlen(at + 5) + 1);
}

TG_TEST(test_cli_profile_svg_beside_the_metrics) {
    const char *dir = tg_test_tmpdir();
    char line[2048], path[800];
    snprintf(line, sizeof line, "run " DEMO " --metrics %s/m.jsonl --profile --artifact %s/art", dir, dir);
    tg_cli_run r = tg_test_cli_line(dir, line, NULL);
    REQUIRE(r.status == 0 && r.err, "%s: exit %d: %s", line, r.status, r.err ? r.err : "");
    bars want, got;
    REQUIRE(report_bars(r.err, &want), "no phase and group lines in the report: %s", r.err);
    CHECK(want.first_of[1] == 3 && !strcmp(want.name[0], "forward") && !strcmp(want.name[1], "backward") &&
              !strcmp(want.name[2], "optimizer"),
          "phases: %d, first %s", want.first_of[1], want.name[0]);
    snprintf(path, sizeof path, "%s/m.profile.svg", dir);
    CHECK(strstr(r.err, "wrote ") && strstr(r.err, path), "the chart's path is not reported: %s", r.err);
    char *svg = tg_test_read_file(path, NULL);
    REQUIRE(svg, "%s not written", path);
    CHECK(well_formed(svg), "%s is not well-formed: %s", path, svg);
    REQUIRE(read_bars(svg, &got), "%s: no headings and bars: %s", path, svg);
    CHECK(!strcmp(got.heading[0], "by phase") && !strcmp(got.heading[1], "by kernel group") && got.first_of[0] == 0 &&
              got.first_of[1] == want.first_of[1],
          "headings '%s' at %d, '%s' at %d", got.heading[0], got.first_of[0], got.heading[1], got.first_of[1]);
    CHECK(got.n == want.n, "%d bars, the report has %d", got.n, want.n);
    for (int k = 0; k < got.n && k < want.n; k++) {
        unescape(got.name[k]);
        CHECK(!strcmp(got.name[k], want.name[k]) && !strcmp(got.value[k], want.value[k]),
              "bar %d: %s %s, the report's %s %s", k, got.name[k], got.value[k], want.name[k], want.value[k]);
    }
    /* The metrics file's profile_phase lines: the phases in order, their ms the report's. */
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *text = tg_test_read_file(path, NULL);
    int phases = 0;
    for (char *l = text ? strtok(text, "\n") : NULL; l; l = strtok(NULL, "\n")) {
        json_t *o = json_loads(l, 0, NULL);
        const char *name = json_string_value(json_object_get(o, "profile_phase"));
        if (name && phases < want.first_of[1]) {
            const double ms = json_number_value(json_object_get(o, "ms"));
            CHECK(!strcmp(name, want.name[phases]) && fabs(ms - atof(want.value[phases])) <= 5.1e-4,
                  "profile_phase line %d: %s %g, the report's %s %s", phases, name, ms, want.name[phases],
                  want.value[phases]);
            phases++;
        }
        json_decref(o);
    }
    CHECK(phases == want.first_of[1], "%d profile_phase lines", phases);
    free(text);
    /* The artifact's plots: the same chart, drawn from the metrics (ms to 4 decimals). */
    snprintf(path, sizeof path, "%s/art/plots/profile.svg", dir);
    char *art = tg_test_read_file(path, NULL);
    bars drawn;
    CHECK(art && well_formed(art) && read_bars(art, &drawn) && drawn.n == want.n, "%s", path);
    for (int k = 0; art && k < drawn.n && k < want.n; k++) {
        unescape(drawn.name[k]);
        CHECK(!strcmp(drawn.name[k], want.name[k]) && fabs(atof(drawn.value[k]) - atof(want.value[k])) <= 1.1e-3,
              "artifact bar %d: %s %s, the report's %s %s", k, drawn.name[k], drawn.value[k], want.name[k],
              want.value[k]);
    }
    free(art);
    free(svg);
    tg_cli_run_free(&r);
    /* A chart path that is a folder: refused before anything runs. */
    snprintf(path, sizeof path, "%s/n.profile.svg", dir);
    REQUIRE(mkdir(path, 0777) == 0, "mkdir %s", path);
    snprintf(line, sizeof line, "run " DEMO " --metrics %s/n.jsonl --profile", dir);
    r = tg_test_cli_line(dir, line, NULL);
    CHECK(r.status == 1 && r.err && strstr(r.err, "profile chart (--profile)") && !strstr(r.err, "step 1/"),
          "exit %d: %s", r.status, r.err ? r.err : "");
    tg_cli_run_free(&r);
}
