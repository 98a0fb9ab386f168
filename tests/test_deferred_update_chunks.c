/* The deferred update's chunks (runtime/deferred_update.c) on a hand-made plan whose
 * forward reads the parameters a piece at a time: every chunk boundary and every forward
 * op's wait, exactly, for several minimum chunk sizes; a forward that reads no parameter
 * (one chunk, no waits); and unused operand slots (-1) that are never looked up, even where
 * the table entry before the first tensor would overlap the parameters. */
#include <string.h>

#include "runtime/deferred_update.h"
#include "tests/harness.h"

enum { N_PARAM = 64 }; /* fp32 parameter elements the update covers */

enum { T_PARAMS, T_GRADS, T_M, T_V, T_W1, T_W2, T_W3, T_BF16_ALL, T_W3_BF16, T_X, T_Y, T_Z, T_OUT, N_TENSORS };

typedef struct chunk_plan {
    /* table[0] sits before the plan's first tensor: all the parameters, so that reading
     * plan.tensors[-1] would look like reading every parameter. */
    tg_tensor table[1 + N_TENSORS];
    tg_op ops[5];
    tg_plan plan;
} chunk_plan;

static void tensor_at(chunk_plan *c, int t, int pool, int dtype, uint64_t offset, uint64_t bytes) {
    tg_tensor *x = &c->table[1 + t];
    memset(x, 0, sizeof *x);
    x->pool = pool, x->dtype = dtype, x->offset = offset, x->bytes = bytes;
}

static void forward_op(chunk_plan *c, int o, int in0, int in1, int out) {
    c->ops[o] = tg_test_op(TG_OP_MATMUL);
    c->ops[o].in[0] = in0, c->ops[o].in[1] = in1, c->ops[o].out[0] = out;
}

/* Forward ops 0..3: x,w1 -> y; y,w2 -> z; z -> out; x,w3 (its bf16 copy) -> y. The three
 * weights are elements [0,16), [16,32), [32,48) of the parameters; the update is op 4. */
static void chunk_plan_init(chunk_plan *c, int reads_params) {
    memset(c, 0, sizeof *c);
    c->table[0].pool = TG_POOL_PARAMS, c->table[0].dtype = TG_F32, c->table[0].bytes = 4 * N_PARAM;
    tensor_at(c, T_PARAMS, TG_POOL_PARAMS, TG_F32, 0, 4 * N_PARAM);
    tensor_at(c, T_GRADS, TG_POOL_GRADS, TG_F32, 0, 4 * N_PARAM);
    tensor_at(c, T_M, TG_POOL_OPTIM, TG_F32, 0, 4 * N_PARAM);
    tensor_at(c, T_V, TG_POOL_OPTIM, TG_F32, 4 * N_PARAM, 4 * N_PARAM);
    tensor_at(c, T_W1, TG_POOL_PARAMS, TG_F32, 0, 64);
    tensor_at(c, T_W2, TG_POOL_PARAMS, TG_F32, 64, 64);
    tensor_at(c, T_W3, TG_POOL_PARAMS, TG_F32, 128, 64);
    tensor_at(c, T_BF16_ALL, TG_POOL_PARAMS_BF16, TG_BF16, 0, 2 * N_PARAM);
    tensor_at(c, T_W3_BF16, TG_POOL_PARAMS_BF16, TG_BF16, 64, 32);
    tensor_at(c, T_X, TG_POOL_INPUTS, TG_F32, 0, 64);
    tensor_at(c, T_Y, TG_POOL_ACTIVATIONS, TG_F32, 0, 64);
    tensor_at(c, T_Z, TG_POOL_ACTIVATIONS, TG_F32, 64, 64);
    tensor_at(c, T_OUT, TG_POOL_ACTIVATIONS, TG_F32, 128, 64);
    forward_op(c, 0, T_X, reads_params ? T_W1 : T_X, T_Y);
    forward_op(c, 1, T_Y, reads_params ? T_W2 : T_X, T_Z);
    forward_op(c, 2, T_Z, -1, T_OUT);
    forward_op(c, 3, T_X, reads_params ? T_W3_BF16 : T_X, T_Y);
    c->ops[4] = tg_test_op(TG_OP_ADAMW);
    c->ops[4].in[0] = T_GRADS;
    c->ops[4].out[0] = T_PARAMS, c->ops[4].out[1] = T_M, c->ops[4].out[2] = T_V, c->ops[4].out[3] = T_BF16_ALL;
    c->ops[4].p.adamw.n = N_PARAM;
    c->plan.tensors = c->table + 1;
    c->plan.n_tensors = N_TENSORS;
    c->plan.ops = c->ops;
    c->plan.n_ops = 5;
    c->plan.phase_begin[TG_PHASE_FORWARD] = 0;
    c->plan.phase_begin[TG_PHASE_BACKWARD] = 4;
    c->plan.phase_begin[TG_PHASE_OPTIMIZER] = 4;
    c->plan.phase_begin[TG_PHASE_COUNT] = 5;
}

/* Plans c with min_chunk and expects exactly the chunk starts `begin` (n_chunks + 1 of
 * them) and the forward ops' waits `before`. */
static void expect_chunks(const chunk_plan *c, int64_t min_chunk, int n_chunks, const int64_t *begin,
                          const int *before, const char *what) {
    tg_deferred_update u;
    tg_err err = {{0}};
    const int rc = tg_deferred_update_plan(&c->plan, min_chunk, &u, &err);
    if (!CHECK(rc == 1, "%s: returned %d (%s)", what, rc, err.msg)) return;
    CHECK(u.adamw_op == 4 && u.n_forward == 4 && u.n_chunks == n_chunks, "%s: op %d, %d forward ops, %d chunks (want %d)",
          what, u.adamw_op, u.n_forward, u.n_chunks, n_chunks);
    for (int k = 0; k <= n_chunks && k <= u.n_chunks; k++)
        CHECK(u.begin[k] == begin[k], "%s: chunk %d begins at %lld, expected %lld", what, k, (long long)u.begin[k],
              (long long)begin[k]);
    for (int j = 0; j < 4; j++)
        CHECK(u.chunks_before[j] == before[j], "%s: forward op %d waits for %d chunks, expected %d", what, j,
              u.chunks_before[j], before[j]);
    tg_deferred_update_free(&u);
}

TG_TEST(test_deferred_update_chunk_boundaries) {
    static chunk_plan c;
    chunk_plan_init(&c, 1);
    /* The prefixes the forward ops read: 16, 32, 32, 48 (the bf16 copy's bytes [64, 96) are
     * elements [32, 48)); the rest joins a last chunk. */
    expect_chunks(&c, 4, 4, (const int64_t[]){0, 16, 32, 48, 64}, (const int[]){1, 2, 2, 3}, "min 4");
    expect_chunks(&c, 16, 4, (const int64_t[]){0, 16, 32, 48, 64}, (const int[]){1, 2, 2, 3}, "min 16");
    /* 20: the first chunk takes op 1's prefix too; op 3's 16 more are too few, and so are
     * the 16 left after it: its chunk runs to the end. */
    expect_chunks(&c, 20, 2, (const int64_t[]){0, 32, 64}, (const int[]){1, 1, 1, 2}, "min 20");
    /* 40: op 0's chunk would grow to [0, 48), leaving 16 < 40: everything at once. */
    expect_chunks(&c, 40, 1, (const int64_t[]){0, 64}, (const int[]){1, 1, 1, 1}, "min 40");
    /* 17: [0, 32) as above, then 48 - 32 = 16 < 17: to the end. */
    expect_chunks(&c, 17, 2, (const int64_t[]){0, 32, 64}, (const int[]){1, 1, 1, 2}, "min 17");
}

TG_TEST(test_deferred_update_forward_reads_no_parameter) {
    static chunk_plan c;
    chunk_plan_init(&c, 0);
    /* One chunk of all the parameters, which no forward op waits for. */
    expect_chunks(&c, 4, 1, (const int64_t[]){0, N_PARAM}, (const int[]){0, 0, 0, 0}, "no parameter reads");
    /* A forward op reading the last parameters only: the chunk before it runs to the end. */
    c.ops[3].in[1] = T_W3;
    c.table[1 + T_W3].offset = 4 * (N_PARAM - 16);
    expect_chunks(&c, 4, 1, (const int64_t[]){0, N_PARAM}, (const int[]){0, 0, 0, 1}, "the last op reads the end");
}
