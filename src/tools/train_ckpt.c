/* src/tools/train_ckpt.c — fsdp-train's checkpoints: the save directory
 * opened before the first step (locked, probed, `latest` repaired), --resume
 * after the model is materialised, --save-dir/--save-every after updates,
 * --stop-after.
 *
 * What a resume needs besides the engine's shards and step: nothing. The text
 * windows of step s are a pure function of (seed, s), the MLP sampler's batch
 * of (seed, epoch, batch) with epoch and batch derived from s, sampling of the
 * seed, and the schedule and AdamW's bias correction of the step the engine
 * restores. The seed, global batch and schedule length are stored with the
 * checkpoint so a resume with different ones is pointed out. */
#include <dirent.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
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
  if (!strcmp(t->o->model, "mlp")) return st;
  /* What fsdp-eval needs to draw fsdp-train's validation windows (and its
   * sampling context) again, and for GPT-2 to rebuild the model (n_head is in
   * no tensor's shape; a Llama's manifest records its configuration). */
  const char *seq_keys[] = {"seq_len", "eval_batches", "eval_global_batch"};
  int64_t seq_values[] = {t->o->seq_len, t->o->eval_batches,
                          t->o->global_batch / t->o->cfg.grad_accum};
  for (int i = 0; i < 3 && !st; i++) st = fsdp_ckpt_meta_set(meta, seq_keys[i], seq_values[i]);
  if (strcmp(t->o->model, "gpt2")) return st;
  const fsdp_gpt2_config_t *c = &t->o->gpt;
  const char *keys[] = {"gpt2.n_layer", "gpt2.n_head", "gpt2.n_embd", "gpt2.block_size",
                        "gpt2.vocab_size"};
  int64_t values[] = {c->n_layer, c->n_head, c->n_embd, c->block_size, c->vocab_size};
  for (int i = 0; i < 5 && !st; i++) st = fsdp_ckpt_meta_set(meta, keys[i], values[i]);
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
 * save (steps are never overwritten unless asked): say so before training.
 * Holding checkpoints: a `latest` (even dangling) or any step-<k> directory;
 * rank 0 looks and every rank follows. */
static int check_fresh(const trainer_t *t) {
  const train_opts_t *o = t->o;
  char latest[4096];
  struct stat sb;
  snprintf(latest, sizeof latest, "%s/latest", o->save_dir);
  double held = t->rank == 0 && (lstat(latest, &sb) == 0 || has_steps(o->save_dir));
  if (o->save_overwrite) return 0;
  if (train_sum(t, &held, 1)) return -1;
  if (held == 0) return 0;
  if (t->rank == 0)
    fprintf(stderr, "fsdp-train: %s already holds checkpoints: pass --resume auto to "
            "continue from them, --save-overwrite to replace them, or another --save-dir\n",
            o->save_dir);
  return -1;
}

/* Before the first step, so that nothing is trained for a directory that
 * cannot take it: the run lock (a second trainer is refused, the holder
 * named), then every rank's writability and the free space for a checkpoint. */
static int open_save_dir(trainer_t *t) {
  const train_opts_t *o = t->o;
  uint64_t need, avail;
  if (fsdp_ckpt_lock(t->eng, o->save_dir, &t->lock) ||
      fsdp_ckpt_probe(t->eng, o->save_dir, &need, &avail))
    return -1;
  if (t->rank == 0 && !o->json)
    printf("save dir %s: locked and writable; a checkpoint takes %.2f MiB, %.2f MiB free\n",
           o->save_dir, need / 1048576.0, avail / 1048576.0);
  return 0;
}

/* Whether --resume names the save directory itself (auto, or the same path). */
static int resumes_save_dir(const train_opts_t *o) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!strcmp(o->resume, "auto")) return 1;
  return o->save_dir && realpath(o->resume, a) && realpath(o->save_dir, b) && !strcmp(a, b);
}

/* Points `latest` at the newest complete step (it lags after a failed update,
 * or is missing or dangling); 1 when there is a checkpoint to load. */
static int repair_latest(trainer_t *t, const char *dir) {
  fsdp_ckpt_repair_t rep;
  if (fsdp_ckpt_repair(t->eng, dir, &rep)) return -1;
  if (rep.changed && t->rank == 0)
    fprintf(stderr, "fsdp-train: warning: %s/latest repaired (%s): now step-%" PRId64 "\n", dir,
            rep.reason, rep.step);
  if (rep.step < 0 && t->rank == 0 && !t->o->json)
    printf("no checkpoint in %s yet: starting from step 0\n", dir);
  return rep.step >= 0;
}

/* A Llama checkpoint (an import, a save) holds this run's configuration:
 * the tensors' shapes leave heads, RoPE and epsilon open. Every rank reads
 * the manifest, so every rank fails alike. */
static int check_llama(const char *path, const fsdp_llama_config_t *l) {
  fsdp_ckpt_t c;
  if (fsdp_ckpt_open(path, &c)) return -1;
  fsdp_status_t st = fsdp_ckpt_llama_check(c, l);
  fsdp_ckpt_close(c);
  return st ? -1 : 0;
}

int train_resume(trainer_t *t) {
  const train_opts_t *o = t->o;
  if (o->save_dir && open_save_dir(t)) return -1;
  if (!o->resume) return o->save_dir ? check_fresh(t) : 0;
  const char *path = strcmp(o->resume, "auto") ? o->resume : o->save_dir;
  int found = resumes_save_dir(o) ? repair_latest(t, path) : 1;
  if (found <= 0) return found;
  fsdp_ckpt_meta_t meta = {0};
  char dir[4096];
  double t0 = fsdp_time_now();
  if (!strcmp(o->model, "llama") && check_llama(path, &o->llama)) return -1;
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
  if (step <= t->saved_through) return 0; /* redone after a shrink: the old world's save stands */
  fsdp_ckpt_meta_t meta;
  if (trainer_meta(t, &meta)) return -1;
  fsdp_ckpt_save_opts_t so = FSDP_CKPT_SAVE_OPTS_INIT;
  so.overwrite = o->save_overwrite;
  so.meta = &meta;
  if (!strcmp(o->model, "llama")) so.llama = &o->llama; /* eval and export --hf read it */
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
