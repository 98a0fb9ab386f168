/* The cost model (plan/cost_model.h): the roofline of hand-made tiny plans with known FLOPs
 * and bytes (exact numbers), the overlap of the gradient sums with the backward, the
 * deferred update beside the forward, FLOPs and bytes for every op kind of the closed
 * list, the shape terms (a matmul's size, attention's backend and row length), the
 * captured step's launch term, and the fit recovering known factors from synthetic samples. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/cost_model.h"
#include "plan/op_meta.h"
#include "tests/harness.h"

typedef struct tiny_plan {
    tg_plan p;
    tg_tensor t[16];
    tg_op o[8];
} tiny_plan;

static int add_tensor(tiny_plan *s, const char *name, int dtype, int64_t d0, int64_t d1) {
    const int i = s->p.n_tensors++;
    tg_tensor *x = &s->t[i];
    memset(x, 0, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    x->dtype = dtype, x->pool = TG_POOL_ACTIVATIONS, x->ndim = d1 ? 2 : 1;
    x->shape[0] = d0, x->shape[1] = d1 ? d1 : 0;
    x->bytes = (uint64_t)(d0 * (d1 ? d1 : 1) * tg_dtype_size(dtype));
    x->grad = x->master = x->group = -1;
    return i;
}

static void begin(tiny_plan *s, int replicas) {
    memset(s, 0, sizeof *s);
    s->p.tensors = s->t, s->p.ops = s->o;
    s->p.train.replicas = replicas;
    s->p.train.precision = TG_PREC_FP32;
}

/* A device of round numbers: 1 MFLOP/s, 1 MB/s, 2 MB/s link, 1 us an op. */
static tg_cost_device round_device(int cpu) {
    tg_cost_device d;
    memset(&d, 0, sizeof d);
    snprintf(d.key, sizeof d.key, "test");
    d.cpu = cpu;
    d.peak_flops = 1e6, d.peak_bw = 1e6, d.link_bw = 2e6, d.launch_s = 1e-6;
    for (int g = 0; g < TG_GROUP_COUNT; g++) d.eff_flops[g] = 1, d.eff_bw[g] = 1;
    d.eff_flops[TG_GROUP_MATMUL] = 0.5, d.eff_bw[TG_GROUP_MATMUL] = 0.25;
    d.eff_bw[TG_GROUP_NORM] = 0.5;
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++) d.attention[b] = (tg_cost_attention){1, 1, 0, 1, 0};
    d.graph_launch_s = d.launch_s, d.update_overlap = 1;
    return d;
}

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(b) > 1 ? fabs(b) : 1); }

TG_TEST(test_cost_model_roofline_exact) {
    tiny_plan s;
    begin(&s, 1);
    const int a = add_tensor(&s, "a", TG_F32, 4, 8), b = add_tensor(&s, "b", TG_F32, 8, 16);
    const int c = add_tensor(&s, "c", TG_F32, 4, 16), x = add_tensor(&s, "x", TG_F32, 1000, 0);
    const int y = add_tensor(&s, "y", TG_F32, 1000, 0), z = add_tensor(&s, "z", TG_F32, 1000, 0);
    s.o[0] = tg_test_op(TG_OP_MATMUL); /* 4x8 @ 8x16 */
    s.o[0].in[0] = a, s.o[0].in[1] = b, s.o[0].out[0] = c;
    s.o[0].p.matmul = (tg_matmul_params){.m = 4, .n = 16, .k = 8, .batch = 1, .alpha = 1};
    s.o[1] = tg_test_op(TG_OP_ADD);
    s.o[1].in[0] = x, s.o[1].in[1] = y, s.o[1].out[0] = z, s.o[1].p.count.n = 1000;
    s.o[1].phase = TG_PHASE_BACKWARD;
    s.p.n_ops = 2;
    s.p.phase_begin[0] = 0, s.p.phase_begin[1] = 1, s.p.phase_begin[2] = 2, s.p.phase_begin[3] = 2;
    CHECK(tg_cost_op_flops(&s.p, 0) == 1024 && tg_cost_op_bytes(&s.p, 0) == 128 + 512 + 256, "matmul %g FLOPs %g B",
          tg_cost_op_flops(&s.p, 0), tg_cost_op_bytes(&s.p, 0));
    CHECK(tg_cost_op_flops(&s.p, 1) == 1000 && tg_cost_op_bytes(&s.p, 1) == 12000, "add %g FLOPs %g B",
          tg_cost_op_flops(&s.p, 1), tg_cost_op_bytes(&s.p, 1));
    const tg_cost_device d = round_device(1);
    int bound = -1;
    /* matmul: compute 1024 / 0.5e6 = 2.048 ms, memory 896 / 0.25e6 = 3.584 ms: memory-bound. */
    CHECK(near(tg_cost_seconds(&d, TG_GROUP_MATMUL, 1024, 896, &bound), 3.585e-3) && bound == TG_COST_MEMORY,
          "matmul %.9g bound %d", tg_cost_seconds(&d, TG_GROUP_MATMUL, 1024, 896, NULL), bound);
    /* A product of 1e4 FLOPs over 100 B: 20 ms of compute against 0.4 ms of memory. */
    CHECK(near(tg_cost_seconds(&d, TG_GROUP_MATMUL, 1e4, 100, &bound), 20.001e-3) && bound == TG_COST_COMPUTE,
          "compute-bound %.9g", tg_cost_seconds(&d, TG_GROUP_MATMUL, 1e4, 100, NULL));
    tg_cost_prediction pr;
    tg_err err = {{0}};
    REQUIRE(tg_cost_predict(&s.p, &d, &pr, &err) == 0, "%s", err.msg);
    /* add: 12000 B / 0.5e6 = 24 ms (its 1 ms of compute hidden). */
    CHECK(near(pr.ops[1].seconds, 24.001e-3) && pr.ops[1].bound == TG_COST_MEMORY, "add %.9g", pr.ops[1].seconds);
    CHECK(near(pr.phase_s[0], 3.585e-3) && near(pr.phase_s[1], 24.001e-3) && pr.phase_s[2] == 0, "phases %g %g %g",
          pr.phase_s[0], pr.phase_s[1], pr.phase_s[2]);
    CHECK(near(pr.step_s, 27.586e-3) && near(pr.serial_s, 27.586e-3), "step %.9g serial %.9g", pr.step_s, pr.serial_s);
    CHECK(pr.group_ops[TG_GROUP_MATMUL] == 1 && pr.group_ops[TG_GROUP_NORM] == 1 &&
              pr.group_flops[TG_GROUP_MATMUL] == 1024 && pr.group_bytes[TG_GROUP_NORM] == 12000,
          "group sums");
    tg_cost_prediction_free(&pr);
    /* Accumulating into c reads it too: 256 more bytes. Three micro-batches run the
     * forward and backward three times. */
    s.o[0].p.matmul.accumulate = 1;
    s.p.train.grad_accumulation = 3;
    CHECK(tg_cost_op_bytes(&s.p, 0) == 128 + 512 + 2 * 256, "accumulate: %g B", tg_cost_op_bytes(&s.p, 0));
    REQUIRE(tg_cost_predict(&s.p, &d, &pr, &err) == 0, "%s", err.msg);
    CHECK(near(pr.step_s, 3 * (1152 / 0.25e6 + 1e-6 + 24.001e-3)) && pr.micro_steps == 3, "accumulated step %.9g",
          pr.step_s);
    tg_cost_prediction_free(&pr);
}

TG_TEST(test_cost_model_bytes_departures) {
    tiny_plan s;
    begin(&s, 4);
    const int ids = add_tensor(&s, "ids", TG_I32, 6, 0), table = add_tensor(&s, "table", TG_F32, 100, 8);
    const int out = add_tensor(&s, "out", TG_F32, 6, 8), g = add_tensor(&s, "g", TG_F32, 1000, 0);
    const int h = add_tensor(&s, "h", TG_BF16, 400, 0);
    s.o[0] = tg_test_op(TG_OP_EMBEDDING); /* 6 rows of the 100-row table */
    s.o[0].in[0] = ids, s.o[0].in[1] = table, s.o[0].out[0] = out;
    s.o[0].p.embedding = (tg_embedding_params){.n = 6, .vocab = 100, .dim = 8, .padding_idx = -1};
    s.o[1] = tg_test_op(TG_OP_EMBEDDING_BWD); /* the 6 rows read, then written */
    s.o[1].in[0] = ids, s.o[1].in[1] = out, s.o[1].out[0] = table;
    s.o[1].p.embedding = s.o[0].p.embedding;
    s.o[2] = tg_test_op(TG_OP_ALL_REDUCE); /* ring over 4 replicas: 2 x 3/4 of 4000 B */
    s.o[2].in[0] = s.o[2].out[0] = g, s.o[2].p.count.n = 1000;
    s.o[3] = tg_test_op(TG_OP_ALL_GATHER); /* 3 slices of 100 bf16 */
    s.o[3].in[0] = s.o[3].out[0] = h, s.o[3].p.all_gather.slice = 100;
    s.p.n_ops = 4;
    CHECK(tg_cost_op_bytes(&s.p, 0) == 24 + 192 + 192, "embedding %g", tg_cost_op_bytes(&s.p, 0));
    CHECK(tg_cost_op_bytes(&s.p, 1) == 24 + 192 + 2 * 192, "embedding_bwd %g", tg_cost_op_bytes(&s.p, 1));
    CHECK(tg_cost_op_bytes(&s.p, 2) == 6000, "all_reduce %g", tg_cost_op_bytes(&s.p, 2));
    CHECK(tg_cost_op_bytes(&s.p, 3) == 600, "all_gather %g", tg_cost_op_bytes(&s.p, 3));
    /* The collective runs over the link: 6000 B / 2e6 B/s. */
    const tg_cost_device d = round_device(1);
    CHECK(near(tg_cost_seconds(&d, TG_GROUP_COMM, 1000, 6000, NULL), 3.001e-3), "all_reduce time");
}

/* Backward: ADD (1 ms), ALL_REDUCE (3 ms on the link), ADD (1 ms). Beside the compute the
 * sum runs from 1 ms to 4 ms, 2 ms past the backward's compute; on the CPU all in line. */
TG_TEST(test_cost_model_comm_overlap) {
    tiny_plan s;
    begin(&s, 2);
    const int x = add_tensor(&s, "x", TG_F32, 125, 0), g = add_tensor(&s, "g", TG_F32, 750, 0);
    for (int k = 0; k < 3; k++) {
        s.o[k] = tg_test_op(k == 1 ? TG_OP_ALL_REDUCE : TG_OP_ADD);
        s.o[k].phase = TG_PHASE_BACKWARD;
        s.o[k].in[0] = s.o[k].out[0] = k == 1 ? g : x;
        if (k != 1) s.o[k].in[1] = x;
        s.o[k].p.count.n = k == 1 ? 750 : 125;
    }
    s.p.n_ops = 3;
    s.p.phase_begin[1] = 0, s.p.phase_begin[2] = 3, s.p.phase_begin[3] = 3;
    tg_cost_device d = round_device(0);
    d.launch_s = d.graph_launch_s = 0, d.eff_bw[TG_GROUP_NORM] = 1.5, d.eff_bw[TG_GROUP_COMM] = 0.5;
    /* ADD: 1500 B / 1.5e6; ALL_REDUCE: 2 x 1/2 x 3000 B / (2e6 x 0.5). */
    tg_cost_prediction pr;
    tg_err err = {{0}};
    REQUIRE(tg_cost_predict(&s.p, &d, &pr, &err) == 0, "%s", err.msg);
    CHECK(near(pr.ops[0].seconds, 1e-3) && near(pr.ops[1].seconds, 3e-3), "op times %g %g", pr.ops[0].seconds,
          pr.ops[1].seconds);
    CHECK(near(pr.comm_s, 3e-3) && near(pr.comm_exposed_s, 2e-3) && near(pr.step_s, 4e-3) && near(pr.serial_s, 5e-3),
          "GPU: comm %g exposed %g step %g serial %g", pr.comm_s, pr.comm_exposed_s, pr.step_s, pr.serial_s);
    tg_cost_prediction_free(&pr);
    d.cpu = 1;
    REQUIRE(tg_cost_predict(&s.p, &d, &pr, &err) == 0, "%s", err.msg);
    CHECK(near(pr.comm_exposed_s, 3e-3) && near(pr.step_s, 5e-3), "CPU: exposed %g step %g", pr.comm_exposed_s,
          pr.step_s);
    tg_cost_prediction_free(&pr);
}

/* A compiled plan on a GPU: its AdamW beside the next forward (the update deferred), none
 * of it in an fp16 plan (whose update stays in the step) nor on the CPU. */
TG_TEST(test_cost_model_deferred_update) {
    tg_plan p;
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 1, &p), "compile");
    tg_cost_device d;
    tg_err err = {{0}};
    REQUIRE(tg_cost_device_builtin("h100", p.train.precision, 0, &d, &err) == 0, "%s", err.msg);
    tg_cost_prediction pr;
    REQUIRE(tg_cost_predict(&p, &d, &pr, &err) == 0, "%s", err.msg);
    const double u = pr.ops[p.n_ops - 1].seconds;
    CHECK(tg_op_is_update(p.ops[p.n_ops - 1].kind) && pr.update_s == u, "update %g of op %g", pr.update_s, u);
    CHECK(pr.update_hidden_s > 0 && pr.update_hidden_s <= u, "hidden %g of %g", pr.update_hidden_s, u);
    CHECK(near(pr.step_s, pr.serial_s - pr.update_hidden_s), "step %.9g serial %.9g hidden %.9g", pr.step_s,
          pr.serial_s, pr.update_hidden_s);
    tg_cost_prediction_free(&pr);
    d.cpu = 1;
    REQUIRE(tg_cost_predict(&p, &d, &pr, &err) == 0, "%s", err.msg);
    CHECK(pr.update_s == 0 && pr.step_s == pr.serial_s, "CPU: update %g", pr.update_s);
    tg_cost_prediction_free(&pr);
    tg_plan_free(&p);
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_FP16, 1, &p), "compile fp16");
    d.cpu = 0;
    REQUIRE(tg_cost_predict(&p, &d, &pr, &err) == 0, "%s", err.msg);
    CHECK(pr.update_s == 0 && near(pr.step_s, pr.serial_s), "fp16: update %g", pr.update_s);
    tg_cost_prediction_free(&pr);
    tg_plan_free(&p);
}

/* Sets every parameter of an op to 4 (integers) or 0.5 (reals). */
static void set_i(void *ctx, const char *display, int64_t *v) { *v = 4; }
static void set_f(void *ctx, const char *display, float *v) { *v = 0.5f; }

TG_TEST(test_cost_model_every_op_kind) {
    tiny_plan s;
    begin(&s, 2);
    /* One tensor of 64 elements per dtype a slot may take. */
    const int f32 = add_tensor(&s, "f32", TG_F32, 64, 0), i32 = add_tensor(&s, "i32", TG_I32, 64, 0);
    s.p.n_ops = 1;
    const tg_param_visitor v = {NULL, set_i, set_f};
    tg_cost_device devs[3];
    tg_err err = {{0}};
    REQUIRE(tg_cost_device_builtin("h100", TG_PREC_BF16, 0, &devs[0], &err) == 0 &&
                tg_cost_device_builtin("h200", TG_PREC_FP32, 1, &devs[1], &err) == 0 &&
                tg_cost_device_builtin("cpu", TG_PREC_FP32, 0, &devs[2], &err) == 0,
            "%s", err.msg);
    CHECK(devs[0].peak_flops == 989.4e12 && devs[0].peak_bw == 3350e9 && devs[1].peak_flops == 494.7e12 &&
              devs[1].peak_bw == 4800e9 && !devs[0].calibrated,
          "datasheet peaks");
    for (int k = 0; k < TG_OP_COUNT; k++) {
        const tg_op_info *info = tg_op_info_of(k);
        s.o[0] = tg_test_op(k);
        for (int i = 0; info->inputs[i]; i++)
            if (info->inputs[i] != '-') s.o[0].in[i] = info->inputs[i] == 'I' || info->inputs[i] == 'i' ? i32 : f32;
        for (int i = 0; info->outputs[i]; i++)
            if (info->outputs[i] != '-') s.o[0].out[i] = info->outputs[i] == 'I' ? i32 : f32;
        tg_op_params_visit(k, &s.o[0].p, &v);
        const double flops = tg_cost_op_flops(&s.p, 0), bytes = tg_cost_op_bytes(&s.p, 0);
        const char *formula = tg_cost_flops_formula(k);
        REQUIRE(formula, "%s: no FLOPs row", info->name);
        CHECK(isfinite(flops) && (strcmp(formula, "none") ? flops > 0 : flops == 0), "%s: %g FLOPs (formula %s)",
              info->name, flops, formula);
        CHECK(isfinite(bytes) && bytes > 0, "%s: %g bytes", info->name, bytes);
        for (int d = 0; d < 3; d++) {
            const double t = tg_cost_seconds(&devs[d], tg_op_group_of(k), flops, bytes, NULL);
            CHECK(isfinite(t) && t > devs[d].launch_s, "%s on %s: %g s", info->name, devs[d].key, t);
        }
    }
    CHECK(!tg_cost_flops_formula(-1) && !tg_cost_flops_formula(TG_OP_COUNT), "kinds outside the enum");
    CHECK(tg_cost_device_builtin("a800", TG_PREC_BF16, 0, &devs[0], &err) == -1 &&
              strstr(err.msg, "no cost description for device 'a800' (known: cpu, h100-pcie, h100-nvl, h100,"),
          "unknown device: %s", err.msg);
}

/* Samples made by a known device: the fit finds its launch and factors again. */
TG_TEST(test_cost_model_fit_recovers_factors) {
    tg_cost_device truth = round_device(0);
    truth.eff_flops[TG_GROUP_MATMUL] = 0.37, truth.eff_bw[TG_GROUP_MATMUL] = 0.61;
    truth.eff_flops[TG_GROUP_NORM] = 0.05, truth.eff_bw[TG_GROUP_NORM] = 0.8;
    truth.launch_s = 4e-6;
    tg_cost_sample s[64];
    int n = 0;
    for (int k = 0; k < 24; k++) { /* products, every other one memory-bound */
        const double bytes = 4e3 * (1 + k), flops = k % 2 ? bytes / 10 : 1e3 * (1 + k) * (1 + k);
        s[n++] = (tg_cost_sample){.group = TG_GROUP_MATMUL, .flops = flops, .bytes = bytes,
                                  .seconds = tg_cost_seconds(&truth, TG_GROUP_MATMUL, flops, bytes, NULL)};
    }
    for (int k = 0; k < 24; k++) { /* elementwise: some with heavy arithmetic */
        const double bytes = 1e3 * (1 + k), flops = k % 3 == 0 ? 40 * bytes : bytes / 100;
        s[n++] = (tg_cost_sample){.group = TG_GROUP_NORM, .flops = flops, .bytes = bytes,
                                  .seconds = tg_cost_seconds(&truth, TG_GROUP_NORM, flops, bytes, NULL)};
    }
    for (int k = 0; k < 6; k++) s[n++] = (tg_cost_sample){.group = TG_GROUP_MEMORY, .seconds = truth.launch_s};
    tg_cost_device d = round_device(0);
    int per[TG_GROUP_COUNT];
    tg_err err = {{0}};
    REQUIRE(tg_cost_fit(s, n, 0, &d, per, &err) == 0, "%s", err.msg);
    CHECK(d.launch_s == 4e-6 && d.calibrated, "launch %g", d.launch_s);
    CHECK(per[TG_GROUP_MATMUL] == 24 && per[TG_GROUP_NORM] == 24 && per[TG_GROUP_MEMORY] == 6 && per[TG_GROUP_LOSS] == 0,
          "samples per group");
    for (int g = 0; g < TG_GROUP_COUNT; g++) {
        if (g != TG_GROUP_MATMUL && g != TG_GROUP_NORM) continue;
        CHECK(fabs(d.eff_flops[g] / truth.eff_flops[g] - 1) < 0.01 && fabs(d.eff_bw[g] / truth.eff_bw[g] - 1) < 0.01,
              "%s: fitted %g %g, truth %g %g", tg_op_group_name(g), d.eff_flops[g], d.eff_bw[g], truth.eff_flops[g],
              truth.eff_bw[g]);
    }
    CHECK(d.eff_flops[TG_GROUP_LOSS] == 1 && d.eff_bw[TG_GROUP_LOSS] == 1, "a group without samples keeps its factors");
    /* With fit_peaks the peaks become what the samples reached (90th percentile). */
    tg_cost_device e = round_device(1);
    REQUIRE(tg_cost_fit(s, n, 1, &e, per, &err) == 0, "%s", err.msg);
    CHECK(e.peak_flops > 0 && e.peak_flops <= 0.37e6 * 1.0001 && e.peak_bw > 0 && e.peak_bw <= 0.8e6 * 1.0001,
          "measured peaks %g %g", e.peak_flops, e.peak_bw);
    CHECK(tg_cost_fit(s, 0, 0, &d, per, &err) == -1 && strstr(err.msg, "no measured ops"), "no samples: %s", err.msg);
}

/* An attention op of B 2, H 4, T, head dim dh, p dropout, on storage dtype (q, k, v packed). */
static int attention_op(tiny_plan *s, int kind, int dtype, int64_t t, int64_t dh, float p, int causal) {
    const int qkv = add_tensor(s, "qkv", dtype, 2 * t, 3 * 4 * dh), out = add_tensor(s, "o", dtype, 2 * t, 4 * dh);
    const int o = s->p.n_ops++;
    s->o[o] = tg_test_op(kind);
    s->o[o].in[0] = kind == TG_OP_ATTENTION ? qkv : out, s->o[o].out[0] = kind == TG_OP_ATTENTION ? out : qkv;
    s->o[o].p.attention = (tg_attention_params){.b = 2, .h = 4, .t = t, .head_dim = dh, .packed = 1, .p = p,
                                                .causal = causal, .scale = 1};
    return o;
}

/* cuDNN's rule (16-bit, head dim 64 or 128, no dropout) where TUNEGRAPH_ATTENTION leaves it
 * on; each backend's factors, its row-length term and the causal factor, exactly. */
TG_TEST(test_cost_model_attention_backends) {
    tiny_plan s;
    begin(&s, 1);
    const int fast = attention_op(&s, TG_OP_ATTENTION, TG_BF16, 256, 64, 0, 1);
    const int dropout = attention_op(&s, TG_OP_ATTENTION_BWD, TG_BF16, 256, 64, 0.1f, 0);
    const int fp32 = attention_op(&s, TG_OP_ATTENTION, TG_F32, 256, 128, 0, 0);
    const int dh96 = attention_op(&s, TG_OP_ATTENTION, TG_F16, 256, 96, 0, 0);
    const int bwd128 = attention_op(&s, TG_OP_ATTENTION_BWD, TG_F16, 256, 128, 0, 0);
    tg_cost_device d = round_device(0);
    d.cudnn_attention = 1;
    const int want[] = {TG_COST_ATTENTION_CUDNN, TG_COST_ATTENTION_OWN, TG_COST_ATTENTION_OWN, TG_COST_ATTENTION_OWN,
                        TG_COST_ATTENTION_CUDNN};
    const int ops[] = {fast, dropout, fp32, dh96, bwd128};
    for (int k = 0; k < 5; k++) {
        const tg_cost_sample x = tg_cost_op_sample(&s.p, ops[k], &d);
        CHECK(x.backend == want[k] && x.group == TG_GROUP_ATTENTION && x.work == 256.0 * s.o[ops[k]].p.attention.head_dim,
              "op %d: backend %d work %g", k, x.backend, x.work);
    }
    d.cudnn_attention = 0;
    CHECK(tg_cost_op_sample(&s.p, fast, &d).backend == TG_COST_ATTENTION_OWN, "TUNEGRAPH_ATTENTION=own");
    /* The built-in description follows TUNEGRAPH_ATTENTION as the executor does. */
    tg_err err = {{0}};
    tg_cost_device h;
    setenv("TUNEGRAPH_ATTENTION", "own", 1);
    REQUIRE(tg_cost_device_builtin("h100", TG_PREC_BF16, 0, &h, &err) == 0, "%s", err.msg);
    CHECK(!h.cudnn_attention, "own: cuDNN off");
    setenv("TUNEGRAPH_ATTENTION", "auto", 1);
    REQUIRE(tg_cost_device_builtin("h100", TG_PREC_BF16, 0, &h, &err) == 0, "%s", err.msg);
    CHECK(h.cudnn_attention && h.graph_launch_s == h.launch_s && h.update_overlap == 1, "auto: cuDNN on");
    unsetenv("TUNEGRAPH_ATTENTION");
    /* cuDNN forward 0.5 of the peak at w = work_half = 256 x 64 (so 0.25), causal x 0.8:
     * FLOPs 4 B H T^2 Dh / 2 = 16.777216e6 at 1e6 x 0.2 = 83.88608 s, launch 1 us. */
    d.cudnn_attention = 1;
    d.attention[TG_COST_ATTENTION_CUDNN] = (tg_cost_attention){0.5, 0.3, 256.0 * 64, 0.8, 0};
    const tg_cost_sample x = tg_cost_op_sample(&s.p, fast, &d);
    CHECK(x.flops == 4.0 * 2 * 4 * 256 * 256 * 64 / 2 && x.causal, "flops %g", x.flops);
    int bound = -1;
    CHECK(near(tg_cost_sample_seconds(&d, &x, &bound), x.flops / (1e6 * 0.5 * 0.5 * 0.8) + 1e-6) &&
              bound == TG_COST_COMPUTE,
          "cuDNN forward %.9g s", tg_cost_sample_seconds(&d, &x, NULL));
    /* The own kernels' backward: eff_backward, no row term. */
    d.attention[TG_COST_ATTENTION_OWN] = (tg_cost_attention){0.9, 0.1, 0, 1, 0};
    const tg_cost_sample y = tg_cost_op_sample(&s.p, dropout, &d);
    CHECK(near(tg_cost_sample_seconds(&d, &y, NULL), y.flops / (1e6 * 0.1) + 1e-6), "own backward %.9g s",
          tg_cost_sample_seconds(&d, &y, NULL));
    /* The CPU: one kernel, the attention group's pair. */
    d.cpu = 1;
    CHECK(near(tg_cost_sample_seconds(&d, &y, NULL), tg_cost_seconds(&d, TG_GROUP_ATTENTION, y.flops, y.bytes, NULL)),
          "CPU attention");
}

/* A matmul's efficiency grows with its FLOPs: eff_flops x F / (F + half). */
TG_TEST(test_cost_model_matmul_size) {
    tg_cost_device d = round_device(0);
    d.matmul_flops_half = 1e3;
    const tg_cost_sample small = {.group = TG_GROUP_MATMUL, .flops = 1e3, .bytes = 1},
                         large = {.group = TG_GROUP_MATMUL, .flops = 1e6, .bytes = 1};
    /* 1e3 FLOPs at 0.5 x 1/2 of 1e6; 1e6 FLOPs at 0.5 x 1e6/1.001e6. */
    CHECK(near(tg_cost_sample_seconds(&d, &small, NULL), 1e3 / (1e6 * 0.25) + 1e-6), "small %.9g",
          tg_cost_sample_seconds(&d, &small, NULL));
    CHECK(near(tg_cost_sample_seconds(&d, &large, NULL), (1e6 + 1e3) / (1e6 * 0.5) + 1e-6), "large %.9g",
          tg_cost_sample_seconds(&d, &large, NULL));
    d.matmul_flops_half = 0;
    CHECK(near(tg_cost_sample_seconds(&d, &small, NULL), tg_cost_seconds(&d, TG_GROUP_MATMUL, 1e3, 1, NULL)), "none");
}

/* Samples made by a known GPU with the shape terms: the fit finds the matmul's half-point
 * and each attention backend's factors and row term again (on their grids). */
TG_TEST(test_cost_model_fit_recovers_shape_terms) {
    tg_cost_device truth = round_device(0);
    truth.peak_flops = 1e12, truth.peak_bw = 1e10, truth.launch_s = 2e-6;
    truth.eff_flops[TG_GROUP_MATMUL] = 0.7, truth.eff_bw[TG_GROUP_MATMUL] = 0.8;
    truth.matmul_flops_half = 1e7 * pow(1e5, 8 / 20.0); /* on the fit's grid, near 1e9 */
    truth.eff_bw[TG_GROUP_ATTENTION] = 0.5;
    truth.attention[TG_COST_ATTENTION_CUDNN] = (tg_cost_attention){0.6, 0.4, 1e2 * pow(1e5, 9 / 15.0), 1, 0};
    truth.attention[TG_COST_ATTENTION_OWN] = (tg_cost_attention){0.1, 0.12, 0, 0.8, 0};
    tg_cost_sample s[128];
    int n = 0;
    for (int k = 0; k < 40; k++) { /* products from 1e7 to 1e12 FLOPs, a few memory-bound */
        tg_cost_sample x = {.group = TG_GROUP_MATMUL, .flops = 1e7 * pow(1e5, k / 39.0)};
        x.bytes = k % 5 == 0 ? x.flops : x.flops / 500;
        x.seconds = tg_cost_sample_seconds(&truth, &x, NULL);
        s[n++] = x;
    }
    for (int k = 0; k < 32; k++) { /* attention: both backends, both directions, rows 1e3 to 1e6 */
        tg_cost_sample x = {.group = TG_GROUP_ATTENTION, .attention = 1 + k % 2, .backend = k / 16, .causal = k / 4 % 2};
        x.work = 1e3 * pow(1e3, (k % 8) / 7.0);
        x.flops = 1e6 * x.work, x.bytes = 1e3 * x.work;
        x.seconds = tg_cost_sample_seconds(&truth, &x, NULL);
        s[n++] = x;
    }
    for (int k = 0; k < 6; k++) /* empty ops: the launch term */
        s[n++] = (tg_cost_sample){.group = TG_GROUP_MEMORY, .seconds = truth.launch_s};
    tg_cost_device d = round_device(0);
    d.peak_flops = truth.peak_flops, d.peak_bw = truth.peak_bw;
    int per[TG_GROUP_COUNT];
    tg_err err = {{0}};
    REQUIRE(tg_cost_fit(s, n, 0, &d, per, &err) == 0, "%s", err.msg);
    CHECK(fabs(d.matmul_flops_half / truth.matmul_flops_half - 1) < 1e-6 && fabs(d.eff_flops[TG_GROUP_MATMUL] / 0.7 - 1) < 0.01 &&
              fabs(d.eff_bw[TG_GROUP_MATMUL] / 0.8 - 1) < 0.01,
          "matmul: half %g, %g %g", d.matmul_flops_half, d.eff_flops[TG_GROUP_MATMUL], d.eff_bw[TG_GROUP_MATMUL]);
    for (int b = 0; b < TG_COST_ATTENTION_BACKENDS; b++) {
        const tg_cost_attention *a = &d.attention[b], *t = &truth.attention[b];
        CHECK(fabs(a->eff_forward / t->eff_forward - 1) < 0.01 && fabs(a->eff_backward / t->eff_backward - 1) < 0.01 &&
                  fabs(a->work_half - t->work_half) <= 1e-6 * t->work_half && fabs(a->causal_factor - t->causal_factor) < 1e-9 &&
                  a->samples == 16,
              "backend %d: %g %g %g %g (%d), truth %g %g %g %g", b, a->eff_forward, a->eff_backward, a->work_half,
              a->causal_factor, a->samples, t->eff_forward, t->eff_backward, t->work_half, t->causal_factor);
    }
    CHECK(per[TG_GROUP_MATMUL] == 40 && per[TG_GROUP_ATTENTION] == 32, "samples per group");
}

/* The captured step: each op's launch term the graph's, and the deferred update's hiding
 * scaled; tg_cost_fit_step finds both again from steps a known device predicts. */
TG_TEST(test_cost_model_captured_step) {
    tg_plan plans[2];
    REQUIRE(tg_test_compile_preset("tiny-bert", TG_TASK_CLASSIFY, TG_PREC_BF16, 1, &plans[0]), "compile");
    REQUIRE(tg_test_compile_preset("tiny-gpt2", TG_TASK_LM, TG_PREC_BF16, 1, &plans[1]), "compile");
    tg_cost_device truth;
    tg_err err = {{0}};
    REQUIRE(tg_cost_device_builtin("h100", TG_PREC_BF16, 0, &truth, &err) == 0, "%s", err.msg);
    truth.launch_s = 8e-6;
    tg_cost_prediction whole, graph;
    truth.graph_launch_s = truth.launch_s;
    REQUIRE(tg_cost_predict(&plans[0], &truth, &whole, &err) == 0, "%s", err.msg);
    truth.graph_launch_s = 2e-6, truth.update_overlap = 0.5;
    REQUIRE(tg_cost_predict(&plans[0], &truth, &graph, &err) == 0, "%s", err.msg);
    /* The ops' own times stay those launched one by one; the step loses 6 us an op and keeps
     * half of the update's hiding (computed with the graph's op times). */
    CHECK(near(whole.serial_s, graph.serial_s) && graph.update_hidden_s > 0 && graph.step_s < whole.step_s,
          "serial %g %g, step %g %g", whole.serial_s, graph.serial_s, whole.step_s, graph.step_s);
    CHECK(near(graph.step_s, graph.serial_s - plans[0].n_ops * 6e-6 - graph.update_hidden_s),
          "step %.9g, serial %.9g, %d ops, hidden %.9g", graph.step_s, graph.serial_s, plans[0].n_ops,
          graph.update_hidden_s);
    tg_cost_prediction_free(&whole);
    tg_cost_prediction_free(&graph);
    double steps[2];
    const tg_plan *of[2] = {&plans[0], &plans[1]};
    for (int k = 0; k < 2; k++) {
        tg_cost_prediction p;
        REQUIRE(tg_cost_predict(&plans[k], &truth, &p, &err) == 0, "%s", err.msg);
        steps[k] = p.step_s;
        tg_cost_prediction_free(&p);
    }
    tg_cost_device d = truth;
    d.graph_launch_s = d.launch_s, d.update_overlap = 1;
    REQUIRE(tg_cost_fit_step(of, steps, 2, &d, &err) == 0, "%s", err.msg);
    CHECK(near(d.graph_launch_s, 2e-6) && near(d.update_overlap, 0.5), "fitted %g s, overlap %g", d.graph_launch_s,
          d.update_overlap);
    CHECK(tg_cost_fit_step(of, steps, 0, &d, &err) == -1 && strstr(err.msg, "no measured steps"), "%s", err.msg);
    for (int k = 0; k < 2; k++) tg_plan_free(&plans[k]);
}
