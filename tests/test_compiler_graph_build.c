/* The graph under construction (compiler/graph.c) built by hand: tensor shapes and names
 * refused, sizes past one pool (with and without a job and a model), the table limits,
 * buffers, packed parameter groups and their refusals, freeze patterns that match nothing,
 * ops that fail their check, and the first error kept over later ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "compiler/grad_state.h"
#include "compiler/graph.h"
#include "compiler/limits.h"
#include "models/model_config.h"
#include "tests/harness.h"

static tg_job job_named(const char *freeze) {
    tg_job job;
    tg_job_defaults(&job);
    snprintf(job.path, sizeof job.path, "job.txt");
    snprintf(job.freeze, sizeof job.freeze, "%s", freeze);
    return job;
}

static tg_model_config cfg_named(const char *source) {
    tg_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.source, sizeof cfg.source, "%s", source);
    cfg.initializer_range = 0.5f;
    return cfg;
}

TG_TEST(test_graph_tensor_refusals) {
    const int64_t ok[4] = {2, 3, 4, 5}, zero[2] = {3, 0};
    const struct {
        int ndim;
        const char *name;
        const int64_t *shape;
        const char *want;
    } cases[] = {
        {-1, "t", ok, "internal compiler error: tensor t has -1 dims"},
        {5, "t", ok, "internal compiler error: tensor t has 5 dims"},
        {2, "zero", zero, "internal compiler error: tensor zero dim 1 is 0"},
        {1, "n123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"
            "0123456789012345678901234567890123456789",
         ok, "internal compiler error: tensor name too long: n1234"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_err err = {{0}};
        tg_graph g;
        tg_graph_init(&g, NULL, NULL, &err);
        CHECK(g.n_freeze == 0 && g.io.labels == -1, "init without a job");
        CHECK(tg_graph_tensor(&g, cases[i].name, TG_F32, TG_POOL_ACTIVATIONS, cases[i].ndim, cases[i].shape) == -1,
              "case %zu accepted", i);
        CHECK(g.failed && strstr(err.msg, cases[i].want) == err.msg, "case %zu: '%s'", i, err.msg);
        /* A failed graph refuses everything after, keeping the first message. */
        char first[sizeof err.msg];
        snprintf(first, sizeof first, "%s", err.msg);
        tg_op_spec add = tg_spec(TG_OP_ADD);
        CHECK(tg_graph_tensor(&g, "fine", TG_F32, TG_POOL_ACTIVATIONS, 1, ok) == -1 &&
                  tg_buffer(&g, "buf", TG_F32, 1, 2, 0, TG_INIT_ZEROS, 0) == -1 &&
                  tg_graph_op(&g, &add) == -1 && g.n_tensors == 0 && g.n_ops == 0,
              "after a failure");
        CHECK(tg_graph_fail(&g, "later %d", 1) == -1 && tg_graph_out_of_memory(&g) == -1 &&
                  tg_graph_size_fail(&g, TG_JOB_BATCH, "later") == -1 && tg_graph_job_fail(&g, TG_JOB_FREEZE, "later") == -1,
              "later failures return -1");
        CHECK(!strcmp(err.msg, first), "case %zu: the first message was replaced by '%s'", i, err.msg);
        tg_graph_free(&g);
    }
    /* The valid tensor: its fields. */
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, NULL, NULL, &err);
    int t = tg_graph_tensor(&g, "x", TG_BF16, TG_POOL_ACTIVATIONS, 4, ok);
    REQUIRE(t == 0 && !g.failed, "%s", err.msg);
    const tg_tensor *x = &g.tensors[0];
    CHECK(!strcmp(x->name, "x") && x->dtype == TG_BF16 && x->ndim == 4 && x->shape[3] == 5 && x->bytes == 240 &&
              x->first_use == -1 && x->grad == -1 && x->master == -1 && x->group == -1,
          "fields");
    /* A shape read from the table that grows under it (the 257th tensor moves the table). */
    for (int i = 1; i < 256; i++) tg_act(&g, "fill", 1, 1, 0, 0, 0);
    REQUIRE(g.n_tensors == 256 && g.cap_tensors == 256, "%d tensors, cap %d", g.n_tensors, g.cap_tensors);
    t = tg_graph_tensor(&g, "copy", TG_F32, TG_POOL_ACTIVATIONS, 4, g.tensors[0].shape);
    CHECK(t == 256 && g.cap_tensors == 512 && g.tensors[t].shape[0] == 2 && g.tensors[t].shape[3] == 5 &&
              g.tensors[t].bytes == 480,
          "copied shape");
    /* An op on a graph without a job (one replica). */
    int a = tg_act(&g, "a", 1, 3, 0, 0, 0), b = tg_act(&g, "b", 1, 3, 0, 0, 0), c = tg_act(&g, "c", 1, 3, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = a, s.in[1] = b, s.out[0] = c, s.p.count.n = 3;
    CHECK(tg_graph_op(&g, &s) == 0 && g.n_ops == 1 && g.ops[0].out[0] == c && g.ops[0].p.count.n == 3, "%s", err.msg);
    tg_graph_free(&g);
    CHECK(g.tensors == NULL && g.n_tensors == 0, "free clears the graph");
}

TG_TEST(test_graph_sizes_past_one_pool) {
    const int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 40}, big[2] = {(int64_t)1 << 22, (int64_t)1 << 21};
    tg_model_config cfg = cfg_named("tiny-test");
    cfg.layers = 2, cfg.hidden = 8, cfg.intermediate = 16, cfg.vocab_size = 30;
    tg_job job = job_named("");
    job.batch = 4, job.seq = 16;
    const struct {
        const tg_model_config *cfg;
        const tg_job *job;
        const int64_t *shape;
        int pool;
        const char *want;
    } cases[] = {
        {NULL, NULL, huge, TG_POOL_ACTIVATIONS,
         "the graph: tensor big [1099511627776, 1099511627776] is more than 2^64 bytes, more than the 16.0 TiB one "
         "memory pool may hold"},
        {NULL, NULL, big, TG_POOL_ACTIVATIONS, "the graph: tensor big [4194304, 2097152] is 32.0 TiB, more than the 16.0 TiB"},
        {&cfg, &job, big, TG_POOL_ACTIVATIONS,
         "job.txt (default): key 'batch': batch 4 x seq 16 with model 'tiny-test' ("},
        {&cfg, &job, big, TG_POOL_PARAMS, "job.txt (default): key 'model': model 'tiny-test' ("},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_err err = {{0}};
        tg_graph g;
        tg_graph_init(&g, cases[i].cfg, cases[i].job, &err);
        CHECK(tg_graph_tensor(&g, "big", TG_F32, cases[i].pool, 2, cases[i].shape) == -1 && g.failed, "case %zu accepted", i);
        CHECK(strstr(err.msg, cases[i].want) == err.msg, "case %zu: '%s', want '%s'", i, err.msg, cases[i].want);
        CHECK(strstr(err.msg, "one memory pool may hold") != NULL, "case %zu: '%s'", i, err.msg);
        tg_graph_free(&g);
    }
}

TG_TEST(test_graph_table_limits_and_memory) {
    const int64_t one[1] = {1};
    tg_model_config cfg = cfg_named("tiny-test");
    tg_job job = job_named("");
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, &cfg, &job, &err);
    g.n_tensors = TG_MAX_GRAPH_TENSORS; /* the count alone decides; no entry is read */
    CHECK(tg_graph_tensor(&g, "x", TG_F32, TG_POOL_ACTIVATIONS, 1, one) == -1 &&
              !strcmp(err.msg, "job.txt (default): key 'model': the graph needs more than 16777216 tensors"),
          "'%s'", err.msg);
    g.n_tensors = 0;
    tg_graph_free(&g);
    tg_graph_init(&g, NULL, NULL, &err);
    g.n_ops = TG_MAX_GRAPH_OPS;
    tg_op_spec s = tg_spec(TG_OP_ADD);
    CHECK(tg_graph_op(&g, &s) == -1 && !strcmp(err.msg, "the graph needs more than 16777216 ops"), "'%s'", err.msg);
    g.n_ops = 0;
    tg_graph_free(&g);
    /* The first tensor's table, then the first op's, out of memory. */
    for (int which = 0; which < 2; which++) {
        memset(&err, 0, sizeof err);
        tg_graph_init(&g, which ? NULL : &cfg, NULL, &err);
        int x = which ? tg_act(&g, "x", 1, 4, 0, 0, 0) : -1;
        tg_alloc_fail_after(0);
        int rc = which ? tg_graph_op(&g, &s) : tg_act(&g, "x", 1, 4, 0, 0, 0);
        tg_alloc_fail_after(-1);
        const char *want = which ? "out of memory compiling model '?' (at 1 tensors and 0 ops)"
                                 : "out of memory compiling model 'tiny-test' (at 0 tensors and 0 ops)";
        CHECK(rc == -1 && !strcmp(err.msg, want), "which %d (x %d): '%s'", which, x, err.msg);
        tg_graph_free(&g);
    }
}

TG_TEST(test_graph_buffers_params_and_ops) {
    tg_model_config cfg = cfg_named("tiny-test");
    tg_job job = job_named("");
    job.data_parallel = 1;
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, &cfg, &job, &err);
    int kept = tg_buffer(&g, "pos", TG_I32, 1, 8, 0, TG_INIT_ZEROS, 1);
    int lost = tg_buffer(&g, "mask", TG_F32, 2, 2, 3, TG_INIT_ZEROS, 0);
    int w = tg_param(&g, "w", 2, 3, 4, TG_INIT_NORMAL, 0), b = tg_param(&g, "b", 1, 4, 0, TG_INIT_ZEROS, 1);
    REQUIRE(kept == 0 && lost == 1 && w == 2 && b == 3 && !g.failed, "%s", err.msg);
    CHECK((g.tensors[kept].flags & (TG_TENSOR_BUFFER | TG_TENSOR_PERSISTENT)) == (TG_TENSOR_BUFFER | TG_TENSOR_PERSISTENT) &&
              g.tensors[kept].pool == TG_POOL_BUFFERS && g.tensors[kept].dtype == TG_I32,
          "persistent buffer");
    CHECK((g.tensors[lost].flags & TG_TENSOR_BUFFER) && !(g.tensors[lost].flags & TG_TENSOR_PERSISTENT), "buffer");
    CHECK((g.tensors[w].flags & TG_TENSOR_PARAM) && !(g.tensors[w].flags & TG_TENSOR_NO_DECAY) &&
              g.tensors[w].init_std == 0.5f && g.tensors[w].pool == TG_POOL_PARAMS,
          "weight");
    CHECK((g.tensors[b].flags & TG_TENSOR_NO_DECAY) && g.tensors[b].init_std == 0.0f, "bias");
    /* An op that fails its check: the op index and kind in the message. */
    int x = tg_act(&g, "x", 1, 6, 0, 0, 0), y = tg_act(&g, "y", 1, 6, 0, 0, 0), z = tg_act(&g, "z", 1, 6, 0, 0, 0);
    tg_op_spec s = tg_spec(TG_OP_ADD);
    s.in[0] = x, s.in[1] = y, s.out[0] = z, s.p.count.n = 6;
    REQUIRE(tg_graph_op(&g, &s) == 0 && g.ops[0].kind == TG_OP_ADD && g.ops[0].in[1] == y, "%s", err.msg);
    s.p.count.n = 7;
    CHECK(tg_graph_op(&g, &s) == -1 && strstr(err.msg, "internal compiler error: op 1 (add): ") == err.msg, "'%s'",
          err.msg);
    CHECK(g.n_ops == 1, "%d ops", g.n_ops);
    tg_graph_free(&g);
    /* A buffer with a random init. */
    tg_graph_init(&g, &cfg, &job, &err);
    CHECK(tg_buffer(&g, "pos", TG_F32, 1, 8, 0, TG_INIT_NORMAL, 1) == -1 &&
              !strcmp(err.msg, "internal compiler error: buffer pos cannot have a random init"),
          "'%s'", err.msg);
    CHECK(tg_param(&g, "w", 2, 3, 4, TG_INIT_NORMAL, 0) == -1 && g.n_tensors == 0, "a param on a failed graph");
    tg_graph_free(&g);
}

TG_TEST(test_graph_param_pack) {
    tg_model_config cfg = cfg_named("tiny-test");
    tg_job job = job_named("q.*");
    tg_err err = {{0}};
    tg_graph g;
    /* A valid pack: the view's flags, master and the members' group. */
    tg_graph_init(&g, &cfg, &job, &err);
    int a = tg_param(&g, "a.weight", 2, 2, 3, TG_INIT_ZEROS, 1), b2 = tg_param(&g, "b.weight", 2, 2, 3, TG_INIT_ZEROS, 1);
    int members[2] = {a, b2};
    int v = tg_param_pack(&g, "ab", members, 2, 2, 4, 3);
    REQUIRE(v == 2, "%s", err.msg);
    CHECK((g.tensors[v].flags & (TG_TENSOR_VIEW | TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY)) ==
                  (TG_TENSOR_VIEW | TG_TENSOR_PARAM | TG_TENSOR_NO_DECAY) &&
              g.tensors[v].master == a && g.tensors[a].group == v && g.tensors[b2].group == v &&
              g.tensors[v].pool == TG_POOL_PARAMS,
          "view");
    /* Refusals, each on a fresh graph of: q.first (frozen by the job), a, b (trainable f32),
     * q (frozen), h (bf16 trainable), act (an activation); first: the view packing a and b. */
    enum { A, B, Q, H, ACT, Q0, FIRST };
    const struct {
        int members[3], n, ndim;
        int64_t d0;
        int pre_pack; /* pack a and b first */
        const char *want;
    } cases[] = {
        {{ACT, A}, 2, 2, 4, 0, "internal compiler error: x cannot pack act"},
        {{A, H}, 2, 2, 4, 0, "internal compiler error: x cannot pack h.weight"},
        {{B, A}, 2, 2, 4, 0, "internal compiler error: x cannot pack a.weight"},
        {{A, A}, 2, 2, 4, 0, "internal compiler error: x cannot pack a.weight"},
        {{A, B}, 2, 2, 4, 1, "internal compiler error: x cannot pack a.weight"},
        {{FIRST}, 1, 2, 4, 1, "internal compiler error: x cannot pack first"}, /* a view is no member */
        {{A, B}, 2, 2, 5, 0, "internal compiler error: x does not cover its members"},
        {{A, B}, 2, 5, 4, 0, "internal compiler error: tensor x has 5 dims"},
        {{A, Q}, 2, 2, 4, 0,
         "job.txt (default): key 'freeze': freezes q.weight but not a.weight, which the plan reads as one packed "
         "parameter x (fuse_qkv): freeze all of them, or set fuse_qkv = false"},
        {{Q0, A}, 2, 2, 4, 0, "key 'freeze': freezes q.first but not a.weight, which the plan reads as one packed parameter x"},
    };
    tg_graph_free(&g);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memset(&err, 0, sizeof err);
        tg_graph_init(&g, &cfg, &job, &err);
        int ids[7];
        ids[Q0] = tg_param(&g, "q.first", 2, 2, 3, TG_INIT_ZEROS, 0);
        ids[A] = tg_param(&g, "a.weight", 2, 2, 3, TG_INIT_ZEROS, 0);
        ids[B] = tg_param(&g, "b.weight", 2, 2, 3, TG_INIT_ZEROS, 0);
        ids[Q] = tg_param(&g, "q.weight", 2, 2, 3, TG_INIT_ZEROS, 0);
        int64_t hs[2] = {2, 3};
        ids[H] = tg_graph_tensor(&g, "h.weight", TG_BF16, TG_POOL_PARAMS, 2, hs);
        g.tensors[ids[H]].flags |= TG_TENSOR_PARAM;
        ids[ACT] = tg_act(&g, "act", 2, 2, 3, 0, 0);
        REQUIRE(!g.failed && (g.tensors[ids[Q]].flags & TG_TENSOR_FROZEN), "setup: %s", err.msg);
        if (cases[i].pre_pack) {
            int ab[2] = {ids[A], ids[B]};
            ids[FIRST] = tg_param_pack(&g, "first", ab, 2, 2, 4, 3);
            REQUIRE(ids[FIRST] >= 0, "%s", err.msg);
        }
        int m[3];
        for (int k = 0; k < cases[i].n; k++) m[k] = ids[cases[i].members[k]];
        CHECK(tg_param_pack(&g, "x", m, cases[i].n, cases[i].ndim, cases[i].d0, 3) == -1, "case %zu accepted", i);
        CHECK(strstr(err.msg, cases[i].want) != NULL, "case %zu: '%s', want '%s'", i, err.msg, cases[i].want);
        CHECK(tg_param_pack(&g, "again", m, cases[i].n, 2, 4, 3) == -1, "case %zu: a failed graph packs", i);
        tg_graph_free(&g);
    }
}

TG_TEST(test_graph_freeze_patterns_that_match_nothing) {
    tg_model_config cfg = cfg_named("tiny-test");
    const struct {
        const char *freeze;
        int params; /* build enc.weight and dec.weight (after an activation and a view) */
        const char *want;
    } cases[] = {
        {"enc.*", 1, NULL},
        {"enc.*, nomatch*", 1,
         "job.txt (default): key 'freeze': pattern 'nomatch*' matches no parameter of model 'tiny-test' (patterns match "
         "Hugging Face parameter names such as 'enc.weight')"},
        {"x*, enc.*, y", 1, "key 'freeze': patterns 'x*', 'y' match no parameter of model 'tiny-test' (patterns match "
                            "Hugging Face parameter names such as 'enc.weight')"},
        {"enc.*", 0, "pattern 'enc.*' matches no parameter of model 'tiny-test' (patterns match Hugging Face parameter "
                     "names such as '?')"},
        /* Plain fnmatch: case matters, and a backslash escapes the next character. */
        {"ENC.*", 1, "pattern 'ENC.*' matches no parameter of model 'tiny-test' (patterns match Hugging Face "
                     "parameter names such as 'enc.weight')"},
        {"enc\\.weight", 1, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tg_job job = job_named(cases[i].freeze);
        tg_err err = {{0}};
        tg_graph g;
        tg_graph_init(&g, &cfg, &job, &err);
        tg_act(&g, "act", 1, 2, 0, 0, 0);
        if (cases[i].params) {
            tg_param(&g, "dec.weight", 1, 2, 0, TG_INIT_ZEROS, 0);
            int d = 1;
            tg_param_pack(&g, "dec.view", &d, 1, 1, 2, 0);
            tg_param(&g, "enc.weight", 1, 2, 0, TG_INIT_ZEROS, 0);
            /* the view sits before enc.weight but is no parameter of its own */
            g.tensors[1].flags &= ~(TG_TENSOR_PARAM | TG_TENSOR_FROZEN);
        }
        REQUIRE(!g.failed, "case %zu: %s", i, err.msg);
        int rc = tg_graph_check_freeze(&g);
        if (!cases[i].want) CHECK(rc == 0, "case %zu: %s", i, err.msg);
        else CHECK(rc == -1 && strstr(err.msg, cases[i].want), "case %zu: '%s', want '%s'", i, err.msg, cases[i].want);
        tg_graph_free(&g);
    }
    /* A failed graph fails the check without a new message. */
    tg_job job = job_named("");
    tg_err err = {{0}};
    tg_graph g;
    tg_graph_init(&g, &cfg, &job, &err);
    tg_graph_fail(&g, "earlier");
    CHECK(tg_graph_check_freeze(&g) == -1 && !strcmp(err.msg, "internal compiler error: earlier"), "'%s'", err.msg);
    tg_graph_free(&g);
}
