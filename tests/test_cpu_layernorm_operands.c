/* LAYERNORM and LAYERNORM_BWD on the CPU reference (runtime/cpu/layernorm.c) with their
 * optional operands left out: no gamma acts as ones, no beta as zeros, the statistics and
 * dx are written only where asked for, dgamma and dbeta each alone, accumulated or
 * overwritten; the results with and without each operand agree bit for bit. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "base/alloc.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

enum { M = 3, D = 5, N = M * D };

static float X[N], G[D], B[D], DY[N];

static void init(void) {
    tg_test_fill_uniform(X, N, 11, -2, 2);
    tg_test_fill_uniform(G, D, 12, 0.5f, 1.5f);
    tg_test_fill_uniform(B, D, 13, -0.5f, 0.5f);
    tg_test_fill_uniform(DY, N, 14, -1, 1);
}

static void forward(const float *g, const float *b, float *y, float *mean, float *rstd) {
    tg_op op = tg_test_op(TG_OP_LAYERNORM);
    op.p.layernorm.m = M, op.p.layernorm.d = D, op.p.layernorm.eps = 1e-5f;
    tg_cpu_op_args a = {.op = &op, .in = {X, (void *)g, (void *)b}, .out = {y, mean, rstd}};
    tg_cpu_op_run(&a);
}

static int backward(const float *g, const float *mean, const float *rstd, float *dx, float *dg, float *db,
                    int overwrite) {
    tg_op op = tg_test_op(TG_OP_LAYERNORM_BWD);
    op.p.layernorm_bwd.m = M, op.p.layernorm_bwd.d = D, op.p.layernorm_bwd.overwrite = overwrite;
    atomic_int oom = 0;
    tg_cpu_op_args a = {.op = &op, .in = {DY, X, (void *)g, (void *)mean, (void *)rstd}, .out = {dx, dg, db},
                        .out_of_memory = &oom};
    tg_cpu_op_run(&a);
    return atomic_load(&oom);
}

static int same(const float *a, const float *b, int n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

TG_TEST(test_cpu_layernorm_optional_operands) {
    init();
    float ones[D], zeros[D];
    for (int d = 0; d < D; d++) ones[d] = 1, zeros[d] = 0;
    float y[N], y2[N], mean[M], rstd[M], mean2[M] = {0}, rstd2[M] = {0};
    forward(G, B, y, mean, rstd);
    /* The statistics: the row mean, and 1 / sqrt(variance + eps). */
    for (int m = 0; m < M; m++) {
        double s = 0, ss = 0;
        for (int d = 0; d < D; d++) s += X[m * D + d];
        for (int d = 0; d < D; d++) ss += (X[m * D + d] - s / D) * (X[m * D + d] - s / D);
        CHECK(fabs(mean[m] - s / D) < 1e-6 && fabs(rstd[m] - 1 / sqrt(ss / D + 1e-5)) < 1e-5 * rstd[m],
              "row %d: mean %g rstd %g", m, mean[m], rstd[m]);
        for (int d = 0; d < D; d++) {
            const double want = (X[m * D + d] - s / D) / sqrt(ss / D + 1e-5) * G[d] + B[d];
            CHECK(fabs(y[m * D + d] - want) < 1e-5, "y[%d][%d] %g, want %g", m, d, y[m * D + d], want);
        }
    }
    /* Without the statistics' outputs: the same y. */
    forward(G, B, y2, NULL, NULL);
    CHECK(same(y, y2, N), "y changed without mean and rstd outputs");
    forward(G, B, y2, mean2, NULL);
    CHECK(same(mean, mean2, M) && same(y, y2, N), "mean alone");
    forward(G, B, y2, NULL, rstd2);
    CHECK(same(rstd, rstd2, M), "rstd alone");
    /* No gamma: ones; no beta: zeros. */
    float ya[N], yb[N];
    forward(NULL, B, ya, NULL, NULL), forward(ones, B, yb, NULL, NULL);
    CHECK(same(ya, yb, N), "no gamma is not gamma = 1");
    forward(G, NULL, ya, NULL, NULL), forward(G, zeros, yb, NULL, NULL);
    CHECK(same(ya, yb, N), "no beta is not beta = 0");
    forward(NULL, NULL, ya, NULL, NULL), forward(ones, zeros, yb, NULL, NULL);
    CHECK(same(ya, yb, N), "neither is not (1, 0)");
    CHECK(!same(ya, y, N), "gamma and beta changed nothing");

    /* Backward: dx without gamma is dx with ones; dgamma and dbeta each alone. */
    float dx[N], dx2[N], dg[D], db[D], dg2[D], db2[D];
    memset(dg, 0, sizeof dg), memset(db, 0, sizeof db);
    CHECK(!backward(G, mean, rstd, dx, dg, db, 1), "out of memory");
    float dxa[N], dxb[N];
    backward(NULL, mean, rstd, dxa, NULL, NULL, 1), backward(ones, mean, rstd, dxb, NULL, NULL, 1);
    CHECK(same(dxa, dxb, N) && !same(dxa, dx, N), "dx without gamma");
    backward(G, mean, rstd, dx2, NULL, NULL, 1);
    CHECK(same(dx, dx2, N), "dx changed without dgamma and dbeta");
    /* No dx: the column sums alone, the same. */
    memset(dx2, 0x7f, sizeof dx2);
    memset(dg2, 0, sizeof dg2), memset(db2, 0, sizeof db2);
    backward(G, mean, rstd, NULL, dg2, NULL, 1);
    backward(G, mean, rstd, NULL, NULL, db2, 1);
    CHECK(same(dg, dg2, D) && same(db, db2, D), "dgamma or dbeta alone differ");
    /* dbeta is the column sum of dy; dgamma that of dy * xhat. */
    for (int d = 0; d < D; d++) {
        double sb = 0, sg = 0;
        for (int m = 0; m < M; m++)
            sb += DY[m * D + d], sg += DY[m * D + d] * ((X[m * D + d] - mean[m]) * rstd[m]);
        CHECK(fabs(db[d] - sb) < 1e-5 && fabs(dg[d] - sg) < 1e-5, "column %d: dbeta %g (%g), dgamma %g (%g)", d, db[d],
              sb, dg[d], sg);
    }
    /* Accumulated: onto what is there; overwritten: in place of it. */
    for (int d = 0; d < D; d++) dg2[d] = 10, db2[d] = -10;
    backward(G, mean, rstd, NULL, dg2, db2, 0);
    for (int d = 0; d < D; d++)
        CHECK(dg2[d] == 10 + dg[d] && db2[d] == -10 + db[d], "accumulated column %d: %g %g", d, dg2[d], db2[d]);
    backward(G, mean, rstd, NULL, dg2, db2, 1);
    CHECK(same(dg, dg2, D) && same(db, db2, D), "overwritten");
    /* Neither dx nor the sums: nothing is touched. */
    backward(G, mean, rstd, NULL, NULL, NULL, 1);
    /* The column sums' scratch failing: flagged, sums untouched. */
    for (int d = 0; d < D; d++) dg2[d] = 5;
    tg_alloc_fail_after(0);
    const int oom = backward(G, mean, rstd, NULL, dg2, NULL, 0);
    tg_alloc_fail_after(-1);
    CHECK(oom && dg2[0] == 5 && dg2[D - 1] == 5, "no scratch: flag %d, dgamma[0] %g", oom, dg2[0]);
}
