/* CPU reference kernels on operands the compiled plans seldom give them: attention dropout
 * of p = 1, GELU_BWD's fused bias gradient without its output, cross-entropy labels past
 * the counted classes, no rows at all and an upstream gradient of 0, SPAN_LOSS with its
 * normaliser, RESIDUAL_LAYERNORM without its statistics' outputs, a matmul of K = 0, an
 * update over a plan of no tensors, ADAN without a norm input, and the abort of a kernel
 * called directly (no out_of_memory flag) whose scratch cannot be allocated, or of a GELU
 * epilogue without its pre-activation buffer. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "runtime/cpu/cpu_kernels.h"
#include "tests/harness.h"

static int same(const float *a, const float *b, int64_t n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

TG_TEST(test_cpu_attention_dropout_of_one_drops_every_key) {
    enum { B = 1, H = 2, T = 5, DH = 3, D = H * DH };
    float q[B * T * D], k[B * T * D], v[B * T * D], step = 4;
    tg_test_fill_uniform(q, B * T * D, 1, -1, 1);
    tg_test_fill_uniform(k, B * T * D, 2, -1, 1);
    tg_test_fill_uniform(v, B * T * D, 3, -1, 1);
    float o[B * T * D], lse[B * H * T], o0[B * T * D], lse0[B * H * T];
    int32_t bits[B * H * T];
    tg_op op = tg_test_op(TG_OP_ATTENTION);
    op.p.attention = (tg_attention_params){.b = B, .h = H, .t = T, .head_dim = DH, .scale = 0.5f, .key = 3, .p = 0};
    tg_cpu_op_args a = {.op = &op, .in = {q, k, v, NULL, &step}, .out = {o0, lse0, bits}, .seed = 7, .training = 1};
    tg_cpu_op_run(&a);
    /* p = 1: no key is kept (the factor is 0, not 1 / 0), the output is 0 and the
     * softmax's statistics are those of p = 0. */
    op.p.attention.p = 1.0f;
    memset(bits, 0x5a, sizeof bits);
    for (int i = 0; i < B * T * D; i++) o[i] = NAN;
    a.out[0] = o, a.out[1] = lse;
    tg_cpu_op_run(&a);
    for (int i = 0; i < B * T * D; i++) CHECK(o[i] == 0.0f, "o[%d] = %g at p = 1", i, o[i]);
    for (int i = 0; i < B * H * T; i++) CHECK(bits[i] == 0, "keep bits of row %d: %#x at p = 1", i, (unsigned)bits[i]);
    CHECK(same(lse, lse0, B * H * T), "the log-sum-exp changed with p");
}

TG_TEST(test_cpu_gelu_bwd_bias_cols_without_output) {
    enum { N = 6 };
    float dy[N], x[N], dx[N], dx0[N];
    tg_test_fill_uniform(dy, N, 4, -1, 1);
    tg_test_fill_uniform(x, N, 5, -2, 2);
    tg_op op = tg_test_op(TG_OP_GELU_BWD);
    op.p.gelu_bwd.n = N, op.p.gelu_bwd.form = TG_GELU_TANH;
    tg_cpu_op_args a = {.op = &op, .in = {dy, x}, .out = {dx0}};
    tg_cpu_op_run(&a);
    /* bias_cols set but no out1: dx alone, the same bits (no column sum written anywhere). */
    op.p.gelu_bwd.bias_cols = 3;
    a.out[0] = dx;
    tg_cpu_op_run(&a);
    CHECK(same(dx, dx0, N), "dx differs with bias_cols but no bias gradient output");
    for (int i = 0; i < N; i++)
        CHECK(fabsf(dx[i] - dy[i] * gelu_tanh_grad(x[i])) <= 1e-6f * fabsf(dx[i]) + 1e-7f, "dx[%d] = %g", i, dx[i]);
}

/* Labels >= the counted classes (here the padding column 3 of a row of 4, and 9) count as
 * ignored rows: no loss, no gradient, not in the divisor. */
TG_TEST(test_cpu_cross_entropy_labels_past_the_classes) {
    enum { N = 4, C = 4, V = 3 };
    float x[N * C], loss = -1, dl = 2, dx[N * C];
    tg_test_fill_uniform(x, N * C, 6, -2, 2);
    const int32_t labels[N] = {1, V, 9, 0};
    tg_op op = tg_test_op(TG_OP_CROSS_ENTROPY);
    op.p.cross_entropy.n = N, op.p.cross_entropy.c = C, op.p.cross_entropy.classes = V;
    tg_cpu_op_args a = {.op = &op, .in = {x, (void *)labels}, .out = {&loss}};
    tg_cpu_op_run(&a);
    double want = 0;
    for (int r = 0; r < N; r += 3) {
        double s = 0;
        for (int c = 0; c < V; c++) s += exp((double)x[r * C + c]);
        want += log(s) - x[r * C + labels[r]];
    }
    want /= 2;
    CHECK(fabs(loss - want) < 1e-5, "loss %g, want %g (rows 0 and 3 over 2)", loss, want);
    tg_op bop = tg_test_op(TG_OP_CROSS_ENTROPY_BWD);
    bop.p.cross_entropy = op.p.cross_entropy;
    for (int i = 0; i < N * C; i++) dx[i] = NAN;
    tg_cpu_op_args b = {.op = &bop, .in = {&dl, x, (void *)labels}, .out = {dx}};
    tg_cpu_op_run(&b);
    for (int r = 1; r < 3; r++)
        for (int c = 0; c < C; c++) CHECK(dx[r * C + c] == 0.0f, "ignored row %d class %d: %g", r, c, dx[r * C + c]);
    CHECK(dx[0 * C + 3] == 0.0f && dx[3 * C + 3] == 0.0f, "padding columns: %g %g", dx[3], dx[15]);
    double s = 0;
    for (int c = 0; c < V; c++) s += exp((double)x[c]);
    const double want_d = dl / 2.0 * (exp((double)x[1]) / s - 1.0);
    CHECK(fabs(dx[1] - want_d) < 1e-5, "dx of row 0's label: %g, want %g", dx[1], want_d);
}

/* An upstream gradient of 0: every row's gradient is 0, counted rows included. No rows:
 * a loss of 0. */
TG_TEST(test_cpu_cross_entropy_zero_gradient_and_no_rows) {
    enum { N = 2, C = 3 };
    const float x[N * C] = {1, 2, 3, -1, 0, 4};
    const int32_t labels[N] = {2, 0};
    float dl = 0, dx[N * C];
    for (int i = 0; i < N * C; i++) dx[i] = NAN;
    tg_op bop = tg_test_op(TG_OP_CROSS_ENTROPY_BWD);
    bop.p.cross_entropy.n = N, bop.p.cross_entropy.c = C;
    tg_cpu_op_args b = {.op = &bop, .in = {&dl, (void *)x, (void *)labels}, .out = {dx}};
    tg_cpu_op_run(&b);
    for (int i = 0; i < N * C; i++) CHECK(dx[i] == 0.0f && !signbit(dx[i]), "dx[%d] = %g with dloss 0", i, dx[i]);

    float loss = -1;
    tg_op op = tg_test_op(TG_OP_CROSS_ENTROPY);
    op.p.cross_entropy.n = 0, op.p.cross_entropy.c = C;
    atomic_int oom = 0;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x, (void *)labels}, .out = {&loss}, .out_of_memory = &oom};
    tg_cpu_op_run(&a);
    CHECK(loss == 0.0f && !oom, "no rows: loss %g (oom %d)", loss, (int)oom);
}

/* SPAN_LOSS: a positive normaliser divides each side's sum, 0 leaves the side's counted
 * rows; an upstream gradient of 0 gives 0 everywhere. */
TG_TEST(test_cpu_span_loss_normaliser_and_zero_gradient) {
    enum { B = 2, T = 3 };
    float x[B * T * 2], dx[B * T * 2], dxn[B * T * 2], loss = -1, loss_n = -1;
    tg_test_fill_uniform(x, B * T * 2, 8, -2, 2);
    const int32_t pos[2 * B] = {0, 2, 1, 1};
    double sum[2] = {0, 0};
    for (int side = 0; side < 2; side++)
        for (int b = 0; b < B; b++) {
            double s = 0;
            for (int t = 0; t < T; t++) s += exp((double)x[(b * T + t) * 2 + side]);
            sum[side] += log(s) - x[(b * T + pos[2 * b + side]) * 2 + side];
        }
    tg_op op = tg_test_op(TG_OP_SPAN_LOSS);
    op.p.span_loss.b = B, op.p.span_loss.t = T;
    float norm[2] = {0, 0};
    tg_cpu_op_args a = {.op = &op, .in = {x, (void *)pos, norm}, .out = {&loss}};
    tg_cpu_op_run(&a);
    CHECK(fabs(loss - (sum[0] / B + sum[1] / B) / 2) < 1e-5, "normaliser 0: loss %g, want %g", loss,
          (sum[0] / B + sum[1] / B) / 2);
    norm[0] = 4, norm[1] = 8;
    a.out[0] = &loss_n;
    tg_cpu_op_run(&a);
    CHECK(fabs(loss_n - (sum[0] / 4 + sum[1] / 8) / 2) < 1e-5, "normaliser 4, 8: loss %g, want %g", loss_n,
          (sum[0] / 4 + sum[1] / 8) / 2);

    tg_op bop = tg_test_op(TG_OP_SPAN_LOSS_BWD);
    bop.p.span_loss = op.p.span_loss;
    float dl = 1;
    tg_cpu_op_args b = {.op = &bop, .in = {&dl, x, (void *)pos, norm}, .out = {dxn}};
    tg_cpu_op_run(&b);
    /* Row 0's start: (softmax - onehot) / 2 / 4. */
    double s = 0;
    for (int t = 0; t < T; t++) s += exp((double)x[t * 2]);
    CHECK(fabs(dxn[0] - (exp((double)x[0]) / s - 1) / 8) < 1e-6, "normalised dx[0] %g", dxn[0]);
    dl = 0;
    for (int i = 0; i < B * T * 2; i++) dx[i] = NAN;
    b.out[0] = dx;
    tg_cpu_op_run(&b);
    for (int i = 0; i < B * T * 2; i++) CHECK(dx[i] == 0.0f && !signbit(dx[i]), "dx[%d] = %g with dloss 0", i, dx[i]);
}

/* RESIDUAL_LAYERNORM without out2 (mean) and out3 (rstd): the same y and sum. */
TG_TEST(test_cpu_residual_layernorm_without_statistics) {
    enum { M = 3, D = 4 };
    float x[M * D], r[M * D], g[D], be[D], y[M * D], s[M * D], mean[M], rstd[M], y2[M * D], s2[M * D];
    tg_test_fill_uniform(x, M * D, 9, -1, 1);
    tg_test_fill_uniform(r, M * D, 10, -1, 1);
    tg_test_fill_uniform(g, D, 11, 0.5f, 1.5f);
    tg_test_fill_uniform(be, D, 12, -0.5f, 0.5f);
    tg_op op = tg_test_op(TG_OP_RESIDUAL_LAYERNORM);
    op.p.residual_layernorm.m = M, op.p.residual_layernorm.d = D, op.p.residual_layernorm.eps = 1e-5f;
    tg_cpu_op_args a = {.op = &op, .in = {x, r, g, be}, .out = {y, s, mean, rstd}};
    tg_cpu_op_run(&a);
    a.out[0] = y2, a.out[1] = s2, a.out[2] = NULL, a.out[3] = NULL;
    tg_cpu_op_run(&a);
    CHECK(same(y, y2, M * D) && same(s, s2, M * D), "y or the sum changed without mean and rstd outputs");
    for (int i = 0; i < M * D; i++) CHECK(s2[i] == x[i] + r[i], "sum[%d] %g", i, s2[i]);
    double mu = 0;
    for (int d = 0; d < D; d++) mu += s[d];
    CHECK(fabs(mean[0] - mu / D) < 1e-6, "mean %g, want %g", mean[0], mu / D);
}

/* K = 0: the empty sums are 0, so C is alpha * 0 plus the bias (or C plus it, accumulated). */
TG_TEST(test_cpu_matmul_inner_dimension_zero) {
    const float bias[3] = {1, -2, 3};
    float C[6], A[1] = {7}, Bm[1] = {8};
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.p.matmul.m = 2, op.p.matmul.n = 3, op.p.matmul.k = 0, op.p.matmul.batch = 1, op.p.matmul.alpha = 1;
    atomic_int oom = 0;
    tg_cpu_op_args a = {.op = &op, .in = {A, Bm, (void *)bias}, .out = {C}, .out_of_memory = &oom};
    for (int i = 0; i < 6; i++) C[i] = NAN;
    tg_cpu_op_run(&a);
    for (int i = 0; i < 6; i++) CHECK(C[i] == bias[i % 3], "C[%d] = %g, want %g", i, C[i], bias[i % 3]);
    op.p.matmul.accumulate = 1;
    tg_cpu_op_run(&a);
    for (int i = 0; i < 6; i++) CHECK(C[i] == 2 * bias[i % 3], "accumulated C[%d] = %g", i, C[i]);
    a.in[2] = NULL, op.p.matmul.accumulate = 0;
    tg_cpu_op_run(&a);
    for (int i = 0; i < 6; i++) CHECK(C[i] == 0.0f, "no bias: C[%d] = %g", i, C[i]);
    CHECK(!oom, "out of memory reported");
}

/* ADAMW over a plan of no tensors: no segment, nothing moves (and no scratch is lost). */
TG_TEST(test_cpu_adamw_plan_without_tensors) {
    float g[2] = {1, -1}, p[2] = {5, 6}, m[2] = {0}, v[2] = {0}, lr = 0.1f, t = 1;
    tg_op op = tg_test_op(TG_OP_ADAMW);
    op.p.adamw.beta1 = 0.9f, op.p.adamw.beta2 = 0.999f, op.p.adamw.eps = 1e-8f, op.p.adamw.n = 2;
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    atomic_int oom = 0;
    tg_cpu_op_args a = {.op = &op, .plan = &plan, .in = {g, &lr, &t}, .out = {p, m, v}, .out_of_memory = &oom};
    tg_cpu_op_run(&a);
    CHECK(p[0] == 5 && p[1] == 6 && m[0] == 0 && v[1] == 0 && !oom, "moved over no tensors: %g %g", p[0], p[1]);
}

/* ADAN without in3 (the gradient norm): no clipping, whatever max_grad_norm says; the same
 * step as with a norm that does not clip. */
TG_TEST(test_cpu_adan_without_norm_input) {
    tg_tensor tt[1];
    memset(tt, 0, sizeof tt);
    tt[0].ndim = 1, tt[0].shape[0] = 2, tt[0].bytes = 8, tt[0].flags = TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY;
    tg_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.n_tensors = 1, plan.tensors = tt;
    float lr = 0.1f, t = 1, big = 1000;
    float pa[2] = {5, 6}, ma[4] = {0}, va[4] = {0}, pb[2] = {5, 6}, mb[4] = {0}, vb[4] = {0};
    float g[2] = {3, -4};
    tg_op op = tg_test_op(TG_OP_ADAN);
    op.p.adan.n = 2, op.p.adan.beta1 = 0.02f, op.p.adan.beta2 = 0.08f, op.p.adan.beta3 = 0.01f,
    op.p.adan.eps = 1e-8f, op.p.adan.max_grad_norm = 0.001f;
    tg_cpu_op_args a = {.op = &op, .plan = &plan, .in = {g, &lr, &t}, .out = {pa, ma, va}};
    tg_cpu_op_run(&a);
    tg_op clip_off = op;
    clip_off.p.adan.max_grad_norm = 0;
    tg_cpu_op_args b = {.op = &clip_off, .plan = &plan, .in = {g, &lr, &t, &big}, .out = {pb, mb, vb}};
    tg_cpu_op_run(&b);
    CHECK(same(pa, pb, 2) && same(ma, mb, 4) && same(va, vb, 4), "without in3: p %g %g, unclipped %g %g", pa[0],
          pa[1], pb[0], pb[1]);
    /* Unclipped: m is (1 - beta1) g on the first step. */
    CHECK(fabsf(ma[0] - 0.98f * 3) < 1e-5f && fabsf(ma[1] + 0.98f * 4) < 1e-5f, "m %g %g (clipped?)", ma[0], ma[1]);
    CHECK(pa[0] != 5 && pa[1] != 6, "no step: %g %g", pa[0], pa[1]);
}

#ifdef TG_COVERAGE
void __gcov_dump(void);
#endif

/* Ends a forked child without the exit handlers (the parent's thread pools, which they
 * would stop, have no threads in the child); the coverage build writes its counts first. */
static void child_exit(int code) {
#ifdef TG_COVERAGE
    __gcov_dump();
#endif
    _exit(code);
}

/* SIGABRT in the child: exit status 42. */
static void exit_42(int sig) {
    (void)sig;
    child_exit(42);
}

/* Runs fn in a child process; returns its wait status (42: it called abort). */
static int status_of_child(void (*fn)(void)) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = exit_42;
        sigaction(SIGABRT, &sa, NULL);
        fn();
        child_exit(0);
    }
    int st = -1;
    waitpid(pid, &st, 0);
    return st;
}

static void cross_entropy_out_of_memory_without_flag(void) {
    const float x[2] = {1, 2};
    const int32_t labels[1] = {0};
    float loss;
    tg_op op = tg_test_op(TG_OP_CROSS_ENTROPY);
    op.p.cross_entropy.n = 1, op.p.cross_entropy.c = 2;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)x, (void *)labels}, .out = {&loss}};
    tg_alloc_fail_after(0);
    tg_cpu_op_run(&a);
}

static void gelu_epilogue_without_pre_activation(void) {
    const float A[1] = {1}, B[1] = {1};
    float C[1];
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.p.matmul.m = 1, op.p.matmul.n = 1, op.p.matmul.k = 1, op.p.matmul.alpha = 1;
    op.p.matmul.activation = TG_MATMUL_ACT_GELU;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B}, .out = {C}};
    tg_cpu_op_run(&a);
}

static void gelu_bwd_epilogue_without_pre_activation(void) {
    const float A[1] = {1}, B[1] = {1};
    float C[1];
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.p.matmul.m = 1, op.p.matmul.n = 1, op.p.matmul.k = 1, op.p.matmul.alpha = 1;
    op.p.matmul.activation = TG_MATMUL_ACT_GELU_BWD;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B}, .out = {C}};
    tg_cpu_op_run(&a);
}

static void gelu_epilogues_with_their_buffers(void) {
    const float A[1] = {1}, B[1] = {1}, pre_in[1] = {0};
    float C[1], pre[1];
    tg_op op = tg_test_op(TG_OP_MATMUL);
    op.p.matmul.m = 1, op.p.matmul.n = 1, op.p.matmul.k = 1, op.p.matmul.alpha = 1;
    op.p.matmul.activation = TG_MATMUL_ACT_GELU;
    tg_cpu_op_args a = {.op = &op, .in = {(void *)A, (void *)B}, .out = {C, NULL, pre}};
    tg_cpu_op_run(&a);
    if (pre[0] != 1.0f) child_exit(3);
    op.p.matmul.activation = TG_MATMUL_ACT_GELU_BWD;
    a.in[3] = (void *)pre_in, a.out[2] = NULL;
    tg_cpu_op_run(&a);
    if (C[0] != 0.5f) child_exit(4); /* gelu'(0) = 1/2 */
}

TG_TEST(test_cpu_kernels_abort_where_they_cannot_report) {
    int st = status_of_child(cross_entropy_out_of_memory_without_flag);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42, "a direct call without out_of_memory whose scratch failed: status %#x",
          st);
    st = status_of_child(gelu_epilogue_without_pre_activation);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42, "GELU epilogue without out2: status %#x", st);
    st = status_of_child(gelu_bwd_epilogue_without_pre_activation);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42, "GELU_BWD epilogue without in3: status %#x", st);
    st = status_of_child(gelu_epilogues_with_their_buffers);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the epilogues with their buffers: status %#x", st);
}
