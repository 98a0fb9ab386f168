/* tg_first_gradient_writes (compiler/grad_writes.c) stays near linear however the gradient
 * ranges overlap: 100000 nested gradients (gradient i is floats [0, i + 1) of the buffer),
 * none written, each cleared in turn by the pass's last loop. A cell once marked to clear
 * leaves the forest of open cells, so each of the 100000 cells is visited about once, not
 * once per gradient that covers it (5 billion visits, seconds). The pass must give one ZERO
 * over the whole union, in under half a second of this thread's CPU time (milliseconds). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "compiler/grad_state.h"
#include "compiler/grad_writes.h"
#include "compiler/graph.h"
#include "compiler/job.h"
#include "models/model_config.h"
#include "tests/harness.h"

enum { NESTED = 100000 };

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

TG_TEST(test_compiler_grad_writes_nested_ranges_cost) {
    tg_model_config cfg;
    tg_job job;
    tg_err err = {{0}};
    tg_graph g;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.source, sizeof cfg.source, "hand-built");
    tg_job_defaults(&job);
    tg_graph_init(&g, &cfg, &job, &err);
    for (int i = 0; i < NESTED && !g.failed; i++) {
        char name[32];
        snprintf(name, sizeof name, "grad.%d", i);
        const int64_t n[1] = {i + 1};
        const int t = tg_graph_tensor(&g, name, TG_F32, TG_POOL_GRADS, 1, n);
        if (t >= 0) g.tensors[t].flags |= TG_TENSOR_GRAD, g.tensors[t].offset = 0;
    }
    const int64_t all_n[1] = {NESTED};
    const int all = tg_graph_tensor(&g, "grads.all", TG_F32, TG_POOL_GRADS, 1, all_n);
    if (!CHECK(!g.failed && all >= 0, "setup: %s", err.msg)) {
        tg_graph_free(&g);
        return;
    }
    g.tensors[all].offset = 0;
    g.io.grads_all = all;
    tg_op_spec z = tg_spec(TG_OP_ZERO);
    z.out[0] = all;
    if (!CHECK(tg_graph_op(&g, &z) == 0, "zero: %s", err.msg)) {
        tg_graph_free(&g);
        return;
    }

    const double t0 = thread_cpu_s();
    const int rc = tg_first_gradient_writes(&g);
    const double spent = thread_cpu_s() - t0;
    const tg_tensor *t = g.n_ops == 1 && g.ops[0].out[0] >= 0 ? &g.tensors[g.ops[0].out[0]] : NULL;
    CHECK(rc == 0 && t && g.ops[0].kind == TG_OP_ZERO && !strcmp(t->name, "grads.zero.0") && t->offset == 0 &&
              t->shape[0] == NESTED && t->bytes == 4 * (uint64_t)NESTED && (t->flags & TG_TENSOR_VIEW),
          "rc %d (%s), %d ops, the first %s over [%llu, +%lld floats)", rc, err.msg, g.n_ops, tg_op_name(g.ops[0].kind),
          t ? (unsigned long long)t->offset : 0ULL, t ? (long long)t->shape[0] : 0LL);
    CHECK(spent < 0.5, "the pass took %.3f s of CPU for %d nested gradients", spent, NESTED);
    tg_graph_free(&g);
}
