/* compiler/precision.c on two compiled plans: a bf16 masked-LM with its tied word table
 * and a packed attention group frozen (the table, read by the embedding and the decoder
 * matmul, gets one bf16 copy; the packed group, read by matmuls alone, becomes bf16 itself
 * and is not copied), and fp16 under ZeRO-1 (each replica's slice of the fp16 copies is
 * shared by an ALL_GATHER, as bf16's are). */
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "tests/harness.h"

static int named(const tg_plan *p, const char *name) {
    for (int t = 0; t < p->n_tensors; t++)
        if (!strcmp(p->tensors[t].name, name)) return t;
    return -1;
}

static int compile_text(const char *text, tg_plan *plan) {
    tg_job job;
    tg_err err = {{0}};
    return CHECK(tg_job_parse_text(text, "job.txt", "", NULL, 0, &job, &err) == 0 && tg_compile(&job, plan, &err) == 0,
                 "%s", err.msg);
}

TG_TEST(test_compiler_precision_frozen_table_and_packed_group) {
    tg_plan p;
    if (!compile_text("model = tiny-bert\ntask = mlm\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nprecision = bf16\n"
                      "freeze = bert.embeddings.word_embeddings.*, bert.encoder.layer.0.attention.self.*\n",
                      &p))
        return;
    const int table = named(&p, "bert.embeddings.word_embeddings.weight");
    const int copy = named(&p, "bf16.bert.embeddings.word_embeddings.weight");
    const int qkv = named(&p, "bert.encoder.layer.0.attention.self.qkv.weight");
    REQUIRE(table >= 0 && copy >= 0 && qkv >= 0, "tensors: table %d, copy %d, qkv %d", table, copy, qkv);
    const tg_tensor *c = &p.tensors[copy], *v = &p.tensors[qkv];
    CHECK(p.tensors[table].dtype == TG_F32 && c->dtype == TG_BF16 && c->pool == TG_POOL_FROZEN && c->master == table &&
              (c->flags & (TG_TENSOR_FROZEN | TG_TENSOR_PARAM_COPY)) == (TG_TENSOR_FROZEN | TG_TENSOR_PARAM_COPY),
          "the table's copy: dtype %d, pool %d, master %d, flags %#x", c->dtype, c->pool, c->master, (unsigned)c->flags);
    CHECK(v->dtype == TG_BF16 && v->pool == TG_POOL_FROZEN && named(&p, "bf16.bert.encoder.layer.0.attention.self.qkv.weight") < 0,
          "the packed view: dtype %d, pool %d, copied %d", v->dtype, v->pool,
          named(&p, "bf16.bert.encoder.layer.0.attention.self.qkv.weight") >= 0);
    int copies = 0;
    for (int t = 0; t < p.n_tensors; t++)
        copies += p.tensors[t].pool == TG_POOL_FROZEN && (p.tensors[t].flags & TG_TENSOR_PARAM_COPY) != 0;
    CHECK(copies == 1, "%d copies in the frozen pool, want the table's alone", copies);
    tg_plan_free(&p);
}

TG_TEST(test_compiler_precision_fp16_zero_slices_gathered) {
    tg_plan p;
    if (!compile_text("model = tiny-bert\nbatch = 2\nseq = 8\nsteps = 1\ntrain_data = x\nprecision = fp16\n"
                      "data_parallel = 2\nzero_stage = 1\n",
                      &p))
        return;
    const int slices = named(&p, "params_f16.slices");
    REQUIRE(slices >= 0 && named(&p, "params_bf16.slices") < 0, "params_f16.slices %d", slices);
    const tg_tensor *s = &p.tensors[slices];
    int gathers = 0;
    for (int o = 0; o < p.n_ops; o++)
        gathers += p.ops[o].kind == TG_OP_ALL_GATHER && p.ops[o].in[0] == slices && p.ops[o].out[0] == slices;
    CHECK(s->dtype == TG_F16 && s->pool == TG_POOL_PARAMS_BF16 && (s->flags & TG_TENSOR_VIEW) && gathers == 1,
          "params_f16.slices: dtype %d, pool %d, flags %#x, %d gathers", s->dtype, s->pool, (unsigned)s->flags, gathers);
    tg_plan_free(&p);
}
