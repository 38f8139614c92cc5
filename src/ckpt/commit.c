/* src/ckpt/commit.c — the commit protocol shared by save, reshard and import:
 * a temporary step directory (guarded while its save lives), then manifest,
 * rename, and `latest`, each made durable before the next, so a crash leaves
 * the previous checkpoint current; and the sweep of dead saves' leftovers. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_internal.h"

/* The id of a step-<k>.tmp-<id> name; 0 when the name is not one of ours. */
static uint64_t tmp_id(const char *name) {
  const char *at = strncmp(name, "step-", 5) ? NULL : strstr(name, ".tmp-");
  char *end;
  if (!at || strlen(at + 5) != 16) return 0;
  unsigned long long id = strtoull(at + 5, &end, 16);
  return *end ? 0 : (uint64_t)id;
}

/* A crashed save leaves step-<k>.tmp-<id>. A live save holds its guard (a
 * lock the kernel drops when its process dies), so a directory whose guard
 * can be taken is a dead save's: remove it, guarded, so no two sweeps race. */
static fsdp_status_t sweep_one(const char *save_dir, const char *name, uint64_t id) {
  char path[CKPT_PATH_MAX];
  struct stat sb;
  int guard = -1;
  FSDP_TRY(ckpt_path(path, sizeof path, "%s/%s", save_dir, name));
  fsdp_status_t st = ckpt_guard_take(save_dir, id, &guard);
  if (st == FSDP_ERR_INVALID_USAGE) {
    fsdp_log(FSDP_LOG_INFO, "kept %s: a live save owns it", path);
    return FSDP_SUCCESS;
  }
  if (!st && lstat(path, &sb) == 0) { /* gone when its save just committed */
    st = ckpt_remove_dir(path);
    if (!st) fsdp_log(FSDP_LOG_INFO, "removed %s, left by an interrupted save", path);
  }
  ckpt_guard_release(guard);
  return st;
}

static fsdp_status_t remove_stale(const char *save_dir) {
  DIR *d = opendir(save_dir);
  if (!d)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot open directory: %s", save_dir, strerror(errno));
  struct dirent *ent;
  fsdp_status_t st = FSDP_SUCCESS;
  uint64_t id;
  while (!st && (ent = readdir(d)) != NULL)
    if ((id = tmp_id(ent->d_name)) != 0) st = sweep_one(save_dir, ent->d_name, id);
  closedir(d);
  return st;
}

fsdp_status_t ckpt_prepare(const char *save_dir, int64_t step, uint64_t id, int overwrite,
                           char *tmp_out, size_t cap, int *guard) {
  char final[CKPT_PATH_MAX];
  struct stat sb;
  *guard = -1;
  FSDP_TRY(ckpt_make_dirs(save_dir));
  FSDP_TRY(ckpt_path(final, sizeof final, "%s/step-%" PRId64, save_dir, step));
  if (!overwrite && stat(final, &sb) == 0)
    return fsdp_error(FSDP_ERR_INVALID_USAGE, "%s already exists: refusing to overwrite a "
                      "committed checkpoint (ask for overwrite, e.g. fsdp-train --save-overwrite, "
                      "or save elsewhere)", final);
  FSDP_TRY(remove_stale(save_dir));
  FSDP_TRY(ckpt_path(tmp_out, cap, "%s/step-%" PRId64 ".tmp-%016" PRIx64, save_dir, step, id));
  FSDP_TRY(ckpt_guard_take(save_dir, id, guard)); /* before the directory exists */
  if (mkdir(tmp_out, 0755) == 0) return FSDP_SUCCESS;
  fsdp_status_t st = fsdp_error(FSDP_ERR_IO, "%s: cannot create directory: %s", tmp_out,
                                strerror(errno));
  ckpt_guard_release(*guard);
  *guard = -1;
  return st;
}

static fsdp_status_t write_small(const char *path, const char *text, size_t n, int64_t *fault,
                                 int fail_errno) {
  ckpt_writer_t w;
  FSDP_TRY(ckpt_writer_open(&w, path, fault));
  w.fail_errno = fail_errno;
  fsdp_status_t st = ckpt_write(&w, text, n);
  if (st) return ckpt_writer_abort(&w), st;
  return ckpt_writer_close(&w);
}

/* Renames tmp onto final; an existing final (overwrite) is swapped out
 * atomically and then removed, so final never goes missing. */
static fsdp_status_t publish(const char *tmp, const char *final) {
  struct stat sb;
  if (stat(final, &sb) != 0) {
    if (rename(tmp, final) != 0)
      return fsdp_error(FSDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    return FSDP_SUCCESS;
  }
  if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot replace %s: %s", tmp, final, strerror(errno));
  return ckpt_remove_dir(tmp);
}

static fsdp_status_t point_latest(const char *save_dir, int64_t step, int fail_errno) {
  char tmp[CKPT_PATH_MAX], latest[CKPT_PATH_MAX], text[64];
  FSDP_TRY(ckpt_path(tmp, sizeof tmp, "%s/latest.tmp", save_dir));
  FSDP_TRY(ckpt_path(latest, sizeof latest, "%s/latest", save_dir));
  int n = snprintf(text, sizeof text, "step-%" PRId64 "\n", step);
  FSDP_TRY(write_small(tmp, text, (size_t)n, NULL, fail_errno));
  if (rename(tmp, latest) != 0)
    return fsdp_error(FSDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, latest, strerror(errno));
  return ckpt_fsync_dir(save_dir);
}

fsdp_status_t ckpt_point_latest(const char *save_dir, int64_t step) {
  return point_latest(save_dir, step, 0);
}

fsdp_status_t ckpt_commit(const ckpt_manifest_t *m, const char *save_dir, const char *tmp,
                          int64_t *fault_budget, char *path_out, size_t cap) {
  char path[CKPT_PATH_MAX], final[CKPT_PATH_MAX];
  sbuf_t sb = {0};
  fsdp_status_t st = ckpt_manifest_write(m, &sb);
  if (!st) st = ckpt_path(path, sizeof path, "%s/" CKPT_MANIFEST, tmp);
  if (!st) st = write_small(path, sb.buf, sb.len, fault_budget, 0);
  sb_free(&sb);
  FSDP_TRY(st);
  FSDP_TRY(ckpt_fsync_dir(tmp));
  FSDP_TRY(ckpt_path(final, sizeof final, "%s/step-%" PRId64, save_dir, m->step));
  FSDP_TRY(publish(tmp, final));
  FSDP_TRY(ckpt_fsync_dir(save_dir));
  FSDP_TRY(point_latest(save_dir, m->step, ckpt_fault_enospc("latest", m->step) ? ENOSPC : 0));
  if (path_out && cap) snprintf(path_out, cap, "%s", final);
  return FSDP_SUCCESS;
}
