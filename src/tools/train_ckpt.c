/* src/tools/train_ckpt.c — fsdp-train's checkpoints: --resume after the model
 * is materialised, --save-dir/--save-every after updates, --stop-after.
 *
 * What a resume needs besides the engine's shards and step: nothing. The text
 * windows of step s are a pure function of (seed, s), the MLP sampler's batch
 * of (seed, epoch, batch) with epoch and batch derived from s, sampling of the
 * seed, and the schedule and AdamW's bias correction of the step the engine
 * restores. The seed, global batch and schedule length are stored with the
 * checkpoint so a resume with different ones is pointed out. */
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fsdp/ckpt.h"
#include "tools/train.h"

int train_end_step(const trainer_t *t) {
  int stop = t->o->stop_after;
  return stop > 0 && stop < t->total_steps ? stop : t->total_steps;
}

static fsdp_status_t trainer_meta(const trainer_t *t, fsdp_ckpt_meta_t *meta) {
  meta->n = 0;
  fsdp_status_t st = fsdp_ckpt_meta_set(meta, "seed", (int64_t)t->o->seed);
  if (!st) st = fsdp_ckpt_meta_set(meta, "global_batch", t->o->global_batch);
  if (!st) st = fsdp_ckpt_meta_set(meta, "total_steps", t->total_steps);
  return st;
}

/* A step-<k> directory (not a leftover step-<k>.tmp-*) in dir. */
static int has_steps(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *ent;
  int found = 0;
  while (d && !found && (ent = readdir(d)) != NULL)
    found = !strncmp(ent->d_name, "step-", 5) && !strchr(ent->d_name, '.');
  if (d) closedir(d);
  return found;
}

static void warn_mismatch(const trainer_t *t, const fsdp_ckpt_meta_t *meta) {
  fsdp_ckpt_meta_t now;
  if (t->rank != 0 || trainer_meta(t, &now)) return;
  for (int i = 0; i < now.n; i++) {
    int64_t then;
    if (fsdp_ckpt_meta_get(meta, now.kv[i].key, &then) == FSDP_SUCCESS && then != now.kv[i].value)
      fprintf(stderr, "fsdp-train: warning: the checkpoint was trained with %s %" PRId64 ", this "
              "run uses %" PRId64 ": it will not continue exactly as the original run would\n",
              now.kv[i].key, then, now.kv[i].value);
  }
}

/* A fresh run into a directory that holds checkpoints would fail at its first
 * save (steps are never overwritten unless asked): say so before training. */
static int check_fresh(const trainer_t *t) {
  const train_opts_t *o = t->o;
  char latest[4096];
  struct stat sb;
  snprintf(latest, sizeof latest, "%s/latest", o->save_dir);
  if (o->save_overwrite || stat(latest, &sb) != 0) return 0;
  if (t->rank == 0)
    fprintf(stderr, "fsdp-train: %s already holds checkpoints (%s): pass --resume auto to "
            "continue from them, --save-overwrite to replace them, or another --save-dir\n",
            o->save_dir, latest);
  return -1;
}

int train_resume(trainer_t *t) {
  const train_opts_t *o = t->o;
  if (!o->resume) return o->save_dir ? check_fresh(t) : 0;
  const char *path = strcmp(o->resume, "auto") ? o->resume : o->save_dir;
  char latest[4096];
  struct stat sb;
  snprintf(latest, sizeof latest, "%s/latest", path);
  if (!strcmp(o->resume, "auto") && stat(latest, &sb) != 0 && !has_steps(path)) {
    if (t->rank == 0 && !o->json) printf("no checkpoint in %s yet: starting from step 0\n", path);
    return 0;
  }
  fsdp_ckpt_meta_t meta = {0};
  char dir[4096];
  double t0 = fsdp_time_now();
  if (fsdp_ckpt_load(t->eng, path, NULL, &meta, dir, sizeof dir)) return -1;
  double secs = fsdp_time_now() - t0;
  t->start_step = (int)fsdp_engine_step_count(t->eng);
  warn_mismatch(t, &meta);
  if (t->rank == 0 && o->json)
    printf("{\"event\":\"resume\",\"step\":%d,\"path\":\"%s\",\"seconds\":%.3f}\n",
           t->start_step, dir, secs);
  else if (t->rank == 0)
    printf("resumed from %s at step %d (%.2f s)\n", dir, t->start_step, secs);
  fflush(stdout);
  return 0;
}

int train_save(trainer_t *t, int step) {
  const train_opts_t *o = t->o;
  if (!o->save_dir || !((o->save_every > 0 && step % o->save_every == 0) || step == t->total_steps))
    return 0;
  fsdp_ckpt_meta_t meta;
  if (trainer_meta(t, &meta)) return -1;
  fsdp_ckpt_save_opts_t so = FSDP_CKPT_SAVE_OPTS_INIT;
  so.overwrite = o->save_overwrite;
  so.meta = &meta;
  char dir[4096];
  double t0 = fsdp_time_now();
  if (fsdp_ckpt_save(t->eng, o->save_dir, &so, dir, sizeof dir)) return -1;
  double secs = fsdp_time_now() - t0;
  if (t->rank == 0 && o->json)
    printf("{\"event\":\"checkpoint\",\"step\":%d,\"path\":\"%s\",\"seconds\":%.3f}\n", step, dir,
           secs);
  else if (t->rank == 0)
    printf("%scheckpoint %5d -> %s (%.2f s)\n", t->tty ? "\n" : "", step, dir, secs);
  fflush(stdout);
  return 0;
}
