/* src/ckpt/dir.c — a save directory that runs share safely: the writability
 * and free-space probe, and the repair of `latest` from the newest complete
 * step (the run lock and the per-save guards are lock.c's). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

/* ---- the probe -------------------------------------------------------------------- */

/* Create, write a block, fsync, remove: what a save does, in miniature. */
static fsdp_status_t probe_write(const char *save_dir, int rank) {
  char path[CKPT_PATH_MAX], host[64] = "host";
  static const char block[4096];
  ckpt_writer_t w = {.fd = -1};
  gethostname(host, sizeof host - 1);
  fsdp_status_t st = ckpt_make_dirs(save_dir);
  if (!st) st = ckpt_path(path, sizeof path, "%s/.probe-%s-%d-rank%d", save_dir, host,
                          (int)getpid(), rank);
  if (!st) st = ckpt_writer_open(&w, path, NULL);
  if (!st) st = ckpt_write(&w, block, sizeof block);
  if (st) ckpt_writer_abort(&w);
  else st = ckpt_writer_close(&w);
  if (w.path[0] && unlink(path) != 0 && errno != ENOENT && !st)
    st = fsdp_error(FSDP_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
  if (!st) st = ckpt_fsync_dir(save_dir);
  if (!st) return FSDP_SUCCESS;
  char why[1024];
  snprintf(why, sizeof why, "%s", fsdp_last_error());
  return fsdp_error(st, "rank %d: the save directory is not writable: %s", rank, why);
}

static uint64_t round_up(uint64_t n, uint64_t block) { return (n + block - 1) / block * block; }

/* Bytes one checkpoint of the engine takes, in blocks: every rank's shard
 * (header, parameters, optimizer state), the manifest, `latest`, a directory. */
static fsdp_status_t checkpoint_bytes(fsdp_engine_t e, uint64_t block, uint64_t *need) {
  ckpt_manifest_t m = {0};
  sbuf_t sb = {0};
  fsdp_status_t st = ckpt_manifest_from_engine(e, &m);
  if (!st) st = ckpt_manifest_write(&m, &sb);
  uint64_t total = round_up(sb.len + 64, block) + 2 * block;
  for (int r = 0; !st && r < m.world; r++) {
    uint64_t bytes = CKPT_HEADER_BYTES;
    for (int u = 0; u < m.n_units; u++)
      bytes += (uint64_t)(m.units[u].ranges[r].end - m.units[u].ranges[r].begin) *
               (uint64_t)m.n_states * sizeof(float);
    total += round_up(bytes, block);
  }
  sb_free(&sb);
  ckpt_manifest_free(&m);
  if (!st) *need = total;
  return st;
}

static fsdp_status_t probe_space(fsdp_engine_t e, const char *save_dir, int rank, uint64_t *need,
                                 uint64_t *avail) {
  struct statvfs vfs;
  if (statvfs(save_dir, &vfs) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: statvfs failed: %s", save_dir, strerror(errno));
  uint64_t block = vfs.f_frsize ? vfs.f_frsize : vfs.f_bsize;
  *avail = (uint64_t)vfs.f_bavail * block;
  FSDP_TRY(checkpoint_bytes(e, block ? block : 4096, need));
  if (*avail < *need)
    return fsdp_error(FSDP_ERR_IO, "%s: not enough free space for a checkpoint: one needs %" PRIu64
                      " bytes (every rank's parameters and optimizer state, and the manifest), "
                      "%" PRIu64 " are free (seen by rank %d)", save_dir, *need, *avail, rank);
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_probe(fsdp_engine_t e, const char *save_dir, uint64_t *need_bytes,
                              uint64_t *free_bytes) {
  if (!e) return fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_probe: engine is NULL");
  int rank = ckpt_engine_rank(e);
  uint64_t need = 0, avail = 0;
  fsdp_status_t st = FSDP_SUCCESS;
  if (!save_dir || !save_dir[0])
    st = fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_probe: no save directory given");
  if (!st) st = probe_write(save_dir, rank);
  if (!st) st = probe_space(e, save_dir, rank, &need, &avail);
  FSDP_TRY(ckpt_engine_agree(e, st));
  if (need_bytes) *need_bytes = need;
  if (free_bytes) *free_bytes = avail;
  return FSDP_SUCCESS;
}

/* ---- repairing `latest` -------------------------------------------------------------- */

fsdp_status_t ckpt_step_complete(const char *step_dir, int64_t k) {
  ckpt_manifest_t m = {0};
  ckpt_files_t f = {0};
  fsdp_status_t st = ckpt_manifest_read(step_dir, &m);
  if (!st && k >= 0 && m.step != k)
    st = fsdp_error(FSDP_ERR_FORMAT, "%s: its manifest says step %" PRId64, step_dir, m.step);
  if (!st) st = ckpt_files_init(&f, &m);
  for (int r = 0; !st && r < m.world; r++) st = ckpt_check_file(&f, r, 0);
  ckpt_files_close(&f);
  ckpt_manifest_free(&m);
  return st;
}

/* k of a directory named exactly step-<k>; -1 otherwise. */
static int64_t step_of(const char *name) {
  if (strncmp(name, "step-", 5) || name[5] < '0' || name[5] > '9') return -1;
  char *end;
  long long k = strtoll(name + 5, &end, 10);
  return *end ? -1 : k;
}

static int by_step_desc(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* The k of every step-<k> directory in save_dir, newest first (*ks malloc'd). */
static fsdp_status_t list_steps(const char *save_dir, int64_t **ks, int *n) {
  DIR *d = opendir(save_dir);
  if (!d) return fsdp_error(FSDP_ERR_IO, "%s: cannot open directory: %s", save_dir, strerror(errno));
  struct dirent *ent;
  int cap = 0;
  int64_t k;
  *ks = NULL;
  *n = 0;
  fsdp_status_t st = FSDP_SUCCESS;
  while (!st && (ent = readdir(d)) != NULL) {
    if ((k = step_of(ent->d_name)) < 0) continue;
    int64_t *grown = *n < cap ? *ks : realloc(*ks, (size_t)(cap = 2 * cap + 16) * sizeof k);
    if (!grown) st = fsdp_error(FSDP_ERR_OUT_OF_MEMORY, "%s: listing steps", save_dir);
    else (*ks = grown)[(*n)++] = k;
  }
  closedir(d);
  if (*n) qsort(*ks, (size_t)*n, sizeof **ks, by_step_desc);
  return st;
}

/* The newest complete step in save_dir (-1: none); *seen: whether any step
 * directory exists; why: the newest incomplete one's problem. Checks steps
 * newest first and stops at the first complete one. */
static fsdp_status_t newest_complete(const char *save_dir, int64_t *newest, int *seen, char *why,
                                     size_t cap) {
  int64_t *ks = NULL;
  int n = 0;
  char path[CKPT_PATH_MAX];
  fsdp_status_t listed = list_steps(save_dir, &ks, &n);
  if (listed) return free(ks), listed;
  *seen = n > 0;
  *newest = -1;
  for (int i = 0; i < n && *newest < 0; i++) {
    fsdp_status_t st = ckpt_path(path, sizeof path, "%s/step-%" PRId64, save_dir, ks[i]);
    if (!st) st = ckpt_step_complete(path, ks[i]);
    if (!st) *newest = ks[i];
    else if (!why[0]) snprintf(why, cap, "%s", fsdp_last_error());
  }
  free(ks);
  return FSDP_SUCCESS;
}

/* The complete step `latest` names, or -1 with *why saying what is wrong. */
static int64_t latest_step(const char *save_dir, char *why, size_t cap) {
  char dir[CKPT_PATH_MAX];
  ckpt_manifest_t m = {0};
  if (fsdp_ckpt_resolve(save_dir, dir, sizeof dir) || ckpt_step_complete(dir, -1) ||
      ckpt_manifest_read(dir, &m))
    return snprintf(why, cap, "%s", fsdp_last_error()), -1;
  int64_t k = m.step;
  ckpt_manifest_free(&m);
  return k;
}

fsdp_status_t ckpt_repair_local(const char *save_dir, fsdp_ckpt_repair_t *out) {
  char why[1024] = "", bad[1024] = "";
  int seen = 0;
  *out = (fsdp_ckpt_repair_t){.step = -1, .was = -1};
  FSDP_TRY(newest_complete(save_dir, &out->step, &seen, bad, sizeof bad));
  out->was = latest_step(save_dir, why, sizeof why);
  if (out->step < 0 && seen)
    return fsdp_error(FSDP_ERR_FORMAT, "%s holds step directories but no complete checkpoint "
                      "(newest: %s); nothing was changed", save_dir, bad);
  if (out->step < 0 || out->was >= out->step) {
    out->step = out->was >= 0 ? out->was : out->step;
    return FSDP_SUCCESS;
  }
  if (out->was >= 0)
    snprintf(out->reason, sizeof out->reason, "`latest` named step-%" PRId64 ", older than the "
             "newest complete step-%" PRId64, out->was, out->step);
  else
    snprintf(out->reason, sizeof out->reason, "%s", why);
  FSDP_TRY(ckpt_point_latest(save_dir, out->step)); /* renames a leftover latest.tmp away */
  out->changed = 1;
  return FSDP_SUCCESS;
}

fsdp_status_t fsdp_ckpt_repair(fsdp_engine_t e, const char *save_dir, fsdp_ckpt_repair_t *out) {
  fsdp_ckpt_repair_t mine = {.step = -1, .was = -1};
  fsdp_status_t st = FSDP_SUCCESS;
  if (!save_dir || !save_dir[0] || !out)
    st = fsdp_error(FSDP_ERR_INVALID_ARGUMENT, "fsdp_ckpt_repair: needs a save directory and "
                    "an output");
  else if (ckpt_engine_rank(e) == 0)
    st = ckpt_repair_local(save_dir, &mine);
  FSDP_TRY(ckpt_engine_agree(e, st));
  double local[3] = {(double)mine.step, (double)mine.was, mine.changed}, all[3];
  if (e && ckpt_engine_rank(e) != 0) local[0] = local[1] = local[2] = -1e300;
  if (e) FSDP_TRY(fsdp_all_reduce(fsdp_engine_comm(e), local, all, 3, FSDP_F64, FSDP_MAX,
                                  FSDP_HOST_STREAM));
  else memcpy(all, local, sizeof all);
  *out = mine;
  out->step = (int64_t)all[0];
  out->was = (int64_t)all[1];
  out->changed = (int)all[2];
  return FSDP_SUCCESS;
}
