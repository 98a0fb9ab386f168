/* The graph under construction (compiler/graph.c): its failure messages compared whole
 * (every dim of a tensor past one pool, with and without a job; out of memory with and
 * without a model; size failures without a job; an op its check refuses), and the fields
 * of parameters, frozen parameters, buffers, packs and ops as they are made. */
#include <stdio.h>
#include <string.h>

#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/limits.h"
#include "models/model_config.h"
#include "tests/harness.h"

static tg_model_config small_cfg(void) {
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.source, sizeof cfg.source, "tiny-test");
    cfg.layers = 2, cfg.hidden = 8, cfg.intermediate = 16, cfg.vocab_size = 30;
    cfg.initializer_range = 0.25f;
    return cfg;
}

TG_TEST(test_compiler_graph_messages_whole) {
    /* Four dims past one pool, the largest digits each: every dim listed. */
    const int64_t dims4[4] = {INT64_MAX, 1, 4611686018427387904LL, 3};
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, NULL, NULL, &err);
    CHECK(tg_graph_tensor(&g, "w", TG_F32, TG_POOL_PARAMS, 4, dims4) == -1 &&
              !strcmp(err.msg, "the graph: tensor w [9223372036854775807, 1, 4611686018427387904, 3] is more than 2^64 "
                               "bytes, more than the 16.0 TiB one memory pool may hold"),
          "'%s'", err.msg);
    tg_graph_free(&g);
    /* Just past the limit, with a job and a model: the batch names the activations. */
    tg_model_config cfg = small_cfg();
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.path, sizeof job.path, "j.job");
    job.batch = 4, job.seq = 16, job.key_line[TG_JOB_BATCH] = 3;
    const int64_t just_over[2] = {(int64_t)1 << 21, ((int64_t)1 << 21) + 1}; /* 16 TiB + 8 MiB */
    const int64_t at_limit[2] = {(int64_t)1 << 21, (int64_t)1 << 21};       /* 16 TiB exactly */
    memset(&err, 0, sizeof err);
    tg_graph_init(&g, &cfg, &job, &err);
    CHECK(tg_graph_tensor(&g, "act", TG_F32, TG_POOL_ACTIVATIONS, 2, at_limit) == 0, "16 TiB fits: %s", err.msg);
    CHECK(tg_graph_tensor(&g, "act2", TG_F32, TG_POOL_ACTIVATIONS, 2, just_over) == -1 &&
              !strcmp(err.msg, "j.job:3: key 'batch': batch 4 x seq 16 with model 'tiny-test' (num_hidden_layers 2, "
                               "hidden_size 8, intermediate_size 16, vocab_size 30): tensor act2 [2097152, 2097153] is "
                               "16.0 TiB, more than the 16.0 TiB one memory pool may hold"),
          "'%s'", err.msg);
    tg_graph_free(&g);

    /* Out of memory names the model (or '?') and the counts so far. */
    memset(&err, 0, sizeof err);
    tg_graph_init(&g, &cfg, &job, &err);
    tg_act(&g, "a", 1, 2, 0, 0, 0), tg_act(&g, "b", 1, 2, 0, 0, 0);
    CHECK(tg_graph_out_of_memory(&g) == -1 && g.failed &&
              !strcmp(err.msg, "out of memory compiling model 'tiny-test' (at 2 tensors and 0 ops)"),
          "'%s'", err.msg);
    tg_graph_free(&g);
    memset(&err, 0, sizeof err);
    tg_graph_init(&g, NULL, NULL, &err);
    CHECK(tg_graph_out_of_memory(&g) == -1 && !strcmp(err.msg, "out of memory compiling model '?' (at 0 tensors and 0 ops)"),
          "'%s'", err.msg);
    tg_graph_free(&g);
    /* A size failure without a job is the message alone; with one, where the key was set. */
    memset(&err, 0, sizeof err);
    tg_graph_init(&g, NULL, NULL, &err);
    CHECK(tg_graph_size_fail(&g, TG_JOB_SEQ, "too long by %d", 3) == -1 && !strcmp(err.msg, "too long by 3"), "'%s'",
          err.msg);
    CHECK(g.failed && tg_graph_job_fail(&g, TG_JOB_SEQ, "later") == -1 && tg_graph_out_of_memory(&g) == -1 &&
              !strcmp(err.msg, "too long by 3"),
          "after a size failure: '%s'", err.msg);
    tg_graph_free(&g);
    memset(&err, 0, sizeof err);
    tg_graph_init(&g, &cfg, &job, &err);
    CHECK(tg_graph_size_fail(&g, TG_JOB_SEQ, "too long by %d", 3) == -1 &&
              !strcmp(err.msg, "j.job (default): key 'seq': too long by 3"),
          "'%s'", err.msg);
    tg_graph_free(&g);
    memset(&err, 0, sizeof err);
    tg_graph_init(&g, &cfg, &job, &err);
    CHECK(tg_graph_job_fail(&g, TG_JOB_BATCH, "batch %d", 4) == -1 && !strcmp(err.msg, "j.job:3: key 'batch': batch 4"),
          "'%s'", err.msg);
    /* Each kind of failure fails the graph: what follows neither runs nor replaces the message. */
    CHECK(g.failed && tg_graph_size_fail(&g, TG_JOB_SEQ, "later") == -1 && tg_act(&g, "late", 1, 2, 0, 0, 0) == -1 &&
              !strcmp(err.msg, "j.job:3: key 'batch': batch 4"),
          "after a job failure: '%s'", err.msg);
    tg_graph_free(&g);
    /* An op refused by its check: its index, kind and why. */
    memset(&err, 0, sizeof err);
    tg_graph_init(&g, NULL, NULL, &err);
    int a = tg_act(&g, "a", 1, 3, 0, 0, 0), b = tg_act(&g, "b", 1, 4, 0, 0, 0), c = tg_act(&g, "c", 1, 3, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = a, s.in[1] = a, s.out[0] = c, s.p.count.n = 3;
    REQUIRE(tg_graph_op(&g, &s) == 0, "%s", err.msg);
    s.in[1] = b;
    CHECK(tg_graph_op(&g, &s) == -1 && g.n_ops == 1 && !strcmp(err.msg, "internal compiler error: op 1 (add): in[1]: size != n"),
          "'%s'", err.msg);
    tg_graph_free(&g);
}

TG_TEST(test_compiler_graph_messages_fields) {
    tg_model_config cfg = small_cfg();
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.path, sizeof job.path, "j.job");
    snprintf(job.freeze, sizeof job.freeze, "enc.*, *.bias");
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, &cfg, &job, &err);
    REQUIRE(g.n_freeze == 2 && g.io.labels == -1 && g.io.grads_all == -1, "%d patterns", g.n_freeze);
    int w = tg_param(&g, "dec.weight", 2, 2, 3, TG_INIT_NORMAL, 0);
    int nb = tg_param(&g, "dec.norm", 1, 3, 0, TG_INIT_ONES, 1);
    int fw = tg_param(&g, "enc.weight", 2, 2, 3, TG_INIT_NORMAL, 0);
    int fb = tg_param(&g, "enc.bias", 1, 3, 0, TG_INIT_ZEROS, 1); /* both patterns match */
    int buf = tg_buffer(&g, "pos", TG_I32, 1, 5, 0, TG_INIT_ZEROS, 1), tmp = tg_buffer(&g, "tmp", TG_F32, 1, 5, 0, TG_INIT_ONES, 0);
    REQUIRE(!g.failed, "%s", err.msg);
    const tg_tensor *t = g.tensors;
    CHECK(t[w].pool == TG_POOL_PARAMS && t[w].flags == TG_TENSOR_PARAM && t[w].init == TG_INIT_NORMAL &&
              t[w].init_std == 0.25f && t[w].bytes == 24 && t[w].ndim == 2 && t[w].shape[1] == 3,
          "trainable: pool %d flags %#x std %g", t[w].pool, t[w].flags, (double)t[w].init_std);
    CHECK(t[nb].pool == TG_POOL_PARAMS && t[nb].flags == (TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY) && t[nb].init_std == 0.0f &&
              t[nb].ndim == 1 && t[nb].bytes == 12,
          "no decay: flags %#x", t[nb].flags);
    CHECK(t[fw].pool == TG_POOL_FROZEN && t[fw].flags == TG_TENSOR_FROZEN && t[fw].init_std == 0.25f, "frozen: pool %d flags %#x",
          t[fw].pool, t[fw].flags);
    CHECK(t[fb].pool == TG_POOL_FROZEN && t[fb].flags == TG_TENSOR_FROZEN && t[fb].init == TG_INIT_ZEROS, "frozen bias: %#x",
          t[fb].flags);
    CHECK(g.freeze_hits[0] == 2 && g.freeze_hits[1] == 1, "hits %d %d", g.freeze_hits[0], g.freeze_hits[1]);
    CHECK(t[buf].pool == TG_POOL_BUFFERS && t[buf].dtype == TG_I32 && t[buf].flags == (TG_TENSOR_BUFFER | TG_TENSOR_PERSISTENT) &&
              t[buf].init == TG_INIT_ZEROS && t[buf].bytes == 20,
          "buffer: flags %#x", t[buf].flags);
    CHECK(t[tmp].flags == TG_TENSOR_BUFFER && t[tmp].init == TG_INIT_ONES, "scratch buffer: flags %#x", t[tmp].flags);
    CHECK(t[w].first_use == -1 && t[w].last_use == -1 && t[w].grad == -1 && t[w].master == -1 && t[w].group == -1 &&
              t[w].offset == 0,
          "fresh fields");
    /* A frozen pack: the frozen pool, the members' flags, the first member its master. */
    int m[2] = {fw, fb};
    int pv = tg_param_pack(&g, "enc.pack", m, 1, 2, 2, 3);
    REQUIRE(pv >= 0, "%s", err.msg);
    CHECK(g.tensors[pv].pool == TG_POOL_FROZEN && g.tensors[pv].flags == (TG_TENSOR_VIEW | TG_TENSOR_FROZEN) &&
              g.tensors[pv].master == fw && g.tensors[fw].group == pv && g.tensors[fb].group == -1,
          "frozen pack: pool %d flags %#x", g.tensors[pv].pool, g.tensors[pv].flags);
    int m2[2] = {w, nb};
    CHECK(tg_param_pack(&g, "dec.pack", m2, 2, 1, 9, 0) >= 0 &&
              g.tensors[g.n_tensors - 1].flags == (TG_TENSOR_VIEW | TG_TENSOR_PARAM) && g.tensors[nb].group == g.n_tensors - 1,
          "a trainable pack takes its first member's flags: %#x", g.tensors[g.n_tensors - 1].flags);
    /* An op takes the graph's phase, its slots and its parameters. */
    int x = tg_act(&g, "x", 1, 3, 0, 0, 0), y = tg_act(&g, "y", 1, 3, 0, 0, 0);
    g.phase = TG_PHASE_BACKWARD;
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = x, s.in[1] = nb, s.out[0] = y, s.p.count.n = 3;
    int o = tg_graph_op(&g, &s);
    REQUIRE(o == 0, "%s", err.msg);
    const tg_op *op = &g.ops[0];
    int slots = op->in[0] == x && op->in[1] == nb && op->out[0] == y;
    for (int k = 2; k < TG_OP_MAX_IN; k++) slots &= op->in[k] == -1;
    for (int k = 1; k < TG_OP_MAX_OUT; k++) slots &= op->out[k] == -1;
    CHECK(slots && op->kind == TG_OP_ADD && op->phase == TG_PHASE_BACKWARD && op->p.count.n == 3, "op fields");
    tg_graph_free(&g);
}
