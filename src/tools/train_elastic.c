/* src/tools/train_elastic.c — fsdp-train going on without a lost rank: buddy
 * snapshots every --replica-every updates (fsdp/replica.h) and, under
 * fsdp-run --min-nproc, the rebuild after a loss: the survivors' world, the
 * engine and model over it, the state of the newest complete snapshot from
 * memory. The windows of step s are a function of (seed, s) split by rank
 * and world size, so the data position needs nothing beyond the step. */
#include <stdio.h>
#include <string.h>

#include "tools/train.h"

/* Says so when the world's new size made the shard size differ from
 * --shard-size (rank 0, on stderr beside JSON; every rank chose the same). */
static void note_layout(const trainer_t *t) {
  int want = t->o->cfg.shard_size, got = fsdp_engine_config(t->eng)->shard_size;
  if (t->rank != 0 || !want || want == got) return;
  FILE *f = t->o->json ? stderr : stdout;
  if (got == t->nranks)
    fprintf(f, "fsdp-train: --shard-size %d does not divide the %d ranks of the new world: "
            "sharding over all %d (plain %s)\n", want, t->nranks, t->nranks,
            fsdp_strategy_name(t->o->cfg.strategy));
  else
    fprintf(f, "fsdp-train: --shard-size %d does not divide the %d ranks of the new world: "
            "sharding over groups of %d, the smallest divisor above %d (HSDP %d x %d)\n", want,
            t->nranks, got, want, t->nranks / got, got);
  fflush(f);
}

/* The joining worker's side of the survivors' rebuild (rebuild below): the
 * save directory's lock, then the shard of the snapshot they restore. */
static int join(trainer_t *t) {
  if (!t->o->replica_every) {
    fprintf(stderr, "fsdp-train: rank %d: joining a running job needs --replica-every, as its "
            "peers have\n", t->rank);
    return -1;
  }
  if (t->o->save_dir && fsdp_ckpt_lock(t->eng, t->o->save_dir, &t->lock)) return -1;
  note_layout(t);
  int64_t s;
  if (fsdp_replica_join(t->eng, t->o->replica_every, &t->replica, NULL, &s)) return -1;
  t->start_step = (int)s;
  t->saved_through = (int)s; /* the others saved it */
  if (t->rank == 0) printf("joined at step %lld\n", (long long)s);
  return 0;
}

int train_replica_start(trainer_t *t) {
  t->resumed_from = t->lost_steps = -1;
  if (t->joining) return join(t);
  if (!t->o->replica_every) return 0;
  if (fsdp_replica_create(t->eng, t->o->replica_every, &t->replica)) return -1;
  fsdp_replica_info_t info;
  if (fsdp_replica_info(t->replica, &info)) return -1;
  if (t->rank == 0 && !t->o->json)
    printf("  buddy replicas every %d updates: %.2f MiB/rank of host memory, 4 snapshots of "
           "%.2f MiB (rank r's copy on rank r + %d)%s\n", info.every,
           info.host_bytes / 1048576.0, info.snapshot_bytes / 1048576.0,
           (info.buddy - info.rank + info.world_size) % (info.world_size ? info.world_size : 1),
           fsdp_world_elastic() ? "; elastic: a lost rank is restored from them" : "");
  return 0;
}

int train_snapshot(trainer_t *t, int step) {
  if (!t->replica) return 0;
  if (t->resumed_from >= 0 && t->rank == 0) {
    fsdp_world_note_resumed(t->world, t->resumed_from, t->lost_steps);
    if (t->o->json)
      printf("{\"event\":\"resumed\",\"step\":%d,\"ranks\":%d,\"from_step\":%lld,"
             "\"redone\":%lld}\n", step, t->nranks, (long long)t->resumed_from,
             (long long)t->lost_steps);
    else
      printf("resumed: first step done in the world of %d ranks (from the snapshot of step "
             "%lld, %lld step%s redone)\n", t->nranks, (long long)t->resumed_from,
             (long long)t->lost_steps, t->lost_steps == 1 ? "" : "s");
    fflush(stdout);
  }
  t->resumed_from = -1;
  fsdp_ckpt_meta_t meta = {0};
  /* The data position: windows are drawn by step; the seed names the stream. */
  if (fsdp_ckpt_meta_set(&meta, "step", step) ||
      fsdp_ckpt_meta_set(&meta, "seed", (int64_t)t->o->seed))
    return -1;
  if (step % t->o->replica_every == 0) train_fault_snapshot(t, step);
  return fsdp_replica_snapshot(t->replica, &meta, NULL) ? -1 : 0;
}

/* Everything made over the old world goes, the snapshots stay. */
static void tear_down(trainer_t *t, const train_model_t *model) {
  fsdp_replica_disconnect(t->replica);
  fsdp_ckpt_unlock(t->lock); /* rank 0 may change: the new one takes it */
  t->lock = NULL;
  model->unbuild(model->task);
  fsdp_engine_destroy(t->eng);
  t->eng = NULL;
}

static int rebuild(trainer_t *t, const train_model_t *model) {
  t->resized = 1;
  if (train_engine(t, t->total_steps)) {
    fprintf(stderr, "fsdp-train: rank %d: %s (--global-batch %lld must split over the %d "
            "ranks left)\n", t->rank, fsdp_last_error(), (long long)t->o->global_batch,
            t->nranks);
    return -1;
  }
  if (model->build(t, model->task)) return -1;
  note_layout(t);
  return t->o->save_dir && fsdp_ckpt_lock(t->eng, t->o->save_dir, &t->lock) ? -1 : 0;
}

int train_grow(trainer_t *t, int step, const train_model_t *model) {
  if (!t->replica || !fsdp_world_elastic() || step % t->o->replica_every) return 0;
  /* Rank 0's view decides: the word reaches the ranks' pipes at different times. */
  double pending = t->rank == 0 && fsdp_world_change_pending();
  if (fsdp_broadcast(fsdp_engine_comm(t->eng), &pending, 1, FSDP_F64, 0, FSDP_HOST_STREAM))
    return -1;
  if (!pending) return 0;
  double t0 = fsdp_time_now();
  if (fsdp_replica_wait(t->replica)) return -1; /* every survivor holds its own snapshot */
  tear_down(t, model);
  fsdp_world_change_t c;
  if (fsdp_world_rejoin(&t->world, NULL, &c)) return -1;
  t->rank = c.rank;
  t->nranks = c.size;
  int64_t s;
  if (rebuild(t, model) || fsdp_replica_restore(t->replica, t->eng, NULL, &s)) return -1;
  if (s != step)
    return fprintf(stderr, "fsdp-train: rank %d: grew back from the snapshot of step %lld, not "
                   "of step %d\n", t->rank, (long long)s, step), -1;
  t->resumed_from = s;
  t->lost_steps = 0;
  if (t->rank == 0 && t->o->json)
    printf("{\"event\":\"grow\",\"old_ranks\":%d,\"ranks\":%d,\"shard_size\":%d,\"step\":%d,"
           "\"seconds\":%.3f}\n", c.old_size, c.size, fsdp_engine_config(t->eng)->shard_size,
           step, fsdp_time_now() - t0);
  else if (t->rank == 0)
    printf("grew: rank %d of %d is now rank %d of %d at step %d (%.2f s)\n", c.old_rank,
           c.old_size, c.rank, c.size, step, fsdp_time_now() - t0);
  return 0;
}

int train_recover(trainer_t *t, int step, const train_model_t *model, int *resume) {
  if (!t->replica || !fsdp_world_elastic() || t->error[0] || !fsdp_world_failed(t->world))
    return -1;
  double t0 = fsdp_time_now();
  fprintf(stderr, "fsdp-train: rank %d: update %d failed: %s; waiting for fsdp-run's word on "
          "the survivors' world\n", t->rank, step, fsdp_last_error());
  tear_down(t, model);
  fsdp_world_change_t c;
  if (fsdp_world_rejoin(&t->world, NULL, &c)) return -1;
  t->rank = c.rank;
  t->nranks = c.size;
  if (rebuild(t, model)) return -1;
  int64_t s;
  if (fsdp_replica_restore(t->replica, t->eng, NULL, &s)) return -1;
  t->resumed_from = s;
  if (step - 1 > t->saved_through) t->saved_through = step - 1;
  t->lost_steps = step - 1 - s;
  *resume = (int)s;
  if (t->rank == 0 && t->o->json)
    printf("{\"event\":\"shrink\",\"old_ranks\":%d,\"ranks\":%d,\"shard_size\":%d,"
           "\"failed_step\":%d,\"from_step\":%lld,\"seconds\":%.3f}\n", c.old_size, c.size,
           fsdp_engine_config(t->eng)->shard_size, step, (long long)s, fsdp_time_now() - t0);
  else if (t->rank == 0)
    printf("shrunk: rank %d of %d is now rank %d of %d; restored the snapshot of step %lld from "
           "memory in %.2f s; redoing %lld step%s\n", c.old_rank, c.old_size, c.rank, c.size,
           (long long)s, fsdp_time_now() - t0, (long long)t->lost_steps,
           t->lost_steps == 1 ? "" : "s");
  return 0;
}
