/* The run command's checkpoints: the stop step the replicas agree on, and replica 0
 * gathering the replicas' parts into one file (cli/checkpoints.h). */
#include "cli/checkpoints.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

void run_checkpoints_init(run_checkpoints *c, const char *dir, const tg_plan *plan, int32_t start_step,
                          const volatile sig_atomic_t *stop_signal) {
    memset(c, 0, sizeof *c);
    c->dir = dir;
    c->every = plan->run.checkpoint_every;
    c->keep = plan->run.keep_checkpoints;
    c->replicas = plan->train.replicas > 1 ? plan->train.replicas : 1;
    c->parts = c->replicas > 1 && plan->train.zero_stage > 0;
    c->stop_signal = stop_signal;
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->changed, NULL);
    c->reserved = start_step;
    c->stop_at = -1;
    for (int r = 0; r < TG_MAX_DATA_PARALLEL; r++) c->part_step[r] = -1;
}

void run_checkpoints_free(run_checkpoints *c) {
    for (int r = 0; r < TG_MAX_DATA_PARALLEL; r++) tg_checkpoint_free(&c->part[r]);
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->lock);
}

/* With the lock held: chooses the stop step when a stop has been requested (replica
 * threads; rank processes agree on theirs in run_checkpoints_world_stop). */
static void choose_stop(run_checkpoints *c) {
    if (c->stop_at < 0 && *c->stop_signal && !c->gather) c->stop_at = c->reserved;
}

int64_t run_checkpoints_gate(void *ctx, int64_t launched, int64_t steps) {
    run_checkpoints *c = ctx;
    pthread_mutex_lock(&c->lock);
    choose_stop(c);
    int64_t allowed = steps;
    if (c->stop_at >= 0) {
        allowed = c->stop_at - launched;
        if (allowed < 0) allowed = 0;
        if (allowed > steps) allowed = steps;
    } else if (launched + steps > c->reserved) {
        c->reserved = launched + steps;
    }
    pthread_mutex_unlock(&c->lock);
    return allowed;
}

int64_t run_checkpoints_stop_step(run_checkpoints *c) {
    pthread_mutex_lock(&c->lock);
    choose_stop(c);
    const int64_t stop = c->stop_at;
    pthread_mutex_unlock(&c->lock);
    return stop;
}

int run_checkpoints_due(const run_checkpoints *c, int32_t step) { return c->every > 0 && step % c->every == 0; }

void run_checkpoints_use_world(run_checkpoints *c, run_checkpoints_gather gather, void *ctx, int agree_every) {
    c->gather = gather, c->gather_ctx = ctx, c->agree_every = agree_every > 0 ? agree_every : 1;
}

int run_checkpoints_world_stop(run_checkpoints *c, int64_t step, int64_t total, tg_err *err) {
    if (c->stop_at >= 0 || (step % c->agree_every && step < total)) return 0;
    const int32_t mine = (int32_t)*c->stop_signal;
    int32_t all[TG_MAX_DATA_PARALLEL];
    if (c->gather(c->gather_ctx, &mine, all, sizeof mine, err))
        return tg_fail_context(err, "agreeing on a stop at step %lld", (long long)step);
    for (int r = 0; r < c->replicas && !c->stop_with; r++) c->stop_with = all[r];
    if (c->stop_with) {
        pthread_mutex_lock(&c->lock);
        c->stop_at = step;
        pthread_mutex_unlock(&c->lock);
    }
    return 0;
}

/* ZeRO-1's slices (AdamW's m and v) of every rank gathered; rank 0 (ck not NULL) adds the
 * other ranks' to its checkpoint as theirs, as replica threads' parts are. */
static int world_parts(run_checkpoints *c, tg_trainer *t, tg_checkpoint *ck, tg_err *err) {
    const int sliced[2] = {t->plan->io.m_all, t->plan->io.v_all};
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        const tg_tensor *x = &t->plan->tensors[sliced[k]];
        const size_t bytes = (size_t)x->bytes;
        uint8_t *mine = tg_malloc(bytes), *all = tg_malloc(bytes * (size_t)c->replicas);
        rc = mine && all ? 0 : tg_fail(err, "out of memory gathering %s for the checkpoint", x->name);
        if (!rc) rc = tg_trainer_read(t, sliced[k], mine, err);
        if (!rc && c->gather(c->gather_ctx, mine, all, bytes, err))
            rc = tg_fail_context(err, "checkpoint at step %d: gathering %s from the ranks", t->steps_done, x->name);
        for (int r = 1; ck && r < c->replicas && !rc; r++) {
            void *part = tg_malloc(bytes);
            if (!part) rc = tg_fail(err, "out of memory gathering %s for the checkpoint", x->name);
            else memcpy(part, all + (size_t)r * bytes, bytes),
                 rc = tg_checkpoint_add_tensor(ck, x->name, r, x->dtype, x->ndim, x->shape, part, err);
        }
        free(mine), free(all);
    }
    return rc;
}

int run_checkpoints_hand_over(run_checkpoints *c, tg_trainer *t, tg_err *err) {
    if (!c->parts) return 0;
    if (c->gather) return world_parts(c, t, NULL, err);
    tg_checkpoint part;
    if (tg_trainer_checkpoint(t, &part, 0, err)) return -1;
    pthread_mutex_lock(&c->lock);
    while (c->part_step[t->rank] >= 0) pthread_cond_wait(&c->changed, &c->lock);
    c->part[t->rank] = part;
    c->part_step[t->rank] = t->steps_done;
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->lock);
    return 0;
}

int run_checkpoints_write(run_checkpoints *c, tg_trainer *t, char **path, tg_err *err) {
    *path = NULL;
    tg_checkpoint ck;
    if (tg_trainer_checkpoint(t, &ck, 1, err)) return -1;
    int rc = c->parts && c->gather ? world_parts(c, t, &ck, err) : 0;
    for (int r = 1; c->parts && !c->gather && r < c->replicas && !rc; r++) {
        pthread_mutex_lock(&c->lock);
        while (c->part_step[r] < 0) pthread_cond_wait(&c->changed, &c->lock);
        if (c->part_step[r] != t->steps_done) {
            rc = tg_fail(err, "checkpoint at step %d: replica %d handed over its part at step %d", t->steps_done, r,
                         c->part_step[r]);
            tg_checkpoint_free(&c->part[r]);
        } else {
            rc = tg_checkpoint_take_tensors(&ck, &c->part[r], err);
        }
        c->part_step[r] = -1;
        pthread_cond_broadcast(&c->changed);
        pthread_mutex_unlock(&c->lock);
    }
    if (!rc) rc = tg_checkpoint_save_in_dir(&ck, c->dir, c->keep, path, err);
    tg_checkpoint_free(&ck);
    return rc;
}
