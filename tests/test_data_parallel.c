/* Data parallelism: replicas in threads, joined by the shared-memory communicator
 * (runtime/comm.c) on the CPU reference or by NCCL on CUDA (TG_TEST_DEVICE=cuda, one GPU
 * per replica), train like one trainer on their batches together (classification, where
 * every replica's loss averages as many rows). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/compile.h"
#include "compiler/job.h"
#include "compiler/memory_plan.h"
#include "plan/op_meta.h"
#include "plan/validate.h"
#include "models/model_config.h"
#include "runtime/comm.h"
#include "runtime/cpu/cpu_exec.h"
#include "runtime/executor.h"
#include "plan/plan_file.h"
#include "runtime/trainer.h"
#include "tests/harness.h"

/* The demo job with `replicas` data-parallel replicas of `batch` rows each, dropout off
 * (each replica draws its own masks, so with dropout the runs would differ by design);
 * `extra` holds n_extra more job settings. */
static int compile_demo_with(int replicas, int batch, int steps, const char *const *extra, int n_extra, tg_plan *p) {
    tg_err err;
    tg_job job;
    char b[32], r[32], s[32];
    snprintf(b, sizeof b, "batch=%d", batch);
    snprintf(r, sizeof r, "data_parallel=%d", replicas);
    snprintf(s, sizeof s, "steps=%d", steps);
    const char *sets[8] = {b, r, s};
    for (int k = 0; k < n_extra && k < 5; k++) sets[3 + k] = extra[k];
    if (!CHECK(tg_job_load("examples/demo-classify.job", sets, 3 + n_extra, &job, &err) == 0, "%s", err.msg)) return 0;
    tg_model_config cfg;
    if (!CHECK(tg_model_config_load(job.model, &cfg, &err) == 0, "%s", err.msg)) return 0;
    cfg.hidden_dropout = cfg.attention_dropout = cfg.embedding_dropout = cfg.classifier_dropout = 0;
    return CHECK(tg_compile_with_config(&job, &cfg, p, &err) == 0, "%s", err.msg);
}

static int compile_demo(int replicas, int batch, int steps, tg_plan *p) {
    return compile_demo_with(replicas, batch, steps, NULL, 0, p);
}

typedef struct replica {
    const tg_plan *plan;
    void *comm;
    int rank, steps, ok;
    float loss[8];
    float comm_ms[8], exposed_ms[8]; /* each step's gradient sums (-1: not measured) */
    tg_comm_timeline timeline;       /* the trainer's, at the end */
    float *params;
    char msg[512];
} replica;

static void *run_replica(void *arg) {
    replica *r = arg;
    tg_err err = {{0}};
    tg_trainer tr;
    tg_trainer_options o = {.device = tg_test_device(), .threads = 1, .load_data = 1, .rank = r->rank, .comm = r->comm};
    if (tg_trainer_open(&tr, r->plan, &o, &err)) {
        snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg);
        return NULL;
    }
    int ok = 1;
    for (int s = 0; s < r->steps && ok; s++) {
        tg_step_stats st;
        ok = tg_trainer_step(&tr, &st, &err) == 0;
        if (ok) r->loss[s] = st.loss, r->comm_ms[s] = st.comm_ms, r->exposed_ms[s] = st.comm_exposed_ms;
    }
    r->timeline = tr.comm;
    r->params = ok ? malloc(r->plan->pool_bytes[TG_POOL_PARAMS]) : NULL;
    ok = ok && r->params && tg_trainer_read(&tr, r->plan->io.params_all, r->params, &err) == 0;
    if (!ok) snprintf(r->msg, sizeof r->msg, "rank %d: %s", r->rank, err.msg);
    r->ok = ok;
    tg_trainer_close(&tr);
    return NULL;
}

/* Runs `replicas` replicas of the plan for `steps` steps, each in its own thread, joined
 * by the test device's communicator (NCCL on CUDA, one GPU each; else the CPU group). */
static void run_replicas(const tg_plan *plan, int replicas, int steps, replica *r) {
    const int cuda = tg_test_device();
    tg_cpu_comm_group *group = NULL;
    void *comms[8] = {NULL};
    pthread_t th[8];
    tg_err err;
    if (cuda) REQUIRE(tg_cuda_comms_create(comms, replicas, &err) == 0, "%s", err.msg);
    else REQUIRE(tg_cpu_comm_group_create(&group, replicas, &err) == 0, "%s", err.msg);
    int started = 0;
    for (; started < replicas; started++) {
        r[started] = (replica){.plan = plan, .comm = cuda ? comms[started] : (void *)group, .rank = started, .steps = steps};
        if (!CHECK(pthread_create(&th[started], NULL, run_replica, &r[started]) == 0, "pthread_create")) break;
    }
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    if (cuda) tg_cuda_comms_destroy(comms, replicas);
    else tg_cpu_comm_group_destroy(group);
}

/* The gradient sums of a data-parallel plan: ALL_REDUCE ops over views that tile the
 * gradient buffer, each placed in the backward after the last op that writes into it (so
 * nothing after it changes what it sums), several on a real model, the first well before
 * the backward ends; the loss gradient seeded with 1 / replicas. */
static void check_buckets(const tg_plan *p, const char *what, int min_buckets) {
    const int64_t n = (int64_t)(p->tensors[p->io.grads_all].bytes / 4);
    int buckets = 0, first = -1;
    int64_t covered = 0, floor = 0;
    /* A table each replica scatters from the gathered rows (tg_gather_embedding_grads): the
     * start of the buffer, which the buckets leave out; its two gathers (ids and rows, from
     * this replica's tensors) just before the scatter, which reads what they gathered. */
    for (int o = 2; o < p->n_ops; o++) {
        const tg_op *e = &p->ops[o], *ids = &p->ops[o - 2], *rows = &p->ops[o - 1];
        if (e->kind != TG_OP_EMBEDDING_BWD || ids->kind != TG_OP_ALL_GATHER) continue;
        CHECK(floor == 0 && rows->kind == TG_OP_ALL_GATHER && e->in[0] == ids->out[0] && e->in[1] == rows->out[0] &&
                  ids->in[1] >= 0 && rows->in[1] >= 0 && p->tensors[e->out[0]].offset == 0 &&
                  e->p.embedding.n == ids->p.all_gather.slice * p->train.replicas,
              "%s: the embedding's gathers at op %d", what, o);
        floor = tg_tensor_numel(&p->tensors[e->out[0]]);
    }
    for (int o = 0; o < p->n_ops; o++) {
        const tg_op *op = &p->ops[o];
        if (op->kind == TG_OP_FILL)
            CHECK(op->p.fill.value == 1.0f / (float)p->train.replicas, "%s: loss gradient seeded with %g", what,
                  op->p.fill.value);
        if (op->kind != TG_OP_ALL_REDUCE) continue;
        buckets++;
        if (first < 0) first = o;
        const tg_tensor *t = &p->tensors[op->in[0]];
        const int64_t a = (int64_t)(t->offset / 4), b = a + (int64_t)(t->bytes / 4);
        CHECK(op->phase == TG_PHASE_BACKWARD && op->out[0] == op->in[0] && t->pool == TG_POOL_GRADS &&
                  (t->flags & TG_TENSOR_VIEW) && op->p.count.n == b - a,
              "%s: all_reduce %d over %s [%lld, %lld)", what, o, t->name, (long long)a, (long long)b);
        /* Buckets come from the top of the buffer down, back to back. */
        CHECK(b == n - covered, "%s: bucket %d ends at %lld, want %lld", what, buckets, (long long)b,
              (long long)(n - covered));
        covered += b - a;
        for (int k = o + 1; k < p->n_ops; k++)
            for (int s = 0; s < TG_OP_MAX_OUT; s++) {
                const int w = p->ops[k].out[s];
                if (w < 0 || p->ops[k].kind == TG_OP_ALL_REDUCE || p->tensors[w].pool != TG_POOL_GRADS) continue;
                const int64_t wa = (int64_t)(p->tensors[w].offset / 4), wb = wa + (int64_t)(p->tensors[w].bytes / 4);
                CHECK(wb <= a || wa >= b, "%s: op %d writes %s inside the bucket summed at op %d", what, k,
                      p->tensors[w].name, o);
            }
    }
    CHECK(covered == n - floor && buckets >= min_buckets, "%s: %d buckets cover %lld of %lld gradient elements (%lld "
                                                          "gathered)",
          what, buckets, (long long)covered, (long long)n, (long long)floor);
    const int b0 = p->phase_begin[TG_PHASE_BACKWARD], b1 = p->phase_begin[TG_PHASE_BACKWARD + 1];
    CHECK(first >= 0 && first < b0 + (b1 - b0) / 2, "%s: the first gradient sum at op %d of the backward [%d, %d)", what,
          first, b0, b1);
}

TG_TEST(test_data_parallel_plan) {
    tg_plan p;
    if (!compile_demo(2, 4, 3, &p)) return;
    check_buckets(&p, "tiny-bert x2", 3);
    /* Without a communicator the executor refuses the plan. */
    tg_trainer tr;
    tg_err err = {{0}};
    tg_trainer_options o = {.device = tg_test_device(), .threads = 1, .load_data = 0};
    CHECK(tg_trainer_open(&tr, &p, &o, &err) != 0 && strstr(err.msg, "2 data-parallel replicas"),
          "a 2-replica plan opened without a communicator: '%s'", err.msg);
    tg_plan_free(&p);
    tg_plan one;
    if (compile_demo(1, 4, 3, &one)) {
        for (int o2 = 0; o2 < one.n_ops; o2++) CHECK(one.ops[o2].kind != TG_OP_ALL_REDUCE, "one replica all-reduces");
        tg_plan_free(&one);
    }
    /* Full-size models: 25 MB buckets. */
    static const struct {
        const char *preset;
        int task, replicas;
    } big[] = {{"bert-base-uncased", TG_TASK_CLASSIFY, 8}, {"gpt2", TG_TASK_LM, 4}};
    for (size_t c = 0; c < sizeof big / sizeof big[0]; c++) {
        tg_plan q;
        if (!tg_test_compile_preset(big[c].preset, big[c].task, TG_PREC_BF16, big[c].replicas, &q)) continue;
        check_buckets(&q, big[c].preset, 10);
        tg_plan_free(&q);
    }
}

/* The bucket size the job names (grad_bucket_mb): on BERT-base every bucket but the last
 * (the rest, below the last cut) at least that large and, cut after a whole layer's
 * backward, less than a layer more; the buckets still tile the gradients; a size past the
 * range refused. */
TG_TEST(test_data_parallel_bucket_size) {
    static const struct {
        const char *mb;
        int min_buckets, max_buckets;
    } cases[] = {{"8", 30, 200}, {"25", 10, 20}, {"100", 3, 5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char set[64];
        snprintf(set, sizeof set, "grad_bucket_mb=%s", cases[c].mb);
        const char *sets[] = {"model=bert-base-uncased", "data_parallel=2", set};
        tg_job job;
        tg_plan p;
        tg_err err = {{0}};
        if (!CHECK(tg_job_load("examples/demo-classify.job", sets, 3, &job, &err) == 0, "%s", err.msg) ||
            !CHECK(tg_compile(&job, &p, &err) == 0, "%s: %s", set, err.msg))
            continue;
        char what[96];
        snprintf(what, sizeof what, "bert-base, %s", set);
        check_buckets(&p, what, cases[c].min_buckets);
        const int64_t bucket = (int64_t)atoi(cases[c].mb) << 20;
        int buckets = 0, lowest = -1;
        uint64_t low_offset = UINT64_MAX;
        for (int o = 0; o < p.n_ops; o++)
            if (p.ops[o].kind == TG_OP_ALL_REDUCE && p.tensors[p.ops[o].in[0]].offset < low_offset)
                low_offset = p.tensors[p.ops[o].in[0]].offset, lowest = o;
        for (int o = 0; o < p.n_ops; o++) {
            if (p.ops[o].kind != TG_OP_ALL_REDUCE) continue;
            buckets++;
            const int64_t bytes = (int64_t)p.tensors[p.ops[o].in[0]].bytes;
            CHECK(o == lowest || (bytes >= bucket && bytes < bucket + (30 << 20)), "%s: bucket of %lld bytes", what,
                  (long long)bytes);
        }
        CHECK(buckets >= cases[c].min_buckets && buckets <= cases[c].max_buckets, "%s: %d buckets", what, buckets);
        tg_plan_free(&p);
    }
    /* The demo's tiny model: by default an eighth of its gradients a bucket; a size named
     * in the job is taken as given, here one bucket for all of them. */
    const char *tiny[] = {"data_parallel=2", "grad_bucket_mb=1"};
    tg_job job;
    tg_plan p;
    tg_err err = {{0}};
    if (CHECK(tg_job_load("examples/demo-classify.job", tiny, 2, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0,
              "%s", err.msg)) {
        int buckets = 0;
        for (int o = 0; o < p.n_ops; o++) buckets += p.ops[o].kind == TG_OP_ALL_REDUCE;
        CHECK(buckets == 1 && p.tensors[p.io.grads_all].bytes < (1u << 20), "tiny model, 1 MiB: %d buckets of %llu bytes",
              buckets, (unsigned long long)p.tensors[p.io.grads_all].bytes);
        tg_plan_free(&p);
    }
    /* Length buckets: every bucket plan gathers the embedding's rows alike (the choice is
     * made at the longest bucket, where gathering pays least). */
    const char *bucketed[] = {"data_parallel=2", "batch=2", "seq_buckets=8,48"};
    if (CHECK(tg_job_load("examples/demo-classify.job", bucketed, 3, &job, &err) == 0 && tg_compile(&job, &p, &err) == 0,
              "%s", err.msg)) {
        for (int k = 0; k < 2; k++) {
            const tg_plan *b = tg_plan_bucket(&p, k);
            int gathers = 0;
            for (int o = 0; o < b->n_ops; o++) gathers += b->ops[o].kind == TG_OP_ALL_GATHER;
            CHECK(gathers == 2, "bucket %d: %d gathers", k, gathers);
            check_buckets(b, k ? "bucket 48" : "bucket 8", 2);
        }
        tg_plan_free(&p);
    }
    const char *sets[] = {"data_parallel=2", "grad_bucket_mb=0"}, *sets2[] = {"data_parallel=2", "grad_bucket_mb=1025"};
    CHECK(tg_job_load("examples/demo-classify.job", sets, 2, &job, &err) != 0 && strstr(err.msg, "grad_bucket_mb"),
          "0: '%s'", err.msg);
    CHECK(tg_job_load("examples/demo-classify.job", sets2, 2, &job, &err) != 0 && strstr(err.msg, "grad_bucket_mb"),
          "1025: '%s'", err.msg);
}

/* Each replica's gradient sums as its steps measured them: on CUDA one begin and end a
 * bucket summed beside the backward, in the order the backward completes them, each
 * ending after it begins and beginning once the one before has ended, the steps' busy
 * time their sum and the exposed time what the last ran past the backward; the steps
 * after the first in the timeline. The CPU executor sums inside its phases and measures
 * none. */
static void check_comm_timeline(const tg_plan *p, const replica *r, int replicas, int steps, int cuda) {
    int buckets = 0;
    for (int o = p->phase_begin[TG_PHASE_BACKWARD]; o < p->phase_begin[TG_PHASE_OPTIMIZER]; o++)
        buckets += p->ops[o].kind == TG_OP_ALL_REDUCE;
    for (int k = 0; k < replicas; k++) {
        const tg_comm_timeline *c = &r[k].timeline;
        if (!cuda) {
            CHECK(c->buckets == 0 && c->steps == 0 && r[k].comm_ms[0] == -1.0f && r[k].exposed_ms[0] == -1.0f,
                  "replica %d on the CPU: %d buckets over %lld steps, comm %g ms", k, c->buckets, (long long)c->steps,
                  r[k].comm_ms[0]);
            continue;
        }
        CHECK(buckets >= 2 && c->buckets == buckets && c->steps == steps - 1,
              "replica %d: timeline of %d buckets over %lld steps, plan has %d buckets, %d steps taken", k, c->buckets,
              (long long)c->steps, buckets, steps);
        double busy = 0;
        for (int j = 0; j < c->buckets && c->steps > 0; j++) {
            const double begin = c->begin_ms[j] / (double)c->steps, end = c->end_ms[j] / (double)c->steps;
            const double before = j ? c->end_ms[j - 1] / (double)c->steps : -1e9;
            CHECK(end > begin && begin >= before - 1e-3 && begin < 1e3 && end > -1e3,
                  "replica %d bucket %d: mean begin %.4f, end %.4f ms, the one before ended %.4f", k, j, begin, end,
                  before);
            busy += end - begin;
        }
        for (int s = 0; s < steps; s++)
            CHECK(r[k].comm_ms[s] > 0 && r[k].exposed_ms[s] >= 0 && r[k].exposed_ms[s] <= r[k].comm_ms[s] + 0.1f,
                  "replica %d step %d: sums busy %g ms, exposed %g ms", k, s + 1, r[k].comm_ms[s], r[k].exposed_ms[s]);
        double steps_busy = 0;
        for (int s = 1; s < steps; s++) steps_busy += r[k].comm_ms[s] / (double)(steps - 1);
        CHECK(fabs(steps_busy - busy) <= 1e-3 * (busy + 1e-3), "replica %d: steps' mean busy %.5f ms, timeline's %.5f",
              k, steps_busy, busy);
    }
}

TG_TEST(test_data_parallel_matches_one_trainer) {
    enum { STEPS = 4, BATCH = 4 };
    const int cuda = tg_test_device();
    for (int replicas = 2; replicas <= 4; replicas += 2) {
        if (cuda && tg_cuda_device_count() < replicas) {
            printf("    %d replicas not run: %d GPU(s)\n", replicas, tg_cuda_device_count());
            continue;
        }
        tg_plan dp, single;
        if (!compile_demo(replicas, BATCH / replicas, STEPS, &dp)) return;
        if (!compile_demo(1, BATCH, STEPS, &single)) {
            tg_plan_free(&dp);
            return;
        }
        replica r[4] = {{0}};
        run_replicas(&dp, replicas, STEPS, r);
        replica one = {.plan = &single, .comm = NULL, .rank = 0, .steps = STEPS};
        run_replica(&one);
        const int64_t n = (int64_t)(single.pool_bytes[TG_POOL_PARAMS] / 4);
        int ok = one.ok;
        CHECK(one.ok, "%s", one.msg);
        for (int k = 0; k < replicas; k++) ok &= CHECK(r[k].ok, "%s", r[k].msg);
        if (ok) {
            /* The replicas stay equal bit for bit: they apply the same summed gradients. */
            for (int k = 1; k < replicas; k++)
                CHECK(memcmp(r[0].params, r[k].params, (size_t)n * 4) == 0, "%d replicas: replica %d differs from 0",
                      replicas, k);
            /* Together they train as one trainer on the whole batch (mean of the replicas'
             * means = the mean over the batch, up to rounding: on CUDA the products also
             * sum over fewer rows per replica, in another order). */
            double rel = tg_rel_err(r[0].params, one.params, n), tol = cuda ? 1e-4 : 1e-5;
            CHECK(rel <= tol, "%d replicas of %d rows against one of %d: parameters differ by %.3g (relative)",
                  replicas, BATCH / replicas, BATCH, rel);
            check_comm_timeline(&dp, r, replicas, STEPS, cuda);
            float mean_loss = 0;
            for (int k = 0; k < replicas; k++) mean_loss += r[k].loss[0] / (float)replicas;
            CHECK(fabsf(mean_loss - one.loss[0]) <= 1e-5f * fabsf(one.loss[0]),
                  "%d replicas: mean first loss %.7g, one trainer %.7g", replicas, mean_loss, one.loss[0]);
        }
        for (int k = 0; k < replicas; k++) free(r[k].params);
        free(one.params);
        tg_plan_free(&dp);
        tg_plan_free(&single);
    }
}

/* The CPU communicator's collectives, each rank in its own thread: the sum adds the ranks'
 * buffers in rank order, the same on every rank; the gather gives every rank every rank's
 * slice, for elements of any size. */
typedef struct rank_arg {
    tg_cpu_comm_group *g;
    int rank, rc;
    float v[5];
    uint16_t slices[3 * 4];
} rank_arg;

static void *collectives_rank(void *arg) {
    rank_arg *a = arg;
    a->rc = tg_cpu_all_reduce_sum(a->g, a->rank, a->v, 5) | tg_cpu_all_gather(a->g, a->rank, a->slices, 4, sizeof(uint16_t));
    return NULL;
}

TG_TEST(test_cpu_comm_collectives) {
    tg_cpu_comm_group *g;
    tg_err err;
    REQUIRE(tg_cpu_comm_group_create(&g, 3, &err) == 0, "%s", err.msg);
    rank_arg a[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        a[r] = (rank_arg){.g = g, .rank = r};
        for (int i = 0; i < 5; i++) a[r].v[i] = (float)(r + 1) * (i == 4 ? 1e8f : 1.0f) + (r == 1 && i == 4 ? -1e8f : 0);
        for (int i = 0; i < 12; i++) a[r].slices[i] = i / 4 == r ? (uint16_t)(100 * r + i) : 0xDEAD; /* others: poison */
        pthread_create(&th[r], NULL, collectives_rank, &a[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) {
        CHECK(a[r].rc == 0, "rank %d: the collectives returned %d", r, a[r].rc);
        for (int i = 0; i < 4; i++) CHECK(a[r].v[i] == 6.0f, "rank %d element %d: %g, want 6", r, i, a[r].v[i]);
        /* (1e8 + (2e8 - 1e8)) + 3e8, in that order */
        const float want = (1e8f + (2e8f - 1e8f)) + 3e8f;
        CHECK(a[r].v[4] == want, "rank %d: %.9g, want %.9g (rank order)", r, a[r].v[4], want);
        for (int i = 0; i < 12; i++)
            CHECK(a[r].slices[i] == 100 * (i / 4) + i, "rank %d gathered element %d: %u, want %d", r, i, a[r].slices[i],
                  100 * (i / 4) + i);
    }
    tg_cpu_comm_group_destroy(g);
    tg_cpu_comm_group *none;
    CHECK(tg_cpu_comm_group_create(&none, 0, &err) != 0 && none == NULL, "a group of 0 ranks created");
}

/* ZeRO-1's reduce-scatter through the threads' communicator: 3 ranks, a view of 10 floats
 * from element 3 of slices of 4 (rank 0 owns view elements [0, 1), rank 1 [1, 5), rank 2
 * [5, 9), element 9 nobody's); each rank's part holds the sum in rank order, the rest its
 * own values. */
typedef struct scatter_arg {
    tg_cpu_comm_group *g;
    int rank, rc;
    float v[10];
} scatter_arg;

static void *scatter_rank(void *arg) {
    scatter_arg *a = arg;
    a->rc = tg_cpu_reduce_scatter_sum(a->g, a->rank, a->v, 10, 3, 4);
    return NULL;
}

TG_TEST(test_cpu_comm_reduce_scatter) {
    tg_cpu_comm_group *g;
    tg_err err;
    REQUIRE(tg_cpu_comm_group_create(&g, 3, &err) == 0, "%s", err.msg);
    scatter_arg a[3];
    pthread_t th[3];
    /* Element 2's values tell the orders apart: (1e8 + (2e8 - 1e8)) + 3e8 in rank order. */
    for (int r = 0; r < 3; r++) {
        a[r] = (scatter_arg){.g = g, .rank = r};
        for (int i = 0; i < 10; i++) a[r].v[i] = (float)((r + 1) * 10 + i);
        a[r].v[2] = (float)(r + 1) * 1e8f + (r == 1 ? -1e8f : 0);
        pthread_create(&th[r], NULL, scatter_rank, &a[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    const int part_lo[3] = {0, 1, 5}, part_hi[3] = {1, 5, 9};
    for (int r = 0; r < 3; r++) {
        CHECK(a[r].rc == 0, "rank %d returned %d", r, a[r].rc);
        for (int i = 0; i < 10; i++) {
            const float own = i == 2 ? (float)(r + 1) * 1e8f + (r == 1 ? -1e8f : 0) : (float)((r + 1) * 10 + i);
            const float sum = i == 2 ? (1e8f + (2e8f - 1e8f)) + 3e8f : (float)(60 + 3 * i);
            const float want = i >= part_lo[r] && i < part_hi[r] ? sum : own;
            CHECK(a[r].v[i] == want, "rank %d element %d: %.9g, want %.9g", r, i, a[r].v[i], want);
        }
    }
    /* The parts as tg_slice_part gives them, and a group of one changes nothing. */
    for (int r = 0; r < 3; r++) {
        int64_t lo, len;
        tg_slice_part(10, 3, 4, r, &lo, &len);
        CHECK(lo == part_lo[r] && len == part_hi[r] - part_lo[r], "rank %d: part [%lld, +%lld)", r, (long long)lo,
              (long long)len);
    }
    tg_cpu_comm_group_destroy(g);
    float one[2] = {1, 2};
    CHECK(tg_cpu_reduce_scatter_sum(NULL, 0, one, 2, 0, 1) == 0 && one[0] == 1 && one[1] == 2, "no group");
}

/* The norm from ZeRO-1's shards: GRAD_SQUARES of each replica's slice (zeros elsewhere),
 * summed over the replicas, then NORM_OF_SQUARES, equals GRAD_NORM of the whole gradient
 * bit for bit (the loss scale divided out alike), at sizes with a short last block. */
TG_TEST(test_cpu_norm_from_shards) {
    for (int replicas = 2; replicas <= 3; replicas++)
        for (int64_t n = 1; n < 5 * TG_NORM_BLOCK; n += 2 * TG_NORM_BLOCK - 333) {
            const int64_t blocks = (n + TG_NORM_BLOCK - 1) / TG_NORM_BLOCK;
            const int64_t slice = ((n + replicas - 1) / replicas + TG_NORM_BLOCK - 1) / TG_NORM_BLOCK * TG_NORM_BLOCK;
            tg_tensor t[4];
            memset(t, 0, sizeof t);
            const int64_t dims[4] = {n, blocks, 1, 1};
            for (int k = 0; k < 4; k++) t[k].ndim = 1, t[k].shape[0] = dims[k], t[k].dtype = TG_F32, t[k].bytes = 4 * dims[k];
            t[0].flags = TG_TENSOR_VIEW;
            tg_plan p;
            memset(&p, 0, sizeof p);
            p.tensors = t, p.n_tensors = 4;
            float *g = malloc((size_t)n * sizeof *g), *sq = calloc((size_t)blocks, sizeof *sq),
                  *part = malloc((size_t)blocks * sizeof *part);
            for (int64_t i = 0; i < n; i++) g[i] = (float)sin((double)i * 0.37 + 0.1) * (i % 7 == 0 ? 1e3f : 1e-2f);
            float scale = 4.0f, whole = 0, sharded = 0;
            tg_op norm = tg_test_op(TG_OP_GRAD_NORM);
            norm.in[0] = 0, norm.in[1] = 2, norm.out[0] = 3, norm.p.count.n = n;
            tg_cpu_op_args na = {.op = &norm, .plan = &p, .in = {g, &scale}, .out = {&whole}};
            tg_cpu_op_run(&na);
            /* Each replica's squares, through a group of `replicas` ranks (so that each writes
             * its own blocks), added as ALL_REDUCE would (exact: the others' blocks are 0). */
            tg_cpu_comm_group *grp;
            tg_err err;
            REQUIRE(tg_cpu_comm_group_create(&grp, replicas, &err) == 0, "%s", err.msg);
            for (int r = 0; r < replicas; r++) {
                tg_op sqop = tg_test_op(TG_OP_GRAD_SQUARES);
                sqop.in[0] = 0, sqop.out[0] = 1, sqop.p.squares.n = n, sqop.p.squares.slice = slice;
                tg_cpu_op_args sa = {.op = &sqop, .plan = &p, .in = {g}, .out = {part}, .comm = grp, .rank = r};
                tg_cpu_op_run(&sa);
                for (int64_t b = 0; b < blocks; b++) {
                    const int mine = b * TG_NORM_BLOCK >= r * slice && b * TG_NORM_BLOCK < (r + 1) * slice;
                    CHECK(mine || part[b] == 0.0f, "replica %d wrote block %lld of another", r, (long long)b);
                    sq[b] += part[b];
                }
            }
            tg_cpu_comm_group_destroy(grp);
            tg_op fin = tg_test_op(TG_OP_NORM_OF_SQUARES);
            fin.in[0] = 1, fin.in[1] = 2, fin.out[0] = 3;
            tg_cpu_op_args fa = {.op = &fin, .plan = &p, .in = {sq, &scale}, .out = {&sharded}};
            tg_cpu_op_run(&fa);
            CHECK(whole > 0 && !memcmp(&whole, &sharded, sizeof whole), "%d replicas, %lld gradients: norm %a, from shards %a",
                  replicas, (long long)n, whole, sharded);
            free(g), free(sq), free(part);
        }
}

/* ZeRO-1 plans: AdamW over one replica's slice, with m and v of the slice only; the
 * slices cover the (padded) parameter pools; the gathers of the parameters (and of their
 * bf16 copies) end the step, so the update is not deferred; the plan file keeps the
 * stage; a job asking for it with one replica is refused, naming the key. */
TG_TEST(test_zero_plan) {
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (int replicas = 2; replicas <= 3; replicas++) {
            const char *extra[] = {"zero_stage=1", bf16 ? "precision=bf16" : "precision=fp32"};
            tg_plan z, plain;
            if (!compile_demo_with(replicas, 2, 3, extra, 2, &z)) return;
            if (!compile_demo_with(replicas, 2, 3, extra + 1, 1, &plain)) {
                tg_plan_free(&z);
                return;
            }
            const int64_t n = (int64_t)(plain.tensors[plain.io.params_all].bytes / 4);
            int adamw = -1, gathers = 0, last = z.n_ops - 1;
            for (int o = 0; o < z.n_ops; o++) {
                const tg_op *op = &z.ops[o];
                if (op->kind == TG_OP_ADAMW) adamw = o;
                if (op->kind != TG_OP_ALL_GATHER || op->in[1] >= 0) continue; /* the embedding's: the backward's */
                gathers++;
                const tg_tensor *t = &z.tensors[op->in[0]];
                CHECK(o > adamw && adamw >= 0 && t->offset == 0 && (t->flags & TG_TENSOR_VIEW) &&
                          tg_tensor_numel(t) == op->p.all_gather.slice * replicas && t->bytes == z.pool_bytes[t->pool],
                      "all_gather %d over %s: %lld elements of %lld bytes in a pool of %llu", o, t->name,
                      (long long)tg_tensor_numel(t), (long long)t->bytes, (unsigned long long)z.pool_bytes[t->pool]);
            }
            REQUIRE(adamw >= 0, "no adamw");
            const int64_t slice = z.ops[adamw].p.adamw.zero_slice;
            CHECK(slice > 0 && slice * replicas >= n && (slice - TG_NORM_BLOCK) * replicas < n && slice % TG_NORM_BLOCK == 0,
                  "%d replicas: slice %lld for %lld parameters", replicas, (long long)slice, (long long)n);
            /* The gradients are summed by reduce-scatters over the slices (each replica gets
             * the sums its update reads), the norm from the replicas' blocks of squares. */
            int scatters = 0, sums = 0, squares = -1, norm = -1, norms = 0;
            for (int o = 0; o < z.n_ops; o++) {
                const tg_op *op = &z.ops[o];
                if (op->kind == TG_OP_REDUCE_SCATTER) {
                    scatters++;
                    CHECK(op->p.reduce_scatter.slice == slice && z.tensors[op->in[0]].pool == TG_POOL_GRADS &&
                              z.tensors[op->in[0]].offset == (uint64_t)op->p.reduce_scatter.first * 4,
                          "reduce_scatter %d: slice %lld first %lld", o, (long long)op->p.reduce_scatter.slice,
                          (long long)op->p.reduce_scatter.first);
                }
                if (op->kind == TG_OP_ALL_REDUCE) {
                    sums++;
                    CHECK(op->in[0] == squares && squares >= 0, "all_reduce %d sums tensor %d, not the squares", o, op->in[0]);
                }
                if (op->kind == TG_OP_GRAD_SQUARES) {
                    squares = op->out[0];
                    CHECK(op->p.squares.slice == slice && op->in[0] == z.io.grads_all, "grad_squares slice %lld",
                          (long long)op->p.squares.slice);
                }
                if (op->kind == TG_OP_NORM_OF_SQUARES) norm = o, CHECK(op->in[0] == squares, "norm of other squares");
                norms += op->kind == TG_OP_GRAD_NORM;
            }
            CHECK(scatters >= 1 && sums == 1 && norm >= 0 && norms == 0 && norm < adamw,
                  "%d reduce_scatter, %d all_reduce, norm of squares at %d, %d grad_norm", scatters, sums, norm, norms);
            CHECK(gathers == 1 + bf16 && z.ops[last].kind == TG_OP_ALL_GATHER, "%d gathers, last op %s", gathers,
                  tg_op_name(z.ops[last].kind));
            CHECK(tg_tensor_numel(&z.tensors[z.io.m_all]) == slice && tg_tensor_numel(&z.tensors[z.io.v_all]) == slice,
                  "m and v are not the slice");
            CHECK(z.pool_bytes[TG_POOL_OPTIM] <= (uint64_t)slice * 8 + 4096,
                  "optimizer pool %llu bytes against %llu unsharded", (unsigned long long)z.pool_bytes[TG_POOL_OPTIM],
                  (unsigned long long)plain.pool_bytes[TG_POOL_OPTIM]);
            tg_memory_report mr;
            tg_err err = {{0}};
            CHECK(tg_plan_check_memory(&z, &mr, &err) == 0, "memory check: %s", err.msg);
            /* Through the plan file and back. */
            uint8_t *bytes = NULL;
            size_t len = 0;
            tg_plan back;
            if (CHECK(tg_plan_encode(&z, &bytes, &len, &err) == 0, "%s", err.msg)) {
                if (CHECK(tg_plan_decode(bytes, len, "zero.plan", &back, &err) == 0, "%s", err.msg)) {
                    CHECK(back.train.zero_stage == 1 && back.ops[adamw].p.adamw.zero_slice == slice, "the plan file lost the stage");
                    tg_plan_free(&back);
                }
                free(bytes);
            }
            tg_plan_free(&z);
            tg_plan_free(&plain);
        }
    tg_err err = {{0}};
    tg_job job;
    const char *one[] = {"zero_stage=1"};
    tg_plan p;
    int loaded = tg_job_load("examples/demo-classify.job", one, 1, &job, &err) == 0;
    CHECK(loaded && tg_compile(&job, &p, &err) != 0 && strstr(err.msg, "zero_stage") &&
              strstr(err.msg, "data_parallel >= 2"),
          "zero_stage with one replica: '%s'", err.msg);
    const char *two[] = {"zero_stage=2"};
    CHECK(tg_job_load("examples/demo-classify.job", two, 1, &job, &err) != 0 && strstr(err.msg, "zero_stage"),
          "zero_stage 2 accepted: '%s'", err.msg);
}

/* ZeRO-1 trains exactly as plain data parallelism: every replica updates its slice with
 * the same summed gradients and the gathers share the slices, so the parameters agree
 * bit for bit with the plain replicas' (2 and 3 replicas, the last slice short; fp32 and
 * bf16 plans). */
TG_TEST(test_zero_matches_plain_data_parallel) {
    enum { STEPS = 4, BATCH = 2 };
    const int cuda = tg_test_device();
    /* The two plans must run the same GEMM algorithms to agree bit for bit: timed tuning
     * may pick differently per plan, the heuristic's pick depends on the shapes only. It
     * also makes the first collective run inside the graph capture (no eager tuning step
     * before it), which NCCL must be ready for. */
    const char *tune = getenv("TUNEGRAPH_GEMM_TUNE");
    char *tune_saved = tune ? strdup(tune) : NULL;
    setenv("TUNEGRAPH_GEMM_TUNE", "0", 1);
    for (int bf16 = 0; bf16 <= 1; bf16++)
        for (int replicas = 2; replicas <= 3; replicas++) {
            if (cuda && tg_cuda_device_count() < replicas) {
                printf("    %d replicas not run: %d GPU(s)\n", replicas, tg_cuda_device_count());
                continue;
            }
            const char *extra[] = {"zero_stage=1", bf16 ? "precision=bf16" : "precision=fp32"};
            replica runs[2][3] = {{{0}}};
            size_t bytes = 0; /* params.all's: the same in both plans (ZeRO only pads the pool past it) */
            for (int zero = 0; zero <= 1; zero++) {
                tg_plan plan;
                if (!compile_demo_with(replicas, BATCH, STEPS, extra + 1 - zero, 1 + zero, &plan)) goto done;
                bytes = plan.tensors[plan.io.params_all].bytes;
                run_replicas(&plan, replicas, STEPS, runs[zero]);
                tg_plan_free(&plan);
            }
            for (int k = 0; k < replicas; k++) {
                int ok = CHECK(runs[0][k].ok, "plain: %s", runs[0][k].msg) & CHECK(runs[1][k].ok, "ZeRO-1: %s", runs[1][k].msg);
                if (ok) {
                    CHECK(memcmp(runs[0][k].params, runs[1][k].params, bytes) == 0,
                          "%s, %d replicas: replica %d's parameters differ between ZeRO-1 and plain", bf16 ? "bf16" : "fp32",
                          replicas, k);
                    CHECK(memcmp(runs[0][k].loss, runs[1][k].loss, sizeof runs[0][k].loss) == 0,
                          "%s, %d replicas: replica %d's losses differ", bf16 ? "bf16" : "fp32", replicas, k);
                }
                free(runs[0][k].params), free(runs[1][k].params);
            }
        }
done:
    if (tune_saved) setenv("TUNEGRAPH_GEMM_TUNE", tune_saved, 1);
    else unsetenv("TUNEGRAPH_GEMM_TUNE");
    free(tune_saved);
}
